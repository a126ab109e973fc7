/* test_client.c: the Check suite for the client library
 * (client/starling/client.h) against a fake node: a thread that listens
 * on a temporary Unix socket and plays the node's side of the attach
 * conversation exactly as attach/attach.h describes it (the "ready" line,
 * the request frame with the segment's descriptor in SCM_RIGHTS, fstat,
 * mmap and the header check, area B, the reply), and then, as the test
 * asks, closes the connection, goes away for good, or comes back on the
 * same path. The test itself posts the node's requests through the
 * node's own mapping of the segment, and checks the program's tensors and
 * area A after the client's step boundaries.
 *
 * Every wait is bounded: the fake node's polls time out, the tests' loops
 * have deadlines, and each test has a Check timeout. */
#define _GNU_SOURCE /* syscall(SYS_futex) */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "attach/attach.h"
#include "base/base.h"
#include "client/starling/client.h"
#include "tests/unit/testutil.h"

/* ==== The fake node ======================================================= */

#define N_FLOATS 10 /* w [2, 3], b [3], s (a scalar) */

typedef struct {
  /* The script, set before node_start. */
  const char* line;       /* the answer to "attach"; NULL: "ready" */
  const char* refusal;    /* a reply {"ok":false,"error":refusal} */
  uint64_t step;          /* the reply's step */
  const float* state;     /* area B at attach; NULL: the program's own */
  int never_reply;        /* take the request, never answer */
  int close_before_reply; /* take the request, close the connection */
  const float* state2;    /* area B when it comes back ('r') */
  uint64_t step2;
  /* What it saw. */
  char dir[512];
  char path[600];
  int lfd, cfd, cmd[2];
  pthread_t thread;
  atomic_int attached; /* attaches served */
  int check_rc;        /* st_attach_check_header's answer */
  char line_seen[32];
  uint32_t version;
  int64_t pid;
  st_attach_model_t model;
  float a0[N_FLOATS]; /* area A as the program sent it */
  uint8_t* seg;
  size_t seg_bytes;
  st_attach_header_t* h;
  char last_frame[128]; /* a frame received after the reply */
  atomic_int saw_eof;
} node_t;

static struct sockaddr_un unix_addr(const char* path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  ck_assert_uint_lt(strlen(path), sizeof sa.sun_path);
  memcpy(sa.sun_path, path, strlen(path) + 1);
  return sa;
}

static int listen_on(const char* path) {
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ck_assert_int_ge(s, 0);
  struct sockaddr_un sa = unix_addr(path);
  ck_assert_int_eq(bind(s, (struct sockaddr*) &sa, sizeof sa), 0);
  ck_assert_int_eq(listen(s, 4), 0);
  return s;
}

/* Reads exactly n bytes within timeout_ms; the first recvmsg may carry a
 * descriptor (*fd). Returns 0, or -1 on EOF, error or timeout. */
static int read_exact(int s, void* buf, size_t n, int* fd, int timeout_ms) {
  uint8_t* p = buf;
  while (n > 0) {
    struct pollfd pf = {.fd = s, .events = POLLIN};
    if (poll(&pf, 1, timeout_ms) <= 0)
      return -1;
    struct iovec iov = {.iov_base = p, .iov_len = n};
    union {
      struct cmsghdr align;
      char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd != NULL) {
      msg.msg_control = ctl.buf;
      msg.msg_controllen = sizeof ctl.buf;
    }
    ssize_t r = recvmsg(s, &msg, MSG_CMSG_CLOEXEC);
    if (r <= 0)
      return -1;
    struct cmsghdr* cm = fd != NULL ? CMSG_FIRSTHDR(&msg) : NULL;
    if (cm != NULL && cm->cmsg_level == SOL_SOCKET &&
        cm->cmsg_type == SCM_RIGHTS) {
      memcpy(fd, CMSG_DATA(cm), sizeof(int));
      fd = NULL;
    }
    p += r;
    n -= (size_t) r;
  }
  return 0;
}

static void send_frame(int s, const char* json) {
  size_t n;
  uint8_t* f = st_attach_frame(json, strlen(json), &n);
  ck_assert(send(s, f, n, MSG_NOSIGNAL) == (ssize_t) n);
  free(f);
}

/* Reads a frame of at most cap - 1 bytes into out. */
static int read_frame(int s, char* out, size_t cap, int* fd, int timeout_ms) {
  uint8_t hdr[4];
  if (read_exact(s, hdr, 4, fd, timeout_ms) != 0)
    return -1;
  uint32_t len = st_attach_frame_len(hdr);
  if (len >= cap)
    return -1;
  if (read_exact(s, out, len, NULL, timeout_ms) != 0)
    return -1;
  out[len] = '\0';
  return 0;
}

