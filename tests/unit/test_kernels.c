/* test_kernels.c: the Check suite of kernels/ (kernels.h).
 *
 * Every op is checked against a float64 reference written here, on random
 * inputs (seeded by tu_seed(); replay a failure with ST_TEST_SEED) of
 * awkward sizes: 0, 1, primes and large. The same op tests then run on the
 * CUDA backend when a device is present, checked against the float64
 * reference and against the CPU backend (the parity test of llm.c); without
 * a device they are skipped with a line that says so. A result passes when
 * |ref - got| <= atol + rtol * |ref|; each tolerance sits a little above the
 * rounding error of float32 arithmetic and far below any real bug. Opening
 * backends and the random number generator are tested in
 * test_kernels_api.c.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "tests/unit/testutil.h"

/* ---- Fixture and helpers ------------------------------------------------ */

static st_backend_t* g_be;   /* backend under test */
static st_backend_t* g_twin; /* CPU backend when g_be is CUDA, else NULL */

static st_backend_t* open_or_fail(const char* spec) {
  st_backend_t* be = NULL;
  char err[256] = "";
  int rc = st_backend_open(&be, spec, 2, err, sizeof(err));
  ck_assert_msg(rc == 0, "open %s: %d %s", spec, rc, err);
  return be;
}

static void setup_cpu(void) {
  g_be = open_or_fail("cpu");
  g_twin = NULL;
}

static void setup_cuda(void) {
  g_be = open_or_fail("cuda:0");
  g_twin = open_or_fail("cpu");
}

static void teardown(void) {
  st_backend_close(g_be);
  st_backend_close(g_twin);
  g_be = g_twin = NULL;
}

static st_rng_t rng_for(uint64_t salt) {
  st_rng_t rng;
  st_rng_seed(&rng, tu_seed() ^ (salt * UINT64_C(0x9e3779b97f4a7c15)));
  return rng;
}

static void* xmalloc(size_t bytes) {
  void* p = malloc(bytes == 0 ? 1 : bytes);
  ck_assert_ptr_nonnull(p);
  return p;
}

static float* host_rand(st_rng_t* rng, size_t n, float lo, float hi) {
  float* x = xmalloc(n * sizeof(float));
  tu_fill_uniform(rng, x, n, lo, hi);
  return x;
}

/* A device copy of host[0..n). */
static float* dev_from(st_backend_t* be, const float* host, size_t n) {
  float* d = NULL;
  ck_assert_int_eq(st_buf_alloc(be, n, &d), 0);
  ck_assert_ptr_nonnull(d);
  ck_assert_int_eq(st_copy_to_device(be, d, host, n), 0);
  return d;
}

static void dev_to(st_backend_t* be, float* host, const float* d, size_t n) {
  ck_assert_int_eq(st_copy_to_host(be, host, d, n), 0);
}

static void expect_close(const char* what, const char* who, const double* ref,
                         const float* got, size_t n, double atol, double rtol) {
  long i = tu_first_mismatch(ref, got, n, atol, rtol);
  ck_assert_msg(i < 0, "%s on %s: element %ld of %zu: ref %.9g, got %.9g", what,
                who, i, n, i < 0 ? 0.0 : ref[i], i < 0 ? 0.0 : (double) got[i]);
}

static int near(double ref, double got, double atol, double rtol) {
  if (isnan(ref) || isnan(got))
    return isnan(ref) && isnan(got);
  if (isinf(ref) || isinf(got))
    return ref == got;
  return fabs(ref - got) <= atol + rtol * fabs(ref);
}

/* An op under test: runs on `be` with inputs from ctx and writes its
 * outputs, flattened, to out (host memory). */
typedef void (*run_fn)(st_backend_t* be, const void* ctx, float* out);

/* Runs the op on the backend under test and checks it against the float64
 * reference; on CUDA also runs it on the CPU twin and checks the two
 * results against each other (parity). */
static void check_op(const char* what, const double* ref, size_t n, double atol,
                     double rtol, run_fn run, const void* ctx) {
  float* got = xmalloc(n * sizeof(float));
  run(g_be, ctx, got);
  expect_close(what, st_backend_describe(g_be), ref, got, n, atol, rtol);
  if (g_twin != NULL) {
    float* cpu = xmalloc(n * sizeof(float));
    double* cpu_d = xmalloc(n * sizeof(double));
    run(g_twin, ctx, cpu);
    for (size_t i = 0; i < n; i++)
      cpu_d[i] = cpu[i];
    expect_close(what, "cuda vs cpu", cpu_d, got, n, 2 * atol, 2 * rtol);
    free(cpu);
    free(cpu_d);
  }
  free(got);
}

/* Sizes for 1-D ops: empty, one, primes (no vector width divides them) and
 * large (many blocks, more than one grid sweep of a small grid). */
static const size_t sizes_1d[] = {0, 1, 7, 31, 257, 100003};
#define N_SIZES_1D ((int) (sizeof(sizes_1d) / sizeof(sizes_1d[0])))

/* rows x cols shapes for row ops. */
static const struct {
  size_t rows, cols;
} shapes[] = {{0, 5},   {5, 0},    {1, 1},   {7, 31},
              {64, 10}, {64, 256}, {257, 3}, {3, 100003}};
#define N_SHAPES ((int) (sizeof(shapes) / sizeof(shapes[0])))

