/* membership.c: the membership machine's table (compact records in probe
 * order, an id -> index hash), its events, actions, timers and queries.
 *
 * Follows SWIM (Das, Gupta, Motivala, DSN 2002) with Lifeguard (Dadgar,
 * Phillips, Currey 2018) as HashiCorp's memberlist runs them. The state
 * rules every message goes through are in membership_rules.c, probing in
 * membership_probe.c, dissemination and push-pull in membership_gossip.c.
 *
 * Determinism: no clock, no global state; the id hash is keyed from the
 * injected generator and never hashes a pointer. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/membership_internal.h"

/* ==== Configuration =========================================================
 */

const char* st_member_state_name(st_member_state_t s) {
  static const char* const names[] = {"alive", "suspect", "dead", "left"};
  return (unsigned) s <= ST_MEMBER_LEFT ? names[s] : "?";
}

void st_membership_config_default(st_membership_config_t* cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->probe_interval_ms = ST_MEMBERSHIP_PROBE_INTERVAL_MS;
  cfg->probe_timeout_ms = ST_MEMBERSHIP_PROBE_TIMEOUT_MS;
  cfg->indirect_checks = ST_MEMBERSHIP_INDIRECT_CHECKS;
  cfg->suspicion_mult = ST_MEMBERSHIP_SUSPICION_MULT;
  cfg->suspicion_max_mult = ST_MEMBERSHIP_SUSPICION_MAX_MULT;
  cfg->retransmit_mult = ST_MEMBERSHIP_RETRANSMIT_MULT;
  cfg->gossip_interval_ms = ST_MEMBERSHIP_GOSSIP_INTERVAL_MS;
  cfg->gossip_nodes = ST_MEMBERSHIP_GOSSIP_NODES;
  cfg->push_pull_interval_ms = ST_MEMBERSHIP_PUSH_PULL_INTERVAL_MS;
  cfg->awareness_max = ST_MEMBERSHIP_AWARENESS_MAX;
  cfg->dead_reclaim_ms = ST_MEMBERSHIP_DEAD_RECLAIM_MS;
  cfg->lifeguard = true;
}

static bool config_ok(const st_membership_config_t* c) {
  return c->probe_interval_ms > 0 && c->probe_timeout_ms > 0 &&
         c->probe_timeout_ms <= c->probe_interval_ms &&
         c->indirect_checks <= ST_MEMBERSHIP_MAX_INDIRECT_CHECKS &&
         c->suspicion_mult > 0 && c->suspicion_max_mult >= 1 &&
         c->retransmit_mult > 0 && c->retransmit_mult <= 32 &&
         c->gossip_interval_ms > 0 && c->awareness_max >= 1 &&
         c->awareness_max <= 64;
}

/* ==== Ids and the table =====================================================
 */

bool st__id_eq(const st_node_id_t* a, const st_node_id_t* b) {
  return memcmp(a->b, b->b, sizeof a->b) == 0;
}

bool st__id_zero(const st_node_id_t* a) {
  static const st_node_id_t zero;
  return st__id_eq(a, &zero);
}

void st__rec_addr(const st__mrec_t* r, st_wire_addr_t* a) {
  memset(a, 0, sizeof *a);
  a->ip_len = r->ip_len;
  memcpy(a->ip, r->ip, sizeof a->ip);
  a->port = r->port;
}

void st__rec_set_addr(st__mrec_t* r, const st_wire_addr_t* a) {
  r->ip_len = a->ip_len == 16 ? 16 : 4;
  memset(r->ip, 0, sizeof r->ip);
  memcpy(r->ip, a->ip, r->ip_len);
  r->port = a->port;
}

/* Node ids are hashes of public keys, but a member with the cluster key
 * could choose ids that collide in the table; the key drawn from the
 * injected generator makes that guesswork. */
static uint32_t id_hash(const st_membership_t* m, const st_node_id_t* id) {
  uint64_t a, b;
  memcpy(&a, id->b, 8);
  memcpy(&b, id->b + 8, 8);
  uint64_t h = (a ^ m->hash_key) * 0x9E3779B97F4A7C15ull;
  h ^= b + (h >> 29);
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return (uint32_t) h;
}

/* Messages of a packet decoded ahead of their dispatch. */
#define ST__DECODE_BATCH 16u

/* A slot's tag: the hash's high bits, independent of the home position
 * (its low bits) in tables up to 2^17 slots. */
static inline uint32_t slot_tag(uint32_t h) {
  return h >> (32 - ST__TAG_BITS);
}

/* The index a slot holds; ST__NONE for an empty one. */
static inline uint32_t slot_idx(st__slot_t v) {
  return (v >> ST__TAG_BITS) - 1;
}

/* Each slot keeps a tag of the id's hash beside the index, so that a
 * probe of the table touches a member's record only on a likely match:
 * with thousands of machines in one simulator, every record touched is a
 * cache miss. */
