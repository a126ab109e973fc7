/* daemon_control.c: the Unix control socket through which `starling
 * status`, `starling peers` and `starling leave` reach a running node.
 *
 * Protocol: the client sends one line, "status", "peers", "join ...",
 * "keys ..." (daemon_keys.c), "force-leave ID" (daemon_force_leave.c) or
 * "leave", optionally followed by " json"; the
 * node answers with the document (a table for people, or one JSON document) and
 * closes the connection. The socket is created with mode 0600 in the data
 * directory (only the user that runs the node may control it); a stale socket
 * left by a crashed node is replaced, a live one is refused (a second node on
 * the same data directory never gets here: daemon_state.c's lock refuses it
 * first).
 *
 * Limits: at most CTL_MAX_CLIENTS clients at a time, CTL_REQUEST_DEADLINE_MS
 * for a client to send its line and CTL_ANSWER_DEADLINE_MS to take its
 * answer; each closure is counted (control_* under "rejected" in status
 * --json). A connection that says "attach" leaves this table when the
 * session takes it over (daemon_attach.c has its own limits); one that
 * says "monitor" is handed to daemon_events.c, which streams the node's
 * events to it (`starling monitor`).
 */
#include "node/daemon/daemon_internal.h"
#include "base/base.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* The longest request line: "keys cluster install /PATH json" with a path
 * of up to PATH_MAX bytes (the CLI sends realpath's answer). */
#define REQUEST_MAX (PATH_MAX + 64)

/* A client sends one short line and gets one document, so a few at a time
 * suffice; the cap bounds what idle connections (a stuck script, a runaway
 * local process of the same user) can hold. When every slot is taken the
 * oldest client that has not sent its whole request is closed for the
 * newcomer: `starling status` sends its line as soon as it connects and is
 * answered in the same turn of the loop, so it gets in however many idle
 * connections there are. Only when every slot holds an answered client
 * whose document is still being written is a newcomer closed at once. */
#define CTL_MAX_CLIENTS 32
/* The CLI sends its line right after connecting: 5 s is generous for a
 * live client and short for a connection that never speaks. */
#define CTL_REQUEST_DEADLINE_MS 5000u
/* An answered client that does not take its document (a peers table of
 * many members can exceed the socket buffer) gives its slot back. */
#define CTL_ANSWER_DEADLINE_MS 30000u
#define CTL_SWEEP_MS 500u

typedef struct st__ctl_client_s {
  uv_pipe_t pipe;
  st__daemon_t* d;
  struct st__ctl_client_s* prev; /* d->ctl_head .. ctl_tail, oldest first */
  struct st__ctl_client_s* next;
  bool listed;
  uint64_t deadline_ms; /* for the request, then for the answer */
  char req[REQUEST_MAX];
  size_t len;
  bool answered;
} client_t;

typedef struct {
  uv_write_t req;
  client_t* cl;
  st_json_buf_t buf;
} cwrite_t;

static void put_num(st_json_buf_t* b, double v) {
  char tmp[64];
  if (!isfinite(v))
    st_json_buf_puts(b, "null");
  else {
    snprintf(tmp, sizeof(tmp), "%.6g", v);
    st_json_buf_puts(b, tmp);
  }
}

static st__figure_t figure(double v, int decimals) {
  return st__figure(v, decimals);
}

static void put_key(st_json_buf_t* b, bool* first, const char* key) {
  st_json_buf_puts(b, *first ? "{" : ",");
  *first = false;
  st_json_buf_string(b, key);
  st_json_buf_puts(b, ":");
}

static void kv_u64(st_json_buf_t* b, bool* first, const char* k, uint64_t v) {
  put_key(b, first, k);
  st_json_buf_u64(b, v);
}

static void kv_num(st_json_buf_t* b, bool* first, const char* k, double v) {
  put_key(b, first, k);
  put_num(b, v);
}

static void kv_str(st_json_buf_t* b, bool* first, const char* k,
                   const char* v) {
  put_key(b, first, k);
  st_json_buf_string(b, v);
}

typedef struct {
  size_t alive, suspect, dead;
} peer_counts_t;

/* The model thread's counters; zero (figures NaN) while an attached node
 * waits for the program that brings its model. */
static void node_stats(st__daemon_t* d, st__tt_stats_t* st) {
  if (d->tt != NULL) {
    st__tt_stats(d->tt, st);
    return;
  }
  memset(st, 0, sizeof(*st));
  st->loss = st->test_loss = st->test_accuracy = NAN;
}

static peer_counts_t count_peers(const st__daemon_t* d) {
  peer_counts_t pc = {0, 0, 0};
  size_t n = d->m != NULL ? st_membership_count(d->m) : 0;
  for (size_t i = 0; i < n; i++) {
    const st_member_t* mb = st_membership_at(d->m, i);
    if (mb == NULL || memcmp(&mb->id, &d->ident.id, sizeof(mb->id)) == 0)
      continue;
    if (mb->state == ST_MEMBER_ALIVE)
      pc.alive++;
    else if (mb->state == ST_MEMBER_SUSPECT)
      pc.suspect++;
    else
      pc.dead++;
  }
  return pc;
}

/* status --json, in parts (keys in this order): the node and its
 * training, exchanges, the ring, traffic, refusals. */
static void status_json_node(st__daemon_t* d, st_json_buf_t* b, bool* first) {
  st__tt_stats_t st;
  node_stats(d, &st);
  peer_counts_t pc = count_peers(d);
  char id[33];
  st_node_id_format(&d->ident.id, id);
  kv_str(b, first, "id", id);
  kv_str(b, first, "address", d->self_addr_text);
  put_key(b, first, "metrics"); /* the --metrics endpoint; null: off */
  if (d->metrics_addr[0] != '\0')
    st_json_buf_string(b, d->metrics_addr);
  else
    st_json_buf_puts(b, "null");
  kv_str(b, first, "state", st__dstate_name(d->state));
  kv_str(b, first, "model", d->local.model);
  kv_u64(b, first, "boot_epoch", d->boot_epoch);
  kv_u64(b, first, "step", st.step);
  kv_u64(b, first, "epoch", st.epoch);
  kv_num(b, first, "loss", st.loss);
  kv_num(b, first, "test_loss", st.test_loss);
  kv_num(b, first, "test_accuracy", st.test_accuracy);
  kv_num(b, first, "samples_per_sec", st.samples_per_sec);
  kv_u64(b, first, "samples", st.samples);
  kv_u64(b, first, "corrections_applied", st.corrections);
  kv_u64(b, first, "checkpoints_written", d->c.checkpoints);
  kv_num(b, first, "checkpoint_step",
         d->c.checkpoints > 0 ? (double) d->c.checkpoint_step : NAN);
  kv_u64(b, first, "peers_alive", pc.alive);
  kv_u64(b, first, "peers_suspect", pc.suspect);
  kv_u64(b, first, "peers_dead", pc.dead);
  if (d->cfg->attach) {
    put_key(b, first, "attach");
    bool f2 = true;
    put_key(b, &f2, "attached");
    st_json_buf_puts(b, st.attached ? "true" : "false");
    kv_u64(b, &f2, "sessions", st.sessions);
    kv_u64(b, &f2, "program_boundaries", st.program_boundaries);
    kv_u64(b, &f2, "program_requests", st.program_requests);
    kv_u64(b, &f2, "stale_snapshots", st.stale_snapshots);
    kv_u64(b, &f2, "nonfinite_snapshots", st.nonfinite_snapshots);
    kv_u64(b, &f2, "refused", d->attach_refused);
    st_json_buf_puts(b, "}");
  }
}

static void status_json_exchanges(st__daemon_t* d, st_json_buf_t* b,
                                  bool* first) {
  kv_u64(b, first, "exchanges_ok", d->c.ok);
  kv_u64(b, first, "exchanges_failed", d->c.failed);
  kv_u64(b, first, "exchanges_busy", d->c.busy);
  kv_u64(b, first, "exchanges_dropped", d->c.dropped);
  kv_u64(b, first, "exchanges_clipped", d->c.clipped);
  kv_num(b, first, "clip_bound", d->clip_last);
  kv_u64(b, first, "suspects", d->suspects);
  put_key(b, first, "suspicion_set_aside");
  st_json_buf_puts(b, d->suspicion_aside ? "true" : "false");
  kv_u64(b, first, "state_transfers", d->c.fetches_ok);
  kv_u64(b, first, "state_transfers_refused_step", d->c.fetch_step_refused);
  kv_u64(b, first, "state_transfers_held", d->c.fetches_held);
  kv_num(b, first, "exchange_ms_mean",
         d->c.ok > 0 ? d->c.exchange_ms_sum / (double) d->c.ok : NAN);
  kv_num(b, first, "exchange_ms_last",
         d->c.ok > 0 ? d->c.exchange_ms_last : NAN);
}

static void status_json_ring(st__daemon_t* d, st_json_buf_t* b, bool* first) {
  kv_u64(b, first, "ring_rounds_ok", d->c.ring_ok);
  kv_u64(b, first, "ring_rounds_aborted", d->c.ring_aborted);
  kv_u64(b, first, "ring_lanes_refused", d->c.ring_lanes_refused);
  kv_u64(b, first, "ring_rounds_clipped", d->c.ring_clipped);
  kv_u64(b, first, "ring_rounds_nonfinite", d->c.ring_nonfinite);
  kv_u64(b, first, "ring_proposals_distrusted",
         d->rf != NULL ? st_ring_form_counters(d->rf)->distrusted : 0);
  kv_str(b, first, "ring_state",
         d->rf != NULL ? st_ring_form_state_name(st_ring_form_state(d->rf))
                       : "off");
  char round[20] = "";
  if (d->ring != NULL && !d->ring_done)
    snprintf(round, sizeof(round), "%016llx",
             (unsigned long long) d->ring_round);
  kv_str(b, first, "ring_round", round);
  double progress = NAN;
  if (d->ring != NULL && !d->ring_done) {
    st_ring_progress_t p;
    st_ring_progress(d->ring, &p);
    progress = p.segments_to_receive > 0 ? (double) p.segments_received /
                                               (double) p.segments_to_receive
                                         : 1.0;
  }
  kv_num(b, first, "ring_progress", progress);
  snprintf(round, sizeof(round), "%016llx",
           (unsigned long long) d->c.ring_last_round);
  kv_str(b, first, "ring_last_round", d->c.ring_last_n > 0 ? round : "");
  put_key(b, first, "ring_last_ok");
  st_json_buf_puts(b, d->c.ring_last_ok ? "true" : "false");
  put_key(b, first, "ring_last_coded");
  st_json_buf_puts(b, d->c.ring_last_coded ? "true" : "false");
  /* The final round (daemon_ring.c, note_final_round): the agreed state
   * holds this node's last steps, and changes no more unless a member
   * trains on. */
  put_key(b, first, "ring_final_round");
  st_json_buf_puts(b, d->ring_final_ok ? "true" : "false");
  kv_num(b, first, "ring_last_ms",
         d->c.ring_last_n > 0 ? d->c.ring_last_ms : NAN);
  put_key(b, first, "ring_last_members");
  st_json_buf_puts(b, "[");
  for (uint32_t i = 0; i < d->c.ring_last_n; i++) {
    char mid[33];
    st_node_id_format(&d->ring_last_members[i], mid);
    if (i > 0)
      st_json_buf_puts(b, ",");
    st_json_buf_string(b, mid);
  }
  st_json_buf_puts(b, "]");
}

/* Every reason something was refused, by name, zeros included, so that
 * scripts can rely on the keys. */
static void status_json_rejected(st__daemon_t* d, st_json_buf_t* b,
                                 bool* first) {
  put_key(b, first, "rejected");
  bool f2 = true;
  for (int i = 0; i < ST_CRYPTO_DROP_COUNT; i++)
    kv_u64(b, &f2, st_crypto_drop_name((st_crypto_drop_t) i), d->cc.drops[i]);
  const st_wire_counters_t* mw =
      d->m != NULL ? st_membership_counters(d->m) : NULL;
  for (int i = 0; i < ST_WIRE_DROP_COUNT; i++)
    kv_u64(b, &f2, st_wire_drop_name((st_wire_drop_t) i),
           d->wc.drops[i] + (mw != NULL ? mw->drops[i] : 0));
  st_membership_claim_stats_t cs;
  st_membership_claim_stats(d->m, &cs); /* zeros before membership starts */
  kv_u64(b, &f2, "membership_bad_signature", cs.bad_signature);
  kv_u64(b, &f2, "membership_beyond_signed", cs.beyond_signed);
  kv_u64(b, &f2, "membership_ack_wrong_sender", cs.ack_wrong_sender);
  for (int i = 1; i < ST_XCHG_RESULT_COUNT; i++) {
    char name[64];
    snprintf(name, sizeof(name), "exchange_%s",
             st_xchg_result_name((st_xchg_result_t) i));
    kv_u64(b, &f2, name, d->c.by_result[i]);
  }
  kv_u64(b, &f2, "packet_unbound", d->c.udp_unbound);
  kv_u64(b, &f2, "handshake_wrong_peer", d->c.peer_mismatch);
  kv_u64(b, &f2, "connections_over_limit", d->c.conns_refused);
  kv_u64(b, &f2, "connections_per_address", d->c.conns_per_addr);
  kv_u64(b, &f2, "connections_evicted", d->c.conns_evicted);
  kv_u64(b, &f2, "connections_handshake_timeout", d->c.conns_hs_timeout);
  kv_u64(b, &f2, "handshake_busy", d->c.hs_busy);
  kv_u64(b, &f2, "connections_close_timeout", d->c.conns_close_timeout);
  kv_u64(b, &f2, "fetches_over_limit", d->c.fetches_refused);
  kv_u64(b, &f2, "control_evicted", d->ctl_evicted);
  kv_u64(b, &f2, "control_timed_out", d->ctl_timed_out);
  kv_u64(b, &f2, "control_over_limit", d->ctl_refused);
  kv_u64(b, &f2, "cluster_request", d->c.admin_rejected);
}

/* Cluster requests from members (daemon_admin_net.c), by answer. */
static void status_json_keys(st__daemon_t* d, st_json_buf_t* b, bool* first) {
  put_key(b, first, "cluster_requests");
  bool f2 = true;
  kv_u64(b, &f2, "granted", d->c.admin_granted);
  kv_u64(b, &f2, "already", d->c.admin_already);
  kv_u64(b, &f2, "refused", d->c.admin_refused);
  st_json_buf_puts(b, "}");
}

/* Compressed averaging (daemon_compress.c): the codec, anchors taken,
 * exchanges that went compressed, and refused compressed snapshots by
 * reason (every reason, zeros included). */
static void status_json_compression(st__daemon_t* d, st_json_buf_t* b,
                                    bool* first) {
  char name[32] = "none";
  st_codec_name(&d->cfg->compress, name, sizeof name);
  put_key(b, first, "compression");
  bool f2 = true;
  kv_str(b, &f2, "codec", name);
  kv_u64(b, &f2, "coded_bytes", d->local.coded_bytes);
  kv_u64(b, &f2, "anchors", d->c.anchors);
  kv_u64(b, &f2, "exchanges_compressed", d->c.xchg_coded);
  kv_u64(b, &f2, "rings_coded", d->c.ring_coded);
  put_key(b, &f2, "dropped");
  bool f3 = true;
  for (int i = 0; i < ST_CODEC_DROP_COUNT; i++)
    kv_u64(b, &f3, st_codec_drop_name((st_codec_drop_t) i),
           d->c.codec_drops[i]);
  st_json_buf_puts(b, "}}");
}

/* User collectives (daemon_coll.c): operations, drops, bytes, sessions. */
static void status_json_collectives(st__daemon_t* d, st_json_buf_t* b,
                                    bool* first) {
  uint64_t running = 0;
  for (const st__coll_op_t* op = d->coll.ops; op != NULL; op = op->next)
    running++;
  put_key(b, first, "collectives");
  bool f2 = true;
  kv_u64(b, &f2, "ok", d->c.coll_ok);
  kv_u64(b, &f2, "failed", d->c.coll_failed);
  kv_u64(b, &f2, "running", running);
  kv_u64(b, &f2, "dropped", d->c.coll_dropped);
  kv_u64(b, &f2, "kept_bytes", d->coll.pending_bytes);
  kv_u64(b, &f2, "bytes_in", d->c.coll_bytes_in);
  kv_u64(b, &f2, "bytes_out", d->c.coll_bytes_out);
  kv_u64(b, &f2, "sessions", d->coll.n_sessions);
  kv_u64(b, &f2, "sessions_refused", d->c.coll_sessions_refused);
  kv_u64(b, &f2, "shm_ops", d->c.coll_shm_ops);
  kv_u64(b, &f2, "shm_failed", d->c.coll_shm_failed);
  kv_u64(b, &f2, "published", d->store.n);
  kv_u64(b, &f2, "published_bytes", d->store.bytes);
  kv_u64(b, &f2, "publishes", d->c.store_published);
  kv_u64(b, &f2, "fetches_served", d->c.store_served);
  kv_u64(b, &f2, "fetches_missing", d->c.store_missing);
  kv_u64(b, &f2, "fetches_busy", d->c.store_busy);
  st_json_buf_puts(b, "}");
}

/* The outer optimizer (daemon_outer.c): its setting and the rounds that
 * stepped, started it, or sat out. */
static void status_json_outer(st__daemon_t* d, st_json_buf_t* b, bool* first) {
  const st_outer_spec_t* o = &d->cfg->outer;
  put_key(b, first, "outer");
  bool f2 = true;
  kv_str(b, &f2, "optimizer",
         o->kind == ST_OUTER_NONE     ? "none"
         : o->kind == ST_OUTER_NOLOCO ? "noloco"
                                      : "nesterov");
  kv_num(b, &f2, "lr", o->kind == ST_OUTER_NONE ? 1.0 : o->lr_ppm / 1e6);
  kv_num(b, &f2, "momentum",
         o->kind == ST_OUTER_NONE ? 0.0 : o->momentum_ppm / 1e6);
  kv_u64(b, &f2, "local_steps", d->cfg->local_steps);
  kv_u64(b, &f2, "steps", d->c.outer_steps);
  kv_u64(b, &f2, "starts", d->c.outer_starts);
  kv_u64(b, &f2, "skipped", d->c.outer_skipped);
  kv_u64(b, &f2, "resumed", d->c.outer_resumed);
  st_json_buf_puts(b, "}");
}

/* The agreed state this node holds (daemon_agreed.c; null when none) and
 * the multi-donor sync (daemon_sync.c): as joiner and as donor. */
static void status_json_sync(st__daemon_t* d, st_json_buf_t* b, bool* first) {
  put_key(b, first, "agreed");
  if (d->anchor == NULL) {
    st_json_buf_puts(b, "null");
  } else {
    char hex[2 * ST_XCHG_ANCHOR_BYTES + 1], round[17];
    const uint8_t* id = st__agreed_id_of(d->anchor);
    for (size_t i = 0; i < ST_XCHG_ANCHOR_BYTES; i++)
      snprintf(hex + 2 * i, 3, "%02x", id[i]);
    snprintf(round, sizeof round, "%016llx",
             (unsigned long long) d->anchor->round);
    bool f2 = true;
    kv_str(b, &f2, "id", hex);
    kv_str(b, &f2, "round", round);
    st_json_buf_puts(b, "}");
  }
  put_key(b, first, "sync");
  bool f3 = true;
  kv_u64(b, &f3, "donors", d->cfg->sync_donors);
  kv_u64(b, &f3, "ok", d->c.sync_ok);
  kv_u64(b, &f3, "single_donor", d->c.sync_single);
  kv_u64(b, &f3, "manifests", d->c.sync_manifests);
  kv_u64(b, &f3, "chunks_ok", d->c.sync_chunks_ok);
  kv_u64(b, &f3, "chunks_bad", d->c.sync_chunks_bad);
  kv_u64(b, &f3, "donors_bad", d->c.sync_donors_bad);
  kv_u64(b, &f3, "donors_lost", d->c.sync_donors_lost);
  kv_u64(b, &f3, "disagreed", d->c.sync_disagreed);
  kv_u64(b, &f3, "backoffs", d->c.sync_backoffs);
  kv_u64(b, &f3, "served_manifests", d->c.sync_served_manifests);
  kv_u64(b, &f3, "served_chunks", d->c.sync_served_chunks);
  kv_u64(b, &f3, "refused", d->c.sync_refused);
  kv_u64(b, &f3, "serving", d->sync_serving);
  st_json_buf_puts(b, "}");
}

static void status_json(st__daemon_t* d, st_json_buf_t* b) {
  bool first = true;
  status_json_node(d, b, &first);
  status_json_exchanges(d, b, &first);
  status_json_collectives(d, b, &first);
  status_json_compression(d, b, &first);
  status_json_outer(d, b, &first);
  status_json_sync(d, b, &first);
  status_json_keys(d, b, &first);
  status_json_ring(d, b, &first);
  kv_u64(b, &first, "bytes_in", d->c.bytes_in);
  kv_u64(b, &first, "bytes_out", d->c.bytes_out);
  kv_u64(b, &first, "packets_in", d->c.packets_in);
  kv_u64(b, &first, "packets_out", d->c.packets_out);
  /* The table's count: evicted or refused ones whose close is still to
   * run (released) hold no slot and are not counted. */
  kv_u64(b, &first, "connections", d->n_conns - d->n_released);
  kv_u64(b, &first, "connections_preauth", d->n_preauth);
  kv_u64(b, &first, "fetches_serving", (uint64_t) d->fetch_serving);
  kv_num(b, &first, "uptime_s", (double) (st__dnow(d) - d->started_ms) / 1e3);
  kv_u64(b, &first, "control_clients", d->ctl_n);
  status_json_rejected(d, b, &first);
  st_json_buf_puts(b, "}}\n");
}

static void status_text(st__daemon_t* d, st_json_buf_t* b) {
  st__tt_stats_t st;
  node_stats(d, &st);
  peer_counts_t pc = count_peers(d);
  char id[33], line[512];
  st_node_id_format(&d->ident.id, id);
  uint64_t rejected = 0;
  for (int i = 0; i < ST_CRYPTO_DROP_COUNT; i++)
    rejected += d->cc.drops[i];
  snprintf(line, sizeof(line),
           "node       %s\n"
           "address    %s\n"
           "state      %s\n"
           "model      %s\n"
           "step       %" PRIu64 " (epoch %" PRIu64
           ")\n"
           "loss       %s\n"
           "test acc   %s\n"
           "samples/s  %s\n",
           id, d->self_addr_text, st__dstate_name(d->state), d->local.model,
           st.step, st.epoch, figure(st.loss, 4).s,
           figure(st.test_accuracy, 4).s, figure(st.samples_per_sec, 0).s);
  st_json_buf_puts(b, line);
  if (d->metrics_addr[0] != '\0') {
    snprintf(line, sizeof(line), "metrics    http://%s/metrics\n",
             d->metrics_addr);
    st_json_buf_puts(b, line);
  }
  if (d->cfg->attach) {
    snprintf(line, sizeof(line),
             "program    %s; %" PRIu64 " sessions, %" PRIu64
             " attach requests refused\n",
             st.attached ? "attached" : "none attached", st.sessions,
             d->attach_refused);
    st_json_buf_puts(b, line);
  }
  snprintf(line, sizeof(line),
           "peers      %zu alive, %zu suspect, %zu dead or left\n"
           "exchanges  %" PRIu64 " ok, %" PRIu64 " failed, %" PRIu64
           " busy, %" PRIu64 " dropped by the guard, %" PRIu64
           " clipped\n"
           "rings      %" PRIu64 " ok, %" PRIu64
           " aborted; last: %u members, %.0f ms\n"
           "traffic    %.1f MB in, %.1f MB out\n"
           "rejected   %" PRIu64
           " packets/handshakes/frames "
           "(status --json has each reason)\n",
           pc.alive, pc.suspect, pc.dead, d->c.ok, d->c.failed, d->c.busy,
           d->c.dropped, d->c.clipped, d->c.ring_ok, d->c.ring_aborted,
           d->c.ring_last_n, d->c.ring_last_ms, (double) d->c.bytes_in / 1e6,
           (double) d->c.bytes_out / 1e6, rejected);
  st_json_buf_puts(b, line);
  if (d->c.coll_ok + d->c.coll_failed > 0 || d->coll.n_sessions > 0) {
    snprintf(line, sizeof(line),
             "collectives %" PRIu64 " ok, %" PRIu64
             " failed, %zu program(s) connected\n",
             d->c.coll_ok, d->c.coll_failed, d->coll.n_sessions);
    st_json_buf_puts(b, line);
  }
}

/* A member's cluster keys as its STATUS says: {"sends":ID,"accepts":[...]},
 * or null before it said. */
static void put_member_keys(st_json_buf_t* b, const st_member_t* m) {
  if (!m->has_status || m->status.n_keys == 0) {
    st_json_buf_puts(b, "null");
    return;
  }
  char keys[64];
  snprintf(keys, sizeof keys, "{\"sends\":%u,\"accepts\":[%u",
           (unsigned) m->status.keys[0], (unsigned) m->status.keys[0]);
  st_json_buf_puts(b, keys);
  if (m->status.n_keys == 2) {
    snprintf(keys, sizeof keys, ",%u", (unsigned) m->status.keys[1]);
    st_json_buf_puts(b, keys);
  }
  st_json_buf_puts(b, "]}");
}

static void peers_doc(st__daemon_t* d, st_json_buf_t* b, bool json) {
  size_t n = d->m != NULL ? st_membership_count(d->m) : 0;
  uint64_t now = st__dnow(d);
  if (json)
    st_json_buf_puts(b, "[");
  else
    st_json_buf_puts(b,
                     "ID            ADDRESS                STATE    "
                     "   STEP    LOSS     ACC  SAMPLES/S  HEARD  CLIPPED\n");
  for (size_t i = 0; i < n; i++) {
    const st_member_t* mb = st_membership_at(d->m, i);
    if (mb == NULL)
      continue;
    st_member_t m = *mb;
    bool self = memcmp(&m.id, &d->ident.id, sizeof(m.id)) == 0;
    char id[33], addr[64];
    st_node_id_format(&m.id, id);
    st__addr_format(&m.addr, addr, sizeof(addr));
    double heard = -1;
    if (self) {
      heard = 0;
    } else {
      uint64_t at = st__net_last_heard(d, &m.id);
      if (at != 0)
        heard = (double) (now - at) / 1e3;
    }
    double loss = m.has_status ? m.status.loss : NAN;
    double acc = m.has_status ? m.status.accuracy : NAN;
    double sps = m.has_status ? m.status.samples_per_sec : NAN;
    uint64_t step = m.has_status ? m.status.step : 0;
    const st__heard_t* h = self ? NULL : st__net_heard_find(d, &m.id);
    uint32_t averaged = h != NULL ? h->averaged : 0;
    uint32_t clipped = h != NULL ? h->clipped : 0;
    if (json) {
      if (i > 0)
        st_json_buf_puts(b, ",");
      bool first = true;
      kv_str(b, &first, "id", id);
      kv_str(b, &first, "address", addr);
      kv_str(b, &first, "state", st_member_state_name(m.state));
      put_key(b, &first, "self");
      st_json_buf_puts(b, self ? "true" : "false");
      kv_u64(b, &first, "step", step);
      kv_num(b, &first, "loss", loss);
      kv_num(b, &first, "test_accuracy", acc);
      kv_num(b, &first, "samples_per_sec", sps);
      kv_num(b, &first, "last_heard_s", heard < 0 ? NAN : heard);
      kv_u64(b, &first, "incarnation", m.incarnation);
      kv_u64(b, &first, "averaged", averaged);
      kv_u64(b, &first, "clipped", clipped);
      kv_num(b, &first, "suspicion", h != NULL ? (double) h->suspicion : 0);
      bool in_ring = false;
      for (uint32_t k = 0; k < d->c.ring_last_n; k++)
        if (memcmp(&d->ring_last_members[k], &m.id, sizeof(m.id)) == 0)
          in_ring = true;
      put_key(b, &first, "in_last_ring");
      st_json_buf_puts(b, in_ring ? "true" : "false");
      put_key(b, &first, "keys");
      put_member_keys(b, &m);
      st_json_buf_puts(b, "}");
    } else {
      char line[320], heard_s[32];
      if (heard < 0)
        snprintf(heard_s, sizeof(heard_s), "-");
      else
        snprintf(heard_s, sizeof(heard_s), "%.1fs", heard);
      snprintf(line, sizeof(line),
               "%.12s%s %-22s %-8s %7" PRIu64 " %7s %7s %10s  %-6s %u/%u\n", id,
               self ? "*" : " ", addr, st_member_state_name(m.state), step,
               figure(loss, 4).s, figure(acc, 4).s, figure(sps, 0).s, heard_s,
               clipped, averaged);
      st_json_buf_puts(b, line);
    }
  }
  st_json_buf_puts(b, json ? "]\n" : "(* this node)\n");
}

/* ---- Clients ------------------------------------------------------------- */

/* "join ADDR [ADDR...]": asks membership to join through these seeds (a
 * running node that started alone, or lost its cluster). Names resolve
 * here (blocking: `starling join` is a human's command). */
static void join_request(st__daemon_t* d, char* args, bool json,
                         st_json_buf_t* b) {
  st_wire_addr_t addrs[ST_DAEMON_MAX_SEEDS];
  size_t n = 0;
  char err[300] = "";
  char* save = NULL;
  for (char* tok = strtok_r(args, " ", &save); tok != NULL;
       tok = strtok_r(NULL, " ", &save)) {
    if (strcmp(tok, "json") == 0)
      continue;
    struct sockaddr_storage ss;
    if (n == ST_DAEMON_MAX_SEEDS) {
      snprintf(err, sizeof err, "at most %d addresses", ST_DAEMON_MAX_SEEDS);
      break;
    }
    if (st__addr_parse(tok, &ss, &addrs[n], err, sizeof err) != 0)
      break;
    n++;
  }
  if (err[0] == '\0' && n == 0)
    snprintf(err, sizeof err, "no address given: starling join HOST:PORT");
  if (err[0] == '\0' && d->m == NULL)
    snprintf(err, sizeof err,
             "the node is not on the network yet (an attach-mode node joins "
             "once a program brings its model)");
  if (err[0] != '\0') {
    st_json_buf_puts(b, "error: ");
    st_json_buf_puts(b, err);
    st_json_buf_puts(b, "\n");
    return;
  }
  st_membership_join(d->m, st__dnow(d), addrs, n);
  st__net_drain(d);
  st__dlog(d, "joining through %zu address(es), asked by `starling join`", n);
  char line[128];
  snprintf(line, sizeof line,
           json ? "{\"joining\":%zu}\n"
                : "joining: asked %zu address(es); `starling peers` shows "
                  "who answered\n",
           n);
  st_json_buf_puts(b, line);
}

static void client_close_cb(uv_handle_t* h) {
  free(h->data);
}

static void list_add(st__daemon_t* d, client_t* cl) {
  cl->prev = d->ctl_tail;
  cl->next = NULL;
  if (d->ctl_tail != NULL)
    d->ctl_tail->next = cl;
  else
    d->ctl_head = cl;
  d->ctl_tail = cl;
  cl->listed = true;
  d->ctl_n++;
}

static void list_remove(st__daemon_t* d, client_t* cl) {
  if (!cl->listed)
    return;
  if (cl->prev != NULL)
    cl->prev->next = cl->next;
  else
    d->ctl_head = cl->next;
  if (cl->next != NULL)
    cl->next->prev = cl->prev;
  else
    d->ctl_tail = cl->prev;
  cl->listed = false;
  d->ctl_n--;
}

/* Leaves the table at once (its slot is free) and closes the handle; the
 * memory goes in the close callback, after any write callback. */
static void client_close(client_t* cl) {
  list_remove(cl->d, cl);
  if (!uv_is_closing((uv_handle_t*) &cl->pipe))
    uv_close((uv_handle_t*) &cl->pipe, client_close_cb);
}

static void cwrite_cb(uv_write_t* req, int status) {
  cwrite_t* w = (cwrite_t*) req;
  (void) status;
  client_t* cl = w->cl;
  st_json_buf_free(&w->buf);
  free(w);
  client_close(cl);
}

/* The requests after which another module takes the connection over:
 * "attach" (its session, daemon_attach.c), "collectives" or "collectives
 * shm" (a collectives session, daemon_coll_session.c) and "monitor" (the event
 * stream, daemon_events.c). true when cl's request was one of them (cl is
 * closed: the module keeps a duplicate of its socket). more: bytes came after
 * the line (meant for a session that has not started). */
static bool hand_over(client_t* cl, bool more, bool json) {
  int to = strcmp(cl->req, "attach") == 0                      ? 1
           : strcmp(cl->req, "collectives") == 0               ? 2
           : strcmp(cl->req, "collectives shm") == 0           ? 6
           : strncmp(cl->req, "monitor", 7) == 0               ? 3
           : strncmp(cl->req, "keys cluster ", 13) == 0        ? 4
           : strncmp(cl->req, "force-leave cluster ", 20) == 0 ? 5
                                                               : 0;
  if (to == 0)
    return false;
  uv_os_fd_t fd;
  if (uv_fileno((uv_handle_t*) &cl->pipe, &fd) == 0) {
    if (to == 1)
      st__attach_takeover(cl->d, fd, more);
    else if (to == 2 || to == 6)
      st__coll_takeover(cl->d, fd, more, to == 6);
    else if (to == 3)
      st__events_takeover(cl->d, fd, json);
    else if (to == 4)
      st__admin_cluster_takeover(cl->d, fd, "keys", cl->req + 13, json);
    else
      st__admin_cluster_takeover(cl->d, fd, "force-leave", cl->req + 20, json);
  }
  client_close(cl);
  return true;
}

static void answer(client_t* cl) {
  st__daemon_t* d = cl->d;
  cl->answered = true;
  cl->deadline_ms = st__dnow(d) + CTL_ANSWER_DEADLINE_MS;
  char* nl = memchr(cl->req, '\n', cl->len);
  bool more = nl != NULL && (size_t) (nl - cl->req) + 1 < cl->len;
  if (nl != NULL)
    *nl = '\0';
  bool json = strstr(cl->req, " json") != NULL;
  bool leave = false;
  if (hand_over(cl, more, json))
    return;
  cwrite_t* w = calloc(1, sizeof(*w));
  if (w == NULL) {
    client_close(cl);
    return;
  }
  w->cl = cl;
  st_json_buf_init(&w->buf);
  if (strncmp(cl->req, "status", 6) == 0) {
    if (json)
      status_json(d, &w->buf);
    else
      status_text(d, &w->buf);
  } else if (strncmp(cl->req, "peers", 5) == 0) {
    peers_doc(d, &w->buf, json);
  } else if (strncmp(cl->req, "join ", 5) == 0) {
    join_request(d, cl->req + 5, json, &w->buf);
  } else if (strncmp(cl->req, "keys", 4) == 0 &&
             (cl->req[4] == '\0' || cl->req[4] == ' ')) {
    st__keys_request(d, cl->req + 4, json, &w->buf);
  } else if (strncmp(cl->req, "force-leave ", 12) == 0) {
    st__force_leave_request(d, cl->req + 12, json, &w->buf);
  } else if (strncmp(cl->req, "leave", 5) == 0) {
    leave = true;
    st_json_buf_puts(&w->buf, json ? "{\"leaving\":true}\n"
                                   : "leaving: announcing the leave, "
                                     "writing a checkpoint, stopping\n");
  } else {
    st_json_buf_puts(&w->buf,
                     "error: unknown request; expected status, "
                     "peers, join, keys, force-leave, leave, monitor, "
                     "attach or collectives\n");
  }
  if (w->buf.failed) {
    st_json_buf_free(&w->buf);
    free(w);
    client_close(cl);
    return;
  }
  uv_buf_t b = uv_buf_init(w->buf.p, (unsigned) w->buf.len);
  if (uv_write(&w->req, (uv_stream_t*) &cl->pipe, &b, 1, cwrite_cb) != 0) {
    st_json_buf_free(&w->buf);
    free(w);
    client_close(cl);
  }
  if (leave)
    st__daemon_leave(d, "asked by `starling leave`");
}

static void client_alloc(uv_handle_t* h, size_t s, uv_buf_t* buf) {
  client_t* cl = h->data;
  (void) s;
  *buf = uv_buf_init(cl->req + cl->len, (unsigned) (REQUEST_MAX - 1 - cl->len));
}

static void client_read(uv_stream_t* s, ssize_t nread, const uv_buf_t* buf) {
  client_t* cl = s->data;
  (void) buf;
  if (cl->answered)
    return;
  if (nread < 0) {
    if (cl->len > 0)
      answer(cl);
    else
      client_close(cl);
    return;
  }
  cl->len += (size_t) nread;
  cl->req[cl->len] = '\0';
  if (memchr(cl->req, '\n', cl->len) != NULL || cl->len >= REQUEST_MAX - 1)
    answer(cl);
}

/* Frees a slot by closing the oldest client that has not sent its whole
 * request. false when every client has been answered. */
static bool evict_idle(st__daemon_t* d) {
  for (client_t* cl = d->ctl_head; cl != NULL; cl = cl->next) {
    if (!cl->answered) {
      d->ctl_evicted++;
      client_close(cl);
      return true;
    }
  }
  return false;
}

static void on_connection(uv_stream_t* server, int status) {
  st__daemon_t* d = server->data;
  if (status != 0)
    return;
  client_t* cl = calloc(1, sizeof(*cl));
  if (cl == NULL)
    return;
  cl->d = d;
  uv_pipe_init(&d->loop, &cl->pipe, 0);
  cl->pipe.data = cl;
  /* Accepted even when it is to be closed: libuv stops listening until
   * the pending connection is taken. */
  if (uv_accept(server, (uv_stream_t*) &cl->pipe) != 0) {
    client_close(cl);
    return;
  }
  if (d->ctl_n >= CTL_MAX_CLIENTS && !evict_idle(d)) {
    d->ctl_refused++;
    client_close(cl);
    return;
  }
  list_add(d, cl);
  cl->deadline_ms = st__dnow(d) + CTL_REQUEST_DEADLINE_MS;
  if (uv_read_start((uv_stream_t*) &cl->pipe, client_alloc, client_read) != 0)
    client_close(cl);
}

/* Closes the clients past their deadline: the request's, or the answer's. */
static void sweep_cb(uv_timer_t* t) {
  st__daemon_t* d = t->data;
  uint64_t now = st__dnow(d);
  client_t* next;
  for (client_t* cl = d->ctl_head; cl != NULL; cl = next) {
    next = cl->next;
    if (now >= cl->deadline_ms) {
      d->ctl_timed_out++;
      client_close(cl);
    }
  }
}

/* 1 when a node answers on path, 0 when nothing does (a stale socket). */
int st__control_in_use(const char* path) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0)
    return 0;
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof(sa));
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
  int alive = connect(fd, (struct sockaddr*) &sa, sizeof(sa)) == 0;
  close(fd);
  return alive;
}

