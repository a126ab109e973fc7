/* test_crypto_stream.c: Check suite for encrypted streams (crypto/stream.c;
 * crypto.h "Streams", libsodium secretstream): round trips of many frames
 * of sizes 0, 1, indivisible and 1 MiB; a flipped byte anywhere (stream
 * header, length prefix, ciphertext) rejected; reordered, duplicated and
 * truncated streams detected and counted; lengths refused from their 4
 * bytes; nothing accepted after the final frame; a failed stream stays
 * failed. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crypto/crypto.h"
#include "tests/unit/testutil.h"

/* A sealed stream held in memory: the header and the frames back to back,
 * each with its 4-byte length. */
typedef struct {
  uint8_t key[ST_KEY_BYTES];
  uint8_t header[ST_STREAM_HEADER_BYTES];
  uint8_t* wire;
  size_t len;
  size_t off[64]; /* where each frame starts */
  size_t n;
} tape_t;

static uint8_t* msg_bytes(size_t len, uint8_t seed) {
  uint8_t* m = malloc(len + 1);
  ck_assert_ptr_nonnull(m);
  for (size_t i = 0; i < len; i++)
    m[i] = (uint8_t) (i * 31u + seed);
  return m;
}

static size_t size_of_frame(size_t k, const size_t* sizes, size_t n_sizes) {
  return sizes[k % n_sizes];
}

/* Seals n frames of the given sizes (cycled), the last one final. */
static void tape_seal(tape_t* t, const size_t* sizes, size_t n_sizes,
                      size_t n) {
  ck_assert_int_eq(st_crypto_init(), 0);
  memset(t, 0, sizeof(*t));
  for (int i = 0; i < ST_KEY_BYTES; i++)
    t->key[i] = (uint8_t) (7 * i + 1);
  st_stream_t tx;
  ck_assert_int_eq(st_stream_tx_init(&tx, t->key, t->header), 0);
  size_t total = 0;
  for (size_t k = 0; k < n; k++)
    total += size_of_frame(k, sizes, n_sizes) + ST_STREAM_ABYTES + 4;
  t->wire = malloc(total + 1);
  ck_assert_ptr_nonnull(t->wire);
  for (size_t k = 0; k < n; k++) {
    size_t len = size_of_frame(k, sizes, n_sizes);
    uint8_t* m = msg_bytes(len, (uint8_t) k);
    size_t out = 0;
    t->off[k] = t->len;
    ck_assert_int_eq(
        st_stream_seal_frame(&tx, m, len, k + 1 == n, t->wire + t->len,
                             total - t->len, &out),
        0);
    ck_assert_uint_eq(out, len + ST_STREAM_ABYTES + 4);
    t->len += out;
    free(m);
  }
  t->n = n;
  /* Nothing can be sealed after the final frame. */
  uint8_t spare[64];
  size_t out;
  ck_assert_int_eq(
      st_stream_seal_frame(&tx, spare, 1, false, spare, sizeof(spare), &out),
      -EPROTO);
  st_stream_wipe(&tx);
}

/* Opens frames of t in the given order (frame indices), checking each
 * message; stops at the first failure and returns its code. */
static int tape_open(const tape_t* t, const uint8_t* wire,
                     const uint8_t* header, const size_t* order, size_t n,
                     const size_t* sizes, size_t n_sizes,
                     st_crypto_counters_t* c, st_stream_t* rx) {
  ck_assert_int_eq(st_stream_rx_init(rx, t->key, header), 0);
  for (size_t k = 0; k < n; k++) {
    size_t f = order[k];
    size_t ct_len = 0;
    int rc =
        st_frame_length(wire + t->off[f], ST_FRAME_MAX_DEFAULT, c, &ct_len);
    if (rc != 0)
      return rc;
    if (t->off[f] + 4 + ct_len > t->len)
      return -EPIPE; /* the length points past the data: the reader waits */
    uint8_t* msg = malloc(ct_len);
    size_t mlen = 0;
    bool final = false;
    rc = st_stream_open_frame(rx, c, wire + t->off[f] + 4, ct_len, msg, ct_len,
                              &mlen, &final);
    if (rc == 0) {
      size_t want = size_of_frame(f, sizes, n_sizes);
      uint8_t* m = msg_bytes(want, (uint8_t) f);
      ck_assert_uint_eq(mlen, want);
      ck_assert(want == 0 || memcmp(m, msg, want) == 0);
      ck_assert(final == (f + 1 == t->n));
      free(m);
    }
    free(msg);
    if (rc != 0)
      return rc;
  }
  return 0;
}

static uint64_t total(const st_crypto_counters_t* c) {
  uint64_t n = 0;
  for (int k = 0; k < ST_CRYPTO_DROP_COUNT; k++)
    n += c->drops[k];
  return n;
}

/* ---- Round trips ------------------------------------------------------------
 */

