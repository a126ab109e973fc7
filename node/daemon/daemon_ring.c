/* daemon_ring.c: the opportunistic ring all-reduce in the daemon: drives
 * the formation machine (gossip/ring_form.c) over sealed UDP packets and
 * the data plane (gossip/ring.c) over two encrypted TCP streams per round.
 *
 * Formation: every --ring-every seconds a node that is training (or done)
 * and sees itself as the smallest id among the live, ring-capable members
 * running its model that it does not suspect (daemon_robust.c) proposes a
 * round to those members; it refuses proposals that hold a suspect, and
 * applies a round's result with the robust bound. RING_* messages
 * arrive on the membership's UDP socket; daemon_net.c routes them here.
 *
 * Under --compress, a round whose members all hold one anchor is coded
 * (daemon_ring_coded.c): formation's tag is the anchor's id.
 *
 * Data plane: on START the node takes a snapshot into the ring machine's
 * buffer, dials the next member L times (--ring-lanes; checking on each
 * handshake that it is that node) and sends its segments there, segment i
 * of its send stream on lane i % L, each lane opening with RING_LANE
 * [round, lane, L]. So L threads of libuv's pool seal and L open at once,
 * where one secretstream keeps one core per direction. The previous
 * member dials it likewise; its segments are fed to the machine in stream
 * order: one that comes on a lane before its turn is kept and that lane's
 * reading pauses until it is fed. A lane from the previous member may come
 * before this node's own START (the proposer's CONFIRM is a UDP packet,
 * the streams are TCP): its first segment is kept likewise until START,
 * or until the connection's deadline closes it.
 *
 * End: a member that finishes closes its lanes to the next member (after
 * their last frames); the lanes from the previous member are that
 * member's to close. A failure closes all of them.
 *
 * Failure: the ring machine's stall timeout (no progress for a while) is
 * derived from the segment times measured in earlier rounds; a closed
 * stream or a member declared dead or gone aborts the round. Any abort
 * closes both streams, which ends the round at the neighbours, and so on
 * around the ring: nobody applies a partial result. A closed stream or a
 * stall feeds membership as a hint (st_membership_probe_hint): both
 * neighbours are probed next, and one is suspected only if it then fails
 * its probe; membership alone declares deaths.
 */
#include "node/daemon/daemon_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Tags of the trainer's mailbox: rings use the high bit, exchanges the
 * connection ids below it. */
#define RING_TAG_BIT ((uint64_t) 1 << 63)
/* The stall timeout: this many times the mean time a segment took in
 * earlier rounds, within these bounds (the first round uses the bound).
 * The floor is for busy small machines: with a 2 s floor, 3-member rounds
 * of a 2.7M-parameter model on 2 cores (tests/integration/test_node_ring.sh,
 * beside 3 trainers evaluating 10,000 test images every few seconds)
 * aborted again and again. (A member's trainer now also gives a snapshot
 * between the batches of an evaluation, node/daemon/trainer_thread.c.) A member
 * that dies closes its streams, which aborts the round at once whatever
 * the floor; only a frozen one waits it out. */
#define STALL_SEGMENTS 50.0
#define STALL_MIN_MS 10000.0
#define STALL_MAX_MS 30000.0

static bool in_round(const st__daemon_t* d, const st_node_id_t* id) {
  for (uint32_t i = 0; i < d->ring_n; i++)
    if (memcmp(&d->ring_members[i], id, sizeof(*id)) == 0)
      return true;
  return false;
}

/* The members a round of this node's would hold besides itself: live,
 * ring-capable, running its model, trusted (at most
 * ST_RING_FORM_MAX_MEMBERS - 1 into cand); *smaller when one of them has
 * a smaller id than this node's. Returns how many. */
static size_t ring_candidates(const st__daemon_t* d, st_node_id_t* cand,
                              bool* smaller) {
  size_t n = 0;
  size_t count = st_membership_count(d->m);
  *smaller = false;
  for (size_t i = 0; i < count; i++) {
    const st_member_t* mb = st_membership_at(d->m, i);
    if (mb == NULL || mb->state != ST_MEMBER_ALIVE || !mb->has_status ||
        !mb->status.ring_capable ||
        memcmp(mb->status.fingerprint, d->local.fingerprint, 16) != 0 ||
        memcmp(&mb->id, &d->ident.id, sizeof(mb->id)) == 0 ||
        !st__robust_trusts(d, &mb->id))
      continue;
    if (st_node_id_compare(&mb->id, &d->ident.id) < 0)
      *smaller = true;
    if (n < ST_RING_FORM_MAX_MEMBERS - 1)
      cand[n++] = mb->id;
  }
  return n;
}

