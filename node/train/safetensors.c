/* safetensors.c: reading checkpoints in the safetensors format
 * (https://github.com/huggingface/safetensors, "Format"), float32 only;
 * the atomic writer is in safetensors_write.c.
 *
 * A file is: an 8-byte little-endian u64 N; N bytes of UTF-8 JSON, an
 * object mapping each tensor name to {"dtype", "shape", "data_offsets"}
 * plus an optional "__metadata__" object of strings; then the data buffer.
 * Offsets are [begin, end) in bytes from the start of the buffer. Like the
 * reference implementation we require the tensors to tile the buffer
 * exactly: sorted by offset, each begins where the previous one ended, and
 * the last ends at the end of the file.
 *
 * The file comes from outside (another peer, a download, a disk that
 * filled up), so the reader checks the header length against the file and
 * the cap, parses the header with the strict reader of base/base.h, checks
 * every entry, and allocates the data buffer only after every check has passed;
 * the data is copied into 64-byte aligned float storage.
 */
#include "node/train/train.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "node/train/train_internal.h"

/* Nesting a valid header needs: root object, tensor entry, shape array (3).
 * A little more lets a bad but shallow header get a type error naming the
 * field rather than a nesting error. */
#define HEADER_MAX_DEPTH 8
/* A tensor entry is at most 10 JSON values (entry, dtype, shape, 4 dims,
 * offsets, 2 offsets), so 2^22 values allow ~400k tensors while bounding
 * the parser's memory at a few hundred MB for a hostile 100 MB header. */
#define HEADER_MAX_VALUES ((size_t) 1 << 22)
#define DATA_ALIGN_BYTES 64

typedef struct {
  const char* name;
  size_t shape[ST_SAFETENSORS_MAX_DIMS];
  int ndim;
  size_t n_elems;
  uint64_t begin, end; /* bytes in the data buffer */
} entry_t;

typedef struct {
  const char* key;
  const char* value;
} meta_t;

struct st_safetensors_s {
  entry_t* tensors; /* sorted by name */
  size_t n_tensors;
  meta_t* meta; /* sorted by key */
  size_t n_meta;
  char* strings; /* the names, keys and values above point into this */
  unsigned char* data;
};

static int host_is_big_endian(void) {
  const uint16_t one = 1;
  return *(const unsigned char*) &one == 0;
}

static void bswap32_inplace(unsigned char* p, size_t n_words) {
  for (size_t i = 0; i < n_words; i++, p += 4) {
    unsigned char t = p[0];
    p[0] = p[3];
    p[3] = t;
    t = p[1];
    p[1] = p[2];
    p[2] = t;
  }
}

static int read_exact(int fd, void* p, size_t n) {
  char* c = p;
  while (n > 0) {
    ssize_t r = read(fd, c, n);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    if (r == 0)
      return -ENODATA; /* the file shrank under us */
    c += r;
    n -= (size_t) r;
  }
  return 0;
}

/* Reads a JSON array of at most max non-negative integers. Returns its
 * length, or -1 when it is something else. */
static int uint_array(const st_json_t* a, uint64_t* out, size_t max) {
  if (a->type != ST_JSON_ARRAY || a->count > max)
    return -1;
  size_t i = 0;
  for (const st_json_t* v = a->child; v != NULL; v = v->next) {
    if (v->type != ST_JSON_NUMBER || !v->is_int || v->integer < 0)
      return -1;
    out[i++] = (uint64_t) v->integer;
  }
  return (int) i;
}

/* Checks that a tensor entry is an object with exactly the fields dtype,
 * shape and data_offsets, and that its dtype is F32. */
