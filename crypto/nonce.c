/* nonce.c: random 24-byte nonces for sealed packets, fast.
 *
 * libsodium 1.0.18's randombytes_buf is a getrandom() system call per call:
 * about 1 us, which made sealing a 1400-byte packet 37% slower than the
 * AEAD itself (docs/benchmarks.md). Instead each thread keeps a pool of
 * random bytes from a fast key-erasure generator (Bernstein, "Fast-key-
 * erasure random-number generators", 2017; as arc4random and libsodium's
 * own internal generator do): a refill runs ChaCha20 under the current
 * 32-byte key, takes the first 32 bytes of the keystream as the next key,
 * overwriting the old one, and the next 64 * 24 bytes as the pool. Each
 * nonce is wiped from the pool as it is handed out. So a later disclosure
 * of this memory (a core dump, a heap over-read) shows only the next key
 * and the nonces not yet used: the old key is gone, and ChaCha20 cannot be
 * run backwards from its output, so the nonces already sent cannot be
 * reconstructed. The first key, and a fresh one every 2^16 refills, come
 * from the kernel's generator, which bounds how long a disclosed state
 * predicts future nonces. The nonces stay unpredictable and, being 192-bit
 * random values, never repeat in practice.
 *
 * A forked child would inherit the pool and repeat its parent's nonces
 * under the same key: a pthread_atfork handler empties the pool in the
 * child, which then draws a fresh key. Known limitation: nothing can tell
 * this code that its memory was duplicated behind its back. Restoring a
 * VM snapshot, or a CRIU checkpoint, more than once (or resuming it while
 * the original runs) gives two processes the same pool and key, and they
 * emit the same nonces until the next kernel rekey; a repeated nonce under
 * one packet key reveals the XOR of the two plaintexts and the Poly1305
 * key of that nonce. Restart starling on a restored machine instead of
 * resuming it (a restart also begins a new boot epoch). */
#include <pthread.h>
#include <sodium.h>
#include <string.h>

#include "crypto/crypto_internal.h"

#define NONCE_BYTES 24
#define POOL_NONCES 64
#define REKEY_EVERY_REFILLS (1u << 16)
#define KEY_BYTES crypto_stream_chacha20_ietf_KEYBYTES

typedef struct {
  uint8_t key[KEY_BYTES]; /* the next refill's key; replaced at each refill */
  uint8_t pool[POOL_NONCES * NONCE_BYTES];
  size_t used;      /* nonces taken from the pool */
  uint32_t refills; /* since the last key from the kernel */
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
  }
  /* One keystream per key: the next key, then the pool. Every key is used
   * for exactly one keystream, so the stream nonce can be the constant
   * zero. */
  static const uint8_t stream_nonce[crypto_stream_chacha20_ietf_NONCEBYTES];
  uint8_t out[KEY_BYTES + sizeof(p->pool)];
  crypto_stream_chacha20_ietf(out, sizeof(out), stream_nonce, p->key);
  memcpy(p->key, out, KEY_BYTES); /* erases the key just used */
  memcpy(p->pool, out + KEY_BYTES, sizeof(p->pool));
  sodium_memzero(out, sizeof(out));
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

void st__nonce_key_for_test(uint8_t out[32]) {
  memcpy(out, tls_pool.key, KEY_BYTES);
}
