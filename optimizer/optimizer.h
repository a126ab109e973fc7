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
 * constant, step and cosine, each with optional linear warm-up. Codecs
 * (optimizer/codec.c): compressed float32 vectors (bf16, int8, top-k) with
 * error feedback, for the deltas that averaging sends.
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

/* The same, calling layer_done(arg, l) as soon as layer l's gradient (W_l
 * and b_l, the floats [w_off[l], b_off[l] + sizes[l + 1]) of m->grads) is
 * written, from the last layer down to layer 0, while the rest of the
 * backward pass is still to run: so that a caller can start sending it
 * (synchronous data-parallel SGD's buckets). On a device backend the
 * gradient is issued, not finished: read it with st_copy_to_host, which
 * waits. layer_done may be NULL. */
int st_model_step_hooked(st_model_t* m, size_t rows, double* loss,
                         void (*layer_done)(void* arg, int layer), void* arg);

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

/* ==== Codecs for compressed deltas (optimizer/codec.c) ====================
 *
 * A codec turns a vector of n float32 into bytes and back, losing a bounded
 * amount, so that averaging can send fewer bytes (issue #16). The byte
 * layout is versioned and specified in docs/protocol.md, "Compressed deltas
 * (optimizer/codec.c)"; every multi-byte field is little-endian. Each
 * encoding is a 16-byte header (version, kind, a parameter, n) and a body:
 *
 *   none   n float32                          4n + 16 bytes, exact
 *   bf16   n bfloat16 (the top half of each float32, rounded to nearest
 *          even; a finite value beyond bfloat16's range saturates to its
 *          largest finite value)               2n + 16 bytes
 *          |x - x'| <= 2^-8 |x| + 2^-134 (2^-134: half the spacing of
 *          bfloat16's subnormals, which float32 tiny values fall into)
 *   int8   chunks of C = ST_CODEC_INT8_CHUNK floats; per chunk a float32
 *          scale = max|x| / 127 (0 for an all-zero chunk), then per float
 *          q = round(x / scale) in [-127, 127]; decoded x' = q * scale in
 *          float32                              n + 4 ceil(n / C) + 16 bytes
 *          |x - x'| <= scale / 2 + 2^-22 |x| (the second term is float
 *          arithmetic: the quotient and the product's rounding)
 *   topk   the k = max(1, round(fraction * n)) entries of largest magnitude
 *          (ties: the lower index first), as (u32 index, float32 value)
 *          pairs in ascending index order; the rest decode as 0
 *                                               8k + 16 bytes
 *          exact on the kept entries; a dropped entry's error is its value,
 *          at most the smallest magnitude that was kept
 *
 * Encoders refuse NaN and Inf (-EINVAL): a delta that holds one is never
 * applied (DESIGN.md, Guarding), so it is not sent either; decoders refuse
 * them too. The scalar st_codec_f32_to_bf16 keeps NaN a NaN.
 *
 * Error feedback (st_codec_ef_t, one per stream of messages, Seide et al.
 * 2014, Stich et al. 2018): each message encodes y = x + r, the input plus
 * what earlier messages did not carry, and keeps r = y - decode(message).
 * What was sent then sums to what was given: after T messages, per element
 *   sum_t x_t - sum_t decode_t = r_T   (up to float32 rounding of y and r,
 *                                       at most 2^-23 |y_t| per message)
 * and r_T is one message's loss: for bf16 |r_T| <= 2^-8 |y_T| + 2^-134,
 * for int8 |r_T| <= scale_T / 2 + 2^-22 |y_T| (scale of its chunk in
 * message T), so with inputs bounded by G the residual stays near G/256
 * (bf16) and G/253 (int8). For top-k a residual entry grows while its
 * entry is not among the k largest of y; what holds is |r_T[i]| <= the
 * smallest magnitude sent in message T, and, since ||y - topk(y)||^2 <=
 * (1 - k/n) ||y||^2, ||r_T||_2 <= (2n/k - 1) max_t ||x_t||_2. Nothing is
 * lost, only delayed.
 */

#define ST_CODEC_VERSION 1
#define ST_CODEC_HEADER_BYTES 16
/* Floats per int8 chunk. 256 costs 4/256 = 1.6% of the int8 bytes in
 * scales, and keeps a chunk's error (its max / 254) local: one large value
 * coarsens 255 neighbours, not the whole tensor. The decoder reads C from
 * the header and takes any C in [1, ST_CODEC_INT8_MAX_CHUNK]. */
#define ST_CODEC_INT8_CHUNK 256u
#define ST_CODEC_INT8_MAX_CHUNK 65536u
/* The longest vector a codec takes: 2^40 floats, the wire's n_params cap;
 * top-k's u32 indices cap it at 2^32 - 1. */
