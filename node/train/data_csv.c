/* data_csv.c: the numeric CSV loader, see train.h.
 *
 * The format is the plain subset of RFC 4180 that numeric tables use: one
 * example per line, fields separated by commas, no quoting. Every field is
 * a finite number written the way strtod reads it, with optional spaces
 * around it. A first line with a field that is not a number is a header and
 * is skipped; it still fixes the number of columns. Empty lines are
 * skipped. One column is the label (classification: a non-negative integer
 * class index) or the target (regression: any finite real); the others are
 * the features, in file order. A file to predict on has no label column
 * (st_dataset_load_csv_features): every column is a feature.
 *
 * The file is read one line at a time with getline, and the example arrays
 * grow geometrically, so files of any size load in linear time. */
#include "node/train/train.h"
#include "node/train/train_internal.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Class indices are stored as floats, exact up to 2^24; a "class" far above
 * any real class count is almost certainly a regression target, so we stop
 * at 2^16 classes and say so rather than size a 16-million-way output. */
#define CSV_MAX_CLASSES (1u << 16)
/* Example arrays start with room for this many rows and then double. */
#define CSV_INITIAL_ROWS 1024

typedef enum {
  FIELD_OK,
  FIELD_EMPTY,
  FIELD_TEXT,     /* not a number at all */
  FIELD_NONFINITE /* NaN, Inf, or out of float range */
} field_kind_t;

/* Parses the field [s, end) in place (*end may be overwritten with a NUL). */
static field_kind_t parse_field(char* s, char* end, double* out) {
  while (s < end && isspace((unsigned char) *s))
    s++;
  while (end > s && isspace((unsigned char) end[-1]))
    end--;
  if (s == end)
    return FIELD_EMPTY;
  *end = '\0';
  char* stop = NULL;
  errno = 0;
  double v = strtod(s, &stop);
  if (stop != end)
    return FIELD_TEXT;
  /* strtod accepts "nan", "inf" and "infinity"; ERANGE on overflow gives
   * +-HUGE_VAL (underflow to a tiny value or 0 is fine). */
  if (!isfinite(v) || fabs(v) > FLT_MAX)
    return FIELD_NONFINITE;
  *out = v;
  return FIELD_OK;
}

/* Loader state, so that the per-line work can be a helper. */
typedef struct {
  const char* path;
  int label_col; /* resolved, >= 0; unused when no_label */
  int no_label;  /* every column is a feature (load_csv_features) */
  int regression;
  size_t ncols;  /* 0 until the first non-empty line */
  size_t n, cap; /* rows loaded, rows allocated */
  float* x;      /* cap x (ncols - 1) */
  float* y;      /* cap */
  double* row;   /* ncols scratch, parsed values of one line */
  unsigned max_label;
  char* err;
  size_t err_len;
} csv_t;

static size_t count_fields(const char* line) {
  size_t n = 1;
  for (const char* p = line; *p; p++)
    n += (*p == ',');
  return n;
}

/* Features per row: every column but the label's. */
static size_t features(const csv_t* c) {
  return c->no_label ? c->ncols : c->ncols - 1;
}

static int grow(csv_t* c) {
  size_t dim = features(c);
  size_t ncap = c->cap ? c->cap * 2 : CSV_INITIAL_ROWS;
  if (ncap < c->cap || ncap > SIZE_MAX / sizeof(float) / dim)
    goto nomem;
  float* nx = realloc(c->x, ncap * dim * sizeof(float));
  if (nx == NULL)
    goto nomem;
  c->x = nx;
  float* ny = realloc(c->y, ncap * sizeof(float));
  if (ny == NULL)
    goto nomem;
  c->y = ny;
  c->cap = ncap;
  return 0;
nomem:
  st_set_err(c->err, c->err_len, "%s: out of memory after %zu rows", c->path,
             c->n);
  return -ENOMEM;
}

/* Checks a line's number of fields, nf: on the first line, that there are
 * a feature and a label column (and allocates the row), else that it has
 * as many as the first. */