/* ---- Matrix products ---------------------------------------------------- */

static const struct {
  size_t m, n, k, pad; /* pad: extra columns in every leading dimension */
} gemm_cases[] = {
    {0, 0, 0, 0},     {0, 3, 4, 0},      {3, 0, 4, 0},    {3, 4, 0, 0},
    {3, 4, 0, 2},     {1, 1, 1, 0},      {3, 5, 7, 0},    {3, 5, 7, 5},
    {7, 1, 31, 0},    {61, 67, 71, 0},   {61, 67, 71, 3}, {64, 256, 784, 0},
    {64, 10, 128, 0}, {256, 784, 64, 0},
};
#define N_GEMM ((int) (sizeof(gemm_cases) / sizeof(gemm_cases[0])))

typedef struct {
  int ta, tb;
  size_t m, n, k, lda, ldb, ldc, a_len, b_len;
  float alpha, beta;
  const float *a, *b, *c0;
} gemm_ctx_t;

static void run_gemm(st_backend_t* be, const void* p, float* out) {
  const gemm_ctx_t* g = p;
  float* da = dev_from(be, g->a, g->a_len);
  float* db = dev_from(be, g->b, g->b_len);
  float* dc = dev_from(be, g->c0, g->m * g->ldc);
  ck_assert_int_eq(st_gemm(be, g->ta, g->tb, g->m, g->n, g->k, g->alpha, da,
                           g->lda, db, g->ldb, g->beta, dc, g->ldc),
                   0);
  dev_to(be, out, dc, g->m * g->ldc);
  st_buf_free(be, da);
  st_buf_free(be, db);
  st_buf_free(be, dc);
}

START_TEST(test_gemm) {
  static const float ab[][2] = {{1.0f, 0.0f}, {0.75f, -0.5f}, {-2.0f, 1.0f}};
  st_rng_t rng = rng_for(100 + (uint64_t) _i);
  gemm_ctx_t g = {0};
  g.m = gemm_cases[_i].m, g.n = gemm_cases[_i].n, g.k = gemm_cases[_i].k;
  size_t m = g.m, n = g.n, k = g.k, pad = gemm_cases[_i].pad;
  for (int t = 0; t < 4; t++) {
    g.ta = t & 1, g.tb = t >> 1;
    /* Stored A is m x k, or k x m when transposed; B likewise. */
    size_t a_rows = g.ta ? k : m, b_rows = g.tb ? n : k;
    g.lda = (g.ta ? m : k) + pad, g.ldb = (g.tb ? k : n) + pad;
    g.ldc = n + pad;
    g.a_len = a_rows * g.lda, g.b_len = b_rows * g.ldb;
    float* a = host_rand(&rng, g.a_len, -1, 1);
    float* b = host_rand(&rng, g.b_len, -1, 1);
    float* c0 = host_rand(&rng, m * g.ldc, -1, 1);
    double* ref = xmalloc(m * g.ldc * sizeof(double));
    g.a = a, g.b = b, g.c0 = c0;
    for (size_t s = 0; s < sizeof(ab) / sizeof(ab[0]); s++) {
      g.alpha = ab[s][0], g.beta = ab[s][1];
      for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < g.ldc; j++) {
          double acc = 0.0, c = c0[i * g.ldc + j];
          for (size_t q = 0; q < k && j < n; q++)
            acc += (double) (g.ta ? a[q * g.lda + i] : a[i * g.lda + q]) *
                   (g.tb ? b[j * g.ldb + q] : b[q * g.ldb + j]);
          /* Padding columns of C must come back untouched. */
          ref[i * g.ldc + j] = j < n ? g.alpha * acc + g.beta * c : c;
        }
      check_op("gemm", ref, m * g.ldc, 1e-5 * sqrt((double) k) + 1e-6, 1e-5,
               run_gemm, &g);
    }
    free(a);
    free(b);
    free(c0);
    free(ref);
  }
}
END_TEST

/* beta == 0 means C is not read (BLAS semantics), with or without k. */
START_TEST(test_gemm_beta0_ignores_nan) {
  float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, 0, 1, 1, 1};
  float c[4] = {NAN, NAN, INFINITY, NAN};
  for (size_t k = 0; k <= 3; k += 3) {
    gemm_ctx_t g = {0, 0, 2, 2, k, 3, 2, 2, 6, 6, 1.0f, 0.0f, a, b, c};
    /* [1 2 3; 4 5 6] x [1 0; 0 1; 1 1] = [4 5; 10 11]. */
    double ref[4] = {4, 5, 10, 11};
    if (k == 0)
      memset(ref, 0, sizeof(ref));
    check_op("gemm beta=0", ref, 4, 0, 0, run_gemm, &g);
  }
}
END_TEST

/* ---- Elementwise and row ops -------------------------------------------- */

typedef struct {
  const float *y0, *bias;
  size_t rows, cols;
  st_act_t act;
} bias_act_ctx_t;

static void run_bias_act(st_backend_t* be, const void* p, float* out) {
  const bias_act_ctx_t* c = p;
  size_t total = c->rows * c->cols;
  float* y = dev_from(be, c->y0, total);
  float* bias = dev_from(be, c->bias, c->cols);
  ck_assert_int_eq(st_bias_act_forward(be, y, bias, c->rows, c->cols, c->act),
                   0);
  dev_to(be, out, y, total);
  st_buf_free(be, y);
  st_buf_free(be, bias);
}

