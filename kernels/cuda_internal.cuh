/* cuda_internal.cuh: state and launchers shared by the two CUDA files.
 *
 * cuda_backend.cu opens the device (stream, cuBLAS handle, scratch memory),
 * moves memory and runs matrix products; cuda_kernels.cu holds our own
 * kernels, each with a host launcher named after it (fill_kernel ->
 * st__cuda_fill). The launchers have the signatures of the vtable in
 * backend_internal.h so that the vtable points at them directly. Included by
 * .cu files only.
 */
#ifndef STARLING_KERNELS_CUDA_INTERNAL_CUH
#define STARLING_KERNELS_CUDA_INTERNAL_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "kernels/backend_internal.h"

/* Threads per block for every kernel: 8 warps, a multiple of the warp size
 * that keeps occupancy high on sm_80/sm_90 without tuning per kernel. */
#define ST__CUDA_THREADS 256

/* Blocks of the first pass of a reduction. 256 blocks of 256 threads keep
 * an H100's 132 SMs busy; the second pass is one block that folds the 256
 * partial results, so the summation order depends on n only and a
 * reduction gives the same bits on every run. */
#define ST__CUDA_REDUCE_BLOCKS 256

/* Scratch for reductions: the partials plus one result slot, 8 bytes each
 * (double or unsigned long long). */
#define ST__CUDA_SCRATCH_BYTES ((ST__CUDA_REDUCE_BLOCKS + 1) * 8)

typedef struct {
  int device;
  cudaStream_t stream; /* every op of this backend runs on it, in order */
  cublasHandle_t blas; /* bound to stream */
  void* scratch;       /* device, ST__CUDA_SCRATCH_BYTES */
  void* host_result;   /* pinned host, 8 bytes: reduction results */
} st__cuda_t;

static inline st__cuda_t* st__cuda(st_backend_t* be) {
  return (st__cuda_t*) be->impl;
}

/* 0 when e is cudaSuccess; otherwise stores "what: error name: text" as the
 * backend's last error and returns -EIO. */
int st__cuda_check(st_backend_t* be, cudaError_t e, const char* what);

/* Makes the backend's device current for this host thread (a process may
 * hold backends on several devices). */
int st__cuda_enter(st_backend_t* be);

/* ---- Launchers (cuda_kernels.cu) ----------------------------------------- */

int st__cuda_fill(st_backend_t* be, float* x, size_t n, float value);
/* c[i, j] = beta * c[i, j] for an m x n matrix with row stride ldc (0 when
 * beta == 0): the gemm with k == 0, which cuBLAS is not asked to do. */
int st__cuda_scale_matrix(st_backend_t* be, float* c, size_t m, size_t n,
                          size_t ldc, float beta);
int st__cuda_bias_act_forward(st_backend_t* be, float* y, const float* bias,
                              size_t rows, size_t cols, st_act_t act);
int st__cuda_act_backward(st_backend_t* be, float* dy, const float* y, size_t n,
                          st_act_t act);
int st__cuda_bias_grad(st_backend_t* be, float* dbias, const float* dy,
                       size_t rows, size_t cols);
int st__cuda_axpby(st_backend_t* be, size_t n, float a, const float* x, float b,
                   float* y);
int st__cuda_softmax_xent_forward(st_backend_t* be, const float* logits,
                                  const float* labels, size_t rows, size_t cols,
                                  float* probs, float* loss);
int st__cuda_softmax_xent_backward(st_backend_t* be, float* dlogits,
                                   const float* probs, const float* labels,
                                   size_t rows, size_t cols, float scale);
int st__cuda_mse_forward_backward(st_backend_t* be, const float* pred,
                                  const float* target, size_t rows, float* loss,
                                  float* dpred, float scale);
int st__cuda_argmax_correct(st_backend_t* be, const float* logits,
                            const float* labels, size_t rows, size_t cols,
                            size_t* correct);
int st__cuda_sum(st_backend_t* be, const float* x, size_t n, double* out);
int st__cuda_sumsq(st_backend_t* be, const float* x, size_t n, double* out);
int st__cuda_max_abs(st_backend_t* be, const float* x, size_t n, double* out);
int st__cuda_count_nonfinite(st_backend_t* be, const float* x, size_t n,
                             size_t* out);
int st__cuda_sgd_update(st_backend_t* be, float* p, const float* g, size_t n,
                        float lr, float wd);
int st__cuda_momentum_update(st_backend_t* be, float* p, const float* g,
                             float* v, size_t n, float lr, float mu, float wd,
                             int nesterov);
int st__cuda_adamw_update(st_backend_t* be, float* p, const float* g, float* m,
                          float* v, size_t n, float lr, float b1, float b2,
                          float eps, float wd, float bc1, float bc2);

#endif /* STARLING_KERNELS_CUDA_INTERNAL_CUH */
