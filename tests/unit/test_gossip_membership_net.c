/* test_gossip_membership_net.c: the membership machine (SWIM with
 * Lifeguard, gossip/membership*.c) run as a cluster: N = 1, 2, 3, 7, 16
 * machines exchanging their packets and push-pulls in memory on a virtual
 * clock with a fixed seed and no loss. Everyone joins through node 0;
 * the cluster must converge (every node sees every node alive), and after
 * one node crashes (nothing more is delivered to or from it) every other
 * node must hold it dead within suspicion max + 5 s. A graceful leave must
 * reach everyone as LEFT, and a restart with a new boot epoch must bring
 * the node back alive everywhere. Every packet is checked to fit in
 * ST_PACKET_MAX_PLAINTEXT bytes and to decode message by message.
 *
 * ST_MEMBERSHIP_WRITE_CORPUS=DIR writes packets and push-pulls delivered to
 * node 0 (from node 1, whose identities the fuzz target shares) as the
 * seed corpus of tests/fuzz/fuzz_membership_packet.c. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/gossip.h"
#include "tests/member_identity.h"
#include "tests/unit/testutil.h"

#define NMAX 16
#define LATENCY_MS 2

typedef struct {
  int to;
  bool push_pull;
  st_node_id_t from;
  st_wire_addr_t from_addr;
  uint64_t at;
  uint8_t* data;
  size_t len;
} nmsg_t;

typedef struct {
  int n;
  uint64_t now;
  st_membership_t* m[NMAX];
  st_rng_t rng[NMAX];
  st_node_id_t id[NMAX];
  uint8_t pk[NMAX][ST_PUBLIC_KEY_BYTES];
  st_wire_addr_t addr[NMAX];
  uint32_t epoch[NMAX];
  uint64_t timer[NMAX];
  bool down[NMAX];
  uint64_t dead_at[NMAX]; /* when each node saw `watch` dead or left */
  int watch;
  nmsg_t* q;
  size_t nq, capq;
  uint64_t packets, bad_packets;
  const char* corpus;
  int captured;
} net_t;

static int route(const net_t* net, const st_wire_addr_t* a) {
  int i = a->ip[2] << 8 | a->ip[3];
  return a->ip_len == 4 && a->ip[0] == 10 && i < net->n ? i : -1;
}

static void enqueue(net_t* net, int from, int to, bool pp, const uint8_t* data,
                    size_t len) {
  if (net->nq == net->capq) {
    net->capq = net->capq ? net->capq * 2 : 64;
    net->q = realloc(net->q, net->capq * sizeof *net->q);
    ck_assert_ptr_nonnull(net->q);
  }
  nmsg_t* e = &net->q[net->nq++];
  e->to = to;
  e->push_pull = pp;
  e->from = net->id[from];
  e->from_addr = net->addr[from];
  e->at = net->now + LATENCY_MS;
  e->data = malloc(len ? len : 1);
  ck_assert_ptr_nonnull(e->data);
  memcpy(e->data, data, len);
  e->len = len;
}

static void check_packet(const uint8_t* p, size_t len) {
  ck_assert_uint_gt(len, 0);
  ck_assert_uint_le(len, ST_PACKET_MAX_PLAINTEXT);
  size_t off = 0;
  while (off < len) {
    st_msg_t msg;
    size_t used;
    ck_assert_int_eq(st_wire_decode_next(p + off, len - off, &msg, &used, NULL),
                     0);
    st_wire_msg_free(&msg);
    off += used;
  }
}

static void drain(net_t* net, int i) {
  st_maction_t a;
  while (st_membership_next_action(net->m[i], &a)) {
    int to = route(net, &a.to);
    switch (a.kind) {
      case ST_MACT_SEND:
        check_packet(a.data, a.len);
        net->packets++;
        if (to >= 0)
          enqueue(net, i, to, false, a.data, a.len);
        break;
      case ST_MACT_PUSH_PULL:
        if (to >= 0)
          enqueue(net, i, to, true, a.data, a.len);
        break;
      case ST_MACT_TIMER:
        net->timer[i] = a.at_ms;
        break;
      case ST_MACT_MEMBER:
        if (net->watch >= 0 &&
            memcmp(&a.member.id, &net->id[net->watch], sizeof a.member.id) ==
                0 &&
            (a.member.state == ST_MEMBER_DEAD ||
             a.member.state == ST_MEMBER_LEFT) &&
            net->dead_at[i] == 0)
          net->dead_at[i] = net->now;
        break;
    }
  }
}

static void capture(net_t* net, const nmsg_t* e) {
  if (!net->corpus || e->to != 0 || net->captured >= 16 ||
      memcmp(&e->from, &net->id[1], sizeof e->from) != 0)
    return;
  char path[512];
  snprintf(path, sizeof path, "%s/%s-n%d-%02d", net->corpus,
           e->push_pull ? "pushpull" : "packet", net->n, net->captured++);
  ck_assert_int_eq(tu_write_file(path, e->data, e->len), 0);
}

