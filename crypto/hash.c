/* hash.c: BLAKE2b (RFC 7693) through libsodium's crypto_generichash, for
 * verifying the tensors that exchanges stream (gossip/exchange.c hashes the
 * float bytes it sends and receives) and for model fingerprints. Unkeyed:
 * it catches corruption and bugs, not forgery; the encrypted stream under
 * it already authenticates every frame (crypto/stream.c).
 *
 * st_hash_t holds libsodium's state in an opaque buffer of our own, so that
 * crypto.h exposes no libsodium type (STYLE.md rule 6); the asserts below
 * hold that buffer to the size and alignment libsodium asks for. */
#include <assert.h>
#include <sodium.h>
#include <stdalign.h>

#include "crypto/crypto.h"

_Static_assert(sizeof(crypto_generichash_state) <=
                   sizeof(((st_hash_t*) 0)->state),
               "st_hash_t too small for libsodium's generichash state");
_Static_assert(alignof(crypto_generichash_state) <= alignof(st_hash_t),
               "st_hash_t not aligned enough for libsodium's state");
_Static_assert(ST_HASH_BYTES >= crypto_generichash_BYTES_MIN &&
                   ST_HASH_BYTES <= crypto_generichash_BYTES_MAX,
               "ST_HASH_BYTES is not a BLAKE2b digest length");

static crypto_generichash_state* state_of(st_hash_t* h) {
  /* Aligned by the asserts above: st_hash_t's alignment is the state's. */
  return (crypto_generichash_state*) (void*) h->state;
}

void st_hash_init(st_hash_t* h) {
  /* The size libsodium reports at run time agrees with its header's; a
   * shared library of another build that did not would fail here. */
  assert(crypto_generichash_statebytes() <= sizeof h->state);
  /* Cannot fail: no key and a valid digest length. */
  int rc = crypto_generichash_init(state_of(h), NULL, 0, ST_HASH_BYTES);
  assert(rc == 0);
  (void) rc;
}

void st_hash_update(st_hash_t* h, const void* data, size_t len) {
  if (len == 0)
    return; /* data may be NULL then */
  int rc = crypto_generichash_update(state_of(h), data, len);
  assert(rc == 0);
  (void) rc;
}

void st_hash_final(st_hash_t* h, uint8_t out[ST_HASH_BYTES]) {
  int rc = crypto_generichash_final(state_of(h), out, ST_HASH_BYTES);
  assert(rc == 0);
  (void) rc;
  sodium_memzero(h->state, sizeof h->state);
}

void st_hash_once(const void* data, size_t len, uint8_t* out, size_t out_len) {
  assert(out_len >= 16 && out_len <= ST_HASH_BYTES);
  static const uint8_t empty[1];
  int rc = crypto_generichash(out, out_len, len ? data : empty, len, NULL, 0);
  assert(rc == 0);
  (void) rc;
}
