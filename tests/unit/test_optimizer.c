/* test_optimizer.c: Check suite for optimizer/: model specs, deterministic
 * initialization, gradients of every model kind against float64 finite
 * differences, the optimizers and clipping against float64 formulas, the
 * learning-rate schedules, and convergence to known solutions. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optimizer/optimizer.h"
#include "tests/unit/testutil.h"

static st_backend_t* open_cpu(void) {
  st_backend_t* be = NULL;
  char err[256];
  ck_assert_msg(st_backend_open(&be, "cpu", 1, err, sizeof(err)) == 0, "%s",
                err);
  return be;
}

/* ---- Specs ------------------------------------------------------------------
 */

static const struct {
  const char* text;
  int ok;
  int n_layers;
  size_t params;
} spec_cases[] = {
    {"mlp:784-256-128-10", 1, 3, 784 * 256 + 256 + 256 * 128 + 128 + 1290},
    {"softmax:784-10", 1, 1, 7850},
    {"linear:13-1", 1, 1, 14},
    {"mlp:2-3-2", 1, 2, 6 + 3 + 6 + 2},
    {"mlp:784-10", 0, 0, 0},                   /* no hidden layer */
    {"mlp:4-3-1", 0, 0, 0},                    /* one output */
    {"softmax:4-3-2", 0, 0, 0},                /* too many sizes */
    {"softmax:4-1", 0, 0, 0},                  /* one class */
    {"linear:4-2", 0, 0, 0},                   /* regression has one output */
    {"linear:4", 0, 0, 0},                     /* no output */
    {"cnn:4-2", 0, 0, 0},                      /* unknown kind */
    {"784-10", 0, 0, 0},                       /* no kind */
    {"mlp:784--10", 0, 0, 0},                  /* empty size */
    {"mlp:784-0-10", 0, 0, 0},                 /* zero size */
    {"mlp:784-256-10-", 0, 0, 0},              /* trailing dash */
    {"mlp:784-25x-10", 0, 0, 0},               /* junk */
    {"mlp:99999999999999999999-2-2", 0, 0, 0}, /* overflow */
    {"mlp:", 0, 0, 0},
    {"mlp:1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-2", 0, 0, 0}, /* 17 layers */
    {"mlp:1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-2", 1, 16, 0},  /* 16 layers */
};

START_TEST(test_spec_parse) {
  st_model_spec_t spec;
  char err[256] = "";
  int rc = st_model_spec_parse(spec_cases[_i].text, &spec, err, sizeof(err));
  if (!spec_cases[_i].ok) {
    ck_assert_msg(rc < 0, "accepted %s", spec_cases[_i].text);
    ck_assert_msg(strstr(err, spec_cases[_i].text) != NULL,
                  "error does not name the input: %s", err);
    return;
  }
  ck_assert_msg(rc == 0, "%s: %s", spec_cases[_i].text, err);
  ck_assert_int_eq(spec.n_layers, spec_cases[_i].n_layers);
  if (spec_cases[_i].params)
    ck_assert_uint_eq(st_model_spec_param_count(&spec), spec_cases[_i].params);
  char back[256];
  ck_assert_int_eq(st_model_spec_format(&spec, back, sizeof(back)), 0);
  ck_assert_str_eq(back, spec_cases[_i].text);
}
END_TEST

/* ---- Initialization
 * -------------------------------------------------------------- */

