/* bench_train.c: `starling-bench train`, training throughput in samples/s
 * of full training steps as `starling train` runs them (node/train/trainer.c):
 * batch gather from the real Fashion-MNIST training set in a shuffled order,
 * forward, backward, SGD with momentum 0.9 at lr 0.05. Each batch size is
 * trained from a fresh model: warm-up steps first (page faults, BLAS
 * buffers, CUDA kernels loaded), then R timed repeats of N steps; the figure
 * is the median of the R rates, so that one preempted repeat does not move
 * it.
 *
 * tests/bench/torch_mlp.py is the PyTorch eager twin of `train` (same model,
 * data, batches and optimizer) and tools/bench/bench_train_vs_torch.sh runs
 * both in one go; docs/benchmarks.md records the figures.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/train/train.h"
#include "tools/bench/bench.h"
#include "tools/cli/cli.h"

#define CMD "starling-bench train" /* prefix of st__parse_* messages */
#define MAX_BATCHES 16
#define MAX_DEVICES 2
#define MAX_REPEATS 101

/* ==== train ============================================================== */

static void train_usage(FILE* f) {
  fprintf(
      f,
      "usage: starling-bench train [options]\n"
      "\n"
      "Measures training throughput (samples/s) of full training steps:\n"
      "batch gather from the training set, forward, backward, SGD momentum\n"
      "0.9 update at lr 0.05. Reports the median of --repeats timed runs of\n"
      "--steps steps each, after --warmup-steps untimed steps.\n"
      "\n"
      "  --model SPEC         model (default mlp:784-256-128-10)\n"
      "  --batch LIST         comma-separated batch sizes (default 64,256)\n"
      "  --steps N            steps per timed repeat (default 500)\n"
      "  --warmup-steps N     untimed steps first (default 50)\n"
      "  --repeats R          timed repeats; the median is reported (default "
      "5)\n"
      "  --device D           auto | cpu | cuda | cuda:N (default auto: the "
      "CPU,\n"
      "                       and also the first GPU when there is one)\n"
      "  --threads N          CPU BLAS threads (default: OpenBLAS's choice)\n"
      "  --data SPEC          training data, as for `starling train` "
      "(default\n"
      "                       fashion-mnist)\n"
      "  --json               print one JSON object on stdout instead of a "
      "table\n"
      "  -h, --help           this help\n"
      "\n"
      "Example (the figures of docs/benchmarks.md):\n"
      "  starling-bench train --batch 64,256 --threads 1\n");
}

typedef struct {
  /* --model, --data, --device and --threads, parsed as `starling train`
   * parses them (cli_train_flags.c); the model spec goes to f.cfg.model.
   * The other training flags are not taken: the optimizer is fixed. */
  st__train_flags_t f;
  size_t batches[MAX_BATCHES];
  size_t n_batches;
  uint64_t steps, warmup, repeats;
  int json;
} train_args_t;

/* Parses "64,256" into a->batches. */
static int parse_batches(const char* text, train_args_t* a) {
  char buf[256];
  if (strlen(text) >= sizeof(buf)) {
    fprintf(stderr, "starling-bench train: --batch: list too long\n");
    return -EINVAL;
  }
  strcpy(buf, text);
  a->n_batches = 0;
  char* save = NULL;
  for (char* tok = buf;; tok = NULL) {
    char* item = strtok_r(tok, ",", &save);
    if (item == NULL)
      break;
    if (a->n_batches == MAX_BATCHES) {
      fprintf(stderr, "starling-bench train: --batch: at most %d sizes\n",
              MAX_BATCHES);
      return -EINVAL;
    }
    uint64_t u;
    if (st__parse_u64(CMD, "--batch", item, 1, 1u << 20, &u) != 0)
      return -EINVAL;
    a->batches[a->n_batches++] = (size_t) u;
  }
  /* strtok_r skips empty items: refuse "64,,256", ",64" and "64,". */
  if (a->n_batches == 0 || text[0] == ',' || text[strlen(text) - 1] == ',' ||
      strstr(text, ",,") != NULL) {
    fprintf(stderr,
            "starling-bench train: --batch: '%s' is not a comma-separated "
            "list of batch sizes (e.g. 64,256)\n",
            text);
    return -EINVAL;
  }
  return 0;
}

