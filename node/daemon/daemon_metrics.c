/* daemon_metrics.c: the Prometheus endpoint of `starling node --metrics`
 * (docs/operations.md, "Metrics"). GET /metrics answers every counter and
 * gauge that `starling status --json` has, in Prometheus's text exposition
 * format 0.0.4 (prometheus.io/docs/instrumenting/exposition_formats), each
 * family with # HELP and # TYPE, plus duration histograms of averaging
 * exchanges and ring rounds. Every other path is 404. HTTP is
 * libmicrohttpd's; nothing here parses a request.
 *
 * Threads. The daemon's state belongs to the loop thread (DESIGN.md,
 * "Threads in the daemon"); libmicrohttpd answers on a thread of its own,
 * which reads none of it. The loop thread renders the whole exposition
 * every RENDER_MS on a timer and swaps it into a buffer under a mutex; the
 * HTTP thread copies the latest text out under the same mutex, and that is
 * all it touches. Chosen over rendering on each scrape (the HTTP thread
 * waking the loop with uv_async and waiting for the text) because then a
 * scrape never waits on the loop: a loop busy with a large exchange, or
 * one shutting down, cannot hang a scraper or the HTTP thread, and there is
 * no cross-thread hand-shake to get right at shut-down. The price: figures
 * up to RENDER_MS old (Prometheus scrapes every 15 s by default; a second
 * is about as often as anyone asks), and a render of about 13 KB (150 series, a
 * few hundred snprintf calls) each second whether anyone scrapes or not.
 *
 * Names follow Prometheus's conventions: a `starling_` prefix, base units
 * (`_seconds`, `_bytes`), `_total` on counters, and one family with a label
 * where status has one key per case (exchanges_ok, exchanges_failed, ... are
 * starling_exchanges_total{result="ok"}, ...).
 */
#include "node/daemon/daemon_internal.h"
#include "base/base.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* How old a scrape's figures may be; see "Threads" above. */
#define RENDER_MS 1000u
/* Scrapers at a time: Prometheus keeps one connection per target, so a few
 * servers and a curl or two fit; the cap bounds what a local process can
 * hold. An idle connection is closed after HTTP_TIMEOUT_S. */
#define HTTP_MAX_CONNS 16u
#define HTTP_TIMEOUT_S 10u

/* libmicrohttpd's callbacks return enum MHD_Result from 0.9.71 on, int
 * before. */
#if MHD_VERSION >= 0x00097002
typedef enum MHD_Result mhd_result_t;
#else
typedef int mhd_result_t;
#endif

struct st__metrics_s {
  pthread_mutex_t mu; /* guards text and len, shared with the HTTP thread */
  char* text;         /* the latest exposition (owned) */
  size_t len;
  struct MHD_Daemon* mhd; /* NULL once stopped */
  uv_timer_t timer;
  bool timer_open;
};

/* ---- Histograms ---------------------------------------------------------- */

const double st__hist_bounds_s[ST__HIST_BUCKETS] = {
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};

void st__hist_observe(st__hist_t* h, double seconds) {
  size_t i = 0;
  while (i < ST__HIST_BUCKETS && seconds > st__hist_bounds_s[i])
    i++;
  h->counts[i]++;
  h->count++;
  h->sum_s += seconds;
}

/* ---- Rendering (loop thread) --------------------------------------------- */

static void family(st_json_buf_t* b, const char* name, const char* type,
                   const char* help) {
  char line[512];
  snprintf(line, sizeof(line), "# HELP %s %s\n# TYPE %s %s\n", name, help, name,
           type);
  st_json_buf_puts(b, line);
}

/* One sample: name{labels} value. labels is "" or `k="v",...`, already
 * escaped. Values print in the fewest of 15 or 17 digits that give them
 * back exactly; NaN and infinities as Prometheus spells them. */
static void sample(st_json_buf_t* b, const char* name, const char* labels,
                   double v) {
  char line[512], num[40];
  if (isnan(v))
    snprintf(num, sizeof(num), "NaN");
  else if (isinf(v))
    snprintf(num, sizeof(num), "%sInf", v > 0 ? "+" : "-");
  else if (snprintf(num, sizeof(num), "%.15g", v) > 0 && strtod(num, NULL) != v)
    snprintf(num, sizeof(num), "%.17g", v); /* 15 digits did not round-trip */
  snprintf(line, sizeof(line), "%s%s%s%s %s\n", name, labels[0] ? "{" : "",
           labels, labels[0] ? "}" : "", num);
  st_json_buf_puts(b, line);
}

static void sample_u64(st_json_buf_t* b, const char* name, const char* labels,
                       uint64_t v) {
  char line[512];
  snprintf(line, sizeof(line), "%s%s%s%s %" PRIu64 "\n", name,
           labels[0] ? "{" : "", labels, labels[0] ? "}" : "", v);
  st_json_buf_puts(b, line);
}

