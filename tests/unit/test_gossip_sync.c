/* test_gossip_sync.c: the Check suite for multi-donor state sync (gossip.h,
 * "Multi-donor state sync"): its two wire messages and the plan of
 * gossip/sync.c.
 *
 * Wire (gossip/wire.c): SYNC_REQ (MANIFEST and RANGE) and SYNC_REPLY
 * round trips with random contents, up to a manifest of ST_SYNC_MAX_CHUNKS
 * hashes (borrowed from the input); a known-answer encoding; the encoder's
 * refusals of every rule; the decoder's rejections, each checked by its
 * return code and by the one counter it bumps: unknown kinds, a MANIFEST
 * with a range, a RANGE of no or too many chunks, n_params over 2^40, an
 * unknown status, hashes not whole or over their cap, fields of the wrong
 * size or type, field counts, truncation at every length; and random byte
 * flips.
 *
 * Plan (gossip/sync.c), on a random state of several chunks whose last one
 * is short: chunk counts and the plan's limits; which manifests are kept;
 * agreement (one donor alone is not enough, an odd manifest is left out,
 * ties go to the larger smallest step, then the smaller index; once agreed
 * it stays); ranges taken by several donors and chunks verified into the
 * exact original floats; a corrupted chunk (BAD), a range ended early
 * (dropped or not), chunks out of order, of the wrong length or unasked
 * for (ORDER): each drops the donor and puts its undelivered chunks back
 * in the pool, never its verified ones; when take refuses; and a whole
 * sync with a donor killed mid-range and a corrupting one.
 *
 * Hand-made messages come from the msgpack writer of tests/wire_testutil.h
 * (no msgpack-c in tests: STYLE.md rule 6). ST_WIRE_WRITE_CORPUS=DIR
 * writes two fuzz seeds (sync_req, sync_reply) into DIR; otherwise
 * committed ones under $ST_SOURCE_DIR, if any, are checked. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crypto/crypto.h"
#include "gossip/gossip.h"
#include "tests/unit/testutil.h"
#include "tests/wire_testutil.h"

#define BUF_CAP 4096
#define CF ((uint64_t) ST_SYNC_CHUNK_FLOATS)
/* The wire's largest n_params (ST__WIRE_MAX_TENSOR_FLOATS). */
#define MAX_PARAMS (UINT64_C(1) << 40)
/* The test state: 4 chunks, the last of 1000 floats. */
#define N_FLOATS (3 * CF + 1000)
#define ROUND 7

static st_rng_t rng;

/* ==== The state that donors serve ===========================================
 */

typedef struct {
  float* x; /* the agreed state */
  uint64_t n;
  uint64_t chunks;
  uint8_t* hashes; /* its manifest: chunks * ST_SYNC_HASH_BYTES */
  uint8_t* odd;    /* the same with one bit of one hash flipped */
  uint8_t id[ST_XCHG_ANCHOR_BYTES];
  float* out;       /* what the joiner assembles from OK chunks */
  uint8_t* scratch; /* one chunk's bytes, for bad ones */
} state_t;

static state_t S;

static void state_make(uint64_t n) {
  S.n = n;
  S.chunks = st_sync_chunks(n);
  S.x = malloc(n * sizeof(float));
  S.out = calloc(n, sizeof(float));
  S.hashes = malloc(S.chunks * ST_SYNC_HASH_BYTES);
  S.odd = malloc(S.chunks * ST_SYNC_HASH_BYTES);
  S.scratch = calloc(CF, sizeof(float));
  ck_assert(S.x && S.out && S.hashes && S.odd && S.scratch);
  tu_fill_uniform(&rng, S.x, n, -2.0f, 2.0f);
  for (uint64_t c = 0; c < S.chunks; c++) {
    uint64_t floats = c + 1 < S.chunks ? CF : n - c * CF;
    st_hash_once(S.x + c * CF, floats * sizeof(float),
                 S.hashes + c * ST_SYNC_HASH_BYTES, ST_SYNC_HASH_BYTES);
  }
  memcpy(S.odd, S.hashes, S.chunks * ST_SYNC_HASH_BYTES);
  S.odd[st_rng_below(&rng, S.chunks * ST_SYNC_HASH_BYTES)] ^=
      (uint8_t) (1u << st_rng_below(&rng, 8));
  tw_rand_bytes(&rng, S.id, sizeof S.id);
  S.id[0] |= 1; /* not all zero */
}

static void state_free(void) {
  free(S.x);
  free(S.out);
  free(S.hashes);
  free(S.odd);
  free(S.scratch);
  memset(&S, 0, sizeof S);
}

static void setup(void) {
  st_rng_seed(&rng, tu_seed());
}

static void setup_state(void) {
  setup();
  state_make(N_FLOATS);
}

/* Chunk c of the state: its first float, and its length in bytes. */
static const uint8_t* chunk_ptr(uint64_t c) {
  return (const uint8_t*) (S.x + c * CF);
}

static size_t chunk_len(uint64_t c) {
  return (size_t) ((c + 1 < S.chunks ? CF : S.n - c * CF) * sizeof(float));
}

/* The state's manifest, as donor with `step` sends it. */
static void manifest(st_msg_sync_reply_t* r, uint64_t step) {
  memset(r, 0, sizeof *r);
  r->status = ST_SYNC_STATUS_OK;
  memcpy(r->anchor, S.id, sizeof r->anchor);
  r->round = ROUND;
  r->step = step;
  r->n_params = S.n;
  r->hashes = S.hashes;
  r->hashes_len = (uint32_t) (S.chunks * ST_SYNC_HASH_BYTES);
}

/* A plan in which donors 0 .. n - 1 (n >= 2) agree, donor i at step
 * 100 + i. */
static st_sync_plan_t* plan_agreed(unsigned n) {
  st_sync_plan_t* p = NULL;
  ck_assert_int_eq(st_sync_plan_new(S.n, &p), 0);
  for (unsigned i = 0; i < n; i++) {
    st_msg_sync_reply_t r;
    manifest(&r, 100 + i);
    ck_assert_int_eq(st_sync_plan_manifest(p, i, &r), 0);
  }
  ck_assert_uint_eq(st_sync_plan_agree(p, 2), n);
  ck_assert_uint_eq(st_sync_plan_usable_count(p), n);
  return p;
}

/* Donor sends chunk c as it should; an OK chunk's floats go into S.out. */
static st_sync_chunk_t feed(st_sync_plan_t* p, unsigned donor, uint64_t c) {
  uint64_t got = UINT64_MAX;
  st_sync_chunk_t r =
      st_sync_plan_chunk(p, donor, c * CF, chunk_ptr(c), chunk_len(c), &got);
  if (r == ST_SYNC_CHUNK_OK) {
    ck_assert_uint_eq(got, c);
    memcpy(S.out + c * CF, chunk_ptr(c), chunk_len(c));
  }
  return r;
}

/* Donor sends chunk c at its offset and length with one bit flipped. */
static st_sync_chunk_t feed_flipped(st_sync_plan_t* p, unsigned donor,
                                    uint64_t c) {
  size_t len = chunk_len(c);
  memcpy(S.scratch, chunk_ptr(c), len);
  S.scratch[st_rng_below(&rng, len)] ^= (uint8_t) (1u << st_rng_below(&rng, 8));
  uint64_t got = 0;
  return st_sync_plan_chunk(p, donor, c * CF, S.scratch, len, &got);
}

/* take must give donor the range [first, first + count). */
#define expect_take(p, donor, max, want_first, want_count)         \
  do {                                                             \
    uint64_t first_ = UINT64_MAX, count_ = UINT64_MAX;             \
    ck_assert(st_sync_plan_take(p, donor, max, &first_, &count_)); \
    ck_assert_uint_eq(first_, want_first);                         \
    ck_assert_uint_eq(count_, want_count);                         \
    ck_assert(st_sync_plan_busy(p, donor));                        \
  } while (0)

