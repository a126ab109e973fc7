/* data_idx.c: the IDX loader (the file format of MNIST and Fashion-MNIST,
 * described at http://yann.lecun.com/exdb/mnist/), see train.h.
 *
 * An IDX file is a 4-byte magic (two zero bytes, a data type byte, the
 * number of dimensions), one big-endian uint32 per dimension, then the body
 * in row-major order. We read the unsigned-byte type (0x08) only: images
 * have the count plus at least one dimension (0x00000803 for N x 28 x 28),
 * labels have the count alone (0x00000801).
 *
 * Files are read through zlib's gzopen/gzread, which inflates a gzip file
 * (recognized by its 0x1f 0x8b magic) and passes any other file through
 * unchanged, so compression is detected from the content, not the name.
 * Every header field is checked before the body is read, and the body is
 * read into a buffer that grows as the bytes actually arrive, so a forged
 * header cannot make us allocate more than the file holds. */
#include "node/train/train.h"
#include "node/train/train_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* Real IDX files have at most 4 dimensions; 16 leaves room for odd tensors
 * and keeps the header read bounded (16 x 4 bytes). */
#define IDX_MAX_DIMS 16
/* The body is read in chunks of at most this many bytes (gzread takes an
 * unsigned length) and the buffer starts at this size: 1 MiB. */
#define IDX_CHUNK_BYTES (1u << 20)

static uint32_t be32(const unsigned char* p) {
  return (uint32_t) p[0] << 24 | (uint32_t) p[1] << 16 | (uint32_t) p[2] << 8 |
         (uint32_t) p[3];
}

/* Reads up to len bytes; returns how many arrived (short only at the end of
 * the data), or -1 on a read or decompression error. */
static long long read_upto(gzFile gz, unsigned char* buf, size_t len) {
  size_t got = 0;
  while (got < len) {
    size_t want = len - got;
    if (want > IDX_CHUNK_BYTES)
      want = IDX_CHUNK_BYTES;
    int r = gzread(gz, buf + got, (unsigned) want);
    if (r < 0)
      return -1;
    if (r == 0)
      break;
    got += (size_t) r;
  }
  return (long long) got;
}

/* zlib's sentence for a failed or cut-short read, or NULL when the data
 * just ended. *truncated is set for a gzip stream that stops before its
 * end (zlib reports Z_BUF_ERROR, and gzread returns the bytes it had). */
static const char* gz_problem(gzFile gz, int* truncated) {
  int code = Z_OK;
  const char* msg = gzerror(gz, &code);
  *truncated = (code == Z_BUF_ERROR);
  if (code == Z_OK || code == Z_STREAM_END)
    return NULL;
  if (code == Z_ERRNO)
    return strerror(errno);
  return msg != NULL && *msg != '\0' ? msg : "read error";
}

/* One opened IDX file after its header has been checked. */
typedef struct {
  gzFile gz;
  const char* path;
  uint32_t dims[IDX_MAX_DIMS]; /* dims[0] is the count */
  int ndims;
  size_t count;      /* dims[0] */
  size_t per_item;   /* product of dims[1..ndims), 1 for labels */
  size_t body_bytes; /* count * per_item */
  char shape[96];    /* "28x28", for messages */
} idx_file_t;

/* Checks the 4-byte magic in hdr: unsigned bytes, and the number of
 * dimensions of an image (>= 2) or label (1) file; sets f->ndims. */
static int check_magic(idx_file_t* f, const unsigned char* hdr, int want_images,
                       char* err, size_t err_len) {
  const char* path = f->path;
  uint32_t magic = be32(hdr);
  if (hdr[0] != 0 || hdr[1] != 0) {
    st_set_err(err, err_len,
               "%s: not an IDX file: wrong magic %02x %02x %02x %02x "
               "(expected 00 00 08 %s)",
               path, hdr[0], hdr[1], hdr[2], hdr[3], want_images ? "03" : "01");
    return -EBADMSG;
  }
  if (hdr[2] != 0x08) {
    st_set_err(err, err_len,
               "%s: wrong data type byte 0x%02x in magic 0x%08x: only unsigned "
               "bytes (0x08) are supported",
               path, hdr[2], (unsigned) magic);
    return -EBADMSG;
  }
  f->ndims = hdr[3];
  if (want_images && f->ndims < 2) {
    st_set_err(
        err, err_len,
        "%s: wrong magic 0x%08x: expected an IDX image file (0x00000803, "
        "a count and at least one image dimension)%s",
        path, (unsigned) magic,
        f->ndims == 1 ? "; this looks like a label file" : "");
    return -EBADMSG;
  }
  if (!want_images && f->ndims != 1) {
    st_set_err(err, err_len,
               "%s: wrong magic 0x%08x: expected an IDX label file "
               "(0x00000801, one dimension)%s",
               path, (unsigned) magic,
               f->ndims >= 2 ? "; this looks like an image file" : "");
    return -EBADMSG;
  }
  if (f->ndims > IDX_MAX_DIMS) {
    st_set_err(err, err_len, "%s: %d dimensions: at most %d are supported",
               path, f->ndims, IDX_MAX_DIMS);
    return -EBADMSG;
  }
  return 0;
}