/* --batch is a list here, so it is the bench's own option rather than the
 * training flag of the same name. */
enum {
  OPT_BATCH = ST__TRAIN_OPT_END,
  OPT_STEPS,
  OPT_WARMUP,
  OPT_REPEATS,
  OPT_JSON
};

static const struct option train_opts[] = {
    {"model", required_argument, NULL, ST__TRAIN_OPT_MODEL},
    {"batch", required_argument, NULL, OPT_BATCH},
    {"steps", required_argument, NULL, OPT_STEPS},
    {"warmup-steps", required_argument, NULL, OPT_WARMUP},
    {"repeats", required_argument, NULL, OPT_REPEATS},
    {"device", required_argument, NULL, ST__TRAIN_OPT_DEVICE},
    {"threads", required_argument, NULL, ST__TRAIN_OPT_THREADS},
    {"data", required_argument, NULL, ST__TRAIN_OPT_DATA},
    {"json", no_argument, NULL, OPT_JSON},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0}};

/* Returns 0 to run, -1 after --help, 2 on bad usage. */
static int parse_train_args(int argc, char** argv, train_args_t* a) {
  memset(a, 0, sizeof(*a));
  st__train_flags_init(&a->f);
  a->f.model = "mlp:784-256-128-10";
  a->f.data = "fashion-mnist";
  a->batches[0] = 64;
  a->batches[1] = 256;
  a->n_batches = 2;
  a->steps = 500;
  a->warmup = 50;
  a->repeats = 5;
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", train_opts, NULL)) != -1) {
    const char* v = optarg;
    int rc = 0;
    switch (c) {
      case 'h':
        train_usage(stdout);
        return -1;
      case OPT_BATCH:
        rc = parse_batches(v, a);
        break;
      case OPT_STEPS:
        rc = st__parse_u64(CMD, "--steps", v, 1, 100000000, &a->steps);
        break;
      case OPT_WARMUP:
        rc = st__parse_u64(CMD, "--warmup-steps", v, 0, 100000000, &a->warmup);
        break;
      case OPT_REPEATS:
        rc = st__parse_u64(CMD, "--repeats", v, 1, MAX_REPEATS, &a->repeats);
        break;
      case OPT_JSON:
        a->json = 1;
        break;
      case ':':
        fprintf(stderr, "starling-bench train: %s needs a value\n",
                argv[optind - 1]);
        return 2;
      default:
        /* Only the training flags named in train_opts can reach here. */
        rc = st__train_flag(CMD, c, v, &a->f);
        if (rc == 1) {
          fprintf(stderr,
                  "starling-bench train: unknown option '%s'; see "
                  "'starling-bench train --help'\n",
                  argv[optind - 1]);
          return 2;
        }
        break;
    }
    if (rc != 0)
      return 2;
  }
  if (optind < argc) {
    fprintf(stderr,
            "starling-bench train: unexpected argument '%s'; see "
            "'starling-bench train --help'\n",
            argv[optind]);
    return 2;
  }
  char err[512];
  if (st_model_spec_parse(a->f.model, &a->f.cfg.model, err, sizeof(err)) != 0) {
    fprintf(stderr, "starling-bench train: --model: %s\n", err);
    return 2;
  }
  return 0;
}

/* ---- Measuring ------------------------------------------------------------
 */

typedef struct {
  char device[128]; /* st_backend_describe() */
  size_t batch;
  double rate[MAX_REPEATS]; /* samples/s of each repeat */
  double median, min, max;
  double final_loss; /* loss of the last step: both twins should agree */
} train_result_t;

static int cmp_double(const void* x, const void* y) {
  double a = *(const double*) x, b = *(const double*) y;
  return (a > b) - (a < b);
}

/* Rows the trainer's next step will take: `batch`, or fewer for the last
 * batch of an epoch. */
