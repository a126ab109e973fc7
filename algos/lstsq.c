/* lstsq.c: linear least squares over the members of a cluster, each
 * holding its own shard of the rows (algos.h; `starling
 * lstsq`, st_comm_lstsq, docs/collectives.md).
 *
 * It minimizes ||X w + b - y||^2 + ridge ||w||^2 over the weights w (dim)
 * and, with an intercept, the bias b, which is not penalized (as
 * scikit-learn's Ridge does). With an intercept the problem is solved on
 * centred data: one all-reduce of the sums gives the means x_bar and
 * y_bar, the weights solve the centred problem, and b = y_bar - x_bar . w.
 * Centring keeps the normal matrix as well conditioned as the features
 * allow, rather than as badly as an offset makes it.
 *
 * Two ways to the weights:
 *  - normal (the closed form): every member sums Xc^T Xc and Xc^T yc over
 *    its rows in float64 (dim x dim and dim), one all-reduce adds them up,
 *    and every member solves (Xc^T Xc + ridge I) w = Xc^T yc with LAPACK's
 *    Cholesky (dpotrf, dpotrs). When the matrix is not positive definite or
 *    its reciprocal condition number (dpocon) is below ST_LSTSQ_RCOND_MIN,
 *    it solves by QR with column pivoting instead (dgelsy, rank decided at
 *    the same threshold): the minimum-norm solution of a rank-deficient
 *    problem. Rank 0's solution is then broadcast, so that every member
 *    returns the same bits even where LAPACK's kernels differ by CPU.
 *  - gd (for a large dim, where the dim x dim matrix is too big to move):
 *    gradient descent, one all-reduce of dim + 1 doubles an iteration,
 *    w_{t+1} = w_t - alpha / (n sqrt(t)) g_t with g_t = Xc^T (Xc w_t - yc)
 *    + ridge w_t and n the number of rows; alpha defaults to n / trace(Xc^T
 *    Xc + ridge I), which keeps every step stable. It stops when ||g_t||
 *    falls to tol ||g_1|| or after max_iter iterations. The sums are the
 *    same bits everywhere and the update is elementwise, so every member
 *    holds the same weights.
 * Either way one last pass computes the residual sum of squares exactly.
 */
#include "algos/algos.h"

#include <errno.h>
#include <inttypes.h>
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

/* ==== Steps ============================================================== */

size_t st_lstsq_moments_len(size_t dim) {
  return dim + 3;
}

void st_lstsq_moments(const float* x, const float* y, size_t n, size_t dim,
                      double* out) {
  memset(out, 0, st_lstsq_moments_len(dim) * sizeof(double));
  double sq = 0.0;
  for (size_t i = 0; i < n; i++) {
    const float* xi = x + i * dim;
    for (size_t j = 0; j < dim; j++) {
      out[j] += (double) xi[j];
      sq += (double) xi[j] * (double) xi[j];
    }
    out[dim] += (double) y[i];
  }
  out[dim + 1] = sq;
  out[dim + 2] = (double) n;
}

size_t st_lstsq_stats_len(size_t dim) {
  return dim * dim + dim;
}

int st_lstsq_stats(const float* x, const float* y, size_t n, size_t dim,
                   const double* mean, double* out) {
  double* a = out;             /* dim x dim, row-major */
  double* b = out + dim * dim; /* dim */
  memset(out, 0, st_lstsq_stats_len(dim) * sizeof(double));
  double* z = malloc((dim > 0 ? dim : 1) * sizeof(double));
  if (z == NULL)
    return -ENOMEM;
  double y_bar = mean != NULL ? mean[dim] : 0.0;
  for (size_t i = 0; i < n; i++) {
    const float* xi = x + i * dim;
    for (size_t j = 0; j < dim; j++)
      z[j] = (double) xi[j] - (mean != NULL ? mean[j] : 0.0);
    double yc = (double) y[i] - y_bar;
    for (size_t r = 0; r < dim; r++) { /* the upper triangle */
      double zr = z[r];
      double* ar = a + r * dim;
      for (size_t c = r; c < dim; c++)
        ar[c] += zr * z[c];
      b[r] += zr * yc;
    }
  }
  for (size_t r = 0; r < dim; r++) /* mirror it */
    for (size_t c = 0; c < r; c++)
      a[r * dim + c] = a[c * dim + r];
  free(z);
  return 0;
}

