/* train_internal.h: helpers shared by the files of node/train/; not part of
 * the public interface (train.h). */
#ifndef STARLING_NODE_TRAIN_INTERNAL_H
#define STARLING_NODE_TRAIN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "node/train/train.h"

/* Rows per forward pass during evaluation: large enough that the matrix
 * products run at full speed, small enough to bound the workspace. The
 * trainer and a saved model (saved_model.c) evaluate in the same chunks
 * (st__eval_rows), so that their sums run in the same order and agree to
 * the bit. */
#define ST__EVAL_BATCH_ROWS 1000
/* The workspace evaluation may take, in floats (16 MiB). */
#define ST__EVAL_WORKSPACE_FLOATS (1u << 22)

/* The evaluation chunk of a model: ST__EVAL_BATCH_ROWS, or fewer rows (at
 * least 64) when that many would take more than ST__EVAL_WORKSPACE_FLOATS
 * of workspace (every layer's activations and two of the widest layer per
 * row, optimizer/model.c): 1000 rows of a 10M-parameter mlp:784-4096-1664-10
 * took 59 MB, a node's largest buffer after the parameters. A function of
 * the spec alone. */
size_t st__eval_rows(const st_model_spec_t* spec);

/* The "format" metadata of a checkpoint st_trainer_save writes. */
#define ST__CHECKPOINT_FORMAT "starling-checkpoint-1"

/* st_dataset_load_idx keeping only the images i with i % shard_n ==
 * shard_k (shard_n >= 1), and counting in hist[256] (when non-NULL) the
 * pixel values of every image of the file, kept or not: the statistics of
 * the whole set without holding it as floats (data_idx.c). */
int st__dataset_load_idx_shard(st_dataset_t* ds, const char* images_path,
                               const char* labels_path, uint32_t shard_k,
                               uint32_t shard_n, uint64_t hist[256], char* err,
                               size_t err_len);

/* Copies examples [start, start + count) of ds into x (count x dim, dense
 * whether ds is or not) and y (count) (data.c). */
void st__dataset_rows(const st_dataset_t* ds, size_t start, size_t count,
                      float* x, float* y);

/* Checks the tensors of one state buffer of model m in a checkpoint (the
 * names "<prefix>layers.L.weight" and "<prefix>layers.L.bias": present,
 * of m's shapes, finite) and copies them into host (m->n_params floats),
 * laid out as the flat buffer. model: m's spec as text, for messages.
 * Returns 0 or -EINVAL with err naming the tensor
 * (trainer_checkpoint.c). */
int st__load_model_tensors(const st_model_t* m, const st_safetensors_t* st,
                           const char* path, const char* prefix,
                           const char* model, float* host, char* err,
                           size_t err_len);

/* ---- HogWild and row-by-row evaluation (hogwild.c) ---------------------- */

typedef struct st_hogwild_pool_s st_hogwild_pool_t;

/* 0 when cfg can train HogWild on be; otherwise -EINVAL and err says what
 * to change (the model, the device, the optimizer, the threads). */
int st__hogwild_check(const st_train_config_t* cfg, const st_backend_t* be,
                      char* err, size_t err_len);
/* Starts cfg.threads - 1 threads for trainer t (its model allocated). */
int st__hogwild_start(st_trainer_t* t, st_hogwild_pool_t** out, char* err,
                      size_t err_len);
/* Stops and joins the threads; p may be NULL. */
void st__hogwild_stop(st_hogwild_pool_t* p);
/* One SGD update per example t->order[start .. start + rows) at rate lr,
 * spread over the threads; returns when all are done. *loss: the mean of
 * the examples' losses (each before its own update). -EDOM (*loss NaN)
 * when some example's loss was not finite: those were not applied. */
int st__hogwild_step(st_hogwild_pool_t* p, size_t start, size_t rows, float lr,
                     double* loss);

/* True when ds is evaluated on spec row by row: sparse examples on a
 * linear model (softmax:, linear:) on the CPU, where the batched forward
 * pass would first write every example out dense. */
bool st__rowwise_eval(const st_model_spec_t* spec, const st_backend_t* be,
                      const st_dataset_t* ds);
/* Examples [start, start + rows) of ds on the model spec with params
 * (host memory): adds the summed loss to *loss_sum and the correct
 * predictions to *correct (either may be NULL); out (may be NULL) gets
 * rows x outputs: the class probabilities, or the prediction. */
int st__rowwise_evaluate(const st_model_spec_t* spec, const float* params,
                         const st_dataset_t* ds, size_t start, size_t rows,
                         double* loss_sum, size_t* correct, float* out);

#endif
