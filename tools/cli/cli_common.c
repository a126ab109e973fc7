/* cli_common.c: flag-value parsing and timing shared by the subcommands of
 * `starling`. Values are parsed strictly (no trailing junk, range-checked)
 * and every refusal names the flag, the text and what was expected. */
#include "tools/cli/cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int st__parse_u64(const char* cmd, const char* flag, const char* text,
                  uint64_t min, uint64_t max, uint64_t* out) {
  char* end = NULL;
  errno = 0;
  unsigned long long v = 0;
  int ok = text[0] >= '0' && text[0] <= '9';
  if (ok) {
    v = strtoull(text, &end, 10);
    ok = errno == 0 && *end == '\0' && v >= min && v <= max;
  }
  if (!ok) {
    fprintf(stderr,
            "%s: %s: '%s' is not a whole number between %llu and "
            "%llu\n",
            cmd, flag, text, (unsigned long long) min,
            (unsigned long long) max);
    return -EINVAL;
  }
  *out = v;
  return 0;
}

int st__parse_double(const char* cmd, const char* flag, const char* text,
                     double min, double max, double* out) {
  char* end = NULL;
  errno = 0;
  double v = strtod(text, &end);
  if (end == text || *end != '\0' || errno != 0 || !isfinite(v) || v < min ||
      v > max) {
    fprintf(stderr, "%s: %s: '%s' is not a number between %g and %g\n", cmd,
            flag, text, min, max);
    return -EINVAL;
  }
  *out = v;
  return 0;
}
