/* test_wire_push_pull.c: the Check suite for the wire codec's push-pull
 * message and for st_wire_decode_next (gossip/wire.c, gossip/wire_scan.c;
 * layouts in gossip.h). Round trips with 0, 1, 7 and
 * ST_WIRE_PUSH_PULL_MAX_ENTRIES (6900) entries (and the time the largest
 * decode takes); the encoder's refusals; the
 * decoder's rejections of entry counts over the limit, of hostile counts
 * that would make msgpack-c allocate gigabytes (under the same allocation
 * cap as test_wire.c), of bad states, arities and fields; concatenations
 * of random messages read back with st_wire_decode_next; truncations and
 * mutations. Every decoded message is freed with st_wire_msg_free, so the
 * ASan build (-DSTARLING_SANITIZE=ON) fails on a leak.
 *
 * ST_WIRE_WRITE_CORPUS=DIR also writes push-pull seeds (and one packet
 * plaintext of several messages) for tests/fuzz/fuzz_wire_decode.c. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "gossip/gossip.h"
#include "tests/unit/testutil.h"
#include "tests/wire_testutil.h"

TW_ASAN_CAP_ALLOCATIONS()

#define BUF_CAP (ST_WIRE_MAX_MESSAGE_BYTES + 64)
#define MAXN ST_WIRE_PUSH_PULL_MAX_ENTRIES
#define W_CAP (2 * BUF_CAP) /* a hand-made message */

/* [24, 1, true, [ (n entries follow) */
static void w_head(w_t* w, uint32_t n) {
  w->n = 0;
  w_array(w, 4), w_uint(w, ST_MSG_PUSH_PULL), w_uint(w, ST_WIRE_VERSION);
  w_byte(w, 0xc3);
  w_array(w, n);
}

/* Entry variants: a valid one of the smallest encoding (129 bytes), and
 * the wrong ones. */
typedef enum {
  E_VALID = 0,
  E_STATE4,
  E_STATE255,
  E_STATE256,
  E_STATE_NEG,
  E_STATE_NIL,
  E_ARITY0,
  E_ARITY5,
  E_ARITY7,
  E_NOT_ARRAY,
  E_NODE15,
  E_INC_NEG,
  E_ADDR_BIN5,
  E_ADDR_PORT_BIG,
  E_KEY31,
  E_SIG63,
  E_COUNT
} e_t;

/* fat: the valid fields at their largest encodings (u64 incarnation, IPv6,
 * two-byte port: 151 bytes), so that a short wrong entry among them still
 * leaves the bytes the walk's 129-a-entry check asks for. */
static void w_entry_(w_t* w, e_t v, int fat) {
  if (v == E_NOT_ARRAY) {
    w_bin(w, NULL, 16);
    return;
  }
  uint32_t arity = v == E_ARITY0   ? 0
                   : v == E_ARITY5 ? 5
                   : v == E_ARITY7 ? 7
                                   : 6;
  w_array(w, arity);
  if (arity == 0)
    return;
  w_bin(w, NULL, v == E_NODE15 ? 15 : 16);
  if (v == E_INC_NEG)
    w_byte(w, 0xff);
  else if (fat)
    w_byte(w, 0xcf), w_be(w, 1, 8);
  else
    w_uint(w, 1);
  switch (v) {
    case E_STATE4:
      w_uint(w, 4);
      break;
    case E_STATE255:
      w_uint(w, 255);
      break;
    case E_STATE256:
      w_uint(w, 256);
      break;
    case E_STATE_NEG:
      w_byte(w, 0xff);
      break;
    case E_STATE_NIL:
      w_byte(w, 0xc0);
      break;
    default:
      w_uint(w, ST_MEMBER_SUSPECT);
      break;
  }
  w_array(w, 2), w_bin(w, NULL, v == E_ADDR_BIN5 ? 5 : fat ? 16 : 4);
  if (v == E_ADDR_PORT_BIG)
    w_uint(w, 65536);
  else if (fat)
    w_byte(w, 0xcd), w_be(w, 7, 2);
  else
    w_uint(w, 7);
  w_bin(w, NULL, v == E_KEY31 ? 31 : 32);
  if (arity == 5)
    return;
  w_bin(w, NULL, v == E_SIG63 ? 63 : 64);
  if (arity == 7)
    w_byte(w, 0xc0);
}

static void w_entry(w_t* w, e_t v) {
  w_entry_(w, v, 0);
}

/* ==== Random messages, equality and drops ===================================
 */

