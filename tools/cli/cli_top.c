/* cli_top.c: `starling top`, a live view of the whole cluster from one
 * node, like top(1): a header for the node and one row per member (id,
 * address, state, step, loss, test accuracy, samples/s, exchanges/s,
 * bytes/s), refreshed every --interval seconds.
 *
 * It reads only what the node already serves on its control socket
 * (node/daemon/daemon_control.c): `status json` (this node's counters) and
 * `peers json` (every member, with the status record each one gossips:
 * step, loss, accuracy, samples/s). Rates come from two successive
 * snapshots: exchanges/s of this node from its exchanges_ok, of another
 * member from `averaged` (the averaging exchanges with it that this node
 * applied); bytes/s only for this node (in + out), the one whose traffic
 * is known. Both documents are parsed with base/'s st_json_parse_inexact.
 *
 * On a terminal the view redraws in place on the alternate screen (plain
 * ANSI escapes, no curses) and q, Ctrl-C or SIGTERM end it, the terminal
 * restored. When stdout is not a terminal, or with --once or --count, each
 * refresh is one block of plain lines (with --json, one JSON object on one
 * line).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include "base/base.h"
#include "tools/cli/cli.h"

/* A refresh costs the node two short documents; ten a second is plenty
 * for a person and an hour is the longest wait that still looks alive. */
#define INTERVAL_MIN_S 0.1
#define INTERVAL_MAX_S 3600.0
/* Bounds for the parser: peers --json is an array of flat objects of
 * about 15 values, so a million values is some 60000 members. */
#define DOC_MAX_DEPTH 4
#define DOC_MAX_VALUES ((size_t) 1 << 20)

typedef struct {
  char id[33];
  char address[64];
  char state[16]; /* alive, suspect, dead, left */
  bool self;
  uint64_t step;
  double loss, accuracy, samples_per_sec; /* NAN: none yet */
  double last_heard_s;                    /* NAN: never */
  uint64_t averaged; /* averaging exchanges with it this node applied */
} member_t;

typedef struct {
  double t; /* st_now_s() when status was read */
  char id[33], address[64], state[16], model[96];
  double uptime_s;
  uint64_t exchanges_ok, ring_rounds_ok, bytes_in, bytes_out;
  member_t* members; /* owned; self first, then by id */
  size_t n;
} snap_t;

typedef struct {
  const char* dir;
  const char* control;
  double interval_s;
  uint64_t count; /* refreshes to show; 0: until q or a signal */
  bool json;
  bool once;
} opts_t;

/* ==== Reading a snapshot ================================================= */

/* Copies a string member of obj into out, characters a terminal would act
 * on replaced by '?'; "?" when the member is missing or not a string. */
static void str_of(const st_json_t* obj, const char* key, char* out, size_t n) {
  const st_json_t* v = st_json_get(obj, key);
  snprintf(out, n, "%s", v != NULL && v->type == ST_JSON_STRING ? v->str : "?");
  for (char* p = out; *p != '\0'; p++)
    if ((unsigned char) *p < 0x20 || *p == 0x7f)
      *p = '?';
}

/* A number member of obj; NAN when missing, null or not a number. */
static double num_of(const st_json_t* obj, const char* key) {
  const st_json_t* v = st_json_get(obj, key);
  return v != NULL && v->type == ST_JSON_NUMBER ? v->number : NAN;
}

/* A counter member of obj; 0 when missing or not a number >= 0. */
static uint64_t u64_of(const st_json_t* obj, const char* key) {
  double v = num_of(obj, key);
  return v >= 0 && v < 1.8e19 ? (uint64_t) v : 0;
}

static int parse_doc(const char* what, const char* text, size_t len,
                     st_json_type_t want, st_json_doc_t** doc, char* err,
                     size_t err_len) {
  st_json_limits_t lim = {.max_depth = DOC_MAX_DEPTH,
                          .max_values = DOC_MAX_VALUES};
  char why[128];
  /* Inexact: an incarnation (boot epoch x 2^32) passes 2^53. */
  if (st_json_parse_inexact(text, len, &lim, doc, why, sizeof(why)) != 0) {
    snprintf(err, err_len,
             "starling top: cannot read the node's answer to '%s': %s\n", what,
             why);
    return -1;
  }
  if (st_json_root(*doc)->type != want) {
    snprintf(err, err_len,
             "starling top: the node's answer to '%s' is not a JSON %s "
             "(it is a %s); is the node another version of starling?\n",
             what, st_json_type_name(want),
             st_json_type_name(st_json_root(*doc)->type));
    st_json_free(*doc);
    *doc = NULL;
    return -1;
  }
  return 0;
}