static uint32_t hash_slot(const st_membership_t* m, const st_node_id_t* id,
                          uint32_t h) {
  uint32_t mask = m->hash_cap - 1, tag = slot_tag(h);
  uint32_t s = h & mask;
  for (st__slot_t v; (v = m->hash[s]) != 0; s = (s + 1) & mask)
    if ((v & ST__TAG_MASK) == tag && st__id_eq(&m->mem[slot_idx(v)].id, id))
      break;
  return s;
}

uint32_t st__mem_find(const st_membership_t* m, const st_node_id_t* id) {
  return slot_idx(m->hash[hash_slot(m, id, id_hash(m, id))]);
}

st__mrec_t* st__mem_get(st_membership_t* m, const st_node_id_t* id) {
  uint32_t i = st__mem_find(m, id);
  return i == ST__NONE ? NULL : &m->mem[i];
}

/* Enters member i in the hash; returns its slot. */
static uint32_t hash_put(st_membership_t* m, uint32_t i) {
  uint32_t h = id_hash(m, &m->mem[i].id);
  uint32_t s = hash_slot(m, &m->mem[i].id, h);
  m->hash[s] = (i + 1) << ST__TAG_BITS | slot_tag(h);
  return s;
}

/* Rebuilds the hash after the table's order changed (shuffle, reclaim):
 * O(N), once a probe pass or a reclaim sweep. */
void st__table_rehash(st_membership_t* m) {
  if (m->hash_cap)
    memset(m->hash, 0, (size_t) m->hash_cap * sizeof *m->hash);
  for (uint32_t i = 0; i < m->n_mem; i++) {
    hash_put(m, i);
    st__bc_rehint(m, i);
  }
}

static int table_reserve(st_membership_t* m, uint32_t n) {
  if (n > m->cap_mem) {
    uint32_t cap = m->cap_mem + m->cap_mem / 4 + 16;
    if (cap < n)
      cap = n;
    st__mrec_t* p = realloc(m->mem, (size_t) cap * sizeof *p);
    if (!p)
      return -ENOMEM;
    m->mem = p;
    m->cap_mem = cap;
  }
  /* Load factor at most 1/2: short probe runs, in 4-byte slots. */
  if ((uint64_t) n * 2 > (uint64_t) m->hash_cap) {
    uint32_t hc = m->hash_cap ? m->hash_cap : 16;
    while ((uint64_t) n * 2 > (uint64_t) hc)
      hc *= 2;
    st__slot_t* h = realloc(m->hash, (size_t) hc * sizeof *h);
    if (!h)
      return -ENOMEM;
    m->hash = h;
    m->hash_cap = hc;
    st__table_rehash(m);
  }
  return 0;
}

static void set_slot_idx(st_membership_t* m, uint32_t s, uint32_t i) {
  m->hash[s] = (i + 1) << ST__TAG_BITS | (m->hash[s] & ST__TAG_MASK);
}

/* Swaps members i and j; si is i's slot in the hash. */
static void swap_members(st_membership_t* m, uint32_t i, uint32_t si,
                         uint32_t j) {
  if (i == j)
    return;
  uint32_t sj = hash_slot(m, &m->mem[j].id, id_hash(m, &m->mem[j].id));
  st__mrec_t t = m->mem[i];
  m->mem[i] = m->mem[j];
  m->mem[j] = t;
  set_slot_idx(m, si, j);
  set_slot_idx(m, sj, i);
  st__bc_rehint(m, i);
  st__bc_rehint(m, j);
}

/* Adds a member at a random position of the probe order (memberlist's
 * aliveNode: a newcomer appended at the end would be probed last, or, with
 * many joins at once, many would be probed in a burst). */
st__mrec_t* st__table_add(st_membership_t* m, const st_node_id_t* id) {
  if (m->n_mem >= ST_MEMBERSHIP_MAX_MEMBERS || table_reserve(m, m->n_mem + 1))
    return NULL;
  uint32_t i = m->n_mem++;
  /* The place drawn first, so that loading the record there (a cache
   * miss in a large table) overlaps entering the newcomer in the hash. */
  uint32_t j = (uint32_t) st_rng_below(m->rng, (uint64_t) i + 1);
  __builtin_prefetch(&m->mem[j]);
  __builtin_prefetch((const char*) &m->mem[j] + sizeof *m->mem - 1);
  st__mrec_t* r = &m->mem[i];
  memset(r, 0, sizeof *r);
  r->id = *id;
  r->bcast = r->status = r->susp = ST__NONE;
  uint32_t si = hash_put(m, i);
  swap_members(m, i, si, j);
  return &m->mem[j];
}

/* Keeps a forgotten DEAD member's id and address in the ring of graves,
 * for reconnect attempts after a partition (membership_gossip.c). */
