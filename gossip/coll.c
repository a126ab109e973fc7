/* coll.c: the user collectives' machine (gossip.h, "User collectives"):
 * all-reduce, reduce, broadcast and barrier among n members, sans-IO.
 *
 * Words as in ring.c: chunk c of the vector covers elements
 * [c * count / n, (c + 1) * count / n); a segment is at most seg elements
 * of a chunk; the ring's step t = 0 .. 2n - 3 moves chunk (r - t) mod n
 * from member r to r + 1 (reduce-scatter for t < n - 1, then all-gather).
 * The chunk a member receives at step t is the one it sends at step t + 1,
 * so every received segment but those of the last step is forwarded as
 * soon as it is reduced (or copied), and the receive stream is checked
 * segment by segment against the one order the previous member can send
 * in. The broadcast chain is the same with one "step": the root sends the
 * whole vector's segments, each member forwards what it receives.
 *
 * Outgoing messages are queued as descriptors and encoded one at a time
 * when the driver takes them (st_coll_next_action), into one buffer, from
 * the machine's working vector: the driver takes every action after every
 * event, before the part of the vector they read can change.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/gossip.h"

typedef enum { Q_HELLO, Q_SEG, Q_ABORT, Q_DONE } qkind_t;

typedef struct {
  qkind_t kind;
  uint32_t to;
  uint8_t phase;
  uint32_t step;
  uint64_t offset, elems; /* Q_SEG: the range of the working vector */
  bool with_data;         /* Q_HELLO: carries the whole input */
  bool withdraw;          /* Q_ABORT: an empty reason (st_coll_withdraw) */
} qitem_t;

struct st_coll_s {
  st_coll_spec_t s;
  size_t esz;       /* element bytes */
  bool small;       /* the one-round path */
  uint8_t* buf;     /* count elements: own input, then the result */
  bool borrowed;    /* buf is the caller's (st_coll_new_in): not freed */
  uint8_t** got;    /* small path: each rank's contribution, or NULL */
  uint32_t got_n;   /* small path: contributions received; large: HELLOs */
  uint32_t need_n;  /* small path: contributions this member waits for */
  bool* hello_from; /* by rank: its HELLO came */
  uint64_t seg;     /* elements per segment */
  /* Large path, the receive stream: the expected next segment. */
  uint32_t prev, next; /* ranks; n when none */
  uint32_t t, t_end;   /* step expected, and one past the last */
  uint64_t k;          /* segment expected within that step's chunk */
  qitem_t* q;
  size_t q_head, q_len, q_cap;
  uint8_t* out; /* the encoded message last taken */
  size_t out_cap;
  bool done, have_result;
  bool forward; /* a peer's ABORT with a reason: pass it on (finish) */
  st_coll_result_t result;
  uint32_t culprit;
  char why[ST_COLL_REASON_MAX + 1];
};

static const char* const result_names[ST_COLL_RESULT_COUNT] = {
    "ok", "mismatch", "protocol", "peer", "aborted", "timeout"};
static const char* const kind_names[ST_COLL_KIND_COUNT] = {
    "all_reduce", "reduce", "broadcast", "barrier"};
static const char* const rop_names[ST_COLL_ROP_COUNT] = {"sum", "mean", "min",
                                                         "max"};

const char* st_coll_result_name(st_coll_result_t r) {
  return (unsigned) r < ST_COLL_RESULT_COUNT ? result_names[r] : "unknown";
}
const char* st_coll_kind_name(st_coll_kind_t k) {
  return (unsigned) k < ST_COLL_KIND_COUNT ? kind_names[k] : "unknown";
}
const char* st_coll_rop_name(st_coll_rop_t r) {
  return (unsigned) r < ST_COLL_ROP_COUNT ? rop_names[r] : "unknown";
}
const char* st_coll_dtype_name(st_coll_dtype_t t) {
  return t == ST_COLL_F32    ? "float32"
         : t == ST_COLL_F64  ? "float64"
         : t == ST_COLL_BF16 ? "bfloat16"
                             : "unknown";
}
size_t st_coll_elem_bytes(st_coll_dtype_t t) {
  return t == ST_COLL_F32    ? 4
         : t == ST_COLL_F64  ? 8
         : t == ST_COLL_BF16 ? 2
                             : 0;
}

