/* cli_kmeans.c: `starling kmeans`, parallel k-means over a cluster. One
 * runs on every member of a group, next to its node, each with its own
 * shard of the points; they cooperate through the node's collectives
 * (the client library's st_comm_kmeans runs it; algos/kmeans.c has the
 * math).
 * Every member prints the same centroids.
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
#include "client/starling/client.h"
#include "node/train/train.h"
#include "tools/cli/cli.h"

#define CMD "starling kmeans"
/* Values of a centroid the text summary shows (--json has every one). */
#define SHOWN_VALUES 8

enum { OPT_K = ST__ALGO_OPT_END, OPT_MAX_ITER, OPT_TOL, OPT_SEED };

static const char example[] =
    "starling kmeans --data-dir state --data csv:points.csv --shard 0/3 --k 8";

static void usage(FILE* f) {
  fprintf(
      f,
      "usage: starling kmeans --socket PATH --data SPEC --k K [options]\n"
      "\n"
      "Parallel k-means (Lloyd's algorithm) over the cluster. Run it on "
      "every member\n"
      "of the group, next to its node, each with its own shard of the "
      "points: each\n"
      "iteration every member assigns its points to the nearest centroid, "
      "sums them\n"
      "per cluster in float64, and one all-reduce adds the sums up, so "
      "every member\n"
      "computes the same new centroids. The start is k-means++ over "
      "candidates drawn\n"
      "from every member's points by a seeded hash, the same however the "
      "points are\n"
      "sharded. A point equally near two centroids goes to the lower "
      "index; a cluster\n"
      "that gets no point keeps its previous centroid "
      "(docs/collectives.md,\n"
      "\"Algorithms\").\n"
      "\n"
      "k-means:\n"
      "  --k K                clusters (required)\n"
      "  --max-iter N         iterations at most (default 300)\n"
      "  --tol T              stop when no centroid moves more than T, in "
      "the units of\n"
      "                       the features (default 1e-4; 0: until no "
      "point changes\n"
      "                       cluster)\n"
      "  --seed S             the k-means++ draw (default 1)\n"
      "  --label-col K|none   a CSV column to leave out (default none: every "
      "column is\n"
      "                       a feature); IDX labels are never used\n");
  st__algo_flags_usage(f);
  fprintf(f,
          "\n"
          "Example, on each of three machines (K = 0, 1, 2):\n"
          "  %s\n",
          example);
}

typedef struct {
  st__algo_args_t a;
  st_comm_kmeans_opts_t cfg;
} kmeans_args_t;

/* What a run found: the centroids and counts, and the call's info. */
typedef struct {
  double* centroids; /* k x dim */
  double* counts;    /* k */
  size_t k, dim;
  st_comm_kmeans_info_t info;
} kmeans_out_t;

/* Handles one of the command's own options: 0, 1 (not one), 2 (bad). */
static int own_flag(kmeans_args_t* k, int c, const char* v) {
  uint64_t u;
  switch (c) {
    case OPT_K:
      if (st__parse_u64(CMD, "--k", v, 1, 1u << 20, &u) != 0)
        return 2;
      k->cfg.k = (size_t) u;
      return 0;
    case OPT_MAX_ITER:
      if (st__parse_u64(CMD, "--max-iter", v, 0, UINT32_MAX, &u) != 0)
        return 2;
      k->cfg.max_iter = (uint32_t) u;
      return 0;
    case OPT_TOL:
      return st__parse_double(CMD, "--tol", v, 0, 1e300, &k->cfg.tol) ? 2 : 0;
    case OPT_SEED:
      if (st__parse_u64(CMD, "--seed", v, 0, UINT64_MAX, &k->cfg.seed) != 0)
        return 2;
      return 0;
    default:
      return 1;
  }
}

