/* membership_probe.c: failure detection for the membership machine:
 * round-robin probing over a list reshuffled each pass, indirect probes
 * through k members on a missed ack, the ping-reqs this member serves for
 * others (with Lifeguard's nacks), the local health score (awareness) and
 * the suspicion timers whose timeout shrinks with confirmations.
 *
 * Follows SWIM (Das, Gupta, Motivala, DSN 2002, sections 3 and 4.3:
 * round-robin probe target selection) and Lifeguard (Dadgar, Phillips,
 * Currey 2018, section 4: local health aware probe, local health aware
 * suspicion, buddy system) as memberlist's state.go, awareness.go and
 * suspicion.go run them. Every tunable is in membership_constants.h.
 *
 * A probe of target T started at time s:
 *   s             PING(seq) to T, piggybacked with updates; when T is
 *                 suspected the packet also carries the SUSPECT, so that T
 *                 learns of it at once and refutes (the buddy system)
 *   s + timeout'  no ack yet: PING_REQ(seq, T) to k random alive members,
 *                 which ping T themselves, forward T's ack, and send a
 *                 NACK at 80% of their own probe timeout if T is silent
 *   s + interval' no ack by now: suspect T, and raise awareness by the
 *                 nacks that did not come (or by 1 when none were asked)
 * where x' = x * (awareness + 1). An ack at any time before s + interval'
 * ends the probe well and lowers awareness by 1.
 *
 * Replies are bound to the request and the peer: an ACK of seq counts only
 * from T, or from one of the k members asked to probe T (a forwarded
 * ack), and a NACK only from those k; an ACK of a ping sent for someone
 * else's PING_REQ counts only from that ping's target. Any other sender
 * (a member guessing sequence numbers to keep a dead member alive) is
 * ignored and counted (acks_wrong_sender). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/membership_internal.h"

/* ==== Awareness (Lifeguard section 4.1) =====================================
 */

uint64_t st__scaled(const st_membership_t* m, uint64_t ms) {
  return ms * (m->awareness + 1);
}

void st__awareness(st_membership_t* m, int delta) {
  if (!m->cfg.lifeguard)
    return;
  int64_t v = (int64_t) m->awareness + delta;
  int64_t hi = (int64_t) m->cfg.awareness_max - 1;
  m->awareness = (uint32_t) (v < 0 ? 0 : v > hi ? hi : v);
}

/* ==== Probing ===============================================================
 */

static void susp_recompute_min(st_membership_t* m);

static void send_ping(st_membership_t* m, const st__mrec_t* r, uint32_t seq) {
  st_msg_t ping, sus;
  memset(&ping, 0, sizeof ping);
  ping.type = ST_MSG_PING;
  ping.u.ping.seq = seq;
  ping.u.ping.target = r->id;
  st_wire_addr_t to;
  st__rec_addr(r, &to);
  const st_msg_t* extra = NULL;
  if (r->state == ST_MEMBER_SUSPECT) {
    memset(&sus, 0, sizeof sus);
    sus.type = ST_MSG_SUSPECT;
    sus.u.suspect.node = r->id;
    sus.u.suspect.incarnation = r->incarnation;
    sus.u.suspect.from = m->self;
    extra = &sus;
  }
  (void) st__send_packet(m, &to, &r->id, &ping, extra);
}

/* The next member to probe: the table is the probe order, reshuffled with
 * Fisher-Yates at the end of each pass. Self and members down are
 * skipped. */
static st__mrec_t* next_target(st_membership_t* m) {
  bool reshuffled = false;
  for (;;) {
    if (m->probe_index >= m->n_mem) {
      if (reshuffled)
        return NULL;
      reshuffled = true;
      for (uint32_t i = m->n_mem; i > 1; i--) {
        uint32_t j = (uint32_t) st_rng_below(m->rng, i);
        st__mrec_t t = m->mem[i - 1];
        m->mem[i - 1] = m->mem[j];
        m->mem[j] = t;
      }
      st__table_rehash(m);
      m->probe_index = 0;
    }
    st__mrec_t* r = &m->mem[m->probe_index++];
    if (st__id_eq(&r->id, &m->self) || r->state == ST_MEMBER_DEAD ||
        r->state == ST_MEMBER_LEFT)
      continue;
    return r;
  }
}