static void counter(st_json_buf_t* b, const char* name, const char* help,
                    uint64_t v) {
  family(b, name, "counter", help);
  sample_u64(b, name, "", v);
}

static void gauge(st_json_buf_t* b, const char* name, const char* help,
                  double v) {
  family(b, name, "gauge", help);
  sample(b, name, "", v);
}

/* `key="value"` with value escaped as the format asks (\\, \", \n). */
static void label(char* out, size_t len, const char* key, const char* value) {
  size_t o = (size_t) snprintf(out, len, "%s=\"", key);
  for (const char* p = value; *p != '\0' && o + 4 < len; p++) {
    if (*p == '\\' || *p == '"') {
      out[o++] = '\\';
      out[o++] = *p;
    } else if (*p == '\n') {
      out[o++] = '\\';
      out[o++] = 'n';
    } else {
      out[o++] = *p;
    }
  }
  snprintf(out + o, len - o, "\"");
}

/* A state as a family of 0/1 gauges, one per possible value, so that
 * PromQL can count members by state: name{key="value"} 1 for the current
 * one, 0 for the others. */
static void enum_gauge(st_json_buf_t* b, const char* name, const char* help,
                       const char* key, const char* const* values, size_t n,
                       const char* current) {
  family(b, name, "gauge", help);
  for (size_t i = 0; i < n; i++) {
    char l[96];
    label(l, sizeof(l), key, values[i]);
    sample_u64(b, name, l, strcmp(values[i], current) == 0);
  }
}

/* A histogram's series under labels (may be ""), cumulative as the format
 * wants them. */
static void hist_series(st_json_buf_t* b, const char* name, const char* labels,
                        const st__hist_t* h) {
  char series[160], l[192];
  snprintf(series, sizeof(series), "%s_bucket", name);
  uint64_t cum = 0;
  for (size_t i = 0; i <= ST__HIST_BUCKETS; i++) {
    cum += h->counts[i];
    char le[32];
    if (i < ST__HIST_BUCKETS)
      snprintf(le, sizeof(le), "%g", st__hist_bounds_s[i]);
    else
      snprintf(le, sizeof(le), "+Inf");
    snprintf(l, sizeof(l), "%s%sle=\"%s\"", labels, labels[0] ? "," : "", le);
    sample_u64(b, series, l, cum);
  }
  snprintf(series, sizeof(series), "%s_sum", name);
  sample(b, series, labels, h->sum_s);
  snprintf(series, sizeof(series), "%s_count", name);
  sample_u64(b, series, labels, h->count);
}

/* The model thread's figures (as status: zero, NaN for the measures, while
 * an attached node waits for its model). */
static void node_stats(st__daemon_t* d, st__tt_stats_t* st) {
  if (d->tt != NULL) {
    st__tt_stats(d->tt, st);
    return;
  }
  memset(st, 0, sizeof(*st));
  st->loss = st->test_loss = st->test_accuracy = NAN;
}

static void render_identity(st__daemon_t* d, st_json_buf_t* b) {
  char id[33], l[512], a[96], m[320];
  st_node_id_format(&d->ident.id, id);
  label(l, sizeof(l), "id", id);
  label(a, sizeof(a), "address", d->self_addr_text);
  label(m, sizeof(m), "model", d->local.model);
  snprintf(l + strlen(l), sizeof(l) - strlen(l), ",%s,%s", a, m);
  family(b, "starling_node_info", "gauge",
         "This node: its id, address and model (always 1).");
  sample_u64(b, "starling_node_info", l, 1);
  static const char* const states[] = {"syncing", "waiting", "training", "done",
                                       "leaving"};
  enum_gauge(b, "starling_node_state",
             "1 for the node's state (syncing, waiting, training, done, "
             "leaving), 0 for the others.",
             "state", states, sizeof(states) / sizeof(states[0]),
             st__dstate_name(d->state));
  gauge(b, "starling_boot_epoch",
        "The boot epoch, raised on every start of this node.",
        (double) d->boot_epoch);
  gauge(b, "starling_uptime_seconds", "Seconds since this node started.",
        (double) (st__dnow(d) - d->started_ms) / 1e3);
}

