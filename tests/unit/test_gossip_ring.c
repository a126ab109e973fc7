/* test_gossip_ring.c: the Check suite for the ring all-reduce machine
 * (gossip/ring.c; the contract in gossip.h, "Ring all-reduce"). k machines
 * are wired in a ring through in-memory links, one FIFO of frames from
 * each member to the next, and driven in random interleavings from the
 * suite's seeded generator (tests/unit/testutil.h): at each turn one
 * enabled event is picked at random among all members: answer a
 * WANT_SNAPSHOT (half the time written into st_ring_snapshot_buffer, else
 * copied from a scratch buffer that is then overwritten), write the
 * oldest unwritten frame of a link (st_ring_sent), or deliver the oldest
 * written frame to the next member (st_ring_message). Inputs are fresh
 * random floats each run, at a different scale on every member.
 *
 * The driver's rules (gossip.h, "Ring all-reduce"): a member that
 * finishes closes both its streams; its unwritten frames are lost, the
 * written ones still reach the next member, then that member sees the end
 * of its stream; a member whose stream ends while it still has segments
 * to receive (or to send) is aborted with ST_RING_FAIL_CLOSED.
 *
 * Checked over members 1 to 16 and sizes 0, 1, fewer floats than members,
 * 1000 with segments of 1 and 7 floats, 1000003 with segments of 1000 and
 * 3M with the default segments: every member DONE(OK) with one APPLY; the
 * means of all members bit-identical, and equal, bit for bit, to the sum
 * taken in the ring's order (x_c, x_{c+1} + that, ...) divided by n; own +
 * delta within (n + 3) u max|x| of the float64 mean (u = 2^-24; derived
 * at bound()); never more than in_flight SENDs unacknowledged, the
 * limit reached. Then: pipelining (a segment goes out as soon as the
 * segment it needs is in), an abort mid-round, corrupted, cut, repeated
 * and dropped messages, the timeout and its re-arming, NaN and Inf in an
 * input or in the sum (nobody applies), a delta that overflows on one
 * member (that one alone refuses), the degenerate sizes, and misuse. */
#include <check.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/gossip.h"
#include "tests/ring_test_codec.h"
#include "tests/unit/testutil.h"

#define T0 1000
#define ROUND 0x5eed0001u

static st_rng_t rng;

/* The case being run, named in every failure of the checks below. */
static char label[128];

static void fail_case(const char* fmt, ...)
    __attribute__((format(printf, 1, 2)));

static void fail_case(const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  ck_abort_msg("%s: %s", label, msg);
}

/* Check records every passing ck_assert in a file (so that a crash can name
 * the last one), which costs a system call; the per-float and per-frame
 * checks below call into Check only when they fail. */
#define REQUIRE(cond, ...)    \
  do {                        \
    if (!(cond))              \
      fail_case(__VA_ARGS__); \
  } while (0)
#define REQUIRE_OK(call) REQUIRE((call) == 0, "%s failed", #call)

static void setup(void) {
  st_rng_seed(&rng, tu_seed());
}

/* ==== The ring of machines ==================================================
 */

typedef struct {
  uint8_t* data;
  size_t len;
} frame_t;

/* From member i to member i + 1: frames [head, head + n_written) have been
 * written to the stream, the rest not yet. */
typedef struct {
  frame_t* f;
  size_t head, len, cap;
  size_t n_written;
  bool closed;
  int delivered; /* frames handed to the reader so far */
} link_t;

typedef struct {
  st_ring_t* x;
  uint32_t rank;
  float* input;
  bool want; /* a WANT_SNAPSHOT not yet answered */
  bool withhold;
  int n_want, n_apply, n_done, n_timer;
  uint64_t timer_at;
  st_ring_result_t result;
  float* delta; /* a copy of APPLY's values */
  const float* apply_ptr;
  unsigned unacked, max_unacked;
  bool closed; /* finished, streams closed */
} member_t;

typedef enum { H_DELIVER, H_DROP, H_TWICE } hook_rc_t;

/* Sees frame `index` of the link from member `from` before delivery; may
 * rewrite data[0..*len) (up to 64 bytes longer). */
typedef hook_rc_t (*hook_fn)(void* ctx, uint32_t from, int index, uint8_t* data,
                             size_t* len);

typedef struct {
  uint32_t n;
  uint64_t floats;
  st_ring_config_t cfg;
  member_t* m;
  link_t* l;
  float* scratch;
  uint64_t now;
  hook_fn hook;
  void* hook_ctx;
  /* Abort member abort_rank once it has received abort_after segments. */
  int abort_rank;
  uint64_t abort_after;
} ring_t;

static void link_push(link_t* l, const uint8_t* data, size_t len) {
  if (l->head + l->len == l->cap) {
    if (l->head > 0) {
      memmove(l->f, l->f + l->head, l->len * sizeof *l->f);
      l->head = 0;
    } else {
      l->cap = l->cap ? 2 * l->cap : 16;
      l->f = realloc(l->f, l->cap * sizeof *l->f);
      REQUIRE(l->f != NULL, "out of memory");
    }
  }
  frame_t* f = &l->f[l->head + l->len++];
  f->data = malloc(len + 64);
  REQUIRE(f->data != NULL, "out of memory");
  memcpy(f->data, data, len);
  f->len = len;
}

/* Drops the frames from index `from` (relative to head) on. */
static void link_truncate(link_t* l, size_t from) {
  for (size_t i = from; i < l->len; i++)
    free(l->f[l->head + i].data);
  if (l->len > from)
    l->len = from;
  if (l->n_written > l->len)
    l->n_written = l->len;
}

static void drain(ring_t* r, uint32_t i) {
  member_t* m = &r->m[i];
  st_ract_t a;
  while (st_ring_next_action(m->x, &a)) {
    REQUIRE(m->n_done == 0, "member %u: an action after DONE", i);
    switch (a.kind) {
      case ST_RACT_SEND: {
        REQUIRE(a.len > 0 && a.len <= ST_WIRE_MAX_MESSAGE_BYTES,
                "SEND of %zu bytes", a.len);
        st_msg_t msg;
        REQUIRE_OK(st_wire_decode(a.data, a.len, &msg, NULL));
        const st_msg_ring_seg_t* g = &msg.u.ring_seg;
        REQUIRE(msg.type == ST_MSG_RING_SEG && g->round_id == ROUND &&
                    g->data_len > 0 &&
                    g->data_len <= 4 * (size_t) r->cfg.segment_floats,
                "a SEND that is not a segment of the round");
        m->unacked++;
        if (m->unacked > m->max_unacked)
          m->max_unacked = m->unacked;
        REQUIRE(m->unacked <= r->cfg.in_flight, "member %u: %u in flight", i,
                m->unacked);
        if (!r->l[i].closed)
          link_push(&r->l[i], a.data, a.len);
        break;
      }
      case ST_RACT_WANT_SNAPSHOT:
        REQUIRE(m->n_want == 0, "member %u: WANT_SNAPSHOT twice", i);
        m->n_want++;
        m->want = true;
        REQUIRE(st_ring_snapshot_buffer(m->x) != NULL, "no buffer");
        break;
      case ST_RACT_APPLY:
        REQUIRE(m->n_apply == 0, "member %u: APPLY twice", i);
        m->n_apply++;
        REQUIRE(a.n == r->floats, "APPLY of %zu floats", a.n);
        m->apply_ptr = a.values;
        m->delta = malloc(a.n * sizeof(float) + 1);
        REQUIRE(m->delta != NULL, "out of memory");
        memcpy(m->delta, a.values, a.n * sizeof(float));
        break;
      case ST_RACT_TIMER:
        m->n_timer++;
        m->timer_at = a.at_ms;
        break;
      case ST_RACT_DONE:
        m->n_done++;
        m->result = a.result;
        REQUIRE(st_ring_finished(m->x) &&
                    st_ring_snapshot_buffer(m->x) == NULL &&
                    (a.result == ST_RING_OK || m->n_apply == 0),
                "member %u: DONE(%s) inconsistent", i,
                st_ring_result_name(a.result));
        break;
    }
  }
}

