/* attach_host.c: the model-host thread in attach mode (trainer_thread.h,
 * "Attach mode"; docs/attach.md): the program attached to the node steps
 * the model in its own process; this thread keeps the node's copy of the
 * parameters and moves snapshots and corrections through the shared
 * segment at the program's step boundaries.
 *
 * One request is outstanding in the segment at a time. The thread builds
 * it from what has gathered: the corrections not yet handed over (summed
 * into `acc`), a state to take (after a synchronization), and whether
 * snapshots wait. It then waits for the program's acknowledgement on the
 * segment's doorbell (a futex the program wakes), 2 ms at a time so that
 * the mailbox is looked at too. The program's memory is never touched: the
 * thread reads area A only after the acknowledgement and writes area B
 * only while nothing is outstanding.
 */
#include "node/daemon/trainer_thread_internal.h"

#include "base/base.h"
#include "node/train/train.h"

#include <errno.h>
#include <inttypes.h>
#include <linux/futex.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* While a request is outstanding, the mailbox is looked at this often. */
#define ACK_POLL_NS 2000000L
/* With a program attached and nothing outstanding, its step counter is
 * read this often for status. */
#define IDLE_POLL_S 0.05
/* The node's copy follows the program at least this often, peers or not,
 * so that a program that dies loses at most this much of its work (a
 * program that detaches hands over its parameters as it goes). */
#define REFRESH_S 1.0
/* A step the program reports is taken only up to 2^53: it travels in JSON
 * (the attach reply) and in a checkpoint's metadata, where larger integers
 * are not exact. */
#define STEP_MAX (1ull << 53)

typedef enum { SESS_NONE = 0, SESS_ATTACH, SESS_DETACH } sess_op_t;

typedef struct {
  uint64_t tag;
  float* dst;
  double since;
} waiting_t;

struct st__ah_s {
  st_attach_model_t model;
  size_t n;
  float* shadow; /* the node's copy of the parameters */
  float* acc;    /* corrections not yet handed to the program */
  bool acc_dirty;
  bool state_dirty; /* the program must take shadow (after a state) */
  uint64_t step;    /* under tt->mu: read by make_event on this thread only */

  /* The session: the segment is this thread's alone. */
  uint8_t* seg;
  size_t seg_bytes;
  st_attach_header_t* h;
  uint64_t seq;         /* last request posted */
  bool outstanding;     /* seq not yet acknowledged */
  unsigned out_flags;   /* what the outstanding request asked */
  uint64_t seen_step;   /* the program's step counter when last read */
  uint64_t boundaries0; /* its boundary counter when the session started */
  bool program_started; /* it has passed a boundary since: area B is free */
  double last_snapshot; /* when the program last gave its parameters */
  waiting_t waiting[ST__TT_MAX_SNAPSHOTS];
  size_t n_waiting;

  /* Under tt->mu: st__tt_attach_session / st__tt_detach_session. */
  sess_op_t op;
  void* op_seg;
  size_t op_bytes;
  bool op_final; /* detach: area A holds the program's last parameters */
  bool op_done;
  int op_rc;
  uint64_t op_step;
};

uint64_t st__ah_step(const st__tt_t* tt) {
  return tt->ah->step;
}

void st__ah_free(st__ah_t* ah) {
  if (ah->seg != NULL)
    munmap(ah->seg, ah->seg_bytes);
  st_attach_model_free(&ah->model);
  free(ah->shadow);
  free(ah->acc);
  free(ah);
}

/* ---- Checkpoints --------------------------------------------------------- */

static int write_checkpoint(st__tt_t* tt, char* err, size_t err_len) {
  st__ah_t* ah = tt->ah;
  if (tt->checkpoint_path == NULL) {
    st_set_err(err, err_len, "no checkpoint path is configured");
    return -EINVAL;
  }
  for (size_t i = 0; i < ah->n; i++) {
    if (!isfinite(ah->shadow[i])) {
      st_set_err(err, err_len,
                 "not writing %s: the parameters are not finite at step "
                 "%" PRIu64 "; the last checkpoint written is kept",
                 tt->checkpoint_path, ah->step);
      return -EDOM;
    }
  }
  st_tensor_desc_t* td = calloc(ah->model.n, sizeof(*td));
  size_t canon_len = 0;
  char* canon = st_attach_model_canonical(&ah->model, &canon_len);
  if (td == NULL || canon == NULL) {
    free(td);
    free(canon);
    return -ENOMEM;
  }
  for (size_t i = 0; i < ah->model.n; i++) {
    const st_attach_tensor_t* t = &ah->model.t[i];
    td[i].name = t->name;
    td[i].data = ah->shadow + t->offset;
    td[i].ndim = t->ndim;
    for (int k = 0; k < t->ndim; k++)
      td[i].shape[k] = (size_t) t->shape[k];
  }
  char step[24];
  snprintf(step, sizeof(step), "%" PRIu64, ah->step);
  st_meta_kv_t meta[] = {{"format", "starling-attach-v1"},
                         {"step", step},
                         {"attach_model", canon}};
  int rc = st_safetensors_write(tt->checkpoint_path, td, ah->model.n, meta,
                                sizeof(meta) / sizeof(meta[0]), err, err_len);
  free(td);
  free(canon);
  if (rc == 0)
    tt->ckpt_version = tt->version;
  return rc;
}

