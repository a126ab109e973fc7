/* fuzz_common.h: fixed keys and identities for the libFuzzer targets, so
 * that a crashing input reproduces. Test-only; header-only so that each
 * target stays one file. Never use these keys anywhere else. */
#ifndef STARLING_FUZZ_COMMON_H
#define STARLING_FUZZ_COMMON_H

#include <stdlib.h>
#include <string.h>

#include "crypto/crypto.h"
#include "crypto/crypto_internal.h"
#include "gossip/gossip.h"

/* A keyring over a fixed cluster key (byte b repeated). */
static inline void fuzz_keyring(st_keyring_t* ring, uint8_t b) {
  st_cluster_key_t k;
  memset(k.key, b, sizeof(k.key));
  st__cluster_key_set_id(&k);
  if (st_crypto_init() != 0 || st_keyring_init(ring, &k, NULL, NULL, 0) != 0)
    abort();
}

/* An identity from a fixed seed (byte b repeated). */
static inline void fuzz_identity(st_identity_t* id, uint8_t b) {
  uint8_t seed[32];
  memset(seed, b, sizeof(seed));
  if (st__identity_from_seed(id, seed) != 0)
    abort();
}

#endif
