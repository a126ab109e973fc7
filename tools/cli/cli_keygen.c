/* cli_keygen.c: `starling keygen`, which makes the secret keys of a
 * cluster and shows their public parts.
 *
 *   starling keygen --out node.key            a new node identity
 *   starling keygen --cluster --out cluster.key   a new cluster key
 *   starling keygen --show FILE               the public part of either
 *
 * A secret key is only ever written to a new file created with mode 0600
 * (crypto/keyfile.c), never to stdout where it would end up in terminal
 * scrollback, logs or a pipe, and an existing file is never overwritten.
 * What is printed is public: the node id and public key (the line an
 * operator pastes into an allow-list) or the cluster key's one-byte key id.
 * With --json one object goes to stdout instead.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "crypto/crypto.h"
#include "node/train/train.h"
#include "tools/cli/cli.h"

#define CMD "starling keygen"

/* The first words of the two kinds of key file (crypto.h). */
#define IDENTITY_HEADER "starling-identity-v1"
#define CLUSTER_HEADER "starling-cluster-key-v1"

static void usage(FILE* f) {
  fprintf(f,
          "usage: starling keygen --out FILE [--json]\n"
          "       starling keygen --cluster --out FILE [--json]\n"
          "       starling keygen --show FILE [--json]\n"
          "\n"
          "Makes a new node identity (an Ed25519 key pair; the node id is\n"
          "derived from its public key) or, with --cluster, a new cluster\n"
          "key (32 random bytes every member holds), and writes it to a new\n"
          "file with mode 0600. Prints the public part: the node id and the\n"
          "public key (the line to add to an allow-list), or the key id.\n"
          "\n"
          "  --out FILE    the new key file; required, and never overwritten\n"
          "                (secret keys are not written to stdout)\n"
          "  --cluster     make a cluster key instead of a node identity\n"
          "  --show FILE   print the public part of an existing identity or\n"
          "                cluster key file\n"
          "  --json        print one JSON object on stdout\n"
          "  -h, --help    this help\n"
          "\n"
          "Example:\n"
          "  starling keygen --cluster --out cluster.key   # once per "
          "cluster\n"
          "  starling keygen --out node.key                # once per node\n");
}

enum { OPT_OUT = 256, OPT_CLUSTER, OPT_SHOW, OPT_JSON };

static const struct option long_opts[] = {
    {"out", required_argument, NULL, OPT_OUT},
    {"cluster", no_argument, NULL, OPT_CLUSTER},
    {"show", required_argument, NULL, OPT_SHOW},
    {"json", no_argument, NULL, OPT_JSON},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

typedef struct {
  const char* out;
  const char* show;
  int cluster;
  int json;
} keygen_args_t;

/* Returns 0 to go on, -1 after --help, or the exit status 2. */
static int parse_args(int argc, char** argv, keygen_args_t* a) {
  memset(a, 0, sizeof(*a));
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", long_opts, NULL)) != -1) {
    switch (c) {
      case 'h':
        usage(stdout);
        return -1;
      case OPT_OUT:
        a->out = optarg;
        break;
      case OPT_CLUSTER:
        a->cluster = 1;
        break;
      case OPT_SHOW:
        a->show = optarg;
        break;
      case OPT_JSON:
        a->json = 1;
        break;
      case ':':
        fprintf(stderr, CMD ": %s needs a value\n", argv[optind - 1]);
        return 2;
      default:
        fprintf(stderr,
                CMD
                ": unknown option '%s'; see "
                "'" CMD " --help'\n",
                argv[optind - 1]);
        return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr,
            CMD
            ": unexpected argument '%s'; see "
            "'" CMD " --help'\n",
            argv[optind]);
    return 2;
  }
  if (a->show != NULL && (a->out != NULL || a->cluster)) {
    fprintf(stderr, CMD
            ": --show reads an existing key file (either kind); it "
            "takes neither --out nor --cluster\n");
    return 2;
  }
  if (a->show == NULL && (a->out == NULL || a->out[0] == '\0')) {
    fprintf(stderr, CMD
            ": --out FILE is required: secret keys are never written to "
            "stdout; they go to a new file created with mode 0600, e.g.\n"
            "  " CMD
            " --out node.key\n"
            "  " CMD " --cluster --out cluster.key\n");
    return 2;
  }
  return 0;
}

/* ---- Output
 * ------------------------------------------------------------------------ */

