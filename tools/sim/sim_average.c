/* sim_average.c: the average scenario of `starling-sim`: pairwise gossip
 * averaging (AD-PSGD style, Lian et al. 2018) between N simulated nodes,
 * driven through the real sans-IO exchange machines of gossip/exchange.c
 * (st_xchg_*) the way node/daemon/daemon_xchg.c drives them.
 *
 * Each node holds a vector of --dim floats, drawn standard normal from the
 * run's seed. Each node starts an exchange at Poisson times (mean
 * AVG_GOSSIP_MEAN_US apart) unless it is already in one, with a uniformly
 * random other node, as the daemon's gossip tick does. One connection
 * joins the initiator's machine to the peer's; the peer's machine is made
 * when the XCHG_REQ arrives, answering busy when that node is already in
 * an exchange (as initiator or responder), and the initiator tries again
 * at its next start. Every SEND's bytes are copied into an event and
 * delivered to the other end after the network's latency (--latency-ms
 * plus exponential --jitter-ms, sim_net.c), never before the bytes sent
 * earlier on that connection: a stream keeps its order. The write is
 * acknowledged with st_xchg_sent in an event at the same instant (the
 * daemon's write callback). WANT_SNAPSHOT is answered at once with a copy
 * of the vector; APPLY adds the delta to the vector at once (the trainer
 * would at its next step; here there are no steps). DONE frees the machine
 * and closes that end; the other end sees the close after the bytes sent
 * before it. TIMER schedules st_xchg_tick. Nothing is lost, so no exchange
 * should fail.
 *
 * The run stops starting exchanges once --exchanges have completed (by
 * default enough for the mean squared distance to the average to fall by
 * 1e4 in theory), lets those in flight finish, and reports the measured
 * contraction per exchange against the theory for uniformly random pairs:
 * averaging i and j removes |x_i - x_j|^2 / 2 from the sum of squared
 * distances S, and over uniform pairs E|x_i - x_j|^2 = 2 S / (n - 1), so
 * E[S'] = (1 - 1/(n - 1)) S. docs/membership.md discusses the figures. */
#include "tools/sim/sim.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Each node starts an exchange every 100 ms of virtual time on average:
 * with 1 + Exp(1) ms one-way latency an exchange takes about 3 round trips
 * (REQ/REPLY, the chunks, the DONEs), so a few tens run at once at 256
 * nodes and some requests meet a busy peer, as in a real cluster. */
#define AVG_GOSSIP_MEAN_US 100000.0
#define AVG_TARGET_FALL 1e4 /* default --exchanges: S falls by this */

typedef enum {
  AV_START = 0, /* node wants to start an exchange */
  AV_DELIVER,   /* bytes (or the close) arrive at one end */
  AV_SENT,      /* one end's SEND was written */
  AV_TIMER      /* one end's machine timer */
} av_kind_t;

/* One connection: end 0 is the initiator, end 1 the responder. */
typedef struct {
  st_xchg_t* x[2]; /* end 1's is NULL until the XCHG_REQ arrives */
  uint32_t node[2];
  uint64_t tail_us[2]; /* last delivery towards end k: keeps the order */
  uint64_t deadline_ms[2];
  bool open[2];    /* end k has not closed */
  bool counted[2]; /* end k holds its node's one exchange slot */
  uint32_t refs;   /* events that point here */
} av_conn_t;

typedef struct {
  av_conn_t* c;
  uint8_t end;    /* the end the event is for */
  bool close;     /* DELIVER: the other end closed */
  uint64_t at_ms; /* TIMER: the deadline it was set for */
  uint32_t len;
  uint8_t data[];
} av_ev_t;

typedef struct {
  float* v;      /* dim floats */
  bool active;   /* in an averaging exchange (the daemon's avg_active) */
  uint64_t step; /* exchanges applied: the informational step of a REQ */
} av_node_t;

