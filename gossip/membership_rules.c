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
 * cluster key seals it, the sender's identity signs it), so any member may
 * relay claims about any other; what keeps a relay honest is that a claim
 * about X that X alone may make carries X's own signature (gossip.h,
 * "Signed claims"), which a relay can repeat but not forge:
 *  - An ALIVE about X, direct or relayed by gossip or a push-pull, is
 *    accepted only when its incarnation is strictly newer than the one
 *    held and X's signature of it verifies (with the key held for X, or
 *    for a new member the ALIVE's key, which must hash to X's id, so a key
 *    once known never changes). Its signature is kept, to relay.
 *  - A STATUS about X likewise: a newer seq, signed by X.
 *  - A SUSPECT or DEAD about X names X's current incarnation exactly:
 *    older ones are stale (ignored), newer ones are beyond anything X
 *    signed that we know (refused, counted). So a record's incarnation is
 *    always one X signed, the ALIVE that proves it is at hand, and a
 *    refutation is at most one above an incarnation we signed ourselves:
 *    it cannot be driven to overflow (and saturates anyway).
 *  - A DEAD whose `from` is X itself is X's graceful leave (LEFT): it
 *    carries X's signature of the leave, nobody refutes it, and only X's
 *    own newer ALIVE (a rejoin) brings it back.
 * Signatures are checked only when a claim would change state, so a
 * repeated rumour costs a lookup, not a verification. SUSPECT and DEAD
 * claims about unknown members are ignored; claims about this node are
 * refuted (bump the low 32 bits of the incarnation, broadcast ALIVE)
 * unless it is leaving. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/membership_internal.h"

/* ==== Signed claims (gossip.h, "Signed claims") =============================
 */

static size_t put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t) (v >> (56 - 8 * i));
  return 8;
}

static size_t put_f32(uint8_t* p, float f) {
  uint32_t v;
  memcpy(&v, &f, sizeof v);
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t) (v >> (24 - 8 * i));
  return 4;
}

static size_t put_tag(uint8_t* p, const char* tag) {
  size_t n = strlen(tag);
  memcpy(p, tag, n);
  return n;
}

size_t st_membership_alive_claim(const st_msg_alive_t* a,
                                 uint8_t out[ST_MEMBERSHIP_CLAIM_MAX_BYTES]) {
  size_t n = put_tag(out, "starling-alive-v1");
  memcpy(out + n, a->node.b, ST_NODE_ID_BYTES);
  n += ST_NODE_ID_BYTES;
  n += put_u64(out + n, a->incarnation);
  uint8_t ip_len = a->addr.ip_len <= 16 ? a->addr.ip_len : 16;
  out[n++] = ip_len;
  memcpy(out + n, a->addr.ip, ip_len);
  n += ip_len;
  out[n++] = (uint8_t) (a->addr.port >> 8);
  out[n++] = (uint8_t) a->addr.port;
  return n; /* 17 + 16 + 8 + 1 + 16 + 2 = 60 at most */
}

size_t st_membership_status_claim(const st_msg_status_t* s,
                                  uint8_t out[ST_MEMBERSHIP_CLAIM_MAX_BYTES]) {
  size_t n = put_tag(out, "starling-status-v3");
  memcpy(out + n, s->node.b, ST_NODE_ID_BYTES);
  n += ST_NODE_ID_BYTES;
  n += put_u64(out + n, s->seq);
  n += put_u64(out + n, s->step);
  n += put_f32(out + n, s->loss);
  n += put_f32(out + n, s->accuracy);
  n += put_f32(out + n, s->samples_per_sec);
  memcpy(out + n, s->fingerprint, sizeof s->fingerprint);
  n += sizeof s->fingerprint;
  out[n++] = s->ring_capable ? 1 : 0;
  out[n++] = s->synced ? 1 : 0;
  uint8_t n_keys = s->n_keys <= 2 ? s->n_keys : 2;
  out[n++] = n_keys;
  memcpy(out + n, s->keys, n_keys);
  n += n_keys;
  return n; /* 18 + 16 + 16 + 12 + 16 + 2 + 1 + 2 = 83 at most */
}

size_t st_membership_leave_claim(const st_node_id_t* node, uint64_t incarnation,
                                 uint8_t out[ST_MEMBERSHIP_CLAIM_MAX_BYTES]) {
  size_t n = put_tag(out, "starling-leave-v1");
  memcpy(out + n, node->b, ST_NODE_ID_BYTES);
  n += ST_NODE_ID_BYTES;
  n += put_u64(out + n, incarnation);
  return n; /* 41 */
}

static void sign_claim(st_membership_t* m, const uint8_t* msg, size_t len,
                       uint8_t* sig) {
  if (m->signer.sign)
    m->signer.sign(m->signer.ctx, msg, len, sig);
  else
    memset(sig, 0, ST_SIGNATURE_BYTES);
}

/* Whether sig is pk's signature of msg; counts a failure. */
static bool verify_claim(st_membership_t* m, const uint8_t* pk,
                         const uint8_t* msg, size_t len, const uint8_t* sig) {
  bool ok = m->signer.verify
                ? m->signer.verify(m->signer.ctx, pk, msg, len, sig)
                : st_identity_verify(pk, msg, len, sig);
  if (!ok)
    m->stats.claims_bad_signature++;
  return ok;
}

static bool alive_ok(st_membership_t* m, const uint8_t* pk,
                     const st_msg_alive_t* a) {
  uint8_t buf[ST_MEMBERSHIP_CLAIM_MAX_BYTES];
  size_t n = st_membership_alive_claim(a, buf);
  return verify_claim(m, pk, buf, n, a->signature);
}

