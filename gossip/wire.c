/* wire.c: the msgpack wire codec (DESIGN.md, Wire; field layouts in
 * gossip.h), the only file that calls msgpack-c (STYLE.md rule 6).
 *
 * Encoding packs [type, version, field...] straight into the caller's
 * buffer through a bounded write callback: no allocation, and a buffer too
 * small is -EMSGSIZE.
 *
 * Decoding checks before it touches a body, in this order: the size cap
 * (ST_WIRE_MAX_MESSAGE_BYTES), the envelope read from the raw bytes (an
 * array whose first two elements are the type and the version), the
 * version, the type, then the message is walked without allocating
 * (wire_scan.c: every count and length against the bytes left, at every
 * level, and the depth; the walk finds where the message ends, which
 * st_wire_decode_next reports and st_wire_decode requires to be the end of
 * the buffer). Only then does msgpack-c build objects, and they
 * are converted into the plain C structs of gossip.h checking every field's
 * msgpack type, size and range; nothing of msgpack-c leaves this file.
 *
 * Floats: STATUS loss, accuracy and samples/s accept float32 or float64;
 * a float64 is narrowed to float32. NaN and infinities are legal values (a
 * diverged node reports a NaN loss; `starling peers` shows it) and round
 * trip; a finite float64 beyond the float32 range is a field error, since
 * narrowing it would invent an infinity.
 *
 * Exchanges (XCHG_REQ, XCHG_REPLY): kind is AVERAGE or FETCH, status one
 * of st_xchg_status_t, and the model description a str of at most
 * ST_XCHG_MODEL_MAX - 1 bytes of printable UTF-8 (st__wire_model_ok), since
 * `starling` prints it in its messages; anything else is a field error,
 * and the encoder refuses it (-EINVAL). A REPLY's tensor list is a str of
 * at most ST_XCHG_TENSORS_MAX bytes (beyond: LIMIT), borrowed from the
 * input; its contents are the reader's to check (attach/attach.h parses
 * it as hostile input).
 *
 * Ring segments (RING_SEG): phase 0 or 1, data (float32, or a codec's
 * bytes in a coded round) within ST_WIRE_CHUNK_MAX_BYTES, borrowed from
 * the input like a tensor chunk's; the ring machine (gossip/ring.c) checks
 * the rest, its length included.
 *
 * Ring formation (RING_PROPOSE, RING_CONFIRM): a members array of at most
 * ST_RING_FORM_MAX_MEMBERS ids (bin16 each), decoded into an allocated
 * array like a push-pull's entries; duplicates and the list's meaning are
 * the formation machine's checks (gossip/ring_form.c). */
#include "gossip/gossip.h"

#include <assert.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "gossip/wire_internal.h"

/* HS1 carries the handshake's version as the message's version: one number
 * for both, so they must agree. */
_Static_assert(ST_HS_VERSION == ST_WIRE_VERSION,
               "HS1's version travels as the wire version");

static const char* const drop_names[ST_WIRE_DROP_COUNT] = {
    [ST_WIRE_DROP_MALFORMED] = "wire_malformed",
    [ST_WIRE_DROP_LIMIT] = "wire_limit",
    [ST_WIRE_DROP_VERSION] = "wire_version",
    [ST_WIRE_DROP_UNKNOWN_TYPE] = "wire_unknown_type",
    [ST_WIRE_DROP_FIELD] = "wire_field",
};

const char* st_wire_drop_name(st_wire_drop_t reason) {
  if ((unsigned) reason >= ST_WIRE_DROP_COUNT)
    return "wire_unknown_reason";
  return drop_names[reason];
}

/* Fields after [type, version], per type; 0 for a type we do not know. */
static size_t field_count(uint64_t type) {
  switch (type) {
    case ST_MSG_HS1:
      return 3;
    case ST_MSG_HS2:
      return 2;
    case ST_MSG_HS3:
      return 1;
    case ST_MSG_PING:
      return 2;
    case ST_MSG_PING_REQ:
      return 4;
    case ST_MSG_ACK:
    case ST_MSG_NACK:
      return 1;
    case ST_MSG_ALIVE:
      return 5;
    case ST_MSG_SUSPECT:
      return 3;
    case ST_MSG_DEAD:
      return 4;
    case ST_MSG_STATUS:
      return 11;
    case ST_MSG_PUSH_PULL:
      return 2;
    case ST_MSG_TENSOR_CHUNK:
      return 4;
    case ST_MSG_XCHG_REQ:
      return 6;
    case ST_MSG_XCHG_REPLY:
      return 7;
    case ST_MSG_XCHG_DONE:
      return 1;
    case ST_MSG_XCHG_CODED:
      return 3;
    case ST_MSG_SYNC_REQ:
      return 6;
    case ST_MSG_SYNC_REPLY:
      return 6;
    case ST_MSG_RING_SEG:
      return 6;
    case ST_MSG_RING_PROPOSE:
      return 3;
    case ST_MSG_RING_ACCEPT:
    case ST_MSG_RING_CONFIRM:
      return 3;
    case ST_MSG_RING_CANCEL:
      return 1;
    case ST_MSG_RING_LANE:
      return 3;
    case ST_MSG_COLL_HELLO:
      return 9;
    case ST_MSG_COLL_SEG:
      return 5;
    case ST_MSG_COLL_ABORT:
      return 2;
    case ST_MSG_COLL_FETCH:
      return 3;
    case ST_MSG_ADMIN_REQ:
      return 3;
    case ST_MSG_ADMIN_REPLY:
      return 3;
    default:
      return 0;
  }
}

/* The chunk rules shared by the encoder and the decoder: 0 or the drop
 * reason (LIMIT for data beyond ST_WIRE_CHUNK_MAX_BYTES or a tensor beyond
 * ST__WIRE_MAX_TENSOR_FLOATS, FIELD for the rest). */
static int chunk_check(const st_msg_tensor_chunk_t* c, st_wire_drop_t* why) {
  if (c->data_len > ST_WIRE_CHUNK_MAX_BYTES ||
      c->total > ST__WIRE_MAX_TENSOR_FLOATS) {
    *why = ST_WIRE_DROP_LIMIT;
    return -1;
  }
  /* total <= 2^40 and count <= 2^18, so nothing here overflows. */
  if (c->data_len % 4 != 0 || c->offset > c->total ||
      c->data_len / 4 > c->total - c->offset) {
    *why = ST_WIRE_DROP_FIELD;
    return -1;
  }
  return 0;
}

/* The XCHG_CODED rules shared by the encoder and the decoder: 0 or the
 * drop reason (LIMIT for data beyond ST_WIRE_CHUNK_MAX_BYTES or a total
 * beyond ST_XCHG_CODED_MAX_BYTES; FIELD for empty data or a piece past
 * the total). */
static int coded_check(const st_msg_xchg_coded_t* c, st_wire_drop_t* why) {
  if (c->data_len > ST_WIRE_CHUNK_MAX_BYTES ||
      c->total > ST_XCHG_CODED_MAX_BYTES) {
    *why = ST_WIRE_DROP_LIMIT;
    return -1;
  }
  if (c->data_len == 0 || c->offset > c->total ||
      c->data_len > c->total - c->offset) {
    *why = ST_WIRE_DROP_FIELD;
    return -1;
  }
  return 0;
}

/* SYNC_REQ's rules, shared by the encoder and the decoder: a kind this
 * build knows, n_params within ST__WIRE_MAX_TENSOR_FLOATS (LIMIT), and for
 * RANGE 1 .. ST_SYNC_MAX_CHUNKS chunks. Whether the range lies within the
 * state is the donor's check (it knows the length). */
static int sync_req_check(const st_msg_sync_req_t* q, st_wire_drop_t* why) {
  if (q->n_params > ST__WIRE_MAX_TENSOR_FLOATS ||
      q->count > ST_SYNC_MAX_CHUNKS) {
    *why = ST_WIRE_DROP_LIMIT;
    return -1;
  }
  *why = ST_WIRE_DROP_FIELD;
  if (q->kind == ST_SYNC_MANIFEST)
    return q->first == 0 && q->count == 0 ? 0 : -1;
  return q->kind == ST_SYNC_RANGE && q->count > 0 &&
                 q->first < ST_SYNC_MAX_CHUNKS
             ? 0
             : -1;
}

/* SYNC_REPLY's: a known status; hashes whole ST_SYNC_HASH_BYTES within
 * ST_WIRE_CHUNK_MAX_BYTES (LIMIT beyond). That their count matches
 * n_params is the joiner's check. */
static int sync_reply_check(const st_msg_sync_reply_t* r, st_wire_drop_t* why) {
  if (r->hashes_len > ST_WIRE_CHUNK_MAX_BYTES ||
      r->n_params > ST__WIRE_MAX_TENSOR_FLOATS) {
    *why = ST_WIRE_DROP_LIMIT;
    return -1;
  }
  *why = ST_WIRE_DROP_FIELD;
  return r->status <= ST_SYNC_STATUS_GONE &&
                 r->hashes_len % ST_SYNC_HASH_BYTES == 0
             ? 0
             : -1;
}

