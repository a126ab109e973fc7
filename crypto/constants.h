/* constants.h: every protocol constant of crypto/ in one place (STYLE.md
 * rule 7, WireGuard's messages.h), each with the reasoning that chose it.
 * Internal to crypto/; the public sizes are in crypto.h and are checked
 * against these here. Formats: docs/protocol.md. Changing anything here
 * changes the wire protocol: bump ST_PACKET_VERSION or ST_HS_VERSION and
 * the "starling-hs-v1" strings together. */
#ifndef STARLING_CRYPTO_CONSTANTS_H
#define STARLING_CRYPTO_CONSTANTS_H

#include <sodium.h>

#include "crypto/crypto.h"

/* ==== Key derivation from the cluster key ==================================
 *
 * crypto_kdf_derive_from_key(subkey, 32, id, context, cluster key): BLAKE2b
 * keyed by the cluster key, salted with the subkey id and personalized by
 * the 8-byte context. One context per use, so that a packet key can never
 * equal a key of another use of the same cluster key. keys.c derives the
 * packet subkeys of the keyring with these values. The context is exactly
 * crypto_kdf_CONTEXTBYTES (8) long. */
#define ST__KDF_CONTEXT_PACKET "stpacket"
#define ST__KDF_SUBKEY_PACKET 1

/* Personalizations of BLAKE2b (16 bytes, zero padded), used by keys.c:
 * the node id is BLAKE2b-128(pk) under the first, the key id the first
 * byte of BLAKE2b-128(cluster key) under the second. */
#define ST__PERSONAL_NODE_ID "starling-nodeid"
#define ST__PERSONAL_KEY_ID "starling-keyid"

/* ==== UDP packets (crypto/packet.c) ========================================
 *
 * Offsets of the header fields (the layout table in crypto.h). The
 * associated data is bytes [0, ST__PKT_HEADER_AD_BYTES), everything before
 * the nonce, followed by the receiver's 16-byte node id, which is not
 * sent: the receiver supplies its own, so that a packet A sealed for B
 * fails authentication at C (otherwise an outsider could replay it to C,
 * whose window has gaps where A's packets went to others). The receiver
 * kind byte says which id that is (st_packet_to_t): the receiver's, or 16
 * zero bytes when the sender does not know it yet; without the byte the
 * receiver would have to try both. The nonce itself needs no AD: it is an
 * input of the AEAD, so a changed nonce already fails authentication.
 *
 * The sender's Ed25519 public key follows the counter, and the packet ends
 * with the sender's signature (crypto_sign_detached, 64 bytes) of
 * everything before it followed by the same receiver id. The cluster key
 * proves the sender is a key holder; the signature proves which one (its
 * node id is BLAKE2b-128 of the key it signed with), so that a key holder
 * cannot speak for another member, nor move another sender's replay
 * window. A signed packet costs ~26 us to seal and ~70 us to open on the
 * 2-core VM (starling-bench crypto, docs/benchmarks.md): nothing at
 * membership's few packets a second per member. */
#define ST__PKT_OFF_VERSION 0
#define ST__PKT_OFF_KEY_ID 1
#define ST__PKT_OFF_TO_KIND 2
#define ST__PKT_OFF_SENDER 3                                      /* 16 bytes */
#define ST__PKT_OFF_EPOCH (ST__PKT_OFF_SENDER + ST_NODE_ID_BYTES) /* 19 */
#define ST__PKT_OFF_COUNTER (ST__PKT_OFF_EPOCH + 8)               /* 27 */
#define ST__PKT_OFF_SENDER_KEY (ST__PKT_OFF_COUNTER + 8)          /* 35 */
#define ST__PKT_OFF_NONCE \
  (ST__PKT_OFF_SENDER_KEY + ST_PUBLIC_KEY_BYTES)  /* 67 */
#define ST__PKT_HEADER_AD_BYTES ST__PKT_OFF_NONCE /* 67 */
#define ST__PKT_AD_BYTES \
  (ST__PKT_HEADER_AD_BYTES + ST_NODE_ID_BYTES) /* 83: + receiver id */
#define ST__PKT_NONCE_BYTES crypto_aead_xchacha20poly1305_ietf_NPUBBYTES
#define ST__PKT_OFF_CIPHERTEXT (ST__PKT_OFF_NONCE + ST__PKT_NONCE_BYTES)

_Static_assert(ST__PKT_OFF_CIPHERTEXT == ST_PACKET_HEADER_BYTES,
               "header layout and ST_PACKET_HEADER_BYTES disagree");
_Static_assert(ST__PKT_NONCE_BYTES == 24, "XChaCha20 nonces are 24 bytes");
_Static_assert(ST__PKT_OFF_CIPHERTEXT == 91 && ST_PACKET_VERSION == 3,
               "the layout of version 3 (docs/protocol.md)");
_Static_assert(ST_PACKET_SIGNATURE_BYTES == crypto_sign_BYTES,
               "packet signatures are Ed25519's");
_Static_assert(ST_PACKET_TAG_BYTES == crypto_aead_xchacha20poly1305_ietf_ABYTES,
               "packet tag is the Poly1305 tag");
_Static_assert(ST_KEY_BYTES == crypto_aead_xchacha20poly1305_ietf_KEYBYTES,
               "packet subkeys are AEAD keys");

/* Random 24-byte nonces: with 192 bits a collision under one key stays
 * negligible (about n^2 / 2^193) for any number of packets a cluster can
 * send, so no nonce state has to survive a restart. The counter in the
 * header is for replay protection only. */