static const size_t mixed[] = {0, 1, 17, 1000, 4093, 65536, 1024 * 1024};
static const struct {
  const size_t* sizes;
  size_t n_sizes, frames;
} rt_cases[] = {
    {mixed, 7, 7},      {mixed, 1, 1}, /* one empty final frame */
    {mixed + 1, 1, 50},                /* many 1-byte frames */
    {mixed + 6, 1, 3},                 /* 1 MiB chunks */
    {mixed, 7, 40},
};

START_TEST(test_round_trip) {
  tape_t t;
  tape_seal(&t, rt_cases[_i].sizes, rt_cases[_i].n_sizes, rt_cases[_i].frames);
  size_t order[64];
  for (size_t k = 0; k < t.n; k++)
    order[k] = k;
  st_crypto_counters_t c = {{0}};
  st_stream_t rx;
  ck_assert_int_eq(tape_open(&t, t.wire, t.header, order, t.n,
                             rt_cases[_i].sizes, rt_cases[_i].n_sizes, &c, &rx),
                   0);
  ck_assert_int_eq(st_stream_rx_end(&rx, &c), 0);
  ck_assert_uint_eq(total(&c), 0);
  st_stream_wipe(&rx);
  free(t.wire);
}
END_TEST

/* ---- Tampering --------------------------------------------------------------
 */

/* A flipped byte at every position of the header and of a 3-frame stream:
 * a flip in the length prefix is refused by length or fails (or leaves the
 * reader waiting for bytes that never come: a truncation); any other flip
 * fails authentication. */
START_TEST(test_flip_every_byte) {
  static const size_t sizes[] = {40, 0, 5};
  tape_t t;
  tape_seal(&t, sizes, 3, 3);
  size_t order[3] = {0, 1, 2};
  size_t n_pos = ST_STREAM_HEADER_BYTES + t.len;
  uint8_t* wire = malloc(t.len);
  for (size_t pos = 0; pos < n_pos; pos++) {
    uint8_t header[ST_STREAM_HEADER_BYTES];
    memcpy(header, t.header, sizeof(header));
    memcpy(wire, t.wire, t.len);
    if (pos < ST_STREAM_HEADER_BYTES)
      header[pos] ^= 0x01;
    else
      wire[pos - ST_STREAM_HEADER_BYTES] ^= 0x01;
    st_crypto_counters_t c = {{0}};
    st_stream_t rx;
    int rc = tape_open(&t, wire, header, order, 3, sizes, 3, &c, &rx);
    ck_assert_msg(rc != 0, "flip at %zu accepted", pos);
    if (rc == -EBADMSG && c.drops[ST_DROP_STREAM_AUTH] == 1) {
      /* Poisoned: even the genuine next frame is refused now. */
      bool final;
      size_t mlen;
      uint8_t buf[64];
      ck_assert_int_eq(st_stream_open_frame(&rx, &c, t.wire + 4, 57, buf,
                                            sizeof(buf), &mlen, &final),
                       -EPROTO);
      ck_assert_int_eq(st_stream_rx_end(&rx, &c), -EBADMSG);
    } else if (rc == -EPIPE) {
      ck_assert_int_eq(st_stream_rx_end(&rx, &c), -EBADMSG);
      ck_assert_uint_eq(c.drops[ST_DROP_STREAM_TRUNCATED], 1);
    } else {
      ck_assert_msg(c.drops[ST_DROP_FRAME_TOO_LARGE] == 1,
                    "flip at %zu: rc %d, not counted", pos, rc);
    }
    ck_assert_uint_eq(total(&c), 1);
    st_stream_wipe(&rx);
  }
  free(wire);
  free(t.wire);
}
END_TEST

static const size_t three[] = {10, 20, 30, 40};
static const struct {
  const char* name;
  size_t order[6];
  size_t n;
} order_cases[] = {
    {"reordered", {0, 2, 1, 3}, 4},
    {"duplicated", {0, 1, 1, 2, 3}, 5},
    {"dropped", {0, 2, 3}, 3},
    {"final first", {3}, 1},
    {"replayed from the start", {0, 1, 0}, 3},
};

START_TEST(test_bad_order) {
  tape_t t;
  tape_seal(&t, three, 4, 4);
  st_crypto_counters_t c = {{0}};
  st_stream_t rx;
  int rc = tape_open(&t, t.wire, t.header, order_cases[_i].order,
                     order_cases[_i].n, three, 4, &c, &rx);
  ck_assert_msg(rc == -EBADMSG, "%s: %d", order_cases[_i].name, rc);
  ck_assert_uint_eq(c.drops[ST_DROP_STREAM_AUTH], 1);
  ck_assert_uint_eq(total(&c), 1);
  /* Poisoned: the next genuine frame is refused too. */
  uint8_t buf[64];
  size_t mlen;
  bool final;
  ck_assert_int_eq(st_stream_open_frame(&rx, &c, t.wire + t.off[1] + 4,
                                        20 + ST_STREAM_ABYTES, buf, sizeof(buf),
                                        &mlen, &final),
                   -EPROTO);
  st_stream_wipe(&rx);
  free(t.wire);
}
END_TEST