static int check_entry_fields(const char* path, const st_json_t* t, char* err,
                              size_t err_len) {
  const char* name = t->key;
  if (t->type != ST_JSON_OBJECT) {
    st_set_err(err, err_len, "%s: entry \"%s\" is a JSON %s, not an object",
               path, name, st_json_type_name(t->type));
    return -EBADMSG;
  }
  for (const st_json_t* f = t->child; f != NULL; f = f->next) {
    if (strcmp(f->key, "dtype") != 0 && strcmp(f->key, "shape") != 0 &&
        strcmp(f->key, "data_offsets") != 0) {
      st_set_err(err, err_len, "%s: unknown field \"%s\" in tensor \"%s\"",
                 path, f->key, name);
      return -EBADMSG;
    }
  }
  static const char* const fields[] = {"dtype", "shape", "data_offsets"};
  for (int i = 0; i < 3; i++) {
    if (st_json_get(t, fields[i]) == NULL) {
      st_set_err(err, err_len, "%s: tensor \"%s\" is missing the field \"%s\"",
                 path, name, fields[i]);
      return -EBADMSG;
    }
  }
  const st_json_t* dtype = st_json_get(t, "dtype");
  if (dtype->type != ST_JSON_STRING) {
    st_set_err(err, err_len,
               "%s: dtype of tensor \"%s\" is a JSON %s, not a string", path,
               name, st_json_type_name(dtype->type));
    return -EBADMSG;
  }
  if (strcmp(dtype->str, "F32") != 0) {
    st_set_err(
        err, err_len,
        "%s: unsupported dtype %.32s for tensor \"%s\"; starling reads F32",
        path, dtype->str, name);
    return -ENOTSUP;
  }
  return 0;
}

/* Reads an entry's shape into dims; returns its number of dimensions, or a
 * negative errno. */
static int entry_shape(const char* path, const st_json_t* t,
                       uint64_t dims[ST_SAFETENSORS_MAX_DIMS], char* err,
                       size_t err_len) {
  const char* name = t->key;
  const st_json_t* shape = st_json_get(t, "shape");
  if (shape->type == ST_JSON_ARRAY && shape->count > ST_SAFETENSORS_MAX_DIMS) {
    st_set_err(
        err, err_len,
        "%s: tensor \"%s\" has %zu dimensions; starling supports at most %d",
        path, name, shape->count, ST_SAFETENSORS_MAX_DIMS);
    return -ENOTSUP;
  }
  int ndim = uint_array(shape, dims, ST_SAFETENSORS_MAX_DIMS);
  if (ndim < 0) {
    st_set_err(err, err_len,
               "%s: shape of tensor \"%s\" is not an array of non-negative "
               "integers",
               path, name);
    return -EBADMSG;
  }
  return ndim;
}

/* Reads an entry's data_offsets into off and checks them against the
 * buffer. */
static int entry_offsets(const char* path, const st_json_t* t, uint64_t off[2],
                         uint64_t buf_bytes, char* err, size_t err_len) {
  const char* name = t->key;
  if (uint_array(st_json_get(t, "data_offsets"), off, 2) != 2) {
    st_set_err(err, err_len,
               "%s: data_offsets of tensor \"%s\" is not an array of two "
               "non-negative integers",
               path, name);
    return -EBADMSG;
  }
  if (off[0] > off[1] || off[1] > buf_bytes) {
    st_set_err(
        err, err_len,
        "%s: data_offsets [%llu, %llu] of tensor \"%s\" are out of bounds "
        "of the %llu-byte data buffer",
        path, (unsigned long long) off[0], (unsigned long long) off[1], name,
        (unsigned long long) buf_bytes);
    return -EBADMSG;
  }
  return 0;
}

