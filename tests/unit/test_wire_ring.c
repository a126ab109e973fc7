/* test_wire_ring.c: the Check suite for the ring all-reduce's message of
 * the wire codec (RING_SEG, and RING_LANE, the first message of a lane;
 * gossip/wire.c, layout in gossip.h, "Ring all-reduce"): round trips with
 * random contents at every integer width and data sizes up to a full segment, a
 * known-answer encoding, the encoder's refusals, and the decoder's rejections,
 * each checked by its return code and by the counter it bumps: truncation at
 * every length, trailing bytes, field counts, every field with wrong msgpack
 * types and out-of-range values, data that is not whole floats, too long, or
 * reaches past 2^40 floats, and hostile declared lengths; then random
 * mutations.
 *
 * Hand-made messages come from the msgpack writer of tests/wire_testutil.h
 * (no msgpack-c in tests: STYLE.md rule 6). ST_WIRE_WRITE_CORPUS=DIR
 * writes the fuzz seeds (ring_seg, ring_lane) into DIR; otherwise the committed
 * seed under $ST_SOURCE_DIR is checked to decode to the message that wrote it.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/gossip.h"
#include "tests/unit/testutil.h"
#include "tests/wire_testutil.h"

#define SEG_BYTES ST_WIRE_CHUNK_MAX_BYTES
#define BUF_CAP (ST_WIRE_MAX_MESSAGE_BYTES + 64)

/* ==== Helpers ===============================================================
 */

static st_rng_t rng;
static uint8_t data[SEG_BYTES + 64];

static void setup(void) {
  st_rng_seed(&rng, tu_seed());
}

/* A random valid segment of `floats` floats (data in the static buffer). */
static void rand_seg(uint32_t floats, st_msg_t* m) {
  memset(m, 0, sizeof *m);
  m->type = ST_MSG_RING_SEG;
  st_msg_ring_seg_t* g = &m->u.ring_seg;
  g->round_id = tw_rand_bits(&rng, 64);
  g->phase = (uint8_t) st_rng_below(&rng, 2);
  g->step = (uint32_t) tw_rand_bits(&rng, 32);
  g->chunk = (uint32_t) tw_rand_bits(&rng, 32);
  g->offset = tw_rand_bits(&rng, 40) % ((UINT64_C(1) << 40) - floats + 1);
  g->data_len = 4 * floats;
  tw_rand_bytes(&rng, data, g->data_len);
  g->data = data;
}

static uint8_t* enc_buf(void) {
  static uint8_t* b;
  if (b == NULL)
    b = malloc(BUF_CAP);
  ck_assert_ptr_nonnull(b);
  return b;
}

static void round_trip(const st_msg_t* m) {
  uint8_t* buf = enc_buf();
  st_msg_t d;
  size_t len = tw_round_trip(m, buf, BUF_CAP, &d);
  /* The data is borrowed from the input: its last data_len bytes. */
  if (d.u.ring_seg.data_len > 0)
    ck_assert_ptr_eq(d.u.ring_seg.data, buf + len - d.u.ring_seg.data_len);
  st_wire_msg_free(&d);
}

/* Writes [40, 1, round, phase, step, chunk, offset, data] field by field,
 * so that one field at a time can be made wrong. */
typedef enum {
  F_OK = 0,
  F_STR,  /* a str in the field's place */
  F_NIL,  /* nil */
  F_NEG,  /* -1 */
  F_BOOL, /* true */
  F_BIG   /* one past the field's range (u8: 256, u32: 2^32) */
} fbad_t;

typedef struct {
  int n_fields;   /* 6 when valid */
  int bad_field;  /* -1: none */
  fbad_t bad;     /* what the bad field holds */
  uint64_t phase; /* the phase written when not bad */
  uint64_t offset;
  size_t data_len; /* bytes */
} sw_t;

