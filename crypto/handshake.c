/* handshake.c: the three-message TCP handshake (crypto.h, "TCP handshake";
 * docs/protocol.md). It follows the Noise Protocol Framework (revision 34)
 * pattern XX with a pre-shared key, adapted to identity keys that are
 * Ed25519 signing keys rather than static X25519 keys: instead of the "es"
 * and "se" DHs, each side proves its identity by signing the transcript
 * hash. Notation as in Noise: h the transcript hash, ck the chaining key,
 * H = BLAKE2b-512, || concatenation, e_i / e_r the ephemeral X25519 keys,
 * s_i / s_r the Ed25519 identity keys, psk the cluster key named by the key
 * id, AEAD = XChaCha20-Poly1305-IETF with nonce 0 (each key seals once).
 *
 * KDF(ck, ikm) -> (ck', k) is HKDF (RFC 5869) with HMAC replaced by keyed
 * BLAKE2b, which is itself a PRF (RFC 7693 section 2.9) and needs no HMAC
 * wrapper; libsodium 1.0.18 has no crypto_kdf_hkdf (it arrived in 1.0.19):
 *     prk = BLAKE2b-256(key = ck,  ikm)                  Extract
 *     ck' = BLAKE2b-256(key = prk, 0x01)                 Expand, T(1)
 *     k   = BLAKE2b-256(key = prk, ck' || 0x02)          Expand, T(2)
 *
 *   Both:      h = H(protocol name); ck = h[0..32)
 *   msg1  -> e
 *     I:       e_i = fresh X25519 key pair
 *              send version, key_id (the current cluster key's), e_i.pub
 *              h = H(h || version || key_id || e_i.pub)
 *     R:       refuse a version other than ST_HS_VERSION (malformed) and a
 *              key id not in the keyring (handshake_key_id); same h
 *   msg2  <- e, ee, psk, s, sig
 *     R:       e_r = fresh X25519 key pair; h = H(h || e_r.pub)
 *              ck, _  = KDF(ck, X25519(e_r, e_i))        ee (all-zero refused)
 *              ck, k2 = KDF(ck, psk)                     psk
 *              sig_r = Sign(s_r, "starling-hs-v1 responder" || h)
 *              sealed2 = AEAD(k2, 0, s_r.pub || sig_r, ad = h)
 *              h = H(h || sealed2); send e_r.pub, sealed2
 *     I:       the same derivations with X25519(e_i, e_r); open sealed2
 *              (handshake_auth), verify sig_r under the s_r.pub inside
 *              (handshake_signature), refuse our own key (handshake_self)
 *              and, with an allow-list, a key not on it (handshake_not_
 *              allowed); only then keep s_r.pub, ck and h
 *   msg3  -> s, sig
 *     I:       ck, k3 = KDF(ck, "starling-hs-v1 msg3")
 *              sig_i = Sign(s_i, "starling-hs-v1 initiator" || h)
 *              sealed3 = AEAD(k3, 0, s_i.pub || sig_i, ad = h)
 *              h = H(h || sealed3); send sealed3
 *     R:       the same k3; open, verify, self and allow-list checks
 *   finish     t_ir, t_ri = KDF(ck, h)
 *              initiator: tx = t_ir, rx = t_ri; responder the reverse
 *
 * Why a man in the middle fails. Each signature covers h, and h covers
 * both ephemeral public keys as each side saw them (and the version and
 * key id). A MITM that replaces e_i or e_r with its own keys, to learn the
 * DH results, makes the two sides' h differ; the honest responder's
 * sig_r is then over the wrong h for the initiator, and the MITM cannot
 * make a signature under s_r itself. If it presents its own identity
 * instead, it only ever talks to each side as itself: the peer's key
 * comes out of the verified payload, so the initiator learns that it is
 * connected to the MITM, not to the responder, and an allow-list refuses
 * it. Both ephemerals are fresh per connection, so a recorded message 1
 * replayed to a responder yields a new e_r and a new ck: the replayer
 * cannot open message 2 or seal a message 3 without e_i's secret.
 *
 * What the psk adds. Without the cluster key nobody derives k2, so an
 * outsider cannot open message 2 (it learns no identity key) nor seal a
 * message 2 or 3 the other side accepts: it cannot complete the handshake
 * even with a valid identity key of its own. Only cluster members reach
 * the signature and allow-list checks. The psk is mixed after the DH, so
 * a later leak of the cluster key does not reveal past sessions (their
 * ephemeral secrets are gone) - forward secrecy as in Noise's psk modes.
 *
 * Code shape (WireGuard's noise.c): each step computes into locals, checks
 * everything, and only then writes the state; secrets live on the stack and
 * are wiped at the one exit label of each function; any failure wipes the
 * whole state, so later calls answer -EPROTO. */
