/* sim_net.c: the simulator's network. Every node has the address
 * 10.a.b.c:7946 where a.b.c is its index, so routing a packet is a
 * decode, not a lookup.
 *
 * UDP packets: the one-way latency is latency_ms plus an exponential jitter
 * of mean jitter_ms, drawn per packet, so packets overtake each other
 * (reordering falls out of the jitter). Each packet is lost with
 * probability `loss` and, if not lost, delivered a second time (with its
 * own latency) with probability `dup`. During a split, packets between the
 * groups are cut; with --one-way only the minority's packets to the
 * majority are.
 *
 * Streams (push-pull over TCP): reliable, never lost or duplicated, but cut
 * by a split or a dead peer like any connection. A stream costs a TCP
 * handshake, the encrypted handshake of crypto/ (three messages) and the
 * data: four one-way latencies plus the bytes at 1 Gbit/s (8 ns a byte).
 *
 * All draws come from the network's own generator, in send order, so the
 * network's history does not depend on how many draws the machines take. */
#include "tools/sim/sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SIM_PORT 7946
#define SIM_STREAM_NS_PER_BYTE 8u

void st__sim_make_addr(uint32_t idx, st_wire_addr_t* a) {
  memset(a, 0, sizeof(*a));
  a->ip_len = 4;
  a->ip[0] = 10;
  a->ip[1] = (uint8_t) (idx >> 16);
  a->ip[2] = (uint8_t) (idx >> 8);
  a->ip[3] = (uint8_t) idx;
  a->port = SIM_PORT;
}

int st__sim_addr_index(const st_sim_t* s, const st_wire_addr_t* a,
                       uint32_t* idx) {
  if (a->ip_len != 4 || a->ip[0] != 10 || a->port != SIM_PORT)
    return -1;
  uint32_t i = ((uint32_t) a->ip[1] << 16) | ((uint32_t) a->ip[2] << 8) |
               (uint32_t) a->ip[3];
  if (i >= s->n)
    return -1;
  *idx = i;
  return 0;
}

uint64_t st__sim_latency_us(st_sim_t* s) {
  double base = s->opt.latency_ms * 1000.0;
  double jitter = 0.0;
  if (s->opt.jitter_ms > 0) {
    /* Exponential by inversion; 1 - u is in (0, 1]. */
    double u = st_rng_uniform(&s->net_rng);
    jitter = -log(1.0 - u) * s->opt.jitter_ms * 1000.0;
  }
  double us = base + jitter;
  return us < 1.0 ? 1 : (uint64_t) us;
}

bool st__sim_reachable(const st_sim_t* s, uint32_t from, uint32_t to) {
  if (!s->split)
    return true;
  uint8_t gf = s->nodes[from].group, gt = s->nodes[to].group;
  if (gf == gt)
    return true;
  /* One-way: group 1 (the minority) cannot reach group 0. */
  if (s->opt.one_way)
    return gf == 0;
  return false;
}

/* Every message up to a packet's size takes a block of this size from
 * the pool (s->packet_pool); larger ones (streams) are their own. */
#define SIM_POOL_BLOCK (sizeof(st_sim_msg_t) + ST_PACKET_MAX_PLAINTEXT)

st_sim_msg_t* st__sim_msg_new(st_sim_t* s, uint8_t kind, uint32_t from,
                              uint32_t to, const uint8_t* data, size_t len) {
  st_sim_msg_t* m;
  if (len <= ST_PACKET_MAX_PLAINTEXT && s->packet_pool != NULL) {
    m = s->packet_pool;
    s->packet_pool = m->next;
  } else {
    m = st__sim_alloc(
        s, len <= ST_PACKET_MAX_PLAINTEXT ? SIM_POOL_BLOCK : sizeof(*m) + len);
    if (m == NULL)
      return NULL;
  }
  m->next = NULL;
  m->from = from;
  m->to = to;
  m->len = (uint32_t) len;
  m->kind = kind;
  memcpy(m->data, data, len);
  return m;
}

void st__sim_msg_free(st_sim_t* s, st_sim_msg_t* m) {
  if (m->len <= ST_PACKET_MAX_PLAINTEXT) {
    m->next = s->packet_pool;
    s->packet_pool = m;
    return;
  }
  st__sim_free(s, m, sizeof(*m) + m->len);
}

void st__sim_packet_pool_free(st_sim_t* s) {
  while (s->packet_pool != NULL) {
    st_sim_msg_t* m = s->packet_pool;
    s->packet_pool = m->next;
    st__sim_free(s, m, SIM_POOL_BLOCK);
  }
}

static void deliver_at(st_sim_t* s, uint8_t kind, uint32_t from, uint32_t to,
                       const uint8_t* data, size_t len, uint64_t delay_us) {
  st_sim_msg_t* m = st__sim_msg_new(s, kind, from, to, data, len);
  if (m == NULL)
    return; /* counted as lost: the run goes on */
  st_sim_event_t e = {0};
  e.at_us = s->now_us + delay_us;
  e.kind = kind;
  e.node = to;
  e.u.msg = m;
  if (st__sim_heap_push(&s->heap, &e) != 0)
    st__sim_msg_free(s, m);
}

void st__sim_send_packet(st_sim_t* s, uint32_t from, uint32_t to,
                         const uint8_t* data, size_t len) {
  s->c.packets++;
  s->c.bytes += len + ST_PACKET_OVERHEAD;
  /* Draw loss and duplication for every packet, cut or not, so that a
   * split does not shift the generator for the rest of the run. */
  double u_loss = st_rng_uniform(&s->net_rng);
  double u_dup = st_rng_uniform(&s->net_rng);
  uint64_t lat = st__sim_latency_us(s);
  if (!st__sim_reachable(s, from, to)) {
    s->c.cut++;
    return;
  }
  if (u_loss < s->opt.loss) {
    s->c.lost++;
    return;
  }
  deliver_at(s, ST_SIM_EV_PACKET, from, to, data, len, lat);
  if (u_dup < s->opt.dup) {
    s->c.duplicated++;
    deliver_at(s, ST_SIM_EV_PACKET, from, to, data, len, st__sim_latency_us(s));
  }
}

void st__sim_send_stream(st_sim_t* s, uint32_t from, uint32_t to,
                         const uint8_t* data, size_t len) {
  s->c.streams++;
  s->c.stream_bytes += len;
  uint64_t delay = 0;
  for (int i = 0; i < 4; i++)
    delay += st__sim_latency_us(s);
  delay += (uint64_t) len * SIM_STREAM_NS_PER_BYTE / 1000u;
  if (!st__sim_reachable(s, from, to) || !st__sim_reachable(s, to, from)) {
    s->c.cut++;
    return;
  }
  deliver_at(s, ST_SIM_EV_STREAM, from, to, data, len, delay);
}