static size_t next_rows(const st_trainer_t* t) {
  size_t left = t->shard_count - t->pos * t->cfg.batch;
  return left < t->cfg.batch ? left : t->cfg.batch;
}

/* Runs `steps` steps; the last one reads the loss back, which also waits
 * for a GPU to finish, so that the clock stops after the work did. */
static int run_steps(st_trainer_t* t, uint64_t steps, uint64_t* samples,
                     double* loss) {
  for (uint64_t i = 0; i < steps; i++) {
    *samples += next_rows(t);
    int rc = st_trainer_step(t, i + 1 == steps ? loss : NULL);
    if (rc != 0)
      return rc;
  }
  return 0;
}

static int bench_one(const train_args_t* a, st_backend_t* be,
                     const st_dataset_t* train, size_t batch,
                     train_result_t* r) {
  char err[512];
  st_train_config_t cfg;
  st_train_config_default(&cfg);
  cfg.model = a->f.cfg.model;
  cfg.batch = batch;
  cfg.opt.kind = ST_OPT_MOMENTUM;
  cfg.opt.momentum = 0.9f;
  cfg.sched.kind = ST_SCHED_CONSTANT;
  cfg.sched.base_lr = 0.05;
  /* Enough epochs that the trainer never reports done mid-measurement. */
  size_t per_epoch = (train->n + batch - 1) / batch;
  uint64_t total = a->warmup + a->steps * a->repeats;
  cfg.epochs = (uint32_t) (total / per_epoch + 2);

  st_trainer_t t;
  if (st_trainer_init(&t, be, train, &cfg, err, sizeof(err)) != 0) {
    fprintf(stderr, "starling-bench train: %s\n", err);
    return -EINVAL;
  }
  snprintf(r->device, sizeof(r->device), "%s", st_backend_describe(be));
  r->batch = batch;
  uint64_t samples = 0;
  double loss = 0;
  int rc = a->warmup ? run_steps(&t, a->warmup, &samples, &loss) : 0;
  for (uint64_t k = 0; rc == 0 && k < a->repeats; k++) {
    samples = 0;
    double t0 = st_now_s();
    rc = run_steps(&t, a->steps, &samples, &loss);
    double dt = st_now_s() - t0;
    r->rate[k] = (double) samples / dt;
    if (rc == 0 && !isfinite(loss))
      rc = -EDOM;
  }
  if (rc != 0) {
    fprintf(stderr, "starling-bench train: batch %zu on %s: step failed: %s\n",
            batch, r->device,
            *st_backend_last_error(be) ? st_backend_last_error(be)
            : rc == -EDOM              ? "the loss is not finite"
                                       : strerror(-rc));
    st_trainer_close(&t);
    return rc;
  }
  r->final_loss = loss;
  double sorted[MAX_REPEATS];
  memcpy(sorted, r->rate, a->repeats * sizeof(double));
  qsort(sorted, a->repeats, sizeof(double), cmp_double);
  size_t n = a->repeats;
  r->median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  r->min = sorted[0];
  r->max = sorted[n - 1];
  st_trainer_close(&t);
  return 0;
}

/* ---- Output -----------------------------------------------------------------
 */

static void print_table(const train_args_t* a, const train_result_t* res,
                        size_t n) {
  printf("%-30s %-20s %6s %12s %21s %9s %8s\n", "device", "model", "batch",
         "samples/s", "(min .. max)", "ms/step", "loss");
  for (size_t i = 0; i < n; i++) {
    const train_result_t* r = &res[i];
    char range[64];
    snprintf(range, sizeof(range), "(%.0f .. %.0f)", r->min, r->max);
    printf("%-30s %-20s %6zu %12.0f %21s %9.3f %8.4f\n", r->device, a->f.model,
           r->batch, r->median, range, 1e3 * (double) r->batch / r->median,
           r->final_loss);
  }
}

