/* daemon_robust.c: robust averaging (docs/operations.md, "Robust
 * averaging"; docs/security.md): how far a peer's model may move this
 * node's, in gossip exchanges and in ring rounds.
 *
 * Gossip: an exchange's delta is clipped (gossip/exchange.c) at --clip
 * times the median pull of this node's last ST_XCHG_CLIP_HISTORY exchanges
 * (st_xchg_clip_bound), tightened for a peer in proportion to its
 * suspicion: a moving average of "its pull was beyond the untightened
 * bound". A member that keeps pulling far (one serving a poisoned or
 * scaled model) is clipped to almost nothing within a few exchanges; an
 * honest one whose pull was long once is barely touched, and its suspicion
 * decays as its pulls come back within the bound. Until the history holds
 * ST_XCHG_CLIP_WARMUP pulls, the bound is a tenth of this node's own norm
 * (+1); after, never less than a hundredth of it.
 *
 * Rings: a member this node suspects (suspicion at or above
 * SUSPECT_LEVEL) is not proposed, and a proposal that holds one is
 * refused (gossip/ring_form.c, cfg.trusts); and a round's result moves the
 * parameters by at most the gossip bound (untightened: a ring's sum has no
 * single author), so that a member this node does not suspect yet cannot
 * move it arbitrarily either. A node takes part in rings only once its
 * gossip history has RING_WARMUP pulls (with gossip off, rings run
 * unclipped).
 *
 * Suspicion acts only against a minority: while the members this node
 * suspects are not fewer than the ones it trusts (itself included), it
 * cannot tell the liars from itself, and it sets suspicion aside (pulls
 * clipped at the untightened bound and recorded, rings open to all).
 * Without that, two honest nodes that drift apart faster than their
 * exchanges' history expected (or a node back from a partition, far from
 * everyone) suspect each other for good: a suspect's pulls never enter
 * the history, so the bound never catches up, and a ring without the only
 * peer is no ring. Robust averaging assumes an honest majority, as every
 * robust aggregation rule does.
 *
 * Joining: a donor's step is believed only within st__robust_step_bound of
 * the steps the other members report (a donor claiming step 2^64-1 would
 * otherwise leave the joiner with no steps to train), and a member
 * reporting a step beyond it is not asked.
 */
#include "node/daemon/daemon_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SUSPICION_RATE 0.125f
#define SUSPECT_LEVEL 0.5f
#define MIN_TRUST 0.01
#define WARMUP_REL 0.1
#define FLOOR_REL 0.01
#define RING_WARMUP 2u
#define STEP_MULT 4u
#define STEP_SLACK 100000u

st_xchg_config_t st__robust_xchg_config(st__conn_t* c) {
  st__daemon_t* d = c->d;
  st_xchg_config_t cfg = d->xcfg;
  if (!(d->cfg->clip_mult > 0))
    return cfg;
  double bound =
      st_xchg_clip_bound(d->clip_norms, d->clip_n, d->cfg->clip_mult);
  const st__heard_t* h = st__net_heard_find(d, &c->peer);
  double trust =
      h != NULL && !d->suspicion_aside ? 1.0 - (double) h->suspicion : 1.0;
  cfg.clip_norm = bound;
  cfg.clip_rel = bound > 0 ? FLOOR_REL : WARMUP_REL;
  cfg.clip_scale = trust > MIN_TRUST ? trust : MIN_TRUST;
  d->clip_last = bound;
  return cfg;
}

bool st__robust_minority(size_t others, size_t suspects) {
  return suspects < others - suspects + 1;
}

/* Counts the live members this node averages with (its model, its state
 * synchronized, as gossip picks them) and those of them it suspects, and
 * decides whether their suspicion holds (logged when that changes). An
 * observer, a joiner or a member of another model does not count: it
 * never averages with this node. */
void st__robust_refresh(st__daemon_t* d) {
  size_t n = st_membership_count(d->m), others = 0, suspects = 0;
  for (size_t i = 0; i < n; i++) {
    const st_member_t* mb = st_membership_at(d->m, i);
    if (mb == NULL ||
        (mb->state != ST_MEMBER_ALIVE && mb->state != ST_MEMBER_SUSPECT) ||
        memcmp(&mb->id, &d->ident.id, sizeof(mb->id)) == 0 || !mb->has_status ||
        !mb->status.synced ||
        memcmp(mb->status.fingerprint, d->local.fingerprint,
               sizeof(d->local.fingerprint)) != 0)
      continue;
    others++;
    const st__heard_t* h = st__net_heard_find(d, &mb->id);
    suspects += h != NULL && h->suspicion >= SUSPECT_LEVEL;
  }
  bool aside = !st__robust_minority(others, suspects);
  if (aside != d->suspicion_aside) {
    if (aside)
      st__dwarn(d,
                "suspects %zu of its %zu live peers: not a minority, so it "
                "cannot tell them from itself; their suspicion is set aside "
                "(pulls still clipped at the bound)",
                suspects, others);
    else
      st__dlog(d, "suspects %zu of its %zu live peers: suspicion acts again",
               suspects, others);
  }
  d->suspects = (uint32_t) suspects;
  d->suspicion_aside = aside;
}

