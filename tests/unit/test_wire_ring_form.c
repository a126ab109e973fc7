/* test_wire_ring_form.c: the Check suite for the ring formation messages of
 * the wire codec (RING_PROPOSE, RING_ACCEPT, RING_CONFIRM, RING_CANCEL;
 * gossip/wire.c, layouts in gossip.h, "Ring formation"): round trips with
 * every members count 0 .. ST_RING_FORM_MAX_MEMBERS, known-answer bytes, the
 * largest message against one UDP packet, the encoder's refusals, and the
 * decoder's rejections, each checked by its return code and the counter it
 * bumps: truncation at every length, trailing bytes, field counts, fields of
 * the wrong msgpack type or size, members lists too long (refused by the
 * pre-walk, LIMIT) or declaring more than the bytes hold, and random
 * mutations.
 *
 * Hand-made messages come from the msgpack writer of tests/wire_testutil.h
 * (no msgpack-c in tests: STYLE.md rule 6). ST_WIRE_WRITE_CORPUS=DIR writes
 * the four fuzz seeds (ring_propose, ring_accept, ring_confirm,
 * ring_cancel) into DIR; otherwise the committed seeds under $ST_SOURCE_DIR
 * are checked to decode to the messages that wrote them. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/gossip.h"
#include "tests/unit/testutil.h"
#include "tests/wire_testutil.h"

#define BUF_CAP 8192
#define MAXM ST_RING_FORM_MAX_MEMBERS

/* ==== Helpers ===============================================================
 */

static st_rng_t rng;

static void setup(void) {
  st_rng_seed(&rng, tu_seed());
}

static void expect_ok(const uint8_t* b, size_t n, const char* what) {
  st_msg_t m;
  int rc = st_wire_decode(b, n, &m, NULL);
  ck_assert_msg(rc == 0, "%s: rc %d", what, rc);
  st_wire_msg_free(&m);
}

static const st_msg_type_t types[] = {ST_MSG_RING_PROPOSE, ST_MSG_RING_ACCEPT,
                                      ST_MSG_RING_CONFIRM, ST_MSG_RING_CANCEL};
#define NTYPES 4

/* A random valid message of type t with n members (PROPOSE, CONFIRM), the
 * ids written into ids[]. */
static void rand_ring(st_msg_type_t t, uint32_t n, st_node_id_t* ids,
                      st_msg_t* m) {
  memset(m, 0, sizeof *m);
  m->type = t;
  tw_rand_bytes(&rng, (uint8_t*) ids, n * sizeof *ids);
  switch (t) {
    case ST_MSG_RING_PROPOSE:
      m->u.ring_propose.round_id = tw_rand_bits(&rng, 64);
      tw_rand_bytes(&rng, m->u.ring_propose.proposer.b, 16);
      m->u.ring_propose.n_members = n;
      m->u.ring_propose.members = n > 0 ? ids : NULL;
      break;
    case ST_MSG_RING_ACCEPT:
      m->u.ring_accept.round_id = tw_rand_bits(&rng, 64);
      m->u.ring_accept.accept = st_rng_below(&rng, 2);
      if (st_rng_below(&rng, 2)) /* else none: all zero */
        tw_rand_bytes(&rng, m->u.ring_accept.tag, ST_RING_TAG_BYTES);
      break;
    case ST_MSG_RING_CONFIRM:
      m->u.ring_confirm.round_id = tw_rand_bits(&rng, 64);
      m->u.ring_confirm.n_members = n;
      m->u.ring_confirm.members = n > 0 ? ids : NULL;
      if (st_rng_below(&rng, 2))
        tw_rand_bytes(&rng, m->u.ring_confirm.tag, ST_RING_TAG_BYTES);
      break;
    default:
      m->u.ring_cancel.round_id = tw_rand_bits(&rng, 64);
      break;
  }
}

static size_t encode_ok(const st_msg_t* m, uint8_t* buf, size_t cap) {
  size_t len = 0;
  ck_assert_int_eq(st_wire_encode(m, buf, cap, &len), 0);
  return len;
}

static void round_trip(const st_msg_t* m) {
  uint8_t buf[BUF_CAP];
  st_msg_t d;
  size_t len = tw_round_trip(m, buf, sizeof buf, &d);
  /* Re-encoding gives the same bytes: the encoding is canonical. */
  uint8_t again[BUF_CAP];
  size_t n2 = encode_ok(&d, again, sizeof again);
  ck_assert_uint_eq(n2, len);
  ck_assert_mem_eq(again, buf, len);
  st_wire_msg_free(&d);
}

