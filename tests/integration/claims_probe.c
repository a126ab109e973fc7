/* claims_probe.c: a test client that forges membership claims about one
 * member of a running cluster, as a cluster-key holder would, and sends
 * them to another member (tests/integration/test_node_forged_claims.sh).
 *
 *   claims_probe --cluster-key PATH --to HOST:PORT --to-id HEX
 *                --victim-identity PATH --victim-inc N
 *
 * With a fresh identity of its own (a key holder, but not the victim), it
 * seals for node --to-id at HOST:PORT one UDP packet holding, about the
 * victim (whose identity file it reads for its public key only; it signs
 * nothing with it):
 *   ALIVE   incarnation 2^64-1, address 127.0.0.1:9, signed by the probe
 *   STATUS  seq 2^64-1, step 2^40, fingerprint ee..ee, signed by the probe
 *   SUSPECT incarnation 2^64-1, from the probe
 *   DEAD    a leave (from = the victim) at incarnation N, the victim's
 *           current one, signed by the probe
 * and sends it three times (fresh counters), 100 ms apart. Each claim
 * needs the victim's signature (or, for the SUSPECT, an incarnation the
 * victim signed), so a node must refuse all four and count them
 * (membership_bad_signature, membership_beyond_signed). Prints
 * {"sent":3,"bytes":B} and exits 0; 1 when a key or the socket fails, 2
 * on bad usage. */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "crypto/crypto.h"
#include "gossip/gossip.h"

static int usage(const char* why) {
  fprintf(stderr,
          "claims_probe: %s\nusage: claims_probe --cluster-key PATH --to "
          "HOST:PORT --to-id HEX --victim-identity PATH --victim-inc N\n",
          why);
  return 2;
}

typedef struct {
  const char *key_path, *to, *to_id, *victim_path;
  uint64_t victim_inc;
} args_t;

static int parse_args(int argc, char** argv, args_t* a) {
  memset(a, 0, sizeof(*a));
  if (argc % 2 == 0)
    return usage("every option takes a value");
  for (int i = 1; i + 1 < argc; i += 2) {
    const char* k = argv[i];
    const char* v = argv[i + 1];
    if (strcmp(k, "--cluster-key") == 0)
      a->key_path = v;
    else if (strcmp(k, "--to") == 0)
      a->to = v;
    else if (strcmp(k, "--to-id") == 0)
      a->to_id = v;
    else if (strcmp(k, "--victim-identity") == 0)
      a->victim_path = v;
    else if (strcmp(k, "--victim-inc") == 0)
      a->victim_inc = strtoull(v, NULL, 10);
    else
      return usage("unknown option");
  }
  if (!a->key_path || !a->to || !a->to_id || !a->victim_path)
    return usage("every option is required");
  return 0;
}

static int parse_id(const char* hex, st_node_id_t* id) {
  if (strlen(hex) != 2 * ST_NODE_ID_BYTES)
    return -1;
  for (int i = 0; i < ST_NODE_ID_BYTES; i++) {
    unsigned v;
    if (sscanf(hex + 2 * i, "%2x", &v) != 1)
      return -1;
    id->b[i] = (uint8_t) v;
  }
  return 0;
}

static int parse_addr(const char* hostport, struct sockaddr_in* a) {
  char host[64];
  const char* colon = strrchr(hostport, ':');
  if (colon == NULL || (size_t) (colon - hostport) >= sizeof(host))
    return -1;
  memcpy(host, hostport, (size_t) (colon - hostport));
  host[colon - hostport] = '\0';
  memset(a, 0, sizeof(*a));
  a->sin_family = AF_INET;
  a->sin_port = htons((uint16_t) atoi(colon + 1));
  return inet_pton(AF_INET, host, &a->sin_addr) == 1 ? 0 : -1;
}

