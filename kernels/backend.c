/* backend.c: the public entry points of kernels.h.
 *
 * Opens a backend from a device spec ("auto", "cpu", "cuda", "cuda:N"),
 * checks the arguments of every op once, returns early for empty work and
 * dispatches the rest through the backend's vtable (backend_internal.h).
 * Implementations therefore never see NULL buffers or zero sizes, which
 * matters on CUDA, where a launch of zero blocks is itself an error.
 */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "kernels/backend_internal.h"

/* ---- Errors ------------------------------------------------------------- */

/* Records why an argument check failed and returns -EINVAL. */
static int bad_arg(st_backend_t* be, const char* op, const char* why) {
  st__backend_set_error(be, "%s: %s", op, why);
  return -EINVAL;
}

/* *out = a * b, or -1 when that overflows size_t. */
static int mul_size(size_t a, size_t b, size_t* out) {
  if (a != 0 && b > SIZE_MAX / a)
    return -1;
  *out = a * b;
  return 0;
}

/* ---- Opening ------------------------------------------------------------ */

#define VALID_SPECS                                                       \
  "valid devices are auto, cpu, cuda and cuda:N (N a device index, e.g. " \
  "cuda:0)"

/* Parses the N of "cuda:N": decimal digits only, no sign, no spaces. */
static int parse_index(const char* s, int* out) {
  long v = 0;
  if (*s == '\0')
    return -1;
  for (; *s != '\0'; s++) {
    if (*s < '0' || *s > '9')
      return -1;
    v = v * 10 + (*s - '0');
    if (v > INT_MAX)
      return -1;
  }
  *out = (int) v;
  return 0;
}

static int open_cuda(int device, int cpu_threads, const char* spec,
                     st_backend_t** out, char* err, size_t err_len) {
#ifdef ST_HAVE_CUDA
  const char* why = "";
  const st__cuda_module_t* cu = st__cuda_module(&why);
  if (cu == NULL) {
    st_set_err(err, err_len, "cannot open %s: %s; use --device cpu", spec, why);
    return -ENODEV;
  }
  return cu->open(device, cpu_threads, out, err, err_len);
#else
  (void) device;
  (void) cpu_threads;
  (void) out;
  st_set_err(err, err_len,
             "device \"%s\" needs CUDA, but this build of starling has no "
             "CUDA backend (nvcc was not found when it was built); use "
             "--device cpu, or rebuild on a machine with the CUDA toolkit",
             spec);
  return -ENODEV;
#endif
}

int st_backend_open(st_backend_t** out, const char* device_spec,
                    int cpu_threads, char* err, size_t err_len) {
  if (err != NULL && err_len > 0)
    err[0] = '\0';
  if (out == NULL) {
    st_set_err(err, err_len, "st_backend_open: out is NULL");
    return -EINVAL;
  }
  *out = NULL;
  if (device_spec == NULL) {
    st_set_err(err, err_len, "no device given; " VALID_SPECS);
    return -EINVAL;
  }
  if (cpu_threads < 0) {
    st_set_err(err, err_len,
               "cpu threads must be 0 (OpenBLAS's default) or positive, "
               "not %d",
               cpu_threads);
    return -EINVAL;
  }
  if (strcmp(device_spec, "cpu") == 0)
    return st__cpu_backend_open(cpu_threads, out, err, err_len);
  if (strcmp(device_spec, "auto") == 0) {
    if (st_cuda_device_count() > 0 &&
        open_cuda(0, cpu_threads, "auto", out, NULL, 0) == 0)
      return 0;
    return st__cpu_backend_open(cpu_threads, out, err, err_len);
  }
  if (strcmp(device_spec, "cuda") == 0)
    return open_cuda(0, cpu_threads, device_spec, out, err, err_len);
  if (strncmp(device_spec, "cuda:", 5) == 0) {
    int device;
    if (parse_index(device_spec + 5, &device) != 0) {
      st_set_err(err, err_len,
                 "bad device \"%s\": the index after \"cuda:\" must be a "
                 "non-negative whole number; " VALID_SPECS,
                 device_spec);
      return -EINVAL;
    }
    return open_cuda(device, cpu_threads, device_spec, out, err, err_len);
  }
  st_set_err(err, err_len, "unknown device \"%s\"; " VALID_SPECS, device_spec);
  return -EINVAL;
}

