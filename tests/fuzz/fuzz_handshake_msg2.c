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
  static st_keyring_t ring;
  static st_identity_t a, b;
  static int ready;
  if (!ready) {
    fuzz_keyring(&ring, 0x42);
    fuzz_identity(&a, 0x0a);
    fuzz_identity(&b, 0x0b);
    ready = 1;
  }
  st_msg_t msg;
  st_wire_counters_t wc = {{0}};
  if (st_wire_decode(data, size, &msg, &wc) != 0)
    return 0;
  if (msg.type != ST_MSG_HS2) {
    st_wire_msg_free(&msg);
    return 0;
  }

  st_crypto_counters_t cc = {{0}};
  st_handshake_t hi, hr;
  st_hs_msg1_t m1;
  st_hs_msg2_t m2;
  st_hs_msg3_t m3;
  (void) m1;
  (void) m2;
  (void) m3;
  if (st_handshake_init(&hi, ST_HS_INITIATOR, &a, &ring, NULL, &cc) != 0 ||
      st_handshake_init(&hr, ST_HS_RESPONDER, &b, &ring, NULL, &cc) != 0)
    abort();
  /* The initiator has sent message 1 and reads the fuzzer's message 2. */
  if (st_handshake_write_msg1(&hi, &m1) != 0)
    abort();
  if (st_handshake_read_msg2(&hi, &msg.u.hs2) == 0)
    abort(); /* forging message 2 needs the cluster key and b's identity */
  st_handshake_wipe(&hi);
  st_handshake_wipe(&hr);
  return 0;
}
