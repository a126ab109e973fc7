/* daemon_outer.c: the outer optimizer of averaging (--outer nesterov;
 * issue #16), DiLoCo's step on the mean of a ring round, and its gossip
 * variant (--outer noloco: the same step on each gossip exchange's
 * pairwise mean, from each member's own anchor; ring rounds are then
 * plain averaging)
 * (optimizer.h, "The outer optimizer of averaging"; docs/compression.md,
 * "The outer optimizer").
 *
 * Between two ring rounds each member trains on its own (local SGD, and
 * gossip if it is on). A round gives every member the same mean, bit for
 * bit; plain averaging moves each member there. With --outer the members
 * move instead to anchor - lr (g + momentum m), g = anchor - mean, where
 * anchor is the vector the last round moved them to and m the momentum:
 * every member that took part in the same rounds holds the same anchor
 * and momentum, and so lands on the same vector. A member's first round
 * (a new or restarted node) takes the mean as its anchor with momentum 0;
 * a member whose anchor differs from the others' (it missed rounds, or
 * just joined) is pulled to theirs by each round, since its outer gradient
 * carries its difference: the difference shrinks by a constant factor a
 * round (eigenvalues of modulus 0.52 with DiLoCo's 0.7 and 0.9;
 * docs/compression.md).
 *
 * Only a node that trains takes the step: one that took no step since its
 * last round (its epochs done, or no program attached) applies the mean,
 * so that a model at rest is the members' mean, not an extrapolation of
 * the last moves by the momentum (which would go on moving it while
 * nobody trains).
 *
 * Costs: two more vectors of n_params floats (the anchor and the
 * momentum), allocated at the first round; one pass over four vectors on
 * the loop per round.
 */
#include "node/daemon/daemon_internal.h"

#include <stdlib.h>
#include <string.h>

static const char OUTER_DOMAIN[] = "starling-outer-v1";

bool st__outer_on(const st__daemon_t* d) {
  return d->cfg->outer.kind != ST_OUTER_NONE;
}

void st__outer_mark_model(const st__daemon_t* d) {
  if (!st__outer_on(d))
    return;
  char name[64];
  if (st_outer_name(&d->cfg->outer, name, sizeof name) != 0)
    return; /* validated when parsed */
  st__mark_setting(d, OUTER_DOMAIN, "outer", name);
}

void st__outer_free(st__daemon_t* d) {
  free(d->outer_anchor);
  free(d->outer_m);
  d->outer_anchor = NULL;
  d->outer_m = NULL;
  d->outer_n = 0;
}

/* The first round: the mean becomes the anchor, the momentum 0, and this
 * round is plain averaging. false when there is no memory for them. */
static bool outer_start(st__daemon_t* d, const float* mean, size_t n) {
  st__outer_free(d);
  d->outer_anchor = malloc(n * sizeof(float));
  d->outer_m = calloc(n, sizeof(float));
  if (d->outer_anchor == NULL || d->outer_m == NULL) {
    st__outer_free(d);
    st__dwarn(d,
              "no memory for the outer optimizer's state (2 x %zu floats); "
              "this ring round is plain averaging",
              n);
    return false;
  }
  memcpy(d->outer_anchor, mean, n * sizeof(float));
  d->outer_n = n;
  d->c.outer_starts++;
  return true;
}

void st__outer_ring_apply(st__daemon_t* d, float* delta, const float* mean,
                          size_t n) {
  d->ring_moved_to = mean;
  if (d->cfg->outer.kind != ST_OUTER_NESTEROV || delta == NULL ||
      mean == NULL || n == 0)
    return; /* noloco: a ring round is plain averaging */
  st__tt_stats_t st;
  st__tt_stats(d->tt, &st);
  bool trained = st.step != d->outer_step || d->outer_anchor == NULL;
  d->outer_step = st.step;
  if (!trained)
    return; /* at rest: the mean */
  if (d->outer_anchor == NULL || d->outer_n != n) {
    if (outer_start(d, mean, n))
      d->ring_moved_to = d->outer_anchor;
    return;
  }
  st_outer_step(&d->cfg->outer, d->outer_anchor, d->outer_m, mean, delta, n);
  d->ring_moved_to = d->outer_anchor;
  d->c.outer_steps++;
}

void st__outer_xchg_apply(st__daemon_t* d, float* delta, const float* own,
                          size_t n) {
  if (d->cfg->outer.kind != ST_OUTER_NOLOCO || delta == NULL || own == NULL ||
      n == 0)
    return;
  st__tt_stats_t st;
  st__tt_stats(d->tt, &st);
  bool trained = st.step != d->outer_step || d->outer_anchor == NULL;
  d->outer_step = st.step;
  if (!trained)
    return; /* at rest: the pairwise mean */
  if (d->outer_anchor == NULL || d->outer_n != n) {
    /* The first exchange: its mean, own + delta, is the anchor. */
    if (outer_start(d, own, n))
      for (size_t i = 0; i < n; i++)
        d->outer_anchor[i] += delta[i];
    return;
  }
  st_outer_step_own(&d->cfg->outer, d->outer_anchor, d->outer_m, own, delta, n);
  d->c.outer_steps++;
}

void st__outer_ring_skipped(st__daemon_t* d) {
  if (st__outer_on(d))
    d->c.outer_skipped++;
}
