/* optimizer.h: models, losses, optimizers and learning-rate schedules.
 *
 * A model is a stack of dense layers over ONE flat parameter buffer and ONE
 * flat gradient buffer of the same length (llm.c style): layer l's weight
 * (out x in, row-major) and bias (out) are views into them, laid out in
 * order W0, b0, W1, b1, ... . Averaging, checkpoints and transfers therefore
 * move one contiguous buffer.
 *
 * Three kinds share that structure (optimizer/model.c):
 *   mlp:D-H1-...-C   dense layers with ReLU between them, softmax
 *                    cross-entropy on the C outputs
 *   softmax:D-C      one dense layer, softmax cross-entropy (multinomial
 *                    logistic regression)
 *   linear:D-1       one dense layer, squared loss 0.5 (y - t)^2 (least
 *                    squares regression)
 * The loss of a batch is the mean over its rows.
 *
 * Initialization is deterministic from a seed (PyTorch's nn.Linear rule:
 * weights and biases uniform in +-1/sqrt(fan_in)), so nodes that share a
 * seed start bit-identical on every backend.
 *
 * Optimizers (optimizer/optim.c): SGD, momentum, Nesterov, AdamW, with
 * weight decay and gradient-norm clipping. Schedules (optimizer/schedule.c):
 * constant, step and cosine, each with optional linear warm-up.
 */
#ifndef STARLING_OPTIMIZER_H
#define STARLING_OPTIMIZER_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ==== Models ============================================================= */

#define ST_MODEL_MAX_LAYERS 16

typedef enum {
  ST_MODEL_MLP = 0,
  ST_MODEL_SOFTMAX = 1,
  ST_MODEL_LINEAR = 2
} st_model_kind_t;

typedef struct {
  st_model_kind_t kind;
  int n_layers;                          /* dense layers, >= 1 */
  size_t sizes[ST_MODEL_MAX_LAYERS + 1]; /* sizes[0] = inputs, ...,
                                            sizes[n_layers] = outputs */
} st_model_spec_t;

/* Parses "mlp:784-256-128-10", "softmax:784-10" or "linear:13-1". Every
 * size must be in [1, 2^24]; mlp needs at least one hidden layer and >= 2
 * outputs, softmax exactly two sizes with >= 2 outputs, linear exactly two
 * sizes with 1 output. On failure writes what is wrong into err. */
int st_model_spec_parse(const char* text, st_model_spec_t* spec, char* err,
                        size_t err_len);
/* Writes the canonical text form ("mlp:784-256-128-10") into buf. */
int st_model_spec_format(const st_model_spec_t* spec, char* buf, size_t len);
/* Number of parameters of the model the spec describes. */
size_t st_model_spec_param_count(const st_model_spec_t* spec);
/* Number of classes (outputs) for classifiers, 0 for linear regression. */
size_t st_model_spec_classes(const st_model_spec_t* spec);

typedef struct {
  st_backend_t* be; /* borrowed; outlives the model */
  st_model_spec_t spec;
  size_t n_params;
  float* params;                     /* device, n_params; owned */
  float* grads;                      /* device, n_params; owned */
  size_t w_off[ST_MODEL_MAX_LAYERS]; /* offsets of W_l and b_l in params */
  size_t b_off[ST_MODEL_MAX_LAYERS];
  size_t max_batch;
  /* Workspace on the device, sized for max_batch rows. */
  float* acts[ST_MODEL_MAX_LAYERS + 1]; /* acts[0] = input batch,
                                           acts[l+1] = output of layer l */
  float* dact; /* max_batch x max layer width: backprop scratch */
  float* dact2;
  float* targets;  /* max_batch */
  float* row_loss; /* max_batch */
} st_model_t;

/* Allocates the model on `be` for batches of up to max_batch rows and
 * initializes its parameters from `seed`. */
int st_model_init(st_model_t* m, st_backend_t* be, const st_model_spec_t* spec,
                  size_t max_batch, uint64_t seed);
void st_model_close(st_model_t* m);

