/* packet.c: sealed UDP packets (crypto.h, "UDP packets"; docs/protocol.md).
 *
 * A packet is a 67-byte cleartext header (version, key id, receiver kind,
 * sender id, boot epoch, counter, sender public key), a random 24-byte
 * nonce, an XChaCha20-Poly1305-IETF ciphertext (RFC 8439 with the
 * XChaCha20 extension of draft-irtf-cfrg-xchacha) whose associated data is
 * the 67-byte header followed by the 16-byte id of the receiver, and the
 * sender's Ed25519 signature of all that precedes it followed by the same
 * receiver id. That id is not sent: the receiver uses its own, which binds
 * every packet to the one node it was sealed for (a packet redirected to
 * another member fails the tag there). The key is the keyring's packet
 * subkey of the cluster key the key id names; the signature says which
 * key holder sent it (the sender id must be its public key's node id).
 *
 * Opening follows WireGuard's order for transport data: cheap checks
 * first, the key looked up by its id (never tried), the receiver id picked
 * by the kind byte (never tried), the sender id checked against its key,
 * the replay window checked but not touched, then authentication under the
 * cluster key, then the signature, and only after both the window updated.
 * Nothing past the fixed header is read before the tag is verified, and
 * every rejection is counted under its reason. */
#include <errno.h>
#include <sodium.h>
#include <string.h>

#include "crypto/constants.h"
#include "crypto/crypto_internal.h"
#include "crypto/packet_internal.h"

/* The largest message a signature covers: a whole packet without its
 * signature, then the receiver id. */
#define SIGNED_MAX \
  (ST_PACKET_MAX_BYTES - ST_PACKET_SIGNATURE_BYTES + ST_NODE_ID_BYTES)

static void store64_le(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t) (v >> (8 * i));
}

static uint64_t load64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v |= (uint64_t) p[i] << (8 * i);
  return v;
}

/* The associated data: the header before the nonce, then the receiver's
 * id (16 zero bytes for ST_PACKET_TO_UNKNOWN). */
static void make_ad(uint8_t ad[ST__PKT_AD_BYTES], const uint8_t* header,
                    const st_node_id_t* to) {
  memcpy(ad, header, ST__PKT_HEADER_AD_BYTES);
  if (to != NULL)
    memcpy(ad + ST__PKT_HEADER_AD_BYTES, to->b, ST_NODE_ID_BYTES);
  else
    memset(ad + ST__PKT_HEADER_AD_BYTES, 0, ST_NODE_ID_BYTES);
}

/* What the signature covers: the packet up to the signature (body_len
 * bytes), then the receiver id of the associated data. */
static size_t signed_message(uint8_t out[SIGNED_MAX], const uint8_t* packet,
                             size_t body_len, const uint8_t* ad) {
  memcpy(out, packet, body_len);
  memcpy(out + body_len, ad + ST__PKT_HEADER_AD_BYTES, ST_NODE_ID_BYTES);
  return body_len + ST_NODE_ID_BYTES;
}

/* ---- Sealing ----------------------------------------------------------------
 */

int st__packet_seal_with_nonce(st_packet_sealer_t* s, const st_node_id_t* to,
                               const uint8_t nonce[24], const uint8_t* plain,
                               size_t len, uint8_t* out, size_t out_cap,
                               size_t* out_len) {
  if (s == NULL || s->keys == NULL || s->identity == NULL || out == NULL ||
      out_len == NULL || (plain == NULL && len > 0))
    return -EINVAL;
  /* "Unknown" is said with NULL, never with a zero id: a zero id is what
   * an unset field looks like, and refusing it keeps sealing for "any
   * member" an explicit choice. */
  if (to != NULL && sodium_is_zero(to->b, ST_NODE_ID_BYTES))
    return -EINVAL;
  if (len > ST_PACKET_MAX_PLAINTEXT)
    return -EMSGSIZE;
  if (out_cap < len + ST_PACKET_OVERHEAD)
    return -EINVAL;
  /* The counter never wraps: a wrapped counter would be a replay. 2^64
   * packets per boot cannot happen, but the check costs nothing. */
  if (s->counter == UINT64_MAX)
    return -EOVERFLOW;

  out[ST__PKT_OFF_VERSION] = ST_PACKET_VERSION;
  out[ST__PKT_OFF_KEY_ID] = s->keys->current.id;
  out[ST__PKT_OFF_TO_KIND] =
      (uint8_t) (to != NULL ? ST_PACKET_TO_NODE : ST_PACKET_TO_UNKNOWN);
  memcpy(out + ST__PKT_OFF_SENDER, s->identity->id.b, ST_NODE_ID_BYTES);
  store64_le(out + ST__PKT_OFF_EPOCH, s->boot_epoch);
  store64_le(out + ST__PKT_OFF_COUNTER, s->counter);
  memcpy(out + ST__PKT_OFF_SENDER_KEY, s->identity->public_key,
         ST_PUBLIC_KEY_BYTES);
  memcpy(out + ST__PKT_OFF_NONCE, nonce, ST__PKT_NONCE_BYTES);
  uint8_t ad[ST__PKT_AD_BYTES];
  make_ad(ad, out, to);

  /* The plaintext may alias out + header (in-place sealing): libsodium
   * allows the message and ciphertext to overlap exactly. */
  unsigned long long clen = 0;
  crypto_aead_xchacha20poly1305_ietf_encrypt(
      out + ST__PKT_OFF_CIPHERTEXT, &clen, plain, len, ad, sizeof(ad), NULL,
      out + ST__PKT_OFF_NONCE, s->keys->packet_key[0]);
  size_t body = ST__PKT_OFF_CIPHERTEXT + (size_t) clen;
  uint8_t m[SIGNED_MAX];
  size_t slen = signed_message(m, out, body, ad);
  crypto_sign_detached(out + body, NULL, m, slen, s->identity->secret_key);
  s->counter++;
  *out_len = body + ST_PACKET_SIGNATURE_BYTES;
  return 0;
}

