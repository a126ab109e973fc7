/* wire_internal.h: the raw-byte side of the wire codec, shared by
 * gossip/wire.c (which alone calls msgpack-c) and gossip/wire_scan.c (the
 * pre-validator that walks the raw bytes before msgpack-c may allocate).
 * Internal to gossip/; see gossip.h for the contract and the layouts. */
#ifndef STARLING_GOSSIP_WIRE_INTERNAL_H
#define STARLING_GOSSIP_WIRE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gossip/gossip.h"

/* No message has more than 13 elements in one array (STATUS: type, version
 * and 11 fields); 16 leaves room to reject a wrong field count as a field
 * error while keeping what msgpack-c may allocate for one array at 16
 * objects (16 * 24 bytes). Maps are never part of a message but are walked
 * under the same cap (16 entries). */
#define ST__WIRE_MAX_ELEMENTS 16

/* A tensor holds at most 2^40 float32 (4 TiB): far beyond any model we
 * train, and small enough that offset + count never overflows uint64. */
#define ST__WIRE_MAX_TENSOR_FLOATS (UINT64_C(1) << 40)

/* What one msgpack header says, read from the raw bytes. */
typedef enum {
  ST__WK_NIL = 0,
  ST__WK_BOOL,
  ST__WK_UINT,  /* positive fixint, uint8..64, and int8..64 >= 0 */
  ST__WK_NINT,  /* negative values of any int encoding */
  ST__WK_FLOAT, /* float32 or float64 */
  ST__WK_STR,   /* payload of n bytes follows */
  ST__WK_BIN,   /* payload of n bytes follows */
  ST__WK_EXT,   /* payload of n bytes follows (type byte included) */
  ST__WK_ARRAY, /* n elements follow */
  ST__WK_MAP    /* n entries (2n objects) follow */
} st__wire_kind_t;

typedef struct {
  st__wire_kind_t kind;
  size_t head;    /* bytes of the header: the type byte, any length, an
                     ext's type, and a fixed-size value (ints, floats,
                     fixext data) */
  uint64_t n;     /* bytes after the header (str, bin, ext8/16/32),
                     elements (array) or entries (map); else 0 */
  uint64_t value; /* ST__WK_UINT only: the value */
} st__wire_head_t;

/* Reads the header of the object at p[0..left). Returns 0, or -EBADMSG for
 * an unused type byte (0xc1) or a header (or fixed-size value) cut short:
 * both malformed. Checks nothing of what follows the header. */
int st__wire_read_head(const uint8_t* p, size_t left, st__wire_head_t* h);

/* The envelope of a message, read from its raw bytes before anything else:
 * an array of at least 2, whose first two elements are the type and the
 * version as unsigned integers. Returns 0 and fills *type and *version, or
 * -EBADMSG (malformed). */
int st__wire_peek_envelope(const uint8_t* buf, size_t len, uint64_t* type,
                           uint64_t* version);

/* A push-pull's entries array is the one array allowed past
 * ST__WIRE_MAX_ELEMENTS: up to ST_WIRE_PUSH_PULL_MAX_ENTRIES. Before
 * msgpack-c may allocate for it, its declared count must fit the bytes
 * left at the smallest encoding an entry can have: fixarray (1), node bin8
 * of 16 (18), incarnation and state as fixints (1 + 1), addr as a fixarray
 * of bin8 of 4 and a fixint port (1 + 6 + 1), public key bin8 of 32 (34),
 * signature bin8 of 64 (66): 129 bytes. (The largest entry, a full u64,
 * IPv6 and a uint16 port, is 151 bytes: 6900 of them fit
 * ST_WIRE_MAX_MESSAGE_BYTES.) */
#define ST__WIRE_PUSH_PULL_MIN_ENTRY_BYTES 129
/* [24, 1, is_reply, [entry...]]: the entries array is element 3. */
#define ST__WIRE_PUSH_PULL_ENTRIES_INDEX 3

/* A ring formation's members array (RING_PROPOSE, RING_CONFIRM; gossip.h,
 * "Ring formation") is the other array allowed past ST__WIRE_MAX_ELEMENTS:
 * up to ST_RING_FORM_MAX_MEMBERS ids, each a bin8 of 16 at least (18
 * bytes). [41, 1, round, proposer, [id...]] and [43, 1, round, [id...]]:
 * the array is element 4 and 3. */
#define ST__WIRE_RING_MEMBER_MIN_BYTES 18
#define ST__WIRE_RING_PROPOSE_MEMBERS_INDEX 4
#define ST__WIRE_RING_CONFIRM_MEMBERS_INDEX 3

/* A push-pull nests one level deeper than any other message: the top-level
 * array is depth 1, the entries array 2, an entry 3, its addr 4 and the
 * addr's ip and port 5, where the others reach 3 (an addr's ip and port)
 * and are walked under ST_WIRE_MAX_DEPTH (4, leaving one level so that a
 * field nested one too deep is still a field error). The push-pull alone is
 * walked under this depth. */
#define ST__WIRE_PUSH_PULL_DEPTH 5
#define ST__WIRE_SCAN_DEPTH_MAX                                            \
  (ST__WIRE_PUSH_PULL_DEPTH > ST_WIRE_MAX_DEPTH ? ST__WIRE_PUSH_PULL_DEPTH \
                                                : ST_WIRE_MAX_DEPTH)

/* What the walk allows for one message type, from its envelope. */
typedef struct {
  size_t max_depth;      /* objects nested deeper than this: LIMIT */
  uint64_t big_index;    /* the element of the top-level array that may be
                            a big array; 0 for none (element 0 is the type) */
  uint64_t big_max;      /* how many elements that array may declare */
  uint64_t big_min_each; /* bytes each of those elements takes at least */
} st__wire_rules_t;

/* The rules for a message of this type (ST_MSG_PUSH_PULL: the entries
 * array and the deeper nesting; ST_MSG_RING_PROPOSE and _CONFIRM: the
 * members array; any other: the defaults). */
void st__wire_rules_for(uint64_t type, st__wire_rules_t* r);

/* Walks the first msgpack object of buf[0..len) without allocating and
 * checks it: every type byte is in use, every fixed-size value and every
 * header fits in the bytes left (else MALFORMED), every str, bin and ext
 * length fits in the bytes left, every array or map count fits in the
 * bytes left together with the elements still owed by the enclosing
 * containers (one byte each at least) and within ST__WIRE_MAX_ELEMENTS
 * (the rules' big array: within big_max, and big_min_each bytes each),
 * and nesting stays within the rules' max_depth (else LIMIT). Returns 0
 * and the object's size in *used (bytes after it are not looked at), or
 * -EBADMSG and the reason in *why. */
int st__wire_scan(const uint8_t* buf, size_t len, const st__wire_rules_t* r,
                  size_t* used, st_wire_drop_t* why);

/* Whether s[0..n) is a model description an exchange may carry: valid
 * UTF-8 (RFC 3629: no overlong forms, surrogates or code points past
 * U+10FFFF) holding no control character (C0, DEL, C1, so no NUL either)
 * and none of the characters that change how the rest of a terminal line
 * reads (U+2028, U+2029, the bidirectional embeddings, overrides and
 * isolates U+202A..U+202E and U+2066..U+2069). The empty string is valid. */
bool st__wire_model_ok(const char* s, size_t n);

#endif /* STARLING_GOSSIP_WIRE_INTERNAL_H */