static void start_probe(st_membership_t* m, uint64_t now) {
  m->next_probe_at = now + st__scaled(m, m->cfg.probe_interval_ms);
  if (m->leaving || m->n_alive < 2)
    return;
  st__mrec_t* r = next_target(m);
  if (!r)
    return;
  m->probing = true;
  m->probe_acked = false;
  m->probe_indirect = false;
  m->probe_target = r->id;
  m->probe_seq = ++m->seq;
  m->n_probe_via = 0;
  m->probe_timeout_at = now + st__scaled(m, m->cfg.probe_timeout_ms);
  m->probe_end_at = m->next_probe_at;
  m->nacks = m->nacks_expected = 0;
  send_ping(m, r, m->probe_seq);
}

static void send_indirect(st_membership_t* m, uint64_t now) {
  m->probe_indirect = true;
  const st__mrec_t* t = st__mem_get(m, &m->probe_target);
  if (!t)
    return;
  uint32_t picks[ST_MEMBERSHIP_MAX_INDIRECT_CHECKS];
  uint32_t n = st__random_members(m, m->cfg.indirect_checks, &m->probe_target,
                                  now, true, picks);
  st_msg_t req;
  memset(&req, 0, sizeof req);
  req.type = ST_MSG_PING_REQ;
  req.u.ping_req.seq = m->probe_seq;
  req.u.ping_req.target = t->id;
  st__rec_addr(t, &req.u.ping_req.target_addr);
  req.u.ping_req.want_nack = m->cfg.lifeguard;
  for (uint32_t i = 0; i < n; i++) {
    const st__mrec_t* via = &m->mem[picks[i]];
    st_wire_addr_t to;
    st__rec_addr(via, &to);
    m->probe_via[m->n_probe_via++] = via->id;
    (void) st__send_packet(m, &to, &via->id, &req, NULL);
  }
  m->nacks_expected = m->cfg.lifeguard ? n : 0;
}

static void end_probe(st_membership_t* m, uint64_t now) {
  m->probing = false;
  if (m->probe_acked)
    return;
  /* Lifeguard: a missing nack means our own link or process is slow;
   * with nobody asked to nack, the failed probe itself counts. */
  if (m->nacks_expected > 0) {
    if (m->nacks < m->nacks_expected)
      st__awareness(m, (int) (m->nacks_expected - m->nacks));
  } else {
    st__awareness(m, 1);
  }
  st__mrec_t* r = st__mem_get(m, &m->probe_target);
  if (!r || (r->state != ST_MEMBER_ALIVE && r->state != ST_MEMBER_SUSPECT))
    return;
  st_msg_suspect_t s;
  s.node = r->id;
  s.incarnation = r->incarnation;
  s.from = m->self;
  st__on_suspect(m, now, &s);
}

void st__probe_tick(st_membership_t* m, uint64_t now) {
  if (m->probing && !m->probe_acked && !m->probe_indirect &&
      now >= m->probe_timeout_at)
    send_indirect(m, now);
  if (m->probing && now >= m->probe_end_at)
    end_probe(m, now);
  if (now >= m->next_probe_at)
    start_probe(m, now);
}

/* A local stall (Lifeguard section 4.1 applied to the node's own
 * scheduling): the machine was woken `late_ms` after the deadline it had
 * asked for, by more than a probe interval, so this process (a GC pause, a
 * swapped or frozen VM), not its targets, is the slow one. Concluding now
 * would suspect a target whose ack sits unread in our receive queue, and
 * let suspicions expire before the refutations queued beside it are read.
 * Instead: raise awareness, give the running probe its timeout and period
 * again from now, and push every suspicion deadline back by the stall
 * (and at least one probe interval from now), so that the backlog is
 * processed before anything is concluded. Plain SWIM (Lifeguard off) has
 * no local health and concludes at once, as before. */