static bool take_any(st_sync_plan_t* p, unsigned donor, uint64_t max) {
  uint64_t first, count;
  return st_sync_plan_take(p, donor, max, &first, &count);
}

/* ==== Wire: helpers ========================================================
 */

static uint8_t rand_hashes[4 * ST_SYNC_HASH_BYTES];

static void rand_req(st_msg_t* m, uint8_t kind) {
  memset(m, 0, sizeof *m);
  m->type = ST_MSG_SYNC_REQ;
  st_msg_sync_req_t* q = &m->u.sync_req;
  q->kind = kind;
  tw_rand_bytes(&rng, q->fingerprint, sizeof q->fingerprint);
  q->n_params = st_rng_below(&rng, MAX_PARAMS + 1);
  tw_rand_bytes(&rng, q->anchor, sizeof q->anchor);
  if (kind == ST_SYNC_RANGE) {
    q->first = st_rng_below(&rng, ST_SYNC_MAX_CHUNKS);
    q->count = 1 + st_rng_below(&rng, ST_SYNC_MAX_CHUNKS);
  }
}

/* A reply of `status` whose hashes are hashes[0 .. len). */
static void rand_reply(st_msg_t* m, uint8_t status, const uint8_t* hashes,
                       uint32_t len) {
  memset(m, 0, sizeof *m);
  m->type = ST_MSG_SYNC_REPLY;
  st_msg_sync_reply_t* r = &m->u.sync_reply;
  r->status = status;
  tw_rand_bytes(&rng, r->anchor, sizeof r->anchor);
  r->round = tw_rand_bits(&rng, 64);
  r->step = tw_rand_bits(&rng, 64);
  r->n_params = st_rng_below(&rng, MAX_PARAMS + 1);
  r->hashes = len > 0 ? hashes : NULL;
  r->hashes_len = len;
}

/* A random valid SYNC_REQ or SYNC_REPLY (at most 4 hashes). */
static void rand_sync(st_msg_t* m) {
  if (st_rng_below(&rng, 2) == 0) {
    rand_req(m, (uint8_t) (1 + st_rng_below(&rng, 2)));
    return;
  }
  tw_rand_bytes(&rng, rand_hashes, sizeof rand_hashes);
  rand_reply(m, (uint8_t) st_rng_below(&rng, 5), rand_hashes,
             (uint32_t) (st_rng_below(&rng, 5) * ST_SYNC_HASH_BYTES));
}

/* Writes a SYNC_REQ [37, 1, kind, fingerprint, n_params, anchor, first,
 * count] by hand, with fingerprint and anchor bins of the sizes given. */
typedef struct {
  uint64_t kind, n_params, first, count;
  size_t fp_len, anchor_len;
  int kind_str; /* the kind as a one-byte str */
} wreq_t;

static void w_req(w_t* w, const wreq_t* q) {
  static const uint8_t b[64] = {9, 8, 7};
  w->n = 0;
  w_byte(w, 0x98), w_uint(w, ST_MSG_SYNC_REQ), w_uint(w, ST_WIRE_VERSION);
  if (q->kind_str)
    w_str(w, "\x01", 1);
  else
    w_uint(w, q->kind);
  w_bin(w, b, q->fp_len), w_uint(w, q->n_params);
  w_bin(w, b, q->anchor_len), w_uint(w, q->first), w_uint(w, q->count);
}

/* Writes a SYNC_REPLY [38, 1, status, anchor, round 3, step 4, n_params,
 * hashes] by hand, the hashes a bin (or a str) of hashes_len 0xab bytes. */
typedef struct {
  uint64_t status, n_params;
  size_t anchor_len, hashes_len;
  int hashes_str;
} wreply_t;

static void w_reply(w_t* w, const wreply_t* r) {
  static const uint8_t b[64] = {5, 4, 3};
  w->n = 0;
  w_byte(w, 0x98), w_uint(w, ST_MSG_SYNC_REPLY), w_uint(w, ST_WIRE_VERSION);
  w_uint(w, r->status), w_bin(w, b, r->anchor_len), w_uint(w, 3);
  w_uint(w, 4), w_uint(w, r->n_params);
  if (r->hashes_str)
    w_str(w, NULL, r->hashes_len);
  else
    w_bin(w, NULL, r->hashes_len);
}

/* ==== Wire: round trips ====================================================
 */

START_TEST(test_req_round_trip) {
  uint8_t buf[BUF_CAP];
  st_msg_t m, d;
  for (int it = 0; it < 300; it++) {
    rand_req(&m, ST_SYNC_MANIFEST);
    tw_round_trip(&m, buf, sizeof buf, &d);
    ck_assert_uint_eq(d.u.sync_req.first, 0);
    ck_assert_uint_eq(d.u.sync_req.count, 0);
    rand_req(&m, ST_SYNC_RANGE);
    tw_round_trip(&m, buf, sizeof buf, &d);
  }
  /* Every width of count and the bounds of each field. */
  static const uint64_t counts[] = {1,
                                    2,
                                    127,
                                    128,
                                    255,
                                    256,
                                    4097,
                                    ST_SYNC_MAX_CHUNKS - 1,
                                    ST_SYNC_MAX_CHUNKS};
  for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
    rand_req(&m, ST_SYNC_RANGE);
    m.u.sync_req.count = counts[i];
    m.u.sync_req.first = i % 2 == 0 ? 0 : ST_SYNC_MAX_CHUNKS - 1;
    m.u.sync_req.n_params = i % 2 == 0 ? MAX_PARAMS : 0;
    tw_round_trip(&m, buf, sizeof buf, &d);
    ck_assert_uint_eq(d.u.sync_req.kind, ST_SYNC_RANGE);
    ck_assert_uint_eq(d.u.sync_req.count, counts[i]);
    ck_assert_uint_eq(d.u.sync_req.first, m.u.sync_req.first);
    ck_assert_uint_eq(d.u.sync_req.n_params, m.u.sync_req.n_params);
    ck_assert_mem_eq(d.u.sync_req.anchor, m.u.sync_req.anchor, 16);
    ck_assert_mem_eq(d.u.sync_req.fingerprint, m.u.sync_req.fingerprint, 16);
  }
}
END_TEST

/* Every status, with no hashes and with k of them; the hashes are
 * borrowed from the end of the input. */
START_TEST(test_reply_round_trip) {
  size_t cap = ST_WIRE_MAX_MESSAGE_BYTES + 1;
  uint8_t* buf = malloc(cap);
  uint8_t* hashes = malloc(ST_WIRE_CHUNK_MAX_BYTES);
  ck_assert(buf != NULL && hashes != NULL);
  tw_rand_bytes(&rng, hashes, ST_WIRE_CHUNK_MAX_BYTES);
  static const uint32_t ks[] = {0, 1,    2,    4,    7,
                                8, 2047, 2048, 2049, ST_SYNC_MAX_CHUNKS};
  st_msg_t m, d;
  for (uint8_t status = 0; status <= ST_SYNC_STATUS_GONE; status++) {
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
      uint32_t len = ks[i] * ST_SYNC_HASH_BYTES;
      rand_reply(&m, status, hashes, len);
      size_t n = tw_round_trip(&m, buf, cap, &d);
      const st_msg_sync_reply_t *x = &m.u.sync_reply, *y = &d.u.sync_reply;
      ck_assert_uint_eq(y->status, status);
      ck_assert_mem_eq(y->anchor, x->anchor, sizeof x->anchor);
      ck_assert_uint_eq(y->round, x->round);
      ck_assert_uint_eq(y->step, x->step);
      ck_assert_uint_eq(y->n_params, x->n_params);
      ck_assert_uint_eq(y->hashes_len, len);
      if (len == 0) {
        ck_assert_ptr_null(y->hashes);
      } else {
        ck_assert_ptr_eq(y->hashes, buf + n - len);
        ck_assert_mem_eq(y->hashes, hashes, len);
      }
    }
  }
  free(hashes);
  free(buf);
}
END_TEST

