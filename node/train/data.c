/* data.c: opening a dataset by spec, normalization, sharding and the
 * per-epoch shuffle (see train.h; the file loaders are data_idx.c,
 * data_csv.c and data_libsvm.c).
 *
 * Sharding is strided (shard k of n holds every i with i % n == k) rather
 * than blocked, so that on a file sorted by class every shard still sees
 * every class. The epoch order is a Fisher-Yates shuffle (Knuth, TAOCP
 * vol. 2, Algorithm P) driven by st_rng seeded from (seed, epoch) alone, so
 * that a resumed run, or a peer that takes over a shard, replays the same
 * batches. */
#include "node/train/train.h"
#include "node/train/train_internal.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ==== Datasets ============================================================ */

void st_dataset_free(st_dataset_t* ds) {
  if (ds == NULL)
    return;
  free(ds->x);
  free(ds->y);
  free(ds->row_ptr);
  free(ds->col);
  free(ds->val);
  free(ds->norm_mean);
  free(ds->norm_std);
  memset(ds, 0, sizeof(*ds));
}

void st_data_close(st_data_t* d) {
  if (d == NULL)
    return;
  st_dataset_free(&d->train);
  st_dataset_free(&d->test);
  memset(d, 0, sizeof(*d));
}

bool st_dataset_is_sparse(const st_dataset_t* ds) {
  return ds->row_ptr != NULL;
}

/* Example j written out dense into row (dim floats). */
static void dense_row(const st_dataset_t* ds, size_t j, float* row) {
  if (ds->row_ptr == NULL) {
    memcpy(row, ds->x + j * ds->dim, ds->dim * sizeof(float));
    return;
  }
  memset(row, 0, ds->dim * sizeof(float));
  for (size_t k = ds->row_ptr[j]; k < ds->row_ptr[j + 1]; k++)
    row[ds->col[k]] = ds->val[k];
}

void st_dataset_gather(const st_dataset_t* ds, const size_t* idx, size_t count,
                       float* x, float* y) {
  for (size_t i = 0; i < count; i++) {
    size_t j = idx[i];
    assert(j < ds->n);
    if (ds->dim > 0)
      dense_row(ds, j, x + i * ds->dim);
    y[i] = ds->y[j];
  }
}

void st__dataset_rows(const st_dataset_t* ds, size_t start, size_t count,
                      float* x, float* y) {
  assert(start + count <= ds->n);
  if (ds->row_ptr == NULL) {
    memcpy(x, ds->x + start * ds->dim, count * ds->dim * sizeof(float));
  } else {
    for (size_t i = 0; i < count; i++)
      dense_row(ds, start + i, x + i * ds->dim);
  }
  memcpy(y, ds->y + start, count * sizeof(float));
}

/* ==== Normalization =========================================================
 *
 * The statistics come from the whole training set and are rounded to
 * float32 before use, so that the tensors a checkpoint stores
 * (normalize.mean, normalize.std) are exactly the ones applied. */

int st_dataset_normalize(st_dataset_t* ds, const float* mean, const float* std,
                         size_t len, char* err, size_t err_len) {
  if (st_dataset_is_sparse(ds)) {
    st_set_err(err, err_len,
               "%s is sparse (libsvm): standardizing its features would make "
               "every example dense; this model was trained on standardized "
               "dense data",
               ds->source);
    return -EINVAL;
  }
  if (len != 1 && len != ds->dim) {
    st_set_err(err, err_len,
               "%s: normalization has %zu values but the data has %zu "
               "features per example (want 1 or %zu)",
               ds->source, len, ds->dim, ds->dim);
    return -EINVAL;
  }
  for (size_t j = 0; j < len; j++)
    if (!(std[j] > 0) || !isfinite(std[j]) || !isfinite(mean[j])) {
      st_set_err(err, err_len,
                 "normalization value %zu (mean %g, std %g) is not usable: "
                 "the std must be finite and positive",
                 j, (double) mean[j], (double) std[j]);
      return -EINVAL;
    }
  for (size_t i = 0; i < ds->n; i++) {
    float* row = ds->x + i * ds->dim;
    for (size_t j = 0; j < ds->dim; j++) {
      size_t k = len == 1 ? 0 : j;
      row[j] = (float) (((double) row[j] - (double) mean[k]) / (double) std[k]);
    }
  }
  return 0;
}

