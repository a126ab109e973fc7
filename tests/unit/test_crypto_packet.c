/* test_crypto_packet.c: Check suite for sealed UDP packets and replay
 * windows (crypto/packet.c, crypto/replay.c; crypto.h "UDP packets",
 * RFC 6479): round trips at every size boundary, a flipped byte at every
 * position counted under its reason, wrong keys, packets redirected to
 * another receiver, receiver kinds, replays, boot epochs, the window
 * edges, key rotation, a bounded sender table with deletion against a
 * reference model, and known answers computed with libsodium's raw AEAD. */
#include <check.h>
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crypto/crypto.h"
#include "crypto/packet_internal.h"
#include "tests/unit/testutil.h"

typedef struct {
  st_cluster_key_t key;
  st_keyring_t ring;
  st_identity_t id;
  st_packet_sealer_t sealer;
  st_node_id_t to; /* the receiver: the id packets are sealed for */
  st_replay_table_t* table;
  st_crypto_counters_t c;
} fixture_t;

static void fixture_init(fixture_t* f, size_t max_senders) {
  memset(f, 0, sizeof(*f));
  ck_assert_int_eq(st_crypto_init(), 0);
  ck_assert_int_eq(st_cluster_key_generate(&f->key), 0);
  ck_assert_int_eq(st_keyring_init(&f->ring, &f->key, NULL, NULL, 0), 0);
  ck_assert_int_eq(st_identity_generate(&f->id), 0);
  f->sealer.keys = &f->ring;
  f->sealer.identity = &f->id;
  f->sealer.boot_epoch = 1000;
  st_identity_t receiver;
  ck_assert_int_eq(st_identity_generate(&receiver), 0);
  f->to = receiver.id;
  st_identity_wipe(&receiver);
  ck_assert_int_eq(st_replay_table_new(max_senders, &f->table), 0);
}

static void fixture_close(fixture_t* f) {
  st_replay_table_free(f->table);
  st_keyring_wipe(&f->ring);
}

static uint64_t total_drops(const st_crypto_counters_t* c) {
  uint64_t n = 0;
  for (int i = 0; i < ST_CRYPTO_DROP_COUNT; i++)
    n += c->drops[i];
  return n;
}

/* Seals a packet with the given counter and epoch. */
static size_t seal_at(fixture_t* f, uint64_t epoch, uint64_t counter,
                      const uint8_t* msg, size_t len, uint8_t* out) {
  size_t n = 0;
  f->sealer.boot_epoch = epoch;
  f->sealer.counter = counter;
  ck_assert_int_eq(st_packet_seal(&f->sealer, &f->to, msg, len, out,
                                  ST_PACKET_MAX_BYTES, &n),
                   0);
  return n;
}

static int open_pkt(fixture_t* f, const uint8_t* pkt, size_t n) {
  uint8_t plain[ST_PACKET_MAX_BYTES];
  size_t plen = 0;
  st_packet_header_t hdr;
  return st_packet_open(&f->ring, &f->to, NULL, f->table, &f->c, pkt, n, plain,
                        sizeof(plain), &plen, &hdr);
}

/* ---- Round trips ------------------------------------------------------------
 */

static const size_t sizes[] = {
    0, 1, 2, 100, ST_PACKET_MAX_PLAINTEXT - 1, ST_PACKET_MAX_PLAINTEXT};

START_TEST(test_round_trip) {
  fixture_t f;
  fixture_init(&f, 4);
  size_t len = sizes[_i];
  uint8_t msg[ST_PACKET_MAX_PLAINTEXT];
  randombytes_buf(msg, sizeof(msg));
  uint8_t pkt[ST_PACKET_MAX_BYTES];
  size_t n = 0;
  f.sealer.counter = 7;
  ck_assert_int_eq(
      st_packet_seal(&f.sealer, &f.to, msg, len, pkt, sizeof(pkt), &n), 0);
  ck_assert_uint_eq(n, len + ST_PACKET_OVERHEAD);
  ck_assert_uint_eq(f.sealer.counter, 8);
  uint8_t plain[ST_PACKET_MAX_PLAINTEXT + 1];
  size_t plen = 99;
  st_packet_header_t hdr;
  ck_assert_int_eq(st_packet_open(&f.ring, &f.to, NULL, f.table, &f.c, pkt, n,
                                  plain, sizeof(plain), &plen, &hdr),
                   0);
  ck_assert_uint_eq(plen, len);
  ck_assert(len == 0 || memcmp(plain, msg, len) == 0);
  ck_assert(memcmp(hdr.sender.b, f.id.id.b, ST_NODE_ID_BYTES) == 0);
  ck_assert_uint_eq(hdr.boot_epoch, 1000);
  ck_assert_uint_eq(hdr.counter, 7);
  ck_assert_uint_eq(hdr.key_id, f.key.id);
  ck_assert_uint_eq(hdr.to_kind, ST_PACKET_TO_NODE);
  ck_assert_uint_eq(total_drops(&f.c), 0);
  fixture_close(&f);
}
END_TEST

