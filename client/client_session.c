/* client_session.c: the client library's side of the attach conversation
 * (attach/attach.h, docs/attach.md): the shared segment (a memfd, or an
 * unlinked POSIX shared memory object where memfd_create is missing), the
 * connection to the node's control socket, the "attach" / "ready" lines,
 * the request frame sent with the segment's descriptor in SCM_RIGHTS, and
 * the reply. Every wait is a poll() against one deadline, so that
 * attach_timeout_s bounds the whole conversation, and every send is
 * MSG_NOSIGNAL: a node that goes away never raises SIGPIPE in the
 * program.
 */
#define _GNU_SOURCE /* memfd_create, CLOCK_MONOTONIC_COARSE */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "attach/attach.h"
#include "base/base.h"
#include "client/client_internal.h"

double st__client_coarse_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

/* ---- The segment ----------------------------------------------------------
 */

/* A descriptor for an anonymous shared file that can be sealed: the node
 * refuses a segment not sealed against shrinking (a program that shrank it
 * would make the node fault on its next read), so there is no fallback to
 * an unsealable POSIX shared memory object. */
static int anon_shared_fd(void) {
  return memfd_create("starling-attach", MFD_CLOEXEC | MFD_ALLOW_SEALING);
}

/* Creates and maps the segment, fills the header's first fields and copies
 * the tensors into area A. Returns the descriptor (>= 0) or -errno. */
static int segment_create(st_client_t* c, uint8_t** seg_out) {
  uint64_t n = c->model.n_floats, bytes = st_attach_segment_bytes(n);
  int fd = anon_shared_fd();
  if (fd < 0) {
    int e = errno;
    st_set_err(c->err, sizeof c->err,
               "cannot create the shared segment (memfd_create: %s)",
               strerror(e));
    return -e;
  }
  void* seg = MAP_FAILED;
  if (ftruncate(fd, (off_t) bytes) == 0 &&
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
    seg = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (seg == MAP_FAILED) {
    int e = errno;
    close(fd);
    st_set_err(c->err, sizeof c->err,
               "cannot create a shared segment of %" PRIu64
               " bytes for %" PRIu64 " parameters (%s)",
               bytes, n, strerror(e));
    return e == ENOSPC ? -ENOMEM : -e;
  }
  st_attach_header_t* h = seg;
  h->magic = ST_ATTACH_MAGIC;
  h->version = ST_ATTACH_VERSION;
  h->n_floats = n;
  h->segment_bytes = bytes;
  double none = NAN;
  uint64_t bits;
  memcpy(&bits, &none, sizeof bits);
  atomic_store_explicit(&h->loss_bits, bits, memory_order_relaxed);
  atomic_store_explicit(&h->accuracy_bits, bits, memory_order_relaxed);
  float* a = st_attach_area_a(seg);
  for (size_t i = 0; i < c->model.n; i++)
    memcpy(a + c->model.t[i].offset, c->data[i],
           c->model.t[i].n_elems * sizeof(float));
  *seg_out = seg;
  return fd;
}

/* ---- Bounded socket I/O ---------------------------------------------------
 */

/* Waits until fd is ready for events or the deadline passes: 0, -ETIMEDOUT
 * or -errno. */
int st__client_wait_fd(int fd, short events, double deadline_s) {
  for (;;) {
    int ms = -1;
    if (isfinite(deadline_s)) {
      double left = deadline_s - st_now_s();
      if (left <= 0)
        return -ETIMEDOUT;
      ms = left > 1e6 ? 1000000000 : (int) ceil(left * 1000);
    }
    struct pollfd p = {.fd = fd, .events = events};
    int r = poll(&p, 1, ms);
    if (r > 0)
      return 0;
    if (r < 0 && errno != EINTR)
      return -errno;
  }
}

/* Sends p[0..n) whole; pass_fd (>= 0) rides in SCM_RIGHTS on the first
 * byte sent. */
int st__client_send_all(int sock, const uint8_t* p, size_t n, int pass_fd,
                        double deadline_s) {
  while (n > 0) {
    ssize_t w = st_send_fd(sock, p, n, pass_fd, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        return -errno;
      int rc = st__client_wait_fd(sock, POLLOUT, deadline_s);
      if (rc != 0)
        return rc;
      continue;
    }
    pass_fd = -1;
    p += w;
    n -= (size_t) w;
  }
  return 0;
}

/* Receives exactly n bytes: 0, -ECONNRESET when the peer closed first,
 * -ETIMEDOUT or -errno. */
int st__client_recv_all(int sock, uint8_t* p, size_t n, double deadline_s) {
  while (n > 0) {
    ssize_t r = recv(sock, p, n, 0);
    if (r == 0)
      return -ECONNRESET;
    if (r < 0) {
      if (errno == EINTR)
        continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        return -errno;
      int rc = st__client_wait_fd(sock, POLLIN, deadline_s);
      if (rc != 0)
        return rc;
      continue;
    }
    p += r;
    n -= (size_t) r;
  }
  return 0;
}

/* One byte, with the descriptor that rides on it in SCM_RIGHTS, if any,
 * into *fd (which must be -1 on entry; a second one is closed). */
static int recv_byte_fd(int sock, uint8_t* ch, int* fd, double deadline_s) {
  for (;;) {
    ssize_t r = st_recv_fd(sock, ch, 1, fd, 0);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int rc = st__client_wait_fd(sock, POLLIN, deadline_s);
      if (rc != 0)
        return rc;
      continue;
    }
    if (r < 0)
      return -errno;
    return r == 0 ? -ECONNRESET : 0;
  }
}

