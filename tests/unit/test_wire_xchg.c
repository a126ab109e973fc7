/* test_wire_xchg.c: the Check suite for the exchange messages of the wire
 * codec (XCHG_REQ, XCHG_REPLY, XCHG_DONE, XCHG_CODED; gossip/wire.c, layouts in
 * gossip.h): round trips with random contents and model descriptions at
 * every length, a known-answer encoding, the encoder's refusals, and the
 * decoder's rejections, each checked by its return code and by the counter
 * it bumps: truncation at every length, trailing bytes, field counts,
 * every field with wrong msgpack types and sizes, out-of-range kinds and
 * statuses, model strings too long or not printable UTF-8, a REPLY's
 * tensor list over ST_XCHG_TENSORS_MAX or not a str, anchors of the wrong
 * size, XCHG_CODED pieces empty, past their total or over their caps, and
 * hostile declared lengths.
 *
 * Hand-made messages come from the msgpack writer of tests/wire_testutil.h
 * (no msgpack-c in tests: STYLE.md rule 6). ST_WIRE_WRITE_CORPUS=DIR
 * writes the four fuzz seeds (xchg_req, xchg_reply, xchg_done, xchg_coded)
 * into DIR;
 * otherwise the committed seeds under $ST_SOURCE_DIR are checked to decode
 * to the messages that wrote them. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/gossip.h"
#include "tests/unit/testutil.h"
#include "tests/wire_testutil.h"

#define BUF_CAP 4096

/* ==== Helpers ===============================================================
 */

static st_rng_t rng;

static void setup(void) {
  st_rng_seed(&rng, tu_seed());
}

/* A printable ASCII model description of exactly n bytes. */
static void rand_model(char* dst, size_t n) {
  for (size_t i = 0; i < n; i++)
    dst[i] = (char) (0x20 + st_rng_below(&rng, 0x7f - 0x20));
  dst[n] = '\0';
}

/* A REPLY's tensor list, a compressed piece's bytes: any bytes (the wire
 * does not read them). */
static char rand_tensors[1024];
static uint8_t rand_coded[512];

/* A random valid message of type t whose model is model_len bytes. */
static void rand_xchg(st_msg_type_t t, size_t model_len, st_msg_t* m) {
  memset(m, 0, sizeof *m);
  m->type = t;
  switch (t) {
    case ST_MSG_XCHG_REQ:
      m->u.xchg_req.kind = (uint8_t) (1 + st_rng_below(&rng, 2));
      tw_rand_bytes(&rng, m->u.xchg_req.fingerprint, 16);
      rand_model(m->u.xchg_req.model, model_len);
      m->u.xchg_req.n_params = tw_rand_bits(&rng, 64);
      m->u.xchg_req.step = tw_rand_bits(&rng, 64);
      tw_rand_bytes(&rng, m->u.xchg_req.anchor, ST_XCHG_ANCHOR_BYTES);
      break;
    case ST_MSG_XCHG_REPLY:
      m->u.xchg_reply.status = (uint8_t) st_rng_below(&rng, 4);
      tw_rand_bytes(&rng, m->u.xchg_reply.fingerprint, 16);
      rand_model(m->u.xchg_reply.model, model_len);
      m->u.xchg_reply.n_params = tw_rand_bits(&rng, 64);
      m->u.xchg_reply.step = tw_rand_bits(&rng, 64);
      tw_rand_bytes(&rng, m->u.xchg_reply.anchor, ST_XCHG_ANCHOR_BYTES);
      m->u.xchg_reply.tensors_len =
          st_rng_below(&rng, 2) == 0
              ? 0
              : (uint32_t) st_rng_below(&rng, sizeof rand_tensors + 1);
      tw_rand_bytes(&rng, (uint8_t*) rand_tensors, sizeof rand_tensors);
      m->u.xchg_reply.tensors = rand_tensors;
      break;
    case ST_MSG_XCHG_CODED: {
      st_msg_xchg_coded_t* c = &m->u.xchg_coded;
      c->data_len = (uint32_t) (1 + st_rng_below(&rng, sizeof rand_coded));
      c->total = c->data_len +
                 st_rng_below(&rng, ST_XCHG_CODED_MAX_BYTES - c->data_len + 1);
      c->offset = st_rng_below(&rng, c->total - c->data_len + 1);
      tw_rand_bytes(&rng, rand_coded, sizeof rand_coded);
      c->data = rand_coded;
      break;
    }
    default:
      tw_rand_bytes(&rng, m->u.xchg_done.hash, ST_XCHG_HASH_BYTES);
      break;
  }
}

