/* test_wire.c: the Check suite for the wire codec (gossip/wire.c,
 * gossip/wire_scan.c; layouts in gossip.h): round trips of every message
 * type with random contents, a known-answer encoding, the encoder's
 * refusals, and the decoder's rejections, each checked by its return code
 * and by the counter it bumps: truncation at every length, trailing bytes,
 * versions, types, field counts, every field with every wrong msgpack
 * type, sizes and ranges, hostile declared counts and lengths (which must
 * be refused before msgpack-c allocates: this suite caps allocations under
 * ASan and the address space otherwise), and random mutations of valid
 * encodings.
 *
 * Hostile messages are written with the msgpack writer of
 * tests/wire_testutil.h (no msgpack-c here: STYLE.md rule 6).
 * ST_WIRE_WRITE_CORPUS=DIR writes the fuzz seed corpus (one valid encoding per
 * type) into DIR; otherwise the committed corpus under $ST_SOURCE_DIR is
 * checked to decode. The push-pull message and st_wire_decode_next are tested
 * in test_wire_push_pull.c. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "gossip/gossip.h"
#include "tests/unit/testutil.h"
#include "tests/wire_testutil.h"

TW_ASAN_CAP_ALLOCATIONS()

#define BUF_CAP (ST_WIRE_MAX_MESSAGE_BYTES + 64)
#define W_CAP (BUF_CAP + ST_WIRE_CHUNK_MAX_BYTES) /* a hand-made message */

/* ==== The layouts of gossip.h, as a table ===================================
 */

typedef enum { F_U8, F_U32, F_U64, F_F32, F_BOOL, F_BIN, F_ADDR, F_DATA } fk_t;

typedef struct {
  fk_t k;
  uint32_t size;  /* F_BIN: exact bytes; F_DATA: bytes of the valid value */
  uint64_t value; /* integers: the valid value */
} fspec_t;

typedef struct {
  st_msg_type_t type;
  const char* name;
  int n;
  fspec_t f[11];
} mspec_t;

static const mspec_t specs[] = {
    {ST_MSG_HS1, "hs1", 3, {{F_U8, 0, 3}, {F_BIN, 32, 0}, {F_BIN, 16, 0}}},
    {ST_MSG_HS2, "hs2", 2, {{F_BIN, 32, 0}, {F_BIN, 112, 0}}},
    {ST_MSG_HS3, "hs3", 1, {{F_BIN, 112, 0}}},
    {ST_MSG_PING, "ping", 2, {{F_U32, 0, 7}, {F_BIN, 16, 0}}},
    {ST_MSG_PING_REQ,
     "ping_req",
     4,
     {{F_U32, 0, 7}, {F_BIN, 16, 0}, {F_ADDR, 0, 0}, {F_BOOL, 0, 0}}},
    {ST_MSG_ACK, "ack", 1, {{F_U32, 0, 9}}},
    {ST_MSG_NACK, "nack", 1, {{F_U32, 0, 9}}},
    {ST_MSG_ALIVE,
     "alive",
     5,
     {{F_BIN, 16, 0},
      {F_U64, 0, 1},
      {F_ADDR, 0, 0},
      {F_BIN, 32, 0},
      {F_BIN, 64, 0}}},
    {ST_MSG_SUSPECT,
     "suspect",
     3,
     {{F_BIN, 16, 0}, {F_U64, 0, 1}, {F_BIN, 16, 0}}},
    {ST_MSG_DEAD,
     "dead",
     4,
     {{F_BIN, 16, 0}, {F_U64, 0, 1}, {F_BIN, 16, 0}, {F_BIN, 64, 0}}},
    {ST_MSG_STATUS,
     "status",
     11,
     {{F_BIN, 16, 0},
      {F_U64, 0, 5},
      {F_U64, 0, 6},
      {F_F32, 0, 0},
      {F_F32, 0, 0},
      {F_F32, 0, 0},
      {F_BIN, 16, 0},
      {F_BOOL, 0, 0},
      {F_BOOL, 0, 0},
      {F_BIN, 1, 0}, /* keys: 0..2 ids; the valid value here is one */
      {F_BIN, 64, 0}}},
    {ST_MSG_TENSOR_CHUNK,
     "tensor_chunk",
     4,
     {{F_U64, 0, 1}, {F_U64, 0, 3}, {F_U64, 0, 100}, {F_DATA, 8, 0}}},
};
#define NSPECS ((int) (sizeof specs / sizeof specs[0]))

/* Values put in a field's place: the valid one, and the wrong ones. */
typedef enum {
  V_VALID = 0,
  V_NIL,
  V_FALSE,
  V_TRUE,
  V_UINT0,
  V_UINT1,
  V_UINT256,
  V_UINT65536,
  V_UINT2P32,
  V_UINTMAX,
  V_NINT1,    /* -1 as a negative fixint */
  V_NINT_I64, /* INT64_MIN as int64 */
  V_F32,
  V_F64,
  V_F64_HUGE, /* 1e300, beyond float32 */
  V_STR4,
  V_STR16,
  V_BIN0,
  V_BIN4,
  V_BIN5,
  V_BIN6,
  V_BIN15,
  V_BIN16,
  V_BIN17,
  V_BIN31,
  V_BIN32,
  V_BIN33,
  V_BIN111,
  V_BIN112,
  V_BIN113,
  V_ARRAY0,
  V_MAP0,
  V_FIXEXT1,
  V_ADDR_BIN5, /* [bin5, port] */
  V_ADDR_STR,  /* [str4, port] */
  V_ADDR_ONE,  /* [bin4] */
  V_ADDR_THREE,
  V_ADDR_PORT_BIG,
  V_ADDR_PORT_NEG,
  V_ADDR_PORT_NIL,
  V_ADDR_PORT_F32,
  V_COUNT
} v_t;

static void w_addr(w_t* w, int ip_len, int port_variant) {
  w_array(w, 2);
  w_bin(w, NULL, (size_t) ip_len);
  if (port_variant == 0)
    w_uint(w, 7946);
  if (port_variant == 1)
    w_uint(w, 65536);
  if (port_variant == 2)
    w_byte(w, 0xff); /* -1 */
  if (port_variant == 3)
    w_byte(w, 0xc0);
  if (port_variant == 4)
    w_f32(w, 7946.0f);
}