static void render_training(st__daemon_t* d, st_json_buf_t* b) {
  st__tt_stats_t st;
  node_stats(d, &st);
  gauge(b, "starling_step", "Training steps this node's model has taken.",
        (double) st.step);
  gauge(b, "starling_epoch", "The epoch the node's trainer is in.",
        (double) st.epoch);
  gauge(b, "starling_loss",
        "Mean training loss over the last 100 steps (NaN before a step).",
        st.loss);
  gauge(b, "starling_test_loss",
        "Test-set loss at the last evaluation (NaN before one).", st.test_loss);
  gauge(b, "starling_test_accuracy",
        "Test-set accuracy at the last evaluation, 0 to 1 (NaN before one).",
        st.test_accuracy);
  gauge(b, "starling_samples_per_second",
        "Training examples per second over the last few seconds.",
        st.samples_per_sec);
  counter(b, "starling_samples_total", "Training examples processed.",
          st.samples);
  counter(b, "starling_corrections_applied_total",
          "Averaging corrections applied to the model.", st.corrections);
  counter(b, "starling_checkpoints_total",
          "Checkpoints written while running (periodic or asked for).",
          d->c.checkpoints);
  gauge(b, "starling_checkpoint_step",
        "The step of the last checkpoint written (NaN before one).",
        d->c.checkpoints > 0 ? (double) d->c.checkpoint_step : NAN);
  if (!d->cfg->attach)
    return;
  gauge(b, "starling_attach_program_attached",
        "1 while a program is attached (--attach).", st.attached);
  counter(b, "starling_attach_sessions_total", "Attach sessions started.",
          st.sessions);
  counter(b, "starling_attach_program_boundaries_total",
          "Step boundaries the attached program reported.",
          st.program_boundaries);
  counter(b, "starling_attach_program_requests_total",
          "Requests the attached program served.", st.program_requests);
  counter(b, "starling_attach_stale_snapshots_total",
          "Snapshots served from the node's copy (no program boundary in "
          "time).",
          st.stale_snapshots);
  counter(b, "starling_attach_nonfinite_snapshots_total",
          "Program snapshots refused: parameters not finite.",
          st.nonfinite_snapshots);
  counter(b, "starling_attach_refused_total",
          "Attach requests refused (bad input).", d->attach_refused);
}

static void render_members(st__daemon_t* d, st_json_buf_t* b) {
  uint64_t alive = 0, suspect = 0, dead = 0;
  size_t n = d->m != NULL ? st_membership_count(d->m) : 0;
  for (size_t i = 0; i < n; i++) {
    const st_member_t* mb = st_membership_at(d->m, i);
    if (mb == NULL || memcmp(&mb->id, &d->ident.id, sizeof(mb->id)) == 0)
      continue;
    if (mb->state == ST_MEMBER_ALIVE)
      alive++;
    else if (mb->state == ST_MEMBER_SUSPECT)
      suspect++;
    else
      dead++;
  }
  family(b, "starling_members", "gauge",
         "Other members this node knows, by state (dead counts those that "
         "left).");
  sample_u64(b, "starling_members", "state=\"alive\"", alive);
  sample_u64(b, "starling_members", "state=\"suspect\"", suspect);
  sample_u64(b, "starling_members", "state=\"dead\"", dead);
  gauge(b, "starling_connections",
        "TCP connections this node holds (not those being closed).",
        (double) (d->n_conns - d->n_released));
  gauge(b, "starling_connections_preauth",
        "TCP connections still in their handshake.", (double) d->n_preauth);
  gauge(b, "starling_state_transfers_serving",
        "State transfers this node serves as donor now.",
        (double) d->fetch_serving);
  gauge(b, "starling_control_clients", "Clients on the control socket.",
        (double) d->ctl_n);
}

static void render_exchanges(st__daemon_t* d, st_json_buf_t* b) {
  family(b, "starling_exchanges_total", "counter",
         "Averaging exchanges by result (dropped: refused by the norm "
         "guard).");
  sample_u64(b, "starling_exchanges_total", "result=\"ok\"", d->c.ok);
  sample_u64(b, "starling_exchanges_total", "result=\"failed\"", d->c.failed);
  sample_u64(b, "starling_exchanges_total", "result=\"busy\"", d->c.busy);
  sample_u64(b, "starling_exchanges_total", "result=\"dropped\"", d->c.dropped);
  counter(b, "starling_exchanges_clipped_total",
          "Averaging exchanges whose pull was clipped (robust averaging).",
          d->c.clipped);
  gauge(b, "starling_clip_bound",
        "The robust-averaging bound of the last exchange (0: none yet).",
        d->clip_last);
  gauge(b, "starling_suspects",
        "Live members this node suspects (robust averaging).",
        (double) d->suspects);
  gauge(b, "starling_suspicion_set_aside",
        "1 while the suspects are not a minority and their suspicion is "
        "set aside.",
        d->suspicion_aside ? 1.0 : 0.0);
  counter(b, "starling_state_transfers_total",
          "State transfers this node fetched.", d->c.fetches_ok);
  counter(b, "starling_state_transfers_refused_step_total",
          "State transfers refused: the donor's step beyond the others'.",
          d->c.fetch_step_refused);
  counter(b, "starling_state_transfers_held_total",
          "State transfers that sent nothing: the donor held this node's "
          "own seeded initialization.",
          d->c.fetches_held);
  gauge(b, "starling_exchange_last_duration_seconds",
        "The last successful averaging exchange, connect to done (NaN "
        "before one).",
        d->c.ok > 0 ? d->c.exchange_ms_last / 1e3 : NAN);
  family(b, "starling_exchange_duration_seconds", "histogram",
         "Successful averaging exchanges, connect to done.");
  hist_series(b, "starling_exchange_duration_seconds", "", &d->c.exchange_s);
}