/* A lane's numbers (gossip.h, "Ring all-reduce": lanes). */
static bool ring_lane_ok(const st_msg_ring_lane_t* l) {
  return l->lanes >= 1 && l->lanes <= ST_RING_MAX_LANES && l->lane < l->lanes;
}

/* The ring segment rules shared by the encoder and the decoder (gossip.h,
 * "Ring all-reduce"): 0 or the drop reason (LIMIT for data beyond
 * ST_WIRE_CHUNK_MAX_BYTES; FIELD for a phase other than 0 or 1, or a
 * segment reaching past ST__WIRE_MAX_TENSOR_FLOATS). Data is float32 or a
 * codec's bytes (a coded round): whether it is the segment a member
 * expects, of the right length, is the machine's check. */
static int ring_seg_check(const st_msg_ring_seg_t* g, st_wire_drop_t* why) {
  if (g->data_len > ST_WIRE_CHUNK_MAX_BYTES) {
    *why = ST_WIRE_DROP_LIMIT;
    return -1;
  }
  /* count <= 2^18, so the subtraction cannot wrap. */
  if (g->phase > ST_RING_ALL_GATHER ||
      g->offset > ST__WIRE_MAX_TENSOR_FLOATS - g->data_len / 4) {
    *why = ST_WIRE_DROP_FIELD;
    return -1;
  }
  return 0;
}

/* The collective messages' rules shared by the encoder and the decoder
 * (gossip.h, "User collectives"): 0 or the drop reason (LIMIT for data or
 * a reason beyond its bound; FIELD for an unknown kind, operation, dtype
 * or phase, a group out of range, a root outside it, data that is not
 * whole elements or reaches past count or ST_COLL_MAX_COUNT). */
static size_t coll_elem_bytes(uint8_t dtype) {
  return st_coll_elem_bytes((st_coll_dtype_t) dtype);
}

static int coll_hello_check(const st_msg_coll_hello_t* h, st_wire_drop_t* why) {
  if (h->data_len > ST_WIRE_CHUNK_MAX_BYTES) {
    *why = ST_WIRE_DROP_LIMIT;
    return -1;
  }
  size_t e = coll_elem_bytes(h->dtype);
  if (e == 0 || h->kind >= ST_COLL_KIND_COUNT || h->rop >= ST_COLL_ROP_COUNT ||
      h->n == 0 || h->n > ST_COLL_MAX_MEMBERS || h->root >= h->n ||
      h->count > ST_COLL_MAX_COUNT || h->data_len % e != 0 ||
      h->data_len / e > h->count) {
    *why = ST_WIRE_DROP_FIELD;
    return -1;
  }
  return 0;
}

static int coll_seg_check(const st_msg_coll_seg_t* g, st_wire_drop_t* why) {
  if (g->data_len > ST_WIRE_CHUNK_MAX_BYTES) {
    *why = ST_WIRE_DROP_LIMIT;
    return -1;
  }
  /* The element size is the operation's: only whole float32 here (the
   * machine checks float64), and nothing past the largest vector. */
  if (g->phase >= ST_COLL_PHASE_COUNT || g->data_len % 4 != 0 ||
      g->offset > ST_COLL_MAX_COUNT - g->data_len / 4) {
    *why = ST_WIRE_DROP_FIELD;
    return -1;
  }
  return 0;
}

static int coll_abort_check(const st_msg_coll_abort_t* a, st_wire_drop_t* why) {
  if (a->reason_len > ST_COLL_REASON_MAX) {
    *why = ST_WIRE_DROP_LIMIT;
    return -1;
  }
  return 0;
}

/* A fetch's code is known; an ASK names 1 to ST_COLL_FETCH_NAME_MAX
 * bytes, a refusal says why in at most ST_COLL_REASON_MAX. */
static int coll_fetch_check(const st_msg_coll_fetch_t* f, st_wire_drop_t* why) {
  uint32_t max = f->code == ST_COLL_FETCH_ASK ? ST_COLL_FETCH_NAME_MAX
                                              : ST_COLL_REASON_MAX;
  if (f->text_len > max) {
    *why = ST_WIRE_DROP_LIMIT;
    return -1;
  }
  if (f->code >= ST_COLL_FETCH_CODE_COUNT ||
      (f->code == ST_COLL_FETCH_ASK && f->text_len == 0)) {
    *why = ST_WIRE_DROP_FIELD;
    return -1;
  }
  return 0;
}

/* A cluster request names a known op, with the subject its op takes (a
 * key for KEY_INSTALL, a member id for FORCE_LEAVE, none otherwise). */
static int admin_req_check(const st_msg_admin_req_t* q) {
  if (q->op < ST_ADMIN_KEY_INSTALL || q->op > ST_ADMIN_FORCE_LEAVE)
    return -1;
  uint8_t want = q->op == ST_ADMIN_KEY_INSTALL   ? 32
                 : q->op == ST_ADMIN_FORCE_LEAVE ? ST_NODE_ID_BYTES
                                                 : 0;
  if (q->op == ST_ADMIN_FORCE_LEAVE && q->key_id != 0)
    return -1;
  return q->subject_len == want ? 0 : -1;
}

/* A reply's result is known, its keys a keyring (as STATUS's), its
 * reason bounded. */
static int admin_reply_check(const st_msg_admin_reply_t* r,
                             st_wire_drop_t* why) {
  if (r->reason_len > ST_ADMIN_REASON_MAX) {
    *why = ST_WIRE_DROP_LIMIT;
    return -1;
  }
  if (r->result > ST_ADMIN_REFUSED || r->n_keys > 2 ||
      (r->n_keys == 2 && r->keys[0] == r->keys[1])) {
    *why = ST_WIRE_DROP_FIELD;
    return -1;
  }
  return 0;
}

/* ==== Encoder ===============================================================
 */

typedef struct {
  uint8_t* buf;
  size_t cap;
  size_t len;
  int overflow;
} bounded_t;

/* msgpack_packer's write callback: appends to the caller's buffer, or
 * records that it did not fit. */
static int bounded_write(void* data, const char* p, size_t n) {
  bounded_t* b = data;
  if (b->overflow || n > b->cap - b->len) {
    b->overflow = 1;
    return -1;
  }
  if (n > 0)
    memcpy(b->buf + b->len, p, n);
  b->len += n;
  return 0;
}

/* Each pack call returns 0 or the callback's -1; the overflow flag says
 * which, so the callers below just or the results together. */
static int pack_bin(msgpack_packer* pk, const void* p, size_t n) {
  return msgpack_pack_bin(pk, n) | msgpack_pack_bin_body(pk, p, n);
}

static int pack_addr(msgpack_packer* pk, const st_wire_addr_t* a) {
  return msgpack_pack_array(pk, 2) | pack_bin(pk, a->ip, a->ip_len) |
         msgpack_pack_uint16(pk, a->port);
}

static int addr_ok(const st_wire_addr_t* a) {
  return a->ip_len == 4 || a->ip_len == 16;
}

static int pack_bool(msgpack_packer* pk, bool v) {
  return v ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
}

/* The encoder's push-pull rules: the entry count, the entries pointer, and
 * every entry's state and addr. 0 or -1. */
static int push_pull_check(const st_msg_push_pull_t* m) {
  if (m->n_entries > ST_WIRE_PUSH_PULL_MAX_ENTRIES)
    return -1;
  if (m->n_entries > 0 && m->entries == NULL)
    return -1;
  for (uint32_t i = 0; i < m->n_entries; i++) {
    const st_push_pull_entry_t* e = &m->entries[i];
    if (e->state > ST_MEMBER_LEFT || !addr_ok(&e->addr))
      return -1;
  }
  return 0;
}

static int pack_push_pull(msgpack_packer* pk, const st_msg_push_pull_t* m) {
  int r = pack_bool(pk, m->is_reply) | msgpack_pack_array(pk, m->n_entries);
  for (uint32_t i = 0; i < m->n_entries && r == 0; i++) {
    const st_push_pull_entry_t* e = &m->entries[i];
    r |= msgpack_pack_array(pk, 6) | pack_bin(pk, e->node.b, sizeof e->node.b) |
         msgpack_pack_uint64(pk, e->incarnation) |
         msgpack_pack_uint8(pk, e->state) | pack_addr(pk, &e->addr) |
         pack_bin(pk, e->public_key, sizeof e->public_key) |
         pack_bin(pk, e->signature, sizeof e->signature);
  }
  return r;
}

/* A ring formation's members list: within ST_RING_FORM_MAX_MEMBERS and
 * there when it has any. 0 or -1. */
static int ring_members_check(uint32_t n, const st_node_id_t* members) {
  if (n > ST_RING_FORM_MAX_MEMBERS || (n > 0 && members == NULL))
    return -1;
  return 0;
}