static st_rng_t rng;

static void setup(void) {
  st_rng_seed(&rng, tu_seed());
}

static uint64_t rand_u64(void) {
  switch (st_rng_below(&rng, 3)) {
    case 0:
      return st_rng_below(&rng, 200);
    case 1:
      return UINT64_MAX - st_rng_below(&rng, 3);
    default:
      return st_rng_next(&rng);
  }
}

static void rand_addr(st_wire_addr_t* a) {
  memset(a, 0, sizeof *a);
  a->ip_len = st_rng_below(&rng, 2) ? 4 : 16;
  tw_rand_bytes(&rng, a->ip, a->ip_len);
  a->port = (uint16_t) st_rng_next(&rng);
}

static void rand_entry(st_push_pull_entry_t* e) {
  memset(e, 0, sizeof *e);
  tw_rand_bytes(&rng, e->node.b, 16);
  e->incarnation = rand_u64();
  e->state = (uint8_t) st_rng_below(&rng, 4);
  rand_addr(&e->addr);
  tw_rand_bytes(&rng, e->public_key, sizeof e->public_key);
  tw_rand_bytes(&rng, e->signature, sizeof e->signature);
}

/* A push-pull of n random entries; the caller frees m->u.push_pull.entries
 * with free() (it was not decoded). */
static void rand_push_pull(st_msg_t* m, uint32_t n) {
  memset(m, 0, sizeof *m);
  m->type = ST_MSG_PUSH_PULL;
  m->u.push_pull.is_reply = st_rng_below(&rng, 2);
  m->u.push_pull.n_entries = n;
  if (n > 0) {
    m->u.push_pull.entries = malloc(n * sizeof *m->u.push_pull.entries);
    ck_assert_ptr_nonnull(m->u.push_pull.entries);
    for (uint32_t i = 0; i < n; i++)
      rand_entry(&m->u.push_pull.entries[i]);
  }
}

/* A random message of a few types (a push-pull of up to 7 entries among
 * them), for concatenations. Its allocations (a push-pull's entries, a
 * chunk's data) are freed with rand_free. */
static void rand_any(st_msg_t* m) {
  memset(m, 0, sizeof *m);
  switch (st_rng_below(&rng, 6)) {
    case 0:
      rand_push_pull(m, (uint32_t) st_rng_below(&rng, 8));
      return;
    case 1:
      m->type = ST_MSG_PING;
      m->u.ping.seq = (uint32_t) st_rng_next(&rng);
      tw_rand_bytes(&rng, m->u.ping.target.b, 16);
      return;
    case 2:
      m->type = st_rng_below(&rng, 2) ? ST_MSG_ACK : ST_MSG_NACK;
      m->u.ack.seq = (uint32_t) st_rng_next(&rng);
      return;
    case 3:
      m->type = ST_MSG_ALIVE;
      tw_rand_bytes(&rng, m->u.alive.node.b, 16);
      m->u.alive.incarnation = rand_u64();
      rand_addr(&m->u.alive.addr);
      tw_rand_bytes(&rng, m->u.alive.public_key, 32);
      tw_rand_bytes(&rng, m->u.alive.signature, 64);
      return;
    case 4:
      m->type = st_rng_below(&rng, 2) ? ST_MSG_SUSPECT : ST_MSG_DEAD;
      tw_rand_bytes(&rng, (uint8_t*) &m->u.suspect, sizeof m->u.suspect);
      return;
    default: {
      m->type = ST_MSG_TENSOR_CHUNK;
      uint32_t count = (uint32_t) st_rng_below(&rng, 9);
      uint8_t* data = malloc(4 * count + 1);
      ck_assert_ptr_nonnull(data);
      tw_rand_bytes(&rng, data, 4 * count);
      m->u.chunk.transfer_id = rand_u64();
      m->u.chunk.total = count + st_rng_below(&rng, 100);
      m->u.chunk.offset = m->u.chunk.total - count;
      m->u.chunk.data = data;
      m->u.chunk.data_len = 4 * count;
      return;
    }
  }
}

static void rand_free(st_msg_t* m) {
  if (m->type == ST_MSG_PUSH_PULL)
    free(m->u.push_pull.entries);
  if (m->type == ST_MSG_TENSOR_CHUNK)
    free((void*) m->u.chunk.data);
  memset(m, 0, sizeof *m);
}

/* Decodes b[0..n) (a heap copy of exactly n bytes, so that ASan sees any
 * read past it) expecting rc and exactly one drop counted under why. */