/* Checks that a shape's element count matches its data_offsets' span. */
static int check_entry_size(const char* path, const char* name,
                            const uint64_t* dims, int ndim,
                            const uint64_t off[2], uint64_t buf_bytes,
                            uint64_t* n_elems, char* err, size_t err_len) {
  /* The element count, capped as it grows so it cannot overflow: anything
   * over the buffer size is a mismatch anyway. */
  uint64_t n = 1, cap = buf_bytes / 4 + 1;
  int over = 0;
  for (int d = 0; d < ndim; d++) {
    if (dims[d] != 0 && n > cap / dims[d]) {
      n = cap;
      over = 1;
    } else {
      n *= dims[d];
    }
  }
  for (int d = 0; d < ndim; d++)
    if (dims[d] == 0) {
      n = 0; /* an empty tensor, whatever the other dimensions */
      over = 0;
    }
  if (n * 4 != off[1] - off[0]) {
    const char* o = over ? "over " : "";
    st_set_err(err, err_len,
               "%s: tensor \"%s\": its shape holds %s%llu float32 values "
               "(%s%llu bytes) but its data_offsets span %llu bytes",
               path, name, o, (unsigned long long) n, o,
               (unsigned long long) (n * 4),
               (unsigned long long) (off[1] - off[0]));
    return -EBADMSG;
  }
  *n_elems = n;
  return 0;
}

/* Checks one tensor entry and fills e (its name is set by the caller). */
static int check_entry(const char* path, const st_json_t* t, entry_t* e,
                       uint64_t buf_bytes, char* err, size_t err_len) {
  int rc = check_entry_fields(path, t, err, err_len);
  if (rc != 0)
    return rc;
  uint64_t dims[ST_SAFETENSORS_MAX_DIMS];
  int ndim = entry_shape(path, t, dims, err, err_len);
  if (ndim < 0)
    return ndim;
  uint64_t off[2];
  rc = entry_offsets(path, t, off, buf_bytes, err, err_len);
  if (rc != 0)
    return rc;
  uint64_t n;
  rc = check_entry_size(path, t->key, dims, ndim, off, buf_bytes, &n, err,
                        err_len);
  if (rc != 0)
    return rc;
  e->ndim = ndim;
  e->n_elems = (size_t) n;
  for (int d = 0; d < ST_SAFETENSORS_MAX_DIMS; d++)
    e->shape[d] = d < ndim ? (size_t) dims[d] : 0;
  e->begin = off[0];
  e->end = off[1];
  return 0;
}

static int cmp_entry_offset(const void* a, const void* b) {
  const entry_t* x = a;
  const entry_t* y = b;
  if (x->begin != y->begin)
    return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end)
    return x->end < y->end ? -1 : 1;
  return 0;
}

static int cmp_entry_name(const void* a, const void* b) {
  return strcmp(((const entry_t*) a)->name, ((const entry_t*) b)->name);
}

static int cmp_meta(const void* a, const void* b) {
  return strcmp(((const meta_t*) a)->key, ((const meta_t*) b)->key);
}

/* Copies the names and metadata out of the JSON document into one block
 * owned by st, so that the document can be freed. */
static int copy_strings(st_safetensors_t* st, const st_json_t* root,
                        const st_json_t* md) {
  size_t total = 0;
  for (const st_json_t* m = root->child; m != NULL; m = m->next)
    if (m != md)
      total += m->key_len + 1;
  for (const st_json_t* m = md ? md->child : NULL; m != NULL; m = m->next)
    total += m->key_len + 1 + m->str_len + 1;
  st->strings = malloc(total > 0 ? total : 1);
  if (st->strings == NULL)
    return -ENOMEM;
  char* s = st->strings;
  size_t i = 0;
  for (const st_json_t* m = root->child; m != NULL; m = m->next) {
    if (m == md)
      continue;
    memcpy(s, m->key, m->key_len + 1);
    st->tensors[i++].name = s;
    s += m->key_len + 1;
  }
  i = 0;
  for (const st_json_t* m = md ? md->child : NULL; m != NULL; m = m->next) {
    memcpy(s, m->key, m->key_len + 1);
    st->meta[i].key = s;
    s += m->key_len + 1;
    memcpy(s, m->str, m->str_len + 1);
    st->meta[i++].value = s;
    s += m->str_len + 1;
  }
  return 0;
}