void st__stall(st_membership_t* m, uint64_t now, uint64_t late_ms) {
  if (!m->cfg.lifeguard)
    return;
  m->stats.stalls++;
  st__awareness(m, 1);
  uint64_t interval = st__scaled(m, m->cfg.probe_interval_ms);
  if (m->probing) {
    if (!m->probe_indirect)
      m->probe_timeout_at = now + st__scaled(m, m->cfg.probe_timeout_ms);
    m->probe_end_at = now + interval;
    m->next_probe_at = m->probe_end_at;
  } else if (m->next_probe_at < now) {
    m->next_probe_at = now + interval;
  }
  for (uint32_t i = 0; i < m->n_susp; i++) {
    st__susp_t* s = &m->susp[i];
    s->start_ms += late_ms;
    s->deadline_ms += late_ms;
    if (s->deadline_ms < now + m->cfg.probe_interval_ms)
      s->deadline_ms = now + m->cfg.probe_interval_ms;
  }
  susp_recompute_min(m);
}

/* Whether `from` is one of the members asked to probe the target. */
static bool asked_via(const st_membership_t* m, const st_node_id_t* from) {
  for (uint32_t i = 0; i < m->n_probe_via; i++)
    if (st__id_eq(&m->probe_via[i], from))
      return true;
  return false;
}

void st__on_ack(st_membership_t* m, uint64_t now, const st_node_id_t* from,
                uint32_t seq) {
  (void) now;
  if (m->probing && !m->probe_acked && seq == m->probe_seq) {
    if (!st__id_eq(from, &m->probe_target) && !asked_via(m, from)) {
      m->stats.acks_wrong_sender++;
      return;
    }
    m->probe_acked = true;
    m->probing = false;
    st__awareness(m, -1);
    return;
  }
  /* The ack of a ping we sent for someone else's ping-req: forward it. */
  for (uint32_t i = 0; i < ST_MEMBERSHIP_MAX_RELAYS; i++) {
    st__relay_t* r = &m->relays[i];
    if (r->used && r->our_seq == seq) {
      if (!st__id_eq(from, &r->target)) {
        m->stats.acks_wrong_sender++;
        return;
      }
      st_msg_t ack;
      memset(&ack, 0, sizeof ack);
      ack.type = ST_MSG_ACK;
      ack.u.ack.seq = r->req_seq;
      (void) st__send_packet(m, &r->req_addr, &r->req_id, &ack, NULL);
      r->used = false;
      m->n_relays--;
      return;
    }
  }
  m->stats.msgs_ignored++; /* late or unknown */
}

void st__on_nack(st_membership_t* m, uint64_t now, const st_node_id_t* from,
                 uint32_t seq) {
  (void) now;
  if (m->probing && m->probe_indirect && seq == m->probe_seq &&
      !asked_via(m, from))
    m->stats.acks_wrong_sender++;
  else if (m->probing && m->probe_indirect && seq == m->probe_seq &&
           m->nacks < m->nacks_expected)
    m->nacks++;
  else
    m->stats.msgs_ignored++;
}

/* ==== Serving pings and ping-reqs ===========================================
 */

void st__on_ping(st_membership_t* m, uint64_t now, const st_node_id_t* from,
                 const st_wire_addr_t* from_addr, const st_msg_ping_t* p) {
  (void) now;
  if (!st__id_eq(&p->target, &m->self)) {
    /* Meant for a previous owner of our address: not ours to answer. */
    m->stats.msgs_rejected++;
    return;
  }
  st_msg_t ack;
  memset(&ack, 0, sizeof ack);
  ack.type = ST_MSG_ACK;
  ack.u.ack.seq = p->seq;
  (void) st__send_packet(m, from_addr, from, &ack, NULL);
}

