/* testutil.h: helpers shared by the Check suites: random inputs, float64
 * comparisons and scratch directories. Test-only code. */
#ifndef STARLING_TESTUTIL_H
#define STARLING_TESTUTIL_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

/* Seed for random inputs: fresh per run unless ST_TEST_SEED is set, and
 * printed once so that a failure can be replayed. */
uint64_t tu_seed(void);

/* A suite's main(): prints the seed once, before Check forks, then runs
 * the suite that make() builds. EXIT_SUCCESS when every test passed. */
int tu_main(Suite* (*make)(void) );

/* The number of CUDA devices, asked in a child process: CUDA does not
 * survive fork(), so a suite's main must not initialize it before Check
 * forks each test (every CUDA test would then fail with
 * cudaErrorInitializationError). 0 without CUDA. In testutil_cuda.c, linked
 * only into suites of layers that use the kernels. */
int tu_cuda_device_count(void);

/* Fills x[0..n) with uniform values in [lo, hi). */
void tu_fill_uniform(st_rng_t* rng, float* x, size_t n, float lo, float hi);

/* Returns the index of the first i with |ref[i] - got[i]| > atol +
 * rtol * |ref[i]| (or a NaN mismatch), or -1 when all are close. */
long tu_first_mismatch(const double* ref, const float* got, size_t n,
                       double atol, double rtol);

/* Creates a fresh directory under $TMPDIR (or /tmp) and writes its path
 * into buf. Returns 0 or -errno. */
int tu_mkdtemp(char* buf, size_t len);
/* Removes a directory made by tu_mkdtemp and everything in it. */
void tu_rmtree(const char* path);

/* Writes len bytes to path (creating or truncating). Returns 0 or -errno. */
int tu_write_file(const char* path, const void* data, size_t len);

#endif