START_TEST(test_bias_act_forward) {
  st_rng_t rng = rng_for(200 + (uint64_t) _i);
  size_t rows = shapes[_i].rows, cols = shapes[_i].cols, total = rows * cols;
  float* y0 = host_rand(&rng, total, -1, 1);
  float* bias = host_rand(&rng, cols, -0.5f, 0.5f);
  double* ref = xmalloc(total * sizeof(double));
  for (int act = ST_ACT_NONE; act <= ST_ACT_RELU; act++) {
    for (size_t i = 0; i < total; i++) {
      double v = (double) y0[i] + bias[i % cols];
      ref[i] = act == ST_ACT_RELU && v < 0 ? 0.0 : v;
    }
    bias_act_ctx_t c = {y0, bias, rows, cols, (st_act_t) act};
    check_op("bias_act_forward", ref, total, 1e-7, 1e-6, run_bias_act, &c);
  }
  free(y0);
  free(bias);
  free(ref);
}
END_TEST

typedef struct {
  const float *dy0, *y;
  size_t n;
  st_act_t act;
} act_bwd_ctx_t;

static void run_act_backward(st_backend_t* be, const void* p, float* out) {
  const act_bwd_ctx_t* c = p;
  float* dy = dev_from(be, c->dy0, c->n);
  float* y = dev_from(be, c->y, c->n);
  ck_assert_int_eq(st_act_backward(be, dy, y, c->n, c->act), 0);
  dev_to(be, out, dy, c->n);
  st_buf_free(be, dy);
  st_buf_free(be, y);
}

START_TEST(test_act_backward) {
  st_rng_t rng = rng_for(300 + (uint64_t) _i);
  size_t n = sizes_1d[_i];
  float* dy0 = host_rand(&rng, n, -1, 1);
  float* y = host_rand(&rng, n, -1, 1);
  for (size_t i = 0; i < n; i += 5)
    y[i] = 0.0f; /* ReLU'(0) is 0 */
  double* ref = xmalloc(n * sizeof(double));
  for (int act = ST_ACT_NONE; act <= ST_ACT_RELU; act++) {
    for (size_t i = 0; i < n; i++)
      ref[i] = act == ST_ACT_RELU && !(y[i] > 0) ? 0.0 : dy0[i];
    act_bwd_ctx_t c = {dy0, y, n, (st_act_t) act};
    check_op("act_backward", ref, n, 0, 0, run_act_backward, &c);
  }
  free(dy0);
  free(y);
  free(ref);
}
END_TEST

typedef struct {
  const float* dy;
  size_t rows, cols;
} bias_grad_ctx_t;

static void run_bias_grad(st_backend_t* be, const void* p, float* out) {
  const bias_grad_ctx_t* c = p;
  float* dy = dev_from(be, c->dy, c->rows * c->cols);
  float* db = NULL;
  ck_assert_int_eq(st_buf_alloc(be, c->cols, &db), 0);
  ck_assert_int_eq(st_fill(be, db, c->cols, 123.0f), 0); /* must be replaced */
  ck_assert_int_eq(st_bias_grad(be, db, dy, c->rows, c->cols), 0);
  dev_to(be, out, db, c->cols);
  st_buf_free(be, dy);
  st_buf_free(be, db);
}

START_TEST(test_bias_grad) {
  st_rng_t rng = rng_for(400 + (uint64_t) _i);
  size_t rows = shapes[_i].rows, cols = shapes[_i].cols;
  float* dy = host_rand(&rng, rows * cols, -1, 1);
  double* ref = xmalloc(cols * sizeof(double));
  for (size_t c = 0; c < cols; c++) {
    ref[c] = 0.0; /* also when rows == 0 */
    for (size_t r = 0; r < rows; r++)
      ref[c] += dy[r * cols + c];
  }
  bias_grad_ctx_t c = {dy, rows, cols};
  check_op("bias_grad", ref, cols, 1e-6 * (double) rows + 1e-7, 1e-5,
           run_bias_grad, &c);
  free(dy);
  free(ref);
}
END_TEST

typedef struct {
  const float *x, *y0;
  size_t n;
  float a, b;
  int alias; /* x == y */
} axpby_ctx_t;

static void run_axpby(st_backend_t* be, const void* p, float* out) {
  const axpby_ctx_t* c = p;
  float* y = dev_from(be, c->y0, c->n);
  float* x = c->alias ? y : dev_from(be, c->x, c->n);
  ck_assert_int_eq(st_axpby(be, c->n, c->a, x, c->b, y), 0);
  dev_to(be, out, y, c->n);
  if (!c->alias)
    st_buf_free(be, x);
  st_buf_free(be, y);
}