START_TEST(test_seal_limits) {
  fixture_t f;
  fixture_init(&f, 4);
  static uint8_t msg[ST_PACKET_MAX_PLAINTEXT + 1];
  uint8_t pkt[ST_PACKET_MAX_BYTES + 64];
  size_t n = 0;
  ck_assert_int_eq(
      st_packet_seal(&f.sealer, &f.to, msg, ST_PACKET_MAX_PLAINTEXT + 1, pkt,
                     sizeof(pkt), &n),
      -EMSGSIZE);
  ck_assert_int_eq(st_packet_seal(&f.sealer, &f.to, msg, 10, pkt,
                                  10 + ST_PACKET_OVERHEAD - 1, &n),
                   -EINVAL);
  /* An all-zero receiver id is refused: "unknown" is said with NULL. */
  st_node_id_t zero = {{0}};
  ck_assert_int_eq(
      st_packet_seal(&f.sealer, &zero, msg, 10, pkt, sizeof(pkt), &n), -EINVAL);
  ck_assert_uint_eq(f.sealer.counter, 0);
  f.sealer.counter = UINT64_MAX;
  ck_assert_int_eq(
      st_packet_seal(&f.sealer, &f.to, msg, 10, pkt, sizeof(pkt), &n),
      -EOVERFLOW);
  ck_assert_uint_eq(f.sealer.counter, UINT64_MAX);
  /* Opening needs the receiver's own id. */
  uint8_t plain[ST_PACKET_MAX_BYTES];
  size_t plen;
  st_packet_header_t hdr;
  ck_assert_int_eq(
      st_packet_open(&f.ring, NULL, NULL, f.table, &f.c, pkt,
                     ST_PACKET_OVERHEAD, plain, sizeof(plain), &plen, &hdr),
      -EINVAL);
  ck_assert_uint_eq(total_drops(&f.c), 0);
  fixture_close(&f);
}
END_TEST

static const struct {
  size_t len;
  st_crypto_drop_t reason;
  int rc;
} length_cases[] = {
    {0, ST_DROP_PACKET_SHORT, -EBADMSG},
    {1, ST_DROP_PACKET_SHORT, -EBADMSG},
    {ST_PACKET_OVERHEAD - 1, ST_DROP_PACKET_SHORT, -EBADMSG},
    {ST_PACKET_MAX_BYTES + 1, ST_DROP_PACKET_LONG, -EMSGSIZE},
    {4096, ST_DROP_PACKET_LONG, -EMSGSIZE},
};

START_TEST(test_open_lengths) {
  fixture_t f;
  fixture_init(&f, 4);
  static uint8_t pkt[4096];
  /* A valid header, so that only the length is wrong. */
  uint8_t msg[1] = {0};
  seal_at(&f, 1, 0, msg, 0, pkt);
  ck_assert_int_eq(open_pkt(&f, pkt, length_cases[_i].len),
                   length_cases[_i].rc);
  ck_assert_uint_eq(f.c.drops[length_cases[_i].reason], 1);
  ck_assert_uint_eq(total_drops(&f.c), 1);
  fixture_close(&f);
}
END_TEST

/* ---- Tampering --------------------------------------------------------------
 */

static uint64_t le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v |= (uint64_t) p[i] << (8 * i);
  return v;
}

/* A flip at every position, with several masks, against a sender whose
 * window holds counters 0..9 except 5, epoch 1000; the packet under test
 * has counter 10. The expected reason follows the open order: version,
 * key id, receiver kind, the sender id against its public key, replay
 * check on the (altered) epoch and counter, then the tag (a kind flipped
 * from "this node" to "unknown" changes the associated data, so it fails
 * there), then the signature. */
START_TEST(test_flip_every_byte) {
  static const uint8_t masks[] = {0x01, 0x02, 0x0f, 0x80, 0xff};
  fixture_t f;
  fixture_init(&f, 4);
  uint8_t msg[40];
  randombytes_buf(msg, sizeof(msg));
  uint8_t pkt[ST_PACKET_MAX_BYTES];
  for (uint64_t k = 0; k < 10; k++) {
    size_t m = seal_at(&f, 1000, k, msg, sizeof(msg), pkt);
    if (k != 5)
      ck_assert_int_eq(open_pkt(&f, pkt, m), 0);
  }
  size_t n = seal_at(&f, 1000, 10, msg, sizeof(msg), pkt);
  st_crypto_counters_t want = {{0}};
  for (size_t pos = 0; pos < n; pos++) {
    for (size_t mi = 0; mi < sizeof(masks); mi++) {
      uint8_t bad[ST_PACKET_MAX_BYTES];
      memcpy(bad, pkt, n);
      bad[pos] ^= masks[mi];
      st_crypto_drop_t r = ST_DROP_PACKET_AUTH;
      if (pos == 0) {
        r = ST_DROP_PACKET_VERSION;
      } else if (pos == 1) {
        r = ST_DROP_PACKET_KEY_ID;
      } else if (pos == 2) {
        if (bad[2] > ST_PACKET_TO_UNKNOWN)
          r = ST_DROP_PACKET_VERSION;
      } else if (pos >= 3 && pos < 19) {
        r = ST_DROP_PACKET_SIGNATURE; /* the id is not its key's */
      } else if (pos >= 19 && pos < 27) {
        if (le64(bad + 19) < 1000)
          r = ST_DROP_PACKET_OLD_EPOCH;
      } else if (pos >= 27 && pos < 35) {
        uint64_t ctr = le64(bad + 27);
        if (ctr < 10 && ctr != 5)
          r = ST_DROP_PACKET_REPLAY;
      } else if (pos >= 35 && pos < 67) {
        r = ST_DROP_PACKET_SIGNATURE; /* the key is not the id's */
      } else if (pos >= n - ST_PACKET_SIGNATURE_BYTES) {
        r = ST_DROP_PACKET_SIGNATURE; /* the tag holds, the signature not */
      }
      want.drops[r]++;
      int rc = open_pkt(&f, bad, n);
      ck_assert_msg(rc < 0, "flip at %zu mask %02x accepted", pos, masks[mi]);
      ck_assert_msg(f.c.drops[r] == want.drops[r],
                    "flip at %zu mask %02x: not counted as %s", pos, masks[mi],
                    st_crypto_drop_name(r));
    }
  }
  ck_assert(memcmp(&want, &f.c, sizeof(want)) == 0);
  /* Every reason the header can produce occurred. */
  ck_assert_uint_gt(want.drops[ST_DROP_PACKET_OLD_EPOCH], 0);
  ck_assert_uint_gt(want.drops[ST_DROP_PACKET_REPLAY], 0);
  ck_assert_uint_gt(want.drops[ST_DROP_PACKET_SIGNATURE], 0);
  /* The failures moved no window: the original opens, once. */
  ck_assert_int_eq(open_pkt(&f, pkt, n), 0);
  ck_assert_int_eq(open_pkt(&f, pkt, n), -EALREADY);
  fixture_close(&f);
}
END_TEST

