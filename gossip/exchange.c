/* exchange.c: the exchange machine (gossip.h, "Exchanges"): pairwise
 * gossip averaging (AD-PSGD, Lian et al., ICML 2018) and state transfer to
 * a joining node, over one encrypted TCP stream, sans-IO.
 *
 * Words: a snapshot is one side's n_params float32 parameters; it travels
 * as chunks (TENSOR_CHUNK messages) of at most ST_WIRE_CHUNK_MAX_BYTES,
 * i.e. CHUNK_FLOATS floats, in order, then an XCHG_DONE message carrying
 * the BLAKE2b-256 of the little-endian float bytes of all chunks for a
 * FETCH (a joining node verifies the state it starts from end to end, as
 * a file is checked against its digest), and 32 zero bytes for an
 * AVERAGE, where the hash is not computed: the stream (crypto/stream.c)
 * already authenticates every frame and its place in the stream, and the
 * offsets and the total are checked here, so the hash only added a second
 * pass over 2 x 4 bytes a parameter on the loop thread (about a fifth of
 * an exchange's time for a 10M-parameter model; docs/benchmarks.md).
 *
 * The conversation, after the handshake:
 *
 *   initiator                               responder
 *   XCHG_REQ [kind, fingerprint, model, n_params, step]  ->
 *          <-  XCHG_REPLY [status, fingerprint, model, n_params, step]
 *   AVERAGE:  chunks..., XCHG_DONE  <->  chunks..., XCHG_DONE (both ways
 *             at once; each side starts once the REPLY is OK and its
 *             snapshot is there; compressed: XCHG_CODED pieces instead of
 *             chunks, once its snapshot is encoded)
 *   FETCH:                   <-  chunks..., XCHG_DONE (the donor's)
 *
 * Decisions the header leaves to this file:
 *
 * - The responder answers, checking in this order: a fingerprint that is
 *   not its own -> MISMATCH; it has no parameters (local n_params 0) ->
 *   NOT_READY, so that a node still without a model is not reported as
 *   another model; another n_params -> MISMATCH; busy -> BUSY; its buffers
 *   cannot be allocated -> BUSY (it cannot take part now; the initiator
 *   tries another). Every REPLY carries the responder's own fingerprint,
 *   model, n_params and local->step, and a MISMATCH one its tensor list
 *   (local->tensors, when it has one). Then it finishes with DONE(that
 *   status), peer_model = the requester's model; or, on OK, it asks for a
 *   snapshot (WANT_SNAPSHOT) and streams it.
 * - FETCH: the donor's step is local->step as sent in its REPLY (the
 *   reply goes first, the snapshot is taken after), so the joiner's step
 *   can be behind the parameters it receives by the few steps the donor
 *   took in between; the step given with st_xchg_snapshot is not sent.
 * - The initiator, on a REPLY: BUSY, NOT_READY -> DONE with that result;
 *   MISMATCH, or an OK whose fingerprint or n_params is not ours ->
 *   DONE(MISMATCH, peer_model = the responder's model; peer_tensors = the
 *   tensor list a MISMATCH REPLY carried, unchecked).
 * - Receiving: chunks have transfer_id 0 (one snapshot a direction per
 *   connection); each must start where the last ended (offset == floats
 *   received so far) and hold at least one float, else FAIL_PROTOCOL; its
 *   total must equal n_params, else FAIL_SIZE. An XCHG_DONE before all
 *   floats came is FAIL_SIZE. On XCHG_DONE the checks run in this order:
 *   hash (FETCH only: FAIL_HASH), NaN or Inf (FAIL_NONFINITE), then, for
 * AVERAGE, once our own snapshot is there too, the norm: |peer| > norm_mult *
 * (|own| + 1) is FAIL_NORM (L2 norms in double); and a delta that comes
 * out NaN or Inf (our own snapshot held one, or peer - own overflowed) is
 * FAIL_NONFINITE, with nothing applied.
 * - Finishing: AVERAGE emits APPLY (delta = (peer - own) / 2 computed in
 *   float, so the two sides' deltas are exact negatives of each other,
 *   unless one side clips: a delta whose L2 norm exceeds the bound,
 *   max(cfg.clip_norm, cfg.clip_rel * (|own| + 1)) * cfg.clip_scale, is
 *   scaled to it, and DONE says so with the norm before) and
 *   DONE(OK) once the peer's snapshot is verified AND our own snapshot has
 *   been sent: all chunks and our XCHG_DONE emitted and acknowledged with
 *   st_xchg_sent. The FETCH donor finishes DONE(OK) once its XCHG_DONE is
 *   acknowledged; the joiner emits APPLY (the donor's parameters and step)
 *   and DONE(OK) after verification.
 * - Any message that does not decode, or of a type or at a moment the
 *   conversation does not expect, is FAIL_PROTOCOL; failures tell the peer
 *   nothing (it sees the connection close: FAIL_CLOSED) and drop whatever
 *   was not yet emitted. Events after DONE are ignored and return 0. One
 *   close is not a failure: in a compressed exchange, once the peer's
 *   bytes and XCHG_DONE are all in (decoding) and our own XCHG_DONE is
 *   emitted, the peer closing is its end (it finished with all of ours):
 *   the exchange ends as the decode says.
 * - Compressed (gossip.h, "Compressed averaging"): an AVERAGE goes
 *   compressed when local.coded_bytes > 0 and the REQ's anchor equals the
 *   REPLY's and is not all zero; both sides decide it from the same two
 *   messages. Each side then asks the driver to ENCODE its snapshot once
 *   it has it (after the REPLY; the norm of the snapshot itself is kept
 *   for the guards first), streams the coded bytes as XCHG_CODED pieces
 *   (each starting where the last ended, FAIL_PROTOCOL otherwise; a total
 *   other than coded_bytes, or an XCHG_DONE before all bytes came, is
 *   FAIL_SIZE; a TENSOR_CHUNK is FAIL_PROTOCOL, as is an XCHG_CODED in a
 *   float32 exchange), and once all the peer's bytes and its XCHG_DONE are
 *   in asks the driver to DECODE them: a refusal is FAIL_CODEC. The
 *   guards then read decoded drifts: the norm guard compares |D(c_peer)|
 *   with norm_mult * (|own snapshot| + 1); clipping bounds the delta as
 *   for float32. The coded buffers (coded_bytes each way) are allocated
 *   when the exchange is accepted (a responder that cannot answers BUSY;
 *   an initiator ends BUSY).
 * - Flow control: every SEND (control messages too) counts as outstanding
 *   until st_xchg_sent; no SEND is emitted while ST_XCHG_CHUNKS_IN_FLIGHT
 *   are outstanding. Actions are a queue drained in order: an action
 *   behind a held-back SEND waits for it.
 * - The TIMER action comes once, first, at creation, for now +
 *   timeout_ms; a tick at or after it ends an unfinished exchange with
 *   FAIL_TIMEOUT.
 * - Memory: the machine copies the snapshot it is given; it holds the
 *   peer's snapshot in its own buffer, and for AVERAGE turns it into the
 *   delta in place; with cfg.delta_in_own (float32 AVERAGE) it holds no
 *   peer buffer: the delta is made over our snapshot, each float once it
 *   was encoded for sending and the peer's came, and the peer's floats
 *   wait in a growable window (pend) meanwhile, which the driver keeps
 *   small by not reading while st_xchg_rx_room says false. APPLY's values
 *   stay valid until st_xchg_free or
 *   st_xchg_release_buffers (after DONE: the driver's word that nothing is
 *   borrowed). SEND
 *   data is encoded when the action is drained, into one buffer (of
 *   ST_WIRE_MAX_MESSAGE_BYTES for chunks, a small one for the rest), valid
 *   until the next call into the machine. Initiators allocate their
 *   buffers at creation (-ENOMEM there), responders when they accept. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/gossip.h"
#include "gossip/wire_internal.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "exchange.c sends the host's float bytes as little-endian float32"
#endif

/* An exchange of a 100 MB model at 100 Mbit/s takes 8 s each way at
 * once; 30 s leaves room for a loaded link without holding a dead peer's
 * slot for long (the node tries another peer). */