/* Parses argv; returns -1 to go on, else the exit status. */
static int parse(kmeans_args_t* k, int argc, char** argv) {
  struct option opts[ST__ALGO_OPT_END - ST__ALGO_OPT_SOCKET + 8];
  size_t n = st__algo_long_opts_count();
  memcpy(opts, st__algo_long_opts, n * sizeof(opts[0]));
  opts[n++] = (struct option){"k", required_argument, NULL, OPT_K};
  opts[n++] =
      (struct option){"max-iter", required_argument, NULL, OPT_MAX_ITER};
  opts[n++] = (struct option){"tol", required_argument, NULL, OPT_TOL};
  opts[n++] = (struct option){"seed", required_argument, NULL, OPT_SEED};
  opts[n++] = (struct option){"help", no_argument, NULL, 'h'};
  opts[n] = (struct option){NULL, 0, NULL, 0};
  st__algo_args_init(&k->a, CMD, ST__ALGO_NO_LABEL);
  st_comm_kmeans_opts_default(&k->cfg);
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
    int rc = st__algo_flag(&k->a, c, optarg);
    if (rc == 1)
      rc = own_flag(k, c, optarg);
    if (rc != 0)
      return 2;
  }
  if (optind < argc) {
    fprintf(stderr, "%s: unexpected argument '%s'; see '%s --help'\n", CMD,
            argv[optind], CMD);
    return 2;
  }
  if (k->cfg.k == 0) {
    fprintf(stderr, "%s: --k K is needed, e.g.\n  %s\n", CMD, example);
    return 2;
  }
  return st__algo_finish(&k->a, example) != 0 ? 2 : -1;
}

static void progress(void* arg, const st_comm_kmeans_iter_t* it) {
  FILE* log = arg;
  fprintf(log, "iteration %" PRIu32 "  objective %.10g  moved %.6g",
          it->iteration, it->objective, it->moved);
  if (it->empty > 0)
    fprintf(log, "  empty %zu (kept)", it->empty);
  fputc('\n', log);
  fflush(log);
}

static void print_json(const kmeans_args_t* k, const kmeans_out_t* r,
                       double seconds) {
  const st_comm_kmeans_info_t* i = &r->info;
  printf("{\"k\": %zu, \"dim\": %zu, \"points\": %" PRIu64
         ", \"members\": %u, \"rank\": %u, \"iterations\": %" PRIu32
         ", \"converged\": %s, \"objective\": %.17g, \"moved\": %.17g, "
         "\"seed\": %" PRIu64
         ", \"tol\": %.17g, \"time_s\": %.3f, "
         "\"centroids\": [",
         r->k, r->dim, i->points, i->size, i->rank, i->iterations,
         i->converged ? "true" : "false", i->objective, i->moved, k->cfg.seed,
         k->cfg.tol, seconds);
  for (size_t j = 0; j < r->k; j++) {
    if (j > 0)
      printf(", ");
    st__algo_json_doubles(stdout, r->centroids + j * r->dim, r->dim);
  }
  printf("], \"counts\": ");
  st__algo_json_doubles(stdout, r->counts, r->k);
  printf(", \"out\": ");
  if (k->a.out != NULL)
    st_json_write_string(stdout, k->a.out);
  else
    printf("null");
  printf("}\n");
}

static void print_text(const kmeans_out_t* r, double seconds) {
  const st_comm_kmeans_info_t* i = &r->info;
  printf("%s after %" PRIu32 " iterations in %.2f s: %" PRIu64
         " points x %zu features on %u member%s, k %zu, objective %.10g\n",
         i->converged ? "converged" : "stopped (--max-iter)", i->iterations,
         seconds, i->points, r->dim, i->size, i->size == 1 ? "" : "s", r->k,
         i->objective);
  for (size_t j = 0; j < r->k; j++) {
    printf("centroid %zu (%.0f points):", j, r->counts[j]);
    size_t shown = r->dim < SHOWN_VALUES ? r->dim : SHOWN_VALUES;
    for (size_t t = 0; t < shown; t++)
      printf(" %.6g", r->centroids[j * r->dim + t]);
    if (shown < r->dim)
      printf(" ... (%zu more: --json or --out has them all)", r->dim - shown);
    printf("\n");
  }
}