/* Another cluster key: with another key id it is refused by id; with a
 * key id forced equal (as if by the 1-in-256 chance) it fails the tag. */
START_TEST(test_wrong_cluster_key) {
  fixture_t f;
  fixture_init(&f, 4);
  uint8_t pkt[ST_PACKET_MAX_BYTES];
  uint8_t msg[8] = {1, 2, 3};
  size_t n = seal_at(&f, 1, 0, msg, sizeof(msg), pkt);
  st_cluster_key_t other;
  do {
    st_cluster_key_generate(&other);
  } while (other.id == f.key.id);
  bool same_id = _i == 1;
  if (same_id)
    other.id = f.key.id;
  st_keyring_t ring;
  ck_assert_int_eq(st_keyring_init(&ring, &other, NULL, NULL, 0), 0);
  uint8_t plain[ST_PACKET_MAX_BYTES];
  size_t plen;
  st_packet_header_t hdr;
  int rc = st_packet_open(&ring, &f.to, NULL, f.table, &f.c, pkt, n, plain,
                          sizeof(plain), &plen, &hdr);
  ck_assert_int_eq(rc, same_id ? -EBADMSG : -ENOKEY);
  ck_assert_uint_eq(
      f.c.drops[same_id ? ST_DROP_PACKET_AUTH : ST_DROP_PACKET_KEY_ID], 1);
  ck_assert_uint_eq(total_drops(&f.c), 1);
  ck_assert_uint_eq(st__replay_count(f.table), 0); /* nothing was tracked */
  /* The right key still opens it. */
  ck_assert_int_eq(open_pkt(&f, pkt, n), 0);
  st_keyring_wipe(&ring);
  fixture_close(&f);
}
END_TEST

/* A cluster-key holder M speaking for another member V: with V's id
 * beside its own key (the id is not the key's), and with V's id and key
 * but signed with its own (the tag holds, the signature not). Both are
 * dropped as packet_signature, and neither moves V's window, not even with
 * a far-future boot epoch: V's next real packet still opens. */
START_TEST(test_forged_sender_refused) {
  fixture_t f; /* f.id is V */
  fixture_init(&f, 4);
  st_identity_t m;
  ck_assert_int_eq(st_identity_generate(&m), 0);
  uint8_t msg[4] = {1, 2, 3, 4};
  uint8_t pkt[ST_PACKET_MAX_BYTES], nonce[24] = {0};
  size_t n = 0;
  for (int k = 0; k < 2; k++) {
    st_identity_t forged = m;
    forged.id = f.id.id;
    if (k == 1)
      memcpy(forged.public_key, f.id.public_key, ST_PUBLIC_KEY_BYTES);
    st_packet_sealer_t evil = {.keys = &f.ring,
                               .identity = &forged,
                               .boot_epoch = 2000 + (uint64_t) k,
                               .counter = 5};
    nonce[0] = (uint8_t) k;
    ck_assert_int_eq(
        st__packet_seal_with_nonce(&evil, &f.to, nonce, msg, sizeof(msg), pkt,
                                   sizeof(pkt), &n),
        0);
    ck_assert_int_eq(open_pkt(&f, pkt, n), -EBADMSG);
  }
  ck_assert_uint_eq(f.c.drops[ST_DROP_PACKET_SIGNATURE], 2);
  ck_assert_uint_eq(total_drops(&f.c), 2);
  ck_assert_uint_eq(st__replay_count(f.table), 0);
  /* V itself, at its real boot epoch and that counter: accepted. */
  size_t len = seal_at(&f, 1000, 5, msg, sizeof(msg), pkt);
  uint8_t plain[ST_PACKET_MAX_BYTES];
  size_t plen;
  st_packet_header_t hdr;
  ck_assert_int_eq(st_packet_open(&f.ring, &f.to, NULL, f.table, &f.c, pkt, len,
                                  plain, sizeof(plain), &plen, &hdr),
                   0);
  ck_assert(memcmp(hdr.sender_key, f.id.public_key, ST_PUBLIC_KEY_BYTES) == 0);
  st_identity_wipe(&m);
  fixture_close(&f);
}
END_TEST

/* An allow-list: a packet signed by a key not on it is dropped as
 * packet_not_allowed, after authentication and before its sender takes a
 * place in the replay table, and before its signature is verified (a bad
 * signature from an unlisted key is counted not_allowed, not signature);
 * a listed key's packet opens. */
