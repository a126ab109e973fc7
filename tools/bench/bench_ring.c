/* bench_ring.c: `starling-bench ring`, the ring all-reduce of issue #6
 * measured end to end: N member processes run the real machine
 * (gossip/ring.c) over the real encrypted streams (crypto/), on loopback
 * TCP or, with --netns, on veth links shaped to a given rate
 * (bench_ring_netns.c). tools/bench/bench_ring.sh sets it against Gloo and MPI
 * (tests/bench/gloo_allreduce.cc, tests/bench/mpi_allreduce.c).
 *
 * Figures, as NCCL's tests define them (nccl-tests, doc/PERFORMANCE.md):
 *   time   the median over the measured rounds (one warm-up round first)
 *          of max(end) - min(start) over the members; each member starts
 *          its clock when the parent's barrier releases it
 *   algbw  S bytes / time
 *   busbw  algbw * 2 (N - 1) / N: the bytes each member must send (and
 *          receive) in a bandwidth-optimal all-reduce, over the time; it is
 *          at most the link rate whatever N, so it compares with the link
 *
 * The crypto bound. Each member seals the 2 (N - 1) chunks it sends and
 * opens the 2 (N - 1) it receives, B = 2 (N - 1) / N * S bytes each way.
 * With seal and open rates s and o (bytes/s on one core, measured here
 * before the members start), the N members need N * B * (1/s + 1/o)
 * core-seconds of AEAD; at best that work spreads over P = min(2NL, cores)
 * cores (with L lanes each member seals on L threads and opens on L more),
 * so
 *
 *   limit_time = N * B * (1/s + 1/o) / min(2NL, cores)
 *
 * No all-reduce with that many threads of AEAD can beat it while it
 * encrypts; the ratio time / limit_time says how far the rest (the
 * kernel's TCP copies, the additions, the encoding, the waits) keeps it
 * from that bound. Where cores > 2NL the lanes leave cores idle, so the
 * figures also give the bound of all the machine's cores,
 *
 *   all_cores_limit = N * B * (1/s + 1/o) / cores
 *
 * (the same as limit_time where cores <= 2NL).
 *
 * Every round's mean is checked on every member against the float64 mean
 * of all members' data (computed here, in the parent, from the shared
 * seed) and the members' means must be bit-identical; any mismatch or
 * failure exits 1.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gossip/gossip.h"
#include "tools/bench/bench.h"
#include "tools/bench/bench_ring.h"
#include "tools/cli/cli.h"

#define CMD "starling-bench ring"
#define MAX_MEMBERS 64u
#define REF_BLOCK 65536u

typedef struct {
  uint64_t n, mib, repeats, mtu, seed, timeout_s, segment_kib, in_flight;
  uint64_t lanes; /* --lanes, default 1 (what the daemon does) */
  bool in_flight_given;
  bool netns, json, corrupt;
  const char* rate;
  double rate_bps; /* --rate in bits/s, 0 when not --netns */
  char tag[32];
} opts_t;

/* What the signal handler must undo: the children and the namespaces. */
static pid_t g_pids[MAX_MEMBERS];
static uint32_t g_n;
static const opts_t* g_opts;

static void kill_members(void) {
  for (uint32_t r = 0; r < g_n; r++)
    if (g_pids[r] > 0) {
      kill(g_pids[r], SIGKILL);
      waitpid(g_pids[r], NULL, 0);
      g_pids[r] = 0;
    }
}

static void on_signal(int sig) {
  /* Not async-signal-safe in the letter (snprintf, stdio in the cleanup),
   * but the process is leaving and the namespaces must not stay behind. */
  kill_members();
  if (g_opts != NULL && g_opts->netns)
    st__ring_netns_down(g_opts->tag, (uint32_t) g_opts->n);
  _exit(128 + sig);
}

/* "1gbit", "100mbit", "500kbit", "1.5gbit": bits per second; 0 if not. */
static double parse_rate(const char* s) {
  char* end = NULL;
  double v = strtod(s, &end);
  if (end == s || !(v > 0))
    return 0;
  if (strcmp(end, "bit") == 0)
    return v;
  if (strcmp(end, "kbit") == 0)
    return v * 1e3;
  if (strcmp(end, "mbit") == 0)
    return v * 1e6;
  if (strcmp(end, "gbit") == 0)
    return v * 1e9;
  return 0;
}

