/* trainer_thread.h: the daemon's trainer thread and its mailbox (DESIGN.md,
 * Threads). Internal to node/.
 *
 * The thread owns an st_trainer_t (model and optimizer state on the chosen
 * device) and runs SGD steps back to back. Between two steps it looks at
 * its mailbox:
 *
 * - snapshot requests: copy the current parameters into a host buffer the
 *   requester owns, and report (tag, step) when done;
 * - corrections: add scale * delta (host memory) to the parameters (the
 *   gossip averaging delta), and report the tag when applied;
 * - a state to adopt (a joining node's parameters and step from a donor),
 *   only before the thread has been told to go;
 * - stop, with or without a final checkpoint.
 *
 * It never waits on the network: the loop thread posts requests and is
 * woken through the notify callback (the loop's uv_async_send) when a
 * result is ready, and drains results with st__tt_poll.
 *
 * The thread also evaluates the model on the test set every
 * eval_every_s seconds (and at the end of each epoch and when the last
 * epoch ends) and writes a checkpoint to checkpoint_path every
 * checkpoint_every_s seconds (atomic, st_trainer_save); both periodic
 * tasks are skipped while the parameters have not changed since the last
 * one, and both go on after the epochs while corrections arrive. When the
 * configured epochs are done it stops stepping but keeps serving
 * snapshots and corrections until stopped.
 *
 * After a divergence (a non-finite loss or gradient, or any other failed
 * step, ST__TT_EV_DIVERGED) the thread stops stepping but still answers
 * snapshots and corrections, so that nobody waits on it forever; the
 * parameters may then be non-finite, and the exchange layer's guard drops
 * such snapshots. It writes no checkpoint any more (requested, periodic or
 * at stop: -EDOM), so the last good one is kept.
 *
 * Every device call happens on the trainer thread (st__tt_set_state hands
 * its work to the thread and waits for it).
 */
#ifndef STARLING_NODE_TRAINER_THREAD_H
#define STARLING_NODE_TRAINER_THREAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "attach/attach.h"
#include "node/train/train.h"

typedef struct st__tt_s st__tt_t;

/* Outstanding requests per kind. A request counts from its post until its
 * result has been drained with st__tt_poll, so results never pile up
 * without bound when the loop falls behind. An averaging exchange needs one
 * snapshot and one correction; 16 of each lets exchanges with several
 * peers overlap while bounding what undrained results can hold. */
#define ST__TT_MAX_SNAPSHOTS 16
#define ST__TT_MAX_APPLIES 16

typedef struct {
  st_trainer_t* trainer;           /* initialized; owned by the thread once
                                      started, freed by the caller after join */
  const st_dataset_t* test;        /* may have n == 0 (no evaluation) */
  double eval_every_s;             /* 0: only at epoch ends */
  const char* checkpoint_path;     /* NULL: never; copied */
  double checkpoint_every_s;       /* 0: only at stop (or by steps) */
  uint64_t checkpoint_every_steps; /* or each this many steps; 0: by time */
  const st_meta_kv_t* ckpt_meta;   /* extra checkpoint metadata (borrowed) */
  size_t n_ckpt_meta;
  void (*notify)(void* arg); /* called from the trainer thread after it
                                posts a result; must be thread-safe */
  void* notify_arg;
} st__tt_config_t;

typedef enum {
  ST__TT_EV_SNAPSHOT = 1, /* tag: the snapshot's; step: taken at */
  ST__TT_EV_APPLIED,      /* tag: the correction's */
  ST__TT_EV_CHECKPOINT,   /* ok, err: a checkpoint was written (or not);
                             an undrained one is replaced by a newer one */
  ST__TT_EV_EPOCHS_DONE,  /* the configured epochs are done */
  ST__TT_EV_DIVERGED,     /* the loss went non-finite (or a step failed;
                             err says which): stepping stopped */
} st__tt_ev_kind_t;

/* Every event carries the step at which it happened. SNAPSHOT and APPLIED
 * have ok false (and err) when the device copy failed. */
typedef struct {
  st__tt_ev_kind_t kind;
  uint64_t tag;
  uint64_t step;
  bool ok;
  char err[256];
} st__tt_event_t;

typedef struct {
  uint64_t step;
  uint64_t epoch;
  double loss;            /* mean training loss over the last ~100 steps */
  double test_loss;       /* NaN until the first evaluation */
  double test_accuracy;   /* NaN until the first evaluation */
  double samples_per_sec; /* over the last few seconds */
  uint64_t samples;       /* examples processed since start */
  uint64_t corrections;   /* corrections applied */
  bool stepping;          /* told to go and not done/diverged/stopped */
  bool epochs_done;
  bool diverged;
  bool evaluating;             /* inside an evaluation (snapshots are served
                                  between its batches) */
  uint64_t mid_eval_snapshots; /* snapshots served during an evaluation */
  /* Attach mode (st__tt_start_attached) only. */
  bool attached;                /* a program's session is on */
  uint64_t sessions;            /* sessions started */
  uint64_t program_boundaries;  /* step boundaries the program reported */
  uint64_t program_requests;    /* requests the program served */
  uint64_t stale_snapshots;     /* served from the node's copy: no program,
                                   or it passed no boundary in time */
  uint64_t nonfinite_snapshots; /* the program's snapshots refused: its
                                   parameters were not finite */
} st__tt_stats_t;

