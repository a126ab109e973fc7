/* attach.c: the sans-IO half of the attach protocol (attach/attach.h,
 * docs/attach.md) that is not JSON: the segment's sizes and header check,
 * and the tensor list (its checks, the sentence naming the first
 * difference between two lists, a short description, and the canonical
 * text hashed into the model fingerprint). The request and reply frames
 * are in attach_json.c.
 *
 * The tensor list is read from another process (the node decodes the
 * program's list; the program reads nothing of the node's but its reply),
 * so every check here is written for hostile input: names are checked
 * before they are printed, and counts before they are multiplied.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attach/attach.h"
#include "attach/attach_internal.h"
#include "base/base.h"

/* ---- Sizes --------------------------------------------------------------- */

uint64_t st_attach_area_bytes(uint64_t n_floats) {
  /* Saturates instead of wrapping for counts no check would let through,
   * so that a caller comparing sizes never sees a small wrong one. */
  if (n_floats > (UINT64_MAX - ST_ATTACH_PAGE) / 4)
    return UINT64_MAX;
  uint64_t bytes = n_floats * 4;
  return (bytes + ST_ATTACH_PAGE - 1) / ST_ATTACH_PAGE * ST_ATTACH_PAGE;
}

uint64_t st_attach_segment_bytes(uint64_t n_floats) {
  uint64_t area = st_attach_area_bytes(n_floats);
  if (area > (UINT64_MAX - ST_ATTACH_PAGE) / 2)
    return UINT64_MAX;
  return ST_ATTACH_PAGE + 2 * area;
}

int st_attach_check_header(const st_attach_header_t* h, uint64_t file_bytes,
                           uint64_t n_floats, char* err, size_t err_len) {
  /* The other process may still write the header: each field is read once
   * into a local, and only the locals are checked and reported. */
  uint32_t magic = h->magic, version = h->version;
  uint64_t hn = h->n_floats, hbytes = h->segment_bytes;
  uint64_t want = st_attach_segment_bytes(n_floats);
  if (magic != ST_ATTACH_MAGIC) {
    st_set_err(err, err_len,
               "the shared segment starts with 0x%08" PRIx32
               ", not the attach magic 0x%08x: it is not a starling attach "
               "segment",
               magic, ST_ATTACH_MAGIC);
    return -EPROTO;
  }
  if (version != ST_ATTACH_VERSION) {
    st_set_err(err, err_len,
               "version: the shared segment is attach protocol version "
               "%" PRIu32
               " and this side speaks version %u; use a client "
               "library and a node of the same starling release",
               version, ST_ATTACH_VERSION);
    return -EPROTO;
  }
  if (n_floats > ST_ATTACH_MAX_FLOATS) {
    st_set_err(err, err_len,
               "the shared segment is for %" PRIu64
               " floats, more than the 2^34 a model may hold",
               n_floats);
    return -EINVAL;
  }
  if (hn != n_floats) {
    st_set_err(err, err_len,
               "the shared segment's header says %" PRIu64
               " floats but the tensor list holds %" PRIu64,
               hn, n_floats);
    return -EINVAL;
  }
  if (hbytes != want || file_bytes != want) {
    st_set_err(err, err_len,
               "the shared segment is %" PRIu64
               " bytes (its header says %" PRIu64 ") but %" PRIu64
               " floats need %" PRIu64 " bytes",
               file_bytes, hbytes, n_floats, want);
    return -EINVAL;
  }
  return 0;
}

/* ---- The tensor list ------------------------------------------------------
 */

void st_attach_model_free(st_attach_model_t* m) {
  if (m == NULL)
    return;
  free(m->t);
  memset(m, 0, sizeof(*m));
}

/* A control character: C0, DEL, or C1 (U+0080..U+009F, 0xC2 0x80..0x9F in
 * UTF-8; s is already known to be valid UTF-8). Returns its byte offset or
 * -1. */
static long find_control(const char* s, size_t len) {
  const unsigned char* u = (const unsigned char*) s;
  for (size_t i = 0; i < len; i++) {
    if (u[i] < 0x20 || u[i] == 0x7f)
      return (long) i;
    if (u[i] == 0xc2 && i + 1 < len && u[i + 1] >= 0x80 && u[i + 1] <= 0x9f)
      return (long) i;
  }
  return -1;
}

