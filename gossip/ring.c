/* ring.c: the ring all-reduce machine (gossip.h, "Ring all-reduce"): the
 * mean of n members' snapshots by a reduce-scatter and an all-gather around
 * a ring (Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for
 * clusters of workstations", JPDC 2009; the pipelined ring of Gloo's
 * allreduce_ring_chunked and of Baidu's ring all-reduce), sans-IO.
 *
 * Words, used in this sense throughout:
 *
 * - n members, ranks 0 .. n - 1 in ring order; member r receives from
 *   r - 1 and sends to r + 1 (mod n). N = n_params floats.
 * - A *chunk* is one member's share of the vector: n members, n chunks;
 *   chunk c covers floats [c * N / n, (c + 1) * N / n) (integer division),
 *   so the remainder is spread and sizes differ by at most one. When
 *   N < n some chunks are empty; an empty chunk has no segments and
 *   nothing of it goes on the wire.
 * - A *segment* is the unit sent on the wire: one RING_SEG message holding
 *   at most segment_floats floats (256 KiB of float32 by default,
 *   ST_RING_SEGMENT_FLOATS = 1 MiB at most), fewer for a small vector
 *   (round_seg: at least 4 segments a chunk, none below 32 KiB). In what
 *   follows segment_floats means the round's segment. Segment k of a chunk
 * covers its floats [k * segment_floats, min((k + 1) * segment_floats, chunk
 * size)); the offset on the wire is k * segment_floats, within the chunk.
 * - A *step* moves one chunk from every member to the next. The round has
 *   2 (n - 1) of them, numbered t = 0 .. 2n - 3 here (on the wire: phase
 *   and the step within the phase): reduce-scatter steps t < n - 1, then
 *   all-gather steps. At step t member r sends chunk (r - t) mod n and
 *   receives chunk (r - 1 - t) mod n. Reduce-scatter: what it receives at
 *   step t it adds to its own floats (at the last such step, t = n - 2, it
 *   divides the sum by n: chunk r + 1 is then the mean), and at step t + 1
 *   sends that partial sum on. All-gather: member r sends the finished
 *   chunk r + 1 at step n - 1 and then, at each later step, the finished
 *   chunk it received at the step before.
 * - A member's *send stream* is the segments it sends, step by step, each
 *   chunk's segments in order; its *receive stream* the same from r - 1.
 *   Since the chunk sent at step t + 1 is the chunk received at step t,
 *   the send stream after step 0 is the receive stream without its last
 *   step, segment for segment: send-stream segment i (i >= the segments
 *   of step 0) is ready as soon as receive-stream segment i - (segments of
 *   step 0) has been received and added. Step 0 (our own chunk r) is ready
 *   once the snapshot is there.
 * - *In flight*: SENDs emitted and not yet reported written (st_ring_sent).
 *   At most in_flight (default 4) are; the next segment is encoded as soon
 *   as it is ready and the count allows, so sending, receiving and adding
 *   overlap: a member forwards segment k of a step while segment k + 1 is
 *   still on its way to it.
 *
 * Same bits everywhere: chunk c is summed along the ring in one fixed
 * order, x_c, then x_{c+1} + that, ... up to x_{c-1} + that, in float32,
 * and divided by n (exact IEEE division) by member c - 1; the all-gather
 * then copies those bits. Every member so ends with the same mean, and a
 * NaN or Inf in it fails the round on every member alike.
 *
 * Decisions the header leaves to this file:
 *
 * - Receiving: the next message must be a RING_SEG of our round id whose
 *   phase, step, chunk, offset and length are exactly those of the next
 *   segment of the receive stream (segments arrive in order on one
 *   stream), else FAIL_PROTOCOL; so is a message after the receive stream
 *   is complete, or one that does not decode. Reduce-scatter segments can
 *   arrive before our snapshot (the chunks we receive then hold no
 *   contribution of ours): they are stored in the sum buffer and added
 *   when the snapshot comes, in the order received; float addition
 *   commutes, so the bits are those of adding on arrival.
 * - The delta (mean - own) is made segment by segment, in place in the
 *   snapshot buffer, as soon as a segment's mean is final here: when this
 *   member completes its chunk's sum (the last reduce-scatter step) and
 *   when an all-gather segment arrives. By then the snapshot's floats of
 *   that segment have had their one use (the step-0 send of chunk r, or
 *   the add into a received partial sum), so nothing is left for the end
 *   but a flag: no pass over the whole vector after the last segment.
 * - Finishing: once the whole receive stream is added and every SEND is
 *   acknowledged: a NaN or Inf in the delta fails the round
 *   (FAIL_NONFINITE), else APPLY, then DONE(OK). Failures drop whatever
 *   was not yet emitted (no more SENDs, no APPLY): the others see the
 *   streams close.
 * - The timer: TIMER at creation for now + timeout_ms. A tick at or after
 *   last progress + timeout_ms fails the round (FAIL_TIMEOUT); an earlier
 *   tick at or after the armed time re-arms it at the new deadline. So
 *   the TIMER comes once per timeout period at most, not once a segment.
 * - Actions are drained in this order: TIMER, WANT_SNAPSHOT, SEND, APPLY,
 *   DONE. SEND data is encoded when the action is drained, into one
 *   buffer of segment_floats * 4 + RING_ENVELOPE_BYTES, valid until the
 *   next call into the machine.
 * - Memory: the snapshot (n_params floats, then the delta) and the sums
 *   (n_params floats, then the mean), allocated by st_ring_new; nothing is
 *   allocated per segment. A member with N = 10M parameters holds 80 MB
 *   and one encoded segment.
 * - Coded rounds (cfg.codec; gossip.h, "Coded rounds"): a reduce-scatter
 *   segment is encoded when its SEND is drained (its rounding kept in own
 *   there, own being spent but for the delta: own - e); the sum a member
 *   completes is encoded at once into the slot its all-gather SEND will go
 *   out from, and an all-gather segment's bytes into the slot of the next
 *   step's SEND, so the all-gather forwards bytes, never re-encodes. A
 *   segment that does not decode fails the round (FAIL_PROTOCOL), one that
 *   does not encode (a NaN or Inf) too (FAIL_NONFINITE), at that member.
 *   cfg.base is taken off the snapshot as it comes and added to the mean
 *   once the round is complete; the delta needs neither. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/gossip.h"
#include "gossip/wire_internal.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ring.c sends the host's float bytes as little-endian float32"
#endif

/* As the exchange's: a ring moving 2 (n - 1) / n of a 100 MB model each
 * way at 100 Mbit/s takes about 16 s; 30 s without any progress means a
 * member or a link is gone. The daemon may derive a tighter one from
 * measured segment times (gossip.h, st_ring_progress_t). */
