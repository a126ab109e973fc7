/* saved_model.c: using the model of a checkpoint on its own, for
 * `starling eval` and `starling predict` (see train.h, "Using a
 * checkpoint's model").
 *
 * A checkpoint of st_trainer_save (trainer_checkpoint.c) holds the layers
 * ("layers.L.weight", out x in, and "layers.L.bias"), the training data's
 * input transform (raw values divided by the "input_scale" metadata, then
 * (x - normalize.mean) / normalize.std) and what the model expects
 * ("model", "input_shape", "classes"). Reading it is strict: every piece
 * is checked before the model is built, and a file that lacks some is
 * refused with the list of what is missing, so that nobody evaluates a
 * model on inputs it was not trained on. Evaluation runs in the trainer's
 * chunks (st__eval_rows) through the same st_model_eval, so its loss
 * and accuracy are those `starling train` reports for the same parameters.
 */
#include "node/train/train.h"
#include "node/train/train_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(ST_SAVED_MODEL_MAX_ROWS == ST__EVAL_BATCH_ROWS,
               "a saved model holds the largest evaluation chunk");

/* ---- Reading the description
 * ----------------------------------------------------------- */

/* Appends "what" to the comma-separated list of missing pieces. */
static void note_missing(char* list, size_t len, const char* what) {
  size_t at = strlen(list);
  snprintf(list + at, len - at, "%s%s", at ? ", " : "", what);
}

/* Parses a whole non-negative decimal number; -EINVAL when it is not one. */
static int parse_size(const char* text, size_t* out) {
  if (text == NULL || *text < '0' || *text > '9')
    return -EINVAL;
  char* end;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0' || v > SIZE_MAX)
    return -EINVAL;
  *out = (size_t) v;
  return 0;
}

/* "28,28" into sm->input_shape; its product must be the model's inputs. */
static int parse_shape(st_saved_model_t* sm, const char* text, char* err,
                       size_t err_len) {
  size_t product = 1;
  const char* p = text;
  sm->input_ndim = 0;
  for (;;) {
    char part[32];
    size_t n = strcspn(p, ",");
    size_t dim = 0;
    snprintf(part, sizeof(part), "%.*s", (int) (n < 31 ? n : 31), p);
    if (sm->input_ndim == ST_DATASET_MAX_SHAPE || n == 0 || n > 20 ||
        parse_size(part, &dim) != 0 || dim == 0)
      goto bad;
    sm->input_shape[sm->input_ndim++] = dim;
    product *= dim;
    if (p[n] == '\0')
      break;
    p += n + 1;
  }
  if (product == sm->inputs)
    return 0;
bad:
  st_set_err(err, err_len,
             "%s: its input_shape metadata '%s' is not a list of sizes whose "
             "product is the model's %zu inputs",
             sm->path, text, sm->inputs);
  return -EINVAL;
}

/* The checkpoint must be one of st_trainer_save, with a model spec. */
static int check_format(st_saved_model_t* sm, const st_safetensors_t* st,
                        char* err, size_t err_len) {
  const char* format = st_safetensors_meta(st, "format");
  const char* model = st_safetensors_meta(st, "model");
  if (format == NULL && st_safetensors_meta(st, "attach_model") != NULL) {
    st_set_err(err, err_len,
               "%s is the checkpoint of an attached program, whose model is "
               "the program's own: load it in PyTorch with "
               "starling.load_checkpoint",
               sm->path);
    return -EINVAL;
  }
  const char* why_not = NULL;
  if (format == NULL)
    why_not = "no 'format'";
  else if (strcmp(format, ST__CHECKPOINT_FORMAT) != 0)
    why_not = "another 'format' than " ST__CHECKPOINT_FORMAT;
  else if (model == NULL)
    why_not = "no 'model'";
  if (why_not != NULL) {
    st_set_err(err, err_len,
               "%s: not a starling checkpoint (its metadata has %s); write "
               "one with starling train or starling node",
               sm->path, why_not);
    return -EINVAL;
  }
  st_model_spec_t spec;
  char why[256];
  if (st_model_spec_parse(model, &spec, why, sizeof(why)) != 0) {
    st_set_err(err, err_len, "%s: its model '%s' is not usable: %s", sm->path,
               model, why);
    return -EINVAL;
  }
  sm->model.spec = spec;
  st_model_spec_format(&spec, sm->model_text, sizeof(sm->model_text));
  sm->inputs = spec.sizes[0];
  sm->outputs = spec.sizes[spec.n_layers];
  return 0;
}