int st_packet_seal(st_packet_sealer_t* s, const st_node_id_t* to,
                   const uint8_t* plain, size_t len, uint8_t* out,
                   size_t out_cap, size_t* out_len) {
  uint8_t nonce[ST__PKT_NONCE_BYTES];
  st__random_nonce24(nonce);
  return st__packet_seal_with_nonce(s, to, nonce, plain, len, out, out_cap,
                                    out_len);
}

/* ---- Opening ----------------------------------------------------------------
 */

/* The drop reason of a replay-table answer. */
static st_crypto_drop_t replay_reason(int rc) {
  switch (rc) {
    case -ESTALE:
      return ST_DROP_PACKET_OLD_EPOCH;
    case -ENOSPC:
      return ST_DROP_PACKET_SENDERS_FULL;
    default:
      return ST_DROP_PACKET_REPLAY;
  }
}

/* Steps 1 to 5 of st_packet_open: the checks that need no decryption.
 * Sets *slot (the key's) and *sender; 0 or the negative errno to return. */
static int check_plain_fields(const st_keyring_t* keys, st_crypto_counters_t* c,
                              const uint8_t* in, size_t len,
                              const uint8_t* plain, size_t plain_cap, int* slot,
                              st_node_id_t* sender) {
  /* 1. Sizes: a header and a tag at least, the wire maximum at most. */
  if (len < ST_PACKET_OVERHEAD) {
    st__crypto_count(c, ST_DROP_PACKET_SHORT);
    return -EBADMSG;
  }
  if (len > ST_PACKET_MAX_BYTES) {
    st__crypto_count(c, ST_DROP_PACKET_LONG);
    return -EMSGSIZE;
  }
  size_t mlen = len - ST_PACKET_OVERHEAD;
  if (plain_cap < mlen || (plain == NULL && mlen > 0))
    return -EINVAL; /* the caller's buffer, not the packet: not counted */

  /* 2. Version. */
  if (in[ST__PKT_OFF_VERSION] != ST_PACKET_VERSION) {
    st__crypto_count(c, ST_DROP_PACKET_VERSION);
    return -EBADMSG;
  }

  /* 3. Key: looked up by id, so a packet is decrypted at most once. */
  if (st__keyring_find(keys, in[ST__PKT_OFF_KEY_ID], slot) == NULL) {
    st__crypto_count(c, ST_DROP_PACKET_KEY_ID);
    return -ENOKEY;
  }

  /* 4. Receiver kind: which id the associated data ends with. An unknown
   * kind is a format this version does not speak, counted as such. */
  uint8_t to_kind = in[ST__PKT_OFF_TO_KIND];
  if (to_kind != ST_PACKET_TO_NODE && to_kind != ST_PACKET_TO_UNKNOWN) {
    st__crypto_count(c, ST_DROP_PACKET_VERSION);
    return -EBADMSG;
  }

  /* 5. The sender id must be its public key's (the signature, checked
   * last, proves the key): one BLAKE2b of 32 bytes. */
  st_node_id_t of_key;
  memcpy(sender->b, in + ST__PKT_OFF_SENDER, ST_NODE_ID_BYTES);
  st_node_id_from_public_key(in + ST__PKT_OFF_SENDER_KEY, &of_key);
  if (sodium_memcmp(sender->b, of_key.b, ST_NODE_ID_BYTES) != 0) {
    st__crypto_count(c, ST_DROP_PACKET_SIGNATURE);
    return -EBADMSG;
  }

  return 0;
}

