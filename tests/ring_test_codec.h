/* ring_test_codec.h: a codec for coded ring rounds (gossip.h, "Coded
 * rounds") as plain as can be checked by hand, for the ring's unit tests
 * and its fuzz target, which link the gossip layer only (starling's own
 * codecs live in optimizer/). One scale a segment, max |x| / 127, and each
 * float rounded to the nearest multiple of it: [scale f32][q int8 x n]. A
 * scale that is not finite (or so large that 127 times it overflows) and
 * q = -128 are refused, as starling's int8 refuses them. */
#ifndef STARLING_TESTS_RING_TEST_CODEC_H
#define STARLING_TESTS_RING_TEST_CODEC_H

#include <errno.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "gossip/gossip.h"

static inline size_t rtc_max(void* ctx, size_t n) {
  (void) ctx;
  return 4 + n;
}

static inline int rtc_encode(void* ctx, const float* x, size_t n, uint8_t* out,
                             size_t cap, size_t* len) {
  (void) ctx;
  if (cap < 4 + n)
    return -EMSGSIZE;
  float m = 0;
  for (size_t i = 0; i < n; i++) {
    if (!(fabsf(x[i]) <= FLT_MAX))
      return -EINVAL;
    m = fmaxf(m, fabsf(x[i]));
  }
  float sc = m / 127.0f;
  memcpy(out, &sc, 4);
  for (size_t i = 0; i < n; i++) {
    long q = sc > 0 ? lrintf(x[i] / sc) : 0;
    q = q > 127 ? 127 : q < -127 ? -127 : q;
    out[4 + i] = (uint8_t) (int8_t) q;
  }
  *len = 4 + n;
  return 0;
}

static inline int rtc_decode(void* ctx, const uint8_t* in, size_t len,
                             float* out, size_t n) {
  (void) ctx;
  float sc;
  if (len != 4 + n)
    return -EBADMSG;
  memcpy(&sc, in, 4);
  if (!(sc >= 0 && sc <= FLT_MAX / 128))
    return -EBADMSG;
  for (size_t i = 0; i < n; i++)
    if ((int8_t) in[4 + i] == -128)
      return -EBADMSG;
  for (size_t i = 0; i < n; i++)
    out[i] = (float) (int8_t) in[4 + i] * sc;
  return 0;
}

static const st_ring_codec_t ring_test_codec = {rtc_max, rtc_encode, rtc_decode,
                                                NULL};

#endif