static void expect_drop_(const uint8_t* b, size_t n, int rc, st_wire_drop_t why,
                         const char* what, int line) {
  uint8_t* p = malloc(n ? n : 1);
  ck_assert_ptr_nonnull(p);
  if (n)
    memcpy(p, b, n);
  st_wire_counters_t c;
  memset(&c, 0, sizeof c);
  st_msg_t m;
  int got = st_wire_decode(p, n, &m, &c);
  tw_assert_drop(got, &c, rc, why, what, line);
  /* A refused message owns nothing, and freeing it is harmless. */
  ck_assert_ptr_null(m.u.push_pull.entries);
  st_wire_msg_free(&m);
  free(p);
}
#define expect_drop(b, n, rc, why, what) \
  expect_drop_(b, n, rc, why, what, __LINE__)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
}

/* ==== Round trips ===========================================================
 */

static const uint32_t sizes[] = {0, 1, 7, 15, 16, MAXN};

START_TEST(test_round_trip) {
  static uint8_t buf[BUF_CAP];
  uint32_t n = sizes[_i];
  int reps = n == MAXN ? 3 : 50;
  for (int it = 0; it < reps; it++) {
    st_msg_t m, d;
    rand_push_pull(&m, n);
    size_t len = 0;
    ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
    ck_assert_uint_le(len, ST_WIRE_MAX_MESSAGE_BYTES);
    st_wire_counters_t c;
    memset(&c, 0, sizeof c);
    double t0 = now_s();
    ck_assert_int_eq(st_wire_decode(buf, len, &d, &c), 0);
    double dt = now_s() - t0;
    ck_assert_uint_eq(tw_drops_total(&c), 0);
    ck_assert(msg_same(&m, &d));
    ck_assert(n > 0 || d.u.push_pull.entries == NULL);
    if (n == MAXN && it == 0)
      fprintf(stderr,
              "push-pull of %u entries: %zu bytes, decoded in %.2f ms\n", n,
              len, 1e3 * dt);
    /* decode_next reads the same message and says it used all of it. */
    st_msg_t d2;
    size_t used = 0;
    ck_assert_int_eq(st_wire_decode_next(buf, len, &d2, &used, NULL), 0);
    ck_assert_uint_eq(used, len);
    ck_assert(msg_same(&m, &d2));
    st_wire_msg_free(&d);
    st_wire_msg_free(&d2);
    ck_assert_ptr_null(d.u.push_pull.entries);
    ck_assert_uint_eq(d.u.push_pull.n_entries, 0);
    st_wire_msg_free(&d); /* twice: harmless */
    rand_free(&m);
  }
}
END_TEST

/* The largest entries (u64 incarnation, IPv6, two-byte port), 6900 of
 * them, still fit the message cap. */
START_TEST(test_largest_fits) {
  static uint8_t buf[BUF_CAP];
  st_msg_t m, d;
  rand_push_pull(&m, MAXN);
  for (uint32_t i = 0; i < MAXN; i++) {
    st_push_pull_entry_t* e = &m.u.push_pull.entries[i];
    e->incarnation = UINT64_MAX;
    e->addr.ip_len = 16;
    e->addr.port = 65535;
  }
  size_t len = 0;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  /* [4, 24, 1, bool, array16 header]: 7 bytes; entries of 151. */
  ck_assert_uint_eq(len, 7 + 151u * MAXN);
  ck_assert_uint_le(len, ST_WIRE_MAX_MESSAGE_BYTES);
  ck_assert_int_eq(st_wire_decode(buf, len, &d, NULL), 0);
  ck_assert(msg_same(&m, &d));
  st_wire_msg_free(&d);
  /* One byte short of the encoding: -EMSGSIZE. */
  ck_assert_int_eq(st_wire_encode(&m, buf, len - 1, &len), -EMSGSIZE);
  rand_free(&m);
}
END_TEST

