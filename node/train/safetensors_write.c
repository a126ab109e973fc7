/* safetensors_write.c: writing checkpoints in the safetensors format
 * (https://github.com/huggingface/safetensors, "Format"), float32 only;
 * the reader is in safetensors.c.
 *
 * The header is laid out as Python's safetensors writes it: "__metadata__"
 * first, then the tensors in buffer order, padded with spaces so that the
 * data buffer starts at a multiple of 8 bytes. The file is replaced
 * atomically: a temporary file "<path>.tmp.XXXXXX" in the same directory,
 * write, fsync, close, rename over path, fsync of the directory. A crash
 * leaves either the old checkpoint or the new one, never a mix; any
 * failure (a full disk included) removes the temporary file. A crash
 * during the write leaves the temporary file (the node removes its own
 * at start, node/daemon/daemon_state.c). Checkpoints are created with
 * mode 0600: only their owner may read the model.
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

static int host_is_big_endian(void) {
  const uint16_t one = 1;
  return *(const unsigned char*) &one == 0;
}

static int write_all(int fd, const void* p, size_t n) {
  const char* c = p;
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    if (w == 0)
      return -EIO;
    c += w;
    n -= (size_t) w;
  }
  return 0;
}

/* Writes n floats as little-endian bytes. */
static int write_floats(int fd, const float* x, size_t n) {
  if (!host_is_big_endian())
    return write_all(fd, x, n * sizeof(float));
  unsigned char tmp[4096];
  while (n > 0) {
    size_t k = n < sizeof(tmp) / 4 ? n : sizeof(tmp) / 4;
    for (size_t i = 0; i < k; i++) {
      uint32_t u;
      memcpy(&u, &x[i], 4);
      for (int j = 0; j < 4; j++)
        tmp[4 * i + (size_t) j] = (unsigned char) (u >> (8 * j));
    }
    int rc = write_all(fd, tmp, k * 4);
    if (rc != 0)
      return rc;
    x += k;
    n -= k;
  }
  return 0;
}

static int cmp_tensor_desc(const void* a, const void* b) {
  const st_tensor_desc_t* x = *(const st_tensor_desc_t* const*) a;
  const st_tensor_desc_t* y = *(const st_tensor_desc_t* const*) b;
  return strcmp(x->name, y->name);
}

static int cmp_meta_kv(const void* a, const void* b) {
  const st_meta_kv_t* x = *(const st_meta_kv_t* const*) a;
  const st_meta_kv_t* y = *(const st_meta_kv_t* const*) b;
  return strcmp(x->key, y->key);
}

/* Checks every tensor's name, rank, size and data, and that all of them
 * fit the offsets a JSON reader holds exactly. */
static int check_tensors(const char* path, const st_tensor_desc_t* tensors,
                         size_t n_tensors, char* err, size_t err_len) {
  uint64_t offset = 0;
  for (size_t i = 0; i < n_tensors; i++) {
    const st_tensor_desc_t* t = &tensors[i];
    if (t->name == NULL || t->name[0] == '\0' ||
        strcmp(t->name, "__metadata__") == 0 ||
        !st_json_utf8_valid(t->name, strlen(t->name))) {
      st_set_err(err, err_len,
                 "cannot write %s: tensor %zu needs a name that is non-empty, "
                 "valid UTF-8 and not \"__metadata__\"",
                 path, i);
      return -EINVAL;
    }
    if (t->ndim < 0 || t->ndim > ST_SAFETENSORS_MAX_DIMS) {
      st_set_err(err, err_len,
                 "cannot write %s: tensor \"%s\" has ndim %d (0..%d)", path,
                 t->name, t->ndim, ST_SAFETENSORS_MAX_DIMS);
      return -EINVAL;
    }
    /* Elements, bytes and the running offset all stay below 2^53, the
     * largest integer a JSON reader is sure to hold exactly. */
    uint64_t n = 1;
    for (int d = 0; d < t->ndim; d++) {
      uint64_t dim = t->shape[d];
      if (dim != 0 && n > (uint64_t) ST_JSON_MAX_INT / 4 / dim) {
        st_set_err(err, err_len, "cannot write %s: tensor \"%s\" is too large",
                   path, t->name);
        return -EFBIG;
      }
      n *= dim;
    }
    if (n > 0 && t->data == NULL) {
      st_set_err(err, err_len, "cannot write %s: tensor \"%s\" has no data",
                 path, t->name);
      return -EINVAL;
    }
    if (n * 4 > (uint64_t) ST_JSON_MAX_INT - offset || n > SIZE_MAX / 4) {
      st_set_err(err, err_len, "cannot write %s: the tensors are too large",
                 path);
      return -EFBIG;
    }
    offset += n * 4;
  }
  return 0;
}

/* Checks that every metadata key and value is a valid UTF-8 string. */
static int check_meta(const char* path, const st_meta_kv_t* meta, size_t n_meta,
                      char* err, size_t err_len) {
  for (size_t i = 0; i < n_meta; i++) {
    const char* k = meta[i].key;
    const char* v = meta[i].value;
    if (k == NULL || v == NULL || !st_json_utf8_valid(k, strlen(k)) ||
        !st_json_utf8_valid(v, strlen(v))) {
      st_set_err(err, err_len,
                 "cannot write %s: metadata entry %zu needs a key and a value "
                 "that are valid UTF-8 strings",
                 path, i);
      return -EINVAL;
    }
  }
  return 0;
}