static void w_value(w_t* w, const fspec_t* f, v_t v) {
  static const uint8_t bin_sizes[] = {0,  4,  5,  6,   15,  16, 17,
                                      31, 32, 33, 111, 112, 113};
  switch (v) {
    case V_VALID:
      switch (f->k) {
        case F_U8:
        case F_U32:
        case F_U64:
          w_uint(w, f->value);
          break;
        case F_F32:
          w_f32(w, 1.5f);
          break;
        case F_BOOL:
          w_byte(w, 0xc3);
          break;
        case F_BIN:
        case F_DATA:
          w_bin(w, NULL, f->size);
          break;
        case F_ADDR:
          w_addr(w, 4, 0);
          break;
      }
      break;
    case V_NIL:
      w_byte(w, 0xc0);
      break;
    case V_FALSE:
      w_byte(w, 0xc2);
      break;
    case V_TRUE:
      w_byte(w, 0xc3);
      break;
    case V_UINT0:
      w_uint(w, 0);
      break;
    case V_UINT1:
      w_uint(w, 1);
      break;
    case V_UINT256:
      w_uint(w, 256);
      break;
    case V_UINT65536:
      w_uint(w, 65536);
      break;
    case V_UINT2P32:
      w_uint(w, UINT64_C(1) << 32);
      break;
    case V_UINTMAX:
      w_uint(w, UINT64_MAX);
      break;
    case V_NINT1:
      w_byte(w, 0xff);
      break;
    case V_NINT_I64:
      w_byte(w, 0xd3), w_be(w, UINT64_C(1) << 63, 8);
      break;
    case V_F32:
      w_f32(w, 2.0f);
      break;
    case V_F64:
      w_f64(w, 2.0);
      break;
    case V_F64_HUGE:
      w_f64(w, 1e300);
      break;
    case V_STR4:
      w_byte(w, 0xa4), w_be(w, 0x61626364, 4);
      break;
    case V_STR16:
      w_byte(w, 0xb0);
      for (int i = 0; i < 16; i++)
        w_byte(w, 'x');
      break;
    case V_BIN0:
    case V_BIN4:
    case V_BIN5:
    case V_BIN6:
    case V_BIN15:
    case V_BIN16:
    case V_BIN17:
    case V_BIN31:
    case V_BIN32:
    case V_BIN33:
    case V_BIN111:
    case V_BIN112:
    case V_BIN113:
      w_bin(w, NULL, bin_sizes[v - V_BIN0]);
      break;
    case V_ARRAY0:
      w_byte(w, 0x90);
      break;
    case V_MAP0:
      w_byte(w, 0x80);
      break;
    case V_FIXEXT1:
      w_byte(w, 0xd4), w_byte(w, 1), w_byte(w, 0);
      break;
    case V_ADDR_BIN5:
      w_addr(w, 5, 0);
      break;
    case V_ADDR_STR:
      w_array(w, 2), w_byte(w, 0xa4), w_be(w, 0x7f000001, 4), w_uint(w, 1);
      break;
    case V_ADDR_ONE:
      w_array(w, 1), w_bin(w, NULL, 4);
      break;
    case V_ADDR_THREE:
      w_array(w, 3), w_bin(w, NULL, 4), w_uint(w, 1), w_uint(w, 1);
      break;
    case V_ADDR_PORT_BIG:
      w_addr(w, 16, 1);
      break;
    case V_ADDR_PORT_NEG:
      w_addr(w, 4, 2);
      break;
    case V_ADDR_PORT_NIL:
      w_addr(w, 4, 3);
      break;
    case V_ADDR_PORT_F32:
      w_addr(w, 4, 4);
      break;
    case V_COUNT:
      break;
  }
}

/* Whether v is an acceptable value for field f (then it is not a test of a
 * wrong field). */
static int v_valid(const fspec_t* f, v_t v) {
  if (v == V_VALID)
    return 1;
  int small_uint = v == V_UINT0 || v == V_UINT1;
  int uint32 = small_uint || v == V_UINT256 || v == V_UINT65536;
  switch (f->k) {
    case F_U8:
      return small_uint;
    case F_U32:
      return uint32;
    case F_U64:
      return uint32 || v == V_UINT2P32 || v == V_UINTMAX;
    case F_F32:
      return v == V_F32 || v == V_F64;
    case F_BOOL:
      return v == V_FALSE || v == V_TRUE;
    case F_BIN:
      return (f->size == 1 && v == V_BIN0) || (f->size == 16 && v == V_BIN16) ||
             (f->size == 32 && v == V_BIN32) ||
             (f->size == 112 && v == V_BIN112);
    case F_DATA:
      /* Data of 0..28 floats at offset 3 of 100. */
      return v == V_BIN0 || v == V_BIN4 || v == V_BIN16 || v == V_BIN32 ||
             v == V_BIN112;
    case F_ADDR:
      return 0;
  }
  return 0;
}

/* Writes spec s's message with field bad replaced by value v (bad < 0: all
 * valid). */
static void w_msg(w_t* w, const mspec_t* s, int bad, v_t v) {
  w->n = 0;
  w_array(w, (uint32_t) (2 + s->n));
  w_uint(w, s->type);
  w_uint(w, ST_WIRE_VERSION);
  for (int i = 0; i < s->n; i++)
    w_value(w, &s->f[i], i == bad ? v : V_VALID);
}

/* ==== Random messages and equality ==========================================
 */

static st_rng_t rng;

static void setup(void) {
  st_rng_seed(&rng, tu_seed());
}

/* Any width: small values, edges and full-range values alike. */
static uint64_t rand_uint(uint64_t max) {
  uint64_t v;
  switch (st_rng_below(&rng, 4)) {
    case 0:
      v = st_rng_below(&rng, 200);
      return v <= max ? v : max;
    case 1:
      v = st_rng_below(&rng, 3);
      return v <= max ? max - v : 0;
    default:
      return max == UINT64_MAX ? st_rng_next(&rng)
                               : st_rng_below(&rng, max + 1);
  }
}

static float rand_f32(void) {
  switch (st_rng_below(&rng, 6)) {
    case 0:
      return NAN;
    case 1:
      return st_rng_below(&rng, 2) ? INFINITY : -INFINITY;
    case 2: {
      uint32_t u = (uint32_t) st_rng_next(&rng); /* any bits, NaNs too */
      float f;
      memcpy(&f, &u, 4);
      return f;
    }
    default:
      return (float) st_rng_normal(&rng) * 10.0f;
  }
}

static void rand_addr(st_wire_addr_t* a) {
  memset(a, 0, sizeof *a);
  a->ip_len = st_rng_below(&rng, 2) ? 4 : 16;
  tw_rand_bytes(&rng, a->ip, a->ip_len);
  a->port = (uint16_t) rand_uint(UINT16_MAX);
}

/* A random valid message of type t; a chunk's data (at most data_max bytes)
 * goes into data. */
