/* fuzz_membership_packet.c: the libFuzzer target of the membership
 * machine's packet and push-pull readers (st_membership_packet and
 * st_membership_push_pull_in, gossip/membership*.c; SWIM with Lifeguard).
 * A machine that knows four members (learned from a push-pull, as a
 * joiner does) is fed the input as a UDP packet from a known member, then
 * as a push-pull stream, then runs its timers for a simulated minute. Any
 * input must be applied or refused without a crash, a leak, an overread
 * or unbounded allocation; every packet the machine sends fits in
 * ST_PACKET_MAX_PLAINTEXT bytes; the table stays within its bound. The
 * machine's verifier accepts every claim signature, so that mutated claims
 * reach the state rules behind the checks (the Check suite tests the
 * checks themselves); it signs its own claims with the stand-in of
 * tests/member_identity.h.
 *
 *   CC=clang cmake -S . -B build-fuzz -DSTARLING_FUZZ=ON -DSTARLING_CUDA=OFF
 *   cmake --build build-fuzz --target fuzz_membership_packet
 *   ./build-fuzz/fuzz_membership_packet -max_total_time=60 /tmp/mc \
 *       tests/fuzz/corpus/fuzz_membership_packet
 *
 * The seed corpus is real traffic to node 0 from node 1 of the in-memory
 * clusters of the Check suite, whose identities this target shares:
 * ST_MEMBERSHIP_WRITE_CORPUS=tests/fuzz/corpus/fuzz_membership_packet
 * build/test_gossip_membership_net. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/gossip.h"
#include "tests/member_identity.h"
#include "gossip/membership_constants.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

static bool accept_all(void* ctx, const uint8_t pk[ST_PUBLIC_KEY_BYTES],
                       const uint8_t* msg, size_t len,
                       const uint8_t sig[ST_SIGNATURE_BYTES]) {
  (void) ctx, (void) pk, (void) msg, (void) len, (void) sig;
  return true;
}

#define NKNOWN 5 /* node 0 (the machine) and members 1..4 */

static uint64_t drain(st_membership_t* m) {
  st_maction_t a;
  uint64_t timer = UINT64_MAX;
  while (st_membership_next_action(m, &a)) {
    if (a.kind == ST_MACT_SEND)
      CHECK(a.len > 0 && a.len <= ST_PACKET_MAX_PLAINTEXT && a.data);
    if (a.kind == ST_MACT_PUSH_PULL)
      CHECK(a.len > 0 && a.data);
    if (a.kind == ST_MACT_TIMER)
      timer = a.at_ms;
  }
  return timer;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static bool init;
  static uint8_t pk[NKNOWN][ST_PUBLIC_KEY_BYTES];
  static st_node_id_t id[NKNOWN];
  static st_wire_addr_t addr[NKNOWN];
  static uint8_t pp[NKNOWN * 160 + 64];
  static size_t pp_len;
  if (!init) {
    CHECK(st_crypto_init() == 0);
    st_push_pull_entry_t e[NKNOWN - 1];
    memset(e, 0, sizeof e);
    for (int i = 0; i < NKNOWN; i++) {
      member_identity(i, pk[i], &id[i], &addr[i]);
      if (i > 0) {
        e[i - 1].node = id[i];
        e[i - 1].incarnation = (uint64_t) 1 << 32;
        e[i - 1].state = ST_MEMBER_ALIVE;
        e[i - 1].addr = addr[i];
        memcpy(e[i - 1].public_key, pk[i], ST_PUBLIC_KEY_BYTES);
      }
    }
    st_msg_t msg;
    memset(&msg, 0, sizeof msg);
    msg.type = ST_MSG_PUSH_PULL;
    msg.u.push_pull.is_reply = true;
    msg.u.push_pull.n_entries = NKNOWN - 1;
    msg.u.push_pull.entries = e;
    CHECK(st_wire_encode(&msg, pp, sizeof pp, &pp_len) == 0);
    init = true;
  }

  st_membership_config_t cfg;
  st_membership_config_default(&cfg);
  st_rng_t rng;
  st_rng_seed(&rng, 7);
  st_membership_t* m = NULL;
  CHECK(st_membership_new(&cfg, &id[0], &addr[0], pk[0], 1, &rng, &m) == 0);
  st_membership_signer_t signer = {member_sign_cb, accept_all, pk[0]};
  st_membership_set_signer(m, &signer);
  uint64_t now = 1000;
  CHECK(st_membership_join(m, now, &addr[1], 1) == 0);
  drain(m);
  CHECK(st_membership_push_pull_in(m, now, &addr[1], pp, pp_len) == 0);
  drain(m);
  CHECK(st_membership_count(m) == NKNOWN);

  /* The input as a packet from member 1, then as a push-pull stream. */
  now += 5;
  int rc = st_membership_packet(m, now, &id[1], &addr[1], data, size);
  CHECK(rc == 0 || rc == -EBADMSG);
  uint64_t timer = drain(m);
  rc = st_membership_push_pull_in(m, now, &addr[1], data, size);
  CHECK(rc == 0 || rc == -EBADMSG || rc == -ENOMEM);
  uint64_t t2 = drain(m);
  if (t2 != UINT64_MAX)
    timer = t2;
  CHECK(st_membership_count(m) <= ST_MEMBERSHIP_MAX_MEMBERS);

  /* A simulated minute of timers: probes, suspicions, gossip, reclaim. */
  for (int k = 0; k < 2000 && timer != UINT64_MAX && timer < now + 60000; k++) {
    if (timer > now)
      now = timer;
    CHECK(st_membership_tick(m, now) == 0);
    uint64_t t = drain(m);
    if (t != UINT64_MAX)
      timer = t;
    else
      timer = now + 1000;
  }
  for (size_t i = 0; i < st_membership_count(m); i++)
    CHECK(st_membership_at(m, i) != NULL);
  CHECK(st_membership_find(m, &id[0]) != NULL);
  st_membership_free(m);
  return 0;
}
