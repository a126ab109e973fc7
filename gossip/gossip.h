/* gossip.h: the protocols of starling, sans-IO, and their wire format.
 *
 * Wire (gossip/wire.c, the only file that calls msgpack-c): every message
 * is a msgpack array [type, version, field...] decoded into the plain C
 * structs below; no msgpack object leaves wire.c. The decoder first walks
 * the raw bytes and checks every declared count and length against the
 * bytes that remain, at every nesting level, and against per-type limits,
 * before msgpack-c allocates anything (msgpack-c sizes its allocations
 * from declared counts, so five hostile bytes could otherwise ask for
 * gigabytes). Each rejection is counted under a named reason.
 *
 * Field layouts (after [type, version]), version ST_WIRE_VERSION:
 *   HS1          [key_id u8, ephemeral bin32]
 *   HS2          [ephemeral bin32, sealed bin112]
 *   HS3          [sealed bin112]
 *   PING         [seq u32, target bin16]
 *   PING_REQ     [seq u32, target bin16, target_addr addr, want_nack bool]
 *   ACK          [seq u32]
 *   NACK         [seq u32]
 *   ALIVE        [node bin16, incarnation u64, addr addr, public_key bin32]
 *   SUSPECT      [node bin16, incarnation u64, from bin16]
 *   DEAD         [node bin16, incarnation u64, from bin16]
 *   STATUS       [node bin16, seq u64, step u64, loss f32, accuracy f32,
 *                 samples_per_sec f32, fingerprint bin16, ring_capable bool]
 *   TENSOR_CHUNK [transfer_id u64, offset u64, total u64, data bin]
 * where addr is [ip bin4|bin16, port u16]. Integers accept any msgpack
 * integer encoding that fits the field; floats accept float32 or float64
 * (narrowed); a tensor chunk's data is little-endian float32, a multiple of
 * 4 bytes, at most ST_WIRE_CHUNK_MAX_BYTES, and offset + count <= total.
 */
#ifndef STARLING_GOSSIP_H
#define STARLING_GOSSIP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "crypto/crypto.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ==== Wire ==================================================================
 */

#define ST_WIRE_VERSION 1
/* Tensors travel in chunks of at most 1 MiB (DESIGN.md, Wire). */
#define ST_WIRE_CHUNK_MAX_BYTES (1024u * 1024u)
/* The largest encoded message: a full tensor chunk and its envelope. */
#define ST_WIRE_MAX_MESSAGE_BYTES (ST_WIRE_CHUNK_MAX_BYTES + 1024u)
/* Nesting deeper than this is malformed (the deepest message has 3). */
#define ST_WIRE_MAX_DEPTH 4

typedef enum {
  ST_MSG_HS1 = 1,
  ST_MSG_HS2 = 2,
  ST_MSG_HS3 = 3,
  ST_MSG_PING = 16,
  ST_MSG_PING_REQ = 17,
  ST_MSG_ACK = 18,
  ST_MSG_NACK = 19,
  ST_MSG_ALIVE = 20,
  ST_MSG_SUSPECT = 21,
  ST_MSG_DEAD = 22,
  ST_MSG_STATUS = 23,
  ST_MSG_TENSOR_CHUNK = 32
} st_msg_type_t;

typedef struct {
  uint8_t ip_len; /* 4 (IPv4) or 16 (IPv6) */
  uint8_t ip[16]; /* network byte order */
  uint16_t port;
} st_wire_addr_t;

typedef struct {
  uint32_t seq;
  st_node_id_t target;
} st_msg_ping_t;

typedef struct {
  uint32_t seq;
  st_node_id_t target;
  st_wire_addr_t target_addr;
  bool want_nack;
} st_msg_ping_req_t;

typedef struct {
  uint32_t seq;
} st_msg_ack_t; /* also NACK */

typedef struct {
  st_node_id_t node;
  uint64_t incarnation;
  st_wire_addr_t addr;
  uint8_t public_key[ST_PUBLIC_KEY_BYTES];
} st_msg_alive_t;

typedef struct {
  st_node_id_t node;
  uint64_t incarnation;
  st_node_id_t from;
} st_msg_suspect_t; /* also DEAD */

typedef struct {
  st_node_id_t node;
  uint64_t seq;
  uint64_t step;
  float loss;
  float accuracy;
  float samples_per_sec;
  uint8_t fingerprint[16];
  bool ring_capable;
} st_msg_status_t;

typedef struct {
  uint64_t transfer_id;
  uint64_t offset;     /* in floats */
  uint64_t total;      /* floats in the whole tensor */
  const uint8_t* data; /* little-endian float32; when decoded, borrowed from
                          the input buffer */
  uint32_t data_len;   /* bytes */
} st_msg_tensor_chunk_t;

typedef struct {
  st_msg_type_t type;
  union {
    st_hs_msg1_t hs1; /* hs1.version is the message's version */
    st_hs_msg2_t hs2;
    st_hs_msg3_t hs3;
    st_msg_ping_t ping;
    st_msg_ping_req_t ping_req;
    st_msg_ack_t ack;
    st_msg_ack_t nack;
    st_msg_alive_t alive;
    st_msg_suspect_t suspect;
    st_msg_suspect_t dead;
    st_msg_status_t status;
    st_msg_tensor_chunk_t chunk;
  } u;
} st_msg_t;

typedef enum {
  ST_WIRE_DROP_MALFORMED = 0, /* not msgpack, truncated, trailing bytes */
  ST_WIRE_DROP_LIMIT,         /* a count or length beyond the bytes left,
                                 a per-type limit, or too deep */
  ST_WIRE_DROP_VERSION,       /* a version this build does not speak */
  ST_WIRE_DROP_UNKNOWN_TYPE,
  ST_WIRE_DROP_FIELD, /* a field of the wrong type, size or range */
  ST_WIRE_DROP_COUNT
} st_wire_drop_t;

typedef struct {
  uint64_t drops[ST_WIRE_DROP_COUNT];
} st_wire_counters_t;

/* The counter's name in `starling status --json`, e.g. "wire_malformed". */
const char* st_wire_drop_name(st_wire_drop_t reason);

/* Encodes msg into buf. Returns 0 and the size in *len, -EMSGSIZE when buf
 * is too small, -EINVAL for a message that breaks the limits above. */
int st_wire_encode(const st_msg_t* msg, uint8_t* buf, size_t cap, size_t* len);

/* Decodes exactly one message filling all of buf[0..len). On rejection
 * returns -EBADMSG (malformed, limit, field), -EPROTONOSUPPORT (version)
 * or -ENOMSG (unknown type) and counts the reason in c (may be NULL).
 * Pointers in *msg (tensor chunk data) borrow from buf. */
int st_wire_decode(const uint8_t* buf, size_t len, st_msg_t* msg,
                   st_wire_counters_t* c);

#ifdef __cplusplus
}
#endif

#endif /* STARLING_GOSSIP_H */
