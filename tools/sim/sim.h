/* sim.h: the deterministic membership simulator behind `starling-sim`.
 * Internal to tools/ (sim.c and sim_*.c).
 *
 * N membership machines (gossip/gossip.h, st_membership_*) run in one
 * process on a virtual clock. One discrete-event queue, a binary heap keyed
 * by (time, sequence number), orders everything that happens: timer ticks,
 * packet and stream deliveries, scripted crashes, restarts, leaves, joins,
 * pauses and partitions. Ties in time are broken by the order in which the
 * events were scheduled, so a run is a pure function of its options and its
 * seed: every node's generator is seeded from (seed, node index, boot
 * epoch), the network has its own generator and the script another.
 *
 * Files:
 *   sim.c          command line, main, the table and the JSON object
 *   sim_heap.c     the event queue
 *   sim_net.c      the modelled network: latency, loss, duplication,
 *                  partitions and one-way loss; streams for push-pull
 *   sim_node.c     a node's life (start, crash, restart, leave, pause) and
 *                  the driver loop that feeds a machine and drains actions
 *   sim_metrics.c  ground truth versus what the machines believe: detection
 *                  times, false suspicions and deaths, load, memory
 *   sim_scenario.c the scenarios and the main loop
 *   sim_average.c  the average scenario: the averaging exchange machines
 *                  (st_xchg_*) between random pairs, no membership
 *
 * Time is kept in microseconds so that jitter of a fraction of a
 * millisecond reorders packets; the machines see now_us / 1000. */
#ifndef STARLING_SIM_H
#define STARLING_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gossip/gossip.h"

/* ==== Options ============================================================ */

typedef enum {
  ST_SIM_CRASH = 0,
  ST_SIM_JOIN,
  ST_SIM_LEAVE,
  ST_SIM_RESTART_ALL,
  ST_SIM_PAUSE,
  ST_SIM_PARTITION,
  ST_SIM_STEADY,
  ST_SIM_AVERAGE, /* sim_average.c: the averaging exchange, no membership */
  ST_SIM_SCENARIO_COUNT
} st_sim_scenario_t;

const char* st__sim_scenario_name(st_sim_scenario_t s);

typedef struct {
  uint32_t nodes;
  uint64_t seed;
  double duration_s; /* simulated seconds, warm-up included */
  st_sim_scenario_t scenario;
  bool lifeguard;
  bool json;
  bool trace; /* print every membership change (deterministic) */
  bool warm;  /* start converged (sim_node.c, Warm boot) */

  /* Network. */
  double loss;       /* fraction of UDP packets dropped, each independently */
  double dup;        /* fraction of UDP packets delivered twice */
  double latency_ms; /* fixed part of the one-way latency */
  double jitter_ms;  /* mean of the exponential part (reordering) */

  /* Scenario knobs; 0 means the scenario's default. */
  uint32_t events;         /* crashes, leaves or probe joins */
  double crash_at_s;       /* first crash/leave/partition; 0 = converged+5 */
  double pause_fraction;   /* pause: share of nodes that stall (0.1) */
  double pause_max_s;      /* pause: longest stall (5) */
  double partition_s;      /* partition: how long the split lasts (30) */
  double partition_frac;   /* partition: share in the minority group (0.5) */
  bool one_way;            /* partition: only minority -> majority is cut */
  double restart_window_s; /* restart-all: all restarts within (10) */
  double join_wave_s;      /* join: seconds between waves (5) */
  uint32_t dim;            /* average: floats per node's vector (8) */
  uint64_t exchanges;      /* average: exchanges to complete; 0 = enough
                              for the squared distance to fall by 1e4 */
} st_sim_options_t;

void st__sim_options_default(st_sim_options_t* o);

/* ==== Results ============================================================ */

/* What the average scenario reports (sim_average.c). msd is the mean over
 * nodes of the squared distance to the global average, summed over the
 * coordinates. The rates are per completed exchange: rate is
 * -ln(msd_end / msd_start) / exchanges_completed, rate_theory is
 * -ln(1 - 1/(n - 1)), the expected contraction of one average between
 * two uniformly random nodes. */
typedef struct {
  uint32_t dim;
  uint64_t exchanges_target;
  uint64_t exchanges_completed; /* initiator's DONE ok */
  uint64_t exchanges_busy;      /* initiator's DONE busy: tried again later */
  uint64_t exchanges_failed;    /* any other result, at either end */
  uint32_t max_active_nodes;    /* most nodes in an exchange at once */
  double active_fraction;       /* mean share of nodes in an exchange */
  double msd_start;
  double msd_end;
  double rate;
  double rate_theory;
  double rate_ratio;
  double mean_drift_max; /* max over coordinates of |mean_end - mean_start| */
  double sim_seconds;    /* virtual time until the last exchange ended */
} st_sim_avg_result_t;

