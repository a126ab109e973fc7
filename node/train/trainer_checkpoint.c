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
 * tensors are written in buffer order and the file's data section starts
 * with the flat buffer itself.
 *
 * So that the file alone is a usable model (saved_model.c, and PyTorch:
 * docs/training.md), it also holds the input transform of the training
 * data, "normalize.mean" and "normalize.std" (the float32 values
 * st_data_open applied: shape [1] for one scalar, [inputs] per feature;
 * 0 and 1 when the data was not normalized), after every other tensor, and
 * metadata describing the model's use: "architecture" (the layers in
 * PyTorch's words), "classes", "input_shape" ("28,28"), "input_scale" (the
 * divisor the loader applied to raw values before normalizing: 255 for
 * IDX bytes) and "normalize" ("scalar", "per-feature" or "none").
 */
#include "node/train/train.h"
#include "node/train/train_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECKPOINT_FORMAT ST__CHECKPOINT_FORMAT
#define MAX_STATE 3 /* params + up to two optimizer buffers */
#define NAME_LEN 96
#define N_NORM_TENSORS 2 /* normalize.mean, normalize.std */
#define N_OWN_META 17    /* metadata entries st_trainer_save writes itself */

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

/* The metadata texts of one checkpoint, formatted before they are listed. */
typedef struct {
  char model[256], shard[48], step[32], epoch[32], pos[32], opt_t[32],
      batch[32], seed[32], lr[48];
  char arch[ST_MODEL_MAX_LAYERS * 40], classes[32], shape[160], scale[40];
  float identity[2]; /* mean 0 and std 1 when the data is not normalized */
} meta_text_t;

/* "Linear(784, 256), ReLU, Linear(256, 10)": the model as PyTorch layers. */
static void architecture_text(const st_model_spec_t* m, char* buf, size_t len) {
  size_t at = 0;
  buf[0] = '\0';
  for (int l = 0; l < m->n_layers && at < len; l++)
    at += (size_t) snprintf(buf + at, len - at, "%sLinear(%zu, %zu)%s",
                            l ? ", " : "", m->sizes[l], m->sizes[l + 1],
                            l + 1 < m->n_layers ? ", ReLU" : "");
}

/* The metadata and tensors that make the file usable on its own: the
 * training data's input shape, scale and normalization. Adds the two
 * normalize.* tensors at tensors[*k] and the entries at meta[*m]. */
static void input_description(const st_trainer_t* t, meta_text_t* x,
                              st_tensor_desc_t* tensors, size_t* k,
                              st_meta_kv_t* meta, size_t* m) {
  const st_dataset_t* ds = t->train;
  architecture_text(&t->cfg.model, x->arch, sizeof(x->arch));
  size_t classes =
      ds->n_classes ? ds->n_classes : st_model_spec_classes(&t->cfg.model);
  snprintf(x->classes, sizeof(x->classes), "%zu", classes);
  size_t at = 0;
  if (ds->shape_ndim == 0)
    snprintf(x->shape, sizeof(x->shape), "%zu", ds->dim);
  for (int i = 0; i < ds->shape_ndim && at < sizeof(x->shape); i++)
    at += (size_t) snprintf(x->shape + at, sizeof(x->shape) - at, "%s%zu",
                            i ? "," : "", ds->shape[i]);
  snprintf(x->scale, sizeof(x->scale), "%.17g",
           ds->input_scale > 0 ? ds->input_scale : 1.0);
  x->identity[0] = 0.0f;
  x->identity[1] = 1.0f;
  size_t len = ds->norm_len ? ds->norm_len : 1;
  const float* mean = ds->norm_len ? ds->norm_mean : &x->identity[0];
  const float* std = ds->norm_len ? ds->norm_std : &x->identity[1];
  tensors[(*k)++] = (st_tensor_desc_t){"normalize.mean", mean, {len}, 1};
  tensors[(*k)++] = (st_tensor_desc_t){"normalize.std", std, {len}, 1};
  meta[(*m)++] = (st_meta_kv_t){"architecture", x->arch};
  meta[(*m)++] = (st_meta_kv_t){"classes", x->classes};
  meta[(*m)++] = (st_meta_kv_t){"input_shape", x->shape};
  meta[(*m)++] = (st_meta_kv_t){"input_scale", x->scale};
  meta[(*m)++] =
      (st_meta_kv_t){"normalize", ds->norm_len == 0   ? "none"
                                  : ds->norm_len == 1 ? "scalar"
                                                      : "per-feature"};
}