/* Reads the dimensions after the magic (into hdr + 4) and sets the
 * counts and sizes of f from them. */
static int read_dims(idx_file_t* f, unsigned char* hdr, char* err,
                     size_t err_len) {
  int trunc = 0;
  uint32_t magic = be32(hdr);
  const char* path = f->path;
  size_t dim_bytes = 4 * (size_t) f->ndims;
  long long got = read_upto(f->gz, hdr + 4, dim_bytes);
  if (got < 0) {
    st_set_err(err, err_len, "%s: cannot read: %s", path,
               gz_problem(f->gz, &trunc));
    return -EIO;
  }
  if ((size_t) got < dim_bytes) {
    st_set_err(err, err_len,
               "%s: truncated header: magic 0x%08x declares %d dimensions "
               "(%zu header bytes) but the file ends after %lld bytes",
               path, (unsigned) magic, f->ndims, 4 + dim_bytes, 4 + got);
    return -EBADMSG;
  }

  f->per_item = 1;
  size_t pos = 0;
  for (int i = 0; i < f->ndims; i++) {
    f->dims[i] = be32(hdr + 4 + 4 * (size_t) i);
    if (f->dims[i] == 0) {
      st_set_err(err, err_len, "%s: zero dimension: dimension %d (%s) is 0",
                 path, i, i == 0 ? "the count" : "an image dimension");
      return -EBADMSG;
    }
    if (i == 0)
      continue;
    if (f->per_item > SIZE_MAX / f->dims[i])
      goto overflow;
    f->per_item *= f->dims[i];
    if (pos < sizeof(f->shape))
      pos += (size_t) snprintf(f->shape + pos, sizeof(f->shape) - pos,
                               i == 1 ? "%u" : "x%u", (unsigned) f->dims[i]);
  }
  f->count = f->dims[0];
  /* The float copy is 4 bytes per value; keep that within size_t too. */
  if (f->count > SIZE_MAX / sizeof(float) / f->per_item)
    goto overflow;
  f->body_bytes = f->count * f->per_item;
  return 0;

overflow:
  st_set_err(err, err_len,
             "%s: dimensions too large: their product overflows the address "
             "space",
             path);
  return -EOVERFLOW;
}

/* Opens path and checks its header. want_images selects the magic: images
 * (0x0803, >= 2 dimensions) or labels (0x0801). */
static int idx_open(idx_file_t* f, const char* path, int want_images, char* err,
                    size_t err_len) {
  memset(f, 0, sizeof(*f));
  f->path = path;
  errno = 0;
  f->gz = gzopen(path, "rb");
  if (f->gz == NULL) {
    int e = errno ? errno : ENOMEM;
    st_set_err(err, err_len, "%s: cannot open: %s", path, strerror(e));
    return -e;
  }
  gzbuffer(f->gz, 256 * 1024);

  const char* what = want_images ? "image" : "label";
  int rc;
  unsigned char hdr[4 + 4 * IDX_MAX_DIMS];
  long long got = read_upto(f->gz, hdr, 4);
  int trunc = 0;
  if (got < 0) {
    st_set_err(err, err_len, "%s: cannot read: %s", path,
               gz_problem(f->gz, &trunc));
    return -EIO;
  }
  if (got == 0) {
    st_set_err(err, err_len, "%s: empty file: expected an IDX %s file", path,
               what);
    return -EBADMSG;
  }
  if (got < 4) {
    st_set_err(err, err_len,
               "%s: truncated header: the file ends after %lld bytes, inside "
               "the 4-byte IDX magic",
               path, got);
    return -EBADMSG;
  }
  rc = check_magic(f, hdr, want_images, err, err_len);
  if (rc == 0)
    rc = read_dims(f, hdr, err, err_len);
  return rc;
}

/* When the body read is short (have of f->body_bytes bytes), says why:
 * corrupt or truncated. 0 when it is whole. */