START_TEST(test_allow_list) {
  fixture_t f;
  fixture_init(&f, 4);
  st_identity_t listed;
  ck_assert_int_eq(st_identity_generate(&listed), 0);
  char dir[512], path[600], line[64];
  ck_assert_int_eq(tu_mkdtemp(dir, sizeof(dir)), 0);
  snprintf(path, sizeof(path), "%s/allow", dir);
  st_public_key_format(listed.public_key, line);
  strcat(line, "\n");
  ck_assert_int_eq(tu_write_file(path, line, strlen(line)), 0);
  st_allowlist_t* allow = NULL;
  char err[256] = "";
  ck_assert_msg(st_allowlist_load(path, &allow, err, sizeof(err)) == 0, "%s",
                err);
  tu_rmtree(dir);
  uint8_t msg[3] = {7, 7, 7}, pkt[ST_PACKET_MAX_BYTES],
          plain[ST_PACKET_MAX_BYTES];
  size_t n = seal_at(&f, 1, 0, msg, sizeof(msg), pkt), plen;
  st_packet_header_t hdr;
  ck_assert_int_eq(st_packet_open(&f.ring, &f.to, allow, f.table, &f.c, pkt, n,
                                  plain, sizeof(plain), &plen, &hdr),
                   -EACCES);
  ck_assert_uint_eq(f.c.drops[ST_DROP_PACKET_NOT_ALLOWED], 1);
  ck_assert_uint_eq(total_drops(&f.c), 1);
  ck_assert_uint_eq(st__replay_count(f.table), 0);
  n = seal_at(&f, 1, 0, msg, sizeof(msg), pkt);
  pkt[n - 1] ^= 0x01; /* the signature's last byte */
  ck_assert_int_eq(st_packet_open(&f.ring, &f.to, allow, f.table, &f.c, pkt, n,
                                  plain, sizeof(plain), &plen, &hdr),
                   -EACCES);
  ck_assert_uint_eq(f.c.drops[ST_DROP_PACKET_NOT_ALLOWED], 2);
  ck_assert_uint_eq(f.c.drops[ST_DROP_PACKET_SIGNATURE], 0);
  f.sealer.identity = &listed;
  n = seal_at(&f, 1, 0, msg, sizeof(msg), pkt);
  ck_assert_int_eq(st_packet_open(&f.ring, &f.to, allow, f.table, &f.c, pkt, n,
                                  plain, sizeof(plain), &plen, &hdr),
                   0);
  ck_assert_uint_eq(st__replay_count(f.table), 1);
  st_allowlist_free(allow);
  st_identity_wipe(&listed);
  fixture_close(&f);
}
END_TEST

/* ---- Receivers --------------------------------------------------------------
 */

/* The reviewer's cross-node replay: A sends counters 0..9, the even ones
 * to C and the odd ones to B, so C's window has gaps exactly where B's
 * packets are. An outsider who resends B's packets to C must be refused
 * by the tag (the receiver id in the associated data), and the refusals
 * must not move C's window. */
START_TEST(test_redirected_packet_refused) {
  fixture_t f; /* f.table is C's window */
  fixture_init(&f, 4);
  st_identity_t b, c;
  ck_assert_int_eq(st_identity_generate(&b), 0);
  ck_assert_int_eq(st_identity_generate(&c), 0);
  st_replay_table_t* at_b = NULL;
  ck_assert_int_eq(st_replay_table_new(4, &at_b), 0);
  st_crypto_counters_t cb = {{0}};
  enum { N = 10 };
  uint8_t pkt[N][ST_PACKET_MAX_BYTES];
  size_t n[N];
  uint8_t msg[3] = {'m', 's', 'g'};
  uint8_t plain[ST_PACKET_MAX_BYTES];
  size_t plen;
  st_packet_header_t hdr;
  for (int k = 0; k < N; k++) {
    const st_node_id_t* to = (k & 1) ? &b.id : &c.id;
    ck_assert_int_eq(st_packet_seal(&f.sealer, to, msg, sizeof(msg), pkt[k],
                                    sizeof(pkt[k]), &n[k]),
                     0);
    ck_assert_int_eq(st_packet_open(&f.ring, to, NULL, (k & 1) ? at_b : f.table,
                                    (k & 1) ? &cb : &f.c, pkt[k], n[k], plain,
                                    sizeof(plain), &plen, &hdr),
                     0);
  }
  for (int k = 1; k < N; k += 2) {
    ck_assert_int_eq(st_packet_open(&f.ring, &c.id, NULL, f.table, &f.c, pkt[k],
                                    n[k], plain, sizeof(plain), &plen, &hdr),
                     -EBADMSG);
  }
  ck_assert_uint_eq(f.c.drops[ST_DROP_PACKET_AUTH], N / 2);
  ck_assert_uint_eq(total_drops(&f.c), N / 2);
  ck_assert_uint_eq(total_drops(&cb), 0);
  /* C's window did not move: the gaps are still open to A's next packet
   * for C with such a counter (sealed afresh, as A would after a resend). */
  f.sealer.counter = 3;
  ck_assert_int_eq(st_packet_seal(&f.sealer, &c.id, msg, sizeof(msg), pkt[0],
                                  sizeof(pkt[0]), &n[0]),
                   0);
  ck_assert_int_eq(st_packet_open(&f.ring, &c.id, NULL, f.table, &f.c, pkt[0],
                                  n[0], plain, sizeof(plain), &plen, &hdr),
                   0);
  st_replay_table_free(at_b);
  fixture_close(&f);
}
END_TEST

/* Packets for an unknown receiver (a seed's first contact) open at any
 * member and say so in the header; the kind cannot be changed in flight
 * in either direction; an unknown kind is refused before the tag. */