/* The smallest entry is 129 bytes, which the walk's check assumes. */
START_TEST(test_smallest_entry) {
  w_t* w = w_new(W_CAP);
  w_head(w, 1);
  size_t before = w->n;
  w_entry(w, E_VALID);
  ck_assert_uint_eq(w->n - before, 129);
  st_msg_t m;
  ck_assert_int_eq(st_wire_decode(w->b, w->n, &m, NULL), 0);
  ck_assert_uint_eq(m.u.push_pull.n_entries, 1);
  ck_assert(m.u.push_pull.is_reply);
  ck_assert_uint_eq(m.u.push_pull.entries[0].state, ST_MEMBER_SUSPECT);
  ck_assert_uint_eq(m.u.push_pull.entries[0].addr.port, 7);
  st_wire_msg_free(&m);
  /* 6900 of them, hand-written: accepted, exactly at the bound. */
  w_head(w, MAXN);
  for (uint32_t i = 0; i < MAXN; i++)
    w_entry(w, E_VALID);
  ck_assert_int_eq(st_wire_decode(w->b, w->n, &m, NULL), 0);
  ck_assert_uint_eq(m.u.push_pull.n_entries, MAXN);
  st_wire_msg_free(&m);
  w_free(w);
}
END_TEST

/* ==== Encoder refusals ======================================================
 */

START_TEST(test_encode_refuses) {
  static uint8_t buf[BUF_CAP];
  st_msg_t m;
  size_t len = 12345;
  rand_push_pull(&m, MAXN + 1);
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  m.u.push_pull.n_entries = UINT32_MAX;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  m.u.push_pull.n_entries = 7;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  /* A bad state or address in any entry. */
  const uint8_t states[] = {4, 5, 255};
  for (size_t i = 0; i < sizeof states; i++) {
    m.u.push_pull.entries[6].state = states[i];
    ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  }
  m.u.push_pull.entries[6].state = ST_MEMBER_LEFT;
  const uint8_t ip_lens[] = {0, 5, 17};
  for (size_t i = 0; i < sizeof ip_lens; i++) {
    m.u.push_pull.entries[0].addr.ip_len = ip_lens[i];
    ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  }
  m.u.push_pull.entries[0].addr.ip_len = 4;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  rand_free(&m);
  /* Entries missing. */
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_PUSH_PULL;
  m.u.push_pull.n_entries = 1;
  len = 12345;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  ck_assert_uint_eq(len, 12345);
  m.u.push_pull.n_entries = 0;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  ck_assert_uint_eq(len, 5); /* [4, 24, 1, false, []] */
}
END_TEST

/* ==== Decoder rejections ====================================================
 */

START_TEST(test_reject_over_max) {
  w_t* w = w_new(W_CAP);
  /* 6901 valid entries: over the limit, refused by the walk. */
  w_head(w, MAXN + 1);
  for (uint32_t i = 0; i < MAXN + 1; i++)
    w_entry(w, E_VALID);
  expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_LIMIT, "6901 entries");
  /* 65535 declared in an array16, the bytes of 6901 entries given. */
  w->b[5] = 0xff, w->b[6] = 0xff;
  expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_LIMIT, "65535 entries");
  w_free(w);
}
END_TEST

static void run_hostile(void) {
  w_t* w = w_new(W_CAP);
  /* An array32 of 2^32-1 entries, and a few bytes after it. */
  w_head(w, UINT32_MAX);
  ck_assert_uint_eq(w->b[4], 0xdd);
  w_entry(w, E_VALID);
  expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_LIMIT, "array32 of 2^32-1");
  /* The header alone (cut short of its first entry). */
  expect_drop(w->b, 9, -EBADMSG, ST_WIRE_DROP_LIMIT, "array32 header only");
  /* 6900 declared (within the limit), one byte short of 6900 of the
   * smallest entries; and far short, with room for 100. */
  w_head(w, MAXN);
  size_t head = w->n;
  for (uint32_t i = 0; i < MAXN; i++)
    w_entry(w, E_VALID);
  expect_drop(w->b, w->n - 1, -EBADMSG, ST_WIRE_DROP_LIMIT, "one byte short");
  expect_drop(w->b, head + 100 * 129, -EBADMSG, ST_WIRE_DROP_LIMIT,
              "room for 100");
  /* 6900 nils: each element fits a byte, not an entry's 129. */
  w_head(w, MAXN);
  memset(w->b + w->n, 0xc0, MAXN);
  w->n += MAXN;
  expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_LIMIT, "6900 nils");
  /* The allowance is the entries array's alone: an array of 17 in the
   * is_reply slot, inside an entry, or as a PING's field is over the cap. */
  w->n = 0;
  w_array(w, 4), w_uint(w, ST_MSG_PUSH_PULL), w_uint(w, 1);
  w_array(w, 17);
  for (int i = 0; i < 17; i++)
    w_entry(w, E_VALID);
  w_array(w, 0);
  expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_LIMIT, "big is_reply");
  w_head(w, 1);
  w_array(w, 17);
  for (int i = 0; i < 17; i++)
    w_bin(w, NULL, 32);
  expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_LIMIT, "big entry");
  w->n = 0;
  w_array(w, 4), w_uint(w, ST_MSG_PING), w_uint(w, 1), w_uint(w, 1);
  w_array(w, 17);
  for (int i = 0; i < 17; i++)
    w_entry(w, E_VALID);
  expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_LIMIT, "big ping field");
  /* The same through decode_next, with bytes that go on after it. */
  w_head(w, UINT32_MAX);
  for (int i = 0; i < 50; i++)
    w_entry(w, E_VALID);
  st_msg_t m;
  size_t used = 99;
  st_wire_counters_t c;
  memset(&c, 0, sizeof c);
  ck_assert_int_eq(st_wire_decode_next(w->b, w->n, &m, &used, &c), -EBADMSG);
  ck_assert_uint_eq(c.drops[ST_WIRE_DROP_LIMIT], 1);
  ck_assert_uint_eq(used, 0);
  w_free(w);
}

