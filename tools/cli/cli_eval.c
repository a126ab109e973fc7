/* cli_eval.c: `starling eval` and `starling predict`, using a checkpoint's
 * model on its own (node/train/saved_model.c).
 *
 * A checkpoint written by `starling train` or `starling node` holds the
 * layers, the input transform of the training data and what the model
 * expects, so these commands need nothing but the file and the data:
 *
 *   eval     scores the model on the test set of a data spec (the same
 *            specs as `starling train`; the training set when the spec has
 *            no test set) and prints the accuracy and the mean loss, as
 *            `starling train` reports them for the same parameters;
 *   predict  writes one prediction a row of an input file (CSV of features
 *            or IDX images): the class and its probabilities, as CSV or
 *            JSON.
 *
 * Exit status: 0 done, 1 a run-time failure (a missing or unusable file, a
 * model that does not fit the data), 2 bad usage.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/train/train.h"
#include "tools/cli/cli.h"

/* The options of both commands; each takes the ones its usage lists. */
enum {
  OPT_CHECKPOINT = 256,
  OPT_DATA,
  OPT_LABEL_COL,
  OPT_INPUT,
  OPT_OUT,
  OPT_FORMAT,
  OPT_DEVICE,
  OPT_THREADS,
  OPT_JSON
};

typedef struct {
  const char* cmd; /* "starling eval" or "starling predict" */
  const char* checkpoint;
  const char* data;  /* eval */
  int label_col;     /* eval: -1, the last column */
  const char* input; /* predict */
  const char* out;   /* predict: NULL for stdout */
  const char* format;
  const char* device;
  uint64_t threads;
  int json;
} eval_args_t;

static void eval_usage(FILE* f) {
  fprintf(
      f,
      "usage: starling eval --checkpoint FILE --data SPEC [options]\n"
      "\n"
      "Scores the model of a checkpoint (written by starling train or "
      "starling\n"
      "node) on the test set of SPEC, or on its training set when it has "
      "none,\n"
      "with the checkpoint's own input normalization, and prints the "
      "accuracy\n"
      "and the mean loss.\n"
      "\n"
      "  --checkpoint FILE    the model (a .safetensors checkpoint)\n"
      "  --data SPEC          fashion-mnist | "
      "idx:IMAGES,LABELS[,TEST_IMAGES,TEST_LABELS]\n"
      "                       | csv:TRAIN[,TEST] (as for starling train)\n"
      "  --label-col K        CSV column holding the label (default: the "
      "last)\n"
      "  --device D           auto | cpu | cuda | cuda:N (default auto)\n"
      "  --threads N          CPU BLAS threads (default: OpenBLAS's choice)\n"
      "  --json               print the result as one JSON object\n"
      "  -h, --help           this help\n"
      "\n"
      "Example:\n"
      "  starling eval --checkpoint out/train/model.safetensors --data "
      "fashion-mnist\n");
}

static void predict_usage(FILE* f) {
  fprintf(
      f,
      "usage: starling predict --checkpoint FILE --input FILE [options]\n"
      "\n"
      "Runs the model of a checkpoint on every row of an input file and "
      "writes\n"
      "one prediction a row: the class and the probability of each class "
      "(the\n"
      "predicted value for a regression model). The input is normalized as "
      "the\n"
      "training data was.\n"
      "\n"
      "  --checkpoint FILE    the model (a .safetensors checkpoint)\n"
      "  --input FILE         an IDX image file (gzip or raw; the images "
      "alone,\n"
      "                       no labels) or a CSV file of features only (raw\n"
      "                       values: pixels 0..255 for an image model), one\n"
      "                       example a row, an optional header line; "
      "idx:FILE\n"
      "                       or csv:FILE says which when the content does "
      "not\n"
      "  --out FILE           write there (default: standard output)\n"
      "  --format csv|json    csv: a header, then class,p0,p1,... a row; "
      "json:\n"
      "                       one object (default: json for an --out ending "
      "in\n"
      "                       .json, else csv)\n"
      "  --device D           auto | cpu | cuda | cuda:N (default auto)\n"
      "  --threads N          CPU BLAS threads (default: OpenBLAS's choice)\n"
      "  -h, --help           this help\n"
      "\n"
      "Example:\n"
      "  starling predict --checkpoint out/train/model.safetensors \\\n"
      "      --input /usr/share/datasets/fashion-mnist/"
      "t10k-images-idx3-ubyte.gz --out predictions.csv\n");
}

