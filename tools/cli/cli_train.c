/* cli_train.c: `starling train`, local training on one machine.
 *
 * Loads the data, opens the device, builds the trainer (node/train/trainer.c)
 * and steps it for --epochs, printing progress (epoch, step, loss, samples/s)
 * about once a second and the test accuracy after every epoch. Checkpoints
 * go to --checkpoint (by default out/train/model.safetensors, its directory
 * created; --no-checkpoint for none) after every epoch (and every
 * --checkpoint-every steps or seconds) and on SIGINT/SIGTERM, atomically;
 * --resume
 * continues the same trajectory. With --json the progress goes to stderr and
 * one JSON object with the results goes to stdout at the end.
 *
 * The training flags (--model, --data, the optimizer and schedule, --device,
 * --threads) are parsed by cli_train_flags.c, which `starling node` shares;
 * this file parses only the options of a local run.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "node/train/train.h"
#include "tools/cli/cli.h"

#define CMD "starling train"

/* Where a run writes its checkpoint when --checkpoint is not given: a
 * trained model is kept unless asked otherwise (--no-checkpoint), in a
 * directory the repository ignores. */
#define DEFAULT_CHECKPOINT_DIR "out/train"
#define DEFAULT_CHECKPOINT DEFAULT_CHECKPOINT_DIR "/model.safetensors"
/* The default checkpoint is written at the end, when the run stops, and
 * after an epoch only when the last write is this old: a written, fsynced
 * file per epoch is what --checkpoint asks for, but unasked it would cost
 * a run of short epochs more than its training (40 epochs of 500 CSV rows:
 * 0.06 s of training, 0.5 s of fsyncs), while a long run still never loses
 * more than this much work. */
#define DEFAULT_CHECKPOINT_EVERY_S 60.0

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig) {
  stop_signal = sig;
}

static void usage(FILE* f) {
  fprintf(f,
          "usage: starling train --model SPEC --data SPEC [options]\n"
          "\n"
          "Trains a model on this machine and evaluates it after every "
          "epoch.\n"
          "\n");
  st__train_flags_usage(f);
  fprintf(
      f,
      "  --checkpoint PATH    write a safetensors checkpoint after every "
      "epoch, at\n"
      "                       the end and when interrupted; by default\n"
      "                       " DEFAULT_CHECKPOINT
      ", written at the end,\n"
      "                       when interrupted and at most once a minute\n"
      "                       (starling eval and predict use it)\n"
      "  --no-checkpoint      write no checkpoint\n"
      "  --checkpoint-every T also every T: N steps (500steps) or a "
      "duration\n"
      "                       (30s, 5m); a bare number needs its unit\n"
      "  --resume PATH        continue from a checkpoint written with the "
      "same\n"
      "                       --model, --batch, --seed, --shard and optimizer\n"
      "  --stop-after-steps N stop after step N as if interrupted (checkpoint\n"
      "                       written; the schedule still spans --epochs)\n"
      "  --log-every T        at most this long between progress lines: "
      "a duration\n"
      "                       (default 10 s; there are also four per epoch; "
      "0: every\n"
      "                       step), or a line every N steps (500steps)\n"
      "  --json               print the results as one JSON object on stdout\n"
      "\n"
      "Synchronous data-parallel SGD (every member runs this next to its "
      "node):\n"
      "  --sync               every step applies the mean gradient of the "
      "group's\n"
      "                       members (each on its own --shard K/N): N "
      "members of\n"
      "                       batch b step as one process of batch N*b; a "
      "member\n"
      "                       that fails is dropped and the rest go on\n"
      "  --data-dir DIR       the node's data directory (its control "
      "socket)\n"
      "  --socket PATH        or the node's control socket itself\n"
      "  --group LIST         the members, comma-separated ids (default: "
      "every\n"
      "                       member alive at the start)\n"
      "  --sync-timeout S     seconds an all-reduce may wait before the step "
      "fails\n"
      "                       (default 60)\n"
      "  -h, --help           this help\n"
      "\n"
      "Example:\n"
      "  starling train --model mlp:784-256-128-10 --data fashion-mnist "
      "--epochs 10 \\\n"
      "      --batch 64 --lr 0.05 --momentum 0.9 --schedule cosine\n"
      "  starling train --sync --data-dir state --shard 0/4 --model "
      "mlp:784-256-10 \\\n"
      "      --data fashion-mnist --batch 32 --lr 0.05 --momentum 0.9\n");
}