/* Refuses a tensor name or a metadata key given twice. */
static int check_duplicates(const char* path, const st_tensor_desc_t* tensors,
                            size_t n_tensors, const st_meta_kv_t* meta,
                            size_t n_meta, char* err, size_t err_len) {
  /* Duplicates, found by sorting pointers (O(n log n) for big models). */
  size_t n_sort = n_tensors > n_meta ? n_tensors : n_meta;
  if (n_sort > 1) {
    const void** v = malloc(n_sort * sizeof(*v));
    if (v == NULL) {
      st_set_err(err, err_len, "cannot write %s: out of memory", path);
      return -ENOMEM;
    }
    const char* dup = NULL;
    const char* what = "tensor name";
    for (size_t i = 0; i < n_tensors; i++)
      v[i] = &tensors[i];
    qsort(v, n_tensors, sizeof(*v), cmp_tensor_desc);
    for (size_t i = 1; i < n_tensors && dup == NULL; i++)
      if (cmp_tensor_desc(&v[i - 1], &v[i]) == 0)
        dup = ((const st_tensor_desc_t*) v[i])->name;
    if (dup == NULL) {
      what = "metadata key";
      for (size_t i = 0; i < n_meta; i++)
        v[i] = &meta[i];
      qsort(v, n_meta, sizeof(*v), cmp_meta_kv);
      for (size_t i = 1; i < n_meta && dup == NULL; i++)
        if (cmp_meta_kv(&v[i - 1], &v[i]) == 0)
          dup = ((const st_meta_kv_t*) v[i])->key;
    }
    if (dup != NULL)
      st_set_err(err, err_len, "cannot write %s: duplicate %s \"%s\"", path,
                 what, dup);
    free(v);
    if (dup != NULL)
      return -EINVAL;
  }
  return 0;
}

/* Writes the header into h, padded to a multiple of 8 bytes, and checks its
 * size. */
static int emit_header(const char* path, const st_tensor_desc_t* tensors,
                       size_t n_tensors, const st_meta_kv_t* meta,
                       size_t n_meta, st_json_buf_t* h, char* err,
                       size_t err_len) {
  /* The header, in the layout Python's safetensors writes: metadata first,
   * then the tensors in buffer order. */
  st_json_buf_puts(h, "{");
  if (n_meta > 0) {
    st_json_buf_puts(h, "\"__metadata__\":{");
    for (size_t i = 0; i < n_meta; i++) {
      if (i > 0)
        st_json_buf_puts(h, ",");
      st_json_buf_string(h, meta[i].key);
      st_json_buf_puts(h, ":");
      st_json_buf_string(h, meta[i].value);
    }
    st_json_buf_puts(h, n_tensors > 0 ? "}," : "}");
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < n_tensors; i++) {
    const st_tensor_desc_t* t = &tensors[i];
    uint64_t n = 1;
    if (i > 0)
      st_json_buf_puts(h, ",");
    st_json_buf_string(h, t->name);
    st_json_buf_puts(h, ":{\"dtype\":\"F32\",\"shape\":[");
    for (int d = 0; d < t->ndim; d++) {
      if (d > 0)
        st_json_buf_puts(h, ",");
      st_json_buf_u64(h, t->shape[d]);
      n *= t->shape[d];
    }
    st_json_buf_puts(h, "],\"data_offsets\":[");
    st_json_buf_u64(h, offset);
    st_json_buf_puts(h, ",");
    st_json_buf_u64(h, offset + n * 4);
    st_json_buf_puts(h, "]}");
    offset += n * 4;
  }
  st_json_buf_puts(h, "}");
  while (!h->failed && h->len % 8 != 0)
    st_json_buf_puts(h, " ");
  if (h->failed) {
    st_set_err(err, err_len, "cannot write %s: out of memory", path);
    return -ENOMEM;
  }
  if (h->len > ST_SAFETENSORS_MAX_HEADER_BYTES) {
    st_set_err(
        err, err_len,
        "cannot write %s: the header would be %zu bytes, over the %u-byte "
        "limit of safetensors readers",
        path, h->len, ST_SAFETENSORS_MAX_HEADER_BYTES);
    return -EFBIG;
  }
  return 0;
}

/* Checks the caller's tensors and metadata and builds the padded header. */
static int build_header(const char* path, const st_tensor_desc_t* tensors,
                        size_t n_tensors, const st_meta_kv_t* meta,
                        size_t n_meta, st_json_buf_t* h, char* err,
                        size_t err_len) {
  int rc = check_tensors(path, tensors, n_tensors, err, err_len);
  if (rc == 0)
    rc = check_meta(path, meta, n_meta, err, err_len);
  if (rc == 0)
    rc = check_duplicates(path, tensors, n_tensors, meta, n_meta, err, err_len);
  if (rc == 0)
    rc = emit_header(path, tensors, n_tensors, meta, n_meta, h, err, err_len);
  return rc;
}