#define XCHG_DEFAULT_TIMEOUT_MS 30000u
/* Peers that train the same model on different shards drift apart, but
 * not by an order of magnitude in norm; ten times is far past drift and
 * well short of a diverged model (norms grow without bound). */
#define XCHG_DEFAULT_NORM_MULT 10.0

#define CHUNK_FLOATS (ST_WIRE_CHUNK_MAX_BYTES / sizeof(float))
/* The one transfer a direction carries on a connection. */
#define TRANSFER_ID 0
/* XCHG_REQ/REPLY at their largest without a tensor list: envelope 3,
 * status 1, fingerprint 18, model 2 + 95, two uint64 of 9, an empty str 1:
 * 138 bytes. A REPLY with one is encoded into reply_buf. */
#define CTL_BYTES 256
#define QUEUE_CAP 10

typedef enum {
  Q_TIMER,
  Q_SEND_REQ,
  Q_SEND_REPLY,
  Q_WANT_SNAPSHOT,
  Q_ENCODE, /* compressed: our snapshot, to the driver's codec */
  Q_STREAM, /* our chunks, then our XCHG_DONE: drained in several SENDs */
  Q_DECODE, /* compressed: the peer's bytes, to the driver's codec */
  Q_APPLY,
  Q_DONE
} q_item_t;

typedef enum {
  PH_WAIT_REQ,   /* responder, before the request */
  PH_WAIT_REPLY, /* initiator, before the reply */
  PH_TRANSFER,   /* accepted: snapshots under way */
  PH_FINISHED    /* DONE queued */
} phase_t;

struct st_xchg_s {
  st_hash_t tx_hash; /* over the float bytes sent, in order */
  st_hash_t rx_hash; /* over the float bytes received, in order */
  st_xchg_config_t cfg;
  st_xchg_local_t local;
  bool initiator;
  bool busy;
  uint8_t kind; /* st_xchg_kind_t; 0 until a responder has the request */
  phase_t phase;
  uint64_t deadline_ms;
  st_xchg_result_t result;
  uint8_t reply_status; /* the REPLY a responder sends */
  bool peer_known;      /* peer_model holds the peer's model */
  char peer_model[ST_XCHG_MODEL_MAX];
  uint64_t peer_step; /* FETCH: the donor's step, from its REPLY */
  char* peer_tensors; /* a MISMATCH REPLY's tensor list, when it had one */
  size_t peer_tensors_len;
  uint8_t* reply_buf; /* a MISMATCH REPLY with our tensor list */

  /* Our snapshot, streamed (tx): AVERAGE both sides, the FETCH donor. */
  float* own;
  bool asked; /* WANT_SNAPSHOT queued, no snapshot yet */
  bool have_own;
  bool stream_queued;
  uint64_t tx_floats; /* floats emitted as chunks */
  bool tx_done_sent;  /* our XCHG_DONE emitted */
  unsigned outstanding;

  /* The peer's snapshot (rx): AVERAGE both sides, the FETCH joiner. In
   * place (cfg.delta_in_own, float32 AVERAGE): peer stays NULL and the
   * peer's floats [delta_floats, rx_floats) wait in pend, from pend_from;
   * the delta is made in own. */
  float* peer;
  bool in_place;
  float* pend;
  size_t pend_cap; /* floats */
  uint64_t pend_from;
  uint64_t rx_floats;
  bool rx_verified;  /* all there, hash and finiteness checked */
  bool norm_checked; /* AVERAGE: the norm guard passed */
  /* Accumulated as chunks arrive, so that nothing is left to scan at the
   * end: the sum of squares of the peer's floats (NaN or Inf when one of
   * them is), our own snapshot's, and (AVERAGE) how many of the peer's
   * floats have been turned into the delta in place. */
  double rx_sumsq;
  double own_sumsq;
  uint64_t own_sq_floats; /* own_sumsq covers own[0 .. own_sq_floats) */
  uint64_t delta_floats;
  bool delta_bad;     /* AVERAGE: a delta came out NaN or Inf */
  double delta_sumsq; /* AVERAGE: of the delta, as it is computed */
  double delta_norm;  /* AVERAGE, at the end: |delta| before clipping */
  bool clipped;       /* AVERAGE: the delta was scaled to clip_used */
  double clip_used;   /* AVERAGE: the bound applied (0: none) */
  double clip_base;   /* AVERAGE: the bound before cfg.clip_scale */

  /* FETCH of a held state (gossip.h): both named local.anchor
   * (held_hint); the donor's snapshot is that vector (held). */
  bool held_hint;
  bool held;

  /* Compressed (see above): negotiated, then our encoding (tx) and the
   * peer's (rx), local.coded_bytes each. */
  bool coded;
  uint8_t* tx_coded;
  uint8_t* rx_coded;
  uint64_t tx_bytes; /* coded bytes emitted as pieces */
  uint64_t rx_bytes; /* coded bytes received */
  bool encode_asked; /* ENCODE queued */
  bool encode_out;   /* ENCODE emitted, st_xchg_encoded not yet called */
  bool encoded;      /* st_xchg_encoded(0): own holds D(c_own) */
  bool decode_asked; /* DECODE queued: the peer's bytes are all in */
  bool decode_out;   /* DECODE emitted, st_xchg_decoded not yet called */
  int codec_drop;    /* FAIL_CODEC: the driver's reason */

  uint8_t* enc; /* ST_WIRE_MAX_MESSAGE_BYTES, for chunks */
  uint8_t ctl[CTL_BYTES];

