/* cpu_backend.c: the CPU backend, and the readable reference of every op.
 *
 * Matrix products go to OpenBLAS (cblas_sgemm). Everything else is a plain C
 * loop that GCC -O3 vectorizes: one pass over contiguous memory, restrict
 * pointers where the header forbids aliasing, no allocation per call. Each
 * loop is the twin of a CUDA kernel in cuda_kernels.cu and the two must
 * compute the same formula in the same precision (float arithmetic per
 * element, double accumulation for reductions and softmax row sums), which
 * the parity tests in tests/unit/test_kernels.c check.
 *
 * Reductions keep LANES independent double accumulators: GCC will not
 * reorder a single floating-point sum (that needs -ffast-math), but it does
 * vectorize LANES separate sums, which is also how the summation order
 * stays fixed and reproducible from run to run.
 */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend_internal.h"

/* Independent accumulators per reduction: 8 doubles fill two AVX2 registers
 * (one AVX-512 register), enough to hide the add latency. */
#define LANES 8

/* Buffers are aligned to a cache line so that vector loads never split
 * one. */
#define ALIGN_BYTES 64

/* The streaming loops (activations, bias, the optimizer updates, axpby) are
 * compiled three times, for AVX-512, AVX2 + FMA and baseline x86-64, and
 * the loader picks the best one the CPU has (GCC function multi-versioning
 * through an ifunc). The baseline build alone is SSE2, 4 floats wide: the
 * momentum update took 9% of an MLP training step at batch 64; see
 * docs/benchmarks.md for the before and after. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__)
#define VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define VECTOR_CLONES
#endif

/* ---- Backend and memory ------------------------------------------------- */

static void cpu_close(st_backend_t* be) {
  free(be);
}

static int cpu_sync(st_backend_t* be) {
  return 0;
}

static int cpu_buf_alloc(st_backend_t* be, size_t n, float** out) {
  size_t bytes = n * sizeof(float);
  void* p = NULL;
  if (bytes == 0)
    bytes = ALIGN_BYTES;
  if (posix_memalign(&p, ALIGN_BYTES, bytes) != 0) {
    st__backend_set_error(be, "st_buf_alloc: out of memory for %zu floats", n);
    return -ENOMEM;
  }
  memset(p, 0, bytes);
  *out = p;
  return 0;
}

static void cpu_buf_free(st_backend_t* be, float* buf) {
  free(buf);
}

static int cpu_copy(st_backend_t* be, float* dst, const float* src, size_t n) {
  memcpy(dst, src, n * sizeof(float));
  return 0;
}

static int cpu_fill(st_backend_t* be, float* restrict x, size_t n,
                    float value) {
  for (size_t i = 0; i < n; i++)
    x[i] = value;
  return 0;
}

/* ---- Matrix products ---------------------------------------------------- */

static int cpu_gemm(st_backend_t* be, int trans_a, int trans_b, size_t m,
                    size_t n, size_t k, float alpha, const float* a, size_t lda,
                    const float* b, size_t ldb, float beta, float* c,
                    size_t ldc) {
  if (k == 0) {
    /* No products to add: C = beta * C, where beta == 0 overwrites (BLAS
     * semantics: C is not read, so NaN in it does not survive). */
    for (size_t i = 0; i < m; i++) {
      float* restrict row = c + i * ldc;
      for (size_t j = 0; j < n; j++)
        row[j] = beta == 0.0f ? 0.0f : beta * row[j];
    }
    return 0;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, (blasint) m, (blasint) n,
              (blasint) k, alpha, a, (blasint) lda, b, (blasint) ldb, beta, c,
              (blasint) ldc);
  return 0;
}

/* ---- Elementwise and row ops -------------------------------------------- */

VECTOR_CLONES static int cpu_bias_act_forward(st_backend_t* be, float* y,
                                              const float* bias, size_t rows,
                                              size_t cols, st_act_t act) {
  for (size_t r = 0; r < rows; r++) {
    float* restrict yr = y + r * cols;
    const float* restrict br = bias;
    if (act == ST_ACT_RELU) {
      /* v < 0 ? 0 : v lets NaN through, so divergence stays visible. */
      for (size_t c = 0; c < cols; c++) {
        float v = yr[c] + br[c];
        yr[c] = v < 0.0f ? 0.0f : v;
      }
    } else {
      for (size_t c = 0; c < cols; c++)
        yr[c] += br[c];
    }
  }
  return 0;
}

VECTOR_CLONES static int cpu_act_backward(st_backend_t* be, float* dy,
                                          const float* y, size_t n,
                                          st_act_t act) {
  /* Only ReLU reaches here (backend.c skips ST_ACT_NONE). */
  for (size_t i = 0; i < n; i++)
    dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
  return 0;
}

VECTOR_CLONES static int cpu_bias_grad(st_backend_t* be, float* restrict dbias,
                                       const float* restrict dy, size_t rows,
                                       size_t cols) {
  /* Row by row, so the inner loop runs along contiguous memory and
   * vectorizes; float accumulation, like the CUDA twin's per-column sum. */
  for (size_t c = 0; c < cols; c++)
    dbias[c] = 0.0f;
  for (size_t r = 0; r < rows; r++) {
    const float* restrict dr = dy + r * cols;
    for (size_t c = 0; c < cols; c++)
      dbias[c] += dr[c];
  }
  return 0;
}