static int check_columns(csv_t* c, size_t nf, size_t lineno, int first) {
  if (first) {
    c->ncols = nf;
    if (nf < 2 && !c->no_label) {
      st_set_err(c->err, c->err_len,
                 "%s:%zu: only one column: a CSV needs at least one feature "
                 "column and a label column",
                 c->path, lineno);
      return -EBADMSG;
    }
    if (c->label_col < 0)
      c->label_col = (int) nf - 1;
    if (!c->no_label && (size_t) c->label_col >= nf) {
      st_set_err(c->err, c->err_len,
                 "%s:%zu: label column %d does not exist: the file has %zu "
                 "columns (0 to %zu)",
                 c->path, lineno, c->label_col, nf, nf - 1);
      return -EINVAL;
    }
    c->row = malloc(nf * sizeof(double));
    if (c->row == NULL) {
      st_set_err(c->err, c->err_len, "%s: out of memory", c->path);
      return -ENOMEM;
    }
  } else if (nf != c->ncols) {
    st_set_err(c->err, c->err_len,
               "%s:%zu: ragged row: %zu columns, but the first row has %zu",
               c->path, lineno, nf, c->ncols);
    return -EBADMSG;
  }

  return 0;
}

/* Parses the nf fields of line into c->row. Returns 0, 1 when the first
 * line is a header, or a negative errno. */
static int parse_fields(csv_t* c, char* line, size_t nf, size_t lineno,
                        int first) {
  /* Parse every field. On the first line a text field anywhere makes the
   * line a header (pandas writes an empty first name for the index column,
   * so an empty field there must not be reported before the text is seen);
   * otherwise the first bad field is the error. */
  char* p = line;
  char* bad = NULL;
  size_t bad_i = 0;
  field_kind_t bad_k = FIELD_OK;
  for (size_t i = 0; i < nf; i++) {
    char* end = strchr(p, ',');
    if (end == NULL)
      end = p + strlen(p);
    char* next = *end ? end + 1 : end;
    field_kind_t k = parse_field(p, end, &c->row[i]);
    if (k == FIELD_TEXT && first)
      return 1; /* a header */
    if (k != FIELD_OK && bad == NULL) {
      bad = p;
      bad_i = i;
      bad_k = k;
      if (!first)
        break;
    }
    p = next;
  }
  if (bad != NULL) {
    const char* why = bad_k == FIELD_EMPTY  ? "is empty"
                      : bad_k == FIELD_TEXT ? "is not a number"
                                            : "is not a finite 32-bit number";
    while (isspace((unsigned char) *bad))
      bad++;
    st_set_err(c->err, c->err_len, "%s:%zu: field %zu (\"%.40s\") %s", c->path,
               lineno, bad_i + 1, bad, why);
    return -EBADMSG;
  }

  return 0;
}

/* Checks a classification label: a class index within CSV_MAX_CLASSES. */
static int check_label(csv_t* c, double label, size_t lineno) {
  if (label < 0 || label != floor(label)) {
    st_set_err(c->err, c->err_len,
               "%s:%zu: label %g in column %d is not a non-negative integer "
               "class index (load real-valued targets as regression)",
               c->path, lineno, label, c->label_col);
    return -EBADMSG;
  }
  if (label >= CSV_MAX_CLASSES) {
    st_set_err(c->err, c->err_len,
               "%s:%zu: label %g in column %d is too large: at most %u "
               "classes are supported (load real-valued targets as "
               "regression)",
               c->path, lineno, label, c->label_col, CSV_MAX_CLASSES);
    return -EBADMSG;
  }
  if ((unsigned) label > c->max_label)
    c->max_label = (unsigned) label;
  return 0;
}

/* Handles one line with its newline removed. lineno is 1-based. */
static int csv_line(csv_t* c, char* line, size_t lineno, int first) {
  size_t nf = count_fields(line);
  int rc = check_columns(c, nf, lineno, first);
  if (rc == 0)
    rc = parse_fields(c, line, nf, lineno, first);
  if (rc != 0)
    return rc < 0 ? rc : 0; /* 1: a header */

  int labelled = !c->no_label;
  double label = labelled ? c->row[c->label_col] : 0.0;
  if (labelled && !c->regression) {
    rc = check_label(c, label, lineno);
    if (rc != 0)
      return rc;
  }

  if (c->n == c->cap) {
    rc = grow(c);
    if (rc != 0)
      return rc;
  }
  float* dst = c->x + c->n * features(c);
  for (size_t i = 0, j = 0; i < nf; i++)
    if (!labelled || i != (size_t) c->label_col)
      dst[j++] = (float) c->row[i];
  c->y[c->n] = (float) label;
  c->n++;
  return 0;
}

/* Reads f line by line into c, skipping blank lines; *lineno_out: the
 * number of lines read. */