/* A round that ended OK: the final one (d->ring_final_ok) when it started
 * after this node's epochs and held every member that could be in it now
 * (a member whose status said it could not take part when the round was
 * proposed may since have said it can). */
static void note_final_round(st__daemon_t* d) {
  st_node_id_t cand[ST_RING_FORM_MAX_MEMBERS];
  bool smaller = false;
  if (d->ring_round_after_done &&
      d->ring_n >= ring_candidates(d, cand, &smaller) + 1)
    d->ring_final_ok = true;
}

/* A round that failed: counted, said, and a hint for membership. */
static void ring_failed(st__daemon_t* d, st_ring_result_t r, double ms,
                        uint64_t now) {
  d->c.ring_aborted++;
  st__event(d, "ring",
            "ring round %016llx of %u members aborted after %.0f ms: %s",
            (unsigned long long) d->ring_round, d->ring_n, ms,
            st_ring_result_name(r));
  /* A failure is a hint, not a verdict: membership probes both
   * neighbours next and suspects one only if it fails its probe. */
  if (r == ST_RING_FAIL_CLOSED || r == ST_RING_FAIL_TIMEOUT) {
    for (int k = -1; k <= 1; k += 2) {
      uint32_t nb = (d->ring_rank + d->ring_n + (uint32_t) k) % d->ring_n;
      if (nb != d->ring_rank)
        st_membership_probe_hint(d->m, now, &d->ring_members[nb]);
    }
    st__net_drain(d);
  }
  st_ring_progress_t p;
  st_ring_progress(d->ring, &p);
  st__dwarn(d,
            "ring round %016llx of %u members aborted after %.0f ms: %s "
            "(rank %u; segments received %llu of %llu, acknowledged %llu "
            "of %llu; lanes %u out, %u in)",
            (unsigned long long) d->ring_round, d->ring_n, ms,
            st_ring_result_name(r), d->ring_rank,
            (unsigned long long) p.segments_received,
            (unsigned long long) p.segments_to_receive,
            (unsigned long long) p.segments_acked,
            (unsigned long long) p.segments_to_send, d->ring_stripe.send_lanes,
            d->ring_stripe.recv_lanes);
}

static void ring_end(st__daemon_t* d, st_ring_result_t r) {
  uint64_t now = st__dnow(d);
  double ms = (double) (now - d->ring_started_ms);
  if (r == ST_RING_OK) {
    d->c.ring_ok++;
    d->c.ring_coded += d->ring_anchor != NULL;
    note_final_round(d);
    /* The agreed state: where the round moved every member (the outer
     * optimizer's new anchor, or the mean). */
    const float* moved = d->ring_moved_to;
    st__agreed_ring_done(d, moved != NULL ? moved : st_ring_mean(d->ring),
                         (size_t) d->local.n_params, d->ring_round);
    st_ring_progress_t p;
    st_ring_progress(d->ring, &p);
    uint64_t segs = p.segments_to_send > 0 ? p.segments_to_send : 1;
    double per = ms / (double) segs;
    d->ring_segment_ms =
        d->ring_segment_ms > 0 ? 0.7 * d->ring_segment_ms + 0.3 * per : per;
    st__event(d, "ring", "ring round %016llx of %u members done in %.0f ms%s",
              (unsigned long long) d->ring_round, d->ring_n, ms,
              d->ring_anchor != NULL ? " (coded)" : "");
  } else {
    ring_failed(d, r, ms, now);
  }
  d->c.ring_last_ms = ms;
  st__hist_observe(&d->c.ring_s[r == ST_RING_OK ? 0 : 1], ms / 1e3);
  d->c.ring_last_round = d->ring_round;
  d->c.ring_last_ok = r == ST_RING_OK;
  d->c.ring_last_coded = d->ring_anchor != NULL;
  d->c.ring_last_n = d->ring_n;
  memcpy(d->ring_last_members, d->ring_members,
         d->ring_n * sizeof(st_node_id_t));
  for (uint32_t k = 0; k < ST_RING_MAX_LANES; k++) {
    st__conn_t* c = d->ring_next[k];
    d->ring_next[k] = NULL;
    if (c != NULL) {
      c->ring_round = 0;
      st__conn_close(c);
    }
  }
  /* The lanes from the previous member are its to close: it may still be
   * finishing (its last sends written, not yet acknowledged), and an end
   * of stream from here would abort it. A failure closes them, so that
   * the abort goes round the ring. */
  for (uint32_t k = 0; k < ST_RING_MAX_LANES; k++) {
    st__conn_t* c = d->ring_prev[k];
    d->ring_prev[k] = NULL;
    if (c != NULL) {
      c->ring_round = 0;
      if (r != ST_RING_OK)
        st__conn_close(c);
    }
  }
  d->ring_done = true;
}

