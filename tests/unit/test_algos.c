/* test_algos.c: the Check suite of the cluster algorithms
 * (algos/kmeans.c, lstsq.c): k-means run by 1, 2, 3 and 7
 * members (threads in this process, summing through a barrier in rank
 * order, as the node's all-reduce sums across machines) against a plain
 * single-process Lloyd's algorithm from the same initialisation; the
 * initialisation independent of the sharding; empty clusters and too few
 * points; least squares by the closed form against a long-double
 * reference, with ridge, on singular data (the pivoted-QR fallback, the
 * minimum-norm solution), and by gradient descent against the closed
 * form. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algos/algos.h"
#include "tests/unit/testutil.h"

/* ==== Members as threads ==================================================
 *
 * Every member adds its data into one accumulator in rank order (a barrier
 * between ranks), so the sum is deterministic and every member copies the
 * same bits back. */

#define MAX_MEMBERS 8

typedef struct {
  pthread_barrier_t bar;
  double* acc;
  uint32_t size;
} group_t;

typedef struct {
  group_t* g;
  st_algo_comm_t comm;
  const float* x; /* this member's rows */
  const float* y;
  size_t n, dim;
  /* what a member runs, and its results */
  int (*body)(void* m);
  const void* cfg;
  st_kmeans_result_t km;
  st_lstsq_result_t ls;
  double* init; /* st_kmeans_init's centroids */
  int rc;
  char err[256];
} member_t;

static int group_sum(void* arg, double* data, size_t count) {
  member_t* m = arg;
  group_t* g = m->g;
  if (m->comm.rank == 0) {
    free(g->acc);
    g->acc = calloc(count > 0 ? count : 1, sizeof(double));
  }
  pthread_barrier_wait(&g->bar);
  for (uint32_t r = 0; r < g->size; r++) {
    if (r == m->comm.rank)
      for (size_t i = 0; i < count; i++)
        g->acc[i] += data[i];
    pthread_barrier_wait(&g->bar);
  }
  memcpy(data, g->acc, count * sizeof(double));
  pthread_barrier_wait(&g->bar); /* before rank 0 frees acc again */
  return 0;
}

static void* member_main(void* arg) {
  member_t* m = arg;
  m->rc = m->body(m);
  return NULL;
}

/* Splits x (n x dim) and y into `size` strided shards (rows i % size ==
 * rank, as --shard does), runs body on each member in its own thread. */
static void run_members(member_t* ms, uint32_t size, const float* x,
                        const float* y, size_t n, size_t dim,
                        int (*body)(void*), const void* cfg) {
  group_t g = {.size = size};
  ck_assert_int_eq(pthread_barrier_init(&g.bar, NULL, size), 0);
  pthread_t th[MAX_MEMBERS];
  for (uint32_t r = 0; r < size; r++) {
    member_t* m = &ms[r];
    memset(m, 0, sizeof(*m));
    m->g = &g;
    m->comm = (st_algo_comm_t){group_sum, m, r, size};
    size_t rows = n > r ? (n - r - 1) / size + 1 : 0;
    float* xs = malloc((rows + 1) * dim * sizeof(float));
    float* ys = malloc((rows + 1) * sizeof(float));
    for (size_t j = 0; j < rows; j++) {
      memcpy(xs + j * dim, x + (r + j * size) * dim, dim * sizeof(float));
      ys[j] = y != NULL ? y[r + j * size] : 0.0f;
    }
    m->x = xs;
    m->y = ys;
    m->n = rows;
    m->dim = dim;
    m->body = body;
    m->cfg = cfg;
  }
  for (uint32_t r = 0; r < size; r++)
    ck_assert_int_eq(pthread_create(&th[r], NULL, member_main, &ms[r]), 0);
  for (uint32_t r = 0; r < size; r++) {
    pthread_join(th[r], NULL);
    free((void*) ms[r].x);
    free((void*) ms[r].y);
  }
  pthread_barrier_destroy(&g.bar);
  free(g.acc);
}

