/* cli_monitor.c: `starling monitor`, the node's events as they happen, like
 * `serf monitor`: members that join, are suspected, die or leave;
 * averaging exchanges; ring rounds; refusals. It sends "monitor" (or
 * "monitor json") on the control socket (cli_control.c's
 * st__control_connect) and copies what the node streams
 * (node/daemon/daemon_events.c) to stdout, a line at a time, until Ctrl-C
 * or until the node stops.
 */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tools/cli/cli.h"

static void usage(FILE* f) {
  fputs(
      "usage: starling monitor [--data-dir DIR | --control PATH] "
      "[--json]\n"
      "\n"
      "Streams the node's events as they happen, one line each: members "
      "that join,\nare suspected, die or leave; averaging exchanges; "
      "ring rounds; packets,\nhandshakes and connections refused. It "
      "starts with the last events the node\nkept (up to 256) and runs "
      "until Ctrl-C, or until the node stops (exit 1).\n"
      "\n"
      "  --data-dir DIR   the node's data directory (default: "
      "./starling-data)\n"
      "  --control PATH   its control socket (default: "
      "DIR/control.sock)\n"
      "  --json           one JSON object a line: seq, time (Unix "
      "seconds), type,\n"
      "                   message\n"
      "  -h, --help       this help\n",
      f);
}

/* Returns -1 to go on, or the exit status. */
static int parse_flags(int argc, char** argv, const char** dir,
                       const char** control, bool* json) {
  static const struct option opts[] = {
      {"data-dir", required_argument, NULL, 'd'},
      {"control", required_argument, NULL, 'c'},
      {"json", no_argument, NULL, 'j'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (c) {
      case 'd':
        *dir = optarg;
        break;
      case 'c':
        *control = optarg;
        break;
      case 'j':
        *json = true;
        break;
      case 'h':
        usage(stdout);
        return 0;
      case ':':
        fprintf(stderr, "starling monitor: %s needs a value\n",
                argv[optind - 1]);
        return 2;
      default:
        fprintf(stderr,
                "starling monitor: unknown option '%s'; see 'starling "
                "monitor --help'\n",
                argv[optind - 1]);
        return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "starling monitor: unexpected argument '%s'\n",
            argv[optind]);
    return 2;
  }
  return -1;
}

/* Copies the stream to stdout, flushed a read at a time so that a pipe
 * sees each event when it happens. Returns the exit status. */
static int relay(int fd, const char* path) {
  char buf[16384];
  bool first = true;
  for (;;) {
    ssize_t r = read(fd, buf, sizeof(buf));
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    if (first && strncmp(buf, "error:", 6) == 0) {
      fprintf(stderr, "starling monitor: the node at '%s' answered: %.*s", path,
              (int) r, buf);
      return 1;
    }
    first = false;
    if (fwrite(buf, 1, (size_t) r, stdout) != (size_t) r || fflush(stdout))
      return 1; /* stdout closed (a pipe's reader went away) */
  }
  fprintf(stderr,
          "starling monitor: the node at '%s' closed the stream (it "
          "stopped)\n",
          path);
  return 1;
}

int st__cmd_monitor(int argc, char** argv) {
  const char* dir = "starling-data";
  const char* control = NULL;
  bool json = false;
  int rc = parse_flags(argc, argv, &dir, &control, &json);
  if (rc >= 0)
    return rc;
  char path[1024], err[2048];
  int fd = st__control_connect("monitor", dir, control, path, sizeof(path), err,
                               sizeof(err));
  if (fd < 0) {
    fputs(err, stderr);
    return fd == -2 ? 2 : 1;
  }
  const char* req = json ? "monitor json\n" : "monitor\n";
  if (send(fd, req, strlen(req), MSG_NOSIGNAL) != (ssize_t) strlen(req)) {
    fprintf(stderr, "starling monitor: cannot send to '%s': %s\n", path,
            strerror(errno));
    close(fd);
    return 1;
  }
  rc = relay(fd, path);
  close(fd);
  return rc;
}
