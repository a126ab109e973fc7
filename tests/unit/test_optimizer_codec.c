/* test_optimizer_codec.c: Check suite for optimizer/codec.c, the codecs
 * for compressed deltas (optimizer.h, "Codecs"): parsing and canonical
 * names; bf16, int8 and top-k round trips on random tensors of 0, 1, 255,
 * 256, 257 and 100003 floats (zeros, subnormals, huge magnitudes) within
 * each codec's stated bound against a float64 reference; encoded sizes;
 * error feedback over 200 messages against float64 running sums; every
 * class of malformed message refused with its reason and its output left
 * untouched; and a fuzz-style loop of mutated encodings (run it under
 * ASan: nothing is read or written out of bounds). */
#include <check.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optimizer/optimizer.h"
#include "tests/unit/testutil.h"

/* ck_assert writes its location to Check's pipe on every call, which
 * costs a system call per element in the loops below: these call it only
 * when the condition fails. */
#define EXPECT_MSG(cond, ...)           \
  do {                                  \
    if (!(cond))                        \
      ck_assert_msg(cond, __VA_ARGS__); \
  } while (0)
#define EXPECT(cond) EXPECT_MSG(cond, "%s", #cond)

static st_codec_spec_t spec_of(const char* text) {
  st_codec_spec_t s;
  char err[256];
  ck_assert_msg(st_codec_parse(text, &s, err, sizeof(err)) == 0, "%s", err);
  return s;
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* ---- Parsing and names -------------------------------------------------- */

static const struct {
  const char* text;
  int ok;
  st_codec_kind_t kind;
  uint32_t ppm;
  const char* name;
} parse_cases[] = {
    {"none", 1, ST_CODEC_NONE, 0, "none"},
    {"bf16", 1, ST_CODEC_BF16, 0, "bf16"},
    {"int8", 1, ST_CODEC_INT8, 0, "int8"},
    {"topk:0.01", 1, ST_CODEC_TOPK, 10000, "topk:0.01"},
    {"topk:0.010000", 1, ST_CODEC_TOPK, 10000, "topk:0.01"},
    {"topk:00.0100000000", 1, ST_CODEC_TOPK, 10000, "topk:0.01"},
    {"topk:.5", 1, ST_CODEC_TOPK, 500000, "topk:0.5"},
    {"topk:1", 1, ST_CODEC_TOPK, 1000000, "topk:1"},
    {"topk:1.000", 1, ST_CODEC_TOPK, 1000000, "topk:1"},
    {"topk:0.000001", 1, ST_CODEC_TOPK, 1, "topk:0.000001"},
    {"topk:0.123456", 1, ST_CODEC_TOPK, 123456, "topk:0.123456"},
    {"topk:0", 0, 0, 0, NULL},
    {"topk:0.0000001", 0, 0, 0, NULL}, /* finer than a millionth */
    {"topk:0.0000000", 0, 0, 0, NULL}, /* zero */
    {"topk:1.5", 0, 0, 0, NULL},
    {"topk:1.000001", 0, 0, 0, NULL},
    {"topk:2", 0, 0, 0, NULL},
    {"topk:", 0, 0, 0, NULL},
    {"topk:.", 0, 0, 0, NULL},
    {"topk:0.", 0, 0, 0, NULL},
    {"topk:-0.1", 0, 0, 0, NULL},
    {"topk:0.1x", 0, 0, 0, NULL},
    {"topk:1e-2", 0, 0, 0, NULL},
    {"topk", 0, 0, 0, NULL},
    {"int4", 0, 0, 0, NULL},
    {"", 0, 0, 0, NULL},
    {"BF16", 0, 0, 0, NULL},
    {"bf16 ", 0, 0, 0, NULL},
};

START_TEST(test_parse_and_name) {
  st_codec_spec_t s = {ST_CODEC_INT8, 7};
  char err[256] = "", name[32];
  int rc = st_codec_parse(parse_cases[_i].text, &s, err, sizeof(err));
  if (!parse_cases[_i].ok) {
    ck_assert_int_eq(rc, -EINVAL);
    ck_assert_msg(strstr(err, parse_cases[_i].text) != NULL &&
                      strstr(err, "topk:FRACTION") != NULL,
                  "message '%s' names neither the text nor the forms", err);
    return;
  }
  ck_assert_int_eq(rc, 0);
  ck_assert_int_eq(s.kind, parse_cases[_i].kind);
  ck_assert_uint_eq(s.topk_ppm, parse_cases[_i].ppm);
  ck_assert_int_eq(st_codec_name(&s, name, sizeof(name)), 0);
  ck_assert_str_eq(name, parse_cases[_i].name);
  /* The canonical name parses back to the same spec. */
  st_codec_spec_t back = spec_of(name);
  ck_assert_int_eq(back.kind, s.kind);
  ck_assert_uint_eq(back.topk_ppm, s.topk_ppm);
  ck_assert_int_eq(st_codec_name(&s, name, strlen(parse_cases[_i].name)),
                   -ENOSPC);
}
END_TEST

START_TEST(test_bad_specs_and_names) {
  char name[32];
  st_codec_spec_t bad[] = {{ST_CODEC_TOPK, 0},
                           {ST_CODEC_TOPK, 1000001},
                           {ST_CODEC_BF16, 3},
                           {(st_codec_kind_t) 9, 0}};
  float x[4] = {1, 2, 3, 4}, out[4];
  uint8_t buf[64];
  size_t len = 0;
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    ck_assert_int_eq(st_codec_name(&bad[i], name, sizeof(name)), -EINVAL);
    ck_assert_uint_eq(st_codec_encoded_bytes(&bad[i], 4), 0);
    ck_assert_int_eq(st_codec_encode(&bad[i], x, 4, buf, sizeof(buf), &len),
                     -EINVAL);
    ck_assert_int_eq(st_codec_decode(&bad[i], buf, 32, out, 4, NULL), -EINVAL);
    st_codec_ef_t ef;
    ck_assert_int_eq(st_codec_ef_init(&ef, &bad[i], 4), -EINVAL);
  }
  /* Drop reasons have distinct names, and an unknown one says so. */
  for (int a = 0; a < ST_CODEC_DROP_COUNT; a++) {
    ck_assert(strncmp(st_codec_drop_name(a), "codec_", 6) == 0);
    for (int b = 0; b < a; b++)
      ck_assert_str_ne(st_codec_drop_name(a), st_codec_drop_name(b));
  }
  ck_assert_str_eq(st_codec_drop_name(ST_CODEC_DROP_COUNT), "codec_unknown");
}
END_TEST

