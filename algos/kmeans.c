/* kmeans.c: parallel k-means (Lloyd's algorithm) over the members of
 * a cluster, each holding its own shard of the points (algos.h;
 * `starling kmeans`, st_comm_kmeans, docs/collectives.md).
 *
 * One iteration is map, combine, reduce: every member assigns each of its
 * points to the nearest centroid (map), adds them up per cluster in float64
 * (combine: k x dim sums, k counts and the objective), and one all-reduce
 * sums those over the members (reduce), so that every member then computes
 * the same new centroids from the same bits. This is Lloyd's algorithm
 * exactly: the sums are sums over all points, only grouped differently.
 *
 * Initialisation is k-means++ (Arthur & Vassilvitskii 2007) run on every
 * member over the same candidate set, chosen so that it depends only on the
 * points, the seed and k, not on how they are spread over the members:
 *   1. every point gets a 64-bit key, a hash of its float32 bits and the
 *      seed, which orders the points pseudo-randomly;
 *   2. the candidates are the m points with the smallest (key, values), m
 *      = st_kmeans_sample_size(k, dim): each member keeps its own m
 *      smallest, one all-reduce gathers them (each member fills its own
 *      slot of a zeroed buffer, so the sum is a concatenation), and every
 *      member keeps the m smallest of the union, which are the m smallest
 *      overall;
 *   3. k-means++ in float64 over the candidates, its random draws from
 *      st_rng seeded with the seed;
 *   4. rank 0's centroids are broadcast (a sum with zeros elsewhere), so
 *      that members agree to the bit even on different CPUs.
 * The same data with the same seed therefore starts at the same centroids
 * on one member or on seven, and ends there too but for near ties: the map
 * takes distances from one OpenBLAS dgemm per block of 256 points
 * (|c|^2 - 2 x.c), whose rounding may depend on a point's place in its
 * block.
 *
 * Rules: a point equally near two centroids goes to the lower index; a
 * cluster that gets no point keeps its previous centroid; the loop stops
 * when no centroid moved more than tol (Euclidean distance, the units of
 * the features) or after max_iter iterations.
 */
#include "algos/algos.h"

#include <cblas.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

/* Candidates per cluster for k-means++: 32 k points drawn uniformly are
 * plenty to seed well-spread centroids, while keeping the gather small. */
#define CANDIDATES_PER_CLUSTER 32
/* The gather moves members x m x (dim + 3) doubles; m is capped so that one
 * member's slot is at most 2^18 doubles (2 MiB). */
#define SLOT_MAX_DOUBLES (1u << 18)
/* Doubles before a candidate's values in a gathered row: the key's high
 * and low 32 bits (exact in a double) and 1 for a row in use. */
#define ROW_HEAD 3

/* ==== Steps ============================================================== */

size_t st_kmeans_sample_size(size_t k, size_t dim) {
  size_t m = k * CANDIDATES_PER_CLUSTER;
  size_t cap = SLOT_MAX_DOUBLES / (dim + ROW_HEAD);
  if (m > cap)
    m = cap;
  return m > k ? m : k;
}

size_t st_kmeans_acc_len(size_t k, size_t dim) {
  return k * dim + k + 1;
}

/* splitmix64's finalizer (Steele, Lea & Flood 2014). */
static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t st_kmeans_point_key(const float* x, size_t dim, uint64_t seed) {
  uint64_t h = mix64(seed + 0x9E3779B97F4A7C15ull);
  for (size_t j = 0; j < dim; j++) {
    uint32_t u;
    memcpy(&u, &x[j], sizeof u);
    h = mix64(h ^ (u + 0x9E3779B97F4A7C15ull * (j + 1)));
  }
  return h;
}

/* The squared distance in float64, summed in four interleaved partial
 * sums (element j goes to sum j % 4), added as (s0 + s1) + (s2 + s3): four
 * independent chains the compiler can keep in vector registers. The order
 * is fixed by the index alone, so every member computes the same bits for
 * a point wherever its shard puts it. */
static double dist2(const float* x, const double* c, size_t dim) {
  double s[4] = {0.0, 0.0, 0.0, 0.0};
  size_t j = 0;
  for (; j + 4 <= dim; j += 4)
    for (size_t u = 0; u < 4; u++) {
      double d = (double) x[j + u] - c[j + u];
      s[u] += d * d;
    }
  for (; j < dim; j++) {
    double d = (double) x[j] - c[j];
    s[j % 4] += d * d;
  }
  return (s[0] + s[1]) + (s[2] + s[3]);
}

