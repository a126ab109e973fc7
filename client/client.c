/* client.c: the client library a training program links
 * (client/starling/client.h): attaching with a tensor list, the step
 * boundary that serves the node's requests through the shared segment
 * (attach/attach.h gives the order: STATE, APPLY, SNAPSHOT, then the ack),
 * noticing that the node went away, and detaching. The conversation on the
 * socket is in client_session.c.
 *
 * The step boundary is the one call on the program's hot path. With
 * nothing to serve it is two relaxed stores, one acquire load and a coarse
 * clock read (vDSO); every ST__CLIENT_CHECK_INTERVAL_S it also polls the
 * socket without blocking. Serving touches each parameter once or twice:
 * a snapshot's copy checks finiteness as it goes, and a correction with a
 * snapshot is added and copied in one pass after a separate check (a
 * correction is never added to parameters that are not finite).
 */
#define _GNU_SOURCE /* syscall(SYS_futex) */
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <linux/futex.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "attach/attach.h"
#include "base/base.h"
#include "client/client_internal.h"
#include "client/starling/client.h"

_Static_assert(ST_CLIENT_PROTOCOL_VERSION == ST_ATTACH_VERSION,
               "client.h and attach.h speak the same protocol version");
_Static_assert(ST_CLIENT_MAX_DIMS == ST_ATTACH_MAX_DIMS, "dimension limit");

unsigned st_client_protocol_version(void) {
  return ST_ATTACH_VERSION;
}

void st_client_options_default(st_client_options_t* opt) {
  memset(opt, 0, sizeof(*opt));
  opt->attach_timeout_s = 300;
  opt->reconnect = 0;
  opt->reconnect_timeout_s = 60;
}

/* ---- Attaching -------------------------------------------------------------
 */

/* Checks the program's tensor list into c->model and c->data. */
static int build_model(st_client_t* c, const st_client_tensor_t* tensors,
                       size_t n, char* err, size_t err_len) {
  if (tensors == NULL || n == 0) {
    st_set_err(err, err_len,
               "no tensors given; register at least one parameter tensor");
    return -EINVAL;
  }
  c->data = calloc(n, sizeof(*c->data));
  if (c->data == NULL)
    return -ENOMEM;
  for (size_t i = 0; i < n; i++) {
    const st_client_tensor_t* t = &tensors[i];
    uint64_t shape[ST_ATTACH_MAX_DIMS] = {0};
    for (int d = 0; d < t->ndim && d < ST_ATTACH_MAX_DIMS; d++) {
      if (t->shape[d] < 0) {
        st_set_err(err, err_len,
                   "tensor %zu: dimension %d is %lld; dimensions are "
                   "positive",
                   i, d, (long long) t->shape[d]);
        return -EINVAL;
      }
      shape[d] = (uint64_t) t->shape[d];
    }
    const char* dtype = t->dtype == ST_CLIENT_F32 ? "F32" : "not F32";
    int rc = st_attach_model_add(&c->model, t->name, dtype, t->ndim, shape, err,
                                 err_len);
    if (rc != 0)
      return rc;
    if (t->data == NULL) {
      st_set_err(err, err_len,
                 "tensor '%s': data is NULL; point it at the tensor's "
                 "%llu floats",
                 t->name, (unsigned long long) c->model.t[i].n_elems);
      return -EINVAL;
    }
    c->data[i] = t->data;
  }
  return 0;
}

static int check_options(const st_client_options_t* opt, char* err,
                         size_t err_len) {
  if (opt == NULL || opt->socket_path == NULL || opt->socket_path[0] == '\0') {
    st_set_err(err, err_len,
               "no socket_path given; set it to the node's "
               "DATA_DIR/control.sock");
    return -EINVAL;
  }
  if (strlen(opt->socket_path) >= sizeof(((struct st_client_s*) 0)->path)) {
    st_set_err(err, err_len,
               "socket_path '%s' is longer than a Unix socket path may be "
               "(%zu bytes); use a shorter path (a symbolic link to the data "
               "directory)",
               opt->socket_path, sizeof(((struct st_client_s*) 0)->path) - 1);
    return -ENAMETOOLONG;
  }
  if (!(opt->attach_timeout_s >= 0) || !(opt->reconnect_timeout_s >= 0)) {
    st_set_err(err, err_len,
               "attach_timeout_s and reconnect_timeout_s must be >= 0 "
               "seconds (0: no limit)");
    return -EINVAL;
  }
  return 0;
}