static void bury(st_membership_t* m, uint64_t now, const st__mrec_t* r) {
  if (!m->grave) {
    m->grave = malloc(ST_MEMBERSHIP_GRAVES * sizeof *m->grave);
    if (!m->grave)
      return;
  }
  /* A free slot, or the oldest grave's. */
  st__grave_t* g = &m->grave[0];
  if (m->n_grave < ST_MEMBERSHIP_GRAVES)
    g = &m->grave[m->n_grave++];
  else
    for (uint32_t i = 1; i < m->n_grave; i++)
      if (m->grave[i].at_ms < g->at_ms)
        g = &m->grave[i];
  g->id = r->id;
  st__rec_addr(r, &g->addr);
  g->incarnation = r->incarnation;
  g->at_ms = now;
}

/* Forgets members dead or left for dead_reclaim_ms: a stable compaction,
 * so the probe order of the others holds. */
void st__reclaim(st_membership_t* m, uint64_t now) {
  uint32_t w = 0, before_probe = 0;
  for (uint32_t i = 0; i < m->n_mem; i++) {
    st__mrec_t* r = &m->mem[i];
    bool gone = st__is_down(r->state) && !st__id_eq(&r->id, &m->self) &&
                now >= r->since_ms + m->cfg.dead_reclaim_ms;
    if (gone) {
      if (r->state == ST_MEMBER_DEAD &&
          !st__tombstoned(m, &r->id, r->incarnation, now))
        bury(m, now, r);
      st__bc_drop(m, &r->bcast);
      if (r->status != ST__NONE) {
        st__status_t* s = &m->statuses[r->status];
        st__bc_drop(m, &s->bcast);
        s->used = false;
        s->bcast = m->status_free;
        m->status_free = r->status;
      }
      st__susp_stop(m, r);
      if (i < m->probe_index)
        before_probe++;
      m->n_down--;
      continue;
    }
    if (w != i)
      m->mem[w] = *r;
    w++;
  }
  if (w == m->n_mem)
    return;
  m->n_mem = w;
  m->probe_index -= before_probe;
  st__table_rehash(m);
}

uint32_t st__n_estimate(const st_membership_t* m) {
  return m->n_mem;
}

/* ==== Actions ===============================================================
 */

static int arena_put(st_membership_t* m, const uint8_t* data, size_t len,
                     size_t* off) {
  if (m->arena_len + len > m->arena_cap) {
    size_t cap = m->arena_cap ? m->arena_cap : 4096;
    while (cap < m->arena_len + len)
      cap *= 2;
    uint8_t* p = realloc(m->arena, cap);
    if (!p)
      return -ENOMEM;
    m->arena = p;
    m->arena_cap = cap;
  }
  *off = m->arena_len;
  if (len)
    memcpy(m->arena + m->arena_len, data, len);
  m->arena_len += len;
  return 0;
}

int st__push_action(st_membership_t* m, const st_maction_t* a,
                    const uint8_t* data, size_t len) {
  if (m->q_len == m->q_cap) {
    size_t cap = m->q_cap ? m->q_cap * 2 : 16;
    st__qaction_t* q = realloc(m->q, cap * sizeof *q);
    if (!q)
      return -ENOMEM;
    m->q = q;
    m->q_cap = cap;
  }
  size_t off = 0;
  if (len && arena_put(m, data, len, &off))
    return -ENOMEM;
  st__qaction_t* e = &m->q[m->q_len++];
  e->a = *a;
  e->a.data = NULL;
  e->a.len = len;
  e->off = off;
  if (a->kind == ST_MACT_SEND) {
    m->stats.packets_out++;
    m->stats.bytes_out += len;
  }
  return 0;
}

void st__materialize(const st_membership_t* m, const st__mrec_t* r,
                     st_member_t* out) {
  memset(out, 0, sizeof *out);
  out->id = r->id;
  st__rec_addr(r, &out->addr);
  memcpy(out->public_key, r->pk, sizeof out->public_key);
  out->incarnation = r->incarnation;
  out->state = (st_member_state_t) r->state;
  out->state_since_ms = r->since_ms;
  if (r->status != ST__NONE) {
    out->has_status = true;
    out->status = m->statuses[r->status].rec;
  }
}

void st__emit_member(st_membership_t* m, const st__mrec_t* r) {
  st_maction_t a;
  memset(&a, 0, sizeof a);
  a.kind = ST_MACT_MEMBER;
  st__materialize(m, r, &a.member);
  (void) st__push_action(m, &a, NULL, 0);
}

bool st_membership_next_action(st_membership_t* m, st_maction_t* out) {
  if (m->q_head == m->q_len) {
    /* Drained: the bytes of the last action are no longer borrowed. */
    m->q_head = m->q_len = 0;
    m->arena_len = 0;
    if (m->q_cap > ST_MEMBERSHIP_KEEP_ACTIONS) {
      free(m->q);
      m->q = NULL;
      m->q_cap = 0;
    }
    if (m->arena_cap > ST_MEMBERSHIP_KEEP_ARENA_BYTES) {
      free(m->arena);
      m->arena = NULL;
      m->arena_cap = 0;
    }
    return false;
  }
  const st__qaction_t* e = &m->q[m->q_head++];
  *out = e->a;
  out->data = e->a.len ? m->arena + e->off : NULL;
  return true;
}