VECTOR_CLONES static int cpu_axpby(st_backend_t* be, size_t n, float a,
                                   const float* x, float b, float* y) {
  /* No restrict: x may equal y. */
  for (size_t i = 0; i < n; i++)
    y[i] = a * x[i] + b * y[i];
  return 0;
}

/* ---- Losses ------------------------------------------------------------- */

/* The class index stored in a float label, or cols when it is not a valid
 * index (then the row's loss becomes NaN instead of reading out of
 * bounds). */
static size_t label_index(float label, size_t cols) {
  if (!(label >= 0.0f) || !(label < (float) cols))
    return cols;
  size_t idx = (size_t) label;
  return idx < cols ? idx : cols;
}

static int cpu_softmax_xent_forward(st_backend_t* be, const float* logits,
                                    const float* labels, size_t rows,
                                    size_t cols, float* probs, float* loss) {
  /* probs may alias logits: each pass reads element c before writing it,
   * and z[label] is read before any write. */
  for (size_t r = 0; r < rows; r++) {
    const float* z = logits + r * cols;
    float* p = probs + r * cols;
    float zmax = z[0];
    for (size_t c = 1; c < cols; c++)
      zmax = z[c] > zmax ? z[c] : zmax;
    size_t lab = label_index(labels[r], cols);
    float zlab = lab < cols ? z[lab] : NAN;
    double sum = 0.0;
    for (size_t c = 0; c < cols; c++) {
      float e = expf(z[c] - zmax);
      p[c] = e;
      sum += e;
    }
    float inv = (float) (1.0 / sum);
    for (size_t c = 0; c < cols; c++)
      p[c] *= inv;
    /* -log(e^(zlab - zmax) / sum), never through log(p) (p underflows). */
    loss[r] = (float) (log(sum) - ((double) zlab - (double) zmax));
  }
  return 0;
}

static int cpu_softmax_xent_backward(st_backend_t* be, float* dlogits,
                                     const float* probs, const float* labels,
                                     size_t rows, size_t cols, float scale) {
  for (size_t r = 0; r < rows; r++) {
    const float* p = probs + r * cols;
    float* d = dlogits + r * cols;
    size_t lab = label_index(labels[r], cols);
    /* d may alias p: read p[lab] before the row is overwritten. */
    float plab = lab < cols ? p[lab] : 0.0f;
    for (size_t c = 0; c < cols; c++)
      d[c] = scale * p[c];
    if (lab < cols)
      d[lab] = scale * (plab - 1.0f);
  }
  return 0;
}

static int cpu_mse_forward_backward(st_backend_t* be, const float* pred,
                                    const float* target, size_t rows,
                                    float* loss, float* dpred, float scale) {
  for (size_t r = 0; r < rows; r++) {
    float diff = pred[r] - target[r];
    loss[r] = 0.5f * diff * diff;
    if (dpred != NULL)
      dpred[r] = scale * diff;
  }
  return 0;
}

static int cpu_argmax_correct(st_backend_t* be, const float* logits,
                              const float* labels, size_t rows, size_t cols,
                              size_t* correct) {
  size_t count = 0;
  for (size_t r = 0; r < rows; r++) {
    const float* z = logits + r * cols;
    size_t best = 0;
    for (size_t c = 1; c < cols; c++)
      if (z[c] > z[best])
        best = c; /* strict: ties keep the lowest index */
    count += best == label_index(labels[r], cols);
  }
  *correct = count;
  return 0;
}

/* ---- Reductions --------------------------------------------------------- */

static int cpu_sum(st_backend_t* be, const float* restrict x, size_t n,
                   double* out) {
  double acc[LANES] = {0};
  size_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int j = 0; j < LANES; j++)
      acc[j] += x[i + j];
  double s = 0.0;
  for (; i < n; i++)
    s += x[i];
  for (int j = 0; j < LANES; j++)
    s += acc[j];
  *out = s;
  return 0;
}

static int cpu_sumsq(st_backend_t* be, const float* restrict x, size_t n,
                     double* out) {
  double acc[LANES] = {0};
  size_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int j = 0; j < LANES; j++) {
      double v = x[i + j];
      acc[j] += v * v;
    }
  double s = 0.0;
  for (; i < n; i++)
    s += (double) x[i] * x[i];
  for (int j = 0; j < LANES; j++)
    s += acc[j];
  *out = s;
  return 0;
}

static int cpu_max_abs(st_backend_t* be, const float* restrict x, size_t n,
                       double* out) {
  /* a > m ? a : m is false for NaN, so NaN never wins. The max of floats
   * is exact in float; only the result is widened. */
  float acc[LANES] = {0};
  size_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int j = 0; j < LANES; j++) {
      float a = fabsf(x[i + j]);
      acc[j] = a > acc[j] ? a : acc[j];
    }
  float m = 0.0f;
  for (; i < n; i++) {
    float a = fabsf(x[i]);
    m = a > m ? a : m;
  }
  for (int j = 0; j < LANES; j++)
    m = acc[j] > m ? acc[j] : m;
  *out = m;
  return 0;
}

