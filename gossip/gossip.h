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
 *   ALIVE        [node bin16, incarnation u64, addr addr, public_key bin32,
 *                 signature bin64]
 *   SUSPECT      [node bin16, incarnation u64, from bin16]
 *   DEAD         [node bin16, incarnation u64, from bin16, signature bin64]
 *   STATUS       [node bin16, seq u64, step u64, loss f32, accuracy f32,
 *                 samples_per_sec f32, fingerprint bin16, ring_capable bool,
 *                 signature bin64]
 *   PUSH_PULL    [is_reply bool, [entry, ...]] with at most
 *                ST_WIRE_PUSH_PULL_MAX_ENTRIES entries, each
 *                [node bin16, incarnation u64, state u8, addr addr,
 *                 public_key bin32, signature bin64]
 *   TENSOR_CHUNK [transfer_id u64, offset u64, total u64, data bin]
 *   XCHG_CODED   [offset u64, total u64, data bin]   (bytes, not floats)
 * where addr is [ip bin4|bin16, port u16]. The signatures are the
 * subject's own (node's identity key) over the domain-separated encodings
 * that st_membership_alive_claim, _status_claim and _leave_claim write
 * (docs/protocol.md, "Signed claims"): an ALIVE's over the ALIVE, a
 * STATUS's over the STATUS, a DEAD's over the leave when from == node
 * (zeros in an accusation), a push-pull entry's over the ALIVE at the
 * entry's incarnation (over the leave for a LEFT entry). A UDP packet's
 * plaintext is a concatenation of messages (a probe and the updates piggybacked
 * on it), read one at a time with st_wire_decode_next. Integers accept any
 * msgpack integer encoding that fits the field; floats accept float32 or
 * float64 (narrowed); a tensor chunk's data is little-endian float32, a
 * multiple of 4 bytes, at most ST_WIRE_CHUNK_MAX_BYTES, and offset + count <=
 * total; an XCHG_CODED's data is 1 to ST_WIRE_CHUNK_MAX_BYTES bytes,
 * offset + bytes <= total <= ST_XCHG_CODED_MAX_BYTES.
 */
#ifndef STARLING_GOSSIP_H
#define STARLING_GOSSIP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "crypto/crypto.h"
#include "base/base.h"

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
/* User collectives (gossip.h, "User collectives"): the largest group, the
 * most elements an operation moves (2^37: 1 TiB of float64, the same
 * 2^40-byte bound a tensor has), and the longest abort reason. */
#define ST_COLL_MAX_MEMBERS 4096u
#define ST_COLL_MAX_COUNT (UINT64_C(1) << 37)
#define ST_COLL_REASON_MAX 512u
/* Cluster requests (ADMIN_REQ / ADMIN_REPLY): the longest reason. */
#define ST_ADMIN_REASON_MAX 512u
/* Nesting deeper than this is malformed (top-level array = depth 1; an
 * addr field sits at depth 3). PUSH_PULL alone may reach 5: its entries
 * hold addresses (wire_internal.h, ST__WIRE_PUSH_PULL_DEPTH). */
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
  ST_MSG_PUSH_PULL = 24,
  ST_MSG_TENSOR_CHUNK = 32,
  ST_MSG_XCHG_REQ = 33,
  ST_MSG_XCHG_REPLY = 34,
  ST_MSG_XCHG_DONE = 35,
  ST_MSG_XCHG_CODED = 36, /* a compressed snapshot's bytes ("Exchanges") */
  ST_MSG_SYNC_REQ = 37,   /* "Multi-donor state sync" */
  ST_MSG_SYNC_REPLY = 38,
  ST_MSG_RING_SEG = 40, /* gossip.h, "Ring all-reduce" */
  /* gossip.h, "Ring formation" */
  ST_MSG_RING_PROPOSE = 41,
  ST_MSG_RING_ACCEPT = 42,
  ST_MSG_RING_CONFIRM = 43,
  ST_MSG_RING_CANCEL = 44,
  ST_MSG_RING_LANE = 45,  /* gossip.h, "Ring all-reduce": lanes */
  ST_MSG_COLL_HELLO = 48, /* gossip.h, "User collectives" */
  ST_MSG_COLL_SEG = 49,
  ST_MSG_COLL_ABORT = 50,
  ST_MSG_COLL_FETCH = 51, /* a published tensor asked for, or refused */
  ST_MSG_ADMIN_REQ = 52,  /* gossip.h, "Cluster requests" */
  ST_MSG_ADMIN_REPLY = 53
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
  uint8_t signature[ST_SIGNATURE_BYTES]; /* node's, of the ALIVE claim */
} st_msg_alive_t;

/* SUSPECT, and DEAD. signature: DEAD only, node's signature of its leave
 * when from == node, else zeros; a SUSPECT carries none. */
typedef struct {
  st_node_id_t node;
  uint64_t incarnation;
  st_node_id_t from;
  uint8_t signature[ST_SIGNATURE_BYTES];
} st_msg_suspect_t;

typedef struct {
  st_node_id_t node;
  uint64_t seq;
  uint64_t step;
  float loss;
  float accuracy;
  float samples_per_sec;
  uint8_t fingerprint[16];
  bool ring_capable;
  bool synced; /* holds its model's state (its own start, or synced from a
                  peer): what --min-nodes counts */
  /* Its cluster keys (`starling keys`): keys[0] the id it sends with,
   * keys[1] (n_keys 2) the other id it accepts; n_keys 0 when it does
   * not say (a node always says; simulated members need not). */
  uint8_t n_keys;
  uint8_t keys[2];
  uint8_t signature[ST_SIGNATURE_BYTES]; /* node's, of the STATUS claim */
} st_msg_status_t;

/* Member states, as they travel in PUSH_PULL entries. */
typedef enum {
  ST_MEMBER_ALIVE = 0,
  ST_MEMBER_SUSPECT = 1,
  ST_MEMBER_DEAD = 2,
  ST_MEMBER_LEFT = 3 /* dead by its own graceful leave */
} st_member_state_t;

/* "alive", "suspect", "dead", "left"; "?" for any other value. */
const char* st_member_state_name(st_member_state_t s);

typedef struct {
  st_node_id_t node;
  uint64_t incarnation;
  uint8_t state; /* st_member_state_t */
  st_wire_addr_t addr;
  uint8_t public_key[ST_PUBLIC_KEY_BYTES];
  uint8_t signature[ST_SIGNATURE_BYTES]; /* node's ALIVE at incarnation
                                            (LEFT: node's leave) */
} st_push_pull_entry_t;

/* A push-pull carries the sender's member list; at 151 bytes an entry at
 * most (gossip/wire_internal.h: 85 before the 66-byte signature) 6900 of
 * them fit a stream frame (ST_WIRE_MAX_MESSAGE_BYTES, 1 MiB + 1 KiB):
 * 6900 * 151 = 1041900 bytes plus a 10-byte envelope. */
#define ST_WIRE_PUSH_PULL_MAX_ENTRIES 6900

typedef struct {
  bool is_reply;
  uint32_t n_entries;
  st_push_pull_entry_t* entries; /* encode: borrowed; decode: allocated by
                                    st_wire_decode (n_entries of them), freed
                                    with st_wire_msg_free */
} st_msg_push_pull_t;

typedef struct {
  uint64_t transfer_id;
  uint64_t offset;     /* in floats */
  uint64_t total;      /* floats in the whole tensor */
  const uint8_t* data; /* little-endian float32; when decoded, borrowed from
                          the input buffer */
  uint32_t data_len;   /* bytes */
} st_msg_tensor_chunk_t;

#define ST_XCHG_MODEL_MAX 96
/* The most bytes of a tensor list a MISMATCH XCHG_REPLY carries. */
#define ST_XCHG_TENSORS_MAX (256u * 1024u)
#define ST_XCHG_CHUNKS_IN_FLIGHT 2
#define ST_XCHG_HASH_BYTES 32
/* An anchor's id (see "Exchanges": compressed averaging); all zero: none. */
#define ST_XCHG_ANCHOR_BYTES 16
/* The most bytes a compressed snapshot may declare (XCHG_CODED total):
 * 4 bytes a float of the largest tensor, ST__WIRE_MAX_TENSOR_FLOATS, and
 * room for a codec's header and scales. */
#define ST_XCHG_CODED_MAX_BYTES ((UINT64_C(1) << 42) + (UINT64_C(1) << 36))

typedef enum { ST_XCHG_AVERAGE = 1, ST_XCHG_FETCH = 2 } st_xchg_kind_t;

typedef enum {
  ST_XCHG_STATUS_OK = 0,
  ST_XCHG_STATUS_BUSY = 1,     /* already in an exchange; try another */
  ST_XCHG_STATUS_MISMATCH = 2, /* another model (fingerprint differs) */
  ST_XCHG_STATUS_NOT_READY = 3 /* has no parameters to give yet */
} st_xchg_status_t;

typedef struct {
  uint8_t kind; /* st_xchg_kind_t */
  uint8_t fingerprint[16];
  char model[ST_XCHG_MODEL_MAX];
  uint64_t n_params;
  uint64_t step;
  uint8_t anchor[ST_XCHG_ANCHOR_BYTES]; /* the sender's anchor id */
} st_msg_xchg_req_t;

typedef struct {
  uint8_t status; /* st_xchg_status_t */
  uint8_t fingerprint[16];
  char model[ST_XCHG_MODEL_MAX];
  uint64_t n_params;
  uint64_t step;
  uint8_t anchor[ST_XCHG_ANCHOR_BYTES]; /* the responder's anchor id */
  /* The responder's tensor list (an attached model's canonical text,
   * attach/attach.h) on MISMATCH, so that the other side can name the first
   * differing tensor; empty otherwise. Not NUL-terminated; when decoded,
   * borrowed from the input buffer. At most ST_XCHG_TENSORS_MAX bytes. */
  const char* tensors;
  uint32_t tensors_len;
} st_msg_xchg_reply_t;

typedef struct {
  uint8_t hash[ST_XCHG_HASH_BYTES];
} st_msg_xchg_done_t;

/* A piece of a compressed snapshot: bytes [offset, offset + data_len) of
 * an encoding of total bytes (optimizer/codec.c's layout; the wire does
 * not read it). */
typedef struct {
  uint64_t offset;     /* in bytes */
  uint64_t total;      /* bytes of the whole encoding, at most
                          ST_XCHG_CODED_MAX_BYTES */
  const uint8_t* data; /* when decoded, borrowed from the input buffer */
  uint32_t data_len;   /* 1 .. ST_WIRE_CHUNK_MAX_BYTES */
} st_msg_xchg_coded_t;

/* Multi-donor state sync ("Multi-donor state sync", below): the agreed
 * state is cut into chunks of ST_SYNC_CHUNK_FLOATS floats (the last one
 * shorter), each named in a manifest by the BLAKE2b-256 of its bytes. */
#define ST_SYNC_CHUNK_FLOATS (ST_WIRE_CHUNK_MAX_BYTES / 4u)
#define ST_SYNC_HASH_BYTES 32
/* A manifest fits one message: at most 32,768 chunks (2^33 floats). */
#define ST_SYNC_MAX_CHUNKS (ST_WIRE_CHUNK_MAX_BYTES / ST_SYNC_HASH_BYTES)

typedef enum { ST_SYNC_MANIFEST = 1, ST_SYNC_RANGE = 2 } st_sync_kind_t;

typedef enum {
  ST_SYNC_STATUS_OK = 0,
  ST_SYNC_STATUS_BUSY = 1,      /* serving too many transfers; ask another */
  ST_SYNC_STATUS_MISMATCH = 2,  /* another fingerprint or n_params */
  ST_SYNC_STATUS_NOT_READY = 3, /* holds no agreed state (no ring round yet) */
  ST_SYNC_STATUS_GONE = 4       /* RANGE: the agreed state asked for is not
                                   the one it holds now */
} st_sync_status_t;

typedef struct {
  uint8_t kind; /* st_sync_kind_t */
  uint8_t fingerprint[16];
  uint64_t n_params;                    /* at most 2^40 */
  uint8_t anchor[ST_XCHG_ANCHOR_BYTES]; /* RANGE: the agreed state's id */
  uint64_t first; /* RANGE: the first chunk, < ST_SYNC_MAX_CHUNKS */
  uint64_t count; /* RANGE: chunks, 1 .. ST_SYNC_MAX_CHUNKS */
} st_msg_sync_req_t;

typedef struct {
  uint8_t status;                       /* st_sync_status_t */
  uint8_t anchor[ST_XCHG_ANCHOR_BYTES]; /* the agreed state's id */
  uint64_t round;                       /* the ring round that gave it */
  uint64_t step;                        /* the donor's step now */
  uint64_t n_params;
  /* MANIFEST, OK: ST_SYNC_HASH_BYTES per chunk; else empty (hashes sent
   * with another status are ignored by the joiner). A multiple of
   * ST_SYNC_HASH_BYTES, at most ST_WIRE_CHUNK_MAX_BYTES; borrowed from
   * the input when decoded. */
  const uint8_t* hashes;
  uint32_t hashes_len;
} st_msg_sync_reply_t;

