/* fetch_probe.c: a test client that asks a running `starling node` for
 * state transfers (FETCH) as a cluster-key holder would, and then reads the
 * parameters slowly or not at all: an insider tying up a donor
 * (tests/integration/test_node_slow_reader.sh).
 *
 *   fetch_probe --cluster-key PATH --connect HOST:PORT --readers LIST
 *               [--hold S]
 *
 * First learns the node's model: a FETCH naming no model gets a MISMATCH
 * reply that carries the node's fingerprint, description and parameter
 * count. Then, one after the other, opens a connection per entry of LIST
 * (comma-separated), with a small receive buffer, runs the
 * daemon's handshake with a fresh identity, sends XCHG_REQ FETCH for the
 * node's model and reads the reply. A reader whose reply is not OK is
 * closed. Those answered OK are then, for S seconds (default 45), until
 * the node has ended them all, or until SIGTERM:
 *   drip   every 2 s, read what comes for up to 256 KiB: far
 *          slower than a model of megabytes needs, but never a closed
 *          window for long enough for the node's TCP_USER_TIMEOUT;
 *   stall  never read again.
 * Prints one JSON object:
 *   {"model":"...","n_params":N,"replies":["ok","busy",...],
 *    "bytes_read":[...],"ended_s":[seconds after the reply at which the
 *    node ended the connection, or null]}
 * Exit status: 0 done, 1 the connection or handshake failed, 2 bad
 * usage. */
#define _GNU_SOURCE /* POLLRDHUP */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tests/integration/probe_xchg.h"

#define MAX_READERS 8
/* A stalled reader's receive buffer: the node's window closes at once. */
#define STALL_RCVBUF_BYTES 4096
/* A dripping reader reads, every 2 s, what comes for up to 256 KiB
 * (128 KiB/s). Each drip must open the window wide: the node's kernel
 * sends nothing into an opening smaller than one loopback segment (64
 * KiB), and its zero-window probes end the connection at TCP_USER_TIMEOUT
 * (10 s) unless data flows between them. Reading 96 KiB every 2 s with a
 * 256 KiB buffer, the reader was cut so in some runs on loaded machines
 * (exchange_closed instead of exchange_timeout); read faster (1 MiB every
 * 2 s), the node's queue drained within the 5 s close deadline. */
#define DRIP_RCVBUF_BYTES (128 * 1024)
#define DRIP_BYTES (64 * 1024)
#define DRIP_MAX_BYTES (256 * 1024)
#define DRIP_EVERY_MS 2000

static volatile sig_atomic_t stop_requested;