/* ---- Attach mode (docs/attach.md) ----------------------------------------
 *
 * The same mailbox and events with no trainer: an attached program steps
 * the model in its own process and serves the thread's requests at its
 * step boundaries through the shared segment (attach/attach.h). The thread
 * keeps the node's own copy of the parameters: the program's last snapshot
 * plus every correction since. Corrections go into that copy at once (their
 * event is posted then) and to the program at its next boundary; a
 * snapshot asks the program for its parameters and waits for its next
 * boundary, at most ST__TT_SNAPSHOT_WAIT_S, after which (or with no
 * program attached) it is served from the node's copy. Checkpoints are
 * safetensors of the node's copy with the program's tensor names. */
#define ST__TT_SNAPSHOT_WAIT_S 1.0

typedef struct {
  const st_attach_model_t* model; /* copied */
  const float* params;            /* model->n_floats: the starting state */
  uint64_t step;
  const char* checkpoint_path;     /* NULL: never; copied */
  double checkpoint_every_s;       /* 0: only at stop (or by steps) */
  uint64_t checkpoint_every_steps; /* or each this many steps */
  void (*notify)(void* arg);
  void* notify_arg;
} st__tt_attach_config_t;

int st__tt_start_attached(const st__tt_attach_config_t* cfg, st__tt_t** out);

/* Starts a program's session on seg (a mapped segment of seg_bytes whose
 * header st_attach_check_header accepted): the thread writes its
 * parameters into area B and *step receives the step they belong to. The
 * thread owns the mapping from then on and unmaps it at the session's end.
 * Synchronous. -EBUSY while a session is on; -EINVAL outside attach mode. */
int st__tt_attach_session(st__tt_t* tt, void* seg, size_t seg_bytes,
                          uint64_t* step);
/* Ends the session (the program detached or died): requests waiting for
 * it are served from the node's copy, the segment is unmapped. With final
 * (a detach frame that says so), area A holds the program's last
 * parameters and the node's copy becomes them (plus the corrections the
 * program has not taken). Synchronous; nothing when no session is on. */
void st__tt_detach_session(st__tt_t* tt, bool final);

/* Starts the thread, which waits for st__tt_go before its first step.
 * -EINVAL for a missing or uninitialized trainer, negative or non-finite
 * intervals, or a test set whose features do not match the model; -ENOMEM;
 * or pthread_create's error. Blocks every signal in the new thread. */
int st__tt_start(const st__tt_config_t* cfg, st__tt_t** out);

/* Before st__tt_go only: adopt params[0..n) (host) and the position of
 * `step` (st_trainer_set_position). -EINVAL on a wrong n or after go;
 * -EDOM when params are not finite; -EBUSY while another thread's call is
 * in progress; or the device copy's error. Synchronous: params is borrowed
 * for the call only. */
int st__tt_set_state(st__tt_t* tt, const float* params, size_t n,
                     uint64_t step);
void st__tt_go(st__tt_t* tt);

/* Posts a snapshot request: at the next step boundary (at once when not
 * stepping) the thread copies the parameters into dst[0..n_params) and
 * posts ST__TT_EV_SNAPSHOT with tag. dst is borrowed until then. Requests
 * (snapshots and corrections) are served in the order they were posted.
 * -EBUSY when ST__TT_MAX_SNAPSHOTS are outstanding; -EINVAL once stopping. */
int st__tt_request_snapshot(st__tt_t* tt, uint64_t tag, float* dst);
/* Posts a correction: params += scale * delta[0..n_params) at the next
 * step boundary, then ST__TT_EV_APPLIED with tag. delta is borrowed until
 * then. -EBUSY when ST__TT_MAX_APPLIES are outstanding; -EINVAL once
 * stopping. */
int st__tt_request_apply(st__tt_t* tt, uint64_t tag, const float* delta,
                         float scale);
/* Asks for a checkpoint at the next step boundary (ST__TT_EV_CHECKPOINT;
 * ok false when no path is configured or the model diverged). */
void st__tt_request_checkpoint(st__tt_t* tt);

/* Drains one result; false when none is left. Loop thread. */
bool st__tt_poll(st__tt_t* tt, st__tt_event_t* ev);
/* A consistent copy of the counters. Any thread. */
void st__tt_stats(st__tt_t* tt, st__tt_stats_t* out);
size_t st__tt_n_params(const st__tt_t* tt);

/* Stops stepping, answers outstanding requests (snapshots are taken,
 * corrections applied: their buffers are released when this returns, but
 * their events are not delivered), writes a final checkpoint when
 * checkpoint is true and a path was configured, joins the thread and frees
 * it (not the trainer, which the caller closes). notify is never called
 * after this returns. Returns 0 or the checkpoint's error (-errno, or -EDOM
 * after a divergence; err says why). */
int st__tt_stop(st__tt_t* tt, bool checkpoint, char* err, size_t err_len);

#endif