void st_coll_spec_default(st_coll_spec_t* spec) {
  memset(spec, 0, sizeof(*spec));
  spec->kind = ST_COLL_ALL_REDUCE;
  spec->rop = ST_COLL_SUM;
  spec->dtype = ST_COLL_F32;
  spec->n = 1;
  spec->small_bytes = ST_COLL_SMALL_BYTES;
  spec->segment_bytes = ST_COLL_SEGMENT_BYTES;
}

/* ---- Queue and results ---------------------------------------------------
 */

static int push(st_coll_t* x, qitem_t it) {
  if (x->q_len == x->q_cap) {
    size_t cap = x->q_cap ? 2 * x->q_cap : 16;
    qitem_t* q = malloc(cap * sizeof(*q));
    if (q == NULL)
      return -ENOMEM;
    for (size_t i = 0; i < x->q_len; i++)
      q[i] = x->q[(x->q_head + i) % x->q_cap];
    free(x->q);
    x->q = q;
    x->q_head = 0;
    x->q_cap = cap;
  }
  x->q[(x->q_head + x->q_len++) % x->q_cap] = it;
  return 0;
}

static void finish(st_coll_t* x, st_coll_result_t r, uint32_t culprit,
                   const char* fmt, ...) __attribute__((format(printf, 4, 5)));

/* Ends the operation (once): on failure, ABORTs to every other member
 * (when a peer's ABORT is the cause, to all but that peer, and only when
 * it gave a reason: a withdrawal is not passed on); then DONE. Passing a
 * peer's ABORT on reaches the members it did not tell: a member that
 * found a mismatch tells its own group, which may not be everyone's. */
static void finish(st_coll_t* x, st_coll_result_t r, uint32_t culprit,
                   const char* fmt, ...) {
  if (x->done)
    return;
  x->done = true;
  x->result = r;
  x->culprit = culprit;
  x->why[0] = '\0';
  if (fmt != NULL) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->why, sizeof x->why, fmt, ap);
    va_end(ap);
  }
  /* A failure drops what was still to send: the others fail anyway. */
  if (r != ST_COLL_OK)
    x->q_len = 0;
  if (r != ST_COLL_OK && (r != ST_COLL_FAIL_PEER || x->forward))
    for (uint32_t i = 0; i < x->s.n; i++)
      if (i != x->s.rank && (r != ST_COLL_FAIL_PEER || i != culprit))
        (void) push(x, (qitem_t){.kind = Q_ABORT, .to = i});
  (void) push(x, (qitem_t){.kind = Q_DONE});
}

/* out op= in, n elements of the dtype. Element by element through memcpy:
 * in is borrowed from a received message and has no alignment. */
#define COMBINE(T)                                                            \
  static void combine_##T(st_coll_rop_t rop, uint8_t* out, const uint8_t* in, \
                          uint64_t n) {                                       \
    for (uint64_t i = 0; i < n; i++) {                                        \
      T o, a;                                                                 \
      memcpy(&o, out + i * sizeof(T), sizeof(T));                             \
      memcpy(&a, in + i * sizeof(T), sizeof(T));                              \
      o = rop == ST_COLL_MIN   ? (a < o ? a : o)                              \
          : rop == ST_COLL_MAX ? (a > o ? a : o)                              \
                               : o + a;                                       \
      memcpy(out + i * sizeof(T), &o, sizeof(T));                             \
    }                                                                         \
  }
COMBINE(float)
COMBINE(double)
#undef COMBINE

