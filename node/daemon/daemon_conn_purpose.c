/* daemon_conn_purpose.c: what a TCP connection is for, as a table of
 * callbacks (st__conn_ops_t in daemon_internal.h): one const instance each
 * for push-pull (membership's full-state sync), an averaging exchange
 * (daemon_xchg.c), a ring lane (daemon_ring.c), user collectives
 * (daemon_coll.c), a cluster request (daemon_admin_net.c) and a piece of
 * a multi-donor state sync (daemon_sync.c). The dialling
 * side names its purpose; the accepting side learns it from the type of the
 * first message (docs/protocol.md, "Connections, purposes and limits").
 * daemon_conn.c moves the bytes and calls these; nothing here touches a
 * socket.
 */
#include "node/daemon/daemon_internal.h"

#include <errno.h>
#include <stdlib.h>

/* Push-pull, dialling side: the request waits for the stream. */
static int pp_open(st__conn_t* c) {
  int rc = st__conn_send(c, c->pp_request, c->pp_len, false);
  free(c->pp_request);
  c->pp_request = NULL;
  return rc;
}

/* Push-pull: a request (we answer on this connection) or the reply to ours
 * (and then we are done). */
static void pp_frame(st__conn_t* c, const uint8_t* msg, size_t len) {
  st__daemon_t* d = c->d;
  d->pp_reply = c->initiator ? NULL : c;
  st_membership_push_pull_in(d->m, st__dnow(d), &c->peer_addr, msg, len);
  st__net_drain(d);
  d->pp_reply = NULL;
  st__conn_close(c);
}

static int xchg_open(st__conn_t* c) {
  st__xchg_on_ready(c);
  return 0;
}

/* An exchange keeps its own timeout once the stream is open. */
static bool xchg_owns_deadline(const st__conn_t* c) {
  return c->x != NULL;
}

static int ring_open(st__conn_t* c) {
  st__ring_on_ready(c);
  return 0;
}

/* So does a ring round's stream once its round runs. */
static bool ring_owns_deadline(const st__conn_t* c) {
  return c->ring_round != 0;
}

static const st__conn_ops_t pp_ops = {
    .purpose = ST__CONN_PUSH_PULL,
    .dial_deadline_ms = ST__PUSH_PULL_DEADLINE_MS,
    .count_truncated = true,
    .on_open = pp_open,
    .on_frame = pp_frame,
};

static const st__conn_ops_t xchg_ops = {
    .purpose = ST__CONN_XCHG,
    .dial_deadline_ms = ST__HANDSHAKE_DEADLINE_MS,
    .offload_rx = true,
    .on_open = xchg_open,
    .on_frame = st__xchg_on_message,
    .on_sent = st__xchg_on_sent,
    .on_close = st__xchg_on_closed,
    .on_idle = st__xchg_settle,
    .owns_deadline = xchg_owns_deadline,
};

/* A ring lane hears of its end twice, as before: when it is aborted and
 * when its handle is closed (st__ring_on_closed takes both). */
static const st__conn_ops_t ring_ops = {
    .purpose = ST__CONN_RING,
    .dial_deadline_ms = ST__HANDSHAKE_DEADLINE_MS,
    .offload_rx = true,
    .on_open = ring_open,
    .on_frame = st__ring_on_message,
    .on_sent = st__ring_on_sent,
    .on_close = st__ring_on_closed,
    .on_handle_closed = st__ring_on_closed,
    .owns_deadline = ring_owns_deadline,
};

/* User collectives: a dialled connection carries this node's frames to one
 * member and stays open; frames come on the ones the others dialled. An
 * open one keeps no deadline (TCP_USER_TIMEOUT and the failure detector
 * end it). */
static int coll_open(st__conn_t* c) {
  return st__coll_on_open(c);
}

static bool coll_owns_deadline(const st__conn_t* c) {
  (void) c;
  return true;
}