static int pack_ring_members(msgpack_packer* pk, uint32_t n,
                             const st_node_id_t* members) {
  int r = msgpack_pack_array(pk, n);
  for (uint32_t i = 0; i < n; i++)
    r |= pack_bin(pk, members[i].b, sizeof members[i].b);
  return r;
}

static int kind_ok(uint8_t kind) {
  return kind == ST_XCHG_AVERAGE || kind == ST_XCHG_FETCH;
}

/* An exchange's model description: NUL-terminated within
 * ST_XCHG_MODEL_MAX, printable UTF-8 (st__wire_model_ok). */
static int model_ok(const char* model) {
  size_t n = strnlen(model, ST_XCHG_MODEL_MAX);
  return n < ST_XCHG_MODEL_MAX && st__wire_model_ok(model, n);
}

/* The fields that XCHG_REQ and XCHG_REPLY share after their first. */
static int pack_xchg_info(msgpack_packer* pk, const uint8_t fingerprint[16],
                          const char* model, uint64_t n_params, uint64_t step) {
  size_t n = strlen(model);
  return pack_bin(pk, fingerprint, 16) | msgpack_pack_str(pk, n) |
         msgpack_pack_str_body(pk, model, n) |
         msgpack_pack_uint64(pk, n_params) | msgpack_pack_uint64(pk, step);
}

/* encode_check's part for a pairwise exchange's messages. */
static int encode_check_exchange(const st_msg_t* msg) {
  st_wire_drop_t why;
  const st_msg_xchg_reply_t* r = &msg->u.xchg_reply;
  switch (msg->type) {
    case ST_MSG_TENSOR_CHUNK:
      return chunk_check(&msg->u.chunk, &why) != 0 ||
                     (msg->u.chunk.data == NULL && msg->u.chunk.data_len > 0)
                 ? -EINVAL
                 : 0;
    case ST_MSG_XCHG_REQ:
      return kind_ok(msg->u.xchg_req.kind) && model_ok(msg->u.xchg_req.model)
                 ? 0
                 : -EINVAL;
    case ST_MSG_XCHG_CODED:
      return coded_check(&msg->u.xchg_coded, &why) != 0 ||
                     msg->u.xchg_coded.data == NULL
                 ? -EINVAL
                 : 0;
    case ST_MSG_SYNC_REQ:
      return sync_req_check(&msg->u.sync_req, &why) != 0 ? -EINVAL : 0;
    case ST_MSG_SYNC_REPLY:
      return sync_reply_check(&msg->u.sync_reply, &why) != 0 ||
                     (msg->u.sync_reply.hashes == NULL &&
                      msg->u.sync_reply.hashes_len > 0)
                 ? -EINVAL
                 : 0;
    case ST_MSG_XCHG_REPLY:
      return r->status > ST_XCHG_STATUS_NOT_READY || !model_ok(r->model) ||
                     r->tensors_len > ST_XCHG_TENSORS_MAX ||
                     (r->tensors == NULL && r->tensors_len > 0)
                 ? -EINVAL
                 : 0;
    default:
      return 0;
  }
}

/* The encoder's checks of a message before any byte is packed: the fields
 * a decoder would refuse. 0 or -EINVAL. */
/* encode_check for the user collectives' messages. */
static int encode_check_coll(const st_msg_t* msg) {
  st_wire_drop_t why;
  switch (msg->type) {
    case ST_MSG_COLL_HELLO:
      if (coll_hello_check(&msg->u.coll_hello, &why) != 0 ||
          (msg->u.coll_hello.data == NULL && msg->u.coll_hello.data_len > 0))
        return -EINVAL;
      return 0;
    case ST_MSG_COLL_SEG:
      if (coll_seg_check(&msg->u.coll_seg, &why) != 0 ||
          (msg->u.coll_seg.data == NULL && msg->u.coll_seg.data_len > 0))
        return -EINVAL;
      return 0;
    case ST_MSG_COLL_ABORT:
      if (coll_abort_check(&msg->u.coll_abort, &why) != 0 ||
          (msg->u.coll_abort.reason == NULL &&
           msg->u.coll_abort.reason_len > 0))
        return -EINVAL;
      return 0;
    case ST_MSG_COLL_FETCH:
      if (coll_fetch_check(&msg->u.coll_fetch, &why) != 0 ||
          (msg->u.coll_fetch.text == NULL && msg->u.coll_fetch.text_len > 0))
        return -EINVAL;
      return 0;
    default:
      return 0;
  }
}

static int encode_check(const st_msg_t* msg) {
  st_wire_drop_t why;
  switch (msg->type) {
    case ST_MSG_HS1:
      if (msg->u.hs1.version != ST_WIRE_VERSION)
        return -EINVAL;
      break;
    case ST_MSG_PING_REQ:
      if (!addr_ok(&msg->u.ping_req.target_addr))
        return -EINVAL;
      break;
    case ST_MSG_ALIVE:
      if (!addr_ok(&msg->u.alive.addr))
        return -EINVAL;
      break;
    case ST_MSG_PUSH_PULL:
      if (push_pull_check(&msg->u.push_pull) != 0)
        return -EINVAL;
      break;
    case ST_MSG_TENSOR_CHUNK:
    case ST_MSG_XCHG_REQ:
    case ST_MSG_XCHG_REPLY:
    case ST_MSG_XCHG_CODED:
    case ST_MSG_SYNC_REQ:
    case ST_MSG_SYNC_REPLY:
      return encode_check_exchange(msg);
    case ST_MSG_RING_SEG:
      if (ring_seg_check(&msg->u.ring_seg, &why) != 0)
        return -EINVAL;
      if (msg->u.ring_seg.data == NULL && msg->u.ring_seg.data_len > 0)
        return -EINVAL;
      break;
    case ST_MSG_RING_PROPOSE:
      if (ring_members_check(msg->u.ring_propose.n_members,
                             msg->u.ring_propose.members) != 0)
        return -EINVAL;
      break;
    case ST_MSG_RING_CONFIRM:
      if (ring_members_check(msg->u.ring_confirm.n_members,
                             msg->u.ring_confirm.members) != 0)
        return -EINVAL;
      break;
    case ST_MSG_RING_LANE:
      if (!ring_lane_ok(&msg->u.ring_lane))
        return -EINVAL;
      break;
    case ST_MSG_COLL_HELLO:
    case ST_MSG_COLL_SEG:
    case ST_MSG_COLL_ABORT:
    case ST_MSG_COLL_FETCH:
      return encode_check_coll(msg);
    case ST_MSG_ADMIN_REQ:
      if (admin_req_check(&msg->u.admin_req) != 0)
        return -EINVAL;
      break;
    case ST_MSG_ADMIN_REPLY:
      if (admin_reply_check(&msg->u.admin_reply, &why) != 0 ||
          (msg->u.admin_reply.reason == NULL &&
           msg->u.admin_reply.reason_len > 0))
        return -EINVAL;
      break;
    default:
      break;
  }
  return 0;
}

/* The fields of the session handshake's three messages. */
static int pack_session(msgpack_packer* pk, const st_msg_t* msg) {
  int r = 0;
  switch (msg->type) {
    case ST_MSG_HS1: {
      const st_hs_msg1_t* m = &msg->u.hs1;
      r |= msgpack_pack_uint8(pk, m->key_id) |
           pack_bin(pk, m->ephemeral, sizeof m->ephemeral) |
           pack_bin(pk, m->mac, sizeof m->mac);
      break;
    }
    case ST_MSG_HS2: {
      const st_hs_msg2_t* m = &msg->u.hs2;
      r |= pack_bin(pk, m->ephemeral, sizeof m->ephemeral) |
           pack_bin(pk, m->sealed, sizeof m->sealed);
      break;
    }
    case ST_MSG_HS3:
      r |= pack_bin(pk, msg->u.hs3.sealed, sizeof msg->u.hs3.sealed);
      break;
    default:
      break;
  }
  return r;
}