static void read_status(const st_json_t* o, snap_t* s) {
  str_of(o, "id", s->id, sizeof(s->id));
  str_of(o, "address", s->address, sizeof(s->address));
  str_of(o, "state", s->state, sizeof(s->state));
  str_of(o, "model", s->model, sizeof(s->model));
  s->uptime_s = num_of(o, "uptime_s");
  s->exchanges_ok = u64_of(o, "exchanges_ok");
  s->ring_rounds_ok = u64_of(o, "ring_rounds_ok");
  s->bytes_in = u64_of(o, "bytes_in");
  s->bytes_out = u64_of(o, "bytes_out");
}

/* One member from its peers --json object; this node's figures come from
 * its status (fresher than its own gossiped record). */
static void read_member(const st_json_t* o, const st_json_t* status,
                        member_t* m) {
  str_of(o, "id", m->id, sizeof(m->id));
  str_of(o, "address", m->address, sizeof(m->address));
  str_of(o, "state", m->state, sizeof(m->state));
  const st_json_t* self = st_json_get(o, "self");
  m->self = self != NULL && self->type == ST_JSON_BOOL && self->boolean;
  const st_json_t* src = m->self ? status : o;
  m->step = u64_of(src, "step");
  m->loss = num_of(src, "loss");
  m->accuracy = num_of(src, "test_accuracy");
  m->samples_per_sec = num_of(src, "samples_per_sec");
  m->last_heard_s = num_of(o, "last_heard_s");
  m->averaged = u64_of(o, "averaged");
}

static int member_order(const void* a, const void* b) {
  const member_t* x = a;
  const member_t* y = b;
  if (x->self != y->self)
    return x->self ? -1 : 1;
  return strcmp(x->id, y->id);
}

static void snap_free(snap_t* s) {
  free(s->members);
  memset(s, 0, sizeof(*s));
}

/* Fills s from the node's two documents. 0, or -1 with the message. */
static int read_snapshot(const char* status, size_t status_len,
                         const char* peers, size_t peers_len, snap_t* s,
                         char* err, size_t err_len) {
  st_json_doc_t* sd = NULL;
  st_json_doc_t* pd = NULL;
  int rc = parse_doc("status json", status, status_len, ST_JSON_OBJECT, &sd,
                     err, err_len);
  if (rc == 0)
    rc = parse_doc("peers json", peers, peers_len, ST_JSON_ARRAY, &pd, err,
                   err_len);
  if (rc == 0) {
    const st_json_t* so = st_json_root(sd);
    const st_json_t* pa = st_json_root(pd);
    read_status(so, s);
    s->members = calloc(pa->count > 0 ? pa->count : 1, sizeof(member_t));
    if (s->members == NULL) {
      snprintf(err, err_len, "starling top: out of memory\n");
      rc = -1;
    }
    for (const st_json_t* m = rc == 0 ? pa->child : NULL; m != NULL;
         m = m->next)
      if (m->type == ST_JSON_OBJECT)
        read_member(m, so, &s->members[s->n++]);
    if (rc == 0)
      qsort(s->members, s->n, sizeof(member_t), member_order);
  }
  if (sd != NULL)
    st_json_free(sd);
  if (pd != NULL)
    st_json_free(pd);
  return rc;
}

/* Asks the node for both documents. 0; -2 (a bad --control path) or -1 (no
 * node, no answer, a bad answer) with the message in err. */
static int take_snapshot(const opts_t* o, snap_t* s, char* err,
                         size_t err_len) {
  char* status = NULL;
  char* peers = NULL;
  size_t status_len = 0, peers_len = 0;
  memset(s, 0, sizeof(*s));
  int rc = st__control_ask("top", o->dir, o->control, "status json\n", &status,
                           &status_len, err, err_len);
  s->t = st_now_s();
  if (rc == 0)
    rc = st__control_ask("top", o->dir, o->control, "peers json\n", &peers,
                         &peers_len, err, err_len);
  if (rc == 0)
    rc = read_snapshot(status, status_len, peers, peers_len, s, err, err_len);
  free(status);
  free(peers);
  if (rc != 0)
    snap_free(s);
  return rc;
}

/* ==== Rates ============================================================== */

/* Per second over dt; NAN without a previous figure or when the counter
 * went back (the node restarted behind the same socket). */