void st__on_ping_req(st_membership_t* m, uint64_t now, const st_node_id_t* from,
                     const st_wire_addr_t* from_addr,
                     const st_msg_ping_req_t* p) {
  if (st__id_eq(&p->target, &m->self) || st__id_eq(&p->target, from)) {
    m->stats.msgs_rejected++;
    return;
  }
  /* A free slot, or the one closest to expiry. */
  st__relay_t* slot = NULL;
  for (uint32_t i = 0; i < ST_MEMBERSHIP_MAX_RELAYS; i++) {
    st__relay_t* r = &m->relays[i];
    if (!r->used) {
      slot = r;
      break;
    }
    if (!slot || r->expire_ms < slot->expire_ms)
      slot = r;
  }
  if (!slot->used)
    m->n_relays++;
  /* The address to ping: ours for a member we know (so a ping-req cannot
   * aim our pings at arbitrary hosts), the requester's otherwise. */
  st_wire_addr_t to = p->target_addr;
  const st__mrec_t* t = st__mem_get(m, &p->target);
  if (t)
    st__rec_addr(t, &to);
  memset(slot, 0, sizeof *slot);
  slot->used = true;
  slot->want_nack = p->want_nack && m->cfg.lifeguard;
  slot->our_seq = ++m->seq;
  slot->req_seq = p->seq;
  slot->target = p->target;
  slot->req_id = *from;
  slot->req_addr = *from_addr;
  uint64_t timeout = m->cfg.probe_timeout_ms;
  slot->nack_at_ms = now + timeout * ST_MEMBERSHIP_NACK_PERCENT / 100;
  slot->expire_ms = now + timeout;
  st_msg_t ping;
  memset(&ping, 0, sizeof ping);
  ping.type = ST_MSG_PING;
  ping.u.ping.seq = slot->our_seq;
  ping.u.ping.target = p->target;
  (void) st__send_packet(m, &to, &p->target, &ping, NULL);
}

void st__relay_tick(st_membership_t* m, uint64_t now) {
  if (m->n_relays == 0)
    return;
  for (uint32_t i = 0; i < ST_MEMBERSHIP_MAX_RELAYS; i++) {
    st__relay_t* r = &m->relays[i];
    if (!r->used)
      continue;
    if (r->want_nack && !r->nack_sent && now >= r->nack_at_ms) {
      st_msg_t nack;
      memset(&nack, 0, sizeof nack);
      nack.type = ST_MSG_NACK;
      nack.u.nack.seq = r->req_seq;
      (void) st__send_packet(m, &r->req_addr, &r->req_id, &nack, NULL);
      r->nack_sent = true;
    }
    if (now >= r->expire_ms) {
      r->used = false;
      m->n_relays--;
    }
  }
}

/* ==== Suspicion (Lifeguard section 4.2) =====================================
 */

/* min = suspicion_mult * max(1, log10(max(1, n))) * probe_interval, in ms,
 * computed as memberlist's suspicionTimeout (the scale to 1/1000). */
uint64_t st__suspicion_min_ms(const st_membership_t* m, uint32_t n) {
  double scale = log10(n > 1 ? (double) n : 1.0);
  if (scale < 1.0)
    scale = 1.0;
  uint64_t milli = (uint64_t) (scale * 1000.0);
  return (uint64_t) m->cfg.suspicion_mult * milli * m->cfg.probe_interval_ms /
         1000;
}

static void susp_recompute_min(st_membership_t* m) {
  uint64_t t = UINT64_MAX;
  for (uint32_t i = 0; i < m->n_susp; i++)
    if (m->susp[i].deadline_ms < t)
      t = m->susp[i].deadline_ms;
  m->susp_min_at = t;
}

