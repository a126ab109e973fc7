/* cli_algos.c: what `starling kmeans` and `starling lstsq` share (cli.h,
 * "Algorithms"): their common flags (the node's socket, the data and its
 * shard, the group, the timeout, the output), loading the shard, and the
 * session with the local node through the client library's collectives
 * (client/starling/client.h): the float64 sum the algorithms of
 * node/train/ run on, and a first check that every member runs the same
 * command on the same kind of data.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/starling/client.h"
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

/* A fingerprint of a member's rows (FNV-1a over their bits, 52 bits so that
 * a double holds it exactly): equal on every member when each holds the
 * same data. */
/* FNV-1a over len bytes, continuing from h (start: FNV_START). */
#define FNV_START 0xcbf29ce484222325ull
static uint64_t fnv1a(uint64_t h, const void* bytes, size_t len) {
  const unsigned char* p = bytes;
  for (size_t i = 0; i < len; i++)
    h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

static double data_fingerprint(const st_dataset_t* ds) {
  uint64_t h = fnv1a(FNV_START, ds->x, ds->n * ds->dim * sizeof(float));
  h = fnv1a(h, ds->y, ds->n * sizeof(float));
  return (double) (h >> 12); /* 52 bits: exact in a double */
}

/* ==== The session ==========================================================
 */

static int comm_sum(void* arg, double* data, size_t count) {
  st__algo_session_t* s = arg;
  int rc = st_comm_all_reduce(s->comm, s->group, data, count, ST_COMM_F64,
                              ST_COMM_SUM, s->timeout_s);
  if (rc != 0)
    snprintf(s->comm_err, sizeof(s->comm_err), "%s", st_comm_error(s->comm));
  return rc;
}

/* The values every member must share, checked as min == max over the
 * group (into lo and hi, n each); the names say which one differs (a NULL
 * name: not required to agree). */
static int agree(st__algo_session_t* s, const double* v,
                 const char* const* names, size_t n, double* lo, double* hi,
                 char* err, size_t err_len) {
  memcpy(lo, v, n * sizeof(double));
  memcpy(hi, v, n * sizeof(double));
  int rc = st_comm_all_reduce(s->comm, s->group, lo, n, ST_COMM_F64,
                              ST_COMM_MIN, s->timeout_s);
  if (rc == 0)
    rc = st_comm_all_reduce(s->comm, s->group, hi, n, ST_COMM_F64, ST_COMM_MAX,
                            s->timeout_s);
  if (rc != 0)
    st_set_err(err, err_len,
               "the first step with the other members failed (every member "
               "of the group must run this command: --group, default every "
               "member alive): %s",
               st_comm_error(s->comm));
  for (size_t i = 0; rc == 0 && i < n; i++)
    if (lo[i] != hi[i] && names[i] != NULL) {
      st_set_err(err, err_len,
                 "the members disagree on %s (from %.17g to %.17g): run the "
                 "same command with the same kind of data on every member",
                 names[i], lo[i], hi[i]);
      rc = -EINVAL;
    }
  return rc;
}

/* "all" as the list of members the node sees now (sorted, as ranks are)
 * into s->group_list, and a hash of it into *hash (52 bits, exact in a
 * double): the members agree on it with their other values, so that a
 * join or a leave as they start fails every one of them alike instead of
 * leaving them on different lists. */
static int list_all(st__algo_session_t* s, double* hash, char* err,
                    size_t err_len) {
  size_t n = 0, rank = 0;
  int rc = st_comm_members(s->comm, NULL, 0, &n, &rank);
  char(*ids)[33] = rc == 0 ? calloc(n > 0 ? n : 1, sizeof(*ids)) : NULL;
  char* list = ids != NULL ? malloc(n * 33 + 1) : NULL;
  if (rc == 0 && list == NULL)
    rc = -ENOMEM;
  size_t again = n;
  if (rc == 0)
    rc = st_comm_members(s->comm, ids, n, &again, &rank);
  if (rc == 0 && again != n)
    rc = -EAGAIN;
  if (rc == 0) {
    char* p = list;
    *p = '\0';
    for (size_t i = 0; i < n; i++)
      p += sprintf(p, "%s%s", i ? "," : "", ids[i]);
    *hash = (double) (fnv1a(FNV_START, list, strlen(list)) >> 12);
    s->group_list = list;
    list = NULL;
  } else {
    st_set_err(err, err_len, "cannot list the members: %s",
               rc == -ENOMEM   ? "out of memory"
               : rc == -EAGAIN ? "they changed as they were listed"
                               : st_comm_error(s->comm));
  }
  free(ids);
  free(list);
  return rc;
}

int st__algo_open(st__algo_session_t* s, const st__algo_args_t* a,
                  const st_dataset_t* ds, const double* v,
                  const char* const* names, size_t n, char* err,
                  size_t err_len) {
  memset(s, 0, sizeof(*s));
  s->group = a->group;
  s->timeout_s = a->timeout_s;
  int rc = st_comm_open(a->socket, &s->comm, err, err_len);
  if (rc != 0)
    return rc;
  /* The caller's values, then the number of features, the data's
   * fingerprint and, for "all", the hash of the members' list. */
  double* all = malloc(3 * (n + 3) * sizeof(double));
  const char** all_names = malloc((n + 3) * sizeof(char*));
  if (all == NULL || all_names == NULL) {
    free(all);
    free(all_names);
    st_set_err(err, err_len, "out of memory");
    return -ENOMEM;
  }
  double *lo = all + n + 3, *hi = lo + n + 3;
  memcpy(all, v, n * sizeof(double));
  memcpy(all_names, names, n * sizeof(char*));
  all[n] = (double) ds->dim;
  all_names[n] = "the number of features (columns)";
  all[n + 1] = data_fingerprint(ds);
  all_names[n + 1] = NULL;
  size_t count = n + 2;
  if (s->group == NULL) {
    rc = list_all(s, &all[n + 2], err, err_len);
    all_names[n + 2] =
        "the members of the group (one joined or left as "
        "they started: start again)";
    count = n + 3;
  }
  if (rc == 0)
    rc = agree(s, all, all_names, count, lo, hi, err, err_len);
  if (rc == 0) {
    st_comm_last_group(s->comm, &s->rank, &s->size);
    s->algo = (st_algo_comm_t){comm_sum, s, s->rank, s->size};
    s->same_data = s->size > 1 && ds->n > 0 && lo[n + 1] == hi[n + 1];
    if (s->group == NULL)
      s->group = s->group_list; /* "all" as it was at the agreement */
  }
  free(all);
  free(all_names);
  if (rc == 0 && s->same_data)
    fprintf(stderr,
            "%s: warning: every one of the %u members holds the same %zu "
            "rows, so each row counts %u times: give each member its own "
            "--shard K/%u or its own file\n",
            a->cmd, s->size, ds->n, s->size, s->size);
  return rc;
}

void st__algo_close(st__algo_session_t* s) {
  st_comm_close(s->comm);
  s->comm = NULL;
  free(s->group_list);
  s->group_list = NULL;
  s->group = NULL;
}

void st__algo_print_error(const st__algo_session_t* s, const char* cmd,
                          const char* err) {
  if (s->comm_err[0] != '\0')
    fprintf(stderr, "%s: %s: %s\n", cmd, err, s->comm_err);
  else
    fprintf(stderr, "%s: %s\n", cmd, err);
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