/* ==== Data =================================================================
 */

/* n points around k well-separated centres in dim dimensions. */
static float* blobs(st_rng_t* rng, size_t n, size_t dim, size_t k) {
  float* centres = malloc(k * dim * sizeof(float));
  float* x = malloc(n * dim * sizeof(float));
  tu_fill_uniform(rng, centres, k * dim, -10.0f, 10.0f);
  for (size_t i = 0; i < n; i++) {
    size_t c = (size_t) st_rng_below(rng, k);
    for (size_t j = 0; j < dim; j++)
      x[i * dim + j] = centres[c * dim + j] + (float) st_rng_normal(rng);
  }
  free(centres);
  return x;
}

/* Rows with standard normal features and y = x . w + b + noise. */
static void linear_rows(st_rng_t* rng, size_t n, size_t dim, float** x,
                        float** y) {
  *x = malloc(n * dim * sizeof(float));
  *y = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) {
    double t = 0.5;
    for (size_t j = 0; j < dim; j++) {
      (*x)[i * dim + j] = (float) (st_rng_normal(rng) + 0.3 * (double) j);
      t += (double) (*x)[i * dim + j] * (1.0 + (double) j);
    }
    (*y)[i] = (float) (t + 0.1 * st_rng_normal(rng));
  }
}

/* max_i |a_i - b_i| / max(max_i |a_i|, 1e-300). */
static double rel_err(const double* a, const double* b, size_t n) {
  double diff = 0.0, scale = 1e-300;
  for (size_t i = 0; i < n; i++) {
    diff = fmax(diff, fabs(a[i] - b[i]));
    scale = fmax(scale, fabs(a[i]));
  }
  return diff / scale;
}

/* ==== k-means ==============================================================
 */

/* Single-process Lloyd's from centroids c (k x dim), written plainly:
 * nearest (ties to the lower index), means, empty clusters kept, until no
 * centroid moves more than tol or max_iter. Returns the iterations. */
static uint32_t lloyd(const float* x, size_t n, size_t dim, double* c, size_t k,
                      uint32_t max_iter, double tol) {
  double* sum = malloc(k * dim * sizeof(double));
  double* cnt = malloc(k * sizeof(double));
  uint32_t it = 0;
  double moved = INFINITY;
  while (it < max_iter && !(moved <= tol)) {
    memset(sum, 0, k * dim * sizeof(double));
    memset(cnt, 0, k * sizeof(double));
    for (size_t i = 0; i < n; i++) {
      size_t best = 0;
      double bd = INFINITY;
      for (size_t j = 0; j < k; j++) {
        double d = 0;
        for (size_t t = 0; t < dim; t++) {
          double e = (double) x[i * dim + t] - c[j * dim + t];
          d += e * e;
        }
        if (d < bd) {
          bd = d;
          best = j;
        }
      }
      for (size_t t = 0; t < dim; t++)
        sum[best * dim + t] += x[i * dim + t];
      cnt[best] += 1;
    }
    moved = 0;
    for (size_t j = 0; j < k; j++) {
      if (cnt[j] == 0)
        continue;
      double d = 0;
      for (size_t t = 0; t < dim; t++) {
        double v = sum[j * dim + t] / cnt[j];
        d += (v - c[j * dim + t]) * (v - c[j * dim + t]);
        c[j * dim + t] = v;
      }
      moved = fmax(moved, sqrt(d));
    }
    it++;
  }
  free(sum);
  free(cnt);
  return it;
}

static int kmeans_body(void* arg) {
  member_t* m = arg;
  const st_kmeans_config_t* cfg = m->cfg;
  m->init = malloc(cfg->k * m->dim * sizeof(double));
  uint64_t points = 0;
  int rc = st_kmeans_init(&m->comm, m->x, m->n, m->dim, cfg->k, cfg->seed,
                          m->init, &points, m->err, sizeof m->err);
  if (rc == 0)
    rc = st_kmeans_run(&m->comm, cfg, m->x, m->n, m->dim, &m->km, m->err,
                       sizeof m->err);
  return rc;
}

