/* errmsg.c: the one writer of error sentences (base.h, st_set_err). Every
 * layer reports bad input through it. */
#include <stdarg.h>
#include <stdio.h>

#include "base/base.h"

void st_set_err(char* err, size_t err_len, const char* fmt, ...) {
  if (err == NULL || err_len == 0)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, err_len, fmt, ap);
  va_end(ap);
}

void st_set_errv(char* err, size_t err_len, const char* fmt, va_list ap) {
  if (err == NULL || err_len == 0)
    return;
  vsnprintf(err, err_len, fmt, ap);
}
