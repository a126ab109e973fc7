/* bench.c: `starling-bench`, the benchmark programs of starling. Speed is
 * measured here, in programs that print figures, never in timed tests
 * (docs/benchmarks.md records the figures and the commands).
 *
 * One binary with subcommands, each in its own tools/bench_*.c:
 *
 *   starling-bench train    training throughput (bench_train.c)
 *   starling-bench crypto   sealing, opening and handshakes (bench_crypto.c)
 *   starling-bench ring     ring all-reduce over encrypted TCP (bench_ring.c)
 */
#include <stdio.h>
#include <string.h>

#include "tools/bench/bench.h"

static const struct {
  const char* name;
  int (*run)(int argc, char** argv);
  const char* summary;
} commands[] = {
    {"train", st__bench_train,
     "training throughput (samples/s) of full training steps"},
    {"crypto", st__bench_crypto,
     "sealing and opening packets and stream frames, handshakes/s"},
    {"exchange", st__bench_exchange,
     "the floor for an averaging exchange: seal, send, open both ways"},
    {"ring", st__bench_ring,
     "ring all-reduce of N processes over encrypted TCP (busbw)"},
};

static void usage(FILE* f) {
  fprintf(f,
          "usage: starling-bench <benchmark> [options]\n"
          "\n"
          "Benchmarks of starling; each prints its figures as a table, or as\n"
          "one JSON object with --json. Benchmarks:\n\n");
  for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
    fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
  fprintf(f,
          "\nRun 'starling-bench <benchmark> --help' for its options.\n"
          "Figures and how they were taken: docs/benchmarks.md.\n");
}

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char* cmd = argv[1];
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 ||
      strcmp(cmd, "help") == 0) {
    usage(stdout);
    return 0;
  }
  for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
    if (strcmp(cmd, commands[i].name) == 0)
      return commands[i].run(argc - 1, argv + 1);
  fprintf(stderr, "starling-bench: unknown benchmark '%s'\n\n", cmd);
  usage(stderr);
  return 2;
}
