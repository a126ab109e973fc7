/* fuzz_handshake_msg1.c: libFuzzer target for handshake message 1 as a
 * node receives it from a TCP peer: st_wire_decode of the frame's message,
 * then, when it is a handshake message 1, the handshake state machine at
 * the step where that message is expected (see crypto/handshake.c). A
 * forged message must fail cleanly, wipe the state and be counted. Each
 * input is fed twice: as sent (an outsider: a mac1 it cannot make is
 * refused, counted as handshake_mac) and with its mac1 made under the
 * cluster key (an insider), so that the fuzzer reaches past the mac.
 * corpus/fuzz_handshake_msg1/hs1_zero.bin (an all-zero ephemeral key) is
 * the regression seed for the low-order case below. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

/* The state was wiped (st_handshake_wipe zeroes all of it). */
static int all_zero(const void* p, size_t n) {
  const uint8_t* b = p;
  uint8_t acc = 0;
  for (size_t i = 0; i < n; i++)
    acc |= b[i];
  return acc == 0;
}

static void feed(const fuzz_hs_env_t* env, const st_hs_msg1_t* m1,
                 bool insider);

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fuzz_hs_env_t* env = fuzz_hs_env();
  st_msg_t msg;
  if (!fuzz_decode_as(data, size, ST_MSG_HS1, &msg))
    return 0;
  feed(env, &msg.u.hs1, false);
  feed(env, &msg.u.hs1, true);
  return 0;
}

static void feed(const fuzz_hs_env_t* env, const st_hs_msg1_t* in,
                 bool insider) {
  st_hs_msg1_t m1 = *in;
  const st_cluster_key_t* k =
      env->ring.current.id == m1.key_id ? &env->ring.current : NULL;
  if (insider && k == NULL)
    return;
  if (insider)
    st_handshake_msg1_mac(k, &m1, m1.mac);
  st_crypto_counters_t cc = {{0}};
  st_handshake_t hi, hr;
  fuzz_hs_pair(env, &hi, &hr, &cc);
  st_hs_msg2_t m2;
  /* The responder reads a message 1 from anyone and, if it is well formed,
   * answers with message 2. That fails, correctly, for a low-order
   * ephemeral key (the X25519 result is all zero): -EBADMSG, counted as
   * malformed, the state wiped. Anything else must succeed. */
  uint64_t macs = cc.drops[ST_DROP_HS_MAC];
  int read = st_handshake_read_msg1(&hr, &m1);
  if (insider && cc.drops[ST_DROP_HS_MAC] != macs)
    abort(); /* a mac1 made under the key must verify */
  if (read == 0) {
    uint64_t malformed = cc.drops[ST_DROP_HS_MALFORMED];
    int rc = st_handshake_write_msg2(&hr, &m2);
    if (rc == -EBADMSG) {
      if (cc.drops[ST_DROP_HS_MALFORMED] != malformed + 1 ||
          !all_zero(&hr, sizeof(hr)))
        abort();
    } else if (rc != 0) {
      abort();
    }
  }
  st_handshake_wipe(&hi);
  st_handshake_wipe(&hr);
}