static void w_field(w_t* w, fbad_t bad, uint64_t value, uint64_t big) {
  switch (bad) {
    case F_OK:
      w_uint(w, value);
      break;
    case F_STR:
      w_byte(w, 0xa1), w_byte(w, '1');
      break;
    case F_NIL:
      w_byte(w, 0xc0);
      break;
    case F_NEG:
      w_byte(w, 0xff);
      break;
    case F_BOOL:
      w_byte(w, 0xc3);
      break;
    case F_BIG:
      w_uint(w, big);
      break;
  }
}

static void w_seg(w_t* w, const sw_t* s) {
  static const uint64_t big[5] = {0, 256, UINT64_C(1) << 32, UINT64_C(1) << 32,
                                  0};
  w->n = 0;
  w_byte(w, (uint8_t) (0x90 | (2 + s->n_fields)));
  w_uint(w, ST_MSG_RING_SEG), w_uint(w, ST_WIRE_VERSION);
  const uint64_t values[5] = {0x0123456789abcdefu, s->phase, 3, 7, s->offset};
  for (int f = 0; f < s->n_fields; f++) {
    fbad_t bad = f == s->bad_field ? s->bad : F_OK;
    if (f < 5) {
      w_field(w, bad, values[f], big[f]);
    } else if (f == 5 && bad == F_OK) {
      w_bin(w, data, s->data_len);
    } else if (f == 5) {
      w_field(w, bad, 1, 0);
    } else {
      w_uint(w, 0); /* an extra field */
    }
  }
}

static sw_t sw_ok(void) {
  sw_t s = {6, -1, F_OK, 1, 40, 8};
  return s;
}

/* ==== Round trips ===========================================================
 */

START_TEST(test_round_trip) {
  for (int it = 0; it < 2000; it++) {
    st_msg_t m;
    uint32_t floats = (uint32_t) (it % 4 == 0 ? st_rng_below(&rng, 4)
                                              : st_rng_below(&rng, 300));
    rand_seg(floats, &m);
    round_trip(&m);
  }
  /* A full segment, at the last offset a tensor allows. */
  st_msg_t m;
  rand_seg(ST_RING_SEGMENT_FLOATS, &m);
  m.u.ring_seg.offset = (UINT64_C(1) << 40) - ST_RING_SEGMENT_FLOATS;
  round_trip(&m);
  /* Empty data decodes (the machine refuses it); the widest values. */
  rand_seg(0, &m);
  m.u.ring_seg.offset = UINT64_C(1) << 40;
  m.u.ring_seg.round_id = UINT64_MAX;
  m.u.ring_seg.step = UINT32_MAX;
  m.u.ring_seg.chunk = UINT32_MAX;
  round_trip(&m);
}
END_TEST

/* [40, 1, 5, 1, 2, 300, 4, bin8 8 <two floats>]. */
START_TEST(test_known_answer) {
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_RING_SEG;
  st_msg_ring_seg_t* g = &m.u.ring_seg;
  const float v[2] = {1.0f, -2.0f};
  g->round_id = 5;
  g->phase = ST_RING_ALL_GATHER;
  g->step = 2;
  g->chunk = 300;
  g->offset = 4;
  g->data = (const uint8_t*) v;
  g->data_len = 8;
  uint8_t buf[64];
  size_t len = 0;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  const uint8_t want[] = {0x98, 40,   1,    5,    1,    2,    0xcd,
                          0x01, 0x2c, 4,    0xc4, 8,    0x00, 0x00,
                          0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0};
  ck_assert_uint_eq(len, sizeof want);
  ck_assert_mem_eq(buf, want, sizeof want);
  st_msg_t d;
  ck_assert_int_eq(st_wire_decode(want, sizeof want, &d, NULL), 0);
  ck_assert(msg_same(&m, &d));
}
END_TEST

/* ==== The encoder's refusals ================================================
 */

