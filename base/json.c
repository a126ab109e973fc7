/* json.c: base.h's JSON reader and string escaper, over jansson (Debian's
 * libjansson). jansson does the syntax (RFC 8259), the escapes, UTF-8, the
 * refusal of \u0000 and of duplicate keys; this file adds what base.h's
 * readers promise on top of it:
 *
 * - the limits, checked before jansson allocates anything: one pass over
 *   the text counts nesting and commas outside strings (every comma
 *   introduces a value, so more commas than max_values means too many
 *   values), and the exact count is checked again on the tree;
 * - integers exact within +-2^53 (st_json_parse refuses beyond,
 *   st_json_parse_inexact keeps a double);
 * - error messages that name what is wrong first and never echo raw
 *   control bytes from the text;
 * - the st_json_t view: one array of nodes whose strings point into
 *   jansson's tree, both freed with the document.
 *
 * The escaper hands each string to jansson's encoder; bytes that are not
 * UTF-8 become U+FFFD, so output is always valid JSON. */
#include "base/base.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

struct st_json_doc_s {
  json_t* tree;     /* jansson's document: owns every string */
  st_json_t* nodes; /* nodes[0] is the root */
  size_t count;
};

void st_json_free(st_json_doc_t* doc) {
  if (doc == NULL)
    return;
  json_decref(doc->tree);
  free(doc->nodes);
  free(doc);
}

const st_json_t* st_json_root(const st_json_doc_t* doc) {
  return &doc->nodes[0];
}

/* ==== UTF-8 ============================================================== */

/* Length of the well-formed UTF-8 sequence at s[0..len) (Unicode 15, table
 * 3-7), or 0 when it is not one. */
static size_t utf8_seq(const unsigned char* s, size_t len) {
  unsigned c = s[0];
  if (c < 0x80)
    return 1;
  size_t n;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0)
      lo = 0xA0; /* no overlong forms */
    if (c == 0xED)
      hi = 0x9F; /* no surrogates */
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0)
      lo = 0x90; /* no overlong forms */
    if (c == 0xF4)
      hi = 0x8F; /* nothing above U+10FFFF */
  } else {
    return 0;
  }
  if (len < n)
    return 0;
  if (s[1] < lo || s[1] > hi)
    return 0;
  for (size_t i = 2; i < n; i++)
    if (s[i] < 0x80 || s[i] > 0xBF)
      return 0;
  return n;
}

int st_json_utf8_valid(const char* s, size_t len) {
  const unsigned char* u = (const unsigned char*) s;
  size_t i = 0;
  while (i < len) {
    size_t n = utf8_seq(u + i, len - i);
    if (n == 0)
      return 0;
    i += n;
  }
  return 1;
}

/* ==== Reading ============================================================ */

static void fail(char* err, size_t err_len, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail(char* err, size_t err_len, const char* fmt, ...) {
  if (err == NULL || err_len == 0)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, err_len, fmt, ap);
  va_end(ap);
  /* jansson quotes the text near an error: keep control bytes out. */
  for (char* c = err; *c != '\0'; c++)
    if ((unsigned char) *c < 0x20 || *c == 0x7f)
      *c = '?';
}

/* Refuses, before jansson allocates, a text nested deeper than the limit
 * or with more commas (outside strings) than values allowed. */
