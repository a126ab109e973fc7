/* daemon_net.c: the membership machine over real UDP and real time.
 *
 * Every packet is sealed for the member it goes to (crypto/packet.c) and
 * opened against this node's id and the per-sender replay windows before
 * the membership decoder sees a byte. Joins go over TCP (push-pull to the
 * seeds), so a packet that is not bound to this node (ST_PACKET_TO_UNKNOWN)
 * is dropped and counted. The machine's actions are carried out here:
 * SEND becomes a datagram, PUSH_PULL a connection (daemon_conn.c), TIMER
 * the one membership timer, MEMBER a log line and, for a member gone,
 * forgetting its replay window.
 */
#include "node/daemon/daemon_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static uint32_t heard_slot(const st_node_id_t* id) {
  uint32_t h;
  memcpy(&h, id->b, sizeof(h));
  return h % ST__HEARD_SLOTS;
}

/* The member's slot, made when new; NULL when the table is full (the
 * member is then shown as never heard from). */
static st__heard_t* heard_get(st__daemon_t* d, const st_node_id_t* id) {
  uint32_t s = heard_slot(id);
  for (uint32_t i = 0; i < ST__HEARD_SLOTS; i++) {
    st__heard_t* h = &d->heard[(s + i) % ST__HEARD_SLOTS];
    if (!h->used) {
      h->used = true;
      h->id = *id;
      h->logged_state = -1;
      return h;
    }
    if (memcmp(&h->id, id, sizeof(*id)) == 0)
      return h;
  }
  return NULL;
}

st__heard_t* st__net_heard_slot(st__daemon_t* d, const st_node_id_t* id) {
  return heard_get(d, id);
}

const st__heard_t* st__net_heard_find(const st__daemon_t* d,
                                      const st_node_id_t* id) {
  uint32_t s = heard_slot(id);
  for (uint32_t i = 0; i < ST__HEARD_SLOTS; i++) {
    const st__heard_t* h = &d->heard[(s + i) % ST__HEARD_SLOTS];
    if (!h->used)
      return NULL;
    if (memcmp(&h->id, id, sizeof(*id)) == 0)
      return h;
  }
  return NULL;
}

void st__net_heard(st__daemon_t* d, const st_node_id_t* id) {
  st__heard_t* h = heard_get(d, id);
  if (h != NULL)
    h->at_ms = st__dnow(d);
}

uint64_t st__net_last_heard(const st__daemon_t* d, const st_node_id_t* id) {
  const st__heard_t* h = st__net_heard_find(d, id);
  return h != NULL ? h->at_ms : 0;
}

static bool id_zero(const st_node_id_t* id) {
  static const st_node_id_t zero;
  return memcmp(id, &zero, sizeof(zero)) == 0;
}

void st__net_send_to(st__daemon_t* d, const st_wire_addr_t* addr,
                     const st_node_id_t* to, const uint8_t* data, size_t len) {
  uint8_t out[ST_PACKET_MAX_BYTES];
  size_t out_len = 0;
  int rc = st_packet_seal(&d->sealer, to == NULL || id_zero(to) ? NULL : to,
                          data, len, out, sizeof(out), &out_len);
  if (rc != 0) {
    d->c.udp_send_fail++;
    return;
  }
  struct sockaddr_storage ss;
  st__addr_to_sockaddr(addr, &ss);
  uv_buf_t b = uv_buf_init((char*) out, (unsigned) out_len);
  rc = uv_udp_try_send(&d->udp, &b, 1, (const struct sockaddr*) &ss);
  if (rc < 0) {
    d->c.udp_send_fail++;
    return;
  }
  d->c.packets_out++;
  d->c.bytes_out += out_len;
}

static void send_packet(st__daemon_t* d, const st_maction_t* a) {
  st__net_send_to(d, &a->to, &a->to_id, a->data, a->len);
}

/* The machine asks for a tick only when its earliest deadline moves; one
 * with nothing to wait for (a node alone) asks for none. As the simulator
 * does, the driver then ticks again a gossip interval later, so that a
 * node that was alone notices its first peer. */
#define IDLE_TICK_MS 200u

static void member_timer_cb(uv_timer_t* t) {
  st__daemon_t* d = t->data;
  st_membership_tick(d->m, st__dnow(d));
  st__net_drain(d);
}

static void on_member(st__daemon_t* d, const st_member_t* mb) {
  if (memcmp(&mb->id, &d->ident.id, sizeof(mb->id)) == 0)
    return;
  char id[33], addr[64];
  st_node_id_format(&mb->id, id);
  st__addr_format(&mb->addr, addr, sizeof(addr));
  const char* state = st_member_state_name(mb->state);
  /* The machine reports every change, status records included: log only
   * changes of state. */
  st__heard_t* h = heard_get(d, &mb->id);
  if (h != NULL && h->logged_state == (int) mb->state)
    return;
  if (h != NULL)
    h->logged_state = (int) mb->state;
  st__dlog(d, "member %.12s at %s is %s", id, addr, state);
  st__event(d, "member", "member %.12s at %s is %s", id, addr, state);
  if (mb->state == ST_MEMBER_DEAD || mb->state == ST_MEMBER_LEFT) {
    /* Its next life comes with a higher boot epoch, which the window
     * accepts anyway; forgetting frees the slot for other senders. */
    st_replay_table_forget(d->replay, &mb->id);
    st__ring_on_member_gone(d, &mb->id);
    st__coll_on_member_gone(d, &mb->id, mb->state == ST_MEMBER_LEFT);
  }
}