static void print_json(const train_args_t* a, const train_result_t* res,
                       size_t n) {
  char model[256];
  st_model_spec_format(&a->f.cfg.model, model, sizeof(model));
  printf("{\"benchmark\": \"train\", \"device\": ");
  st_json_write_string(stdout, a->f.device);
  printf(", \"data\": ");
  st_json_write_string(stdout, a->f.data);
  if (a->f.threads)
    printf(", \"threads\": %llu", (unsigned long long) a->f.threads);
  else
    printf(", \"threads\": null");
  printf(", \"optimizer\": \"momentum\", \"momentum\": 0.9, \"lr\": 0.05");
  printf(", \"steps\": %llu, \"warmup_steps\": %llu, \"repeats\": %llu",
         (unsigned long long) a->steps, (unsigned long long) a->warmup,
         (unsigned long long) a->repeats);
  printf(", \"results\": [");
  for (size_t i = 0; i < n; i++) {
    const train_result_t* r = &res[i];
    printf("%s{\"device\": ", i ? ", " : "");
    st_json_write_string(stdout, r->device);
    printf(", \"model\": ");
    st_json_write_string(stdout, model);
    printf(", \"batch\": %zu, \"samples_per_sec\": %.1f", r->batch, r->median);
    printf(", \"samples_per_sec_min\": %.1f, \"samples_per_sec_max\": %.1f",
           r->min, r->max);
    printf(", \"final_loss\": %.6f, \"repeats\": [", r->final_loss);
    for (uint64_t k = 0; k < a->repeats; k++)
      printf("%s%.1f", k ? ", " : "", r->rate[k]);
    printf("]}");
  }
  printf("]}\n");
}

/* ---- Entry ------------------------------------------------------------------
 */

int st__bench_train(int argc, char** argv) {
  train_args_t a;
  int rc = parse_train_args(argc, argv, &a);
  if (rc != 0)
    return rc < 0 ? 0 : rc;
  FILE* log = a.json ? stderr : stdout;

  /* "auto" measures every kind of device this machine has: the CPU, and the
   * first GPU when there is one. */
  const char* devices[MAX_DEVICES];
  size_t n_devices = 0;
  if (strcmp(a.f.device, "auto") == 0) {
    devices[n_devices++] = "cpu";
    if (st_cuda_device_count() > 0)
      devices[n_devices++] = "cuda:0";
  } else {
    devices[n_devices++] = a.f.device;
  }

  char err[1024];
  st_data_t data;
  if (st_data_open(&data, a.f.data, &a.f.data_opt, err, sizeof(err)) != 0) {
    fprintf(stderr, "starling-bench train: --data: %s\n", err);
    return 1;
  }
  fprintf(log,
          "starling-bench train: %s on %s (%zu examples), momentum 0.9, "
          "lr 0.05, %llu warm-up steps, median of %llu x %llu steps\n",
          a.f.model, a.f.data, data.train.n, (unsigned long long) a.warmup,
          (unsigned long long) a.repeats, (unsigned long long) a.steps);
  fflush(log);

  train_result_t results[MAX_DEVICES * MAX_BATCHES];
  size_t n_results = 0;
  int status = 0;
  for (size_t d = 0; d < n_devices && status == 0; d++) {
    st_backend_t* be = NULL;
    if (st_backend_open(&be, devices[d], (int) a.f.threads, err, sizeof(err)) !=
        0) {
      fprintf(stderr, "starling-bench train: --device: %s\n", err);
      status = 1;
      break;
    }
    for (size_t b = 0; b < a.n_batches; b++) {
      train_result_t* r = &results[n_results];
      if (bench_one(&a, be, &data.train, a.batches[b], r) != 0) {
        status = 1;
        break;
      }
      n_results++;
      if (!a.json) {
        fprintf(log, "  %s, batch %zu: %.0f samples/s\n", r->device, r->batch,
                r->median);
        fflush(log);
      }
    }
    st_backend_close(be);
  }
  if (status == 0) {
    if (a.json)
      print_json(&a, results, n_results);
    else
      print_table(&a, results, n_results);
  }
  st_data_close(&data);
  return status;
}