typedef struct {
  st_sim_t* s;
  st_sim_avg_result_t* r;
  st_xchg_config_t cfg;
  st_xchg_local_t local;
  st_wire_counters_t wc;
  av_node_t* nodes;
  float* all; /* n * dim floats: the nodes' vectors */
  uint32_t n;
  uint32_t dim;
  bool stopping;      /* the target is reached: start nothing new */
  uint32_t machines;  /* alive (not yet freed) */
  uint32_t active;    /* nodes in an exchange now */
  double active_area; /* integral of active over virtual time (node * us) */
  uint64_t area_last_us;
  int err; /* the first allocation failure */
} av_t;

/* ==== Events ============================================================ */

static void push(av_t* a, uint64_t at_us, av_kind_t kind, uint32_t node,
                 av_ev_t* ev) {
  st_sim_event_t e = {0};
  e.at_us = at_us < a->s->now_us ? a->s->now_us : at_us;
  e.kind = kind;
  e.node = node;
  e.u.arg = (uint64_t) (uintptr_t) ev;
  if (st__sim_heap_push(&a->s->heap, &e) != 0) {
    a->err = -ENOMEM;
    free(ev);
    return;
  }
  if (ev != NULL)
    ev->c->refs++;
}

static av_ev_t* ev_new(av_t* a, av_conn_t* c, uint8_t end, const void* data,
                       size_t len) {
  av_ev_t* ev = calloc(1, sizeof(*ev) + len);
  if (ev == NULL) {
    a->err = -ENOMEM;
    return NULL;
  }
  ev->c = c;
  ev->end = end;
  ev->len = (uint32_t) len;
  if (len > 0)
    memcpy(ev->data, data, len);
  return ev;
}

static void schedule_start(av_t* a, uint32_t i) {
  double u = st_rng_uniform(&a->s->script_rng);
  double gap = -log(1.0 - u) * AVG_GOSSIP_MEAN_US;
  push(a, a->s->now_us + (uint64_t) gap, AV_START, i, NULL);
}

/* Queues bytes (or the close, data == NULL) from end k to the other end,
 * after the latency and never before what end k sent earlier. */
static void transmit(av_t* a, av_conn_t* c, int k, const uint8_t* data,
                     size_t len) {
  int to = 1 - k;
  uint64_t at = a->s->now_us + st__sim_latency_us(a->s);
  if (at < c->tail_us[to])
    at = c->tail_us[to];
  c->tail_us[to] = at;
  av_ev_t* ev = ev_new(a, c, (uint8_t) to, data, data != NULL ? len : 0);
  if (ev == NULL)
    return;
  ev->close = data == NULL;
  push(a, at, AV_DELIVER, c->node[to], ev);
}

static void conn_unref(av_t* a, av_conn_t* c) {
  if (--c->refs > 0)
    return;
  for (int k = 0; k < 2; k++) {
    if (c->x[k] != NULL) {
      st_xchg_free(c->x[k]);
      a->machines--;
    }
  }
  free(c);
}

/* ==== Driving one end's machine ========================================= */

static void area_update(av_t* a) {
  uint64_t now = a->s->now_us;
  a->active_area += (double) a->active * (double) (now - a->area_last_us);
  a->area_last_us = now;
}

static void set_active(av_t* a, uint32_t i, bool on) {
  area_update(a);
  a->nodes[i].active = on;
  a->active = on ? a->active + 1 : a->active - 1;
  if (a->active > a->r->max_active_nodes)
    a->r->max_active_nodes = a->active;
}

/* DONE: count it as the daemon's finish_counts does, release the node's
 * slot, free the machine and close this end of the connection. */
