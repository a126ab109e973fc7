/* bench_crypto.c: `starling-bench crypto`, the cost of starling's
 * encryption: sealing and opening 1400-byte UDP packets (st_packet_*) and
 * 1 MiB stream frames (st_stream_*), and full handshakes per second, each
 * next to libsodium's raw XChaCha20-Poly1305 on the same sizes in the same
 * run, so that the framing overhead reads as a ratio.
 *
 * This file is the one place outside crypto/ that includes <sodium.h>
 * (STYLE.md rule 6): the baseline is libsodium itself, measured directly.
 * Packets are opened in the order they were sealed, so the replay window
 * accepts each once, as on a real link.
 */
#include <errno.h>
#include <getopt.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crypto/crypto.h"
#include "node/train/train.h"
#include "tools/bench/bench.h"
#include "tools/cli/cli.h"

#define CMD "starling-bench crypto"
#define PACKET_PLAINTEXT ST_PACKET_MAX_PLAINTEXT /* 1229: a full packet */
#define CHUNK_BYTES (1024u * 1024u)

#define MAX_ROUNDS 99

typedef struct {
  double seconds; /* minimum time per run, per measurement */
  int rounds;     /* interleaved rounds; medians reported */
  int json;
} crypto_args_t;

typedef struct {
  const char* name;
  size_t bytes; /* payload per operation */
  double ops_per_sec;
} result_t;

static void usage(FILE* f) {
  fprintf(f,
          "usage: starling-bench crypto [--seconds S] [--rounds R] [--json]\n"
          "\n"
          "Measures on one core: raw XChaCha20-Poly1305 (libsodium) against\n"
          "starling's sealed, signed packets (1229-byte payload, 1400 on\n"
          "the wire) and stream frames (1 MiB), seal and open, and full\n"
          "three-message handshakes (both sides, one process); and\n"
          "libsodium's "
          "AES-256-GCM on 1 MiB where the CPU has AES-NI (not used by\n"
          "starling: the measurement behind that choice).\n"
          "\n"
          "  --seconds S   time per measurement (default 0.5)\n"
          "  --rounds R    interleaved rounds of every measurement; medians\n"
          "                are reported (default 5)\n"
          "  --json        one JSON object on stdout\n"
          "  -h, --help    this help\n");
}

static int cmp_double(const void* x, const void* y) {
  double a = *(const double*) x, b = *(const double*) y;
  return (a > b) - (a < b);
}

/* The median of n values (a failed measurement, < 0, sorts first and
 * poisons the median only when it is most of them). */
static double median(double* v, int n) {
  double tmp[MAX_ROUNDS];
  memcpy(tmp, v, (size_t) n * sizeof(double));
  qsort(tmp, (size_t) n, sizeof(double), cmp_double);
  for (int i = 0; i < n; i++)
    if (tmp[i] < 0)
      return -1; /* any failure is a failure */
  return tmp[n / 2];
}

/* Runs op until at least `seconds` have passed; returns operations/s. */
typedef int (*op_fn)(void* ctx, size_t i);
static double measure(op_fn op, void* ctx, double seconds, size_t max_ops) {
  size_t done = 0;
  double t0 = st_now_s(), t = t0;
  while ((t - t0 < seconds) && done < max_ops) {
    for (int k = 0; k < 16 && done < max_ops; k++)
      if (op(ctx, done++) != 0)
        return -1;
    t = st_now_s();
  }
  return (double) done / (t - t0);
}

/* ---- Raw AEAD baseline -----------------------------------------------------
 */

/* The baseline touches memory as the framed versions do: it seals into
 * and opens from a ring of n ciphertext slots (n packets, or n 1 MiB
 * frames), so that both sides pay the same cache misses. */
typedef struct {
  uint8_t key[32];
  uint8_t nonce[24];
  uint8_t* in;    /* plaintext, len bytes */
  uint8_t* slots; /* n slots of slot_cap bytes */
  size_t slot_cap;
  size_t n;
  size_t len;
} raw_ctx_t;

static int raw_seal(void* p, size_t i) {
  raw_ctx_t* c = p;
  unsigned long long n;
  return crypto_aead_xchacha20poly1305_ietf_encrypt(
      c->slots + (i % c->n) * c->slot_cap, &n, c->in, c->len, NULL, 0, NULL,
      c->nonce, c->key);
}

