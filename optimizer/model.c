/* model.c: dense-layer models over one flat parameter buffer.
 *
 * An MLP, softmax regression and linear regression are all a stack of dense
 * layers y = act(x W^T + b) with a loss head; only the head and the number
 * of layers differ (see optimizer.h). Parameters live in one flat device
 * buffer laid out W0, b0, W1, b1, ... with W_l of shape out_l x in_l
 * (row-major, PyTorch's nn.Linear layout), and gradients in a second buffer
 * with the same layout, so that averaging and checkpoints see one vector.
 *
 * Shapes, for a batch of B rows: acts[0] is B x sizes[0] (the input),
 * acts[l+1] is B x sizes[l+1] (layer l's output after its activation; the
 * last one holds the logits or predictions).
 */
#include "optimizer/optimizer.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Sizes above 2^24 could not be label indices stored as float and are far
 * beyond anything a dense layer here is meant for. */
#define MAX_LAYER_SIZE (1u << 24)

/* ---- Specs --------------------------------------------------------------- */

/* What a model spec looks like, for the messages below. */
static const char spec_usage[] =
    "use mlp:IN-H1-...-OUT, softmax:IN-OUT or linear:IN-1, e.g. "
    "mlp:784-256-128-10";

/* Parses the layer sizes of text, p: after its colon, "IN-H1-...-OUT",
 * into spec->sizes and spec->n_layers. */
static int parse_sizes(const char* text, const char* p, st_model_spec_t* spec,
                       char* err, size_t err_len) {
  size_t count = 0;
  for (;;) {
    if (*p < '0' || *p > '9') {
      st_set_err(err, err_len, "model '%s': expected a layer size; %s", text,
                 spec_usage);
      return -EINVAL;
    }
    unsigned long long v = 0;
    while (*p >= '0' && *p <= '9') {
      v = v * 10 + (unsigned long long) (*p - '0');
      if (v > MAX_LAYER_SIZE)
        break;
      p++;
    }
    if (v == 0 || v > MAX_LAYER_SIZE) {
      st_set_err(err, err_len,
                 "model '%s': layer sizes must be between 1 and %u", text,
                 MAX_LAYER_SIZE);
      return -EINVAL;
    }
    if (count > ST_MODEL_MAX_LAYERS) {
      st_set_err(err, err_len, "model '%s': more than %d layers", text,
                 ST_MODEL_MAX_LAYERS);
      return -EINVAL;
    }
    spec->sizes[count++] = (size_t) v;
    if (*p == '\0')
      break;
    if (*p != '-') {
      st_set_err(err, err_len, "model '%s': unexpected character; %s", text,
                 spec_usage);
      return -EINVAL;
    }
    p++;
  }
  if (count < 2) {
    st_set_err(err, err_len,
               "model '%s' needs at least an input and an output "
               "size; %s",
               text, spec_usage);
    return -EINVAL;
  }
  spec->n_layers = (int) count - 1;
  return 0;
}

/* Checks that the number of layers and outputs suit spec->kind. */
static int check_kind_shape(const char* text, const st_model_spec_t* spec,
                            char* err, size_t err_len) {
  size_t out = spec->sizes[spec->n_layers];
  switch (spec->kind) {
    case ST_MODEL_MLP:
      if (spec->n_layers < 2 || out < 2) {
        st_set_err(err, err_len,
                   "model '%s': an mlp needs at least one hidden "
                   "layer and 2 or more outputs (for no hidden layer use "
                   "softmax:IN-OUT)",
                   text);
        return -EINVAL;
      }
      break;
    case ST_MODEL_SOFTMAX:
      if (spec->n_layers != 1 || out < 2) {
        st_set_err(err, err_len,
                   "model '%s': softmax takes exactly two sizes, "
                   "IN-OUT, with 2 or more outputs",
                   text);
        return -EINVAL;
      }
      break;
    case ST_MODEL_LINEAR:
      if (spec->n_layers != 1 || out != 1) {
        st_set_err(err, err_len,
                   "model '%s': linear regression takes exactly "
                   "IN-1",
                   text);
        return -EINVAL;
      }
      break;
  }
  return 0;
}

int st_model_spec_parse(const char* text, st_model_spec_t* spec, char* err,
                        size_t err_len) {
  memset(spec, 0, sizeof(*spec));
  const char* colon = strchr(text, ':');
  if (colon == NULL) {
    st_set_err(err, err_len, "model '%s' has no kind: %s", text, spec_usage);
    return -EINVAL;
  }
  size_t kind_len = (size_t) (colon - text);
  if (kind_len == 3 && strncmp(text, "mlp", 3) == 0)
    spec->kind = ST_MODEL_MLP;
  else if (kind_len == 7 && strncmp(text, "softmax", 7) == 0)
    spec->kind = ST_MODEL_SOFTMAX;
  else if (kind_len == 6 && strncmp(text, "linear", 6) == 0)
    spec->kind = ST_MODEL_LINEAR;
  else {
    st_set_err(err, err_len, "model '%s': unknown kind; %s", text, spec_usage);
    return -EINVAL;
  }

  int rc = parse_sizes(text, colon + 1, spec, err, err_len);
  if (rc != 0)
    return rc;
  return check_kind_shape(text, spec, err, err_len);
}