/* A finished member closes both its streams. */
static void close_streams(ring_t* r, uint32_t i) {
  member_t* m = &r->m[i];
  if (m->closed || m->n_done == 0)
    return;
  m->closed = true;
  link_t* out = &r->l[i];
  link_t* in = &r->l[(i + r->n - 1) % r->n];
  link_truncate(out, out->n_written); /* unwritten frames are lost */
  out->closed = true;
  link_truncate(in, 0); /* nobody reads them */
  in->closed = true;
}

/* The driver's rule: a stream that ends while the machine still has
 * segments to move on it aborts the round. */
static bool check_closed(ring_t* r, uint32_t i) {
  member_t* m = &r->m[i];
  if (st_ring_finished(m->x))
    return false;
  st_ring_progress_t p;
  st_ring_progress(m->x, &p);
  const link_t* in = &r->l[(i + r->n - 1) % r->n];
  const link_t* out = &r->l[i];
  bool in_ended = in->closed && in->n_written == 0 &&
                  p.segments_received < p.segments_to_receive;
  bool out_ended = out->closed && p.segments_acked < p.segments_to_send;
  if (!in_ended && !out_ended)
    return false;
  REQUIRE_OK(st_ring_abort(m->x, r->now, ST_RING_FAIL_CLOSED));
  drain(r, i);
  return true;
}

static void ring_init(ring_t* r, uint32_t n, uint64_t floats,
                      const st_ring_config_t* cfg) {
  memset(r, 0, sizeof *r);
  r->n = n;
  r->floats = floats;
  r->cfg = *cfg;
  r->now = T0;
  r->abort_rank = -1;
  r->m = calloc(n, sizeof *r->m);
  r->l = calloc(n, sizeof *r->l);
  r->scratch = malloc(floats * sizeof(float) + 4);
  ck_assert(r->m && r->l && r->scratch);
  for (uint32_t i = 0; i < n; i++) {
    member_t* m = &r->m[i];
    m->rank = i;
    m->input = malloc(floats * sizeof(float) + 4);
    ck_assert_ptr_nonnull(m->input);
    /* Each member at its own scale, 2^-3 .. 2^3. */
    float scale = ldexpf(1.0f, (int) st_rng_below(&rng, 7) - 3);
    tu_fill_uniform(&rng, m->input, floats, -scale, scale);
    ck_assert_int_eq(st_ring_new(cfg, ROUND, n, i, floats, T0, &m->x), 0);
  }
  for (uint32_t i = 0; i < n; i++)
    drain(r, i);
}

static void ring_free(ring_t* r) {
  for (uint32_t i = 0; i < r->n; i++) {
    st_ring_free(r->m[i].x);
    free(r->m[i].input);
    free(r->m[i].delta);
    link_truncate(&r->l[i], 0);
    free(r->l[i].f);
  }
  free(r->m);
  free(r->l);
  free(r->scratch);
}

typedef enum { E_SNAPSHOT, E_WRITE, E_DELIVER } ev_kind_t;

typedef struct {
  ev_kind_t kind;
  uint32_t i;
} ev_t;

static void answer_snapshot(ring_t* r, uint32_t i) {
  member_t* m = &r->m[i];
  size_t n = (size_t) r->floats;
  m->want = false;
  if (st_rng_below(&rng, 2)) {
    float* buf = st_ring_snapshot_buffer(m->x);
    REQUIRE(buf != NULL, "no buffer");
    memcpy(buf, m->input, n * sizeof(float));
    REQUIRE_OK(st_ring_snapshot(m->x, r->now, buf, n));
  } else {
    memcpy(r->scratch, m->input, n * sizeof(float));
    REQUIRE_OK(st_ring_snapshot(m->x, r->now, r->scratch, n));
    for (size_t k = 0; k < n; k++)
      r->scratch[k] = 7.0f; /* copied: the driver may reuse its buffer */
  }
}

static void deliver(ring_t* r, uint32_t from) {
  link_t* l = &r->l[from];
  uint32_t to = (from + 1) % r->n;
  frame_t f = l->f[l->head++];
  l->len--;
  l->n_written--;
  int index = l->delivered++;
  hook_rc_t h =
      r->hook ? r->hook(r->hook_ctx, from, index, f.data, &f.len) : H_DELIVER;
  if (h != H_DROP)
    REQUIRE_OK(st_ring_message(r->m[to].x, r->now, f.data, f.len));
  if (h == H_TWICE)
    REQUIRE_OK(st_ring_message(r->m[to].x, r->now, f.data, f.len));
  free(f.data);
}

/* Runs random events until none is enabled. */
static void ring_run(ring_t* r) {
  uint32_t n = r->n;
  ev_t* evs = malloc(3 * n * sizeof *evs);
  ck_assert_ptr_nonnull(evs);
  for (;;) {
    bool again = true;
    while (again) {
      again = false;
      for (uint32_t i = 0; i < n; i++) {
        member_t* m = &r->m[i];
        if (r->abort_rank == (int) i && !st_ring_finished(m->x)) {
          st_ring_progress_t p;
          st_ring_progress(m->x, &p);
          if (p.segments_received >= r->abort_after) {
            REQUIRE_OK(st_ring_abort(m->x, r->now, ST_RING_FAIL_ABORTED));
            drain(r, i);
          }
        }
        if (m->n_done > 0 && !m->closed) {
          close_streams(r, i);
          again = true;
        }
        again |= check_closed(r, i);
      }
    }
    size_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
      member_t* m = &r->m[i];
      link_t* l = &r->l[i];
      if (m->want && !m->withhold && !st_ring_finished(m->x))
        evs[k++] = (ev_t){E_SNAPSHOT, i};
      if (l->len > l->n_written)
        evs[k++] = (ev_t){E_WRITE, i};
      if (l->n_written > 0)
        evs[k++] = (ev_t){E_DELIVER, i};
    }
    if (k == 0)
      break;
    ev_t e = evs[st_rng_below(&rng, k)];
    member_t* m = &r->m[e.i];
    switch (e.kind) {
      case E_SNAPSHOT:
        answer_snapshot(r, e.i);
        drain(r, e.i);
        break;
      case E_WRITE:
        r->l[e.i].n_written++;
        REQUIRE(m->unacked > 0, "a frame written twice");
        m->unacked--;
        REQUIRE_OK(st_ring_sent(m->x, r->now));
        drain(r, e.i);
        break;
      case E_DELIVER:
        deliver(r, e.i);
        drain(r, (e.i + 1) % n);
        break;
    }
  }
  free(evs);
}

/* ==== Checking a successful round ===========================================
 */

/* The bound on |own + delta - mean64|, per float. The ring sums n floats
 * in float32 in some order: |fl(sum) - sum| <= gamma_{n-1} sum_j |x_j|
 * with gamma_k = k u / (1 - k u) (Higham, Accuracy and Stability of
 * Numerical Algorithms, 2nd ed., (3.4)); dividing by n (exact in float,
 * n <= 2^16) adds u |mean|: |mean32 - mean64| <= ((n - 1) u (1 + 2^-8) +
 * u) M <= n u M (1 + 2^-8), M = max_j |x_j|. Then delta = fl(mean32 - own)
 * and fl(own + delta) round twice more: u (|mean32| + |own|) + u |mean32|,
 * at most 3 u M (1 + u). So (n + 3) u M (1 + 2^-8), plus a few ulps of the
 * smallest subnormal for results that underflow. */