  q_item_t queue[QUEUE_CAP];
  unsigned q_head, q_len;
};

/* ==== Names and configuration ===============================================
 */

static const char* const result_names[ST_XCHG_RESULT_COUNT] = {
    [ST_XCHG_OK] = "ok",
    [ST_XCHG_BUSY] = "busy",
    [ST_XCHG_MISMATCH] = "mismatch",
    [ST_XCHG_NOT_READY] = "not_ready",
    [ST_XCHG_FAIL_PROTOCOL] = "protocol",
    [ST_XCHG_FAIL_SIZE] = "size",
    [ST_XCHG_FAIL_NONFINITE] = "nonfinite",
    [ST_XCHG_FAIL_NORM] = "norm",
    [ST_XCHG_FAIL_HASH] = "hash",
    [ST_XCHG_FAIL_CLOSED] = "closed",
    [ST_XCHG_FAIL_TIMEOUT] = "timeout",
    [ST_XCHG_FAIL_CODEC] = "codec",
};

const char* st_xchg_result_name(st_xchg_result_t r) {
  if ((unsigned) r >= ST_XCHG_RESULT_COUNT)
    return "unknown";
  return result_names[r];
}

void st_xchg_config_default(st_xchg_config_t* cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->timeout_ms = XCHG_DEFAULT_TIMEOUT_MS;
  cfg->norm_mult = XCHG_DEFAULT_NORM_MULT;
  cfg->clip_scale = 1.0;
}

/* ==== The machine's pieces ==================================================
 */

static void push(st_xchg_t* x, q_item_t item) {
  /* At most 6 items are ever queued (TIMER, REQ or REPLY, WANT_SNAPSHOT,
   * STREAM, APPLY, DONE); the cap is a programmer's bound. */
  if (x->q_len < QUEUE_CAP)
    x->queue[(x->q_head + x->q_len++) % QUEUE_CAP] = item;
}

static void pop(st_xchg_t* x) {
  x->q_head = (x->q_head + 1) % QUEUE_CAP;
  x->q_len--;
}

/* Ends the exchange. A failure drops what was not yet emitted: the peer
 * learns nothing more, and sees the connection close. */
static void finish(st_xchg_t* x, st_xchg_result_t r) {
  if (x->phase == PH_FINISHED)
    return;
  if (r != ST_XCHG_OK && r != ST_XCHG_BUSY && r != ST_XCHG_MISMATCH &&
      r != ST_XCHG_NOT_READY)
    x->q_len = 0;
  x->phase = PH_FINISHED;
  x->result = r;
  push(x, Q_DONE);
}

static bool sends(const st_xchg_t* x) {
  return x->kind == ST_XCHG_AVERAGE || !x->initiator;
}

static bool receives(const st_xchg_t* x) {
  return x->kind == ST_XCHG_AVERAGE || x->initiator;
}

static size_t n_floats(const st_xchg_t* x) {
  return (size_t) x->local.n_params;
}

/* The buffers an accepted exchange needs: ours (when we send), the peer's
 * (when we receive) and the chunk encoder's. 0 or -ENOMEM. */
static int alloc_buffers(st_xchg_t* x) {
  size_t bytes = n_floats(x) * sizeof(float);
  if (sends(x) && bytes > 0) {
    x->own = x->local.buf != NULL ? x->local.buf : malloc(bytes);
    x->enc = malloc(ST_WIRE_MAX_MESSAGE_BYTES);
    if (x->own == NULL || x->enc == NULL)
      return -ENOMEM;
  }
  x->in_place = x->cfg.delta_in_own && x->kind == ST_XCHG_AVERAGE;
  if (receives(x) && bytes > 0 && !x->in_place) {
    /* The lent buffer holds our snapshot when we send one (a FETCH joiner
     * sends none: it receives the state into it). */
    bool lent = x->local.buf != NULL && !sends(x);
    x->peer = lent ? x->local.buf : malloc(bytes);
    if (x->peer == NULL)
      return -ENOMEM;
  }
  return 0;
}

/* Compressed: whether this AVERAGE goes compressed, given the anchor the
 * other side sent (the same test on both sides). */
static bool coded_with(const st_xchg_t* x, const uint8_t* peer_anchor) {
  static const uint8_t none[ST_XCHG_ANCHOR_BYTES];
  return x->kind == ST_XCHG_AVERAGE && x->local.coded_bytes > 0 &&
         x->local.n_params > 0 &&
         memcmp(x->local.anchor, none, sizeof none) != 0 &&
         memcmp(x->local.anchor, peer_anchor, sizeof none) == 0;
}

/* FETCH: whether the other side named the held state we hold. */
static bool held_with(const st_xchg_t* x, const uint8_t* peer_anchor) {
  static const uint8_t none[ST_XCHG_ANCHOR_BYTES];
  return x->kind == ST_XCHG_FETCH && x->local.has_held &&
         memcmp(x->local.anchor, none, sizeof none) != 0 &&
         memcmp(x->local.anchor, peer_anchor, sizeof none) == 0;
}

/* The coded buffers of a compressed exchange. 0 or -ENOMEM. */
static int alloc_coded(st_xchg_t* x) {
  if (!x->coded)
    return 0;
  if (x->in_place) { /* DECODE writes the peer's whole drift */
    x->in_place = false;
    x->peer = malloc(n_floats(x) * sizeof(float));
    if (x->peer == NULL)
      return -ENOMEM;
  }
  x->tx_coded = malloc((size_t) x->local.coded_bytes);
  x->rx_coded = malloc((size_t) x->local.coded_bytes);
  return x->tx_coded == NULL || x->rx_coded == NULL ? -ENOMEM : 0;
}

static void free_buffers(st_xchg_t* x) {
  if (x->own != x->local.buf)
    free(x->own);
  if (x->peer != x->local.buf)
    free(x->peer);
  free(x->enc);
  free(x->tx_coded);
  free(x->rx_coded);
  free(x->pend);
  x->pend = NULL;
  x->pend_cap = 0;
  x->own = x->peer = NULL;
  x->enc = x->tx_coded = x->rx_coded = NULL;
}

/* Our side is ready to be streamed and to make the delta: the snapshot
 * is there and, compressed, encoded (own then holds D(c_own)). */
static bool own_ready(const st_xchg_t* x) {
  return x->have_own && (!x->coded || x->encoded);
}

/* In double, eight running sums (one chain of dependent adds ran at a
 * quarter of the speed: 5 ms for 10M floats against 2). NaN or Inf when
 * a float is; finite floats cannot overflow it (FLT_MAX^2 * 2^40 <
 * DBL_MAX). */
static double sumsq(const float* v, size_t n) {
  double a[8] = {0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++)
      a[k] += (double) v[i + k] * v[i + k];
  double s = 0;
  for (; i < n; i++)
    s += (double) v[i] * v[i];
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])) + s;
}

