/* fuzz_wire_decode.c: the libFuzzer target of the wire decoder
 * (st_wire_decode and st_wire_decode_next, gossip/wire.c and
 * gossip/wire_scan.c). The input is decoded twice: as one message
 * (st_wire_decode, a stream frame) and as a packet plaintext of messages
 * back to back (st_wire_decode_next until the bytes end or one is
 * refused), where each message read must be the one st_wire_decode reads
 * from exactly its `used` bytes. Any input must
 * decode or be refused with one of the documented codes and exactly one
 * drop counted; never crash, leak or read past the input. Whatever decodes
 * is a round-trip oracle: it re-encodes, decodes again to the same
 * message, and re-encoding that gives the same bytes (the encoding is
 * canonical). A decoded chunk's data must lie inside the input.
 *
 *   CC=clang cmake -S . -B build-fuzz -DSTARLING_FUZZ=ON -DSTARLING_CUDA=OFF
 *   cmake --build build-fuzz --target fuzz_wire_decode
 *   ./build-fuzz/fuzz_wire_decode -max_total_time=60 /tmp/wirecorpus \
 *       tests/fuzz/corpus/fuzz_wire_decode
 *
 * The seed corpus (one valid encoding per message type, push-pulls and a
 * packet of several messages) is written by the Check suites:
 * ST_WIRE_WRITE_CORPUS=tests/fuzz/corpus/fuzz_wire_decode
 * CK_RUN_CASE=round_trip build/test_wire (and build/test_wire_push_pull).
 * Every decoded message is freed (st_wire_msg_free): a leak is a crash. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/gossip.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#define CHECK(x) \
  do {           \
    if (!(x))    \
      abort();   \
  } while (0)

static int f32_same(float a, float b) {
  return (isnan(a) && isnan(b)) || memcmp(&a, &b, 4) == 0;
}

static int addr_same(const st_wire_addr_t* a, const st_wire_addr_t* b) {
  return a->ip_len == b->ip_len && a->port == b->port &&
         memcmp(a->ip, b->ip, a->ip_len) == 0;
}

static int msg_same(const st_msg_t* a, const st_msg_t* b) {
  if (a->type != b->type)
    return 0;
  switch (a->type) {
    case ST_MSG_HS1:
      return memcmp(&a->u.hs1, &b->u.hs1, sizeof a->u.hs1) == 0;
    case ST_MSG_HS2:
      return memcmp(&a->u.hs2, &b->u.hs2, sizeof a->u.hs2) == 0;
    case ST_MSG_HS3:
      return memcmp(&a->u.hs3, &b->u.hs3, sizeof a->u.hs3) == 0;
    case ST_MSG_PING:
      return a->u.ping.seq == b->u.ping.seq &&
             memcmp(&a->u.ping.target, &b->u.ping.target, 16) == 0;
    case ST_MSG_PING_REQ:
      return a->u.ping_req.seq == b->u.ping_req.seq &&
             memcmp(&a->u.ping_req.target, &b->u.ping_req.target, 16) == 0 &&
             addr_same(&a->u.ping_req.target_addr,
                       &b->u.ping_req.target_addr) &&
             a->u.ping_req.want_nack == b->u.ping_req.want_nack;
    case ST_MSG_ACK:
    case ST_MSG_NACK:
      return a->u.ack.seq == b->u.ack.seq;
    case ST_MSG_ALIVE:
      return memcmp(&a->u.alive.node, &b->u.alive.node, 16) == 0 &&
             a->u.alive.incarnation == b->u.alive.incarnation &&
             addr_same(&a->u.alive.addr, &b->u.alive.addr) &&
             memcmp(a->u.alive.public_key, b->u.alive.public_key, 32) == 0;
    case ST_MSG_SUSPECT:
    case ST_MSG_DEAD:
      return memcmp(&a->u.suspect, &b->u.suspect, sizeof a->u.suspect) == 0;
    case ST_MSG_STATUS: {
      const st_msg_status_t *x = &a->u.status, *y = &b->u.status;
      return memcmp(&x->node, &y->node, 16) == 0 && x->seq == y->seq &&
             x->step == y->step && f32_same(x->loss, y->loss) &&
             f32_same(x->accuracy, y->accuracy) &&
             f32_same(x->samples_per_sec, y->samples_per_sec) &&
             memcmp(x->fingerprint, y->fingerprint, 16) == 0 &&
             x->ring_capable == y->ring_capable;
    }
    case ST_MSG_PUSH_PULL: {
      const st_msg_push_pull_t *x = &a->u.push_pull, *y = &b->u.push_pull;
      if (x->is_reply != y->is_reply || x->n_entries != y->n_entries)
        return 0;
      for (uint32_t i = 0; i < x->n_entries; i++) {
        const st_push_pull_entry_t *e = &x->entries[i], *f = &y->entries[i];
        if (memcmp(&e->node, &f->node, 16) != 0 ||
            e->incarnation != f->incarnation || e->state != f->state ||
            !addr_same(&e->addr, &f->addr) ||
            memcmp(e->public_key, f->public_key, 32) != 0)
          return 0;
      }
      return 1;
    }
    case ST_MSG_TENSOR_CHUNK: {
      const st_msg_tensor_chunk_t *x = &a->u.chunk, *y = &b->u.chunk;
      return x->transfer_id == y->transfer_id && x->offset == y->offset &&
             x->total == y->total && x->data_len == y->data_len &&
             (x->data_len == 0 || memcmp(x->data, y->data, x->data_len) == 0);
    }
  }
  return 0;
}

static uint64_t drops_total(const st_wire_counters_t* c) {
  uint64_t t = 0;
  for (int r = 0; r < ST_WIRE_DROP_COUNT; r++)
    t += c->drops[r];
  return t;
}

static void check_refusal(int rc, const st_wire_counters_t* c) {
  CHECK(rc == -EBADMSG || rc == -EPROTONOSUPPORT || rc == -ENOMSG);
  CHECK(drops_total(c) == 1);
  CHECK((rc == -EPROTONOSUPPORT) == (c->drops[ST_WIRE_DROP_VERSION] == 1));
  CHECK((rc == -ENOMSG) == (c->drops[ST_WIRE_DROP_UNKNOWN_TYPE] == 1));
}

/* m was decoded from data[0..size): its chunk data lies inside, and it is
 * a round-trip oracle. */
