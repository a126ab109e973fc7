/* stream.c: encrypted streams over a TCP connection (crypto.h, "Streams";
 * docs/protocol.md), one per direction after the handshake, built on
 * libsodium's crypto_secretstream_xchacha20poly1305 (XChaCha20 with a
 * Poly1305 tag per message and an internal nonce that advances with each
 * message, so frames cannot be reordered, duplicated or dropped without
 * failing authentication).
 *
 * Framing: each message is one frame, a 4-byte big-endian ciphertext
 * length then the ciphertext (message + ST_STREAM_ABYTES). The last frame
 * of a stream carries TAG_FINAL; every other frame TAG_MESSAGE. A length is
 * judged from its 4 bytes alone (st_frame_length) before the caller reads
 * or allocates the body. The receiver refuses, counts, and is poisoned by:
 * a frame that fails authentication (altered, reordered, duplicated, or
 * from another stream), a tag other than MESSAGE or FINAL, and any frame
 * after the final one. A connection that ends before the final frame is a
 * truncation (st_stream_rx_end). */
#include <errno.h>
#include <sodium.h>
#include <string.h>

#include "crypto/constants.h"
#include "crypto/crypto_internal.h"

typedef crypto_secretstream_xchacha20poly1305_state sstate_t;

/* libsodium's state lives in the caller's opaque buffer. */
_Static_assert(sizeof(sstate_t) <= sizeof(((st_stream_t*) 0)->state),
               "secretstream state fits st_stream_t.state");
_Static_assert(_Alignof(sstate_t) <= 16,
               "st_stream_t.state is aligned enough for the secretstream");

enum { DIR_NONE = 0, DIR_TX = 1, DIR_RX = 2 };

static sstate_t* sstate(st_stream_t* s) {
  return (sstate_t*) (void*) s->state;
}

/* ---- Set-up -----------------------------------------------------------------
 */

int st_stream_tx_init(st_stream_t* s, const uint8_t key[ST_KEY_BYTES],
                      uint8_t header[ST_STREAM_HEADER_BYTES]) {
  if (s == NULL || key == NULL || header == NULL)
    return -EINVAL;
  sodium_memzero(s, sizeof(*s));
  if (crypto_secretstream_xchacha20poly1305_init_push(sstate(s), header, key) !=
      0)
    return -EIO;
  s->direction = DIR_TX;
  return 0;
}

int st_stream_rx_init(st_stream_t* s, const uint8_t key[ST_KEY_BYTES],
                      const uint8_t header[ST_STREAM_HEADER_BYTES]) {
  if (s == NULL || key == NULL || header == NULL)
    return -EINVAL;
  sodium_memzero(s, sizeof(*s));
  /* init_pull cannot fail on a well-formed call; the header is not
   * authenticated here (an altered header makes the first frame fail). */
  if (crypto_secretstream_xchacha20poly1305_init_pull(sstate(s), header, key) !=
      0)
    return -EBADMSG;
  s->direction = DIR_RX;
  return 0;
}

void st_stream_wipe(st_stream_t* s) {
  if (s != NULL)
    sodium_memzero(s, sizeof(*s));
}

/* ---- Sending ----------------------------------------------------------------
 */

static void store32_be(uint8_t* p, uint32_t v) {
  p[0] = (uint8_t) (v >> 24);
  p[1] = (uint8_t) (v >> 16);
  p[2] = (uint8_t) (v >> 8);
  p[3] = (uint8_t) v;
}

int st_stream_seal_frame(st_stream_t* s, const uint8_t* msg, size_t len,
                         bool final, uint8_t* out, size_t out_cap,
                         size_t* out_len) {
  if (s == NULL || out == NULL || out_len == NULL || (msg == NULL && len > 0))
    return -EINVAL;
  if (s->direction != DIR_TX || s->poisoned || s->final_seen)
    return -EPROTO;
  if (len > ST__FRAME_LENGTH_MAX - ST_STREAM_ABYTES)
    return -EMSGSIZE; /* its length would not fit the 4-byte prefix */
  size_t ct_len = len + ST_STREAM_ABYTES;
  if (out_cap < ST_FRAME_LENGTH_BYTES + ct_len)
    return -EINVAL;
  unsigned char tag = final ? crypto_secretstream_xchacha20poly1305_TAG_FINAL
                            : crypto_secretstream_xchacha20poly1305_TAG_MESSAGE;
  store32_be(out, (uint32_t) ct_len);
  if (crypto_secretstream_xchacha20poly1305_push(
          sstate(s), out + ST_FRAME_LENGTH_BYTES, NULL, msg, len, NULL, 0,
          tag) != 0) {
    s->poisoned = 1;
    return -EIO;
  }
  s->frames++;
  if (final)
    s->final_seen = 1;
  *out_len = ST_FRAME_LENGTH_BYTES + ct_len;
  return 0;
}

