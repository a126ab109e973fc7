/* test_crypto_hash.c: the Check suite for crypto/hash.c (BLAKE2b through
 * libsodium): known answers (RFC 7693's "abc", the empty string), the
 * incremental calls against one-shot crypto_generichash on random inputs
 * cut into random chunks (empty ones included), reuse after final, the
 * digest lengths of st_hash_once (16 bytes is BLAKE2b-128, not a cut
 * BLAKE2b-256), and a state that may sit in aligned heap memory. */
#include <check.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crypto/crypto.h"
#include "tests/unit/testutil.h"

static st_rng_t rng;

static void setup(void) {
  ck_assert_int_eq(st_crypto_init(), 0);
  st_rng_seed(&rng, tu_seed());
}

static void hex(const char* s, uint8_t* out, size_t n) {
  for (size_t i = 0; i < n; i++) {
    unsigned v;
    ck_assert_int_eq(sscanf(s + 2 * i, "%2x", &v), 1);
    out[i] = (uint8_t) v;
  }
}

typedef struct {
  const char* in;
  size_t out_len;
  const char* want;
} kat_t;

/* BLAKE2b-512("abc") is RFC 7693, appendix A; the others
 * from Python's hashlib.blake2b(digest_size=...). */
static const kat_t kats[] = {
    {"", 32,
     "0e5751c026e543b2e8ab2eb06099daa1d1e5df47778f7787faab45cdf12fe3a8"},
    {"abc", 32,
     "bddd813c634239723171ef3fee98579b94964e3bb1cb3e427262c8c068d52319"},
    {"abc", 16, "cf4ab791c62b8d2b2109c90275287816"},
};

START_TEST(test_known_answers) {
  for (size_t i = 0; i < sizeof kats / sizeof kats[0]; i++) {
    const kat_t* k = &kats[i];
    uint8_t want[32], got[32];
    hex(k->want, want, k->out_len);
    st_hash_once(k->in, strlen(k->in), got, k->out_len);
    ck_assert_mem_eq(got, want, k->out_len);
    if (k->out_len == ST_HASH_BYTES) {
      st_hash_t h;
      st_hash_init(&h);
      for (size_t j = 0; k->in[j] != '\0'; j++)
        st_hash_update(&h, k->in + j, 1);
      st_hash_final(&h, got);
      ck_assert_mem_eq(got, want, ST_HASH_BYTES);
    }
  }
  /* RFC 7693 appendix A: BLAKE2b-512("abc") starts BA 80 A5 3F. The
   * library, not our code, is checked here: that it is the BLAKE2b. */
  uint8_t full[64];
  crypto_generichash(full, sizeof full, (const uint8_t*) "abc", 3, NULL, 0);
  static const uint8_t rfc[4] = {0xba, 0x80, 0xa5, 0x3f};
  ck_assert_mem_eq(full, rfc, 4);
}
END_TEST

/* Random inputs of sizes 0, 1, indivisible and large (past BLAKE2b's
 * 128-byte block, several times), in random chunks, against one shot. */
START_TEST(test_random_chunkings) {
  static const size_t sizes[] = {0,    1,    63,    64,       127,
                                 128,  129,  255,   256,      257,
                                 1000, 4096, 65537, 1u << 20, (1u << 20) + 3};
  size_t max = (1u << 20) + 3;
  uint8_t* data = malloc(max);
  ck_assert_ptr_nonnull(data);
  for (size_t i = 0; i < max; i++)
    data[i] = (uint8_t) st_rng_next(&rng);
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    size_t n = sizes[s];
    uint8_t want[32], once[32];
    crypto_generichash(want, sizeof want, data, n, NULL, 0);
    st_hash_once(data, n, once, sizeof once);
    ck_assert_mem_eq(once, want, 32);
    for (int it = 0; it < (n > 100000 ? 4 : 50); it++) {
      st_hash_t h;
      st_hash_init(&h);
      size_t off = 0;
      while (off < n) {
        /* Mostly small chunks, some empty, some large. */
        size_t c;
        switch (st_rng_below(&rng, 4)) {
          case 0:
            c = 0;
            break;
          case 1:
            c = st_rng_below(&rng, 200);
            break;
          default:
            c = st_rng_below(&rng, n - off + 1);
            break;
        }
        if (c > n - off)
          c = n - off;
        st_hash_update(&h, data + off, c);
        off += c;
      }
      st_hash_update(&h, NULL, 0);
      uint8_t got[32];
      st_hash_final(&h, got);
      ck_assert_msg(memcmp(got, want, 32) == 0, "size %zu, iteration %d", n,
                    it);
    }
  }
  free(data);
}
END_TEST

/* A state reused after final (init again) and one in aligned heap
 * memory, as a machine that holds an st_hash_t allocates it. */
START_TEST(test_reuse_and_heap) {
  uint8_t data[300], want[32], got[32];
  for (size_t i = 0; i < sizeof data; i++)
    data[i] = (uint8_t) i;
  crypto_generichash(want, 32, data, sizeof data, NULL, 0);
  st_hash_t* h = aligned_alloc(_Alignof(st_hash_t), sizeof(st_hash_t));
  ck_assert_ptr_nonnull(h);
  for (int round = 0; round < 3; round++) {
    st_hash_init(h);
    st_hash_update(h, data, 100);
    st_hash_update(h, data + 100, 200);
    memset(got, 0, sizeof got);
    st_hash_final(h, got);
    ck_assert_mem_eq(got, want, 32);
  }
  free(h);
  /* Different inputs, different digests: the test above is not vacuous. */
  data[299] ^= 1;
  st_hash_once(data, sizeof data, got, 32);
  ck_assert(memcmp(got, want, 32) != 0);
}
END_TEST

/* st_hash_once's digest lengths: libsodium's outlen is a parameter of the
 * hash, so every length gives an unrelated digest, never a prefix. */
START_TEST(test_once_lengths) {
  uint8_t data[77];
  for (size_t i = 0; i < sizeof data; i++)
    data[i] = (uint8_t) st_rng_next(&rng);
  uint8_t d32[32];
  st_hash_once(data, sizeof data, d32, 32);
  for (size_t len = 16; len <= 32; len++) {
    uint8_t got[32], want[32];
    st_hash_once(data, sizeof data, got, len);
    crypto_generichash(want, len, data, sizeof data, NULL, 0);
    ck_assert_mem_eq(got, want, len);
    if (len < 32)
      ck_assert(memcmp(got, d32, len) != 0);
  }
}
END_TEST

static Suite* hash_suite(void) {
  Suite* s = suite_create("crypto_hash");
  TCase* t = tcase_create("hash");
  tcase_add_checked_fixture(t, setup, NULL);
  tcase_add_test(t, test_known_answers);
  tcase_add_test(t, test_random_chunkings);
  tcase_add_test(t, test_reuse_and_heap);
  tcase_add_test(t, test_once_lengths);
  suite_add_tcase(s, t);
  return s;
}

int main(void) {
  tu_seed(); /* print the seed once, before the forks */
  SRunner* sr = srunner_create(hash_suite());
  srunner_run_all(sr, CK_ENV);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
