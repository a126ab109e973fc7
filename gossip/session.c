/* session.c: the framing of a TCP connection's handshake, sans-IO (see
 * "Session framing" in gossip/gossip.h). The protocol is crypto/'s
 * three-message handshake (crypto/handshake.c: Noise-style XX with the
 * cluster key and the nodes' Ed25519 identities); this file only frames
 * it: each message a 4-byte big-endian length and its msgpack encoding
 * (gossip/wire.c), then each side's 24-byte secretstream header once its
 * keys exist. The daemon's connections (node/daemon/daemon_conn.c) and the
 * benchmarks' blocking sockets (tools/bench/bench_io.c) both drive it, so
 * the bytes on the wire come from one place.
 *
 * A unit is one plain frame (length, then body) or the peer's stream
 * header. Input is copied into the framer until the unit is whole, so a
 * caller may feed one byte at a time; the framer never consumes past the
 * unit that completes the session (the peer's header). */
#include <errno.h>
#include <string.h>

#include "gossip/gossip.h"

/* ---- Refusals and output ------------------------------------------------ */

/* Marks f refused: every later call returns err. */
static int fail(st_session_framer_t* f, st_session_drop_t drop, int err) {
  f->phase = ST_SESSION_FAILED;
  f->drop = drop;
  f->err = err;
  if (drop == ST_SESSION_DROP_FRAME_SIZE || drop == ST_SESSION_DROP_MALFORMED)
    if (f->cc != NULL)
      f->cc->drops[ST_DROP_HS_MALFORMED]++;
  st_handshake_wipe(&f->hs);
  st_session_wipe(&f->keys);
  return err;
}

static size_t frame_length(const uint8_t* p) {
  return (size_t) p[0] << 24 | (size_t) p[1] << 16 | (size_t) p[2] << 8 | p[3];
}

/* Queues msg as a plain frame. */
static int queue_frame(st_session_framer_t* f, const st_msg_t* msg) {
  size_t room = sizeof(f->out) - f->out_len;
  if (room < ST_SESSION_LEN_BYTES + ST_SESSION_HS_FRAME_MAX)
    return fail(f, ST_SESSION_DROP_INTERNAL, -ENOBUFS);
  uint8_t* p = f->out + f->out_len;
  size_t len = 0;
  int rc = st_wire_encode(msg, p + ST_SESSION_LEN_BYTES,
                          ST_SESSION_HS_FRAME_MAX, &len);
  if (rc != 0)
    return fail(f, ST_SESSION_DROP_INTERNAL, rc);
  p[0] = (uint8_t) (len >> 24);
  p[1] = (uint8_t) (len >> 16);
  p[2] = (uint8_t) (len >> 8);
  p[3] = (uint8_t) len;
  f->out_len += ST_SESSION_LEN_BYTES + len;
  return 0;
}

/* ---- The handshake's steps ---------------------------------------------- */

/* Our keys exist: check the peer, start our stream, queue its header. The
 * receiving key waits in f->keys until the peer's header arrives. */
static int keyed(st_session_framer_t* f) {
  int rc = st_handshake_finish(&f->hs, &f->keys);
  if (rc != 0)
    return fail(f, ST_SESSION_DROP_HANDSHAKE, rc);
  f->peer = f->keys.peer_id;
  f->peer_known = true;
  if (f->expect_peer && memcmp(&f->peer, &f->expected, sizeof(f->peer)) != 0)
    return fail(f, ST_SESSION_DROP_WRONG_PEER, -EACCES);
  if (sizeof(f->out) - f->out_len < ST_STREAM_HEADER_BYTES)
    return fail(f, ST_SESSION_DROP_INTERNAL, -ENOBUFS);
  rc = st_stream_tx_init(f->tx, f->keys.tx_key, f->out + f->out_len);
  if (rc != 0)
    return fail(f, ST_SESSION_DROP_INTERNAL, rc);
  f->out_len += ST_STREAM_HEADER_BYTES;
  f->phase = ST_SESSION_KEYED;
  return 0;
}

/* The acceptor reads HS1 and answers HS2. */
static int on_hs1(st_session_framer_t* f, const st_msg_t* in) {
  st_msg_t out;
  memset(&out, 0, sizeof(out));
  out.type = ST_MSG_HS2;
  int rc = st_handshake_read_msg1(&f->hs, &in->u.hs1);
  if (rc == 0 && f->admit != NULL && !f->admit(f->admit_arg))
    return fail(f, ST_SESSION_DROP_BUSY, -EBUSY);
  if (rc == 0)
    rc = st_handshake_write_msg2(&f->hs, &out.u.hs2);
  if (rc != 0)
    return fail(f, ST_SESSION_DROP_HANDSHAKE, rc);
  return queue_frame(f, &out);
}

/* The dialler reads HS2, answers HS3 and has its keys. */
static int on_hs2(st_session_framer_t* f, const st_msg_t* in) {
  st_msg_t out;
  memset(&out, 0, sizeof(out));
  out.type = ST_MSG_HS3;
  int rc = st_handshake_read_msg2(&f->hs, &in->u.hs2);
  if (rc == 0)
    rc = st_handshake_write_msg3(&f->hs, &out.u.hs3);
  if (rc != 0)
    return fail(f, ST_SESSION_DROP_HANDSHAKE, rc);
  if ((rc = queue_frame(f, &out)) != 0)
    return rc;
  return keyed(f);
}

