/* kernels.h: the tensor-math interface of starling, and its two backends.
 *
 * One interface, two backends (DESIGN.md, Layers): the CPU backend uses
 * OpenBLAS's cblas_sgemm for matrix products and plain C loops the compiler
 * vectorizes for everything else; the CUDA backend uses cuBLAS for matrix
 * products and our own kernels (kernels/cuda_backend.cu) for the rest, each
 * with its C twin in kernels/cpu_backend.c. This layer knows nothing of
 * models or networks.
 *
 * Memory. Every float* passed to an op is *device memory* of the backend it
 * is passed to: obtained from st_buf_alloc() on that backend and freed with
 * st_buf_free(). On the CPU backend device memory is ordinary host memory;
 * on CUDA it is not dereferenceable on the host. Move data across with
 * st_copy_to_device() / st_copy_to_host().
 *
 * Layout. Matrices are row-major, float32. A "rows x cols" matrix has
 * element (r, c) at [r * cols + c].
 *
 * Ordering. Ops on one backend execute in the order they are issued. CUDA
 * ops may run asynchronously; every call that returns a value to the host
 * (the reductions, st_copy_to_host, st_backend_sync) waits for all earlier
 * work first.
 *
 * Errors. Every call returns 0 or a negative errno: -EINVAL for bad
 * arguments, -ENOMEM when memory runs out, -EIO for a device error. A CUDA
 * error is returned, never turned into an exit; st_backend_last_error()
 * describes the most recent failure in words.
 */
#ifndef STARLING_KERNELS_H
#define STARLING_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct st_backend_s st_backend_t;

typedef enum { ST_BACKEND_CPU = 0, ST_BACKEND_CUDA = 1 } st_backend_kind_t;

typedef enum { ST_ACT_NONE = 0, ST_ACT_RELU = 1 } st_act_t;

/* ---- Backends ---------------------------------------------------------- */

/* Opens a backend from a device spec: "auto", "cpu", "cuda" or "cuda:N".
 * "auto" opens the first usable GPU and otherwise the CPU. `cpu_threads` is
 * the number of BLAS threads for the CPU backend (0: OpenBLAS's default).
 * On failure returns a negative errno and writes a sentence saying what was
 * wrong and what to do into `err` (may be NULL). On success *out is owned
 * by the caller and released with st_backend_close(). */
int st_backend_open(st_backend_t** out, const char* device_spec,
                    int cpu_threads, char* err, size_t err_len);

/* Releases the backend. Buffers still allocated on it must be freed first. */
void st_backend_close(st_backend_t* be);

st_backend_kind_t st_backend_kind(const st_backend_t* be);

/* One line describing the backend, e.g. "cpu (OpenBLAS, 2 threads)" or
 * "cuda:0 (NVIDIA H100 80GB HBM3, 79 GiB)". Borrowed; lives as long as be. */
const char* st_backend_describe(const st_backend_t* be);

/* The last error of this backend in words ("" when none). Borrowed. */
const char* st_backend_last_error(const st_backend_t* be);

/* Waits for all issued work to finish. */
int st_backend_sync(st_backend_t* be);

/* Number of CUDA devices usable by this build (0 if built without CUDA or
 * no driver/GPU is present). Never fails. Where the NVIDIA driver is
 * present it loads the CUDA backend module and initializes the driver in
 * this process, and CUDA does not survive fork(): a child forked after this
 * call cannot use the GPU (cudaErrorInitializationError). Without a driver
 * it maps nothing. */
int st_cuda_device_count(void);

/* ---- Memory -------------------------------------------------------------- */

/* Allocates n floats of device memory, zero-filled. n == 0 gives a valid
 * pointer that may be freed. Ownership passes to the caller. */
int st_buf_alloc(st_backend_t* be, size_t n, float** out);
void st_buf_free(st_backend_t* be, float* buf);

/* Host <-> device copies of n floats. `src`/`dst` on the host side are
 * borrowed for the duration of the call only. */
int st_copy_to_device(st_backend_t* be, float* dst, const float* src, size_t n);
int st_copy_to_host(st_backend_t* be, float* dst, const float* src, size_t n);
/* Device-to-device copy of n floats; the ranges must not overlap. */
int st_copy(st_backend_t* be, float* dst, const float* src, size_t n);
/* x[i] = value for i < n. */
int st_fill(st_backend_t* be, float* x, size_t n, float value);

/* ---- Matrix products ----------------------------------------------------- */

/* C = alpha * op(A) * op(B) + beta * C, row-major, where op(A) is M x K,
 * op(B) is K x N and C is M x N. trans_a / trans_b non-zero means A (resp.
 * B) is stored transposed (K x M, resp. N x K). Leading dimensions are the
 * row strides of the matrices as stored. Any of M, N, K may be 0. */
