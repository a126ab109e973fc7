/* trainer_thread.c: the daemon's trainer thread (DESIGN.md, Threads): SGD
 * steps back to back on an st_trainer_t, with a mailbox checked between two
 * steps.
 *
 * One mutex guards the mailbox (requests in, events out) and the published
 * counters. The thread takes a request out under the mutex and serves it
 * outside, so neither a step nor a device copy ever runs with the mutex
 * held and the loop thread never waits for a step. When it has nothing to
 * step (before go, after the epochs or a divergence) it sleeps on a
 * condition variable until a request arrives or a periodic evaluation or
 * checkpoint falls due. A second condition variable carries the reply of
 * the one synchronous call, st__tt_set_state.
 *
 * Memory is bounded: requests count against a fixed limit per kind until
 * their results are drained, EPOCHS_DONE and DIVERGED happen once each,
 * and an undrained checkpoint result is replaced by the next one, so both
 * rings have fixed sizes.
 */
#include "node/daemon/trainer_thread_internal.h"

#include "node/train/train_internal.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static bool can_evaluate(const st__tt_t* tt) {
  return tt->test != NULL && !tt->diverged;
}

static bool can_checkpoint(const st__tt_t* tt) {
  return tt->checkpoint_path != NULL && !tt->diverged;
}

/* ---- Events
 * -------------------------------------------------------------------- */

static void push_event(st__tt_t* tt, const st__tt_event_t* ev) {
  if (ev->kind == ST__TT_EV_CHECKPOINT) {
    /* Keep only the newest checkpoint result: compact the others away. */
    size_t kept = 0;
    for (size_t i = 0; i < tt->ev_count; i++) {
      st__tt_event_t* e = &tt->evs[(tt->ev_head + i) % EV_CAP];
      if (e->kind != ST__TT_EV_CHECKPOINT)
        tt->evs[(tt->ev_head + kept++) % EV_CAP] = *e;
    }
    tt->ev_count = kept;
  }
  assert(tt->ev_count < EV_CAP);
  tt->evs[(tt->ev_head + tt->ev_count) % EV_CAP] = *ev;
  tt->ev_count++;
}

/* Posts an event and wakes the loop. During st__tt_stop nobody drains any
 * more, so notify is skipped. */
void st__tt_post(st__tt_t* tt, const st__tt_event_t* ev) {
  pthread_mutex_lock(&tt->mu);
  push_event(tt, ev);
  bool stopping = tt->stop;
  pthread_mutex_unlock(&tt->mu);
  if (!stopping && tt->notify != NULL)
    tt->notify(tt->notify_arg);
}

void st__tt_make_event(st__tt_t* tt, st__tt_event_t* ev, st__tt_ev_kind_t kind,
                       uint64_t tag, int rc) {
  memset(ev, 0, sizeof(*ev));
  ev->kind = kind;
  ev->tag = tag;
  ev->step = tt->t != NULL ? tt->t->step : st__ah_step(tt);
  ev->ok = rc == 0;
}

static void device_err(st__tt_t* tt, st__tt_event_t* ev, const char* what,
                       int rc) {
  const char* why = st_backend_last_error(tt->t->be);
  st_set_err(ev->err, sizeof(ev->err), "%s failed on %s: %s", what,
             st_backend_describe(tt->t->be), *why ? why : strerror(-rc));
}

/* ---- Counters
 * ------------------------------------------------------------------ */

static double mean_loss(const st__tt_t* tt) {
  if (tt->n_losses == 0)
    return NAN;
  double sum = 0;
  for (size_t i = 0; i < tt->n_losses; i++)
    sum += tt->losses[i];
  return sum / (double) tt->n_losses;
}

static void rate_reset(st__tt_t* tt, double now) {
  tt->rate[0] = (rate_point_t){now, tt->samples};
  tt->rate_head = 0;
  tt->rate_count = 1;
}

/* Records a point when the newest is RATE_POINT_S old and returns the
 * examples per second since the oldest point kept. */
static double rate_update(st__tt_t* tt, double now) {
  const rate_point_t* newest =
      &tt->rate[(tt->rate_head + tt->rate_count - 1) % RATE_POINTS];
  if (now - newest->t >= RATE_POINT_S) {
    if (tt->rate_count == RATE_POINTS) {
      tt->rate_head = (tt->rate_head + 1) % RATE_POINTS;
      tt->rate_count--;
    }
    tt->rate[(tt->rate_head + tt->rate_count) % RATE_POINTS] =
        (rate_point_t){now, tt->samples};
    tt->rate_count++;
  }
  const rate_point_t* oldest = &tt->rate[tt->rate_head];
  double dt = now - oldest->t;
  return dt > 0 ? (double) (tt->samples - oldest->samples) / dt : 0;
}

