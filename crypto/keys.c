/* keys.c: the in-memory keys of a node: libsodium start-up, node ids,
 * identities (Ed25519), cluster keys and their key ids, the keyring that
 * holds the current and previous cluster key with their derived packet
 * subkeys, and the names of the drop counters. Key files are in
 * crypto/keyfile.c. */
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "crypto/crypto.h"
#include "crypto/constants.h"
#include "crypto/crypto_internal.h"

int st_crypto_init(void) {
  /* sodium_init is thread-safe and returns 1 when already initialized. */
  return sodium_init() < 0 ? -EIO : 0;
}

static const char* const drop_names[ST_CRYPTO_DROP_COUNT] = {
    [ST_DROP_PACKET_SHORT] = "packet_short",
    [ST_DROP_PACKET_LONG] = "packet_long",
    [ST_DROP_PACKET_VERSION] = "packet_version",
    [ST_DROP_PACKET_KEY_ID] = "packet_key_id",
    [ST_DROP_PACKET_AUTH] = "packet_auth",
    [ST_DROP_PACKET_REPLAY] = "packet_replay",
    [ST_DROP_PACKET_OLD_EPOCH] = "packet_old_epoch",
    [ST_DROP_PACKET_SENDERS_FULL] = "packet_senders_full",
    [ST_DROP_PACKET_SIGNATURE] = "packet_signature",
    [ST_DROP_PACKET_NOT_ALLOWED] = "packet_not_allowed",
    [ST_DROP_HS_MALFORMED] = "handshake_malformed",
    [ST_DROP_HS_KEY_ID] = "handshake_key_id",
    [ST_DROP_HS_MAC] = "handshake_mac",
    [ST_DROP_HS_AUTH] = "handshake_auth",
    [ST_DROP_HS_SIGNATURE] = "handshake_signature",
    [ST_DROP_HS_NOT_ALLOWED] = "handshake_not_allowed",
    [ST_DROP_HS_SELF] = "handshake_self",
    [ST_DROP_FRAME_TOO_LARGE] = "frame_too_large",
    [ST_DROP_STREAM_AUTH] = "stream_auth",
    [ST_DROP_STREAM_TRUNCATED] = "stream_truncated",
    [ST_DROP_STREAM_AFTER_FINAL] = "stream_after_final",
};

const char* st_crypto_drop_name(st_crypto_drop_t reason) {
  return (unsigned) reason < ST_CRYPTO_DROP_COUNT ? drop_names[reason]
                                                  : "unknown";
}

void st__crypto_count(st_crypto_counters_t* c, st_crypto_drop_t reason) {
  if (c != NULL && (unsigned) reason < ST_CRYPTO_DROP_COUNT)
    c->drops[reason]++;
}

/* ---- Node ids ------------------------------------------------------------ */

void st_node_id_from_public_key(const uint8_t pk[ST_PUBLIC_KEY_BYTES],
                                st_node_id_t* id) {
  /* BLAKE2b-128, personalized so that the id can never collide with another
   * use of a hash of the same key. */
  static const uint8_t personal[crypto_generichash_blake2b_PERSONALBYTES] =
      ST__PERSONAL_NODE_ID;
  crypto_generichash_blake2b_salt_personal(
      id->b, sizeof(id->b), pk, ST_PUBLIC_KEY_BYTES, NULL, 0, NULL, personal);
}

void st_node_id_format(const st_node_id_t* id, char buf[33]) {
  sodium_bin2hex(buf, 33, id->b, sizeof(id->b));
}

int st_node_id_compare(const st_node_id_t* a, const st_node_id_t* b) {
  int c = memcmp(a->b, b->b, sizeof(a->b));
  return (c > 0) - (c < 0);
}

void st_public_key_format(const uint8_t pk[ST_PUBLIC_KEY_BYTES], char buf[44]) {
  sodium_bin2base64(buf, 44, pk, ST_PUBLIC_KEY_BYTES,
                    sodium_base64_VARIANT_URLSAFE_NO_PADDING);
}

/* ---- Identities ------------------------------------------------------------
 */

int st__identity_from_seed(st_identity_t* id, const uint8_t seed[32]) {
  if (crypto_sign_seed_keypair(id->public_key, id->secret_key, seed) != 0)
    return -EIO;
  st_node_id_from_public_key(id->public_key, &id->id);
  return 0;
}

int st_identity_generate(st_identity_t* id) {
  uint8_t seed[32];
  randombytes_buf(seed, sizeof(seed));
  int rc = st__identity_from_seed(id, seed);
  sodium_memzero(seed, sizeof(seed));
  return rc;
}

void st_identity_wipe(st_identity_t* id) {
  sodium_memzero(id, sizeof(*id));
}

void st_identity_sign(const st_identity_t* id, const uint8_t* msg, size_t len,
                      uint8_t sig[ST_SIGNATURE_BYTES]) {
  crypto_sign_detached(sig, NULL, msg, len, id->secret_key);
}

bool st_identity_verify(const uint8_t pk[ST_PUBLIC_KEY_BYTES],
                        const uint8_t* msg, size_t len,
                        const uint8_t sig[ST_SIGNATURE_BYTES]) {
  return crypto_sign_verify_detached(sig, msg, len, pk) == 0;
}

/* ---- Cluster keys
 * ------------------------------------------------------------ */