static double rate(uint64_t now, uint64_t then, double dt) {
  if (!(dt > 0) || now < then)
    return NAN;
  return (double) (now - then) / dt;
}

typedef struct {
  double dt; /* seconds between the snapshots; NAN without a previous one */
  double exchanges, rings, bytes_in, bytes_out; /* of this node, per s */
} node_rates_t;

static node_rates_t node_rates(const snap_t* cur, const snap_t* prev) {
  node_rates_t r = {NAN, NAN, NAN, NAN, NAN};
  if (prev == NULL)
    return r;
  r.dt = cur->t - prev->t;
  r.exchanges = rate(cur->exchanges_ok, prev->exchanges_ok, r.dt);
  r.rings = rate(cur->ring_rounds_ok, prev->ring_rounds_ok, r.dt);
  r.bytes_in = rate(cur->bytes_in, prev->bytes_in, r.dt);
  r.bytes_out = rate(cur->bytes_out, prev->bytes_out, r.dt);
  return r;
}

/* Exchanges/s with member m (this node's own row: all of its exchanges). */
static double member_exchanges(const member_t* m, const snap_t* prev,
                               const node_rates_t* r) {
  if (m->self || prev == NULL)
    return m->self ? r->exchanges : NAN;
  for (size_t i = 0; i < prev->n; i++)
    if (strcmp(prev->members[i].id, m->id) == 0)
      return rate(m->averaged, prev->members[i].averaged, r->dt);
  return NAN;
}

/* Bytes/s of member m: known for this node only (in + out). */
static double member_bytes(const member_t* m, const node_rates_t* r) {
  return m->self ? r->bytes_in + r->bytes_out : NAN;
}

/* ==== Rendering ========================================================== */

typedef struct {
  char s[24];
} cell_t;

/* A figure with the given decimals, "-" for none (NAN). */
static cell_t fig(double v, int decimals) {
  cell_t c;
  if (isnan(v))
    snprintf(c.s, sizeof(c.s), "-");
  else
    snprintf(c.s, sizeof(c.s), "%.*f", decimals, v);
  return c;
}

/* Bytes with a decimal unit (1.5k, 2.3M, 4.0G), "-" for none. */
static cell_t bytes_cell(double v) {
  cell_t c;
  if (isnan(v))
    snprintf(c.s, sizeof(c.s), "-");
  else if (v < 1e3)
    snprintf(c.s, sizeof(c.s), "%.0f", v);
  else if (v < 1e6)
    snprintf(c.s, sizeof(c.s), "%.1fk", v / 1e3);
  else if (v < 1e9)
    snprintf(c.s, sizeof(c.s), "%.1fM", v / 1e6);
  else
    snprintf(c.s, sizeof(c.s), "%.1fG", v / 1e9);
  return c;
}

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void
bputf(st_json_buf_t* b, const char* fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  st_json_buf_puts(b, line);
}

/* The two header lines: this node, then the cluster and this node's
 * rates. */
static void render_header(const snap_t* s, const node_rates_t* r, bool live,
                          st_json_buf_t* b) {
  size_t alive = 0, suspect = 0, gone = 0;
  for (size_t i = 0; i < s->n; i++) {
    if (strcmp(s->members[i].state, "alive") == 0)
      alive++;
    else if (strcmp(s->members[i].state, "suspect") == 0)
      suspect++;
    else
      gone++;
  }
  bputf(b, "starling top - node %.12s at %s: %s, up %.0f s\n", s->id,
        s->address, s->state, s->uptime_s);
  bputf(b, "model %s | members %zu: %zu alive, %zu suspect, %zu gone\n",
        s->model, s->n, alive, suspect, gone);
  bputf(b, "exchanges %s/s | rings %s/s | traffic in %sB/s, out %sB/s%s\n\n",
        fig(r->exchanges, 1).s, fig(r->rings, 1).s, bytes_cell(r->bytes_in).s,
        bytes_cell(r->bytes_out).s, live ? " | q quits" : "");
}