static double dist2_d(const double* a, const double* b, size_t dim) {
  double s = 0.0;
  for (size_t j = 0; j < dim; j++) {
    double d = a[j] - b[j];
    s += d * d;
  }
  return s;
}

/* Points go through the distances in blocks of this many rows. */
#define BLOCK_ROWS 256

/* Assigns rows [0, b) of a block: xd holds them widened to float64 (b x
 * dim), s receives xd C^T (b x k, one float64 matrix product, OpenBLAS's
 * dgemm); the nearest centroid of a row is the least |c|^2 - 2 x.c, which
 * orders the centroids as |x - c|^2 does (cn[j] = |c_j|^2), a tie going to
 * the lower index; its sums, count and exact |x - c|^2 go into acc. */
static void assign_block(const float* x, const double* xd, double* s, size_t b,
                         size_t dim, const double* c, const double* cn,
                         size_t k, double* acc) {
  double* sums = acc;
  double* counts = acc + k * dim;
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int) b, (int) k,
              (int) dim, 1.0, xd, (int) dim, c, (int) dim, 0.0, s, (int) k);
  for (size_t i = 0; i < b; i++) {
    const double* si = s + i * k;
    size_t best = 0;
    double best_s = cn[0] - 2.0 * si[0];
    for (size_t j = 1; j < k; j++) {
      double v = cn[j] - 2.0 * si[j];
      if (v < best_s) { /* strict: a tie goes to the lower index */
        best_s = v;
        best = j;
      }
    }
    const float* xi = x + i * dim;
    double* sj = sums + best * dim;
    for (size_t t = 0; t < dim; t++)
      sj[t] += (double) xi[t];
    counts[best] += 1.0;
    acc[k * dim + k] += dist2(xi, c + best * dim, dim);
  }
}

int st_kmeans_combine(const float* x, size_t n, size_t dim, const double* c,
                      size_t k, double* acc) {
  memset(acc, 0, st_kmeans_acc_len(k, dim) * sizeof(double));
  double* buf = malloc((k + BLOCK_ROWS * (dim + k)) * sizeof(double));
  if (buf == NULL)
    return -ENOMEM;
  double* cn = buf;
  double* xd = cn + k;
  double* s = xd + BLOCK_ROWS * dim;
  for (size_t j = 0; j < k; j++) {
    cn[j] = 0.0;
    for (size_t t = 0; t < dim; t++)
      cn[j] += c[j * dim + t] * c[j * dim + t];
  }
  for (size_t i0 = 0; i0 < n; i0 += BLOCK_ROWS) {
    size_t b = n - i0 < BLOCK_ROWS ? n - i0 : BLOCK_ROWS;
    const float* xb = x + i0 * dim;
    for (size_t t = 0; t < b * dim; t++)
      xd[t] = (double) xb[t];
    assign_block(xb, xd, s, b, dim, c, cn, k, acc);
  }
  free(buf);
  return 0;
}

double st_kmeans_update(double* c, const double* acc, size_t k, size_t dim,
                        size_t* empty) {
  const double* counts = acc + k * dim;
  double moved = 0.0;
  size_t n_empty = 0;
  for (size_t j = 0; j < k; j++) {
    if (counts[j] == 0.0) { /* no point: keep the previous centroid */
      n_empty++;
      continue;
    }
    double* cj = c + j * dim;
    double d2 = 0.0;
    for (size_t t = 0; t < dim; t++) {
      double v = acc[j * dim + t] / counts[j];
      double d = v - cj[t];
      d2 += d * d;
      cj[t] = v;
    }
    double d = sqrt(d2);
    if (d > moved)
      moved = d;
  }
  if (empty != NULL)
    *empty = n_empty;
  return moved;
}

/* Picks index i with probability w[i] / total (total > 0) by walking the
 * cumulative sum; the last index with a positive weight when rounding
 * leaves r beyond the end. */
