/* test_gossip_session.c: Check suite for the session framer
 * (gossip/session.c; gossip.h "Session framing"): two framers fed each
 * other's output in memory reach OPEN with matching streams and ids,
 * whatever the delivery size (everything at once, 1 byte, indivisible
 * sizes); the frames are a 4-byte big-endian length and an st_wire
 * message; lengths of 0 and over the cap are refused from the length
 * alone; a wrong cluster key, a wrong peer and messages of the wrong type
 * are refused under the right drop and counter; truncated input waits; the
 * framer never consumes past the peer's stream header. */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/gossip.h"
#include "tests/handshake_fixture.h"
#include "tests/unit/testutil.h"

static void setup(void) {
  hs_fixture_setup();
}

/* One end of a connection. */
typedef struct {
  st_session_framer_t f;
  st_stream_t tx, rx;
  st_crypto_counters_t cc;
  st_wire_counters_t wc;
  int rc; /* the last feed's */
} end_t;

static void end_init(end_t* e, bool initiator, st_identity_t* me,
                     st_keyring_t* ring, const st_node_id_t* expected) {
  memset(e, 0, sizeof(*e));
  ck_assert_int_eq(
      st_session_framer_init(&e->f, initiator, me, ring, NULL, expected, &e->tx,
                             &e->rx, &e->cc, &e->wc),
      0);
}

static void end_free(end_t* e) {
  st_session_framer_wipe(&e->f);
  st_stream_wipe(&e->tx);
  st_stream_wipe(&e->rx);
}

static uint64_t drops(const end_t* e) {
  uint64_t n = 0;
  for (int i = 0; i < ST_CRYPTO_DROP_COUNT; i++)
    n += e->cc.drops[i];
  return n;
}

/* Moves from's queued output into to, at most chunk bytes per feed; the
 * feeds consume it all (nothing follows a header here). Returns true when
 * any byte moved. */
static bool pump(end_t* from, end_t* to, size_t chunk) {
  size_t len = 0;
  const uint8_t* p = st_session_framer_output(&from->f, &len);
  if (len == 0)
    return false;
  uint8_t buf[ST_SESSION_OUT_MAX];
  memcpy(buf, p, len);
  st_session_framer_sent(&from->f, len);
  size_t at = 0;
  while (at < len && to->rc == 0) {
    size_t n = len - at < chunk ? len - at : chunk, used = 0;
    /* One unit per call: the rest of the chunk is fed again. */
    to->rc = st_session_framer_feed(&to->f, buf + at, n, &used);
    at += used;
    if (used == 0)
      break;
  }
  if (to->rc == 0)
    ck_assert_uint_eq(at, len);
  return true;
}

static void run_pair(end_t* i, end_t* r, size_t chunk) {
  for (int round = 0; round < 10; round++) {
    bool moved = pump(i, r, chunk);
    moved |= pump(r, i, chunk);
    if (!moved)
      break;
  }
}

/* A frame sealed on one end's tx opens on the other's rx. */
static void check_streams(end_t* a, end_t* b) {
  const uint8_t msg[] = "one frame";
  uint8_t ct[64], pt[64];
  size_t ct_len = 0, pt_len = 0;
  bool final = false;
  ck_assert_int_eq(st_stream_seal_frame(&a->tx, msg, sizeof(msg), false, ct,
                                        sizeof(ct), &ct_len),
                   0);
  ck_assert_int_eq(
      st_stream_open_frame(&b->rx, &b->cc, ct + ST_FRAME_LENGTH_BYTES,
                           ct_len - ST_FRAME_LENGTH_BYTES, pt, sizeof(pt),
                           &pt_len, &final),
      0);
  ck_assert_uint_eq(pt_len, sizeof(msg));
  ck_assert_mem_eq(pt, msg, sizeof(msg));
}

/* Delivery sizes: everything at once, a byte, indivisible, a frame plus. */
static const size_t chunks[] = {SIZE_MAX, 1, 3, 7, 517};