#define RING_DEFAULT_TIMEOUT_MS 30000u
/* [40, 1, round u64 (9), phase (1), step u32 (5), chunk u32 (5), offset
 * u64 (9), bin32 header (5)]: 37 bytes around the data at most. */
#define RING_ENVELOPE_BYTES 64u
/* A small vector's chunks are cut into at least this many segments, so
 * that the hops still overlap (a member forwards a segment only once it
 * has all of it), but not into segments below RING_MIN_SEGMENT_FLOATS
 * (32 KiB), where per-segment costs win. Measured on 1 Gbit/s links, 4
 * members, 1 MiB: one 256 KiB segment a chunk 0.64 of the link, four of
 * 64 KiB 0.86, sixteen of 16 KiB 0.78 (docs/benchmarks.md). */
#define RING_MIN_SEGMENTS_PER_CHUNK 4u
#define RING_MIN_SEGMENT_FLOATS 8192u

typedef struct {
  uint32_t t; /* the step, 0 .. steps (steps: past the end) */
  uint64_t k; /* the segment within the step's chunk */
} pos_t;

struct st_ring_s {
  st_ring_config_t cfg;
  uint64_t seg; /* this round's segment, <= cfg.segment_floats (round_seg) */
  uint64_t round_id;
  uint32_t n;      /* members */
  uint32_t rank;   /* ours */
  uint64_t floats; /* N */
  uint32_t steps;  /* 2 (n - 1) */

  float* own;            /* the snapshot; the delta once finished */
  float* sum;            /* partial sums, received segments, then the mean */
  uint64_t delta_floats; /* own floats turned into the delta so far */
  bool delta_bad;        /* a NaN, Inf or overflow among them */
  uint8_t* enc;          /* one encoded segment */
  size_t enc_cap;

  /* A coded round's (cfg.codec): */
  size_t code_cap; /* the most bytes of one segment's encoding */
  uint8_t* code;   /* one segment's encoding (a reduce-scatter SEND) */
  float* dec;      /* one received segment, decoded */
  float* back;     /* decode(encode(sum)) of one segment */
  uint8_t* ag;     /* the all-gather's bytes: a slot of code_cap for each
                      all-gather segment this member sends */
  size_t* ag_len;  /* each slot's length */
  uint64_t tx_rs;  /* send-stream segments of the reduce-scatter */

