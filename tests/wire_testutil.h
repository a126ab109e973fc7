/* wire_testutil.h: the helpers that the wire codec's Check suites
 * (tests/unit/test_wire*.c) share: a small msgpack writer for hand-made
 * messages (no msgpack-c in tests: STYLE.md rule 6), random bytes and
 * integers of every encoding width, decoding that expects exactly one
 * drop, an encode-decode round trip, truncations and byte flips, the
 * fuzz seeds of
 * tests/fuzz/fuzz_wire_decode.c, hostile inputs under a capped address
 * space, and a suite's main(). Test-only,
 * header-only (every suite is its own executable). */
#ifndef STARLING_TESTS_WIRE_TESTUTIL_H
#define STARLING_TESTS_WIRE_TESTUTIL_H

#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "gossip/gossip.h"
#include "tests/unit/testutil.h"
#include "tests/wire_same.h"

/* ==== Hostile inputs under a capped address space ===========================
 */

#if defined(__SANITIZE_ADDRESS__)
#define TW_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TW_ASAN 1
#endif
#endif

/* A suite that feeds hostile counts says TW_ASAN_CAP_ALLOCATIONS() once at
 * file scope: under ASan any single allocation over 64 MiB then aborts the
 * suite, since a hostile count that reached msgpack-c would ask for
 * gigabytes. (ASAN_OPTIONS in the environment still override it.) */
#ifdef TW_ASAN
#define TW_ASAN_CAP_ALLOCATIONS()            \
  const char* __asan_default_options(void);  \
  const char* __asan_default_options(void) { \
    return "max_allocation_size_mb=64";      \
  }
#else
#define TW_ASAN_CAP_ALLOCATIONS()
#endif

/* Runs run() with the address space capped at what the process uses now
 * plus 64 MiB, so that any large allocation fails (and a decode would then
 * not report the limit drop it is expected to). ASan reserves terabytes of
 * shadow up front, so there the cap is TW_ASAN_CAP_ALLOCATIONS instead. */
static inline void tw_run_address_capped(void (*run)(void)) {
#ifdef TW_ASAN
  run();
#else
  /* VmSize: the address space the process uses now, in KiB. */
  FILE* f = fopen("/proc/self/status", "r");
  unsigned long vm_kib = 0;
  char line[256];
  while (f != NULL && fgets(line, sizeof line, f) != NULL)
    if (sscanf(line, "VmSize: %lu kB", &vm_kib) == 1)
      break;
  if (f != NULL)
    fclose(f);
  if (vm_kib == 0) {
    run();
    return;
  }
  struct rlimit old, cap;
  ck_assert_int_eq(getrlimit(RLIMIT_AS, &old), 0);
  cap = old;
  cap.rlim_cur = (rlim_t) vm_kib * 1024u + (64u << 20);
  if (old.rlim_cur != RLIM_INFINITY && old.rlim_cur < cap.rlim_cur)
    cap.rlim_cur = old.rlim_cur;
  ck_assert_int_eq(setrlimit(RLIMIT_AS, &cap), 0);
  /* A sanity check that the cap bites. */
  void* volatile big = malloc((size_t) 1 << 30);
  ck_assert_msg(big == NULL, "the address space cap does not bite");
  run();
  setrlimit(RLIMIT_AS, &old);
#endif
}

/* ==== A msgpack writer for hand-made messages ===============================
 */

typedef struct {
  uint8_t* b;
  size_t n;   /* bytes written */
  size_t cap; /* bytes b holds; writing past them fails the test */
} w_t;

static inline w_t* w_new(size_t cap) {
  w_t* w = calloc(1, sizeof *w);
  ck_assert_ptr_nonnull(w);
  w->b = malloc(cap);
  ck_assert_ptr_nonnull(w->b);
  w->cap = cap;
  return w;
}

static inline void w_free(w_t* w) {
  free(w->b);
  free(w);
}

static inline void w_byte(w_t* w, uint8_t x) {
  if (w->n >= w->cap)
    ck_abort_msg("msgpack writer full at %zu bytes", w->cap);
  w->b[w->n++] = x;
}

static inline void w_be(w_t* w, uint64_t v, size_t bytes) {
  for (size_t i = bytes; i-- > 0;)
    w_byte(w, (uint8_t) (v >> (8 * i)));
}

static inline void w_uint(w_t* w, uint64_t v) {
  if (v <= 0x7f)
    w_byte(w, (uint8_t) v);
  else if (v <= 0xff)
    w_byte(w, 0xcc), w_be(w, v, 1);
  else if (v <= 0xffff)
    w_byte(w, 0xcd), w_be(w, v, 2);
  else if (v <= 0xffffffffu)
    w_byte(w, 0xce), w_be(w, v, 4);
  else
    w_byte(w, 0xcf), w_be(w, v, 8);
}