/* ==== The parent ============================================================
 */

/* The float64 mean of every member's data, rounded to float32. */
static float* reference(uint64_t seed, uint32_t n, uint64_t floats) {
  float* ref = malloc(floats * sizeof(float));
  float* tmp = malloc(REF_BLOCK * sizeof(float));
  double* acc = malloc(REF_BLOCK * sizeof(double));
  if (ref != NULL && tmp != NULL && acc != NULL) {
    for (uint64_t at = 0; at < floats; at += REF_BLOCK) {
      uint64_t k = floats - at < REF_BLOCK ? floats - at : REF_BLOCK;
      memset(acc, 0, k * sizeof(double));
      for (uint32_t m = 0; m < n; m++) {
        st__ring_fill(seed, m, at, k, tmp);
        for (uint64_t i = 0; i < k; i++)
          acc[i] += tmp[i];
      }
      for (uint64_t i = 0; i < k; i++)
        ref[at + i] = (float) (acc[i] / n);
    }
  } else {
    free(ref);
    ref = NULL;
  }
  free(tmp);
  free(acc);
  return ref;
}

/* Reads exactly len bytes before the deadline (st_now_s seconds). */
static int read_by(int fd, void* buf, size_t len, double deadline) {
  uint8_t* p = buf;
  while (len > 0) {
    double left = deadline - st_now_s();
    struct pollfd pf = {fd, POLLIN, 0};
    if (left <= 0 || poll(&pf, 1, (int) (left * 1e3) + 1) < 0)
      return -ETIMEDOUT;
    if (pf.revents == 0)
      continue;
    ssize_t r = read(fd, p, len);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return -EIO;
    p += r;
    len -= (size_t) r;
  }
  return 0;
}

static int write_one(int fd, const void* buf, size_t len) {
  return write(fd, buf, len) == (ssize_t) len ? 0 : -EIO;
}

static int cmp_double(const void* x, const void* y) {
  double a = *(const double*) x, b = *(const double*) y;
  return (a > b) - (a < b);
}

/* Per all-reduce, summed over the members, mean over measured rounds. */
typedef struct {
  double seal, open, write, read, machine, copy, process, max_err;
  double tail; /* the longest member's tail, mean over measured rounds */
} cpu_t;

/* The child side of a fork: member r's process, never returns. */
static void member_child(const opts_t* o, uint32_t r, int up[][2],
                         int down[][2], char ns[][64], pid_t parent,
                         const st_keyring_t* keys, const st_identity_t* ids,
                         const float* ref, uint64_t floats) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent)
    _exit(1);
  for (uint32_t q = 0; q < r; q++) {
    close(up[q][0]);
    close(down[q][1]);
  }
  close(up[r][0]);
  close(down[r][1]);
  if (o->netns && st__ring_netns_enter(ns[r]) != 0) {
    fprintf(stderr, "starling-bench ring: member %u: cannot enter %s\n", r,
            ns[r]);
    _exit(1);
  }
  st__ring_member_cfg_t c = {
      .n = (uint32_t) o->n,
      .rank = r,
      .floats = floats,
      .rounds = (uint32_t) o->repeats + 1,
      .seed = o->seed,
      .segment_floats = (uint32_t) (o->segment_kib * 256),
      .in_flight = (uint32_t) o->in_flight,
      .lanes = (uint32_t) o->lanes,
      .keys = keys,
      .identities = ids,
      .ref = ref,
      .netns = o->netns ? ns[r] : NULL,
      .corrupt = o->corrupt,
      .up_fd = up[r][1],
      .down_fd = down[r][0]};
  _exit(st__ring_member(&c));
}

/* One round from the parent: the barrier ('R' from all, 'G' to all), the
 * members' reports checked (verified, bit-identical means), the time and
 * CPU figures of a measured round (k > 0) added. */