#include <errno.h>
#include <sodium.h>
#include <stddef.h>
#include <string.h>

#include "crypto/constants.h"
#include "crypto/crypto_internal.h"

/* hs->step: 0 is a wiped (dead) state, so that a zeroed struct is never
 * usable. */
enum {
  STEP_DEAD = 0,
  STEP_START = 1, /* initialized */
  STEP_MSG1 = 2,  /* msg1 written (I) or read (R) */
  STEP_MSG2 = 3,  /* msg2 read (I) or written (R) */
  STEP_DONE = 4   /* msg3 written (I) or read (R): finish may run */
};

/* ---- Primitives -------------------------------------------------------------
 */

/* h = H(h || data). */
static void mix_hash(uint8_t h[ST__HS_HASH_BYTES], const uint8_t* data,
                     size_t len) {
  crypto_generichash_blake2b_state st;
  crypto_generichash_blake2b_init(&st, NULL, 0, ST__HS_HASH_BYTES);
  crypto_generichash_blake2b_update(&st, h, ST__HS_HASH_BYTES);
  crypto_generichash_blake2b_update(&st, data, len);
  crypto_generichash_blake2b_final(&st, h, ST__HS_HASH_BYTES);
  sodium_memzero(&st, sizeof(st));
}

/* (ck, k) = KDF(ck, ikm), see the top; k may be NULL. */
static void kdf(uint8_t ck[ST__HS_CK_BYTES], const uint8_t* ikm, size_t len,
                uint8_t k[ST_KEY_BYTES]) {
  uint8_t prk[ST__HS_CK_BYTES];
  uint8_t t[ST__HS_CK_BYTES + 1];
  crypto_generichash_blake2b(prk, sizeof(prk), ikm, len, ck, ST__HS_CK_BYTES);
  t[0] = ST__HS_KDF_T1;
  crypto_generichash_blake2b(ck, ST__HS_CK_BYTES, t, 1, prk, sizeof(prk));
  if (k != NULL) {
    memcpy(t, ck, ST__HS_CK_BYTES);
    t[ST__HS_CK_BYTES] = ST__HS_KDF_T2;
    crypto_generichash_blake2b(k, ST_KEY_BYTES, t, sizeof(t), prk, sizeof(prk));
  }
  sodium_memzero(prk, sizeof(prk));
  sodium_memzero(t, sizeof(t));
}

/* sig = Sign(secret, label || h). */
_Static_assert(sizeof(ST__HS_SIG_LABEL_RESPONDER) <= 64 &&
                   sizeof(ST__HS_SIG_LABEL_INITIATOR) <= 64,
               "signature labels fit the message buffers below");

static void sign_transcript(uint8_t sig[ST_SIGNATURE_BYTES],
                            const uint8_t sk[64], const char* label,
                            const uint8_t h[ST__HS_HASH_BYTES]) {
  uint8_t m[64 + ST__HS_HASH_BYTES];
  size_t n = strlen(label);
  memcpy(m, label, n);
  memcpy(m + n, h, ST__HS_HASH_BYTES);
  crypto_sign_detached(sig, NULL, m, n + ST__HS_HASH_BYTES, sk);
}