/* Opens path and checks it is a regular file of at least the 8 bytes of
 * the header length; *fd is set (or -1) whatever the outcome. */
static int open_file(const char* path, int* fd, uint64_t* file_bytes, char* err,
                     size_t err_len) {
  *fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat sb;
  if (*fd < 0 || fstat(*fd, &sb) != 0) {
    int rc = -errno;
    st_set_err(err, err_len, "cannot open %s: %s", path, strerror(errno));
    return rc;
  }
  if (!S_ISREG(sb.st_mode)) {
    st_set_err(err, err_len, "%s is not a regular file", path);
    return -EINVAL;
  }
  *file_bytes = (uint64_t) sb.st_size;
  if (*file_bytes < 8) {
    st_set_err(err, err_len,
               "%s: file is %llu bytes, shorter than the 8-byte header length; "
               "not a safetensors file",
               path, (unsigned long long) *file_bytes);
    return -EBADMSG;
  }
  return 0;
}

/* Reads the header length and the header into *header (the caller frees
 * it, whatever the outcome). */
static int read_header(int fd, const char* path, uint64_t file_bytes,
                       char** header, uint64_t* n_header_out, char* err,
                       size_t err_len) {
  /* The header length, checked against the cap and the file before a
   * single byte of it is allocated. */
  unsigned char len8[8];
  int rc = read_exact(fd, len8, 8);
  uint64_t n_header = 0;
  for (int i = 7; i >= 0 && rc == 0; i--)
    n_header = n_header << 8 | len8[i];
  if (rc == 0 && n_header > ST_SAFETENSORS_MAX_HEADER_BYTES) {
    st_set_err(err, err_len,
               "%s: header length %llu is over the %u-byte limit; the file is "
               "corrupt or not safetensors",
               path, (unsigned long long) n_header,
               ST_SAFETENSORS_MAX_HEADER_BYTES);
    return -EBADMSG;
  }
  if (rc == 0 && n_header > file_bytes - 8) {
    st_set_err(
        err, err_len,
        "%s: header length %llu is beyond the end of the %llu-byte file; "
        "the file is truncated or corrupt",
        path, (unsigned long long) n_header, (unsigned long long) file_bytes);
    return -EBADMSG;
  }
  if (rc == 0)
    *header = malloc(n_header > 0 ? (size_t) n_header : 1);
  if (rc == 0 && *header == NULL)
    rc = -ENOMEM;
  if (rc == 0)
    rc = read_exact(fd, *header, (size_t) n_header);
  if (rc != 0) {
    st_set_err(err, err_len, "reading %s: %s", path, strerror(-rc));
    return rc;
  }
  *n_header_out = n_header;
  return 0;
}

/* Parses the header into *doc (the caller frees it) and checks that its
 * root is an object. */
static int parse_header(const char* path, const char* header, size_t n_header,
                        st_json_doc_t** doc, char* err, size_t err_len) {
  char jerr[160];
  st_json_limits_t lim = {HEADER_MAX_DEPTH, HEADER_MAX_VALUES};
  int rc = st_json_parse(header, n_header, &lim, doc, jerr, sizeof(jerr));
  if (rc != 0) {
    st_set_err(err, err_len, "%s: the header is not valid JSON (%s)", path,
               jerr);
    return rc;
  }
  const st_json_t* root = st_json_root(*doc);
  if (root->type != ST_JSON_OBJECT) {
    st_set_err(err, err_len, "%s: the header is a JSON %s, not an object", path,
               st_json_type_name(root->type));
    return -EBADMSG;
  }
  return 0;
}

/* Checks __metadata__, md (NULL when absent): an object of strings (null is
 * taken as absent, as the reference implementation does). */