static void render_ring_state(st__daemon_t* d, st_json_buf_t* b) {
  static const char* const states[] = {"off", "idle", "proposing", "accepted",
                                       "running"};
  const char* now = d->rf != NULL
                        ? st_ring_form_state_name(st_ring_form_state(d->rf))
                        : "off";
  enum_gauge(b, "starling_ring_state",
             "1 for the ring formation's state, 0 for the others.", "state",
             states, sizeof(states) / sizeof(states[0]), now);
  double progress = NAN;
  if (d->ring != NULL && !d->ring_done) {
    st_ring_progress_t p;
    st_ring_progress(d->ring, &p);
    progress = p.segments_to_receive > 0 ? (double) p.segments_received /
                                               (double) p.segments_to_receive
                                         : 1.0;
  }
  gauge(b, "starling_ring_progress",
        "Share of the running ring round's segments received (NaN: none "
        "running).",
        progress);
  bool last = d->c.ring_last_n > 0;
  gauge(b, "starling_ring_last_ok",
        "1 when the last ring round this node took part in succeeded.",
        d->c.ring_last_ok);
  gauge(b, "starling_ring_last_coded",
        "1 when the last ring round this node took part in went coded "
        "(--compress: drifts from the shared anchor in the codec).",
        d->c.ring_last_coded);
  gauge(b, "starling_ring_final_round",
        "1 once a ring round that started after this node's epochs were "
        "done has succeeded with every member that could take part.",
        d->ring_final_ok);
  gauge(b, "starling_ring_last_duration_seconds",
        "Duration of the last ring round (NaN before one).",
        last ? d->c.ring_last_ms / 1e3 : NAN);
  gauge(b, "starling_ring_last_members", "Members of the last ring round.",
        (double) d->c.ring_last_n);
}

static void render_ring(st__daemon_t* d, st_json_buf_t* b) {
  family(b, "starling_ring_rounds_total", "counter",
         "Ring all-reduce rounds this node took part in, by result.");
  sample_u64(b, "starling_ring_rounds_total", "result=\"ok\"", d->c.ring_ok);
  sample_u64(b, "starling_ring_rounds_total", "result=\"aborted\"",
             d->c.ring_aborted);
  counter(b, "starling_ring_lanes_refused_total",
          "Ring lanes closed at once (not a round this node runs, or not "
          "from its previous member).",
          d->c.ring_lanes_refused);
  counter(b, "starling_ring_rounds_clipped_total",
          "Ring rounds whose move was clipped.", d->c.ring_clipped);
  counter(b, "starling_ring_rounds_nonfinite_total",
          "Ring results not applied: NaN or Inf.", d->c.ring_nonfinite);
  counter(b, "starling_ring_proposals_distrusted_total",
          "Ring proposals refused: they named a distrusted member.",
          d->rf != NULL ? st_ring_form_counters(d->rf)->distrusted : 0);
  render_ring_state(d, b);
  family(b, "starling_ring_round_duration_seconds", "histogram",
         "Ring rounds this node took part in, start to end, by result.");
  hist_series(b, "starling_ring_round_duration_seconds", "result=\"ok\"",
              &d->c.ring_s[0]);
  hist_series(b, "starling_ring_round_duration_seconds", "result=\"aborted\"",
              &d->c.ring_s[1]);
}