static void on_sigterm(int sig) {
  (void) sig;
  stop_requested = 1;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static int usage(const char* why) {
  fprintf(stderr,
          "fetch_probe: %s\nusage: fetch_probe --cluster-key PATH --connect "
          "HOST:PORT --readers drip|stall[,...] [--hold S]\n",
          why);
  return 2;
}

typedef struct {
  const char* key_path;
  const char* target;
  char kinds[MAX_READERS][8]; /* "drip" or "stall" */
  int n;
  double hold_s;
} args_t;

static int parse_readers(const char* v, args_t* a) {
  char buf[128];
  snprintf(buf, sizeof(buf), "%s", v);
  for (char* t = strtok(buf, ","); t != NULL; t = strtok(NULL, ",")) {
    if ((strcmp(t, "drip") != 0 && strcmp(t, "stall") != 0) ||
        a->n == MAX_READERS)
      return usage("--readers: drip or stall, at most 8");
    snprintf(a->kinds[a->n++], sizeof(a->kinds[0]), "%s", t);
  }
  return a->n > 0 ? 0 : usage("--readers: none given");
}

static int parse_args(int argc, char** argv, args_t* a) {
  memset(a, 0, sizeof(*a));
  a->hold_s = 45;
  if (argc % 2 == 0)
    return usage("every option takes a value");
  for (int i = 1; i + 1 < argc; i += 2) {
    const char* k = argv[i];
    const char* v = argv[i + 1];
    int bad = 0;
    if (strcmp(k, "--cluster-key") == 0)
      a->key_path = v;
    else if (strcmp(k, "--connect") == 0)
      a->target = v;
    else if (strcmp(k, "--readers") == 0)
      bad = parse_readers(v, a);
    else if (strcmp(k, "--hold") == 0)
      a->hold_s = strtod(v, NULL);
    else
      bad = usage("unknown option");
    if (bad != 0)
      return bad;
  }
  if (a->key_path == NULL || a->target == NULL || a->n == 0)
    return usage("--cluster-key, --connect and --readers are required");
  return 0;
}

/* One drip: reads what the buffer holds, up to DRIP_MAX_BYTES, into buf
 * (DRIP_BYTES) and counts it in *got. False when the node ended the
 * connection. */
static bool drip_once(int fd, uint8_t* buf, uint64_t* got) {
  for (size_t n = 0; n < DRIP_MAX_BYTES;) {
    ssize_t r = recv(fd, buf, DRIP_BYTES, MSG_DONTWAIT);
    if (r > 0) {
      *got += (uint64_t) r;
      n += (size_t) r;
    } else if (r == 0) {
      return false;
    } else {
      return errno == EAGAIN || errno == EINTR;
    }
  }
  return true;
}

/* Holds the readers answered OK for hold_s seconds, dripping or stalled,
 * until the node has ended them all or SIGTERM; ended[i] gets when the node
 * ended reader i (-1: it did not). */
static void hold(const args_t* a, const int* fds, uint64_t* got,
                 double* ended) {
  double t0 = now_s(), next_drip = t0;
  uint8_t buf[DRIP_BYTES];
  for (int open = 1; open > 0 && !stop_requested && now_s() - t0 < a->hold_s;) {
    bool drip = now_s() >= next_drip;
    if (drip)
      next_drip += DRIP_EVERY_MS / 1000.0;
    open = 0;
    for (int i = 0; i < a->n; i++) {
      if (fds[i] < 0 || ended[i] >= 0)
        continue;
      open++;
      bool reads = strcmp(a->kinds[i], "drip") == 0;
      /* A stalled reader only looks for an error or a hang-up. */
      struct pollfd p = {fds[i], reads ? POLLIN : POLLRDHUP, 0};
      if (poll(&p, 1, 0) <= 0 || (reads && !drip && !(p.revents & POLLERR)))
        continue;
      if (!reads) {
        ended[i] = now_s() - t0;
        continue;
      }
      ended[i] = drip_once(fds[i], buf, &got[i]) ? -1 : now_s() - t0;
    }
    usleep(20 * 1000);
  }
}

static void print_result(const args_t* a, const st_msg_xchg_reply_t* node,
                         const char** replies, const uint64_t* got,
                         const double* ended) {
  printf("{\"model\":\"%s\",\"n_params\":%llu,\"replies\":[", node->model,
         (unsigned long long) node->n_params);
  for (int i = 0; i < a->n; i++)
    printf("%s\"%s\"", i > 0 ? "," : "", replies[i]);
  printf("],\"bytes_read\":[");
  for (int i = 0; i < a->n; i++)
    printf("%s%llu", i > 0 ? "," : "", (unsigned long long) got[i]);
  printf("],\"ended_s\":[");
  for (int i = 0; i < a->n; i++) {
    if (ended[i] >= 0)
      printf("%s%.1f", i > 0 ? "," : "", ended[i]);
    else
      printf("%snull", i > 0 ? "," : "");
  }
  printf("]}\n");
}

/* The readers, one after the other, then the hold. */
static int run(const args_t* a, const st_keyring_t* keys) {
  st_msg_xchg_reply_t node;
  if (probe_learn_model(a->target, keys, "fetch_probe", &node) != 0) {
    fprintf(stderr, "fetch_probe: could not learn %s's model\n", a->target);
    return 1;
  }
  st_msg_xchg_req_t req;
  memset(&req, 0, sizeof(req));
  req.kind = ST_XCHG_FETCH;
  memcpy(req.fingerprint, node.fingerprint, sizeof(req.fingerprint));
  memcpy(req.model, node.model, sizeof(req.model));
  req.n_params = node.n_params;
  int fds[MAX_READERS];
  const char* replies[MAX_READERS];
  uint64_t got[MAX_READERS] = {0};
  double ended[MAX_READERS];
  for (int i = 0; i < a->n; i++) {
    st_msg_xchg_reply_t r;
    ended[i] = -1;
    bool drip = strcmp(a->kinds[i], "drip") == 0;
    fds[i] = probe_xchg_open(a->target, keys, &req,
                             drip ? DRIP_RCVBUF_BYTES : STALL_RCVBUF_BYTES, &r,
                             NULL, NULL);
    if (fds[i] < 0) {
      fprintf(stderr, "fetch_probe: reader %d: no reply from %s\n", i,
              a->target);
      return 1;
    }
    replies[i] = probe_status_name(r.status);
    if (r.status != ST_XCHG_STATUS_OK) {
      close(fds[i]);
      fds[i] = -1;
    }
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_sigterm;
  sigaction(SIGTERM, &sa, NULL);
  hold(a, fds, got, ended);
  print_result(a, &node, replies, got, ended);
  for (int i = 0; i < a->n; i++)
    if (fds[i] >= 0)
      close(fds[i]);
  return 0;
}

int main(int argc, char** argv) {
  args_t a;
  int bad = parse_args(argc, argv, &a);
  if (bad != 0)
    return bad;
  st_cluster_key_t ck;
  st_keyring_t keys;
  if (probe_load_keys("fetch_probe", a.key_path, &ck, &keys) != 0)
    return 1;
  int rc = run(&a, &keys);
  st_keyring_wipe(&keys);
  st_cluster_key_wipe(&ck);
  return rc;
}