/* Pivoted QR (dgelsy) on m + ridge I, the right-hand side b overwritten by
 * the minimum-norm solution. */
static int solve_qr(double* m, size_t dim, double* b,
                    st_lstsq_solve_info_t* info) {
  lapack_int* jpvt = calloc(dim, sizeof(lapack_int));
  if (jpvt == NULL)
    return -ENOMEM;
  lapack_int rank = 0;
  lapack_int n = (lapack_int) dim;
  lapack_int rc = LAPACKE_dgelsy(LAPACK_ROW_MAJOR, n, n, 1, m, n, b, 1, jpvt,
                                 ST_LSTSQ_RCOND_MIN, &rank);
  free(jpvt);
  if (rc != 0)
    return -EDOM;
  info->solver = ST_LSTSQ_QR;
  info->rank = (size_t) rank;
  return 0;
}

int st_lstsq_solve(const double* xtx, const double* xty, size_t dim,
                   double ridge, double* w, st_lstsq_solve_info_t* info) {
  memset(info, 0, sizeof(*info));
  if (dim == 0)
    return 0;
  if (!(ridge >= 0) || !isfinite(ridge))
    return -EINVAL;
  size_t nn = dim * dim;
  double* m = malloc(2 * nn * sizeof(double));
  if (m == NULL)
    return -ENOMEM;
  double* orig = m + nn; /* the matrix again, for the fallback */
  memcpy(m, xtx, nn * sizeof(double));
  for (size_t j = 0; j < dim; j++)
    m[j * dim + j] += ridge;
  memcpy(orig, m, nn * sizeof(double));
  memcpy(w, xty, dim * sizeof(double));
  lapack_int n = (lapack_int) dim;
  double anorm = LAPACKE_dlansy(LAPACK_ROW_MAJOR, '1', 'U', n, m, n);
  lapack_int rc = LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'U', n, m, n);
  double rcond = 0.0;
  if (rc == 0 && anorm > 0)
    rc = LAPACKE_dpocon(LAPACK_ROW_MAJOR, 'U', n, m, n, anorm, &rcond);
  info->rcond = rc == 0 ? rcond : 0.0;
  info->positive_definite = rc == 0 && anorm > 0;
  int out;
  if (rc == 0 && anorm > 0 && rcond >= ST_LSTSQ_RCOND_MIN) {
    out = LAPACKE_dpotrs(LAPACK_ROW_MAJOR, 'U', n, 1, m, n, w, 1) == 0 ? 0
                                                                       : -EDOM;
    info->solver = ST_LSTSQ_CHOLESKY;
    info->rank = dim;
  } else {
    out = solve_qr(orig, dim, w, info);
  }
  free(m);
  return out;
}

/* ==== The two methods ======================================================
 */

void st_lstsq_config_default(st_lstsq_config_t* cfg) {
  memset(cfg, 0, sizeof(*cfg));
  cfg->method = ST_LSTSQ_NORMAL;
  cfg->intercept = 1;
  cfg->max_iter = 1000;
  cfg->tol = 1e-6;
}

void st_lstsq_result_free(st_lstsq_result_t* r) {
  if (r == NULL)
    return;
  free(r->weight);
  memset(r, 0, sizeof(*r));
}

typedef struct {
  const st_algo_comm_t* comm;
  const st_lstsq_config_t* cfg;
  const float* x;
  const float* y;
  size_t n, dim;
  double* mean; /* dim + 1: x_bar, y_bar (zeros without an intercept) */
  double points, trace;
  char* err;
  size_t err_len;
} run_t;

static int reduce(const run_t* r, double* data, size_t count,
                  const char* what) {
  int rc = r->comm->sum(r->comm->arg, data, count);
  if (rc != 0)
    st_set_err(r->err, r->err_len, "the all-reduce of %s failed", what);
  return rc;
}

/* The means (with an intercept), the number of rows and the trace of the
 * centred normal matrix, over every member. */