/* A standard deviation as applied: float32, and 1 for a constant input (only
 * centre it) or one too small or large for a float. */
static float usable_std(double sd) {
  float f = (float) sd;
  return f > 0 && isfinite(f) ? f : 1.0f;
}

/* Keeps the statistics on the training set (for its checkpoints) and
 * applies them to both sets. mean and std are taken over. */
static int apply_stats(st_dataset_t* train, st_dataset_t* test, float* mean,
                       float* std, size_t len) {
  train->norm_mean = mean;
  train->norm_std = std;
  train->norm_len = len;
  int rc = st_dataset_normalize(train, mean, std, len, NULL, 0);
  if (rc == 0 && test->n > 0)
    rc = st_dataset_normalize(test, mean, std, len, NULL, 0);
  return rc;
}

/* Standardizes with one mean and standard deviation over every pixel of the
 * whole training file (images: every pixel has the same meaning), shard or
 * not: hist counts each byte value over all of its images (data_idx.c), so
 * the statistics are exact sums in double of the values as loaded,
 * (float) v / 255, with no 47-million-term rounding drift. */
static int normalize_scalar(st_dataset_t* train, st_dataset_t* test,
                            const uint64_t hist[256]) {
  uint64_t count = 0;
  double sum = 0.0, sq = 0.0;
  for (int v = 0; v < 256; v++) {
    count += hist[v];
    sum += (double) hist[v] * (double) (v / 255.0f);
  }
  double mean = count > 0 ? sum / (double) count : 0.0;
  for (int v = 0; v < 256; v++) {
    double d = (double) (v / 255.0f) - mean;
    sq += (double) hist[v] * d * d;
  }
  float* m = malloc(sizeof(float));
  float* sd = malloc(sizeof(float));
  if (m == NULL || sd == NULL) {
    free(m);
    free(sd);
    return -ENOMEM;
  }
  *m = (float) mean;
  *sd = usable_std(count > 0 ? sqrt(sq / (double) count) : 1.0);
  return apply_stats(train, test, m, sd, 1);
}

/* Standardizes each feature (CSV columns have unrelated units). */
static int normalize_features(st_dataset_t* train, st_dataset_t* test) {
  size_t dim = train->dim;
  double* mean = calloc(dim, sizeof(double));
  double* sd = calloc(dim, sizeof(double));
  float* mean_f = malloc(dim * sizeof(float));
  float* sd_f = malloc(dim * sizeof(float));
  if (mean == NULL || sd == NULL || mean_f == NULL || sd_f == NULL) {
    free(mean);
    free(sd);
    free(mean_f);
    free(sd_f);
    return -ENOMEM;
  }
  for (size_t i = 0; i < train->n; i++)
    for (size_t j = 0; j < dim; j++)
      mean[j] += train->x[i * dim + j];
  for (size_t j = 0; j < dim; j++)
    mean[j] /= (double) train->n;
  for (size_t i = 0; i < train->n; i++)
    for (size_t j = 0; j < dim; j++) {
      double d = train->x[i * dim + j] - mean[j];
      sd[j] += d * d;
    }
  for (size_t j = 0; j < dim; j++) {
    mean_f[j] = (float) mean[j];
    sd_f[j] = usable_std(sqrt(sd[j] / (double) train->n));
  }
  free(mean);
  free(sd);
  return apply_stats(train, test, mean_f, sd_f, dim);
}

/* keep_shard for sparse examples: rows and their features move down in
 * place (row i >= j, so its features never overwrite ones not yet moved). */