static size_t pick_weighted(const double* w, size_t m, double total,
                            st_rng_t* rng) {
  double r = st_rng_uniform(rng) * total;
  double cum = 0.0;
  size_t last = 0;
  for (size_t i = 0; i < m; i++) {
    if (w[i] <= 0.0)
      continue;
    cum += w[i];
    last = i;
    if (r < cum)
      return i;
  }
  return last;
}

int st_kmeans_pp(const double* cand, size_t m, size_t dim, size_t k,
                 uint64_t seed, double* centroids) {
  if (m == 0 || k == 0)
    return -EINVAL;
  double* d2 = malloc(m * sizeof(double));
  if (d2 == NULL)
    return -ENOMEM;
  st_rng_t rng;
  st_rng_seed(&rng, mix64(seed ^ 0x6B6D65616E732B2Bull)); /* "kmeans++" */
  size_t first = (size_t) st_rng_below(&rng, m);
  memcpy(centroids, cand + first * dim, dim * sizeof(double));
  for (size_t i = 0; i < m; i++)
    d2[i] = dist2_d(cand + i * dim, centroids, dim);
  for (size_t j = 1; j < k; j++) {
    double total = 0.0;
    for (size_t i = 0; i < m; i++)
      total += d2[i];
    /* Every candidate sits on a centroid (fewer distinct points than k):
     * take candidate j, a duplicate centroid, deterministically. */
    size_t pick = total > 0.0 ? pick_weighted(d2, m, total, &rng) : j % m;
    double* cj = centroids + j * dim;
    memcpy(cj, cand + pick * dim, dim * sizeof(double));
    for (size_t i = 0; i < m; i++) {
      double d = dist2_d(cand + i * dim, cj, dim);
      if (d < d2[i])
        d2[i] = d;
    }
  }
  free(d2);
  return 0;
}

/* ==== Candidates ==========================================================
 *
 * A candidate is a row of ROW_HEAD + dim doubles: key high, key low, 1, the
 * point's values. Rows order by key, then by values. */

typedef struct {
  size_t dim;
  double* rows; /* cap rows */
  size_t cap, len;
} heap_t;

static int row_cmp(const double* a, const double* b, size_t dim) {
  for (size_t j = 0; j < ROW_HEAD + dim; j++)
    if (a[j] != b[j])
      return a[j] < b[j] ? -1 : 1;
  return 0;
}

static double* heap_row(heap_t* h, size_t i) {
  return h->rows + i * (ROW_HEAD + h->dim);
}

static void row_swap(heap_t* h, size_t a, size_t b, double* tmp) {
  size_t w = (ROW_HEAD + h->dim) * sizeof(double);
  memcpy(tmp, heap_row(h, a), w);
  memcpy(heap_row(h, a), heap_row(h, b), w);
  memcpy(heap_row(h, b), tmp, w);
}

/* Restores the max-heap order downwards from i. */
static void sift_down(heap_t* h, size_t i, double* tmp) {
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, top = i;
    if (l < h->len && row_cmp(heap_row(h, l), heap_row(h, top), h->dim) > 0)
      top = l;
    if (r < h->len && row_cmp(heap_row(h, r), heap_row(h, top), h->dim) > 0)
      top = r;
    if (top == i)
      return;
    row_swap(h, i, top, tmp);
    i = top;
  }
}

/* Offers a row: kept when the heap is not full or when it orders before
 * the largest row kept, which it then replaces. tmp is one row of
 * scratch. */
static void heap_offer(heap_t* h, const double* row, double* tmp) {
  size_t w = (ROW_HEAD + h->dim) * sizeof(double);
  if (h->len < h->cap) {
    size_t i = h->len++;
    memcpy(heap_row(h, i), row, w);
    while (i > 0) {
      size_t p = (i - 1) / 2;
      if (row_cmp(heap_row(h, p), heap_row(h, i), h->dim) >= 0)
        break;
      row_swap(h, i, p, tmp);
      i = p;
    }
  } else if (h->cap > 0 && row_cmp(row, heap_row(h, 0), h->dim) < 0) {
    memcpy(heap_row(h, 0), row, w);
    sift_down(h, 0, tmp);
  }
}

