/* daemon_attach.c: attach mode's side of the loop thread (docs/attach.md,
 * attach/attach.h): the model from the checkpoint at start-up, and the
 * program's session on the control socket.
 *
 * A control connection whose first line is "attach" is taken over here: a
 * dup of its descriptor, read with recvmsg under a uv_poll (libuv's pipes
 * would drop the segment's descriptor that comes as SCM_RIGHTS ancillary
 * data). The session reads the attach request, checks the tensor list and
 * the segment (size, seals, header), adopts the model when it is the first
 * (which starts the node on the network) or compares it with the node's,
 * and answers once the node is ready to train: synchronized and with
 * --min-nodes alive. The connection closing or a "detach" frame ends the
 * session; the node keeps its parameters and serves them on.
 */
#define _GNU_SOURCE /* F_GET_SEALS */
#include "node/daemon/daemon_internal.h"

#include "base/base.h"
#include "node/train/train.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef F_GET_SEALS
#define F_GET_SEALS 1034
#endif
#ifndef F_SEAL_SHRINK
#define F_SEAL_SHRINK 0x0002
#endif

/* A program has this long after "ready" to send its request: a connection
 * that says "attach" and nothing more must not hold the node's one
 * session. */
#define REQUEST_DEADLINE_MS 10000u

typedef struct st__attach_s {
  st__daemon_t* d;
  int fd;
  uv_poll_t poll;
  bool poll_open;
  uv_timer_t deadline; /* until the request has come */
  int handles_open;    /* poll and deadline: freed when both closed */
  uint8_t* buf;
  size_t len, cap;
  int memfd;
  bool got_request;
  bool waiting; /* answered when the node is ready */
  bool on;      /* the session is on: the host thread has the segment */
  void* seg;
  size_t seg_bytes;
  int64_t pid;
  const char* source;
} st__attach_t;

/* ---- Fingerprint and checkpoint ------------------------------------------ */

/* d->attach_model becomes the node's model: its fingerprint (BLAKE2b-128
 * of a tag and the canonical tensor list), description and size, and the
 * canonical text that a MISMATCH reply carries to a peer (local.tensors).
 * -ENOMEM when the text cannot be built. */
static int set_local_model(st__daemon_t* d) {
  size_t len = 0;
  char* canon = st_attach_model_canonical(&d->attach_model, &len);
  static const char tag[] = "starling-attach-v1\n";
  size_t tl = sizeof(tag) - 1;
  char* text = canon != NULL ? malloc(tl + len) : NULL;
  if (text == NULL) {
    free(canon);
    return -ENOMEM;
  }
  memcpy(text, tag, tl);
  memcpy(text + tl, canon, len);
  st_hash_once(text, tl + len, d->local.fingerprint, 16);
  free(text);
  free(d->attach_canon);
  d->attach_canon = canon;
  d->local.tensors = canon;
  d->local.tensors_len = len;
  st_attach_model_describe(&d->attach_model, d->local.model,
                           sizeof(d->local.model));
  d->local.n_params = d->attach_model.n_floats;
  st__compress_mark_model(d);
  st__outer_mark_model(d);
  st__compress_sized(d);
  return 0;
}