/* One segment of a ring all-reduce (gossip.h, "Ring all-reduce"). */
typedef struct {
  uint64_t round_id;
  uint8_t phase;       /* st_ring_phase_t: 0 reduce-scatter, 1 all-gather */
  uint32_t step;       /* within the phase, 0 .. n_members - 2 */
  uint32_t chunk;      /* the chunk's index, 0 .. n_members - 1 */
  uint64_t offset;     /* in floats, within the chunk */
  const uint8_t* data; /* little-endian float32; when decoded, borrowed from
                          the input buffer */
  uint32_t data_len;   /* bytes */
} st_msg_ring_seg_t;

/* The first message on each lane of a ring link (gossip.h, "Ring
 * all-reduce"): which round, which lane, how many lanes. */
typedef struct {
  uint64_t round_id;
  uint32_t lane;  /* 0 .. lanes - 1 */
  uint32_t lanes; /* 1 .. ST_RING_MAX_LANES */
} st_msg_ring_lane_t;

/* User collectives (gossip.h, "User collectives"). HELLO opens a member's
 * part in an operation to one other member: what it called (the fields a
 * mismatch is named by) and, on the small path, its data. */
typedef struct {
  uint64_t op_id;
  uint8_t kind;          /* st_coll_kind_t */
  uint8_t rop;           /* st_coll_rop_t */
  uint8_t dtype;         /* st_coll_dtype_t */
  uint32_t root;         /* rank; 0 for operations without one */
  uint64_t count;        /* elements, <= ST_COLL_MAX_COUNT */
  uint32_t n;            /* group size, 1 .. ST_COLL_MAX_MEMBERS */
  uint64_t members_hash; /* the group's member list, hashed by the node */
  const uint8_t* data;   /* little-endian elements of dtype, or empty;
                            borrowed from the input buffer when decoded */
  uint32_t data_len;     /* bytes, <= ST_WIRE_CHUNK_MAX_BYTES */
} st_msg_coll_hello_t;

/* One segment of a large operation's data (gossip.h, "User collectives"). */
typedef struct {
  uint64_t op_id;
  uint8_t phase;       /* st_coll_phase_t */
  uint32_t step;       /* within the phase */
  uint64_t offset;     /* in elements, from the start of the vector */
  const uint8_t* data; /* as in HELLO */
  uint32_t data_len;
} st_msg_coll_seg_t;

/* An operation failed at the sender: every member fails it too. */
typedef struct {
  uint64_t op_id;
  const char* reason;  /* not NUL-terminated; borrowed when decoded */
  uint32_t reason_len; /* <= ST_COLL_REASON_MAX */
} st_msg_coll_abort_t;

/* A fetch of a tensor another member published (docs/collectives.md,
 * "Publish and fetch"): ASK, from the fetching member, names it (text: the
 * name, 1 to ST_COLL_FETCH_NAME_MAX bytes); the publisher answers with
 * the broadcast of operation op_id over the pair, rooted at itself, or
 * with MISSING or BUSY (text: the sentence, at most ST_COLL_REASON_MAX
 * bytes). */
typedef enum {
  ST_COLL_FETCH_ASK = 0,
  ST_COLL_FETCH_MISSING = 1, /* nothing published under the name */
  ST_COLL_FETCH_BUSY = 2,    /* too many fetches served at once: retry */
  ST_COLL_FETCH_CODE_COUNT
} st_coll_fetch_code_t;
#define ST_COLL_FETCH_NAME_MAX 128u

typedef struct {
  uint64_t op_id;
  uint8_t code;      /* st_coll_fetch_code_t */
  const char* text;  /* not NUL-terminated; borrowed when decoded */
  uint32_t text_len; /* as the code says */
} st_msg_coll_fetch_t;

/* Cluster requests: one member asks another to do what an operator
 * command does there (`starling keys --cluster`, `starling force-leave
 * --cluster`; node/daemon/daemon_admin_net.c decides, by rules that let
 * no member cut off or forget a live one). Over a TCP connection, after
 * the handshake: ADMIN_REQ, answered by one ADMIN_REPLY. */
typedef enum {
  ST_ADMIN_KEY_INSTALL = 1, /* subject: the key's 32 bytes; key_id its id */
  ST_ADMIN_KEY_USE = 2,     /* key_id: seal with it from now on */
  ST_ADMIN_KEY_REMOVE = 3,  /* key_id: forget it */
  ST_ADMIN_FORCE_LEAVE = 4  /* subject: a failed member's 16-byte id */
} st_admin_op_t;

typedef struct {
  uint8_t op;          /* st_admin_op_t */
  uint8_t key_id;      /* the key ops' id, 0..255; 0 for FORCE_LEAVE */
  uint8_t subject_len; /* 32 for KEY_INSTALL, 16 for FORCE_LEAVE, else 0 */
  uint8_t subject[32];
} st_msg_admin_req_t;

typedef enum {
  ST_ADMIN_DONE = 0,    /* changed as asked */
  ST_ADMIN_ALREADY = 1, /* it already was so: nothing changed */
  ST_ADMIN_REFUSED = 2  /* reason says why; nothing changed */
} st_admin_result_t;

typedef struct {
  uint8_t result;      /* st_admin_result_t */
  uint8_t n_keys;      /* the responder's keys after the request, as in */
  uint8_t keys[2];     /* STATUS: keys[0] sends, keys[1] accepted only */
  const char* reason;  /* not NUL-terminated; borrowed when decoded */
  uint32_t reason_len; /* <= ST_ADMIN_REASON_MAX */
} st_msg_admin_reply_t;

/* Forming a ring round (gossip.h, "Ring formation"). A members list holds
 * at most ST_RING_FORM_MAX_MEMBERS ids, in ring order. */
typedef struct {
  uint64_t round_id;
  st_node_id_t proposer;
  uint32_t n_members;
  st_node_id_t* members; /* encode: borrowed; decode: allocated by
                            st_wire_decode (n_members of them, NULL when
                            0), freed with st_wire_msg_free */
} st_msg_ring_propose_t;

/* A round's tag (gossip.h, "Ring formation"): 16 bytes, all zero for
 * none. */
#define ST_RING_TAG_BYTES 16u

typedef struct {
  uint64_t round_id;
  bool accept;
  uint8_t tag[ST_RING_TAG_BYTES]; /* the member's tag */
} st_msg_ring_accept_t;

typedef struct {
  uint64_t round_id;
  uint32_t n_members;
  st_node_id_t* members;          /* as in st_msg_ring_propose_t */
  uint8_t tag[ST_RING_TAG_BYTES]; /* the round's tag */
} st_msg_ring_confirm_t;

typedef struct {
  uint64_t round_id;
} st_msg_ring_cancel_t;

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
    st_msg_push_pull_t push_pull;
    st_msg_tensor_chunk_t chunk;
    st_msg_xchg_req_t xchg_req;
    st_msg_xchg_reply_t xchg_reply;
    st_msg_xchg_done_t xchg_done;
    st_msg_xchg_coded_t xchg_coded;
    st_msg_sync_req_t sync_req;
    st_msg_sync_reply_t sync_reply;
    st_msg_ring_seg_t ring_seg;
    st_msg_ring_propose_t ring_propose;
    st_msg_ring_accept_t ring_accept;
    st_msg_ring_confirm_t ring_confirm;
    st_msg_ring_cancel_t ring_cancel;
    st_msg_ring_lane_t ring_lane;
    st_msg_coll_hello_t coll_hello;
    st_msg_coll_seg_t coll_seg;
    st_msg_coll_abort_t coll_abort;
    st_msg_coll_fetch_t coll_fetch;
    st_msg_admin_req_t admin_req;
    st_msg_admin_reply_t admin_reply;
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

/* Decodes the first message of buf[0..len) and writes its encoded size to
 * *used, for plaintexts that carry several messages back to back. The
 * same checks and counters as st_wire_decode, applied to that message. */
int st_wire_decode_next(const uint8_t* buf, size_t len, st_msg_t* msg,
                        size_t* used, st_wire_counters_t* c);

/* The type of the first message of buf[0..len) from its envelope alone
 * (the array header and the type, in any msgpack integer encoding),
 * without decoding the rest: for routing a plaintext to the machine that
 * reads it. 0, or -EBADMSG when buf does not start with an array of at
 * least two unsigned integers. Counts nothing. */
int st_wire_peek_type(const uint8_t* buf, size_t len, uint64_t* type);

/* Frees what a decoded message owns (a push-pull's entries, a ring
 * proposal's or confirmation's members); safe on any decoded message and
 * on a zeroed one. */
void st_wire_msg_free(st_msg_t* msg);

/* ==== Membership (gossip/membership.c): SWIM + Lifeguard, sans-IO ==========
 *
 * SWIM (Das, Gupta, Motivala 2002) with the three Lifeguard extensions
 * (Dadgar, Phillips, Currey 2018) as HashiCorp's memberlist runs them. The
 * machine holds no socket, clock or thread: the driver (the daemon, or the
 * simulator in tools/) feeds it events with the current time in
 * milliseconds and then drains its actions. Randomness comes only from the
 * injected generator, so a run is reproducible from its seed.
 *
 * Incarnation numbers carry the member's boot epoch in their high 32 bits
 * and a refutation counter in the low 32, so a node restarted from nothing
 * (a new boot epoch) outranks every claim about its previous life.
 */

typedef struct {
  uint32_t probe_interval_ms;     /* 1000 */
  uint32_t probe_timeout_ms;      /* 500 */
  uint32_t indirect_checks;       /* 3 */
  uint32_t suspicion_mult;        /* 4 */
  uint32_t suspicion_max_mult;    /* 6 */
  uint32_t retransmit_mult;       /* 4 */
  uint32_t gossip_interval_ms;    /* 200 */
  uint32_t gossip_nodes;          /* 3 */
  uint32_t push_pull_interval_ms; /* 30000, scaled up with N */
  uint32_t awareness_max;         /* 8 */
  uint32_t dead_reclaim_ms;       /* how long a dead member is remembered */
  bool lifeguard;                 /* awareness, nacks, dynamic suspicion */
} st_membership_config_t;

/* memberlist's LAN defaults; gossip/membership_constants.h derives each. */
void st_membership_config_default(st_membership_config_t* cfg);

typedef struct {
  st_node_id_t id;
  st_wire_addr_t addr;
  uint8_t public_key[ST_PUBLIC_KEY_BYTES];
  uint64_t incarnation;
  st_member_state_t state;
  uint64_t state_since_ms;
  bool has_status;
  st_msg_status_t status; /* the newest status record seen */
} st_member_t;

typedef enum {
  ST_MACT_SEND = 0,      /* send a UDP packet: to, data[0..len) */
  ST_MACT_PUSH_PULL = 1, /* open a stream to `to` and send data[0..len);
                            deliver the peer's reply, if any, to
                            st_membership_push_pull_in. A PUSH_PULL
                            produced by st_membership_push_pull_in is
                            the reply to the request just fed: send it
                            back on that stream */
  ST_MACT_TIMER = 2,     /* call st_membership_tick at or after at_ms */
  ST_MACT_MEMBER = 3     /* member changed: member holds its new record */
} st_maction_kind_t;

typedef struct {
  st_maction_kind_t kind;
  st_wire_addr_t to;
  st_node_id_t to_id;  /* zero when unknown (a seed address) */
  const uint8_t* data; /* borrowed until the next call into the machine */
  size_t len;          /* SEND: <= ST_PACKET_MAX_PLAINTEXT */
  uint64_t at_ms;
  st_member_t member;
} st_maction_t;

typedef struct st_membership_s st_membership_t;

/* Creates the machine for this node. rng is borrowed for its lifetime. */
int st_membership_new(const st_membership_config_t* cfg,
                      const st_node_id_t* self, const st_wire_addr_t* addr,
                      const uint8_t public_key[ST_PUBLIC_KEY_BYTES],
                      uint32_t boot_epoch, st_rng_t* rng,
                      st_membership_t** out);
void st_membership_free(st_membership_t* m);

/* Which members this node admits: fn is called with a new member's public
 * key (its id already checked to be the key's) before the member enters
 * the table, whatever message would add it (its own ALIVE, another's
 * rumour of it, a push-pull entry); false rejects the message (counted)
 * and the member stays unknown. NULL, the default, admits everyone. The
 * daemon passes its --allow list, so that a node it refuses to hear does
 * not enter its view through others' rumours either. */
typedef bool (*st_membership_admit_fn)(
    const uint8_t public_key[ST_PUBLIC_KEY_BYTES], void* ctx);
void st_membership_set_admit(st_membership_t* m, st_membership_admit_fn fn,
                             void* ctx);

