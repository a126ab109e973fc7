/* base.h: what every layer of starling needs and none owns: the seeded
 * random generator, the one error-sentence writer, a monotonic clock, and a
 * small strict JSON reader and writer. It depends on nothing else of
 * starling (docs/architecture.md gives the allowed arrows); kernels,
 * optimizer, crypto, gossip, node and tools all build on it.
 */
#ifndef STARLING_BASE_H
#define STARLING_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Random numbers (rng.c) ------------------------------------------- */

/* A small, fast, seedable generator (xoshiro256**, seeded through
 * splitmix64) so that every node that shares a seed draws the same numbers
 * on every platform. Not for cryptography. */
typedef struct {
  uint64_t s[4];
} st_rng_t;

void st_rng_seed(st_rng_t* rng, uint64_t seed);
uint64_t st_rng_next(st_rng_t* rng);
/* Uniform in [0, 1) with 53 random bits. */
double st_rng_uniform(st_rng_t* rng);
/* Uniform integer in [0, bound) without modulo bias; bound > 0. */
uint64_t st_rng_below(st_rng_t* rng, uint64_t bound);
/* Standard normal (Box-Muller). */
double st_rng_normal(st_rng_t* rng);

/* ---- Error sentences (errmsg.c) ----------------------------------------- */

/* The one writer of the sentence a call leaves for its caller when input
 * was bad (what was wrong, what to do): formats into err[0..err_len),
 * truncating as needed. Does nothing when err is NULL or err_len is 0, so
 * a caller that does not want the sentence passes (NULL, 0). */
__attribute__((format(printf, 3, 4))) void st_set_err(char* err, size_t err_len,
                                                      const char* fmt, ...);
/* The same with a va_list, for writers that wrap it (a prefix, a log). */
__attribute__((format(printf, 3, 0))) void st_set_errv(char* err,
                                                       size_t err_len,
                                                       const char* fmt,
                                                       va_list ap);

/* ---- Descriptors over Unix sockets (fdpass.c) ---------------------------- */

/* sendmsg of p[0..n) on sock with fd (>= 0; -1: none) in SCM_RIGHTS on
 * those bytes. Returns what sendmsg returns (errno set on -1). */
ssize_t st_send_fd(int sock, const void* p, size_t n, int fd, int flags);
/* recvmsg into p[0..n) (flags | MSG_CMSG_CLOEXEC). A descriptor that came
 * with the bytes goes into *fd when *fd is -1; any other is closed, so
 * nothing leaks. Returns what recvmsg returns (errno set on -1). */
ssize_t st_recv_fd(int sock, void* p, size_t n, int* fd, int flags);

/* ---- Exact decimals (decimal.c) ----------------------------------------- */

/* Parses a decimal ("0.7", "1", ".25", "2.000") with at most 6 decimals
 * (trailing zeros beyond are allowed) into a count of millionths in
 * [0, max]. No sign, no exponent, nothing after. 0, or -EINVAL. */
int st_parse_millionths(const char* s, uint64_t max, uint64_t* out);
/* The canonical text of v millionths: no trailing zeros, no point for a
 * whole number ("0.01", "1", "2.5"). Texts that parse to the same count
 * get the same text. 0, or -ENOSPC when len is too small. */
int st_format_millionths(uint64_t v, char* buf, size_t len);

/* ---- Time (clock.c) ------------------------------------------------------ */

/* Seconds on CLOCK_MONOTONIC: for durations, rates and deadlines, never for
 * dates. */
double st_now_s(void);

/* ---- JSON (json.c) ------------------------------------------------------ */

/* A strict JSON reader and a JSON string escaper (RFC 8259), over jansson
 * (json.c). The reader serves files and local programs we did not write
 * (safetensors headers, the attach protocol, the node's own documents), so
 * it is hardened rather than complete:
 *
 * - Every read is bounds-checked against the given length; the text need
 *   not be NUL-terminated.
 * - Nesting is limited (max_depth) and so is the number of values
 *   (max_values), both checked before a tree is allocated, so a header of
 *   "[0,0,0,..." cannot make us allocate gigabytes of nodes.
 * - Strings are decoded to NUL-terminated UTF-8: escapes including \uXXXX
 *   and surrogate pairs are decoded; raw control characters, invalid UTF-8,
 *   lone surrogates and \u0000 (which a C string cannot hold) are refused.
 * - Integers (no fraction, no exponent) must lie within +-2^53, the range
 *   every JSON implementation (JavaScript, Python's float) agrees on; other
 *   numbers are kept as doubles with is_int = 0.
 * - Duplicate keys in an object are refused (RFC 8259 leaves them
 *   undefined; a checkpoint with two "w0" entries is corrupt).
 * - Error messages say what is wrong first ("unexpected end of input",
 *   "duplicate key", ...) and never carry the text's control bytes.
 *
 * The writer side is an append-only growable buffer with an escaper for
 * names and metadata values, and st_json_write_string for FILE* output
 * (the CLI's --json).
 */

