/* daemon_conn.c: TCP connections between nodes.
 *
 * A connection goes through three phases:
 *
 *   HANDSHAKE  the three handshake messages (crypto/handshake.c) in
 *              plain frames, and then
 *   HEADER     each side's 24-byte secretstream header: both framed by
 *              gossip/session.c (the dialling side checks there that the
 *              peer is the node it meant to reach, when it knows its id);
 *              this file moves the framer's bytes and acts on its phases.
 *   OPEN       encrypted frames (crypto/stream.c), one wire message each;
 *              a length over ST_FRAME_MAX_DEFAULT is refused from the four
 *              length bytes, before anything more is read or allocated.
 *
 * What a connection is for is a table of callbacks (st__conn_ops_t, one
 * const instance per purpose, in daemon_conn_purpose.c). The dialling side
 * knows it from the start; the accepting side picks it by the type of the first
 * message: a PUSH_PULL goes to the membership machine, whose reply goes back on
 * the same connection, an XCHG_REQ starts an exchange (daemon_xchg.c), and a
 * RING_LANE opens a lane of a ring round (daemon_ring.c). Anything else
 * closes the connection.
 *
 * Bulk frames (a tensor chunk, up to 1 MiB) are sealed and opened on
 * libuv's thread pool so that the loop thread never spends milliseconds in
 * the cipher: one job per direction at a time keeps each secretstream in
 * order (a frame queued behind a job waits for it, small or not), and
 * reading pauses while a received frame is being opened, so that the job
 * reads it where it was received (the receive buffer is compacted once
 * the job is done).
 *
 * Every connection has a deadline (the sweep timer closes it when it
 * passes) and the number of connections is capped, so a peer that opens
 * connections and says nothing cannot pin memory. A closing connection
 * whose peer does not read its last frames is aborted after
 * ST__CLOSE_DEADLINE_MS, and the kernel ends one whose writes go
 * unacknowledged for ST__TCP_USER_TIMEOUT_MS.
 *
 * Admission: an accepted connection is "pre-auth" until its handshake is
 * done, since until then anyone can hold it. Pre-auth connections are
 * limited per source address and in all, the oldest is evicted for a
 * newcomer when their share is full, and their deadline is shortened
 * under pressure (the limits and their reasons: daemon_internal.h).
 */
#include "node/daemon/daemon_internal.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

enum { P_CONNECTING = 0, P_HANDSHAKE, P_HEADER, P_OPEN };

/* A receive buffer never grows past one full frame plus its prefix. */
#define RBUF_MAX (ST_FRAME_LENGTH_BYTES + ST_FRAME_MAX_DEFAULT + 64u)

typedef struct {
  uv_write_t req;
  st__conn_t* c;
  bool xchg_ack;
  size_t len;
  uint8_t data[];
} wreq_t;

/* A frame sealed or opened on the thread pool. */
struct st__job_s {
  uv_work_t work;
  st__conn_t* c;
  struct st__job_s* next;
  wreq_t* w;   /* tx: the frame to write, sealed in place */
  uint8_t* in; /* tx: the plaintext (owned); rx: the ciphertext, in rbuf */
  size_t in_len;
  uint8_t* out; /* rx: the plaintext */
  size_t out_len;
  bool xchg_ack;
  int rc;
  st_crypto_counters_t cc; /* rx: what the worker counted */
};
typedef struct st__job_s job_t;

static int process(st__conn_t* c);
static void conn_abort(st__conn_t* c);
static void read_cb(uv_stream_t* s, ssize_t nread, const uv_buf_t* buf);
static void alloc_cb(uv_handle_t* h, size_t suggested, uv_buf_t* buf);

/* The connection no longer counts as pre-auth: authenticated, or
 * closing. */
static void preauth_end(st__conn_t* c) {
  if (c->preauth) {
    c->preauth = false;
    c->d->n_preauth--;
  }
}

static void conn_free(st__conn_t* c) {
  st__daemon_t* d = c->d;
  preauth_end(c);
  if (c->released)
    d->n_released--;
  if (c->serving_fetch)
    d->fetch_serving--;
  st__xchg_conn_freed(c); /* its exchange's buffer and slot, if held */
  if (c->serving_sync)
    d->sync_serving--;
  for (st__conn_t** p = &d->conns; *p != NULL; p = &(*p)->next) {
    if (*p == c) {
      *p = c->next;
      d->n_conns--;
      break;
    }
  }
  while (c->txq_head != NULL) {
    struct st__job_s* j = c->txq_head;
    c->txq_head = j->next;
    free(j->w);
    free(j->in);
    free(j);
  }
  if (c->x != NULL)
    st_xchg_free(c->x);
  st__anchor_release(c->anchor);
  st_session_framer_wipe(&c->sf);
  st_stream_wipe(&c->tx);
  st_stream_wipe(&c->rx);
  free(c->rbuf);
  free(c->ring_held);
  free(c->pp_request);
  free(c);
}

