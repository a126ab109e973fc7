/* comm.c: the client library's collectives (client/starling/client.h,
 * "Collectives"): a session on the node's control socket ("collectives",
 * then request and reply frames; docs/collectives.md) and one blocking
 * call per operation. The node runs the operation with its peers; the
 * library only moves the operand in and the result out.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "client/client_internal.h"

/* How long opening waits for the node's "ready", and how long past the
 * caller's timeout a reply may take (the node enforces the timeout). */
#define OPEN_TIMEOUT_S 10.0
/* A publish copies up to 1 GiB into the node: a minute at most. */
#define STORE_TIMEOUT_S 60.0
#define REPLY_GRACE_S 10.0
#define REPLY_JSON_MAX (64u * 1024u)

/* Operands of this many bytes or more go through the session's shared
 * segment (when it has one); smaller ones ride in the request frame. */
#define SHM_MIN_BYTES (32u * 1024u)

struct st_comm_s {
  int sock;
  bool gone;
  uint32_t rank, size;
  uint8_t* shm; /* the session's shared segment, mapped; NULL: none */
  uint64_t shm_bytes;
  char err[768];
};

static int fail(st_comm_t* c, int rc, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(st_comm_t* c, int rc, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err, sizeof c->err, fmt, ap);
  va_end(ap);
  return rc;
}

/* Connects to the node at path and opens a session with first (its first
 * line): *sock, the answer line, and the descriptor that came with it
 * (*fd, -1: none). 0, or -errno with err said. */
static int open_session(const char* path, const char* first, int* sock,
                        char* line, size_t cap, int* fd, char* err,
                        size_t err_len) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  memcpy(sa.sun_path, path, strlen(path) + 1);
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0)
    return -errno;
  if (connect(s, (struct sockaddr*) &sa, sizeof sa) != 0) {
    int e = errno;
    close(s);
    st_set_err(err, err_len,
               "no starling node at %s (%s): is `starling node` running "
               "with that data directory?",
               path, strerror(e));
    return -e;
  }
  /* Non-blocking: every wait below is a poll with the call's deadline. */
  (void) fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
  double deadline = st_now_s() + OPEN_TIMEOUT_S;
  int rc = st__client_send_all(s, (const uint8_t*) first, strlen(first), -1,
                               deadline);
  if (rc == 0)
    rc = st__client_recv_line_fd(s, line, cap, fd, deadline);
  if (rc != 0) {
    close(s);
    st_set_err(err, err_len, "the node at %s did not answer (%s)", path,
               strerror(-rc));
    return rc;
  }
  *sock = s;
  return 0;
}

/* Maps the session's shared segment (the node's memfd); without it the
 * session moves every operand over the socket. */
