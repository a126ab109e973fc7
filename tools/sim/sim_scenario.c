/* sim_scenario.c: the scenarios of `starling-sim` and its main loop.
 *
 * Every scenario but join first boots the cluster: node 0 starts alone at
 * t = 0 and the others start one after another over the first seconds
 * (5 ms apart, 5 s at most in all), each joining through up to three random
 * running nodes; with --warm every node instead starts at t = 0 knowing
 * every other alive (sim_node.c, Warm boot). A check every 250 ms of
 * simulated time looks for the moment every running node sees every
 * running node alive; that moment (or, failing it, 40% of the run) starts
 * the scenario's main phase five seconds later (or at --crash-at), and
 * with it the load window:
 *
 *   crash        k nodes crash, spaced so that each has time to be detected
 *   leave        k nodes leave gracefully, spaced the same way
 *   restart-all  every node crashes and comes back (boot epoch + 1) within
 *                --restart-window seconds, down 0.2 to 2 s each
 *   pause        a share of the nodes stall again and again: run 2 to 10 s,
 *                freeze for 0.5 s up to --pause-seconds
 *   partition    a share of the nodes is cut off for --partition-seconds
 *   steady       nothing: the load and false-alarm baseline
 *   average      no membership: the averaging exchange machines of
 *                gossip/exchange.c between random pairs (sim_average.c)
 *   join         no boot: node 0 alone, then waves of 1, 2, 4, ... joiners
 *                (--join-wave seconds apart, each wave over one second)
 *                through random running seeds; once all waves are in and
 *                the cluster has converged, k more nodes join one at a time
 *                and each is timed until every older node knows it.
 *
 * All choices come from the script's generator, in event order. */
#include "tools/sim/sim.h"

#include "tools/cli/cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define US 1000000.0
#define SIM_CHECK_US 250000u
#define SIM_BOOT_STEP_US 5000u
#define SIM_BOOT_MAX_US 5000000u
#define SIM_SCRIPT_DELAY_US 5000000u
#define SIM_START_TRACK 1u /* START arg: time this join (probe join) */

static const char* const scenario_names[ST_SIM_SCENARIO_COUNT] = {
    "crash", "join",      "leave",  "restart-all",
    "pause", "partition", "steady", "average"};

const char* st__sim_scenario_name(st_sim_scenario_t s) {
  return s < ST_SIM_SCENARIO_COUNT ? scenario_names[s] : "?";
}

void st__sim_options_default(st_sim_options_t* o) {
  memset(o, 0, sizeof(*o));
  o->nodes = 64;
  o->seed = 1;
  o->duration_s = 120;
  o->scenario = ST_SIM_CRASH;
  o->lifeguard = true;
  o->latency_ms = 1.0;
  o->jitter_ms = 1.0;
  o->pause_fraction = 0.1;
  o->pause_max_s = 5.0;
  o->partition_s = 30.0;
  o->partition_frac = 0.5;
  o->restart_window_s = 10.0;
  o->join_wave_s = 5.0;
  o->dim = 8;
}

static uint64_t uniform_us(st_sim_t* s, double lo_s, double hi_s) {
  double u = st_rng_uniform(&s->script_rng);
  return (uint64_t) ((lo_s + (hi_s - lo_s) * u) * US);
}

/* Distinct random nodes that are up, at most k. */
static uint32_t pick_victims(st_sim_t* s, uint32_t* out, uint32_t k) {
  uint32_t got = 0;
  for (uint32_t tries = 0; got < k && tries < 64 * k + 64; tries++) {
    uint32_t j = (uint32_t) st_rng_below(&s->script_rng, s->n);
    if (s->nodes[j].life != ST_SIM_UP)
      continue;
    bool dup = false;
    for (uint32_t q = 0; q < got; q++)
      dup |= out[q] == j;
    if (!dup)
      out[got++] = j;
  }
  return got;
}