static void rand_msg(st_msg_type_t t, st_msg_t* m, uint8_t* data,
                     size_t data_max) {
  memset(m, 0, sizeof *m);
  m->type = t;
  switch (t) {
    case ST_MSG_HS1:
      m->u.hs1.version = ST_WIRE_VERSION;
      m->u.hs1.key_id = (uint8_t) rand_uint(UINT8_MAX);
      tw_rand_bytes(&rng, m->u.hs1.ephemeral, sizeof m->u.hs1.ephemeral);
      tw_rand_bytes(&rng, m->u.hs1.mac, sizeof m->u.hs1.mac);
      break;
    case ST_MSG_HS2:
      tw_rand_bytes(&rng, (uint8_t*) &m->u.hs2, sizeof m->u.hs2);
      break;
    case ST_MSG_HS3:
      tw_rand_bytes(&rng, (uint8_t*) &m->u.hs3, sizeof m->u.hs3);
      break;
    case ST_MSG_PING:
      m->u.ping.seq = (uint32_t) rand_uint(UINT32_MAX);
      tw_rand_bytes(&rng, m->u.ping.target.b, 16);
      break;
    case ST_MSG_PING_REQ:
      m->u.ping_req.seq = (uint32_t) rand_uint(UINT32_MAX);
      tw_rand_bytes(&rng, m->u.ping_req.target.b, 16);
      rand_addr(&m->u.ping_req.target_addr);
      m->u.ping_req.want_nack = st_rng_below(&rng, 2);
      break;
    case ST_MSG_ACK:
    case ST_MSG_NACK:
      m->u.ack.seq = (uint32_t) rand_uint(UINT32_MAX);
      break;
    case ST_MSG_ALIVE:
      tw_rand_bytes(&rng, m->u.alive.node.b, 16);
      m->u.alive.incarnation = rand_uint(UINT64_MAX);
      rand_addr(&m->u.alive.addr);
      tw_rand_bytes(&rng, m->u.alive.public_key, sizeof m->u.alive.public_key);
      tw_rand_bytes(&rng, m->u.alive.signature, sizeof m->u.alive.signature);
      break;
    case ST_MSG_SUSPECT:
    case ST_MSG_DEAD:
      tw_rand_bytes(&rng, m->u.suspect.node.b, 16);
      m->u.suspect.incarnation = rand_uint(UINT64_MAX);
      tw_rand_bytes(&rng, m->u.suspect.from.b, 16);
      if (m->type == ST_MSG_DEAD) /* SUSPECT carries none */
        tw_rand_bytes(&rng, m->u.dead.signature, sizeof m->u.dead.signature);
      break;
    case ST_MSG_STATUS:
      tw_rand_bytes(&rng, m->u.status.node.b, 16);
      m->u.status.seq = rand_uint(UINT64_MAX);
      m->u.status.step = rand_uint(UINT64_MAX);
      m->u.status.loss = rand_f32();
      m->u.status.accuracy = rand_f32();
      m->u.status.samples_per_sec = rand_f32();
      tw_rand_bytes(&rng, m->u.status.fingerprint, 16);
      m->u.status.ring_capable = st_rng_below(&rng, 2);
      m->u.status.synced = st_rng_below(&rng, 2);
      m->u.status.n_keys = (uint8_t) (1 + st_rng_below(&rng, 2));
      m->u.status.keys[0] = (uint8_t) st_rng_below(&rng, 256);
      m->u.status.keys[1] =
          (uint8_t) (m->u.status.keys[0] + 1 + st_rng_below(&rng, 255));
      tw_rand_bytes(&rng, m->u.status.signature, sizeof m->u.status.signature);
      break;
    case ST_MSG_TENSOR_CHUNK: {
      st_msg_tensor_chunk_t* c = &m->u.chunk;
      uint64_t count = st_rng_below(&rng, data_max / 4 + 1);
      c->transfer_id = rand_uint(UINT64_MAX);
      c->total = count + rand_uint((UINT64_C(1) << 40) - count);
      c->offset = rand_uint(c->total - count);
      c->data_len = (uint32_t) (4 * count);
      tw_rand_bytes(&rng, data, c->data_len);
      c->data = data;
      break;
    }
    case ST_MSG_PUSH_PULL: /* test_wire_push_pull.c */
    case ST_MSG_XCHG_REQ:  /* test_wire_xchg.c */
    case ST_MSG_XCHG_REPLY:
    case ST_MSG_XCHG_DONE:
    case ST_MSG_XCHG_CODED:
    case ST_MSG_SYNC_REQ: /* test_gossip_sync.c */
    case ST_MSG_SYNC_REPLY:
    case ST_MSG_RING_SEG: /* test_wire_ring.c */
    /* test_wire_ring_form.c */
    case ST_MSG_RING_PROPOSE:
    case ST_MSG_RING_ACCEPT:
    case ST_MSG_RING_CONFIRM:
    case ST_MSG_RING_CANCEL:
    case ST_MSG_RING_LANE: /* test_wire_ring.c */
    /* test_gossip_coll.c */
    case ST_MSG_COLL_HELLO:
    case ST_MSG_COLL_SEG:
    case ST_MSG_COLL_ABORT:
    case ST_MSG_COLL_FETCH:
    case ST_MSG_ADMIN_REQ: /* test_keys_messages */
    case ST_MSG_ADMIN_REPLY:
      break;
  }
}

/* ==== Round trips ===========================================================
 */

static void round_trip(const st_msg_t* m, size_t* enc_len) {
  static uint8_t buf[BUF_CAP];
  st_msg_t d;
  size_t len = tw_round_trip(m, buf, sizeof buf, &d);
  if (m->type == ST_MSG_TENSOR_CHUNK && d.u.chunk.data_len > 0) {
    ck_assert(d.u.chunk.data >= buf &&
              d.u.chunk.data + d.u.chunk.data_len <= buf + len);
  }
  if (enc_len != NULL)
    *enc_len = len;
}

START_TEST(test_round_trip) {
  const mspec_t* s = &specs[_i];
  static uint8_t data[4096];
  for (int it = 0; it < 500; it++) {
    st_msg_t m;
    rand_msg(s->type, &m, data, sizeof data);
    round_trip(&m, NULL);
  }
}
END_TEST

START_TEST(test_chunk_sizes) {
  uint8_t* data = malloc(ST_WIRE_CHUNK_MAX_BYTES);
  ck_assert_ptr_nonnull(data);
  tw_rand_bytes(&rng, data, ST_WIRE_CHUNK_MAX_BYTES);
  const uint32_t sizes[] = {
      0, 4, 8, 1020, ST_WIRE_CHUNK_MAX_BYTES - 4, ST_WIRE_CHUNK_MAX_BYTES};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    st_msg_t m;
    memset(&m, 0, sizeof m);
    m.type = ST_MSG_TENSOR_CHUNK;
    m.u.chunk.transfer_id = UINT64_MAX;
    m.u.chunk.total = UINT64_C(1) << 40;
    m.u.chunk.offset = m.u.chunk.total - sizes[i] / 4;
    m.u.chunk.data = data;
    m.u.chunk.data_len = sizes[i];
    size_t len;
    round_trip(&m, &len);
    if (sizes[i] == ST_WIRE_CHUNK_MAX_BYTES) {
      /* [type, version, three u64, bin32]: 3 + 27 + 5 bytes of envelope. */
      ck_assert_uint_eq(len, ST_WIRE_CHUNK_MAX_BYTES + 35);
    }
  }
  free(data);
}
END_TEST

/* The data of a decoded chunk is the input's own bytes, not a copy. */
START_TEST(test_chunk_borrows_input) {
  w_t* w = w_new(W_CAP);
  w_msg(w, &specs[NSPECS - 1], -1, V_VALID);
  st_msg_t m;
  ck_assert_int_eq(st_wire_decode(w->b, w->n, &m, NULL), 0);
  ck_assert_uint_eq(m.u.chunk.data_len, 8);
  ck_assert_ptr_eq(m.u.chunk.data, w->b + w->n - 8);
  ck_assert_uint_eq(m.u.chunk.offset, 3);
  ck_assert_uint_eq(m.u.chunk.total, 100);
  w_free(w);
}
END_TEST

/* PING {seq 1, target 00..0f}, byte by byte as the msgpack spec has it. */
START_TEST(test_known_answer) {
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_PING;
  m.u.ping.seq = 1;
  for (int i = 0; i < 16; i++)
    m.u.ping.target.b[i] = (uint8_t) i;
  uint8_t want[22] = {0x94, 0x10, 0x01, 0x01, 0xc4, 0x10};
  for (int i = 0; i < 16; i++)
    want[6 + i] = (uint8_t) i;
  uint8_t buf[64];
  size_t len = 0;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  ck_assert_uint_eq(len, sizeof want);
  ck_assert_mem_eq(buf, want, sizeof want);
}
END_TEST

/* Any integer encoding that fits is accepted: the type, the version and the
 * fields as uint64, uint16, int8 and int64. */