/* Writes [type, 1, field...] for PROPOSE (round, proposer, members) or
 * CONFIRM (round, members, tag) with one thing at a time made wrong. */
typedef struct {
  int n_fields;       /* 3 for a valid PROPOSE or CONFIRM */
  int round_kind;     /* 0 uint, 1 negative, 2 str, 3 bool */
  int proposer_len;   /* bin length; -1: a str */
  int members_kind;   /* 0 array, 1 map, 2 bin, 3 nil */
  uint32_t declared;  /* the members array's declared count */
  uint32_t present;   /* ids actually written */
  int member_len;     /* each id's bin length; -1: str, -2: uint */
  uint32_t bad_index; /* the member written wrong (member_len applies) */
  int tag_len;        /* CONFIRM's tag: bin length; -1: a str */
} rw_t;

static rw_t rw_default(st_msg_type_t t) {
  (void) t;
  rw_t r = {3, 0, 16, 0, 3, 3, 16, 0, 16};
  return r;
}

static void w_id(w_t* w, int len, uint8_t fill) {
  uint8_t id[32];
  memset(id, fill, sizeof id);
  if (len == -1)
    w_str(w, id, 16);
  else if (len == -2)
    w_uint(w, fill);
  else
    w_bin(w, id, (size_t) len);
}

static void w_ring(w_t* w, st_msg_type_t t, const rw_t* r) {
  w->n = 0;
  w_array(w, 2 + (uint64_t) r->n_fields);
  w_uint(w, t), w_uint(w, ST_WIRE_VERSION);
  int f = 0;
  if (f++ < r->n_fields) {
    if (r->round_kind == 0)
      w_uint(w, 0x1234567890ull);
    else if (r->round_kind == 1)
      w_byte(w, 0xff); /* -1 */
    else if (r->round_kind == 2)
      w_str(w, "12", 2);
    else
      w_byte(w, 0xc3);
  }
  if (t == ST_MSG_RING_PROPOSE && f++ < r->n_fields)
    w_id(w, r->proposer_len, 0xaa);
  if (f++ < r->n_fields) {
    switch (r->members_kind) {
      case 0:
        w_array(w, r->declared);
        for (uint32_t i = 0; i < r->present; i++)
          w_id(w, i == r->bad_index ? r->member_len : 16, (uint8_t) (i + 1));
        break;
      case 1:
        w_byte(w, 0x81), w_uint(w, 1), w_uint(w, 2);
        break;
      case 2:
        w_bin(w, "abc", 3);
        break;
      default:
        w_byte(w, 0xc0);
        break;
    }
  }
  if (t == ST_MSG_RING_CONFIRM && f++ < r->n_fields)
    w_id(w, r->tag_len, 0xcc);
  for (; f < r->n_fields; f++)
    w_uint(w, 0);
}

/* ==== Round trips ===========================================================
 */

START_TEST(test_round_trip) {
  st_msg_type_t t = types[_i];
  static st_node_id_t ids[MAXM];
  for (uint32_t n = 0; n <= MAXM; n++) {
    for (int it = 0; it < 20; it++) {
      st_msg_t m;
      rand_ring(t, n, ids, &m);
      round_trip(&m);
    }
  }
}
END_TEST