static uint32_t default_events(const st_sim_t* s, uint32_t lo, uint32_t hi,
                               uint32_t div) {
  if (s->opt.events > 0)
    return s->opt.events;
  uint32_t k = s->n / div;
  return k < lo ? lo : (k > hi ? hi : k);
}

/* ==== Setup ============================================================= */

static void boot(st_sim_t* s) {
  if (s->warm_reply != NULL) {
    /* Warm: every node starts at t = 0 knowing everyone (sim_node.c). */
    for (uint32_t i = 0; i < s->n; i++)
      st__sim_schedule(s, 0, ST_SIM_EV_START, i, 0);
    s->settle_from_us = 1;
    return;
  }
  uint64_t step = SIM_BOOT_STEP_US;
  if ((uint64_t) s->n * step > SIM_BOOT_MAX_US)
    step = SIM_BOOT_MAX_US / s->n;
  for (uint32_t i = 0; i < s->n; i++) {
    st__sim_schedule(s, (uint64_t) i * step, ST_SIM_EV_START, i, 0);
  }
  /* Convergence counts once everyone has started. */
  s->settle_from_us = (uint64_t) (s->n - 1) * step + 1;
}

static uint32_t probe_joins(const st_sim_t* s) {
  uint32_t k = default_events(s, 1, 8, 8);
  return k >= s->n ? s->n - 1 : k;
}

/* Join: waves of 1, 2, 4, ... until all but the probe joiners are in. */
static void join_waves(st_sim_t* s) {
  uint32_t last = s->n - probe_joins(s);
  st__sim_schedule(s, 0, ST_SIM_EV_START, 0, 0);
  uint32_t next = 1, size = 1;
  uint64_t t = 0;
  while (next < last) {
    t += (uint64_t) (s->opt.join_wave_s * US);
    uint32_t in_wave = size < last - next ? size : last - next;
    for (uint32_t j = 0; j < in_wave; j++) {
      uint64_t at = t + (uint64_t) j * 1000000u / in_wave;
      st__sim_schedule(s, at, ST_SIM_EV_START, next++, 0);
    }
    size *= 2;
  }
  s->settle_from_us = t + 1000000u;
}

/* ==== The main phase ==================================================== */

/* crash, leave: k victims, one every gap, the last leaving `tail` for
 * detection to finish everywhere. */
static void script_departures(st_sim_t* s, uint64_t t0, uint64_t left,
                              uint64_t tail) {
  uint32_t v[4096];
  uint32_t k = default_events(s, 1, 8, 16);
  if (k > s->n - 1)
    k = s->n - 1;
  if (k > 4096)
    k = 4096;
  k = pick_victims(s, v, k);
  uint64_t gap = left > tail ? (left - tail) / (k ? k : 1) : 0;
  if (gap < 500000u)
    gap = 500000u;
  if (gap > 20000000u)
    gap = 20000000u;
  uint32_t kind =
      s->opt.scenario == ST_SIM_CRASH ? ST_SIM_EV_CRASH : ST_SIM_EV_LEAVE;
  for (uint32_t j = 0; j < k; j++) {
    st__sim_schedule(s, t0 + j * gap, kind, v[j], 0);
  }
  s->disturbed_us = t0 + (k ? k - 1 : 0) * gap;
}

/* restart-all: every node up goes down and comes back within the window. */
static void script_restart_all(st_sim_t* s, uint64_t t0) {
  double w = s->opt.restart_window_s;
  uint64_t last = 0;
  for (uint32_t i = 0; i < s->n; i++) {
    if (s->nodes[i].life != ST_SIM_UP)
      continue;
    uint64_t down = t0 + uniform_us(s, 0, w > 2 ? w - 2 : 0);
    uint64_t up = down + uniform_us(s, 0.2, w > 2 ? 2.0 : w / 2);
    st__sim_schedule(s, down, ST_SIM_EV_CRASH, i, 0);
    st__sim_schedule(s, up, ST_SIM_EV_RESTART, i, 0);
    if (up > last)
      last = up;
  }
  s->disturbed_us = last;
}