/* The deadline (st_now_s) timeout_s from now; INFINITY for 0. */
static double deadline_in(double timeout_s) {
  return timeout_s > 0 ? st_now_s() + timeout_s : INFINITY;
}

static void client_free(st_client_t* c) {
  st__client_session_close(c);
  st_attach_model_free(&c->model);
  free(c->data);
  free(c);
}

int st_client_attach(const st_client_options_t* opt,
                     const st_client_tensor_t* tensors, size_t n_tensors,
                     st_client_t** out, char* err, size_t err_len) {
  *out = NULL;
  if (err != NULL && err_len > 0)
    err[0] = '\0';
  int rc = check_options(opt, err, err_len);
  if (rc != 0)
    return rc;
  st_client_t* c = calloc(1, sizeof(*c));
  if (c == NULL) {
    st_set_err(err, err_len, "out of memory");
    return -ENOMEM;
  }
  c->opt = *opt;
  c->sock = -1;
  memcpy(c->path, opt->socket_path, strlen(opt->socket_path) + 1);
  c->opt.socket_path = c->path;
  rc = build_model(c, tensors, n_tensors, err, err_len);
  if (rc == -ENOMEM)
    st_set_err(err, err_len, "out of memory for the tensor list");
  if (rc == 0) {
    rc = st__client_session_open(c, deadline_in(opt->attach_timeout_s));
    if (rc != 0)
      st_set_err(err, err_len, "%s", c->err);
  }
  if (rc != 0) {
    client_free(c);
    return rc;
  }
  *out = c;
  return 0;
}

/* ---- The node going away ---------------------------------------------------
 */

/* Whether to try again after a failed attach while waiting for the node to
 * come back: it is not listening yet, or went away again mid-attach. */
static bool retryable(int rc) {
  return rc == -ENOENT || rc == -ECONNREFUSED || rc == -ECONNRESET ||
         rc == -EPIPE;
}

static int reconnect(st_client_t* c) {
  double limit = deadline_in(c->opt.reconnect_timeout_s);
  for (;;) {
    double deadline = deadline_in(c->opt.attach_timeout_s);
    int rc = st__client_session_open(c, deadline < limit ? deadline : limit);
    if (rc == 0)
      return ST_CLIENT_DID_STATE;
    double left = limit - st_now_s();
    if (!retryable(rc) || left <= 0) {
      char why[sizeof c->err];
      memcpy(why, c->err, sizeof why);
      st_set_err(c->err, sizeof c->err,
                 retryable(rc) || rc == -ETIMEDOUT
                     ? "the starling node at %s went away and did not come "
                       "back in time (reconnect_timeout_s): %s"
                     : "the starling node at %s went away and refused this "
                       "program when it came back: %s",
                 c->path, why);
      c->gone = true;
      return -ENOTCONN;
    }
    double nap =
        left < ST__CLIENT_RETRY_INTERVAL_S ? left : ST__CLIENT_RETRY_INTERVAL_S;
    struct timespec ts = {(time_t) nap, (long) ((nap - floor(nap)) * 1e9)};
    nanosleep(&ts, NULL);
  }
}

/* The node closed the connection: fail, or wait for it to come back. */
static int node_gone(st_client_t* c) {
  close(c->sock);
  c->sock = -1;
  if (c->opt.reconnect)
    return reconnect(c);
  c->gone = true;
  st_set_err(c->err, sizeof c->err,
             "the starling node at %s went away (it closed the connection: "
             "it left or died); start it again and attach again, or set "
             "the reconnect option to wait for it",
             c->path);
  return -ENOTCONN;
}

/* ---- Serving a request -----------------------------------------------------
 */

/* Nonzero when src[0..n) holds a NaN or an infinity (exponent bits all
 * ones), copying it to dst when dst is not NULL. On the bits, as integers:
 * GCC vectorizes this loop, not one that compares floats into a flag
 * (measured: a 16 MB snapshot took 2.6 copies' time with the float
 * comparison, scalar). */