int st__client_recv_line_fd(int sock, char* line, size_t cap, int* fd,
                            double deadline_s) {
  size_t n = 0;
  int got = -1;
  for (;;) {
    uint8_t ch;
    int rc = fd != NULL ? recv_byte_fd(sock, &ch, &got, deadline_s)
                        : st__client_recv_all(sock, &ch, 1, deadline_s);
    if (rc == 0 && ch != '\n' && n + 1 >= cap)
      rc = -EMSGSIZE;
    if (rc != 0) {
      if (got >= 0)
        close(got);
      return rc;
    }
    if (ch == '\n')
      break;
    line[n++] = ch == '\0' || ch < 0x20 ? '?' : (char) ch;
  }
  line[n] = '\0';
  if (fd != NULL)
    *fd = got;
  return 0;
}

int st__client_recv_line(int sock, char* line, size_t cap, double deadline_s) {
  return st__client_recv_line_fd(sock, line, cap, NULL, deadline_s);
}

/* ---- The conversation ------------------------------------------------------
 */

static int connect_node(st_client_t* c, int* out) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  memcpy(sa.sun_path, c->path, strlen(c->path) + 1);
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) {
    int e = errno;
    st_set_err(c->err, sizeof c->err, "cannot create a socket (%s)",
               strerror(e));
    return -e;
  }
  if (connect(s, (struct sockaddr*) &sa, sizeof sa) != 0) {
    int e = errno;
    close(s);
    if (e == ENOENT || e == ECONNREFUSED)
      st_set_err(c->err, sizeof c->err,
                 "no starling node at %s (%s): start one with `starling node "
                 "--attach ...` and give its DATA_DIR/control.sock",
                 c->path, strerror(e));
    else
      st_set_err(c->err, sizeof c->err,
                 "cannot connect to the starling node at %s (%s)", c->path,
                 strerror(e));
    return -e;
  }
  fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
  *out = s;
  return 0;
}

/* The negative errno for a refusal sentence ("busy: ...", "version: ..."),
 * from the "error" line (other refusals: other) or the reply. */
static int refusal_code(const char* sentence, int other) {
  if (strncmp(sentence, "busy:", 5) == 0)
    return -EBUSY;
  if (strncmp(sentence, "version:", 8) == 0)
    return -EPROTO;
  return other;
}