START_TEST(test_receiver_kinds) {
  fixture_t f;
  fixture_init(&f, 4);
  st_identity_t other;
  ck_assert_int_eq(st_identity_generate(&other), 0);
  st_replay_table_t* at_other = NULL;
  ck_assert_int_eq(st_replay_table_new(4, &at_other), 0);
  uint8_t msg[4] = {1, 2, 3, 4};
  uint8_t pkt[ST_PACKET_MAX_BYTES], bad[ST_PACKET_MAX_BYTES];
  uint8_t plain[ST_PACKET_MAX_BYTES];
  size_t n, plen;
  st_packet_header_t hdr;
  ck_assert_int_eq(
      st_packet_seal(&f.sealer, NULL, msg, sizeof(msg), pkt, sizeof(pkt), &n),
      0);
  ck_assert_uint_eq(pkt[2], ST_PACKET_TO_UNKNOWN);
  /* "Unknown" relabelled "this node" fails the tag (and moves nothing). */
  memcpy(bad, pkt, n);
  bad[2] = ST_PACKET_TO_NODE;
  ck_assert_int_eq(open_pkt(&f, bad, n), -EBADMSG);
  ck_assert_uint_eq(f.c.drops[ST_DROP_PACKET_AUTH], 1);
  /* The genuine packet opens at f.to and at another node alike. */
  ck_assert_int_eq(st_packet_open(&f.ring, &f.to, NULL, f.table, &f.c, pkt, n,
                                  plain, sizeof(plain), &plen, &hdr),
                   0);
  ck_assert_uint_eq(hdr.to_kind, ST_PACKET_TO_UNKNOWN);
  ck_assert_int_eq(st_packet_open(&f.ring, &other.id, NULL, at_other, &f.c, pkt,
                                  n, plain, sizeof(plain), &plen, &hdr),
                   0);
  ck_assert_uint_eq(hdr.to_kind, ST_PACKET_TO_UNKNOWN);
  ck_assert_uint_eq(plen, sizeof(msg));
  ck_assert(memcmp(plain, msg, sizeof(msg)) == 0);

  /* "This node" relabelled "unknown" fails the tag too. */
  size_t m = seal_at(&f, 1000, 50, msg, sizeof(msg), pkt);
  memcpy(bad, pkt, m);
  bad[2] = ST_PACKET_TO_UNKNOWN;
  ck_assert_int_eq(open_pkt(&f, bad, m), -EBADMSG);
  ck_assert_uint_eq(f.c.drops[ST_DROP_PACKET_AUTH], 2);

  /* Kinds this version does not know: counted as a version mismatch. */
  static const uint8_t kinds[] = {2, 3, 0x80, 0xff};
  for (size_t i = 0; i < sizeof(kinds); i++) {
    bad[2] = kinds[i];
    ck_assert_int_eq(open_pkt(&f, bad, m), -EBADMSG);
  }
  ck_assert_uint_eq(f.c.drops[ST_DROP_PACKET_VERSION], sizeof(kinds));
  ck_assert_uint_eq(total_drops(&f.c), 2 + sizeof(kinds));
  /* Nothing moved the window: the genuine packet opens once. */
  ck_assert_int_eq(open_pkt(&f, pkt, m), 0);
  ck_assert_int_eq(open_pkt(&f, pkt, m), -EALREADY);
  st_replay_table_free(at_other);
  st_identity_wipe(&other);
  fixture_close(&f);
}
END_TEST

/* ---- Replay windows ---------------------------------------------------------
 */

/* Sequences of (epoch, counter) opened in order, with the expected answer
 * of each. */
typedef struct {
  uint64_t epoch, counter;
  int rc;
} step_t;

static const struct {
  const char* name;
  step_t steps[8];
  int n;
} window_cases[] = {
    {"replay", {{1, 0, 0}, {1, 0, -EALREADY}}, 2},
    {"old epoch", {{5, 3, 0}, {4, 9, -ESTALE}, {4, 0, -ESTALE}}, 3},
    {"new epoch resets",
     {{1, 500, 0}, {2, 0, 0}, {2, 0, -EALREADY}, {1, 501, -ESTALE}, {2, 1, 0}},
     5},
    {"out of order within the window, once",
     {{1, 10, 0}, {1, 7, 0}, {1, 9, 0}, {1, 7, -EALREADY}, {1, 10, -EALREADY}},
     5},
    {"window edge",
     {{1, 2000, 0},
      {1, 2000 - ST_REPLAY_WINDOW + 1, 0},
      {1, 2000 - ST_REPLAY_WINDOW, -EALREADY},
      {1, 0, -EALREADY}},
     4},
    {"far jump clears the ring",
     {{1, 5, 0}, {1, 100000, 0}, {1, 100000 - 64, 0}, {1, 5, -EALREADY}},
     4},
    {"one block ahead keeps the block behind",
     {{1, 63, 0},
      {1, 64, 0},
      {1, 0, 0},
      {1, 63, -EALREADY},
      {1, 1087, 0},
      {1, 64, -EALREADY},
      {1, 63, -EALREADY}},
     7},
    /* The highest counter's block and the oldest block of the window are
     * different ring slots (a 16-block ring would reuse it and forget 1). */
    {"the ring has one block more than the window",
     {{1, 1, 0}, {1, 1024, 0}, {1, 1, -EALREADY}, {1, 2, 0}, {1, 1025, 0}},
     5},
    /* The sealer stops at UINT64_MAX - 1 (test_seal_limits). */
    {"counter near its maximum",
     {{1, UINT64_MAX - 2, 0},
      {1, UINT64_MAX - 1, 0},
      {1, UINT64_MAX - 1, -EALREADY},
      {1, UINT64_MAX - 2, -EALREADY},
      {1, UINT64_MAX - 1 - ST_REPLAY_WINDOW, -EALREADY}},
     5},
};