/* Frees a closed connection once neither the trainer nor a pool job
 * borrows from it. */
static void maybe_free(st__conn_t* c) {
  if (c->handle_closed && c->tt_pending == 0 && c->jobs == 0)
    conn_free(c);
}

void st__conn_release(st__conn_t* c) {
  c->tt_pending--;
  if (c->tt_pending == 0 && c->ops != NULL && c->ops->on_idle != NULL)
    c->ops->on_idle(c);
  maybe_free(c);
}

static void close_cb(uv_handle_t* h) {
  st__conn_t* c = h->data;
  c->handle_closed = true;
  if (c->ops != NULL && c->ops->on_handle_closed != NULL)
    c->ops->on_handle_closed(c);
  maybe_free(c);
}

/* Tells the conn's owner that it will carry nothing more. */
static void notify_closed(st__conn_t* c) {
  if (c->ops != NULL && c->ops->on_close != NULL)
    c->ops->on_close(c);
}

/* Closes at once, dropping the frames queued here. With reset, the kernel
 * drops what it still holds for the peer too and sends a reset (RST);
 * without, it goes on delivering its buffer (up to tcp_wmem's 4 MB) after
 * the close, to a peer that may read 48 KiB a second, and the connection
 * lingers, orphaned, until it does. Resets are for connections ended for
 * cause: a deadline missed, an outsider refused or evicted. */
static void conn_end(st__conn_t* c, bool reset) {
  if (c->handle_closed || uv_is_closing((uv_handle_t*) &c->tcp))
    return;
  c->closing = true;
  preauth_end(c);
  notify_closed(c); /* its owner may close it itself */
  if (uv_is_closing((uv_handle_t*) &c->tcp))
    return;
  if (!reset || uv_tcp_close_reset(&c->tcp, close_cb) != 0)
    uv_close((uv_handle_t*) &c->tcp, close_cb);
}

static void conn_abort(st__conn_t* c) {
  conn_end(c, false);
}

static void conn_reset(st__conn_t* c) {
  conn_end(c, true);
}

void st__conn_close_reset(st__conn_t* c) {
  if (c->handle_closed || uv_is_closing((uv_handle_t*) &c->tcp))
    return;
  c->closing = true;
  preauth_end(c);
  if (uv_tcp_close_reset(&c->tcp, close_cb) != 0)
    uv_close((uv_handle_t*) &c->tcp, close_cb);
}

void st__conn_close(st__conn_t* c) {
  if (!c->closing)
    c->close_deadline_ms = st__dnow(c->d) + ST__CLOSE_DEADLINE_MS;
  c->closing = true;
  preauth_end(c);
  if (c->frames_out_pending == 0 && !uv_is_closing((uv_handle_t*) &c->tcp))
    uv_close((uv_handle_t*) &c->tcp, close_cb);
}

void st__conn_pause(st__conn_t* c) {
  c->paused = true;
  uv_read_stop((uv_stream_t*) &c->tcp);
}

void st__conn_resume(st__conn_t* c) {
  if (!c->paused || c->closing)
    return;
  c->paused = false;
  if (c->in_process) {
    /* Called from a message this conn's process() is dispatching: that
     * loop goes on with the buffered frames itself. */
    if (!c->rx_busy && !c->eof)
      uv_read_start((uv_stream_t*) &c->tcp, alloc_cb, read_cb);
    return;
  }
  if (process(c) != 0 || (c->eof && !c->rx_busy && !c->paused)) {
    conn_abort(c);
    return;
  }
  if (c->eof)
    return;
  if (!c->rx_busy && !c->closing && !c->paused)
    uv_read_start((uv_stream_t*) &c->tcp, alloc_cb, read_cb);
}

st__conn_t* st__conn_find(st__daemon_t* d, uint64_t id) {
  for (st__conn_t* c = d->conns; c != NULL; c = c->next)
    if (c->id == id)
      return c;
  return NULL;
}