START_TEST(test_wide_integers) {
  const uint8_t msg[] = {
      0x92 + 2, 0xcd, 0x00, 0x10,                             /* type 16 */
      0xd0,     0x01,                                         /* version 1 */
      0xd3,     0,    0,    0,    0,  0x12, 0x34, 0x56, 0x78, /* seq */
      0xc4,     0x10, 1,    2,    3,  4,    5,    6,    7,
      8,        9,    10,   11,   12, 13,   14,   15,   16};
  st_msg_t m;
  ck_assert_int_eq(st_wire_decode(msg, sizeof msg, &m, NULL), 0);
  ck_assert_int_eq(m.type, ST_MSG_PING);
  ck_assert_uint_eq(m.u.ping.seq, 0x12345678u);
  ck_assert_uint_eq(m.u.ping.target.b[15], 16);
  /* STATUS with float64 values, narrowed; NaN and infinity are values. */
  w_t* w = w_new(W_CAP);
  w_array(w, 13), w_uint(w, ST_MSG_STATUS), w_uint(w, 1);
  w_bin(w, NULL, 16), w_uint(w, 1), w_uint(w, 2);
  w_f64(w, 0.1), w_f64(w, NAN), w_f64(w, -INFINITY);
  w_bin(w, NULL, 16), w_byte(w, 0xc2), w_byte(w, 0xc3);
  w_bin(w, (const uint8_t[]){167, 42}, 2), w_bin(w, NULL, 64);
  ck_assert_int_eq(st_wire_decode(w->b, w->n, &m, NULL), 0);
  ck_assert(m.u.status.loss == 0.1f);
  ck_assert(isnan(m.u.status.accuracy));
  ck_assert(isinf(m.u.status.samples_per_sec) &&
            m.u.status.samples_per_sec < 0);
  ck_assert(!m.u.status.ring_capable && m.u.status.synced);
  ck_assert(m.u.status.n_keys == 2 && m.u.status.keys[0] == 167 &&
            m.u.status.keys[1] == 42);
  /* Keys: one id twice, or three ids, is not a keyring. */
  static const uint8_t bad_keys[][3] = {{7, 7, 0}, {1, 2, 3}};
  for (int k = 0; k < 2; k++) {
    w->n = 0;
    w_array(w, 13), w_uint(w, ST_MSG_STATUS), w_uint(w, 1);
    w_bin(w, NULL, 16), w_uint(w, 1), w_uint(w, 2);
    w_f32(w, 0), w_f32(w, 0), w_f32(w, 0);
    w_bin(w, NULL, 16), w_byte(w, 0xc2), w_byte(w, 0xc3);
    w_bin(w, bad_keys[k], k == 0 ? 2 : 3), w_bin(w, NULL, 64);
    ck_assert_int_eq(st_wire_decode(w->b, w->n, &m, NULL), -EBADMSG);
  }
  w_free(w);
}
END_TEST

/* ADMIN_REQ and ADMIN_REPLY (gossip.h, "Cluster requests"): each op and
 * result round-trips and survives truncation; what is not a request or a
 * reply is refused as a field (or limit) drop. */
START_TEST(test_admin_messages) {
  static uint8_t buf[BUF_CAP];
  st_msg_t m, d;
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_ADMIN_REQ;
  for (uint8_t op = ST_ADMIN_KEY_INSTALL; op <= ST_ADMIN_FORCE_LEAVE; op++) {
    m.u.admin_req =
        (st_msg_admin_req_t){.op = op, .key_id = (uint8_t) (op * 80)};
    m.u.admin_req.subject_len = op == ST_ADMIN_KEY_INSTALL   ? 32
                                : op == ST_ADMIN_FORCE_LEAVE ? 16
                                                             : 0;
    if (op == ST_ADMIN_FORCE_LEAVE)
      m.u.admin_req.key_id = 0;
    tw_rand_bytes(&rng, m.u.admin_req.subject, m.u.admin_req.subject_len);
    size_t len = tw_round_trip(&m, buf, sizeof buf - 1, &d);
    tw_expect_truncations(buf, len);
  }
  memset(m.u.admin_req.subject, 0x5c, 16); /* the seed: a fixed force-leave */
  tw_fuzz_seed(&m, "admin_req"); /* the fuzz seeds are these messages */
  static const char why[] = "member 7cc3: key 9 is not accepted by all";
  m.type = ST_MSG_ADMIN_REPLY;
  m.u.admin_reply = (st_msg_admin_reply_t){
      ST_ADMIN_REFUSED, 2, {9, 4}, why, (uint32_t) strlen(why)};
  size_t len = tw_round_trip(&m, buf, sizeof buf - 1, &d);
  tw_expect_truncations(buf, len);
  tw_fuzz_seed(&m, "admin_reply");
  m.u.admin_reply = (st_msg_admin_reply_t){ST_ADMIN_DONE, 1, {9, 0}, NULL, 0};
  tw_round_trip(&m, buf, sizeof buf, &d);

  /* Refused: unknown ops, a subject where none belongs or none where one
   * does, a subject of the wrong length, a force-leave naming a key id,
   * an unknown result, a keyring of one id twice or of three, a reason
   * beyond ST_ADMIN_REASON_MAX. */
  w_t* w = w_new(W_CAP);
  static const struct {
    uint8_t op, key_id;
    uint32_t subject_len;
  } bad_req[] = {{0, 7, 0},
                 {5, 7, 0},
                 {ST_ADMIN_KEY_USE, 7, 32},
                 {ST_ADMIN_KEY_INSTALL, 7, 0},
                 {ST_ADMIN_KEY_INSTALL, 7, 31},
                 {ST_ADMIN_KEY_REMOVE, 7, 1},
                 {ST_ADMIN_FORCE_LEAVE, 0, 32},
                 {ST_ADMIN_FORCE_LEAVE, 0, 0},
                 {ST_ADMIN_FORCE_LEAVE, 7, 16}};
  for (size_t i = 0; i < sizeof bad_req / sizeof bad_req[0]; i++) {
    w->n = 0;
    w_array(w, 5), w_uint(w, ST_MSG_ADMIN_REQ), w_uint(w, ST_WIRE_VERSION);
    w_uint(w, bad_req[i].op), w_uint(w, bad_req[i].key_id);
    w_bin(w, NULL, bad_req[i].subject_len);
    tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "admin_req");
  }
  static const struct {
    uint8_t result;
    uint8_t keys[3];
    uint32_t n_keys, reason_len;
    st_wire_drop_t why;
  } bad_reply[] = {{3, {1}, 1, 0, ST_WIRE_DROP_FIELD},
                   {0, {5, 5}, 2, 0, ST_WIRE_DROP_FIELD},
                   {0, {1, 2, 3}, 3, 0, ST_WIRE_DROP_FIELD},
                   {2, {1}, 1, ST_ADMIN_REASON_MAX + 1, ST_WIRE_DROP_LIMIT}};
  static char reason[ST_ADMIN_REASON_MAX + 1];
  memset(reason, 'x', sizeof reason);
  for (size_t i = 0; i < sizeof bad_reply / sizeof bad_reply[0]; i++) {
    w->n = 0;
    w_array(w, 5), w_uint(w, ST_MSG_ADMIN_REPLY), w_uint(w, ST_WIRE_VERSION);
    w_uint(w, bad_reply[i].result);
    w_bin(w, bad_reply[i].keys, bad_reply[i].n_keys);
    w_str(w, reason, bad_reply[i].reason_len);
    tw_expect_drop(w->b, w->n, -EBADMSG, bad_reply[i].why, "admin_reply");
  }
  w_free(w);
}
END_TEST

/* st_wire_peek_type reads the type from the envelope in any integer
 * encoding (the daemon routes ring formation packets by it), and refuses
 * what is not an array of two unsigned integers. */
START_TEST(test_peek_type) {
  static const struct {
    uint8_t b[12];
    size_t len;
    int rc;
    uint64_t type;
  } cases[] = {
      {{0x94, 41, 1, 0xc0}, 4, 0, 41},                /* fixarray, fixint */
      {{0x94, 0xcc, 42, 1}, 4, 0, 42},                /* uint8 */
      {{0x94, 0xcd, 0, 43, 0xd0, 1}, 6, 0, 43},       /* uint16, int8 */
      {{0xdc, 0, 4, 0xce, 0, 0, 0, 44, 1}, 9, 0, 44}, /* array16, uint32 */
      {{0x92, 0xd0, 41, 1}, 4, 0, 41},                /* int8, non-negative */
      {{0x93, 5, 1, 0xc0}, 4, 0, 5},                  /* any type */
      {{0x94, 41}, 2, -EBADMSG, 0},                   /* no version */
      {{0x91, 41, 1}, 3, -EBADMSG, 0},                /* one element */
      {{0x82, 41, 1}, 3, -EBADMSG, 0},                /* a map */
      {{0x94, 0xff, 1}, 3, -EBADMSG, 0},              /* negative type */
      {{0x94, 0xa1, 'x', 1}, 4, -EBADMSG, 0},         /* a string type */
      {{0x94, 0xcd, 0}, 3, -EBADMSG, 0},              /* truncated uint16 */
      {{0xdc, 0}, 2, -EBADMSG, 0},                    /* truncated header */
      {{0}, 0, -EBADMSG, 0},                          /* nothing */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint64_t type = 12345;
    int rc = st_wire_peek_type(cases[i].b, cases[i].len, &type);
    ck_assert_msg(rc == cases[i].rc, "case %zu: rc %d, want %d", i, rc,
                  cases[i].rc);
    if (rc == 0)
      ck_assert_msg(type == cases[i].type, "case %zu: type %llu", i,
                    (unsigned long long) type);
  }
  uint64_t type;
  ck_assert_int_eq(st_wire_peek_type(NULL, 0, &type), -EINVAL);
}
END_TEST

