/* test_crypto_nonce.c: Check suite for crypto/nonce.c, the per-thread
 * nonce pool behind sealed packets: nonces never repeat, are not trivially
 * structured, differ between threads, a forked child does not repeat its
 * parent's next nonces, and the key left in memory cannot regenerate the
 * nonces already handed out (fast key erasure). */
#define _GNU_SOURCE /* memmem */
#include <check.h>
#include <pthread.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "crypto/crypto.h"
#include "crypto/crypto_internal.h"

enum { N = 200000 };

static int cmp24(const void* a, const void* b) {
  return memcmp(a, b, 24);
}

START_TEST(test_nonces_never_repeat) {
  ck_assert_int_eq(st_crypto_init(), 0);
  uint8_t(*n)[24] = malloc(sizeof(uint8_t[24]) * N);
  ck_assert_ptr_nonnull(n);
  size_t ones = 0;
  for (int i = 0; i < N; i++) {
    st__random_nonce24(n[i]);
    for (int b = 0; b < 24; b++)
      ones += (size_t) __builtin_popcount(n[i][b]);
  }
  /* Half the bits set, within 1% (the expected spread is far smaller). */
  double frac = (double) ones / (N * 24.0 * 8.0);
  ck_assert_msg(frac > 0.495 && frac < 0.505, "bit balance %f", frac);
  qsort(n, N, 24, cmp24);
  for (int i = 1; i < N; i++)
    ck_assert_msg(memcmp(n[i - 1], n[i], 24) != 0, "nonce repeated");
  free(n);
}
END_TEST

static void* draw(void* out) {
  st__random_nonce24(out);
  return NULL;
}

START_TEST(test_threads_draw_different_nonces) {
  ck_assert_int_eq(st_crypto_init(), 0);
  uint8_t a[24], b[24];
  pthread_t t1, t2;
  ck_assert_int_eq(pthread_create(&t1, NULL, draw, a), 0);
  ck_assert_int_eq(pthread_create(&t2, NULL, draw, b), 0);
  pthread_join(t1, NULL);
  pthread_join(t2, NULL);
  ck_assert(memcmp(a, b, 24) != 0);
}
END_TEST

START_TEST(test_fork_does_not_repeat_nonces) {
  ck_assert_int_eq(st_crypto_init(), 0);
  uint8_t first[24];
  st__random_nonce24(first); /* the pool now holds 63 more */
  int fd[2];
  ck_assert_int_eq(pipe(fd), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    uint8_t child[24];
    st__random_nonce24(child);
    ssize_t w = write(fd[1], child, sizeof(child));
    _exit(w == (ssize_t) sizeof(child) ? 0 : 1);
  }
  uint8_t parent[24], child[24];
  st__random_nonce24(parent);
  ck_assert_int_eq(read(fd[0], child, sizeof(child)), (ssize_t) sizeof(child));
  int status = 0;
  waitpid(pid, &status, 0);
  ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ck_assert_msg(memcmp(parent, child, 24) != 0,
                "the child repeated the parent's next nonce");
  close(fd[0]);
  close(fd[1]);
}
END_TEST

/* Key erasure, in a fresh thread (so that its first nonce comes from its
 * first refill): after nonces have been drawn, the generator key left in
 * memory must produce none of them, under any ChaCha20 nonce the
 * generator could have used (a keystream position 0..255 in the first
 * bytes). Then, since the key changes at every refill, two keys read 64
 * nonces apart differ. */
enum { DRAWN = 3 * 64 + 5 }; /* four refills */

static void* erasure(void* arg) {
  uint8_t(*drawn)[24] = arg;
  for (int i = 0; i < DRAWN; i++)
    st__random_nonce24(drawn[i]);
  uint8_t key[32], key2[32];
  st__nonce_key_for_test(key);
  static uint8_t ks[32 + 64 * 24 * 4];
  int found = 0;
  for (uint32_t block = 0; block < 256 && !found; block++) {
    uint8_t sn[crypto_stream_chacha20_ietf_NONCEBYTES] = {0};
    memcpy(sn, &block, sizeof(block));
    crypto_stream_chacha20_ietf(ks, sizeof(ks), sn, key);
    for (int i = 0; i < DRAWN && !found; i++)
      found = memmem(ks, sizeof(ks), drawn[i], 24) != NULL;
  }
  uint8_t more[64][24];
  for (int i = 0; i < 64; i++)
    st__random_nonce24(more[i]);
  st__nonce_key_for_test(key2);
  int changed = memcmp(key, key2, 32) != 0;
  sodium_memzero(key, sizeof(key));
  sodium_memzero(key2, sizeof(key2));
  return (void*) (intptr_t) (found ? 1 : changed ? 0 : 2);
}

START_TEST(test_key_erasure) {
  ck_assert_int_eq(st_crypto_init(), 0);
  static uint8_t drawn[DRAWN][24];
  pthread_t t;
  void* res = NULL;
  ck_assert_int_eq(pthread_create(&t, NULL, erasure, drawn), 0);
  pthread_join(t, &res);
  ck_assert_msg(res != (void*) 1,
                "the key in memory regenerates nonces already handed out");
  ck_assert_msg(res != (void*) 2, "the key did not change at a refill");
}
END_TEST

int main(void) {
  Suite* s = suite_create("crypto_nonce");
  TCase* tc = tcase_create("nonce");
  tcase_add_test(tc, test_nonces_never_repeat);
  tcase_add_test(tc, test_threads_draw_different_nonces);
  tcase_add_test(tc, test_fork_does_not_repeat_nonces);
  tcase_add_test(tc, test_key_erasure);
  suite_add_tcase(s, tc);
  SRunner* sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
