/* node_internal.h: helpers shared by the files of node/; not part of the
 * public interface (node.h). */
#ifndef STARLING_NODE_INTERNAL_H
#define STARLING_NODE_INTERNAL_H

#include <stddef.h>

/* Formats one error sentence into err (when err is non-NULL and err_len is
 * non-zero), truncating as needed. */
__attribute__((format(printf, 3, 4))) void st__set_err(char* err,
                                                       size_t err_len,
                                                       const char* fmt, ...);

#endif
