/* backend_internal.h: what a backend is, inside kernels/.
 *
 * A backend is a vtable of ops plus the state one implementation needs.
 * backend.c owns the public entry points of kernels.h: it checks every
 * argument once (NULL pointers, sizes that overflow, leading dimensions) and
 * returns early for empty work, so an implementation only ever sees valid,
 * non-empty calls (with two exceptions noted below). cpu_backend.c and the
 * CUDA files fill in the vtable. Internal to kernels/; the optimizer and node
 * layers include kernels.h only.
 */
#ifndef STARLING_KERNELS_BACKEND_INTERNAL_H
#define STARLING_KERNELS_BACKEND_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Longest description and error sentence a backend keeps, in bytes. */
#define ST__BACKEND_DESC_BYTES 160
#define ST__BACKEND_ERROR_BYTES 320

/* The ops of one backend. Arguments are as in kernels.h and already checked:
 * every pointer that will be touched is non-NULL and every size is non-zero,
 * except that gemm may see k == 0 (C = beta * C) and bias_grad may see
 * rows == 0 (dbias = 0). */
typedef struct {
  void (*close)(st_backend_t* be);
  int (*sync)(st_backend_t* be);
  int (*buf_alloc)(st_backend_t* be, size_t n, float** out);
  void (*buf_free)(st_backend_t* be, float* buf);
  int (*copy_to_device)(st_backend_t* be, float* dst, const float* src,
                        size_t n);
  int (*copy_to_host)(st_backend_t* be, float* dst, const float* src, size_t n);
  int (*copy)(st_backend_t* be, float* dst, const float* src, size_t n);
  int (*fill)(st_backend_t* be, float* x, size_t n, float value);
  int (*gemm)(st_backend_t* be, int trans_a, int trans_b, size_t m, size_t n,
              size_t k, float alpha, const float* a, size_t lda, const float* b,
              size_t ldb, float beta, float* c, size_t ldc);
  int (*bias_act_forward)(st_backend_t* be, float* y, const float* bias,
                          size_t rows, size_t cols, st_act_t act);
  int (*act_backward)(st_backend_t* be, float* dy, const float* y, size_t n,
                      st_act_t act);
  int (*bias_grad)(st_backend_t* be, float* dbias, const float* dy, size_t rows,
                   size_t cols);
  int (*axpby)(st_backend_t* be, size_t n, float a, const float* x, float b,
               float* y);
  int (*softmax_xent_forward)(st_backend_t* be, const float* logits,
                              const float* labels, size_t rows, size_t cols,
                              float* probs, float* loss);
  int (*softmax_xent_backward)(st_backend_t* be, float* dlogits,
                               const float* probs, const float* labels,
                               size_t rows, size_t cols, float scale);
  int (*mse_forward_backward)(st_backend_t* be, const float* pred,
                              const float* target, size_t rows, float* loss,
                              float* dpred, float scale);
  int (*argmax_correct)(st_backend_t* be, const float* logits,
                        const float* labels, size_t rows, size_t cols,
                        size_t* correct);
  int (*sum)(st_backend_t* be, const float* x, size_t n, double* out);
  int (*sumsq)(st_backend_t* be, const float* x, size_t n, double* out);
  int (*max_abs)(st_backend_t* be, const float* x, size_t n, double* out);
  int (*count_nonfinite)(st_backend_t* be, const float* x, size_t n,
                         size_t* out);
  int (*sgd_update)(st_backend_t* be, float* p, const float* g, size_t n,
                    float lr, float wd);
  int (*momentum_update)(st_backend_t* be, float* p, const float* g, float* v,
                         size_t n, float lr, float mu, float wd, int nesterov);
  int (*adamw_update)(st_backend_t* be, float* p, const float* g, float* m,
                      float* v, size_t n, float lr, float b1, float b2,
                      float eps, float wd, float bc1, float bc2);
} st_backend_ops_t;

struct st_backend_s {
  const st_backend_ops_t* ops;
  st_backend_kind_t kind;
  void* impl; /* The implementation's own state; owned by it. */
  char desc[ST__BACKEND_DESC_BYTES];
  char last_error[ST__BACKEND_ERROR_BYTES];
};

#if defined(__GNUC__)
#define ST__PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define ST__PRINTF(f, a)
#endif

/* Stores a sentence for st_backend_last_error(). */
void st__backend_set_error(st_backend_t* be, const char* fmt, ...)
    ST__PRINTF(2, 3);

/* Opens the CPU backend (cpu_backend.c). */
int st__cpu_backend_open(int cpu_threads, st_backend_t** out, char* err,
                         size_t err_len);

#ifdef ST_HAVE_CUDA
/* The CUDA backend lives in a module of its own, libstarling_cuda.so
 * (cuda_backend.cu, cuda_kernels.cu and backend_error.c, linked against
 * the CUDA runtime and cuBLAS), loaded by cuda_module.c the first time a
 * CUDA device is asked for, so that a process that never uses the GPU never
 * maps those libraries. These are the module's two entry points, found by
 * name (ST__CUDA_DEVICE_COUNT_SYM, ST__CUDA_OPEN_SYM). */

/* Number of usable CUDA devices, 0 when the driver or GPU is missing. */
int st__cuda_device_count(void);
#define ST__CUDA_DEVICE_COUNT_SYM "st__cuda_device_count"

/* Opens CUDA device `device` with its own stream and cuBLAS handle. Returns
 * -ENODEV with a sentence in err when there is no such device, -EIO when
 * the driver fails. */
int st__cuda_backend_open(int device, int cpu_threads, st_backend_t** out,
                          char* err, size_t err_len);
#define ST__CUDA_OPEN_SYM "st__cuda_backend_open"

/* The loaded module (cuda_module.c). */
typedef struct {
  int (*device_count)(void);
  int (*open)(int device, int cpu_threads, st_backend_t** out, char* err,
              size_t err_len);
} st__cuda_module_t;

/* Loads the module once (thread-safe) and returns its entry points, or
 * NULL with the reason in why: no NVIDIA driver on this machine
 * (libcuda.so.1 cannot be loaded; then the module is not even tried), or
 * the module missing or broken. */
const st__cuda_module_t* st__cuda_module(const char** why);
#endif

#ifdef __cplusplus
}
#endif

#endif /* STARLING_KERNELS_BACKEND_INTERNAL_H */