/* Frees the round's machine once the trainer no longer borrows from it,
 * and only then tells formation the round is over: until its delta is
 * applied a member is not free, and formation refuses proposals for it
 * (a member that accepted and then could not start would cost the others
 * the round, at a connection deadline). */
static void ring_maybe_free(st__daemon_t* d) {
  if (d->ring != NULL && d->ring_done && d->ring_tt_pending == 0) {
    uint64_t round = d->ring_round;
    st_ring_free(d->ring);
    d->ring = NULL;
    st__ring_coded_release(d);
    d->ring_moved_to = NULL;
    d->ring_round = 0;
    d->ring_n = 0;
    st_ring_form_round_over(d->rf, st__dnow(d), round, d->c.ring_last_ok);
    st__ring_drain_form(d);
  }
}

/* A SEND: segment i of the send stream goes on lane i % L (the
 * striper's), at once when that lane is up and nothing of it waits. */
static void send_segment(st__daemon_t* d, const st_ract_t* a) {
  uint32_t lane = st_lanes_send_lane(&d->ring_stripe);
  st_lanes_send_done(&d->ring_stripe);
  st__conn_t* c = d->ring_next[lane];
  bool queued = false; /* an earlier SEND of this lane waits */
  for (uint32_t i = 0; i < d->ring_pending_n; i++)
    queued = queued || d->ring_pending[i].lane == lane;
  if (c != NULL && d->ring_next_ready[lane] && !queued) {
    if (st__conn_send(c, a->data, a->len, true) != 0)
      st_ring_abort(d->ring, st__dnow(d), ST_RING_FAIL_CLOSED);
  } else if (d->ring_pending_n < ST__RING_PENDING) {
    /* The lane to the next member is not up yet: keep the segment
     * (the machine holds at most in_flight back). */
    uint8_t* p = malloc(a->len);
    if (p == NULL) {
      st_ring_abort(d->ring, st__dnow(d), ST_RING_FAIL_ABORTED);
      return;
    }
    memcpy(p, a->data, a->len);
    d->ring_pending[d->ring_pending_n].data = p;
    d->ring_pending[d->ring_pending_n].len = a->len;
    d->ring_pending[d->ring_pending_n].lane = lane;
    d->ring_pending_n++;
  } else {
    st_ring_abort(d->ring, st__dnow(d), ST_RING_FAIL_ABORTED);
  }
}

static void drain_ring(st__daemon_t* d) {
  st_ract_t a;
  while (d->ring != NULL && !d->ring_done && st_ring_next_action(d->ring, &a)) {
    switch (a.kind) {
      case ST_RACT_SEND:
        send_segment(d, &a);
        break;
      case ST_RACT_WANT_SNAPSHOT: {
        float* buf = st_ring_snapshot_buffer(d->ring);
        if (buf == NULL || st__tt_request_snapshot(
                               d->tt, RING_TAG_BIT | d->ring_seq, buf) != 0) {
          st_ring_abort(d->ring, st__dnow(d), ST_RING_FAIL_ABORTED);
          break;
        }
        d->ring_tt_pending++;
        break;
      }
      case ST_RACT_APPLY: {
        /* Robust averaging's factor; 0: not finite, nothing applied. */
        float scale = st__robust_ring_scale(d, a.values, a.n);
        /* The outer optimizer rewrites the move in place (a.values is the
         * round's delta buffer); a clipped move is applied as it is. */
        if (scale == 1.0f)
          st__outer_ring_apply(d, st_ring_delta(d->ring), st_ring_mean(d->ring),
                               a.n);
        else if (scale > 0 && scale < 1.0f)
          st__outer_ring_skipped(d);
        if (scale > 0 && st__tt_request_apply(d->tt, RING_TAG_BIT | d->ring_seq,
                                              a.values, scale) == 0)
          d->ring_tt_pending++;
        break;
      }
      case ST_RACT_TIMER: {
        uint64_t now = st__dnow(d);
        uv_timer_start(&d->ring_timer, st__ring_timer_cb,
                       a.at_ms > now ? a.at_ms - now : 0, 0);
        break;
      }
      case ST_RACT_DONE:
        ring_end(d, a.result);
        break;
    }
  }
  ring_maybe_free(d);
}