/* The fields of the membership messages (SWIM, push-pull, status). */
static int pack_membership(msgpack_packer* pk, const st_msg_t* msg) {
  int r = 0;
  switch (msg->type) {
    case ST_MSG_PING: {
      const st_msg_ping_t* m = &msg->u.ping;
      r |= msgpack_pack_uint32(pk, m->seq) |
           pack_bin(pk, m->target.b, sizeof m->target.b);
      break;
    }
    case ST_MSG_PING_REQ: {
      const st_msg_ping_req_t* m = &msg->u.ping_req;
      r |= msgpack_pack_uint32(pk, m->seq) |
           pack_bin(pk, m->target.b, sizeof m->target.b) |
           pack_addr(pk, &m->target_addr) | pack_bool(pk, m->want_nack);
      break;
    }
    case ST_MSG_ACK:
    case ST_MSG_NACK:
      /* ack and nack share one layout (and one union member type). */
      r |= msgpack_pack_uint32(pk, msg->u.ack.seq);
      break;
    case ST_MSG_ALIVE: {
      const st_msg_alive_t* m = &msg->u.alive;
      r |= pack_bin(pk, m->node.b, sizeof m->node.b) |
           msgpack_pack_uint64(pk, m->incarnation) | pack_addr(pk, &m->addr) |
           pack_bin(pk, m->public_key, sizeof m->public_key) |
           pack_bin(pk, m->signature, sizeof m->signature);
      break;
    }
    case ST_MSG_SUSPECT:
    case ST_MSG_DEAD: {
      const st_msg_suspect_t* m = &msg->u.suspect;
      r |= pack_bin(pk, m->node.b, sizeof m->node.b) |
           msgpack_pack_uint64(pk, m->incarnation) |
           pack_bin(pk, m->from.b, sizeof m->from.b);
      if (msg->type == ST_MSG_DEAD)
        r |= pack_bin(pk, m->signature, sizeof m->signature);
      break;
    }
    case ST_MSG_STATUS: {
      const st_msg_status_t* m = &msg->u.status;
      r |= pack_bin(pk, m->node.b, sizeof m->node.b) |
           msgpack_pack_uint64(pk, m->seq) | msgpack_pack_uint64(pk, m->step) |
           msgpack_pack_float(pk, m->loss) |
           msgpack_pack_float(pk, m->accuracy) |
           msgpack_pack_float(pk, m->samples_per_sec) |
           pack_bin(pk, m->fingerprint, sizeof m->fingerprint) |
           pack_bool(pk, m->ring_capable) | pack_bool(pk, m->synced) |
           pack_bin(pk, m->keys, m->n_keys <= 2 ? m->n_keys : 2) |
           pack_bin(pk, m->signature, sizeof m->signature);
      break;
    }
    case ST_MSG_PUSH_PULL:
      r |= pack_push_pull(pk, &msg->u.push_pull);
      break;
    default:
      break;
  }
  return r;
}

/* The fields of a pairwise exchange and its state transfer. */
static int pack_exchange(msgpack_packer* pk, const st_msg_t* msg) {
  int r = 0;
  switch (msg->type) {
    case ST_MSG_TENSOR_CHUNK: {
      const st_msg_tensor_chunk_t* m = &msg->u.chunk;
      r |= msgpack_pack_uint64(pk, m->transfer_id) |
           msgpack_pack_uint64(pk, m->offset) |
           msgpack_pack_uint64(pk, m->total) |
           pack_bin(pk, m->data, m->data_len);
      break;
    }
    case ST_MSG_XCHG_REQ: {
      const st_msg_xchg_req_t* m = &msg->u.xchg_req;
      r |= msgpack_pack_uint8(pk, m->kind) |
           pack_xchg_info(pk, m->fingerprint, m->model, m->n_params, m->step) |
           pack_bin(pk, m->anchor, sizeof m->anchor);
      break;
    }
    case ST_MSG_XCHG_REPLY: {
      const st_msg_xchg_reply_t* m = &msg->u.xchg_reply;
      r |= msgpack_pack_uint8(pk, m->status) |
           pack_xchg_info(pk, m->fingerprint, m->model, m->n_params, m->step) |
           pack_bin(pk, m->anchor, sizeof m->anchor) |
           msgpack_pack_str(pk, m->tensors_len) |
           msgpack_pack_str_body(pk, m->tensors, m->tensors_len);
      break;
    }
    case ST_MSG_XCHG_DONE:
      r |= pack_bin(pk, msg->u.xchg_done.hash, sizeof msg->u.xchg_done.hash);
      break;
    case ST_MSG_XCHG_CODED: {
      const st_msg_xchg_coded_t* m = &msg->u.xchg_coded;
      r |= msgpack_pack_uint64(pk, m->offset) |
           msgpack_pack_uint64(pk, m->total) |
           pack_bin(pk, m->data, m->data_len);
      break;
    }
    case ST_MSG_SYNC_REQ: {
      const st_msg_sync_req_t* m = &msg->u.sync_req;
      r |= msgpack_pack_uint8(pk, m->kind) |
           pack_bin(pk, m->fingerprint, sizeof m->fingerprint) |
           msgpack_pack_uint64(pk, m->n_params) |
           pack_bin(pk, m->anchor, sizeof m->anchor) |
           msgpack_pack_uint64(pk, m->first) |
           msgpack_pack_uint64(pk, m->count);
      break;
    }
    case ST_MSG_SYNC_REPLY: {
      const st_msg_sync_reply_t* m = &msg->u.sync_reply;
      r |= msgpack_pack_uint8(pk, m->status) |
           pack_bin(pk, m->anchor, sizeof m->anchor) |
           msgpack_pack_uint64(pk, m->round) |
           msgpack_pack_uint64(pk, m->step) |
           msgpack_pack_uint64(pk, m->n_params) |
           pack_bin(pk, m->hashes, m->hashes_len);
      break;
    }
    default:
      break;
  }
  return r;
}

/* The fields of a ring round: formation, lanes and segments. */
static int pack_ring(msgpack_packer* pk, const st_msg_t* msg) {
  int r = 0;
  switch (msg->type) {
    case ST_MSG_RING_SEG: {
      const st_msg_ring_seg_t* m = &msg->u.ring_seg;
      r |= msgpack_pack_uint64(pk, m->round_id) |
           msgpack_pack_uint8(pk, m->phase) | msgpack_pack_uint32(pk, m->step) |
           msgpack_pack_uint32(pk, m->chunk) |
           msgpack_pack_uint64(pk, m->offset) |
           pack_bin(pk, m->data, m->data_len);
      break;
    }
    case ST_MSG_RING_PROPOSE: {
      const st_msg_ring_propose_t* m = &msg->u.ring_propose;
      r |= msgpack_pack_uint64(pk, m->round_id) |
           pack_bin(pk, m->proposer.b, sizeof m->proposer.b) |
           pack_ring_members(pk, m->n_members, m->members);
      break;
    }
    case ST_MSG_RING_ACCEPT:
      r |= msgpack_pack_uint64(pk, msg->u.ring_accept.round_id) |
           pack_bool(pk, msg->u.ring_accept.accept) |
           pack_bin(pk, msg->u.ring_accept.tag, ST_RING_TAG_BYTES);
      break;
    case ST_MSG_RING_CONFIRM: {
      const st_msg_ring_confirm_t* m = &msg->u.ring_confirm;
      r |= msgpack_pack_uint64(pk, m->round_id) |
           pack_ring_members(pk, m->n_members, m->members) |
           pack_bin(pk, m->tag, ST_RING_TAG_BYTES);
      break;
    }
    case ST_MSG_RING_CANCEL:
      r |= msgpack_pack_uint64(pk, msg->u.ring_cancel.round_id);
      break;
    case ST_MSG_RING_LANE:
      r |= msgpack_pack_uint64(pk, msg->u.ring_lane.round_id) |
           msgpack_pack_uint32(pk, msg->u.ring_lane.lane) |
           msgpack_pack_uint32(pk, msg->u.ring_lane.lanes);
      break;
    default:
      break;
  }
  return r;
}

/* The cluster requests (gossip.h, "Cluster requests"). */
static int pack_admin(msgpack_packer* pk, const st_msg_t* msg) {
  if (msg->type == ST_MSG_ADMIN_REQ) {
    const st_msg_admin_req_t* q = &msg->u.admin_req;
    return msgpack_pack_uint8(pk, q->op) | msgpack_pack_uint8(pk, q->key_id) |
           pack_bin(pk, q->subject,
                    q->subject_len <= sizeof q->subject ? q->subject_len : 0);
  }
  const st_msg_admin_reply_t* r = &msg->u.admin_reply;
  return msgpack_pack_uint8(pk, r->result) | pack_bin(pk, r->keys, r->n_keys) |
         msgpack_pack_str(pk, r->reason_len) |
         msgpack_pack_str_body(pk, r->reason, r->reason_len);
}