/* Maps the received segment and checks it as the node does. */
static void take_segment(node_t* n, int fd) {
  struct stat sb;
  ck_assert_int_eq(fstat(fd, &sb), 0);
  n->seg_bytes = (size_t) sb.st_size;
  n->seg = mmap(NULL, n->seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ck_assert(n->seg != MAP_FAILED);
  close(fd);
  n->h = (st_attach_header_t*) (void*) n->seg; /* page-aligned */
  char why[256];
  n->check_rc = st_attach_check_header(n->h, (uint64_t) sb.st_size,
                                       n->model.n_floats, why, sizeof why);
  memcpy(n->a0, st_attach_area_a(n->seg), sizeof n->a0);
}

/* One attach conversation on a new connection. */
static void serve_attach(node_t* n, const float* state, uint64_t step) {
  struct pollfd pf = {.fd = n->lfd, .events = POLLIN};
  if (poll(&pf, 1, 5000) <= 0)
    return;
  n->cfd = accept(n->lfd, NULL, NULL);
  char hello[7];
  if (read_exact(n->cfd, hello, 7, NULL, 5000) != 0)
    return;
  memcpy(n->line_seen, hello, 7);
  const char* line = n->line != NULL ? n->line : "ready\n";
  ck_assert(send(n->cfd, line, strlen(line), MSG_NOSIGNAL) > 0);
  if (strcmp(line, "ready\n") != 0)
    return;
  static char json[1 << 16];
  int fd = -1;
  if (read_frame(n->cfd, json, sizeof json, &fd, 5000) != 0 || fd < 0)
    return;
  st_attach_model_free(&n->model);
  char why[256];
  ck_assert_msg(
      st_attach_request_decode(json, strlen(json), &n->model, &n->version,
                               &n->pid, why, sizeof why) == 0,
      "%s", why);
  if (n->seg != NULL)
    munmap(n->seg, n->seg_bytes);
  take_segment(n, fd);
  if (n->never_reply || n->close_before_reply) {
    if (n->close_before_reply) {
      close(n->cfd);
      n->cfd = -1;
    }
    return;
  }
  float* b = st_attach_area_b(n->seg, N_FLOATS);
  memcpy(b, state != NULL ? state : n->a0, sizeof n->a0);
  size_t len;
  char* reply = st_attach_reply_encode(n->refusal == NULL, step, "test",
                                       n->refusal, &len);
  atomic_fetch_add(&n->attached, 1);
  send_frame(n->cfd, reply);
  free(reply);
}

/* The commands a test gives the node after the attach. */
static void node_command(node_t* n, char c) {
  switch (c) {
    case 'c': /* close the connection */
      close(n->cfd);
      n->cfd = -1;
      break;
    case 'k': /* go away for good */
    case 'r': /* go away, come back after 0.3 s on the same path */
      close(n->cfd);
      n->cfd = -1;
      close(n->lfd);
      n->lfd = -1;
      unlink(n->path);
      if (c == 'k')
        break;
      usleep(300 * 1000);
      n->lfd = listen_on(n->path);
      serve_attach(n, n->state2, n->step2);
      break;
  }
}

static void* node_main(void* arg) {
  node_t* n = arg;
  serve_attach(n, n->state, n->step);
  double end = st_now_s() + 10;
  while (st_now_s() < end) {
    struct pollfd pf[2] = {{.fd = n->cmd[0], .events = POLLIN},
                           {.fd = n->cfd, .events = POLLIN}};
    if (poll(pf, n->cfd >= 0 ? 2 : 1, 100) <= 0)
      continue;
    if (pf[0].revents) {
      char c = 0;
      ck_assert(read(n->cmd[0], &c, 1) == 1);
      if (c == 'q')
        break;
      node_command(n, c);
    } else if (pf[1].revents) {
      if (read_frame(n->cfd, n->last_frame, sizeof n->last_frame, NULL, 1000) !=
          0) {
        n->saw_eof = 1;
        close(n->cfd);
        n->cfd = -1;
      }
    }
  }
  return NULL;
}

static void node_start(node_t* n) {
  ck_assert_int_eq(tu_mkdtemp(n->dir, sizeof n->dir), 0);
  snprintf(n->path, sizeof n->path, "%s/control.sock", n->dir);
  n->cfd = -1;
  n->lfd = listen_on(n->path);
  ck_assert_int_eq(pipe(n->cmd), 0);
  ck_assert_int_eq(pthread_create(&n->thread, NULL, node_main, n), 0);
}

static void node_send(node_t* n, char c) {
  ck_assert(write(n->cmd[1], &c, 1) == 1);
}

static void node_stop(node_t* n) {
  node_send(n, 'q');
  pthread_join(n->thread, NULL);
  if (n->cfd >= 0)
    close(n->cfd);
  if (n->lfd >= 0)
    close(n->lfd);
  close(n->cmd[0]);
  close(n->cmd[1]);
  if (n->seg != NULL)
    munmap(n->seg, n->seg_bytes);
  st_attach_model_free(&n->model);
  tu_rmtree(n->dir);
}

/* ==== The program ========================================================= */

static float w[6], bias[3], scalar;
static char err[512];

static void init_params(void) {
  for (int i = 0; i < 6; i++)
    w[i] = 0.5f * (float) i;
  for (int i = 0; i < 3; i++)
    bias[i] = -1.0f - (float) i;
  scalar = 3.25f;
}

static void params(float out[N_FLOATS]) {
  memcpy(out, w, sizeof w);
  memcpy(out + 6, bias, sizeof bias);
  out[9] = scalar;
}

static const st_client_tensor_t kTensors[] = {
    {"w", ST_CLIENT_F32, 2, {2, 3}, w},
    {"b", ST_CLIENT_F32, 1, {3}, bias},
    {"s", ST_CLIENT_F32, 0, {0}, &scalar},
};

static st_client_options_t options(const node_t* n) {
  st_client_options_t o;
  st_client_options_default(&o);
  o.socket_path = n->path;
  o.attach_timeout_s = 5;
  return o;
}

static st_client_t* attach_ok(node_t* n) {
  init_params();
  node_start(n);
  st_client_options_t o = options(n);
  st_client_t* c = NULL;
  ck_assert_msg(st_client_attach(&o, kTensors, 3, &c, err, sizeof err) == 0,
                "%s", err);
  ck_assert_ptr_nonnull(c);
  ck_assert_int_eq(atomic_load(&n->attached), 1);
  return c;
}

/* The node's side of a request: B, the flags, then req_seq (release). */
static uint64_t post(node_t* n, uint32_t flags, const float* b,
                     uint64_t state_step) {
  if (b != NULL)
    memcpy(st_attach_area_b(n->seg, N_FLOATS), b, N_FLOATS * sizeof(float));
  n->h->req_flags = flags;
  n->h->state_step = state_step;
  return atomic_fetch_add_explicit(&n->h->req_seq, 1, memory_order_release) + 1;
}

static void assert_acked(node_t* n, uint64_t seq, int status) {
  ck_assert_uint_eq(atomic_load(&n->h->ack_seq), seq);
  ck_assert_int_eq(n->h->ack_status, status);
}

static void assert_floats(const float* got, const float* want, size_t k) {
  for (size_t i = 0; i < k; i++)
    ck_assert_msg(got[i] == want[i], "element %zu: %g, want %g", i,
                  (double) got[i], (double) want[i]);
}

/* ==== Attaching =========================================================== */

START_TEST(test_attach_takes_state) {
  node_t n = {0};
  float state[N_FLOATS];
  for (int i = 0; i < N_FLOATS; i++)
    state[i] = 42.0f + (float) i;
  n.state = state;
  n.step = 1234;
  float initial[N_FLOATS];
  init_params();
  params(initial);
  st_client_t* c = attach_ok(&n);
  /* The node saw the conversation attach.h describes. */
  ck_assert(memcmp(n.line_seen, "attach\n", 7) == 0);
  ck_assert_int_eq(n.check_rc, 0);
  ck_assert_uint_eq(n.version, ST_CLIENT_PROTOCOL_VERSION);
  ck_assert_int_eq(n.pid, getpid());
  ck_assert_uint_eq(n.model.n, 3);
  ck_assert_str_eq(n.model.t[0].name, "w");
  ck_assert_uint_eq(n.model.t[2].ndim, 0);
  ck_assert_uint_eq(n.seg_bytes, st_attach_segment_bytes(N_FLOATS));
  assert_floats(n.a0, initial, N_FLOATS); /* area A: the initial values */
  uint64_t bits = atomic_load(&n.h->loss_bits);
  double none;
  memcpy(&none, &bits, sizeof none);
  ck_assert(isnan(none)); /* no loss reported yet */
  /* The program took the state and its step. */
  float now[N_FLOATS];
  params(now);
  assert_floats(now, state, N_FLOATS);
  ck_assert_uint_eq(st_client_cluster_step(c), 1234);
  ck_assert_uint_eq(atomic_load(&n.h->step), 1234);
  ck_assert_str_eq(st_client_error(c), "");
  ck_assert_uint_eq(st_client_protocol_version(), ST_CLIENT_PROTOCOL_VERSION);
  ck_assert_int_eq(st_client_detach(c), 0);
  node_stop(&n);
}
END_TEST

START_TEST(test_attach_first_program) {
  /* The node hands the program's own parameters back (it is the first). */
  node_t n = {0};
  st_client_t* c = attach_ok(&n);
  float now[N_FLOATS], initial[N_FLOATS];
  params(now);
  init_params();
  params(initial);
  assert_floats(now, initial, N_FLOATS);
  ck_assert_uint_eq(st_client_cluster_step(c), 0);
  st_client_detach(c);
  node_stop(&n);
}
END_TEST

START_TEST(test_attach_refused) {
  const struct {
    const char* line;
    const char* refusal;
    int rc;
    const char* want;
  } table[] = {
      {"error busy: another program (pid 99) is attached\n", NULL, -EBUSY,
       "refused the attach: busy: another program (pid 99)"},
      {"error not in attach mode: start the node with --attach\n", NULL,
       -ECONNREFUSED, "refused the attach: not in attach mode"},
      {"error: unknown request; expected status, peers or leave\n", NULL,
       -ECONNREFUSED, "unknown request"},
      {"{\"status\":1}\n", NULL, -EPROTO, "is it a starling node"},
      {NULL,
       "version: the program speaks attach protocol version 1 and this "
       "node version 2",
       -EPROTO, "version 2"},
      {NULL, "busy: another program attached meanwhile", -EBUSY, "meanwhile"},
      {NULL,
       "tensor 1: 'b' F32 [3] in the program, 'b' F32 [4] in the "
       "cluster",
       -EINVAL, "'b' F32 [4] in the cluster"},
  };
  for (size_t k = 0; k < sizeof table / sizeof table[0]; k++) {
    node_t n = {0};
    n.line = table[k].line;
    n.refusal = table[k].refusal;
    init_params();
    node_start(&n);
    st_client_options_t o = options(&n);
    st_client_t* c = (st_client_t*) &n; /* must come back NULL */
    int rc = st_client_attach(&o, kTensors, 3, &c, err, sizeof err);
    ck_assert_msg(rc == table[k].rc, "case %zu: rc %d (%s)", k, rc, err);
    ck_assert_ptr_null(c);
    ck_assert_msg(strstr(err, table[k].want) && strstr(err, n.path),
                  "case %zu: %s", k, err);
    node_stop(&n);
  }
}
END_TEST

START_TEST(test_no_node) {
  char dir[512], path[600];
  ck_assert_int_eq(tu_mkdtemp(dir, sizeof dir), 0);
  snprintf(path, sizeof path, "%s/control.sock", dir);
  st_client_options_t o;
  st_client_options_default(&o);
  o.socket_path = path;
  st_client_t* c;
  init_params();
  ck_assert_int_eq(st_client_attach(&o, kTensors, 3, &c, err, sizeof err),
                   -ENOENT);
  ck_assert_ptr_null(c);
  ck_assert_msg(strstr(err, path) && strstr(err, "starling node --attach"),
                "%s", err);
  /* A socket file with nobody listening. */
  int s = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = unix_addr(path);
  ck_assert_int_eq(bind(s, (struct sockaddr*) &sa, sizeof sa), 0);
  close(s);
  ck_assert_int_eq(st_client_attach(&o, kTensors, 3, &c, err, sizeof err),
                   -ECONNREFUSED);
  ck_assert_msg(strstr(err, "no starling node at") && strstr(err, path), "%s",
                err);
  tu_rmtree(dir);
}
END_TEST

START_TEST(test_attach_timeout) {
  node_t n = {0};
  n.never_reply = 1;
  init_params();
  node_start(&n);
  st_client_options_t o = options(&n);
  o.attach_timeout_s = 0.3;
  st_client_t* c;
  double t0 = st_now_s();
  ck_assert_int_eq(st_client_attach(&o, kTensors, 3, &c, err, sizeof err),
                   -ETIMEDOUT);
  double took = st_now_s() - t0;
  ck_assert_msg(took >= 0.29 && took < 2.0, "took %.3f s", took);
  ck_assert_msg(strstr(err, "attach_timeout_s"), "%s", err);
  ck_assert_ptr_null(c);
  node_stop(&n);

  /* The node closes the connection before it replies. */
  node_t m = {0};
  m.close_before_reply = 1;
  node_start(&m);
  o = options(&m);
  ck_assert_int_eq(st_client_attach(&o, kTensors, 3, &c, err, sizeof err),
                   -ECONNRESET);
  ck_assert_msg(strstr(err, "closed the connection"), "%s", err);
  node_stop(&m);
}
END_TEST

START_TEST(test_bad_tensor_lists) {
  init_params();
  st_client_options_t o;
  st_client_options_default(&o);
  o.socket_path = "/nonexistent/control.sock"; /* never reached */
  st_client_tensor_t t[2];
  st_client_t* c;
  const struct {
    int field;
    const char* want;
    int rc;
  } table[] = {
      {0, "'w' is already tensor 0", -EINVAL},
      {1, "9 dimensions", -EINVAL},
      {2, "dimension 1 is -3", -EINVAL},
      {3, "data is NULL", -EINVAL},
      {4, "dtype 'not F32'", -EINVAL},
      {5, "dimension 0 is 0", -EINVAL},
      {6, "empty name", -EINVAL},
  };
  for (size_t k = 0; k < sizeof table / sizeof table[0]; k++) {
    memcpy(t, kTensors, sizeof t);
    switch (table[k].field) {
      case 0:
        t[1].name = "w";
        break;
      case 1:
        t[1].ndim = 9;
        break;
      case 2:
        t[0].shape[1] = -3;
        break;
      case 3:
        t[1].data = NULL;
        break;
      case 4:
        t[1].dtype = (st_client_dtype_t) 3;
        break;
      case 5:
        t[1].shape[0] = 0;
        break;
      case 6:
        t[1].name = "";
        break;
    }
    int rc = st_client_attach(&o, t, 2, &c, err, sizeof err);
    ck_assert_msg(rc == table[k].rc && strstr(err, table[k].want),
                  "case %zu: rc %d: %s", k, rc, err);
    ck_assert_ptr_null(c);
  }
  ck_assert_int_eq(st_client_attach(&o, t, 0, &c, err, sizeof err), -EINVAL);
  ck_assert_msg(strstr(err, "no tensors"), "%s", err);
  o.socket_path = NULL;
  ck_assert_int_eq(st_client_attach(&o, kTensors, 3, &c, err, sizeof err),
                   -EINVAL);
  ck_assert_msg(strstr(err, "socket_path"), "%s", err);
  char long_path[200];
  memset(long_path, 'p', sizeof long_path - 1);
  long_path[sizeof long_path - 1] = '\0';
  o.socket_path = long_path;
  ck_assert_int_eq(st_client_attach(&o, kTensors, 3, &c, err, sizeof err),
                   -ENAMETOOLONG);
  o.socket_path = "/x";
  o.attach_timeout_s = -1;
  ck_assert_int_eq(st_client_attach(&o, kTensors, 3, &c, err, sizeof err),
                   -EINVAL);
}
END_TEST

/* ==== Step boundaries ===================================================== */

/* After st_client_pending, a step serves only the request it reported: one
 * posted between the two (the program copied nothing for it) waits for the
 * next boundary. */
START_TEST(test_pending_gates_the_next_step) {
  node_t n = {0};
  st_client_t* c = attach_ok(&n);
  float b[N_FLOATS], before[N_FLOATS], now[N_FLOATS], want[N_FLOATS];
  for (int i = 0; i < N_FLOATS; i++)
    b[i] = 0.5f;
  ck_assert_uint_eq(st_client_pending(c), 0);
  uint64_t seq = post(&n, ST_ATTACH_REQ_APPLY, b, 0);
  params(before);
  ck_assert_int_eq(st_client_step(c, 1), 0); /* not the one pending saw */
  ck_assert_uint_eq(atomic_load(&n.h->ack_seq), 0);
  params(now);
  ck_assert(memcmp(now, before, sizeof now) == 0);
  /* The next boundary, without pending: served. */
  ck_assert_int_eq(st_client_step(c, 2), ST_CLIENT_DID_APPLY);
  assert_acked(&n, seq, ST_ATTACH_ACK_OK);
  params(now);
  for (int i = 0; i < N_FLOATS; i++)
    want[i] = before[i] + b[i];
  assert_floats(now, want, N_FLOATS);

  /* Pending saw it: served at once, and the gate is gone after. */
  seq = post(&n, ST_ATTACH_REQ_SNAPSHOT, NULL, 0);
  ck_assert_uint_eq(st_client_pending(c), ST_CLIENT_DID_SNAPSHOT);
  ck_assert_int_eq(st_client_step(c, 3), ST_CLIENT_DID_SNAPSHOT);
  assert_acked(&n, seq, ST_ATTACH_ACK_OK);
  ck_assert_uint_eq(st_client_pending(c), 0);
  ck_assert_int_eq(st_client_step(c, 4), 0);
  seq = post(&n, ST_ATTACH_REQ_SNAPSHOT, NULL, 0);
  ck_assert_int_eq(st_client_step(c, 5), ST_CLIENT_DID_SNAPSHOT);
  assert_acked(&n, seq, ST_ATTACH_ACK_OK);
  st_client_detach(c);
  node_stop(&n);
}
END_TEST

START_TEST(test_noop_step) {
  node_t n = {0};
  st_client_t* c = attach_ok(&n);
  ck_assert_uint_eq(st_client_pending(c), 0);
  for (uint64_t s = 1; s <= 3; s++)
    ck_assert_int_eq(st_client_step(c, s), 0);
  ck_assert_uint_eq(atomic_load(&n.h->step), 3);
  ck_assert_uint_eq(atomic_load(&n.h->boundaries), 3);
  ck_assert_uint_eq(atomic_load(&n.h->ack_seq), 0);
  ck_assert_uint_eq(atomic_load(&n.h->doorbell), 0);
  st_client_report(c, 1.5, 0.25);
  uint64_t lb = atomic_load(&n.h->loss_bits);
  uint64_t ab = atomic_load(&n.h->accuracy_bits);
  double loss, acc;
  memcpy(&loss, &lb, 8);
  memcpy(&acc, &ab, 8);
  ck_assert_double_eq(loss, 1.5);
  ck_assert_double_eq(acc, 0.25);
  st_client_detach(c);
  node_stop(&n);
}
END_TEST

START_TEST(test_apply_snapshot_state) {
  node_t n = {0};
  st_client_t* c = attach_ok(&n);
  float before[N_FLOATS], b[N_FLOATS], now[N_FLOATS], want[N_FLOATS];
  for (int i = 0; i < N_FLOATS; i++)
    b[i] = 0.125f * (float) (i + 1);

  /* APPLY: params += B. */
  params(before);
  uint64_t seq = post(&n, ST_ATTACH_REQ_APPLY, b, 0);
  ck_assert_uint_eq(st_client_pending(c), ST_CLIENT_DID_APPLY);
  ck_assert_int_eq(st_client_step(c, 10), ST_CLIENT_DID_APPLY);
  assert_acked(&n, seq, ST_ATTACH_ACK_OK);
  ck_assert_uint_eq(atomic_load(&n.h->doorbell), 1);
  ck_assert_uint_eq(st_client_pending(c), 0);
  params(now);
  for (int i = 0; i < N_FLOATS; i++)
    want[i] = before[i] + b[i];
  assert_floats(now, want, N_FLOATS);
  ck_assert_int_eq(st_client_step(c, 11), 0); /* served once */

  /* SNAPSHOT: A = params. */
  w[0] = 100;
  scalar = -7;
  seq = post(&n, ST_ATTACH_REQ_SNAPSHOT, NULL, 0);
  ck_assert_uint_eq(st_client_pending(c), ST_CLIENT_DID_SNAPSHOT);
  ck_assert_int_eq(st_client_step(c, 12), ST_CLIENT_DID_SNAPSHOT);
  assert_acked(&n, seq, ST_ATTACH_ACK_OK);
  params(now);
  assert_floats(st_attach_area_a(n.seg), now, N_FLOATS);

  /* APPLY|SNAPSHOT: A = params after the correction. */
  params(before);
  seq = post(&n, ST_ATTACH_REQ_APPLY | ST_ATTACH_REQ_SNAPSHOT, b, 0);
  ck_assert_int_eq(st_client_step(c, 13),
                   ST_CLIENT_DID_APPLY | ST_CLIENT_DID_SNAPSHOT);
  assert_acked(&n, seq, ST_ATTACH_ACK_OK);
  params(now);
  for (int i = 0; i < N_FLOATS; i++)
    want[i] = before[i] + b[i];
  assert_floats(now, want, N_FLOATS);
  assert_floats(st_attach_area_a(n.seg), want, N_FLOATS);

  /* STATE: params = B, and the step. */
  seq = post(&n, ST_ATTACH_REQ_STATE, b, 900);
  ck_assert_uint_eq(st_client_pending(c), ST_CLIENT_DID_STATE);
  ck_assert_int_eq(st_client_step(c, 14), ST_CLIENT_DID_STATE);
  assert_acked(&n, seq, ST_ATTACH_ACK_OK);
  params(now);
  assert_floats(now, b, N_FLOATS);
  ck_assert_uint_eq(st_client_cluster_step(c), 900);
  ck_assert_uint_eq(atomic_load(&n.h->doorbell), 4);
  ck_assert_int_eq(st_client_detach(c), 0);
  node_stop(&n);
}
END_TEST

START_TEST(test_nonfinite) {
  node_t n = {0};
  st_client_t* c = attach_ok(&n);
  float b[N_FLOATS], before[N_FLOATS], now[N_FLOATS];
  for (int i = 0; i < N_FLOATS; i++)
    b[i] = 1;
  bias[1] = NAN;
  params(before);
  uint64_t seq = post(&n, ST_ATTACH_REQ_APPLY | ST_ATTACH_REQ_SNAPSHOT, b, 0);
  ck_assert_int_eq(st_client_step(c, 5), -EDOM);
  ck_assert_msg(strstr(st_client_error(c), "tensor 'b'") &&
                    strstr(st_client_error(c), "element 1 is NaN") &&
                    strstr(st_client_error(c), "step 5"),
                "%s", st_client_error(c));
  assert_acked(&n, seq, ST_ATTACH_ACK_NONFINITE);
  ck_assert_uint_eq(atomic_load(&n.h->doorbell), 1);
  params(now); /* nothing was applied */
  ck_assert(memcmp(now, before, sizeof now) == 0);

  /* A snapshot alone finds an Inf in the scalar. */
  bias[1] = 0;
  scalar = INFINITY;
  seq = post(&n, ST_ATTACH_REQ_SNAPSHOT, NULL, 0);
  ck_assert_int_eq(st_client_step(c, 6), -EDOM);
  ck_assert_msg(strstr(st_client_error(c), "tensor 's'") &&
                    strstr(st_client_error(c), "element 0 is Inf"),
                "%s", st_client_error(c));
  assert_acked(&n, seq, ST_ATTACH_ACK_NONFINITE);

  /* A correction alone is not added to parameters that are not finite
   * either: acked NONFINITE (the node hands it over again later). */
  params(before);
  seq = post(&n, ST_ATTACH_REQ_APPLY, b, 0);
  ck_assert_int_eq(st_client_step(c, 7), -EDOM);
  assert_acked(&n, seq, ST_ATTACH_ACK_NONFINITE);
  params(now);
  ck_assert(memcmp(now, before, sizeof now) == 0);

  /* Finite again: served. */
  scalar = 1;
  seq = post(&n, ST_ATTACH_REQ_SNAPSHOT, NULL, 0);
  ck_assert_int_eq(st_client_step(c, 8), ST_CLIENT_DID_SNAPSHOT);
  assert_acked(&n, seq, ST_ATTACH_ACK_OK);
  st_client_detach(c);
  node_stop(&n);
}
END_TEST

typedef struct {
  node_t* n;
  uint64_t seq;
  int woken; /* FUTEX_WAIT returned 0 (woken), not -ETIMEDOUT */
  double waited_s;
} waiter_t;

/* The node's wait for an ack: FUTEX_WAIT (shared) on the doorbell. */
static void* wait_ack(void* arg) {
  waiter_t* wt = arg;
  st_attach_header_t* h = wt->n->h;
  double t0 = st_now_s();
  while (atomic_load_explicit(&h->ack_seq, memory_order_acquire) != wt->seq &&
         st_now_s() - t0 < 3) {
    uint32_t bell = atomic_load(&h->doorbell);
    if (atomic_load(&h->ack_seq) == wt->seq)
      break;
    struct timespec ts = {1, 0};
    if (syscall(SYS_futex, &h->doorbell, FUTEX_WAIT, bell, &ts, NULL, 0) == 0)
      wt->woken = 1;
  }
  wt->waited_s = st_now_s() - t0;
  return NULL;
}

START_TEST(test_doorbell_wakes) {
  node_t n = {0};
  st_client_t* c = attach_ok(&n);
  float b[N_FLOATS] = {0};
  waiter_t wt = {.n = &n};
  wt.seq = post(&n, ST_ATTACH_REQ_APPLY, b, 0);
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, wait_ack, &wt), 0);
  usleep(100 * 1000); /* the waiter sleeps in FUTEX_WAIT by now */
  ck_assert_int_eq(st_client_step(c, 1), ST_CLIENT_DID_APPLY);
  pthread_join(t, NULL);
  ck_assert(wt.woken);
  ck_assert_msg(wt.waited_s < 0.9, "waited %.3f s", wt.waited_s);
  st_client_detach(c);
  node_stop(&n);
}
END_TEST