/* Sends, in order, the SENDs kept for a lane that is now up. */
static void flush_pending(st__daemon_t* d, uint32_t lane) {
  uint32_t kept = 0;
  for (uint32_t i = 0; i < d->ring_pending_n; i++) {
    if (d->ring_pending[i].lane != lane) {
      d->ring_pending[kept++] = d->ring_pending[i];
      continue;
    }
    if (d->ring != NULL && !d->ring_done &&
        st__conn_send(d->ring_next[lane], d->ring_pending[i].data,
                      d->ring_pending[i].len, true) != 0)
      st_ring_abort(d->ring, st__dnow(d), ST_RING_FAIL_CLOSED);
    free(d->ring_pending[i].data);
  }
  d->ring_pending_n = kept;
}

void st__ring_timer_cb(uv_timer_t* t) {
  st__daemon_t* d = t->data;
  if (d->ring != NULL && !d->ring_done) {
    st_ring_tick(d->ring, st__dnow(d));
    drain_ring(d);
  }
}

static void form_timer_cb(uv_timer_t* t) {
  st__daemon_t* d = t->data;
  st__ring_coded_tag(d);
  st_ring_form_tick(d->rf, st__dnow(d));
  st__ring_drain_form(d);
}

/* Feeds the machine every kept segment whose turn has come, in stream
 * order (the striper says whose), and lets those lanes read on. A lane
 * holds in the striper exactly while its conn keeps ring_held. */
static void feed_held(st__daemon_t* d) {
  bool fed[ST_RING_MAX_LANES] = {false};
  uint32_t lane;
  while (d->ring != NULL && !d->ring_done &&
         st_lanes_next_held(&d->ring_stripe, &lane)) {
    st__conn_t* c = d->ring_prev[lane];
    if (c == NULL || c->ring_held == NULL)
      break;
    uint8_t* m = c->ring_held;
    size_t len = c->ring_held_len;
    c->ring_held = NULL;
    st_ring_message(d->ring, st__dnow(d), m, len);
    free(m);
    fed[lane] = true;
  }
  drain_ring(d);
  for (uint32_t k = 0; k < ST_RING_MAX_LANES; k++)
    if (fed[k] && d->ring_prev[k] != NULL && d->ring_prev[k]->ring_held == NULL)
      st__conn_resume(d->ring_prev[k]);
}

/* Takes a lane from the previous member (st_ring_form_lane said TAKE) into
 * the running round. */
static void attach_prev(st__daemon_t* d, st__conn_t* c) {
  /* A segment kept before the round ran is the lane's first. */
  st_lanes_verdict_t v = st_lanes_join(&d->ring_stripe, c->ring_lane,
                                       c->ring_lanes, c->ring_held != NULL);
  if (v != ST_LANES_FEED) {
    /* Lanes that disagree on their count, or a lane twice. */
    st__dwarn(d,
              "ring round %016llx: lane %u of %u from the previous member %s",
              (unsigned long long) d->ring_round, c->ring_lane, c->ring_lanes,
              v == ST_LANES_ERR_COUNT   ? "disagrees on the count"
              : v == ST_LANES_ERR_TWICE ? "came twice"
                                        : st_lanes_verdict_name(v));
    st__conn_close(c);
    st_ring_abort(d->ring, st__dnow(d), ST_RING_FAIL_PROTOCOL);
    drain_ring(d);
    return;
  }
  d->ring_prev[c->ring_lane] = c;
  c->ring_round = d->ring_round;
}

/* Applies formation's verdict (st_ring_form_lane) to every lane from
 * another node that is not yet part of a round: a refused one is closed,
 * so that its sender aborts now rather than at the connection deadline;
 * the running round's are taken; the rest (a round accepted, not yet
 * confirmed) wait for the next event. Runs after every formation event and
 * on every lane's first message. */
static void sort_lanes(st__daemon_t* d) {
  for (st__conn_t* c = d->conns; c != NULL; c = c->next) {
    if (c->initiator || st__conn_purpose(c) != ST__CONN_RING || c->closing ||
        c->ring_lanes == 0 || c->ring_round != 0)
      continue;
    /* A lane of the round this node last completed is its sender's to
     * close, after its last frames (ring_end); the sweep closes one left
     * open. Not a refusal. */
    if (d->c.ring_last_ok && c->ring_lane_round == d->c.ring_last_round)
      continue;
    st_ring_lane_verdict_t v =
        st_ring_form_lane(d->rf, c->ring_lane_round, &c->peer);
    if (v == ST_RING_LANE_WAIT)
      continue;
    /* TAKE while the machine is over (its delta not yet applied) or was
     * never made (it could not start): refused too. */
    if (v == ST_RING_LANE_TAKE && d->ring != NULL && !d->ring_done &&
        d->ring_round == c->ring_lane_round) {
      attach_prev(d, c);
      continue;
    }
    d->c.ring_lanes_refused++;
    st__conn_close(c);
  }
}