/* d = (peer - own) / 2 in float, into the peer's floats (d == p) or into
 * our own (d == o), returning the sum of squares of d as sumsq does: one
 * pass. The pointers may be equal, so no restrict; the loop is written
 * in blocks of 8 so that the compiler keeps eight sums in registers. */
static double halve_sumsq(float* d, const float* p, const float* o, size_t n) {
  double a[8] = {0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    float v[8];
    for (int k = 0; k < 8; k++)
      v[k] = (p[i + k] - o[i + k]) * 0.5f;
    for (int k = 0; k < 8; k++) {
      d[i + k] = v[k];
      a[k] += (double) v[k] * v[k];
    }
  }
  double s = 0;
  for (; i < n; i++) {
    float v = (p[i] - o[i]) * 0.5f;
    d[i] = v;
    s += (double) v * v;
  }
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])) + s;
}

/* The delta's sum of squares over floats just made, and whether one came
 * out NaN or Inf (our own snapshot held one, the guard checks the peer's,
 * or peer - own overflowed float). */
static void delta_sums(st_xchg_t* x, double sq) {
  if (!isfinite(sq))
    x->delta_bad = true;
  x->delta_sumsq += sq;
}

/* own_sumsq extended over own[.. end): taken as each chunk of our own is
 * encoded (the floats are in cache then, and the first chunk need not wait
 * for a pass over the whole snapshot), and over the rest before anything
 * reads it or changes own (the norm guard, the codec). */
static void own_sum_upto(st_xchg_t* x, uint64_t end) {
  if (end <= x->own_sq_floats)
    return;
  x->own_sumsq +=
      sumsq(x->own + x->own_sq_floats, (size_t) (end - x->own_sq_floats));
  x->own_sq_floats = end;
}

/* AVERAGE, once our snapshot is here: delta = (s_peer - s_own) / 2 in
 * place over the floats received so far (the APPLY values). The guard
 * reads only the sums taken on arrival, so turning the floats early loses
 * nothing, and nothing is applied unless it passes. */
static void delta_in_place(st_xchg_t* x);

static void delta_catch_up(st_xchg_t* x) {
  if (x->kind != ST_XCHG_AVERAGE || !own_ready(x))
    return;
  if (x->in_place) {
    delta_in_place(x);
    return;
  }
  if (x->rx_floats <= x->delta_floats)
    return; /* nothing new (and with no floats, no buffer to point into) */
  float* p = x->peer + x->delta_floats;
  delta_sums(x, halve_sumsq(p, p, x->own + x->delta_floats,
                            (size_t) (x->rx_floats - x->delta_floats)));
  x->delta_floats = x->rx_floats;
}

/* In place: delta = (s_peer - s_own) / 2 into own over the floats both
 * received and already sent (a float of own is read for the last time when
 * its chunk is encoded), in the same float arithmetic as above; those
 * floats leave pend. */
static void delta_in_place(st_xchg_t* x) {
  uint64_t end = x->rx_floats < x->tx_floats ? x->rx_floats : x->tx_floats;
  if (end <= x->delta_floats)
    return;
  float* o = x->own + x->delta_floats;
  delta_sums(x, halve_sumsq(o, x->pend + (x->delta_floats - x->pend_from), o,
                            (size_t) (end - x->delta_floats)));
  x->delta_floats = end;
  size_t left = (size_t) (x->rx_floats - end);
  if (left > 0 && end > x->pend_from)
    memmove(x->pend, x->pend + (end - x->pend_from), left * sizeof(float));
  x->pend_from = end;
}

/* In place: room in pend for count more of the peer's floats (it grows
 * when the driver reads past st_xchg_rx_room). false: no memory. */
static bool pend_reserve(st_xchg_t* x, size_t count) {
  size_t need = (size_t) (x->rx_floats - x->pend_from) + count;
  if (need <= x->pend_cap)
    return true;
  size_t cap = x->pend_cap > 0 ? x->pend_cap : ST_XCHG_RX_WINDOW_FLOATS;
  while (cap < need)
    cap *= 2;
  if (cap > n_floats(x))
    cap = n_floats(x);
  float* p = realloc(x->pend, cap * sizeof(float));
  if (p == NULL)
    return false;
  x->pend = p;
  x->pend_cap = cap;
  return true;
}

bool st_xchg_rx_room(const st_xchg_t* x) {
  uint64_t window = x != NULL && x->cfg.rx_window_floats > 0
                        ? x->cfg.rx_window_floats
                        : ST_XCHG_RX_WINDOW_FLOATS;
  return x == NULL || !x->in_place || x->phase != PH_TRANSFER ||
         x->rx_floats - x->pend_from < window;
}

/* The delta (APPLY's values): the peer's buffer, or own in place. */
static float* delta_of(st_xchg_t* x) {
  return x->in_place ? x->own : x->peer;
}

/* AVERAGE: a delta longer than cfg.clip_norm is scaled to it (centered
 * clipping, Karimireddy et al. 2021; He et al., "Byzantine-robust
 * decentralized learning via ClippedGossip", 2022): whatever the peer
 * sent, it moves our parameters by at most clip_norm. */
static void clip_delta(st_xchg_t* x) {
  x->delta_norm = sqrt(x->delta_sumsq);
  double floor = x->cfg.clip_rel * (sqrt(x->own_sumsq) + 1.0);
  x->clip_base = x->cfg.clip_norm > floor ? x->cfg.clip_norm : floor;
  double bound = x->clip_base * x->cfg.clip_scale;
  x->clip_used = bound;
  if (!(bound > 0) || x->delta_norm <= bound)
    return;
  float scale = (float) (bound / x->delta_norm);
  size_t n = n_floats(x);
  float* delta = delta_of(x);
  for (size_t i = 0; i < n; i++)
    delta[i] *= scale;
  x->clipped = true;
}

/* Called after every event: starts our stream once we may, runs the norm
 * guard once both snapshots are here, and finishes the exchange once both
 * directions are done. */
