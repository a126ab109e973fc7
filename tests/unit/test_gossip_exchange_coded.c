/* test_gossip_exchange_coded.c: the Check suite for compressed averaging in
 * the exchange machine (gossip/exchange.c; gossip.h, "Compressed
 * averaging"), over the pump of xchg_pump.h. The machine never reads the
 * codec's bytes, so the driver's codec here is a small one of our own:
 * 8 header bytes ("TSTC", n as u32) and each drift d = s - anchor as an
 * int16 of round(1024 d). Checked, over sizes 1, 1000 and 2 * 262144 + 3
 * floats (whose encoding spans two XCHG_CODED pieces):
 *
 * - with the same anchor on both sides, each side ENCODEs once and DECODEs
 *   once (answered at once, or a round later as from another thread),
 *   sends only XCHG_CODED pieces (no TENSOR_CHUNK), and APPLYs
 *   (D(c_peer) - D(c_own)) / 2 bit for bit: the two deltas cancel exactly;
 * - without a shared anchor (different, all zero on both, or on one) or
 *   for FETCH, the exchange is float32, as before, with no codec work;
 * - a decoder refusal ends the receiver FAIL_CODEC with the driver's
 *   reason and no APPLY; a piece whose total is not coded_bytes is
 *   FAIL_SIZE; a TENSOR_CHUNK in a compressed exchange, a piece out of
 *   order, or an XCHG_DONE before every byte are refused; an encoder
 *   refusal (our snapshot not finite) is FAIL_NONFINITE;
 * - st_xchg_encoded and st_xchg_decoded refuse calls nobody asked for. */
#include "tests/unit/xchg_pump.h"

#define TOY_HEADER 8

static size_t toy_bytes(size_t n) {
  return TOY_HEADER + 2 * n;
}

static int toy_decode(const xchg_pump_codec_t* c, float* work, size_t n,
                      const uint8_t* coded, size_t coded_len, int* reason) {
  (void) c;
  uint32_t hn = (uint32_t) coded[4] | (uint32_t) coded[5] << 8 |
                (uint32_t) coded[6] << 16 | (uint32_t) coded[7] << 24;
  if (coded_len != toy_bytes(n) || memcmp(coded, "TSTC", 4) != 0) {
    *reason = 41;
    return -EBADMSG;
  }
  if (hn != n) {
    *reason = 42;
    return -EBADMSG;
  }
  for (size_t i = 0; i < n; i++) {
    int16_t q = (int16_t) (coded[TOY_HEADER + 2 * i] |
                           coded[TOY_HEADER + 2 * i + 1] << 8);
    work[i] = (float) q / 1024.0f;
  }
  return 0;
}

static int toy_encode(const xchg_pump_codec_t* c, float* work, size_t n,
                      uint8_t* coded, size_t coded_len) {
  ck_assert_uint_eq(coded_len, toy_bytes(n));
  memcpy(coded, "TSTC", 4);
  for (int k = 0; k < 4; k++)
    coded[4 + k] = (uint8_t) ((uint32_t) n >> (8 * k));
  for (size_t i = 0; i < n; i++) {
    float d = work[i] - c->anchor[i];
    if (!isfinite(d))
      return -EINVAL;
    float q = roundf(d * 1024.0f);
    q = q > 32767 ? 32767 : q < -32767 ? -32767 : q;
    int16_t v = (int16_t) q;
    coded[TOY_HEADER + 2 * i] = (uint8_t) ((uint16_t) v & 0xff);
    coded[TOY_HEADER + 2 * i + 1] = (uint8_t) ((uint16_t) v >> 8);
  }
  int reason = 0;
  return toy_decode(c, work, n, coded, coded_len, &reason);
}

/* D(C(s - anchor)): what the toy codec gives for one float. */
static float toy_round_trip(float s, float anchor) {
  float q = roundf((s - anchor) * 1024.0f);
  q = q > 32767 ? 32767 : q < -32767 ? -32767 : q;
  return (float) (int16_t) q / 1024.0f;
}

static const size_t sizes[] = {1, 1000, BIG_N};
#define NSIZES 3

/* Both sides on the same anchor and codec; the snapshots near it. */
typedef struct {
  run_t r;
  xchg_pump_codec_t codec;
  float *anchor, *a, *b;
} coded_run_t;