/* User collectives: status --json's "collectives". */
static void render_collectives(st__daemon_t* d, st_json_buf_t* b) {
  uint64_t running = 0;
  for (const st__coll_op_t* op = d->coll.ops; op != NULL; op = op->next)
    running++;
  family(b, "starling_collectives_total", "counter",
         "User collective operations this node took part in, by result.");
  sample_u64(b, "starling_collectives_total", "result=\"ok\"", d->c.coll_ok);
  sample_u64(b, "starling_collectives_total", "result=\"failed\"",
             d->c.coll_failed);
  gauge(b, "starling_collectives_running",
        "User collective operations in progress here.", (double) running);
  counter(b, "starling_collectives_dropped_total",
          "Collective messages dropped: undecodable, from outside the "
          "group, kept too long or past the bound.",
          d->c.coll_dropped);
  gauge(b, "starling_collectives_kept_bytes",
        "Bytes of collective messages kept for operations not started here "
        "yet (at most 256 MiB, each for at most 300 s).",
        (double) d->coll.pending_bytes);
  counter(b, "starling_collectives_receive_bytes_total",
          "Bytes of collective messages received (plaintext).",
          d->c.coll_bytes_in);
  counter(b, "starling_collectives_transmit_bytes_total",
          "Bytes of collective messages sent (plaintext).",
          d->c.coll_bytes_out);
  gauge(b, "starling_collectives_sessions",
        "Programs with a collectives session on the control socket.",
        (double) d->coll.n_sessions);
  counter(b, "starling_collectives_sessions_refused_total",
          "Collectives sessions refused (too many, node leaving).",
          d->c.coll_sessions_refused);
  counter(b, "starling_collectives_shm_operations_total",
          "Collective operations whose operand came through the program's "
          "shared segment.",
          d->c.coll_shm_ops);
  counter(b, "starling_collectives_shm_failed_total",
          "Collectives sessions that asked for a shared segment and got none "
          "(the system refused the memfd; they use the socket).",
          d->c.coll_shm_failed);
  gauge(b, "starling_published_tensors",
        "Tensors programs published on this node (Comm.publish).",
        (double) d->store.n);
  gauge(b, "starling_published_bytes",
        "Bytes of the tensors published on this node.",
        (double) d->store.bytes);
  counter(b, "starling_publishes_total",
          "Tensors published on this node (new names and replacements).",
          d->c.store_published);
  family(b, "starling_fetches_total", "counter",
         "Fetches of this node's published tensors by other members, by "
         "answer: served, nothing published under the name, busy.");
  sample_u64(b, "starling_fetches_total", "result=\"served\"",
             d->c.store_served);
  sample_u64(b, "starling_fetches_total", "result=\"missing\"",
             d->c.store_missing);
  sample_u64(b, "starling_fetches_total", "result=\"busy\"", d->c.store_busy);
}

/* Cluster requests from members: status --json's "cluster_requests". */
static void render_cluster_requests(st__daemon_t* d, st_json_buf_t* b) {
  family(b, "starling_cluster_requests_total", "counter",
         "Cluster requests from members (`starling keys --cluster`, "
         "`starling force-leave --cluster`), "
         "by answer.");
  sample_u64(b, "starling_cluster_requests_total", "result=\"granted\"",
             d->c.admin_granted);
  sample_u64(b, "starling_cluster_requests_total", "result=\"already\"",
             d->c.admin_already);
  sample_u64(b, "starling_cluster_requests_total", "result=\"refused\"",
             d->c.admin_refused);
}

/* Compressed averaging: status --json's "compression". */
static void render_compression(st__daemon_t* d, st_json_buf_t* b) {
  char name[32] = "none", l[96];
  st_codec_name(&d->cfg->compress, name, sizeof name);
  family(b, "starling_compression_info", "gauge",
         "1, labelled with the codec averaging sends (--compress).");
  label(l, sizeof(l), "codec", name);
  sample_u64(b, "starling_compression_info", l, 1);
  gauge(b, "starling_compression_coded_bytes",
        "Bytes of one compressed snapshot of this model (0: float32).",
        (double) d->local.coded_bytes);
  counter(b, "starling_compression_anchors_total",
          "Anchors taken from ring rounds (the vectors drifts are coded "
          "against).",
          d->c.anchors);
  counter(b, "starling_exchanges_compressed_total",
          "Averaging exchanges that applied and went compressed.",
          d->c.xchg_coded);
  counter(b, "starling_rings_coded_total",
          "Ring rounds that went coded (drifts from the shared anchor, in "
          "the codec) and ended OK.",
          d->c.ring_coded);
  family(b, "starling_codec_dropped_total", "counter",
         "Compressed snapshots the decoder refused, by reason "
         "(docs/protocol.md, \"Decoding checks\").");
  for (int i = 0; i < ST_CODEC_DROP_COUNT; i++) {
    label(l, sizeof(l), "reason", st_codec_drop_name((st_codec_drop_t) i));
    sample_u64(b, "starling_codec_dropped_total", l, d->c.codec_drops[i]);
  }
  const st_outer_spec_t* o = &d->cfg->outer;
  bool on = o->kind != ST_OUTER_NONE;
  family(b, "starling_outer_info", "gauge",
         "1, labelled with the outer optimizer of averaging (--outer).");
  label(l, sizeof(l), "optimizer",
        !on                          ? "none"
        : o->kind == ST_OUTER_NOLOCO ? "noloco"
                                     : "nesterov");
  sample_u64(b, "starling_outer_info", l, 1);
  gauge(b, "starling_outer_learning_rate",
        "The outer step's learning rate (1 without --outer).",
        on ? o->lr_ppm / 1e6 : 1.0);
  gauge(b, "starling_outer_momentum",
        "The outer step's momentum (0 without --outer).",
        on ? o->momentum_ppm / 1e6 : 0.0);
  gauge(b, "starling_ring_local_steps",
        "Ring rounds every this many of the proposer's steps while it "
        "trains (--local-steps; 0: by time).",
        (double) d->cfg->local_steps);
  counter(b, "starling_outer_steps_total",
          "Ring rounds on which the outer optimizer (--outer) stepped.",
          d->c.outer_steps);
  counter(b, "starling_outer_starts_total",
          "Ring rounds that started the outer optimizer's state (this "
          "node's first: the mean became its anchor).",
          d->c.outer_starts);
  counter(b, "starling_outer_skipped_total",
          "Ring rounds (noloco: exchanges) the outer optimizer sat out: "
          "robust averaging clipped their move.",
          d->c.outer_skipped);
  counter(b, "starling_outer_resumed_total",
          "Starts that took the outer optimizer's state from "
          "outer.safetensors.",
          d->c.outer_resumed);
}

