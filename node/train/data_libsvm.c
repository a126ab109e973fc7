/* data_libsvm.c: the libsvm (svmlight) loader for sparse data, see train.h.
 *
 * The format is the one LIBSVM, liblinear, scikit-learn's
 * load_svmlight_file and the sparse benchmark sets (rcv1, news20, url,
 * webspam) use: one example per line,
 *
 *     LABEL INDEX:VALUE INDEX:VALUE ...   [# comment]
 *
 * fields separated by spaces or tabs, indices 1-based and strictly
 * increasing, features not named are 0. Lines that are empty or only a
 * comment are skipped. The ranking extension "qid:" is refused (a ranking
 * set is not a training set for these models). Explicit zeros are dropped.
 *
 * The file goes through zlib's gzgets, which reads a gzip file or a plain
 * one alike; lines of any length load (the buffer grows), and the arrays
 * grow geometrically, so a file loads in linear time. */
#include "node/train/train.h"
#include "node/train/train_internal.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* Features are model inputs, and model sizes stop at 2^24 (optimizer.h). */
#define LIBSVM_MAX_INDEX (1u << 24)
/* As the CSV loader: a class index far above any real class count is a
 * regression target, refused rather than sized as a 16M-way output. */
#define LIBSVM_MAX_CLASSES (1u << 16)
#define LIBSVM_INITIAL_ROWS 1024
#define LIBSVM_INITIAL_NNZ 16384
#define LIBSVM_INITIAL_LINE 4096

typedef struct {
  const char* path;
  size_t line; /* 1-based number of the line being parsed */
  int regression;
  size_t n, cap;         /* examples loaded, allocated */
  size_t nnz, cap_nnz;   /* features loaded, allocated */
  size_t* row_ptr;       /* cap + 1 */
  uint32_t* col;         /* cap_nnz */
  float* val;            /* cap_nnz */
  float* y;              /* cap */
  size_t max_index;      /* largest index seen (1-based) */
  double max_label;      /* classification: largest label */
  size_t first_neg_line; /* the first line labelled -1 (0: none) */
  size_t not_pm1_line;   /* the first line labelled neither -1 nor +1 */
  char* err;
  size_t err_len;
} lsvm_t;

static int nomem(lsvm_t* s) {
  st_set_err(s->err, s->err_len, "%s: out of memory after %zu examples",
             s->path, s->n);
  return -ENOMEM;
}

static int grow_rows(lsvm_t* s) {
  size_t ncap = s->cap ? s->cap * 2 : LIBSVM_INITIAL_ROWS;
  if (ncap > SIZE_MAX / sizeof(size_t) - 1)
    return nomem(s);
  size_t* rp = realloc(s->row_ptr, (ncap + 1) * sizeof(size_t));
  if (rp == NULL)
    return nomem(s);
  s->row_ptr = rp;
  float* y = realloc(s->y, ncap * sizeof(float));
  if (y == NULL)
    return nomem(s);
  s->y = y;
  s->cap = ncap;
  return 0;
}

static int grow_nnz(lsvm_t* s) {
  size_t ncap = s->cap_nnz ? s->cap_nnz * 2 : LIBSVM_INITIAL_NNZ;
  if (ncap > SIZE_MAX / sizeof(float))
    return nomem(s);
  uint32_t* col = realloc(s->col, ncap * sizeof(uint32_t));
  if (col == NULL)
    return nomem(s);
  s->col = col;
  float* val = realloc(s->val, ncap * sizeof(float));
  if (val == NULL)
    return nomem(s);
  s->val = val;
  s->cap_nnz = ncap;
  return 0;
}

/* A finite number that fits a float, the whole of [s, end). */
static int parse_number(const char* s, const char* end, double* out) {
  if (s == end)
    return -1;
  char* stop = NULL;
  errno = 0;
  double v = strtod(s, &stop);
  if (stop != end || !isfinite(v) || fabs(v) > FLT_MAX)
    return -1;
  *out = v;
  return 0;
}

