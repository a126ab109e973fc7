/* bench.c: `starling-bench`, the benchmark programs of starling. Speed is
 * measured here, in programs that print figures, never in timed tests
 * (docs/benchmarks.md records the figures and the commands).
 *
 * One binary with subcommands (dispatched by tools/cli/cli_common.c), each
 * in its own tools/bench/bench_*.c:
 *
 *   starling-bench train    training throughput (bench_train.c)
 *   starling-bench crypto   sealing, opening and handshakes (bench_crypto.c)
 *   starling-bench ring     ring all-reduce over encrypted TCP (bench_ring.c)
 *   starling-bench codec    codecs against encryption (bench_codec.c)
 */
#include "tools/bench/bench.h"
#include "tools/cli/cli.h"

static const st__subcommand_t commands[] = {
    {"train", st__bench_train,
     "training throughput (samples/s) of full training steps"},
    {"crypto", st__bench_crypto,
     "sealing and opening packets and stream frames, handshakes/s"},
    {"exchange", st__bench_exchange,
     "the floor for an averaging exchange: seal, send, open both ways"},
    {"ring", st__bench_ring,
     "ring all-reduce of N processes over encrypted TCP (busbw)"},
    {"codec", st__bench_codec,
     "encoding and decoding compressed deltas against sealing them"},
};

static const st__program_t bench = {
    .prog = "starling-bench",
    .intro =
        "usage: starling-bench <benchmark> [options]\n"
        "\n"
        "Benchmarks of starling; each prints its figures as a table, or "
        "as\n"
        "one JSON object with --json. Benchmarks:\n\n",
    .outro =
        "\nRun 'starling-bench <benchmark> --help' for its options.\n"
        "Figures and how they were taken: docs/benchmarks.md.\n",
    .noun = "benchmark",
    .commands = commands,
    .n_commands = sizeof(commands) / sizeof(commands[0]),
};

int main(int argc, char** argv) {
  return st__program_main(&bench, argc, argv);
}