/* Signed claims. A member's ALIVE (its incarnation and address), STATUS
 * and graceful leave are signed by that member's identity key, so that a
 * relay (any member, a holder of the cluster key) can repeat them but not
 * forge them; the machine verifies a claim about another member with the
 * key it holds for that member (a new member's: the key in its ALIVE,
 * whose hash must be its id) before the claim changes anything, and drops
 * and counts one that does not verify (claims_bad_signature). The
 * encodings (docs/protocol.md, "Signed claims"), at most
 * ST_MEMBERSHIP_CLAIM_MAX_BYTES:
 *   "starling-alive-v1"  node(16) incarnation(u64 BE) ip_len(1) ip(ip_len)
 *                        port(u16 BE)
 *   "starling-status-v3" node(16) seq(u64 BE) step(u64 BE) loss(f32 bits
 *                        BE) accuracy(f32 bits BE) samples_per_sec(f32
 *                        bits BE) fingerprint(16) ring_capable(1: 0 or 1)
 *                        synced(1: 0 or 1) n_keys(1) keys(n_keys)
 *   "starling-leave-v1"  node(16) incarnation(u64 BE)
 * (the tags without a terminating NUL). Each writes its encoding to out and
 * returns its length. */
#define ST_MEMBERSHIP_CLAIM_MAX_BYTES 96
size_t st_membership_alive_claim(const st_msg_alive_t* a,
                                 uint8_t out[ST_MEMBERSHIP_CLAIM_MAX_BYTES]);
size_t st_membership_status_claim(const st_msg_status_t* s,
                                  uint8_t out[ST_MEMBERSHIP_CLAIM_MAX_BYTES]);
size_t st_membership_leave_claim(const st_node_id_t* node, uint64_t incarnation,
                                 uint8_t out[ST_MEMBERSHIP_CLAIM_MAX_BYTES]);

/* How the machine signs its own claims and checks others'. sign writes
 * this node's signature of msg[0..len); verify is true only when sig is
 * pk's signature of msg[0..len). NULL verify: Ed25519
 * (st_identity_verify). NULL sign: this node's claims carry zero
 * signatures, which no peer accepts (only for a machine that never
 * speaks). The daemon signs with its identity (st_identity_sign); the
 * simulator and tests, whose members have made-up keys, pass a stand-in
 * pair. ctx is passed to both, borrowed for the machine's lifetime. */
typedef struct {
  void (*sign)(void* ctx, const uint8_t* msg, size_t len,
               uint8_t sig[ST_SIGNATURE_BYTES]);
  bool (*verify)(void* ctx, const uint8_t pk[ST_PUBLIC_KEY_BYTES],
                 const uint8_t* msg, size_t len,
                 const uint8_t sig[ST_SIGNATURE_BYTES]);
  void* ctx;
} st_membership_signer_t;

/* Installs s (copied) and signs this node's own ALIVE with it; call before
 * join. */
void st_membership_set_signer(st_membership_t* m,
                              const st_membership_signer_t* s);

/* Counters of claims refused for their subject binding, for
 * `starling status --json` (membership section). */
typedef struct {
  uint64_t bad_signature;    /* ALIVE, STATUS or leave whose signature does
                                not verify with the subject's key */
  uint64_t beyond_signed;    /* SUSPECT or DEAD at an incarnation above the
                                highest the subject signed that we know */
  uint64_t ack_wrong_sender; /* ACK or NACK from a member we did not ask */
} st_membership_claim_stats_t;
void st_membership_claim_stats(const st_membership_t* m,
                               st_membership_claim_stats_t* out);

/* Events. Each returns 0 or a negative errno; a rejected packet is counted
 * (st_membership_counters) and returns -EBADMSG. */
int st_membership_join(st_membership_t* m, uint64_t now_ms,
                       const st_wire_addr_t* seeds, size_t n_seeds);
int st_membership_leave(st_membership_t* m, uint64_t now_ms);
int st_membership_packet(st_membership_t* m, uint64_t now_ms,
                         const st_node_id_t* from,
                         const st_wire_addr_t* from_addr, const uint8_t* data,
                         size_t len);
int st_membership_push_pull_in(st_membership_t* m, uint64_t now_ms,
                               const st_wire_addr_t* from_addr,
                               const uint8_t* data, size_t len);
int st_membership_tick(st_membership_t* m, uint64_t now_ms);
/* The machine fills status->node and raises status->seq above every seq
 * it used before, the boot epoch in its high 32 bits (as incarnations),
 * so a restarted node's records are the newest. */
int st_membership_set_status(st_membership_t* m, uint64_t now_ms,
                             const st_msg_status_t* status);

/* Forgets a member that failed (serf's force-leave): one held DEAD or
 * LEFT, or forgotten already and kept for reconnect attempts (a grave).
 * It leaves the table and the graves now, so this node stops trying to
 * reconnect to it, and for ST_MEMBERSHIP_GRAVE_KEEP_MS nothing brings it
 * back at an incarnation up to the one it had: only its own signed ALIVE
 * at a higher one (it restarted) readmits it. This node's view only: it
 * is not a claim others hear. -EBUSY when the member is alive or suspect
 * (only it may leave), -ENOENT when this node knows no such member,
 * -EINVAL for itself. */
int st_membership_force_leave(st_membership_t* m, uint64_t now_ms,
                              const st_node_id_t* id);
/* The ids of members forgotten and kept for reconnect attempts, up to
 * max of them into ids; returns how many. */
size_t st_membership_graves(const st_membership_t* m, st_node_id_t* ids,
                            size_t max);

/* Another layer saw this member fail (a stream that broke, a ring round
 * that stalled): it is probed next, ahead of the shuffled order. This is
 * how such a failure feeds membership as a suspicion and not a death: the
 * member is suspected only if it then fails its probe (direct and
 * indirect), and declared dead only by the usual suspicion timeout, so a
 * member that merely dropped one connection stays alive. -ENOENT when it
 * is not an alive or suspect member. */
int st_membership_probe_hint(st_membership_t* m, uint64_t now_ms,
                             const st_node_id_t* id);

/* Drains the actions the last events produced, in order; false when none
 * are left. */
bool st_membership_next_action(st_membership_t* m, st_maction_t* out);

/* Queries. Members are indexed 0..count-1 (self included at some index);
 * the order is unspecified and changes as members come and go (and with
 * each probe pass). The machine stores members compactly, so at and find
 * return a copy from a small ring inside the machine: valid until the
 * next event, and for at least the next 3 queries. */
size_t st_membership_count(const st_membership_t* m);
const st_member_t* st_membership_at(const st_membership_t* m, size_t i);
const st_member_t* st_membership_find(const st_membership_t* m,
                                      const st_node_id_t* id);
size_t st_membership_alive_count(const st_membership_t* m);
/* The local health score (Lifeguard's awareness), 0 = healthy. */
uint32_t st_membership_health(const st_membership_t* m);
const st_wire_counters_t* st_membership_counters(const st_membership_t* m);

/* ==== Exchanges (gossip/exchange.c): averaging and state transfer ==========
 *
 * One machine per TCP connection (after the handshake, over the encrypted
 * stream), sans-IO like membership: the driver feeds it events with the
 * current time in milliseconds and drains its actions. Two kinds:
 *
 * - AVERAGE (pairwise gossip averaging, AD-PSGD style): the initiator
 *   sends XCHG_REQ; the responder answers XCHG_REPLY (OK, BUSY,
 *   NOT_READY or MISMATCH). On OK both sides take a snapshot of their
 * parameters (WANT_SNAPSHOT), stream it as TENSOR_CHUNKs of at most
 *   ST_WIRE_CHUNK_MAX_BYTES, then XCHG_DONE (its hash is zero: the
 *   authenticated stream and the offset checks already guarantee every
 *   byte). A side that has received the peer's whole snapshot, and has
 *   sent its own, emits APPLY with
 *   delta = (s_peer - s_own) / 2, which the node adds to its current
 *   parameters at its next step boundary, so the pair's sum is preserved
 *   and local steps taken meanwhile are kept.
 * - FETCH (state transfer to a joining node): the initiator (the joiner)
 *   sends XCHG_REQ; the responder (the donor) answers XCHG_REPLY with its
 *   step, takes a snapshot and streams it, then XCHG_DONE carrying the
 *   BLAKE2b-256 of the bytes sent; the initiator verifies the hash
 *   and emits APPLY with the parameters themselves and the donor's step.
 *   A state both sides already hold is not sent ("held"): a side that
 *   holds a vector it can name to the other (st_xchg_local_t.has_held:
 *   a node's seeded initialization, the same on every node of the model
 *   and seed) puts its id in the REQ's or REPLY's anchor. When the two
 *   are equal, the donor hashes its snapshot; if that is the held
 *   vector's hash it sends XCHG_DONE with it and no chunk, and the joiner,
 *   finding its own held hash there, emits APPLY with held set (values
 *   NULL: it keeps its parameters). Otherwise the donor streams as usual,
 *   which the joiner takes as usual. An empty stream whose hash is not the
 *   joiner's own fails HASH.
 *
 * Guard: a received snapshot that holds NaN or Inf, has the wrong length,
 * or (AVERAGE) whose L2 norm exceeds norm_mult times the local snapshot's
 * norm (plus 1, so that a model near zero is not refused) is dropped and
 * the exchange fails with that reason; nothing is applied. Any malformed
 * or out-of-order message, a hash mismatch, the connection closing early,
 * or the timeout fails the exchange; a failed exchange applies nothing.
 *
 * Compressed averaging (issue #16): when the cluster runs a codec
 * (st_xchg_local_t.coded_bytes > 0) and both sides hold the same anchor
 * (a vector every member of the last ring round got bit for bit, named by
 * its id; the REQ and the REPLY carry each side's), an AVERAGE sends, in
 * place of its float32 snapshot, the encoding c = C(s - anchor) of its
 * drift from the anchor, as XCHG_CODED pieces of exactly coded_bytes in
 * all, and each side applies delta = (D(c_peer) - D(c_own)) / 2, D the
 * decoder. Both sides compute the same two decodings, so the deltas are
 * still exact negatives and the pair's sum is preserved exactly; what the
 * codec did not carry stays in each side's own parameters and is in its
 * next drift (error feedback by keeping the state: nothing is lost). The
 * machine never reads the codec's bytes: the driver (which may use
 * optimizer/) encodes on ST_XACT_ENCODE and decodes on ST_XACT_DECODE,
 * and answers with st_xchg_encoded / st_xchg_decoded. Without a shared
 * anchor, or for FETCH, the exchange sends float32 as above.
 *
 * Flow control: the machine keeps at most ST_XCHG_CHUNKS_IN_FLIGHT chunk
 * SENDs outstanding; the driver reports each written frame with
 * st_xchg_sent, so a large model streams without being copied whole into
 * the send queue.
 *
 * Wire (after [type, version]):
 *   XCHG_REQ   [kind u8, fingerprint bin16, model str, n_params u64,
 *               step u64, anchor bin16]
 *   XCHG_REPLY [status u8, fingerprint bin16, model str, n_params u64,
 *               step u64, anchor bin16, tensors str]
 *   XCHG_DONE  [hash bin32]
 *   XCHG_CODED [offset u64, total u64, data bin]
 * model is a short description for messages ("mlp:784-256-128-10 f32"),
 * at most ST_XCHG_MODEL_MAX - 1 bytes. tensors is empty except in a
 * MISMATCH reply from a responder that runs an attached model, where it is
 * that model's tensor list (st_xchg_local_t.tensors), so that a joiner can
 * say which tensor differs; a list over ST_XCHG_TENSORS_MAX is not sent.
 */

/* How an exchange ended (ST_XACT_DONE). The failures are the node's
 * counters; st_xchg_result_name gives their names. */
typedef enum {
  ST_XCHG_OK = 0,
  ST_XCHG_BUSY,          /* the peer answered busy (or we did) */
  ST_XCHG_MISMATCH,      /* the models differ: peer_model says what it runs */
  ST_XCHG_NOT_READY,     /* the peer had no state to give */
  ST_XCHG_FAIL_PROTOCOL, /* malformed or out-of-order message */
  ST_XCHG_FAIL_SIZE,     /* a snapshot of the wrong length */
  ST_XCHG_FAIL_NONFINITE,
  ST_XCHG_FAIL_NORM,
  ST_XCHG_FAIL_HASH,
  ST_XCHG_FAIL_CLOSED, /* the connection ended before the exchange did */
  ST_XCHG_FAIL_TIMEOUT,
  ST_XCHG_FAIL_CODEC, /* the peer's compressed snapshot did not decode */
  ST_XCHG_RESULT_COUNT
} st_xchg_result_t;

/* "ok", "busy", "mismatch", "not_ready", "protocol", "size", "nonfinite",
 * "norm", "hash", "closed", "timeout", "codec". */
const char* st_xchg_result_name(st_xchg_result_t r);