static void render_text(const snap_t* cur, const snap_t* prev, bool live,
                        st_json_buf_t* b) {
  node_rates_t r = node_rates(cur, prev);
  render_header(cur, &r, live, b);
  /* The address last: a narrow terminal cuts it, not a figure. */
  bputf(b, "%-13s %-7s %8s %7s %6s %9s %6s %7s  %s\n", "ID", "STATE", "STEP",
        "LOSS", "ACC", "SAMPLES/S", "XCHG/S", "BYTES/S", "ADDRESS");
  for (size_t i = 0; i < cur->n; i++) {
    const member_t* m = &cur->members[i];
    bputf(b, "%.12s%s %-7s %8llu %7s %6s %9s %6s %7s  %s\n", m->id,
          m->self ? "*" : " ", m->state, (unsigned long long) m->step,
          fig(m->loss, 4).s, fig(m->accuracy, 4).s,
          fig(m->samples_per_sec, 0).s, fig(member_exchanges(m, prev, &r), 1).s,
          bytes_cell(member_bytes(m, &r)).s, m->address);
  }
  st_json_buf_puts(b, "(* this node)\n");
}

static void json_num(st_json_buf_t* b, const char* key, double v) {
  bputf(b, ",\"%s\":", key);
  if (isfinite(v))
    bputf(b, "%.6g", v);
  else
    st_json_buf_puts(b, "null");
}

static void json_str(st_json_buf_t* b, const char* key, const char* v) {
  bputf(b, ",\"%s\":", key);
  st_json_buf_string(b, v);
}

static void render_json_member(const member_t* m, const snap_t* prev,
                               const node_rates_t* r, st_json_buf_t* b) {
  st_json_buf_puts(b, "{\"id\":");
  st_json_buf_string(b, m->id);
  json_str(b, "address", m->address);
  json_str(b, "state", m->state);
  bputf(b, ",\"self\":%s,\"step\":%llu", m->self ? "true" : "false",
        (unsigned long long) m->step);
  json_num(b, "loss", m->loss);
  json_num(b, "test_accuracy", m->accuracy);
  json_num(b, "samples_per_sec", m->samples_per_sec);
  json_num(b, "exchanges_per_sec", member_exchanges(m, prev, r));
  json_num(b, "bytes_per_sec", member_bytes(m, r));
  json_num(b, "last_heard_s", m->last_heard_s);
  st_json_buf_puts(b, "}");
}

/* One object on one line: the node, its rates, and "members". */
static void render_json(const snap_t* cur, const snap_t* prev,
                        st_json_buf_t* b) {
  node_rates_t r = node_rates(cur, prev);
  st_json_buf_puts(b, "{\"node\":{\"id\":");
  st_json_buf_string(b, cur->id);
  json_str(b, "address", cur->address);
  json_str(b, "state", cur->state);
  json_str(b, "model", cur->model);
  json_num(b, "uptime_s", cur->uptime_s);
  st_json_buf_puts(b, "}");
  json_num(b, "interval_s", r.dt);
  json_num(b, "exchanges_per_sec", r.exchanges);
  json_num(b, "ring_rounds_per_sec", r.rings);
  json_num(b, "bytes_in_per_sec", r.bytes_in);
  json_num(b, "bytes_out_per_sec", r.bytes_out);
  st_json_buf_puts(b, ",\"members\":[");
  for (size_t i = 0; i < cur->n; i++) {
    if (i > 0)
      st_json_buf_puts(b, ",");
    render_json_member(&cur->members[i], prev, &r, b);
  }
  st_json_buf_puts(b, "]}\n");
}

/* ==== The terminal ======================================================= */

typedef struct {
  bool live; /* redrawing in place on the alternate screen */
  bool keys; /* stdin is a terminal in non-canonical mode: q quits */
  struct termios saved;
} term_t;

static void term_enter(term_t* t) {
  t->live = true;
  if (isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &t->saved) == 0) {
    struct termios raw = t->saved;
    /* Keys arrive one by one and are not echoed; ISIG stays, so Ctrl-C
     * is still SIGINT. */
    raw.c_lflag &= (tcflag_t) ~(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    t->keys = tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
  }
  fputs("\033[?1049h\033[?25l", stdout); /* alternate screen, no cursor */
  fflush(stdout);
}

static void term_leave(term_t* t) {
  if (!t->live)
    return;
  fputs("\033[?25h\033[?1049l", stdout); /* cursor back, main screen */
  fflush(stdout);
  if (t->keys)
    tcsetattr(STDIN_FILENO, TCSANOW, &t->saved);
  t->live = t->keys = false;
}

/* Draws text from the top left, each line cut to the terminal's width and
 * clearing what the previous frame left, as many lines as fit. */