/* ---- Serving ------------------------------------------------------------- */

/* dst NULL: the thread's own refresh, which nobody waits for. */
static void post_snapshot(st__tt_t* tt, uint64_t tag, float* dst, bool ok,
                          const char* why) {
  if (dst == NULL)
    return;
  st__tt_event_t ev;
  if (ok)
    memcpy(dst, tt->ah->shadow, tt->ah->n * sizeof(float));
  st__tt_make_event(tt, &ev, ST__TT_EV_SNAPSHOT, tag, ok ? 0 : -1);
  if (!ok)
    st_set_err(ev.err, sizeof(ev.err), "%s", why);
  st__tt_post(tt, &ev);
}

/* Serves every waiting snapshot from the node's copy (stale: no program, or
 * it passed no boundary in time; or fresh: right after its snapshot). */
static void serve_waiting(st__tt_t* tt, bool stale, double older_than) {
  st__ah_t* ah = tt->ah;
  size_t kept = 0;
  uint64_t served = 0;
  for (size_t i = 0; i < ah->n_waiting; i++) {
    waiting_t* w = &ah->waiting[i];
    if (w->since <= older_than) {
      post_snapshot(tt, w->tag, w->dst, true, NULL);
      served += w->dst != NULL; /* the thread's own refreshes do not count */
    } else {
      ah->waiting[kept++] = *w;
    }
  }
  ah->n_waiting = kept;
  if (stale && served > 0) {
    pthread_mutex_lock(&tt->mu);
    tt->stats.stale_snapshots += served;
    pthread_mutex_unlock(&tt->mu);
  }
}

/* The program's snapshot was refused (not finite): counted once, however
 * many requests waited for it. */
static void fail_waiting(st__tt_t* tt, const char* why) {
  st__ah_t* ah = tt->ah;
  for (size_t i = 0; i < ah->n_waiting; i++)
    post_snapshot(tt, ah->waiting[i].tag, ah->waiting[i].dst, false, why);
  pthread_mutex_lock(&tt->mu);
  tt->stats.nonfinite_snapshots++;
  pthread_mutex_unlock(&tt->mu);
  ah->n_waiting = 0;
}

static void serve_apply(st__tt_t* tt, const req_t* r) {
  st__ah_t* ah = tt->ah;
  for (size_t i = 0; i < ah->n; i++) {
    float d = r->scale * r->src[i];
    ah->shadow[i] += d;
    ah->acc[i] += d;
  }
  ah->acc_dirty = true;
  tt->version++;
  st__tt_event_t ev;
  st__tt_make_event(tt, &ev, ST__TT_EV_APPLIED, r->tag, 0);
  pthread_mutex_lock(&tt->mu);
  tt->stats.corrections++;
  pthread_mutex_unlock(&tt->mu);
  st__tt_post(tt, &ev);
}

static void serve_state(st__tt_t* tt, const req_t* r) {
  st__ah_t* ah = tt->ah;
  memcpy(ah->shadow, r->src, ah->n * sizeof(float));
  memset(ah->acc, 0, ah->n * sizeof(float));
  ah->acc_dirty = false;
  ah->state_dirty = ah->seg != NULL;
  tt->version++;
  pthread_mutex_lock(&tt->mu);
  ah->step = r->step;
  tt->stats.step = r->step;
  tt->state_rc = 0;
  tt->state_done = true;
  pthread_cond_broadcast(&tt->reply);
  pthread_mutex_unlock(&tt->mu);
}

/* Takes every request out of the mailbox and serves what needs no program:
 * corrections and states at once, snapshots from the node's copy when no
 * program is attached; other snapshots wait for its boundary. */