/* The bytes, by hand: a MANIFEST request and an OK reply of one hash. */
START_TEST(test_known_answer) {
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_SYNC_REQ;
  m.u.sync_req.kind = ST_SYNC_MANIFEST;
  memset(m.u.sync_req.fingerprint, 0xee, 16);
  m.u.sync_req.n_params = 300;
  uint8_t buf[BUF_CAP];
  size_t len = 0;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  /* [37, 1, 1, bin16 0xee.., 300, bin16 0.., 0, 0] */
  uint8_t want[64] = {0x98, 37, 1, 1, 0xc4, 16};
  memset(want + 6, 0xee, 16);
  const uint8_t mid[] = {0xcd, 0x01, 0x2c, 0xc4, 16};
  memcpy(want + 22, mid, sizeof mid); /* then 16 zeros of anchor */
  ck_assert_uint_eq(len, 22 + sizeof mid + 16 + 2);
  ck_assert_mem_eq(buf, want, len);

  /* [38, 1, 0, bin16 0x11.., 5, 1000, 262145, bin8 32 0..31] */
  uint8_t hash[32];
  for (int i = 0; i < 32; i++)
    hash[i] = (uint8_t) i;
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_SYNC_REPLY;
  memset(m.u.sync_reply.anchor, 0x11, 16);
  m.u.sync_reply.round = 5;
  m.u.sync_reply.step = 1000;
  m.u.sync_reply.n_params = 262145;
  m.u.sync_reply.hashes = hash;
  m.u.sync_reply.hashes_len = 32;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  uint8_t want2[80] = {0x98, 38, 1, 0, 0xc4, 16};
  memset(want2 + 6, 0x11, 16);
  const uint8_t mid2[] = {5,    0xcd, 0x03, 0xe8, 0xce, 0x00,
                          0x04, 0x00, 0x01, 0xc4, 32};
  memcpy(want2 + 22, mid2, sizeof mid2);
  memcpy(want2 + 22 + sizeof mid2, hash, 32);
  ck_assert_uint_eq(len, 22 + sizeof mid2 + 32);
  ck_assert_mem_eq(buf, want2, len);
}
END_TEST

/* ==== Wire: the encoder's refusals =========================================
 */

START_TEST(test_encode_refuses_req) {
  const struct {
    uint8_t kind;
    uint64_t n_params, first, count;
  } bad[] = {
      {0, 10, 0, 0},
      {3, 10, 0, 0},
      {255, 10, 0, 1},
      {ST_SYNC_MANIFEST, 10, 1, 0},
      {ST_SYNC_MANIFEST, 10, 0, 1},
      {ST_SYNC_MANIFEST, MAX_PARAMS + 1, 0, 0},
      {ST_SYNC_RANGE, 10, 0, 0},
      {ST_SYNC_RANGE, 10, 0, ST_SYNC_MAX_CHUNKS + 1},
      {ST_SYNC_RANGE, 10, 0, UINT64_MAX},
      {ST_SYNC_RANGE, 10, ST_SYNC_MAX_CHUNKS, 1},
      {ST_SYNC_RANGE, MAX_PARAMS + 1, 0, 1},
      {ST_SYNC_RANGE, UINT64_MAX, 0, 1},
  };
  uint8_t buf[BUF_CAP];
  size_t len = 12345;
  st_msg_t m;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    rand_req(&m, ST_SYNC_RANGE);
    m.u.sync_req.kind = bad[i].kind;
    m.u.sync_req.n_params = bad[i].n_params;
    m.u.sync_req.first = bad[i].first;
    m.u.sync_req.count = bad[i].count;
    ck_assert_msg(st_wire_encode(&m, buf, sizeof buf, &len) == -EINVAL,
                  "bad request %zu encoded", i);
  }
  ck_assert_uint_eq(len, 12345); /* untouched on failure */
  /* Too small a buffer, at every size short of the message. */
  rand_req(&m, ST_SYNC_RANGE);
  size_t full = 0;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &full), 0);
  for (size_t cap = 0; cap < full; cap++)
    ck_assert_int_eq(st_wire_encode(&m, buf, cap, &len), -EMSGSIZE);
}
END_TEST

START_TEST(test_encode_refuses_reply) {
  size_t cap = ST_WIRE_MAX_MESSAGE_BYTES + 64;
  uint8_t* buf = malloc(cap);
  uint8_t* hashes = calloc(1, ST_WIRE_CHUNK_MAX_BYTES + 64);
  ck_assert(buf != NULL && hashes != NULL);
  const struct {
    uint8_t status;
    uint64_t n_params;
    uint32_t len;
    int null;
  } bad[] = {
      {5, 10, 0, 0},
      {255, 10, 32, 0},
      {0, 10, 1, 0},
      {0, 10, 31, 0},
      {0, 10, 33, 0},
      {0, 10, 65, 0},
      {0, 10, ST_WIRE_CHUNK_MAX_BYTES + 32, 0},
      {0, MAX_PARAMS + 1, 32, 0},
      {0, UINT64_MAX, 0, 0},
      {0, 10, 32, 1},
  };
  size_t len = 12345;
  st_msg_t m;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    rand_reply(&m, bad[i].status, hashes, bad[i].len);
    m.u.sync_reply.n_params = bad[i].n_params;
    if (bad[i].null)
      m.u.sync_reply.hashes = NULL;
    ck_assert_msg(st_wire_encode(&m, buf, cap, &len) == -EINVAL,
                  "bad reply %zu encoded", i);
  }
  ck_assert_uint_eq(len, 12345);
  /* The largest manifest encodes, within the largest message. */
  rand_reply(&m, ST_SYNC_STATUS_OK, hashes, ST_WIRE_CHUNK_MAX_BYTES);
  ck_assert_int_eq(st_wire_encode(&m, buf, cap, &len), 0);
  ck_assert_uint_le(len, ST_WIRE_MAX_MESSAGE_BYTES);
  rand_reply(&m, ST_SYNC_STATUS_OK, hashes, 64);
  size_t full = 0;
  ck_assert_int_eq(st_wire_encode(&m, buf, cap, &full), 0);
  for (size_t c = 0; c < full; c++)
    ck_assert_int_eq(st_wire_encode(&m, buf, c, &len), -EMSGSIZE);
  free(hashes);
  free(buf);
}
END_TEST

/* ==== Wire: the decoder's rejections =======================================
 */