static const st__conn_ops_t coll_ops = {
    .purpose = ST__CONN_COLL,
    .dial_deadline_ms = ST__HANDSHAKE_DEADLINE_MS,
    .offload_rx = true,
    .on_open = coll_open,
    .on_frame = st__coll_on_frame,
    .on_sent = st__coll_on_sent,
    .on_close = st__coll_on_closed,
    .owns_deadline = coll_owns_deadline,
};

/* A cluster request (daemon_admin_net.c): ADMIN_REQ, one ADMIN_REPLY,
 * closed; the connection's deadline covers the whole conversation. */
static const st__conn_ops_t keys_ops = {
    .purpose = ST__CONN_ADMIN,
    .dial_deadline_ms = ST__HANDSHAKE_DEADLINE_MS,
    .on_open = st__admin_on_open,
    .on_frame = st__admin_on_frame,
    .on_close = st__admin_on_closed,
    .on_handle_closed = st__admin_on_closed,
};

/* Multi-donor sync (daemon_sync.c): a manifest (SYNC_REQ, SYNC_REPLY,
 * closed) or a range (SYNC_REQ, SYNC_REPLY, chunks, closed). Both sides
 * move the connection's deadline on with every chunk. */
static const st__conn_ops_t sync_ops = {
    .purpose = ST__CONN_SYNC,
    .dial_deadline_ms = ST__HANDSHAKE_DEADLINE_MS,
    .offload_rx = true,
    .on_open = st__sync_on_open,
    .on_frame = st__sync_on_frame,
    .on_sent = st__sync_on_sent,
    .on_close = st__sync_on_closed,
    .on_handle_closed = st__sync_on_closed,
};

/* The dialler's purpose, by name. */
static const st__conn_ops_t* const ops_by_purpose[ST__CONN_SYNC + 1] = {
    [ST__CONN_UNKNOWN] = NULL,   [ST__CONN_PUSH_PULL] = &pp_ops,
    [ST__CONN_XCHG] = &xchg_ops, [ST__CONN_RING] = &ring_ops,
    [ST__CONN_COLL] = &coll_ops, [ST__CONN_ADMIN] = &keys_ops,
    [ST__CONN_SYNC] = &sync_ops,
};

/* The acceptor's purpose, by the type of the first message. */
static const struct {
  st_msg_type_t type;
  const st__conn_ops_t* ops;
} ops_by_first_message[] = {
    {ST_MSG_PUSH_PULL, &pp_ops},    {ST_MSG_XCHG_REQ, &xchg_ops},
    {ST_MSG_RING_LANE, &ring_ops},  {ST_MSG_COLL_HELLO, &coll_ops},
    {ST_MSG_COLL_SEG, &coll_ops},   {ST_MSG_COLL_ABORT, &coll_ops},
    {ST_MSG_COLL_FETCH, &coll_ops}, {ST_MSG_ADMIN_REQ, &keys_ops},
    {ST_MSG_SYNC_REQ, &sync_ops},
};

const st__conn_ops_t* st__conn_ops_of(st__conn_purpose_t purpose) {
  return purpose <= ST__CONN_SYNC ? ops_by_purpose[purpose] : NULL;
}

st__conn_purpose_t st__conn_purpose(const st__conn_t* c) {
  return c->ops != NULL ? c->ops->purpose : ST__CONN_UNKNOWN;
}

/* The accepting side learns the purpose from the first message. */
int st__conn_learn_purpose(st__conn_t* c, const uint8_t* msg, size_t len) {
  st_msg_t m;
  if (st_wire_decode(msg, len, &m, &c->d->wc) != 0)
    return -EBADMSG;
  st_msg_type_t type = m.type;
  st_wire_msg_free(&m);
  size_t n = sizeof(ops_by_first_message) / sizeof(ops_by_first_message[0]);
  for (size_t i = 0; i < n; i++) {
    if (ops_by_first_message[i].type == type) {
      c->ops = ops_by_first_message[i].ops;
      return 0;
    }
  }
  return -EPROTO;
}