static const struct option eval_opts[] = {
    {"checkpoint", required_argument, NULL, OPT_CHECKPOINT},
    {"data", required_argument, NULL, OPT_DATA},
    {"label-col", required_argument, NULL, OPT_LABEL_COL},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"json", no_argument, NULL, OPT_JSON},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static const struct option predict_opts[] = {
    {"checkpoint", required_argument, NULL, OPT_CHECKPOINT},
    {"input", required_argument, NULL, OPT_INPUT},
    {"out", required_argument, NULL, OPT_OUT},
    {"format", required_argument, NULL, OPT_FORMAT},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* Handles one parsed option: 0, or 2 on a bad value (reported). */
static int take_option(eval_args_t* a, int c, const char* v) {
  uint64_t u = 0;
  switch (c) {
    case OPT_CHECKPOINT:
      a->checkpoint = v;
      return 0;
    case OPT_DATA:
      a->data = v;
      return 0;
    case OPT_LABEL_COL:
      if (st__parse_u64(a->cmd, "--label-col", v, 0, 1u << 20, &u) != 0)
        return 2;
      a->label_col = (int) u;
      return 0;
    case OPT_INPUT:
      a->input = v;
      return 0;
    case OPT_OUT:
      a->out = v;
      return 0;
    case OPT_FORMAT:
      if (strcmp(v, "csv") != 0 && strcmp(v, "json") != 0) {
        fprintf(stderr, "%s: --format: '%s' is not csv or json\n", a->cmd, v);
        return 2;
      }
      a->format = v;
      return 0;
    case OPT_DEVICE:
      a->device = v;
      return 0;
    case OPT_THREADS:
      return st__parse_u64(a->cmd, "--threads", v, 1, 1024, &a->threads) ? 2
                                                                         : 0;
    case OPT_JSON:
      a->json = 1;
      return 0;
  }
  return 2;
}

/* Parses argv into *a. Returns 0, 2 (usage error, reported) or -1 when
 * --help was printed. */
static int parse_args(int argc, char** argv, eval_args_t* a, int predict) {
  const struct option* opts = predict ? predict_opts : eval_opts;
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    if (c == 'h') {
      (predict ? predict_usage : eval_usage)(stdout);
      return -1;
    }
    if (c == ':' || c == '?') {
      const char* what = c == ':' ? "needs a value" : "is an unknown option";
      fprintf(stderr, "%s: '%s' %s; see '%s --help'\n", a->cmd,
              argv[optind - 1], what, a->cmd);
      return 2;
    }
    if (take_option(a, c, optarg) != 0)
      return 2;
  }
  if (optind < argc) {
    fprintf(stderr, "%s: unexpected argument '%s'; see '%s --help'\n", a->cmd,
            argv[optind], a->cmd);
    return 2;
  }
  const char* need = predict ? "--checkpoint and --input are required"
                             : "--checkpoint and --data are required";
  if (a->checkpoint == NULL || (predict ? a->input : a->data) == NULL) {
    fprintf(stderr, "%s: %s; see '%s --help'\n", a->cmd, need, a->cmd);
    return 2;
  }
  return 0;
}

/* Opens the device and the checkpoint's model on it. 0, or 1 reported. */
static int open_model(const eval_args_t* a, st_backend_t** be,
                      st_saved_model_t* sm) {
  char err[1024];
  if (st_backend_open(be, a->device, (int) a->threads, err, sizeof(err)) != 0) {
    fprintf(stderr, "%s: --device: %s\n", a->cmd, err);
    return 1;
  }
  if (st_saved_model_open(sm, *be, a->checkpoint, err, sizeof(err)) != 0) {
    fprintf(stderr, "%s: --checkpoint: %s\n", a->cmd, err);
    st_backend_close(*be);
    return 1;
  }
  return 0;
}

/* ---- eval
 * ---------------------------------------------------------------------- */

static void print_eval(const eval_args_t* a, const st_saved_model_t* sm,
                       const st_dataset_t* ds, const char* set, double loss,
                       double acc, const st_backend_t* be) {
  if (!a->json) {
    if (isfinite(acc))
      printf("accuracy %.4f  ", acc);
    printf(
        "loss %.6g  (%zu examples: the %s set of %s; model %s at step "
        "%llu)\n",
        loss, ds->n, set, a->data, sm->model_text,
        (unsigned long long) sm->step);
    return;
  }
  printf("{\"checkpoint\": ");
  st_json_write_string(stdout, a->checkpoint);
  printf(", \"model\": ");
  st_json_write_string(stdout, sm->model_text);
  printf(", \"step\": %llu, \"data\": ", (unsigned long long) sm->step);
  st_json_write_string(stdout, a->data);
  printf(", \"set\": \"%s\", \"examples\": %zu, \"device\": ", set, ds->n);
  st_json_write_string(stdout, st_backend_describe(be));
  if (isfinite(acc))
    printf(", \"accuracy\": %.6f", acc);
  else
    printf(", \"accuracy\": null");
  printf(", \"loss\": %.6f}\n", loss);
}