int st_model_spec_format(const st_model_spec_t* spec, char* buf, size_t len) {
  static const char* kinds[] = {"mlp", "softmax", "linear"};
  size_t used = (size_t) snprintf(buf, len, "%s:", kinds[spec->kind]);
  for (int i = 0; i <= spec->n_layers && used < len; i++)
    used += (size_t) snprintf(buf + used, len - used, i ? "-%zu" : "%zu",
                              spec->sizes[i]);
  return used < len ? 0 : -ENOSPC;
}

size_t st_model_spec_param_count(const st_model_spec_t* spec) {
  size_t n = 0;
  for (int l = 0; l < spec->n_layers; l++)
    n += spec->sizes[l + 1] * spec->sizes[l] + spec->sizes[l + 1];
  return n;
}

size_t st_model_spec_classes(const st_model_spec_t* spec) {
  return spec->kind == ST_MODEL_LINEAR ? 0 : spec->sizes[spec->n_layers];
}

/* ---- Lifetime
 * ------------------------------------------------------------------ */

int st_model_reset_params(st_model_t* m, uint64_t seed) {
  /* On the CPU the parameters are host memory: written where they are (a
   * staging copy of the model would stay in the process's heap). */
  bool on_host = st_backend_kind(m->be) == ST_BACKEND_CPU;
  float* host = on_host
                    ? m->params
                    : malloc((m->n_params ? m->n_params : 1) * sizeof(float));
  if (host == NULL)
    return -ENOMEM;
  /* PyTorch's nn.Linear default: kaiming_uniform with a = sqrt(5), which
   * is U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights, and the same bound
   * for biases. One generator over the flat buffer, in layout order, so
   * the values depend only on (spec, seed). */
  st_rng_t rng;
  st_rng_seed(&rng, seed);
  for (int l = 0; l < m->spec.n_layers; l++) {
    size_t in = m->spec.sizes[l], out = m->spec.sizes[l + 1];
    float bound = (float) (1.0 / sqrt((double) in));
    float* w = host + m->w_off[l];
    for (size_t i = 0; i < out * in; i++)
      w[i] = bound * (float) (2.0 * st_rng_uniform(&rng) - 1.0);
    float* b = host + m->b_off[l];
    for (size_t i = 0; i < out; i++)
      b[i] = bound * (float) (2.0 * st_rng_uniform(&rng) - 1.0);
  }
  if (on_host)
    return 0;
  int rc = st_copy_to_device(m->be, m->params, host, m->n_params);
  free(host);
  return rc;
}

void st_model_close(st_model_t* m) {
  if (m->be == NULL)
    return;
  st_buf_free(m->be, m->params);
  st_buf_free(m->be, m->grads);
  for (int l = 0; l <= ST_MODEL_MAX_LAYERS; l++)
    st_buf_free(m->be, m->acts[l]);
  st_buf_free(m->be, m->dact);
  st_buf_free(m->be, m->dact2);
  st_buf_free(m->be, m->targets);
  st_buf_free(m->be, m->row_loss);
  memset(m, 0, sizeof(*m));
}

int st_model_init(st_model_t* m, st_backend_t* be, const st_model_spec_t* spec,
                  size_t max_batch, uint64_t seed) {
  memset(m, 0, sizeof(*m));
  if (max_batch == 0 || spec->n_layers < 1 ||
      spec->n_layers > ST_MODEL_MAX_LAYERS)
    return -EINVAL;
  m->be = be;
  m->spec = *spec;
  m->max_batch = max_batch;
  size_t off = 0, widest = 0;
  for (int l = 0; l < spec->n_layers; l++) {
    m->w_off[l] = off;
    off += spec->sizes[l + 1] * spec->sizes[l];
    m->b_off[l] = off;
    off += spec->sizes[l + 1];
  }
  m->n_params = off;
  for (int l = 0; l <= spec->n_layers; l++)
    if (spec->sizes[l] > widest)
      widest = spec->sizes[l];

  int rc = st_buf_alloc(be, m->n_params, &m->params);
  if (rc == 0)
    rc = st_buf_alloc(be, m->n_params, &m->grads);
  for (int l = 0; rc == 0 && l <= spec->n_layers; l++)
    rc = st_buf_alloc(be, max_batch * spec->sizes[l], &m->acts[l]);
  if (rc == 0)
    rc = st_buf_alloc(be, max_batch * widest, &m->dact);
  if (rc == 0)
    rc = st_buf_alloc(be, max_batch * widest, &m->dact2);
  if (rc == 0)
    rc = st_buf_alloc(be, max_batch, &m->targets);
  if (rc == 0)
    rc = st_buf_alloc(be, max_batch, &m->row_loss);
  if (rc == 0)
    rc = st_model_reset_params(m, seed);
  if (rc != 0)
    st_model_close(m);
  return rc;
}

