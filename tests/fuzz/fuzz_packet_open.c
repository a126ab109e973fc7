/* fuzz_packet_open.c: libFuzzer target for the UDP receive path:
 * st_packet_open, then st_wire_decode of what it authenticated.
 *
 * The first input byte picks a mode. Mode 0 hands the rest to
 * st_packet_open as a raw datagram (the header checks, key lookup, replay
 * window and authentication must reject anything forged, without reading
 * past the fixed header). Mode 1 seals the rest with the target's own key
 * first, for this receiver (bit 1 of the mode byte clear) or for an
 * unknown receiver (bit 1 set), so that the fuzzer also reaches the
 * decoder behind the tag. */
#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static st_keyring_t ring;
  static st_replay_table_t* replay;
  static st_packet_sealer_t sealer;
  static st_identity_t receiver;
  static int ready;
  if (!ready) {
    fuzz_keyring(&ring, 0x42);
    if (st_replay_table_new(64, &replay) != 0)
      abort();
    static st_identity_t self; /* the sealer borrows it */
    fuzz_identity(&self, 0x01);
    sealer = (st_packet_sealer_t){&ring, &self, 7, 0};
    fuzz_identity(&receiver, 0x02);
    ready = 1;
  }
  if (size < 1)
    return 0;
  int mode = data[0] & 1;
  const st_node_id_t* to = (data[0] & 2) ? NULL : &receiver.id;
  data++;
  size--;

  uint8_t packet[2 * ST_PACKET_MAX_BYTES];
  size_t packet_len;
  if (mode == 0) {
    if (size > sizeof(packet))
      size = sizeof(packet);
    memcpy(packet, data, size);
    packet_len = size;
  } else {
    if (size > ST_PACKET_MAX_PLAINTEXT)
      size = ST_PACKET_MAX_PLAINTEXT;
    if (st_packet_seal(&sealer, to, data, size, packet, sizeof(packet),
                       &packet_len) != 0)
      abort();
  }

  uint8_t plain[ST_PACKET_MAX_BYTES];
  size_t plain_len = 0;
  st_packet_header_t hdr;
  st_crypto_counters_t cc = {{0}};
  int rc = st_packet_open(&ring, &receiver.id, NULL, replay, &cc, packet,
                          packet_len, plain, sizeof(plain), &plain_len, &hdr);
  /* A sealed packet of our own always opens; a raw one never does unless it
   * is a byte-exact copy of one sealed earlier (then it is a replay). */
  if (mode == 1 && (rc != 0 || hdr.to_kind != (to == NULL ? ST_PACKET_TO_UNKNOWN
                                                          : ST_PACKET_TO_NODE)))
    abort();
  if (rc == 0) {
    st_msg_t msg;
    st_wire_counters_t wc = {{0}};
    (void) st_wire_decode(plain, plain_len, &msg, &wc);
    st_wire_msg_free(&msg);
  }
  return 0;
}