static void write_cb(uv_write_t* req, int status) {
  wreq_t* w = (wreq_t*) req;
  st__conn_t* c = w->c;
  c->frames_out_pending--;
  bool ack = w->xchg_ack && status == 0;
  free(w);
  if (status < 0 && !c->closing) {
    /* The peer is gone (EPIPE, a reset): its owner hears it now, not at
     * its deadline, even while reading is paused (a reader that is not
     * reading never sees the end of the stream). */
    conn_abort(c);
    return;
  }
  if (ack && !c->closing && c->ops != NULL && c->ops->on_sent != NULL)
    c->ops->on_sent(c);
  if (c->closing && c->frames_out_pending == 0 &&
      !uv_is_closing((uv_handle_t*) &c->tcp))
    uv_close((uv_handle_t*) &c->tcp, close_cb);
}

/* Writes a frame already counted in frames_out_pending. */
static int write_counted(st__conn_t* c, wreq_t* w, bool xchg_ack) {
  w->c = c;
  w->xchg_ack = xchg_ack;
  uv_buf_t b = uv_buf_init((char*) w->data, (unsigned) w->len);
  int rc = uv_write(&w->req, (uv_stream_t*) &c->tcp, &b, 1, write_cb);
  if (rc != 0) {
    free(w);
    c->frames_out_pending--;
    return rc;
  }
  c->d->c.bytes_out += w->len;
  return 0;
}

static int write_raw(st__conn_t* c, wreq_t* w, bool xchg_ack) {
  c->frames_out_pending++;
  return write_counted(c, w, xchg_ack);
}

/* ---- Thread-pool sealing ------------------------------------------------ */

static void seal_work(uv_work_t* req) {
  job_t* j = req->data;
  st__conn_t* c = j->c;
  size_t cap = j->in_len + ST_STREAM_ABYTES + ST_FRAME_LENGTH_BYTES;
  j->rc = st_stream_seal_frame(&c->tx, j->in, j->in_len, false, j->w->data, cap,
                               &j->w->len);
}

static void start_tx(st__conn_t* c);

static void seal_after(uv_work_t* req, int status) {
  job_t* j = req->data;
  st__conn_t* c = j->c;
  c->jobs--;
  c->tx_busy = false;
  wreq_t* w = j->w;
  bool ack = j->xchg_ack;
  int rc = status != 0 ? status : j->rc;
  free(j->in);
  free(j);
  if (c->closing || rc != 0 || uv_is_closing((uv_handle_t*) &c->tcp)) {
    free(w);
    c->frames_out_pending--;
    if (rc != 0 && !c->closing)
      st__conn_close(c);
    else if (c->closing && c->frames_out_pending == 0 &&
             !uv_is_closing((uv_handle_t*) &c->tcp))
      uv_close((uv_handle_t*) &c->tcp, close_cb);
    maybe_free(c);
    return;
  }
  if (write_counted(c, w, ack) != 0) {
    st__conn_close(c);
    return;
  }
  start_tx(c);
}

static void start_tx(st__conn_t* c) {
  if (c->tx_busy || c->txq_head == NULL || c->closing)
    return;
  job_t* j = c->txq_head;
  c->txq_head = j->next;
  if (c->txq_head == NULL)
    c->txq_tail = NULL;
  j->work.data = j;
  c->tx_busy = true;
  c->jobs++;
  if (uv_queue_work(&c->d->loop, &j->work, seal_work, seal_after) != 0) {
    c->jobs--;
    c->tx_busy = false;
    c->frames_out_pending--;
    free(j->w);
    free(j->in);
    free(j);
    st__conn_close(c);
  }
}

/* Queues msg to be sealed on the pool: taken (in, from malloc; freed
 * here, on failure too) or copied (in NULL: msg is borrowed only for the
 * call). */
static int send_offloaded(st__conn_t* c, const uint8_t* msg, uint8_t* in,
                          size_t len, bool xchg_ack) {
  size_t cap = len + ST_STREAM_ABYTES + ST_FRAME_LENGTH_BYTES;
  job_t* j = calloc(1, sizeof(*j));
  wreq_t* w = malloc(sizeof(*w) + cap);
  bool copy = in == NULL;
  if (copy)
    in = malloc(len > 0 ? len : 1);
  if (j == NULL || w == NULL || in == NULL) {
    free(j);
    free(w);
    free(in);
    return -ENOMEM;
  }
  if (copy)
    memcpy(in, msg, len);
  j->c = c;
  j->w = w;
  j->in = in;
  j->in_len = len;
  j->xchg_ack = xchg_ack;
  if (c->txq_tail != NULL)
    c->txq_tail->next = j;
  else
    c->txq_head = j;
  c->txq_tail = j;
  c->frames_out_pending++;
  start_tx(c);
  return 0;
}

