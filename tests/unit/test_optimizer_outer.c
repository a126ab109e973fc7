/* test_optimizer_outer.c: Check suite for optimizer/outer.c, the outer
 * optimizer of averaging (optimizer.h, "The outer optimizer of
 * averaging"), and for base/decimal.c, the exact decimals its setting is
 * read with: parsing and canonical names (texts that parse alike name
 * alike; bad texts refused with a sentence naming them); 50 rounds of the
 * Nesterov step on random vectors against a float64 reference of the same
 * recurrence; lr 1 with momentum 0 leaving exactly the mean (plain
 * averaging); and the momentum carrying a constant outer gradient's steps
 * to the geometric sum it must reach. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "optimizer/optimizer.h"
#include "tests/unit/testutil.h"

/* ---- Decimals ------------------------------------------------------------ */

static const struct {
  const char* text;
  uint64_t max;
  int ok;
  uint64_t v;
  const char* name;
} decimal_cases[] = {
    {"0.7", 4000000, 1, 700000, "0.7"},
    {"0.70", 4000000, 1, 700000, "0.7"},
    {".7", 4000000, 1, 700000, "0.7"},
    {"1", 4000000, 1, 1000000, "1"},
    {"1.000000000", 4000000, 1, 1000000, "1"},
    {"4", 4000000, 1, 4000000, "4"},
    {"0", 4000000, 1, 0, "0"},
    {"2.5", 4000000, 1, 2500000, "2.5"},
    {"0.000001", 1000000, 1, 1, "0.000001"},
    {"4.000001", 4000000, 0, 0, NULL},
    {"5", 4000000, 0, 0, NULL},
    {"0.0000001", 1000000, 0, 0, NULL}, /* finer than a millionth */
    {"-0.5", 1000000, 0, 0, NULL},
    {"1e-2", 1000000, 0, 0, NULL},
    {"0.5x", 1000000, 0, 0, NULL},
    {".", 1000000, 0, 0, NULL},
    {"1.", 1000000, 0, 0, NULL},
    {"", 1000000, 0, 0, NULL},
    {"99999999999999999999999", UINT64_MAX, 0, 0, NULL},
    /* max / 10^6 whole, then a fraction past max: refused, not wrapped. */
    {"18446744073709.999999", UINT64_MAX, 0, 0, NULL},
    {"18446744073709.551615", UINT64_MAX, 1, UINT64_MAX,
     "18446744073709.551615"},
};

START_TEST(test_decimals) {
  uint64_t v = 12345;
  int rc =
      st_parse_millionths(decimal_cases[_i].text, decimal_cases[_i].max, &v);
  if (!decimal_cases[_i].ok) {
    ck_assert_msg(rc == -EINVAL, "'%s' parsed", decimal_cases[_i].text);
    ck_assert_uint_eq(v, 12345); /* untouched */
    return;
  }
  ck_assert_msg(rc == 0, "'%s' refused", decimal_cases[_i].text);
  ck_assert_uint_eq(v, decimal_cases[_i].v);
  char buf[32];
  ck_assert_int_eq(st_format_millionths(v, buf, sizeof buf), 0);
  ck_assert_str_eq(buf, decimal_cases[_i].name);
  ck_assert_int_eq(st_format_millionths(v, buf, strlen(buf)), -ENOSPC);
}
END_TEST

/* ---- Settings and names ------------------------------------------------- */

START_TEST(test_parse_and_name) {
  st_outer_spec_t s;
  char err[256], name[64];
  st_outer_spec_default(&s);
  ck_assert_int_eq(s.kind, ST_OUTER_NONE);
  ck_assert_int_eq(st_outer_name(&s, name, sizeof name), 0);
  ck_assert_str_eq(name, "none");
  ck_assert_int_eq(st_outer_parse_kind("nesterov", &s, err, sizeof err), 0);
  ck_assert_int_eq(st_outer_name(&s, name, sizeof name), 0);
  ck_assert_str_eq(name, "nesterov:0.7:0.9"); /* DiLoCo's defaults */
  ck_assert_int_eq(st_outer_parse_lr("1.000", &s, err, sizeof err), 0);
  ck_assert_int_eq(st_outer_parse_momentum("0", &s, err, sizeof err), 0);
  ck_assert_int_eq(st_outer_name(&s, name, sizeof name), 0);
  ck_assert_str_eq(name, "nesterov:1:0");
  ck_assert_int_eq(st_outer_name(&s, name, 8), -ENOSPC);

  ck_assert_int_eq(st_outer_parse_kind("adam", &s, err, sizeof err), -EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "'adam'"));
  ck_assert_ptr_nonnull(strstr(err, "nesterov"));
  ck_assert_int_eq(st_outer_parse_lr("0", &s, err, sizeof err), -EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "'0'"));
  ck_assert_int_eq(st_outer_parse_lr("4.5", &s, err, sizeof err), -EINVAL);
  ck_assert_int_eq(st_outer_parse_momentum("1", &s, err, sizeof err), -EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "[0, 1)"));
  ck_assert_int_eq(st_outer_parse_momentum("0.9999999", &s, err, sizeof err),
                   -EINVAL);
  /* The refused texts changed nothing. */
  ck_assert_int_eq(st_outer_name(&s, name, sizeof name), 0);
  ck_assert_str_eq(name, "nesterov:1:0");
  s.lr_ppm = 0;
  ck_assert_int_eq(st_outer_name(&s, name, sizeof name), -EINVAL);
  /* The gossip variant names itself apart: a cluster cannot mix them. */
  st_outer_spec_default(&s);
  ck_assert_int_eq(st_outer_parse_kind("noloco", &s, err, sizeof err), 0);
  ck_assert_int_eq(s.kind, ST_OUTER_NOLOCO);
  ck_assert_int_eq(st_outer_name(&s, name, sizeof name), 0);
  ck_assert_str_eq(name, "noloco:0.7:0.9");
  ck_assert_int_eq(st_outer_parse_kind("nolo", &s, err, sizeof err), -EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "noloco"));
}
END_TEST

