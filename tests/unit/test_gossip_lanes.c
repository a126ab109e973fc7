/* test_gossip_lanes.c: the Check suite for the lane striper (gossip/lanes.c;
 * the contract in gossip.h, "Lane striping").
 *
 * A model transport carries a stream of n segments over L lanes, segment i
 * on lane i % L, each lane a FIFO; a model driver reads one segment at a
 * time from a lane an arrival policy picks among those not paused, asks
 * st_lanes_accept, feeds a FEED at once (then whatever st_lanes_next_held
 * gives), and keeps a HOLD, pausing that lane, as the daemon does. Table
 * over L = 1, 2, 3, 4 and n = 0, 1, L - 1, L, 2L + 1 (indivisible) and
 * 10007 (large), with lanes read in order, reversed (the highest lane
 * that can be read first) and interleaved (a seeded random lane); the
 * lanes also join in reverse, some holding their first segment from
 * before they joined. Checked: the ring machine sees 0 .. n - 1 in order,
 * no lane ever holds two, every lane then ends owing nothing, and the
 * send side puts segment i on lane i % L. Then each error with its reason:
 * no such lane, a count that disagrees, a lane twice, a segment on a
 * paused lane, after its lane's end, beyond the stream, a lane that ends
 * early (holding or not); and several rounds on the same lanes, as the
 * benchmark keeps them. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/gossip.h"
#include "tests/unit/testutil.h"

enum { ARRIVE_IN_ORDER, ARRIVE_REVERSED, ARRIVE_INTERLEAVED, ARRIVE_COUNT };
static const char* const arrive_names[] = {"in order", "reversed",
                                           "interleaved"};

typedef struct {
  uint32_t lanes;
  uint64_t n;
  int arrive;
} case_t;

#define N_LANES 4
#define N_SIZES 6
#define N_CASES (N_LANES * N_SIZES * ARRIVE_COUNT)

static case_t case_at(int i) {
  case_t c;
  c.lanes = (uint32_t) (i / (N_SIZES * ARRIVE_COUNT)) + 1;
  int size = (i / ARRIVE_COUNT) % N_SIZES;
  const uint64_t sizes[N_SIZES] = {
      0, 1, c.lanes - 1, c.lanes, 2 * c.lanes + 1, 10007};
  c.n = sizes[size];
  c.arrive = i % ARRIVE_COUNT;
  return c;
}

/* The model transport and driver. */
typedef struct {
  case_t c;
  st_lanes_t s;
  uint64_t next_on_wire[ST_RING_MAX_LANES]; /* lane k's next segment */
  bool paused[ST_RING_MAX_LANES];
  uint64_t kept[ST_RING_MAX_LANES]; /* the segment a paused lane keeps */
  uint64_t fed;                     /* what the ring machine has seen */
  st_rng_t rng;
} model_t;

static bool readable(const model_t* m, uint32_t k) {
  return !m->paused[k] && m->next_on_wire[k] < m->c.n;
}

/* The lane the arrival policy reads next; false when none can be read. */
static bool pick(model_t* m, uint32_t* lane) {
  uint32_t l = m->c.lanes, cand[ST_RING_MAX_LANES], nc = 0;
  for (uint32_t k = 0; k < l; k++)
    if (readable(m, k))
      cand[nc++] = k;
  if (nc == 0)
    return false;
  if (m->c.arrive == ARRIVE_IN_ORDER) {
    /* The lane of the smallest segment on the wire. */
    uint32_t best = cand[0];
    for (uint32_t i = 1; i < nc; i++)
      if (m->next_on_wire[cand[i]] < m->next_on_wire[best])
        best = cand[i];
    *lane = best;
  } else if (m->c.arrive == ARRIVE_REVERSED) {
    *lane = cand[nc - 1];
  } else {
    *lane = cand[st_rng_next(&m->rng) % nc];
  }
  return true;
}

static void feed(model_t* m, uint64_t seg) {
  ck_assert_msg(seg == m->fed, "L %u n %llu %s: fed %llu, expected %llu",
                m->c.lanes, (unsigned long long) m->c.n,
                arrive_names[m->c.arrive], (unsigned long long) seg,
                (unsigned long long) m->fed);
  m->fed++;
}

/* A FEED's follow-up: every kept segment whose turn has come. */
static void feed_held(model_t* m) {
  uint32_t k;
  while (st_lanes_next_held(&m->s, &k)) {
    ck_assert(m->paused[k]);
    m->paused[k] = false;
    feed(m, m->kept[k]);
  }
}