/* ==== Encoder refusals ======================================================
 */

START_TEST(test_encode_refuses) {
  static uint8_t buf[BUF_CAP];
  static uint8_t data[ST_WIRE_CHUNK_MAX_BYTES + 8];
  size_t len = 12345;
  st_msg_t m;

  /* Chunks: too large, not whole floats, beyond the tensor's end. */
  struct {
    uint64_t offset, total;
    uint32_t data_len;
    int null_data;
  } chunks[] = {
      {0, 1u << 20, ST_WIRE_CHUNK_MAX_BYTES + 4, 0},
      {0, 100, 6, 0},
      {0, 100, 1, 0},
      {99, 100, 8, 0},
      {101, 100, 0, 0},
      {0, 1, 8, 0},
      {UINT64_MAX, UINT64_MAX, 4, 0},
      {0, (UINT64_C(1) << 40) + 1, 4, 0},
      {0, 100, 8, 1},
  };
  for (size_t i = 0; i < sizeof chunks / sizeof chunks[0]; i++) {
    memset(&m, 0, sizeof m);
    m.type = ST_MSG_TENSOR_CHUNK;
    m.u.chunk.offset = chunks[i].offset;
    m.u.chunk.total = chunks[i].total;
    m.u.chunk.data_len = chunks[i].data_len;
    m.u.chunk.data = chunks[i].null_data ? NULL : data;
    ck_assert_msg(st_wire_encode(&m, buf, sizeof buf, &len) == -EINVAL,
                  "chunk case %zu", i);
  }
  /* Addresses that are neither IPv4 nor IPv6. */
  const uint8_t ip_lens[] = {0, 1, 5, 15, 17, 255};
  for (size_t i = 0; i < sizeof ip_lens; i++) {
    memset(&m, 0, sizeof m);
    m.type = ST_MSG_PING_REQ;
    m.u.ping_req.target_addr.ip_len = ip_lens[i];
    ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
    memset(&m, 0, sizeof m);
    m.type = ST_MSG_ALIVE;
    m.u.alive.addr.ip_len = ip_lens[i];
    ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  }
  /* Unknown types, and an HS1 of another version. */
  const int types[] = {0, 4, 15, 25, 31, 33, 255, 256, -1};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    memset(&m, 0, sizeof m);
    m.type = (st_msg_type_t) types[i];
    ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  }
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_HS1;
  m.u.hs1.version = ST_WIRE_VERSION + 1;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  ck_assert_int_eq(st_wire_encode(NULL, buf, sizeof buf, &len), -EINVAL);
  ck_assert_uint_eq(len, 12345); /* untouched on failure */
}
END_TEST

/* Every capacity short of the encoding is -EMSGSIZE, and writes nothing
 * past it. */
START_TEST(test_encode_too_small) {
  const mspec_t* s = &specs[_i];
  static uint8_t data[256];
  static uint8_t buf[1024], full[1024];
  for (int it = 0; it < 20; it++) {
    st_msg_t m;
    rand_msg(s->type, &m, data, sizeof data);
    size_t need = 0;
    ck_assert_int_eq(st_wire_encode(&m, full, sizeof full, &need), 0);
    for (size_t cap = 0; cap < need; cap++) {
      size_t len = 777;
      memset(buf, 0x5a, sizeof buf);
      int rc = st_wire_encode(&m, cap ? buf : NULL, cap, &len);
      /* Plain ifs in this loop: each passing ck_assert costs a write. */
      if (rc != -EMSGSIZE || len != 777)
        ck_abort_msg("cap %zu of %zu: rc %d, len %zu", cap, need, rc, len);
      size_t j = cap;
      while (j < sizeof buf && buf[j] == 0x5a)
        j++;
      if (j != sizeof buf)
        ck_abort_msg("cap %zu: wrote byte %zu", cap, j);
      /* What was written is a prefix of the encoding. */
      j = 0;
      while (j < cap && (buf[j] == full[j] || buf[j] == 0x5a))
        j++;
      if (j != cap)
        ck_abort_msg("cap %zu: byte %zu differs", cap, j);
    }
    size_t len = 0;
    ck_assert_int_eq(st_wire_encode(&m, buf, need, &len), 0);
    ck_assert_uint_eq(len, need);
  }
}
END_TEST

START_TEST(test_encode_max_chunk_too_small) {
  static uint8_t data[ST_WIRE_CHUNK_MAX_BYTES];
  static uint8_t buf[BUF_CAP];
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_TENSOR_CHUNK;
  m.u.chunk.total = ST_WIRE_CHUNK_MAX_BYTES / 4;
  m.u.chunk.data = data;
  m.u.chunk.data_len = ST_WIRE_CHUNK_MAX_BYTES;
  size_t len = 0;
  ck_assert_int_eq(st_wire_encode(&m, buf, ST_WIRE_CHUNK_MAX_BYTES, &len),
                   -EMSGSIZE);
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  ck_assert_int_eq(st_wire_encode(&m, buf, len - 1, &len), -EMSGSIZE);
}
END_TEST

/* ==== Decoder rejections ====================================================
 */

START_TEST(test_reject_truncated) {
  const mspec_t* s = &specs[_i];
  static uint8_t data[64];
  static uint8_t buf[1024];
  for (int it = 0; it < 10; it++) {
    st_msg_t m;
    rand_msg(s->type, &m, data, sizeof data);
    size_t len = 0;
    ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
    for (size_t n = 0; n < len; n++) {
      /* A copy of exactly n bytes, so that ASan sees any read past it. */
      uint8_t* p = malloc(n ? n : 1);
      memcpy(p, buf, n);
      st_wire_counters_t c;
      memset(&c, 0, sizeof c);
      st_msg_t d;
      ck_assert_int_eq(st_wire_decode(p, n, &d, &c), -EBADMSG);
      /* Cut inside a value: malformed; cut short of a declared count or
       * length: limit. Either way, exactly one drop. */
      ck_assert_uint_eq(
          c.drops[ST_WIRE_DROP_MALFORMED] + c.drops[ST_WIRE_DROP_LIMIT], 1);
      ck_assert_uint_eq(tw_drops_total(&c), 1);
      if (n < 3)
        ck_assert_uint_eq(c.drops[ST_WIRE_DROP_MALFORMED], 1);
      free(p);
    }
  }
}
END_TEST

START_TEST(test_reject_trailing) {
  const mspec_t* s = &specs[_i];
  w_t* w = w_new(W_CAP);
  const uint8_t extra[] = {0x00, 0xc0, 0x90, 0xc1, 0xff};
  for (size_t i = 0; i < sizeof extra; i++) {
    w_msg(w, s, -1, V_VALID);
    w_byte(w, extra[i]);
    tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_MALFORMED, s->name);
  }
  /* Two whole messages in one buffer. */
  w_msg(w, s, -1, V_VALID);
  size_t one = w->n;
  memcpy(w->b + one, w->b, one);
  w->n = 2 * one;
  tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_MALFORMED, s->name);
  w_free(w);
}
END_TEST