START_TEST(test_hostile) {
  run_hostile();
}
END_TEST

/* As test_wire.c's test_hostile_capped: the address space capped at what
 * the process uses now plus 64 MiB (under ASan, max_allocation_size_mb). */
START_TEST(test_hostile_capped) {
  tw_run_address_capped(run_hostile);
}
END_TEST

/* Every wrong entry, first, in the middle and last of 7: a field error,
 * and nothing allocated is left behind (ASan). */
START_TEST(test_reject_entries) {
  w_t* w = w_new(W_CAP);
  for (int v = 1; v < E_COUNT; v++) {
    for (int at = 0; at < 7; at += 3) {
      w_head(w, 7);
      for (int i = 0; i < 7; i++)
        w_entry_(w, i == at ? (e_t) v : E_VALID, 1);
      char what[48];
      snprintf(what, sizeof what, "entry variant %d at %d", v, at);
      expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, what);
    }
  }
  /* All four states are fine. */
  for (uint8_t s = 0; s <= ST_MEMBER_LEFT; s++) {
    w_head(w, 1);
    w_entry(w, E_VALID);
    w->b[w->n - 66 - 34 - 9] = s; /* the state: before addr, key, sig */
    st_msg_t m;
    ck_assert_int_eq(st_wire_decode(w->b, w->n, &m, NULL), 0);
    ck_assert_uint_eq(m.u.push_pull.entries[0].state, s);
    st_wire_msg_free(&m);
  }
  /* is_reply not a bool; entries not an array; a field short or extra. */
  w->n = 0;
  w_array(w, 4), w_uint(w, ST_MSG_PUSH_PULL), w_uint(w, 1), w_uint(w, 1);
  w_array(w, 0);
  expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "is_reply 1");
  const uint8_t not_array[] = {0xc0, 0x80, 0x00, 0xc3};
  for (size_t i = 0; i < sizeof not_array; i++) {
    w->n = 0;
    w_array(w, 4), w_uint(w, ST_MSG_PUSH_PULL), w_uint(w, 1), w_byte(w, 0xc2);
    w_byte(w, not_array[i]);
    expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "entries");
  }
  w->n = 0;
  w_array(w, 3), w_uint(w, ST_MSG_PUSH_PULL), w_uint(w, 1), w_byte(w, 0xc2);
  expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "short");
  w->n = 0;
  w_array(w, 5), w_uint(w, ST_MSG_PUSH_PULL), w_uint(w, 1), w_byte(w, 0xc2);
  w_array(w, 0), w_byte(w, 0xc0);
  expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_FIELD, "long");
  /* An addr's port nested one deeper than depth 5: the walk's limit. */
  w_head(w, 1);
  w_entry(w, E_VALID);
  /* Rewrite the port (fixint 7, before the 34-byte key and the 66-byte
   * signature) as [7]: shift. */
  size_t port_at = w->n - 66 - 34 - 1;
  memmove(w->b + port_at + 1, w->b + port_at, w->n - port_at);
  w->b[port_at] = 0x91;
  w->n++;
  expect_drop(w->b, w->n, -EBADMSG, ST_WIRE_DROP_LIMIT, "depth 6");
  w_free(w);
}
END_TEST