/* Re-draws the parameters from `seed` (the same values st_model_init gives). */
int st_model_reset_params(st_model_t* m, uint64_t seed);

/* The input and target buffers for the next batch (device memory owned by
 * the model): fill them with st_copy_to_device before st_model_step /
 * st_model_eval. Input is rows x sizes[0]; targets are rows floats. */
float* st_model_input(st_model_t* m);
float* st_model_targets(st_model_t* m);

/* Forward and backward pass over the first `rows` rows of the input
 * buffer: overwrites m->grads with the gradient of the mean loss and writes
 * the mean loss into *loss (may be NULL: then no reduction, no sync).
 * 1 <= rows <= max_batch. */
int st_model_step(st_model_t* m, size_t rows, double* loss);

/* Forward pass only: adds the batch's summed loss to *loss_sum and, for
 * classifiers, its number of correct predictions to *correct. */
int st_model_eval(st_model_t* m, size_t rows, double* loss_sum,
                  size_t* correct);

/* ==== Optimizers =============================================================
 */

typedef enum {
  ST_OPT_SGD = 0,
  ST_OPT_MOMENTUM = 1,
  ST_OPT_NESTEROV = 2,
  ST_OPT_ADAMW = 3
} st_opt_kind_t;

typedef struct {
  st_opt_kind_t kind;
  float momentum;     /* mu for momentum / Nesterov */
  float beta1, beta2; /* AdamW */
  float eps;          /* AdamW */
  float weight_decay; /* L2 (SGD family) or decoupled (AdamW) */
  float clip_norm;    /* > 0: scale gradients so that their L2 norm is at
                         most this; 0: no clipping */
} st_opt_config_t;

/* Defaults: SGD, momentum 0.9, betas 0.9/0.999, eps 1e-8, no decay, no
 * clipping. */
void st_opt_config_default(st_opt_config_t* cfg);
/* Parses "sgd", "momentum", "nesterov", "adamw". */
int st_opt_kind_parse(const char* s, st_opt_kind_t* kind);
const char* st_opt_kind_name(st_opt_kind_t kind);

typedef struct {
  st_backend_t* be; /* borrowed */
  st_opt_config_t cfg;
  size_t n;
  float* m;   /* momentum velocity, or AdamW first moment; NULL for
                 SGD; device, owned */
  float* v;   /* AdamW second moment; NULL otherwise */
  uint64_t t; /* updates applied so far */
} st_optim_t;

int st_optim_init(st_optim_t* o, st_backend_t* be, const st_opt_config_t* cfg,
                  size_t n);
void st_optim_close(st_optim_t* o);

/* Applies one update to params (n floats, device) with gradient grads at
 * learning rate lr, clipping grads first when configured. Writes the
 * gradient's L2 norm before clipping into *grad_norm (may be NULL: then it
 * is computed only when clipping needs it). */
int st_optim_step(st_optim_t* o, float* params, float* grads, float lr,
                  double* grad_norm);

/* ==== Learning-rate schedules
 * ================================================== */

typedef enum {
  ST_SCHED_CONSTANT = 0,
  ST_SCHED_STEP = 1,
  ST_SCHED_COSINE = 2
} st_sched_kind_t;

typedef struct {
  st_sched_kind_t kind;
  double base_lr;
  uint64_t warmup_steps; /* linear ramp from base_lr/warmup_steps to base_lr
                            over the first warmup_steps steps; 0: none */
  uint64_t total_steps;  /* cosine: steps over which lr decays to min_lr */
  uint64_t step_every;   /* step: multiply by gamma every step_every steps */
  double gamma;          /* step */
  double min_lr;         /* cosine floor */
} st_schedule_t;

int st_sched_kind_parse(const char* s, st_sched_kind_t* kind);
const char* st_sched_kind_name(st_sched_kind_t kind);

/* The learning rate for update number `step` (0-based). Warm-up first; the
 * step and cosine schedules count from the end of warm-up. */
double st_schedule_lr(const st_schedule_t* s, uint64_t step);

#ifdef __cplusplus
}
#endif

#endif /* STARLING_OPTIMIZER_H */