  pos_t tx;           /* the next segment of the send stream */
  uint64_t tx_sent;   /* segments emitted */
  uint64_t tx_acked;  /* of those, acknowledged */
  uint64_t tx_first;  /* segments of step 0 (our chunk r) */
  uint64_t tx_total;  /* segments of the whole send stream */
  pos_t rx;           /* the next segment expected */
  uint64_t rx_stored; /* segments received */
  pos_t add;          /* the next received segment to add */
  uint64_t rx_added;  /* received segments added (all-gather ones count
                         once stored) */
  uint64_t rx_total;

  bool asked; /* WANT_SNAPSHOT queued or emitted, no snapshot yet */
  bool want_pending;
  bool have_own;
  bool timer_pending;
  uint64_t timer_at;
  uint64_t started_ms, last_progress_ms;
  bool finished;
  bool apply_pending, done_pending;
  st_ring_result_t result;
};

/* ==== Names and configuration ===============================================
 */

static const char* const result_names[ST_RING_RESULT_COUNT] = {
    [ST_RING_OK] = "ok",
    [ST_RING_FAIL_PROTOCOL] = "protocol",
    [ST_RING_FAIL_CLOSED] = "closed",
    [ST_RING_FAIL_ABORTED] = "aborted",
    [ST_RING_FAIL_TIMEOUT] = "timeout",
    [ST_RING_FAIL_NONFINITE] = "nonfinite",
};

const char* st_ring_result_name(st_ring_result_t r) {
  if ((unsigned) r >= ST_RING_RESULT_COUNT)
    return "unknown";
  return result_names[r];
}

void st_ring_config_default(st_ring_config_t* cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->segment_floats = ST_RING_DEFAULT_SEGMENT_FLOATS;
  cfg->in_flight = ST_RING_IN_FLIGHT;
  cfg->timeout_ms = RING_DEFAULT_TIMEOUT_MS;
}

/* ==== Chunks, segments and the two streams ==================================
 */

static uint64_t chunk_start(const st_ring_t* x, uint32_t c) {
  /* c <= 2^16 and N <= 2^40: the product stays below 2^57. */
  return (uint64_t) c * x->floats / x->n;
}

static uint64_t chunk_floats(const st_ring_t* x, uint32_t c) {
  return chunk_start(x, c + 1) - chunk_start(x, c);
}

/* The round's segment: the configured one, or for a small vector the
 * largest chunk / RING_MIN_SEGMENTS_PER_CHUNK, but not below
 * RING_MIN_SEGMENT_FLOATS (nor above the configured one). A function of
 * (config, n, N), so every member of the round cuts the same segments. */
static uint64_t round_seg(const st_ring_t* x) {
  uint64_t seg = x->cfg.segment_floats;
  uint64_t chunk_max = (x->floats + x->n - 1) / x->n;
  uint64_t want = (chunk_max + RING_MIN_SEGMENTS_PER_CHUNK - 1) /
                  RING_MIN_SEGMENTS_PER_CHUNK;
  if (want < RING_MIN_SEGMENT_FLOATS)
    want = RING_MIN_SEGMENT_FLOATS;
  return want < seg ? want : seg;
}

static uint64_t chunk_segments(const st_ring_t* x, uint32_t c) {
  uint64_t s = x->seg;
  return (chunk_floats(x, c) + s - 1) / s;
}

/* The chunk member `rank` sends at step t: (rank - t) mod n. The receive
 * stream is the previous member's send stream. t < 2n, so adding 2n keeps
 * the difference positive. */
static uint32_t chunk_at(const st_ring_t* x, uint32_t rank, uint32_t t) {
  return (uint32_t) (((uint64_t) rank + 2u * x->n - t) % x->n);
}

static uint32_t tx_chunk(const st_ring_t* x, uint32_t t) {
  return chunk_at(x, x->rank, t);
}

static uint32_t rx_chunk(const st_ring_t* x, uint32_t t) {
  return chunk_at(x, (x->rank + x->n - 1) % x->n, t);
}

/* Moves p past steps whose chunk is empty (N < n). */
static void skip_empty(const st_ring_t* x, pos_t* p, bool rx) {
  while (p->t < x->steps &&
         chunk_segments(x, rx ? rx_chunk(x, p->t) : tx_chunk(x, p->t)) == 0)
    p->t++;
}

/* The segment after p in its stream. */
static void advance(const st_ring_t* x, pos_t* p, bool rx) {
  uint32_t c = rx ? rx_chunk(x, p->t) : tx_chunk(x, p->t);
  if (++p->k == chunk_segments(x, c)) {
    p->k = 0;
    p->t++;
    skip_empty(x, p, rx);
  }
}

