/* cuda_backend.cu: the CUDA backend: device, stream, memory and cuBLAS.
 *
 * One backend is one device with one non-blocking stream; every op is
 * issued on that stream, so ops run in the order they are issued, and the
 * calls that hand a value to the host (copies to the host, reductions,
 * sync) wait on the stream first. Matrix products use cublasSgemm; the
 * other ops are our kernels in cuda_kernels.cu. Every CUDA or cuBLAS error
 * becomes -EIO with a sentence kept for st_backend_last_error(); nothing
 * here exits.
 *
 * Row-major through column-major cuBLAS: a row-major M x N matrix with row
 * stride ld is, read column-major, its N x M transpose with the same ld. So
 * C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: cuBLAS gets B first,
 * then A, with m and n swapped and the same transpose flags.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda_internal.cuh"

/* ---- Errors ------------------------------------------------------------- */

int st__cuda_check(st_backend_t* be, cudaError_t e, const char* what) {
  if (e == cudaSuccess)
    return 0;
  st__backend_set_error(be, "%s failed: %s: %s", what, cudaGetErrorName(e),
                        cudaGetErrorString(e));
  return -EIO;
}

static int blas_check(st_backend_t* be, cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS)
    return 0;
  st__backend_set_error(be, "%s failed: %s", what, cublasGetStatusString(s));
  return -EIO;
}

int st__cuda_enter(st_backend_t* be) {
  return st__cuda_check(be, cudaSetDevice(st__cuda(be)->device),
                        "cudaSetDevice");
}

/* ---- Backend and memory ------------------------------------------------- */

/* Releases whatever of cu has been created; safe on a half-open backend. */
static void release(st__cuda_t* cu) {
  cudaSetDevice(cu->device);
  if (cu->stream != NULL)
    cudaStreamSynchronize(cu->stream);
  if (cu->blas != NULL)
    cublasDestroy(cu->blas);
  if (cu->scratch != NULL)
    cudaFree(cu->scratch);
  if (cu->host_result != NULL)
    cudaFreeHost(cu->host_result);
  if (cu->stream != NULL)
    cudaStreamDestroy(cu->stream);
  free(cu);
}

static void cuda_close(st_backend_t* be) {
  release(st__cuda(be));
  free(be);
}

static int cuda_sync(st_backend_t* be) {
  int rc = st__cuda_enter(be);
  if (rc != 0)
    return rc;
  return st__cuda_check(be, cudaStreamSynchronize(st__cuda(be)->stream),
                        "cudaStreamSynchronize");
}

static int cuda_buf_alloc(st_backend_t* be, size_t n, float** out) {
  st__cuda_t* cu = st__cuda(be);
  size_t bytes = (n == 0 ? 1 : n) * sizeof(float);
  void* p = NULL;
  int rc = st__cuda_enter(be);
  if (rc != 0)
    return rc;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError(); /* not sticky; clear it */
    st__backend_set_error(be, "st_buf_alloc: out of GPU memory for %zu floats",
                          n);
    return -ENOMEM;
  }
  rc = st__cuda_check(be, e, "cudaMalloc");
  if (rc != 0)
    return rc;
  rc = st__cuda_check(be, cudaMemsetAsync(p, 0, bytes, cu->stream),
                      "cudaMemsetAsync");
  if (rc != 0) {
    cudaFree(p);
    return rc;
  }
  *out = (float*) p;
  return 0;
}

static void cuda_buf_free(st_backend_t* be, float* buf) {
  if (st__cuda_enter(be) != 0)
    return;
  st__cuda_check(be, cudaFree(buf), "cudaFree");
}

/* Copies and then waits: the host side is borrowed for this call only, and
 * a pageable source may still be in flight when an async copy returns. */
static int copy_wait(st_backend_t* be, float* dst, const float* src, size_t n,
                     cudaMemcpyKind kind, const char* what) {
  st__cuda_t* cu = st__cuda(be);
  int rc = st__cuda_enter(be);
  if (rc != 0)
    return rc;
  rc = st__cuda_check(
      be, cudaMemcpyAsync(dst, src, n * sizeof(float), kind, cu->stream), what);
  if (rc != 0)
    return rc;
  return st__cuda_check(be, cudaStreamSynchronize(cu->stream),
                        "cudaStreamSynchronize");
}

static int cuda_copy_to_device(st_backend_t* be, float* dst, const float* src,
                               size_t n) {
  return copy_wait(be, dst, src, n, cudaMemcpyHostToDevice,
                   "cudaMemcpyAsync (host to device)");
}

static int cuda_copy_to_host(st_backend_t* be, float* dst, const float* src,
                             size_t n) {
  return copy_wait(be, dst, src, n, cudaMemcpyDeviceToHost,
                   "cudaMemcpyAsync (device to host)");
}

static int cuda_copy(st_backend_t* be, float* dst, const float* src, size_t n) {
  int rc = st__cuda_enter(be);
  if (rc != 0)
    return rc;
  return st__cuda_check(
      be,
      cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice,
                      st__cuda(be)->stream),
      "cudaMemcpyAsync (device to device)");
}

/* ---- Matrix products ---------------------------------------------------- */