/* Copies the trainer's position and the thread's flags into the published
 * counters. Caller holds mu. */
static void publish_locked(st__tt_t* tt) {
  st__tt_stats_t* s = &tt->stats;
  s->step = tt->t->step;
  s->epoch = tt->t->epoch;
  s->samples = tt->samples;
  s->stepping = tt->started && !tt->finished;
  s->diverged = tt->diverged;
  if (!s->stepping)
    s->samples_per_sec = 0;
}

/* ---- Evaluation and checkpoints
 * ---------------------------------------------- */

/* Between two batches of an evaluation: a ring round or an exchange that
 * asked for a snapshot gets it now, not after the whole evaluation (which
 * takes seconds on a large test set; a round waits for every member's
 * snapshot). */
static void serve(st__tt_t* tt, bool snapshots_only);

static void serve_snapshots(void* arg) {
  serve(arg, true);
}

static void evaluate(st__tt_t* tt, double now) {
  double loss, acc;
  pthread_mutex_lock(&tt->mu);
  tt->stats.evaluating = true;
  pthread_mutex_unlock(&tt->mu);
  int rc = st_trainer_evaluate_between(tt->t, tt->test, &loss, &acc,
                                       serve_snapshots, tt);
  pthread_mutex_lock(&tt->mu);
  tt->stats.evaluating = false;
  pthread_mutex_unlock(&tt->mu);
  tt->eval_version = tt->version;
  tt->next_eval = now + tt->eval_every_s;
  if (rc != 0)
    return; /* a device error: keep the previous figures */
  pthread_mutex_lock(&tt->mu);
  tt->stats.test_loss = loss;
  tt->stats.test_accuracy = acc;
  pthread_mutex_unlock(&tt->mu);
}

static int write_checkpoint(st__tt_t* tt, char* err, size_t err_len) {
  if (tt->checkpoint_path == NULL) {
    st_set_err(err, err_len, "no checkpoint path is configured");
    return -EINVAL;
  }
  if (tt->diverged) {
    st_set_err(err, err_len,
               "not writing %s: the model diverged at step %" PRIu64
               "; the last checkpoint written is kept",
               tt->checkpoint_path, tt->t->step);
    return -EDOM;
  }
  int rc = st_trainer_save(tt->t, tt->checkpoint_path, tt->ckpt_meta,
                           tt->n_ckpt_meta, err, err_len);
  if (rc == 0)
    tt->ckpt_version = tt->version;
  return rc;
}

void st__tt_save_and_post(st__tt_t* tt, double now) {
  st__tt_event_t ev;
  st__tt_make_event(tt, &ev, ST__TT_EV_CHECKPOINT, 0, 0);
  int rc = tt->write_checkpoint(tt, ev.err, sizeof(ev.err));
  ev.ok = rc == 0;
  /* A failed periodic write is retried a period later, not at once. */
  tt->next_ckpt = now + tt->checkpoint_every_s;
  tt->next_ckpt_step = ev.step + tt->checkpoint_every_steps;
  st__tt_post(tt, &ev);
}

bool st__tt_checkpoint_due(const st__tt_t* tt, double now, uint64_t step) {
  if (tt->ckpt_version == tt->version)
    return false;
  if (tt->checkpoint_every_steps > 0)
    return step >= tt->next_ckpt_step;
  return tt->checkpoint_every_s > 0 && now >= tt->next_ckpt;
}

/* True when a periodic evaluation (resp. checkpoint) is due at `now`: its
 * period is set, it is possible, and the parameters changed since the last
 * one. *deadline receives the earliest time one will fall due (INFINITY
 * when none will without a change). */
static bool periodic_due(const st__tt_t* tt, double now, bool* eval, bool* ckpt,
                         double* deadline) {
  *deadline = INFINITY;
  *eval = false;
  *ckpt = false;
  if (!tt->started)
    return false;
  if (tt->eval_every_s > 0 && can_evaluate(tt) &&
      tt->eval_version != tt->version) {
    *eval = now >= tt->next_eval;
    *deadline = fmin(*deadline, tt->next_eval);
  }
  if (tt->checkpoint_every_s > 0 && !tt->checkpoint_every_steps &&
      can_checkpoint(tt) && tt->ckpt_version != tt->version) {
    *ckpt = now >= tt->next_ckpt;
    *deadline = fmin(*deadline, tt->next_ckpt);
  }
  return *eval || *ckpt;
}