static void map_segment(st_comm_t* c, int fd) {
  struct stat st;
  if (fd < 0)
    return;
  if (fstat(fd, &st) == 0 && st.st_size > 0) {
    void* p = mmap(NULL, (size_t) st.st_size, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (p != MAP_FAILED) {
      c->shm = p;
      c->shm_bytes = (uint64_t) st.st_size;
    }
  }
  close(fd);
}

int st_comm_open(const char* socket_path, st_comm_t** out, char* err,
                 size_t err_len) {
  if (out == NULL)
    return -EINVAL;
  *out = NULL;
  if (socket_path == NULL ||
      strlen(socket_path) >= sizeof(((struct sockaddr_un*) 0)->sun_path)) {
    st_set_err(err, err_len, "the socket path is missing or too long");
    return -ENAMETOOLONG;
  }
  char line[600];
  int sock = -1, fd = -1;
  int rc = open_session(socket_path, "collectives shm\n", &sock, line,
                        sizeof line, &fd, err, err_len);
  if (rc == 0 && strncmp(line, "error: unknown request", 22) == 0) {
    /* A node from before the shared segment: the plain session. */
    close(sock);
    rc = open_session(socket_path, "collectives\n", &sock, line, sizeof line,
                      &fd, err, err_len);
  }
  if (rc != 0)
    return rc;
  if (strcmp(line, "ready") != 0) {
    if (fd >= 0)
      close(fd);
    close(sock);
    st_set_err(err, err_len, "the node at %s refused: %s", socket_path,
               strncmp(line, "error ", 6) == 0 ? line + 6 : line);
    return -EBUSY;
  }
  st_comm_t* c = calloc(1, sizeof(*c));
  if (c == NULL) {
    if (fd >= 0)
      close(fd);
    close(sock);
    return -ENOMEM;
  }
  c->sock = sock;
  map_segment(c, fd);
  *out = c;
  return 0;
}

void st_comm_close(st_comm_t* c) {
  if (c == NULL)
    return;
  if (c->sock >= 0)
    close(c->sock);
  if (c->shm != NULL)
    munmap(c->shm, (size_t) c->shm_bytes);
  free(c);
}

const char* st_comm_error(const st_comm_t* c) {
  return c != NULL ? c->err : "";
}

void st__comm_set_error(st_comm_t* c, const char* text) {
  snprintf(c->err, sizeof c->err, "%s", text);
}

void st_comm_last_group(const st_comm_t* c, uint32_t* rank, uint32_t* size) {
  if (rank != NULL)
    *rank = c != NULL ? c->rank : 0;
  if (size != NULL)
    *size = c != NULL ? c->size : 0;
}

/* ---- One request ---------------------------------------------------------
 */

/* A dtype's element bytes and wire name (valid dtypes only). */
static uint64_t elem_bytes(st_comm_dtype_t t) {
  return t == ST_COMM_F64 ? 8 : t == ST_COMM_BF16 ? 2 : 4;
}
static const char* dtype_name(st_comm_dtype_t t) {
  return t == ST_COMM_F64    ? "float64"
         : t == ST_COMM_BF16 ? "bfloat16"
                             : "float32";
}

/* The request's "timeout_ms": 0 for none, else at least 1 (a timeout under
 * half a millisecond must not become none). */
static uint64_t timeout_ms(double timeout_s) {
  if (!(timeout_s > 0) || !isfinite(timeout_s))
    return 0; /* none (an infinite one too) */
  double ms = ceil(timeout_s * 1000);
  return ms < 1 ? 1 : (uint64_t) ms;
}

static int gone(st_comm_t* c, int rc) {
  c->gone = true;
  return fail(c, -ENOTCONN, "the node went away (%s)", strerror(-rc));
}

/* Sends json and data[0..bytes), then reads the reply: its JSON into
 * *doc and its data (at most out_cap bytes) into out. */
static int roundtrip(st_comm_t* c, const char* json, const void* data,
                     uint64_t bytes, double timeout_s, st_json_doc_t** doc,
                     void* out, uint64_t out_cap, uint64_t* out_len) {
  if (c->gone)
    return fail(c, -ENOTCONN,
                "this communicator is closed: the node went away, or did not "
                "answer a call in time (open a new one)");
  double deadline =
      timeout_s > 0 ? st_now_s() + timeout_s + REPLY_GRACE_S : INFINITY;
  size_t jl = strlen(json);
  uint8_t hdr[4] = {(uint8_t) jl, (uint8_t) (jl >> 8), (uint8_t) (jl >> 16),
                    (uint8_t) (jl >> 24)};
  int rc = st__client_send_all(c->sock, hdr, 4, -1, deadline);
  if (rc == 0)
    rc = st__client_send_all(c->sock, (const uint8_t*) json, jl, -1, deadline);
  if (rc == 0 && bytes > 0)
    rc = st__client_send_all(c->sock, data, bytes, -1, deadline);
  if (rc == 0)
    rc = st__client_recv_all(c->sock, hdr, 4, deadline);
  if (rc == -ETIMEDOUT) {
    /* Its answer may still come, and would be read as the next call's. */
    c->gone = true;
    close(c->sock);
    c->sock = -1;
    return fail(c, rc,
                "the node did not answer within %.0f s of the call's timeout; "
                "this communicator is closed (open a new one)",
                REPLY_GRACE_S);
  }
  if (rc != 0)
    return gone(c, rc);
  uint32_t n = (uint32_t) hdr[0] | (uint32_t) hdr[1] << 8 |
               (uint32_t) hdr[2] << 16 | (uint32_t) hdr[3] << 24;
  if (n == 0 || n > REPLY_JSON_MAX)
    return gone(c, -EPROTO);
  char* text = malloc(n);
  if (text == NULL)
    return -ENOMEM;
  rc = st__client_recv_all(c->sock, (uint8_t*) text, n, deadline);
  st_json_limits_t lim = {.max_depth = 3, .max_values = 100000};
  if (rc == 0 && st_json_parse(text, n, &lim, doc, NULL, 0) != 0)
    rc = -EPROTO;
  free(text);
  if (rc != 0)
    return gone(c, rc);
  const st_json_t* b = st_json_get(st_json_root(*doc), "bytes");
  uint64_t len =
      b != NULL && b->is_int && b->integer > 0 ? (uint64_t) b->integer : 0;
  if (len > out_cap) {
    st_json_free(*doc);
    *doc = NULL;
    return gone(c, -EPROTO);
  }
  if (len > 0 && (rc = st__client_recv_all(c->sock, out, len, deadline)) != 0) {
    st_json_free(*doc);
    *doc = NULL;
    return gone(c, rc);
  }
  *out_len = len;
  return 0;
}

/* The reply's verdict: 0, or the errno its "result" maps to. */
static int verdict(st_comm_t* c, const st_json_t* root) {
  const st_json_t* ok = st_json_get(root, "ok");
  if (ok != NULL && ok->type == ST_JSON_BOOL && ok->boolean) {
    c->err[0] = '\0';
    return 0;
  }
  const st_json_t* r = st_json_get(root, "result");
  const st_json_t* e = st_json_get(root, "error");
  const char* res = r != NULL && r->type == ST_JSON_STRING ? r->str : "";
  fail(c, 0, "%s", e != NULL && e->type == ST_JSON_STRING ? e->str : "failed");
  if (strcmp(res, "invalid") == 0 || strcmp(res, "mismatch") == 0)
    return -EINVAL;
  if (strcmp(res, "timeout") == 0)
    return -ETIMEDOUT;
  if (strcmp(res, "missing") == 0)
    return -ENOENT;
  if (strcmp(res, "busy") == 0)
    return -EBUSY;
  if (strcmp(res, "full") == 0)
    return -ENOSPC;
  return -ECONNABORTED;
}

int st_comm_members(st_comm_t* c, char (*ids)[33], size_t cap, size_t* n,
                    size_t* rank) {
  if (c == NULL)
    return -EINVAL;
  st_json_doc_t* doc = NULL;
  uint64_t got = 0;
  int rc = roundtrip(c, "{\"op\":\"members\"}", NULL, 0, OPEN_TIMEOUT_S, &doc,
                     NULL, 0, &got);
  if (rc != 0)
    return rc;
  const st_json_t* root = st_json_root(doc);
  rc = verdict(c, root);
  const st_json_t* m = st_json_get(root, "members");
  const st_json_t* r = st_json_get(root, "rank");
  if (rc == 0 && (m == NULL || m->type != ST_JSON_ARRAY || r == NULL))
    rc = fail(c, -EPROTO, "the node's answer lacks the members");
  if (rc == 0) {
    size_t i = 0;
    for (const st_json_t* e = m->child; e != NULL; e = e->next, i++)
      if (i < cap && ids != NULL)
        snprintf(ids[i], 33, "%s", e->type == ST_JSON_STRING ? e->str : "");
    if (n != NULL)
      *n = m->count;
    if (rank != NULL)
      *rank = (size_t) r->integer;
  }
  st_json_free(doc);
  return rc;
}

/* Appends the group as JSON: "all", or the list of ids. */
static int put_group(st_comm_t* c, st_json_buf_t* b, const char* group) {
  if (group == NULL || strcmp(group, "all") == 0) {
    st_json_buf_puts(b, "\"all\"");
    return 0;
  }
  st_json_buf_puts(b, "[");
  const char* p = group;
  for (int i = 0; *p != '\0'; i++) {
    size_t len = strcspn(p, ",");
    if (len != 32 || strspn(p, "0123456789abcdefABCDEF") < 32)
      return fail(c, -EINVAL,
                  "group \"%s\": \"all\" or member ids of 32 hex digits "
                  "separated by commas",
                  group);
    char id[33];
    memcpy(id, p, 32);
    id[32] = '\0';
    for (int k = 0; k < 32; k++)
      id[k] = (char) (id[k] >= 'A' && id[k] <= 'F' ? id[k] + 32 : id[k]);
    st_json_buf_puts(b, i ? ",\"" : "\"");
    st_json_buf_puts(b, id);
    st_json_buf_puts(b, "\"");
    p += len + (p[len] == ',');
  }
  st_json_buf_puts(b, "]");
  return 0;
}

/* Where an operand of bytes travels: its offset in the shared segment
 * (copied there unless it already lies in it, or copy_in is false), or -1:
 * in the request frame. */
static int64_t shm_place(st_comm_t* c, const void* data, uint64_t bytes,
                         bool copy_in) {
  if (c->shm == NULL || bytes < SHM_MIN_BYTES || bytes > c->shm_bytes)
    return -1;
  uintptr_t p = (uintptr_t) data, base = (uintptr_t) c->shm;
  if (p >= base && p - base <= c->shm_bytes - bytes)
    return (int64_t) (p - base);
  if (copy_in)
    memcpy(c->shm, data, bytes);
  return 0;
}

/* After an ok reply to a request that had "shm": off: the result the node
 * wrote there ("shm": its bytes, at most cap) into data. */
static int shm_take(st_comm_t* c, const st_json_t* root, int64_t off,
                    void* data, uint64_t cap, uint64_t* got) {
  const st_json_t* v = st_json_get(root, "shm");
  if (v == NULL || !v->is_int || v->integer < 0 || (uint64_t) v->integer > cap)
    return fail(c, -EPROTO, "the node's answer lacks the result's size");
  uint8_t* at = c->shm + off;
  if (v->integer > 0 && data != NULL && (uint8_t*) data != at)
    memcpy(data, at, (size_t) v->integer);
  *got = (uint64_t) v->integer;
  return 0;
}

/* ",\"shm\":OFF" into the request when the operand is in the segment. */
static void put_shm(st_json_buf_t* b, int64_t off) {
  if (off < 0)
    return;
  st_json_buf_puts(b, ",\"shm\":");
  st_json_buf_u64(b, (uint64_t) off);
}

static const char* const kind_names[] = {"all_reduce", "reduce", "broadcast",
                                         "barrier"};
static const char* const op_names[] = {"sum", "mean", "min", "max"};

/* One operation: kind 0..3 as kind_names. */
static int run_op(st_comm_t* c, int kind, const char* group, uint32_t root,
                  void* data, uint64_t count, st_comm_dtype_t dtype,
                  st_comm_op_t op, double timeout_s) {
  if (c == NULL)
    return -EINVAL;
  if ((unsigned) dtype > ST_COMM_BF16 || (unsigned) op > ST_COMM_MAX ||
      (count > 0 && data == NULL) || !(timeout_s >= 0))
    return fail(c, -EINVAL,
                "bad arguments: dtype, op, data (NULL with count %" PRIu64
                ") or timeout",
                count);
  uint64_t bytes = kind == 3 ? 0 : count * elem_bytes(dtype);
  int64_t off = shm_place(c, data, bytes, true);
  uint64_t wire = off >= 0 ? 0 : bytes; /* the operand's bytes on the socket */
  st_json_buf_t b;
  st_json_buf_init(&b);
  char head[512];
  snprintf(head, sizeof head,
           "{\"op\":\"%s\",\"rop\":\"%s\",\"dtype\":\"%s\",\"count\":%" PRIu64
           ",\"root\":%u,\"timeout_ms\":%" PRIu64 ",\"bytes\":%" PRIu64,
           kind_names[kind], op_names[op], dtype_name(dtype),
           kind == 3 ? 1 : count, root, timeout_ms(timeout_s), wire);
  st_json_buf_puts(&b, head);
  put_shm(&b, off);
  st_json_buf_puts(&b, ",\"group\":");
  int rc = put_group(c, &b, group);
  st_json_buf_puts(&b, "}");
  if (rc == 0 && b.failed)
    rc = -ENOMEM;
  st_json_doc_t* doc = NULL;
  uint64_t got = 0;
  if (rc == 0)
    rc = roundtrip(c, b.p, data, wire, timeout_s, &doc, data, wire, &got);
  st_json_buf_free(&b);
  if (rc != 0)
    return rc;
  const st_json_t* root_v = st_json_root(doc);
  rc = verdict(c, root_v);
  if (rc == 0 && off >= 0)
    rc = shm_take(c, root_v, off, data, bytes, &got);
  if (rc == 0) {
    const st_json_t* r = st_json_get(root_v, "rank");
    const st_json_t* n = st_json_get(root_v, "n");
    c->rank = r != NULL ? (uint32_t) r->integer : 0;
    c->size = n != NULL ? (uint32_t) n->integer : 0;
  }
  st_json_free(doc);
  return rc;
}

static const char* const p2p_names[] = {"push",  "pull",    "notify",   "wait",
                                        "fetch", "publish", "unpublish"};
enum { P_PUSH, P_PULL, P_NOTIFY, P_WAIT, P_FETCH, P_PUBLISH, P_UNPUBLISH };

/* The request of a named call (which indexes p2p_names) into b. */
static void p2p_request(st_json_buf_t* b, int which, const char* peer,
                        const char* name, uint64_t count, st_comm_dtype_t dtype,
                        double timeout_s, uint64_t wire, int64_t off) {
  bool moves = which <= P_PULL || which == P_FETCH || which == P_PUBLISH;
  char head[256];
  snprintf(head, sizeof head,
           "{\"op\":\"%s\",\"dtype\":\"%s\",\"count\":%" PRIu64
           ",\"timeout_ms\":%" PRIu64 ",\"bytes\":%" PRIu64,
           p2p_names[which], dtype_name(dtype), moves ? count : 0,
           timeout_ms(timeout_s), wire);
  st_json_buf_puts(b, head);
  put_shm(b, off);
  if (which <= P_FETCH) {
    st_json_buf_puts(b, ",\"peer\":\"");
    for (int k = 0; k < 32; k++) {
      char ch[2] = {(char) tolower((unsigned char) peer[k]), '\0'};
      st_json_buf_puts(b, ch);
    }
    st_json_buf_puts(b, "\"");
  }
  st_json_buf_puts(b, ",\"name\":");
  st_json_buf_string(b, name);
  st_json_buf_puts(b, "}");
}

/* A call on a name: point to point with peer (push, pull, notify, wait,
 * fetch), or on this node's store (publish, unpublish); data/count/dtype
 * for those that move data (pull and fetch receive into data). */
static int run_p2p(st_comm_t* c, int which, const char* peer, const char* name,
                   void* data, uint64_t count, st_comm_dtype_t dtype,
                   double timeout_s) {
  if (c == NULL)
    return -EINVAL;
  bool sends = which == P_PUSH || which == P_PUBLISH;
  bool receives = which == P_PULL || which == P_FETCH;
  bool moves = sends || receives;
  if (which <= P_FETCH && (peer == NULL || strlen(peer) != 32 ||
                           strspn(peer, "0123456789abcdefABCDEF") != 32))
    return fail(c, -EINVAL, "peer \"%s\": a member id of 32 hex digits",
                peer != NULL ? peer : "(null)");
  if (name == NULL || name[0] == '\0' || strlen(name) > 128)
    return fail(c, -EINVAL, "a %s name is 1 to 128 bytes", p2p_names[which]);
  if ((moves && (unsigned) dtype > ST_COMM_BF16) ||
      (moves && count > 0 && data == NULL) || !(timeout_s >= 0))
    return fail(c, -EINVAL,
                "bad arguments: dtype, data (NULL with count %" PRIu64
                ") or timeout",
                count);
  uint64_t bytes = moves ? count * elem_bytes(dtype) : 0;
  int64_t off = shm_place(c, data, bytes, sends);
  uint64_t wire = off >= 0 ? 0 : bytes; /* the operand's bytes on the socket */
  st_json_buf_t b;
  st_json_buf_init(&b);
  p2p_request(&b, which, peer, name, count, dtype, timeout_s, sends ? wire : 0,
              off);
  int rc = b.failed ? -ENOMEM : 0;
  st_json_doc_t* doc = NULL;
  uint64_t got = 0;
  if (rc == 0)
    rc = roundtrip(c, b.p, data, sends ? wire : 0,
                   which <= P_FETCH ? timeout_s : STORE_TIMEOUT_S, &doc,
                   receives ? data : NULL, receives ? wire : 0, &got);
  st_json_buf_free(&b);
  if (rc != 0)
    return rc;
  rc = verdict(c, st_json_root(doc));
  if (rc == 0 && off >= 0 && which != P_PUBLISH)
    rc = shm_take(c, st_json_root(doc), off, receives ? data : NULL,
                  receives ? bytes : 0, &got);
  if (rc == 0 && receives && got != bytes)
    rc =
        fail(c, -EPROTO, "the node sent %" PRIu64 " bytes for a %s of %" PRIu64,
             got, p2p_names[which], bytes);
  st_json_free(doc);
  return rc;
}

int st_comm_push(st_comm_t* c, const char* peer, const char* name,
                 const void* data, uint64_t count, st_comm_dtype_t dtype,
                 double timeout_s) {
  return run_p2p(c, P_PUSH, peer, name, (void*) data, count, dtype, timeout_s);
}

int st_comm_pull(st_comm_t* c, const char* peer, const char* name, void* data,
                 uint64_t count, st_comm_dtype_t dtype, double timeout_s) {
  return run_p2p(c, P_PULL, peer, name, data, count, dtype, timeout_s);
}

int st_comm_notify(st_comm_t* c, const char* peer, const char* name,
                   double timeout_s) {
  return run_p2p(c, P_NOTIFY, peer, name, NULL, 0, ST_COMM_F32, timeout_s);
}

int st_comm_wait(st_comm_t* c, const char* peer, const char* name,
                 double timeout_s) {
  return run_p2p(c, P_WAIT, peer, name, NULL, 0, ST_COMM_F32, timeout_s);
}

int st_comm_publish(st_comm_t* c, const char* name, const void* data,
                    uint64_t count, st_comm_dtype_t dtype) {
  return run_p2p(c, P_PUBLISH, NULL, name, (void*) data, count, dtype, 0);
}

int st_comm_unpublish(st_comm_t* c, const char* name) {
  return run_p2p(c, P_UNPUBLISH, NULL, name, NULL, 0, ST_COMM_F32, 0);
}

/* A busy publisher is asked again, after 10 ms doubling to 0.5 s, until
 * the caller's timeout. */
int st_comm_fetch(st_comm_t* c, const char* peer, const char* name, void* data,
                  uint64_t count, st_comm_dtype_t dtype, double timeout_s) {
  double end = timeout_s > 0 ? st_now_s() + timeout_s : INFINITY;
  double pause = 0.01;
  for (;;) {
    double left = timeout_s > 0 ? end - st_now_s() : 0;
    int rc = run_p2p(c, P_FETCH, peer, name, data, count, dtype,
                     timeout_s > 0 && left < 0.001 ? 0.001 : left);
    if (rc != -EBUSY || st_now_s() + pause >= end)
      return rc;
    struct timespec ts = {(time_t) pause,
                          (long) ((pause - (double) (time_t) pause) * 1e9)};
    nanosleep(&ts, NULL);
    pause = pause * 2 < 0.5 ? pause * 2 : 0.5;
  }
}

int st_comm_all_reduce(st_comm_t* c, const char* group, void* data,
                       uint64_t count, st_comm_dtype_t dtype, st_comm_op_t op,
                       double timeout_s) {
  return run_op(c, 0, group, 0, data, count, dtype, op, timeout_s);
}

int st_comm_reduce(st_comm_t* c, const char* group, uint32_t root, void* data,
                   uint64_t count, st_comm_dtype_t dtype, st_comm_op_t op,
                   double timeout_s) {
  return run_op(c, 1, group, root, data, count, dtype, op, timeout_s);
}

int st_comm_broadcast(st_comm_t* c, const char* group, uint32_t root,
                      void* data, uint64_t count, st_comm_dtype_t dtype,
                      double timeout_s) {
  return run_op(c, 2, group, root, data, count, dtype, ST_COMM_SUM, timeout_s);
}

int st_comm_barrier(st_comm_t* c, const char* group, double timeout_s) {
  return run_op(c, 3, group, 0, NULL, 0, ST_COMM_F32, ST_COMM_SUM, timeout_s);
}