/* ---- Receiving --------------------------------------------------------------
 */

int st_frame_length(const uint8_t hdr[ST_FRAME_LENGTH_BYTES], size_t max_frame,
                    st_crypto_counters_t* c, size_t* ct_len) {
  if (hdr == NULL || ct_len == NULL)
    return -EINVAL;
  uint32_t n = (uint32_t) hdr[0] << 24 | (uint32_t) hdr[1] << 16 |
               (uint32_t) hdr[2] << 8 | (uint32_t) hdr[3];
  if (n > max_frame) {
    st__crypto_count(c, ST_DROP_FRAME_TOO_LARGE);
    return -EMSGSIZE;
  }
  /* Shorter than the secretstream overhead cannot be a frame; counted
   * under the same reason, as crypto.h says: a bad length prefix. */
  if (n < ST_STREAM_ABYTES) {
    st__crypto_count(c, ST_DROP_FRAME_TOO_LARGE);
    return -EBADMSG;
  }
  *ct_len = n;
  return 0;
}

/* Counts reason, poisons the stream and wipes what was decrypted. */
static int poison(st_stream_t* s, st_crypto_counters_t* c,
                  st_crypto_drop_t reason, uint8_t* msg, size_t n) {
  st__crypto_count(c, reason);
  s->poisoned = 1;
  sodium_memzero(s->state, sizeof(s->state));
  if (msg != NULL && n > 0)
    sodium_memzero(msg, n);
  return -EBADMSG;
}

int st_stream_open_frame(st_stream_t* s, st_crypto_counters_t* c,
                         const uint8_t* ct, size_t ct_len, uint8_t* msg,
                         size_t msg_cap, size_t* msg_len, bool* final) {
  if (s == NULL || (ct == NULL && ct_len > 0) || msg_len == NULL ||
      final == NULL)
    return -EINVAL;
  if (s->direction != DIR_RX || s->poisoned)
    return -EPROTO;
  /* Anything after the final frame is refused unread. */
  if (s->final_seen)
    return poison(s, c, ST_DROP_STREAM_AFTER_FINAL, NULL, 0);
  /* No frame is shorter than its tag, and none is longer than 4 length
   * bytes can say (libsodium aborts on a message over its maximum). */
  if (ct_len < ST_STREAM_ABYTES || ct_len > ST__FRAME_LENGTH_MAX)
    return poison(s, c, ST_DROP_STREAM_AUTH, NULL, 0);
  size_t mlen = ct_len - ST_STREAM_ABYTES;
  if (msg_cap < mlen || (msg == NULL && mlen > 0))
    return -EINVAL; /* the caller's buffer: nothing consumed, not poisoned */

  unsigned long long got = 0;
  unsigned char tag = 0;
  if (crypto_secretstream_xchacha20poly1305_pull(sstate(s), msg, &got, &tag, ct,
                                                 ct_len, NULL, 0) != 0)
    return poison(s, c, ST_DROP_STREAM_AUTH, msg, mlen);
  if (tag != crypto_secretstream_xchacha20poly1305_TAG_MESSAGE &&
      tag != crypto_secretstream_xchacha20poly1305_TAG_FINAL)
    return poison(s, c, ST_DROP_STREAM_AUTH, msg, mlen);
  s->frames++;
  *final = tag == crypto_secretstream_xchacha20poly1305_TAG_FINAL;
  if (*final)
    s->final_seen = 1;
  *msg_len = (size_t) got;
  return 0;
}

int st_stream_rx_end(st_stream_t* s, st_crypto_counters_t* c) {
  if (s == NULL)
    return -EINVAL;
  if (s->direction != DIR_RX)
    return -EPROTO;
  if (s->poisoned)
    return -EBADMSG; /* already counted when it was poisoned */
  if (s->final_seen)
    return 0;
  st__crypto_count(c, ST_DROP_STREAM_TRUNCATED);
  return -EBADMSG;
}