/* ---- Thread-pool opening ------------------------------------------------ */

static void open_work(uv_work_t* req) {
  job_t* j = req->data;
  bool final = false;
  j->rc = st_stream_open_frame(&j->c->rx, &j->cc, j->in, j->in_len, j->out,
                               j->in_len, &j->out_len, &final);
}

/* Drops the frames that were consumed, the one just opened in place
 * among them, from the front of the receive buffer. */
static void compact_rbuf(st__conn_t* c, size_t off) {
  if (off > 0 && c->rbuf != NULL) {
    memmove(c->rbuf, c->rbuf + off, c->rlen - off);
    c->rlen -= off;
  }
}

static void open_after(uv_work_t* req, int status) {
  job_t* j = req->data;
  st__conn_t* c = j->c;
  st__daemon_t* d = c->d;
  c->jobs--;
  c->rx_busy = false;
  compact_rbuf(c, c->rx_hold);
  c->rx_hold = 0;
  for (int i = 0; i < ST_CRYPTO_DROP_COUNT; i++)
    d->cc.drops[i] += j->cc.drops[i];
  int rc = status != 0 ? status : j->rc;
  bool live = !c->closing && !uv_is_closing((uv_handle_t*) &c->tcp);
  if (live && rc == 0 && c->ops != NULL)
    c->ops->on_frame(c, j->out, j->out_len);
  free(j->out);
  free(j);
  if (!live) {
    maybe_free(c);
    return;
  }
  if (rc != 0 || (!c->closing && process(c) != 0)) {
    conn_abort(c);
    return;
  }
  if (c->eof && !c->rx_busy && !c->paused) {
    conn_abort(c);
    return;
  }
  if (!c->rx_busy && !c->closing && !c->paused && !c->eof)
    uv_read_start((uv_stream_t*) &c->tcp, alloc_cb, read_cb);
}

/* Opens one received frame on the pool, reading it where it lies in rbuf
 * (ct): reading pauses until it is done, and process_frames leaves rbuf
 * as it is meanwhile (rx_hold). */
static int open_offloaded(st__conn_t* c, const uint8_t* ct, size_t ct_len) {
  job_t* j = calloc(1, sizeof(*j));
  uint8_t* out = malloc(ct_len);
  if (j == NULL || out == NULL) {
    free(j);
    free(out);
    return -ENOMEM;
  }
  j->c = c;
  j->in = (uint8_t*) ct;
  j->in_len = ct_len;
  j->out = out;
  j->work.data = j;
  c->rx_busy = true;
  c->jobs++;
  uv_read_stop((uv_stream_t*) &c->tcp);
  int rc = uv_queue_work(&c->d->loop, &j->work, open_work, open_after);
  if (rc != 0) {
    c->jobs--;
    c->rx_busy = false;
    free(out);
    free(j);
  }
  return rc;
}

size_t st__offload_bytes(void) {
  static size_t bytes;
  if (bytes == 0)
    bytes = uv_available_parallelism() >= 4 ? 64u * 1024u : 512u * 1024u;
  return bytes;
}

static int seal_and_write(st__conn_t* c, const uint8_t* msg, size_t len,
                          bool xchg_ack);

int st__conn_send(st__conn_t* c, const uint8_t* msg, size_t len,
                  bool xchg_ack) {
  if (c->closing || c->phase < P_HEADER)
    return -EPIPE;
  if (len >= st__offload_bytes() || c->tx_busy || c->txq_head != NULL)
    return send_offloaded(c, msg, NULL, len, xchg_ack);
  return seal_and_write(c, msg, len, xchg_ack);
}

int st__conn_send_taken(st__conn_t* c, uint8_t* msg, size_t len,
                        bool xchg_ack) {
  if (c->closing || c->phase < P_HEADER) {
    free(msg);
    return -EPIPE;
  }
  if (len >= st__offload_bytes() || c->tx_busy || c->txq_head != NULL)
    return send_offloaded(c, msg, msg, len, xchg_ack);
  int rc = seal_and_write(c, msg, len, xchg_ack);
  free(msg);
  return rc;
}

/* Seals msg into a frame here, on the loop, and writes it. */
static int seal_and_write(st__conn_t* c, const uint8_t* msg, size_t len,
                          bool xchg_ack) {
  size_t cap = len + ST_STREAM_ABYTES + ST_FRAME_LENGTH_BYTES;
  wreq_t* w = malloc(sizeof(*w) + cap);
  if (w == NULL)
    return -ENOMEM;
  int rc = st_stream_seal_frame(&c->tx, msg, len, false, w->data, cap, &w->len);
  if (rc != 0) {
    free(w);
    return rc;
  }
  return write_raw(c, w, xchg_ack);
}