static void coded_init(coded_run_t* c, size_t n) {
  memset(c, 0, sizeof *c);
  run_init(&c->r, ST_XCHG_AVERAGE, n);
  c->anchor = rand_vec(n, -1, 1);
  c->a = rand_vec(n, -0.05f, 0.05f);
  c->b = rand_vec(n, -0.05f, 0.05f);
  for (size_t i = 0; i < n; i++) {
    c->a[i] += c->anchor[i];
    c->b[i] += c->anchor[i];
  }
  c->codec.encode = toy_encode;
  c->codec.decode = toy_decode;
  c->codec.anchor = c->anchor;
  c->r.la.coded_bytes = c->r.lb.coded_bytes = toy_bytes(n);
  memset(c->r.la.anchor, 0xa5, ST_XCHG_ANCHOR_BYTES);
  memset(c->r.lb.anchor, 0xa5, ST_XCHG_ANCHOR_BYTES);
  c->r.snap_a = c->a;
  c->r.snap_b = c->b;
  c->r.codec_a = c->r.codec_b = &c->codec;
}

static void coded_free(coded_run_t* c) {
  free(c->anchor);
  free(c->a);
  free(c->b);
}

/* Counts the frames each side sent by type. */
typedef struct {
  int coded[2], chunks[2];
} census_t;

static hook_rc_t census_hook(void* ctx, int from, int index, uint8_t* data,
                             size_t* len) {
  (void) index;
  census_t* c = ctx;
  st_msg_t m;
  ck_assert_int_eq(st_wire_decode(data, *len, &m, NULL), 0);
  c->coded[from] += m.type == ST_MSG_XCHG_CODED;
  c->chunks[from] += m.type == ST_MSG_TENSOR_CHUNK;
  st_wire_msg_free(&m);
  return H_DELIVER;
}

/* Has the pump count c's frames into *census. */
static void count_frames(coded_run_t* c, census_t* census) {
  c->r.hook = census_hook;
  c->r.hook_ctx = census;
}

/* Both sides of a compressed exchange applied (D(c_peer) - D(c_own)) / 2
 * bit for bit (the deltas cancel exactly), and each side's decoded drift,
 * for the gossip outer step, is D(C(s - anchor)). */
static void check_coded_outcome(const coded_run_t* c, side_t* sa, side_t* sb,
                                size_t n) {
  float *oa = st_xchg_coded_own(sa->x), *ob = st_xchg_coded_own(sb->x);
  ck_assert(oa != NULL && ob != NULL);
  long bad = -1;
  for (size_t i = 0; i < n && bad < 0; i++) {
    float ea = toy_round_trip(c->a[i], c->anchor[i]);
    float eb = toy_round_trip(c->b[i], c->anchor[i]);
    float da = (eb - ea) * 0.5f, db = (ea - eb) * 0.5f;
    if (memcmp(&sa->apply[i], &da, 4) != 0 ||
        memcmp(&sb->apply[i], &db, 4) != 0 || sa->apply[i] + sb->apply[i] != 0)
      bad = (long) i;
  }
  ck_assert_msg(bad < 0, "deltas differ at %ld", bad);
  for (size_t i = 0; i < n && bad < 0; i++) {
    float ea = toy_round_trip(c->a[i], c->anchor[i]);
    float eb = toy_round_trip(c->b[i], c->anchor[i]);
    if (memcmp(&oa[i], &ea, 4) != 0 || memcmp(&ob[i], &eb, 4) != 0)
      bad = (long) i;
  }
  ck_assert_msg(bad < 0, "decoded drifts differ at %ld", bad);
}

/* _i: size index * 4 + lazy acks * 2 + codec work deferred. */
START_TEST(test_coded_average) {
  size_t n = sizes[_i / 4];
  coded_run_t c;
  coded_init(&c, n);
  c.r.lazy_acks = _i / 2 % 2;
  c.r.defer_codec = _i % 2;
  census_t census = {{0, 0}, {0, 0}};
  count_frames(&c, &census);
  pump_t p;
  pump_start(&p, &c.r);
  side_t *sa = &p.s[0], *sb = &p.s[1];
  ck_assert_int_eq(sa->result, ST_XCHG_OK);
  ck_assert_int_eq(sb->result, ST_XCHG_OK);
  ck_assert(sa->coded_exchange && sb->coded_exchange);
  for (int i = 0; i < 2; i++) {
    ck_assert_int_eq(p.s[i].n_encode, 1);
    ck_assert_int_eq(p.s[i].n_decode, 1);
    ck_assert_int_eq(p.s[i].n_apply, 1);
    ck_assert_int_eq(census.chunks[i], 0);
    /* ceil(bytes / 1 MiB) pieces: BIG_N's 1 MiB + 14 bytes take two. */
    size_t pieces =
        (toy_bytes(n) + ST_WIRE_CHUNK_MAX_BYTES - 1) / ST_WIRE_CHUNK_MAX_BYTES;
    ck_assert_int_eq(census.coded[i], (int) pieces);
  }
  check_coded_outcome(&c, sa, sb, n);
  pump_free(&p);
  coded_free(&c);
}
END_TEST