/* ---- Mailbox
 * ------------------------------------------------------------------- */

static void serve_state(st__tt_t* tt, const req_t* r) {
  st_trainer_t* t = tt->t;
  int rc = st_copy_to_device(t->be, t->model.params, r->src, tt->n_params);
  if (rc == 0)
    rc = st_trainer_set_position(t, r->step);
  tt->version++;
  pthread_mutex_lock(&tt->mu);
  publish_locked(tt);
  tt->stats.epochs_done = st_trainer_done(t);
  tt->state_rc = rc;
  tt->state_done = true;
  pthread_cond_broadcast(&tt->reply);
  pthread_mutex_unlock(&tt->mu);
}

/* Serves every request in the mailbox, in the order posted; with
 * snapshots_only (between the batches of an evaluation, when the
 * parameters must not change), only the snapshots at its head, stopping
 * at the first other request so that the order is kept. */
static void serve(st__tt_t* tt, bool snapshots_only) {
  st_trainer_t* t = tt->t;
  for (;;) {
    pthread_mutex_lock(&tt->mu);
    if (tt->req_count == 0 ||
        (snapshots_only && tt->reqs[tt->req_head].kind != REQ_SNAPSHOT)) {
      pthread_mutex_unlock(&tt->mu);
      return;
    }
    if (snapshots_only)
      tt->stats.mid_eval_snapshots++;
    req_t r;
    st__tt_pop_request_locked(tt, &r);
    pthread_mutex_unlock(&tt->mu);

    st__tt_event_t ev;
    int rc;
    switch (r.kind) {
      case REQ_SNAPSHOT:
        rc = st_copy_to_host(t->be, r.dst, t->model.params, tt->n_params);
        st__tt_make_event(tt, &ev, ST__TT_EV_SNAPSHOT, r.tag, rc);
        if (rc != 0)
          device_err(tt, &ev, "the snapshot", rc);
        st__tt_post(tt, &ev);
        break;
      case REQ_APPLY:
        /* params = 1 * params + scale * delta (st_axpby: y = a x + b y).
         * The CPU backend's memory is host memory: no staging copy. */
        if (tt->scratch == NULL) {
          rc = st_axpby(t->be, tt->n_params, r.scale, r.src, 1.0f,
                        t->model.params);
        } else {
          rc = st_copy_to_device(t->be, tt->scratch, r.src, tt->n_params);
          if (rc == 0)
            rc = st_axpby(t->be, tt->n_params, r.scale, tt->scratch, 1.0f,
                          t->model.params);
        }
        tt->version++;
        st__tt_make_event(tt, &ev, ST__TT_EV_APPLIED, r.tag, rc);
        if (rc != 0)
          device_err(tt, &ev, "the correction", rc);
        pthread_mutex_lock(&tt->mu);
        if (rc == 0)
          tt->stats.corrections++;
        pthread_mutex_unlock(&tt->mu);
        st__tt_post(tt, &ev);
        break;
      case REQ_STATE:
        serve_state(tt, &r);
        break;
    }
  }
}

bool st__tt_pop_request_locked(st__tt_t* tt, req_t* r) {
  if (tt->req_count == 0)
    return false;
  *r = tt->reqs[tt->req_head];
  tt->req_head = (tt->req_head + 1) % REQ_CAP;
  tt->req_count--;
  return true;
}

static int push_request(st__tt_t* tt, const req_t* r) {
  assert(tt->req_count < REQ_CAP);
  tt->reqs[(tt->req_head + tt->req_count) % REQ_CAP] = *r;
  tt->req_count++;
  pthread_cond_signal(&tt->wake);
  return 0;
}

/* ---- Stepping
 * ------------------------------------------------------------------ */

static void finish(st__tt_t* tt, st__tt_ev_kind_t kind, const char* err) {
  tt->finished = true;
  st__tt_event_t ev;
  st__tt_make_event(tt, &ev, kind, 0, kind == ST__TT_EV_EPOCHS_DONE ? 0 : -1);
  if (err != NULL)
    snprintf(ev.err, sizeof(ev.err), "%s", err);
  pthread_mutex_lock(&tt->mu);
  publish_locked(tt);
  if (kind == ST__TT_EV_EPOCHS_DONE)
    tt->stats.epochs_done = true;
  pthread_mutex_unlock(&tt->mu);
  st__tt_post(tt, &ev);
}