static inline void w_array(w_t* w, uint64_t n) {
  if (n <= 15)
    w_byte(w, (uint8_t) (0x90 | n));
  else if (n <= 0xffff)
    w_byte(w, 0xdc), w_be(w, n, 2);
  else
    w_byte(w, 0xdd), w_be(w, n, 4);
}

/* n bytes as they are: p's, or 0xab when p is NULL. */
static inline void w_raw(w_t* w, const void* p, size_t n) {
  if (n > w->cap - w->n)
    ck_abort_msg("msgpack writer full: %zu + %zu bytes past %zu", w->n, n,
                 w->cap);
  if (p != NULL)
    memcpy(w->b + w->n, p, n);
  else
    memset(w->b + w->n, 0xab, n);
  w->n += n;
}

/* A bin of n bytes (bin8, bin16 or bin32), p's or 0xab when p is NULL. */
static inline void w_bin(w_t* w, const void* p, size_t n) {
  if (n <= 0xff)
    w_byte(w, 0xc4), w_be(w, n, 1);
  else if (n <= 0xffff)
    w_byte(w, 0xc5), w_be(w, n, 2);
  else
    w_byte(w, 0xc6), w_be(w, n, 4);
  w_raw(w, p, n);
}

/* A str of n bytes in its shortest form (fixstr, str8, str16, str32). */
static inline void w_str(w_t* w, const void* p, size_t n) {
  if (n <= 31)
    w_byte(w, (uint8_t) (0xa0 | n));
  else if (n <= 0xff)
    w_byte(w, 0xd9), w_be(w, n, 1);
  else if (n <= 0xffff)
    w_byte(w, 0xda), w_be(w, n, 2);
  else
    w_byte(w, 0xdb), w_be(w, n, 4);
  w_raw(w, p, n);
}

static inline void w_f32(w_t* w, float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  w_byte(w, 0xca), w_be(w, u, 4);
}

static inline void w_f64(w_t* w, double d) {
  uint64_t u;
  memcpy(&u, &d, 8);
  w_byte(w, 0xcb), w_be(w, u, 8);
}

/* ==== Random inputs =========================================================
 */

static inline void tw_rand_bytes(st_rng_t* rng, uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t) st_rng_next(rng);
}

/* An integer of at most max_bits bits: every encoding width, not only the
 * widest. */
static inline uint64_t tw_rand_bits(st_rng_t* rng, int max_bits) {
  int bits = (int) st_rng_below(rng, (uint64_t) max_bits + 1);
  uint64_t v = st_rng_next(rng);
  return bits == 64 ? v : v & ((UINT64_C(1) << bits) - 1);
}

/* ==== Decoding ==============================================================
 */

static inline uint64_t tw_drops_total(const st_wire_counters_t* c) {
  uint64_t t = 0;
  for (int r = 0; r < ST_WIRE_DROP_COUNT; r++)
    t += c->drops[r];
  return t;
}

/* A decode (at `line`, of `what`) returned got and counted c: it must have
 * returned rc and counted exactly one drop, under why. */
static inline void tw_assert_drop(int got, const st_wire_counters_t* c, int rc,
                                  st_wire_drop_t why, const char* what,
                                  int line) {
  ck_assert_msg(got == rc, "line %d, %s: rc %d, want %d", line, what, got, rc);
  for (int r = 0; r < ST_WIRE_DROP_COUNT; r++)
    ck_assert_msg(c->drops[r] == (r == (int) why ? 1u : 0u),
                  "line %d, %s: %s counted %llu, want %s", line, what,
                  st_wire_drop_name((st_wire_drop_t) r),
                  (unsigned long long) c->drops[r], st_wire_drop_name(why));
}

/* Decodes b[0..n) expecting rc and exactly one drop counted under why. */
static inline void tw_expect_drop_(const uint8_t* b, size_t n, int rc,
                                   st_wire_drop_t why, const char* what,
                                   int line) {
  st_wire_counters_t c;
  memset(&c, 0, sizeof c);
  st_msg_t m;
  int got = st_wire_decode(b, n, &m, &c);
  if (got == 0)
    st_wire_msg_free(&m);
  tw_assert_drop(got, &c, rc, why, what, line);
}
#define tw_expect_drop(b, n, rc, why, what) \
  tw_expect_drop_(b, n, rc, why, what, __LINE__)

/* Encodes m into buf[0..cap) and decodes it back into *d (first filled
 * with 0x5a: the decoder must write every byte it owns): nothing dropped,
 * and *d equal to *m. Returns the encoding's length; the caller frees *d
 * (st_wire_msg_free). */
