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
 *   comm_probe SOCKET bench S R ITERS  all-reduce of S bytes (float32) R
 *                               times per line of output, ITERS lines:
 *                               "allreduce bytes S seconds X" (median)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/starling/client.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
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
    printf("allreduce bytes %zu seconds %.6f\n", count * 4, t[reps / 2]);
  }
  free(v);
  free(t);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr,
            "usage: comm_probe SOCKET check N | count C | barrier T | "
            "bench BYTES REPS LINES\n");
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
  } else if (strcmp(argv[2], "bench") == 0 && argc >= 6) {
    rc = bench(c, (size_t) atol(argv[3]), atoi(argv[4]), atoi(argv[5]));
  } else {
    fprintf(stderr, "comm_probe: unknown command %s\n", argv[2]);
    rc = 2;
  }
  st_comm_close(c);
  return rc;
}