/* The collective messages (gossip.h, "User collectives"). */
static int pack_coll(msgpack_packer* pk, const st_msg_t* msg) {
  int r = 0;
  switch (msg->type) {
    case ST_MSG_COLL_HELLO: {
      const st_msg_coll_hello_t* m = &msg->u.coll_hello;
      r |= msgpack_pack_uint64(pk, m->op_id) | msgpack_pack_uint8(pk, m->kind) |
           msgpack_pack_uint8(pk, m->rop) | msgpack_pack_uint8(pk, m->dtype) |
           msgpack_pack_uint32(pk, m->root) |
           msgpack_pack_uint64(pk, m->count) | msgpack_pack_uint32(pk, m->n) |
           msgpack_pack_uint64(pk, m->members_hash) |
           pack_bin(pk, m->data, m->data_len);
      break;
    }
    case ST_MSG_COLL_SEG: {
      const st_msg_coll_seg_t* m = &msg->u.coll_seg;
      r |= msgpack_pack_uint64(pk, m->op_id) |
           msgpack_pack_uint8(pk, m->phase) | msgpack_pack_uint32(pk, m->step) |
           msgpack_pack_uint64(pk, m->offset) |
           pack_bin(pk, m->data, m->data_len);
      break;
    }
    case ST_MSG_COLL_ABORT: {
      const st_msg_coll_abort_t* m = &msg->u.coll_abort;
      r |= msgpack_pack_uint64(pk, m->op_id) |
           msgpack_pack_str(pk, m->reason_len) |
           msgpack_pack_str_body(pk, m->reason, m->reason_len);
      break;
    }
    case ST_MSG_COLL_FETCH: {
      const st_msg_coll_fetch_t* m = &msg->u.coll_fetch;
      r |= msgpack_pack_uint64(pk, m->op_id) | msgpack_pack_uint8(pk, m->code) |
           msgpack_pack_str(pk, m->text_len) |
           msgpack_pack_str_body(pk, m->text, m->text_len);
      break;
    }
    default:
      break;
  }
  return r;
}

/* Packs the fields that follow a message's type and version. 0 or -1
 * (the packer's overflow flag says which). */
static int pack_fields(msgpack_packer* pk, const st_msg_t* msg) {
  switch (msg->type) {
    case ST_MSG_HS1:
    case ST_MSG_HS2:
    case ST_MSG_HS3:
      return pack_session(pk, msg);
    case ST_MSG_PING:
    case ST_MSG_PING_REQ:
    case ST_MSG_ACK:
    case ST_MSG_NACK:
    case ST_MSG_ALIVE:
    case ST_MSG_SUSPECT:
    case ST_MSG_DEAD:
    case ST_MSG_STATUS:
    case ST_MSG_PUSH_PULL:
      return pack_membership(pk, msg);
    case ST_MSG_TENSOR_CHUNK:
    case ST_MSG_XCHG_REQ:
    case ST_MSG_XCHG_REPLY:
    case ST_MSG_XCHG_DONE:
    case ST_MSG_XCHG_CODED:
    case ST_MSG_SYNC_REQ:
    case ST_MSG_SYNC_REPLY:
      return pack_exchange(pk, msg);
    case ST_MSG_RING_SEG:
    case ST_MSG_RING_PROPOSE:
    case ST_MSG_RING_ACCEPT:
    case ST_MSG_RING_CONFIRM:
    case ST_MSG_RING_CANCEL:
    case ST_MSG_RING_LANE:
      return pack_ring(pk, msg);
    case ST_MSG_COLL_HELLO:
    case ST_MSG_COLL_SEG:
    case ST_MSG_COLL_ABORT:
    case ST_MSG_COLL_FETCH:
      return pack_coll(pk, msg);
    case ST_MSG_ADMIN_REQ:
    case ST_MSG_ADMIN_REPLY:
      return pack_admin(pk, msg);
  }
  return 0;
}

int st_wire_encode(const st_msg_t* msg, uint8_t* buf, size_t cap, size_t* len) {
  if (msg == NULL || len == NULL || (buf == NULL && cap > 0))
    return -EINVAL;
  size_t nfields = field_count((uint64_t) msg->type);
  if (nfields == 0)
    return -EINVAL;
  if (encode_check(msg) != 0)
    return -EINVAL;

  bounded_t out = {buf, cap, 0, 0};
  msgpack_packer pk;
  msgpack_packer_init(&pk, &out, bounded_write);
  int r = msgpack_pack_array(&pk, 2 + nfields) |
          msgpack_pack_uint8(&pk, (uint8_t) msg->type) |
          msgpack_pack_uint8(&pk, ST_WIRE_VERSION);
  r |= pack_fields(&pk, msg);
  if (r != 0 || out.overflow)
    return -EMSGSIZE;
  *len = out.len;
  return 0;
}

/* ==== Decoder: fields =======================================================
 */

/* Each returns 0, or -1 for a field of the wrong msgpack type, size or
 * range (ST_WIRE_DROP_FIELD). */

static int get_uint(const msgpack_object* o, uint64_t max, uint64_t* v) {
  if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
    return -1;
  if (o->via.u64 > max)
    return -1;
  *v = o->via.u64;
  return 0;
}

static int get_u64(const msgpack_object* o, uint64_t* v) {
  return get_uint(o, UINT64_MAX, v);
}

static int get_u32(const msgpack_object* o, uint32_t* v) {
  uint64_t x;
  if (get_uint(o, UINT32_MAX, &x) != 0)
    return -1;
  *v = (uint32_t) x;
  return 0;
}

static int get_u16(const msgpack_object* o, uint16_t* v) {
  uint64_t x;
  if (get_uint(o, UINT16_MAX, &x) != 0)
    return -1;
  *v = (uint16_t) x;
  return 0;
}

static int get_u8(const msgpack_object* o, uint8_t* v) {
  uint64_t x;
  if (get_uint(o, UINT8_MAX, &x) != 0)
    return -1;
  *v = (uint8_t) x;
  return 0;
}

static int get_bool(const msgpack_object* o, bool* v) {
  if (o->type != MSGPACK_OBJECT_BOOLEAN)
    return -1;
  *v = o->via.boolean;
  return 0;
}

static int get_f32(const msgpack_object* o, float* v) {
  if (o->type != MSGPACK_OBJECT_FLOAT32 && o->type != MSGPACK_OBJECT_FLOAT64)
    return -1;
  double d = o->via.f64;
  if (isfinite(d) && fabs(d) > FLT_MAX)
    return -1;
  *v = (float) d;
  return 0;
}

/* A bin of exactly n bytes. */
static int get_bin(const msgpack_object* o, void* dst, size_t n) {
  if (o->type != MSGPACK_OBJECT_BIN || o->via.bin.size != n)
    return -1;
  memcpy(dst, o->via.bin.ptr, n);
  return 0;
}

/* A STATUS's keys: up to 2 ids, the second not the first. */
static int get_keys(const msgpack_object* o, st_msg_status_t* m) {
  if (o->type != MSGPACK_OBJECT_BIN || o->via.bin.size > 2)
    return -1;
  m->n_keys = (uint8_t) o->via.bin.size;
  memcpy(m->keys, o->via.bin.ptr, m->n_keys);
  return m->n_keys == 2 && m->keys[0] == m->keys[1] ? -1 : 0;
}

static int get_id(const msgpack_object* o, st_node_id_t* id) {
  return get_bin(o, id->b, sizeof id->b);
}

static int get_addr(const msgpack_object* o, st_wire_addr_t* a) {
  if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 2)
    return -1;
  const msgpack_object* f = o->via.array.ptr;
  if (f[0].type != MSGPACK_OBJECT_BIN)
    return -1;
  uint32_t n = f[0].via.bin.size;
  if (n != 4 && n != 16)
    return -1;
  memset(a, 0, sizeof *a);
  a->ip_len = (uint8_t) n;
  memcpy(a->ip, f[0].via.bin.ptr, n);
  return get_u16(&f[1], &a->port);
}

/* An exchange's model description: a str of at most ST_XCHG_MODEL_MAX - 1
 * bytes of printable UTF-8, copied NUL-terminated into dst. */
static int get_model(const msgpack_object* o, char dst[ST_XCHG_MODEL_MAX]) {
  if (o->type != MSGPACK_OBJECT_STR || o->via.str.size >= ST_XCHG_MODEL_MAX)
    return -1;
  if (!st__wire_model_ok(o->via.str.ptr, o->via.str.size))
    return -1;
  /* msgpack-c gives an empty string a NULL pointer. */
  if (o->via.str.size > 0)
    memcpy(dst, o->via.str.ptr, o->via.str.size);
  dst[o->via.str.size] = '\0';
  return 0;
}

/* [fingerprint, model, n_params, step], shared by XCHG_REQ and REPLY. */
static int get_xchg_info(const msgpack_object* f, uint8_t fingerprint[16],
                         char model[ST_XCHG_MODEL_MAX], uint64_t* n_params,
                         uint64_t* step) {
  return get_bin(&f[0], fingerprint, 16) | get_model(&f[1], model) |
         get_u64(&f[2], n_params) | get_u64(&f[3], step);
}

/* [is_reply, [entry...]]. The walk bounded the count by
 * ST_WIRE_PUSH_PULL_MAX_ENTRIES and by the bytes received (129 bytes an
 * entry at least), so the allocation below is at most 6900 entries and
 * never more than the input's size times 144 / 129. 0, -1 (a field error, or
 * LIMIT in *why) or -ENOMEM; on failure nothing is left allocated. */
