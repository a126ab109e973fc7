/* cli_train_flags.c: the training flags shared by every command that trains
 * (`starling train`, `starling node`) and, for the few it takes,
 * `starling-bench train`: what model on what data, the optimizer and its
 * learning-rate schedule, the device. One table, one parser and one help
 * text, so that the commands cannot drift apart in names, defaults, ranges
 * or messages. Values are parsed strictly by cli_common.c; every refusal
 * reads "CMD: --flag: ..." (CMD the whole command, e.g. "starling train"). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tools/cli/cli.h"

const struct option st__train_long_opts[] = {
    {"model", required_argument, NULL, ST__TRAIN_OPT_MODEL},
    {"data", required_argument, NULL, ST__TRAIN_OPT_DATA},
    {"label-col", required_argument, NULL, ST__TRAIN_OPT_LABEL_COL},
    {"regression", no_argument, NULL, ST__TRAIN_OPT_REGRESSION},
    {"no-normalize", no_argument, NULL, ST__TRAIN_OPT_NO_NORMALIZE},
    {"shard", required_argument, NULL, ST__TRAIN_OPT_SHARD},
    {"epochs", required_argument, NULL, ST__TRAIN_OPT_EPOCHS},
    {"batch", required_argument, NULL, ST__TRAIN_OPT_BATCH},
    {"lr", required_argument, NULL, ST__TRAIN_OPT_LR},
    {"optimizer", required_argument, NULL, ST__TRAIN_OPT_OPTIMIZER},
    {"momentum", required_argument, NULL, ST__TRAIN_OPT_MOMENTUM},
    {"beta1", required_argument, NULL, ST__TRAIN_OPT_BETA1},
    {"beta2", required_argument, NULL, ST__TRAIN_OPT_BETA2},
    {"eps", required_argument, NULL, ST__TRAIN_OPT_EPS},
    {"weight-decay", required_argument, NULL, ST__TRAIN_OPT_WEIGHT_DECAY},
    {"clip-norm", required_argument, NULL, ST__TRAIN_OPT_CLIP_NORM},
    {"schedule", required_argument, NULL, ST__TRAIN_OPT_SCHEDULE},
    {"warmup", required_argument, NULL, ST__TRAIN_OPT_WARMUP},
    {"step-every", required_argument, NULL, ST__TRAIN_OPT_STEP_EVERY},
    {"gamma", required_argument, NULL, ST__TRAIN_OPT_GAMMA},
    {"min-lr", required_argument, NULL, ST__TRAIN_OPT_MIN_LR},
    {"seed", required_argument, NULL, ST__TRAIN_OPT_SEED},
    {"device", required_argument, NULL, ST__TRAIN_OPT_DEVICE},
    {"threads", required_argument, NULL, ST__TRAIN_OPT_THREADS},
    {"hogwild", no_argument, NULL, ST__TRAIN_OPT_HOGWILD},
    {"hogwild-locked", no_argument, NULL, ST__TRAIN_OPT_HOGWILD_LOCKED},
    {NULL, 0, NULL, 0},
};

/* The table lists every id of the enum in cli.h once, in order. */
_Static_assert(sizeof(st__train_long_opts) / sizeof(st__train_long_opts[0]) ==
                   ST__TRAIN_OPT_COUNT + 1,
               "st__train_long_opts and the ST__TRAIN_OPT_ ids disagree");

size_t st__train_long_opts_count(void) {
  return ST__TRAIN_OPT_COUNT;
}

void st__train_flags_init(st__train_flags_t* f) {
  memset(f, 0, sizeof(*f));
  st_train_config_default(&f->cfg);
  f->data_opt.csv.label_col = -1;
  f->data_opt.normalize = 1;
  f->device = "auto";
}

/* One case per flag of st__train_long_opts, in the table's order: each parses
 * its value into f with its range, beside the others' so that they read as
 * one table (cli.h says what it returns); split, it would only scatter it.
 * Long: a table of 27 flags, one short case each. */
