/* membership_gossip.c: dissemination for the membership machine: the
 * broadcast queue (fewest transmissions first, each update sent at most
 * retransmit_mult * ceil(log10(N + 1)) times), packets that piggyback as
 * many updates as fit in ST_PACKET_MAX_PLAINTEXT bytes, the periodic
 * gossip to a few random members, and the full-state push-pull.
 *
 * Follows SWIM (Das, Gupta, Motivala, DSN 2002, section 4.1:
 * infection-style dissemination piggybacked on the failure detector's
 * messages) as memberlist's queue.go (TransmitLimitedQueue), state.go
 * (gossip, pushPull, mergeState) and util.go (retransmitLimit,
 * pushPullScale, kRandomNodes) run it.
 *
 * The queue holds at most one update per member and kind (membership
 * state, status record): an update names the member, and the message is
 * encoded from the member's record when packed, so a newer state replaces
 * an older one in place and restarts its count (memberlist's
 * invalidation). Updates are kept in one list per transmit count; packing
 * takes from the lowest count up, newest first within a count. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/membership_internal.h"

/* ==== The queue =============================================================
 */

int st__bc_init(st_membership_t* m) {
  m->bc_head = malloc((ST_MEMBERSHIP_MAX_TRANSMITS + 1) * sizeof *m->bc_head);
  if (!m->bc_head)
    return -ENOMEM;
  for (uint32_t t = 0; t <= ST_MEMBERSHIP_MAX_TRANSMITS; t++)
    m->bc_head[t] = ST__NONE;
  m->bc_free = ST__NONE;
  return 0;
}

uint32_t st__retransmit_limit(const st_membership_t* m) {
  /* ceil(log10(n + 1)), exactly, in integers. */
  uint64_t n1 = (uint64_t) st__n_estimate(m) + 1, p = 1;
  uint32_t digits = 0;
  while (p < n1) {
    p *= 10;
    digits++;
  }
  uint64_t lim = (uint64_t) m->cfg.retransmit_mult * digits;
  if (lim < 1)
    lim = 1;
  return lim > ST_MEMBERSHIP_MAX_TRANSMITS ? ST_MEMBERSHIP_MAX_TRANSMITS
                                           : (uint32_t) lim;
}

static void bc_unlink(st_membership_t* m, uint32_t i) {
  st__bcast_t* b = &m->bc[i];
  if (b->prev != ST__NONE)
    m->bc[b->prev].next = b->next;
  else
    m->bc_head[b->transmits] = b->next;
  if (b->next != ST__NONE)
    m->bc[b->next].prev = b->prev;
  b->prev = b->next = ST__NONE;
}

static void bc_push_front(st_membership_t* m, uint32_t i) {
  st__bcast_t* b = &m->bc[i];
  uint32_t h = m->bc_head[b->transmits];
  b->prev = ST__NONE;
  b->next = h;
  if (h != ST__NONE)
    m->bc[h].prev = i;
  m->bc_head[b->transmits] = i;
}

static uint32_t bc_alloc(st_membership_t* m) {
  uint32_t i = m->bc_free;
  if (i != ST__NONE) {
    m->bc_free = m->bc[i].next;
    return i;
  }
  if (m->n_bc == m->cap_bc) {
    uint32_t cap = m->cap_bc + m->cap_bc / 2 + 16;
    st__bcast_t* p = realloc(m->bc, (size_t) cap * sizeof *p);
    if (!p)
      return ST__NONE;
    m->bc = p;
    m->cap_bc = cap;
  }
  return m->n_bc++;
}

/* (Re)queues the update held in *slot (a member's bcast or a status's),
 * with a fresh transmit count. */
static void bc_queue(st_membership_t* m, uint32_t* slot, uint8_t kind,
                     const st_node_id_t* id, const st_node_id_t* from,
                     uint32_t mi) {
  uint32_t i = *slot;
  if (i != ST__NONE) {
    bc_unlink(m, i);
  } else {
    i = bc_alloc(m);
    if (i == ST__NONE)
      return; /* out of memory: the push-pull will repair it */
    *slot = i;
    m->bc_pending++;
  }
  st__bcast_t* b = &m->bc[i];
  b->id = *id;
  b->from = *from;
  b->mi = mi;
  b->kind = kind;
  b->transmits = 0;
  bc_push_front(m, i);
}

void st__bc_shrink(st_membership_t* m) {
  if (m->bc_pending == 0 && m->cap_bc > ST_MEMBERSHIP_KEEP_BROADCASTS) {
    /* A burst (a join, a partition healing) drained: give its pool back,
     * 48 bytes a member otherwise held for good by every machine. */
    free(m->bc);
    m->bc = NULL;
    m->n_bc = m->cap_bc = 0;
    m->bc_free = ST__NONE;
  }
}