static void finish(av_t* a, av_conn_t* c, int k, st_xchg_result_t res) {
  if (k == 0) {
    if (res == ST_XCHG_OK)
      a->r->exchanges_completed++;
    else if (res == ST_XCHG_BUSY || res == ST_XCHG_NOT_READY)
      a->r->exchanges_busy++;
    else
      a->r->exchanges_failed++;
    if (res == ST_XCHG_OK &&
        a->r->exchanges_completed >= a->r->exchanges_target)
      a->stopping = true;
  } else if (res != ST_XCHG_OK && res != ST_XCHG_BUSY &&
             res != ST_XCHG_NOT_READY) {
    a->r->exchanges_failed++;
  }
  if (c->counted[k]) {
    c->counted[k] = false;
    set_active(a, c->node[k], false);
  }
  st_xchg_free(c->x[k]);
  c->x[k] = NULL;
  a->machines--;
  c->open[k] = false;
  transmit(a, c, k, NULL, 0);
}

/* Handles one action; returns true when it asked for a snapshot. */
static bool act(av_t* a, av_conn_t* c, int k, const st_xact_t* x) {
  av_node_t* nd = &a->nodes[c->node[k]];
  switch (x->kind) {
    case ST_XACT_SEND: {
      transmit(a, c, k, x->data, x->len);
      av_ev_t* ev = ev_new(a, c, (uint8_t) k, NULL, 0);
      if (ev != NULL)
        push(a, a->s->now_us, AV_SENT, c->node[k], ev);
      return false;
    }
    case ST_XACT_WANT_SNAPSHOT:
      return true;
    case ST_XACT_APPLY:
      /* AVERAGE: delta = (peer - own) / 2 over the snapshots. */
      for (size_t d = 0; d < x->n && d < a->dim; d++)
        nd->v[d] += x->values[d];
      nd->step++;
      return false;
    case ST_XACT_TIMER: {
      c->deadline_ms[k] = x->at_ms;
      av_ev_t* ev = ev_new(a, c, (uint8_t) k, NULL, 0);
      if (ev != NULL) {
        ev->at_ms = x->at_ms;
        push(a, x->at_ms * 1000u, AV_TIMER, c->node[k], ev);
      }
      return false;
    }
    case ST_XACT_ENCODE: /* the simulator's nodes run no codec */
      st_xchg_encoded(c->x[k], a->s->now_us / 1000u, -ENOTSUP);
      return false;
    case ST_XACT_DECODE:
      st_xchg_decoded(c->x[k], a->s->now_us / 1000u, -ENOTSUP, 0);
      return false;
    case ST_XACT_DONE:
      finish(a, c, k, x->result);
      return false;
  }
  return false;
}

/* Drains end k's actions; a snapshot asked for is taken at once (the
 * vector cannot change meanwhile: its node is in this exchange only) and
 * draining goes on. */
static void drain(av_t* a, av_conn_t* c, int k) {
  bool want = true;
  while (want && c->x[k] != NULL) {
    want = false;
    st_xact_t x;
    while (c->x[k] != NULL && st_xchg_next_action(c->x[k], &x))
      want |= act(a, c, k, &x);
    if (want && c->x[k] != NULL) {
      const av_node_t* nd = &a->nodes[c->node[k]];
      float* buf = st_xchg_snapshot_buffer(c->x[k]);
      if (buf != NULL)
        memcpy(buf, nd->v, a->dim * sizeof(float));
      uint64_t now_ms = a->s->now_us / 1000u;
      if (buf == NULL ||
          st_xchg_snapshot(c->x[k], now_ms, buf, a->dim, nd->step) != 0)
        st_xchg_closed(c->x[k], now_ms);
    }
  }
}

static void fill_local(const av_t* a, uint32_t i, st_xchg_local_t* l) {
  *l = a->local;
  l->step = a->nodes[i].step;
}

/* A node's Poisson start: as the daemon's gossip tick, nothing when it is
 * already in an exchange; otherwise a uniformly random other node. */