static void keep_shard_sparse(st_dataset_t* ds, uint32_t k, uint32_t n,
                              size_t kept) {
  size_t nnz = 0;
  for (size_t j = 0; j < kept; j++) {
    size_t i = k + j * n;
    size_t from = ds->row_ptr[i], count = ds->row_ptr[i + 1] - from;
    memmove(ds->col + nnz, ds->col + from, count * sizeof(uint32_t));
    memmove(ds->val + nnz, ds->val + from, count * sizeof(float));
    ds->row_ptr[j] = nnz;
    nnz += count;
    ds->y[j] = ds->y[i];
  }
  ds->row_ptr[kept] = nnz;
}

/* Keeps the examples i with i % n == k of a whole dataset, in order. */
static void keep_shard(st_dataset_t* ds, uint32_t k, uint32_t n) {
  size_t kept = ds->n > k ? (ds->n - k - 1) / n + 1 : 0;
  if (ds->row_ptr != NULL) {
    keep_shard_sparse(ds, k, n, kept);
    ds->total = ds->n;
    ds->n = kept;
    ds->shard_k = k;
    ds->shard_n = n;
    return;
  }
  for (size_t j = 0; j < kept; j++) {
    size_t i = k + j * n;
    memmove(ds->x + j * ds->dim, ds->x + i * ds->dim, ds->dim * sizeof(float));
    ds->y[j] = ds->y[i];
  }
  if (kept > 0) { /* shrink; a failed realloc leaves the larger block */
    float* x = realloc(ds->x, kept * ds->dim * sizeof(float));
    if (x != NULL)
      ds->x = x;
    float* y = realloc(ds->y, kept * sizeof(float));
    if (y != NULL)
      ds->y = y;
  }
  ds->total = ds->n;
  ds->n = kept;
  ds->shard_k = k;
  ds->shard_n = n;
}

/* ==== Specs =================================================================
 */

/* Splits the comma-separated list in buf (modified in place) into at most
 * max non-empty parts. Returns the number of parts, or -1 when there are
 * more than max or one is empty. */
static int split_paths(char* buf, char** parts, int max) {
  int n = 0;
  char* p = buf;
  for (;;) {
    char* comma = strchr(p, ',');
    if (comma != NULL)
      *comma = '\0';
    if (*p == '\0' || n == max)
      return -1;
    parts[n++] = p;
    if (comma == NULL)
      return n;
    p = comma + 1;
  }
}