static int write_out(const kmeans_args_t* k, const kmeans_out_t* r) {
  const st_comm_kmeans_info_t* i = &r->info;
  float* c = st__algo_to_floats(r->centroids, r->k * r->dim);
  float* n = st__algo_to_floats(r->counts, r->k);
  char iters[32], obj[40], points[32], seed[32];
  snprintf(iters, sizeof iters, "%" PRIu32, i->iterations);
  snprintf(obj, sizeof obj, "%.17g", i->objective);
  snprintf(points, sizeof points, "%" PRIu64, i->points);
  snprintf(seed, sizeof seed, "%" PRIu64, k->cfg.seed);
  st_tensor_desc_t t[2] = {{"centroids", c, {r->k, r->dim}, 2},
                           {"counts", n, {r->k}, 1}};
  st_meta_kv_t meta[] = {{"format", "starling-kmeans-1"},
                         {"data", k->a.data},
                         {"iterations", iters},
                         {"objective", obj},
                         {"points", points},
                         {"seed", seed},
                         {"converged", i->converged ? "true" : "false"}};
  char err[600] = "";
  int rc =
      c == NULL || n == NULL
          ? -ENOMEM
          : st_safetensors_write(k->a.out, t, 2, meta,
                                 sizeof meta / sizeof meta[0], err, sizeof err);
  if (rc != 0)
    fprintf(stderr, "%s: --out: %s\n", CMD, err[0] ? err : strerror(-rc));
  free(c);
  free(n);
  return rc;
}

/* Joins the group, runs k-means, reports. */
static int run(kmeans_args_t* k, const st_dataset_t* ds) {
  FILE* log = k->a.json ? stderr : stdout;
  kmeans_out_t r = {.k = k->cfg.k, .dim = ds->dim};
  r.centroids = calloc(r.k * r.dim + 1, sizeof(double));
  r.counts = calloc(r.k + 1, sizeof(double));
  st_comm_t* comm = NULL;
  char err[1024] = "";
  double t0 = st_now_s();
  int rc = r.centroids == NULL || r.counts == NULL ? -ENOMEM : 0;
  if (rc == 0)
    rc = st_comm_open(k->a.socket, &comm, err, sizeof err);
  if (rc == 0) {
    fprintf(log, "%zu points x %zu features from %s\n", ds->n, ds->dim,
            ds->source);
    k->cfg.progress = progress;
    k->cfg.progress_arg = log;
    rc = st_comm_kmeans(comm, k->a.group, ds->x, ds->n, ds->dim, &k->cfg,
                        k->a.timeout_s, r.centroids, r.counts, &r.info);
    if (rc != 0)
      snprintf(err, sizeof err, "%s", st_comm_error(comm));
  }
  double seconds = st_now_s() - t0;
  st_comm_close(comm);
  if (rc != 0)
    fprintf(stderr, "%s: %s\n", CMD, err[0] ? err : strerror(-rc));
  if (rc == 0)
    st__algo_say_same_data(CMD, r.info.same_data, r.info.size, ds->n);
  if (rc == 0 && k->a.out != NULL && write_out(k, &r) != 0)
    rc = -EIO;
  if (rc == 0 && k->a.json)
    print_json(k, &r, seconds);
  else if (rc == 0)
    print_text(&r, seconds);
  free(r.centroids);
  free(r.counts);
  return rc == 0 ? 0 : 1;
}

int st__cmd_kmeans(int argc, char** argv) {
  kmeans_args_t k;
  int rc = parse(&k, argc, argv);
  if (rc >= 0)
    return rc;
  st_dataset_t ds;
  char err[1024] = "";
  if (st__algo_load(&k.a, &ds, err, sizeof err) != 0) {
    fprintf(stderr, "%s: --data: %s\n", CMD, err);
    return 1;
  }
  rc = run(&k, &ds);
  st_dataset_free(&ds);
  return rc;
}
