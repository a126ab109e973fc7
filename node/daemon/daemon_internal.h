/* daemon_internal.h: the daemon's state, shared by node/daemon*.c. Every
 * field is owned by the loop thread unless its comment says otherwise.
 *
 *   daemon.c          start-up, the loop, signals, leave and shut-down
 *   daemon_state.c    the data directory: identity, boot epoch, paths
 *   daemon_net.c      UDP: sealed membership packets; the membership timer
 *   daemon_conn.c     TCP: handshake, encrypted frames, write queue
 *   daemon_xchg.c     averaging and state transfer over connections
 *   daemon_control.c  the Unix control socket: status, peers, leave
 *   daemon_attach.c   attach mode: a program's session on the control
 *                     socket (docs/attach.md)
 *   daemon_metrics.c  the Prometheus endpoint (--metrics)
 */
#ifndef STARLING_NODE_DAEMON_INTERNAL_H
#define STARLING_NODE_DAEMON_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "attach/attach.h"
#include "crypto/crypto.h"
#include "gossip/gossip.h"
#include "node/daemon/daemon.h"
#include "node/daemon/trainer_thread.h"

typedef enum {
  ST__D_SYNCING = 0, /* joined or joining; fetching state before step 1 */
  ST__D_WAITING,     /* has its state; the first step waits for --min-nodes */
  ST__D_TRAINING,
  ST__D_DONE, /* epochs done: serves exchanges, no more steps */
  ST__D_LEAVING
} st__dstate_t;

const char* st__dstate_name(st__dstate_t s);

typedef struct st__daemon_s st__daemon_t;
typedef struct st__conn_s st__conn_t;

/* Why a connection exists, known to the initiator from the start and to
 * the responder from the first message. */
typedef enum {
  ST__CONN_UNKNOWN = 0,
  ST__CONN_PUSH_PULL,
  ST__CONN_XCHG,
  ST__CONN_RING,  /* a ring round's stream, previous member -> next */
  ST__CONN_COLL,  /* user collectives' frames to one member (daemon_coll.c) */
  ST__CONN_ADMIN, /* one cluster request (daemon_admin_net.c) */
  ST__CONN_SYNC   /* a manifest or a range of the agreed state
                     (daemon_sync.c) */
} st__conn_purpose_t;

/* A connection's deadline after connect or accept (the sweep closes it
 * when it passes) until its purpose keeps its own timeout (owns_deadline);
 * a dialled push-pull has 10 s for the whole conversation. */
#define ST__HANDSHAKE_DEADLINE_MS 5000u
#define ST__PUSH_PULL_DEADLINE_MS 10000u

/* What a connection is for, as callbacks: one const instance per purpose
 * (daemon_conn_purpose.c), chosen by the dialler from the start and by the
 * acceptor from the type of the first message, through tables. A NULL
 * callback is skipped; a connection whose ops are NULL has no purpose yet
 * (or no more, at shut-down). */
typedef struct {
  st__conn_purpose_t purpose;
  uint64_t dial_deadline_ms; /* the dialler's deadline, dial to done */
  bool offload_rx;      /* frames >= st__offload_bytes() open on the pool */
  bool count_truncated; /* the dialler's stream ended before the reply:
                           ST_DROP_STREAM_TRUNCATED */
  /* The stream is up on the dialling side: say the first thing. < 0 drops
   * the connection. */
  int (*on_open)(st__conn_t* c);
  /* One received message, borrowed for the call. */
  void (*on_frame)(st__conn_t* c, const uint8_t* msg, size_t len);
  /* A frame sent with xchg_ack has been written. */
  void (*on_sent)(st__conn_t* c);
  /* The connection will carry nothing more (aborted, dial failed). */
  void (*on_close)(st__conn_t* c);
  /* The handle is closed, however the connection ended. */
  void (*on_handle_closed)(st__conn_t* c);
  /* The last trainer request or pool job that borrowed from c is done
   * (tt_pending fell to 0: st__conn_release). */
  void (*on_idle)(st__conn_t* c);
  /* true while the purpose keeps its own timeout and the connection's
   * deadline does not apply. */
  bool (*owns_deadline)(const st__conn_t* c);
} st__conn_ops_t;

struct st__conn_s {
  uv_tcp_t tcp;
  st__daemon_t* d;
  st__conn_t* next; /* in d->conns */
  uint64_t id;      /* snapshot and correction tags */
  bool initiator;
  int phase; /* daemon_conn.c */
  bool closing;
  bool handle_closed;
  int tt_pending; /* trainer requests that still borrow this conn */
  uint64_t deadline_ms;
  uint64_t started_us; /* dial or accept */
  /* Closing (st__conn_close): aborted when this passes. */
  uint64_t close_deadline_ms;
  /* An accepted connection whose handshake is not done: the peer has
   * proved nothing (daemon_conn.c, "Admission"). released: refused or
   * evicted as such, closing, and no longer counted against the table. */
  bool preauth, released;
  /* A FETCH we answer: one of d->fetch_serving. */
  bool serving_fetch;
  /* Its exchange machine borrows d->xbuf (daemon_xchg.c). */
  bool holds_xbuf;
  st_wire_addr_t peer_addr;
  st_node_id_t peer;
  st_session_framer_t sf; /* the handshake's framing; writes tx and rx */
  st_stream_t tx, rx;
  uint8_t* rbuf;
  size_t rlen, rcap;
  const st__conn_ops_t* ops; /* NULL: no purpose (yet) */
  /* PUSH_PULL initiator: the request to send once the stream is up. */
  uint8_t* pp_request;
  size_t pp_len;
  /* XCHG */
  st_xchg_t* x;
  st_xchg_kind_t xkind;
  /* Compressed averaging: the anchor this exchange named (a reference;
   * daemon_compress.c), NULL when it named none. */
  struct st__anchor_s* anchor;
  float* snap; /* the machine's snapshot buffer, lent to the trainer */
  /* SYNC (daemon_sync.c). Joiner: what it asks (st_sync_kind_t) and the
   * donor's index in d->sync plus one (0: none, or the sync no longer
   * wants it); whether the reply came. Donor: the range it serves (chunks
   * sync_next .. sync_end - 1 still to send, of c->anchor), its frames not yet
   * written, and whether it holds one of d->sync_serving. */
  uint8_t sync_kind;
  unsigned sync_slot;
  bool sync_replied;
  bool serving_sync;
  uint64_t sync_next, sync_end;
  unsigned sync_out;
  bool phase_open; /* SYNC, dialled: the stream is up (st__sync_on_open) */
  bool counted_active;
  uint64_t frames_out_pending; /* accepted by st__conn_send, not written */
  /* Frames of at least st__offload_bytes() are sealed and opened on libuv's
   * thread pool, one job per direction at a time, in order. */
  struct st__job_s* txq_head;
  struct st__job_s* txq_tail;
  bool tx_busy, rx_busy;
  /* rx_busy: the frame being opened is read in place in rbuf, whose first
   * rx_hold bytes (up to that frame's end) stay until the job is done. */
  size_t rx_hold;
  int jobs;        /* jobs in flight that point at this conn */
  bool paused;     /* reading stopped by the ring driver */
  bool in_process; /* inside process(): frames being dispatched */
  bool eof;        /* the peer closed; frames before it still pending */
  /* RING: the round this stream belongs to once it runs. An accepted lane
   * names its round, index and count in its first message (RING_LANE,
   * ring_lanes 0 until then); a segment that comes before its turn (or
   * before this node starts the round) is kept in ring_held and reading
   * pauses until it is fed. */
  uint64_t ring_round;
  uint64_t ring_lane_round;
  uint32_t ring_lane, ring_lanes;
  uint8_t* ring_held;
  size_t ring_held_len;
  /* COLL (dialled): frames waiting for the stream to come up. */
  struct st__coll_out_s* coll_out_head;
  struct st__coll_out_s* coll_out_tail;
  /* KEYS (dialled): the cluster request it carries and which of its
   * members it asks; NULL once the request is answered or over. */
  struct st__admin_op_s* admin_op;
  uint32_t admin_target;
};

/* ---- User collectives (daemon_coll.c, daemon_coll_session.c) ---------- */

