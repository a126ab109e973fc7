/* test_gossip_exchange.c: the Check suite for the exchange machine
 * (gossip/exchange.c; the contract in gossip.h, "Exchanges"), in float32
 * (compressed exchanges: test_gossip_exchange_coded.c). Two machines, an
 * initiator A and a responder B, are wired back to back through the
 * in-memory pump of xchg_pump.h; WANT_SNAPSHOT is answered with the side's
 * random float vector, and a hook may change, drop, repeat or cut any
 * frame in transit.
 *
 * Checked over sizes 1, 1000 and 2 * 262144 + 3 floats (three chunks, the
 * last not full): AVERAGE gives both sides APPLY with delta = (peer - own)
 * / 2 bit for bit, the two deltas summing to zero; FETCH gives the joiner
 * the donor's exact parameters and step; BUSY, MISMATCH (each side sees
 * the other's model), NOT_READY; the guards (NaN, Inf, norm, hash, size)
 * and protocol failures (cut, garbage, repeated or out-of-order messages),
 * a connection closed mid-transfer and the timeout, each with no APPLY on
 * the failing side; and flow control: never more than
 * ST_XCHG_CHUNKS_IN_FLIGHT SENDs unacknowledged, checked on every action. */
#include "tests/unit/xchg_pump.h"

/* ==== Successful exchanges ==================================================
 */

static const size_t sizes[] = {1, 1000, BIG_N};
#define NSIZES 3

/* A's delta is (b - a) / 2 and B's (a - b) / 2, bit for bit in float: the
 * pair's sum is preserved, the deltas cancel exactly. (Check logs every
 * assertion to a file: one check after the loop.) */
static void assert_pair_deltas(const side_t* sa, const side_t* sb,
                               const float* a, const float* b, size_t n) {
  long bad = -1;
  for (size_t i = 0; i < n && bad < 0; i++) {
    float da = (b[i] - a[i]) / 2, db = (a[i] - b[i]) / 2;
    if (memcmp(&sa->apply[i], &da, 4) != 0 ||
        memcmp(&sb->apply[i], &db, 4) != 0 || sa->apply[i] + sb->apply[i] != 0)
      bad = (long) i;
  }
  ck_assert_msg(bad < 0, "deltas differ at %ld", bad);
}

/* _i: (size index * 2 + lazy acks) * 2 + the driver takes the chunks'
 * buffers (st_xchg_take_send_buffer): two chunks are encoded before
 * either is delivered, so a buffer the machine went on writing would show
 * in the deltas. */
START_TEST(test_average) {
  size_t n = sizes[_i / 4];
  run_t r;
  run_init(&r, ST_XCHG_AVERAGE, n);
  r.lazy_acks = (_i / 2) % 2;
  r.take_buffers = _i % 2;
  float* a = rand_vec(n, -1, 1);
  float* b = rand_vec(n, -1, 1);
  r.snap_a = a;
  r.snap_b = b;
  pump_t p;
  pump_start(&p, &r);
  side_t *sa = &p.s[0], *sb = &p.s[1];
  ck_assert_int_eq(sa->result, ST_XCHG_OK);
  ck_assert_int_eq(sb->result, ST_XCHG_OK);
  ck_assert_int_eq(sa->n_apply, 1);
  ck_assert_int_eq(sb->n_apply, 1);
  ck_assert_uint_eq(sa->apply_n, n);
  ck_assert_uint_eq(sb->apply_n, n);
  ck_assert_int_eq(st_xchg_kind(sb->x), ST_XCHG_AVERAGE);
  assert_pair_deltas(sa, sb, a, b, n);
  /* REQ or REPLY, the chunks, XCHG_DONE. */
  int frames = 1 + (int) ((n + CHUNK_FLOATS - 1) / CHUNK_FLOATS) + 1;
  ck_assert_int_eq(sa->sent_frames, frames);
  ck_assert_int_eq(sb->sent_frames, frames);
  /* Only the chunks' buffer is handed over, never REQ, REPLY or DONE's. */
  ck_assert_int_eq(sa->n_taken, r.take_buffers ? frames - 2 : 0);
  ck_assert_int_eq(sb->n_taken, r.take_buffers ? frames - 2 : 0);
  if (n == BIG_N && r.lazy_acks)
    ck_assert_uint_eq(sa->max_unacked, ST_XCHG_CHUNKS_IN_FLIGHT);
  ck_assert(sa->has_peer_model && sb->has_peer_model);
  /* Finished: the driver may free the buffers (APPLY's values, the
   * snapshot) while the machine stays; twice does nothing. */
  ck_assert_ptr_nonnull(st_xchg_own(sa->x));
  ck_assert_int_eq(st_xchg_release_buffers(sa->x), 0);
  sa->released = true;
  ck_assert_ptr_null(st_xchg_own(sa->x));
  ck_assert_int_eq(st_xchg_release_buffers(sa->x), 0);
  ck_assert(st_xchg_finished(sa->x));
  pump_free(&p);
  free(a);
  free(b);
}
END_TEST

/* delta_in_own: the delta made in the snapshot's buffer, bit for bit the
 * same, whichever sides do it (the wire is the same). _i: 0 both sides;
 * 1 the initiator only, lazy acks; 2 the responder only; 3 both, the
 * responder's snapshot late (all of the initiator's chunks wait for it)
 * and a driver that stops reading while the machine has no room (a window
 * of one float); 4 the same, reading on (the waiting chunks are all
 * held). */
START_TEST(test_average_in_place) {
  size_t n = BIG_N;
  run_t r;
  run_init(&r, ST_XCHG_AVERAGE, n);
  r.split_cfg = true;
  r.cfg_b = r.cfg;
  r.cfg.delta_in_own = _i != 2;
  r.cfg_b.delta_in_own = _i != 1;
  r.lazy_acks = _i == 1;
  if (_i >= 3) {
    r.snap_b_after = 40;
    r.cfg.rx_window_floats = r.cfg_b.rx_window_floats = 1;
    r.honour_room = _i == 3;
  }
  float* a = rand_vec(n, -1, 1);
  float* b = rand_vec(n, -1, 1);
  r.snap_a = a;
  r.snap_b = b;
  /* Case 0: A's snapshot in a buffer the driver lends (local.buf). */
  float* lent = _i == 0 ? malloc(n * sizeof(float)) : NULL;
  r.la.buf = lent;
  pump_t p;
  pump_start(&p, &r);
  side_t *sa = &p.s[0], *sb = &p.s[1];
  ck_assert_int_eq(sa->result, ST_XCHG_OK);
  ck_assert_int_eq(sb->result, ST_XCHG_OK);
  ck_assert_int_eq(sa->n_apply, 1);
  ck_assert_int_eq(sb->n_apply, 1);
  if (lent != NULL) /* the delta was made in it; the machine frees it not */
    ck_assert_ptr_eq(sa->apply_ptr, lent);
  assert_pair_deltas(sa, sb, a, b, n);
  /* In place, the snapshot became the delta. */
  ck_assert((st_xchg_own(sa->x) == NULL) == r.cfg.delta_in_own);
  ck_assert((st_xchg_own(sb->x) == NULL) == r.cfg_b.delta_in_own);
  /* The responder had no room while it waited for its snapshot: a
   * driver that honours it held the initiator's chunks back. */
  if (_i == 3)
    ck_assert_int_gt(sb->room_waits, 0);
  ck_assert_int_eq(sa->room_waits, 0);
  pump_free(&p);
  free(lent); /* still ours (ASan: freed once) */
  free(a);
  free(b);
}
END_TEST

