/* sim_node.c: one simulated node's life and the driver loop that feeds its
 * membership machine (gossip/gossip.h) and carries out what it asks.
 *
 * The driver contract is the daemon's: every event goes in with the
 * current virtual time in milliseconds, then the actions are drained in
 * order. SEND becomes a packet on the modelled network, PUSH_PULL a stream,
 * TIMER a tick in the event queue, MEMBER an observation for the metrics.
 * A node keeps one pending tick, at the time of its machine's latest TIMER
 * request (the machine reports its earliest deadline whenever it moves).
 * Should a tick leave no deadline pending, the driver ticks again one
 * gossip interval later and counts it (timer_stalls): a machine that
 * forgets its timer would otherwise fall silent without a trace.
 *
 * Lives: a node is UNSTARTED until its scripted start, then UP; a crash
 * frees its machine at once (nothing more is sent or answered); a restart
 * builds a fresh machine with the same identity and boot epoch + 1, which
 * joins through up to three random running seeds. A leave asks the machine
 * to leave, lets it gossip its farewell for two seconds, then stops it. A
 * pause freezes the node: no ticks, and packets and streams that reach it
 * wait in a backlog. On resume the overdue timer fires first and only then
 * is the backlog delivered, in arrival order, as a stalled process finds
 * its timers expired before it reads its socket. */
#include "tools/sim/sim.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A leaver keeps gossiping its farewell this long before its process exits:
 * ten gossip rounds at the default 200 ms. */
#define SIM_LEAVE_LINGER_US 2000000u
/* A (re)started node that still knows nobody else after this long joins
 * again through other seeds (a seed may have been down). */
#define SIM_REJOIN_CHECK_US 5000000u
#define SIM_SEEDS 3

void* st__sim_alloc(st_sim_t* s, size_t n) {
  void* p = malloc(n);
  if (p != NULL)
    s->own_bytes += n;
  return p;
}

void st__sim_free(st_sim_t* s, void* p, size_t n) {
  if (p == NULL)
    return;
  s->own_bytes -= n;
  free(p);
}

int st__sim_schedule(st_sim_t* s, uint64_t at_us, uint32_t kind, uint32_t node,
                     uint64_t arg) {
  st_sim_event_t e = {0};
  e.at_us = at_us < s->now_us ? s->now_us : at_us;
  e.kind = kind;
  e.node = node;
  e.u.arg = arg;
  return st__sim_heap_push(&s->heap, &e);
}

static uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

static uint32_t id_hash(const st_node_id_t* id) {
  uint32_t h;
  memcpy(&h, id->b, sizeof(h));
  return h;
}

/* ==== Identities ======================================================== */

int st__sim_nodes_init(st_sim_t* s) {
  s->nodes = st__sim_alloc(s, (size_t) s->n * sizeof(*s->nodes));
  if (s->nodes == NULL)
    return -ENOMEM;
  memset(s->nodes, 0, (size_t) s->n * sizeof(*s->nodes));
  uint32_t cap = 16;
  while (cap < 2 * s->n)
    cap *= 2;
  s->id_index_cap = cap;
  s->id_index = st__sim_alloc(s, (size_t) cap * sizeof(uint32_t));
  if (s->id_index == NULL)
    return -ENOMEM;
  memset(s->id_index, 0, (size_t) cap * sizeof(uint32_t));
  for (uint32_t i = 0; i < s->n; i++) {
    st_sim_node_t* nd = &s->nodes[i];
    /* A public key drawn from (seed, index), and the node id derived from
     * it as crypto/ derives real ones. Not a valid Ed25519 point: claims
     * are signed with a stand-in (sim_mac). */
    uint64_t x = splitmix(s->opt.seed ^ splitmix((uint64_t) i + 1));
    for (size_t k = 0; k < ST_PUBLIC_KEY_BYTES; k += 8) {
      x = splitmix(x);
      memcpy(nd->public_key + k, &x, 8);
    }
    st_node_id_from_public_key(nd->public_key, &nd->id);
    st__sim_make_addr(i, &nd->addr);
    nd->epoch = 0; /* the first start makes it 1 */
    nd->tracker = -1;
    nd->timer_at_us = UINT64_MAX;
    uint32_t h = id_hash(&nd->id) & (cap - 1);
    while (s->id_index[h] != 0)
      h = (h + 1) & (cap - 1);
    s->id_index[h] = i + 1;
  }
  return 0;
}