/* Messages of the last ST__COLL_FINISHED operations are dropped quietly;
 * messages
 * for operations not started here are kept up to ST__COLL_PENDING_MAX
 * bytes, each at most ST__COLL_PENDING_MS. */
#define ST__COLL_FINISHED 256
/* The operation ids this node numbered last (st__coll_number): a frame for
 * one that no running operation takes is for an operation that ended here
 * (or never started: its start failed) and is dropped quietly, not kept.
 * Kept, a slow member's late HELLOs to an eager sender (a broadcast's
 * root, a push, a notify) more than ST__COLL_FINISHED calls ahead of it
 * would look to the crossed-call rule like calls never made here. An eager
 * sender may run this many calls ahead of a member; 128 KiB, scanned
 * (about 10 us) only for a frame of no running operation. A withdrawn
 * call's id leaves it with its number (daemon_coll.c, give_number_back). */
#define ST__COLL_NUMBERED 16384u
/* The calls on "all" that ended here last, with what they called: a
 * member's HELLO for one of them over another list (its view of "all"
 * differed) is answered with a COLL_ABORT naming both calls
 * (daemon_coll.c, late_hello). Such a HELLO comes within a call or two of
 * the others' on "all"; 64 (3 KiB) covers a member much further behind. */
#define ST__COLL_ENDED_ALL 64u
#define ST__COLL_PENDING_MAX (256u << 20)
#define ST__COLL_PENDING_MS 300000u
/* An operation that has heard nothing for this long fails as a mismatch
 * when a member it waits for has sent, as long ago, the HELLO of another
 * operation over another member list (daemon_coll.c, crossed_call). */
#define ST__COLL_CROSSED_MS 5000u
/* A large operation takes its next segment to a member only while fewer
 * than this many frames wait on the connection to it (16 MiB of 256 KiB
 * segments), and is taken up again when half of them have gone: memory
 * stays bounded whatever the operand's size (a broadcast's root, or a
 * fetch's publisher, has every segment ready at once). */
#define ST__COLL_PACE_FRAMES 64u
/* Sessions on the control socket at once, and the largest operand a
 * program may send (1 GiB; docs/collectives.md). */
#define ST__COLL_SESSIONS_MAX 16
#define ST__COLL_DATA_MAX (UINT64_C(1) << 30)
/* Distinct group keys a node numbers calls for (16 bytes each, kept for
 * its life): groups, and the names of push/pull and notify/wait, which are
 * meant to be reused, as MPI tags are. */
#define ST__COLL_MAX_KEYS 65536u
/* A push/pull or notify/wait name: 1 to this many bytes. */
#define ST__COLL_NAME_MAX 128u

typedef struct {
  uint64_t key, next;
} st__coll_seq_t;

/* A call on "all" that ended here: what its HELLO carried. */
typedef struct {
  uint64_t op_id, members_hash, count;
  uint32_t n, root;
  uint8_t kind, rop, dtype; /* st_coll_kind_t, _rop_t, _dtype_t */
} st__coll_ended_t;

/* A group frozen at a call: ids in rank order (sorted), this node's rank,
 * the hash every member checks, and the operation's id. */
typedef struct {
  st_node_id_t* ids;
  uint32_t n, rank;
  uint64_t members_hash, op_id;
  uint64_t key, seq; /* the group key's hash and this operation's number */
  uint64_t tag;      /* 0, or a key space of its own (st__coll_tag) */
  bool all;          /* the group "all" (its key), not a list */
} st__coll_group_t;

typedef struct st__coll_op_s {
  struct st__coll_op_s* next;
  struct st__coll_session_s* session;
  st__coll_group_t g;
  st_coll_kind_t kind;
  st_coll_rop_t rop;
  st_coll_dtype_t dtype;
  uint32_t root;
  uint64_t count;
  st_coll_t* m;
  uint64_t started_ms, deadline_ms; /* deadline 0: none */
  uint64_t heard_ms; /* its last message from a member (or its start) */
  bool withdrawn;    /* timed out having met nobody: its number given back */
  bool paced;        /* waits for a send queue to drain (op_drain) */
  bool no_result;    /* a push: the program gets no data back */
  int64_t shm_off;   /* the operand and result in the session's segment at
                        this offset; -1: on the socket */
  void* work;        /* with shm_off: the machine works there, in place */
  /* A fetch this node serves (daemon_store.c): the entry it sends, and no
   * session; NULL for a program's operation. */
  struct st__store_entry_s* serving;
  /* A program's fetch: the publisher refused it (st_coll_fetch_code_t;
   * 0: it did not). */
  bool fetch;
  uint8_t refused;
} st__coll_op_t;

/* Published tensors (daemon_store.c): at most this many names and bytes
 * kept; a fetch is refused as busy while more frames than this (segments
 * of 256 KiB: 256 MiB) wait to go to its member, or twice this to all; a
 * fetch still serving after ST__STORE_SERVE_MS fails. */
#define ST__STORE_MAX_NAMES 1024u
#define ST__STORE_MAX_BYTES (UINT64_C(1) << 30)
#define ST__STORE_QUEUED_FRAMES 1024u
#define ST__STORE_SERVE_MS 600000u

typedef struct {
  struct st__store_entry_s* entries;
  size_t n;
  uint64_t bytes;
} st__store_t;

typedef struct {
  st__coll_op_t* ops;
  struct st__coll_pend_s* pending;
  size_t pending_bytes;
  st__coll_seq_t* seqs; /* every group key used, with its call count */
  size_t n_seqs, cap_seqs;
  uint64_t finished[ST__COLL_FINISHED];
  size_t finished_at;
  uint64_t numbered[ST__COLL_NUMBERED]; /* 0: a free slot */
  size_t numbered_at;
  st__coll_ended_t ended_all[ST__COLL_ENDED_ALL]; /* op_id 0: free */
  size_t ended_all_at;
  uv_timer_t sweep;
  bool sweep_open;
  bool stopping; /* no new connections: the node is shutting down */
  struct st__coll_session_s* sessions;
  size_t n_sessions;
} st__coll_t;

/* SENDs kept for lanes not yet up: at most the round's in_flight. */
#define ST__RING_PENDING (2u * ST_RING_MAX_LANES)

/* Frames of at least this many bytes are sealed and opened on libuv's
 * thread pool instead of the loop thread: 64 KiB where the machine has 4
 * or more cores, 512 KiB where it has fewer. On few cores the pool's
 * threads only compete with the loops and the programs, and each hand-off
 * costs two wake-ups: sealing a 256 KiB collective segment on the loop
 * made 1 MiB all-reduces 13% and broadcasts 15% faster on 2 cores, 4
 * nodes (docs/benchmarks.md, "User collectives vs Gloo"). Decided once. */
size_t st__offload_bytes(void);

/* A duration histogram (Prometheus buckets): counts[i] observations in
 * (st__hist_bounds_s[i-1], st__hist_bounds_s[i]], counts[ST__HIST_BUCKETS]
 * those beyond the last bound. The bounds run from 5 ms (an exchange of a
 * small model on loopback) to 60 s (a ring round of a large model across
 * a WAN, or one that stalls to its timeout). */
#define ST__HIST_BUCKETS 13
extern const double st__hist_bounds_s[ST__HIST_BUCKETS];
typedef struct {
  uint64_t counts[ST__HIST_BUCKETS + 1];
  uint64_t count;
  double sum_s;
} st__hist_t;

/* daemon_metrics.c: counts one observation of `seconds`. */
void st__hist_observe(st__hist_t* h, double seconds);