START_TEST(test_init_deterministic) {
  st_backend_t* be = open_cpu();
  st_model_spec_t spec;
  ck_assert_int_eq(st_model_spec_parse("mlp:31-17-5", &spec, NULL, 0), 0);
  st_model_t a, b, c;
  ck_assert_int_eq(st_model_init(&a, be, &spec, 4, 42), 0);
  ck_assert_int_eq(st_model_init(&b, be, &spec, 9, 42), 0);
  ck_assert_int_eq(st_model_init(&c, be, &spec, 4, 43), 0);
  ck_assert_int_eq(memcmp(a.params, b.params, a.n_params * sizeof(float)), 0);
  ck_assert_int_ne(memcmp(a.params, c.params, a.n_params * sizeof(float)), 0);
  /* Every layer's values lie within +-1/sqrt(fan_in) and are spread out. */
  for (int l = 0; l < spec.n_layers; l++) {
    double bound = 1.0 / sqrt((double) spec.sizes[l]);
    size_t n = spec.sizes[l + 1] * spec.sizes[l];
    double sumsq = 0;
    for (size_t i = 0; i < n; i++) {
      double w = a.params[a.w_off[l] + i];
      ck_assert(fabs(w) <= bound);
      sumsq += w * w;
    }
    /* Uniform(-b, b) has variance b^2/3. */
    ck_assert_double_eq_tol(sumsq / (double) n, bound * bound / 3,
                            bound * bound / 6);
  }
  /* Resetting draws the same values again. */
  a.params[3] = 99;
  ck_assert_int_eq(st_model_reset_params(&a, 42), 0);
  ck_assert_int_eq(memcmp(a.params, b.params, a.n_params * sizeof(float)), 0);
  st_model_close(&a);
  st_model_close(&b);
  st_model_close(&c);
  st_backend_close(be);
}
END_TEST

/* ---- Gradients against float64 finite differences
 * ----------------------------------- */

/* Mean loss of the model over a batch, in float64, from float64 params.
 * Also returns a hash of the ReLU pattern so that a finite difference that
 * crosses a kink can be recognized and skipped. */
static double ref_loss(const st_model_spec_t* s, const double* p,
                       const float* x, const float* y, size_t rows,
                       uint64_t* relu_hash) {
  size_t widest = 0;
  for (int l = 0; l <= s->n_layers; l++)
    if (s->sizes[l] > widest)
      widest = s->sizes[l];
  double* a = malloc(widest * sizeof(double));
  double* z = malloc(widest * sizeof(double));
  double total = 0;
  uint64_t h = 1469598103934665603ull;
  for (size_t r = 0; r < rows; r++) {
    for (size_t i = 0; i < s->sizes[0]; i++)
      a[i] = x[r * s->sizes[0] + i];
    size_t off = 0;
    for (int l = 0; l < s->n_layers; l++) {
      size_t in = s->sizes[l], out = s->sizes[l + 1];
      const double* w = p + off;
      const double* b = p + off + out * in;
      off += out * in + out;
      for (size_t o = 0; o < out; o++) {
        double acc = b[o];
        for (size_t i = 0; i < in; i++)
          acc += w[o * in + i] * a[i];
        if (l + 1 < s->n_layers) {
          h = (h ^ (acc > 0)) * 1099511628211ull;
          acc = acc > 0 ? acc : 0;
        }
        z[o] = acc;
      }
      memcpy(a, z, out * sizeof(double));
    }
    size_t out = s->sizes[s->n_layers];
    if (s->kind == ST_MODEL_LINEAR) {
      double d = a[0] - y[r];
      total += 0.5 * d * d;
    } else {
      double mx = a[0];
      for (size_t o = 1; o < out; o++)
        mx = a[o] > mx ? a[o] : mx;
      double se = 0;
      for (size_t o = 0; o < out; o++)
        se += exp(a[o] - mx);
      total += -(a[(size_t) y[r]] - mx - log(se));
    }
  }
  free(a);
  free(z);
  if (relu_hash)
    *relu_hash = h;
  return total / (double) rows;
}

static const struct {
  const char* spec;
  size_t rows;
} grad_cases[] = {
    {"mlp:5-7-3-4", 3},  {"mlp:5-7-3-4", 1}, {"mlp:6-4-4-4-3", 5},
    {"mlp:13-11-2", 17}, {"softmax:5-3", 4}, {"softmax:1-2", 1},
    {"linear:4-1", 6},   {"linear:1-1", 1},
};