/* A stream cut anywhere before its final frame is a truncation. */
START_TEST(test_truncated) {
  tape_t t;
  tape_seal(&t, three, 4, 4);
  size_t order[4] = {0, 1, 2, 3};
  st_crypto_counters_t c = {{0}};
  st_stream_t rx;
  size_t upto = (size_t) _i; /* frames received: 0..3 of 4 */
  ck_assert_int_eq(
      tape_open(&t, t.wire, t.header, order, upto, three, 4, &c, &rx), 0);
  ck_assert_int_eq(st_stream_rx_end(&rx, &c), -EBADMSG);
  ck_assert_uint_eq(c.drops[ST_DROP_STREAM_TRUNCATED], 1);
  ck_assert_uint_eq(total(&c), 1);
  st_stream_wipe(&rx);
  free(t.wire);
}
END_TEST

/* After the final frame nothing is accepted, not even a frame that would
 * authenticate: a copy of the sender's state taken before the final frame
 * seals a genuine continuation. */
START_TEST(test_after_final) {
  uint8_t key[ST_KEY_BYTES] = {1}, header[ST_STREAM_HEADER_BYTES];
  st_stream_t tx, fork, rx, rx2;
  ck_assert_int_eq(st_crypto_init(), 0);
  ck_assert_int_eq(st_stream_tx_init(&tx, key, header), 0);
  uint8_t f1[64], f2[64], f2b[64], f3b[64];
  size_t n1, n2, n2b, n3b;
  const uint8_t m[3] = {1, 2, 3};
  ck_assert_int_eq(st_stream_seal_frame(&tx, m, 3, false, f1, 64, &n1), 0);
  fork = tx;
  ck_assert_int_eq(st_stream_seal_frame(&tx, m, 3, true, f2, 64, &n2), 0);
  ck_assert_int_eq(st_stream_seal_frame(&fork, m, 3, false, f2b, 64, &n2b), 0);
  ck_assert_int_eq(st_stream_seal_frame(&fork, m, 2, false, f3b, 64, &n3b), 0);
  uint8_t buf[64];
  size_t mlen;
  bool final;
  st_crypto_counters_t c = {{0}};
  /* Control: the continuation is genuine on the forked branch. */
  ck_assert_int_eq(st_stream_rx_init(&rx2, key, header), 0);
  ck_assert_int_eq(
      st_stream_open_frame(&rx2, &c, f1 + 4, n1 - 4, buf, 64, &mlen, &final),
      0);
  ck_assert_int_eq(
      st_stream_open_frame(&rx2, &c, f2b + 4, n2b - 4, buf, 64, &mlen, &final),
      0);
  ck_assert(!final);
  ck_assert_int_eq(
      st_stream_open_frame(&rx2, &c, f3b + 4, n3b - 4, buf, 64, &mlen, &final),
      0);
  ck_assert_uint_eq(mlen, 2);
  ck_assert_uint_eq(total(&c), 0);
  /* The real receiver: frame 1, the final frame 2, then the continuation. */
  ck_assert_int_eq(st_stream_rx_init(&rx, key, header), 0);
  ck_assert_int_eq(
      st_stream_open_frame(&rx, &c, f1 + 4, n1 - 4, buf, 64, &mlen, &final), 0);
  ck_assert_int_eq(
      st_stream_open_frame(&rx, &c, f2 + 4, n2 - 4, buf, 64, &mlen, &final), 0);
  ck_assert(final);
  ck_assert_int_eq(
      st_stream_open_frame(&rx, &c, f3b + 4, n3b - 4, buf, 64, &mlen, &final),
      -EBADMSG);
  ck_assert_uint_eq(c.drops[ST_DROP_STREAM_AFTER_FINAL], 1);
  ck_assert_uint_eq(total(&c), 1);
  ck_assert_int_eq(st_stream_rx_end(&rx, &c), -EBADMSG); /* poisoned */
  ck_assert_uint_eq(total(&c), 1);
  st_stream_wipe(&tx);
  st_stream_wipe(&fork);
  st_stream_wipe(&rx);
  st_stream_wipe(&rx2);
}
END_TEST

/* ---- Frame lengths ----------------------------------------------------------
 */