static int get_push_pull(const msgpack_object* f, st_msg_push_pull_t* m,
                         st_wire_drop_t* why) {
  if (get_bool(&f[0], &m->is_reply) != 0 || f[1].type != MSGPACK_OBJECT_ARRAY)
    return -1;
  uint32_t n = f[1].via.array.size;
  if (n > ST_WIRE_PUSH_PULL_MAX_ENTRIES) {
    *why = ST_WIRE_DROP_LIMIT; /* the walk refuses it first; defensive */
    return -1;
  }
  m->n_entries = 0;
  m->entries = NULL;
  if (n == 0)
    return 0;
  st_push_pull_entry_t* es = calloc(n, sizeof *es);
  if (es == NULL)
    return -ENOMEM;
  const msgpack_object* o = f[1].via.array.ptr;
  for (uint32_t i = 0; i < n; i++) {
    st_push_pull_entry_t* e = &es[i];
    if (o[i].type != MSGPACK_OBJECT_ARRAY || o[i].via.array.size != 6)
      goto bad;
    const msgpack_object* g = o[i].via.array.ptr;
    if (get_id(&g[0], &e->node) | get_u64(&g[1], &e->incarnation) |
        get_u8(&g[2], &e->state) | get_addr(&g[3], &e->addr) |
        get_bin(&g[4], e->public_key, sizeof e->public_key) |
        get_bin(&g[5], e->signature, sizeof e->signature))
      goto bad;
    if (e->state > ST_MEMBER_LEFT)
      goto bad;
  }
  m->n_entries = n;
  m->entries = es;
  return 0;
bad:
  free(es);
  return -1;
}

/* A ring formation's members array. The walk bounded its count by
 * ST_RING_FORM_MAX_MEMBERS (and by the bytes received, 18 an id at least),
 * so the allocation is at most 1 KiB. 0, -1 (a field error, or LIMIT in
 * *why) or -ENOMEM; on failure nothing is left allocated. */
static int get_ring_members(const msgpack_object* o, uint32_t* n_out,
                            st_node_id_t** out, st_wire_drop_t* why) {
  if (o->type != MSGPACK_OBJECT_ARRAY)
    return -1;
  uint32_t n = o->via.array.size;
  if (n > ST_RING_FORM_MAX_MEMBERS) {
    *why = ST_WIRE_DROP_LIMIT; /* the walk refuses it first; defensive */
    return -1;
  }
  *n_out = 0;
  *out = NULL;
  if (n == 0)
    return 0;
  st_node_id_t* ids = calloc(n, sizeof *ids);
  if (ids == NULL)
    return -ENOMEM;
  for (uint32_t i = 0; i < n; i++) {
    if (get_id(&o->via.array.ptr[i], &ids[i]) != 0) {
      free(ids);
      return -1;
    }
  }
  *n_out = n;
  *out = ids;
  return 0;
}

/* The fields of the session handshake's three messages. */
static int get_session(st_msg_type_t type, const msgpack_object* f,
                       st_msg_t* msg) {
  switch (type) {
    case ST_MSG_HS1: {
      st_hs_msg1_t* m = &msg->u.hs1;
      m->version = ST_WIRE_VERSION;
      return get_u8(&f[0], &m->key_id) |
             get_bin(&f[1], m->ephemeral, sizeof m->ephemeral) |
             get_bin(&f[2], m->mac, sizeof m->mac);
    }
    case ST_MSG_HS2: {
      st_hs_msg2_t* m = &msg->u.hs2;
      return get_bin(&f[0], m->ephemeral, sizeof m->ephemeral) |
             get_bin(&f[1], m->sealed, sizeof m->sealed);
    }
    case ST_MSG_HS3:
      return get_bin(&f[0], msg->u.hs3.sealed, sizeof msg->u.hs3.sealed);
    default:
      return -1;
  }
}

/* The fields of the membership messages (SWIM, push-pull, status). */
static int get_membership(st_msg_type_t type, const msgpack_object* f,
                          st_msg_t* msg, st_wire_drop_t* why) {
  switch (type) {
    case ST_MSG_PING: {
      st_msg_ping_t* m = &msg->u.ping;
      return get_u32(&f[0], &m->seq) | get_id(&f[1], &m->target);
    }
    case ST_MSG_PING_REQ: {
      st_msg_ping_req_t* m = &msg->u.ping_req;
      return get_u32(&f[0], &m->seq) | get_id(&f[1], &m->target) |
             get_addr(&f[2], &m->target_addr) | get_bool(&f[3], &m->want_nack);
    }
    case ST_MSG_ACK:
    case ST_MSG_NACK:
      return get_u32(&f[0], &msg->u.ack.seq);
    case ST_MSG_ALIVE: {
      st_msg_alive_t* m = &msg->u.alive;
      return get_id(&f[0], &m->node) | get_u64(&f[1], &m->incarnation) |
             get_addr(&f[2], &m->addr) |
             get_bin(&f[3], m->public_key, sizeof m->public_key) |
             get_bin(&f[4], m->signature, sizeof m->signature);
    }
    case ST_MSG_SUSPECT:
      return get_id(&f[0], &msg->u.suspect.node) |
             get_u64(&f[1], &msg->u.suspect.incarnation) |
             get_id(&f[2], &msg->u.suspect.from);
    case ST_MSG_DEAD: {
      st_msg_suspect_t* m = &msg->u.dead;
      return get_id(&f[0], &m->node) | get_u64(&f[1], &m->incarnation) |
             get_id(&f[2], &m->from) |
             get_bin(&f[3], m->signature, sizeof m->signature);
    }
    case ST_MSG_STATUS: {
      st_msg_status_t* m = &msg->u.status;
      return get_id(&f[0], &m->node) | get_u64(&f[1], &m->seq) |
             get_u64(&f[2], &m->step) | get_f32(&f[3], &m->loss) |
             get_f32(&f[4], &m->accuracy) |
             get_f32(&f[5], &m->samples_per_sec) |
             get_bin(&f[6], m->fingerprint, sizeof m->fingerprint) |
             get_bool(&f[7], &m->ring_capable) | get_bool(&f[8], &m->synced) |
             get_keys(&f[9], m) |
             get_bin(&f[10], m->signature, sizeof m->signature);
    }
    case ST_MSG_PUSH_PULL:
      return get_push_pull(f, &msg->u.push_pull, why);
    default:
      return -1;
  }
}

/* The fields of a multi-donor sync's request and reply; the reply's
 * hashes borrow from the input, as a chunk's data does. */
static int get_sync(st_msg_type_t type, const msgpack_object* f,
                    const uint8_t* buf, size_t len, st_msg_t* msg,
                    st_wire_drop_t* why) {
  switch (type) {
    case ST_MSG_SYNC_REQ: {
      st_msg_sync_req_t* m = &msg->u.sync_req;
      if (get_u8(&f[0], &m->kind) | get_bin(&f[1], m->fingerprint, 16) |
          get_u64(&f[2], &m->n_params) |
          get_bin(&f[3], m->anchor, sizeof m->anchor) |
          get_u64(&f[4], &m->first) | get_u64(&f[5], &m->count))
        return -1;
      return sync_req_check(m, why);
    }
    case ST_MSG_SYNC_REPLY: {
      st_msg_sync_reply_t* m = &msg->u.sync_reply;
      if (get_u8(&f[0], &m->status) |
              get_bin(&f[1], m->anchor, sizeof m->anchor) |
              get_u64(&f[2], &m->round) | get_u64(&f[3], &m->step) |
              get_u64(&f[4], &m->n_params) ||
          f[5].type != MSGPACK_OBJECT_BIN)
        return -1;
      m->hashes_len = f[5].via.bin.size;
      if (sync_reply_check(m, why) != 0)
        return -1;
      /* The hashes end the message: borrowed as a tensor chunk's data. */
      m->hashes = m->hashes_len > 0 ? buf + (len - m->hashes_len) : NULL;
      assert(m->hashes_len == 0 ||
             (const uint8_t*) f[5].via.bin.ptr == m->hashes);
      return 0;
    }
    default:
      return -1;
  }
}

