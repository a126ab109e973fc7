/* cli_common.c: flag-value parsing and timing shared by the subcommands of
 * `starling`. Values are parsed strictly (no trailing junk, range-checked)
 * and every refusal names the flag, the text and what was expected. */
#include "tools/cli/cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void st__program_usage(const st__program_t* p, FILE* f) {
  fputs(p->intro, f);
  int width = 10; /* names, then two spaces at least: help2roff splits so */
  for (size_t i = 0; i < p->n_commands; i++)
    if ((int) strlen(p->commands[i].name) + 1 > width)
      width = (int) strlen(p->commands[i].name) + 1;
  for (size_t i = 0; i < p->n_commands; i++)
    fprintf(f, "  %-*s %s\n", width, p->commands[i].name,
            p->commands[i].summary);
  if (p->version != NULL)
    fprintf(f, "  %-*s print the version\n", width, "version");
  fputs(p->outro, f);
}

int st__program_main(const st__program_t* p, int argc, char** argv) {
  if (argc < 2) {
    st__program_usage(p, stderr);
    return 2;
  }
  const char* cmd = argv[1];
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 ||
      strcmp(cmd, "help") == 0) {
    st__program_usage(p, stdout);
    return 0;
  }
  if (p->version != NULL &&
      (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0)) {
    if (argc > 2 &&
        (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0)) {
      printf(
          "usage: %s version\n\nPrints the version of %s (also: %s "
          "--version).\n",
          p->prog, p->prog, p->prog);
      return 0;
    }
    if (argc > 2) {
      fprintf(stderr, "%s version: takes no arguments ('%s')\n", p->prog,
              argv[2]);
      return 2;
    }
    printf("%s %s\n", p->prog, p->version);
    return 0;
  }
  for (size_t i = 0; i < p->n_commands; i++)
    if (strcmp(cmd, p->commands[i].name) == 0)
      return p->commands[i].run(argc - 1, argv + 1);
  fprintf(stderr, "%s: unknown %s '%s'\n\n", p->prog, p->noun, cmd);
  st__program_usage(p, stderr);
  return 2;
}

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

int st__parse_duration(const char* cmd, const char* flag, const char* text,
                       double max_s, double* out) {
  static const struct {
    const char* unit;
    double s;
  } units[] = {{"ms", 1e-3}, {"s", 1}, {"m", 60}, {"h", 3600}, {"", 1}};
  char* end = NULL;
  errno = 0;
  double v = strtod(text, &end);
  for (size_t i = 0; end != text && errno == 0 && isfinite(v) && v >= 0 &&
                     i < sizeof(units) / sizeof(units[0]);
       i++)
    if (strcmp(end, units[i].unit) == 0 && v * units[i].s <= max_s) {
      *out = v * units[i].s;
      return 0;
    }
  fprintf(stderr,
          "%s: %s: '%s' is not a duration: a number of seconds, or with a "
          "unit (500ms, 30s, 5m, 1h), at most %g s\n",
          cmd, flag, text, max_s);
  return -EINVAL;
}

int st__parse_interval(const char* cmd, const char* flag, const char* text,
                       double max_s, uint64_t max_steps, bool bare_is_seconds,
                       double* seconds, uint64_t* steps) {
  *seconds = 0;
  *steps = 0;
  size_t len = strlen(text), unit = strlen("steps");
  if (len > 4 && strcmp(text + len - 4, "step") == 0)
    unit = 4; /* 1step */
  if (len > unit && strncmp(text + len - unit, "steps", unit) == 0) {
    char num[32];
    if (len - unit < sizeof num) {
      memcpy(num, text, len - unit);
      num[len - unit] = '\0';
      char* end = NULL;
      errno = 0;
      unsigned long long v = strtoull(num, &end, 10);
      if (num[0] >= '0' && num[0] <= '9' && *end == '\0' && errno == 0 &&
          v <= max_steps) {
        *steps = (uint64_t) v;
        return 0;
      }
    }
    fprintf(stderr,
            "%s: %s: '%s' is not a number of steps: a whole number from 0 "
            "to %llu followed by \"steps\" (500steps)\n",
            cmd, flag, text, (unsigned long long) max_steps);
    return -EINVAL;
  }
  size_t digits = strspn(text, "0123456789.");
  if (!bare_is_seconds && len > 0 && digits == len && strtod(text, NULL) != 0) {
    fprintf(stderr,
            "%s: %s: '%s' needs a unit: %ssteps for steps, or %ss for "
            "seconds\n",
            cmd, flag, text, text, text);
    return -EINVAL;
  }
  return st__parse_duration(cmd, flag, text, max_s, seconds);
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
