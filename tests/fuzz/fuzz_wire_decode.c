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
#include "tests/fuzz/fuzz_common.h"
#include "tests/wire_same.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

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
