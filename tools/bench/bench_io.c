/* bench_io.c: blocking socket I/O and the daemon's connection handshake on
 * a blocking socket, for the benchmarks of `starling-bench` (members that
 * speak to each other as nodes do) and for the test probe that speaks to a
 * running node (tests/integration/ring_lane_probe.c). Internal to tools/.
 *
 * The handshake is framed as node/daemon/daemon_conn.c frames it (send_plain):
 * a 4-byte big-endian length, then the st_wire_encode'd HS1, HS2 or HS3; then
 * each side sends its 24-byte stream header. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "crypto/crypto.h"
#include "gossip/gossip.h"
#include "tools/bench/bench.h"

#define HS_FRAME_MAX \
  512u /* as node/daemon/daemon_conn.c: a handshake message */

int st__bench_write_all(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -EIO;
    p += w;
    n -= (size_t) w;
  }
  return 0;
}

int st__bench_read_all(int fd, uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return -EIO;
    p += r;
    n -= (size_t) r;
  }
  return 0;
}

/* A handshake message as the daemon frames it. */
static int send_hs(int fd, const st_msg_t* msg) {
  uint8_t buf[4 + HS_FRAME_MAX];
  size_t len = 0;
  int rc = st_wire_encode(msg, buf + 4, HS_FRAME_MAX, &len);
  if (rc != 0)
    return rc;
  buf[0] = (uint8_t) (len >> 24);
  buf[1] = (uint8_t) (len >> 16);
  buf[2] = (uint8_t) (len >> 8);
  buf[3] = (uint8_t) len;
  return st__bench_write_all(fd, buf, len + 4);
}

static int recv_hs(int fd, st_msg_type_t want, st_msg_t* msg) {
  uint8_t buf[HS_FRAME_MAX];
  uint8_t lb[4];
  if (st__bench_read_all(fd, lb, 4) != 0)
    return -EIO;
  size_t len =
      (size_t) lb[0] << 24 | (size_t) lb[1] << 16 | (size_t) lb[2] << 8 | lb[3];
  if (len == 0 || len > HS_FRAME_MAX || st__bench_read_all(fd, buf, len) != 0)
    return -EBADMSG;
  if (st_wire_decode(buf, len, msg, NULL) != 0)
    return -EBADMSG;
  if (msg->type != want) {
    st_wire_msg_free(msg);
    return -EPROTO;
  }
  return 0;
}

int st__bench_handshake(int fd, bool initiator, const st_identity_t* me,
                        const st_keyring_t* keys, st_node_id_t* peer,
                        st_stream_t* tx, st_stream_t* rx) {
  st_handshake_t hs;
  st_session_t s;
  st_stream_t unused_tx, unused_rx;
  st_msg_t in, out;
  memset(&s, 0, sizeof(s));
  memset(&unused_tx, 0, sizeof(unused_tx));
  memset(&unused_rx, 0, sizeof(unused_rx));
  memset(&out, 0, sizeof(out));
  int rc = st_handshake_init(&hs, initiator ? ST_HS_INITIATOR : ST_HS_RESPONDER,
                             me, keys, NULL, NULL);
  if (rc != 0)
    goto done;
  if (initiator) {
    out.type = ST_MSG_HS1;
    if ((rc = st_handshake_write_msg1(&hs, &out.u.hs1)) != 0 ||
        (rc = send_hs(fd, &out)) != 0 ||
        (rc = recv_hs(fd, ST_MSG_HS2, &in)) != 0 ||
        (rc = st_handshake_read_msg2(&hs, &in.u.hs2)) != 0)
      goto done;
    out.type = ST_MSG_HS3;
    if ((rc = st_handshake_write_msg3(&hs, &out.u.hs3)) != 0 ||
        (rc = send_hs(fd, &out)) != 0)
      goto done;
  } else {
    if ((rc = recv_hs(fd, ST_MSG_HS1, &in)) != 0 ||
        (rc = st_handshake_read_msg1(&hs, &in.u.hs1)) != 0)
      goto done;
    out.type = ST_MSG_HS2;
    if ((rc = st_handshake_write_msg2(&hs, &out.u.hs2)) != 0 ||
        (rc = send_hs(fd, &out)) != 0 ||
        (rc = recv_hs(fd, ST_MSG_HS3, &in)) != 0 ||
        (rc = st_handshake_read_msg3(&hs, &in.u.hs3)) != 0)
      goto done;
  }
  if ((rc = st_handshake_finish(&hs, &s)) != 0)
    goto done;
  *peer = s.peer_id;
  uint8_t mine[ST_STREAM_HEADER_BYTES], theirs[ST_STREAM_HEADER_BYTES];
  if ((rc = st_stream_tx_init(tx != NULL ? tx : &unused_tx, s.tx_key, mine)) !=
          0 ||
      (rc = st__bench_write_all(fd, mine, sizeof(mine))) != 0 ||
      (rc = st__bench_read_all(fd, theirs, sizeof(theirs))) != 0 ||
      (rc = st_stream_rx_init(rx != NULL ? rx : &unused_rx, s.rx_key,
                              theirs)) != 0)
    goto done;
done:
  st_stream_wipe(&unused_tx);
  st_stream_wipe(&unused_rx);
  st_handshake_wipe(&hs);
  st_session_wipe(&s);
  return rc;
}
