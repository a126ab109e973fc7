/* test_data.c: the Check suite of the data layer (node/data*.c): the IDX and
 * CSV loaders on small generated files (raw and gzip), every corruption
 * they must refuse with a sentence naming the file and the problem, data
 * specs, normalization, sharding, the epoch shuffle and gathering. Loads
 * the real Fashion-MNIST when the Debian package is installed. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "node/train/train.h"
#include "tests/unit/testutil.h"

static char tmp[256];

static void setup(void) {
  ck_assert_int_eq(tu_mkdtemp(tmp, sizeof(tmp)), 0);
}

static void teardown(void) {
  tu_rmtree(tmp);
}

static void path_in_tmp(char* buf, size_t len, const char* name) {
  ck_assert_uint_lt((size_t) snprintf(buf, len, "%s/%s", tmp, name), len);
}

/* Writes data to path, gzip-compressed when gz is set. */
static void write_maybe_gz(const char* path, const void* data, size_t len,
                           int gz) {
  if (!gz) {
    ck_assert_int_eq(tu_write_file(path, data, len), 0);
    return;
  }
  gzFile f = gzopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  if (len > 0)
    ck_assert_int_eq(gzwrite(f, data, (unsigned) len), (int) len);
  ck_assert_int_eq(gzclose(f), Z_OK);
}

/* ==== IDX ================================================================= */

/* How to build one IDX file: magic bytes, dims, and how to damage it. */
typedef struct {
  unsigned char magic[4];
  uint32_t dims[3];
  long body_delta; /* bytes added to (or cut from) the declared body */
  size_t cut_to;   /* when non-zero, keep only this many bytes in all */
} idx_build_t;

static const idx_build_t good_images = {{0, 0, 8, 3}, {5, 3, 4}, 0, 0};
static const idx_build_t good_labels = {{0, 0, 8, 1}, {5, 0, 0}, 0, 0};

static unsigned char pixel_at(size_t i) {
  return (unsigned char) (i * 37 + 11);
}

static void write_idx(const char* path, const idx_build_t* b, int gz) {
  unsigned char buf[4096];
  int nd = b->magic[3] > 3 ? 3 : b->magic[3];
  size_t len = 4, body = 1;
  memcpy(buf, b->magic, 4);
  for (int i = 0; i < nd; i++) {
    uint32_t d = b->dims[i];
    buf[len++] = (unsigned char) (d >> 24);
    buf[len++] = (unsigned char) (d >> 16);
    buf[len++] = (unsigned char) (d >> 8);
    buf[len++] = (unsigned char) d;
    body *= d;
  }
  body = (size_t) ((long) body + b->body_delta);
  if (b->cut_to > 0)
    body = b->cut_to > len ? b->cut_to - len : 0;
  ck_assert_uint_lt(len + body, sizeof(buf));
  /* Labels cycle 0..3; images get a fixed pattern. */
  for (size_t i = 0; i < body; i++)
    buf[len + i] = nd == 1 ? (unsigned char) (i % 4) : pixel_at(i);
  len += body;
  if (b->cut_to > 0)
    len = b->cut_to;
  write_maybe_gz(path, buf, len, gz);
}

START_TEST(idx_round_trip) {
  for (int gz = 0; gz < 2; gz++) {
    char im[512], lb[512], err[512] = "";
    /* The name says nothing: compression is found from the content. */
    path_in_tmp(im, sizeof(im), gz ? "images-gz.bin" : "images.idx");
    path_in_tmp(lb, sizeof(lb), gz ? "labels.gz" : "labels.idx");
    write_idx(im, &good_images, gz);
    write_idx(lb, &good_labels, gz);
    st_dataset_t ds;
    ck_assert_int_eq(st_dataset_load_idx(&ds, im, lb, err, sizeof(err)), 0);
    ck_assert_uint_eq(ds.n, 5);
    ck_assert_uint_eq(ds.dim, 12);
    ck_assert_uint_eq(ds.n_classes, 4); /* labels 0 1 2 3 0 */
    for (size_t i = 0; i < 5 * 12; i++)
      ck_assert_float_eq_tol(ds.x[i], pixel_at(i) / 255.0f, 1e-7f);
    for (size_t i = 0; i < 5; i++)
      ck_assert_float_eq(ds.y[i], i % 4);
    ck_assert_ptr_nonnull(strstr(ds.source, im));
    st_dataset_free(&ds);
    st_dataset_free(&ds); /* idempotent */
  }
}
END_TEST