typedef struct {
  uint32_t timeout_ms; /* the whole exchange; default 30000 */
  double norm_mult;    /* guard; default 10; 0 disables the norm check */
  /* AVERAGE, robust averaging: the most (L2) the delta may move our
   * parameters is max(clip_norm, clip_rel * (|own| + 1)) * clip_scale,
   * |own| our snapshot's L2 norm; a longer delta is scaled to it. Both
   * 0 (the default): no clipping. clip_scale (default 1, > 0) tightens the
   * bound for one peer. */
  double clip_norm;
  double clip_rel;
  double clip_scale;
  /* A float32 AVERAGE makes the delta in this side's snapshot buffer, each
   * float once its chunk has been sent and the peer's has come, so that
   * the exchange holds one copy of the model, not two: the peer's floats
   * wait in a buffer that st_xchg_rx_room keeps to about
   * ST_XCHG_RX_WINDOW_FLOATS when the driver stops reading while it says
   * false. st_xchg_own is then NULL (the snapshot becomes the delta).
   * Compressed exchanges and FETCH are as without it. Default false. */
  bool delta_in_own;
  /* delta_in_own: the window in floats (0: ST_XCHG_RX_WINDOW_FLOATS). */
  uint32_t rx_window_floats;
} st_xchg_config_t;

/* delta_in_own: the peer's floats an exchange holds before it stops
 * wanting more (st_xchg_rx_room): four chunks. */
#define ST_XCHG_RX_WINDOW_FLOATS (4u * ST_WIRE_CHUNK_MAX_BYTES / 4u)

void st_xchg_config_default(st_xchg_config_t* cfg);

/* What this node runs, for the request/reply and the checks. */
typedef struct {
  uint8_t fingerprint[16];
  char model[ST_XCHG_MODEL_MAX];
  uint64_t n_params;
  uint64_t step; /* informational in REQ; the donor's step in FETCH */
  /* The tensor list sent in a MISMATCH reply (NULL or len 0: none);
   * borrowed, valid for the machine's life. */
  const char* tensors;
  size_t tensors_len;
  /* Compressed averaging: the exact bytes of this cluster's encoding of
   * n_params floats (0: float32 only), and the id of the anchor this node
   * holds (all zero: none; then float32 too). */
  uint64_t coded_bytes;
  uint8_t anchor[ST_XCHG_ANCHOR_BYTES];
  /* FETCH: this node holds the vector named by anchor, whose float
   * bytes hash (BLAKE2b-256, as XCHG_DONE's) to held_hash: a donor sends
   * it to a joiner that names the same id as XCHG_DONE alone (above). */
  bool has_held;
  uint8_t held_hash[ST_HASH_BYTES];
  /* Optional: n_params floats the machine uses instead of allocating
   * them, for this side's snapshot (AVERAGE, FETCH donor) or, as a FETCH
   * joiner, for the state it receives (borrowed: the driver keeps them,
   * and lends them to no other machine, until st_xchg_release_buffers or
   * st_xchg_free), so that a node reuses one buffer across exchanges. */
  float* buf;
} st_xchg_local_t;

typedef enum {
  ST_XACT_SEND = 0,      /* send data[0..len) as one stream frame; borrowed
                            until the next call into the machine */
  ST_XACT_WANT_SNAPSHOT, /* ask the trainer for a snapshot of the parameters,
                            then call st_xchg_snapshot */
  ST_XACT_APPLY,         /* AVERAGE: add values[0..n) to the parameters at
                            the next step boundary; FETCH (initiator): set the
                            parameters to values[0..n) and the step to step
                            (the donor's, as it sent in its XCHG_REPLY);
                            with held, values is NULL: the parameters are
                            already the donor's, keep them and take the
                            step. values is owned by the machine, valid
                            until st_xchg_free or
                            st_xchg_release_buffers */
  ST_XACT_ENCODE,        /* compressed: work holds our snapshot s (n floats);
                            write C(s - anchor) into coded[0..coded_len),
                            exactly coded_len bytes, then D of those bytes
                            over work, and call st_xchg_encoded */
  ST_XACT_DECODE,        /* compressed: decode the peer's coded[0..
                            coded_len) (untrusted) into work (n floats) and
                            call st_xchg_decoded */
  ST_XACT_TIMER,         /* call st_xchg_tick at or after at_ms */
  ST_XACT_DONE           /* finished: result (and peer_model on MISMATCH);
                            close the connection after the queued frames */
} st_xact_kind_t;

typedef struct {
  st_xact_kind_t kind;
  const uint8_t* data;
  size_t len;
  const float* values;
  size_t n;
  float* work;    /* ENCODE, DECODE: the machine's buffer of n floats */
  uint8_t* coded; /* ENCODE: where to write; DECODE: what to read */
  size_t coded_len;
  uint64_t step;
  uint64_t at_ms;
  st_xchg_result_t result;
  bool coded_exchange;      /* DONE: the exchange went compressed */
  bool held;                /* APPLY and DONE(OK) of a FETCH: nothing was
                               sent, both sides held the state (above) */
  int codec_drop;           /* DONE(FAIL_CODEC): the driver's reason code */
  const char* peer_model;   /* DONE: the peer's model description, when known
                               (borrowed until st_xchg_free) */
  const char* peer_tensors; /* DONE(MISMATCH) as initiator: the responder's
                               tensor list when it sent one, else NULL
                               (borrowed until st_xchg_free; not checked:
                               parse it as hostile input) */
  size_t peer_tensors_len;
  double delta_norm; /* DONE(OK) of an AVERAGE: |delta| (L2) before clipping */
  bool clipped;      /* APPLY and DONE(OK) of an AVERAGE: it was scaled to
                        clip_norm */
  double clip_norm;  /* DONE(OK) of an AVERAGE: the bound applied (0: none) */
  double clip_base;  /* DONE(OK) of an AVERAGE: the bound before clip_scale */
} st_xact_t;

typedef struct st_xchg_s st_xchg_t;

/* Robust averaging: the clip_norm for the next AVERAGE from the delta
 * norms (before clipping) of the last n exchanges: mult times their
 * median, so that a minority of peers whose pulls are long cannot raise
 * it; 0 (no clipping) when mult is 0 or fewer than ST_XCHG_CLIP_WARMUP
 * norms are known. At most ST_XCHG_CLIP_HISTORY norms are read. */
#define ST_XCHG_CLIP_HISTORY 16
#define ST_XCHG_CLIP_WARMUP 8
double st_xchg_clip_bound(const double* norms, size_t n, double mult);

/* An initiator of `kind`: st_xchg_new queues the XCHG_REQ (and, for
 * AVERAGE, WANT_SNAPSHOT) and allocates the buffers the exchange needs
 * (-ENOMEM). A responder waits for the XCHG_REQ; when busy is true (or its
 * buffers cannot be allocated) it answers BUSY and finishes. Both arm the
 * timeout: the first action is the TIMER. -EINVAL for a model that is not
 * printable UTF-8 of at most ST_XCHG_MODEL_MAX - 1 bytes, n_params beyond
 * 2^40, or a negative or NaN norm_mult. gossip/exchange.c documents the
 * order of the responder's checks and the other details. */
int st_xchg_new_initiator(const st_xchg_config_t* cfg, st_xchg_kind_t kind,
                          const st_xchg_local_t* local, uint64_t now_ms,
                          st_xchg_t** out);
int st_xchg_new_responder(const st_xchg_config_t* cfg,
                          const st_xchg_local_t* local, bool busy,
                          uint64_t now_ms, st_xchg_t** out);
void st_xchg_free(st_xchg_t* x);
/* Frees a finished exchange's parameter-sized buffers (both snapshots, the
 * delta, the coded bytes) while the machine itself stays: the driver calls
 * it once DONE was drained and nothing it was given (APPLY's values, the
 * buffers of ENCODE, DECODE and WANT_SNAPSHOT) is borrowed any more, so
 * that a connection still closing holds no copy of the model. -EINVAL on
 * an unfinished exchange; a second call does nothing. */
int st_xchg_release_buffers(st_xchg_t* x);

/* Events. A protocol failure is not an error of the call: it ends the
 * exchange with a DONE action. The calls return -EINVAL only for misuse. */
/* One received stream frame's plaintext (one wire message). */
int st_xchg_message(st_xchg_t* x, uint64_t now_ms, const uint8_t* data,
                    size_t len);
/* The snapshot asked for: n == local->n_params floats in host memory,
 * copied by the machine before the call returns (the driver may then reuse
 * or free params), and the step it was taken at (informational: a FETCH
 * joiner gets the step the donor sent in its XCHG_REPLY). -EINVAL when no
 * snapshot was asked for or n is wrong. */
int st_xchg_snapshot(st_xchg_t* x, uint64_t now_ms, const float* params,
                     size_t n, uint64_t step);
/* After WANT_SNAPSHOT: the machine's own buffer for the snapshot
 * (n_params floats, valid until st_xchg_free), so that the driver can have
 * the trainer write into it and then call st_xchg_snapshot with params ==
 * this buffer, which copies nothing. NULL when no snapshot is asked for. */
float* st_xchg_snapshot_buffer(st_xchg_t* x);
/* This side's snapshot as it was taken, once it is in and until the
 * machine is freed (an AVERAGE's APPLY: the delta is mean - this); NULL
 * before, for a compressed exchange (whose buffer then holds the decoded
 * drift), and under delta_in_own (it becomes the delta). */
const float* st_xchg_own(const st_xchg_t* x);
/* Whether the machine wants more of the peer's frames now: false only
 * under delta_in_own while the window (cfg.rx_window_floats) or more of the
 * peer's floats wait for ours to be sent; the driver then stops reading until
 * it says true again (after a SEND is drained or the snapshot comes). Frames
 * that come anyway are taken (the buffer grows). */
bool st_xchg_rx_room(const st_xchg_t* x);
/* A compressed AVERAGE that ended OK (from its APPLY on): the decoded
 * drift of this side's snapshot, D(c_own), n_params floats, writable (the
 * machine reads it no more) until st_xchg_free; NULL otherwise. Anchor +
 * this is the snapshot as both sides decoded it: the delta is the pair's
 * decoded mean - this. */
float* st_xchg_coded_own(st_xchg_t* x);
/* After ENCODE: rc 0 when coded and work were written as asked; any
 * other rc (our snapshot held a NaN or Inf: the codec refuses them) ends
 * the exchange with FAIL_NONFINITE. -EINVAL when no ENCODE is pending. */
int st_xchg_encoded(st_xchg_t* x, uint64_t now_ms, int rc);
/* After DECODE: rc 0 when work holds the peer's n decoded floats; else
 * the exchange ends with FAIL_CODEC and DONE carries reason (the driver's
 * code for why, e.g. an st_codec_drop_t). -EINVAL when no DECODE is
 * pending. */
int st_xchg_decoded(st_xchg_t* x, uint64_t now_ms, int rc, int reason);
/* One SEND frame has been written to the socket (-EINVAL when none is
 * outstanding). */
int st_xchg_sent(st_xchg_t* x, uint64_t now_ms);
int st_xchg_tick(st_xchg_t* x, uint64_t now_ms);
/* The connection ended (read EOF or error): FAIL_CLOSED, except in a
 * compressed exchange whose peer's bytes and XCHG_DONE are all in and
 * whose own XCHG_DONE was emitted (the peer finished first): that one
 * ends as its DECODE says, so the driver still reports st_xchg_decoded. */
int st_xchg_closed(st_xchg_t* x, uint64_t now_ms);

bool st_xchg_next_action(st_xchg_t* x, st_xact_t* out);
/* For the SEND just returned by st_xchg_next_action (a): when its data is
 * the machine's chunk buffer, hands that buffer to the driver, to free()
 * once it is done with it (no copy of a chunk on the way to its sealing),
 * and takes a fresh one for its next chunk; NULL when a's data is another
 * buffer, or no fresh one could be had (then a.data is valid as before,
 * until the next call into the machine). */
uint8_t* st_xchg_take_send_buffer(st_xchg_t* x, const st_xact_t* a);
/* The kind (responders learn it from the request; 0 before). */
st_xchg_kind_t st_xchg_kind(const st_xchg_t* x);
bool st_xchg_finished(const st_xchg_t* x);

/* ==== Session framing (gossip/session.c): the TCP handshake's frames =======
 *
 * What two nodes say on a fresh TCP connection before the encrypted
 * stream, sans-IO: the driver (node/daemon/daemon_conn.c, the blocking
 * copy in tools/bench/bench_io.c) feeds the bytes that arrived and sends
 * the bytes the framer queues. In order:
 *
 *   1. The three handshake messages of crypto/handshake.c (HS1 from the
 *      dialler, HS2 back, HS3 from the dialler), each a plain frame: a
 *      4-byte big-endian length of 1..ST_SESSION_HS_FRAME_MAX and the
 *      st_wire_encode'd message. A length of 0 or over the cap is refused
 *      from the four length bytes, before the body is read.
 *   2. When the session keys exist on a side (the dialler after it reads
 *      HS2 and writes HS3, the acceptor after it reads HS3) the framer
 *      checks the peer (when the dialler knows the id it meant to reach),
 *      initializes the sending stream (*tx) and queues its 24-byte
 *      secretstream header: phase KEYED, the caller may seal frames now.
 *   3. The peer's 24-byte header initializes the receiving stream (*rx):
 *      phase OPEN. The framer consumes nothing after that header: what
 *      follows is the caller's encrypted frames.
 *
 * Refusals count ST_DROP_HS_MALFORMED in the crypto counters (a bad frame
 * length, an undecodable message, a message of the wrong type for this
 * side); the handshake counts its own (key id, auth, signature, ...). A
 * peer that is not the one dialled is counted by the caller (drop
 * ST_SESSION_DROP_WRONG_PEER). Any refusal is final: drop the connection.
 *
 * Between calls every byte fed is either consumed into the framer (a unit
 * not yet whole waits for more) or left to the caller; byte-at-a-time
 * delivery gives the same result as one call with everything. */

