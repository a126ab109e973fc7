/* testutil.c: helpers shared by the Check suites (see testutil.h). */
#define _XOPEN_SOURCE 700 /* nftw */
#include "tests/unit/testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

uint64_t tu_seed(void) {
  static uint64_t seed;
  static int done;
  if (!done) {
    const char* env = getenv("ST_TEST_SEED");
    if (env != NULL && *env != '\0') {
      seed = strtoull(env, NULL, 0);
    } else {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      seed = (uint64_t) ts.tv_sec * 1000003u ^ (uint64_t) ts.tv_nsec ^
             (uint64_t) getpid() << 32;
    }
    fprintf(stderr, "test seed: ST_TEST_SEED=%llu\n",
            (unsigned long long) seed);
    done = 1;
  }
  return seed;
}

void tu_fill_uniform(st_rng_t* rng, float* x, size_t n, float lo, float hi) {
  for (size_t i = 0; i < n; i++)
    x[i] = lo + (hi - lo) * (float) st_rng_uniform(rng);
}

long tu_first_mismatch(const double* ref, const float* got, size_t n,
                       double atol, double rtol) {
  for (size_t i = 0; i < n; i++) {
    double g = got[i];
    if (isnan(ref[i]) || isnan(g)) {
      if (isnan(ref[i]) && isnan(g))
        continue;
      return (long) i;
    }
    if (fabs(ref[i] - g) > atol + rtol * fabs(ref[i]))
      return (long) i;
  }
  return -1;
}

int tu_mkdtemp(char* buf, size_t len) {
  const char* tmp = getenv("TMPDIR");
  if (tmp == NULL || *tmp == '\0')
    tmp = "/tmp";
  if ((size_t) snprintf(buf, len, "%s/starling-test-XXXXXX", tmp) >= len)
    return -ENAMETOOLONG;
  if (mkdtemp(buf) == NULL)
    return -errno;
  return 0;
}

static int remove_entry(const char* path, const struct stat* sb, int flag,
                        struct FTW* ftw) {
  (void) sb;
  (void) flag;
  (void) ftw;
  return remove(path);
}

void tu_rmtree(const char* path) {
  nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int tu_write_file(const char* path, const void* data, size_t len) {
  FILE* f = fopen(path, "wb");
  if (f == NULL)
    return -errno;
  size_t w = fwrite(data, 1, len, f);
  int rc = (w == len) ? 0 : -EIO;
  if (fclose(f) != 0 && rc == 0)
    rc = -errno;
  return rc;
}

int tu_main(Suite* (*make)(void) ) {
  tu_seed();
  SRunner* sr = srunner_create(make());
  srunner_run_all(sr, CK_ENV);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