typedef struct {
  uint64_t ok, failed, busy, dropped; /* exchanges (dropped: guard) */
  uint64_t checkpoints;     /* written (periodic, asked for, at leave) */
  uint64_t checkpoint_step; /* the step of the last one written */
  uint64_t by_result[ST_XCHG_RESULT_COUNT]; /* both roles */
  uint64_t fetches_ok;
  uint64_t clipped;            /* averaging exchanges whose pull we clipped */
  uint64_t ring_clipped;       /* ring rounds whose move we clipped */
  uint64_t ring_nonfinite;     /* ring results not applied: NaN or Inf */
  uint64_t fetch_step_refused; /* state transfers refused: the donor's step
                                  beyond st__robust_step_bound */
  uint64_t fetches_held;       /* of fetches_ok: the donor held this node's own
                                  seeded initialization, nothing was sent */
  /* Multi-donor sync (daemon_sync.c). Joiner: states taken from several
   * donors, falls back to one donor, manifests heard, chunks verified and
   * refused, donors dropped for a bad chunk or for going away. Donor:
   * manifests and chunks served, requests answered BUSY. */
  uint64_t sync_ok, sync_single, sync_manifests, sync_chunks_ok;
  uint64_t sync_chunks_bad, sync_donors_bad, sync_donors_lost, sync_disagreed;
  uint64_t sync_backoffs; /* waits before asking again (back_off) */
  uint64_t sync_served_manifests, sync_served_chunks, sync_refused;
  double exchange_ms_sum; /* successful averaging exchanges, connect to
                             done: the mean is sum / ok */
  double exchange_ms_last;
  uint64_t ring_ok, ring_aborted; /* ring rounds this node took part in */
  double ring_last_ms;
  uint32_t ring_last_n;
  uint64_t ring_last_round;
  bool ring_last_ok;
  bool ring_last_coded; /* the last round went coded (daemon_ring_coded.c) */
  uint64_t ring_lanes_refused;  /* ring lanes closed at once: not a round
                                   this node accepted or runs, or not from
                                   its previous member (st_ring_form_lane) */
  uint64_t bytes_in, bytes_out; /* TCP and UDP, on the wire */
  uint64_t packets_in, packets_out;
  uint64_t udp_unbound;   /* packets not bound to this node (dropped) */
  uint64_t udp_send_fail; /* sends the kernel refused */
  uint64_t conns_refused; /* connections closed for a limit */
  uint64_t peer_mismatch; /* handshake peer is not the node dialled */
  /* Admission (daemon_conn.c): accepted and closed because the address
   * held ST__PREAUTH_PER_ADDR pre-auth connections; pre-auth closed to
   * make room for a newer one; pre-auth closed at its deadline. */
  uint64_t conns_per_addr, conns_evicted, conns_hs_timeout;
  /* HS1s that passed their MAC but found no handshake token: closed
   * unanswered (a flood of valid or replayed HS1s). */
  uint64_t hs_busy;
  /* Closing, not drained within ST__CLOSE_DEADLINE_MS: aborted. */
  uint64_t conns_close_timeout;
  /* FETCHes that came while ST__FETCH_SERVE_MAX were served (busy). */
  uint64_t fetches_refused;
  /* User collectives: operations that succeeded and failed here, frames
   * dropped (undecodable, from outside the group, kept too long or past
   * the bound), bytes of their messages, sessions refused; operations
   * whose operand came through a session's shared segment, and sessions
   * that asked for one and were given none (the system refused). */
  uint64_t coll_ok, coll_failed, coll_dropped;
  uint64_t coll_bytes_in, coll_bytes_out;
  uint64_t coll_sessions_refused;
  uint64_t coll_shm_ops, coll_shm_failed;
  /* Published tensors (daemon_store.c): publishes, fetches served to the
   * end, and fetches refused: nothing under the name, or too many at
   * once. */
  uint64_t store_published, store_served, store_missing, store_busy;
  /* Compressed averaging (daemon_compress.c): anchors taken from ring
   * rounds, averaging exchanges that went compressed, and compressed
   * snapshots refused by the decoder, by reason (st_codec_drop_t). */
  uint64_t anchors, xchg_coded;
  uint64_t ring_coded; /* ring rounds that went coded and ended OK */
  /* The outer optimizer (daemon_outer.c): ring rounds (noloco: gossip
   * exchanges) that took an outer step, that started it (this node had no
   * anchor yet: the mean), and that it sat out (robust averaging clipped
   * the move); starts from DATA_DIR/outer.safetensors at a resume. */
  uint64_t outer_steps, outer_starts, outer_skipped, outer_resumed;
  uint64_t codec_drops[ST_CODEC_DROP_COUNT];
  /* Cluster requests from members (daemon_admin_net.c), by answer;
   * rejected: undecodable, or not from a live member (nothing answered). */
  uint64_t admin_granted, admin_already, admin_refused, admin_rejected;
  st__hist_t exchange_s; /* successful averaging exchanges, connect to done */
  st__hist_t ring_s[2];  /* ring rounds: [0] ok, [1] aborted */
} st__dcounters_t;

/* When this node last heard from each member (authenticated traffic). */
typedef struct {
  st_node_id_t id;
  uint64_t at_ms;   /* 0: never heard from */
  int logged_state; /* the state last logged, -1: none */
  bool used;
  uint32_t averaged; /* averaging exchanges with it that applied */
  uint32_t clipped;  /* of those, the ones whose pull we clipped */
  float suspicion;   /* robust averaging: a moving average (1/8) of "its
                        pull was beyond the bound"; 0 for a newcomer */
} st__heard_t;

#define ST__HEARD_SLOTS 1024
#define ST__MAX_CONNS 256
/* Admission (daemon_conn.c). An outsider can open connections that never
 * finish a handshake; these limits keep a flood of them from locking out
 * members. Pre-auth connections (accepted, handshake not done) take at
 * most half the table, so that authenticated connections and our own
 * dials always have the other half; when that half is full the oldest
 * pre-auth one is evicted for the newcomer, so that a member that retries
 * gets in (its handshake takes one round trip, an idle flood's never
 * ends). One address (an IPv6 /64) holds at most 16: a member's burst is a
 * ring round's lanes (up to ST_RING_MAX_LANES = 8) plus a push-pull and an
 * exchange, and loopback tests run several members on one address. Past a
 * quarter of the table in pre-auth, a new one has 1 s instead of 5 for its
 * handshake (a loopback handshake takes under a millisecond, one across
 * the world a few hundred). */
#define ST__PREAUTH_MAX (ST__MAX_CONNS / 2)
#define ST__PREAUTH_PER_ADDR 16u
#define ST__PREAUTH_PRESSURE (ST__MAX_CONNS / 4)
#define ST__PREAUTH_SHORT_DEADLINE_MS 1000u
/* A closing connection whose last frames a peer does not read is aborted
 * after this: what is left to write at close is an exchange's last chunk
 * and XCHG_DONE, a push-pull reply or a ring's last segments, each at most
 * ST_XCHG_CHUNKS_IN_FLIGHT MiB or so, which 5 s drain at 400 KB/s. */
#define ST__CLOSE_DEADLINE_MS 5000u
/* TCP_USER_TIMEOUT on node-to-node sockets: data unacknowledged, or a
 * zero window, for this long ends the connection in the kernel (Linux
 * acts at its next retransmission or window probe, so within about
 * 13 s). Every connection also has an application deadline; this one
 * catches a reader that stops while we write. */
#define ST__TCP_USER_TIMEOUT_MS 10000u
/* State transfers this node serves at once as donor; each holds a copy of
 * the parameters until it ends (the exchange's 30 s timeout, then
 * ST__CLOSE_DEADLINE_MS at most). More answer BUSY and the joiner tries
 * another member at its next sync tick. */
#define ST__FETCH_SERVE_MAX 2
/* Ranges of the agreed state a donor serves at once: each reads the
 * shared agreed state (no copy), so the bound is the link's, not memory. */
#define ST__SYNC_SERVE_MAX 8

struct st__daemon_s {
  const st_daemon_config_t* cfg;
  uv_loop_t loop;
  uv_udp_t udp;
  uv_tcp_t listener;
  uv_pipe_t control;
  uv_signal_t sigint, sigterm;
  uv_timer_t member_timer, gossip_timer, status_timer, sweep_timer, seed_timer,
      leave_timer, log_timer, ring_tick_timer, form_timer, ring_timer;
  uint64_t log_mark; /* --log-every N steps: the step / N last logged */
  bool log_mark_set;
  uv_async_t tt_async;
  bool control_open;

