/* test_kernels_api.c: the Check suite of the non-op parts of kernels.h:
 * opening backends from device specs (the error sentences included) and the
 * seedable random number generator (known answers, determinism, bounds and
 * distribution). The ops themselves, on CPU and CUDA, are tested in
 * test_kernels.c.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "tests/unit/testutil.h"

static st_rng_t rng_for(uint64_t salt) {
  st_rng_t rng;
  st_rng_seed(&rng, tu_seed() ^ (salt * UINT64_C(0x9e3779b97f4a7c15)));
  return rng;
}

/* ---- Opening ------------------------------------------------------------ */

START_TEST(test_open_bad_specs) {
  static const char* bad[] = {
      "gpu",     "cuda:x", "cuda:-1", "",      "cuda:",
      "cuda:0x", "CPU",    "cpu:0",   " cuda", "cuda:99999999999999999999"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    st_backend_t* be = (st_backend_t*) &be; /* must be reset to NULL */
    char err[256] = "";
    int rc = st_backend_open(&be, bad[i], 0, err, sizeof(err));
    ck_assert_msg(rc == -EINVAL, "\"%s\": rc %d", bad[i], rc);
    ck_assert_ptr_null(be);
    /* The sentence names the bad spec and the valid forms. */
    ck_assert_msg(strstr(err, bad[i]) != NULL && strstr(err, "cuda:N") != NULL,
                  "\"%s\": err \"%s\"", bad[i], err);
  }
  st_backend_t* be = NULL;
  char err[256];
  ck_assert_int_eq(st_backend_open(&be, NULL, 0, err, sizeof(err)), -EINVAL);
  ck_assert_int_eq(st_backend_open(NULL, "cpu", 0, err, sizeof(err)), -EINVAL);
  ck_assert_int_eq(st_backend_open(&be, "cpu", -1, err, sizeof(err)), -EINVAL);
  ck_assert_int_eq(st_backend_open(&be, "gpu", 0, NULL, 0), -EINVAL);
  /* A short buffer gets a truncated, terminated sentence. */
  char small[8];
  memset(small, 'x', sizeof(small));
  ck_assert_int_eq(st_backend_open(&be, "gpu", 0, small, sizeof(small)),
                   -EINVAL);
  ck_assert_uint_eq(strlen(small), sizeof(small) - 1);
}
END_TEST

START_TEST(test_open_cuda) {
  int count = st_cuda_device_count();
  ck_assert_int_ge(count, 0);
  char spec[32], err[256] = "";
  st_backend_t* be = NULL;
  int rc = st_backend_open(&be, "cuda", 0, err, sizeof(err));
  if (count == 0) {
    /* No GPU (or a build without CUDA): a clear error that points at the
     * CPU. */
    ck_assert_int_eq(rc, -ENODEV);
    ck_assert_ptr_null(be);
    ck_assert_msg(strstr(err, "--device cpu") != NULL, "err \"%s\"", err);
  } else {
    ck_assert_msg(rc == 0, "cuda: %s", err);
    ck_assert_int_eq(st_backend_kind(be), ST_BACKEND_CUDA);
    ck_assert(strncmp(st_backend_describe(be), "cuda:0 (", 8) == 0);
    st_backend_close(be);
  }
  snprintf(spec, sizeof(spec), "cuda:%d", count); /* one past the last */
  ck_assert_int_eq(st_backend_open(&be, spec, 0, err, sizeof(err)), -ENODEV);
  ck_assert_msg(strstr(err, "--device cpu") != NULL, "err \"%s\"", err);
}
END_TEST

START_TEST(test_open_cpu_and_auto) {
  st_backend_t* be = NULL;
  char err[256];
  ck_assert_int_eq(st_backend_open(&be, "cpu", 1, err, sizeof(err)), 0);
  ck_assert_int_eq(st_backend_kind(be), ST_BACKEND_CPU);
  ck_assert_str_eq(st_backend_describe(be), "cpu (OpenBLAS, 1 thread)");
  ck_assert_str_eq(st_backend_last_error(be), "");
  ck_assert_int_eq(st_backend_sync(be), 0);
  st_backend_close(be);
  ck_assert_int_eq(st_backend_open(&be, "auto", 0, err, sizeof(err)), 0);
  ck_assert_int_eq(st_backend_kind(be), st_cuda_device_count() > 0
                                            ? ST_BACKEND_CUDA
                                            : ST_BACKEND_CPU);
  st_backend_close(be);
  st_backend_close(NULL);
}
END_TEST