START_TEST(test_reject_envelope) {
  const uint8_t empty[1] = {0};
  tw_expect_drop(empty, 0, -EBADMSG, ST_WIRE_DROP_MALFORMED, "empty");
  tw_expect_drop(NULL, 0, -EBADMSG, ST_WIRE_DROP_MALFORMED, "NULL, 0");
  /* Not an array, an array too short, a type or version not an unsigned
   * integer. */
  const struct {
    uint8_t b[8];
    size_t n;
  } bad[] = {
      {{0x10}, 1},
      {{0xc0}, 1},
      {{0x90}, 1},
      {{0x91, 0x10}, 2},
      {{0x92, 0xff, 0x01}, 3},
      {{0x92, 0x10, 0xff}, 3},
      {{0x92, 0xc0, 0x01}, 3},
      {{0x92, 0x10, 0xc3}, 3},
      {{0x92, 0xa1, 0x41, 0x01}, 4},
      {{0x92, 0x10, 0xca, 0x3f, 0x80, 0, 0}, 7},
      {{0x81, 0x10, 0x01}, 3},
      {{0xc1}, 1},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    tw_expect_drop(bad[i].b, bad[i].n, -EBADMSG, ST_WIRE_DROP_MALFORMED,
                   "envelope");
}
END_TEST

START_TEST(test_reject_version) {
  const mspec_t* s = &specs[_i];
  w_t* w = w_new(W_CAP);
  const uint64_t versions[] = {0, 2, 255, 65536, UINT64_MAX};
  for (size_t i = 0; i < sizeof versions / sizeof versions[0]; i++) {
    w_msg(w, s, -1, V_VALID);
    /* Rewrite with the other version: [n, type, version, fields...]. */
    w_t* v = w_new(W_CAP);
    w_array(v, (uint32_t) (2 + s->n));
    w_uint(v, s->type);
    w_uint(v, versions[i]);
    memcpy(v->b + v->n, w->b + 3, w->n - 3);
    v->n += w->n - 3;
    tw_expect_drop(v->b, v->n, -EPROTONOSUPPORT, ST_WIRE_DROP_VERSION, s->name);
    /* The version is checked before the body and the type: a body of any
     * shape, or a type unknown to us, is still a version drop. */
    v->n = 0;
    w_array(v, 2);
    w_uint(v, 200);
    w_uint(v, versions[i]);
    tw_expect_drop(v->b, v->n, -EPROTONOSUPPORT, ST_WIRE_DROP_VERSION, "bare");
    w_free(v);
  }
  w_free(w);
}
END_TEST

START_TEST(test_reject_unknown_type) {
  const uint64_t types[] = {0,  4,   15,  25,       31,
                            39, 127, 255, 1u << 16, UINT64_MAX};
  w_t* w = w_new(W_CAP);
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    w->n = 0;
    w_array(w, 3), w_uint(w, types[i]), w_uint(w, ST_WIRE_VERSION);
    w_uint(w, 1);
    tw_expect_drop(w->b, w->n, -ENOMSG, ST_WIRE_DROP_UNKNOWN_TYPE, "type");
    /* Known before the body is walked. */
    w->n = 0;
    w_array(w, 2), w_uint(w, types[i]), w_uint(w, ST_WIRE_VERSION);
    tw_expect_drop(w->b, w->n, -ENOMSG, ST_WIRE_DROP_UNKNOWN_TYPE, "bare");
  }
  w_free(w);
}
END_TEST

START_TEST(test_reject_field_count) {
  const mspec_t* s = &specs[_i];
  w_t* w = w_new(W_CAP);
  /* One field short, and one extra (nil, or a copy of the last). */
  w->n = 0;
  w_array(w, (uint32_t) (1 + s->n));
  w_uint(w, s->type);
  w_uint(w, ST_WIRE_VERSION);
  for (int i = 0; i < s->n - 1; i++)
    w_value(w, &s->f[i], V_VALID);
  tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "short");
  w->n = 0;
  w_array(w, (uint32_t) (3 + s->n));
  w_uint(w, s->type);
  w_uint(w, ST_WIRE_VERSION);
  for (int i = 0; i < s->n; i++)
    w_value(w, &s->f[i], V_VALID);
  w_byte(w, 0xc0);
  tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "long");
  /* No fields at all. */
  w->n = 0;
  w_array(w, 2), w_uint(w, s->type), w_uint(w, ST_WIRE_VERSION);
  tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "none");
  w_free(w);
}
END_TEST

/* Every field of every type, in turn, with every value of the wrong msgpack
 * type, size or range. */
START_TEST(test_reject_fields) {
  const mspec_t* s = &specs[_i];
  w_t* w = w_new(W_CAP);
  w_msg(w, s, -1, V_VALID);
  st_msg_t m;
  ck_assert_int_eq(st_wire_decode(w->b, w->n, &m, NULL), 0);
  int tried = 0;
  for (int f = 0; f < s->n; f++) {
    for (int v = 1; v < V_COUNT; v++) {
      w_msg(w, s, f, (v_t) v);
      char what[64];
      snprintf(what, sizeof what, "%s field %d value %d", s->name, f, v);
      if (v_valid(&s->f[f], (v_t) v)) {
        /* Of the right type and range; a chunk's offset and total may
         * still break the chunk rules (test_reject_chunk_limits). */
        int rc = st_wire_decode(w->b, w->n, &m, NULL);
        ck_assert_msg(
            rc == 0 || (s->type == ST_MSG_TENSOR_CHUNK && rc == -EBADMSG),
            "%s: rc %d", what, rc);
        continue;
      }
      tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, what);
      tried++;
    }
  }
  ck_assert_int_gt(tried, 20 * s->n);
  w_free(w);
}
END_TEST

START_TEST(test_reject_chunk_limits) {
  w_t* w = w_new(W_CAP);
  struct {
    uint64_t offset, total;
    uint32_t bytes;
    st_wire_drop_t why;
  } cases[] = {
      {0, 1u << 20, ST_WIRE_CHUNK_MAX_BYTES + 4, ST_WIRE_DROP_LIMIT},
      {0, 1u << 20, ST_WIRE_CHUNK_MAX_BYTES + 1, ST_WIRE_DROP_LIMIT},
      {0, (UINT64_C(1) << 40) + 1, 4, ST_WIRE_DROP_LIMIT},
      {0, UINT64_MAX, 4, ST_WIRE_DROP_LIMIT},
      {0, 100, 6, ST_WIRE_DROP_FIELD},
      {0, 100, 3, ST_WIRE_DROP_FIELD},
      {99, 100, 8, ST_WIRE_DROP_FIELD},
      {101, 100, 0, ST_WIRE_DROP_FIELD},
      {UINT64_MAX, 100, 0, ST_WIRE_DROP_FIELD},
      {0, 0, 4, ST_WIRE_DROP_FIELD},
      {UINT64_C(1) << 40, UINT64_C(1) << 40, 4, ST_WIRE_DROP_FIELD},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    w->n = 0;
    w_array(w, 6), w_uint(w, ST_MSG_TENSOR_CHUNK), w_uint(w, 1);
    w_uint(w, 1), w_uint(w, cases[i].offset), w_uint(w, cases[i].total);
    w_bin(w, NULL, cases[i].bytes);
    char what[32];
    snprintf(what, sizeof what, "chunk case %zu", i);
    tw_expect_drop(w->b, w->n, -EBADMSG, cases[i].why, what);
  }
  /* The edges that are fine: offset + count == total, and total 2^40. */
  w->n = 0;
  w_array(w, 6), w_uint(w, ST_MSG_TENSOR_CHUNK), w_uint(w, 1), w_uint(w, 1);
  w_uint(w, (UINT64_C(1) << 40) - 2), w_uint(w, UINT64_C(1) << 40);
  w_bin(w, NULL, 8);
  st_msg_t m;
  ck_assert_int_eq(st_wire_decode(w->b, w->n, &m, NULL), 0);
  /* A whole message over the cap is refused before it is read. */
  w->n = 0;
  w_array(w, 6), w_uint(w, ST_MSG_TENSOR_CHUNK), w_uint(w, 1), w_uint(w, 1);
  w_uint(w, 0), w_uint(w, 1u << 20);
  w_bin(w, NULL, ST_WIRE_MAX_MESSAGE_BYTES);
  tw_expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_LIMIT, "over the cap");
  tw_expect_drop(w->b, ST_WIRE_MAX_MESSAGE_BYTES + 1, -EBADMSG,
                 ST_WIRE_DROP_LIMIT, "one over the cap");
  w_free(w);
}
END_TEST

