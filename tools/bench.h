/* bench.h: the benchmarks of `starling-bench`, one per tools/bench_*.c.
 * Internal to tools/. Each takes argv with argv[0] = the benchmark's name
 * and returns the exit status (0, 1 failure, 2 bad usage). */
#ifndef STARLING_BENCH_H
#define STARLING_BENCH_H

int st__bench_train(int argc, char** argv);
int st__bench_crypto(int argc, char** argv);
int st__bench_exchange(int argc, char** argv);
int st__bench_ring(int argc, char** argv);

/* tools/bench_common.c */
#include <stddef.h>
#include <stdint.h>

/* The frames the exchange and ring benchmarks send: 1 MiB of plaintext. */
#define ST__BENCH_FRAME_BYTES (1024u * 1024u)
/* Writes or reads exactly n bytes (EINTR retried); -EIO otherwise. */
int st__bench_write_all(int fd, const uint8_t* p, size_t n);
int st__bench_read_all(int fd, uint8_t* p, size_t n);
/* Seal and open rates of the stream cipher on one core, bytes/s of
 * 1 MiB frames, best of 3 runs of 32 frames. */
void st__bench_aead_rates(double* seal_bps, double* open_bps);

#endif