static void on_start(av_t* a, uint32_t i) {
  if (a->stopping)
    return;
  schedule_start(a, i);
  if (a->nodes[i].active)
    return;
  uint32_t j = (uint32_t) st_rng_below(&a->s->script_rng, a->n - 1);
  if (j >= i)
    j++;
  av_conn_t* c = calloc(1, sizeof(*c));
  if (c == NULL) {
    a->err = -ENOMEM;
    return;
  }
  c->node[0] = i;
  c->node[1] = j;
  c->open[0] = c->open[1] = true;
  c->refs = 1; /* this call's, dropped below */
  st_xchg_local_t l;
  fill_local(a, i, &l);
  if (st_xchg_new_initiator(&a->cfg, ST_XCHG_AVERAGE, &l, a->s->now_us / 1000u,
                            &c->x[0]) != 0) {
    a->err = -ENOMEM;
  } else {
    a->machines++;
    c->counted[0] = true;
    set_active(a, i, true);
    drain(a, c, 0);
  }
  conn_unref(a, c);
}

/* The XCHG_REQ reached the peer: make its machine, busy when the peer is
 * in an exchange already (the daemon's st__xchg_on_message). Returns false
 * when the first message is not a request, and closes that end. */
static bool accept(av_t* a, av_conn_t* c, const av_ev_t* ev) {
  st_msg_t m;
  if (st_wire_decode(ev->data, ev->len, &m, &a->wc) != 0 ||
      m.type != ST_MSG_XCHG_REQ) {
    a->r->exchanges_failed++;
    c->open[1] = false;
    transmit(a, c, 1, NULL, 0);
    return false;
  }
  uint32_t j = c->node[1];
  bool busy = a->nodes[j].active;
  st_xchg_local_t l;
  fill_local(a, j, &l);
  if (st_xchg_new_responder(&a->cfg, &l, busy, a->s->now_us / 1000u,
                            &c->x[1]) != 0) {
    a->err = -ENOMEM;
    c->open[1] = false;
    return false;
  }
  a->machines++;
  if (!busy) {
    c->counted[1] = true;
    set_active(a, j, true);
  }
  return true;
}

static void on_conn_event(av_t* a, av_kind_t kind, av_ev_t* ev) {
  av_conn_t* c = ev->c;
  int k = ev->end;
  uint64_t now_ms = a->s->now_us / 1000u;
  if (kind == AV_DELIVER && c->open[k]) {
    if (ev->close) {
      if (c->x[k] != NULL)
        st_xchg_closed(c->x[k], now_ms);
      else
        c->open[k] = false;
    } else if (c->x[k] != NULL || (k == 1 && accept(a, c, ev))) {
      st_xchg_message(c->x[k], now_ms, ev->data, ev->len);
    }
  } else if (kind == AV_SENT && c->x[k] != NULL) {
    st_xchg_sent(c->x[k], now_ms);
  } else if (kind == AV_TIMER && c->x[k] != NULL &&
             c->deadline_ms[k] == ev->at_ms) {
    st_xchg_tick(c->x[k], now_ms);
  }
  drain(a, c, k);
  conn_unref(a, c);
  free(ev);
}

/* ==== The run =========================================================== */

/* The mean over nodes of the squared distance to the average, summed over
 * the coordinates; the average itself goes to mean[0..dim). */
static double msd(const av_t* a, double* mean) {
  for (uint32_t d = 0; d < a->dim; d++)
    mean[d] = 0;
  for (uint32_t i = 0; i < a->n; i++)
    for (uint32_t d = 0; d < a->dim; d++)
      mean[d] += a->nodes[i].v[d];
  for (uint32_t d = 0; d < a->dim; d++)
    mean[d] /= a->n;
  double sum = 0;
  for (uint32_t i = 0; i < a->n; i++) {
    for (uint32_t d = 0; d < a->dim; d++) {
      double e = a->nodes[i].v[d] - mean[d];
      sum += e * e;
    }
  }
  return sum / a->n;
}