int st__control_start(st__daemon_t* d, char* err, size_t err_len) {
  struct sockaddr_un sa;
  if (strlen(d->control_path) >= sizeof(sa.sun_path)) {
    snprintf(err, err_len,
             "control socket path '%s' is longer than %zu bytes; use a "
             "shorter --data-dir or --control",
             d->control_path, sizeof(sa.sun_path) - 1);
    return -ENAMETOOLONG;
  }
  struct stat sb;
  if (lstat(d->control_path, &sb) == 0) {
    if (!S_ISSOCK(sb.st_mode)) {
      snprintf(err, err_len,
               "'%s' exists and is not a socket; remove it or pass "
               "another --control",
               d->control_path);
      return -EEXIST;
    }
    if (st__control_in_use(d->control_path)) {
      snprintf(err, err_len,
               "a node is already running with control socket '%s' (same "
               "--data-dir?); stop it with 'starling leave --control %s' or "
               "use another --data-dir",
               d->control_path, d->control_path);
      return -EADDRINUSE;
    }
    unlink(d->control_path);
  }
  uv_pipe_init(&d->loop, &d->control, 0);
  d->control.data = d;
  /* Created 0600 from the start: the umask covers the bind. */
  mode_t old = umask(0177);
  int rc = uv_pipe_bind(&d->control, d->control_path);
  umask(old);
  if (rc == 0)
    rc = uv_listen((uv_stream_t*) &d->control, 16, on_connection);
  if (rc != 0) {
    snprintf(err, err_len, "cannot create control socket '%s': %s",
             d->control_path, uv_strerror(rc));
    uv_close((uv_handle_t*) &d->control, NULL);
    return rc;
  }
  d->control_open = true;
  uv_timer_init(&d->loop, &d->ctl_timer);
  d->ctl_timer.data = d;
  uv_timer_start(&d->ctl_timer, sweep_cb, CTL_SWEEP_MS, CTL_SWEEP_MS);
  d->ctl_timer_open = true;
  return 0;
}

/* Closes the socket, its timer and every client still connected (an idle
 * one would otherwise keep the loop, and the node, from ending). */
void st__control_close(st__daemon_t* d) {
  if (d->ctl_timer_open) {
    d->ctl_timer_open = false;
    if (!uv_is_closing((uv_handle_t*) &d->ctl_timer))
      uv_close((uv_handle_t*) &d->ctl_timer, NULL);
  }
  while (d->ctl_head != NULL)
    client_close(d->ctl_head);
  if (!d->control_open)
    return;
  d->control_open = false;
  uv_close((uv_handle_t*) &d->control, NULL);
  unlink(d->control_path);
}
