/* test_daemon_coll.c: the Check suite of the node's side of the user
 * collectives that runs without sockets (node/daemon/daemon_coll.c): the
 * answer to a late HELLO on "all" over another list (a call that ended
 * here, with the calls it names), and the fate of a frame for an operation
 * this node numbered long ago: dropped, not kept where the crossed-call
 * rule would take it for a call never made here (docs/collectives.md,
 * "Failures" and "Crossed calls"). The rest runs on real processes in
 * tests/python/test_collectives.py. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "node/daemon/daemon_internal.h"

/* A call on "all" of 10 float32 over two members, as it ended here. */
static st__coll_op_t ended_call(uint64_t op_id) {
  st__coll_op_t op;
  memset(&op, 0, sizeof op);
  op.g.op_id = op_id;
  op.g.members_hash = 0x1111;
  op.g.n = 2;
  op.g.all = true;
  op.kind = ST_COLL_ALL_REDUCE;
  op.rop = ST_COLL_SUM;
  op.dtype = ST_COLL_F32;
  op.count = 10;
  return op;
}

static st_msg_coll_hello_t hello_of(uint64_t op_id, uint32_t n,
                                    uint64_t members_hash) {
  return (st_msg_coll_hello_t){.op_id = op_id,
                               .kind = ST_COLL_ALL_REDUCE,
                               .rop = ST_COLL_SUM,
                               .dtype = ST_COLL_F32,
                               .count = 10,
                               .n = n,
                               .members_hash = members_hash};
}

/* A HELLO over another list for an ended call on "all" is answered, naming
 * both calls; one over the same list (a duplicate, or a member behind an
 * eager sender) is not, nor one for a call this node does not remember. */
START_TEST(test_late_hello_on_all) {
  st__coll_t* c = calloc(1, sizeof(*c));
  ck_assert_ptr_nonnull(c);
  st_node_id_t from;
  memset(&from, 0xab, sizeof from);
  char text[ST_COLL_REASON_MAX];
  st__coll_op_t op = ended_call(42);
  st_msg_coll_hello_t other = hello_of(42, 3, 0x2222);
  ck_assert(!st__coll_late_hello(c, &from, &other, text, sizeof text));
  st__coll_remember_all(c, &op);
  ck_assert(st__coll_late_hello(c, &from, &other, text, sizeof text));
  ck_assert_ptr_nonnull(strstr(text, "member abababab"));
  ck_assert_ptr_nonnull(strstr(text,
                               "it called all_reduce(sum, root 0) of 10 "
                               "float32 in a group of 3"));
  ck_assert_ptr_nonnull(strstr(text,
                               "; this member called all_reduce(sum, "
                               "root 0) of 10 float32 in a group of 2"));
  ck_assert_ptr_nonnull(strstr(text, "lists differ"));
  st_msg_coll_hello_t same = hello_of(42, 2, 0x1111);
  ck_assert(!st__coll_late_hello(c, &from, &same, text, sizeof text));
  st_msg_coll_hello_t unknown = hello_of(43, 3, 0x2222);
  ck_assert(!st__coll_late_hello(c, &from, &unknown, text, sizeof text));
  /* The ring keeps the last ST__COLL_ENDED_ALL calls on "all". */
  for (uint64_t i = 0; i < ST__COLL_ENDED_ALL - 1; i++) {
    st__coll_op_t later = ended_call(1000 + i);
    st__coll_remember_all(c, &later);
  }
  ck_assert(st__coll_late_hello(c, &from, &other, text, sizeof text));
  st__coll_op_t last = ended_call(5000);
  st__coll_remember_all(c, &last);
  ck_assert(!st__coll_late_hello(c, &from, &other, text, sizeof text));
  free(c);
}
END_TEST

/* Numbers `calls` calls on the list {a, b} at d; their op ids into ids. */
static void number_calls(st__daemon_t* d, st_node_id_t ids[2], size_t calls,
                         uint64_t* out) {
  for (size_t i = 0; i < calls; i++) {
    st__coll_group_t g;
    memset(&g, 0, sizeof g);
    g.ids = ids;
    g.n = 2;
    ck_assert_int_eq(st__coll_number(d, &g), 0);
    ck_assert_uint_eq(g.seq, i);
    out[i] = g.op_id;
  }
}

static void frame_hello(st__conn_t* c, uint64_t op_id, uint64_t members_hash) {
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_COLL_HELLO;
  m.u.coll_hello = hello_of(op_id, 2, members_hash);
  uint8_t buf[256];
  size_t len = 0;
  ck_assert_int_eq(st_wire_encode(&m, buf, sizeof buf, &len), 0);
  st__coll_on_frame(c, buf, len);
}

/* An eager sender 300 calls ahead of a member (beyond the last
 * ST__COLL_FINISHED ended ones): the member's late HELLO for the first
 * call, numbered here long ago, is dropped, not kept for 300 s where the
 * crossed-call rule would read it as a call waiting on another list; a
 * HELLO for a call not numbered here yet is kept for it. */
START_TEST(test_late_frame_of_numbered_call) {
  st__daemon_t* d = calloc(1, sizeof(*d));
  st__conn_t* c = calloc(1, sizeof(*c));
  ck_assert(d != NULL && c != NULL);
  st_node_id_t ids[2];
  memset(&ids[0], 1, sizeof ids[0]);
  memset(&ids[1], 2, sizeof ids[1]);
  c->d = d;
  c->peer = ids[1];
  enum { CALLS = ST__COLL_FINISHED + 44 };
  uint64_t* op = calloc(CALLS + 1, sizeof(*op));
  ck_assert_ptr_nonnull(op);
  number_calls(d, ids, CALLS, op);
  ck_assert(st__coll_was_numbered(&d->coll, op[0]));
  frame_hello(c, op[0], 0x3333);
  ck_assert_ptr_null(d->coll.pending);
  ck_assert_uint_eq(d->coll.pending_bytes, 0);
  /* The next call's id: this node has not numbered it yet. */
  st__daemon_t* ahead = calloc(1, sizeof(*ahead));
  ck_assert_ptr_nonnull(ahead);
  number_calls(ahead, ids, CALLS + 1, op);
  ck_assert(!st__coll_was_numbered(&d->coll, op[CALLS]));
  frame_hello(c, op[CALLS], 0x3333);
  ck_assert_ptr_nonnull(d->coll.pending);
  st__coll_close(ahead);
  st__coll_close(d);
  free(ahead);
  free(op);
  free(c);
  free(d);
}
END_TEST

static Suite* coll_suite(void) {
  Suite* s = suite_create("daemon_coll");
  TCase* tc = tcase_create("late");
  tcase_add_test(tc, test_late_hello_on_all);
  tcase_add_test(tc, test_late_frame_of_numbered_call);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(coll_suite());
  srunner_run_all(sr, CK_ENV);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