static void draw_live(const char* text, size_t len) {
  struct winsize ws;
  size_t cols = 80, rows = 24;
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) {
    cols = ws.ws_col;
    rows = ws.ws_row > 0 ? ws.ws_row : rows;
  }
  fputs("\033[H", stdout);
  const char* end = text + len;
  for (size_t row = 0; text < end && row < rows; row++) {
    const char* nl = memchr(text, '\n', (size_t) (end - text));
    size_t n = nl != NULL ? (size_t) (nl - text) : (size_t) (end - text);
    if (row > 0)
      fputs("\n", stdout);
    fwrite(text, 1, n < cols ? n : cols, stdout);
    fputs("\033[K", stdout);
    text = nl != NULL ? nl + 1 : end;
  }
  fputs("\033[J", stdout);
  fflush(stdout);
}

/* ==== Signals and waiting ================================================ */

/* SIGINT, SIGTERM and SIGHUP set stop and wake the wait through a pipe
 * (poll cannot miss a signal that lands just before it). */
static volatile sig_atomic_t stop_flag;
static int wake_w = -1;

static void on_signal(int sig) {
  (void) sig;
  int e = errno;
  stop_flag = 1;
  if (wake_w >= 0 && write(wake_w, "x", 1) < 0) {
    /* The pipe is full: a wake-up is already pending. */
  }
  errno = e;
}

static const int stop_signals[] = {SIGINT, SIGTERM, SIGHUP};
#define N_STOP_SIGNALS (sizeof(stop_signals) / sizeof(stop_signals[0]))

/* Installs the handlers; wake[0] is the pipe's end to wait on. */
static int signals_start(int wake[2]) {
  if (pipe(wake) != 0)
    return -errno;
  for (int i = 0; i < 2; i++)
    fcntl(wake[i], F_SETFL, fcntl(wake[i], F_GETFL) | O_NONBLOCK);
  wake_w = wake[1];
  stop_flag = 0;
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < N_STOP_SIGNALS; i++)
    sigaction(stop_signals[i], &sa, NULL);
  return 0;
}

static void signals_stop(int wake[2]) {
  for (size_t i = 0; i < N_STOP_SIGNALS; i++)
    signal(stop_signals[i], SIG_DFL);
  wake_w = -1;
  close(wake[0]);
  close(wake[1]);
}

/* Waits seconds, watching the wake pipe and, when keys, stdin for q.
 * Returns true when the view is to end (q, a signal). */
static bool wait_or_quit(double seconds, int wake_r, bool* keys) {
  double end = st_now_s() + seconds;
  while (!stop_flag) {
    double left = end - st_now_s();
    if (left <= 0)
      return false;
    struct pollfd p[2] = {{wake_r, POLLIN, 0}, {STDIN_FILENO, POLLIN, 0}};
    int pr = poll(p, *keys ? 2 : 1, (int) ceil(left * 1e3));
    if (pr <= 0 || !*keys || p[1].revents == 0)
      continue;
    char c[32];
    ssize_t r = read(STDIN_FILENO, c, sizeof(c));
    if (r <= 0 && !(r < 0 && errno == EINTR))
      *keys = false; /* stdin closed: stop watching it */
    for (ssize_t i = 0; i < r; i++)
      if (c[i] == 'q' || c[i] == 'Q')
        return true;
  }
  return true;
}

/* ==== The command ======================================================== */

static void usage(FILE* f) {
  fprintf(
      f,
      "usage: starling top [--data-dir DIR | --control PATH] [--interval S]\n"
      "                    [--once | --count N] [--json]\n"
      "\n"
      "A live view of the whole cluster from one node, like top(1): this "
      "node,\nthen one row per member it knows (id, address, state, step, "
      "loss, test\naccuracy, samples/s, exchanges/s, bytes/s), refreshed "
      "every S seconds.\nExchanges/s of another member counts the "
      "averaging exchanges between it\nand this node; bytes/s is known "
      "for this node only (in + out).\n"
      "\n"
      "On a terminal the view redraws in place; q or Ctrl-C ends it. "
      "When stdout\nis not a terminal, or with --once or --count, each "
      "refresh prints one block\nof plain lines.\n"
      "\n"
      "  --data-dir DIR   the node's data directory (default: "
      "./starling-data)\n"
      "  --control PATH   its control socket (default: "
      "DIR/control.sock)\n"
      "  --interval S     seconds between refreshes, %g to %g (default "
      "1)\n"
      "  --once           one refresh (after one interval, for the "
      "rates), then exit\n"
      "  --count N        N refreshes, then exit\n"
      "  --json           one JSON object per refresh, on one line\n"
      "  -h, --help       this help\n",
      INTERVAL_MIN_S, INTERVAL_MAX_S);
}