void st_backend_close(st_backend_t* be) {
  if (be != NULL)
    be->ops->close(be);
}

st_backend_kind_t st_backend_kind(const st_backend_t* be) {
  return be->kind;
}

const char* st_backend_describe(const st_backend_t* be) {
  return be->desc;
}

const char* st_backend_last_error(const st_backend_t* be) {
  return be->last_error;
}

int st_backend_sync(st_backend_t* be) {
  if (be == NULL)
    return -EINVAL;
  return be->ops->sync(be);
}

int st_cuda_device_count(void) {
#ifdef ST_HAVE_CUDA
  const st__cuda_module_t* cu = st__cuda_module(NULL);
  return cu != NULL ? cu->device_count() : 0;
#else
  return 0;
#endif
}

/* ---- Memory ------------------------------------------------------------- */

int st_buf_alloc(st_backend_t* be, size_t n, float** out) {
  if (be == NULL || out == NULL)
    return -EINVAL;
  *out = NULL;
  if (n > SIZE_MAX / sizeof(float)) {
    st__backend_set_error(be, "st_buf_alloc: %zu floats do not fit in memory",
                          n);
    return -ENOMEM;
  }
  return be->ops->buf_alloc(be, n, out);
}

void st_buf_free(st_backend_t* be, float* buf) {
  if (be != NULL && buf != NULL)
    be->ops->buf_free(be, buf);
}

int st_copy_to_device(st_backend_t* be, float* dst, const float* src,
                      size_t n) {
  if (be == NULL)
    return -EINVAL;
  if (n == 0)
    return 0;
  if (dst == NULL || src == NULL)
    return bad_arg(be, "st_copy_to_device", "NULL buffer with n > 0");
  return be->ops->copy_to_device(be, dst, src, n);
}

int st_copy_to_host(st_backend_t* be, float* dst, const float* src, size_t n) {
  if (be == NULL)
    return -EINVAL;
  if (n == 0)
    return 0;
  if (dst == NULL || src == NULL)
    return bad_arg(be, "st_copy_to_host", "NULL buffer with n > 0");
  return be->ops->copy_to_host(be, dst, src, n);
}

int st_copy(st_backend_t* be, float* dst, const float* src, size_t n) {
  if (be == NULL)
    return -EINVAL;
  if (n == 0)
    return 0;
  if (dst == NULL || src == NULL)
    return bad_arg(be, "st_copy", "NULL buffer with n > 0");
  return be->ops->copy(be, dst, src, n);
}

int st_fill(st_backend_t* be, float* x, size_t n, float value) {
  if (be == NULL)
    return -EINVAL;
  if (n == 0)
    return 0;
  if (x == NULL)
    return bad_arg(be, "st_fill", "NULL buffer with n > 0");
  return be->ops->fill(be, x, n, value);
}

/* ---- Matrix products ---------------------------------------------------- */

int st_gemm(st_backend_t* be, int trans_a, int trans_b, size_t m, size_t n,
            size_t k, float alpha, const float* a, size_t lda, const float* b,
            size_t ldb, float beta, float* c, size_t ldc) {
  if (be == NULL)
    return -EINVAL;
  /* BLAS (cuBLAS and OpenBLAS alike) takes int sizes. */
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX ||
      ldb > INT_MAX || ldc > INT_MAX)
    return bad_arg(be, "st_gemm", "a size or leading dimension exceeds 2^31");
  if (m == 0 || n == 0)
    return 0;
  if (c == NULL)
    return bad_arg(be, "st_gemm", "c is NULL");
  if (ldc < n)
    return bad_arg(be, "st_gemm", "ldc is smaller than n");
  if (k > 0) {
    if (a == NULL || b == NULL)
      return bad_arg(be, "st_gemm", "a or b is NULL with k > 0");
    /* Stored A is m x k (k x m when transposed); stored B is k x n (n x k
     * when transposed). A leading dimension is at least the stored row. */
    if (lda < (trans_a ? m : k))
      return bad_arg(be, "st_gemm", "lda is smaller than a row of A");
    if (ldb < (trans_b ? k : n))
      return bad_arg(be, "st_gemm", "ldb is smaller than a row of B");
  }
  return be->ops->gemm(be, trans_a != 0, trans_b != 0, m, n, k, alpha, a, lda,
                       b, ldb, beta, c, ldc);
}

