/* xchg_pump.h: the in-memory pump that wires two exchange machines
 * (gossip/exchange.c) back to back, shared by test_gossip_exchange.c and
 * test_gossip_exchange_coded.c (static functions: include it once per
 * suite). Each side's actions are drained, a SEND is queued as a frame
 * that counts as written once the pump acknowledges it (st_xchg_sent,
 * eagerly or one a round), written frames are delivered in order to the
 * other side's st_xchg_message, WANT_SNAPSHOT is answered with the side's
 * float vector (whose buffer is then overwritten, as a driver may), ENCODE
 * and DECODE with the side's test codec (xchg_pump_codec_t; a compressed
 * exchange's driver work), and a side's DONE closes the connection once
 * its frames are delivered. A hook may change, drop, repeat or cut any
 * frame in transit. */
#ifndef STARLING_TESTS_XCHG_PUMP_H
#define STARLING_TESTS_XCHG_PUMP_H

#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/gossip.h"
#include "tests/unit/testutil.h"

#define CHUNK_FLOATS (ST_WIRE_CHUNK_MAX_BYTES / 4)
#define BIG_N (2 * CHUNK_FLOATS + 3)
#define FRAME_CAP (ST_WIRE_MAX_MESSAGE_BYTES + 64)
/* A hook may rewrite a frame a few bytes longer (a wider integer). */
#define FRAME_SLACK 64
#define T0 1000

static st_rng_t rng;

static void setup(void) {
  st_rng_seed(&rng, tu_seed());
}

/* ==== The pump ==============================================================
 */

typedef enum { H_DELIVER, H_DROP, H_CLOSE, H_TWICE } hook_rc_t;

/* Sees frame `index` (0, 1, ... per direction) from side `from` (0 = A)
 * before delivery; may rewrite data[0..*len), at most FRAME_SLACK bytes
 * longer. */
typedef hook_rc_t (*hook_fn)(void* ctx, int from, int index, uint8_t* data,
                             size_t* len);

typedef struct {
  uint8_t* data;
  size_t len;
} frame_t;

typedef struct {
  st_xchg_t* x;
  frame_t* out; /* frames sent, oldest first; the last `unacked` of them
                   are not yet written */
  size_t out_head, out_len, out_cap;
  unsigned unacked, max_unacked;
  int sent_frames; /* SENDs emitted */
  int delivered;   /* frames of ours handed to the other side */
  int n_timer;
  uint64_t timer_at;
  int n_want, n_want_answered;
  int n_apply;
  float* apply; /* a copy of APPLY's values */
  const float* apply_ptr;
  bool released; /* st_xchg_release_buffers was called: apply_ptr is gone */
  size_t apply_n;
  uint64_t apply_step;
  bool apply_held; /* APPLY's held (values NULL) */
  bool done_held;  /* DONE's held */
  int n_done;
  st_xchg_result_t result;
  bool has_peer_model;
  char peer_model[ST_XCHG_MODEL_MAX];
  double delta_norm; /* DONE's */
  bool clipped;
  double clip_norm, clip_base;
  char* peer_tensors; /* a copy of DONE's, NUL-terminated, or NULL */
  size_t peer_tensors_len;
  bool closed_seen; /* the connection closed while we were not done */
  const float* snap;
  size_t snap_n;
  uint64_t snap_step;
  /* A compressed exchange (see xchg_pump_codec_t). */
  const struct xchg_pump_codec_s* codec;
  int n_encode, n_decode;
  bool defer_codec;   /* answer ENCODE/DECODE a round later, as a driver
                         that runs them on another thread would */
  bool hold_decode;   /* answer DECODE only once the connection closed:
                         a pool thread slower than the peer */
  bool codec_pending; /* one is held back */
  st_xact_t pending;
  bool coded_exchange; /* DONE's */
  int codec_drop;      /* DONE's */
  int snap_after;      /* answer WANT_SNAPSHOT from this round of the pump */
  bool take_buffers;   /* take each SEND's buffer (st_xchg_take_send_buffer)
                          instead of copying it, as the node does */
  int n_taken;         /* SENDs whose buffer was taken */
  int room_waits;      /* rounds a frame to us waited: st_xchg_rx_room */
} side_t;

/* The driver's codec work for a compressed exchange: encode writes
 * coded[0..coded_len) from work[0..n) (our snapshot; the anchor is the
 * codec's business) and D of it back over work, returning 0 or an errno;
 * decode fills work from the peer's bytes, returning 0 or an errno with a
 * reason. */
