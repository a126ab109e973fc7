/* test_daemon_robust.c: the Check suite for the pure parts of robust
 * averaging in the daemon (node/daemon/daemon_robust.c): the bound on the
 * step a joiner believes, the factor a ring round's result is applied
 * with, and when suspicion holds (a minority of suspects). (The clip bound is
 * gossip/exchange.c's st_xchg_clip_bound, tested in test_gossip_exchange.c; the
 * rest runs on real processes in tests/integration/test_node_robust.sh.) */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "node/daemon/daemon_internal.h"

START_TEST(test_step_bound) {
  /* Nothing to compare with: anything goes. */
  ck_assert(st__robust_step_bound_of(NULL, 0) == UINT64_MAX);
  uint64_t one[] = {1000};
  ck_assert_uint_eq(st__robust_step_bound_of(one, 1), 4 * 1000 + 100000);
  /* The lower median: one liar among two, or two among four, cannot lift
   * it; the order does not matter. */
  uint64_t two[] = {UINT64_MAX, 5000};
  ck_assert_uint_eq(st__robust_step_bound_of(two, 2), 4 * 5000 + 100000);
  uint64_t four[] = {1u << 30, 7000, UINT64_MAX, 6000};
  ck_assert_uint_eq(st__robust_step_bound_of(four, 4), 4 * 7000 + 100000);
  /* A majority of liars owns the median; the bound saturates. */
  uint64_t three[] = {UINT64_MAX, 10, UINT64_MAX};
  ck_assert(st__robust_step_bound_of(three, 3) == UINT64_MAX);
  /* Honest spread (a node twice as fast) is well within. */
  uint64_t honest[] = {2000000, 1000000, 1500000};
  ck_assert_uint_ge(st__robust_step_bound_of(honest, 3), 2000000);
}
END_TEST

/* A ring round's move: whole while there is no bound (no history, or
 * --clip 0), scaled to the gossip bound when longer, and not applied at
 * all when not finite (counted). */
START_TEST(test_ring_scale) {
  st_daemon_config_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.clip_mult = 3;
  st__daemon_t* d = calloc(1, sizeof(*d));
  ck_assert_ptr_nonnull(d);
  d->cfg = &cfg;
  float v[4] = {3, 4, 0, 0}; /* norm 5 */
  ck_assert(st__robust_ring_scale(d, v, 4) == 1.0f);
  for (int i = 0; i < ST_XCHG_CLIP_WARMUP; i++)
    d->clip_norms[i] = 0.5; /* bound 1.5 */
  d->clip_n = ST_XCHG_CLIP_WARMUP;
  ck_assert_float_eq_tol(st__robust_ring_scale(d, v, 4), 0.3f, 1e-6f);
  ck_assert_uint_eq(d->c.ring_clipped, 1);
  float small[2] = {1, 0};
  ck_assert(st__robust_ring_scale(d, small, 2) == 1.0f);
  v[2] = NAN;
  ck_assert(st__robust_ring_scale(d, v, 4) == 0.0f);
  v[2] = INFINITY;
  ck_assert(st__robust_ring_scale(d, v, 4) == 0.0f);
  ck_assert_uint_eq(d->c.ring_nonfinite, 2);
  cfg.clip_mult = 0; /* --clip 0: no bound, but NaN is still refused */
  ck_assert(st__robust_ring_scale(d, v, 4) == 0.0f);
  v[2] = 0;
  ck_assert(st__robust_ring_scale(d, v, 4) == 1.0f);
  free(d);
}
END_TEST

/* Suspicion acts only against a minority: suspects must be fewer than the
 * members trusted, this node included. */
START_TEST(test_minority) {
  ck_assert(st__robust_minority(0, 0));
  ck_assert(!st__robust_minority(1, 1)); /* a pair: the only peer */
  ck_assert(st__robust_minority(2, 1));  /* one of three */
  ck_assert(!st__robust_minority(2, 2)); /* this node is the far one */
  ck_assert(st__robust_minority(3, 1));
  ck_assert(!st__robust_minority(3, 2)); /* two of four: a tie */
  ck_assert(st__robust_minority(4, 2));  /* two of five */
  ck_assert(!st__robust_minority(4, 3));
  ck_assert(st__robust_minority(99, 49));
  ck_assert(!st__robust_minority(99, 50));
}
END_TEST

static Suite* robust_suite(void) {
  Suite* s = suite_create("daemon_robust");
  TCase* tc = tcase_create("step_bound");
  tcase_add_test(tc, test_step_bound);
  tcase_add_test(tc, test_ring_scale);
  tcase_add_test(tc, test_minority);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(robust_suite());
  srunner_run_all(sr, CK_ENV);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