/* ==== Event bracket =========================================================
 */

static void begin(st_membership_t* m, uint64_t now) {
  /* Woken more than a probe interval after the deadline we asked for:
   * this process stalled (membership_probe.c, st__stall). */
  if (m->timer_emitted != 0 &&
      now > m->timer_emitted + m->cfg.probe_interval_ms)
    st__stall(m, now, now - m->timer_emitted);
  if (m->next_probe_at == 0) {
    /* First event: stagger the periodic timers by a random fraction of
     * their period (memberlist's schedule), so machines started together
     * do not probe and gossip in lock step. */
    uint64_t pi = m->cfg.probe_interval_ms;
    m->next_probe_at = now + 1 + st_rng_below(m->rng, pi);
    m->next_push_pull_at = 0;
    if (m->cfg.push_pull_interval_ms)
      m->next_push_pull_at =
          now + 1 + st_rng_below(m->rng, st__push_pull_interval_ms(m));
  }
}

static uint64_t earliest(const st_membership_t* m) {
  uint64_t t = m->next_probe_at;
#define ST__MIN(x)           \
  do {                       \
    if ((x) != 0 && (x) < t) \
      t = (x);               \
  } while (0)
  if (m->probing) {
    if (!m->probe_acked && !m->probe_indirect)
      ST__MIN(m->probe_timeout_at);
    ST__MIN(m->probe_end_at);
  }
  if (m->bc_pending)
    ST__MIN(m->next_gossip_at);
  ST__MIN(m->next_push_pull_at);
  ST__MIN(m->next_reclaim_at);
  if (m->susp_min_at != UINT64_MAX)
    ST__MIN(m->susp_min_at);
  /* After every event: skip the 64 slots (88 cache lines) when none is in
   * use, as nearly always. */
  for (uint32_t i = 0; m->n_relays && i < ST_MEMBERSHIP_MAX_RELAYS; i++) {
    const st__relay_t* r = &m->relays[i];
    if (!r->used)
      continue;
    if (r->want_nack && !r->nack_sent)
      ST__MIN(r->nack_at_ms);
    ST__MIN(r->expire_ms);
  }
#undef ST__MIN
  return t;
}

/* After every event: arm the reclaim sweep when someone is down, and tell
 * the driver the earliest deadline when it moved. */
static void finish(st_membership_t* m, uint64_t now) {
  if (m->next_reclaim_at == 0 && m->n_down > 0)
    m->next_reclaim_at = now + m->cfg.dead_reclaim_ms / 2 + 1;
  st__bc_shrink(m);
  if (m->bc_pending && m->next_gossip_at == 0)
    m->next_gossip_at = now + m->cfg.gossip_interval_ms;
  uint64_t t = earliest(m);
  if (t != m->timer_emitted) {
    st_maction_t a;
    memset(&a, 0, sizeof a);
    a.kind = ST_MACT_TIMER;
    a.at_ms = t;
    if (st__push_action(m, &a, NULL, 0) == 0)
      m->timer_emitted = t;
  }
}

/* ==== Creation ==============================================================
 */

void st_membership_set_admit(st_membership_t* m, st_membership_admit_fn fn,
                             void* ctx) {
  if (m == NULL)
    return;
  m->admit = fn;
  m->admit_ctx = ctx;
}

int st_membership_new(const st_membership_config_t* cfg,
                      const st_node_id_t* self, const st_wire_addr_t* addr,
                      const uint8_t public_key[ST_PUBLIC_KEY_BYTES],
                      uint32_t boot_epoch, st_rng_t* rng,
                      st_membership_t** out) {
  if (!cfg || !self || !addr || !public_key || !rng || !out ||
      !config_ok(cfg) || (addr->ip_len != 4 && addr->ip_len != 16))
    return -EINVAL;
  st_membership_t* m = calloc(1, sizeof *m);
  if (!m)
    return -ENOMEM;
  m->cfg = *cfg;
  m->rng = rng;
  m->hash_key = st_rng_next(rng);
  m->boot_epoch = boot_epoch;
  m->self = *self;
  m->susp_min_at = UINT64_MAX;
  m->status_free = ST__NONE;
  if (st__bc_init(m) || table_reserve(m, 1)) {
    st_membership_free(m);
    return -ENOMEM;
  }
  st__mrec_t* r = st__table_add(m, self);
  if (!r) {
    st_membership_free(m);
    return -ENOMEM;
  }
  r->incarnation = (uint64_t) boot_epoch << 32;
  r->state = ST_MEMBER_ALIVE;
  memcpy(r->pk, public_key, ST_PUBLIC_KEY_BYTES);
  st__rec_set_addr(r, addr);
  m->n_alive = 1;
  st__sign_self(m); /* zeros until st_membership_set_signer */
  *out = m;
  return 0;
}

