/* test_crypto_handshake.c: Check suite for the TCP handshake
 * (crypto/handshake.c; crypto.h "TCP handshake", Noise XX + psk in spirit):
 * complete handshakes (with allow-lists and during key rotation) give
 * matching keys and ids; a wrong cluster key, a flipped byte at every
 * position of every message, replayed messages and men in the middle all
 * fail under the right counter; allow-lists bind both ways; calls out of
 * order, self-connections; the state is zero after finishing or failing. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crypto/crypto.h"
#include "tests/handshake_fixture.h"
#include "tests/unit/testutil.h"

/* One side of a connection. */
typedef struct {
  st_identity_t* id;
  st_keyring_t* ring;
  st_allowlist_t* allow;
  st_crypto_counters_t c;
  st_handshake_t hs;
  st_session_t sess;
} side_t;

static st_keyring_t ring_ba; /* b current, a previous */

static void setup(void) {
  hs_fixture_setup();
  ck_assert_int_eq(st_keyring_init(&ring_ba, &key_b, &key_a, NULL, 0), 0);
}

static bool all_zero(const void* p, size_t n) {
  const uint8_t* b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i] != 0)
      return false;
  return true;
}

static void side_init(side_t* s, st_identity_t* id, st_keyring_t* ring,
                      st_allowlist_t* allow, st_hs_role_t role) {
  memset(s, 0, sizeof(*s));
  s->id = id;
  s->ring = ring;
  s->allow = allow;
  ck_assert_int_eq(
      st_handshake_init(&s->hs, role, s->id, s->ring, s->allow, &s->c), 0);
}

/* A tamper hook: may alter message `msg` (1, 2 or 3) on the wire. */
typedef void (*tamper_fn)(int msg, uint8_t* bytes, size_t n, void* ctx);

/* The steps of a handshake, in order; run() reports which one failed. */
enum { W1 = 1, R1, W2, R2, W3, R3, FIN_I, FIN_R, ALL_DONE };

/* Runs a whole handshake between i and r. Returns 0 or the first error,
 * with the step that failed in *step (ALL_DONE on success). */
static int run(side_t* i, side_t* r, tamper_fn tamper, void* ctx, int* step) {
  st_hs_msg1_t m1;
  memset(&m1, 0, sizeof(m1));
  st_hs_msg2_t m2;
  st_hs_msg3_t m3;
  int rc;
#define STEP(s, call)  \
  do {                 \
    *step = (s);       \
    if ((rc = (call))) \
      return rc;       \
  } while (0)
  STEP(W1, st_handshake_write_msg1(&i->hs, &m1));
  if (tamper)
    tamper(1, (uint8_t*) &m1, sizeof(m1), ctx);
  STEP(R1, st_handshake_read_msg1(&r->hs, &m1));
  STEP(W2, st_handshake_write_msg2(&r->hs, &m2));
  if (tamper)
    tamper(2, (uint8_t*) &m2, sizeof(m2), ctx);
  STEP(R2, st_handshake_read_msg2(&i->hs, &m2));
  STEP(W3, st_handshake_write_msg3(&i->hs, &m3));
  if (tamper)
    tamper(3, (uint8_t*) &m3, sizeof(m3), ctx);
  STEP(FIN_I, st_handshake_finish(&i->hs, &i->sess));
  STEP(R3, st_handshake_read_msg3(&r->hs, &m3));
  STEP(FIN_R, st_handshake_finish(&r->hs, &r->sess));
#undef STEP
  *step = ALL_DONE;
  return 0;
}

static uint64_t total(const st_crypto_counters_t* c) {
  uint64_t n = 0;
  for (int k = 0; k < ST_CRYPTO_DROP_COUNT; k++)
    n += c->drops[k];
  return n;
}

