/* trainer_checkpoint.c: saving and restoring a trainer as a safetensors
 * checkpoint.
 *
 * The file holds one tensor per layer weight and bias, named as PyTorch's
 * nn.Sequential of nn.Linear would name them ("layers.L.weight" of shape
 * out x in, "layers.L.bias"), the optimizer state under PyTorch's names
 * ("optimizer.momentum_buffer.*", "optimizer.exp_avg.*",
 * "optimizer.exp_avg_sq.*"), and string metadata: the model, optimizer,
 * batch, seed and shard that must match to resume, and the position (step,
 * epoch, step within the epoch, optimizer step count) to resume from.
 * Because the flat parameter buffer is laid out W0, b0, W1, b1, ..., the
 * tensors are written in buffer order and the file's data section is the
 * flat buffer itself.
 */
#include "node/train/train.h"
#include "node/train/train_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECKPOINT_FORMAT "starling-checkpoint-1"
#define MAX_STATE 3 /* params + up to two optimizer buffers */
#define NAME_LEN 96

/* The buffers a checkpoint holds, each with its name prefix. */
typedef struct {
  const char* prefix;
  float* device;
} state_buf_t;

static int state_buffers(st_trainer_t* t, state_buf_t out[MAX_STATE]) {
  int n = 0;
  out[n++] = (state_buf_t){"", t->model.params};
  switch (t->cfg.opt.kind) {
    case ST_OPT_SGD:
      break;
    case ST_OPT_MOMENTUM:
    case ST_OPT_NESTEROV:
      out[n++] = (state_buf_t){"optimizer.momentum_buffer.", t->optim.m};
      break;
    case ST_OPT_ADAMW:
      out[n++] = (state_buf_t){"optimizer.exp_avg.", t->optim.m};
      out[n++] = (state_buf_t){"optimizer.exp_avg_sq.", t->optim.v};
      break;
  }
  return n;
}

static void shard_text(const st_train_config_t* c, char* buf, size_t len) {
  snprintf(buf, len, "%" PRIu32 "/%" PRIu32, c->shard_k, c->shard_n);
}

/* ---- Save
 * ------------------------------------------------------------------------ */

int st_trainer_save(st_trainer_t* t, const char* path,
                    const st_meta_kv_t* extra, size_t n_extra, char* err,
                    size_t err_len) {
  state_buf_t bufs[MAX_STATE];
  int nbufs = state_buffers(t, bufs);
  int L = t->cfg.model.n_layers;
  size_t n = t->model.n_params;
  size_t n_tensors = (size_t) nbufs * 2 * (size_t) L;
  float* host = malloc((size_t) nbufs * (n ? n : 1) * sizeof(float));
  st_tensor_desc_t* tensors = calloc(n_tensors, sizeof(*tensors));
  char(*names)[NAME_LEN] = calloc(n_tensors, NAME_LEN);
  st_meta_kv_t* meta = calloc(16 + n_extra, sizeof(*meta));
  int rc = -ENOMEM;
  if (host == NULL || tensors == NULL || names == NULL || meta == NULL) {
    st_set_err(err, err_len, "%s: out of memory writing the checkpoint", path);
    goto done;
  }
  size_t k = 0;
  for (int b = 0; b < nbufs; b++) {
    float* h = host + (size_t) b * n;
    rc = st_copy_to_host(t->be, h, bufs[b].device, n);
    if (rc != 0) {
      st_set_err(err, err_len, "%s: cannot read the model from the device: %s",
                 path, st_backend_last_error(t->be));
      goto done;
    }
    for (int l = 0; l < L; l++) {
      size_t in = t->cfg.model.sizes[l], out = t->cfg.model.sizes[l + 1];
      snprintf(names[k], NAME_LEN, "%slayers.%d.weight", bufs[b].prefix, l);
      tensors[k] =
          (st_tensor_desc_t){names[k], h + t->model.w_off[l], {out, in}, 2};
      k++;
      snprintf(names[k], NAME_LEN, "%slayers.%d.bias", bufs[b].prefix, l);
      tensors[k] =
          (st_tensor_desc_t){names[k], h + t->model.b_off[l], {out}, 1};
      k++;
    }
  }

  char model[256], shard[48], step[32], epoch[32], pos[32], opt_t[32],
      batch[32], seed[32], lr[48];
  st_model_spec_format(&t->cfg.model, model, sizeof(model));
  shard_text(&t->cfg, shard, sizeof(shard));
  snprintf(step, sizeof(step), "%" PRIu64, t->step);
  snprintf(epoch, sizeof(epoch), "%" PRIu64, t->epoch);
  snprintf(pos, sizeof(pos), "%zu", t->pos);
  snprintf(opt_t, sizeof(opt_t), "%" PRIu64, t->optim.t);
  snprintf(batch, sizeof(batch), "%zu", t->cfg.batch);
  snprintf(seed, sizeof(seed), "%" PRIu64, t->cfg.seed);
  snprintf(lr, sizeof(lr), "%.9g", t->last_lr);
  size_t m = 0;
  meta[m++] = (st_meta_kv_t){"format", CHECKPOINT_FORMAT};
  meta[m++] = (st_meta_kv_t){"model", model};
  meta[m++] = (st_meta_kv_t){"optimizer", st_opt_kind_name(t->cfg.opt.kind)};
  meta[m++] = (st_meta_kv_t){"batch", batch};
  meta[m++] = (st_meta_kv_t){"seed", seed};
  meta[m++] = (st_meta_kv_t){"shard", shard};
  meta[m++] = (st_meta_kv_t){"step", step};
  meta[m++] = (st_meta_kv_t){"epoch", epoch};
  meta[m++] = (st_meta_kv_t){"pos", pos};
  meta[m++] = (st_meta_kv_t){"optimizer_step", opt_t};
  meta[m++] = (st_meta_kv_t){"lr", lr};
  meta[m++] = (st_meta_kv_t){"schedule", st_sched_kind_name(t->cfg.sched.kind)};
  for (size_t i = 0; i < n_extra; i++)
    meta[m++] = extra[i];
  rc = st_safetensors_write(path, tensors, k, meta, m, err, err_len);
done:
  free(host);
  free(tensors);
  free(names);
  free(meta);
  return rc;
}

