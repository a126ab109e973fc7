/* sim_metrics.c: what the simulator measures, by comparing the ground truth
 * it scripted with what the machines believe (their MEMBER actions).
 *
 * Definitions (docs/membership.md repeats them):
 *  - A member is healthy at time t when it runs (started, not crashed, not
 *    leaving or left), is not paused, and has been neither paused nor
 *    (re)started during the last grace period, two probe intervals: a probe
 *    that failed because its target was stalled at some moment of it is a
 *    true suspicion, not a false one.
 *  - A suspicion is originated when a machine marks a member suspect while
 *    handling its own timer (its probe of that member failed); learned ones
 *    arrive in packets or push-pulls. `suspicions` counts originated ones,
 *    `false_suspicions` the originated ones whose target was healthy and in
 *    the same life (boot epoch) as the claim, `false_suspect_views` every
 *    view (originated or learned) of a claim (member, incarnation) whose
 *    first origination was false.
 *  - A false death is the first declaration, by anyone, that a member's
 *    current life at some incarnation is dead while the member is healthy;
 *    the same (member, incarnation) counts once however far it spreads.
 *  - Detection (crash): first suspicion is the first time any running node
 *    holds the crashed life suspect or dead; dead everywhere is the first
 *    time every node that was running at the crash, and still is, holds it
 *    dead. Leave and join are measured the same way ("left", "alive").
 *  - Load: UDP packets sent (lost ones included) and their sealed size
 *    (plaintext + ST_PACKET_OVERHEAD) per running member per second over
 *    the window that opens with the scenario's main phase (--crash-at, or
 *    five seconds after the cluster first converges).
 *  - Memory per node: heap bytes in use (glibc's allocator count) held by
 *    the machines at the end of the run, divided by the running nodes; the
 *    simulator's own allocations are subtracted. */
#include "tools/sim/sim.h"

#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool is_running(const st_sim_node_t* nd) {
  return nd->life == ST_SIM_UP || nd->life == ST_SIM_LEAVING;
}

bool st__sim_healthy(const st_sim_t* s, uint32_t i) {
  const st_sim_node_t* nd = &s->nodes[i];
  return nd->life == ST_SIM_UP && !nd->paused &&
         s->now_us >= nd->healthy_from_us;
}

double st__sim_suspicion_max_s(const st_sim_t* s, uint32_t n) {
  /* memberlist: timeout = mult * max(1, log10(n)) * probe interval, and
   * the Lifeguard ceiling is max_mult times that. */
  double scale = n > 10 ? log10((double) n) : 1.0;
  double base = s->cfg.suspicion_mult * scale * s->cfg.probe_interval_ms;
  double mult = s->cfg.lifeguard ? s->cfg.suspicion_max_mult : 1.0;
  return base * mult / 1000.0;
}

/* ==== Load window ======================================================= */

static void area(st_sim_t* s) {
  if (s->c.window_open) {
    s->c.member_us +=
        (double) s->running * (double) (s->now_us - s->c.area_last_us);
  }
  s->c.area_last_us = s->now_us;
}

void st__sim_running_changed(st_sim_t* s, int delta) {
  area(s);
  s->running = (uint32_t) ((int) s->running + delta);
}

void st__sim_window_open(st_sim_t* s) {
  if (s->c.window_open)
    return;
  area(s);
  s->c.window_open = true;
  s->c.window_start_us = s->now_us;
  s->c.w_packets = s->c.packets;
  s->c.w_bytes = s->c.bytes;
  s->c.w_stream_bytes = s->c.stream_bytes;
  s->c.member_us = 0;
}

/* ==== Trackers ========================================================== */

static bool bit(const st_sim_tracker_t* t, uint32_t o) {
  return (t->bits[o >> 3] >> (o & 7)) & 1;
}

static void set_bit(st_sim_tracker_t* t, uint32_t o, bool v) {
  if (bit(t, o) == v)
    return;
  t->bits[o >> 3] ^= (uint8_t) (1u << (o & 7));
  if (v) {
    t->have++;
  } else {
    t->have--;
  }
}

static void check_done(st_sim_t* s, st_sim_tracker_t* t) {
  if (t->done_us == UINT64_MAX && t->have >= t->need)
    t->done_us = s->now_us;
}

