/* train_internal.h: helpers shared by the files of node/train/; not part of
 * the public interface (train.h). */
#ifndef STARLING_NODE_TRAIN_INTERNAL_H
#define STARLING_NODE_TRAIN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "node/train/train.h"

/* st_dataset_load_idx keeping only the images i with i % shard_n ==
 * shard_k (shard_n >= 1), and counting in hist[256] (when non-NULL) the
 * pixel values of every image of the file, kept or not: the statistics of
 * the whole set without holding it as floats (data_idx.c). */
int st__dataset_load_idx_shard(st_dataset_t* ds, const char* images_path,
                               const char* labels_path, uint32_t shard_k,
                               uint32_t shard_n, uint64_t hist[256], char* err,
                               size_t err_len);

#endif