typedef struct xchg_pump_codec_s {
  int (*encode)(const struct xchg_pump_codec_s* c, float* work, size_t n,
                uint8_t* coded, size_t coded_len);
  int (*decode)(const struct xchg_pump_codec_s* c, float* work, size_t n,
                const uint8_t* coded, size_t coded_len, int* reason);
  const float* anchor;
} xchg_pump_codec_t;

typedef struct {
  side_t s[2];
  hook_fn hook;
  void* hook_ctx;
  bool lazy_acks; /* one ack per side a round, else all at once */
  bool closed;
  bool honour_room; /* hold frames while the receiver has no room, as a
                       driver that stops reading */
} pump_t;

/* Does the held ENCODE or DECODE and reports it to the machine. */
static void codec_work(side_t* s) {
  st_xact_t a = s->pending;
  s->codec_pending = false;
  if (a.kind == ST_XACT_ENCODE) {
    s->n_encode++;
    int rc = s->codec->encode(s->codec, a.work, a.n, a.coded, a.coded_len);
    ck_assert_int_eq(st_xchg_encoded(s->x, T0, rc), 0);
    return;
  }
  s->n_decode++;
  int reason = 0;
  int rc =
      s->codec->decode(s->codec, a.work, a.n, a.coded, a.coded_len, &reason);
  ck_assert_int_eq(st_xchg_decoded(s->x, T0, rc, reason), 0);
}

static void drain(side_t* s) {
  st_xact_t a;
  while (st_xchg_next_action(s->x, &a)) {
    switch (a.kind) {
      case ST_XACT_SEND:
        ck_assert_uint_gt(a.len, 0);
        ck_assert_uint_le(a.len, ST_WIRE_MAX_MESSAGE_BYTES);
        ck_assert_int_eq(s->n_done, 0);
        if (s->out_head + s->out_len == s->out_cap) {
          s->out_cap = s->out_cap ? 2 * s->out_cap : 16;
          s->out = realloc(s->out, s->out_cap * sizeof *s->out);
          ck_assert_ptr_nonnull(s->out);
        }
        frame_t* f = &s->out[s->out_head + s->out_len++];
        uint8_t* taken =
            s->take_buffers ? st_xchg_take_send_buffer(s->x, &a) : NULL;
        if (taken != NULL) { /* ours now: the machine encodes elsewhere */
          ck_assert_ptr_eq(taken, a.data);
          s->n_taken++;
          f->data = realloc(taken, a.len + FRAME_SLACK);
        } else {
          f->data = malloc(a.len + FRAME_SLACK);
          if (f->data != NULL)
            memcpy(f->data, a.data, a.len);
        }
        ck_assert_ptr_nonnull(f->data);
        f->len = a.len;
        s->sent_frames++;
        s->unacked++;
        if (s->unacked > s->max_unacked)
          s->max_unacked = s->unacked;
        ck_assert_uint_le(s->unacked, ST_XCHG_CHUNKS_IN_FLIGHT);
        break;
      case ST_XACT_WANT_SNAPSHOT:
        s->n_want++;
        break;
      case ST_XACT_APPLY:
        ck_assert_int_eq(s->n_done, 0);
        ck_assert_int_eq(s->n_apply, 0);
        s->n_apply++;
        s->apply_n = a.n;
        s->apply_ptr = a.values;
        s->apply_step = a.step;
        s->apply_held = a.held;
        ck_assert(a.held == (a.values == NULL));
        s->apply = malloc(a.n * sizeof(float) + 1);
        ck_assert_ptr_nonnull(s->apply);
        if (a.values != NULL)
          memcpy(s->apply, a.values, a.n * sizeof(float));
        break;
      case ST_XACT_ENCODE:
      case ST_XACT_DECODE:
        ck_assert_ptr_nonnull(s->codec);
        ck_assert_uint_eq(a.n, s->snap_n);
        ck_assert(!s->codec_pending);
        s->pending = a;
        s->codec_pending = true;
        if (!s->defer_codec && !(s->hold_decode && a.kind == ST_XACT_DECODE))
          codec_work(s);
        break;
      case ST_XACT_TIMER:
        s->n_timer++;
        s->timer_at = a.at_ms;
        break;
      case ST_XACT_DONE:
        ck_assert_int_eq(s->n_done, 0);
        s->n_done++;
        s->result = a.result;
        s->coded_exchange = a.coded_exchange;
        s->done_held = a.held;
        s->codec_drop = a.codec_drop;
        s->delta_norm = a.delta_norm;
        s->clipped = a.clipped;
        s->clip_norm = a.clip_norm;
        s->clip_base = a.clip_base;
        s->has_peer_model = a.peer_model != NULL;
        if (a.peer_model != NULL) {
          ck_assert_uint_lt(strlen(a.peer_model), ST_XCHG_MODEL_MAX);
          strcpy(s->peer_model, a.peer_model);
        }
        ck_assert((a.peer_tensors == NULL) == (a.peer_tensors_len == 0));
        if (a.peer_tensors != NULL) {
          s->peer_tensors = malloc(a.peer_tensors_len + 1);
          ck_assert_ptr_nonnull(s->peer_tensors);
          memcpy(s->peer_tensors, a.peer_tensors, a.peer_tensors_len);
          s->peer_tensors[a.peer_tensors_len] = '\0';
          s->peer_tensors_len = a.peer_tensors_len;
        }
        ck_assert(st_xchg_finished(s->x));
        break;
    }
  }
}

