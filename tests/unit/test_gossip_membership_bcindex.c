/* test_gossip_membership_bcindex.c: the Check suite for the broadcast
 * queue's index (membership_internal.h, st__bcindex_t), the array that
 * lets packing load the updates it will meet ahead of the walk down each
 * transmit count's linked list (membership_gossip.c).
 *
 * The index is only a hint to the processor, so nothing the machine sends
 * depends on it; what must hold is that it mirrors the lists, or packing
 * loads the wrong updates and gains nothing. After every step of a random
 * mix of the queue's operations (queue an update, queue it again, pack a
 * packet, drop a member's update), for queues of 0, 1, 17 and 3,000
 * updates, each list read from its head equals its index read from the
 * end with the holes skipped, and every indexed broadcast knows its place. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/gossip.h"
#include "gossip/membership_internal.h"

static void identity(uint32_t i, uint8_t pk[ST_PUBLIC_KEY_BYTES],
                     st_node_id_t* id, st_wire_addr_t* addr) {
  memset(pk, 0, ST_PUBLIC_KEY_BYTES);
  pk[0] = 0xB1;
  memcpy(pk + 1, &i, sizeof i);
  st_node_id_from_public_key(pk, id);
  memset(addr, 0, sizeof *addr);
  addr->ip_len = 4;
  addr->ip[0] = 10;
  addr->ip[1] = (uint8_t) (i >> 16);
  addr->ip[2] = (uint8_t) (i >> 8);
  addr->ip[3] = (uint8_t) i;
  addr->port = 7946;
}

/* A machine knowing n members besides itself, every one ALIVE. */
static st_membership_t* machine(uint32_t n, st_rng_t* rng) {
  uint8_t pk[ST_PUBLIC_KEY_BYTES];
  st_node_id_t id;
  st_wire_addr_t addr;
  st_membership_config_t cfg;
  st_membership_config_default(&cfg);
  identity(0, pk, &id, &addr);
  st_membership_t* m = NULL;
  ck_assert_int_eq(st_membership_new(&cfg, &id, &addr, pk, 1, rng, &m), 0);
  for (uint32_t i = 1; i <= n; i++) {
    identity(i, pk, &id, &addr);
    st__mrec_t* r = st__table_add(m, &id);
    ck_assert_ptr_nonnull(r);
    memcpy(r->pk, pk, ST_PUBLIC_KEY_BYTES);
    r->incarnation = (uint64_t) 1 << 32;
    r->state = ST_MEMBER_ALIVE;
    st__rec_set_addr(r, &addr);
    m->n_alive++;
  }
  return m;
}

/* Each list equals its index read backwards, holes skipped; every
 * broadcast in a list is indexed at its place; no index outlives the
 * lists' counts. Returns the broadcasts found in the lists. */
static uint32_t check_index(const st_membership_t* m) {
  uint32_t total = 0;
  for (uint32_t t = 0; t <= ST_MEMBERSHIP_MAX_TRANSMITS; t++) {
    const st__bcindex_t* x = t < m->n_bc_index ? &m->bc_index[t] : NULL;
    uint32_t k = x ? x->len : 0, holes = 0;
    for (uint32_t i = m->bc_head[t]; i != ST__NONE; i = m->bc[i].next) {
      while (k > 0 && x->v[k - 1] == ST__NONE) {
        k--;
        holes++;
      }
      ck_assert_uint_gt(k, 0); /* a broadcast the index lacks */
      ck_assert_uint_eq(x->v[k - 1], i);
      ck_assert_uint_eq(m->bc[i].pos, k - 1);
      ck_assert_uint_eq(m->bc[i].transmits, t);
      k--;
      total++;
    }
    if (x) {
      for (; k > 0; k--) /* nothing indexed beyond the list's tail */
        ck_assert_uint_eq(x->v[k - 1], ST__NONE);
      ck_assert_uint_le(x->len, x->cap);
      if (x->len > 0) /* holes at the end are dropped at once */
        ck_assert_uint_ne(x->v[x->len - 1], ST__NONE);
    }
    (void) holes;
  }
  ck_assert_uint_eq(total, m->bc_pending);
  return total;
}

static const uint32_t sizes[] = {0, 1, 17, 3000};

START_TEST(test_index_mirrors_lists) {
  uint32_t n = sizes[_i];
  st_rng_t rng;
  st_rng_seed(&rng, 77 + n);
  st_membership_t* m = machine(n, &rng);
  st_wire_addr_t to;
  identity(1, (uint8_t[ST_PUBLIC_KEY_BYTES]){0}, &(st_node_id_t){0}, &to);
  check_index(m);
  /* Large queues are checked every 97 steps (a check walks them all). */
  uint32_t steps = n < 100 ? 400 : 2 * n, every = n < 100 ? 1 : 97;
  for (uint32_t s = 0; s < steps; s++) {
    uint32_t op = (uint32_t) st_rng_below(&rng, 8);
    if (n > 0 && op < 4) { /* queue (or queue again) one member's update */
      uint32_t mi = (uint32_t) st_rng_below(&rng, m->n_mem);
      st__mrec_t* r = &m->mem[mi];
      if (!st__id_eq(&r->id, &m->self))
        st__bc_queue_member(m, r, &r->id);
    } else if (n > 0 && op == 4) { /* drop one member's update */
      uint32_t mi = (uint32_t) st_rng_below(&rng, m->n_mem);
      st__bc_drop(m, &m->mem[mi].bcast);
    } else { /* pack a packet: updates move up a count or retire */
      ck_assert_int_eq(st__send_packet(m, &to, NULL, NULL, NULL), 0);
      st_maction_t a;
      while (st_membership_next_action(m, &a))
        ;
    }
    if (s % every == 0)
      check_index(m);
  }
  /* Drain: every update goes its retransmit limit and leaves. */
  for (uint32_t s = 0; s < 100000 && m->bc_pending; s++) {
    ck_assert_int_eq(st__send_packet(m, &to, NULL, NULL, NULL), 0);
    st_maction_t a;
    while (st_membership_next_action(m, &a))
      ;
    if (s % every == 0)
      check_index(m);
  }
  check_index(m);
  ck_assert_uint_eq(m->bc_pending, 0);
  st_membership_free(m);
}
END_TEST

int main(void) {
  if (st_crypto_init() != 0)
    return 1;
  Suite* s = suite_create("gossip_membership_bcindex");
  TCase* tc = tcase_create("index");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_index_mirrors_lists, 0,
                      (int) (sizeof sizes / sizeof *sizes));
  suite_add_tcase(s, tc);
  SRunner* sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
