/* cli_algos.c: what `starling kmeans` and `starling lstsq` share (cli.h,
 * "Algorithms"): their common flags (the node's socket, the data and its
 * shard, the group, the timeout, the output), loading the shard, and
 * what they print around the client library's st_comm_kmeans and
 * st_comm_lstsq (client/starling/client.h), which run the algorithms.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/train/train.h"
#include "tools/cli/cli.h"

/* ==== Flags ================================================================
 */

const struct option st__algo_long_opts[] = {
    {"socket", required_argument, NULL, ST__ALGO_OPT_SOCKET},
    {"data-dir", required_argument, NULL, ST__ALGO_OPT_DATA_DIR},
    {"data", required_argument, NULL, ST__ALGO_OPT_DATA},
    {"shard", required_argument, NULL, ST__ALGO_OPT_SHARD},
    {"label-col", required_argument, NULL, ST__ALGO_OPT_LABEL_COL},
    {"group", required_argument, NULL, ST__ALGO_OPT_GROUP},
    {"timeout", required_argument, NULL, ST__ALGO_OPT_TIMEOUT},
    {"out", required_argument, NULL, ST__ALGO_OPT_OUT},
    {"json", no_argument, NULL, ST__ALGO_OPT_JSON},
    {NULL, 0, NULL, 0},
};

size_t st__algo_long_opts_count(void) {
  return sizeof(st__algo_long_opts) / sizeof(st__algo_long_opts[0]) - 1;
}

void st__algo_args_init(st__algo_args_t* a, const char* cmd, int label_col) {
  memset(a, 0, sizeof(*a));
  a->cmd = cmd;
  a->shard_n = 1;
  a->label_col = label_col;
  a->timeout_s = 300;
}

static int parse_label_col(st__algo_args_t* a, const char* v) {
  if (strcmp(v, "none") == 0) {
    a->label_col = ST__ALGO_NO_LABEL;
    return 0;
  }
  if (strcmp(v, "last") == 0) {
    a->label_col = -1;
    return 0;
  }
  uint64_t col;
  if (st__parse_u64(a->cmd, "--label-col", v, 0, 1u << 20, &col) != 0)
    return 2;
  a->label_col = (int) col;
  return 0;
}

int st__algo_flag(st__algo_args_t* a, int opt, const char* v) {
  switch (opt) {
    case ST__ALGO_OPT_SOCKET:
      a->socket = v;
      return 0;
    case ST__ALGO_OPT_DATA_DIR:
      a->data_dir = v;
      return 0;
    case ST__ALGO_OPT_DATA:
      a->data = v;
      return 0;
    case ST__ALGO_OPT_SHARD:
      if (st_shard_parse(v, &a->shard_k, &a->shard_n) != 0) {
        fprintf(stderr, "%s: --shard: '%s' is not K/N with 0 <= K < N\n",
                a->cmd, v);
        return 2;
      }
      return 0;
    case ST__ALGO_OPT_LABEL_COL:
      return parse_label_col(a, v);
    case ST__ALGO_OPT_GROUP:
      a->group = strcmp(v, "all") == 0 ? NULL : v;
      return 0;
    case ST__ALGO_OPT_TIMEOUT:
      return st__parse_double(a->cmd, "--timeout", v, 0, 1e9, &a->timeout_s)
                 ? 2
                 : 0;
    case ST__ALGO_OPT_OUT:
      a->out = v;
      return 0;
    case ST__ALGO_OPT_JSON:
      a->json = 1;
      return 0;
    default:
      return 1;
  }
}

int st__algo_finish(st__algo_args_t* a, const char* example) {
  if (a->data == NULL || (a->socket == NULL && a->data_dir == NULL)) {
    fprintf(stderr,
            "%s: --data SPEC and --socket PATH (or --data-dir DIR) are "
            "needed, e.g.\n  %s\nsee '%s --help'\n",
            a->cmd, example, a->cmd);
    return 2;
  }
  if (a->socket == NULL) {
    int len = snprintf(a->socket_buf, sizeof(a->socket_buf), "%s/control.sock",
                       a->data_dir);
    if (len < 0 || (size_t) len >= sizeof(a->socket_buf)) {
      fprintf(stderr, "%s: --data-dir: the path is too long\n", a->cmd);
      return 2;
    }
    a->socket = a->socket_buf;
  }
  return 0;
}