static void node_start(net_t* net, int i, uint32_t epoch, uint64_t seed) {
  st_membership_config_t cfg;
  st_membership_config_default(&cfg);
  st_rng_seed(&net->rng[i], seed * 1000 + (uint64_t) i + epoch);
  net->epoch[i] = epoch;
  ck_assert_int_eq(
      st_membership_new(&cfg, &net->id[i], &net->addr[i], net->pk[i], epoch,
                        &net->rng[i], &net->m[i]),
      0);
  member_set_signer(net->m[i], net->pk[i]);
  net->timer[i] = UINT64_MAX;
  net->down[i] = false;
}

static void net_init(net_t* net, int n, uint64_t seed) {
  memset(net, 0, sizeof *net);
  /* ST_MEMBERSHIP_SEED shifts every fixed seed, to try other runs. */
  const char* env = getenv("ST_MEMBERSHIP_SEED");
  seed += env ? strtoull(env, NULL, 0) : 0;
  net->n = n;
  net->watch = -1;
  net->corpus = getenv("ST_MEMBERSHIP_WRITE_CORPUS");
  for (int i = 0; i < n; i++) {
    member_identity(i, net->pk[i], &net->id[i], &net->addr[i]);
    node_start(net, i, 1, seed);
  }
}

static void net_free(net_t* net) {
  for (int i = 0; i < net->n; i++)
    st_membership_free(net->m[i]);
  for (size_t k = 0; k < net->nq; k++)
    free(net->q[k].data);
  free(net->q);
}

/* Runs every event due up to `until`, in time order. */
static void run_until(net_t* net, uint64_t until) {
  for (;;) {
    uint64_t t = UINT64_MAX;
    int who = -1;
    size_t qi = SIZE_MAX;
    for (int i = 0; i < net->n; i++)
      if (!net->down[i] && net->timer[i] < t) {
        t = net->timer[i];
        who = i;
      }
    for (size_t k = 0; k < net->nq; k++)
      if (net->q[k].at < t) {
        t = net->q[k].at;
        qi = k;
      }
    if (t > until)
      break;
    if (t > net->now)
      net->now = t;
    if (qi != SIZE_MAX) {
      nmsg_t e = net->q[qi];
      net->q[qi] = net->q[--net->nq];
      int to = e.to;
      if (!net->down[to] && !net->down[route(net, &e.from_addr)]) {
        capture(net, &e);
        int rc = e.push_pull
                     ? st_membership_push_pull_in(net->m[to], net->now,
                                                  &e.from_addr, e.data, e.len)
                     : st_membership_packet(net->m[to], net->now, &e.from,
                                            &e.from_addr, e.data, e.len);
        if (rc)
          net->bad_packets++;
        drain(net, to);
      }
      free(e.data);
    } else {
      net->timer[who] = UINT64_MAX;
      ck_assert_int_eq(st_membership_tick(net->m[who], net->now), 0);
      drain(net, who);
    }
  }
  net->now = until;
}

static void join_all(net_t* net) {
  ck_assert_int_eq(st_membership_join(net->m[0], net->now, NULL, 0), 0);
  drain(net, 0);
  for (int i = 1; i < net->n; i++) {
    run_until(net, net->now + 10);
    ck_assert_int_eq(st_membership_join(net->m[i], net->now, &net->addr[0], 1),
                     0);
    drain(net, i);
  }
}

/* Every up node sees every up node alive (and each down one not alive). */
static bool converged(const net_t* net) {
  for (int i = 0; i < net->n; i++) {
    if (net->down[i])
      continue;
    for (int j = 0; j < net->n; j++) {
      const st_member_t* mb = st_membership_find(net->m[i], &net->id[j]);
      bool want_alive = !net->down[j];
      if (want_alive && (!mb || mb->state != ST_MEMBER_ALIVE))
        return false;
      if (!want_alive && mb && mb->state == ST_MEMBER_ALIVE)
        return false;
    }
  }
  return true;
}

/* Runs until converged, for at most 40 s: gossip converges a join within
 * a few seconds with high probability, and the first push-pull (within
 * push_pull_interval = 30 s of joining, for N <= 32) settles the rest for
 * sure (a burst of joins may leave an early joiner unaware of a later
 * one until then). */
static bool settle(net_t* net) {
  uint64_t t0 = net->now;
  while (!converged(net) && net->now < t0 + 40000)
    run_until(net, net->now + 100);
  return converged(net);
}

static uint64_t suspicion_max_ms(int n) {
  double scale = n > 1 ? log10((double) n) : 1.0;
  if (scale < 1.0)
    scale = 1.0;
  uint64_t min = (uint64_t) (4.0 * scale * 1000.0);
  return n - 2 < 3 ? min : 6 * min;
}

static const int sizes[] = {1, 2, 3, 7, 16};
#define NSIZES ((int) (sizeof sizes / sizeof sizes[0]))

/* Joins converge: by gossip in O(log N) rounds of 200 ms, at worst at
 * the first push-pull. */