void st__net_drain(st__daemon_t* d) {
  st_maction_t a;
  bool reply_sent = false;
  while (st_membership_next_action(d->m, &a)) {
    switch (a.kind) {
      case ST_MACT_SEND:
        send_packet(d, &a);
        break;
      case ST_MACT_PUSH_PULL:
        if (d->pp_reply != NULL && !reply_sent) {
          st__conn_send(d->pp_reply, a.data, a.len, false);
          reply_sent = true;
        } else {
          st__conn_t* c =
              st__conn_dial(d, &a.to, id_zero(&a.to_id) ? NULL : &a.to_id,
                            ST__CONN_PUSH_PULL);
          if (c != NULL) {
            c->pp_request = malloc(a.len);
            if (c->pp_request != NULL) {
              memcpy(c->pp_request, a.data, a.len);
              c->pp_len = a.len;
            } else {
              st__conn_close(c);
            }
          }
        }
        break;
      case ST_MACT_TIMER: {
        uint64_t now = st__dnow(d);
        uint64_t delay = a.at_ms > now ? a.at_ms - now : 0;
        uv_timer_start(&d->member_timer, member_timer_cb, delay, 0);
        break;
      }
      case ST_MACT_MEMBER:
        on_member(d, &a.member);
        break;
    }
  }
  if (!uv_is_active((uv_handle_t*) &d->member_timer) &&
      !uv_is_closing((uv_handle_t*) &d->member_timer))
    uv_timer_start(&d->member_timer, member_timer_cb, IDLE_TICK_MS, 0);
}

/* Ring formation messages (RING_PROPOSE .. RING_CANCEL) travel alone in
 * their packets and go to the formation machine; the wire module reads the
 * type from the envelope (any integer encoding), the formation machine
 * decodes (and may refuse) the rest. */
static bool is_ring_form(const uint8_t* p, size_t len) {
  uint64_t type;
  return st_wire_peek_type(p, len, &type) == 0 && type >= ST_MSG_RING_PROPOSE &&
         type <= ST_MSG_RING_CANCEL;
}

static void alloc_cb(uv_handle_t* h, size_t suggested, uv_buf_t* buf) {
  st__daemon_t* d = h->data;
  (void) suggested;
  *buf = uv_buf_init(d->udp_rbuf, sizeof(d->udp_rbuf));
}

static void recv_cb(uv_udp_t* u, ssize_t nread, const uv_buf_t* buf,
                    const struct sockaddr* addr, unsigned flags) {
  st__daemon_t* d = u->data;
  if (nread <= 0 || addr == NULL || d->m == NULL)
    return;
  d->c.packets_in++;
  d->c.bytes_in += (uint64_t) nread;
  if (flags & UV_UDP_PARTIAL) {
    d->cc.drops[ST_DROP_PACKET_LONG]++;
    return;
  }
  uint8_t plain[ST_PACKET_MAX_BYTES];
  size_t plain_len = 0;
  st_packet_header_t hdr;
  int rc = st_packet_open(&d->keys, &d->ident.id, d->allow, d->replay, &d->cc,
                          (const uint8_t*) buf->base, (size_t) nread, plain,
                          sizeof(plain), &plain_len, &hdr);
  if (rc != 0)
    return;
  if (hdr.to_kind != ST_PACKET_TO_NODE) {
    d->c.udp_unbound++;
    return;
  }
  st__net_heard(d, &hdr.sender);
  /* A ring formation message travels alone in its packet. */
  if (plain_len > 2 && is_ring_form(plain, plain_len)) {
    st__ring_on_packet(d, &hdr.sender, plain, plain_len);
    return;
  }
  st_wire_addr_t from;
  st__addr_from_sockaddr(addr, &from);
  st_membership_packet(d->m, st__dnow(d), &hdr.sender, &from, plain, plain_len);
  st__net_drain(d);
}

int st__net_start(st__daemon_t* d, char* err, size_t err_len) {
  struct sockaddr_storage ss;
  st__addr_to_sockaddr(&d->self_addr, &ss);
  int rc = uv_udp_init(&d->loop, &d->udp);
  if (rc == 0)
    rc = uv_udp_bind(&d->udp, (const struct sockaddr*) &ss, 0);
  if (rc != 0) { /* with port 0 the caller tries another port */
    snprintf(err, err_len, "cannot bind UDP %s: %s; %s", d->self_addr_text,
             uv_strerror(rc),
             rc == UV_EADDRNOTAVAIL
                 ? "this machine has no such address: give one of its own "
                   "with --listen"
                 : "is another node using that port? pick another with "
                   "--listen");
    return rc;
  }
  d->udp.data = d;
  return uv_udp_recv_start(&d->udp, alloc_cb, recv_cb);
}
