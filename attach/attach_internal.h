/* attach_internal.h: what attach.c shares with attach_json.c (internal to
 * attach/; the public header is attach/attach.h). */
#ifndef STARLING_ATTACH_INTERNAL_H
#define STARLING_ATTACH_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "attach/attach.h"

/* st_attach_model_add without the duplicate-name check, which a decoder
 * makes once for the whole list (st__attach_model_unique). */
int st__attach_model_append(st_attach_model_t* m, const char* name,
                            const char* dtype, int ndim, const uint64_t* shape,
                            char* err, size_t err_len);
/* -EINVAL naming the first tensor (by index) whose name repeats an earlier
 * one; O(n log n). */
int st__attach_model_unique(const st_attach_model_t* m, char* err,
                            size_t err_len);
/* Copies at most out_len - 1 bytes of s, control bytes as '?'. */
void st__attach_printable(const char* s, char* out, size_t out_len);

#endif