static int load_checkpoint(st__daemon_t* d, char* err, size_t err_len) {
  st_safetensors_t* st = NULL;
  char e[512];
  int rc = st_safetensors_read(d->checkpoint_path, &st, e, sizeof(e));
  if (rc != 0) {
    st_set_err(err, err_len, "%s (move it away to start this node afresh)", e);
    return rc;
  }
  const char* canon = st_safetensors_meta(st, "attach_model");
  const char* step = st_safetensors_meta(st, "step");
  rc = canon == NULL || step == NULL ? -EINVAL : 0;
  if (rc != 0)
    st_set_err(e, sizeof(e),
               "it was not written by an attached node (no attach_model); "
               "it belongs to a node with a built-in model");
  if (rc == 0)
    rc = st_attach_model_parse(canon, strlen(canon), &d->attach_model, e,
                               sizeof(e));
  if (rc == 0 && (d->attach_params =
                      malloc(d->attach_model.n_floats * sizeof(float))) == NULL)
    rc = -ENOMEM;
  for (size_t i = 0; rc == 0 && i < d->attach_model.n; i++) {
    const st_attach_tensor_t* t = &d->attach_model.t[i];
    size_t n = 0;
    const float* v = st_safetensors_tensor(st, t->name, &n, NULL, NULL);
    if (v == NULL || n != t->n_elems) {
      st_set_err(e, sizeof(e), "tensor '%s' is missing or of another size",
                 t->name);
      rc = -EINVAL;
      break;
    }
    memcpy(d->attach_params + t->offset, v, n * sizeof(float));
  }
  d->attach_step = step != NULL ? strtoull(step, NULL, 10) : 0;
  st_safetensors_free(st);
  if (rc != 0)
    st_set_err(err, err_len,
               "checkpoint %s: %s (move it away to start this node afresh)",
               d->checkpoint_path, e);
  return rc;
}

int st__attach_setup(st__daemon_t* d, char* err, size_t err_len) {
  if (access(d->checkpoint_path, F_OK) != 0)
    return 0; /* the first program brings the model */
  int rc = load_checkpoint(d, err, err_len);
  if (rc != 0)
    return rc;
  if (set_local_model(d) != 0) {
    st_set_err(err, err_len, "out of memory for the model's tensor list");
    return -ENOMEM;
  }
  d->resumed = true;
  st__outer_resume(d);
  return 0;
}

bool st__attach_waits_for_model(const st__daemon_t* d) {
  return d->cfg->attach && d->attach_model.n == 0;
}

/* ---- The session --------------------------------------------------------- */

