/* test_gossip_coll.c: the Check suite for the user collectives' machine
 * (gossip/coll.c; the contract in gossip.h, "User collectives"). n
 * machines are wired through in-memory links, one FIFO of encoded frames
 * per ordered pair (as one TCP stream per direction), and driven in random
 * interleavings from the suite's seeded generator: members are created
 * (called) at random moments, and each turn delivers the oldest frame of a
 * random non-empty link, decoded as the daemon decodes it.
 *
 * Checked: all-reduce (sum, mean, min, max; float32 and float64) on both
 * paths (small, and the ring with segments of a few elements) for 1 to 9
 * members and sizes 0, 1, fewer than members, and more; every member's
 * result bit-identical and within (n + 2) u sum|x| of the float64 value
 * (u: the dtype's unit roundoff); reduce (the root alone has a result);
 * broadcast (everyone ends with the root's bits, chain and direct);
 * barrier (nobody finishes before the last member arrives); a mismatch in
 * count, kind, root, dtype or group fails every member and names the
 * other call; a driver's abort on one member fails all the others (PEER);
 * an out-of-order or foreign segment fails; the codec round-trips and
 * refuses fields out of range; misuse. */
#include <check.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/gossip.h"
#include "tests/unit/testutil.h"

#define MAXN 9
#define OP 0x0c011ec7u

static st_rng_t rng;

static void setup(void) {
  st_rng_seed(&rng, tu_seed());
}

typedef struct frame_s {
  uint8_t* p;
  size_t len;
  struct frame_s* next;
} frame_t;

typedef struct {
  frame_t *head, *tail;
  size_t n;
} link_t;

typedef struct {
  int n;
  st_coll_spec_t spec[MAXN];
  void* input[MAXN];
  bool in_place; /* st_coll_new_in on a copy of the input in work[] */
  void* work[MAXN];
  st_coll_t* m[MAXN];
  bool created[MAXN], held[MAXN], done[MAXN];
  st_coll_result_t result[MAXN];
  char why[MAXN][ST_COLL_REASON_MAX + 1];
  int done_order[MAXN], n_done;
  int created_n;
  link_t link[MAXN][MAXN]; /* [from][to] */
} net_t;

static void drain(net_t* w, int r) {
  st_cact_t a;
  while (st_coll_next_action(w->m[r], &a)) {
    if (a.kind == ST_CACT_SEND) {
      ck_assert_uint_lt(a.to, (unsigned) w->n);
      ck_assert_uint_ne(a.to, (unsigned) r);
      frame_t* f = calloc(1, sizeof(*f));
      f->p = malloc(a.len);
      memcpy(f->p, a.data, a.len);
      f->len = a.len;
      link_t* l = &w->link[r][a.to];
      if (l->tail != NULL)
        l->tail->next = f;
      else
        l->head = f;
      l->tail = f;
      l->n++;
    } else {
      ck_assert(!w->done[r]);
      w->done[r] = true;
      w->result[r] = a.result;
      snprintf(w->why[r], sizeof w->why[r], "%s", a.why);
      w->done_order[w->n_done++] = r;
    }
  }
}

static void create(net_t* w, int r) {
  if (w->in_place) {
    size_t bytes = w->spec[r].count * st_coll_elem_bytes(w->spec[r].dtype);
    w->work[r] = malloc(bytes + 1);
    if (w->input[r] != NULL)
      memcpy(w->work[r], w->input[r], bytes);
    ck_assert_int_eq(st_coll_new_in(&w->spec[r], w->work[r], &w->m[r]), 0);
  } else {
    ck_assert_int_eq(st_coll_new(&w->spec[r], w->input[r], &w->m[r]), 0);
  }
  w->created[r] = true;
  w->created_n++;
  drain(w, r);
}

/* One frame from `from` to `to`, decoded; frames to members not yet
 * created wait (the daemon keeps them until the call comes). */
static void deliver(net_t* w, int from, int to) {
  link_t* l = &w->link[from][to];
  frame_t* f = l->head;
  l->head = f->next;
  if (l->head == NULL)
    l->tail = NULL;
  l->n--;
  st_msg_t msg;
  ck_assert_int_eq(st_wire_decode(f->p, f->len, &msg, NULL), 0);
  ck_assert_int_eq(st_coll_message(w->m[to], (uint32_t) from, &msg), 0);
  st_wire_msg_free(&msg);
  free(f->p);
  free(f);
  drain(w, to);
}

/* Runs until nothing moves: creates the members at random turns and
 * delivers frames in a random order. */