static void round_trip(const st_msg_t* m) {
  uint8_t buf[BUF_CAP];
  st_msg_t d;
  tw_round_trip(m, buf, sizeof buf, &d);
  st_wire_msg_free(&d);
}

static const st_msg_type_t types[] = {ST_MSG_XCHG_REQ, ST_MSG_XCHG_REPLY,
                                      ST_MSG_XCHG_DONE, ST_MSG_XCHG_CODED};
#define NTYPES 4

/* Fields of a valid message of type t. */
#define FIELDS(t)                 \
  ((t) == ST_MSG_XCHG_REPLY   ? 7 \
   : (t) == ST_MSG_XCHG_REQ   ? 6 \
   : (t) == ST_MSG_XCHG_CODED ? 3 \
                              : 1)

/* Writes [type, 1, kind/status, fingerprint, model, n_params, step,
 * anchor] and, for a REPLY, an empty tensor list, field by field, so that
 * one field at a time can be made wrong. */
typedef struct {
  int n_fields; /* FIELDS(t) for a valid one */
  int first;    /* kind or status; -1: a str instead */
  int fp_len;   /* bin length of the fingerprint; -1: a str */
  const char* model;
  size_t model_len;
  int model_bin; /* the model as a bin, not a str */
  int neg_step;  /* step as a negative int */
  int anchor;    /* 0: a bin16 anchor; -1: a str; else a bin of that size */
} xw_t;

static void w_info(w_t* w, st_msg_type_t t, const xw_t* x) {
  static const uint8_t fp[32] = {1, 2, 3};
  w->n = 0;
  w_byte(w, (uint8_t) (0x90 | (2 + x->n_fields)));
  w_uint(w, t), w_uint(w, ST_WIRE_VERSION);
  int f = 0;
  if (f++ < x->n_fields) {
    if (x->first < 0)
      w_str(w, "1", 1);
    else
      w_uint(w, (uint64_t) x->first);
  }
  if (f++ < x->n_fields) {
    if (x->fp_len < 0)
      w_str(w, fp, 16);
    else
      w_bin(w, fp, (size_t) x->fp_len);
  }
  if (f++ < x->n_fields) {
    if (x->model_bin)
      w_bin(w, x->model, x->model_len);
    else
      w_str(w, x->model, x->model_len);
  }
  if (f++ < x->n_fields)
    w_uint(w, 1000);
  if (f++ < x->n_fields) {
    if (x->neg_step)
      w_byte(w, 0xff); /* -1 */
    else
      w_uint(w, 7);
  }
  if (f++ < x->n_fields) {
    if (x->anchor < 0)
      w_str(w, fp, ST_XCHG_ANCHOR_BYTES);
    else
      w_bin(w, fp, x->anchor == 0 ? ST_XCHG_ANCHOR_BYTES : (size_t) x->anchor);
  }
  if (t == ST_MSG_XCHG_REPLY && f < x->n_fields) {
    w_str(w, "", 0);
    f++;
  }
  for (; f < x->n_fields; f++)
    w_uint(w, 0);
}

/* ==== Round trips ===========================================================
 */

START_TEST(test_round_trip) {
  st_msg_type_t t = types[_i];
  for (int it = 0; it < 300; it++) {
    st_msg_t m;
    rand_xchg(t, (size_t) st_rng_below(&rng, ST_XCHG_MODEL_MAX), &m);
    round_trip(&m);
  }
}
END_TEST

/* Every model length, 0 to ST_XCHG_MODEL_MAX - 1, and a few UTF-8 ones. */
START_TEST(test_model_lengths) {
  for (size_t n = 0; n < ST_XCHG_MODEL_MAX; n++) {
    st_msg_t m;
    rand_xchg(ST_MSG_XCHG_REQ, n, &m);
    round_trip(&m);
    rand_xchg(ST_MSG_XCHG_REPLY, n, &m);
    round_trip(&m);
  }
  static const char* const utf8[] = {
      "mlp:784-256-128-10 f32",
      "caf\xc3\xa9",              /* e-acute */
      "\xe2\x82\xac 5",           /* euro */
      "\xf0\x9d\x84\x9e",         /* U+1D11E */
      "\xef\xbf\xbd",             /* U+FFFD */
      "\xf4\x8f\xbf\xbf",         /* U+10FFFF */
      "\xc2\xa0\xc2\xbf",         /* past the C1 range */
      "\xe2\x80\xa7\xe2\x80\xaf", /* U+2027, U+202F */
      "\xed\x9f\xbf\xee\x80\x80", /* U+D7FF, U+E000 */
      "~"};
  for (size_t i = 0; i < sizeof utf8 / sizeof utf8[0]; i++) {
    st_msg_t m;
    rand_xchg(ST_MSG_XCHG_REQ, 0, &m);
    strcpy(m.u.xchg_req.model, utf8[i]);
    round_trip(&m);
  }
}
END_TEST