static void progress(st_xchg_t* x) {
  if (x->phase != PH_TRANSFER)
    return;
  if (x->coded && x->have_own && !x->encode_asked) {
    own_sum_upto(x, n_floats(x)); /* the codec turns own into D(c_own) */
    x->encode_asked = true;
    push(x, Q_ENCODE);
  }
  if (sends(x) && own_ready(x) && !x->stream_queued) {
    x->stream_queued = true;
    push(x, Q_STREAM);
  }
  if (x->kind == ST_XCHG_AVERAGE && x->rx_verified && own_ready(x) &&
      !x->norm_checked) {
    x->norm_checked = true;
    own_sum_upto(x, n_floats(x)); /* own beyond tx_floats is still ours */
    if (x->cfg.norm_mult > 0 &&
        sqrt(x->rx_sumsq) > x->cfg.norm_mult * (sqrt(x->own_sumsq) + 1.0)) {
      finish(x, ST_XCHG_FAIL_NORM);
      return;
    }
  }
  bool tx_complete = !sends(x) || (x->tx_done_sent && x->outstanding == 0);
  bool rx_complete =
      !receives(x) ||
      (x->rx_verified && (x->kind != ST_XCHG_AVERAGE || x->norm_checked));
  if (!tx_complete || !rx_complete)
    return;
  delta_catch_up(x); /* done chunk by chunk already, as a rule */
  if (x->delta_bad) {
    finish(x, ST_XCHG_FAIL_NONFINITE); /* nothing non-finite is applied */
    return;
  }
  if (receives(x)) {
    if (x->kind == ST_XCHG_AVERAGE)
      clip_delta(x);
    push(x, Q_APPLY);
  }
  finish(x, ST_XCHG_OK);
}

double st_xchg_clip_bound(const double* norms, size_t n, double mult) {
  if (n > ST_XCHG_CLIP_HISTORY)
    n = ST_XCHG_CLIP_HISTORY;
  if (!(mult > 0) || n < ST_XCHG_CLIP_WARMUP)
    return 0;
  double v[ST_XCHG_CLIP_HISTORY];
  for (size_t i = 0; i < n; i++) { /* insertion sort: n <= 16 */
    size_t j = i;
    for (; j > 0 && v[j - 1] > norms[i]; j--)
      v[j] = v[j - 1];
    v[j] = norms[i];
  }
  double med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  return mult * med;
}

/* ==== Creation ==============================================================
 */

static int new_machine(const st_xchg_config_t* cfg,
                       const st_xchg_local_t* local, uint64_t now_ms,
                       st_xchg_t** out) {
  if (cfg == NULL || local == NULL || out == NULL)
    return -EINVAL;
  *out = NULL;
  size_t model_len = strnlen(local->model, ST_XCHG_MODEL_MAX);
  if (model_len == ST_XCHG_MODEL_MAX ||
      !st__wire_model_ok(local->model, model_len))
    return -EINVAL;
  if (local->n_params > ST__WIRE_MAX_TENSOR_FLOATS ||
      local->n_params > SIZE_MAX / sizeof(float))
    return -EINVAL;
  if (local->tensors == NULL && local->tensors_len > 0)
    return -EINVAL;
  if (local->coded_bytes > ST_XCHG_CODED_MAX_BYTES ||
      local->coded_bytes > SIZE_MAX)
    return -EINVAL;
  if (!(cfg->norm_mult >= 0) || isinf(cfg->norm_mult))
    return -EINVAL;
  if (!(cfg->clip_norm >= 0) || isinf(cfg->clip_norm) ||
      !(cfg->clip_rel >= 0) || isinf(cfg->clip_rel) || !(cfg->clip_scale > 0) ||
      isinf(cfg->clip_scale))
    return -EINVAL;
  /* st_hash_t is 64-byte aligned; malloc promises 16. */
  size_t size = (sizeof(st_xchg_t) + 63) / 64 * 64;
  st_xchg_t* x = aligned_alloc(_Alignof(st_xchg_t), size);
  if (x == NULL)
    return -ENOMEM;
  memset(x, 0, sizeof *x);
  x->cfg = *cfg;
  x->local = *local;
  x->deadline_ms = now_ms + cfg->timeout_ms;
  if (x->deadline_ms < now_ms)
    x->deadline_ms = UINT64_MAX;
  st_hash_init(&x->tx_hash);
  st_hash_init(&x->rx_hash);
  push(x, Q_TIMER);
  *out = x;
  return 0;
}

int st_xchg_new_initiator(const st_xchg_config_t* cfg, st_xchg_kind_t kind,
                          const st_xchg_local_t* local, uint64_t now_ms,
                          st_xchg_t** out) {
  if (kind != ST_XCHG_AVERAGE && kind != ST_XCHG_FETCH)
    return -EINVAL;
  int rc = new_machine(cfg, local, now_ms, out);
  if (rc != 0)
    return rc;
  st_xchg_t* x = *out;
  x->initiator = true;
  x->kind = (uint8_t) kind;
  x->phase = PH_WAIT_REPLY;
  if (alloc_buffers(x) != 0) {
    st_xchg_free(x);
    *out = NULL;
    return -ENOMEM;
  }
  push(x, Q_SEND_REQ);
  if (kind == ST_XCHG_AVERAGE) {
    x->asked = true;
    push(x, Q_WANT_SNAPSHOT);
  }
  return 0;
}

int st_xchg_new_responder(const st_xchg_config_t* cfg,
                          const st_xchg_local_t* local, bool busy,
                          uint64_t now_ms, st_xchg_t** out) {
  int rc = new_machine(cfg, local, now_ms, out);
  if (rc != 0)
    return rc;
  (*out)->busy = busy;
  (*out)->phase = PH_WAIT_REQ;
  return 0;
}

void st_xchg_free(st_xchg_t* x) {
  if (x == NULL)
    return;
  free_buffers(x);
  free(x->peer_tensors);
  free(x->reply_buf);
  free(x);
}

int st_xchg_release_buffers(st_xchg_t* x) {
  if (x == NULL || x->phase != PH_FINISHED)
    return -EINVAL;
  free_buffers(x);
  x->have_own = false; /* st_xchg_own and st_xchg_coded_own: nothing */
  x->encoded = false;
  return 0;
}

/* ==== Messages ==============================================================
 */

static bool fingerprint_eq(const uint8_t a[16], const uint8_t b[16]) {
  return memcmp(a, b, 16) == 0;
}

static void set_peer_model(st_xchg_t* x, const char* model) {
  memcpy(x->peer_model, model, ST_XCHG_MODEL_MAX);
  x->peer_known = true;
}

static void on_req(st_xchg_t* x, const st_msg_xchg_req_t* m) {
  x->kind = m->kind;
  set_peer_model(x, m->model);
  st_xchg_status_t s = ST_XCHG_STATUS_OK;
  if (!fingerprint_eq(m->fingerprint, x->local.fingerprint))
    s = ST_XCHG_STATUS_MISMATCH;
  else if (x->local.n_params == 0)
    s = ST_XCHG_STATUS_NOT_READY;
  else if (m->n_params != x->local.n_params)
    s = ST_XCHG_STATUS_MISMATCH;
  else if (x->busy || alloc_buffers(x) != 0 ||
           ((x->coded = coded_with(x, m->anchor)) && alloc_coded(x) != 0))
    s = ST_XCHG_STATUS_BUSY;
  x->held_hint = s == ST_XCHG_STATUS_OK && held_with(x, m->anchor);
  x->reply_status = (uint8_t) s;
  push(x, Q_SEND_REPLY);
  switch (s) {
    case ST_XCHG_STATUS_OK:
      x->phase = PH_TRANSFER;
      x->asked = true;
      push(x, Q_WANT_SNAPSHOT);
      break;
    case ST_XCHG_STATUS_BUSY:
      free_buffers(x);
      finish(x, ST_XCHG_BUSY);
      break;
    case ST_XCHG_STATUS_MISMATCH:
      finish(x, ST_XCHG_MISMATCH);
      break;
    case ST_XCHG_STATUS_NOT_READY:
      finish(x, ST_XCHG_NOT_READY);
      break;
  }
}