START_TEST(idx_one_label_value_two_classes) {
  /* A 1-D image file of 2 images, both labelled 0: still 2 classes. */
  char im[512], lb[512], err[512] = "";
  idx_build_t b = {{0, 0, 8, 2}, {2, 7, 0}, 0, 0};
  path_in_tmp(im, sizeof(im), "im");
  path_in_tmp(lb, sizeof(lb), "lb");
  write_idx(im, &b, 0);
  unsigned char labels[] = {0, 0, 8, 1, 0, 0, 0, 2, 0, 0};
  ck_assert_int_eq(tu_write_file(lb, labels, sizeof(labels)), 0);
  st_dataset_t ds;
  ck_assert_int_eq(st_dataset_load_idx(&ds, im, lb, err, sizeof(err)), 0);
  ck_assert_uint_eq(ds.dim, 7);
  ck_assert_uint_eq(ds.n_classes, 2);
  st_dataset_free(&ds);
}
END_TEST

typedef struct {
  const char* name;
  idx_build_t images, labels;
  int bad_is_labels; /* which file the message must name */
  const char* want[2];
} idx_bad_t;

#define IM(m3, d0, d1, d2, delta, cut) \
  { {0, 0, 8, m3}, {d0, d1, d2}, delta, cut }
#define LB(d0, delta, cut) \
  { {0, 0, 8, 1}, {d0, 0, 0}, delta, cut }

/* Laid out by hand: one case per two lines reads better as a table. */
// clang-format off
static const idx_bad_t idx_bad[] = {
  {"wrong magic", {{0x12, 0x34, 8, 3}, {5, 3, 4}, 0, 0}, LB(5, 0, 0), 0,
   {"not an IDX file", "wrong magic 12 34 08 03"}},
  {"wrong type byte", {{0, 0, 0x0D, 3}, {5, 3, 4}, 0, 0}, LB(5, 0, 0), 0,
   {"wrong data type byte 0x0d", "unsigned bytes"}},
  {"labels given as images", LB(5, 0, 0), LB(5, 0, 0), 0,
   {"expected an IDX image file", "looks like a label file"}},
  {"images given as labels", IM(3, 5, 3, 4, 0, 0), IM(3, 5, 3, 4, 0, 0), 1,
   {"expected an IDX label file", "looks like an image file"}},
  {"empty file", IM(3, 5, 3, 4, 0, 0), LB(5, 0, 0), 1,
   {"empty file", NULL}},
  {"truncated magic", IM(3, 5, 3, 4, 0, 2), LB(5, 0, 0), 0,
   {"truncated header", "ends after 2 bytes"}},
  {"truncated header", IM(3, 5, 3, 4, 0, 10), LB(5, 0, 0), 0,
   {"truncated header", "declares 3 dimensions (16 header bytes) but the "
                        "file ends after 10 bytes"}},
  {"truncated body", IM(3, 5, 3, 4, -30, 0), LB(5, 0, 0), 0,
   {"truncated: header declares 5 images of 3x4 (60 bytes) but the file "
    "ends after 30 bytes", NULL}},
  {"trailing bytes", IM(3, 5, 3, 4, 7, 0), LB(5, 0, 0), 0,
   {"trailing bytes", "but 7 more bytes follow them"}},
  {"zero dimension", IM(3, 5, 0, 4, 0, 0), LB(5, 0, 0), 0,
   {"zero dimension", "dimension 1"}},
  {"zero count", IM(3, 0, 3, 4, 0, 0), LB(0, 0, 0), 0,
   {"zero dimension", "the count"}},
  {"count mismatch", IM(3, 5, 3, 4, 0, 0), LB(4, 0, 0), 1,
   {"count mismatch: 4 labels", "has 5 images"}},
  {"labels truncated", IM(3, 5, 3, 4, 0, 0), LB(5, -2, 0), 1,
   {"truncated: header declares 5 labels (5 bytes) but the file ends "
    "after 3 bytes", NULL}},
  {"labels trailing", IM(3, 5, 3, 4, 0, 0), LB(5, 1, 0), 1,
   {"trailing bytes", "1 more bytes"}},
  {"overflowing dims", IM(3, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0, 16),
   LB(5, 0, 0), 0, {"dimensions too large", NULL}},
};
// clang-format on

START_TEST(idx_refuses) {
  const idx_bad_t* c = &idx_bad[_i / 2];
  int gz = _i % 2;
  char im[512], lb[512], err[512] = "";
  path_in_tmp(im, sizeof(im), "images");
  path_in_tmp(lb, sizeof(lb), "labels");
  write_idx(im, &c->images, gz);
  if (strcmp(c->name, "empty file") == 0)
    write_maybe_gz(lb, "", 0, gz);
  else
    write_idx(lb, &c->labels, gz);
  st_dataset_t ds;
  int rc = st_dataset_load_idx(&ds, im, lb, err, sizeof(err));
  ck_assert_msg(rc < 0, "%s (gz %d): accepted", c->name, gz);
  ck_assert_ptr_null(ds.x);
  const char* who = c->bad_is_labels ? lb : im;
  ck_assert_msg(strncmp(err, who, strlen(who)) == 0 && err[strlen(who)] == ':',
                "%s: message does not start with %s: %s", c->name, who, err);
  for (int k = 0; k < 2; k++)
    if (c->want[k] != NULL)
      ck_assert_msg(strstr(err, c->want[k]) != NULL,
                    "%s (gz %d): '%s' not in: %s", c->name, gz, c->want[k],
                    err);
  st_dataset_free(&ds);
}
END_TEST