/* The bytes, by hand. */
START_TEST(test_known_answer) {
  uint8_t buf[BUF_CAP];
  st_msg_t m;
  memset(&m, 0, sizeof m);
  /* [44, 1, 0x0102030405060708]. */
  m.type = ST_MSG_RING_CANCEL;
  m.u.ring_cancel.round_id = 0x0102030405060708ull;
  size_t len = encode_ok(&m, buf, sizeof buf);
  const uint8_t cancel[] = {0x93, 44, 1, 0xcf, 1, 2, 3, 4, 5, 6, 7, 8};
  ck_assert_uint_eq(len, sizeof cancel);
  ck_assert_mem_eq(buf, cancel, len);
  /* [42, 1, 7, false, bin16 00..] (no tag). */
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_RING_ACCEPT;
  m.u.ring_accept.round_id = 7;
  len = encode_ok(&m, buf, sizeof buf);
  const uint8_t accept[] = {0x95, 42, 1, 7, 0xc2, 0xc4, 16, 0, 0, 0, 0, 0,
                            0,    0,  0, 0, 0,    0,    0,  0, 0, 0, 0};
  ck_assert_uint_eq(len, sizeof accept);
  ck_assert_mem_eq(buf, accept, len);
  /* [41, 1, 300, bin16 aa.., [bin16 aa.., bin16 bb..]]. */
  st_node_id_t ids[2];
  memset(ids[0].b, 0xaa, 16);
  memset(ids[1].b, 0xbb, 16);
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_RING_PROPOSE;
  m.u.ring_propose.round_id = 300;
  m.u.ring_propose.proposer = ids[0];
  m.u.ring_propose.n_members = 2;
  m.u.ring_propose.members = ids;
  len = encode_ok(&m, buf, sizeof buf);
  uint8_t want[64];
  size_t k = 0;
  const uint8_t head[] = {0x95, 41, 1, 0xcd, 0x01, 0x2c, 0xc4, 16};
  memcpy(want, head, sizeof head), k += sizeof head;
  memset(want + k, 0xaa, 16), k += 16;
  want[k++] = 0x92;
  want[k++] = 0xc4, want[k++] = 16;
  memset(want + k, 0xaa, 16), k += 16;
  want[k++] = 0xc4, want[k++] = 16;
  memset(want + k, 0xbb, 16), k += 16;
  ck_assert_uint_eq(len, k);
  ck_assert_mem_eq(buf, want, k);
  /* A CONFIRM of 16 members takes an array16 header. */
  static st_node_id_t many[16];
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_RING_CONFIRM;
  m.u.ring_confirm.round_id = 1;
  m.u.ring_confirm.n_members = 16;
  m.u.ring_confirm.members = many;
  len = encode_ok(&m, buf, sizeof buf);
  const uint8_t chead[] = {0x95, 43, 1, 1, 0xdc, 0, 16, 0xc4, 16};
  ck_assert_uint_eq(len, 4 + 3 + 16 * 18 + 18);
  ck_assert_mem_eq(buf, chead, sizeof chead);
}
END_TEST

/* The largest of each fits one sealed UDP packet. */
START_TEST(test_largest_fits_packet) {
  static st_node_id_t ids[MAXM];
  memset(ids, 0xff, sizeof ids);
  uint8_t buf[BUF_CAP];
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_RING_PROPOSE;
  m.u.ring_propose.round_id = UINT64_MAX;
  m.u.ring_propose.n_members = MAXM;
  m.u.ring_propose.members = ids;
  size_t len = encode_ok(&m, buf, sizeof buf);
  ck_assert_uint_eq(len, 33 + 18 * MAXM); /* 1185 */
  ck_assert_uint_le(len, ST_PACKET_MAX_PLAINTEXT);
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_RING_CONFIRM;
  m.u.ring_confirm.round_id = UINT64_MAX;
  m.u.ring_confirm.n_members = MAXM;
  m.u.ring_confirm.members = ids;
  len = encode_ok(&m, buf, sizeof buf);
  ck_assert_uint_le(len, ST_PACKET_MAX_PLAINTEXT);
}
END_TEST

/* Several formation messages back to back, as one plaintext. */
START_TEST(test_decode_next) {
  static st_node_id_t ids[NTYPES][MAXM];
  st_msg_t ms[NTYPES];
  uint8_t buf[4 * BUF_CAP];
  size_t len = 0;
  for (int i = 0; i < NTYPES; i++) {
    rand_ring(types[i], (uint32_t) st_rng_below(&rng, MAXM + 1), ids[i],
              &ms[i]);
    len += encode_ok(&ms[i], buf + len, sizeof buf - len);
  }
  size_t off = 0;
  for (int i = 0; i < NTYPES; i++) {
    st_msg_t d;
    size_t used = 0;
    ck_assert_int_eq(st_wire_decode_next(buf + off, len - off, &d, &used, NULL),
                     0);
    ck_assert(msg_same(&ms[i], &d));
    st_wire_msg_free(&d);
    if (d.type == ST_MSG_RING_PROPOSE)
      ck_assert_ptr_null(d.u.ring_propose.members);
    if (d.type == ST_MSG_RING_CONFIRM)
      ck_assert_ptr_null(d.u.ring_confirm.members);
    off += used;
  }
  ck_assert_uint_eq(off, len);
}
END_TEST