static int check_name(const char* name, size_t idx, char* err, size_t err_len) {
  if (name == NULL || name[0] == '\0') {
    st_set_err(err, err_len,
               "tensor %zu has an empty name; give every tensor a name", idx);
    return -EINVAL;
  }
  size_t len = strnlen(name, ST_ATTACH_NAME_MAX + 1);
  if (len > ST_ATTACH_NAME_MAX) {
    st_set_err(err, err_len,
               "tensor %zu: its name is longer than %d bytes; shorten it", idx,
               ST_ATTACH_NAME_MAX);
    return -EINVAL;
  }
  if (!st_json_utf8_valid(name, len)) {
    st_set_err(err, err_len,
               "tensor %zu: its name is not valid UTF-8; use UTF-8 names", idx);
    return -EINVAL;
  }
  long at = find_control(name, len);
  if (at >= 0) {
    st_set_err(err, err_len,
               "tensor %zu: its name holds a control character at byte %ld; "
               "use printable names",
               idx, at);
    return -EINVAL;
  }
  return 0;
}

/* Copies at most out_len - 1 bytes of s, control bytes as '?', for
 * echoing a string the other side sent that failed a check. */
void st__attach_printable(const char* s, char* out, size_t out_len) {
  if (out_len == 0)
    return;
  size_t i = 0;
  for (; s != NULL && s[i] != '\0' && i + 1 < out_len; i++) {
    unsigned char c = (unsigned char) s[i];
    out[i] = c < 0x20 || c == 0x7f ? '?' : (char) c;
  }
  out[i] = '\0';
}

static int check_dtype(const char* dtype, const char* name, char* err,
                       size_t err_len) {
  if (dtype != NULL && strcmp(dtype, "F32") == 0)
    return 0;
  char shown[16];
  st__attach_printable(dtype != NULL ? dtype : "(none)", shown, sizeof shown);
  st_set_err(err, err_len,
             "tensor '%s': dtype '%s' is not supported; only F32 (float32) "
             "tensors are averaged",
             name, shown);
  return -EINVAL;
}

/* The element count of a checked shape, or an error naming the tensor. */
static int count_elems(const char* name, int ndim, const uint64_t* shape,
                       uint64_t* out, char* err, size_t err_len) {
  if (ndim < 0 || ndim > ST_ATTACH_MAX_DIMS) {
    st_set_err(err, err_len,
               "tensor '%s' has %d dimensions; give 0 (a scalar) to %d", name,
               ndim, ST_ATTACH_MAX_DIMS);
    return -EINVAL;
  }
  uint64_t n = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] == 0) {
      st_set_err(err, err_len,
                 "tensor '%s': dimension %d is 0; every dimension must be at "
                 "least 1 (leave empty tensors out of the list)",
                 name, d);
      return -EINVAL;
    }
    if (shape[d] > ST_ATTACH_MAX_FLOATS / n) {
      st_set_err(err, err_len,
                 "tensor '%s' has more than 2^34 elements, the most a model "
                 "may hold (64 GiB of float32)",
                 name);
      return -EINVAL;
    }
    n *= shape[d];
  }
  *out = n;
  return 0;
}

/* Grows m->t for one more entry: the capacity is implied by n (8, then
 * doubling), so the struct needs no field for it. */
static int grow(st_attach_model_t* m) {
  size_t n = m->n;
  if (n != 0 && (n < 8 || (n & (n - 1)) != 0))
    return 0;
  size_t cap = n == 0 ? 8 : n * 2;
  st_attach_tensor_t* t = realloc(m->t, cap * sizeof(*t));
  if (t == NULL)
    return -ENOMEM;
  m->t = t;
  return 0;
}

int st__attach_model_append(st_attach_model_t* m, const char* name,
                            const char* dtype, int ndim, const uint64_t* shape,
                            char* err, size_t err_len) {
  if (m->n >= ST_ATTACH_MAX_TENSORS) {
    st_set_err(err, err_len,
               "more than %u tensors; register the parameters in fewer "
               "tensors (concatenate small ones)",
               ST_ATTACH_MAX_TENSORS);
    return -EINVAL;
  }
  int rc = check_name(name, m->n, err, err_len);
  if (rc == 0)
    rc = check_dtype(dtype, name, err, err_len);
  uint64_t n_elems = 0;
  if (rc == 0)
    rc = count_elems(name, ndim, shape, &n_elems, err, err_len);
  if (rc != 0)
    return rc;
  if (n_elems > ST_ATTACH_MAX_FLOATS - m->n_floats) {
    st_set_err(err, err_len,
               "the tensors up to '%s' hold more than 2^34 floats in all, "
               "the most a model may hold (64 GiB of float32)",
               name);
    return -EINVAL;
  }
  if (grow(m) != 0) {
    st_set_err(err, err_len, "out of memory for the tensor list");
    return -ENOMEM;
  }
  st_attach_tensor_t* t = &m->t[m->n];
  memset(t, 0, sizeof(*t));
  memcpy(t->name, name, strlen(name) + 1);
  memcpy(t->dtype, "F32", 4);
  t->ndim = ndim;
  for (int d = 0; d < ndim; d++)
    t->shape[d] = shape[d];
  t->n_elems = n_elems;
  t->offset = m->n_floats;
  m->n_floats += n_elems;
  m->n++;
  return 0;
}

