/* trainer_thread_internal.h: the model-host thread's state, shared by its
 * two bodies: trainer_thread.c (the built-in trainer steps the model) and
 * attach_host.c (an attached program steps it, docs/attach.md). The
 * mailbox (requests in, events out), the counters and the thread's life
 * are common; what a step, a snapshot, a correction and a checkpoint are
 * differs. Internal to node/daemon.
 */
#ifndef STARLING_NODE_TRAINER_THREAD_INTERNAL_H
#define STARLING_NODE_TRAINER_THREAD_INTERNAL_H

#include "node/daemon/trainer_thread.h"

#include <pthread.h>

typedef struct st__ah_s st__ah_t;

/* The training loss reported is the mean over this many recent steps:
 * enough to smooth batch-to-batch noise (a batch of 64 has a relative
 * standard error of ~12%), few enough to follow the trend within a second
 * of stepping. */
#define LOSS_WINDOW 100

/* Throughput is measured over the last RATE_WINDOW_S seconds, from points
 * taken at least RATE_POINT_S apart: 17 points span 4 s, long enough to
 * average over evaluations and checkpoints, short enough to show a
 * slowdown. */
#define RATE_POINT_S 0.25
#define RATE_POINTS 17

/* Requests: every snapshot and correction outstanding, plus one state. */
#define REQ_CAP (ST__TT_MAX_SNAPSHOTS + ST__TT_MAX_APPLIES + 1)
/* Events: one per outstanding snapshot and correction, plus one each of
 * CHECKPOINT (coalesced), EPOCHS_DONE and DIVERGED. */
#define EV_CAP (ST__TT_MAX_SNAPSHOTS + ST__TT_MAX_APPLIES + 3)

typedef enum { REQ_SNAPSHOT, REQ_APPLY, REQ_STATE } req_kind_t;

typedef struct {
  req_kind_t kind;
  uint64_t tag;
  float* dst;       /* snapshot: host, borrowed */
  const float* src; /* apply: delta; state: params (host, borrowed) */
  float scale;
  uint64_t step; /* state */
} req_t;

typedef struct {
  double t;
  uint64_t samples;
} rate_point_t;

struct st__tt_s {
  /* Fixed at start. */
  st_trainer_t* t; /* NULL in attach mode */
  st__ah_t* ah;    /* attach mode only */
  /* The body's checkpoint writer (err: one sentence on failure). */
  int (*write_checkpoint)(st__tt_t* tt, char* err, size_t err_len);
  const st_dataset_t* test; /* NULL when there is nothing to evaluate on */
  double eval_every_s;
  double checkpoint_every_s;
  uint64_t checkpoint_every_steps; /* 0: by time */
  char* checkpoint_path;           /* owned copy, or NULL */
  const st_meta_kv_t* ckpt_meta;
  size_t n_ckpt_meta;
  void (*notify)(void* arg);
  void* notify_arg;
  size_t n_params;
  float* scratch; /* device, n_params: a correction's delta */
  pthread_t thread;

  pthread_mutex_t mu;
  pthread_cond_t wake;  /* the thread waits here for work */
  pthread_cond_t reply; /* st__tt_set_state waits here for its result */

  /* Under mu. */
  req_t reqs[REQ_CAP]; /* FIFO ring */
  size_t req_head, req_count;
  unsigned snaps_out, applies_out; /* posted and not yet drained */
  bool state_busy, state_done;
  int state_rc;
  st__tt_event_t evs[EV_CAP]; /* FIFO ring */
  size_t ev_head, ev_count;
  bool go, stop, stop_checkpoint, checkpoint_req;
  st__tt_stats_t stats;

  /* The trainer thread's own (read by st__tt_stop after the join). */
  bool started;  /* has seen go */
  bool finished; /* epochs done or diverged */
  bool diverged;
  uint64_t version; /* bumped whenever the parameters change */
  uint64_t eval_version, ckpt_version;
  double next_eval, next_ckpt; /* monotonic seconds */
  uint64_t next_ckpt_step;     /* with checkpoint_every_steps */
  double losses[LOSS_WINDOW];
  size_t n_losses, loss_next;
  rate_point_t rate[RATE_POINTS];
  size_t rate_head, rate_count;
  uint64_t samples;
  int stop_rc;
  char stop_err[256];
};

/* Posts an event and wakes the loop (not during st__tt_stop). */
void st__tt_post(st__tt_t* tt, const st__tt_event_t* ev);
/* An event of `kind` at the current step; ok when rc is 0. */
void st__tt_make_event(st__tt_t* tt, st__tt_event_t* ev, st__tt_ev_kind_t kind,
                       uint64_t tag, int rc);
/* Writes a checkpoint with the body's writer and posts its result;
 * schedules the next periodic one a period from now (a failed write is
 * retried then, not at once). */
void st__tt_save_and_post(st__tt_t* tt, double now);
/* True when a periodic checkpoint is due at now and step: its period (in
 * seconds or in steps) has passed and the parameters changed since the
 * last one. */
bool st__tt_checkpoint_due(const st__tt_t* tt, double now, uint64_t step);
/* Takes the oldest request out; false when none. Caller holds mu. */
bool st__tt_pop_request_locked(st__tt_t* tt, req_t* r);
/* Sets up the mutex and condition variables and starts thread_main with
 * every signal blocked; on failure frees nothing but the sync objects. */
int st__tt_launch(st__tt_t* tt, void* (*thread_main)(void*) );

/* Frees what st__tt_start (or st__tt_start_attached) allocated, after
 * the join or when the launch failed. */
void st__tt_free_state(st__tt_t* tt);

/* attach_host.c: the body's share of make_event and stop. */
uint64_t st__ah_step(const st__tt_t* tt);
void st__ah_free(st__ah_t* ah);

#endif