int st__sim_node_lookup(const st_sim_t* s, const st_node_id_t* id,
                        uint32_t* idx) {
  uint32_t cap = s->id_index_cap;
  for (uint32_t h = id_hash(id) & (cap - 1);; h = (h + 1) & (cap - 1)) {
    uint32_t v = s->id_index[h];
    if (v == 0)
      return -1;
    if (memcmp(s->nodes[v - 1].id.b, id->b, ST_NODE_ID_BYTES) == 0) {
      *idx = v - 1;
      return 0;
    }
  }
}

static void backlog_free(st_sim_t* s, st_sim_node_t* nd) {
  st_sim_msg_t* m = nd->backlog_head;
  while (m != NULL) {
    st_sim_msg_t* next = m->next;
    st__sim_msg_free(s, m);
    m = next;
  }
  nd->backlog_head = nd->backlog_tail = NULL;
}

void st__sim_nodes_free(st_sim_t* s) {
  if (s->nodes == NULL)
    return;
  for (uint32_t i = 0; i < s->n; i++) {
    st_sim_node_t* nd = &s->nodes[i];
    if (nd->m != NULL)
      st_membership_free(nd->m);
    nd->m = NULL;
    backlog_free(s, nd);
  }
  st__sim_free(s, s->id_index, (size_t) s->id_index_cap * sizeof(uint32_t));
  st__sim_free(s, s->nodes, (size_t) s->n * sizeof(*s->nodes));
  s->nodes = NULL;
  s->id_index = NULL;
}

/* ==== The driver loop =================================================== */

static bool running(const st_sim_node_t* nd) {
  return nd->life == ST_SIM_UP || nd->life == ST_SIM_LEAVING;
}

static void drain(st_sim_t* s, uint32_t i) {
  st_sim_node_t* nd = &s->nodes[i];
  st_maction_t a;
  while (nd->m != NULL && st_membership_next_action(nd->m, &a)) {
    uint32_t to;
    switch (a.kind) {
      case ST_MACT_SEND:
        if (st__sim_addr_index(s, &a.to, &to) == 0) {
          st__sim_send_packet(s, i, to, a.data, a.len);
        } else {
          s->c.packets++;
          s->c.cut++;
        }
        break;
      case ST_MACT_PUSH_PULL:
        if (s->swallow_push_pull) {
          break; /* a warm joiner's push: its seed knows it already */
        }
        if (st__sim_addr_index(s, &a.to, &to) == 0) {
          st__sim_send_stream(s, i, to, a.data, a.len);
        } else {
          s->c.streams++;
          s->c.cut++;
        }
        break;
      case ST_MACT_TIMER: {
        /* The newest request replaces the pending one, earlier or later:
         * the machine reports its earliest deadline only when it moves.
         * The superseded event stays in the queue and is ignored. */
        uint64_t at = a.at_ms * 1000u;
        if (at < s->now_us)
          at = s->now_us;
        if (at != nd->timer_at_us) {
          nd->timer_at_us = at;
          st__sim_schedule(s, at, ST_SIM_EV_TICK, i, nd->life_gen);
        }
        break;
      }
      case ST_MACT_MEMBER:
        st__sim_observe(s, i, &a.member);
        break;
    }
  }
}

static uint64_t now_ms(const st_sim_t* s) {
  return s->now_us / 1000u;
}

static void do_tick(st_sim_t* s, uint32_t i) {
  st_sim_node_t* nd = &s->nodes[i];
  s->in_tick = true;
  st_membership_tick(nd->m, now_ms(s));
  drain(s, i);
  s->in_tick = false;
  if (nd->timer_at_us == UINT64_MAX) {
    s->c.timer_stalls++;
    nd->timer_at_us = s->now_us + 1000u * s->cfg.gossip_interval_ms;
    st__sim_schedule(s, nd->timer_at_us, ST_SIM_EV_TICK, i, nd->life_gen);
  }
}

void st__sim_node_tick(st_sim_t* s, uint32_t i, uint64_t gen, uint64_t at_us) {
  st_sim_node_t* nd = &s->nodes[i];
  if (gen != nd->life_gen || !running(nd) || at_us != nd->timer_at_us) {
    return; /* an older life's, or superseded by an earlier tick */
  }
  nd->timer_at_us = UINT64_MAX;
  if (nd->paused) {
    nd->tick_due = true;
    return;
  }
  do_tick(s, i);
}