/* ---- Random numbers ----------------------------------------------------- */

/* Known answers of xoshiro256** seeded through splitmix64, computed with an
 * independent implementation of the reference code; they pin the stream
 * that every node must draw. */
START_TEST(test_rng_known_answers) {
  static const struct {
    uint64_t seed, first[4];
  } kat[] = {
      {0,
       {UINT64_C(0x99ec5f36cb75f2b4), UINT64_C(0xbf6e1f784956452a),
        UINT64_C(0x1a5f849d4933e6e0), UINT64_C(0x6aa594f1262d2d2c)}},
      {42,
       {UINT64_C(0x15780b2e0c2ec716), UINT64_C(0x6104d9866d113a7e),
        UINT64_C(0xae17533239e499a1), UINT64_C(0xecb8ad4703b360a1)}},
  };
  for (size_t k = 0; k < sizeof(kat) / sizeof(kat[0]); k++) {
    st_rng_t rng;
    st_rng_seed(&rng, kat[k].seed);
    for (int i = 0; i < 4; i++)
      ck_assert_msg(st_rng_next(&rng) == kat[k].first[i], "seed %llu draw %d",
                    (unsigned long long) kat[k].seed, i);
  }
}
END_TEST

START_TEST(test_rng_determinism) {
  st_rng_t a, b, c;
  st_rng_seed(&a, tu_seed());
  st_rng_seed(&b, tu_seed());
  st_rng_seed(&c, tu_seed() + 1);
  int differs = 0;
  for (int i = 0; i < 1000; i++) {
    uint64_t x = st_rng_next(&a);
    ck_assert(x == st_rng_next(&b));
    differs += x != st_rng_next(&c);
  }
  ck_assert_int_gt(differs, 990);
}
END_TEST

START_TEST(test_rng_below) {
  st_rng_t rng = rng_for(1300);
  static const uint64_t bounds[] = {
      1, 2, 3, 7, 10, 1000003, (UINT64_C(1) << 63) + 1, UINT64_MAX};
  for (size_t b = 0; b < sizeof(bounds) / sizeof(bounds[0]); b++)
    for (int i = 0; i < 10000; i++)
      ck_assert(st_rng_below(&rng, bounds[b]) < bounds[b]);
  /* 100000 draws into 10 bins: 10000 each, standard deviation ~95; 600 is
   * more than 6 of them. */
  size_t bins[10] = {0};
  for (int i = 0; i < 100000; i++)
    bins[st_rng_below(&rng, 10)]++;
  for (int i = 0; i < 10; i++)
    ck_assert_msg(bins[i] > 9400 && bins[i] < 10600, "bin %d: %zu", i, bins[i]);
}
END_TEST

START_TEST(test_rng_uniform_normal) {
  st_rng_t rng = rng_for(1400);
  const int n = 200000;
  double su = 0, sn = 0, sn2 = 0;
  for (int i = 0; i < n; i++) {
    double u = st_rng_uniform(&rng), z = st_rng_normal(&rng);
    ck_assert(u >= 0.0 && u < 1.0 && isfinite(z));
    su += u, sn += z, sn2 += z * z;
  }
  /* Standard errors: uniform mean 0.00065, normal mean 0.0022, normal
   * variance 0.0032; the bounds are 6 or more of them. */
  ck_assert_double_lt(fabs(su / n - 0.5), 0.004);
  ck_assert_double_lt(fabs(sn / n), 0.015);
  ck_assert_double_lt(fabs(sn2 / n - 1.0), 0.02);
}
END_TEST

/* ---- Suite -------------------------------------------------------------- */

static Suite* kernels_api_suite(void) {
  Suite* s = suite_create("kernels_api");
  TCase* tc = tcase_create("open");
  tcase_add_test(tc, test_open_bad_specs);
  tcase_add_test(tc, test_open_cuda);
  tcase_add_test(tc, test_open_cpu_and_auto);
  suite_add_tcase(s, tc);

  tc = tcase_create("rng");
  tcase_add_test(tc, test_rng_known_answers);
  tcase_add_test(tc, test_rng_determinism);
  tcase_add_test(tc, test_rng_below);
  tcase_add_test(tc, test_rng_uniform_normal);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  tu_seed(); /* print the seed once, before Check forks */
  SRunner* sr = srunner_create(kernels_api_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