/* Clipping: A (clip_norm 1) gets B's pull scaled to norm 1 along the same
 * direction, B (no clipping) the whole delta; both report the norm before.
 * A bound above the delta changes nothing. BIG_N spans several chunks, so
 * the norm is summed across them. */
START_TEST(test_average_clipped) {
  size_t n = BIG_N;
  float* a = calloc(n, sizeof(float));
  float* b = malloc(n * sizeof(float));
  ck_assert(a != NULL && b != NULL);
  for (size_t i = 0; i < n; i++)
    b[i] = 1.0f;
  double norm = 0.5 * sqrt((double) n);
  /* case: bit 0 above the bound; bit 1 A makes the delta in place. */
  for (int cs = 0; cs < 4; cs++) {
    int above = cs & 1;
    run_t r;
    run_init(&r, ST_XCHG_AVERAGE, n);
    r.cfg.norm_mult = 0; /* the norm guard would refuse B's from 0 */
    r.split_cfg = true;
    r.cfg_b = r.cfg;
    r.cfg.clip_norm = above ? norm * 1.01 : 1.0;
    r.cfg.delta_in_own = cs >> 1;
    r.snap_a = a;
    r.snap_b = b;
    pump_t p;
    pump_start(&p, &r);
    side_t *sa = &p.s[0], *sb = &p.s[1];
    ck_assert_int_eq(sa->result, ST_XCHG_OK);
    ck_assert_int_eq(sb->result, ST_XCHG_OK);
    ck_assert_double_eq_tol(sa->delta_norm, norm, norm * 1e-6);
    ck_assert_double_eq_tol(sb->delta_norm, norm, norm * 1e-6);
    ck_assert(sa->clipped == !above);
    ck_assert(!sb->clipped);
    float want_a = above ? 0.5f : (float) (1.0 / sqrt((double) n));
    long bad = -1;
    double sq = 0;
    for (size_t i = 0; i < n && bad < 0; i++) {
      sq += (double) sa->apply[i] * sa->apply[i];
      if (fabsf(sa->apply[i] - want_a) > want_a * 1e-6f ||
          sb->apply[i] != -0.5f)
        bad = (long) i;
    }
    ck_assert_msg(bad < 0, "delta wrong at %ld", bad);
    ck_assert_double_eq_tol(sqrt(sq), above ? norm : 1.0,
                            (above ? norm : 1.0) * 1e-5);
    pump_free(&p);
  }
  /* The bound is max(clip_norm, clip_rel * (|own| + 1)) * clip_scale; A's
   * own snapshot is 0: max(0.1, 0.5) * 0.5 = 0.25. DONE says both. */
  {
    run_t r;
    run_init(&r, ST_XCHG_AVERAGE, n);
    r.cfg.norm_mult = 0;
    r.split_cfg = true;
    r.cfg_b = r.cfg;
    r.cfg.clip_rel = 0.5;
    r.cfg.clip_norm = 0.1;
    r.cfg.clip_scale = 0.5;
    r.snap_a = a;
    r.snap_b = b;
    pump_t p;
    pump_start(&p, &r);
    ck_assert(p.s[0].clipped && !p.s[1].clipped);
    ck_assert_double_eq_tol(p.s[0].clip_norm, 0.25, 1e-12);
    ck_assert_double_eq_tol(p.s[0].clip_base, 0.5, 1e-12);
    ck_assert(p.s[1].clip_norm == 0);
    double sq = 0;
    for (size_t i = 0; i < n; i++)
      sq += (double) p.s[0].apply[i] * p.s[0].apply[i];
    ck_assert_double_eq_tol(sqrt(sq), 0.25, 1e-5);
    pump_free(&p);
  }
  /* A negative, NaN or infinite bound is misuse. */
  st_xchg_config_t cfg;
  st_xchg_config_default(&cfg);
  st_xchg_local_t l;
  local_init(&l, 1, "m", 10, 0);
  st_xchg_t* x = NULL;
  static const double bad_clip[] = {-1.0, NAN, INFINITY};
  for (size_t i = 0; i < 3; i++) {
    cfg.clip_norm = bad_clip[i];
    ck_assert_int_eq(st_xchg_new_initiator(&cfg, ST_XCHG_AVERAGE, &l, T0, &x),
                     -EINVAL);
    cfg.clip_norm = 0;
    cfg.clip_rel = bad_clip[i];
    ck_assert_int_eq(st_xchg_new_initiator(&cfg, ST_XCHG_AVERAGE, &l, T0, &x),
                     -EINVAL);
    cfg.clip_rel = 0;
    cfg.clip_scale = bad_clip[i];
    ck_assert_int_eq(st_xchg_new_initiator(&cfg, ST_XCHG_AVERAGE, &l, T0, &x),
                     -EINVAL);
    cfg.clip_scale = 0;
    ck_assert_int_eq(st_xchg_new_initiator(&cfg, ST_XCHG_AVERAGE, &l, T0, &x),
                     -EINVAL);
    cfg.clip_scale = 1;
  }
  free(a);
  free(b);
}
END_TEST

/* The bound: none before ST_XCHG_CLIP_WARMUP norms or with mult 0; then
 * mult times the median of at most ST_XCHG_CLIP_HISTORY, which a minority
 * of huge norms does not move. */
START_TEST(test_clip_bound) {
  double h[ST_XCHG_CLIP_HISTORY + 4];
  for (size_t i = 0; i < sizeof h / sizeof h[0]; i++)
    h[i] = (double) (i + 1); /* 1, 2, 3, ... */
  ck_assert(st_xchg_clip_bound(h, ST_XCHG_CLIP_WARMUP - 1, 3) == 0);
  ck_assert(st_xchg_clip_bound(h, ST_XCHG_CLIP_HISTORY, 0) == 0);
  ck_assert(st_xchg_clip_bound(h, ST_XCHG_CLIP_HISTORY, NAN) == 0);
  /* 8 norms 1..8: median 4.5; 9 norms: 5. */
  ck_assert_double_eq(st_xchg_clip_bound(h, 8, 2), 9.0);
  ck_assert_double_eq(st_xchg_clip_bound(h, 9, 2), 10.0);
  /* Only the first ST_XCHG_CLIP_HISTORY count (16: median 8.5). */
  ck_assert_double_eq(st_xchg_clip_bound(h, sizeof h / sizeof h[0], 1), 8.5);
  /* Seven of sixteen a million times larger, in any order: the median
   * stays among the honest ones. */
  double mixed[ST_XCHG_CLIP_HISTORY];
  for (size_t i = 0; i < ST_XCHG_CLIP_HISTORY; i++)
    mixed[i] = i % 16 < 7 ? 1e6 : 1.0 + (double) i / 100;
  double b = st_xchg_clip_bound(mixed, ST_XCHG_CLIP_HISTORY, 3);
  ck_assert(b > 3.0 && b < 3.5);
}
END_TEST