/* The metadata of the run: what must match to resume, and where it is. */
static void run_description(const st_trainer_t* t, meta_text_t* x,
                            st_meta_kv_t* meta, size_t* m) {
  st_model_spec_format(&t->cfg.model, x->model, sizeof(x->model));
  shard_text(&t->cfg, x->shard, sizeof(x->shard));
  snprintf(x->step, sizeof(x->step), "%" PRIu64, t->step);
  snprintf(x->epoch, sizeof(x->epoch), "%" PRIu64, t->epoch);
  snprintf(x->pos, sizeof(x->pos), "%zu", t->pos);
  snprintf(x->opt_t, sizeof(x->opt_t), "%" PRIu64, t->optim.t);
  snprintf(x->batch, sizeof(x->batch), "%zu", t->cfg.batch);
  snprintf(x->seed, sizeof(x->seed), "%" PRIu64, t->cfg.seed);
  snprintf(x->lr, sizeof(x->lr), "%.9g", t->last_lr);
  meta[(*m)++] = (st_meta_kv_t){"format", CHECKPOINT_FORMAT};
  meta[(*m)++] = (st_meta_kv_t){"model", x->model};
  meta[(*m)++] = (st_meta_kv_t){"optimizer", st_opt_kind_name(t->cfg.opt.kind)};
  meta[(*m)++] = (st_meta_kv_t){"batch", x->batch};
  meta[(*m)++] = (st_meta_kv_t){"seed", x->seed};
  meta[(*m)++] = (st_meta_kv_t){"shard", x->shard};
  meta[(*m)++] = (st_meta_kv_t){"step", x->step};
  meta[(*m)++] = (st_meta_kv_t){"epoch", x->epoch};
  meta[(*m)++] = (st_meta_kv_t){"pos", x->pos};
  meta[(*m)++] = (st_meta_kv_t){"optimizer_step", x->opt_t};
  meta[(*m)++] = (st_meta_kv_t){"lr", x->lr};
  meta[(*m)++] =
      (st_meta_kv_t){"schedule", st_sched_kind_name(t->cfg.sched.kind)};
}

int st_trainer_save(st_trainer_t* t, const char* path,
                    const st_meta_kv_t* extra, size_t n_extra, char* err,
                    size_t err_len) {
  state_buf_t bufs[MAX_STATE];
  int nbufs = state_buffers(t, bufs);
  int L = t->cfg.model.n_layers;
  size_t n = t->model.n_params;
  size_t n_tensors = (size_t) nbufs * 2 * (size_t) L + N_NORM_TENSORS;
  /* On the CPU the buffers are host memory, written from where they are
   * (this runs on the trainer's thread, between steps): no copy of the
   * model and its optimizer state (2x the model with momentum) at every
   * checkpoint. A device's go through one host copy. */
  bool on_host = st_backend_kind(t->be) == ST_BACKEND_CPU;
  float* host =
      on_host ? NULL : malloc((size_t) nbufs * (n ? n : 1) * sizeof(float));
  st_tensor_desc_t* tensors = calloc(n_tensors, sizeof(*tensors));
  char(*names)[NAME_LEN] = calloc(n_tensors, NAME_LEN);
  st_meta_kv_t* meta = calloc(N_OWN_META + n_extra, sizeof(*meta));
  meta_text_t* text = malloc(sizeof(*text));
  int rc = -ENOMEM;
  if ((!on_host && host == NULL) || tensors == NULL || names == NULL ||
      meta == NULL || text == NULL) {
    st_set_err(err, err_len, "%s: out of memory writing the checkpoint", path);
    goto done;
  }
  size_t k = 0;
  for (int b = 0; b < nbufs; b++) {
    float* h = on_host ? bufs[b].device : host + (size_t) b * n;
    rc = on_host ? 0 : st_copy_to_host(t->be, h, bufs[b].device, n);
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
  size_t m = 0;
  run_description(t, text, meta, &m);
  input_description(t, text, tensors, &k, meta, &m);
  for (size_t i = 0; i < n_extra; i++)
    meta[m++] = extra[i];
  rc = st_safetensors_write(path, tensors, k, meta, m, err, err_len);
done:
  free(host);
  free(tensors);
  free(names);
  free(meta);
  free(text);
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

int st__load_model_tensors(const st_model_t* mdl, const st_safetensors_t* st,
                           const char* path, const char* prefix,
                           const char* model, float* host, char* err,
                           size_t err_len) {
  for (int l = 0; l < mdl->spec.n_layers; l++) {
    size_t in = mdl->spec.sizes[l], out = mdl->spec.sizes[l + 1];
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
      float* dst = host + (is_bias ? mdl->b_off[l] : mdl->w_off[l]);
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
    rc = st__load_model_tensors(&t->model, st, path, bufs[b].prefix, model,
                                host, err, err_len);
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