/* Multi-donor state sync (daemon_sync.c), as joiner and as donor. */
static void render_sync(st__daemon_t* d, st_json_buf_t* b) {
  static const struct {
    const char* name;
    const char* help;
    size_t field;
  } counters[] = {
      {"starling_sync_total", "States this node took from several donors.",
       offsetof(st__dcounters_t, sync_ok)},
      {"starling_sync_single_donor_total",
       "Joins that fell back to one donor (no agreed state two donors "
       "share).",
       offsetof(st__dcounters_t, sync_single)},
      {"starling_sync_manifests_total", "Usable manifests heard as joiner.",
       offsetof(st__dcounters_t, sync_manifests)},
      {"starling_sync_chunks_total", "Chunks verified as joiner.",
       offsetof(st__dcounters_t, sync_chunks_ok)},
      {"starling_sync_chunks_bad_total",
       "Chunks refused as joiner: not the agreed manifest's, or out of "
       "order.",
       offsetof(st__dcounters_t, sync_chunks_bad)},
      {"starling_sync_donors_bad_total",
       "Donors dropped for a bad chunk (or a manifest whose id lied).",
       offsetof(st__dcounters_t, sync_donors_bad)},
      {"starling_sync_donors_lost_total",
       "Donors that went away mid-range; their chunks came from others.",
       offsetof(st__dcounters_t, sync_donors_lost)},
      {"starling_sync_disagreed_total",
       "Rounds of asking for manifests in which two or more donors "
       "described different states, again and again (asked again, never "
       "one donor's word taken).",
       offsetof(st__dcounters_t, sync_disagreed)},
      {"starling_sync_backoffs_total",
       "Times a joiner waited (3 s, doubling to 48 s) before asking again, "
       "rather than take one donor's word: donors that disagreed, or "
       "agreeing donors that failed again and again.",
       offsetof(st__dcounters_t, sync_backoffs)},
      {"starling_sync_served_manifests_total", "Manifests served as donor.",
       offsetof(st__dcounters_t, sync_served_manifests)},
      {"starling_sync_served_chunks_total", "Chunks served as donor.",
       offsetof(st__dcounters_t, sync_served_chunks)},
      {"starling_sync_refused_total", "Sync requests answered busy as donor.",
       offsetof(st__dcounters_t, sync_refused)},
  };
  for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++)
    counter(b, counters[i].name, counters[i].help,
            *(const uint64_t*) (const void*) ((const char*) &d->c +
                                              counters[i].field));
  gauge(b, "starling_sync_donors",
        "Donors a joiner fetches from at once (--sync-donors).",
        (double) d->cfg->sync_donors);
  gauge(b, "starling_sync_serving",
        "Sync connections this node serves as donor now.",
        (double) d->sync_serving);
}

static void render_traffic(st__daemon_t* d, st_json_buf_t* b) {
  counter(b, "starling_network_receive_bytes_total",
          "Bytes received on the wire, TCP and UDP.", d->c.bytes_in);
  counter(b, "starling_network_transmit_bytes_total",
          "Bytes sent on the wire, TCP and UDP.", d->c.bytes_out);
  counter(b, "starling_network_receive_packets_total", "UDP packets received.",
          d->c.packets_in);
  counter(b, "starling_network_transmit_packets_total", "UDP packets sent.",
          d->c.packets_out);
}

static void rejected(st_json_buf_t* b, const char* reason, uint64_t v) {
  char l[96];
  label(l, sizeof(l), "reason", reason);
  sample_u64(b, "starling_rejected_total", l, v);
}

