/* cli_control.c: `starling status`, `starling peers` and `starling leave`:
 * clients of a running node's control socket (node/daemon/daemon_control.c).
 * The node renders the answer (a table, or JSON with --json); these commands
 * send one request line and copy the answer to stdout; `status --field
 * KEY` prints one value of the JSON document instead (for shell scripts).
 * st__control_connect and st__control_ask (cli.h) are the same client for
 * other commands (`starling top`, cli_top.c). */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "tools/cli/cli.h"

/* A node that does not answer within this long is reported as stuck. */
#define ANSWER_TIMEOUT_MS 10000

static void usage(FILE* f, const char* cmd) {
  const char* what = strcmp(cmd, "status") == 0
                         ? "this node: id, address, state, step, loss, test "
                           "accuracy,\nsamples/s, exchanges, traffic, "
                           "rejected packets by reason, peers"
                     : strcmp(cmd, "peers") == 0
                         ? "every member this node knows: id, address, "
                           "state, step, loss,\naccuracy, last heard"
                         : "asks the node to leave the cluster: it announces "
                           "its leave, writes a\ncheckpoint and exits";
  bool status = strcmp(cmd, "status") == 0;
  fprintf(f,
          "usage: starling %s [--data-dir DIR | --control PATH]%s\n"
          "\n"
          "Shows %s.\n"
          "\n"
          "  --data-dir DIR   the node's data directory (default: "
          "./starling-data)\n"
          "  --control PATH   its control socket (default: "
          "DIR/control.sock)\n"
          "%s%s"
          "  -h, --help       this help\n",
          cmd,
          strcmp(cmd, "leave") == 0 ? ""
          : status                  ? " [--json | --field KEY]"
                                    : " [--json]",
          what,
          strcmp(cmd, "leave") == 0
              ? ""
              : "  --json           one JSON document instead of a table\n",
          status ? "  --field KEY      only the value of KEY in that document "
                   "(a.b for a nested\n"
                   "                   one): a number, true/false, null or "
                   "the text of a string;\n"
                   "                   exit status 1 when there is no such "
                   "key\n"
                 : "");
}

/* st__control_flags, and --field KEY into *field when field is not NULL
 * (`status` only; for the others it is an unknown option). */
static int control_flags(const char* cmd, int argc, char** argv,
                         void (*help)(FILE*, const char*), bool args,
                         const char** dir, const char** control, int* json,
                         const char** field) {
  static const struct option opts[] = {
      {"data-dir", required_argument, NULL, 'd'},
      {"control", required_argument, NULL, 'c'},
      {"json", no_argument, NULL, 'j'},
      {"field", required_argument, NULL, 'f'},
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
        *json = 1;
        break;
      case 'f':
        if (field == NULL) {
          fprintf(stderr,
                  "starling %s: unknown option '--field'; see 'starling %s "
                  "--help'\n",
                  cmd, cmd);
          return 2;
        }
        *field = optarg;
        break;
      case 'h':
        help(stdout, cmd);
        return 0;
      case ':':
        fprintf(stderr, "starling %s: %s needs a value\n", cmd,
                argv[optind - 1]);
        return 2;
      default:
        fprintf(stderr,
                "starling %s: unknown option '%s'; see 'starling %s "
                "--help'\n",
                cmd, argv[optind - 1], cmd);
        return 2;
    }
  }
  if (!args && optind < argc) {
    fprintf(stderr, "starling %s: unexpected argument '%s'\n", cmd,
            argv[optind]);
    return 2;
  }
  return -1;
}

int st__control_flags(const char* cmd, int argc, char** argv,
                      void (*help)(FILE*, const char*), bool args,
                      const char** dir, const char** control, int* json) {
  return control_flags(cmd, argc, argv, help, args, dir, control, json, NULL);
}

bool st__take_flag(int* argc, char** argv, const char* flag) {
  bool found = false;
  int out = 1;
  for (int i = 1; i < *argc; i++) {
    if (strcmp(argv[i], "--") == 0) {
      while (i < *argc)
        argv[out++] = argv[i++];
      break;
    }
    if (strcmp(argv[i], flag) == 0)
      found = true;
    else
      argv[out++] = argv[i];
  }
  *argc = out;
  argv[out] = NULL;
  return found;
}