void st__bc_queue_member(st_membership_t* m, st__mrec_t* r,
                         const st_node_id_t* from) {
  bc_queue(m, &r->bcast, ST__BC_MEMBER, &r->id, from, (uint32_t) (r - m->mem));
}

void st__bc_queue_status(st_membership_t* m, uint32_t status_idx) {
  st__status_t* s = &m->statuses[status_idx];
  bc_queue(m, &s->bcast, ST__BC_STATUS, &s->rec.node, &s->rec.node, ST__NONE);
}

void st__bc_drop(st_membership_t* m, uint32_t* idx) {
  uint32_t i = *idx;
  if (i == ST__NONE)
    return;
  bc_unlink(m, i);
  m->bc[i].kind = ST__BC_FREE;
  m->bc[i].next = m->bc_free;
  m->bc_free = i;
  m->bc_pending--;
  *idx = ST__NONE;
}

void st__bc_rehint(st_membership_t* m, uint32_t i) {
  const st__mrec_t* r = &m->mem[i];
  if (r->bcast != ST__NONE)
    m->bc[r->bcast].mi = i;
  if (r->status != ST__NONE && m->statuses[r->status].bcast != ST__NONE)
    m->bc[m->statuses[r->status].bcast].mi = i;
}

/* Broadcast b's member, found through its index hint when that still
 * holds (the id decides), else through the hash; NULL if gone. */
static st__mrec_t* bc_member(st_membership_t* m, st__bcast_t* b) {
  if (b->mi < m->n_mem && st__id_eq(&m->mem[b->mi].id, &b->id))
    return &m->mem[b->mi];
  uint32_t i = st__mem_find(m, &b->id);
  if (i == ST__NONE)
    return NULL;
  b->mi = i;
  return &m->mem[i];
}

/* The owner's pointer to broadcast i, or NULL for an orphan. */
static uint32_t* bc_owner(st_membership_t* m, uint32_t i) {
  st__mrec_t* r = bc_member(m, &m->bc[i]);
  if (!r)
    return NULL;
  if (m->bc[i].kind == ST__BC_MEMBER)
    return r->bcast == i ? &r->bcast : NULL;
  if (r->status != ST__NONE && m->statuses[r->status].bcast == i)
    return &m->statuses[r->status].bcast;
  return NULL;
}

static void bc_retire(st_membership_t* m, uint32_t i) {
  uint32_t* owner = bc_owner(m, i);
  uint32_t tmp = i;
  st__bc_drop(m, owner ? owner : &tmp);
}

/* Updates past the limit (N shrank since they were sent) are retired. */
static void bc_purge(st_membership_t* m) {
  uint32_t lim = st__retransmit_limit(m);
  for (uint32_t t = lim; t <= ST_MEMBERSHIP_MAX_TRANSMITS; t++)
    while (m->bc_head[t] != ST__NONE)
      bc_retire(m, m->bc_head[t]);
}

/* Encodes update b from its member's current record. */
static int bc_encode(st_membership_t* m, st__bcast_t* b, uint8_t* buf,
                     size_t cap, size_t* len) {
  const st__mrec_t* r = bc_member(m, b);
  if (!r)
    return -ENOENT;
  st_msg_t msg;
  memset(&msg, 0, sizeof msg);
  if (b->kind == ST__BC_STATUS) {
    if (r->status == ST__NONE)
      return -ENOENT;
    msg.type = ST_MSG_STATUS;
    msg.u.status = m->statuses[r->status].rec;
  } else if (r->state == ST_MEMBER_ALIVE) {
    msg.type = ST_MSG_ALIVE;
    msg.u.alive.node = r->id;
    msg.u.alive.incarnation = r->incarnation;
    st__rec_addr(r, &msg.u.alive.addr);
    memcpy(msg.u.alive.public_key, r->pk, ST_PUBLIC_KEY_BYTES);
    memcpy(msg.u.alive.signature, r->sig, ST_SIGNATURE_BYTES);
  } else {
    msg.type = r->state == ST_MEMBER_SUSPECT ? ST_MSG_SUSPECT : ST_MSG_DEAD;
    msg.u.suspect.node = r->id;
    msg.u.suspect.incarnation = r->incarnation;
    msg.u.suspect.from = r->state == ST_MEMBER_LEFT ? r->id : b->from;
    if (r->state == ST_MEMBER_LEFT) /* the member's own signed leave */
      memcpy(msg.u.suspect.signature, r->sig, ST_SIGNATURE_BYTES);
  }
  return st_wire_encode(&msg, buf, cap, len);
}

