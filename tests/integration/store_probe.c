/* store_probe.c: a cluster-key holder that is not a member (a fresh
 * identity the node never heard of) sending COLL_FETCH messages to a
 * running `starling node` (tests/integration/test_node_collectives.sh,
 * docs/protocol.md, COLL_FETCH).
 *
 *   store_probe --cluster-key PATH --connect HOST:PORT --name NAME
 *
 * On one connection, after the daemon's handshake: an ASK for NAME, a
 * refusal (MISSING) of an operation the node never started, and an ASK
 * again with the first one's op id; then it waits 2 s for any frame. On a
 * second connection: an ASK with an empty name, raw bytes the encoder
 * would refuse, then waits for the node to close it. Prints one JSON
 * object, {"answered":B,"closed":B}: whether the node sent anything on
 * the first connection (it must not: only alive members are answered)
 * (whether NAME is published there or not) and whether it closed the
 * second (it must). Exit status: 0 done, 1 a
 * connection or handshake failed, 2 bad usage. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/integration/probe_xchg.h"

static int usage(const char* why) {
  fprintf(stderr,
          "store_probe: %s\n"
          "usage: store_probe --cluster-key PATH --connect HOST:PORT --name "
          "NAME\n",
          why);
  return 2;
}

static int open_conn(const char* target, const st_keyring_t* keys,
                     st_stream_t* tx, st_stream_t* rx) {
  st_identity_t me;
  memset(tx, 0, sizeof *tx);
  memset(rx, 0, sizeof *rx);
  int fd = probe_dial(target, 0);
  if (fd < 0 || st_identity_generate(&me) != 0 ||
      st__bench_handshake(fd, true, &me, keys, NULL, NULL, tx, rx) != 0) {
    if (fd >= 0)
      close(fd);
    return -1;
  }
  return fd;
}

/* Whether anything comes on fd within ms (a frame, or the close). */
static bool readable(int fd, int ms) {
  struct pollfd p = {fd, POLLIN, 0};
  return poll(&p, 1, ms) > 0;
}

/* Whether the node closed fd within ms (EOF, or a reset). */
static bool closed_within(int fd, int ms) {
  uint8_t b[256];
  while (readable(fd, ms)) {
    ssize_t r = read(fd, b, sizeof b);
    if (r <= 0)
      return true;
  }
  return false;
}

static int fetch_msg(int fd, st_stream_t* tx, uint64_t op, uint8_t code,
                     const char* text) {
  st_msg_t m = {.type = ST_MSG_COLL_FETCH};
  m.u.coll_fetch = (st_msg_coll_fetch_t){.op_id = op,
                                         .code = code,
                                         .text = text,
                                         .text_len = (uint32_t) strlen(text)};
  return probe_send(fd, tx, &m);
}

int main(int argc, char** argv) {
  const char *key_path = NULL, *target = NULL, *name = NULL;
  if (argc % 2 == 0)
    return usage("every option takes a value");
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--cluster-key") == 0)
      key_path = argv[i + 1];
    else if (strcmp(argv[i], "--connect") == 0)
      target = argv[i + 1];
    else if (strcmp(argv[i], "--name") == 0)
      name = argv[i + 1];
    else
      return usage("unknown option");
  }
  if (key_path == NULL || target == NULL || name == NULL || name[0] == '\0')
    return usage("--cluster-key, --connect and --name are required");
  st_cluster_key_t ck;
  st_keyring_t keys;
  if (probe_load_keys("store_probe", key_path, &ck, &keys) != 0)
    return 1;
  st_stream_t tx, rx, tx2, rx2;
  int fd = open_conn(target, &keys, &tx, &rx);
  int rc = fd < 0 ? -EIO : 0;
  if (rc == 0)
    rc = fetch_msg(fd, &tx, 0x5157u, ST_COLL_FETCH_ASK, name);
  if (rc == 0)
    rc = fetch_msg(fd, &tx, 0x7777u, ST_COLL_FETCH_MISSING, "forged");
  if (rc == 0)
    rc = fetch_msg(fd, &tx, 0x5157u, ST_COLL_FETCH_ASK, name);
  bool answered = rc == 0 && readable(fd, 2000);
  /* An ASK naming nothing: [51, 1, op, 0, ""], which no encoder writes. */
  static const uint8_t bad[] = {0x95, 0x33, 0x01, 0xcf, 0, 0, 0,
                                0,    0,    0,    0,    1, 0, 0xa0};
  int fd2 = rc == 0 ? open_conn(target, &keys, &tx2, &rx2) : -1;
  uint8_t frame[sizeof bad + ST_STREAM_ABYTES + ST_FRAME_LENGTH_BYTES];
  size_t flen = 0;
  if (rc == 0 && (fd2 < 0 ||
                  st_stream_seal_frame(&tx2, bad, sizeof bad, false, frame,
                                       sizeof frame, &flen) != 0 ||
                  st__bench_write_all(fd2, frame, flen) != 0))
    rc = -EIO;
  bool closed = rc == 0 && closed_within(fd2, 5000);
  if (rc == 0)
    printf("{\"answered\":%s,\"closed\":%s}\n", answered ? "true" : "false",
           closed ? "true" : "false");
  else
    fprintf(stderr, "store_probe: connecting to %s failed\n", target);
  if (fd >= 0)
    close(fd);
  if (fd2 >= 0) {
    close(fd2);
    st_stream_wipe(&tx2);
    st_stream_wipe(&rx2);
  }
  st_stream_wipe(&tx);
  st_stream_wipe(&rx);
  st_keyring_wipe(&keys);
  st_cluster_key_wipe(&ck);
  return rc == 0 ? 0 : 1;
}
