/* backend_error.c: the sentences a backend keeps or hands back
 * (backend_internal.h). Compiled into st_kernels and, on its own, into the
 * CUDA backend module (libstarling_cuda.so), which reports its errors the
 * same way. */
#include <stdarg.h>
#include <stdio.h>

#include "kernels/backend_internal.h"

void st__backend_set_error(st_backend_t* be, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  st_set_errv(be->last_error, sizeof(be->last_error), fmt, ap);
  va_end(ap);
}