START_TEST(test_encode_refuses) {
  uint8_t* buf = enc_buf();
  size_t len = 12345;
  st_msg_t m;
  static const uint8_t bad_phases[] = {2, 3, 255};
  for (size_t i = 0; i < sizeof bad_phases; i++) {
    rand_seg(3, &m);
    m.u.ring_seg.phase = bad_phases[i];
    ck_assert_int_eq(st_wire_encode(&m, buf, BUF_CAP, &len), -EINVAL);
  }
  for (uint32_t cut = 1; cut < 4; cut++) {
    rand_seg(3, &m); /* a coded round's bytes need not be whole floats */
    m.u.ring_seg.data_len -= cut;
    ck_assert_int_eq(st_wire_encode(&m, buf, BUF_CAP, &len), 0);
  }
  len = 12345;
  rand_seg(3, &m);
  m.u.ring_seg.data_len = SEG_BYTES + 4;
  ck_assert_int_eq(st_wire_encode(&m, buf, BUF_CAP, &len), -EINVAL);
  rand_seg(3, &m);
  m.u.ring_seg.offset = (UINT64_C(1) << 40) - 2; /* 3 floats reach past */
  ck_assert_int_eq(st_wire_encode(&m, buf, BUF_CAP, &len), -EINVAL);
  m.u.ring_seg.offset = UINT64_MAX;
  ck_assert_int_eq(st_wire_encode(&m, buf, BUF_CAP, &len), -EINVAL);
  rand_seg(3, &m);
  m.u.ring_seg.data = NULL;
  ck_assert_int_eq(st_wire_encode(&m, buf, BUF_CAP, &len), -EINVAL);
  ck_assert_uint_eq(len, 12345); /* untouched on failure */
  /* Too small a buffer, at every size short of the message. */
  rand_seg(5, &m);
  size_t full = 0;
  ck_assert_int_eq(st_wire_encode(&m, buf, BUF_CAP, &full), 0);
  for (size_t cap = 0; cap < full; cap++)
    ck_assert_int_eq(st_wire_encode(&m, buf, cap, &len), -EMSGSIZE);
}
END_TEST

/* ==== The decoder's rejections ==============================================
 */

START_TEST(test_reject_truncated) {
  st_msg_t m;
  rand_seg(9, &m);
  uint8_t* buf = enc_buf();
  size_t len = 0;
  ck_assert_int_eq(st_wire_encode(&m, buf, BUF_CAP, &len), 0);
  tw_expect_truncations(buf, len);
}
END_TEST

START_TEST(test_reject_field_count) {
  w_t* w = w_new(BUF_CAP);
  sw_t s = sw_ok();
  w_seg(w, &s);
  st_msg_t d;
  ck_assert_int_eq(st_wire_decode(w->b, w->n, &d, NULL), 0);
  for (int n = 0; n <= 9; n++) {
    if (n == 6)
      continue;
    s.n_fields = n;
    w_seg(w, &s);
    tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "field count");
  }
  w_free(w);
}
END_TEST

/* One field wrong at a time: every field with every wrong kind of value. */
START_TEST(test_reject_fields) {
  w_t* w = w_new(BUF_CAP);
  for (int f = 0; f < 6; f++) {
    for (fbad_t bad = F_STR; bad <= F_BIG; bad++) {
      if (bad == F_BIG && (f == 0 || f >= 4))
        continue; /* u64 fields have no value past their range */
      sw_t s = sw_ok();
      s.bad_field = f;
      s.bad = bad;
      w_seg(w, &s);
      char what[64];
      snprintf(what, sizeof what, "field %d, kind %d", f, (int) bad);
      tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, what);
    }
  }
  /* Phases 2 .. 255: in a u8, out of range. */
  static const uint64_t phases[] = {2, 3, 127, 255};
  for (size_t i = 0; i < sizeof phases / sizeof phases[0]; i++) {
    sw_t s = sw_ok();
    s.phase = phases[i];
    w_seg(w, &s);
    tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "phase");
  }
  /* Data that is not whole floats decodes (a coded round's bytes): its
   * length is the ring machine's to check. */
  for (size_t n = 1; n < 12; n++) {
    sw_t s = sw_ok();
    s.data_len = n;
    w_seg(w, &s);
    st_msg_t d;
    ck_assert_int_eq(st_wire_decode(w->b, w->n, &d, NULL), 0);
    ck_assert_uint_eq(d.u.ring_seg.data_len, n);
  }
  /* Reaching past 2^40 floats; up to it is fine. */
  sw_t s = sw_ok();
  s.data_len = 8;
  s.offset = (UINT64_C(1) << 40) - 1;
  w_seg(w, &s);
  tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "past 2^40");
  s.offset = UINT64_MAX;
  w_seg(w, &s);
  tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "offset max");
  s.offset = (UINT64_C(1) << 40) - 2;
  w_seg(w, &s);
  st_msg_t d;
  ck_assert_int_eq(st_wire_decode(w->b, w->n, &d, NULL), 0);
  ck_assert_uint_eq(d.u.ring_seg.offset, (UINT64_C(1) << 40) - 2);
  w_free(w);
}
END_TEST