/* An allow-list file holding the given keys. */
static st_allowlist_t* allow_of(const st_identity_t* const* ids, int n) {
  char dir[512], path[600], text[64 * 4] = "# test allow-list\n";
  ck_assert_int_eq(tu_mkdtemp(dir, sizeof(dir)), 0);
  snprintf(path, sizeof(path), "%s/allow", dir);
  for (int k = 0; k < n; k++) {
    char b64[44];
    st_public_key_format(ids[k]->public_key, b64);
    strcat(text, b64);
    strcat(text, " node\n");
  }
  ck_assert_int_eq(tu_write_file(path, text, strlen(text)), 0);
  st_allowlist_t* list = NULL;
  char err[256] = "";
  ck_assert_msg(st_allowlist_load(path, &list, err, sizeof(err)) == 0, "%s",
                err);
  ck_assert_uint_eq(st_allowlist_count(list), (size_t) n);
  tu_rmtree(dir);
  return list;
}

static void check_session_pair(const side_t* i, const side_t* r) {
  ck_assert(memcmp(i->sess.tx_key, r->sess.rx_key, ST_KEY_BYTES) == 0);
  ck_assert(memcmp(i->sess.rx_key, r->sess.tx_key, ST_KEY_BYTES) == 0);
  ck_assert(memcmp(i->sess.tx_key, i->sess.rx_key, ST_KEY_BYTES) != 0);
  ck_assert(memcmp(i->sess.peer_id.b, r->id->id.b, ST_NODE_ID_BYTES) == 0);
  ck_assert(memcmp(r->sess.peer_id.b, i->id->id.b, ST_NODE_ID_BYTES) == 0);
  ck_assert(memcmp(i->sess.peer_public_key, r->id->public_key, 32) == 0);
  ck_assert(memcmp(r->sess.peer_public_key, i->id->public_key, 32) == 0);
  ck_assert(all_zero(&i->hs, sizeof(i->hs)));
  ck_assert(all_zero(&r->hs, sizeof(r->hs)));
}

/* ---- Complete handshakes ----------------------------------------------------
 */

static const struct {
  const char* name;
  int ring_i, ring_r; /* 0: a, 1: b, 2: b current + a previous */
  bool allow_i, allow_r;
} ok_cases[] = {
    {"plain", 0, 0, false, false},
    {"allow-lists both ways", 0, 0, true, true},
    {"allow-list at the initiator", 1, 1, true, false},
    {"rotation: responder has both, initiator the old key", 0, 2, false, false},
    {"rotation: initiator has both (seals with the new)", 2, 1, true, true},
    {"rotation: both have both", 2, 2, false, true},
};

static st_keyring_t* ring_n(int n) {
  return n == 0 ? &ring_a : n == 1 ? &ring_b : &ring_ba;
}

START_TEST(test_complete) {
  const st_identity_t* both[2] = {&id_i, &id_r};
  st_allowlist_t* allow = allow_of(both, 2);
  side_t i, r;
  side_init(&i, &id_i, ring_n(ok_cases[_i].ring_i),
            ok_cases[_i].allow_i ? allow : NULL, ST_HS_INITIATOR);
  side_init(&r, &id_r, ring_n(ok_cases[_i].ring_r),
            ok_cases[_i].allow_r ? allow : NULL, ST_HS_RESPONDER);
  int step;
  ck_assert_msg(run(&i, &r, NULL, NULL, &step) == 0, "%s: failed at %d",
                ok_cases[_i].name, step);
  check_session_pair(&i, &r);
  ck_assert_uint_eq(total(&i.c) + total(&r.c), 0);
  /* A second handshake between the same nodes gives fresh keys. */
  side_t i2, r2;
  side_init(&i2, &id_i, ring_n(ok_cases[_i].ring_i), NULL, ST_HS_INITIATOR);
  side_init(&r2, &id_r, ring_n(ok_cases[_i].ring_r), NULL, ST_HS_RESPONDER);
  ck_assert_int_eq(run(&i2, &r2, NULL, NULL, &step), 0);
  ck_assert(memcmp(i.sess.tx_key, i2.sess.tx_key, ST_KEY_BYTES) != 0);
  st_session_wipe(&i.sess);
  ck_assert(all_zero(&i.sess, sizeof(i.sess)));
  st_allowlist_free(allow);
}
END_TEST

/* ---- Failures ---------------------------------------------------------------
 */