/* A DONE's bytes, by hand: [35, 1, bin8 32 <hash>]. */
START_TEST(test_known_answer) {
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_XCHG_DONE;
  for (int i = 0; i < ST_XCHG_HASH_BYTES; i++)
    m.u.xchg_done.hash[i] = (uint8_t) i;
  uint8_t buf[64];
  size_t len = 0;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  uint8_t want[37] = {0x93, 35, 1, 0xc4, 32};
  for (int i = 0; i < 32; i++)
    want[5 + i] = (uint8_t) i;
  ck_assert_uint_eq(len, sizeof want);
  ck_assert_mem_eq(buf, want, sizeof want);

  /* [33, 1, 2, bin16, "ab", 300, 0, bin16 of 0x11]. */
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_XCHG_REQ;
  m.u.xchg_req.kind = ST_XCHG_FETCH;
  memset(m.u.xchg_req.fingerprint, 0xee, 16);
  strcpy(m.u.xchg_req.model, "ab");
  m.u.xchg_req.n_params = 300;
  memset(m.u.xchg_req.anchor, 0x11, 16);
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  uint8_t want2[64] = {0x98, 33, 1, 2, 0xc4, 16};
  memset(want2 + 6, 0xee, 16);
  const uint8_t tail[] = {0xa2, 'a', 'b', 0xcd, 0x01, 0x2c, 0x00, 0xc4, 16};
  memcpy(want2 + 22, tail, sizeof tail);
  memset(want2 + 22 + sizeof tail, 0x11, 16);
  ck_assert_uint_eq(len, 22 + sizeof tail + 16);
  ck_assert_mem_eq(buf, want2, len);

  /* [36, 1, 5, 7, bin(0xab, 0xcd)]. */
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_XCHG_CODED;
  static const uint8_t piece[] = {0xab, 0xcd};
  m.u.xchg_coded.offset = 5;
  m.u.xchg_coded.total = 7;
  m.u.xchg_coded.data = piece;
  m.u.xchg_coded.data_len = 2;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  const uint8_t want3[] = {0x95, 36, 1, 5, 7, 0xc4, 2, 0xab, 0xcd};
  ck_assert_uint_eq(len, sizeof want3);
  ck_assert_mem_eq(buf, want3, len);
}
END_TEST

/* ==== The encoder's refusals ================================================
 */

START_TEST(test_encode_refuses) {
  uint8_t buf[BUF_CAP];
  size_t len = 12345;
  st_msg_t m;
  static const uint8_t bad_kinds[] = {0, 3, 255};
  for (size_t i = 0; i < sizeof bad_kinds; i++) {
    rand_xchg(ST_MSG_XCHG_REQ, 5, &m);
    m.u.xchg_req.kind = bad_kinds[i];
    ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  }
  rand_xchg(ST_MSG_XCHG_REPLY, 5, &m);
  m.u.xchg_reply.status = 4;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  /* No NUL within ST_XCHG_MODEL_MAX. */
  rand_xchg(ST_MSG_XCHG_REQ, 5, &m);
  memset(m.u.xchg_req.model, 'x', ST_XCHG_MODEL_MAX);
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  rand_xchg(ST_MSG_XCHG_REPLY, 5, &m);
  memset(m.u.xchg_reply.model, 'x', ST_XCHG_MODEL_MAX);
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  /* Not printable. */
  rand_xchg(ST_MSG_XCHG_REQ, 5, &m);
  m.u.xchg_req.model[2] = '\n';
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  rand_xchg(ST_MSG_XCHG_REPLY, 5, &m);
  m.u.xchg_reply.model[0] = (char) 0xc3; /* cut short */
  m.u.xchg_reply.model[1] = '\0';
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  /* Compressed pieces: empty, past the total, over the caps, no data. */
  static const uint8_t bytes[4] = {1, 2, 3, 4};
  const struct {
    uint64_t offset, total;
    uint32_t len;
    const uint8_t* data;
  } bad_coded[] = {
      {0, 4, 0, bytes}, {1, 4, 4, bytes},
      {5, 4, 1, bytes}, {0, ST_XCHG_CODED_MAX_BYTES + 1, 4, bytes},
      {0, 4, 4, NULL},
  };
  for (size_t i = 0; i < sizeof bad_coded / sizeof bad_coded[0]; i++) {
    memset(&m, 0, sizeof m);
    m.type = ST_MSG_XCHG_CODED;
    m.u.xchg_coded.offset = bad_coded[i].offset;
    m.u.xchg_coded.total = bad_coded[i].total;
    m.u.xchg_coded.data_len = bad_coded[i].len;
    m.u.xchg_coded.data = bad_coded[i].data;
    ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  }
  ck_assert_uint_eq(len, 12345); /* untouched on failure */
  /* Too small a buffer, at every size short of the message. */
  for (int t = 0; t < NTYPES; t++) {
    rand_xchg(types[t], ST_XCHG_MODEL_MAX - 1, &m);
    size_t full = 0;
    ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &full), 0);
    for (size_t cap = 0; cap < full; cap++)
      ck_assert_int_eq(st_wire_encode(&m, buf, cap, &len), -EMSGSIZE);
  }
}
END_TEST