static void run(net_t* w) {
  for (;;) {
    int cand[MAXN * MAXN + MAXN][2], nc = 0;
    for (int r = 0; r < w->n; r++)
      if (!w->created[r] && !w->held[r])
        cand[nc][0] = -1, cand[nc++][1] = r;
    for (int a = 0; a < w->n; a++)
      for (int b = 0; b < w->n; b++)
        if (w->link[a][b].n > 0 && w->created[b])
          cand[nc][0] = a, cand[nc++][1] = b;
    if (nc == 0)
      return;
    int i = (int) st_rng_below(&rng, (uint64_t) nc);
    if (cand[i][0] < 0)
      create(w, cand[i][1]);
    else
      deliver(w, cand[i][0], cand[i][1]);
  }
}

static void net_free(net_t* w) {
  for (int a = 0; a < w->n; a++) {
    st_coll_free(w->m[a]);
    free(w->input[a]);
    free(w->work[a]);
    for (int b = 0; b < w->n; b++)
      for (frame_t* f = w->link[a][b].head; f != NULL;) {
        frame_t* nx = f->next;
        free(f->p);
        free(f);
        f = nx;
      }
  }
}

static void net_init(net_t* w, int n, st_coll_kind_t kind, st_coll_rop_t rop,
                     st_coll_dtype_t dt, uint64_t count, uint32_t seg_bytes) {
  memset(w, 0, sizeof(*w));
  w->n = n;
  size_t e = st_coll_elem_bytes(dt);
  for (int r = 0; r < n; r++) {
    st_coll_spec_t* s = &w->spec[r];
    st_coll_spec_default(s);
    s->op_id = OP;
    s->kind = kind;
    s->rop = rop;
    s->dtype = dt;
    s->count = kind == ST_COLL_BARRIER ? 1 : count;
    s->n = (uint32_t) n;
    s->rank = (uint32_t) r;
    s->root = kind == ST_COLL_REDUCE || kind == ST_COLL_BROADCAST
                  ? (uint32_t) (n - 1) / 2
                  : 0;
    s->members_hash = 0xabcdef;
    if (seg_bytes)
      s->segment_bytes = seg_bytes;
    if (kind == ST_COLL_BARRIER)
      continue;
    w->input[r] = malloc(count * e + 1);
    double scale = 1.0 + (double) r;
    for (uint64_t i = 0; i < count; i++) {
      double v = (st_rng_uniform(&rng) * 2 - 1) * scale;
      if (dt == ST_COLL_F64) {
        ((double*) w->input[r])[i] = v;
      } else if (dt == ST_COLL_BF16) {
        float f = (float) v; /* truncated to bfloat16: exact in it */
        uint32_t u;
        memcpy(&u, &f, 4);
        uint16_t b = (uint16_t) (u >> 16);
        memcpy((uint8_t*) w->input[r] + 2 * i, &b, 2);
      } else {
        ((float*) w->input[r])[i] = (float) v;
      }
    }
  }
}

