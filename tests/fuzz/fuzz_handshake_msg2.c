/* fuzz_handshake_msg2.c: libFuzzer target for handshake message 2 as a
 * node receives it from a TCP peer: st_wire_decode of the frame's message,
 * then, when it is a handshake message 2, the handshake state machine at
 * the step where that message is expected (see crypto/handshake.c). A
 * forged message must fail cleanly, wipe the state and be counted. */
#include <stddef.h>
#include <stdint.h>

#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fuzz_hs_env_t* env = fuzz_hs_env();
  st_msg_t msg;
  if (!fuzz_decode_as(data, size, ST_MSG_HS2, &msg))
    return 0;
  st_crypto_counters_t cc = {{0}};
  st_handshake_t hi, hr;
  fuzz_hs_pair(env, &hi, &hr, &cc);
  st_hs_msg1_t m1;
  /* The initiator has sent message 1 and reads the fuzzer's message 2. */
  if (st_handshake_write_msg1(&hi, &m1) != 0)
    abort();
  if (st_handshake_read_msg2(&hi, &msg.u.hs2) == 0)
    abort(); /* forging message 2 needs the cluster key and b's identity */
  st_handshake_wipe(&hi);
  st_handshake_wipe(&hr);
  return 0;
}
