/* sim.c: `starling-sim`, the deterministic membership simulator: command
 * line, main, and the report (a table, or one JSON object with --json).
 *
 * The membership machines of gossip/ (SWIM with Lifeguard, sans-IO) run
 * N to a process on a virtual clock over a modelled network; see sim.h for
 * the parts and docs/membership.md for what is measured and the figures.
 * The report is a pure function of the flags: the same seed prints the
 * same bytes, except the two host measurements wall_seconds and
 * max_rss_bytes, printed last. */
#include "tools/sim/sim.h"

#include "tools/cli/cli.h"

#include <errno.h>
#include <stddef.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#define CMD "starling-sim"

static void usage(FILE* f) {
  fprintf(
      f,
      "usage: starling-sim [--nodes N] [--seed S] [--duration SECONDS]\n"
      "                    [--loss FRACTION] [--scenario NAME]\n"
      "                    [--no-lifeguard] [--json] [options]\n"
      "\n"
      "Runs N membership machines (SWIM + Lifeguard) in one process on a\n"
      "virtual clock over a modelled network and reports failure-detection\n"
      "times, false alarms and load. The same flags and seed print the same\n"
      "report, except wall_seconds and max_rss_bytes.\n"
      "\n"
      "  --nodes N              simulated nodes, 2..100000 (64)\n"
      "  --seed S               seed of every random choice (1)\n"
      "  --duration SECONDS     simulated time, warm-up included (120)\n"
      "  --loss FRACTION        UDP packets lost, 0..0.9 (0)\n"
      "  --scenario NAME        crash | join | leave | restart-all | pause |\n"
      "                         partition | steady | average (crash)\n"
      "  --no-lifeguard         turn off awareness, nacks and dynamic\n"
      "                         suspicion timeouts\n"
      "  --json                 print one JSON object instead of a table\n"
      "  --trace                print every membership change as it happens\n"
      "  --warm                 start converged: every node knows every other\n"
      "                         alive from t = 0 (not with join; N <= 6900) \n"
      "\n"
      "Network:\n"
      "  --latency-ms MS        fixed one-way latency (1)\n"
      "  --jitter-ms MS         mean exponential extra latency (1)\n"
      "  --dup FRACTION         UDP packets delivered twice, 0..1 (0)\n"
      "\n"
      "Scenarios:\n"
      "  --events K             crashes, leaves or timed joins (N/16 in 1..8;\n"
      "                         join: N/8 in 1..8)\n"
      "  --crash-at SECONDS     when the main phase starts (converged + 5 s)\n"
      "  --pause-fraction F     pause: share of nodes that stall (0.1)\n"
      "  --pause-seconds S      pause: longest stall (5)\n"
      "  --partition-seconds S  partition: how long the split lasts (30)\n"
      "  --partition-fraction F partition: share cut off (0.5)\n"
      "  --one-way              partition: only the cut-off side's packets\n"
      "                         are lost\n"
      "  --restart-window S     restart-all: every node restarts within S "
      "(10)\n"
      "  --join-wave S          join: seconds between waves of joiners (5)\n"
      "  --dim D                average: floats in each node's vector (8)\n"
      "  --exchanges K          average: exchanges to complete (enough for\n"
      "                         the squared distance to the mean to fall\n"
      "                         by 1e4 in theory)\n");
}

static int parse_scenario(const char* text, st_sim_scenario_t* out) {
  for (int k = 0; k < ST_SIM_SCENARIO_COUNT; k++) {
    if (strcmp(text, st__sim_scenario_name((st_sim_scenario_t) k)) == 0) {
      *out = (st_sim_scenario_t) k;
      return 0;
    }
  }
  fprintf(stderr,
          "starling-sim: --scenario: '%s' is not one of crash, join, leave, "
          "restart-all, pause, partition, steady, average\n",
          text);
  return -EINVAL;
}

/* The flags without a value: each sets one bool of the options. */
static const struct {
  const char* name;
  size_t off;
  bool value;
} switches[] = {
    {"--json", offsetof(st_sim_options_t, json), true},
    {"--trace", offsetof(st_sim_options_t, trace), true},
    {"--no-lifeguard", offsetof(st_sim_options_t, lifeguard), false},
    {"--warm", offsetof(st_sim_options_t, warm), true},
    {"--one-way", offsetof(st_sim_options_t, one_way), true},
};

/* The flags with a value, in the order of the usage: each parsed strictly
 * into one field of the options, within [min, max]. */