void st_membership_free(st_membership_t* m) {
  if (!m)
    return;
  free(m->mem);
  free(m->hash);
  free(m->susp);
  free(m->statuses);
  free(m->bc);
  free(m->bc_head);
  free(m->q);
  free(m->arena);
  free(m->grave);
  free(m->tomb);
  free(m);
}

/* ==== Events ================================================================
 */

int st_membership_join(st_membership_t* m, uint64_t now_ms,
                       const st_wire_addr_t* seeds, size_t n_seeds) {
  if (!m || (n_seeds && !seeds) || n_seeds > ST_MEMBERSHIP_MAX_SEEDS)
    return -EINVAL;
  begin(m, now_ms);
  int rc = 0;
  m->joined = true;
  m->announce = n_seeds > 0;
  /* The joiner pushes its state to each seed and merges the replies; its
   * ALIVE is then gossiped by the seeds (who learn it from the push) and
   * by itself, queued here. */
  st__mrec_t* me = st__mem_get(m, &m->self);
  st__bc_queue_member(m, me, &m->self);
  static const st_node_id_t unknown;
  for (size_t i = 0; i < n_seeds && rc == 0; i++) {
    if (seeds[i].ip_len != 4 && seeds[i].ip_len != 16) {
      rc = -EINVAL;
      break;
    }
    rc = st__push_pull_send(m, &seeds[i], &unknown, false);
  }
  finish(m, now_ms);
  return rc;
}

int st_membership_leave(st_membership_t* m, uint64_t now_ms) {
  if (!m)
    return -EINVAL;
  begin(m, now_ms);
  if (!m->leaving) {
    m->leaving = true;
    m->probing = false;
    st__mrec_t* me = st__mem_get(m, &m->self);
    st__set_state(m, now_ms, me, ST_MEMBER_LEFT);
    st__sign_self(m); /* our record now holds our signed leave */
    st__bc_queue_member(m, me, &m->self);
    st__emit_member(m, me);
    /* Tell a few members now rather than at the next gossip tick. */
    st__gossip_tick(m, now_ms);
  }
  finish(m, now_ms);
  return 0;
}

/* ---- Force-leave ------------------------------------------------------- */

bool st__tombstoned(const st_membership_t* m, const st_node_id_t* id,
                    uint64_t incarnation, uint64_t now) {
  for (uint32_t i = 0; i < m->n_tomb; i++) {
    const st__tomb_t* t = &m->tomb[i];
    if (st__id_eq(&t->id, id) && incarnation <= t->incarnation &&
        now < t->at_ms + ST_MEMBERSHIP_GRAVE_KEEP_MS)
      return true;
  }
  return false;
}

/* Records the tombstone: a free or expired slot, or the oldest. */
static int entomb(st_membership_t* m, uint64_t now, const st_node_id_t* id,
                  uint64_t incarnation) {
  if (!m->tomb) {
    m->tomb = malloc(ST_MEMBERSHIP_GRAVES * sizeof *m->tomb);
    if (!m->tomb)
      return -ENOMEM;
  }
  st__tomb_t* t = &m->tomb[0];
  if (m->n_tomb < ST_MEMBERSHIP_GRAVES)
    t = &m->tomb[m->n_tomb++];
  else
    for (uint32_t i = 1; i < m->n_tomb; i++)
      if (m->tomb[i].at_ms < t->at_ms)
        t = &m->tomb[i];
  t->id = *id;
  t->incarnation = incarnation;
  t->at_ms = now;
  return 0;
}

int st_membership_force_leave(st_membership_t* m, uint64_t now_ms,
                              const st_node_id_t* id) {
  if (!m || !id || st__id_eq(id, &m->self))
    return -EINVAL;
  st__mrec_t* r = st__mem_get(m, id);
  if (r && (r->state == ST_MEMBER_ALIVE || r->state == ST_MEMBER_SUSPECT))
    return -EBUSY;
  uint32_t g = 0;
  while (g < m->n_grave && !st__id_eq(&m->grave[g].id, id))
    g++;
  if (!r && g == m->n_grave)
    return -ENOENT;
  begin(m, now_ms);
  int rc = entomb(m, now_ms, id, r ? r->incarnation : m->grave[g].incarnation);
  if (rc == 0 && g < m->n_grave)
    m->grave[g] = m->grave[--m->n_grave];
  if (rc == 0 && r) {
    /* Due now: the next sweep forgets it (and, entombed, buries it not). */
    r->since_ms =
        now_ms >= m->cfg.dead_reclaim_ms ? now_ms - m->cfg.dead_reclaim_ms : 0;
    st__reclaim(m, now_ms);
  }
  finish(m, now_ms);
  return rc;
}

size_t st_membership_graves(const st_membership_t* m, st_node_id_t* ids,
                            size_t max) {
  size_t n = 0;
  for (uint32_t i = 0; m && i < m->n_grave && n < max; i++)
    ids[n++] = m->grave[i].id;
  return n;
}