/* A copy of the tensor list a MISMATCH REPLY carried (none when the
 * allocation fails: the message then names the models only). */
static void keep_peer_tensors(st_xchg_t* x, const st_msg_xchg_reply_t* m) {
  if (m->tensors_len == 0 || (x->peer_tensors = malloc(m->tensors_len)) == NULL)
    return;
  memcpy(x->peer_tensors, m->tensors, m->tensors_len);
  x->peer_tensors_len = m->tensors_len;
}

static void on_reply(st_xchg_t* x, const st_msg_xchg_reply_t* m) {
  set_peer_model(x, m->model);
  switch ((st_xchg_status_t) m->status) {
    case ST_XCHG_STATUS_BUSY:
      finish(x, ST_XCHG_BUSY);
      return;
    case ST_XCHG_STATUS_NOT_READY:
      finish(x, ST_XCHG_NOT_READY);
      return;
    case ST_XCHG_STATUS_MISMATCH:
      keep_peer_tensors(x, m);
      finish(x, ST_XCHG_MISMATCH);
      return;
    case ST_XCHG_STATUS_OK:
      break;
  }
  if (!fingerprint_eq(m->fingerprint, x->local.fingerprint) ||
      m->n_params != x->local.n_params) {
    finish(x, ST_XCHG_MISMATCH);
    return;
  }
  x->peer_step = m->step;
  x->held_hint = held_with(x, m->anchor);
  x->coded = coded_with(x, m->anchor);
  if (alloc_coded(x) != 0) {
    finish(x, ST_XCHG_BUSY); /* we are: no memory for it now */
    return;
  }
  x->phase = PH_TRANSFER;
}

static void on_chunk(st_xchg_t* x, const st_msg_tensor_chunk_t* c) {
  if (c->transfer_id != TRANSFER_ID || c->data_len == 0 ||
      c->offset != x->rx_floats) {
    finish(x, ST_XCHG_FAIL_PROTOCOL);
    return;
  }
  if (c->total != x->local.n_params) {
    finish(x, ST_XCHG_FAIL_SIZE);
    return;
  }
  /* The wire checked offset + count <= total = n_params. */
  size_t count = c->data_len / sizeof(float);
  if (x->in_place && !pend_reserve(x, count)) {
    finish(x, ST_XCHG_FAIL_SIZE); /* no memory to hold it: nothing applied */
    return;
  }
  float* dst =
      x->in_place ? x->pend + (c->offset - x->pend_from) : x->peer + c->offset;
  if (x->kind == ST_XCHG_FETCH)
    st_hash_update(&x->rx_hash, c->data, c->data_len);
  /* A NaN or Inf makes the sum NaN or Inf; finite floats cannot overflow
   * it (FLT_MAX^2 * 2^40 < DBL_MAX). */
  memcpy(dst, c->data, c->data_len);
  x->rx_sumsq += sumsq(dst, count); /* in cache: just copied */
  x->rx_floats += count;
  delta_catch_up(x);
}

/* Compressed: a piece of the peer's encoding, in order. */
static void on_coded(st_xchg_t* x, const st_msg_xchg_coded_t* c) {
  if (c->offset != x->rx_bytes) {
    finish(x, ST_XCHG_FAIL_PROTOCOL);
    return;
  }
  if (c->total != x->local.coded_bytes) {
    finish(x, ST_XCHG_FAIL_SIZE);
    return;
  }
  /* The wire checked 1 <= data_len and offset + data_len <= total. */
  memcpy(x->rx_coded + c->offset, c->data, c->data_len);
  x->rx_bytes += c->data_len;
}

static void on_done_msg(st_xchg_t* x, const st_msg_xchg_done_t* m) {
  if (x->coded) {
    if (x->rx_bytes != x->local.coded_bytes) {
      finish(x, ST_XCHG_FAIL_SIZE);
      return;
    }
    x->decode_asked = true; /* verified once decoded (st_xchg_decoded) */
    push(x, Q_DECODE);
    return;
  }
  if (x->held_hint && x->rx_floats == 0) {
    /* The donor says we hold its state: its hash must be ours. */
    if (memcmp(m->hash, x->local.held_hash, ST_HASH_BYTES) != 0) {
      finish(x, ST_XCHG_FAIL_HASH);
      return;
    }
    x->held = true;
    x->rx_verified = true;
    return;
  }
  if (x->rx_floats != x->local.n_params) {
    finish(x, ST_XCHG_FAIL_SIZE);
    return;
  }
  uint8_t h[ST_HASH_BYTES];
  st_hash_final(&x->rx_hash, h);
  if (x->kind == ST_XCHG_FETCH && memcmp(h, m->hash, ST_HASH_BYTES) != 0) {
    finish(x, ST_XCHG_FAIL_HASH);
    return;
  }
  if (!isfinite(x->rx_sumsq)) {
    finish(x, ST_XCHG_FAIL_NONFINITE);
    return;
  }
  x->rx_verified = true;
}

int st_xchg_message(st_xchg_t* x, uint64_t now_ms, const uint8_t* data,
                    size_t len) {
  if (x == NULL || (data == NULL && len > 0))
    return -EINVAL;
  if (x->phase == PH_FINISHED)
    return 0;
  st_msg_t m;
  if (st_wire_decode(data, len, &m, NULL) != 0) {
    finish(x, ST_XCHG_FAIL_PROTOCOL);
    return 0;
  }
  bool rx_open = x->phase == PH_TRANSFER && receives(x) && !x->rx_verified &&
                 !x->decode_asked;
  if (m.type == ST_MSG_XCHG_REQ && x->phase == PH_WAIT_REQ)
    on_req(x, &m.u.xchg_req);
  else if (m.type == ST_MSG_XCHG_REPLY && x->phase == PH_WAIT_REPLY)
    on_reply(x, &m.u.xchg_reply);
  else if (m.type == ST_MSG_TENSOR_CHUNK && rx_open && !x->coded)
    on_chunk(x, &m.u.chunk);
  else if (m.type == ST_MSG_XCHG_CODED && rx_open && x->coded)
    on_coded(x, &m.u.xchg_coded);
  else if (m.type == ST_MSG_XCHG_DONE && rx_open)
    on_done_msg(x, &m.u.xchg_done);
  else
    finish(x, ST_XCHG_FAIL_PROTOCOL);
  st_wire_msg_free(&m);
  progress(x);
  return 0;
}

