/* comm_probe.c: a program that runs user collectives through its local node
 * with the client library (client/starling/client.h, "Collectives"), for
 * test_node_collectives.sh. Each member's operands are a function of its
 * rank, so every member can check the results against values it computes
 * itself in float64.
 *
 *   comm_probe SOCKET check N   members, barrier, all-reduce (small f64
 *                               sum, large f32 mean, min, max), reduce to
 *                               rank 1, broadcast from rank N-1 (small and
 *                               large), on a group of N (waits until the
 *                               node sees N members); prints "ok ..." or
 *                               "FAIL ..." and exits 0 or 1
 *   comm_probe SOCKET count C   one all-reduce of C float32 (a mismatch when
 *                               members differ); prints the error
 *   comm_probe SOCKET barrier T one barrier with timeout T s; prints "ok" or
 *                               "error: <sentence>", exit 0 or 2
 *   comm_probe SOCKET publish NAME C   publishes C float32 (element i is
 *                               i / 4) under NAME; prints "ok" or
 *                               "error: <sentence>", exit 0 or 2
 *   comm_probe SOCKET fetch PEER NAME C  fetches C float32 that PEER
 *                               published under NAME and checks each is
 *                               i / 4; prints "ok", "FAIL ..." or "error:
 *                               <sentence>", exit 0, 1 or 2
 *   comm_probe SOCKET bench S R ITERS  all-reduce of S bytes (float32) R
 *                               times per line of output, ITERS lines:
 *                               "allreduce bytes S seconds X cpu_seconds
 *                               Y" (the median time; this program's own
 *                               CPU time, user + system, per operation)
 *   comm_probe SOCKET suite N SIZES ROUNDS ITERS  for
 *                               tools/bench/bench_collectives.sh: barrier,
 *                               then broadcast from rank 0 and all-reduce
 *                               (float32 sum) of each of SIZES bytes
 *                               (comma-separated) on a group of N, and the
 *                               same all-reduce on a group of this node
 *                               alone (the client-node copies without the
 *                               network). Each: one warm-up round, then
 *                               ROUNDS rounds of K back-to-back operations
 *                               after a barrier (K = ITERS for barriers, and
 *                               ITERS capped to 4 MiB / SIZE, at least 1,
 *                               for the rest); every result checked
 *                               exactly. One JSON line per operation and
 *                               size, with every round's CLOCK_MONOTONIC
 *                               start and end (tests/bench/
 *                               gloo_collectives.py prints the same).
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "client/starling/client.h"

/* The largest group the suite mode runs in. */
#define ST_COLL_PROBE_MAX 64

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

