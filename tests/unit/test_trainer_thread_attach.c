/* test_trainer_thread_attach.c: the Check suite of the model-host thread in
 * attach mode (node/daemon/attach_host.c): snapshots, corrections and
 * states through the shared segment, with the program's side of the
 * protocol (attach/attach.h) played by the test itself, independently of
 * the client library.
 *
 * Every wait is bounded (WAIT_S): a bug fails a test instead of hanging
 * it. */
#define _GNU_SOURCE /* memfd_create */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "attach/attach.h"
#include "node/daemon/trainer_thread.h"
#include "node/train/train.h"
#include "tests/unit/testutil.h"

#define WAIT_S 20.0
#define N 10 /* "w" [2, 3] + "b" [4] */

static char tmp[256];
static st_attach_model_t model;

static void setup(void) {
  ck_assert_int_eq(tu_mkdtemp(tmp, sizeof(tmp)), 0);
  memset(&model, 0, sizeof(model));
  uint64_t ws[2] = {2, 3}, bs[1] = {4};
  ck_assert_int_eq(st_attach_model_add(&model, "w", "F32", 2, ws, NULL, 0), 0);
  ck_assert_int_eq(st_attach_model_add(&model, "b", "F32", 1, bs, NULL, 0), 0);
  ck_assert_uint_eq(model.n_floats, N);
}

