/* algos.h: parallel k-means and least squares over the members of a
 * group, each holding its own shard of the data (the algos layer:
 * kmeans.c, lstsq.c; docs/collectives.md, "Algorithms"). The math is here;
 * the one collective it needs comes from the caller: the client library
 * (client/comm_algos.c: st_comm_kmeans, st_comm_lstsq) passes its
 * all-reduce, tests sum shards in one process. Every member runs the same
 * call on its own rows and gets the same result, bit for bit. Uses base/,
 * CBLAS and LAPACKE; linked into the client library.
 */
#ifndef STARLING_ALGOS_ALGOS_H
#define STARLING_ALGOS_ALGOS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* data[0..count) becomes its sum over every member, the same bits on every
 * member; returns 0 or a negative errno (the algorithm stops and returns
 * it). Every member calls it the same number of times with the same
 * counts. This member is rank `rank` of `size` (rank 0 is the one whose
 * results are broadcast where members might otherwise differ). */
typedef struct {
  int (*sum)(void* arg, double* data, size_t count);
  void* arg;
  uint32_t rank, size;
} st_algo_comm_t;

/* -- k-means (Lloyd's algorithm, k-means++ initialisation) -- */

typedef struct {
  uint32_t iteration; /* 1-based */
  double objective;   /* sum of squared distances of every point to its
                         nearest centroid, before this iteration's update */
  double moved;       /* the largest distance a centroid moved */
  size_t empty;       /* clusters without a point (their centroid kept) */
} st_kmeans_iter_t;

typedef struct {
  size_t k;          /* clusters, >= 1 */
  uint32_t max_iter; /* iterations at most (default 300) */
  double tol;        /* converged when no centroid moved more than this, in
                        the units of the features (default 1e-4; 0: until
                        no point changes cluster) */
  uint64_t seed;     /* k-means++ (default 1) */
  /* Called after every iteration on the calling thread (may be NULL). */
  void (*progress)(void* arg, const st_kmeans_iter_t* it);
  void* progress_arg;
} st_kmeans_config_t;

typedef struct {
  double* centroids; /* k x dim, row-major; owned */
  double* counts;    /* k: points nearest each final centroid; owned */
  size_t k, dim;
  uint64_t points; /* over every member */
  uint32_t iterations;
  bool converged;   /* stopped by tol rather than max_iter */
  double objective; /* sum of squared distances at the final centroids */
  double moved;     /* the last iteration's largest move */
} st_kmeans_result_t;

void st_kmeans_config_default(st_kmeans_config_t* cfg);

/* Runs k-means on this member's points x (n x dim, row-major; n may be 0)
 * with every other member: the k-means++ initialisation over candidates
 * drawn from every member's points (the draw depends only on the points and
 * the seed, not on how they are sharded), then map, combine (float64 sums
 * and counts), all-reduce and update until converged or max_iter. A point
 * equally near two centroids goes to the lower index; a cluster without a
 * point keeps its previous centroid. On success res holds the result (free
 * with st_kmeans_result_free). Errors: -EINVAL (k = 0, dim = 0, a bad tol,
 * fewer points than k across the members; said in err), -ENOMEM, or what
 * comm->sum returned. */
int st_kmeans_run(const st_algo_comm_t* comm, const st_kmeans_config_t* cfg,
                  const float* x, size_t n, size_t dim, st_kmeans_result_t* res,
                  char* err, size_t err_len);
void st_kmeans_result_free(st_kmeans_result_t* r);

/* The steps of st_kmeans_run, for tests and other drivers. */

/* Candidates for k-means++: 32 k, capped so that one member's share of the
 * gather is at most 2 MiB, and at least k. */
size_t st_kmeans_sample_size(size_t k, size_t dim);
/* A point's key (a hash of its float32 bits and the seed): the candidates
 * are the points with the smallest keys (ties: smaller values first). */
uint64_t st_kmeans_point_key(const float* x, size_t dim, uint64_t seed);
/* k-means++ over m candidates (m x dim) into centroids (k x dim), in
 * float64 with draws from st_rng seeded by seed. 0, -EINVAL (m or k 0) or
 * -ENOMEM. */
int st_kmeans_pp(const double* cand, size_t m, size_t dim, size_t k,
                 uint64_t seed, double* centroids);
/* The initialisation: gathers the candidates from every member, runs
 * st_kmeans_pp, and broadcasts rank 0's centroids (k x dim). *points: the
 * number of points over every member. */
int st_kmeans_init(const st_algo_comm_t* comm, const float* x, size_t n,
                   size_t dim, size_t k, uint64_t seed, double* centroids,
                   uint64_t* points, char* err, size_t err_len);
/* Doubles in a combine's output: k x dim sums, k counts, the objective. */
size_t st_kmeans_acc_len(size_t k, size_t dim);
/* Map and combine: acc (st_kmeans_acc_len) is overwritten with the sums,
 * counts and objective of the points x (n x dim) at the centroids c, each
 * point going to the least |c|^2 - 2 x.c (ties to the lower index). 0 or
 * -ENOMEM. */