START_TEST(test_fetch) {
  size_t n = sizes[_i / 2];
  run_t r;
  run_init(&r, ST_XCHG_FETCH, n);
  r.lazy_acks = _i % 2;
  float* b = rand_vec(n, -3, 3);
  r.snap_b = b;
  /* With lazy acks, both sides lend their buffer (local.buf): the donor's
   * holds its snapshot, the joiner's the state it receives. */
  float* lent_a = r.lazy_acks ? malloc(n * sizeof(float)) : NULL;
  float* lent_b = r.lazy_acks ? malloc(n * sizeof(float)) : NULL;
  r.la.buf = lent_a;
  r.lb.buf = lent_b;
  pump_t p;
  pump_start(&p, &r);
  side_t *sa = &p.s[0], *sb = &p.s[1];
  ck_assert_int_eq(sa->result, ST_XCHG_OK);
  ck_assert_int_eq(sb->result, ST_XCHG_OK);
  if (lent_a != NULL) {
    ck_assert_ptr_eq(sa->apply_ptr, lent_a);
    ck_assert_mem_eq(lent_b, b, n * sizeof(float)); /* the donor's snapshot */
  }
  ck_assert_int_eq(sa->n_want, 0); /* the joiner sends nothing */
  ck_assert_int_eq(sb->n_want, 1);
  ck_assert_int_eq(sa->n_apply, 1);
  ck_assert_int_eq(sb->n_apply, 0);
  ck_assert_uint_eq(sa->apply_n, n);
  ck_assert_mem_eq(sa->apply, b, n * sizeof(float));
  ck_assert_uint_eq(sa->apply_step, 4242); /* the donor's, from its REPLY */
  ck_assert_int_eq(sa->sent_frames, 1);
  ck_assert_int_eq(st_xchg_kind(sb->x), ST_XCHG_FETCH);
  pump_free(&p);
  free(lent_a); /* still ours (ASan: freed once) */
  free(lent_b);
  free(b);
}
END_TEST

/* FETCH of a held state (gossip.h): sides that name the same start state
 * (anchor, and the hash of its floats in held_hash). */
static void set_held(st_xchg_local_t* l, uint8_t id, const float* v, size_t n) {
  l->has_held = true;
  memset(l->anchor, id, sizeof l->anchor);
  st_hash_t h;
  st_hash_init(&h);
  st_hash_update(&h, v, n * sizeof(float));
  st_hash_final(&h, l->held_hash);
}

typedef enum {
  HELD_BOTH,        /* both hold it: nothing sent */
  HELD_DONOR_MOVED, /* the donor's snapshot is not it any more: streamed */
  HELD_JOINER_NONE, /* the joiner names none: streamed */
  HELD_OTHER_ID,    /* the two name different states: streamed */
  HELD_LYING_DONOR, /* same id, another hash: an empty stream, refused */
  HELD_CASES
} held_case_t;

/* A FETCH between sides that hold the start state sends REPLY and DONE
 * only, and the joiner keeps its parameters (APPLY held, values NULL);
 * any other case streams as ever, or fails HASH, never applying a state
 * nobody sent. */
START_TEST(test_fetch_held) {
  size_t n = _i % 2 ? BIG_N : 1000;
  held_case_t c = (held_case_t) (_i / 2);
  run_t r;
  run_init(&r, ST_XCHG_FETCH, n);
  float* start = rand_vec(n, -3, 3);
  float* moved = rand_vec(n, -3, 3);
  set_held(&r.la, 7, start, n);
  set_held(&r.lb, 7, start, n);
  r.snap_b = c == HELD_DONOR_MOVED ? moved : start;
  if (c == HELD_JOINER_NONE)
    memset(&r.la.anchor, 0, sizeof r.la.anchor);
  if (c == HELD_OTHER_ID)
    memset(&r.la.anchor, 8, sizeof r.la.anchor);
  if (c == HELD_LYING_DONOR) {
    set_held(&r.la, 7, moved, n); /* the joiner's own state hashes apart */
    r.la.has_held = true;
  }
  pump_t p;
  pump_start(&p, &r);
  side_t *sa = &p.s[0], *sb = &p.s[1];
  if (c == HELD_LYING_DONOR) {
    ck_assert_int_eq(sa->result, ST_XCHG_FAIL_HASH);
    ck_assert_int_eq(sa->n_apply, 0);
  } else {
    ck_assert_int_eq(sa->result, ST_XCHG_OK);
    ck_assert_int_eq(sb->result, ST_XCHG_OK);
    ck_assert_int_eq(sa->n_apply, 1);
    ck_assert_uint_eq(sa->apply_step, 4242);
  }
  bool held = c == HELD_BOTH || c == HELD_LYING_DONOR;
  /* REPLY and DONE, or those and the chunks. */
  ck_assert_int_eq(
      sb->sent_frames,
      held ? 2 : 2 + (int) ((n + CHUNK_FLOATS - 1) / CHUNK_FLOATS));
  if (c == HELD_BOTH) {
    ck_assert(sa->apply_held && sa->apply_ptr == NULL);
    ck_assert(sa->done_held && sb->done_held);
  } else if (c != HELD_LYING_DONOR) {
    ck_assert(!sa->apply_held && !sa->done_held && !sb->done_held);
    ck_assert_mem_eq(sa->apply, r.snap_b, n * sizeof(float));
  }
  pump_free(&p);
  free(start);
  free(moved);
}
END_TEST

/* ==== Refusals ==============================================================
 */

typedef struct {
  const char* what;
  st_xchg_kind_t kind;
  uint64_t na, nb;
  uint8_t fpa, fpb;
  bool busy;
  st_xchg_result_t want;
} refusal_t;

static const refusal_t refusals[] = {
    {"busy average", ST_XCHG_AVERAGE, 1000, 1000, 1, 1, true, ST_XCHG_BUSY},
    {"busy fetch", ST_XCHG_FETCH, 1000, 1000, 1, 1, true, ST_XCHG_BUSY},
    {"fingerprint average", ST_XCHG_AVERAGE, 1000, 1000, 1, 2, false,
     ST_XCHG_MISMATCH},
    {"fingerprint fetch", ST_XCHG_FETCH, 1000, 1000, 1, 2, false,
     ST_XCHG_MISMATCH},
    {"fingerprint and busy", ST_XCHG_FETCH, 10, 10, 1, 2, true,
     ST_XCHG_MISMATCH},
    {"n_params average", ST_XCHG_AVERAGE, 1000, 1001, 1, 1, false,
     ST_XCHG_MISMATCH},
    {"n_params fetch", ST_XCHG_FETCH, 1000, 999, 1, 1, false, ST_XCHG_MISMATCH},
    {"not ready, both empty", ST_XCHG_FETCH, 0, 0, 1, 1, false,
     ST_XCHG_NOT_READY},
    {"not ready, donor empty", ST_XCHG_FETCH, 1000, 0, 1, 1, false,
     ST_XCHG_NOT_READY},
    {"not ready, average", ST_XCHG_AVERAGE, 0, 0, 1, 1, false,
     ST_XCHG_NOT_READY},
};
#define NREFUSALS (sizeof refusals / sizeof refusals[0])