/* pause: a share of the nodes turn flaky, each first stalling within 10 s. */
static void script_pause(st_sim_t* s, uint64_t t0) {
  uint32_t v[4096];
  uint32_t k = (uint32_t) ceil(s->opt.pause_fraction * s->n);
  if (k > 4096)
    k = 4096;
  k = pick_victims(s, v, k);
  for (uint32_t j = 0; j < k; j++) {
    s->nodes[v[j]].flaky = true;
    st__sim_schedule(s, t0 + uniform_us(s, 0, 10), ST_SIM_EV_PAUSE, v[j], 0);
  }
}

/* join: the probe joiners start one every gap (at most 15 s). */
static void script_join(st_sim_t* s, uint64_t t0, uint64_t left) {
  uint32_t k = probe_joins(s);
  uint64_t gap = left / (k ? k : 1);
  if (gap > 15000000u)
    gap = 15000000u;
  for (uint32_t j = 0; j < k; j++) {
    st__sim_schedule(s, t0 + j * gap, ST_SIM_EV_START, s->n - k + j,
                     SIM_START_TRACK);
  }
  s->disturbed_us = t0 + (k ? k - 1 : 0) * gap;
}

static void start_script(st_sim_t* s) {
  s->script_started = true;
  uint64_t t0 = s->now_us + SIM_SCRIPT_DELAY_US;
  if (s->opt.crash_at_s > 0) {
    uint64_t at = (uint64_t) (s->opt.crash_at_s * US);
    t0 = at > s->now_us ? at : s->now_us;
  }
  /* The load window opens with the main phase, so that the boot's own
   * dissemination (every join retransmitted O(log N) times) is over. */
  st__sim_schedule(s, t0, ST_SIM_EV_WINDOW, 0, 0);
  if (t0 >= s->end_us)
    return;
  uint64_t left = s->end_us - t0;
  /* Leave room after the last event for detection to finish everywhere. */
  uint64_t tail = (uint64_t) ((st__sim_suspicion_max_s(s, s->n) + 10.0) * US);
  switch (s->opt.scenario) {
    case ST_SIM_CRASH:
    case ST_SIM_LEAVE:
      script_departures(s, t0, left, tail);
      break;
    case ST_SIM_RESTART_ALL:
      script_restart_all(s, t0);
      break;
    case ST_SIM_PAUSE:
      script_pause(s, t0);
      break;
    case ST_SIM_PARTITION: {
      st__sim_schedule(s, t0, ST_SIM_EV_SPLIT, 0, 0);
      uint64_t heal = t0 + (uint64_t) (s->opt.partition_s * US);
      st__sim_schedule(s, heal, ST_SIM_EV_HEAL, 0, 0);
      s->disturbed_us = heal;
      break;
    }
    case ST_SIM_JOIN:
      script_join(s, t0, left);
      break;
    case ST_SIM_STEADY:
    case ST_SIM_AVERAGE: /* runs in sim_average.c, never here */
    case ST_SIM_SCENARIO_COUNT:
      break;
  }
}

static void split(st_sim_t* s) {
  uint32_t k = (uint32_t) ceil(s->opt.partition_frac * s->n);
  if (k >= s->n)
    k = s->n - 1;
  /* A random minority: a partial Fisher-Yates shuffle of the indices. */
  uint32_t* idx = malloc((size_t) s->n * sizeof(uint32_t));
  if (idx == NULL)
    return;
  for (uint32_t i = 0; i < s->n; i++)
    idx[i] = i;
  for (uint32_t i = 0; i < k; i++) {
    uint32_t j = i + (uint32_t) st_rng_below(&s->script_rng, s->n - i);
    uint32_t t = idx[i];
    idx[i] = idx[j];
    idx[j] = t;
    s->nodes[idx[i]].group = 1;
  }
  free(idx);
  s->split = true;
}