int st__train_flag(const char* cmd, int opt, const char* value,
                   st__train_flags_t* f) {
  const char* v = value;
  uint64_t u = 0;
  double d = 0;
  int rc = 0;
  switch (opt) {
    case ST__TRAIN_OPT_MODEL:
      f->model = v;
      break;
    case ST__TRAIN_OPT_DATA:
      f->data = v;
      break;
    case ST__TRAIN_OPT_LABEL_COL:
      rc = st__parse_u64(cmd, "--label-col", v, 0, 1u << 20, &u);
      if (rc == 0)
        f->data_opt.csv.label_col = (int) u;
      break;
    case ST__TRAIN_OPT_REGRESSION:
      f->data_opt.csv.regression = 1;
      break;
    case ST__TRAIN_OPT_NO_NORMALIZE:
      f->data_opt.normalize = 0;
      break;
    case ST__TRAIN_OPT_SHARD:
      if (st_shard_parse(v, &f->cfg.shard_k, &f->cfg.shard_n) != 0) {
        fprintf(stderr,
                "%s: --shard: '%s' is not K/N with "
                "0 <= K < N (e.g. 0/4)\n",
                cmd, v);
        rc = -EINVAL;
      }
      break;
    case ST__TRAIN_OPT_EPOCHS:
      rc = st__parse_u64(cmd, "--epochs", v, 1, 1000000, &u);
      if (rc == 0)
        f->cfg.epochs = (uint32_t) u;
      break;
    case ST__TRAIN_OPT_BATCH:
      rc = st__parse_u64(cmd, "--batch", v, 1, 1u << 20, &u);
      if (rc == 0)
        f->cfg.batch = (size_t) u;
      break;
    case ST__TRAIN_OPT_LR:
      rc = st__parse_double(cmd, "--lr", v, 0, 1e6, &f->cfg.sched.base_lr);
      break;
    case ST__TRAIN_OPT_OPTIMIZER:
      if (st_opt_kind_parse(v, &f->cfg.opt.kind) != 0) {
        fprintf(stderr,
                "%s: --optimizer: '%s' is not one of "
                "sgd, momentum, nesterov, adamw\n",
                cmd, v);
        rc = -EINVAL;
      }
      f->optimizer_given = 1;
      break;
    case ST__TRAIN_OPT_MOMENTUM:
      rc = st__parse_double(cmd, "--momentum", v, 0, 0.999999, &d);
      if (rc == 0)
        f->cfg.opt.momentum = (float) d;
      f->momentum_given = 1;
      break;
    case ST__TRAIN_OPT_BETA1:
      rc = st__parse_double(cmd, "--beta1", v, 0, 0.999999, &d);
      if (rc == 0)
        f->cfg.opt.beta1 = (float) d;
      break;
    case ST__TRAIN_OPT_BETA2:
      rc = st__parse_double(cmd, "--beta2", v, 0, 0.999999999, &d);
      if (rc == 0)
        f->cfg.opt.beta2 = (float) d;
      break;
    case ST__TRAIN_OPT_EPS:
      rc = st__parse_double(cmd, "--eps", v, 1e-30, 1, &d);
      if (rc == 0)
        f->cfg.opt.eps = (float) d;
      break;
    case ST__TRAIN_OPT_WEIGHT_DECAY:
      rc = st__parse_double(cmd, "--weight-decay", v, 0, 10, &d);
      if (rc == 0)
        f->cfg.opt.weight_decay = (float) d;
      break;
    case ST__TRAIN_OPT_CLIP_NORM:
      rc = st__parse_double(cmd, "--clip-norm", v, 0, 1e30, &d);
      if (rc == 0)
        f->cfg.opt.clip_norm = (float) d;
      break;
    case ST__TRAIN_OPT_SCHEDULE:
      if (st_sched_kind_parse(v, &f->cfg.sched.kind) != 0) {
        fprintf(stderr,
                "%s: --schedule: '%s' is not one of "
                "constant, step, cosine\n",
                cmd, v);
        rc = -EINVAL;
      }
      break;
    case ST__TRAIN_OPT_WARMUP:
      rc = st__parse_u64(cmd, "--warmup", v, 0, UINT32_MAX,
                         &f->cfg.sched.warmup_steps);
      break;
    case ST__TRAIN_OPT_STEP_EVERY:
      rc = st__parse_u64(cmd, "--step-every", v, 1, UINT32_MAX,
                         &f->cfg.sched.step_every);
      break;
    case ST__TRAIN_OPT_GAMMA:
      rc = st__parse_double(cmd, "--gamma", v, 0, 1, &f->cfg.sched.gamma);
      break;
    case ST__TRAIN_OPT_MIN_LR:
      rc = st__parse_double(cmd, "--min-lr", v, 0, 1e6, &f->cfg.sched.min_lr);
      break;
    case ST__TRAIN_OPT_SEED:
      rc = st__parse_u64(cmd, "--seed", v, 0, UINT64_MAX, &f->cfg.seed);
      break;
    case ST__TRAIN_OPT_DEVICE:
      f->device = v;
      break;
    case ST__TRAIN_OPT_THREADS:
      rc = st__parse_u64(cmd, "--threads", v, 1, 1024, &f->threads);
      break;
    case ST__TRAIN_OPT_HOGWILD:
      f->cfg.hogwild = ST_HOGWILD_LOCKFREE;
      break;
    case ST__TRAIN_OPT_HOGWILD_LOCKED:
      f->cfg.hogwild = ST_HOGWILD_LOCKED;
      break;
    default:
      return 1;
  }
  return rc == 0 ? 0 : 2;
}

