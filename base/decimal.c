/* decimal.c: exact decimals for settings every node must read alike (a
 * top-k fraction, an outer learning rate): a decimal text is kept as an
 * integer count of millionths, so two nodes given "0.7" and "0.70" hold
 * the same number and name it with the same canonical text, the text that
 * goes into a model fingerprint.
 */
#include "base/base.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define MILLION 1000000u

int st_parse_millionths(const char* s, uint64_t max, uint64_t* out) {
  if (s == NULL || out == NULL)
    return -EINVAL;
  uint64_t whole = 0, frac = 0;
  int digits = 0, decimals = 0;
  for (; *s >= '0' && *s <= '9'; s++, digits++) {
    whole = whole * 10 + (uint64_t) (*s - '0');
    if (whole > max / MILLION)
      return -EINVAL;
  }
  if (*s == '.') {
    for (s++; *s >= '0' && *s <= '9'; s++, decimals++) {
      if (decimals >= 6 && *s != '0')
        return -EINVAL; /* finer than a millionth */
      if (decimals < 6)
        frac = frac * 10 + (uint64_t) (*s - '0');
    }
    if (decimals == 0)
      return -EINVAL;
  }
  if (*s != '\0' || digits + decimals == 0)
    return -EINVAL;
  for (int d = decimals; d < 6; d++)
    frac *= 10;
  /* whole <= max / MILLION, so whole * MILLION <= max: no overflow. */
  if (frac > max - whole * MILLION)
    return -EINVAL;
  *out = whole * MILLION + frac;
  return 0;
}

int st_format_millionths(uint64_t v, char* buf, size_t len) {
  char tmp[32];
  int w = snprintf(tmp, sizeof tmp, "%llu.%06llu",
                   (unsigned long long) (v / MILLION),
                   (unsigned long long) (v % MILLION));
  while (w > 0 && tmp[w - 1] == '0')
    tmp[--w] = '\0'; /* 0.010000 -> 0.01 */
  if (w > 0 && tmp[w - 1] == '.')
    tmp[--w] = '\0'; /* 1.000000 -> 1 */
  if (buf == NULL || (size_t) w + 1 > len)
    return -ENOSPC;
  memcpy(buf, tmp, (size_t) w + 1);
  return 0;
}