START_TEST(idx_missing_file) {
  char im[512], lb[512], err[512] = "";
  path_in_tmp(im, sizeof(im), "nope-images.gz");
  path_in_tmp(lb, sizeof(lb), "nope-labels.gz");
  st_dataset_t ds;
  ck_assert_int_eq(st_dataset_load_idx(&ds, im, lb, err, sizeof(err)), -ENOENT);
  ck_assert_ptr_nonnull(strstr(err, im));
  ck_assert_ptr_nonnull(strstr(err, "No such file"));
  /* err may be NULL. */
  ck_assert_int_eq(st_dataset_load_idx(&ds, im, lb, NULL, 0), -ENOENT);
}
END_TEST

/* Damaged gzip streams: a cut trailer, a cut body, a bad checksum. */
START_TEST(idx_bad_gzip) {
  char im[512], lb[512], err[512];
  path_in_tmp(im, sizeof(im), "images.gz");
  path_in_tmp(lb, sizeof(lb), "labels.gz");
  write_idx(lb, &good_labels, 1);
  static const struct {
    int cut;  /* bytes removed from the end */
    int flip; /* offset from the end of a byte to corrupt */
    const char* want;
  } cases[] = {{4, 0, "checksum trailer is missing"},
               {12, 0, "gzip stream is cut short"},
               {0, 7, "incorrect data check"}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    write_idx(im, &good_images, 1);
    FILE* f = fopen(im, "rb");
    unsigned char buf[4096];
    size_t len = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    if (cases[i].flip)
      buf[len - (size_t) cases[i].flip] ^= 0xFF;
    len -= (size_t) cases[i].cut;
    ck_assert_int_eq(tu_write_file(im, buf, len), 0);
    st_dataset_t ds;
    err[0] = '\0';
    ck_assert_int_lt(st_dataset_load_idx(&ds, im, lb, err, sizeof(err)), 0);
    ck_assert_msg(strstr(err, im) && strstr(err, cases[i].want), "case %zu: %s",
                  i, err);
  }
}
END_TEST

/* ==== CSV ================================================================= */

typedef struct {
  const char* text;
  int label_col, regression;
  size_t n, dim, n_classes;
  float x[8], y[4];
} csv_good_t;

// clang-format off
static const csv_good_t csv_good[] = {
  /* text, label_col, regression, n, dim, n_classes, x, y */
  {"a,b,label\n1,2,0\n3,4,1\n", -1, 0, 2, 2, 2, {1, 2, 3, 4}, {0, 1}},
  {"1,2,0\n\n3,4,2\n   \n", -1, 0, 2, 2, 3, {1, 2, 3, 4}, {0, 2}},
  {"0,1.5,2.5\r\n1,3.5,4.5\r\n", 0, 0, 2, 2, 2, {1.5f, 2.5f, 3.5f, 4.5f},
   {0, 1}},
  {"f1,label,f2\n1,0,2\n3,1.0,4", 1, 0, 2, 2, 2, {1, 2, 3, 4}, {0, 1}},
  /* A byte order mark, spaces, exponents, regression. */
  {"\xEF\xBB\xBFx,y\n1.5,-2.25\n 2 , 3e2 \n-1e-3,0\n", -1, 1, 3, 1, 0,
   {1.5f, 2, -1e-3f}, {-2.25f, 300, 0}},
  {"7,7\n", -1, 0, 1, 1, 8, {7}, {7}},
  /* pandas' to_csv header: an empty name for the index column. */
  {",f,label\n0,1.5,1\n", -1, 0, 1, 2, 2, {0, 1.5f}, {1}},
};
// clang-format on

START_TEST(csv_loads) {
  const csv_good_t* c = &csv_good[_i];
  char p[512], err[512] = "";
  path_in_tmp(p, sizeof(p), "good.csv");
  ck_assert_int_eq(tu_write_file(p, c->text, strlen(c->text)), 0);
  st_csv_options_t opt = {c->label_col, c->regression};
  st_dataset_t ds;
  ck_assert_msg(st_dataset_load_csv(&ds, p, &opt, err, sizeof(err)) == 0,
                "case %d: %s", _i, err);
  ck_assert_uint_eq(ds.n, c->n);
  ck_assert_uint_eq(ds.dim, c->dim);
  ck_assert_uint_eq(ds.n_classes, c->n_classes);
  for (size_t i = 0; i < c->n * c->dim; i++)
    ck_assert_float_eq_tol(ds.x[i], c->x[i], 1e-6f);
  for (size_t i = 0; i < c->n; i++)
    ck_assert_float_eq(ds.y[i], c->y[i]);
  st_dataset_free(&ds);
}
END_TEST

