/* membership_rules.c: the SWIM state rules of the membership machine
 * (alive, suspect, dead, left, refutation, status records), which every
 * message from a packet and every push-pull entry goes through.
 *
 * Follows SWIM (Das, Gupta, Motivala, DSN 2002, section 4.2: suspicion
 * and incarnation numbers) with Lifeguard (Dadgar, Phillips, Currey 2018)
 * as memberlist's state.go (aliveNode, suspectNode, deadNode, refute) runs
 * them.
 *
 * Trust model. The driver authenticates every packet's sender id (the
 * cluster key seals it), so any member may relay claims about any other;
 * what keeps a relay honest is that only a member mints its own
 * incarnations. An ALIVE about X, direct from X or relayed by gossip or a
 * push-pull, is accepted only when its incarnation is strictly newer than
 * the one held, so a relay can repeat what X said but never resurrect X to
 * an incarnation X had not reached, and never lower one. A public key is
 * accepted only when it hashes to the member's id, so a key once known
 * never changes. SUSPECT and DEAD claims about unknown members are
 * ignored; claims about this node are refuted (bump the low 32 bits of the
 * incarnation, broadcast ALIVE) unless it is leaving. A DEAD whose `from`
 * is the member itself is a graceful leave (LEFT): nobody refutes it, and
 * only the member's own newer ALIVE (a rejoin) brings it back. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/membership_internal.h"

void st__set_state(st_membership_t* m, uint64_t now, st__mrec_t* r,
                   uint8_t state) {
  bool was_up = !st__is_down(r->state), up = !st__is_down(state);
  bool self = st__id_eq(&r->id, &m->self);
  if (was_up && !up) {
    m->n_alive--;
    m->n_down += !self;
  }
  if (!was_up && up) {
    m->n_alive++;
    m->n_down -= !self;
  }
  if (r->state != state)
    r->since_ms = now;
  r->state = state;
}

void st__refute(st_membership_t* m, uint64_t now, uint64_t accused_inc) {
  st__mrec_t* r = st__mem_get(m, &m->self);
  uint64_t inc = r->incarnation > accused_inc ? r->incarnation : accused_inc;
  r->incarnation = inc + 1;
  (void) now;
  m->stats.refutes++;
  /* Having to refute is evidence that we are the slow one (Lifeguard). */
  st__awareness(m, 1);
  st__bc_queue_member(m, r, &m->self);
  st__emit_member(m, r);
}

/* Tells member `to` our current ALIVE in a packet of its own: an answer to
 * an accusation of an incarnation we have already refuted. The accuser
 * (or whoever still repeats it) missed the refutation's broadcasts, which
 * nobody repeats once spent, and would otherwise declare us dead when its
 * timer runs out; our own word, sent straight to it, clears it (SWIM's
 * refutation, re-sent on demand). At most one packet per stale claim. */
static void tell_alive(st_membership_t* m, const st_node_id_t* to_id) {
  if (st__id_eq(to_id, &m->self))
    return;
  const st__mrec_t* to = st__mem_get(m, to_id);
  const st__mrec_t* me = st__mem_get(m, &m->self);
  if (!to || !me)
    return;
  st_msg_t a;
  memset(&a, 0, sizeof a);
  a.type = ST_MSG_ALIVE;
  a.u.alive.node = me->id;
  a.u.alive.incarnation = me->incarnation;
  st__rec_addr(me, &a.u.alive.addr);
  memcpy(a.u.alive.public_key, me->pk, ST_PUBLIC_KEY_BYTES);
  st_wire_addr_t addr;
  st__rec_addr(to, &addr);
  st_node_id_t id = to->id;
  m->stats.refutes_resent++;
  (void) st__send_packet(m, &addr, &id, &a, NULL);
}

void st__on_alive(st_membership_t* m, uint64_t now, const st_msg_alive_t* a) {
  if (st__id_eq(&a->node, &m->self)) {
    /* Someone holds a newer incarnation of us than we do (our previous
     * life's, replayed): outbid it. Our own ALIVE relayed back is
     * ignored. */
    st__mrec_t* me = st__mem_get(m, &m->self);
    if (!m->leaving && a->incarnation > me->incarnation)
      st__refute(m, now, a->incarnation);
    else
      m->stats.msgs_ignored++;
    return;
  }
  if (a->addr.ip_len != 4 && a->addr.ip_len != 16) {
    m->stats.msgs_rejected++;
    return;
  }
  st__mrec_t* r = st__mem_get(m, &a->node);
  bool fresh = r == NULL;
  if (!r) {
    st_node_id_t derived;
    st_node_id_from_public_key(a->public_key, &derived);
    if (!st__id_eq(&derived, &a->node)) {
      m->stats.msgs_rejected++;
      return;
    }
    if (m->admit != NULL && !m->admit(a->public_key, m->admit_ctx)) {
      m->stats.msgs_rejected++; /* not a member this node admits */
      return;
    }
    r = st__table_add(m, &a->node);
    if (!r) {
      m->stats.msgs_rejected++;
      return;
    }
    memcpy(r->pk, a->public_key, ST_PUBLIC_KEY_BYTES);
    r->state = ST_MEMBER_ALIVE;
    r->since_ms = now;
    m->n_alive++;
  } else {
    if (a->incarnation <= r->incarnation) {
      m->stats.msgs_ignored++;
      return;
    }
    if (memcmp(r->pk, a->public_key, ST_PUBLIC_KEY_BYTES) != 0) {
      m->stats.msgs_rejected++;
      return;
    }
  }
  st__susp_stop(m, r);
  r->incarnation = a->incarnation;
  st__rec_set_addr(r, &a->addr);
  st__set_state(m, now, r, ST_MEMBER_ALIVE);
  if (!(fresh && m->quiet_merge))
    st__bc_queue_member(m, r, &a->node);
  st__emit_member(m, r);
}