static void close_both(pump_t* p) {
  p->closed = true;
  for (int i = 0; i < 2; i++) {
    p->s[i].closed_seen = p->s[i].n_done == 0;
    ck_assert_int_eq(st_xchg_closed(p->s[i].x, T0), 0);
    drain(&p->s[i]);
  }
}

/* Runs until nothing moves. */
static void pump_run(pump_t* p) {
  static float scratch[BIG_N];
  for (int round = 0; round < 100000; round++) {
    bool moved = false;
    for (int i = 0; i < 2; i++) {
      side_t* s = &p->s[i];
      drain(s);
      bool held =
          s->hold_decode && !p->closed && s->pending.kind == ST_XACT_DECODE;
      if (s->codec_pending && s->n_done == 0 && !held) {
        codec_work(s);
        moved = true;
        drain(s);
      }
      if (s->n_want > s->n_want_answered && round >= s->snap_after) {
        ck_assert_uint_le(s->snap_n, BIG_N);
        memcpy(scratch, s->snap, s->snap_n * sizeof(float));
        ck_assert_int_eq(
            st_xchg_snapshot(s->x, T0, scratch, s->snap_n, s->snap_step), 0);
        /* The machine copied it: the driver may reuse its buffer. */
        for (size_t k = 0; k < s->snap_n; k++)
          scratch[k] = 7.0f;
        s->n_want_answered++;
        moved = true;
        drain(s);
      }
      for (int acks = 0; s->unacked > 0 && (!p->lazy_acks || acks < 1);
           acks++) {
        s->unacked--;
        ck_assert_int_eq(st_xchg_sent(s->x, T0), 0);
        moved = true;
        drain(s);
      }
    }
    for (int i = 0; i < 2 && !p->closed; i++) {
      side_t *s = &p->s[i], *o = &p->s[1 - i];
      if (s->out_len <= s->unacked)
        continue; /* nothing written yet */
      if (p->honour_room && !st_xchg_rx_room(o->x)) {
        o->room_waits++;
        continue;
      }
      frame_t f = s->out[s->out_head++];
      s->out_len--;
      moved = true;
      int index = s->delivered++;
      hook_rc_t h =
          p->hook ? p->hook(p->hook_ctx, i, index, f.data, &f.len) : H_DELIVER;
      if (h == H_CLOSE) {
        free(f.data);
        close_both(p);
        break;
      }
      for (int times = h == H_TWICE  ? 2
                       : h == H_DROP ? 0
                                     : 1;
           times > 0; times--) {
        ck_assert_int_eq(st_xchg_message(o->x, T0, f.data, f.len), 0);
        drain(o);
      }
      free(f.data);
    }
    /* A side that is done closes the connection after its frames. */
    for (int i = 0; i < 2 && !p->closed; i++) {
      side_t* s = &p->s[i];
      if (s->n_done > 0 && s->out_len == 0) {
        side_t* o = &p->s[1 - i];
        p->closed = true;
        o->closed_seen = o->n_done == 0;
        ck_assert_int_eq(st_xchg_closed(o->x, T0), 0);
        drain(o);
        moved = true;
      }
    }
    bool waiting = false; /* a snapshot due in a later round */
    for (int i = 0; i < 2; i++)
      waiting |= p->s[i].n_want > p->s[i].n_want_answered &&
                 round < p->s[i].snap_after;
    if (!moved && !waiting)
      return;
  }
  ck_abort_msg("the pump did not settle");
}