typedef struct {
  const char* text;
  int label_col, regression;
  const char* want[2];
} csv_bad_t;

static const csv_bad_t csv_bad[] = {
    {"1,2,0\n3,abc,1\n", -1, 0, {":2: field 2 (\"abc\") is not a number", 0}},
    {"a,b,c\n1,2,0\n\n3,x,1\n", -1, 0, {":4: field 2", "not a number"}},
    {"1,2,0\n3,4\n", -1, 0, {":2: ragged row: 2 columns", "first row has 3"}},
    {"1,2,-1\n", -1, 0, {":1: label -1", "not a non-negative integer"}},
    {"1,2,0\n1,2,0.5\n", -1, 0, {":2: label 0.5", "regression"}},
    {"1,2,1e9\n", -1, 0, {":1: label 1e+09", "too large"}},
    {"1,nan,0\n", -1, 0, {":1: field 2 (\"nan\")", "not a finite"}},
    {"1,2,0\ninf,2,0\n", -1, 1, {":2: field 1", "not a finite"}},
    {"1,1e39,0\n", -1, 1, {":1: field 2", "not a finite 32-bit"}},
    {"1,,0\n", -1, 0, {":1: field 2", "is empty"}},
    {"1,2,\n", -1, 1, {":1: field 3", "is empty"}},
    {"", -1, 0, {"no data rows", "empty"}},
    {"a,b,c\n\n", -1, 0, {"no data rows", NULL}},
    {"1\n2\n", -1, 1, {":1: only one column", NULL}},
    {"1,2,0\n", 5, 0, {"label column 5 does not exist", "3 columns"}},
    {"1,2,0\n", -2, 0, {"label column -2 is invalid", NULL}},
};

START_TEST(csv_refuses) {
  const csv_bad_t* c = &csv_bad[_i];
  char p[512], err[512] = "";
  path_in_tmp(p, sizeof(p), "bad.csv");
  ck_assert_int_eq(tu_write_file(p, c->text, strlen(c->text)), 0);
  st_csv_options_t opt = {c->label_col, c->regression};
  st_dataset_t ds;
  ck_assert_msg(st_dataset_load_csv(&ds, p, &opt, err, sizeof(err)) < 0,
                "case %d accepted", _i);
  ck_assert_ptr_null(ds.x);
  ck_assert_msg(strncmp(err, p, strlen(p)) == 0, "case %d: %s", _i, err);
  for (int k = 0; k < 2; k++)
    if (c->want[k] != NULL)
      ck_assert_msg(strstr(err, c->want[k]) != NULL, "case %d: '%s' not in %s",
                    _i, c->want[k], err);
}
END_TEST

START_TEST(csv_large) {
  /* Enough rows to grow the arrays many times. */
  const size_t rows = 50000;
  char p[512], err[512] = "";
  path_in_tmp(p, sizeof(p), "large.csv");
  FILE* f = fopen(p, "w");
  fprintf(f, "a,b,c,label\n");
  for (size_t i = 0; i < rows; i++)
    fprintf(f, "%zu,%zu.5,-%zu,%zu\n", i, i % 100, i % 7, i % 10);
  fclose(f);
  st_dataset_t ds;
  ck_assert_int_eq(st_dataset_load_csv(&ds, p, NULL, err, sizeof(err)), 0);
  ck_assert_uint_eq(ds.n, rows);
  ck_assert_uint_eq(ds.dim, 3);
  ck_assert_uint_eq(ds.n_classes, 10);
  for (size_t i = 0; i < rows; i += 997) {
    ck_assert_float_eq(ds.x[i * 3], (float) i);
    ck_assert_float_eq(ds.x[i * 3 + 1], (float) (i % 100) + 0.5f);
    ck_assert_float_eq(ds.x[i * 3 + 2], -(float) (i % 7));
    ck_assert_float_eq(ds.y[i], (float) (i % 10));
  }
  st_dataset_free(&ds);
  ck_assert_int_eq(
      st_dataset_load_csv(&ds, "/nonexistent/x.csv", NULL, err, sizeof(err)),
      -ENOENT);
  ck_assert_ptr_nonnull(strstr(err, "/nonexistent/x.csv: cannot open"));
}
END_TEST

/* ==== Specs ================================================================
 */

static int open_shard(st_data_t* d, const char* spec, int normalize, uint32_t k,
                      uint32_t n, char* err, size_t len) {
  st_data_options_t opt = {{-1, 0}, normalize, k, n};
  return st_data_open(d, spec, &opt, err, len);
}

static int open_spec(st_data_t* d, const char* spec, int normalize, char* err,
                     size_t len) {
  return open_shard(d, spec, normalize, 0, 0, err, len);
}

