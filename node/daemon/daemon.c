/* daemon.c: start-up, the event loop, leave and shut-down of `starling
 * node` (node/daemon/daemon.h).
 *
 * Start-up order: the data directory (identity, a new boot epoch), keys,
 * the data and the trainer (and its checkpoint, when there is one), then
 * the sockets, then the membership machine, which joins through the seeds.
 * Nothing is said on the network before the boot epoch is on disk.
 *
 * Shut-down (SIGINT, SIGTERM, `starling leave`): the membership machine
 * announces the leave and the loop keeps gossiping it for LEAVE_LINGER_MS;
 * then the trainer thread stops and writes its checkpoint, every handle is
 * closed, and the loop must close with no handle left (it is logged and
 * the exit status says so otherwise).
 */
#include "node/daemon/daemon_internal.h"
#include "node/train/train_internal.h"

#include <errno.h>
#include <signal.h>
#include <inttypes.h>
#include <malloc.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Time for the leave to spread: a few gossip rounds at the default 200 ms
 * and one probe interval, so that peers mark the node left, not dead. */
#define LEAVE_LINGER_MS 1500u
#define SWEEP_MS 250u
/* How often the step is looked at for --log-every N steps. */
#define LOG_POLL_S 0.1
#define SEED_RETRY_MAX_S 30.0
#define REPLAY_SENDERS 16384

void st_daemon_config_default(st_daemon_config_t* cfg) {
  memset(cfg, 0, sizeof(*cfg));
  st_train_config_default(&cfg->train);
  cfg->data_opt.csv.label_col = -1;
  cfg->data_opt.normalize = 1;
  cfg->device = "auto";
  cfg->gossip_every_s = 0.5;
  cfg->ring_every_s = 5;
  cfg->checkpoint_every_s = 30;
  cfg->eval_every_s = 5;
  cfg->status_every_s = 1;
  cfg->log_every_s = 5;
  cfg->norm_mult = 10;
  cfg->clip_mult = 3;
  cfg->min_nodes = 1;
  cfg->sync_donors = 3;
  cfg->handshake_rate = ST_DAEMON_HANDSHAKE_RATE;
  st_outer_spec_default(&cfg->outer);
}

const char* st__dstate_name(st__dstate_t s) {
  switch (s) {
    case ST__D_SYNCING:
      return "syncing";
    case ST__D_WAITING:
      return "waiting";
    case ST__D_TRAINING:
      return "training";
    case ST__D_DONE:
      return "done";
    case ST__D_LEAVING:
      return "leaving";
  }
  return "unknown";
}

uint64_t st__dnow(const st__daemon_t* d) {
  (void) d;
  return uv_hrtime() / 1000000u;
}

__attribute__((format(printf, 3, 0))) static void vlog(const st__daemon_t* d,
                                                       const char* level,
                                                       const char* fmt,
                                                       va_list ap) {
  char id[33] = "?";
  st_node_id_format(&d->ident.id, id);
  double t = (double) (st__dnow(d) - d->started_ms) / 1e3;
  char msg[1024];
  vsnprintf(msg, sizeof(msg), fmt, ap);
  fprintf(stderr, "[%8.2f %.8s] %s%s\n", t, id, level, msg);
}

void st__dlog(const st__daemon_t* d, const char* fmt, ...) {
  if (d->cfg->quiet)
    return;
  va_list ap;
  va_start(ap, fmt);
  vlog(d, "", fmt, ap);
  va_end(ap);
}

void st__dwarn(const st__daemon_t* d, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(d, "warning: ", fmt, ap);
  va_end(ap);
}

/* ---- Timers -------------------------------------------------------------- */

static void gossip_cb(uv_timer_t* t) {
  st__xchg_gossip_tick(t->data);
}

/* How often a waiting node says what it waits for. */
#define WAIT_LOG_MS 10000u

/* The nodes that hold their model's state: this one (it waits, so it has
 * it) and every other alive member whose STATUS says synced. A joiner
 * still fetching its state does not count: started with it, a donor with
 * a small model could finish its epochs before the joiner took a step. */
static size_t synced_count(st__daemon_t* d) {
  size_t n = 1;
  for (size_t i = 0; i < st_membership_count(d->m); i++) {
    const st_member_t* mb = st_membership_at(d->m, i);
    if (mb != NULL && mb->state == ST_MEMBER_ALIVE && mb->has_status &&
        mb->status.synced && st_node_id_compare(&mb->id, &d->ident.id) != 0)
      n++;
  }
  return n;
}

/* Starts the trainer once --min-nodes hold their state (synced_count);
 * until then says every WAIT_LOG_MS how many are alive and how many of
 * them are synced. Training, once started, goes on whatever the count
 * does later. */