/* ==== Packets ===============================================================
 */

int st__send_packet(st_membership_t* m, const st_wire_addr_t* to,
                    const st_node_id_t* to_id, const st_msg_t* head,
                    const st_msg_t* head2) {
  uint8_t buf[ST_PACKET_MAX_PLAINTEXT];
  size_t pos = 0, len = 0;
  const st_msg_t* heads[2] = {head, head2};
  for (int h = 0; h < 2; h++) {
    if (!heads[h])
      continue;
    int rc = st_wire_encode(heads[h], buf + pos, sizeof buf - pos, &len);
    if (rc)
      return rc;
    pos += len;
  }
  /* Piggyback: fewest transmissions first. The updates sent are moved up
   * a count only after the scan, so none goes twice into one packet. */
  enum { MAX_SENT = ST_PACKET_MAX_PLAINTEXT / 8 };
  uint32_t sent[MAX_SENT], n_sent = 0, misses = 0;
  uint32_t lim = st__retransmit_limit(m);
  for (uint32_t t = 0;
       t < lim && misses < ST_MEMBERSHIP_PACK_MISSES && n_sent < MAX_SENT;
       t++) {
    for (uint32_t i = m->bc_head[t]; i != ST__NONE;) {
      uint32_t next = m->bc[i].next;
      if (next != ST__NONE && m->bc[next].mi < m->n_mem) {
        /* Overlaps the miss; a record is 160 bytes, so its three cache
         * lines (the id, incarnation and signature, the key and state). */
        const char* p = (const char*) &m->mem[m->bc[next].mi];
        __builtin_prefetch(p);
        __builtin_prefetch(p + 64);
        __builtin_prefetch(p + sizeof(st__mrec_t) - 1);
      }
      int rc = bc_encode(m, &m->bc[i], buf + pos, sizeof buf - pos, &len);
      if (rc == 0) {
        pos += len;
        sent[n_sent++] = i;
      } else if (rc == -EMSGSIZE) {
        misses++;
      } else {
        bc_retire(m, i); /* its member is gone */
      }
      if (misses >= ST_MEMBERSHIP_PACK_MISSES || n_sent == MAX_SENT)
        break;
      i = next;
    }
  }
  for (uint32_t s = 0; s < n_sent; s++) {
    uint32_t i = sent[s];
    if ((uint32_t) m->bc[i].transmits + 1u >= lim) {
      /* Its last transmission: retired from the list it is in (unlinking
       * it first and then retiring it unlinked it twice, and the second
       * time emptied the list at the new count, cutting out every update
       * there: test_retire_at_shrunk_limit). */
      bc_retire(m, i);
      continue;
    }
    bc_unlink(m, i);
    m->bc[i].transmits++;
    bc_push_front(m, i);
  }
  if (pos == 0)
    return 0;
  st_maction_t a;
  memset(&a, 0, sizeof a);
  a.kind = ST_MACT_SEND;
  a.to = *to;
  if (to_id)
    a.to_id = *to_id;
  return st__push_action(m, &a, buf, pos);
}

/* Up to k distinct random members other than self and *exclude, by
 * random picks (memberlist's kRandomNodes): alive ones only, or (for
 * gossip) any that is up or went down less than dead_reclaim_ms ago. */
static bool eligible(const st_membership_t* m, uint32_t i,
                     const st_node_id_t* exclude, uint64_t now,
                     bool alive_only) {
  const st__mrec_t* r = &m->mem[i];
  if (st__id_eq(&r->id, &m->self) || (exclude && st__id_eq(&r->id, exclude)))
    return false;
  if (alive_only)
    return r->state == ST_MEMBER_ALIVE;
  return !((r->state == ST_MEMBER_DEAD || r->state == ST_MEMBER_LEFT) &&
           now >= r->since_ms + m->cfg.dead_reclaim_ms);
}

