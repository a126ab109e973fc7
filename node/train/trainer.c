/* trainer.c: the local training loop of one node: a model, its optimizer
 * and learning-rate schedule, and a shard of the training set, stepped one
 * batch at a time, plus evaluation and checkpoints that let a run continue
 * exactly where it stopped.
 *
 * `starling train` drives it directly; the daemon's trainer thread will
 * drive the same calls between its mailbox checks (DESIGN.md, Threads).
 */
#include "node/train/train.h"
#include "node/train/train_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t st__eval_rows(const st_model_spec_t* spec) {
  size_t per_row = 0, widest = 0;
  for (int l = 0; l <= spec->n_layers; l++) {
    per_row += spec->sizes[l];
    if (spec->sizes[l] > widest)
      widest = spec->sizes[l];
  }
  per_row += 2 * widest + 2; /* dact, dact2, targets, row_loss */
  size_t rows = ST__EVAL_WORKSPACE_FLOATS / per_row;
  if (rows > ST__EVAL_BATCH_ROWS)
    rows = ST__EVAL_BATCH_ROWS;
  return rows < 64 ? 64 : rows;
}

void st_train_config_default(st_train_config_t* cfg) {
  memset(cfg, 0, sizeof(*cfg));
  st_opt_config_default(&cfg->opt);
  cfg->sched.kind = ST_SCHED_CONSTANT;
  cfg->sched.base_lr = 0.05;
  cfg->sched.gamma = 0.1;
  cfg->batch = 64;
  cfg->epochs = 10;
  cfg->seed = 1;
  cfg->shard_k = 0;
  cfg->shard_n = 1;
}

/* ---- Set-up
 * ------------------------------------------------------------------ */

static int check_fit(const st_dataset_t* ds, const st_model_spec_t* spec,
                     char* err, size_t err_len) {
  char model[256];
  st_model_spec_format(spec, model, sizeof(model));
  if (ds->dim != spec->sizes[0]) {
    st_set_err(err, err_len,
               "model %s expects %zu inputs but %s has %zu features per "
               "example; change the first size of --model to %zu",
               model, spec->sizes[0], ds->source, ds->dim, ds->dim);
    return -EINVAL;
  }
  size_t classes = st_model_spec_classes(spec);
  if (classes == 0 && ds->n_classes != 0) {
    st_set_err(err, err_len,
               "model %s is a regression model but %s holds class labels; "
               "use softmax:%zu-%zu or an mlp, or load the CSV with "
               "--regression",
               model, ds->source, ds->dim, ds->n_classes);
    return -EINVAL;
  }
  if (classes != 0 && ds->n_classes == 0) {
    st_set_err(err, err_len,
               "model %s is a classifier but %s holds real-valued targets; use "
               "linear:%zu-1 for regression",
               model, ds->source, ds->dim);
    return -EINVAL;
  }
  if (classes != 0 && ds->n_classes > classes) {
    st_set_err(
        err, err_len,
        "model %s has %zu outputs but %s has %zu classes; change the last "
        "size of --model to %zu",
        model, classes, ds->source, ds->n_classes, ds->n_classes);
    return -EINVAL;
  }
  return 0;
}

/* The indices of the trainer's shard of train into t->shard. */
static int take_shard(st_trainer_t* t, const st_dataset_t* train,
                      const st_train_config_t* cfg, char* err, size_t err_len) {
  int rc;
  if (train->shard_n > 1) {
    /* The data holds our shard already (st_data_options_t), in the order
     * of the file: its rows are the shard's indices, one for one, so the
     * epochs see the batches they would over the whole set. */
    if (train->shard_k != cfg->shard_k || train->shard_n != cfg->shard_n) {
      st_set_err(err, err_len,
                 "%s was loaded as shard %u/%u, but training wants shard "
                 "%u/%u",
                 train->source, train->shard_k, train->shard_n, cfg->shard_k,
                 cfg->shard_n);
      return -EINVAL;
    }
    rc = st_shard_indices(train->n, 0, 1, &t->shard, &t->shard_count);
  } else {
    rc = st_shard_indices(train->n, cfg->shard_k, cfg->shard_n, &t->shard,
                          &t->shard_count);
  }
  if (rc != 0)
    return rc;
  if (t->shard_count == 0) {
    st_set_err(err, err_len, "shard %u/%u of %s is empty (%zu examples)",
               cfg->shard_k, cfg->shard_n, train->source, train->n);
    return -EINVAL;
  }
  return 0;
}