/* The member a gossiped update names, or NULL. */
static const st_node_id_t* msg_node(const st_msg_t* msg) {
  switch (msg->type) {
    case ST_MSG_ALIVE:
      return &msg->u.alive.node;
    case ST_MSG_SUSPECT:
      return &msg->u.suspect.node;
    case ST_MSG_DEAD:
      return &msg->u.dead.node;
    case ST_MSG_STATUS:
      return &msg->u.status.node;
    default:
      return NULL;
  }
}

/* Starts the cache misses of a batch's lookups while it is decoded: the
 * hash slot of each member named as soon as its message is decoded, and
 * the record its home slot points to two messages later (the slot loaded
 * by then), so that both overlap the decoding; the last two records after
 * the batch. Only hints to the processor: nothing here changes state. */
#define ST__RECORD_LAG 2u

static void prefetch_slot(const st_membership_t* m, const st_msg_t* msg,
                          uint32_t* h) {
  const st_node_id_t* id = msg_node(msg);
  if (!id || m->hash_cap == 0)
    return;
  *h = id_hash(m, id);
  __builtin_prefetch(&m->hash[*h & (m->hash_cap - 1)]);
}

static void prefetch_record(const st_membership_t* m, const st_msg_t* msg,
                            uint32_t h) {
  if (m->hash_cap == 0 || !msg_node(msg))
    return;
  st__slot_t v = m->hash[h & (m->hash_cap - 1)];
  if (v != 0 && (v & ST__TAG_MASK) == slot_tag(h))
    __builtin_prefetch(&m->mem[slot_idx(v)]);
}

/* The same for a push-pull's entries, a pipeline as they are walked in
 * order: while entry i is handled, the hash slot of entry i + 8 and the
 * record of entry i + 4 (its slot fetched four entries ago) are loaded. */
static void prefetch_entries(const st_membership_t* m,
                             const st_push_pull_entry_t* e, uint32_t i,
                             uint32_t n) {
  if (m->hash_cap == 0)
    return;
  uint32_t mask = m->hash_cap - 1;
  if (i + 8 < n)
    __builtin_prefetch(&m->hash[id_hash(m, &e[i + 8].node) & mask]);
  if (i + 4 < n) {
    uint32_t h = id_hash(m, &e[i + 4].node);
    st__slot_t v = m->hash[h & mask];
    if (v != 0 && (v & ST__TAG_MASK) == slot_tag(h))
      __builtin_prefetch(&m->mem[slot_idx(v)]);
  }
}

static void dispatch(st_membership_t* m, uint64_t now, const st_node_id_t* from,
                     const st_wire_addr_t* from_addr, const st_msg_t* msg) {
  switch (msg->type) {
    case ST_MSG_PING:
      st__on_ping(m, now, from, from_addr, &msg->u.ping);
      break;
    case ST_MSG_PING_REQ:
      st__on_ping_req(m, now, from, from_addr, &msg->u.ping_req);
      break;
    case ST_MSG_ACK:
      st__on_ack(m, now, from, msg->u.ack.seq);
      break;
    case ST_MSG_NACK:
      st__on_nack(m, now, from, msg->u.nack.seq);
      break;
    case ST_MSG_ALIVE:
      st__on_alive(m, now, &msg->u.alive);
      break;
    case ST_MSG_SUSPECT:
      st__on_suspect(m, now, &msg->u.suspect);
      break;
    case ST_MSG_DEAD:
      st__on_dead(m, now, &msg->u.dead);
      break;
    case ST_MSG_STATUS:
      st__on_status(m, now, &msg->u.status);
      break;
    default:
      /* Well formed, but no business in a membership packet (handshake,
       * tensor chunk, push-pull): unknown to this machine. */
      m->counters.drops[ST_WIRE_DROP_UNKNOWN_TYPE]++;
      break;
  }
}

/* A packet straight from a member we hold suspect (its sender id is
 * authenticated: this is the member speaking) is evidence that it lives,
 * but only the member may say so, with a newer incarnation. So tell it of
 * the suspicion (Lifeguard's buddy system, applied to every packet it
 * sends us, not only to our probes of it): it refutes, or, when it has
 * refuted already and we missed that, sends its ALIVE straight back
 * (membership_rules.c, tell_alive). One packet per packet it sends us
 * while the suspicion lasts; a crashed member sends nothing. */
static void ask_suspect(st_membership_t* m, const st_node_id_t* from) {
  const st__mrec_t* r = st__mem_get(m, from);
  if (!r || r->state != ST_MEMBER_SUSPECT || m->leaving)
    return;
  st_msg_t sus;
  memset(&sus, 0, sizeof sus);
  sus.type = ST_MSG_SUSPECT;
  sus.u.suspect.node = r->id;
  sus.u.suspect.incarnation = r->incarnation;
  sus.u.suspect.from = m->self;
  st_wire_addr_t to;
  st__rec_addr(r, &to);
  st_node_id_t id = r->id;
  m->stats.buddy_asks++;
  (void) st__send_packet(m, &to, &id, &sus, NULL);
}