START_TEST(test_topk_k_and_limits) {
  st_codec_spec_t s = spec_of("topk:0.01");
  ck_assert_uint_eq(st_codec_topk_k(&s, 0), 0);
  ck_assert_uint_eq(st_codec_topk_k(&s, 1), 1);   /* max(1, .) */
  ck_assert_uint_eq(st_codec_topk_k(&s, 149), 1); /* 1.49 */
  ck_assert_uint_eq(st_codec_topk_k(&s, 150), 2); /* 1.5: half up */
  ck_assert_uint_eq(st_codec_topk_k(&s, 100003), 1000);
  st_codec_spec_t all = spec_of("topk:1");
  ck_assert_uint_eq(st_codec_topk_k(&all, 257), 257);
  ck_assert_uint_eq(st_codec_topk_k(&all, 0xffffffffu), 0xffffffffu);
  ck_assert_uint_eq(st_codec_encoded_bytes(&s, (uint64_t) 1 << 32), 0);
  st_codec_spec_t b = spec_of("bf16");
  ck_assert_uint_eq(st_codec_encoded_bytes(&b, ST_CODEC_MAX_FLOATS),
                    16 + 2 * ST_CODEC_MAX_FLOATS);
  ck_assert_uint_eq(st_codec_encoded_bytes(&b, ST_CODEC_MAX_FLOATS + 1), 0);
  /* Too long for top-k's u32 indices: refused before anything is
   * allocated or read. */
  st_codec_ef_t ef;
  ck_assert_int_eq(st_codec_ef_init(&ef, &s, (size_t) 1 << 32), -E2BIG);
  uint8_t buf[64];
  size_t len;
  float x = 1;
  ck_assert_int_eq(
      st_codec_encode(&s, &x, (size_t) 1 << 32, buf, sizeof(buf), &len),
      -E2BIG);
}
END_TEST

/* ---- bf16 scalar -------------------------------------------------------- */

START_TEST(test_bf16_scalar) {
  static const struct {
    uint32_t in;
    uint16_t out;
  } cases[] = {
      {0x3f800000u, 0x3f80}, /* 1.0 */
      {0x3f808000u, 0x3f80}, /* tie, even stays */
      {0x3f818000u, 0x3f82}, /* tie, odd rounds up */
      {0x3f808001u, 0x3f81}, /* above the tie */
      {0x3f807fffu, 0x3f80}, /* below the tie */
      {0xbf818000u, 0xbf82}, /* sign kept */
      {0x00000001u, 0x0000}, /* smallest subnormal rounds to 0 */
      {0x00008000u, 0x0000}, /* subnormal tie, even */
      {0x00018000u, 0x0002}, /* subnormal tie, odd */
      {0x007fffffu, 0x0080}, /* largest subnormal rounds to 2^-126 */
      {0x7f7fffffu, 0x7f7f}, /* FLT_MAX saturates, not Inf */
      {0xff7fffffu, 0xff7f},
      {0x7f7f8000u, 0x7f7f}, /* tie at the top saturates too */
      {0x7f800000u, 0x7f80}, /* Inf stays Inf */
      {0xff800000u, 0xff80},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
    ck_assert_msg(st_codec_f32_to_bf16(bits_f32(cases[i].in)) == cases[i].out,
                  "0x%08x -> 0x%04x, want 0x%04x", cases[i].in,
                  st_codec_f32_to_bf16(bits_f32(cases[i].in)), cases[i].out);
  /* NaN stays NaN, signalling ones (whose top half alone would read Inf)
   * included. */
  uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu};
  for (size_t i = 0; i < 4; i++)
    ck_assert(
        isnan(st_codec_bf16_to_f32(st_codec_f32_to_bf16(bits_f32(nans[i])))));
  ck_assert(st_codec_bf16_to_f32(0x3f80) == 1.0f);
  ck_assert(st_codec_bf16_to_f32(0xc040) == -3.0f);
}
END_TEST

/* ---- Random tensors ------------------------------------------------------ */

enum { DIST_NORMAL, DIST_MIXED, DIST_ZEROS, DIST_TIES, DIST_COUNT };

