/* ring_lane_probe.c: a test client that opens a ring lane to a running
 * `starling node` as a cluster-key holder would, and reports how the node
 * answers (tests/integration/test_node_ring_lanes.sh).
 *
 *   ring_lane_probe --cluster-key PATH --connect HOST:PORT
 *                   [--round HEX] [--lane K --lanes L] [--wait S]
 *
 * Dials HOST:PORT, runs the daemon's handshake under the cluster key with a
 * fresh identity (so it is no member of any round), sends RING_LANE
 * [round, K, L] as the lane's first frame (round: --round, else a random
 * one), then waits up to S seconds (default 10) for the node to close the
 * connection. Prints one JSON object:
 *   {"peer":"<node id>","closed":true|false,"after_ms":<ms from the
 *    RING_LANE frame to the close, or null>}
 * Exit status: 0 closed, 3 still open after S seconds, 1 the connection or
 * handshake failed, 2 bad usage. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "crypto/crypto.h"
#include "gossip/gossip.h"
#include "tests/integration/probe_net.h"
#include "tools/bench/bench.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static int usage(const char* why) {
  fprintf(stderr,
          "ring_lane_probe: %s\nusage: ring_lane_probe --cluster-key PATH "
          "--connect HOST:PORT [--round HEX] [--lane K --lanes L] "
          "[--wait S]\n",
          why);
  return 2;
}

/* Waits until the peer closes fd (a read returns 0 or fails), at most
 * wait_s seconds; true when it did. Anything the node sends is read and
 * dropped (it sends nothing on a lane it accepted). */
static bool wait_close(int fd, double wait_s) {
  double end = now_s() + wait_s;
  uint8_t buf[4096];
  for (;;) {
    double left = end - now_s();
    if (left <= 0)
      return false;
    struct pollfd p = {fd, POLLIN, 0};
    int r = poll(&p, 1, (int) (left * 1000) + 1);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return r == 0 ? false : true;
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return true;
  }
}

/* The command line. */
typedef struct {
  const char* key_path;
  const char* target;
  uint64_t round; /* 0: a random one */
  uint32_t lane, lanes;
  double wait_s;
} args_t;

/* 0, or the exit status of a bad command line (after its message). */
static int parse_args(int argc, char** argv, args_t* a) {
  memset(a, 0, sizeof(*a));
  a->lanes = 1;
  a->wait_s = 10;
  if (argc % 2 == 0)
    return usage("every option takes a value");
  for (int i = 1; i + 1 < argc; i += 2) {
    const char* k = argv[i];
    const char* v = argv[i + 1];
    if (strcmp(k, "--cluster-key") == 0)
      a->key_path = v;
    else if (strcmp(k, "--connect") == 0)
      a->target = v;
    else if (strcmp(k, "--round") == 0)
      a->round = strtoull(v, NULL, 16);
    else if (strcmp(k, "--lane") == 0)
      a->lane = (uint32_t) strtoul(v, NULL, 10);
    else if (strcmp(k, "--lanes") == 0)
      a->lanes = (uint32_t) strtoul(v, NULL, 10);
    else if (strcmp(k, "--wait") == 0)
      a->wait_s = strtod(v, NULL);
    else
      return usage("unknown option");
  }
  if (a->key_path == NULL || a->target == NULL)
    return usage("--cluster-key and --connect are required");
  return 0;
}

/* RING_LANE [round, lane, lanes] as the stream's first frame. */
static int send_lane(int fd, st_stream_t* tx, const args_t* a, uint64_t round) {
  st_msg_t m;
  memset(&m, 0, sizeof(m));
  m.type = ST_MSG_RING_LANE;
  m.u.ring_lane.round_id = round;
  m.u.ring_lane.lane = a->lane;
  m.u.ring_lane.lanes = a->lanes;
  uint8_t msg[64], frame[64 + ST_STREAM_ABYTES + ST_FRAME_LENGTH_BYTES];
  size_t len = 0, flen = 0;
  if (st_wire_encode(&m, msg, sizeof(msg), &len) != 0 ||
      st_stream_seal_frame(tx, msg, len, false, frame, sizeof(frame), &flen) !=
          0 ||
      st__bench_write_all(fd, frame, flen) != 0)
    return -EIO;
  return 0;
}

int main(int argc, char** argv) {
  args_t a;
  int bad = parse_args(argc, argv, &a);
  if (bad != 0)
    return bad;
  const char* target = a.target;
  uint64_t round = a.round;
  double wait_s = a.wait_s;
  char err[256];
  st_cluster_key_t ck;
  st_keyring_t keys;
  st_identity_t me;
  if (st_crypto_init() != 0 ||
      st_cluster_key_load(a.key_path, &ck, err, sizeof(err)) != 0 ||
      st_keyring_init(&keys, &ck, NULL, err, sizeof(err)) != 0 ||
      st_identity_generate(&me) != 0) {
    fprintf(stderr, "ring_lane_probe: keys: %s\n", err);
    return 1;
  }
  if (round == 0) /* a random round: from the fresh identity's id */
    memcpy(&round, me.id.b, sizeof(round));
  int fd = probe_dial(target, 0);
  if (fd < 0) {
    fprintf(stderr, "ring_lane_probe: cannot connect to %s\n", target);
    return 1;
  }
  st_node_id_t peer;
  st_stream_t tx;
  int rc = st__bench_handshake(fd, true, &me, &keys, NULL, &peer, &tx, NULL);
  if (rc != 0) {
    fprintf(stderr, "ring_lane_probe: handshake with %s failed (%d)\n", target,
            rc);
    close(fd);
    return 1;
  }
  if (send_lane(fd, &tx, &a, round) != 0) {
    fprintf(stderr, "ring_lane_probe: sending RING_LANE failed\n");
    close(fd);
    return 1;
  }
  double t0 = now_s();
  bool closed = wait_close(fd, wait_s);
  double ms = (now_s() - t0) * 1e3;
  char id[33];
  st_node_id_format(&peer, id);
  if (closed)
    printf("{\"peer\":\"%s\",\"closed\":true,\"after_ms\":%.1f}\n", id, ms);
  else
    printf("{\"peer\":\"%s\",\"closed\":false,\"after_ms\":null}\n", id);
  st_stream_wipe(&tx);
  st_identity_wipe(&me);
  st_keyring_wipe(&keys);
  st_cluster_key_wipe(&ck);
  close(fd);
  return closed ? 0 : 3;
}