bool st__leave_ok(st_membership_t* m, const uint8_t* pk,
                  const st_node_id_t* node, uint64_t inc, const uint8_t* sig) {
  uint8_t buf[ST_MEMBERSHIP_CLAIM_MAX_BYTES];
  size_t n = st_membership_leave_claim(node, inc, buf);
  return verify_claim(m, pk, buf, n, sig);
}

void st__sign_self(st_membership_t* m) {
  st__mrec_t* r = st__mem_get(m, &m->self);
  uint8_t buf[ST_MEMBERSHIP_CLAIM_MAX_BYTES];
  size_t n;
  if (r->state == ST_MEMBER_LEFT) {
    n = st_membership_leave_claim(&r->id, r->incarnation, buf);
  } else {
    st_msg_alive_t a;
    memset(&a, 0, sizeof a);
    a.node = r->id;
    a.incarnation = r->incarnation;
    st__rec_addr(r, &a.addr);
    n = st_membership_alive_claim(&a, buf);
  }
  sign_claim(m, buf, n, r->sig);
}

void st__sign_status(st_membership_t* m, st_msg_status_t* s) {
  uint8_t buf[ST_MEMBERSHIP_CLAIM_MAX_BYTES];
  size_t n = st_membership_status_claim(s, buf);
  sign_claim(m, buf, n, s->signature);
}

void st_membership_set_signer(st_membership_t* m,
                              const st_membership_signer_t* s) {
  if (m == NULL)
    return;
  if (s != NULL)
    m->signer = *s;
  else
    memset(&m->signer, 0, sizeof m->signer);
  st__sign_self(m);
}

void st_membership_claim_stats(const st_membership_t* m,
                               st_membership_claim_stats_t* out) {
  memset(out, 0, sizeof *out);
  if (m == NULL)
    return;
  out->bad_signature = m->stats.claims_bad_signature;
  out->beyond_signed = m->stats.claims_beyond_signed;
  out->ack_wrong_sender = m->stats.acks_wrong_sender;
}

/* ==== State rules ===========================================================
 */

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
  /* Claims above what we signed are refused before they get here, so inc
   * is at most our own; saturate all the same. */
  r->incarnation = inc < UINT64_MAX ? inc + 1 : inc;
  st__sign_self(m);
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
  memcpy(a.u.alive.signature, me->sig, ST_SIGNATURE_BYTES);
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
    if (!m->leaving && a->incarnation > me->incarnation) {
      if (alive_ok(m, me->pk, a)) /* only our own word counts */
        st__refute(m, now, a->incarnation);
    } else {
      m->stats.msgs_ignored++;
    }
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
    if (st__tombstoned(m, &a->node, a->incarnation, now)) {
      m->stats.msgs_ignored++; /* force-left: only a newer self returns */
      return;
    }
    if (!alive_ok(m, a->public_key, a))
      return;
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
    if (!alive_ok(m, r->pk, a))
      return;
  }
  st__susp_stop(m, r);
  r->incarnation = a->incarnation;
  memcpy(r->sig, a->signature, ST_SIGNATURE_BYTES);
  st__rec_set_addr(r, &a->addr);
  st__set_state(m, now, r, ST_MEMBER_ALIVE);
  if (!(fresh && m->quiet_merge))
    st__bc_queue_member(m, r, &a->node);
  st__emit_member(m, r);
}

void st__on_suspect(st_membership_t* m, uint64_t now,
                    const st_msg_suspect_t* s) {
  st__mrec_t* r = st__mem_get(m, &s->node);
  if (r && s->incarnation > r->incarnation) {
    m->stats.claims_beyond_signed++; /* not an incarnation s->node signed */
    return;
  }
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
  bool left = st__id_eq(&d->from, &d->node);
  bool self = st__id_eq(&d->node, &m->self);
  /* A newer leave is the member's own signed word (checked below); any
   * other newer DEAD names an incarnation it never signed. */
  if (r && d->incarnation > r->incarnation && (!left || self)) {
    m->stats.claims_beyond_signed++;
    return;
  }
  if (r && d->incarnation < r->incarnation && st__id_eq(&d->node, &m->self) &&
      !m->leaving)
    tell_alive(m, &d->from);
  if (!r || d->incarnation < r->incarnation || st__is_down(r->state)) {
    m->stats.msgs_ignored++;
    return;
  }
  if (self) {
    if (m->leaving)
      m->stats.msgs_ignored++;
    else
      st__refute(m, now, d->incarnation);
    return;
  }
  if (left && !st__leave_ok(m, r->pk, &d->node, d->incarnation, d->signature))
    return; /* a leave only its subject may announce */
  st__susp_stop(m, r);
  r->incarnation = d->incarnation;
  if (left)
    memcpy(r->sig, d->signature, ST_SIGNATURE_BYTES);
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
  if (r->status != ST__NONE && s->seq <= m->statuses[r->status].rec.seq) {
    m->stats.msgs_ignored++;
    return;
  }
  uint8_t buf[ST_MEMBERSHIP_CLAIM_MAX_BYTES];
  size_t n = st_membership_status_claim(s, buf);
  if (!verify_claim(m, r->pk, buf, n, s->signature))
    return; /* only the member may say how it trains */
  if (r->status == ST__NONE && st__status_alloc(m, r))
    return;
  m->statuses[r->status].rec = *s;
  st__bc_queue_status(m, r->status);
  st__emit_member(m, r);
}
