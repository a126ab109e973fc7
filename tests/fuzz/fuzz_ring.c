/* fuzz_ring.c: the libFuzzer target of the ring all-reduce machine
 * (gossip/ring.c; gossip.h, "Ring all-reduce"). The input is a script: its
 * first bytes pick the ring (2 to 9 members, our rank, 0 to 64 floats,
 * segments of 1 to 8 floats, 1 to 3 in flight), then each step is one
 * event: a raw frame from the input, the next segment the machine expects
 * (built by the harness from its own copy of the stream layout, so that
 * the fuzzer walks whole rounds without first finding valid msgpack), that
 * segment with one field changed, a snapshot (copied, or written into the
 * machine's buffer), an acknowledged SEND, a tick, or an abort. After
 * every event the actions are drained and checked: every SEND decodes to a
 * segment of the round of at most segment_floats floats, no more than
 * in_flight are unacknowledged, APPLY comes at most once, before DONE,
 * with n_params finite values, DONE at most once with nothing after it,
 * and a DONE(OK) of a real round comes after its APPLY. Never a crash, a
 * leak or an overread. The byte that picks in_flight also picks a coded
 * round (gossip.h, "Coded rounds"; the codec of tests/ring_test_codec.h,
 * with a base vector), whose segments the harness builds in that codec
 * from the input: a scale and int8 values, -128 and odd scales included.
 *
 *   CC=clang cmake -S . -B build-fuzz -DSTARLING_FUZZ=ON -DSTARLING_CUDA=OFF
 *   cmake --build build-fuzz --target fuzz_ring
 *   ./build-fuzz/fuzz_ring -max_total_time=60 /tmp/rc
 * tests/fuzz/corpus/fuzz_ring
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/gossip.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/ring_test_codec.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#define MAX_FLOATS 64

typedef struct {
  st_ring_t* x;
  st_ring_config_t cfg;
  uint32_t n, rank;
  uint64_t floats;
  unsigned unacked;
  int applies, dones;
  bool asked;
  bool coded;
  /* The receive stream as the harness sees it: step t, segment k. */
  uint32_t t;
  uint64_t k;
} harness_t;

static uint64_t chunk_start(const harness_t* h, uint32_t c) {
  return (uint64_t) c * h->floats / h->n;
}

static uint64_t chunk_floats(const harness_t* h, uint32_t c) {
  return chunk_start(h, c + 1) - chunk_start(h, c);
}

/* The chunk the previous member sends at step t: (rank - 1 - t) mod n. */
static uint32_t rx_chunk(const harness_t* h, uint32_t t) {
  return (uint32_t) (((uint64_t) h->rank + 2u * h->n - 1 - t) % h->n);
}

static void skip_empty(harness_t* h) {
  while (h->t < 2 * (h->n - 1) && chunk_floats(h, rx_chunk(h, h->t)) == 0)
    h->t++;
}

static void drain(harness_t* h) {
  st_ract_t a;
  while (st_ring_next_action(h->x, &a)) {
    CHECK(h->dones == 0);
    switch (a.kind) {
      case ST_RACT_SEND: {
        CHECK(a.data != NULL && a.len > 0 &&
              a.len <= ST_WIRE_MAX_MESSAGE_BYTES);
        st_msg_t m;
        CHECK(st_wire_decode(a.data, a.len, &m, NULL) == 0);
        CHECK(m.type == ST_MSG_RING_SEG);
        CHECK(m.u.ring_seg.data_len > 0 &&
              m.u.ring_seg.data_len <= (h->coded ? 4 + h->cfg.segment_floats
                                                 : 4 * h->cfg.segment_floats));
        st_wire_msg_free(&m);
        h->unacked++;
        CHECK(h->unacked <= h->cfg.in_flight);
        break;
      }
      case ST_RACT_WANT_SNAPSHOT:
        h->asked = true;
        break;
      case ST_RACT_APPLY:
        CHECK(h->applies++ == 0);
        CHECK(a.n == h->floats);
        for (size_t i = 0; i < a.n; i++)
          CHECK(isfinite(a.values[i]));
        break;
      case ST_RACT_TIMER:
        break;
      case ST_RACT_DONE:
        h->dones++;
        CHECK((unsigned) a.result < ST_RING_RESULT_COUNT);
        CHECK(st_ring_finished(h->x));
        if (a.result == ST_RING_OK && h->n > 1 && h->floats > 0)
          CHECK(h->applies == 1);
        if (a.result != ST_RING_OK)
          CHECK(h->applies == 0);
        break;
    }
  }
}

/* The next segment of the receive stream, with floats from the input; b
 * chooses one field to change (b % 8 < 6), or none. */