/* The normalization tensors: both present, of one length, 1 or inputs. */
static int read_normalization(st_saved_model_t* sm, const st_safetensors_t* st,
                              char* err, size_t err_len) {
  size_t nm = 0, ns = 0, shm[ST_SAFETENSORS_MAX_DIMS],
         shs[ST_SAFETENSORS_MAX_DIMS];
  int dm = 0, ds = 0;
  const float* mean =
      st_safetensors_tensor(st, "normalize.mean", &nm, shm, &dm);
  const float* sd = st_safetensors_tensor(st, "normalize.std", &ns, shs, &ds);
  if (dm != 1 || ds != 1 || nm != ns || (nm != 1 && nm != sm->inputs)) {
    st_set_err(err, err_len,
               "%s: normalize.mean and normalize.std must be vectors of 1 or "
               "%zu values (the model's inputs); they hold %zu and %zu",
               sm->path, sm->inputs, nm, ns);
    return -EINVAL;
  }
  sm->norm_mean = malloc(nm * sizeof(float));
  sm->norm_std = malloc(nm * sizeof(float));
  if (sm->norm_mean == NULL || sm->norm_std == NULL) {
    st_set_err(err, err_len, "%s: out of memory", sm->path);
    return -ENOMEM;
  }
  memcpy(sm->norm_mean, mean, nm * sizeof(float));
  memcpy(sm->norm_std, sd, nm * sizeof(float));
  sm->norm_len = nm;
  for (size_t j = 0; j < nm; j++)
    if (!isfinite(mean[j]) || !isfinite(sd[j]) || !(sd[j] > 0)) {
      st_set_err(err, err_len,
                 "%s: normalize value %zu (mean %g, std %g) is not usable: "
                 "the std must be finite and positive",
                 sm->path, j, (double) mean[j], (double) sd[j]);
      return -EINVAL;
    }
  return 0;
}

/* Everything but the layers: what is missing is named all at once. */
static int read_description(st_saved_model_t* sm, const st_safetensors_t* st,
                            char* err, size_t err_len) {
  int rc = check_format(sm, st, err, err_len);
  if (rc != 0)
    return rc;
  static const char* const keys[] = {"classes", "input_shape", "input_scale"};
  static const char* const tensors[] = {"normalize.mean", "normalize.std"};
  char meta[128] = "", tens[128] = "";
  for (size_t i = 0; i < 3; i++)
    if (st_safetensors_meta(st, keys[i]) == NULL)
      note_missing(meta, sizeof(meta), keys[i]);
  for (size_t i = 0; i < 2; i++)
    if (st_safetensors_tensor(st, tensors[i], NULL, NULL, NULL) == NULL)
      note_missing(tens, sizeof(tens), tensors[i]);
  if (meta[0] != '\0' || tens[0] != '\0') {
    st_set_err(err, err_len,
               "%s: the checkpoint lacks %s%s%s%s%s, which a model needs to "
               "be used on its own (it was written by an older starling): "
               "train or resume with this starling to write a complete one",
               sm->path, meta[0] ? "the metadata " : "", meta,
               meta[0] && tens[0] ? " and " : "", tens[0] ? "the tensors " : "",
               tens);
    return -EINVAL;
  }
  const char* scale = st_safetensors_meta(st, "input_scale");
  char* end;
  sm->input_scale = strtod(scale, &end);
  if (parse_size(st_safetensors_meta(st, "classes"), &sm->classes) != 0 ||
      *end != '\0' || !(sm->input_scale > 0) || !isfinite(sm->input_scale) ||
      sm->classes > sm->outputs) {
    st_set_err(err, err_len,
               "%s: metadata classes '%s' or input_scale '%s' is not usable "
               "with model %s",
               sm->path, st_safetensors_meta(st, "classes"), scale,
               sm->model_text);
    return -EINVAL;
  }
  if (st_model_spec_classes(&sm->model.spec) == 0)
    sm->classes = 0;
  size_t step = 0;
  if (parse_size(st_safetensors_meta(st, "step"), &step) == 0)
    sm->step = step;
  rc = parse_shape(sm, st_safetensors_meta(st, "input_shape"), err, err_len);
  return rc != 0 ? rc : read_normalization(sm, st, err, err_len);
}

/* ---- Opening
 * ------------------------------------------------------------------- */