int st__sim_track(st_sim_t* s, st_sim_track_kind_t kind, uint32_t subject) {
  if (s->n_trackers == s->cap_trackers) {
    uint32_t cap = s->cap_trackers ? 2 * s->cap_trackers : 16;
    st_sim_tracker_t* t = realloc(s->trackers, cap * sizeof(*t));
    if (t == NULL)
      return -1;
    s->own_bytes += (cap - s->cap_trackers) * sizeof(*t);
    s->trackers = t;
    s->cap_trackers = cap;
  }
  st_sim_tracker_t* t = &s->trackers[s->n_trackers];
  memset(t, 0, sizeof(*t));
  t->bits = st__sim_alloc(s, (s->n + 7) / 8);
  if (t->bits == NULL)
    return -1;
  memset(t->bits, 0, (s->n + 7) / 8);
  const st_sim_node_t* x = &s->nodes[subject];
  t->kind = (uint8_t) kind;
  t->subject = subject;
  t->epoch = x->epoch;
  /* Observers that count: those running now that started before the
   * subject's event (a crash or leave: every running node; a join: every
   * node older than the joiner). */
  t->join_order =
      kind == ST_SIM_TRACK_JOIN ? x->join_order : s->next_join_order;
  t->need = s->running - (is_running(x) ? 1 : 0);
  t->start_us = s->now_us;
  t->first_suspect_us = UINT64_MAX;
  t->done_us = UINT64_MAX;
  s->nodes[subject].tracker = (int32_t) s->n_trackers;
  s->n_trackers++;
  check_done(s, t);
  return 0;
}

void st__sim_observer_gone(st_sim_t* s, uint32_t o) {
  for (uint32_t k = 0; k < s->n_trackers; k++) {
    st_sim_tracker_t* t = &s->trackers[k];
    if (t->subject == o || s->nodes[o].join_order >= t->join_order)
      continue;
    set_bit(t, o, false);
    if (t->need > 0)
      t->need--;
    check_done(s, t);
  }
}

static void track_observe(st_sim_t* s, st_sim_tracker_t* t, uint32_t o,
                          st_member_state_t st) {
  if (s->nodes[o].join_order >= t->join_order)
    return;
  switch ((st_sim_track_kind_t) t->kind) {
    case ST_SIM_TRACK_CRASH:
      if (st != ST_MEMBER_ALIVE && t->first_suspect_us == UINT64_MAX) {
        t->first_suspect_us = s->now_us;
      }
      set_bit(t, o, st == ST_MEMBER_DEAD || st == ST_MEMBER_LEFT);
      break;
    case ST_SIM_TRACK_LEAVE:
      if (st == ST_MEMBER_DEAD)
        s->c.left_seen_dead++;
      set_bit(t, o, st == ST_MEMBER_DEAD || st == ST_MEMBER_LEFT);
      break;
    case ST_SIM_TRACK_JOIN:
      set_bit(t, o, st == ST_MEMBER_ALIVE || st == ST_MEMBER_SUSPECT);
      break;
  }
  check_done(s, t);
}

/* ==== Observations ====================================================== */

void st__sim_observe(st_sim_t* s, uint32_t o, const st_member_t* mb) {
  uint32_t x;
  if (st__sim_node_lookup(s, &mb->id, &x) != 0 || x == o)
    return;
  st_sim_node_t* nd = &s->nodes[x];
  uint32_t epoch = (uint32_t) (mb->incarnation >> 32);
  bool current = epoch == nd->epoch && nd->life != ST_SIM_UNSTARTED;
  bool healthy = current && st__sim_healthy(s, x);
  if (s->opt.trace) {
    fprintf(stderr, "%10.3f  node %u: node %u %s inc %u.%u%s%s\n",
            (double) s->now_us / 1e6, o, x, st_member_state_name(mb->state),
            epoch, (uint32_t) mb->incarnation, s->in_tick ? " (own probe)" : "",
            (mb->state != ST_MEMBER_ALIVE && healthy) ? " FALSE" : "");
  }
  switch (mb->state) {
    case ST_MEMBER_SUSPECT:
      if (s->in_tick) {
        s->c.suspicions++;
        if (healthy)
          s->c.false_suspicions++;
        if (!nd->suspect_known || mb->incarnation > nd->suspect_inc) {
          nd->suspect_known = true;
          nd->suspect_inc = mb->incarnation;
          nd->suspect_false = healthy;
        }
      }
      /* A learned view is as false as the claim it repeats. */
      if (current && nd->suspect_known && mb->incarnation == nd->suspect_inc &&
          nd->suspect_false)
        s->c.false_suspect_views++;
      break;
    case ST_MEMBER_DEAD:
    case ST_MEMBER_LEFT:
      if (current &&
          (!nd->dead_declared || mb->incarnation > nd->dead_declared_inc)) {
        nd->dead_declared = true;
        nd->dead_declared_inc = mb->incarnation;
        if (healthy)
          s->c.false_deaths++;
      }
      break;
    case ST_MEMBER_ALIVE:
      break;
  }
  if (nd->tracker >= 0) {
    st_sim_tracker_t* t = &s->trackers[nd->tracker];
    if (t->epoch == epoch)
      track_observe(s, t, o, mb->state);
  }
}