/* ==== The encoder's refusals ================================================
 */

START_TEST(test_encode_refuses) {
  static st_node_id_t ids[MAXM + 1];
  uint8_t buf[BUF_CAP];
  size_t len = 12345;
  st_msg_t m;
  for (int p = 0; p < 2; p++) {
    st_msg_type_t t = p ? ST_MSG_RING_CONFIRM : ST_MSG_RING_PROPOSE;
    rand_ring(t, MAXM + 1, ids, &m);
    ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
    rand_ring(t, 3, ids, &m);
    if (p)
      m.u.ring_confirm.members = NULL;
    else
      m.u.ring_propose.members = NULL;
    ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  }
  ck_assert_uint_eq(len, 12345); /* untouched on failure */
  /* Too small a buffer, at every size short of the message. */
  for (int t = 0; t < NTYPES; t++) {
    rand_ring(types[t], MAXM, ids, &m);
    size_t full = encode_ok(&m, buf, sizeof buf);
    for (size_t cap = 0; cap < full; cap++)
      ck_assert_int_eq(st_wire_encode(&m, buf, cap, &len), -EMSGSIZE);
  }
}
END_TEST

/* ==== The decoder's rejections ==============================================
 */

START_TEST(test_reject_truncated) {
  static st_node_id_t ids[MAXM];
  st_msg_t m;
  rand_ring(types[_i], 20, ids, &m);
  /* A 9-byte round id (round_id leads each of the four structs). */
  m.u.ring_propose.round_id |= UINT64_C(1) << 63;
  uint8_t buf[BUF_CAP];
  size_t len = encode_ok(&m, buf, sizeof buf);
  tw_expect_truncations(buf, len);
}
END_TEST

START_TEST(test_reject_field_count) {
  st_msg_type_t t = types[_i];
  static const int want[NTYPES] = {3, 3, 3, 1};
  w_t* w = w_new(BUF_CAP);
  for (int n = 0; n <= 6; n++) {
    if (n == want[_i])
      continue;
    w->n = 0;
    w_array(w, 2 + (uint64_t) n);
    w_uint(w, t), w_uint(w, ST_WIRE_VERSION);
    for (int f = 0; f < n; f++)
      w_uint(w, 1);
    tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "field count");
  }
  w_free(w);
}
END_TEST

/* ACCEPT and CANCEL: one field wrong at a time. */
START_TEST(test_reject_accept_cancel) {
  w_t* w = w_new(BUF_CAP);
  /* Valid first, so that each rejection below is its one change. */
  static const struct {
    int round;  /* 0: 5, 1: -1 */
    int accept; /* 0: true, 1: the integer 1, 2: nil */
    int tag;    /* a bin of this length; -1: a str; -2: nil */
    bool ok;
    const char* what;
  } acc[] = {
      {0, 0, 16, true, "accept"},      {0, 1, 16, false, "accept as uint"},
      {0, 2, 16, false, "accept nil"}, {1, 0, 16, false, "negative round"},
      {0, 0, 15, false, "tag of 15"},  {0, 0, 17, false, "tag of 17"},
      {0, 0, 0, false, "empty tag"},   {0, 0, -1, false, "tag as str"},
      {0, 0, -2, false, "tag nil"}};
  for (size_t i = 0; i < sizeof acc / sizeof acc[0]; i++) {
    w->n = 0;
    w_array(w, 5), w_uint(w, ST_MSG_RING_ACCEPT), w_uint(w, 1);
    if (acc[i].round == 0)
      w_uint(w, 5);
    else
      w_byte(w, 0xff);
    if (acc[i].accept == 0)
      w_byte(w, 0xc3);
    else if (acc[i].accept == 1)
      w_uint(w, 1);
    else
      w_byte(w, 0xc0);
    if (acc[i].tag == -2)
      w_byte(w, 0xc0);
    else
      w_id(w, acc[i].tag, 0x5a);
    if (acc[i].ok)
      expect_ok(w->b, w->n, acc[i].what);
    else
      tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, acc[i].what);
  }
  w->n = 0;
  w_array(w, 3), w_uint(w, ST_MSG_RING_CANCEL), w_uint(w, 1);
  w_byte(w, 0xcb), w_be(w, 0x3ff0000000000000ull, 8); /* 1.0 */
  tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "round as float");
  w->n = 0;
  w_array(w, 3), w_uint(w, ST_MSG_RING_CANCEL), w_uint(w, 1);
  w_uint(w, UINT64_MAX);
  expect_ok(w->b, w->n, "cancel");
  w_free(w);
}
END_TEST

