/* coded_probe.c: a test client that averages with a running `starling
 * node --compress ...` as a cluster-key holder would, and sends it a
 * hostile compressed snapshot: an insider whose codec messages lie
 * (tests/integration/test_node_compress.sh).
 *
 *   coded_probe --cluster-key PATH --connect HOST:PORT --compress SPEC
 *               --attack nan-scale|bad-index|dup-index|wrong-kind|
 *                        wrong-length|nan-value
 *               [--wait S]
 *
 * First learns the node's model (a FETCH naming none gets a MISMATCH reply
 * with it), then its anchor: an AVERAGE naming no anchor gets a REPLY with
 * the node's (closed at once; repeated every 0.3 s until the node has one
 * and is free, for up to S seconds, default 60). Then an AVERAGE naming
 * that anchor: the exchange goes compressed, and the probe sends
 * SPEC's encoding of a zero drift, exactly as long as the node expects,
 * with one field made hostile:
 *   nan-scale    int8: the first chunk's scale a NaN      (codec_scale)
 *   bad-index    top-k: the first index n, past the end   (codec_index)
 *   dup-index    top-k: the second index the first's     (codec_index)
 *   wrong-kind   the header's kind one past SPEC's        (codec_kind)
 *   wrong-length the header's count n + 1 (the message is
 *                as long as the node expects)            (codec_length)
 *   nan-value    bf16, top-k: the first value a NaN       (codec_value)
 * then XCHG_DONE, and waits (5 s at most) for the node to end the
 * connection. Prints one JSON object:
 *   {"model":"...","coded_bytes":N,"replies":["busy","ok",...],
 *    "sent":true,"closed_by_node":true}
 * Exit status: 0 done, 1 the node could not be reached or never offered a
 * compressed exchange, 2 bad usage. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "optimizer/optimizer.h"
#include "tests/integration/probe_xchg.h"

#define MAX_REPLIES 64

static int usage(const char* why) {
  fprintf(stderr,
          "coded_probe: %s\nusage: coded_probe --cluster-key PATH --connect "
          "HOST:PORT --compress SPEC --attack "
          "nan-scale|bad-index|dup-index|wrong-kind|wrong-length|nan-value "
          "[--wait S]\n",
          why);
  return 2;
}

typedef struct {
  const char* key_path;
  const char* target;
  st_codec_spec_t spec;
  const char* attack;
  double wait_s;
} args_t;

static int parse_args(int argc, char** argv, args_t* a) {
  memset(a, 0, sizeof(*a));
  a->wait_s = 60;
  bool have_spec = false;
  if (argc % 2 == 0)
    return usage("every option takes a value");
  for (int i = 1; i + 1 < argc; i += 2) {
    const char* k = argv[i];
    const char* v = argv[i + 1];
    char err[256];
    if (strcmp(k, "--cluster-key") == 0)
      a->key_path = v;
    else if (strcmp(k, "--connect") == 0)
      a->target = v;
    else if (strcmp(k, "--compress") == 0) {
      if (st_codec_parse(v, &a->spec, err, sizeof err) != 0)
        return usage(err);
      have_spec = true;
    } else if (strcmp(k, "--attack") == 0)
      a->attack = v;
    else if (strcmp(k, "--wait") == 0)
      a->wait_s = strtod(v, NULL);
    else
      return usage("unknown option");
  }
  if (a->key_path == NULL || a->target == NULL || !have_spec ||
      a->attack == NULL)
    return usage(
        "--cluster-key, --connect, --compress and --attack are "
        "required");
  return 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t) (v >> (8 * i));
}

/* SPEC's encoding of n zeros with the attack's field made hostile, into
 * buf (len bytes). 0, or -EINVAL for an attack SPEC cannot carry. */