/* Returns -1 to go on, or the exit status (0 after --help, 2 for a bad
 * flag). */
static int parse_flags(int argc, char** argv, opts_t* o) {
  static const struct option opts[] = {
      {"data-dir", required_argument, NULL, 'd'},
      {"control", required_argument, NULL, 'c'},
      {"interval", required_argument, NULL, 'i'},
      {"once", no_argument, NULL, '1'},
      {"count", required_argument, NULL, 'n'},
      {"json", no_argument, NULL, 'j'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (c) {
      case 'd':
        o->dir = optarg;
        break;
      case 'c':
        o->control = optarg;
        break;
      case 'i':
        if (st__parse_double("starling top", "--interval", optarg,
                             INTERVAL_MIN_S, INTERVAL_MAX_S,
                             &o->interval_s) != 0)
          return 2;
        break;
      case '1':
        o->once = true;
        break;
      case 'n':
        if (st__parse_u64("starling top", "--count", optarg, 1, 1000000000,
                          &o->count) != 0)
          return 2;
        break;
      case 'j':
        o->json = true;
        break;
      case 'h':
        usage(stdout);
        return 0;
      case ':':
        fprintf(stderr, "starling top: %s needs a value\n", argv[optind - 1]);
        return 2;
      default:
        fprintf(stderr,
                "starling top: unknown option '%s'; see 'starling top "
                "--help'\n",
                argv[optind - 1]);
        return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "starling top: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  if (o->once && o->count > 1) {
    fprintf(stderr,
            "starling top: --once and --count %llu disagree; give "
            "one of them\n",
            (unsigned long long) o->count);
    return 2;
  }
  if (o->once)
    o->count = 1;
  return -1;
}

/* Shows cur (with rates from prev, which may be NULL). */
static void show(const opts_t* o, const term_t* t, const snap_t* cur,
                 const snap_t* prev) {
  st_json_buf_t b;
  st_json_buf_init(&b);
  if (o->json)
    render_json(cur, prev, &b);
  else
    render_text(cur, prev, t->live, &b);
  if (!o->json && !t->live)
    st_json_buf_puts(&b, "\n"); /* a blank line between blocks */
  if (b.failed)
    fputs("starling top: out of memory\n", stderr);
  else if (t->live)
    draw_live(b.p, b.len);
  else {
    fwrite(b.p, 1, b.len, stdout);
    fflush(stdout);
  }
  st_json_buf_free(&b);
}

/* The refresh loop from a first snapshot (*cur): shows each later one
 * with its rates. Returns the exit status; err holds the message of a
 * failure (printed by the caller once the terminal is restored). */
static int run_view(const opts_t* o, term_t* t, int wake_r, snap_t* cur,
                    char* err, size_t err_len) {
  if (t->live)
    show(o, t, cur, NULL); /* at once; the rates come with the next one */
  bool keys = t->keys;
  for (uint64_t shown = 0; o->count == 0 || shown < o->count; shown++) {
    if (wait_or_quit(o->interval_s, wake_r, &keys))
      return 0;
    snap_t next;
    int rc = take_snapshot(o, &next, err, err_len);
    if (rc != 0)
      return rc == -2 ? 2 : 1;
    show(o, t, &next, cur);
    snap_free(cur);
    *cur = next;
  }
  return 0;
}

int st__cmd_top(int argc, char** argv) {
  opts_t o = {.dir = "starling-data", .interval_s = 1.0};
  int rc = parse_flags(argc, argv, &o);
  if (rc >= 0)
    return rc;
  char err[2048] = "";
  snap_t cur;
  rc = take_snapshot(&o, &cur, err, sizeof(err));
  if (rc != 0) {
    fputs(err, stderr);
    return rc == -2 ? 2 : 1;
  }
  int wake[2];
  rc = signals_start(wake);
  if (rc != 0) {
    fprintf(stderr, "starling top: cannot make a pipe: %s\n", strerror(-rc));
    snap_free(&cur);
    return 1;
  }
  term_t t = {0};
  if (!o.json && o.count == 0 && isatty(STDOUT_FILENO))
    term_enter(&t);
  int status = run_view(&o, &t, wake[0], &cur, err, sizeof(err));
  term_leave(&t);
  signals_stop(wake);
  snap_free(&cur);
  if (status != 0)
    fputs(err, stderr);
  return status;
}