/* Where segment p of a stream lies: its chunk, its offset in the chunk and
 * its floats. */
static void seg_span(const st_ring_t* x, pos_t p, uint32_t c, uint64_t* off,
                     uint64_t* count) {
  uint64_t s = x->seg;
  *off = p.k * s;
  uint64_t left = chunk_floats(x, c) - *off;
  *count = left < s ? left : s;
}

static bool reduce_scatter(const st_ring_t* x, uint32_t t) {
  return t + 1 < x->n;
}

/* ==== Adding ================================================================
 */

/* own = mean - own over [at, at + count): the delta, once the mean there
 * is final; records a NaN or Inf in the mean or an overflow of the
 * difference. */
static void delta_span(st_ring_t* x, uint64_t at, uint64_t count) {
  const float* m = x->sum + at;
  float* o = x->own + at;
  uint32_t bad = 0;
  for (uint64_t i = 0; i < count; i++) {
    float d = m[i] - o[i];
    o[i] = d;
    bad |= !(fabsf(d) <= FLT_MAX);
  }
  x->delta_bad |= bad != 0;
  x->delta_floats += count;
}

static void finish(st_ring_t* x, st_ring_result_t r);

static bool coded(const st_ring_t* x) {
  return x->cfg.codec != NULL;
}

/* The all-gather slot that send-stream segment i goes out from; NULL for
 * a reduce-scatter one or past the stream. */
static uint8_t* ag_slot(const st_ring_t* x, uint64_t i, size_t** len) {
  if (i < x->tx_rs || i >= x->tx_total)
    return NULL;
  *len = &x->ag_len[i - x->tx_rs];
  return x->ag + (i - x->tx_rs) * x->code_cap;
}

/* What encoding sum[at .. at + count) rounded away stays with this member:
 * own -= sum - back (back: what the others decode). */
static void keep_rounding(st_ring_t* x, uint64_t at, uint64_t count) {
  const float* s = x->sum + at;
  float* o = x->own + at;
  for (uint64_t i = 0; i < count; i++)
    o[i] -= s[i] - x->back[i];
}

/* Coded: the chunk's sum over [at, at + count), complete in sum, is
 * encoded once into the all-gather slot of receive-stream segment j (sent
 * on at the next step); every member takes decode / n as the mean, this
 * one too. False (the round failed) when it does not encode: a NaN or
 * Inf in the sum. */
static bool complete_coded(st_ring_t* x, uint64_t j, uint64_t at,
                           uint64_t count) {
  const st_ring_codec_t* k = x->cfg.codec;
  size_t* len = NULL;
  uint8_t* slot = ag_slot(x, j + x->tx_first, &len);
  if (slot == NULL ||
      k->encode(k->ctx, x->sum + at, count, slot, x->code_cap, len) != 0 ||
      k->decode(k->ctx, slot, *len, x->back, count) != 0) {
    finish(x, ST_RING_FAIL_NONFINITE);
    return false;
  }
  keep_rounding(x, at, count);
  float n = (float) x->n;
  for (uint64_t i = 0; i < count; i++)
    x->sum[at + i] = x->back[i] / n;
  return true;
}

/* sum = own + received over receive-stream segment j; at the last
 * reduce-scatter step that chunk's sum is complete: divided by n (coded:
 * complete_coded), it is the mean, and the delta is made there. src may
 * be unaligned (a message's bytes), a decoded segment, or sum itself (a
 * segment stored before the snapshot). */
static void add_segment(st_ring_t* x, uint64_t j, uint64_t at, uint64_t count,
                        const uint8_t* src, bool last) {
  float* s = x->sum + at;
  const float* o = x->own + at;
  if (last && !coded(x)) {
    float n = (float) x->n;
    for (uint64_t i = 0; i < count; i++) {
      float v;
      memcpy(&v, src + 4 * i, 4);
      s[i] = (o[i] + v) / n;
    }
  } else {
    for (uint64_t i = 0; i < count; i++) {
      float v;
      memcpy(&v, src + 4 * i, 4);
      s[i] = o[i] + v;
    }
  }
  if (last && (!coded(x) || complete_coded(x, j, at, count)))
    delta_span(x, at, count);
}

