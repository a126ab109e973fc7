/* bench_io.c: blocking socket I/O and the daemon's connection handshake on
 * a blocking socket, for the benchmarks of `starling-bench` (members that
 * speak to each other as nodes do) and for the test probe that speaks to a
 * running node (tests/integration/ring_lane_probe.c). Internal to tools/.
 *
 * The handshake's framing is gossip/session.c's, the same machine that
 * node/daemon/daemon_conn.c drives: this file only moves its bytes over a
 * blocking socket. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "crypto/crypto.h"
#include "gossip/gossip.h"
#include "tools/bench/bench.h"

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

/* Sends what the framer queued. */
static int flush(int fd, st_session_framer_t* f) {
  size_t len = 0;
  const uint8_t* out = st_session_framer_output(f, &len);
  if (len == 0)
    return 0;
  int rc = st__bench_write_all(fd, out, len);
  st_session_framer_sent(f, len);
  return rc;
}

int st__bench_handshake(int fd, bool initiator, const st_identity_t* me,
                        const st_keyring_t* keys, const st_node_id_t* expected,
                        st_node_id_t* peer, st_stream_t* tx, st_stream_t* rx) {
  st_session_framer_t f;
  st_stream_t unused_tx, unused_rx;
  memset(&unused_tx, 0, sizeof(unused_tx));
  memset(&unused_rx, 0, sizeof(unused_rx));
  int rc = st_session_framer_init(&f, initiator, me, keys, NULL, expected,
                                  tx != NULL ? tx : &unused_tx,
                                  rx != NULL ? rx : &unused_rx, NULL, NULL);
  /* Read exactly what the framer wants, never past the peer's header:
   * the caller reads the encrypted frames that follow from fd itself. */
  uint8_t buf[ST_SESSION_LEN_BYTES + ST_SESSION_HS_FRAME_MAX];
  while (rc == 0 && (rc = flush(fd, &f)) == 0 && f.phase != ST_SESSION_OPEN) {
    size_t want = st_session_framer_want(&f), used = 0;
    if ((rc = st__bench_read_all(fd, buf, want)) != 0)
      break;
    rc = st_session_framer_feed(&f, buf, want, &used);
  }
  if (rc == 0 && peer != NULL)
    *peer = f.peer;
  st_stream_wipe(&unused_tx);
  st_stream_wipe(&unused_rx);
  st_session_framer_wipe(&f);
  return rc;
}
