/* fuzz_xchg.c: the libFuzzer target of the exchange machine
 * (gossip/exchange.c; gossip.h, "Exchanges"). The input is a script: its
 * first bytes pick the role (responder, busy or not; AVERAGE or FETCH
 * initiator) and the model size, then each step is one event: a raw frame
 * from the input, a well-formed XCHG_REQ, XCHG_REPLY, TENSOR_CHUNK,
 * XCHG_CODED or XCHG_DONE built from the input's choices (so that the
 * fuzzer reaches the transfer without first finding valid msgpack; the
 * DONE may carry the right hash of what was delivered; REQ and REPLY carry
 * our anchor or another; the DONE may carry the hash of a held start
 * state, gossip.h "FETCH"), a snapshot, an acknowledged frame, a tick or the
 * connection closing. In a compressed role (gossip.h, "Compressed
 * averaging") ENCODE and DECODE are answered at once, succeeding or
 * refusing as the input says. After every event the actions are
 * drained and checked: every SEND decodes and fits a stream frame, no more
 * than ST_XCHG_CHUNKS_IN_FLIGHT are unacknowledged, APPLY comes at most
 * once, before DONE, with n_params finite values (FETCH) and DONE at most
 * once, with nothing after it. Never a crash, a leak or an overread.
 *
 *   CC=clang cmake -S . -B build-fuzz -DSTARLING_FUZZ=ON -DSTARLING_CUDA=OFF
 *   cmake --build build-fuzz --target fuzz_xchg
 *   ./build-fuzz/fuzz_xchg -max_total_time=60 /tmp/xc
 * tests/fuzz/corpus/fuzz_xchg
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/gossip.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#define MAX_FLOATS 64

typedef struct {
  st_xchg_t* x;
  uint64_t n;
  unsigned unacked;
  int applies, dones;
  bool asked;
  /* What the harness delivered as chunk bytes, for a right DONE hash. */
  st_hash_t rx;
  uint64_t rx_floats;
  uint64_t rx_bytes; /* XCHG_CODED bytes delivered */
  uint64_t coded_bytes;
  fuzz_in_t* in;
} harness_t;

/* ENCODE or DECODE, answered at once: the input picks a refusal or
 * success (a DECODE may even "succeed" with a NaN, which the machine must
 * still refuse). */
static void codec_work(harness_t* h, const st_xact_t* a) {
  CHECK(a->n == h->n && a->coded_len == h->coded_bytes);
  CHECK((a->work != NULL || a->n == 0) && a->coded != NULL);
  uint8_t b = fuzz_byte(h->in);
  for (size_t i = 0; i < a->n; i++)
    a->work[i] = (float) ((int) (b + i) % 17 - 8) / 4;
  if (a->kind == ST_XACT_ENCODE) {
    memset(a->coded, b, a->coded_len);
    CHECK(st_xchg_encoded(h->x, 1000, b % 8 == 7 ? -EINVAL : 0) == 0);
    return;
  }
  if (b == 0xfe && a->n > 0)
    a->work[0] = NAN;
  CHECK(st_xchg_decoded(h->x, 1000, b % 4 == 3 ? -EBADMSG : 0, b) == 0);
}

static void drain(harness_t* h) {
  st_xact_t a;
  while (st_xchg_next_action(h->x, &a)) {
    CHECK(h->dones == 0);
    switch (a.kind) {
      case ST_XACT_SEND: {
        CHECK(a.data != NULL && a.len > 0 &&
              a.len <= ST_WIRE_MAX_MESSAGE_BYTES);
        st_msg_t m;
        CHECK(st_wire_decode(a.data, a.len, &m, NULL) == 0);
        st_wire_msg_free(&m);
        h->unacked++;
        CHECK(h->unacked <= ST_XCHG_CHUNKS_IN_FLIGHT);
        break;
      }
      case ST_XACT_WANT_SNAPSHOT:
        h->asked = true;
        break;
      case ST_XACT_APPLY:
        CHECK(h->applies++ == 0);
        CHECK(a.n == h->n);
        CHECK(a.held ? a.values == NULL : a.values != NULL || a.n == 0);
        for (size_t i = 0; !a.held && i < a.n; i++)
          CHECK(isfinite(a.values[i]));
        break;
      case ST_XACT_ENCODE:
      case ST_XACT_DECODE:
        codec_work(h, &a);
        break;
      case ST_XACT_TIMER:
        break;
      case ST_XACT_DONE:
        h->dones++;
        CHECK((unsigned) a.result < ST_XCHG_RESULT_COUNT);
        CHECK(a.peer_model == NULL || strlen(a.peer_model) < ST_XCHG_MODEL_MAX);
        CHECK(st_xchg_finished(h->x));
        break;
    }
  }
}