static double bound(uint32_t n, double max_abs) {
  const double u = ldexp(1.0, -24);
  return (n + 3) * u * max_abs * (1.0 + 1.0 / 256) + 8 * ldexp(1.0, -149);
}

static void check_results(ring_t* r) {
  uint32_t n = r->n;
  size_t N = (size_t) r->floats;
  bool trivial = n == 1 || N == 0;
  for (uint32_t i = 0; i < n; i++) {
    member_t* m = &r->m[i];
    REQUIRE(m->n_done == 1 && m->result == ST_RING_OK,
            "member %u: %d DONE, result %s", i, m->n_done,
            st_ring_result_name(m->result));
    REQUIRE(m->n_want == (trivial ? 0 : 1) && m->n_apply == (trivial ? 0 : 1),
            "member %u: %d WANT_SNAPSHOT, %d APPLY", i, m->n_want, m->n_apply);
    REQUIRE(m->max_unacked <= r->cfg.in_flight, "member %u: %u in flight", i,
            m->max_unacked);
    st_ring_progress_t p;
    st_ring_progress(m->x, &p);
    REQUIRE(p.segments_sent == p.segments_to_send &&
                p.segments_acked == p.segments_to_send &&
                p.segments_received == p.segments_to_receive &&
                p.started_ms == T0,
            "member %u: progress counters", i);
  }
  if (trivial) {
    for (uint32_t i = 0; i < n; i++)
      REQUIRE(st_ring_mean(r->m[i].x) == NULL, "a mean of nothing");
    return;
  }
  const float* mean0 = st_ring_mean(r->m[0].x);
  REQUIRE(mean0 != NULL, "no mean");
  for (uint32_t i = 1; i < n; i++) {
    const float* mi = st_ring_mean(r->m[i].x);
    REQUIRE(mi != NULL && memcmp(mi, mean0, N * sizeof(float)) == 0,
            "member %u's mean differs from member 0's", i);
  }
  /* APPLY's values stay valid until st_ring_free. */
  for (uint32_t i = 0; i < n; i++)
    REQUIRE(memcmp(r->m[i].apply_ptr, r->m[i].delta, N * sizeof(float)) == 0,
            "member %u: APPLY's values changed", i);
  for (uint32_t c = 0; c < n; c++) {
    size_t lo = (size_t) ((uint64_t) c * N / n);
    size_t hi = (size_t) ((uint64_t) (c + 1) * N / n);
    for (size_t k = lo; k < hi; k++) {
      /* The ring's order: chunk c starts at member c. */
      float s = r->m[c].input[k];
      double s64 = 0, max_abs = 0;
      for (uint32_t j = 1; j < n; j++)
        s = r->m[(c + j) % n].input[k] + s;
      float want = s / (float) n;
      for (uint32_t j = 0; j < n; j++) {
        s64 += r->m[j].input[k];
        max_abs = fmax(max_abs, fabs((double) r->m[j].input[k]));
      }
      double mean64 = s64 / n;
      REQUIRE(memcmp(&want, &mean0[k], 4) == 0,
              "float %zu: mean %a, the ring's order gives %a", k,
              (double) mean0[k], (double) want);
      double tol = bound(n, max_abs);
      for (uint32_t i = 0; i < n; i++) {
        float got = r->m[i].input[k] + r->m[i].delta[k];
        REQUIRE(fabs((double) got - mean64) <= tol,
                "member %u, float %zu: own + delta %a, mean %a, "
                "tolerance %a",
                i, k, (double) got, mean64, tol);
      }
    }
  }
}

/* ==== Coded rounds ==========================================================
 */

/* A coded round (gossip.h, "Coded rounds"): the same mean bits on every
 * member; the members' parameters after it add up to what they held
 * before; and the mean is within the codec's rounding of the float64 mean,
 * of the drifts from the base when there is one. */
static void check_coded(ring_t* r, const float* base) {
  uint32_t n = r->n;
  size_t N = (size_t) r->floats;
  const double u = ldexp(1.0, -24);
  const float* mean0 = st_ring_mean(r->m[0].x);
  for (uint32_t i = 0; i < n; i++) {
    member_t* m = &r->m[i];
    REQUIRE(m->n_done == 1 && m->result == ST_RING_OK && m->n_apply == 1,
            "member %u: %d DONE, result %s", i, m->n_done,
            st_ring_result_name(m->result));
    const float* mi = st_ring_mean(m->x);
    REQUIRE(mi != NULL && memcmp(mi, mean0, N * sizeof(float)) == 0,
            "member %u's mean differs from member 0's", i);
  }
  /* A segment's scale comes from its largest partial sum: the bounds use
   * the largest drift anywhere. */
  double drift = 0;
  for (size_t k = 0; k < N; k++)
    for (uint32_t i = 0; i < n; i++)
      drift = fmax(drift, fabs((double) r->m[i].input[k] -
                               (base != NULL ? base[k] : 0)));
  double worst = 0;
  for (size_t k = 0; k < N; k++) {
    double before = 0, after = 0, big = 0;
    for (uint32_t i = 0; i < n; i++) {
      double x = r->m[i].input[k];
      before += x;
      after += (double) (r->m[i].input[k] + r->m[i].delta[k]);
      big = fmax(big, fabs(x));
    }
    /* Float rounding only: the sums and the kept roundings, over partial
     * sums of at most n drifts (and the base's own size). */
    double tol_sum = 8.0 * n * n * u * (n * drift + big) + 1e-30;
    REQUIRE(fabs(after - before) <= tol_sum,
            "float %zu: the members hold %a after, %a before (tolerance %a)", k,
            after, before, tol_sum);
    /* Each float's sum meets n encodings at most, each rounding by half a
     * scale, a scale at most n * drift / 127; / n for the mean. */
    double tol_mean = n * drift / 254.0 * 1.01 + 8.0 * n * u * big + 1e-30;
    double err = fabs((double) mean0[k] - before / n);
    REQUIRE(err <= tol_mean, "float %zu: mean %a, float64 %a (tolerance %a)", k,
            (double) mean0[k], before / n, tol_mean);
    worst = fmax(worst, err / (drift > 0 ? drift : 1));
  }
  /* The codec did round: a test of float32 rounds would pass the above. */
  REQUIRE(N < 100 || worst > 1e-5, "no rounding seen (%g)", worst);
}

START_TEST(test_coded) {
  static const struct {
    uint32_t n;
    uint64_t floats;
    uint32_t segment;
    bool base;
  } cases[] = {{2, 1000, 64, false},  {3, 1000, 7, false},
               {4, 100003, 0, false}, {5, 9999, 100, true},
               {7, 3000, 50, true},   {16, 4000, 0, false},
               {3, 2, 0, false},      {4, 30000, 1000, true}};
  for (size_t it = 0; it < sizeof cases / sizeof cases[0]; it++) {
    st_ring_config_t cfg;
    st_ring_config_default(&cfg);
    if (cases[it].segment != 0)
      cfg.segment_floats = cases[it].segment;
    cfg.codec = &ring_test_codec;
    size_t N = (size_t) cases[it].floats;
    float* base = NULL;
    if (cases[it].base) {
      base = malloc(N * sizeof(float));
      ck_assert_ptr_nonnull(base);
      tu_fill_uniform(&rng, base, N, -8.0f, 8.0f);
      cfg.base = base;
    }
    snprintf(label, sizeof label, "coded: %u members, %zu floats%s",
             cases[it].n, N, base ? ", a base" : "");
    ring_t r;
    ring_init(&r, cases[it].n, N, &cfg);
    if (base != NULL) /* the members drift a little from the base */
      for (uint32_t i = 0; i < r.n; i++)
        for (size_t k = 0; k < N; k++)
          r.m[i].input[k] = base[k] + r.m[i].input[k] * 0x1p-6f;
    ring_run(&r);
    check_coded(&r, base);
    ring_free(&r);
    free(base);
  }
}
END_TEST