/* ==== The decoder's rejections ==============================================
 */

START_TEST(test_reject_truncated) {
  st_msg_t m;
  rand_xchg(types[_i], 40, &m);
  uint8_t buf[BUF_CAP];
  size_t len = 0;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  tw_expect_truncations(buf, len);
}
END_TEST

START_TEST(test_reject_field_count) {
  st_msg_type_t t = types[_i];
  w_t* w = w_new(BUF_CAP);
  int want = FIELDS(t);
  for (int n = 0; n <= 8; n++) {
    if (n == want)
      continue;
    if (t == ST_MSG_XCHG_CODED) {
      w->n = 0;
      w_byte(w, (uint8_t) (0x90 | (2 + n)));
      w_uint(w, t), w_uint(w, ST_WIRE_VERSION);
      static const uint8_t b[4] = {1, 2, 3, 4};
      for (int f = 0; f < n; f++) {
        if (f == 2)
          w_bin(w, b, 4);
        else
          w_uint(w, f == 0 ? 0 : 8);
      }
    } else if (t == ST_MSG_XCHG_DONE) {
      w->n = 0;
      w_byte(w, (uint8_t) (0x90 | (2 + n)));
      w_uint(w, t), w_uint(w, ST_WIRE_VERSION);
      static const uint8_t h[32];
      for (int f = 0; f < n; f++)
        w_bin(w, h, 32);
    } else {
      xw_t x = {n, 1, 16, "m", 1, 0, 0, 0};
      w_info(w, t, &x);
    }
    tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "field count");
  }
  w_free(w);
}
END_TEST

/* One field wrong at a time, for REQ and REPLY. */
START_TEST(test_reject_fields) {
  st_msg_type_t t = _i == 0 ? ST_MSG_XCHG_REQ : ST_MSG_XCHG_REPLY;
  int max_first = t == ST_MSG_XCHG_REQ ? 2 : 3;
  int min_first = t == ST_MSG_XCHG_REQ ? 1 : 0;
  w_t* w = w_new(BUF_CAP);
  /* The valid one decodes, so each rejection below is its one change. */
  xw_t ok = {FIELDS(t), min_first, 16, "m", 1, 0, 0, 0};
  w_info(w, t, &ok);
  st_msg_t d;
  ck_assert_int_eq(st_wire_decode(w->b, w->n, &d, NULL), 0);
  static const int bad_first[] = {-1, 3, 4, 255, 256, 70000};
  for (size_t i = 0; i < sizeof bad_first / sizeof bad_first[0]; i++) {
    if (bad_first[i] >= min_first && bad_first[i] <= max_first)
      continue;
    xw_t x = ok;
    x.first = bad_first[i];
    w_info(w, t, &x);
    tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "kind/status");
  }
  if (t == ST_MSG_XCHG_REQ) {
    xw_t x = ok;
    x.first = 0; /* kind 0 */
    w_info(w, t, &x);
    tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "kind 0");
  }
  static const int bad_fp[] = {-1, 0, 15, 17, 32};
  for (size_t i = 0; i < sizeof bad_fp / sizeof bad_fp[0]; i++) {
    xw_t x = ok;
    x.fp_len = bad_fp[i];
    w_info(w, t, &x);
    tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "fingerprint");
  }
  static const int bad_anchor[] = {-1, 1, 15, 17, 32};
  for (size_t i = 0; i < sizeof bad_anchor / sizeof bad_anchor[0]; i++) {
    xw_t x = ok;
    x.anchor = bad_anchor[i];
    w_info(w, t, &x);
    tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "anchor");
  }
  xw_t x = ok;
  x.model_bin = 1;
  w_info(w, t, &x);
  tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "model as bin");
  x = ok;
  x.neg_step = 1;
  w_info(w, t, &x);
  tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "negative step");
  w_free(w);
}
END_TEST