static int bad(lsvm_t* s, const char* what, const char* tok, size_t len) {
  st_set_err(s->err, s->err_len, "%s: line %zu: %s '%.*s'", s->path, s->line,
             what, (int) (len > 40 ? 40 : len), tok);
  return -EBADMSG;
}

static int take_label(lsvm_t* s, const char* tok, const char* end) {
  double v;
  if (parse_number(tok, end, &v) != 0)
    return bad(s, "the label is not a finite number:", tok,
               (size_t) (end - tok));
  if (!s->regression) {
    if (v != floor(v) || v < -1 || v >= LIBSVM_MAX_CLASSES)
      return bad(s,
                 "a class label must be an integer in [0, 65535] (or -1 in a "
                 "-1/+1 set; use --regression for real targets), not",
                 tok, (size_t) (end - tok));
    if (v == -1 && s->first_neg_line == 0)
      s->first_neg_line = s->line;
    if (v != -1 && v != 1 && s->not_pm1_line == 0)
      s->not_pm1_line = s->line;
    if (v > s->max_label)
      s->max_label = v;
  }
  s->y[s->n] = (float) v;
  return 0;
}

/* One INDEX:VALUE token; prev is the last index of the line (0: none). */
static int take_feature(lsvm_t* s, const char* tok, const char* end,
                        size_t* prev) {
  size_t len = (size_t) (end - tok);
  const char* colon = memchr(tok, ':', len);
  if (colon == NULL)
    return bad(s, "a feature is INDEX:VALUE, not", tok, len);
  if (colon - tok == 3 && memcmp(tok, "qid", 3) == 0)
    return bad(s, "ranking queries (qid:) are not a training set:", tok, len);
  size_t index = 0;
  for (const char* p = tok; p < colon; p++) {
    if (!isdigit((unsigned char) *p) || index > LIBSVM_MAX_INDEX)
      return bad(s, "a feature index is an integer from 1, not", tok, len);
    index = index * 10 + (size_t) (*p - '0');
  }
  if (colon == tok || index == 0 || index > LIBSVM_MAX_INDEX)
    return bad(s, "a feature index is an integer in [1, 16777216], not", tok,
               len);
  if (index <= *prev)
    return bad(s, "feature indices must increase along a line; not after", tok,
               len);
  *prev = index;
  double v;
  if (parse_number(colon + 1, end, &v) != 0)
    return bad(s, "a feature value is not a finite number:", tok, len);
  if (index > s->max_index) /* a trailing "D:0" still sets the width */
    s->max_index = index;
  if (v == 0)
    return 0;
  if (s->nnz == s->cap_nnz) {
    int rc = grow_nnz(s);
    if (rc != 0)
      return rc;
  }
  s->col[s->nnz] = (uint32_t) (index - 1);
  s->val[s->nnz] = (float) v;
  s->nnz++;
  return 0;
}

/* Parses one line (NUL-terminated, its newline included or not). */
static int parse_line(lsvm_t* s, char* text) {
  char* hash = strchr(text, '#');
  if (hash != NULL)
    *hash = '\0';
  char* p = text;
  size_t prev = 0;
  int first = 1;
  for (;;) {
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
      p++;
    if (*p == '\0')
      break;
    char* end = p;
    while (*end != '\0' && *end != ' ' && *end != '\t' && *end != '\r' &&
           *end != '\n')
      end++;
    if (first) {
      if (s->n == s->cap && grow_rows(s) != 0)
        return -ENOMEM;
      s->row_ptr[s->n] = s->nnz;
      int rc = take_label(s, p, end);
      if (rc != 0)
        return rc;
      first = 0;
    } else {
      int rc = take_feature(s, p, end, &prev);
      if (rc != 0)
        return rc;
    }
    p = end;
  }
  if (!first)
    s->n++;
  return 0;
}

/* Reads the next line into *buf (grown as needed). 1: a line; 0: the end;
 * negative: a read error (err set). */