/* Element i of a vector of the dtype, as a double. */
static double elem(st_coll_dtype_t dt, const void* p, uint64_t i) {
  if (dt == ST_COLL_F64)
    return ((const double*) p)[i];
  if (dt == ST_COLL_BF16) {
    uint16_t b;
    memcpy(&b, (const uint8_t*) p + 2 * i, 2);
    uint32_t u = (uint32_t) b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  return ((const float*) p)[i];
}

static double in_at(const net_t* w, int r, uint64_t i) {
  return elem(w->spec[r].dtype, w->input[r], i);
}

/* The float64 value of element i and the bound on its error. */
static void reference(const net_t* w, uint64_t i, double* v, double* bound) {
  const st_coll_spec_t* s = &w->spec[0];
  double acc = in_at(w, 0, i), abs_sum = fabs(acc);
  for (int r = 1; r < w->n; r++) {
    double x = in_at(w, r, i);
    abs_sum += fabs(x);
    if (s->rop == ST_COLL_MIN)
      acc = x < acc ? x : acc;
    else if (s->rop == ST_COLL_MAX)
      acc = x > acc ? x : acc;
    else
      acc += x;
  }
  /* Unit roundoff; bfloat16 keeps 8 significant bits. */
  double u = s->dtype == ST_COLL_F64    ? DBL_EPSILON / 2
             : s->dtype == ST_COLL_BF16 ? ldexp(1.0, -8)
                                        : FLT_EPSILON / 2;
  *bound = (w->n + 2) * u * abs_sum;
  if (s->rop == ST_COLL_MEAN) {
    acc /= w->n;
    *bound /= w->n;
  }
  if (s->rop == ST_COLL_MIN || s->rop == ST_COLL_MAX)
    *bound = 0;
  *v = acc;
}

static void check_reduced(net_t* w) {
  const st_coll_spec_t* s = &w->spec[0];
  size_t bytes = s->count * st_coll_elem_bytes(s->dtype);
  const void* first = NULL;
  for (int r = 0; r < w->n; r++) {
    ck_assert_msg(w->done[r] && w->result[r] == ST_COLL_OK,
                  "n=%d count=%llu rank %d: %s %s", w->n,
                  (unsigned long long) s->count, r,
                  st_coll_result_name(w->result[r]), w->why[r]);
    const void* res = st_coll_result(w->m[r]);
    bool keeps = s->kind == ST_COLL_ALL_REDUCE || (int) s->root == r;
    ck_assert(keeps == (res != NULL));
    if (res == NULL)
      continue;
    if (first == NULL)
      first = res;
    ck_assert(memcmp(first, res, bytes) == 0);
  }
  for (uint64_t i = 0; i < s->count; i++) {
    double v, bound;
    reference(w, i, &v, &bound);
    double got = elem(s->dtype, first, i);
    ck_assert_msg(fabs(got - v) <= bound * 1.0000001 + 1e-300,
                  "n=%d %s element %llu: %.17g vs %.17g (bound %g)", w->n,
                  st_coll_rop_name(s->rop), (unsigned long long) i, got, v,
                  bound);
  }
}

START_TEST(test_all_reduce) {
  const uint64_t counts[] = {0, 1, 3, 1000, 20011};
  for (int n = 1; n <= MAXN; n += (n < 4 ? 1 : 4))
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
      for (int rop = 0; rop < ST_COLL_ROP_COUNT; rop++)
        for (int dt = 0; dt < ST_COLL_DTYPE_COUNT; dt++) {
          net_t w;
          /* Small segments (the ring path: 20011 float32 are 78 KiB). */
          net_init(&w, n, ST_COLL_ALL_REDUCE, rop, dt, counts[c],
                   (c == 4 && rop == 0) ? 8 * 37 : 0);
          run(&w);
          check_reduced(&w);
          net_free(&w);
        }
}
END_TEST

/* bfloat16 on the ring (50000 elements: 98 KiB), every reduction, within
 * the bound of a rounding per combine (gossip.h, st_coll_dtype_t). */
START_TEST(test_all_reduce_bf16_ring) {
  for (int n = 2; n <= 5; n += 3)
    for (int rop = 0; rop < ST_COLL_ROP_COUNT; rop++) {
      net_t w;
      net_init(&w, n, ST_COLL_ALL_REDUCE, rop, ST_COLL_BF16, 50000, 4096);
      run(&w);
      check_reduced(&w);
      net_free(&w);
    }
}
END_TEST

START_TEST(test_reduce) {
  for (int n = 1; n <= 7; n += 3)
    for (int big = 0; big < 2; big++) {
      net_t w;
      net_init(&w, n, ST_COLL_REDUCE, ST_COLL_SUM, ST_COLL_F64,
               big ? 30000 : 100, big ? 8 * 1000 : 0);
      run(&w);
      check_reduced(&w);
      net_free(&w);
    }
}
END_TEST

START_TEST(test_broadcast) {
  for (int n = 1; n <= 8; n++)
    for (int big = 0; big < 2; big++) {
      net_t w;
      uint64_t count = big ? 100003 : 500;
      net_init(&w, n, ST_COLL_BROADCAST, ST_COLL_SUM, ST_COLL_F32, count,
               big ? 4 * 998 : 0);
      run(&w);
      uint32_t root = w.spec[0].root;
      for (int r = 0; r < n; r++) {
        ck_assert_int_eq(w.result[r], ST_COLL_OK);
        const void* res = st_coll_result(w.m[r]);
        ck_assert_ptr_nonnull(res);
        ck_assert(memcmp(res, w.input[root], count * 4) == 0);
      }
      net_free(&w);
    }
}
END_TEST

/* st_coll_new_in: the same results, worked out in the caller's buffer
 * (the result is that buffer); small and ring paths, every kind. */
START_TEST(test_in_place) {
  const uint64_t counts[] = {0, 1, 1000, 20011};
  const st_coll_kind_t kinds[] = {ST_COLL_ALL_REDUCE, ST_COLL_REDUCE,
                                  ST_COLL_BROADCAST};
  for (int n = 1; n <= MAXN; n += (n < 3 ? 1 : 5))
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
      for (size_t k = 0; k < 3; k++)
        for (int rop = 0; rop < ST_COLL_ROP_COUNT; rop += 3) {
          net_t w;
          net_init(&w, n, kinds[k], rop, ST_COLL_F32, counts[c],
                   c == 3 ? 8 * 167 : 0);
          w.in_place = true;
          run(&w);
          if (kinds[k] == ST_COLL_BROADCAST) {
            uint32_t root = w.spec[0].root;
            for (int r = 0; r < n; r++) {
              ck_assert_int_eq(w.result[r], ST_COLL_OK);
              ck_assert(memcmp(w.work[r], w.input[root], counts[c] * 4) == 0);
            }
          } else {
            check_reduced(&w);
          }
          for (int r = 0; r < n; r++) {
            const void* res = st_coll_result(w.m[r]);
            ck_assert(res == NULL || counts[c] == 0 || res == w.work[r]);
          }
          net_free(&w);
        }
}
END_TEST

/* Nobody leaves a barrier before the last member has arrived. */
START_TEST(test_barrier) {
  for (int trial = 0; trial < 50; trial++) {
    int n = 2 + (int) st_rng_below(&rng, 7);
    net_t w;
    net_init(&w, n, ST_COLL_BARRIER, ST_COLL_SUM, ST_COLL_F32, 1, 0);
    /* Create all but one, run to quiescence: nobody is done. */
    int late = (int) st_rng_below(&rng, (uint64_t) n);
    w.held[late] = true;
    run(&w);
    ck_assert_int_eq(w.n_done, 0);
    create(&w, late);
    run(&w);
    ck_assert_int_eq(w.n_done, n);
    for (int r = 0; r < n; r++) {
      ck_assert_int_eq(w.result[r], ST_COLL_OK);
      ck_assert_ptr_null(st_coll_result(w.m[r]));
    }
    net_free(&w);
  }
}
END_TEST

static void expect_all_fail(net_t* w, int culprit_rank, const char* needle) {
  for (int r = 0; r < w->n; r++) {
    ck_assert_msg(w->done[r], "rank %d not done", r);
    ck_assert_msg(w->result[r] != ST_COLL_OK, "rank %d succeeded", r);
    ck_assert_ptr_null(st_coll_result(w->m[r]));
  }
  if (needle != NULL) {
    bool named = false;
    for (int r = 0; r < w->n; r++)
      named |= strstr(w->why[r], needle) != NULL;
    ck_assert_msg(named, "nobody's error names '%s' (rank 0: %s)", needle,
                  w->why[0]);
  }
  (void) culprit_rank;
}

START_TEST(test_mismatch) {
  for (int big = 0; big < 2; big++)
    for (int what = 0; what < 5; what++) {
      net_t w;
      int n = 4;
      net_init(&w, n, ST_COLL_ALL_REDUCE, ST_COLL_SUM, ST_COLL_F32,
               big ? 40000 : 100, 0);
      st_coll_spec_t* s = &w.spec[2];
      const char* needle = NULL;
      if (what == 0) {
        s->count = big ? 39999 : 99;
        needle = big ? "of 39999 float32" : "of 99 float32";
      } else if (what == 1) {
        s->kind = ST_COLL_BROADCAST;
        needle = "broadcast(";
      } else if (what == 2) {
        s->rop = ST_COLL_MAX;
        needle = "all_reduce(max";
      } else if (what == 3) {
        s->members_hash ^= 1;
        needle = "members";
      } else {
        s->dtype = ST_COLL_F64;
        free(w.input[2]);
        w.input[2] = calloc(s->count, 8);
        needle = "float64";
      }
      run(&w);
      expect_all_fail(&w, 2, needle);
      net_free(&w);
    }
}
END_TEST

/* A call over another member list (members_hash), at every rank, for every
 * kind on both paths: nobody hangs; where every member waits for every
 * other (all-reduce, barrier, reduce on the ring) all fail, and every
 * member that receives from the odd one fails naming both calls. A member
 * may complete only where its part needed nothing from the odd one: an
 * eager sender (a broadcast's root, a small reduce's non-root: they send
 * and are done, odd or not) or a broadcast receiver that had the root's
 * data (which it then holds). */
START_TEST(test_mismatch_every_kind) {
  const st_coll_kind_t kinds[] = {ST_COLL_ALL_REDUCE, ST_COLL_REDUCE,
                                  ST_COLL_BROADCAST, ST_COLL_BARRIER};
  for (int big = 0; big < 2; big++)
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
      for (int odd = 0; odd < 4; odd++) {
        net_t w;
        st_coll_kind_t kind = kinds[k];
        net_init(&w, 4, kind, ST_COLL_SUM, ST_COLL_F32, big ? 40000 : 100,
                 4096);
        w.spec[odd].members_hash ^= 1;
        run(&w);
        bool all_fail = kind == ST_COLL_ALL_REDUCE || kind == ST_COLL_BARRIER ||
                        (kind == ST_COLL_REDUCE && big);
        uint32_t root = w.spec[0].root;
        for (int r = 0; r < 4; r++) {
          ck_assert_msg(w.done[r], "%s big %d odd %d: rank %d hangs",
                        st_coll_kind_name(kind), big, odd, r);
          bool eager = (kind == ST_COLL_BROADCAST && (uint32_t) r == root) ||
                       (kind == ST_COLL_REDUCE && !big && (uint32_t) r != root);
          if ((r == odd && !eager) || all_fail) {
            ck_assert_msg(w.result[r] != ST_COLL_OK,
                          "%s big %d odd %d: rank %d succeeded",
                          st_coll_kind_name(kind), big, odd, r);
            continue;
          }
          if (w.result[r] != ST_COLL_OK || kind != ST_COLL_BROADCAST ||
              (uint32_t) r == root)
            continue;
          const void* got = st_coll_result(w.m[r]);
          ck_assert_ptr_nonnull(got);
          ck_assert(memcmp(got, w.input[root], w.spec[r].count * 4) == 0);
        }
        for (int r = 0; r < 4; r++)
          ck_assert_msg(
              w.result[r] == ST_COLL_OK || strstr(w.why[r], "members") != NULL,
              "rank %d: %s", r, w.why[r]);
        net_free(&w);
      }
}
END_TEST

/* Every member's first message to every other one is its HELLO, on both
 * paths and for every kind (what lets each check the others' calls, and
 * the daemon see crossed calls); a ring member does not complete before
 * it has every member's. */
START_TEST(test_hello_to_all) {
  const st_coll_kind_t kinds[] = {ST_COLL_ALL_REDUCE, ST_COLL_REDUCE,
                                  ST_COLL_BROADCAST, ST_COLL_BARRIER};
  for (int big = 0; big < 2; big++)
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
      for (int r = 0; r < 4; r++) {
        net_t w;
        net_init(&w, 4, kinds[k], ST_COLL_SUM, ST_COLL_F32, big ? 40000 : 100,
                 4096);
        create(&w, r);
        for (int to = 0; to < 4; to++) {
          if (to == r)
            continue;
          frame_t* f = w.link[r][to].head;
          ck_assert_msg(f != NULL, "%s big %d: rank %d sent %d nothing",
                        st_coll_kind_name(kinds[k]), big, r, to);
          uint64_t type = 0;
          ck_assert_int_eq(st_wire_peek_type(f->p, f->len, &type), 0);
          ck_assert_uint_eq(type, ST_MSG_COLL_HELLO);
        }
        net_free(&w);
      }
  /* The ring: rank 0 (which receives from 2) holds its stream's end until
   * rank 1's HELLO comes. */
  net_t w;
  net_init(&w, 3, ST_COLL_ALL_REDUCE, ST_COLL_SUM, ST_COLL_F32, 40000, 4096);
  for (int r = 0; r < 3; r++)
    create(&w, r);
  frame_t* hello = w.link[1][0].head; /* held back */
  ck_assert_uint_eq(w.link[1][0].n, 1);
  w.link[1][0].head = w.link[1][0].tail = NULL;
  w.link[1][0].n = 0;
  run(&w);
  ck_assert(w.done[1] && w.done[2] && !w.done[0]);
  st_msg_t m;
  ck_assert_int_eq(st_wire_decode(hello->p, hello->len, &m, NULL), 0);
  ck_assert_int_eq(st_coll_message(w.m[0], 1, &m), 0);
  st_wire_msg_free(&m);
  free(hello->p);
  free(hello);
  drain(&w, 0);
  ck_assert(w.done[0]);
  check_reduced(&w);
  net_free(&w);
}
END_TEST

/* A peer's ABORT with a reason is passed on to the members that sender may
 * not have told (its own group differs); a withdrawal is not. */
START_TEST(test_abort_passed_on) {
  net_t w;
  net_init(&w, 4, ST_COLL_ALL_REDUCE, ST_COLL_SUM, ST_COLL_F32, 10, 0);
  create(&w, 0);
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_COLL_ABORT;
  m.u.coll_abort =
      (st_msg_coll_abort_t){.op_id = OP, .reason = "odd list", .reason_len = 8};
  ck_assert_int_eq(st_coll_message(w.m[0], 3, &m), 0);
  drain(&w, 0);
  ck_assert_int_eq(w.result[0], ST_COLL_FAIL_PEER);
  /* ABORTs to 1 and 2, behind the HELLOs; none back to 3 (only its
   * HELLO). */
  for (int to = 1; to <= 2; to++) {
    frame_t* f = w.link[0][to].tail;
    st_msg_t a;
    ck_assert_int_eq(st_wire_decode(f->p, f->len, &a, NULL), 0);
    ck_assert_int_eq(a.type, ST_MSG_COLL_ABORT);
    char why[ST_COLL_REASON_MAX + 1];
    snprintf(why, sizeof why, "%.*s", (int) a.u.coll_abort.reason_len,
             a.u.coll_abort.reason);
    ck_assert_msg(strstr(why, "odd list") != NULL, "%s", why);
    st_wire_msg_free(&a);
  }
  ck_assert_uint_eq(w.link[0][3].n, 1);
  net_free(&w);

  net_init(&w, 3, ST_COLL_ALL_REDUCE, ST_COLL_SUM, ST_COLL_F32, 10, 0);
  create(&w, 0);
  m.u.coll_abort.reason_len = 0; /* a withdrawal */
  ck_assert_int_eq(st_coll_message(w.m[0], 2, &m), 0);
  drain(&w, 0);
  ck_assert_int_eq(w.result[0], ST_COLL_FAIL_PEER);
  ck_assert_uint_eq(w.link[0][1].n, 1); /* its HELLO only */
  net_free(&w);
}
END_TEST

/* A driver's abort on one member (its peer died, its deadline passed)
 * fails every other member, through ABORT, naming the reason. */
START_TEST(test_abort_spreads) {
  for (int big = 0; big < 2; big++) {
    net_t w;
    net_init(&w, 5, ST_COLL_ALL_REDUCE, ST_COLL_MEAN, ST_COLL_F32,
             big ? 50000 : 10, 4 * 1000);
    for (int r = 0; r < 4; r++)
      create(&w, r);
    w.held[4] = true; /* never called */
    run(&w);
    ck_assert_int_eq(w.n_done, 0);
    st_coll_result_t why = big ? ST_COLL_FAIL_MISMATCH : ST_COLL_FAIL_TIMEOUT;
    ck_assert_int_eq(st_coll_abort(w.m[1], ST_COLL_FAIL_PEER, 5, "x"), -EINVAL);
    ck_assert_int_eq(
        st_coll_abort(w.m[1], why, 5, "member 4 did not arrive within 2 s"), 0);
    drain(&w, 1);
    ck_assert_int_eq(w.result[1], why);
    run(&w);
    for (int r = 0; r < 4; r++) {
      ck_assert(w.done[r]);
      ck_assert(w.result[r] != ST_COLL_OK);
      ck_assert_msg(strstr(w.why[r], "did not arrive") != NULL, "%s", w.why[r]);
    }
    ck_assert_int_eq(w.result[0], ST_COLL_FAIL_PEER);
    /* Events after DONE are ignored. */
    ck_assert_int_eq(st_coll_abort(w.m[1], ST_COLL_FAIL_ABORTED, 0, "x"), 0);
    st_cact_t a;
    ck_assert(!st_coll_next_action(w.m[1], &a));
    net_free(&w);
  }
}
END_TEST

/* A call that met nobody is withdrawn: DONE(TIMEOUT) after reasonless
 * ABORTs (the others' drivers forget it); once a message came, it cannot
 * be; a reasonless ABORT fails a running operation as a peer's. */
START_TEST(test_withdraw) {
  for (int big = 0; big < 2; big++) {
    net_t w;
    net_init(&w, 3, ST_COLL_ALL_REDUCE, ST_COLL_SUM, ST_COLL_F32,
             big ? 40000 : 10, 0);
    create(&w, 0);
    w.held[1] = w.held[2] = true;
    run(&w);
    link_t* l = &w.link[0][big ? 1 : 2];
    ck_assert_uint_gt(l->n, 0); /* its HELLO went out */
    size_t before = w.link[0][1].n + w.link[0][2].n;
    ck_assert_int_eq(st_coll_withdraw(w.m[0], "timed out"), 0);
    drain(&w, 0);
    ck_assert_int_eq(w.result[0], ST_COLL_FAIL_TIMEOUT);
    ck_assert_uint_eq(w.link[0][1].n + w.link[0][2].n, before + 2);
    st_msg_t m;
    frame_t* f = w.link[0][1].tail;
    ck_assert_int_eq(st_wire_decode(f->p, f->len, &m, NULL), 0);
    ck_assert_int_eq(m.type, ST_MSG_COLL_ABORT);
    ck_assert_uint_eq(m.u.coll_abort.reason_len, 0);
    /* Member 1 now running gets it and fails as a peer's withdrawal. */
    create(&w, 1);
    while (w.link[0][1].n > 0)
      deliver(&w, 0, 1);
    ck_assert_int_eq(w.result[1], ST_COLL_FAIL_PEER);
    ck_assert_ptr_nonnull(strstr(w.why[1], "withdrew"));
    st_wire_msg_free(&m);
    ck_assert_int_eq(st_coll_withdraw(w.m[0], "x"), -EINVAL); /* done */
    net_free(&w);
  }
  /* Heard from someone: -EBUSY. */
  net_t w;
  net_init(&w, 2, ST_COLL_BARRIER, ST_COLL_SUM, ST_COLL_F32, 1, 0);
  create(&w, 0);
  st_coll_t* m1;
  ck_assert_int_eq(st_coll_new(&w.spec[1], NULL, &m1), 0);
  st_cact_t a;
  ck_assert(st_coll_next_action(m1, &a) && a.kind == ST_CACT_SEND);
  st_msg_t m;
  ck_assert_int_eq(st_wire_decode(a.data, a.len, &m, NULL), 0);
  ck_assert_int_eq(st_coll_message(w.m[0], 1, &m), 0);
  st_wire_msg_free(&m);
  st_coll_free(m1);
  drain(&w, 0);
  if (!w.done[0])
    ck_assert_int_eq(st_coll_withdraw(w.m[0], "x"), -EBUSY);
  net_free(&w);
}
END_TEST

/* A segment out of order, or from a member that owes none, fails. */
START_TEST(test_protocol) {
  net_t w;
  net_init(&w, 3, ST_COLL_ALL_REDUCE, ST_COLL_SUM, ST_COLL_F32, 30000, 4096);
  for (int r = 0; r < 3; r++)
    create(&w, r);
  /* Rank 1 receives from 0 only; a segment from 2 is foreign. */
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_COLL_SEG;
  float data[4] = {1, 2, 3, 4};
  m.u.coll_seg =
      (st_msg_coll_seg_t){.op_id = OP, .data = (uint8_t*) data, .data_len = 16};
  ck_assert_int_eq(st_coll_message(w.m[1], 2, &m), 0);
  drain(&w, 1);
  ck_assert_int_eq(w.result[1], ST_COLL_FAIL_PROTOCOL);
  ck_assert_ptr_nonnull(strstr(w.why[1], "rank 2"));
  run(&w);
  expect_all_fail(&w, 1, NULL);
  net_free(&w);
}
END_TEST

START_TEST(test_misuse_and_codec) {
  st_coll_spec_t s;
  st_coll_spec_default(&s);
  st_coll_t* x;
  s.n = 0;
  ck_assert_int_eq(st_coll_new(&s, NULL, &x), -EINVAL);
  s.n = 2, s.rank = 2;
  ck_assert_int_eq(st_coll_new(&s, NULL, &x), -EINVAL);
  s.rank = 0, s.kind = ST_COLL_BARRIER, s.count = 5;
  ck_assert_int_eq(st_coll_new(&s, NULL, &x), -EINVAL);
  s.count = 1, s.segment_bytes = 12;
  ck_assert_int_eq(st_coll_new(&s, NULL, &x), -EINVAL);
  s.segment_bytes = ST_COLL_SEGMENT_BYTES, s.op_id = 9;
  ck_assert_int_eq(st_coll_new(&s, NULL, &x), 0);
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_COLL_ABORT;
  m.u.coll_abort.op_id = 8; /* another operation */
  ck_assert_int_eq(st_coll_message(x, 1, &m), -EINVAL);
  m.u.coll_abort.op_id = 9;
  ck_assert_int_eq(st_coll_message(x, 0, &m), -EINVAL); /* itself */
  ck_assert_int_eq(st_coll_abort(x, ST_COLL_OK, 0, "x"), -EINVAL);
  st_coll_free(x);

  /* The codec: round trips, and fields out of range are dropped. */
  uint8_t buf[512];
  size_t len;
  double d[3] = {1.5, -2, 3};
  m.type = ST_MSG_COLL_HELLO;
  m.u.coll_hello = (st_msg_coll_hello_t){.op_id = 7,
                                         .kind = ST_COLL_REDUCE,
                                         .rop = ST_COLL_MAX,
                                         .dtype = ST_COLL_F64,
                                         .root = 2,
                                         .count = 3,
                                         .n = 4,
                                         .members_hash = 99,
                                         .data = (uint8_t*) d,
                                         .data_len = 24};
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  st_msg_t o;
  ck_assert_int_eq(st_wire_decode(buf, len, &o, NULL), 0);
  ck_assert_int_eq(o.type, ST_MSG_COLL_HELLO);
  ck_assert_uint_eq(o.u.coll_hello.members_hash, 99);
  ck_assert_uint_eq(o.u.coll_hello.root, 2);
  ck_assert(memcmp(o.u.coll_hello.data, d, 24) == 0);
  st_wire_msg_free(&o);
  m.u.coll_hello.root = 4; /* outside the group */
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  m.u.coll_hello.root = 2, m.u.coll_hello.data_len = 20; /* not whole */
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  m.u.coll_hello.data_len = 24, m.u.coll_hello.count = 2; /* past count */
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  m.u.coll_hello.count = 3, m.u.coll_hello.dtype = 7;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  m.type = ST_MSG_COLL_SEG;
  m.u.coll_seg = (st_msg_coll_seg_t){.op_id = 1, .phase = 3};
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  m.u.coll_seg.phase = ST_COLL_PHASE_AG, m.u.coll_seg.offset = 5;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  ck_assert_int_eq(st_wire_decode(buf, len, &o, NULL), 0);
  ck_assert_uint_eq(o.u.coll_seg.offset, 5);
  st_wire_msg_free(&o);
  m.u.coll_seg.offset = ST_COLL_MAX_COUNT + 1;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  char reason[ST_COLL_REASON_MAX + 1];
  memset(reason, 'x', sizeof reason);
  m.type = ST_MSG_COLL_ABORT;
  m.u.coll_abort = (st_msg_coll_abort_t){
      .op_id = 1, .reason = reason, .reason_len = ST_COLL_REASON_MAX + 1};
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  m.u.coll_abort.reason_len = 10;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  ck_assert_int_eq(st_wire_decode(buf, len, &o, NULL), 0);
  ck_assert_uint_eq(o.u.coll_abort.reason_len, 10);
  st_wire_msg_free(&o);
}
END_TEST

/* COLL_FETCH: an ASK names 1 to 128 bytes, a refusal says why in at most
 * 512, the code is known; the encoder and the decoder agree (the exact
 * bytes are docs/protocol.md's example). */
START_TEST(test_fetch_codec) {
  uint8_t buf[1024];
  size_t len = 0;
  st_msg_t m = {.type = ST_MSG_COLL_FETCH};
  m.u.coll_fetch = (st_msg_coll_fetch_t){.op_id = UINT64_C(0x0123456789abcdef),
                                         .code = ST_COLL_FETCH_ASK,
                                         .text = "w",
                                         .text_len = 1};
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  static const uint8_t want[] = {0x95, 0x33, 0x01, 0xcf, 0x01, 0x23, 0x45, 0x67,
                                 0x89, 0xab, 0xcd, 0xef, 0x00, 0xa1, 'w'};
  ck_assert_uint_eq(len, sizeof want);
  ck_assert(memcmp(buf, want, sizeof want) == 0);
  st_msg_t o;
  ck_assert_int_eq(st_wire_decode(buf, len, &o, NULL), 0);
  ck_assert_int_eq(o.type, ST_MSG_COLL_FETCH);
  ck_assert_uint_eq(o.u.coll_fetch.op_id, UINT64_C(0x0123456789abcdef));
  ck_assert_uint_eq(o.u.coll_fetch.text_len, 1);
  ck_assert_int_eq(o.u.coll_fetch.text[0], 'w');
  st_wire_msg_free(&o);
  char text[ST_COLL_REASON_MAX + 1];
  memset(text, 'x', sizeof text);
  m.u.coll_fetch.text = text;
  m.u.coll_fetch.text_len = 0; /* an ASK names something */
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  m.u.coll_fetch.text_len = ST_COLL_FETCH_NAME_MAX + 1;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  m.u.coll_fetch.text_len = ST_COLL_FETCH_NAME_MAX;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  m.u.coll_fetch.code = ST_COLL_FETCH_MISSING; /* a refusal may be longer */
  m.u.coll_fetch.text_len = ST_COLL_REASON_MAX;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  ck_assert_int_eq(st_wire_decode(buf, len, &o, NULL), 0);
  ck_assert_uint_eq(o.u.coll_fetch.code, ST_COLL_FETCH_MISSING);
  ck_assert_uint_eq(o.u.coll_fetch.text_len, ST_COLL_REASON_MAX);
  st_wire_msg_free(&o);
  m.u.coll_fetch.text_len = ST_COLL_REASON_MAX + 1;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  m.u.coll_fetch.text_len = 3, m.u.coll_fetch.code = ST_COLL_FETCH_CODE_COUNT;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), -EINVAL);
  /* The decoder refuses what the encoder would: an unknown code, patched
   * into a valid message. */
  m.u.coll_fetch.code = ST_COLL_FETCH_BUSY;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  ck_assert_int_eq(buf[12], ST_COLL_FETCH_BUSY);
  buf[12] = 7;
  ck_assert_int_ne(st_wire_decode(buf, len, &o, NULL), 0);
}
END_TEST

static Suite* suite(void) {
  Suite* s = suite_create("gossip_coll");
  TCase* tc = tcase_create("coll");
  tcase_set_timeout(tc, 300);
  tcase_add_checked_fixture(tc, setup, NULL);
  tcase_add_test(tc, test_all_reduce);
  tcase_add_test(tc, test_all_reduce_bf16_ring);
  tcase_add_test(tc, test_reduce);
  tcase_add_test(tc, test_broadcast);
  tcase_add_test(tc, test_in_place);
  tcase_add_test(tc, test_barrier);
  tcase_add_test(tc, test_mismatch);
  tcase_add_test(tc, test_mismatch_every_kind);
  tcase_add_test(tc, test_abort_passed_on);
  tcase_add_test(tc, test_hello_to_all);
  tcase_add_test(tc, test_abort_spreads);
  tcase_add_test(tc, test_withdraw);
  tcase_add_test(tc, test_protocol);
  tcase_add_test(tc, test_misuse_and_codec);
  tcase_add_test(tc, test_fetch_codec);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  tu_seed(); /* print the seed once, before the forks */
  SRunner* sr = srunner_create(suite());
  srunner_run_all(sr, CK_ENV);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