int st_trainer_init(st_trainer_t* t, st_backend_t* be,
                    const st_dataset_t* train, const st_train_config_t* cfg,
                    char* err, size_t err_len) {
  memset(t, 0, sizeof(*t));
  if (cfg->batch == 0 || cfg->shard_n == 0 || cfg->shard_k >= cfg->shard_n) {
    st_set_err(err, err_len,
               "bad training configuration: batch %zu, shard %u/%u", cfg->batch,
               cfg->shard_k, cfg->shard_n);
    return -EINVAL;
  }
  int rc = check_fit(train, &cfg->model, err, err_len);
  if (rc == 0 && cfg->hogwild != ST_HOGWILD_OFF)
    rc = st__hogwild_check(cfg, be, err, err_len);
  if (rc != 0)
    return rc;
  t->be = be;
  t->train = train;
  t->cfg = *cfg;
  rc = take_shard(t, train, cfg, err, err_len);
  if (rc != 0)
    goto fail;
  t->steps_per_epoch = (t->shard_count + cfg->batch - 1) / cfg->batch;
  if (t->cfg.sched.total_steps == 0)
    t->cfg.sched.total_steps = (uint64_t) t->steps_per_epoch * cfg->epochs;
  /* Evaluation reuses the model's workspace, so size it for whichever is
   * larger: a training batch (none for HogWild, which steps example by
   * example) or an evaluation chunk (none for sparse data on a linear
   * model, evaluated row by row). */
  size_t rows = cfg->hogwild != ST_HOGWILD_OFF ? 1 : cfg->batch;
  size_t eval_rows = st__eval_rows(&cfg->model);
  if (!st__rowwise_eval(&cfg->model, be, train) && rows < eval_rows)
    rows = eval_rows;
  t->order = malloc(t->shard_count * sizeof(size_t));
  int staged = st_backend_kind(be) != ST_BACKEND_CPU; /* batches go through
                                                         host memory */
  if (staged) {
    t->host_x = malloc(rows * train->dim * sizeof(float));
    t->host_y = malloc(rows * sizeof(float));
  }
  if (t->order == NULL ||
      (staged && (t->host_x == NULL || t->host_y == NULL))) {
    rc = -ENOMEM;
    goto fail;
  }
  st_epoch_order(t->shard, t->shard_count, cfg->seed, 0, t->order);
  rc = st_model_init(&t->model, be, &cfg->model, rows, cfg->seed);
  if (rc == 0)
    rc = st_optim_init(&t->optim, be, &cfg->opt, t->model.n_params);
  if (rc != 0) {
    st_set_err(
        err, err_len, "cannot allocate the model on %s: %s",
        st_backend_describe(be),
        *st_backend_last_error(be) ? st_backend_last_error(be) : strerror(-rc));
    goto fail;
  }
  if (cfg->hogwild != ST_HOGWILD_OFF) {
    rc = st__hogwild_start(t, &t->pool, err, err_len);
    if (rc != 0)
      goto fail;
  }
  return 0;
fail:
  st_trainer_close(t);
  return rc;
}

void st_trainer_close(st_trainer_t* t) {
  st__hogwild_stop(t->pool);
  if (t->be != NULL) {
    st_optim_close(&t->optim);
    st_model_close(&t->model);
  }
  free(t->shard);
  free(t->order);
  free(t->host_x);
  free(t->host_y);
  memset(t, 0, sizeof(*t));
}

/* ---- Stepping
 * ------------------------------------------------------------------ */

bool st_trainer_done(const st_trainer_t* t) {
  return t->epoch >= t->cfg.epochs;
}

/* Copies `rows` examples named by idx into the model's input and target
 * buffers. The CPU backend's device memory is host memory, so the batch is
 * gathered straight into it. */
static int load_batch(st_trainer_t* t, const st_dataset_t* ds,
                      const size_t* idx, size_t rows, int sequential) {
  size_t dim = ds->dim;
  float* in = st_model_input(&t->model);
  float* tg = st_model_targets(&t->model);
  if (st_backend_kind(t->be) == ST_BACKEND_CPU) {
    if (sequential) {
      st__dataset_rows(ds, idx[0], rows, in, tg);
    } else {
      st_dataset_gather(ds, idx, rows, in, tg);
    }
    return 0;
  }
  if (sequential && !st_dataset_is_sparse(ds)) {
    int rc = st_copy_to_device(t->be, in, ds->x + idx[0] * dim, rows * dim);
    return rc ? rc : st_copy_to_device(t->be, tg, ds->y + idx[0], rows);
  }
  if (sequential)
    st__dataset_rows(ds, idx[0], rows, t->host_x, t->host_y);
  else
    st_dataset_gather(ds, idx, rows, t->host_x, t->host_y);
  int rc = st_copy_to_device(t->be, in, t->host_x, rows * dim);
  return rc ? rc : st_copy_to_device(t->be, tg, t->host_y, rows);
}

/* Moves the position past the step just taken. */
static void advance(st_trainer_t* t, double lr) {
  t->last_lr = lr;
  t->step++;
  if (++t->pos == t->steps_per_epoch) {
    t->pos = 0;
    t->epoch++;
    st_epoch_order(t->shard, t->shard_count, t->cfg.seed, t->epoch, t->order);
  }
}

