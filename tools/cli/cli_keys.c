/* cli_keys.c: `starling keys`: the running node's cluster keys, changed live
 * (node/daemon/daemon_keys.c), like `serf keys`: list them, install a new
 * one, use it, remove the old one. Run on every node, step by step, it
 * rotates the cluster key without a restart (docs/security.md, "Rotating
 * the cluster key"). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli/cli.h"

static void usage(FILE* f, const char* cmd) {
  (void) cmd;
  fprintf(f,
          "usage: starling keys [--data-dir DIR | --control PATH] [--json]\n"
          "       starling keys install FILE | use ID | remove ID [...]\n"
          "\n"
          "The running node's cluster keys: one sends (seals packets and "
          "starts\n"
          "handshakes), a second may be accepted beside it. To rotate the "
          "cluster\n"
          "key without a restart, on every node in turn:\n"
          "  1. starling keys install new.key   (accepted, not yet used to "
          "send)\n"
          "  2. starling keys use ID            (once every node holds it; "
          "ID from\n"
          "                                      `starling keygen --show "
          "new.key`)\n"
          "  3. starling keys remove OLD_ID     (once every node sends with "
          "the new)\n"
          "Then restart nodes with --cluster-key new.key.\n"
          "\n"
          "  --data-dir DIR   the node's data directory (default: "
          "./starling-data)\n"
          "  --control PATH   its control socket (default: "
          "DIR/control.sock)\n"
          "  --json           one JSON document ({\"keys\": [{\"id\": N, "
          "\"sends\": true}, ...]})\n"
          "  -h, --help       this help\n"
          "Exit status: 0 done, 1 refused (the reason on stderr) or no node, "
          "2 bad usage.\n");
}

/* The request line for argv[optind..]: "keys", "keys install /ABS",
 * "keys use ID", "keys remove ID". 0, or 2 after saying what is wrong. */
static int request(int argc, char** argv, int json, char* req, size_t len) {
  int n = argc - optind;
  const char* verb = n > 0 ? argv[optind] : NULL;
  const char* arg = n > 1 ? argv[optind + 1] : NULL;
  const char* tail = json ? " json\n" : "\n";
  if (n == 0 || (n == 1 && strcmp(verb, "list") == 0)) {
    snprintf(req, len, "keys%s", tail);
    return 0;
  }
  bool known = strcmp(verb, "install") == 0 || strcmp(verb, "use") == 0 ||
               strcmp(verb, "remove") == 0;
  if (!known || n != 2) {
    fprintf(stderr,
            "starling keys: expected list, install FILE, use ID or remove "
            "ID\n");
    return 2;
  }
  if (strchr(arg, '\n') != NULL) {
    fprintf(stderr, "starling keys: '%s': no newline allowed\n", arg);
    return 2;
  }
  if (strcmp(verb, "install") == 0) {
    char path[PATH_MAX];
    if (realpath(arg, path) == NULL) {
      fprintf(stderr,
              "starling keys: cannot read the key file '%s'; make one with "
              "`starling keygen --cluster --out FILE`\n",
              arg);
      return 2;
    }
    snprintf(req, len, "keys install %s%s", path, tail);
    return 0;
  }
  snprintf(req, len, "keys %s %s%s", verb, arg, tail);
  return 0;
}

int st__cmd_keys(int argc, char** argv) {
  const char* dir = "starling-data";
  const char* control = NULL;
  int json = 0;
  int done =
      st__control_flags("keys", argc, argv, usage, true, &dir, &control, &json);
  if (done >= 0)
    return done;
  char req[PATH_MAX + 64];
  int bad = request(argc, argv, json, req, sizeof req);
  if (bad != 0)
    return bad;
  char* out = NULL;
  size_t len = 0;
  char err[2048];
  int rc =
      st__control_ask("keys", dir, control, req, &out, &len, err, sizeof err);
  if (rc != 0) {
    fputs(err, stderr);
    return rc == -2 ? 2 : 1;
  }
  /* A refusal in text is "error: ...", which st__control_ask returns as
   * its error; in JSON it is {"error": ...}, printed as it is. */
  bool refused = len >= 9 && memcmp(out, "{\"error\":", 9) == 0;
  fwrite(out, 1, len, stdout);
  free(out);
  return refused ? 1 : 0;
}