/* ---- Elementwise and row ops -------------------------------------------- */

static int check_act(st_backend_t* be, const char* op, st_act_t act) {
  if (act != ST_ACT_NONE && act != ST_ACT_RELU)
    return bad_arg(be, op, "unknown activation");
  return 0;
}

int st_bias_act_forward(st_backend_t* be, float* y, const float* bias,
                        size_t rows, size_t cols, st_act_t act) {
  size_t total;
  if (be == NULL)
    return -EINVAL;
  if (check_act(be, "st_bias_act_forward", act) != 0)
    return -EINVAL;
  if (mul_size(rows, cols, &total) != 0)
    return bad_arg(be, "st_bias_act_forward", "rows * cols overflows");
  if (total == 0)
    return 0;
  if (y == NULL || bias == NULL)
    return bad_arg(be, "st_bias_act_forward", "NULL buffer with work to do");
  return be->ops->bias_act_forward(be, y, bias, rows, cols, act);
}

int st_act_backward(st_backend_t* be, float* dy, const float* y, size_t n,
                    st_act_t act) {
  if (be == NULL)
    return -EINVAL;
  if (check_act(be, "st_act_backward", act) != 0)
    return -EINVAL;
  if (n == 0 || act == ST_ACT_NONE)
    return 0;
  if (dy == NULL || y == NULL)
    return bad_arg(be, "st_act_backward", "NULL buffer with n > 0");
  return be->ops->act_backward(be, dy, y, n, act);
}

int st_bias_grad(st_backend_t* be, float* dbias, const float* dy, size_t rows,
                 size_t cols) {
  size_t total;
  if (be == NULL)
    return -EINVAL;
  if (mul_size(rows, cols, &total) != 0)
    return bad_arg(be, "st_bias_grad", "rows * cols overflows");
  /* rows == 0 still has work: the sum over no rows is 0. */
  if (cols == 0)
    return 0;
  if (dbias == NULL || (rows > 0 && dy == NULL))
    return bad_arg(be, "st_bias_grad", "NULL buffer with work to do");
  return be->ops->bias_grad(be, dbias, dy, rows, cols);
}

int st_axpby(st_backend_t* be, size_t n, float a, const float* x, float b,
             float* y) {
  if (be == NULL)
    return -EINVAL;
  if (n == 0)
    return 0;
  if (x == NULL || y == NULL)
    return bad_arg(be, "st_axpby", "NULL buffer with n > 0");
  return be->ops->axpby(be, n, a, x, b, y);
}

/* ---- Losses ------------------------------------------------------------- */

int st_softmax_xent_forward(st_backend_t* be, const float* logits,
                            const float* labels, size_t rows, size_t cols,
                            float* probs, float* loss) {
  size_t total;
  if (be == NULL)
    return -EINVAL;
  if (mul_size(rows, cols, &total) != 0)
    return bad_arg(be, "st_softmax_xent_forward", "rows * cols overflows");
  if (rows == 0)
    return 0;
  if (cols == 0)
    return bad_arg(be, "st_softmax_xent_forward", "cols is 0 with rows > 0");
  if (logits == NULL || labels == NULL || probs == NULL || loss == NULL)
    return bad_arg(be, "st_softmax_xent_forward", "NULL buffer with rows > 0");
  return be->ops->softmax_xent_forward(be, logits, labels, rows, cols, probs,
                                       loss);
}

int st_softmax_xent_backward(st_backend_t* be, float* dlogits,
                             const float* probs, const float* labels,
                             size_t rows, size_t cols, float scale) {
  size_t total;
  if (be == NULL)
    return -EINVAL;
  if (mul_size(rows, cols, &total) != 0)
    return bad_arg(be, "st_softmax_xent_backward", "rows * cols overflows");
  if (total == 0)
    return 0;
  if (dlogits == NULL || probs == NULL || labels == NULL)
    return bad_arg(be, "st_softmax_xent_backward", "NULL buffer with work");
  return be->ops->softmax_xent_backward(be, dlogits, probs, labels, rows, cols,
                                        scale);
}

