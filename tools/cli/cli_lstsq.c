/* cli_lstsq.c: `starling lstsq`, linear least squares over a cluster. One
 * runs on every member of a group, next to its node, each with its own
 * shard of the rows; they cooperate through the node's collectives
 * (the client library's st_comm_lstsq runs it; algos/lstsq.c has the
 * math). Every
 * member prints the same weights.
 *
 * Exit status: 0 done, 1 a run-time failure (data, a member that failed or
 * went away, a timeout), 2 bad usage.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "algos/algos.h"
#include "client/starling/client.h"
#include "node/train/train.h"
#include "tools/cli/cli.h"

#define CMD "starling lstsq"
/* Weights the text summary shows (--json has every one). */
#define SHOWN_VALUES 16

enum {
  OPT_RIDGE = ST__ALGO_OPT_END,
  OPT_METHOD,
  OPT_NO_INTERCEPT,
  OPT_MAX_ITER,
  OPT_TOL,
  OPT_ALPHA
};

static const char example[] =
    "starling lstsq --data-dir state --data csv:rows.csv --shard 0/3";

static void usage(FILE* f) {
  fprintf(
      f,
      "usage: starling lstsq --socket PATH --data SPEC [options]\n"
      "\n"
      "Linear least squares over the cluster: minimizes\n"
      "||X w + b - y||^2 + ridge ||w||^2 (the bias b is not penalized). Run it "
      "on\n"
      "every member of the group, next to its node, each with its own shard of "
      "the\n"
      "rows. The closed form (--method normal): every member sums X^T X and "
      "X^T y\n"
      "of its centred rows in float64, one all-reduce adds them up, and every\n"
      "member solves with LAPACK's Cholesky; when X^T X is singular or\n"
      "ill-conditioned it says so and solves by QR with column pivoting "
      "instead\n"
      "(the minimum-norm solution). --method gd: gradient descent with step\n"
      "alpha / (n sqrt(t)), one all-reduce of the gradient an iteration, for "
      "many\n"
      "features (docs/collectives.md, \"Algorithms\").\n"
      "\n"
      "Least squares:\n"
      "  --label-col K|last   the CSV column holding the target y (default: "
      "the last;\n"
      "                       IDX: the label)\n"
      "  --ridge L            L >= 0 (default 0)\n"
      "  --no-intercept       fit no bias b\n"
      "  --method normal|gd   the closed form (default) or gradient "
      "descent\n"
      "  --max-iter N         gd: iterations at most (default 1000)\n"
      "  --tol T              gd: stop when the gradient's norm falls to T "
      "times its\n"
      "                       first (default 1e-6)\n"
      "  --alpha A            gd: the step is A / (n sqrt(t)) (default: n / "
      "trace of\n"
      "                       X^T X + ridge I, centred, which is stable)\n");
  st__algo_flags_usage(f);
  fprintf(f,
          "\n"
          "Example, on each of three machines (K = 0, 1, 2):\n"
          "  %s\n",
          example);
}

typedef struct {
  st__algo_args_t a;
  st_comm_lstsq_opts_t cfg;
} lstsq_args_t;

/* What a fit found: the weights and the call's info. */
typedef struct {
  double* weight; /* dim */
  size_t dim;
  bool gd;
  st_comm_lstsq_info_t info;
} lstsq_out_t;

/* Handles one of the command's own options: 0, 1 (not one), 2 (bad). */
static int own_flag(lstsq_args_t* l, int c, const char* v) {
  uint64_t u;
  switch (c) {
    case OPT_RIDGE:
      return st__parse_double(CMD, "--ridge", v, 0, 1e300, &l->cfg.ridge) ? 2
                                                                          : 0;
    case OPT_METHOD:
      if (strcmp(v, "normal") == 0)
        l->cfg.method = ST_COMM_LSTSQ_NORMAL;
      else if (strcmp(v, "gd") == 0)
        l->cfg.method = ST_COMM_LSTSQ_GD;
      else {
        fprintf(stderr, "%s: --method: '%s' is not normal or gd\n", CMD, v);
        return 2;
      }
      return 0;
    case OPT_NO_INTERCEPT:
      l->cfg.intercept = 0;
      return 0;
    case OPT_MAX_ITER:
      if (st__parse_u64(CMD, "--max-iter", v, 1, UINT32_MAX, &u) != 0)
        return 2;
      l->cfg.max_iter = (uint32_t) u;
      return 0;
    case OPT_TOL:
      return st__parse_double(CMD, "--tol", v, 0, 1, &l->cfg.tol) ? 2 : 0;
    case OPT_ALPHA:
      return st__parse_double(CMD, "--alpha", v, 0, 1e300, &l->cfg.alpha) ? 2
                                                                          : 0;
    default:
      return 1;
  }
}