/* The options of `starling train` beyond the training flags
 * (cli_train_flags.c). */
enum {
  OPT_CHECKPOINT = ST__TRAIN_OPT_END,
  OPT_CHECKPOINT_EVERY,
  OPT_RESUME,
  OPT_LOG_EVERY,
  OPT_JSON,
  OPT_STOP_AFTER,
  OPT_NO_CHECKPOINT,
  OPT_SYNC,
  OPT_DATA_DIR,
  OPT_SOCKET,
  OPT_GROUP,
  OPT_SYNC_TIMEOUT
};

static const struct option own_opts[] = {
    {"checkpoint", required_argument, NULL, OPT_CHECKPOINT},
    {"checkpoint-every", required_argument, NULL, OPT_CHECKPOINT_EVERY},
    {"resume", required_argument, NULL, OPT_RESUME},
    {"log-every", required_argument, NULL, OPT_LOG_EVERY},
    {"json", no_argument, NULL, OPT_JSON},
    {"stop-after-steps", required_argument, NULL, OPT_STOP_AFTER},
    {"no-checkpoint", no_argument, NULL, OPT_NO_CHECKPOINT},
    {"sync", no_argument, NULL, OPT_SYNC},
    {"data-dir", required_argument, NULL, OPT_DATA_DIR},
    {"socket", required_argument, NULL, OPT_SOCKET},
    {"group", required_argument, NULL, OPT_GROUP},
    {"sync-timeout", required_argument, NULL, OPT_SYNC_TIMEOUT},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

#define N_OWN_OPTS (sizeof(own_opts) / sizeof(own_opts[0]))

typedef struct {
  st__train_flags_t f; /* what to train and how: f.cfg, f.data, f.device */
  const char* checkpoint;
  uint64_t checkpoint_every; /* steps; 0: by time, or never */
  double checkpoint_every_s; /* 0: by steps, or never */
  const char* resume;
  double log_every;         /* seconds; 0 with log_every_steps 0: each step */
  uint64_t log_every_steps; /* 0: by time */
  uint64_t stop_after;      /* 0: no limit */
  int json;
  int no_checkpoint;      /* --no-checkpoint */
  int default_checkpoint; /* checkpoint is DEFAULT_CHECKPOINT */
  int sync;               /* --sync */
  const char* data_dir;   /* --data-dir, for --sync */
  const char* socket;     /* --socket, or DATA_DIR/control.sock */
  char socket_buf[4096];
  const char* group; /* --group; NULL: "all" at the start */
  double sync_timeout_s;
} train_args_t;

/* After the options: the checkpoint is --checkpoint, none with
 * --no-checkpoint, else the default. Returns 0 or 2 (reported). */
static int finish_args(train_args_t* a) {
  if (a->no_checkpoint && a->checkpoint != NULL) {
    fprintf(stderr,
            "starling train: --checkpoint and --no-checkpoint contradict "
            "each other; give one\n");
    return 2;
  }
  if (!a->no_checkpoint && a->checkpoint == NULL) {
    a->checkpoint = DEFAULT_CHECKPOINT;
    a->default_checkpoint = 1;
  }
  if (!a->sync && (a->socket || a->data_dir || a->group)) {
    fprintf(stderr,
            "starling train: --socket, --data-dir and --group go "
            "with --sync\n");
    return 2;
  }
  if (a->sync && a->socket == NULL) {
    if (a->data_dir == NULL) {
      fprintf(stderr,
              "starling train: --sync needs the node: --data-dir "
              "DIR or --socket PATH\n");
      return 2;
    }
    int len = snprintf(a->socket_buf, sizeof a->socket_buf, "%s/control.sock",
                       a->data_dir);
    if (len < 0 || (size_t) len >= sizeof a->socket_buf) {
      fprintf(stderr, "starling train: --data-dir: the path is too long\n");
      return 2;
    }
    a->socket = a->socket_buf;
  }
  return st__train_flags_finish(CMD, &a->f);
}

/* The options of --sync: 0 (taken), 2 (a bad value, reported) or 1 (not
 * one of them). */
static int sync_flag(train_args_t* a, int c, const char* v) {
  int rc = 0;
  switch (c) {
    case OPT_SYNC:
      a->sync = 1;
      break;
    case OPT_DATA_DIR:
      a->data_dir = v;
      break;
    case OPT_SOCKET:
      a->socket = v;
      break;
    case OPT_GROUP:
      a->group = strcmp(v, "all") == 0 ? NULL : v;
      break;
    case OPT_SYNC_TIMEOUT:
      rc = st__parse_double(CMD, "--sync-timeout", v, 0.1, 1e6,
                            &a->sync_timeout_s);
      break;
    default:
      return 1;
  }
  return rc == 0 ? 0 : 2;
}

/* Parses argv into *a. Returns 0, or 2 (usage error, already reported), or
 * -1 when --help was printed. */
static int parse_args(int argc, char** argv, train_args_t* a) {
  memset(a, 0, sizeof(*a));
  st__train_flags_init(&a->f);
  a->log_every = 10.0;
  a->sync_timeout_s = 60.0;
  /* The training flags, then this command's own (with the terminator). */
  struct option opts[ST__TRAIN_OPT_COUNT + N_OWN_OPTS];
  size_t n_train = st__train_long_opts_count();
  memcpy(opts, st__train_long_opts, n_train * sizeof(opts[0]));
  memcpy(opts + n_train, own_opts, sizeof(own_opts));
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    const char* v = optarg;
    int rc = 0;
    switch (c) {
      case 'h':
        usage(stdout);
        return -1;
      case OPT_CHECKPOINT:
        a->checkpoint = v;
        break;
      case OPT_CHECKPOINT_EVERY:
        /* Once a bare number of steps: now a unit is required. */
        rc = st__parse_interval(CMD, "--checkpoint-every", v, 1e7, UINT32_MAX,
                                false, &a->checkpoint_every_s,
                                &a->checkpoint_every);
        break;
      case OPT_RESUME:
        a->resume = v;
        break;
      case OPT_LOG_EVERY:
        rc = st__parse_interval(CMD, "--log-every", v, 1e6, UINT32_MAX, true,
                                &a->log_every, &a->log_every_steps);
        break;
      case OPT_JSON:
        a->json = 1;
        break;
      case OPT_STOP_AFTER:
        rc = st__parse_u64(CMD, "--stop-after-steps", v, 1, UINT64_MAX,
                           &a->stop_after);
        break;
      case OPT_NO_CHECKPOINT:
        a->no_checkpoint = 1;
        break;
      case ':':
        fprintf(stderr, "starling train: %s needs a value\n", argv[optind - 1]);
        return 2;
      default:
        rc = sync_flag(a, c, v);
        if (rc == 1)
          rc = st__train_flag(CMD, c, v, &a->f);
        if (rc == 1) {
          fprintf(stderr,
                  "starling train: unknown option '%s'; see "
                  "'starling train --help'\n",
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
            "starling train: unexpected argument '%s'; see "
            "'starling train --help'\n",
            argv[optind]);
    return 2;
  }
  return finish_args(a);
}

/* ---- Output
 * ------------------------------------------------------------------- */

typedef struct {
  double train_loss; /* running mean over the current epoch */
  size_t train_loss_n;
  double test_loss, test_accuracy;
  int evaluated;
  double train_seconds; /* time spent stepping, excluding evaluation */
  uint64_t samples;     /* trained in this process */
} progress_t;

static void print_json(FILE* f, const train_args_t* a, const st_trainer_t* t,
                       const st_backend_t* be, const progress_t* p,
                       const char* eval_name, double wall,
                       const char* ckpt_written, const st__sync_t* sync) {
  char model[256];
  st_model_spec_format(&t->cfg.model, model, sizeof(model));
  fprintf(f, "{\"model\": ");
  st_json_write_string(f, model);
  fprintf(f, ", \"data\": ");
  st_json_write_string(f, a->f.data);
  fprintf(f, ", \"device\": ");
  st_json_write_string(f, st_backend_describe(be));
  fprintf(f, ", \"optimizer\": \"%s\", \"schedule\": \"%s\"",
          st_opt_kind_name(t->cfg.opt.kind),
          st_sched_kind_name(t->cfg.sched.kind));
  fprintf(f,
          ", \"epochs\": %" PRIu64 ", \"steps\": %" PRIu64 ", \"batch\": %zu",
          t->epoch, t->step, t->cfg.batch);
  if (t->cfg.hogwild != ST_HOGWILD_OFF)
    fprintf(f, ", \"hogwild\": \"%s\", \"hogwild_threads\": %u",
            st_hogwild_name(t->cfg.hogwild), t->cfg.threads);
  else
    fprintf(f, ", \"hogwild\": null, \"hogwild_threads\": null");
  if (sync != NULL) {
    st__sync_stats_t ss;
    st__sync_info(sync, &ss);
    fprintf(f,
            ", \"sync\": {\"members\": %zu, \"rank\": %zu, \"steps\": %" PRIu64
            ", \"failed_steps\": %" PRIu64 ", \"reforms\": %" PRIu64
            ", \"moved_steps\": %" PRIu64 "}",
            ss.size, ss.rank, ss.steps, ss.failed_steps, ss.reforms,
            ss.moved_steps);
  } else {
    fprintf(f, ", \"sync\": null");
  }
  /* Without a test set the evaluation ran on the training set: say so in
   * the key names rather than pass training accuracy off as test accuracy. */
  if (strcmp(eval_name, "test") != 0)
    fprintf(f, ", \"test_accuracy\": null, \"test_loss\": null");
  if (p->evaluated && isfinite(p->test_accuracy))
    fprintf(f, ", \"%s_accuracy\": %.6f", eval_name, p->test_accuracy);
  else
    fprintf(f, ", \"%s_accuracy\": null", eval_name);
  const char* loss_key =
      strcmp(eval_name, "test") == 0 ? "test_loss" : "train_eval_loss";
  if (p->evaluated)
    fprintf(f, ", \"%s\": %.6f", loss_key, p->test_loss);
  else
    fprintf(f, ", \"%s\": null", loss_key);
  fprintf(f, ", \"train_loss\": %.6f",
          p->train_loss_n ? p->train_loss / (double) p->train_loss_n : 0.0);
  fprintf(f, ", \"samples_per_sec\": %.1f",
          p->train_seconds > 0 ? (double) p->samples / p->train_seconds : 0.0);
  fprintf(f, ", \"wall_seconds\": %.3f, \"checkpoint\": ", wall);
  if (ckpt_written)
    st_json_write_string(f, ckpt_written);
  else
    fprintf(f, "null");
  fprintf(f, "}\n");
}

static int save(const train_args_t* a, st_trainer_t* t, FILE* log) {
  char err[512];
  st_meta_kv_t extra[] = {{"data", a->f.data}};
  if (st_trainer_save(t, a->checkpoint, extra, 1, err, sizeof(err)) != 0) {
    fprintf(stderr, "starling train: checkpoint not written: %s\n", err);
    return -1;
  }
  fprintf(log, "checkpoint: %s (step %" PRIu64 ")\n", a->checkpoint, t->step);
  return 0;
}

/* Refuses, before any training, a --checkpoint whose directory is missing
 * or not writable: finding out at the end of the first epoch (or of a long
 * run) wastes the work. Returns 0 or prints the reason and returns -1. */
static int check_checkpoint_dir(const char* path) {
  char dir[4096];
  const char* slash = strrchr(path, '/');
  if (slash == NULL)
    snprintf(dir, sizeof(dir), ".");
  else if (slash == path)
    snprintf(dir, sizeof(dir), "/");
  else
    snprintf(dir, sizeof(dir), "%.*s", (int) (slash - path), path);
  if (access(dir, W_OK | X_OK) == 0)
    return 0;
  if (errno == ENOENT)
    fprintf(stderr,
            "starling train: --checkpoint: directory '%s' does not exist; "
            "create it first (mkdir -p '%s')\n",
            dir, dir);
  else
    fprintf(stderr,
            "starling train: --checkpoint: cannot write into directory "
            "'%s': %s\n",
            dir, strerror(errno));
  return -1;
}

/* Creates DEFAULT_CHECKPOINT_DIR (and its parent) when missing. Returns 0
 * or prints why not and returns -1. */
static int make_default_dir(void) {
  static const char* const dirs[] = {"out", DEFAULT_CHECKPOINT_DIR};
  for (size_t i = 0; i < 2; i++)
    if (mkdir(dirs[i], 0755) != 0 && errno != EEXIST) {
      fprintf(stderr,
              "starling train: cannot create %s for the checkpoint: %s; give "
              "--checkpoint PATH or --no-checkpoint\n",
              dirs[i], strerror(errno));
      return -1;
    }
  return 0;
}

/* ---- Main loop
 * ------------------------------------------------------------------ */

/* Opens the data (our shard only), the backend and the trainer, resuming
 * from --resume when given. Returns 0, or 1 with the reason printed and
 * nothing left open. */
static int open_run(const train_args_t* a, FILE* log, st_data_t* data,
                    st_backend_t** be, st_trainer_t* t) {
  char err[1024];
  st_data_options_t dopt = a->f.data_opt; /* only our shard is held */
  dopt.shard_k = a->f.cfg.shard_k;
  dopt.shard_n = a->f.cfg.shard_n;
  if (st_data_open(data, a->f.data, &dopt, err, sizeof(err)) != 0) {
    fprintf(stderr, "starling train: --data: %s\n", err);
    return 1;
  }
  if (st_backend_open(be, a->f.device, (int) a->f.threads, err, sizeof(err)) !=
      0) {
    fprintf(stderr, "starling train: --device: %s\n", err);
    st_data_close(data);
    return 1;
  }
  fprintf(log, "device: %s\n", st_backend_describe(*be));

  if (st_trainer_init(t, *be, &data->train, &a->f.cfg, err, sizeof(err)) != 0) {
    fprintf(stderr, "starling train: %s\n", err);
    st_backend_close(*be);
    st_data_close(data);
    return 1;
  }
  if (a->resume != NULL) {
    if (st_trainer_load(t, a->resume, err, sizeof(err)) != 0) {
      fprintf(stderr, "starling train: --resume: %s\n", err);
      st_trainer_close(t);
      st_backend_close(*be);
      st_data_close(data);
      return 1;
    }
    fprintf(log, "resumed from %s at epoch %" PRIu64 ", step %" PRIu64 "\n",
            a->resume, t->epoch + 1, t->step);
  }
  char model[256];
  st_model_spec_format(&a->f.cfg.model, model, sizeof(model));
  fprintf(log,
          "model %s (%zu parameters), %s, %zu training examples (shard "
          "%u/%u of %zu), %zu test examples, %zu steps per epoch\n",
          model, t->model.n_params, st_opt_kind_name(a->f.cfg.opt.kind),
          t->shard_count, a->f.cfg.shard_k, a->f.cfg.shard_n, data->train.total,
          data->test.n, t->steps_per_epoch);
  if (a->f.cfg.hogwild != ST_HOGWILD_OFF)
    fprintf(log,
            "hogwild: %u threads, %s: one SGD step per example at --lr, %zu "
            "examples a step\n",
            a->f.cfg.threads, st_hogwild_name(a->f.cfg.hogwild),
            a->f.cfg.batch);
  return 0;
}

/* What the training loop shares between its steps: the run's options and
 * objects, what it has measured, and the window of the next progress line. */
typedef struct {
  const train_args_t* a;
  st_trainer_t* t;
  st_backend_t* be;
  FILE* log;
  const st_dataset_t* eval_set;
  const char* eval_name;
  progress_t p;
  const char* ckpt_written;
  double last_save; /* when the checkpoint was last written (or the start) */
  double last_log, epoch_start;
  uint64_t log_samples;
  double log_loss;
  size_t log_n;
  st__sync_t* sync; /* --sync; NULL otherwise */
} run_t;

/* A progress line every quarter epoch, and at least every --log-every
 * seconds when epochs are long; or every --log-every N steps. */
static void log_progress(run_t* r, uint64_t epoch_before, double t1) {
  const st_trainer_t* t = r->t;
  size_t quarter = (t->steps_per_epoch + 3) / 4;
  uint64_t every = r->a->log_every_steps;
  if (every > 0 ? t->step % every == 0
                : r->a->log_every == 0 || t1 - r->last_log >= r->a->log_every ||
                      r->log_n >= quarter) {
    fprintf(r->log,
            "epoch %" PRIu64
            "/%u  step %zu/%zu  loss %.4f  lr %.5f  "
            "%.0f samples/s\n",
            epoch_before + 1, r->a->f.cfg.epochs,
            t->pos ? t->pos : t->steps_per_epoch, t->steps_per_epoch,
            r->log_loss / (double) r->log_n, t->last_lr,
            (double) r->log_samples / (t1 - r->last_log));
    r->last_log = t1;
    r->log_samples = 0;
    r->log_loss = 0;
    r->log_n = 0;
  }
}

/* At the end of an epoch: evaluate, print the epoch's line, write the
 * checkpoint. 0, or -1 with the reason printed. */
static int end_epoch(run_t* r) {
  progress_t* p = &r->p;
  st_trainer_t* t = r->t;
  if (st_trainer_evaluate(t, r->eval_set, &p->test_loss, &p->test_accuracy) !=
      0) {
    fprintf(stderr, "starling train: evaluation failed: %s\n",
            st_backend_last_error(r->be));
    return -1;
  }
  p->evaluated = 1;
  double now = st_now_s();
  fprintf(r->log, "epoch %" PRIu64 "/%u done  train_loss %.4f  %s_loss %.4f",
          t->epoch, r->a->f.cfg.epochs,
          p->train_loss / (double) (p->train_loss_n ? p->train_loss_n : 1),
          r->eval_name, p->test_loss);
  if (isfinite(p->test_accuracy))
    fprintf(r->log, "  %s_accuracy %.4f", r->eval_name, p->test_accuracy);
  fprintf(r->log, "  (%.1f s)\n", now - r->epoch_start);
  r->epoch_start = now;
  if (!st_trainer_done(t)) {
    p->train_loss = 0;
    p->train_loss_n = 0;
  }
  if (r->a->checkpoint && (!r->a->default_checkpoint || st_trainer_done(t) ||
                           now - r->last_save >= DEFAULT_CHECKPOINT_EVERY_S)) {
    if (save(r->a, t, r->log) != 0)
      return -1;
    r->ckpt_written = r->a->checkpoint;
    r->last_save = st_now_s();
  }
  r->last_log = st_now_s();
  r->log_samples = 0;
  r->log_loss = 0;
  r->log_n = 0;
  return 0;
}

/* One training step with its accounting, progress line, checkpoint and
 * end of epoch. 0, or -1 with the reason printed. */
static int train_step(run_t* r) {
  st_trainer_t* t = r->t;
  const train_args_t* a = r->a;
  uint64_t epoch_before = t->epoch;
  size_t rows = t->shard_count - t->pos * t->cfg.batch;
  if (rows > t->cfg.batch)
    rows = t->cfg.batch;
  double loss = 0, t0 = st_now_s();
  int rc = r->sync != NULL ? st__sync_step(r->sync, t, &loss)
                           : st_trainer_step(t, &loss);
  double t1 = st_now_s();
  if (rc == 1) { /* dropped on every member; the group re-formed */
    r->p.train_seconds += t1 - t0;
    return t->epoch != epoch_before ? end_epoch(r) : 0;
  }
  if (rc == -EDOM) {
    fprintf(stderr,
            "starling train: training diverged at step %" PRIu64
            ": the loss is %g; lower --lr, add --clip-norm, or check the "
            "data (nothing was written for this step)\n",
            t->step, loss);
    return -1;
  }
  if (rc != 0 && r->sync != NULL)
    return -1; /* st__sync_step said why */
  if (rc != 0) {
    fprintf(stderr, "starling train: step %" PRIu64 " failed: %s\n", t->step,
            *st_backend_last_error(r->be) ? st_backend_last_error(r->be)
                                          : strerror(-rc));
    return -1;
  }
  r->p.train_seconds += t1 - t0;
  r->p.samples += rows;
  r->p.train_loss += loss;
  r->p.train_loss_n++;
  r->log_samples += rows;
  r->log_loss += loss;
  r->log_n++;
  log_progress(r, epoch_before, t1);
  bool due = a->checkpoint_every
                 ? t->step % a->checkpoint_every == 0
                 : a->checkpoint_every_s > 0 &&
                       t1 - r->last_save >= a->checkpoint_every_s;
  if (a->checkpoint && due && t->epoch == epoch_before) {
    if (save(a, t, r->log) != 0)
      return -1;
    r->ckpt_written = a->checkpoint;
    r->last_save = st_now_s();
  }
  if (t->epoch != epoch_before)
    return end_epoch(r);
  return 0;
}

/* After the loop: an interrupted or stopped run says how to continue; a
 * finished one prints its summary (and --json's document). Returns the exit
 * status. */
static int finish_run(run_t* r, int stopped, double t_start) {
  const train_args_t* a = r->a;
  st_trainer_t* t = r->t;
  progress_t* p = &r->p;
  if (stop_signal || stopped) {
    int saved = a->checkpoint != NULL && save(a, t, r->log) == 0;
    fprintf(stderr, "starling train: %s at step %" PRIu64 "%s%s\n",
            stop_signal ? "interrupted" : "stopped (--stop-after-steps)",
            t->step, saved ? "; continue with --resume " : "",
            saved ? a->checkpoint : "");
    return stop_signal ? 130 : 0;
  }
  if (!p->evaluated) {
    /* Resumed from a finished run: report its model as it stands. */
    if (st_trainer_evaluate(t, r->eval_set, &p->test_loss, &p->test_accuracy) ==
        0)
      p->evaluated = 1;
  }
  double wall = st_now_s() - t_start;
  fprintf(r->log,
          "done: %" PRIu64 " epochs, %" PRIu64
          " steps, %s_accuracy "
          "%.4f, %.0f samples/s, %.1f s\n",
          t->epoch, t->step, r->eval_name, p->test_accuracy,
          p->train_seconds > 0 ? (double) p->samples / p->train_seconds : 0.0,
          wall);
  if (r->ckpt_written != NULL)
    fprintf(r->log,
            "model saved to %s; score it with: starling eval --checkpoint %s "
            "--data %s\n",
            r->ckpt_written, r->ckpt_written, a->f.data);
  if (a->json)
    print_json(stdout, a, t, r->be, p, r->eval_name, wall, r->ckpt_written,
               r->sync);
  return 0;
}

int st__cmd_train(int argc, char** argv) {
  train_args_t a;
  int rc = parse_args(argc, argv, &a);
  if (rc != 0)
    return rc < 0 ? 0 : rc;
  if (!a.default_checkpoint && a.checkpoint != NULL &&
      check_checkpoint_dir(a.checkpoint) != 0)
    return 1;
  FILE* log = a.json ? stderr : stdout;
  setvbuf(log, NULL, _IOLBF, 0);
  /* Handle SIGINT/SIGTERM from the start, so that an interruption while
   * the data loads is also an orderly exit. */
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  double t_start = st_now_s();

  st_data_t data;
  st_backend_t* be = NULL;
  st_trainer_t t;
  if (open_run(&a, log, &data, &be, &t) != 0)
    return 1;
  int status = 1;
  run_t r = {0};
  /* The default directory is made once the run is known to start, so that
   * a refused run leaves nothing behind. */
  if (a.default_checkpoint &&
      (make_default_dir() != 0 || check_checkpoint_dir(a.checkpoint) != 0))
    goto out;

  r.a = &a;
  r.t = &t;
  r.be = be;
  r.log = log;
  r.eval_set = data.test.n ? &data.test : &data.train;
  r.eval_name = data.test.n ? "test" : "train";
  r.last_log = st_now_s();
  r.epoch_start = r.last_log;
  r.last_save = r.last_log;
  if (a.sync) {
    char err[1024];
    if (st__sync_open(&r.sync, a.socket, a.group, a.sync_timeout_s, &t, log,
                      err, sizeof err) != 0) {
      fprintf(stderr, "starling train: --sync: %s\n", err);
      goto out;
    }
  }
  int stopped = 0;
  while (!st_trainer_done(&t) && !stop_signal && !stopped) {
    if (train_step(&r) != 0)
      goto out;
    if (a.stop_after && t.step >= a.stop_after)
      stopped = 1;
  }
  status = finish_run(&r, stopped, t_start);
out:
  st__sync_close(r.sync);
  st_trainer_close(&t);
  st_backend_close(be);
  st_data_close(&data);
  return status;
}