static uint32_t lanes_of(const st__daemon_t* d) {
  if (d->cfg->ring_lanes > 0)
    return d->cfg->ring_lanes;
  long cores = sysconf(_SC_NPROCESSORS_ONLN); /* a quarter of them */
  long l = cores / 4;
  return l < 1 ? 1 : l > 4 ? 4 : (uint32_t) l;
}

void st__ring_size_pool(st__daemon_t* d) {
  /* Each lane seals and opens on libuv's pool, one job a direction at a
   * time: 2 L jobs for a round, beside the exchanges'. The pool reads the
   * variable once, at its first job; this runs before any thread starts
   * (setenv is not thread-safe). An operator's own setting wins. */
  if (!st__ring_on(d) || getenv("UV_THREADPOOL_SIZE") != NULL)
    return;
  uint32_t want = 2 * lanes_of(d) + 2;
  char v[16];
  snprintf(v, sizeof(v), "%u", want > 4 ? want : 4);
  setenv("UV_THREADPOOL_SIZE", v, 0);
}

/* The round's machine, its stall timeout from earlier rounds' segment
 * times; -errno when it cannot be made. */
static int make_machine(st__daemon_t* d, const st_rfact_t* a, uint32_t lanes,
                        uint64_t now) {
  st_ring_config_t rc;
  st_ring_config_default(&rc);
  if (rc.in_flight < 2 * lanes)
    rc.in_flight = 2 * lanes; /* two segments a lane */
  double stall = d->ring_segment_ms > 0 ? STALL_SEGMENTS * d->ring_segment_ms
                                        : STALL_MAX_MS;
  rc.timeout_ms = (uint32_t) fmin(fmax(stall, STALL_MIN_MS), STALL_MAX_MS);
  int r = st__ring_coded_config(d, a->tag, &rc);
  if (r == 0)
    r = st_ring_new(&rc, a->round_id, a->n_members, a->my_rank,
                    d->local.n_params, now, &d->ring);
  if (r != 0)
    st__ring_coded_release(d);
  return r;
}

/* Dials the next member once per lane (each checked on its handshake to
 * be that node); the lanes open with RING_LANE in st__ring_on_ready. */
static void dial_next(st__daemon_t* d, const st_rfact_t* a, uint32_t lanes,
                      uint64_t now) {
  const st_node_id_t* next = &a->members[(a->my_rank + 1) % a->n_members];
  const st_member_t* mb = st_membership_find(d->m, next);
  for (uint32_t k = 0; k < lanes && d->ring != NULL; k++) {
    st__conn_t* c =
        mb == NULL ? NULL : st__conn_dial(d, &mb->addr, next, ST__CONN_RING);
    if (c == NULL) {
      st_ring_abort(d->ring, now,
                    mb == NULL ? ST_RING_FAIL_ABORTED : ST_RING_FAIL_CLOSED);
      break;
    }
    c->ring_round = a->round_id;
    c->ring_lane = k;
    c->ring_lanes = lanes;
    d->ring_next[k] = c;
  }
}

static void start_round(st__daemon_t* d, const st_rfact_t* a) {
  uint64_t now = st__dnow(d);
  if (d->ring != NULL) {
    /* The previous round's machine still lends its delta to the trainer:
     * refuse this one (the others see our streams never come up). */
    st_ring_form_round_over(d->rf, now, a->round_id, false);
    return;
  }
  uint32_t lanes = lanes_of(d);
  if (make_machine(d, a, lanes, now) != 0) {
    st_ring_form_round_over(d->rf, now, a->round_id, false);
    return;
  }
  d->ring_moved_to = NULL; /* set by this round's APPLY */
  d->ring_seq++;
  d->ring_round = a->round_id;
  d->ring_n = a->n_members;
  memcpy(d->ring_members, a->members, a->n_members * sizeof(st_node_id_t));
  d->ring_rank = a->my_rank;
  d->ring_started_ms = now;
  d->ring_round_after_done = d->state == ST__D_DONE;
  d->ring_done = false;
  /* lanes_of keeps within 1 .. ST_RING_MAX_LANES (daemon.h), so this
   * cannot fail; the receive stream is the machine's to say. */
  st_lanes_init(&d->ring_stripe, lanes);
  st_ring_progress_t p;
  st_ring_progress(d->ring, &p);
  st_lanes_expect(&d->ring_stripe, p.segments_to_receive);
  for (uint32_t k = 0; k < ST_RING_MAX_LANES; k++) {
    d->ring_next[k] = NULL;
    d->ring_next_ready[k] = false;
    d->ring_prev[k] = NULL;
  }
  if (a->n_members >= 2) {
    dial_next(d, a, lanes, now);
    sort_lanes(d); /* lanes of the previous member may already be here */
  }
  drain_ring(d);
  feed_held(d);
}