/* ==== The other events ======================================================
 */

int st_xchg_snapshot(st_xchg_t* x, uint64_t now_ms, const float* params,
                     size_t n, uint64_t step) {
  if (x == NULL)
    return -EINVAL;
  if (x->phase == PH_FINISHED)
    return 0;
  if (!x->asked || n != n_floats(x) || (params == NULL && n > 0))
    return -EINVAL;
  if (n > 0 && params != x->own)
    memcpy(x->own, params, n * sizeof(float));
  x->asked = false;
  x->have_own = true;
  x->own_sumsq = 0; /* taken chunk by chunk: own_sum_upto */
  x->own_sq_floats = 0;
  if (x->held_hint && !x->initiator) {
    uint8_t h[ST_HASH_BYTES];
    st_hash_t hs;
    st_hash_init(&hs);
    st_hash_update(&hs, x->own, n * sizeof(float));
    st_hash_final(&hs, h);
    x->held = memcmp(h, x->local.held_hash, ST_HASH_BYTES) == 0;
  }
  delta_catch_up(x);
  progress(x);
  return 0;
}

float* st_xchg_snapshot_buffer(st_xchg_t* x) {
  return x != NULL && x->asked ? x->own : NULL;
}

const float* st_xchg_own(const st_xchg_t* x) {
  return x != NULL && x->have_own && !x->coded && !x->in_place ? x->own : NULL;
}

float* st_xchg_coded_own(st_xchg_t* x) {
  return x != NULL && x->coded && x->encoded && x->phase == PH_FINISHED &&
                 x->result == ST_XCHG_OK && x->kind == ST_XCHG_AVERAGE
             ? x->own
             : NULL;
}

int st_xchg_encoded(st_xchg_t* x, uint64_t now_ms, int rc) {
  (void) now_ms;
  if (x == NULL)
    return -EINVAL;
  if (x->phase == PH_FINISHED)
    return 0;
  if (!x->encode_out)
    return -EINVAL;
  x->encode_out = false;
  if (rc != 0) {
    finish(x, ST_XCHG_FAIL_NONFINITE); /* the codec refuses NaN and Inf */
    return 0;
  }
  x->encoded = true;
  delta_catch_up(x);
  progress(x);
  return 0;
}

int st_xchg_decoded(st_xchg_t* x, uint64_t now_ms, int rc, int reason) {
  (void) now_ms;
  if (x == NULL)
    return -EINVAL;
  if (x->phase == PH_FINISHED)
    return 0;
  if (!x->decode_out)
    return -EINVAL;
  x->decode_out = false;
  if (rc != 0) {
    x->codec_drop = reason;
    finish(x, ST_XCHG_FAIL_CODEC);
    return 0;
  }
  size_t n = n_floats(x);
  x->rx_sumsq = sumsq(x->peer, n);
  if (!isfinite(x->rx_sumsq)) { /* the decoder promises finite floats */
    finish(x, ST_XCHG_FAIL_NONFINITE);
    return 0;
  }
  x->rx_floats = n;
  x->rx_verified = true;
  delta_catch_up(x);
  progress(x);
  return 0;
}

int st_xchg_sent(st_xchg_t* x, uint64_t now_ms) {
  if (x == NULL)
    return -EINVAL;
  if (x->phase == PH_FINISHED)
    return 0;
  if (x->outstanding == 0)
    return -EINVAL;
  x->outstanding--;
  progress(x);
  return 0;
}

int st_xchg_tick(st_xchg_t* x, uint64_t now_ms) {
  if (x == NULL)
    return -EINVAL;
  if (x->phase != PH_FINISHED && now_ms >= x->deadline_ms)
    finish(x, ST_XCHG_FAIL_TIMEOUT);
  return 0;
}

int st_xchg_closed(st_xchg_t* x, uint64_t now_ms) {
  if (x == NULL)
    return -EINVAL;
  (void) now_ms;
  if (x->phase == PH_TRANSFER && x->coded && x->decode_asked &&
      x->tx_done_sent) {
    /* Everything of the peer's is in (its bytes and XCHG_DONE, being
     * decoded) and everything of ours was emitted: the peer closed at its
     * end. It could only finish OK with all of ours, so our SENDs count as
     * written, and the exchange ends as the decode says. (Failing here
     * would leave the peer's half applied and ours not.) */
    x->outstanding = 0;
    progress(x);
    return 0;
  }
  finish(x, ST_XCHG_FAIL_CLOSED);
  return 0;
}

/* ==== Actions ===============================================================
 */

/* Encodes one message into buf; the machine's own messages always fit. */
static void encode(const st_msg_t* m, uint8_t* buf, size_t cap,
                   st_xact_t* out) {
  size_t len = 0;
  int rc = st_wire_encode(m, buf, cap, &len);
  (void) rc; /* valid by construction: the model was checked at creation */
  out->kind = ST_XACT_SEND;
  out->data = buf;
  out->len = len;
}

/* A MISMATCH REPLY carries our tensor list when we have one within
 * ST_XCHG_TENSORS_MAX (and the buffer for it); every other REPLY an empty
 * one. */
static void encode_reply(st_xchg_t* x, st_msg_t* m, st_xact_t* out) {
  size_t n = x->local.tensors_len;
  if (x->reply_status == ST_XCHG_STATUS_MISMATCH && n > 0 &&
      n <= ST_XCHG_TENSORS_MAX && x->reply_buf == NULL &&
      (x->reply_buf = malloc(n + CTL_BYTES)) != NULL) {
    m->u.xchg_reply.tensors = x->local.tensors;
    m->u.xchg_reply.tensors_len = (uint32_t) n;
    encode(m, x->reply_buf, n + CTL_BYTES, out);
    return;
  }
  encode(m, x->ctl, sizeof x->ctl, out);
}

static void encode_info(st_xchg_t* x, st_msg_t* m) {
  uint8_t* fp = m->type == ST_MSG_XCHG_REQ ? m->u.xchg_req.fingerprint
                                           : m->u.xchg_reply.fingerprint;
  char* model =
      m->type == ST_MSG_XCHG_REQ ? m->u.xchg_req.model : m->u.xchg_reply.model;
  memcpy(fp, x->local.fingerprint, 16);
  memcpy(model, x->local.model, ST_XCHG_MODEL_MAX);
  if (m->type == ST_MSG_XCHG_REQ) {
    m->u.xchg_req.n_params = x->local.n_params;
    m->u.xchg_req.step = x->local.step;
    memcpy(m->u.xchg_req.anchor, x->local.anchor, ST_XCHG_ANCHOR_BYTES);
  } else {
    m->u.xchg_reply.n_params = x->local.n_params;
    m->u.xchg_reply.step = x->local.step;
    memcpy(m->u.xchg_reply.anchor, x->local.anchor, ST_XCHG_ANCHOR_BYTES);
  }
}