static void feed(st_sim_t* s, st_sim_msg_t* m) {
  st_sim_node_t* nd = &s->nodes[m->to];
  const st_sim_node_t* from = &s->nodes[m->from];
  int rc;
  if (m->kind == ST_SIM_EV_PACKET) {
    rc = st_membership_packet(nd->m, now_ms(s), &from->id, &from->addr, m->data,
                              m->len);
  } else {
    rc = st_membership_push_pull_in(nd->m, now_ms(s), &from->addr, m->data,
                                    m->len);
  }
  if (rc != 0)
    s->c.rejected++;
  drain(s, m->to);
}

void st__sim_node_deliver(st_sim_t* s, st_sim_msg_t* m) {
  st_sim_node_t* nd = &s->nodes[m->to];
  if (!running(nd)) {
    s->c.cut++;
    st__sim_msg_free(s, m);
    return;
  }
  if (nd->paused) {
    m->next = NULL;
    if (nd->backlog_tail != NULL) {
      nd->backlog_tail->next = m;
    } else {
      nd->backlog_head = m;
    }
    nd->backlog_tail = m;
    return;
  }
  feed(s, m);
  st__sim_msg_free(s, m);
}

/* ==== Lives ============================================================= */

void st__sim_pick_seeds(st_sim_t* s, uint32_t self, uint32_t* seeds,
                        size_t* n_seeds) {
  size_t k = 0;
  /* Rejection sampling among running nodes, then a scan if the cluster is
   * nearly empty; all draws come from the script's generator. */
  for (int tries = 0; tries < 64 && k < SIM_SEEDS; tries++) {
    uint32_t j = (uint32_t) st_rng_below(&s->script_rng, s->n);
    if (j == self || s->nodes[j].life != ST_SIM_UP)
      continue;
    bool dup = false;
    for (size_t q = 0; q < k; q++)
      dup |= seeds[q] == j;
    if (!dup)
      seeds[k++] = j;
  }
  for (uint32_t j = 0; k == 0 && j < s->n; j++) {
    if (j != self && s->nodes[j].life == ST_SIM_UP)
      seeds[k++] = j;
  }
  *n_seeds = k;
}

static int join(st_sim_t* s, uint32_t i, const uint32_t* seeds,
                size_t n_seeds) {
  st_wire_addr_t addrs[SIM_SEEDS] = {0};
  if (n_seeds > SIM_SEEDS)
    n_seeds = SIM_SEEDS;
  for (size_t k = 0; k < n_seeds; k++)
    addrs[k] = s->nodes[seeds[k]].addr;
  int rc = st_membership_join(s->nodes[i].m, now_ms(s), addrs, n_seeds);
  drain(s, i);
  if (n_seeds > 0) {
    st__sim_schedule(s, s->now_us + SIM_REJOIN_CHECK_US, ST_SIM_EV_REJOIN, i,
                     s->nodes[i].life_gen);
  }
  return rc;
}

/* ==== Warm boot (--warm) ================================================
 *
 * A cluster that has run quietly for a while: every member knows every
 * other alive at its first incarnation. Booting 10,000 nodes by gossip
 * costs O(N^2 log N) messages (each of N joins reaches N nodes, each
 * retransmitted lambda log N times) before the scenario can start; the
 * join scenario measures that. A warm node joins through a seed, the next
 * node by index, that already knows everyone: the seed's reply is the
 * roster below, encoded once and fed to each joiner at once, through the
 * machine's own join path (st_membership_join, st_membership_push_pull_in:
 * merged quietly, as any joiner merges a large reply). Its push to the seed
 * is not sent, since the seed knows it. Each machine then announces its own
 * ALIVE as every joiner does; the others hold it already and stop it. */

/* Signed claims (gossip.h, "Signed claims"). The simulated keys are not
 * Ed25519 points, so a node "signs" with a stand-in, BLAKE2b-512 of its
 * public key and the claim, and verifies by recomputing it: a claim
 * relayed with the wrong signature (a record's signature that does not
 * match its incarnation or address) fails as it would with Ed25519, at a
 * fraction of the cost. */
static void sim_mac(const uint8_t pk[ST_PUBLIC_KEY_BYTES], const uint8_t* msg,
                    size_t len, uint8_t sig[ST_SIGNATURE_BYTES]) {
  uint8_t buf[ST_PUBLIC_KEY_BYTES + ST_MEMBERSHIP_CLAIM_MAX_BYTES];
  if (len > ST_MEMBERSHIP_CLAIM_MAX_BYTES)
    len = ST_MEMBERSHIP_CLAIM_MAX_BYTES;
  memcpy(buf, pk, ST_PUBLIC_KEY_BYTES);
  memcpy(buf + ST_PUBLIC_KEY_BYTES, msg, len);
  st_hash_once(buf, ST_PUBLIC_KEY_BYTES + len, sig, ST_SIGNATURE_BYTES);
}