/* Names what went wrong on the wire for rc (a timeout, the node closing). */
static int io_failed(st_client_t* c, int rc, const char* when) {
  if (rc == -ETIMEDOUT)
    st_set_err(c->err, sizeof c->err,
               "the starling node at %s did not hand over the parameters "
               "within %g s (attach_timeout_s) %s; it may still be "
               "synchronizing from a peer: raise the timeout or see "
               "`starling status`",
               c->path, c->opt.attach_timeout_s, when);
  else if (rc == -ECONNRESET || rc == -EPIPE)
    st_set_err(c->err, sizeof c->err,
               "the starling node at %s closed the connection %s; is it "
               "leaving? see its log",
               c->path, when);
  else
    st_set_err(c->err, sizeof c->err,
               "talking to the starling node at %s failed %s (%s)", c->path,
               when, strerror(-rc));
  return rc == -EPIPE ? -ECONNRESET : rc;
}

/* Steps 1 and 2: "attach\n", then "ready" or "error <sentence>". */
static int say_attach(st_client_t* c, int sock, double deadline_s) {
  static const char hello[] = "attach\n";
  int rc = st__client_send_all(sock, (const uint8_t*) hello, sizeof hello - 1,
                               -1, deadline_s);
  char line[ST__CLIENT_LINE_MAX];
  if (rc == 0)
    rc = st__client_recv_line(sock, line, sizeof line, deadline_s);
  if (rc == -EMSGSIZE) {
    st_set_err(c->err, sizeof c->err,
               "the process at %s answered 'attach' with a line of more than "
               "%d bytes: is it a starling node?",
               c->path, ST__CLIENT_LINE_MAX);
    return -EPROTO;
  }
  if (rc != 0)
    return io_failed(c, rc, "before answering 'attach'");
  if (strcmp(line, "ready") == 0)
    return 0;
  if (strncmp(line, "error", 5) == 0 && (line[5] == ' ' || line[5] == ':')) {
    const char* why = line + 6 + (line[6] == ' ');
    st_set_err(c->err, sizeof c->err,
               "the starling node at %s refused the attach: %s", c->path, why);
    /* Other refusals (no --attach, leaving): no node to attach to here. */
    return refusal_code(why, -ECONNREFUSED);
  }
  st_set_err(c->err, sizeof c->err,
             "the process at %s answered 'attach' with '%.80s': is it a "
             "starling node of this release?",
             c->path, line);
  return -EPROTO;
}

/* Step 3: the request frame, with the segment's descriptor. */
static int send_request(st_client_t* c, int sock, int seg_fd,
                        double deadline_s) {
  size_t len = 0, flen = 0;
  char* json = st_attach_request_encode(&c->model, (int64_t) getpid(), &len);
  if (json == NULL) {
    st_set_err(c->err, sizeof c->err, "out of memory for the attach request");
    return -ENOMEM;
  }
  if (len > ST_ATTACH_FRAME_MAX) {
    st_set_err(c->err, sizeof c->err,
               "the tensor list takes %zu bytes to describe, more than the "
               "%u an attach request may hold: register fewer tensors or "
               "give them shorter names",
               len, ST_ATTACH_FRAME_MAX);
    free(json);
    return -EINVAL;
  }
  uint8_t* frame = st_attach_frame(json, len, &flen);
  free(json);
  if (frame == NULL) {
    st_set_err(c->err, sizeof c->err, "out of memory for the attach request");
    return -ENOMEM;
  }
  int rc = st__client_send_all(sock, frame, flen, seg_fd, deadline_s);
  free(frame);
  return rc == 0 ? 0 : io_failed(c, rc, "while it was sent the request");
}

/* Step 4: the reply. 0 with *step on ok; the refusal's errno otherwise. */
static int read_reply(st_client_t* c, int sock, double deadline_s,
                      uint64_t* step) {
  uint8_t hdr[4];
  int rc = st__client_recv_all(sock, hdr, 4, deadline_s);
  if (rc != 0)
    return io_failed(c, rc, "before replying to the attach request");
  uint32_t len = st_attach_frame_len(hdr);
  if (len > ST__CLIENT_REPLY_MAX) {
    st_set_err(c->err, sizeof c->err,
               "the starling node at %s sent an attach reply of %" PRIu32
               " bytes, more than %u: is it a node of this release?",
               c->path, len, ST__CLIENT_REPLY_MAX);
    return -EPROTO;
  }
  char* text = malloc(len + 1);
  if (text == NULL)
    return -ENOMEM;
  rc = st__client_recv_all(sock, (uint8_t*) text, len, deadline_s);
  bool ok = false;
  char source[64], why[400];
  if (rc == 0)
    rc = st_attach_reply_decode(text, len, &ok, step, source, sizeof source,
                                why, sizeof why);
  free(text);
  if (rc == -EBADMSG) {
    st_set_err(c->err, sizeof c->err, "the starling node at %s: %s", c->path,
               why);
    return -EPROTO;
  }
  if (rc != 0)
    return io_failed(c, rc, "while it sent the attach reply");
  if (ok)
    return 0;
  st_set_err(c->err, sizeof c->err,
             "the starling node at %s refused the attach: %s", c->path, why);
  return refusal_code(why, -EINVAL);
}