/* Data beyond a segment: a limit, after the walk (the bytes are there). */
START_TEST(test_reject_too_long) {
  w_t* w = w_new(BUF_CAP);
  sw_t s = sw_ok();
  s.offset = 0;
  s.data_len = SEG_BYTES + 4;
  w_seg(w, &s);
  ck_assert_uint_le(w->n, ST_WIRE_MAX_MESSAGE_BYTES);
  tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_LIMIT, "data too long");
  s.data_len = SEG_BYTES;
  w_seg(w, &s);
  st_msg_t d;
  ck_assert_int_eq(st_wire_decode(w->b, w->n, &d, NULL), 0);
  ck_assert_uint_eq(d.u.ring_seg.data_len, SEG_BYTES);
  w_free(w);
}
END_TEST

/* A data bin whose declared length is beyond the bytes left (bin32 of
 * 4 GiB, bin16 of 64 KiB, bin8 of 255): refused by the walk before
 * msgpack-c. */
START_TEST(test_reject_hostile_lengths) {
  const struct {
    uint8_t head[5];
    size_t head_len;
  } heads[] = {
      {{0xc6, 0xff, 0xff, 0xff, 0xff}, 5},
      {{0xc6, 0x00, 0x10, 0x00, 0x04}, 5},
      {{0xc5, 0xff, 0xff}, 3},
      {{0xc4, 0xff}, 2},
  };
  w_t* w = w_new(BUF_CAP);
  for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
    w->n = 0;
    w_byte(w, 0x98), w_uint(w, ST_MSG_RING_SEG), w_uint(w, 1);
    w_uint(w, 1), w_uint(w, 0), w_uint(w, 0), w_uint(w, 0), w_uint(w, 0);
    w_raw(w, heads[i].head, heads[i].head_len);
    w_raw(w, "abcd", 4);
    tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_LIMIT, "bin length");
  }
  w_free(w);
}
END_TEST

/* Random byte flips of valid encodings: decoded or refused with exactly
 * one drop, and whatever decodes re-encodes to the same message. */
START_TEST(test_mutations) {
  uint8_t* buf = enc_buf();
  static uint8_t again[4096];
  for (int it = 0; it < 20000; it++) {
    st_msg_t m;
    rand_seg((uint32_t) st_rng_below(&rng, 20), &m);
    size_t len = 0;
    ck_assert_int_eq(st_wire_encode(&m, buf, BUF_CAP, &len), 0);
    st_msg_t d;
    if (!tw_mutate_decode(&rng, buf, len, &d))
      continue;
    size_t n2 = 0;
    ck_assert_int_eq(st_wire_encode(&d, again, sizeof again, &n2), 0);
    st_msg_t d2;
    ck_assert_int_eq(st_wire_decode(again, n2, &d2, NULL), 0);
    ck_assert(msg_same(&d, &d2));
    st_wire_msg_free(&d);
    st_wire_msg_free(&d2);
  }
}
END_TEST

/* ==== The fuzz seed =========================================================
 */

/* The seed, from a fixed seed: a valid segment of 16 floats. */
static void seed_msg(st_msg_t* m) {
  st_rng_seed(&rng, 20240612);
  rand_seg(16, m);
  m->u.ring_seg.round_id = 0x0102030405060708u;
  m->u.ring_seg.phase = ST_RING_REDUCE_SCATTER;
  m->u.ring_seg.step = 1;
  m->u.ring_seg.chunk = 2;
  m->u.ring_seg.offset = 32;
}