START_TEST(test_reject_req) {
  const uint64_t M = ST_SYNC_MANIFEST, R = ST_SYNC_RANGE;
  const uint64_t MAXC = ST_SYNC_MAX_CHUNKS;
  const st_wire_drop_t F = ST_WIRE_DROP_FIELD, L = ST_WIRE_DROP_LIMIT;
  const struct {
    wreq_t q;
    int ok; /* 1: decodes; else refused with why */
    st_wire_drop_t why;
  } cases[] = {
      {{M, 10, 0, 0, 16, 16, 0}, 1, 0},
      {{R, MAX_PARAMS, MAXC - 1, MAXC, 16, 16, 0}, 1, 0},
      {{R, 0, 0, 1, 16, 16, 0}, 1, 0},
      {{0, 10, 0, 0, 16, 16, 0}, 0, F},
      {{3, 10, 0, 0, 16, 16, 0}, 0, F},
      {{3, 10, 0, 1, 16, 16, 0}, 0, F},
      {{255, 10, 0, 1, 16, 16, 0}, 0, F},
      {{256 + M, 10, 0, 0, 16, 16, 0}, 0, F},
      {{M, 10, 1, 0, 16, 16, 0}, 0, F},
      {{M, 10, 0, 1, 16, 16, 0}, 0, F},
      {{M, 10, 5, 5, 16, 16, 0}, 0, F},
      {{R, 10, 0, 0, 16, 16, 0}, 0, F},
      {{R, 10, MAXC, 1, 16, 16, 0}, 0, F},
      {{R, 10, 0, MAXC + 1, 16, 16, 0}, 0, L},
      {{R, 10, 0, UINT64_MAX, 16, 16, 0}, 0, L},
      {{M, 10, 0, MAXC + 1, 16, 16, 0}, 0, L},
      {{M, MAX_PARAMS + 1, 0, 0, 16, 16, 0}, 0, L},
      {{R, MAX_PARAMS + 1, 0, 1, 16, 16, 0}, 0, L},
      {{R, UINT64_MAX, 0, 1, 16, 16, 0}, 0, L},
      {{M, 10, 0, 0, 15, 16, 0}, 0, F},
      {{M, 10, 0, 0, 17, 16, 0}, 0, F},
      {{M, 10, 0, 0, 16, 0, 0}, 0, F},
      {{M, 10, 0, 0, 16, 32, 0}, 0, F},
      {{M, 10, 0, 0, 16, 16, 1}, 0, F},
  };
  w_t* w = w_new(BUF_CAP);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    w_req(w, &cases[i].q);
    if (!cases[i].ok) {
      tw_expect_drop(w->b, w->n, -EBADMSG, cases[i].why, "sync req");
      continue;
    }
    st_msg_t d;
    ck_assert_int_eq(st_wire_decode(w->b, w->n, &d, NULL), 0);
    ck_assert_uint_eq(d.u.sync_req.kind, cases[i].q.kind);
    ck_assert_uint_eq(d.u.sync_req.n_params, cases[i].q.n_params);
    ck_assert_uint_eq(d.u.sync_req.first, cases[i].q.first);
    ck_assert_uint_eq(d.u.sync_req.count, cases[i].q.count);
  }
  /* A negative count. */
  w_req(w, &cases[2].q);
  w->b[w->n - 1] = 0xff; /* count: -1 */
  tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "negative count");
  w_free(w);
}
END_TEST

START_TEST(test_reject_reply) {
  const st_wire_drop_t F = ST_WIRE_DROP_FIELD, L = ST_WIRE_DROP_LIMIT;
  const size_t H = ST_SYNC_HASH_BYTES, CMAX = ST_WIRE_CHUNK_MAX_BYTES;
  const struct {
    wreply_t r;
    int ok;
    st_wire_drop_t why;
  } cases[] = {
      {{0, 10, 16, 0, 0}, 1, 0},
      {{4, 10, 16, H, 0}, 1, 0},
      {{0, MAX_PARAMS, 16, CMAX, 0}, 1, 0},
      {{5, 10, 16, 0, 0}, 0, F},
      {{255, 10, 16, H, 0}, 0, F},
      {{256, 10, 16, 0, 0}, 0, F},
      {{0, 10, 16, 1, 0}, 0, F},
      {{0, 10, 16, H - 1, 0}, 0, F},
      {{0, 10, 16, H + 1, 0}, 0, F},
      {{0, 10, 16, 3 * H + 16, 0}, 0, F},
      {{0, 10, 16, CMAX - 1, 0}, 0, F},
      {{0, 10, 16, CMAX + H, 0}, 0, L},
      {{0, MAX_PARAMS + 1, 16, 0, 0}, 0, L},
      {{0, UINT64_MAX, 16, H, 0}, 0, L},
      {{0, 10, 16, 0, 1}, 0, F},
      {{0, 10, 16, H, 1}, 0, F},
      {{0, 10, 15, H, 0}, 0, F},
      {{0, 10, 17, H, 0}, 0, F},
  };
  w_t* w = w_new(ST_WIRE_MAX_MESSAGE_BYTES + 256);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    w_reply(w, &cases[i].r);
    if (!cases[i].ok) {
      tw_expect_drop(w->b, w->n, -EBADMSG, cases[i].why, "sync reply");
      continue;
    }
    st_msg_t d;
    ck_assert_int_eq(st_wire_decode(w->b, w->n, &d, NULL), 0);
    ck_assert_uint_eq(d.u.sync_reply.status, cases[i].r.status);
    ck_assert_uint_eq(d.u.sync_reply.n_params, cases[i].r.n_params);
    ck_assert_uint_eq(d.u.sync_reply.round, 3);
    ck_assert_uint_eq(d.u.sync_reply.step, 4);
    ck_assert_uint_eq(d.u.sync_reply.hashes_len, cases[i].r.hashes_len);
    if (cases[i].r.hashes_len > 0)
      ck_assert_ptr_eq(d.u.sync_reply.hashes,
                       w->b + w->n - cases[i].r.hashes_len);
  }
  w_free(w);
}
END_TEST

START_TEST(test_reject_truncated) {
  uint8_t buf[BUF_CAP];
  for (int it = 0; it < 20; it++) {
    st_msg_t m;
    rand_sync(&m);
    size_t len = 0;
    ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf - 1, &len), 0);
    tw_expect_truncations(buf, len);
  }
}
END_TEST

/* 0 to 8 fields instead of 6, each a small unsigned integer. */
START_TEST(test_reject_field_count) {
  st_msg_type_t t = _i == 0 ? ST_MSG_SYNC_REQ : ST_MSG_SYNC_REPLY;
  w_t* w = w_new(BUF_CAP);
  for (int n = 0; n <= 8; n++) {
    if (n == 6)
      continue;
    w->n = 0;
    w_byte(w, (uint8_t) (0x90 | (2 + n)));
    w_uint(w, t), w_uint(w, ST_WIRE_VERSION);
    for (int f = 0; f < n; f++)
      w_uint(w, 1);
    tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "field count");
  }
  w_free(w);
}
END_TEST

/* Random byte flips: refused with exactly one drop, or decoded into a
 * message that re-encodes to the same. */
START_TEST(test_mutations) {
  for (int it = 0; it < 20000; it++) {
    st_msg_t m, d, d2;
    rand_sync(&m);
    uint8_t buf[BUF_CAP], again[BUF_CAP];
    size_t len = 0, n2 = 0;
    ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
    if (!tw_mutate_decode(&rng, buf, len, &d))
      continue;
    ck_assert_int_eq(st_wire_encode(&d, again, sizeof again, &n2), 0);
    ck_assert_int_eq(st_wire_decode(again, n2, &d2, NULL), 0);
    if (d.type == ST_MSG_SYNC_REQ || d.type == ST_MSG_SYNC_REPLY)
      ck_assert(msg_same(&d, &d2));
    st_wire_msg_free(&d);
    st_wire_msg_free(&d2);
  }
}
END_TEST

START_TEST(test_fuzz_corpus) {
  st_msg_t m;
  st_rng_seed(&rng, 20250301);
  rand_req(&m, ST_SYNC_RANGE);
  m.u.sync_req.n_params = 235146;
  m.u.sync_req.first = 0;
  m.u.sync_req.count = 1;
  tw_fuzz_seed(&m, "sync_req");
  static const uint8_t hashes[2 * ST_SYNC_HASH_BYTES] = {0x5e, 0x17};
  rand_reply(&m, ST_SYNC_STATUS_OK, hashes, sizeof hashes);
  m.u.sync_reply.n_params = CF + 1;
  tw_fuzz_seed(&m, "sync_reply");
}
END_TEST