static const uint32_t member_counts[] = {1, 2, 3, 7};

START_TEST(kmeans_matches_lloyd) {
  uint32_t size = member_counts[_i];
  st_rng_t rng;
  st_rng_seed(&rng, tu_seed());
  size_t n = 1501, dim = 5, k = 6;
  float* x = blobs(&rng, n, dim, 4); /* 6 clusters over 4 blobs: work */
  st_kmeans_config_t cfg;
  st_kmeans_config_default(&cfg);
  cfg.k = k;
  cfg.seed = 42;
  cfg.tol = 0;

  /* The initialisation alone on one member. */
  member_t one[1];
  run_members(one, 1, x, NULL, n, dim, kmeans_body, &cfg);
  ck_assert_msg(one[0].rc == 0, "%s", one[0].err);
  double* c = malloc(k * dim * sizeof(double));
  memcpy(c, one[0].init, k * dim * sizeof(double));
  uint32_t iters = lloyd(x, n, dim, c, k, cfg.max_iter, cfg.tol);

  member_t ms[MAX_MEMBERS];
  run_members(ms, size, x, NULL, n, dim, kmeans_body, &cfg);
  for (uint32_t r = 0; r < size; r++) {
    ck_assert_msg(ms[r].rc == 0, "member %u: %s", r, ms[r].err);
    /* The same start however the points are sharded, to the bit. */
    ck_assert_mem_eq(ms[r].init, one[0].init, k * dim * sizeof(double));
    /* Every member the same result, to the bit. */
    ck_assert_mem_eq(ms[r].km.centroids, ms[0].km.centroids,
                     k * dim * sizeof(double));
    ck_assert_uint_eq(ms[r].km.points, n);
  }
  ck_assert(ms[0].km.converged);
  ck_assert_uint_eq(ms[0].km.iterations, iters);
  double e = rel_err(c, ms[0].km.centroids, k * dim);
  ck_assert_msg(e <= 1e-6, "%u members: centroids differ from Lloyd's by %g",
                size, e);
  double total = 0;
  for (size_t j = 0; j < k; j++)
    total += ms[0].km.counts[j];
  ck_assert_double_eq(total, (double) n);
  for (uint32_t r = 0; r < size; r++) {
    st_kmeans_result_free(&ms[r].km);
    free(ms[r].init);
  }
  st_kmeans_result_free(&one[0].km);
  free(one[0].init);
  free(c);
  free(x);
}
END_TEST

/* A cluster that gets no point keeps its centroid; identical points give
 * duplicate centroids, not a crash; ties go to the lower index. */
START_TEST(kmeans_empty_cluster) {
  double c[] = {0, 0, 5, 5, 9, 9};
  double acc[6 + 3 + 1] = {2, 4, 0, 0, 27, 27, 2, 0, 3, 1.5};
  size_t empty = 9;
  double moved = st_kmeans_update(c, acc, 3, 2, &empty);
  ck_assert_uint_eq(empty, 1);
  ck_assert_double_eq(c[0], 1.0);
  ck_assert_double_eq(c[1], 2.0);
  ck_assert_double_eq(c[2], 5.0); /* kept */
  ck_assert_double_eq(c[3], 5.0);
  ck_assert_double_eq(c[4], 9.0);
  ck_assert_double_eq_tol(moved, sqrt(5.0), 1e-15);

  float x[5 * 2];
  for (int i = 0; i < 10; i++)
    x[i] = 1.5f;
  st_kmeans_config_t cfg;
  st_kmeans_config_default(&cfg);
  cfg.k = 3;
  member_t ms[1];
  run_members(ms, 1, x, NULL, 5, 2, kmeans_body, &cfg);
  ck_assert_msg(ms[0].rc == 0, "%s", ms[0].err);
  ck_assert(ms[0].km.converged);
  ck_assert_double_eq(ms[0].km.counts[0], 5.0); /* ties: the lowest index */
  ck_assert_double_eq(ms[0].km.counts[1], 0.0);
  ck_assert_double_eq(ms[0].km.objective, 0.0);
  for (int i = 0; i < 6; i++)
    ck_assert_double_eq(ms[0].km.centroids[i], 1.5);
  st_kmeans_result_free(&ms[0].km);
  free(ms[0].init);
}
END_TEST