uint32_t st__random_members(st_membership_t* m, uint32_t k,
                            const st_node_id_t* exclude, uint64_t now,
                            bool alive_only, uint32_t* out) {
  uint32_t n = m->n_mem, got = 0;
  if (n < 2 || k == 0)
    return 0;
  if (n <= ST_MEMBERSHIP_SMALL_TABLE) {
    /* Small table: draw exactly, by a partial Fisher-Yates over the
     * eligible members, so that k are found whenever k exist. */
    uint32_t cand[ST_MEMBERSHIP_SMALL_TABLE], nc = 0;
    for (uint32_t i = 0; i < n; i++)
      if (eligible(m, i, exclude, now, alive_only))
        cand[nc++] = i;
    for (; got < k && got < nc; got++) {
      uint32_t j = got + (uint32_t) st_rng_below(m->rng, nc - got);
      uint32_t t = cand[got];
      cand[got] = cand[j];
      cand[j] = t;
      out[got] = cand[got];
    }
    return got;
  }
  uint32_t tries = ST_MEMBERSHIP_RANDOM_TRIES * k + 64;
  for (uint32_t t = 0; t < tries && got < k; t++) {
    uint32_t i = (uint32_t) st_rng_below(m->rng, n);
    if (!eligible(m, i, exclude, now, alive_only))
      continue;
    bool dup = false;
    for (uint32_t j = 0; j < got && !dup; j++)
      dup = out[j] == i;
    if (!dup)
      out[got++] = i;
  }
  return got;
}

void st__gossip_tick(st_membership_t* m, uint64_t now) {
  bc_purge(m);
  if (m->bc_pending == 0 || m->cfg.gossip_nodes == 0)
    return;
  uint32_t picks[64];
  uint32_t k = m->cfg.gossip_nodes < 64 ? m->cfg.gossip_nodes : 64;
  uint32_t n = st__random_members(m, k, NULL, now, false, picks);
  /* Pick ids first: sending does not move the table, but be explicit. */
  for (uint32_t i = 0; i < n && m->bc_pending; i++) {
    const st__mrec_t* r = &m->mem[picks[i]];
    st_wire_addr_t to;
    st__rec_addr(r, &to);
    st_node_id_t id = r->id;
    (void) st__send_packet(m, &to, &id, NULL, NULL);
  }
}

/* ==== Push-pull =============================================================
 */

uint64_t st__push_pull_interval_ms(const st_membership_t* m) {
  /* memberlist's pushPullScale: x (ceil(log2(N) - log2(32)) + 1) above
   * 32 members, in integers: the smallest d with 32 * 2^d >= N. */
  uint64_t n = st__n_estimate(m), mult = 1;
  if (n > ST_MEMBERSHIP_PUSH_PULL_SCALE_THRESHOLD) {
    uint64_t c = ST_MEMBERSHIP_PUSH_PULL_SCALE_THRESHOLD;
    uint32_t d = 0;
    while (c < n) {
      c *= 2;
      d++;
    }
    mult = d + 1;
  }
  return (uint64_t) m->cfg.push_pull_interval_ms * mult;
}

int st__push_pull_send(st_membership_t* m, const st_wire_addr_t* to,
                       const st_node_id_t* to_id, bool is_reply) {
  uint32_t n = m->n_mem;
  if (n > ST_WIRE_PUSH_PULL_MAX_ENTRIES)
    n = ST_WIRE_PUSH_PULL_MAX_ENTRIES;
  st_push_pull_entry_t* e = calloc(n, sizeof *e);
  /* 151 bytes an entry at most (an IPv6 address, wide integers and the
   * signature; gossip/wire_internal.h), within the 160 reserved here. */
  size_t cap = 64 + (size_t) n * 160, len = 0;
  uint8_t* buf = malloc(cap);
  int rc = -ENOMEM;
  if (!e || !buf)
    goto out;
  /* Self first; beyond the per-message cap the rest is taken from a
   * cursor that moves on, so that every member travels in turn. */
  uint32_t k = 0;
  uint32_t self_i = st__mem_find(m, &m->self);
  for (uint32_t c = 0; c <= m->n_mem && k < n; c++) {
    uint32_t i = c == 0 ? self_i : (m->push_pull_cursor + c - 1) % m->n_mem;
    if (c > 0 && i == self_i)
      continue;
    const st__mrec_t* r = &m->mem[i];
    e[k].node = r->id;
    e[k].incarnation = r->incarnation;
    e[k].state = r->state;
    st__rec_addr(r, &e[k].addr);
    memcpy(e[k].public_key, r->pk, ST_PUBLIC_KEY_BYTES);
    memcpy(e[k].signature, r->sig, ST_SIGNATURE_BYTES);
    k++;
  }
  if (m->n_mem > n)
    m->push_pull_cursor = (m->push_pull_cursor + n) % m->n_mem;
  st_msg_t msg;
  memset(&msg, 0, sizeof msg);
  msg.type = ST_MSG_PUSH_PULL;
  msg.u.push_pull.is_reply = is_reply;
  msg.u.push_pull.n_entries = k;
  msg.u.push_pull.entries = e;
  rc = st_wire_encode(&msg, buf, cap, &len);
  if (rc)
    goto out;
  st_maction_t a;
  memset(&a, 0, sizeof a);
  a.kind = ST_MACT_PUSH_PULL;
  a.to = *to;
  if (to_id)
    a.to_id = *to_id;
  rc = st__push_action(m, &a, buf, len);
  if (rc == 0)
    m->stats.push_pulls_out++;
out:
  free(e);
  free(buf);
  return rc;
}