static uint32_t nonfinite_bits(float* restrict dst, const float* restrict src,
                               uint64_t n) {
  uint32_t bad = 0, b;
  if (dst == NULL) {
    for (uint64_t j = 0; j < n; j++) {
      memcpy(&b, &src[j], sizeof b); /* the bits, without aliasing */
      bad |= (uint32_t) ((b & 0x7f800000u) == 0x7f800000u);
    }
  } else {
    for (uint64_t j = 0; j < n; j++) { /* one pass: copy and check */
      memcpy(&b, &src[j], sizeof b);
      dst[j] = src[j];
      bad |= (uint32_t) ((b & 0x7f800000u) == 0x7f800000u);
    }
  }
  return bad;
}

/* The index (in the concatenation) of the first non-finite parameter, or
 * -1. */
static long long first_nonfinite(const st_client_t* c) {
  for (size_t i = 0; i < c->model.n; i++) {
    const float* p = c->data[i];
    uint64_t n = c->model.t[i].n_elems;
    uint32_t bad = nonfinite_bits(NULL, p, n);
    if (!bad)
      continue;
    for (uint64_t j = 0; j < n; j++)
      if (!isfinite(p[j]))
        return (long long) (c->model.t[i].offset + j);
  }
  return -1;
}

/* a = params, checking finiteness on the way: as first_nonfinite. */
static long long snapshot_checked(const st_client_t* c, float* a) {
  for (size_t i = 0; i < c->model.n; i++) {
    const float* p = c->data[i];
    float* dst = a + c->model.t[i].offset;
    uint64_t n = c->model.t[i].n_elems;
    if (nonfinite_bits(dst, p, n))
      return first_nonfinite(c);
  }
  return -1;
}

/* params += b, and a = params when a is not NULL. */
static void apply(const st_client_t* c, const float* b, float* a) {
  for (size_t i = 0; i < c->model.n; i++) {
    float* p = c->data[i];
    uint64_t off = c->model.t[i].offset, n = c->model.t[i].n_elems;
    const float* bi = b + off;
    if (a == NULL) {
      for (uint64_t j = 0; j < n; j++)
        p[j] += bi[j];
    } else {
      float* ai = a + off;
      for (uint64_t j = 0; j < n; j++)
        ai[j] = p[j] += bi[j];
    }
  }
}

static void take_state(st_client_t* c, const float* b) {
  for (size_t i = 0; i < c->model.n; i++)
    memcpy(c->data[i], b + c->model.t[i].offset,
           c->model.t[i].n_elems * sizeof(float));
}

/* -EDOM with a sentence naming the tensor that holds element `at`. */
static int nonfinite_error(st_client_t* c, long long at, uint64_t step) {
  size_t i = 0;
  while (i + 1 < c->model.n && c->model.t[i + 1].offset <= (uint64_t) at)
    i++;
  const st_attach_tensor_t* t = &c->model.t[i];
  uint64_t j = (uint64_t) at - t->offset;
  float v = c->data[i][j];
  st_set_err(c->err, sizeof c->err,
             "tensor '%s' holds a non-finite value (element %llu is %s) at "
             "step %llu: nothing was shared or applied; the training "
             "diverged (lower the learning rate, or restart from the "
             "cluster's parameters)",
             t->name, (unsigned long long) j, isnan(v) ? "NaN" : "Inf",
             (unsigned long long) step);
  return -EDOM;
}