START_TEST(test_gradients_match_finite_differences) {
  st_backend_t* be = open_cpu();
  st_model_spec_t spec;
  ck_assert_int_eq(st_model_spec_parse(grad_cases[_i].spec, &spec, NULL, 0), 0);
  size_t rows = grad_cases[_i].rows;
  st_model_t m;
  st_rng_t rng;
  st_rng_seed(&rng, tu_seed() + (uint64_t) _i);
  ck_assert_int_eq(st_model_init(&m, be, &spec, rows, st_rng_next(&rng)), 0);

  size_t in = spec.sizes[0];
  float* x = st_model_input(&m);
  float* y = st_model_targets(&m);
  tu_fill_uniform(&rng, x, rows * in, -2.0f, 2.0f);
  size_t classes = st_model_spec_classes(&spec);
  for (size_t r = 0; r < rows; r++)
    y[r] = classes ? (float) st_rng_below(&rng, classes)
                   : (float) (st_rng_uniform(&rng) * 4 - 2);

  double loss = 0;
  ck_assert_int_eq(st_model_step(&m, rows, &loss), 0);
  double* p = malloc(m.n_params * sizeof(double));
  for (size_t i = 0; i < m.n_params; i++)
    p[i] = m.params[i];
  double ref = ref_loss(&spec, p, x, y, rows, NULL);
  ck_assert_msg(fabs(ref - loss) <= 1e-5 + 1e-5 * fabs(ref),
                "loss %.9g vs float64 %.9g", loss, ref);

  const double h = 1e-5;
  size_t checked = 0;
  for (size_t i = 0; i < m.n_params; i++) {
    uint64_t h_plus, h_minus;
    double save = p[i];
    p[i] = save + h;
    double lp = ref_loss(&spec, p, x, y, rows, &h_plus);
    p[i] = save - h;
    double lm = ref_loss(&spec, p, x, y, rows, &h_minus);
    p[i] = save;
    if (h_plus != h_minus)
      continue; /* the difference crosses a ReLU kink */
    double fd = (lp - lm) / (2 * h);
    double g = m.grads[i];
    ck_assert_msg(fabs(fd - g) <= 2e-5 + 2e-3 * fabs(fd),
                  "%s param %zu: analytic %.9g, finite difference %.9g",
                  grad_cases[_i].spec, i, g, fd);
    checked++;
  }
  ck_assert_uint_ge(checked, m.n_params * 9 / 10);
  free(p);
  st_model_close(&m);
  st_backend_close(be);
}
END_TEST

/* ---- Optimizers
 * ---------------------------------------------------------------------- */

/* Runs three updates of `kind` on random params/grads and compares with a
 * float64 implementation of the same formulas (PyTorch's definitions). */
