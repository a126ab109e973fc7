/* packet_internal.h: declarations shared by crypto/packet.c, crypto/replay.c
 * and their tests; not part of the public interface (crypto.h). */
#ifndef STARLING_CRYPTO_PACKET_INTERNAL_H
#define STARLING_CRYPTO_PACKET_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "crypto/crypto.h"

/* st_packet_seal with a caller-chosen nonce instead of a random one: for
 * known-answer tests only. A nonce must never repeat under one key. */
int st__packet_seal_with_nonce(st_packet_sealer_t* s, const st_node_id_t* to,
                               const uint8_t nonce[24], const uint8_t* plain,
                               size_t len, uint8_t* out, size_t out_cap,
                               size_t* out_len);

/* The replay decision for (sender, epoch, counter), without changing t:
 * 0 (accept), -EALREADY (replay or below the window), -ESTALE (older boot
 * epoch) or -ENOSPC (a new sender and the table is full). */
int st__replay_check(const st_replay_table_t* t, const st_node_id_t* sender,
                     uint64_t epoch, uint64_t counter);

/* The same decision, then records the packet when it is accepted. Called
 * only after the packet has authenticated. */
int st__replay_update(st_replay_table_t* t, const st_node_id_t* sender,
                      uint64_t epoch, uint64_t counter);

/* Number of senders tracked. */
size_t st__replay_count(const st_replay_table_t* t);

#endif