START_TEST(test_axpby) {
  st_rng_t rng = rng_for(500 + (uint64_t) _i);
  size_t n = sizes_1d[_i];
  float* x = host_rand(&rng, n, -2, 2);
  float* y0 = host_rand(&rng, n, -2, 2);
  double* ref = xmalloc(n * sizeof(double));
  /* (0.5, 0.5) is the averaging step of the gossip layer. */
  static const float ab[][2] = {{0.5f, 0.5f}, {-1.25f, 3.0f}, {0.0f, 1.0f}};
  for (int alias = 0; alias <= 1; alias++)
    for (size_t s = 0; s < sizeof(ab) / sizeof(ab[0]); s++) {
      float a = ab[s][0], b = ab[s][1];
      for (size_t i = 0; i < n; i++)
        ref[i] = (double) a * (alias ? y0[i] : x[i]) + (double) b * y0[i];
      axpby_ctx_t c = {x, y0, n, a, b, alias};
      check_op(alias ? "axpby (x == y)" : "axpby", ref, n, 1e-6, 1e-6,
               run_axpby, &c);
    }
  free(x);
  free(y0);
  free(ref);
}
END_TEST

/* ---- Losses ------------------------------------------------------------- */

static float* random_labels(st_rng_t* rng, size_t rows, size_t cols) {
  float* labels = xmalloc(rows * sizeof(float));
  for (size_t r = 0; r < rows; r++)
    labels[r] = (float) st_rng_below(rng, cols);
  return labels;
}

typedef struct {
  const float *logits, *labels;
  size_t rows, cols;
  int alias; /* probs == logits */
} xent_fwd_ctx_t;

/* out = probs (rows x cols) followed by loss (rows). */
static void run_xent_forward(st_backend_t* be, const void* p, float* out) {
  const xent_fwd_ctx_t* c = p;
  size_t total = c->rows * c->cols;
  float* z = dev_from(be, c->logits, total);
  float* lab = dev_from(be, c->labels, c->rows);
  float* probs = z;
  float* loss = NULL;
  if (!c->alias)
    ck_assert_int_eq(st_buf_alloc(be, total, &probs), 0);
  ck_assert_int_eq(st_buf_alloc(be, c->rows, &loss), 0);
  ck_assert_int_eq(
      st_softmax_xent_forward(be, z, lab, c->rows, c->cols, probs, loss), 0);
  dev_to(be, out, probs, total);
  dev_to(be, out + total, loss, c->rows);
  if (!c->alias)
    st_buf_free(be, probs);
  st_buf_free(be, z);
  st_buf_free(be, lab);
  st_buf_free(be, loss);
}

static void xent_forward_case(st_rng_t* rng, size_t rows, size_t cols,
                              float spread, int alias) {
  size_t total = rows * cols;
  float* z = host_rand(rng, total, -spread, spread);
  float* labels = random_labels(rng, rows, cols);
  double* ref = xmalloc((total + rows) * sizeof(double));
  for (size_t r = 0; r < rows; r++) {
    const float* zr = z + r * cols;
    double zmax = -INFINITY, sum = 0.0;
    for (size_t c = 0; c < cols; c++)
      zmax = fmax(zmax, zr[c]);
    for (size_t c = 0; c < cols; c++)
      sum += exp(zr[c] - zmax);
    for (size_t c = 0; c < cols; c++)
      ref[r * cols + c] = exp(zr[c] - zmax) / sum;
    ref[total + r] = log(sum) - (zr[(size_t) labels[r]] - zmax);
  }
  xent_fwd_ctx_t c = {z, labels, rows, cols, alias};
  check_op("softmax_xent_forward", ref, total + rows, 1e-6, 1e-5,
           run_xent_forward, &c);
  free(z);
  free(labels);
  free(ref);
}

START_TEST(test_softmax_xent_forward) {
  st_rng_t rng = rng_for(600 + (uint64_t) _i);
  size_t rows = shapes[_i].rows, cols = shapes[_i].cols;
  if (cols == 0) {
    /* No classes with rows to score is a caller error; without rows it is
     * nothing to do. */
    float* dz = NULL;
    ck_assert_int_eq(st_buf_alloc(g_be, 1, &dz), 0);
    ck_assert_int_eq(st_softmax_xent_forward(g_be, dz, dz, rows, 0, dz, dz),
                     rows > 0 ? -EINVAL : 0);
    st_buf_free(g_be, dz);
    return;
  }
  /* Logits of +-1e4 overflow a naive exp(); max subtraction keeps the
   * softmax and the loss finite and exact. */
  for (int alias = 0; alias <= 1; alias++) {
    xent_forward_case(&rng, rows, cols, 5.0f, alias);
    xent_forward_case(&rng, rows, cols, 1e4f, alias);
  }
}
END_TEST

/* A label that is not a class gives a NaN loss instead of a wild read. */
START_TEST(test_softmax_xent_bad_label) {
  float z[6] = {1, 2, 3, 4, 5, 6}, labels[2] = {3.0f, -1.0f}, out[8];
  xent_fwd_ctx_t c = {z, labels, 2, 3, 0};
  run_xent_forward(g_be, &c, out);
  ck_assert(isnan(out[6]) && isnan(out[7]));
}
END_TEST

typedef struct {
  const float *probs, *labels;
  size_t rows, cols;
  float scale;
  int alias; /* dlogits == probs */
} xent_bwd_ctx_t;

static void run_xent_backward(st_backend_t* be, const void* p, float* out) {
  const xent_bwd_ctx_t* c = p;
  size_t total = c->rows * c->cols;
  float* probs = dev_from(be, c->probs, total);
  float* lab = dev_from(be, c->labels, c->rows);
  float* d = probs;
  if (!c->alias)
    ck_assert_int_eq(st_buf_alloc(be, total, &d), 0);
  ck_assert_int_eq(
      st_softmax_xent_backward(be, d, probs, lab, c->rows, c->cols, c->scale),
      0);
  dev_to(be, out, d, total);
  if (!c->alias)
    st_buf_free(be, d);
  st_buf_free(be, probs);
  st_buf_free(be, lab);
}