static int dispatch(st__conn_t* c, const uint8_t* msg, size_t len) {
  if (c->ops == NULL) {
    int rc = st__conn_learn_purpose(c, msg, len);
    if (rc != 0)
      return rc;
  }
  c->ops->on_frame(c, msg, len);
  return 0;
}

/* ---- The session: gossip/session.c's bytes on this connection ---------- */

/* Writes what the framer queued (handshake frames, our stream header). */
static int flush_session(st__conn_t* c) {
  size_t len = 0;
  const uint8_t* out = st_session_framer_output(&c->sf, &len);
  if (len == 0)
    return 0;
  wreq_t* w = malloc(sizeof(*w) + len);
  if (w == NULL)
    return -ENOMEM;
  memcpy(w->data, out, len);
  w->len = len;
  st_session_framer_sent(&c->sf, len);
  return write_raw(c, w, false);
}

/* The session is up on our side (our stream header is on its way): the
 * dialler says its first thing. */
static int session_up(st__conn_t* c) {
  c->peer = c->sf.peer;
  st__net_heard(c->d, &c->peer);
  c->phase = P_HEADER;
  if (c->preauth) {
    /* A member now: a deadline shortened under pressure still leaves it
     * time for its first message. */
    preauth_end(c);
    uint64_t least = st__dnow(c->d) + ST__PREAUTH_SHORT_DEADLINE_MS;
    if (c->deadline_ms < least)
      c->deadline_ms = least;
  }
  if (c->initiator && c->ops != NULL && c->ops->on_open != NULL)
    return c->ops->on_open(c);
  return 0;
}

/* Feeds the framer one unit's worth of received bytes; *used gets what it
 * took. What it queued is written first, even before a refusal (the HS3
 * that precedes a wrong peer's drop). */
static int session_step(st__conn_t* c, const uint8_t* p, size_t avail,
                        size_t* used) {
  int rc = st_session_framer_feed(&c->sf, p, avail, used);
  int wrc = flush_session(c);
  if (rc != 0) {
    if (c->sf.drop == ST_SESSION_DROP_WRONG_PEER) {
      c->peer = c->sf.peer;
      c->d->c.peer_mismatch++;
    }
    return rc;
  }
  if (wrc != 0)
    return wrc;
  if (c->sf.phase == ST_SESSION_KEYED && c->phase == P_HANDSHAKE)
    return session_up(c);
  if (c->sf.phase == ST_SESSION_OPEN)
    c->phase = P_OPEN;
  return 0;
}

/* ---- Receiving ------------------------------------------------------------
 */

/* One encrypted frame, if whole: opened here and dispatched, or (a large
 * one of a purpose that offloads) handed to the pool, which stops this
 * pass (*stop). */
static int open_step(st__conn_t* c, const uint8_t* p, size_t avail,
                     size_t* used, bool* stop) {
  st__daemon_t* d = c->d;
  *used = 0;
  *stop = true;
  if (avail < ST_FRAME_LENGTH_BYTES)
    return 0;
  size_t ct_len = 0;
  int rc = st_frame_length(p, ST_FRAME_MAX_DEFAULT, &d->cc, &ct_len);
  if (rc != 0 || avail < ST_FRAME_LENGTH_BYTES + ct_len)
    return rc;
  const uint8_t* ct = p + ST_FRAME_LENGTH_BYTES;
  *used = ST_FRAME_LENGTH_BYTES + ct_len;
  if (ct_len >= st__offload_bytes() && c->ops != NULL && c->ops->offload_rx)
    return open_offloaded(c, ct, ct_len);
  if (d->rx_plain == NULL &&
      (d->rx_plain = malloc(ST_FRAME_MAX_DEFAULT)) == NULL)
    return -ENOMEM;
  *stop = false;
  size_t plain_len = 0;
  bool final = false;
  rc = st_stream_open_frame(&c->rx, &d->cc, ct, ct_len, d->rx_plain,
                            ST_FRAME_MAX_DEFAULT, &plain_len, &final);
  if (rc == 0)
    rc = dispatch(c, d->rx_plain, plain_len);
  return rc;
}

static int process_frames(st__conn_t* c);

/* Consumes whole frames from the receive buffer. Returns < 0 to abort.
 * Not re-entered: a handler that resumes reading lets this loop go on. */