void st__robust_record(st__conn_t* c, const st_xact_t* done) {
  st__daemon_t* d = c->d;
  double base = done->clip_base, pull = done->delta_norm;
  st__heard_t* h = st__net_heard_slot(d, &c->peer);
  /* The history is of the pulls of members not suspected, a pull beyond
   * the bound counting as the bound: a suspect's pulls would otherwise
   * hold the median at the bound, and a bound of --clip times itself
   * grows without end (one member among three averages often enough
   * for that); clipped pulls counted as what was applied (near 0 for a
   * suspect) would drag it to nothing instead. The floor of the bound (a
   * hundredth of our own norm) keeps it from shrinking to nothing as the
   * models agree, which would make every member a suspect. While
   * suspicion is set aside, every pull counts (capped at the bound): the
   * bound then follows the pulls up, by at most --clip times in half a
   * history. */
  if (h == NULL || d->suspicion_aside || h->suspicion < SUSPECT_LEVEL) {
    d->clip_norms[d->clip_at] = base > 0 && pull > base ? base : pull;
    d->clip_at = (d->clip_at + 1) % ST_XCHG_CLIP_HISTORY;
    if (d->clip_n < ST_XCHG_CLIP_HISTORY)
      d->clip_n++;
  }
  if (h != NULL) {
    h->averaged++;
    float beyond = base > 0 && pull > base;
    h->suspicion += SUSPICION_RATE * (beyond - h->suspicion);
  }
  st__robust_refresh(d);
  if (!done->clipped)
    return;
  d->c.clipped++;
  uint32_t n = h != NULL ? ++h->clipped : 1;
  if (n % 10 == 1) {
    char id[33];
    st_node_id_format(&c->peer, id);
    st__dwarn(d,
              "clipped the pull of %.12s (norm %.3g, bound %.3g, suspicion "
              "%.2f): %u of its %u averagings so far",
              id, done->delta_norm, done->clip_norm,
              h != NULL ? h->suspicion : 1.0, n, h != NULL ? h->averaged : 1);
  }
}

bool st__robust_trusts(const st__daemon_t* d, const st_node_id_t* id) {
  /* Rings wait for the gossip history: a round's move is clipped at the
   * gossip bound, and before there is one a poisoned member could move
   * the whole cluster in one round. Without gossip there is no bound:
   * rings run unclipped. */
  if (d->cfg->clip_mult > 0 && d->cfg->gossip_every_s > 0 &&
      d->clip_n < RING_WARMUP)
    return false;
  const st__heard_t* h = st__net_heard_find(d, id);
  return h == NULL || d->suspicion_aside || h->suspicion < SUSPECT_LEVEL;
}

/* The gossip bound from as few as RING_WARMUP pulls (the known ones
 * repeated to the ST_XCHG_CLIP_WARMUP that st_xchg_clip_bound wants: their
 * median), so that rings need not wait for the full history. The pulls
 * themselves were clipped at a tenth of the node's norm until then. */
static double ring_bound(const st__daemon_t* d) {
  if (d->clip_n >= ST_XCHG_CLIP_WARMUP || d->clip_n < RING_WARMUP)
    return st_xchg_clip_bound(d->clip_norms, d->clip_n, d->cfg->clip_mult);
  double padded[ST_XCHG_CLIP_WARMUP];
  for (size_t i = 0; i < ST_XCHG_CLIP_WARMUP; i++)
    padded[i] = d->clip_norms[i % d->clip_n];
  return st_xchg_clip_bound(padded, ST_XCHG_CLIP_WARMUP, d->cfg->clip_mult);
}

float st__robust_ring_scale(st__daemon_t* d, const float* delta, size_t n) {
  double sq = 0;
  for (size_t i = 0; i < n; i++)
    sq += (double) delta[i] * delta[i];
  double norm = sqrt(sq);
  if (!isfinite(norm)) { /* a member's NaN or Inf, or an overflow */
    d->c.ring_nonfinite++;
    st__dwarn(d, "dropped a ring round's result: it is not finite");
    return 0.0f;
  }
  double bound = ring_bound(d);
  if (!(bound > 0) || !(norm > bound))
    return 1.0f;
  d->c.ring_clipped++;
  st__dwarn(d, "clipped a ring round's move (norm %.3g, bound %.3g)", norm,
            bound);
  return (float) (bound / norm);
}

static int by_step(const void* a, const void* b) {
  uint64_t x = *(const uint64_t*) a, y = *(const uint64_t*) b;
  return (x > y) - (x < y);
}

uint64_t st__robust_step_bound_of(const uint64_t* steps, size_t n) {
  if (n == 0)
    return UINT64_MAX;
  uint64_t* v = malloc(n * sizeof(*v));
  if (v == NULL)
    return UINT64_MAX;
  memcpy(v, steps, n * sizeof(*v));
  qsort(v, n, sizeof(*v), by_step);
  uint64_t median = v[(n - 1) / 2]; /* the lower one: a liar cannot lift it */
  free(v);
  /* Four times the median and 100,000 steps: far past the spread of nodes
   * of different speeds, far short of a step that ends training. */
  if (median > (UINT64_MAX - STEP_SLACK) / STEP_MULT)
    return UINT64_MAX;
  return median * STEP_MULT + STEP_SLACK;
}

uint64_t st__robust_step_bound(const st__daemon_t* d,
                               const st_node_id_t* except) {
  size_t count = st_membership_count(d->m), n = 0;
  uint64_t* steps = malloc((count + 1) * sizeof(*steps));
  if (steps == NULL)
    return UINT64_MAX;
  for (size_t i = 0; i < count; i++) {
    const st_member_t* mb = st_membership_at(d->m, i);
    if (mb == NULL || mb->state != ST_MEMBER_ALIVE || !mb->has_status ||
        memcmp(&mb->id, &d->ident.id, sizeof(mb->id)) == 0 ||
        (except != NULL && memcmp(&mb->id, except, sizeof(mb->id)) == 0) ||
        mb->status.step == 0) /* a joiner, or a cluster that just began */
      continue;
    steps[n++] = mb->status.step;
  }
  uint64_t bound = st__robust_step_bound_of(steps, n);
  free(steps);
  return bound;
}