static const struct {
  uint8_t hdr[4];
  size_t max;
  int rc;
  size_t len;
} length_cases[] = {
    {{0, 0, 0, 17}, ST_FRAME_MAX_DEFAULT, 0, 17},
    {{0, 0, 0, 16}, ST_FRAME_MAX_DEFAULT, -EBADMSG, 0},
    {{0, 0, 0, 0}, ST_FRAME_MAX_DEFAULT, -EBADMSG, 0},
    {{0, 0x10, 0x04, 0x11}, ST_FRAME_MAX_DEFAULT, 0, ST_FRAME_MAX_DEFAULT},
    {{0, 0x10, 0x04, 0x12}, ST_FRAME_MAX_DEFAULT, -EMSGSIZE, 0},
    {{0xff, 0xff, 0xff, 0xff}, ST_FRAME_MAX_DEFAULT, -EMSGSIZE, 0},
    {{0x80, 0, 0, 0}, ST_FRAME_MAX_DEFAULT, -EMSGSIZE, 0},
    {{0, 0, 1, 0}, 256, 0, 256},
    {{0, 0, 1, 1}, 256, -EMSGSIZE, 0},
};

START_TEST(test_frame_length) {
  st_crypto_counters_t c = {{0}};
  size_t len = 12345;
  int rc =
      st_frame_length(length_cases[_i].hdr, length_cases[_i].max, &c, &len);
  ck_assert_int_eq(rc, length_cases[_i].rc);
  if (rc == 0) {
    ck_assert_uint_eq(len, length_cases[_i].len);
    ck_assert_uint_eq(total(&c), 0);
  } else {
    ck_assert_uint_eq(len, 12345); /* untouched */
    ck_assert_uint_eq(c.drops[ST_DROP_FRAME_TOO_LARGE], 1);
  }
}
END_TEST

/* Misuse: a wiped or wrong-direction stream, small buffers. */
START_TEST(test_misuse) {
  uint8_t key[ST_KEY_BYTES] = {2}, header[ST_STREAM_HEADER_BYTES];
  uint8_t buf[128], out[128];
  size_t n, mlen;
  bool final;
  st_crypto_counters_t c = {{0}};
  st_stream_t tx, rx, wiped;
  memset(buf, 0, sizeof(buf));
  ck_assert_int_eq(st_crypto_init(), 0);
  ck_assert_int_eq(st_stream_tx_init(&tx, key, header), 0);
  ck_assert_int_eq(st_stream_rx_init(&rx, key, header), 0);
  st_stream_wipe(&wiped);
  ck_assert_int_eq(st_stream_seal_frame(&wiped, buf, 1, false, out, 128, &n),
                   -EPROTO);
  ck_assert_int_eq(st_stream_seal_frame(&rx, buf, 1, false, out, 128, &n),
                   -EPROTO);
  ck_assert_int_eq(
      st_stream_open_frame(&tx, &c, buf, 30, out, 128, &mlen, &final), -EPROTO);
  ck_assert_int_eq(
      st_stream_open_frame(&wiped, &c, buf, 30, out, 128, &mlen, &final),
      -EPROTO);
  ck_assert_int_eq(st_stream_rx_end(&tx, &c), -EPROTO);
  /* Too small an output: refused, nothing consumed. */
  ck_assert_int_eq(st_stream_seal_frame(&tx, buf, 100, false, out, 120, &n),
                   -EINVAL);
  ck_assert_int_eq(st_stream_seal_frame(&tx, buf, 100, false, out, 121, &n), 0);
  ck_assert_int_eq(
      st_stream_open_frame(&rx, &c, out + 4, n - 4, buf, 99, &mlen, &final),
      -EINVAL);
  ck_assert_int_eq(
      st_stream_open_frame(&rx, &c, out + 4, n - 4, buf, 100, &mlen, &final),
      0);
  /* A frame shorter than its tag fails and poisons. */
  ck_assert_int_eq(
      st_stream_open_frame(&rx, &c, out, 16, buf, 100, &mlen, &final),
      -EBADMSG);
  ck_assert_uint_eq(c.drops[ST_DROP_STREAM_AUTH], 1);
  ck_assert_uint_eq(total(&c), 1);
  st_stream_wipe(&tx);
  st_stream_wipe(&rx);
  ck_assert_int_eq(st_stream_rx_end(&rx, &c), -EPROTO);
}
END_TEST

static Suite* stream_suite(void) {
  Suite* s = suite_create("crypto_stream");
  TCase* tc = tcase_create("stream");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_round_trip, 0,
                      (int) (sizeof(rt_cases) / sizeof(rt_cases[0])));
  tcase_add_test(tc, test_flip_every_byte);
  tcase_add_loop_test(tc, test_bad_order, 0,
                      (int) (sizeof(order_cases) / sizeof(order_cases[0])));
  tcase_add_loop_test(tc, test_truncated, 0, 4);
  tcase_add_test(tc, test_after_final);
  tcase_add_loop_test(tc, test_frame_length, 0,
                      (int) (sizeof(length_cases) / sizeof(length_cases[0])));
  tcase_add_test(tc, test_misuse);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(stream_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