START_TEST(test_softmax_xent_backward) {
  st_rng_t rng = rng_for(700 + (uint64_t) _i);
  size_t rows = shapes[_i].rows, cols = shapes[_i].cols, total = rows * cols;
  float* probs = host_rand(&rng, total, 0, 1);
  float* labels = random_labels(&rng, rows, cols == 0 ? 1 : cols);
  float scale = rows > 0 ? 1.0f / (float) rows : 1.0f;
  double* ref = xmalloc(total * sizeof(double));
  for (size_t i = 0; i < total; i++)
    ref[i] = (double) scale *
             (probs[i] - (i % cols == (size_t) labels[i / cols] ? 1.0 : 0.0));
  for (int alias = 0; alias <= 1; alias++) {
    xent_bwd_ctx_t c = {probs, labels, rows, cols, scale, alias};
    check_op("softmax_xent_backward", ref, total, 1e-7, 1e-6, run_xent_backward,
             &c);
  }
  free(probs);
  free(labels);
  free(ref);
}
END_TEST

typedef struct {
  const float *pred, *target;
  size_t rows;
  float scale;
  int mode; /* 0: no dpred, 1: own dpred buffer, 2: dpred == pred */
} mse_ctx_t;

/* out = loss (rows) followed by dpred (rows; 0 when not asked for). */
static void run_mse(st_backend_t* be, const void* p, float* out) {
  const mse_ctx_t* c = p;
  float* pred = dev_from(be, c->pred, c->rows);
  float* target = dev_from(be, c->target, c->rows);
  float *loss = NULL, *dpred = NULL;
  ck_assert_int_eq(st_buf_alloc(be, c->rows, &loss), 0);
  if (c->mode == 1)
    ck_assert_int_eq(st_buf_alloc(be, c->rows, &dpred), 0);
  if (c->mode == 2)
    dpred = pred;
  ck_assert_int_eq(
      st_mse_forward_backward(be, pred, target, c->rows, loss, dpred, c->scale),
      0);
  dev_to(be, out, loss, c->rows);
  if (dpred != NULL)
    dev_to(be, out + c->rows, dpred, c->rows);
  else
    memset(out + c->rows, 0, c->rows * sizeof(float));
  if (c->mode == 1)
    st_buf_free(be, dpred);
  st_buf_free(be, pred);
  st_buf_free(be, target);
  st_buf_free(be, loss);
}

START_TEST(test_mse) {
  st_rng_t rng = rng_for(800 + (uint64_t) _i);
  size_t n = sizes_1d[_i];
  float* pred = host_rand(&rng, n, -3, 3);
  float* target = host_rand(&rng, n, -3, 3);
  double* ref = xmalloc(2 * n * sizeof(double));
  float scale = 0.25f;
  for (int mode = 0; mode <= 2; mode++) {
    for (size_t r = 0; r < n; r++) {
      double diff = (double) pred[r] - target[r];
      ref[r] = 0.5 * diff * diff;
      ref[n + r] = mode == 0 ? 0.0 : scale * diff;
    }
    mse_ctx_t c = {pred, target, n, scale, mode};
    check_op("mse_forward_backward", ref, 2 * n, 1e-6, 1e-5, run_mse, &c);
  }
  free(pred);
  free(target);
  free(ref);
}
END_TEST

static size_t run_argmax(st_backend_t* be, const float* z, const float* labels,
                         size_t rows, size_t cols) {
  float* dz = dev_from(be, z, rows * cols);
  float* dl = dev_from(be, labels, rows);
  size_t correct = 12345;
  ck_assert_int_eq(st_argmax_correct(be, dz, dl, rows, cols, &correct), 0);
  st_buf_free(be, dz);
  st_buf_free(be, dl);
  return correct;
}

START_TEST(test_argmax_correct) {
  st_rng_t rng = rng_for(900 + (uint64_t) _i);
  size_t rows = shapes[_i].rows, cols = shapes[_i].cols;
  float* z = host_rand(&rng, rows * cols, -1, 1);
  float* labels = random_labels(&rng, rows, cols == 0 ? 1 : cols);
  size_t ref = 0;
  for (size_t r = 0; r < rows && cols > 0; r++) {
    float* zr = z + r * cols;
    if (r % 3 == 0) /* a tie everywhere: the lowest index wins */
      for (size_t c = 0; c < cols; c++)
        zr[c] = 0.5f;
    if (r % 3 == 1)
      labels[r] = 0; /* make some rows right */
    size_t best = 0;
    for (size_t c = 1; c < cols; c++)
      if (zr[c] > zr[best])
        best = c;
    if (r % 3 == 1)
      labels[r] = (float) best;
    ref += best == (size_t) labels[r];
  }
  size_t got = run_argmax(g_be, z, labels, rows, cols);
  ck_assert_uint_eq(got, ref);
  if (g_twin != NULL)
    ck_assert_uint_eq(run_argmax(g_twin, z, labels, rows, cols), got);
  free(z);
  free(labels);
}
END_TEST