START_TEST(test_refusals) {
  const refusal_t* t = &refusals[_i];
  run_t r;
  run_init(&r, t->kind, 0);
  local_init(&r.la, t->fpa, "mlp:784-256-128-10 f32", t->na, 1);
  local_init(&r.lb, t->fpb, "cnn:\xc3\xa9-32 bf16", t->nb, 2);
  /* Both have tensor lists; only a MISMATCH REPLY carries B's. */
  static const char la_t[] = "a\tF32\t3\n", lb_t[] = "b.w\tF32\t2,2\n";
  r.la.tensors = la_t;
  r.la.tensors_len = strlen(la_t);
  r.lb.tensors = lb_t;
  r.lb.tensors_len = strlen(lb_t);
  r.busy = t->busy;
  float* a = rand_vec(t->na + 1, -1, 1);
  r.snap_a = a;
  pump_t p;
  pump_start(&p, &r);
  side_t *sa = &p.s[0], *sb = &p.s[1];
  ck_assert_msg(sa->result == t->want, "%s: A %s", t->what,
                st_xchg_result_name(sa->result));
  ck_assert_msg(sb->result == t->want, "%s: B %s", t->what,
                st_xchg_result_name(sb->result));
  ck_assert_int_eq(sa->n_apply + sb->n_apply, 0);
  ck_assert_int_eq(sb->n_want, 0); /* the responder never snapshots */
  ck_assert_int_eq(sb->sent_frames, 1);
  /* Each side names the other's model. */
  ck_assert(sa->has_peer_model && sb->has_peer_model);
  ck_assert_str_eq(sa->peer_model, "cnn:\xc3\xa9-32 bf16");
  ck_assert_str_eq(sb->peer_model, "mlp:784-256-128-10 f32");
  if (t->want == ST_XCHG_MISMATCH)
    ck_assert_str_eq(sa->peer_tensors, lb_t);
  else
    ck_assert_ptr_null(sa->peer_tensors);
  ck_assert_ptr_null(sb->peer_tensors); /* a REQ carries none */
  ck_assert(!sb->closed_seen);          /* B finished before A closed */
  pump_free(&p);
  free(a);
}
END_TEST

/* ==== Guards ================================================================
 */

/* A poisoned value in B's snapshot (A receives it), or norms. */
typedef struct {
  const char* what;
  st_xchg_kind_t kind;
  size_t n;
  float bad; /* written at bad_at in B's snapshot, unless 0 */
  size_t bad_at;
  float a_val, b_val; /* nonzero: A's and B's snapshots are all this */
  double norm_mult;
  st_xchg_result_t want_a;
} guard_t;

static const guard_t guards[] = {
    {"NaN first", ST_XCHG_AVERAGE, 1000, NAN, 0, 0, 0, 10,
     ST_XCHG_FAIL_NONFINITE},
    {"NaN last chunk", ST_XCHG_AVERAGE, BIG_N, NAN, BIG_N - 1, 0, 0, 10,
     ST_XCHG_FAIL_NONFINITE},
    {"Inf", ST_XCHG_AVERAGE, 1000, INFINITY, 500, 0, 0, 10,
     ST_XCHG_FAIL_NONFINITE},
    {"-Inf fetch", ST_XCHG_FETCH, 1000, -INFINITY, 999, 0, 0, 10,
     ST_XCHG_FAIL_NONFINITE},
    {"NaN fetch, no norm", ST_XCHG_FETCH, BIG_N, NAN, CHUNK_FLOATS, 0, 0, 0,
     ST_XCHG_FAIL_NONFINITE},
    /* n = 100, all v: norm 10 v. Limit norm_mult * (|own| + 1). */
    {"norm far beyond", ST_XCHG_AVERAGE, 100, 0, 0, 1.0f, 1000.0f, 10,
     ST_XCHG_FAIL_NORM},
    {"norm just beyond", ST_XCHG_AVERAGE, 100, 0, 0, 1.0f, 11.5f, 10,
     ST_XCHG_FAIL_NORM},
    {"norm just within", ST_XCHG_AVERAGE, 100, 0, 0, 1.0f, 10.5f, 10,
     ST_XCHG_OK},
    {"norm guard off", ST_XCHG_AVERAGE, 100, 0, 0, 1.0f, 1000.0f, 0,
     ST_XCHG_OK},
    {"near zero, +1 lets 5 in", ST_XCHG_AVERAGE, 100, 0, 0, 1e-30f, 0.5f, 10,
     ST_XCHG_OK},
    {"near zero, 11 refused", ST_XCHG_AVERAGE, 100, 0, 0, 1e-30f, 1.1f, 10,
     ST_XCHG_FAIL_NORM},
    {"fetch has no norm guard", ST_XCHG_FETCH, 100, 0, 0, 1.0f, 1000.0f, 10,
     ST_XCHG_OK},
    /* Both finite, but peer - own beyond FLT_MAX: the delta would be Inf. */
    {"delta overflows", ST_XCHG_AVERAGE, 100, 0, 0, 3e38f, -3e38f, 0,
     ST_XCHG_FAIL_NONFINITE},
};
#define NGUARDS (sizeof guards / sizeof guards[0])

START_TEST(test_guards) {
  const guard_t* g = &guards[_i];
  run_t r;
  run_init(&r, g->kind, g->n);
  r.cfg.norm_mult = g->norm_mult;
  float* a = rand_vec(g->n, -1, 1);
  float* b = rand_vec(g->n, -1, 1);
  if (g->a_val != 0)
    for (size_t i = 0; i < g->n; i++)
      a[i] = g->a_val, b[i] = g->b_val;
  if (g->bad != 0)
    b[g->bad_at] = g->bad;
  r.snap_a = a;
  r.snap_b = b;
  pump_t p;
  pump_start(&p, &r);
  side_t* sa = &p.s[0];
  ck_assert_msg(sa->result == g->want_a, "%s: A %s", g->what,
                st_xchg_result_name(sa->result));
  ck_assert_int_eq(sa->n_apply, g->want_a == ST_XCHG_OK ? 1 : 0);
  /* B, whose own snapshot held the bad value, must not apply a delta made
   * from it either (fuzz_xchg found it doing so). */
  if (g->bad != 0 && g->kind == ST_XCHG_AVERAGE) {
    ck_assert_msg(p.s[1].result != ST_XCHG_OK && p.s[1].n_apply == 0,
                  "%s: B %s, %d applies", g->what,
                  st_xchg_result_name(p.s[1].result), p.s[1].n_apply);
  }
  pump_free(&p);
  free(a);
  free(b);
}
END_TEST

/* ==== Frames changed in transit =============================================
 */

typedef enum {
  M_FLIP_DATA,   /* a byte of a chunk's floats: chunk valid, hash wrong */
  M_TOTAL_PLUS,  /* a chunk's total one more than n_params */
  M_TRANSFER_ID, /* a chunk's transfer id not 0 */
  M_DROP_CHUNK,  /* one chunk dropped */
  M_TWICE,       /* a frame delivered twice */
  M_TRUNCATE,    /* a frame cut by one byte */
  M_GARBAGE,     /* a frame replaced by random bytes */
  M_PING,        /* a frame replaced by a valid PING */
  M_HASH_FLIP,   /* XCHG_DONE's hash changed */
  M_CLOSE,       /* the connection closes instead */
  M_EMPTY_CHUNK, /* a chunk replaced by an empty one at the same offset */
  M_EMPTY_FRAME, /* a frame of 0 bytes */
} mutation_t;