static bool verify_transcript(const uint8_t sig[ST_SIGNATURE_BYTES],
                              const uint8_t pk[ST_PUBLIC_KEY_BYTES],
                              const char* label,
                              const uint8_t h[ST__HS_HASH_BYTES]) {
  uint8_t m[64 + ST__HS_HASH_BYTES];
  size_t n = strlen(label);
  memcpy(m, label, n);
  memcpy(m + n, h, ST__HS_HASH_BYTES);
  return crypto_sign_verify_detached(sig, m, n + ST__HS_HASH_BYTES, pk) == 0;
}

/* Fails the handshake: counts the reason, wipes the state. */
static int fail(st_handshake_t* hs, st_crypto_drop_t reason, int rc) {
  st__crypto_count(hs->counters, reason);
  st_handshake_wipe(hs);
  return rc;
}

/* A NULL argument: a programmer error, but the promise stands that any
 * failure wipes the state (hs may itself be the NULL). */
static int bad_args(st_handshake_t* hs) {
  st_handshake_wipe(hs);
  return -EINVAL;
}

/* The state is alive, has this role and is at this step; otherwise a call
 * out of order, which ends the handshake. */
static int expect(st_handshake_t* hs, int role, int step) {
  if (hs->step == STEP_DEAD)
    return -EPROTO;
  if (hs->role != role || hs->step != step)
    return fail(hs, ST_DROP_HS_MALFORMED, -EPROTO);
  return 0;
}

/* ---- Set-up -----------------------------------------------------------------
 */

int st_handshake_init(st_handshake_t* hs, st_hs_role_t role,
                      const st_identity_t* self, const st_keyring_t* keys,
                      const st_allowlist_t* allow,
                      st_crypto_counters_t* counters) {
  if (hs == NULL)
    return -EINVAL;
  sodium_memzero(hs, sizeof(*hs));
  if (self == NULL || keys == NULL ||
      (role != ST_HS_INITIATOR && role != ST_HS_RESPONDER))
    return -EINVAL;
  hs->role = role;
  hs->self = self;
  hs->keys = keys;
  hs->allow = allow;
  hs->counters = counters;
  /* h0 = H(protocol name); ck0 = h0[0..32). */
  static const char name[] = ST__HS_PROTOCOL_NAME;
  crypto_generichash_blake2b(hs->hash, ST__HS_HASH_BYTES, (const uint8_t*) name,
                             sizeof(name) - 1, NULL, 0);
  memcpy(hs->chain, hs->hash, ST__HS_CK_BYTES);
  hs->step = STEP_START;
  return 0;
}

void st_handshake_wipe(st_handshake_t* hs) {
  if (hs != NULL)
    sodium_memzero(hs, sizeof(*hs));
}

void st_session_wipe(st_session_t* s) {
  if (s != NULL)
    sodium_memzero(s, sizeof(*s));
}

/* ---- msg1: -> e -------------------------------------------------------------
 */

/* HS1's first 34 bytes: version, key id, e (the transcript's part). */
#define HS1_SIGNED_BYTES offsetof(st_hs_msg1_t, mac)

/* mac1 = BLAKE2b-128(key = BLAKE2b-256(key = psk, "starling-hs-v1 mac1"),
 * version || key_id || e): anyone holding the cluster key can make it,
 * nobody else; checking it costs two BLAKE2b. */
void st_handshake_msg1_mac(const st_cluster_key_t* psk, const st_hs_msg1_t* m,
                           uint8_t out[ST_HS_MAC_BYTES]) {
  static const char label[] = "starling-hs-v1 mac1";
  uint8_t k[32];
  crypto_generichash(k, sizeof(k), (const uint8_t*) label, sizeof(label) - 1,
                     psk->key, sizeof(psk->key));
  crypto_generichash(out, ST_HS_MAC_BYTES, (const uint8_t*) m, HS1_SIGNED_BYTES,
                     k, sizeof(k));
  sodium_memzero(k, sizeof(k));
}