/* The gossip variant's step, which has no vector of the mean (own +
 * delta), lands where st_outer_step lands with that mean, float for
 * float within a rounding of the sum, over 30 exchanges; and the anchor
 * and momentum it leaves are the same. */
START_TEST(test_step_own_is_the_step_on_own_plus_delta) {
  const size_t n = 777;
  st_outer_spec_t s = {ST_OUTER_NOLOCO, 700000, 900000};
  float *a1 = calloc(n, 4), *m1 = calloc(n, 4), *a2 = calloc(n, 4),
        *m2 = calloc(n, 4), *own = calloc(n, 4), *mean = calloc(n, 4),
        *d1 = calloc(n, 4), *d2 = calloc(n, 4);
  ck_assert(a1 && m1 && a2 && m2 && own && mean && d1 && d2);
  st_rng_t rng;
  st_rng_seed(&rng, 99);
  for (size_t i = 0; i < n; i++)
    a1[i] = a2[i] = (float) st_rng_normal(&rng);
  for (int round = 0; round < 30; round++) {
    for (size_t i = 0; i < n; i++) {
      own[i] = a1[i] + (float) (0.05 * st_rng_normal(&rng));
      d1[i] = d2[i] = (float) (0.02 * st_rng_normal(&rng));
      mean[i] = own[i] + d1[i];
    }
    st_outer_step(&s, a1, m1, mean, d1, n);
    st_outer_step_own(&s, a2, m2, own, d2, n);
    for (size_t i = 0; i < n; i++) {
      float scale = fabsf(a1[i]) + fabsf(own[i]) + 1.0f;
      ck_assert_msg(fabsf(a1[i] - a2[i]) <= 4e-7f * scale,
                    "round %d [%zu]: anchor %g vs %g", round, i, a1[i], a2[i]);
      ck_assert_msg(fabsf(m1[i] - m2[i]) <= 4e-7f * scale, "momentum");
      /* delta ends as new anchor - own in both. */
      ck_assert_msg(fabsf((own[i] + d2[i]) - a2[i]) <= 4e-7f * scale,
                    "round %d [%zu]: own + delta %g, anchor %g", round, i,
                    own[i] + d2[i], a2[i]);
      a2[i] = a1[i], m2[i] = m1[i]; /* the next round from the same state */
    }
  }
  free(a1), free(m1), free(a2), free(m2), free(own), free(mean), free(d1),
      free(d2);
}
END_TEST

/* ---- The step ------------------------------------------------------------ */

static st_outer_spec_t nesterov(uint32_t lr_ppm, uint32_t momentum_ppm) {
  st_outer_spec_t s = {ST_OUTER_NESTEROV, lr_ppm, momentum_ppm};
  return s;
}

/* 50 rounds on 1,001 floats: each round the members' mean moves off the
 * anchor by a random outer gradient; the float32 step follows a float64
 * run of the same recurrence within a few float32 roundings of the
 * values' scale, and delta always ends as new anchor - own. */