typedef enum { V_U32, V_U64, V_DOUBLE, V_SCENARIO } value_kind_t;
static const struct {
  const char* name;
  value_kind_t kind;
  size_t off;
  double min, max;     /* V_DOUBLE */
  uint64_t umin, umax; /* V_U32, V_U64 */
} valued[] = {
    {"--nodes", V_U32, offsetof(st_sim_options_t, nodes), 0, 0, 2, 100000},
    {"--seed", V_U64, offsetof(st_sim_options_t, seed), 0, 0, 0, UINT64_MAX},
    {"--duration", V_DOUBLE, offsetof(st_sim_options_t, duration_s), 0.001, 1e6,
     0, 0},
    {"--loss", V_DOUBLE, offsetof(st_sim_options_t, loss), 0, 0.9, 0, 0},
    {"--scenario", V_SCENARIO, offsetof(st_sim_options_t, scenario), 0, 0, 0,
     0},
    {"--latency-ms", V_DOUBLE, offsetof(st_sim_options_t, latency_ms), 0, 10000,
     0, 0},
    {"--jitter-ms", V_DOUBLE, offsetof(st_sim_options_t, jitter_ms), 0, 10000,
     0, 0},
    {"--dup", V_DOUBLE, offsetof(st_sim_options_t, dup), 0, 1, 0, 0},
    {"--events", V_U32, offsetof(st_sim_options_t, events), 0, 0, 1, 4096},
    {"--crash-at", V_DOUBLE, offsetof(st_sim_options_t, crash_at_s), 0, 1e6, 0,
     0},
    {"--pause-fraction", V_DOUBLE, offsetof(st_sim_options_t, pause_fraction),
     0.0001, 1, 0, 0},
    {"--pause-seconds", V_DOUBLE, offsetof(st_sim_options_t, pause_max_s), 0.01,
     3600, 0, 0},
    {"--partition-seconds", V_DOUBLE, offsetof(st_sim_options_t, partition_s),
     0.001, 1e6, 0, 0},
    {"--partition-fraction", V_DOUBLE,
     offsetof(st_sim_options_t, partition_frac), 0.0001, 0.9999, 0, 0},
    {"--restart-window", V_DOUBLE, offsetof(st_sim_options_t, restart_window_s),
     0.01, 3600, 0, 0},
    {"--join-wave", V_DOUBLE, offsetof(st_sim_options_t, join_wave_s), 0.01,
     3600, 0, 0},
    {"--dim", V_U32, offsetof(st_sim_options_t, dim), 0, 0, 1, 65536},
    {"--exchanges", V_U64, offsetof(st_sim_options_t, exchanges), 0, 0, 1,
     100000000},
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* Parses the value v of valued[k] into its field of o. 0 or -EINVAL. */
static int parse_value(size_t k, const char* v, st_sim_options_t* o) {
  char* field = (char*) o + valued[k].off;
  const char* a = valued[k].name;
  uint64_t u = 0;
  int rc = 0;
  switch (valued[k].kind) {
    case V_U32:
      rc = st__parse_u64(CMD, a, v, valued[k].umin, valued[k].umax, &u);
      if (rc == 0)
        *(uint32_t*) (void*) field = (uint32_t) u;
      break;
    case V_U64:
      rc = st__parse_u64(CMD, a, v, valued[k].umin, valued[k].umax,
                         (uint64_t*) (void*) field);
      break;
    case V_DOUBLE:
      rc = st__parse_double(CMD, a, v, valued[k].min, valued[k].max,
                            (double*) (void*) field);
      break;
    case V_SCENARIO:
      rc = parse_scenario(v, (st_sim_scenario_t*) (void*) field);
      break;
  }
  return rc != 0 ? -EINVAL : 0;
}

/* Flags that make sense alone but not together. 0 or -EINVAL. */
static int check_combination(const st_sim_options_t* o) {
  if (o->warm && o->scenario == ST_SIM_JOIN) {
    fprintf(stderr,
            "starling-sim: --warm starts the cluster converged; the join "
            "scenario grows its own (drop --warm)\n");
    return -EINVAL;
  }
  if (o->warm && o->nodes > ST_WIRE_PUSH_PULL_MAX_ENTRIES) {
    fprintf(stderr,
            "starling-sim: --warm needs --nodes <= %u (one push-pull reply "
            "holds the whole roster)\n",
            (unsigned) ST_WIRE_PUSH_PULL_MAX_ENTRIES);
    return -EINVAL;
  }
  return 0;
}

/* Parses argv into o. Returns 0, 1 for --help (printed), -EINVAL after
 * printing what was wrong. */
static int parse_args(int argc, char** argv, st_sim_options_t* o) {
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      return 1;
    }
    size_t k = 0;
    while (k < COUNT(switches) && strcmp(a, switches[k].name) != 0)
      k++;
    if (k < COUNT(switches)) {
      *(bool*) (void*) ((char*) o + switches[k].off) = switches[k].value;
      continue;
    }
    if (strncmp(a, "--", 2) != 0) {
      fprintf(stderr, "starling-sim: unexpected argument '%s' (see --help)\n",
              a);
      return -EINVAL;
    }
    for (k = 0; k < COUNT(valued) && strcmp(a, valued[k].name) != 0; k++)
      ;
    if (k == COUNT(valued)) {
      fprintf(stderr, "starling-sim: unknown option '%s' (see --help)\n", a);
      return -EINVAL;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "starling-sim: %s needs a value (see --help)\n", a);
      return -EINVAL;
    }
    if (parse_value(k, argv[++i], o) != 0)
      return -EINVAL;
  }
  return check_combination(o);
}