int st_trainer_step(st_trainer_t* t, double* loss) {
  if (t->pool != NULL) {
    size_t start = t->pos * t->cfg.batch;
    size_t rows = t->shard_count - start;
    if (rows > t->cfg.batch)
      rows = t->cfg.batch;
    double lr = st_schedule_lr(&t->cfg.sched, t->step), mean = 0;
    int rc = st__hogwild_step(t->pool, start, rows, (float) lr, &mean);
    if (loss != NULL)
      *loss = mean;
    if (rc != 0)
      return rc;
    advance(t, lr);
    return 0;
  }
  int rc = st_trainer_gradient(t, loss, NULL, NULL);
  return rc != 0 ? rc : st_trainer_apply(t);
}

int st_trainer_gradient(st_trainer_t* t, double* loss,
                        void (*layer_done)(void* arg, int layer), void* arg) {
  if (t->pool != NULL)
    return -EINVAL;
  size_t start = t->pos * t->cfg.batch;
  size_t rows = t->shard_count - start;
  if (rows > t->cfg.batch)
    rows = t->cfg.batch;
  int rc = load_batch(t, t->train, t->order + start, rows, 0);
  if (rc != 0)
    return rc;
  double batch_loss = 0;
  rc = st_model_step_hooked(&t->model, rows, loss ? &batch_loss : NULL,
                            layer_done, arg);
  if (rc != 0)
    return rc;
  if (loss != NULL) {
    *loss = batch_loss;
    /* A non-finite loss means the gradient is garbage too: stop before it
     * reaches the parameters. */
    if (!isfinite(batch_loss))
      return -EDOM;
  }
  return 0;
}

int st_trainer_apply(st_trainer_t* t) {
  if (t->pool != NULL)
    return -EINVAL;
  double lr = st_schedule_lr(&t->cfg.sched, t->step);
  double gnorm = 0;
  int rc = st_optim_step(&t->optim, t->model.params, t->model.grads, (float) lr,
                         t->cfg.opt.clip_norm > 0 ? &gnorm : NULL);
  if (rc != 0)
    return rc;
  if (t->cfg.opt.clip_norm > 0 && !isfinite(gnorm))
    return -EDOM;
  advance(t, lr);
  return 0;
}

void st_trainer_skip(st_trainer_t* t) {
  advance(t, st_schedule_lr(&t->cfg.sched, t->step));
}

int st_trainer_set_position(st_trainer_t* t, uint64_t step) {
  if (t->steps_per_epoch == 0 || t->order == NULL)
    return -EINVAL;
  t->step = step;
  t->epoch = step / t->steps_per_epoch;
  t->pos = (size_t) (step % t->steps_per_epoch);
  /* The rate the last update would have used, for the checkpoint's "lr". */
  t->last_lr = step > 0 ? st_schedule_lr(&t->cfg.sched, step - 1) : 0;
  st_epoch_order(t->shard, t->shard_count, t->cfg.seed, t->epoch, t->order);
  return 0;
}

int st_trainer_evaluate(st_trainer_t* t, const st_dataset_t* ds,
                        double* mean_loss, double* accuracy) {
  return st_trainer_evaluate_between(t, ds, mean_loss, accuracy, NULL, NULL);
}

int st_trainer_evaluate_between(st_trainer_t* t, const st_dataset_t* ds,
                                double* mean_loss, double* accuracy,
                                void (*between)(void* arg), void* arg) {
  if (ds->n == 0 || ds->dim != t->cfg.model.sizes[0])
    return -EINVAL;
  double loss_sum = 0;
  size_t correct = 0;
  int rowwise = st__rowwise_eval(&t->cfg.model, t->be, ds);
  /* A dense set on a workspace sized for none (a HogWild trainer of sparse
   * data asked about dense examples) goes in the chunks it holds. */
  size_t eval_rows = st__eval_rows(&t->cfg.model);
  size_t chunk = rowwise || t->model.max_batch >= eval_rows
                     ? eval_rows
                     : t->model.max_batch;
  for (size_t start = 0; start < ds->n; start += chunk) {
    size_t rows = ds->n - start;
    if (rows > chunk)
      rows = chunk;
    int rc;
    if (rowwise) {
      rc = st__rowwise_evaluate(&t->cfg.model, t->model.params, ds, start, rows,
                                &loss_sum, &correct, NULL);
    } else {
      rc = load_batch(t, ds, &start, rows, 1);
      if (rc == 0)
        rc = st_model_eval(&t->model, rows, &loss_sum, &correct);
    }
    if (rc != 0)
      return rc;
    if (between != NULL && start + rows < ds->n)
      between(arg);
  }
  *mean_loss = loss_sum / (double) ds->n;
  *accuracy = st_model_spec_classes(&t->cfg.model)
                  ? (double) correct / (double) ds->n
                  : NAN;
  return 0;
}
