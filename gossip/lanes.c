/* lanes.c: the lane striper (gossip.h, "Lane striping"): one ring stream
 * carried over L lanes, sans-IO. The bookkeeping both ring drivers share
 * (node/daemon/daemon_ring.c over libuv, tools/bench/bench_ring_member.c
 * over threads), so that which lane carries a segment, the order segments
 * reach the ring machine in, and when a lane's end is a failure are
 * decided in one place.
 *
 * Words as in gossip/ring.c: a *stream* is the sequence of segments one
 * member sends to the next; *lane* k of L carries its segments k, k + L,
 * k + 2L, ... in order (each lane is its own encrypted connection, and a
 * connection keeps order). So on lane k the next segment is always the
 * smallest index i >= fed with i = k (mod L): the lanes before it in
 * stream order have fed theirs, and a lane that holds one has paused, so
 * nothing later can come on it. That one index is all the receive side
 * needs to know per lane; the striper keeps three bit sets (joined, held,
 * ended) and two counters, and never a byte of a segment.
 */
#include <errno.h>
#include <stdint.h>

#include "gossip/gossip.h"

static const char* const verdict_names[ST_LANES_VERDICT_COUNT] = {
    [ST_LANES_FEED] = "feed",
    [ST_LANES_HOLD] = "hold",
    [ST_LANES_DONE] = "done",
    [ST_LANES_ERR_LANE] = "no such lane",
    [ST_LANES_ERR_COUNT] = "lane count disagrees",
    [ST_LANES_ERR_TWICE] = "lane joined twice",
    [ST_LANES_ERR_OVERRUN] = "segment on a paused lane",
    [ST_LANES_ERR_ENDED] = "segment after the lane's end",
    [ST_LANES_ERR_EXTRA] = "segment beyond the stream",
    [ST_LANES_ERR_EARLY_END] = "lane ended early",
};

const char* st_lanes_verdict_name(st_lanes_verdict_t v) {
  return (unsigned) v < ST_LANES_VERDICT_COUNT ? verdict_names[v] : "unknown";
}

static uint32_t bit(uint32_t lane) {
  return (uint32_t) 1 << lane;
}

int st_lanes_init(st_lanes_t* s, uint32_t send_lanes) {
  if (send_lanes == 0 || send_lanes > ST_RING_MAX_LANES)
    return -EINVAL;
  *s = (st_lanes_t){.send_lanes = send_lanes};
  return 0;
}

/* ---- Send side ----------------------------------------------------------- */

uint32_t st_lanes_send_lane(const st_lanes_t* s) {
  return (uint32_t) (s->sent % s->send_lanes);
}

void st_lanes_send_done(st_lanes_t* s) {
  s->sent++;
}

uint64_t st_lanes_sent_on(const st_lanes_t* s, uint32_t lane) {
  if (lane >= s->send_lanes || s->sent <= lane)
    return 0;
  return (s->sent - lane - 1) / s->send_lanes + 1;
}

/* ---- Receive side -------------------------------------------------------- */

void st_lanes_expect(st_lanes_t* s, uint64_t more) {
  s->expected =
      more > UINT64_MAX - s->expected ? UINT64_MAX : s->expected + more;
}

/* The index of the next segment lane `lane` carries: the smallest
 * i >= fed with i = lane (mod L). */
static uint64_t next_on(const st_lanes_t* s, uint32_t lane) {
  uint64_t l = s->recv_lanes;
  return s->fed + (lane + l - s->fed % l) % l;
}

st_lanes_verdict_t st_lanes_join(st_lanes_t* s, uint32_t lane, uint32_t lanes,
                                 bool holding) {
  if (lanes == 0 || lanes > ST_RING_MAX_LANES || lane >= lanes)
    return ST_LANES_ERR_LANE;
  if (s->recv_lanes != 0 && lanes != s->recv_lanes)
    return ST_LANES_ERR_COUNT;
  if (s->joined & bit(lane))
    return ST_LANES_ERR_TWICE;
  /* A lane's first segment is segment `lane` of the stream. */
  if (holding && lane >= s->expected)
    return ST_LANES_ERR_EXTRA;
  s->recv_lanes = lanes;
  s->joined |= bit(lane);
  if (holding)
    s->held |= bit(lane);
  return ST_LANES_FEED;
}

uint32_t st_lanes_recv_lane(const st_lanes_t* s) {
  return s->recv_lanes == 0 ? 0 : (uint32_t) (s->fed % s->recv_lanes);
}

st_lanes_verdict_t st_lanes_accept(st_lanes_t* s, uint32_t lane) {
  if (lane >= s->recv_lanes || !(s->joined & bit(lane)))
    return ST_LANES_ERR_LANE;
  if (s->ended & bit(lane))
    return ST_LANES_ERR_ENDED;
  if (s->held & bit(lane))
    return ST_LANES_ERR_OVERRUN;
  uint64_t i = next_on(s, lane);
  if (i >= s->expected)
    return ST_LANES_ERR_EXTRA;
  if (i != s->fed) {
    s->held |= bit(lane);
    return ST_LANES_HOLD;
  }
  s->fed++;
  return ST_LANES_FEED;
}

bool st_lanes_next_held(st_lanes_t* s, uint32_t* lane) {
  if (s->recv_lanes == 0 || s->fed >= s->expected)
    return false;
  uint32_t k = st_lanes_recv_lane(s);
  if (!(s->held & bit(k)))
    return false;
  s->held &= ~bit(k);
  s->fed++;
  *lane = k;
  return true;
}

st_lanes_verdict_t st_lanes_end(st_lanes_t* s, uint32_t lane) {
  if (lane >= s->recv_lanes || !(s->joined & bit(lane)))
    return ST_LANES_ERR_LANE;
  /* A kept segment not yet fed is next_on itself: still owed. */
  bool owed = next_on(s, lane) < s->expected;
  s->held &= ~bit(lane);
  s->ended |= bit(lane);
  return owed ? ST_LANES_ERR_EARLY_END : ST_LANES_DONE;
}