/* ==== Hostile inputs ========================================================
 */

typedef struct {
  const char* what;
  uint8_t b[48];
  size_t n;
  st_wire_drop_t why;
} hostile_t;

/* E = the envelope of a PING: [4 elements, type 16, version 1]. */
#define E 0x94, 0x10, 0x01
static const hostile_t hostile[] = {
    {"array32 of 2^32-1, nothing else",
     {0xdd, 0xff, 0xff, 0xff, 0xff},
     5,
     ST_WIRE_DROP_MALFORMED},
    {"map32 of 2^32-1",
     {0xdf, 0xff, 0xff, 0xff, 0xff},
     5,
     ST_WIRE_DROP_MALFORMED},
    {"array32 of 2^32-1 with an envelope",
     {0xdd, 0xff, 0xff, 0xff, 0xff, 0x10, 0x01},
     7,
     ST_WIRE_DROP_LIMIT},
    {"array16 of 65535 with an envelope",
     {0xdc, 0xff, 0xff, 0x10, 0x01},
     5,
     ST_WIRE_DROP_LIMIT},
    {"array16 of 17 nils (over the element cap)",
     {0xdc, 0x00, 0x11, 0x10, 0x01, 0xc0, 0xc0, 0xc0, 0xc0, 0xc0, 0xc0,
      0xc0, 0xc0, 0xc0, 0xc0, 0xc0, 0xc0, 0xc0, 0xc0, 0xc0, 0xc0},
     21,
     ST_WIRE_DROP_LIMIT},
    {"map32 field",
     {E, 0xdf, 0xff, 0xff, 0xff, 0xff, 0xc0},
     9,
     ST_WIRE_DROP_LIMIT},
    {"map16 field", {E, 0xde, 0xff, 0xff, 0xc0}, 7, ST_WIRE_DROP_LIMIT},
    {"fixmap of 15 with 20 bytes",
     {E, 0x8f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
     24,
     ST_WIRE_DROP_LIMIT},
    {"nested array16 bombs",
     {E, 0xdc, 0xff, 0xff, 0xdc, 0xff, 0xff, 0xdc, 0xff, 0xff, 0xdc, 0xff,
      0xff},
     15,
     ST_WIRE_DROP_LIMIT},
    {"nested arrays owing more than is left",
     {E, 0x93, 0x9f, 0xc0, 0xc0, 0xc0, 0xc0, 0xc0, 0xc0, 0xc0, 0xc0, 0xc0, 0xc0,
      0xc0, 0xc0, 0xc0, 0xc0, 0xc0, 0xc0},
     21,
     ST_WIRE_DROP_LIMIT},
    {"str32 of 2^32-1",
     {E, 0x01, 0xdb, 0xff, 0xff, 0xff, 0xff, 0x41},
     10,
     ST_WIRE_DROP_LIMIT},
    {"bin32 of 2^32-1",
     {E, 0x01, 0xc6, 0xff, 0xff, 0xff, 0xff, 0x41},
     10,
     ST_WIRE_DROP_LIMIT},
    {"bin16 of 65535",
     {E, 0x01, 0xc5, 0xff, 0xff, 0x41},
     8,
     ST_WIRE_DROP_LIMIT},
    {"ext32 of 2^32-1",
     {E, 0x01, 0xc9, 0xff, 0xff, 0xff, 0xff, 0x01, 0x41},
     11,
     ST_WIRE_DROP_LIMIT},
    {"fixext16 cut short",
     {E, 0x01, 0xd8, 0x01, 0x41},
     7,
     ST_WIRE_DROP_MALFORMED},
    {"uint64 cut short", {E, 0xcf, 0, 0, 0}, 7, ST_WIRE_DROP_MALFORMED},
    {"the unused type byte 0xc1", {E, 0x01, 0xc1}, 5, ST_WIRE_DROP_MALFORMED},
    {"depth 5", {E, 0x01, 0x91, 0x91, 0x91, 0xc0}, 8, ST_WIRE_DROP_LIMIT},
};
#undef E

static void run_hostile(void) {
  for (size_t i = 0; i < sizeof hostile / sizeof hostile[0]; i++) {
    const hostile_t* h = &hostile[i];
    /* Exactly n bytes on the heap, so that ASan sees any read past them. */
    uint8_t* p = malloc(h->n);
    memcpy(p, h->b, h->n);
    tw_expect_drop(p, h->n, -EBADMSG, h->why, h->what);
    free(p);
  }
  /* Depth: [E, [[x]]] is depth 4 and walks (then fails as a field);
   * [E, [[[x]]]] is depth 5 and does not. */
  const uint8_t d4[] = {0x93, 0x12, 0x01, 0x91, 0x91, 0xc0};
  tw_expect_drop(d4, sizeof d4, -EBADMSG, ST_WIRE_DROP_FIELD, "depth 4");
  const uint8_t d5[] = {0x93, 0x12, 0x01, 0x91, 0x91, 0x91, 0xc0};
  tw_expect_drop(d5, sizeof d5, -EBADMSG, ST_WIRE_DROP_LIMIT, "depth 5");
  /* 100 000 nested fixarrays of one: deep, and no stack grows with it. */
  size_t n = 100000;
  uint8_t* deep = malloc(n + 3);
  deep[0] = 0x93, deep[1] = 0x12, deep[2] = 0x01;
  memset(deep + 3, 0x91, n - 1);
  deep[n + 2] = 0xc0;
  tw_expect_drop(deep, n + 3, -EBADMSG, ST_WIRE_DROP_LIMIT, "depth 100000");
  free(deep);
}

START_TEST(test_hostile) {
  run_hostile();
}
END_TEST

/* The same inputs with the address space capped at what the process uses
 * now plus 64 MiB, so that any large allocation fails (and the decode
 * would then not report the limit drop expected). ASan reserves terabytes
 * of shadow up front, so there the cap is max_allocation_size_mb instead
 * (TW_ASAN_CAP_ALLOCATIONS above). */
START_TEST(test_hostile_capped) {
  tw_run_address_capped(run_hostile);
}
END_TEST

/* ==== Random mutations ======================================================
 */

static int rc_allowed(int rc) {
  return rc == 0 || rc == -EBADMSG || rc == -EPROTONOSUPPORT || rc == -ENOMSG;
}

START_TEST(test_mutations) {
  static uint8_t data[512];
  static uint8_t enc[8192], enc2[8192];
  uint8_t* buf = malloc(4096);
  long accepted = 0, by_reason[ST_WIRE_DROP_COUNT] = {0};
  for (int it = 0; it < 100000; it++) {
    st_msg_t m;
    rand_msg(specs[st_rng_below(&rng, NSPECS)].type, &m, data, 64);
    size_t len = 0;
    ck_assert_int_eq(st_wire_encode(&m, buf, 4096, &len), 0);
    int edits = 1 + (int) st_rng_below(&rng, 4);
    for (int e = 0; e < edits; e++) {
      size_t at = len ? st_rng_below(&rng, len) : 0;
      switch (st_rng_below(&rng, 6)) {
        case 0: /* flip a bit */
          if (len)
            buf[at] ^= (uint8_t) (1u << st_rng_below(&rng, 8));
          break;
        case 1: /* overwrite with a random or an interesting byte */
          if (len) {
            static const uint8_t hot[] = {0x00, 0x7f, 0x80, 0xc0, 0xc1,
                                          0xc4, 0xc6, 0xca, 0xcb, 0xcf,
                                          0xd3, 0xdc, 0xdd, 0xdf, 0xff};
            buf[at] = st_rng_below(&rng, 2)
                          ? (uint8_t) st_rng_next(&rng)
                          : hot[st_rng_below(&rng, sizeof hot)];
          }
          break;
        case 2: /* insert */
          if (len < 4000) {
            memmove(buf + at + 1, buf + at, len - at);
            buf[at] = (uint8_t) st_rng_next(&rng);
            len++;
          }
          break;
        case 3: /* delete */
          if (len) {
            memmove(buf + at, buf + at + 1, len - at - 1);
            len--;
          }
          break;
        case 4: /* truncate */
          len = at;
          break;
        default: /* duplicate a slice */
          if (len && len < 2000) {
            size_t n = st_rng_below(&rng, len - at) + 1;
            memmove(buf + at + n, buf + at, len - at);
            len += n;
          }
          break;
      }
    }
    uint8_t* p = malloc(len ? len : 1);
    memcpy(p, buf, len);
    st_wire_counters_t c;
    memset(&c, 0, sizeof c);
    st_msg_t d;
    int rc = st_wire_decode(p, len, &d, &c);
    ck_assert_msg(rc_allowed(rc), "rc %d", rc);
    ck_assert_uint_eq(tw_drops_total(&c), rc == 0 ? 0 : 1);
    if (rc == 0) {
      /* Whatever decodes re-encodes, and decodes to the same message. */
      accepted++;
      size_t n1 = 0, n2 = 0;
      ck_assert_int_eq(st_wire_encode(&d, enc, sizeof enc, &n1), 0);
      st_msg_t d2;
      ck_assert_int_eq(st_wire_decode(enc, n1, &d2, NULL), 0);
      ck_assert(msg_same(&d, &d2));
      ck_assert_int_eq(st_wire_encode(&d2, enc2, sizeof enc2, &n2), 0);
      ck_assert(n1 == n2 && memcmp(enc, enc2, n1) == 0);
      if (d.type == ST_MSG_TENSOR_CHUNK && d.u.chunk.data_len > 0)
        ck_assert(d.u.chunk.data >= p &&
                  d.u.chunk.data + d.u.chunk.data_len <= p + len);
    } else {
      for (int r = 0; r < ST_WIRE_DROP_COUNT; r++)
        by_reason[r] += c.drops[r];
    }
    free(p);
  }
  fprintf(stderr,
          "wire mutations: %ld accepted; dropped malformed %ld, limit %ld, "
          "version %ld, unknown type %ld, field %ld\n",
          accepted, by_reason[0], by_reason[1], by_reason[2], by_reason[3],
          by_reason[4]);
  free(buf);
}
END_TEST

/* ==== Names and the fuzz corpus =============================================
 */

START_TEST(test_drop_names) {
  const char* want[] = {"wire_malformed", "wire_limit", "wire_version",
                        "wire_unknown_type", "wire_field"};
  for (int r = 0; r < ST_WIRE_DROP_COUNT; r++)
    ck_assert_str_eq(st_wire_drop_name((st_wire_drop_t) r), want[r]);
  ck_assert_ptr_nonnull(st_wire_drop_name(ST_WIRE_DROP_COUNT));
  ck_assert_ptr_nonnull(st_wire_drop_name((st_wire_drop_t) -1));
}
END_TEST

/* Writes (ST_WIRE_WRITE_CORPUS=DIR) or checks ($ST_SOURCE_DIR) the seed
 * corpus of tests/fuzz/fuzz_wire_decode.c: one valid encoding per type
 * from a fixed seed, named after the type. */
START_TEST(test_fuzz_corpus) {
  const char* out = getenv("ST_WIRE_WRITE_CORPUS");
  const char* src = getenv("ST_SOURCE_DIR");
  char dir[1024];
  if (out != NULL && *out != '\0') {
    st_rng_seed(&rng, 20240601);
    static uint8_t data[64], buf[1024];
    for (int i = 0; i < NSPECS; i++) {
      st_msg_t m;
      rand_msg(specs[i].type, &m, data, sizeof data);
      size_t len = 0;
      ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
      snprintf(dir, sizeof dir, "%s/%s", out, specs[i].name);
      ck_assert_int_eq(tu_write_file(dir, buf, len), 0);
    }
    return;
  }
  if (src == NULL || *src == '\0')
    return; /* run outside CTest */
  snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/fuzz_wire_decode", src);
  DIR* d = opendir(dir);
  if (d == NULL)
    return; /* no corpus in this checkout */
  int seen = 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE* f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    static uint8_t buf[4096];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    /* A seed is one message or, like a packet's plaintext, several back
     * to back (test_wire_push_pull.c writes one such). */
    size_t off = 0;
    while (off < n) {
      st_msg_t m;
      size_t used = 0;
      ck_assert_msg(
          st_wire_decode_next(buf + off, n - off, &m, &used, NULL) == 0,
          "seed %s at %zu", e->d_name, off);
      st_wire_msg_free(&m);
      off += used;
    }
    ck_assert_msg(n > 0, "seed %s is empty", e->d_name);
    seen++;
  }
  closedir(d);
  ck_assert_int_ge(seen, NSPECS);
}
END_TEST