static void take_requests(st__tt_t* tt, double now) {
  st__ah_t* ah = tt->ah;
  for (;;) {
    req_t r;
    pthread_mutex_lock(&tt->mu);
    bool got = st__tt_pop_request_locked(tt, &r);
    pthread_mutex_unlock(&tt->mu);
    if (!got)
      return;
    switch (r.kind) {
      case REQ_APPLY:
        serve_apply(tt, &r);
        break;
      case REQ_STATE:
        serve_state(tt, &r);
        break;
      case REQ_SNAPSHOT:
        if (ah->seg == NULL) {
          post_snapshot(tt, r.tag, r.dst, true, NULL);
          pthread_mutex_lock(&tt->mu);
          tt->stats.stale_snapshots++;
          pthread_mutex_unlock(&tt->mu);
        } else {
          ah->waiting[ah->n_waiting++] =
              (waiting_t){.tag = r.tag, .dst = r.dst, .since = now};
        }
        break;
    }
  }
}

/* ---- The segment --------------------------------------------------------- */

static void post_request(st__tt_t* tt) {
  st__ah_t* ah = tt->ah;
  unsigned flags = 0;
  float* b = st_attach_area_b(ah->seg, ah->n);
  if (ah->state_dirty) {
    memcpy(b, ah->shadow, ah->n * sizeof(float));
    memset(ah->acc, 0, ah->n * sizeof(float));
    ah->acc_dirty = false;
    ah->state_dirty = false;
    ah->h->state_step = ah->step;
    flags = ST_ATTACH_REQ_STATE;
  } else {
    if (ah->acc_dirty) {
      memcpy(b, ah->acc, ah->n * sizeof(float));
      memset(ah->acc, 0, ah->n * sizeof(float));
      ah->acc_dirty = false;
      flags |= ST_ATTACH_REQ_APPLY;
    }
    if (ah->n_waiting > 0)
      flags |= ST_ATTACH_REQ_SNAPSHOT;
  }
  if (flags == 0)
    return;
  ah->h->req_flags = flags;
  ah->out_flags = flags;
  ah->outstanding = true;
  atomic_store_explicit(&ah->h->req_seq, ++ah->seq, memory_order_release);
}

/* The program acknowledged: take its snapshot into the node's copy (plus
 * the corrections that came since the request) and serve the waiting. */
static void complete_request(st__tt_t* tt) {
  st__ah_t* ah = tt->ah;
  ah->outstanding = false;
  const float* a = st_attach_area_a(ah->seg);
  bool ok = ah->h->ack_status == ST_ATTACH_ACK_OK;
  /* The program's word is not taken for it: a snapshot must be finite. */
  if (ok && (ah->out_flags & ST_ATTACH_REQ_SNAPSHOT))
    for (size_t i = 0; ok && i < ah->n; i++)
      ok = isfinite(a[i]);
  if (!ok) {
    /* Nothing was applied: hand the corrections over again later. */
    if (ah->out_flags & ST_ATTACH_REQ_APPLY) {
      const float* b = st_attach_area_b(ah->seg, ah->n);
      for (size_t i = 0; i < ah->n; i++)
        ah->acc[i] += b[i];
      ah->acc_dirty = true;
    }
    if (ah->out_flags & ST_ATTACH_REQ_SNAPSHOT)
      fail_waiting(tt, "the attached program's parameters are not finite");
  } else if (ah->out_flags & ST_ATTACH_REQ_SNAPSHOT) {
    for (size_t i = 0; i < ah->n; i++)
      ah->shadow[i] = a[i] + ah->acc[i];
    tt->version++;
    ah->last_snapshot = st_now_s();
    serve_waiting(tt, false, INFINITY);
  }
  /* The program took a state: the step its counter shows now was stored
   * before it did, so the node's step stays the state's until it moves. */
  if (ok && (ah->out_flags & ST_ATTACH_REQ_STATE))
    ah->seen_step = atomic_load_explicit(&ah->h->step, memory_order_relaxed);
  pthread_mutex_lock(&tt->mu);
  tt->stats.program_requests++;
  pthread_mutex_unlock(&tt->mu);
}

