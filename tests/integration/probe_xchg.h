/* probe_xchg.h: what the exchange probes of tests/integration/ (fetch_probe,
 * coded_probe) share: opening an exchange with a running node as a
 * cluster-key holder would (a TCP connection, the daemon's handshake with a
 * fresh identity, an XCHG_REQ, the node's XCHG_REPLY), and sending or
 * reading one message as one encrypted frame. Header only, so that each
 * probe stays one source file. */
#ifndef STARLING_TESTS_PROBE_XCHG_H
#define STARLING_TESTS_PROBE_XCHG_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crypto/crypto.h"
#include "gossip/gossip.h"
#include "tests/integration/probe_net.h"
#include "tools/bench/bench.h"

/* Seals m as one frame and writes it. 0, -ENOMEM or -EIO. */
static inline int probe_send(int fd, st_stream_t* tx, const st_msg_t* m) {
  size_t cap = ST_WIRE_MAX_MESSAGE_BYTES;
  size_t fcap = cap + ST_STREAM_ABYTES + ST_FRAME_LENGTH_BYTES;
  uint8_t* msg = malloc(cap);
  uint8_t* frame = malloc(fcap);
  size_t len = 0, flen = 0;
  int rc = msg == NULL || frame == NULL ? -ENOMEM : 0;
  if (rc == 0 &&
      (st_wire_encode(m, msg, cap, &len) != 0 ||
       st_stream_seal_frame(tx, msg, len, false, frame, fcap, &flen) != 0 ||
       st__bench_write_all(fd, frame, flen) != 0))
    rc = -EIO;
  free(msg);
  free(frame);
  return rc;
}

/* Reads one frame and decodes it as XCHG_REPLY into *out (its tensor list
 * dropped). 0, or a negative errno (-EPROTO: another message). */
static inline int probe_read_reply(int fd, st_stream_t* rx,
                                   st_msg_xchg_reply_t* out) {
  uint8_t hdr[ST_FRAME_LENGTH_BYTES];
  size_t ct_len = 0, len = 0;
  bool final = false;
  if (st__bench_read_all(fd, hdr, sizeof(hdr)) != 0 ||
      st_frame_length(hdr, ST_FRAME_MAX_DEFAULT, NULL, &ct_len) != 0)
    return -EIO;
  uint8_t* ct = malloc(ct_len);
  uint8_t* msg = malloc(ct_len);
  int rc = ct == NULL || msg == NULL ? -ENOMEM : 0;
  if (rc == 0)
    rc = st__bench_read_all(fd, ct, ct_len);
  if (rc == 0)
    rc = st_stream_open_frame(rx, NULL, ct, ct_len, msg, ct_len, &len, &final);
  st_msg_t m;
  if (rc == 0 && (rc = st_wire_decode(msg, len, &m, NULL)) == 0) {
    if (m.type == ST_MSG_XCHG_REPLY) {
      *out = m.u.xchg_reply;
      out->tensors = NULL;
      out->tensors_len = 0;
    } else {
      rc = -EPROTO;
    }
    st_wire_msg_free(&m);
  }
  free(ct);
  free(msg);
  return rc;
}

/* One exchange opened: a connection to target (receive buffer rcvbuf when
 * > 0), the handshake as a fresh identity, req sent, the reply read into
 * *reply. Returns the fd, or -1. The session's streams go to *tx and *rx
 * when they are not NULL (the caller wipes them), else are wiped here. */
static inline int probe_xchg_open(const char* target, const st_keyring_t* keys,
                                  const st_msg_xchg_req_t* req, int rcvbuf,
                                  st_msg_xchg_reply_t* reply, st_stream_t* tx,
                                  st_stream_t* rx) {
  st_identity_t me;
  st_stream_t t, r;
  memset(&t, 0, sizeof(t));
  memset(&r, 0, sizeof(r));
  int fd = probe_dial(target, rcvbuf);
  if (fd < 0 || st_identity_generate(&me) != 0) {
    if (fd >= 0)
      close(fd);
    return -1;
  }
  st_msg_t m;
  memset(&m, 0, sizeof(m));
  m.type = ST_MSG_XCHG_REQ;
  m.u.xchg_req = *req;
  int rc = st__bench_handshake(fd, true, &me, keys, NULL, NULL, &t, &r);
  if (rc == 0)
    rc = probe_send(fd, &t, &m);
  if (rc == 0)
    rc = probe_read_reply(fd, &r, reply);
  st_identity_wipe(&me);
  if (rc == 0 && tx != NULL && rx != NULL) {
    *tx = t;
    *rx = r;
  } else {
    st_stream_wipe(&t);
    st_stream_wipe(&r);
  }
  if (rc != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* The node's model (fingerprint, description, parameter count) from the
 * MISMATCH answer to a FETCH naming none: 0, or -1 when it did not answer
 * so. `who` names the probe in the request. */
static inline int probe_learn_model(const char* target,
                                    const st_keyring_t* keys, const char* who,
                                    st_msg_xchg_reply_t* node) {
  st_msg_xchg_req_t req;
  memset(&req, 0, sizeof(req));
  req.kind = ST_XCHG_FETCH;
  snprintf(req.model, sizeof(req.model), "%s", who);
  int fd = probe_xchg_open(target, keys, &req, 0, node, NULL, NULL);
  if (fd >= 0)
    close(fd);
  return fd >= 0 && node->status == ST_XCHG_STATUS_MISMATCH ? 0 : -1;
}

/* Loads the cluster key at path into *keys (the key itself into *ck, to
 * wipe with st_cluster_key_wipe after st_keyring_wipe). 0, or 1 after
 * saying why on stderr, the probe named `who`. */
static inline int probe_load_keys(const char* who, const char* path,
                                  st_cluster_key_t* ck, st_keyring_t* keys) {
  char err[256] = "";
  if (st_crypto_init() != 0 ||
      st_cluster_key_load(path, ck, err, sizeof(err)) != 0 ||
      st_keyring_init(keys, ck, NULL, err, sizeof(err)) != 0) {
    fprintf(stderr, "%s: keys: %s\n", who, err);
    return 1;
  }
  return 0;
}

/* "ok", "busy", "mismatch", "not_ready". */
static inline const char* probe_status_name(uint8_t s) {
  switch (s) {
    case ST_XCHG_STATUS_OK:
      return "ok";
    case ST_XCHG_STATUS_BUSY:
      return "busy";
    case ST_XCHG_STATUS_MISMATCH:
      return "mismatch";
    case ST_XCHG_STATUS_NOT_READY:
      return "not_ready";
  }
  return "?";
}

#endif
