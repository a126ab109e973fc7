/* json.h: a small, strict JSON reader and a JSON string escaper (RFC 8259),
 * internal to node/. The reader exists for the safetensors header, which
 * comes from files we did not write, so it is hardened rather than
 * complete:
 *
 * - Every read is bounds-checked against the given length; the text need
 *   not be NUL-terminated.
 * - Nesting is limited (max_depth), so the recursive descent cannot blow
 *   the stack, and so is the number of values (max_values), so a header of
 *   "[0,0,0,..." cannot make us allocate gigabytes of nodes.
 * - Strings are decoded to NUL-terminated UTF-8: escapes including \uXXXX
 *   and surrogate pairs are decoded; raw control characters, invalid UTF-8,
 *   lone surrogates and \u0000 (which a C string cannot hold) are refused.
 * - Integers (no fraction, no exponent) must lie within +-2^53, the range
 *   every JSON implementation (JavaScript, Python's float) agrees on; other
 *   numbers are kept as doubles with is_int = 0.
 * - Duplicate keys in an object are refused (RFC 8259 leaves them
 *   undefined; a checkpoint with two "w0" entries is corrupt).
 *
 * The writer side is an append-only growable buffer with an escaper for
 * names and metadata values, and st__json_fput_string for FILE* output
 * (the CLI's --json).
 */
#ifndef STARLING_NODE_JSON_H
#define STARLING_NODE_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* 2^53: the largest integer up to which every double is exact. */
#define ST__JSON_MAX_INT ((int64_t) 1 << 53)

typedef enum {
  ST__JSON_NULL,
  ST__JSON_BOOL,
  ST__JSON_NUMBER,
  ST__JSON_STRING,
  ST__JSON_ARRAY,
  ST__JSON_OBJECT
} st__json_type_t;

typedef struct st__json_s st__json_t;
struct st__json_s {
  st__json_type_t type;
  bool boolean;      /* BOOL */
  bool is_int;       /* NUMBER written as an integer, |integer| <= 2^53 */
  int64_t integer;   /* NUMBER with is_int */
  double number;     /* NUMBER (also set for integers) */
  const char* str;   /* STRING: decoded UTF-8, NUL-terminated */
  size_t str_len;    /* STRING: bytes, without the NUL */
  const char* key;   /* a member of an OBJECT: its decoded key */
  size_t key_len;    /* a member of an OBJECT */
  size_t count;      /* ARRAY, OBJECT: number of children */
  st__json_t* child; /* ARRAY, OBJECT: first child, in document order */
  st__json_t* next;  /* next sibling */
  size_t offset;     /* byte offset of the value in the text */
};

typedef struct {
  int max_depth;     /* nesting of arrays and objects; 1 = a flat object */
  size_t max_values; /* values in the document, containers included */
} st__json_limits_t;

/* A parsed document. All nodes and strings live in its arena. */
typedef struct st__json_doc_s st__json_doc_t;

/* Parses text[0..len) as exactly one JSON value surrounded by optional
 * whitespace. On success *out owns the document (free with
 * st__json_free) and returns 0. On failure returns -EBADMSG (bad syntax
 * or a limit exceeded) or -ENOMEM and writes "at byte N: what" into err
 * (err may be NULL). */
int st__json_parse(const char* text, size_t len,
                   const st__json_limits_t* limits, st__json_doc_t** out,
                   char* err, size_t err_len);
void st__json_free(st__json_doc_t* doc);
/* The root value, borrowed from doc. */
const st__json_t* st__json_root(const st__json_doc_t* doc);

/* The member of an object with the given key, or NULL. Linear: for the
 * handful of fields of one entry, not for looking up among thousands. */
const st__json_t* st__json_get(const st__json_t* obj, const char* key);
/* A name for a type, for messages ("string", "array", ...). */
const char* st__json_type_name(st__json_type_t t);

/* 1 when s[0..len) is well-formed UTF-8 (no overlong forms, no surrogates,
 * nothing above U+10FFFF), else 0. */
int st__json_utf8_valid(const char* s, size_t len);

/* ---- Writing ----------------------------------------------------------- */

/* A growable byte buffer. After any allocation failure `failed` is set and
 * later appends are ignored, so a writer checks once at the end. p is
 * owned; free with st__json_buf_free. */
typedef struct {
  char* p;
  size_t len;
  size_t cap;
  int failed;
} st__json_buf_t;

void st__json_buf_init(st__json_buf_t* b);
void st__json_buf_free(st__json_buf_t* b);
void st__json_buf_append(st__json_buf_t* b, const char* s, size_t n);
void st__json_buf_puts(st__json_buf_t* b, const char* s);
void st__json_buf_u64(st__json_buf_t* b, uint64_t v);
/* Appends s as a quoted JSON string: '"' and '\' are escaped, control
 * characters become \n, \t, ... or \u00XX; other bytes pass through (the
 * caller checks UTF-8 with st__json_utf8_valid first). */
void st__json_buf_string(st__json_buf_t* b, const char* s);

/* Writes s as a quoted, escaped JSON string to f. Returns 0 or -EIO. */
int st__json_fput_string(FILE* f, const char* s);

#endif /* STARLING_NODE_JSON_H */