/* The acceptor reads HS3 and has its keys. */
static int on_hs3(st_session_framer_t* f, const st_msg_t* in) {
  int rc = st_handshake_read_msg3(&f->hs, &in->u.hs3);
  if (rc != 0)
    return fail(f, ST_SESSION_DROP_HANDSHAKE, rc);
  return keyed(f);
}

/* A whole plain frame: the message this side expects next, or a refusal. */
static int read_frame(st_session_framer_t* f, const uint8_t* body, size_t len) {
  st_msg_t m;
  if (st_wire_decode(body, len, &m, f->wc) != 0)
    return fail(f, ST_SESSION_DROP_MALFORMED, -EBADMSG);
  if (!f->initiator && m.type == ST_MSG_HS1)
    return on_hs1(f, &m);
  if (f->initiator && m.type == ST_MSG_HS2)
    return on_hs2(f, &m);
  if (!f->initiator && m.type == ST_MSG_HS3)
    return on_hs3(f, &m);
  st_wire_msg_free(&m);
  return fail(f, ST_SESSION_DROP_MALFORMED, -EPROTO);
}

/* The peer's stream header: the receiving stream, and the session is
 * open. */
static int read_header(st_session_framer_t* f, const uint8_t* header) {
  int rc = st_stream_rx_init(f->rx, f->keys.rx_key, header);
  st_session_wipe(&f->keys);
  if (rc != 0)
    return fail(f, ST_SESSION_DROP_INTERNAL, rc);
  f->phase = ST_SESSION_OPEN;
  return 0;
}

/* ---- The framer --------------------------------------------------------- */

int st_session_framer_init(st_session_framer_t* f, bool initiator,
                           const st_identity_t* me, const st_keyring_t* keys,
                           const st_allowlist_t* allow,
                           const st_node_id_t* expected, st_stream_t* tx,
                           st_stream_t* rx, st_crypto_counters_t* cc,
                           st_wire_counters_t* wc) {
  memset(f, 0, sizeof(*f));
  f->initiator = initiator;
  f->tx = tx;
  f->rx = rx;
  f->cc = cc;
  f->wc = wc;
  if (expected != NULL) {
    f->expect_peer = true;
    f->expected = *expected;
  }
  int rc =
      st_handshake_init(&f->hs, initiator ? ST_HS_INITIATOR : ST_HS_RESPONDER,
                        me, keys, allow, cc);
  if (rc != 0)
    return fail(f, ST_SESSION_DROP_INTERNAL, rc);
  if (!initiator)
    return 0;
  st_msg_t out;
  memset(&out, 0, sizeof(out));
  out.type = ST_MSG_HS1;
  if ((rc = st_handshake_write_msg1(&f->hs, &out.u.hs1)) != 0)
    return fail(f, ST_SESSION_DROP_HANDSHAKE, rc);
  return queue_frame(f, &out);
}

/* Bytes of the unit being read: the peer's header, a frame's length, or
 * the whole frame once its length is known. */
static size_t unit_bytes(const st_session_framer_t* f) {
  if (f->phase == ST_SESSION_KEYED)
    return ST_STREAM_HEADER_BYTES;
  if (f->in_len < ST_SESSION_LEN_BYTES)
    return ST_SESSION_LEN_BYTES;
  return ST_SESSION_LEN_BYTES + frame_length(f->in);
}

size_t st_session_framer_want(const st_session_framer_t* f) {
  if (f->phase == ST_SESSION_OPEN || f->phase == ST_SESSION_FAILED)
    return 0;
  return unit_bytes(f) - f->in_len;
}

int st_session_framer_feed(st_session_framer_t* f, const uint8_t* in,
                           size_t len, size_t* used) {
  *used = 0;
  if (f->phase == ST_SESSION_FAILED)
    return f->err;
  while (f->phase != ST_SESSION_OPEN && *used < len) {
    size_t unit = unit_bytes(f);
    size_t take = unit - f->in_len;
    if (take > len - *used)
      take = len - *used;
    memcpy(f->in + f->in_len, in + *used, take);
    f->in_len += take;
    *used += take;
    if (f->in_len < unit)
      return 0; /* the unit waits for more */
    if (f->phase == ST_SESSION_HANDSHAKE && f->in_len == ST_SESSION_LEN_BYTES) {
      /* The length alone: refused before any of the body is read. */
      size_t flen = frame_length(f->in);
      if (flen == 0 || flen > ST_SESSION_HS_FRAME_MAX)
        return fail(f, ST_SESSION_DROP_FRAME_SIZE, -EMSGSIZE);
      continue;
    }
    f->in_len = 0;
    if (f->phase == ST_SESSION_KEYED)
      return read_header(f, f->in);
    return read_frame(f, f->in + ST_SESSION_LEN_BYTES, frame_length(f->in));
  }
  return 0;
}

const uint8_t* st_session_framer_output(const st_session_framer_t* f,
                                        size_t* len) {
  *len = f->out_len;
  return f->out;
}

void st_session_framer_sent(st_session_framer_t* f, size_t n) {
  if (n > f->out_len)
    n = f->out_len;
  memmove(f->out, f->out + n, f->out_len - n);
  f->out_len -= n;
}

void st_session_framer_wipe(st_session_framer_t* f) {
  st_handshake_wipe(&f->hs);
  st_session_wipe(&f->keys);
  f->in_len = 0;
  memset(f->in, 0, sizeof(f->in));
}