/* One value of a distribution: MIXED draws zeros of both signs,
 * subnormals, magnitudes up to FLT_MAX and normals scaled by 10^+-30. */
static float draw(st_rng_t* rng, int dist) {
  double u = st_rng_uniform(rng);
  switch (dist) {
    case DIST_NORMAL:
      return (float) st_rng_normal(rng);
    case DIST_ZEROS:
      return u < 0.5 ? 0.0f : -0.0f;
    case DIST_TIES:
      return (float) ((int) st_rng_below(rng, 5) - 2);
    default:
      break;
  }
  if (u < 0.15)
    return u < 0.07 ? 0.0f : -0.0f;
  if (u < 0.3) /* subnormal, either sign */
    return bits_f32((uint32_t) (1 + st_rng_below(rng, 0x7fffff)) |
                    (u < 0.22 ? 0x80000000u : 0));
  if (u < 0.4) /* huge: [1e37, FLT_MAX] */
    return (float) ((u < 0.35 ? -1 : 1) *
                    fmin(FLT_MAX, 1e37 * (1 + 33 * st_rng_uniform(rng))));
  return (float) (st_rng_normal(rng) *
                  pow(10.0, 60 * st_rng_uniform(rng) - 30));
}

static float* tensor(st_rng_t* rng, size_t n, int dist) {
  float* x = malloc((n > 0 ? n : 1) * sizeof(float));
  EXPECT(x != NULL);
  for (size_t i = 0; i < n; i++)
    x[i] = draw(rng, dist);
  /* A chunk with one huge value and tiny ones, and FLT_MAX itself. */
  if (dist == DIST_MIXED && n > 3) {
    x[n - 1] = FLT_MAX;
    x[n - 2] = -FLT_MAX;
  }
  return x;
}

/* The bfloat16 nearest x, ties to even, saturating, computed in float64
 * from the definition: a multiple of 2^(e - 7), e = max(exponent, -126). */
static double bf16_ref(float x) {
  if (x == 0)
    return x;
  int e;
  frexp((double) x, &e); /* |x| in [2^(e-1), 2^e) */
  e = e - 1 < -126 ? -126 : e - 1;
  double ulp = ldexp(1.0, e - 7);
  double r = nearbyint((double) x / ulp) * ulp; /* ties to even */
  double max = ldexp(255.0 / 128.0, 127);       /* (2 - 2^-7) 2^127 */
  return r > max ? max : r < -max ? -max : r;
}

static const size_t sizes[] = {0, 1, 255, 256, 257, 100003};
#define N_SIZES (sizeof(sizes) / sizeof(sizes[0]))

/* Encodes x with spec, checks the size, decodes; returns the buffer. */
static uint8_t* round_trip(const st_codec_spec_t* s, const float* x, size_t n,
                           float* out, size_t* len) {
  size_t cap = st_codec_encoded_bytes(s, n);
  ck_assert_uint_gt(cap, 0);
  uint8_t* buf = malloc(cap);
  EXPECT(buf != NULL);
  EXPECT(st_codec_encode(s, x, n, buf, cap, len) == 0);
  EXPECT(*len == cap);
  /* Deterministic: the same input gives the same bytes. */
  uint8_t* again = malloc(cap);
  size_t len2 = 0;
  EXPECT(st_codec_encode(s, x, n, again, cap, &len2) == 0);
  EXPECT(len2 == cap && memcmp(buf, again, cap) == 0);
  free(again);
  st_codec_drop_t why = ST_CODEC_DROP_COUNT;
  int rc = st_codec_decode(s, buf, *len, out, n, &why);
  ck_assert_msg(rc == 0, "decode: %d (%s)", rc, st_codec_drop_name(why));
  for (size_t i = 0; i < n; i++)
    EXPECT(isfinite(out[i]));
  return buf;
}

START_TEST(test_bf16_round_trip) {
  st_rng_t rng;
  st_rng_seed(&rng, tu_seed() + (uint64_t) _i);
  st_codec_spec_t s = spec_of("bf16");
  for (size_t z = 0; z < N_SIZES; z++) {
    size_t n = sizes[z], len;
    float* x = tensor(&rng, n, _i);
    float* out = malloc((n + 1) * sizeof(float));
    uint8_t* buf = round_trip(&s, x, n, out, &len);
    ck_assert_uint_eq(len, 2 * n + ST_CODEC_HEADER_BYTES);
    for (size_t i = 0; i < n; i++) {
      double err = fabs((double) x[i] - (double) out[i]);
      EXPECT_MSG(err <= ldexp(fabs(x[i]), -8) + ldexp(1, -134),
                 "n %zu [%zu]: %a -> %a", n, i, x[i], out[i]);
      EXPECT_MSG((double) out[i] == bf16_ref(x[i]),
                 "n %zu [%zu]: %a -> %a, nearest even %a", n, i, x[i], out[i],
                 bf16_ref(x[i]));
    }
    free(buf);
    free(out);
    free(x);
  }
}
END_TEST