int st_membership_packet(st_membership_t* m, uint64_t now_ms,
                         const st_node_id_t* from,
                         const st_wire_addr_t* from_addr, const uint8_t* data,
                         size_t len) {
  if (!m || !from || !from_addr || (len && !data))
    return -EINVAL;
  begin(m, now_ms);
  m->stats.packets_in++;
  int rc = 0;
  if (len == 0 || len > ST_PACKET_MAX_PLAINTEXT) {
    m->counters.drops[len ? ST_WIRE_DROP_LIMIT : ST_WIRE_DROP_MALFORMED]++;
    rc = -EBADMSG;
  } else if (st__id_eq(from, &m->self)) {
    /* Our own id from elsewhere: a replay or an impostor. */
    m->counters.drops[ST_WIRE_DROP_FIELD]++;
    rc = -EBADMSG;
  }
  size_t off = 0;
  while (rc == 0 && off < len) {
    /* Decode a batch ahead of dispatching it, so that its lookups
     * overlap (prefetch_slot, prefetch_record); the rules still run in
     * packet order. */
    st_msg_t msgs[ST__DECODE_BATCH];
    uint32_t n = 0, h[ST__DECODE_BATCH];
    int d = 0;
    while (n < ST__DECODE_BATCH && off < len) {
      size_t used = 0;
      d = st_wire_decode_next(data + off, len - off, &msgs[n], &used,
                              &m->counters);
      if (d != 0)
        break;
      prefetch_slot(m, &msgs[n], &h[n]);
      if (n >= ST__RECORD_LAG)
        prefetch_record(m, &msgs[n - ST__RECORD_LAG], h[n - ST__RECORD_LAG]);
      n++;
      off += used;
    }
    for (uint32_t i = n > ST__RECORD_LAG ? n - ST__RECORD_LAG : 0; i < n; i++)
      prefetch_record(m, &msgs[i], h[i]);
    for (uint32_t i = 0; i < n; i++) {
      dispatch(m, now_ms, from, from_addr, &msgs[i]);
      st_wire_msg_free(&msgs[i]);
    }
    if (d != 0)
      rc = -EBADMSG; /* counted by the decoder; the rest is unreadable */
  }
  if (rc == 0)
    ask_suspect(m, from);
  finish(m, now_ms);
  return rc;
}

int st_membership_push_pull_in(st_membership_t* m, uint64_t now_ms,
                               const st_wire_addr_t* from_addr,
                               const uint8_t* data, size_t len) {
  if (!m || !from_addr || (len && !data))
    return -EINVAL;
  begin(m, now_ms);
  st_msg_t msg;
  int rc = st_wire_decode(data, len, &msg, &m->counters);
  if (rc != 0) {
    rc = -EBADMSG;
  } else if (msg.type != ST_MSG_PUSH_PULL) {
    m->counters.drops[ST_WIRE_DROP_UNKNOWN_TYPE]++;
    rc = -EBADMSG;
  } else {
    m->stats.push_pulls_in++;
    const st_msg_push_pull_t* pp = &msg.u.push_pull;
    /* Reply with our state as it was before the merge, as memberlist does
     * (the peer has its own entries already). */
    if (!pp->is_reply) {
      static const st_node_id_t unknown;
      rc = st__push_pull_send(m, from_addr, &unknown, true);
    }
    /* Changes merged are gossiped on, as memberlist does, except the
     * members a joiner learns from its seed's reply when there are more
     * than ST_MEMBERSHIP_QUIET_JOIN of them: all are news to the joiner
     * alone, and queueing them would fill its every packet for
     * N * retransmits / (15 updates a packet * 15 packets a second)
     * seconds (a minute at 1,000 members, fifteen at 10,000) and bury its
     * own ALIVE. In a small cluster, or one bootstrapping in a burst, the
     * joiners' gossip is what tells the earlier joiners of each other. */
    /* Room for every entry at once: the table then grows once, exactly,
     * instead of by quarters with up to a quarter left unused. */
    uint64_t want = m->n_mem;
    for (uint32_t i = 0; i < pp->n_entries; i++) {
      prefetch_entries(m, pp->entries, i, pp->n_entries);
      want += st__mem_find(m, &pp->entries[i].node) == ST__NONE;
    }
    (void) table_reserve(m, (uint32_t) (want < ST_MEMBERSHIP_MAX_MEMBERS
                                            ? want
                                            : ST_MEMBERSHIP_MAX_MEMBERS));
    m->quiet_merge =
        pp->is_reply && m->announce && pp->n_entries > ST_MEMBERSHIP_QUIET_JOIN;
    for (uint32_t i = 0; i < pp->n_entries; i++) {
      prefetch_entries(m, pp->entries, i, pp->n_entries);
      st__merge_entry(m, now_ms, &pp->entries[i]);
    }
    m->quiet_merge = false;
    /* A joiner's own ALIVE goes first, ahead of the cluster it merged. */
    if (pp->is_reply && m->announce) {
      m->announce = false;
      st__bc_queue_member(m, st__mem_get(m, &m->self), &m->self);
      /* This reply was a full push-pull: the next is due one interval on,
       * scaled to the cluster just learned (at random within it, so that
       * joiners stay out of step), not the unscaled one drawn at start. */
      if (m->cfg.push_pull_interval_ms)
        m->next_push_pull_at =
            now_ms + 1 + st_rng_below(m->rng, st__push_pull_interval_ms(m));
    }
  }
  st_wire_msg_free(&msg);
  finish(m, now_ms);
  return rc;
}