START_TEST(kmeans_too_few_points) {
  float x[4 * 2] = {1, 2, 3, 4, 5, 6, 7, 8};
  st_kmeans_config_t cfg;
  st_kmeans_config_default(&cfg);
  cfg.k = 6;
  member_t ms[2];
  run_members(ms, 2, x, NULL, 4, 2, kmeans_body, &cfg);
  for (int r = 0; r < 2; r++) {
    ck_assert_int_eq(ms[r].rc, -EINVAL);
    ck_assert_msg(strstr(ms[r].err, "only 4 points") != NULL, "%s", ms[r].err);
    free(ms[r].init);
  }
  st_kmeans_result_t res;
  char err[200];
  cfg.k = 0;
  ck_assert_int_eq(
      st_kmeans_run(&ms[0].comm, &cfg, x, 4, 2, &res, err, sizeof err),
      -EINVAL);
}
END_TEST

/* ==== Least squares ========================================================
 */

/* Solves a (n x n, row-major, overwritten) w = b in long double by Gaussian
 * elimination with partial pivoting. */
static void solve_ld(long double* a, long double* b, size_t n, double* w) {
  for (size_t c = 0; c < n; c++) {
    size_t p = c;
    for (size_t r = c + 1; r < n; r++)
      if (fabsl(a[r * n + c]) > fabsl(a[p * n + c]))
        p = r;
    for (size_t j = 0; j < n; j++) {
      long double t = a[c * n + j];
      a[c * n + j] = a[p * n + j];
      a[p * n + j] = t;
    }
    long double t = b[c];
    b[c] = b[p];
    b[p] = t;
    for (size_t r = c + 1; r < n; r++) {
      long double f = a[r * n + c] / a[c * n + c];
      for (size_t j = c; j < n; j++)
        a[r * n + j] -= f * a[c * n + j];
      b[r] -= f * b[c];
    }
  }
  for (size_t c = n; c-- > 0;) {
    long double s = b[c];
    for (size_t j = c + 1; j < n; j++)
      s -= a[c * n + j] * (long double) w[j];
    w[c] = (double) (s / a[c * n + c]);
  }
}

/* The reference: minimizes ||X w + b - y||^2 + ridge ||w||^2 over the
 * columns `cols` of x (the others' weights 0), with the normal equations
 * of [X 1] in long double, the bias unpenalized. w: dim + 1 (bias last). */
static void reference(const float* x, const float* y, size_t n, size_t dim,
                      const int* cols, double ridge, double* w) {
  size_t p = 0, idx[16];
  for (size_t j = 0; j < dim; j++)
    if (cols == NULL || cols[j])
      idx[p++] = j;
  idx[p++] = dim; /* the intercept */
  long double* a = calloc(p * p, sizeof(long double));
  long double* b = calloc(p, sizeof(long double));
  for (size_t i = 0; i < n; i++) {
    long double z[17];
    for (size_t j = 0; j < p; j++)
      z[j] = idx[j] == dim ? 1.0L : (long double) x[i * dim + idx[j]];
    for (size_t r = 0; r < p; r++) {
      for (size_t c = 0; c < p; c++)
        a[r * p + c] += z[r] * z[c];
      b[r] += z[r] * (long double) y[i];
    }
  }
  for (size_t r = 0; r + 1 < p; r++)
    a[r * p + r] += ridge;
  double sol[17];
  solve_ld(a, b, p, sol);
  memset(w, 0, (dim + 1) * sizeof(double));
  for (size_t j = 0; j < p; j++)
    w[idx[j]] = sol[j];
  free(a);
  free(b);
}