static void send_all(int fd, const void* p, size_t len) {
  const uint8_t* b = p;
  while (len > 0) {
    ssize_t n = send(fd, b, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return; /* the program is gone: the session ends on its next read */
    b += n;
    len -= (size_t) n;
  }
}

static void send_reply(st__attach_t* a, bool ok, uint64_t step,
                       const char* error) {
  size_t jl = 0, fl = 0;
  char* json = st_attach_reply_encode(ok, step, a->source, error, &jl);
  uint8_t* frame = json != NULL ? st_attach_frame(json, jl, &fl) : NULL;
  if (frame != NULL)
    send_all(a->fd, frame, fl);
  free(frame);
  free(json);
}

static void free_session(st__attach_t* a) {
  close(a->fd);
  free(a->buf);
  free(a);
}

static void handle_close_cb(uv_handle_t* h) {
  st__attach_t* a = h->data;
  if (--a->handles_open == 0)
    free_session(a);
}

/* Ends the session however it ends; the node's copy stays (or becomes the
 * program's last parameters, with final). */
static void end_session_final(st__attach_t* a, const char* why, bool final) {
  st__daemon_t* d = a->d;
  if (a->on) {
    /* The host thread owns the mapping (and unmaps it when it stops). */
    if (d->tt != NULL)
      st__tt_detach_session(d->tt, final);
  } else if (a->seg != NULL) {
    munmap(a->seg, a->seg_bytes);
  }
  a->seg = NULL;
  if (a->memfd >= 0)
    close(a->memfd);
  a->memfd = -1;
  if (a->on || why != NULL)
    st__dlog(d, "program (pid %" PRId64 ") %s", a->pid,
             why != NULL ? why : "detached");
  d->attach = NULL;
  if (a->poll_open) {
    a->poll_open = false;
    uv_poll_stop(&a->poll);
    uv_close((uv_handle_t*) &a->poll, handle_close_cb);
    uv_close((uv_handle_t*) &a->deadline, handle_close_cb);
  } else {
    free_session(a);
  }
}

static void end_session(st__attach_t* a, const char* why) {
  end_session_final(a, why, false);
}

static void refuse(st__attach_t* a, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void refuse(st__attach_t* a, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  st_set_errv(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  a->d->attach_refused++;
  st__dwarn(a->d, "attach refused: %s", msg);
  send_reply(a, false, 0, msg);
  end_session(a, NULL);
}

/* The session starts: the host thread takes the segment and writes the
 * node's parameters into area B; the program gets the reply. */
static void start_session(st__attach_t* a) {
  st__daemon_t* d = a->d;
  uint64_t step = 0;
  int rc = st__tt_attach_session(d->tt, a->seg, a->seg_bytes, &step);
  if (rc != 0) {
    refuse(a, "busy: another program is attached to this node");
    return;
  }
  a->on = true;
  a->waiting = false;
  close(a->memfd); /* the mapping stays */
  a->memfd = -1;
  send_reply(a, true, step, NULL);
  st__dlog(d,
           "program (pid %" PRId64 ") attached: %zu tensors, %" PRIu64
           " parameters, from step %" PRIu64 " (%s)",
           a->pid, d->attach_model.n, d->attach_model.n_floats, step,
           a->source);
}

void st__attach_node_ready(st__daemon_t* d) {
  st__attach_t* a = d->attach;
  if (a != NULL && a->waiting)
    start_session(a);
}

static bool node_ready(const st__daemon_t* d) {
  return d->node_started &&
         (d->state == ST__D_TRAINING || d->state == ST__D_DONE);
}

/* Maps the program's segment and checks it: a regular file of the size
 * the tensor list needs, sealed against shrinking (a program that shrank
 * it would make the node fault on its next read), with a valid header. */
static int map_segment(st__attach_t* a, uint64_t n_floats, char* err,
                       size_t err_len) {
  struct stat sb;
  if (a->memfd < 0 || fstat(a->memfd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    st_set_err(err, err_len,
               "the request came without a shared segment (a memfd in "
               "SCM_RIGHTS)");
    return -EINVAL;
  }
  int seals = fcntl(a->memfd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
    st_set_err(err, err_len,
               "the shared segment is not sealed against shrinking "
               "(memfd_create with MFD_ALLOW_SEALING, then F_SEAL_SHRINK)");
    return -EINVAL;
  }
  uint64_t want = st_attach_segment_bytes(n_floats);
  if ((uint64_t) sb.st_size != want) {
    st_set_err(err, err_len,
               "the shared segment has %lld bytes; %" PRIu64
               " tensor elements need %" PRIu64,
               (long long) sb.st_size, n_floats, want);
    return -EINVAL;
  }
  void* p = mmap(NULL, (size_t) want, PROT_READ | PROT_WRITE, MAP_SHARED,
                 a->memfd, 0);
  if (p == MAP_FAILED) {
    st_set_err(err, err_len, "cannot map the shared segment: %s",
               strerror(errno));
    return -errno;
  }
  a->seg = p;
  a->seg_bytes = (size_t) want;
  return st_attach_check_header(p, (uint64_t) sb.st_size, n_floats, err,
                                err_len);
}

/* The first program fixes the model: its own parameters start the cluster
 * when this node is the first (no --join), else the node fetches the
 * cluster's. Then the node goes on the network. */
static int adopt_model(st__attach_t* a, st_attach_model_t* m, char* err,
                       size_t err_len) {
  st__daemon_t* d = a->d;
  const float* mine = st_attach_area_a(a->seg);
  for (uint64_t i = 0; i < m->n_floats; i++) {
    if (!isfinite(mine[i])) {
      st_set_err(err, err_len,
                 "the program's initial parameters are not finite (element "
                 "%" PRIu64 ")",
                 i);
      return -EDOM;
    }
  }
  d->attach_params = malloc(m->n_floats * sizeof(float));
  if (d->attach_params == NULL)
    return -ENOMEM;
  memcpy(d->attach_params, mine, m->n_floats * sizeof(float));
  d->attach_model = *m;
  memset(m, 0, sizeof(*m));
  if (set_local_model(d) != 0)
    return -ENOMEM;
  a->source = d->n_seeds == 0 ? "its own: the first node" : "the cluster's";
  int rc = st__daemon_start_node(d, err, err_len);
  if (rc != 0)
    st__daemon_fatal(d, "%s", err);
  return rc;
}

static void handle_request(st__attach_t* a, const char* json, size_t len) {
  st__daemon_t* d = a->d;
  st_attach_model_t m = {0};
  uint32_t version = 0;
  char err[768];
  int rc = st_attach_request_decode(json, len, &m, &version, &a->pid, err,
                                    sizeof(err));
  if (rc == 0)
    rc = map_segment(a, m.n_floats, err, sizeof(err));
  if (rc == 0 && d->attach_model.n > 0) {
    char diff[600];
    if (st_attach_model_diff(&m, "the program's", &d->attach_model,
                             "the node's", diff, sizeof(diff))) {
      st_set_err(err, sizeof(err),
                 "model: the program's tensor list differs from this node's "
                 "model: %s",
                 diff);
      rc = -EINVAL;
    }
    a->source = "the node's";
  } else if (rc == 0) {
    rc = adopt_model(a, &m, err, sizeof(err));
  }
  st_attach_model_free(&m);
  if (rc != 0) {
    refuse(a, "%s", err);
    return;
  }
  a->waiting = true;
  if (node_ready(d))
    start_session(a);
  else
    st__dlog(d,
             "program (pid %" PRId64
             ") waits for the node to synchronize and for --min-nodes",
             a->pid);
}

/* Moves the descriptors of SCM_RIGHTS into the session (the first one
 * kept, any other closed). */
/* One frame in: the request, or after it the detach ({"op":"detach",
 * "final":true} when area A holds the program's last parameters). Anything
 * else ends the session too, as a protocol error. */
static void on_frame(st__attach_t* a, const char* json, size_t len) {
  if (!a->got_request) {
    a->got_request = true;
    uv_timer_stop(&a->deadline);
    handle_request(a, json, len);
    return;
  }
  bool final = false;
  int rc = st_attach_detach_decode(json, len, &final);
  end_session_final(a, rc == 0 ? "detached" : "ended: a malformed frame",
                    final);
}

static void on_readable(uv_poll_t* p, int status, int events) {
  st__attach_t* a = p->data;
  if (a->cap - a->len < 65536) {
    size_t cap = a->cap * 2 + 65536;
    uint8_t* b = realloc(a->buf, cap);
    if (b == NULL) {
      end_session(a, "ended: out of memory");
      return;
    }
    a->buf = b;
    a->cap = cap;
  }
  int got = -1; /* the segment's descriptor, taken only with the request */
  ssize_t n =
      status < 0 ? -1
                 : st_recv_fd(a->fd, a->buf + a->len, a->cap - a->len, &got, 0);
  if (got >= 0 && (a->memfd >= 0 || a->got_request))
    close(got);
  else if (got >= 0)
    a->memfd = got;
  if (n < 0 && (errno == EAGAIN || errno == EINTR) && status >= 0)
    return;
  if (n <= 0) {
    end_session(a, a->on ? "went away (connection closed): serving its last "
                           "parameters"
                         : NULL);
    return;
  }
  (void) events;
  a->len += (size_t) n;
  st__daemon_t* d = a->d;
  while (a->len >= 4) {
    uint32_t fl = st_attach_frame_len(a->buf);
    if (fl > ST_ATTACH_FRAME_MAX) {
      refuse(a, "a frame of %u bytes is over the limit of %u", fl,
             ST_ATTACH_FRAME_MAX);
      return;
    }
    if (a->len < 4 + (size_t) fl)
      return;
    on_frame(a, (const char*) a->buf + 4, fl);
    if (d->attach != a)
      return; /* the session ended */
    memmove(a->buf, a->buf + 4 + fl, a->len - 4 - fl);
    a->len -= 4 + fl;
  }
}

static void say_line(int fd, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void say_line(int fd, const char* fmt, ...) {
  char line[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof(line) - 1, fmt, ap);
  va_end(ap);
  strcat(line, "\n");
  send_all(fd, line, strlen(line));
}

static void request_late(uv_timer_t* t) {
  refuse(t->data,
         "no attach request within %u s of \"ready\" (a frame and the "
         "segment's descriptor, docs/attach.md)",
         REQUEST_DEADLINE_MS / 1000);
}

void st__attach_takeover(st__daemon_t* d, int fd, bool early_bytes) {
  int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0)
    return;
  const char* why = NULL;
  if (!d->cfg->attach)
    why =
        "this node trains its built-in model (it was started without "
        "--attach)";
  else if (d->attach != NULL)
    why = "busy: another program is attached to this node";
  else if (d->state == ST__D_LEAVING)
    why = "the node is leaving";
  else if (early_bytes)
    why =
        "protocol: bytes came after \"attach\" before the node said "
        "\"ready\"; send the request only after \"ready\"";
  st__attach_t* a = why == NULL ? calloc(1, sizeof(*a)) : NULL;
  if (why == NULL && a == NULL)
    why = "out of memory";
  if (why != NULL) {
    d->attach_refused++;
    say_line(own, "error %s", why);
    close(own);
    return;
  }
  a->d = d;
  a->fd = own;
  a->memfd = -1;
  a->poll.data = a;
  if (uv_poll_init(&d->loop, &a->poll, own) != 0) {
    say_line(own, "error the node cannot watch the connection");
    free_session(a);
    return;
  }
  if (uv_poll_start(&a->poll, UV_READABLE | UV_DISCONNECT, on_readable) != 0) {
    say_line(own, "error the node cannot watch the connection");
    a->handles_open = 1;
    uv_close((uv_handle_t*) &a->poll, handle_close_cb);
    return;
  }
  a->poll_open = true;
  a->handles_open = 2;
  uv_timer_init(&d->loop, &a->deadline);
  a->deadline.data = a;
  uv_timer_start(&a->deadline, request_late, REQUEST_DEADLINE_MS, 0);
  d->attach = a;
  say_line(own, "ready");
}

/* ": tensor 3: ... in the program, ... in the cluster" when the peer's
 * list parses and differs from ours; "" otherwise. */
static void first_difference(const st__daemon_t* d, const char* text,
                             size_t len, char* out, size_t out_len) {
  out[0] = '\0';
  st_attach_model_t theirs;
  char diff[600];
  if (text == NULL || len == 0 ||
      st_attach_model_parse(text, len, &theirs, NULL, 0) != 0)
    return;
  if (st_attach_model_diff(&d->attach_model, "in the program", &theirs,
                           "in the cluster", diff, sizeof diff))
    snprintf(out, out_len, ": %s", diff);
  st_attach_model_free(&theirs);
}

void st__attach_cluster_mismatch(st__daemon_t* d, const char* theirs,
                                 const char* their_tensors,
                                 size_t their_tensors_len) {
  char diff[640];
  first_difference(d, their_tensors, their_tensors_len, diff, sizeof diff);
  if (diff[0] == '\0')
    st__compress_mismatch(theirs, d->local.model, diff, sizeof diff);
  if (diff[0] == '\0')
    snprintf(diff, sizeof diff,
             ": its tensor names, shapes or dtypes differ from the "
             "cluster's model");
  st__attach_t* a = d->attach;
  if (a != NULL && a->waiting)
    refuse(a, "model: the cluster runs %s, the program registered %s%s", theirs,
           d->local.model, diff);
  st__daemon_fatal(d,
                   "the cluster runs %s but the attached program registered "
                   "%s%s; attach the cluster's model, or join another "
                   "cluster",
                   theirs, d->local.model, diff);
}

void st__attach_close(st__daemon_t* d) {
  if (d->attach != NULL)
    end_session(d->attach,
                d->attach->on ? "detached: the node is stopping" : NULL);
}

void st__attach_free(st__daemon_t* d) {
  st_attach_model_free(&d->attach_model);
  free(d->attach_canon);
  d->attach_canon = NULL;
  d->local.tensors = NULL;
  d->local.tensors_len = 0;
  free(d->attach_params);
  d->attach_params = NULL;
}