static void diverge(st__tt_t* tt, int rc, double loss) {
  char err[256];
  st_trainer_t* t = tt->t;
  if (rc == -EDOM) {
    st_set_err(err, sizeof(err),
               "the training loss or gradient is not finite at step %" PRIu64
               " (batch loss %g); lower the learning rate or clip the "
               "gradient norm",
               t->step, loss);
  } else {
    const char* why = st_backend_last_error(t->be);
    st_set_err(err, sizeof(err), "step %" PRIu64 " failed on %s: %s", t->step,
               st_backend_describe(t->be), *why ? why : strerror(-rc));
  }
  tt->diverged = true;
  finish(tt, ST__TT_EV_DIVERGED, err);
}

/* The epochs are over: evaluate unless the last step's epoch end just did,
 * then say so. */
static void epochs_done(st__tt_t* tt, double now) {
  if (can_evaluate(tt) && tt->eval_version != tt->version)
    evaluate(tt, now);
  finish(tt, ST__TT_EV_EPOCHS_DONE, NULL);
}

static void step_once(st__tt_t* tt) {
  st_trainer_t* t = tt->t;
  if (st_trainer_done(t)) {
    epochs_done(tt, st_now_s());
    return;
  }
  size_t start = t->pos * t->cfg.batch;
  size_t rows = t->shard_count - start;
  if (rows > t->cfg.batch)
    rows = t->cfg.batch;
  uint64_t epoch = t->epoch;
  double loss = NAN;
  int rc = st_trainer_step(t, &loss);
  if (rc != 0) {
    diverge(tt, rc, loss);
    return;
  }
  tt->version++;
  tt->samples += rows;
  tt->losses[tt->loss_next] = loss;
  tt->loss_next = (tt->loss_next + 1) % LOSS_WINDOW;
  if (tt->n_losses < LOSS_WINDOW)
    tt->n_losses++;

  double now = st_now_s();
  double rate = rate_update(tt, now);
  bool eval =
      t->epoch != epoch || (tt->eval_every_s > 0 && now >= tt->next_eval);
  if (eval && can_evaluate(tt))
    evaluate(tt, now);
  pthread_mutex_lock(&tt->mu);
  publish_locked(tt);
  tt->stats.loss = mean_loss(tt);
  tt->stats.samples_per_sec = rate;
  pthread_mutex_unlock(&tt->mu);

  if (can_checkpoint(tt) && st__tt_checkpoint_due(tt, now, t->step))
    st__tt_save_and_post(tt, now);
  if (st_trainer_done(t))
    epochs_done(tt, now);
}

/* ---- The thread
 * ---------------------------------------------------------------- */

static void timespec_at(double t, struct timespec* ts) {
  double sec = floor(t);
  ts->tv_sec = (time_t) sec;
  ts->tv_nsec = (long) ((t - sec) * 1e9);
  if (ts->tv_nsec >= 1000000000L)
    ts->tv_nsec = 999999999L;
}