/* Checks that a failed side's state is zero and refuses every call. */
static void check_dead(side_t* s) {
  ck_assert(all_zero(&s->hs, sizeof(s->hs)));
  st_hs_msg1_t m1;
  memset(&m1, 0, sizeof(m1));
  memset(&m1, 0, sizeof(m1));
  st_hs_msg2_t m2;
  memset(&m2, 0, sizeof(m2));
  st_hs_msg3_t m3;
  memset(&m3, 0, sizeof(m3));
  ck_assert_int_eq(st_handshake_write_msg1(&s->hs, &m1), -EPROTO);
  ck_assert_int_eq(st_handshake_read_msg1(&s->hs, &m1), -EPROTO);
  ck_assert_int_eq(st_handshake_write_msg2(&s->hs, &m2), -EPROTO);
  ck_assert_int_eq(st_handshake_read_msg2(&s->hs, &m2), -EPROTO);
  ck_assert_int_eq(st_handshake_write_msg3(&s->hs, &m3), -EPROTO);
  ck_assert_int_eq(st_handshake_read_msg3(&s->hs, &m3), -EPROTO);
  ck_assert_int_eq(st_handshake_finish(&s->hs, &s->sess), -EPROTO);
}

/* mac1 of docs/protocol.md's worked example (cluster key 00..1f, key id
 * 42, its e_i.pub), computed independently with libsodium there. */
START_TEST(test_mac1_known_answer) {
  static const uint8_t e[32] = {0x49, 0x3e, 0x82, 0xfc, 0x74, 0x46, 0x4a, 0x59,
                                0x26, 0x88, 0x17, 0x62, 0x3d, 0x20, 0x53, 0xc5,
                                0xeb, 0x8e, 0x2c, 0xc4, 0xa9, 0x88, 0xb4, 0xfe,
                                0xe1, 0x79, 0xec, 0x6b, 0x01, 0x0d, 0x53, 0x1d};
  static const uint8_t want[ST_HS_MAC_BYTES] = {
      0x2e, 0x88, 0x8d, 0x53, 0x1a, 0x41, 0x38, 0xbd,
      0xd4, 0xde, 0xf1, 0x4e, 0x47, 0x26, 0x70, 0xbe};
  uint8_t bytes[ST_KEY_BYTES];
  for (int i = 0; i < ST_KEY_BYTES; i++)
    bytes[i] = (uint8_t) i;
  st_cluster_key_t k;
  st_cluster_key_from_bytes(&k, bytes);
  st_hs_msg1_t m = {.version = 1, .key_id = 42};
  memcpy(m.ephemeral, e, sizeof e);
  uint8_t mac[ST_HS_MAC_BYTES];
  st_handshake_msg1_mac(&k, &m, mac);
  ck_assert_mem_eq(mac, want, sizeof want);
  m.mac[0] = 0xff; /* mac1 covers the first 34 bytes only */
  st_handshake_msg1_mac(&k, &m, mac);
  ck_assert_mem_eq(mac, want, sizeof want);
}
END_TEST

START_TEST(test_wrong_cluster_key) {
  /* _i == 0: another key id, refused at msg1; 1: the same key id (forced):
   * mac1 does not verify under the responder's key, so it is refused at
   * msg1 too, before any public-key work. */
  st_cluster_key_t other = key_b;
  if (_i == 1)
    other.id = key_a.id;
  st_keyring_t ring_o;
  ck_assert_int_eq(st_keyring_init(&ring_o, &other, NULL, NULL, 0), 0);
  side_t i, r;
  side_init(&i, &id_i, &ring_a, NULL, ST_HS_INITIATOR);
  side_init(&r, &id_r, &ring_o, NULL, ST_HS_RESPONDER);
  int step;
  int rc = run(&i, &r, NULL, NULL, &step);
  if (_i == 0) {
    ck_assert_int_eq(rc, -ENOKEY);
    ck_assert_int_eq(step, R1);
    ck_assert_uint_eq(r.c.drops[ST_DROP_HS_KEY_ID], 1);
    check_dead(&r);
  } else {
    ck_assert_int_eq(rc, -EBADMSG);
    ck_assert_int_eq(step, R1);
    ck_assert_uint_eq(r.c.drops[ST_DROP_HS_MAC], 1);
    check_dead(&r);
  }
  ck_assert_uint_eq(total(&i.c) + total(&r.c), 1);
  st_handshake_wipe(&i.hs);
  st_handshake_wipe(&r.hs);
}
END_TEST