static void teardown(void) {
  st_attach_model_free(&model);
  tu_rmtree(tmp);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Events arrive through notify; the tests poll for them with a deadline. */
static bool next_event(st__tt_t* tt, st__tt_event_t* ev, double timeout_s) {
  double end = now_s() + timeout_s;
  while (now_s() < end) {
    if (st__tt_poll(tt, ev))
      return true;
    sleep_ms(1);
  }
  return false;
}

static void notify_nothing(void* arg) {
  (void) arg;
}

static st__tt_t* host_start(const float* params, uint64_t step,
                            const char* ckpt) {
  st__tt_attach_config_t c;
  memset(&c, 0, sizeof(c));
  c.model = &model;
  c.params = params;
  c.step = step;
  c.checkpoint_path = ckpt;
  c.notify = notify_nothing;
  st__tt_t* tt = NULL;
  ck_assert_int_eq(st__tt_start_attached(&c, &tt), 0);
  return tt;
}

/* ---- The program's side -------------------------------------------------- */

typedef struct {
  uint8_t* seg;
  size_t bytes;
  st_attach_header_t* h;
  float p[N]; /* the program's parameters */
  uint64_t step;
} program_t;

/* Makes a segment as the client library does; the host unmaps it. */
static void program_make(program_t* g, float fill) {
  memset(g, 0, sizeof(*g));
  g->bytes = (size_t) st_attach_segment_bytes(N);
  g->seg = mmap(NULL, g->bytes, PROT_READ | PROT_WRITE,
                MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ck_assert(g->seg != MAP_FAILED);
  g->h = (st_attach_header_t*) (void*) g->seg;
  g->h->magic = ST_ATTACH_MAGIC;
  g->h->version = ST_ATTACH_VERSION;
  g->h->n_floats = N;
  g->h->segment_bytes = g->bytes;
  for (int i = 0; i < N; i++)
    g->p[i] = fill;
}

/* Attaches and takes the node's parameters from area B. */
static void program_attach(st__tt_t* tt, program_t* g) {
  uint64_t step = 99;
  ck_assert_int_eq(st__tt_attach_session(tt, g->seg, g->bytes, &step), 0);
  memcpy(g->p, st_attach_area_b(g->seg, N), sizeof(g->p));
  g->step = step;
}

/* One step boundary, as attach.h says. Returns the flags served. */
static unsigned program_boundary(program_t* g, bool nonfinite) {
  g->step++;
  atomic_store(&g->h->step, g->step);
  atomic_store_explicit(&g->h->boundaries, atomic_load(&g->h->boundaries) + 1,
                        memory_order_release);
  uint64_t req = atomic_load_explicit(&g->h->req_seq, memory_order_acquire);
  if (req == atomic_load(&g->h->ack_seq))
    return 0;
  unsigned f = g->h->req_flags;
  const float* b = st_attach_area_b(g->seg, N);
  if (nonfinite) {
    g->h->ack_status = ST_ATTACH_ACK_NONFINITE;
  } else {
    g->h->ack_status = ST_ATTACH_ACK_OK;
    if (f & ST_ATTACH_REQ_STATE) {
      memcpy(g->p, b, sizeof(g->p));
      g->step = g->h->state_step;
    }
    if (f & ST_ATTACH_REQ_APPLY)
      for (int i = 0; i < N; i++)
        g->p[i] += b[i];
    if (f & ST_ATTACH_REQ_SNAPSHOT)
      memcpy(st_attach_area_a(g->seg), g->p, sizeof(g->p));
  }
  atomic_store_explicit(&g->h->ack_seq, req, memory_order_release);
  atomic_fetch_add(&g->h->doorbell, 1);
  return f;
}

/* Steps (changing nothing) until the node asks for something; returns what
 * was served. */
static unsigned program_until_request(program_t* g, bool nonfinite) {
  double end = now_s() + WAIT_S;
  while (now_s() < end) {
    unsigned f = program_boundary(g, nonfinite);
    if (f != 0)
      return f;
    sleep_ms(1);
  }
  ck_abort_msg("the node asked for nothing within %.0f s", WAIT_S);
  return 0;
}

static void stop_ok(st__tt_t* tt, bool checkpoint) {
  char err[256] = "";
  ck_assert_msg(st__tt_stop(tt, checkpoint, err, sizeof(err)) == 0, "%s", err);
}

static void fill(float* v, float x) {
  for (int i = 0; i < N; i++)
    v[i] = x;
}

/* ---- Tests --------------------------------------------------------------- */

/* Without a program, snapshots are the node's copy and corrections go into
 * it at once. */
START_TEST(no_program_serves_its_copy) {
  float init[N], dst[N], delta[N];
  fill(init, 1.0f);
  fill(delta, 0.5f);
  st__tt_t* tt = host_start(init, 7, NULL);
  st__tt_event_t ev;
  ck_assert_int_eq(st__tt_request_apply(tt, 1, delta, 2.0f), 0);
  ck_assert(next_event(tt, &ev, WAIT_S));
  ck_assert_int_eq(ev.kind, ST__TT_EV_APPLIED);
  ck_assert_int_eq(st__tt_request_snapshot(tt, 2, dst), 0);
  ck_assert(next_event(tt, &ev, WAIT_S));
  ck_assert_int_eq(ev.kind, ST__TT_EV_SNAPSHOT);
  ck_assert(ev.ok);
  ck_assert_uint_eq(ev.step, 7);
  for (int i = 0; i < N; i++)
    ck_assert_float_eq(dst[i], 2.0f);
  st__tt_stats_t st;
  st__tt_stats(tt, &st);
  ck_assert_uint_eq(st.stale_snapshots, 1);
  ck_assert(!st.attached);
  stop_ok(tt, false);
}
END_TEST

/* The program takes the node's parameters at attach; a snapshot waits for
 * its boundary and carries its parameters; a correction's event comes at
 * once and the program adds it at its next boundary. */
START_TEST(program_snapshot_and_apply) {
  float init[N], dst[N], delta[N];
  fill(init, 3.0f);
  st__tt_t* tt = host_start(init, 40, NULL);
  program_t g;
  program_make(&g, -1.0f);
  program_attach(tt, &g);
  ck_assert_uint_eq(g.step, 40);
  ck_assert_float_eq(g.p[0], 3.0f);

  for (int i = 0; i < N; i++)
    g.p[i] = (float) i; /* the program trained */
  ck_assert_int_eq(st__tt_request_snapshot(tt, 5, dst), 0);
  unsigned f = program_until_request(&g, false);
  ck_assert(f & ST_ATTACH_REQ_SNAPSHOT);
  st__tt_event_t ev;
  ck_assert(next_event(tt, &ev, WAIT_S));
  ck_assert_int_eq(ev.kind, ST__TT_EV_SNAPSHOT);
  ck_assert_uint_eq(ev.tag, 5);
  ck_assert(ev.ok);
  for (int i = 0; i < N; i++)
    ck_assert_float_eq(dst[i], (float) i);

  fill(delta, 0.25f);
  ck_assert_int_eq(st__tt_request_apply(tt, 6, delta, 1.0f), 0);
  ck_assert(next_event(tt, &ev, WAIT_S)); /* before any boundary */
  ck_assert_int_eq(ev.kind, ST__TT_EV_APPLIED);
  f = program_until_request(&g, false);
  ck_assert(f & ST_ATTACH_REQ_APPLY);
  for (int i = 0; i < N; i++)
    ck_assert_float_eq(g.p[i], (float) i + 0.25f);
  st__tt_stats_t st;
  double end = now_s() + WAIT_S;
  do { /* the thread sees the acknowledgement on its next turn */
    sleep_ms(1);
    st__tt_stats(tt, &st);
  } while (st.program_requests < 2 && now_s() < end);
  ck_assert(st.attached);
  ck_assert_uint_eq(st.corrections, 1);
  ck_assert_uint_ge(st.program_requests, 2);
  ck_assert_uint_eq(st.stale_snapshots, 0);
  stop_ok(tt, false);
}
END_TEST

/* Area B holds the attach's parameters until the program's first step
 * boundary: a correction that comes before it waits (a program still
 * copying B at the attach would otherwise take the correction as its
 * parameters), and is handed over at that boundary. */
START_TEST(nothing_posted_before_first_boundary) {
  float init[N], delta[N];
  fill(init, 3.0f);
  fill(delta, 0.5f);
  st__tt_t* tt = host_start(init, 0, NULL);
  program_t g;
  program_make(&g, 0.0f);
  ck_assert_int_eq(st__tt_attach_session(tt, g.seg, g.bytes, &g.step), 0);
  ck_assert_int_eq(st__tt_request_apply(tt, 1, delta, 1.0f), 0);
  st__tt_event_t ev;
  ck_assert(next_event(tt, &ev, WAIT_S));
  ck_assert_int_eq(ev.kind, ST__TT_EV_APPLIED);
  sleep_ms(150); /* three idle polls of the host thread */
  ck_assert_uint_eq(atomic_load(&g.h->req_seq), 0);
  const float* b = st_attach_area_b(g.seg, N);
  for (int i = 0; i < N; i++)
    ck_assert_float_eq(b[i], 3.0f);
  memcpy(g.p, b, sizeof(g.p)); /* the program's copy, late */
  unsigned f = program_until_request(&g, false);
  ck_assert(f & ST_ATTACH_REQ_APPLY);
  for (int i = 0; i < N; i++)
    ck_assert_float_eq(g.p[i], 3.5f);
  stop_ok(tt, false);
}
END_TEST

/* Corrections that arrive while a request is outstanding are summed and
 * handed over together; none is lost or applied twice. */
START_TEST(corrections_are_summed) {
  float init[N], d1[N], d2[N], d3[N];
  fill(init, 0.0f);
  fill(d1, 1.0f);
  fill(d2, 2.0f);
  fill(d3, 4.0f);
  st__tt_t* tt = host_start(init, 0, NULL);
  program_t g;
  program_make(&g, 0.0f);
  program_attach(tt, &g);
  ck_assert_int_eq(st__tt_request_apply(tt, 1, d1, 1.0f), 0);
  st__tt_event_t ev;
  ck_assert(next_event(tt, &ev, WAIT_S));
  sleep_ms(20); /* the request for d1 is out */
  ck_assert_int_eq(st__tt_request_apply(tt, 2, d2, 1.0f), 0);
  ck_assert_int_eq(st__tt_request_apply(tt, 3, d3, 0.5f), 0);
  ck_assert(next_event(tt, &ev, WAIT_S));
  ck_assert(next_event(tt, &ev, WAIT_S));
  double end = now_s() + WAIT_S;
  while (g.p[0] < 5.0f && now_s() < end) {
    program_boundary(&g, false);
    sleep_ms(1);
  }
  for (int k = 0; k < 50; k++) { /* and nothing more comes */
    program_boundary(&g, false);
    sleep_ms(1);
  }
  for (int i = 0; i < N; i++)
    ck_assert_float_eq(g.p[i], 5.0f);
  stop_ok(tt, false);
}
END_TEST

/* A program that passes no boundary: the snapshot is served from the
 * node's copy after ST__TT_SNAPSHOT_WAIT_S, not never. */
START_TEST(silent_program_gets_stale_snapshot) {
  float init[N], dst[N];
  fill(init, 2.0f);
  st__tt_t* tt = host_start(init, 0, NULL);
  program_t g;
  program_make(&g, 0.0f);
  program_attach(tt, &g);
  double t0 = now_s();
  ck_assert_int_eq(st__tt_request_snapshot(tt, 9, dst), 0);
  st__tt_event_t ev;
  ck_assert(next_event(tt, &ev, WAIT_S));
  double waited = now_s() - t0;
  ck_assert(ev.ok);
  ck_assert_msg(waited >= ST__TT_SNAPSHOT_WAIT_S * 0.9, "waited %.3f s",
                waited);
  ck_assert_float_eq(dst[0], 2.0f);
  st__tt_stats_t st;
  st__tt_stats(tt, &st);
  ck_assert_uint_eq(st.stale_snapshots, 1);
  stop_ok(tt, false);
}
END_TEST

/* Non-finite parameters in the program: the snapshot fails (nothing spreads),
 * the correction is handed over again, counted. */
START_TEST(nonfinite_program_refused) {
  float init[N], dst[N], delta[N];
  fill(init, 1.0f);
  fill(delta, 1.0f);
  st__tt_t* tt = host_start(init, 0, NULL);
  program_t g;
  program_make(&g, 0.0f);
  program_attach(tt, &g);
  ck_assert_int_eq(st__tt_request_apply(tt, 1, delta, 1.0f), 0);
  ck_assert_int_eq(st__tt_request_snapshot(tt, 2, dst), 0);
  st__tt_event_t ev;
  ck_assert(next_event(tt, &ev, WAIT_S));
  ck_assert_int_eq(ev.kind, ST__TT_EV_APPLIED);
  /* The correction may go out alone before the snapshot joins it. */
  unsigned f;
  do
    f = program_until_request(&g, true);
  while (!(f & ST_ATTACH_REQ_SNAPSHOT));
  ck_assert(next_event(tt, &ev, WAIT_S));
  ck_assert_int_eq(ev.kind, ST__TT_EV_SNAPSHOT);
  ck_assert(!ev.ok);
  ck_assert_ptr_nonnull(strstr(ev.err, "not finite"));
  st__tt_stats_t st;
  st__tt_stats(tt, &st);
  ck_assert_uint_eq(st.nonfinite_snapshots, 1);
  /* The program recovers: the correction is handed over again. */
  f = program_until_request(&g, false);
  ck_assert(f & ST_ATTACH_REQ_APPLY);
  ck_assert_float_eq(g.p[0], 2.0f);
  stop_ok(tt, false);
}
END_TEST

/* A state (a synchronization) reaches the attached program as STATE. */
START_TEST(state_reaches_program) {
  float init[N], state[N];
  fill(init, 1.0f);
  fill(state, 7.0f);
  st__tt_t* tt = host_start(init, 3, NULL);
  program_t g;
  program_make(&g, 0.0f);
  program_attach(tt, &g);
  ck_assert_int_eq(st__tt_set_state(tt, state, N, 500), 0);
  unsigned f = program_until_request(&g, false);
  ck_assert(f & ST_ATTACH_REQ_STATE);
  ck_assert_float_eq(g.p[3], 7.0f);
  ck_assert_uint_eq(g.step, 500);
  stop_ok(tt, false);
}
END_TEST

/* A second session is refused while one is on; a final detach leaves the
 * program's parameters as the node's; the next program gets them. */
START_TEST(sessions) {
  float init[N];
  fill(init, 1.0f);
  st__tt_t* tt = host_start(init, 0, NULL);
  program_t g, h;
  program_make(&g, 0.0f);
  program_make(&h, 0.0f);
  program_attach(tt, &g);
  uint64_t step;
  ck_assert_int_eq(st__tt_attach_session(tt, h.seg, h.bytes, &step), -EBUSY);
  for (int i = 0; i < N; i++)
    g.p[i] = 10.0f + (float) i;
  g.step = 77;
  atomic_store(&g.h->step, 77);
  memcpy(st_attach_area_a(g.seg), g.p, sizeof(g.p));
  st__tt_detach_session(tt, true);
  program_attach(tt, &h);
  ck_assert_uint_eq(h.step, 77);
  for (int i = 0; i < N; i++)
    ck_assert_float_eq(h.p[i], 10.0f + (float) i);
  st__tt_detach_session(tt, false);
  st__tt_stats_t st;
  st__tt_stats(tt, &st);
  ck_assert_uint_eq(st.sessions, 2);
  ck_assert(!st.attached);
  stop_ok(tt, false);
}
END_TEST

/* The node's copy follows a program that steps even when nobody asks for
 * snapshots (so that a program killed loses little). */
START_TEST(refreshes_without_peers) {
  float init[N], dst[N];
  fill(init, 0.0f);
  st__tt_t* tt = host_start(init, 0, NULL);
  program_t g;
  program_make(&g, 0.0f);
  program_attach(tt, &g);
  fill(g.p, 4.0f);
  unsigned f = program_until_request(&g, false);
  ck_assert(f & ST_ATTACH_REQ_SNAPSHOT);
  st__tt_detach_session(tt, false); /* died: no final parameters */
  ck_assert_int_eq(st__tt_request_snapshot(tt, 1, dst), 0);
  st__tt_event_t ev;
  ck_assert(next_event(tt, &ev, WAIT_S));
  ck_assert_float_eq(dst[0], 4.0f);
  stop_ok(tt, false);
}
END_TEST

/* The checkpoint is safetensors with the program's tensor names, the step
 * and the tensor list in its metadata. */
START_TEST(checkpoint_has_program_names) {
  float init[N];
  for (int i = 0; i < N; i++)
    init[i] = (float) i;
  char path[300];
  snprintf(path, sizeof(path), "%s/ckpt.safetensors", tmp);
  st__tt_t* tt = host_start(init, 12, path);
  stop_ok(tt, true);
  st_safetensors_t* st = NULL;
  char err[256];
  ck_assert_msg(st_safetensors_read(path, &st, err, sizeof(err)) == 0, "%s",
                err);
  size_t n = 0, shape[ST_SAFETENSORS_MAX_DIMS];
  int ndim = 0;
  const float* w = st_safetensors_tensor(st, "w", &n, shape, &ndim);
  ck_assert_ptr_nonnull(w);
  ck_assert_uint_eq(n, 6);
  ck_assert_int_eq(ndim, 2);
  ck_assert_uint_eq(shape[0], 2);
  ck_assert_uint_eq(shape[1], 3);
  const float* b = st_safetensors_tensor(st, "b", &n, NULL, NULL);
  ck_assert_ptr_nonnull(b);
  ck_assert_float_eq(b[3], 9.0f);
  ck_assert_str_eq(st_safetensors_meta(st, "step"), "12");
  ck_assert_ptr_nonnull(st_safetensors_meta(st, "attach_model"));
  st_safetensors_free(st);
}
END_TEST

static Suite* attach_host_suite(void) {
  Suite* s = suite_create("attach_host");
  TCase* tc = tcase_create("attach_host");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, no_program_serves_its_copy);
  tcase_add_test(tc, program_snapshot_and_apply);
  tcase_add_test(tc, nothing_posted_before_first_boundary);
  tcase_add_test(tc, corrections_are_summed);
  tcase_add_test(tc, silent_program_gets_stale_snapshot);
  tcase_add_test(tc, nonfinite_program_refused);
  tcase_add_test(tc, state_reaches_program);
  tcase_add_test(tc, sessions);
  tcase_add_test(tc, refreshes_without_peers);
  tcase_add_test(tc, checkpoint_has_program_names);
  tcase_set_timeout(tc, 120);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(attach_host_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