static void sim_sign(void* ctx, const uint8_t* msg, size_t len,
                     uint8_t sig[ST_SIGNATURE_BYTES]) {
  sim_mac((const uint8_t*) ctx, msg, len, sig);
}

static bool sim_verify(void* ctx, const uint8_t pk[ST_PUBLIC_KEY_BYTES],
                       const uint8_t* msg, size_t len,
                       const uint8_t sig[ST_SIGNATURE_BYTES]) {
  (void) ctx;
  uint8_t want[ST_SIGNATURE_BYTES];
  sim_mac(pk, msg, len, want);
  return memcmp(want, sig, ST_SIGNATURE_BYTES) == 0;
}

int st__sim_warm_reply(st_sim_t* s) {
  if (s->n > ST_WIRE_PUSH_PULL_MAX_ENTRIES)
    return -E2BIG;
  st_push_pull_entry_t* e = calloc(s->n, sizeof(*e));
  size_t cap = 64 + (size_t) s->n * 160; /* 151 bytes an entry at most */
  uint8_t* buf = st__sim_alloc(s, cap);
  if (e == NULL || buf == NULL) {
    free(e);
    st__sim_free(s, buf, cap);
    return -ENOMEM;
  }
  for (uint32_t i = 0; i < s->n; i++) {
    const st_sim_node_t* nd = &s->nodes[i];
    e[i].node = nd->id;
    e[i].incarnation = (uint64_t) 1 << 32; /* boot epoch 1, no refutation */
    e[i].state = ST_MEMBER_ALIVE;
    e[i].addr = nd->addr;
    memcpy(e[i].public_key, nd->public_key, ST_PUBLIC_KEY_BYTES);
    st_msg_alive_t a;
    memset(&a, 0, sizeof(a));
    a.node = nd->id;
    a.incarnation = e[i].incarnation;
    a.addr = nd->addr;
    uint8_t claim[ST_MEMBERSHIP_CLAIM_MAX_BYTES];
    sim_mac(nd->public_key, claim, st_membership_alive_claim(&a, claim),
            e[i].signature);
  }
  st_msg_t msg;
  memset(&msg, 0, sizeof(msg));
  msg.type = ST_MSG_PUSH_PULL;
  msg.u.push_pull.is_reply = true;
  msg.u.push_pull.n_entries = s->n;
  msg.u.push_pull.entries = e;
  size_t len = 0;
  int rc = st_wire_encode(&msg, buf, cap, &len);
  free(e);
  if (rc != 0) {
    st__sim_free(s, buf, cap);
    return rc;
  }
  s->warm_reply = buf;
  s->warm_reply_len = cap; /* the allocation; the message is len bytes */
  s->warm_reply_used = len;
  return 0;
}

static int warm_join(st_sim_t* s, uint32_t i) {
  st_sim_node_t* nd = &s->nodes[i];
  const st_sim_node_t* seed = &s->nodes[(i + 1) % s->n];
  s->swallow_push_pull = true;
  int rc = st_membership_join(nd->m, now_ms(s), &seed->addr, 1);
  drain(s, i);
  s->swallow_push_pull = false;
  if (rc == 0) {
    rc = st_membership_push_pull_in(nd->m, now_ms(s), &seed->addr,
                                    s->warm_reply, s->warm_reply_used);
    drain(s, i);
  }
  return rc;
}

int st__sim_node_start(st_sim_t* s, uint32_t i, const uint32_t* seeds,
                       size_t n_seeds) {
  st_sim_node_t* nd = &s->nodes[i];
  if (running(nd))
    return 0;
  nd->epoch++;
  nd->life_gen++;
  st_rng_seed(&nd->rng, splitmix(s->opt.seed) ^
                            splitmix(((uint64_t) i << 24) + nd->epoch));
  int rc = st_membership_new(&s->cfg, &nd->id, &nd->addr, nd->public_key,
                             nd->epoch, &nd->rng, &nd->m);
  if (rc != 0) {
    fprintf(stderr, "starling-sim: st_membership_new for node %u: %s\n", i,
            strerror(-rc));
    return rc;
  }
  st_membership_signer_t signer = {sim_sign, sim_verify, nd->public_key};
  st_membership_set_signer(nd->m, &signer);
  nd->life = ST_SIM_UP;
  nd->paused = false;
  nd->tick_due = false;
  nd->timer_at_us = UINT64_MAX;
  nd->join_order = s->next_join_order++;
  nd->started_us = s->now_us;
  nd->healthy_from_us = s->now_us + s->grace_us;
  st__sim_running_changed(s, +1);
  if (s->warm_reply != NULL && nd->epoch == 1) {
    rc = warm_join(s, i);
    n_seeds = 1;
  } else {
    rc = join(s, i, seeds, n_seeds);
  }
  if (rc != 0 && n_seeds > 0) {
    fprintf(stderr, "starling-sim: st_membership_join for node %u: %s\n", i,
            strerror(-rc));
  }
  return 0;
}