/* ==== The node going away ================================================= */

/* Steps every 5 ms until a boundary returns non-zero or max_s passes. */
static int step_until(st_client_t* c, double max_s, double* took) {
  double t0 = st_now_s();
  int rc = 0;
  for (uint64_t s = 100; rc == 0 && st_now_s() - t0 < max_s; s++) {
    rc = st_client_step(c, s);
    if (rc == 0)
      usleep(5000);
  }
  *took = st_now_s() - t0;
  return rc;
}

START_TEST(test_node_goes_away) {
  node_t n = {0};
  st_client_t* c = attach_ok(&n);
  node_send(&n, 'c');
  double took;
  ck_assert_int_eq(step_until(c, 3, &took), -ENOTCONN);
  ck_assert_msg(took < 0.4, "noticed after %.3f s", took);
  ck_assert_msg(strstr(st_client_error(c), "went away") &&
                    strstr(st_client_error(c), n.path),
                "%s", st_client_error(c));
  ck_assert_int_eq(st_client_step(c, 1000), -ENOTCONN);
  ck_assert_uint_eq(st_client_pending(c), 0);
  ck_assert_int_eq(st_client_detach(c), -ENOTCONN);
  node_stop(&n);
}
END_TEST

START_TEST(test_reconnect) {
  node_t n = {0};
  float state2[N_FLOATS];
  for (int i = 0; i < N_FLOATS; i++)
    state2[i] = 7;
  n.state2 = state2;
  n.step2 = 500;
  init_params();
  node_start(&n);
  st_client_options_t o = options(&n);
  o.reconnect = 1;
  o.reconnect_timeout_s = 5;
  st_client_t* c;
  ck_assert_msg(st_client_attach(&o, kTensors, 3, &c, err, sizeof err) == 0,
                "%s", err);
  node_send(&n, 'r');
  double took;
  ck_assert_int_eq(step_until(c, 5, &took), ST_CLIENT_DID_STATE);
  ck_assert_int_eq(atomic_load(&n.attached), 2);
  float now[N_FLOATS];
  params(now);
  assert_floats(now, state2, N_FLOATS);
  ck_assert_uint_eq(st_client_cluster_step(c), 500);
  /* The new session works: a request through the new segment. */
  float b[N_FLOATS];
  for (int i = 0; i < N_FLOATS; i++)
    b[i] = 1;
  uint64_t seq = post(&n, ST_ATTACH_REQ_APPLY, b, 0);
  ck_assert_int_eq(st_client_step(c, 501), ST_CLIENT_DID_APPLY);
  assert_acked(&n, seq, ST_ATTACH_ACK_OK);
  params(now);
  ck_assert_float_eq(now[3], 8);
  ck_assert_int_eq(st_client_detach(c), 0);
  node_stop(&n);
}
END_TEST

