/* daemon_coll_session.c: the programs' side of the user collectives
 * (docs/collectives.md, "The control-socket protocol"). A program writes
 * "collectives\n" on the control socket; the node answers "ready\n" and
 * the connection becomes a session: the program sends one request frame
 * at a time (a 4-byte little-endian length, that many bytes of JSON, then
 * the "bytes" of operand the JSON announces) and waits for the reply frame
 * (the same shape: JSON, then the result's bytes). Requests: "members"
 * (the group "all" would be now, and this node's rank in it),
 * "all_reduce", "reduce", "broadcast", "barrier" (daemon_coll.c runs
 * them), and "push", "pull", "notify", "wait", run as broadcasts over
 * two members. The program going away fails its operation
 * everywhere.
 *
 * A session opened with "collectives shm" gets a shared segment: the node
 * creates a memfd of ST__COLL_DATA_MAX bytes (sparse: pages exist once
 * written), seals its size and sends the descriptor with "ready". A
 * request whose JSON has "shm": OFFSET carries its operand in the segment
 * at that offset instead of on the socket; the operation works there in
 * place (st_coll_new_in) and leaves its result there: a large operand
 * crosses no socket and is not copied by the node at all.
 */
#define _GNU_SOURCE /* memfd_create, F_ADD_SEALS */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "node/daemon/daemon_internal.h"

#ifndef F_ADD_SEALS
#define F_ADD_SEALS 1033
#define F_SEAL_SEAL 0x0001
#define F_SEAL_SHRINK 0x0002
#define F_SEAL_GROW 0x0004
#endif

#define HEADER_MAX (64u * 1024u)
#define READ_CHUNK (256u * 1024u)

typedef struct st__coll_session_s {
  struct st__coll_session_s* next;
  st__daemon_t* d;
  uv_pipe_t pipe;
  bool closing;
  uint8_t* rbuf;
  size_t rlen, rcap;
  size_t want; /* the whole request's bytes once its header is known */
  size_t hlen;
  st__coll_op_t* op; /* the running operation, or NULL */
  uint8_t* shm;      /* the shared segment, mapped; NULL: none */
  size_t shm_bytes;
} session_t;

typedef struct {
  uv_write_t req;
  session_t* s;
  size_t len;
  uint8_t data[];
} wreq_t;

/* An operand this large is not kept in the session's buffer afterwards,
 * and the heap is trimmed: a node that served one 64 MiB all-reduce
 * otherwise kept ~200 MB resident (glibc keeps freed segments and sealed
 * frames in its arenas). */
#define LARGE_BYTES (8u << 20)

static void session_close(session_t* s);
static void process(session_t* s);
static void give_back_memory(session_t* s);
static void alloc_cb(uv_handle_t* h, size_t suggested, uv_buf_t* buf);
static void read_cb(uv_stream_t* st, ssize_t nread, const uv_buf_t* buf);

/* ---- Replies -------------------------------------------------------------
 */

static void write_cb(uv_write_t* req, int status) {
  wreq_t* w = (wreq_t*) req;
  (void) status;
  bool large = w->len >= LARGE_BYTES;
  free(w);
  if (large)
    malloc_trim(0); /* the result's copy was the last large buffer */
}

/* Sends a reply frame: json, then data[0..len). */
static void reply(session_t* s, const char* json, const void* data,
                  size_t len) {
  if (s->closing)
    return;
  size_t jl = strlen(json);
  wreq_t* w = malloc(sizeof(*w) + 4 + jl + len);
  if (w == NULL) {
    session_close(s);
    return;
  }
  w->s = s;
  uint32_t n = (uint32_t) jl;
  uint8_t* p = w->data;
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t) (n >> (8 * i));
  memcpy(p + 4, json, jl);
  if (len > 0)
    memcpy(p + 4 + jl, data, len);
  w->len = 4 + jl + len;
  uv_buf_t b = uv_buf_init((char*) w->data, (unsigned) w->len);
  if (uv_write(&w->req, (uv_stream_t*) &s->pipe, &b, 1, write_cb) != 0) {
    free(w);
    session_close(s);
  }
}

