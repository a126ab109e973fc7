/* errmsg.c: the one way crypto/ writes an error sentence for its callers. */
#include <stdarg.h>
#include <stdio.h>

#include "crypto/crypto_internal.h"

void st__crypto_set_err(char* err, size_t err_len, const char* fmt, ...) {
  if (err == NULL || err_len == 0)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, err_len, fmt, ap);
  va_end(ap);
}