void st__susp_start(st_membership_t* m, uint64_t now, st__mrec_t* r,
                    const st_node_id_t* from) {
  if (r->susp != ST__NONE)
    return;
  if (m->n_susp == m->cap_susp) {
    uint32_t cap = m->cap_susp ? m->cap_susp * 2 : 4;
    st__susp_t* p = realloc(m->susp, (size_t) cap * sizeof *p);
    if (!p)
      return; /* no timer: the member stays suspect until refuted or
                 declared dead by someone else */
    m->susp = p;
    m->cap_susp = cap;
  }
  uint32_t n = st__n_estimate(m);
  uint32_t k = m->cfg.lifeguard ? m->cfg.indirect_checks : 0;
  /* Fewer members than k + 2 (the suspect and us) cannot confirm. */
  if (n < k + 2)
    k = 0;
  st__susp_t* s = &m->susp[m->n_susp];
  memset(s, 0, sizeof *s);
  s->id = r->id;
  s->start_ms = now;
  s->min_ms = st__suspicion_min_ms(m, n);
  s->max_ms =
      m->cfg.lifeguard ? s->min_ms * m->cfg.suspicion_max_mult : s->min_ms;
  s->k = k;
  s->who[0] = *from;
  s->deadline_ms = now + (k == 0 ? s->min_ms : s->max_ms);
  r->susp = m->n_susp++;
  if (s->deadline_ms < m->susp_min_at)
    m->susp_min_at = s->deadline_ms;
}

/* Counts a confirmation from a member not yet heard accusing; the timeout
 * becomes max(min, max - (max - min) * log(C + 1) / log(K + 1)). */
bool st__susp_confirm(st_membership_t* m, uint64_t now, st__mrec_t* r,
                      const st_node_id_t* from) {
  (void) now;
  st__susp_t* s = &m->susp[r->susp];
  if (s->n >= s->k)
    return false;
  for (uint32_t i = 0; i <= s->n; i++)
    if (st__id_eq(&s->who[i], from))
      return false;
  s->who[++s->n] = *from;
  double frac = log((double) s->n + 1.0) / log((double) s->k + 1.0);
  double raw = (double) s->max_ms - frac * (double) (s->max_ms - s->min_ms);
  uint64_t timeout = raw < (double) s->min_ms ? s->min_ms : (uint64_t) raw;
  s->deadline_ms = s->start_ms + timeout;
  susp_recompute_min(m);
  return true;
}

void st__susp_stop(st_membership_t* m, st__mrec_t* r) {
  if (r->susp == ST__NONE)
    return;
  uint32_t i = r->susp, last = m->n_susp - 1;
  r->susp = ST__NONE;
  if (i != last) {
    m->susp[i] = m->susp[last];
    st__mrec_t* moved = st__mem_get(m, &m->susp[i].id);
    if (moved)
      moved->susp = i;
  }
  m->n_susp--;
  susp_recompute_min(m);
}

void st__susp_tick(st_membership_t* m, uint64_t now) {
  if (m->susp_min_at > now)
    return;
  /* Backwards: declaring one dead moves the last timer into its slot,
   * and the last has been looked at already. */
  for (uint32_t i = m->n_susp; i-- > 0;) {
    if (i >= m->n_susp || m->susp[i].deadline_ms > now)
      continue;
    st__mrec_t* r = st__mem_get(m, &m->susp[i].id);
    if (!r) { /* cannot happen: reclaim stops timers first */
      uint32_t last = --m->n_susp;
      if (i != last) {
        m->susp[i] = m->susp[last];
        st__mrec_t* moved = st__mem_get(m, &m->susp[i].id);
        if (moved)
          moved->susp = i;
      }
      continue;
    }
    st_msg_suspect_t d;
    d.node = r->id;
    d.incarnation = r->incarnation;
    d.from = m->self;
    st__on_dead(m, now, &d);
    if (r->susp != ST__NONE) /* on_dead refused: drop the timer anyway */
      st__susp_stop(m, r);
  }
  susp_recompute_min(m);
}