/* The next SEND of our stream: a chunk, or the XCHG_DONE after the last.
 * Returns true when the stream has nothing left after it. */
static bool next_stream_send(st_xchg_t* x, st_xact_t* out) {
  st_msg_t m;
  memset(&m, 0, sizeof m);
  size_t n = n_floats(x);
  if (x->coded && x->tx_bytes < x->local.coded_bytes) {
    uint64_t k = x->local.coded_bytes - x->tx_bytes;
    if (k > ST_WIRE_CHUNK_MAX_BYTES)
      k = ST_WIRE_CHUNK_MAX_BYTES;
    m.type = ST_MSG_XCHG_CODED;
    m.u.xchg_coded.offset = x->tx_bytes;
    m.u.xchg_coded.total = x->local.coded_bytes;
    m.u.xchg_coded.data = x->tx_coded + x->tx_bytes;
    m.u.xchg_coded.data_len = (uint32_t) k;
    x->tx_bytes += k;
    encode(&m, x->enc, ST_WIRE_MAX_MESSAGE_BYTES, out);
    return false;
  }
  if (!x->coded && !x->held && x->tx_floats < n) {
    size_t k = n - x->tx_floats;
    if (k > CHUNK_FLOATS)
      k = CHUNK_FLOATS;
    m.type = ST_MSG_TENSOR_CHUNK;
    m.u.chunk.transfer_id = TRANSFER_ID;
    m.u.chunk.offset = x->tx_floats;
    m.u.chunk.total = n;
    m.u.chunk.data = (const uint8_t*) (x->own + x->tx_floats);
    m.u.chunk.data_len = (uint32_t) (k * sizeof(float));
    if (x->kind == ST_XCHG_FETCH)
      st_hash_update(&x->tx_hash, m.u.chunk.data, m.u.chunk.data_len);
    x->tx_floats += k;
    encode(&m, x->enc, ST_WIRE_MAX_MESSAGE_BYTES, out);
    if (x->kind == ST_XCHG_AVERAGE)
      own_sum_upto(x, x->tx_floats); /* before the delta takes them */
    delta_catch_up(x); /* in place: the floats encoded are free now */
    return false;
  }
  m.type = ST_MSG_XCHG_DONE;
  st_hash_final(&x->tx_hash, m.u.xchg_done.hash);
  if (x->held) /* the snapshot hashed to it (st_xchg_snapshot) */
    memcpy(m.u.xchg_done.hash, x->local.held_hash, ST_HASH_BYTES);
  if (x->kind != ST_XCHG_FETCH)
    memset(m.u.xchg_done.hash, 0, sizeof m.u.xchg_done.hash);
  x->tx_done_sent = true;
  encode(&m, x->ctl, sizeof x->ctl, out);
  return true;
}

uint8_t* st_xchg_take_send_buffer(st_xchg_t* x, const st_xact_t* a) {
  if (x == NULL || a == NULL || a->kind != ST_XACT_SEND || x->enc == NULL ||
      a->data != x->enc)
    return NULL;
  uint8_t* fresh = malloc(ST_WIRE_MAX_MESSAGE_BYTES);
  if (fresh == NULL)
    return NULL;
  uint8_t* taken = x->enc;
  x->enc = fresh;
  return taken;
}

bool st_xchg_next_action(st_xchg_t* x, st_xact_t* out) {
  if (x == NULL || out == NULL || x->q_len == 0)
    return false;
  memset(out, 0, sizeof *out);
  q_item_t item = x->queue[x->q_head];
  bool is_send = item == Q_SEND_REQ || item == Q_SEND_REPLY || item == Q_STREAM;
  if (is_send && x->outstanding >= ST_XCHG_CHUNKS_IN_FLIGHT)
    return false; /* held back until st_xchg_sent */
  st_msg_t m;
  memset(&m, 0, sizeof m);
  switch (item) {
    case Q_TIMER:
      out->kind = ST_XACT_TIMER;
      out->at_ms = x->deadline_ms;
      break;
    case Q_SEND_REQ:
      m.type = ST_MSG_XCHG_REQ;
      m.u.xchg_req.kind = x->kind;
      encode_info(x, &m);
      encode(&m, x->ctl, sizeof x->ctl, out);
      break;
    case Q_SEND_REPLY:
      m.type = ST_MSG_XCHG_REPLY;
      m.u.xchg_reply.status = x->reply_status;
      encode_info(x, &m);
      encode_reply(x, &m, out);
      break;
    case Q_STREAM:
      if (!next_stream_send(x, out)) {
        x->outstanding++;
        return true; /* the stream stays at the head */
      }
      break;
    case Q_WANT_SNAPSHOT:
      out->kind = ST_XACT_WANT_SNAPSHOT;
      break;
    case Q_ENCODE:
      out->kind = ST_XACT_ENCODE;
      x->encode_out = true;
      out->work = x->own;
      out->n = n_floats(x);
      out->coded = x->tx_coded;
      out->coded_len = (size_t) x->local.coded_bytes;
      break;
    case Q_DECODE:
      out->kind = ST_XACT_DECODE;
      x->decode_out = true;
      out->work = x->peer;
      out->n = n_floats(x);
      out->coded = x->rx_coded;
      out->coded_len = (size_t) x->local.coded_bytes;
      break;
    case Q_APPLY:
      out->kind = ST_XACT_APPLY;
      out->values = x->held ? NULL : delta_of(x);
      out->held = x->held;
      out->n = n_floats(x);
      out->clipped = x->clipped;
      out->step = x->kind == ST_XCHG_FETCH ? x->peer_step : 0;
      break;
    case Q_DONE:
      out->kind = ST_XACT_DONE;
      out->result = x->result;
      out->peer_model = x->peer_known ? x->peer_model : NULL;
      out->peer_tensors = x->peer_tensors;
      out->delta_norm = x->delta_norm;
      out->clipped = x->clipped;
      out->clip_norm = x->clip_used;
      out->clip_base = x->clip_base;
      out->peer_tensors_len = x->peer_tensors_len;
      out->coded_exchange = x->coded;
      out->held = x->held;
      out->codec_drop = x->codec_drop;
      break;
  }
  if (is_send)
    x->outstanding++;
  pop(x);
  return true;
}

st_xchg_kind_t st_xchg_kind(const st_xchg_t* x) {
  return x == NULL ? (st_xchg_kind_t) 0 : (st_xchg_kind_t) x->kind;
}

bool st_xchg_finished(const st_xchg_t* x) {
  return x == NULL || x->phase == PH_FINISHED;
}