void st__ring_drain_form(st__daemon_t* d) {
  st_rfact_t a;
  while (d->rf != NULL && st_ring_form_next_action(d->rf, &a)) {
    switch (a.kind) {
      case ST_RFACT_SEND: {
        const st_member_t* mb = st_membership_find(d->m, &a.to);
        if (mb != NULL)
          st__net_send_to(d, &mb->addr, &a.to, a.data, a.len);
        break;
      }
      case ST_RFACT_START:
        start_round(d, &a);
        break;
      case ST_RFACT_TIMER: {
        uint64_t now = st__dnow(d);
        uv_timer_start(&d->form_timer, form_timer_cb,
                       a.at_ms > now ? a.at_ms - now : 0, 0);
        break;
      }
    }
  }
  sort_lanes(d);
}

void st__ring_on_packet(st__daemon_t* d, const st_node_id_t* from,
                        const uint8_t* data, size_t len) {
  if (d->rf == NULL)
    return;
  st__ring_coded_tag(d);
  st_ring_form_message(d->rf, st__dnow(d), from, data, len);
  st__ring_drain_form(d);
}

bool st__ring_on(const st__daemon_t* d) {
  return d->cfg->ring_every_s > 0 || d->cfg->local_steps > 0;
}

double st__ring_tick_every_s(const st__daemon_t* d) {
  double every = d->cfg->ring_every_s;
  if (d->cfg->local_steps > 0)
    return ST__RING_STEP_TICK_S;
  return st__compress_on(d) && every > ST__RING_ANCHOR_TICK_S
             ? ST__RING_ANCHOR_TICK_S
             : every;
}

/* Whether this node, the proposer, proposes at this tick: while training
 * with --local-steps H, once it has taken H steps since its last
 * proposal; at once when its epochs are done (the last steps averaged
 * without waiting); else every --ring-every, except that ticks faster
 * than that (--compress, --local-steps) propose at each tick until a
 * first proposal, and under --compress until a round gives an anchor. */
static bool ring_due(const st__daemon_t* d, uint64_t now) {
  if (d->cfg->local_steps > 0 && d->state == ST__D_TRAINING) {
    st__tt_stats_t st;
    st__tt_stats(d->tt, &st);
    return st.step >= d->ring_proposed_step + d->cfg->local_steps;
  }
  if (d->state == ST__D_DONE && !d->ring_final_ok &&
      d->ring_final_tries < ST__RING_FINAL_TRIES)
    return d->ring_proposed_ms == 0 ||
           now - d->ring_proposed_ms >= ST__RING_FINAL_RETRY_MS;
  if (d->cfg->ring_every_s <= 0)
    return false; /* --local-steps alone: none once the epochs are done */
  if (st__ring_tick_every_s(d) >= d->cfg->ring_every_s)
    return true; /* ticks at --ring-every */
  if (d->ring_proposed_ms == 0 || (st__compress_on(d) && d->anchor == NULL))
    return true;
  double since_ms = (double) (now - d->ring_proposed_ms);
  return d->cfg->ring_every_s > 0 &&
         since_ms >= d->cfg->ring_every_s * 1000.0 - 100.0;
}

/* Proposes a round when this node is the smallest live ring-capable id
 * of its view that runs its model, and one is due. */
void st__ring_tick(st__daemon_t* d) {
  if (d->rf == NULL || (d->state != ST__D_TRAINING && d->state != ST__D_DONE))
    return;
  if (st_ring_form_state(d->rf) != ST_RING_FORM_IDLE || d->ring != NULL)
    return;
  uint64_t now = st__dnow(d);
  if (!ring_due(d, now))
    return;
  st_node_id_t cand[ST_RING_FORM_MAX_MEMBERS];
  bool smaller = false;
  size_t n = ring_candidates(d, cand, &smaller);
  if (smaller || n == 0)
    return; /* a smaller member proposes */
  d->ring_proposed_ms = now;
  d->ring_final_tries += d->state == ST__D_DONE;
  st__tt_stats_t st;
  st__tt_stats(d->tt, &st);
  d->ring_proposed_step = st.step;
  st__ring_coded_tag(d);
  st_ring_form_propose(d->rf, now, cand, n);
  st__ring_drain_form(d);
}