static void check(st_sim_t* s) {
  bool need = s->converged_us == UINT64_MAX ||
              (s->disturbed_us != UINT64_MAX &&
               s->reconverged_us == UINT64_MAX && s->now_us > s->disturbed_us);
  if (need && s->now_us >= s->settle_from_us && st__sim_check_converged(s)) {
    if (s->converged_us == UINT64_MAX)
      s->converged_us = s->now_us;
    if (s->disturbed_us != UINT64_MAX && s->now_us > s->disturbed_us) {
      s->reconverged_us = s->now_us;
    }
  }
  if (!s->script_started &&
      (s->converged_us != UINT64_MAX || s->now_us >= s->script_cap_us)) {
    start_script(s);
  }
  st__sim_schedule(s, s->now_us + s->check_every_us, ST_SIM_EV_CHECK, 0, 0);
}

/* ==== The loop ========================================================== */

static const char* const script_names[] = {
    [ST_SIM_EV_START] = "start",     [ST_SIM_EV_CRASH] = "crash",
    [ST_SIM_EV_RESTART] = "restart", [ST_SIM_EV_LEAVE] = "leave",
    [ST_SIM_EV_STOP] = "stop",       [ST_SIM_EV_PAUSE] = "pause",
    [ST_SIM_EV_RESUME] = "resume",   [ST_SIM_EV_SPLIT] = "split",
    [ST_SIM_EV_HEAL] = "heal"};

static void dispatch(st_sim_t* s, const st_sim_event_t* e) {
  uint32_t i = e->node;
  if (s->opt.trace && e->kind < sizeof(script_names) / sizeof(*script_names) &&
      script_names[e->kind] != NULL) {
    fprintf(stderr, "%10.3f  script: %s node %u\n", (double) s->now_us / 1e6,
            script_names[e->kind], i);
  }
  switch ((st_sim_event_kind_t) e->kind) {
    case ST_SIM_EV_TICK:
      st__sim_node_tick(s, i, e->u.arg, e->at_us);
      break;
    case ST_SIM_EV_PACKET:
    case ST_SIM_EV_STREAM:
      st__sim_node_deliver(s, e->u.msg);
      break;
    case ST_SIM_EV_START: {
      uint32_t seeds[3];
      size_t k = 0;
      if (i != 0 || s->nodes[i].epoch > 0)
        st__sim_pick_seeds(s, i, seeds, &k);
      st__sim_node_start(s, i, seeds, k);
      if (e->u.arg & SIM_START_TRACK)
        st__sim_track(s, ST_SIM_TRACK_JOIN, i);
      break;
    }
    case ST_SIM_EV_CRASH:
      st__sim_node_crash(s, i);
      if (s->opt.scenario == ST_SIM_CRASH) {
        st__sim_track(s, ST_SIM_TRACK_CRASH, i);
      }
      break;
    case ST_SIM_EV_RESTART:
      st__sim_node_restart(s, i);
      break;
    case ST_SIM_EV_LEAVE:
      st__sim_node_leave(s, i);
      if (s->nodes[i].life == ST_SIM_LEAVING) {
        st__sim_track(s, ST_SIM_TRACK_LEAVE, i);
      }
      break;
    case ST_SIM_EV_STOP:
      st__sim_node_stop(s, i);
      break;
    case ST_SIM_EV_PAUSE: {
      double hi = s->opt.pause_max_s > 0.5 ? s->opt.pause_max_s : 0.5;
      st__sim_node_pause(s, i, uniform_us(s, hi > 0.5 ? 0.5 : hi / 2, hi));
      break;
    }
    case ST_SIM_EV_RESUME:
      st__sim_node_resume(s, i, e->u.arg);
      if (s->nodes[i].flaky) {
        st__sim_schedule(s, s->now_us + uniform_us(s, 2, 10), ST_SIM_EV_PAUSE,
                         i, 0);
      }
      break;
    case ST_SIM_EV_SPLIT:
      split(s);
      break;
    case ST_SIM_EV_HEAL:
      s->split = false;
      break;
    case ST_SIM_EV_CHECK:
      check(s);
      break;
    case ST_SIM_EV_REJOIN:
      st__sim_node_rejoin_check(s, i, e->u.arg);
      break;
    case ST_SIM_EV_WINDOW:
      st__sim_window_open(s);
      break;
  }
}