/* ==== Successful rounds =====================================================
 */

typedef struct {
  int group; /* one Check test a group (a fork each costs ~0.1 s in ASan) */
  uint32_t n;
  uint64_t floats;
  uint32_t segment; /* 0: the default */
  uint32_t in_flight;
} sum_case_t;

static const sum_case_t sum_cases[] = {
    /* 0: sizes 0 and 1, and fewer floats than members. */
    {0, 1, 0, 0, 2},
    {0, 2, 0, 0, 2},
    {0, 16, 0, 0, 2},
    {0, 1, 1, 0, 2},
    {0, 2, 1, 0, 2},
    {0, 3, 1, 0, 2},
    {0, 7, 1, 0, 2},
    {0, 16, 1, 0, 2},
    {0, 3, 2, 0, 2},
    {0, 7, 5, 0, 2},
    {0, 16, 15, 0, 2},
    {0, 16, 17, 3, 2},
    /* 1: tiny segments: many of them, pipelined. */
    {1, 1, 1000, 7, 2},
    {1, 2, 1000, 7, 2},
    {1, 3, 1000, 7, 1},
    {1, 4, 1000, 7, 2},
    {1, 5, 1000, 7, 3},
    {1, 7, 1000, 7, 2},
    {1, 8, 1000, 7, 2},
    {1, 13, 1000, 7, 5},
    {1, 16, 1000, 7, 2},
    {1, 7, 100, 1, 2},
    {1, 16, 333, 1, 1},
    /* 2: not divisible by the member count, with small segments. */
    {2, 1, 1000003, 1000, 2},
    {2, 2, 1000003, 1000, 2},
    {2, 3, 1000003, 1000, 2},
    {2, 7, 1000003, 1000, 2},
    {2, 16, 1000003, 1000, 2},
    /* 3: large, with the default segments (some chunks span several). */
    {3, 3, 3000000, 0, 2},
    {3, 7, 3000000, 0, 2},
};
#define N_SUM_CASES ((int) (sizeof sum_cases / sizeof sum_cases[0]))
#define N_SUM_GROUPS 4

static void config_for(const sum_case_t* c, st_ring_config_t* cfg) {
  st_ring_config_default(cfg);
  if (c->segment != 0)
    cfg->segment_floats = c->segment;
  cfg->in_flight = c->in_flight;
}

START_TEST(test_sum) {
  for (int k = 0; k < N_SUM_CASES; k++) {
    const sum_case_t* c = &sum_cases[k];
    if (c->group != _i)
      continue;
    st_ring_config_t cfg;
    config_for(c, &cfg);
    snprintf(label, sizeof label,
             "%u members, %llu floats, segment %u, %u "
             "in flight",
             c->n, (unsigned long long) c->floats, cfg.segment_floats,
             cfg.in_flight);
    ring_t r;
    ring_init(&r, c->n, c->floats, &cfg);
    ring_run(&r);
    check_results(&r);
    /* With more segments than the limit, the pipeline fills it. */
    if (c->n > 1 && c->floats / c->n > 4 * cfg.segment_floats * cfg.in_flight) {
      unsigned most = 0;
      for (uint32_t i = 0; i < c->n; i++)
        most = r.m[i].max_unacked > most ? r.m[i].max_unacked : most;
      REQUIRE(most == cfg.in_flight, "at most %u in flight", most);
    }
    ring_free(&r);
  }
}
END_TEST

/* A snapshot given last: the member's upstream sends its whole
 * reduce-scatter first (those chunks hold nothing of ours), which waits in
 * the machine and is added when the snapshot comes. */
START_TEST(test_late_snapshot) {
  static const uint32_t ns[] = {2, 3, 5, 16};
  st_ring_config_t cfg;
  st_ring_config_default(&cfg);
  cfg.segment_floats = 5;
  cfg.in_flight = 3;
  for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
    uint32_t n = ns[k];
    ring_t r;
    ring_init(&r, n, 997, &cfg);
    uint32_t late = (uint32_t) st_rng_below(&rng, n);
    snprintf(label, sizeof label, "%u members, member %u late", n, late);
    r.m[late].withhold = true;
    ring_run(&r);
    st_ring_progress_t p;
    st_ring_progress(r.m[late].x, &p);
    REQUIRE(!p.have_snapshot && p.segments_sent == 0 && p.segments_received > 0,
            "before the snapshot: %llu sent, %llu received",
            (unsigned long long) p.segments_sent,
            (unsigned long long) p.segments_received);
    r.m[late].withhold = false;
    ring_run(&r);
    check_results(&r);
    ring_free(&r);
  }
}
END_TEST

/* ==== Pipelining and flow control ===========================================
 */

/* Encodes one segment from the previous member. */
static size_t make_seg(uint8_t* buf, size_t cap, uint64_t round, int phase,
                       uint32_t step, uint32_t chunk, uint64_t offset,
                       const float* data, uint32_t count) {
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_RING_SEG;
  m.u.ring_seg.round_id = round;
  m.u.ring_seg.phase = (uint8_t) phase;
  m.u.ring_seg.step = step;
  m.u.ring_seg.chunk = chunk;
  m.u.ring_seg.offset = offset;
  m.u.ring_seg.data = (const uint8_t*) data;
  m.u.ring_seg.data_len = count * 4;
  size_t len = 0;
  ck_assert_int_eq(st_wire_encode(&m, buf, cap, &len), 0);
  return len;
}

typedef struct {
  int sends;
  st_msg_ring_seg_t last;
  float last_data[64];
  bool apply, done;
  st_ring_result_t result;
  uint64_t timer_at;
  int timers;
} acts_t;

static void take(st_ring_t* x, acts_t* a) {
  st_ract_t act;
  while (st_ring_next_action(x, &act)) {
    switch (act.kind) {
      case ST_RACT_SEND: {
        st_msg_t m;
        ck_assert_int_eq(st_wire_decode(act.data, act.len, &m, NULL), 0);
        a->sends++;
        a->last = m.u.ring_seg;
        ck_assert_uint_le(m.u.ring_seg.data_len, sizeof a->last_data);
        memcpy(a->last_data, m.u.ring_seg.data, m.u.ring_seg.data_len);
        a->last.data = NULL;
        break;
      }
      case ST_RACT_APPLY:
        a->apply = true;
        break;
      case ST_RACT_DONE:
        a->done = true;
        a->result = act.result;
        break;
      case ST_RACT_TIMER:
        a->timers++;
        a->timer_at = act.at_ms;
        break;
      case ST_RACT_WANT_SNAPSHOT:
        break;
    }
  }
}

/* Every mean holds this member's contribution, so an all-gather segment
 * cannot come before this member's snapshot: one that does is fabricated
 * and fails the round with nothing applied. (Member 0 of 2, 8 floats,
 * one segment a chunk: a reduce-scatter segment may come early and wait;
 * the all-gather one after it may not. fuzz_ring found that such a
 * segment used to turn garbage into an unchecked delta.) */
