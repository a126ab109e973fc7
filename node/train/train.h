/* train.h: the training library, what one starling node runs on its own:
 * datasets, checkpoints and the local training loop. `starling train`, the
 * benchmarks and the daemon's trainer thread use it; it knows nothing of
 * the network.
 *
 * - Data (data_idx.c, data_csv.c, data.c): loaders for IDX (the MNIST
 *   family, gzip or raw) and numeric CSV, normalization, a seeded shuffle
 *   per epoch and disjoint sharding.
 * - Checkpoints (safetensors.c, safetensors_write.c): atomic writes
 *   (temporary file, fsync, rename) in the safetensors format, readable by
 *   Python's safetensors and by NumPy, and a hardened reader.
 * - Training (trainer.c, trainer_checkpoint.c): model + optimizer +
 *   schedule + data shard, stepped one batch at a time, so that `starling
 *   train` and the daemon's trainer thread run the same loop.
 * - Saved models (saved_model.c): a checkpoint's model used on its own,
 *   with the input transform its training data had, for `starling eval`
 *   and `starling predict`.
 *
 * Errors follow the house rule: 0 or a negative errno. Functions that take
 * (err, err_len) also write one sentence into err naming the bad input (the
 * file, the field) and what to do about it; err may be NULL.
 */
#ifndef STARLING_NODE_TRAIN_H
#define STARLING_NODE_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kernels/kernels.h"
#include "optimizer/optimizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ==== Data =============================================================== */

/* Dimensions of one example that a dataset records (IDX files have at most
 * 16 in all, the count included; real ones have 2 or 3). */
#define ST_DATASET_MAX_SHAPE 8

/* An in-memory dataset of n examples with dim float features each: the
 * whole of its source, or one shard of it (st_data_options_t). */
typedef struct {
  size_t n;         /* examples held */
  size_t total;     /* examples in the source (n unless sharded) */
  uint32_t shard_k; /* held: the examples i of the source with */
  uint32_t shard_n; /* i % shard_n == shard_k (0/1: all), in order */
  size_t dim;       /* features per example */
  size_t n_classes; /* > 0: y holds class indices in [0, n_classes) as
                       floats; 0: y holds real-valued regression targets */
  float* x;         /* n x dim, row-major; owned; NULL when sparse */
  float* y;         /* n targets; owned */
  /* Sparse examples (libsvm files, st_dataset_load_libsvm): x is NULL and
   * example i's nonzero features are col[row_ptr[i] .. row_ptr[i + 1]),
   * with the values val[...] at the same positions; columns increase
   * within a row and are < dim. All three NULL for dense data; owned. */
  size_t* row_ptr; /* n + 1 offsets */
  uint32_t* col;
  float* val;
  char source[512]; /* where it came from, for messages */
  /* What one example is, for checkpoints (st_trainer_save): its shape as
   * the file has it (IDX images: {28, 28}; CSV: {dim}; ndim 0: {dim}),
   * and the divisor the loader applied to the raw values (IDX bytes: 255;
   * CSV: 1; 0 counts as 1). */
  size_t shape[ST_DATASET_MAX_SHAPE];
  int shape_ndim;
  double input_scale;
  /* The standardization st_data_open applied, x = (x - mean) / std in
   * double rounded to float (st_dataset_normalize): norm_len 1 (one scalar
   * for every feature), dim (per feature) or 0 (not normalized, the
   * pointers NULL). Set on the training set; owned. */
  float* norm_mean;
  float* norm_std;
  size_t norm_len;
} st_dataset_t;

void st_dataset_free(st_dataset_t* ds);

/* Loads an IDX image file (magic 0x00000803, unsigned bytes, any number of
 * dimensions >= 1 after the count) and its IDX label file (0x00000801),
 * each gzip-compressed or raw (detected from the content, not the name).
 * Pixels are scaled to [0, 1] (input_scale 255); n_classes is max label + 1
 * (at least 2); shape is the image's dimensions. labels_path may be NULL:
 * images without labels (y all 0, n_classes 0), to predict on.
 * Refuses, naming the file: a missing or unreadable file, a wrong magic, a
 * truncated body, trailing garbage, zero dimensions, and image and label
 * counts that differ. */
int st_dataset_load_idx(st_dataset_t* ds, const char* images_path,
                        const char* labels_path, char* err, size_t err_len);

typedef struct {
  int label_col;  /* column index of the label/target; -1 means the last */
  int regression; /* 0: labels are class indices (non-negative integers);
                     1: the target is any finite real number */
} st_csv_options_t;