static int check_metadata(const char* path, const st_json_t* md, char* err,
                          size_t err_len) {
  if (md != NULL && md->type == ST_JSON_OBJECT) {
    for (const st_json_t* m = md->child; m != NULL; m = m->next) {
      if (m->type != ST_JSON_STRING) {
        st_set_err(err, err_len,
                   "%s: metadata value of \"%s\" is a JSON %s, not a string",
                   path, m->key, st_json_type_name(m->type));
        return -EBADMSG;
      }
    }
  } else if (md != NULL && md->type != ST_JSON_NULL) {
    st_set_err(err, err_len, "%s: __metadata__ is a JSON %s, not an object",
               path, st_json_type_name(md->type));
    return -EBADMSG;
  }
  return 0;
}

/* Allocates st's tables and checks every tensor entry of root (all but md)
 * into st->tensors. */
static int check_entries(st_safetensors_t* st, const char* path,
                         const st_json_t* root, const st_json_t* md,
                         uint64_t buf_bytes, char* err, size_t err_len) {
  st->n_tensors = root->count - (md != NULL);
  st->n_meta = md != NULL && md->type == ST_JSON_OBJECT ? md->count : 0;
  st->tensors = calloc(st->n_tensors + 1, sizeof(*st->tensors));
  st->meta = calloc(st->n_meta + 1, sizeof(*st->meta));
  if (st->tensors == NULL || st->meta == NULL) {
    st_set_err(err, err_len, "reading %s: out of memory", path);
    return -ENOMEM;
  }
  size_t i = 0;
  for (const st_json_t* t = root->child; t != NULL; t = t->next) {
    if (t == md)
      continue;
    int rc = check_entry(path, t, &st->tensors[i], buf_bytes, err, err_len);
    if (rc != 0)
      return rc;
    st->tensors[i++].name = t->key; /* for messages; copied later */
  }
  return 0;
}

/* The tensors must tile [0, buf_bytes): sorted by offset, each begins
 * where the previous ended. Every size is a multiple of 4 (F32), so every
 * tensor also starts 4-byte aligned in the buffer. */
static int check_tiling(st_safetensors_t* st, const char* path,
                        uint64_t buf_bytes, char* err, size_t err_len) {
  qsort(st->tensors, st->n_tensors, sizeof(*st->tensors), cmp_entry_offset);
  uint64_t at = 0;
  for (size_t i = 0; i < st->n_tensors; i++) {
    const entry_t* e = &st->tensors[i];
    if (e->begin < at) {
      st_set_err(err, err_len, "%s: tensors \"%s\" and \"%s\" overlap", path,
                 st->tensors[i - 1].name, e->name);
      return -EBADMSG;
    }
    if (e->begin > at) {
      st_set_err(err, err_len,
                 "%s: %llu-byte gap in the data buffer before tensor \"%s\"",
                 path, (unsigned long long) (e->begin - at), e->name);
      return -EBADMSG;
    }
    at = e->end;
  }
  if (at != buf_bytes) {
    st_set_err(err, err_len,
               "%s: %llu trailing bytes after the last tensor; the data buffer "
               "must end where the last tensor ends",
               path, (unsigned long long) (buf_bytes - at));
    return -EBADMSG;
  }
  return 0;
}

/* Allocates the aligned data buffer and reads it (in host byte order). */
static int read_data(st_safetensors_t* st, int fd, const char* path,
                     uint64_t buf_bytes, char* err, size_t err_len) {
  if (buf_bytes > SIZE_MAX - DATA_ALIGN_BYTES) {
    st_set_err(err, err_len, "%s: too large for this machine", path);
    return -EFBIG;
  }
  size_t alloc = ((size_t) buf_bytes + DATA_ALIGN_BYTES) / DATA_ALIGN_BYTES *
                 DATA_ALIGN_BYTES;
  st->data = aligned_alloc(DATA_ALIGN_BYTES, alloc);
  if (st->data == NULL) {
    st_set_err(err, err_len, "reading %s: out of memory for %llu bytes of data",
               path, (unsigned long long) buf_bytes);
    return -ENOMEM;
  }
  int rc = read_exact(fd, st->data, (size_t) buf_bytes);
  if (rc != 0) {
    st_set_err(
        err, err_len, "reading %s: %s", path,
        rc == -ENODATA ? "the file shrank while being read" : strerror(-rc));
    return rc;
  }
  if (host_is_big_endian())
    bswap32_inplace(st->data, (size_t) buf_bytes / 4);
  return 0;
}

