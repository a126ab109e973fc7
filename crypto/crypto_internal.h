/* crypto_internal.h: helpers shared by the files of crypto/; not part of
 * the public interface (crypto.h). */
#ifndef STARLING_CRYPTO_INTERNAL_H
#define STARLING_CRYPTO_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "crypto/crypto.h"

/* Counts one drop in c (which may be NULL). */
void st__crypto_count(st_crypto_counters_t* c, st_crypto_drop_t reason);

/* Fills an identity (key pair and id) from a 32-byte Ed25519 seed. */
int st__identity_from_seed(st_identity_t* id, const uint8_t seed[32]);

/* Sets key->id from key->key. */
void st__cluster_key_set_id(st_cluster_key_t* key);

/* The key with this id in the ring and its slot (0 current, 1 previous),
 * or NULL. slot may be NULL. */
const st_cluster_key_t* st__keyring_find(const st_keyring_t* ring,
                                         uint8_t key_id, int* slot);

/* A fresh random 24-byte nonce from a per-thread key-erasure generator
 * seeded by the kernel (crypto/nonce.c); much cheaper than one getrandom()
 * call per packet. */
void st__random_nonce24(uint8_t out[24]);

/* Copies the calling thread's current generator key (the key of its next
 * refill): for the key-erasure test only, which checks that this key
 * cannot regenerate nonces already handed out. */
void st__nonce_key_for_test(uint8_t out[32]);

#endif
