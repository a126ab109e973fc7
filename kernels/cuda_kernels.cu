/* cuda_kernels.cu: our CUDA kernels, each with its host launcher.
 *
 * Every kernel here is the twin of a loop in cpu_backend.c and computes the
 * same formula in the same precision (float per element, double for the
 * reductions and softmax row sums), so that the parity tests can hold the
 * two to a tight tolerance. Kernels walk their data with grid-stride loops,
 * so any n works with a bounded grid; launchers are never called with
 * n == 0 (backend.c returns early), because a launch of zero blocks is an
 * error. A launcher issues its work on the backend's stream and returns
 * -EIO with a sentence for st_backend_last_error() if the launch fails.
 */
#include <errno.h>
#include <math.h>

#include "kernels/cuda_internal.cuh"

#define THREADS ST__CUDA_THREADS
#define WARP 32

/* Bound on the grid of an elementwise kernel: 65535 blocks of 256 threads
 * cover 16.7M elements per sweep, far past what it takes to fill an H100;
 * larger n just loops. */
#define MAX_BLOCKS 65535

/* for (i over [0, n) assigned to this thread, grid-stride) */
#define GRID_STRIDE(i, n)                                                  \
  for (size_t i = blockIdx.x * (size_t) blockDim.x + threadIdx.x; i < (n); \
       i += (size_t) blockDim.x * gridDim.x)

static unsigned grid_for(size_t n) {
  size_t blocks = (n + THREADS - 1) / THREADS;
  return (unsigned) (blocks < MAX_BLOCKS ? blocks : MAX_BLOCKS);
}

/* Starts a launch on the backend's device; returns its stream through s. */
static int begin(st_backend_t* be, cudaStream_t* s) {
  *s = st__cuda(be)->stream;
  return st__cuda_enter(be);
}

/* Checks the launch that was just issued. */
static int launched(st_backend_t* be, const char* kernel) {
  return st__cuda_check(be, cudaGetLastError(), kernel);
}

/* The class index of a float label, cols when invalid (twin of
 * label_index in cpu_backend.c). */
__device__ static size_t label_index(float label, size_t cols) {
  if (!(label >= 0.0f) || !(label < (float) cols))
    return cols;
  size_t idx = (size_t) label;
  return idx < cols ? idx : cols;
}

/* ---- Fill and the k == 0 gemm ------------------------------------------- */

__global__ static void fill_kernel(float* x, size_t n, float value) {
  GRID_STRIDE(i, n) x[i] = value;
}

int st__cuda_fill(st_backend_t* be, float* x, size_t n, float value) {
  cudaStream_t s;
  int rc = begin(be, &s);
  if (rc != 0)
    return rc;
  fill_kernel<<<grid_for(n), THREADS, 0, s>>>(x, n, value);
  return launched(be, "fill_kernel");
}

__global__ static void scale_matrix_kernel(float* c, size_t m, size_t n,
                                           size_t ldc, float beta) {
  GRID_STRIDE(i, m * n) {
    float* e = c + (i / n) * ldc + i % n;
    *e = beta == 0.0f ? 0.0f : beta * *e;
  }
}

int st__cuda_scale_matrix(st_backend_t* be, float* c, size_t m, size_t n,
                          size_t ldc, float beta) {
  cudaStream_t s;
  int rc = begin(be, &s);
  if (rc != 0)
    return rc;
  scale_matrix_kernel<<<grid_for(m * n), THREADS, 0, s>>>(c, m, n, ldc, beta);
  return launched(be, "scale_matrix_kernel");
}

/* ---- Elementwise and row ops -------------------------------------------- */

__global__ static void bias_act_forward_kernel(float* y, const float* bias,
                                               size_t rows, size_t cols,
                                               int relu) {
  GRID_STRIDE(i, rows * cols) {
    float v = y[i] + bias[i % cols];
    y[i] = relu && v < 0.0f ? 0.0f : v;
  }
}