static int process(st__conn_t* c) {
  c->in_process = true;
  int rc = process_frames(c);
  c->in_process = false;
  return rc;
}

static int process_frames(st__conn_t* c) {
  size_t off = 0;
  int rc = 0;
  while (rc == 0 && !c->closing && !c->rx_busy && !c->paused && off < c->rlen) {
    const uint8_t* p = c->rbuf + off;
    size_t avail = c->rlen - off, used = 0;
    bool stop = false;
    if (c->phase == P_HANDSHAKE || c->phase == P_HEADER) {
      rc = session_step(c, p, avail, &used);
      stop = used == 0;
    } else if (c->phase == P_OPEN) {
      rc = open_step(c, p, avail, &used, &stop);
    } else {
      stop = true;
    }
    off += used;
    if (stop)
      break;
  }
  if (c->rx_busy && c->rx_hold == 0)
    c->rx_hold = off; /* a frame up to off is being opened in place */
  else
    compact_rbuf(c, off);
  return rc;
}

static void alloc_cb(uv_handle_t* h, size_t suggested, uv_buf_t* buf) {
  st__conn_t* c = h->data;
  (void) suggested;
  size_t want = c->rlen + 65536;
  if (want > RBUF_MAX)
    want = RBUF_MAX;
  if (want > c->rcap) {
    uint8_t* p = realloc(c->rbuf, want);
    if (p != NULL) {
      c->rbuf = p;
      c->rcap = want;
    }
  }
  if (c->rbuf == NULL || c->rlen >= c->rcap) {
    *buf = uv_buf_init(NULL, 0);
    return;
  }
  *buf = uv_buf_init((char*) c->rbuf + c->rlen, (unsigned) (c->rcap - c->rlen));
}

static void read_cb(uv_stream_t* s, ssize_t nread, const uv_buf_t* buf) {
  st__conn_t* c = s->data;
  (void) buf;
  if (nread == UV_ENOBUFS) {
    conn_abort(c);
    return;
  }
  if (nread < 0 && (c->rx_busy || c->paused)) {
    /* Frames received before the end are still being opened or wait for
     * the ring driver: the end counts once they are through. */
    c->eof = true;
    uv_read_stop(s);
    return;
  }
  if (nread < 0) {
    if (c->phase == P_OPEN && c->ops != NULL && c->ops->count_truncated &&
        !c->closing && c->initiator)
      c->d->cc.drops[ST_DROP_STREAM_TRUNCATED]++;
    conn_abort(c);
    return;
  }
  if (nread == 0)
    return;
  c->rlen += (size_t) nread;
  c->d->c.bytes_in += (uint64_t) nread;
  if (process(c) != 0)
    conn_abort(c);
}

/* The acceptor's framer asks before answering an HS1 that passed its MAC
 * (st_session_admit_fn): a token of the bucket of cfg->handshake_rate,
 * refilled at that many a second, or a refusal, counted. A member's
 * refused dial fails like any other and is retried with backoff. */
static bool admit_hs1(void* arg) {
  st__daemon_t* d = arg;
  double rate = (double) d->cfg->handshake_rate;
  if (rate <= 0)
    return true;
  uint64_t now = st__dnow(d);
  if (d->hs_token_ms == 0)
    d->hs_tokens = rate; /* the first: a full bucket */
  else if (now > d->hs_token_ms)
    d->hs_tokens += (double) (now - d->hs_token_ms) * rate / 1000.0;
  if (d->hs_tokens > rate)
    d->hs_tokens = rate;
  d->hs_token_ms = now;
  if (d->hs_tokens < 1.0) {
    d->c.hs_busy++;
    return false;
  }
  d->hs_tokens -= 1.0;
  return true;
}

static st__conn_t* conn_new(st__daemon_t* d, bool initiator,
                            const st_node_id_t* expected) {
  if (d->n_conns - d->n_released >= ST__MAX_CONNS) {
    d->c.conns_refused++;
    return NULL;
  }
  st__conn_t* c = calloc(1, sizeof(*c));
  if (c == NULL)
    return NULL;
  c->d = d;
  c->id = ++d->next_conn_id;
  c->initiator = initiator;
  c->deadline_ms = st__dnow(d) + ST__HANDSHAKE_DEADLINE_MS;
  c->started_us = uv_hrtime() / 1000u;
  uv_tcp_init(&d->loop, &c->tcp);
  uv_tcp_nodelay(&c->tcp, 1);
  c->tcp.data = c;
  c->next = d->conns;
  d->conns = c;
  d->n_conns++;
  /* A framer that fails here (the dialler's HS1) is dropped at connect. */
  st_session_framer_init(&c->sf, initiator, &d->ident, &d->keys, d->allow,
                         expected, &c->tx, &c->rx, &d->cc, &d->wc);
  if (!initiator) {
    c->sf.admit = admit_hs1;
    c->sf.admit_arg = d;
  }
  return c;
}