static int parent_round(const opts_t* o, uint32_t k, int up[][2], int down[][2],
                        double deadline, double* t, cpu_t* cpu) {
  uint32_t n = (uint32_t) o->n;
  int rc = 0;
  uint8_t b;
  for (uint32_t r = 0; r < n && rc == 0; r++)
    if ((rc = read_by(up[r][0], &b, 1, deadline)) == 0 && b != 'R')
      rc = -EPROTO;
  for (uint32_t r = 0; r < n && rc == 0; r++)
    rc = write_one(down[r][1], "G", 1);
  st__ring_report_t rep[MAX_MEMBERS];
  for (uint32_t r = 0; r < n && rc == 0; r++)
    rc = read_by(up[r][0], &rep[r], sizeof(rep[r]), deadline);
  if (rc != 0)
    return rc;
  double t0 = INFINITY, t1 = -INFINITY, tail = 0;
  for (uint32_t r = 0; r < n; r++) {
    if (!rep[r].verified ||
        memcmp(rep[r].hash, rep[0].hash, sizeof(rep[0].hash)) != 0) {
      fprintf(
          stderr,
          "starling-bench ring: round %u, member %u: %s (result %s, "
          "max |mean - reference| %.3g)\n",
          k, r,
          rep[r].verified ? "mean differs from member 0's" : "WRONG OR FAILED",
          rep[r].result < 0 ? "I/O error" : st_ring_result_name(rep[r].result),
          rep[r].max_err);
      rc = -EBADMSG;
    }
    tail = fmax(tail, rep[r].tail);
    t0 = fmin(t0, rep[r].t_start);
    t1 = fmax(t1, rep[r].t_end);
    if (k > 0) { /* round 0 is the warm-up */
      cpu->seal += rep[r].cpu_seal / o->repeats;
      cpu->open += rep[r].cpu_open / o->repeats;
      cpu->write += rep[r].cpu_write / o->repeats;
      cpu->read += rep[r].cpu_read / o->repeats;
      cpu->machine += rep[r].cpu_machine / o->repeats;
      cpu->copy += rep[r].cpu_copy / o->repeats;
      cpu->process += rep[r].cpu_process / o->repeats;
    }
    cpu->max_err = fmax(cpu->max_err, rep[r].max_err);
  }
  if (k > 0) {
    t[k - 1] = t1 - t0;
    cpu->tail += tail / o->repeats;
  }
  return rc;
}

/* After the rounds: the members end once their neighbours' final frames
 * came; each must exit 0 before the deadline. */
static int reap_members(uint32_t n, double deadline) {
  int rc = 0;
  for (uint32_t r = 0; r < n && rc == 0; r++) {
    int st = 0;
    while (g_pids[r] > 0 && waitpid(g_pids[r], &st, WNOHANG) == 0) {
      if (st_now_s() > deadline) {
        fprintf(stderr, "starling-bench ring: member %u did not exit\n", r);
        rc = -ETIMEDOUT;
        break;
      }
      usleep(2000);
    }
    if (rc == 0) {
      g_pids[r] = 0;
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        rc = -EIO;
    }
  }
  return rc;
}

/* Forks the members and runs the rounds; fills t[rounds] and cpu. */
static int run_members(const opts_t* o, const st_keyring_t* keys,
                       const st_identity_t* ids, const float* ref,
                       uint64_t floats, double* t, cpu_t* cpu) {
  uint32_t n = (uint32_t) o->n, rounds = (uint32_t) o->repeats + 1;
  int up[MAX_MEMBERS][2], down[MAX_MEMBERS][2];
  char ns[MAX_MEMBERS][64];
  double deadline = st_now_s() + (double) o->timeout_s;
  int rc = 0;
  pid_t parent = getpid();
  fflush(stdout);
  fflush(stderr);
  for (uint32_t r = 0; r < n; r++) {
    st__ring_netns_name(o->tag, r, ns[r]);
    pid_t pid = -1;
    if (pipe(up[r]) != 0 || pipe(down[r]) != 0 || (pid = fork()) < 0) {
      kill_members(); /* and their pipes close with this process */
      return -EIO;
    }
    if (pid == 0)
      member_child(o, r, up, down, ns, parent, keys, ids, ref, floats);
    g_pids[r] = pid;
    close(up[r][1]);
    close(down[r][0]);
  }
  /* Ports: each member learns the next one's. */
  uint16_t port[MAX_MEMBERS];
  for (uint32_t r = 0; r < n && rc == 0; r++)
    rc = read_by(up[r][0], &port[r], sizeof(port[r]), deadline);
  for (uint32_t r = 0; r < n && rc == 0; r++)
    rc = write_one(down[r][1], &port[(r + 1) % n], sizeof(port[0]));
  memset(cpu, 0, sizeof(*cpu));
  for (uint32_t k = 0; k < rounds && rc == 0; k++)
    rc = parent_round(o, k, up, down, deadline, t, cpu);
  if (rc == -ETIMEDOUT)
    fprintf(stderr, "starling-bench ring: no answer within --timeout %llu s\n",
            (unsigned long long) o->timeout_s);
  else if (rc == -EIO || rc == -EPROTO)
    fprintf(stderr, "starling-bench ring: a member failed or ended early\n");
  for (uint32_t r = 0; r < n; r++) {
    close(up[r][0]);
    close(down[r][1]);
  }
  if (rc == 0)
    rc = reap_members(n, deadline);
  kill_members(); /* whoever is left: a failure or the deadline */
  return rc;
}