START_TEST(test_reject_done_hash) {
  static const uint8_t h[64];
  static const size_t sizes[] = {0, 16, 31, 33, 64};
  w_t* w = w_new(BUF_CAP);
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    w->n = 0;
    w_byte(w, 0x93), w_uint(w, ST_MSG_XCHG_DONE), w_uint(w, 1);
    w_bin(w, h, sizes[i]);
    tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "hash size");
  }
  w->n = 0;
  w_byte(w, 0x93), w_uint(w, ST_MSG_XCHG_DONE), w_uint(w, 1);
  w_str(w, h, 32);
  tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "hash as str");
  w->n = 0;
  w_byte(w, 0x93), w_uint(w, ST_MSG_XCHG_DONE), w_uint(w, 1);
  w_bin(w, h, 32);
  st_msg_t d;
  ck_assert_int_eq(st_wire_decode(w->b, w->n, &d, NULL), 0);
  w_free(w);
}
END_TEST

/* Model descriptions: too long, and not printable UTF-8. */
typedef struct {
  const char* s;
  size_t n;
  const char* what;
} bad_model_t;

static const bad_model_t bad_models[] = {
    {"a\0b", 3, "NUL"},
    {"a\x01", 2, "C0"},
    {"a\n", 2, "newline"},
    {"\x1b[31m", 5, "escape"},
    {"\x7f", 1, "DEL"},
    {"\xc2\x85", 2, "C1 (NEL)"},
    {"\xc2\x9f", 2, "C1 (last)"},
    {"\x80", 1, "lone continuation"},
    {"\xbf", 1, "lone continuation"},
    {"\xc0\x80", 2, "overlong NUL"},
    {"\xc1\xbf", 2, "overlong"},
    {"\xe0\x80\xaf", 3, "overlong 3"},
    {"\xf0\x80\x80\xaf", 4, "overlong 4"},
    {"\xed\xa0\x80", 3, "surrogate"},
    {"\xed\xbf\xbf", 3, "surrogate"},
    {"\xf4\x90\x80\x80", 4, "past U+10FFFF"},
    {"\xf5\x80\x80\x80", 4, "0xf5"},
    {"\xff", 1, "0xff"},
    {"ab\xe2\x82", 4, "cut short"},
    {"\xc3", 1, "cut short"},
    {"\xe2\x82x", 3, "bad continuation"},
    {"\xe2\x80\xa8", 3, "U+2028"},
    {"\xe2\x80\xae", 3, "U+202E (RLO)"},
    {"\xe2\x81\xa6", 3, "U+2066"},
    {"\xe2\x81\xa9", 3, "U+2069"},
};

START_TEST(test_reject_models) {
  st_msg_type_t t = _i == 0 ? ST_MSG_XCHG_REQ : ST_MSG_XCHG_REPLY;
  w_t* w = w_new(BUF_CAP);
  for (size_t i = 0; i < sizeof bad_models / sizeof bad_models[0]; i++) {
    const bad_model_t* b = &bad_models[i];
    /* Alone, and after a valid prefix. */
    for (int pre = 0; pre < 2; pre++) {
      char s[64] = "mlp:4-4 ";
      size_t at = pre ? strlen(s) : 0;
      memcpy(s + at, b->s, b->n);
      xw_t x = {FIELDS(t), 1, 16, s, at + b->n, 0, 0, 0};
      w_info(w, t, &x);
      tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, b->what);
    }
  }
  /* Too long: ST_XCHG_MODEL_MAX bytes and more; one less decodes. */
  char longest[300];
  memset(longest, 'm', sizeof longest);
  static const size_t lens[] = {ST_XCHG_MODEL_MAX, ST_XCHG_MODEL_MAX + 1, 255};
  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
    xw_t x = {FIELDS(t), 1, 16, longest, lens[i], 0, 0, 0};
    w_info(w, t, &x);
    tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "too long");
  }
  xw_t x = {FIELDS(t), 1, 16, longest, ST_XCHG_MODEL_MAX - 1, 0, 0, 0};
  w_info(w, t, &x);
  st_msg_t d;
  ck_assert_int_eq(st_wire_decode(w->b, w->n, &d, NULL), 0);
  ck_assert_uint_eq(strlen(d.u.xchg_req.model), ST_XCHG_MODEL_MAX - 1);
  w_free(w);
}
END_TEST

/* A model str whose declared length is beyond the bytes left (str32 of
 * 4 GiB, str16 of 64 KiB): refused by the walk before msgpack-c. */