START_TEST(test_window) {
  fixture_t f;
  fixture_init(&f, 4);
  uint8_t pkt[ST_PACKET_MAX_BYTES];
  uint8_t msg[3] = {9, 8, 7};
  st_crypto_counters_t want = {{0}};
  for (int s = 0; s < window_cases[_i].n; s++) {
    const step_t* st = &window_cases[_i].steps[s];
    size_t n = seal_at(&f, st->epoch, st->counter, msg, sizeof(msg), pkt);
    ck_assert_msg(open_pkt(&f, pkt, n) == st->rc, "%s: step %d",
                  window_cases[_i].name, s);
    if (st->rc == -EALREADY)
      want.drops[ST_DROP_PACKET_REPLAY]++;
    if (st->rc == -ESTALE)
      want.drops[ST_DROP_PACKET_OLD_EPOCH]++;
  }
  ck_assert(memcmp(&want, &f.c, sizeof(want)) == 0);
  fixture_close(&f);
}
END_TEST

/* Shuffled delivery of 0..N-1: each accepted exactly once. */
START_TEST(test_shuffled_once) {
  fixture_t f;
  fixture_init(&f, 4);
  enum { N = ST_REPLAY_WINDOW };
  static uint8_t pkts[N][ST_PACKET_OVERHEAD + 4];
  size_t n = 0;
  uint8_t msg[4] = {0};
  for (int k = 0; k < N; k++)
    n = seal_at(&f, 3, (uint64_t) k, msg, sizeof(msg), pkts[k]);
  static int order[N];
  for (int k = 0; k < N; k++)
    order[k] = k;
  st_rng_t rng;
  st_rng_seed(&rng, tu_seed());
  for (int k = N - 1; k > 0; k--) {
    int j = (int) st_rng_below(&rng, (uint64_t) k + 1);
    int t = order[k];
    order[k] = order[j];
    order[j] = t;
  }
  for (int k = 0; k < N; k++)
    ck_assert_int_eq(open_pkt(&f, pkts[order[k]], n), 0);
  for (int k = 0; k < N; k++)
    ck_assert_int_eq(open_pkt(&f, pkts[k], n), -EALREADY);
  ck_assert_uint_eq(f.c.drops[ST_DROP_PACKET_REPLAY], N);
  fixture_close(&f);
}
END_TEST

/* ---- Key rotation -----------------------------------------------------------
 */

START_TEST(test_rotation) {
  fixture_t f; /* f.ring holds only the old key */
  fixture_init(&f, 4);
  st_cluster_key_t fresh;
  do {
    st_cluster_key_generate(&fresh);
  } while (fresh.id == f.key.id);
  st_keyring_t both;
  ck_assert_int_eq(st_keyring_init(&both, &fresh, &f.key, NULL, 0), 0);
  uint8_t msg[5] = {1, 2, 3, 4, 5};
  uint8_t pkt[ST_PACKET_MAX_BYTES], plain[ST_PACKET_MAX_BYTES];
  size_t plen;
  st_packet_header_t hdr;
  /* A node still on the old key: opened with the previous key. */
  size_t n = seal_at(&f, 1, 0, msg, sizeof(msg), pkt);
  ck_assert_int_eq(st_packet_open(&both, &f.to, NULL, f.table, &f.c, pkt, n,
                                  plain, sizeof(plain), &plen, &hdr),
                   0);
  ck_assert_uint_eq(hdr.key_id, f.key.id);
  /* A node on the new key seals with the current key only... */
  st_packet_sealer_t s2 = {
      .keys = &both, .identity = &f.id, .boot_epoch = 1, .counter = 1};
  ck_assert_int_eq(
      st_packet_seal(&s2, &f.to, msg, sizeof(msg), pkt, sizeof(pkt), &n), 0);
  ck_assert_uint_eq(pkt[1], fresh.id);
  ck_assert_int_eq(st_packet_open(&both, &f.to, NULL, f.table, &f.c, pkt, n,
                                  plain, sizeof(plain), &plen, &hdr),
                   0);
  ck_assert_uint_eq(hdr.key_id, fresh.id);
  /* ...which a node without it cannot open: refused by id, untried. */
  ck_assert_int_eq(open_pkt(&f, pkt, n), -ENOKEY);
  ck_assert_uint_eq(f.c.drops[ST_DROP_PACKET_KEY_ID], 1);
  st_keyring_wipe(&both);
  fixture_close(&f);
}
END_TEST

/* ---- The table of senders ---------------------------------------------------
 */

START_TEST(test_senders_full_and_forget) {
  fixture_t f;
  fixture_init(&f, 3);
  st_identity_t ids[4];
  uint8_t pkt[4][ST_PACKET_MAX_BYTES];
  size_t n[4];
  uint8_t msg[2] = {0};
  for (int k = 0; k < 4; k++) {
    st_identity_generate(&ids[k]);
    f.sealer.identity = &ids[k];
    n[k] = seal_at(&f, 1, 0, msg, sizeof(msg), pkt[k]);
  }
  for (int k = 0; k < 3; k++)
    ck_assert_int_eq(open_pkt(&f, pkt[k], n[k]), 0);
  ck_assert_int_eq(open_pkt(&f, pkt[3], n[3]), -ENOSPC);
  ck_assert_uint_eq(f.c.drops[ST_DROP_PACKET_SENDERS_FULL], 1);
  /* A forged packet cannot take a place either: checked before auth, and
   * tracked senders are never evicted. */
  ck_assert_int_eq(open_pkt(&f, pkt[0], n[0]), -EALREADY);
  st_replay_table_forget(f.table, &ids[1].id);
  st_replay_table_forget(f.table, &ids[1].id); /* twice is harmless */
  ck_assert_uint_eq(st__replay_count(f.table), 2);
  ck_assert_int_eq(open_pkt(&f, pkt[3], n[3]), 0);
  ck_assert_int_eq(open_pkt(&f, pkt[3], n[3]), -EALREADY);
  ck_assert_int_eq(open_pkt(&f, pkt[2], n[2]), -EALREADY);
  ck_assert_int_eq(open_pkt(&f, pkt[1], n[1]), -ENOSPC);
  fixture_close(&f);
}
END_TEST