/* Checks one int8 chunk of a decoded tensor against its scale. */
static void check_int8_chunk(const float* x, const float* out, size_t m,
                             float s) {
  double amax = 0;
  for (size_t j = 0; j < m; j++)
    amax = fmax(amax, fabs((double) x[j]));
  ck_assert_msg((s == 0) == (amax == 0), "scale %a for max %a", s, amax);
  /* scale ~ max / 127: never below max / 127.5, and, unless it is a
   * subnormal rounded up to keep that, below max / 126. */
  ck_assert(s == 0 || (double) s * 127.5 >= amax);
  ck_assert(s == 0 || s < FLT_MIN || (double) s * 126 < amax);
  for (size_t j = 0; j < m; j++) {
    double err = fabs((double) x[j] - (double) out[j]);
    EXPECT_MSG(err <= (double) s / 2 + ldexp(fabs(x[j]), -22),
               "%a -> %a, scale %a", x[j], out[j], s);
  }
}

START_TEST(test_int8_round_trip) {
  st_rng_t rng;
  st_rng_seed(&rng, tu_seed() + (uint64_t) _i);
  st_codec_spec_t s = spec_of("int8");
  for (size_t z = 0; z < N_SIZES; z++) {
    size_t n = sizes[z], len;
    float* x = tensor(&rng, n, _i);
    float* out = malloc((n + 1) * sizeof(float));
    uint8_t* buf = round_trip(&s, x, n, out, &len);
    size_t chunks = (n + 255) / 256;
    ck_assert_uint_eq(len, n + 4 * chunks + ST_CODEC_HEADER_BYTES);
    for (size_t c = 0; c < chunks; c++) {
      float sc;
      memcpy(&sc, buf + ST_CODEC_HEADER_BYTES + 4 * c, 4);
      size_t m = n - 256 * c < 256 ? n - 256 * c : 256;
      check_int8_chunk(x + 256 * c, out + 256 * c, m, sc);
    }
    free(buf);
    free(out);
    free(x);
  }
}
END_TEST

/* Orders indices by magnitude, largest first, then by index. */
static const float* g_x;
static int by_magnitude(const void* a, const void* b) {
  size_t i = *(const size_t*) a, j = *(const size_t*) b;
  double x = fabs((double) g_x[i]), y = fabs((double) g_x[j]);
  if (x != y)
    return x > y ? -1 : 1;
  return (i > j) - (i < j);
}

/* The top-k reference: kept[i] = 1 for the k entries a sort picks. */
static void topk_ref(const float* x, size_t n, size_t k, char* kept) {
  size_t* idx = malloc((n > 0 ? n : 1) * sizeof(size_t));
  for (size_t i = 0; i < n; i++)
    idx[i] = i;
  g_x = x;
  qsort(idx, n, sizeof(size_t), by_magnitude);
  memset(kept, 0, n);
  for (size_t i = 0; i < k; i++)
    kept[idx[i]] = 1;
  free(idx);
}

START_TEST(test_topk_round_trip) {
  static const char* const fracs[] = {"topk:0.01", "topk:0.1", "topk:0.5",
                                      "topk:1", "topk:0.000001"};
  st_rng_t rng;
  st_rng_seed(&rng, tu_seed() + (uint64_t) _i);
  for (size_t f = 0; f < 5; f++) {
    st_codec_spec_t s = spec_of(fracs[f]);
    for (size_t z = 0; z < N_SIZES; z++) {
      size_t n = sizes[z], len, k = st_codec_topk_k(&s, n);
      float* x = tensor(&rng, n, _i);
      float* out = malloc((n + 1) * sizeof(float));
      char* kept = malloc(n + 1);
      uint8_t* buf = round_trip(&s, x, n, out, &len);
      ck_assert_uint_eq(len, 8 * k + ST_CODEC_HEADER_BYTES);
      /* ppm * n is an exact integer in a double; / 10^6 of a multiple of
       * 0.5 is exact too, so the half-up rounding is checked exactly. */
      double want_k =
          fmax(1, floor((double) s.topk_ppm * (double) n / 1e6 + 0.5));
      ck_assert_uint_eq(k, n == 0 ? 0 : (size_t) want_k);
      topk_ref(x, n, k, kept);
      for (size_t i = 0; i < n; i++) {
        /* Kept entries are exact (bit for bit, -0 included); the rest
         * decode as +0. */
        uint32_t want = kept[i] ? f32_bits(x[i]) : 0;
        EXPECT_MSG(f32_bits(out[i]) == want, "%s n %zu [%zu]: %a -> %a",
                   fracs[f], n, i, x[i], out[i]);
      }
      free(kept);
      free(buf);
      free(out);
      free(x);
    }
  }
}
END_TEST

START_TEST(test_none_round_trip) {
  st_rng_t rng;
  st_rng_seed(&rng, tu_seed());
  st_codec_spec_t s = spec_of("none");
  for (size_t z = 0; z < N_SIZES; z++) {
    size_t n = sizes[z], len;
    float* x = tensor(&rng, n, DIST_MIXED);
    float* out = malloc((n + 1) * sizeof(float));
    uint8_t* buf = round_trip(&s, x, n, out, &len);
    ck_assert_uint_eq(len, 4 * n + ST_CODEC_HEADER_BYTES);
    ck_assert(n == 0 || memcmp(x, out, 4 * n) == 0);
    free(buf);
    free(out);
    free(x);
  }
}
END_TEST