static int lstsq_moments(run_t* r) {
  size_t dim = r->dim;
  double* mo = malloc(st_lstsq_moments_len(dim) * sizeof(double));
  if (mo == NULL)
    return -ENOMEM;
  st_lstsq_moments(r->x, r->y, r->n, dim, mo);
  int rc = reduce(r, mo, st_lstsq_moments_len(dim), "the row counts and sums");
  if (rc == 0) {
    r->points = mo[dim + 2];
    double sq = mo[dim + 1], mean_sq = 0.0;
    for (size_t j = 0; j <= dim && r->points > 0; j++) {
      r->mean[j] = r->cfg->intercept ? mo[j] / r->points : 0.0;
      if (j < dim)
        mean_sq += r->mean[j] * r->mean[j];
    }
    r->trace = sq - r->points * mean_sq + r->cfg->ridge * (double) dim;
    if (r->points == 0) {
      st_set_err(r->err, r->err_len, "no rows on any member: nothing to fit");
      rc = -EINVAL;
    }
  }
  free(mo);
  return rc;
}

/* Rank 0 solves the summed normal equations; its solution and how it went
 * (solved or not, the solver, rcond, rank) reach every member in one sum
 * to which the others add zeros: every member ends with the same weights
 * and the same account, or fails alike (a solve on each member could fail
 * on one only, and leave it out of that sum). */
static int solve_on_rank0(run_t* r, const double* stats,
                          st_lstsq_result_t* res) {
  size_t dim = r->dim;
  enum { INFO = 5 }; /* failed, solver, rcond, positive definite, rank */
  double* out = calloc(dim + INFO, sizeof(double));
  if (out == NULL)
    return -ENOMEM;
  if (r->comm->rank == 0) {
    int solved = st_lstsq_solve(stats, stats + dim * dim, dim, r->cfg->ridge,
                                res->weight, &res->solve);
    if (solved == 0)
      memcpy(out, res->weight, dim * sizeof(double));
    out[dim] = solved != 0;
    out[dim + 1] = (double) res->solve.solver;
    out[dim + 2] = res->solve.rcond;
    out[dim + 3] = res->solve.positive_definite;
    out[dim + 4] = (double) res->solve.rank;
  }
  int rc = reduce(r, out, dim + INFO, "the solution (broadcast)");
  if (rc == 0 && out[dim] != 0) {
    st_set_err(r->err, r->err_len,
               "LAPACK could not solve the %zu x %zu normal equations", dim,
               dim);
    rc = -EDOM;
  }
  if (rc == 0) {
    memcpy(res->weight, out, dim * sizeof(double));
    res->solve.solver = (st_lstsq_solver_t) out[dim + 1];
    res->solve.rcond = out[dim + 2];
    res->solve.positive_definite = out[dim + 3] != 0;
    res->solve.rank = (size_t) out[dim + 4];
  }
  free(out);
  return rc;
}

static int lstsq_normal(run_t* r, st_lstsq_result_t* res) {
  size_t dim = r->dim, len = st_lstsq_stats_len(dim);
  double* stats = malloc(len * sizeof(double));
  if (stats == NULL)
    return -ENOMEM;
  int rc = st_lstsq_stats(r->x, r->y, r->n, dim, r->mean, stats);
  if (rc != 0)
    st_set_err(r->err, r->err_len, "out of memory summing X^T X");
  else
    rc = reduce(r, stats, len, "X^T X and X^T y");
  if (rc == 0)
    rc = solve_on_rank0(r, stats, res);
  free(stats);
  return rc;
}

/* This member's gradient of the centred problem at w (without the ridge
 * term) into g[0..dim), and its residual sum of squares into g[dim]. */
static void local_gradient(const run_t* r, const double* w, double* g) {
  size_t dim = r->dim;
  memset(g, 0, (dim + 1) * sizeof(double));
  for (size_t i = 0; i < r->n; i++) {
    const float* xi = r->x + i * dim;
    double e = -((double) r->y[i] - r->mean[dim]);
    for (size_t j = 0; j < dim; j++)
      e += ((double) xi[j] - r->mean[j]) * w[j];
    for (size_t j = 0; j < dim; j++)
      g[j] += e * ((double) xi[j] - r->mean[j]);
    g[dim] += e * e;
  }
}