static void check_optimizer(st_opt_kind_t kind, float wd, float clip) {
  st_backend_t* be = open_cpu();
  const size_t n = 257;
  st_rng_t rng;
  st_rng_seed(&rng, tu_seed() ^ (uint64_t) kind);
  st_opt_config_t cfg;
  st_opt_config_default(&cfg);
  cfg.kind = kind;
  cfg.momentum = 0.8f;
  cfg.weight_decay = wd;
  cfg.clip_norm = clip;
  st_optim_t o;
  ck_assert_int_eq(st_optim_init(&o, be, &cfg, n), 0);
  float *p, *g;
  ck_assert_int_eq(st_buf_alloc(be, n, &p), 0);
  ck_assert_int_eq(st_buf_alloc(be, n, &g), 0);
  tu_fill_uniform(&rng, p, n, -1, 1);
  double rp[257], rm[257] = {0}, rv[257] = {0};
  for (size_t i = 0; i < n; i++)
    rp[i] = p[i];
  for (int t = 1; t <= 3; t++) {
    double lr = 0.1 * t;
    tu_fill_uniform(&rng, g, n, -1, 1);
    double rg[257], ss = 0;
    for (size_t i = 0; i < n; i++) {
      rg[i] = g[i];
      ss += rg[i] * rg[i];
    }
    double norm = sqrt(ss), got_norm = 0;
    if (clip > 0 && norm > clip)
      for (size_t i = 0; i < n; i++)
        rg[i] *= clip / norm;
    ck_assert_int_eq(st_optim_step(&o, p, g, (float) lr, &got_norm), 0);
    ck_assert_double_eq_tol(got_norm, norm, 1e-4 * norm);
    for (size_t i = 0; i < n; i++) {
      double d = rg[i] + wd * rp[i];
      switch (kind) {
        case ST_OPT_SGD:
          rp[i] -= lr * d;
          break;
        case ST_OPT_MOMENTUM:
        case ST_OPT_NESTEROV:
          rm[i] = 0.8 * rm[i] + d;
          rp[i] -= lr * (kind == ST_OPT_NESTEROV ? d + 0.8 * rm[i] : rm[i]);
          break;
        case ST_OPT_ADAMW:
          rp[i] -= lr * wd * rp[i];
          rm[i] = 0.9 * rm[i] + 0.1 * rg[i];
          rv[i] = 0.999 * rv[i] + 0.001 * rg[i] * rg[i];
          rp[i] -= lr * (rm[i] / (1 - pow(0.9, t))) /
                   (sqrt(rv[i] / (1 - pow(0.999, t))) + 1e-8);
          break;
      }
    }
    long bad = tu_first_mismatch(rp, p, n, 1e-5, 1e-4);
    ck_assert_msg(bad < 0, "%s step %d index %ld: %.9g vs %.9g",
                  st_opt_kind_name(kind), t, bad, p[bad < 0 ? 0 : bad],
                  rp[bad < 0 ? 0 : bad]);
  }
  ck_assert_uint_eq(o.t, 3);
  st_buf_free(be, p);
  st_buf_free(be, g);
  st_optim_close(&o);
  st_backend_close(be);
}

static const struct {
  st_opt_kind_t kind;
  float wd, clip;
} opt_cases[] = {
    {ST_OPT_SGD, 0, 0},       {ST_OPT_SGD, 0.01f, 0},
    {ST_OPT_MOMENTUM, 0, 0},  {ST_OPT_MOMENTUM, 0.05f, 1.0f},
    {ST_OPT_NESTEROV, 0, 0},  {ST_OPT_NESTEROV, 0.01f, 2.0f},
    {ST_OPT_ADAMW, 0, 0},     {ST_OPT_ADAMW, 0.1f, 0.5f},
    {ST_OPT_SGD, 0, 1000.0f}, /* clip above the norm: no change */
};

START_TEST(test_optimizers) {
  check_optimizer(opt_cases[_i].kind, opt_cases[_i].wd, opt_cases[_i].clip);
}
END_TEST

START_TEST(test_opt_names) {
  st_opt_kind_t k;
  for (int i = 0; i < 4; i++) {
    ck_assert_int_eq(st_opt_kind_parse(st_opt_kind_name((st_opt_kind_t) i), &k),
                     0);
    ck_assert_int_eq(k, i);
  }
  ck_assert_int_lt(st_opt_kind_parse("adam", &k), 0);
  st_sched_kind_t s;
  ck_assert_int_eq(st_sched_kind_parse("cosine", &s), 0);
  ck_assert_int_eq(s, ST_SCHED_COSINE);
  ck_assert_int_lt(st_sched_kind_parse("linear", &s), 0);
}
END_TEST

/* ---- Schedules
 * ----------------------------------------------------------------------- */