/* ---- Connections --------------------------------------------------------- */

static int next_lane(const st__daemon_t* d, const st__conn_t* c) {
  for (uint32_t k = 0; k < ST_RING_MAX_LANES; k++)
    if (d->ring_next[k] == c)
      return (int) k;
  return -1;
}

static bool is_prev_lane(const st__daemon_t* d, const st__conn_t* c) {
  return c->ring_lanes > 0 && c->ring_lane < ST_RING_MAX_LANES &&
         d->ring_prev[c->ring_lane] == c;
}

void st__ring_on_ready(st__conn_t* c) {
  st__daemon_t* d = c->d;
  int lane = next_lane(d, c);
  if (lane < 0)
    return;
  /* The lane's first message says which round, lane and count it is. */
  st_msg_t m;
  memset(&m, 0, sizeof(m));
  m.type = ST_MSG_RING_LANE;
  m.u.ring_lane.round_id = d->ring_round;
  m.u.ring_lane.lane = (uint32_t) lane;
  m.u.ring_lane.lanes = d->ring_stripe.send_lanes;
  uint8_t buf[64];
  size_t len = 0;
  if (st_wire_encode(&m, buf, sizeof(buf), &len) != 0 ||
      st__conn_send(c, buf, len, false) != 0) {
    if (d->ring != NULL && !d->ring_done)
      st_ring_abort(d->ring, st__dnow(d), ST_RING_FAIL_CLOSED);
    drain_ring(d);
    return;
  }
  d->ring_next_ready[lane] = true;
  flush_pending(d, (uint32_t) lane);
  drain_ring(d);
}

void st__ring_on_message(st__conn_t* c, const uint8_t* msg, size_t len) {
  st__daemon_t* d = c->d;
  if (c->initiator) {
    st__conn_close(c); /* nothing comes back on the lanes we send on */
    return;
  }
  if (c->ring_lanes == 0) {
    /* A lane's first message: RING_LANE, its round, index and count. */
    st_msg_t m;
    if (st_wire_decode(msg, len, &m, &d->wc) != 0 ||
        m.type != ST_MSG_RING_LANE) {
      st__conn_close(c);
      return;
    }
    c->ring_lane_round = m.u.ring_lane.round_id;
    c->ring_lane = m.u.ring_lane.lane;
    c->ring_lanes = m.u.ring_lane.lanes;
    sort_lanes(d);
    return;
  }
  if (c->ring_held != NULL) {
    st__conn_close(c); /* reading pauses while a segment is kept */
    return;
  }
  bool running = d->ring != NULL && !d->ring_done && is_prev_lane(d, c);
  st_lanes_verdict_t v =
      running ? st_lanes_accept(&d->ring_stripe, c->ring_lane) : ST_LANES_HOLD;
  if (v == ST_LANES_FEED) {
    /* Its turn: straight to the machine. */
    st_ring_message(d->ring, st__dnow(d), msg, len);
    feed_held(d);
    return;
  }
  if (v != ST_LANES_HOLD) {
    /* A segment the stream does not have (ST_LANES_ERR_EXTRA: the ring
     * machine would refuse it as well); the abort closes the lanes. */
    st_ring_abort(d->ring, st__dnow(d), ST_RING_FAIL_PROTOCOL);
    drain_ring(d);
    return;
  }
  /* Before its turn, or before this node starts the round: keep it. */
  c->ring_held = malloc(len);
  if (c->ring_held == NULL) {
    st__conn_close(c);
    return;
  }
  memcpy(c->ring_held, msg, len);
  c->ring_held_len = len;
  st__conn_pause(c);
}

void st__ring_on_sent(st__conn_t* c) {
  st__daemon_t* d = c->d;
  if (next_lane(d, c) >= 0 && d->ring != NULL && !d->ring_done) {
    st_ring_sent(d->ring, st__dnow(d));
    drain_ring(d);
  }
}