START_TEST(test_table_bad_args) {
  st_replay_table_t* t = (st_replay_table_t*) 1;
  ck_assert_int_eq(st_replay_table_new(0, &t), -EINVAL);
  ck_assert_ptr_null(t);
  ck_assert_int_eq(st_replay_table_new((size_t) 1 << 40, &t), -EINVAL);
  st_replay_table_free(NULL);
}
END_TEST

/* The table against a plain model under random operations, with forgets
 * (which exercise backward-shift deletion) and far jumps. The model states
 * the rules of replay.c directly, over a plain array of seen counters. */
enum { MODEL_SENDERS = 12, MODEL_MAX = 8, MODEL_SPAN = 1 << 16 };
typedef struct {
  bool tracked;
  uint64_t epoch, highest;
  uint8_t seen[MODEL_SPAN];
} model_t;

static int model_decide(const model_t* m, int tracked, uint64_t e, uint64_t c) {
  if (!m->tracked)
    return tracked < MODEL_MAX ? 0 : -ENOSPC;
  if (e < m->epoch)
    return -ESTALE;
  if (e > m->epoch || c > m->highest)
    return 0;
  if (m->highest - c >= ST_REPLAY_WINDOW || m->seen[c])
    return -EALREADY;
  return 0;
}

START_TEST(test_table_model) {
  static model_t m[MODEL_SENDERS];
  memset(m, 0, sizeof(m));
  st_node_id_t ids[MODEL_SENDERS];
  for (int s = 0; s < MODEL_SENDERS; s++)
    randombytes_buf(ids[s].b, sizeof(ids[s].b));
  st_replay_table_t* t;
  ck_assert_int_eq(st_crypto_init(), 0);
  ck_assert_int_eq(st_replay_table_new(MODEL_MAX, &t), 0);
  st_rng_t rng;
  st_rng_seed(&rng, tu_seed() + (uint64_t) _i);
  int tracked = 0;
  long outcomes[4] = {0};
  for (int op = 0; op < 40000; op++) {
    int s = (int) st_rng_below(&rng, MODEL_SENDERS);
    model_t* ms = &m[s];
    if (st_rng_below(&rng, 200) == 0) {
      st_replay_table_forget(t, &ids[s]);
      if (ms->tracked)
        tracked--;
      memset(ms, 0, sizeof(*ms));
      continue;
    }
    uint64_t e = ms->epoch, c;
    uint64_t r = st_rng_below(&rng, 100);
    if (!ms->tracked)
      c = st_rng_below(&rng, 3000);
    else if (r < 2 || ms->highest > MODEL_SPAN - 4000)
      e = ms->epoch + (r == 0 ? 0 : 1), c = st_rng_below(&rng, 3000);
    else if (r < 4)
      c = ms->highest + st_rng_below(&rng, 3000); /* a far jump */
    else if (r < 5 && ms->epoch > 0)
      e = ms->epoch - 1, c = st_rng_below(&rng, 3000);
    else
      c = ms->highest + 64 -
          st_rng_below(&rng, ms->highest < 1200 ? ms->highest + 65 : 1200);
    int want = model_decide(ms, tracked, e, c);
    ck_assert_int_eq(st__replay_check(t, &ids[s], e, c), want);
    ck_assert_int_eq(st__replay_update(t, &ids[s], e, c), want);
    outcomes[want == 0 ? 0 : want == -EALREADY ? 1 : want == -ESTALE ? 2 : 3]++;
    if (want != 0)
      continue;
    if (!ms->tracked) {
      ms->tracked = true;
      tracked++;
      ms->epoch = e;
      ms->highest = c;
      memset(ms->seen, 0, sizeof(ms->seen));
    } else if (e > ms->epoch) {
      ms->epoch = e;
      ms->highest = c;
      memset(ms->seen, 0, sizeof(ms->seen));
    } else if (c > ms->highest) {
      ms->highest = c;
    }
    ms->seen[c] = 1;
    ck_assert_uint_eq(st__replay_count(t), (size_t) tracked);
  }
  for (int k = 0; k < 4; k++)
    ck_assert_int_gt(outcomes[k], 0); /* every answer was exercised */
  st_replay_table_free(t);
}
END_TEST

/* ---- Known answer -----------------------------------------------------------
 */

/* With a fixed cluster key, identity, nonce, header, receiver and message
 * the packet must equal what libsodium's raw AEAD and Ed25519 give for the
 * documented layout (docs/protocol.md): the subkey crypto_kdf(id 1,
 * "stpacket"), AD = bytes 0..66 (the header with the sender's public key)
 * followed by the receiver's id (16 zero bytes for an unknown receiver),
 * then the sender's signature of bytes 0..90+c followed by the same
 * receiver id. Computed here without any of packet.c or constants.h; loop
 * index 0 seals for a known receiver, 1 for an unknown one. */