  char data_dir[512];
  int lock_fd; /* DATA_DIR/lock, held (flock) for the node's life; -1: not
                  taken */
  char control_path[600];
  char checkpoint_path[600];
  st_identity_t ident;
  st_keyring_t keys;
  st_allowlist_t* allow;
  st_replay_table_t* replay;
  st_packet_sealer_t sealer;
  uint32_t boot_epoch;
  st_crypto_counters_t cc;
  st_wire_counters_t wc; /* decode failures outside membership */
  /* While the membership machine is fed a push-pull request that came on
   * a connection: that connection, which its reply goes back on. */
  st__conn_t* pp_reply;
  uint8_t* rx_plain;    /* ST_FRAME_MAX_DEFAULT bytes: frames opened inline */
  char udp_rbuf[65536]; /* one received datagram */

  st_rng_t rng;
  st_membership_t* m;
  st_wire_addr_t self_addr;   /* bound (UDP and TCP) */
  st_wire_addr_t public_addr; /* what peers are told (choose_public_addr) */
  st_wire_addr_t advertise_addr;
  bool has_advertise; /* --advertise given */
  char self_addr_text[64];
  struct sockaddr_storage seeds[ST_DAEMON_MAX_SEEDS];
  st_wire_addr_t seed_addrs[ST_DAEMON_MAX_SEEDS];
  size_t n_seeds;
  double seed_backoff_s;
  uint64_t seed_retries;

  st_backend_t* be;
  st_data_t data;
  st_trainer_t trainer;
  bool trainer_ready;
  st__tt_t* tt;
  st_xchg_config_t xcfg;
  /* Robust averaging (daemon_xchg.c): the delta norms of the last
   * averaging exchanges, a ring; clip_n of them known. */
  double clip_norms[ST_XCHG_CLIP_HISTORY];
  uint32_t clip_n, clip_at;
  double clip_last; /* the bound the last exchange ran with (0: none) */
  /* The live members this node suspects (daemon_robust.c), counted after
   * each exchange; their suspicion is set aside while they are not fewer
   * than the members it trusts, itself included. */
  uint32_t suspects;
  bool suspicion_aside;
  st_xchg_local_t local; /* fingerprint, model, n_params, coded_bytes */
  /* The model-sized buffer of this node's exchanges (daemon_xchg.c), lent
   * to one machine at a time (its snapshot, or a joiner's incoming state)
   * and kept across them: no model-sized allocation, page faults or heap
   * growth per exchange. xbuf_n floats; NULL until the first. */
  float* xbuf;
  size_t xbuf_n;
  bool xbuf_held;              /* lent to a machine (its conn's holds_xbuf) */
  struct st__anchor_s* anchor; /* the agreed state (daemon_agreed.c) */
  /* Under --compress with the built-in trainer: the seeded
   * initialization, the same on every node of the model, as round 0's
   * vector: the anchor of compressed averaging until a ring round gives
   * one (daemon_compress.c, st__compress_anchor); released then. */
  struct st__anchor_s* start_anchor;
  /* With the built-in trainer: the BLAKE2b-256 of the seeded
   * initialization's float bytes and the id derived from it, so that a
   * FETCH between two nodes that both still hold it sends nothing
   * (daemon_xchg.c, st__xchg_mark_start; gossip.h, "held"). */
  bool start_known;
  uint8_t start_id[ST_XCHG_ANCHOR_BYTES];
  uint8_t start_hash[ST_HASH_BYTES];
  /* The outer optimizer (--outer; daemon_outer.c): the shared vector of
   * the last round and the momentum, n_params floats each once a round
   * has given one (NULL before); what this round moved the node to (the
   * new anchor or the mean), for the compression anchor at its end. */
  float* outer_anchor;
  float* outer_m;
  size_t outer_n;
  uint64_t outer_step; /* the trainer's step at the last round's APPLY */
  bool outer_saving;   /* a write of outer.safetensors runs on the pool */
  const float* ring_moved_to;
  uint64_t status_seq;

  st__dstate_t state;
  bool resumed; /* started from a checkpoint */
  bool synced;  /* has parameters of its own: checkpoint them at exit */
  uint64_t fetch_attempts;
  uint64_t sync_ticks;     /* st__xchg_sync_tick calls while syncing */
  uint64_t wait_logged_ms; /* last "waiting for N nodes" line */
  bool fetch_active;
  /* Multi-donor sync (daemon_sync.c): the joiner's, while it runs; a
   * donor's ranges served now; whether this joiner has fallen back to one
   * donor (FETCH). */
  struct st__sync_s* sync;
  uint32_t sync_serving;
  bool sync_single;
  /* Tests only: STARLING_FAULT_SYNC_CORRUPT set, this node corrupts the
   * chunks it serves (docs/security.md, "Multi-donor state sync"). */
  bool fault_sync_corrupt;
  bool fault_sync_manifest; /* STARLING_FAULT_SYNC_MANIFEST: a false one */
  int avg_active;           /* averaging exchanges in progress, either role */
  uint64_t next_conn_id;
  double hs_tokens;     /* HS1s that may be answered now (cfg handshake_rate) */
  uint64_t hs_token_ms; /* when hs_tokens was last refilled */
  st__conn_t* conns;
  size_t n_conns;
  /* Conns with preauth set; with released set (not yet freed); FETCH
   * responders holding a slot (serving_fetch). */
  size_t n_preauth, n_released;
  int fetch_serving;

  /* The ring all-reduce (daemon_ring.c). */
  st_ring_form_t* rf; /* NULL: rings off (--ring-every 0) */
  st_ring_t* ring;    /* the round's data plane, until the trainer is done
                         with its delta */
  /* A coded round's (daemon_ring_coded.c): the anchor it codes drifts
   * from (held until the machine is freed), and its codec. */
  struct st__anchor_s* ring_anchor;
  st_codec_spec_t ring_spec;
  st_ring_codec_t ring_codec;
  bool ring_done; /* the round ended (ring kept for the trainer) */
  uint64_t ring_round, ring_seq;
  uint32_t ring_n, ring_rank;
  st_node_id_t ring_members[ST_RING_FORM_MAX_MEMBERS];
  st_node_id_t ring_last_members[ST_RING_FORM_MAX_MEMBERS];
  uint64_t ring_started_ms;
  uint64_t ring_proposed_ms;   /* this node's last proposal (st__ring_tick) */
  uint64_t ring_proposed_step; /* the trainer's step then (--local-steps) */
  /* The final round: whether the running round started once this node's
   * epochs were done, and whether such a round, with every member that
   * could take part, has ended OK. Until one has, a done proposer proposes
   * one (ST__RING_FINAL_RETRY_MS): the agreed state then holds its last
   * steps and every member holds it. */
  bool ring_round_after_done;
  bool ring_final_ok;
  uint32_t ring_final_tries; /* final proposals made */
  int ring_tt_pending;
  double ring_segment_ms; /* measured, smoothed: for the stall timeout */
  /* The round's lanes (gossip.h, "Lane striping"): ring_stripe says which
   * of ring_next a send-stream segment goes on, and in what order those
   * coming on ring_prev (learnt from RING_LANE) are fed. */
  st_lanes_t ring_stripe;
  st__conn_t* ring_next[ST_RING_MAX_LANES];
  bool ring_next_ready[ST_RING_MAX_LANES];
  st__conn_t* ring_prev[ST_RING_MAX_LANES];
  struct {
    uint8_t* data;
    size_t len;
    uint32_t lane;
  } ring_pending[ST__RING_PENDING];
  uint32_t ring_pending_n;

  /* Attach mode (daemon_attach.c). */
  st_attach_model_t attach_model; /* n == 0 until a program or the
                                     checkpoint gives it */
  float* attach_params;           /* the starting state, until the host
                                     thread has its copy */
  char* attach_canon; /* attach_model's canonical text (local.tensors) */
  uint64_t attach_step;
  struct st__attach_s* attach; /* the program's session, or NULL */
  uint64_t attach_refused;     /* attach requests refused (bad input) */
  bool net_started;            /* sockets bound (st__daemon_start_node) */
  bool node_started;

