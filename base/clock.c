/* clock.c: the monotonic clock of base.h. */
#include <time.h>

#include "base/base.h"

double st_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}