static void feed(harness_t* h, const st_msg_t* m) {
  static uint8_t buf[4096];
  size_t len = 0;
  if (st_wire_encode(m, buf, sizeof buf, &len) != 0)
    return;
  CHECK(st_xchg_message(h->x, 1000, buf, len) == 0);
  (void) st_xchg_rx_room(h->x); /* a driver asks after every message */
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_in_t in = {data, size};
  st_xchg_config_t cfg;
  st_xchg_config_default(&cfg);
  cfg.timeout_ms = 1000;
  uint8_t clip = fuzz_byte(&in); /* robust averaging's bounds, or none */
  cfg.clip_norm = clip & 1 ? 0.5 : 0;
  cfg.clip_rel = clip & 2 ? 0.25 : 0;
  cfg.delta_in_own = clip & 4;             /* the delta made in place */
  cfg.rx_window_floats = clip & 8 ? 1 : 0; /* its window: one float */
  st_xchg_local_t l;
  memset(&l, 0, sizeof l);
  memset(l.fingerprint, 0x33, 16);
  strcpy(l.model, "mlp:4-4 f32");
  uint8_t role = fuzz_byte(&in);
  l.n_params = fuzz_byte(&in) % (MAX_FLOATS + 1);
  l.step = 5;
  if (role & 4) { /* a MISMATCH reply then carries this list */
    l.tensors = "w\tF32\t4\n";
    l.tensors_len = 8;
  }
  if (role & 8) { /* compressed, with an anchor of ours */
    l.coded_bytes = 8 + 2 * l.n_params;
    memset(l.anchor, 0x5a, sizeof l.anchor);
  }
  if (role & 16) { /* holding a start state: the snapshot of byte 0 */
    float held[MAX_FLOATS];
    for (size_t i = 0; i < MAX_FLOATS; i++)
      held[i] = (float) i / 8;
    l.has_held = true;
    memset(l.anchor, 0x5a, sizeof l.anchor);
    st_hash_t hh;
    st_hash_init(&hh);
    st_hash_update(&hh, held, (size_t) l.n_params * sizeof(float));
    st_hash_final(&hh, l.held_hash);
  }
  harness_t h;
  memset(&h, 0, sizeof h);
  h.in = &in;
  h.n = l.n_params;
  h.coded_bytes = l.coded_bytes;
  st_hash_init(&h.rx);
  int rc;
  switch (role % 4) {
    case 0:
    case 1:
      rc = st_xchg_new_responder(&cfg, &l, role % 4 == 1, 0, &h.x);
      break;
    case 2:
      rc = st_xchg_new_initiator(&cfg, ST_XCHG_AVERAGE, &l, 0, &h.x);
      break;
    default:
      rc = st_xchg_new_initiator(&cfg, ST_XCHG_FETCH, &l, 0, &h.x);
      break;
  }
  CHECK(rc == 0);
  drain(&h);
  uint64_t now = 0;
  float floats[MAX_FLOATS];
  while (in.left > 0) {
    uint8_t op = fuzz_byte(&in);
    st_msg_t m;
    memset(&m, 0, sizeof m);
    switch (op % 9) {
      case 0: { /* a raw frame */
        size_t len;
        const uint8_t* f = fuzz_frame(&in, &len);
        CHECK(st_xchg_message(h.x, now, f, len) == 0);
        break;
      }
      case 1:   /* XCHG_REQ */
      case 2: { /* XCHG_REPLY */
        uint8_t b = fuzz_byte(&in);
        uint8_t* fp =
            op % 9 == 1 ? m.u.xchg_req.fingerprint : m.u.xchg_reply.fingerprint;
        memcpy(fp, l.fingerprint, 16);
        if (b & 1)
          fp[0] ^= 1;
        uint64_t n = b & 2 ? l.n_params + 1 : l.n_params;
        /* Our anchor (a compressed exchange when we are compressed), or
         * another. */
        uint8_t* anchor =
            op % 9 == 1 ? m.u.xchg_req.anchor : m.u.xchg_reply.anchor;
        memset(anchor, b & 0x80 ? 0x5a : 0x11, ST_XCHG_ANCHOR_BYTES);
        if (op % 9 == 1) {
          m.type = ST_MSG_XCHG_REQ;
          m.u.xchg_req.kind = b & 4 ? ST_XCHG_FETCH : ST_XCHG_AVERAGE;
          strcpy(m.u.xchg_req.model, "peer");
          m.u.xchg_req.n_params = n;
        } else {
          m.type = ST_MSG_XCHG_REPLY;
          m.u.xchg_reply.status = (b >> 3) % 4;
          strcpy(m.u.xchg_reply.model, "peer");
          m.u.xchg_reply.n_params = n;
          m.u.xchg_reply.step = b;
          if (b & 0x40) {
            m.u.xchg_reply.tensors = "peer\tF32\t4\n";
            m.u.xchg_reply.tensors_len = 11;
          }
        }
        feed(&h, &m);
        break;
      }
      case 3: { /* TENSOR_CHUNK: the next floats, or anywhere */
        uint8_t b = fuzz_byte(&in), c = fuzz_byte(&in);
        if (b & 8) { /* XCHG_CODED: the next bytes, or anywhere */
          static uint8_t bytes[4 * MAX_FLOATS + 8];
          uint64_t total = b & 1 ? c : l.coded_bytes;
          uint64_t off = b & 2 ? c % (total + 1) : h.rx_bytes;
          size_t count = 1 + (size_t) (fuzz_byte(&in) % sizeof bytes);
          if (off >= total)
            break; /* no valid piece there */
          if (count > total - off)
            count = (size_t) (total - off);
          memset(bytes, c, count);
          m.type = ST_MSG_XCHG_CODED;
          m.u.xchg_coded.offset = off;
          m.u.xchg_coded.total = total;
          m.u.xchg_coded.data = bytes;
          m.u.xchg_coded.data_len = (uint32_t) count;
          h.rx_bytes += count;
          feed(&h, &m);
          break;
        }
        uint64_t total = b & 1 ? c : l.n_params;
        uint64_t off = b & 2 ? c % (total + 1) : h.rx_floats;
        size_t count = (size_t) (fuzz_byte(&in) % (MAX_FLOATS + 1));
        if (off > total)
          off = total;
        if (count > total - off)
          count = (size_t) (total - off);
        for (size_t i = 0; i < count; i++) {
          uint8_t v = fuzz_byte(&in);
          floats[i] = v == 0xff ? NAN : (float) (v - 128) / 16;
        }
        m.type = ST_MSG_TENSOR_CHUNK;
        m.u.chunk.transfer_id = b & 4 ? c : 0;
        m.u.chunk.offset = off;
        m.u.chunk.total = total;
        m.u.chunk.data = (const uint8_t*) floats;
        m.u.chunk.data_len = (uint32_t) (count * sizeof(float));
        st_hash_update(&h.rx, floats, count * sizeof(float));
        h.rx_floats += count;
        feed(&h, &m);
        break;
      }
      case 4: { /* XCHG_DONE, with the hash of what was sent, the held
                   state's, or another */
        m.type = ST_MSG_XCHG_DONE;
        uint8_t b = fuzz_byte(&in);
        if (b & 2) {
          memcpy(m.u.xchg_done.hash, l.held_hash, ST_HASH_BYTES);
        } else if (b & 1) {
          st_hash_t copy = h.rx;
          st_hash_final(&copy, m.u.xchg_done.hash);
        } else {
          m.u.xchg_done.hash[0] = fuzz_byte(&in);
        }
        feed(&h, &m);
        break;
      }
      case 5: { /* the snapshot */
        uint8_t b = fuzz_byte(&in);
        for (size_t i = 0; i < MAX_FLOATS; i++)
          floats[i] = (float) (b + i) / 8;
        if (b == 0xff)
          floats[0] = INFINITY;
        rc = st_xchg_snapshot(h.x, now, floats, (size_t) l.n_params, 7);
        CHECK(rc == 0 || (rc == -EINVAL && !h.asked));
        h.asked = false;
        break;
      }
      case 6: /* a frame written */
        rc = st_xchg_sent(h.x, now);
        if (h.unacked > 0) {
          CHECK(rc == 0);
          h.unacked--;
        } else {
          CHECK(rc == -EINVAL || st_xchg_finished(h.x));
        }
        break;
      case 7:
        now += fuzz_byte(&in) * 10u;
        CHECK(st_xchg_tick(h.x, now) == 0);
        break;
      default:
        CHECK(st_xchg_closed(h.x, now) == 0);
        break;
    }
    drain(&h);
  }
  st_xchg_free(h.x);
  return 0;
}
