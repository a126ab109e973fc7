/* cli_keys.c: `starling keys`: the running node's cluster keys, changed live
 * (node/daemon/daemon_keys.c), like `serf keys`: list them (with which
 * members accept and send with each), install a new one, use it, remove
 * the old one; on this node, or with --cluster on every live member
 * (node/daemon/daemon_admin_net.c). Step by step, it rotates the cluster
 * key without a restart (docs/security.md, "Rotating the cluster key"). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli/cli.h"

static void usage(FILE* f, const char* cmd) {
  (void) cmd;
  fprintf(
      f,
      "usage: starling keys [--data-dir DIR | --control PATH] [--json]\n"
      "       starling keys [--cluster] install FILE | use ID | remove ID "
      "[...]\n"
      "\n"
      "The running node's cluster keys: one sends (seals packets and starts\n"
      "handshakes), a second may be accepted beside it. The listing also "
      "shows,\n"
      "from every live member's signed status, how many accept and send "
      "with\n"
      "each key. To rotate the cluster key without a restart, from any one "
      "node:\n"
      "  1. starling keys --cluster install new.key  (accepted, not yet "
      "used)\n"
      "  2. starling keys --cluster use ID           (ID from `starling "
      "keygen\n"
      "                                               --show new.key`)\n"
      "  3. starling keys --cluster remove OLD_ID\n"
      "Then restart nodes with --cluster-key new.key. Every member refuses\n"
      "a use before all accept the key, and a remove while any sends with "
      "it,\n"
      "so no step cuts a member off. Without --cluster the change is this\n"
      "node's alone (run it on every node; the way to leave a member out).\n"
      "\n"
      "  --cluster        ask every live member too; the answer lists each\n"
      "                   (done, already, refused: why, no answer: why)\n"
      "  --data-dir DIR   the node's data directory (default: "
      "./starling-data)\n"
      "  --control PATH   its control socket (default: DIR/control.sock)\n"
      "  --json           one JSON document ({\"keys\": [{\"id\": N, "
      "\"sends\": true}, ...],\n"
      "                   \"cluster\": {...}}; with --cluster, the members' "
      "answers)\n"
      "  -h, --help       this help\n"
      "Exit status: 0 done, 1 refused (the reason on stderr), a member "
      "refused\nor did not answer, or no node; 2 bad usage.\n");
}

/* The request line for argv[optind..]: "keys", "keys install /ABS",
 * "keys use ID", "keys remove ID". 0, or 2 after saying what is wrong. */
static int request(int argc, char** argv, int json, bool cluster, char* req,
                   size_t len) {
  const char* scope = cluster ? "keys cluster" : "keys";
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
    snprintf(req, len, "%s install %s%s", scope, path, tail);
    return 0;
  }
  snprintf(req, len, "%s %s %s%s", scope, verb, arg, tail);
  return 0;
}

int st__cmd_keys(int argc, char** argv) {
  bool cluster = st__take_flag(&argc, argv, "--cluster");
  const char* dir = "starling-data";
  const char* control = NULL;
  int json = 0;
  int done =
      st__control_flags("keys", argc, argv, usage, true, &dir, &control, &json);
  if (done >= 0)
    return done;
  char req[PATH_MAX + 64];
  int bad = request(argc, argv, json, cluster, req, sizeof req);
  if (bad != 0)
    return bad;
  return st__control_relay("keys", dir, control, req);
}