/* ---- Load
 * ------------------------------------------------------------------------ */

static int meta_u64(const st_safetensors_t* st, const char* key,
                    uint64_t* out) {
  const char* v = st_safetensors_meta(st, key);
  if (v == NULL || *v < '0' || *v > '9')
    return -EINVAL;
  char* end;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 10);
  if (errno != 0 || *end != '\0')
    return -EINVAL;
  *out = x;
  return 0;
}

/* Compares one metadata value with what this run was configured with. */
static int expect_meta(const st_safetensors_t* st, const char* path,
                       const char* key, const char* want, const char* flag,
                       char* err, size_t err_len) {
  const char* got = st_safetensors_meta(st, key);
  if (got == NULL) {
    st_set_err(err, err_len,
               "%s: not a starling checkpoint (no '%s' in its "
               "metadata)",
               path, key);
    return -EINVAL;
  }
  if (strcmp(got, want) != 0) {
    st_set_err(err, err_len,
               "%s was written with %s %s but this run has %s %s; "
               "resume with the same %s",
               path, flag, got, flag, want, flag);
    return -EINVAL;
  }
  return 0;
}

/* Checks that the checkpoint was written by a run of this configuration:
 * format, model, optimizer, batch, seed and shard. model: the formatted
 * model spec. */
static int check_run_meta(const st_trainer_t* t, const st_safetensors_t* st,
                          const char* path, const char* model, char* err,
                          size_t err_len) {
  char shard[48], batch[32], seed[32];
  int rc;
  shard_text(&t->cfg, shard, sizeof(shard));
  snprintf(batch, sizeof(batch), "%zu", t->cfg.batch);
  snprintf(seed, sizeof(seed), "%" PRIu64, t->cfg.seed);
  if ((rc = expect_meta(st, path, "format", CHECKPOINT_FORMAT, "format", err,
                        err_len)) ||
      (rc = expect_meta(st, path, "model", model, "--model", err, err_len)) ||
      (rc =
           expect_meta(st, path, "optimizer", st_opt_kind_name(t->cfg.opt.kind),
                       "--optimizer", err, err_len)) ||
      (rc = expect_meta(st, path, "batch", batch, "--batch", err, err_len)) ||
      (rc = expect_meta(st, path, "seed", seed, "--seed", err, err_len)) ||
      (rc = expect_meta(st, path, "shard", shard, "--shard", err, err_len)))
    return rc;
  return 0;
}