int st_handshake_write_msg1(st_handshake_t* hs, st_hs_msg1_t* out) {
  if (hs == NULL || out == NULL)
    return bad_args(hs);
  int rc = expect(hs, ST_HS_INITIATOR, STEP_START);
  if (rc != 0)
    return rc;
  /* e_i: a fresh X25519 key pair. */
  randombytes_buf(hs->e_secret, sizeof(hs->e_secret));
  crypto_scalarmult_base(hs->e_public, hs->e_secret);
  hs->key_id = hs->keys->current.id;
  out->version = ST_HS_VERSION;
  out->key_id = hs->key_id;
  memcpy(out->ephemeral, hs->e_public, sizeof(out->ephemeral));
  st_handshake_msg1_mac(&hs->keys->current, out, out->mac);
  /* h = H(h || version || key_id || e_i): mac1 is not in the transcript */
  mix_hash(hs->hash, (const uint8_t*) out, HS1_SIGNED_BYTES);
  hs->step = STEP_MSG1;
  return 0;
}

_Static_assert(offsetof(st_hs_msg1_t, mac) == 34 &&
                   sizeof(st_hs_msg1_t) == 34 + ST_HS_MAC_BYTES,
               "msg1 is version, key id, e, then mac1");

int st_handshake_read_msg1(st_handshake_t* hs, const st_hs_msg1_t* in) {
  if (hs == NULL || in == NULL)
    return bad_args(hs);
  int rc = expect(hs, ST_HS_RESPONDER, STEP_START);
  if (rc != 0)
    return rc;
  if (in->version != ST_HS_VERSION)
    return fail(hs, ST_DROP_HS_MALFORMED, -EBADMSG);
  const st_cluster_key_t* psk = st__keyring_find(hs->keys, in->key_id, NULL);
  if (psk == NULL)
    return fail(hs, ST_DROP_HS_KEY_ID, -ENOKEY);
  uint8_t mac[ST_HS_MAC_BYTES];
  st_handshake_msg1_mac(psk, in, mac);
  bool mac_ok = crypto_verify_16(mac, in->mac) == 0;
  sodium_memzero(mac, sizeof(mac));
  if (!mac_ok)
    return fail(hs, ST_DROP_HS_MAC, -EBADMSG);
  hs->key_id = in->key_id;
  memcpy(hs->peer_e, in->ephemeral, sizeof(hs->peer_e));
  mix_hash(hs->hash, (const uint8_t*) in, HS1_SIGNED_BYTES);
  hs->step = STEP_MSG1;
  return 0;
}

/* ---- msg2: <- e, ee, psk, s, sig --------------------------------------------
 */

/* ck, k = KDF(KDF(ck, X25519(secret, peer)), psk) into ck_out and k; the
 * common part of writing and reading msg2. False for an all-zero DH (a
 * low-order peer key). */
static bool mix_ee_psk(const st_handshake_t* hs, const uint8_t secret[32],
                       const uint8_t peer[32], uint8_t ck_out[ST__HS_CK_BYTES],
                       uint8_t k[ST_KEY_BYTES]) {
  uint8_t dh[crypto_scalarmult_BYTES];
  bool ok = false;
  if (crypto_scalarmult(dh, secret, peer) != 0 ||
      sodium_is_zero(dh, sizeof(dh)))
    goto out;
  const st_cluster_key_t* psk = st__keyring_find(hs->keys, hs->key_id, NULL);
  if (psk == NULL)
    goto out;
  memcpy(ck_out, hs->chain, ST__HS_CK_BYTES);
  kdf(ck_out, dh, sizeof(dh), NULL);          /* ee */
  kdf(ck_out, psk->key, sizeof(psk->key), k); /* psk */
  ok = true;
out:
  sodium_memzero(dh, sizeof(dh));
  return ok;
}