typedef struct {
  const char* what;
  st_xchg_kind_t kind;
  size_t n;
  int from;  /* the side whose frame is changed */
  int index; /* which of its frames (0: REQ or REPLY); -1: the last */
  mutation_t m;
  st_xchg_result_t want_to;   /* the receiving side's result */
  st_xchg_result_t want_from; /* the sending side's; ANY: either (a FETCH
                                 donor whose frames were all written before
                                 the joiner failed has finished OK: it
                                 cannot know) */
} transit_t;

#define ANY ((st_xchg_result_t) -1)

static const transit_t transits[] = {
    {"flip in chunk 0", ST_XCHG_FETCH, 1000, 1, 1, M_FLIP_DATA,
     ST_XCHG_FAIL_HASH, ANY},
    {"flip in chunk 2", ST_XCHG_FETCH, BIG_N, 1, 3, M_FLIP_DATA,
     ST_XCHG_FAIL_HASH, ANY},
    {"hash flipped", ST_XCHG_FETCH, 1000, 1, -1, M_HASH_FLIP, ST_XCHG_FAIL_HASH,
     ANY},
    {"total + 1", ST_XCHG_FETCH, 1000, 1, 1, M_TOTAL_PLUS, ST_XCHG_FAIL_SIZE,
     ST_XCHG_FAIL_CLOSED},
    {"total + 1 later chunk", ST_XCHG_AVERAGE, BIG_N, 0, 2, M_TOTAL_PLUS,
     ST_XCHG_FAIL_SIZE, ANY},
    {"last chunk dropped", ST_XCHG_FETCH, BIG_N, 1, 3, M_DROP_CHUNK,
     ST_XCHG_FAIL_SIZE, ANY},
    {"first chunk dropped", ST_XCHG_FETCH, BIG_N, 1, 1, M_DROP_CHUNK,
     ST_XCHG_FAIL_PROTOCOL, ST_XCHG_FAIL_CLOSED},
    {"transfer id", ST_XCHG_FETCH, 1000, 1, 1, M_TRANSFER_ID,
     ST_XCHG_FAIL_PROTOCOL, ST_XCHG_FAIL_CLOSED},
    {"empty chunk", ST_XCHG_FETCH, 1000, 1, 1, M_EMPTY_CHUNK,
     ST_XCHG_FAIL_PROTOCOL, ST_XCHG_FAIL_CLOSED},
    {"chunk twice", ST_XCHG_FETCH, BIG_N, 1, 1, M_TWICE, ST_XCHG_FAIL_PROTOCOL,
     ST_XCHG_FAIL_CLOSED},
    {"REQ twice", ST_XCHG_AVERAGE, 1000, 0, 0, M_TWICE, ST_XCHG_FAIL_PROTOCOL,
     ANY},
    {"REPLY twice", ST_XCHG_FETCH, 1000, 1, 0, M_TWICE, ST_XCHG_FAIL_PROTOCOL,
     ST_XCHG_FAIL_CLOSED},
    {"REQ cut", ST_XCHG_AVERAGE, 1000, 0, 0, M_TRUNCATE, ST_XCHG_FAIL_PROTOCOL,
     ST_XCHG_FAIL_CLOSED},
    {"REPLY cut", ST_XCHG_FETCH, 1000, 1, 0, M_TRUNCATE, ST_XCHG_FAIL_PROTOCOL,
     ST_XCHG_FAIL_CLOSED},
    {"chunk cut", ST_XCHG_FETCH, 1000, 1, 1, M_TRUNCATE, ST_XCHG_FAIL_PROTOCOL,
     ST_XCHG_FAIL_CLOSED},
    {"DONE cut", ST_XCHG_FETCH, 1000, 1, -1, M_TRUNCATE, ST_XCHG_FAIL_PROTOCOL,
     ANY},
    {"REQ garbage", ST_XCHG_FETCH, 1000, 0, 0, M_GARBAGE, ST_XCHG_FAIL_PROTOCOL,
     ST_XCHG_FAIL_CLOSED},
    {"chunk garbage", ST_XCHG_AVERAGE, 1000, 1, 1, M_GARBAGE,
     ST_XCHG_FAIL_PROTOCOL, ANY},
    {"empty frame", ST_XCHG_AVERAGE, 1000, 1, 0, M_EMPTY_FRAME,
     ST_XCHG_FAIL_PROTOCOL, ST_XCHG_FAIL_CLOSED},
    {"PING for REPLY", ST_XCHG_AVERAGE, 1000, 1, 0, M_PING,
     ST_XCHG_FAIL_PROTOCOL, ST_XCHG_FAIL_CLOSED},
    {"PING for chunk", ST_XCHG_FETCH, 1000, 1, 1, M_PING, ST_XCHG_FAIL_PROTOCOL,
     ST_XCHG_FAIL_CLOSED},
    {"closed before REPLY", ST_XCHG_AVERAGE, 1000, 1, 0, M_CLOSE,
     ST_XCHG_FAIL_CLOSED, ST_XCHG_FAIL_CLOSED},
    {"closed mid-transfer", ST_XCHG_FETCH, BIG_N, 1, 2, M_CLOSE,
     ST_XCHG_FAIL_CLOSED, ST_XCHG_FAIL_CLOSED},
    /* B may have finished (it had all of A's): only A is sure to fail. */
    {"closed before DONE avg", ST_XCHG_AVERAGE, BIG_N, 1, -1, M_CLOSE,
     ST_XCHG_FAIL_CLOSED, ANY},
};
#define NTRANSITS (sizeof transits / sizeof transits[0])

typedef struct {
  const transit_t* t;
  int last_index; /* the index of the sender's last frame */
  int hits;
} transit_ctx_t;

static hook_rc_t transit_hook(void* ctx, int from, int index, uint8_t* data,
                              size_t* len) {
  transit_ctx_t* c = ctx;
  const transit_t* t = c->t;
  int want = t->index >= 0 ? t->index : c->last_index;
  if (from != t->from || index != want)
    return H_DELIVER;
  c->hits++;
  st_msg_t m;
  ck_assert_int_eq(st_wire_decode(data, *len, &m, NULL), 0);
  bool chunk = m.type == ST_MSG_TENSOR_CHUNK;
  switch (t->m) {
    case M_FLIP_DATA:
      ck_assert(chunk);
      /* The lowest mantissa byte of the last float: still finite. */
      data[*len - 4] ^= 0x01;
      return H_DELIVER;
    case M_TOTAL_PLUS:
      ck_assert(chunk);
      m.u.chunk.total++;
      reencode(data, len, &m);
      return H_DELIVER;
    case M_TRANSFER_ID:
      ck_assert(chunk);
      m.u.chunk.transfer_id = 1;
      reencode(data, len, &m);
      return H_DELIVER;
    case M_EMPTY_CHUNK:
      ck_assert(chunk);
      m.u.chunk.data_len = 0;
      reencode(data, len, &m);
      return H_DELIVER;
    case M_DROP_CHUNK:
      ck_assert(chunk);
      return H_DROP;
    case M_TWICE:
      return H_TWICE;
    case M_TRUNCATE:
      (*len)--;
      return H_DELIVER;
    case M_GARBAGE:
      for (size_t i = 0; i < *len; i++)
        data[i] = (uint8_t) st_rng_next(&rng);
      data[0] = 0xc1; /* never valid msgpack, whatever follows */
      return H_DELIVER;
    case M_EMPTY_FRAME:
      *len = 0;
      return H_DELIVER;
    case M_PING:
      memset(&m, 0, sizeof m);
      m.type = ST_MSG_PING;
      m.u.ping.seq = 1;
      reencode(data, len, &m);
      return H_DELIVER;
    case M_HASH_FLIP:
      ck_assert_int_eq(m.type, ST_MSG_XCHG_DONE);
      m.u.xchg_done.hash[7] ^= 0x80;
      reencode(data, len, &m);
      return H_DELIVER;
    case M_CLOSE:
      return H_CLOSE;
  }
  return H_DELIVER;
}