/* The initiator finished and closed while the responder's DECODE still
 * ran (a pool thread slower than the peer): every byte and the peer's
 * XCHG_DONE were in and the responder's own stream was sent, so the close
 * is the peer's end, not a failure: the responder applies too, and the
 * two deltas still cancel. (It failed "closed" before, leaving the pair's
 * sum moved by the initiator's half.) */
START_TEST(test_coded_peer_done_first) {
  size_t n = 1000;
  coded_run_t c;
  coded_init(&c, n);
  c.r.hold_decode_b = true;
  pump_t p;
  pump_start(&p, &c.r);
  side_t *sa = &p.s[0], *sb = &p.s[1];
  ck_assert_int_eq(sa->result, ST_XCHG_OK);
  ck_assert(sb->closed_seen); /* the close came before its DONE */
  ck_assert_int_eq(sb->result, ST_XCHG_OK);
  ck_assert_int_eq(sb->n_apply, 1);
  check_coded_outcome(&c, sa, sb, n);
  pump_free(&p);
  coded_free(&c);
}
END_TEST

/* No shared anchor (_i 0: different; 1: none on either side; 2: none on
 * A; 3: FETCH): float32, no codec work, the float32 deltas. */
START_TEST(test_coded_fallback) {
  size_t n = 1000;
  coded_run_t c;
  coded_init(&c, n);
  if (_i == 0)
    c.r.lb.anchor[3] ^= 1;
  if (_i == 1 || _i == 2)
    memset(c.r.la.anchor, 0, ST_XCHG_ANCHOR_BYTES);
  if (_i == 1)
    memset(c.r.lb.anchor, 0, ST_XCHG_ANCHOR_BYTES);
  if (_i == 3)
    c.r.kind = ST_XCHG_FETCH;
  census_t census = {{0, 0}, {0, 0}};
  count_frames(&c, &census);
  pump_t p;
  pump_start(&p, &c.r);
  side_t *sa = &p.s[0], *sb = &p.s[1];
  ck_assert_int_eq(sa->result, ST_XCHG_OK);
  ck_assert_int_eq(sb->result, ST_XCHG_OK);
  ck_assert(!sa->coded_exchange && !sb->coded_exchange);
  ck_assert_int_eq(sa->n_encode + sb->n_encode + sa->n_decode + sb->n_decode,
                   0);
  ck_assert_int_eq(census.coded[0] + census.coded[1], 0);
  long bad = -1;
  for (size_t i = 0; i < n && bad < 0; i++) {
    float want = _i == 3 ? c.b[i] : (c.b[i] - c.a[i]) / 2;
    if (memcmp(&sa->apply[i], &want, 4) != 0)
      bad = (long) i;
  }
  ck_assert_msg(bad < 0, "A's APPLY differs at %ld", bad);
  ck_assert(st_xchg_coded_own(sa->x) == NULL &&
            st_xchg_coded_own(sb->x) == NULL); /* float32: st_xchg_own */
  pump_free(&p);
  coded_free(&c);
}
END_TEST

/* What a hostile or broken peer may do to B's coded stream. */
typedef enum {
  C_FLIP_MAGIC, /* the decoder refuses: FAIL_CODEC, reason 41 */
  C_WRONG_N,    /* the decoder refuses: FAIL_CODEC, reason 42 */
  C_TOTAL,      /* a piece's total is not coded_bytes: FAIL_SIZE */
  C_OFFSET,     /* a piece that does not start where the last ended */
  C_AS_CHUNK,   /* a TENSOR_CHUNK in a compressed exchange */
  C_EARLY_DONE, /* XCHG_DONE before the last piece */
  NCODED_FAULTS
} coded_fault_t;

static hook_rc_t fault_hook(void* ctx, int from, int index, uint8_t* data,
                            size_t* len) {
  const coded_fault_t* f = ctx;
  st_msg_t m;
  ck_assert_int_eq(st_wire_decode(data, *len, &m, NULL), 0);
  if (from != 1 || m.type != ST_MSG_XCHG_CODED) {
    (void) index;
    return H_DELIVER;
  }
  uint8_t* bytes = (uint8_t*) m.u.xchg_coded.data; /* borrowed from data */
  switch (*f) {
    case C_FLIP_MAGIC:
      if (m.u.xchg_coded.offset == 0)
        bytes[1] ^= 0x20;
      return H_DELIVER;
    case C_WRONG_N:
      if (m.u.xchg_coded.offset == 0)
        bytes[4] ^= 1;
      return H_DELIVER;
    case C_TOTAL:
      m.u.xchg_coded.total += 1;
      reencode(data, len, &m);
      return H_DELIVER;
    case C_OFFSET:
      m.u.xchg_coded.offset += 1;
      m.u.xchg_coded.total += 1;
      reencode(data, len, &m);
      return H_DELIVER;
    case C_AS_CHUNK: {
      st_msg_t t;
      memset(&t, 0, sizeof t);
      t.type = ST_MSG_TENSOR_CHUNK;
      t.u.chunk.total = 1000;
      t.u.chunk.data = bytes;
      t.u.chunk.data_len = 8;
      reencode(data, len, &t);
      return H_DELIVER;
    }
    case C_EARLY_DONE:
      return H_DROP; /* the only piece: DONE follows with no bytes */
    case NCODED_FAULTS:
      break;
  }
  return H_DELIVER;
}