static int parse_options(lstsq_args_t* l, int argc, char** argv,
                         const struct option* opts) {
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    if (c == 'h') {
      usage(stdout);
      return 0;
    }
    if (c == ':' || c == '?') {
      fprintf(stderr, "%s: %s '%s'; see '%s --help'\n", CMD,
              c == ':' ? "missing value for" : "unknown option",
              argv[optind - 1], CMD);
      return 2;
    }
    int rc = st__algo_flag(&l->a, c, optarg);
    if (rc == 1)
      rc = own_flag(l, c, optarg);
    if (rc != 0)
      return 2;
  }
  if (optind < argc) {
    fprintf(stderr, "%s: unexpected argument '%s'; see '%s --help'\n", CMD,
            argv[optind], CMD);
    return 2;
  }
  return -1;
}

/* Parses argv; returns -1 to go on, else the exit status. */
static int parse(lstsq_args_t* l, int argc, char** argv) {
  struct option opts[ST__ALGO_OPT_END - ST__ALGO_OPT_SOCKET + 10];
  size_t n = st__algo_long_opts_count();
  memcpy(opts, st__algo_long_opts, n * sizeof(opts[0]));
  opts[n++] = (struct option){"ridge", required_argument, NULL, OPT_RIDGE};
  opts[n++] = (struct option){"method", required_argument, NULL, OPT_METHOD};
  opts[n++] =
      (struct option){"no-intercept", no_argument, NULL, OPT_NO_INTERCEPT};
  opts[n++] =
      (struct option){"max-iter", required_argument, NULL, OPT_MAX_ITER};
  opts[n++] = (struct option){"tol", required_argument, NULL, OPT_TOL};
  opts[n++] = (struct option){"alpha", required_argument, NULL, OPT_ALPHA};
  opts[n++] = (struct option){"help", no_argument, NULL, 'h'};
  opts[n] = (struct option){NULL, 0, NULL, 0};
  st__algo_args_init(&l->a, CMD, -1);
  st_comm_lstsq_opts_default(&l->cfg);
  int rc = parse_options(l, argc, argv, opts);
  if (rc >= 0)
    return rc;
  if (l->a.label_col == ST__ALGO_NO_LABEL) {
    fprintf(stderr,
            "%s: --label-col none: least squares needs a target "
            "column\n",
            CMD);
    return 2;
  }
  return st__algo_finish(&l->a, example) != 0 ? 2 : -1;
}

static void progress(void* arg, const st_comm_lstsq_iter_t* it) {
  FILE* log = arg;
  /* Every iteration up to 10, then every 10th up to 100, and so on. */
  uint32_t every = 1;
  while (every <= it->iteration / 10 && every < 1000000)
    every *= 10;
  if (it->iteration % every != 0)
    return;
  fprintf(log,
          "iteration %" PRIu32
          "  objective %.10g  gradient %.3g of the "
          "first\n",
          it->iteration, it->objective, it->grad_norm);
  fflush(log);
}

static const char* solver_name(const lstsq_out_t* r) {
  if (r->gd)
    return "gd";
  return r->info.qr ? "qr" : "cholesky";
}

static void print_json(const lstsq_args_t* l, const lstsq_out_t* r,
                       double seconds) {
  const st_comm_lstsq_info_t* i = &r->info;
  printf("{\"dim\": %zu, \"points\": %" PRIu64
         ", \"members\": %u, \"rank\": %u, \"method\": \"%s\", "
         "\"solver\": \"%s\", \"ridge\": %.17g, \"intercept\": %s, ",
         r->dim, i->points, i->size, i->rank, r->gd ? "gd" : "normal",
         solver_name(r), l->cfg.ridge, l->cfg.intercept ? "true" : "false");
  if (r->gd)
    printf("\"iterations\": %" PRIu32
           ", \"converged\": %s, \"alpha\": %.17g, "
           "\"grad_norm\": %.17g, ",
           i->iterations, i->converged ? "true" : "false", i->alpha,
           i->grad_norm);
  else
    printf("\"iterations\": 1, \"rcond\": %.17g, \"rank\": %zu, ", i->rcond,
           i->solve_rank);
  printf(
      "\"objective\": %.17g, \"rss\": %.17g, \"rmse\": %.17g, "
      "\"time_s\": %.3f, \"weight\": ",
      i->objective, i->rss, i->rmse, seconds);
  st__algo_json_doubles(stdout, r->weight, r->dim);
  printf(", \"bias\": %.17g, \"out\": ", i->bias);
  if (l->a.out != NULL)
    st_json_write_string(stdout, l->a.out);
  else
    printf("null");
  printf("}\n");
}

static void print_text(const lstsq_out_t* r, double seconds) {
  const st_comm_lstsq_info_t* i = &r->info;
  if (r->gd)
    printf("gradient descent: %s after %" PRIu32 " iterations (alpha %.6g)",
           i->converged ? "converged" : "stopped (--max-iter)", i->iterations,
           i->alpha);
  else if (i->positive_definite)
    printf("normal equations solved by %s (rcond %.3g, rank %zu of %zu)",
           i->qr ? "pivoted QR" : "Cholesky", i->rcond, i->solve_rank, r->dim);
  else
    printf(
        "normal equations solved by pivoted QR (not positive definite, "
        "rank %zu of %zu)",
        i->solve_rank, r->dim);
  printf(" in %.2f s: %" PRIu64 " rows x %zu features on %u member%s\n",
         seconds, i->points, r->dim, i->size, i->size == 1 ? "" : "s");
  printf("weight:");
  size_t shown = r->dim < SHOWN_VALUES ? r->dim : SHOWN_VALUES;
  for (size_t j = 0; j < shown; j++)
    printf(" %.10g", r->weight[j]);
  if (shown < r->dim)
    printf(" ... (%zu more: --json or --out has them all)", r->dim - shown);
  printf("\nbias: %.10g\nrss %.10g  rmse %.10g  objective %.10g\n", i->bias,
         i->rss, i->rmse, i->objective);
}