START_TEST(test_converge) {
  net_t net;
  net_init(&net, sizes[_i], 42);
  join_all(&net);
  uint64_t t0 = net.now;
  ck_assert_msg(settle(&net), "N=%d not converged after %llu ms", net.n,
                (unsigned long long) (net.now - t0));
  for (int i = 0; i < net.n; i++) {
    ck_assert_uint_eq(st_membership_count(net.m[i]), (size_t) net.n);
    ck_assert_uint_eq(st_membership_alive_count(net.m[i]), (size_t) net.n);
  }
  /* A quiet cluster stays converged: no false suspicion without loss. */
  run_until(&net, net.now + 60000);
  ck_assert(converged(&net));
  ck_assert_uint_eq(net.bad_packets, 0);
  net_free(&net);
}
END_TEST

/* Crash the last node: every other holds it dead within suspicion max +
 * 5 s of the crash. */
START_TEST(test_crash_detected) {
  int n = sizes[_i];
  if (n < 2)
    return;
  net_t net;
  net_init(&net, n, 7);
  join_all(&net);
  ck_assert(settle(&net));
  int victim = n - 1;
  net.watch = victim;
  net.down[victim] = true;
  uint64_t crash = net.now, limit = suspicion_max_ms(n) + 5000;
  run_until(&net, crash + limit);
  for (int i = 0; i < n - 1; i++) {
    const st_member_t* mb = st_membership_find(net.m[i], &net.id[victim]);
    ck_assert_ptr_nonnull(mb);
    ck_assert_int_eq(mb->state, ST_MEMBER_DEAD);
    ck_assert_uint_gt(net.dead_at[i], crash);
    ck_assert_uint_le(net.dead_at[i] - crash, limit);
  }
  /* The survivors stay alive to each other. */
  ck_assert(converged(&net));
  net_free(&net);
}
END_TEST

/* A graceful leave reaches everyone as LEFT, never refuted, never DEAD. */
START_TEST(test_leave_spreads) {
  int n = sizes[_i];
  if (n < 2)
    return;
  net_t net;
  net_init(&net, n, 11);
  join_all(&net);
  ck_assert(settle(&net));
  int who = n / 2;
  ck_assert_int_eq(st_membership_leave(net.m[who], net.now), 0);
  drain(&net, who);
  run_until(&net, net.now + 3000); /* the leaver keeps gossiping a while */
  net.down[who] = true;
  run_until(&net, net.now + 20000);
  for (int i = 0; i < n; i++) {
    if (i == who)
      continue;
    const st_member_t* mb = st_membership_find(net.m[i], &net.id[who]);
    ck_assert_ptr_nonnull(mb);
    ck_assert_int_eq(mb->state, ST_MEMBER_LEFT);
  }
  net_free(&net);
}
END_TEST

/* A node restarted from nothing (new boot epoch, same key) while the
 * others still hold it dead comes back alive everywhere. */
START_TEST(test_restart_new_epoch) {
  int n = sizes[_i];
  if (n < 2)
    return;
  net_t net;
  net_init(&net, n, 13);
  join_all(&net);
  ck_assert(settle(&net));
  int who = n - 1;
  net.down[who] = true;
  run_until(&net, net.now + suspicion_max_ms(n) + 5000);
  const st_member_t* mb = st_membership_find(net.m[0], &net.id[who]);
  ck_assert_ptr_nonnull(mb);
  ck_assert_int_eq(mb->state, ST_MEMBER_DEAD);
  st_membership_free(net.m[who]);
  node_start(&net, who, 2, 13);
  ck_assert_int_eq(st_membership_join(net.m[who], net.now, &net.addr[0], 1), 0);
  drain(&net, who);
  ck_assert(settle(&net));
  mb = st_membership_find(net.m[0], &net.id[who]);
  ck_assert_uint_eq(mb->incarnation >> 32, 2);
  net_free(&net);
}
END_TEST

/* The same seed gives the same run, packet for packet. */
START_TEST(test_deterministic) {
  uint64_t packets[2];
  uint64_t incs[2];
  for (int r = 0; r < 2; r++) {
    net_t net;
    net_init(&net, 7, 99);
    join_all(&net);
    run_until(&net, net.now + 15000);
    packets[r] = net.packets;
    incs[r] = 0;
    for (int i = 0; i < net.n; i++)
      incs[r] = incs[r] * 31 +
                st_membership_find(net.m[0], &net.id[i])->state_since_ms;
    net_free(&net);
  }
  ck_assert_uint_eq(packets[0], packets[1]);
  ck_assert_uint_eq(incs[0], incs[1]);
}
END_TEST

static Suite* suite(void) {
  Suite* s = suite_create("gossip_membership_net");
  TCase* tc = tcase_create("cluster");
  tcase_add_loop_test(tc, test_converge, 0, NSIZES);
  tcase_add_loop_test(tc, test_crash_detected, 0, NSIZES);
  tcase_add_loop_test(tc, test_leave_spreads, 0, NSIZES);
  tcase_add_loop_test(tc, test_restart_new_epoch, 0, NSIZES);
  tcase_add_test(tc, test_deterministic);
  tcase_set_timeout(tc, 120);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  if (st_crypto_init() != 0)
    return 1;
  SRunner* sr = srunner_create(suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