typedef struct {
  int msg;
  size_t pos;
  uint8_t mask;
} flip_t;

static void flip(int msg, uint8_t* bytes, size_t n, void* ctx) {
  const flip_t* f = ctx;
  if (msg == f->msg) {
    ck_assert_uint_lt(f->pos, n);
    bytes[f->pos] ^= f->mask;
  }
}

/* A flipped byte at every position of message _i + 1, with two masks:
 * the handshake fails at the first check that covers the byte. */
START_TEST(test_flip_every_byte) {
  static const uint8_t masks[] = {0x01, 0x80};
  int msg = _i + 1;
  size_t len = msg == 1   ? sizeof(st_hs_msg1_t)
               : msg == 2 ? sizeof(st_hs_msg2_t)
                          : sizeof(st_hs_msg3_t);
  for (size_t pos = 0; pos < len; pos++) {
    for (size_t k = 0; k < sizeof(masks); k++) {
      flip_t f = {msg, pos, masks[k]};
      side_t i, r;
      side_init(&i, &id_i, &ring_a, NULL, ST_HS_INITIATOR);
      side_init(&r, &id_r, &ring_a, NULL, ST_HS_RESPONDER);
      int step;
      int rc = run(&i, &r, flip, &f, &step);
      ck_assert_msg(rc != 0, "msg%d flip at %zu accepted", msg, pos);
      /* Where it must fail, and how it is counted. */
      int want_step = R2;
      side_t* counted = &i;
      st_crypto_drop_t reason = ST_DROP_HS_AUTH;
      if (msg == 1 && pos == 0) {
        want_step = R1, counted = &r, reason = ST_DROP_HS_MALFORMED;
      } else if (msg == 1 && pos == 1) {
        want_step = R1, counted = &r, reason = ST_DROP_HS_KEY_ID;
      } else if (msg == 1) { /* e or mac1 itself: mac1 fails */
        want_step = R1, counted = &r, reason = ST_DROP_HS_MAC;
      } else if (msg == 3) {
        want_step = R3, counted = &r;
      }
      ck_assert_msg(step == want_step, "msg%d flip at %zu: failed at %d", msg,
                    pos, step);
      ck_assert_msg(
          counted->c.drops[reason] == 1 && total(&i.c) + total(&r.c) == 1,
          "msg%d flip at %zu: not counted as %s", msg, pos,
          st_crypto_drop_name(reason));
      check_dead(counted);
      st_handshake_wipe(&i.hs);
      st_handshake_wipe(&r.hs);
    }
  }
}
END_TEST

/* A recorded msg1 and msg3 replayed to a new responder: it answers msg1
 * with a fresh ephemeral key, so the old msg3 no longer opens, and nobody
 * without the initiator's ephemeral secret can open its msg2. */
typedef struct {
  st_hs_msg1_t m1;
  st_hs_msg3_t m3;
} record_t;

static void recorder(int msg, uint8_t* bytes, size_t n, void* ctx) {
  record_t* rec = ctx;
  if (msg == 1)
    memcpy(&rec->m1, bytes, n);
  if (msg == 3)
    memcpy(&rec->m3, bytes, n);
}