/* ---- Opening and closing a session -----------------------------------------
 */

/* Takes the new segment and socket, and the parameters in area B. */
static void install(st_client_t* c, uint8_t* seg, int sock, uint64_t step) {
  st__client_session_close(c);
  c->seg = seg;
  c->seg_bytes = st_attach_segment_bytes(c->model.n_floats);
  c->h = (st_attach_header_t*) (void*) seg; /* page-aligned */
  c->sock = sock;
  const float* b = st_attach_area_b(seg, c->model.n_floats);
  for (size_t i = 0; i < c->model.n; i++)
    memcpy(c->data[i], b + c->model.t[i].offset,
           c->model.t[i].n_elems * sizeof(float));
  /* The node's ok hands the state over; the request sequence starts where
   * the node set it (req_seq == ack_seq). */
  c->acked = atomic_load_explicit(&c->h->ack_seq, memory_order_acquire);
  c->cluster_step = step;
  atomic_store_explicit(&c->h->step, step, memory_order_relaxed);
  c->next_check_s = st__client_coarse_now_s() + ST__CLIENT_CHECK_INTERVAL_S;
}

int st__client_session_open(st_client_t* c, double deadline_s) {
  uint8_t* seg = NULL;
  int seg_fd = segment_create(c, &seg);
  if (seg_fd < 0)
    return seg_fd;
  int sock = -1;
  uint64_t step = 0;
  int rc = connect_node(c, &sock);
  if (rc == 0)
    rc = say_attach(c, sock, deadline_s);
  if (rc == 0)
    rc = send_request(c, sock, seg_fd, deadline_s);
  if (rc == 0)
    rc = read_reply(c, sock, deadline_s, &step);
  /* The node holds its own descriptor (SCM_RIGHTS) by now; the mapping
   * keeps the segment alive on this side. */
  close(seg_fd);
  if (rc != 0) {
    if (sock >= 0)
      close(sock);
    munmap(seg, st_attach_segment_bytes(c->model.n_floats));
    return rc;
  }
  install(c, seg, sock, step);
  c->err[0] = '\0';
  return 0;
}

bool st__client_peer_closed(int sock) {
  struct pollfd p = {.fd = sock, .events = POLLIN};
  if (poll(&p, 1, 0) <= 0)
    return false;
  /* Nothing is expected after the reply: drop whatever a later release
   * might send, and look for the end of the stream. */
  for (int i = 0; i < 16; i++) {
    char buf[256];
    ssize_t r = recv(sock, buf, sizeof buf, MSG_DONTWAIT);
    if (r == 0)
      return true;
    if (r < 0)
      return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  }
  return false;
}

void st__client_send_detach(int sock, bool final) {
  size_t len = 0, flen = 0;
  char* json = st_attach_detach_encode(final, &len);
  uint8_t* frame = json != NULL ? st_attach_frame(json, len, &flen) : NULL;
  free(json);
  if (frame == NULL)
    return;
  ssize_t w = send(sock, frame, flen, MSG_NOSIGNAL | MSG_DONTWAIT);
  (void) w;
  free(frame);
}

void st__client_session_close(st_client_t* c) {
  if (c->sock >= 0)
    close(c->sock);
  c->sock = -1;
  if (c->seg != NULL)
    munmap(c->seg, c->seg_bytes);
  c->seg = NULL;
  c->h = NULL;
}