/* ==== Plan: limits and manifests ===========================================
 */

START_TEST(test_chunks_and_limits) {
  ck_assert_uint_eq(st_sync_chunks(0), 0);
  ck_assert_uint_eq(st_sync_chunks(1), 1);
  ck_assert_uint_eq(st_sync_chunks(CF - 1), 1);
  ck_assert_uint_eq(st_sync_chunks(CF), 1);
  ck_assert_uint_eq(st_sync_chunks(CF + 1), 2);
  ck_assert_uint_eq(st_sync_chunks(N_FLOATS), 4);
  ck_assert_uint_eq(st_sync_chunks(CF * ST_SYNC_MAX_CHUNKS),
                    ST_SYNC_MAX_CHUNKS);
  ck_assert_uint_eq(st_sync_chunks(CF * ST_SYNC_MAX_CHUNKS + 1),
                    ST_SYNC_MAX_CHUNKS + 1);
  /* Not NULL, so that a refusal is seen to clear it. */
  st_sync_plan_t* p = (st_sync_plan_t*) &p;
  ck_assert_int_eq(st_sync_plan_new(0, &p), -EINVAL);
  ck_assert_ptr_null(p);
  ck_assert_int_eq(st_sync_plan_new(CF * ST_SYNC_MAX_CHUNKS + 1, &p), -EINVAL);
  ck_assert_ptr_null(p);
  ck_assert_int_eq(st_sync_plan_new(MAX_PARAMS, &p), -EINVAL);
  ck_assert_ptr_null(p);
  ck_assert_int_eq(st_sync_plan_new(CF * ST_SYNC_MAX_CHUNKS, &p), 0);
  ck_assert_ptr_nonnull(p);
  ck_assert(!st_sync_plan_complete(p));
  st_sync_plan_free(p);
  st_sync_plan_free(NULL);
  /* A fresh plan: nothing agreed, verified, usable or takeable. */
  ck_assert_int_eq(st_sync_plan_new(1, &p), 0);
  ck_assert(!st_sync_plan_complete(p));
  ck_assert_uint_eq(st_sync_plan_verified(p), 0);
  ck_assert_uint_eq(st_sync_plan_usable_count(p), 0);
  ck_assert(!st_sync_plan_usable(p, 0));
  ck_assert(!take_any(p, 0, 1));
  ck_assert(!st_sync_plan_busy(p, 0));
  ck_assert_uint_eq(st_sync_plan_agree(p, 2), 0);
  st_sync_plan_free(p);
}
END_TEST

/* Each unusable manifest is refused and not kept: two donors that sent
 * only such manifests do not agree. */
START_TEST(test_manifest_refused) {
  st_sync_plan_t* p;
  ck_assert_int_eq(st_sync_plan_new(S.n, &p), 0);
  st_msg_sync_reply_t r;
  for (int bad = 0; bad < 11; bad++) {
    manifest(&r, 50);
    if (bad < 4)
      r.status = (uint8_t) (1 + bad); /* BUSY .. GONE */
    else if (bad == 4)
      r.n_params = S.n + 1;
    else if (bad == 5)
      r.n_params = S.n - 1;
    else if (bad == 6)
      r.hashes_len -= ST_SYNC_HASH_BYTES;
    else if (bad == 7)
      r.hashes_len += ST_SYNC_HASH_BYTES;
    else if (bad == 8)
      r.hashes_len = 0, r.hashes = NULL;
    else if (bad == 9)
      r.hashes = NULL;
    else
      memset(r.anchor, 0, sizeof r.anchor);
    ck_assert_msg(st_sync_plan_manifest(p, 0, &r) == -EINVAL, "bad %d", bad);
    ck_assert_msg(st_sync_plan_manifest(p, 1, &r) == -EINVAL, "bad %d", bad);
  }
  manifest(&r, 50);
  ck_assert_int_eq(st_sync_plan_manifest(p, ST_SYNC_MAX_DONORS, &r), -EINVAL);
  ck_assert_int_eq(st_sync_plan_manifest(p, UINT32_MAX, &r), -EINVAL);
  ck_assert_uint_eq(st_sync_plan_agree(p, 2), 0);
  ck_assert_uint_eq(st_sync_plan_usable_count(p), 0);
  /* Valid ones now, at the last donor index too. */
  ck_assert_int_eq(st_sync_plan_manifest(p, 0, &r), 0);
  ck_assert_int_eq(st_sync_plan_manifest(p, ST_SYNC_MAX_DONORS - 1, &r), 0);
  ck_assert_uint_eq(st_sync_plan_agree(p, 2), 2);
  ck_assert(st_sync_plan_usable(p, ST_SYNC_MAX_DONORS - 1));
  ck_assert(!st_sync_plan_usable(p, ST_SYNC_MAX_DONORS));
  st_sync_plan_free(p);
}
END_TEST

/* ==== Plan: agreement ======================================================
 */

START_TEST(test_agree_two) {
  st_sync_plan_t* p;
  ck_assert_int_eq(st_sync_plan_new(S.n, &p), 0);
  st_msg_sync_reply_t r;
  manifest(&r, 90);
  ck_assert_int_eq(st_sync_plan_manifest(p, 3, &r), 0);
  /* One donor alone cannot make a state up, whatever min_agree says. */
  ck_assert_uint_eq(st_sync_plan_agree(p, 2), 0);
  ck_assert_uint_eq(st_sync_plan_agree(p, 1), 0);
  ck_assert_uint_eq(st_sync_plan_agree(p, 0), 0);
  ck_assert(!st_sync_plan_usable(p, 3));
  ck_assert(!take_any(p, 3, 4));
  /* A donor's later manifest replaces its earlier one. */
  manifest(&r, 40);
  r.hashes = S.odd;
  ck_assert_int_eq(st_sync_plan_manifest(p, 5, &r), 0);
  ck_assert_uint_eq(st_sync_plan_agree(p, 2), 0);
  manifest(&r, 60);
  ck_assert_int_eq(st_sync_plan_manifest(p, 5, &r), 0);
  ck_assert_uint_eq(st_sync_plan_agree(p, 3), 0);
  ck_assert_uint_eq(st_sync_plan_agree(p, 2), 2);
  /* Agreed: manifests are refused, and it stays agreed. */
  ck_assert_int_eq(st_sync_plan_manifest(p, 0, &r), -EBUSY);
  ck_assert_int_eq(st_sync_plan_manifest(p, 3, &r), -EBUSY);
  ck_assert_uint_eq(st_sync_plan_agree(p, 2), 2);
  ck_assert(!st_sync_plan_usable(p, 0));
  ck_assert(st_sync_plan_usable(p, 3) && st_sync_plan_usable(p, 5));
  uint8_t id[ST_XCHG_ANCHOR_BYTES];
  uint64_t round = 0, step = 0;
  st_sync_plan_agreed(p, id, &round, &step);
  ck_assert_mem_eq(id, S.id, sizeof id);
  ck_assert_uint_eq(round, ROUND);
  ck_assert_uint_eq(step, 60); /* the smaller of 90 and 60 */
  st_sync_plan_free(p);
}
END_TEST

/* Three donors, one of which differs from the others in one hash bit, in
 * the round, or in the id: the other two agree; it is not usable. */