/* ---- Reductions --------------------------------------------------------- */

typedef struct {
  double sum, sumsq, max_abs;
  size_t nonfinite;
} reductions_t;

static reductions_t run_reductions(st_backend_t* be, const float* x, size_t n) {
  reductions_t r;
  float* d = dev_from(be, x, n);
  ck_assert_int_eq(st_sum(be, d, n, &r.sum), 0);
  ck_assert_int_eq(st_sumsq(be, d, n, &r.sumsq), 0);
  ck_assert_int_eq(st_max_abs(be, d, n, &r.max_abs), 0);
  ck_assert_int_eq(st_count_nonfinite(be, d, n, &r.nonfinite), 0);
  st_buf_free(be, d);
  return r;
}

static void expect_reductions(const reductions_t* ref, const float* x,
                              size_t n) {
  /* Double accumulation in another order: error ~ n * 2^-53 * max. */
  double atol = 1e-13 * (double) n + 1e-12, rtol = 1e-12;
  st_backend_t* bes[2] = {g_be, g_twin};
  for (int b = 0; b < 2 && bes[b] != NULL; b++) {
    reductions_t got = run_reductions(bes[b], x, n);
    const char* who = st_backend_describe(bes[b]);
    ck_assert_msg(near(ref->sum, got.sum, atol, rtol),
                  "sum on %s, n %zu: ref %.17g got %.17g", who, n, ref->sum,
                  got.sum);
    ck_assert_msg(near(ref->sumsq, got.sumsq, atol, rtol),
                  "sumsq on %s, n %zu: ref %.17g got %.17g", who, n, ref->sumsq,
                  got.sumsq);
    ck_assert_msg(near(ref->max_abs, got.max_abs, 0, 0),
                  "max_abs on %s, n %zu: ref %.9g got %.9g", who, n,
                  ref->max_abs, got.max_abs);
    ck_assert_msg(ref->nonfinite == got.nonfinite,
                  "count_nonfinite on %s, n %zu: ref %zu got %zu", who, n,
                  ref->nonfinite, got.nonfinite);
  }
}

static reductions_t reduce_ref(const float* x, size_t n) {
  reductions_t r = {0, 0, 0, 0};
  for (size_t i = 0; i < n; i++) {
    r.sum += x[i];
    r.sumsq += (double) x[i] * x[i];
    if (isfinite(x[i]) || isinf(x[i]))
      r.max_abs = fmax(r.max_abs, fabs(x[i]));
    r.nonfinite += !isfinite(x[i]);
  }
  return r;
}

START_TEST(test_reductions) {
  st_rng_t rng = rng_for(1000 + (uint64_t) _i);
  size_t n = sizes_1d[_i];
  float* x = host_rand(&rng, n, -2, 2);
  reductions_t ref = reduce_ref(x, n);
  expect_reductions(&ref, x, n);
  free(x);
}
END_TEST

/* NaN and Inf are counted; NaN is skipped by max_abs, Inf is not, and
 * either makes the sums non-finite. */
START_TEST(test_reductions_nonfinite) {
  st_rng_t rng = rng_for(1100 + (uint64_t) _i);
  size_t n = sizes_1d[_i];
  if (n == 0)
    return;
  float* x = host_rand(&rng, n, -2, 2);
  static const float bad[] = {NAN, INFINITY, -INFINITY};
  for (int kind = 0; kind < 3; kind++) {
    size_t where[3] = {0, n / 2, n - 1};
    for (int w = 0; w < 3; w++)
      x[where[w]] = bad[kind] * (w == 1 ? -1 : 1);
    reductions_t ref = reduce_ref(x, n);
    ck_assert(ref.nonfinite >= 1 && ref.nonfinite <= 3);
    expect_reductions(&ref, x, n);
    tu_fill_uniform(&rng, x, n, -2, 2);
  }
  free(x);
}
END_TEST

/* ---- Memory ------------------------------------------------------------- */

START_TEST(test_memory) {
  size_t n = sizes_1d[_i];
  float* host = xmalloc(n * sizeof(float));
  double* ref = xmalloc(n * sizeof(double));
  float *a = NULL, *b = NULL;
  ck_assert_int_eq(st_buf_alloc(g_be, n, &a), 0);
  ck_assert_int_eq(st_buf_alloc(g_be, n, &b), 0);
  ck_assert(a != NULL && b != NULL);
  dev_to(g_be, host, a, n); /* zero-filled */
  for (size_t i = 0; i < n; i++)
    ref[i] = 0.0;
  expect_close("buf_alloc zero fill", "be", ref, host, n, 0, 0);
  ck_assert_int_eq(st_fill(g_be, a, n, -3.25f), 0);
  ck_assert_int_eq(st_copy(g_be, b, a, n), 0);
  ck_assert_int_eq(st_fill(g_be, a, n, 1.0f), 0); /* b is a real copy */
  dev_to(g_be, host, b, n);
  for (size_t i = 0; i < n; i++)
    ref[i] = -3.25;
  expect_close("fill + copy", st_backend_describe(g_be), ref, host, n, 0, 0);
  ck_assert_int_eq(st_backend_sync(g_be), 0);
  st_buf_free(g_be, a);
  st_buf_free(g_be, b);
  st_buf_free(g_be, NULL);
  free(host);
  free(ref);
}
END_TEST