static int prescan(const char* s, size_t len, const st_json_limits_t* lim,
                   char* err, size_t err_len) {
  size_t commas = 0;
  int depth = 0;
  bool in_str = false;
  for (size_t i = 0; i < len; i++) {
    char c = s[i];
    if (in_str) {
      if (c == '\\')
        i++;
      else if (c == '"')
        in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else if (c == '[' || c == '{') {
      if (++depth > lim->max_depth) {
        fail(err, err_len, "at byte %zu: nesting deeper than %d", i,
             lim->max_depth);
        return -EBADMSG;
      }
    } else if (c == ']' || c == '}') {
      depth--;
    } else if (c == ',' && ++commas >= lim->max_values) {
      fail(err, err_len, "at byte %zu: more than %zu values", i,
           lim->max_values);
      return -EBADMSG;
    }
  }
  return 0;
}

/* What a jansson error code means, in the words base.h's callers use. */
static const char* error_kind(enum json_error_code code) {
  switch (code) {
    case json_error_premature_end_of_input:
      return "unexpected end of input";
    case json_error_end_of_input_expected:
      return "trailing characters after JSON";
    case json_error_invalid_utf8:
      return "invalid UTF-8";
    case json_error_null_character:
    case json_error_null_byte_in_key:
      return "\\u0000 is not allowed";
    case json_error_duplicate_key:
      return "duplicate key";
    case json_error_numeric_overflow:
      return "number out of range";
    case json_error_stack_overflow:
      return "nesting too deep";
    case json_error_out_of_memory:
      return "out of memory";
    default:
      return "not valid JSON";
  }
}

typedef struct {
  st_json_doc_t* doc;
  const st_json_limits_t* lim;
  bool inexact_ints;
  char* err;
  size_t err_len;
} reader_t;

/* Counts the values of the tree (depth and count within the limits). */
static int count_values(reader_t* r, json_t* j, int depth, size_t* n) {
  if (++*n > r->lim->max_values) {
    fail(r->err, r->err_len, "more than %zu values", r->lim->max_values);
    return -EBADMSG;
  }
  if (!json_is_array(j) && !json_is_object(j))
    return 0;
  if (depth + 1 > r->lim->max_depth) {
    fail(r->err, r->err_len, "nesting deeper than %d", r->lim->max_depth);
    return -EBADMSG;
  }
  if (json_is_array(j)) {
    size_t i;
    json_t* v;
    json_array_foreach(j, i, v) {
      if (count_values(r, v, depth + 1, n) != 0)
        return -EBADMSG;
    }
  } else {
    const char* k;
    json_t* v;
    json_object_foreach(j, k, v) {
      if (count_values(r, v, depth + 1, n) != 0)
        return -EBADMSG;
    }
  }
  return 0;
}

static int set_number(reader_t* r, json_t* j, st_json_t* v) {
  v->type = ST_JSON_NUMBER;
  v->number = json_number_value(j);
  if (json_is_integer(j)) {
    json_int_t x = json_integer_value(j);
    if (x >= -ST_JSON_MAX_INT && x <= ST_JSON_MAX_INT) {
      v->is_int = true;
      v->integer = (int64_t) x;
    } else if (!r->inexact_ints) {
      fail(r->err, r->err_len, "integer out of range: %lld is beyond 2^53",
           (long long) x);
      return -EBADMSG;
    }
  } else if (r->inexact_ints && v->number == (double) (int64_t) v->number &&
             v->number >= (double) -ST_JSON_MAX_INT &&
             v->number <= (double) ST_JSON_MAX_INT) {
    /* Read with JSON_DECODE_INT_AS_REAL: an integer within 2^53. */
    v->is_int = true;
    v->integer = (int64_t) v->number;
  }
  return 0;
}

/* Fills nodes[*next] from j and its children, in document order. */
static int fill(reader_t* r, json_t* j, size_t* next, st_json_t** out) {
  st_json_t* v = &r->doc->nodes[(*next)++];
  *out = v;
  switch (json_typeof(j)) {
    case JSON_NULL:
      v->type = ST_JSON_NULL;
      return 0;
    case JSON_TRUE:
    case JSON_FALSE:
      v->type = ST_JSON_BOOL;
      v->boolean = json_is_true(j);
      return 0;
    case JSON_INTEGER:
    case JSON_REAL:
      return set_number(r, j, v);
    case JSON_STRING:
      v->type = ST_JSON_STRING;
      v->str = json_string_value(j);
      v->str_len = json_string_length(j);
      return 0;
    default:
      break;
  }
  st_json_t** link = &v->child;
  if (json_is_array(j)) {
    v->type = ST_JSON_ARRAY;
    size_t i;
    json_t* c;
    json_array_foreach(j, i, c) {
      if (fill(r, c, next, link) != 0)
        return -EBADMSG;
      link = &(*link)->next;
      v->count++;
    }
    return 0;
  }
  v->type = ST_JSON_OBJECT;
  const char* k;
  json_t* c;
  json_object_foreach(j, k, c) {
    if (fill(r, c, next, link) != 0)
      return -EBADMSG;
    (*link)->key = k;
    (*link)->key_len = strlen(k);
    link = &(*link)->next;
    v->count++;
  }
  return 0;
}

/* jansson's tree for text, or NULL with err written. An integer beyond
 * jansson's 64 bits is refused, except that an inexact read takes every
 * number as a double then. */
static json_t* load(const char* text, size_t len, bool inexact_ints, char* err,
                    size_t err_len) {
  const size_t flags = JSON_DECODE_ANY | JSON_REJECT_DUPLICATES;
  json_error_t e;
  json_t* tree = json_loadb(text, len, flags, &e);
  if (tree == NULL && inexact_ints &&
      json_error_code(&e) == json_error_numeric_overflow)
    tree = json_loadb(text, len, flags | JSON_DECODE_INT_AS_REAL, &e);
  if (tree == NULL)
    fail(err, err_len, "at byte %d: %s (%s)", e.position,
         error_kind(json_error_code(&e)), e.text);
  return tree;
}

static int parse(const char* text, size_t len, const st_json_limits_t* limits,
                 bool inexact_ints, st_json_doc_t** out, char* err,
                 size_t err_len) {
  *out = NULL;
  if (err != NULL && err_len > 0)
    err[0] = '\0';
  int rc = prescan(text, len, limits, err, err_len);
  if (rc != 0)
    return rc;
  st_json_doc_t* doc = calloc(1, sizeof(*doc));
  if (doc == NULL)
    return -ENOMEM;
  reader_t r = {doc, limits, inexact_ints, err, err_len};
  doc->tree = load(text, len, inexact_ints, err, err_len);
  rc = doc->tree == NULL ? -EBADMSG
                         : count_values(&r, doc->tree, 0, &doc->count);
  if (rc == 0) {
    doc->nodes = calloc(doc->count, sizeof(*doc->nodes));
    rc = doc->nodes == NULL ? -ENOMEM : 0;
  }
  size_t next = 0;
  st_json_t* root;
  if (rc == 0)
    rc = fill(&r, doc->tree, &next, &root);
  if (rc != 0) {
    st_json_free(doc);
    return rc;
  }
  *out = doc;
  return 0;
}

int st_json_parse(const char* text, size_t len, const st_json_limits_t* limits,
                  st_json_doc_t** out, char* err, size_t err_len) {
  return parse(text, len, limits, false, out, err, err_len);
}

int st_json_parse_inexact(const char* text, size_t len,
                          const st_json_limits_t* limits, st_json_doc_t** out,
                          char* err, size_t err_len) {
  return parse(text, len, limits, true, out, err, err_len);
}

const st_json_t* st_json_get(const st_json_t* obj, const char* key) {
  if (obj == NULL || obj->type != ST_JSON_OBJECT)
    return NULL;
  for (const st_json_t* m = obj->child; m != NULL; m = m->next)
    if (strcmp(m->key, key) == 0)
      return m;
  return NULL;
}

const char* st_json_type_name(st_json_type_t t) {
  static const char* const names[] = {"null",   "boolean", "number",
                                      "string", "array",   "object"};
  return (unsigned) t < 6 ? names[t] : "?";
}

/* ==== Writing ============================================================ */

void st_json_buf_init(st_json_buf_t* b) {
  memset(b, 0, sizeof(*b));
}

void st_json_buf_free(st_json_buf_t* b) {
  free(b->p);
  memset(b, 0, sizeof(*b));
}

void st_json_buf_append(st_json_buf_t* b, const char* s, size_t n) {
  if (b->failed)
    return;
  if (b->cap - b->len < n + 1) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < n + 1) {
      if (cap > SIZE_MAX / 2) {
        b->failed = 1;
        return;
      }
      cap *= 2;
    }
    char* p = realloc(b->p, cap);
    if (p == NULL) {
      b->failed = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

void st_json_buf_puts(st_json_buf_t* b, const char* s) {
  st_json_buf_append(b, s, strlen(s));
}

void st_json_buf_u64(st_json_buf_t* b, uint64_t v) {
  char tmp[24];
  int n = snprintf(tmp, sizeof(tmp), "%llu", (unsigned long long) v);
  st_json_buf_append(b, tmp, (size_t) n);
}

/* A copy of s[0..len) with every byte that does not start a well-formed
 * UTF-8 sequence replaced by U+FFFD (3 bytes), or NULL. */
static char* utf8_repair(const char* s, size_t len, size_t* out_len) {
  if (len > (SIZE_MAX - 1) / 3)
    return NULL;
  char* out = malloc(len * 3 + 1);
  if (out == NULL)
    return NULL;
  size_t o = 0;
  for (size_t i = 0; i < len;) {
    size_t n = utf8_seq((const unsigned char*) s + i, len - i);
    if (n == 0) {
      memcpy(out + o, "\xef\xbf\xbd", 3);
      o += 3;
      i++;
    } else {
      memcpy(out + o, s + i, n);
      o += n;
      i += n;
    }
  }
  *out_len = o;
  return out;
}

/* Encodes s as one JSON string through jansson, into sink. */
static int encode(const char* s, json_dump_callback_t sink, void* ctx) {
  size_t len = strlen(s), fixed_len = len;
  char* fixed = NULL;
  if (!st_json_utf8_valid(s, len)) {
    fixed = utf8_repair(s, len, &fixed_len);
    if (fixed == NULL)
      return -1;
  }
  json_t* j = json_stringn_nocheck(fixed ? fixed : s, fixed_len);
  int rc = j == NULL ? -1 : json_dump_callback(j, sink, ctx, JSON_ENCODE_ANY);
  json_decref(j);
  free(fixed);
  return rc;
}

static int sink_buf(const char* s, size_t n, void* ctx) {
  st_json_buf_t* b = ctx;
  st_json_buf_append(b, s, n);
  return b->failed ? -1 : 0;
}

void st_json_buf_string(st_json_buf_t* b, const char* s) {
  if (encode(s, sink_buf, b) != 0)
    b->failed = 1;
}

static int sink_file(const char* s, size_t n, void* ctx) {
  return fwrite(s, 1, n, ctx) == n ? 0 : -1;
}

int st_json_write_string(FILE* f, const char* s) {
  return encode(s, sink_file, f) == 0 ? 0 : -EIO;
}