/* Loads a numeric CSV file, one example per line, comma-separated. A first
 * line that is not numeric is taken as a header and skipped. Empty lines
 * are skipped. Refuses, naming the file and the line: a field that is not a
 * finite number, a row with a different number of columns, a label that is
 * not a non-negative integer (classification), no data rows. */
int st_dataset_load_csv(st_dataset_t* ds, const char* path,
                        const st_csv_options_t* opt, char* err, size_t err_len);

/* The same for a file of features only, to predict on: every column is a
 * feature (a single column too); y is all 0 and n_classes 0. */
int st_dataset_load_csv_features(st_dataset_t* ds, const char* path, char* err,
                                 size_t err_len);

/* Loads a libsvm (svmlight) file: one example per line, "LABEL
 * INDEX:VALUE INDEX:VALUE ...", indices 1-based and increasing, a trailing
 * "# comment" allowed; gzip-compressed or raw (detected from the
 * content). The set is sparse (x NULL, row_ptr/col/val set): feature
 * INDEX is column INDEX - 1, and dim is the largest index in the file (at
 * least min_dim). Labels: class indices (non-negative integers; a file
 * whose labels are all -1 or +1 is a binary set, -1 becoming class 0), or
 * with opt->regression any finite real. Refuses, naming the file and the
 * line: a label or value that is not a finite number, an index that is not
 * an integer in [1, 2^24] or does not increase, a "qid:" field, no
 * examples. */
int st_dataset_load_libsvm(st_dataset_t* ds, const char* path,
                           const st_csv_options_t* opt, size_t min_dim,
                           char* err, size_t err_len);

/* True when ds holds sparse examples (row_ptr/col/val, x NULL). */
bool st_dataset_is_sparse(const st_dataset_t* ds);

/* A training set and an optional test set that share dim and classes. */
typedef struct {
  st_dataset_t train;
  st_dataset_t test; /* test.n == 0 when the spec names no test set */
  char spec[512];
} st_data_t;

typedef struct {
  st_csv_options_t csv;
  int normalize; /* 1: standardize features with the training set's mean
                    and standard deviation (one scalar for IDX images,
                    per feature for CSV); 0: leave them as loaded */
  uint32_t shard_k, shard_n; /* keep only shard k of n of the training set
                                (st_shard_indices; 0/0 or 0/1: all of it);
                                the statistics of normalize still come from
                                the whole set, so every shard is scaled
                                alike; the test set is always whole */
} st_data_options_t;

/* Opens the data named by a spec:
 *   fashion-mnist                 the Debian package dataset-fashion-mnist
 *                                 (train + test); says how to install it
 *                                 when it is missing
 *   idx:IMAGES,LABELS[,TEST_IMAGES,TEST_LABELS]
 *   csv:TRAIN[,TEST]
 *   libsvm:TRAIN[,TEST]           sparse; both sets get the larger dim;
 *                                 never normalized (that would make it
 *                                 dense): normalize is ignored
 * On failure writes what was wrong into err. */
int st_data_open(st_data_t* d, const char* spec, const st_data_options_t* opt,
                 char* err, size_t err_len);
void st_data_close(st_data_t* d);

/* Standardizes every example of ds in place, x = (float) ((x - mean) /
 * std) computed in double, with len 1 (one mean and std for every
 * feature) or len == ds->dim (per feature): the transform st_data_open
 * applies, so that a checkpoint's normalize.mean and normalize.std
 * reproduce it bit for bit. mean and std are borrowed; every std must be
 * finite and > 0. Returns 0, or -EINVAL (len or a std that does not fit,
 * said in err). */
int st_dataset_normalize(st_dataset_t* ds, const float* mean, const float* std,
                         size_t len, char* err, size_t err_len);

/* Where the Debian package keeps Fashion-MNIST. The directory can be
 * overridden with the environment variable STARLING_FASHION_MNIST_DIR. */
#define ST_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

/* Parses "K/N" (0 <= K < N) into *k and *n. */
int st_shard_parse(const char* s, uint32_t* k, uint32_t* n);

/* The indices of shard k of n over `total` examples: every i with
 * i % n == k, in increasing order (strided, so that every shard sees every
 * part of a file that is sorted by class). The shards are disjoint and
 * together cover [0, total). *out is allocated (free with free()); *count
 * receives its length. */
int st_shard_indices(size_t total, uint32_t k, uint32_t n, size_t** out,
                     size_t* count);