/* Adds the received segments stored before the snapshot came, in order. */
static void add_stored(st_ring_t* x) {
  while (x->rx_added < x->rx_stored) {
    pos_t p = x->add;
    uint32_t c = rx_chunk(x, p.t);
    if (reduce_scatter(x, p.t)) {
      if (!x->have_own)
        return;
      uint64_t off, count;
      seg_span(x, p, c, &off, &count);
      uint64_t at = chunk_start(x, c) + off;
      add_segment(x, x->rx_added, at, count, (const uint8_t*) (x->sum + at),
                  p.t + 2 == x->n);
    }
    advance(x, &x->add, true);
    x->rx_added++;
  }
}

/* ==== The machine's pieces ==================================================
 */

/* Ends the round. A failure drops what was not yet emitted: the others
 * learn nothing more from us, and see the streams close. */
static void finish(st_ring_t* x, st_ring_result_t r) {
  if (x->finished)
    return;
  x->finished = true;
  x->result = r;
  x->want_pending = x->timer_pending = x->asked = false;
  /* OK comes from progress, which has made the delta (or from st_ring_new
   * when there is nothing to average: no snapshot, no APPLY). */
  x->apply_pending = r == ST_RING_OK && x->have_own;
  x->done_pending = true;
}

/* Called after every event: once everything is received and added and
 * every SEND acknowledged, turns own into the delta and finishes. */
static void progress(st_ring_t* x) {
  if (x->finished || !x->have_own || x->rx_added < x->rx_total ||
      x->tx_acked < x->tx_total)
    return;
  /* Every segment's delta is made (delta_span); a NaN or Inf in the mean
   * (the same on every member) or an overflow of a difference shows there.
   * Each float's mean becomes final exactly once. */
  bool bad = x->delta_bad || x->delta_floats != x->floats;
  if (!bad && x->cfg.base != NULL) {
    /* The mean of the drifts, back from the base: the same bits on every
     * member, as both are. */
    uint32_t inf = 0;
    for (uint64_t i = 0; i < x->floats; i++) {
      x->sum[i] += x->cfg.base[i];
      inf |= !(fabsf(x->sum[i]) <= FLT_MAX);
    }
    bad = inf != 0;
  }
  finish(x, bad ? ST_RING_FAIL_NONFINITE : ST_RING_OK);
}

static void touch(st_ring_t* x, uint64_t now_ms) {
  if (now_ms > x->last_progress_ms)
    x->last_progress_ms = now_ms;
}

/* ==== Creation ==============================================================
 */

static bool config_ok(const st_ring_config_t* c) {
  const st_ring_codec_t* k = c->codec;
  return c->segment_floats >= 1 &&
         c->segment_floats <= ST_RING_SEGMENT_FLOATS && c->in_flight >= 1 &&
         (k == NULL ||
          (k->max_bytes != NULL && k->encode != NULL && k->decode != NULL));
}

/* A coded round's buffers (ring.c's header: the all-gather's bytes and
 * three segments of scratch); enc_cap grows to hold the largest encoding.
 * 0, -EINVAL (the codec's bound is 0 or beyond a wire segment) or
 * -ENOMEM. */
static int coded_buffers(st_ring_t* x) {
  const st_ring_codec_t* k = x->cfg.codec;
  x->code_cap = k->max_bytes(k->ctx, (size_t) x->seg);
  if (x->code_cap == 0 || x->code_cap > ST_WIRE_CHUNK_MAX_BYTES)
    return -EINVAL;
  if (x->code_cap > x->enc_cap)
    x->enc_cap = x->code_cap;
  uint64_t slots = x->tx_total - x->tx_rs;
  if (slots > SIZE_MAX / x->code_cap)
    return -ENOMEM;
  x->code = malloc(x->code_cap);
  x->dec = malloc((size_t) x->seg * sizeof(float));
  x->back = malloc((size_t) x->seg * sizeof(float));
  x->ag = malloc((size_t) slots * x->code_cap);
  x->ag_len = calloc((size_t) slots, sizeof(size_t));
  return x->code == NULL || x->dec == NULL || x->back == NULL ||
                 x->ag == NULL || x->ag_len == NULL
             ? -ENOMEM
             : 0;
}