static Suite* wire_suite(void) {
  Suite* s = suite_create("wire");
  TCase* tr = tcase_create("round_trip");
  tcase_add_checked_fixture(tr, setup, NULL);
  tcase_add_loop_test(tr, test_round_trip, 0, NSPECS);
  tcase_add_test(tr, test_chunk_sizes);
  tcase_add_test(tr, test_chunk_borrows_input);
  tcase_add_test(tr, test_known_answer);
  tcase_add_test(tr, test_wide_integers);
  tcase_add_test(tr, test_peek_type);
  tcase_add_test(tr, test_drop_names);
  tcase_add_test(tr, test_fuzz_corpus);
  tcase_add_test(tr, test_admin_messages);
  suite_add_tcase(s, tr);
  TCase* te = tcase_create("encode");
  tcase_add_checked_fixture(te, setup, NULL);
  tcase_add_test(te, test_encode_refuses);
  tcase_add_loop_test(te, test_encode_too_small, 0, NSPECS);
  tcase_add_test(te, test_encode_max_chunk_too_small);
  suite_add_tcase(s, te);
  TCase* td = tcase_create("decode_rejects");
  tcase_add_checked_fixture(td, setup, NULL);
  tcase_add_loop_test(td, test_reject_truncated, 0, NSPECS);
  tcase_add_loop_test(td, test_reject_trailing, 0, NSPECS);
  tcase_add_test(td, test_reject_envelope);
  tcase_add_loop_test(td, test_reject_version, 0, NSPECS);
  tcase_add_test(td, test_reject_unknown_type);
  tcase_add_loop_test(td, test_reject_field_count, 0, NSPECS);
  tcase_add_loop_test(td, test_reject_fields, 0, NSPECS);
  tcase_add_test(td, test_reject_chunk_limits);
  tcase_add_test(td, test_hostile);
  tcase_add_test(td, test_hostile_capped);
  tcase_add_test(td, test_mutations);
  tcase_set_timeout(td, 300);
  suite_add_tcase(s, td);
  return s;
}

int main(void) {
  return tw_main(wire_suite);
}
