/* cli_force_leave.c: `starling force-leave ID`: asks the running node to
 * forget a member that failed and will not come back
 * (node/daemon/daemon_force_leave.c), like `serf force-leave`: it stops
 * listing it and trying to reconnect to it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli/cli.h"

static void usage(FILE* f, const char* cmd) {
  (void) cmd;
  fprintf(f,
          "usage: starling force-leave [--data-dir DIR | --control PATH] "
          "[--cluster] [--json] ID\n"
          "\n"
          "Makes the running node forget a member that failed and will not "
          "come back\n"
          "(a machine taken away): it stops listing it as dead and stops "
          "trying to\n"
          "reconnect to it, and takes it back only if it returns with a "
          "newer start.\n"
          "ID is the member's id or a unique prefix of it (4 or more hex "
          "digits,\n"
          "as `starling peers` prints them). A live member cannot be "
          "forced out: it\n"
          "leaves by itself (`starling leave` on its machine). Without "
          "--cluster\n"
          "the change is this node's alone.\n"
          "\n"
          "  --cluster        ask every live member too (each refuses if "
          "the member\n"
          "                   is alive there); the answer lists each: "
          "done, already\n"
          "                   (not known there), refused: why, no answer: "
          "why\n"
          "  --data-dir DIR   the node's data directory (default: "
          "./starling-data)\n"
          "  --control PATH   its control socket (default: "
          "DIR/control.sock)\n"
          "  --json           one JSON document ({\"forgotten\": ID})\n"
          "  -h, --help       this help\n"
          "Exit status: 0 forgotten, 1 refused (the reason on stderr), a "
          "member\nrefused or did not answer, or no node; 2 bad usage.\n");
}

int st__cmd_force_leave(int argc, char** argv) {
  bool cluster = st__take_flag(&argc, argv, "--cluster");
  const char* dir = "starling-data";
  const char* control = NULL;
  int json = 0;
  int done = st__control_flags("force-leave", argc, argv, usage, true, &dir,
                               &control, &json);
  if (done >= 0)
    return done;
  if (optind + 1 != argc || strchr(argv[optind], ' ') != NULL ||
      strchr(argv[optind], '\n') != NULL || strlen(argv[optind]) > 64) {
    fprintf(stderr, "starling force-leave: give one member ID\n");
    usage(stderr, "force-leave");
    return 2;
  }
  char req[128];
  snprintf(req, sizeof req, "force-leave %s%s%s\n", cluster ? "cluster " : "",
           argv[optind], json ? " json" : "");
  return st__control_relay("force-leave", dir, control, req);
}