/* Cut at every length: refused with one drop, nothing leaked. */
START_TEST(test_reject_truncated) {
  static uint8_t buf[4096];
  st_msg_t m;
  rand_push_pull(&m, 3);
  size_t len = 0;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  for (size_t n = 0; n < len; n++) {
    uint8_t* p = malloc(n ? n : 1);
    memcpy(p, buf, n);
    st_wire_counters_t c;
    memset(&c, 0, sizeof c);
    st_msg_t d;
    size_t used = 77;
    ck_assert_int_eq(st_wire_decode_next(p, n, &d, &used, &c), -EBADMSG);
    ck_assert_uint_eq(used, 0);
    ck_assert_uint_eq(
        c.drops[ST_WIRE_DROP_MALFORMED] + c.drops[ST_WIRE_DROP_LIMIT], 1);
    ck_assert_uint_eq(tw_drops_total(&c), 1);
    ck_assert_int_eq(st_wire_decode(p, n, &d, &c), -EBADMSG);
    ck_assert_uint_eq(tw_drops_total(&c), 2);
    free(p);
  }
  rand_free(&m);
}
END_TEST

/* st_wire_decode still wants exactly one message: trailing bytes, or a
 * second message, are malformed (and nothing is allocated for them). */
START_TEST(test_decode_refuses_trailing) {
  static uint8_t buf[8192];
  st_msg_t m;
  rand_push_pull(&m, 7);
  size_t len = 0;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  buf[len] = 0xc0;
  expect_drop(buf, len + 1, -EBADMSG, ST_WIRE_DROP_MALFORMED, "one byte");
  memcpy(buf + len, buf, len);
  expect_drop(buf, 2 * len, -EBADMSG, ST_WIRE_DROP_MALFORMED, "two messages");
  /* decode_next reads the first of the two. */
  st_msg_t d;
  size_t used = 0;
  ck_assert_int_eq(st_wire_decode_next(buf, 2 * len, &d, &used, NULL), 0);
  ck_assert_uint_eq(used, len);
  ck_assert(msg_same(&m, &d));
  st_wire_msg_free(&d);
  rand_free(&m);
}
END_TEST

/* ==== decode_next over concatenations =======================================
 */

START_TEST(test_decode_next_concat) {
  static uint8_t buf[16384];
  for (int it = 0; it < 300; it++) {
    int k = 1 + (int) st_rng_below(&rng, 10);
    st_msg_t ms[10];
    size_t ends[10], len = 0;
    for (int i = 0; i < k; i++) {
      rand_any(&ms[i]);
      size_t n = 0;
      ck_assert_int_eq(st_wire_encode(&ms[i], buf + len, sizeof buf - len, &n),
                       0);
      len += n;
      ends[i] = len;
    }
    /* The whole concatenation: every message, each with its size. */
    uint8_t* p = malloc(len);
    memcpy(p, buf, len);
    size_t off = 0;
    st_wire_counters_t c;
    memset(&c, 0, sizeof c);
    for (int i = 0; i < k; i++) {
      st_msg_t d;
      size_t used = 0;
      ck_assert_int_eq(st_wire_decode_next(p + off, len - off, &d, &used, &c),
                       0);
      ck_assert_uint_eq(off + used, ends[i]);
      ck_assert_msg(msg_same(&ms[i], &d), "message %d of %d", i, k);
      if (d.type == ST_MSG_TENSOR_CHUNK && d.u.chunk.data_len > 0)
        ck_assert(d.u.chunk.data >= p + off &&
                  d.u.chunk.data + d.u.chunk.data_len <= p + off + used);
      st_wire_msg_free(&d);
      off += used;
    }
    ck_assert_uint_eq(off, len);
    ck_assert_uint_eq(tw_drops_total(&c), 0);
    free(p);
    /* Cut inside the last message: the others decode, the last is refused
     * with one drop, and the reader stops there. */
    size_t start = k > 1 ? ends[k - 2] : 0;
    size_t cut = start + st_rng_below(&rng, ends[k - 1] - start);
    p = malloc(cut ? cut : 1);
    memcpy(p, buf, cut);
    off = 0;
    int decoded = 0, rc = 0;
    while (off < cut) {
      st_msg_t d;
      size_t used = 0;
      rc = st_wire_decode_next(p + off, cut - off, &d, &used, &c);
      if (rc != 0)
        break;
      ck_assert(msg_same(&ms[decoded], &d));
      st_wire_msg_free(&d);
      decoded++;
      off += used;
    }
    ck_assert_int_eq(decoded, k - 1);
    ck_assert_uint_eq(off, start);
    if (cut > start) {
      ck_assert_int_eq(rc, -EBADMSG);
      ck_assert_uint_eq(tw_drops_total(&c), 1);
    }
    free(p);
    for (int i = 0; i < k; i++)
      rand_free(&ms[i]);
  }
}
END_TEST