/* Builds the model on be and copies the checkpoint's layers into it. */
static int load_layers(st_saved_model_t* sm, st_backend_t* be,
                       const st_safetensors_t* st, char* err, size_t err_len) {
  st_model_spec_t spec = sm->model.spec;
  int rc = st_model_init(&sm->model, be, &spec, ST__EVAL_BATCH_ROWS, 1);
  if (rc != 0) {
    memset(&sm->model, 0, sizeof(sm->model));
    st_set_err(
        err, err_len, "%s: cannot allocate model %s on %s: %s", sm->path,
        sm->model_text, st_backend_describe(be),
        *st_backend_last_error(be) ? st_backend_last_error(be) : strerror(-rc));
    return rc;
  }
  size_t n = sm->model.n_params;
  float* host = malloc((n ? n : 1) * sizeof(float));
  if (host == NULL) {
    st_set_err(err, err_len, "%s: out of memory", sm->path);
    return -ENOMEM;
  }
  rc = st__load_model_tensors(&sm->model, st, sm->path, "", sm->model_text,
                              host, err, err_len);
  if (rc == 0) {
    rc = st_copy_to_device(be, sm->model.params, host, n);
    if (rc != 0)
      st_set_err(err, err_len, "%s: cannot copy the model to %s: %s", sm->path,
                 st_backend_describe(be), st_backend_last_error(be));
  }
  free(host);
  return rc;
}

int st_saved_model_open(st_saved_model_t* sm, st_backend_t* be,
                        const char* path, char* err, size_t err_len) {
  memset(sm, 0, sizeof(*sm));
  snprintf(sm->path, sizeof(sm->path), "%s", path);
  st_safetensors_t* st = NULL;
  int rc = st_safetensors_read(path, &st, err, err_len);
  if (rc == 0)
    rc = read_description(sm, st, err, err_len);
  if (rc == 0)
    rc = load_layers(sm, be, st, err, err_len);
  st_safetensors_free(st);
  if (rc != 0)
    st_saved_model_close(sm);
  return rc;
}

void st_saved_model_close(st_saved_model_t* sm) {
  if (sm == NULL)
    return;
  if (sm->model.be != NULL)
    st_model_close(&sm->model);
  free(sm->norm_mean);
  free(sm->norm_std);
  memset(sm, 0, sizeof(*sm));
}

/* ---- Using it
 * ------------------------------------------------------------------ */

int st_saved_model_prepare(const st_saved_model_t* sm, st_dataset_t* ds,
                           char* err, size_t err_len) {
  if (ds->dim != sm->inputs) {
    st_set_err(err, err_len,
               "%s has %zu features per example but the model of %s (%s) "
               "expects %zu inputs",
               ds->source, ds->dim, sm->path, sm->model_text, sm->inputs);
    return -EINVAL;
  }
  double from = ds->input_scale > 0 ? ds->input_scale : 1.0;
  if (from != sm->input_scale) {
    /* Back to the raw values (ds's loader divided by `from`), then divided
     * by what the training data's loader divided by. */
    int sparse = st_dataset_is_sparse(ds);
    size_t total = sparse ? ds->row_ptr[ds->n] : ds->n * ds->dim;
    float* v = sparse ? ds->val : ds->x;
    for (size_t i = 0; i < total; i++)
      v[i] = (float) ((double) v[i] * from / sm->input_scale);
    ds->input_scale = sm->input_scale;
  }
  /* Data that was not normalized (the identity, mean 0 and std 1: libsvm
   * sets, --no-normalize) is used as loaded, sparse or not; (x - 0) / 1 is
   * x to the bit anyway. */
  int identity = 1;
  for (size_t j = 0; j < sm->norm_len; j++)
    identity &= sm->norm_mean[j] == 0.0f && sm->norm_std[j] == 1.0f;
  if (identity)
    return 0;
  return st_dataset_normalize(ds, sm->norm_mean, sm->norm_std, sm->norm_len,
                              err, err_len);
}

/* The labels of ds must be ones the model can be scored on. */
static int check_labels(const st_saved_model_t* sm, const st_dataset_t* ds,
                        char* err, size_t err_len) {
  if (sm->classes == 0 && ds->n_classes != 0) {
    st_set_err(err, err_len,
               "model %s of %s is a regression model but %s holds class "
               "labels; load the CSV with --regression",
               sm->model_text, sm->path, ds->source);
    return -EINVAL;
  }
  if (sm->classes != 0 && ds->n_classes == 0) {
    st_set_err(err, err_len,
               "model %s of %s is a classifier but %s holds real-valued "
               "targets or no labels",
               sm->model_text, sm->path, ds->source);
    return -EINVAL;
  }
  if (ds->n_classes > sm->outputs) {
    st_set_err(
        err, err_len, "%s has %zu classes but model %s of %s has %zu outputs",
        ds->source, ds->n_classes, sm->model_text, sm->path, sm->outputs);
    return -EINVAL;
  }
  return 0;
}