/* This member's m smallest rows into rows[0..m) (unused rows all zero). */
static int local_candidates(const float* x, size_t n, size_t dim, uint64_t seed,
                            double* rows, size_t m) {
  heap_t h = {dim, rows, m, 0};
  double* row = malloc(2 * (ROW_HEAD + dim) * sizeof(double));
  if (row == NULL)
    return -ENOMEM;
  double* tmp = row + ROW_HEAD + dim;
  for (size_t i = 0; i < n; i++) {
    const float* xi = x + i * dim;
    uint64_t key = st_kmeans_point_key(xi, dim, seed);
    row[0] = (double) (key >> 32);
    row[1] = (double) (key & 0xFFFFFFFFull);
    row[2] = 1.0;
    for (size_t j = 0; j < dim; j++)
      row[ROW_HEAD + j] = (double) xi[j];
    heap_offer(&h, row, tmp);
  }
  free(row);
  return 0;
}

/* From the gathered rows (n_rows of them, unused ones all zero), the m
 * smallest in increasing order: offered to a max-heap of m, then sorted in
 * place (heapsort). Their values go to cand (m x dim), their number to
 * *got. */
static int merge_candidates(const double* rows, size_t n_rows, size_t dim,
                            size_t m, double* cand, size_t* got) {
  size_t w = ROW_HEAD + dim;
  heap_t h = {dim, malloc(m * w * sizeof(double)), m, 0};
  double* tmp = malloc(w * sizeof(double));
  if (h.rows == NULL || tmp == NULL) {
    free(h.rows);
    free(tmp);
    return -ENOMEM;
  }
  for (size_t i = 0; i < n_rows; i++)
    if (rows[i * w + 2] != 0.0)
      heap_offer(&h, rows + i * w, tmp);
  *got = h.len;
  while (h.len > 1) { /* the largest to the end, repeatedly */
    row_swap(&h, 0, h.len - 1, tmp);
    h.len--;
    sift_down(&h, 0, tmp);
  }
  for (size_t i = 0; i < *got; i++)
    memcpy(cand + i * dim, h.rows + i * w + ROW_HEAD, dim * sizeof(double));
  free(h.rows);
  free(tmp);
  return 0;
}

int st_kmeans_init(const st_algo_comm_t* comm, const float* x, size_t n,
                   size_t dim, size_t k, uint64_t seed, double* centroids,
                   uint64_t* points, char* err, size_t err_len) {
  size_t m = st_kmeans_sample_size(k, dim), w = ROW_HEAD + dim;
  size_t slots = comm->size > 0 ? comm->size : 1;
  /* [points over every member | one slot of m rows per member] */
  size_t len = 1 + slots * m * w;
  double* buf = calloc(len, sizeof(double));
  double* cand = malloc(m * dim * sizeof(double));
  int rc = buf == NULL || cand == NULL ? -ENOMEM : 0;
  if (rc == 0) {
    buf[0] = (double) n;
    rc = local_candidates(x, n, dim, seed, buf + 1 + comm->rank * m * w, m);
  }
  if (rc == 0 && (rc = comm->sum(comm->arg, buf, len)) != 0)
    st_set_err(err, err_len, "gathering the k-means++ candidates failed");
  size_t got = 0;
  if (rc == 0) {
    *points = (uint64_t) buf[0];
    rc = merge_candidates(buf + 1, slots * m, dim, m, cand, &got);
  }
  if (rc == 0) {
    if (got < k) {
      st_set_err(err, err_len,
                 "k = %zu clusters but only %" PRIu64
                 " points across the members: lower --k",
                 k, *points);
      rc = -EINVAL;
    }
  }
  if (rc == 0)
    rc = st_kmeans_pp(cand, got, dim, k, seed, centroids);
  if (rc == 0) {
    /* Rank 0's centroids everywhere: a sum with zeros from the others. */
    if (comm->rank != 0)
      memset(centroids, 0, k * dim * sizeof(double));
    if ((rc = comm->sum(comm->arg, centroids, k * dim)) != 0)
      st_set_err(err, err_len, "broadcasting the initial centroids failed");
  }
  free(buf);
  free(cand);
  return rc;
}

/* ==== The loop ============================================================ */

void st_kmeans_config_default(st_kmeans_config_t* cfg) {
  memset(cfg, 0, sizeof(*cfg));
  cfg->k = 8;
  cfg->max_iter = 300;
  cfg->tol = 1e-4;
  cfg->seed = 1;
}

