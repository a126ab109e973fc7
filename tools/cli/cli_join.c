/* cli_join.c: `starling join HOST:PORT...`: asks a running node to join (or
 * rejoin) a cluster through the seeds given (node/daemon/daemon_control.c,
 * "join"), like `serf join`. The node resolves names and answers at once;
 * `starling peers` then shows who answered. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli/cli.h"

static void usage(FILE* f, const char* cmd) {
  (void) cmd;
  fprintf(f,
          "usage: starling join [--data-dir DIR | --control PATH] [--json] "
          "HOST:PORT...\n"
          "\n"
          "Asks the running node to join a cluster through these seeds (up "
          "to 16; HOST an\n"
          "address or a name): a node started alone, or cut off from its "
          "cluster.\n"
          "\n"
          "  --data-dir DIR   the node's data directory (default: "
          "./starling-data)\n"
          "  --control PATH   its control socket (default: "
          "DIR/control.sock)\n"
          "  --json           one JSON document ({\"joining\": N})\n"
          "  -h, --help       this help\n");
}

int st__cmd_join(int argc, char** argv) {
  const char* dir = "starling-data";
  const char* control = NULL;
  int json = 0;
  int done =
      st__control_flags("join", argc, argv, usage, true, &dir, &control, &json);
  if (done >= 0)
    return done;
  if (optind >= argc) {
    fprintf(stderr, "starling join: give at least one HOST:PORT\n");
    usage(stderr, "join");
    return 2;
  }
  char req[2048];
  size_t at = (size_t) snprintf(req, sizeof req, "join");
  for (int i = optind; i < argc; i++) {
    if (strchr(argv[i], ' ') != NULL || strchr(argv[i], '\n') != NULL ||
        at + strlen(argv[i]) + 8 >= sizeof req) {
      fprintf(stderr, "starling join: '%s' is not HOST:PORT\n", argv[i]);
      return 2;
    }
    at += (size_t) snprintf(req + at, sizeof req - at, " %s", argv[i]);
  }
  snprintf(req + at, sizeof req - at, "%s\n", json ? " json" : "");
  return st__control_relay("join", dir, control, req);
}