static int open_fashion_mnist(st_data_t* d, uint32_t k, uint32_t n,
                              uint64_t hist[256], char* err, size_t err_len) {
  static const char* const files[4] = {
      "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
      "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};
  const char* dir = getenv("STARLING_FASHION_MNIST_DIR");
  if (dir == NULL || *dir == '\0')
    dir = ST_FASHION_MNIST_DIR;
  char path[4][4096];
  for (int i = 0; i < 4; i++) {
    int len = snprintf(path[i], sizeof(path[i]), "%s/%s", dir, files[i]);
    if (len < 0 || (size_t) len >= sizeof(path[i])) {
      st_set_err(err, err_len, "Fashion-MNIST directory name too long: %s",
                 dir);
      return -ENAMETOOLONG;
    }
    if (access(path[i], F_OK) != 0) {
      st_set_err(err, err_len,
                 "Fashion-MNIST not found in %s (no %s): install it with `sudo "
                 "apt-get install dataset-fashion-mnist`, or set "
                 "STARLING_FASHION_MNIST_DIR",
                 dir, files[i]);
      return -ENOENT;
    }
  }
  int rc = st__dataset_load_idx_shard(&d->train, path[0], path[1], k, n, hist,
                                      err, err_len);
  if (rc == 0)
    rc = st_dataset_load_idx(&d->test, path[2], path[3], err, err_len);
  return rc;
}

static const char spec_help[] =
    "use fashion-mnist, idx:IMAGES,LABELS[,TEST_IMAGES,TEST_LABELS], "
    "csv:TRAIN[,TEST] or libsvm:TRAIN[,TEST]";

/* The sets of a libsvm: spec; both get the larger dim (a sparse file's
 * dim is its largest index, and a test file may name fewer features). */
static int open_libsvm(st_data_t* d, char** parts, int n,
                       const st_data_options_t* opt, char* err,
                       size_t err_len) {
  int rc =
      st_dataset_load_libsvm(&d->train, parts[0], &opt->csv, 0, err, err_len);
  if (rc == 0 && n == 2) {
    rc = st_dataset_load_libsvm(&d->test, parts[1], &opt->csv, d->train.dim,
                                err, err_len);
    if (rc == 0 && d->test.dim > d->train.dim) {
      d->train.dim = d->test.dim;
      d->train.shape[0] = d->train.dim;
    }
  }
  return rc;
}

/* Loads the files of an idx:, csv: or libsvm: spec: IDX only the shard's
 * rows of the training set, CSV and libsvm all of them. */
static int open_paths(st_data_t* d, const char* spec,
                      const st_data_options_t* opt, uint32_t shard_k,
                      uint32_t shard_n, uint64_t hist[256], char* err,
                      size_t err_len) {
  char* parts[4];
  int rc;
  int is_idx = spec[0] == 'i', is_libsvm = spec[0] == 'l';
  char* buf = strdup(strchr(spec, ':') + 1);
  if (buf == NULL) {
    rc = -ENOMEM;
    st_set_err(err, err_len, "out of memory");
    goto out;
  }
  int n = split_paths(buf, parts, is_idx ? 4 : 2);
  if (is_idx && n != 2 && n != 4) {
    st_set_err(err, err_len,
               "bad data spec '%s': idx: takes IMAGES,LABELS or "
               "IMAGES,LABELS,TEST_IMAGES,TEST_LABELS (non-empty paths)",
               spec);
    rc = -EINVAL;
    goto out;
  }
  if (!is_idx && n != 1 && n != 2) {
    st_set_err(err, err_len,
               "bad data spec '%s': %s takes TRAIN or TRAIN,TEST "
               "(non-empty paths)",
               spec, is_libsvm ? "libsvm:" : "csv:");
    rc = -EINVAL;
    goto out;
  }
  if (is_libsvm) {
    rc = open_libsvm(d, parts, n, opt, err, err_len);
  } else if (is_idx) {
    rc = st__dataset_load_idx_shard(&d->train, parts[0], parts[1], shard_k,
                                    shard_n, hist, err, err_len);
    if (rc == 0 && n == 4)
      rc = st_dataset_load_idx(&d->test, parts[2], parts[3], err, err_len);
  } else {
    rc = st_dataset_load_csv(&d->train, parts[0], &opt->csv, err, err_len);
    if (rc == 0 && n == 2)
      rc = st_dataset_load_csv(&d->test, parts[1], &opt->csv, err, err_len);
  }
out:
  free(buf);
  return rc;
}

/* Checks that the test set, when there is one, matches the training set,
 * and gives both the larger number of classes. */
static int match_test_set(st_data_t* d, char* err, size_t err_len) {
  if (d->test.n > 0) {
    if (d->test.dim != d->train.dim) {
      st_set_err(err, err_len,
                 "test set %s has %zu features per example but training set %s "
                 "has %zu",
                 d->test.source, d->test.dim, d->train.source, d->train.dim);
      return -EINVAL;
    }
    /* A class that appears only in the test set still needs an output. */
    if (d->train.n_classes > 0 && d->test.n_classes > 0) {
      size_t k = d->train.n_classes > d->test.n_classes ? d->train.n_classes
                                                        : d->test.n_classes;
      d->train.n_classes = k;
      d->test.n_classes = k;
    }
  }
  return 0;
}

int st_data_open(st_data_t* d, const char* spec, const st_data_options_t* opt,
                 char* err, size_t err_len) {
  st_data_options_t defaults;
  int per_feature = 0, sparse = 0;
  uint64_t hist[256];
  int rc;

  memset(d, 0, sizeof(*d));
  memset(&defaults, 0, sizeof(defaults));
  defaults.csv.label_col = -1;
  if (opt == NULL)
    opt = &defaults;
  if (spec == NULL || *spec == '\0') {
    st_set_err(err, err_len, "no data spec given: %s", spec_help);
    return -EINVAL;
  }
  snprintf(d->spec, sizeof(d->spec), "%s", spec);
  uint32_t shard_k = opt->shard_k,
           shard_n = opt->shard_n > 0 ? opt->shard_n : 1;
  if (shard_k >= shard_n) {
    st_set_err(err, err_len, "bad shard %u/%u: want K/N with K < N", shard_k,
               shard_n);
    return -EINVAL;
  }

  if (strcmp(spec, "fashion-mnist") == 0 ||
      strcmp(spec, "fashion-mnist:train") == 0) {
    rc = open_fashion_mnist(d, shard_k, shard_n, hist, err, err_len);
  } else if (strncmp(spec, "idx:", 4) == 0 || strncmp(spec, "csv:", 4) == 0 ||
             strncmp(spec, "libsvm:", 7) == 0) {
    per_feature = spec[0] == 'c';
    sparse = spec[0] == 'l';
    rc = open_paths(d, spec, opt, shard_k, shard_n, hist, err, err_len);
  } else {
    st_set_err(err, err_len, "unknown data spec '%s': %s", spec, spec_help);
    rc = -EINVAL;
  }
  if (rc != 0)
    goto out;

  rc = match_test_set(d, err, err_len);
  if (rc != 0)
    goto out;

  if (opt->normalize && !sparse) {
    rc = per_feature ? normalize_features(&d->train, &d->test)
                     : normalize_scalar(&d->train, &d->test, hist);
    if (rc != 0) {
      st_set_err(err, err_len, "out of memory normalizing %s", d->train.source);
      goto out;
    }
  }
  /* CSV loads whole (its per-feature statistics come from every row), then
   * keeps its shard, as libsvm; IDX loaded only its shard. */
  if ((per_feature || sparse) && shard_n > 1)
    keep_shard(&d->train, shard_k, shard_n);

out:
  if (rc != 0) {
    st_dataset_free(&d->train);
    st_dataset_free(&d->test);
  }
  return rc;
}

/* ==== Shards and epochs ======================================================
 */

int st_shard_parse(const char* s, uint32_t* k, uint32_t* n) {
  uint64_t v[2] = {0, 0};
  if (s == NULL)
    return -EINVAL;
  for (int part = 0; part < 2; part++) {
    const char* start = s;
    while (*s >= '0' && *s <= '9') {
      v[part] = v[part] * 10 + (uint64_t) (*s - '0');
      if (v[part] > UINT32_MAX)
        return -EINVAL;
      s++;
    }
    if (s == start)
      return -EINVAL;
    if (part == 0 && *s++ != '/')
      return -EINVAL;
  }
  if (*s != '\0' || v[1] == 0 || v[0] >= v[1])
    return -EINVAL;
  *k = (uint32_t) v[0];
  *n = (uint32_t) v[1];
  return 0;
}

int st_shard_indices(size_t total, uint32_t k, uint32_t n, size_t** out,
                     size_t* count) {
  if (n == 0 || k >= n)
    return -EINVAL;
  size_t c = total > k ? (total - k - 1) / n + 1 : 0;
  /* At least one element, so that *out is never NULL on success. */
  size_t* idx = malloc((c > 0 ? c : 1) * sizeof(size_t));
  if (idx == NULL)
    return -ENOMEM;
  for (size_t i = 0; i < c; i++)
    idx[i] = k + i * (size_t) n;
  *out = idx;
  *count = c;
  return 0;
}

/* splitmix64 (Steele, Lea & Flood 2014): a bijective mixer, so that nearby
 * (seed, epoch) pairs give unrelated generator states. */
static uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void st_epoch_order(const size_t* base, size_t count, uint64_t seed,
                    uint64_t epoch, size_t* order) {
  if (count == 0)
    return;
  if (order != base)
    memmove(order, base, count * sizeof(size_t));
  st_rng_t rng;
  st_rng_seed(&rng, splitmix64(seed ^ splitmix64(epoch)));
  for (size_t i = count - 1; i > 0; i--) {
    size_t j = (size_t) st_rng_below(&rng, (uint64_t) i + 1);
    size_t t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
}
