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
 * trainer and a saved model (saved_model.c) evaluate in the same chunks, so
 * that their sums run in the same order and agree to the bit. */
#define ST__EVAL_BATCH_ROWS 1000

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

#endif