static int hostile(const args_t* a, uint64_t n, uint8_t* buf, size_t len) {
  float* zeros = calloc((size_t) n, sizeof(float));
  size_t got = 0;
  int rc = zeros == NULL ? -ENOMEM : 0;
  if (rc == 0)
    rc = st_codec_encode(&a->spec, zeros, (size_t) n, buf, len, &got);
  free(zeros);
  if (rc != 0 || got != len)
    return rc != 0 ? rc : -EPROTO;
  uint8_t* body = buf + ST_CODEC_HEADER_BYTES;
  bool topk = a->spec.kind == ST_CODEC_TOPK;
  if (strcmp(a->attack, "wrong-kind") == 0)
    buf[1] = (uint8_t) ((buf[1] + 1) % 4);
  else if (strcmp(a->attack, "wrong-length") == 0)
    put_u32(buf + 8, (uint32_t) (n + 1)); /* n < 2^32 here: its low half */
  else if (strcmp(a->attack, "nan-scale") == 0 && a->spec.kind == ST_CODEC_INT8)
    put_u32(buf + ST_CODEC_HEADER_BYTES, 0x7fc00000u);
  else if (strcmp(a->attack, "bad-index") == 0 && topk)
    put_u32(body, (uint32_t) n);
  else if (strcmp(a->attack, "dup-index") == 0 && topk && len >= 32)
    memcpy(body + 8, body, 4); /* entries are (index u32, value f32) */
  else if (strcmp(a->attack, "nan-value") == 0 && topk)
    put_u32(body + 4, 0x7fc00000u);
  else if (strcmp(a->attack, "nan-value") == 0 && a->spec.kind == ST_CODEC_BF16)
    body[0] = 0xc0, body[1] = 0x7f;
  else
    return -EINVAL;
  return 0;
}

/* Sends coded[0..len) as XCHG_CODED pieces, then XCHG_DONE. */
static int send_coded(int fd, st_stream_t* tx, const uint8_t* coded,
                      size_t len) {
  st_msg_t m;
  for (size_t off = 0; off < len;) {
    size_t k = len - off;
    if (k > ST_WIRE_CHUNK_MAX_BYTES)
      k = ST_WIRE_CHUNK_MAX_BYTES;
    memset(&m, 0, sizeof(m));
    m.type = ST_MSG_XCHG_CODED;
    m.u.xchg_coded.offset = off;
    m.u.xchg_coded.total = len;
    m.u.xchg_coded.data = coded + off;
    m.u.xchg_coded.data_len = (uint32_t) k;
    if (probe_send(fd, tx, &m) != 0)
      return -EIO;
    off += k;
  }
  memset(&m, 0, sizeof(m));
  m.type = ST_MSG_XCHG_DONE;
  return probe_send(fd, tx, &m);
}

/* Reads (and drops) what the node sends until it ends the connection or
 * 5 s pass: true when it ended it. */
static bool closed_by_node(int fd) {
  uint8_t buf[65536];
  double t0 = now_s();
  while (now_s() - t0 < 5) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0)
      continue;
    ssize_t r = read(fd, buf, sizeof buf);
    if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN))
      return true;
  }
  return false;
}

typedef struct {
  const char* names[MAX_REPLIES];
  int n;
} replies_t;

static void note(replies_t* r, uint8_t status) {
  if (r->n < MAX_REPLIES)
    r->names[r->n++] = probe_status_name(status);
}

/* An AVERAGE naming `anchor` (NULL: none). Returns the fd when the reply
 * is OK (and, with an anchor, names the same one), the reply in *reply;
 * else -1. */