START_TEST(test_pair_opens) {
  end_t i, r;
  end_init(&i, true, &id_i, &ring_a, &id_r.id);
  end_init(&r, false, &id_r, &ring_a, NULL);
  run_pair(&i, &r, chunks[_i]);
  ck_assert_int_eq(i.rc, 0);
  ck_assert_int_eq(r.rc, 0);
  ck_assert_int_eq(i.f.phase, ST_SESSION_OPEN);
  ck_assert_int_eq(r.f.phase, ST_SESSION_OPEN);
  ck_assert(i.f.peer_known && r.f.peer_known);
  ck_assert_mem_eq(&i.f.peer, &id_r.id, sizeof(st_node_id_t));
  ck_assert_mem_eq(&r.f.peer, &id_i.id, sizeof(st_node_id_t));
  ck_assert_uint_eq(st_session_framer_want(&i.f), 0);
  check_streams(&i, &r);
  check_streams(&r, &i);
  ck_assert_uint_eq(drops(&i) + drops(&r), 0);
  end_free(&i);
  end_free(&r);
}
END_TEST

/* The dialler's HS1 is queued at init as a 4-byte big-endian length and
 * the st_wire message, within the cap. */
START_TEST(test_frame_format) {
  end_t i;
  end_init(&i, true, &id_i, &ring_a, NULL);
  size_t len = 0;
  const uint8_t* p = st_session_framer_output(&i.f, &len);
  ck_assert_uint_gt(len, 4);
  size_t flen =
      (size_t) p[0] << 24 | (size_t) p[1] << 16 | (size_t) p[2] << 8 | p[3];
  ck_assert_uint_eq(flen + 4, len);
  ck_assert_uint_le(flen, ST_SESSION_HS_FRAME_MAX);
  st_msg_t m;
  ck_assert_int_eq(st_wire_decode(p + 4, flen, &m, NULL), 0);
  ck_assert_int_eq(m.type, ST_MSG_HS1);
  end_free(&i);
}
END_TEST

/* Lengths 0 and cap + 1 are refused at the fourth byte; the cap waits. */
static const struct {
  uint32_t len;
  int rc;
} length_cases[] = {
    {0, -EMSGSIZE},
    {ST_SESSION_HS_FRAME_MAX + 1, -EMSGSIZE},
    {0xffffffffu, -EMSGSIZE},
    {ST_SESSION_HS_FRAME_MAX, 0},
    {1, 0},
};

START_TEST(test_frame_lengths) {
  end_t r;
  end_init(&r, false, &id_r, &ring_a, NULL);
  uint32_t v = length_cases[_i].len;
  uint8_t b[4] = {(uint8_t) (v >> 24), (uint8_t) (v >> 16), (uint8_t) (v >> 8),
                  (uint8_t) v};
  int rc = 0;
  for (int k = 0; k < 4 && rc == 0; k++) {
    size_t used = 0;
    rc = st_session_framer_feed(&r.f, b + k, 1, &used);
    ck_assert_uint_eq(used, 1);
    if (k < 3)
      ck_assert_int_eq(rc, 0);
  }
  ck_assert_int_eq(rc, length_cases[_i].rc);
  if (rc != 0) {
    ck_assert_int_eq(r.f.phase, ST_SESSION_FAILED);
    ck_assert_int_eq(r.f.drop, ST_SESSION_DROP_FRAME_SIZE);
    ck_assert_uint_eq(r.cc.drops[ST_DROP_HS_MALFORMED], 1);
    size_t used = 1;
    ck_assert_int_eq(st_session_framer_feed(&r.f, b, 1, &used), rc);
    ck_assert_uint_eq(used, 0);
  } else {
    ck_assert_int_eq(r.f.phase, ST_SESSION_HANDSHAKE);
    ck_assert_uint_eq(st_session_framer_want(&r.f), v);
  }
  end_free(&r);
}
END_TEST

START_TEST(test_wrong_cluster_key) {
  end_t i, r;
  end_init(&i, true, &id_i, &ring_a, NULL);
  end_init(&r, false, &id_r, &ring_b, NULL);
  run_pair(&i, &r, SIZE_MAX);
  ck_assert_int_ne(r.rc, 0);
  ck_assert_int_eq(r.f.phase, ST_SESSION_FAILED);
  ck_assert_int_eq(r.f.drop, ST_SESSION_DROP_HANDSHAKE);
  ck_assert_uint_ge(drops(&r), 1);
  ck_assert_uint_eq(r.cc.drops[ST_DROP_HS_MALFORMED], 0);
  ck_assert_int_eq(i.f.phase, ST_SESSION_HANDSHAKE);
  end_free(&i);
  end_free(&r);
}
END_TEST