START_TEST(test_transit) {
  const transit_t* t = &transits[_i];
  transit_ctx_t ctx = {t, 0, 0};
  /* The sender's frames: REQ or REPLY, chunks, XCHG_DONE. */
  ctx.last_index = 1 + (int) ((t->n + CHUNK_FLOATS - 1) / CHUNK_FLOATS);
  run_t r;
  run_init(&r, t->kind, t->n);
  r.hook = transit_hook;
  r.hook_ctx = &ctx;
  r.lazy_acks = true;
  float* a = rand_vec(t->n, -1, 1);
  float* b = rand_vec(t->n, -1, 1);
  r.snap_a = a;
  r.snap_b = b;
  pump_t p;
  pump_start(&p, &r);
  ck_assert_msg(ctx.hits == 1, "%s: the hook hit %d frames", t->what, ctx.hits);
  side_t *to = &p.s[1 - t->from], *from = &p.s[t->from];
  ck_assert_msg(to->result == t->want_to, "%s: receiver %s", t->what,
                st_xchg_result_name(to->result));
  if (t->want_from != ANY)
    ck_assert_msg(from->result == t->want_from, "%s: sender %s", t->what,
                  st_xchg_result_name(from->result));
  ck_assert_int_eq(to->n_done, 1);
  ck_assert_int_eq(from->n_done, 1);
  ck_assert_msg(to->n_apply == 0, "%s: the failing side applied", t->what);
  if (from->result != ST_XCHG_OK)
    ck_assert_int_eq(from->n_apply, 0);
  pump_free(&p);
  free(a);
  free(b);
}
END_TEST

/* ==== Driving one machine by hand ===========================================
 */

/* The frames s sent since `from`, for delivery by hand. */
static void deliver_all(side_t* s, size_t* next, side_t* to) {
  for (; *next < s->out_head + s->out_len; (*next)++) {
    frame_t* f = &s->out[*next];
    ck_assert_int_eq(st_xchg_message(to->x, T0, f->data, f->len), 0);
    drain(to);
  }
}

static void ack(side_t* s) {
  ck_assert_uint_gt(s->unacked, 0);
  s->unacked--;
  ck_assert_int_eq(st_xchg_sent(s->x, T0), 0);
  drain(s);
}

static void side_free(side_t* s) {
  st_xchg_free(s->x);
  for (size_t k = 0; k < s->out_head + s->out_len; k++)
    free(s->out[k].data);
  free(s->out);
  free(s->apply);
  free(s->peer_tensors);
}

/* Without acknowledgements the machine stops at ST_XCHG_CHUNKS_IN_FLIGHT
 * SENDs; each st_xchg_sent lets exactly one more out; and an AVERAGE side
 * that has the peer's whole snapshot applies only once its own has been
 * sent (every frame acknowledged). */
START_TEST(test_flow_control) {
  size_t n = 5 * CHUNK_FLOATS + 1; /* 6 chunks */
  st_xchg_config_t cfg;
  st_xchg_config_default(&cfg);
  st_xchg_local_t l;
  local_init(&l, 3, "m", n, 0);
  side_t a, b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  ck_assert_int_eq(st_xchg_new_initiator(&cfg, ST_XCHG_AVERAGE, &l, T0, &a.x),
                   0);
  ck_assert_int_eq(st_xchg_new_responder(&cfg, &l, false, T0, &b.x), 0);
  ck_assert_int_eq(st_xchg_kind(b.x), 0);
  float* va = rand_vec(n, -1, 1);
  float* vb = rand_vec(n, -1, 1);
  drain(&a);
  ck_assert_int_eq(a.sent_frames, 1); /* REQ */
  ck_assert_int_eq(a.n_want, 1);
  ck_assert_int_eq(st_xchg_snapshot(a.x, T0, va, n, 1), 0);
  drain(&a);
  ck_assert_int_eq(a.sent_frames, 1); /* no chunk before the REPLY */
  size_t a_next = 0, b_next = 0;
  deliver_all(&a, &a_next, &b);
  ck_assert_int_eq(st_xchg_kind(b.x), ST_XCHG_AVERAGE);
  ck_assert_int_eq(b.sent_frames, 1); /* REPLY */
  ck_assert_int_eq(b.n_want, 1);
  ck_assert_int_eq(st_xchg_snapshot(b.x, T0, vb, n, 1), 0);
  drain(&b);
  ck_assert_int_eq(b.sent_frames, 2); /* REPLY and chunk 0: held there */
  ck_assert_uint_eq(b.unacked, ST_XCHG_CHUNKS_IN_FLIGHT);
  /* B streams everything, one frame per acknowledgement. */
  for (int k = 0; k < 6; k++) {
    ack(&b);
    ck_assert_int_eq(b.sent_frames, 3 + k);
  }
  deliver_all(&b, &b_next, &a);
  /* A has B's REPLY, chunks and XCHG_DONE... */
  ck_assert_int_eq(b.sent_frames, 8);
  /* ...and has sent its REQ and chunk 0, neither acknowledged. */
  ck_assert_int_eq(a.sent_frames, 2);
  ck_assert_uint_eq(a.unacked, ST_XCHG_CHUNKS_IN_FLIGHT);
  ck_assert_int_eq(a.n_apply, 0);
  for (int k = 0; k < 6; k++) {
    ack(&a);
    ck_assert_int_eq(a.sent_frames, 3 + k);
  }
  ck_assert_int_eq(a.sent_frames, 1 + 6 + 1);
  ck_assert_uint_eq(a.unacked, 2); /* the last chunk and XCHG_DONE */
  ck_assert_int_eq(a.n_apply, 0);
  ack(&a);
  ck_assert_int_eq(a.n_apply, 0);
  ck_assert_int_eq(a.n_done, 0);
  ack(&a); /* XCHG_DONE written: now A applies */
  ck_assert_int_eq(a.n_apply, 1);
  ck_assert_int_eq(a.n_done, 1);
  ck_assert_int_eq(a.result, ST_XCHG_OK);
  /* B has A's REQ only; it finishes once A's frames come and its own
   * last two are acknowledged. */
  deliver_all(&a, &a_next, &b);
  ck_assert_int_eq(b.n_apply, 0);
  ack(&b);
  ck_assert_int_eq(b.n_apply, 0);
  ack(&b);
  ck_assert_int_eq(b.n_apply, 1);
  ck_assert_int_eq(b.result, ST_XCHG_OK);
  long bad = -1;
  for (size_t i = 0; i < n && bad < 0; i++)
    if (a.apply[i] != (vb[i] - va[i]) / 2 || b.apply[i] != -a.apply[i])
      bad = (long) i;
  ck_assert_msg(bad < 0, "deltas differ at %ld", bad);
  /* Misuse: nothing outstanding is -EINVAL on a live machine only; events
   * after DONE are ignored. */
  ck_assert_int_eq(st_xchg_sent(a.x, T0), 0);
  ck_assert_int_eq(st_xchg_closed(a.x, T0), 0);
  ck_assert_int_eq(st_xchg_tick(a.x, UINT64_MAX), 0);
  st_xact_t act;
  ck_assert(!st_xchg_next_action(a.x, &act));
  side_free(&a);
  side_free(&b);
  free(va);
  free(vb);
}
END_TEST