void st_kmeans_result_free(st_kmeans_result_t* r) {
  if (r == NULL)
    return;
  free(r->centroids);
  free(r->counts);
  memset(r, 0, sizeof(*r));
}

/* One map-combine-reduce over the current centroids into acc. */
static int kmeans_pass(const st_algo_comm_t* comm, const float* x, size_t n,
                       size_t dim, const double* c, size_t k, double* acc,
                       char* err, size_t err_len) {
  if (st_kmeans_combine(x, n, dim, c, k, acc) != 0) {
    st_set_err(err, err_len, "out of memory for %zu centroids", k);
    return -ENOMEM;
  }
  int rc = comm->sum(comm->arg, acc, st_kmeans_acc_len(k, dim));
  if (rc != 0)
    st_set_err(err, err_len, "the all-reduce of the cluster sums failed");
  return rc;
}

static int check_config(const st_kmeans_config_t* cfg, size_t dim, char* err,
                        size_t err_len) {
  if (cfg->k == 0 || dim == 0 || !(cfg->tol >= 0) || !isfinite(cfg->tol)) {
    st_set_err(err, err_len,
               "k-means needs k >= 1 (got %zu), points with at least one "
               "feature (got %zu) and a finite tolerance >= 0 (got %g)",
               cfg->k, dim, cfg->tol);
    return -EINVAL;
  }
  if (cfg->k > SIZE_MAX / 4 / (dim + ROW_HEAD) / CANDIDATES_PER_CLUSTER) {
    st_set_err(err, err_len, "k = %zu is too large for %zu features", cfg->k,
               dim);
    return -EINVAL;
  }
  return 0;
}

/* The iterations from the initial centroids c: Lloyd's until converged or
 * max_iter, then one more pass for the objective and counts at the
 * centroids returned. */
static int kmeans_iterate(const st_algo_comm_t* comm,
                          const st_kmeans_config_t* cfg, const float* x,
                          size_t n, size_t dim, double* c, double* acc,
                          st_kmeans_result_t* res, char* err, size_t err_len) {
  size_t k = cfg->k;
  st_kmeans_iter_t it = {0};
  int rc = 0;
  while (it.iteration < cfg->max_iter && !res->converged) {
    rc = kmeans_pass(comm, x, n, dim, c, k, acc, err, err_len);
    if (rc != 0)
      return rc;
    it.iteration++;
    it.objective = acc[k * dim + k];
    it.moved = st_kmeans_update(c, acc, k, dim, &it.empty);
    res->converged = it.moved <= cfg->tol;
    if (cfg->progress != NULL)
      cfg->progress(cfg->progress_arg, &it);
  }
  rc = kmeans_pass(comm, x, n, dim, c, k, acc, err, err_len);
  res->iterations = it.iteration;
  res->moved = it.moved;
  res->objective = acc[k * dim + k];
  return rc;
}

int st_kmeans_run(const st_algo_comm_t* comm, const st_kmeans_config_t* cfg,
                  const float* x, size_t n, size_t dim, st_kmeans_result_t* res,
                  char* err, size_t err_len) {
  memset(res, 0, sizeof(*res));
  int rc = check_config(cfg, dim, err, err_len);
  if (rc != 0)
    return rc;
  size_t k = cfg->k;
  double* c = malloc(k * dim * sizeof(double));
  double* acc = malloc(st_kmeans_acc_len(k, dim) * sizeof(double));
  double* counts = malloc(k * sizeof(double));
  if (c == NULL || acc == NULL || counts == NULL) {
    rc = -ENOMEM;
    st_set_err(err, err_len, "out of memory for %zu x %zu centroids", k, dim);
  }
  if (rc == 0)
    rc = st_kmeans_init(comm, x, n, dim, k, cfg->seed, c, &res->points, err,
                        err_len);
  if (rc == 0)
    rc = kmeans_iterate(comm, cfg, x, n, dim, c, acc, res, err, err_len);
  if (rc == 0) {
    memcpy(counts, acc + k * dim, k * sizeof(double));
    res->centroids = c;
    res->counts = counts;
    res->k = k;
    res->dim = dim;
  } else {
    free(c);
    free(counts);
    uint64_t points = res->points;
    memset(res, 0, sizeof(*res));
    res->points = points;
  }
  free(acc);
  return rc;
}