/* Writes the order of epoch `epoch` into order[0..count): a permutation of
 * base[0..count) that depends only on (seed, epoch), so that a resumed run
 * sees the same batches. */
void st_epoch_order(const size_t* base, size_t count, uint64_t seed,
                    uint64_t epoch, size_t* order);

/* Copies the examples idx[0..count) into x (count x dim) and y (count);
 * sparse examples are written out dense (zeros where no feature is). */
void st_dataset_gather(const st_dataset_t* ds, const size_t* idx, size_t count,
                       float* x, float* y);

/* ==== Checkpoints (safetensors) ============================================
 */

#define ST_SAFETENSORS_MAX_DIMS 8
/* The reader refuses headers larger than this (the format's own reference
 * implementation caps them at 100 MB). */
#define ST_SAFETENSORS_MAX_HEADER_BYTES (100u * 1024u * 1024u)

/* One float32 tensor to write: data is host memory, borrowed for the call. */
typedef struct {
  const char* name;
  const float* data;
  size_t shape[ST_SAFETENSORS_MAX_DIMS];
  int ndim; /* 0..4; ndim 0 is a scalar of one element */
} st_tensor_desc_t;

typedef struct {
  const char* key;
  const char* value;
} st_meta_kv_t;

/* Writes the tensors, in the order given, and the string metadata
 * ("__metadata__") to path atomically: a temporary file in the same
 * directory ("<path>.tmp.XXXXXX"), fsync, rename over path, fsync of the
 * directory. The file has mode 0600 (owner only), whatever the mode of
 * the file it replaces. On any failure (a full disk included) the
 * temporary file is removed, path is left as it was, and err names the
 * file and the cause. */
int st_safetensors_write(const char* path, const st_tensor_desc_t* tensors,
                         size_t n_tensors, const st_meta_kv_t* meta,
                         size_t n_meta, char* err, size_t err_len);

typedef struct st_safetensors_s st_safetensors_t;

/* Reads and validates a whole safetensors file: the header length against
 * the file size and the cap above, the JSON header's syntax, every tensor's
 * dtype (F32 only, for now), shape, and data offsets (in bounds, matching
 * the shape, non-overlapping). Refuses a corrupt file with an error naming
 * the file and what is wrong. *out is owned by the caller. */
int st_safetensors_read(const char* path, st_safetensors_t** out, char* err,
                        size_t err_len);
void st_safetensors_free(st_safetensors_t* st);

/* Looks up a tensor by name; NULL when absent. The data is borrowed from st.
 * n_elems, shape and ndim may be NULL. */
const float* st_safetensors_tensor(const st_safetensors_t* st, const char* name,
                                   size_t* n_elems,
                                   size_t shape[ST_SAFETENSORS_MAX_DIMS],
                                   int* ndim);
/* Looks up a metadata value; NULL when absent. Borrowed from st. */
const char* st_safetensors_meta(const st_safetensors_t* st, const char* key);
size_t st_safetensors_count(const st_safetensors_t* st);

/* ==== Training
 * ================================================================ */

/* HogWild (Niu, Recht, Re & Wright, 2011): threads that update one
 * parameter vector without locks, for the linear models (softmax:, linear:)
 * on the CPU backend, sparse data above all (node/train/hogwild.c). */
#define ST_HOGWILD_MAX_THREADS 256

typedef enum {
  ST_HOGWILD_OFF = 0,  /* the batch trainer: one gradient per batch */
  ST_HOGWILD_LOCKFREE, /* threads update the shared parameters, no lock */
  ST_HOGWILD_LOCKED    /* the same threads, each update under one lock:
                          the reference HogWild is measured against */
} st_hogwild_t;

/* "off", "lock-free" or "locked". */
const char* st_hogwild_name(st_hogwild_t mode);

typedef struct {
  st_model_spec_t model;
  st_opt_config_t opt;
  st_schedule_t sched;       /* total_steps is filled in by st_trainer_init from
                                epochs when it is 0 */
  size_t batch;              /* rows per step */
  uint32_t epochs;           /* epochs to run (the schedule spans them) */
  uint64_t seed;             /* parameter initialization and shuffling */
  uint32_t shard_k, shard_n; /* train on shard k of n (0/1: everything) */
  /* HogWild: each example of a batch is one SGD update of its own at the
   * step's learning rate (not the batch mean's), the batch's examples
   * split over `threads` threads (the caller's included). A step ends when
   * every thread has done its part, so averaging and checkpoints still see
   * the parameters between steps. Needs a softmax or linear model, the CPU
   * backend, plain SGD without weight decay or clipping. */
  st_hogwild_t hogwild;
  uint32_t threads; /* HogWild threads, >= 1 (ignored when off) */
} st_train_config_t;