static const struct {
  st_schedule_t s;
  uint64_t step;
  double lr;
} sched_cases[] = {
    {{ST_SCHED_CONSTANT, 0.1, 0, 0, 0, 0, 0}, 0, 0.1},
    {{ST_SCHED_CONSTANT, 0.1, 0, 0, 0, 0, 0}, 1000000, 0.1},
    {{ST_SCHED_CONSTANT, 0.1, 10, 0, 0, 0, 0}, 0, 0.01},
    {{ST_SCHED_CONSTANT, 0.1, 10, 0, 0, 0, 0}, 4, 0.05},
    {{ST_SCHED_CONSTANT, 0.1, 10, 0, 0, 0, 0}, 9, 0.1},
    {{ST_SCHED_CONSTANT, 0.1, 10, 0, 0, 0, 0}, 10, 0.1},
    {{ST_SCHED_STEP, 1.0, 0, 0, 100, 0.1, 0}, 99, 1.0},
    {{ST_SCHED_STEP, 1.0, 0, 0, 100, 0.1, 0}, 100, 0.1},
    {{ST_SCHED_STEP, 1.0, 0, 0, 100, 0.1, 0}, 250, 0.01},
    {{ST_SCHED_STEP, 1.0, 5, 0, 100, 0.5, 0}, 104, 1.0},
    {{ST_SCHED_STEP, 1.0, 5, 0, 100, 0.5, 0}, 105, 0.5},
    {{ST_SCHED_COSINE, 0.05, 0, 1000, 0, 0, 0}, 0, 0.05},
    {{ST_SCHED_COSINE, 0.05, 0, 1000, 0, 0, 0}, 500, 0.025},
    {{ST_SCHED_COSINE, 0.05, 0, 1000, 0, 0, 0},
     250,
     0.05 * (1 + 0.70710678118654752) / 2},
    {{ST_SCHED_COSINE, 0.05, 0, 1000, 0, 0, 0}, 1000, 0.0},
    {{ST_SCHED_COSINE, 0.05, 0, 1000, 0, 0, 0.001}, 5000, 0.001},
    {{ST_SCHED_COSINE, 0.05, 100, 1100, 0, 0, 0}, 600, 0.025},
    {{ST_SCHED_COSINE, 0.05, 100, 1100, 0, 0, 0}, 49, 0.025},
};

START_TEST(test_schedules) {
  double got = st_schedule_lr(&sched_cases[_i].s, sched_cases[_i].step);
  ck_assert_msg(fabs(got - sched_cases[_i].lr) < 1e-12,
                "case %d: lr %.12g, want %.12g", _i, got, sched_cases[_i].lr);
}
END_TEST

/* ---- Convergence
 * ----------------------------------------------------------------------- */

/* Linear regression by SGD with momentum must reach the least-squares
 * solution computed in closed form (normal equations, float64). */
START_TEST(test_linear_regression_reaches_least_squares) {
  enum { D = 3, N = 64 };
  st_backend_t* be = open_cpu();
  st_model_spec_t spec;
  ck_assert_int_eq(st_model_spec_parse("linear:3-1", &spec, NULL, 0), 0);
  st_model_t m;
  ck_assert_int_eq(st_model_init(&m, be, &spec, N, 7), 0);
  st_rng_t rng;
  st_rng_seed(&rng, tu_seed());
  float* x = st_model_input(&m);
  float* y = st_model_targets(&m);
  tu_fill_uniform(&rng, x, N * D, -1, 1);
  for (int r = 0; r < N; r++)
    y[r] = (float) (1.5 * x[r * D] - 2.0 * x[r * D + 1] + 0.5 * x[r * D + 2] +
                    0.3 + 0.1 * st_rng_normal(&rng));
  /* Normal equations over [x, 1]: A^T A w = A^T y, solved by Gaussian
   * elimination with partial pivoting. */
  double ata[D + 1][D + 2] = {{0}};
  for (int r = 0; r < N; r++) {
    double a[D + 1] = {x[r * D], x[r * D + 1], x[r * D + 2], 1};
    for (int i = 0; i <= D; i++) {
      for (int j = 0; j <= D; j++)
        ata[i][j] += a[i] * a[j];
      ata[i][D + 1] += a[i] * y[r];
    }
  }
  for (int c = 0; c <= D; c++) {
    int piv = c;
    for (int r = c + 1; r <= D; r++)
      if (fabs(ata[r][c]) > fabs(ata[piv][c]))
        piv = r;
    for (int j = 0; j <= D + 1; j++) {
      double t = ata[c][j];
      ata[c][j] = ata[piv][j];
      ata[piv][j] = t;
    }
    for (int r = 0; r <= D; r++) {
      if (r == c)
        continue;
      double f = ata[r][c] / ata[c][c];
      for (int j = 0; j <= D + 1; j++)
        ata[r][j] -= f * ata[c][j];
    }
  }
  st_opt_config_t cfg;
  st_opt_config_default(&cfg);
  cfg.kind = ST_OPT_MOMENTUM;
  st_optim_t o;
  ck_assert_int_eq(st_optim_init(&o, be, &cfg, m.n_params), 0);
  double loss = 0;
  for (int step = 0; step < 3000; step++) {
    ck_assert_int_eq(st_model_step(&m, N, &loss), 0);
    ck_assert_int_eq(st_optim_step(&o, m.params, m.grads, 0.05f, NULL), 0);
  }
  for (int i = 0; i <= D; i++) {
    double want = ata[i][D + 1] / ata[i][i];
    ck_assert_msg(fabs(m.params[i] - want) < 1e-4, "w[%d] = %.6f, want %.6f", i,
                  m.params[i], want);
  }
  st_optim_close(&o);
  st_model_close(&m);
  st_backend_close(be);
}
END_TEST