/* The four forged claims about the victim, back to back, into buf. */
static size_t forge(const st_identity_t* me, const st_identity_t* victim,
                    uint64_t victim_inc, uint8_t* buf, size_t cap) {
  st_msg_t m[4];
  memset(m, 0, sizeof(m));
  uint8_t claim[ST_MEMBERSHIP_CLAIM_MAX_BYTES];
  m[0].type = ST_MSG_ALIVE;
  m[0].u.alive.node = victim->id;
  m[0].u.alive.incarnation = UINT64_MAX;
  m[0].u.alive.addr = (st_wire_addr_t){4, {127, 0, 0, 1}, 9};
  memcpy(m[0].u.alive.public_key, victim->public_key, ST_PUBLIC_KEY_BYTES);
  st_identity_sign(me, claim, st_membership_alive_claim(&m[0].u.alive, claim),
                   m[0].u.alive.signature);
  m[1].type = ST_MSG_STATUS;
  m[1].u.status.node = victim->id;
  m[1].u.status.seq = UINT64_MAX;
  m[1].u.status.step = UINT64_C(1) << 40;
  memset(m[1].u.status.fingerprint, 0xee, sizeof(m[1].u.status.fingerprint));
  st_identity_sign(me, claim, st_membership_status_claim(&m[1].u.status, claim),
                   m[1].u.status.signature);
  m[2].type = ST_MSG_SUSPECT;
  m[2].u.suspect.node = victim->id;
  m[2].u.suspect.incarnation = UINT64_MAX;
  m[2].u.suspect.from = me->id;
  m[3].type = ST_MSG_DEAD;
  m[3].u.dead.node = victim->id;
  m[3].u.dead.incarnation = victim_inc;
  m[3].u.dead.from = victim->id;
  st_identity_sign(me, claim,
                   st_membership_leave_claim(&victim->id, victim_inc, claim),
                   m[3].u.dead.signature);
  size_t pos = 0;
  for (int i = 0; i < 4; i++) {
    size_t n = 0;
    if (st_wire_encode(&m[i], buf + pos, cap - pos, &n) != 0)
      return 0;
    pos += n;
  }
  return pos;
}

int main(int argc, char** argv) {
  args_t a;
  int rc = parse_args(argc, argv, &a);
  if (rc != 0)
    return rc;
  char err[256];
  st_cluster_key_t ck;
  st_keyring_t ring;
  st_identity_t me, victim;
  st_node_id_t to;
  struct sockaddr_in dst;
  if (st_crypto_init() != 0 ||
      st_cluster_key_load(a.key_path, &ck, err, sizeof(err)) != 0 ||
      st_keyring_init(&ring, &ck, NULL, err, sizeof(err)) != 0 ||
      st_identity_load(a.victim_path, &victim, err, sizeof(err)) != 0 ||
      st_identity_generate(&me) != 0) {
    fprintf(stderr, "claims_probe: %s\n", err);
    return 1;
  }
  if (parse_id(a.to_id, &to) != 0 || parse_addr(a.to, &dst) != 0)
    return usage("--to-id is 32 hex digits, --to an IPv4 HOST:PORT");
  uint8_t plain[ST_PACKET_MAX_PLAINTEXT], pkt[ST_PACKET_MAX_BYTES];
  size_t plen = forge(&me, &victim, a.victim_inc, plain, sizeof(plain));
  st_identity_wipe(&victim); /* only its public key was needed */
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (plen == 0 || fd < 0) {
    fprintf(stderr, "claims_probe: cannot encode or open a socket\n");
    return 1;
  }
  st_packet_sealer_t sealer = {&ring, &me, 1, 0};
  size_t len = 0;
  for (int i = 0; i < 3; i++) {
    if (st_packet_seal(&sealer, &to, plain, plen, pkt, sizeof(pkt), &len) ||
        sendto(fd, pkt, len, 0, (struct sockaddr*) &dst, sizeof(dst)) < 0) {
      perror("claims_probe: sendto");
      return 1;
    }
    nanosleep(&(struct timespec){0, 100000000}, NULL);
  }
  close(fd);
  printf("{\"sent\":3,\"bytes\":%zu}\n", len);
  st_identity_wipe(&me);
  st_keyring_wipe(&ring);
  st_cluster_key_wipe(&ck);
  return 0;
}
