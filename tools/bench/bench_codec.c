/* bench_codec.c: `starling-bench codec`, the cost of the codecs for
 * compressed deltas (optimizer/codec.c) next to the cost of encrypting the
 * same floats, measured in the same run: a codec is worth its time when
 * encoding and decoding take well under what sealing and opening the
 * float32 bytes take (docs/benchmarks.md).
 *
 * For each codec: encode, decode, and encode with error feedback (the
 * residual added and kept) of --floats normal random floats, one core,
 * the median of --rounds runs each; the encoded size and its ratio to
 * float32; and the stream cipher's seal and open time for the float32
 * bytes (1 MiB frames, crypto/stream.c, as bench_common.c measures them).
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "crypto/crypto.h"
#include "optimizer/optimizer.h"
#include "tools/bench/bench.h"
#include "tools/cli/cli.h"

#define CMD "starling-bench codec"
#define MAX_ROUNDS 99

static const char* const codecs[] = {"none", "bf16", "int8", "topk:0.1",
                                     "topk:0.01"};
#define N_CODECS (sizeof(codecs) / sizeof(codecs[0]))

typedef struct {
  const char* name;
  size_t bytes;
  double enc_s, dec_s, ef_s; /* medians, seconds */
} row_t;

static int cmp_double(const void* x, const void* y) {
  double a = *(const double*) x, b = *(const double*) y;
  return (a > b) - (a < b);
}

static double median(double* v, int n) {
  qsort(v, (size_t) n, sizeof(double), cmp_double);
  return v[n / 2];
}

/* Times encode, decode and error-feedback encode of x for one codec. */
static int bench_one(const char* text, const float* x, size_t n, int rounds,
                     row_t* row) {
  st_codec_spec_t s;
  char err[256];
  if (st_codec_parse(text, &s, err, sizeof(err)) != 0)
    return -EINVAL;
  size_t cap = st_codec_encoded_bytes(&s, n), len = 0;
  uint8_t* buf = malloc(cap);
  float* out = malloc(n * sizeof(float));
  st_codec_ef_t ef;
  int rc = buf != NULL && out != NULL ? st_codec_ef_init(&ef, &s, n) : -ENOMEM;
  double enc[MAX_ROUNDS], dec[MAX_ROUNDS], efs[MAX_ROUNDS];
  for (int r = 0; r < rounds && rc == 0; r++) {
    double t0 = st_now_s();
    rc = st_codec_encode(&s, x, n, buf, cap, &len);
    double t1 = st_now_s();
    if (rc == 0)
      rc = st_codec_decode(&s, buf, len, out, n, NULL);
    double t2 = st_now_s();
    if (rc == 0)
      rc = st_codec_ef_encode(&ef, x, buf, cap, &len);
    double t3 = st_now_s();
    enc[r] = t1 - t0, dec[r] = t2 - t1, efs[r] = t3 - t2;
  }
  if (rc == 0) {
    row->name = text;
    row->bytes = len;
    row->enc_s = median(enc, rounds);
    row->dec_s = median(dec, rounds);
    row->ef_s = median(efs, rounds);
    st_codec_ef_close(&ef);
  }
  free(buf);
  free(out);
  return rc;
}