static void* thread_main(void* arg) {
  st__tt_t* tt = arg;
  for (;;) {
    serve(tt, false);
    pthread_mutex_lock(&tt->mu);
    if (tt->stop) {
      pthread_mutex_unlock(&tt->mu);
      break;
    }
    bool go = tt->go, ckpt_req = tt->checkpoint_req;
    tt->checkpoint_req = false;
    pthread_mutex_unlock(&tt->mu);

    double now = st_now_s();
    if (ckpt_req) {
      st__tt_save_and_post(tt, now);
      continue;
    }
    if (go && !tt->started) {
      tt->started = true;
      tt->next_eval = now + tt->eval_every_s;
      tt->next_ckpt = now + tt->checkpoint_every_s;
      tt->next_ckpt_step = tt->t->step + tt->checkpoint_every_steps;
      rate_reset(tt, now);
      pthread_mutex_lock(&tt->mu);
      publish_locked(tt);
      pthread_mutex_unlock(&tt->mu);
    }
    if (tt->started && !tt->finished) {
      step_once(tt);
      continue;
    }

    /* Idle: do periodic work that is due, else sleep until a request, go,
     * stop, or the next deadline. */
    bool eval, ckpt;
    double deadline;
    if (periodic_due(tt, now, &eval, &ckpt, &deadline)) {
      if (eval)
        evaluate(tt, now);
      if (ckpt)
        st__tt_save_and_post(tt, now);
      continue;
    }
    struct timespec ts;
    if (isfinite(deadline))
      timespec_at(deadline, &ts);
    pthread_mutex_lock(&tt->mu);
    while (!tt->stop && tt->req_count == 0 && !tt->checkpoint_req &&
           tt->go == go) {
      if (!isfinite(deadline)) {
        pthread_cond_wait(&tt->wake, &tt->mu);
      } else if (pthread_cond_timedwait(&tt->wake, &tt->mu, &ts) == ETIMEDOUT) {
        break;
      }
    }
    pthread_mutex_unlock(&tt->mu);
  }

  /* Stopping: answer what is outstanding, then the final checkpoint. */
  serve(tt, false);
  pthread_mutex_lock(&tt->mu);
  bool final = tt->stop_checkpoint;
  pthread_mutex_unlock(&tt->mu);
  if (final && tt->checkpoint_path != NULL)
    tt->stop_rc = write_checkpoint(tt, tt->stop_err, sizeof(tt->stop_err));
  return NULL;
}

int st__tt_launch(st__tt_t* tt, void* (*main_fn)(void*) ) {
  /* The monotonic clock, so that a wall-clock jump neither fires nor holds
   * back the periodic work. */
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&tt->mu, NULL);
  pthread_cond_init(&tt->wake, &ca);
  pthread_cond_init(&tt->reply, NULL);
  pthread_condattr_destroy(&ca);

  /* Signals are the loop thread's business: the trainer thread takes none. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = -pthread_create(&tt->thread, NULL, main_fn, tt);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    pthread_cond_destroy(&tt->reply);
    pthread_cond_destroy(&tt->wake);
    pthread_mutex_destroy(&tt->mu);
  }
  return rc;
}

/* ---- Interface
 * ----------------------------------------------------------------- */

void st__tt_free_state(st__tt_t* tt) {
  if (tt->scratch != NULL)
    st_buf_free(tt->t->be, tt->scratch);
  if (tt->ah != NULL)
    st__ah_free(tt->ah);
  free(tt->checkpoint_path);
  free(tt);
}

int st__tt_start(const st__tt_config_t* cfg, st__tt_t** out) {
  *out = NULL;
  st_trainer_t* t = cfg->trainer;
  if (t == NULL || t->be == NULL || t->model.params == NULL ||
      !(cfg->eval_every_s >= 0) || !isfinite(cfg->eval_every_s) ||
      !(cfg->checkpoint_every_s >= 0) || !isfinite(cfg->checkpoint_every_s))
    return -EINVAL;
  if (cfg->test != NULL && cfg->test->n > 0 &&
      cfg->test->dim != t->cfg.model.sizes[0])
    return -EINVAL;
  st__tt_t* tt = calloc(1, sizeof(*tt));
  if (tt == NULL)
    return -ENOMEM;
  tt->t = t;
  tt->write_checkpoint = write_checkpoint;
  tt->test = cfg->test != NULL && cfg->test->n > 0 ? cfg->test : NULL;
  tt->eval_every_s = cfg->eval_every_s;
  tt->checkpoint_every_s = cfg->checkpoint_every_s;
  tt->checkpoint_every_steps = cfg->checkpoint_every_steps;
  tt->ckpt_meta = cfg->ckpt_meta;
  tt->n_ckpt_meta = cfg->n_ckpt_meta;
  tt->notify = cfg->notify;
  tt->notify_arg = cfg->notify_arg;
  tt->n_params = t->model.n_params;
  tt->stats.step = t->step;
  tt->stats.epoch = t->epoch;
  tt->stats.loss = NAN;
  tt->stats.test_loss = NAN;
  tt->stats.test_accuracy = NAN;
  if (cfg->checkpoint_path != NULL) {
    tt->checkpoint_path = strdup(cfg->checkpoint_path);
    if (tt->checkpoint_path == NULL) {
      st__tt_free_state(tt);
      return -ENOMEM;
    }
  }
  int rc = 0;
  if (st_backend_kind(t->be) != ST_BACKEND_CPU)
    rc = st_buf_alloc(t->be, tt->n_params, &tt->scratch);
  if (rc != 0) {
    tt->scratch = NULL;
    st__tt_free_state(tt);
    return rc;
  }

  rc = st__tt_launch(tt, thread_main);
  if (rc != 0) {
    st__tt_free_state(tt);
    return rc;
  }
  *out = tt;
  return 0;
}

