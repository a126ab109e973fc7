/* fuzz_codec.c: the libFuzzer target of the codecs for compressed deltas
 * (optimizer/codec.c; optimizer.h, "Codecs"). The input's first bytes
 * pick the codec (none, bf16, int8, or top-k keeping 1%, 10%, 25% or all)
 * and n (0 to 1023 floats), then either
 *
 * - raw: the rest is a message, decoded as a node decodes a delta; or
 * - mutated: the rest is up to 8 edits (offset, xor byte) and a length
 *   change, then n floats (NaN and Inf made 0); the harness encodes them,
 *   checks the round trip against the codec's bound, runs two messages of
 *   error feedback, then applies the edits and decodes the result, so that
 *   the fuzzer starts from valid messages without having to find them.
 *
 * Every decode must either succeed with n finite values (bf16 and none:
 * the message re-encodes to the same bytes; int8: every |value| <= 127 x
 * its chunk's scale, rounded to float32; top-k: at most k non-zero values) or
 * fail with -EBADMSG or -EPROTO, a named reason and the output untouched. The
 * output is exactly n floats on the heap, so ASan sees any write past it. Never
 * a crash, a leak or an overread.
 *
 *   CC=clang cmake -S . -B build-fuzz -DSTARLING_FUZZ=ON -DSTARLING_CUDA=OFF
 *   cmake --build build-fuzz --target fuzz_codec
 *   ./build-fuzz/fuzz_codec -max_total_time=60 /tmp/cc
 * tests/fuzz/corpus/fuzz_codec
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "optimizer/optimizer.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#define MAX_FLOATS 1024
#define MAX_EDITS 8
#define CANARY 12345.0f

static const uint32_t topk_ppm[4] = {10000, 100000, 250000, 1000000};

static st_codec_spec_t pick_spec(uint8_t b) {
  st_codec_spec_t s = {(st_codec_kind_t) (b & 3), 0};
  if (s.kind == ST_CODEC_TOPK)
    s.topk_ppm = topk_ppm[(b >> 3) & 3];
  return s;
}

/* Checks what a successful decode of msg produced. */
static void check_accepted(const st_codec_spec_t* s, const uint8_t* msg,
                           size_t len, const float* out, size_t n) {
  for (size_t i = 0; i < n; i++)
    CHECK(isfinite(out[i]));
  if (s->kind == ST_CODEC_NONE || s->kind == ST_CODEC_BF16) {
    /* Every finite float32 and bfloat16 value encodes back exactly. */
    uint8_t* again = malloc(len);
    size_t len2 = 0;
    CHECK(again != NULL && st_codec_encode(s, out, n, again, len, &len2) == 0);
    CHECK(len2 == len && memcmp(again, msg, len) == 0);
    free(again);
  } else if (s->kind == ST_CODEC_INT8) {
    uint32_t chunk;
    memcpy(&chunk, msg + 4, 4);
    for (size_t i = 0; i < n; i++) {
      float sc;
      memcpy(&sc, msg + ST_CODEC_HEADER_BYTES + 4 * (i / chunk), 4);
      /* q * scale rounded to float32: at most half an ulp above. */
      CHECK(sc >= 0 && fabs((double) out[i]) <= 127.0 * sc * (1 + 0x1p-24));
    }
  } else {
    uint64_t nonzero = 0;
    for (size_t i = 0; i < n; i++)
      nonzero += out[i] != 0;
    CHECK(nonzero <= st_codec_topk_k(s, n));
  }
}

/* Decodes msg[0..len) as n floats of codec s and checks the outcome. */
static void decode_and_check(const st_codec_spec_t* s, const uint8_t* msg,
                             size_t len, size_t n) {
  float* out = malloc((n > 0 ? n : 1) * sizeof(float));
  CHECK(out != NULL);
  for (size_t i = 0; i < n; i++)
    out[i] = CANARY;
  st_codec_drop_t why = ST_CODEC_DROP_COUNT;
  int rc = st_codec_decode(s, msg, len, out, n, &why);
  if (rc == 0) {
    check_accepted(s, msg, len, out, n);
  } else {
    CHECK(rc == -EBADMSG || rc == -EPROTO);
    CHECK((unsigned) why < ST_CODEC_DROP_COUNT);
    CHECK((rc == -EPROTO) ==
          (why == ST_CODEC_DROP_VERSION || why == ST_CODEC_DROP_KIND));
    for (size_t i = 0; i < n; i++)
      CHECK(out[i] == CANARY);
  }
  free(out);
}