int st_safetensors_read(const char* path, st_safetensors_t** out, char* err,
                        size_t err_len) {
  *out = NULL;
  if (err != NULL && err_len > 0)
    err[0] = '\0';
  st_safetensors_t* st = calloc(1, sizeof(*st));
  char* header = NULL;
  st_json_doc_t* doc = NULL;
  int fd = -1;
  int rc = 0;
  if (st == NULL) {
    rc = -ENOMEM;
    st_set_err(err, err_len, "reading %s: out of memory", path);
    goto out;
  }
  uint64_t file_bytes = 0, n_header = 0;
  rc = open_file(path, &fd, &file_bytes, err, err_len);
  if (rc == 0)
    rc = read_header(fd, path, file_bytes, &header, &n_header, err, err_len);
  if (rc == 0)
    rc = parse_header(path, header, (size_t) n_header, &doc, err, err_len);
  if (rc != 0)
    goto out;
  uint64_t buf_bytes = file_bytes - 8 - n_header;
  const st_json_t* root = st_json_root(doc);
  const st_json_t* md = st_json_get(root, "__metadata__");
  rc = check_metadata(path, md, err, err_len);
  if (rc == 0)
    rc = check_entries(st, path, root, md, buf_bytes, err, err_len);
  if (rc == 0)
    rc = check_tiling(st, path, buf_bytes, err, err_len);
  /* Only now, with every check passed, the data buffer. */
  if (rc == 0)
    rc = read_data(st, fd, path, buf_bytes, err, err_len);
  if (rc != 0)
    goto out;
  rc = copy_strings(st, root, md);
  if (rc != 0) {
    st_set_err(err, err_len, "reading %s: out of memory", path);
    goto out;
  }
  qsort(st->tensors, st->n_tensors, sizeof(*st->tensors), cmp_entry_name);
  qsort(st->meta, st->n_meta, sizeof(*st->meta), cmp_meta);
  *out = st;
  st = NULL;

out:
  if (fd >= 0)
    close(fd);
  free(header);
  st_json_free(doc);
  st_safetensors_free(st);
  return rc;
}

void st_safetensors_free(st_safetensors_t* st) {
  if (st == NULL)
    return;
  free(st->tensors);
  free(st->meta);
  free(st->strings);
  free(st->data);
  free(st);
}

const float* st_safetensors_tensor(const st_safetensors_t* st, const char* name,
                                   size_t* n_elems,
                                   size_t shape[ST_SAFETENSORS_MAX_DIMS],
                                   int* ndim) {
  entry_t key = {.name = name};
  const entry_t* e = bsearch(&key, st->tensors, st->n_tensors,
                             sizeof(*st->tensors), cmp_entry_name);
  if (e == NULL)
    return NULL;
  if (n_elems != NULL)
    *n_elems = e->n_elems;
  if (shape != NULL)
    memcpy(shape, e->shape, sizeof(e->shape));
  if (ndim != NULL)
    *ndim = e->ndim;
  return (const float*) (const void*) (st->data + e->begin);
}

const char* st_safetensors_meta(const st_safetensors_t* st, const char* key) {
  meta_t k = {.key = key};
  const meta_t* m =
      bsearch(&k, st->meta, st->n_meta, sizeof(*st->meta), cmp_meta);
  return m != NULL ? m->value : NULL;
}

size_t st_safetensors_count(const st_safetensors_t* st) {
  return st->n_tensors;
}