static void print_rows(const row_t* rows, size_t n, double seal_bps,
                       double open_bps, int json) {
  double fbytes = 4.0 * (double) n;
  if (json) {
    printf("{\"floats\":%zu,\"seal_ms\":%.4f,\"open_ms\":%.4f,\"codecs\":[", n,
           fbytes / seal_bps * 1e3, fbytes / open_bps * 1e3);
    for (size_t i = 0; i < N_CODECS; i++)
      printf(
          "%s{\"codec\":\"%s\",\"bytes\":%zu,\"encode_ms\":%.4f,"
          "\"decode_ms\":%.4f,\"ef_encode_ms\":%.4f}",
          i ? "," : "", rows[i].name, rows[i].bytes, rows[i].enc_s * 1e3,
          rows[i].dec_s * 1e3, rows[i].ef_s * 1e3);
    printf("]}\n");
    return;
  }
  printf("%zu floats (%.1f MB of float32); one core\n", n, fbytes / 1e6);
  printf(
      "seal %.1f ms (%.2f GB/s), open %.1f ms (%.2f GB/s): XChaCha20-"
      "Poly1305 stream, 1 MiB frames\n\n",
      fbytes / seal_bps * 1e3, seal_bps / 1e9, fbytes / open_bps * 1e3,
      open_bps / 1e9);
  printf("%-10s %12s %7s %10s %10s %10s %10s %10s\n", "codec", "bytes", "ratio",
         "encode ms", "GB/s", "decode ms", "GB/s", "ef enc ms");
  for (size_t i = 0; i < N_CODECS; i++)
    printf("%-10s %12zu %6.1fx %10.2f %10.2f %10.2f %10.2f %10.2f\n",
           rows[i].name, rows[i].bytes, fbytes / (double) rows[i].bytes,
           rows[i].enc_s * 1e3, fbytes / rows[i].enc_s / 1e9,
           rows[i].dec_s * 1e3, fbytes / rows[i].dec_s / 1e9,
           rows[i].ef_s * 1e3);
  printf("\nGB/s: float32 bytes in (encode) or out (decode) per second.\n");
}

static int parse_args(int argc, char** argv, uint64_t* floats, uint64_t* rounds,
                      int* json) {
  static const struct option opts[] = {
      {"floats", required_argument, NULL, 'f'},
      {"rounds", required_argument, NULL, 'r'},
      {"json", no_argument, NULL, 'j'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  int c;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (c) {
      case 'f':
        if (st__parse_u64(CMD, "--floats", optarg, 1, 1u << 30, floats) != 0)
          return 2;
        break;
      case 'r':
        if (st__parse_u64(CMD, "--rounds", optarg, 1, MAX_ROUNDS, rounds) != 0)
          return 2;
        break;
      case 'j':
        *json = 1;
        break;
      case 'h':
        printf(
            "usage: starling-bench codec [--floats N] [--rounds R] [--json]\n"
            "\n"
            "Encodes, decodes and encodes with error feedback N normal\n"
            "random floats (default 10000000) with each codec (none, bf16,\n"
            "int8, topk:0.1, topk:0.01) on one core, and prints the median\n"
            "of R runs (default 5) of each, the encoded bytes, and the time\n"
            "to seal and open the same float32 bytes with the stream cipher\n"
            "the nodes use.\n");
        return 1;
      default:
        fprintf(stderr, CMD ": bad option '%s'; see --help\n",
                argv[optind - 1]);
        return 2;
    }
  }
  return 0;
}

int st__bench_codec(int argc, char** argv) {
  uint64_t floats = 10000000, rounds = 5;
  int json = 0;
  int rc = parse_args(argc, argv, &floats, &rounds, &json);
  if (rc != 0)
    return rc == 1 ? 0 : rc;
  if (st_crypto_init() != 0)
    return 1;
  size_t n = (size_t) floats;
  float* x = malloc(n * sizeof(float));
  if (x == NULL) {
    fprintf(stderr, CMD ": no memory for %zu floats\n", n);
    return 1;
  }
  st_rng_t rng;
  st_rng_seed(&rng, 1);
  for (size_t i = 0; i < n; i++)
    x[i] = (float) (st_rng_normal(&rng) * 1e-3);
  row_t rows[N_CODECS];
  for (size_t i = 0; i < N_CODECS && rc == 0; i++)
    rc = bench_one(codecs[i], x, n, (int) rounds, &rows[i]);
  double seal = 0, open = 0;
  if (rc == 0)
    st__bench_aead_rates(&seal, &open);
  free(x);
  if (rc != 0 || seal <= 0 || open <= 0) {
    fprintf(stderr, CMD ": a measurement failed (%d)\n", rc);
    return 1;
  }
  print_rows(rows, n, seal, open, json);
  return 0;
}