int st__control_relay(const char* cmd, const char* dir, const char* control,
                      const char* req) {
  char* out = NULL;
  size_t len = 0;
  char err[2048];
  int rc = st__control_ask(cmd, dir, control, req, &out, &len, err, sizeof err);
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

int st__control_connect(const char* cmd, const char* dir, const char* control,
                        char* path, size_t path_len, char* err,
                        size_t err_len) {
  if (control != NULL)
    snprintf(path, path_len, "%s", control);
  else
    snprintf(path, path_len, "%s/control.sock", dir);
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof(sa));
  sa.sun_family = AF_UNIX;
  if (strlen(path) >= sizeof(sa.sun_path)) {
    snprintf(err, err_len,
             "starling %s: control socket path '%s' is too long\n", cmd, path);
    return -2;
  }
  memcpy(sa.sun_path, path, strlen(path) + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, (struct sockaddr*) &sa, sizeof(sa)) != 0) {
    int e = errno;
    if (fd >= 0)
      close(fd);
    snprintf(err, err_len,
             "starling %s: no node is running at '%s' (%s).\n"
             "Start one with 'starling node --data-dir %s --listen "
             "HOST:PORT --cluster-key FILE ...',\n"
             "or point at a running node with --data-dir DIR or --control "
             "PATH.\n",
             cmd, path, strerror(e), control != NULL ? "DIR" : dir);
    return -1;
  }
  return fd;
}

/* Sends the request line req (with its newline) on fd. 0, or -1 with the
 * message in err. */
static int send_request(const char* cmd, int fd, const char* path,
                        const char* req, char* err, size_t err_len) {
  size_t n = strlen(req);
  /* MSG_NOSIGNAL: a node that closed the socket (it is leaving) gives
   * EPIPE and the message below, not a SIGPIPE death. */
  if (send(fd, req, n, MSG_NOSIGNAL) != (ssize_t) n) {
    snprintf(err, err_len, "starling %s: cannot send to '%s': %s\n", cmd, path,
             strerror(errno));
    return -1;
  }
  return 0;
}

/* Reads the node's whole answer on fd into *out (malloc'd, NUL-terminated)
 * until it closes the socket. 0, or -1 with the message in err. */
static int read_answer(const char* cmd, int fd, const char* path, char** out,
                       size_t* out_len, char* err, size_t err_len) {
  st_json_buf_t b;
  st_json_buf_init(&b);
  char buf[65536];
  for (;;) {
    struct pollfd p = {fd, POLLIN, 0};
    int pr = poll(&p, 1, ANSWER_TIMEOUT_MS);
    if (pr < 0 && errno == EINTR)
      continue;
    if (pr == 0) {
      snprintf(err, err_len,
               "starling %s: the node at '%s' did not answer within %d s\n",
               cmd, path, ANSWER_TIMEOUT_MS / 1000);
      st_json_buf_free(&b);
      return -1;
    }
    ssize_t r = read(fd, buf, sizeof(buf));
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    st_json_buf_append(&b, buf, (size_t) r);
  }
  st_json_buf_append(&b, "", 1); /* the NUL */
  if (b.failed) {
    snprintf(err, err_len, "starling %s: out of memory\n", cmd);
    st_json_buf_free(&b);
    return -1;
  }
  *out = b.p;
  *out_len = b.len - 1;
  return 0;
}

int st__control_ask(const char* cmd, const char* dir, const char* control,
                    const char* req, char** out, size_t* out_len, char* err,
                    size_t err_len) {
  char path[1024];
  *out = NULL;
  *out_len = 0;
  int fd =
      st__control_connect(cmd, dir, control, path, sizeof(path), err, err_len);
  if (fd < 0)
    return fd;
  int rc = send_request(cmd, fd, path, req, err, err_len);
  if (rc == 0)
    rc = read_answer(cmd, fd, path, out, out_len, err, err_len);
  close(fd);
  if (rc == 0 && *out_len == 0) {
    snprintf(err, err_len,
             "starling %s: the node at '%s' closed the connection without "
             "answering (is it stopping?)\n",
             cmd, path);
    rc = -1;
  } else if (rc == 0 && strncmp(*out, "error:", 6) == 0) {
    snprintf(err, err_len, "starling %s: the node at '%s' answered: %s", cmd,
             path, *out);
    free(*out);
    *out = NULL;
    rc = -1;
  }
  if (rc != 0) {
    free(*out);
    *out = NULL;
  }
  return rc;
}

/* Copies the node's answer on fd to stdout until the node closes the
 * socket. Returns the exit status: 1 when the answer is an error or the node
 * does not answer in time. */
static int relay_answer(const char* cmd, int fd, const char* path) {
  char buf[65536];
  int status = 0;
  for (;;) {
    struct pollfd p = {fd, POLLIN, 0};
    int pr = poll(&p, 1, ANSWER_TIMEOUT_MS);
    if (pr == 0) {
      fprintf(stderr,
              "starling %s: the node at '%s' did not answer within "
              "%d s\n",
              cmd, path, ANSWER_TIMEOUT_MS / 1000);
      status = 1;
      break;
    }
    ssize_t r = read(fd, buf, sizeof(buf));
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    if (strncmp(buf, "error:", 6) == 0)
      status = 1;
    fwrite(buf, 1, (size_t) r, stdout);
  }
  return status;
}

