/* comm_algos.c: parallel k-means and least squares as calls of the client
 * library (client/starling/client.h, "Algorithms over a group"): the
 * session with the group that the algorithms of algos/ run on. A first
 * exchange (min and max of every member's values in two all-reduces)
 * checks that the members agree on the options, the number of features
 * and, for "all", the list of members, and tells whether they all hold the
 * same rows; then the algorithm runs with the group's float64 sum.
 * `starling kmeans` and `starling lstsq` are callers of these.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algos/algos.h"
#include "client/client_internal.h"

typedef struct {
  st_comm_t* c;
  const char* group; /* as given, then the list "all" was at the start */
  char* group_list;  /* owned */
  double timeout_s;
  uint32_t rank, size;
  bool same_data;
  bool sum_failed; /* a collective failed: st_comm_error says why */
} session_t;

/* FNV-1a over len bytes, continuing from h (start: FNV_START). */
#define FNV_START 0xcbf29ce484222325ull
static uint64_t fnv1a(uint64_t h, const void* bytes, size_t len) {
  const unsigned char* p = bytes;
  for (size_t i = 0; i < len; i++)
    h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

/* 52 bits of a hash, exact in a double. */
static double hash52(uint64_t h) {
  return (double) (h >> 12);
}

static int comm_sum(void* arg, double* data, size_t count) {
  session_t* s = arg;
  int rc = st_comm_all_reduce(s->c, s->group, data, count, ST_COMM_F64,
                              ST_COMM_SUM, s->timeout_s);
  s->sum_failed |= rc != 0;
  return rc;
}

/* "all" as the list of members the node sees now (sorted, as ranks are)
 * into s->group_list, and its hash into *hash. */
static int list_all(session_t* s, double* hash) {
  size_t n = 0, rank = 0;
  int rc = st_comm_members(s->c, NULL, 0, &n, &rank);
  if (rc != 0)
    return rc;
  char(*ids)[33] = calloc(n > 0 ? n : 1, sizeof(*ids));
  char* list = malloc(n * 33 + 1);
  size_t again = n;
  rc = ids == NULL || list == NULL
           ? -ENOMEM
           : st_comm_members(s->c, ids, n, &again, &rank);
  if (rc == 0 && again != n) {
    rc = -EAGAIN;
    st__comm_set_error(s->c,
                       "the members changed as they were listed; "
                       "call again");
  }
  if (rc == 0) {
    char* p = list;
    *p = '\0';
    for (size_t i = 0; i < n; i++)
      p += sprintf(p, "%s%s", i ? "," : "", ids[i]);
    *hash = hash52(fnv1a(FNV_START, list, strlen(list)));
    s->group_list = list;
    list = NULL;
  }
  if (rc == -ENOMEM)
    st__comm_set_error(s->c, "out of memory listing the members");
  free(ids);
  free(list);
  return rc;
}

/* The caller's n values v (named by names; a NULL name need not agree),
 * then the number of features, a fingerprint of the rows, whether they
 * are all finite and, for "all", the hash of the members' list: min and
 * max over the group, a difference in one that must agree an error
 * naming it. A member that cannot list "all" still takes part, with a
 * list slot that differs from every other (-inf, +inf), so that every
 * member fails alike rather than the others waiting for it; rows with a
 * NaN or an infinity on any member fail every member too. */
static int session_open(session_t* s, st_comm_t* c, const char* group,
                        double timeout_s, const double* v,
                        const char* const* names, size_t n, size_t dim,
                        double fingerprint, bool has_rows, bool finite) {
  memset(s, 0, sizeof(*s));
  s->c = c;
  s->group = group != NULL && strcmp(group, "all") == 0 ? NULL : group;
  s->timeout_s = timeout_s;
  enum { MAX_VALUES = 16 };
  double lo[MAX_VALUES], hi[MAX_VALUES];
  const char* all_names[MAX_VALUES];
  size_t count = n + 3;
  memcpy(lo, v, n * sizeof(double));
  memcpy(all_names, names, n * sizeof(char*));
  lo[n] = (double) dim;
  all_names[n] = "the number of features (columns)";
  lo[n + 1] = fingerprint;
  all_names[n + 1] = NULL;
  lo[n + 2] = finite ? 1 : 0; /* every member's must be 1: below */
  all_names[n + 2] = NULL;
  int local = 0; /* this member's own failure, told the others first */
  if (s->group == NULL) {
    local = list_all(s, &lo[n + 3]);
    all_names[n + 3] =
        "the members of the group (one joined or left as "
        "they started: call again)";
    count++;
  }
  memcpy(hi, lo, count * sizeof(double));
  if (local != 0) {
    lo[n + 3] = -INFINITY;
    hi[n + 3] = INFINITY;
  }
  char mine[768];
  snprintf(mine, sizeof mine, "%s", st_comm_error(c));
  int rc = local == -ENOTCONN ? local : 0; /* no node: nothing to tell */
  if (rc == 0)
    rc = st_comm_all_reduce(c, s->group, lo, count, ST_COMM_F64, ST_COMM_MIN,
                            timeout_s);
  if (rc == 0)
    rc = st_comm_all_reduce(c, s->group, hi, count, ST_COMM_F64, ST_COMM_MAX,
                            timeout_s);
  if (rc == 0 && local != 0) {
    st__comm_set_error(c, mine); /* the others fail on the list's slot */
    rc = local;
  }
  for (size_t i = 0; rc == 0 && i < count; i++)
    if (lo[i] != hi[i] && all_names[i] != NULL) {
      char text[512];
      snprintf(text, sizeof text,
               "the members disagree on %s (from %.17g to %.17g): every "
               "member must make the same call, with the same kind of data",
               all_names[i], lo[i], hi[i]);
      st__comm_set_error(c, text);
      rc = -EINVAL;
    }
  if (rc == 0 && lo[n + 2] != 1) {
    st__comm_set_error(c, finite ? "a member's rows hold a NaN or an "
                                   "infinity (not this member's): nothing "
                                   "was computed"
                                 : "this member's rows hold a NaN or an "
                                   "infinity: nothing was computed");
    rc = -EINVAL;
  }
  if (rc != 0)
    return rc;
  st_comm_last_group(c, &s->rank, &s->size);
  s->same_data = s->size > 1 && has_rows && lo[n + 1] == hi[n + 1];
  if (s->group == NULL)
    s->group = s->group_list; /* "all" as it was at the agreement */
  return 0;
}

static void session_close(session_t* s) {
  free(s->group_list);
  s->group_list = NULL;
}

/* An error of the algorithm: the comm's own when a sum failed (it is
 * already said), else the algorithm's sentence. */
static void algo_failed(const session_t* s, int rc, const char* err) {
  if (!s->sum_failed)
    st__comm_set_error(s->c, err[0] ? err : strerror(-rc));
}

/* Whether every value of the rows is finite. */
static bool rows_finite(const float* x, const float* y, size_t n, size_t dim) {
  bool ok = true;
  for (size_t i = 0; i < n * dim; i++)
    ok &= isfinite(x[i]) != 0;
  for (size_t i = 0; y != NULL && i < n; i++)
    ok &= isfinite(y[i]) != 0;
  return ok;
}

static double rows_fingerprint(const float* x, const float* y, size_t n,
                               size_t dim) {
  uint64_t h = fnv1a(FNV_START, x, n * dim * sizeof(float));
  if (y != NULL)
    h = fnv1a(h, y, n * sizeof(float));
  return hash52(h);
}

/* ---- k-means ---------------------------------------------------------- */

void st_comm_kmeans_opts_default(st_comm_kmeans_opts_t* o) {
  st_kmeans_config_t cfg;
  st_kmeans_config_default(&cfg);
  memset(o, 0, sizeof(*o));
  o->k = cfg.k;
  o->max_iter = cfg.max_iter;
  o->tol = cfg.tol;
  o->seed = cfg.seed;
}

static void kmeans_progress(void* arg, const st_kmeans_iter_t* it) {
  const st_comm_kmeans_opts_t* o = arg;
  st_comm_kmeans_iter_t out = {it->iteration, it->objective, it->moved,
                               it->empty};
  o->progress(o->progress_arg, &out);
}

int st_comm_kmeans(st_comm_t* c, const char* group, const float* x, size_t n,
                   size_t dim, const st_comm_kmeans_opts_t* opts,
                   double timeout_s, double* centroids, double* counts,
                   st_comm_kmeans_info_t* info) {
  if (c == NULL)
    return -EINVAL;
  if (opts == NULL || centroids == NULL || counts == NULL ||
      (x == NULL && n > 0)) {
    st__comm_set_error(c,
                       "st_comm_kmeans: opts, centroids, counts (and x "
                       "when n > 0) are required");
    return -EINVAL;
  }
  const double v[] = {(double) opts->k, (double) (opts->seed >> 32),
                      (double) (opts->seed & 0xFFFFFFFFu),
                      (double) opts->max_iter, opts->tol};
  const char* const names[] = {"k, the number of clusters", "the seed",
                               "the seed", "max_iter", "tol"};
  session_t s;
  int rc = session_open(&s, c, group, timeout_s, v, names, 5, dim,
                        rows_fingerprint(x, NULL, n, dim), n > 0,
                        rows_finite(x, NULL, n, dim));
  if (rc != 0) {
    session_close(&s);
    return rc;
  }
  st_kmeans_config_t cfg;
  st_kmeans_config_default(&cfg);
  cfg.k = opts->k;
  cfg.max_iter = opts->max_iter;
  cfg.tol = opts->tol;
  cfg.seed = opts->seed;
  if (opts->progress != NULL) {
    cfg.progress = kmeans_progress;
    cfg.progress_arg = (void*) opts;
  }
  st_algo_comm_t algo = {comm_sum, &s, s.rank, s.size};
  st_kmeans_result_t r;
  memset(&r, 0, sizeof r);
  char err[512] = "";
  rc = st_kmeans_run(&algo, &cfg, x, n, dim, &r, err, sizeof err);
  if (rc != 0) {
    algo_failed(&s, rc, err);
  } else {
    memcpy(centroids, r.centroids, r.k * r.dim * sizeof(double));
    memcpy(counts, r.counts, r.k * sizeof(double));
    if (info != NULL)
      *info = (st_comm_kmeans_info_t){r.points,    r.iterations, r.converged,
                                      r.objective, r.moved,      s.rank,
                                      s.size,      s.same_data};
  }
  st_kmeans_result_free(&r);
  session_close(&s);
  return rc;
}

/* ---- Least squares ---------------------------------------------------- */

void st_comm_lstsq_opts_default(st_comm_lstsq_opts_t* o) {
  st_lstsq_config_t cfg;
  st_lstsq_config_default(&cfg);
  memset(o, 0, sizeof(*o));
  o->method = (st_comm_lstsq_method_t) cfg.method;
  o->intercept = cfg.intercept;
  o->ridge = cfg.ridge;
  o->max_iter = cfg.max_iter;
  o->tol = cfg.tol;
  o->alpha = cfg.alpha;
}

static void lstsq_progress(void* arg, const st_lstsq_iter_t* it) {
  const st_comm_lstsq_opts_t* o = arg;
  st_comm_lstsq_iter_t out = {it->iteration, it->objective, it->grad_norm};
  o->progress(o->progress_arg, &out);
}

static void lstsq_info(const st_lstsq_result_t* r, const session_t* s,
                       st_comm_lstsq_info_t* info) {
  memset(info, 0, sizeof(*info));
  info->bias = r->bias;
  info->points = r->points;
  info->qr = r->method == ST_LSTSQ_NORMAL && r->solve.solver == ST_LSTSQ_QR;
  info->positive_definite = r->solve.positive_definite;
  info->rcond = r->solve.rcond;
  info->solve_rank = r->solve.rank;
  info->rss = r->rss;
  info->objective = r->objective;
  info->rmse = r->rmse;
  info->iterations = r->iterations;
  info->converged = r->converged;
  info->grad_norm = r->grad_norm;
  info->alpha = r->alpha;
  info->rank = s->rank;
  info->size = s->size;
  info->same_data = s->same_data;
}

int st_comm_lstsq(st_comm_t* c, const char* group, const float* x,
                  const float* y, size_t n, size_t dim,
                  const st_comm_lstsq_opts_t* opts, double timeout_s,
                  double* weight, st_comm_lstsq_info_t* info) {
  if (c == NULL)
    return -EINVAL;
  if (opts == NULL || weight == NULL || ((x == NULL || y == NULL) && n > 0)) {
    st__comm_set_error(c,
                       "st_comm_lstsq: opts, weight (and x and y when "
                       "n > 0) are required");
    return -EINVAL;
  }
  if (opts->method != ST_COMM_LSTSQ_NORMAL &&
      opts->method != ST_COMM_LSTSQ_GD) {
    st__comm_set_error(c,
                       "st_comm_lstsq: method is ST_COMM_LSTSQ_NORMAL or "
                       "ST_COMM_LSTSQ_GD");
    return -EINVAL;
  }
  const double v[] = {(double) opts->method,
                      (double) (opts->intercept != 0),
                      opts->ridge,
                      (double) opts->max_iter,
                      opts->tol,
                      opts->alpha};
  const char* const names[] = {"the method", "the intercept", "ridge",
                               "max_iter",   "tol",           "alpha"};
  session_t s;
  int rc = session_open(&s, c, group, timeout_s, v, names, 6, dim,
                        rows_fingerprint(x, y, n, dim), n > 0,
                        rows_finite(x, y, n, dim));
  if (rc != 0) {
    session_close(&s);
    return rc;
  }
  st_lstsq_config_t cfg;
  st_lstsq_config_default(&cfg);
  cfg.method = (st_lstsq_method_t) opts->method;
  cfg.intercept = opts->intercept != 0;
  cfg.ridge = opts->ridge;
  cfg.max_iter = opts->max_iter;
  cfg.tol = opts->tol;
  cfg.alpha = opts->alpha;
  if (opts->progress != NULL) {
    cfg.progress = lstsq_progress;
    cfg.progress_arg = (void*) opts;
  }
  st_algo_comm_t algo = {comm_sum, &s, s.rank, s.size};
  st_lstsq_result_t r;
  memset(&r, 0, sizeof r);
  char err[512] = "";
  rc = st_lstsq_run(&algo, &cfg, x, y, n, dim, &r, err, sizeof err);
  if (rc != 0) {
    algo_failed(&s, rc, err);
  } else {
    memcpy(weight, r.weight, r.dim * sizeof(double));
    if (info != NULL)
      lstsq_info(&r, &s, info);
  }
  st_lstsq_result_free(&r);
  session_close(&s);
  return rc;
}