static int check_whole(idx_file_t* f, size_t have, char* err, size_t err_len) {
  int is_images = f->ndims >= 2;
  int trunc = 0;
  const char* problem = gz_problem(f->gz, &trunc);
  if (have < f->body_bytes) {
    if (problem != NULL && !trunc) {
      st_set_err(err, err_len,
                 "%s: corrupt data after %zu bytes of the body: %s", f->path,
                 have, problem);
      return -EBADMSG;
    }
    const char* cut = trunc ? " (the gzip stream is cut short)" : "";
    if (is_images)
      st_set_err(err, err_len,
                 "%s: truncated: header declares %zu images of %s (%zu bytes) "
                 "but the file ends after %zu bytes%s",
                 f->path, f->count, f->shape, f->body_bytes, have, cut);
    else
      st_set_err(
          err, err_len,
          "%s: truncated: header declares %zu labels (%zu bytes) but the "
          "file ends after %zu bytes%s",
          f->path, f->count, f->body_bytes, have, cut);
    return -EBADMSG;
  }
  return 0;
}

/* After the body: checks that the gzip stream ends cleanly and that
 * nothing follows. */
static int check_trailing(idx_file_t* f, char* err, size_t err_len) {
  int is_images = f->ndims >= 2;
  int trunc = 0;
  /* Anything after the declared body is garbage: count it for the message. */
  unsigned char extra[4096];
  size_t n_extra = 0;
  long long got;
  while ((got = read_upto(f->gz, extra, sizeof(extra))) > 0)
    n_extra += (size_t) got;
  if (got < 0 && n_extra == 0) {
    st_set_err(err, err_len, "%s: corrupt data after the body: %s", f->path,
               gz_problem(f->gz, &trunc));
    return -EBADMSG;
  }
  if (n_extra == 0 && gz_problem(f->gz, &trunc) != NULL && trunc) {
    st_set_err(err, err_len,
               "%s: truncated: the gzip stream is cut short after the body "
               "(its checksum trailer is missing)",
               f->path);
    return -EBADMSG;
  }
  if (n_extra > 0) {
    st_set_err(err, err_len,
               "%s: trailing bytes: header declares %zu %s (%zu bytes) but %zu "
               "more bytes follow them",
               f->path, f->count, is_images ? "images" : "labels",
               f->body_bytes, n_extra);
    return -EBADMSG;
  }
  return 0;
}

/* Reads exactly f->body_bytes and checks that nothing follows. *out is
 * malloc'd and owned by the caller on success. */
static int idx_read_body(idx_file_t* f, unsigned char** out, char* err,
                         size_t err_len) {
  size_t cap =
      f->body_bytes < IDX_CHUNK_BYTES ? f->body_bytes : IDX_CHUNK_BYTES;
  size_t have = 0;
  unsigned char* buf = malloc(cap);
  int rc = 0;
  if (buf == NULL)
    goto nomem;
  for (;;) {
    long long got = read_upto(f->gz, buf + have, cap - have);
    if (got < 0)
      break;
    have += (size_t) got;
    if (have < cap || cap == f->body_bytes)
      break;
    size_t ncap = cap > f->body_bytes / 2 ? f->body_bytes : 2 * cap;
    unsigned char* nb = realloc(buf, ncap);
    if (nb == NULL)
      goto nomem;
    buf = nb;
    cap = ncap;
  }

  rc = check_whole(f, have, err, err_len);
  if (rc == 0)
    rc = check_trailing(f, err, err_len);
  if (rc != 0)
    goto out;
  *out = buf;
  buf = NULL;
  goto out;

nomem:
  st_set_err(err, err_len, "%s: out of memory reading %zu bytes", f->path,
             f->body_bytes);
  rc = -ENOMEM;
out:
  free(buf);
  return rc;
}

int st_dataset_load_idx(st_dataset_t* ds, const char* images_path,
                        const char* labels_path, char* err, size_t err_len) {
  return st__dataset_load_idx_shard(ds, images_path, labels_path, 0, 1, NULL,
                                    err, err_len);
}

/* Converts shard k of n of the images (to [0, 1]) and labels (NULL: all 0)
 * into x and y (malloc'd, the caller frees them whatever the outcome);
 * *kept: the shard's number of images. */
static int shard_to_floats(const idx_file_t* im, const unsigned char* pixels,
                           const unsigned char* labels, uint32_t shard_k,
                           uint32_t shard_n, float** x, float** y,
                           size_t* kept_out, char* err, size_t err_len) {
  /* Shard k of n: images k, k + n, k + 2n, ... (st_shard_indices). */
  size_t kept =
      im->count > shard_k ? (im->count - shard_k - 1) / shard_n + 1 : 0;
  *x = malloc((kept > 0 ? kept : 1) * im->per_item * sizeof(float));
  *y = malloc((kept > 0 ? kept : 1) * sizeof(float));
  if (*x == NULL || *y == NULL) {
    st_set_err(err, err_len, "%s: out of memory for %zu images of %s", im->path,
               kept, im->shape);
    return -ENOMEM;
  }
  for (size_t j = 0; j < kept; j++) {
    const unsigned char* src = pixels + (shard_k + j * shard_n) * im->per_item;
    float* dst = *x + j * im->per_item;
    for (size_t i = 0; i < im->per_item; i++)
      dst[i] = src[i] / 255.0f;
    (*y)[j] = labels ? (float) labels[shard_k + j * shard_n] : 0.0f;
  }
  *kept_out = kept;
  return 0;
}