START_TEST(test_replayed_messages) {
  record_t rec;
  side_t i, r;
  side_init(&i, &id_i, &ring_a, NULL, ST_HS_INITIATOR);
  side_init(&r, &id_r, &ring_a, NULL, ST_HS_RESPONDER);
  int step;
  ck_assert_int_eq(run(&i, &r, recorder, &rec, &step), 0);

  side_t r2, attacker;
  side_init(&r2, &id_r, &ring_a, NULL, ST_HS_RESPONDER);
  /* The attacker is a cluster member with its own identity. */
  side_init(&attacker, &id_m, &ring_a, NULL, ST_HS_INITIATOR);
  st_hs_msg1_t own;
  ck_assert_int_eq(st_handshake_write_msg1(&attacker.hs, &own), 0);
  st_hs_msg2_t m2;
  ck_assert_int_eq(st_handshake_read_msg1(&r2.hs, &rec.m1), 0);
  ck_assert_int_eq(st_handshake_write_msg2(&r2.hs, &m2), 0);
  ck_assert_int_eq(st_handshake_read_msg2(&attacker.hs, &m2), -EBADMSG);
  ck_assert_uint_eq(attacker.c.drops[ST_DROP_HS_AUTH], 1);
  ck_assert_int_eq(st_handshake_read_msg3(&r2.hs, &rec.m3), -EBADMSG);
  ck_assert_uint_eq(r2.c.drops[ST_DROP_HS_AUTH], 1);
  check_dead(&r2);
}
END_TEST

/* ---- Men in the middle ------------------------------------------------------
 */

/* M, a cluster member, stands between I and R. _i selects what it does:
 * 0 presents its own identity to I, which has an allow-list of R only;
 * 1 presents its own identity to R, which has an allow-list of I only;
 * 2 claims R's public key to I, signing with its own secret key;
 * 3 claims I's public key to R, signing with its own secret key;
 * 4 presents its own identity to I without allow-lists: the handshake
 *   completes, but with M, and I learns M's id, not R's. */
START_TEST(test_mitm) {
  const st_identity_t* only_r[1] = {&id_r};
  const st_identity_t* only_i[1] = {&id_i};
  st_allowlist_t* allow_r = allow_of(only_r, 1);
  st_allowlist_t* allow_i = allow_of(only_i, 1);
  st_identity_t fake = id_m; /* M's secret key under someone else's name */
  memcpy(fake.public_key, _i == 2 ? id_r.public_key : id_i.public_key, 32);
  st_node_id_from_public_key(fake.public_key, &fake.id);
  side_t victim, m;
  int step, rc;
  bool victim_is_i = _i == 0 || _i == 2 || _i == 4;
  st_identity_t* as = _i >= 2 && _i <= 3 ? &fake : &id_m;
  if (victim_is_i) {
    side_init(&victim, &id_i, &ring_a, _i == 0 ? allow_r : NULL,
              ST_HS_INITIATOR);
    side_init(&m, as, &ring_a, NULL, ST_HS_RESPONDER);
    rc = run(&victim, &m, NULL, NULL, &step);
  } else {
    side_init(&m, as, &ring_a, NULL, ST_HS_INITIATOR);
    side_init(&victim, &id_r, &ring_a, _i == 1 ? allow_i : NULL,
              ST_HS_RESPONDER);
    rc = run(&m, &victim, NULL, NULL, &step);
  }
  switch (_i) {
    case 0:
    case 1:
      ck_assert_int_eq(rc, -EACCES);
      ck_assert_int_eq(step, _i == 0 ? R2 : R3);
      ck_assert_uint_eq(victim.c.drops[ST_DROP_HS_NOT_ALLOWED], 1);
      check_dead(&victim);
      break;
    case 2:
    case 3:
      ck_assert_int_eq(rc, -EBADMSG);
      ck_assert_int_eq(step, _i == 2 ? R2 : R3);
      ck_assert_uint_eq(victim.c.drops[ST_DROP_HS_SIGNATURE], 1);
      check_dead(&victim);
      break;
    default:
      ck_assert_int_eq(rc, 0);
      ck_assert(memcmp(victim.sess.peer_id.b, id_m.id.b, 16) == 0);
      ck_assert(memcmp(victim.sess.peer_id.b, id_r.id.b, 16) != 0);
      break;
  }
  ck_assert_uint_eq(total(&victim.c), _i == 4 ? 0 : 1);
  st_handshake_wipe(&m.hs);
  st_allowlist_free(allow_r);
  st_allowlist_free(allow_i);
}
END_TEST