/* Every running, unpaused node sees every running node alive. */
bool st__sim_check_converged(st_sim_t* s) {
  for (uint32_t i = 0; i < s->n; i++) {
    const st_sim_node_t* nd = &s->nodes[i];
    if (!is_running(nd) || nd->paused)
      continue;
    if (st_membership_alive_count(nd->m) != s->running)
      return false;
  }
  return s->running > 0;
}

/* ==== Results =========================================================== */

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*) a, y = *(const double*) b;
  return (x > y) - (x < y);
}

/* Mean and nearest-rank 99th percentile of v[0..n); NaN when n == 0. */
static void summarize(double* v, size_t n, double* mean, double* p99) {
  if (n == 0) {
    *mean = *p99 = NAN;
    return;
  }
  double sum = 0;
  for (size_t i = 0; i < n; i++)
    sum += v[i];
  qsort(v, n, sizeof(*v), cmp_double);
  size_t rank = (size_t) ceil(0.99 * (double) n);
  *mean = sum / (double) n;
  *p99 = v[rank > 0 ? rank - 1 : 0];
}

static void collect_trackers(st_sim_t* s, st_sim_result_t* r) {
  size_t n = s->n_trackers ? s->n_trackers : 1;
  double* a = calloc(n, sizeof(double));
  double* b = calloc(n, sizeof(double));
  size_t na = 0, nb = 0;
  double probe_s = s->cfg.probe_interval_ms / 1000.0;
  if (a == NULL || b == NULL)
    goto out;
  /* Crashes: first suspicion and dead everywhere. */
  for (uint32_t k = 0; k < s->n_trackers; k++) {
    const st_sim_tracker_t* t = &s->trackers[k];
    if (t->kind != ST_SIM_TRACK_CRASH)
      continue;
    r->crashes++;
    if (t->first_suspect_us != UINT64_MAX) {
      r->crashes_suspected++;
      a[na++] = (double) (t->first_suspect_us - t->start_us) / 1e6;
    }
    if (t->done_us != UINT64_MAX) {
      r->crashes_dead_everywhere++;
      b[nb++] = (double) (t->done_us - t->start_us) / 1e6;
    }
  }
  summarize(a, na, &r->first_suspect_mean_s, &r->first_suspect_p99_s);
  summarize(b, nb, &r->dead_everywhere_mean_s, &r->dead_everywhere_p99_s);
  r->first_suspect_mean_probes = r->first_suspect_mean_s / probe_s;
  /* Leaves. */
  na = 0;
  for (uint32_t k = 0; k < s->n_trackers; k++) {
    const st_sim_tracker_t* t = &s->trackers[k];
    if (t->kind != ST_SIM_TRACK_LEAVE)
      continue;
    r->leaves++;
    if (t->done_us != UINT64_MAX) {
      r->leaves_everywhere++;
      a[na++] = (double) (t->done_us - t->start_us) / 1e6;
    }
  }
  summarize(a, na, &r->leave_everywhere_mean_s, &r->leave_everywhere_p99_s);
  /* Probe joins. */
  na = 0;
  for (uint32_t k = 0; k < s->n_trackers; k++) {
    const st_sim_tracker_t* t = &s->trackers[k];
    if (t->kind != ST_SIM_TRACK_JOIN)
      continue;
    r->probe_joins++;
    if (t->done_us != UINT64_MAX) {
      r->probe_joins_converged++;
      a[na++] = (double) (t->done_us - t->start_us) / 1e6;
    }
  }
  summarize(a, na, &r->join_converged_s, &r->join_converged_p99_s);
  r->join_rounds =
      r->join_converged_s * 1000.0 / (double) s->cfg.gossip_interval_ms;
out:
  free(a);
  free(b);
}