START_TEST(test_coded_faults) {
  coded_fault_t f = (coded_fault_t) _i;
  coded_run_t c;
  coded_init(&c, 1000);
  c.r.defer_codec = true;
  c.r.hook = fault_hook;
  c.r.hook_ctx = &f;
  pump_t p;
  pump_start(&p, &c.r);
  side_t* sa = &p.s[0];
  static const st_xchg_result_t want[NCODED_FAULTS] = {
      [C_FLIP_MAGIC] = ST_XCHG_FAIL_CODEC,  [C_WRONG_N] = ST_XCHG_FAIL_CODEC,
      [C_TOTAL] = ST_XCHG_FAIL_SIZE,        [C_OFFSET] = ST_XCHG_FAIL_PROTOCOL,
      [C_AS_CHUNK] = ST_XCHG_FAIL_PROTOCOL, [C_EARLY_DONE] = ST_XCHG_FAIL_SIZE};
  ck_assert_msg(sa->result == want[f], "fault %d: A ended %s", (int) f,
                st_xchg_result_name(sa->result));
  ck_assert_int_eq(sa->n_apply, 0);
  if (f == C_FLIP_MAGIC || f == C_WRONG_N)
    ck_assert_int_eq(sa->codec_drop, f == C_FLIP_MAGIC ? 41 : 42);
  else
    ck_assert_int_eq(sa->n_decode, 0); /* refused before any decoding */
  pump_free(&p);
  coded_free(&c);
}
END_TEST

/* A's snapshot holds a NaN: its encoder refuses, A ends FAIL_NONFINITE and
 * sends nothing of it; B applies nothing either. */
START_TEST(test_coded_own_nonfinite) {
  coded_run_t c;
  coded_init(&c, 1000);
  c.a[17] = NAN;
  census_t census = {{0, 0}, {0, 0}};
  count_frames(&c, &census);
  pump_t p;
  pump_start(&p, &c.r);
  ck_assert_int_eq(p.s[0].result, ST_XCHG_FAIL_NONFINITE);
  ck_assert_int_eq(census.coded[0], 0);
  ck_assert_int_eq(p.s[0].n_apply + p.s[1].n_apply, 0);
  ck_assert_int_ne(p.s[1].result, ST_XCHG_OK);
  pump_free(&p);
  coded_free(&c);
}
END_TEST

START_TEST(test_coded_misuse) {
  st_xchg_config_t cfg;
  st_xchg_config_default(&cfg);
  st_xchg_local_t l;
  local_init(&l, 3, "m", 10, 0);
  l.coded_bytes = ST_XCHG_CODED_MAX_BYTES + 1;
  st_xchg_t* x = NULL;
  ck_assert_int_eq(st_xchg_new_initiator(&cfg, ST_XCHG_AVERAGE, &l, T0, &x),
                   -EINVAL);
  l.coded_bytes = toy_bytes(10);
  memset(l.anchor, 1, sizeof l.anchor);
  ck_assert_int_eq(st_xchg_new_initiator(&cfg, ST_XCHG_AVERAGE, &l, T0, &x), 0);
  ck_assert_int_eq(st_xchg_encoded(x, T0, 0), -EINVAL); /* not asked */
  ck_assert_int_eq(st_xchg_decoded(x, T0, 0, 0), -EINVAL);
  ck_assert_int_eq(st_xchg_encoded(NULL, T0, 0), -EINVAL);
  ck_assert_int_eq(st_xchg_decoded(NULL, T0, 0, 0), -EINVAL);
  st_xchg_free(x);
}
END_TEST

static Suite* coded_suite(void) {
  Suite* s = suite_create("gossip_exchange_coded");
  TCase* tc = tcase_create("coded");
  tcase_add_checked_fixture(tc, setup, NULL);
  tcase_add_loop_test(tc, test_coded_average, 0, 4 * NSIZES);
  tcase_add_loop_test(tc, test_coded_fallback, 0, 4);
  tcase_add_loop_test(tc, test_coded_faults, 0, NCODED_FAULTS);
  tcase_add_test(tc, test_coded_own_nonfinite);
  tcase_add_test(tc, test_coded_peer_done_first);
  tcase_add_test(tc, test_coded_misuse);
  tcase_set_timeout(tc, 120);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  return tu_main(coded_suite);
}