/* Prints the value at the dotted path `field` of the JSON document doc
 * (len bytes): numbers as the shortest text that reads back the same
 * (integers whole), true/false/null, strings as their text. Returns the
 * exit status: 0, or 1 (said on stderr) when the document does not parse,
 * a key is missing or the value is an object or an array. */
static int print_field(const char* cmd, const char* doc, size_t len,
                       const char* field) {
  st_json_doc_t* parsed = NULL;
  char err[256];
  st_json_limits_t lim = {.max_depth = 16, .max_values = 1u << 20};
  if (st_json_parse_inexact(doc, len, &lim, &parsed, err, sizeof(err)) != 0) {
    fprintf(stderr, "starling %s: the node's answer is not JSON: %s\n", cmd,
            err);
    return 1;
  }
  const st_json_t* v = st_json_root(parsed);
  char key[256];
  for (const char* p = field; v != NULL;) {
    size_t n = strcspn(p, ".");
    snprintf(key, sizeof(key), "%.*s", (int) n, p);
    v = v->type == ST_JSON_OBJECT ? st_json_get(v, key) : NULL;
    if (p[n] == '\0')
      break;
    p += n + 1;
  }
  int rc = 0;
  if (v == NULL) {
    fprintf(stderr, "starling %s: no field '%s' in the node's status\n", cmd,
            field);
    rc = 1;
  } else if (v->type == ST_JSON_OBJECT || v->type == ST_JSON_ARRAY) {
    fprintf(stderr,
            "starling %s: '%s' is an %s; name one of its fields, or use "
            "--json\n",
            cmd, field, v->type == ST_JSON_OBJECT ? "object" : "array");
    rc = 1;
  } else if (v->type == ST_JSON_NUMBER && v->is_int) {
    printf("%lld\n", (long long) v->integer);
  } else if (v->type == ST_JSON_NUMBER) {
    char num[32];
    for (int prec = 1; prec <= 17; prec++) {
      snprintf(num, sizeof(num), "%.*g", prec, v->number);
      if (strtod(num, NULL) == v->number)
        break;
    }
    printf("%s\n", num);
  } else if (v->type == ST_JSON_BOOL) {
    puts(v->boolean ? "true" : "false");
  } else {
    puts(v->type == ST_JSON_NULL ? "null" : v->str);
  }
  st_json_free(parsed);
  return rc;
}

/* `status --field KEY`: asks for the JSON status and prints one value. */
static int run_field(const char* cmd, const char* dir, const char* control,
                     const char* field) {
  char* out = NULL;
  size_t len = 0;
  char err[2048];
  int rc = st__control_ask(cmd, dir, control, "status json\n", &out, &len, err,
                           sizeof(err));
  if (rc != 0) {
    fputs(err, stderr);
    return rc == -2 ? 2 : 1;
  }
  rc = print_field(cmd, out, len, field);
  free(out);
  return rc;
}

static int run(const char* cmd, int argc, char** argv) {
  const char* dir = "starling-data";
  const char* control = NULL;
  const char* field = NULL;
  int json = 0;
  int rc = control_flags(cmd, argc, argv, usage, false, &dir, &control, &json,
                         strcmp(cmd, "status") == 0 ? &field : NULL);
  if (rc >= 0)
    return rc;
  if (field != NULL && json) {
    fprintf(stderr, "starling %s: --field and --json exclude each other\n",
            cmd);
    return 2;
  }
  if (field != NULL)
    return run_field(cmd, dir, control, field);
  char path[1024], err[2048];
  int fd = st__control_connect(cmd, dir, control, path, sizeof(path), err,
                               sizeof(err));
  if (fd < 0) {
    fputs(err, stderr);
    return fd == -2 ? 2 : 1;
  }
  char req[64];
  snprintf(req, sizeof(req), "%s%s\n", cmd, json ? " json" : "");
  if (send_request(cmd, fd, path, req, err, sizeof(err)) != 0) {
    fputs(err, stderr);
    close(fd);
    return 1;
  }
  int status = relay_answer(cmd, fd, path);
  close(fd);
  return status;
}

int st__cmd_status(int argc, char** argv) {
  return run("status", argc, argv);
}

int st__cmd_peers(int argc, char** argv) {
  return run("peers", argc, argv);
}

int st__cmd_leave(int argc, char** argv) {
  return run("leave", argc, argv);
}