static void print_identity(const char* path, const st_identity_t* id, int json,
                           int written) {
  char hex[33];
  char pk[44];
  st_node_id_format(&id->id, hex);
  st_public_key_format(id->public_key, pk);
  if (json) {
    fputs("{\"kind\":\"identity\",\"path\":", stdout);
    st_json_write_string(stdout, path);
    printf(",\"node_id\":\"%s\",\"public_key\":\"%s\"}\n", hex, pk);
    return;
  }
  if (written)
    printf("wrote a new node identity to %s (mode 0600)\n", path);
  else
    printf("node identity %s\n", path);
  printf(
      "node id     %s\n"
      "public key  %s\n"
      "\n"
      "For a cluster with an allow-list, add this line to it:\n"
      "%s  # node %s\n",
      hex, pk, pk, hex);
}

static void print_cluster_key(const char* path, const st_cluster_key_t* key,
                              int json, int written) {
  if (json) {
    fputs("{\"kind\":\"cluster-key\",\"path\":", stdout);
    st_json_write_string(stdout, path);
    printf(",\"key_id\":%u}\n", (unsigned) key->id);
    return;
  }
  if (written)
    printf("wrote a new cluster key to %s (mode 0600)\n", path);
  else
    printf("cluster key %s\n", path);
  printf("key id      %u\n", (unsigned) key->id);
  if (written)
    printf(
        "\nCopy this file over a secure channel to every member of the\n"
        "cluster and keep it mode 0600: whoever holds it can join.\n");
}

/* ---- Commands
 * ---------------------------------------------------------------------- */

static int generate(const keygen_args_t* a) {
  char err[512];
  int rc;
  if (a->cluster) {
    st_cluster_key_t key;
    rc = st_cluster_key_generate(&key);
    if (rc == 0)
      rc = st_cluster_key_write(a->out, &key, err, sizeof(err));
    else
      snprintf(err, sizeof(err), "cannot generate a key: %s", strerror(-rc));
    if (rc == 0)
      print_cluster_key(a->out, &key, a->json, 1);
    st_cluster_key_wipe(&key);
  } else {
    st_identity_t id;
    rc = st_identity_generate(&id);
    if (rc == 0)
      rc = st_identity_write(a->out, &id, err, sizeof(err));
    else
      snprintf(err, sizeof(err), "cannot generate a key: %s", strerror(-rc));
    if (rc == 0)
      print_identity(a->out, &id, a->json, 1);
    st_identity_wipe(&id);
  }
  if (rc != 0) {
    fprintf(stderr, CMD ": %s\n", err);
    return 1;
  }
  return 0;
}

/* Which kind of key file path is, from its first word: 1 identity,
 * 2 cluster key, 0 neither, -1 unreadable. Only the header is looked at;
 * the load that follows makes every check (mode, type, contents). */
static int peek_kind(const char* path) {
  char head[64];
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return -1;
  ssize_t n = read(fd, head, sizeof(head) - 1);
  close(fd);
  if (n < 0)
    return -1;
  head[n] = '\0';
  size_t il = strlen(IDENTITY_HEADER);
  size_t cl = strlen(CLUSTER_HEADER);
  if (strncmp(head, IDENTITY_HEADER, il) == 0 &&
      (head[il] == ' ' || head[il] == '\t'))
    return 1;
  if (strncmp(head, CLUSTER_HEADER, cl) == 0 &&
      (head[cl] == ' ' || head[cl] == '\t'))
    return 2;
  return 0;
}

static int show(const keygen_args_t* a) {
  char err[512];
  int kind = peek_kind(a->show);
  int rc;
  if (kind == 2) {
    st_cluster_key_t key;
    rc = st_cluster_key_load(a->show, &key, err, sizeof(err));
    if (rc == 0)
      print_cluster_key(a->show, &key, a->json, 0);
    st_cluster_key_wipe(&key);
  } else {
    /* An identity, or neither: the identity loader's message then says
     * what is wrong (missing, a directory, the mode, the header). */
    st_identity_t id;
    rc = st_identity_load(a->show, &id, err, sizeof(err));
    if (rc == 0)
      print_identity(a->show, &id, a->json, 0);
    st_identity_wipe(&id);
  }
  if (rc != 0) {
    fprintf(stderr, CMD ": %s%s\n", err,
            kind == 0 && rc == -EBADMSG
                ? "; --show reads the files `starling keygen` writes "
                  "(first word '" IDENTITY_HEADER "' or '" CLUSTER_HEADER "')"
                : "");
    return 1;
  }
  return 0;
}

int st__cmd_keygen(int argc, char** argv) {
  keygen_args_t a;
  int rc = parse_args(argc, argv, &a);
  if (rc != 0)
    return rc < 0 ? 0 : rc;
  if (st_crypto_init() != 0) {
    fprintf(stderr, CMD ": cannot start libsodium\n");
    return 1;
  }
  return a.show != NULL ? show(&a) : generate(&a);
}
