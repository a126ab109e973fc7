/* member_identity.h: the made-up members of the membership tests and of
 * the membership fuzz target (whose committed corpus holds packets between
 * them): member i's public key is 0x5A, then i as two little-endian bytes,
 * then zeros; its address is 10.0.(i >> 8).(i & 255):7946. Their claims
 * are "signed" with a stand-in keyed hash (member_mac below), since the
 * made-up keys are not Ed25519 points. Test-only, header-only. */
#ifndef STARLING_TESTS_MEMBER_IDENTITY_H
#define STARLING_TESTS_MEMBER_IDENTITY_H

#include <string.h>

#include "gossip/gossip.h"

static inline void member_identity(int i, uint8_t pk[ST_PUBLIC_KEY_BYTES],
                                   st_node_id_t* id, st_wire_addr_t* addr) {
  memset(pk, 0, ST_PUBLIC_KEY_BYTES);
  pk[0] = 0x5A;
  pk[1] = (uint8_t) i;
  pk[2] = (uint8_t) (i >> 8);
  st_node_id_from_public_key(pk, id);
  memset(addr, 0, sizeof *addr);
  addr->ip_len = 4;
  addr->ip[0] = 10;
  addr->ip[2] = (uint8_t) (i >> 8);
  addr->ip[3] = (uint8_t) i;
  addr->port = 7946;
}

/* A stand-in for Ed25519 over the made-up keys (which are not curve
 * points): member pk's "signature" of msg is BLAKE2b-512(pk || msg), so a
 * claim signed as one member does not verify as another's, and a changed
 * byte does not verify. ctx of the signer is the signing member's key
 * (borrowed). Tests of the real signatures use st_identity_sign. */
static inline void member_mac(const uint8_t pk[ST_PUBLIC_KEY_BYTES],
                              const uint8_t* msg, size_t len,
                              uint8_t sig[ST_SIGNATURE_BYTES]) {
  uint8_t buf[ST_PUBLIC_KEY_BYTES + ST_MEMBERSHIP_CLAIM_MAX_BYTES];
  size_t n = len <= ST_MEMBERSHIP_CLAIM_MAX_BYTES
                 ? len
                 : ST_MEMBERSHIP_CLAIM_MAX_BYTES;
  memcpy(buf, pk, ST_PUBLIC_KEY_BYTES);
  memcpy(buf + ST_PUBLIC_KEY_BYTES, msg, n);
  st_hash_once(buf, ST_PUBLIC_KEY_BYTES + n, sig, ST_SIGNATURE_BYTES);
}

static inline void member_sign_cb(void* ctx, const uint8_t* msg, size_t len,
                                  uint8_t sig[ST_SIGNATURE_BYTES]) {
  member_mac((const uint8_t*) ctx, msg, len, sig);
}

static inline bool member_verify_cb(void* ctx,
                                    const uint8_t pk[ST_PUBLIC_KEY_BYTES],
                                    const uint8_t* msg, size_t len,
                                    const uint8_t sig[ST_SIGNATURE_BYTES]) {
  (void) ctx;
  uint8_t want[ST_SIGNATURE_BYTES];
  member_mac(pk, msg, len, want);
  return memcmp(want, sig, ST_SIGNATURE_BYTES) == 0;
}

/* Installs the stand-in signer on machine m of the member with key pk
 * (borrowed for the machine's lifetime). */
static inline void member_set_signer(st_membership_t* m,
                                     const uint8_t pk[ST_PUBLIC_KEY_BYTES]) {
  st_membership_signer_t s = {member_sign_cb, member_verify_cb, (void*) pk};
  st_membership_set_signer(m, &s);
}

/* Signs claims as member pk would (for messages a test builds by hand). */
static inline void member_sign_alive(const uint8_t pk[ST_PUBLIC_KEY_BYTES],
                                     st_msg_alive_t* a) {
  uint8_t buf[ST_MEMBERSHIP_CLAIM_MAX_BYTES];
  member_mac(pk, buf, st_membership_alive_claim(a, buf), a->signature);
}

static inline void member_sign_status(const uint8_t pk[ST_PUBLIC_KEY_BYTES],
                                      st_msg_status_t* s) {
  uint8_t buf[ST_MEMBERSHIP_CLAIM_MAX_BYTES];
  member_mac(pk, buf, st_membership_status_claim(s, buf), s->signature);
}

static inline void member_sign_leave(const uint8_t pk[ST_PUBLIC_KEY_BYTES],
                                     st_msg_suspect_t* d) {
  uint8_t buf[ST_MEMBERSHIP_CLAIM_MAX_BYTES];
  member_mac(pk, buf, st_membership_leave_claim(&d->node, d->incarnation, buf),
             d->signature);
}

#endif