int st_ring_new(const st_ring_config_t* cfg, uint64_t round_id,
                uint32_t n_members, uint32_t my_rank, uint64_t n_params,
                uint64_t now_ms, st_ring_t** out) {
  if (out == NULL)
    return -EINVAL;
  *out = NULL;
  if (cfg == NULL || !config_ok(cfg) || n_members == 0 ||
      n_members > ST_RING_MAX_MEMBERS || my_rank >= n_members ||
      n_params > ST__WIRE_MAX_TENSOR_FLOATS ||
      n_params > SIZE_MAX / (2 * sizeof(float)))
    return -EINVAL;
  st_ring_t* x = calloc(1, sizeof *x);
  if (x == NULL)
    return -ENOMEM;
  x->cfg = *cfg;
  x->round_id = round_id;
  x->n = n_members;
  x->rank = my_rank;
  x->floats = n_params;
  x->steps = 2 * (n_members - 1);
  x->seg = round_seg(x);
  x->started_ms = x->last_progress_ms = now_ms;
  *out = x;
  if (n_members == 1 || n_params == 0) {
    finish(x, ST_RING_OK); /* the mean of one is itself: nothing to add */
    return 0;
  }
  for (uint32_t t = 0; t < x->steps; t++) {
    x->tx_total += chunk_segments(x, tx_chunk(x, t));
    x->rx_total += chunk_segments(x, rx_chunk(x, t));
    if (reduce_scatter(x, t))
      x->tx_rs = x->tx_total;
  }
  size_t bytes = (size_t) n_params * sizeof(float);
  x->enc_cap = (size_t) cfg->segment_floats * sizeof(float);
  x->own = malloc(bytes);
  x->sum = malloc(bytes);
  int rc = coded(x) ? coded_buffers(x) : 0;
  x->enc_cap += RING_ENVELOPE_BYTES;
  x->enc = malloc(x->enc_cap);
  if (rc != 0 || x->own == NULL || x->sum == NULL || x->enc == NULL) {
    st_ring_free(x);
    *out = NULL;
    return rc != 0 ? rc : -ENOMEM;
  }
  x->tx_first = chunk_segments(x, tx_chunk(x, 0));
  skip_empty(x, &x->tx, false);
  skip_empty(x, &x->rx, true);
  x->add = x->rx;
  if (cfg->timeout_ms > 0) {
    x->timer_pending = true;
    x->timer_at = now_ms + cfg->timeout_ms;
    if (x->timer_at < now_ms)
      x->timer_at = UINT64_MAX;
  }
  x->asked = x->want_pending = true;
  return 0;
}

void st_ring_free(st_ring_t* x) {
  if (x == NULL)
    return;
  free(x->own);
  free(x->sum);
  free(x->enc);
  free(x->code);
  free(x->dec);
  free(x->back);
  free(x->ag);
  free(x->ag_len);
  free(x);
}

/* ==== Events ================================================================
 */

int st_ring_snapshot(st_ring_t* x, uint64_t now_ms, const float* own,
                     size_t n) {
  if (x == NULL)
    return -EINVAL;
  if (x->finished)
    return 0;
  if (!x->asked || n != x->floats || own == NULL)
    return -EINVAL;
  if (own != x->own)
    memcpy(x->own, own, n * sizeof(float));
  if (x->cfg.base != NULL)
    for (size_t i = 0; i < n; i++)
      x->own[i] -= x->cfg.base[i];
  x->asked = x->want_pending = false;
  x->have_own = true;
  touch(x, now_ms);
  add_stored(x);
  progress(x);
  return 0;
}

float* st_ring_snapshot_buffer(st_ring_t* x) {
  return x != NULL && !x->finished && x->asked ? x->own : NULL;
}

/* Whether g is exactly the next segment of the receive stream. */
static bool expected(const st_ring_t* x, const st_msg_ring_seg_t* g) {
  if (x->rx.t >= x->steps || g->round_id != x->round_id)
    return false;
  uint32_t t = x->rx.t, c = rx_chunk(x, t);
  bool rs = reduce_scatter(x, t);
  uint64_t off, count;
  seg_span(x, x->rx, c, &off, &count);
  bool len_ok = coded(x) ? g->data_len > 0 && g->data_len <= x->code_cap
                         : g->data_len == count * sizeof(float);
  return g->phase == (rs ? ST_RING_REDUCE_SCATTER : ST_RING_ALL_GATHER) &&
         g->step == (rs ? t : t - (x->n - 1)) && g->chunk == c &&
         g->offset == off && len_ok;
}

/* Coded: receive-stream segment g (expected) decoded, into dec when it is
 * added now (to) and into sum where it is kept; an all-gather one is the
 * chunk's sum: divided by n there, and its bytes kept for the next step's
 * send. False when the bytes do not decode to the segment's floats. */
static bool decode_segment(st_ring_t* x, const st_msg_ring_seg_t* g,
                           uint64_t at, uint64_t count, float* to) {
  const st_ring_codec_t* k = x->cfg.codec;
  if (k->decode(k->ctx, g->data, g->data_len, to, (size_t) count) != 0)
    return false;
  if (!reduce_scatter(x, x->rx.t)) {
    float n = (float) x->n;
    for (uint64_t i = 0; i < count; i++)
      x->sum[at + i] /= n;
    size_t* len = NULL;
    uint8_t* slot = ag_slot(x, x->rx_stored + x->tx_first, &len);
    if (slot != NULL) {
      memcpy(slot, g->data, g->data_len);
      *len = g->data_len;
    }
  }
  return true;
}