/* Allow-lists bind in both directions: _i bit 0 -> I's list holds R,
 * bit 1 -> R's list holds I (both sides always have a list). */
START_TEST(test_allowlist_both_ways) {
  bool i_allows_r = _i & 1, r_allows_i = _i & 2;
  const st_identity_t* l_i[2] = {&id_m, &id_r};
  const st_identity_t* l_r[2] = {&id_m, &id_i};
  st_allowlist_t* ai = allow_of(l_i, i_allows_r ? 2 : 1);
  st_allowlist_t* ar = allow_of(l_r, r_allows_i ? 2 : 1);
  side_t i, r;
  side_init(&i, &id_i, &ring_a, ai, ST_HS_INITIATOR);
  side_init(&r, &id_r, &ring_a, ar, ST_HS_RESPONDER);
  int step;
  int rc = run(&i, &r, NULL, NULL, &step);
  if (i_allows_r && r_allows_i) {
    ck_assert_int_eq(rc, 0);
    check_session_pair(&i, &r);
  } else {
    ck_assert_int_eq(rc, -EACCES);
    ck_assert_int_eq(step, i_allows_r ? R3 : R2);
    ck_assert_uint_eq((i_allows_r ? &r : &i)->c.drops[ST_DROP_HS_NOT_ALLOWED],
                      1);
  }
  st_handshake_wipe(&i.hs);
  st_handshake_wipe(&r.hs);
  st_allowlist_free(ai);
  st_allowlist_free(ar);
}
END_TEST

START_TEST(test_self_connection) {
  side_t i, r;
  side_init(&i, &id_i, &ring_a, NULL, ST_HS_INITIATOR);
  side_init(&r, &id_i, &ring_a, NULL, ST_HS_RESPONDER);
  int step;
  ck_assert_int_eq(run(&i, &r, NULL, NULL, &step), -ELOOP);
  ck_assert_int_eq(step, R2);
  ck_assert_uint_eq(i.c.drops[ST_DROP_HS_SELF], 1);
  check_dead(&i);
  st_handshake_wipe(&r.hs);
}
END_TEST

/* Low-order X25519 points as ephemeral keys make the DH all-zero (a
 * contributory failure): refused by the side that computes it, in msg1
 * (_i < 3, at the responder's msg2) or msg2 (_i >= 3, at the initiator). */
static const uint8_t low_order[3][32] = {
    {0}, /* the identity */
    {1}, /* order 4 */
    {0xe0, 0xeb, 0x7a, 0x7c, 0x3b, 0x41, 0xb8, 0xae, 0x16, 0x56, 0xe3,
     0xfa, 0xf1, 0x9f, 0xc4, 0x6a, 0xda, 0x09, 0x8d, 0xeb, 0x9c, 0x32,
     0xb1, 0xfd, 0x86, 0x62, 0x05, 0x16, 0x5f, 0x49, 0xb8, 0x00}, /* order 8 */
};

static void low_order_e(int msg, uint8_t* bytes, size_t n, void* ctx) {
  const int* which = ctx;
  if (msg == 1 && *which < 3) {
    st_hs_msg1_t* m = (st_hs_msg1_t*) bytes; /* an initiator with the key */
    memcpy(m->ephemeral, low_order[*which], 32);
    st_handshake_msg1_mac(&key_a, m, m->mac);
  }
  if (msg == 2 && *which >= 3)
    memcpy(bytes, low_order[*which - 3], 32);
}

START_TEST(test_low_order_ephemeral) {
  side_t i, r;
  side_init(&i, &id_i, &ring_a, NULL, ST_HS_INITIATOR);
  side_init(&r, &id_r, &ring_a, NULL, ST_HS_RESPONDER);
  int step, which = _i;
  ck_assert_int_eq(run(&i, &r, low_order_e, &which, &step), -EBADMSG);
  side_t* counted = _i < 3 ? &r : &i;
  ck_assert_int_eq(step, _i < 3 ? W2 : R2);
  ck_assert_uint_eq(counted->c.drops[ST_DROP_HS_MALFORMED], 1);
  ck_assert_uint_eq(total(&i.c) + total(&r.c), 1);
  check_dead(counted);
  st_handshake_wipe(&i.hs);
  st_handshake_wipe(&r.hs);
}
END_TEST