int st__tt_set_state(st__tt_t* tt, const float* params, size_t n,
                     uint64_t step) {
  if (n != tt->n_params)
    return -EINVAL;
  for (size_t i = 0; i < n; i++)
    if (!isfinite(params[i]))
      return -EDOM;
  pthread_mutex_lock(&tt->mu);
  int rc;
  if (tt->go || tt->stop) {
    rc = -EINVAL;
  } else if (tt->state_busy) {
    rc = -EBUSY;
  } else {
    tt->state_busy = true;
    tt->state_done = false;
    push_request(tt, &(req_t){.kind = REQ_STATE, .src = params, .step = step});
    while (!tt->state_done)
      pthread_cond_wait(&tt->reply, &tt->mu);
    tt->state_busy = false;
    rc = tt->state_rc;
  }
  pthread_mutex_unlock(&tt->mu);
  return rc;
}

void st__tt_go(st__tt_t* tt) {
  pthread_mutex_lock(&tt->mu);
  tt->go = true;
  pthread_cond_signal(&tt->wake);
  pthread_mutex_unlock(&tt->mu);
}

int st__tt_request_snapshot(st__tt_t* tt, uint64_t tag, float* dst) {
  pthread_mutex_lock(&tt->mu);
  int rc;
  if (tt->stop) {
    rc = -EINVAL;
  } else if (tt->snaps_out == ST__TT_MAX_SNAPSHOTS) {
    rc = -EBUSY;
  } else {
    tt->snaps_out++;
    rc = push_request(tt,
                      &(req_t){.kind = REQ_SNAPSHOT, .tag = tag, .dst = dst});
  }
  pthread_mutex_unlock(&tt->mu);
  return rc;
}

int st__tt_request_apply(st__tt_t* tt, uint64_t tag, const float* delta,
                         float scale) {
  pthread_mutex_lock(&tt->mu);
  int rc;
  if (tt->stop) {
    rc = -EINVAL;
  } else if (tt->applies_out == ST__TT_MAX_APPLIES) {
    rc = -EBUSY;
  } else {
    tt->applies_out++;
    rc = push_request(
        tt,
        &(req_t){.kind = REQ_APPLY, .tag = tag, .src = delta, .scale = scale});
  }
  pthread_mutex_unlock(&tt->mu);
  return rc;
}

void st__tt_request_checkpoint(st__tt_t* tt) {
  pthread_mutex_lock(&tt->mu);
  tt->checkpoint_req = true;
  pthread_cond_signal(&tt->wake);
  pthread_mutex_unlock(&tt->mu);
}

bool st__tt_poll(st__tt_t* tt, st__tt_event_t* ev) {
  pthread_mutex_lock(&tt->mu);
  bool got = tt->ev_count > 0;
  if (got) {
    *ev = tt->evs[tt->ev_head];
    tt->ev_head = (tt->ev_head + 1) % EV_CAP;
    tt->ev_count--;
    if (ev->kind == ST__TT_EV_SNAPSHOT)
      tt->snaps_out--;
    else if (ev->kind == ST__TT_EV_APPLIED)
      tt->applies_out--;
  }
  pthread_mutex_unlock(&tt->mu);
  return got;
}

void st__tt_stats(st__tt_t* tt, st__tt_stats_t* out) {
  pthread_mutex_lock(&tt->mu);
  *out = tt->stats;
  pthread_mutex_unlock(&tt->mu);
}

size_t st__tt_n_params(const st__tt_t* tt) {
  return tt->n_params;
}

int st__tt_stop(st__tt_t* tt, bool checkpoint, char* err, size_t err_len) {
  pthread_mutex_lock(&tt->mu);
  tt->stop = true;
  tt->stop_checkpoint = checkpoint;
  pthread_cond_signal(&tt->wake);
  pthread_mutex_unlock(&tt->mu);
  pthread_join(tt->thread, NULL);
  int rc = tt->stop_rc;
  if (rc != 0)
    st_set_err(err, err_len, "%s", tt->stop_err);
  pthread_cond_destroy(&tt->reply);
  pthread_cond_destroy(&tt->wake);
  pthread_mutex_destroy(&tt->mu);
  st__tt_free_state(tt);
  return rc;
}