/* Sensible defaults: batch 64, 10 epochs, SGD, lr 0.05 constant, seed 1,
 * shard 0/1. The model must still be set. */
void st_train_config_default(st_train_config_t* cfg);

/* A model, its optimizer and schedule, and a shard of a dataset, stepped one
 * batch at a time. An epoch is ceil(shard size / batch) steps over the
 * shard in the order st_epoch_order gives for (seed, epoch); the last batch
 * of an epoch may be smaller. */
typedef struct {
  st_backend_t* be;          /* borrowed */
  const st_dataset_t* train; /* borrowed */
  st_train_config_t cfg;
  st_model_t model;
  st_optim_t optim;
  size_t* shard; /* indices of this node's shard */
  size_t shard_count;
  size_t* order; /* this epoch's order of the shard */
  size_t steps_per_epoch;
  uint64_t step;  /* updates applied so far */
  uint64_t epoch; /* current epoch, 0-based */
  size_t pos;     /* steps done in the current epoch */
  float* host_x;  /* staging for a batch (non-CPU backends) */
  float* host_y;
  double last_lr;
  struct st_hogwild_pool_s* pool; /* HogWild's threads (hogwild.c); NULL
                                     when off */
} st_trainer_t;

/* Checks that the data fits the model (features = inputs; classes within
 * the outputs; regression data for linear models) and allocates
 * everything on `be`. On failure err says what does not fit. */
int st_trainer_init(st_trainer_t* t, st_backend_t* be,
                    const st_dataset_t* train, const st_train_config_t* cfg,
                    char* err, size_t err_len);
void st_trainer_close(st_trainer_t* t);

/* Runs one SGD step on the next batch. Writes the batch's mean loss into
 * *loss when loss is non-NULL. Returns -EDOM (and applies nothing more)
 * when the loss or the gradient is not finite. */
int st_trainer_step(st_trainer_t* t, double* loss);

/* st_trainer_step in two halves, for synchronous data-parallel SGD, which
 * averages the gradient over the members between them (`starling train
 * --sync`). st_trainer_gradient: the next batch's forward and backward
 * pass, the gradient left in t->model.grads (layer_done and arg as
 * st_model_step_hooked; may be NULL), -EDOM when the loss is not finite.
 * st_trainer_apply: the optimizer's step with t->model.grads, then the
 * position moves on, as st_trainer_step. st_trainer_skip: the position
 * moves on with nothing applied (a step dropped on every member). Not for
 * HogWild trainers (-EINVAL). */
int st_trainer_gradient(st_trainer_t* t, double* loss,
                        void (*layer_done)(void* arg, int layer), void* arg);
int st_trainer_apply(st_trainer_t* t);
void st_trainer_skip(st_trainer_t* t);

/* Moves the trainer to global step `step`, as if it had run `step` steps
 * from the start: epoch = step / steps_per_epoch, pos = step %
 * steps_per_epoch, the epoch's order recomputed from (seed, epoch), and the
 * learning-rate schedule continuing from `step`. The parameters and the
 * optimizer state are left as they are (the optimizer's own update count
 * too, so that AdamW's bias correction still matches its moments). For a
 * node that joins a cluster and adopts the step of the peer it
 * synchronized from. A step at or past the last epoch leaves the trainer
 * done. Returns 0, or -EINVAL on an uninitialized trainer. */
int st_trainer_set_position(st_trainer_t* t, uint64_t step);

/* True when the configured number of epochs has been run. */
bool st_trainer_done(const st_trainer_t* t);

/* Evaluates the current parameters on a whole dataset: mean loss, and for
 * classifiers the accuracy (NaN for regression). */
int st_trainer_evaluate(st_trainer_t* t, const st_dataset_t* ds,
                        double* mean_loss, double* accuracy);

/* The same, calling between(arg) after every batch but the last. between
 * may read the parameters (a snapshot) but must not change them: the
 * evaluation is of one set of parameters. */
int st_trainer_evaluate_between(st_trainer_t* t, const st_dataset_t* ds,
                                double* mean_loss, double* accuracy,
                                void (*between)(void* arg), void* arg);