static int read_line(lsvm_t* s, gzFile gz, char** buf, size_t* cap) {
  size_t len = 0;
  for (;;) {
    if (*cap - len < 2) {
      size_t ncap = *cap * 2;
      char* nb = realloc(*buf, ncap);
      if (nb == NULL)
        return nomem(s);
      *buf = nb;
      *cap = ncap;
    }
    if (gzgets(gz, *buf + len, (int) (*cap - len)) == NULL) {
      int code = 0;
      const char* msg = gzerror(gz, &code);
      if (code != Z_OK && code != Z_STREAM_END) {
        st_set_err(s->err, s->err_len, "%s: read error after line %zu: %s",
                   s->path, s->line, code == Z_ERRNO ? strerror(errno) : msg);
        return -EIO;
      }
      return len > 0 ? 1 : 0;
    }
    len += strlen(*buf + len);
    if (len > 0 && (*buf)[len - 1] == '\n')
      return 1;
    if (gzeof(gz))
      return len > 0 ? 1 : 0;
  }
}

/* The labels as classes: -1/+1 sets become 0/1. */
static int settle_labels(lsvm_t* s, st_dataset_t* ds) {
  if (s->regression) {
    ds->n_classes = 0;
    return 0;
  }
  if (s->first_neg_line != 0) {
    if (s->not_pm1_line != 0) {
      st_set_err(s->err, s->err_len,
                 "%s: line %zu has label -1 but line %zu has neither -1 nor "
                 "+1: a class label is a non-negative integer, or every label "
                 "is -1 or +1 (a binary set)",
                 s->path, s->first_neg_line, s->not_pm1_line);
      return -EBADMSG;
    }
    for (size_t i = 0; i < s->n; i++)
      s->y[i] = s->y[i] < 0 ? 0.0f : 1.0f;
    s->max_label = 1;
  }
  size_t k = (size_t) s->max_label + 1;
  ds->n_classes = k < 2 ? 2 : k;
  return 0;
}

static int read_all(lsvm_t* s, gzFile gz) {
  size_t cap = LIBSVM_INITIAL_LINE;
  char* buf = malloc(cap);
  if (buf == NULL)
    return nomem(s);
  int rc;
  while ((rc = read_line(s, gz, &buf, &cap)) == 1) {
    s->line++;
    rc = parse_line(s, buf);
    if (rc != 0)
      break;
  }
  free(buf);
  return rc;
}

int st_dataset_load_libsvm(st_dataset_t* ds, const char* path,
                           const st_csv_options_t* opt, size_t min_dim,
                           char* err, size_t err_len) {
  lsvm_t s;
  memset(ds, 0, sizeof(*ds));
  memset(&s, 0, sizeof(s));
  s.path = path;
  s.regression = opt != NULL && opt->regression;
  s.err = err;
  s.err_len = err_len;
  if (path == NULL) {
    st_set_err(err, err_len, "libsvm loader: no file name given");
    return -EINVAL;
  }
  gzFile gz = gzopen(path, "rb");
  if (gz == NULL) {
    int e = errno ? errno : ENOMEM;
    st_set_err(err, err_len, "%s: cannot open: %s", path, strerror(e));
    return -e;
  }
  int rc = read_all(&s, gz);
  gzclose(gz);
  if (rc == 0 && s.n == 0) {
    st_set_err(err, err_len, "%s: no examples (%s)", path,
               s.line == 0 ? "the file is empty" : "only blank lines");
    rc = -EBADMSG;
  }
  if (rc == 0)
    rc = settle_labels(&s, ds);
  if (rc != 0) {
    free(s.row_ptr);
    free(s.col);
    free(s.val);
    free(s.y);
    memset(ds, 0, sizeof(*ds));
    return rc;
  }
  s.row_ptr[s.n] = s.nnz;
  ds->n = s.n;
  ds->total = s.n;
  ds->shard_n = 1;
  ds->dim = s.max_index > min_dim ? s.max_index : min_dim;
  if (ds->dim == 0)
    ds->dim = 1; /* every value zero: still one input */
  ds->row_ptr = s.row_ptr;
  ds->col = s.col;
  ds->val = s.val;
  ds->y = s.y;
  ds->shape[0] = ds->dim;
  ds->shape_ndim = 1;
  ds->input_scale = 1.0;
  snprintf(ds->source, sizeof(ds->source), "%s", path);
  return 0;
}