static void feed_next(harness_t* h, fuzz_in_t* in, bool perturb,
                      uint64_t round) {
  if (h->t >= 2 * (h->n - 1))
    return;
  static float v[8];
  static uint8_t code[4 * 8 + 4]; /* a perturbed length reaches 32 */
  uint32_t c = rx_chunk(h, h->t);
  uint64_t off = h->k * h->cfg.segment_floats;
  uint64_t count = chunk_floats(h, c) - off;
  if (count > h->cfg.segment_floats)
    count = h->cfg.segment_floats;
  for (uint64_t i = 0; i < count; i++) {
    uint8_t b = fuzz_byte(in);
    v[i] = b == 0xff ? NAN : (float) (b - 128) / 16;
    code[4 + i] = b; /* coded: q, -128 (0x80) among them */
  }
  if (h->coded) {
    /* A scale from one byte: 0, small, large, NaN, Inf, negative. */
    static const float scales[8] = {0,   1.0f / 64, 0.5f, 3e38f,
                                    NAN, INFINITY,  -1,   1e-40f};
    memcpy(code, &scales[fuzz_byte(in) % 8], 4);
  }
  bool rs = h->t + 1 < h->n;
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_RING_SEG;
  st_msg_ring_seg_t* g = &m.u.ring_seg;
  g->round_id = round;
  g->phase = rs ? ST_RING_REDUCE_SCATTER : ST_RING_ALL_GATHER;
  g->step = rs ? h->t : h->t - (h->n - 1);
  g->chunk = c;
  g->offset = off;
  g->data = h->coded ? code : (const uint8_t*) v;
  g->data_len = (uint32_t) (h->coded ? 4 + count : 4 * count);
  if (perturb) {
    uint8_t b = fuzz_byte(in);
    switch (b % 6) {
      case 0:
        g->round_id ^= 1u + (b >> 3);
        break;
      case 1:
        g->phase ^= 1;
        break;
      case 2:
        g->step += 1u + (b >> 3);
        break;
      case 3:
        g->chunk = (g->chunk + 1u + (b >> 3)) % (h->n + 1);
        break;
      case 4:
        g->offset += 1u + (b >> 3);
        break;
      default:
        g->data_len = 4u * ((b >> 3) % 9);
        break;
    }
  }
  uint8_t buf[256];
  size_t len = 0;
  if (st_wire_encode(&m, buf, sizeof buf, &len) != 0)
    return;
  CHECK(st_ring_message(h->x, 1000, buf, len) == 0);
  if (!perturb && ++h->k * h->cfg.segment_floats >= chunk_floats(h, c)) {
    h->k = 0;
    h->t++;
    skip_empty(h);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_in_t in = {data, size};
  harness_t h;
  memset(&h, 0, sizeof h);
  st_ring_config_default(&h.cfg);
  h.n = 2 + fuzz_byte(&in) % 8;
  h.rank = fuzz_byte(&in) % h.n;
  h.floats = fuzz_byte(&in) % (MAX_FLOATS + 1);
  h.cfg.segment_floats = 1 + fuzz_byte(&in) % 8;
  uint8_t pick = fuzz_byte(&in);
  h.cfg.in_flight = 1 + pick % 3;
  h.cfg.timeout_ms = 1000;
  static float base[MAX_FLOATS];
  h.coded = pick / 3 % 2 == 1;
  if (h.coded) {
    for (uint64_t i = 0; i < h.floats; i++)
      base[i] = (float) (i % 7) - 3.0f;
    h.cfg.codec = &ring_test_codec;
    h.cfg.base = base;
  }
  const uint64_t round = 0x7777;
  CHECK(st_ring_new(&h.cfg, round, h.n, h.rank, h.floats, 0, &h.x) == 0);
  skip_empty(&h);
  drain(&h);
  uint64_t now = 0;
  float snap[MAX_FLOATS];
  while (in.left > 0) {
    uint8_t op = fuzz_byte(&in);
    switch (op % 8) {
      case 0: { /* a raw frame */
        size_t len;
        const uint8_t* f = fuzz_frame(&in, &len);
        CHECK(st_ring_message(h.x, now, f, len) == 0);
        break;
      }
      case 1:
      case 2: /* the next segment */
        feed_next(&h, &in, false, round);
        break;
      case 3: /* the next segment, one field changed */
        feed_next(&h, &in, true, round);
        break;
      case 4: { /* the snapshot */
        for (uint64_t i = 0; i < h.floats; i++) {
          uint8_t b = fuzz_byte(&in);
          snap[i] = b == 0xff ? INFINITY : (float) (b - 128) / 8;
        }
        float* buf = st_ring_snapshot_buffer(h.x);
        bool finished = st_ring_finished(h.x);
        int rc;
        if (buf != NULL && (op & 8)) {
          memcpy(buf, snap, h.floats * sizeof(float));
          rc = st_ring_snapshot(h.x, now, buf, h.floats);
        } else {
          rc = st_ring_snapshot(h.x, now, snap, h.floats);
        }
        /* Accepted once, when asked; ignored after DONE. */
        CHECK((rc == 0) == (finished || h.asked));
        CHECK(rc == 0 || rc == -EINVAL);
        h.asked = false;
        break;
      }
      case 5:
      case 6: /* a SEND written */
        if (h.unacked > 0) {
          h.unacked--;
          CHECK(st_ring_sent(h.x, now) == 0);
        } else {
          CHECK(st_ring_sent(h.x, now) ==
                (st_ring_finished(h.x) ? 0 : -EINVAL));
        }
        break;
      default: /* time passes; sometimes the driver aborts */
        now += 100u * (op >> 3);
        if ((op >> 3) == 31)
          CHECK(st_ring_abort(h.x, now,
                              (st_ring_result_t) (1 + fuzz_byte(&in) % 4)) ==
                0);
        else
          CHECK(st_ring_tick(h.x, now) == 0);
        break;
    }
    drain(&h);
  }
  st_ring_free(h.x);
  return 0;
}