/* Pairs (running observer, running member) the observer gets wrong. */
static void census(st_sim_t* s, st_sim_result_t* r) {
  for (uint32_t o = 0; o < s->n; o++) {
    const st_sim_node_t* on = &s->nodes[o];
    if (!is_running(on))
      continue;
    uint32_t known = 0;
    size_t count = st_membership_count(on->m);
    for (size_t k = 0; k < count; k++) {
      const st_member_t* mb = st_membership_at(on->m, k);
      uint32_t x;
      if (st__sim_node_lookup(s, &mb->id, &x) != 0 || x == o)
        continue;
      if (!is_running(&s->nodes[x]))
        continue;
      known++;
      if (mb->state == ST_MEMBER_DEAD || mb->state == ST_MEMBER_LEFT) {
        r->dead_pairs_at_end++;
      } else if (mb->state == ST_MEMBER_SUSPECT) {
        r->suspect_pairs_at_end++;
      }
    }
    r->missing_pairs_at_end += (s->running - 1) - known;
  }
}

static uint64_t heap_in_use(void) {
  struct mallinfo2 mi = mallinfo2();
  return (uint64_t) mi.uordblks + (uint64_t) mi.hblkhd;
}

void st__sim_collect(st_sim_t* s, st_sim_result_t* r) {
  area(s);
  r->nodes = s->n;
  r->running_at_end = s->running;
  r->converged_s =
      s->converged_us == UINT64_MAX ? NAN : (double) s->converged_us / 1e6;
  r->reconverged_s =
      (s->disturbed_us == UINT64_MAX || s->reconverged_us == UINT64_MAX)
          ? NAN
          : (double) (s->reconverged_us - s->disturbed_us) / 1e6;
  r->suspicion_max_s = st__sim_suspicion_max_s(s, s->n);
  collect_trackers(s, r);
  census(s, r);

  r->suspicions = s->c.suspicions;
  r->false_suspicions = s->c.false_suspicions;
  r->false_suspect_views = s->c.false_suspect_views;
  r->false_deaths = s->c.false_deaths;
  r->false_deaths_per_hour =
      (double) s->c.false_deaths * 3600.0 / ((double) s->end_us / 1e6);
  r->left_seen_dead = s->c.left_seen_dead;
  r->restarts = s->c.restarts;
  r->pauses = s->c.pauses;
  r->join_retries = s->c.join_retries;

  if (s->c.window_open && s->c.member_us > 0) {
    double member_s = s->c.member_us / 1e6;
    r->window_s = (double) (s->now_us - s->c.window_start_us) / 1e6;
    r->packets_per_member_per_s =
        (double) (s->c.packets - s->c.w_packets) / member_s;
    r->bytes_per_member_per_s = (double) (s->c.bytes - s->c.w_bytes) / member_s;
    r->stream_bytes_per_member_per_s =
        (double) (s->c.stream_bytes - s->c.w_stream_bytes) / member_s;
  } else {
    r->window_s = 0;
    r->packets_per_member_per_s = NAN;
    r->bytes_per_member_per_s = NAN;
    r->stream_bytes_per_member_per_s = NAN;
  }
  r->packets_sent = s->c.packets;
  r->packets_lost = s->c.lost;
  r->packets_cut = s->c.cut;
  r->packets_duplicated = s->c.duplicated;
  r->streams = s->c.streams;
  r->rejected = s->c.rejected;
  r->timer_stalls = s->c.timer_stalls;
  r->events = s->events;
}

/* Called with every in-flight message already freed: what the heap holds
 * beyond the baseline is the machines' plus the simulator's own growth. */
double st__sim_machine_bytes(st_sim_t* s, uint64_t base_heap, size_t base_own) {
  uint64_t now = heap_in_use();
  uint64_t own = s->own_bytes - base_own + s->heap.cap * sizeof(st_sim_event_t);
  if (now < base_heap + own || s->running == 0)
    return NAN;
  return (double) (now - base_heap - own) / (double) s->running;
}

uint64_t st__sim_heap_in_use(void) {
  return heap_in_use();
}