START_TEST(test_agree_odd_one) {
  for (int how = 0; how < 3; how++) {
    st_sync_plan_t* p;
    ck_assert_int_eq(st_sync_plan_new(S.n, &p), 0);
    unsigned odd = (unsigned) st_rng_below(&rng, 3);
    for (unsigned d = 0; d < 3; d++) {
      st_msg_sync_reply_t r;
      manifest(&r, 10 + d);
      if (d == odd && how == 0)
        r.hashes = S.odd;
      else if (d == odd && how == 1)
        r.round = ROUND + 1;
      else if (d == odd)
        r.anchor[15] ^= 0x80;
      ck_assert_int_eq(st_sync_plan_manifest(p, d, &r), 0);
    }
    ck_assert_uint_eq(st_sync_plan_agree(p, 2), 2);
    ck_assert_uint_eq(st_sync_plan_usable_count(p), 2);
    for (unsigned d = 0; d < 3; d++)
      ck_assert(st_sync_plan_usable(p, d) == (d != odd));
    ck_assert(!take_any(p, odd, 4));
    uint8_t id[ST_XCHG_ANCHOR_BYTES];
    uint64_t round, step;
    st_sync_plan_agreed(p, id, &round, &step);
    ck_assert_mem_eq(id, S.id, sizeof id);
    ck_assert_uint_eq(round, ROUND);
    ck_assert_uint_eq(step, odd == 0 ? 11 : 10);
    st_sync_plan_free(p);
  }
}
END_TEST

/* Donors 0 .. 5 send manifest A (the state) or B (another id and one hash
 * off) at the steps given (0: no manifest); checks the winner. */
static void agree_case(const char* which, const uint64_t steps[6],
                       unsigned want_n, char want, uint64_t want_step) {
  st_sync_plan_t* p;
  ck_assert_int_eq(st_sync_plan_new(S.n, &p), 0);
  for (unsigned d = 0; d < 6; d++) {
    if (steps[d] == 0)
      continue;
    st_msg_sync_reply_t r;
    manifest(&r, steps[d]);
    if (which[d] == 'B') {
      r.anchor[0] ^= 0x40;
      r.hashes = S.odd;
    }
    ck_assert_int_eq(st_sync_plan_manifest(p, d, &r), 0);
  }
  ck_assert_uint_eq(st_sync_plan_agree(p, 2), want_n);
  for (unsigned d = 0; d < 6; d++)
    ck_assert_msg(st_sync_plan_usable(p, d) == (steps[d] && which[d] == want),
                  "donor %u", d);
  uint8_t id[ST_XCHG_ANCHOR_BYTES];
  uint64_t round, step;
  st_sync_plan_agreed(p, id, &round, &step);
  ck_assert_uint_eq(id[0], (uint8_t) (S.id[0] ^ (want == 'B' ? 0x40 : 0)));
  ck_assert_uint_eq(step, want_step);
  st_sync_plan_free(p);
}

START_TEST(test_agree_ties) {
  /* Two pairs: B's smallest step (20) beats A's (10), wherever B is. */
  agree_case("AABB..", (const uint64_t[6]){10, 50, 20, 30, 0, 0}, 2, 'B', 20);
  agree_case("BBAA..", (const uint64_t[6]){30, 20, 50, 10, 0, 0}, 2, 'B', 20);
  agree_case("ABAB..", (const uint64_t[6]){10, 30, 90, 20, 0, 0}, 2, 'B', 20);
  /* Equal smallest steps: the smaller donor index. */
  agree_case("BABA..", (const uint64_t[6]){7, 7, 9, 8, 0, 0}, 2, 'B', 7);
  agree_case("ABAB..", (const uint64_t[6]){7, 7, 9, 8, 0, 0}, 2, 'A', 7);
  /* More donors beat a larger step. */
  agree_case("AAABB.", (const uint64_t[6]){1, 2, 3, 90, 99, 0}, 3, 'A', 1);
  agree_case("BBAAAB", (const uint64_t[6]){90, 99, 5, 3, 4, 0}, 3, 'A', 3);
  /* Two pairs do not reach min_agree 3. */
  st_sync_plan_t* p;
  ck_assert_int_eq(st_sync_plan_new(S.n, &p), 0);
  for (unsigned d = 0; d < 4; d++) {
    st_msg_sync_reply_t r;
    manifest(&r, 5);
    if (d >= 2)
      r.hashes = S.odd;
    ck_assert_int_eq(st_sync_plan_manifest(p, d, &r), 0);
  }
  ck_assert_uint_eq(st_sync_plan_agree(p, 3), 0);
  ck_assert_uint_eq(st_sync_plan_usable_count(p), 0);
  ck_assert_uint_eq(st_sync_plan_agree(p, 2), 2);
  st_sync_plan_free(p);
}
END_TEST

/* ==== Plan: fetching =======================================================
 */

/* Three donors take [0, 1), [1, 3) and [3, 4) and deliver them
 * interleaved: every chunk OK, and the floats are the state's. */
START_TEST(test_fetch_three) {
  st_sync_plan_t* p = plan_agreed(3);
  expect_take(p, 0, 1, 0, 1);
  expect_take(p, 1, 2, 1, 2);
  expect_take(p, 2, 100, 3, 1);
  ck_assert(!take_any(p, 3, 100));                   /* not a donor */
  ck_assert_int_eq(feed(p, 2, 3), ST_SYNC_CHUNK_OK); /* the short one */
  ck_assert_int_eq(feed(p, 1, 1), ST_SYNC_CHUNK_OK);
  ck_assert_uint_eq(st_sync_plan_verified(p), 2);
  ck_assert(!st_sync_plan_complete(p));
  ck_assert_int_eq(feed(p, 0, 0), ST_SYNC_CHUNK_OK);
  ck_assert(!st_sync_plan_complete(p));
  ck_assert_int_eq(feed(p, 1, 2), ST_SYNC_CHUNK_OK);
  ck_assert_uint_eq(st_sync_plan_verified(p), 4);
  ck_assert(st_sync_plan_complete(p));
  ck_assert_mem_eq(S.out, S.x, S.n * sizeof(float));
  /* A delivered range stays out until it is ended. */
  for (unsigned d = 0; d < 3; d++) {
    ck_assert(st_sync_plan_busy(p, d));
    st_sync_plan_end(p, d, false);
    ck_assert(!st_sync_plan_busy(p, d));
    ck_assert(st_sync_plan_usable(p, d));
    ck_assert(!take_any(p, d, 100)); /* nothing left */
  }
  ck_assert_uint_eq(st_sync_plan_verified(p), 4);
  st_sync_plan_free(p);
}
END_TEST

/* Max 2, then the rest; after a range ends the donor takes again. */
START_TEST(test_fetch_ranges) {
  st_sync_plan_t* p = plan_agreed(3);
  expect_take(p, 2, 2, 0, 2);
  expect_take(p, 0, 2, 2, 2);
  ck_assert(!take_any(p, 1, 2)); /* the pool is empty */
  ck_assert_int_eq(feed(p, 2, 0), ST_SYNC_CHUNK_OK);
  ck_assert_int_eq(feed(p, 2, 1), ST_SYNC_CHUNK_OK);
  st_sync_plan_end(p, 2, false);
  ck_assert(!take_any(p, 2, 2)); /* 2 and 3 are still out with donor 0 */
  ck_assert_int_eq(feed(p, 0, 2), ST_SYNC_CHUNK_OK);
  st_sync_plan_end(p, 0, false); /* closed before chunk 3 */
  ck_assert(st_sync_plan_usable(p, 0));
  expect_take(p, 1, 5, 3, 1);
  ck_assert_int_eq(feed(p, 1, 3), ST_SYNC_CHUNK_OK);
  ck_assert(st_sync_plan_complete(p));
  ck_assert_mem_eq(S.out, S.x, S.n * sizeof(float));
  st_sync_plan_free(p);
}
END_TEST