START_TEST(test_reject_hostile_lengths) {
  static const uint8_t fp[16];
  const struct {
    uint8_t head[5];
    size_t head_len;
  } heads[] = {
      {{0xdb, 0xff, 0xff, 0xff, 0xff}, 5},
      {{0xda, 0xff, 0xff}, 3},
      {{0xd9, 0x80}, 2},
      {{0xbf}, 1},
  };
  w_t* w = w_new(BUF_CAP);
  for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
    w->n = 0;
    w_byte(w, 0x98), w_uint(w, ST_MSG_XCHG_REQ), w_uint(w, 1);
    w_uint(w, 1), w_bin(w, fp, 16);
    w_raw(w, heads[i].head, heads[i].head_len);
    w_raw(w, "abc", 3);
    tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_LIMIT, "str length");
  }
  w_free(w);
}
END_TEST

/* Random byte flips of valid encodings: decoded or refused with exactly
 * one drop, and whatever decodes re-encodes (so its model is valid). */
START_TEST(test_mutations) {
  for (int it = 0; it < 20000; it++) {
    st_msg_t m;
    rand_xchg(types[st_rng_below(&rng, NTYPES)],
              (size_t) st_rng_below(&rng, ST_XCHG_MODEL_MAX), &m);
    uint8_t buf[BUF_CAP];
    size_t len = 0;
    ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
    st_msg_t d;
    if (!tw_mutate_decode(&rng, buf, len, &d))
      continue;
    uint8_t again[BUF_CAP];
    size_t n2 = 0;
    ck_assert_int_eq(st_wire_encode(&d, again, sizeof again, &n2), 0);
    st_msg_t d2;
    ck_assert_int_eq(st_wire_decode(again, n2, &d2, NULL), 0);
    if (d.type == ST_MSG_XCHG_REQ || d.type == ST_MSG_XCHG_REPLY ||
        d.type == ST_MSG_XCHG_DONE || d.type == ST_MSG_XCHG_CODED)
      ck_assert(msg_same(&d, &d2));
    st_wire_msg_free(&d);
    st_wire_msg_free(&d2);
  }
}
END_TEST

/* A REPLY's tensor list: up to ST_XCHG_TENSORS_MAX bytes decode (borrowed
 * from the input); one more is LIMIT, a bin or an integer is FIELD, and the
 * encoder refuses what the decoder would. */
START_TEST(test_reply_tensors) {
  size_t cap = ST_XCHG_TENSORS_MAX + 1024;
  char* big = malloc(ST_XCHG_TENSORS_MAX + 1);
  uint8_t* buf = malloc(cap);
  ck_assert(big != NULL && buf != NULL);
  memset(big, 'a', ST_XCHG_TENSORS_MAX + 1);
  st_msg_t m, d;
  rand_xchg(ST_MSG_XCHG_REPLY, 3, &m);
  m.u.xchg_reply.tensors = big;
  m.u.xchg_reply.tensors_len = ST_XCHG_TENSORS_MAX;
  size_t len = 0;
  ck_assert_int_eq(st_wire_encode(&m, buf, cap, &len), 0);
  ck_assert_int_eq(st_wire_decode(buf, len, &d, NULL), 0);
  ck_assert_uint_eq(d.u.xchg_reply.tensors_len, ST_XCHG_TENSORS_MAX);
  ck_assert_ptr_eq(d.u.xchg_reply.tensors,
                   (const char*) buf + len - ST_XCHG_TENSORS_MAX);
  m.u.xchg_reply.tensors_len = ST_XCHG_TENSORS_MAX + 1;
  ck_assert_int_eq(st_wire_encode(&m, buf, cap, &len), -EINVAL);
  m.u.xchg_reply.tensors = NULL;
  m.u.xchg_reply.tensors_len = 1;
  ck_assert_int_eq(st_wire_encode(&m, buf, cap, &len), -EINVAL);

  w_t* w = w_new(cap);
  xw_t x = {6, 2, 16, "m", 1, 0, 0, 0}; /* the tensor list written below */
  w_info(w, ST_MSG_XCHG_REPLY, &x);
  w->b[0] = 0x99; /* 9 elements */
  size_t head = w->n;
  w_str(w, big, ST_XCHG_TENSORS_MAX + 1);
  tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_LIMIT, "tensors too long");
  w->n = head;
  w_bin(w, big, 10);
  tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "tensors as bin");
  w->n = head;
  w_uint(w, 7);
  tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "tensors as int");
  w->n = head;
  w_str(w, "x\tF32\t1\n", 8);
  ck_assert_int_eq(st_wire_decode(w->b, w->n, &d, NULL), 0);
  ck_assert_uint_eq(d.u.xchg_reply.tensors_len, 8);
  ck_assert_mem_eq(d.u.xchg_reply.tensors, "x\tF32\t1\n", 8);
  w_free(w);
  free(buf);
  free(big);
}
END_TEST