static int raw_open(void* p, size_t i) {
  raw_ctx_t* c = p;
  unsigned long long n;
  return crypto_aead_xchacha20poly1305_ietf_decrypt(
      c->in, &n, NULL, c->slots + (i % c->n) * c->slot_cap, c->len + 16, NULL,
      0, c->nonce, c->key);
}

/* libsodium's AES-256-GCM (on CPUs with AES-NI and CLMUL), the same sizes
 * and slots: the one other AEAD it offers, measured so that the choice of
 * XChaCha20-Poly1305 for the streams rests on a figure (docs/benchmarks.md).
 * The nonce is 12 bytes, the tag 16, as XChaCha20-Poly1305's. */
static int aes_seal(void* p, size_t i) {
  raw_ctx_t* c = p;
  unsigned long long n;
  return crypto_aead_aes256gcm_encrypt(c->slots + (i % c->n) * c->slot_cap, &n,
                                       c->in, c->len, NULL, 0, NULL, c->nonce,
                                       c->key);
}

static int aes_open(void* p, size_t i) {
  raw_ctx_t* c = p;
  unsigned long long n;
  return crypto_aead_aes256gcm_decrypt(c->in, &n, NULL,
                                       c->slots + (i % c->n) * c->slot_cap,
                                       c->len + 16, NULL, 0, c->nonce, c->key);
}

/* Measures seal then open of one AEAD over c's slots: every slot is sealed
 * between the two, so that open has a ciphertext in each. Writes the two
 * rates (operations/s); -1 when a seal failed. */
static int measure_aead(op_fn seal, op_fn open, raw_ctx_t* c, double seconds,
                        double* seal_rate, double* open_rate) {
  *seal_rate = measure(seal, c, seconds, SIZE_MAX);
  for (size_t i = 0; i < c->n; i++)
    if (seal(c, i) != 0)
      return -1;
  *open_rate = measure(open, c, seconds, SIZE_MAX);
  return 0;
}

/* ---- Packets
 * ------------------------------------------------------------------ */

typedef struct {
  st_keyring_t ring;
  st_packet_sealer_t sealer;
  st_node_id_t to; /* the receiver the packets are sealed for */
  st_replay_table_t* replay;
  uint8_t* plain;
  uint8_t* packets; /* n sealed packets, ST_PACKET_MAX_BYTES apart */
  size_t* lens;
  size_t n;
} packet_ctx_t;

static int packet_seal(void* p, size_t i) {
  packet_ctx_t* c = p;
  size_t slot = i % c->n;
  return st_packet_seal(&c->sealer, &c->to, c->plain, PACKET_PLAINTEXT,
                        c->packets + slot * ST_PACKET_MAX_BYTES,
                        ST_PACKET_MAX_BYTES, &c->lens[slot]);
}

static int packet_open(void* p, size_t i) {
  packet_ctx_t* c = p;
  uint8_t out[ST_PACKET_MAX_BYTES];
  size_t out_len;
  st_packet_header_t hdr;
  return st_packet_open(&c->ring, &c->to, NULL, c->replay, NULL,
                        c->packets + i * ST_PACKET_MAX_BYTES, c->lens[i], out,
                        sizeof(out), &out_len, &hdr);
}

/* ---- Streams
 * ------------------------------------------------------------------- */

typedef struct {
  st_stream_t tx, rx;
  uint8_t* msg;
  uint8_t* frames; /* n sealed frames */
  size_t frame_cap;
  size_t* lens;
  size_t n;
  uint8_t* out;
} stream_ctx_t;

static int stream_seal(void* p, size_t i) {
  stream_ctx_t* c = p;
  size_t slot = i % c->n;
  return st_stream_seal_frame(&c->tx, c->msg, CHUNK_BYTES, false,
                              c->frames + slot * c->frame_cap, c->frame_cap,
                              &c->lens[slot]);
}

static int stream_open(void* p, size_t i) {
  stream_ctx_t* c = p;
  size_t ct_len, msg_len;
  bool final;
  const uint8_t* f = c->frames + i * c->frame_cap;
  int rc = st_frame_length(f, ST_FRAME_MAX_DEFAULT, NULL, &ct_len);
  if (rc == 0)
    rc = st_stream_open_frame(&c->rx, NULL, f + ST_FRAME_LENGTH_BYTES, ct_len,
                              c->out, CHUNK_BYTES, &msg_len, &final);
  return rc;
}

/* ---- Handshakes
 * ------------------------------------------------------------------ */

typedef struct {
  st_identity_t a, b;
  st_keyring_t ring;
} hs_ctx_t;