/* Everything a run reports. The doubles are NaN where the scenario does not
 * measure them or nothing was observed; they print as null in JSON. */
typedef struct {
  /* Cluster. */
  uint32_t nodes;
  double converged_s;   /* start -> every running node sees all alive */
  double reconverged_s; /* last disturbance -> all alive again */
  uint32_t running_at_end;
  uint64_t dead_pairs_at_end;    /* (observer, running member) held dead */
  uint64_t suspect_pairs_at_end; /* ... held suspect */
  uint64_t missing_pairs_at_end; /* ... not known at all */

  /* Failure detection (crash). */
  uint32_t crashes;
  uint32_t crashes_suspected;
  uint32_t crashes_dead_everywhere;
  double first_suspect_mean_s;
  double first_suspect_p99_s;
  double first_suspect_mean_probes; /* in probe intervals */
  double dead_everywhere_mean_s;
  double dead_everywhere_p99_s;
  double suspicion_max_s; /* the derived suspicion-timeout ceiling */

  /* Leave. */
  uint32_t leaves;
  uint32_t leaves_everywhere;
  double leave_everywhere_mean_s;
  double leave_everywhere_p99_s;
  uint64_t left_seen_dead; /* views that took a leave for a failure */

  /* Join. */
  uint32_t probe_joins;
  uint32_t probe_joins_converged;
  double join_converged_s; /* mean over probe joins */
  double join_converged_p99_s;
  double join_rounds; /* join_converged_s in gossip intervals */

  /* Mistakes. */
  uint64_t suspicions; /* originated, any target */
  uint64_t false_suspicions;
  uint64_t false_suspect_views;
  uint64_t false_deaths;
  double false_deaths_per_hour;
  uint32_t restarts;
  uint32_t pauses;
  uint32_t join_retries;

  /* Load, over the measurement window (after convergence). */
  double window_s;
  double packets_per_member_per_s;
  double bytes_per_member_per_s; /* sealed size: plaintext + overhead */
  double stream_bytes_per_member_per_s;
  uint64_t packets_sent;
  uint64_t packets_lost;
  uint64_t packets_cut; /* dropped by a partition or a dead receiver */
  uint64_t packets_duplicated;
  uint64_t streams;
  uint64_t rejected;     /* packets a machine refused (should be 0) */
  uint64_t timer_stalls; /* ticks that left no deadline (should be 0) */
  uint64_t events;       /* processed by the queue */

  /* Memory: heap bytes held by machines (allocator's count) per node. */
  double memory_per_node_bytes;

  /* The average scenario (its report prints only these, sim.c). */
  st_sim_avg_result_t avg;

  /* Host-dependent: excluded from determinism checks. */
  double wall_seconds;
  uint64_t max_rss_bytes;
} st_sim_result_t;

/* Runs one simulation. Returns 0, or a negative errno when the machine
 * could not be created (its error is printed to stderr). */
int st__sim_run(const st_sim_options_t* opt, st_sim_result_t* res);

/* ==== Internals shared by the sim_*.c files ============================= */

typedef enum {
  ST_SIM_EV_TICK = 0, /* node's machine timer; arg = life generation */
  ST_SIM_EV_PACKET,   /* msg: a UDP packet arrives */
  ST_SIM_EV_STREAM,   /* msg: a push-pull stream's bytes arrive */
  ST_SIM_EV_START,    /* node starts and joins through seeds */
  ST_SIM_EV_CRASH,    /* node stops dead, silently */
  ST_SIM_EV_RESTART,  /* node comes back with boot_epoch + 1 */
  ST_SIM_EV_LEAVE,    /* node leaves gracefully */
  ST_SIM_EV_STOP,     /* a leaving node's process exits */
  ST_SIM_EV_PAUSE,    /* node freezes; arg = pause length in us */
  ST_SIM_EV_RESUME,   /* node thaws; arg = life generation */
  ST_SIM_EV_SPLIT,    /* the network splits into two groups */
  ST_SIM_EV_HEAL,     /* the split ends */
  ST_SIM_EV_CHECK,    /* periodic convergence check and script step */
  ST_SIM_EV_REJOIN,   /* a (re)started node checks it found the cluster */
  ST_SIM_EV_WINDOW    /* the load window opens */
} st_sim_event_kind_t;

typedef struct st_sim_msg_s {
  struct st_sim_msg_s* next; /* backlog of a paused node */
  uint32_t from;
  uint32_t to;
  uint32_t len;
  uint8_t kind; /* ST_SIM_EV_PACKET or ST_SIM_EV_STREAM */
  uint8_t data[];
} st_sim_msg_t;

typedef struct {
  uint64_t at_us;
  uint64_t seq;
  uint32_t kind;
  uint32_t node;
  union {
    st_sim_msg_t* msg;
    uint64_t arg;
  } u;
} st_sim_event_t;