int st_ring_message(st_ring_t* x, uint64_t now_ms, const uint8_t* data,
                    size_t len) {
  if (x == NULL || (data == NULL && len > 0))
    return -EINVAL;
  if (x->finished)
    return 0;
  st_msg_t m;
  if (st_wire_decode(data, len, &m, NULL) != 0 || m.type != ST_MSG_RING_SEG ||
      !expected(x, &m.u.ring_seg)) {
    st_wire_msg_free(&m);
    finish(x, ST_RING_FAIL_PROTOCOL);
    return 0;
  }
  const st_msg_ring_seg_t* g = &m.u.ring_seg;
  uint32_t t = x->rx.t;
  if (!reduce_scatter(x, t) && !x->have_own) {
    /* Every mean holds our contribution, which needs our snapshot: an
     * all-gather segment before it cannot be genuine. */
    st_wire_msg_free(&m);
    finish(x, ST_RING_FAIL_PROTOCOL);
    return 0;
  }
  uint64_t at = chunk_start(x, g->chunk) + g->offset, off, count;
  seg_span(x, x->rx, g->chunk, &off, &count);
  bool now = reduce_scatter(x, t) && x->have_own && x->rx_added == x->rx_stored;
  const uint8_t* src = g->data;
  if (coded(x)) {
    float* to = now ? x->dec : x->sum + at;
    if (!decode_segment(x, g, at, count, to)) {
      st_wire_msg_free(&m);
      finish(x, ST_RING_FAIL_PROTOCOL);
      return 0;
    }
    src = (const uint8_t*) to;
  } else if (!now) {
    memcpy(x->sum + at, g->data, g->data_len);
  }
  if (now) {
    /* Added straight from the message, the common case. */
    add_segment(x, x->rx_added, at, count, src, t + 2 == x->n);
    advance(x, &x->add, true);
    x->rx_added++;
  } else if (!reduce_scatter(x, t)) {
    /* An all-gather segment is final as it comes; a reduce-scatter one
     * before the snapshot waits in sum for add_stored. */
    delta_span(x, at, count); /* the mean, final as it comes */
  }
  advance(x, &x->rx, true);
  x->rx_stored++;
  touch(x, now_ms);
  add_stored(x);
  progress(x);
  return 0;
}

int st_ring_sent(st_ring_t* x, uint64_t now_ms) {
  if (x == NULL)
    return -EINVAL;
  if (x->finished)
    return 0;
  if (x->tx_acked == x->tx_sent)
    return -EINVAL;
  x->tx_acked++;
  touch(x, now_ms);
  progress(x);
  return 0;
}

int st_ring_tick(st_ring_t* x, uint64_t now_ms) {
  if (x == NULL)
    return -EINVAL;
  if (x->finished || x->cfg.timeout_ms == 0)
    return 0;
  uint64_t deadline = x->last_progress_ms + x->cfg.timeout_ms;
  if (deadline < x->last_progress_ms)
    deadline = UINT64_MAX;
  if (now_ms >= deadline) {
    finish(x, ST_RING_FAIL_TIMEOUT);
  } else if (now_ms >= x->timer_at) {
    x->timer_at = deadline;
    x->timer_pending = true;
  }
  return 0;
}

int st_ring_abort(st_ring_t* x, uint64_t now_ms, st_ring_result_t reason) {
  if (x == NULL || reason == ST_RING_OK ||
      (unsigned) reason >= ST_RING_RESULT_COUNT)
    return -EINVAL;
  finish(x, reason);
  return 0;
}

/* ==== Actions ===============================================================
 */

/* Whether the next segment of the send stream can be emitted now. */
static bool send_ready(const st_ring_t* x) {
  if (x->finished || x->tx.t >= x->steps ||
      x->tx_sent - x->tx_acked >= x->cfg.in_flight)
    return false;
  if (x->tx.t == 0)
    return x->have_own;
  /* Send-stream segment tx_sent is receive-stream segment tx_sent -
   * tx_first, which must have been added. */
  return x->tx_sent - x->tx_first < x->rx_added;
}

/* Coded: the bytes of the next SEND, whose floats are src[0..count) at
 * `at`. A reduce-scatter segment is encoded now, and what that rounded
 * away stays with this member (keep_rounding: at step 0, where src is own
 * itself, own becomes what the next member decodes); an all-gather one
 * goes out as its slot holds it. False (the round failed) when a partial
 * sum does not encode (a NaN or Inf). */