/* fsyncs the directory holding path, so that the rename is durable. */
static int fsync_dir_of(const char* path) {
  const char* slash = strrchr(path, '/');
  char* dir;
  if (slash == NULL) {
    dir = strdup(".");
  } else if (slash == path) {
    dir = strdup("/");
  } else {
    dir = strndup(path, (size_t) (slash - path));
  }
  if (dir == NULL)
    return -ENOMEM;
  int rc = 0;
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    rc = -errno;
  } else {
    /* Some filesystems cannot fsync a directory (EINVAL); nothing more can
     * be done there, and the rename itself has happened. */
    if (fsync(fd) != 0 && errno != EINVAL)
      rc = -errno;
    close(fd);
  }
  free(dir);
  return rc;
}

/* Creates the temporary file beside path (*tmp_out, its name, malloc'd;
 * *fd_out, open) with the mode the checkpoint will have. On failure,
 * *step names what failed; what was created is the caller's to remove. */
static int create_temp(const char* path, char** tmp_out, int* fd_out,
                       const char** step) {
  size_t tmp_len = strlen(path) + sizeof(".tmp.XXXXXX");
  char* tmp = malloc(tmp_len);
  *tmp_out = tmp;
  if (tmp == NULL) {
    *step = "allocating";
    return -ENOMEM;
  }
  snprintf(tmp, tmp_len, "%s.tmp.XXXXXX", path);
  int fd = mkstemp(tmp);
  if (fd < 0) {
    int rc = -errno;
    free(tmp);
    *tmp_out = NULL; /* nothing to unlink */
    *step = "creating a temporary file for";
    return rc;
  }
  *fd_out = fd;
  (void) fcntl(fd, F_SETFD, FD_CLOEXEC);
  /* A checkpoint is the model: 0600, like the key files, whatever the mode
   * of the one it replaces (mkstemp creates 0600 already; the fchmod says
   * so where a umask or an odd filesystem might not). Sharing one is a
   * deliberate chmod or copy. */
  if (fchmod(fd, 0600) != 0) {
    *step = "setting the mode of";
    return -errno;
  }
  return 0;
}

/* Writes the header length, the header and the tensors' data to fd. */
static int write_contents(int fd, const st_json_buf_t* h,
                          const st_tensor_desc_t* tensors, size_t n_tensors) {
  unsigned char len8[8];
  for (int i = 0; i < 8; i++)
    len8[i] = (unsigned char) ((uint64_t) h->len >> (8 * i));
  int rc = write_all(fd, len8, sizeof(len8));
  if (rc == 0)
    rc = write_all(fd, h->p, h->len);
  for (size_t i = 0; i < n_tensors && rc == 0; i++) {
    size_t n = 1;
    for (int d = 0; d < tensors[i].ndim; d++)
      n *= tensors[i].shape[d];
    if (n > 0)
      rc = write_floats(fd, tensors[i].data, n);
  }
  return rc;
}

int st_safetensors_write(const char* path, const st_tensor_desc_t* tensors,
                         size_t n_tensors, const st_meta_kv_t* meta,
                         size_t n_meta, char* err, size_t err_len) {
  if (err != NULL && err_len > 0)
    err[0] = '\0';
  if (path == NULL || path[0] == '\0' || (n_tensors > 0 && tensors == NULL) ||
      (n_meta > 0 && meta == NULL)) {
    st_set_err(err, err_len,
               "st_safetensors_write: no path or no tensors given");
    return -EINVAL;
  }
  st_json_buf_t h;
  st_json_buf_init(&h);
  char* tmp = NULL;
  int fd = -1;
  int rc;
  const char* step = "";

  rc = build_header(path, tensors, n_tensors, meta, n_meta, &h, err, err_len);
  if (rc != 0)
    goto out;

  rc = create_temp(path, &tmp, &fd, &step);
  if (rc != 0)
    goto fail;

  step = "writing";
  rc = write_contents(fd, &h, tensors, n_tensors);
  if (rc != 0)
    goto fail;
  step = "syncing";
  if (fsync(fd) != 0) {
    rc = -errno;
    goto fail;
  }
  step = "closing";
  int fd_closing = fd;
  fd = -1;
  if (close(fd_closing) != 0) {
    rc = -errno;
    goto fail;
  }
  step = "renaming the temporary file onto";
  if (rename(tmp, path) != 0) {
    rc = -errno;
    goto fail;
  }
  free(tmp);
  tmp = NULL; /* it is path now */
  rc = fsync_dir_of(path);
  if (rc != 0) {
    st_set_err(err, err_len,
               "wrote %s, but syncing its directory failed (%s); the new "
               "checkpoint may not survive a crash",
               path, strerror(-rc));
  }
  goto out;

fail:
  st_set_err(err, err_len,
             "%s %s failed: %s; the previous file, if any, is left "
             "unchanged",
             step, path, strerror(-rc));
out:
  if (fd >= 0)
    close(fd);
  if (tmp != NULL) {
    unlink(tmp);
    free(tmp);
  }
  st_json_buf_free(&h);
  return rc;
}