int st_membership_tick(st_membership_t* m, uint64_t now_ms) {
  if (!m)
    return -EINVAL;
  begin(m, now_ms);
  st__relay_tick(m, now_ms);
  st__susp_tick(m, now_ms);
  st__probe_tick(m, now_ms);
  if (m->bc_pending && m->next_gossip_at && now_ms >= m->next_gossip_at) {
    st__gossip_tick(m, now_ms);
    m->next_gossip_at = m->bc_pending ? now_ms + m->cfg.gossip_interval_ms : 0;
  }
  if (m->next_push_pull_at && now_ms >= m->next_push_pull_at) {
    st__push_pull_tick(m, now_ms);
    m->next_push_pull_at = now_ms + st__push_pull_interval_ms(m);
  }
  if (m->next_reclaim_at && now_ms >= m->next_reclaim_at) {
    m->next_reclaim_at = 0;
    st__reclaim(m, now_ms);
  }
  finish(m, now_ms);
  return 0;
}

int st_membership_set_status(st_membership_t* m, uint64_t now_ms,
                             const st_msg_status_t* status) {
  if (!m || !status)
    return -EINVAL;
  begin(m, now_ms);
  st__mrec_t* me = st__mem_get(m, &m->self);
  uint64_t last = (uint64_t) m->boot_epoch << 32;
  if (me->status != ST__NONE && m->statuses[me->status].rec.seq > last)
    last = m->statuses[me->status].rec.seq;
  st_msg_status_t s = *status;
  s.node = m->self;
  /* The sequence carries the boot epoch in its high bits, like the
   * incarnation, so a restarted node's records are newer than its old
   * ones; a caller's larger seq is kept. */
  if (s.seq <= last)
    s.seq = last < UINT64_MAX ? last + 1 : last;
  st__sign_status(m, &s);
  if (me->status == ST__NONE && st__status_alloc(m, me)) {
    finish(m, now_ms);
    return -ENOMEM;
  }
  m->statuses[me->status].rec = s;
  st__bc_queue_status(m, me->status);
  st__emit_member(m, me);
  finish(m, now_ms);
  return 0;
}

int st_membership_probe_hint(st_membership_t* m, uint64_t now_ms,
                             const st_node_id_t* id) {
  if (!m || !id)
    return -EINVAL;
  st__mrec_t* r = st__mem_get(m, id);
  if (!r || st__id_eq(id, &m->self) ||
      (r->state != ST_MEMBER_ALIVE && r->state != ST_MEMBER_SUSPECT))
    return -ENOENT;
  begin(m, now_ms);
  /* The table is the probe order: move the member to the next place to be
   * probed in this pass (the place before it when it was probed already,
   * swapping with a member this pass has seen). */
  uint32_t i = (uint32_t) (r - m->mem);
  if (i < m->probe_index)
    m->probe_index--;
  uint32_t j = m->probe_index;
  if (i != j) {
    st__mrec_t t = m->mem[i];
    m->mem[i] = m->mem[j];
    m->mem[j] = t;
    st__table_rehash(m);
  }
  m->stats.probe_hints++;
  finish(m, now_ms);
  return 0;
}

/* ==== Queries ===============================================================
 */

size_t st_membership_count(const st_membership_t* m) {
  return m->n_mem;
}

/* The table is compact; a query returns a copy from a small ring. */
static const st_member_t* view(const st_membership_t* cm, uint32_t i) {
  st_membership_t* m = (st_membership_t*) cm;
  st_member_t* v = &m->view[m->view_next++ % 4];
  st__materialize(m, &m->mem[i], v);
  return v;
}

const st_member_t* st_membership_at(const st_membership_t* m, size_t i) {
  if (!m || i >= m->n_mem)
    return NULL;
  return view(m, (uint32_t) i);
}

const st_member_t* st_membership_find(const st_membership_t* m,
                                      const st_node_id_t* id) {
  if (!m || !id)
    return NULL;
  uint32_t i = st__mem_find(m, id);
  return i == ST__NONE ? NULL : view(m, i);
}

size_t st_membership_alive_count(const st_membership_t* m) {
  return m->n_alive;
}

uint32_t st_membership_health(const st_membership_t* m) {
  return m->awareness;
}

const st_wire_counters_t* st_membership_counters(const st_membership_t* m) {
  return &m->counters;
}

const st__membership_stats_t* st__membership_stats(const st_membership_t* m) {
  return &m->stats;
}