/* The fields of a pairwise exchange and its state transfer. */
static int get_exchange(st_msg_type_t type, const msgpack_object* f,
                        const uint8_t* buf, size_t len, st_msg_t* msg,
                        st_wire_drop_t* why) {
  switch (type) {
    case ST_MSG_TENSOR_CHUNK: {
      st_msg_tensor_chunk_t* m = &msg->u.chunk;
      if (get_u64(&f[0], &m->transfer_id) | get_u64(&f[1], &m->offset) |
          get_u64(&f[2], &m->total))
        return -1;
      if (f[3].type != MSGPACK_OBJECT_BIN)
        return -1;
      m->data_len = f[3].via.bin.size;
      if (chunk_check(m, why) != 0)
        return -1;
      /* The data is the last object of the message, and len is where the
       * walk found the message to end: its bytes end the message, so the
       * pointer comes from the walk, not from msgpack-c. (msgpack-c 4.0's
       * msgpack_unpack_next references the input for bin objects rather
       * than copying them; the assert holds it to that in debug builds.) */
      m->data = buf + (len - m->data_len);
      assert((const uint8_t*) f[3].via.bin.ptr == m->data || m->data_len == 0);
      return 0;
    }
    case ST_MSG_XCHG_REQ: {
      st_msg_xchg_req_t* m = &msg->u.xchg_req;
      if (get_u8(&f[0], &m->kind) != 0 || !kind_ok(m->kind))
        return -1;
      return get_xchg_info(f + 1, m->fingerprint, m->model, &m->n_params,
                           &m->step) |
             get_bin(&f[5], m->anchor, sizeof m->anchor);
    }
    case ST_MSG_XCHG_REPLY: {
      st_msg_xchg_reply_t* m = &msg->u.xchg_reply;
      if (get_u8(&f[0], &m->status) != 0 ||
          m->status > ST_XCHG_STATUS_NOT_READY ||
          get_xchg_info(f + 1, m->fingerprint, m->model, &m->n_params,
                        &m->step) != 0 ||
          get_bin(&f[5], m->anchor, sizeof m->anchor) != 0 ||
          f[6].type != MSGPACK_OBJECT_STR)
        return -1;
      if (f[6].via.str.size > ST_XCHG_TENSORS_MAX) {
        *why = ST_WIRE_DROP_LIMIT;
        return -1;
      }
      /* The last object of the message, borrowed like a chunk's data. */
      m->tensors_len = f[6].via.str.size;
      m->tensors = m->tensors_len > 0
                       ? (const char*) buf + (len - m->tensors_len)
                       : NULL;
      assert(m->tensors_len == 0 || f[6].via.str.ptr == m->tensors);
      return 0;
    }
    case ST_MSG_XCHG_DONE:
      return get_bin(&f[0], msg->u.xchg_done.hash,
                     sizeof msg->u.xchg_done.hash);
    case ST_MSG_XCHG_CODED: {
      st_msg_xchg_coded_t* m = &msg->u.xchg_coded;
      if (get_u64(&f[0], &m->offset) | get_u64(&f[1], &m->total) ||
          f[2].type != MSGPACK_OBJECT_BIN)
        return -1;
      m->data_len = f[2].via.bin.size;
      if (coded_check(m, why) != 0)
        return -1;
      /* The data ends the message: borrowed as a tensor chunk's is. */
      m->data = buf + (len - m->data_len);
      assert((const uint8_t*) f[2].via.bin.ptr == m->data);
      return 0;
    }
    case ST_MSG_SYNC_REQ:
    case ST_MSG_SYNC_REPLY:
      return get_sync(type, f, buf, len, msg, why);
    default:
      return -1;
  }
}

/* The fields of a ring round: formation, lanes and segments. */
static int get_ring(st_msg_type_t type, const msgpack_object* f,
                    const uint8_t* buf, size_t len, st_msg_t* msg,
                    st_wire_drop_t* why) {
  switch (type) {
    case ST_MSG_RING_SEG: {
      st_msg_ring_seg_t* m = &msg->u.ring_seg;
      if (get_u64(&f[0], &m->round_id) | get_u8(&f[1], &m->phase) |
          get_u32(&f[2], &m->step) | get_u32(&f[3], &m->chunk) |
          get_u64(&f[4], &m->offset))
        return -1;
      if (f[5].type != MSGPACK_OBJECT_BIN)
        return -1;
      m->data_len = f[5].via.bin.size;
      if (ring_seg_check(m, why) != 0)
        return -1;
      /* The data ends the message, as a tensor chunk's does: the pointer
       * comes from the walk (see ST_MSG_TENSOR_CHUNK above). */
      m->data = buf + (len - m->data_len);
      assert((const uint8_t*) f[5].via.bin.ptr == m->data || m->data_len == 0);
      return 0;
    }
    case ST_MSG_RING_PROPOSE: {
      st_msg_ring_propose_t* m = &msg->u.ring_propose;
      if (get_u64(&f[0], &m->round_id) | get_id(&f[1], &m->proposer))
        return -1;
      return get_ring_members(&f[2], &m->n_members, &m->members, why);
    }
    case ST_MSG_RING_ACCEPT:
      return get_u64(&f[0], &msg->u.ring_accept.round_id) |
             get_bool(&f[1], &msg->u.ring_accept.accept) |
             get_bin(&f[2], msg->u.ring_accept.tag, ST_RING_TAG_BYTES);
    case ST_MSG_RING_CONFIRM: {
      st_msg_ring_confirm_t* m = &msg->u.ring_confirm;
      if (get_u64(&f[0], &m->round_id) |
          get_bin(&f[2], m->tag, ST_RING_TAG_BYTES))
        return -1;
      return get_ring_members(&f[1], &m->n_members, &m->members, why);
    }
    case ST_MSG_RING_CANCEL:
      return get_u64(&f[0], &msg->u.ring_cancel.round_id);
    case ST_MSG_RING_LANE: {
      st_msg_ring_lane_t* m = &msg->u.ring_lane;
      if (get_u64(&f[0], &m->round_id) | get_u32(&f[1], &m->lane) |
          get_u32(&f[2], &m->lanes))
        return -1;
      return ring_lane_ok(m) ? 0 : -1;
    }
    default:
      return -1;
  }
}

/* The collective messages' fields. A bin that ends the message borrows
 * from buf, as a tensor chunk's does. */
static int get_coll(st_msg_type_t type, const msgpack_object* f,
                    const uint8_t* buf, size_t len, st_msg_t* msg,
                    st_wire_drop_t* why) {
  switch (type) {
    case ST_MSG_COLL_HELLO: {
      st_msg_coll_hello_t* m = &msg->u.coll_hello;
      if (get_u64(&f[0], &m->op_id) | get_u8(&f[1], &m->kind) |
          get_u8(&f[2], &m->rop) | get_u8(&f[3], &m->dtype) |
          get_u32(&f[4], &m->root) | get_u64(&f[5], &m->count) |
          get_u32(&f[6], &m->n) | get_u64(&f[7], &m->members_hash))
        return -1;
      if (f[8].type != MSGPACK_OBJECT_BIN)
        return -1;
      m->data_len = f[8].via.bin.size;
      if (coll_hello_check(m, why) != 0)
        return -1;
      m->data = buf + (len - m->data_len);
      assert((const uint8_t*) f[8].via.bin.ptr == m->data || m->data_len == 0);
      return 0;
    }
    case ST_MSG_COLL_SEG: {
      st_msg_coll_seg_t* m = &msg->u.coll_seg;
      if (get_u64(&f[0], &m->op_id) | get_u8(&f[1], &m->phase) |
          get_u32(&f[2], &m->step) | get_u64(&f[3], &m->offset))
        return -1;
      if (f[4].type != MSGPACK_OBJECT_BIN)
        return -1;
      m->data_len = f[4].via.bin.size;
      if (coll_seg_check(m, why) != 0)
        return -1;
      m->data = buf + (len - m->data_len);
      assert((const uint8_t*) f[4].via.bin.ptr == m->data || m->data_len == 0);
      return 0;
    }
    case ST_MSG_COLL_ABORT: {
      st_msg_coll_abort_t* m = &msg->u.coll_abort;
      if (get_u64(&f[0], &m->op_id) != 0 || f[1].type != MSGPACK_OBJECT_STR)
        return -1;
      m->reason = f[1].via.str.ptr;
      m->reason_len = f[1].via.str.size;
      return coll_abort_check(m, why);
    }
    case ST_MSG_COLL_FETCH: {
      st_msg_coll_fetch_t* m = &msg->u.coll_fetch;
      if (get_u64(&f[0], &m->op_id) | get_u8(&f[1], &m->code) ||
          f[2].type != MSGPACK_OBJECT_STR)
        return -1;
      m->text = f[2].via.str.ptr;
      m->text_len = f[2].via.str.size;
      return coll_fetch_check(m, why);
    }
    default:
      return -1;
  }
}

/* The cluster requests' fields; a reply's reason borrows from the
 * input, as COLL_ABORT's does. */
static int get_admin_msg(st_msg_type_t type, const msgpack_object* f,
                         st_msg_t* msg, st_wire_drop_t* why) {
  if (type == ST_MSG_ADMIN_REQ) {
    st_msg_admin_req_t* q = &msg->u.admin_req;
    if (get_u8(&f[0], &q->op) != 0 || get_u8(&f[1], &q->key_id) != 0 ||
        f[2].type != MSGPACK_OBJECT_BIN)
      return -1;
    uint32_t n = f[2].via.bin.size;
    if (n > sizeof q->subject)
      return -1;
    q->subject_len = (uint8_t) n;
    memset(q->subject, 0, sizeof q->subject);
    memcpy(q->subject, f[2].via.bin.ptr, n);
    return admin_req_check(q);
  }
  st_msg_admin_reply_t* r = &msg->u.admin_reply;
  if (get_u8(&f[0], &r->result) != 0 || f[1].type != MSGPACK_OBJECT_BIN ||
      f[1].via.bin.size > 2 || f[2].type != MSGPACK_OBJECT_STR)
    return -1;
  r->n_keys = (uint8_t) f[1].via.bin.size;
  memcpy(r->keys, f[1].via.bin.ptr, r->n_keys);
  r->reason = f[2].via.str.ptr;
  r->reason_len = f[2].via.str.size;
  return admin_reply_check(r, why);
}