/* XCHG_CODED as the decoder sees it: a piece at the very end of the
 * largest total decodes (data borrowed from the input); an empty piece, a
 * piece past its total, a total over ST_XCHG_CODED_MAX_BYTES and data over
 * ST_WIRE_CHUNK_MAX_BYTES are refused, as are fields of the wrong type. */
START_TEST(test_coded_pieces) {
  size_t cap = ST_WIRE_CHUNK_MAX_BYTES + 1024;
  uint8_t* big = calloc(1, ST_WIRE_CHUNK_MAX_BYTES + 1);
  w_t* w = w_new(cap);
  ck_assert(big != NULL);
  st_msg_t d;
  const uint64_t max = ST_XCHG_CODED_MAX_BYTES;
  const struct {
    uint64_t offset, total;
    size_t len;
    int bin; /* 1: data a bin; 0: a str */
    int want;
    st_wire_drop_t why;
  } cases[] = {
      {max - 4, max, 4, 1, 0, 0},
      {0, ST_WIRE_CHUNK_MAX_BYTES, ST_WIRE_CHUNK_MAX_BYTES, 1, 0, 0},
      {0, 4, 0, 1, -EBADMSG, ST_WIRE_DROP_FIELD},
      {1, 4, 4, 1, -EBADMSG, ST_WIRE_DROP_FIELD},
      {5, 4, 1, 1, -EBADMSG, ST_WIRE_DROP_FIELD},
      {UINT64_MAX, 4, 1, 1, -EBADMSG, ST_WIRE_DROP_FIELD},
      {0, max + 1, 4, 1, -EBADMSG, ST_WIRE_DROP_LIMIT},
      {0, UINT64_MAX, 4, 1, -EBADMSG, ST_WIRE_DROP_LIMIT},
      {0, 2 * (uint64_t) ST_WIRE_CHUNK_MAX_BYTES, ST_WIRE_CHUNK_MAX_BYTES + 1,
       1, -EBADMSG, ST_WIRE_DROP_LIMIT},
      {0, 4, 4, 0, -EBADMSG, ST_WIRE_DROP_FIELD},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    w->n = 0;
    w_byte(w, 0x95), w_uint(w, ST_MSG_XCHG_CODED), w_uint(w, 1);
    w_uint(w, cases[i].offset), w_uint(w, cases[i].total);
    if (cases[i].bin)
      w_bin(w, big, cases[i].len);
    else
      w_str(w, big, cases[i].len);
    if (cases[i].want == 0) {
      ck_assert_int_eq(st_wire_decode(w->b, w->n, &d, NULL), 0);
      ck_assert_uint_eq(d.u.xchg_coded.offset, cases[i].offset);
      ck_assert_uint_eq(d.u.xchg_coded.total, cases[i].total);
      ck_assert_uint_eq(d.u.xchg_coded.data_len, cases[i].len);
      ck_assert_ptr_eq(d.u.xchg_coded.data, w->b + w->n - cases[i].len);
    } else {
      tw_expect_drop(w->b, w->n, cases[i].want, cases[i].why, "coded piece");
    }
  }
  /* A negative offset, and a total as a str. */
  w->n = 0;
  w_byte(w, 0x95), w_uint(w, ST_MSG_XCHG_CODED), w_uint(w, 1);
  w_byte(w, 0xff), w_uint(w, 4), w_bin(w, big, 4);
  tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "negative offset");
  w->n = 0;
  w_byte(w, 0x95), w_uint(w, ST_MSG_XCHG_CODED), w_uint(w, 1);
  w_uint(w, 0), w_str(w, "4", 1), w_bin(w, big, 4);
  tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "total as str");
  w_free(w);
  free(big);
}
END_TEST

/* ==== The fuzz seeds ========================================================
 */

static const char* const seed_names[NTYPES] = {"xchg_req", "xchg_reply",
                                               "xchg_done", "xchg_coded"};