static int lstsq_body(void* arg) {
  member_t* m = arg;
  return st_lstsq_run(&m->comm, m->cfg, m->x, m->y, m->n, m->dim, &m->ls,
                      m->err, sizeof m->err);
}

/* Runs `size` members; checks they agree to the bit; the weights and bias
 * of rank 0 into got (dim + 1). */
static st_lstsq_result_t fit(uint32_t size, const float* x, const float* y,
                             size_t n, size_t dim, const st_lstsq_config_t* cfg,
                             double* got) {
  member_t ms[MAX_MEMBERS];
  run_members(ms, size, x, y, n, dim, lstsq_body, cfg);
  for (uint32_t r = 0; r < size; r++) {
    ck_assert_msg(ms[r].rc == 0, "member %u: %s", r, ms[r].err);
    ck_assert_mem_eq(ms[r].ls.weight, ms[0].ls.weight, dim * sizeof(double));
    ck_assert(ms[r].ls.bias == ms[0].ls.bias);
    ck_assert_uint_eq(ms[r].ls.points, n);
  }
  memcpy(got, ms[0].ls.weight, dim * sizeof(double));
  got[dim] = ms[0].ls.bias;
  st_lstsq_result_t res = ms[0].ls;
  res.weight = NULL;
  for (uint32_t r = 0; r < size; r++)
    st_lstsq_result_free(&ms[r].ls);
  return res;
}

START_TEST(lstsq_normal_matches_reference) {
  uint32_t size = member_counts[_i];
  st_rng_t rng;
  st_rng_seed(&rng, tu_seed());
  size_t n = 803, dim = 6;
  float *x, *y;
  linear_rows(&rng, n, dim, &x, &y);
  double ref[7], got[7];
  st_lstsq_config_t cfg;
  st_lstsq_config_default(&cfg);
  for (int ridged = 0; ridged < 2; ridged++) {
    cfg.ridge = ridged ? 25.0 : 0.0;
    reference(x, y, n, dim, NULL, cfg.ridge, ref);
    st_lstsq_result_t r = fit(size, x, y, n, dim, &cfg, got);
    ck_assert_int_eq(r.solve.solver, ST_LSTSQ_CHOLESKY);
    double e = rel_err(ref, got, dim + 1);
    ck_assert_msg(e <= 1e-8, "%u members, ridge %g: off by %g", size, cfg.ridge,
                  e);
    /* The residuals at the reference, recomputed. */
    double rss = 0;
    for (size_t i = 0; i < n; i++) {
      double t = ref[dim] - y[i];
      for (size_t j = 0; j < dim; j++)
        t += ref[j] * x[i * dim + j];
      rss += t * t;
    }
    ck_assert_double_eq_tol(r.rss, rss, 1e-8 * rss);
  }
  free(x);
  free(y);
}
END_TEST

/* Column 3 repeats column 1 and column 5 is constant: X^T X is singular.
 * Cholesky is refused, pivoted QR gives the minimum-norm solution (the
 * repeated column's weight split in halves, the constant's 0); with a
 * ridge Cholesky works again. */
/* Positive definite but ill-conditioned (rcond below ST_LSTSQ_RCOND_MIN):
 * Cholesky would succeed and lose the digits; the solve says why and
 * takes pivoted QR, whose answer is the solution ([1, 1], also the
 * minimum-norm one of the matrix rounded to rank 1). */