/* f: the fields after [type, version], as many as field_count(type) says.
 * buf, len: the message's bytes, which a chunk's data borrows from.
 * Returns 0, -1 (the reason in *why) or -ENOMEM. */
static int get_fields(st_msg_type_t type, const msgpack_object* f,
                      const uint8_t* buf, size_t len, st_msg_t* msg,
                      st_wire_drop_t* why) {
  *why = ST_WIRE_DROP_FIELD;
  switch (type) {
    case ST_MSG_HS1:
    case ST_MSG_HS2:
    case ST_MSG_HS3:
      return get_session(type, f, msg);
    case ST_MSG_PING:
    case ST_MSG_PING_REQ:
    case ST_MSG_ACK:
    case ST_MSG_NACK:
    case ST_MSG_ALIVE:
    case ST_MSG_SUSPECT:
    case ST_MSG_DEAD:
    case ST_MSG_STATUS:
    case ST_MSG_PUSH_PULL:
      return get_membership(type, f, msg, why);
    case ST_MSG_TENSOR_CHUNK:
    case ST_MSG_XCHG_REQ:
    case ST_MSG_XCHG_REPLY:
    case ST_MSG_XCHG_DONE:
    case ST_MSG_XCHG_CODED:
    case ST_MSG_SYNC_REQ:
    case ST_MSG_SYNC_REPLY:
      return get_exchange(type, f, buf, len, msg, why);
    case ST_MSG_RING_SEG:
    case ST_MSG_RING_PROPOSE:
    case ST_MSG_RING_ACCEPT:
    case ST_MSG_RING_CONFIRM:
    case ST_MSG_RING_CANCEL:
    case ST_MSG_RING_LANE:
      return get_ring(type, f, buf, len, msg, why);
    case ST_MSG_COLL_HELLO:
    case ST_MSG_COLL_SEG:
    case ST_MSG_COLL_ABORT:
    case ST_MSG_COLL_FETCH:
      return get_coll(type, f, buf, len, msg, why);
    case ST_MSG_ADMIN_REQ:
    case ST_MSG_ADMIN_REPLY:
      return get_admin_msg(type, f, msg, why);
  }
  return -1;
}

/* ==== Decoder ===============================================================
 */

static int drop(st_wire_counters_t* c, st_wire_drop_t why) {
  if (c != NULL)
    c->drops[why]++;
  switch (why) {
    case ST_WIRE_DROP_VERSION:
      return -EPROTONOSUPPORT;
    case ST_WIRE_DROP_UNKNOWN_TYPE:
      return -ENOMSG;
    default:
      return -EBADMSG;
  }
}

/* The checks of a message's raw bytes before msgpack-c sees them: the
 * envelope, version and type, then every count and length against the bytes
 * left. Sets *type, *nfields and *n (the message's size); returns 0, or -1
 * with the reason in *why. */
static int scan_message(const uint8_t* buf, size_t len, int whole,
                        uint64_t* type, size_t* nfields, size_t* n,
                        st_wire_drop_t* why) {
  if (whole && len > ST_WIRE_MAX_MESSAGE_BYTES) {
    *why = ST_WIRE_DROP_LIMIT;
    return -1;
  }

  /* The envelope, version and type, from the raw bytes. */
  uint64_t version;
  if (st__wire_peek_envelope(buf, len, type, &version) != 0) {
    *why = ST_WIRE_DROP_MALFORMED;
    return -1;
  }
  if (version != ST_WIRE_VERSION) {
    *why = ST_WIRE_DROP_VERSION;
    return -1;
  }
  *nfields = field_count(*type);
  if (*nfields == 0) {
    *why = ST_WIRE_DROP_UNKNOWN_TYPE;
    return -1;
  }

  /* Every count and length against the bytes left, before msgpack-c. The
   * walk stops where the first message ends, and every count it passed was
   * met by objects before that end, so what msgpack-c is given below is
   * bounded by the message, however long buf is; the size cap then
   * applies to the message. */
  st__wire_rules_t rules;
  st__wire_rules_for(*type, &rules);
  *n = 0;
  if (st__wire_scan(buf, len, &rules, n, why) != 0)
    return -1;
  if (*n > ST_WIRE_MAX_MESSAGE_BYTES) {
    *why = ST_WIRE_DROP_LIMIT;
    return -1;
  }
  if (whole && *n != len) {
    *why = ST_WIRE_DROP_MALFORMED; /* trailing bytes */
    return -1;
  }
  return 0;
}

/* Both entry points. whole: the message must fill buf[0..len) (trailing
 * bytes are MALFORMED, found by the walk before msgpack-c runs); else the
 * first message is decoded and its size written to *used. On failure *msg
 * is zeroed, so that st_wire_msg_free on it is harmless. */
static int decode(const uint8_t* buf, size_t len, st_msg_t* msg, size_t* used,
                  int whole, st_wire_counters_t* c) {
  memset(msg, 0, sizeof *msg);
  *used = 0;
  if (buf == NULL && len > 0)
    return -EINVAL;
  uint64_t type;
  size_t nfields, n;
  st_wire_drop_t why;
  if (scan_message(buf, len, whole, &type, &nfields, &n, &why) != 0)
    return drop(c, why);

  /* msgpack-c now sees counts of at most ST__WIRE_MAX_ELEMENTS (a
   * push-pull's entries: at most ST_WIRE_PUSH_PULL_MAX_ENTRIES, each of 129
   * bytes at least; a ring formation's members: at most
   * ST_RING_FORM_MAX_MEMBERS), lengths within the message and depth within
   * the rules: its zone holds at most 9 objects of 24 bytes an entry (1.5
   * MB for 6900 entries), else at most a few KB. */
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  size_t off = 0;
  int rc;
  msgpack_unpack_return ur =
      msgpack_unpack_next(&u, (const char*) buf, n, &off);
  if (ur == MSGPACK_UNPACK_NOMEM_ERROR) {
    rc = -ENOMEM; /* not the peer's fault: nothing counted */
    goto out;
  }
  if (ur != MSGPACK_UNPACK_SUCCESS || off != n) {
    /* The walk accepts exactly what msgpack-c parses; defensive. */
    rc = drop(c, ST_WIRE_DROP_MALFORMED);
    goto out;
  }
  const msgpack_object* top = &u.data;
  /* The walk and the peek saw an array of at least 2 starting with two
   * unsigned integers; msgpack-c must agree. */
  if (top->type != MSGPACK_OBJECT_ARRAY || top->via.array.size < 2) {
    rc = drop(c, ST_WIRE_DROP_MALFORMED);
    goto out;
  }
  if (top->via.array.size != 2 + nfields) {
    rc = drop(c, ST_WIRE_DROP_FIELD);
    goto out;
  }
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = (st_msg_type_t) type;
  rc = get_fields(m.type, top->via.array.ptr + 2, buf, n, &m, &why);
  if (rc == -ENOMEM)
    goto out; /* not the peer's fault: nothing counted */
  if (rc != 0) {
    rc = drop(c, why);
    goto out;
  }
  *msg = m;
  *used = n;
  rc = 0;
out:
  msgpack_unpacked_destroy(&u);
  return rc;
}

int st_wire_decode(const uint8_t* buf, size_t len, st_msg_t* msg,
                   st_wire_counters_t* c) {
  size_t used;
  if (msg == NULL)
    return -EINVAL;
  return decode(buf, len, msg, &used, 1, c);
}

int st_wire_decode_next(const uint8_t* buf, size_t len, st_msg_t* msg,
                        size_t* used, st_wire_counters_t* c) {
  if (msg == NULL || used == NULL)
    return -EINVAL;
  return decode(buf, len, msg, used, 0, c);
}

int st_wire_peek_type(const uint8_t* buf, size_t len, uint64_t* type) {
  uint64_t version;
  if (buf == NULL || type == NULL)
    return -EINVAL;
  return st__wire_peek_envelope(buf, len, type, &version);
}

void st_wire_msg_free(st_msg_t* msg) {
  if (msg == NULL)
    return;
  if (msg->type == ST_MSG_PUSH_PULL) {
    free(msg->u.push_pull.entries);
    msg->u.push_pull.entries = NULL;
    msg->u.push_pull.n_entries = 0;
  } else if (msg->type == ST_MSG_RING_PROPOSE) {
    free(msg->u.ring_propose.members);
    msg->u.ring_propose.members = NULL;
    msg->u.ring_propose.n_members = 0;
  } else if (msg->type == ST_MSG_RING_CONFIRM) {
    free(msg->u.ring_confirm.members);
    msg->u.ring_confirm.members = NULL;
    msg->u.ring_confirm.n_members = 0;
  }
}