/* A handshake message's plain frame body: HS1 to HS3 encode in well under
 * 200 bytes; the cap bounds what a peer can make us buffer unauthenticated. */
#define ST_SESSION_HS_FRAME_MAX 512u
#define ST_SESSION_LEN_BYTES 4u
/* The most a side queues before the caller sends: the dialler's HS1 and
 * HS3 frames and its stream header. */
#define ST_SESSION_OUT_MAX                                 \
  (2u * (ST_SESSION_LEN_BYTES + ST_SESSION_HS_FRAME_MAX) + \
   ST_STREAM_HEADER_BYTES)

typedef enum {
  ST_SESSION_HANDSHAKE = 0, /* plain handshake frames */
  ST_SESSION_KEYED, /* *tx ready, our header queued; the peer's awaited */
  ST_SESSION_OPEN,  /* *rx ready too: encrypted frames follow */
  ST_SESSION_FAILED /* refused: see drop; drop the connection */
} st_session_phase_t;

/* Why a framer refused, with the errno its call returned. */
typedef enum {
  ST_SESSION_DROP_NONE = 0,
  ST_SESSION_DROP_FRAME_SIZE, /* -EMSGSIZE: plain frame length 0 or > cap */
  ST_SESSION_DROP_MALFORMED,  /* -EBADMSG undecodable, -EPROTO wrong type */
  ST_SESSION_DROP_HANDSHAKE,  /* crypto/ refused (its errno, its counter) */
  ST_SESSION_DROP_WRONG_PEER, /* -EACCES: not the node the dialler meant */
  ST_SESSION_DROP_INTERNAL,   /* encoding or stream setup failed */
  ST_SESSION_DROP_BUSY        /* -EBUSY: the acceptor's admit said no */
} st_session_drop_t;

/* An acceptor's framer with one set asks it after an HS1 has passed its
 * MAC check (a cluster-key holder made it, or replays it) and before the
 * public-key work of answering it (an X25519 and an Ed25519 signature);
 * false refuses the HS1 (ST_SESSION_DROP_BUSY), so that a flood of valid
 * or replayed HS1s costs what the caller allows. */
typedef bool (*st_session_admit_fn)(void* arg);

/* One connection's framer. Holds secrets until OPEN or st_session_framer_wipe.
 * Callers read phase, drop, peer (valid once peer_known) and the queued
 * output (out, out_len), and may set admit and admit_arg after init; every
 * other field is internal. */
typedef struct {
  st_session_phase_t phase;
  st_session_drop_t drop;
  bool peer_known;   /* the handshake finished: peer is authenticated */
  st_node_id_t peer; /* the peer's id, as the handshake proved it */
  bool initiator;
  bool expect_peer;
  st_node_id_t expected;
  int err; /* what a FAILED framer's calls return */
  st_handshake_t hs;
  st_session_t keys; /* the session's keys, until the peer's header */
  st_stream_t* tx;
  st_stream_t* rx;
  st_crypto_counters_t* cc;
  st_wire_counters_t* wc;
  st_session_admit_fn admit; /* set after init, or NULL: every HS1 */
  void* admit_arg;
  size_t in_len; /* bytes of the unit being read */
  uint8_t in[ST_SESSION_LEN_BYTES + ST_SESSION_HS_FRAME_MAX];
  size_t out_len;
  uint8_t out[ST_SESSION_OUT_MAX];
} st_session_framer_t;

/* Starts a framer as the dialler (initiator) or the acceptor. me, keys,
 * allow (NULL: any cluster-key holder), cc and wc (either may be NULL)
 * are borrowed until st_session_framer_wipe; tx and rx are the caller's
 * streams, written when the phase reaches KEYED and OPEN. expected (NULL: any
 * peer) is copied. The dialler's HS1 is queued at once. 0 or a negative errno
 * (the framer is then FAILED and needs only st_session_framer_wipe). */
int st_session_framer_init(st_session_framer_t* f, bool initiator,
                           const st_identity_t* me, const st_keyring_t* keys,
                           const st_allowlist_t* allow,
                           const st_node_id_t* expected, st_stream_t* tx,
                           st_stream_t* rx, st_crypto_counters_t* cc,
                           st_wire_counters_t* wc);
/* Feeds up to len bytes (borrowed for the call) and consumes them until
 * one unit (a plain frame or the peer's header) is whole and handled, or
 * the input runs out. *used gets the bytes consumed; the caller feeds the
 * rest again (after acting on a phase change). Nothing is consumed once
 * OPEN or FAILED. 0, or a negative errno with phase FAILED and drop set
 * (output queued before the refusal, such as HS3, stays queued). */
int st_session_framer_feed(st_session_framer_t* f, const uint8_t* in,
                           size_t len, size_t* used);
/* Bytes (1..ST_SESSION_LEN_BYTES + ST_SESSION_HS_FRAME_MAX) that would
 * complete the unit being read; 0 once OPEN or FAILED. A blocking caller
 * reads exactly this many so that it never reads past the header. */
size_t st_session_framer_want(const st_session_framer_t* f);
/* The queued output (borrowed until the next call on f); st_session_framer_sent
 * marks n of its first bytes sent. */
const uint8_t* st_session_framer_output(const st_session_framer_t* f,
                                        size_t* len);
void st_session_framer_sent(st_session_framer_t* f, size_t n);
/* Wipes the framer's secrets (the handshake state, the pending receive
 * key). The streams are the caller's and stay. */
void st_session_framer_wipe(st_session_framer_t* f);

/* ==== Ring formation (gossip/ring_form.c): who takes part in a round =======
 *
 * The opportunistic ring all-reduce (DESIGN.md, Averaging) needs a group of
 * free, healthy members that agree on one list in one order before the data
 * plane ("Ring all-reduce" below) starts. One machine per node, sans-IO like
 * membership: the driver feeds it events with the current time in
 * milliseconds and drains its actions; its SENDs go to member ids as sealed
 * UDP packets of one message each. Randomness (round ids) comes only from
 * the injected generator.
 *
 * The conversation (gossip/ring_form.c decides every corner case):
 *
 *   proposer P                                  each candidate C
 *   RING_PROPOSE [round, P, [P, C1..Ck]]  ->
 *                                     <-  RING_ACCEPT [round, accept]
 *   (after accept_wait_ms, or once all answered)
 *   >= 2 members: RING_CONFIRM [round, [P, accepted..]] -> START
 *   else:         RING_CANCEL [round]                   -> idle
 *
 * P is the live node with the smallest id among the ring-capable, healthy
 * members of its own view (the driver decides; views differ, so proposals
 * race). A free member accepts one proposal at a time; a member that has
 * accepted but not yet been confirmed, or a proposer still collecting,
 * gives way to a proposal from a smaller proposer id; larger ones are
 * refused, and so is everything while a round runs. Stale messages (a
 * round we do not hold) are ignored and counted. Against loss, a proposer
 * re-sends PROPOSE once to silent candidates, and a member that accepted
 * re-sends ACCEPT until CONFIRM or CANCEL comes (its proposer answers with
 * the CONFIRM again), every accept_wait_ms / 2.
 *
 * Wire (after [type, version]):
 *   RING_PROPOSE [round_id u64, proposer bin16, members [bin16, ...]]
 *   RING_ACCEPT  [round_id u64, accept bool, tag bin16]
 *   RING_CONFIRM [round_id u64, members [bin16, ...], tag bin16]
 *   RING_CANCEL  [round_id u64]
 * A members array holds at most ST_RING_FORM_MAX_MEMBERS ids: the
 * pre-walk refuses a longer one (LIMIT) before msgpack-c allocates.
 * Duplicates, a list without its proposer first or without the receiver,
 * are the machine's checks (counted invalid).
 */

/* The most members of one round, proposer included. The data plane could
 * take more (ST_RING_MAX_MEMBERS), but a ring of n takes 2 (n - 1)
 * latency-bound steps, and 64 ids keep a PROPOSE (1185 bytes) inside one
 * sealed UDP packet (ST_PACKET_MAX_PLAINTEXT). */
#define ST_RING_FORM_MAX_MEMBERS 64u

typedef struct {
  uint32_t accept_wait_ms;  /* how long a proposer collects answers;
                               default 500: a few UDP round trips on a LAN
                               (0.1 to 1 ms each) with room for a member
                               busy on a training step or a GC pause; a
                               member that misses it just sits this round
                               out */
  uint32_t confirm_wait_ms; /* how long a member that accepted waits for
                               CONFIRM or CANCEL; default 2000: the
                               proposer's accept_wait_ms plus a paused or
                               lossy proposer's slack. Past it, the member
                               is free again (counted as a timeout) */
  /* Robust averaging: whether this node averages with member id at all;
   * a proposal whose list holds a member it does not trust is refused
   * (counted as distrusted), in any state. NULL: every member is trusted.
   * Called with ctx = trusts_ctx during st_ring_form_message. */
  bool (*trusts)(const st_node_id_t* id, void* ctx);
  void* trusts_ctx;
} st_ring_form_config_t;

void st_ring_form_config_default(st_ring_form_config_t* cfg);

typedef enum {
  ST_RING_FORM_IDLE = 0,  /* free: accepts a proposal */
  ST_RING_FORM_PROPOSING, /* collecting answers to its own proposal */
  ST_RING_FORM_ACCEPTED,  /* accepted a proposal, waiting for CONFIRM */
  ST_RING_FORM_RUNNING    /* in a round, until st_ring_form_round_over */
} st_ring_form_state_t;

/* "idle", "proposing", "accepted", "running". */
const char* st_ring_form_state_name(st_ring_form_state_t s);

typedef enum {
  ST_RFACT_SEND = 0, /* send data[0..len) (one wire message) in its own
                        sealed UDP packet to the member `to`; data is
                        borrowed until the next call into the machine */
  ST_RFACT_START,    /* start the data plane: round_id, members[0..n)
                        in ring order (the same list on every member),
                        this node at my_rank; members is borrowed until
                        the next event. Always its event's last action,
                        so the driver may call st_ring_form_round_over
                        while handling it (when it cannot start) */
  ST_RFACT_TIMER     /* call st_ring_form_tick at or after at_ms;
                        replaces any earlier TIMER of this machine */
} st_rfact_kind_t;

typedef struct {
  st_rfact_kind_t kind;
  st_node_id_t to;
  const uint8_t* data;
  size_t len; /* <= ST_PACKET_MAX_PLAINTEXT */
  uint64_t round_id;
  const st_node_id_t* members;
  uint32_t n_members;
  uint32_t my_rank;
  const uint8_t* tag; /* START: the round's tag (ST_RING_TAG_BYTES, all
                         zero for none), borrowed like members */
  uint64_t at_ms;
} st_rfact_t;

/* For `starling status`; every field counts events since st_ring_form_new. */
typedef struct {
  uint64_t proposed;        /* proposals sent (st_ring_form_propose) */
  uint64_t confirmed;       /* own proposals confirmed (>= 2 members) */
  uint64_t started;         /* START emitted, as proposer or member */
  uint64_t cancelled;       /* proposals ended without a round: own ones
                               with < 2 accepts or given way to a smaller
                               proposer, accepted ones cancelled or whose
                               proposer went away */
  uint64_t refused;         /* proposals answered accept=false */
  uint64_t distrusted;      /* of those, refused for a member this node
                               does not trust (cfg.trusts) */
  uint64_t stale;           /* messages for a round we do not hold */
  uint64_t timeouts;        /* accepted, then no CONFIRM in time */
  uint64_t resent;          /* retransmissions: PROPOSE to silent
                               candidates, ACCEPT while waiting for
                               CONFIRM, CONFIRM to a member that asks */
  uint64_t invalid;         /* messages that do not decode or break the
                               rules: duplicate ids, a list without its
                               proposer first or without us */
  uint64_t finished_ok;     /* st_ring_form_round_over(ok) */
  uint64_t finished_failed; /* st_ring_form_round_over(!ok) */
} st_ring_form_counters_t;

typedef struct st_ring_form_s st_ring_form_t;

/* Creates the machine of node self (copied). rng is borrowed for the
 * machine's lifetime. -EINVAL for a NULL argument or a zero wait. */
int st_ring_form_new(const st_ring_form_config_t* cfg, const st_node_id_t* self,
                     st_rng_t* rng, st_ring_form_t** out);
void st_ring_form_free(st_ring_form_t* f);

/* Events. Each first drops the actions the previous event left undrained
 * (drain them all after every event). They return 0, or -EINVAL for
 * misuse. */
/* Proposes a round to candidates[0..n), the other members (self and
 * duplicates are dropped; -EINVAL when none is left). -EBUSY unless idle.
 * More than ST_RING_FORM_MAX_MEMBERS - 1 candidates: a random subset of
 * that many. */