int st_mse_forward_backward(st_backend_t* be, const float* pred,
                            const float* target, size_t rows, float* loss,
                            float* dpred, float scale) {
  if (be == NULL)
    return -EINVAL;
  if (rows == 0)
    return 0;
  if (pred == NULL || target == NULL || loss == NULL)
    return bad_arg(be, "st_mse_forward_backward", "NULL buffer with rows > 0");
  return be->ops->mse_forward_backward(be, pred, target, rows, loss, dpred,
                                       scale);
}

int st_argmax_correct(st_backend_t* be, const float* logits,
                      const float* labels, size_t rows, size_t cols,
                      size_t* correct) {
  size_t total;
  if (be == NULL || correct == NULL)
    return -EINVAL;
  *correct = 0;
  if (mul_size(rows, cols, &total) != 0)
    return bad_arg(be, "st_argmax_correct", "rows * cols overflows");
  if (total == 0)
    return 0;
  if (logits == NULL || labels == NULL)
    return bad_arg(be, "st_argmax_correct", "NULL buffer with work to do");
  return be->ops->argmax_correct(be, logits, labels, rows, cols, correct);
}

/* ---- Reductions --------------------------------------------------------- */

int st_sum(st_backend_t* be, const float* x, size_t n, double* out) {
  if (be == NULL || out == NULL)
    return -EINVAL;
  *out = 0.0;
  if (n == 0)
    return 0;
  if (x == NULL)
    return bad_arg(be, "st_sum", "NULL buffer with n > 0");
  return be->ops->sum(be, x, n, out);
}

int st_sumsq(st_backend_t* be, const float* x, size_t n, double* out) {
  if (be == NULL || out == NULL)
    return -EINVAL;
  *out = 0.0;
  if (n == 0)
    return 0;
  if (x == NULL)
    return bad_arg(be, "st_sumsq", "NULL buffer with n > 0");
  return be->ops->sumsq(be, x, n, out);
}

int st_max_abs(st_backend_t* be, const float* x, size_t n, double* out) {
  if (be == NULL || out == NULL)
    return -EINVAL;
  *out = 0.0;
  if (n == 0)
    return 0;
  if (x == NULL)
    return bad_arg(be, "st_max_abs", "NULL buffer with n > 0");
  return be->ops->max_abs(be, x, n, out);
}

int st_count_nonfinite(st_backend_t* be, const float* x, size_t n,
                       size_t* out) {
  if (be == NULL || out == NULL)
    return -EINVAL;
  *out = 0;
  if (n == 0)
    return 0;
  if (x == NULL)
    return bad_arg(be, "st_count_nonfinite", "NULL buffer with n > 0");
  return be->ops->count_nonfinite(be, x, n, out);
}

/* ---- Optimizer updates -------------------------------------------------- */

int st_sgd_update(st_backend_t* be, float* p, const float* g, size_t n,
                  float lr, float wd) {
  if (be == NULL)
    return -EINVAL;
  if (n == 0)
    return 0;
  if (p == NULL || g == NULL)
    return bad_arg(be, "st_sgd_update", "NULL buffer with n > 0");
  return be->ops->sgd_update(be, p, g, n, lr, wd);
}

int st_momentum_update(st_backend_t* be, float* p, const float* g, float* v,
                       size_t n, float lr, float mu, float wd, int nesterov) {
  if (be == NULL)
    return -EINVAL;
  if (n == 0)
    return 0;
  if (p == NULL || g == NULL || v == NULL)
    return bad_arg(be, "st_momentum_update", "NULL buffer with n > 0");
  return be->ops->momentum_update(be, p, g, v, n, lr, mu, wd, nesterov != 0);
}

int st_adamw_update(st_backend_t* be, float* p, const float* g, float* m,
                    float* v, size_t n, float lr, float b1, float b2, float eps,
                    float wd, float bc1, float bc2) {
  if (be == NULL)
    return -EINVAL;
  if (n == 0)
    return 0;
  if (p == NULL || g == NULL || m == NULL || v == NULL)
    return bad_arg(be, "st_adamw_update", "NULL buffer with n > 0");
  if (!(bc1 > 0.0f) || !(bc2 > 0.0f))
    return bad_arg(be, "st_adamw_update",
                   "bias corrections must be positive (step t >= 1)");
  return be->ops->adamw_update(be, p, g, m, v, n, lr, b1, b2, eps, wd, bc1,
                               bc2);
}