  st__coll_t coll;
  st__store_t store;
  struct st__admin_op_s* admin_op; /* `starling keys --cluster` running */
  st__dcounters_t c;
  st__heard_t heard[ST__HEARD_SLOTS];
  uint64_t started_ms;
  int exit_code; /* set by a fatal condition (model mismatch) */
  char fatal[512];
  /* The control socket's clients (daemon_control.c), oldest first, and
   * what their limits did. */
  struct st__ctl_client_s* ctl_head;
  struct st__ctl_client_s* ctl_tail;
  size_t ctl_n;
  uv_timer_t ctl_timer; /* the request deadline's sweep */
  bool ctl_timer_open;
  uint64_t ctl_evicted;   /* idle clients closed to make room */
  uint64_t ctl_timed_out; /* clients closed at their deadline */
  uint64_t ctl_refused;   /* closed at once: every slot was answering */
  /* The Prometheus endpoint (daemon_metrics.c); NULL: --metrics not given.
   * metrics_addr: where it listens ("" when off), for status and logs. */
  struct st__metrics_s* metrics;
  char metrics_addr[64];
  /* Recent events and the monitors streaming them (daemon_events.c);
   * NULL until the first event or monitor. */
  struct st__events_s* events;
};

/* A figure for logs and tables: "-" while there is none (NaN: no step or
 * no evaluation yet; JSON gives null), else v with `decimals` decimals. */
typedef struct {
  char s[24];
} st__figure_t;
st__figure_t st__figure(double v, int decimals);