/* ---- Optimizer updates -------------------------------------------------- */

enum { OPT_SGD, OPT_MOMENTUM, OPT_NESTEROV, OPT_ADAMW };
#define OPT_STEPS 5

typedef struct {
  int kind;
  size_t n;
  const float *p0, *grads; /* grads: OPT_STEPS x n, one row per step */
} opt_ctx_t;

static const float lr = 0.05f, mu = 0.9f, wd = 0.01f;
static const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;

/* out = p, then v (momentum) or m and v (AdamW), after OPT_STEPS steps. */
static void run_optimizer(st_backend_t* be, const void* ctx, float* out) {
  const opt_ctx_t* c = ctx;
  size_t n = c->n;
  float* p = dev_from(be, c->p0, n);
  float *g = NULL, *m = NULL, *v = NULL;
  ck_assert_int_eq(st_buf_alloc(be, n, &g), 0);
  ck_assert_int_eq(st_buf_alloc(be, n, &m), 0);
  ck_assert_int_eq(st_buf_alloc(be, n, &v), 0);
  for (int t = 1; t <= OPT_STEPS; t++) {
    ck_assert_int_eq(st_copy_to_device(be, g, c->grads + (t - 1) * n, n), 0);
    int rc = -1;
    if (c->kind == OPT_SGD)
      rc = st_sgd_update(be, p, g, n, lr, wd);
    if (c->kind == OPT_MOMENTUM || c->kind == OPT_NESTEROV)
      rc = st_momentum_update(be, p, g, v, n, lr, mu, wd,
                              c->kind == OPT_NESTEROV);
    if (c->kind == OPT_ADAMW)
      rc = st_adamw_update(be, p, g, m, v, n, lr, b1, b2, eps, wd,
                           1.0f - powf(b1, (float) t),
                           1.0f - powf(b2, (float) t));
    ck_assert_int_eq(rc, 0);
  }
  dev_to(be, out, p, n);
  dev_to(be, out + n, m, n);
  dev_to(be, out + 2 * n, v, n);
  st_buf_free(be, p);
  st_buf_free(be, g);
  st_buf_free(be, m);
  st_buf_free(be, v);
}

/* The float64 formulas of kernels.h, step by step. */
static void optimizer_ref(const opt_ctx_t* c, double* ref) {
  size_t n = c->n;
  double *p = ref, *m = ref + n, *v = ref + 2 * n;
  for (size_t i = 0; i < n; i++)
    p[i] = c->p0[i], m[i] = 0, v[i] = 0;
  for (int t = 1; t <= OPT_STEPS; t++) {
    const float* g = c->grads + (t - 1) * n;
    double bc1 = 1.0 - pow(b1, t), bc2 = 1.0 - pow(b2, t);
    for (size_t i = 0; i < n; i++) {
      double d = g[i] + (double) wd * p[i];
      switch (c->kind) {
        case OPT_SGD:
          p[i] -= lr * d;
          break;
        case OPT_MOMENTUM:
        case OPT_NESTEROV:
          v[i] = mu * v[i] + d;
          p[i] -= lr * (c->kind == OPT_NESTEROV ? d + mu * v[i] : v[i]);
          break;
        default:
          p[i] -= (double) lr * wd * p[i];
          m[i] = b1 * m[i] + (1.0 - b1) * g[i];
          v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
          p[i] -= lr * (m[i] / bc1) / (sqrt(v[i] / bc2) + eps);
      }
    }
  }
}

START_TEST(test_optimizers) {
  static const char* names[] = {"sgd_update", "momentum_update",
                                "momentum_update (nesterov)", "adamw_update"};
  st_rng_t rng = rng_for(1200 + (uint64_t) _i);
  size_t n = sizes_1d[_i];
  float* p0 = host_rand(&rng, n, -1, 1);
  float* grads = host_rand(&rng, OPT_STEPS * n, -1, 1);
  double* ref = xmalloc(3 * n * sizeof(double));
  for (int kind = OPT_SGD; kind <= OPT_ADAMW; kind++) {
    opt_ctx_t c = {kind, n, p0, grads};
    optimizer_ref(&c, ref);
    check_op(names[kind], ref, 3 * n, 2e-6, 1e-5, run_optimizer, &c);
  }
  free(p0);
  free(grads);
  free(ref);
}
END_TEST

/* ---- Argument checks ---------------------------------------------------- */

/* NULL buffers with work to do are -EINVAL with a sentence; with no work
 * they are fine. */