static void deliver(model_t* m, uint32_t k) {
  uint64_t seg = m->next_on_wire[k];
  m->next_on_wire[k] += m->c.lanes;
  st_lanes_verdict_t v = st_lanes_accept(&m->s, k);
  if (v == ST_LANES_FEED) {
    feed(m, seg);
    feed_held(m);
    return;
  }
  ck_assert_msg(v == ST_LANES_HOLD, "lane %u seg %llu: %s", k,
                (unsigned long long) seg, st_lanes_verdict_name(v));
  ck_assert(!m->paused[k]); /* a paused lane is never read */
  m->paused[k] = true;
  m->kept[k] = seg;
}

/* Joins the lanes in reverse; under the interleaved policy the odd lanes
 * got their first segment before they joined. */
static void join_all(model_t* m) {
  for (uint32_t j = m->c.lanes; j-- > 0;) {
    bool holding = m->c.arrive == ARRIVE_INTERLEAVED && (j & 1) &&
                   m->next_on_wire[j] < m->c.n;
    ck_assert_int_eq(st_lanes_join(&m->s, j, m->c.lanes, holding),
                     ST_LANES_FEED);
    if (holding) {
      m->paused[j] = true;
      m->kept[j] = m->next_on_wire[j];
      m->next_on_wire[j] += m->c.lanes;
    }
  }
  feed_held(m); /* as the daemon does once the round runs */
}

START_TEST(test_stream) {
  model_t m;
  memset(&m, 0, sizeof(m));
  m.c = case_at(_i);
  st_rng_seed(&m.rng, tu_seed() + (uint64_t) _i);
  for (uint32_t k = 0; k < m.c.lanes; k++)
    m.next_on_wire[k] = k;
  ck_assert_int_eq(st_lanes_init(&m.s, m.c.lanes), 0);
  st_lanes_expect(&m.s, m.c.n);
  join_all(&m);
  uint32_t k;
  while (pick(&m, &k))
    deliver(&m, k);
  ck_assert_uint_eq(m.fed, m.c.n);
  ck_assert_uint_eq(m.s.fed, m.c.n);
  ck_assert_uint_eq(m.s.held, 0);
  for (k = 0; k < m.c.lanes; k++) {
    ck_assert(!m.paused[k]);
    ck_assert_int_eq(st_lanes_end(&m.s, k), ST_LANES_DONE);
    ck_assert_int_eq(st_lanes_end(&m.s, k), ST_LANES_DONE); /* again */
    ck_assert_int_eq(st_lanes_accept(&m.s, k), ST_LANES_ERR_ENDED);
  }
  /* The send side of the same stream. */
  for (uint64_t i = 0; i < m.c.n; i++) {
    ck_assert_uint_eq(st_lanes_send_lane(&m.s), i % m.c.lanes);
    st_lanes_send_done(&m.s);
  }
  for (k = 0; k < m.c.lanes; k++)
    ck_assert_uint_eq(st_lanes_sent_on(&m.s, k),
                      m.c.n > k ? (m.c.n - k - 1) / m.c.lanes + 1 : 0);
}
END_TEST

/* A stream of n over l lanes, every lane joined, nothing held. */
static void fresh(st_lanes_t* s, uint32_t l, uint64_t n) {
  ck_assert_int_eq(st_lanes_init(s, l), 0);
  st_lanes_expect(s, n);
  for (uint32_t k = 0; k < l; k++)
    ck_assert_int_eq(st_lanes_join(s, k, l, false), ST_LANES_FEED);
}