/* Node-to-node sockets: the kernel ends a connection whose writes go
 * unacknowledged, or meet a closed window, for ST__TCP_USER_TIMEOUT_MS. */
static void set_user_timeout(st__conn_t* c) {
#ifdef TCP_USER_TIMEOUT
  uv_os_fd_t fd;
  unsigned int ms = ST__TCP_USER_TIMEOUT_MS;
  if (uv_fileno((uv_handle_t*) &c->tcp, &fd) == 0)
    (void) setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof(ms));
#else
  (void) c;
#endif
}

static void connect_cb(uv_connect_t* req, int status) {
  st__conn_t* c = req->data;
  free(req);
  if (status != 0) {
    notify_closed(c);
    c->closing = true;
    if (!uv_is_closing((uv_handle_t*) &c->tcp))
      uv_close((uv_handle_t*) &c->tcp, close_cb);
    return;
  }
  c->phase = P_HANDSHAKE;
  set_user_timeout(c);
  if (c->sf.phase == ST_SESSION_FAILED || flush_session(c) != 0 ||
      uv_read_start((uv_stream_t*) &c->tcp, alloc_cb, read_cb) != 0) {
    conn_abort(c);
  }
}

st__conn_t* st__conn_dial(st__daemon_t* d, const st_wire_addr_t* addr,
                          const st_node_id_t* expected,
                          st__conn_purpose_t purpose) {
  st__conn_t* c = conn_new(d, true, expected);
  if (c == NULL)
    return NULL;
  c->ops = st__conn_ops_of(purpose);
  c->peer_addr = *addr;
  c->deadline_ms = st__dnow(d) + c->ops->dial_deadline_ms;
  uv_connect_t* req = malloc(sizeof(*req));
  struct sockaddr_storage ss;
  st__addr_to_sockaddr(addr, &ss);
  if (req == NULL) {
    c->closing = true;
    uv_close((uv_handle_t*) &c->tcp, close_cb);
    return NULL;
  }
  req->data = c;
  c->phase = P_CONNECTING;
  if (uv_tcp_connect(req, &c->tcp, (const struct sockaddr*) &ss, connect_cb) !=
      0) {
    free(req);
    c->closing = true;
    uv_close((uv_handle_t*) &c->tcp, close_cb);
    return NULL;
  }
  return c;
}

/* ---- Admission ----------------------------------------------------------
 */

/* How many leading bytes of an address name its source: an IPv4 address
 * (also mapped into IPv6), or an IPv6 /64, which is what one subscriber
 * or host is given. */
static size_t source_bytes(const st_wire_addr_t* a) {
  static const uint8_t v4_mapped[12] = {0, 0, 0, 0, 0,    0,
                                        0, 0, 0, 0, 0xff, 0xff};
  if (a->ip_len == 16 && memcmp(a->ip, v4_mapped, sizeof(v4_mapped)) != 0)
    return 8;
  return a->ip_len;
}

/* The live pre-auth connections from a's source. */
static size_t preauth_from(const st__daemon_t* d, const st_wire_addr_t* a) {
  size_t n = 0, len = source_bytes(a);
  for (const st__conn_t* c = d->conns; c != NULL; c = c->next)
    if (c->preauth && c->peer_addr.ip_len == a->ip_len &&
        memcmp(c->peer_addr.ip, a->ip, len) == 0)
      n++;
  return n;
}

/* Closes a pre-auth connection that admission refuses or evicts. It no
 * longer counts against the table: no pool job or trainer request holds
 * it, so it is freed when its close callback runs, at the end of this
 * loop iteration. */
static void release(st__conn_t* c) {
  if (!c->released) {
    c->released = true;
    c->d->n_released++;
  }
  conn_reset(c);
}

/* Evicts the oldest live pre-auth connection (ids grow with age); false
 * when there is none. */
static bool evict_oldest(st__daemon_t* d) {
  st__conn_t* old = NULL;
  for (st__conn_t* c = d->conns; c != NULL; c = c->next)
    if (c->preauth && (old == NULL || c->id < old->id))
      old = c;
  if (old == NULL)
    return false;
  d->c.conns_evicted++;
  release(old);
  return true;
}