START_TEST(test_timeout) {
  st_xchg_config_t cfg;
  st_xchg_config_default(&cfg);
  ck_assert_uint_eq(cfg.timeout_ms, 30000);
  cfg.timeout_ms = 5000;
  st_xchg_local_t l;
  local_init(&l, 3, "m", 1000, 0);
  for (int role = 0; role < 3; role++) {
    side_t s;
    memset(&s, 0, sizeof s);
    if (role == 2)
      ck_assert_int_eq(st_xchg_new_responder(&cfg, &l, false, T0, &s.x), 0);
    else
      ck_assert_int_eq(
          st_xchg_new_initiator(&cfg, role ? ST_XCHG_FETCH : ST_XCHG_AVERAGE,
                                &l, T0, &s.x),
          0);
    /* The TIMER comes first, once. */
    st_xact_t act;
    ck_assert(st_xchg_next_action(s.x, &act));
    ck_assert_int_eq(act.kind, ST_XACT_TIMER);
    ck_assert_uint_eq(act.at_ms, T0 + 5000);
    s.n_timer = 1;
    drain(&s);
    ck_assert_int_eq(s.n_timer, 1);
    ck_assert_int_eq(st_xchg_tick(s.x, T0 + 4999), 0);
    drain(&s);
    ck_assert_int_eq(s.n_done, 0);
    ck_assert(!st_xchg_finished(s.x));
    ck_assert_int_eq(st_xchg_tick(s.x, T0 + 5000), 0);
    drain(&s);
    ck_assert_int_eq(s.n_done, 1);
    ck_assert_int_eq(s.result, ST_XCHG_FAIL_TIMEOUT);
    ck_assert_int_eq(s.n_apply, 0);
    /* Ignored after DONE. */
    float v[1000] = {0};
    ck_assert_int_eq(st_xchg_snapshot(s.x, T0, v, 1000, 0), 0);
    ck_assert_int_eq(st_xchg_tick(s.x, T0 + 9000), 0);
    ck_assert(!st_xchg_next_action(s.x, &act));
    side_free(&s);
  }
}
END_TEST

/* Timed out in the middle of a transfer: nothing applied. */
START_TEST(test_timeout_mid_transfer) {
  run_t r;
  run_init(&r, ST_XCHG_FETCH, BIG_N);
  float* b = rand_vec(BIG_N, -1, 1);
  st_xchg_t* x;
  ck_assert_int_eq(st_xchg_new_initiator(&r.cfg, ST_XCHG_FETCH, &r.la, T0, &x),
                   0);
  side_t a;
  memset(&a, 0, sizeof a);
  a.x = x;
  drain(&a);
  /* B's REPLY and first chunk, by hand. */
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_XCHG_REPLY;
  memcpy(m.u.xchg_reply.fingerprint, r.lb.fingerprint, 16);
  strcpy(m.u.xchg_reply.model, r.lb.model);
  m.u.xchg_reply.n_params = BIG_N;
  m.u.xchg_reply.step = 9;
  static uint8_t buf[FRAME_CAP];
  size_t len;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  ck_assert_int_eq(st_xchg_message(x, T0, buf, len), 0);
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_TENSOR_CHUNK;
  m.u.chunk.total = BIG_N;
  m.u.chunk.data = (const uint8_t*) b;
  m.u.chunk.data_len = ST_WIRE_CHUNK_MAX_BYTES;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  ck_assert_int_eq(st_xchg_message(x, T0, buf, len), 0);
  drain(&a);
  ck_assert_int_eq(a.n_done, 0);
  ck_assert_int_eq(st_xchg_tick(x, T0 + r.cfg.timeout_ms), 0);
  drain(&a);
  ck_assert_int_eq(a.result, ST_XCHG_FAIL_TIMEOUT);
  ck_assert_int_eq(a.n_apply, 0);
  /* The rest, arriving late, is ignored. */
  m.u.chunk.offset = CHUNK_FLOATS;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  ck_assert_int_eq(st_xchg_message(x, T0, buf, len), 0);
  st_xact_t act;
  ck_assert(!st_xchg_next_action(x, &act));
  side_free(&a);
  free(b);
}
END_TEST

/* Messages a FETCH donor never expects after the request: any. */
START_TEST(test_donor_refuses_data) {
  st_xchg_config_t cfg;
  st_xchg_config_default(&cfg);
  st_xchg_local_t l;
  local_init(&l, 3, "m", 10, 0);
  side_t a, b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  ck_assert_int_eq(st_xchg_new_initiator(&cfg, ST_XCHG_FETCH, &l, T0, &a.x), 0);
  ck_assert_int_eq(st_xchg_new_responder(&cfg, &l, false, T0, &b.x), 0);
  drain(&a);
  size_t next = 0;
  deliver_all(&a, &next, &b);
  ck_assert_int_eq(b.n_want, 1);
  /* A chunk to the donor. */
  float v[10] = {1};
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_TENSOR_CHUNK;
  m.u.chunk.total = 10;
  m.u.chunk.data = (const uint8_t*) v;
  m.u.chunk.data_len = sizeof v;
  uint8_t buf[256];
  size_t len;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  ck_assert_int_eq(st_xchg_message(b.x, T0, buf, len), 0);
  drain(&b);
  ck_assert_int_eq(b.result, ST_XCHG_FAIL_PROTOCOL);
  /* The snapshot asked for earlier is now ignored. */
  ck_assert_int_eq(st_xchg_snapshot(b.x, T0, v, 10, 0), 0);
  st_xact_t act;
  ck_assert(!st_xchg_next_action(b.x, &act));
  side_free(&a);
  side_free(&b);
}
END_TEST

/* An OK REPLY that names another fingerprint or size is a mismatch: the
 * initiator checks what the responder says it runs. */
START_TEST(test_reply_checked) {
  st_xchg_config_t cfg;
  st_xchg_config_default(&cfg);
  st_xchg_local_t l;
  local_init(&l, 3, "m", 10, 0);
  for (int variant = 0; variant < 3; variant++) {
    side_t a;
    memset(&a, 0, sizeof a);
    ck_assert_int_eq(st_xchg_new_initiator(&cfg, ST_XCHG_FETCH, &l, T0, &a.x),
                     0);
    drain(&a);
    st_msg_t m;
    memset(&m, 0, sizeof m);
    m.type = ST_MSG_XCHG_REPLY;
    m.u.xchg_reply.status = ST_XCHG_STATUS_OK;
    memcpy(m.u.xchg_reply.fingerprint, l.fingerprint, 16);
    strcpy(m.u.xchg_reply.model, "other");
    m.u.xchg_reply.n_params = 10;
    if (variant == 0)
      m.u.xchg_reply.fingerprint[15] ^= 1;
    else if (variant == 1)
      m.u.xchg_reply.n_params = 11;
    uint8_t buf[256];
    size_t len;
    ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
    ck_assert_int_eq(st_xchg_message(a.x, T0, buf, len), 0);
    drain(&a);
    if (variant == 2) { /* the control: a matching OK goes on */
      ck_assert_int_eq(a.n_done, 0);
    } else {
      ck_assert_int_eq(a.n_done, 1);
      ck_assert_int_eq(a.result, ST_XCHG_MISMATCH);
      ck_assert_str_eq(a.peer_model, "other");
    }
    side_free(&a);
  }
}
END_TEST

