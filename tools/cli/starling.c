/* starling.c: entry point of the `starling` command. One binary with
 * subcommands, like `serf agent` / `serf members`: this file only
 * dispatches; each subcommand lives in its own tools/cli_*.c. */
#include <stdio.h>
#include <string.h>

#include "tools/cli/cli.h"

#ifndef ST_VERSION
#define ST_VERSION "unknown"
#endif

static const struct {
  const char* name;
  int (*run)(int argc, char** argv);
  const char* summary;
} commands[] = {
    {"node", st__cmd_node,
     "run a node: join a cluster, train, average with peers"},
    {"status", st__cmd_status, "show this node: step, loss, exchanges, ..."},
    {"peers", st__cmd_peers, "show every member this node knows"},
    {"leave", st__cmd_leave, "tell the node to leave the cluster and stop"},
    {"train", st__cmd_train,
     "train a model on this machine (local SGD, CPU or GPU)"},
    {"keygen", st__cmd_keygen,
     "make a node identity or cluster key file; show its public part"},
};

static void usage(FILE* f) {
  fprintf(f,
          "usage: starling <command> [options]\n"
          "\n"
          "starling trains one model across peer machines with local SGD and\n"
          "gossip averaging. Commands:\n\n");
  for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
    fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
  fprintf(f,
          "  %-10s print the version\n"
          "\n"
          "Run 'starling <command> --help' for the options of a command.\n",
          "version");
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
  if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
    printf("starling %s\n", ST_VERSION);
    return 0;
  }
  for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
    if (strcmp(cmd, commands[i].name) == 0)
      return commands[i].run(argc - 1, argv + 1);
  fprintf(stderr, "starling: unknown command '%s'\n\n", cmd);
  usage(stderr);
  return 2;
}