START_TEST(test_allgather_before_snapshot) {
  st_ring_config_t cfg;
  st_ring_config_default(&cfg);
  cfg.segment_floats = 4;
  st_ring_t* x;
  ck_assert_int_eq(st_ring_new(&cfg, 5, 2, 0, 8, T0, &x), 0);
  float in[4] = {1, 2, 3, 4}, mean[4] = {5, 6, 7, 8};
  uint8_t buf[256];
  acts_t a = {0};
  take(x, &a);
  size_t len = make_seg(buf, sizeof buf, 5, 0, 0, 1, 0, in, 4);
  ck_assert_int_eq(st_ring_message(x, T0, buf, len), 0);
  take(x, &a);
  ck_assert(!a.done); /* an early reduce-scatter segment waits */
  len = make_seg(buf, sizeof buf, 5, 1, 0, 0, 0, mean, 4);
  ck_assert_int_eq(st_ring_message(x, T0, buf, len), 0);
  take(x, &a);
  ck_assert(a.done);
  ck_assert_int_eq(a.result, ST_RING_FAIL_PROTOCOL);
  ck_assert(!a.apply);
  st_ring_free(x);
}
END_TEST

/* Member 1 of 3, 60 floats (chunks of 20), segments of 4: five segments a
 * chunk. Its step 0 sends its own chunk 1; then each segment of chunk 0
 * that comes from member 0 goes on at once as step 1's, own + received,
 * while the rest of chunk 0 is still on its way. */
START_TEST(test_pipelined) {
  st_ring_config_t cfg;
  st_ring_config_default(&cfg);
  cfg.segment_floats = 4;
  cfg.in_flight = 2;
  st_ring_t* x;
  ck_assert_int_eq(st_ring_new(&cfg, 9, 3, 1, 60, T0, &x), 0);
  float own[60], in[20];
  tu_fill_uniform(&rng, own, 60, -1, 1);
  tu_fill_uniform(&rng, in, 20, -1, 1);
  acts_t a = {0};
  take(x, &a);
  ck_assert_int_eq(a.sends, 0);
  ck_assert_int_eq(st_ring_snapshot(x, T0, own, 60), 0);
  take(x, &a);
  /* Two in flight, then held back until one is written. */
  ck_assert_int_eq(a.sends, 2);
  take(x, &a);
  ck_assert_int_eq(a.sends, 2);
  for (int k = 2; k < 5; k++) {
    ck_assert_int_eq(st_ring_sent(x, T0), 0);
    take(x, &a);
    ck_assert_int_eq(a.sends, k + 1);
    ck_assert_uint_eq(a.last.phase, 0);
    ck_assert_uint_eq(a.last.step, 0);
    ck_assert_uint_eq(a.last.chunk, 1);
    ck_assert_uint_eq(a.last.offset, 4 * (uint64_t) k);
    ck_assert_mem_eq(a.last_data, own + 20 + 4 * k, 16);
  }
  ck_assert_int_eq(st_ring_sent(x, T0), 0);
  ck_assert_int_eq(st_ring_sent(x, T0), 0);
  ck_assert_int_eq(st_ring_sent(x, T0), -EINVAL); /* none outstanding */
  take(x, &a);
  ck_assert_int_eq(a.sends, 5); /* step 1 needs chunk 0 from member 0 */
  uint8_t buf[256];
  for (int k = 0; k < 5; k++) {
    size_t len =
        make_seg(buf, sizeof buf, 9, 0, 0, 0, 4 * (uint64_t) k, in + 4 * k, 4);
    ck_assert_int_eq(st_ring_message(x, T0, buf, len), 0);
    take(x, &a);
    ck_assert_int_eq(a.sends, 6 + k);
    ck_assert_uint_eq(a.last.step, 1);
    ck_assert_uint_eq(a.last.chunk, 0);
    ck_assert_uint_eq(a.last.offset, 4 * (uint64_t) k);
    for (int j = 0; j < 4; j++) {
      float want = own[4 * k + j] + in[4 * k + j];
      ck_assert_mem_eq(&a.last_data[j], &want, 4);
    }
    ck_assert_int_eq(st_ring_sent(x, T0), 0);
  }
  ck_assert(!a.done);
  st_ring_free(x);
}
END_TEST

/* ==== Failures ==============================================================
 */

/* Nobody applies, everybody is done with a failure, and `who` with
 * `want`. */
static void check_failed(ring_t* r, int who, st_ring_result_t want) {
  for (uint32_t i = 0; i < r->n; i++) {
    member_t* m = &r->m[i];
    REQUIRE(m->n_done == 1, "member %u: %d DONE", i, m->n_done);
    REQUIRE(m->n_apply == 0, "member %u applied", i);
    REQUIRE(m->result != ST_RING_OK, "member %u: ok", i);
    REQUIRE(st_ring_mean(m->x) == NULL, "member %u: a mean", i);
    if (who >= 0 && (uint32_t) who == i)
      REQUIRE(m->result == want, "member %u: %s, want %s", i,
              st_ring_result_name(m->result), st_ring_result_name(want));
  }
}

/* Segments member `rank` receives during the reduce-scatter: nobody can
 * finish when one member fails before it has added all of them (the
 * chunk it would complete never is). */
static uint64_t rs_segments(uint32_t n, uint64_t floats, uint32_t seg,
                            uint32_t rank) {
  uint64_t total = 0;
  for (uint32_t t = 0; t + 1 < n; t++) {
    uint32_t c = (rank + 2 * n - 1 - t) % n;
    uint64_t size = (uint64_t) (c + 1) * floats / n - (uint64_t) c * floats / n;
    total += (size + seg - 1) / seg;
  }
  return total;
}

START_TEST(test_abort_mid_round) {
  static const uint32_t ns[] = {2, 3, 7, 16};
  st_ring_config_t cfg;
  st_ring_config_default(&cfg);
  cfg.segment_floats = 3;
  for (int it = 0; it < 16; it++) {
    uint32_t n = ns[it % 4];
    ring_t r;
    ring_init(&r, n, 1000, &cfg);
    r.abort_rank = (int) st_rng_below(&rng, n);
    r.abort_after =
        st_rng_below(&rng, rs_segments(n, 1000, 3, (uint32_t) r.abort_rank));
    snprintf(label, sizeof label, "%u members, member %d aborts after %llu", n,
             r.abort_rank, (unsigned long long) r.abort_after);
    ring_run(&r);
    check_failed(&r, r.abort_rank, ST_RING_FAIL_ABORTED);
    for (uint32_t i = 0; i < n; i++)
      if ((int) i != r.abort_rank)
        REQUIRE(r.m[i].result == ST_RING_FAIL_CLOSED, "member %u: %s", i,
                st_ring_result_name(r.m[i].result));
    ring_free(&r);
  }
}
END_TEST

typedef enum {
  C_ROUND,
  C_PHASE,
  C_STEP,
  C_CHUNK,
  C_OFFSET,
  C_SHORT, /* one float fewer */
  C_LONG,  /* one float more */
  C_CUT,   /* the frame cut short */
  C_GARBAGE,
  C_OTHER_TYPE, /* a TENSOR_CHUNK with the same data */
  C_DROP,       /* one segment lost */
  C_TWICE,      /* one segment repeated */
  C_COUNT
} corrupt_t;

typedef struct {
  corrupt_t how;
  int index;
  int hits;
} corrupt_ctx_t;