static int setup(av_t* a, st_sim_t* s, st_sim_result_t* res) {
  a->s = s;
  a->r = &res->avg;
  a->n = s->opt.nodes;
  a->dim = s->opt.dim;
  st_xchg_config_default(&a->cfg);
  memcpy(a->local.fingerprint, "starling-sim-avg", 16);
  snprintf(a->local.model, sizeof(a->local.model), "sim:vector-%u f32",
           (unsigned) a->dim);
  a->local.n_params = a->dim;
  a->nodes = calloc(a->n, sizeof(*a->nodes));
  a->all = malloc((size_t) a->n * a->dim * sizeof(float));
  if (a->nodes == NULL || a->all == NULL)
    return -ENOMEM;
  st_rng_t init;
  st_rng_seed(&init, s->opt.seed ^ 0x61766572616765ull);
  for (uint32_t i = 0; i < a->n; i++) {
    a->nodes[i].v = a->all + (size_t) i * a->dim;
    for (uint32_t d = 0; d < a->dim; d++)
      a->nodes[i].v[d] = (float) st_rng_normal(&init);
  }
  a->r->dim = a->dim;
  a->r->rate_theory = -log(1.0 - 1.0 / (double) (a->n - 1));
  a->r->exchanges_target = s->opt.exchanges;
  if (a->r->exchanges_target == 0) {
    double k = ceil(log(AVG_TARGET_FALL) / a->r->rate_theory);
    a->r->exchanges_target = k >= 1 ? (uint64_t) k : 1;
  }
  for (uint32_t i = 0; i < a->n; i++)
    schedule_start(a, i);
  return a->err;
}

static void report(av_t* a, const double* mean0, double* mean1) {
  st_sim_avg_result_t* r = a->r;
  r->msd_end = msd(a, mean1);
  r->mean_drift_max = 0;
  for (uint32_t d = 0; d < a->dim; d++)
    r->mean_drift_max = fmax(r->mean_drift_max, fabs(mean1[d] - mean0[d]));
  r->sim_seconds = (double) a->s->now_us / 1e6;
  area_update(a);
  r->active_fraction =
      a->s->now_us > 0 ? a->active_area / (double) a->s->now_us / a->n : 0;
  r->rate = r->exchanges_completed > 0 ? -log(r->msd_end / r->msd_start) /
                                             (double) r->exchanges_completed
                                       : NAN;
  /* n = 2: one exchange makes the pair equal; r_th is infinite. */
  r->rate_ratio = isfinite(r->rate_theory) ? r->rate / r->rate_theory : NAN;
}

int st__sim_average_run(st_sim_t* s, st_sim_result_t* res) {
  av_t a = {0};
  double* mean = calloc(2 * (size_t) s->opt.dim, sizeof(double));
  int rc = mean == NULL ? -ENOMEM : setup(&a, s, res);
  res->nodes = a.n;
  st_sim_event_t e;
  if (rc == 0)
    a.r->msd_start = msd(&a, mean);
  while (rc == 0 && !(a.stopping && a.machines == 0) &&
         st__sim_heap_pop(&s->heap, &e)) {
    if (e.at_us > s->end_us) {
      st__sim_heap_push(&s->heap, &e); /* freed below */
      break;
    }
    s->now_us = e.at_us;
    s->events++;
    if (e.kind == AV_START)
      on_start(&a, e.node);
    else
      on_conn_event(&a, (av_kind_t) e.kind, (av_ev_t*) (uintptr_t) e.u.arg);
    rc = a.err;
  }
  if (rc == 0)
    report(&a, mean, mean + s->opt.dim);
  res->events = s->events;
  while (st__sim_heap_pop(&s->heap, &e)) {
    av_ev_t* ev = (av_ev_t*) (uintptr_t) e.u.arg;
    if (ev != NULL) {
      conn_unref(&a, ev->c);
      free(ev);
    }
  }
  free(a.nodes);
  free(a.all);
  free(mean);
  return rc;
}