static void usage(void) {
  printf(
      "usage: starling-bench ring --members N --mib S [--repeats R]\n"
      "           [--netns [--rate 1gbit] [--mtu 9000]] [--seed X]\n"
      "           [--segment-kib K] [--in-flight F] [--lanes L]\n"
      "           [--timeout SECONDS] [--json] [--corrupt]\n\n"
      "One all-reduce of S MiB of float32 among N member processes (2..%u)\n"
      "running gossip/ring.c over encrypted TCP (handshake and\n"
      "secretstream), on loopback or, with --netns (root), each member in\n"
      "its own network namespace on a bridge, links shaped by tbf to\n"
      "--rate each way (MTU 9000: at 1500 TCP's payload tops out at\n"
      "0.956 of the rate). One warm-up round then R measured (default 3);\n"
      "prints the median time, algbw and busbw (NCCL's definitions), the\n"
      "crypto bound of this machine, and where the CPU time goes. Every\n"
      "result is checked against the float64 mean; exit 1 on a mismatch.\n"
      "The whole run is bounded by --timeout (default 600 s). --corrupt\n"
      "tests the check: member 0 alters one float, the run must fail.\n"
      "--segment-kib (4..1024, default %u) and --in-flight (1..%u,\n"
      "default %u) set the ring's segment size and the segments each\n"
      "member may have sent and not yet written (gossip/ring.c; default\n"
      "raised to 2 L with L lanes). --lanes L (1..%u, default 1)\n"
      "connects each member to the next L times, each its own handshake\n"
      "and secretstream, segment i on lane i %% L, so that L threads seal\n"
      "and L open at once, as the daemon's --ring-lanes does (there\n"
      "the lanes open with RING_LANE; here they are dialled in order).\n",
      MAX_MEMBERS, ST_RING_DEFAULT_SEGMENT_FLOATS / 256,
      ST__BENCH_RING_MAX_IN_FLIGHT, ST_RING_IN_FLIGHT,
      ST__BENCH_RING_MAX_LANES);
}

static void opts_default(opts_t* o) {
  memset(o, 0, sizeof(*o));
  o->n = 4;
  o->mib = 16;
  o->repeats = 3;
  o->mtu = 9000; /* bench_ring_netns.c: the payload ceiling per MTU */
  o->seed = 6;
  o->timeout_s = 600;
  o->segment_kib = ST_RING_DEFAULT_SEGMENT_FLOATS / 256;
  o->in_flight = ST_RING_IN_FLIGHT;
  o->lanes = 1;
  o->rate = "1gbit";
  snprintf(o->tag, sizeof(o->tag), "%d", (int) getpid());
}

/* One option of getopt_long's (c, optarg); nonzero when it is bad (the
 * message printed). */
