/* fuzz_stream_frame.c: libFuzzer target for the TCP receive path: the
 * 4-byte frame length (refused over the cap before anything is read),
 * st_stream_open_frame, then st_wire_decode of what it authenticated.
 *
 * The first input byte picks a mode. Mode 0 feeds the rest to a receiver as
 * a connection would: the sender's 24-byte stream header, then frames
 * (altered, forged, reordered or oversized frames must be refused and
 * poison the stream; the seeds are genuine streams, so the fuzzer starts
 * from frames that open). Mode 1 seals the rest as one message
 * with the matching sender first, so that the decoder behind the tag is
 * reached too. */
#include <stddef.h>
#include <stdint.h>

#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

/* Small cap, so that the fuzzer explores the length check cheaply; the
 * real default is ST_FRAME_MAX_DEFAULT. */
#define FRAME_CAP (64u * 1024u)

static void decode(const uint8_t* msg, size_t len) {
  st_msg_t m;
  st_wire_counters_t wc = {{0}};
  (void) st_wire_decode(msg, len, &m, &wc);
  st_wire_msg_free(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static uint8_t key[ST_KEY_BYTES];
  static uint8_t out[FRAME_CAP];
  if (size < 1)
    return 0;
  if (st_crypto_init() != 0)
    abort();
  memset(key, 0x5a, sizeof(key));
  int mode = data[0] & 1;
  data++;
  size--;

  st_stream_t tx, rx;
  uint8_t header[ST_STREAM_HEADER_BYTES];
  st_crypto_counters_t cc = {{0}};
  if (mode == 1) {
    if (size > FRAME_CAP - ST_STREAM_ABYTES)
      size = FRAME_CAP - ST_STREAM_ABYTES;
    static uint8_t frame[FRAME_CAP + ST_FRAME_LENGTH_BYTES];
    size_t frame_len, ct_len, msg_len;
    bool final;
    if (st_stream_tx_init(&tx, key, header) != 0 ||
        st_stream_rx_init(&rx, key, header) != 0 ||
        st_stream_seal_frame(&tx, data, size, true, frame, sizeof(frame),
                             &frame_len) != 0 ||
        st_frame_length(frame, FRAME_CAP, &cc, &ct_len) != 0 ||
        st_stream_open_frame(&rx, &cc, frame + ST_FRAME_LENGTH_BYTES, ct_len,
                             out, sizeof(out), &msg_len, &final) != 0 ||
        !final || st_stream_rx_end(&rx, &cc) != 0)
      abort(); /* our own frame must always open */
    decode(out, msg_len);
    st_stream_wipe(&tx);
    st_stream_wipe(&rx);
    return 0;
  }

  if (size < ST_STREAM_HEADER_BYTES)
    return 0;
  if (st_stream_rx_init(&rx, key, data) != 0)
    abort();
  data += ST_STREAM_HEADER_BYTES;
  size -= ST_STREAM_HEADER_BYTES;
  size_t pos = 0;
  while (size - pos >= ST_FRAME_LENGTH_BYTES) {
    size_t ct_len, msg_len;
    bool final;
    if (st_frame_length(data + pos, FRAME_CAP, &cc, &ct_len) != 0)
      break;
    pos += ST_FRAME_LENGTH_BYTES;
    if (ct_len > size - pos)
      break; /* the connection ended mid-frame */
    if (st_stream_open_frame(&rx, &cc, data + pos, ct_len, out, sizeof(out),
                             &msg_len, &final) != 0)
      break;
    pos += ct_len;
    decode(out, msg_len);
  }
  (void) st_stream_rx_end(&rx, &cc);
  st_stream_wipe(&rx);
  return 0;
}