static int handshake(void* p, size_t i) {
  hs_ctx_t* c = p;
  st_handshake_t hi, hr;
  st_hs_msg1_t m1;
  st_hs_msg2_t m2;
  st_hs_msg3_t m3;
  st_session_t si, sr;
  int rc = st_handshake_init(&hi, ST_HS_INITIATOR, &c->a, &c->ring, NULL, NULL);
  if (rc == 0)
    rc = st_handshake_init(&hr, ST_HS_RESPONDER, &c->b, &c->ring, NULL, NULL);
  if (rc == 0)
    rc = st_handshake_write_msg1(&hi, &m1);
  if (rc == 0)
    rc = st_handshake_read_msg1(&hr, &m1);
  if (rc == 0)
    rc = st_handshake_write_msg2(&hr, &m2);
  if (rc == 0)
    rc = st_handshake_read_msg2(&hi, &m2);
  if (rc == 0)
    rc = st_handshake_write_msg3(&hi, &m3);
  if (rc == 0)
    rc = st_handshake_read_msg3(&hr, &m3);
  if (rc == 0)
    rc = st_handshake_finish(&hi, &si);
  if (rc == 0)
    rc = st_handshake_finish(&hr, &sr);
  st_session_wipe(&si);
  st_session_wipe(&sr);
  return rc;
}

/* ---- Main
 * ------------------------------------------------------------------------- */