/* ==== Report ============================================================ */

typedef enum { F_STR, F_U64, F_DBL, F_BOOL } field_kind_t;

typedef struct {
  const char* name;
  field_kind_t kind;
  const char* s;
  uint64_t u;
  double d;
  const char* unit; /* for the table */
} field_t;

#define STR(n, v) \
  { n, F_STR, v, 0, 0, "" }
#define U64(n, v) \
  { n, F_U64, NULL, (uint64_t) (v), 0, "" }
#define DBL(n, v, unit) \
  { n, F_DBL, NULL, 0, (v), unit }
#define BOOL(n, v) \
  { n, F_BOOL, NULL, (v) ? 1u : 0u, 0, "" }

/* Prints f[0..n) as one JSON object (json) or as a table. */
static void print_fields(bool json, const field_t* f, size_t n) {
  if (json) {
    printf("{");
    for (size_t i = 0; i < n; i++) {
      printf("%s\"%s\": ", i ? ", " : "", f[i].name);
      switch (f[i].kind) {
        case F_STR:
          printf("\"%s\"", f[i].s);
          break;
        case F_U64:
          printf("%llu", (unsigned long long) f[i].u);
          break;
        case F_BOOL:
          printf("%s", f[i].u ? "true" : "false");
          break;
        case F_DBL:
          if (isfinite(f[i].d)) {
            printf("%.6g", f[i].d);
          } else {
            printf("null");
          }
          break;
      }
    }
    printf("}\n");
    return;
  }
  for (size_t i = 0; i < n; i++) {
    printf("%-30s ", f[i].name);
    switch (f[i].kind) {
      case F_STR:
        printf("%s\n", f[i].s);
        break;
      case F_U64:
        printf("%llu\n", (unsigned long long) f[i].u);
        break;
      case F_BOOL:
        printf("%s\n", f[i].u ? "on" : "off");
        break;
      case F_DBL:
        if (isfinite(f[i].d)) {
          printf("%.6g%s%s\n", f[i].d, f[i].unit[0] ? " " : "", f[i].unit);
        } else {
          printf("-\n");
        }
        break;
    }
  }
}

/* The average scenario's report: none of the membership figures. */
static void print_average(const st_sim_options_t* o, const st_sim_result_t* r) {
  const st_sim_avg_result_t* v = &r->avg;
  const field_t f[] = {
      STR("scenario", st__sim_scenario_name(o->scenario)),
      U64("nodes", r->nodes),
      U64("seed", o->seed),
      U64("dim", v->dim),
      DBL("latency_ms", o->latency_ms, "ms"),
      DBL("jitter_ms", o->jitter_ms, "ms"),
      U64("exchanges_target", v->exchanges_target),
      U64("exchanges_completed", v->exchanges_completed),
      U64("exchanges_busy", v->exchanges_busy),
      U64("exchanges_failed", v->exchanges_failed),
      U64("max_active_nodes", v->max_active_nodes),
      DBL("active_fraction", v->active_fraction, ""),
      DBL("msd_start", v->msd_start, ""),
      DBL("msd_end", v->msd_end, ""),
      DBL("rate", v->rate, "per exchange"),
      DBL("rate_theory", v->rate_theory, "per exchange"),
      DBL("rate_ratio", v->rate_ratio, ""),
      DBL("mean_drift_max", v->mean_drift_max, ""),
      DBL("sim_seconds", v->sim_seconds, "s"),
      U64("events", r->events),
      /* Host measurements last: excluded from determinism checks. */
      DBL("wall_seconds", r->wall_seconds, "s"),
      U64("max_rss_bytes", r->max_rss_bytes),
  };
  print_fields(o->json, f, sizeof(f) / sizeof(f[0]));
}