/* Checks the tensors of one state buffer (names starting with prefix)
 * and copies them into host, laid out as the flat buffer. */
static int load_buffer(const st_trainer_t* t, const st_safetensors_t* st,
                       const char* path, const char* prefix, const char* model,
                       float* host, char* err, size_t err_len) {
  for (int l = 0; l < t->cfg.model.n_layers; l++) {
    size_t in = t->cfg.model.sizes[l], out = t->cfg.model.sizes[l + 1];
    for (int is_bias = 0; is_bias < 2; is_bias++) {
      char name[NAME_LEN];
      snprintf(name, sizeof(name), "%slayers.%d.%s", prefix, l,
               is_bias ? "bias" : "weight");
      size_t shape[ST_SAFETENSORS_MAX_DIMS], count;
      int ndim;
      const float* data = st_safetensors_tensor(st, name, &count, shape, &ndim);
      int ok = data != NULL &&
               (is_bias ? (ndim == 1 && shape[0] == out)
                        : (ndim == 2 && shape[0] == out && shape[1] == in));
      if (!ok) {
        st_set_err(err, err_len,
                   "%s: tensor %s is missing or has the wrong "
                   "shape for model %s",
                   path, name, model);
        return -EINVAL;
      }
      float* dst = host + (is_bias ? t->model.b_off[l] : t->model.w_off[l]);
      for (size_t i = 0; i < count; i++) {
        if (!isfinite(data[i])) {
          st_set_err(err, err_len,
                     "%s: tensor %s holds a NaN or infinite "
                     "value at index %zu; the checkpoint is unusable",
                     path, name, i);
          return -EINVAL;
        }
      }
      memcpy(dst, data, count * sizeof(float));
    }
  }
  return 0;
}

int st_trainer_load(st_trainer_t* t, const char* path, char* err,
                    size_t err_len) {
  st_safetensors_t* st = NULL;
  float* host = NULL;
  int rc = st_safetensors_read(path, &st, err, err_len);
  if (rc != 0)
    return rc;

  char model[256];
  st_model_spec_format(&t->cfg.model, model, sizeof(model));
  rc = check_run_meta(t, st, path, model, err, err_len);
  if (rc != 0)
    goto done;

  uint64_t step, epoch, pos, opt_t;
  if (meta_u64(st, "step", &step) || meta_u64(st, "epoch", &epoch) ||
      meta_u64(st, "pos", &pos) || meta_u64(st, "optimizer_step", &opt_t) ||
      pos >= t->steps_per_epoch || step != epoch * t->steps_per_epoch + pos) {
    st_set_err(err, err_len,
               "%s: its position (step, epoch, pos metadata) is "
               "missing or inconsistent with %zu steps per epoch",
               path, t->steps_per_epoch);
    rc = -EINVAL;
    goto done;
  }

  state_buf_t bufs[MAX_STATE];
  int nbufs = state_buffers(t, bufs);
  size_t n = t->model.n_params;
  host = malloc((n ? n : 1) * sizeof(float));
  if (host == NULL) {
    rc = -ENOMEM;
    goto done;
  }
  /* Validate everything into host memory first; the device buffers change
   * only after every tensor has passed (one buffer at a time, but a failure
   * in buffer b leaves the trainer in need of a reset: report it). */
  for (int b = 0; b < nbufs; b++) {
    rc = load_buffer(t, st, path, bufs[b].prefix, model, host, err, err_len);
    if (rc != 0)
      goto done;
    rc = st_copy_to_device(t->be, bufs[b].device, host, n);
    if (rc != 0) {
      st_set_err(err, err_len, "%s: cannot copy the checkpoint to %s: %s", path,
                 st_backend_describe(t->be), st_backend_last_error(t->be));
      goto done;
    }
  }
  t->step = step;
  t->epoch = epoch;
  t->pos = (size_t) pos;
  t->optim.t = opt_t;
  st_epoch_order(t->shard, t->shard_count, t->cfg.seed, t->epoch, t->order);
  rc = 0;
done:
  free(host);
  st_safetensors_free(st);
  return rc;
}
