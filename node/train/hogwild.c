/* hogwild.c: HogWild (Niu, Recht, Re & Wright, "Hogwild!: A Lock-Free
 * Approach to Parallelizing Stochastic Gradient Descent", NIPS 2011) for
 * the linear models, and the row-by-row evaluation of sparse data.
 *
 * A HogWild trainer (st_train_config_t.hogwild) owns a pool of threads.
 * st_trainer_step hands the batch's examples to them, the calling thread
 * taking a part too; each thread runs one SGD update per example on the
 * one shared parameter vector: it reads the weights the example touches,
 * computes that example's gradient, and writes those weights back, with no
 * lock. Two threads may write the same weight at once and one write is
 * then lost; on sparse data an example touches few weights, collisions are
 * rare, and the paper proves the rate of convergence is kept. The loads
 * and stores are relaxed atomics, so that the races are defined behaviour
 * in C11 and compile to plain moves.
 *
 * The biases are the exception: every example writes all of them, so
 * shared they would bounce one cache line between the cores at every
 * example, and two threads ran slower than one. With several lock-free
 * threads each keeps its own change to the biases (reading the shared
 * value plus its own change) and adds it to the shared biases every
 * ST__BIAS_FLUSH examples, with a compare-and-swap so that no flush is
 * lost. Keeping the change for a whole step instead made the threads'
 * bias corrections overshoot (each blind to the others' for B/T
 * examples): the loss ended 16-32% above the locked run's at batch 256 on
 * 4 threads; flushing every 8, within 1% of it in 40 runs of 40 (the unit
 * test's bound; the gap itself was not measured). ST_HOGWILD_LOCKED
 * takes one mutex
 * around each example's read-compute-write instead: the serial SGD that
 * HogWild is measured against, on the same threads.
 *
 * The step ends when every thread has done its part. Between steps no
 * thread touches the parameters, so the daemon's trainer thread still
 * averages, snapshots and checkpoints them at step boundaries as for the
 * batch trainer.
 *
 * Model layout (optimizer.h): softmax:D-C holds W (C x D, row-major) then
 * b (C); linear:D-1 holds w (D) then b (1). The per-example losses are the
 * batch trainer's: softmax cross-entropy, and 0.5 (y - t)^2. */
#include "node/train/train.h"
#include "node/train/train_internal.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Examples between two flushes of a thread's change to the biases. */
#define ST__BIAS_FLUSH 8

/* One thread's results, padded to its own cache line. */
typedef struct {
  double loss; /* sum over its examples */
  size_t bad;  /* examples with a non-finite loss (not applied) */
  char pad[48];
} part_t;

struct st_hogwild_pool_s {
  st_trainer_t* t;
  uint32_t threads;
  pthread_t* tids; /* threads - 1 workers; the caller is part 0 */
  uint32_t started;
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  uint64_t gen;     /* job number; workers wait for it to change */
  uint32_t pending; /* workers still on the current job */
  int stop;
  /* The current job: t->order[start .. start + rows) at rate lr. */
  size_t start, rows;
  float lr;
  pthread_mutex_t update_lock; /* ST_HOGWILD_LOCKED */
  part_t* parts;               /* threads */
  float* logits;               /* threads x outputs scratch */
  float* bias_delta;           /* threads x outputs: each thread's change to the
                                  biases since its last flush; NULL when the
                                  biases are updated in place (one thread, or
                                  locked) */
  size_t outputs;
  size_t stride; /* floats between two threads' rows of logits and
                    bias_delta: outputs rounded up to a cache line, so
                    that no two threads write one line */
};

const char* st_hogwild_name(st_hogwild_t mode) {
  switch (mode) {
    case ST_HOGWILD_LOCKFREE:
      return "lock-free";
    case ST_HOGWILD_LOCKED:
      return "locked";
    default:
      return "off";
  }
}

/* ---- Relaxed atomic access to the shared parameters ---------------------- */

static inline float load_relaxed(const float* p) {
  float v;
  __atomic_load(p, &v, __ATOMIC_RELAXED);
  return v;
}

static inline void store_relaxed(float* p, float v) {
  __atomic_store(p, &v, __ATOMIC_RELAXED);
}

/* ---- One example ----------------------------------------------------------
 */

/* Example i's features: col NULL for a dense row (val = the row, nnz =
 * dim). */
typedef struct {
  const uint32_t* col;
  const float* val;
  size_t nnz;
} row_t;