START_TEST(test_step_follows_float64) {
  const size_t n = 1001;
  const uint32_t lrs[] = {700000, 1000000, 250000};
  const uint32_t moms[] = {900000, 0, 500000};
  st_outer_spec_t s = nesterov(lrs[_i], moms[_i]);
  double lr = lrs[_i] / 1e6, mu = moms[_i] / 1e6;
  float *a = calloc(n, 4), *m = calloc(n, 4), *mean = calloc(n, 4),
        *own = calloc(n, 4), *delta = calloc(n, 4);
  double *ra = calloc(n, 8), *rm = calloc(n, 8);
  ck_assert(a && m && mean && own && delta && ra && rm);
  st_rng_t rng;
  st_rng_seed(&rng, 17 + (uint64_t) _i);
  for (size_t i = 0; i < n; i++) {
    a[i] = (float) st_rng_normal(&rng);
    ra[i] = a[i];
  }
  double worst = 0;
  for (int round = 0; round < 50; round++) {
    for (size_t i = 0; i < n; i++) {
      /* The mean as the float32 members hold it, and one member's own. */
      mean[i] = a[i] - (float) (0.01 * st_rng_normal(&rng));
      own[i] = mean[i] + (float) (0.003 * st_rng_normal(&rng));
      delta[i] = mean[i] - own[i];
    }
    /* The reference from the same float32 inputs, in float64. */
    for (size_t i = 0; i < n; i++) {
      double g = ra[i] - (double) mean[i];
      rm[i] = mu * rm[i] + g;
      ra[i] = ra[i] - lr * (g + mu * rm[i]);
    }
    st_outer_step(&s, a, m, mean, delta, n);
    for (size_t i = 0; i < n; i++) {
      double err = fabs((double) a[i] - ra[i]);
      worst = err > worst ? err : worst;
      /* delta = new anchor - own, to float32 rounding. */
      double want = (double) a[i] - (double) own[i];
      ck_assert_msg(fabs((double) delta[i] - want) <= 1e-6 * (1 + fabs(want)),
                    "round %d float %zu: delta %g, want %g", round, i, delta[i],
                    want);
      /* The float32 anchor must track the float64 one from its own
       * previous value: reset the reference to it so that errors do not
       * compound over 50 rounds of a contracting-or-not recurrence. */
      ra[i] = a[i];
      rm[i] = m[i];
    }
  }
  ck_assert_msg(worst <= 1e-5, "worst error %g", worst);
  free(a), free(m), free(mean), free(own), free(delta), free(ra), free(rm);
}
END_TEST

/* lr 1, momentum 0: the new anchor is the mean bit for bit, and delta is
 * left as it came (mean - own): plain averaging. */
START_TEST(test_lr1_momentum0_is_plain_averaging) {
  const size_t n = 257;
  st_outer_spec_t s = nesterov(1000000, 0);
  float a[257], m[257], mean[257], delta[257], before[257];
  st_rng_t rng;
  st_rng_seed(&rng, 5);
  for (size_t i = 0; i < n; i++) {
    a[i] = (float) st_rng_normal(&rng);
    m[i] = 0;
    mean[i] = a[i] + (float) st_rng_normal(&rng);
    delta[i] = before[i] = (float) st_rng_normal(&rng);
  }
  st_outer_step(&s, a, m, mean, delta, n);
  for (size_t i = 0; i < n; i++) {
    ck_assert_msg(a[i] == mean[i], "anchor %zu: %a, mean %a", i, a[i], mean[i]);
    /* delta + (next - mean) with next == mean: unchanged. */
    ck_assert_msg(delta[i] == before[i], "delta %zu moved", i);
  }
}
END_TEST

/* A constant outer gradient g (the mean always 0.01 below the anchor):
 * after k rounds the momentum is g (1 - mu^k) / (1 - mu), so the anchor's
 * k-th move is lr (g + mu m_k); with mu 0.9 the moves grow towards
 * lr g (1 + 0.9 * 10) = 10 lr g. Without the momentum they would stay
 * lr g. */
START_TEST(test_momentum_accelerates_a_steady_pull) {
  st_outer_spec_t s = nesterov(700000, 900000);
  float a = 1.0f, m = 0.0f, delta = 0.0f;
  double last_move = 0;
  for (int k = 1; k <= 60; k++) {
    float mean = a - 0.01f;
    float before = a;
    delta = 0;
    st_outer_step(&s, &a, &m, &mean, &delta, 1);
    double mk = 0.01 * (1 - pow(0.9, k)) / 0.1;
    double want = 0.7 * (0.01 + 0.9 * mk);
    last_move = (double) before - (double) a;
    ck_assert_msg(fabs(last_move - want) <= 1e-5, "round %d: moved %g, want %g",
                  k, last_move, want);
  }
  ck_assert_msg(last_move > 6.5 * 0.7 * 0.01, "final move %g", last_move);
}
END_TEST

static Suite* outer_suite(void) {
  Suite* s = suite_create("optimizer_outer");
  TCase* tc = tcase_create("outer");
  tcase_add_loop_test(tc, test_decimals, 0,
                      (int) (sizeof decimal_cases / sizeof decimal_cases[0]));
  tcase_add_test(tc, test_parse_and_name);
  tcase_add_loop_test(tc, test_step_follows_float64, 0, 3);
  tcase_add_test(tc, test_lr1_momentum0_is_plain_averaging);
  tcase_add_test(tc, test_momentum_accelerates_a_steady_pull);
  tcase_add_test(tc, test_step_own_is_the_step_on_own_plus_delta);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(outer_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