START_TEST(test_decode_next_args) {
  const uint8_t ack[] = {0x93, ST_MSG_ACK, 0x01, 0x05, 0xc0, 0xc0};
  st_msg_t m;
  size_t used = 0;
  ck_assert_int_eq(st_wire_decode_next(ack, sizeof ack, NULL, &used, NULL),
                   -EINVAL);
  ck_assert_int_eq(st_wire_decode_next(ack, sizeof ack, &m, NULL, NULL),
                   -EINVAL);
  ck_assert_int_eq(st_wire_decode_next(NULL, 1, &m, &used, NULL), -EINVAL);
  ck_assert_int_eq(st_wire_decode_next(ack, sizeof ack, &m, &used, NULL), 0);
  ck_assert_uint_eq(used, 4);
  ck_assert_uint_eq(m.u.ack.seq, 5);
  st_wire_msg_free(&m);
  /* Version and type refusals, as st_wire_decode counts them. */
  const uint8_t v2[] = {0x93, ST_MSG_ACK, 0x02, 0x05, 0xc0};
  const uint8_t t99[] = {0x93, 99, 0x01, 0x05, 0xc0};
  st_wire_counters_t c;
  memset(&c, 0, sizeof c);
  ck_assert_int_eq(st_wire_decode_next(v2, sizeof v2, &m, &used, &c),
                   -EPROTONOSUPPORT);
  ck_assert_int_eq(st_wire_decode_next(t99, sizeof t99, &m, &used, &c),
                   -ENOMSG);
  ck_assert_uint_eq(c.drops[ST_WIRE_DROP_VERSION], 1);
  ck_assert_uint_eq(c.drops[ST_WIRE_DROP_UNKNOWN_TYPE], 1);
  /* A message over the size cap in a longer buffer: LIMIT. */
  size_t big = ST_WIRE_MAX_MESSAGE_BYTES + 100;
  uint8_t* p = malloc(big);
  size_t n = 0;
  p[n++] = 0x96, p[n++] = ST_MSG_TENSOR_CHUNK, p[n++] = 1;
  p[n++] = 1, p[n++] = 0, p[n++] = 0xce;
  p[n++] = 0, p[n++] = 0x10, p[n++] = 0, p[n++] = 0; /* total 2^20 */
  uint32_t dl = ST_WIRE_MAX_MESSAGE_BYTES;
  p[n++] = 0xc6, p[n++] = (uint8_t) (dl >> 24), p[n++] = (uint8_t) (dl >> 16);
  p[n++] = (uint8_t) (dl >> 8), p[n++] = (uint8_t) dl;
  memset(p + n, 0, big - n);
  memset(&c, 0, sizeof c);
  ck_assert_int_eq(st_wire_decode_next(p, big, &m, &used, &c), -EBADMSG);
  ck_assert_uint_eq(c.drops[ST_WIRE_DROP_LIMIT], 1);
  free(p);
  /* Freeing a zeroed message, and a message of any other type. */
  memset(&m, 0, sizeof m);
  st_wire_msg_free(&m);
  st_wire_msg_free(NULL);
}
END_TEST

/* ==== Mutations =============================================================
 */