static void print_report(const st_sim_options_t* o, const st_sim_result_t* r) {
  if (o->scenario == ST_SIM_AVERAGE) {
    print_average(o, r);
    return;
  }
  const field_t f[] = {
      STR("scenario", st__sim_scenario_name(o->scenario)),
      U64("nodes", r->nodes),
      U64("seed", o->seed),
      DBL("duration_s", o->duration_s, "s"),
      DBL("loss", o->loss, ""),
      DBL("dup", o->dup, ""),
      DBL("latency_ms", o->latency_ms, "ms"),
      DBL("jitter_ms", o->jitter_ms, "ms"),
      BOOL("lifeguard", o->lifeguard),
      BOOL("warm", o->warm),
      DBL("converged_s", r->converged_s, "s"),
      DBL("reconverged_s", r->reconverged_s, "s"),
      U64("running_at_end", r->running_at_end),
      U64("dead_pairs_at_end", r->dead_pairs_at_end),
      U64("suspect_pairs_at_end", r->suspect_pairs_at_end),
      U64("missing_pairs_at_end", r->missing_pairs_at_end),
      U64("crashes", r->crashes),
      U64("crashes_suspected", r->crashes_suspected),
      U64("crashes_dead_everywhere", r->crashes_dead_everywhere),
      DBL("first_suspect_mean_s", r->first_suspect_mean_s, "s"),
      DBL("first_suspect_p99_s", r->first_suspect_p99_s, "s"),
      DBL("first_suspect_mean_probes", r->first_suspect_mean_probes,
          "probe intervals"),
      DBL("dead_everywhere_mean_s", r->dead_everywhere_mean_s, "s"),
      DBL("dead_everywhere_p99_s", r->dead_everywhere_p99_s, "s"),
      DBL("suspicion_max_s", r->suspicion_max_s, "s"),
      U64("leaves", r->leaves),
      U64("leaves_everywhere", r->leaves_everywhere),
      DBL("leave_everywhere_mean_s", r->leave_everywhere_mean_s, "s"),
      DBL("leave_everywhere_p99_s", r->leave_everywhere_p99_s, "s"),
      U64("left_seen_dead", r->left_seen_dead),
      U64("probe_joins", r->probe_joins),
      U64("probe_joins_converged", r->probe_joins_converged),
      DBL("join_converged_s", r->join_converged_s, "s"),
      DBL("join_converged_p99_s", r->join_converged_p99_s, "s"),
      DBL("join_rounds", r->join_rounds, "gossip intervals"),
      U64("suspicions", r->suspicions),
      U64("false_suspicions", r->false_suspicions),
      U64("false_suspect_views", r->false_suspect_views),
      U64("false_deaths", r->false_deaths),
      DBL("false_deaths_per_hour", r->false_deaths_per_hour, ""),
      U64("restarts", r->restarts),
      U64("pauses", r->pauses),
      U64("join_retries", r->join_retries),
      DBL("window_s", r->window_s, "s"),
      DBL("packets_per_member_per_s", r->packets_per_member_per_s, ""),
      DBL("bytes_per_member_per_s", r->bytes_per_member_per_s, "B"),
      DBL("stream_bytes_per_member_per_s", r->stream_bytes_per_member_per_s,
          "B"),
      U64("packets_sent", r->packets_sent),
      U64("packets_lost", r->packets_lost),
      U64("packets_cut", r->packets_cut),
      U64("packets_duplicated", r->packets_duplicated),
      U64("streams", r->streams),
      U64("rejected", r->rejected),
      U64("timer_stalls", r->timer_stalls),
      U64("events", r->events),
      DBL("memory_per_node_bytes", r->memory_per_node_bytes, "B"),
      /* Host measurements last: excluded from determinism checks. */
      DBL("wall_seconds", r->wall_seconds, "s"),
      U64("max_rss_bytes", r->max_rss_bytes),
  };
  print_fields(o->json, f, sizeof(f) / sizeof(f[0]));
}

int main(int argc, char** argv) {
  st_sim_options_t o;
  st__sim_options_default(&o);
  int rc = parse_args(argc, argv, &o);
  if (rc == 1)
    return 0;
  if (rc != 0)
    return 2;
  /* Thousands of machines grow and shrink their action queues and packet
   * buffers by megabytes at a time (a warm joiner queues one MEMBER action
   * per member). Served by mmap, or trimmed back to the system, each such
   * block is faulted in and zeroed again by the kernel on every reuse: a
   * third of a 10,000-node warm boot. Kept in the heap, it is reused. */
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, INT32_MAX);
  st_sim_result_t r;
  rc = st__sim_run(&o, &r);
  if (rc != 0) {
    fprintf(stderr, "starling-sim: the simulation failed: %s\n", strerror(-rc));
    return 1;
  }
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) == 0) {
    r.max_rss_bytes = (uint64_t) ru.ru_maxrss * 1024u;
  }
  fflush(stdout);
  print_report(&o, &r);
  return ferror(stdout) ? 1 : 0;
}