/* A corrupted chunk: BAD, the donor dropped, its undelivered chunks back
 * in the pool for another; the chunk it verified before stays. */
START_TEST(test_bad_chunk) {
  st_sync_plan_t* p = plan_agreed(3);
  expect_take(p, 0, 3, 0, 3);
  ck_assert_int_eq(feed(p, 0, 0), ST_SYNC_CHUNK_OK);
  ck_assert_int_eq(feed_flipped(p, 0, 1), ST_SYNC_CHUNK_BAD);
  ck_assert(!st_sync_plan_usable(p, 0));
  ck_assert(!st_sync_plan_busy(p, 0));
  ck_assert_uint_eq(st_sync_plan_usable_count(p), 2);
  ck_assert_uint_eq(st_sync_plan_verified(p), 1);
  ck_assert(!take_any(p, 0, 3));
  /* The next chunk from it, even a good one, is refused. */
  ck_assert_int_eq(feed(p, 0, 1), ST_SYNC_CHUNK_ORDER);
  expect_take(p, 1, 10, 1, 3);
  ck_assert_int_eq(feed(p, 1, 1), ST_SYNC_CHUNK_OK);
  /* The right length and offset, another chunk's bytes: BAD as well. */
  uint64_t got;
  ck_assert_int_eq(
      st_sync_plan_chunk(p, 1, 2 * CF, chunk_ptr(0), chunk_len(2), &got),
      ST_SYNC_CHUNK_BAD);
  ck_assert(!st_sync_plan_usable(p, 1));
  ck_assert_uint_eq(st_sync_plan_verified(p), 2);
  expect_take(p, 2, 10, 2, 2);
  ck_assert_int_eq(feed(p, 2, 2), ST_SYNC_CHUNK_OK);
  ck_assert_int_eq(feed_flipped(p, 2, 3), ST_SYNC_CHUNK_BAD); /* short */
  ck_assert_uint_eq(st_sync_plan_usable_count(p), 0);
  ck_assert_uint_eq(st_sync_plan_verified(p), 3);
  ck_assert(!st_sync_plan_complete(p));
  st_sync_plan_free(p);
}
END_TEST

/* A range that ends early: dropped or not, its rest goes back. */
START_TEST(test_end_early) {
  st_sync_plan_t* p = plan_agreed(3);
  expect_take(p, 0, 3, 0, 3);
  ck_assert_int_eq(feed(p, 0, 0), ST_SYNC_CHUNK_OK);
  st_sync_plan_end(p, 0, true); /* died */
  ck_assert(!st_sync_plan_busy(p, 0));
  ck_assert(!st_sync_plan_usable(p, 0));
  ck_assert(!take_any(p, 0, 3));
  ck_assert_uint_eq(st_sync_plan_verified(p), 1);
  expect_take(p, 1, 10, 1, 3);
  ck_assert_int_eq(feed(p, 1, 1), ST_SYNC_CHUNK_OK);
  st_sync_plan_end(p, 1, false); /* closed, may come back */
  ck_assert(!st_sync_plan_busy(p, 1));
  ck_assert(st_sync_plan_usable(p, 1));
  /* Ending again, with no range out, changes nothing. */
  st_sync_plan_end(p, 1, false);
  st_sync_plan_end(p, ST_SYNC_MAX_DONORS, true);
  ck_assert(st_sync_plan_usable(p, 1));
  ck_assert_uint_eq(st_sync_plan_verified(p), 2);
  expect_take(p, 2, 1, 2, 1);
  expect_take(p, 1, 10, 3, 1);
  ck_assert_int_eq(feed(p, 1, 3), ST_SYNC_CHUNK_OK);
  ck_assert_int_eq(feed(p, 2, 2), ST_SYNC_CHUNK_OK);
  ck_assert(st_sync_plan_complete(p));
  ck_assert_mem_eq(S.out, S.x, S.n * sizeof(float));
  st_sync_plan_free(p);
}
END_TEST

/* The chunk that donor 0, holding [0, 4), sends wrong: case k. */
static st_sync_chunk_t send_wrong(st_sync_plan_t* p, int k) {
  uint64_t got;
  switch (k) {
    case 0: /* offset one float off */
      return st_sync_plan_chunk(p, 0, 1, chunk_ptr(0), chunk_len(0), &got);
    case 1: /* chunk 0's bytes at chunk 1's offset */
      return st_sync_plan_chunk(p, 0, CF, chunk_ptr(0), chunk_len(0), &got);
    case 2: /* chunk 1 first: 0 skipped */
      return feed(p, 0, 1);
    case 3: /* a float short */
      return st_sync_plan_chunk(p, 0, 0, chunk_ptr(0), chunk_len(0) - 4, &got);
    case 4: /* empty */
      return st_sync_plan_chunk(p, 0, 0, chunk_ptr(0), 0, &got);
    default: /* a float long */
      return st_sync_plan_chunk(p, 0, 0, chunk_ptr(0), chunk_len(0) + 4, &got);
  }
}

START_TEST(test_order) {
  for (int k = 0; k < 6; k++) {
    st_sync_plan_t* p = plan_agreed(2);
    expect_take(p, 0, 4, 0, 4);
    ck_assert_msg(send_wrong(p, k) == ST_SYNC_CHUNK_ORDER, "case %d", k);
    ck_assert(!st_sync_plan_usable(p, 0));
    ck_assert(!st_sync_plan_busy(p, 0));
    ck_assert_uint_eq(st_sync_plan_verified(p), 0);
    expect_take(p, 1, 10, 0, 4); /* all four back in the pool */
    st_sync_plan_free(p);
  }
}
END_TEST

/* The short last chunk sent at full length (its floats, then zeros). */
START_TEST(test_order_last_chunk) {
  st_sync_plan_t* p = plan_agreed(2);
  expect_take(p, 0, 4, 0, 4);
  for (uint64_t c = 0; c < 3; c++)
    ck_assert_int_eq(feed(p, 0, c), ST_SYNC_CHUNK_OK);
  memset(S.scratch, 0, CF * sizeof(float));
  memcpy(S.scratch, chunk_ptr(3), chunk_len(3));
  uint64_t got;
  ck_assert_int_eq(
      st_sync_plan_chunk(p, 0, 3 * CF, S.scratch, CF * sizeof(float), &got),
      ST_SYNC_CHUNK_ORDER);
  ck_assert(!st_sync_plan_usable(p, 0));
  ck_assert_uint_eq(st_sync_plan_verified(p), 3);
  expect_take(p, 1, 10, 3, 1);
  ck_assert_int_eq(feed(p, 1, 3), ST_SYNC_CHUNK_OK);
  ck_assert(st_sync_plan_complete(p));
  ck_assert_mem_eq(S.out, S.x, S.n * sizeof(float));
  st_sync_plan_free(p);
}
END_TEST

/* Chunks nobody asked for: from a donor with no range out, past the end
 * of a delivered range, from a donor that does not agree, or from an
 * index that is no donor. */