int st_ring_form_propose(st_ring_form_t* f, uint64_t now_ms,
                         const st_node_id_t* candidates, size_t n);
/* One received message (a whole UDP plaintext holding exactly one RING_
 * PROPOSE, ACCEPT, CONFIRM or CANCEL) from the authenticated sender from.
 * Anything else is counted invalid and returns -EBADMSG. */
int st_ring_form_message(st_ring_form_t* f, uint64_t now_ms,
                         const st_node_id_t* from, const uint8_t* data,
                         size_t len);
int st_ring_form_tick(st_ring_form_t* f, uint64_t now_ms);
/* The data plane of the running round finished (ok) or aborted; back to
 * idle. -EINVAL when round_id is not the round this machine runs. */
int st_ring_form_round_over(st_ring_form_t* f, uint64_t now_ms,
                            uint64_t round_id, bool ok);
/* Membership says id is dead or has left. A running round is the driver's
 * to abort (st_ring_abort, then st_ring_form_round_over). */
int st_ring_form_member_gone(st_ring_form_t* f, uint64_t now_ms,
                             const st_node_id_t* id);

/* This node's tag, ST_RING_TAG_BYTES (NULL: none, all zero), for the
 * ACCEPTs and proposals from now on. A round's tag is the proposer's when
 * every member of its final list named that same tag in its last ACCEPT,
 * else none: so a round has a tag only when all its members hold it (the
 * driver's meaning: the daemon's anchor id, and a tagged round is a coded
 * one, gossip.h "Coded rounds"). A member may have changed its tag since
 * its ACCEPT; the START says the round's, for the driver to check. */
void st_ring_form_set_tag(st_ring_form_t* f, const uint8_t* tag);

/* Drains the actions the last event produced, in order; false when none
 * are left. */
bool st_ring_form_next_action(st_ring_form_t* f, st_rfact_t* out);

st_ring_form_state_t st_ring_form_state(const st_ring_form_t* f);
/* The round proposed, accepted or running; 0 when idle. */
uint64_t st_ring_form_round(const st_ring_form_t* f);

/* What the driver does with a data-plane lane (RING_LANE [round_id, ..])
 * that the authenticated node `from` opened to it. */
typedef enum {
  ST_RING_LANE_REFUSE = 0, /* close it now: this machine neither accepted
                              nor runs round_id, or (running) from is not
                              the member before this one in the final
                              list. Its sender sees the close and aborts at
                              once, instead of at a deadline */
  ST_RING_LANE_WAIT,       /* keep it (its first segment waits, the lane
                              paused): round_id is accepted and from
                              is in its list, but the CONFIRM (UDP) has not
                              come; decide again after the next event */
  ST_RING_LANE_TAKE        /* round_id runs and from is the member before
                              this one: feed the lane to the round */
} st_ring_lane_verdict_t;

st_ring_lane_verdict_t st_ring_form_lane(const st_ring_form_t* f,
                                         uint64_t round_id,
                                         const st_node_id_t* from);
const st_ring_form_counters_t* st_ring_form_counters(const st_ring_form_t* f);

/* ==== Ring all-reduce (gossip/ring.c): the mean of n snapshots =============
 *
 * One machine per member per round, sans-IO like the exchange: the driver
 * (the daemon) holds two encrypted streams, one from the previous member
 * (rank - 1 mod n) and one to the next (rank + 1 mod n), feeds the machine
 * what arrives on the first and writes its SENDs to the second. The
 * machine never sees a socket; tests wire k of them in a ring in memory.
 *
 * Words (gossip/ring.c defines them at length): the vector of n_params
 * float32 is cut into n_members *chunks*, chunk c covering floats
 * [c * N / n, (c + 1) * N / n) (integer division: sizes differ by at most
 * one, and some are empty when N < n); a chunk travels as *segments* of at
 * most segment_floats floats, one RING_SEG message each. The round is a
 * reduce-scatter of n - 1 steps (at step s member r sends its partial sum
 * of chunk (r - s) mod n and adds what it receives into chunk
 * (r - s - 1) mod n) then an all-gather of n - 1 steps passing the
 * finished chunks (the mean, divided by n where the sum completes) on.
 * Pipelined: a segment goes out as soon as the segment it depends on has
 * been received and added, with up to in_flight SENDs unacknowledged.
 * Each chunk is summed along the ring in one fixed order and then copied,
 * so every member ends with bit-identical means.
 *
 * The machine emits APPLY with delta = mean - own (own: its snapshot),
 * which the node adds to its parameters at its next step boundary (local
 * steps taken meanwhile are kept), then DONE(OK). Any failure (a message
 * that is not the next expected segment, the driver's abort, the timeout,
 * NaN or Inf in the mean) ends it with DONE(reason) and no APPLY; the
 * driver then closes both streams, which ends the round for the others
 * (their drivers see the close and call st_ring_abort), so nobody applies
 * a partial result. A neighbour that finished closes its streams as soon
 * as its own part is done, so a driver treats the end of the stream from
 * the previous member (after its last frame) as a failure only while
 * st_ring_progress shows segments still to receive, and the end of the
 * stream to the next member only while SENDs are unacknowledged.
 *
 * Lanes. The machine knows one send stream and one receive stream; the
 * transport may carry a stream over L lanes (1 <= L <= ST_RING_MAX_LANES),
 * each its own encrypted connection, so that L threads seal and L open at
 * once (one secretstream is sequential by construction). Lane k opens with
 * RING_LANE [round, k, L] and then carries segments k, k + L, k + 2L, ...
 * of the stream; the receiver feeds them to the machine in stream order.
 *
 * Wire (after [type, version]):
 *   RING_SEG [round_id u64, phase u8, step u32, chunk u32, offset u64,
 *             data bin]
 *   RING_LANE [round_id u64, lane u32, lanes u32]   lane < lanes <= max
 * phase is 0 (reduce-scatter) or 1 (all-gather); offset counts floats
 * within the chunk; data is at most ST_WIRE_CHUNK_MAX_BYTES and offset +
 * len / 4 <= 2^40 (the wire codec checks those). In a float32 round data
 * is the segment's floats, little-endian; in a coded round their encoding
 * (st_ring_codec_t; for starling's codecs the format of docs/protocol.md,
 * "Compressed snapshots"). The machine checks that the segment is exactly
 * the next one it expects: its length (float32), or that it decodes to
 * the segment's floats (coded).
 */

/* The most lanes a ring link may use (RING_LANE). */
#define ST_RING_MAX_LANES 8u

/* The largest segment: 1 MiB of float32, a whole tensor chunk of the wire
 * (ST_WIRE_CHUNK_MAX_BYTES), so that every segment is sealed on its own. */
#define ST_RING_SEGMENT_FLOATS (ST_WIRE_CHUNK_MAX_BYTES / 4u)
/* The default segment, 256 KiB, with four in flight: the same megabyte in
 * flight as two of the largest, in finer steps. Each member forwards a
 * segment only once it has all of it, so a segment's time on the link is
 * paid again at every hop while the ring fills and drains; on 1 Gbit/s
 * links 4 members reached 0.975 of the link instead of 0.95 (Gloo 0.97;
 * docs/benchmarks.md), and 2 and 8 members were unchanged. */
#define ST_RING_DEFAULT_SEGMENT_FLOATS (ST_RING_SEGMENT_FLOATS / 4u)
#define ST_RING_IN_FLIGHT 4u
/* The most members a ring may have: c * n_params stays below 2^56 for
 * n_params <= 2^40, and a ring this long is latency-bound long before
 * (2 (n - 1) steps each wait for one segment); proposers cap far lower. */
#define ST_RING_MAX_MEMBERS 65536u

typedef enum {
  ST_RING_REDUCE_SCATTER = 0,
  ST_RING_ALL_GATHER = 1
} st_ring_phase_t;

/* How a round ended (ST_RACT_DONE); st_ring_result_name gives the names. */
typedef enum {
  ST_RING_OK = 0,
  ST_RING_FAIL_PROTOCOL,  /* a message that is not the next expected
                             segment of this round (or does not decode) */
  ST_RING_FAIL_CLOSED,    /* the driver: a stream to a neighbour ended */
  ST_RING_FAIL_ABORTED,   /* the driver: a member left or was declared dead,
                             or the node stopped */
  ST_RING_FAIL_TIMEOUT,   /* no progress for timeout_ms (or the driver's own
                             deadline, through st_ring_abort) */
  ST_RING_FAIL_NONFINITE, /* NaN or Inf in the mean (every member sees the
                             same mean, so all fail) or in this member's
                             delta (|mean - own| beyond FLT_MAX: this
                             member only) */
  ST_RING_RESULT_COUNT
} st_ring_result_t;

/* "ok", "protocol", "closed", "aborted", "timeout", "nonfinite". */
const char* st_ring_result_name(st_ring_result_t r);

/* A coded round's codec (gossip.h, "Coded rounds" above st_ring_new):
 * the machine never reads codec bytes itself. Each call must be
 * deterministic (the same floats give the same bytes on every member, the
 * same bytes the same floats) and allocate nothing. */
typedef struct {
  /* The most bytes an encoding of n floats takes (n <= the round's
   * segment); > 0. */
  size_t (*max_bytes)(void* ctx, size_t n);
  /* Encodes x[0..n) (finite) into out[0..cap): 0 and *len, or -errno
   * (a NaN or Inf among them: -EINVAL). */
  int (*encode)(void* ctx, const float* x, size_t n, uint8_t* out, size_t cap,
                size_t* len);
  /* Decodes in[0..len) (untrusted) into out[0..n): 0, every out[i]
   * finite; or -errno with out untouched. */
  int (*decode)(void* ctx, const uint8_t* in, size_t len, float* out, size_t n);
  void* ctx;
} st_ring_codec_t;

typedef struct {
  uint32_t segment_floats;      /* 1 .. ST_RING_SEGMENT_FLOATS; default
                                   ST_RING_DEFAULT_SEGMENT_FLOATS. The largest
                                   segment: a small vector's round cuts each
                                   chunk into at least 4, none below 8192
                                   floats (gossip/ring.c, round_seg), so all
                                   members must use the same value */
  uint32_t in_flight;           /* SENDs unacknowledged at most, >= 1; default
                                   ST_RING_IN_FLIGHT */
  uint32_t timeout_ms;          /* fail when nothing progressed for this long
                                   (a segment received, a SEND acknowledged, the
                                   snapshot given); 0: never (the driver watches
                                   st_ring_progress). Default 30000 */
  const st_ring_codec_t* codec; /* NULL (default): float32 segments; else
                                   a coded round (below), the same codec
                                   on every member; borrowed until
                                   st_ring_free */
  const float* base; /* NULL (default), or n_params floats, the same bits
                        on every member, borrowed until st_ring_free: the
                        machine averages snapshot - base and gives base +
                        that mean as the mean (a codec then codes drifts
                        from a shared vector, small next to it) */
} st_ring_config_t;

void st_ring_config_default(st_ring_config_t* cfg);

typedef enum {
  ST_RACT_SEND = 0,      /* write data[0..len) (one RING_SEG) as one frame
                            to the NEXT member; borrowed until the next call
                            into the machine; report it with st_ring_sent
                            once written */
  ST_RACT_WANT_SNAPSHOT, /* ask the trainer for a snapshot of the
                            parameters, then call st_ring_snapshot */
  ST_RACT_APPLY,         /* add values[0..n) (mean - own) to the parameters
                            at the next step boundary; values is owned by
                            the machine, valid until st_ring_free */
  ST_RACT_TIMER,         /* call st_ring_tick at or after at_ms; replaces
                            any earlier TIMER of this machine */
  ST_RACT_DONE           /* finished: result; close both streams after the
                            queued frames */
} st_ract_kind_t;

typedef struct {
  st_ract_kind_t kind;
  const uint8_t* data;
  size_t len;
  const float* values;
  size_t n;
  uint64_t at_ms;
  st_ring_result_t result;
} st_ract_t;

/* Where a round stands, for the driver's own deadline (e.g. from measured
 * segment times) and for `starling status`. Segment counts are this
 * member's: it sends and receives 2 (n - 1) chunks, about
 * 2 (n - 1) / n * n_params floats each way. */
typedef struct {
  uint64_t started_ms;       /* st_ring_new's now */
  uint64_t last_progress_ms; /* the last snapshot, segment or acknowledged
                                SEND */
  uint64_t segments_to_send;
  uint64_t segments_sent;  /* emitted as SEND actions */
  uint64_t segments_acked; /* reported written (st_ring_sent) */
  uint64_t segments_to_receive;
  uint64_t segments_received;
  bool have_snapshot;
} st_ring_progress_t;

typedef struct st_ring_s st_ring_t;