int st__cmd_eval(int argc, char** argv) {
  eval_args_t a = {.cmd = "starling eval", .label_col = -1, .device = "auto"};
  int rc = parse_args(argc, argv, &a, 0);
  if (rc != 0)
    return rc < 0 ? 0 : rc;
  st_backend_t* be = NULL;
  st_saved_model_t sm;
  if (open_model(&a, &be, &sm) != 0)
    return 1;
  char err[1024];
  st_data_t data;
  st_data_options_t dopt = {{a.label_col, sm.classes == 0}, 0, 0, 1};
  int status = 1;
  if (st_data_open(&data, a.data, &dopt, err, sizeof(err)) != 0) {
    fprintf(stderr, "%s: --data: %s\n", a.cmd, err);
    goto out_model;
  }
  st_dataset_t* ds = data.test.n ? &data.test : &data.train;
  const char* set = data.test.n ? "test" : "train";
  double loss = 0, acc = NAN;
  if (st_saved_model_prepare(&sm, ds, err, sizeof(err)) != 0 ||
      st_saved_model_evaluate(&sm, ds, &loss, &acc, err, sizeof(err)) != 0) {
    fprintf(stderr, "%s: %s\n", a.cmd, err);
    goto out;
  }
  print_eval(&a, &sm, ds, set, loss, acc, be);
  status = 0;
out:
  st_data_close(&data);
out_model:
  st_saved_model_close(&sm);
  st_backend_close(be);
  return status;
}

/* ---- predict
 * ------------------------------------------------------------------- */

/* Whether the input is IDX: an idx: or csv: prefix says so; else gzip or
 * an IDX magic (00 00 08 xx) at the start of the file is IDX, anything
 * else CSV. *path: the file name without its prefix. */
static int input_is_idx(const char* input, const char** path) {
  *path = input;
  if (strncmp(input, "idx:", 4) == 0 || strncmp(input, "csv:", 4) == 0) {
    *path = input + 4;
    return input[0] == 'i';
  }
  unsigned char head[4] = {0};
  FILE* f = fopen(input, "rb");
  size_t got = f ? fread(head, 1, sizeof(head), f) : 0;
  if (f != NULL)
    fclose(f);
  return got >= 2 &&
         ((head[0] == 0x1f && head[1] == 0x8b) ||
          (got == 4 && head[0] == 0 && head[1] == 0 && head[2] == 0x08));
}

/* Loads the input (features only) and prepares it for the model. 0, or 1
 * reported. */
static int load_input(const eval_args_t* a, const st_saved_model_t* sm,
                      st_dataset_t* ds) {
  char err[1024];
  const char* path;
  int rc;
  if (input_is_idx(a->input, &path)) {
    rc = st_dataset_load_idx(ds, path, NULL, err, sizeof(err));
  } else {
    rc = st_dataset_load_csv_features(ds, path, err, sizeof(err));
  }
  if (rc != 0) {
    fprintf(stderr, "%s: --input: %s\n", a->cmd, err);
    return 1;
  }
  if (st_saved_model_prepare(sm, ds, err, sizeof(err)) != 0) {
    fprintf(stderr, "%s: --input: %s%s\n", a->cmd, err,
            ds->dim == sm->inputs + 1
                ? "; predict reads features only: drop the label column"
                : "");
    st_dataset_free(ds);
    return 1;
  }
  return 0;
}

/* Writes the predictions of rows [start, start + rows) from probs (rows x
 * outputs). *first: no JSON row written yet. */