static void wait_tick(st__daemon_t* d) {
  if (d->state != ST__D_WAITING)
    return;
  size_t alive = st_membership_alive_count(d->m);
  size_t synced = d->cfg->min_nodes > 1 ? synced_count(d) : 1;
  uint64_t now = st__dnow(d);
  if (synced >= d->cfg->min_nodes) {
    if (d->cfg->min_nodes > 1)
      st__dlog(d,
               "%zu nodes alive and synced (--min-nodes %u): training starts",
               synced, d->cfg->min_nodes);
    d->state = ST__D_TRAINING;
    st__tt_go(d->tt);
    st__attach_node_ready(d);
  } else if (d->wait_logged_ms == 0 || now - d->wait_logged_ms >= WAIT_LOG_MS) {
    st__dlog(d,
             "waiting for %u nodes before the first step (--min-nodes): %zu "
             "alive, %zu synced",
             d->cfg->min_nodes, alive, synced);
    d->wait_logged_ms = now;
  }
}

void st__daemon_synced(st__daemon_t* d) {
  d->synced = true;
  if (d->state != ST__D_SYNCING)
    return;
  d->state = ST__D_WAITING;
  wait_tick(d);
}

static void sweep_cb(uv_timer_t* t) {
  st__daemon_t* d = t->data;
  wait_tick(d);
  st__conn_sweep(d);
  st__admin_sweep(d);
  st__xchg_sweep(d);
  st__xchg_sync_tick(d);
}

static void ring_tick_cb(uv_timer_t* t) {
  st__ring_tick(t->data);
}

static void status_cb(uv_timer_t* t) {
  st__daemon_t* d = t->data;
  if (d->state == ST__D_LEAVING)
    return;
  st__events_tick(d);
  st__status_publish(d);
}

void st__status_publish(st__daemon_t* d) {
  if (d->state == ST__D_LEAVING)
    return;
  st__tt_stats_t st;
  st__tt_stats(d->tt, &st);
  st_msg_status_t s;
  memset(&s, 0, sizeof(s));
  s.step = st.step;
  s.loss = (float) st.loss;
  s.accuracy = (float) st.test_accuracy;
  s.samples_per_sec = (float) st.samples_per_sec;
  memcpy(s.fingerprint, d->local.fingerprint, sizeof(s.fingerprint));
  s.ring_capable =
      d->rf != NULL && (d->state == ST__D_TRAINING || d->state == ST__D_DONE);
  s.synced = d->state != ST__D_SYNCING;
  s.n_keys = d->keys.has_previous ? 2 : 1;
  s.keys[0] = d->keys.current.id;
  s.keys[1] = d->keys.previous.id;
  st_membership_set_status(d->m, st__dnow(d), &s);
  st__net_drain(d);
}

st__figure_t st__figure(double v, int decimals) {
  st__figure_t f;
  if (isnan(v))
    snprintf(f.s, sizeof(f.s), "-");
  else
    snprintf(f.s, sizeof(f.s), "%.*f", decimals, v);
  return f;
}

static void log_cb(uv_timer_t* t) {
  st__daemon_t* d = t->data;
  st__tt_stats_t st;
  st__tt_stats(d->tt, &st);
  if (d->cfg->log_every_steps > 0) {
    /* Polled (LOG_POLL_S): a line when the step reaches the next mark. */
    uint64_t mark = st.step / d->cfg->log_every_steps;
    if (d->log_mark_set && mark == d->log_mark)
      return;
    d->log_mark = mark;
    d->log_mark_set = true;
  }
  size_t alive = st_membership_alive_count(d->m);
  const char* state = st__dstate_name(d->state);
  if (d->cfg->attach && d->state == ST__D_TRAINING && !st.attached)
    state = "no program attached,";
  st__dlog(d,
           "%s step %" PRIu64 " epoch %" PRIu64
           " loss %s test acc %s %s samples/s peers %zu exchanges "
           "%" PRIu64 " ok %" PRIu64 " failed %" PRIu64 " busy",
           state, st.step, st.epoch, st__figure(st.loss, 4).s,
           st__figure(st.test_accuracy, 4).s,
           st__figure(st.samples_per_sec, 0).s, alive > 0 ? alive - 1 : 0,
           d->c.ok, d->c.failed, d->c.busy);
}

/* With seeds given and nobody known yet, joins again, with backoff, and
 * says so: the seed may not be up yet, or the address may be wrong. */