START_TEST(spec_bad) {
  static const char* const bad[] = {"",      "foo",       "fashion-mnist:x",
                                    "idx:a", "idx:a,b,c", "idx:a,,c,d",
                                    "csv:",  "csv:a,b,c", "idx:a,b,c,d,e"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    st_data_t d;
    char err[512] = "";
    ck_assert_int_eq(open_spec(&d, bad[i], 0, err, sizeof(err)), -EINVAL);
    ck_assert_msg(strstr(err, "spec"), "%s: %s", bad[i], err);
    st_data_close(&d);
    st_data_close(&d);
  }
}
END_TEST

static double mean_of(const float* x, size_t n, size_t stride, double* sd) {
  double s = 0, q = 0;
  for (size_t i = 0; i < n; i++)
    s += x[i * stride];
  double m = s / (double) n;
  for (size_t i = 0; i < n; i++)
    q += (x[i * stride] - m) * (x[i * stride] - m);
  *sd = sqrt(q / (double) n);
  return m;
}

/* The good image file (gzip) and label file (raw) in the scratch
 * directory; their paths into im and lb (512 bytes each). */
static void write_good_pair(char* im, char* lb) {
  path_in_tmp(im, 512, "im.gz");
  path_in_tmp(lb, 512, "lb");
  write_idx(im, &good_images, 1);
  write_idx(lb, &good_labels, 0);
}

START_TEST(spec_idx_normalized) {
  char im[512], lb[512], spec[2200], err[512] = "";
  write_good_pair(im, lb);
  snprintf(spec, sizeof(spec), "idx:%s,%s,%s,%s", im, lb, im, lb);
  st_data_t d;
  ck_assert_int_eq(open_spec(&d, spec, 1, err, sizeof(err)), 0);
  ck_assert_uint_eq(d.test.n, 5);
  ck_assert_str_eq(d.spec, spec);
  double sd, m = mean_of(d.train.x, 60, 1, &sd);
  ck_assert_double_eq_tol(m, 0, 1e-6);
  ck_assert_double_eq_tol(sd, 1, 1e-5);
  /* The same file as test set gets the training set's transform. */
  for (size_t i = 0; i < 60; i++)
    ck_assert_float_eq(d.test.x[i], d.train.x[i]);
  st_data_close(&d);
  st_data_close(&d);
}
END_TEST

/* Shard k of n holds rows k, k + n, ... of the whole set, bit for bit as
 * the whole set normalizes them (statistics of the whole file), with the
 * whole file's classes and a whole test set. */
static void check_shards(const char* spec, size_t rows) {
  char err[512] = "";
  st_data_t whole;
  ck_assert_int_eq(open_spec(&whole, spec, 1, err, sizeof(err)), 0);
  ck_assert_uint_eq(whole.train.n, rows);
  ck_assert_uint_eq(whole.train.total, rows);
  for (uint32_t n = 2; n <= 3; n++)
    for (uint32_t k = 0; k < n; k++) {
      st_data_t s;
      ck_assert_int_eq(open_shard(&s, spec, 1, k, n, err, sizeof(err)), 0);
      ck_assert_uint_eq(s.train.total, rows);
      ck_assert_uint_eq(s.train.shard_k, k);
      ck_assert_uint_eq(s.train.shard_n, n);
      ck_assert_uint_eq(s.train.n, (rows - k + n - 1) / n);
      ck_assert_uint_eq(s.train.n_classes, whole.train.n_classes);
      ck_assert_uint_eq(s.test.n, whole.test.n);
      size_t dim = whole.train.dim;
      for (size_t j = 0; j < s.train.n; j++) {
        size_t i = k + j * n;
        ck_assert_float_eq(s.train.y[j], whole.train.y[i]);
        ck_assert_int_eq(memcmp(s.train.x + j * dim, whole.train.x + i * dim,
                                dim * sizeof(float)),
                         0);
      }
      ck_assert_int_eq(
          memcmp(s.test.x, whole.test.x, whole.test.n * dim * sizeof(float)),
          0);
      st_data_close(&s);
    }
  st_data_t bad;
  ck_assert_int_eq(open_shard(&bad, spec, 1, 3, 3, err, sizeof(err)), -EINVAL);
  ck_assert_msg(strstr(err, "bad shard 3/3") != NULL, "%s", err);
  st_data_close(&whole);
}

START_TEST(spec_shards) {
  char im[512], lb[512], tr[512], spec[2200];
  write_good_pair(im, lb);
  snprintf(spec, sizeof(spec), "idx:%s,%s,%s,%s", im, lb, im, lb);
  check_shards(spec, 5);
  path_in_tmp(tr, sizeof(tr), "train.csv");
  const char* train = "1,5,0\n2,5,1\n3,7,0\n6,5,1\n4,4,2\n9,1,0\n8,2,1\n";
  ck_assert_int_eq(tu_write_file(tr, train, strlen(train)), 0);
  snprintf(spec, sizeof(spec), "csv:%s,%s", tr, tr);
  check_shards(spec, 7);
}
END_TEST