START_TEST(test_order_unasked) {
  st_sync_plan_t* p = plan_agreed(3);
  st_msg_sync_reply_t r;
  ck_assert_int_eq(feed(p, 0, 0), ST_SYNC_CHUNK_ORDER); /* no range out */
  ck_assert(!st_sync_plan_usable(p, 0));
  ck_assert(!take_any(p, 0, 4));
  expect_take(p, 1, 1, 0, 1);
  ck_assert_int_eq(feed(p, 1, 0), ST_SYNC_CHUNK_OK);
  ck_assert(st_sync_plan_busy(p, 1));
  ck_assert_int_eq(feed(p, 1, 1), ST_SYNC_CHUNK_ORDER); /* past its range */
  ck_assert(!st_sync_plan_usable(p, 1));
  ck_assert(!st_sync_plan_busy(p, 1));
  ck_assert_uint_eq(st_sync_plan_verified(p), 1);       /* chunk 0 stays */
  ck_assert_int_eq(feed(p, 7, 1), ST_SYNC_CHUNK_ORDER); /* no manifest */
  ck_assert_int_eq(feed(p, ST_SYNC_MAX_DONORS, 1), ST_SYNC_CHUNK_ORDER);
  ck_assert_int_eq(feed(p, UINT32_MAX, 1), ST_SYNC_CHUNK_ORDER);
  manifest(&r, 1);
  ck_assert_int_eq(st_sync_plan_manifest(p, 7, &r), -EBUSY);
  ck_assert_uint_eq(st_sync_plan_usable_count(p), 1);
  ck_assert_uint_eq(st_sync_plan_verified(p), 1);
  expect_take(p, 2, 10, 1, 3);
  for (uint64_t c = 1; c < 4; c++)
    ck_assert_int_eq(feed(p, 2, c), ST_SYNC_CHUNK_OK);
  ck_assert(st_sync_plan_complete(p));
  ck_assert_mem_eq(S.out, S.x, S.n * sizeof(float));
  st_sync_plan_free(p);
}
END_TEST

START_TEST(test_take_refuses) {
  st_sync_plan_t* p;
  ck_assert_int_eq(st_sync_plan_new(S.n, &p), 0);
  st_msg_sync_reply_t r;
  for (unsigned d = 0; d < 5; d++) {
    manifest(&r, 3);
    if (d == 4)
      r.hashes = S.odd;
    ck_assert_int_eq(st_sync_plan_manifest(p, d, &r), 0);
    ck_assert(!take_any(p, d, 1)); /* not agreed yet */
  }
  ck_assert_uint_eq(st_sync_plan_agree(p, 2), 4);
  ck_assert(!take_any(p, 4, 1)); /* another manifest */
  ck_assert(!take_any(p, 5, 1)); /* no manifest */
  ck_assert(!take_any(p, ST_SYNC_MAX_DONORS, 1));
  ck_assert(!take_any(p, 0, 0)); /* max_chunks 0 */
  ck_assert(!st_sync_plan_busy(p, 0));
  expect_take(p, 0, 1, 0, 1);
  ck_assert(!take_any(p, 0, 1)); /* a range is out */
  expect_take(p, 1, 1, 1, 1);
  st_sync_plan_end(p, 1, true);
  ck_assert(!st_sync_plan_busy(p, 1));
  ck_assert(!take_any(p, 1, 1)); /* dropped */
  expect_take(p, 2, 100, 1, 3);
  ck_assert(!take_any(p, 3, 1)); /* the pool is empty */
  st_sync_plan_end(p, 0, false);
  expect_take(p, 3, 1, 0, 1); /* chunk 0 back */
  ck_assert(!take_any(p, 0, 1));
  st_sync_plan_free(p);
}
END_TEST

/* ==== Plan: a whole sync ===================================================
 */

/* Donor behaviours in sync_all: 0 dies after one chunk of its first
 * range, 1 corrupts its second chunk, the others are honest. */
typedef struct {
  uint64_t first, count, sent;
  unsigned chunks_sent;
} sim_t;

/* Donor d sends the next chunk of its range, or dies. */
static void sim_step(st_sync_plan_t* p, unsigned d, sim_t* s, int* died,
                     int* corrupted) {
  uint64_t c = s->first + s->sent;
  if (d == 0 && s->chunks_sent == 1) {
    st_sync_plan_end(p, d, true);
    (*died)++;
    return;
  }
  s->chunks_sent++;
  if (d == 1 && s->chunks_sent == 2) {
    ck_assert_int_eq(feed_flipped(p, d, c), ST_SYNC_CHUNK_BAD);
    (*corrupted)++;
    return;
  }
  ck_assert_int_eq(feed(p, d, c), ST_SYNC_CHUNK_OK);
  if (++s->sent == s->count)
    st_sync_plan_end(p, d, false);
}

START_TEST(test_sync_all) {
  state_free();
  state_make(10 * CF + 1 + st_rng_below(&rng, CF - 1));
  const unsigned n = 5;
  st_sync_plan_t* p = plan_agreed(n);
  sim_t sims[5];
  memset(sims, 0, sizeof sims);
  int died = 0, corrupted = 0;
  /* The two bad donors take first, so each holds a range of several. */
  expect_take(p, 0, 3, 0, 3);
  expect_take(p, 1, 3, 3, 3);
  sims[0].count = sims[1].count = 3;
  sims[1].first = 3;
  for (int turn = 0; turn < 100 && !st_sync_plan_complete(p); turn++) {
    for (unsigned d = 0; d < n; d++) {
      sim_t* s = &sims[d];
      if (!st_sync_plan_busy(p, d)) {
        uint64_t max = 1 + st_rng_below(&rng, 3);
        if (!st_sync_plan_take(p, d, max, &s->first, &s->count))
          continue;
        ck_assert_uint_le(s->count, max);
        s->sent = 0;
      }
      sim_step(p, d, s, &died, &corrupted);
    }
  }
  ck_assert(st_sync_plan_complete(p));
  ck_assert_uint_eq(st_sync_plan_verified(p), S.chunks);
  ck_assert_int_eq(died, 1);
  ck_assert_int_eq(corrupted, 1);
  ck_assert_uint_eq(st_sync_plan_usable_count(p), n - 2);
  ck_assert_mem_eq(S.out, S.x, S.n * sizeof(float));
  uint8_t id[ST_XCHG_ANCHOR_BYTES];
  uint64_t round, step;
  st_sync_plan_agreed(p, id, &round, &step);
  ck_assert_mem_eq(id, S.id, sizeof id);
  ck_assert_uint_eq(step, 100);
  st_sync_plan_free(p);
}
END_TEST

static Suite* gossip_sync_suite(void) {
  Suite* s = suite_create("gossip_sync");
  TCase* tw = tcase_create("wire");
  tcase_add_checked_fixture(tw, setup, NULL);
  tcase_add_test(tw, test_req_round_trip);
  tcase_add_test(tw, test_reply_round_trip);
  tcase_add_test(tw, test_known_answer);
  tcase_add_test(tw, test_encode_refuses_req);
  tcase_add_test(tw, test_encode_refuses_reply);
  tcase_add_test(tw, test_reject_req);
  tcase_add_test(tw, test_reject_reply);
  tcase_add_test(tw, test_reject_truncated);
  tcase_add_loop_test(tw, test_reject_field_count, 0, 2);
  tcase_add_test(tw, test_mutations);
  tcase_add_test(tw, test_fuzz_corpus);
  suite_add_tcase(s, tw);
  TCase* tp = tcase_create("plan");
  tcase_add_checked_fixture(tp, setup_state, state_free);
  tcase_add_test(tp, test_chunks_and_limits);
  tcase_add_test(tp, test_manifest_refused);
  tcase_add_test(tp, test_agree_two);
  tcase_add_test(tp, test_agree_odd_one);
  tcase_add_test(tp, test_agree_ties);
  tcase_add_test(tp, test_fetch_three);
  tcase_add_test(tp, test_fetch_ranges);
  tcase_add_test(tp, test_bad_chunk);
  tcase_add_test(tp, test_end_early);
  tcase_add_test(tp, test_order);
  tcase_add_test(tp, test_order_last_chunk);
  tcase_add_test(tp, test_order_unasked);
  tcase_add_test(tp, test_take_refuses);
  tcase_add_test(tp, test_sync_all);
  suite_add_tcase(s, tp);
  return s;
}

int main(void) {
  return tw_main(gossip_sync_suite);
}