/* ---- Protocol order ---------------------------------------------------------
 */

/* Each case: a role, the calls made in order (W1..R3 as above, FIN for
 * finish), and the index of the call that must fail with -EPROTO. */
enum { FIN = FIN_I };
static const struct {
  st_hs_role_t role;
  int calls[4];
  int n, bad;
} order_cases[] = {
    {ST_HS_INITIATOR, {R1}, 1, 0},
    {ST_HS_INITIATOR, {W2}, 1, 0},
    {ST_HS_INITIATOR, {R2}, 1, 0},
    {ST_HS_INITIATOR, {W1, W1}, 2, 1},
    {ST_HS_INITIATOR, {W1, W3}, 2, 1},
    {ST_HS_INITIATOR, {W1, FIN}, 2, 1},
    {ST_HS_INITIATOR, {FIN}, 1, 0},
    {ST_HS_RESPONDER, {W1}, 1, 0},
    {ST_HS_RESPONDER, {W2}, 1, 0},
    {ST_HS_RESPONDER, {R3}, 1, 0},
    {ST_HS_RESPONDER, {R1, R1}, 2, 1},
    {ST_HS_RESPONDER, {R1, W2, FIN}, 3, 2},
    {ST_HS_RESPONDER, {R1, W2, W2}, 3, 2},
};

START_TEST(test_out_of_order) {
  /* A genuine peer provides the messages a call needs. */
  side_t peer, s;
  st_hs_role_t role = order_cases[_i].role;
  side_init(&peer, &id_r, &ring_a, NULL,
            role == ST_HS_INITIATOR ? ST_HS_RESPONDER : ST_HS_INITIATOR);
  side_init(&s, &id_i, &ring_a, NULL, role);
  st_hs_msg1_t m1;
  memset(&m1, 0, sizeof(m1));
  st_hs_msg2_t m2;
  memset(&m2, 0, sizeof(m2));
  st_hs_msg3_t m3;
  memset(&m3, 0, sizeof(m3));
  if (role == ST_HS_RESPONDER)
    ck_assert_int_eq(st_handshake_write_msg1(&peer.hs, &m1), 0);
  for (int k = 0; k < order_cases[_i].n; k++) {
    int rc = 0;
    switch (order_cases[_i].calls[k]) {
      case W1:
        rc = st_handshake_write_msg1(&s.hs, &m1);
        break;
      case R1:
        rc = st_handshake_read_msg1(&s.hs, &m1);
        break;
      case W2:
        rc = st_handshake_write_msg2(&s.hs, &m2);
        break;
      case R2:
        rc = st_handshake_read_msg2(&s.hs, &m2);
        break;
      case W3:
        rc = st_handshake_write_msg3(&s.hs, &m3);
        break;
      case R3:
        rc = st_handshake_read_msg3(&s.hs, &m3);
        break;
      default:
        rc = st_handshake_finish(&s.hs, &s.sess);
        break;
    }
    if (k < order_cases[_i].bad) {
      ck_assert_msg(rc == 0, "case %d call %d: %d", _i, k, rc);
    } else {
      ck_assert_msg(rc == -EPROTO, "case %d call %d: %d", _i, k, rc);
    }
  }
  ck_assert_uint_eq(s.c.drops[ST_DROP_HS_MALFORMED], 1);
  check_dead(&s);
  st_handshake_wipe(&peer.hs);
}
END_TEST