void st__cluster_key_set_id(st_cluster_key_t* key) {
  static const uint8_t personal[crypto_generichash_blake2b_PERSONALBYTES] =
      ST__PERSONAL_KEY_ID;
  uint8_t h[16];
  crypto_generichash_blake2b_salt_personal(
      h, sizeof(h), key->key, sizeof(key->key), NULL, 0, NULL, personal);
  key->id = h[0];
  /* Only the first byte is public; the rest is a hash of a secret, wiped
   * like any other (STYLE.md rule 5). */
  sodium_memzero(h, sizeof(h));
}

void st_cluster_key_from_bytes(st_cluster_key_t* key,
                               const uint8_t bytes[ST_KEY_BYTES]) {
  memcpy(key->key, bytes, ST_KEY_BYTES);
  st__cluster_key_set_id(key);
}

int st_cluster_key_generate(st_cluster_key_t* key) {
  crypto_secretbox_keygen(key->key); /* 32 random bytes */
  st__cluster_key_set_id(key);
  return 0;
}

void st_crypto_wipe(void* p, size_t n) {
  sodium_memzero(p, n);
}

void st_cluster_key_wipe(st_cluster_key_t* key) {
  sodium_memzero(key, sizeof(*key));
}

/* ---- Keyrings
 * -------------------------------------------------------------------- */

/* The packet subkey of slot (0 current, 1 previous) from its key. */
static void derive_slot(st_keyring_t* ring, int slot) {
  const st_cluster_key_t* k = slot == 0 ? &ring->current : &ring->previous;
  crypto_kdf_derive_from_key(ring->packet_key[slot], ST_KEY_BYTES,
                             ST__KDF_SUBKEY_PACKET, ST__KDF_CONTEXT_PACKET,
                             k->key);
}

int st_keyring_init(st_keyring_t* ring, const st_cluster_key_t* current,
                    const st_cluster_key_t* previous, char* err,
                    size_t err_len) {
  memset(ring, 0, sizeof(*ring));
  if (previous != NULL) {
    if (sodium_memcmp(previous->key, current->key, ST_KEY_BYTES) == 0) {
      st_set_err(err, err_len,
                 "the previous cluster key is the same as the current "
                 "one; give the key you are rotating away from");
      return -EINVAL;
    }
    if (previous->id == current->id) {
      st_set_err(err, err_len,
                 "the current and previous cluster keys share key id "
                 "%u (a 1 in 256 chance); generate another new key "
                 "with `starling keygen --cluster`",
                 (unsigned) current->id);
      return -EINVAL;
    }
  }
  ring->current = *current;
  derive_slot(ring, 0);
  if (previous != NULL) {
    ring->previous = *previous;
    ring->has_previous = true;
    derive_slot(ring, 1);
  }
  return 0;
}

void st_keyring_wipe(st_keyring_t* ring) {
  sodium_memzero(ring, sizeof(*ring));
}

bool st_keyring_holds(const st_keyring_t* ring, const st_cluster_key_t* key) {
  return sodium_memcmp(key->key, ring->current.key, ST_KEY_BYTES) == 0 ||
         (ring->has_previous &&
          sodium_memcmp(key->key, ring->previous.key, ST_KEY_BYTES) == 0);
}

int st_keyring_install(st_keyring_t* ring, const st_cluster_key_t* key,
                       char* err, size_t err_len) {
  if (st_keyring_holds(ring, key))
    return 0;
  if (key->id == ring->current.id) {
    st_set_err(err, err_len,
               "the new key shares key id %u with the key in use (a 1 in "
               "256 chance); generate another with `starling keygen "
               "--cluster`",
               (unsigned) key->id);
    return -EINVAL;
  }
  if (ring->has_previous) {
    st_set_err(err, err_len,
               "this node already holds a second key (id %u); remove it "
               "first: `starling keys remove %u`",
               (unsigned) ring->previous.id, (unsigned) ring->previous.id);
    return -EEXIST;
  }
  ring->previous = *key;
  ring->has_previous = true;
  derive_slot(ring, 1);
  return 0;
}

int st_keyring_use(st_keyring_t* ring, uint8_t key_id, char* err,
                   size_t err_len) {
  if (ring->current.id == key_id)
    return 0;
  if (!ring->has_previous || ring->previous.id != key_id) {
    st_set_err(err, err_len,
               "this node holds no key of id %u; install it first: "
               "`starling keys install FILE`",
               (unsigned) key_id);
    return -ENOENT;
  }
  st_cluster_key_t k = ring->current;
  ring->current = ring->previous;
  ring->previous = k;
  sodium_memzero(&k, sizeof k);
  derive_slot(ring, 0);
  derive_slot(ring, 1);
  return 0;
}

int st_keyring_remove(st_keyring_t* ring, uint8_t key_id, char* err,
                      size_t err_len) {
  if (ring->current.id == key_id) {
    st_set_err(err, err_len,
               "key %u is the one this node sends with; `starling keys "
               "use` another first",
               (unsigned) key_id);
    return -EBUSY;
  }
  if (!ring->has_previous || ring->previous.id != key_id) {
    st_set_err(err, err_len, "this node holds no key of id %u",
               (unsigned) key_id);
    return -ENOENT;
  }
  sodium_memzero(&ring->previous, sizeof ring->previous);
  sodium_memzero(ring->packet_key[1], sizeof ring->packet_key[1]);
  ring->has_previous = false;
  return 0;
}

const st_cluster_key_t* st__keyring_find(const st_keyring_t* ring,
                                         uint8_t key_id, int* slot) {
  if (ring->current.id == key_id) {
    if (slot)
      *slot = 0;
    return &ring->current;
  }
  if (ring->has_previous && ring->previous.id == key_id) {
    if (slot)
      *slot = 1;
    return &ring->previous;
  }
  return NULL;
}