static hook_rc_t corrupt_hook(void* ctx, uint32_t from, int index,
                              uint8_t* data, size_t* len) {
  corrupt_ctx_t* c = ctx;
  if (from != 0 || index != c->index)
    return H_DELIVER;
  c->hits++;
  if (c->how == C_DROP)
    return H_DROP;
  if (c->how == C_TWICE)
    return H_TWICE;
  if (c->how == C_CUT) {
    *len = (size_t) st_rng_below(&rng, *len);
    return H_DELIVER;
  }
  if (c->how == C_GARBAGE) {
    for (size_t i = 0; i < *len; i++)
      data[i] = (uint8_t) st_rng_next(&rng);
    return H_DELIVER;
  }
  st_msg_t m;
  ck_assert_int_eq(st_wire_decode(data, *len, &m, NULL), 0);
  st_msg_ring_seg_t g = m.u.ring_seg;
  static float copy[ST_RING_SEGMENT_FLOATS + 1];
  memcpy(copy, g.data, g.data_len);
  g.data = (const uint8_t*) copy;
  switch (c->how) {
    case C_ROUND:
      g.round_id ^= UINT64_C(1) << st_rng_below(&rng, 64);
      break;
    case C_PHASE:
      g.phase ^= 1;
      break;
    case C_STEP:
      g.step += 1 + (uint32_t) st_rng_below(&rng, 3);
      break;
    case C_CHUNK:
      g.chunk = (g.chunk + 1) % 3;
      break;
    case C_OFFSET:
      g.offset += st_rng_below(&rng, 2) ? 1 : 3; /* other than 0 mod 3 */
      break;
    case C_SHORT:
      g.data_len -= 4;
      break;
    case C_LONG:
      g.data_len += 4;
      break;
    default:
      break;
  }
  memset(&m, 0, sizeof m);
  if (c->how == C_OTHER_TYPE) {
    m.type = ST_MSG_TENSOR_CHUNK;
    m.u.chunk.offset = g.offset;
    m.u.chunk.total = 1u << 20;
    m.u.chunk.data = g.data;
    m.u.chunk.data_len = g.data_len;
  } else {
    m.type = ST_MSG_RING_SEG;
    m.u.ring_seg = g;
  }
  ck_assert_int_eq(st_wire_encode(&m, data, *len + 64, len), 0);
  return H_DELIVER;
}

START_TEST(test_corrupt) {
  corrupt_t how = (corrupt_t) _i;
  st_ring_config_t cfg;
  st_ring_config_default(&cfg);
  cfg.segment_floats = 3; /* full segments of 3: C_SHORT never empties */
  for (int it = 0; it < 4; it++) {
    ring_t r;
    ring_init(&r, 3, 900, &cfg);
    corrupt_ctx_t c = {how, 0, 0};
    snprintf(label, sizeof label, "corruption %d", (int) how);
    /* A segment of the reduce-scatter into member 1 (so that nobody can
     * finish); not the last for C_DROP, so that another comes after. */
    uint64_t rs = rs_segments(3, 900, 3, 1);
    c.index = (int) st_rng_below(&rng, rs - 1);
    r.hook = corrupt_hook;
    r.hook_ctx = &c;
    ring_run(&r);
    ck_assert_int_eq(c.hits, 1);
    check_failed(&r, 1, ST_RING_FAIL_PROTOCOL);
    ring_free(&r);
  }
}
END_TEST

/* A segment after the receive stream is complete, and one from another
 * round, fail the receiver; events after DONE are ignored. */
START_TEST(test_extra_segment) {
  st_ring_config_t cfg;
  st_ring_config_default(&cfg);
  st_ring_t* x;
  ck_assert_int_eq(st_ring_new(&cfg, 77, 2, 0, 4, T0, &x), 0);
  float own[4] = {1, 2, 3, 4}, in[2] = {10, 20};
  acts_t a = {0};
  take(x, &a);
  ck_assert_int_eq(st_ring_snapshot(x, T0, own, 4), 0);
  take(x, &a);
  ck_assert_int_eq(a.sends, 1); /* chunk 0: floats 0, 1 */
  ck_assert_int_eq(st_ring_sent(x, T0), 0);
  uint8_t buf[128];
  /* Reduce-scatter: chunk 1 from member 1, then the mean of chunk 0. */
  size_t len = make_seg(buf, sizeof buf, 77, 0, 0, 1, 0, in, 2);
  ck_assert_int_eq(st_ring_message(x, T0, buf, len), 0);
  take(x, &a);
  ck_assert_int_eq(a.sends, 2);
  ck_assert_uint_eq(a.last.phase, 1);
  ck_assert_uint_eq(a.last.chunk, 1);
  ck_assert(a.last_data[0] == 6.5f && a.last_data[1] == 12.0f);
  ck_assert_int_eq(st_ring_sent(x, T0), 0);
  /* The same again instead of the all-gather: wrong phase. */
  ck_assert_int_eq(st_ring_message(x, T0, buf, len), 0);
  take(x, &a);
  ck_assert(a.done && !a.apply);
  ck_assert_int_eq(a.result, ST_RING_FAIL_PROTOCOL);
  /* After DONE: ignored. */
  ck_assert_int_eq(st_ring_message(x, T0, buf, len), 0);
  ck_assert_int_eq(st_ring_sent(x, T0), 0);
  ck_assert_int_eq(st_ring_tick(x, T0 + 1000000), 0);
  ck_assert_int_eq(st_ring_abort(x, T0, ST_RING_FAIL_CLOSED), 0);
  acts_t b = {0};
  take(x, &b);
  ck_assert(!b.done && b.sends == 0);
  st_ring_free(x);

  /* Complete, then one more segment. */
  ck_assert_int_eq(st_ring_new(&cfg, 77, 2, 0, 4, T0, &x), 0);
  memset(&a, 0, sizeof a);
  take(x, &a);
  ck_assert_int_eq(st_ring_snapshot(x, T0, own, 4), 0);
  ck_assert_int_eq(st_ring_message(x, T0, buf, len), 0);
  float mean0[2] = {5.5f, 11.0f};
  size_t len2 = make_seg(buf, sizeof buf, 77, 1, 0, 0, 0, mean0, 2);
  ck_assert_int_eq(st_ring_message(x, T0, buf, len2), 0);
  take(x, &a);
  ck_assert_int_eq(a.sends, 2);
  ck_assert(!a.done);
  ck_assert_int_eq(st_ring_message(x, T0, buf, len2), 0);
  take(x, &a);
  ck_assert(a.done && !a.apply);
  ck_assert_int_eq(a.result, ST_RING_FAIL_PROTOCOL);
  st_ring_free(x);
}
END_TEST

/* Member 2 never gets its snapshot: nothing moves past what needs it, and
 * every member times out, timeout_ms after its own last progress. */
START_TEST(test_timeout) {
  st_ring_config_t cfg;
  st_ring_config_default(&cfg);
  cfg.segment_floats = 10;
  cfg.timeout_ms = 5000;
  ring_t r;
  ring_init(&r, 3, 300, &cfg);
  for (uint32_t i = 0; i < 3; i++) {
    ck_assert_int_eq(r.m[i].n_timer, 1);
    ck_assert_uint_eq(r.m[i].timer_at, T0 + 5000);
  }
  r.m[2].withhold = true;
  r.now = T0 + 700; /* every event from here on is progress at T0 + 700 */
  ring_run(&r);
  for (uint32_t i = 0; i < 3; i++) {
    ck_assert(!st_ring_finished(r.m[i].x));
    st_ring_progress_t p;
    st_ring_progress(r.m[i].x, &p);
    ck_assert_uint_eq(p.last_progress_ms, T0 + 700);
    ck_assert_int_eq(st_ring_tick(r.m[i].x, T0 + 4999), 0);
    drain(&r, i);
    ck_assert_int_eq(r.m[i].n_timer, 1);
    /* At the armed time, progress has moved the deadline: re-armed. */
    ck_assert_int_eq(st_ring_tick(r.m[i].x, T0 + 5000), 0);
    drain(&r, i);
    ck_assert_int_eq(r.m[i].n_timer, 2);
    ck_assert_uint_eq(r.m[i].timer_at, T0 + 5700);
    ck_assert_int_eq(r.m[i].n_done, 0);
    ck_assert_int_eq(st_ring_tick(r.m[i].x, T0 + 5699), 0);
    drain(&r, i);
    ck_assert_int_eq(r.m[i].n_done, 0);
    ck_assert_int_eq(st_ring_tick(r.m[i].x, T0 + 5700), 0);
    drain(&r, i);
    ck_assert_int_eq(r.m[i].n_done, 1);
    ck_assert_int_eq(r.m[i].result, ST_RING_FAIL_TIMEOUT);
    ck_assert_int_eq(r.m[i].n_apply, 0);
  }
  ring_free(&r);

  /* timeout_ms 0: no TIMER, and ticks never fail the round. */
  cfg.timeout_ms = 0;
  st_ring_t* x;
  ck_assert_int_eq(st_ring_new(&cfg, 1, 2, 0, 10, T0, &x), 0);
  acts_t a = {0};
  take(x, &a);
  ck_assert_int_eq(a.timers, 0);
  ck_assert_int_eq(st_ring_tick(x, UINT64_MAX), 0);
  take(x, &a);
  ck_assert(!a.done && a.timers == 0);
  st_ring_free(x);
}
END_TEST