START_TEST(test_reconnect_gives_up) {
  node_t n = {0};
  init_params();
  node_start(&n);
  st_client_options_t o = options(&n);
  o.reconnect = 1;
  o.reconnect_timeout_s = 0.6;
  st_client_t* c;
  ck_assert_int_eq(st_client_attach(&o, kTensors, 3, &c, err, sizeof err), 0);
  node_send(&n, 'k');
  double took;
  ck_assert_int_eq(step_until(c, 5, &took), -ENOTCONN);
  ck_assert_msg(took >= 0.55 && took < 2.0, "gave up after %.3f s", took);
  ck_assert_msg(strstr(st_client_error(c), "did not come back"), "%s",
                st_client_error(c));
  ck_assert_int_eq(st_client_detach(c), -ENOTCONN);
  node_stop(&n);
}
END_TEST

START_TEST(test_detach) {
  node_t n = {0};
  st_client_t* c = attach_ok(&n);
  w[2] = 99; /* trained since the last snapshot */
  float last[N_FLOATS];
  params(last);
  ck_assert_int_eq(st_client_detach(c), 0);
  /* The node reads the detach frame, then the end of the stream; area A
   * holds the program's last parameters. */
  for (int i = 0; i < 200 && !atomic_load(&n.saw_eof); i++)
    usleep(10 * 1000);
  ck_assert(atomic_load(&n.saw_eof));
  bool final = false;
  ck_assert_int_eq(
      st_attach_detach_decode(n.last_frame, strlen(n.last_frame), &final), 0);
  ck_assert(final);
  assert_floats(st_attach_area_a(n.seg), last, N_FLOATS);

  /* Parameters that are not finite are not handed over. */
  node_t m = {0};
  c = attach_ok(&m);
  bias[0] = NAN;
  ck_assert_int_eq(st_client_detach(c), 0);
  for (int i = 0; i < 200 && !atomic_load(&m.saw_eof); i++)
    usleep(10 * 1000);
  ck_assert_int_eq(
      st_attach_detach_decode(m.last_frame, strlen(m.last_frame), &final), 0);
  ck_assert(!final);
  node_stop(&m);
  ck_assert_int_eq(st_client_detach(NULL), 0);
  node_stop(&n);
}
END_TEST

static Suite* client_suite(void) {
  Suite* s = suite_create("client");
  TCase* tc = tcase_create("attach");
  tcase_add_test(tc, test_attach_takes_state);
  tcase_add_test(tc, test_attach_first_program);
  tcase_add_test(tc, test_attach_refused);
  tcase_add_test(tc, test_no_node);
  tcase_add_test(tc, test_attach_timeout);
  tcase_add_test(tc, test_bad_tensor_lists);
  tcase_set_timeout(tc, 30);
  suite_add_tcase(s, tc);
  TCase* ts = tcase_create("step");
  tcase_add_test(ts, test_noop_step);
  tcase_add_test(ts, test_apply_snapshot_state);
  tcase_add_test(ts, test_nonfinite);
  tcase_add_test(ts, test_pending_gates_the_next_step);
  tcase_add_test(ts, test_doorbell_wakes);
  tcase_add_test(ts, test_node_goes_away);
  tcase_add_test(ts, test_reconnect);
  tcase_add_test(ts, test_reconnect_gives_up);
  tcase_add_test(ts, test_detach);
  tcase_set_timeout(ts, 30);
  suite_add_tcase(s, ts);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(client_suite());
  srunner_run_all(sr, CK_ENV);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