/* An MLP trained with AdamW must separate points inside and outside a
 * circle, which no linear model can do. */
START_TEST(test_mlp_learns_nonlinear_boundary) {
  enum { N = 256 };
  st_backend_t* be = open_cpu();
  st_model_spec_t spec;
  ck_assert_int_eq(st_model_spec_parse("mlp:2-32-32-2", &spec, NULL, 0), 0);
  st_model_t m;
  ck_assert_int_eq(st_model_init(&m, be, &spec, N, 3), 0);
  st_rng_t rng;
  st_rng_seed(&rng, tu_seed());
  float xs[N * 2], ys[N];
  for (int r = 0; r < N; r++) {
    xs[2 * r] = (float) (st_rng_uniform(&rng) * 2 - 1);
    xs[2 * r + 1] = (float) (st_rng_uniform(&rng) * 2 - 1);
    ys[r] = xs[2 * r] * xs[2 * r] + xs[2 * r + 1] * xs[2 * r + 1] < 0.5f;
  }
  st_opt_config_t cfg;
  st_opt_config_default(&cfg);
  cfg.kind = ST_OPT_ADAMW;
  cfg.weight_decay = 1e-4f;
  st_optim_t o;
  ck_assert_int_eq(st_optim_init(&o, be, &cfg, m.n_params), 0);
  for (int step = 0; step < 1500; step++) {
    memcpy(st_model_input(&m), xs, sizeof(xs));
    memcpy(st_model_targets(&m), ys, sizeof(ys));
    ck_assert_int_eq(st_model_step(&m, N, NULL), 0);
    ck_assert_int_eq(st_optim_step(&o, m.params, m.grads, 0.01f, NULL), 0);
  }
  double loss = 0;
  size_t correct = 0;
  ck_assert_int_eq(st_model_eval(&m, N, &loss, &correct), 0);
  ck_assert_msg(correct >= N * 95 / 100, "accuracy %zu/%d", correct, N);
  st_optim_close(&o);
  st_model_close(&m);
  st_backend_close(be);
}
END_TEST

static Suite* optimizer_suite(void) {
  Suite* s = suite_create("optimizer");
  TCase* tc = tcase_create("core");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_spec_parse, 0,
                      (int) (sizeof(spec_cases) / sizeof(spec_cases[0])));
  tcase_add_test(tc, test_init_deterministic);
  tcase_add_loop_test(tc, test_gradients_match_finite_differences, 0,
                      (int) (sizeof(grad_cases) / sizeof(grad_cases[0])));
  tcase_add_loop_test(tc, test_optimizers, 0,
                      (int) (sizeof(opt_cases) / sizeof(opt_cases[0])));
  tcase_add_test(tc, test_opt_names);
  tcase_add_loop_test(tc, test_schedules, 0,
                      (int) (sizeof(sched_cases) / sizeof(sched_cases[0])));
  tcase_add_test(tc, test_linear_regression_reaches_least_squares);
  tcase_add_test(tc, test_mlp_learns_nonlinear_boundary);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  tu_seed();
  SRunner* sr = srunner_create(optimizer_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