static int lstsq_gd(run_t* r, st_lstsq_result_t* res) {
  size_t dim = r->dim;
  double* g = malloc((dim + 1) * sizeof(double));
  double* w = res->weight;
  if (g == NULL)
    return -ENOMEM;
  double alpha = r->cfg->alpha > 0 ? r->cfg->alpha
                 : r->trace > 0    ? r->points / r->trace
                                   : 1.0;
  res->alpha = alpha;
  memset(w, 0, dim * sizeof(double));
  double g1 = 0.0;
  int rc = 0;
  st_lstsq_iter_t it = {0};
  while (rc == 0 && it.iteration < r->cfg->max_iter && !res->converged) {
    local_gradient(r, w, g);
    if ((rc = reduce(r, g, dim + 1, "the gradient")) != 0)
      break;
    it.iteration++;
    double norm = 0.0, ww = 0.0;
    for (size_t j = 0; j < dim; j++) {
      ww += w[j] * w[j];
      g[j] += r->cfg->ridge * w[j];
      norm += g[j] * g[j];
    }
    norm = sqrt(norm);
    if (it.iteration == 1)
      g1 = norm;
    it.objective = g[dim] + r->cfg->ridge * ww;
    it.grad_norm = g1 > 0 ? norm / g1 : 0.0;
    res->converged = norm <= r->cfg->tol * g1;
    double step = alpha / (r->points * sqrt((double) it.iteration));
    for (size_t j = 0; j < dim && !res->converged; j++)
      w[j] -= step * g[j];
    if (r->cfg->progress != NULL)
      r->cfg->progress(r->cfg->progress_arg, &it);
  }
  res->iterations = it.iteration;
  res->grad_norm = it.grad_norm;
  free(g);
  return rc;
}

/* The bias, and the residual sum of squares and the objective at the
 * solution, over every member. */
static int lstsq_finish(run_t* r, st_lstsq_result_t* res) {
  size_t dim = r->dim;
  double b = r->mean[dim], ww = 0.0;
  for (size_t j = 0; j < dim; j++) {
    b -= r->mean[j] * res->weight[j];
    ww += res->weight[j] * res->weight[j];
  }
  res->bias = r->cfg->intercept ? b : 0.0;
  double rss = 0.0;
  for (size_t i = 0; i < r->n; i++) {
    double e = res->bias - (double) r->y[i];
    for (size_t j = 0; j < dim; j++)
      e += (double) r->x[i * dim + j] * res->weight[j];
    rss += e * e;
  }
  int rc = reduce(r, &rss, 1, "the residuals");
  res->rss = rss;
  res->objective = rss + r->cfg->ridge * ww;
  res->rmse = sqrt(rss / r->points);
  return rc;
}

int st_lstsq_run(const st_algo_comm_t* comm, const st_lstsq_config_t* cfg,
                 const float* x, const float* y, size_t n, size_t dim,
                 st_lstsq_result_t* res, char* err, size_t err_len) {
  memset(res, 0, sizeof(*res));
  if (dim == 0 || !(cfg->ridge >= 0) || !isfinite(cfg->ridge) ||
      !(cfg->tol >= 0) || !isfinite(cfg->alpha) || cfg->alpha < 0) {
    st_set_err(err, err_len,
               "least squares needs at least one feature (got %zu), a "
               "finite ridge >= 0 (got %g), tol >= 0 (got %g) and alpha >= 0 "
               "(got %g)",
               dim, cfg->ridge, cfg->tol, cfg->alpha);
    return -EINVAL;
  }
  run_t r = {comm, cfg, x,   y,      n, dim, calloc(dim + 1, sizeof(double)),
             0,    0,   err, err_len};
  res->weight = calloc(dim, sizeof(double));
  int rc = r.mean == NULL || res->weight == NULL ? -ENOMEM : 0;
  if (rc != 0)
    st_set_err(err, err_len, "out of memory for %zu features", dim);
  if (rc == 0)
    rc = lstsq_moments(&r);
  if (rc == 0)
    rc = cfg->method == ST_LSTSQ_GD ? lstsq_gd(&r, res) : lstsq_normal(&r, res);
  if (rc == 0)
    rc = lstsq_finish(&r, res);
  res->dim = dim;
  res->points = (uint64_t) r.points;
  res->method = cfg->method;
  free(r.mean);
  if (rc != 0) {
    free(res->weight);
    res->weight = NULL;
  }
  return rc;
}
