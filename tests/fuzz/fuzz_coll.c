/* fuzz_coll.c: the libFuzzer target of the user collectives' machine
 * (gossip/coll.c; gossip.h, "User collectives"). The input is a script:
 * its first bytes pick the operation (2 to 9 members, our rank, the kind,
 * reduction, dtype and root, 0 to 48 elements, the small path or the ring
 * with segments of 8 to 64 bytes), then each step is one event from a
 * member chosen by the input: a raw frame decoded as the daemon decodes
 * it, a HELLO built by the harness (matching our call, or with one field
 * changed, with or without data), a segment with fields and data from the
 * input, an ABORT, or the driver's abort. After every event the actions
 * are drained and checked: every SEND goes to another member and decodes
 * to a COLL_* message of this operation, DONE comes at most once with
 * nothing after it, and a result exists only after DONE(OK). Never a
 * crash, a leak or an overread.
 *
 *   CC=clang cmake -S . -B build-fuzz -DSTARLING_FUZZ=ON -DSTARLING_CUDA=OFF
 *   cmake --build build-fuzz --target fuzz_coll
 *   ./build-fuzz/fuzz_coll -max_total_time=60 /tmp/cc
 * tests/fuzz/corpus/fuzz_coll
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/gossip.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#define OP 0x5eedc011u
#define MAX_COUNT 48

typedef struct {
  st_coll_t* x;
  st_coll_spec_t s;
  int dones;
  bool ok;
} harness_t;

static void drain(harness_t* h) {
  st_cact_t a;
  while (st_coll_next_action(h->x, &a)) {
    CHECK(h->dones == 0);
    if (a.kind == ST_CACT_SEND) {
      CHECK(a.to < h->s.n && a.to != h->s.rank);
      st_msg_t m;
      CHECK(st_wire_decode(a.data, a.len, &m, NULL) == 0);
      uint64_t op = m.type == ST_MSG_COLL_HELLO ? m.u.coll_hello.op_id
                    : m.type == ST_MSG_COLL_SEG ? m.u.coll_seg.op_id
                                                : m.u.coll_abort.op_id;
      CHECK(m.type == ST_MSG_COLL_HELLO || m.type == ST_MSG_COLL_SEG ||
            m.type == ST_MSG_COLL_ABORT);
      CHECK(op == OP);
      st_wire_msg_free(&m);
    } else {
      CHECK(a.kind == ST_CACT_DONE && a.why != NULL);
      h->dones++;
      h->ok = a.result == ST_COLL_OK;
    }
  }
  CHECK(st_coll_finished(h->x) == (h->dones == 1));
  if (st_coll_result(h->x) != NULL)
    CHECK(h->ok);
}

/* Feeds one message from member `from`, as the daemon does: only a
 * message that decodes reaches the machine. */
static void feed_bytes(harness_t* h, uint32_t from, const uint8_t* p,
                       size_t len) {
  st_msg_t m;
  if (st_wire_decode(p, len, &m, NULL) != 0)
    return;
  (void) st_coll_message(h->x, from, &m); /* -EINVAL: another op's */
  st_wire_msg_free(&m);
}

static void feed_msg(harness_t* h, uint32_t from, const st_msg_t* m) {
  uint8_t buf[1024];
  size_t len;
  if (st_wire_encode(m, buf, sizeof buf, &len) == 0)
    feed_bytes(h, from, buf, len);
}