int st__cuda_bias_act_forward(st_backend_t* be, float* y, const float* bias,
                              size_t rows, size_t cols, st_act_t act) {
  cudaStream_t s;
  int rc = begin(be, &s);
  if (rc != 0)
    return rc;
  bias_act_forward_kernel<<<grid_for(rows * cols), THREADS, 0, s>>>(
      y, bias, rows, cols, act == ST_ACT_RELU);
  return launched(be, "bias_act_forward_kernel");
}

__global__ static void act_backward_kernel(float* dy, const float* y,
                                           size_t n) {
  GRID_STRIDE(i, n) dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

int st__cuda_act_backward(st_backend_t* be, float* dy, const float* y, size_t n,
                          st_act_t act) {
  cudaStream_t s;
  int rc = begin(be, &s);
  if (rc != 0)
    return rc;
  (void) act; /* only ReLU reaches here */
  act_backward_kernel<<<grid_for(n), THREADS, 0, s>>>(dy, y, n);
  return launched(be, "act_backward_kernel");
}

/* One thread per column, walking down the rows: neighbouring threads read
 * neighbouring addresses, so each row is one coalesced read. Float
 * accumulation in row order, like the CPU twin. */
__global__ static void bias_grad_kernel(float* dbias, const float* dy,
                                        size_t rows, size_t cols) {
  GRID_STRIDE(c, cols) {
    float acc = 0.0f;
    for (size_t r = 0; r < rows; r++)
      acc += dy[r * cols + c];
    dbias[c] = acc;
  }
}

int st__cuda_bias_grad(st_backend_t* be, float* dbias, const float* dy,
                       size_t rows, size_t cols) {
  cudaStream_t s;
  int rc = begin(be, &s);
  if (rc != 0)
    return rc;
  bias_grad_kernel<<<grid_for(cols), THREADS, 0, s>>>(dbias, dy, rows, cols);
  return launched(be, "bias_grad_kernel");
}

__global__ static void axpby_kernel(size_t n, float a, const float* x, float b,
                                    float* y) {
  GRID_STRIDE(i, n) y[i] = a * x[i] + b * y[i];
}

int st__cuda_axpby(st_backend_t* be, size_t n, float a, const float* x, float b,
                   float* y) {
  cudaStream_t s;
  int rc = begin(be, &s);
  if (rc != 0)
    return rc;
  axpby_kernel<<<grid_for(n), THREADS, 0, s>>>(n, a, x, b, y);
  return launched(be, "axpby_kernel");
}

/* ---- Losses ------------------------------------------------------------- */

/* One warp per row: lane l handles columns l, l + 32, ... and the warp
 * combines its lanes with shuffles. probs may alias logits: a lane writes
 * only the columns it read itself, and z[label] is read by every lane
 * before the __syncwarp that precedes the first write. */
__global__ static void softmax_xent_forward_kernel(const float* logits,
                                                   const float* labels,
                                                   size_t rows, size_t cols,
                                                   float* probs, float* loss) {
  const unsigned full = 0xffffffffu;
  size_t warps = blockDim.x / WARP;
  unsigned lane = threadIdx.x % WARP;
  for (size_t r = blockIdx.x * warps + threadIdx.x / WARP; r < rows;
       r += gridDim.x * warps) {
    const float* z = logits + r * cols;
    float* p = probs + r * cols;
    size_t lab = label_index(labels[r], cols);
    float zlab = lab < cols ? z[lab] : NAN;
    float zmax = -INFINITY;
    for (size_t c = lane; c < cols; c += WARP)
      zmax = fmaxf(zmax, z[c]);
    for (int off = WARP / 2; off > 0; off /= 2)
      zmax = fmaxf(zmax, __shfl_xor_sync(full, zmax, off));
    __syncwarp();
    double sum = 0.0;
    for (size_t c = lane; c < cols; c += WARP) {
      float e = expf(z[c] - zmax);
      p[c] = e;
      sum += e;
    }
    for (int off = WARP / 2; off > 0; off /= 2)
      sum += __shfl_xor_sync(full, sum, off);
    float inv = (float) (1.0 / sum);
    for (size_t c = lane; c < cols; c += WARP)
      p[c] *= inv;
    if (lane == 0)
      loss[r] = (float) (log(sum) - ((double) zlab - zmax));
  }
}

int st__cuda_softmax_xent_forward(st_backend_t* be, const float* logits,
                                  const float* labels, size_t rows, size_t cols,
                                  float* probs, float* loss) {
  cudaStream_t s;
  int rc = begin(be, &s);
  if (rc != 0)
    return rc;
  size_t rows_per_block = THREADS / WARP;
  size_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  softmax_xent_forward_kernel<<<
      (unsigned) (blocks < MAX_BLOCKS ? blocks : MAX_BLOCKS), THREADS, 0, s>>>(
      logits, labels, rows, cols, probs, loss);
  return launched(be, "softmax_xent_forward_kernel");
}

__global__ static void softmax_xent_backward_kernel(float* dlogits,
                                                    const float* probs,
                                                    const float* labels,
                                                    size_t rows, size_t cols,
                                                    float scale) {
  GRID_STRIDE(i, rows * cols) {
    size_t lab = label_index(labels[i / cols], cols);
    float p = probs[i];
    dlogits[i] = i % cols == lab ? scale * (p - 1.0f) : scale * p;
  }
}

int st__cuda_softmax_xent_backward(st_backend_t* be, float* dlogits,
                                   const float* probs, const float* labels,
                                   size_t rows, size_t cols, float scale) {
  cudaStream_t s;
  int rc = begin(be, &s);
  if (rc != 0)
    return rc;
  softmax_xent_backward_kernel<<<grid_for(rows * cols), THREADS, 0, s>>>(
      dlogits, probs, labels, rows, cols, scale);
  return launched(be, "softmax_xent_backward_kernel");
}

__global__ static void mse_forward_backward_kernel(const float* pred,
                                                   const float* target,
                                                   size_t rows, float* loss,
                                                   float* dpred, float scale) {
  GRID_STRIDE(r, rows) {
    float diff = pred[r] - target[r];
    loss[r] = 0.5f * diff * diff;
    if (dpred != NULL)
      dpred[r] = scale * diff;
  }
}

int st__cuda_mse_forward_backward(st_backend_t* be, const float* pred,
                                  const float* target, size_t rows, float* loss,
                                  float* dpred, float scale) {
  cudaStream_t s;
  int rc = begin(be, &s);
  if (rc != 0)
    return rc;
  mse_forward_backward_kernel<<<grid_for(rows), THREADS, 0, s>>>(
      pred, target, rows, loss, dpred, scale);
  return launched(be, "mse_forward_backward_kernel");
}

/* One thread per row; each thread adds its own count to the total once
 * (integer atomics, so the result does not depend on their order). */
__global__ static void argmax_correct_kernel(const float* logits,
                                             const float* labels, size_t rows,
                                             size_t cols,
                                             unsigned long long* correct) {
  unsigned long long count = 0;
  GRID_STRIDE(r, rows) {
    const float* z = logits + r * cols;
    size_t best = 0;
    for (size_t c = 1; c < cols; c++)
      if (z[c] > z[best])
        best = c; /* strict: ties keep the lowest index */
    count += best == label_index(labels[r], cols);
  }
  if (count > 0)
    atomicAdd(correct, count);
}

/* Copies one 8-byte result from scratch to the host and waits for it. */
static int fetch_result(st_backend_t* be, const void* dev) {
  st__cuda_t* cu = st__cuda(be);
  int rc = st__cuda_check(be,
                          cudaMemcpyAsync(cu->host_result, dev, 8,
                                          cudaMemcpyDeviceToHost, cu->stream),
                          "cudaMemcpyAsync (result to host)");
  if (rc != 0)
    return rc;
  return st__cuda_check(be, cudaStreamSynchronize(cu->stream),
                        "cudaStreamSynchronize");
}

int st__cuda_argmax_correct(st_backend_t* be, const float* logits,
                            const float* labels, size_t rows, size_t cols,
                            size_t* correct) {
  cudaStream_t s;
  int rc = begin(be, &s);
  if (rc != 0)
    return rc;
  unsigned long long* dev = (unsigned long long*) st__cuda(be)->scratch;
  rc = st__cuda_check(be, cudaMemsetAsync(dev, 0, sizeof(*dev), s),
                      "cudaMemsetAsync");
  if (rc != 0)
    return rc;
  argmax_correct_kernel<<<grid_for(rows), THREADS, 0, s>>>(logits, labels, rows,
                                                           cols, dev);
  if ((rc = launched(be, "argmax_correct_kernel")) != 0)
    return rc;
  if ((rc = fetch_result(be, dev)) != 0)
    return rc;
  *correct = (size_t) * (unsigned long long*) st__cuda(be)->host_result;
  return 0;
}

/* ---- Reductions --------------------------------------------------------- */

/* Two passes: reduce_partial_kernel folds a grid-stride share of x per
 * thread, then the block in shared memory, into partial[blockIdx.x];
 * reduce_final_kernel (one block) folds those partials into partial[
 * ST__CUDA_REDUCE_BLOCKS]. T is double for sums and max, unsigned long long
 * for the non-finite count. */
enum { RED_SUM, RED_SUMSQ, RED_MAX_ABS, RED_NONFINITE };

template <int OP, typename T>
__device__ static T red_leaf(float x) {
  if (OP == RED_SUM)
    return (T) x;
  if (OP == RED_SUMSQ)
    return (T) x * (T) x;
  if (OP == RED_MAX_ABS)
    return (T) fabsf(x);
  return (T) !isfinite(x);
}

template <int OP, typename T>
__device__ static T red_combine(T a, T b) {
  /* For the max, a NaN never reaches here (b > a is false for NaN). */
  if (OP == RED_MAX_ABS)
    return b > a ? b : a;
  return a + b;
}

template <int OP, typename T>
__device__ static void block_reduce_store(T acc, T* dst) {
  __shared__ T buf[THREADS];
  buf[threadIdx.x] = acc;
  __syncthreads();
  for (unsigned half = THREADS / 2; half > 0; half /= 2) {
    if (threadIdx.x < half)
      buf[threadIdx.x] =
          red_combine<OP, T>(buf[threadIdx.x], buf[threadIdx.x + half]);
    __syncthreads();
  }
  if (threadIdx.x == 0)
    *dst = buf[0];
}

template <int OP, typename T>
__global__ static void reduce_partial_kernel(const float* x, size_t n,
                                             T* partial) {
  T acc = 0;
  GRID_STRIDE(i, n) {
    T v = red_leaf<OP, T>(x[i]);
    acc = red_combine<OP, T>(acc, v);
  }
  block_reduce_store<OP, T>(acc, &partial[blockIdx.x]);
}

template <int OP, typename T>
__global__ static void reduce_final_kernel(T* partial, unsigned count) {
  T acc = 0;
  for (unsigned i = threadIdx.x; i < count; i += blockDim.x)
    acc = red_combine<OP, T>(acc, partial[i]);
  block_reduce_store<OP, T>(acc, &partial[ST__CUDA_REDUCE_BLOCKS]);
}

template <int OP, typename T>
static int reduce(st_backend_t* be, const float* x, size_t n, T* out,
                  const char* name) {
  cudaStream_t s;
  int rc = begin(be, &s);
  if (rc != 0)
    return rc;
  T* partial = (T*) st__cuda(be)->scratch;
  unsigned blocks = grid_for(n);
  if (blocks > ST__CUDA_REDUCE_BLOCKS)
    blocks = ST__CUDA_REDUCE_BLOCKS;
  reduce_partial_kernel<OP, T><<<blocks, THREADS, 0, s>>>(x, n, partial);
  if ((rc = launched(be, name)) != 0)
    return rc;
  reduce_final_kernel<OP, T><<<1, THREADS, 0, s>>>(partial, blocks);
  if ((rc = launched(be, name)) != 0)
    return rc;
  if ((rc = fetch_result(be, &partial[ST__CUDA_REDUCE_BLOCKS])) != 0)
    return rc;
  *out = *(T*) st__cuda(be)->host_result;
  return 0;
}

int st__cuda_sum(st_backend_t* be, const float* x, size_t n, double* out) {
  return reduce<RED_SUM, double>(be, x, n, out, "reduce_kernel (sum)");
}

int st__cuda_sumsq(st_backend_t* be, const float* x, size_t n, double* out) {
  return reduce<RED_SUMSQ, double>(be, x, n, out, "reduce_kernel (sumsq)");
}

int st__cuda_max_abs(st_backend_t* be, const float* x, size_t n, double* out) {
  return reduce<RED_MAX_ABS, double>(be, x, n, out, "reduce_kernel (max_abs)");
}

int st__cuda_count_nonfinite(st_backend_t* be, const float* x, size_t n,
                             size_t* out) {
  unsigned long long count = 0;
  int rc = reduce<RED_NONFINITE, unsigned long long>(
      be, x, n, &count, "reduce_kernel (count_nonfinite)");
  if (rc == 0)
    *out = (size_t) count;
  return rc;
}

/* ---- Optimizer updates -------------------------------------------------- */

__global__ static void sgd_update_kernel(float* p, const float* g, size_t n,
                                         float lr, float wd) {
  GRID_STRIDE(i, n) p[i] -= lr * (g[i] + wd * p[i]);
}

int st__cuda_sgd_update(st_backend_t* be, float* p, const float* g, size_t n,
                        float lr, float wd) {
  cudaStream_t s;
  int rc = begin(be, &s);
  if (rc != 0)
    return rc;
  sgd_update_kernel<<<grid_for(n), THREADS, 0, s>>>(p, g, n, lr, wd);
  return launched(be, "sgd_update_kernel");
}

__global__ static void momentum_update_kernel(float* p, const float* g,
                                              float* v, size_t n, float lr,
                                              float mu, float wd,
                                              int nesterov) {
  GRID_STRIDE(i, n) {
    float d = g[i] + wd * p[i];
    float vi = mu * v[i] + d;
    v[i] = vi;
    p[i] -= lr * (nesterov ? d + mu * vi : vi);
  }
}

int st__cuda_momentum_update(st_backend_t* be, float* p, const float* g,
                             float* v, size_t n, float lr, float mu, float wd,
                             int nesterov) {
  cudaStream_t s;
  int rc = begin(be, &s);
  if (rc != 0)
    return rc;
  momentum_update_kernel<<<grid_for(n), THREADS, 0, s>>>(p, g, v, n, lr, mu, wd,
                                                         nesterov);
  return launched(be, "momentum_update_kernel");
}

__global__ static void adamw_update_kernel(float* p, const float* g, float* m,
                                           float* v, size_t n, float lr,
                                           float b1, float b2, float eps,
                                           float decay, float inv_bc1,
                                           float inv_bc2) {
  GRID_STRIDE(i, n) {
    float gi = g[i];
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = decay * p[i] - lr * (mi * inv_bc1) / (sqrtf(vi * inv_bc2) + eps);
  }
}

int st__cuda_adamw_update(st_backend_t* be, float* p, const float* g, float* m,
                          float* v, size_t n, float lr, float b1, float b2,
                          float eps, float wd, float bc1, float bc2) {
  cudaStream_t s;
  int rc = begin(be, &s);
  if (rc != 0)
    return rc;
  adamw_update_kernel<<<grid_for(n), THREADS, 0, s>>>(
      p, g, m, v, n, lr, b1, b2, eps, 1.0f - lr * wd, 1.0f / bc1, 1.0f / bc2);
  return launched(be, "adamw_update_kernel");
}