/* Labels are single bytes, so they are always < 256. The classes are
 * those of the whole file, so that every shard agrees on them. */
static unsigned largest_label(const unsigned char* labels, size_t count) {
  unsigned max_label = 0;
  for (size_t i = 0; i < count; i++)
    if (labels[i] > max_label)
      max_label = labels[i];
  return max_label;
}

/* What the files say about the dataset: its size, classes (labels NULL:
 * none), the shape of one image, the scale of its pixels, its source. */
static void describe(st_dataset_t* ds, const idx_file_t* im,
                     const unsigned char* labels, const char* labels_path) {
  unsigned max_label = labels ? largest_label(labels, im->count) : 0;
  ds->total = im->count;
  ds->dim = im->per_item;
  ds->n_classes = labels == NULL ? 0 : max_label + 1 < 2 ? 2 : max_label + 1;
  ds->input_scale = 255.0; /* shard_to_floats: bytes / 255 */
  if (im->ndims - 1 <= ST_DATASET_MAX_SHAPE) {
    ds->shape_ndim = im->ndims - 1;
    for (int i = 1; i < im->ndims; i++)
      ds->shape[i - 1] = im->dims[i];
  }
  if (labels_path != NULL)
    snprintf(ds->source, sizeof(ds->source), "%s,%s", im->path, labels_path);
  else
    snprintf(ds->source, sizeof(ds->source), "%s", im->path);
}

int st__dataset_load_idx_shard(st_dataset_t* ds, const char* images_path,
                               const char* labels_path, uint32_t shard_k,
                               uint32_t shard_n, uint64_t hist[256], char* err,
                               size_t err_len) {
  idx_file_t im, lb;
  unsigned char* pixels = NULL;
  unsigned char* labels = NULL;
  float* x = NULL;
  float* y = NULL;
  int rc;

  memset(ds, 0, sizeof(*ds));
  memset(&im, 0, sizeof(im));
  memset(&lb, 0, sizeof(lb));
  if (images_path == NULL) {
    st_set_err(err, err_len, "IDX loader: an image path is needed");
    return -EINVAL;
  }

  /* Both headers first, so that a count mismatch is found before 47 MB of
   * pixels are inflated. */
  rc = idx_open(&im, images_path, 1, err, err_len);
  if (rc != 0)
    goto out;
  if (labels_path == NULL) /* images alone: no labels to read */
    lb.count = im.count;
  else
    rc = idx_open(&lb, labels_path, 0, err, err_len);
  if (rc != 0)
    goto out;
  if (lb.count != im.count) {
    st_set_err(err, err_len,
               "%s: count mismatch: %zu labels, but %s has %zu images",
               labels_path, lb.count, images_path, im.count);
    rc = -EBADMSG;
    goto out;
  }
  rc = idx_read_body(&im, &pixels, err, err_len);
  if (rc != 0)
    goto out;
  if (labels_path != NULL)
    rc = idx_read_body(&lb, &labels, err, err_len);
  if (rc != 0)
    goto out;

  if (shard_n == 0 || shard_k >= shard_n) {
    st_set_err(err, err_len, "%s: bad shard %u/%u", images_path, shard_k,
               shard_n);
    rc = -EINVAL;
    goto out;
  }
  size_t kept = 0;
  rc = shard_to_floats(&im, pixels, labels, shard_k, shard_n, &x, &y, &kept,
                       err, err_len);
  if (rc != 0)
    goto out;
  if (hist != NULL) {
    memset(hist, 0, 256 * sizeof(uint64_t));
    for (size_t i = 0; i < im.body_bytes; i++)
      hist[pixels[i]]++;
  }
  describe(ds, &im, labels, labels_path);
  ds->n = kept;
  ds->shard_k = shard_k;
  ds->shard_n = shard_n;
  ds->x = x;
  ds->y = y;
  x = NULL;
  y = NULL;

out:
  if (im.gz != NULL)
    gzclose(im.gz);
  if (lb.gz != NULL)
    gzclose(lb.gz);
  free(pixels);
  free(labels);
  free(x);
  free(y);
  return rc;
}