/* A trainer over a shard that was loaded alone takes exactly the steps of
 * one over the whole set told to train that shard. */
START_TEST(trainer_on_loaded_shard) {
  char im[512], lb[512], spec[2200], err[512] = "";
  write_good_pair(im, lb);
  snprintf(spec, sizeof(spec), "idx:%s,%s", im, lb);
  st_backend_t* be = NULL;
  ck_assert_int_eq(st_backend_open(&be, "cpu", 1, err, sizeof(err)), 0);
  st_train_config_t cfg;
  st_train_config_default(&cfg);
  ck_assert_int_eq(
      st_model_spec_parse("mlp:12-8-4", &cfg.model, err, sizeof(err)), 0);
  cfg.batch = 1;
  cfg.shard_k = 1;
  cfg.shard_n = 2;
  st_data_t whole, part;
  ck_assert_int_eq(open_spec(&whole, spec, 1, err, sizeof(err)), 0);
  ck_assert_int_eq(open_shard(&part, spec, 1, 1, 2, err, sizeof(err)), 0);
  st_trainer_t a, b;
  ck_assert_int_eq(
      st_trainer_init(&a, be, &whole.train, &cfg, err, sizeof(err)), 0);
  ck_assert_msg(
      st_trainer_init(&b, be, &part.train, &cfg, err, sizeof(err)) == 0, "%s",
      err);
  ck_assert_uint_eq(a.steps_per_epoch, b.steps_per_epoch);
  for (int s = 0; s < 7; s++) { /* over three epochs of 2 */
    double la, lb2;
    ck_assert_int_eq(st_trainer_step(&a, &la), 0);
    ck_assert_int_eq(st_trainer_step(&b, &lb2), 0);
    ck_assert_double_eq(la, lb2);
  }
  ck_assert_int_eq(
      memcmp(a.model.params, b.model.params, a.model.n_params * sizeof(float)),
      0);
  st_trainer_close(&b);
  /* The shard loaded is the one the trainer must use. */
  cfg.shard_k = 0;
  ck_assert_int_eq(st_trainer_init(&b, be, &part.train, &cfg, err, sizeof(err)),
                   -EINVAL);
  ck_assert_msg(strstr(err,
                       "was loaded as shard 1/2, but training wants "
                       "shard 0/2") != NULL,
                "%s", err);
  st_trainer_close(&a);
  st_data_close(&whole);
  st_data_close(&part);
  st_backend_close(be);
}
END_TEST

START_TEST(spec_csv) {
  char tr[512], te[512], te4[512], spec[1100], err[512] = "";
  path_in_tmp(tr, sizeof(tr), "train.csv");
  path_in_tmp(te, sizeof(te), "test.csv");
  path_in_tmp(te4, sizeof(te4), "test4.csv");
  const char* train = "x,c,y\n1,5,0\n2,5,1\n3,5,0\n6,5,1\n";
  const char* test = "2,5,3\n";
  ck_assert_int_eq(tu_write_file(tr, train, strlen(train)), 0);
  ck_assert_int_eq(tu_write_file(te, test, strlen(test)), 0);
  ck_assert_int_eq(tu_write_file(te4, "1,2,3,0\n", 8), 0);

  st_data_t d;
  snprintf(spec, sizeof(spec), "csv:%s,%s", tr, te);
  ck_assert_int_eq(open_spec(&d, spec, 1, err, sizeof(err)), 0);
  /* A test label beyond the training classes widens both. */
  ck_assert_uint_eq(d.train.n_classes, 4);
  ck_assert_uint_eq(d.test.n_classes, 4);
  /* Per feature: x is standardized, the constant column only centred. */
  double sd, m = mean_of(d.train.x, 4, 2, &sd);
  ck_assert_double_eq_tol(m, 0, 1e-6);
  ck_assert_double_eq_tol(sd, 1, 1e-5);
  for (size_t i = 0; i < 4; i++)
    ck_assert_float_eq(d.train.x[2 * i + 1], 0);
  /* x mean 3, population sd sqrt(3.5). */
  ck_assert_float_eq_tol(d.test.x[0], (float) (-1 / sqrt(3.5)), 1e-6f);
  ck_assert_float_eq(d.test.x[1], 0);
  st_data_close(&d);

  snprintf(spec, sizeof(spec), "csv:%s,%s", tr, te4);
  ck_assert_int_eq(open_spec(&d, spec, 0, err, sizeof(err)), -EINVAL);
  ck_assert_msg(strstr(err, "test set") && strstr(err, te4) &&
                    strstr(err, "3 features per example") &&
                    strstr(err, "has 2"),
                "%s", err);
  ck_assert_ptr_null(d.train.x);
  st_data_close(&d);

  snprintf(spec, sizeof(spec), "csv:%s", tr);
  ck_assert_int_eq(open_spec(&d, spec, 0, err, sizeof(err)), 0);
  ck_assert_uint_eq(d.test.n, 0);
  ck_assert_float_eq(d.train.x[0], 1); /* not normalized */
  st_data_close(&d);
}
END_TEST