static void hello(harness_t* h, fuzz_in_t* in, uint32_t from,
                  const uint8_t* payload) {
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_COLL_HELLO;
  st_msg_coll_hello_t* o = &m.u.coll_hello;
  *o = (st_msg_coll_hello_t){.op_id = OP,
                             .kind = (uint8_t) h->s.kind,
                             .rop = (uint8_t) h->s.rop,
                             .dtype = (uint8_t) h->s.dtype,
                             .root = h->s.root,
                             .count = h->s.count,
                             .n = h->s.n,
                             .members_hash = h->s.members_hash};
  uint8_t how = fuzz_byte(in);
  if (how & 1) {
    o->data = payload;
    o->data_len = (uint32_t) (h->s.count * st_coll_elem_bytes(h->s.dtype));
  }
  switch ((how >> 1) & 7) { /* one field changed, or none */
    case 1:
      o->count ^= 1;
      break;
    case 2:
      o->kind = (uint8_t) (fuzz_byte(in) % ST_COLL_KIND_COUNT);
      break;
    case 3:
      o->members_hash++;
      break;
    case 4:
      o->data_len = fuzz_byte(in) & 0xf8;
      break;
    default:
      break;
  }
  feed_msg(h, from, &m);
}

static void seg(harness_t* h, fuzz_in_t* in, uint32_t from,
                const uint8_t* payload) {
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_COLL_SEG;
  st_msg_coll_seg_t* g = &m.u.coll_seg;
  g->op_id = OP;
  g->phase = fuzz_byte(in) % ST_COLL_PHASE_COUNT;
  g->step = fuzz_byte(in) % 10;
  g->offset = fuzz_byte(in) % (MAX_COUNT + 4);
  g->data = payload;
  g->data_len = (uint32_t) (fuzz_byte(in) % 9) * 8;
  feed_msg(h, from, &m);
}

static void setup(harness_t* h, fuzz_in_t* in, uint8_t* input) {
  st_coll_spec_default(&h->s);
  h->s.op_id = OP;
  h->s.n = 2 + fuzz_byte(in) % 8;
  h->s.rank = fuzz_byte(in) % h->s.n;
  h->s.kind = (st_coll_kind_t) (fuzz_byte(in) % ST_COLL_KIND_COUNT);
  h->s.rop = (st_coll_rop_t) (fuzz_byte(in) % ST_COLL_ROP_COUNT);
  h->s.dtype = (st_coll_dtype_t) (fuzz_byte(in) % ST_COLL_DTYPE_COUNT);
  h->s.root = fuzz_byte(in) % h->s.n;
  h->s.count = h->s.kind == ST_COLL_BARRIER ? 1 : fuzz_byte(in) % MAX_COUNT;
  h->s.members_hash = 77;
  if (fuzz_byte(in) & 1) { /* the ring (or chain) with tiny segments */
    h->s.small_bytes = 0;
    h->s.segment_bytes = 8u * (1 + fuzz_byte(in) % 8);
  }
  for (size_t i = 0; i < MAX_COUNT * 8; i++)
    input[i] = fuzz_byte(in);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_in_t in = {data, size};
  harness_t h = {0};
  uint8_t input[MAX_COUNT * 8];
  setup(&h, &in, input);
  CHECK(st_coll_new(&h.s, input, &h.x) == 0);
  drain(&h);
  for (int steps = 0; in.left > 0 && steps < 256; steps++) {
    uint8_t ev = fuzz_byte(&in);
    uint32_t from = fuzz_byte(&in) % h.s.n;
    if (from == h.s.rank)
      from = (from + 1) % h.s.n;
    switch (ev % 6) {
      case 0: {
        size_t len;
        const uint8_t* p = fuzz_frame(&in, &len);
        feed_bytes(&h, from, p, len);
        break;
      }
      case 1:
      case 2:
        hello(&h, &in, from, input);
        break;
      case 3:
        seg(&h, &in, from, input);
        break;
      case 4: {
        st_msg_t m;
        memset(&m, 0, sizeof m);
        m.type = ST_MSG_COLL_ABORT;
        m.u.coll_abort =
            (st_msg_coll_abort_t){.op_id = OP, .reason = "x", .reason_len = 1};
        feed_msg(&h, from, &m);
        break;
      }
      default:
        CHECK(st_coll_abort(
                  h.x, (ev & 8) ? ST_COLL_FAIL_TIMEOUT : ST_COLL_FAIL_ABORTED,
                  fuzz_byte(&in), "driver") == 0);
        break;
    }
    drain(&h);
  }
  st_coll_free(h.x);
  return 0;
}