/* NaN or Inf anywhere in an input, or a sum that overflows: every member
 * sees the same non-finite mean and nobody applies. */
START_TEST(test_nonfinite) {
  static const uint32_t ns[] = {2, 3, 7, 16};
  st_ring_config_t cfg;
  st_ring_config_default(&cfg);
  cfg.segment_floats = 13;
  for (int it = 0; it < 12; it++) {
    uint32_t n = ns[it % 4];
    int kind = it / 4; /* 0 NaN, 1 Inf, 2 overflow */
    ring_t r;
    ring_init(&r, n, 500, &cfg);
    size_t at = (size_t) st_rng_below(&rng, 500);
    uint32_t who = (uint32_t) st_rng_below(&rng, n);
    snprintf(label, sizeof label, "%u members, %s at float %zu", n,
             kind == 0   ? "NaN"
             : kind == 1 ? "Inf"
                         : "overflow",
             at);
    if (kind == 0) {
      r.m[who].input[at] = NAN;
    } else if (kind == 1) {
      r.m[who].input[at] = st_rng_below(&rng, 2) ? INFINITY : -INFINITY;
    } else {
      for (uint32_t i = 0; i < n; i++)
        r.m[i].input[at] = FLT_MAX; /* the sum of two is already Inf */
    }
    ring_run(&r);
    for (uint32_t i = 0; i < n; i++)
      REQUIRE(r.m[i].result == ST_RING_FAIL_NONFINITE, "member %u: %s", i,
              st_ring_result_name(r.m[i].result));
    check_failed(&r, -1, ST_RING_OK);
    ring_free(&r);
  }
}
END_TEST

/* A finite mean whose difference from one member's own floats overflows
 * (a diverged member): that member refuses, alone; the others apply. Three
 * members, 9 floats: float 1 lies in chunk 0, summed x0, x1 + x0,
 * x2 + (x1 + x0) = FLT_MAX + (-FLT_MAX + FLT_MAX) = FLT_MAX, mean
 * FLT_MAX / 3; member 1's delta FLT_MAX / 3 + FLT_MAX overflows. */
START_TEST(test_delta_overflow) {
  st_ring_config_t cfg;
  st_ring_config_default(&cfg);
  ring_t r;
  ring_init(&r, 3, 9, &cfg);
  r.m[0].input[1] = FLT_MAX;
  r.m[1].input[1] = -FLT_MAX;
  r.m[2].input[1] = FLT_MAX;
  ring_run(&r);
  ck_assert_int_eq(r.m[0].result, ST_RING_OK);
  ck_assert_int_eq(r.m[2].result, ST_RING_OK);
  ck_assert_int_eq(r.m[1].result, ST_RING_FAIL_NONFINITE);
  ck_assert_int_eq(r.m[0].n_apply + r.m[1].n_apply + r.m[2].n_apply, 2);
  ck_assert_int_eq(r.m[1].n_apply, 0);
  float want = FLT_MAX / 3;
  ck_assert_mem_eq(&st_ring_mean(r.m[0].x)[1], &want, 4);
  ck_assert_mem_eq(st_ring_mean(r.m[0].x), st_ring_mean(r.m[2].x),
                   9 * sizeof(float));
  ring_free(&r);
}
END_TEST

/* ==== Degenerate sizes and misuse ===========================================
 */

START_TEST(test_trivial) {
  st_ring_config_t cfg;
  st_ring_config_default(&cfg);
  static const struct {
    uint32_t n;
    uint64_t floats;
  } cases[] = {{1, 0}, {1, 1}, {1, 1000}, {2, 0}, {16, 0}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    st_ring_t* x;
    ck_assert_int_eq(st_ring_new(&cfg, 5, cases[i].n, cases[i].n - 1,
                                 cases[i].floats, T0, &x),
                     0);
    ck_assert(st_ring_finished(x));
    ck_assert_ptr_null(st_ring_snapshot_buffer(x));
    st_ract_t a;
    ck_assert(st_ring_next_action(x, &a));
    ck_assert_int_eq(a.kind, ST_RACT_DONE);
    ck_assert_int_eq(a.result, ST_RING_OK);
    ck_assert(!st_ring_next_action(x, &a));
    ck_assert_ptr_null(st_ring_mean(x));
    st_ring_progress_t p;
    st_ring_progress(x, &p);
    ck_assert_uint_eq(p.segments_to_send + p.segments_to_receive, 0);
    st_ring_free(x);
  }
}
END_TEST

/* The round's segment (ring.c, round_seg): the configured one for a large
 * vector; for a small one at least 4 segments a chunk, none below 8192
 * floats; never above the configured one. Counted through the progress
 * report: a member sends 2 (n - 1) chunks, each in that many segments.
 * Without the small-vector rule the 1 MiB rows would send one segment a
 * chunk (6 at 4 members). */
static const struct {
  uint32_t n;
  uint64_t floats;
  uint32_t segment_floats; /* 0: the default */
  uint64_t to_send;
} seg_cases[] = {
    {4, 262144, 0, 6 * 4},      /* 1 MiB: chunks of 64 Ki, 16 Ki each */
    {2, 262144, 0, 2 * 4},      /* chunks of 128 Ki, 32 Ki each */
    {8, 262144, 0, 14 * 4},     /* chunks of 32 Ki, 8 Ki each */
    {16, 262144, 0, 30 * 2},    /* chunks of 16 Ki, the 8 Ki floor */
    {4, 4u << 20, 0, 6 * 16},   /* 16 MiB: the default 64 Ki segments */
    {2, 1000, 0, 2 * 1},        /* tiny: one segment a chunk */
    {4, 262144, 4096, 6 * 16},  /* configured below the floor: kept */
    {4, 262144, 100000, 6 * 4}, /* configured large: the rule applies */
};

START_TEST(test_segment_choice) {
  st_ring_config_t cfg;
  st_ring_config_default(&cfg);
  if (seg_cases[_i].segment_floats)
    cfg.segment_floats = seg_cases[_i].segment_floats;
  for (uint32_t rank = 0; rank < seg_cases[_i].n; rank++) {
    st_ring_t* x = NULL;
    ck_assert_int_eq(st_ring_new(&cfg, 7, seg_cases[_i].n, rank,
                                 seg_cases[_i].floats, T0, &x),
                     0);
    st_ring_progress_t p;
    st_ring_progress(x, &p);
    ck_assert_msg(p.segments_to_send == seg_cases[_i].to_send &&
                      p.segments_to_receive == seg_cases[_i].to_send,
                  "case %d rank %u: %llu to send, %llu to receive, want %llu",
                  _i, rank, (unsigned long long) p.segments_to_send,
                  (unsigned long long) p.segments_to_receive,
                  (unsigned long long) seg_cases[_i].to_send);
    st_ring_free(x);
  }
}
END_TEST