static inline size_t tw_round_trip(const st_msg_t* m, uint8_t* buf, size_t cap,
                                   st_msg_t* d) {
  size_t len = 0;
  ck_assert_int_eq(st_wire_encode(m, buf, cap, &len), 0);
  ck_assert_uint_le(len, ST_WIRE_MAX_MESSAGE_BYTES);
  st_wire_counters_t c;
  memset(&c, 0, sizeof c);
  memset(d, 0x5a, sizeof *d);
  ck_assert_int_eq(st_wire_decode(buf, len, d, &c), 0);
  ck_assert_uint_eq(tw_drops_total(&c), 0);
  ck_assert_msg(msg_same(m, d), "type %d differs after a round trip", m->type);
  return len;
}

/* buf[0..len) is a valid encoding with room for one byte more. Cut short
 * anywhere, it is refused with exactly one drop: malformed, or a declared
 * length or count beyond the bytes left (a str, bin or array whose header
 * survived); with a trailing byte, it is malformed. */
static inline void tw_expect_truncations(uint8_t* buf, size_t len) {
  for (size_t n = 0; n < len; n++) {
    st_wire_counters_t c;
    memset(&c, 0, sizeof c);
    st_msg_t d;
    ck_assert_int_eq(st_wire_decode(buf, n, &d, &c), -EBADMSG);
    ck_assert_uint_eq(tw_drops_total(&c), 1);
    ck_assert_uint_eq(
        c.drops[ST_WIRE_DROP_MALFORMED] + c.drops[ST_WIRE_DROP_LIMIT], 1);
  }
  buf[len] = 0xc0;
  tw_expect_drop(buf, len + 1, -EBADMSG, ST_WIRE_DROP_MALFORMED, "trailing");
}

/* Flips 1 to 3 random bytes of the valid encoding buf[0..len) and decodes
 * it into *d. Returns 1 when it decodes (the caller checks *d and frees
 * it); otherwise it was refused with exactly one drop, and returns 0. */
static inline int tw_mutate_decode(st_rng_t* rng, uint8_t* buf, size_t len,
                                   st_msg_t* d) {
  int flips = 1 + (int) st_rng_below(rng, 3);
  for (int f = 0; f < flips; f++)
    buf[st_rng_below(rng, len)] ^= (uint8_t) (1 + st_rng_below(rng, 255));
  st_wire_counters_t c;
  memset(&c, 0, sizeof c);
  int rc = st_wire_decode(buf, len, d, &c);
  if (rc == 0)
    return 1;
  ck_assert(rc == -EBADMSG || rc == -ENOMSG || rc == -EPROTONOSUPPORT);
  ck_assert_uint_eq(tw_drops_total(&c), 1);
  return 0;
}

/* ==== Fuzz seeds and main() =================================================
 */

/* The seed `name` of tests/fuzz/fuzz_wire_decode.c, the encoding of m:
 * written into DIR when ST_WIRE_WRITE_CORPUS=DIR; otherwise, when the
 * committed one is there ($ST_SOURCE_DIR/tests/fuzz/corpus/
 * fuzz_wire_decode/name; set by CTest), checked to decode to m. */
static inline void tw_fuzz_seed(const st_msg_t* m, const char* name) {
  static uint8_t buf[8192], seed[8192];
  const char* out = getenv("ST_WIRE_WRITE_CORPUS");
  const char* src = getenv("ST_SOURCE_DIR");
  char path[1024];
  size_t len = 0;
  ck_assert_int_eq(st_wire_encode(m, buf, sizeof buf, &len), 0);
  if (out != NULL && *out != '\0') {
    snprintf(path, sizeof path, "%s/%s", out, name);
    ck_assert_int_eq(tu_write_file(path, buf, len), 0);
    return;
  }
  if (src == NULL || *src == '\0')
    return; /* run outside CTest */
  snprintf(path, sizeof path, "%s/tests/fuzz/corpus/fuzz_wire_decode/%s", src,
           name);
  FILE* f = fopen(path, "rb");
  if (f == NULL)
    return; /* not in this checkout */
  size_t n = fread(seed, 1, sizeof seed, f);
  fclose(f);
  st_msg_t d;
  ck_assert_msg(st_wire_decode(seed, n, &d, NULL) == 0, "seed %s", name);
  ck_assert_msg(msg_same(m, &d), "seed %s is stale", name);
  st_wire_msg_free(&d);
}

/* A suite's main() (tu_main, testutil.h). */
static inline int tw_main(Suite* (*make)(void) ) {
  return tu_main(make);
}

#endif
