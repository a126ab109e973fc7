/* member_identity.h: the made-up members of the membership tests and of
 * the membership fuzz target (whose committed corpus holds packets between
 * them): member i's public key is 0x5A, then i as two little-endian bytes,
 * then zeros; its address is 10.0.(i >> 8).(i & 255):7946. Test-only,
 * header-only. */
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

#endif