static void pump_free(pump_t* p) {
  for (int i = 0; i < 2; i++) {
    side_t* s = &p->s[i];
    /* APPLY's values are still the machine's, unchanged, until free. */
    if (s->n_apply > 0 && s->apply_n > 0 && !s->apply_held && !s->released)
      ck_assert_mem_eq(s->apply_ptr, s->apply, s->apply_n * sizeof(float));
    st_xchg_free(s->x);
    for (size_t k = s->out_head; k < s->out_head + s->out_len; k++)
      free(s->out[k].data);
    free(s->out);
    free(s->apply);
    free(s->peer_tensors);
  }
}

/* ==== Set-ups ===============================================================
 */

static void local_init(st_xchg_local_t* l, uint8_t fp, const char* model,
                       uint64_t n, uint64_t step) {
  memset(l, 0, sizeof *l);
  memset(l->fingerprint, fp, 16);
  strcpy(l->model, model);
  l->n_params = n;
  l->step = step;
}

static float* rand_vec(size_t n, float lo, float hi) {
  float* v = malloc(n * sizeof(float) + 1);
  ck_assert_ptr_nonnull(v);
  tu_fill_uniform(&rng, v, n, lo, hi);
  return v;
}

typedef struct {
  st_xchg_kind_t kind;
  st_xchg_local_t la, lb;
  bool busy;
  st_xchg_config_t cfg;
  bool split_cfg; /* the responder runs cfg_b, not cfg */
  st_xchg_config_t cfg_b;
  const float *snap_a, *snap_b;
  hook_fn hook;
  void* hook_ctx;
  bool lazy_acks;
  bool take_buffers;
  const xchg_pump_codec_t *codec_a, *codec_b;
  bool defer_codec;
  bool hold_decode_b; /* the responder decodes only after the close */
  bool honour_room;
  int snap_b_after; /* the responder's snapshot from this pump round */
} run_t;

static void run_init(run_t* r, st_xchg_kind_t kind, size_t n) {
  memset(r, 0, sizeof *r);
  r->kind = kind;
  local_init(&r->la, 0x11, "mlp:784-256-128-10 f32", n, 10);
  local_init(&r->lb, 0x11, "mlp:784-256-128-10 f32", n, 4242);
  st_xchg_config_default(&r->cfg);
}

static void pump_start(pump_t* p, const run_t* r) {
  memset(p, 0, sizeof *p);
  p->hook = r->hook;
  p->hook_ctx = r->hook_ctx;
  p->lazy_acks = r->lazy_acks;
  p->honour_room = r->honour_room;
  p->s[1].snap_after = r->snap_b_after;
  ck_assert_int_eq(
      st_xchg_new_initiator(&r->cfg, r->kind, &r->la, T0, &p->s[0].x), 0);
  ck_assert_int_eq(st_xchg_new_responder(r->split_cfg ? &r->cfg_b : &r->cfg,
                                         &r->lb, r->busy, T0, &p->s[1].x),
                   0);
  p->s[0].snap = r->snap_a;
  p->s[0].snap_n = r->la.n_params;
  p->s[1].snap = r->snap_b;
  p->s[1].snap_n = r->lb.n_params;
  p->s[1].snap_step = r->lb.step + 3;
  p->s[0].codec = r->codec_a;
  p->s[1].codec = r->codec_b;
  p->s[0].defer_codec = p->s[1].defer_codec = r->defer_codec;
  p->s[1].hold_decode = r->hold_decode_b;
  p->s[0].take_buffers = p->s[1].take_buffers = r->take_buffers;
  pump_run(p);
  for (int i = 0; i < 2; i++)
    ck_assert_int_eq(p->s[i].n_timer, 1);
}

/* Re-encodes m over a frame a hook changed (at most FRAME_SLACK longer). */
static void reencode(uint8_t* data, size_t* len, const st_msg_t* m) {
  static uint8_t tmp[FRAME_CAP];
  size_t n = 0;
  ck_assert_int_eq(st_wire_encode(m, tmp, sizeof tmp, &n), 0);
  ck_assert_uint_le(n, *len + FRAME_SLACK);
  memcpy(data, tmp, n);
  *len = n;
}

#endif
