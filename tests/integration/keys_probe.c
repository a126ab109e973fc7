/* keys_probe.c: a cluster-key holder that is not a member (a fresh
 * identity the node never heard of) asking a running `starling node` to
 * change its cluster keys, as `starling keys --cluster` on a member would
 * (tests/integration/test_node_keys.sh).
 *
 *   keys_probe --cluster-key PATH --connect HOST:PORT
 *              --op install:KEYFILE | use:ID | remove:ID
 *
 * Opens a connection, runs the daemon's handshake with a fresh identity,
 * sends one ADMIN_REQ and waits up to 5 s for a ADMIN_REPLY. Prints one JSON
 * object: {"answered":false} when the node closed the connection without
 * answering (what it does for a non-member), else {"answered":true,
 * "result":N,"keys":[...],"reason":"..."}. Exit status: 0 done, 1 the
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
          "keys_probe: %s\n"
          "usage: keys_probe --cluster-key PATH --connect HOST:PORT --op "
          "install:KEYFILE|use:ID|remove:ID\n",
          why);
  return 2;
}

/* --op into *q (an install's key read from its file). */
static int parse_op(const char* v, st_msg_admin_req_t* q) {
  memset(q, 0, sizeof *q);
  if (strncmp(v, "install:", 8) == 0) {
    st_cluster_key_t k;
    char err[256];
    if (st_cluster_key_load(v + 8, &k, err, sizeof err) != 0) {
      fprintf(stderr, "keys_probe: %s\n", err);
      return -1;
    }
    q->op = ST_ADMIN_KEY_INSTALL;
    q->key_id = k.id;
    q->subject_len = sizeof k.key;
    memcpy(q->subject, k.key, sizeof k.key);
    st_cluster_key_wipe(&k);
    return 0;
  }
  q->op = strncmp(v, "use:", 4) == 0      ? ST_ADMIN_KEY_USE
          : strncmp(v, "remove:", 7) == 0 ? ST_ADMIN_KEY_REMOVE
                                          : 0;
  if (q->op == 0)
    return -1;
  q->key_id = (uint8_t) atoi(strchr(v, ':') + 1);
  return 0;
}

/* Reads one frame within 5 s and prints what it was. */
static int report(int fd, st_stream_t* rx) {
  struct pollfd p = {fd, POLLIN, 0};
  uint8_t hdr[ST_FRAME_LENGTH_BYTES];
  size_t ct_len = 0, len = 0;
  if (poll(&p, 1, 5000) <= 0 || st__bench_read_all(fd, hdr, sizeof hdr) != 0 ||
      st_frame_length(hdr, ST_FRAME_MAX_DEFAULT, NULL, &ct_len) != 0) {
    printf("{\"answered\":false}\n");
    return 0;
  }
  uint8_t* ct = malloc(ct_len);
  uint8_t* msg = malloc(ct_len);
  bool final = false;
  st_msg_t m;
  int rc = ct == NULL || msg == NULL ? -ENOMEM : 0;
  if (rc == 0)
    rc = st__bench_read_all(fd, ct, ct_len);
  if (rc == 0)
    rc = st_stream_open_frame(rx, NULL, ct, ct_len, msg, ct_len, &len, &final);
  if (rc == 0)
    rc = st_wire_decode(msg, len, &m, NULL);
  if (rc == 0 && m.type != ST_MSG_ADMIN_REPLY)
    rc = -EPROTO;
  if (rc == 0) {
    const st_msg_admin_reply_t* r = &m.u.admin_reply;
    printf("{\"answered\":true,\"result\":%u,\"keys\":[", r->result);
    for (int i = 0; i < r->n_keys; i++)
      printf("%s%u", i ? "," : "", r->keys[i]);
    char reason[ST_ADMIN_REASON_MAX + 1];
    memcpy(reason, r->reason, r->reason_len);
    reason[r->reason_len] = '\0';
    printf("],\"reason\":");
    st_json_write_string(stdout, reason);
    printf("}\n");
    st_wire_msg_free(&m);
  }
  free(ct);
  free(msg);
  return rc == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  const char *key_path = NULL, *target = NULL, *op = NULL;
  if (argc % 2 == 0)
    return usage("every option takes a value");
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--cluster-key") == 0)
      key_path = argv[i + 1];
    else if (strcmp(argv[i], "--connect") == 0)
      target = argv[i + 1];
    else if (strcmp(argv[i], "--op") == 0)
      op = argv[i + 1];
    else
      return usage("unknown option");
  }
  if (key_path == NULL || target == NULL || op == NULL)
    return usage("--cluster-key, --connect and --op are required");
  st_cluster_key_t ck;
  st_keyring_t keys;
  if (probe_load_keys("keys_probe", key_path, &ck, &keys) != 0)
    return 1;
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_ADMIN_REQ;
  if (parse_op(op, &m.u.admin_req) != 0)
    return usage("--op is install:KEYFILE, use:ID or remove:ID");
  st_identity_t me;
  st_stream_t tx, rx;
  memset(&tx, 0, sizeof tx);
  memset(&rx, 0, sizeof rx);
  int fd = probe_dial(target, 0);
  int rc = fd < 0 || st_identity_generate(&me) != 0 ? -EIO : 0;
  if (rc == 0)
    rc = st__bench_handshake(fd, true, &me, &keys, NULL, NULL, &tx, &rx);
  if (rc == 0)
    rc = probe_send(fd, &tx, &m);
  if (rc == 0)
    rc = report(fd, &rx);
  else
    fprintf(stderr, "keys_probe: connecting to %s failed\n", target);
  if (fd >= 0)
    close(fd);
  st_stream_wipe(&tx);
  st_stream_wipe(&rx);
  st_crypto_wipe(&m, sizeof m);
  st_keyring_wipe(&keys);
  st_cluster_key_wipe(&ck);
  return rc == 0 ? 0 : 1;
}