/* Reconnect (membership_constants.h, ST_MEMBERSHIP_GRAVES): one push-pull
 * with a random member among those held DEAD and those buried within
 * GRAVE_KEEP_MS. A grave whose member is known again is dropped. */
static void reconnect(st_membership_t* m, uint64_t now) {
  /* Expire and drop graves first, compacting in place. */
  uint32_t w = 0;
  for (uint32_t i = 0; i < m->n_grave; i++) {
    const st__grave_t* g = &m->grave[i];
    if (now >= g->at_ms + ST_MEMBERSHIP_GRAVE_KEEP_MS ||
        st__mem_find(m, &g->id) != ST__NONE)
      continue;
    m->grave[w++] = *g;
  }
  m->n_grave = w;
  uint32_t n_dead = 0;
  if (m->n_down > 0)
    for (uint32_t i = 0; i < m->n_mem; i++)
      n_dead += m->mem[i].state == ST_MEMBER_DEAD;
  uint32_t total = n_dead + m->n_grave;
  if (total == 0)
    return;
  uint32_t pick = (uint32_t) st_rng_below(m->rng, total);
  st_wire_addr_t to;
  st_node_id_t id;
  if (pick < m->n_grave) {
    to = m->grave[pick].addr;
    id = m->grave[pick].id;
  } else {
    pick -= m->n_grave;
    uint32_t i = 0;
    for (;; i++)
      if (m->mem[i].state == ST_MEMBER_DEAD && pick-- == 0)
        break;
    st__rec_addr(&m->mem[i], &to);
    id = m->mem[i].id;
  }
  m->stats.reconnects++;
  (void) st__push_pull_send(m, &to, &id, false);
}

void st__push_pull_tick(st_membership_t* m, uint64_t now) {
  if (m->leaving)
    return;
  uint32_t pick;
  if (st__random_members(m, 1, NULL, now, true, &pick) == 1) {
    const st__mrec_t* r = &m->mem[pick];
    st_wire_addr_t to;
    st__rec_addr(r, &to);
    st_node_id_t id = r->id;
    (void) st__push_pull_send(m, &to, &id, false);
  }
  reconnect(m, now);
}

/* An entry's ALIVE: its member's signed claim at the entry's incarnation
 * and address (the signature of every entry but a LEFT one). */
static void entry_alive(st_membership_t* m, uint64_t now,
                        const st_push_pull_entry_t* e) {
  st_msg_alive_t a;
  a.node = e->node;
  a.incarnation = e->incarnation;
  a.addr = e->addr;
  memcpy(a.public_key, e->public_key, ST_PUBLIC_KEY_BYTES);
  memcpy(a.signature, e->signature, ST_SIGNATURE_BYTES);
  st__on_alive(m, now, &a);
}

/* One entry of a peer's state, through the same rules as gossip
 * (memberlist's mergeState): a remote DEAD only makes us suspect (we
 * check for ourselves before we bury anyone); a remote LEFT is final. A
 * SUSPECT or DEAD entry newer than what we hold first brings us its
 * member's signed ALIVE at that incarnation (the entry's signature), so
 * that the accusation names an incarnation we know the member signed; a
 * suspect we never heard of is first learned as alive. */
void st__merge_entry(st_membership_t* m, uint64_t now,
                     const st_push_pull_entry_t* e) {
  st_msg_suspect_t s;
  memset(&s, 0, sizeof s);
  s.node = e->node;
  s.incarnation = e->incarnation;
  s.from = m->self;
  const st__mrec_t* r = st__mem_get(m, &e->node);
  switch (e->state) {
    case ST_MEMBER_ALIVE:
      entry_alive(m, now, e);
      break;
    case ST_MEMBER_SUSPECT:
    case ST_MEMBER_DEAD:
      if (r ? e->incarnation > r->incarnation : e->state == ST_MEMBER_SUSPECT)
        entry_alive(m, now, e);
      st__on_suspect(m, now, &s);
      break;
    case ST_MEMBER_LEFT:
      s.from = e->node; /* a leave: e->signature is the member's */
      memcpy(s.signature, e->signature, ST_SIGNATURE_BYTES);
      st__on_dead(m, now, &s);
      break;
    default:
      m->stats.msgs_rejected++;
      break;
  }
}