typedef struct {
  st_sim_event_t* ev;
  size_t n;
  size_t cap;
  uint64_t seq;
} st_sim_heap_t;

int st__sim_heap_push(st_sim_heap_t* h, const st_sim_event_t* e);
bool st__sim_heap_pop(st_sim_heap_t* h, st_sim_event_t* out);
void st__sim_heap_free(st_sim_heap_t* h);

typedef enum {
  ST_SIM_UNSTARTED = 0,
  ST_SIM_UP,      /* running (possibly paused) */
  ST_SIM_LEAVING, /* called leave, still sending its farewell */
  ST_SIM_CRASHED, /* silent; may restart */
  ST_SIM_LEFT     /* gone after a graceful leave */
} st_sim_life_t;

typedef struct {
  st_membership_t* m;
  st_rng_t rng; /* the machine's generator, borrowed by m */
  st_node_id_t id;
  st_wire_addr_t addr;
  uint8_t public_key[ST_PUBLIC_KEY_BYTES];
  uint32_t epoch;    /* boot epoch of the current life */
  uint32_t life_gen; /* bumps on every restart; stale ticks carry old ones */
  uint8_t life;      /* st_sim_life_t */
  bool paused;
  bool tick_due; /* a timer fell due while paused */
  uint8_t group; /* partition group */
  bool flaky;    /* pause scenario: this node stalls now and then */
  uint32_t join_order;
  int32_t tracker;          /* index of the tracker watching this node, or -1 */
  uint64_t timer_at_us;     /* earliest scheduled tick, UINT64_MAX none */
  uint64_t healthy_from_us; /* see sim_metrics.c: the grace after a stall */
  uint64_t dead_declared_inc; /* highest incarnation anyone declared dead */
  uint64_t suspect_inc; /* incarnation of the newest originated suspicion */
  bool suspect_known;
  bool suspect_false; /* ... and whether its target was healthy then */
  bool dead_declared;
  uint64_t started_us;
  st_sim_msg_t* backlog_head; /* packets that reached it while paused */
  st_sim_msg_t* backlog_tail;
} st_sim_node_t;

/* Watches what every other node believes about one subject: a crashed node
 * (until all hold it dead), a leaver (until all hold it left) or a joiner
 * (until all that were there before it know it). */
typedef enum {
  ST_SIM_TRACK_CRASH = 0,
  ST_SIM_TRACK_LEAVE,
  ST_SIM_TRACK_JOIN
} st_sim_track_kind_t;

typedef struct {
  uint8_t kind;
  uint32_t subject;
  uint32_t epoch;
  uint32_t join_order; /* JOIN: observers older than this count */
  uint64_t start_us;
  uint64_t first_suspect_us; /* UINT64_MAX until seen */
  uint64_t done_us;          /* UINT64_MAX until everyone agrees */
  uint32_t have;
  uint32_t need;
  uint8_t* bits; /* one per observer: holds the belief */
} st_sim_tracker_t;

typedef struct {
  uint64_t packets;
  uint64_t bytes;
  uint64_t streams;
  uint64_t stream_bytes;
  uint64_t lost;
  uint64_t cut;
  uint64_t duplicated;
  uint64_t rejected;
  uint64_t suspicions;
  uint64_t false_suspicions;
  uint64_t false_suspect_views;
  uint64_t false_deaths;
  uint64_t left_seen_dead;
  uint32_t restarts;
  uint32_t pauses;
  uint32_t join_retries;
  uint64_t timer_stalls;
  /* The load window: counters are snapshotted when it opens. */
  bool window_open;
  uint64_t window_start_us;
  uint64_t w_packets, w_bytes, w_stream_bytes;
  double member_us; /* integral of running nodes over the window */
  uint64_t area_last_us;
} st_sim_counters_t;