/* The seeds, from a fixed seed: one valid encoding per type. */
static void seed_msg(int i, st_msg_t* m) {
  st_rng_seed(&rng, 20240611 + (uint64_t) i);
  rand_xchg(types[i], 0, m);
  if (types[i] == ST_MSG_XCHG_REQ) {
    m->u.xchg_req.kind = ST_XCHG_AVERAGE;
    strcpy(m->u.xchg_req.model, "mlp:784-256-128-10 f32");
    m->u.xchg_req.n_params = 235146;
  } else if (types[i] == ST_MSG_XCHG_REPLY) {
    static const char tensors[] = "fc.weight\tF32\t10,784\nfc.bias\tF32\t10\n";
    m->u.xchg_reply.status = ST_XCHG_STATUS_MISMATCH;
    strcpy(m->u.xchg_reply.model, "attached:2 tensors,7850 params,fc.weight");
    m->u.xchg_reply.n_params = 7850;
    m->u.xchg_reply.tensors = tensors;
    m->u.xchg_reply.tensors_len = sizeof tensors - 1;
  } else if (types[i] == ST_MSG_XCHG_CODED) {
    /* An int8 encoding of [0.5, -1, 0.3] (docs/protocol.md, "Compressed
     * deltas"), sent whole. */
    static const uint8_t int8[] = {1, 2, 0, 0,    0,    1,    0,   0,
                                   3, 0, 0, 0,    0,    0,    0,   0,
                                   4, 2, 1, 0x3c, 0x40, 0x81, 0x26};
    m->u.xchg_coded.offset = 0;
    m->u.xchg_coded.total = sizeof int8;
    m->u.xchg_coded.data = int8;
    m->u.xchg_coded.data_len = sizeof int8;
  }
}

/* Found by fuzzing: an XCHG_REPLY whose fields are empty strings and
 * arrays. msgpack-c gives an empty string a NULL pointer, which the model
 * copy must not hand to memcpy (UBSan caught it). It must be refused
 * cleanly. */
START_TEST(test_regress_empty_strings) {
  static const uint8_t msg[] = {
      0x97, 0x22, 0x01, 0x02, 0xa0, 0xa0, 0x96, 0x00, 0x00, 0x05, 0x54, 0xff,
      0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x54, 0x54, 0x54, 0x54, 0x54, 0x54,
      0x54, 0x54, 0x54, 0x54, 0xa0, 0xa0, 0x96, 0xa0, 0xa0, 0xa0, 0xa0, 0xa0,
      0xa0, 0xa0, 0xa0, 0xa0, 0xa0, 0xa0, 0xa0, 0xa0, 0xa0, 0xa0, 0xa0, 0xa0,
      0xa0, 0xa0, 0xa0, 0xa0, 0xa0, 0xa0, 0x10, 0x2c, 0x3c, 0x41, 0x05, 0x52,
      0x33, 0xe3, 0x3f, 0xb1, 0x0c, 0x14, 0xa0, 0xa0, 0xa0, 0xa0, 0xa0, 0xa0,
      0xa0, 0xa0, 0xa0, 0xa0, 0xa0, 0xa0, 0xa0, 0xa0, 0xa0, 0xa0, 0xa0, 0xa0,
      0xa0, 0xa0, 0xa0, 0xa0, 0xa0, 0xa0, 0xa0, 0xa0, 0x10, 0x2c, 0x3c, 0x41,
      0x05, 0x52, 0x33, 0xe3, 0x3f, 0xb1, 0x0c, 0x14};
  st_wire_counters_t c;
  memset(&c, 0, sizeof c);
  st_msg_t m;
  ck_assert_int_ne(st_wire_decode(msg, sizeof msg, &m, &c), 0);
}
END_TEST

START_TEST(test_fuzz_corpus) {
  for (int i = 0; i < NTYPES; i++) {
    st_msg_t m;
    seed_msg(i, &m);
    tw_fuzz_seed(&m, seed_names[i]);
  }
}
END_TEST

static Suite* wire_xchg_suite(void) {
  Suite* s = suite_create("wire_xchg");
  TCase* tr = tcase_create("round_trip");
  tcase_add_checked_fixture(tr, setup, NULL);
  tcase_add_loop_test(tr, test_round_trip, 0, NTYPES);
  tcase_add_test(tr, test_model_lengths);
  tcase_add_test(tr, test_known_answer);
  tcase_add_test(tr, test_encode_refuses);
  tcase_add_test(tr, test_fuzz_corpus);
  suite_add_tcase(s, tr);
  TCase* td = tcase_create("decode_rejects");
  tcase_add_checked_fixture(td, setup, NULL);
  tcase_add_loop_test(td, test_reject_truncated, 0, NTYPES);
  tcase_add_loop_test(td, test_reject_field_count, 0, NTYPES);
  tcase_add_loop_test(td, test_reject_fields, 0, 2);
  tcase_add_test(td, test_reject_done_hash);
  tcase_add_loop_test(td, test_reject_models, 0, 2);
  tcase_add_test(td, test_reject_hostile_lengths);
  tcase_add_test(td, test_reply_tensors);
  tcase_add_test(td, test_coded_pieces);
  tcase_add_test(td, test_mutations);
  tcase_add_test(td, test_regress_empty_strings);
  suite_add_tcase(s, td);
  return s;
}

int main(void) {
  return tw_main(wire_xchg_suite);
}
