/* mpi_allreduce.c: the MPI twin of `starling-bench ring`, for
 * tools/bench/bench_ring.sh: MPI_Allreduce (MPI_SUM, MPI_FLOAT, in place) over
 * S MiB. Run with Open MPI's TCP transport only, e.g.
 *
 *   mpirun --allow-run-as-root --oversubscribe -np N --mca btl self,tcp \
 *       --mca btl_tcp_if_include lo mpi_allreduce --mib S --repeats R
 *
 * (btl self,tcp: no shared-memory shortcut between the ranks, so the bytes
 * go through the kernel's TCP as starling's and Gloo's do). UNENCRYPTED.
 * Open MPI picks its own algorithm for the size (coll/tuned: a ring or
 * Rabenseifner's reduce-scatter + all-gather for large messages); force
 * one with --mca coll_tuned_use_dynamic_rules 1 --mca
 * coll_tuned_allreduce_algorithm 4 (ring).
 *
 * Measured as starling-bench ring measures: the same data (st__ring_fill's
 * generator, same seed), one warm-up round then R measured, each after a
 * barrier; a round's time is max(end) - min(start) over the ranks
 * (CLOCK_MONOTONIC); median, algbw = bytes / time, busbw = algbw * 2 (N -
 * 1) / N. Every round's sum / N is checked against the float64 mean within
 * (n + 4) 2^-24; exit 1 on a mismatch.
 *
 * Build (tools/bench/bench_ring.sh does): mpicc -O3 mpi_allreduce.c -o
 * mpi_allreduce -lm
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* st__ring_fill, bit for bit. */
static void fill(uint64_t seed, uint32_t m, uint64_t count, float* out) {
  uint64_t base = seed ^ ((uint64_t) (m + 1) * 0xd1b54a32d192ed03ull);
  for (uint64_t i = 0; i < count; i++) {
    uint64_t z = mix64(base + i * 0x9e3779b97f4a7c15ull);
    out[i] = (float) ((int32_t) (z >> 40) - (1 << 23)) * 0x1p-23f;
  }
}

static int cmp_double(const void* x, const void* y) {
  double a = *(const double*) x, b = *(const double*) y;
  return (a > b) - (a < b);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  unsigned long long mib = 16, repeats = 3, seed = 6;
  int json = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc)
      mib = strtoull(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--repeats") == 0 && i + 1 < argc)
      repeats = strtoull(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
      seed = strtoull(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--json") == 0)
      json = 1;
    else {
      if (rank == 0)
        fprintf(stderr,
                "usage: mpi_allreduce --mib S --repeats R [--seed X] "
                "[--json]\n");
      MPI_Finalize();
      return 2;
    }
  }
  uint32_t n = (uint32_t) size;
  uint64_t floats = mib * 1024 * 1024 / sizeof(float);
  float* own = malloc(floats * sizeof(float));
  float* data = malloc(floats * sizeof(float));
  float* ref = malloc(floats * sizeof(float));
  double* acc = calloc(floats, sizeof(double));
  uint32_t rounds = (uint32_t) repeats + 1;
  double* neg_start = calloc(rounds, sizeof(double));
  double* end = calloc(rounds, sizeof(double));
  if (own == NULL || data == NULL || ref == NULL || acc == NULL ||
      neg_start == NULL || end == NULL || size < 2 || repeats < 1) {
    fprintf(stderr, "mpi_allreduce: out of memory or fewer than 2 ranks\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  /* The reference: the float64 mean of every rank's data. */
  for (uint32_t m = 0; m < n; m++) {
    fill(seed, m, floats, data);
    for (uint64_t i = 0; i < floats; i++)
      acc[i] += data[i];
  }
  for (uint64_t i = 0; i < floats; i++)
    ref[i] = (float) (acc[i] / n);
  free(acc);
  fill(seed, (uint32_t) rank, floats, own);

  double tol = (n + 4) * 0x1p-24, worst = 0;
  for (uint32_t k = 0; k < rounds; k++) {
    memcpy(data, own, floats * sizeof(float));
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now();
    MPI_Allreduce(MPI_IN_PLACE, data, (int) floats, MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
    end[k] = now();
    neg_start[k] = -t0;
    for (uint64_t i = 0; i < floats; i++) {
      double e = fabs((double) data[i] / n - (double) ref[i]);
      if (!(e <= worst))
        worst = isnan(e) ? INFINITY : e;
    }
  }
  MPI_Allreduce(MPI_IN_PLACE, neg_start, (int) rounds, MPI_DOUBLE, MPI_MAX,
                MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, end, (int) rounds, MPI_DOUBLE, MPI_MAX,
                MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  int status = 0;
  if (!(worst <= tol)) {
    if (rank == 0)
      fprintf(stderr,
              "mpi_allreduce: WRONG RESULT, max |sum/N - mean| %.3g > %.3g\n",
              worst, tol);
    status = 1;
  } else if (rank == 0) {
    double* t = calloc(repeats, sizeof(double));
    for (uint32_t k = 1; k < rounds; k++)
      t[k - 1] = end[k] + neg_start[k];
    qsort(t, repeats, sizeof(double), cmp_double);
    double med = t[repeats / 2];
    double bytes = (double) mib * 1024 * 1024;
    double algbw = bytes * 8 / med / 1e9;
    double busbw = algbw * 2.0 * (n - 1) / n;
    if (json)
      printf(
          "{\"system\":\"mpi\",\"members\":%u,\"mib\":%llu,\"repeats\":%llu,"
          "\"encrypted\":false,\"seconds_median\":%.6f,\"seconds_min\":%.6f,"
          "\"seconds_max\":%.6f,\"algbw_gbps\":%.4f,\"busbw_gbps\":%.4f,"
          "\"verified\":true,\"max_abs_err\":%.3g}\n",
          n, mib, repeats, med, t[0], t[repeats - 1], algbw, busbw, worst);
    else
      printf(
          "MPI_Allreduce (TCP, UNENCRYPTED): %u ranks, %llu MiB float32: "
          "median %.2f ms (min %.2f, max %.2f), algbw %.3f Gbit/s, busbw "
          "%.3f Gbit/s; checked (max |err| %.2g)\n",
          n, mib, med * 1e3, t[0] * 1e3, t[repeats - 1] * 1e3, algbw, busbw,
          worst);
    free(t);
  }
  free(own);
  free(data);
  free(ref);
  free(neg_start);
  free(end);
  MPI_Finalize();
  return status;
}
