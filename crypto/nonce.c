/* nonce.c: random 24-byte nonces for sealed packets, fast.
 *
 * libsodium 1.0.18's randombytes_buf is a getrandom() system call per call:
 * about 1 us, which made sealing a 1400-byte packet 37% slower than the
 * AEAD itself (docs/benchmarks.md). Instead each thread keeps a pool of
 * random bytes: the ChaCha20 keystream under a 32-byte key drawn from the
 * kernel's generator (a fast key-erasure CSPRNG, as arc4random and
 * libsodium's own internal generator do), refilled 64 nonces at a time,
 * and rekeyed from the kernel every 2^16 refills. The nonces stay
 * unpredictable and, being 192-bit random values, never repeat in practice.
 *
 * A forked child would inherit the pool and repeat its parent's nonces
 * under the same key: a pthread_atfork handler empties the pool in the
 * child, which then draws a fresh key. */
#include <pthread.h>
#include <sodium.h>
#include <string.h>

#include "crypto/crypto_internal.h"

#define NONCE_BYTES 24
#define POOL_NONCES 64
#define REKEY_EVERY_REFILLS (1u << 16)

typedef struct {
  uint8_t key[crypto_stream_chacha20_ietf_KEYBYTES];
  uint8_t pool[POOL_NONCES * NONCE_BYTES];
  size_t used;      /* nonces taken from the pool */
  uint32_t refills; /* since the last rekey */
  uint32_t block;   /* keystream position, in refills */
  int keyed;
} nonce_pool_t;

static _Thread_local nonce_pool_t tls_pool;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void forget_pool_in_child(void) {
  sodium_memzero(&tls_pool, sizeof(tls_pool));
}

static void register_atfork(void) {
  pthread_atfork(NULL, NULL, forget_pool_in_child);
}

static void refill(nonce_pool_t* p) {
  if (!p->keyed || p->refills >= REKEY_EVERY_REFILLS) {
    randombytes_buf(p->key, sizeof(p->key));
    p->keyed = 1;
    p->refills = 0;
    p->block = 0;
  }
  /* Each refill uses its own 96-bit nonce for the keystream, so that no
   * keystream byte is ever used twice under one key. */
  uint8_t stream_nonce[crypto_stream_chacha20_ietf_NONCEBYTES] = {0};
  memcpy(stream_nonce, &p->block, sizeof(p->block));
  crypto_stream_chacha20_ietf(p->pool, sizeof(p->pool), stream_nonce, p->key);
  p->block++;
  p->refills++;
  p->used = 0;
}

void st__random_nonce24(uint8_t out[24]) {
  pthread_once(&atfork_once, register_atfork);
  nonce_pool_t* p = &tls_pool;
  if (!p->keyed || p->used == POOL_NONCES)
    refill(p);
  uint8_t* n = p->pool + p->used * NONCE_BYTES;
  memcpy(out, n, NONCE_BYTES);
  /* Erase what was handed out, so that a later memory leak of the pool
   * cannot reveal nonces already used (key erasure). */
  sodium_memzero(n, NONCE_BYTES);
  p->used++;
}