static void seed_cb(uv_timer_t* t) {
  st__daemon_t* d = t->data;
  if (d->state == ST__D_LEAVING || d->n_seeds == 0)
    return;
  if (st_membership_alive_count(d->m) > 1) {
    d->seed_backoff_s = 1;
    uv_timer_start(&d->seed_timer, seed_cb, 2000, 0);
    return;
  }
  d->seed_retries++;
  char seeds[256] = "";
  for (size_t i = 0; i < d->n_seeds && strlen(seeds) < 200; i++) {
    char a[64];
    st__addr_format(&d->seed_addrs[i], a, sizeof(a));
    snprintf(seeds + strlen(seeds), sizeof(seeds) - strlen(seeds), "%s%s",
             i > 0 ? ", " : "", a);
  }
  st__dwarn(d,
            "no answer from seed %s yet (try %" PRIu64
            "); retrying in %.0f s. Is a node running there with the same "
            "cluster key?",
            seeds, d->seed_retries, d->seed_backoff_s);
  st_membership_join(d->m, st__dnow(d), d->seed_addrs, d->n_seeds);
  st__net_drain(d);
  uv_timer_start(&d->seed_timer, seed_cb, (uint64_t) (d->seed_backoff_s * 1000),
                 0);
  d->seed_backoff_s = fmin(d->seed_backoff_s * 2, SEED_RETRY_MAX_S);
}

static void tt_async_cb(uv_async_t* a) {
  st__daemon_t* d = a->data;
  if (d->tt == NULL)
    return;
  st__tt_event_t ev;
  while (d->tt != NULL && st__tt_poll(d->tt, &ev)) {
    switch (ev.kind) {
      case ST__TT_EV_SNAPSHOT:
      case ST__TT_EV_APPLIED:
        if (!st__ring_on_tt_event(d, &ev))
          st__xchg_on_tt_event(d, &ev);
        break;
      case ST__TT_EV_CHECKPOINT:
        if (!ev.ok) {
          st__dwarn(d, "checkpoint not written: %s", ev.err);
        } else {
          d->c.checkpoints++;
          d->c.checkpoint_step = ev.step;
          st__outer_save(d, false);
        }
        break;
      case ST__TT_EV_EPOCHS_DONE: {
        st__tt_stats_t st;
        st__tt_stats(d->tt, &st);
        st__dlog(d,
                 "epochs done at step %" PRIu64
                 ": test accuracy %.4f; serving peers until told to leave",
                 st.step, st.test_accuracy);
        if (d->state == ST__D_TRAINING)
          d->state = ST__D_DONE;
        status_cb(&d->status_timer);
        break;
      }
      case ST__TT_EV_DIVERGED:
        st__dwarn(d,
                  "training diverged (loss not finite); this node stops "
                  "stepping: lower --lr");
        if (d->state == ST__D_TRAINING)
          d->state = ST__D_DONE;
        break;
    }
  }
}

/* ---- Leave and shut-down ------------------------------------------------- */

static void close_handle(uv_handle_t* h) {
  if (!uv_is_closing(h))
    uv_close(h, NULL);
}

static void leave_done_cb(uv_timer_t* t) {
  st__daemon_t* d = t->data;
  char err[512] = "";
  bool ckpt = d->synced;
  /* The state at the leave is what was announced: write it. */
  if (d->tt != NULL) {
    int rc = st__tt_stop(d->tt, ckpt && d->exit_code == 0, err, sizeof(err));
    d->tt = NULL;
    if (rc != 0) {
      st__dwarn(d, "final checkpoint failed: %s", err);
      if (d->exit_code == 0)
        d->exit_code = 1;
    } else if (ckpt && d->exit_code == 0) {
      st__dlog(d, "checkpoint written to %s", d->checkpoint_path);
      st__outer_save(d, true);
    }
  }
  st__ring_close(d);
  st__coll_close(d);  /* before the connections: its ABORTs go out first */
  st__admin_close(d); /* answers `starling keys --cluster` with what it has */
  /* The trainer is gone: nothing borrows from the connections any more. */
  for (st__conn_t* c = d->conns; c != NULL; c = c->next)
    c->tt_pending = 0;
  st__conn_t* next;
  for (st__conn_t* c = d->conns; c != NULL; c = next) {
    next = c->next;
    c->ops = NULL; /* no exchange callbacks any more */
    c->closing = true;
    c->frames_out_pending = 0;
    close_handle((uv_handle_t*) &c->tcp);
  }
  st__control_close(d);
  st__events_close(d);
  st__metrics_close(d);
  st__attach_close(d);
  if (d->net_started) {
    close_handle((uv_handle_t*) &d->udp);
    close_handle((uv_handle_t*) &d->listener);
  }
  close_handle((uv_handle_t*) &d->sigint);
  close_handle((uv_handle_t*) &d->sigterm);
  close_handle((uv_handle_t*) &d->member_timer);
  close_handle((uv_handle_t*) &d->gossip_timer);
  close_handle((uv_handle_t*) &d->status_timer);
  close_handle((uv_handle_t*) &d->sweep_timer);
  close_handle((uv_handle_t*) &d->seed_timer);
  close_handle((uv_handle_t*) &d->log_timer);
  close_handle((uv_handle_t*) &d->ring_tick_timer);
  close_handle((uv_handle_t*) &d->tt_async);
  close_handle((uv_handle_t*) &d->leave_timer);
}