START_TEST(spec_fashion_missing) {
  st_data_t d;
  char err[1024] = "", want[512];
  setenv("STARLING_FASHION_MNIST_DIR", tmp, 1);
  ck_assert_int_eq(open_spec(&d, "fashion-mnist", 0, err, sizeof(err)),
                   -ENOENT);
  snprintf(want, sizeof(want), "Fashion-MNIST not found in %s", tmp);
  ck_assert_msg(strstr(err, want), "%s", err);
  ck_assert_msg(strstr(err, "sudo apt-get install dataset-fashion-mnist"), "%s",
                err);
  ck_assert_msg(strstr(err, "STARLING_FASHION_MNIST_DIR"), "%s", err);
  unsetenv("STARLING_FASHION_MNIST_DIR");
}
END_TEST

START_TEST(spec_fashion_real) {
  if (access(ST_FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz", R_OK) != 0)
    return; /* the package is not installed here */
  unsetenv("STARLING_FASHION_MNIST_DIR");
  st_data_t d;
  char err[1024] = "";
  const char* spec = _i == 0 ? "fashion-mnist" : "fashion-mnist:train";
  ck_assert_msg(open_spec(&d, spec, _i == 0, err, sizeof(err)) == 0, "%s", err);
  ck_assert_uint_eq(d.train.n, 60000);
  ck_assert_uint_eq(d.train.dim, 784);
  ck_assert_uint_eq(d.test.n, 10000);
  ck_assert_uint_eq(d.test.dim, 784);
  ck_assert_uint_eq(d.train.n_classes, 10);
  ck_assert_uint_eq(d.test.n_classes, 10);
  double sd, m = mean_of(d.train.x, 60000 * 784, 1, &sd);
  if (_i == 0) {
    ck_assert_double_eq_tol(m, 0, 1e-4);
    ck_assert_double_eq_tol(sd, 1, 1e-4);
  } else {
    ck_assert(m > 0.2 && m < 0.4); /* Fashion-MNIST's mean pixel is 0.286 */
  }
  size_t per_class[10] = {0};
  for (size_t i = 0; i < 60000; i++)
    per_class[(size_t) d.train.y[i]]++;
  for (int c = 0; c < 10; c++)
    ck_assert_uint_eq(per_class[c], 6000);
  st_data_close(&d);
}
END_TEST

/* ==== Shards, epochs, gather ================================================
 */

START_TEST(shard_parse) {
  static const struct {
    const char* s;
    uint32_t k, n;
  } good[] = {{"0/1", 0, 1},
              {"1/2", 1, 2},
              {"6/7", 6, 7},
              {"007/010", 7, 10},
              {"4294967294/4294967295", 4294967294u, 4294967295u}};
  static const char* const bad[] = {
      "1/0",  "2/2", "3/2",  "a/b",          "1/2x", "",
      "/2",   "1/",  "-1/2", "+1/2",         " 1/2", "1/2 ",
      "1//2", "1",   "0/0",  "1/4294967296", "1/2/3"};
  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
    uint32_t k = 99, n = 99;
    ck_assert_msg(st_shard_parse(good[i].s, &k, &n) == 0, "%s", good[i].s);
    ck_assert_uint_eq(k, good[i].k);
    ck_assert_uint_eq(n, good[i].n);
  }
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    uint32_t k = 99, n = 99;
    ck_assert_msg(st_shard_parse(bad[i], &k, &n) == -EINVAL, "'%s'", bad[i]);
    ck_assert_uint_eq(k, 99); /* untouched on failure */
  }
  uint32_t k, n;
  ck_assert_int_eq(st_shard_parse(NULL, &k, &n), -EINVAL);
}
END_TEST

START_TEST(shard_cover) {
  static const size_t totals[] = {0, 1, 7, 100};
  static const uint32_t ns[] = {1, 2, 3, 7};
  for (size_t a = 0; a < 4; a++)
    for (size_t b = 0; b < 4; b++) {
      size_t total = totals[a];
      int seen[100] = {0};
      size_t sum = 0;
      for (uint32_t k = 0; k < ns[b]; k++) {
        size_t* idx = NULL;
        size_t count = 99;
        ck_assert_int_eq(st_shard_indices(total, k, ns[b], &idx, &count), 0);
        ck_assert_ptr_nonnull(idx);
        sum += count;
        for (size_t i = 0; i < count; i++) {
          ck_assert_uint_lt(idx[i], total);
          ck_assert_uint_eq(idx[i] % ns[b], k);
          if (i > 0)
            ck_assert_uint_gt(idx[i], idx[i - 1]);
          seen[idx[i]]++;
        }
        free(idx);
      }
      ck_assert_uint_eq(sum, total);
      for (size_t i = 0; i < total; i++)
        ck_assert_int_eq(seen[i], 1);
    }
  size_t* idx;
  size_t count;
  ck_assert_int_eq(st_shard_indices(10, 0, 0, &idx, &count), -EINVAL);
  ck_assert_int_eq(st_shard_indices(10, 2, 2, &idx, &count), -EINVAL);
}
END_TEST