/* PROPOSE and CONFIRM: one field wrong at a time. */
START_TEST(test_reject_list_fields) {
  st_msg_type_t t = _i == 0 ? ST_MSG_RING_PROPOSE : ST_MSG_RING_CONFIRM;
  w_t* w = w_new(BUF_CAP);
  rw_t ok = rw_default(t);
  w_ring(w, t, &ok);
  expect_ok(w->b, w->n, "valid");
  for (int k = 1; k <= 3; k++) {
    rw_t r = ok;
    r.round_kind = k;
    w_ring(w, t, &r);
    tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "round");
  }
  if (t == ST_MSG_RING_PROPOSE) {
    static const int bad[] = {-1, 0, 15, 17, 32};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      rw_t r = ok;
      r.proposer_len = bad[i];
      w_ring(w, t, &r);
      tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "proposer");
    }
  }
  for (int k = 1; k <= 3; k++) {
    rw_t r = ok;
    r.members_kind = k;
    w_ring(w, t, &r);
    tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "members kind");
  }
  /* A member of the wrong size or type, first, middle or last. One that
   * takes fewer than 18 bytes (a bin8 of 15, a fixstr of 16, a fixint)
   * leaves the list shorter than the walk's 18 bytes an id: LIMIT, before
   * msgpack-c; a longer one is a field error. In a CONFIRM the tag's 18
   * bytes follow the list, so the walk's count holds there and msgpack-c's
   * field check refuses it. */
  static const struct {
    int len;
    st_wire_drop_t why;
  } bad_member[] = {{15, ST_WIRE_DROP_LIMIT},
                    {17, ST_WIRE_DROP_FIELD},
                    {32, ST_WIRE_DROP_FIELD},
                    {-1, ST_WIRE_DROP_LIMIT},
                    {-2, ST_WIRE_DROP_LIMIT}};
  for (size_t i = 0; i < sizeof bad_member / sizeof bad_member[0]; i++) {
    for (uint32_t at = 0; at < 3; at++) {
      rw_t r = ok;
      r.member_len = bad_member[i].len;
      r.bad_index = at;
      w_ring(w, t, &r);
      st_wire_drop_t why =
          t == ST_MSG_RING_CONFIRM ? ST_WIRE_DROP_FIELD : bad_member[i].why;
      tw_expect_drop(w->b, w->n, -EBADMSG, why, "member");
    }
  }
  if (t == ST_MSG_RING_CONFIRM) {
    static const int bad_tag[] = {-1, 0, 15, 17, 32};
    for (size_t i = 0; i < sizeof bad_tag / sizeof bad_tag[0]; i++) {
      rw_t r = ok;
      r.tag_len = bad_tag[i];
      w_ring(w, t, &r);
      tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "tag");
    }
  }
  /* A nested array in the members' place of a member. */
  w->n = 0;
  w_array(w, 2 + (uint64_t) ok.n_fields);
  w_uint(w, t), w_uint(w, 1), w_uint(w, 9);
  if (t == ST_MSG_RING_PROPOSE)
    w_id(w, 16, 1);
  w_array(w, 1), w_array(w, 1), w_id(w, 16, 2);
  if (t == ST_MSG_RING_CONFIRM)
    w_id(w, 16, 3);
  tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "nested");
  /* Empty lists decode (the machine refuses them). */
  rw_t r = ok;
  r.declared = r.present = 0;
  w_ring(w, t, &r);
  expect_ok(w->b, w->n, "empty");
  w_free(w);
}
END_TEST

/* Too many members: refused by the pre-walk, before msgpack-c sizes an
 * allocation from the count. */