float* st_model_input(st_model_t* m) {
  return m->acts[0];
}

float* st_model_targets(st_model_t* m) {
  return m->targets;
}

/* ---- Passes
 * ---------------------------------------------------------------------- */

/* acts[l+1] = act(acts[l] W_l^T + b_l) for every layer; ReLU between layers,
 * none after the last. */
static int forward(st_model_t* m, size_t rows) {
  const st_model_spec_t* s = &m->spec;
  for (int l = 0; l < s->n_layers; l++) {
    size_t in = s->sizes[l], out = s->sizes[l + 1];
    int rc = st_gemm(m->be, 0, 1, rows, out, in, 1.0f, m->acts[l], in,
                     m->params + m->w_off[l], in, 0.0f, m->acts[l + 1], out);
    if (rc != 0)
      return rc;
    st_act_t act = (l + 1 < s->n_layers) ? ST_ACT_RELU : ST_ACT_NONE;
    rc = st_bias_act_forward(m->be, m->acts[l + 1], m->params + m->b_off[l],
                             rows, out, act);
    if (rc != 0)
      return rc;
  }
  return 0;
}

int st_model_step(st_model_t* m, size_t rows, double* loss) {
  return st_model_step_hooked(m, rows, loss, NULL, NULL);
}

int st_model_step_hooked(st_model_t* m, size_t rows, double* loss,
                         void (*layer_done)(void* arg, int layer), void* arg) {
  if (rows == 0 || rows > m->max_batch)
    return -EINVAL;
  const st_model_spec_t* s = &m->spec;
  int L = s->n_layers;
  int rc = forward(m, rows);
  if (rc != 0)
    return rc;

  /* Loss head: delta = d(mean loss)/d(output), B x sizes[L], in dact. */
  float scale = 1.0f / (float) rows;
  if (s->kind == ST_MODEL_LINEAR) {
    rc = st_mse_forward_backward(m->be, m->acts[L], m->targets, rows,
                                 m->row_loss, m->dact, scale);
  } else {
    rc = st_softmax_xent_forward(m->be, m->acts[L], m->targets, rows,
                                 s->sizes[L], m->dact, m->row_loss);
    if (rc == 0)
      rc = st_softmax_xent_backward(m->be, m->dact, m->dact, m->targets, rows,
                                    s->sizes[L], scale);
  }
  if (rc != 0)
    return rc;

  /* Backward through the layers: for layer l with input X (B x in) and
   * output delta D (B x out): dW = D^T X (out x in), db = column sums of D,
   * dX = D W (B x in), masked by ReLU's derivative at the layer below. */
  float* delta = m->dact;
  float* next = m->dact2;
  for (int l = L - 1; l >= 0; l--) {
    size_t in = s->sizes[l], out = s->sizes[l + 1];
    rc = st_gemm(m->be, 1, 0, out, in, rows, 1.0f, delta, out, m->acts[l], in,
                 0.0f, m->grads + m->w_off[l], in);
    if (rc == 0)
      rc = st_bias_grad(m->be, m->grads + m->b_off[l], delta, rows, out);
    if (rc == 0 && layer_done != NULL)
      layer_done(arg, l);
    if (rc == 0 && l > 0) {
      rc = st_gemm(m->be, 0, 0, rows, in, out, 1.0f, delta, out,
                   m->params + m->w_off[l], in, 0.0f, next, in);
      if (rc == 0)
        rc = st_act_backward(m->be, next, m->acts[l], rows * in, ST_ACT_RELU);
      float* t = delta;
      delta = next;
      next = t;
    }
    if (rc != 0)
      return rc;
  }

  if (loss != NULL) {
    double sum = 0;
    rc = st_sum(m->be, m->row_loss, rows, &sum);
    if (rc != 0)
      return rc;
    *loss = sum / (double) rows;
  }
  return 0;
}

int st_model_eval(st_model_t* m, size_t rows, double* loss_sum,
                  size_t* correct) {
  if (rows == 0 || rows > m->max_batch)
    return -EINVAL;
  const st_model_spec_t* s = &m->spec;
  int L = s->n_layers;
  int rc = forward(m, rows);
  if (rc != 0)
    return rc;
  if (s->kind == ST_MODEL_LINEAR) {
    rc = st_mse_forward_backward(m->be, m->acts[L], m->targets, rows,
                                 m->row_loss, NULL, 1.0f);
  } else {
    rc = st_softmax_xent_forward(m->be, m->acts[L], m->targets, rows,
                                 s->sizes[L], m->dact, m->row_loss);
    if (rc == 0 && correct != NULL) {
      size_t c = 0;
      rc = st_argmax_correct(m->be, m->acts[L], m->targets, rows, s->sizes[L],
                             &c);
      *correct += c;
    }
  }
  if (rc != 0)
    return rc;
  if (loss_sum != NULL) {
    double sum = 0;
    rc = st_sum(m->be, m->row_loss, rows, &sum);
    if (rc != 0)
      return rc;
    *loss_sum += sum;
  }
  return 0;
}