static void check_decoded(const st_msg_t* m, const uint8_t* data, size_t size) {
  static uint8_t enc[ST_WIRE_MAX_MESSAGE_BYTES],
      enc2[ST_WIRE_MAX_MESSAGE_BYTES];
  if (m->type == ST_MSG_TENSOR_CHUNK && m->u.chunk.data_len > 0)
    CHECK(m->u.chunk.data >= data &&
          m->u.chunk.data + m->u.chunk.data_len <= data + size);
  size_t n1 = 0, n2 = 0;
  CHECK(st_wire_encode(m, enc, sizeof enc, &n1) == 0);
  CHECK(n1 <= size); /* canonical is never longer than what came in */
  st_wire_counters_t c;
  memset(&c, 0, sizeof c);
  st_msg_t m2;
  CHECK(st_wire_decode(enc, n1, &m2, &c) == 0);
  CHECK(drops_total(&c) == 0);
  CHECK(msg_same(m, &m2));
  CHECK(st_wire_encode(&m2, enc2, sizeof enc2, &n2) == 0);
  CHECK(n1 == n2 && memcmp(enc, enc2, n1) == 0);
  st_wire_msg_free(&m2);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  /* As one message. */
  st_wire_counters_t c;
  memset(&c, 0, sizeof c);
  st_msg_t m;
  int rc = st_wire_decode(data, size, &m, &c);
  if (rc != 0) {
    check_refusal(rc, &c);
  } else {
    CHECK(drops_total(&c) == 0);
    check_decoded(&m, data, size);
    st_wire_msg_free(&m);
  }

  /* As messages back to back. */
  size_t off = 0;
  while (off < size) {
    memset(&c, 0, sizeof c);
    size_t used = 0;
    rc = st_wire_decode_next(data + off, size - off, &m, &used, &c);
    if (rc != 0) {
      check_refusal(rc, &c);
      CHECK(used == 0);
      break;
    }
    CHECK(drops_total(&c) == 0);
    CHECK(used > 0 && used <= size - off);
    check_decoded(&m, data + off, used);
    /* The same bytes alone are that one message. */
    st_msg_t one;
    CHECK(st_wire_decode(data + off, used, &one, &c) == 0);
    CHECK(msg_same(&m, &one));
    st_wire_msg_free(&one);
    st_wire_msg_free(&m);
    off += used;
  }
  return 0;
}