void st__daemon_leave(st__daemon_t* d, const char* why) {
  if (d->state == ST__D_LEAVING)
    return;
  st__dlog(d, "leaving (%s): announcing it to the cluster", why);
  d->state = ST__D_LEAVING;
  uv_timer_stop(&d->gossip_timer);
  uv_timer_stop(&d->seed_timer);
  uv_timer_stop(&d->log_timer);
  if (d->m != NULL) {
    st_membership_leave(d->m, st__dnow(d));
    st__net_drain(d);
  }
  /* Alone, there is nobody to tell. */
  uint64_t linger =
      d->m != NULL && st_membership_alive_count(d->m) > 0 ? LEAVE_LINGER_MS : 0;
  uv_timer_start(&d->leave_timer, leave_done_cb, linger, 0);
}

void st__daemon_fatal(st__daemon_t* d, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  st_set_errv(d->fatal, sizeof(d->fatal), fmt, ap);
  va_end(ap);
  d->exit_code = 1;
  st__daemon_leave(d, "cannot continue");
}

/* The one mutable global of the daemon, and it must be one: a signal
 * handler gets no context pointer, and it may only store to a volatile
 * sig_atomic_t. It holds a SIGINT or SIGTERM that came before the loop
 * could take signals; st_daemon_run raises it again once libuv's handlers
 * are in place. */
static volatile sig_atomic_t early_signal;

static void note_early_signal(int signum) {
  early_signal = signum;
}

/* A handler, not a blocked mask: OpenBLAS starts its threads when the
 * library loads, and the kernel gives a signal to any thread that does not
 * block it. Installed once; a signal noted earlier stays noted. */