START_TEST(test_argument_checks) {
  st_backend_t* be = g_be;
  float* x = NULL;
  double d;
  size_t z;
  ck_assert_int_eq(st_buf_alloc(be, 4, &x), 0);
  int rcs[] = {
      st_copy_to_device(be, NULL, x, 1),
      st_copy_to_host(be, x, NULL, 1),
      st_copy(be, x, NULL, 1),
      st_fill(be, NULL, 1, 0),
      st_gemm(be, 0, 0, 1, 1, 1, 1, NULL, 1, x, 1, 0, x, 1),
      st_gemm(be, 0, 0, 2, 2, 2, 1, x, 1, x, 2, 0, x, 2), /* lda < k */
      st_gemm(be, 0, 1, 2, 2, 2, 1, x, 2, x, 1, 0, x, 2), /* ldb < k */
      st_gemm(be, 0, 0, 2, 2, 1, 1, x, 1, x, 2, 0, x, 1), /* ldc < n */
      st_bias_act_forward(be, x, NULL, 1, 1, ST_ACT_RELU),
      st_bias_act_forward(be, x, x, 1, 1, (st_act_t) 7),
      st_act_backward(be, NULL, x, 1, ST_ACT_RELU),
      st_bias_grad(be, NULL, x, 1, 1),
      st_axpby(be, 1, 1, NULL, 1, x),
      st_softmax_xent_forward(be, x, NULL, 1, 1, x, x),
      st_softmax_xent_backward(be, x, x, NULL, 1, 1, 1),
      st_mse_forward_backward(be, x, x, 1, NULL, NULL, 1),
      st_argmax_correct(be, NULL, x, 1, 1, &z),
      st_sum(be, NULL, 1, &d),
      st_sumsq(be, x, 1, NULL),
      st_max_abs(be, NULL, 1, &d),
      st_count_nonfinite(be, NULL, 1, &z),
      st_sgd_update(be, x, NULL, 1, 1, 0),
      st_momentum_update(be, x, x, NULL, 1, 1, 0, 0, 0),
      st_adamw_update(be, x, x, x, NULL, 1, 1, b1, b2, eps, 0, 1, 1),
      st_adamw_update(be, x, x, x, x, 1, 1, b1, b2, eps, 0, 0, 1),
  };
  for (size_t i = 0; i < sizeof(rcs) / sizeof(rcs[0]); i++)
    ck_assert_msg(rcs[i] == -EINVAL, "check %zu: rc %d", i, rcs[i]);
  ck_assert(strlen(st_backend_last_error(be)) > 0);
  int zero[] = {
      st_copy(be, NULL, NULL, 0),
      st_fill(be, NULL, 0, 0),
      st_gemm(be, 0, 0, 0, 5, 5, 1, NULL, 0, NULL, 0, 0, NULL, 0),
      st_axpby(be, 0, 1, NULL, 1, NULL),
      st_sum(be, NULL, 0, &d),
      st_count_nonfinite(be, NULL, 0, &z),
      st_act_backward(be, NULL, NULL, 5, ST_ACT_NONE),
      st_adamw_update(be, NULL, NULL, NULL, NULL, 0, 1, b1, b2, eps, 0, 1, 1),
  };
  for (size_t i = 0; i < sizeof(zero) / sizeof(zero[0]); i++)
    ck_assert_msg(zero[i] == 0, "empty call %zu: rc %d", i, zero[i]);
  ck_assert(d == 0.0 && z == 0);
  st_buf_free(be, x);
}
END_TEST

/* ---- Suite -------------------------------------------------------------- */

/* The op tests, run on one backend (CPU, or CUDA with the CPU as twin). */
static void add_op_tests(TCase* tc) {
  tcase_add_loop_test(tc, test_gemm, 0, N_GEMM);
  tcase_add_test(tc, test_gemm_beta0_ignores_nan);
  tcase_add_loop_test(tc, test_bias_act_forward, 0, N_SHAPES);
  tcase_add_loop_test(tc, test_act_backward, 0, N_SIZES_1D);
  tcase_add_loop_test(tc, test_bias_grad, 0, N_SHAPES);
  tcase_add_loop_test(tc, test_axpby, 0, N_SIZES_1D);
  tcase_add_loop_test(tc, test_softmax_xent_forward, 0, N_SHAPES);
  tcase_add_test(tc, test_softmax_xent_bad_label);
  tcase_add_loop_test(tc, test_softmax_xent_backward, 0, N_SHAPES);
  tcase_add_loop_test(tc, test_mse, 0, N_SIZES_1D);
  tcase_add_loop_test(tc, test_argmax_correct, 0, N_SHAPES);
  tcase_add_loop_test(tc, test_reductions, 0, N_SIZES_1D);
  tcase_add_loop_test(tc, test_reductions_nonfinite, 0, N_SIZES_1D);
  tcase_add_loop_test(tc, test_memory, 0, N_SIZES_1D);
  tcase_add_loop_test(tc, test_optimizers, 0, N_SIZES_1D);
  tcase_add_test(tc, test_argument_checks);
}

static Suite* kernels_suite(void) {
  Suite* s = suite_create("kernels");
  TCase* tc = tcase_create("cpu");
  tcase_add_checked_fixture(tc, setup_cpu, teardown);
  tcase_set_timeout(tc, 120);
  add_op_tests(tc);
  suite_add_tcase(s, tc);

  if (tu_cuda_device_count() > 0) {
    tc = tcase_create("cuda");
    tcase_add_checked_fixture(tc, setup_cuda, teardown);
    tcase_set_timeout(tc, 120);
    add_op_tests(tc);
    suite_add_tcase(s, tc);
  } else {
#ifdef ST_HAVE_CUDA
    const char* built = "yes";
#else
    const char* built = "no";
#endif
    printf(
        "test_kernels: CUDA parity tests skipped: no CUDA device (built with "
        "CUDA: %s)\n",
        built);
    fflush(stdout); /* before Check forks, so the line prints once */
  }
  return s;
}

int main(void) {
  tu_seed(); /* print the seed once, before Check forks */
  SRunner* sr = srunner_create(kernels_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