/* Reads the program's counters into the published ones. */
static void read_program(st__tt_t* tt) {
  st__ah_t* ah = tt->ah;
  const st_attach_header_t* h = ah->h;
  uint64_t step = atomic_load_explicit(&h->step, memory_order_relaxed);
  if (step > STEP_MAX)
    step = ah->seen_step;
  uint64_t lb = atomic_load_explicit(&h->loss_bits, memory_order_relaxed);
  uint64_t ab = atomic_load_explicit(&h->accuracy_bits, memory_order_relaxed);
  uint64_t nb = atomic_load_explicit(&h->boundaries, memory_order_relaxed);
  double loss, acc;
  memcpy(&loss, &lb, sizeof(loss));
  memcpy(&acc, &ab, sizeof(acc));
  bool moved = step != ah->seen_step;
  if (moved)
    tt->version++; /* the program stepped: its parameters moved */
  /* A state not yet taken carries its own step, which the program's
   * counter does not know yet. */
  bool state_waits = ah->state_dirty ||
                     (ah->outstanding && (ah->out_flags & ST_ATTACH_REQ_STATE));
  pthread_mutex_lock(&tt->mu);
  ah->seen_step = step;
  if (moved && !state_waits)
    ah->step = step;
  tt->stats.step = ah->step;
  tt->stats.loss = loss;
  tt->stats.test_accuracy = acc;
  tt->stats.program_boundaries = nb;
  pthread_mutex_unlock(&tt->mu);
}

static void start_session(st__tt_t* tt, void* seg, size_t bytes) {
  st__ah_t* ah = tt->ah;
  ah->seg = seg;
  ah->seg_bytes = bytes;
  ah->h = seg;
  memcpy(st_attach_area_b(seg, ah->n), ah->shadow, ah->n * sizeof(float));
  memset(ah->acc, 0, ah->n * sizeof(float));
  ah->acc_dirty = false;
  ah->state_dirty = false;
  ah->seq = 0;
  ah->outstanding = false;
  ah->h->req_flags = 0;
  atomic_store(&ah->h->ack_seq, 0);
  atomic_store(&ah->h->step, ah->step);
  atomic_store(&ah->h->req_seq, 0);
  ah->boundaries0 = atomic_load(&ah->h->boundaries);
  ah->program_started = false;
  ah->seen_step = ah->step;
  ah->last_snapshot = st_now_s();
}

/* final: the program detached and left its last parameters in area A;
 * corrections it has not taken (the outstanding request's, and those
 * gathered since) go on top. A state it has not taken wins. */
static void take_final(st__tt_t* tt) {
  st__ah_t* ah = tt->ah;
  if (ah->state_dirty ||
      (ah->outstanding && (ah->out_flags & ST_ATTACH_REQ_STATE)))
    return;
  const float* a = st_attach_area_a(ah->seg);
  const float* b = st_attach_area_b(ah->seg, ah->n);
  bool with_b = ah->outstanding && (ah->out_flags & ST_ATTACH_REQ_APPLY);
  for (size_t i = 0; i < ah->n; i++)
    if (!isfinite(a[i]))
      return;
  for (size_t i = 0; i < ah->n; i++)
    ah->shadow[i] = a[i] + ah->acc[i] + (with_b ? b[i] : 0.0f);
  memset(ah->acc, 0, ah->n * sizeof(float));
  ah->acc_dirty = false;
  tt->version++;
  uint64_t step = atomic_load(&ah->h->step);
  pthread_mutex_lock(&tt->mu);
  if (step <= STEP_MAX)
    ah->step = step;
  pthread_mutex_unlock(&tt->mu);
}

static void end_session(st__tt_t* tt, bool final) {
  st__ah_t* ah = tt->ah;
  if (ah->seg == NULL)
    return;
  /* An acknowledgement the thread has not yet seen still counts. */
  if (ah->outstanding &&
      atomic_load_explicit(&ah->h->ack_seq, memory_order_acquire) == ah->seq)
    complete_request(tt);
  if (final)
    take_final(tt);
  serve_waiting(tt, true, INFINITY);
  munmap(ah->seg, ah->seg_bytes);
  ah->seg = NULL;
  ah->h = NULL;
  ah->outstanding = false;
}

/* Session changes asked by the loop thread, made outside the mutex (ending
 * a session serves waiting snapshots, which posts events). */
static void session_ops(st__tt_t* tt) {
  st__ah_t* ah = tt->ah;
  pthread_mutex_lock(&tt->mu);
  sess_op_t op = ah->op;
  void* seg = ah->op_seg;
  size_t bytes = ah->op_bytes;
  bool final = ah->op_final;
  pthread_mutex_unlock(&tt->mu);
  if (op == SESS_NONE)
    return;
  if (op == SESS_ATTACH)
    start_session(tt, seg, bytes);
  else
    end_session(tt, final);
  pthread_mutex_lock(&tt->mu);
  if (op == SESS_ATTACH) {
    ah->op_step = ah->step;
    tt->stats.sessions++;
  }
  tt->stats.attached = op == SESS_ATTACH;
  tt->stats.stepping = op == SESS_ATTACH;
  tt->stats.step = ah->step;
  ah->op = SESS_NONE;
  ah->op_rc = 0;
  ah->op_done = true;
  pthread_cond_broadcast(&tt->reply);
  pthread_mutex_unlock(&tt->mu);
}