void st__algo_flags_usage(FILE* f) {
  fprintf(
      f,
      "\n"
      "The node and the group:\n"
      "  --socket PATH        the local node's control socket "
      "(DATA_DIR/control.sock)\n"
      "  --data-dir DIR       the same, as DIR/control.sock\n"
      "  --group all|IDS      the members that take part: every member alive "
      "now\n"
      "                       (default), or a comma-separated list of member "
      "ids\n"
      "                       (starling peers); each of them runs this "
      "command\n"
      "  --timeout S          how long one step waits for the others "
      "(default 300;\n"
      "                       0: no limit); a member that dies fails it at "
      "once\n"
      "Data (this member's rows):\n"
      "  --data SPEC          fashion-mnist | idx:IMAGES,LABELS | csv:FILE "
      "(as for\n"
      "                       starling train; a test set in the spec is not "
      "used)\n"
      "  --shard K/N          keep rows i with i %% N == K (default 0/1: "
      "all); give\n"
      "                       each member its own K, or its own file\n"
      "Output:\n"
      "  --out FILE           write the result as safetensors (float32)\n"
      "  --json               print the result as one JSON object on stdout "
      "(float64,\n"
      "                       every digit); progress goes to stderr\n"
      "  -h, --help           this help\n");
}

/* ==== Data =================================================================
 */

/* Keeps shard k of n of a dataset loaded whole: rows i with i % n == k. */
static int keep_shard(st_dataset_t* ds, uint32_t k, uint32_t n) {
  size_t* idx = NULL;
  size_t count = 0;
  int rc = st_shard_indices(ds->n, k, n, &idx, &count);
  if (rc != 0)
    return rc;
  float* x = malloc((count > 0 ? count : 1) * ds->dim * sizeof(float));
  float* y = malloc((count > 0 ? count : 1) * sizeof(float));
  if (x == NULL || y == NULL) {
    free(idx);
    free(x);
    free(y);
    return -ENOMEM;
  }
  st_dataset_gather(ds, idx, count, x, y);
  free(idx);
  free(ds->x);
  free(ds->y);
  ds->x = x;
  ds->y = y;
  ds->total = ds->n;
  ds->n = count;
  ds->shard_k = k;
  ds->shard_n = n;
  return 0;
}

/* A CSV file whose every column is a feature (kmeans without --label-col). */
static int load_csv_features(const st__algo_args_t* a, st_dataset_t* ds,
                             char* err, size_t err_len) {
  const char* path = a->data + 4;
  if (strchr(path, ',') != NULL) {
    st_set_err(err, err_len,
               "'%s': give one CSV file (csv:FILE); a test set is not used",
               a->data);
    return -EINVAL;
  }
  int rc = st_dataset_load_csv_features(ds, path, err, err_len);
  if (rc == 0 && a->shard_n > 1 &&
      (rc = keep_shard(ds, a->shard_k, a->shard_n)) != 0)
    st_set_err(err, err_len, "out of memory keeping shard %u/%u of %s",
               a->shard_k, a->shard_n, path);
  return rc;
}

int st__algo_load(const st__algo_args_t* a, st_dataset_t* ds, char* err,
                  size_t err_len) {
  memset(ds, 0, sizeof(*ds));
  if (strncmp(a->data, "csv:", 4) == 0 && a->label_col == ST__ALGO_NO_LABEL)
    return load_csv_features(a, ds, err, err_len);
  st_data_options_t opt;
  memset(&opt, 0, sizeof(opt));
  opt.csv.label_col = a->label_col < 0 ? -1 : a->label_col;
  opt.csv.regression = 1; /* any real target; kmeans drops it */
  opt.shard_k = a->shard_k;
  opt.shard_n = a->shard_n;
  st_data_t d;
  int rc = st_data_open(&d, a->data, &opt, err, err_len);
  if (rc != 0)
    return rc;
  if (st_dataset_is_sparse(&d.train)) {
    st_set_err(err, err_len,
               "%s is sparse (libsvm): k-means and least squares read dense "
               "data (csv:, idx:, fashion-mnist)",
               d.train.source);
    st_data_close(&d);
    return -EINVAL;
  }
  *ds = d.train; /* taken over */
  memset(&d.train, 0, sizeof(d.train));
  st_data_close(&d);
  return 0;
}

void st__algo_say_same_data(const char* cmd, int same_data, uint32_t size,
                            size_t rows) {
  if (same_data)
    fprintf(stderr,
            "%s: warning: every one of the %u members holds the same %zu "
            "rows, so each row counts %u times: give each member its own "
            "--shard K/%u or its own file\n",
            cmd, size, rows, size, size);
}

/* ==== Output ===============================================================
 */

void st__algo_json_doubles(FILE* f, const double* v, size_t n) {
  fputc('[', f);
  for (size_t i = 0; i < n; i++)
    fprintf(f, "%s%.17g", i > 0 ? ", " : "", v[i]);
  fputc(']', f);
}

float* st__algo_to_floats(const double* v, size_t n) {
  float* out = malloc((n > 0 ? n : 1) * sizeof(float));
  for (size_t i = 0; out != NULL && i < n; i++)
    out[i] = (float) v[i];
  return out;
}