/* Serves request `req` in attach.h's order, then acks and rings. */
static int serve(st_client_t* c, uint64_t req, uint64_t step) {
  st_attach_header_t* h = c->h;
  uint32_t flags = h->req_flags;
  uint64_t state_step = h->state_step;
  const float* b = st_attach_area_b(h, c->model.n_floats);
  float* a = st_attach_area_a(h);
  int did = 0;
  long long bad = -1;
  if (flags & ST_ATTACH_REQ_STATE) {
    take_state(c, b);
    c->cluster_step = state_step;
    did |= ST_CLIENT_DID_STATE;
  }
  if ((flags & ST_ATTACH_REQ_SNAPSHOT) && (flags & ST_ATTACH_REQ_APPLY)) {
    bad = first_nonfinite(c);
    if (bad < 0) {
      apply(c, b, a);
      did |= ST_CLIENT_DID_APPLY | ST_CLIENT_DID_SNAPSHOT;
    }
  } else if (flags & ST_ATTACH_REQ_SNAPSHOT) {
    bad = snapshot_checked(c, a);
    if (bad < 0)
      did |= ST_CLIENT_DID_SNAPSHOT;
  } else if (flags & ST_ATTACH_REQ_APPLY) {
    bad = first_nonfinite(c);
    if (bad < 0) {
      apply(c, b, NULL);
      did |= ST_CLIENT_DID_APPLY;
    }
  }
  h->ack_status = bad < 0 ? ST_ATTACH_ACK_OK : ST_ATTACH_ACK_NONFINITE;
  atomic_store_explicit(&h->ack_seq, req, memory_order_release);
  c->acked = req;
  atomic_fetch_add_explicit(&h->doorbell, 1, memory_order_release);
  /* Not FUTEX_PRIVATE: the node waits on its own mapping of the word. */
  syscall(SYS_futex, &h->doorbell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
  return bad < 0 ? did : nonfinite_error(c, bad, step);
}

/* ---- The API ---------------------------------------------------------------
 */

int st_client_step(st_client_t* c, uint64_t step) {
  if (c->gone)
    return -ENOTCONN;
  st_attach_header_t* h = c->h;
  atomic_store_explicit(&h->step, step, memory_order_relaxed);
  /* Only this side writes the counter: a load and a store, no locked
   * instruction. Release: the node writes area B only after the first one
   * (it may still hold the parameters install() copied). */
  uint64_t n = atomic_load_explicit(&h->boundaries, memory_order_relaxed);
  atomic_store_explicit(&h->boundaries, n + 1, memory_order_release);
  uint64_t req = atomic_load_explicit(&h->req_seq, memory_order_acquire);
  /* After st_client_pending only the request it saw is served: one that
   * came since would find the program's host copies stale. */
  bool gated = c->gated && req != c->gate_seq;
  c->gated = false;
  if (req != c->acked && !gated)
    return serve(c, req, step);
  double now = st__client_coarse_now_s();
  if (now < c->next_check_s)
    return 0;
  c->next_check_s = now + ST__CLIENT_CHECK_INTERVAL_S;
  if (!st__client_peer_closed(c->sock))
    return 0;
  return node_gone(c);
}

unsigned st_client_pending(st_client_t* c) {
  if (c->gone || c->h == NULL)
    return 0;
  uint64_t req = atomic_load_explicit(&c->h->req_seq, memory_order_acquire);
  c->gated = true;
  c->gate_seq = req;
  if (req == c->acked)
    return 0;
  uint32_t flags = c->h->req_flags;
  return ((flags & ST_ATTACH_REQ_APPLY) ? ST_CLIENT_DID_APPLY : 0u) |
         ((flags & ST_ATTACH_REQ_SNAPSHOT) ? ST_CLIENT_DID_SNAPSHOT : 0u) |
         ((flags & ST_ATTACH_REQ_STATE) ? ST_CLIENT_DID_STATE : 0u);
}

uint64_t st_client_cluster_step(const st_client_t* c) {
  return c->cluster_step;
}

void st_client_report(st_client_t* c, double loss, double accuracy) {
  if (c->h == NULL)
    return;
  uint64_t lb, ab;
  memcpy(&lb, &loss, sizeof lb);
  memcpy(&ab, &accuracy, sizeof ab);
  atomic_store_explicit(&c->h->loss_bits, lb, memory_order_relaxed);
  atomic_store_explicit(&c->h->accuracy_bits, ab, memory_order_relaxed);
}

const char* st_client_error(const st_client_t* c) {
  return c->err;
}

int st_client_detach(st_client_t* c) {
  if (c == NULL)
    return 0;
  int rc = c->gone ? -ENOTCONN : 0;
  if (c->sock >= 0) {
    if (st__client_peer_closed(c->sock)) {
      rc = -ENOTCONN;
    } else {
      /* The program's last parameters go to the node with the detach
       * (final), unless they are not finite. A request still outstanding
       * stays unserved: the node adds its correction on top itself. */
      bool final = snapshot_checked(c, st_attach_area_a(c->h)) < 0;
      st__client_send_detach(c->sock, final);
    }
  }
  client_free(c);
  return rc;
}