static bool coded_send(st_ring_t* x, uint64_t at, uint64_t count,
                       const uint8_t** data, size_t* len) {
  size_t* slot_len = NULL;
  uint8_t* slot = ag_slot(x, x->tx_sent, &slot_len);
  if (slot != NULL) {
    *data = slot;
    *len = *slot_len;
    return true;
  }
  const st_ring_codec_t* k = x->cfg.codec;
  const float* src = (x->tx.t == 0 ? x->own : x->sum) + at;
  if (k->encode(k->ctx, src, (size_t) count, x->code, x->code_cap, len) != 0 ||
      k->decode(k->ctx, x->code, *len, x->back, (size_t) count) != 0) {
    finish(x, ST_RING_FAIL_NONFINITE);
    return false;
  }
  if (x->tx.t == 0)
    memcpy(x->own + at, x->back, (size_t) count * sizeof(float));
  else
    keep_rounding(x, at, count);
  *data = x->code;
  return true;
}

static bool emit_segment(st_ring_t* x, st_ract_t* out) {
  uint32_t t = x->tx.t, c = tx_chunk(x, t);
  bool rs = reduce_scatter(x, t);
  uint64_t off, count;
  seg_span(x, x->tx, c, &off, &count);
  uint64_t at = chunk_start(x, c) + off;
  const uint8_t* data = (const uint8_t*) ((t == 0 ? x->own : x->sum) + at);
  size_t data_len = (size_t) count * sizeof(float);
  if (coded(x) && !coded_send(x, at, count, &data, &data_len))
    return false;
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_RING_SEG;
  m.u.ring_seg.round_id = x->round_id;
  m.u.ring_seg.phase = rs ? ST_RING_REDUCE_SCATTER : ST_RING_ALL_GATHER;
  m.u.ring_seg.step = rs ? t : t - (x->n - 1);
  m.u.ring_seg.chunk = c;
  m.u.ring_seg.offset = off;
  m.u.ring_seg.data = data;
  m.u.ring_seg.data_len = (uint32_t) data_len;
  size_t len = 0;
  int rc = st_wire_encode(&m, x->enc, x->enc_cap, &len);
  (void) rc; /* valid by construction, and enc_cap holds the largest */
  out->kind = ST_RACT_SEND;
  out->data = x->enc;
  out->len = len;
  advance(x, &x->tx, false);
  x->tx_sent++;
  return true;
}

bool st_ring_next_action(st_ring_t* x, st_ract_t* out) {
  if (x == NULL || out == NULL)
    return false;
  memset(out, 0, sizeof *out);
  if (x->timer_pending) {
    x->timer_pending = false;
    out->kind = ST_RACT_TIMER;
    out->at_ms = x->timer_at;
  } else if (x->want_pending) {
    x->want_pending = false;
    out->kind = ST_RACT_WANT_SNAPSHOT;
  } else if (send_ready(x) && emit_segment(x, out)) {
    /* a SEND (a coded segment that failed to encode ended the round) */
  } else if (x->apply_pending) {
    x->apply_pending = false;
    out->kind = ST_RACT_APPLY;
    out->values = x->own;
    out->n = (size_t) x->floats;
  } else if (x->done_pending) {
    x->done_pending = false;
    out->kind = ST_RACT_DONE;
    out->result = x->result;
  } else {
    return false;
  }
  return true;
}

bool st_ring_finished(const st_ring_t* x) {
  return x == NULL || x->finished;
}

void st_ring_progress(const st_ring_t* x, st_ring_progress_t* out) {
  memset(out, 0, sizeof *out);
  if (x == NULL)
    return;
  out->started_ms = x->started_ms;
  out->last_progress_ms = x->last_progress_ms;
  out->segments_to_send = x->tx_total;
  out->segments_sent = x->tx_sent;
  out->segments_acked = x->tx_acked;
  out->segments_to_receive = x->rx_total;
  out->segments_received = x->rx_stored;
  out->have_snapshot = x->have_own;
}

float* st_ring_delta(st_ring_t* x) {
  if (x == NULL || !x->finished || x->result != ST_RING_OK || !x->have_own ||
      x->floats == 0)
    return NULL;
  return x->own;
}

const float* st_ring_mean(const st_ring_t* x) {
  if (x == NULL || !x->finished || x->result != ST_RING_OK || !x->have_own ||
      x->floats == 0)
    return NULL;
  return x->sum;
}