START_TEST(test_fuzz_corpus) {
  st_msg_t m;
  seed_msg(&m);
  tw_fuzz_seed(&m, "ring_seg");
}
END_TEST

/* RING_LANE: round trips of every valid (lane, lanes), a known answer, the
 * encoder's refusals and the decoder's: lane >= lanes, lanes 0 or past
 * ST_RING_MAX_LANES, a field of the wrong type or count, truncations. */
START_TEST(test_lane) {
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_RING_LANE;
  for (uint32_t lanes = 1; lanes <= ST_RING_MAX_LANES; lanes++)
    for (uint32_t lane = 0; lane < lanes; lane++) {
      m.u.ring_lane.round_id = tw_rand_bits(&rng, 64);
      m.u.ring_lane.lane = lane;
      m.u.ring_lane.lanes = lanes;
      st_msg_t d;
      tw_round_trip(&m, enc_buf(), BUF_CAP, &d);
      st_wire_msg_free(&d);
    }
  /* [45, 1, 7, 2, 3]: fixints all. */
  m.u.ring_lane.round_id = 7;
  m.u.ring_lane.lane = 2;
  m.u.ring_lane.lanes = 3;
  uint8_t* buf = enc_buf();
  size_t len = 0;
  ck_assert_int_eq(st_wire_encode(&m, buf, BUF_CAP, &len), 0);
  static const uint8_t want[] = {0x95, 45, 1, 7, 2, 3};
  ck_assert_uint_eq(len, sizeof want);
  ck_assert_int_eq(memcmp(buf, want, sizeof want), 0);
  tw_fuzz_seed(&m, "ring_lane"); /* the fuzz seed is this message */
  tw_expect_truncations(buf, len);
  static const uint32_t bad[][2] = {
      {3, 3}, {0, 0}, {0, ST_RING_MAX_LANES + 1}, {UINT32_MAX, 2}};
  w_t* w = w_new(64);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    m.u.ring_lane.lane = bad[i][0];
    m.u.ring_lane.lanes = bad[i][1];
    ck_assert_int_eq(st_wire_encode(&m, buf, BUF_CAP, &len), -EINVAL);
    w->n = 0;
    w_array(w, 5);
    w_uint(w, 45);
    w_uint(w, 1);
    w_uint(w, 7);
    w_uint(w, bad[i][0]);
    w_uint(w, bad[i][1]);
    tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "lane numbers");
  }
  w->n = 0; /* a field short */
  w_array(w, 4);
  w_uint(w, 45);
  w_uint(w, 1);
  w_uint(w, 7);
  w_uint(w, 0);
  tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "field count");
  w->n = 0; /* a str for the lane */
  w_array(w, 5);
  w_uint(w, 45);
  w_uint(w, 1);
  w_uint(w, 7);
  w_str(w, "0", 1);
  w_uint(w, 2);
  tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "lane type");
  w_free(w);
}
END_TEST

static Suite* wire_ring_suite(void) {
  Suite* s = suite_create("wire_ring");
  TCase* tr = tcase_create("round_trip");
  tcase_add_checked_fixture(tr, setup, NULL);
  tcase_add_test(tr, test_round_trip);
  tcase_add_test(tr, test_known_answer);
  tcase_add_test(tr, test_encode_refuses);
  tcase_add_test(tr, test_fuzz_corpus);
  tcase_add_test(tr, test_lane);
  suite_add_tcase(s, tr);
  TCase* td = tcase_create("decode_rejects");
  tcase_add_checked_fixture(td, setup, NULL);
  tcase_add_test(td, test_reject_truncated);
  tcase_add_test(td, test_reject_field_count);
  tcase_add_test(td, test_reject_fields);
  tcase_add_test(td, test_reject_too_long);
  tcase_add_test(td, test_reject_hostile_lengths);
  tcase_add_test(td, test_mutations);
  suite_add_tcase(s, td);
  return s;
}

int main(void) {
  return tw_main(wire_ring_suite);
}