START_TEST(lstsq_ill_conditioned_falls_back) {
  const double xtx[4] = {1.0, 1.0, 1.0, 1.0 + 1e-14};
  const double xty[2] = {2.0, 2.0 + 1e-14};
  double w[2];
  st_lstsq_solve_info_t info;
  ck_assert_int_eq(st_lstsq_solve(xtx, xty, 2, 0.0, w, &info), 0);
  ck_assert(info.positive_definite);
  ck_assert_msg(info.rcond < ST_LSTSQ_RCOND_MIN, "rcond %g", info.rcond);
  ck_assert_int_eq(info.solver, ST_LSTSQ_QR);
  ck_assert_msg(fabs(w[0] - 1) < 1e-6 && fabs(w[1] - 1) < 1e-6, "w %g %g", w[0],
                w[1]);
  /* Well conditioned: Cholesky. */
  const double good[4] = {2.0, 0.5, 0.5, 1.0};
  ck_assert_int_eq(st_lstsq_solve(good, xty, 2, 0.0, w, &info), 0);
  ck_assert_int_eq(info.solver, ST_LSTSQ_CHOLESKY);
  ck_assert(info.rcond >= ST_LSTSQ_RCOND_MIN);
}
END_TEST

START_TEST(lstsq_singular_falls_back) {
  st_rng_t rng;
  st_rng_seed(&rng, tu_seed());
  size_t n = 500, dim = 6;
  float *x, *y;
  linear_rows(&rng, n, dim, &x, &y);
  for (size_t i = 0; i < n; i++) {
    x[i * dim + 3] = x[i * dim + 1];
    x[i * dim + 5] = 2.0f;
  }
  static const int keep[6] = {1, 1, 1, 0, 1, 0};
  double ref[7], got[7];
  reference(x, y, n, dim, keep, 0.0, ref);
  ref[1] /= 2;
  ref[3] = ref[1];
  st_lstsq_config_t cfg;
  st_lstsq_config_default(&cfg);
  st_lstsq_result_t r = fit(3, x, y, n, dim, &cfg, got);
  ck_assert_int_eq(r.solve.solver, ST_LSTSQ_QR);
  ck_assert_uint_eq(r.solve.rank, dim - 2);
  double e = rel_err(ref, got, dim + 1);
  ck_assert_msg(e <= 1e-6, "minimum-norm solution off by %g", e);

  cfg.ridge = 1.0;
  r = fit(3, x, y, n, dim, &cfg, got);
  ck_assert_int_eq(r.solve.solver, ST_LSTSQ_CHOLESKY);
  /* The ridge reference: the constant column is centred away (weight 0),
   * the repeated one shares its weight: solve on the rest with the
   * repeated column doubled, penalized for both halves. */
  /* The ridge reference: the constant column is centred away (weight 0);
   * the repeated one's two weights are equal, v each, so the problem is
   * the one of the other columns and 2 x1 with weight v, penalized 2 v^2,
   * solved here in long double. */
  {
    /* Normal equations of the centred problem in long double. */
    size_t idx[4] = {0, 1, 2, 4};
    long double a[16] = {0}, b[4] = {0}, mx[6] = {0}, my = 0;
    for (size_t i = 0; i < n; i++) {
      for (size_t j = 0; j < dim; j++)
        mx[j] += x[i * dim + j];
      my += y[i];
    }
    for (size_t j = 0; j < dim; j++)
      mx[j] /= n;
    my /= n;
    for (size_t i = 0; i < n; i++)
      for (size_t r2 = 0; r2 < 4; r2++) {
        long double zr = x[i * dim + idx[r2]] - mx[idx[r2]];
        if (idx[r2] == 1)
          zr *= 2; /* both copies of column 1 */
        for (size_t c2 = 0; c2 < 4; c2++) {
          long double zc = x[i * dim + idx[c2]] - mx[idx[c2]];
          if (idx[c2] == 1)
            zc *= 2;
          a[r2 * 4 + c2] += zr * zc;
        }
        b[r2] += zr * (y[i] - my);
      }
    for (size_t r2 = 0; r2 < 4; r2++)
      a[r2 * 4 + r2] += idx[r2] == 1 ? 2.0L : 1.0L; /* ridge on w1 twice */
    double sol[4];
    solve_ld(a, b, 4, sol);
    double want[7] = {sol[0], sol[1], sol[2], sol[1], sol[3], 0, 0};
    long double bias = my;
    for (size_t j = 0; j < dim; j++)
      bias -= mx[j] * want[j];
    want[6] = (double) bias;
    e = rel_err(want, got, dim + 1);
    ck_assert_msg(e <= 1e-8, "ridge on singular data off by %g", e);
  }
  free(x);
  free(y);
}
END_TEST