#define ST_CODEC_MAX_FLOATS ((uint64_t) 1 << 40)
#define ST_CODEC_TOPK_MAX_FLOATS 0xffffffffu
/* top-k fractions are kept in millionths, so that every node derives the
 * same k from the same text and the canonical name is exact. */
#define ST_CODEC_PPM 1000000u

typedef enum {
  ST_CODEC_NONE = 0,
  ST_CODEC_BF16 = 1,
  ST_CODEC_INT8 = 2,
  ST_CODEC_TOPK = 3
} st_codec_kind_t;

typedef struct {
  st_codec_kind_t kind;
  uint32_t topk_ppm; /* TOPK: the fraction kept, in millionths, in
                        [1, 1000000]; 0 for the other kinds */
} st_codec_spec_t;

/* Why a decoder refused bytes; each is a counter, named by
 * st_codec_drop_name ("codec_scale", ...). */
typedef enum {
  ST_CODEC_DROP_HEADER = 0, /* shorter than a header, reserved bytes not 0,
                               or an int8 chunk size out of range */
  ST_CODEC_DROP_VERSION,    /* a version this build does not speak */
  ST_CODEC_DROP_KIND,       /* a kind other than the one expected */
  ST_CODEC_DROP_LENGTH,     /* n not the expected n, k not the expected k,
                               or a byte length other than n (and k) imply */
  ST_CODEC_DROP_SCALE,      /* an int8 scale NaN, Inf, negative (sign bit),
                               or so large that 127 * scale overflows */
  ST_CODEC_DROP_INDEX,      /* a top-k index >= n, repeated or descending */
  ST_CODEC_DROP_VALUE,      /* NaN or Inf; int8 -128, or a non-zero q in a
                               chunk of scale 0 (no encoder writes these) */
  ST_CODEC_DROP_COUNT
} st_codec_drop_t;

/* Parses "none", "bf16", "int8" or "topk:FRACTION" (FRACTION a decimal in
 * (0, 1] with at most 6 decimals, e.g. topk:0.01 keeps 1%). 0, or -EINVAL
 * with a sentence naming the bad text and the accepted forms in err. */
int st_codec_parse(const char* text, st_codec_spec_t* spec, char* err,
                   size_t err_len);
/* Writes the canonical text ("none", "bf16", "int8", "topk:0.01": the
 * fraction without trailing zeros) into buf: the form that goes into the
 * model fingerprint. Texts that parse to the same spec give the same name.
 * 0, -EINVAL for a bad spec, -ENOSPC when len is too small. */
int st_codec_name(const st_codec_spec_t* spec, char* buf, size_t len);
/* "codec_header", ..., "codec_value"; "codec_unknown" otherwise. */
const char* st_codec_drop_name(st_codec_drop_t reason);

/* The k top-k keeps of n floats: max(1, round(ppm * n / 10^6)), rounding
 * halves up, and 0 when n is 0. */
uint64_t st_codec_topk_k(const st_codec_spec_t* spec, uint64_t n);
/* The exact size of an encoding of n floats, header included; 0 when the
 * spec is bad or n is beyond the kind's limit. */
size_t st_codec_encoded_bytes(const st_codec_spec_t* spec, uint64_t n);

/* bfloat16 of f, rounded to nearest even (NaN stays a quiet NaN, Inf
 * stays Inf, a finite value beyond bfloat16's range becomes its largest
 * finite value of the same sign), and back (exact). */
uint16_t st_codec_f32_to_bf16(float f);
float st_codec_bf16_to_f32(uint16_t h);

/* Encodes x[0..n) (borrowed, host memory) into buf[0..cap), which must
 * not overlap x (top-k uses buf as scratch before it writes). On success
 * writes st_codec_encoded_bytes(spec, n) bytes, that size into *len, and
 * returns 0. -EINVAL for a bad spec or a NaN or Inf in x, -E2BIG when n is
 * beyond the kind's limit, -EMSGSIZE when cap is too small. Allocates
 * nothing. Deterministic: the same x gives the same bytes on every node. */
int st_codec_encode(const st_codec_spec_t* spec, const float* x, size_t n,
                    uint8_t* buf, size_t cap, size_t* len);

/* Decodes buf[0..len) (borrowed, untrusted) into out[0..n) (host memory),
 * expecting an encoding of kind spec->kind of exactly n floats (and for
 * top-k exactly st_codec_topk_k(spec, n) entries). Every field is checked
 * before out is touched: on failure nothing is written to out, *reason
 * (may be NULL) says why, and the call returns -EPROTO (version or kind)
 * or -EBADMSG (anything else). On success every out[i] is finite. */
int st_codec_decode(const st_codec_spec_t* spec, const uint8_t* buf, size_t len,
                    float* out, size_t n, st_codec_drop_t* reason);