static row_t example_row(const st_dataset_t* ds, size_t i) {
  row_t r;
  if (ds->row_ptr != NULL) {
    size_t a = ds->row_ptr[i];
    r.col = ds->col + a;
    r.val = ds->val + a;
    r.nnz = ds->row_ptr[i + 1] - a;
  } else {
    r.col = NULL;
    r.val = ds->x + i * ds->dim;
    r.nnz = ds->dim;
  }
  return r;
}

static inline size_t feature(const row_t* r, size_t k) {
  return r->col != NULL ? r->col[k] : k;
}

/* w . x + b, reading w and b relaxed. */
static float dot(const float* w, float b, const row_t* r) {
  float z = b;
  for (size_t k = 0; k < r->nnz; k++)
    z += load_relaxed(&w[feature(r, k)]) * r->val[k];
  return z;
}

/* w -= g * x: the example's update of one output's weights. */
static void axpy(float* w, float g, const row_t* r) {
  for (size_t k = 0; k < r->nnz; k++) {
    float* p = &w[feature(r, k)];
    store_relaxed(p, load_relaxed(p) - g * r->val[k]);
  }
}

/* The biases of one thread: the shared ones b, plus its own change bd in
 * this step when it keeps one (bd NULL: b is updated in place). */
typedef struct {
  float* b;
  float* bd;
} bias_t;

static inline float bias_get(const bias_t* bs, size_t c) {
  return load_relaxed(&bs->b[c]) + (bs->bd != NULL ? bs->bd[c] : 0.0f);
}

static inline void bias_sub(const bias_t* bs, size_t c, float g) {
  if (bs->bd != NULL)
    bs->bd[c] -= g;
  else
    store_relaxed(&bs->b[c], load_relaxed(&bs->b[c]) - g);
}

/* Adds the thread's change to the shared biases (n of them) and clears
 * it: a compare-and-swap per bias, so that two threads flushing at once
 * both count. */