/* ---- The thread ---------------------------------------------------------- */

static void futex_wait(_Atomic uint32_t* word, uint32_t seen, long ns) {
  struct timespec ts = {0, ns};
  syscall(SYS_futex, (uint32_t*) word, FUTEX_WAIT, seen, &ts, NULL, 0);
}

static void idle_wait(st__tt_t* tt, double deadline) {
  struct timespec ts;
  double sec = floor(deadline);
  ts.tv_sec = (time_t) sec;
  ts.tv_nsec = (long) ((deadline - sec) * 1e9);
  if (ts.tv_nsec >= 1000000000L)
    ts.tv_nsec = 999999999L;
  pthread_mutex_lock(&tt->mu);
  while (!tt->stop && tt->req_count == 0 && !tt->checkpoint_req &&
         tt->ah->op == SESS_NONE) {
    if (pthread_cond_timedwait(&tt->wake, &tt->mu, &ts) == ETIMEDOUT)
      break;
  }
  pthread_mutex_unlock(&tt->mu);
}

/* Whether the program has passed a step boundary in this session. Until
 * then area B holds the parameters handed over with the attach, which the
 * program may still be copying: no request may overwrite them. The
 * program's release store of `boundaries` follows its reads of B. */
static bool program_started(st__ah_t* ah) {
  if (!ah->program_started)
    ah->program_started =
        atomic_load_explicit(&ah->h->boundaries, memory_order_acquire) !=
        ah->boundaries0;
  return ah->program_started;
}

/* Exchanges with the program: completes an acknowledged request, posts the
 * next (once the program has started), serves snapshots that waited too
 * long from the node's copy. */
static void program_cycle(st__tt_t* tt, double now) {
  st__ah_t* ah = tt->ah;
  if (ah->outstanding &&
      atomic_load_explicit(&ah->h->ack_seq, memory_order_acquire) == ah->seq)
    complete_request(tt);
  if (!ah->outstanding && ah->n_waiting == 0 &&
      now - ah->last_snapshot >= REFRESH_S)
    ah->waiting[ah->n_waiting++] =
        (waiting_t){.tag = 0, .dst = NULL, .since = now};
  if (!ah->outstanding && program_started(ah))
    post_request(tt);
  serve_waiting(tt, true, now - ST__TT_SNAPSHOT_WAIT_S);
  read_program(tt);
}

/* One turn: session changes, the mailbox, a requested checkpoint, the
 * program; false when stopping. */
static bool turn(st__tt_t* tt) {
  st__ah_t* ah = tt->ah;
  session_ops(tt);
  pthread_mutex_lock(&tt->mu);
  bool stop = tt->stop, ckpt_req = tt->checkpoint_req;
  tt->checkpoint_req = false;
  pthread_mutex_unlock(&tt->mu);
  if (stop)
    return false;
  double now = st_now_s();
  take_requests(tt, now);
  if (ckpt_req)
    st__tt_save_and_post(tt, now);
  if (ah->seg != NULL)
    program_cycle(tt, now);
  if (st__tt_checkpoint_due(tt, now, ah->step))
    st__tt_save_and_post(tt, now);
  return true;
}

static void* attach_main(void* arg) {
  st__tt_t* tt = arg;
  st__ah_t* ah = tt->ah;
  tt->next_ckpt = st_now_s() + tt->checkpoint_every_s;
  tt->next_ckpt_step = ah->step + tt->checkpoint_every_steps;
  for (;;) {
    uint32_t bell = ah->h != NULL ? atomic_load(&ah->h->doorbell) : 0;
    if (!turn(tt))
      break;
    double now = st_now_s();
    double deadline = tt->checkpoint_every_s > 0 && !tt->checkpoint_every_steps
                          ? tt->next_ckpt
                          : now + 3600;
    if (ah->seg != NULL && (ah->outstanding || ah->n_waiting > 0)) {
      futex_wait(&ah->h->doorbell, bell, ACK_POLL_NS);
    } else {
      if (ah->seg != NULL)
        deadline = fmin(deadline, now + IDLE_POLL_S);
      idle_wait(tt, deadline);
    }
  }
  /* Stopping: whatever waits is served from the node's copy, then the
   * final checkpoint. */
  take_requests(tt, st_now_s());
  end_session(tt, false);
  pthread_mutex_lock(&tt->mu);
  bool final = tt->stop_checkpoint;
  pthread_mutex_unlock(&tt->mu);
  if (final && tt->checkpoint_path != NULL)
    tt->stop_rc = write_checkpoint(tt, tt->stop_err, sizeof(tt->stop_err));
  return NULL;
}