int st_handshake_write_msg2(st_handshake_t* hs, st_hs_msg2_t* out) {
  if (hs == NULL || out == NULL)
    return bad_args(hs);
  int rc = expect(hs, ST_HS_RESPONDER, STEP_MSG1);
  if (rc != 0)
    return rc;
  uint8_t e_sec[32];
  uint8_t e_pub[32];
  uint8_t ck[ST__HS_CK_BYTES];
  uint8_t k2[ST_KEY_BYTES];
  uint8_t payload[ST__HS_PAYLOAD_BYTES];
  uint8_t h[ST__HS_HASH_BYTES];
  static const uint8_t zero_nonce[ST__HS_AEAD_NONCE_BYTES];

  /* e_r, then h = H(h || e_r). */
  randombytes_buf(e_sec, sizeof(e_sec));
  crypto_scalarmult_base(e_pub, e_sec);
  memcpy(h, hs->hash, sizeof(h));
  mix_hash(h, e_pub, sizeof(e_pub));
  /* ee, psk -> ck, k2. */
  if (!mix_ee_psk(hs, e_sec, hs->peer_e, ck, k2)) {
    rc = fail(hs, ST_DROP_HS_MALFORMED, -EBADMSG);
    goto out;
  }
  /* s, sig: sealed2 = AEAD(k2, 0, s_r.pub || sig_r, ad = h). */
  memcpy(payload, hs->self->public_key, ST_PUBLIC_KEY_BYTES);
  sign_transcript(payload + ST_PUBLIC_KEY_BYTES, hs->self->secret_key,
                  ST__HS_SIG_LABEL_RESPONDER, h);
  memcpy(out->ephemeral, e_pub, sizeof(out->ephemeral));
  crypto_aead_xchacha20poly1305_ietf_encrypt(out->sealed, NULL, payload,
                                             sizeof(payload), h, sizeof(h),
                                             NULL, zero_nonce, k2);
  mix_hash(h, out->sealed, sizeof(out->sealed));
  /* Commit. The ephemeral secret has done its one DH and is not kept. */
  memcpy(hs->e_public, e_pub, sizeof(e_pub));
  memcpy(hs->chain, ck, sizeof(ck));
  memcpy(hs->hash, h, sizeof(h));
  hs->step = STEP_MSG2;
  rc = 0;
out:
  sodium_memzero(e_sec, sizeof(e_sec));
  sodium_memzero(ck, sizeof(ck));
  sodium_memzero(k2, sizeof(k2));
  sodium_memzero(payload, sizeof(payload));
  sodium_memzero(h, sizeof(h));
  return rc;
}

/* Opens a sealed payload under k with ad = h and checks the key inside:
 * signature under label, not our own, on the allow-list. On success copies
 * the peer's key into peer_pk; otherwise counts and returns the error
 * (the caller wipes the state). */
static int open_identity(st_handshake_t* hs, const uint8_t k[ST_KEY_BYTES],
                         const uint8_t h[ST__HS_HASH_BYTES],
                         const uint8_t sealed[ST_HS_SEALED_BYTES],
                         const char* label,
                         uint8_t peer_pk[ST_PUBLIC_KEY_BYTES]) {
  static const uint8_t zero_nonce[ST__HS_AEAD_NONCE_BYTES];
  uint8_t payload[ST__HS_PAYLOAD_BYTES];
  st_crypto_drop_t reason = ST_DROP_HS_AUTH;
  int rc = -EBADMSG;
  if (crypto_aead_xchacha20poly1305_ietf_decrypt(
          payload, NULL, NULL, sealed, ST_HS_SEALED_BYTES, h, ST__HS_HASH_BYTES,
          zero_nonce, k) != 0)
    goto out;
  const uint8_t* pk = payload;
  const uint8_t* sig = payload + ST_PUBLIC_KEY_BYTES;
  /* The allow-list first: a key not on it costs a lookup, not an Ed25519
   * verification. */
  if (hs->allow != NULL && !st_allowlist_contains(hs->allow, pk)) {
    reason = ST_DROP_HS_NOT_ALLOWED;
    rc = -EACCES;
    goto out;
  }
  if (!verify_transcript(sig, pk, label, h)) {
    reason = ST_DROP_HS_SIGNATURE;
    goto out;
  }
  if (sodium_memcmp(pk, hs->self->public_key, ST_PUBLIC_KEY_BYTES) == 0) {
    reason = ST_DROP_HS_SELF;
    rc = -ELOOP;
    goto out;
  }
  memcpy(peer_pk, pk, ST_PUBLIC_KEY_BYTES);
  rc = 0;
out:
  if (rc != 0)
    st__crypto_count(hs->counters, reason);
  sodium_memzero(payload, sizeof(payload));
  return rc;
}