void st__ring_on_closed(st__conn_t* c) {
  st__daemon_t* d = c->d;
  int out = next_lane(d, c);
  bool in = is_prev_lane(d, c);
  if ((out >= 0 || in) && d->ring != NULL && !d->ring_done) {
    /* An end is a failure only while the lane still owes something: the
     * previous member closes its lanes after their last frames, possibly
     * before this member has had its own last SENDs acknowledged. */
    st_ring_progress_t p;
    st_ring_progress(d->ring, &p);
    bool owed;
    if (out >= 0) {
      owed = p.segments_acked < p.segments_to_send;
      d->ring_next[out] = NULL;
    } else {
      /* Whether the lane would carry another segment (a kept one, not
       * yet fed, counts). */
      owed =
          st_lanes_end(&d->ring_stripe, c->ring_lane) == ST_LANES_ERR_EARLY_END;
      d->ring_prev[c->ring_lane] = NULL;
    }
    if (owed) {
      st_ring_abort(d->ring, st__dnow(d), ST_RING_FAIL_CLOSED);
      drain_ring(d);
    }
  } else if (out >= 0) {
    d->ring_next[out] = NULL;
  } else if (in) {
    d->ring_prev[c->ring_lane] = NULL;
  }
  free(c->ring_held);
  c->ring_held = NULL;
}

void st__ring_on_member_gone(st__daemon_t* d, const st_node_id_t* id) {
  if (d->rf == NULL)
    return;
  st_ring_form_member_gone(d->rf, st__dnow(d), id);
  st__ring_drain_form(d);
  if (d->ring != NULL && !d->ring_done && in_round(d, id)) {
    st_ring_abort(d->ring, st__dnow(d), ST_RING_FAIL_ABORTED);
    drain_ring(d);
  }
}

bool st__ring_on_tt_event(st__daemon_t* d, const st__tt_event_t* ev) {
  if (!(ev->tag & RING_TAG_BIT))
    return false;
  if ((ev->tag & ~RING_TAG_BIT) != d->ring_seq || d->ring == NULL)
    return true; /* a stopped round's: its machine is already gone */
  d->ring_tt_pending--;
  if (ev->kind == ST__TT_EV_SNAPSHOT && !d->ring_done) {
    /* No snapshot (an attached program's parameters were not finite): the
     * round is aborted, since the buffer holds no parameters. */
    if (ev->ok)
      st_ring_snapshot(d->ring, st__dnow(d), st_ring_snapshot_buffer(d->ring),
                       d->local.n_params);
    else
      st_ring_abort(d->ring, st__dnow(d), ST_RING_FAIL_ABORTED);
    drain_ring(d);
  }
  ring_maybe_free(d);
  return true;
}

/* Robust averaging: a member this node suspects is in none of its rounds
 * (daemon_robust.c). */
static bool trusts(const st_node_id_t* id, void* ctx) {
  return st__robust_trusts(ctx, id);
}

int st__ring_start(st__daemon_t* d) {
  if (!st__ring_on(d)) {
    if (st__compress_on(d) && d->start_anchor != NULL)
      st__dlog(d,
               "--compress with --ring-every 0: exchanges code drifts "
               "from the start anchor (the seeded initialization) all run "
               "long, which grow as training goes (docs/compression.md)");
    else if (st__compress_on(d))
      st__dwarn(d,
                "--compress with --ring-every 0: compressed exchanges "
                "need an anchor, which an attached program's node takes "
                "only from a ring round, so averaging sends float32 "
                "(docs/compression.md)");
    return 0;
  }
  st_ring_form_config_t fc;
  st_ring_form_config_default(&fc);
  fc.trusts = trusts;
  fc.trusts_ctx = d;
  int rc = st_ring_form_new(&fc, &d->ident.id, &d->rng, &d->rf);
  if (rc != 0)
    return rc;
  uv_timer_init(&d->loop, &d->form_timer);
  d->form_timer.data = d;
  uv_timer_init(&d->loop, &d->ring_timer);
  d->ring_timer.data = d;
  return 0;
}

void st__ring_close(st__daemon_t* d) {
  if (d->rf == NULL)
    return;
  if (d->ring != NULL && !d->ring_done)
    st_ring_abort(d->ring, st__dnow(d), ST_RING_FAIL_ABORTED);
  for (uint32_t i = 0; i < d->ring_pending_n; i++)
    free(d->ring_pending[i].data);
  d->ring_pending_n = 0;
  if (!uv_is_closing((uv_handle_t*) &d->form_timer))
    uv_close((uv_handle_t*) &d->form_timer, NULL);
  if (!uv_is_closing((uv_handle_t*) &d->ring_timer))
    uv_close((uv_handle_t*) &d->ring_timer, NULL);
}

void st__ring_free(st__daemon_t* d) {
  if (d->ring != NULL)
    st_ring_free(d->ring);
  d->ring = NULL;
  st__ring_coded_release(d);
  if (d->rf != NULL)
    st_ring_form_free(d->rf);
  d->rf = NULL;
}