static int parse_one(int c, const char* arg, opts_t* o) {
  switch (c) {
    case 'n':
      return st__parse_u64(CMD, "--members", arg, 2, MAX_MEMBERS, &o->n);
    case 'm':
      return st__parse_u64(CMD, "--mib", arg, 1, 4096, &o->mib);
    case 'r':
      return st__parse_u64(CMD, "--repeats", arg, 1, 1000, &o->repeats);
    case 'M':
      return st__parse_u64(CMD, "--mtu", arg, 576, 65000, &o->mtu);
    case 's':
      return st__parse_u64(CMD, "--seed", arg, 0, UINT64_MAX, &o->seed);
    case 't':
      return st__parse_u64(CMD, "--timeout", arg, 1, 86400, &o->timeout_s);
    case 'S':
      return st__parse_u64(CMD, "--segment-kib", arg, 4,
                           ST_RING_SEGMENT_FLOATS / 256, &o->segment_kib);
    case 'F':
      o->in_flight_given = true;
      return st__parse_u64(CMD, "--in-flight", arg, 1,
                           ST__BENCH_RING_MAX_IN_FLIGHT, &o->in_flight);
    case 'L':
      return st__parse_u64(CMD, "--lanes", arg, 1, ST__BENCH_RING_MAX_LANES,
                           &o->lanes);
    case 'N':
      o->netns = true;
      return 0;
    case 'R':
      o->rate = arg;
      return 0;
    case 'T':
      if (strlen(arg) > 12 || strspn(arg,
                                     "0123456789abcdefghijklmnop"
                                     "qrstuvwxyz") != strlen(arg))
        return 1;
      snprintf(o->tag, sizeof(o->tag), "%s", arg);
      return 0;
    case 'j':
      o->json = true;
      return 0;
    case 'C':
      o->corrupt = true;
      return 0;
  }
  return 1;
}

/* The checks that need every option: 2 on a refusal, else -1. */
static int parse_check(opts_t* o) {
  if (o->netns && (o->rate_bps = parse_rate(o->rate)) <= 0) {
    fprintf(stderr,
            "starling-bench ring: --rate: '%s' is not a rate like 1gbit, "
            "100mbit or 500kbit\n",
            o->rate);
    return 2;
  }
  if (o->netns && geteuid() != 0) {
    fprintf(stderr, "starling-bench ring: --netns needs root (ip netns)\n");
    return 2;
  }
  if (!o->in_flight_given && o->in_flight < 2 * o->lanes)
    o->in_flight = 2 * o->lanes; /* two segments a lane */
  return -1;                     /* go on */
}