/* NaN and Inf are refused by every encoder. */
START_TEST(test_encode_refuses_non_finite) {
  static const char* const kinds[] = {"none", "bf16", "int8", "topk:0.1"};
  uint32_t bad[] = {0x7fc00000u, 0x7f800000u, 0xff800000u, 0x7f800001u};
  st_codec_spec_t s = spec_of(kinds[_i]);
  float x[300];
  uint8_t buf[2048];
  size_t len;
  for (size_t b = 0; b < 4; b++) {
    for (size_t at = 0; at < 300; at += 149) {
      for (size_t i = 0; i < 300; i++)
        x[i] = (float) i;
      x[at] = bits_f32(bad[b]);
      ck_assert_int_eq(st_codec_encode(&s, x, 300, buf, sizeof(buf), &len),
                       -EINVAL);
    }
  }
  ck_assert_int_eq(st_codec_encode(&s, x, 300, buf, 20, &len), -EMSGSIZE);
}
END_TEST

/* ---- Error feedback ------------------------------------------------------ */

/* One message of a stream's property test: checks, per element, that the
 * running sums in float64 differ by the residual up to the rounding of
 * y = x + r, and that the residual is within one message's bound. */
typedef struct {
  st_codec_spec_t spec;
  size_t n;
  double *sx, *sd, *slack; /* running sums of inputs, of decoded, rounding */
  double max_x_norm;
} ef_check_t;

static void ef_check_message(ef_check_t* c, const st_codec_ef_t* ef,
                             const float* y, const float* d,
                             const uint8_t* buf) {
  double tau = INFINITY, r_norm2 = 0;
  /* top-k: the smallest magnitude sent (a zero sent means every non-zero
   * entry was sent, and the residual is all zero). */
  if (c->spec.kind == ST_CODEC_TOPK)
    for (size_t i = 0; i < c->n; i++)
      if (d[i] != 0)
        tau = fmin(tau, fabs((double) d[i]));
  for (size_t i = 0; i < c->n; i++) {
    double r = ef->residual[i];
    double gap = c->sx[i] - c->sd[i] - r;
    EXPECT_MSG(fabs(gap) <= c->slack[i] + 1e-300, "[%zu] gap %g > %g", i, gap,
               c->slack[i]);
    double bound = 0;
    if (c->spec.kind == ST_CODEC_BF16)
      bound = ldexp(fabs(y[i]), -8) + ldexp(1, -134);
    else if (c->spec.kind == ST_CODEC_INT8) {
      float s;
      memcpy(&s, buf + ST_CODEC_HEADER_BYTES + 4 * (i / 256), 4);
      bound = (double) s / 2 + ldexp(fabs(y[i]), -22);
    } else if (c->spec.kind == ST_CODEC_TOPK)
      bound = tau;
    EXPECT_MSG(fabs(r) <= bound, "[%zu] residual %a > %a", i, r, bound);
    r_norm2 += r * r;
  }
  if (c->spec.kind == ST_CODEC_TOPK) {
    double k = (double) st_codec_topk_k(&c->spec, c->n);
    double lim = (2.0 * (double) c->n / k - 1) * c->max_x_norm;
    ck_assert_msg(sqrt(r_norm2) <= lim * (1 + 1e-6), "||r|| %g > %g",
                  sqrt(r_norm2), lim);
  }
}

/* Draws message t's input: normal, scaled by a factor that changes
 * across messages (1e-3 to 1e3), some entries much larger than the rest. */
static void ef_input(st_rng_t* rng, float* x, size_t n, int t) {
  double scale = pow(10.0, (t % 7) - 3);
  for (size_t i = 0; i < n; i++) {
    double v = st_rng_normal(rng) * scale;
    x[i] = (float) (i % 97 == 0 ? v * 50 : v);
  }
}

START_TEST(test_error_feedback_tracks_inputs) {
  static const char* const kinds[] = {"none", "bf16", "int8", "topk:0.01",
                                      "topk:0.2"};
  st_rng_t rng;
  st_rng_seed(&rng, tu_seed() + (uint64_t) _i);
  ef_check_t c = {.spec = spec_of(kinds[_i]), .n = 1000};
  size_t n = c.n, cap = st_codec_encoded_bytes(&c.spec, n), len;
  st_codec_ef_t ef;
  ck_assert_int_eq(st_codec_ef_init(&ef, &c.spec, n), 0);
  float *x = malloc(n * 4), *y = malloc(n * 4), *d = malloc(n * 4);
  uint8_t* buf = malloc(cap);
  c.sx = calloc(n, 8);
  c.sd = calloc(n, 8);
  c.slack = calloc(n, 8);
  for (int t = 0; t < 200; t++) {
    ef_input(&rng, x, n, t);
    double norm2 = 0;
    for (size_t i = 0; i < n; i++) {
      y[i] = x[i] + ef.residual[i]; /* float32, as the stream adds */
      c.sx[i] += x[i];
      /* float32 rounding of y = x + r and r = y - decoded (the stated
       * 2^-23 |y|), and float64's of the running sums. */
      c.slack[i] += ldexp(fabs(y[i]), -23) + 1e-15 * fabs(c.sx[i]);
      norm2 += (double) x[i] * x[i];
    }
    c.max_x_norm = fmax(c.max_x_norm, sqrt(norm2));
    ck_assert_int_eq(st_codec_ef_encode(&ef, x, buf, cap, &len), 0);
    ck_assert_uint_eq(len, cap);
    ck_assert_int_eq(st_codec_decode(&c.spec, buf, len, d, n, NULL), 0);
    for (size_t i = 0; i < n; i++)
      c.sd[i] += d[i];
    ef_check_message(&c, &ef, y, d, buf);
  }
  st_codec_ef_close(&ef);
  free(x), free(y), free(d), free(buf);
  free(c.sx), free(c.sd), free(c.slack);
}
END_TEST