/* A (re)started node that found nobody joins again through new seeds. */
void st__sim_node_rejoin_check(st_sim_t* s, uint32_t i, uint64_t gen) {
  st_sim_node_t* nd = &s->nodes[i];
  if (gen != nd->life_gen || nd->life != ST_SIM_UP)
    return;
  if (nd->paused || st_membership_alive_count(nd->m) > 1)
    return;
  uint32_t seeds[SIM_SEEDS];
  size_t k;
  st__sim_pick_seeds(s, i, seeds, &k);
  if (k == 0)
    return;
  s->c.join_retries++;
  join(s, i, seeds, k);
}

static void stop_machine(st_sim_t* s, uint32_t i, uint8_t life) {
  st_sim_node_t* nd = &s->nodes[i];
  st_membership_free(nd->m);
  nd->m = NULL;
  nd->life = life;
  nd->paused = false;
  nd->tick_due = false;
  nd->timer_at_us = UINT64_MAX;
  nd->life_gen++;
  backlog_free(s, nd);
  st__sim_running_changed(s, -1);
  st__sim_observer_gone(s, i);
}

void st__sim_node_crash(st_sim_t* s, uint32_t i) {
  if (!running(&s->nodes[i]))
    return;
  stop_machine(s, i, ST_SIM_CRASHED);
}

int st__sim_node_restart(st_sim_t* s, uint32_t i) {
  if (running(&s->nodes[i]))
    stop_machine(s, i, ST_SIM_CRASHED);
  uint32_t seeds[SIM_SEEDS];
  size_t k;
  st__sim_pick_seeds(s, i, seeds, &k);
  s->c.restarts++;
  return st__sim_node_start(s, i, seeds, k);
}

void st__sim_node_leave(st_sim_t* s, uint32_t i) {
  st_sim_node_t* nd = &s->nodes[i];
  if (nd->life != ST_SIM_UP || nd->paused)
    return;
  nd->life = ST_SIM_LEAVING;
  st_membership_leave(nd->m, now_ms(s));
  drain(s, i);
  st__sim_schedule(s, s->now_us + SIM_LEAVE_LINGER_US, ST_SIM_EV_STOP, i,
                   nd->life_gen);
}

void st__sim_node_stop(st_sim_t* s, uint32_t i) {
  if (s->nodes[i].life != ST_SIM_LEAVING)
    return;
  stop_machine(s, i, ST_SIM_LEFT);
}

void st__sim_node_pause(st_sim_t* s, uint32_t i, uint64_t len_us) {
  st_sim_node_t* nd = &s->nodes[i];
  if (nd->life != ST_SIM_UP || nd->paused)
    return;
  nd->paused = true;
  s->c.pauses++;
  st__sim_schedule(s, s->now_us + len_us, ST_SIM_EV_RESUME, i, nd->life_gen);
}

void st__sim_node_resume(st_sim_t* s, uint32_t i, uint64_t gen) {
  st_sim_node_t* nd = &s->nodes[i];
  if (gen != nd->life_gen || !nd->paused)
    return;
  nd->paused = false;
  nd->healthy_from_us = s->now_us + s->grace_us;
  if (nd->tick_due) {
    nd->tick_due = false;
    do_tick(s, i);
  }
  /* The backlog, in arrival order; a delivery may not pause the node
   * again, so the list cannot grow under us. */
  st_sim_msg_t* m = nd->backlog_head;
  nd->backlog_head = nd->backlog_tail = NULL;
  while (m != NULL) {
    st_sim_msg_t* next = m->next;
    if (nd->m != NULL)
      feed(s, m);
    st__sim_msg_free(s, m);
    m = next;
  }
}