uint64_t st__dnow(const st__daemon_t* d);
void st__dlog(const st__daemon_t* d, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));
void st__dwarn(const st__daemon_t* d, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* daemon.c */
void st__daemon_leave(st__daemon_t* d, const char* why);
/* The node has parameters of its own (fresh, resumed or fetched): it
 * trains now, or waits in ST__D_WAITING until --min-nodes are alive. */
void st__daemon_synced(st__daemon_t* d);
void st__daemon_fatal(st__daemon_t* d, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Sockets, the model's thread, membership and the ring: at start-up, or in
 * attach mode when the first program brings the model. */
int st__daemon_start_node(st__daemon_t* d, char* err, size_t err_len);

/* daemon_attach.c */
/* Attach mode's start-up: the checkpoint, when there is one, gives the
 * model and the starting state. */
int st__attach_setup(st__daemon_t* d, char* err, size_t err_len);
/* True while the model is unknown: the node waits for a program. */
bool st__attach_waits_for_model(const st__daemon_t* d);
/* The control connection fd said "attach": the session takes it over (a
 * dup; the caller closes its own handle). */
void st__attach_takeover(st__daemon_t* d, int fd, bool early_bytes);
/* The node is ready to train (synchronized, --min-nodes alive): a program
 * waiting for its attach reply gets it. */
void st__attach_node_ready(st__daemon_t* d);
/* The cluster runs another model than the one the first program brought:
 * that program gets the refusal, naming the first differing tensor when
 * the peer sent its tensor list (NULL or 0: it did not), and the node then
 * stops with the same sentence. */
void st__attach_cluster_mismatch(st__daemon_t* d, const char* theirs,
                                 const char* their_tensors,
                                 size_t their_tensors_len);
/* Shut-down: closes the session's handle. */
void st__attach_close(st__daemon_t* d);
void st__attach_free(st__daemon_t* d);

/* daemon_coll.c: user collectives on the network. */
void st__coll_init(st__daemon_t* d);
/* Fails every operation ("the node is stopping"), ends the sessions, frees
 * what waits. */
void st__coll_close(st__daemon_t* d);
/* Freezes a group: ids[0..n) (all: every alive or suspected member and this
 * node, ids ignored), sorted, with this node's rank and the members' hash.
 * -EINVAL / -ENOENT with err naming the member at fault, -ENOMEM. */
int st__coll_group(st__daemon_t* d, const st_node_id_t* ids, size_t n, bool all,
                   st__coll_group_t* g, char* err, size_t err_len);
/* Takes the next operation number of g's key (its members, or "all", and
 * its tag) into g->op_id: only for an operation that starts (every member
 * counts the same calls). 0, -ENOSPC (ST__COLL_MAX_KEYS keys in use) or
 * -ENOMEM. */
int st__coll_number(st__daemon_t* d, st__coll_group_t* g);
/* A key space for st__coll_group_t.tag: calls with different tags are
 * numbered apart, so they never meet. space names the kind of call
 * ("push", "notify"), from its sender, name[0..len) the program's name. */
uint64_t st__coll_tag(const char* space, const st_node_id_t* from,
                      const char* name, size_t len);
void st__coll_group_free(st__coll_group_t* g);
/* Starts op (its group, kind, rop, dtype, root, count and deadline set;
 * input: count elements) and feeds it what came early. Its end reaches
 * st__coll_session_done. */
int st__coll_start(st__daemon_t* d, st__coll_op_t* op, const void* input);
/* A message for op from member `from`; true when op ended (and is freed). */
bool st__coll_feed(st__daemon_t* d, st__coll_op_t* op, const st_node_id_t* from,
                   const uint8_t* data, size_t len);
/* Ends op as failed (its program went away). */
void st__coll_abort_op(st__daemon_t* d, st__coll_op_t* op, const char* why);
/* Late HELLOs (docs/protocol.md, "User collectives", Failure): whether
 * this node numbered op_id among its last ST__COLL_NUMBERED calls; op, a
 * call on "all" that ended here, into the ring of those; and whether the
 * HELLO h from member `from` is for such a call over another list, with
 * the COLL_ABORT's sentence naming both calls into text (false: not one). */
bool st__coll_was_numbered(const st__coll_t* c, uint64_t op_id);
void st__coll_remember_all(st__coll_t* c, const st__coll_op_t* op);
bool st__coll_late_hello(const st__coll_t* c, const st_node_id_t* from,
                         const st_msg_coll_hello_t* h, char* text, size_t len);
/* COLL connections' callbacks. */
int st__coll_on_open(st__conn_t* c);
/* A frame on a COLL connection was written: paced operations go on once
 * its member's queue has half drained. */
void st__coll_on_sent(st__conn_t* c);
void st__coll_on_frame(st__conn_t* c, const uint8_t* msg, size_t len);
void st__coll_on_closed(st__conn_t* c);
/* Member id died (left: it said so): its operations fail, its connections
 * close. */
void st__coll_on_member_gone(st__daemon_t* d, const st_node_id_t* id,
                             bool left);

/* Sends msg to member id on the COLL connection to it (dialled when
 * there is none). 0, or -errno. */
int st__coll_send_msg(st__daemon_t* d, const st_node_id_t* id,
                      const st_msg_t* msg);

/* Frames accepted for the COLL connection dialled to member id (NULL: to
 * every member) and not written yet. */
uint64_t st__coll_frames_queued(st__daemon_t* d, const st_node_id_t* id);

/* daemon_store.c: published tensors, and serving fetches of them. */
/* Keeps a copy of data (count elements of dtype) under name, replacing
 * what was there (fetches in progress finish with the old bytes); its
 * version (1, 2, ... per name) into *version. -ENOSPC past the bounds,
 * -ENOMEM; err says which. */
int st__store_publish(st__daemon_t* d, const char* name, size_t len,
                      st_coll_dtype_t dtype, uint64_t count, const void* data,
                      uint64_t* version, char* err, size_t err_len);
/* Forgets name: 0, or -ENOENT when nothing is published under it. */
int st__store_unpublish(st__daemon_t* d, const char* name, size_t len);
/* An ASK from c's member for an op id no operation here uses: serves it
 * (a broadcast rooted here; 0), or refuses it (COLL_FETCH MISSING or
 * BUSY) or drops it (the asker is no alive member; out of memory): 1. */
int st__store_on_ask(st__conn_t* c, const st_msg_coll_fetch_t* f);
/* A served fetch ended (op->serving set): frees op. */
void st__store_served(st__daemon_t* d, st__coll_op_t* op,
                      st_coll_result_t result);
/* Frees every entry (after every operation has ended). */
void st__store_close(st__daemon_t* d);

/* daemon_coll_session.c: the programs' side. */
/* The control connection fd said "collectives" (shm: "collectives shm",
 * which asks for the shared segment): a session takes it over (a dup; the
 * caller closes its own handle). */
void st__coll_takeover(st__daemon_t* d, int fd, bool early_bytes, bool shm);
/* op ended (removed from the running list): its session answers the
 * program and frees op. msg: "" on success, else the sentence. */
void st__coll_session_done(st__coll_op_t* op, st_coll_result_t result,
                           const char* msg);
void st__coll_sessions_close(st__daemon_t* d);

/* daemon.c: signs and gossips this node's STATUS now (step, figures,
 * fingerprint, ring capability, synced, keys), as the status timer does
 * each period. */
void st__status_publish(st__daemon_t* d);

/* A refusal answered on the control socket: "error: SENTENCE\n", or
 * {"error":"SENTENCE"} with json (what the CLI takes for exit status 1). */
void st__put_error(st_json_buf_t* b, bool json, const char* err);

/* daemon_keys.c: "keys [install /PATH | use ID | remove ID]" from the
 * control socket (args: the request after "keys"); the answer into b. */
void st__keys_request(st__daemon_t* d, char* args, bool json, st_json_buf_t* b);
/* The request after "keys" (and after "keys cluster"): 1 for a listing,
 * 0 with *q filled (an install's key file read; wipe q after use), or a
 * negative errno with the sentence in err. Strips a trailing " json". */
int st__keys_parse(char* args, st_msg_admin_req_t* q, char* err,
                   size_t err_len);
/* A cluster key request (from a member, or this node's own under
 * `starling keys --cluster`) under the cluster rule (daemon_keys.c's
 * header): applies it, or leaves everything as it was and says why in
 * err. asked_by names the asker in the log. */
st_admin_result_t st__keys_grant(st__daemon_t* d, const st_msg_admin_req_t* q,
                                 const char* asked_by, char* err,
                                 size_t err_len);

/* daemon_force_leave.c: "force-leave ID" from the control socket. */
void st__force_leave_request(st__daemon_t* d, char* args, bool json,
                             st_json_buf_t* b);
/* ID (4 to 32 hex digits; a trailing " json" stripped) to the one member
 * it names, held or kept for reconnect attempts: 0, or a negative errno
 * with the sentence in err. */
int st__force_leave_resolve(st__daemon_t* d, char* args, st_node_id_t* out,
                            char* err, size_t err_len);
/* Forgets member id if it failed (the rule: never one alive or suspect
 * here): DONE, ALREADY (not known here), or REFUSED with err. */
st_admin_result_t st__force_leave_grant(st__daemon_t* d, const st_node_id_t* id,
                                        const char* asked_by, char* err,
                                        size_t err_len);

/* daemon_admin_net.c: cluster requests (`--cluster`). The control
 * client's fd (dup'd here) gets the answer once every live member answered
 * or the deadline passed. verb "keys" with args "install /PATH", "use ID"
 * or "remove ID"; verb "force-leave" with args "ID". */
void st__admin_cluster_takeover(st__daemon_t* d, int fd, const char* verb,
                                char* args, bool json);
int st__admin_on_open(st__conn_t* c);
void st__admin_on_frame(st__conn_t* c, const uint8_t* msg, size_t len);
void st__admin_on_closed(st__conn_t* c);
void st__admin_sweep(st__daemon_t* d); /* the request's deadline */
void st__admin_close(st__daemon_t* d); /* stopping: answer what we have */

/* daemon_agreed.c: the agreed state, the vector the last ring round
 * moved every member to, bit for bit: the anchor of compressed averaging
 * and the state joiners fetch from several donors (daemon_sync.c).
 * Immutable once made; shared by reference, since a round may end while
 * an exchange or a transfer reads it. */
typedef struct st__sync_s st__sync_t; /* daemon_sync.c */
typedef struct st__anchor_s {
  uint32_t refs;
  uint8_t id[ST_XCHG_ANCHOR_BYTES]; /* st__agreed_id of round, n, v, made
                                       when first asked for (id_made) */
  bool id_made;
  uint64_t round;
  size_t n;
  uint8_t* hashes; /* the manifest: one hash per chunk, made when first
                      asked for (st__agreed_hashes); NULL until then */
  float v[];
} st__anchor_t;
/* A state of n floats (uninitialised), one reference, no id yet; NULL
 * when it cannot be allocated. */
st__anchor_t* st__anchor_new(size_t n);
st__anchor_t* st__anchor_ref(st__anchor_t* a);
void st__anchor_release(st__anchor_t* a); /* NULL: nothing */
/* d's agreed state becomes a (its reference is d's now). */
void st__agreed_take(st__daemon_t* d, st__anchor_t* a);
/* A ring round this node took part in ended OK, moving it to v[0..n):
 * the new agreed state (copied; its id made when first asked for); said
 * and dropped when it cannot be allocated. */
void st__agreed_ring_done(st__daemon_t* d, const float* v, size_t n,
                          uint64_t round_id);
/* The id of state v[0..n) from round round_id (docs/protocol.md): the
 * first 16 bytes of BLAKE2b-256("starling-anchor-v1", round, n, v), a
 * first byte of 0 written as 1 (all zero is "none"). */
void st__agreed_id(const float* v, size_t n, uint64_t round_id,
                   uint8_t id[ST_XCHG_ANCHOR_BYTES]);
/* a's id, made on the first call (a pass of BLAKE2b over the state, on
 * the loop thread: a cluster that neither compresses nor has joiners, and
 * nobody reading its status, never pays for it). */
const uint8_t* st__agreed_id_of(st__anchor_t* a);
/* a's manifest (st_sync_chunks(n) hashes of ST_SYNC_HASH_BYTES), made on
 * the first call; NULL when it cannot be allocated. */
const uint8_t* st__agreed_hashes(st__anchor_t* a);

/* daemon_compress.c: compressed averaging (--compress). */
/* Whether the node runs a codec (--compress other than none). */
bool st__compress_on(const st__daemon_t* d);
/* The anchor compressed averaging codes drifts from: the agreed state,
 * or before any ring round the start anchor; NULL when neither (or not
 * of this model's size). */
struct st__anchor_s* st__compress_anchor(const st__daemon_t* d);
/* Keeps the built-in trainer's initialization (params[0..n), on be) as
 * the start anchor under --compress; nothing otherwise. Said and skipped
 * when it cannot be allocated. */
void st__compress_start_anchor(st__daemon_t* d, const float* params, size_t n);
/* Mixes the codec into d->local's fingerprint and names it in its model
 * description (" compress=int8"), so that nodes of other settings refuse
 * each other naming both. Call once, after the model's fingerprint. */
void st__compress_mark_model(const st__daemon_t* d);

/* daemon_ring_coded.c: coded ring rounds under --compress (gossip.h,
 * "Coded rounds"; docs/compression.md, "The ring"). */
/* Gives ring formation this node's tag: its anchor's id while it trains
 * under --compress, else none (at rest, rounds go float32, so that the
 * nodes end bit for bit alike). Called before every formation event. */
void st__ring_coded_tag(st__daemon_t* d);
/* For a round whose START named tag: a coded config (cfg->codec and
 * cfg->base, the anchor held in d->ring_anchor) when tag is this node's
 * anchor's id; nothing for no tag; -ESTALE when it names another (this
 * node took another anchor since its ACCEPT: it cannot start). */
int st__ring_coded_config(st__daemon_t* d, const uint8_t* tag,
                          st_ring_config_t* cfg);
/* Lets go of the round's anchor (the machine is freed). */
void st__ring_coded_release(st__daemon_t* d);
/* A coded round's decoder (st_ring_codec_t.decode, ctx the daemon):
 * st_codec_decode with d->ring_spec, a refused segment counted by reason
 * in d->c.codec_drops (compression.dropped), as exchanges count theirs;
 * the ring machine then fails the round. On the loop thread. */
int st__ring_codec_decode(void* ctx, const uint8_t* in, size_t len, float* out,
                          size_t n);
/* d->local.coded_bytes from the codec and d->local.n_params. */
void st__compress_sized(st__daemon_t* d);
/* Mixes a setting every node must share into d->local's fingerprint
 * (BLAKE2b-256 of domain, the fingerprint and value, cut to 16 bytes) and
 * names it in the model description (" key=value"), cutting the model's
 * text to make room. Call after the model's fingerprint. */
void st__mark_setting(const st__daemon_t* d, const char* domain,
                      const char* key, const char* value);
/* ": the cluster's nodes run --compress X, this node --compress Y" (or
 * the same of --outer) for the first setting the model descriptions
 * theirs and ours name differently (none when one names none); ""
 * otherwise. */
void st__compress_mismatch(const char* theirs, const char* ours, char* out,
                           size_t out_len);
/* ---- The outer optimizer (daemon_outer.c) ---- */
/* Whether the node runs one (--outer other than none). */
bool st__outer_on(const st__daemon_t* d);
/* Mixes --outer into the fingerprint and the model description
 * (" outer=nesterov:0.7:0.9"); nothing for none. After the codec's. */
void st__outer_mark_model(const st__daemon_t* d);
/* A ring round's APPLY whose move robust averaging let through whole:
 * delta (mean - own, the round's buffer) becomes new anchor - own by the
 * outer step, or stays for this node's first round (which takes the mean
 * as its anchor, momentum 0) and for a node that took no step since its
 * last round (at rest: the mean). Sets d->ring_moved_to. Nothing without
 * --outer, or when the state cannot be allocated (said, and the round is
 * plain averaging). */
void st__outer_ring_apply(st__daemon_t* d, float* delta, const float* mean,
                          size_t n);
/* --outer noloco: rewrites a gossip exchange's delta (pairwise mean -
 * own, own the snapshot it was computed from, uncompressed) to the outer
 * step's new anchor - own, or leaves it for the first exchange (which
 * takes the mean as the anchor) and while the trainer is at rest. Nothing
 * for another setting. */
void st__outer_xchg_apply(st__daemon_t* d, float* delta, const float* own,
                          size_t n);
/* A round whose move robust averaging clipped: no outer step (counted). */
void st__outer_ring_skipped(st__daemon_t* d);
void st__outer_free(st__daemon_t* d);
/* daemon_outer_state.c: the state across restarts. Writes the anchor and
 * momentum to DATA_DIR/outer.safetensors (atomic; nothing when there is
 * no state): now, or on the thread pool from a copy (skipped while one
 * such write runs). 0, or -errno after a warning. */
int st__outer_save(st__daemon_t* d, bool now);
/* At a resume from the checkpoint (d->local's model known): takes the
 * state from that file when it was written under this setting and model,
 * else warns naming the file and why and leaves the state to start at
 * the next round. */
void st__outer_resume(st__daemon_t* d);

/* Names the current anchor in l (all zero when none) and has c hold it. */
void st__compress_fill(st__daemon_t* d, st__conn_t* c, st_xchg_local_t* l);
/* Runs an ENCODE (c's snapshot minus its anchor, encoded, decoded back
 * over the machine's buffer) or a DECODE (the peer's bytes; a refusal
 * counted by reason) of c's exchange on libuv's thread pool, holding c
 * meanwhile; the result goes to st__xchg_codec_done on the loop thread
 * (at once when the job cannot be queued). */
void st__compress_submit(st__conn_t* c, const st_xact_t* a);

/* daemon_robust.c: how far a peer may move this node's model. */
/* The exchange configuration for connection c (its peer's bound); notes
 * the bound on c for st__robust_record. */
st_xchg_config_t st__robust_xchg_config(st__conn_t* c);
/* An averaging exchange on c applied (DONE OK): history, suspicion,
 * counters. */
void st__robust_record(st__conn_t* c, const st_xact_t* done);
/* Whether this node averages with member id in rings (not a suspect, or
 * suspicion set aside). */
bool st__robust_trusts(const st__daemon_t* d, const st_node_id_t* id);
/* Whether suspects among `others` live members (this node not counted)
 * are a minority that suspicion may act on: fewer than the members trusted,
 * this node included. */
bool st__robust_minority(size_t others, size_t suspects);
/* Recounts the suspects among the members this node averages with, and
 * whether their suspicion holds: after every exchange and at every gossip
 * tick (members come and go between exchanges). */
void st__robust_refresh(st__daemon_t* d);
/* The factor (at most 1) that a ring round's move delta[0..n) is applied
 * with: the gossip bound over its norm when longer (counted); 0 when the
 * move is not finite (counted: nothing is applied). */
float st__robust_ring_scale(st__daemon_t* d, const float* delta, size_t n);
/* The highest step a joiner believes: 4 times the lower median of steps[]
 * plus 100,000 (saturating; UINT64_MAX when n is 0: nothing to compare). */
uint64_t st__robust_step_bound_of(const uint64_t* steps, size_t n);
/* The same over the steps the live members report in their status records,
 * this node, `except` (NULL: none) and members at step 0 left out. */
uint64_t st__robust_step_bound(const st__daemon_t* d,
                               const st_node_id_t* except);

/* daemon_state.c */
/* The data directory's paths (checkpoint, control socket) into d. */
void st__state_paths(st__daemon_t* d);
/* Makes the data directory, refuses one a running node uses, loads or
 * makes the identity and raises the boot epoch. */
int st__state_prepare(st__daemon_t* d, char* err, size_t err_len);
/* st__state_prepare's refusal is the directory's lock (DATA_DIR/lock, with
 * the holder's PID), taken before anything is written there; it also
 * removes the temporary files an interrupted write left. d->lock_fd must
 * be -1 before. This lets go of the lock (at exit, after the last write). */
void st__state_release(st__daemon_t* d);
/* Seconds from the Unix epoch to 2024-01-01T00:00:00Z, where the clock's
 * part of a boot epoch starts: 32 bits last until 2160. */
#define ST__BOOT_EPOCH_ORIGIN_S 1704067200
/* The boot epoch after prev (0: none known) at Unix time unix_now_s:
 * max(prev + 1, seconds since ST__BOOT_EPOCH_ORIGIN_S), so that an epoch
 * file lost or restored from a backup still moves forward. -EOVERFLOW
 * when prev leaves no larger 32-bit epoch. */
int st__boot_epoch_next(uint64_t prev, int64_t unix_now_s, uint32_t* next);
void st__model_fingerprint(const st_model_spec_t* spec, uint8_t fp[16],
                           char* desc, size_t desc_len);
int st__addr_parse(const char* text, struct sockaddr_storage* ss,
                   st_wire_addr_t* wa, char* err, size_t err_len);
void st__addr_to_sockaddr(const st_wire_addr_t* wa,
                          struct sockaddr_storage* ss);
void st__addr_from_sockaddr(const struct sockaddr* sa, st_wire_addr_t* wa);
void st__addr_format(const st_wire_addr_t* wa, char* buf, size_t len);

/* daemon_net.c */
int st__net_start(st__daemon_t* d, char* err, size_t err_len);
void st__net_drain(st__daemon_t* d);
void st__net_heard(st__daemon_t* d, const st_node_id_t* id);
uint64_t st__net_last_heard(const st__daemon_t* d, const st_node_id_t* id);
/* The member's slot (made when new), or NULL when the table is full. */
st__heard_t* st__net_heard_slot(st__daemon_t* d, const st_node_id_t* id);
/* The member's slot when it has one, else NULL. */
const st__heard_t* st__net_heard_find(const st__daemon_t* d,
                                      const st_node_id_t* id);

/* daemon_conn.c */
int st__conn_listen(st__daemon_t* d, char* err, size_t err_len);
/* Dials addr (expected: the node's id, or NULL for a seed). */
st__conn_t* st__conn_dial(st__daemon_t* d, const st_wire_addr_t* addr,
                          const st_node_id_t* expected,
                          st__conn_purpose_t purpose);
/* Seals msg as one frame and queues it; xchg_ack: report the write to the
 * connection's exchange machine (st_xchg_sent). */
int st__conn_send(st__conn_t* c, const uint8_t* msg, size_t len, bool xchg_ack);
/* As st__conn_send, taking msg (from malloc) instead of copying it: a
 * frame sealed on the pool is sealed from it, and it is freed once sealed
 * (on failure too). */
int st__conn_send_taken(st__conn_t* c, uint8_t* msg, size_t len, bool xchg_ack);
/* Closes after the queued frames are written. */
void st__conn_close(st__conn_t* c);
/* Closes at once with a reset, by its owner (which is not told): what is
 * queued, here and in the kernel, is dropped. For a purpose that failed
 * for cause, such as a peer too slow to take an exchange in its time. */
void st__conn_close_reset(st__conn_t* c);
/* The trainer is done with a request that borrowed from c (its snapshot
 * buffer or its exchange's delta): frees c when it is closed. */
void st__conn_release(st__conn_t* c);
/* The purpose of c (ST__CONN_UNKNOWN when it has none). */
st__conn_purpose_t st__conn_purpose(const st__conn_t* c);
/* The callbacks of a purpose the dialler names (NULL for UNKNOWN). */
const st__conn_ops_t* st__conn_ops_of(st__conn_purpose_t purpose);
/* The accepting side: sets c->ops from the type of the first message msg.
 * Returns 0, -EBADMSG (it does not decode) or -EPROTO (no purpose starts
 * with that message). */
int st__conn_learn_purpose(st__conn_t* c, const uint8_t* msg, size_t len);
void st__conn_sweep(st__daemon_t* d);
st__conn_t* st__conn_find(st__daemon_t* d, uint64_t id);

/* daemon_xchg.c */
void st__xchg_on_ready(st__conn_t* c); /* initiator up */
void st__xchg_on_message(st__conn_t* c, const uint8_t* msg, size_t len);
void st__xchg_on_closed(st__conn_t* c);
void st__xchg_on_sent(st__conn_t* c);
/* Once c's exchange has ended and neither the trainer nor a pool job
 * borrows its buffers (the snapshot written, the delta added): the
 * buffers are freed and the node's slot for it is free again, so that a
 * node holds one exchange's buffers at a time (a connection still closing
 * held a second copy of the model while the next exchange began). */
void st__xchg_settle(st__conn_t* c);
/* c is being freed: the node's exchange buffer and its slot for c's
 * exchange are given back if c still held them (a connection closed
 * without its exchange ending, as when sealing a frame failed). */
void st__xchg_conn_freed(st__conn_t* c);
void st__xchg_on_tt_event(st__daemon_t* d, const st__tt_event_t* ev);
/* An ENCODE (decode false) or DECODE of c's exchange finished with rc
 * (and, for a refused DECODE, the codec's reason). */
void st__xchg_codec_done(st__conn_t* c, bool decode, int rc, int reason);
void st__xchg_gossip_tick(st__daemon_t* d);
void st__xchg_sync_tick(st__daemon_t* d);
/* Notes params[0..n) (on d->be), the built-in trainer's seeded
 * initialization, as d's start state (id and hash), for FETCHes that
 * find both sides holding it. Skipped, and said, when the host copy
 * cannot be allocated. */
void st__xchg_mark_start(st__daemon_t* d, const float* params, size_t n);
/* daemon_sync.c: multi-donor state sync. The joiner's tick while it syncs
 * (from st__xchg_sync_tick): true when it is handled here, false when the
 * joiner has fallen back to one donor (FETCH). */
bool st__sync_tick(st__daemon_t* d);
/* The conn purpose's callbacks (daemon_conn_purpose.c). */
int st__sync_on_open(st__conn_t* c);
void st__sync_on_frame(st__conn_t* c, const uint8_t* msg, size_t len);
void st__sync_on_sent(st__conn_t* c);
void st__sync_on_closed(st__conn_t* c);
/* Frees the joiner's sync (stopping, or synced another way). */
void st__sync_free(st__daemon_t* d);
void st__xchg_sweep(st__daemon_t* d);

/* daemon_net.c: one sealed UDP packet to a member. */
void st__net_send_to(st__daemon_t* d, const st_wire_addr_t* addr,
                     const st_node_id_t* to, const uint8_t* data, size_t len);

/* daemon_conn.c: reading paused and resumed (the ring driver). */
void st__conn_pause(st__conn_t* c);
void st__conn_resume(st__conn_t* c);

/* daemon_ring.c */
/* Sizes libuv's thread pool for --ring-lanes (before any thread starts). */
void st__ring_size_pool(st__daemon_t* d);
int st__ring_start(st__daemon_t* d);
void st__ring_close(st__daemon_t* d);
void st__ring_free(st__daemon_t* d);
/* Every st__ring_tick_every_s seconds: the smallest free member proposes a
 * ring, at most every --ring-every, except that under --compress a node
 * without an anchor proposes at every tick (so that compressed averaging
 * starts within seconds of a start, not at the first --ring-every). */
void st__ring_tick(st__daemon_t* d);
/* --ring-every, or under --compress at most ST__RING_ANCHOR_TICK_S, or
 * with --local-steps ST__RING_STEP_TICK_S. */
double st__ring_tick_every_s(const st__daemon_t* d);
#define ST__RING_ANCHOR_TICK_S 1.0
#define ST__RING_STEP_TICK_S 0.05
/* A done node that has not yet had its final round (ring_final_ok: one
 * that started after its epochs and held every member that can take part)
 * proposes one at most this often, at most ST__RING_FINAL_TRIES times: a
 * proposal that loses a race or finds candidates busy is tried again. */
#define ST__RING_FINAL_RETRY_MS 1000u
#define ST__RING_FINAL_TRIES 10u
/* Whether this node takes part in ring rounds (--ring-every or
 * --local-steps). */
bool st__ring_on(const st__daemon_t* d);
void st__ring_drain_form(st__daemon_t* d);
void st__ring_timer_cb(uv_timer_t* t);
void st__ring_on_packet(st__daemon_t* d, const st_node_id_t* from,
                        const uint8_t* data, size_t len);
void st__ring_on_ready(st__conn_t* c);
void st__ring_on_message(st__conn_t* c, const uint8_t* msg, size_t len);
void st__ring_on_sent(st__conn_t* c);
void st__ring_on_closed(st__conn_t* c);
void st__ring_on_member_gone(st__daemon_t* d, const st_node_id_t* id);
/* true when the event was the ring's */
bool st__ring_on_tt_event(st__daemon_t* d, const st__tt_event_t* ev);

/* daemon_metrics.c: the Prometheus endpoint (--metrics). */
/* Parses cfg->metrics ("PORT" or "HOST:PORT"; a bare port is on 127.0.0.1)
 * into ss, or says in err what is wrong with it. */
int st__metrics_parse(const char* text, struct sockaddr_storage* ss, char* err,
                      size_t err_len);
/* With --metrics: binds its address, starts the HTTP thread and the
 * loop's render timer, fills d->metrics_addr and logs it. Without: 0 and
 * nothing. A bind that fails (address in use, not local) returns a
 * negative errno with err naming the address and what to do. */
int st__metrics_start(st__daemon_t* d, char* err, size_t err_len);
/* Leave: stops the HTTP thread (joined) and closes the render timer. Safe
 * to call twice and without st__metrics_start. */
void st__metrics_close(st__daemon_t* d);
/* Frees what st__metrics_start made (stopping the thread first if
 * st__metrics_close has not); the timer handle must be closed by then. */
void st__metrics_free(st__daemon_t* d);

/* daemon_control.c */
int st__control_start(st__daemon_t* d, char* err, size_t err_len);
void st__control_close(st__daemon_t* d);

/* daemon_events.c: events for `starling monitor`. */
/* Records one event (type: "member", "exchange", "ring", "rejected") and
 * sends it to every monitor; fmt as printf, cut at 199 bytes. */
void st__event(st__daemon_t* d, const char* type, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Once a second: one "rejected" event with what the refusal counters
 * gained since the last tick, by reason, when any did. */
void st__events_tick(st__daemon_t* d);
/* A control client that asked "monitor" (fd borrowed; the events module
 * keeps a duplicate): the events kept, then each new one, as lines or JSON
 * objects. Refused with an "error: ..." line beyond 8 monitors. */
void st__events_takeover(st__daemon_t* d, int fd, bool json);
/* Closes every monitor (at the leave); st__events_free frees the rest once
 * the loop has ended. */
void st__events_close(st__daemon_t* d);
void st__events_free(st__daemon_t* d);
/* 1 when a node answers on the control socket at path. */
int st__control_in_use(const char* path);

#endif
