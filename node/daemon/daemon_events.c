/* daemon_events.c: the node's events for `starling monitor`, like `serf
 * monitor`: members that join, are suspected, die or leave; averaging
 * exchanges and their failures; ring rounds; packets, handshakes and
 * connections refused.
 *
 * The daemon reports each event with st__event at the place where it logs
 * it (daemon_net.c, daemon_xchg.c, daemon_ring.c); refusals are counted in
 * many places, so st__events_tick (once a second, from the status timer)
 * reports what the refusal counters gained, by reason. The last
 * EVENTS_KEPT events stay in a ring buffer. A control client that sends
 * "monitor" (or "monitor json") is handed over here: it gets the events
 * kept, oldest first, then each new one as it happens, one line each (or
 * one JSON object a line), until it hangs up or the node stops.
 *
 * A monitor that reads too slowly never holds the node up: while more than
 * SUB_QUEUE_MAX_BYTES wait in its socket, its events are dropped and
 * counted, and one line says how many before the next event it gets.
 */
#include "node/daemon/daemon_internal.h"
#include "base/base.h"

#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* A few minutes of a busy node (about five exchanges a second), in about
 * 60 KiB. */
#define EVENTS_KEPT 256
/* Monitors are people and scripts watching one node: a handful. */
#define SUBS_MAX 8
/* About 300 events' lines: a monitor this far behind is not reading. */
#define SUB_QUEUE_MAX_BYTES (64u * 1024u)

typedef struct {
  uint64_t seq;  /* 1, 2, ...: a gap tells a reader events were lost */
  double time_s; /* Unix time */
  char type[12]; /* member, exchange, ring, rejected */
  char message[200];
} event_t;

typedef struct sub_s {
  uv_pipe_t pipe;
  struct st__events_s* ev;
  struct sub_s* next;
  bool json;
  uint64_t dropped; /* events not sent since the last line sent */
} sub_t;

typedef struct {
  uv_write_t req;
  sub_t* sub;
  st_json_buf_t buf;
} swrite_t;

struct st__events_s {
  st__daemon_t* d;
  event_t kept[EVENTS_KEPT]; /* a ring: the newest at (next_seq - 1) */
  uint64_t next_seq;
  sub_t* subs;
  size_t n_subs;
  uint64_t last_drops[ST_CRYPTO_DROP_COUNT + ST_WIRE_DROP_COUNT];
  uint64_t last_conns_refused;
};

static struct st__events_s* events_of(st__daemon_t* d) {
  if (d->events == NULL) {
    d->events = calloc(1, sizeof(*d->events));
    if (d->events != NULL) {
      d->events->d = d;
      d->events->next_seq = 1;
    }
  }
  return d->events;
}

/* ---- One event as a line ---------------------------------------------------
 */

static void format_event(const event_t* e, bool json, st_json_buf_t* b) {
  char line[64];
  if (json) {
    snprintf(line, sizeof(line), "{\"seq\":%llu,\"time\":%.3f,\"type\":",
             (unsigned long long) e->seq, e->time_s);
    st_json_buf_puts(b, line);
    st_json_buf_string(b, e->type);
    st_json_buf_puts(b, ",\"message\":");
    st_json_buf_string(b, e->message);
    st_json_buf_puts(b, "}\n");
    return;
  }
  time_t secs = (time_t) e->time_s;
  struct tm tm;
  gmtime_r(&secs, &tm);
  char when[32];
  strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(line, sizeof(line), "%s.%03dZ %-8s ", when,
           (int) (fmod(e->time_s, 1.0) * 1e3), e->type);
  st_json_buf_puts(b, line);
  st_json_buf_puts(b, e->message);
  st_json_buf_puts(b, "\n");
}

/* ---- Subscribers ------------------------------------------------------------
 */

static void sub_close_cb(uv_handle_t* h) {
  free(h->data);
}

static void sub_close(sub_t* s) {
  struct st__events_s* ev = s->ev;
  for (sub_t** p = &ev->subs; *p != NULL; p = &(*p)->next) {
    if (*p == s) {
      *p = s->next;
      ev->n_subs--;
      break;
    }
  }
  if (!uv_is_closing((uv_handle_t*) &s->pipe))
    uv_close((uv_handle_t*) &s->pipe, sub_close_cb);
}

static void swrite_cb(uv_write_t* req, int status) {
  swrite_t* w = (swrite_t*) req;
  sub_t* s = w->sub;
  st_json_buf_free(&w->buf);
  free(w);
  /* ECANCELED: the handle is closing already. */
  if (status != 0 && status != UV_ECANCELED)
    sub_close(s);
}

/* Queues b's bytes (taken over) on s. */
static void sub_write(sub_t* s, st_json_buf_t* b) {
  swrite_t* w = calloc(1, sizeof(*w));
  if (w == NULL || b->failed) {
    free(w);
    st_json_buf_free(b);
    return;
  }
  w->sub = s;
  w->buf = *b;
  uv_buf_t ub = uv_buf_init(w->buf.p, (unsigned) w->buf.len);
  if (uv_write(&w->req, (uv_stream_t*) &s->pipe, &ub, 1, swrite_cb) != 0) {
    st_json_buf_free(&w->buf);
    free(w);
    sub_close(s);
  }
}