int st_kmeans_combine(const float* x, size_t n, size_t dim, const double* c,
                      size_t k, double* acc);
/* The update from a reduced acc: c[j] = sums[j] / counts[j], kept where the
 * count is 0 (their number into *empty, which may be NULL). Returns the
 * largest distance a centroid moved. */
double st_kmeans_update(double* c, const double* acc, size_t k, size_t dim,
                        size_t* empty);

/* -- Least squares -- */

/* Cholesky is trusted down to this reciprocal condition number of the
 * (centred, ridged) normal matrix, whose condition is that of the data
 * squared: below it (features that are, or nearly are, linear combinations
 * of others) the solve turns to QR with column pivoting, which truncates
 * the directions beyond it and gives the minimum-norm solution. At 1e-12
 * Cholesky's relative error, about eps / rcond, stays near 1e-4 at worst. */
#define ST_LSTSQ_RCOND_MIN 1e-12

typedef enum { ST_LSTSQ_NORMAL = 0, ST_LSTSQ_GD = 1 } st_lstsq_method_t;
typedef enum { ST_LSTSQ_CHOLESKY = 0, ST_LSTSQ_QR = 1 } st_lstsq_solver_t;

typedef struct {
  uint32_t iteration; /* 1-based */
  double objective;   /* at the weights before this iteration's step */
  double grad_norm;   /* ||g_t|| / ||g_1|| */
} st_lstsq_iter_t;

typedef struct {
  st_lstsq_method_t method; /* default ST_LSTSQ_NORMAL */
  int intercept;            /* 1 (default): fit a bias (not penalized) */
  double ridge;             /* >= 0 (default 0) */
  /* Gradient descent only: */
  uint32_t max_iter; /* default 1000 */
  double tol;        /* stop at ||g_t|| <= tol ||g_1|| (default 1e-6) */
  double alpha;      /* step alpha / (n sqrt(t)); 0 (default): n / trace of
                        the centred normal matrix plus ridge */
  void (*progress)(void* arg, const st_lstsq_iter_t* it); /* may be NULL */
  void* progress_arg;
} st_lstsq_config_t;

typedef struct {
  st_lstsq_solver_t solver; /* what solved the normal equations */
  double rcond;             /* LAPACK's estimate (0: not positive definite) */
  bool positive_definite;
  size_t rank; /* dim for Cholesky; the rank QR found */
} st_lstsq_solve_info_t;

typedef struct {
  double* weight; /* dim; owned */
  double bias;    /* 0 without an intercept */
  size_t dim;
  uint64_t points;
  st_lstsq_method_t method;
  st_lstsq_solve_info_t solve; /* the normal method */
  double rss;                  /* sum of squared residuals */
  double objective;            /* rss + ridge ||weight||^2 */
  double rmse;                 /* sqrt(rss / points) */
  uint32_t iterations;         /* gd */
  bool converged;              /* gd: stopped by tol */
  double grad_norm;            /* gd: the last ||g_t|| / ||g_1|| */
  double alpha;                /* gd: the alpha used */
} st_lstsq_result_t;

void st_lstsq_config_default(st_lstsq_config_t* cfg);

/* Fits this member's rows (x: n x dim, y: n) with every other member's, by
 * the closed form or by gradient descent (cfg->method; the file comment of
 * lstsq.c gives both). Free res with st_lstsq_result_free. Errors:
 * -EINVAL (dim 0, a bad ridge, tol or alpha, no rows on any member; said in
 * err), -EDOM (LAPACK failed), -ENOMEM, or what comm->sum returned. */
int st_lstsq_run(const st_algo_comm_t* comm, const st_lstsq_config_t* cfg,
                 const float* x, const float* y, size_t n, size_t dim,
                 st_lstsq_result_t* res, char* err, size_t err_len);
void st_lstsq_result_free(st_lstsq_result_t* r);

/* The steps, for tests. Moments: sum of x (dim), sum of y, sum of squared
 * norms of x, n (st_lstsq_moments_len doubles). */
size_t st_lstsq_moments_len(size_t dim);
void st_lstsq_moments(const float* x, const float* y, size_t n, size_t dim,
                      double* out);
/* X^T X (dim x dim, row-major, symmetric) then X^T y (dim) of the rows
 * centred by mean (dim + 1: x_bar then y_bar; NULL: not centred), in
 * float64: st_lstsq_stats_len doubles. 0 or -ENOMEM. */
size_t st_lstsq_stats_len(size_t dim);
int st_lstsq_stats(const float* x, const float* y, size_t n, size_t dim,
                   const double* mean, double* out);
/* Solves (xtx + ridge I) w = xty (dim x dim, row-major): Cholesky, or
 * pivoted QR when the matrix is not positive definite or its rcond is
 * below ST_LSTSQ_RCOND_MIN (info says which). xtx and xty are borrowed.
 * 0, -EINVAL (ridge), -EDOM (LAPACK failed) or -ENOMEM. */
int st_lstsq_solve(const double* xtx, const double* xty, size_t dim,
                   double ridge, double* w, st_lstsq_solve_info_t* info);

#endif /* STARLING_ALGOS_ALGOS_H */