static void bias_flush(const bias_t* bs, size_t n) {
  if (bs->bd == NULL)
    return;
  for (size_t c = 0; c < n; c++) {
    float cur = load_relaxed(&bs->b[c]), next;
    do
      next = cur + bs->bd[c];
    while (!__atomic_compare_exchange(&bs->b[c], &cur, &next, true,
                                      __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    bs->bd[c] = 0;
  }
}

/* The logits of a softmax:D-C model (biases bs) for row r into z (C
 * floats), and the example's cross-entropy against class y. */
static double softmax_loss(const float* params, const bias_t* bs, size_t D,
                           size_t C, const row_t* r, size_t y, float* z) {
  float m = -INFINITY;
  for (size_t c = 0; c < C; c++) {
    z[c] = dot(params + c * D, bias_get(bs, c), r);
    if (z[c] > m)
      m = z[c];
  }
  double s = 0;
  for (size_t c = 0; c < C; c++)
    s += exp((double) z[c] - m);
  return (double) m + log(s) - (double) z[y];
}

/* One SGD update of the model on example i; returns its loss (before the
 * update), applying nothing when it is not finite. */
static double update_one(const st_model_spec_t* spec, float* params,
                         const bias_t* bs, const st_dataset_t* ds, size_t i,
                         float lr, float* z) {
  row_t r = example_row(ds, i);
  size_t D = spec->sizes[0];
  if (spec->kind == ST_MODEL_LINEAR) {
    float out = dot(params, bias_get(bs, 0), &r);
    double diff = (double) out - (double) ds->y[i];
    double loss = 0.5 * diff * diff;
    if (isfinite(loss)) {
      axpy(params, lr * (float) diff, &r);
      bias_sub(bs, 0, lr * (float) diff);
    }
    return loss;
  }
  size_t C = spec->sizes[1];
  size_t y = (size_t) ds->y[i];
  double loss = softmax_loss(params, bs, D, C, &r, y, z);
  if (!isfinite(loss))
    return loss;
  double lse = loss + (double) z[y];
  for (size_t c = 0; c < C; c++) {
    float g = (float) exp((double) z[c] - lse) - (c == y ? 1.0f : 0.0f);
    if (g != 0) {
      axpy(params + c * D, lr * g, &r);
      bias_sub(bs, c, lr * g);
    }
  }
  return loss;
}

/* Where the model's biases are: after the weights (outputs x inputs). */
static float* biases(const st_trainer_t* t) {
  return t->model.params + t->cfg.model.sizes[0] * t->cfg.model.sizes[1];
}

/* ---- The pool -------------------------------------------------------------
 */

/* Part w of the current job. */
static void run_part(st_hogwild_pool_t* p, uint32_t w) {
  st_trainer_t* t = p->t;
  size_t a = p->start + p->rows * w / p->threads;
  size_t e = p->start + p->rows * (w + 1) / p->threads;
  float* z = p->logits + (size_t) w * p->stride;
  bias_t bs = {biases(t), p->bias_delta != NULL
                              ? p->bias_delta + (size_t) w * p->stride
                              : NULL};
  double loss_sum = 0;
  size_t bad = 0;
  int locked = t->cfg.hogwild == ST_HOGWILD_LOCKED;
  for (size_t k = a; k < e; k++) {
    if (locked)
      pthread_mutex_lock(&p->update_lock);
    double loss = update_one(&t->cfg.model, t->model.params, &bs, t->train,
                             t->order[k], p->lr, z);
    if (locked)
      pthread_mutex_unlock(&p->update_lock);
    if (isfinite(loss))
      loss_sum += loss;
    else
      bad++;
    if ((k - a) % ST__BIAS_FLUSH == ST__BIAS_FLUSH - 1)
      bias_flush(&bs, p->outputs);
  }
  bias_flush(&bs, p->outputs);
  p->parts[w].loss = loss_sum;
  p->parts[w].bad = bad;
}

typedef struct {
  st_hogwild_pool_t* p;
  uint32_t w;
} worker_arg_t;

static void* worker(void* arg) {
  worker_arg_t a = *(worker_arg_t*) arg;
  free(arg);
  st_hogwild_pool_t* p = a.p;
  uint64_t seen = 0;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (p->gen == seen && !p->stop)
      pthread_cond_wait(&p->go, &p->mu);
    if (p->stop)
      break;
    seen = p->gen;
    pthread_mutex_unlock(&p->mu);
    run_part(p, a.w);
    pthread_mutex_lock(&p->mu);
    if (--p->pending == 0)
      pthread_cond_signal(&p->done);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

int st__hogwild_check(const st_train_config_t* cfg, const st_backend_t* be,
                      char* err, size_t err_len) {
  char model[256];
  st_model_spec_format(&cfg->model, model, sizeof(model));
  if (cfg->model.kind == ST_MODEL_MLP) {
    st_set_err(err, err_len,
               "--hogwild trains the linear models (softmax:D-C, linear:D-1), "
               "not %s: its updates touch only an example's own features",
               model);
    return -EINVAL;
  }
  if (st_backend_kind(be) != ST_BACKEND_CPU) {
    st_set_err(err, err_len,
               "--hogwild runs threads on the CPU's memory; use --device cpu "
               "(this is %s)",
               st_backend_describe(be));
    return -EINVAL;
  }
  char what[64] = "";
  if (cfg->opt.kind != ST_OPT_SGD)
    snprintf(what, sizeof what, "--optimizer %s (and --momentum)",
             st_opt_kind_name(cfg->opt.kind));
  else if (cfg->opt.weight_decay != 0)
    snprintf(what, sizeof what, "--weight-decay");
  else if (cfg->opt.clip_norm != 0)
    snprintf(what, sizeof what, "--clip-norm");
  if (what[0] != '\0') {
    st_set_err(err, err_len,
               "--hogwild takes plain SGD steps per example: drop %s", what);
    return -EINVAL;
  }
  if (cfg->threads < 1 || cfg->threads > ST_HOGWILD_MAX_THREADS) {
    st_set_err(err, err_len, "--hogwild: %u threads; want 1 to %d",
               cfg->threads, ST_HOGWILD_MAX_THREADS);
    return -EINVAL;
  }
  return 0;
}

void st__hogwild_stop(st_hogwild_pool_t* p) {
  if (p == NULL)
    return;
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  pthread_cond_broadcast(&p->go);
  pthread_mutex_unlock(&p->mu);
  for (uint32_t i = 0; i < p->started; i++)
    pthread_join(p->tids[i], NULL);
  pthread_mutex_destroy(&p->mu);
  pthread_mutex_destroy(&p->update_lock);
  pthread_cond_destroy(&p->go);
  pthread_cond_destroy(&p->done);
  free(p->tids);
  free(p->parts);
  free(p->logits);
  free(p->bias_delta);
  free(p);
}

/* count zeroed floats on whole cache lines of their own (count a multiple
 * of 16), so that each thread's stride of them shares no line. */
static void* lines_alloc(size_t count) {
  void* p = aligned_alloc(64, count * sizeof(float));
  if (p != NULL)
    memset(p, 0, count * sizeof(float));
  return p;
}

int st__hogwild_start(st_trainer_t* t, st_hogwild_pool_t** out, char* err,
                      size_t err_len) {
  uint32_t n = t->cfg.threads;
  st_hogwild_pool_t* p = calloc(1, sizeof(*p));
  if (p == NULL)
    return -ENOMEM;
  p->t = t;
  p->threads = n;
  p->outputs = t->cfg.model.sizes[1];
  p->stride = (p->outputs + 15) / 16 * 16;
  pthread_mutex_init(&p->mu, NULL);
  pthread_mutex_init(&p->update_lock, NULL);
  pthread_cond_init(&p->go, NULL);
  pthread_cond_init(&p->done, NULL);
  p->tids = calloc(n, sizeof(pthread_t));
  p->parts = lines_alloc(n * (sizeof(part_t) / sizeof(float)));
  p->logits = lines_alloc((size_t) n * p->stride);
  int delayed = n > 1 && t->cfg.hogwild == ST_HOGWILD_LOCKFREE;
  if (delayed)
    p->bias_delta = lines_alloc((size_t) n * p->stride);
  if (p->tids == NULL || p->parts == NULL || p->logits == NULL ||
      (delayed && p->bias_delta == NULL)) {
    st__hogwild_stop(p);
    return -ENOMEM;
  }
  for (uint32_t w = 1; w < n; w++) {
    worker_arg_t* a = malloc(sizeof(*a));
    int rc = a == NULL ? ENOMEM : 0;
    if (a != NULL) {
      a->p = p;
      a->w = w;
      rc = pthread_create(&p->tids[p->started], NULL, worker, a);
      if (rc != 0)
        free(a);
    }
    if (rc != 0) {
      st_set_err(err, err_len, "--hogwild: cannot start thread %u of %u: %s",
                 w + 1, n, strerror(rc));
      st__hogwild_stop(p);
      return -rc;
    }
    p->started++;
  }
  *out = p;
  return 0;
}

int st__hogwild_step(st_hogwild_pool_t* p, size_t start, size_t rows, float lr,
                     double* loss) {
  pthread_mutex_lock(&p->mu);
  p->start = start;
  p->rows = rows;
  p->lr = lr;
  p->pending = p->threads - 1;
  p->gen++;
  pthread_cond_broadcast(&p->go);
  pthread_mutex_unlock(&p->mu);
  run_part(p, 0);
  pthread_mutex_lock(&p->mu);
  while (p->pending > 0)
    pthread_cond_wait(&p->done, &p->mu);
  pthread_mutex_unlock(&p->mu);
  double sum = 0;
  size_t bad = 0;
  for (uint32_t w = 0; w < p->threads; w++) {
    sum += p->parts[w].loss;
    bad += p->parts[w].bad;
  }
  *loss = bad > 0 ? NAN : sum / (double) rows;
  return bad > 0 ? -EDOM : 0;
}

/* ---- Evaluation of sparse data on a linear model ------------------------ */

bool st__rowwise_eval(const st_model_spec_t* spec, const st_backend_t* be,
                      const st_dataset_t* ds) {
  return st_dataset_is_sparse(ds) && spec->kind != ST_MODEL_MLP &&
         st_backend_kind(be) == ST_BACKEND_CPU;
}

int st__rowwise_evaluate(const st_model_spec_t* spec, const float* params,
                         const st_dataset_t* ds, size_t start, size_t rows,
                         double* loss_sum, size_t* correct, float* out) {
  size_t D = spec->sizes[0], C = st_model_spec_classes(spec);
  float* z = malloc((C > 0 ? C : 1) * sizeof(float));
  if (z == NULL)
    return -ENOMEM;
  for (size_t i = start; i < start + rows; i++) {
    row_t r = example_row(ds, i);
    if (C == 0) {
      float o = dot(params, params[D], &r);
      double diff = (double) o - (double) ds->y[i];
      if (loss_sum != NULL)
        *loss_sum += 0.5 * diff * diff;
      if (out != NULL)
        out[i - start] = o;
      continue;
    }
    size_t y = (size_t) ds->y[i];
    bias_t bs = {(float*) params + C * D, NULL};
    double loss = softmax_loss(params, &bs, D, C, &r, y < C ? y : 0, z);
    if (loss_sum != NULL)
      *loss_sum += loss;
    size_t best = 0;
    for (size_t c = 1; c < C; c++)
      if (z[c] > z[best])
        best = c; /* ties keep the lowest index, as cpu_argmax_correct */
    if (correct != NULL)
      *correct += best == y;
    if (out != NULL) {
      double lse = loss + (double) z[y < C ? y : 0];
      for (size_t c = 0; c < C; c++)
        out[(i - start) * C + c] = (float) exp((double) z[c] - lse);
    }
  }
  free(z);
  return 0;
}