/* The message that the closed form did not use Cholesky. */
static void say_fallback(const lstsq_out_t* r) {
  if (r->gd || !r->info.qr)
    return;
  if (r->info.positive_definite)
    fprintf(stderr,
            "%s: X^T X is ill-conditioned (reciprocal condition number "
            "%.3g < %g)",
            CMD, r->info.rcond, ST_LSTSQ_RCOND_MIN);
  else
    fprintf(stderr, "%s: X^T X is singular (not positive definite)", CMD);
  fprintf(stderr,
          ": solved by QR with column pivoting (LAPACK dgelsy) instead of "
          "Cholesky, rank %zu of %zu: the minimum-norm solution; some "
          "features are (nearly) linear combinations of others; --ridge L "
          "gives a regularized solution instead\n",
          r->info.solve_rank, r->dim);
}

static int write_out(const lstsq_args_t* l, const lstsq_out_t* r) {
  float* w = st__algo_to_floats(r->weight, r->dim);
  float b = (float) r->info.bias;
  char points[32], rss[40], ridge[40];
  snprintf(points, sizeof points, "%" PRIu64, r->info.points);
  snprintf(rss, sizeof rss, "%.17g", r->info.rss);
  snprintf(ridge, sizeof ridge, "%.17g", l->cfg.ridge);
  st_tensor_desc_t t[2] = {{"weight", w, {1, r->dim}, 2}, {"bias", &b, {1}, 1}};
  st_meta_kv_t meta[] = {{"format", "starling-lstsq-1"},
                         {"data", l->a.data},
                         {"method", r->gd ? "gd" : "normal"},
                         {"solver", solver_name(r)},
                         {"ridge", ridge},
                         {"rss", rss},
                         {"points", points}};
  char err[600] = "";
  int rc = w == NULL ? -ENOMEM
                     : st_safetensors_write(l->a.out, t, 2, meta,
                                            sizeof meta / sizeof meta[0], err,
                                            sizeof err);
  if (rc != 0)
    fprintf(stderr, "%s: --out: %s\n", CMD, err[0] ? err : strerror(-rc));
  free(w);
  return rc;
}

/* Joins the group, fits, reports. */
static int run(lstsq_args_t* l, const st_dataset_t* ds) {
  FILE* log = l->a.json ? stderr : stdout;
  lstsq_out_t r = {.dim = ds->dim, .gd = l->cfg.method == ST_COMM_LSTSQ_GD};
  r.weight = calloc(r.dim + 1, sizeof(double));
  st_comm_t* comm = NULL;
  char err[1024] = "";
  double t0 = st_now_s();
  int rc = r.weight == NULL ? -ENOMEM : 0;
  if (rc == 0)
    rc = st_comm_open(l->a.socket, &comm, err, sizeof err);
  if (rc == 0) {
    fprintf(log, "%zu rows x %zu features from %s\n", ds->n, ds->dim,
            ds->source);
    l->cfg.progress = progress;
    l->cfg.progress_arg = log;
    rc = st_comm_lstsq(comm, l->a.group, ds->x, ds->y, ds->n, ds->dim, &l->cfg,
                       l->a.timeout_s, r.weight, &r.info);
    if (rc != 0)
      snprintf(err, sizeof err, "%s", st_comm_error(comm));
  }
  double seconds = st_now_s() - t0;
  st_comm_close(comm);
  if (rc != 0)
    fprintf(stderr, "%s: %s\n", CMD, err[0] ? err : strerror(-rc));
  if (rc == 0) {
    st__algo_say_same_data(CMD, r.info.same_data, r.info.size, ds->n);
    say_fallback(&r);
  }
  if (rc == 0 && l->a.out != NULL && write_out(l, &r) != 0)
    rc = -EIO;
  if (rc == 0 && l->a.json)
    print_json(l, &r, seconds);
  else if (rc == 0)
    print_text(&r, seconds);
  free(r.weight);
  return rc == 0 ? 0 : 1;
}

int st__cmd_lstsq(int argc, char** argv) {
  lstsq_args_t l;
  int rc = parse(&l, argc, argv);
  if (rc >= 0)
    return rc;
  st_dataset_t ds;
  char err[1024] = "";
  if (st__algo_load(&l.a, &ds, err, sizeof err) != 0) {
    fprintf(stderr, "%s: --data: %s\n", CMD, err);
    return 1;
  }
  rc = run(&l, &ds);
  st_dataset_free(&ds);
  return rc;
}