int st_attach_model_add(st_attach_model_t* m, const char* name,
                        const char* dtype, int ndim, const uint64_t* shape,
                        char* err, size_t err_len) {
  /* Linear: a program registers tens to thousands of tensors once. The
   * node's decoder checks a whole list at once by sorting
   * (st__attach_model_unique), since it reads lists it did not write. */
  if (name != NULL && check_name(name, m->n, NULL, 0) == 0) {
    for (size_t i = 0; i < m->n; i++) {
      if (strcmp(m->t[i].name, name) == 0) {
        st_set_err(err, err_len,
                   "tensor %zu: '%s' is already tensor %zu; every name must "
                   "be unique",
                   m->n, name, i);
        return -EINVAL;
      }
    }
  }
  return st__attach_model_append(m, name, dtype, ndim, shape, err, err_len);
}

/* Orders tensors by name, then by place in the list (the pointers are
 * into one array). */
static int by_name(const void* a, const void* b) {
  const st_attach_tensor_t* x = *(const st_attach_tensor_t* const*) a;
  const st_attach_tensor_t* y = *(const st_attach_tensor_t* const*) b;
  int c = strcmp(x->name, y->name);
  return c != 0 ? c : (x > y) - (x < y);
}

int st__attach_model_unique(const st_attach_model_t* m, char* err,
                            size_t err_len) {
  if (m->n < 2)
    return 0;
  const st_attach_tensor_t** p = malloc(m->n * sizeof(*p));
  if (p == NULL) {
    st_set_err(err, err_len, "out of memory for the tensor list");
    return -ENOMEM;
  }
  for (size_t i = 0; i < m->n; i++)
    p[i] = &m->t[i];
  qsort(p, m->n, sizeof(*p), by_name);
  size_t first = m->n, dup = 0; /* the repeat with the lowest index */
  for (size_t k = 1; k < m->n; k++) {
    size_t i = (size_t) (p[k] - m->t);
    if (strcmp(p[k - 1]->name, p[k]->name) == 0 && i < first) {
      first = i;
      dup = (size_t) (p[k - 1] - m->t);
    }
  }
  free(p);
  if (first == m->n)
    return 0;
  st_set_err(err, err_len,
             "tensor %zu: '%s' is already tensor %zu; every name must be "
             "unique",
             first, m->t[first].name, dup);
  return -EINVAL;
}

/* ---- Differences, description, canonical text ------------------------- */

/* "'fc.weight' F32 [10, 128]" */
static void format_tensor(const st_attach_tensor_t* t, char* out,
                          size_t out_len) {
  int n = snprintf(out, out_len, "'%s' %s [", t->name, t->dtype);
  for (int d = 0; d < t->ndim && n >= 0 && (size_t) n < out_len; d++)
    n += snprintf(out + n, out_len - (size_t) n, "%s%" PRIu64,
                  d > 0 ? ", " : "", t->shape[d]);
  if (n >= 0 && (size_t) n < out_len)
    snprintf(out + n, out_len - (size_t) n, "]");
}

static bool same_tensor(const st_attach_tensor_t* x,
                        const st_attach_tensor_t* y) {
  if (strcmp(x->name, y->name) != 0 || strcmp(x->dtype, y->dtype) != 0 ||
      x->ndim != y->ndim)
    return false;
  for (int d = 0; d < x->ndim; d++)
    if (x->shape[d] != y->shape[d])
      return false;
  return true;
}

bool st_attach_model_diff(const st_attach_model_t* a, const char* here,
                          const st_attach_model_t* b, const char* there,
                          char* out, size_t out_len) {
  char ta[ST_ATTACH_NAME_MAX + 128], tb[ST_ATTACH_NAME_MAX + 128];
  size_t common = a->n < b->n ? a->n : b->n;
  for (size_t i = 0; i < common; i++) {
    if (same_tensor(&a->t[i], &b->t[i]))
      continue;
    format_tensor(&a->t[i], ta, sizeof ta);
    format_tensor(&b->t[i], tb, sizeof tb);
    st_set_err(out, out_len, "tensor %zu: %s %s, %s %s", i, ta, here, tb,
               there);
    return true;
  }
  if (a->n == b->n)
    return false;
  bool a_longer = a->n > b->n;
  format_tensor(a_longer ? &a->t[common] : &b->t[common], ta, sizeof ta);
  st_set_err(out, out_len, "%zu tensors %s, %zu %s: tensor %zu %s is only %s",
             a->n, here, b->n, there, common, ta, a_longer ? here : there);
  return true;
}

void st_attach_model_describe(const st_attach_model_t* m, char* out,
                              size_t len) {
  if (len == 0)
    return;
  int n = snprintf(out, len, "attached:%zu tensors,%" PRIu64 " params", m->n,
                   m->n_floats);
  if (n < 0 || (size_t) n >= len || m->n == 0)
    return;
  /* The first name only whole: a cut name would read as another tensor. */
  if (strlen(m->t[0].name) + 1 < len - (size_t) n)
    snprintf(out + n, len - (size_t) n, ",%s", m->t[0].name);
}