/* Sends e to s, or counts it dropped while s is too far behind. */
static void sub_send(sub_t* s, const event_t* e) {
  if (uv_stream_get_write_queue_size((uv_stream_t*) &s->pipe) >
      SUB_QUEUE_MAX_BYTES) {
    s->dropped++;
    return;
  }
  st_json_buf_t b;
  st_json_buf_init(&b);
  if (s->dropped > 0) {
    event_t note = *e;
    snprintf(note.type, sizeof(note.type), "dropped");
    snprintf(note.message, sizeof(note.message),
             "%llu events not sent: this monitor reads too slowly",
             (unsigned long long) s->dropped);
    format_event(&note, s->json, &b);
    s->dropped = 0;
  }
  format_event(e, s->json, &b);
  sub_write(s, &b);
}

static void sub_alloc(uv_handle_t* h, size_t size, uv_buf_t* buf) {
  static char sink[256]; /* what a monitor sends is read and ignored */
  (void) h;
  (void) size;
  *buf = uv_buf_init(sink, sizeof(sink));
}

static void sub_read(uv_stream_t* st, ssize_t n, const uv_buf_t* buf) {
  (void) buf;
  if (n < 0) /* it hung up */
    sub_close(st->data);
}

/* Writes one line on a socket that is not ours to keep (the refusal). */
static void say(int fd, const char* line) {
  (void) !send(fd, line, strlen(line), MSG_NOSIGNAL | MSG_DONTWAIT);
}

void st__events_takeover(st__daemon_t* d, int fd, bool json) {
  int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0)
    return;
  struct st__events_s* ev = events_of(d);
  const char* why = NULL;
  if (ev == NULL)
    why = "error: out of memory\n";
  else if (ev->n_subs >= SUBS_MAX)
    why = "error: too many monitors on this node (8); stop one first\n";
  sub_t* s = why == NULL ? calloc(1, sizeof(*s)) : NULL;
  if (why == NULL && s == NULL)
    why = "error: out of memory\n";
  if (why == NULL && (uv_pipe_init(&d->loop, &s->pipe, 0) != 0 ||
                      uv_pipe_open(&s->pipe, own) != 0)) {
    free(s);
    why = "error: the node cannot watch the connection\n";
  }
  if (why != NULL) {
    say(own, why);
    close(own);
    return;
  }
  s->ev = ev;
  s->json = json;
  s->pipe.data = s;
  s->next = ev->subs;
  ev->subs = s;
  ev->n_subs++;
  /* The events kept, oldest first. */
  uint64_t first = ev->next_seq > EVENTS_KEPT ? ev->next_seq - EVENTS_KEPT : 1;
  for (uint64_t q = first; q < ev->next_seq; q++)
    sub_send(s, &ev->kept[q % EVENTS_KEPT]);
  if (uv_read_start((uv_stream_t*) &s->pipe, sub_alloc, sub_read) != 0)
    sub_close(s);
}

/* ---- Events -----------------------------------------------------------------
 */

void st__event(st__daemon_t* d, const char* type, const char* fmt, ...) {
  struct st__events_s* ev = events_of(d);
  if (ev == NULL)
    return;
  event_t* e = &ev->kept[ev->next_seq % EVENTS_KEPT];
  e->seq = ev->next_seq++;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  e->time_s = (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
  snprintf(e->type, sizeof(e->type), "%s", type);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->message, sizeof(e->message), fmt, ap);
  va_end(ap);
  sub_t* next;
  for (sub_t* s = ev->subs; s != NULL; s = next) {
    next = s->next; /* a failed write closes s */
    sub_send(s, e);
  }
}

/* Appends "N reason" for each counter that grew to b; the count of them. */
static int drops_gained(const uint64_t* now, uint64_t* last, int n,
                        const char* (*name)(int), char* b, size_t len) {
  int found = 0;
  for (int i = 0; i < n; i++) {
    if (now[i] <= last[i])
      continue;
    size_t at = strlen(b);
    snprintf(b + at, len - at, "%s%llu %s", at > 0 ? ", " : "",
             (unsigned long long) (now[i] - last[i]), name(i));
    last[i] = now[i];
    found++;
  }
  return found;
}

static const char* crypto_name(int i) {
  return st_crypto_drop_name((st_crypto_drop_t) i);
}

static const char* wire_name(int i) {
  return st_wire_drop_name((st_wire_drop_t) i);
}

void st__events_tick(st__daemon_t* d) {
  struct st__events_s* ev = events_of(d);
  if (ev == NULL)
    return;
  uint64_t wire[ST_WIRE_DROP_COUNT];
  const st_wire_counters_t* mw =
      d->m != NULL ? st_membership_counters(d->m) : NULL;
  for (int i = 0; i < ST_WIRE_DROP_COUNT; i++)
    wire[i] = d->wc.drops[i] + (mw != NULL ? mw->drops[i] : 0);
  char what[180] = "";
  int n = drops_gained(d->cc.drops, ev->last_drops, ST_CRYPTO_DROP_COUNT,
                       crypto_name, what, sizeof(what));
  n += drops_gained(wire, ev->last_drops + ST_CRYPTO_DROP_COUNT,
                    ST_WIRE_DROP_COUNT, wire_name, what, sizeof(what));
  uint64_t conns = d->c.conns_refused + d->c.conns_per_addr;
  if (conns > ev->last_conns_refused) {
    size_t at = strlen(what);
    snprintf(what + at, sizeof(what) - at, "%s%llu connections_over_limit",
             at > 0 ? ", " : "",
             (unsigned long long) (conns - ev->last_conns_refused));
    ev->last_conns_refused = conns;
    n++;
  }
  if (n > 0)
    st__event(d, "rejected", "refused %s (status --json has every reason)",
              what);
}

void st__events_close(st__daemon_t* d) {
  if (d->events == NULL)
    return;
  while (d->events->subs != NULL)
    sub_close(d->events->subs);
}

void st__events_free(st__daemon_t* d) {
  free(d->events);
  d->events = NULL;
}