START_TEST(test_error_feedback_failures) {
  st_codec_spec_t s = spec_of(_i == 0 ? "int8" : "topk:0.1");
  st_codec_ef_t ef;
  ck_assert_int_eq(st_codec_ef_init(&ef, &s, 300), 0);
  float x[300];
  for (size_t i = 0; i < 300; i++)
    x[i] = (float) i * 0.37f + 0.1f;
  uint8_t buf[4096];
  size_t len;
  ck_assert_int_eq(st_codec_ef_encode(&ef, x, buf, sizeof(buf), &len), 0);
  float before[300];
  memcpy(before, ef.residual, sizeof(before));
  int nonzero = 0;
  for (size_t i = 0; i < 300; i++)
    nonzero |= before[i] != 0;
  ck_assert(nonzero);
  /* Too small a buffer changes nothing. */
  ck_assert_int_eq(st_codec_ef_encode(&ef, x, buf, len - 1, &len), -EMSGSIZE);
  ck_assert(memcmp(before, ef.residual, sizeof(before)) == 0);
  /* A NaN (or an overflow of x + r) resets the stream. */
  x[7] = NAN;
  ck_assert_int_eq(st_codec_ef_encode(&ef, x, buf, sizeof(buf), &len), -EINVAL);
  for (size_t i = 0; i < 300; i++)
    EXPECT(ef.residual[i] == 0);
  x[7] = FLT_MAX;
  ck_assert_int_eq(st_codec_ef_encode(&ef, x, buf, sizeof(buf), &len), 0);
  x[7] = FLT_MAX; /* residual + FLT_MAX may overflow; int8 keeps some */
  int rc = st_codec_ef_encode(&ef, x, buf, sizeof(buf), &len);
  ck_assert(rc == 0 || rc == -EINVAL);
  st_codec_ef_reset(&ef);
  for (size_t i = 0; i < 300; i++)
    EXPECT(ef.residual[i] == 0);
  st_codec_ef_close(&ef);
  /* An empty stream works. */
  ck_assert_int_eq(st_codec_ef_init(&ef, &s, 0), 0);
  ck_assert_int_eq(st_codec_ef_encode(&ef, NULL, buf, sizeof(buf), &len), 0);
  ck_assert_uint_eq(len, ST_CODEC_HEADER_BYTES);
  st_codec_ef_close(&ef);
}
END_TEST

/* ---- Malformed messages -------------------------------------------------- */

#define BAD_N 300 /* two int8 chunks, the second partial */

typedef struct {
  const char* what;
  const char* spec;  /* the stream's codec */
  size_t offset;     /* byte to overwrite (SIZE_MAX: none) */
  uint32_t value;    /* written there, `width` bytes */
  int width;         /* 1, 2 or 4 */
  long resize;       /* bytes added to (or cut from) the length */
  long expect_n;     /* the n the decoder is given, minus BAD_N */
  const char* other; /* decode with this spec instead (NULL: same) */
  st_codec_drop_t why;
} bad_case_t;

#define H ST_CODEC_HEADER_BYTES
#define SC (H)           /* int8: first scale */
#define Q (H + 8)        /* int8: first value */
#define NOWHERE SIZE_MAX /* no byte changed */