/* 0 after --help, 2 on a bad option, -1 to go on. */
static int parse(int argc, char** argv, opts_t* o) {
  static const struct option opts[] = {
      {"members", required_argument, NULL, 'n'},
      {"mib", required_argument, NULL, 'm'},
      {"repeats", required_argument, NULL, 'r'},
      {"netns", no_argument, NULL, 'N'},
      {"rate", required_argument, NULL, 'R'},
      {"mtu", required_argument, NULL, 'M'},
      {"seed", required_argument, NULL, 's'},
      {"timeout", required_argument, NULL, 't'},
      {"segment-kib", required_argument, NULL, 'S'},
      {"in-flight", required_argument, NULL, 'F'},
      {"lanes", required_argument, NULL, 'L'},
      {"netns-tag", required_argument, NULL, 'T'},
      {"json", no_argument, NULL, 'j'},
      {"corrupt", no_argument, NULL, 'C'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  opts_default(o);
  int c;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    if (c == 'h') {
      usage();
      return 0;
    }
    if (strchr("nmrMstSFLNRTjC", c) == NULL) {
      fprintf(stderr, "starling-bench ring: bad option '%s'; see --help\n",
              argv[optind - 1]);
      return 2;
    }
    if (parse_one(c, optarg, o) != 0)
      return 2;
  }
  return parse_check(o);
}

/* The figures of a run (the file's opening comment defines them). */
typedef struct {
  uint32_t n;
  long cores;
  double load, seal_bps, open_bps;
  double med, tmin, tmax, algbw, busbw, per_member, limit, limit_all, other,
      tol;
  const char* where;
} figures_t;

static void figures(const opts_t* o, double* t, const cpu_t* cpu,
                    figures_t* f) {
  double bytes = (double) o->mib * 1024 * 1024;
  uint32_t n = f->n;
  qsort(t, o->repeats, sizeof(double), cmp_double);
  f->med = t[o->repeats / 2];
  f->tmin = t[0];
  f->tmax = t[o->repeats - 1];
  f->algbw = bytes * 8 / f->med / 1e9;
  f->busbw = f->algbw * 2.0 * (n - 1) / n;
  f->per_member = 2.0 * (n - 1) / n * bytes;      /* B, each way */
  uint32_t threads = 2 * n * (uint32_t) o->lanes; /* of AEAD, at most */
  double par =
      (double) (threads < (uint32_t) f->cores ? threads : (uint32_t) f->cores);
  double aead = n * f->per_member * (1 / f->seal_bps + 1 / f->open_bps);
  f->limit = aead / par;
  f->limit_all = aead / f->cores;
  f->other = cpu->process - cpu->seal - cpu->open - cpu->write - cpu->read -
             cpu->machine - cpu->copy;
  f->tol = (n + 4) * 0x1p-24;
  f->where = o->netns ? "netns" : "loopback";
}

static void print_json(const opts_t* o, const figures_t* f, const cpu_t* cpu) {
  printf(
      "{\"members\":%u,\"mib\":%llu,\"repeats\":%llu,\"transport\":\"%s\","
      "\"encrypted\":true,\"cores\":%ld,\"load_1min\":%.2f,"
      "\"seconds_median\":%.6f,\"seconds_min\":%.6f,\"seconds_max\":%.6f,"
      "\"algbw_gbps\":%.4f,\"busbw_gbps\":%.4f,\"segment_kib\":%llu,"
      "\"in_flight\":%llu,\"lanes\":%llu",
      f->n, (unsigned long long) o->mib, (unsigned long long) o->repeats,
      f->where, f->cores, f->load, f->med, f->tmin, f->tmax, f->algbw, f->busbw,
      (unsigned long long) o->segment_kib, (unsigned long long) o->in_flight,
      (unsigned long long) o->lanes);
  if (o->netns)
    printf(
        ",\"rate\":\"%s\",\"rate_gbps\":%.4f,\"mtu\":%llu,"
        "\"busbw_over_rate\":%.4f",
        o->rate, o->rate_bps / 1e9, (unsigned long long) o->mtu,
        f->busbw * 1e9 / o->rate_bps);
  printf(
      ",\"aead_seal_mbps\":%.0f,\"aead_open_mbps\":%.0f,"
      "\"crypto_limit_seconds\":%.6f,\"measured_over_limit\":%.3f,"
      "\"crypto_limit_all_cores_seconds\":%.6f,"
      "\"measured_over_all_cores_limit\":%.3f,"
      "\"cpu_seconds\":{\"seal\":%.4f,\"open\":%.4f,\"socket_write\":"
      "%.4f,\"socket_read\":%.4f,\"ring_machine\":%.4f,\"copy\":%.4f,"
      "\"other\":%.4f,\"process\":%.4f},\"tail_seconds\":%.6f,"
      "\"verified\":true,\"max_abs_err\":%.3g,\"tolerance\":%.3g}\n",
      f->seal_bps / 1e6, f->open_bps / 1e6, f->limit, f->med / f->limit,
      f->limit_all, f->med / f->limit_all, cpu->seal, cpu->open, cpu->write,
      cpu->read, cpu->machine, cpu->copy, f->other, cpu->process, cpu->tail,
      cpu->max_err, f->tol);
}

static void print_text(const opts_t* o, const figures_t* f, const cpu_t* cpu) {
  printf(
      "ring all-reduce (gossip/ring.c, encrypted TCP streams): %u members, "
      "%llu MiB float32, %s",
      f->n, (unsigned long long) o->mib, f->where);
  if (o->netns)
    printf(" (tbf %s each way, MTU %llu)", o->rate,
           (unsigned long long) o->mtu);
  printf("; segments of %llu KiB, %llu in flight, %llu lane%s",
         (unsigned long long) o->segment_kib, (unsigned long long) o->in_flight,
         (unsigned long long) o->lanes, o->lanes == 1 ? "" : "s");
  printf(
      "\n  %ld cores, load average %.2f before the run; 1 warm-up + %llu "
      "measured rounds; every mean checked against the float64 mean (max "
      "|err| %.2g <= %.2g) and bit-identical on all members\n",
      f->cores, f->load, (unsigned long long) o->repeats, cpu->max_err, f->tol);
  printf("  time per all-reduce: median %.2f ms (min %.2f, max %.2f)\n",
         f->med * 1e3, f->tmin * 1e3, f->tmax * 1e3);
  printf("  algbw %.3f Gbit/s, busbw %.3f Gbit/s", f->algbw, f->busbw);
  if (o->netns)
    printf(" = %.3f of the %s link", f->busbw * 1e9 / o->rate_bps, o->rate);
  printf(
      "\n  crypto bound: seal %.0f MB/s, open %.0f MB/s on one core; each "
      "member seals and opens B = 2(N-1)/N*S = %.2f MiB\n"
      "    limit = N*B*(1/seal + 1/open) / min(2N*lanes, cores) = %.2f ms; "
      "measured/limit = %.2f\n"
      "    all cores: N*B*(1/seal + 1/open) / cores = %.2f ms; "
      "measured/that = %.2f\n",
      f->seal_bps / 1e6, f->open_bps / 1e6, f->per_member / 1048576.0,
      f->limit * 1e3, f->med / f->limit, f->limit_all * 1e3,
      f->med / f->limit_all);
  printf(
      "  CPU seconds per all-reduce, all members: seal %.4f, open %.4f, "
      "socket write %.4f, socket read %.4f, ring machine (decode, add, "
      "encode) %.4f, copy to sender %.4f, other %.4f; total %.4f of "
      "%ld cores x %.4f s (%.0f%% busy; crypto %.0f%% of the CPU)\n",
      cpu->seal, cpu->open, cpu->write, cpu->read, cpu->machine, cpu->copy,
      f->other, cpu->process, f->cores, f->med,
      100 * cpu->process / (f->cores * f->med),
      100 * (cpu->seal + cpu->open) / cpu->process);
  printf(
      "  serial tail: %.2f ms from the last segment to DONE (the last "
      "addition and the delta of the last segment), %.0f%% of the time\n",
      cpu->tail * 1e3, 100 * cpu->tail / f->med);
}

/* The keys, the namespaces when asked, the members' run; 0 or -errno. */
static int run_keyed(const opts_t* o, const float* ref, uint64_t floats,
                     double* t, cpu_t* cpu) {
  uint32_t n = (uint32_t) o->n;
  /* One cluster key; an identity per member, known to all (each checks
   * its neighbours' ids, as the daemon checks the member it dials). */
  st_cluster_key_t ck;
  st_keyring_t keys;
  st_identity_t* ids = calloc(n, sizeof(*ids));
  char err[160];
  if (ids == NULL || st_cluster_key_generate(&ck) != 0 ||
      st_keyring_init(&keys, &ck, NULL, err, sizeof(err)) != 0) {
    free(ids);
    return -ENOMEM;
  }
  for (uint32_t r = 0; r < n; r++)
    st_identity_generate(&ids[r]);
  g_n = n;
  g_opts = o;
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  signal(SIGHUP, on_signal);
  /* A member that died must show as an error on its pipe or socket, not
   * kill the parent before it removes the namespaces. */
  signal(SIGPIPE, SIG_IGN);
  int rc = 0;
  if (o->netns && st__ring_netns_up(o->tag, n, o->rate, (unsigned) o->mtu)) {
    fprintf(stderr, "starling-bench ring: cannot make the namespaces\n");
    rc = -EIO;
  }
  if (rc == 0)
    rc = run_members(o, &keys, ids, ref, floats, t, cpu);
  if (o->netns)
    st__ring_netns_down(o->tag, n);
  g_opts = NULL;
  for (uint32_t r = 0; r < n; r++)
    st_identity_wipe(&ids[r]);
  st_keyring_wipe(&keys);
  st_cluster_key_wipe(&ck);
  free(ids);
  return rc;
}

int st__bench_ring(int argc, char** argv) {
  opts_t o;
  int rc = parse(argc, argv, &o);
  if (rc >= 0)
    return rc;
  if (st_crypto_init() != 0)
    return 1;
  figures_t f;
  memset(&f, 0, sizeof(f));
  f.n = (uint32_t) o.n;
  uint64_t floats = o.mib * 1024 * 1024 / sizeof(float);
  f.cores = sysconf(_SC_NPROCESSORS_ONLN);
  getloadavg(&f.load, 1); /* other processes skew every figure */
  st__bench_aead_rates(&f.seal_bps, &f.open_bps);
  float* ref = reference(o.seed, f.n, floats);
  double* t = calloc(o.repeats, sizeof(double));
  cpu_t cpu;
  rc = ref == NULL || t == NULL ? -ENOMEM : run_keyed(&o, ref, floats, t, &cpu);
  free(ref);
  if (rc != 0) {
    free(t);
    return 1;
  }
  figures(&o, t, &cpu, &f);
  free(t);
  if (o.json)
    print_json(&o, &f, &cpu);
  else
    print_text(&o, &f, &cpu);
  return 0;
}