START_TEST(test_known_answer) {
  ck_assert_int_eq(st_crypto_init(), 0);
  bool unknown = _i == 1;
  st_cluster_key_t key;
  for (int i = 0; i < 32; i++)
    key.key[i] = (uint8_t) i;
  key.id = 0x5a;
  st_keyring_t ring;
  ck_assert_int_eq(st_keyring_init(&ring, &key, NULL, NULL, 0), 0);
  st_identity_t me;
  uint8_t seed[32];
  for (int i = 0; i < 32; i++)
    seed[i] = (uint8_t) (0x80 + i);
  crypto_sign_seed_keypair(me.public_key, me.secret_key, seed);
  st_node_id_from_public_key(me.public_key, &me.id);
  st_packet_sealer_t s = {.keys = &ring,
                          .identity = &me,
                          .boot_epoch = 0x0102030405060708ull,
                          .counter = 0x1112131415161718ull};
  st_node_id_t to;
  for (int i = 0; i < 16; i++)
    to.b[i] = (uint8_t) (0xe0 + i);
  uint8_t nonce[24];
  for (int i = 0; i < 24; i++)
    nonce[i] = (uint8_t) (0xc0 + i);
  static const char text[] = "starling known answer";
  const size_t len = sizeof(text) - 1;
  uint8_t got[ST_PACKET_MAX_BYTES];
  size_t n = 0;
  ck_assert_int_eq(st__packet_seal_with_nonce(&s, unknown ? NULL : &to, nonce,
                                              (const uint8_t*) text, len, got,
                                              sizeof(got), &n),
                   0);
  ck_assert_uint_eq(n, 91 + len + 16 + 64);

  uint8_t want[ST_PACKET_MAX_BYTES];
  uint8_t subkey[32];
  crypto_kdf_derive_from_key(subkey, 32, 1, "stpacket", key.key);
  want[0] = 3;
  want[1] = 0x5a;
  want[2] = unknown ? 1 : 0;
  memcpy(want + 3, me.id.b, 16);
  for (int i = 0; i < 8; i++) {
    want[19 + i] = (uint8_t) (8 - i); /* 0x0102030405060708, little-endian */
    want[27 + i] = (uint8_t) (0x18 - i);
  }
  memcpy(want + 35, me.public_key, 32);
  memcpy(want + 67, nonce, 24);
  uint8_t ad[67 + 16];
  memcpy(ad, want, 67);
  if (unknown)
    memset(ad + 67, 0, 16);
  else
    memcpy(ad + 67, to.b, 16);
  unsigned long long clen = 0;
  crypto_aead_xchacha20poly1305_ietf_encrypt(want + 91, &clen,
                                             (const uint8_t*) text, len, ad,
                                             sizeof(ad), NULL, nonce, subkey);
  uint8_t msg[ST_PACKET_MAX_BYTES + 16];
  memcpy(msg, want, 91 + clen);
  memcpy(msg + 91 + clen, ad + 67, 16);
  crypto_sign_detached(want + 91 + clen, NULL, msg, 91 + clen + 16,
                       me.secret_key);
  ck_assert_uint_eq(91 + clen + 64, n);
  for (size_t i = 0; i < n; i++)
    ck_assert_msg(got[i] == want[i], "byte %zu: %02x, want %02x", i, got[i],
                  want[i]);

  /* And it opens at that receiver (any receiver, when unknown). */
  st_replay_table_t* t = NULL;
  ck_assert_int_eq(st_replay_table_new(1, &t), 0);
  uint8_t plain[ST_PACKET_MAX_BYTES];
  size_t plen;
  st_packet_header_t hdr;
  ck_assert_int_eq(st_packet_open(&ring, &to, NULL, t, NULL, got, n, plain,
                                  sizeof(plain), &plen, &hdr),
                   0);
  ck_assert_uint_eq(hdr.to_kind,
                    unknown ? ST_PACKET_TO_UNKNOWN : ST_PACKET_TO_NODE);
  st_replay_table_free(t);
  st_keyring_wipe(&ring);
}
END_TEST

static Suite* packet_suite(void) {
  Suite* s = suite_create("crypto_packet");
  TCase* tc = tcase_create("packet");
  tcase_set_timeout(tc, 120);
  int n_sizes = (int) (sizeof(sizes) / sizeof(sizes[0]));
  int n_len = (int) (sizeof(length_cases) / sizeof(length_cases[0]));
  int n_win = (int) (sizeof(window_cases) / sizeof(window_cases[0]));
  tcase_add_loop_test(tc, test_round_trip, 0, n_sizes);
  tcase_add_test(tc, test_seal_limits);
  tcase_add_loop_test(tc, test_open_lengths, 0, n_len);
  tcase_add_test(tc, test_flip_every_byte);
  tcase_add_test(tc, test_forged_sender_refused);
  tcase_add_test(tc, test_allow_list);
  tcase_add_loop_test(tc, test_wrong_cluster_key, 0, 2);
  tcase_add_test(tc, test_redirected_packet_refused);
  tcase_add_test(tc, test_receiver_kinds);
  tcase_add_loop_test(tc, test_window, 0, n_win);
  tcase_add_test(tc, test_shuffled_once);
  tcase_add_test(tc, test_rotation);
  tcase_add_test(tc, test_senders_full_and_forget);
  tcase_add_test(tc, test_table_bad_args);
  tcase_add_loop_test(tc, test_table_model, 0, 3);
  tcase_add_loop_test(tc, test_known_answer, 0, 2);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(packet_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
