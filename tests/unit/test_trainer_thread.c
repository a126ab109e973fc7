/* test_trainer_thread.c: the Check suite of the trainer thread
 * (node/daemon/trainer_thread.c) and of st_trainer_set_position
 * (node/train/trainer.c), on a small generated two-class problem (200 examples,
 * 4 features).
 *
 * Every wait is bounded: the tests wake on the thread's notify callback
 * (a condition variable) with a deadline, so a bug fails a test instead of
 * hanging it. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "node/train/train.h"
#include "node/daemon/trainer_thread.h"
#include "tests/unit/testutil.h"

enum { N_TRAIN = 200, N_TEST = 100, DIM = 4, BATCH = 32 };
/* ceil(200 / 32) */
#define STEPS_PER_EPOCH 7u
#define SEED 42u
/* Generous: the suites also run under ASan and UBSan. */
#define WAIT_S 30.0
/* Epochs that no test sees the end of. */
#define FOREVER 1000000000u

static char tmp[256];
/* "cpu", then "cuda" when a GPU is present (main). */
static const char* device = "cpu";
static st_backend_t* be;
static st_dataset_t train_set, test_set;

/* ---- Fixture
 * ------------------------------------------------------------------- */

/* A separable two-class problem: class 1 when x0 + 0.5 x1 - x2 > 0. */
static void make_dataset(st_dataset_t* ds, size_t n, uint64_t seed) {
  memset(ds, 0, sizeof(*ds));
  ds->n = n;
  ds->dim = DIM;
  ds->n_classes = 2;
  ds->x = malloc(n * DIM * sizeof(float));
  ds->y = malloc(n * sizeof(float));
  ck_assert(ds->x != NULL && ds->y != NULL);
  st_rng_t rng;
  st_rng_seed(&rng, seed);
  for (size_t i = 0; i < n; i++) {
    float* x = ds->x + i * DIM;
    tu_fill_uniform(&rng, x, DIM, -1.0f, 1.0f);
    ds->y[i] = x[0] + 0.5f * x[1] - x[2] > 0 ? 1.0f : 0.0f;
  }
  snprintf(ds->source, sizeof(ds->source), "generated(%zu)", n);
}

static void setup(void) {
  char err[256];
  ck_assert_int_eq(tu_mkdtemp(tmp, sizeof(tmp)), 0);
  ck_assert_msg(st_backend_open(&be, device, 1, err, sizeof(err)) == 0, "%s",
                err);
  make_dataset(&train_set, N_TRAIN, 1);
  make_dataset(&test_set, N_TEST, 2);
}

static void teardown(void) {
  st_dataset_free(&train_set);
  st_dataset_free(&test_set);
  st_backend_close(be);
  tu_rmtree(tmp);
}

static void path_in_tmp(char* buf, size_t len, const char* name) {
  ck_assert_uint_lt((size_t) snprintf(buf, len, "%s/%s", tmp, name), len);
}

static void train_config(st_train_config_t* cfg, const char* model, double lr,
                         uint32_t epochs) {
  char err[256];
  st_train_config_default(cfg);
  ck_assert_msg(st_model_spec_parse(model, &cfg->model, err, sizeof(err)) == 0,
                "%s", err);
  cfg->batch = BATCH;
  cfg->epochs = epochs;
  cfg->sched.base_lr = lr;
  cfg->seed = SEED;
}