static int cpu_count_nonfinite(st_backend_t* be, const float* restrict x,
                               size_t n, size_t* out) {
  /* NaN and +-Inf are the floats whose exponent bits are all ones; testing
   * the bits vectorizes, isfinite() may not. */
  const uint32_t exp_mask = 0x7f800000u;
  size_t acc[LANES] = {0};
  size_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int j = 0; j < LANES; j++) {
      uint32_t u;
      memcpy(&u, &x[i + j], sizeof(u));
      acc[j] += (u & exp_mask) == exp_mask;
    }
  size_t count = 0;
  for (; i < n; i++) {
    uint32_t u;
    memcpy(&u, &x[i], sizeof(u));
    count += (u & exp_mask) == exp_mask;
  }
  for (int j = 0; j < LANES; j++)
    count += acc[j];
  *out = count;
  return 0;
}

/* ---- Optimizer updates -------------------------------------------------- */

VECTOR_CLONES static int cpu_sgd_update(st_backend_t* be, float* restrict p,
                                        const float* restrict g, size_t n,
                                        float lr, float wd) {
  for (size_t i = 0; i < n; i++)
    p[i] -= lr * (g[i] + wd * p[i]);
  return 0;
}

VECTOR_CLONES static int cpu_momentum_update(
    st_backend_t* be, float* restrict p, const float* restrict g,
    float* restrict v, size_t n, float lr, float mu, float wd, int nesterov) {
  if (nesterov) {
    for (size_t i = 0; i < n; i++) {
      float d = g[i] + wd * p[i];
      float vi = mu * v[i] + d;
      v[i] = vi;
      p[i] -= lr * (d + mu * vi);
    }
  } else {
    for (size_t i = 0; i < n; i++) {
      float d = g[i] + wd * p[i];
      float vi = mu * v[i] + d;
      v[i] = vi;
      p[i] -= lr * vi;
    }
  }
  return 0;
}

/* Vectorized only because CMake builds kernels/ with -fno-math-errno:
 * otherwise sqrtf may set errno and GCC 12 keeps the loop scalar (765 ->
 * 186 us per step for the 235k parameters of the 784-256-128-10 MLP, SSE2).
 * The function attribute optimize("no-math-errno") does not help. */
VECTOR_CLONES static int cpu_adamw_update(st_backend_t* be, float* restrict p,
                                          const float* restrict g,
                                          float* restrict m, float* restrict v,
                                          size_t n, float lr, float b1,
                                          float b2, float eps, float wd,
                                          float bc1, float bc2) {
  /* Divisions by the bias corrections become products, once per call. */
  float inv_bc1 = 1.0f / bc1, inv_bc2 = 1.0f / bc2;
  float decay = 1.0f - lr * wd;
  for (size_t i = 0; i < n; i++) {
    float gi = g[i];
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = decay * p[i] - lr * (mi * inv_bc1) / (sqrtf(vi * inv_bc2) + eps);
  }
  return 0;
}

/* ---- Opening ------------------------------------------------------------ */

static const st_backend_ops_t cpu_ops = {
    .close = cpu_close,
    .sync = cpu_sync,
    .buf_alloc = cpu_buf_alloc,
    .buf_free = cpu_buf_free,
    .copy_to_device = cpu_copy,
    .copy_to_host = cpu_copy,
    .copy = cpu_copy,
    .fill = cpu_fill,
    .gemm = cpu_gemm,
    .bias_act_forward = cpu_bias_act_forward,
    .act_backward = cpu_act_backward,
    .bias_grad = cpu_bias_grad,
    .axpby = cpu_axpby,
    .softmax_xent_forward = cpu_softmax_xent_forward,
    .softmax_xent_backward = cpu_softmax_xent_backward,
    .mse_forward_backward = cpu_mse_forward_backward,
    .argmax_correct = cpu_argmax_correct,
    .sum = cpu_sum,
    .sumsq = cpu_sumsq,
    .max_abs = cpu_max_abs,
    .count_nonfinite = cpu_count_nonfinite,
    .sgd_update = cpu_sgd_update,
    .momentum_update = cpu_momentum_update,
    .adamw_update = cpu_adamw_update,
};

int st__cpu_backend_open(int cpu_threads, st_backend_t** out, char* err,
                         size_t err_len) {
  st_backend_t* be = calloc(1, sizeof(*be));
  if (be == NULL) {
    st_set_err(err, err_len, "out of memory opening the CPU backend");
    return -ENOMEM;
  }
  be->ops = &cpu_ops;
  be->kind = ST_BACKEND_CPU;
  /* OpenBLAS's thread count is process-wide; the last backend opened with
   * an explicit count sets it. */
  if (cpu_threads > 0)
    openblas_set_num_threads(cpu_threads);
  int threads = openblas_get_num_threads();
  snprintf(be->desc, sizeof(be->desc), "cpu (OpenBLAS, %d thread%s)", threads,
           threads == 1 ? "" : "s");
  *out = be;
  return 0;
}