static int average(const args_t* a, const st_keyring_t* keys,
                   const st_msg_xchg_reply_t* node, const uint8_t* anchor,
                   st_msg_xchg_reply_t* reply, st_stream_t* tx, st_stream_t* rx,
                   replies_t* log) {
  st_msg_xchg_req_t req;
  memset(&req, 0, sizeof(req));
  req.kind = ST_XCHG_AVERAGE;
  memcpy(req.fingerprint, node->fingerprint, sizeof(req.fingerprint));
  memcpy(req.model, node->model, sizeof(req.model));
  req.n_params = node->n_params;
  if (anchor != NULL)
    memcpy(req.anchor, anchor, ST_XCHG_ANCHOR_BYTES);
  int fd = probe_xchg_open(a->target, keys, &req, 0, reply, tx, rx);
  if (fd < 0)
    return -1;
  note(log, reply->status);
  if (reply->status == ST_XCHG_STATUS_OK &&
      (anchor == NULL ||
       memcmp(reply->anchor, anchor, ST_XCHG_ANCHOR_BYTES) == 0))
    return fd;
  close(fd);
  st_stream_wipe(tx);
  st_stream_wipe(rx);
  return -1;
}

static int run(const args_t* a, const st_keyring_t* keys) {
  st_msg_xchg_reply_t node;
  if (probe_learn_model(a->target, keys, "coded_probe", &node) != 0) {
    fprintf(stderr, "coded_probe: could not learn %s's model\n", a->target);
    return 1;
  }
  static const uint8_t none[ST_XCHG_ANCHOR_BYTES];
  uint8_t anchor[ST_XCHG_ANCHOR_BYTES];
  bool have_anchor = false;
  replies_t log = {{0}, 0};
  st_stream_t tx, rx;
  st_msg_xchg_reply_t r;
  int fd = -1;
  for (double t0 = now_s(); fd < 0 && now_s() - t0 < a->wait_s;) {
    if (!have_anchor) {
      int f = average(a, keys, &node, NULL, &r, &tx, &rx, &log);
      if (f >= 0) {
        close(f);
        st_stream_wipe(&tx);
        st_stream_wipe(&rx);
        if (memcmp(r.anchor, none, sizeof none) != 0) {
          memcpy(anchor, r.anchor, sizeof anchor);
          have_anchor = true;
          continue;
        }
      }
    } else {
      fd = average(a, keys, &node, anchor, &r, &tx, &rx, &log);
      if (fd < 0 && r.status == ST_XCHG_STATUS_OK)
        have_anchor = false; /* a newer anchor: learn it again */
      if (fd >= 0)
        break;
    }
    usleep(300 * 1000);
  }
  if (fd < 0) {
    fprintf(stderr,
            "coded_probe: %s never offered a compressed exchange within "
            "%.0f s\n",
            a->target, a->wait_s);
    return 1;
  }
  size_t len = st_codec_encoded_bytes(&a->spec, node.n_params);
  uint8_t* coded = malloc(len > 0 ? len : 1);
  int rc = coded == NULL ? -ENOMEM : hostile(a, node.n_params, coded, len);
  if (rc == -EINVAL) {
    free(coded);
    close(fd);
    return usage("--attack does not fit --compress");
  }
  bool sent = rc == 0 && send_coded(fd, &tx, coded, len) == 0;
  bool closed = sent && closed_by_node(fd);
  free(coded);
  close(fd);
  st_stream_wipe(&tx);
  st_stream_wipe(&rx);
  printf("{\"model\":\"%s\",\"coded_bytes\":%zu,\"replies\":[", node.model,
         len);
  for (int i = 0; i < log.n; i++)
    printf("%s\"%s\"", i > 0 ? "," : "", log.names[i]);
  printf("],\"sent\":%s,\"closed_by_node\":%s}\n", sent ? "true" : "false",
         closed ? "true" : "false");
  return sent ? 0 : 1;
}

int main(int argc, char** argv) {
  args_t a;
  int bad = parse_args(argc, argv, &a);
  if (bad != 0)
    return bad;
  st_cluster_key_t ck;
  st_keyring_t keys;
  if (probe_load_keys("coded_probe", a.key_path, &ck, &keys) != 0)
    return 1;
  int rc = run(&a, &keys);
  st_keyring_wipe(&keys);
  st_cluster_key_wipe(&ck);
  return rc;
}