/* Coded rounds (cfg.codec): every segment travels as the codec's
 * encoding of its floats. The reduce-scatter still adds in float32; a
 * member encodes each partial sum it sends once (its own chunk at step 0,
 * each sum at the next), and the member that completes a chunk's sum S
 * encodes S once: the all-gather passes those bytes on unchanged, and
 * every member, that one included, takes decode(bytes) / n as the mean,
 * so the means are still the same bits everywhere. What an encoding
 * rounded away (e = sum - decode(encode(sum)), over the floats of that
 * segment) the member that encoded it keeps: its APPLY is mean - own + e.
 * The members' parameters after the round then add up to what they held
 * before (up to float32 rounding), as with float32 rounds; they agree
 * only up to each member's e, which its next exchange or round carries.
 * Each float passes through one encoding per member at most. The machine
 * also holds the all-gather's bytes until it sends them (about the
 * encoding of (n - 1) / n of the vector) and three segments of scratch. */

/* The machine of member my_rank of n_members (ranks 0 .. n - 1 in ring
 * order, the same on every member) for round round_id, averaging n_params
 * floats. It allocates its buffers here (2 * n_params floats and one
 * encoded segment; -ENOMEM). The first actions are the TIMER and
 * WANT_SNAPSHOT; when there is nothing to average (n_members == 1 or
 * n_params == 0) the only action is DONE(OK), with no snapshot and no
 * APPLY. -EINVAL for a config out of range, n_members 0 or beyond
 * ST_RING_MAX_MEMBERS, my_rank >= n_members, or n_params beyond 2^40. */
int st_ring_new(const st_ring_config_t* cfg, uint64_t round_id,
                uint32_t n_members, uint32_t my_rank, uint64_t n_params,
                uint64_t now_ms, st_ring_t** out);
void st_ring_free(st_ring_t* x);

/* Events. A failure of the round is not an error of the call: it ends the
 * round with a DONE action. The calls return -EINVAL only for misuse;
 * events after DONE are ignored and return 0. */
/* The snapshot asked for: n == n_params floats, copied before the call
 * returns unless own is st_ring_snapshot_buffer's buffer (then nothing is
 * copied). -EINVAL when none was asked for or n is wrong. */
int st_ring_snapshot(st_ring_t* x, uint64_t now_ms, const float* own, size_t n);
/* After WANT_SNAPSHOT: the machine's own buffer for the snapshot
 * (n_params floats, valid until st_ring_free), for the trainer to write
 * into before st_ring_snapshot(x, now, buffer, n_params). NULL when no
 * snapshot is asked for. */
float* st_ring_snapshot_buffer(st_ring_t* x);
/* One received frame's plaintext (one wire message) from the PREVIOUS
 * member, in stream order. */
int st_ring_message(st_ring_t* x, uint64_t now_ms, const uint8_t* data,
                    size_t len);
/* One SEND frame has been written to the next member's stream (-EINVAL
 * when none is outstanding). */
int st_ring_sent(st_ring_t* x, uint64_t now_ms);
int st_ring_tick(st_ring_t* x, uint64_t now_ms);
/* The driver ends the round: reason is a failure (CLOSED when a stream to
 * a neighbour ended, ABORTED when a member died, TIMEOUT for its own
 * deadline); -EINVAL for ST_RING_OK or an unknown reason. */
int st_ring_abort(st_ring_t* x, uint64_t now_ms, st_ring_result_t reason);

bool st_ring_next_action(st_ring_t* x, st_ract_t* out);
bool st_ring_finished(const st_ring_t* x);
void st_ring_progress(const st_ring_t* x, st_ring_progress_t* out);
/* After DONE(OK) with an APPLY: the mean itself (n_params floats, the
 * same bits on every member; valid until st_ring_free); else NULL. */
const float* st_ring_mean(const st_ring_t* x);
/* After DONE(OK) with an APPLY: the APPLY's values (mean - own), writable
 * for a driver that changes the move before it passes it on (the outer
 * optimizer, node/daemon/daemon_outer.c); else NULL. */
float* st_ring_delta(st_ring_t* x);

/* ==== Lane striping (gossip/lanes.c): one ring stream over L lanes ========
 *
 * The ring's transport may carry each stream over L lanes (gossip.h, "Ring
 * all-reduce": lanes). The striper is the bookkeeping of that, sans-IO and
 * shared by both drivers (the daemon, node/daemon/daemon_ring.c, and the
 * benchmark, tools/bench/bench_ring_member.c); it never sees a byte of a
 * segment: the driver keeps the segments, the striper says what to do
 * with them.
 *
 * Send side: segment i of the send stream goes on lane i % L
 * (st_lanes_send_lane, then st_lanes_send_done once it is handed on).
 *
 * Receive side: lane k of the previous member's L lanes carries segments
 * k, k + L, k + 2L, ... of the receive stream; the ring machine takes them
 * in stream order. The driver joins each lane as it learns of it
 * (RING_LANE, or the order it accepted them in) and says how many segments
 * the stream carries (st_lanes_expect). Then for each segment that comes
 * on lane k, st_lanes_accept answers FEED (the next in stream order: give
 * it to the ring machine now) or HOLD (early: keep it and pause the lane's
 * reading; a lane holds at most one); after every FEED, st_lanes_next_held
 * gives, in order, the lanes whose kept segment's turn has come (feed it,
 * resume the lane). A lane's end (its final frame, or its connection
 * closing) is st_lanes_end, an error while that lane still owes a segment
 * of the stream (a kept one not yet fed counts).
 *
 * Errors are verdicts, each named by st_lanes_verdict_name, for the driver
 * to end the round with (the daemon: a lane that ended early is
 * ST_RING_FAIL_CLOSED, the others ST_RING_FAIL_PROTOCOL or a closed lane).
 *
 * The struct is the caller's (embedded by value, no allocation, nothing to
 * free); st_lanes_init resets it. Its fields are read-only to the caller.
 */

typedef enum {
  ST_LANES_FEED = 0,      /* the next segment of the stream: feed it now */
  ST_LANES_HOLD,          /* early: keep it and pause the lane */
  ST_LANES_DONE,          /* st_lanes_end: the lane ended owing nothing */
  ST_LANES_ERR_LANE,      /* no such lane: lane >= L, or not joined */
  ST_LANES_ERR_COUNT,     /* a lane that disagrees on L with the first */
  ST_LANES_ERR_TWICE,     /* a lane joined twice */
  ST_LANES_ERR_OVERRUN,   /* a segment on a lane that already holds one (its
                             reading should have paused) */
  ST_LANES_ERR_ENDED,     /* a segment on a lane after its end */
  ST_LANES_ERR_EXTRA,     /* a segment beyond the stream's expected count */
  ST_LANES_ERR_EARLY_END, /* a lane ended while it still owed a segment */
  ST_LANES_VERDICT_COUNT
} st_lanes_verdict_t;

/* "feed", "hold", "done", "no such lane", "lane count disagrees", "lane joined
 * twice", "segment on a paused lane", "segment after the lane's end",
 * "segment beyond the stream", "lane ended early". */
const char* st_lanes_verdict_name(st_lanes_verdict_t v);

typedef struct {
  uint32_t send_lanes; /* L of the send stream, 1 .. ST_RING_MAX_LANES */
  uint64_t sent;       /* send-stream segments handed on */
  uint32_t recv_lanes; /* L of the receive stream; 0 until a lane joins */
  uint64_t fed;        /* receive-stream segments fed, in stream order */
  uint64_t expected;   /* receive-stream segments expected in all */
  uint32_t joined, held, ended; /* bit k: lane k of the receive stream */
} st_lanes_t;

/* Resets s for a stream of send_lanes lanes out (no lane in yet, nothing
 * expected). -EINVAL when send_lanes is 0 or beyond ST_RING_MAX_LANES. */
int st_lanes_init(st_lanes_t* s, uint32_t send_lanes);

/* Send side: the lane of the next send-stream segment (sent % L), and the
 * step past it once the driver has taken that segment. */
uint32_t st_lanes_send_lane(const st_lanes_t* s);
void st_lanes_send_done(st_lanes_t* s);
/* Send-stream segments lane k has carried so far (0 for k >= L). */
uint64_t st_lanes_sent_on(const st_lanes_t* s, uint32_t lane);

/* Receive side. The stream carries `more` segments beyond those expected
 * so far (a driver that keeps its lanes for several rounds adds each
 * round's; saturates). */
void st_lanes_expect(st_lanes_t* s, uint64_t more);
/* Lane `lane` of `lanes` from the previous member joins. The first fixes
 * L; holding: a segment already came on it before it joined (the driver
 * keeps it; it is the lane's first, segment `lane`). FEED when taken;
 * ERR_LANE (lane >= lanes, or lanes 0 or beyond ST_RING_MAX_LANES),
 * ERR_COUNT, ERR_TWICE, or ERR_EXTRA (holding a segment the stream does
 * not have); the lane is not joined then. */
st_lanes_verdict_t st_lanes_join(st_lanes_t* s, uint32_t lane, uint32_t lanes,
                                 bool holding);
/* The lane that carries the next segment of the receive stream (fed % L);
 * 0 before any lane joins. */
uint32_t st_lanes_recv_lane(const st_lanes_t* s);
/* A segment came on lane `lane`: FEED (counted fed), HOLD (the lane now
 * holds it), or ERR_LANE, ERR_ENDED, ERR_OVERRUN, ERR_EXTRA (nothing
 * changes). */
st_lanes_verdict_t st_lanes_accept(st_lanes_t* s, uint32_t lane);
/* true when the lane of the next segment holds it: *lane names it, its
 * hold is cleared and the segment counted fed; the driver feeds it and
 * resumes the lane. Call until false after each FEED. */
bool st_lanes_next_held(st_lanes_t* s, uint32_t* lane);
/* Lane `lane` ended (its final frame, or its connection closed); whatever
 * it held is the driver's to drop. ST_LANES_ERR_EARLY_END when it still
 * owed a segment of the stream, else ST_LANES_DONE; ERR_LANE
 * for a lane never joined. The lane is ended either way; ending it again
 * answers the same. */
st_lanes_verdict_t st_lanes_end(st_lanes_t* s, uint32_t lane);

/* ==== User collectives (gossip/coll.c) ======================================
 *
 * The operations a program calls through its node (client/starling/comm.h,
 * docs/collectives.md): all-reduce, reduce to a root, broadcast from a root,
 * and barrier, over a group of n members with ranks 0 .. n - 1 (the node
 * orders the group's ids; every member of it must call the same operation
 * with the same kind, reduction, dtype, root and count, in the same order).
 * One machine per member per operation, sans-IO: the driver hands it the
 * decoded messages that came from the other members of the operation
 * (st_coll_message, with the sender's rank, learnt from the authenticated
 * connection) and sends the SENDs to the member they name; the machine
 * never sees a socket or a clock (the driver owns the deadline and the
 * failure detector, and calls st_coll_abort).
 *
 * Two paths, chosen alike by every member from the operation itself:
 *
 * - small (count * element size <= small_bytes and n <= ST_COLL_SMALL_MEMBERS;
 *   barrier always, as an all-reduce of one float32): one round. Each member
 *   sends COLL_HELLO carrying its data straight to the members that need it
 *   (all-reduce and barrier: every other member; reduce: the root;
 *   broadcast: the root to every other member) and reduces what it gets in
 *   rank order, so every member's result has the same bits.
 * - large: all-reduce and reduce run the pipelined ring of ring.c (chunk c
 *   of the vector covers elements [c * count / n, (c + 1) * count / n); a
 *   reduce-scatter of n - 1 steps, then an all-gather of n - 1; each
 *   segment of at most segment_bytes is forwarded as soon as it is
 *   reduced); a reduce is an all-reduce whose result only the root keeps.
 *   Broadcast is a chain from the root in rank order (root, root + 1, ...),
 *   each member forwarding each segment as it comes. A member first sends
 *   COLL_HELLO (no data) to the member it sends segments to.
 *
 * Every member checks each HELLO against its own call: a difference in
 * kind, reduction, dtype, root, count, group size or member list ends the
 * operation with MISMATCH, naming both calls. A member whose operation
 * fails for any reason but a peer's ABORT sends COLL_ABORT [op, reason] to
 * every other member, which then fails too with PEER: nobody returns a
 * partial result as complete. MEAN divides the sum by n once, where a
 * chunk's sum completes, so members agree bit for bit on both paths.
 *
 * Wire (after [type, version]):
 *   COLL_HELLO [op u64, kind u8, rop u8, dtype u8, root u32, count u64,
 *               n u32, members_hash u64, data bin]
 *   COLL_SEG   [op u64, phase u8, step u32, offset u64, data bin]
 *   COLL_ABORT [op u64, reason str]
 *   COLL_FETCH [op u64, code u8, text str] (st_msg_coll_fetch_t)
 * data is little-endian elements of the dtype; offset is in elements from
 * the start of the vector; phase 0 and 1 are the ring's reduce-scatter and
 * all-gather (step within the phase), 2 the broadcast chain (step 0).
 */

typedef enum {
  ST_COLL_ALL_REDUCE = 0,
  ST_COLL_REDUCE,
  ST_COLL_BROADCAST,
  ST_COLL_BARRIER,
  ST_COLL_KIND_COUNT
} st_coll_kind_t;

typedef enum {
  ST_COLL_SUM = 0,
  ST_COLL_MEAN,
  ST_COLL_MIN,
  ST_COLL_MAX,
  ST_COLL_ROP_COUNT
} st_coll_rop_t;

