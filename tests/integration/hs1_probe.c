/* hs1_probe.c: a test client that replays one valid handshake opening
 * (HS1) to a running node over many TCP connections, as a cluster-key
 * holder, or anyone who captured one, could (tests/integration/
 * test_node_handshake_rate.sh).
 *
 *   hs1_probe --cluster-key PATH --to HOST:PORT --count N
 *
 * It makes one HS1 with a fresh identity (a session framer as the
 * dialler), then, N times: connects, sends those same bytes, and waits up
 * to 2 s for the node's first byte. A node answers an HS1 with HS2 (public
 * -key work) or closes the connection unanswered. Prints
 * {"sent":N,"answered":A,"closed":C,"seconds":S} and exits 0; 1 when the
 * key or a connection fails, 2 on bad usage. */
#define _POSIX_C_SOURCE 200809L
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

static int usage(const char* why) {
  fprintf(stderr,
          "hs1_probe: %s\nusage: hs1_probe --cluster-key PATH --to "
          "HOST:PORT --count N\n",
          why);
  return 2;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double) t.tv_sec + (double) t.tv_nsec * 1e-9;
}

/* One replay: 1 answered, 0 closed unanswered, -1 a failure. */
static int replay(const char* to, const uint8_t* hs1, size_t len) {
  int fd = probe_dial(to, 0);
  if (fd < 0)
    return -1;
  int rc = -1;
  if (send(fd, hs1, len, MSG_NOSIGNAL) == (ssize_t) len) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    uint8_t b;
    if (poll(&p, 1, 2000) == 1)
      rc = recv(fd, &b, 1, 0) == 1 ? 1 : 0;
  }
  close(fd);
  return rc;
}

int main(int argc, char** argv) {
  const char *key_path = NULL, *to = NULL;
  long count = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--cluster-key") == 0)
      key_path = argv[i + 1];
    else if (strcmp(argv[i], "--to") == 0)
      to = argv[i + 1];
    else if (strcmp(argv[i], "--count") == 0)
      count = atol(argv[i + 1]);
    else
      return usage("unknown argument");
  }
  if (key_path == NULL || to == NULL || count <= 0)
    return usage("--cluster-key, an IPv4 --to HOST:PORT and --count > 0");
  char err[256] = "";
  st_cluster_key_t ck;
  st_keyring_t ring;
  st_identity_t me;
  if (st_crypto_init() != 0 ||
      st_cluster_key_load(key_path, &ck, err, sizeof(err)) != 0 ||
      st_keyring_init(&ring, &ck, NULL, err, sizeof(err)) != 0 ||
      st_identity_generate(&me) != 0) {
    fprintf(stderr, "hs1_probe: %s\n", err);
    return 1;
  }
  st_session_framer_t f;
  st_stream_t tx, rx;
  if (st_session_framer_init(&f, true, &me, &ring, NULL, NULL, &tx, &rx, NULL,
                             NULL) != 0) {
    fprintf(stderr, "hs1_probe: cannot make an HS1\n");
    return 1;
  }
  size_t len = 0;
  const uint8_t* out = st_session_framer_output(&f, &len);
  uint8_t hs1[ST_SESSION_OUT_MAX];
  memcpy(hs1, out, len);
  long answered = 0, closed = 0;
  double t0 = now_s();
  for (long i = 0; i < count; i++) {
    int r = replay(to, hs1, len);
    if (r < 0) {
      fprintf(stderr, "hs1_probe: cannot connect to %s or send\n", to);
      return 1;
    }
    answered += r;
    closed += r == 0;
  }
  printf("{\"sent\":%ld,\"answered\":%ld,\"closed\":%ld,\"seconds\":%.3f}\n",
         count, answered, closed, now_s() - t0);
  st_session_framer_wipe(&f);
  st_identity_wipe(&me);
  st_keyring_wipe(&ring);
  st_cluster_key_wipe(&ck);
  return 0;
}