int st_handshake_read_msg2(st_handshake_t* hs, const st_hs_msg2_t* in) {
  if (hs == NULL || in == NULL)
    return bad_args(hs);
  int rc = expect(hs, ST_HS_INITIATOR, STEP_MSG1);
  if (rc != 0)
    return rc;
  uint8_t ck[ST__HS_CK_BYTES];
  uint8_t k2[ST_KEY_BYTES];
  uint8_t h[ST__HS_HASH_BYTES];
  uint8_t peer_pk[ST_PUBLIC_KEY_BYTES];

  /* h = H(h || e_r); ee, psk -> ck, k2. */
  memcpy(h, hs->hash, sizeof(h));
  mix_hash(h, in->ephemeral, sizeof(in->ephemeral));
  if (!mix_ee_psk(hs, hs->e_secret, in->ephemeral, ck, k2)) {
    rc = fail(hs, ST_DROP_HS_MALFORMED, -EBADMSG);
    goto out;
  }
  /* s, sig: open sealed2, verify sig_r over "responder" || h. */
  rc =
      open_identity(hs, k2, h, in->sealed, ST__HS_SIG_LABEL_RESPONDER, peer_pk);
  if (rc != 0) {
    st_handshake_wipe(hs);
    goto out;
  }
  mix_hash(h, in->sealed, sizeof(in->sealed));
  /* Commit: every check has passed. */
  memcpy(hs->peer_e, in->ephemeral, sizeof(hs->peer_e));
  memcpy(hs->peer_pk, peer_pk, sizeof(peer_pk));
  memcpy(hs->chain, ck, sizeof(ck));
  memcpy(hs->hash, h, sizeof(h));
  sodium_memzero(hs->e_secret, sizeof(hs->e_secret));
  hs->step = STEP_MSG2;
out:
  sodium_memzero(ck, sizeof(ck));
  sodium_memzero(k2, sizeof(k2));
  sodium_memzero(h, sizeof(h));
  sodium_memzero(peer_pk, sizeof(peer_pk));
  return rc;
}

/* ---- msg3: -> s, sig --------------------------------------------------------
 */