static void trainer_open(st_trainer_t* t, const st_train_config_t* cfg) {
  char err[256];
  ck_assert_msg(st_trainer_init(t, be, &train_set, cfg, err, sizeof(err)) == 0,
                "%s", err);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---- Notify and bounded waits
 * --------------------------------------------------- */

static pthread_mutex_t wake_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake_cv = PTHREAD_COND_INITIALIZER;
static unsigned notified;

static void on_notify(void* arg) {
  (void) arg;
  pthread_mutex_lock(&wake_mu);
  notified++;
  pthread_cond_broadcast(&wake_cv);
  pthread_mutex_unlock(&wake_mu);
}

static unsigned notify_count(void) {
  pthread_mutex_lock(&wake_mu);
  unsigned n = notified;
  pthread_mutex_unlock(&wake_mu);
  return n;
}

/* The next event, waiting for one at most timeout_s; false on timeout. */
static bool next_event(st__tt_t* tt, st__tt_event_t* ev, double timeout_s) {
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += (time_t) timeout_s;
  for (;;) {
    unsigned seen = notify_count();
    if (st__tt_poll(tt, ev))
      return true;
    pthread_mutex_lock(&wake_mu);
    int rc = 0;
    while (notified == seen && rc == 0)
      rc = pthread_cond_timedwait(&wake_cv, &wake_mu, &dl);
    pthread_mutex_unlock(&wake_mu);
    if (rc != 0)
      return st__tt_poll(tt, ev);
  }
}

/* Waits for an event of `kind`; events of other kinds are dropped. */
static void wait_kind(st__tt_t* tt, st__tt_ev_kind_t kind, st__tt_event_t* ev) {
  double end = now_s() + WAIT_S;
  for (;;) {
    double left = end - now_s();
    ck_assert_msg(left > 0 && next_event(tt, ev, left),
                  "no event of kind %d within %.0f s", (int) kind, WAIT_S);
    if (ev->kind == kind)
      return;
  }
}

/* Waits until the published step reaches `step`. */
static void wait_step(st__tt_t* tt, uint64_t step, st__tt_stats_t* s) {
  double end = now_s() + WAIT_S;
  for (;;) {
    st__tt_stats(tt, s);
    if (s->step >= step)
      return;
    ck_assert_msg(now_s() < end, "step %llu not reached (at %llu)",
                  (unsigned long long) step, (unsigned long long) s->step);
    sleep_ms(1);
  }
}

static void tt_config(st__tt_config_t* c, st_trainer_t* t) {
  memset(c, 0, sizeof(*c));
  c->trainer = t;
  c->test = &test_set;
  c->notify = on_notify;
}

static st__tt_t* tt_start(const st__tt_config_t* c) {
  st__tt_t* tt = NULL;
  ck_assert_int_eq(st__tt_start(c, &tt), 0);
  ck_assert_ptr_nonnull(tt);
  return tt;
}

static void stop_ok(st__tt_t* tt, bool checkpoint) {
  char err[256] = "";
  ck_assert_msg(st__tt_stop(tt, checkpoint, err, sizeof(err)) == 0, "%s", err);
}

/* The parameters a fresh model of cfg starts from. */
static float* initial_params(const st_train_config_t* cfg, size_t* n) {
  st_model_t m;
  ck_assert_int_eq(st_model_init(&m, be, &cfg->model, 1, cfg->seed), 0);
  float* p = malloc(m.n_params * sizeof(float));
  ck_assert_ptr_nonnull(p);
  ck_assert_int_eq(st_copy_to_host(be, p, m.params, m.n_params), 0);
  *n = m.n_params;
  st_model_close(&m);
  return p;
}

static float* snapshot(st__tt_t* tt, uint64_t tag, st__tt_event_t* ev) {
  size_t n = st__tt_n_params(tt);
  float* p = malloc(n * sizeof(float));
  ck_assert_ptr_nonnull(p);
  for (size_t i = 0; i < n; i++)
    p[i] = NAN;
  ck_assert_int_eq(st__tt_request_snapshot(tt, tag, p), 0);
  wait_kind(tt, ST__TT_EV_SNAPSHOT, ev);
  ck_assert_uint_eq(ev->tag, tag);
  ck_assert(ev->ok);
  return p;
}

/* ==== st_trainer_set_position ============================================ */

/* Positions to jump to: the start, inside the first epoch, its last step,
 * an epoch boundary, inside a later epoch, the last step, and done. */
static const uint64_t jump_to[] = {0,
                                   1,
                                   STEPS_PER_EPOCH - 1,
                                   STEPS_PER_EPOCH,
                                   10,
                                   3 * STEPS_PER_EPOCH - 1,
                                   3 * STEPS_PER_EPOCH};

START_TEST(set_position_matches_stepping) {
  uint64_t k = jump_to[_i];
  st_train_config_t cfg;
  train_config(&cfg, "mlp:4-8-2", 0.1, 3);
  /* A step schedule, so that a wrong step shows in the learning rate. */
  cfg.sched.kind = ST_SCHED_STEP;
  cfg.sched.step_every = 4;
  cfg.sched.gamma = 0.5;
  st_trainer_t a, b;
  trainer_open(&a, &cfg);
  trainer_open(&b, &cfg);
  ck_assert_uint_eq(a.steps_per_epoch, STEPS_PER_EPOCH);
  for (uint64_t i = 0; i < k; i++)
    ck_assert_int_eq(st_trainer_step(&a, NULL), 0);
  /* b is elsewhere first (in another epoch, with another order). */
  for (int i = 0; i < 9; i++)
    ck_assert_int_eq(st_trainer_step(&b, NULL), 0);
  ck_assert_int_eq(st_trainer_set_position(&b, k), 0);

  ck_assert_uint_eq(b.step, a.step);
  ck_assert_uint_eq(b.epoch, a.epoch);
  ck_assert_uint_eq(b.pos, a.pos);
  ck_assert_uint_eq(b.epoch, k / STEPS_PER_EPOCH);
  ck_assert_uint_eq(b.pos, k % STEPS_PER_EPOCH);
  ck_assert_mem_eq(b.order, a.order, a.shard_count * sizeof(size_t));
  ck_assert(st_trainer_done(&b) == st_trainer_done(&a));
  ck_assert(st_trainer_done(&b) == (k >= 3 * STEPS_PER_EPOCH));

  /* The next batches are the same examples, at the same learning rate. */
  float xa[BATCH * DIM], xb[BATCH * DIM], ya[BATCH], yb[BATCH];
  for (int s = 0; s < 3 && !st_trainer_done(&a); s++) {
    size_t rows = a.shard_count - a.pos * BATCH;
    if (rows > BATCH)
      rows = BATCH;
    ck_assert_int_eq(st_trainer_step(&a, NULL), 0);
    ck_assert_int_eq(st_trainer_step(&b, NULL), 0);
    ck_assert_int_eq(
        st_copy_to_host(be, xa, st_model_input(&a.model), rows * DIM), 0);
    ck_assert_int_eq(
        st_copy_to_host(be, xb, st_model_input(&b.model), rows * DIM), 0);
    ck_assert_int_eq(st_copy_to_host(be, ya, st_model_targets(&a.model), rows),
                     0);
    ck_assert_int_eq(st_copy_to_host(be, yb, st_model_targets(&b.model), rows),
                     0);
    ck_assert_mem_eq(xb, xa, rows * DIM * sizeof(float));
    ck_assert_mem_eq(yb, ya, rows * sizeof(float));
    ck_assert_double_eq(b.last_lr, a.last_lr);
    ck_assert_uint_eq(b.step, a.step);
    ck_assert_uint_eq(b.pos, a.pos);
    ck_assert_mem_eq(b.order, a.order, a.shard_count * sizeof(size_t));
  }
  st_trainer_close(&a);
  st_trainer_close(&b);

  st_trainer_t zero;
  memset(&zero, 0, sizeof(zero));
  ck_assert_int_eq(st_trainer_set_position(&zero, k), -EINVAL);
}
END_TEST

/* ==== Mailbox before go ==================================================
 */

START_TEST(snapshot_before_go_is_initial) {
  st_train_config_t cfg;
  train_config(&cfg, "mlp:4-8-2", 0.1, 3);
  st_trainer_t t;
  trainer_open(&t, &cfg);
  st__tt_config_t c;
  tt_config(&c, &t);
  st__tt_t* tt = tt_start(&c);
  size_t n;
  float* p0 = initial_params(&cfg, &n);
  ck_assert_uint_eq(st__tt_n_params(tt), n);
  ck_assert_uint_eq(n, 4 * 8 + 8 + 8 * 2 + 2);
  unsigned before = notify_count();
  st__tt_event_t ev;
  float* got = snapshot(tt, 11, &ev);
  ck_assert_uint_ge(notify_count(), before + 1);
  ck_assert_uint_eq(ev.step, 0);
  ck_assert_mem_eq(got, p0, n * sizeof(float));
  /* Nothing steps before go. */
  st__tt_stats_t s;
  st__tt_stats(tt, &s);
  ck_assert_uint_eq(s.step, 0);
  ck_assert(!s.stepping);
  ck_assert(isnan(s.loss) && isnan(s.test_accuracy) && isnan(s.test_loss));
  stop_ok(tt, false);
  st_trainer_close(&t);
  free(got);
  free(p0);
}
END_TEST

START_TEST(apply_before_go_is_exact) {
  st_train_config_t cfg;
  train_config(&cfg, "mlp:4-8-2", 0.1, 3);
  st_trainer_t t;
  trainer_open(&t, &cfg);
  st__tt_config_t c;
  tt_config(&c, &t);
  st__tt_t* tt = tt_start(&c);
  size_t n;
  float* p0 = initial_params(&cfg, &n);
  float* delta = malloc(n * sizeof(float));
  float* after = malloc(n * sizeof(float));
  ck_assert(delta != NULL && after != NULL);
  for (size_t i = 0; i < n; i++) {
    delta[i] = (float) ((int) (i % 7) - 3) * 0.125f;
    after[i] = NAN;
  }
  /* Posted back to back: served in order, so the snapshot sees the
   * correction. */
  ck_assert_int_eq(st__tt_request_apply(tt, 5, delta, 0.5f), 0);
  ck_assert_int_eq(st__tt_request_snapshot(tt, 6, after), 0);
  st__tt_event_t ev;
  ck_assert(next_event(tt, &ev, WAIT_S));
  ck_assert_int_eq(ev.kind, ST__TT_EV_APPLIED);
  ck_assert_uint_eq(ev.tag, 5);
  ck_assert(ev.ok);
  ck_assert(next_event(tt, &ev, WAIT_S));
  ck_assert_int_eq(ev.kind, ST__TT_EV_SNAPSHOT);
  ck_assert_uint_eq(ev.tag, 6);
  for (size_t i = 0; i < n; i++)
    ck_assert_float_eq(after[i], p0[i] + 0.5f * delta[i]);
  st__tt_stats_t s;
  st__tt_stats(tt, &s);
  ck_assert_uint_eq(s.corrections, 1);
  stop_ok(tt, false);
  st_trainer_close(&t);
  free(p0);
  free(delta);
  free(after);
}
END_TEST

START_TEST(set_state_refuses) {
  st_train_config_t cfg;
  train_config(&cfg, "mlp:4-8-2", 0.1, 3);
  st_trainer_t t;
  trainer_open(&t, &cfg);
  st__tt_config_t c;
  tt_config(&c, &t);
  st__tt_t* tt = tt_start(&c);
  size_t n = st__tt_n_params(tt);
  float* p = calloc(n, sizeof(float));
  ck_assert_ptr_nonnull(p);
  ck_assert_int_eq(st__tt_set_state(tt, p, n - 1, 3), -EINVAL);
  ck_assert_int_eq(st__tt_set_state(tt, p, n + 1, 3), -EINVAL);
  p[n / 2] = NAN;
  ck_assert_int_eq(st__tt_set_state(tt, p, n, 3), -EDOM);
  p[n / 2] = INFINITY;
  ck_assert_int_eq(st__tt_set_state(tt, p, n, 3), -EDOM);
  p[n / 2] = 0;
  /* Nothing was adopted by the refused calls. */
  st__tt_stats_t s;
  st__tt_stats(tt, &s);
  ck_assert_uint_eq(s.step, 0);
  ck_assert_int_eq(st__tt_set_state(tt, p, n, 3), 0);
  st__tt_go(tt);
  ck_assert_int_eq(st__tt_set_state(tt, p, n, 3), -EINVAL);
  stop_ok(tt, false);
  st_trainer_close(&t);
  free(p);
}
END_TEST

START_TEST(set_state_then_go) {
  st_train_config_t cfg;
  train_config(&cfg, "mlp:4-8-2", 0.1, FOREVER);
  st_trainer_t t;
  trainer_open(&t, &cfg);
  st__tt_config_t c;
  tt_config(&c, &t);
  st__tt_t* tt = tt_start(&c);
  size_t n = st__tt_n_params(tt);
  float* p = malloc(n * sizeof(float));
  ck_assert_ptr_nonnull(p);
  for (size_t i = 0; i < n; i++)
    p[i] = 0.01f * (float) i - 0.2f;
  const uint64_t at = 4 * STEPS_PER_EPOCH + 3;
  ck_assert_int_eq(st__tt_set_state(tt, p, n, at), 0);
  st__tt_stats_t s;
  st__tt_stats(tt, &s);
  ck_assert_uint_eq(s.step, at);
  ck_assert_uint_eq(s.epoch, 4);
  st__tt_event_t ev;
  float* got = snapshot(tt, 1, &ev);
  ck_assert_uint_eq(ev.step, at);
  ck_assert_mem_eq(got, p, n * sizeof(float));
  free(got);

  st__tt_go(tt);
  wait_step(tt, at + 5, &s);
  ck_assert(s.stepping);
  ck_assert(isfinite(s.loss));
  ck_assert_uint_ge(s.epoch, 4);
  got = snapshot(tt, 2, &ev);
  ck_assert_uint_ge(ev.step, at + 5);
  ck_assert(memcmp(got, p, n * sizeof(float)) != 0); /* it trained */
  free(got);
  stop_ok(tt, false);
  st_trainer_close(&t);
  free(p);
}
END_TEST

START_TEST(queue_full_is_ebusy) {
  st_train_config_t cfg;
  train_config(&cfg, "softmax:4-2", 0.1, 3);
  st_trainer_t t;
  trainer_open(&t, &cfg);
  st__tt_config_t c;
  tt_config(&c, &t);
  st__tt_t* tt = tt_start(&c);
  size_t n = st__tt_n_params(tt);
  float* bufs = malloc((ST__TT_MAX_SNAPSHOTS + 1) * n * sizeof(float));
  float* zero = calloc(n, sizeof(float));
  ck_assert(bufs != NULL && zero != NULL);
  /* A request counts until its result is drained, so this is exact even
   * though the thread answers at once. */
  for (uint64_t i = 0; i < ST__TT_MAX_SNAPSHOTS; i++)
    ck_assert_int_eq(st__tt_request_snapshot(tt, i, bufs + i * n), 0);
  ck_assert_int_eq(
      st__tt_request_snapshot(tt, 99, bufs + ST__TT_MAX_SNAPSHOTS * n), -EBUSY);
  for (uint64_t i = 0; i < ST__TT_MAX_APPLIES; i++)
    ck_assert_int_eq(st__tt_request_apply(tt, 100 + i, zero, 1.0f), 0);
  ck_assert_int_eq(st__tt_request_apply(tt, 199, zero, 1.0f), -EBUSY);

  /* Drained in order; each drained result frees one place. */
  st__tt_event_t ev;
  for (uint64_t i = 0; i < ST__TT_MAX_SNAPSHOTS; i++) {
    ck_assert(next_event(tt, &ev, WAIT_S));
    ck_assert_int_eq(ev.kind, ST__TT_EV_SNAPSHOT);
    ck_assert_uint_eq(ev.tag, i);
  }
  ck_assert_int_eq(st__tt_request_apply(tt, 199, zero, 1.0f), -EBUSY);
  ck_assert(next_event(tt, &ev, WAIT_S));
  ck_assert_int_eq(ev.kind, ST__TT_EV_APPLIED);
  ck_assert_uint_eq(ev.tag, 100);
  ck_assert_int_eq(st__tt_request_apply(tt, 200, zero, 1.0f), 0);
  ck_assert_int_eq(st__tt_request_apply(tt, 201, zero, 1.0f), -EBUSY);
  ck_assert_int_eq(st__tt_request_snapshot(tt, 300, bufs), 0);
  for (uint64_t i = 1; i < ST__TT_MAX_APPLIES; i++) {
    ck_assert(next_event(tt, &ev, WAIT_S));
    ck_assert_int_eq(ev.kind, ST__TT_EV_APPLIED);
    ck_assert_uint_eq(ev.tag, 100 + i);
  }
  ck_assert(next_event(tt, &ev, WAIT_S));
  ck_assert_uint_eq(ev.tag, 200);
  ck_assert(next_event(tt, &ev, WAIT_S));
  ck_assert_uint_eq(ev.tag, 300);
  ck_assert(!st__tt_poll(tt, &ev));
  stop_ok(tt, false);
  st_trainer_close(&t);
  free(bufs);
  free(zero);
}
END_TEST

START_TEST(start_refuses) {
  st_train_config_t cfg;
  train_config(&cfg, "mlp:4-8-2", 0.1, 3);
  st_trainer_t t;
  trainer_open(&t, &cfg);
  st__tt_config_t c;
  st__tt_t* tt = (st__tt_t*) &c; /* must be cleared on failure */
  tt_config(&c, &t);
  c.eval_every_s = -1;
  ck_assert_int_eq(st__tt_start(&c, &tt), -EINVAL);
  ck_assert_ptr_null(tt);
  tt_config(&c, &t);
  c.checkpoint_every_s = NAN;
  ck_assert_int_eq(st__tt_start(&c, &tt), -EINVAL);
  tt_config(&c, &t);
  c.trainer = NULL;
  ck_assert_int_eq(st__tt_start(&c, &tt), -EINVAL);
  /* A test set with other features than the model's inputs. */
  st_dataset_t wide = test_set;
  wide.dim = DIM + 1;
  wide.n = N_TEST / 2;
  tt_config(&c, &t);
  c.test = &wide;
  ck_assert_int_eq(st__tt_start(&c, &tt), -EINVAL);
  st_trainer_close(&t);
}
END_TEST

/* ==== Stepping ============================================================
 */

START_TEST(runs_to_epochs_done) {
  st_train_config_t cfg;
  train_config(&cfg, "softmax:4-2", 0.5, 20);
  st_trainer_t t;
  trainer_open(&t, &cfg);
  st__tt_config_t c;
  tt_config(&c, &t);
  st__tt_t* tt = tt_start(&c);
  st__tt_go(tt);
  st__tt_event_t ev;
  wait_kind(tt, ST__TT_EV_EPOCHS_DONE, &ev);
  ck_assert(ev.ok);
  ck_assert_uint_eq(ev.step, 20 * STEPS_PER_EPOCH);
  st__tt_stats_t s;
  st__tt_stats(tt, &s);
  ck_assert(s.epochs_done);
  ck_assert(!s.stepping);
  ck_assert(!s.diverged);
  ck_assert_uint_eq(s.step, 20 * STEPS_PER_EPOCH);
  ck_assert_uint_eq(s.epoch, 20);
  ck_assert_uint_eq(s.samples, 20 * N_TRAIN);
  ck_assert(isfinite(s.loss));
  ck_assert(isfinite(s.test_loss));
  ck_assert(isfinite(s.test_accuracy));
  /* A linearly separable problem: the classifier learns it. */
  ck_assert_msg(s.test_accuracy >= 0.8, "test accuracy %g", s.test_accuracy);
  ck_assert_double_eq(s.samples_per_sec, 0);

  /* Done, but still serving: a snapshot and a correction. */
  size_t n = st__tt_n_params(tt);
  float* a = snapshot(tt, 7, &ev);
  ck_assert_uint_eq(ev.step, 20 * STEPS_PER_EPOCH);
  float* ones = malloc(n * sizeof(float));
  ck_assert_ptr_nonnull(ones);
  for (size_t i = 0; i < n; i++)
    ones[i] = 1.0f;
  ck_assert_int_eq(st__tt_request_apply(tt, 8, ones, 0.25f), 0);
  wait_kind(tt, ST__TT_EV_APPLIED, &ev);
  ck_assert_uint_eq(ev.tag, 8);
  float* b = snapshot(tt, 9, &ev);
  for (size_t i = 0; i < n; i++)
    ck_assert_float_eq(b[i], a[i] + 0.25f);
  st__tt_stats(tt, &s);
  ck_assert_uint_eq(s.step, 20 * STEPS_PER_EPOCH);
  stop_ok(tt, false);
  st_trainer_close(&t);
  free(a);
  free(b);
  free(ones);
}
END_TEST

START_TEST(requests_while_stepping) {
  st_train_config_t cfg;
  train_config(&cfg, "mlp:4-8-2", 0.05, FOREVER);
  st_trainer_t t;
  trainer_open(&t, &cfg);
  st__tt_config_t c;
  tt_config(&c, &t);
  st__tt_t* tt = tt_start(&c);
  st__tt_go(tt);
  st__tt_stats_t s;
  wait_step(tt, 3, &s);
  ck_assert(s.samples_per_sec > 0);
  size_t n = st__tt_n_params(tt);
  float* zero = calloc(n, sizeof(float));
  ck_assert_ptr_nonnull(zero);
  ck_assert_int_eq(st__tt_request_apply(tt, 1, zero, 1.0f), 0);
  st__tt_event_t ev;
  wait_kind(tt, ST__TT_EV_APPLIED, &ev);
  ck_assert_uint_eq(ev.tag, 1);
  float* p = snapshot(tt, 2, &ev);
  for (size_t i = 0; i < n; i++)
    ck_assert(isfinite(p[i]));
  st__tt_stats(tt, &s);
  ck_assert(s.stepping);
  ck_assert_uint_eq(s.corrections, 1);
  ck_assert_uint_gt(s.samples, 0);
  free(p);
  /* Stop answers a request still outstanding: the buffer is written. */
  p = malloc(n * sizeof(float));
  ck_assert_ptr_nonnull(p);
  for (size_t i = 0; i < n; i++)
    p[i] = NAN;
  ck_assert_int_eq(st__tt_request_snapshot(tt, 3, p), 0);
  stop_ok(tt, false);
  for (size_t i = 0; i < n; i++)
    ck_assert(isfinite(p[i]));
  st_trainer_close(&t);
  free(p);
  free(zero);
}
END_TEST

/* Waits until the published test loss differs from `than`. */
static void wait_test_loss_change(st__tt_t* tt, double than,
                                  st__tt_stats_t* s) {
  double end = now_s() + WAIT_S;
  for (;;) {
    st__tt_stats(tt, s);
    if (!isnan(s->test_loss) && s->test_loss != than)
      return;
    ck_assert_msg(now_s() < end, "no new evaluation within %.0f s", WAIT_S);
    sleep_ms(1);
  }
}

START_TEST(evaluates_periodically_while_stepping) {
  /* One example per step over 100000 examples: an epoch takes far longer
   * than the evaluation period, so an evaluation seen in epoch 0 was a
   * periodic one. */
  st_dataset_t big;
  make_dataset(&big, 100000, 3);
  st_train_config_t cfg;
  train_config(&cfg, "mlp:4-8-2", 0.01, FOREVER);
  cfg.batch = 1;
  st_trainer_t t;
  char err[256];
  ck_assert_msg(st_trainer_init(&t, be, &big, &cfg, err, sizeof(err)) == 0,
                "%s", err);
  st__tt_config_t c;
  tt_config(&c, &t);
  c.eval_every_s = 0.001;
  st__tt_t* tt = tt_start(&c);
  st__tt_go(tt);
  st__tt_stats_t s;
  wait_test_loss_change(tt, NAN, &s);
  ck_assert_uint_eq(s.epoch, 0);
  ck_assert(isfinite(s.test_accuracy));
  /* And again, a period later. */
  wait_test_loss_change(tt, s.test_loss, &s);
  ck_assert_uint_eq(s.epoch, 0);
  stop_ok(tt, false);
  st_trainer_close(&t);
  st_dataset_free(&big);
}
END_TEST

/* A snapshot asked for during an evaluation is served between two of its
 * batches, not after the whole evaluation: a ring round waits for every
 * member's snapshot, and evaluating a large test set takes seconds. The
 * evaluation runs after every step here (period 1 ms) over 400 batches, so
 * a request nearly always lands inside one; five tries make a miss
 * vanishingly rare. Without the service between batches every snapshot
 * waits for the evaluation's end and none counts as served inside it. */
START_TEST(snapshot_served_during_evaluation) {
  st_dataset_t big_test;
  make_dataset(&big_test, 400000, 4);
  st_train_config_t cfg;
  train_config(&cfg, "mlp:4-64-2", 0.01, FOREVER);
  st_trainer_t t;
  trainer_open(&t, &cfg);
  st__tt_config_t c;
  tt_config(&c, &t);
  c.test = &big_test;
  c.eval_every_s = 0.001;
  st__tt_t* tt = tt_start(&c);
  st__tt_go(tt);
  size_t n = st__tt_n_params(tt);
  float* dst = malloc(n * sizeof(float));
  ck_assert_ptr_nonnull(dst);
  st__tt_stats_t s;
  memset(&s, 0, sizeof(s));
  for (int attempt = 0; attempt < 5 && s.mid_eval_snapshots == 0; attempt++) {
    double end = now_s() + WAIT_S;
    do {
      st__tt_stats(tt, &s);
    } while (!s.evaluating && now_s() < end);
    ck_assert_msg(s.evaluating, "no evaluation within %.0f s", WAIT_S);
    ck_assert_int_eq(st__tt_request_snapshot(tt, 100 + (uint64_t) attempt, dst),
                     0);
    st__tt_event_t ev;
    wait_kind(tt, ST__TT_EV_SNAPSHOT, &ev);
    ck_assert(ev.ok);
    st__tt_stats(tt, &s);
  }
  ck_assert_uint_ge(s.mid_eval_snapshots, 1);
  stop_ok(tt, false);
  st_trainer_close(&t);
  st_dataset_free(&big_test);
  free(dst);
}
END_TEST

START_TEST(evaluates_periodically_when_done) {
  /* After the epochs, corrections still change the model: the periodic
   * evaluation follows them. */
  st_train_config_t cfg;
  train_config(&cfg, "softmax:4-2", 0.5, 1);
  st_trainer_t t;
  trainer_open(&t, &cfg);
  st__tt_config_t c;
  tt_config(&c, &t);
  c.eval_every_s = 0.01;
  st__tt_t* tt = tt_start(&c);
  st__tt_go(tt);
  st__tt_event_t ev;
  wait_kind(tt, ST__TT_EV_EPOCHS_DONE, &ev);
  st__tt_stats_t s;
  st__tt_stats(tt, &s);
  ck_assert(isfinite(s.test_loss));
  double before = s.test_loss;
  size_t n = st__tt_n_params(tt);
  float* delta = malloc(n * sizeof(float));
  ck_assert_ptr_nonnull(delta);
  for (size_t i = 0; i < n; i++)
    delta[i] = (float) (i % 3) - 1.0f;
  ck_assert_int_eq(st__tt_request_apply(tt, 1, delta, 2.0f), 0);
  wait_kind(tt, ST__TT_EV_APPLIED, &ev);
  wait_test_loss_change(tt, before, &s);
  ck_assert_uint_eq(s.step, STEPS_PER_EPOCH);
  stop_ok(tt, false);
  st_trainer_close(&t);
  free(delta);
}
END_TEST

START_TEST(diverges) {
  st_train_config_t cfg;
  train_config(&cfg, "mlp:4-8-2", 1e30, FOREVER);
  st_trainer_t t;
  trainer_open(&t, &cfg);
  char path[512];
  path_in_tmp(path, sizeof(path), "diverged.safetensors");
  st__tt_config_t c;
  tt_config(&c, &t);
  c.checkpoint_path = path;
  st__tt_t* tt = tt_start(&c);
  st__tt_go(tt);
  st__tt_event_t ev;
  wait_kind(tt, ST__TT_EV_DIVERGED, &ev);
  ck_assert(!ev.ok);
  ck_assert_msg(strstr(ev.err, "not finite") != NULL, "%s", ev.err);
  st__tt_stats_t s;
  st__tt_stats(tt, &s);
  ck_assert(s.diverged);
  ck_assert(!s.stepping);
  ck_assert(!s.epochs_done);
  uint64_t at = s.step;
  /* Still answered, whatever the parameters hold now. */
  float* p = snapshot(tt, 4, &ev);
  ck_assert_uint_eq(ev.step, at);
  free(p);
  /* No checkpoint of a diverged model: the last good one is kept. */
  st__tt_request_checkpoint(tt);
  wait_kind(tt, ST__TT_EV_CHECKPOINT, &ev);
  ck_assert(!ev.ok);
  ck_assert(ev.err[0] != '\0');
  struct stat sb;
  ck_assert_int_ne(stat(path, &sb), 0);
  st__tt_stats(tt, &s);
  ck_assert_uint_eq(s.step, at);
  char err[256] = "";
  ck_assert_int_eq(st__tt_stop(tt, true, err, sizeof(err)), -EDOM);
  ck_assert(err[0] != '\0');
  st_trainer_close(&t);
}
END_TEST

/* ==== Checkpoints =========================================================
 */

/* Loads path into a fresh trainer of cfg; returns the step it holds. */
static uint64_t load_step(const st_train_config_t* cfg, const char* path) {
  st_trainer_t r;
  trainer_open(&r, cfg);
  char err[256];
  ck_assert_msg(st_trainer_load(&r, path, err, sizeof(err)) == 0, "%s", err);
  uint64_t step = r.step;
  st_trainer_close(&r);
  return step;
}

START_TEST(checkpoint_every) {
  st_train_config_t cfg;
  train_config(&cfg, "mlp:4-8-2", 0.05, FOREVER);
  st_trainer_t t;
  trainer_open(&t, &cfg);
  char path[512];
  path_in_tmp(path, sizeof(path), "every.safetensors");
  const st_meta_kv_t meta[] = {{"node", "test-node"}};
  st__tt_config_t c;
  tt_config(&c, &t);
  c.checkpoint_path = path;
  c.checkpoint_every_s = 0.1;
  c.ckpt_meta = meta;
  c.n_ckpt_meta = 1;
  st__tt_t* tt = tt_start(&c);
  st__tt_go(tt);
  st__tt_event_t ev;
  wait_kind(tt, ST__TT_EV_CHECKPOINT, &ev);
  ck_assert_msg(ev.ok, "%s", ev.err);
  ck_assert_uint_gt(ev.step, 0);
  /* Another one follows a period later. */
  wait_kind(tt, ST__TT_EV_CHECKPOINT, &ev);
  ck_assert_msg(ev.ok, "%s", ev.err);
  stop_ok(tt, false);
  ck_assert_uint_gt(load_step(&cfg, path), 0);
  st_safetensors_t* st;
  char err[256];
  ck_assert_msg(st_safetensors_read(path, &st, err, sizeof(err)) == 0, "%s",
                err);
  ck_assert_ptr_nonnull(st_safetensors_meta(st, "node"));
  ck_assert_str_eq(st_safetensors_meta(st, "node"), "test-node");
  st_safetensors_free(st);
  st_trainer_close(&t);
}
END_TEST

START_TEST(checkpoint_at_stop) {
  st_train_config_t cfg;
  train_config(&cfg, "mlp:4-8-2", 0.05, FOREVER);
  st_trainer_t t;
  trainer_open(&t, &cfg);
  char path[512];
  path_in_tmp(path, sizeof(path), "final.safetensors");
  st__tt_config_t c;
  tt_config(&c, &t);
  c.checkpoint_path = path;
  st__tt_t* tt = tt_start(&c);
  st__tt_go(tt);
  st__tt_stats_t s;
  wait_step(tt, 5, &s);
  struct stat sb;
  ck_assert_int_ne(stat(path, &sb), 0); /* no period: nothing yet */
  stop_ok(tt, true);
  /* The file holds the position the trainer stopped at. */
  ck_assert_uint_eq(load_step(&cfg, path), t.step);
  ck_assert_uint_ge(t.step, 5);
  st_trainer_close(&t);
}
END_TEST

START_TEST(checkpoint_on_request) {
  st_train_config_t cfg;
  train_config(&cfg, "mlp:4-8-2", 0.05, 3);
  st_trainer_t t;
  trainer_open(&t, &cfg);
  char path[512];
  path_in_tmp(path, sizeof(path), "asked.safetensors");
  st__tt_config_t c;
  tt_config(&c, &t);
  c.checkpoint_path = path;
  st__tt_t* tt = tt_start(&c);
  /* Before go: the initial model at step 0. */
  st__tt_request_checkpoint(tt);
  st__tt_event_t ev;
  wait_kind(tt, ST__TT_EV_CHECKPOINT, &ev);
  ck_assert_msg(ev.ok, "%s", ev.err);
  ck_assert_uint_eq(load_step(&cfg, path), 0);
  st__tt_go(tt);
  wait_kind(tt, ST__TT_EV_EPOCHS_DONE, &ev);
  st__tt_request_checkpoint(tt);
  wait_kind(tt, ST__TT_EV_CHECKPOINT, &ev);
  ck_assert_msg(ev.ok, "%s", ev.err);
  ck_assert_uint_eq(load_step(&cfg, path), 3 * STEPS_PER_EPOCH);
  stop_ok(tt, false);
  st_trainer_close(&t);
}
END_TEST

START_TEST(checkpoint_errors) {
  st_train_config_t cfg;
  train_config(&cfg, "mlp:4-8-2", 0.05, 3);
  st_trainer_t t;
  trainer_open(&t, &cfg);
  /* No path: a request is answered with ok false; stop has nothing to do. */
  st__tt_config_t c;
  tt_config(&c, &t);
  st__tt_t* tt = tt_start(&c);
  st__tt_request_checkpoint(tt);
  st__tt_event_t ev;
  wait_kind(tt, ST__TT_EV_CHECKPOINT, &ev);
  ck_assert(!ev.ok);
  ck_assert(ev.err[0] != '\0');
  stop_ok(tt, true);
  /* A directory that does not exist: stop reports the error. */
  char path[512];
  path_in_tmp(path, sizeof(path), "missing/final.safetensors");
  tt_config(&c, &t);
  c.checkpoint_path = path;
  tt = tt_start(&c);
  char err[256] = "";
  ck_assert_int_lt(st__tt_stop(tt, true, err, sizeof(err)), 0);
  ck_assert_msg(strstr(err, "missing") != NULL, "%s", err);
  st_trainer_close(&t);
}
END_TEST

static Suite* trainer_thread_suite(void) {
  Suite* s = suite_create("trainer_thread");
  TCase* tc = tcase_create("set_position");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_loop_test(tc, set_position_matches_stepping, 0,
                      (int) (sizeof(jump_to) / sizeof(jump_to[0])));
  suite_add_tcase(s, tc);

  tc = tcase_create("mailbox");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, snapshot_before_go_is_initial);
  tcase_add_test(tc, apply_before_go_is_exact);
  tcase_add_test(tc, set_state_refuses);
  tcase_add_test(tc, set_state_then_go);
  tcase_add_test(tc, queue_full_is_ebusy);
  tcase_add_test(tc, start_refuses);
  tcase_set_timeout(tc, 120);
  suite_add_tcase(s, tc);

  tc = tcase_create("stepping");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, runs_to_epochs_done);
  tcase_add_test(tc, requests_while_stepping);
  tcase_add_test(tc, evaluates_periodically_while_stepping);
  tcase_add_test(tc, evaluates_periodically_when_done);
  tcase_add_test(tc, snapshot_served_during_evaluation);
  tcase_add_test(tc, diverges);
  tcase_set_timeout(tc, 120);
  suite_add_tcase(s, tc);

  tc = tcase_create("checkpoint");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, checkpoint_every);
  tcase_add_test(tc, checkpoint_at_stop);
  tcase_add_test(tc, checkpoint_on_request);
  tcase_add_test(tc, checkpoint_errors);
  tcase_set_timeout(tc, 120);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  /* On the CPU backend, and again on a GPU when there is one: the thread
   * drives a backend opened on another thread. */
  int failed = 0;
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1) {
      if (tu_cuda_device_count() == 0)
        break;
      device = "cuda";
    }
    fprintf(stderr, "device: %s\n", device);
    SRunner* sr = srunner_create(trainer_thread_suite());
    srunner_run_all(sr, CK_NORMAL);
    failed += srunner_ntests_failed(sr);
    srunner_free(sr);
  }
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