/* ---- Interface ----------------------------------------------------------- */

static int copy_model(st_attach_model_t* dst, const st_attach_model_t* src) {
  for (size_t i = 0; i < src->n; i++) {
    const st_attach_tensor_t* t = &src->t[i];
    int rc =
        st_attach_model_add(dst, t->name, t->dtype, t->ndim, t->shape, NULL, 0);
    if (rc != 0)
      return rc;
  }
  return 0;
}

int st__tt_start_attached(const st__tt_attach_config_t* cfg, st__tt_t** out) {
  *out = NULL;
  if (cfg->model == NULL || cfg->model->n_floats == 0 || cfg->params == NULL ||
      !(cfg->checkpoint_every_s >= 0) || !isfinite(cfg->checkpoint_every_s))
    return -EINVAL;
  st__tt_t* tt = calloc(1, sizeof(*tt));
  st__ah_t* ah = calloc(1, sizeof(*ah));
  if (tt == NULL || ah == NULL) {
    free(tt);
    free(ah);
    return -ENOMEM;
  }
  tt->ah = ah;
  tt->write_checkpoint = write_checkpoint;
  ah->n = cfg->model->n_floats;
  ah->step = cfg->step;
  ah->shadow = malloc(ah->n * sizeof(float));
  ah->acc = calloc(ah->n, sizeof(float));
  tt->checkpoint_path =
      cfg->checkpoint_path != NULL ? strdup(cfg->checkpoint_path) : NULL;
  int rc = copy_model(&ah->model, cfg->model);
  if (rc == 0 &&
      (ah->shadow == NULL || ah->acc == NULL ||
       (cfg->checkpoint_path != NULL && tt->checkpoint_path == NULL)))
    rc = -ENOMEM;
  if (rc != 0) {
    st__tt_free_state(tt);
    return rc;
  }
  memcpy(ah->shadow, cfg->params, ah->n * sizeof(float));
  tt->checkpoint_every_s = cfg->checkpoint_every_s;
  tt->checkpoint_every_steps = cfg->checkpoint_every_steps;
  tt->notify = cfg->notify;
  tt->notify_arg = cfg->notify_arg;
  tt->n_params = ah->n;
  tt->started = true;
  tt->stats.step = cfg->step;
  tt->stats.loss = NAN;
  tt->stats.test_loss = NAN;
  tt->stats.test_accuracy = NAN;
  rc = st__tt_launch(tt, attach_main);
  if (rc != 0) {
    st__tt_free_state(tt);
    return rc;
  }
  *out = tt;
  return 0;
}

static int session_op(st__tt_t* tt, sess_op_t op, void* seg, size_t bytes,
                      bool final, uint64_t* step) {
  if (tt->ah == NULL)
    return -EINVAL;
  pthread_mutex_lock(&tt->mu);
  int rc = 0;
  if (tt->stop || tt->ah->op != SESS_NONE ||
      (op == SESS_ATTACH && tt->stats.attached)) {
    rc = -EBUSY;
  } else if (op == SESS_DETACH && !tt->stats.attached) {
    rc = 0;
  } else {
    st__ah_t* ah = tt->ah;
    ah->op = op;
    ah->op_seg = seg;
    ah->op_bytes = bytes;
    ah->op_final = final;
    ah->op_done = false;
    pthread_cond_signal(&tt->wake);
    while (!ah->op_done)
      pthread_cond_wait(&tt->reply, &tt->mu);
    rc = ah->op_rc;
    if (step != NULL)
      *step = ah->op_step;
  }
  pthread_mutex_unlock(&tt->mu);
  return rc;
}

int st__tt_attach_session(st__tt_t* tt, void* seg, size_t seg_bytes,
                          uint64_t* step) {
  return session_op(tt, SESS_ATTACH, seg, seg_bytes, false, step);
}

void st__tt_detach_session(st__tt_t* tt, bool final) {
  session_op(tt, SESS_DETACH, NULL, 0, final, NULL);
}