/* One stream of messages with error feedback (see above). */
typedef struct {
  st_codec_spec_t spec;
  size_t n;
  float* residual; /* host, n floats, owned: what was not sent yet */
} st_codec_ef_t;

/* Allocates a zero residual for vectors of n floats. 0, -EINVAL (bad
 * spec), -E2BIG (n beyond the kind's limit) or -ENOMEM. */
int st_codec_ef_init(st_codec_ef_t* ef, const st_codec_spec_t* spec, size_t n);
void st_codec_ef_close(st_codec_ef_t* ef);
/* Forgets what was not sent (the residual becomes 0). */
void st_codec_ef_reset(st_codec_ef_t* ef);
/* Encodes y = x + residual as st_codec_encode does and keeps residual =
 * y - decode(buf). x (borrowed) has ef->n floats. -EMSGSIZE when cap is
 * too small, checked first, changes nothing. -EINVAL when y holds a NaN
 * or Inf: the residual is then reset to 0 (the stream starts over). */
int st_codec_ef_encode(st_codec_ef_t* ef, const float* x, uint8_t* buf,
                       size_t cap, size_t* len);

/* ---- The outer optimizer of averaging (outer.c) -------------------------
 *
 * DiLoCo's outer step (Douillard et al. 2023) on the mean a ring round
 * gives: the members start a period from one shared vector, the anchor;
 * the mean's move from it is an outer gradient g = anchor - mean, and the
 * new shared vector is a Nesterov step on it instead of the mean itself:
 *
 *   m      = momentum m + g
 *   anchor = anchor - lr (g + momentum m)
 *
 * With lr 1 and momentum 0 that is the mean: plain averaging.
 *
 * NOLOCO is the gossip variant (Kolehmainen et al. 2025, "NoLoCo"): the
 * same step, taken by each member on the pairwise mean of each of its
 * gossip exchanges instead of a ring round's global one, from its own
 * anchor (members' anchors differ; each step pulls a member's toward its
 * partner's, and gossip mixes them); no all-reduce is needed. */

typedef enum {
  ST_OUTER_NONE = 0,
  ST_OUTER_NESTEROV = 1,
  ST_OUTER_NOLOCO = 2
} st_outer_kind_t;

typedef struct {
  st_outer_kind_t kind;
  uint32_t lr_ppm;       /* in millionths, [1, ST_OUTER_LR_MAX_PPM] */
  uint32_t momentum_ppm; /* in millionths, [0, ST_OUTER_MOMENTUM_MAX_PPM] */
} st_outer_spec_t;

#define ST_OUTER_LR_MAX_PPM 4000000u          /* 4 */
#define ST_OUTER_MOMENTUM_MAX_PPM 999999u     /* below 1 */
#define ST_OUTER_LR_DEFAULT_PPM 700000u       /* DiLoCo's 0.7 */
#define ST_OUTER_MOMENTUM_DEFAULT_PPM 900000u /* and 0.9 */

/* {NONE}, with the defaults' lr and momentum ready for NESTEROV. */
void st_outer_spec_default(st_outer_spec_t* spec);
/* "none" or "nesterov" into spec->kind. 0, or -EINVAL with a sentence. */
int st_outer_parse_kind(const char* text, st_outer_spec_t* spec, char* err,
                        size_t err_len);
/* A decimal with at most 6 decimals: the learning rate in (0, 4], the
 * momentum in [0, 1). 0, or -EINVAL with a sentence naming the text. */
int st_outer_parse_lr(const char* text, st_outer_spec_t* spec, char* err,
                      size_t err_len);
int st_outer_parse_momentum(const char* text, st_outer_spec_t* spec, char* err,
                            size_t err_len);
/* The canonical text: "none", or "nesterov:LR:MOMENTUM" with each number
 * as st_format_millionths writes it ("nesterov:0.7:0.9"): the form that
 * goes into the model fingerprint. 0, -EINVAL or -ENOSPC. */
int st_outer_name(const st_outer_spec_t* spec, char* buf, size_t len);

/* One outer step over n floats, in place. anchor: the shared vector the
 * period started from, becomes the new one; m: the momentum (zero at
 * first); mean: the round's mean; delta: mean - own on entry (what plain
 * averaging adds to this member's parameters), new anchor - own on
 * return. A NESTEROV spec only. */
void st_outer_step(const st_outer_spec_t* spec, float* anchor, float* m,
                   const float* mean, float* delta, size_t n);
/* The same step where the mean is own + delta (a gossip exchange's: own,
 * this member's snapshot; delta, what plain averaging adds to it), with
 * no vector of the mean: delta becomes new anchor - own. */
void st_outer_step_own(const st_outer_spec_t* spec, float* anchor, float* m,
                       const float* own, float* delta, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* STARLING_OPTIMIZER_H */