START_TEST(test_reject_too_many) {
  st_msg_type_t t = _i == 0 ? ST_MSG_RING_PROPOSE : ST_MSG_RING_CONFIRM;
  w_t* w = w_new(BUF_CAP);
  rw_t r = rw_default(t);
  /* Exactly the limit decodes. */
  r.declared = r.present = MAXM;
  w_ring(w, t, &r);
  expect_ok(w->b, w->n, "64");
  /* One more, all present. */
  r.declared = r.present = MAXM + 1;
  w_ring(w, t, &r);
  tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_LIMIT, "65");
  /* Hostile counts with few bytes behind them. */
  static const uint32_t counts[] = {MAXM + 1, 1000, 65535, 0xffffffffu};
  for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
    r.declared = counts[i];
    r.present = 2;
    w_ring(w, t, &r);
    tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_LIMIT, "hostile count");
  }
  /* Within the limit, but more than the bytes left hold at 18 an id. */
  r.declared = 10;
  r.present = 9;
  w_ring(w, t, &r);
  tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_LIMIT, "count past bytes");
  /* Within the limit, as one-byte members: not enough bytes for ids. */
  w->n = 0;
  w_array(w, 2 + (uint64_t) r.n_fields);
  w_uint(w, t), w_uint(w, 1), w_uint(w, 9);
  if (t == ST_MSG_RING_PROPOSE)
    w_id(w, 16, 1);
  w_array(w, 20);
  for (int i = 0; i < 20; i++)
    w_uint(w, 1);
  if (t == ST_MSG_RING_CONFIRM)
    w_id(w, 16, 3);
  tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_LIMIT, "uint members");
  w_free(w);
}
END_TEST

/* Random byte flips of valid encodings: decoded or refused with exactly
 * one drop, and whatever decodes re-encodes to a message that decodes the
 * same. */
START_TEST(test_mutations) {
  static st_node_id_t ids[MAXM];
  for (int it = 0; it < 20000; it++) {
    st_msg_t m;
    rand_ring(types[st_rng_below(&rng, NTYPES)],
              (uint32_t) st_rng_below(&rng, 20), ids, &m);
    uint8_t buf[BUF_CAP];
    size_t len = encode_ok(&m, buf, sizeof buf);
    st_msg_t d;
    if (!tw_mutate_decode(&rng, buf, len, &d))
      continue;
    uint8_t again[BUF_CAP];
    size_t n2 = encode_ok(&d, again, sizeof again);
    ck_assert_uint_le(n2, len);
    st_msg_t d2;
    ck_assert_int_eq(st_wire_decode(again, n2, &d2, NULL), 0);
    ck_assert(msg_same(&d, &d2));
    st_wire_msg_free(&d);
    st_wire_msg_free(&d2);
  }
}
END_TEST

/* ==== The fuzz seeds ========================================================
 */

static const char* const seed_names[NTYPES] = {"ring_propose", "ring_accept",
                                               "ring_confirm", "ring_cancel"};

/* The seeds, from a fixed seed: one valid encoding per type, lists of 5. */
static void seed_msg(int i, st_node_id_t* ids, st_msg_t* m) {
  st_rng_seed(&rng, 20240711 + (uint64_t) i);
  rand_ring(types[i], 5, ids, m);
  if (types[i] == ST_MSG_RING_PROPOSE)
    m->u.ring_propose.proposer = ids[0];
}

START_TEST(test_fuzz_corpus) {
  for (int i = 0; i < NTYPES; i++) {
    st_node_id_t ids[5];
    st_msg_t m;
    seed_msg(i, ids, &m);
    tw_fuzz_seed(&m, seed_names[i]);
  }
}
END_TEST

static Suite* wire_ring_form_suite(void) {
  Suite* s = suite_create("wire_ring_form");
  TCase* tr = tcase_create("round_trip");
  tcase_add_checked_fixture(tr, setup, NULL);
  tcase_add_loop_test(tr, test_round_trip, 0, NTYPES);
  tcase_add_test(tr, test_known_answer);
  tcase_add_test(tr, test_largest_fits_packet);
  tcase_add_test(tr, test_decode_next);
  tcase_add_test(tr, test_encode_refuses);
  tcase_add_test(tr, test_fuzz_corpus);
  suite_add_tcase(s, tr);
  TCase* td = tcase_create("decode_rejects");
  tcase_add_checked_fixture(td, setup, NULL);
  tcase_add_loop_test(td, test_reject_truncated, 0, NTYPES);
  tcase_add_loop_test(td, test_reject_field_count, 0, NTYPES);
  tcase_add_test(td, test_reject_accept_cancel);
  tcase_add_loop_test(td, test_reject_list_fields, 0, 2);
  tcase_add_loop_test(td, test_reject_too_many, 0, 2);
  tcase_add_test(td, test_mutations);
  suite_add_tcase(s, td);
  return s;
}

int main(void) {
  return tw_main(wire_ring_form_suite);
}