/* The round trip of a valid encoding is within the codec's bound. */
static void check_round_trip(const st_codec_spec_t* s, const float* x, size_t n,
                             const uint8_t* msg, size_t len) {
  float* out = malloc((n > 0 ? n : 1) * sizeof(float));
  CHECK(out != NULL && st_codec_decode(s, msg, len, out, n, NULL) == 0);
  for (size_t i = 0; i < n; i++) {
    double err = fabs((double) x[i] - (double) out[i]), bound = 0;
    if (s->kind == ST_CODEC_BF16)
      bound = ldexp(fabs(x[i]), -8) + ldexp(1, -134);
    else if (s->kind == ST_CODEC_INT8) {
      float sc;
      memcpy(&sc, msg + ST_CODEC_HEADER_BYTES + 4 * (i / 256), 4);
      bound = sc / 2.0 + ldexp(fabs(x[i]), -22);
    } else if (s->kind == ST_CODEC_TOPK && out[i] == 0)
      bound = fabs(x[i]); /* dropped */
    CHECK(err <= bound);
  }
  free(out);
}

/* Two messages of error feedback over x: both decode. */
static void check_error_feedback(const st_codec_spec_t* s, const float* x,
                                 size_t n, uint8_t* msg, size_t cap) {
  st_codec_ef_t ef;
  CHECK(st_codec_ef_init(&ef, s, n) == 0);
  float* out = malloc((n > 0 ? n : 1) * sizeof(float));
  CHECK(out != NULL);
  for (int t = 0; t < 2; t++) {
    size_t len = 0;
    int rc = st_codec_ef_encode(&ef, x, msg, cap, &len);
    CHECK(rc == 0 || rc == -EINVAL); /* -EINVAL: x + r overflowed */
    if (rc == 0)
      CHECK(st_codec_decode(s, msg, len, out, n, NULL) == 0);
  }
  free(out);
  st_codec_ef_close(&ef);
}

static void run_mutated(const st_codec_spec_t* s, size_t n, fuzz_in_t* in) {
  uint8_t edits = fuzz_byte(in) % (MAX_EDITS + 1);
  uint16_t at[MAX_EDITS];
  uint8_t flip[MAX_EDITS];
  for (int e = 0; e < edits; e++) {
    at[e] = (uint16_t) (fuzz_byte(in) | fuzz_byte(in) << 8);
    flip[e] = fuzz_byte(in);
  }
  int8_t resize = (int8_t) fuzz_byte(in);
  float* x = malloc((n > 0 ? n : 1) * sizeof(float));
  CHECK(x != NULL);
  for (size_t i = 0; i < n; i++) {
    uint32_t u = (uint32_t) fuzz_byte(in) | (uint32_t) fuzz_byte(in) << 8 |
                 (uint32_t) fuzz_byte(in) << 16 |
                 (uint32_t) fuzz_byte(in) << 24;
    memcpy(&x[i], &u, 4);
    if (!isfinite(x[i]))
      x[i] = 0;
  }
  size_t cap = st_codec_encoded_bytes(s, n) + 128, len = 0;
  uint8_t* msg = malloc(cap);
  CHECK(msg != NULL && st_codec_encode(s, x, n, msg, cap, &len) == 0);
  CHECK(len == st_codec_encoded_bytes(s, n));
  check_round_trip(s, x, n, msg, len);
  for (int e = 0; e < edits; e++)
    if (len > 0)
      msg[at[e] % len] ^= flip[e];
  if (resize < 0)
    len -= (size_t) -resize < len ? (size_t) -resize : len;
  else
    for (int i = 0; i < resize && len < cap; i++)
      msg[len++] = flip[0] ^ (uint8_t) i;
  decode_and_check(s, msg, len, n);
  check_error_feedback(s, x, n, msg, cap);
  free(msg);
  free(x);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_in_t in = {data, size};
  uint8_t mode = fuzz_byte(&in);
  st_codec_spec_t s = pick_spec(mode);
  size_t n = (size_t) (fuzz_byte(&in) | fuzz_byte(&in) << 8) % MAX_FLOATS;
  if (mode & 4) {
    run_mutated(&s, n, &in);
  } else {
    /* The message on a heap copy of its exact length: ASan sees an
     * overread. */
    uint8_t* msg = malloc(in.left > 0 ? in.left : 1);
    CHECK(msg != NULL);
    if (in.left > 0)
      memcpy(msg, in.p, in.left);
    decode_and_check(&s, msg, in.left, n);
    free(msg);
  }
  return 0;
}