/* Gradient descent, alpha / (n sqrt(t)), reaches the closed form; three
 * members agree to the bit and with one member to rounding. */
START_TEST(lstsq_gd_matches_closed_form) {
  st_rng_t rng;
  st_rng_seed(&rng, tu_seed());
  size_t n = 600, dim = 4;
  float *x, *y;
  linear_rows(&rng, n, dim, &x, &y);
  double closed[5], gd[5], gd3[5];
  st_lstsq_config_t cfg;
  st_lstsq_config_default(&cfg);
  fit(1, x, y, n, dim, &cfg, closed);
  cfg.method = ST_LSTSQ_GD;
  cfg.max_iter = 20000;
  cfg.tol = 1e-12;
  st_lstsq_result_t r = fit(1, x, y, n, dim, &cfg, gd);
  ck_assert_msg(r.converged, "gd did not converge in %u iterations",
                r.iterations);
  double e = rel_err(closed, gd, dim + 1);
  ck_assert_msg(e <= 1e-6, "gd off the closed form by %g after %u iterations",
                e, r.iterations);
  cfg.max_iter = 300;
  fit(1, x, y, n, dim, &cfg, gd);
  r = fit(3, x, y, n, dim, &cfg, gd3);
  ck_assert_uint_eq(r.iterations, 300);
  e = rel_err(gd, gd3, dim + 1);
  ck_assert_msg(e <= 1e-10, "3 members off 1 member by %g", e);
  free(x);
  free(y);
}
END_TEST

START_TEST(lstsq_refuses) {
  float x[2] = {1, 2}, y[2] = {1, 2};
  st_lstsq_config_t cfg;
  st_lstsq_config_default(&cfg);
  member_t ms[1];
  run_members(ms, 1, x, y, 2, 0, lstsq_body, &cfg); /* no feature */
  ck_assert_int_eq(ms[0].rc, -EINVAL);
  cfg.ridge = -1;
  run_members(ms, 1, x, y, 2, 1, lstsq_body, &cfg);
  ck_assert_int_eq(ms[0].rc, -EINVAL);
  ck_assert_msg(strstr(ms[0].err, "ridge") != NULL, "%s", ms[0].err);
  cfg.ridge = 0;
  run_members(ms, 1, x, y, 0, 1, lstsq_body, &cfg); /* no rows */
  ck_assert_int_eq(ms[0].rc, -EINVAL);
  ck_assert_msg(strstr(ms[0].err, "no rows") != NULL, "%s", ms[0].err);
}
END_TEST

static Suite* algos_suite(void) {
  Suite* s = suite_create("algos");
  int n_counts = (int) (sizeof(member_counts) / sizeof(member_counts[0]));
  TCase* tc = tcase_create("kmeans");
  tcase_add_loop_test(tc, kmeans_matches_lloyd, 0, n_counts);
  tcase_add_test(tc, kmeans_empty_cluster);
  tcase_add_test(tc, kmeans_too_few_points);
  tcase_set_timeout(tc, 60);
  suite_add_tcase(s, tc);
  tc = tcase_create("lstsq");
  tcase_add_loop_test(tc, lstsq_normal_matches_reference, 0, n_counts);
  tcase_add_test(tc, lstsq_singular_falls_back);
  tcase_add_test(tc, lstsq_ill_conditioned_falls_back);
  tcase_add_test(tc, lstsq_gd_matches_closed_form);
  tcase_add_test(tc, lstsq_refuses);
  tcase_set_timeout(tc, 60);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(algos_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