/* Admits an accepted connection whose address is known, as pre-auth;
 * false when it is refused (and closed). */
static bool admit(st__conn_t* c) {
  st__daemon_t* d = c->d;
  if (preauth_from(d, &c->peer_addr) >= ST__PREAUTH_PER_ADDR) {
    d->c.conns_per_addr++;
    release(c);
    return false;
  }
  if (d->n_preauth >= ST__PREAUTH_MAX)
    evict_oldest(d);
  if (d->n_preauth >= ST__PREAUTH_PRESSURE)
    c->deadline_ms = st__dnow(d) + ST__PREAUTH_SHORT_DEADLINE_MS;
  c->preauth = true;
  d->n_preauth++;
  return true;
}

/* Accepts and closes at once, so that the backlog does not fill. */
static void accept_and_drop(st__daemon_t* d, uv_stream_t* server) {
  uv_tcp_t* t = malloc(sizeof(*t));
  if (t == NULL)
    return;
  uv_tcp_init(&d->loop, t);
  (void) uv_accept(server, (uv_stream_t*) t);
  uv_close((uv_handle_t*) t, (uv_close_cb) free);
}

static void accept_cb(uv_stream_t* server, int status) {
  st__daemon_t* d = server->data;
  if (status != 0)
    return;
  /* A full table makes room at the expense of the oldest pre-auth one:
   * authenticated connections and our own dials keep theirs. */
  if (d->n_conns - d->n_released >= ST__MAX_CONNS)
    evict_oldest(d);
  st__conn_t* c = conn_new(d, false, NULL);
  if (c == NULL) {
    accept_and_drop(d, server);
    return;
  }
  if (uv_accept(server, (uv_stream_t*) &c->tcp) != 0) {
    conn_abort(c);
    return;
  }
  struct sockaddr_storage ss;
  int len = sizeof(ss);
  if (uv_tcp_getpeername(&c->tcp, (struct sockaddr*) &ss, &len) == 0)
    st__addr_from_sockaddr((struct sockaddr*) &ss, &c->peer_addr);
  if (!admit(c))
    return;
  set_user_timeout(c);
  c->phase = P_HANDSHAKE;
  if (uv_read_start((uv_stream_t*) &c->tcp, alloc_cb, read_cb) != 0)
    conn_abort(c);
}

int st__conn_listen(st__daemon_t* d, char* err, size_t err_len) {
  struct sockaddr_storage ss;
  st__addr_to_sockaddr(&d->self_addr, &ss);
  int rc = uv_tcp_init(&d->loop, &d->listener);
  d->listener.data = d;
  if (rc == 0)
    rc = uv_tcp_bind(&d->listener, (const struct sockaddr*) &ss, 0);
  if (rc == 0)
    rc = uv_listen((uv_stream_t*) &d->listener, 128, accept_cb);
  if (rc == 0 && d->self_addr.port == 0) {
    /* The OS picked the port: it is the node's, for UDP and for gossip. */
    struct sockaddr_storage got;
    int len = sizeof(got);
    uv_tcp_getsockname(&d->listener, (struct sockaddr*) &got, &len);
    st__addr_from_sockaddr((struct sockaddr*) &got, &d->self_addr);
    st__addr_format(&d->self_addr, d->self_addr_text,
                    sizeof(d->self_addr_text));
  }
  if (rc != 0) {
    snprintf(err, err_len, "cannot listen on TCP %s: %s; %s", d->self_addr_text,
             uv_strerror(rc),
             rc == UV_EADDRNOTAVAIL
                 ? "this machine has no such address: give one of its own "
                   "with --listen"
                 : "is another program using that port? pick another with "
                   "--listen");
    return rc;
  }
  return 0;
}

void st__conn_sweep(st__daemon_t* d) {
  uint64_t now = st__dnow(d);
  st__conn_t* next;
  for (st__conn_t* c = d->conns; c != NULL; c = next) {
    next = c->next;
    if (c->handle_closed || uv_is_closing((uv_handle_t*) &c->tcp))
      continue;
    if (c->closing) {
      /* Its last frames wait for a peer that does not read them (its
       * purpose's own timeout no longer applies: it is done). */
      if (now >= c->close_deadline_ms) {
        d->c.conns_close_timeout++;
        conn_reset(c);
      }
      continue;
    }
    if (c->ops != NULL && c->ops->owns_deadline != NULL &&
        c->ops->owns_deadline(c))
      continue;
    if (now >= c->deadline_ms) {
      if (c->preauth)
        d->c.conns_hs_timeout++;
      conn_reset(c);
    }
  }
}