/* The reasons of status --json's "rejected", in its order. */
static void render_rejected(st__daemon_t* d, st_json_buf_t* b) {
  family(b, "starling_rejected_total", "counter",
         "Packets, handshakes, frames, connections and requests refused, by "
         "reason (docs/security.md).");
  for (int i = 0; i < ST_CRYPTO_DROP_COUNT; i++)
    rejected(b, st_crypto_drop_name((st_crypto_drop_t) i), d->cc.drops[i]);
  const st_wire_counters_t* mw =
      d->m != NULL ? st_membership_counters(d->m) : NULL;
  for (int i = 0; i < ST_WIRE_DROP_COUNT; i++)
    rejected(b, st_wire_drop_name((st_wire_drop_t) i),
             d->wc.drops[i] + (mw != NULL ? mw->drops[i] : 0));
  st_membership_claim_stats_t cs;
  st_membership_claim_stats(d->m, &cs); /* zeros before membership starts */
  rejected(b, "membership_bad_signature", cs.bad_signature);
  rejected(b, "membership_beyond_signed", cs.beyond_signed);
  rejected(b, "membership_ack_wrong_sender", cs.ack_wrong_sender);
  for (int i = 1; i < ST_XCHG_RESULT_COUNT; i++) {
    char name[64];
    snprintf(name, sizeof(name), "exchange_%s",
             st_xchg_result_name((st_xchg_result_t) i));
    rejected(b, name, d->c.by_result[i]);
  }
  rejected(b, "packet_unbound", d->c.udp_unbound);
  rejected(b, "handshake_wrong_peer", d->c.peer_mismatch);
  rejected(b, "connections_over_limit", d->c.conns_refused);
  rejected(b, "connections_per_address", d->c.conns_per_addr);
  rejected(b, "connections_evicted", d->c.conns_evicted);
  rejected(b, "connections_handshake_timeout", d->c.conns_hs_timeout);
  rejected(b, "handshake_busy", d->c.hs_busy);
  rejected(b, "connections_close_timeout", d->c.conns_close_timeout);
  rejected(b, "fetches_over_limit", d->c.fetches_refused);
  rejected(b, "control_evicted", d->ctl_evicted);
  rejected(b, "control_timed_out", d->ctl_timed_out);
  rejected(b, "control_over_limit", d->ctl_refused);
  rejected(b, "cluster_request", d->c.admin_rejected);
}

/* Renders the exposition and hands it to the HTTP thread. On a failed
 * allocation the previous text stays. */
static void render(st__daemon_t* d) {
  struct st__metrics_s* m = d->metrics;
  st_json_buf_t b;
  st_json_buf_init(&b);
  render_identity(d, &b);
  render_training(d, &b);
  render_members(d, &b);
  render_collectives(d, &b);
  render_compression(d, &b);
  render_sync(d, &b);
  render_cluster_requests(d, &b);
  render_exchanges(d, &b);
  render_ring(d, &b);
  render_traffic(d, &b);
  render_rejected(d, &b);
  if (b.failed) {
    st_json_buf_free(&b);
    return;
  }
  pthread_mutex_lock(&m->mu);
  char* old = m->text;
  m->text = b.p;
  m->len = b.len;
  pthread_mutex_unlock(&m->mu);
  free(old);
}

static void render_cb(uv_timer_t* t) {
  render(t->data);
}

/* ---- HTTP (libmicrohttpd's thread) ----------------------------------------
 * Reads m->text under m->mu and nothing else of the daemon. */

static mhd_result_t reply(struct MHD_Connection* conn, unsigned int status,
                          const char* text, size_t len, bool copy) {
  struct MHD_Response* r = MHD_create_response_from_buffer(
      len, (void*) text, copy ? MHD_RESPMEM_MUST_COPY : MHD_RESPMEM_PERSISTENT);
  if (r == NULL)
    return MHD_NO;
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                          status == MHD_HTTP_OK
                              ? "text/plain; version=0.0.4; charset=utf-8"
                              : "text/plain; charset=utf-8");
  if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
    MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  mhd_result_t rc = MHD_queue_response(conn, status, r);
  MHD_destroy_response(r);
  return rc;
}

static mhd_result_t on_request(void* cls, struct MHD_Connection* conn,
                               const char* url, const char* method,
                               const char* version, const char* upload_data,
                               size_t* upload_data_size, void** con_cls) {
  struct st__metrics_s* m = cls;
  (void) version;
  (void) upload_data;
  (void) upload_data_size;
  (void) con_cls;
  static const char not_found[] =
      "not found: starling serves its metrics at /metrics\n";
  static const char bad_method[] = "only GET and HEAD are served here\n";
  if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 &&
      strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
    return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, bad_method,
                 sizeof(bad_method) - 1, false);
  if (strcmp(url, "/metrics") != 0)
    return reply(conn, MHD_HTTP_NOT_FOUND, not_found, sizeof(not_found) - 1,
                 false);
  pthread_mutex_lock(&m->mu);
  mhd_result_t rc = reply(conn, MHD_HTTP_OK, m->text, m->len, true);
  pthread_mutex_unlock(&m->mu);
  return rc;
}

/* ---- Start and stop (loop thread) ---------------------------------------- */

int st__metrics_parse(const char* text, struct sockaddr_storage* ss, char* err,
                      size_t err_len) {
  /* A bare port (digits only) is on the loopback address. */
  if (text[0] != '\0' && strspn(text, "0123456789") == strlen(text)) {
    char buf[32];
    if (strlen(text) > 5 || strtoul(text, NULL, 10) > 65535) {
      st_set_err(err, err_len, "'%s': the port is not a number in 0..65535",
                 text);
      return -EINVAL;
    }
    snprintf(buf, sizeof(buf), "127.0.0.1:%s", text);
    return st__addr_parse(buf, ss, NULL, err, err_len);
  }
  return st__addr_parse(text, ss, NULL, err, err_len);
}