/* Copies rows [start, start + rows) of ds into the model's input and
 * target buffers (targets 0 when with_targets is 0). */
static int load_rows(st_saved_model_t* sm, const st_dataset_t* ds, size_t start,
                     size_t rows, int with_targets) {
  st_backend_t* be = sm->model.be;
  int rc;
  if (st_dataset_is_sparse(ds)) { /* written out dense through the host */
    float* x = malloc(rows * ds->dim * sizeof(float));
    float* y = malloc(rows * sizeof(float));
    rc = x != NULL && y != NULL ? 0 : -ENOMEM;
    if (rc == 0) {
      st__dataset_rows(ds, start, rows, x, y);
      rc = st_copy_to_device(be, st_model_input(&sm->model), x, rows * ds->dim);
    }
    free(x);
    free(y);
  } else {
    rc = st_copy_to_device(be, st_model_input(&sm->model),
                           ds->x + start * ds->dim, rows * ds->dim);
  }
  if (rc == 0 && with_targets)
    rc = st_copy_to_device(be, st_model_targets(&sm->model), ds->y + start,
                           rows);
  if (rc == 0 && !with_targets) {
    static const float zeros[ST__EVAL_BATCH_ROWS];
    rc = st_copy_to_device(be, st_model_targets(&sm->model), zeros, rows);
  }
  return rc;
}

int st_saved_model_evaluate(st_saved_model_t* sm, const st_dataset_t* ds,
                            double* mean_loss, double* accuracy, char* err,
                            size_t err_len) {
  int rc = check_labels(sm, ds, err, err_len);
  if (rc != 0)
    return rc;
  if (ds->n == 0 || ds->dim != sm->inputs) {
    st_set_err(err, err_len, "%s: nothing to evaluate (%zu examples of %zu)",
               ds->source, ds->n, ds->dim);
    return -EINVAL;
  }
  double loss_sum = 0;
  size_t correct = 0;
  size_t chunk = st__eval_rows(&sm->model.spec); /* the trainer's */
  for (size_t start = 0; start < ds->n; start += chunk) {
    size_t rows = ds->n - start;
    if (rows > chunk)
      rows = chunk;
    if (st__rowwise_eval(&sm->model.spec, sm->model.be, ds)) {
      rc = st__rowwise_evaluate(&sm->model.spec, sm->model.params, ds, start,
                                rows, &loss_sum, &correct, NULL);
    } else {
      rc = load_rows(sm, ds, start, rows, 1);
      if (rc == 0)
        rc = st_model_eval(&sm->model, rows, &loss_sum, &correct);
    }
    if (rc != 0) {
      st_set_err(err, err_len, "evaluation failed on %s: %s",
                 st_backend_describe(sm->model.be),
                 st_backend_last_error(sm->model.be));
      return rc;
    }
  }
  *mean_loss = loss_sum / (double) ds->n;
  *accuracy = sm->classes ? (double) correct / (double) ds->n : NAN;
  return 0;
}

int st_saved_model_predict(st_saved_model_t* sm, const st_dataset_t* ds,
                           size_t start, size_t rows, float* out) {
  if (rows == 0 || rows > ST__EVAL_BATCH_ROWS || start > ds->n ||
      rows > ds->n - start || ds->dim != sm->inputs)
    return -EINVAL;
  if (st__rowwise_eval(&sm->model.spec, sm->model.be, ds))
    return st__rowwise_evaluate(&sm->model.spec, sm->model.params, ds, start,
                                rows, NULL, NULL, out);
  int rc = load_rows(sm, ds, start, rows, 0);
  if (rc == 0)
    rc = st_model_eval(&sm->model, rows, NULL, NULL);
  if (rc != 0)
    return rc;
  /* st_model_eval leaves the softmax of a classifier in dact and the
   * output of a regression model in the last activation. */
  int L = sm->model.spec.n_layers;
  const float* src = st_model_spec_classes(&sm->model.spec) ? sm->model.dact
                                                            : sm->model.acts[L];
  return st_copy_to_host(sm->model.be, out, src, rows * sm->outputs);
}