int st__train_flags_finish(const char* cmd, st__train_flags_t* f) {
  if (f->model == NULL || f->data == NULL) {
    fprintf(stderr,
            "%s: --model and --data are required, e.g.\n"
            "  %s --model mlp:784-256-128-10 --data fashion-mnist\n",
            cmd, cmd);
    return 2;
  }
  char err[512];
  if (st_model_spec_parse(f->model, &f->cfg.model, err, sizeof(err)) != 0) {
    fprintf(stderr, "%s: --model: %s\n", cmd, err);
    return 2;
  }
  /* `--momentum M` alone means SGD with momentum, as in torch.optim.SGD. */
  if (!f->optimizer_given && f->momentum_given && f->cfg.opt.momentum > 0)
    f->cfg.opt.kind = ST_OPT_MOMENTUM;
  if (f->cfg.sched.kind == ST_SCHED_STEP && f->cfg.sched.step_every == 0) {
    fprintf(stderr, "%s: --schedule step needs --step-every N\n", cmd);
    return 2;
  }
  /* A linear model is a regression: its CSV targets are real numbers. */
  if (f->cfg.model.kind == ST_MODEL_LINEAR)
    f->data_opt.csv.regression = 1;
  if (f->cfg.hogwild != ST_HOGWILD_OFF) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    uint64_t n = f->threads > 0 ? f->threads : (uint64_t) (cpus > 0 ? cpus : 1);
    if (n > ST_HOGWILD_MAX_THREADS) {
      fprintf(stderr, "%s: --hogwild: %llu threads; want at most %d\n", cmd,
              (unsigned long long) n, ST_HOGWILD_MAX_THREADS);
      return 2;
    }
    f->cfg.threads = (uint32_t) n;
  }
  return 0;
}

void st__train_flags_usage(FILE* out) {
  fprintf(
      out,
      "Model and data:\n"
      "  --model SPEC         mlp:IN-H1-...-OUT, softmax:IN-OUT or "
      "linear:IN-1\n"
      "                       (e.g. mlp:784-256-128-10)\n"
      "  --data SPEC          fashion-mnist | "
      "idx:IMAGES,LABELS[,TEST_IMAGES,TEST_LABELS]\n"
      "                       | csv:TRAIN[,TEST] | libsvm:TRAIN[,TEST] "
      "(sparse)\n"
      "  --label-col K        CSV column holding the label (default: the "
      "last)\n"
      "  --regression         CSV targets are real numbers (for linear "
      "models)\n"
      "  --no-normalize       do not standardize features\n"
      "  --shard K/N          train on shard K of N of the training set "
      "(default 0/1)\n"
      "\n"
      "Optimization:\n"
      "  --epochs N           passes over the shard (default 10)\n"
      "  --batch N            examples per step (default 64)\n"
      "  --lr X               base learning rate (default 0.05)\n"
      "  --optimizer NAME     sgd | momentum | nesterov | adamw (default sgd, "
      "or\n"
      "                       momentum when --momentum is given)\n"
      "  --momentum M         momentum coefficient (default 0.9 when used)\n"
      "  --beta1 B --beta2 B --eps E    AdamW (defaults 0.9, 0.999, 1e-8)\n"
      "  --weight-decay W     L2 for the SGD family, decoupled for AdamW "
      "(default 0)\n"
      "  --clip-norm C        clip the gradient's L2 norm to C (default: off)\n"
      "  --schedule NAME      constant | step | cosine (default constant)\n"
      "  --warmup N           linear warm-up over the first N steps (default "
      "0)\n"
      "  --step-every N --gamma G   step schedule: multiply by G every N "
      "steps\n"
      "  --min-lr X           cosine floor (default 0)\n"
      "  --seed N             initialization and shuffling seed (default 1)\n"
      "\n"
      "Running:\n"
      "  --device D           auto | cpu | cuda | cuda:N (default auto)\n"
      "  --threads N          CPU BLAS threads (default: OpenBLAS's choice);\n"
      "                       with --hogwild, its threads (default: every "
      "CPU)\n"
      "  --hogwild            linear models on the CPU: N threads each take "
      "one\n"
      "                       SGD step per example on the shared "
      "parameters,\n"
      "                       without locks (--lr is per example; sparse "
      "data,\n"
      "                       libsvm:, above all)\n"
      "  --hogwild-locked     the same with one lock around each update "
      "(the\n"
      "                       serial reference HogWild is measured "
      "against)\n");
}