void st_daemon_catch_early_signals(void) {
  struct sigaction sa;
  /* Already ours: the kernel's table says so, no flag of our own needed. */
  if (sigaction(SIGINT, NULL, &sa) == 0 && sa.sa_handler == note_early_signal)
    return;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = note_early_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

static void signal_cb(uv_signal_t* s, int signum) {
  st__daemon_t* d = s->data;
  st__daemon_leave(d, signum == SIGINT ? "SIGINT" : "SIGTERM");
}

/* ---- Start-up ------------------------------------------------------------ */

static int load_keys(st__daemon_t* d, char* err, size_t err_len) {
  const st_daemon_config_t* cfg = d->cfg;
  st_cluster_key_t cur, prev;
  int rc = st_cluster_key_load(cfg->cluster_key_path, &cur, err, err_len);
  if (rc != 0)
    return rc;
  if (cfg->previous_key_path != NULL) {
    rc = st_cluster_key_load(cfg->previous_key_path, &prev, err, err_len);
    if (rc != 0) {
      st_cluster_key_wipe(&cur);
      return rc;
    }
  }
  rc = st_keyring_init(&d->keys, &cur,
                       cfg->previous_key_path != NULL ? &prev : NULL, err,
                       err_len);
  st_cluster_key_wipe(&cur);
  st_cluster_key_wipe(&prev);
  if (rc != 0)
    return rc;
  if (cfg->allowlist_path != NULL) {
    rc = st_allowlist_load(cfg->allowlist_path, &d->allow, err, err_len);
    if (rc != 0)
      return rc;
  }
  rc = st_replay_table_new(REPLAY_SENDERS, &d->replay);
  if (rc != 0)
    return rc;
  d->sealer.keys = &d->keys;
  d->sealer.identity = &d->ident;
  d->sealer.boot_epoch = d->boot_epoch;
  d->sealer.counter = 0;
  return 0;
}

static int setup_training(st__daemon_t* d, char* err, size_t err_len) {
  const st_daemon_config_t* cfg = d->cfg;
  char e[512];
  int rc =
      st_backend_open(&d->be, cfg->device, (int) cfg->threads, e, sizeof(e));
  if (rc != 0) {
    st_set_err(err, err_len, "--device %s: %s", cfg->device, e);
    return rc;
  }
  /* Only this node's shard of the training set is held (the test set is
   * whole): 188 MB of Fashion-MNIST is 47 MB on each of 4 nodes. */
  st_data_options_t dopt = cfg->data_opt;
  dopt.shard_k = cfg->train.shard_k;
  dopt.shard_n = cfg->train.shard_n;
  rc = st_data_open(&d->data, cfg->data_spec, &dopt, e, sizeof(e));
  if (rc != 0) {
    st_set_err(err, err_len, "--data: %s", e);
    return rc;
  }
  rc = st_trainer_init(&d->trainer, d->be, &d->data.train, &cfg->train, e,
                       sizeof(e));
  if (rc != 0) {
    st_set_err(err, err_len, "%s", e);
    return rc;
  }
  d->trainer_ready = true;
  st__model_fingerprint(&cfg->train.model, d->local.fingerprint, d->local.model,
                        sizeof(d->local.model));
  d->local.n_params = d->trainer.model.n_params;
  st__compress_mark_model(d);
  /* Before a checkpoint replaces it: the seeded initialization. */
  st__compress_start_anchor(d, d->trainer.model.params,
                            (size_t) d->local.n_params);
  st__xchg_mark_start(d, d->trainer.model.params, (size_t) d->local.n_params);
  st__outer_mark_model(d);
  st__compress_sized(d);
  if (access(d->checkpoint_path, F_OK) == 0) {
    rc = st_trainer_load(&d->trainer, d->checkpoint_path, e, sizeof(e));
    if (rc != 0) {
      st_set_err(err, err_len,
                 "%s (move the checkpoint away to start this node afresh)", e);
      return rc;
    }
    d->resumed = true;
    st__outer_resume(d);
  }
  return 0;
}

static void notify_loop(void* arg) {
  uv_async_send(arg);
}

static int start_trainer(st__daemon_t* d) {
  st__tt_config_t tc;
  memset(&tc, 0, sizeof(tc));
  tc.trainer = &d->trainer;
  tc.test = &d->data.test;
  tc.eval_every_s = d->cfg->eval_every_s;
  tc.checkpoint_path = d->checkpoint_path;
  tc.checkpoint_every_s = d->cfg->checkpoint_every_s;
  tc.checkpoint_every_steps = d->cfg->checkpoint_every_steps;
  tc.notify = notify_loop;
  tc.notify_arg = &d->tt_async;
  return st__tt_start(&tc, &d->tt);
}

static void start_timer(st__daemon_t* d, uv_timer_t* t, uv_timer_cb cb,
                        double every_s) {
  uv_timer_init(&d->loop, t);
  t->data = d;
  if (every_s > 0) {
    uint64_t ms = (uint64_t) (every_s * 1000);
    if (ms == 0)
      ms = 1;
    uv_timer_start(t, cb, ms, ms);
  }
}

/* TCP and UDP share one port number. With port 0 the TCP listener takes a
 * free one first (TCP ports are the contended ones: outgoing and
 * TIME_WAIT connections hold them too), then UDP binds the same number;
 * should another program's UDP socket hold it, both are closed and the
 * pair is tried again on another port. */
#define BIND_TRIES 16

static int bind_sockets(st__daemon_t* d, char* err, size_t err_len) {
  bool any_port = d->self_addr.port == 0;
  int rc = 0;
  for (int i = 0; i < BIND_TRIES; i++) {
    if (any_port)
      d->self_addr.port = 0;
    rc = st__conn_listen(d, err, err_len);
    if (rc != 0)
      return rc;
    rc = st__net_start(d, err, err_len);
    if (rc != UV_EADDRINUSE || !any_port)
      return rc;
    /* Closed handles finish closing on the next loop iteration. */
    uv_close((uv_handle_t*) &d->listener, NULL);
    uv_close((uv_handle_t*) &d->udp, NULL);
    uv_run(&d->loop, UV_RUN_NOWAIT);
  }
  return rc;
}

static void start_periodic(uv_timer_t* t, uv_timer_cb cb, double every_s) {
  if (every_s > 0) {
    uint64_t ms = (uint64_t) (every_s * 1000);
    if (ms == 0)
      ms = 1;
    uv_timer_start(t, cb, ms, ms);
  }
}

/* The loop and what needs no model: the control socket, signals, the
 * timers (not yet running). In attach mode the node waits here for the
 * first program when no checkpoint gives the model. */
static int start_loop(st__daemon_t* d, char* err, size_t err_len) {
  int rc = uv_loop_init(&d->loop);
  if (rc != 0) {
    st_set_err(err, err_len, "cannot start the event loop: %s",
               uv_strerror(rc));
    return rc;
  }
  uv_timer_init(&d->loop, &d->member_timer);
  d->member_timer.data = d;
  st__coll_init(d);
  if ((rc = st__control_start(d, err, err_len)) != 0)
    return rc;
  if ((rc = st__metrics_start(d, err, err_len)) != 0)
    return rc;
  uv_async_init(&d->loop, &d->tt_async, tt_async_cb);
  d->tt_async.data = d;
  uv_signal_init(&d->loop, &d->sigint);
  uv_signal_init(&d->loop, &d->sigterm);
  d->sigint.data = d->sigterm.data = d;
  uv_signal_start(&d->sigint, signal_cb, SIGINT);
  uv_signal_start(&d->sigterm, signal_cb, SIGTERM);
  uv_timer_t* timers[] = {&d->gossip_timer,   &d->sweep_timer, &d->status_timer,
                          &d->log_timer,      &d->seed_timer,  &d->leave_timer,
                          &d->ring_tick_timer};
  for (size_t i = 0; i < sizeof(timers) / sizeof(timers[0]); i++)
    start_timer(d, timers[i], NULL, 0);
  return 0;
}

/* The address peers are told to use (in our ALIVE claims): --advertise
 * (its port 0: the bound port); else the bound address, unless it is the
 * unspecified address (0.0.0.0 or ::), for which the first up interface
 * of its family that is not loopback stands in, said in the log. */
static void choose_public_addr(st__daemon_t* d) {
  st_wire_addr_t a = d->has_advertise ? d->advertise_addr : d->self_addr;
  if (d->has_advertise && a.port == 0)
    a.port = d->self_addr.port;
  static const uint8_t zero[16] = {0};
  if (!d->has_advertise && memcmp(a.ip, zero, a.ip_len) == 0) {
    uv_interface_address_t* ifs = NULL;
    int n = 0;
    bool found = false;
    if (uv_interface_addresses(&ifs, &n) == 0) {
      for (int i = 0; i < n && !found; i++) {
        st_wire_addr_t c;
        st__addr_from_sockaddr((const struct sockaddr*) &ifs[i].address, &c);
        if (!ifs[i].is_internal && c.ip_len == a.ip_len) {
          c.port = a.port;
          a = c;
          found = true;
        }
      }
      uv_free_interface_addresses(ifs, n);
    }
    char text[64];
    st__addr_format(&a, text, sizeof(text));
    if (found)
      st__dlog(d,
               "listening on every interface; peers are told %s (the first "
               "that is not loopback: --advertise ADDR chooses another)",
               text);
    else
      st__dwarn(d,
                "listening on every interface, and none but loopback is up: "
                "give --advertise ADDR, the address peers should use");
  }
  d->public_addr = a;
  st__addr_format(&a, d->self_addr_text, sizeof(d->self_addr_text));
}

/* The sockets and the periodic work: the node is on the network. */
static int start_network(st__daemon_t* d, char* err, size_t err_len) {
  const st_daemon_config_t* cfg = d->cfg;
  int rc = bind_sockets(d, err, err_len);
  if (rc != 0)
    return rc;
  choose_public_addr(d);
  d->net_started = true;
  start_periodic(&d->gossip_timer, gossip_cb, cfg->gossip_every_s);
  start_periodic(&d->sweep_timer, sweep_cb, SWEEP_MS / 1000.0);
  start_periodic(&d->status_timer, status_cb, cfg->status_every_s);
  start_periodic(&d->log_timer, log_cb,
                 cfg->log_every_steps > 0 ? LOG_POLL_S : cfg->log_every_s);
  start_periodic(&d->ring_tick_timer, ring_tick_cb, st__ring_tick_every_s(d));
  return 0;
}

/* With --allow, only the listed keys enter the view, whoever speaks of
 * them. */
static bool admit_listed(const uint8_t pk[ST_PUBLIC_KEY_BYTES], void* ctx) {
  const st__daemon_t* d = ctx;
  return st_allowlist_contains(d->allow, pk);
}

/* Membership's signed claims (our ALIVE, STATUS, leave) use our identity;
 * others' are checked with Ed25519, the machine's default verifier. */
static void sign_claim(void* ctx, const uint8_t* msg, size_t len,
                       uint8_t sig[ST_SIGNATURE_BYTES]) {
  const st__daemon_t* d = ctx;
  st_identity_sign(&d->ident, msg, len, sig);
}

static int start_membership(st__daemon_t* d, char* err, size_t err_len) {
  st_membership_config_t mc;
  st_membership_config_default(&mc);
  uint64_t seed;
  memcpy(&seed, d->ident.id.b, sizeof(seed));
  st_rng_seed(&d->rng, seed ^ ((uint64_t) d->boot_epoch << 32) ^ uv_hrtime());
  int rc =
      st_membership_new(&mc, &d->ident.id, &d->public_addr, d->ident.public_key,
                        d->boot_epoch, &d->rng, &d->m);
  if (rc != 0) {
    st_set_err(err, err_len, "cannot start membership: %s", strerror(-rc));
    return rc;
  }
  if (d->allow != NULL)
    st_membership_set_admit(d->m, admit_listed, d);
  st_membership_signer_t signer = {sign_claim, NULL, d};
  st_membership_set_signer(d->m, &signer);
  status_cb(&d->status_timer);
  if (d->n_seeds > 0) {
    st_membership_join(d->m, st__dnow(d), d->seed_addrs, d->n_seeds);
    st__net_drain(d);
    d->seed_backoff_s = 1;
    uv_timer_start(&d->seed_timer, seed_cb, 3000, 0);
  } else {
    st_membership_tick(d->m, st__dnow(d));
    st__net_drain(d);
  }
  return 0;
}

static void walk_close(uv_handle_t* h, void* arg) {
  (void) arg;
  close_handle(h);
}

static void walk_report(uv_handle_t* h, void* arg) {
  st__daemon_t* d = arg;
  st__dwarn(d, "handle left open at exit: %s", uv_handle_type_name(h->type));
}

static void cleanup(st__daemon_t* d) {
  if (d->tt != NULL) {
    st__tt_stop(d->tt, false, NULL, 0);
    d->tt = NULL;
  }
  st__attach_free(d);
  st__metrics_free(d);
  st__events_free(d);
  while (d->conns != NULL) {
    st__conn_t* c = d->conns;
    c->handle_closed = true;
    c->tt_pending = 1;
    st__conn_release(c); /* down to 0: frees it */
  }
  free(d->rx_plain);
  free(d->xbuf); /* after the conns: no machine borrows it now */
  st__ring_free(d);
  st__sync_free(d);
  st__anchor_release(d->anchor);
  d->anchor = NULL;
  st__anchor_release(d->start_anchor);
  d->start_anchor = NULL;
  st__outer_free(d);
  if (d->m != NULL)
    st_membership_free(d->m);
  if (d->trainer_ready)
    st_trainer_close(&d->trainer);
  st_data_close(&d->data);
  if (d->be != NULL)
    st_backend_close(d->be);
  if (d->replay != NULL)
    st_replay_table_free(d->replay);
  if (d->allow != NULL)
    st_allowlist_free(d->allow);
  st_keyring_wipe(&d->keys);
  st_identity_wipe(&d->ident);
  st__state_release(d); /* the last write (the checkpoint) is done */
}

/* Process-wide settings a node needs before anything starts. */
static void prepare_process(st__daemon_t* d) {
  /* libuv writes to sockets with write(2): a peer (another node, a control
   * client) that hung up makes the next write raise SIGPIPE, whose default
   * action kills the process. Ignored, the write fails with EPIPE and the
   * connection's error path closes it. */
  signal(SIGPIPE, SIG_IGN);
  st_daemon_catch_early_signals(); /* the CLI has done it already */
  st__ring_size_pool(d);
  /* An exchange allocates and frees a few model-sized buffers. Above
   * glibc's mmap threshold each would come fresh from the kernel, and the
   * page faults and zeroing cost a tenth of an exchange (10M parameters):
   * keep them in the heap for reuse instead. */
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

/* --listen, --join and --metrics, parsed before the data directory is
 * touched. */
static int parse_addresses(st__daemon_t* d, char* err, size_t err_len) {
  const st_daemon_config_t* cfg = d->cfg;
  struct sockaddr_storage ss;
  char e[256];
  int rc = st__addr_parse(cfg->listen, &ss, &d->self_addr, e, sizeof(e));
  if (rc != 0)
    st_set_err(err, err_len, "--listen: %s", e);
  st__addr_format(&d->self_addr, d->self_addr_text, sizeof(d->self_addr_text));
  for (size_t i = 0; rc == 0 && i < cfg->n_seeds; i++) {
    rc = st__addr_parse(cfg->seeds[i], &d->seeds[i], &d->seed_addrs[i], e,
                        sizeof(e));
    if (rc != 0)
      st_set_err(err, err_len, "--join: %s", e);
  }
  d->n_seeds = cfg->n_seeds;
  if (rc == 0 && cfg->advertise != NULL) {
    rc = st__addr_parse(cfg->advertise, &ss, &d->advertise_addr, e, sizeof(e));
    if (rc != 0)
      st_set_err(err, err_len, "--advertise: %s", e);
    d->has_advertise = rc == 0;
  }
  if (rc == 0 && cfg->metrics != NULL &&
      (rc = st__metrics_parse(cfg->metrics, &ss, e, sizeof(e))) != 0)
    st_set_err(err, err_len, "--metrics: %s", e);
  return rc;
}

static int start_host(st__daemon_t* d) {
  if (!d->cfg->attach)
    return start_trainer(d);
  st__tt_attach_config_t ac;
  memset(&ac, 0, sizeof(ac));
  ac.model = &d->attach_model;
  ac.params = d->attach_params;
  ac.step = d->attach_step;
  ac.checkpoint_path = d->checkpoint_path;
  ac.checkpoint_every_s = d->cfg->checkpoint_every_s;
  ac.checkpoint_every_steps = d->cfg->checkpoint_every_steps;
  ac.notify = notify_loop;
  ac.notify_arg = &d->tt_async;
  int rc = st__tt_start_attached(&ac, &d->tt);
  free(d->attach_params); /* the thread has its own copy */
  d->attach_params = NULL;
  return rc;
}

static void log_started(st__daemon_t* d);

/* Everything that needs the model, once the loop exists: the sockets, the
 * trainer (or the attach host), membership, the ring. */
int st__daemon_start_node(st__daemon_t* d, char* err, size_t err_len) {
  int rc = start_network(d, err, err_len);
  if (rc == 0 && (rc = start_host(d)) != 0)
    st_set_err(err, err_len, "cannot start the model's thread: %s",
               strerror(-rc));
  if (rc == 0) {
    d->node_started = true;
    d->state = ST__D_SYNCING;
    d->fault_sync_corrupt = getenv("STARLING_FAULT_SYNC_CORRUPT") != NULL;
    if (d->fault_sync_corrupt)
      st__dwarn(d,
                "STARLING_FAULT_SYNC_CORRUPT is set: this node corrupts "
                "every chunk of the agreed state it serves (for tests)");
    d->fault_sync_manifest = getenv("STARLING_FAULT_SYNC_MANIFEST") != NULL;
    if (d->fault_sync_manifest)
      st__dwarn(d,
                "STARLING_FAULT_SYNC_MANIFEST is set: this node describes "
                "its agreed state falsely to joiners (for tests)");
    rc = start_membership(d, err, err_len);
    if (rc == 0 && (d->resumed || d->n_seeds == 0))
      st__daemon_synced(d);
  }
  if (rc == 0 && (rc = st__ring_start(d)) != 0)
    st_set_err(err, err_len, "cannot start the ring: %s", strerror(-rc));
  if (rc == 0)
    log_started(d);
  return rc;
}

static void log_started(st__daemon_t* d) {
  char id[33];
  st_node_id_format(&d->ident.id, id);
  st__dlog(d,
           "node %s listening on %s (boot epoch %u), model %s, %s; control "
           "socket %s",
           id, d->self_addr_text, d->boot_epoch, d->local.model,
           d->resumed        ? "resumed from its checkpoint"
           : d->n_seeds == 0 ? "first node: seeded initialization"
                             : "will synchronize from a peer",
           d->control_path);
  /* The wall clock of this log's second 0, so that `starling plot` can put
   * the nodes of a cluster on one time axis. */
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  st__dlog(d, "log clock: second 0 of this log is Unix time %.3f",
           (double) now.tv_sec + (double) now.tv_nsec / 1e9 -
               (double) (st__dnow(d) - d->started_ms) / 1e3);
}

/* Runs the loop to its end (or, when start-up failed, closes whatever it
 * opened), then closes the loop. Returns rc, or the loop's own failure. */
static int run_and_close_loop(st__daemon_t* d, int rc, char* err,
                              size_t err_len) {
  if (rc == 0) {
    uv_run(&d->loop, UV_RUN_DEFAULT);
  } else {
    if (d->tt != NULL) {
      st__tt_stop(d->tt, false, NULL, 0);
      d->tt = NULL;
    }
    st__control_close(d);
    st__events_close(d);
    st__metrics_close(d);
    uv_walk(&d->loop, walk_close, NULL);
    uv_run(&d->loop, UV_RUN_DEFAULT);
  }
  int lc = uv_loop_close(&d->loop);
  if (lc != 0) {
    uv_walk(&d->loop, walk_report, d);
    if (rc == 0)
      st_set_err(err, err_len, "the event loop still had open handles");
    rc = rc != 0 ? rc : -EBUSY;
  } else if (rc == 0) {
    st__dlog(d, "stopped: every handle closed");
  }
  return rc;
}

int st_daemon_run(const st_daemon_config_t* cfg, char* err, size_t err_len) {
  st__daemon_t* d = calloc(1, sizeof(*d));
  if (d == NULL)
    return -ENOMEM;
  d->cfg = cfg;
  d->lock_fd = -1;
  d->started_ms = st__dnow(d);
  prepare_process(d);
  st_xchg_config_default(&d->xcfg);
  d->xcfg.norm_mult = cfg->norm_mult;
  /* One copy of the model an exchange, not two: the delta is made in our
   * snapshot's buffer (gossip.h), unless the gossip outer step needs the
   * snapshot after the exchange (daemon_xchg.c, xchg_own). */
  d->xcfg.delta_in_own = cfg->outer.kind != ST_OUTER_NOLOCO;
  int rc = st_crypto_init();
  bool loop_started = false;
  /* The flags first, then the data directory: a refused start leaves the
   * directory as it was. */
  if (rc == 0)
    rc = parse_addresses(d, err, err_len);
  if (rc == 0)
    rc = st__state_prepare(d, err, err_len);
  if (rc == 0)
    rc = load_keys(d, err, err_len);
  if (rc == 0)
    rc = d->cfg->attach ? st__attach_setup(d, err, err_len)
                        : setup_training(d, err, err_len);
  if (rc == 0) {
    loop_started = true;
    rc = start_loop(d, err, err_len);
  }
  /* The loop's handlers are in place: a signal that came meanwhile goes to
   * them now, and the node leaves as soon as its loop runs. */
  if (rc == 0 && early_signal != 0)
    raise(early_signal);
  if (rc == 0 && !st__attach_waits_for_model(d))
    rc = st__daemon_start_node(d, err, err_len);
  else if (rc == 0)
    st__dlog(d,
             "waiting for a program to attach through %s (starling/client.h, "
             "or starling.attach in Python): it brings the model",
             d->control_path);
  if (loop_started)
    rc = run_and_close_loop(d, rc, err, err_len);
  if (rc == 0 && d->exit_code != 0) {
    st_set_err(err, err_len, "%s", d->fatal[0] ? d->fatal : "node failed");
    rc = -ECANCELED;
  }
  cleanup(d);
  free(d);
  return rc;
}