static int admit_calls;
static bool admit_answer;
static bool admit_cb(void* arg) {
  ck_assert_ptr_eq(arg, &admit_calls);
  admit_calls++;
  return admit_answer;
}

/* A dialler's HS1 fed to an acceptor (under ring r_ring) whose admit says
 * answer. */
static void admit_pair(end_t* i, end_t* r, st_keyring_t* r_ring, bool answer) {
  end_init(i, true, &id_i, &ring_a, NULL);
  end_init(r, false, &id_r, r_ring, NULL);
  r->f.admit = admit_cb;
  r->f.admit_arg = &admit_calls;
  admit_calls = 0;
  admit_answer = answer;
  pump(i, r, SIZE_MAX);
}

/* The acceptor's admit is asked once per HS1 that passed its MAC, before
 * HS2 is made: no refuses it (BUSY, nothing queued, no crypto drop), yes
 * lets the handshake finish; an HS1 under another cluster key never asks. */
START_TEST(test_admit) {
  end_t i, r;
  admit_pair(&i, &r, &ring_a, false);
  ck_assert_int_eq(admit_calls, 1);
  size_t len = 0;
  st_session_framer_output(&r.f, &len);
  ck_assert_int_eq(r.rc, -EBUSY);
  ck_assert_int_eq(r.f.phase, ST_SESSION_FAILED);
  ck_assert_int_eq(r.f.drop, ST_SESSION_DROP_BUSY);
  ck_assert_uint_eq(len, 0); /* no HS2: no public-key work done */
  ck_assert_uint_eq(drops(&r), 0);
  end_free(&i);
  end_free(&r);

  admit_pair(&i, &r, &ring_a, true);
  ck_assert_int_eq(admit_calls, 1);
  run_pair(&i, &r, SIZE_MAX);
  ck_assert_int_eq(r.f.phase, ST_SESSION_OPEN);
  ck_assert_int_eq(admit_calls, 1);
  end_free(&i);
  end_free(&r);

  admit_pair(&i, &r, &ring_b, true);
  ck_assert_int_eq(admit_calls, 0);
  ck_assert_int_eq(r.f.drop, ST_SESSION_DROP_HANDSHAKE);
  end_free(&i);
  end_free(&r);
}
END_TEST

/* The dialler meant id_m and reached id_r: refused after HS3 is queued,
 * before its stream header; the peer it did reach is known. */
START_TEST(test_wrong_peer) {
  end_t i, r;
  end_init(&i, true, &id_i, &ring_a, &id_m.id);
  end_init(&r, false, &id_r, &ring_a, NULL);
  pump(&i, &r, SIZE_MAX);
  pump(&r, &i, SIZE_MAX);
  ck_assert_int_eq(i.rc, -EACCES);
  ck_assert_int_eq(i.f.phase, ST_SESSION_FAILED);
  ck_assert_int_eq(i.f.drop, ST_SESSION_DROP_WRONG_PEER);
  ck_assert(i.f.peer_known);
  ck_assert_mem_eq(&i.f.peer, &id_r.id, sizeof(st_node_id_t));
  size_t len = 0;
  const uint8_t* p = st_session_framer_output(&i.f, &len);
  size_t flen = (size_t) p[2] << 8 | p[3];
  ck_assert_uint_eq(len, 4 + flen); /* HS3 alone, no header */
  ck_assert_uint_eq(drops(&i), 0);
  end_free(&i);
  end_free(&r);
}
END_TEST