START_TEST(test_misuse) {
  st_ring_config_t cfg, bad;
  st_ring_config_default(&cfg);
  ck_assert_uint_eq(cfg.segment_floats, 65536);
  ck_assert_uint_eq(cfg.in_flight, 4);
  ck_assert_uint_eq(cfg.timeout_ms, 30000);
  st_ring_t* x = (st_ring_t*) &cfg;
  ck_assert_int_eq(st_ring_new(NULL, 1, 2, 0, 10, T0, &x), -EINVAL);
  ck_assert_ptr_null(x);
  ck_assert_int_eq(st_ring_new(&cfg, 1, 2, 0, 10, T0, NULL), -EINVAL);
  ck_assert_int_eq(st_ring_new(&cfg, 1, 0, 0, 10, T0, &x), -EINVAL);
  ck_assert_int_eq(st_ring_new(&cfg, 1, 2, 2, 10, T0, &x), -EINVAL);
  ck_assert_int_eq(st_ring_new(&cfg, 1, ST_RING_MAX_MEMBERS + 1, 0, 10, T0, &x),
                   -EINVAL);
  ck_assert_int_eq(st_ring_new(&cfg, 1, 2, 0, (UINT64_C(1) << 40) + 1, T0, &x),
                   -EINVAL);
  bad = cfg;
  bad.segment_floats = 0;
  ck_assert_int_eq(st_ring_new(&bad, 1, 2, 0, 10, T0, &x), -EINVAL);
  bad.segment_floats = ST_RING_SEGMENT_FLOATS + 1;
  ck_assert_int_eq(st_ring_new(&bad, 1, 2, 0, 10, T0, &x), -EINVAL);
  bad = cfg;
  bad.in_flight = 0;
  ck_assert_int_eq(st_ring_new(&bad, 1, 2, 0, 10, T0, &x), -EINVAL);

  ck_assert_int_eq(st_ring_new(&cfg, 1, 2, 1, 10, T0, &x), 0);
  float v[11] = {0};
  /* Wrong sizes, NULL, nothing to acknowledge, bad reasons. */
  ck_assert_int_eq(st_ring_snapshot(x, T0, v, 9), -EINVAL);
  ck_assert_int_eq(st_ring_snapshot(x, T0, v, 11), -EINVAL);
  ck_assert_int_eq(st_ring_snapshot(x, T0, NULL, 10), -EINVAL);
  ck_assert_int_eq(st_ring_sent(x, T0), -EINVAL);
  ck_assert_int_eq(st_ring_message(x, T0, NULL, 5), -EINVAL);
  ck_assert_int_eq(st_ring_abort(x, T0, ST_RING_OK), -EINVAL);
  ck_assert_int_eq(st_ring_abort(x, T0, ST_RING_RESULT_COUNT), -EINVAL);
  ck_assert_int_eq(st_ring_snapshot(x, T0, v, 10), 0);
  ck_assert_int_eq(st_ring_snapshot(x, T0, v, 10), -EINVAL); /* twice */
  ck_assert_ptr_null(st_ring_snapshot_buffer(x));
  ck_assert(!st_ring_finished(x));
  ck_assert_int_eq(st_ring_abort(x, T0, ST_RING_FAIL_ABORTED), 0);
  acts_t a = {0};
  take(x, &a);
  ck_assert(a.done && a.result == ST_RING_FAIL_ABORTED && a.sends == 0);
  st_ring_free(x);

  ck_assert_int_eq(st_ring_message(NULL, T0, NULL, 0), -EINVAL);
  ck_assert_int_eq(st_ring_sent(NULL, T0), -EINVAL);
  ck_assert_int_eq(st_ring_tick(NULL, T0), -EINVAL);
  ck_assert_int_eq(st_ring_snapshot(NULL, T0, v, 10), -EINVAL);
  ck_assert_ptr_null(st_ring_snapshot_buffer(NULL));
  ck_assert(st_ring_finished(NULL));
  st_ring_free(NULL);
  for (int r = 0; r < ST_RING_RESULT_COUNT; r++)
    ck_assert_str_ne(st_ring_result_name((st_ring_result_t) r), "unknown");
  ck_assert_str_eq(st_ring_result_name(ST_RING_RESULT_COUNT), "unknown");
}
END_TEST

/* A coded segment that does not decode (q = -128 in its last byte) fails
 * the round at the member that got it. During the reduce-scatter (the 6
 * first of member 1's segments: 3 members, 3 segments a chunk) nobody can
 * have finished, so nobody applies. */
static hook_rc_t bad_code_hook(void* ctx, uint32_t from, int index,
                               uint8_t* data, size_t* len) {
  const int* at = ctx;
  if (from == 1 && index == *at)
    data[*len - 1] = 0x80;
  return H_DELIVER;
}

START_TEST(test_coded_refused) {
  st_ring_config_t cfg;
  st_ring_config_default(&cfg);
  cfg.segment_floats = 10;
  cfg.codec = &ring_test_codec;
  for (int at = 0; at < 6; at++) {
    snprintf(label, sizeof label, "coded: segment %d does not decode", at);
    ring_t r;
    ring_init(&r, 3, 90, &cfg);
    r.hook = bad_code_hook;
    r.hook_ctx = &at;
    ring_run(&r);
    check_failed(&r, 2, ST_RING_FAIL_PROTOCOL);
    ring_free(&r);
  }
  /* A NaN cannot be encoded: its member fails the round, nobody applies. */
  snprintf(label, sizeof label, "coded: a NaN");
  ring_t r;
  ring_init(&r, 4, 400, &cfg);
  r.m[1].input[7] = NAN;
  ring_run(&r);
  check_failed(&r, -1, ST_RING_OK);
  ring_free(&r);
}
END_TEST

static Suite* ring_suite(void) {
  Suite* s = suite_create("gossip_ring");
  TCase* tc = tcase_create("sum");
  tcase_add_checked_fixture(tc, setup, NULL);
  tcase_add_loop_test(tc, test_sum, 0, N_SUM_GROUPS);
  tcase_add_test(tc, test_late_snapshot);
  tcase_add_test(tc, test_pipelined);
  tcase_add_test(tc, test_allgather_before_snapshot);
  tcase_add_test(tc, test_trivial);
  tcase_add_test(tc, test_coded);
  tcase_add_loop_test(tc, test_segment_choice, 0,
                      (int) (sizeof seg_cases / sizeof seg_cases[0]));
  tcase_set_timeout(tc, 60);
  suite_add_tcase(s, tc);
  TCase* tf = tcase_create("failures");
  tcase_add_checked_fixture(tf, setup, NULL);
  tcase_add_test(tf, test_abort_mid_round);
  tcase_add_loop_test(tf, test_corrupt, 0, C_COUNT);
  tcase_add_test(tf, test_extra_segment);
  tcase_add_test(tf, test_timeout);
  tcase_add_test(tf, test_nonfinite);
  tcase_add_test(tf, test_delta_overflow);
  tcase_add_test(tf, test_misuse);
  tcase_add_test(tf, test_coded_refused);
  suite_add_tcase(s, tf);
  return s;
}

int main(void) {
  tu_seed(); /* print the seed once, before the forks */
  SRunner* sr = srunner_create(ring_suite());
  srunner_run_all(sr, CK_ENV);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