/* Steps 7 to 9 of st_packet_open: decrypt into plain (*got bytes), verify
 * the sender's signature and its place on the allow-list; plain is wiped
 * when a check after decryption fails. 0 or the negative errno to return. */
static int open_and_verify(const st_keyring_t* keys, int slot,
                           const st_node_id_t* self,
                           const st_allowlist_t* allow, st_crypto_counters_t* c,
                           const uint8_t* in, size_t len, uint8_t to_kind,
                           uint8_t* plain, unsigned long long* got) {
  /* 7. Authenticate and decrypt; the associated data is the header and
   * this node's id, so a packet sealed for another node fails here. */
  uint8_t ad[ST__PKT_AD_BYTES];
  make_ad(ad, in, to_kind == ST_PACKET_TO_NODE ? self : NULL);
  size_t body = len - ST_PACKET_SIGNATURE_BYTES;
  *got = 0;
  if (crypto_aead_xchacha20poly1305_ietf_decrypt(
          plain, got, NULL, in + ST__PKT_OFF_CIPHERTEXT,
          body - ST__PKT_OFF_CIPHERTEXT, ad, sizeof(ad), in + ST__PKT_OFF_NONCE,
          keys->packet_key[slot]) != 0) {
    st__crypto_count(c, ST_DROP_PACKET_AUTH);
    return -EBADMSG;
  }

  /* 8. A sender key not on the allow-list is dropped before its
   * signature is verified (a hash lookup, not an Ed25519 verification),
   * and before it can take a place in the replay table (bounded: a key
   * holder minting identities must not fill it). */
  if (allow != NULL &&
      !st_allowlist_contains(allow, in + ST__PKT_OFF_SENDER_KEY)) {
    sodium_memzero(plain, (size_t) *got);
    st__crypto_count(c, ST_DROP_PACKET_NOT_ALLOWED);
    return -EACCES;
  }

  /* 9. The sender's signature: a cluster-key holder cannot sign for
   * another member. */
  uint8_t m[SIGNED_MAX];
  size_t slen = signed_message(m, in, body, ad);
  if (crypto_sign_verify_detached(in + body, m, slen,
                                  in + ST__PKT_OFF_SENDER_KEY) != 0) {
    sodium_memzero(plain, (size_t) *got);
    st__crypto_count(c, ST_DROP_PACKET_SIGNATURE);
    return -EBADMSG;
  }

  return 0;
}

int st_packet_open(const st_keyring_t* keys, const st_node_id_t* self,
                   const st_allowlist_t* allow, st_replay_table_t* replay,
                   st_crypto_counters_t* c, const uint8_t* in, size_t len,
                   uint8_t* plain, size_t plain_cap, size_t* plain_len,
                   st_packet_header_t* hdr) {
  if (keys == NULL || self == NULL || replay == NULL || in == NULL ||
      plain_len == NULL || hdr == NULL)
    return -EINVAL;

  int slot = 0;
  st_node_id_t sender;
  int rc =
      check_plain_fields(keys, c, in, len, plain, plain_cap, &slot, &sender);
  if (rc != 0)
    return rc;
  size_t mlen = len - ST_PACKET_OVERHEAD;
  uint8_t to_kind = in[ST__PKT_OFF_TO_KIND];

  /* 6. Replay window, checked only: these fields are not authenticated
   * yet, so nothing may change on their word. */
  uint64_t epoch = load64_le(in + ST__PKT_OFF_EPOCH);
  uint64_t counter = load64_le(in + ST__PKT_OFF_COUNTER);
  rc = st__replay_check(replay, &sender, epoch, counter);
  if (rc != 0) {
    st__crypto_count(c, replay_reason(rc));
    return rc;
  }

  unsigned long long got = 0;
  rc = open_and_verify(keys, slot, self, allow, c, in, len, to_kind, plain,
                       &got);
  if (rc != 0)
    return rc;

  /* 10. Authentic: now the window may move. It cannot refuse what the
   * check accepted (nothing ran in between), but its answer is checked
   * anyway and the plaintext wiped if it does. */
  rc = st__replay_update(replay, &sender, epoch, counter);
  if (rc != 0) {
    sodium_memzero(plain, mlen);
    st__crypto_count(c, replay_reason(rc));
    return rc;
  }
  *plain_len = (size_t) got;
  hdr->sender = sender;
  memcpy(hdr->sender_key, in + ST__PKT_OFF_SENDER_KEY, ST_PUBLIC_KEY_BYTES);
  hdr->boot_epoch = epoch;
  hdr->counter = counter;
  hdr->key_id = in[ST__PKT_OFF_KEY_ID];
  hdr->to_kind = to_kind;
  return 0;
}