static const bad_case_t bad_cases[] = {
    {"empty", "bf16", NOWHERE, 0, 1, -(long) (H + 2 * BAD_N), 0, NULL,
     ST_CODEC_DROP_HEADER},
    {"short header", "int8", NOWHERE, 0, 1, -(long) (BAD_N + 8 + 1), 0, NULL,
     ST_CODEC_DROP_HEADER},
    {"version 0", "bf16", 0, 0, 1, 0, 0, NULL, ST_CODEC_DROP_VERSION},
    {"version 2", "topk:0.1", 0, 2, 1, 0, 0, NULL, ST_CODEC_DROP_VERSION},
    {"kind int8 for bf16", "bf16", 1, 2, 1, 0, 0, NULL, ST_CODEC_DROP_KIND},
    {"kind 9", "int8", 1, 9, 1, 0, 0, NULL, ST_CODEC_DROP_KIND},
    {"another codec", "bf16", NOWHERE, 0, 1, 0, 0, "int8", ST_CODEC_DROP_KIND},
    {"reserved byte", "int8", 2, 1, 1, 0, 0, NULL, ST_CODEC_DROP_HEADER},
    {"reserved byte 3", "none", 3, 0x80, 1, 0, 0, NULL, ST_CODEC_DROP_HEADER},
    {"bf16 parameter", "bf16", 4, 1, 4, 0, 0, NULL, ST_CODEC_DROP_HEADER},
    {"int8 chunk 0", "int8", 4, 0, 4, 0, 0, NULL, ST_CODEC_DROP_HEADER},
    {"int8 chunk 65537", "int8", 4, 65537, 4, 0, 0, NULL, ST_CODEC_DROP_HEADER},
    {"int8 chunk 100 (length)", "int8", 4, 100, 4, 0, 0, NULL,
     ST_CODEC_DROP_LENGTH},
    {"n in header", "bf16", 8, BAD_N + 1, 4, 0, 0, NULL, ST_CODEC_DROP_LENGTH},
    {"n high bytes", "int8", 12, 1, 4, 0, 0, NULL, ST_CODEC_DROP_LENGTH},
    {"expected n", "topk:0.1", NOWHERE, 0, 1, 0, 1, NULL, ST_CODEC_DROP_LENGTH},
    {"one byte short", "bf16", NOWHERE, 0, 1, -1, 0, NULL,
     ST_CODEC_DROP_LENGTH},
    {"one byte long", "int8", NOWHERE, 0, 1, 1, 0, NULL, ST_CODEC_DROP_LENGTH},
    {"a pair long", "topk:0.1", NOWHERE, 0, 1, 8, 0, NULL,
     ST_CODEC_DROP_LENGTH},
    {"k in header", "topk:0.1", 4, 31, 4, 8, 0, NULL, ST_CODEC_DROP_LENGTH},
    {"another fraction", "topk:0.1", NOWHERE, 0, 1, 0, 0, "topk:0.2",
     ST_CODEC_DROP_LENGTH},
    {"none short", "none", NOWHERE, 0, 1, -4, 0, NULL, ST_CODEC_DROP_LENGTH},
    {"scale NaN", "int8", SC, 0x7fc00000u, 4, 0, 0, NULL, ST_CODEC_DROP_SCALE},
    {"scale Inf", "int8", SC + 4, 0x7f800000u, 4, 0, 0, NULL,
     ST_CODEC_DROP_SCALE},
    {"scale negative", "int8", SC, 0xbf800000u, 4, 0, 0, NULL,
     ST_CODEC_DROP_SCALE},
    {"scale -0", "int8", SC + 4, 0x80000000u, 4, 0, 0, NULL,
     ST_CODEC_DROP_SCALE},
    {"scale overflows", "int8", SC, 0x7e000000u, 4, 0, 0, NULL,
     ST_CODEC_DROP_SCALE},
    {"int8 -128", "int8", Q + 5, 0x80, 1, 0, 0, NULL, ST_CODEC_DROP_VALUE},
    {"int8 -128 last", "int8", Q + BAD_N - 1, 0x80, 1, 0, 0, NULL,
     ST_CODEC_DROP_VALUE},
    {"value in a zero chunk", "int8", Q + 3, 5, 1, 0, 0, NULL,
     ST_CODEC_DROP_VALUE},
    {"bf16 NaN", "bf16", H + 2 * 17, 0x7fc0, 2, 0, 0, NULL,
     ST_CODEC_DROP_VALUE},
    {"bf16 -Inf", "bf16", H + 2 * (BAD_N - 1), 0xff80, 2, 0, 0, NULL,
     ST_CODEC_DROP_VALUE},
    {"float NaN", "none", H + 4 * 3, 0x7f800001u, 4, 0, 0, NULL,
     ST_CODEC_DROP_VALUE},
    {"index = n", "topk:0.1", H + 8 * 29, BAD_N, 4, 0, 0, NULL,
     ST_CODEC_DROP_INDEX},
    {"index huge", "topk:0.1", H, 0xffffffffu, 4, 0, 0, NULL,
     ST_CODEC_DROP_INDEX},
    {"index repeated", "topk:0.1", H + 8, 0, 4, 0, 0, NULL,
     ST_CODEC_DROP_INDEX},
    {"index descending", "topk:0.1", H + 8 * 3, 1, 4, 0, 0, NULL,
     ST_CODEC_DROP_INDEX},
    {"top-k NaN", "topk:0.1", H + 8 * 4 + 4, 0xffc00000u, 4, 0, 0, NULL,
     ST_CODEC_DROP_VALUE},
    {"top-k Inf", "topk:0.1", H + 4, 0x7f800000u, 4, 0, 0, NULL,
     ST_CODEC_DROP_VALUE},
};

/* A valid encoding of BAD_N floats: the first chunk all zero (its scale
 * 0), then x[i] = i - 150; top-k keeps indices ascending from 0 (30 of
 * them: |x| is largest at both ends). */
static uint8_t* valid_message(const st_codec_spec_t* s, size_t* len) {
  float x[BAD_N];
  for (size_t i = 0; i < BAD_N; i++)
    x[i] = s->kind == ST_CODEC_INT8 && i < 256 ? 0.0f : (float) i - 150.0f;
  size_t cap = st_codec_encoded_bytes(s, BAD_N) + 16;
  uint8_t* buf = calloc(1, cap);
  ck_assert_int_eq(st_codec_encode(s, x, BAD_N, buf, cap, len), 0);
  return buf;
}

START_TEST(test_malformed_refused) {
  const bad_case_t* c = &bad_cases[_i];
  st_codec_spec_t s = spec_of(c->spec);
  size_t len;
  uint8_t* buf = valid_message(&s, &len);
  if (c->offset != NOWHERE)
    memcpy(buf + c->offset, &c->value, (size_t) c->width);
  len = (size_t) ((long) len + c->resize);
  size_t n = (size_t) (BAD_N + c->expect_n);
  st_codec_spec_t d = c->other != NULL ? spec_of(c->other) : s;
  /* The output is exactly n floats (ASan sees any write past it), filled
   * with a pattern that must survive the refusal. */
  float* out = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++)
    out[i] = 12345.0f;
  st_codec_drop_t why = ST_CODEC_DROP_COUNT;
  int rc = st_codec_decode(&d, buf, len, out, n, &why);
  int proto = c->why == ST_CODEC_DROP_VERSION || c->why == ST_CODEC_DROP_KIND;
  ck_assert_msg(rc == (proto ? -EPROTO : -EBADMSG), "%s: rc %d", c->what, rc);
  ck_assert_msg(why == c->why, "%s: reason %s, want %s", c->what,
                st_codec_drop_name(why), st_codec_drop_name(c->why));
  for (size_t i = 0; i < n; i++)
    EXPECT_MSG(out[i] == 12345.0f, "%s: out[%zu] written", c->what, i);
  free(out);
  free(buf);
}
END_TEST