/* HS1 short of its last byte waits, queues nothing, wants one byte. */
START_TEST(test_truncated_waits) {
  end_t i, r;
  end_init(&i, true, &id_i, &ring_a, NULL);
  end_init(&r, false, &id_r, &ring_a, NULL);
  size_t len = 0, used = 0, out = 0;
  const uint8_t* p = st_session_framer_output(&i.f, &len);
  ck_assert_int_eq(st_session_framer_feed(&r.f, p, len - 1, &used), 0);
  ck_assert_uint_eq(used, len - 1);
  ck_assert_int_eq(r.f.phase, ST_SESSION_HANDSHAKE);
  st_session_framer_output(&r.f, &out);
  ck_assert_uint_eq(out, 0);
  ck_assert_uint_eq(st_session_framer_want(&r.f), 1);
  ck_assert_int_eq(st_session_framer_feed(&r.f, p + len - 1, 1, &used), 0);
  st_session_framer_output(&r.f, &out);
  ck_assert_uint_gt(out, 4); /* HS2 */
  end_free(&i);
  end_free(&r);
}
END_TEST

/* The bytes after the peer's header are the caller's. */
START_TEST(test_stops_after_header) {
  end_t i, r;
  end_init(&i, true, &id_i, &ring_a, NULL);
  end_init(&r, false, &id_r, &ring_a, NULL);
  pump(&i, &r, SIZE_MAX); /* HS1 */
  pump(&r, &i, SIZE_MAX); /* HS2 */
  pump(&i, &r, SIZE_MAX); /* HS3 and the dialler's header */
  ck_assert_int_eq(r.f.phase, ST_SESSION_OPEN);
  size_t len = 0, used = 0;
  const uint8_t* p = st_session_framer_output(&r.f, &len);
  ck_assert_uint_eq(len, ST_STREAM_HEADER_BYTES);
  uint8_t buf[ST_STREAM_HEADER_BYTES + 5];
  memcpy(buf, p, len);
  memset(buf + len, 0xab, 5);
  ck_assert_int_eq(st_session_framer_feed(&i.f, buf, sizeof(buf), &used), 0);
  ck_assert_uint_eq(used, ST_STREAM_HEADER_BYTES);
  ck_assert_int_eq(i.f.phase, ST_SESSION_OPEN);
  ck_assert_int_eq(st_session_framer_feed(&i.f, buf + used, 5, &used), 0);
  ck_assert_uint_eq(used, 0);
  end_free(&i);
  end_free(&r);
}
END_TEST

/* A message this side does not expect, or none at all. */
START_TEST(test_wrong_messages) {
  end_t a, b;
  end_init(&a, true, &id_i, &ring_a, NULL);
  end_init(&b, true, &id_r, &ring_a, NULL);
  pump(&b, &a, SIZE_MAX); /* an HS1 to a dialler */
  ck_assert_int_eq(a.rc, -EPROTO);
  ck_assert_int_eq(a.f.drop, ST_SESSION_DROP_MALFORMED);
  ck_assert_uint_eq(a.cc.drops[ST_DROP_HS_MALFORMED], 1);
  end_free(&a);
  end_free(&b);
  end_t r;
  end_init(&r, false, &id_r, &ring_a, NULL);
  const uint8_t junk[] = {0, 0, 0, 3, 0xc1, 0xc1, 0xc1};
  size_t used = 0;
  ck_assert_int_eq(st_session_framer_feed(&r.f, junk, sizeof(junk), &used),
                   -EBADMSG);
  ck_assert_int_eq(r.f.drop, ST_SESSION_DROP_MALFORMED);
  ck_assert_uint_eq(r.cc.drops[ST_DROP_HS_MALFORMED], 1);
  end_free(&r);
}
END_TEST

static Suite* session_suite(void) {
  Suite* s = suite_create("gossip_session");
  TCase* tc = tcase_create("session");
  tcase_add_unchecked_fixture(tc, setup, NULL);
  tcase_add_loop_test(tc, test_pair_opens, 0,
                      (int) (sizeof(chunks) / sizeof(chunks[0])));
  tcase_add_test(tc, test_frame_format);
  tcase_add_loop_test(tc, test_frame_lengths, 0,
                      (int) (sizeof(length_cases) / sizeof(length_cases[0])));
  tcase_add_test(tc, test_wrong_cluster_key);
  tcase_add_test(tc, test_wrong_peer);
  tcase_add_test(tc, test_admit);
  tcase_add_test(tc, test_truncated_waits);
  tcase_add_test(tc, test_stops_after_header);
  tcase_add_test(tc, test_wrong_messages);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(session_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