/* Writes a checkpoint (safetensors): one tensor per layer weight and bias
 * ("layers.L.weight", "layers.L.bias"), the optimizer state
 * ("optimizer.momentum.layers.L.weight", ...), and metadata naming the
 * model, the optimizer, and the position (step, epoch, pos, seed), so that
 * st_trainer_load continues the same trajectory. `extra` metadata is added
 * as given. Atomic, like st_safetensors_write. */
int st_trainer_save(st_trainer_t* t, const char* path,
                    const st_meta_kv_t* extra, size_t n_extra, char* err,
                    size_t err_len);

/* Loads a checkpoint written by st_trainer_save into an initialized
 * trainer: refuses (naming both sides) a checkpoint whose model, batch,
 * seed, shard or optimizer differ from the trainer's configuration, or
 * whose tensors are missing, mis-shaped or not finite. */
int st_trainer_load(st_trainer_t* t, const char* path, char* err,
                    size_t err_len);

/* ==== Using a checkpoint's model (saved_model.c) =========================
 *
 * A checkpoint of st_trainer_save carries everything needed to use its
 * model: the layers, the input transform of its training data
 * (normalize.mean, normalize.std, input_scale) and what the model expects
 * (input_shape, classes). `starling eval` and `starling predict` read it
 * here; docs/training.md does the same in PyTorch. */

typedef struct {
  st_model_t model;     /* parameters loaded, on the backend; owned */
  char model_text[256]; /* the spec, "mlp:784-256-10" */
  char path[512];       /* the checkpoint, for messages */
  size_t inputs, outputs;
  size_t classes; /* the "classes" metadata; 0 for a regression model */
  size_t input_shape[ST_DATASET_MAX_SHAPE];
  int input_ndim;
  double input_scale; /* raw values are divided by this, then normalized */
  float* norm_mean;   /* norm_len values each; owned copies */
  float* norm_std;
  size_t norm_len; /* 1 or inputs */
  uint64_t step;   /* the "step" metadata (0 when absent) */
} st_saved_model_t;

/* Reads the checkpoint at path and loads its model onto be (borrowed; it
 * must outlive sm). Refuses, naming the file and what is wrong: a file that
 * is not safetensors (st_safetensors_read), one that is not a starling
 * checkpoint (an attached program's is named as such), and one that lacks
 * what a model needs (the metadata "model", "classes", "input_shape",
 * "input_scale" and the tensors normalize.mean and normalize.std: every
 * missing one is named), or whose tensors do not fit its model. On
 * failure sm holds nothing to close. */
int st_saved_model_open(st_saved_model_t* sm, st_backend_t* be,
                        const char* path, char* err, size_t err_len);
void st_saved_model_close(st_saved_model_t* sm);

/* Makes ds (loaded without normalization) what the model was trained on:
 * refuses (err naming both) examples whose number of features is not the
 * model's inputs; rescales values that ds's loader divided by a different
 * input_scale than the model's training data (CSV pixels 0..255 for a
 * model trained on IDX images are divided by 255); applies normalize.mean
 * and normalize.std as st_data_open applied them. Once per dataset. */
int st_saved_model_prepare(const st_saved_model_t* sm, st_dataset_t* ds,
                           char* err, size_t err_len);

/* Evaluates the model on a prepared, labelled dataset: the mean loss and,
 * for classifiers, the accuracy (NaN for regression), exactly as
 * st_trainer_evaluate would for a trainer holding these parameters.
 * Refuses labels the model cannot have produced (more classes than
 * outputs; class labels for a regression model or real targets for a
 * classifier). */
int st_saved_model_evaluate(st_saved_model_t* sm, const st_dataset_t* ds,
                            double* mean_loss, double* accuracy, char* err,
                            size_t err_len);

/* The model's outputs for rows [start, start + rows) of a prepared dataset
 * into out (host memory, rows x sm->outputs floats): class probabilities
 * (softmax) for classifiers, the prediction for a regression model. At most
 * ST_SAVED_MODEL_MAX_ROWS rows a call. Returns 0 or a negative errno. */
#define ST_SAVED_MODEL_MAX_ROWS 1000
int st_saved_model_predict(st_saved_model_t* sm, const st_dataset_t* ds,
                           size_t start, size_t rows, float* out);

/* ==== Output
 * ================================================================== */

/* Writes s to f as a JSON string literal (quoted, escaped), for the
 * commands' --json output. Returns 0 or -EIO. */
int st_json_write_string(FILE* f, const char* s);

#ifdef __cplusplus
}
#endif

#endif /* STARLING_NODE_TRAIN_H */
