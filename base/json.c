/* json.c: the strict JSON reader and the string escaper of base.h
 * (RFC 8259). A recursive-descent parser whose depth is bounded by
 * limits->max_depth; nodes and decoded strings are bump-allocated from an
 * arena that is freed in one go. */
#include "base/base.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ==== Arena ============================================================== */

/* Arena blocks are 64 KiB unless one allocation needs more: large enough
 * that a header of a few thousand tensors takes a handful of mallocs. */
#define ARENA_BLOCK_BYTES (64u * 1024u)
#define ARENA_ALIGN (sizeof(void*) * 2)

typedef struct block_s {
  struct block_s* next;
  size_t used;
  size_t cap;
  /* The data follows, aligned to ARENA_ALIGN. */
} block_t;

#define BLOCK_HEADER \
  ((sizeof(block_t) + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN)

struct st_json_doc_s {
  block_t* blocks;
  st_json_t* root;
};

static void* arena_alloc(st_json_doc_t* doc, size_t n) {
  if (n > SIZE_MAX - ARENA_ALIGN - BLOCK_HEADER - ARENA_BLOCK_BYTES)
    return NULL;
  n = (n + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
  block_t* b = doc->blocks;
  if (b == NULL || b->cap - b->used < n) {
    size_t cap = n > ARENA_BLOCK_BYTES ? n : ARENA_BLOCK_BYTES;
    b = malloc(BLOCK_HEADER + cap);
    if (b == NULL)
      return NULL;
    b->cap = cap;
    b->used = 0;
    b->next = doc->blocks;
    doc->blocks = b;
  }
  void* p = (char*) b + BLOCK_HEADER + b->used;
  b->used += n;
  return p;
}

void st_json_free(st_json_doc_t* doc) {
  if (doc == NULL)
    return;
  block_t* b = doc->blocks;
  while (b != NULL) {
    block_t* next = b->next;
    free(b);
    b = next;
  }
  free(doc);
}

const st_json_t* st_json_root(const st_json_doc_t* doc) {
  return doc->root;
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

static size_t utf8_put(char* out, uint32_t cp) {
  if (cp < 0x80) {
    out[0] = (char) cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (char) (0xC0 | (cp >> 6));
    out[1] = (char) (0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (char) (0xE0 | (cp >> 12));
    out[1] = (char) (0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char) (0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (char) (0xF0 | (cp >> 18));
  out[1] = (char) (0x80 | ((cp >> 12) & 0x3F));
  out[2] = (char) (0x80 | ((cp >> 6) & 0x3F));
  out[3] = (char) (0x80 | (cp & 0x3F));
  return 4;
}

/* ==== Parser ============================================================= */

typedef struct {
  const char* s;
  size_t len;
  size_t pos;
  const st_json_limits_t* lim;
  size_t values;
  st_json_doc_t* doc;
  char* err;
  size_t err_len;
  int rc;            /* 0 until the first error */
  bool inexact_ints; /* st_json_parse_inexact: beyond 2^53 is a double */
} parser_t;

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void
fail(parser_t* p, int rc, const char* fmt, ...) {
  if (p->rc != 0)
    return; /* keep the first, most specific error */
  p->rc = rc;
  if (p->err == NULL || p->err_len == 0)
    return;
  int n = snprintf(p->err, p->err_len, "at byte %zu: ", p->pos);
  if (n < 0 || (size_t) n >= p->err_len)
    return;
  va_list ap;
  va_start(ap, fmt);
  st_set_errv(p->err + n, p->err_len - (size_t) n, fmt, ap);
  va_end(ap);
}

static void skip_ws(parser_t* p) {
  while (p->pos < p->len) {
    char c = p->s[p->pos];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
      break;
    p->pos++;
  }
}

static st_json_t* new_value(parser_t* p, st_json_type_t type) {
  if (p->values >= p->lim->max_values) {
    fail(p, -EBADMSG, "more than %zu values", p->lim->max_values);
    return NULL;
  }
  st_json_t* v = arena_alloc(p->doc, sizeof(*v));
  if (v == NULL) {
    fail(p, -ENOMEM, "out of memory");
    return NULL;
  }
  memset(v, 0, sizeof(*v));
  v->type = type;
  v->offset = p->pos;
  p->values++;
  return v;
}

static int hex4(parser_t* p, uint32_t* out) {
  if (p->len - p->pos < 4) {
    fail(p, -EBADMSG, "truncated \\u escape");
    return -1;
  }
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) {
    char c = p->s[p->pos + (size_t) i];
    unsigned d;
    if (c >= '0' && c <= '9') {
      d = (unsigned) (c - '0');
    } else if (c >= 'a' && c <= 'f') {
      d = (unsigned) (c - 'a' + 10);
    } else if (c >= 'A' && c <= 'F') {
      d = (unsigned) (c - 'A' + 10);
    } else {
      fail(p, -EBADMSG, "bad hex digit in \\u escape");
      return -1;
    }
    v = v << 4 | d;
  }
  p->pos += 4;
  *out = v;
  return 0;
}

/* Decodes the hex digits of a \u escape at p->pos (its backslash and u
 * already passed), with the low half of a surrogate pair when the first is a
 * high one, into the code point *cp; end: the closing quote. 0 or -1. */
static int unicode_escape(parser_t* p, size_t end, uint32_t* cp) {
  if (hex4(p, cp) != 0)
    return -1;
  if (*cp >= 0xDC00 && *cp <= 0xDFFF) {
    fail(p, -EBADMSG, "lone low surrogate in \\u escape");
    return -1;
  }
  if (*cp >= 0xD800 && *cp <= 0xDBFF) {
    uint32_t lo;
    if (end - p->pos < 6 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u') {
      fail(p, -EBADMSG, "high surrogate without a low one");
      return -1;
    }
    p->pos += 2;
    if (hex4(p, &lo) != 0)
      return -1;
    if (lo < 0xDC00 || lo > 0xDFFF) {
      fail(p, -EBADMSG, "high surrogate without a low one");
      return -1;
    }
    *cp = 0x10000 + ((*cp - 0xD800) << 10) + (lo - 0xDC00);
  }
  if (*cp == 0) {
    fail(p, -EBADMSG, "\\u0000 is not allowed in strings");
    return -1;
  }
  return 0;
}

/* Decodes the string whose opening quote is at p->pos into the arena. The
 * decoded form is never longer than the source (an escape of 2, 6 or 12
 * bytes yields at most 1, 3 or 4), so the source length bounds the
 * allocation. */
static const char* parse_string(parser_t* p, size_t* out_len) {
  p->pos++; /* the opening quote */
  size_t end = p->pos;
  while (end < p->len && p->s[end] != '"')
    end += p->s[end] == '\\' ? 2 : 1;
  if (end >= p->len) {
    fail(p, -EBADMSG, "unterminated string");
    return NULL;
  }
  char* out = arena_alloc(p->doc, end - p->pos + 1);
  if (out == NULL) {
    fail(p, -ENOMEM, "out of memory");
    return NULL;
  }
  size_t n = 0;
  while (p->pos < end) {
    unsigned char c = (unsigned char) p->s[p->pos];
    if (c < 0x20) {
      fail(p, -EBADMSG, "raw control character 0x%02x in string", c);
      return NULL;
    }
    if (c >= 0x80) {
      size_t k = utf8_seq((const unsigned char*) p->s + p->pos, end - p->pos);
      if (k == 0) {
        fail(p, -EBADMSG, "invalid UTF-8 in string");
        return NULL;
      }
      memcpy(out + n, p->s + p->pos, k);
      n += k;
      p->pos += k;
      continue;
    }
    if (c != '\\') {
      out[n++] = (char) c;
      p->pos++;
      continue;
    }
    char e = p->s[p->pos + 1]; /* in bounds: the scan above stopped at end */
    p->pos += 2;
    /* The one-character escapes and what they stand for. */
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    const char* simple = e != '\0' ? strchr(from, e) : NULL;
    if (simple != NULL) {
      out[n++] = to[simple - from];
      continue;
    }
    if (e != 'u') {
      p->pos -= 1;
      fail(p, -EBADMSG, "bad escape in string");
      return NULL;
    }
    uint32_t cp;
    if (unicode_escape(p, end, &cp) != 0)
      return NULL;
    n += utf8_put(out + n, cp);
  }
  p->pos = end + 1; /* the closing quote */
  out[n] = '\0';
  *out_len = n;
  return out;
}

static int is_digit(char c) {
  return c >= '0' && c <= '9';
}

static st_json_t* parse_number(parser_t* p) {
  st_json_t* v = new_value(p, ST_JSON_NUMBER);
  if (v == NULL)
    return NULL;
  size_t start = p->pos;
  int neg = 0;
  if (p->s[p->pos] == '-') {
    neg = 1;
    p->pos++;
  }
  if (p->pos >= p->len || !is_digit(p->s[p->pos])) {
    fail(p, -EBADMSG, "bad number");
    return NULL;
  }
  /* The integer part, capped at 2^53 as it is read so it cannot overflow;
   * a leading zero must stand alone. */
  uint64_t mag = 0;
  int too_big = 0;
  if (p->s[p->pos] == '0') {
    p->pos++;
  } else {
    while (p->pos < p->len && is_digit(p->s[p->pos])) {
      mag = mag * 10 + (uint64_t) (p->s[p->pos] - '0');
      if (mag > (uint64_t) ST_JSON_MAX_INT) {
        too_big = 1;
        mag = (uint64_t) ST_JSON_MAX_INT + 1;
      }
      p->pos++;
    }
  }
  int is_int = 1;
  if (p->pos < p->len && p->s[p->pos] == '.') {
    is_int = 0;
    p->pos++;
    if (p->pos >= p->len || !is_digit(p->s[p->pos])) {
      fail(p, -EBADMSG, "bad number: no digits after '.'");
      return NULL;
    }
    while (p->pos < p->len && is_digit(p->s[p->pos]))
      p->pos++;
  }
  if (p->pos < p->len && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
    is_int = 0;
    p->pos++;
    if (p->pos < p->len && (p->s[p->pos] == '+' || p->s[p->pos] == '-'))
      p->pos++;
    if (p->pos >= p->len || !is_digit(p->s[p->pos])) {
      fail(p, -EBADMSG, "bad number: no digits in exponent");
      return NULL;
    }
    while (p->pos < p->len && is_digit(p->s[p->pos]))
      p->pos++;
  }
  if (too_big && p->inexact_ints)
    is_int = 0; /* read by strtod below, as a double */
  if (is_int) {
    if (too_big) {
      p->pos = start;
      fail(p, -EBADMSG, "integer out of range (beyond 2^53)");
      return NULL;
    }
    v->is_int = true;
    v->integer = neg ? -(int64_t) mag : (int64_t) mag;
    v->number = (double) v->integer;
    return v;
  }
  /* strtod needs a NUL-terminated copy; the token is bounded by len. */
  size_t n = p->pos - start;
  char* tmp = malloc(n + 1);
  if (tmp == NULL) {
    fail(p, -ENOMEM, "out of memory");
    return NULL;
  }
  memcpy(tmp, p->s + start, n);
  tmp[n] = '\0';
  v->number = strtod(tmp, NULL);
  free(tmp);
  return v;
}

static int key_cmp(const void* a, const void* b) {
  const st_json_t* x = *(const st_json_t* const*) a;
  const st_json_t* y = *(const st_json_t* const*) b;
  return strcmp(x->key, y->key);
}

/* Refuses an object with two equal keys: pairwise for small objects,
 * sorted for large ones, so that a header with 10^5 tensors stays
 * O(n log n). */
static int check_duplicates(parser_t* p, const st_json_t* obj) {
  if (obj->count < 2)
    return 0;
  const st_json_t* dup = NULL;
  if (obj->count <= 16) {
    for (const st_json_t* a = obj->child; a && !dup; a = a->next)
      for (const st_json_t* b = a->next; b && !dup; b = b->next)
        if (strcmp(a->key, b->key) == 0)
          dup = b;
  } else {
    const st_json_t** v = malloc(obj->count * sizeof(*v));
    if (v == NULL) {
      fail(p, -ENOMEM, "out of memory");
      return -1;
    }
    size_t i = 0;
    for (const st_json_t* a = obj->child; a; a = a->next)
      v[i++] = a;
    qsort(v, obj->count, sizeof(*v), key_cmp);
    for (i = 1; i < obj->count && !dup; i++)
      if (strcmp(v[i - 1]->key, v[i]->key) == 0)
        dup = v[i];
    free(v);
  }
  if (dup == NULL)
    return 0;
  p->pos = dup->offset;
  fail(p, -EBADMSG, "duplicate key \"%.64s\"", dup->key);
  return -1;
}

static st_json_t* parse_value(parser_t* p, int depth);

/* Parses an array or an object; the opening bracket is at p->pos. */
static st_json_t* parse_container(parser_t* p, int depth, int is_obj) {
  if (depth >= p->lim->max_depth) {
    fail(p, -EBADMSG, "nesting deeper than %d", p->lim->max_depth);
    return NULL;
  }
  st_json_t* c = new_value(p, is_obj ? ST_JSON_OBJECT : ST_JSON_ARRAY);
  if (c == NULL)
    return NULL;
  char close = is_obj ? '}' : ']';
  st_json_t** tail = &c->child;
  p->pos++;
  skip_ws(p);
  if (p->pos < p->len && p->s[p->pos] == close) {
    p->pos++;
    return c;
  }
  for (;;) {
    const char* key = NULL;
    size_t key_len = 0;
    if (is_obj) {
      skip_ws(p);
      if (p->pos >= p->len || p->s[p->pos] != '"') {
        fail(p, -EBADMSG,
             p->pos >= p->len ? "unexpected end of input"
                              : "expected a string key");
        return NULL;
      }
      key = parse_string(p, &key_len);
      if (key == NULL)
        return NULL;
      skip_ws(p);
      if (p->pos >= p->len || p->s[p->pos] != ':') {
        fail(p, -EBADMSG, "expected ':' after key");
        return NULL;
      }
      p->pos++;
    }
    st_json_t* v = parse_value(p, depth + 1);
    if (v == NULL)
      return NULL;
    v->key = key;
    v->key_len = key_len;
    *tail = v;
    tail = &v->next;
    c->count++;
    skip_ws(p);
    if (p->pos >= p->len) {
      fail(p, -EBADMSG, "unexpected end of input");
      return NULL;
    }
    char ch = p->s[p->pos++];
    if (ch == close)
      break;
    if (ch != ',') {
      p->pos--;
      fail(p, -EBADMSG, "expected ',' or '%c'", close);
      return NULL;
    }
  }
  if (is_obj && check_duplicates(p, c) != 0)
    return NULL;
  return c;
}

static st_json_t* parse_literal(parser_t* p, const char* word,
                                st_json_type_t type, bool b) {
  size_t n = strlen(word);
  if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0) {
    fail(p, -EBADMSG, "unexpected character");
    return NULL;
  }
  st_json_t* v = new_value(p, type);
  if (v == NULL)
    return NULL;
  v->boolean = b;
  p->pos += n;
  return v;
}

/* depth counts the containers around the value. */
static st_json_t* parse_value(parser_t* p, int depth) {
  skip_ws(p);
  if (p->pos >= p->len) {
    fail(p, -EBADMSG, "unexpected end of input");
    return NULL;
  }
  char c = p->s[p->pos];
  switch (c) {
    case '{':
      return parse_container(p, depth, 1);
    case '[':
      return parse_container(p, depth, 0);
    case '"': {
      st_json_t* v = new_value(p, ST_JSON_STRING);
      if (v == NULL)
        return NULL;
      v->str = parse_string(p, &v->str_len);
      return v->str == NULL ? NULL : v;
    }
    case 't':
      return parse_literal(p, "true", ST_JSON_BOOL, true);
    case 'f':
      return parse_literal(p, "false", ST_JSON_BOOL, false);
    case 'n':
      return parse_literal(p, "null", ST_JSON_NULL, false);
    default:
      if (c == '-' || is_digit(c))
        return parse_number(p);
      fail(p, -EBADMSG, "unexpected character 0x%02x",
           (unsigned) (unsigned char) c);
      return NULL;
  }
}

static int parse(const char* text, size_t len, const st_json_limits_t* limits,
                 bool inexact_ints, st_json_doc_t** out, char* err,
                 size_t err_len) {
  *out = NULL;
  if (err != NULL && err_len > 0)
    err[0] = '\0';
  st_json_doc_t* doc = calloc(1, sizeof(*doc));
  if (doc == NULL)
    return -ENOMEM;
  parser_t p = {.s = text,
                .len = len,
                .lim = limits,
                .doc = doc,
                .err = err,
                .err_len = err_len,
                .inexact_ints = inexact_ints};
  doc->root = parse_value(&p, 0);
  if (doc->root != NULL) {
    skip_ws(&p);
    if (p.pos != p.len)
      fail(&p, -EBADMSG, "trailing characters after JSON");
  }
  if (p.rc != 0) {
    st_json_free(doc);
    return p.rc;
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

/* Calls emit with runs of s, its escapes in between, quotes around. */
static void escape(const char* s, void (*emit)(void*, const char*, size_t),
                   void* ctx) {
  emit(ctx, "\"", 1);
  size_t run = 0;
  for (size_t i = 0;; i++) {
    unsigned char c = (unsigned char) s[i];
    if (c != '\0' && c >= 0x20 && c != '"' && c != '\\')
      continue;
    if (i > run)
      emit(ctx, s + run, i - run);
    if (c == '\0')
      break;
    run = i + 1;
    char esc[8];
    static const char raw[] = "\"\\\b\f\n\r\t", named[] = "\"\\bfnrt";
    const char* sc = strchr(raw, (int) c);
    if (sc != NULL) {
      esc[0] = '\\';
      esc[1] = named[sc - raw];
      esc[2] = '\0';
    } else {
      snprintf(esc, sizeof(esc), "\\u%04x", (unsigned) c);
    }
    emit(ctx, esc, strlen(esc));
  }
  emit(ctx, "\"", 1);
}

static void emit_buf(void* ctx, const char* s, size_t n) {
  st_json_buf_append(ctx, s, n);
}

void st_json_buf_string(st_json_buf_t* b, const char* s) {
  escape(s, emit_buf, b);
}

typedef struct {
  FILE* f;
  int failed;
} file_sink_t;

static void emit_file(void* ctx, const char* s, size_t n) {
  file_sink_t* fs = ctx;
  if (!fs->failed && fwrite(s, 1, n, fs->f) != n)
    fs->failed = 1;
}

int st_json_write_string(FILE* f, const char* s) {
  file_sink_t fs = {f, 0};
  escape(s, emit_file, &fs);
  return fs.failed ? -EIO : 0;
}