static void write_rows(FILE* f, const st_saved_model_t* sm, const float* probs,
                       size_t rows, int json, int* first) {
  for (size_t r = 0; r < rows; r++) {
    const float* p = probs + r * sm->outputs;
    size_t best = 0;
    for (size_t k = 1; k < sm->outputs; k++)
      if (p[k] > p[best])
        best = k;
    if (sm->classes == 0 && json) {
      fprintf(f, "%s\n  {\"value\": %.9g}", *first ? "" : ",", (double) p[0]);
    } else if (sm->classes == 0) {
      fprintf(f, "%.9g\n", (double) p[0]);
    } else if (json) {
      fprintf(f, "%s\n  {\"class\": %zu, \"probabilities\": [",
              *first ? "" : ",", best);
      for (size_t k = 0; k < sm->outputs; k++)
        fprintf(f, "%s%.6g", k ? ", " : "", (double) p[k]);
      fprintf(f, "]}");
    } else {
      fprintf(f, "%zu", best);
      for (size_t k = 0; k < sm->outputs; k++)
        fprintf(f, ",%.6g", (double) p[k]);
      fprintf(f, "\n");
    }
    *first = 0;
  }
}

/* The header (CSV) or the opening of the object (JSON). */
static void write_head(FILE* f, const eval_args_t* a,
                       const st_saved_model_t* sm, int json) {
  if (!json) {
    if (sm->classes == 0) {
      fprintf(f, "value\n");
      return;
    }
    fprintf(f, "class");
    for (size_t k = 0; k < sm->outputs; k++)
      fprintf(f, ",p%zu", k);
    fprintf(f, "\n");
    return;
  }
  fprintf(f, "{\"checkpoint\": ");
  st_json_write_string(f, a->checkpoint);
  fprintf(f, ", \"model\": ");
  st_json_write_string(f, sm->model_text);
  fprintf(f, ", \"input\": ");
  st_json_write_string(f, a->input);
  fprintf(f, ", \"classes\": %zu, \"predictions\": [", sm->classes);
}

/* Runs the model over ds in chunks and writes every prediction to f. */
static int predict_all(const eval_args_t* a, st_saved_model_t* sm,
                       const st_dataset_t* ds, FILE* f, int json) {
  float* probs = malloc(ST_SAVED_MODEL_MAX_ROWS * sm->outputs * sizeof(float));
  if (probs == NULL) {
    fprintf(stderr, "%s: out of memory\n", a->cmd);
    return 1;
  }
  int first = 1;
  write_head(f, a, sm, json);
  for (size_t start = 0; start < ds->n; start += ST_SAVED_MODEL_MAX_ROWS) {
    size_t rows = ds->n - start;
    if (rows > ST_SAVED_MODEL_MAX_ROWS)
      rows = ST_SAVED_MODEL_MAX_ROWS;
    if (st_saved_model_predict(sm, ds, start, rows, probs) != 0) {
      fprintf(stderr, "%s: the model failed on rows %zu to %zu: %s\n", a->cmd,
              start + 1, start + rows, st_backend_last_error(sm->model.be));
      free(probs);
      return 1;
    }
    write_rows(f, sm, probs, rows, json, &first);
  }
  if (json)
    fprintf(f, "\n]}\n");
  free(probs);
  return 0;
}

/* json for --format json, or for an --out ending in .json without one. */
static int wants_json(const eval_args_t* a) {
  if (a->format != NULL)
    return strcmp(a->format, "json") == 0;
  size_t n = a->out ? strlen(a->out) : 0;
  return n >= 5 && strcmp(a->out + n - 5, ".json") == 0;
}

int st__cmd_predict(int argc, char** argv) {
  eval_args_t a = {.cmd = "starling predict", .device = "auto"};
  int rc = parse_args(argc, argv, &a, 1);
  if (rc != 0)
    return rc < 0 ? 0 : rc;
  st_backend_t* be = NULL;
  st_saved_model_t sm;
  if (open_model(&a, &be, &sm) != 0)
    return 1;
  st_dataset_t ds;
  int status = load_input(&a, &sm, &ds);
  if (status != 0)
    goto out_model;
  FILE* f = a.out ? fopen(a.out, "w") : stdout;
  if (f == NULL) {
    fprintf(stderr, "%s: --out: cannot create %s: %s\n", a.cmd, a.out,
            strerror(errno));
    status = 1;
    goto out;
  }
  status = predict_all(&a, &sm, &ds, f, wants_json(&a));
  if ((a.out ? fclose(f) : fflush(f)) != 0 && status == 0) {
    fprintf(stderr, "%s: writing %s: %s\n", a.cmd, a.out ? a.out : "stdout",
            strerror(errno));
    status = 1;
  }
  if (status == 0 && a.out != NULL)
    fprintf(stderr, "%s: wrote %zu predictions to %s\n", a.cmd, ds.n, a.out);
out:
  st_dataset_free(&ds);
out_model:
  st_saved_model_close(&sm);
  st_backend_close(be);
  return status;
}