static int parse(int argc, char** argv, crypto_args_t* a) {
  static const struct option opts[] = {
      {"seconds", required_argument, NULL, 's'},
      {"rounds", required_argument, NULL, 'r'},
      {"json", no_argument, NULL, 'j'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  a->seconds = 0.5;
  a->rounds = 5;
  uint64_t u;
  a->json = 0;
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (c) {
      case 's':
        if (st__parse_double(CMD, "--seconds", optarg, 0.01, 600, &a->seconds))
          return 2;
        break;
      case 'r':
        if (st__parse_u64(CMD, "--rounds", optarg, 1, MAX_ROUNDS, &u))
          return 2;
        a->rounds = (int) u;
        break;
      case 'j':
        a->json = 1;
        break;
      case 'h':
        usage(stdout);
        return -1;
      case ':':
        fprintf(stderr, "starling-bench crypto: %s needs a value\n",
                argv[optind - 1]);
        return 2;
      default:
        fprintf(stderr,
                "starling-bench crypto: unknown option '%s'; see "
                "'starling-bench crypto --help'\n",
                argv[optind - 1]);
        return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "starling-bench crypto: unexpected argument '%s'\n",
            argv[optind]);
    return 2;
  }
  return 0;
}

/* Round r of every measurement, into vals[k][r]: raw AEAD and packets at
 * packet size, raw AEAD and stream frames at chunk size, the handshake,
 * and AES-256-GCM when the CPU has it. 0, or -1 when an operation failed. */
static int measure_round(raw_ctx_t* raw, packet_ctx_t* pk, stream_ctx_t* st,
                         hs_ctx_t* hs, const uint8_t* key, uint8_t* header,
                         double seconds, bool aes, int r,
                         double vals[][MAX_ROUNDS]) {
  int k = 0;
  /* Raw AEAD, packet-sized, over the packets' slots. */
  raw->len = PACKET_PLAINTEXT;
  raw->slots = pk->packets;
  raw->slot_cap = ST_PACKET_MAX_BYTES;
  raw->n = pk->n;
  if (measure_aead(raw_seal, raw_open, raw, seconds, &vals[k][r],
                   &vals[k + 1][r]) != 0)
    return -1;
  k += 2;
  /* Packets: seal n (the measured loop overwrites them), then open
   * exactly the n sealed last, in order. */
  vals[k++][r] = measure(packet_seal, pk, seconds, SIZE_MAX);
  for (size_t i = 0; i < pk->n; i++)
    if (packet_seal(pk, i) != 0)
      return -1;
  vals[k++][r] = measure(packet_open, pk, seconds, pk->n);
  /* Raw AEAD, chunk-sized, over the frames' slots. */
  raw->len = CHUNK_BYTES;
  raw->slots = st->frames;
  raw->slot_cap = st->frame_cap;
  raw->n = st->n;
  if (measure_aead(raw_seal, raw_open, raw, seconds, &vals[k][r],
                   &vals[k + 1][r]) != 0)
    return -1;
  k += 2;
  /* Stream frames: a fresh pair for the open measurement, so that the
   * receiver sees frames 0..n-1 of its stream in order. */
  if (st_stream_tx_init(&st->tx, key, header) != 0)
    return -1;
  vals[k++][r] = measure(stream_seal, st, seconds, SIZE_MAX);
  if (st_stream_tx_init(&st->tx, key, header) != 0 ||
      st_stream_rx_init(&st->rx, key, header) != 0)
    return -1;
  for (size_t i = 0; i < st->n; i++)
    if (stream_seal(st, i) != 0)
      return -1;
  vals[k++][r] = measure(stream_open, st, seconds, st->n);
  vals[k++][r] = measure(handshake, hs, seconds, SIZE_MAX);
  /* AES-256-GCM, chunk-sized, over the frames' slots again (raw is
   * still set up for them). */
  if (aes && measure_aead(aes_seal, aes_open, raw, seconds, &vals[k][r],
                          &vals[k + 1][r]) != 0)
    return -1;
  return 0;
}

/* Prints the results, as a table or as --json's document. ratio: packet
 * seal and open, stream seal and open, against raw AEAD of their size;
 * hps: handshakes a second. */
static void print_results(bool json, const result_t* res, int nres,
                          const double ratio[4], double hps) {
  if (json) {
    printf("{\"benchmark\": \"crypto\", \"results\": [");
    for (int i = 0; i < nres; i++)
      printf(
          "%s{\"op\": \"%s\", \"bytes\": %zu, \"ops_per_sec\": %.1f, "
          "\"mb_per_sec\": %.1f}",
          i ? ", " : "", res[i].name, res[i].bytes, res[i].ops_per_sec,
          res[i].ops_per_sec * (double) res[i].bytes / 1e6);
    printf(
        "], \"packet_seal_vs_raw\": %.3f, \"packet_open_vs_raw\": %.3f, "
        "\"stream_seal_vs_raw\": %.3f, \"stream_open_vs_raw\": %.3f, "
        "\"handshakes_per_sec\": %.1f}\n",
        ratio[0], ratio[1], ratio[2], ratio[3], hps);
  } else {
    printf("%-16s %9s %14s %10s  %s\n", "operation", "bytes", "ops/s", "MB/s",
           "vs raw AEAD");
    for (int i = 0; i < nres; i++) {
      printf("%-16s %9zu %14.0f %10.1f", res[i].name, res[i].bytes,
             res[i].ops_per_sec,
             res[i].ops_per_sec * (double) res[i].bytes / 1e6);
      int r = i == 2 ? 0 : i == 3 ? 1 : i == 6 ? 2 : i == 7 ? 3 : -1;
      if (r >= 0)
        printf("  %.3f", ratio[r]);
      printf("\n");
    }
    printf("%-16s %9s %14.0f  (both sides, one core)\n", "handshake", "-", hps);
  }
}

/* Allocates the buffers of the measurements: n_packets packet slots,
 * n_frames frame slots and the plaintexts. The caller frees them, whatever
 * the outcome. 0, or -1 with the reason printed. */
static int alloc_buffers(raw_ctx_t* raw, packet_ctx_t* pk, stream_ctx_t* st,
                         size_t n_packets, size_t n_frames) {
  raw->in = calloc(1, CHUNK_BYTES + 64);
  pk->plain = calloc(1, PACKET_PLAINTEXT);
  pk->packets = malloc(n_packets * ST_PACKET_MAX_BYTES);
  pk->lens = calloc(n_packets, sizeof(size_t));
  st->frame_cap = CHUNK_BYTES + ST_STREAM_ABYTES + ST_FRAME_LENGTH_BYTES;
  st->msg = calloc(1, CHUNK_BYTES);
  st->out = malloc(CHUNK_BYTES);
  st->frames = malloc(n_frames * st->frame_cap);
  st->lens = calloc(n_frames, sizeof(size_t));
  st->n = n_frames;
  if (!raw->in || !pk->plain || !pk->packets || !pk->lens || !st->msg ||
      !st->out || !st->frames || !st->lens) {
    fprintf(stderr, "starling-bench crypto: out of memory\n");
    return -1;
  }
  return 0;
}

/* The median of each measurement over the rounds, into res (returns how
 * many) and *hps (handshakes a second). */
static int collect_results(double vals[][MAX_ROUNDS], int rounds, bool aes,
                           result_t* res, double* hps) {
  int n = 0;
  static const char* const names[8] = {
      "raw aead seal", "raw aead open", "packet seal", "packet open",
      "raw aead seal", "raw aead open", "stream seal", "stream open"};
  for (int k = 0; k < 8; k++)
    res[n++] = (result_t){names[k], k < 4 ? PACKET_PLAINTEXT : CHUNK_BYTES,
                          median(vals[k], rounds)};
  *hps = median(vals[8], rounds);
  if (aes) {
    res[n++] =
        (result_t){"aes256gcm seal", CHUNK_BYTES, median(vals[9], rounds)};
    res[n++] =
        (result_t){"aes256gcm open", CHUNK_BYTES, median(vals[10], rounds)};
  }
  return n;
}

/* Wipes the keys and identities and frees the buffers of a run. */
static void wipe_and_free(raw_ctx_t* raw, packet_ctx_t* pk, stream_ctx_t* st,
                          hs_ctx_t* hs, st_identity_t* self,
                          st_identity_t* peer, st_cluster_key_t* ck) {
  st_identity_wipe(self);
  st_identity_wipe(peer);
  st_identity_wipe(&hs->a);
  st_identity_wipe(&hs->b);
  st_keyring_wipe(&hs->ring);
  st_keyring_wipe(&pk->ring);
  st_cluster_key_wipe(ck);
  free(raw->in);
  free(pk->plain);
  free(pk->packets);
  free(pk->lens);
  st_replay_table_free(pk->replay);
  free(st->msg);
  free(st->out);
  free(st->frames);
  free(st->lens);
}

int st__bench_crypto(int argc, char** argv) {
  crypto_args_t a;
  int rc = parse(argc, argv, &a);
  if (rc != 0)
    return rc < 0 ? 0 : rc;
  if (st_crypto_init() != 0) {
    fprintf(stderr, "starling-bench crypto: libsodium failed to start\n");
    return 1;
  }
  result_t res[10];
  int nres = 0, status = 1;
  const size_t n_packets = 1u << 16, n_frames = 64;

  raw_ctx_t raw = {0};
  packet_ctx_t pk = {0};
  stream_ctx_t st = {0};
  hs_ctx_t hs;
  st_identity_t self, peer; /* the packets' sender and receiver */
  st_cluster_key_t ck;
  memset(&hs, 0, sizeof(hs));
  memset(&self, 0, sizeof(self));
  memset(&peer, 0, sizeof(peer));
  st_cluster_key_generate(&ck);
  randombytes_buf(raw.key, sizeof(raw.key));
  if (alloc_buffers(&raw, &pk, &st, n_packets, n_frames) != 0)
    goto done;

  st_keyring_init(&pk.ring, &ck, NULL, NULL, 0);
  st_identity_generate(&self);
  pk.sealer = (st_packet_sealer_t){&pk.ring, &self, 1, 0};
  st_identity_generate(&peer);
  pk.to = peer.id;
  pk.n = n_packets;
  if (st_replay_table_new(16, &pk.replay) != 0)
    goto done;
  st_identity_generate(&hs.a);
  st_identity_generate(&hs.b);
  st_keyring_init(&hs.ring, &ck, NULL, NULL, 0);
  uint8_t key[ST_KEY_BYTES], header[ST_STREAM_HEADER_BYTES];
  randombytes_buf(key, sizeof(key));

  /* R rounds of every measurement, interleaved, so that a burst of other
   * load on the machine hits raw and framed alike; medians reported. */
  double vals[11][MAX_ROUNDS];
  const bool aes = crypto_aead_aes256gcm_is_available() != 0;
  for (int r = 0; r < a.rounds; r++) {
    if (measure_round(&raw, &pk, &st, &hs, key, header, a.seconds, aes, r,
                      vals) != 0)
      goto done;
  }
  double hps = 0;
  nres = collect_results(vals, a.rounds, aes, res, &hps);
  for (int i = 0; i < nres; i++)
    if (res[i].ops_per_sec < 0) {
      fprintf(stderr, "starling-bench crypto: %s failed\n", res[i].name);
      goto done;
    }
  if (hps < 0) {
    fprintf(stderr, "starling-bench crypto: handshake failed\n");
    goto done;
  }

  /* Ratios: each starling operation against the raw AEAD of its size. */
  double ratio[4] = {res[2].ops_per_sec / res[0].ops_per_sec,
                     res[3].ops_per_sec / res[1].ops_per_sec,
                     res[6].ops_per_sec / res[4].ops_per_sec,
                     res[7].ops_per_sec / res[5].ops_per_sec};
  print_results(a.json, res, nres, ratio, hps);
  status = 0;
done:
  wipe_and_free(&raw, &pk, &st, &hs, &self, &peer, &ck);
  return status;
}
