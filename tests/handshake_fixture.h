/* handshake_fixture.h: the parties of the handshake suites
 * (test_crypto_handshake.c, test_gossip_session.c): an initiator id_i, a
 * responder id_r and a third node id_m, fresh identities each test, and
 * two cluster keys with different key ids, each in its own keyring (ring_a,
 * ring_b). Test-only, header-only: call hs_fixture_setup from a suite's
 * checked fixture. */
#ifndef STARLING_TESTS_HANDSHAKE_FIXTURE_H
#define STARLING_TESTS_HANDSHAKE_FIXTURE_H

#include <check.h>

#include "crypto/crypto.h"

static st_identity_t id_i, id_r, id_m;
static st_cluster_key_t key_a, key_b;
static st_keyring_t ring_a, ring_b;

static inline void hs_fixture_setup(void) {
  ck_assert_int_eq(st_crypto_init(), 0);
  st_identity_generate(&id_i);
  st_identity_generate(&id_r);
  st_identity_generate(&id_m);
  st_cluster_key_generate(&key_a);
  do {
    st_cluster_key_generate(&key_b);
  } while (key_b.id == key_a.id);
  ck_assert_int_eq(st_keyring_init(&ring_a, &key_a, NULL, NULL, 0), 0);
  ck_assert_int_eq(st_keyring_init(&ring_b, &key_b, NULL, NULL, 0), 0);
}

#endif