/* The valid messages of the table decode (so that each case above fails
 * for its mutation alone). */
START_TEST(test_malformed_baseline) {
  static const char* const kinds[] = {"none", "bf16", "int8", "topk:0.1"};
  st_codec_spec_t s = spec_of(kinds[_i]);
  size_t len;
  uint8_t* buf = valid_message(&s, &len);
  float out[BAD_N];
  ck_assert_int_eq(st_codec_decode(&s, buf, len, out, BAD_N, NULL), 0);
  if (s.kind == ST_CODEC_TOPK) {
    ck_assert_uint_eq(len, H + 8 * 30);
    ck_assert(out[0] == -150.0f && out[1] == -149.0f && out[2] == -148.0f);
  }
  free(buf);
}
END_TEST

/* Random mutations of valid encodings and random bytes: never a crash, an
 * out-of-bounds read or write (ASan), a non-finite value accepted, an
 * unnamed reason, or an output touched by a refusal. */
static void mutate(st_rng_t* rng, uint8_t* buf, size_t* len, size_t cap) {
  int edits = 1 + (int) st_rng_below(rng, 4);
  for (int e = 0; e < edits; e++) {
    uint64_t op = st_rng_below(rng, 10);
    if (op < 6 && *len > 0) /* flip a byte, mostly in the header */
      buf[st_rng_below(rng, op < 3 && *len > 16 ? 16 : *len)] ^=
          (uint8_t) (1 + st_rng_below(rng, 255));
    else if (op < 8 && *len > 0)
      *len -= 1 + st_rng_below(rng, *len);
    else if (*len < cap)
      buf[(*len)++] = (uint8_t) st_rng_next(rng);
  }
}

START_TEST(test_fuzz_mutations) {
  static const char* const kinds[] = {"none", "bf16", "int8", "topk:0.05"};
  st_rng_t rng;
  st_rng_seed(&rng, tu_seed() + (uint64_t) _i);
  st_codec_spec_t s = spec_of(kinds[_i]);
  int accepted = 0;
  for (int it = 0; it < 20000; it++) {
    size_t n = st_rng_below(&rng, 600), len = 0;
    size_t cap = st_codec_encoded_bytes(&s, n) + 64;
    uint8_t* buf = malloc(cap);
    float* x = tensor(&rng, n, (int) st_rng_below(&rng, DIST_COUNT));
    EXPECT(st_codec_encode(&s, x, n, buf, cap, &len) == 0);
    if (it % 10 == 0) { /* random bytes with a plausible header */
      for (size_t i = ST_CODEC_HEADER_BYTES; i < len; i++)
        buf[i] = (uint8_t) st_rng_next(&rng);
    }
    mutate(&rng, buf, &len, cap);
    float* out = malloc((n > 0 ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
      out[i] = 7.0f;
    st_codec_drop_t why = ST_CODEC_DROP_COUNT;
    int rc = st_codec_decode(&s, buf, len, out, n, &why);
    if (rc == 0) {
      accepted++;
      for (size_t i = 0; i < n; i++)
        EXPECT(isfinite(out[i]));
    } else {
      EXPECT(rc == -EBADMSG || rc == -EPROTO);
      EXPECT(why < ST_CODEC_DROP_COUNT);
      for (size_t i = 0; i < n; i++)
        EXPECT(out[i] == 7.0f);
    }
    free(out);
    free(x);
    free(buf);
  }
  ck_assert_int_gt(accepted, 0); /* value flips that stay valid */
}
END_TEST

static Suite* codec_suite(void) {
  Suite* s = suite_create("optimizer_codec");
  TCase* tc = tcase_create("core");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, test_parse_and_name, 0,
                      (int) (sizeof(parse_cases) / sizeof(parse_cases[0])));
  tcase_add_test(tc, test_bad_specs_and_names);
  tcase_add_test(tc, test_topk_k_and_limits);
  tcase_add_test(tc, test_bf16_scalar);
  tcase_add_loop_test(tc, test_bf16_round_trip, 0, DIST_COUNT);
  tcase_add_loop_test(tc, test_int8_round_trip, 0, DIST_COUNT);
  tcase_add_loop_test(tc, test_topk_round_trip, 0, DIST_COUNT);
  tcase_add_test(tc, test_none_round_trip);
  tcase_add_loop_test(tc, test_encode_refuses_non_finite, 0, 4);
  tcase_add_loop_test(tc, test_error_feedback_tracks_inputs, 0, 5);
  tcase_add_loop_test(tc, test_error_feedback_failures, 0, 2);
  tcase_add_loop_test(tc, test_malformed_refused, 0,
                      (int) (sizeof(bad_cases) / sizeof(bad_cases[0])));
  tcase_add_loop_test(tc, test_malformed_baseline, 0, 4);
  tcase_add_loop_test(tc, test_fuzz_mutations, 0, 4);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  tu_seed();
  SRunner* sr = srunner_create(codec_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