/* A listening TCP socket on ss; its fd, or a negative errno. */
static int listen_on(const struct sockaddr_storage* ss) {
  int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return -errno;
  int one = 1;
  /* As every server does: a port whose old connections linger in
   * TIME_WAIT can be bound again (a live listener still refuses it). */
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (ss->ss_family == AF_INET6)
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
  socklen_t sl = ss->ss_family == AF_INET ? sizeof(struct sockaddr_in)
                                          : sizeof(struct sockaddr_in6);
  if (bind(fd, (const struct sockaddr*) ss, sl) != 0 || listen(fd, 64) != 0) {
    int rc = -errno;
    close(fd);
    return rc;
  }
  return fd;
}

static void bind_error(const char* text, int rc, char* err, size_t err_len) {
  if (rc == -EADDRINUSE)
    st_set_err(err, err_len,
               "--metrics %s: address already in use (another node's "
               "--metrics, or another program); pick another port, or 0 "
               "for any free one",
               text);
  else if (rc == -EADDRNOTAVAIL)
    st_set_err(err, err_len,
               "--metrics %s: no interface of this machine has that "
               "address; give one of its addresses (127.0.0.1 for this "
               "machine only)",
               text);
  else if (rc == -EACCES)
    st_set_err(err, err_len,
               "--metrics %s: permission denied (ports below 1024 need "
               "privileges); use a port of 1024 or more",
               text);
  else
    st_set_err(err, err_len, "--metrics %s: cannot listen: %s", text,
               strerror(-rc));
}

/* The HTTP thread on fd (which it then owns and closes at its stop). */
static int start_http(struct st__metrics_s* m, int fd) {
  m->mhd = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO, 0, NULL, NULL, on_request,
      m, MHD_OPTION_LISTEN_SOCKET, (MHD_socket) fd, MHD_OPTION_CONNECTION_LIMIT,
      (unsigned int) HTTP_MAX_CONNS, MHD_OPTION_CONNECTION_TIMEOUT,
      (unsigned int) HTTP_TIMEOUT_S, MHD_OPTION_END);
  return m->mhd != NULL ? 0 : -EIO;
}

int st__metrics_start(st__daemon_t* d, char* err, size_t err_len) {
  const char* text = d->cfg->metrics;
  if (text == NULL)
    return 0;
  struct sockaddr_storage ss;
  char e[256];
  int rc = st__metrics_parse(text, &ss, e, sizeof(e));
  if (rc != 0) {
    st_set_err(err, err_len, "--metrics: %s", e);
    return rc;
  }
  struct st__metrics_s* m = calloc(1, sizeof(*m));
  if (m == NULL)
    return -ENOMEM;
  pthread_mutex_init(&m->mu, NULL);
  d->metrics = m;
  int fd = listen_on(&ss);
  if (fd < 0) {
    bind_error(text, fd, err, err_len);
    return fd;
  }
  struct sockaddr_storage bound;
  socklen_t bl = sizeof(bound);
  st_wire_addr_t wa;
  getsockname(fd, (struct sockaddr*) &bound, &bl);
  st__addr_from_sockaddr((const struct sockaddr*) &bound, &wa);
  st__addr_format(&wa, d->metrics_addr, sizeof(d->metrics_addr));
  render(d); /* a scrape from the first moment has figures */
  if ((rc = start_http(m, fd)) != 0) {
    close(fd);
    d->metrics_addr[0] = '\0';
    st_set_err(err, err_len,
               "--metrics %s: libmicrohttpd could not start its server", text);
    return rc;
  }
  uv_timer_init(&d->loop, &m->timer);
  m->timer.data = d;
  m->timer_open = true;
  uv_timer_start(&m->timer, render_cb, RENDER_MS, RENDER_MS);
  st__dlog(d, "metrics at http://%s/metrics", d->metrics_addr);
  return 0;
}

void st__metrics_close(st__daemon_t* d) {
  struct st__metrics_s* m = d->metrics;
  if (m == NULL)
    return;
  if (m->mhd != NULL) {
    MHD_stop_daemon(m->mhd); /* joins the thread, closes the socket */
    m->mhd = NULL;
  }
  if (m->timer_open) {
    m->timer_open = false;
    if (!uv_is_closing((uv_handle_t*) &m->timer))
      uv_close((uv_handle_t*) &m->timer, NULL);
  }
}

void st__metrics_free(st__daemon_t* d) {
  struct st__metrics_s* m = d->metrics;
  if (m == NULL)
    return;
  if (m->mhd != NULL)
    MHD_stop_daemon(m->mhd);
  pthread_mutex_destroy(&m->mu);
  free(m->text);
  free(m);
  d->metrics = NULL;
}