START_TEST(test_join_errors) {
  st_lanes_t s;
  ck_assert_int_eq(st_lanes_init(&s, 0), -EINVAL);
  ck_assert_int_eq(st_lanes_init(&s, ST_RING_MAX_LANES + 1), -EINVAL);
  ck_assert_int_eq(st_lanes_init(&s, ST_RING_MAX_LANES), 0);
  st_lanes_expect(&s, 3);
  ck_assert_int_eq(st_lanes_join(&s, 2, 2, false), ST_LANES_ERR_LANE);
  ck_assert_int_eq(st_lanes_join(&s, 0, 0, false), ST_LANES_ERR_LANE);
  ck_assert_int_eq(st_lanes_join(&s, 0, ST_RING_MAX_LANES + 1, false),
                   ST_LANES_ERR_LANE);
  ck_assert_uint_eq(s.recv_lanes, 0); /* refused joins change nothing */
  ck_assert_uint_eq(st_lanes_recv_lane(&s), 0);
  ck_assert_int_eq(st_lanes_accept(&s, 0), ST_LANES_ERR_LANE);
  ck_assert_int_eq(st_lanes_join(&s, 1, 4, false), ST_LANES_FEED);
  ck_assert_int_eq(st_lanes_join(&s, 0, 3, false), ST_LANES_ERR_COUNT);
  ck_assert_int_eq(st_lanes_join(&s, 1, 4, false), ST_LANES_ERR_TWICE);
  /* Lane 3's first segment is segment 3: the stream has 0 .. 2. */
  ck_assert_int_eq(st_lanes_join(&s, 3, 4, true), ST_LANES_ERR_EXTRA);
  ck_assert_uint_eq(s.joined, 1u << 1);
  /* Lane 0 never joined: nothing comes on it, nor ends. */
  ck_assert_int_eq(st_lanes_accept(&s, 0), ST_LANES_ERR_LANE);
  ck_assert_int_eq(st_lanes_accept(&s, 4), ST_LANES_ERR_LANE);
  ck_assert_int_eq(st_lanes_end(&s, 0), ST_LANES_ERR_LANE);
  ck_assert_int_eq(st_lanes_end(&s, 9), ST_LANES_ERR_LANE);
}
END_TEST

START_TEST(test_segment_errors) {
  st_lanes_t s;
  /* A second segment on a lane that keeps one: its reading had paused. */
  fresh(&s, 3, 10);
  ck_assert_int_eq(st_lanes_accept(&s, 2), ST_LANES_HOLD);
  ck_assert_int_eq(st_lanes_accept(&s, 2), ST_LANES_ERR_OVERRUN);
  ck_assert_uint_eq(s.fed, 0);
  /* Beyond the stream: 3 segments over 2 lanes, lane 1 has only seg 1. */
  fresh(&s, 2, 3);
  ck_assert_int_eq(st_lanes_accept(&s, 0), ST_LANES_FEED);
  ck_assert_int_eq(st_lanes_accept(&s, 1), ST_LANES_FEED);
  ck_assert_int_eq(st_lanes_accept(&s, 1), ST_LANES_ERR_EXTRA);
  ck_assert_int_eq(st_lanes_accept(&s, 0), ST_LANES_FEED);
  ck_assert_int_eq(st_lanes_accept(&s, 0), ST_LANES_ERR_EXTRA);
  ck_assert_uint_eq(s.fed, 3);
  /* An empty stream has nothing on any lane. */
  fresh(&s, 1, 0);
  ck_assert_int_eq(st_lanes_accept(&s, 0), ST_LANES_ERR_EXTRA);
  ck_assert_int_eq(st_lanes_end(&s, 0), ST_LANES_DONE);
  /* After its end. */
  fresh(&s, 2, 4);
  ck_assert_int_eq(st_lanes_end(&s, 1), ST_LANES_ERR_EARLY_END);
  ck_assert_int_eq(st_lanes_accept(&s, 1), ST_LANES_ERR_ENDED);
}
END_TEST