static int cmp_size(const void* a, const void* b) {
  size_t x = *(const size_t*) a, y = *(const size_t*) b;
  return x < y ? -1 : x > y;
}

START_TEST(epoch_order) {
  enum { N = 100 };
  size_t base[N], o1[N], o2[N], o3[N], sorted[N];
  uint64_t seed = tu_seed();
  for (size_t i = 0; i < N; i++)
    base[i] = 3 * i + 1;
  st_epoch_order(base, N, seed, 5, o1);
  memcpy(sorted, o1, sizeof(o1));
  qsort(sorted, N, sizeof(size_t), cmp_size);
  ck_assert_mem_eq(sorted, base, sizeof(base)); /* a permutation */
  st_epoch_order(base, N, seed, 5, o2);
  ck_assert_mem_eq(o1, o2, sizeof(o1)); /* deterministic */
  st_epoch_order(base, N, seed, 6, o3);
  ck_assert(memcmp(o1, o3, sizeof(o1)) != 0); /* another epoch */
  st_epoch_order(base, N, seed + 1, 5, o3);
  ck_assert(memcmp(o1, o3, sizeof(o1)) != 0); /* another seed */
  memcpy(o3, base, sizeof(base));
  st_epoch_order(o3, N, seed, 5, o3); /* in place */
  ck_assert_mem_eq(o1, o3, sizeof(o1));
  /* Sizes 0 and 1. */
  st_epoch_order(base, 0, seed, 0, o3);
  st_epoch_order(base, 1, seed, 0, o3);
  ck_assert_uint_eq(o3[0], base[0]);
}
END_TEST

START_TEST(gather) {
  float x[4 * 3], y[4];
  for (size_t i = 0; i < 12; i++)
    x[i] = (float) i;
  for (size_t i = 0; i < 4; i++)
    y[i] = (float) (10 + i);
  st_dataset_t ds = {.n = 4, .dim = 3, .n_classes = 0, .x = x, .y = y};
  size_t idx[] = {3, 0, 3, 2};
  float gx[4 * 3], gy[4];
  st_dataset_gather(&ds, idx, 4, gx, gy);
  for (size_t i = 0; i < 4; i++) {
    ck_assert_float_eq(gy[i], y[idx[i]]);
    for (size_t j = 0; j < 3; j++)
      ck_assert_float_eq(gx[i * 3 + j], x[idx[i] * 3 + j]);
  }
  st_dataset_t zero;
  memset(&zero, 0, sizeof(zero));
  st_dataset_free(&zero);
  st_dataset_free(NULL);
  st_data_t d;
  memset(&d, 0, sizeof(d));
  st_data_close(&d);
  st_data_close(NULL);
}
END_TEST

static Suite* data_suite(void) {
  Suite* s = suite_create("data");
  TCase* tc = tcase_create("idx");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, idx_round_trip);
  tcase_add_test(tc, idx_one_label_value_two_classes);
  tcase_add_loop_test(tc, idx_refuses, 0,
                      2 * (int) (sizeof(idx_bad) / sizeof(idx_bad[0])));
  tcase_add_test(tc, idx_missing_file);
  tcase_add_test(tc, idx_bad_gzip);
  suite_add_tcase(s, tc);

  tc = tcase_create("csv");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_loop_test(tc, csv_loads, 0,
                      (int) (sizeof(csv_good) / sizeof(csv_good[0])));
  tcase_add_loop_test(tc, csv_refuses, 0,
                      (int) (sizeof(csv_bad) / sizeof(csv_bad[0])));
  tcase_add_test(tc, csv_large);
  tcase_set_timeout(tc, 60);
  suite_add_tcase(s, tc);

  tc = tcase_create("spec");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, spec_bad);
  tcase_add_test(tc, spec_idx_normalized);
  tcase_add_test(tc, spec_csv);
  tcase_add_test(tc, spec_shards);
  tcase_add_test(tc, trainer_on_loaded_shard);
  tcase_add_test(tc, spec_fashion_missing);
  tcase_add_loop_test(tc, spec_fashion_real, 0, 2);
  tcase_set_timeout(tc, 300); /* Fashion-MNIST under sanitizers */
  suite_add_tcase(s, tc);

  tc = tcase_create("shard");
  tcase_add_test(tc, shard_parse);
  tcase_add_test(tc, shard_cover);
  tcase_add_test(tc, epoch_order);
  tcase_add_test(tc, gather);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(data_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