/* A tensor list over ST_XCHG_TENSORS_MAX is not sent: the MISMATCH REPLY
 * goes out with an empty one (the initiator then names the models only);
 * at ST_XCHG_TENSORS_MAX it is sent whole. */
START_TEST(test_mismatch_tensors_bounded) {
  char* big = malloc(ST_XCHG_TENSORS_MAX + 1);
  ck_assert_ptr_nonnull(big);
  memset(big, 'x', ST_XCHG_TENSORS_MAX + 1);
  for (int over = 0; over < 2; over++) {
    run_t r;
    run_init(&r, ST_XCHG_FETCH, 0);
    local_init(&r.la, 1, "a", 10, 0);
    local_init(&r.lb, 2, "b", 10, 0);
    r.lb.tensors = big;
    r.lb.tensors_len = ST_XCHG_TENSORS_MAX + (size_t) over;
    pump_t p;
    pump_start(&p, &r);
    ck_assert_int_eq(p.s[0].result, ST_XCHG_MISMATCH);
    ck_assert_uint_eq(p.s[0].peer_tensors_len, over ? 0 : ST_XCHG_TENSORS_MAX);
    pump_free(&p);
  }
  free(big);
}
END_TEST

/* ==== Misuse and names ======================================================
 */

START_TEST(test_misuse) {
  st_xchg_config_t cfg;
  st_xchg_config_default(&cfg);
  ck_assert(cfg.norm_mult == 10.0);
  st_xchg_local_t l;
  local_init(&l, 3, "m", 10, 0);
  st_xchg_t* x = NULL;
  ck_assert_int_eq(st_xchg_new_initiator(&cfg, 0, &l, T0, &x), -EINVAL);
  ck_assert_int_eq(st_xchg_new_initiator(&cfg, 3, &l, T0, &x), -EINVAL);
  ck_assert_int_eq(st_xchg_new_initiator(NULL, 1, &l, T0, &x), -EINVAL);
  ck_assert_int_eq(st_xchg_new_responder(&cfg, NULL, false, T0, &x), -EINVAL);
  st_xchg_local_t bad = l;
  strcpy(bad.model, "a\tb");
  ck_assert_int_eq(st_xchg_new_responder(&cfg, &bad, false, T0, &x), -EINVAL);
  memset(bad.model, 'x', sizeof bad.model);
  ck_assert_int_eq(st_xchg_new_initiator(&cfg, 1, &bad, T0, &x), -EINVAL);
  bad = l;
  bad.n_params = UINT64_C(1) << 41;
  ck_assert_int_eq(st_xchg_new_initiator(&cfg, 1, &bad, T0, &x), -EINVAL);
  st_xchg_config_t c2 = cfg;
  c2.norm_mult = -1;
  ck_assert_int_eq(st_xchg_new_initiator(&c2, 1, &l, T0, &x), -EINVAL);
  c2.norm_mult = NAN;
  ck_assert_int_eq(st_xchg_new_initiator(&c2, 1, &l, T0, &x), -EINVAL);

  ck_assert_int_eq(st_xchg_new_initiator(&cfg, ST_XCHG_FETCH, &l, T0, &x), 0);
  float v[11] = {0};
  /* A FETCH joiner is never asked for a snapshot. */
  ck_assert_int_eq(st_xchg_snapshot(x, T0, v, 10, 0), -EINVAL);
  ck_assert_int_eq(st_xchg_sent(x, T0), -EINVAL); /* nothing sent yet */
  ck_assert_int_eq(st_xchg_message(x, T0, NULL, 3), -EINVAL);
  st_xchg_free(x);
  ck_assert_int_eq(st_xchg_new_initiator(&cfg, ST_XCHG_AVERAGE, &l, T0, &x), 0);
  ck_assert_int_eq(st_xchg_snapshot(x, T0, v, 11, 0), -EINVAL);
  ck_assert_int_eq(st_xchg_snapshot(x, T0, NULL, 10, 0), -EINVAL);
  ck_assert_int_eq(st_xchg_snapshot(x, T0, v, 10, 0), 0);
  ck_assert_int_eq(st_xchg_snapshot(x, T0, v, 10, 0), -EINVAL); /* twice */
  /* Unfinished: its buffers are in use. */
  ck_assert_int_eq(st_xchg_release_buffers(x), -EINVAL);
  ck_assert_int_eq(st_xchg_release_buffers(NULL), -EINVAL);
  st_xchg_free(x);
  st_xchg_free(NULL);
  ck_assert_int_eq(st_xchg_tick(NULL, 0), -EINVAL);
  ck_assert_int_eq(st_xchg_closed(NULL, 0), -EINVAL);
}
END_TEST

START_TEST(test_result_names) {
  static const char* const want[] = {
      "ok",        "busy", "mismatch", "not_ready", "protocol", "size",
      "nonfinite", "norm", "hash",     "closed",    "timeout",  "codec"};
  ck_assert_int_eq(sizeof want / sizeof want[0], ST_XCHG_RESULT_COUNT);
  for (int r = 0; r < ST_XCHG_RESULT_COUNT; r++)
    ck_assert_str_eq(st_xchg_result_name((st_xchg_result_t) r), want[r]);
  ck_assert_str_eq(st_xchg_result_name(ST_XCHG_RESULT_COUNT), "unknown");
}
END_TEST

static Suite* exchange_suite(void) {
  Suite* s = suite_create("gossip_exchange");
  TCase* ok = tcase_create("exchanges");
  tcase_add_checked_fixture(ok, setup, NULL);
  tcase_add_loop_test(ok, test_average, 0, 4 * NSIZES);
  tcase_add_loop_test(ok, test_average_in_place, 0, 5);
  tcase_add_loop_test(ok, test_fetch, 0, 2 * NSIZES);
  tcase_add_loop_test(ok, test_fetch_held, 0, 2 * HELD_CASES);
  tcase_add_test(ok, test_average_clipped);
  tcase_add_test(ok, test_clip_bound);
  tcase_add_loop_test(ok, test_refusals, 0, NREFUSALS);
  tcase_add_test(ok, test_flow_control);
  tcase_set_timeout(ok, 120);
  suite_add_tcase(s, ok);
  TCase* bad = tcase_create("failures");
  tcase_add_checked_fixture(bad, setup, NULL);
  tcase_add_loop_test(bad, test_guards, 0, NGUARDS);
  tcase_add_loop_test(bad, test_transit, 0, NTRANSITS);
  tcase_add_test(bad, test_timeout);
  tcase_add_test(bad, test_timeout_mid_transfer);
  tcase_add_test(bad, test_donor_refuses_data);
  tcase_add_test(bad, test_reply_checked);
  tcase_add_test(bad, test_mismatch_tensors_bounded);
  tcase_add_test(bad, test_misuse);
  tcase_add_test(bad, test_result_names);
  tcase_set_timeout(bad, 120);
  suite_add_tcase(s, bad);
  return s;
}

int main(void) {
  return tu_main(exchange_suite);
}