static void reply_error(session_t* s, const char* result, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void reply_error(session_t* s, const char* result, const char* fmt,
                        ...) {
  char text[ST_COLL_REASON_MAX + 200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  st_json_buf_t b;
  st_json_buf_init(&b);
  st_json_buf_puts(&b, "{\"ok\":false,\"result\":");
  st_json_buf_string(&b, result);
  st_json_buf_puts(&b, ",\"error\":");
  st_json_buf_string(&b, text);
  st_json_buf_puts(&b, "}");
  if (b.failed)
    session_close(s);
  else
    reply(s, b.p, NULL, 0);
  st_json_buf_free(&b);
}

void st__coll_session_done(st__coll_op_t* op, st_coll_result_t result,
                           const char* msg) {
  session_t* s = op->session;
  if (result == ST_COLL_OK) {
    const void* res = op->no_result ? NULL : st_coll_result(op->m);
    size_t bytes = res != NULL ? op->count * st_coll_elem_bytes(op->dtype) : 0;
    char json[200];
    if (op->shm_off >= 0 && !s->closing) {
      /* In range: checked against the segment when the request came; the
       * machine worked there, so the result is usually there already. */
      if (bytes > 0 && res != (const void*) (s->shm + op->shm_off))
        memcpy(s->shm + op->shm_off, res, bytes);
      snprintf(json, sizeof json,
               "{\"ok\":true,\"bytes\":0,\"shm\":%zu,\"rank\":%u,\"n\":%u}",
               bytes, op->g.rank, op->g.n);
      reply(s, json, NULL, 0);
    } else {
      snprintf(json, sizeof json,
               "{\"ok\":true,\"bytes\":%zu,\"rank\":%u,\"n\":%u}", bytes,
               op->g.rank, op->g.n);
      reply(s, json, res, bytes);
    }
  } else {
    reply_error(s,
                op->refused == ST_COLL_FETCH_MISSING ? "missing"
                : op->refused == ST_COLL_FETCH_BUSY
                    ? "busy"
                    : st_coll_result_name(result),
                "%s", msg);
  }
  bool large = op->count * st_coll_elem_bytes(op->dtype) >= LARGE_BYTES;
  st_coll_free(op->m);
  st__coll_group_free(&op->g);
  free(op);
  s->op = NULL;
  if (s->closing)
    return;
  /* The next request may already be here. */
  memmove(s->rbuf, s->rbuf + s->want, s->rlen - s->want);
  s->rlen -= s->want;
  s->want = 0;
  if (large)
    give_back_memory(s);
  process(s);
  if (!s->closing && !uv_is_active((uv_handle_t*) &s->pipe))
    uv_read_start((uv_stream_t*) &s->pipe, alloc_cb, read_cb);
}

/* After a large operation: the read buffer shrinks to what it holds, and
 * the allocator returns free memory to the system. */
static void give_back_memory(session_t* s) {
  if (s->rcap > READ_CHUNK && s->rlen <= READ_CHUNK) {
    uint8_t* p = realloc(s->rbuf, READ_CHUNK);
    if (p != NULL) {
      s->rbuf = p;
      s->rcap = READ_CHUNK;
    }
  }
  malloc_trim(0);
}

/* ---- Requests ------------------------------------------------------------
 */

static int parse_id(const char* hex, size_t len, st_node_id_t* id) {
  if (len != 2 * sizeof(id->b))
    return -1;
  for (size_t i = 0; i < sizeof(id->b); i++) {
    unsigned v;
    if (sscanf(hex + 2 * i, "%2x", &v) != 1)
      return -1;
    id->b[i] = (uint8_t) v;
  }
  return 0;
}

static void members_reply(session_t* s) {
  st__coll_group_t g;
  char err[256];
  if (st__coll_group(s->d, NULL, 0, true, &g, err, sizeof err) != 0) {
    reply_error(s, "invalid", "%s", err);
    return;
  }
  st_json_buf_t b;
  st_json_buf_init(&b);
  char hex[33];
  st_node_id_format(&s->d->ident.id, hex);
  st_json_buf_puts(&b, "{\"ok\":true,\"self\":\"");
  st_json_buf_puts(&b, hex);
  st_json_buf_puts(&b, "\",\"rank\":");
  st_json_buf_u64(&b, g.rank);
  st_json_buf_puts(&b, ",\"members\":[");
  for (uint32_t i = 0; i < g.n; i++) {
    st_node_id_format(&g.ids[i], hex);
    st_json_buf_puts(&b, i ? ",\"" : "\"");
    st_json_buf_puts(&b, hex);
    st_json_buf_puts(&b, "\"");
  }
  st_json_buf_puts(&b, "]}");
  st__coll_group_free(&g);
  if (b.failed)
    session_close(s);
  else
    reply(s, b.p, NULL, 0);
  st_json_buf_free(&b);
}

static int pick(const char* v, const char* const* names, int n) {
  for (int i = 0; i < n && v != NULL; i++)
    if (strcmp(v, names[i]) == 0)
      return i;
  return -1;
}

static const char* str_of(const st_json_t* root, const char* key) {
  const st_json_t* v = st_json_get(root, key);
  return v != NULL && v->type == ST_JSON_STRING ? v->str : NULL;
}

static int64_t int_of(const st_json_t* root, const char* key, int64_t dflt) {
  const st_json_t* v = st_json_get(root, key);
  if (v == NULL)
    return dflt;
  return v->type == ST_JSON_NUMBER && v->is_int ? v->integer : -1;
}

/* The group: "all" (or absent), or an array of member ids. */
static int group_of(session_t* s, const st_json_t* root, st__coll_group_t* g,
                    char* err, size_t err_len) {
  const st_json_t* v = st_json_get(root, "group");
  if (v == NULL || (v->type == ST_JSON_STRING && strcmp(v->str, "all") == 0))
    return st__coll_group(s->d, NULL, 0, true, g, err, err_len);
  if (v->type != ST_JSON_ARRAY || v->count == 0 ||
      v->count > ST_COLL_MAX_MEMBERS) {
    st_set_err(err, err_len,
               "\"group\" is \"all\" or a list of 1 to %u member ids",
               ST_COLL_MAX_MEMBERS);
    return -EINVAL;
  }
  st_node_id_t* ids = calloc(v->count, sizeof(*ids));
  if (ids == NULL)
    return -ENOMEM;
  size_t n = 0;
  for (const st_json_t* e = v->child; e != NULL; e = e->next, n++)
    if (e->type != ST_JSON_STRING || parse_id(e->str, e->str_len, &ids[n])) {
      st_set_err(err, err_len,
                 "group member %zu is not a member id (32 hex digits, as "
                 "`starling peers` shows)",
                 n);
      free(ids);
      return -EINVAL;
    }
  int rc = st__coll_group(s->d, ids, n, false, g, err, err_len);
  free(ids);
  return rc;
}

static const char* const kinds[] = {"all_reduce", "reduce", "broadcast",
                                    "barrier"};
/* Point to point: a push and its pull are a broadcast over the pair from
 * the sender, a notify and its wait the same with no data, each in a key
 * space of its own (the kind, the sender, the name). The sender's part of
 * a broadcast ends once its data is sent, so a push and a notify return
 * without waiting for the pull or the wait; the receiver's node keeps what
 * came early (ST__COLL_PENDING_MAX, ST__COLL_PENDING_MS). */
enum { P2P_NONE = -1, P2P_PUSH, P2P_PULL, P2P_NOTIFY, P2P_WAIT, P2P_FETCH };
static const char* const p2p_kinds[] = {"push", "pull", "notify", "wait",
                                        "fetch"};
static const char* const rops[] = {"sum", "mean", "min", "max"};
static const char* const dtypes[] = {"float32", "float64", "bfloat16"};

/* Checks the request's fields into op; err names the first bad one. */
static int op_fields(const st_json_t* root, st__coll_op_t* op, int kind,
                     uint64_t bytes, char* err, size_t len) {
  int rop = pick(str_of(root, "rop") ? str_of(root, "rop") : "sum", rops, 4);
  int dt = pick(str_of(root, "dtype") ? str_of(root, "dtype") : "float32",
                dtypes, 3);
  int64_t count = int_of(root, "count", kind == ST_COLL_BARRIER ? 1 : -1);
  int64_t root_rank = int_of(root, "root", 0);
  int64_t timeout = int_of(root, "timeout_ms", 0);
  if (rop < 0)
    return st_set_err(err, len, "\"rop\" is sum, mean, min or max"), -EINVAL;
  if (dt < 0)
    return st_set_err(err, len, "\"dtype\" is float32, float64 or bfloat16"),
           -EINVAL;
  if (count < 0 || (uint64_t) count > ST_COLL_MAX_COUNT ||
      (kind == ST_COLL_BARRIER && count != 1))
    return st_set_err(err, len, "\"count\" is 0 to 2^37 elements"), -EINVAL;
  if (root_rank < 0 || root_rank >= ST_COLL_MAX_MEMBERS || timeout < 0)
    return st_set_err(err, len, "\"root\" or \"timeout_ms\" out of range"),
           -EINVAL;
  op->kind = (st_coll_kind_t) kind;
  op->rop = (st_coll_rop_t) rop;
  op->dtype = (st_coll_dtype_t) dt;
  op->count = (uint64_t) count;
  op->root = (uint32_t) root_rank;
  op->deadline_ms = (uint64_t) timeout;
  uint64_t want =
      kind == ST_COLL_BARRIER ? 0 : op->count * st_coll_elem_bytes(op->dtype);
  if (bytes != want && !(kind == ST_COLL_BROADCAST && bytes == 0))
    return st_set_err(err, len,
                      "%" PRIu64 " bytes of operand for %" PRIu64
                      " elements of %s; %" PRIu64 " expected",
                      bytes, op->count, dtypes[dt], want),
           -EINVAL;
  return 0;
}

/* A fetch's operation id: random, so that no two fetches share one. */
static int fetch_id(uint64_t* id) {
  do {
    if (getrandom(id, sizeof *id, 0) != (ssize_t) sizeof *id)
      return -EIO;
  } while (*id == 0);
  return 0;
}

/* The pair of a point-to-point call into op->g, its tag, and the
 * sender's rank as op->root; err names the first bad field. */
static int p2p_group(session_t* s, const st_json_t* root, int p2p,
                     uint64_t bytes, st__coll_op_t* op, char* err, size_t len) {
  const char* peer = str_of(root, "peer");
  const st_json_t* name = st_json_get(root, "name");
  st_node_id_t ids[2] = {s->d->ident.id};
  if (peer == NULL || parse_id(peer, strlen(peer), &ids[1]) != 0)
    return st_set_err(err, len,
                      "\"peer\" is a member id (32 hex digits, as `starling "
                      "peers` shows)"),
           -EINVAL;
  if (st_node_id_compare(&ids[0], &ids[1]) == 0)
    return st_set_err(err, len,
                      "\"peer\" is this node: %s goes to another member",
                      p2p_kinds[p2p]),
           -EINVAL;
  if (name == NULL || name->type != ST_JSON_STRING || name->str_len == 0 ||
      name->str_len > ST__COLL_NAME_MAX)
    return st_set_err(err, len, "\"name\" is a string of 1 to %u bytes",
                      ST__COLL_NAME_MAX),
           -EINVAL;
  if ((p2p == P2P_NOTIFY || p2p == P2P_WAIT) && op->count != 0)
    return st_set_err(err, len, "a %s carries no data: \"count\" is 0",
                      p2p_kinds[p2p]),
           -EINVAL;
  if (p2p == P2P_PUSH && bytes != op->count * st_coll_elem_bytes(op->dtype))
    return st_set_err(err, len,
                      "a push carries its %" PRIu64 " elements (%" PRIu64
                      " bytes came)",
                      op->count, bytes),
           -EINVAL;
  int rc = st__coll_group(s->d, ids, 2, false, &op->g, err, len);
  if (rc != 0)
    return rc;
  bool sends = p2p == P2P_PUSH || p2p == P2P_NOTIFY;
  const st_node_id_t* from = sends ? &ids[0] : &ids[1];
  op->root = st_node_id_compare(&op->g.ids[0], from) == 0 ? 0 : 1;
  op->no_result = p2p == P2P_PUSH;
  if (p2p == P2P_FETCH) {
    /* Numbered by no key: the publisher's program makes no call. */
    op->fetch = true;
    return fetch_id(&op->g.op_id);
  }
  op->g.tag = st__coll_tag(p2p <= P2P_PULL ? "push" : "notify", from, name->str,
                           name->str_len);
  return 0;
}

/* A request's "shm": OFFSET, when there is one: the operand (or, for a
 * pull, the room for the result) lies in the segment at OFFSET, and the
 * frame carries no bytes. Sets *off (-1: no "shm"), and *data and *bytes to
 * the operand as the socket path would have them. err names what is bad. */
static int shm_operand(session_t* s, const st_json_t* root, int kind, int p2p,
                       int64_t* off, const uint8_t** data, uint64_t* bytes,
                       char* err, size_t len) {
  *off = -1;
  if (st_json_get(root, "shm") == NULL)
    return 0;
  int64_t o = int_of(root, "shm", -1);
  int64_t count = int_of(root, "count", kind == ST_COLL_BARRIER ? 1 : -1);
  int dt = pick(str_of(root, "dtype") ? str_of(root, "dtype") : "float32",
                dtypes, 3);
  if (s->shm == NULL)
    return st_set_err(err, len,
                      "\"shm\" in a session without a shared segment (open "
                      "it with \"collectives shm\")"),
           -EINVAL;
  if (*bytes != 0)
    return st_set_err(err, len,
                      "a request with \"shm\" carries no bytes on the "
                      "socket (%" PRIu64 " came)",
                      *bytes),
           -EINVAL;
  if (o < 0 || count < 0 || (uint64_t) count > ST_COLL_MAX_COUNT || dt < 0)
    return st_set_err(err, len,
                      "\"shm\" is an offset in bytes, with a \"count\" of 0 "
                      "to 2^37 and a \"dtype\""),
           -EINVAL;
  bool moves = kind != ST_COLL_BARRIER && p2p != P2P_NOTIFY && p2p != P2P_WAIT;
  uint64_t want =
      moves ? (uint64_t) count * st_coll_elem_bytes((st_coll_dtype_t) dt) : 0;
  if ((uint64_t) o > s->shm_bytes || want > s->shm_bytes - (uint64_t) o)
    return st_set_err(err, len,
                      "%" PRIu64 " bytes at offset %" PRId64
                      " end past the shared segment (%zu bytes)",
                      want, o, s->shm_bytes),
           -EINVAL;
  *off = o;
  s->d->c.coll_shm_ops++;
  *data = s->shm + o;
  *bytes = p2p == P2P_PULL || p2p == P2P_FETCH ? 0 : want;
  return 0;
}

/* Sends a fetch's ASK to the publisher, before its operation starts: the
 * answer (the broadcast, or a refusal) can only follow it. */
static int ask(st__daemon_t* d, const st__coll_op_t* op,
               const st_json_t* root) {
  const st_json_t* name = st_json_get(root, "name");
  st_msg_t m = {.type = ST_MSG_COLL_FETCH};
  m.u.coll_fetch = (st_msg_coll_fetch_t){.op_id = op->g.op_id,
                                         .code = ST_COLL_FETCH_ASK,
                                         .text = name->str,
                                         .text_len = (uint32_t) name->str_len};
  return st__coll_send_msg(d, &op->g.ids[op->root], &m) != 0 ? -EPIPE : 0;
}

static void start_op(session_t* s, const st_json_t* root, int kind, int p2p,
                     const uint8_t* data, uint64_t bytes) {
  st__daemon_t* d = s->d;
  char err[400];
  int64_t shm_off = -1;
  if (shm_operand(s, root, kind, p2p, &shm_off, &data, &bytes, err,
                  sizeof err) != 0) {
    reply_error(s, "invalid", "%s", err);
    return;
  }
  if (!d->net_started || d->state == ST__D_LEAVING) {
    reply_error(s, "invalid",
                d->net_started ? "the node is leaving"
                               : "the node is not on the network yet (an "
                                 "attach-mode node joins once a program "
                                 "brings its model)");
    return;
  }
  st__coll_op_t* op = calloc(1, sizeof(*op));
  if (op == NULL) {
    session_close(s);
    return;
  }
  op->session = s;
  op->shm_off = shm_off;
  op->work = shm_off >= 0 ? s->shm + shm_off : NULL;
  if (op_fields(root, op, kind, bytes, err, sizeof err) != 0 ||
      (p2p == P2P_NONE
           ? group_of(s, root, &op->g, err, sizeof err)
           : p2p_group(s, root, p2p, bytes, op, err, sizeof err)) != 0) {
    reply_error(s, "invalid", "%s", err);
    free(op);
    return;
  }
  if (op->root >= op->g.n) {
    reply_error(s, "invalid", "root %u is not a rank of a group of %u",
                op->root, op->g.n);
    st__coll_group_free(&op->g);
    free(op);
    return;
  }
  int rc = op->fetch ? ask(d, op, root) : st__coll_number(d, &op->g);
  if (rc != 0) {
    reply_error(s, "invalid",
                rc == -ENOSPC ? "this node numbers calls for %u groups and "
                                "names at most: reuse push and notify names"
                : op->fetch   ? "cannot reach the member to fetch from"
                              : "out of memory",
                ST__COLL_MAX_KEYS);
    st__coll_group_free(&op->g);
    free(op);
    return;
  }
  uint64_t timeout = op->deadline_ms;
  op->deadline_ms = timeout ? st__dnow(d) + timeout : 0;
  bool has_input =
      bytes > 0 && (kind != ST_COLL_BROADCAST || op->root == op->g.rank);
  s->op = op;
  if (st__coll_start(d, op, has_input ? data : NULL) != 0) {
    s->op = NULL;
    reply_error(s, "invalid", "cannot start the operation");
    st__coll_group_free(&op->g);
    free(op);
  }
}

/* "publish" {name, dtype, count, and the bytes or "shm"}: the node keeps
 * a copy (daemon_store.c); "unpublish" {name} forgets it. */
static void publish(session_t* s, const st_json_t* root, bool keep,
                    const uint8_t* data, uint64_t bytes) {
  const st_json_t* name = st_json_get(root, "name");
  char err[400];
  if (name == NULL || name->type != ST_JSON_STRING || name->str_len == 0 ||
      name->str_len > ST__COLL_NAME_MAX) {
    reply_error(s, "invalid", "\"name\" is a string of 1 to %u bytes",
                ST__COLL_NAME_MAX);
    return;
  }
  if (!keep) {
    if (st__store_unpublish(s->d, name->str, name->str_len) != 0)
      reply_error(s, "missing", "nothing is published under \"%s\" here",
                  name->str);
    else
      reply(s, "{\"ok\":true}", NULL, 0);
    return;
  }
  int64_t off = -1;
  st__coll_op_t f = {.kind = ST_COLL_BROADCAST};
  if (shm_operand(s, root, ST_COLL_BROADCAST, P2P_PUSH, &off, &data, &bytes,
                  err, sizeof err) != 0 ||
      op_fields(root, &f, ST_COLL_BROADCAST, bytes, err, sizeof err) != 0) {
    reply_error(s, "invalid", "%s", err);
    return;
  }
  if (bytes == 0 && f.count > 0) { /* op_fields lets a broadcast's be */
    reply_error(s, "invalid", "a publish carries its %" PRIu64 " elements",
                f.count);
    return;
  }
  uint64_t version = 0;
  int rc = st__store_publish(s->d, name->str, name->str_len, f.dtype, f.count,
                             data, &version, err, sizeof err);
  if (rc != 0) {
    reply_error(s, rc == -ENOSPC ? "full" : "invalid", "%s", err);
    return;
  }
  char json[80];
  snprintf(json, sizeof json, "{\"ok\":true,\"version\":%" PRIu64 "}", version);
  reply(s, json, NULL, 0);
}

/* One whole request is in rbuf[0..want). */
static void handle(session_t* s) {
  st_json_limits_t lim = {.max_depth = 3,
                          .max_values = ST_COLL_MAX_MEMBERS + 64};
  st_json_doc_t* doc = NULL;
  char err[200];
  const uint8_t* data = s->rbuf + 4 + s->hlen;
  uint64_t bytes = s->want - 4 - s->hlen;
  if (st_json_parse((const char*) s->rbuf + 4, s->hlen, &lim, &doc, err,
                    sizeof err) != 0) {
    reply_error(s, "invalid", "the request is not JSON (%s)", err);
    s->want = s->rlen = 0;
    session_close(s);
    return;
  }
  const st_json_t* root = st_json_root(doc);
  const char* op = str_of(root, "op");
  int kind = pick(op, kinds, 4);
  int p2p = pick(op, p2p_kinds, 5);
  if (op != NULL && strcmp(op, "members") == 0)
    members_reply(s);
  else if (op != NULL &&
           (strcmp(op, "publish") == 0 || strcmp(op, "unpublish") == 0))
    publish(s, root, op[0] == 'p', data, bytes);
  else if (kind >= 0)
    start_op(s, root, kind, P2P_NONE, data, bytes);
  else if (p2p >= 0)
    start_op(s, root, ST_COLL_BROADCAST, p2p, data, bytes);
  else
    reply_error(s, "invalid",
                "unknown \"op\"; expected members, all_reduce, reduce, "
                "broadcast, barrier, push, pull, notify, wait, publish, "
                "unpublish or fetch");
  st_json_free(doc);
  if (s->op == NULL && !s->closing) {
    memmove(s->rbuf, s->rbuf + s->want, s->rlen - s->want);
    s->rlen -= s->want;
    s->want = 0;
  }
}

/* The "bytes" a header announces (0 when absent); -1 when bad. */
static int64_t announced_bytes(const uint8_t* json, size_t len) {
  st_json_limits_t lim = {.max_depth = 3,
                          .max_values = ST_COLL_MAX_MEMBERS + 64};
  st_json_doc_t* doc = NULL;
  if (st_json_parse((const char*) json, len, &lim, &doc, NULL, 0) != 0)
    return -1;
  int64_t b = int_of(st_json_root(doc), "bytes", 0);
  st_json_free(doc);
  return b;
}

/* Handles every whole request while no operation runs. */
static void process(session_t* s) {
  while (!s->closing && s->op == NULL) {
    if (s->want == 0) {
      if (s->rlen < 4)
        break;
      s->hlen = (size_t) s->rbuf[0] | (size_t) s->rbuf[1] << 8 |
                (size_t) s->rbuf[2] << 16 | (size_t) s->rbuf[3] << 24;
      if (s->hlen == 0 || s->hlen > HEADER_MAX) {
        reply_error(s, "invalid", "a request header of %zu bytes (1 to %u)",
                    s->hlen, HEADER_MAX);
        session_close(s);
        return;
      }
      if (s->rlen < 4 + s->hlen)
        break;
      int64_t b = announced_bytes(s->rbuf + 4, s->hlen);
      if (b < 0 || (uint64_t) b > ST__COLL_DATA_MAX) {
        reply_error(s, "invalid",
                    "\"bytes\" is missing, bad, or beyond %" PRIu64,
                    (uint64_t) ST__COLL_DATA_MAX);
        session_close(s);
        return;
      }
      s->want = 4 + s->hlen + (size_t) b;
    }
    if (s->rlen < s->want)
      break;
    handle(s);
  }
}

/* ---- The connection ------------------------------------------------------
 */

/* Room for the rest of the request (or a chunk); while an operation runs,
 * at most a header's worth beyond it (a program waits for its reply;
 * reading on is only to notice it going away). */
static void alloc_cb(uv_handle_t* h, size_t suggested, uv_buf_t* buf) {
  session_t* s = h->data;
  (void) suggested;
  size_t need = s->want > s->rlen ? s->want - s->rlen : READ_CHUNK;
  if (need > READ_CHUNK && s->want == 0)
    need = READ_CHUNK;
  size_t limit = (s->want ? s->want : 0) + 4 + HEADER_MAX;
  if (s->op != NULL && s->rlen + need > limit)
    need = limit > s->rlen ? limit - s->rlen : 0;
  if (need > 0 && s->rlen + need > s->rcap) {
    size_t cap = s->rlen + need;
    uint8_t* p = realloc(s->rbuf, cap);
    if (p == NULL) {
      *buf = uv_buf_init(NULL, 0);
      return;
    }
    s->rbuf = p;
    s->rcap = cap;
  }
  *buf = uv_buf_init((char*) s->rbuf + s->rlen, (unsigned) need);
}

static void read_cb(uv_stream_t* st, ssize_t nread, const uv_buf_t* buf) {
  session_t* s = st->data;
  (void) buf;
  if (nread == UV_ENOBUFS) {
    if (s->op != NULL)
      uv_read_stop(st); /* full while it waits: resumes at the reply */
    else
      session_close(s);
    return;
  }
  if (nread < 0) {
    if (s->op != NULL) {
      char hex[33];
      st_node_id_format(&s->d->ident.id, hex);
      char why[200];
      snprintf(why, sizeof why, "the program on member %s went away", hex);
      s->closing = true; /* no reply to write */
      st__coll_abort_op(s->d, s->op, why);
    }
    session_close(s);
    return;
  }
  s->rlen += (size_t) nread;
  process(s);
}

static void close_cb(uv_handle_t* h) {
  session_t* s = h->data;
  if (s->shm != NULL)
    munmap(s->shm, s->shm_bytes);
  free(s->rbuf);
  free(s);
}

static void session_close(session_t* s) {
  st__daemon_t* d = s->d;
  if (s->op != NULL) {
    s->closing = true;
    st__coll_abort_op(d, s->op, "the node closed the program's session");
  }
  if (uv_is_closing((uv_handle_t*) &s->pipe))
    return;
  s->closing = true;
  for (session_t** p = &d->coll.sessions; *p != NULL; p = &(*p)->next)
    if (*p == s) {
      *p = s->next;
      d->coll.n_sessions--;
      break;
    }
  uv_close((uv_handle_t*) &s->pipe, close_cb);
}

void st__coll_sessions_close(st__daemon_t* d) {
  while (d->coll.sessions != NULL)
    session_close(d->coll.sessions);
}

static void say(int fd, const char* line) {
  (void) !send(fd, line, strlen(line), MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* The session's shared segment: a sealed memfd of ST__COLL_DATA_MAX bytes,
 * mapped; its descriptor into *fd (the caller sends and closes it). -errno
 * when the system has none (the session then works without). */
static int shm_create(session_t* s, int* fd) {
  int m = memfd_create("starling-collectives", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (m < 0)
    return -errno;
  size_t n = (size_t) ST__COLL_DATA_MAX;
  void* p = MAP_FAILED;
  if (ftruncate(m, (off_t) n) == 0 &&
      fcntl(m, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
    p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, m, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(m);
    return -e;
  }
  s->shm = p;
  s->shm_bytes = n;
  *fd = m;
  return 0;
}

void st__coll_takeover(st__daemon_t* d, int fd, bool early_bytes, bool shm) {
  int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0)
    return;
  const char* why = NULL;
  if (d->coll.n_sessions >= ST__COLL_SESSIONS_MAX)
    why = "busy: too many programs use collectives on this node";
  else if (d->state == ST__D_LEAVING)
    why = "the node is leaving";
  else if (early_bytes)
    why = "protocol: send requests only after the node said \"ready\"";
  session_t* s = why == NULL ? calloc(1, sizeof(*s)) : NULL;
  if (why == NULL && s == NULL)
    why = "out of memory";
  if (why == NULL && (uv_pipe_init(&d->loop, &s->pipe, 0) != 0 ||
                      uv_pipe_open(&s->pipe, own) != 0)) {
    free(s);
    why = "the node cannot watch the connection";
  }
  if (why != NULL) {
    d->c.coll_sessions_refused++;
    char line[300];
    snprintf(line, sizeof line, "error %s\n", why);
    say(own, line);
    close(own);
    return;
  }
  s->d = d;
  s->pipe.data = s;
  s->next = d->coll.sessions;
  d->coll.sessions = s;
  d->coll.n_sessions++;
  int seg = -1;
  if (shm && shm_create(s, &seg) != 0)
    d->c.coll_shm_failed++; /* the program goes on over the socket */
  (void) !st_send_fd(own, "ready\n", 6, seg, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (seg >= 0)
    close(seg);
  if (uv_read_start((uv_stream_t*) &s->pipe, alloc_cb, read_cb) != 0)
    session_close(s);
}