/* BF16: bfloat16 (the top half of a float32); a reduction combines two
 * values in float32 and rounds the result to nearest even, so a sum of n
 * members rounds n - 1 times (relative error up to about (n - 1) 2^-8 of
 * the sum of magnitudes); min and max are exact. */
typedef enum {
  ST_COLL_F32 = 0,
  ST_COLL_F64,
  ST_COLL_BF16,
  ST_COLL_DTYPE_COUNT
} st_coll_dtype_t;

typedef enum {
  ST_COLL_PHASE_RS = 0, /* ring reduce-scatter */
  ST_COLL_PHASE_AG,     /* ring all-gather */
  ST_COLL_PHASE_CHAIN,  /* broadcast chain */
  ST_COLL_PHASE_COUNT
} st_coll_phase_t;

typedef enum {
  ST_COLL_OK = 0,
  ST_COLL_FAIL_MISMATCH, /* a member called something else */
  ST_COLL_FAIL_PROTOCOL, /* a message out of order, of the wrong size, or
                            from a member that owes none */
  ST_COLL_FAIL_PEER,     /* another member's ABORT */
  ST_COLL_FAIL_ABORTED,  /* the driver: a member died or left, a link
                            closed, the node stopped */
  ST_COLL_FAIL_TIMEOUT,  /* the driver: the caller's deadline */
  ST_COLL_RESULT_COUNT
} st_coll_result_t;

/* "ok", "mismatch", "protocol", "peer", "aborted", "timeout". */
const char* st_coll_result_name(st_coll_result_t r);
/* "all_reduce", "reduce", "broadcast", "barrier". */
const char* st_coll_kind_name(st_coll_kind_t k);
/* "sum", "mean", "min", "max". */
const char* st_coll_rop_name(st_coll_rop_t r);
/* "float32", "float64". */
const char* st_coll_dtype_name(st_coll_dtype_t t);
/* Bytes of one element: 4 or 8 (0 for an unknown dtype). */
size_t st_coll_elem_bytes(st_coll_dtype_t t);

/* The small path's bounds: 64 KiB of data and 64 members (each member
 * keeps every other member's contribution until it reduces them). */
#define ST_COLL_SMALL_BYTES (64u * 1024u)
#define ST_COLL_SMALL_MEMBERS 64u
#define ST_COLL_SEGMENT_BYTES (256u * 1024u)

typedef struct {
  uint64_t op_id; /* the same at every member; the driver's to choose */
  st_coll_kind_t kind;
  st_coll_rop_t rop; /* all-reduce and reduce; SUM otherwise */
  st_coll_dtype_t dtype;
  uint32_t root;  /* reduce and broadcast: a rank < n; 0 otherwise */
  uint64_t count; /* elements; barrier: 1 (the machine sends one zero) */
  uint32_t n, rank;
  uint64_t members_hash;  /* the driver's hash of the group's ids */
  uint32_t small_bytes;   /* ST_COLL_SMALL_BYTES, the same everywhere */
  uint32_t segment_bytes; /* ST_COLL_SEGMENT_BYTES: a multiple of 8,
                             8 .. ST_WIRE_CHUNK_MAX_BYTES */
} st_coll_spec_t;

/* A spec with the defaults above for what the caller does not set. */
void st_coll_spec_default(st_coll_spec_t* spec);

typedef enum {
  ST_CACT_SEND = 0, /* send data[0..len) (one wire message) to rank `to`;
                       borrowed until the next call into the machine */
  ST_CACT_DONE      /* finished: result (why: a sentence when it failed;
                       culprit: the rank it names, or n for none) */
} st_cact_kind_t;

typedef struct {
  st_cact_kind_t kind;
  uint32_t to;
  const uint8_t* data;
  size_t len;
  st_coll_result_t result;
  uint32_t culprit;
  const char* why; /* valid until st_coll_free */
} st_cact_t;

typedef struct st_coll_s st_coll_t;

/* The machine of member spec->rank for one operation. input holds count
 * elements of dtype (copied; NULL for barrier, and allowed for a
 * broadcast's non-root members); the first actions are its SENDs.
 * -EINVAL for a spec out of range (kind, rop, dtype, n 0 or beyond
 * ST_COLL_MAX_MEMBERS, rank or root >= n, count beyond ST_COLL_MAX_COUNT,
 * a barrier's count other than 1, segment_bytes), -ENOMEM. */
int st_coll_new(const st_coll_spec_t* spec, const void* input, st_coll_t** out);
/* st_coll_new working in the caller's buf instead of a copy: buf holds the
 * count elements of input (ignored for a broadcast's non-root members),
 * is read and written by the machine until st_coll_free (the segments it
 * sends are encoded from it), and afterwards holds the result where
 * st_coll_result has one (then st_coll_result == buf); a reduce's
 * non-root members are left with partial sums in it. Nothing else may
 * write buf meanwhile. A barrier, or a count of 0, works as st_coll_new. */
int st_coll_new_in(const st_coll_spec_t* spec, void* buf, st_coll_t** out);
void st_coll_free(st_coll_t* x);

/* A message of this operation (msg->u.*.op_id == op_id; -EINVAL
 * otherwise or for a type that is not a collective's) from rank `from`
 * (-EINVAL when from >= n or is this member). A failure of the operation
 * is not an error of the call: it ends the operation with DONE. Events
 * after DONE are ignored. After each call (and after st_coll_new) the
 * driver takes every action before the next event: segments are encoded
 * from the machine's buffer as they are taken. The one exception: a
 * driver may leave COLL_SEG actions (and what follows them) untaken while
 * it feeds further events, to pace its sends (st_coll_next_is_segment).
 * That is safe because no later event writes the range of a segment
 * already queued: a reduction's final value of a range depends on this
 * member's queued partial of it, and a forwarded or root's range is
 * final. */
int st_coll_message(st_coll_t* x, uint32_t from, const st_msg_t* msg);
/* The driver ends the operation: reason ABORTED, TIMEOUT or MISMATCH (a
 * member waits in another operation: the driver's mismatch rule; -EINVAL
 * otherwise), culprit a rank or n, why a sentence (copied). ABORTs to
 * every other member come before the DONE. */
int st_coll_abort(st_coll_t* x, st_coll_result_t reason, uint32_t culprit,
                  const char* why);
/* The driver ends an operation that has heard from no member (the
 * caller's deadline passed and nobody else called it): DONE(TIMEOUT, why)
 * after a COLL_ABORT with an empty reason to every other member, which
 * tells their drivers to forget what this member sent for it (it "never
 * happened", so the driver may give its operation number back). -EBUSY
 * when a message of the operation has come (then st_coll_abort), -EINVAL
 * after DONE. */
int st_coll_withdraw(st_coll_t* x, const char* why);
bool st_coll_next_action(st_coll_t* x, st_cact_t* out);
/* Whether the next action is a COLL_SEG, and to which rank: a driver that
 * paces large operations by its connections' send queues looks before it
 * takes (the machine keeps the action until then). */
bool st_coll_next_is_segment(const st_coll_t* x, uint32_t* to);
bool st_coll_finished(const st_coll_t* x);
/* Whether a message of this operation came from rank r (for the driver's
 * timeout sentence: who has not been heard from). */
bool st_coll_heard(const st_coll_t* x, uint32_t r);
/* After DONE(OK): the result, count elements of dtype (the same bits at
 * every member that has one); NULL for a reduce's non-root members, a
 * barrier, or before DONE(OK). Valid until st_coll_free. */
const void* st_coll_result(const st_coll_t* x);

/* ==== Multi-donor state sync (gossip/sync.c) ===============================
 *
 * A joining node fetches the agreed state (the vector the last ring round
 * moved every member to, bit for bit; "Exchanges", compressed averaging,
 * names it by its anchor id) from several donors at once, trusting none
 * alone:
 *
 * 1. It asks live members for their manifest: SYNC_REQ MANIFEST ->
 *    SYNC_REPLY [status, id, round, step, n_params, hashes], one
 *    BLAKE2b-256 per chunk of ST_SYNC_CHUNK_FLOATS floats.
 * 2. It takes the manifest that the most donors sent identically (id,
 *    round, n_params and every hash), when at least two did: one donor
 *    alone cannot make one up.
 * 3. It fetches ranges of chunks from those donors, several at once:
 *    SYNC_REQ RANGE [.., id, first, count] -> SYNC_REPLY (OK, no hashes),
 *    then one TENSOR_CHUNK per chunk, in order (offset: the chunk's first
 *    float in the whole vector; total: n_params), each checked against its
 *    hash as it arrives. A donor that sends a bad chunk is dropped for the
 *    rest of the sync; the chunks a donor did not deliver (it died, closed,
 *    refused) go back to the pool for the others.
 * 4. Once every chunk is verified the joiner checks the whole vector
 *    against the id, and takes it with the smallest step the agreeing
 *    donors reported (a lying donor can hold it back, not push it ahead).
 *
 * The plan below is steps 2 and 3's bookkeeping, without I/O: donors are
 * indexes 0 .. ST_SYNC_MAX_DONORS - 1 that the driver maps to members. */
#define ST_SYNC_MAX_DONORS 16

typedef struct st_sync_plan_s st_sync_plan_t;

/* How a chunk that arrived was judged (st_sync_plan_chunk). */
typedef enum {
  ST_SYNC_CHUNK_OK = 0, /* verified: the caller keeps its floats */
  ST_SYNC_CHUNK_BAD,    /* its hash differs: the donor is dropped */
  ST_SYNC_CHUNK_ORDER   /* not the next chunk of the donor's range, or the
                           wrong length: the donor is dropped */
} st_sync_chunk_t;

/* A plan for a state of n_params floats (1 .. ST_SYNC_MAX_CHUNKS chunks).
 * 0, -EINVAL (n_params 0 or too many chunks) or -ENOMEM. */
int st_sync_plan_new(uint64_t n_params, st_sync_plan_t** out);
void st_sync_plan_free(st_sync_plan_t* p);
/* Chunks of the state: ceil(n_params / ST_SYNC_CHUNK_FLOATS). */
uint64_t st_sync_chunks(uint64_t n_params);

/* Donor `donor` answered MANIFEST with r. 0 when r is usable (status OK,
 * n_params the plan's, one hash per chunk, an id not all zero); else
 * -EINVAL and nothing is kept. A donor's later manifest replaces its
 * earlier one; once the plan has agreed (st_sync_plan_agree) manifests
 * are refused (-EBUSY). */
int st_sync_plan_manifest(st_sync_plan_t* p, unsigned donor,
                          const st_msg_sync_reply_t* r);
/* Agrees on the manifest the most donors sent identically, when at least
 * min_agree (>= 2) did; ties go to the one whose donors' smallest step is
 * largest, then to the smallest donor index. Returns how many donors hold
 * it, or 0 (no agreement yet: the plan still takes manifests). Once
 * agreed, it stays agreed. */
unsigned st_sync_plan_agree(st_sync_plan_t* p, unsigned min_agree);
/* After agreement: the state's id and round, and the step to take. */
void st_sync_plan_agreed(const st_sync_plan_t* p,
                         uint8_t id[ST_XCHG_ANCHOR_BYTES], uint64_t* round,
                         uint64_t* step);
/* Whether donor holds the agreed manifest and has not been dropped. */
bool st_sync_plan_usable(const st_sync_plan_t* p, unsigned donor);
/* How many donors are usable. */
unsigned st_sync_plan_usable_count(const st_sync_plan_t* p);

/* A range for a usable donor that has none out: the first run of chunks
 * that are neither verified nor out with another donor, at most max_chunks
 * (>= 1) long. false when there is none, or the donor cannot take one. */
bool st_sync_plan_take(st_sync_plan_t* p, unsigned donor, uint64_t max_chunks,
                       uint64_t* first, uint64_t* count);
/* A TENSOR_CHUNK of donor's range: its offset (floats, in the whole state)
 * and len bytes of data. Verified against the manifest when it is the
 * next chunk of the range with the chunk's exact length; a BAD or ORDER
 * chunk drops the donor (its range is then ended as st_sync_plan_end
 * would). On OK, *chunk is its index. */
st_sync_chunk_t st_sync_plan_chunk(st_sync_plan_t* p, unsigned donor,
                                   uint64_t offset, const uint8_t* data,
                                   size_t len, uint64_t* chunk);
/* Donor's range ended (its connection closed, whole or not): its chunks
 * not verified go back to the pool. drop: the donor is not given another
 * range (it failed or refused), whether or not it had one out. */
void st_sync_plan_end(st_sync_plan_t* p, unsigned donor, bool drop);
/* Whether donor has a range out; whether every chunk is verified; and how
 * many chunks are verified so far. */
bool st_sync_plan_busy(const st_sync_plan_t* p, unsigned donor);
bool st_sync_plan_complete(const st_sync_plan_t* p);
uint64_t st_sync_plan_verified(const st_sync_plan_t* p);

#ifdef __cplusplus
}
#endif

#endif /* STARLING_GOSSIP_H */
