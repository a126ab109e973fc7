/* bench.h: the benchmarks of `starling-bench`, one per tools/bench_*.c.
 * Internal to tools/. Each takes argv with argv[0] = the benchmark's name
 * and returns the exit status (0, 1 failure, 2 bad usage). */
#ifndef STARLING_BENCH_H
#define STARLING_BENCH_H

int st__bench_train(int argc, char** argv);
int st__bench_crypto(int argc, char** argv);
int st__bench_exchange(int argc, char** argv);
int st__bench_ring(int argc, char** argv);

#endif