START_TEST(test_bad_version_and_args) {
  side_t r;
  side_init(&r, &id_r, &ring_a, NULL, ST_HS_RESPONDER);
  st_hs_msg1_t m1 = {.version = ST_HS_VERSION + 1, .key_id = key_a.id};
  ck_assert_int_eq(st_handshake_read_msg1(&r.hs, &m1), -EBADMSG);
  ck_assert_uint_eq(r.c.drops[ST_DROP_HS_MALFORMED], 1);
  check_dead(&r);
  st_handshake_t hs;
  ck_assert_int_eq(
      st_handshake_init(&hs, ST_HS_INITIATOR, NULL, &ring_a, NULL, NULL),
      -EINVAL);
  ck_assert_int_eq(
      st_handshake_init(&hs, (st_hs_role_t) 7, &id_i, &ring_a, NULL, NULL),
      -EINVAL);
  ck_assert(all_zero(&hs, sizeof(hs)));
  ck_assert_int_eq(st_handshake_write_msg1(NULL, &m1), -EINVAL);
}
END_TEST

/* A NULL message or output at each step of a genuine handshake: -EINVAL,
 * and the state is wiped like after any failure (crypto.h), though no
 * counter moves (a programmer error, not the peer's doing). _i is the
 * step (W1 .. FIN_R) called with NULL after the steps before it ran. */
START_TEST(test_null_args_wipe) {
  side_t i, r;
  side_init(&i, &id_i, &ring_a, NULL, ST_HS_INITIATOR);
  side_init(&r, &id_r, &ring_a, NULL, ST_HS_RESPONDER);
  st_hs_msg1_t m1;
  st_hs_msg2_t m2;
  st_hs_msg3_t m3;
  int bad = W1 + _i;
  side_t* victim = NULL;
  for (int step = W1; step <= bad; step++) {
    bool null = step == bad;
    int rc = 0;
    switch (step) {
      case W1:
        rc = st_handshake_write_msg1(&i.hs, null ? NULL : &m1);
        victim = &i;
        break;
      case R1:
        rc = st_handshake_read_msg1(&r.hs, null ? NULL : &m1);
        victim = &r;
        break;
      case W2:
        rc = st_handshake_write_msg2(&r.hs, null ? NULL : &m2);
        victim = &r;
        break;
      case R2:
        rc = st_handshake_read_msg2(&i.hs, null ? NULL : &m2);
        victim = &i;
        break;
      case W3:
        rc = st_handshake_write_msg3(&i.hs, null ? NULL : &m3);
        victim = &i;
        break;
      case R3:
        rc = st_handshake_read_msg3(&r.hs, null ? NULL : &m3);
        victim = &r;
        break;
      case FIN_I:
        rc = st_handshake_finish(&i.hs, null ? NULL : &i.sess);
        victim = &i;
        break;
      default:
        rc = st_handshake_finish(&r.hs, null ? NULL : &r.sess);
        victim = &r;
        break;
    }
    ck_assert_msg(rc == (null ? -EINVAL : 0), "step %d: %d", step, rc);
  }
  ck_assert_uint_eq(total(&i.c) + total(&r.c), 0);
  check_dead(victim);
  st_handshake_wipe(&i.hs);
  st_handshake_wipe(&r.hs);
  st_session_wipe(&i.sess);
  st_session_wipe(&r.sess);
}
END_TEST

static Suite* handshake_suite(void) {
  Suite* s = suite_create("crypto_handshake");
  TCase* tc = tcase_create("handshake");
  tcase_add_unchecked_fixture(tc, setup, NULL);
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_complete, 0,
                      (int) (sizeof(ok_cases) / sizeof(ok_cases[0])));
  tcase_add_loop_test(tc, test_wrong_cluster_key, 0, 2);
  tcase_add_test(tc, test_mac1_known_answer);
  tcase_add_loop_test(tc, test_flip_every_byte, 0, 3);
  tcase_add_test(tc, test_replayed_messages);
  tcase_add_loop_test(tc, test_mitm, 0, 5);
  tcase_add_loop_test(tc, test_allowlist_both_ways, 0, 4);
  tcase_add_test(tc, test_self_connection);
  tcase_add_loop_test(tc, test_low_order_ephemeral, 0, 6);
  tcase_add_loop_test(tc, test_out_of_order, 0,
                      (int) (sizeof(order_cases) / sizeof(order_cases[0])));
  tcase_add_test(tc, test_bad_version_and_args);
  tcase_add_loop_test(tc, test_null_args_wipe, 0, FIN_R - W1 + 1);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(handshake_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