typedef struct st_sim_s {
  st_sim_options_t opt;
  st_membership_config_t cfg;
  uint64_t now_us;
  uint64_t end_us;
  uint64_t grace_us; /* how long after a stall a node counts as healthy */
  st_sim_heap_t heap;
  st_rng_t net_rng;
  st_rng_t script_rng;

  st_sim_node_t* nodes;
  uint32_t n;
  uint32_t running; /* UP or LEAVING */
  uint32_t next_join_order;
  uint32_t* id_index; /* open-addressing table: id -> node index + 1 */
  uint32_t id_index_cap;

  bool split;
  bool in_tick;          /* MEMBER actions now come from a timer: originated */
  bool all_alive;        /* the last check found every view complete */
  uint64_t converged_us; /* first all-alive, UINT64_MAX until then */
  uint64_t disturbed_us; /* last scripted disturbance (heal, restart) */
  uint64_t reconverged_us; /* first all-alive after disturbed_us */
  bool script_started;     /* the scenario's main phase was scheduled */
  uint64_t settle_from_us; /* convergence counts from here (join: waves) */
  uint64_t script_cap_us;  /* start the main phase by then, converged or not */
  uint64_t check_every_us;

  st_sim_tracker_t* trackers;
  uint32_t n_trackers;
  uint32_t cap_trackers;

  st_sim_counters_t c;
  uint64_t events;
  size_t own_bytes; /* heap the simulator itself holds (not machines) */
  /* Blocks of delivered packets, kept for the next ones (sim_net.c): a
   * malloc and a free per packet, of a size above glibc's thread cache,
   * cost 2% of a 10,000-node run in the allocator's bin searches. Linked
   * through next; freed before the memory is weighed. */
  st_sim_msg_t* packet_pool;

  /* --warm: the full roster as one encoded PUSH_PULL reply, and whether
   * the driver now drops the PUSH_PULLs a warm joiner sends its seed. */
  uint8_t* warm_reply;
  size_t warm_reply_len;  /* allocated */
  size_t warm_reply_used; /* the message */
  bool swallow_push_pull;
} st_sim_t;

/* sim_net.c */
uint64_t st__sim_latency_us(st_sim_t* s);
void st__sim_send_packet(st_sim_t* s, uint32_t from, uint32_t to,
                         const uint8_t* data, size_t len);
void st__sim_send_stream(st_sim_t* s, uint32_t from, uint32_t to,
                         const uint8_t* data, size_t len);
bool st__sim_reachable(const st_sim_t* s, uint32_t from, uint32_t to);
int st__sim_addr_index(const st_sim_t* s, const st_wire_addr_t* a,
                       uint32_t* idx);
void st__sim_make_addr(uint32_t idx, st_wire_addr_t* a);
st_sim_msg_t* st__sim_msg_new(st_sim_t* s, uint8_t kind, uint32_t from,
                              uint32_t to, const uint8_t* data, size_t len);
void st__sim_msg_free(st_sim_t* s, st_sim_msg_t* m);
/* Frees the packet blocks kept for reuse. */
void st__sim_packet_pool_free(st_sim_t* s);

/* sim_node.c */
int st__sim_nodes_init(st_sim_t* s);
void st__sim_nodes_free(st_sim_t* s);
int st__sim_node_lookup(const st_sim_t* s, const st_node_id_t* id,
                        uint32_t* idx);
int st__sim_node_start(st_sim_t* s, uint32_t i, const uint32_t* seeds,
                       size_t n_seeds);
int st__sim_warm_reply(st_sim_t* s);
void st__sim_node_crash(st_sim_t* s, uint32_t i);
int st__sim_node_restart(st_sim_t* s, uint32_t i);
void st__sim_node_leave(st_sim_t* s, uint32_t i);
void st__sim_node_stop(st_sim_t* s, uint32_t i);
void st__sim_node_pause(st_sim_t* s, uint32_t i, uint64_t len_us);
void st__sim_node_resume(st_sim_t* s, uint32_t i, uint64_t gen);
void st__sim_node_rejoin_check(st_sim_t* s, uint32_t i, uint64_t gen);
void st__sim_node_tick(st_sim_t* s, uint32_t i, uint64_t gen, uint64_t at_us);
void st__sim_node_deliver(st_sim_t* s, st_sim_msg_t* m);
void st__sim_pick_seeds(st_sim_t* s, uint32_t self, uint32_t* seeds,
                        size_t* n_seeds);
int st__sim_schedule(st_sim_t* s, uint64_t at_us, uint32_t kind, uint32_t node,
                     uint64_t arg);
void* st__sim_alloc(st_sim_t* s, size_t n);
void st__sim_free(st_sim_t* s, void* p, size_t n);

/* sim_average.c: runs the average scenario on s (opt, heap, generators
 * seeded; no membership machines). Returns 0 or -ENOMEM. */
int st__sim_average_run(st_sim_t* s, st_sim_result_t* res);

/* sim_metrics.c */
void st__sim_observe(st_sim_t* s, uint32_t observer, const st_member_t* mb);
bool st__sim_healthy(const st_sim_t* s, uint32_t i);
void st__sim_running_changed(st_sim_t* s, int delta);
void st__sim_observer_gone(st_sim_t* s, uint32_t observer);
int st__sim_track(st_sim_t* s, st_sim_track_kind_t kind, uint32_t subject);
void st__sim_window_open(st_sim_t* s);
bool st__sim_check_converged(st_sim_t* s);
void st__sim_collect(st_sim_t* s, st_sim_result_t* r);
double st__sim_suspicion_max_s(const st_sim_t* s, uint32_t n);
uint64_t st__sim_heap_in_use(void);
double st__sim_machine_bytes(st_sim_t* s, uint64_t base_heap, size_t base_own);

#endif