/* 2^53: the largest integer up to which every double is exact. */
#define ST_JSON_MAX_INT ((int64_t) 1 << 53)

typedef enum {
  ST_JSON_NULL,
  ST_JSON_BOOL,
  ST_JSON_NUMBER,
  ST_JSON_STRING,
  ST_JSON_ARRAY,
  ST_JSON_OBJECT
} st_json_type_t;

typedef struct st_json_s st_json_t;
struct st_json_s {
  st_json_type_t type;
  bool boolean;     /* BOOL */
  bool is_int;      /* NUMBER written as an integer, |integer| <= 2^53 */
  int64_t integer;  /* NUMBER with is_int */
  double number;    /* NUMBER (also set for integers) */
  const char* str;  /* STRING: decoded UTF-8, NUL-terminated */
  size_t str_len;   /* STRING: bytes, without the NUL */
  const char* key;  /* a member of an OBJECT: its decoded key */
  size_t key_len;   /* a member of an OBJECT */
  size_t count;     /* ARRAY, OBJECT: number of children */
  st_json_t* child; /* ARRAY, OBJECT: first child, in document order */
  st_json_t* next;  /* next sibling */
};

typedef struct {
  int max_depth;     /* nesting of arrays and objects; 1 = a flat object */
  size_t max_values; /* values in the document, containers included */
} st_json_limits_t;

/* A parsed document. All nodes and strings live in its arena. */
typedef struct st_json_doc_s st_json_doc_t;

/* Parses text[0..len) as exactly one JSON value surrounded by optional
 * whitespace. On success *out owns the document (free with
 * st_json_free) and returns 0. On failure returns -EBADMSG (bad syntax
 * or a limit exceeded) or -ENOMEM and writes "at byte N: what" into err
 * (err may be NULL). */
int st_json_parse(const char* text, size_t len, const st_json_limits_t* limits,
                  st_json_doc_t** out, char* err, size_t err_len);
/* As st_json_parse, except that an integer beyond +-2^53 is kept as a
 * double (is_int = 0) instead of refused (and, beyond 64 bits, every
 * number of the document is read as a double, integral ones within 2^53
 * still with is_int): for our own node's documents,
 * whose large counters are read only roughly (`starling top` reading
 * `peers --json`, where an incarnation is boot epoch x 2^32). A
 * checkpoint's offsets must be exact: safetensors uses st_json_parse. */
int st_json_parse_inexact(const char* text, size_t len,
                          const st_json_limits_t* limits, st_json_doc_t** out,
                          char* err, size_t err_len);
void st_json_free(st_json_doc_t* doc);
/* The root value, borrowed from doc. */
const st_json_t* st_json_root(const st_json_doc_t* doc);

/* The member of an object with the given key, or NULL. Linear: for the
 * handful of fields of one entry, not for looking up among thousands. */
const st_json_t* st_json_get(const st_json_t* obj, const char* key);
/* A name for a type, for messages ("string", "array", ...). */
const char* st_json_type_name(st_json_type_t t);

/* 1 when s[0..len) is well-formed UTF-8 (no overlong forms, no surrogates,
 * nothing above U+10FFFF), else 0. */
int st_json_utf8_valid(const char* s, size_t len);

/* ---- Writing ----------------------------------------------------------- */

/* A growable byte buffer. After any allocation failure `failed` is set and
 * later appends are ignored, so a writer checks once at the end. p is
 * owned; free with st_json_buf_free. */
typedef struct {
  char* p;
  size_t len;
  size_t cap;
  int failed;
} st_json_buf_t;

void st_json_buf_init(st_json_buf_t* b);
void st_json_buf_free(st_json_buf_t* b);
void st_json_buf_append(st_json_buf_t* b, const char* s, size_t n);
void st_json_buf_puts(st_json_buf_t* b, const char* s);
void st_json_buf_u64(st_json_buf_t* b, uint64_t v);
/* Appends s as a quoted JSON string: '"' and '\' are escaped, control
 * characters become \n, \t, ... or \u00XX, other UTF-8 passes through, and
 * a byte that is not UTF-8 becomes U+FFFD (so the output is always valid
 * JSON; a caller that must keep every byte checks st_json_utf8_valid). */
void st_json_buf_string(st_json_buf_t* b, const char* s);

/* Writes s as a quoted, escaped JSON string to f. Returns 0 or -EIO. */
int st_json_write_string(FILE* f, const char* s);

#ifdef __cplusplus
}
#endif

#endif /* STARLING_BASE_H */