START_TEST(test_early_end) {
  st_lanes_t s;
  /* 5 segments over 2 lanes: lane 0 carries 0, 2, 4; lane 1 1, 3. */
  fresh(&s, 2, 5);
  ck_assert_int_eq(st_lanes_accept(&s, 0), ST_LANES_FEED); /* 0 */
  ck_assert_int_eq(st_lanes_accept(&s, 1), ST_LANES_FEED); /* 1 */
  ck_assert_int_eq(st_lanes_accept(&s, 1), ST_LANES_HOLD); /* 3, early */
  /* Lane 1 ends holding 3, not yet fed: it still owes it. */
  ck_assert_int_eq(st_lanes_end(&s, 1), ST_LANES_ERR_EARLY_END);
  ck_assert_uint_eq(s.held, 0); /* the kept one is the driver's to drop */
  uint32_t k;
  ck_assert_int_eq(st_lanes_accept(&s, 0), ST_LANES_FEED); /* 2 */
  ck_assert(!st_lanes_next_held(&s, &k));
  /* Lane 0 ends after 2: it owes 4. */
  ck_assert_int_eq(st_lanes_end(&s, 0), ST_LANES_ERR_EARLY_END);
  ck_assert_int_eq(st_lanes_end(&s, 0), ST_LANES_ERR_EARLY_END);

  /* A lane whose last segment is in may end before the others: the
   * previous member ends each lane after its own last frame. */
  fresh(&s, 3, 4); /* lane 0: 0, 3; lane 1: 1; lane 2: 2 */
  ck_assert_int_eq(st_lanes_accept(&s, 2), ST_LANES_HOLD); /* 2 */
  ck_assert_int_eq(st_lanes_accept(&s, 1), ST_LANES_HOLD); /* 1 */
  ck_assert_int_eq(st_lanes_end(&s, 2), ST_LANES_ERR_EARLY_END);
  fresh(&s, 3, 4);
  ck_assert_int_eq(st_lanes_accept(&s, 1), ST_LANES_HOLD); /* 1 */
  ck_assert_int_eq(st_lanes_accept(&s, 0), ST_LANES_FEED); /* 0 */
  ck_assert(st_lanes_next_held(&s, &k));
  ck_assert_uint_eq(k, 1);
  ck_assert(!st_lanes_next_held(&s, &k));
  ck_assert_int_eq(st_lanes_end(&s, 1), ST_LANES_DONE);
  ck_assert_int_eq(st_lanes_accept(&s, 2), ST_LANES_FEED); /* 2 */
  ck_assert_int_eq(st_lanes_end(&s, 2), ST_LANES_DONE);
  ck_assert_int_eq(st_lanes_end(&s, 0), ST_LANES_ERR_EARLY_END); /* 3 */
}
END_TEST

/* The benchmark keeps its lanes for every round: each round adds its
 * segments to the stream, and the lane of segment i stays i % L across
 * rounds. Round sizes 5, 0, 7 over 3 lanes. */
START_TEST(test_rounds) {
  st_lanes_t s;
  fresh(&s, 3, 0);
  const uint64_t rounds[] = {5, 0, 7};
  uint64_t total = 0;
  for (size_t r = 0; r < sizeof rounds / sizeof rounds[0]; r++) {
    st_lanes_expect(&s, rounds[r]);
    for (uint64_t i = 0; i < rounds[r]; i++, total++) {
      uint32_t k = st_lanes_recv_lane(&s);
      ck_assert_uint_eq(k, total % 3);
      ck_assert_int_eq(st_lanes_accept(&s, k), ST_LANES_FEED);
      ck_assert_uint_eq(st_lanes_send_lane(&s), total % 3);
      st_lanes_send_done(&s);
    }
    ck_assert_int_eq(st_lanes_accept(&s, st_lanes_recv_lane(&s)),
                     ST_LANES_ERR_EXTRA);
  }
  ck_assert_uint_eq(s.fed, 12);
  ck_assert_uint_eq(st_lanes_sent_on(&s, 0), 4);
  ck_assert_uint_eq(st_lanes_sent_on(&s, 2), 4);
  ck_assert_uint_eq(st_lanes_sent_on(&s, 3), 0);
  st_lanes_expect(&s, UINT64_MAX); /* saturates */
  ck_assert_uint_eq(s.expected, UINT64_MAX);
}
END_TEST

START_TEST(test_names) {
  for (int v = 0; v < ST_LANES_VERDICT_COUNT; v++)
    ck_assert_str_ne(st_lanes_verdict_name((st_lanes_verdict_t) v), "unknown");
  ck_assert_str_eq(st_lanes_verdict_name(ST_LANES_VERDICT_COUNT), "unknown");
  ck_assert_str_eq(st_lanes_verdict_name(ST_LANES_ERR_EARLY_END),
                   "lane ended early");
}
END_TEST

static Suite* lanes_suite(void) {
  Suite* s = suite_create("gossip_lanes");
  TCase* tc = tcase_create("stream");
  tcase_add_loop_test(tc, test_stream, 0, N_CASES);
  suite_add_tcase(s, tc);
  TCase* te = tcase_create("errors");
  tcase_add_test(te, test_join_errors);
  tcase_add_test(te, test_segment_errors);
  tcase_add_test(te, test_early_end);
  tcase_add_test(te, test_rounds);
  tcase_add_test(te, test_names);
  suite_add_tcase(s, te);
  return s;
}

int main(void) {
  tu_seed(); /* print the seed once, before the forks */
  SRunner* sr = srunner_create(lanes_suite());
  srunner_run_all(sr, CK_ENV);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
