/* fuzz_common.h: what the libFuzzer targets share: CHECK, the reading of a
 * script-like input a byte or a frame at a time, and fixed keys and
 * identities, so that a crashing input reproduces. Test-only; header-only
 * so that each target stays one file. Never use these keys anywhere
 * else. */
#ifndef STARLING_FUZZ_COMMON_H
#define STARLING_FUZZ_COMMON_H

#include <stdlib.h>
#include <string.h>

#include "crypto/crypto.h"
#include "crypto/crypto_internal.h"
#include "gossip/gossip.h"

/* A property of the code under test: a crash when it fails, so that
 * libFuzzer reports the input (and NDEBUG cannot turn it off). */
#define CHECK(x) \
  do {           \
    if (!(x))    \
      abort();   \
  } while (0)

/* An input read as a script: bytes taken from the front. */
typedef struct {
  const uint8_t* p;
  size_t left;
} fuzz_in_t;

/* The next byte, or 0 past the end. */
static inline uint8_t fuzz_byte(fuzz_in_t* in) {
  if (in->left == 0)
    return 0;
  in->left--;
  return *in->p++;
}

/* A raw frame: a length byte, then that many bytes (fewer at the end).
 * Returns the frame and writes its length into *len. */
static inline const uint8_t* fuzz_frame(fuzz_in_t* in, size_t* len) {
  size_t n = fuzz_byte(in);
  if (n > in->left)
    n = in->left;
  const uint8_t* p = in->p;
  in->p += n;
  in->left -= n;
  *len = n;
  return p;
}

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

/* The handshake targets' fixed parties: cluster key 0x42.., initiator
 * identity 0x0a.., responder 0x0b.. (gen_fuzz_seeds uses the same). */
typedef struct {
  st_keyring_t ring;
  st_identity_t a, b;
} fuzz_hs_env_t;

static inline const fuzz_hs_env_t* fuzz_hs_env(void) {
  static fuzz_hs_env_t env;
  static int ready;
  if (!ready) {
    fuzz_keyring(&env.ring, 0x42);
    fuzz_identity(&env.a, 0x0a);
    fuzz_identity(&env.b, 0x0b);
    ready = 1;
  }
  return &env;
}

/* Decodes the input as a node decodes a frame's message; returns 1 when it
 * is a message of `type` (then *msg holds it), 0 otherwise. */
static inline int fuzz_decode_as(const uint8_t* data, size_t size,
                                 st_msg_type_t type, st_msg_t* msg) {
  st_wire_counters_t wc = {{0}};
  if (st_wire_decode(data, size, msg, &wc) != 0)
    return 0;
  if (msg->type == type)
    return 1;
  st_wire_msg_free(msg);
  return 0;
}

/* A fresh initiator and responder over the environment. */
static inline void fuzz_hs_pair(const fuzz_hs_env_t* env, st_handshake_t* hi,
                                st_handshake_t* hr, st_crypto_counters_t* cc) {
  if (st_handshake_init(hi, ST_HS_INITIATOR, &env->a, &env->ring, NULL, cc) !=
          0 ||
      st_handshake_init(hr, ST_HS_RESPONDER, &env->b, &env->ring, NULL, cc) !=
          0)
    abort();
}

#endif