/* This process's CPU time so far, user and system. */
static double cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double) (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         (double) (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

static double value(size_t rank, size_t i) {
  return (double) ((rank * 7919 + i * 104729) % 1000) / 1000.0 - 0.5 +
         (double) rank;
}

#define CHECK(cond, ...)                   \
  do {                                     \
    if (!(cond)) {                         \
      printf("FAIL: " __VA_ARGS__);        \
      printf(" (%s)\n", st_comm_error(c)); \
      return 1;                            \
    }                                      \
  } while (0)

/* Waits until the node sees n members; their rank order into *rank. */
static int wait_members(st_comm_t* c, size_t n, size_t* rank) {
  for (int i = 0; i < 600; i++) {
    size_t got = 0;
    if (st_comm_members(c, NULL, 0, &got, rank) == 0 && got == n)
      return 0;
    usleep(50000);
  }
  return -1;
}

static int check_all_reduce(st_comm_t* c, size_t n, size_t rank) {
  double small[100];
  for (size_t i = 0; i < 100; i++)
    small[i] = value(rank, i);
  int rc =
      st_comm_all_reduce(c, NULL, small, 100, ST_COMM_F64, ST_COMM_SUM, 30);
  CHECK(rc == 0, "all_reduce f64 sum: %d", rc);
  for (size_t i = 0; i < 100; i++) {
    double want = 0;
    for (size_t r = 0; r < n; r++)
      want += value(r, i);
    CHECK(fabs(small[i] - want) <= 1e-12 * (n + 1) * (n + 1),
          "f64 sum element %zu: %.17g vs %.17g", i, small[i], want);
  }
  size_t big = 300001; /* 1.2 MB of float32: the ring path */
  float* v = malloc(big * sizeof(float));
  for (int op = ST_COMM_MEAN; op <= ST_COMM_MAX; op++) {
    for (size_t i = 0; i < big; i++)
      v[i] = (float) value(rank, i);
    rc = st_comm_all_reduce(c, "all", v, big, ST_COMM_F32, op, 30);
    CHECK(rc == 0, "all_reduce f32 large op %d: %d", op, rc);
    for (size_t i = 0; i < big; i++) {
      double want = op == ST_COMM_MEAN ? 0 : (float) value(0, i);
      for (size_t r = 0; r < n; r++) {
        double x = (float) value(r, i);
        want = op == ST_COMM_MEAN  ? want + x / n
               : op == ST_COMM_MIN ? fmin(want, x)
                                   : fmax(want, x);
      }
      CHECK(fabs(v[i] - want) <= 1e-5 * (n + 1),
            "large op %d element %zu: %g vs %g", op, i, v[i], want);
    }
  }
  free(v);
  return 0;
}

static int check_rooted(st_comm_t* c, size_t n, size_t rank) {
  double d[50];
  for (size_t i = 0; i < 50; i++)
    d[i] = value(rank, i);
  uint32_t root = n > 1 ? 1 : 0;
  int rc = st_comm_reduce(c, NULL, root, d, 50, ST_COMM_F64, ST_COMM_MAX, 30);
  CHECK(rc == 0, "reduce: %d", rc);
  for (size_t i = 0; i < 50; i++) {
    double want = value(rank, i);
    if (rank == root)
      for (size_t r = 0; r < n; r++)
        want = fmax(want, value(r, i));
    CHECK(d[i] == want, "reduce element %zu on rank %zu", i, rank);
  }
  for (size_t big = 10; big <= 400000; big *= 40000) {
    float* v = malloc(big * sizeof(float));
    for (size_t i = 0; i < big; i++)
      v[i] = (float) value(rank, i);
    rc =
        st_comm_broadcast(c, NULL, (uint32_t) (n - 1), v, big, ST_COMM_F32, 30);
    CHECK(rc == 0, "broadcast of %zu: %d", big, rc);
    for (size_t i = 0; i < big; i++)
      CHECK(v[i] == (float) value(n - 1, i), "broadcast element %zu", i);
    free(v);
  }
  return 0;
}

static int check(st_comm_t* c, size_t n) {
  size_t rank = 0;
  CHECK(wait_members(c, n, &rank) == 0, "the node never saw %zu members", n);
  int rc = st_comm_barrier(c, NULL, 60);
  CHECK(rc == 0, "barrier: %d", rc);
  if (check_all_reduce(c, n, rank) || check_rooted(c, n, rank))
    return 1;
  uint32_t r, size;
  st_comm_last_group(c, &r, &size);
  CHECK(r == rank && size == n, "last group %u of %u", r, size);
  printf("ok rank %zu of %zu\n", rank, n);
  return 0;
}

static int bench(st_comm_t* c, size_t bytes, int reps, int lines) {
  size_t count = bytes / 4 > 0 ? bytes / 4 : 1;
  float* v = calloc(count, sizeof(float));
  double* t = calloc((size_t) reps, sizeof(double));
  if (st_comm_barrier(c, NULL, 60) != 0)
    return 1;
  for (int l = 0; l < lines; l++) {
    double cpu0 = cpu_s();
    for (int i = 0; i < reps; i++) {
      double t0 = now_s();
      if (st_comm_all_reduce(c, NULL, v, count, ST_COMM_F32, ST_COMM_SUM, 60)) {
        printf("error: %s\n", st_comm_error(c));
        return 1;
      }
      t[i] = now_s() - t0;
    }
    for (int i = 1; i < reps; i++)
      for (int j = i; j > 0 && t[j - 1] > t[j]; j--) {
        double x = t[j];
        t[j] = t[j - 1];
        t[j - 1] = x;
      }
    double cpu = (cpu_s() - cpu0) / reps;
    printf("allreduce bytes %zu seconds %.6f cpu_seconds %.6f\n", count * 4,
           t[reps / 2], cpu);
  }
  free(v);
  free(t);
  return 0;
}

/* ---- suite: the measurements of tools/bench/bench_collectives.sh ------- */

enum { S_BARRIER, S_BROADCAST, S_ALL_REDUCE, S_SELF };
static const char* const suite_names[] = {"barrier", "broadcast", "all_reduce",
                                          "self_all_reduce"};

/* Operations per round: ITERS for barriers, else capped to 4 MiB. */
static int suite_iters(int kind, size_t bytes, int iters) {
  if (kind == S_BARRIER)
    return iters;
  size_t cap = (4u << 20) / (bytes > 0 ? bytes : 1);
  return cap < 1 ? 1 : cap < (size_t) iters ? (int) cap : iters;
}

/* Fills v before a round: rank + 1 everywhere (all-reduce), the round's
 * number at the root and -1 elsewhere (broadcast). */
static void suite_fill(int kind, float* v, size_t count, size_t rank,
                       int round) {
  for (size_t i = 0; i < count; i++)
    v[i] = kind == S_BROADCAST ? (rank == 0 ? (float) round + 1 : -1.0f)
                               : (float) rank + 1;
}

/* The value every element holds after k operations of the round: exact in
 * float32 (a sum of n equal powers-of-two multiples). */
static float suite_want(int kind, size_t n, size_t rank, int round, int k) {
  if (kind == S_BROADCAST)
    return (float) round + 1;
  if (kind == S_SELF)
    return (float) rank + 1;
  double v = (double) n * (double) (n + 1) / 2;
  for (int i = 1; i < k; i++)
    v *= (double) n;
  return (float) v;
}

static int suite_op(st_comm_t* c, int kind, const char* self, float* v,
                    size_t count) {
  switch (kind) {
    case S_BARRIER:
      return st_comm_barrier(c, NULL, 120);
    case S_BROADCAST:
      return st_comm_broadcast(c, NULL, 0, v, count, ST_COMM_F32, 120);
    case S_ALL_REDUCE:
      return st_comm_all_reduce(c, NULL, v, count, ST_COMM_F32, ST_COMM_SUM,
                                120);
    default:
      return st_comm_all_reduce(c, self, v, count, ST_COMM_F32, ST_COMM_SUM,
                                120);
  }
}

/* The warm-up round (0) and the measured ones: their start and end times
 * into t[2r], t[2r + 1]. */
static int suite_rounds(st_comm_t* c, int kind, const char* self, size_t n,
                        size_t rank, float* v, size_t count, int rounds, int k,
                        double* t) {
  for (int r = 0; r <= rounds; r++) {
    suite_fill(kind, v, count, rank, r);
    CHECK(st_comm_barrier(c, NULL, 120) == 0, "barrier before a round");
    t[2 * r] = now_s();
    for (int i = 0; i < k; i++)
      CHECK(suite_op(c, kind, self, v, count) == 0, "%s of %zu bytes",
            suite_names[kind], count * 4);
    t[2 * r + 1] = now_s();
    float want = suite_want(kind, n, rank, r, k);
    for (size_t i = 0; i < count; i++)
      CHECK(v[i] == want, "%s of %zu bytes: element %zu is %g, want %g",
            suite_names[kind], count * 4, i, v[i], want);
  }
  return 0;
}

static void print_times(const double* t, int rounds, int which) {
  for (int r = 1; r <= rounds; r++)
    printf("%s%.9f", r > 1 ? ", " : "", t[2 * r + which]);
}

/* One operation and size: its rounds, then its JSON line. */
static int suite_one(st_comm_t* c, int kind, const char* self, size_t n,
                     size_t rank, size_t bytes, int rounds, int iters) {
  size_t count = kind == S_BARRIER ? 0 : bytes / 4;
  int k = suite_iters(kind, bytes, iters);
  float* v = malloc((count > 0 ? count : 1) * sizeof(float));
  double* t = malloc(2 * (size_t) (rounds + 1) * sizeof(double));
  int rc = 1;
  if (v == NULL || t == NULL)
    printf("FAIL: out of memory for %zu bytes\n", bytes);
  else
    rc = suite_rounds(c, kind, self, n, rank, v, count, rounds, k, t);
  if (rc == 0) {
    printf(
        "{\"system\": \"starling\", \"op\": \"%s\", \"bytes\": %zu, "
        "\"n\": %zu, \"rank\": %zu, \"iters\": %d, \"start\": [",
        suite_names[kind], count * 4, n, rank, k);
    print_times(t, rounds, 0);
    printf("], \"end\": [");
    print_times(t, rounds, 1);
    printf("]}\n");
  }
  free(v);
  free(t);
  return rc;
}

/* SIZES into bytes[0..*k): byte counts, multiples of 4, comma-separated. */
static int parse_sizes(const char* sizes, size_t* bytes, size_t cap,
                       size_t* k) {
  *k = 0;
  for (const char* p = sizes; *p != '\0' || *k == 0;) {
    char* end;
    unsigned long long b = strtoull(p, &end, 10);
    if (*k == cap || end == p || b < 4 || b % 4 != 0 || b > (1ull << 34) ||
        (*end != ',' && *end != '\0')) {
      printf(
          "FAIL: sizes \"%s\": byte counts, multiples of 4 (at most "
          "16 GiB, %zu of them), separated by commas\n",
          sizes, cap);
      return -1;
    }
    bytes[(*k)++] = (size_t) b;
    p = *end == ',' ? end + 1 : end;
  }
  return 0;
}

static int suite(st_comm_t* c, size_t n, const char* sizes, int rounds,
                 int iters) {
  size_t rank = 0, got = 0, bytes[16], nb;
  char ids[ST_COLL_PROBE_MAX][33];
  if (parse_sizes(sizes, bytes, 16, &nb) != 0)
    return 1;
  CHECK(n >= 1 && n <= ST_COLL_PROBE_MAX && rounds >= 1 && iters >= 1,
        "N %zu (1 to %d), ROUNDS %d and ITERS %d (at least 1)", n,
        ST_COLL_PROBE_MAX, rounds, iters);
  CHECK(wait_members(c, n, &rank) == 0, "the node never saw %zu members", n);
  CHECK(st_comm_members(c, ids, ST_COLL_PROBE_MAX, &got, &rank) == 0 &&
            got == n && rank < n,
        "members");
  if (suite_one(c, S_BARRIER, NULL, n, rank, 0, rounds, iters))
    return 1;
  for (size_t b = 0; b < nb; b++)
    for (int kind = S_BROADCAST; kind <= S_SELF; kind++)
      if (suite_one(c, kind, ids[rank], n, rank, bytes[b], rounds, iters))
        return 1;
  return 0;
}

/* publish NAME C, fetch PEER NAME C. */
static int store(st_comm_t* c, int argc, char** argv) {
  bool fetch = strcmp(argv[2], "fetch") == 0;
  if (argc < (fetch ? 6 : 5)) {
    fprintf(stderr, "comm_probe: publish NAME C | fetch PEER NAME C\n");
    return 2;
  }
  size_t count = (size_t) atol(argv[fetch ? 5 : 4]);
  float* v = calloc(count + 1, sizeof(float));
  if (v == NULL)
    return 2;
  for (size_t i = 0; i < count && !fetch; i++)
    v[i] = (float) i / 4.0f;
  int rc = fetch ? st_comm_fetch(c, argv[3], argv[4], v, count, ST_COMM_F32, 30)
                 : st_comm_publish(c, argv[3], v, count, ST_COMM_F32);
  size_t bad = 0;
  for (size_t i = 0; rc == 0 && fetch && i < count; i++)
    bad += v[i] != (float) i / 4.0f;
  if (rc != 0)
    printf("error: %s\n", st_comm_error(c));
  else if (bad > 0)
    printf("FAIL %zu of %zu elements differ\n", bad, count);
  else
    printf("ok\n");
  free(v);
  return rc != 0 ? 2 : bad > 0 ? 1 : 0;
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr,
            "usage: comm_probe SOCKET check N | count C | barrier T | "
            "publish NAME C | fetch PEER NAME C | bench BYTES REPS LINES | "
            "suite N SIZES ROUNDS ITERS\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  st_comm_t* c;
  char err[512];
  if (st_comm_open(argv[1], &c, err, sizeof err) != 0) {
    printf("error: %s\n", err);
    return 2;
  }
  int rc = 0;
  if (strcmp(argv[2], "check") == 0) {
    rc = check(c, (size_t) atoi(argv[3]));
  } else if (strcmp(argv[2], "count") == 0) {
    size_t count = (size_t) atol(argv[3]);
    float* v = calloc(count + 1, sizeof(float));
    rc = st_comm_all_reduce(c, NULL, v, count, ST_COMM_F32, ST_COMM_SUM, 30);
    if (rc == 0)
      printf("ok\n");
    else
      printf("error: %s\n", st_comm_error(c));
    rc = rc == 0 ? 0 : 2;
    free(v);
  } else if (strcmp(argv[2], "barrier") == 0) {
    rc = st_comm_barrier(c, NULL, atof(argv[3]));
    if (rc == 0)
      printf("ok\n");
    else
      printf("error: %s\n", st_comm_error(c));
    rc = rc == 0 ? 0 : 2;
  } else if (strcmp(argv[2], "suite") == 0 && argc >= 7) {
    rc =
        suite(c, (size_t) atoi(argv[3]), argv[4], atoi(argv[5]), atoi(argv[6]));
  } else if (strcmp(argv[2], "publish") == 0 || strcmp(argv[2], "fetch") == 0) {
    rc = store(c, argc, argv);
  } else if (strcmp(argv[2], "bench") == 0 && argc >= 6) {
    rc = bench(c, (size_t) atol(argv[3]), atoi(argv[4]), atoi(argv[5]));
  } else {
    fprintf(stderr, "comm_probe: unknown command %s\n", argv[2]);
    rc = 2;
  }
  st_comm_close(c);
  return rc;
}