static void free_event(st_sim_t* s, st_sim_event_t* e) {
  if (e->kind == ST_SIM_EV_PACKET || e->kind == ST_SIM_EV_STREAM) {
    st__sim_msg_free(s, e->u.msg);
  }
}

int st__sim_run(const st_sim_options_t* opt, st_sim_result_t* res) {
  st_sim_t* s = calloc(1, sizeof(*s));
  if (s == NULL)
    return -ENOMEM;
  int rc = 0;
  double wall0 = 0;
  s->opt = *opt;
  st_membership_config_default(&s->cfg);
  s->cfg.lifeguard = opt->lifeguard;
  s->n = opt->nodes;
  s->end_us = (uint64_t) (opt->duration_s * US);
  s->grace_us = 2u * 1000u * s->cfg.probe_interval_ms;
  s->check_every_us = SIM_CHECK_US;
  s->script_cap_us = (uint64_t) (0.4 * opt->duration_s * US);
  s->converged_us = s->disturbed_us = s->reconverged_us = UINT64_MAX;
  st_rng_seed(&s->net_rng, opt->seed ^ 0x6E6574776F726Bull);
  st_rng_seed(&s->script_rng, opt->seed ^ 0x736372697074ull);
  memset(res, 0, sizeof(*res));
  if (opt->scenario == ST_SIM_AVERAGE) {
    wall0 = st_now_s();
    rc = st__sim_average_run(s, res);
    res->wall_seconds = st_now_s() - wall0;
    goto out;
  }
  rc = st__sim_nodes_init(s);
  if (rc == 0 && opt->warm)
    rc = st__sim_warm_reply(s);
  if (rc != 0)
    goto out;

  uint64_t base_heap = st__sim_heap_in_use();
  size_t base_own = s->own_bytes;
  if (opt->scenario == ST_SIM_JOIN) {
    join_waves(s);
    s->script_cap_us = s->settle_from_us +
                       (s->end_us > s->settle_from_us
                            ? (uint64_t) (0.4 * (s->end_us - s->settle_from_us))
                            : 0);
  } else {
    boot(s);
  }
  st__sim_schedule(s, 0, ST_SIM_EV_CHECK, 0, 0);

  wall0 = st_now_s();
  st_sim_event_t e;
  while (st__sim_heap_pop(&s->heap, &e)) {
    if (e.at_us > s->end_us) {
      free_event(s, &e);
      break;
    }
    s->now_us = e.at_us;
    s->events++;
    dispatch(s, &e);
  }
  s->now_us = s->end_us;
  st__sim_collect(s, res);
  res->wall_seconds = st_now_s() - wall0;

  /* Free what is still in flight, then weigh the machines. */
  while (st__sim_heap_pop(&s->heap, &e))
    free_event(s, &e);
  st__sim_packet_pool_free(s);
  res->memory_per_node_bytes = st__sim_machine_bytes(s, base_heap, base_own);
out:
  st__sim_nodes_free(s);
  st__sim_packet_pool_free(s);
  st__sim_free(s, s->warm_reply, s->warm_reply_len);
  for (uint32_t k = 0; k < s->n_trackers; k++) {
    st__sim_free(s, s->trackers[k].bits, (s->n + 7) / 8);
  }
  free(s->trackers);
  st__sim_heap_free(&s->heap);
  free(s);
  return rc;
}