static int read_rows(csv_t* c, FILE* f, size_t* lineno_out) {
  size_t lineno = 0;
  char* line = NULL;
  size_t line_cap = 0;
  int rc = 0;
  int first = 1;
  ssize_t len;
  errno = 0;
  while ((len = getline(&line, &line_cap, f)) >= 0) {
    lineno++;
    char* s = line;
    /* A UTF-8 byte order mark, as spreadsheet exports write. */
    if (lineno == 1 && len >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0)
      s += 3;
    if ((size_t) len != strlen(line)) {
      st_set_err(c->err, c->err_len,
                 "%s:%zu: NUL byte in line: not a text file", c->path, lineno);
      rc = -EBADMSG;
      goto out;
    }
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
      line[--len] = '\0';
    char* t = s;
    while (isspace((unsigned char) *t))
      t++;
    if (*t == '\0')
      continue;
    rc = csv_line(c, s, lineno, first);
    if (rc != 0)
      goto out;
    first = 0;
  }
  if (ferror(f)) {
    rc = errno ? -errno : -EIO;
    st_set_err(c->err, c->err_len, "%s: read error after line %zu: %s", c->path,
               lineno, strerror(-rc));
  }
out:
  *lineno_out = lineno;
  free(line);
  return rc;
}

/* Hands the rows read into c over to ds, giving back the unused tail of
 * the buffers. */
static void take_rows(st_dataset_t* ds, csv_t* c) {
  ds->n = c->n;
  ds->total = ds->n;
  ds->shard_k = 0;
  ds->shard_n = 1;
  ds->dim = features(c);
  ds->n_classes = c->regression || c->no_label
                      ? 0
                      : (c->max_label + 1 < 2 ? 2 : c->max_label + 1);
  ds->shape[0] = ds->dim;
  ds->shape_ndim = 1;
  ds->input_scale = 1.0;
  /* Give back the unused tail of the geometric growth. */
  float* nx = realloc(c->x, c->n * ds->dim * sizeof(float));
  if (nx != NULL)
    c->x = nx;
  float* ny = realloc(c->y, c->n * sizeof(float));
  if (ny != NULL)
    c->y = ny;
  ds->x = c->x;
  ds->y = c->y;
  c->x = NULL;
  c->y = NULL;
  snprintf(ds->source, sizeof(ds->source), "%s", c->path);
}

/* Both loaders: opt NULL for a file of features only. */
static int load_csv(st_dataset_t* ds, const char* path,
                    const st_csv_options_t* opt, char* err, size_t err_len) {
  csv_t c;
  FILE* f = NULL;
  int rc = 0;

  memset(ds, 0, sizeof(*ds));
  memset(&c, 0, sizeof(c));
  c.path = path;
  c.label_col = opt ? opt->label_col : -1;
  c.regression = opt ? opt->regression : 0;
  c.no_label = opt == NULL;
  c.err = err;
  c.err_len = err_len;
  if (path == NULL) {
    st_set_err(err, err_len, "CSV loader: no file name given");
    return -EINVAL;
  }
  if (c.label_col < -1) {
    st_set_err(err, err_len,
               "%s: label column %d is invalid: use a column index from 0, or "
               "-1 for the last column",
               path, c.label_col);
    return -EINVAL;
  }

  f = fopen(path, "r");
  if (f == NULL) {
    rc = -errno;
    st_set_err(err, err_len, "%s: cannot open: %s", path, strerror(errno));
    return rc;
  }

  size_t lineno = 0;
  rc = read_rows(&c, f, &lineno);
  if (rc != 0)
    goto out;
  if (c.n == 0) {
    st_set_err(err, err_len, "%s: no data rows%s", path,
               lineno == 0 ? " (the file is empty)" : "");
    rc = -EBADMSG;
    goto out;
  }

  take_rows(ds, &c);

out:
  if (f != NULL)
    fclose(f);
  free(c.row);
  free(c.x);
  free(c.y);
  return rc;
}

int st_dataset_load_csv(st_dataset_t* ds, const char* path,
                        const st_csv_options_t* opt, char* err,
                        size_t err_len) {
  static const st_csv_options_t defaults = {-1, 0};
  return load_csv(ds, path, opt ? opt : &defaults, err, err_len);
}

int st_dataset_load_csv_features(st_dataset_t* ds, const char* path, char* err,
                                 size_t err_len) {
  return load_csv(ds, path, NULL, err, err_len);
}