/* ==== Replay windows (crypto/replay.c) =====================================
 *
 * ST_REPLAY_WINDOW (crypto.h) = 1024 counters. Membership traffic is tens
 * of packets per second per sender; UDP reorders only within a few
 * packets, so 1024 covers many seconds of reordering. WireGuard uses 8192
 * for line-rate data traffic; we carry no bulk data over UDP.
 *
 * RFC 6479 keeps the bitmap as a ring of 64-bit blocks and, when the
 * highest counter advances, zeroes whole blocks instead of shifting bits.
 * The block holding the highest counter is only partly in the past, so to
 * remember all ST_REPLAY_WINDOW counters below the highest the ring needs
 * one block more than ST_REPLAY_WINDOW / 64 (RFC 6479 section 2: a ring of
 * N blocks gives a window of (N - 1) * 64). */
#define ST__REPLAY_BLOCK_BITS 64
#define ST__REPLAY_BLOCKS \
  (ST_REPLAY_WINDOW / ST__REPLAY_BLOCK_BITS + 1) /* 17 */
_Static_assert(ST_REPLAY_WINDOW % ST__REPLAY_BLOCK_BITS == 0,
               "the window is a whole number of blocks");

/* The table of senders is open addressing with linear probing at a load
 * factor of at most 1/2 (capacity: the power of two >= 2 * max_senders),
 * so a lookup probes about 1.5 slots when present and 2.5 when absent
 * (Knuth 6.4). Slots are found with SipHash-2-4 (crypto_shorthash) of the
 * sender id under a random key per table: a member chooses its own key
 * pair and so could grind ids that collide in a fixed hash, making every
 * lookup a long probe. The bound on max_senders keeps the table
 * allocation (2^21 slots of ~170 bytes at most) from overflowing size_t
 * arithmetic on any platform. */
#define ST__REPLAY_MAX_SENDERS (1u << 20)

/* ==== TCP handshake (crypto/handshake.c) ===================================
 *
 * Noise naming: the protocol name is hashed into the initial transcript
 * hash h0 = BLAKE2b-512(name) and the chaining key ck0 = h0[0..32), so two
 * implementations that disagree about any primitive diverge from the first
 * message. "v1" matches ST_HS_VERSION. */
#define ST__HS_PROTOCOL_NAME \
  "starling-hs-v1 X25519 Ed25519 XChaCha20-Poly1305 BLAKE2b"
#define ST__HS_HASH_BYTES 64 /* h: BLAKE2b-512, as Noise's HASHLEN = 64 */
#define ST__HS_CK_BYTES 32   /* ck: BLAKE2b-256 output, a keyed-BLAKE2b key */

/* Signature contexts: each side signs label || h. The two labels differ,
 * so a signature made as responder can never be replayed as an
 * initiator's (a reflected handshake fails), and the "starling-hs-v1"
 * prefix keeps these signatures apart from anything else the identity key
 * might sign. The labels are signed without their terminating NUL. */
#define ST__HS_SIG_LABEL_RESPONDER "starling-hs-v1 responder"
#define ST__HS_SIG_LABEL_INITIATOR "starling-hs-v1 initiator"

/* The input mixed into ck to derive k3, the key of message 3. With only
 * ephemeral X25519 keys there is no second DH to mix (Noise XX's "se"
 * needs a static X25519 key), so k3 is a fresh output of the chaining key,
 * which already holds the ee DH and the cluster key. */
#define ST__HS_MSG3_LABEL "starling-hs-v1 msg3"

/* KDF output labels of HKDF-Expand (the one-byte counters of RFC 5869). */
#define ST__HS_KDF_T1 0x01
#define ST__HS_KDF_T2 0x02

/* Every AEAD key of the handshake (k2, k3) seals exactly one message, so
 * the nonce is the constant zero, as in Noise (n = 0 for the first message
 * under a key). */
#define ST__HS_AEAD_NONCE_BYTES crypto_aead_xchacha20poly1305_ietf_NPUBBYTES

/* Sealed payload: pk || sig, plus the tag. */
#define ST__HS_PAYLOAD_BYTES (ST_PUBLIC_KEY_BYTES + ST_SIGNATURE_BYTES)
_Static_assert(ST_HS_SEALED_BYTES ==
                   ST__HS_PAYLOAD_BYTES +
                       crypto_aead_xchacha20poly1305_ietf_ABYTES,
               "ST_HS_SEALED_BYTES is the payload plus one tag");
_Static_assert(ST_SIGNATURE_BYTES == crypto_sign_BYTES, "Ed25519 signatures");
_Static_assert(ST_PUBLIC_KEY_BYTES == crypto_sign_PUBLICKEYBYTES,
               "Ed25519 public keys");
_Static_assert(crypto_scalarmult_BYTES == 32 &&
                   crypto_scalarmult_SCALARBYTES == 32,
               "X25519 keys are 32 bytes");

/* ==== Streams (crypto/stream.c) ============================================
 *
 * Each frame is one secretstream message with TAG_MESSAGE, the last with
 * TAG_FINAL; a receiver refuses any other tag (PUSH and REKEY are never
 * sent). The length prefix is not associated data: the Poly1305 tag covers
 * the ciphertext length, so a changed prefix makes the receiver read a
 * different ciphertext, which fails. */
#define ST__FRAME_LENGTH_MAX UINT32_MAX /* what 4 length bytes can say */
_Static_assert(ST_STREAM_HEADER_BYTES ==
                   crypto_secretstream_xchacha20poly1305_HEADERBYTES,
               "stream header size");
_Static_assert(ST_STREAM_ABYTES == crypto_secretstream_xchacha20poly1305_ABYTES,
               "stream per-frame overhead");
_Static_assert(ST_KEY_BYTES == crypto_secretstream_xchacha20poly1305_KEYBYTES,
               "stream keys are session keys");

#endif