static int cuda_gemm(st_backend_t* be, int trans_a, int trans_b, size_t m,
                     size_t n, size_t k, float alpha, const float* a,
                     size_t lda, const float* b, size_t ldb, float beta,
                     float* c, size_t ldc) {
  if (k == 0)
    return st__cuda_scale_matrix(be, c, m, n, ldc, beta);
  int rc = st__cuda_enter(be);
  if (rc != 0)
    return rc;
  /* C^T (n x m) = op(B)^T (n x k) * op(A)^T (k x m), column-major. */
  return blas_check(
      be,
      cublasSgemm(st__cuda(be)->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                  trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int) n, (int) m,
                  (int) k, &alpha, b, (int) ldb, a, (int) lda, &beta, c,
                  (int) ldc),
      "cublasSgemm");
}

/* ---- Opening ------------------------------------------------------------ */

static const st_backend_ops_t cuda_ops = {
    cuda_close,
    cuda_sync,
    cuda_buf_alloc,
    cuda_buf_free,
    cuda_copy_to_device,
    cuda_copy_to_host,
    cuda_copy,
    st__cuda_fill,
    cuda_gemm,
    st__cuda_bias_act_forward,
    st__cuda_act_backward,
    st__cuda_bias_grad,
    st__cuda_axpby,
    st__cuda_softmax_xent_forward,
    st__cuda_softmax_xent_backward,
    st__cuda_mse_forward_backward,
    st__cuda_argmax_correct,
    st__cuda_sum,
    st__cuda_sumsq,
    st__cuda_max_abs,
    st__cuda_count_nonfinite,
    st__cuda_sgd_update,
    st__cuda_momentum_update,
    st__cuda_adamw_update,
};

/* The module's two entry points (backend_internal.h): all else is hidden. */
extern "C" __attribute__((visibility("default"))) int st__cuda_device_count(
    void) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError(); /* no driver or no GPU: clear it and report 0 */
    return 0;
  }
  return count;
}

/* Checks that cuda:device exists: 0, or -ENODEV with a message saying
 * which devices there are. */
static int check_device(int device, char* err, size_t err_len) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    st_set_err(err, err_len,
               "cannot open cuda:%d: no usable CUDA device was found (the "
               "CUDA runtime says \"%s\", %s; is an NVIDIA GPU and driver "
               "present?); use --device cpu",
               device, cudaGetErrorString(e), cudaGetErrorName(e));
    return -ENODEV;
  }
  if (count == 0) {
    st_set_err(err, err_len,
               "cannot open cuda:%d: no CUDA device found on this "
               "machine; use --device cpu",
               device);
    return -ENODEV;
  }
  if (device >= count) {
    st_set_err(err, err_len,
               "device cuda:%d requested, but this machine has %d CUDA "
               "device%s (cuda:0 to cuda:%d); use one of those or --device "
               "cpu",
               device, count, count == 1 ? "" : "s", count - 1);
    return -ENODEV;
  }
  return 0;
}

extern "C" __attribute__((visibility("default"))) int st__cuda_backend_open(
    int device, int cpu_threads, st_backend_t** out, char* err,
    size_t err_len) {
  (void) cpu_threads; /* OpenBLAS threads do not concern a GPU backend */
  int rc = check_device(device, err, err_len);
  if (rc != 0)
    return rc;
  cudaError_t e;
  st_backend_t* be = (st_backend_t*) calloc(1, sizeof(*be));
  st__cuda_t* cu = (st__cuda_t*) calloc(1, sizeof(*cu));
  const char* what = NULL;
  cudaDeviceProp prop;
  if (be == NULL || cu == NULL) {
    free(be);
    free(cu);
    st_set_err(err, err_len, "out of memory opening cuda:%d", device);
    return -ENOMEM;
  }
  be->ops = &cuda_ops;
  be->kind = ST_BACKEND_CUDA;
  be->impl = cu;
  cu->device = device;

  if ((e = cudaSetDevice(device)) != cudaSuccess) {
    what = "cudaSetDevice";
    goto fail;
  }
  if ((e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess) {
    what = "cudaGetDeviceProperties";
    goto fail;
  }
  if ((e = cudaStreamCreateWithFlags(&cu->stream, cudaStreamNonBlocking)) !=
      cudaSuccess) {
    what = "cudaStreamCreateWithFlags";
    goto fail;
  }
  if ((e = cudaMalloc(&cu->scratch, ST__CUDA_SCRATCH_BYTES)) != cudaSuccess) {
    what = "cudaMalloc (reduction scratch)";
    goto fail;
  }
  if ((e = cudaMallocHost(&cu->host_result, 8)) != cudaSuccess) {
    what = "cudaMallocHost";
    goto fail;
  }
  {
    cublasStatus_t s = cublasCreate(&cu->blas);
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasSetStream(cu->blas, cu->stream);
    /* Plain FP32: no TF32 unless a later change asks for it and measures
     * the accuracy it costs. */
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasSetMathMode(cu->blas, CUBLAS_DEFAULT_MATH);
    if (s != CUBLAS_STATUS_SUCCESS) {
      st_set_err(err, err_len, "opening cuda:%d: cuBLAS setup failed: %s",
                 device, cublasGetStatusString(s));
      release(cu);
      free(be);
      return -EIO;
    }
  }
  snprintf(be->desc, sizeof(be->desc), "cuda:%d (%.100s, %.0f GiB)", device,
           prop.name, (double) prop.totalGlobalMem / (1024.0 * 1024 * 1024));
  *out = be;
  return 0;

fail:
  cudaGetLastError();
  st_set_err(err, err_len, "opening cuda:%d: %s failed: %s (%s)", device, what,
             cudaGetErrorString(e), cudaGetErrorName(e));
  release(cu);
  free(be);
  return -EIO;
}