int st_gemm(st_backend_t* be, int trans_a, int trans_b, size_t m, size_t n,
            size_t k, float alpha, const float* a, size_t lda, const float* b,
            size_t ldb, float beta, float* c, size_t ldc);

/* ---- Elementwise and row ops ----------------------------------------------
 */

/* y[r, c] = act(y[r, c] + bias[c]) for a rows x cols matrix y. */
int st_bias_act_forward(st_backend_t* be, float* y, const float* bias,
                        size_t rows, size_t cols, st_act_t act);

/* dy[i] *= act'(y[i]), where y holds the activation's *output* (for ReLU
 * the derivative is 1 where y > 0 and 0 elsewhere). No-op for ST_ACT_NONE. */
int st_act_backward(st_backend_t* be, float* dy, const float* y, size_t n,
                    st_act_t act);

/* dbias[c] = sum over r of dy[r, c], for a rows x cols matrix dy. */
int st_bias_grad(st_backend_t* be, float* dbias, const float* dy, size_t rows,
                 size_t cols);

/* y = a * x + b * y over n elements (the averaging primitive; x may equal
 * y). */
int st_axpby(st_backend_t* be, size_t n, float a, const float* x, float b,
             float* y);

/* ---- Losses ----------------------------------------------------------------
 */

/* Softmax cross-entropy over a rows x cols matrix of logits. `labels` holds
 * one class index per row, stored as float (exact below 2^24); an index
 * outside [0, cols) is a programmer error upstream (the data loader checks
 * labels). Writes, per row, loss[r] = -log softmax(logits[r])[label[r]] and
 * overwrites `probs` (rows x cols, may alias logits) with the softmax.
 * Numerically stable (max-subtracted). */
int st_softmax_xent_forward(st_backend_t* be, const float* logits,
                            const float* labels, size_t rows, size_t cols,
                            float* probs, float* loss);

/* dlogits[r, c] = scale * (probs[r, c] - [c == label[r]]). With
 * scale = 1/rows this is the gradient of the mean loss. dlogits may alias
 * probs. */
int st_softmax_xent_backward(st_backend_t* be, float* dlogits,
                             const float* probs, const float* labels,
                             size_t rows, size_t cols, float scale);

/* Squared loss for regression, one output per row:
 * loss[r] = 0.5 * (pred[r] - target[r])^2 and
 * dpred[r] = scale * (pred[r] - target[r]). dpred may alias pred and may be
 * NULL (forward only). */
int st_mse_forward_backward(st_backend_t* be, const float* pred,
                            const float* target, size_t rows, float* loss,
                            float* dpred, float scale);

/* Counts rows whose argmax over cols equals the label (ties go to the lowest
 * index). */
int st_argmax_correct(st_backend_t* be, const float* logits,
                      const float* labels, size_t rows, size_t cols,
                      size_t* correct);

/* ---- Reductions (results on the host, accumulated in double) ------------- */

int st_sum(st_backend_t* be, const float* x, size_t n, double* out);
/* Sum of squares (the squared L2 norm). */
int st_sumsq(st_backend_t* be, const float* x, size_t n, double* out);
/* max |x[i]|; 0 for n == 0. NaN entries are ignored (use st_count_nonfinite
 * to detect them). */
int st_max_abs(st_backend_t* be, const float* x, size_t n, double* out);
/* Number of entries that are NaN or +-Inf. */
int st_count_nonfinite(st_backend_t* be, const float* x, size_t n, size_t* out);

/* ---- Optimizer updates ----------------------------------------------------
 */

/* Plain SGD with L2 weight decay folded into the gradient:
 * p -= lr * (g + wd * p). */
int st_sgd_update(st_backend_t* be, float* p, const float* g, size_t n,
                  float lr, float wd);

/* Heavy-ball momentum as PyTorch defines it, with L2 weight decay:
 *   d = g + wd * p;  v = mu * v + d;
 *   p -= lr * (nesterov ? d + mu * v : v). */
int st_momentum_update(st_backend_t* be, float* p, const float* g, float* v,
                       size_t n, float lr, float mu, float wd, int nesterov);

/* AdamW (Loshchilov & Hutter), decoupled weight decay, bias-corrected:
 *   p -= lr * wd * p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *   p -= lr * (m / bc1) / (sqrt(v / bc2) + eps)
 * with bc1 = 1 - b1^t and bc2 = 1 - b2^t supplied by the caller (t >= 1). */
int st_adamw_update(st_backend_t* be, float* p, const float* g, float* m,
                    float* v, size_t n, float lr, float b1, float b2, float eps,
                    float wd, float bc1, float bc2);

#ifdef __cplusplus
}
#endif

#endif /* STARLING_KERNELS_H */