/* One dimension of a canonical line: decimal digits only (no sign, space
 * or leading zero, as the canonical text writes them), within u64. */
static int parse_dim(const char* p, const char* end, uint64_t* out) {
  if (p == end || (*p == '0' && end - p > 1))
    return -1;
  uint64_t v = 0;
  for (; p < end; p++) {
    if (*p < '0' || *p > '9' || v > (UINT64_MAX - 9) / 10)
      return -1;
    v = v * 10 + (uint64_t) (*p - '0');
  }
  *out = v;
  return 0;
}

/* One line "name\tdtype\td0,d1,..." (without its '\n') appended to m. */
static int parse_line(const char* p, const char* nl, st_attach_model_t* m,
                      char* err, size_t err_len) {
  const char* tab1 = memchr(p, '\t', (size_t) (nl - p));
  const char* tab2 =
      tab1 != NULL ? memchr(tab1 + 1, '\t', (size_t) (nl - tab1 - 1)) : NULL;
  char name[ST_ATTACH_NAME_MAX + 1], dtype[8];
  size_t nlen = tab1 != NULL ? (size_t) (tab1 - p) : 0;
  size_t dlen = tab2 != NULL ? (size_t) (tab2 - tab1 - 1) : 0;
  if (tab2 == NULL || nlen > ST_ATTACH_NAME_MAX || dlen >= sizeof(dtype)) {
    st_set_err(err, err_len, "line %zu of the tensor list is malformed",
               m->n + 1);
    return -EINVAL;
  }
  memcpy(name, p, nlen);
  name[nlen] = '\0';
  memcpy(dtype, tab1 + 1, dlen);
  dtype[dlen] = '\0';
  uint64_t shape[ST_ATTACH_MAX_DIMS];
  int ndim = 0;
  for (const char* q = tab2 + 1; q < nl;) {
    const char* comma = memchr(q, ',', (size_t) (nl - q));
    const char* end = comma != NULL ? comma : nl;
    if (ndim == ST_ATTACH_MAX_DIMS || parse_dim(q, end, &shape[ndim]) != 0 ||
        (comma != NULL && comma + 1 == nl)) {
      char shown[64];
      st__attach_printable(name, shown, sizeof shown);
      st_set_err(err, err_len,
                 "the shape of tensor %zu ('%s') in the tensor list is "
                 "malformed",
                 m->n, shown);
      return -EINVAL;
    }
    ndim++;
    q = end == nl ? nl : end + 1;
  }
  return st__attach_model_append(m, name, dtype, ndim, shape, err, err_len);
}

int st_attach_model_parse(const char* text, size_t len, st_attach_model_t* m,
                          char* err, size_t err_len) {
  memset(m, 0, sizeof *m);
  int rc = memchr(text, '\0', len) != NULL ? -EINVAL : 0;
  if (rc != 0)
    st_set_err(err, err_len, "the tensor list holds a NUL byte");
  const char* p = text;
  const char* end = text + len;
  while (rc == 0 && p < end) {
    const char* nl = memchr(p, '\n', (size_t) (end - p));
    if (nl == NULL) {
      st_set_err(err, err_len, "the tensor list does not end with a newline");
      rc = -EINVAL;
      break;
    }
    rc = parse_line(p, nl, m, err, err_len);
    p = nl + 1;
  }
  if (rc == 0 && m->n == 0) {
    st_set_err(err, err_len, "the tensor list is empty");
    rc = -EINVAL;
  }
  if (rc == 0)
    rc = st__attach_model_unique(m, err, err_len);
  if (rc != 0)
    st_attach_model_free(m);
  return rc;
}

char* st_attach_model_canonical(const st_attach_model_t* m, size_t* len) {
  st_json_buf_t b;
  st_json_buf_init(&b);
  st_json_buf_append(&b, "", 0); /* an empty list is "", not NULL */
  for (size_t i = 0; i < m->n; i++) {
    const st_attach_tensor_t* t = &m->t[i];
    st_json_buf_puts(&b, t->name);
    st_json_buf_puts(&b, "\t");
    st_json_buf_puts(&b, t->dtype);
    st_json_buf_puts(&b, "\t");
    for (int d = 0; d < t->ndim; d++) {
      if (d > 0)
        st_json_buf_puts(&b, ",");
      st_json_buf_u64(&b, t->shape[d]);
    }
    st_json_buf_puts(&b, "\n");
  }
  if (b.failed) {
    st_json_buf_free(&b);
    return NULL;
  }
  if (len != NULL)
    *len = b.len;
  return b.p;
}