static float bf16_get(const uint8_t* p) {
  uint32_t u = (uint32_t) p[0] << 16 | (uint32_t) p[1] << 24;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Rounded to nearest even; a NaN stays a NaN (its top bits, quiet). */
static void bf16_put(uint8_t* p, float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    u |= 0x00400000u;
  else
    u += 0x7fffu + ((u >> 16) & 1u);
  p[0] = (uint8_t) (u >> 16);
  p[1] = (uint8_t) (u >> 24);
}

/* bfloat16: each pair in float32, the result rounded once. */
static void combine_bf16(st_coll_rop_t rop, uint8_t* out, const uint8_t* in,
                         uint64_t n) {
  for (uint64_t i = 0; i < n; i++) {
    float o = bf16_get(out + 2 * i), a = bf16_get(in + 2 * i);
    o = rop == ST_COLL_MIN   ? (a < o ? a : o)
        : rop == ST_COLL_MAX ? (a > o ? a : o)
                             : o + a;
    bf16_put(out + 2 * i, o);
  }
}

static void combine(const st_coll_t* x, uint8_t* out, const uint8_t* in,
                    uint64_t n) {
  if (x->s.dtype == ST_COLL_F64)
    combine_double(x->s.rop, out, in, n);
  else if (x->s.dtype == ST_COLL_BF16)
    combine_bf16(x->s.rop, out, in, n);
  else
    combine_float(x->s.rop, out, in, n);
}

/* MEAN: where a sum completes, divide it by n. */
static void finish_mean(const st_coll_t* x, uint8_t* p, uint64_t n) {
  if (x->s.rop != ST_COLL_MEAN || x->s.kind == ST_COLL_BARRIER)
    return;
  for (uint64_t i = 0; i < n; i++) {
    if (x->s.dtype == ST_COLL_F64) {
      double v;
      memcpy(&v, p + 8 * i, 8);
      v /= (double) x->s.n;
      memcpy(p + 8 * i, &v, 8);
    } else if (x->s.dtype == ST_COLL_BF16) {
      bf16_put(p + 2 * i, bf16_get(p + 2 * i) / (float) x->s.n);
    } else {
      float v;
      memcpy(&v, p + 4 * i, 4);
      v /= (float) x->s.n;
      memcpy(p + 4 * i, &v, 4);
    }
  }
}

/* Success: the result is the working vector, for those who keep one. */
static void complete(st_coll_t* x) {
  const st_coll_spec_t* s = &x->s;
  x->have_result = s->kind == ST_COLL_ALL_REDUCE ||
                   s->kind == ST_COLL_BROADCAST ||
                   (s->kind == ST_COLL_REDUCE && s->rank == s->root);
  finish(x, ST_COLL_OK, s->n, NULL);
}

/* ---- Geometry ------------------------------------------------------------
 */

static uint32_t mod(int64_t a, uint32_t n) {
  int64_t r = a % (int64_t) n;
  return (uint32_t) (r < 0 ? r + n : r);
}

static uint64_t chunk_lo(const st_coll_t* x, uint32_t c) {
  return (uint64_t) c * x->s.count / x->s.n;
}

static uint64_t chunk_len(const st_coll_t* x, uint32_t c) {
  return chunk_lo(x, c + 1) - chunk_lo(x, c);
}

static bool is_chain(const st_coll_t* x) {
  return x->s.kind == ST_COLL_BROADCAST;
}

/* The chunk received at step t (the ring), or the whole vector (chain). */
static uint32_t recv_chunk(const st_coll_t* x, uint32_t t) {
  return mod((int64_t) x->s.rank - 1 - t, x->s.n);
}

static void step_range(const st_coll_t* x, uint32_t t, uint32_t chunk,
                       uint64_t* lo, uint64_t* len) {
  (void) t;
  if (is_chain(x)) {
    *lo = 0;
    *len = x->s.count;
  } else {
    *lo = chunk_lo(x, chunk);
    *len = chunk_len(x, chunk);
  }
}

static uint64_t segs_of(const st_coll_t* x, uint64_t len) {
  return (len + x->seg - 1) / x->seg;
}

/* Queues segment k of [lo, lo + len) as step t of the send stream. */
static int send_seg(st_coll_t* x, uint32_t t, uint64_t lo, uint64_t len,
                    uint64_t k) {
  uint64_t off = k * x->seg, e = len - off < x->seg ? len - off : x->seg;
  uint8_t phase = is_chain(x)      ? ST_COLL_PHASE_CHAIN
                  : t < x->s.n - 1 ? ST_COLL_PHASE_RS
                                   : ST_COLL_PHASE_AG;
  uint32_t step = phase == ST_COLL_PHASE_AG ? t - (x->s.n - 1) : t;
  return push(x, (qitem_t){.kind = Q_SEG,
                           .to = x->next,
                           .phase = phase,
                           .step = step,
                           .offset = lo + off,
                           .elems = e});
}

/* Skips steps whose chunk is empty; the receive stream ends at t_end. */
static void skip_empty(st_coll_t* x) {
  while (x->t < x->t_end) {
    uint64_t lo, len;
    step_range(x, x->t, recv_chunk(x, x->t), &lo, &len);
    if (len > 0)
      break;
    x->t++;
  }
}

/* ---- Start ---------------------------------------------------------------
 */

/* Small path: whether member `from`'s HELLO to `to` carries its input. */
static bool sends_data(const st_coll_t* x, uint32_t from, uint32_t to) {
  const st_coll_spec_t* s = &x->s;
  return s->kind == ST_COLL_ALL_REDUCE || s->kind == ST_COLL_BARRIER ||
         (s->kind == ST_COLL_REDUCE && to == s->root) ||
         (s->kind == ST_COLL_BROADCAST && from == s->root);
}

/* Every member sends a HELLO to every other (with its input where that
 * member needs it), on both paths: so that each one checks the others'
 * calls against its own, and the daemon sees every member's call when two
 * wait on calls over different lists (daemon_coll.c, crossed_call). */
static int start_small(st_coll_t* x) {
  const st_coll_spec_t* s = &x->s;
  x->got = calloc(s->n, sizeof(*x->got));
  if (x->got == NULL)
    return -ENOMEM;
  bool root = s->rank == s->root;
  bool all = s->kind == ST_COLL_ALL_REDUCE || s->kind == ST_COLL_BARRIER;
  for (uint32_t i = 0; i < s->n; i++)
    if (i != s->rank &&
        push(x, (qitem_t){.kind = Q_HELLO,
                          .to = i,
                          .with_data = sends_data(x, s->rank, i)}) != 0)
      return -ENOMEM;
  x->need_n = all                         ? s->n - 1
              : s->kind == ST_COLL_REDUCE ? (root ? s->n - 1 : 0)
                                          : (root ? 0 : 1);
  if (x->need_n == 0)
    complete(x);
  return 0;
}

/* Large path: the receive stream ended and every HELLO this member waits
 * for came: on the ring, every member's (all of them take part); on the
 * chain, its predecessor's (the root waits for nobody). */
static bool large_ended(const st_coll_t* x) {
  if (x->t < x->t_end)
    return false;
  return is_chain(x) ? x->prev == x->s.n || x->hello_from[x->prev]
                     : x->got_n == x->s.n - 1;
}

static int start_large(st_coll_t* x) {
  const st_coll_spec_t* s = &x->s;
  if (is_chain(x)) {
    uint32_t pos = mod((int64_t) s->rank - s->root, s->n);
    x->prev = pos == 0 ? s->n : mod((int64_t) s->rank - 1, s->n);
    x->next = pos == s->n - 1 ? s->n : (s->rank + 1) % s->n;
    x->t_end = pos == 0 ? 0 : 1;
  } else {
    x->prev = mod((int64_t) s->rank - 1, s->n);
    x->next = (s->rank + 1) % s->n;
    x->t_end = 2 * (s->n - 1);
  }
  /* HELLOs to all first (see start_small); the one to next precedes
   * our segments to it. */
  for (uint32_t i = 0; i < s->n; i++)
    if (i != s->rank && push(x, (qitem_t){.kind = Q_HELLO, .to = i}) != 0)
      return -ENOMEM;
  if (x->next < s->n) {
    /* Step 0: our own chunk (the root's whole vector on the chain). */
    if (!is_chain(x) || x->prev == s->n) {
      uint64_t lo, len;
      step_range(x, 0, is_chain(x) ? 0 : s->rank, &lo, &len);
      for (uint64_t k = 0; k < segs_of(x, len); k++)
        if (send_seg(x, 0, lo, len, k) != 0)
          return -ENOMEM;
    }
  }
  skip_empty(x);
  if (large_ended(x))
    complete(x);
  return 0;
}

static bool spec_ok(const st_coll_spec_t* s) {
  return (unsigned) s->kind < ST_COLL_KIND_COUNT &&
         (unsigned) s->rop < ST_COLL_ROP_COUNT &&
         st_coll_elem_bytes(s->dtype) != 0 && s->n >= 1 &&
         s->n <= ST_COLL_MAX_MEMBERS && s->rank < s->n && s->root < s->n &&
         s->count <= ST_COLL_MAX_COUNT &&
         (s->kind != ST_COLL_BARRIER || s->count == 1) &&
         s->segment_bytes >= 8 && s->segment_bytes % 8 == 0 &&
         s->segment_bytes <= ST_WIRE_CHUNK_MAX_BYTES;
}

/* st_coll_new and st_coll_new_in: work (borrowed) or a buffer of its own
 * holding a copy of input. */
static int make(const st_coll_spec_t* spec, void* work, const void* input,
                st_coll_t** out) {
  if (spec == NULL || out == NULL || !spec_ok(spec))
    return -EINVAL;
  *out = NULL;
  st_coll_t* x = calloc(1, sizeof(*x));
  if (x == NULL)
    return -ENOMEM;
  x->s = *spec;
  x->esz = st_coll_elem_bytes(spec->dtype);
  uint64_t bytes = spec->count * x->esz;
  x->small = spec->kind == ST_COLL_BARRIER ||
             (bytes <= spec->small_bytes && spec->n <= ST_COLL_SMALL_MEMBERS);
  x->seg = spec->segment_bytes / x->esz;
  x->prev = x->next = spec->n;
  x->borrowed = work != NULL;
  x->buf = work != NULL ? work : calloc(bytes > 0 ? bytes : 1, 1);
  x->hello_from = calloc(spec->n, sizeof(bool));
  int rc = x->buf != NULL && x->hello_from != NULL ? 0 : -ENOMEM;
  if (rc == 0 && work == NULL && input != NULL && spec->kind != ST_COLL_BARRIER)
    memcpy(x->buf, input, bytes);
  if (rc == 0 && spec->n == 1)
    complete(x); /* alone: the input is the result (a mean of one) */
  else if (rc == 0)
    rc = x->small ? start_small(x) : start_large(x);
  if (rc != 0) {
    st_coll_free(x);
    return rc;
  }
  *out = x;
  return 0;
}

int st_coll_new(const st_coll_spec_t* spec, const void* input,
                st_coll_t** out) {
  return make(spec, NULL, input, out);
}

int st_coll_new_in(const st_coll_spec_t* spec, void* buf, st_coll_t** out) {
  if (spec == NULL || out == NULL)
    return -EINVAL;
  if (spec->kind == ST_COLL_BARRIER || spec->count == 0 || buf == NULL)
    return make(spec, NULL, buf, out); /* nothing to work in */
  return make(spec, buf, NULL, out);
}

void st_coll_free(st_coll_t* x) {
  if (x == NULL)
    return;
  if (x->got != NULL)
    for (uint32_t i = 0; i < x->s.n; i++)
      free(x->got[i]);
  free(x->got);
  free(x->hello_from);
  if (!x->borrowed)
    free(x->buf);
  free(x->q);
  free(x->out);
  free(x);
}

/* ---- Receiving -----------------------------------------------------------
 */

/* Names what a HELLO's sender called when it differs from ours. */
static bool hello_matches(st_coll_t* x, uint32_t from,
                          const st_msg_coll_hello_t* h) {
  const st_coll_spec_t* s = &x->s;
  if (h->kind == s->kind && h->rop == s->rop && h->dtype == s->dtype &&
      h->root == s->root && h->count == s->count && h->n == s->n &&
      h->members_hash == s->members_hash)
    return true;
  finish(x, ST_COLL_FAIL_MISMATCH, from,
         "rank %u called %s(%s, root %u) of %llu %s in a group of %u "
         "(members %016llx); rank %u (this member) called %s(%s, root %u) of "
         "%llu %s in a group of %u (members %016llx)",
         from, st_coll_kind_name(h->kind), st_coll_rop_name(h->rop), h->root,
         (unsigned long long) h->count, st_coll_dtype_name(h->dtype), h->n,
         (unsigned long long) h->members_hash, s->rank,
         st_coll_kind_name(s->kind), st_coll_rop_name(s->rop), s->root,
         (unsigned long long) s->count, st_coll_dtype_name(s->dtype), s->n,
         (unsigned long long) s->members_hash);
  return false;
}

/* The small path's result: every contribution reduced in rank order. */
static void reduce_small(st_coll_t* x) {
  const st_coll_spec_t* s = &x->s;
  uint64_t bytes = s->count * x->esz;
  bool keeps = s->kind == ST_COLL_ALL_REDUCE ||
               (s->kind == ST_COLL_REDUCE && s->rank == s->root);
  if (keeps) {
    x->got[s->rank] = x->buf; /* borrowed for the loop */
    uint8_t* acc = malloc(bytes > 0 ? bytes : 1);
    if (acc == NULL) {
      x->got[s->rank] = NULL;
      finish(x, ST_COLL_FAIL_ABORTED, s->n, "out of memory");
      return;
    }
    memcpy(acc, x->got[0], bytes);
    for (uint32_t i = 1; i < s->n; i++)
      combine(x, acc, x->got[i], s->count);
    finish_mean(x, acc, s->count);
    x->got[s->rank] = NULL;
    if (x->borrowed) {
      memcpy(x->buf, acc, bytes);
      free(acc);
    } else {
      free(x->buf);
      x->buf = acc;
    }
  } else if (s->kind == ST_COLL_BROADCAST && s->rank != s->root) {
    memcpy(x->buf, x->got[s->root], bytes);
  }
  complete(x);
}

static void on_hello(st_coll_t* x, uint32_t from,
                     const st_msg_coll_hello_t* h) {
  if (!hello_matches(x, from, h))
    return;
  if (x->hello_from[from]) {
    finish(x, ST_COLL_FAIL_PROTOCOL, from, "rank %u sent a second HELLO", from);
    return;
  }
  x->hello_from[from] = true;
  bool data = x->small && sends_data(x, from, x->s.rank);
  uint64_t bytes = data ? x->s.count * x->esz : 0;
  if (h->data_len != bytes) {
    finish(x, ST_COLL_FAIL_PROTOCOL, from,
           "rank %u sent %u bytes of data, %llu expected", from, h->data_len,
           (unsigned long long) bytes);
    return;
  }
  if (!x->small) {
    x->got_n++;
    if (large_ended(x))
      complete(x);
    return;
  }
  if (!data)
    return;
  x->got_n++;
  x->got[from] = malloc(bytes > 0 ? bytes : 1);
  if (x->got[from] == NULL) {
    finish(x, ST_COLL_FAIL_ABORTED, x->s.n, "out of memory");
    return;
  }
  memcpy(x->got[from], h->data, bytes);
  if (x->got_n == x->need_n)
    reduce_small(x);
}

/* The large path's receive stream: the segment must be exactly the next. */
static void on_seg(st_coll_t* x, uint32_t from, const st_msg_coll_seg_t* g) {
  const st_coll_spec_t* s = &x->s;
  uint32_t t = x->t;
  uint64_t lo = 0, len = 0;
  if (t < x->t_end)
    step_range(x, t, recv_chunk(x, t), &lo, &len);
  uint64_t off = x->k * x->seg, e = len - off < x->seg ? len - off : x->seg;
  uint8_t phase = is_chain(x)    ? ST_COLL_PHASE_CHAIN
                  : t < s->n - 1 ? ST_COLL_PHASE_RS
                                 : ST_COLL_PHASE_AG;
  uint32_t step = phase == ST_COLL_PHASE_AG ? t - (s->n - 1) : t;
  if (from != x->prev || !x->hello_from[from] || t >= x->t_end ||
      g->phase != phase || g->step != step || g->offset != lo + off ||
      g->data_len != e * x->esz) {
    finish(x, ST_COLL_FAIL_PROTOCOL, from,
           "rank %u sent segment (phase %u, step %u, offset %llu, %u bytes) "
           "out of order",
           from, g->phase, g->step, (unsigned long long) g->offset,
           g->data_len);
    return;
  }
  uint8_t* dst = x->buf + (lo + off) * x->esz;
  if (phase == ST_COLL_PHASE_RS) {
    combine(x, dst, g->data, e);
    if (t == s->n - 2)
      finish_mean(x, dst, e);
  } else {
    memcpy(dst, g->data, e * x->esz);
  }
  bool last_step = is_chain(x) ? x->next == s->n : t == x->t_end - 1;
  if (!last_step && send_seg(x, is_chain(x) ? 0 : t + 1, lo, len, x->k) != 0) {
    finish(x, ST_COLL_FAIL_ABORTED, s->n, "out of memory");
    return;
  }
  if (++x->k == segs_of(x, len)) {
    x->k = 0;
    x->t++;
    skip_empty(x);
  }
  if (large_ended(x))
    complete(x);
}

int st_coll_message(st_coll_t* x, uint32_t from, const st_msg_t* msg) {
  if (x == NULL || msg == NULL || from >= x->s.n || from == x->s.rank)
    return -EINVAL;
  uint64_t op;
  switch (msg->type) {
    case ST_MSG_COLL_HELLO:
      op = msg->u.coll_hello.op_id;
      break;
    case ST_MSG_COLL_SEG:
      op = msg->u.coll_seg.op_id;
      break;
    case ST_MSG_COLL_ABORT:
      op = msg->u.coll_abort.op_id;
      break;
    default:
      return -EINVAL;
  }
  if (op != x->s.op_id)
    return -EINVAL;
  if (x->done)
    return 0;
  if (msg->type == ST_MSG_COLL_ABORT) {
    const st_msg_coll_abort_t* a = &msg->u.coll_abort;
    x->forward = a->reason_len > 0;
    if (a->reason_len == 0)
      finish(x, ST_COLL_FAIL_PEER, from,
             "rank %u withdrew its call: it timed out before it heard from "
             "any member",
             from);
    else
      finish(x, ST_COLL_FAIL_PEER, from, "rank %u failed the operation: %.*s",
             from, (int) a->reason_len, a->reason);
  } else if (msg->type == ST_MSG_COLL_HELLO) {
    on_hello(x, from, &msg->u.coll_hello);
  } else if (x->small) {
    finish(x, ST_COLL_FAIL_PROTOCOL, from,
           "rank %u sent a segment to an operation that has none", from);
  } else {
    on_seg(x, from, &msg->u.coll_seg);
  }
  return 0;
}

int st_coll_withdraw(st_coll_t* x, const char* why) {
  if (x == NULL || x->done)
    return -EINVAL;
  for (uint32_t r = 0; r < x->s.n; r++)
    if (x->hello_from[r])
      return -EBUSY;
  /* finish() would send ABORTs with our sentence: these carry none. */
  x->q_len = 0;
  for (uint32_t i = 0; i < x->s.n; i++)
    if (i != x->s.rank &&
        push(x, (qitem_t){.kind = Q_ABORT, .to = i, .withdraw = true}) != 0)
      return -ENOMEM;
  x->done = true;
  x->result = ST_COLL_FAIL_TIMEOUT;
  x->culprit = x->s.n;
  snprintf(x->why, sizeof x->why, "%s", why != NULL ? why : "");
  return push(x, (qitem_t){.kind = Q_DONE});
}

int st_coll_abort(st_coll_t* x, st_coll_result_t reason, uint32_t culprit,
                  const char* why) {
  if (x == NULL ||
      (reason != ST_COLL_FAIL_ABORTED && reason != ST_COLL_FAIL_TIMEOUT &&
       reason != ST_COLL_FAIL_MISMATCH))
    return -EINVAL;
  finish(x, reason, culprit <= x->s.n ? culprit : x->s.n, "%s",
         why != NULL ? why : "");
  return 0;
}

/* ---- Actions -------------------------------------------------------------
 */

static int encode(st_coll_t* x, const qitem_t* it, size_t* len) {
  st_msg_t m;
  memset(&m, 0, sizeof m);
  size_t data = 0;
  if (it->kind == Q_HELLO) {
    st_msg_coll_hello_t* h = &m.u.coll_hello;
    m.type = ST_MSG_COLL_HELLO;
    *h = (st_msg_coll_hello_t){.op_id = x->s.op_id,
                               .kind = (uint8_t) x->s.kind,
                               .rop = (uint8_t) x->s.rop,
                               .dtype = (uint8_t) x->s.dtype,
                               .root = x->s.root,
                               .count = x->s.count,
                               .n = x->s.n,
                               .members_hash = x->s.members_hash};
    if (it->with_data) {
      h->data = x->buf;
      h->data_len = (uint32_t) (x->s.count * x->esz);
      data = h->data_len;
    }
  } else if (it->kind == Q_SEG) {
    m.type = ST_MSG_COLL_SEG;
    m.u.coll_seg =
        (st_msg_coll_seg_t){.op_id = x->s.op_id,
                            .phase = it->phase,
                            .step = it->step,
                            .offset = it->offset,
                            .data = x->buf + it->offset * x->esz,
                            .data_len = (uint32_t) (it->elems * x->esz)};
    data = m.u.coll_seg.data_len;
  } else {
    m.type = ST_MSG_COLL_ABORT;
    size_t n = it->withdraw ? 0 : strlen(x->why);
    m.u.coll_abort = (st_msg_coll_abort_t){
        .op_id = x->s.op_id, .reason = x->why, .reason_len = (uint32_t) n};
    data = n;
  }
  size_t cap = data + 128;
  if (cap > x->out_cap) {
    uint8_t* p = realloc(x->out, cap);
    if (p == NULL)
      return -ENOMEM;
    x->out = p;
    x->out_cap = cap;
  }
  return st_wire_encode(&m, x->out, x->out_cap, len);
}

bool st_coll_next_action(st_coll_t* x, st_cact_t* out) {
  while (x != NULL && x->q_len > 0) {
    qitem_t it = x->q[x->q_head];
    x->q_head = (x->q_head + 1) % x->q_cap;
    x->q_len--;
    memset(out, 0, sizeof(*out));
    if (it.kind == Q_DONE) {
      out->kind = ST_CACT_DONE;
      out->result = x->result;
      out->culprit = x->culprit;
      out->why = x->why;
      return true;
    }
    size_t len = 0;
    if (encode(x, &it, &len) != 0) {
      /* Unreachable with a valid spec: the buffer fits every message. */
      finish(x, ST_COLL_FAIL_ABORTED, x->s.n, "cannot encode a message");
      continue;
    }
    out->kind = ST_CACT_SEND;
    out->to = it.to;
    out->data = x->out;
    out->len = len;
    return true;
  }
  return false;
}

bool st_coll_next_is_segment(const st_coll_t* x, uint32_t* to) {
  if (x == NULL || x->q_len == 0 || x->q[x->q_head].kind != Q_SEG)
    return false;
  *to = x->q[x->q_head].to;
  return true;
}

bool st_coll_finished(const st_coll_t* x) {
  return x != NULL && x->done;
}

bool st_coll_heard(const st_coll_t* x, uint32_t r) {
  return x != NULL && r < x->s.n && x->hello_from[r];
}

const void* st_coll_result(const st_coll_t* x) {
  return x != NULL && x->done && x->result == ST_COLL_OK && x->have_result
             ? x->buf
             : NULL;
}