void st__on_suspect(st_membership_t* m, uint64_t now,
                    const st_msg_suspect_t* s) {
  st__mrec_t* r = st__mem_get(m, &s->node);
  if (r && s->incarnation < r->incarnation && st__id_eq(&s->node, &m->self) &&
      !m->leaving)
    tell_alive(m, &s->from);
  if (!r || s->incarnation < r->incarnation) {
    m->stats.msgs_ignored++;
    return;
  }
  if (r->susp != ST__NONE) {
    /* A running suspicion: a new, distinct accuser confirms it (and the
     * confirmation is passed on so that others count it too). */
    if (st__susp_confirm(m, now, r, &s->from))
      st__bc_queue_member(m, r, &s->from);
    else
      m->stats.msgs_ignored++;
    return;
  }
  if (st__id_eq(&s->node, &m->self)) {
    if (m->leaving || r->state != ST_MEMBER_ALIVE) {
      m->stats.msgs_ignored++;
      return;
    }
    st__refute(m, now, s->incarnation);
    return;
  }
  if (r->state != ST_MEMBER_ALIVE) {
    m->stats.msgs_ignored++;
    return;
  }
  r->incarnation = s->incarnation;
  st__set_state(m, now, r, ST_MEMBER_SUSPECT);
  m->stats.suspects++;
  st__susp_start(m, now, r, &s->from);
  st__bc_queue_member(m, r, &s->from);
  st__emit_member(m, r);
}

void st__on_dead(st_membership_t* m, uint64_t now, const st_msg_suspect_t* d) {
  st__mrec_t* r = st__mem_get(m, &d->node);
  if (r && d->incarnation < r->incarnation && st__id_eq(&d->node, &m->self) &&
      !m->leaving)
    tell_alive(m, &d->from);
  if (!r || d->incarnation < r->incarnation || st__is_down(r->state)) {
    m->stats.msgs_ignored++;
    return;
  }
  if (st__id_eq(&d->node, &m->self)) {
    if (m->leaving)
      m->stats.msgs_ignored++;
    else
      st__refute(m, now, d->incarnation);
    return;
  }
  st__susp_stop(m, r);
  r->incarnation = d->incarnation;
  bool left = st__id_eq(&d->from, &d->node);
  st__set_state(m, now, r, left ? ST_MEMBER_LEFT : ST_MEMBER_DEAD);
  if (!left)
    m->stats.deaths++;
  st__bc_queue_member(m, r, &d->from);
  st__emit_member(m, r);
}

/* Gives member r a status slot (recycled from forgotten members first). */
int st__status_alloc(st_membership_t* m, st__mrec_t* r) {
  uint32_t i = m->status_free;
  if (i != ST__NONE) {
    m->status_free = m->statuses[i].bcast;
  } else {
    if (m->n_status == m->cap_status) {
      uint32_t cap = m->cap_status + m->cap_status / 2 + 8;
      st__status_t* p = realloc(m->statuses, (size_t) cap * sizeof *p);
      if (!p)
        return -ENOMEM;
      m->statuses = p;
      m->cap_status = cap;
    }
    i = m->n_status++;
  }
  memset(&m->statuses[i], 0, sizeof m->statuses[i]);
  m->statuses[i].used = true;
  m->statuses[i].bcast = ST__NONE;
  r->status = i;
  return 0;
}

void st__on_status(st_membership_t* m, uint64_t now, const st_msg_status_t* s) {
  (void) now;
  st__mrec_t* r = st__mem_get(m, &s->node);
  if (!r || st__id_eq(&s->node, &m->self)) {
    m->stats.msgs_ignored++;
    return;
  }
  if (r->status == ST__NONE) {
    if (st__status_alloc(m, r))
      return;
  } else if (s->seq <= m->statuses[r->status].rec.seq) {
    m->stats.msgs_ignored++;
    return;
  }
  m->statuses[r->status].rec = *s;
  st__bc_queue_status(m, r->status);
  st__emit_member(m, r);
}