START_TEST(test_mutations) {
  static uint8_t buf[8192], enc[8192];
  long accepted = 0;
  for (int it = 0; it < 20000; it++) {
    st_msg_t m;
    rand_push_pull(&m, (uint32_t) st_rng_below(&rng, 5));
    size_t len = 0;
    ck_assert_int_eq(st_wire_encode(&m, buf, 4096, &len), 0);
    rand_free(&m);
    int edits = 1 + (int) st_rng_below(&rng, 3);
    for (int e = 0; e < edits && len > 0; e++) {
      size_t at = st_rng_below(&rng, len);
      switch (st_rng_below(&rng, 4)) {
        case 0:
          buf[at] ^= (uint8_t) (1u << st_rng_below(&rng, 8));
          break;
        case 1:
          buf[at] = (uint8_t) st_rng_next(&rng);
          break;
        case 2:
          memmove(buf + at, buf + at + 1, len - at - 1);
          len--;
          break;
        default:
          len = at;
          break;
      }
    }
    uint8_t* p = malloc(len ? len : 1);
    memcpy(p, buf, len);
    st_wire_counters_t c;
    memset(&c, 0, sizeof c);
    st_msg_t d;
    size_t used = 0;
    int rc = st_wire_decode_next(p, len, &d, &used, &c);
    ck_assert(rc == 0 || rc == -EBADMSG || rc == -EPROTONOSUPPORT ||
              rc == -ENOMSG);
    ck_assert_uint_eq(tw_drops_total(&c), rc == 0 ? 0 : 1);
    if (rc == 0) {
      accepted++;
      ck_assert_uint_le(used, len);
      size_t n1 = 0;
      ck_assert_int_eq(st_wire_encode(&d, enc, sizeof enc, &n1), 0);
      ck_assert_uint_le(n1, used);
      st_msg_t d2;
      ck_assert_int_eq(st_wire_decode(enc, n1, &d2, NULL), 0);
      if (d.type == ST_MSG_PUSH_PULL)
        ck_assert(msg_same(&d, &d2));
      st_wire_msg_free(&d2);
    }
    st_wire_msg_free(&d);
    free(p);
  }
  fprintf(stderr, "push-pull mutations: %ld of 20000 accepted\n", accepted);
}
END_TEST

/* ==== The fuzz corpus =======================================================
 */

/* ST_WIRE_WRITE_CORPUS=DIR: push-pulls of 0, 3 and 7 entries, and a packet
 * plaintext of five messages back to back (a probe and its piggybacked
 * updates), from a fixed seed. test_wire.c checks the committed corpus. */
START_TEST(test_write_corpus) {
  const char* out = getenv("ST_WIRE_WRITE_CORPUS");
  if (out == NULL || *out == '\0')
    return;
  st_rng_seed(&rng, 20240602);
  static uint8_t buf[8192];
  char path[1024];
  const uint32_t ns[] = {0, 3, 7};
  for (size_t i = 0; i < 3; i++) {
    st_msg_t m;
    rand_push_pull(&m, ns[i]);
    size_t len = 0;
    ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
    snprintf(path, sizeof path, "%s/push_pull_%u", out, ns[i]);
    ck_assert_int_eq(tu_write_file(path, buf, len), 0);
    rand_free(&m);
  }
  size_t len = 0;
  for (int i = 0; i < 5; i++) {
    st_msg_t m;
    if (i == 0) {
      memset(&m, 0, sizeof m);
      m.type = ST_MSG_PING;
      m.u.ping.seq = 42;
      tw_rand_bytes(&rng, m.u.ping.target.b, 16);
    } else {
      rand_any(&m);
    }
    size_t n = 0;
    ck_assert_int_eq(st_wire_encode(&m, buf + len, sizeof buf - len, &n), 0);
    len += n;
    rand_free(&m);
  }
  snprintf(path, sizeof path, "%s/packet_concat", out);
  ck_assert_int_eq(tu_write_file(path, buf, len), 0);
}
END_TEST

static Suite* push_pull_suite(void) {
  Suite* s = suite_create("wire_push_pull");
  TCase* tr = tcase_create("round_trip");
  tcase_add_checked_fixture(tr, setup, NULL);
  tcase_add_loop_test(tr, test_round_trip, 0,
                      (int) (sizeof sizes / sizeof sizes[0]));
  tcase_add_test(tr, test_largest_fits);
  tcase_add_test(tr, test_smallest_entry);
  tcase_add_test(tr, test_encode_refuses);
  tcase_add_test(tr, test_write_corpus);
  tcase_set_timeout(tr, 120);
  suite_add_tcase(s, tr);
  TCase* td = tcase_create("decode_rejects");
  tcase_add_checked_fixture(td, setup, NULL);
  tcase_add_test(td, test_reject_over_max);
  tcase_add_test(td, test_hostile);
  tcase_add_test(td, test_hostile_capped);
  tcase_add_test(td, test_reject_entries);
  tcase_add_test(td, test_reject_truncated);
  tcase_add_test(td, test_decode_refuses_trailing);
  tcase_add_test(td, test_mutations);
  tcase_set_timeout(td, 300);
  suite_add_tcase(s, td);
  TCase* tn = tcase_create("decode_next");
  tcase_add_checked_fixture(tn, setup, NULL);
  tcase_add_test(tn, test_decode_next_concat);
  tcase_add_test(tn, test_decode_next_args);
  suite_add_tcase(s, tn);
  return s;
}

int main(void) {
  return tw_main(push_pull_suite);
}