int st_handshake_write_msg3(st_handshake_t* hs, st_hs_msg3_t* out) {
  if (hs == NULL || out == NULL)
    return bad_args(hs);
  int rc = expect(hs, ST_HS_INITIATOR, STEP_MSG2);
  if (rc != 0)
    return rc;
  static const uint8_t zero_nonce[ST__HS_AEAD_NONCE_BYTES];
  static const char label3[] = ST__HS_MSG3_LABEL;
  uint8_t ck[ST__HS_CK_BYTES];
  uint8_t k3[ST_KEY_BYTES];
  uint8_t payload[ST__HS_PAYLOAD_BYTES];

  /* ck, k3 = KDF(ck, "starling-hs-v1 msg3"). */
  memcpy(ck, hs->chain, sizeof(ck));
  kdf(ck, (const uint8_t*) label3, sizeof(label3) - 1, k3);
  /* s, sig: sealed3 = AEAD(k3, 0, s_i.pub || sig_i, ad = h). */
  memcpy(payload, hs->self->public_key, ST_PUBLIC_KEY_BYTES);
  sign_transcript(payload + ST_PUBLIC_KEY_BYTES, hs->self->secret_key,
                  ST__HS_SIG_LABEL_INITIATOR, hs->hash);
  crypto_aead_xchacha20poly1305_ietf_encrypt(
      out->sealed, NULL, payload, sizeof(payload), hs->hash, ST__HS_HASH_BYTES,
      NULL, zero_nonce, k3);
  /* h = H(h || sealed3). */
  mix_hash(hs->hash, out->sealed, sizeof(out->sealed));
  memcpy(hs->chain, ck, sizeof(ck));
  hs->step = STEP_DONE;
  sodium_memzero(ck, sizeof(ck));
  sodium_memzero(k3, sizeof(k3));
  sodium_memzero(payload, sizeof(payload));
  return 0;
}

int st_handshake_read_msg3(st_handshake_t* hs, const st_hs_msg3_t* in) {
  if (hs == NULL || in == NULL)
    return bad_args(hs);
  int rc = expect(hs, ST_HS_RESPONDER, STEP_MSG2);
  if (rc != 0)
    return rc;
  static const char label3[] = ST__HS_MSG3_LABEL;
  uint8_t ck[ST__HS_CK_BYTES];
  uint8_t k3[ST_KEY_BYTES];
  uint8_t peer_pk[ST_PUBLIC_KEY_BYTES];

  memcpy(ck, hs->chain, sizeof(ck));
  kdf(ck, (const uint8_t*) label3, sizeof(label3) - 1, k3);
  /* s, sig: open sealed3, verify sig_i over "initiator" || h. */
  rc = open_identity(hs, k3, hs->hash, in->sealed, ST__HS_SIG_LABEL_INITIATOR,
                     peer_pk);
  if (rc != 0) {
    st_handshake_wipe(hs);
    goto out;
  }
  /* Commit. */
  mix_hash(hs->hash, in->sealed, sizeof(in->sealed));
  memcpy(hs->peer_pk, peer_pk, sizeof(peer_pk));
  memcpy(hs->chain, ck, sizeof(ck));
  hs->step = STEP_DONE;
out:
  sodium_memzero(ck, sizeof(ck));
  sodium_memzero(k3, sizeof(k3));
  sodium_memzero(peer_pk, sizeof(peer_pk));
  return rc;
}

/* ---- Split ------------------------------------------------------------------
 */

int st_handshake_finish(st_handshake_t* hs, st_session_t* out) {
  if (hs == NULL || out == NULL)
    return bad_args(hs);
  if (hs->step == STEP_DEAD)
    return -EPROTO;
  if (hs->step != STEP_DONE)
    return fail(hs, ST_DROP_HS_MALFORMED, -EPROTO);
  /* t_ir, t_ri = KDF(ck, h): the first output keys initiator -> responder
   * traffic, the second the other direction. */
  uint8_t t_ir[ST_KEY_BYTES];
  uint8_t t_ri[ST_KEY_BYTES];
  memcpy(t_ir, hs->chain, sizeof(t_ir));
  kdf(t_ir, hs->hash, ST__HS_HASH_BYTES, t_ri);
  bool initiator = hs->role == ST_HS_INITIATOR;
  memcpy(out->tx_key, initiator ? t_ir : t_ri, ST_KEY_BYTES);
  memcpy(out->rx_key, initiator ? t_ri : t_ir, ST_KEY_BYTES);
  memcpy(out->peer_public_key, hs->peer_pk, ST_PUBLIC_KEY_BYTES);
  st_node_id_from_public_key(hs->peer_pk, &out->peer_id);
  sodium_memzero(t_ir, sizeof(t_ir));
  sodium_memzero(t_ri, sizeof(t_ri));
  st_handshake_wipe(hs);
  return 0;
}
