/* daemon_coll.c: the user collectives on the node's side of the network
 * (gossip.h, "User collectives"; docs/collectives.md): the operations in
 * progress, each an st_coll_t machine; the groups they run in, frozen at
 * the call; the connections that carry them (one dialled COLL connection
 * per member we send to, kept open; frames come on the ones the others
 * dialled); messages for an operation this node has not started yet,
 * kept until it does; and failing operations fast: a member that dies or
 * leaves, a connection to one that closes, or the caller's deadline ends
 * every operation it is in, and the machine's ABORTs spread the failure
 * to the rest of the group. The program's side (the control socket's
 * "collectives" sessions) is daemon_coll_session.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/daemon/daemon_internal.h"

/* A message that came before its operation started here. */
typedef struct st__coll_pend_s {
  struct st__coll_pend_s* next;
  uint64_t op_id;
  st_node_id_t from;
  uint64_t at_ms;
  size_t len;
  uint8_t data[];
} pend_t;

/* A frame for a COLL connection whose stream is not up yet. */
struct st__coll_out_s {
  struct st__coll_out_s* next;
  size_t len;
  uint8_t data[];
};
typedef struct st__coll_out_s out_t;

static void sweep_cb(uv_timer_t* t);
static bool op_drain(st__daemon_t* d, st__coll_op_t* op);
static void forget_pending(st__daemon_t* d, uint64_t op_id,
                           const st_node_id_t* from);
static bool feed_pending(st__daemon_t* d, st__coll_op_t* op, uint64_t op_id,
                         bool aborts_only);

/* ---- Identities ----------------------------------------------------------
 */

static uint64_t hash64(const char* tag, const void* a, size_t alen,
                       uint64_t seq) {
  st_hash_t h;
  uint8_t out[ST_HASH_BYTES];
  st_hash_init(&h);
  st_hash_update(&h, tag, strlen(tag));
  st_hash_update(&h, a, alen);
  st_hash_update(&h, &seq, sizeof seq);
  st_hash_final(&h, out);
  uint64_t v;
  memcpy(&v, out, sizeof v);
  return v;
}

static int id_cmp(const void* a, const void* b) {
  return st_node_id_compare(a, b);
}

int st__coll_group(st__daemon_t* d, const st_node_id_t* ids, size_t n, bool all,
                   st__coll_group_t* g, char* err, size_t err_len) {
  memset(g, 0, sizeof(*g));
  size_t cap = all ? st_membership_count(d->m) : n;
  if (cap == 0 || cap > ST_COLL_MAX_MEMBERS) {
    st_set_err(err, err_len, "a group has 1 to %u members, not %zu",
               ST_COLL_MAX_MEMBERS, cap);
    return -EINVAL;
  }
  g->ids = calloc(cap, sizeof(*g->ids));
  if (g->ids == NULL)
    return -ENOMEM;
  if (all) {
    for (size_t i = 0; i < cap; i++) {
      const st_member_t* mb = st_membership_at(d->m, i);
      if (mb != NULL &&
          (mb->state == ST_MEMBER_ALIVE || mb->state == ST_MEMBER_SUSPECT))
        g->ids[g->n++] = mb->id;
    }
  } else {
    for (size_t i = 0; i < n; i++) {
      const st_member_t* mb = st_membership_find(d->m, &ids[i]);
      char hex[33];
      st_node_id_format(&ids[i], hex);
      if (mb == NULL ||
          (mb->state != ST_MEMBER_ALIVE && mb->state != ST_MEMBER_SUSPECT)) {
        st_set_err(err, err_len,
                   "member %s is not an alive member of the "
                   "cluster (see `starling peers`)",
                   hex);
        st__coll_group_free(g);
        return -ENOENT;
      }
      g->ids[g->n++] = ids[i];
    }
  }
  qsort(g->ids, g->n, sizeof(*g->ids), id_cmp);
  g->rank = UINT32_MAX;
  for (uint32_t i = 0; i < g->n; i++) {
    if (i > 0 && st_node_id_compare(&g->ids[i - 1], &g->ids[i]) == 0) {
      char hex[33];
      st_node_id_format(&g->ids[i], hex);
      st_set_err(err, err_len, "member %s is named twice in the group", hex);
      st__coll_group_free(g);
      return -EINVAL;
    }
    if (st_node_id_compare(&g->ids[i], &d->ident.id) == 0)
      g->rank = i;
  }
  if (g->rank == UINT32_MAX) {
    st_set_err(err, err_len, "this node is not in the group it was given");
    st__coll_group_free(g);
    return -EINVAL;
  }
  g->members_hash =
      hash64("starling-coll-members-v1", g->ids, g->n * sizeof(*g->ids), 0);
  g->all = all;
  return 0;
}

int st__coll_number(st__daemon_t* d, st__coll_group_t* g) {
  /* Per group key ("all", or the list), the calls made so far on this
   * node: every key a program ever used is kept (16 bytes each), since a
   * count lost here would put this node out of step with the others. */
  uint64_t key = g->all ? hash64("starling-coll-all-v1", "", 0, 0)
                        : hash64("starling-coll-list-v1", g->ids,
                                 g->n * sizeof(*g->ids), 0);
  if (g->tag != 0)
    key = hash64("starling-coll-tagged-v1", &key, sizeof key, g->tag);
  st__coll_seq_t* s = NULL;
  for (size_t i = 0; i < d->coll.n_seqs && s == NULL; i++)
    if (d->coll.seqs[i].key == key)
      s = &d->coll.seqs[i];
  if (s == NULL) {
    if (d->coll.n_seqs >= ST__COLL_MAX_KEYS)
      return -ENOSPC;
    if (d->coll.n_seqs == d->coll.cap_seqs) {
      size_t cap = d->coll.cap_seqs ? 2 * d->coll.cap_seqs : 16;
      st__coll_seq_t* p = realloc(d->coll.seqs, cap * sizeof(*p));
      if (p == NULL)
        return -ENOMEM;
      d->coll.seqs = p;
      d->coll.cap_seqs = cap;
    }
    s = &d->coll.seqs[d->coll.n_seqs++];
    s->key = key;
    s->next = 0;
  }
  g->key = key;
  g->seq = s->next++;
  g->op_id = hash64("starling-coll-op-v1", &key, sizeof key, g->seq);
  d->coll.numbered[d->coll.numbered_at++ % ST__COLL_NUMBERED] = g->op_id;
  return 0;
}

bool st__coll_was_numbered(const st__coll_t* c, uint64_t op_id) {
  for (size_t i = 0; i < ST__COLL_NUMBERED && op_id != 0; i++)
    if (c->numbered[i] == op_id)
      return true;
  return false;
}

uint64_t st__coll_tag(const char* space, const st_node_id_t* from,
                      const char* name, size_t len) {
  st_hash_t h;
  uint8_t out[ST_HASH_BYTES];
  uint32_t n = (uint32_t) len;
  st_hash_init(&h);
  st_hash_update(&h, "starling-coll-tag-v1", 20);
  st_hash_update(&h, space, strlen(space) + 1);
  st_hash_update(&h, from->b, sizeof from->b);
  st_hash_update(&h, &n, sizeof n);
  st_hash_update(&h, name, len);
  st_hash_final(&h, out);
  uint64_t v;
  memcpy(&v, out, sizeof v);
  return v | 1; /* never 0, which means no tag */
}

/* An operation that met nobody gives its number back, so that this node
 * stays in step with members that never made the call: only when it is
 * still the key's last number. */
static bool give_number_back(st__daemon_t* d, const st__coll_group_t* g) {
  for (size_t i = 0; i < d->coll.n_seqs; i++)
    if (d->coll.seqs[i].key == g->key && d->coll.seqs[i].next == g->seq + 1) {
      d->coll.seqs[i].next = g->seq;
      /* Not numbered any more: frames for it wait for the next call. */
      for (size_t k = 0; k < ST__COLL_NUMBERED; k++)
        if (d->coll.numbered[k] == g->op_id)
          d->coll.numbered[k] = 0;
      return true;
    }
  return false;
}

void st__coll_group_free(st__coll_group_t* g) {
  free(g->ids);
  g->ids = NULL;
  g->n = 0;
}

static int rank_of(const st__coll_op_t* op, const st_node_id_t* id) {
  const st_node_id_t* p = bsearch(id, op->g.ids, op->g.n, sizeof(*id), id_cmp);
  return p == NULL ? -1 : (int) (p - op->g.ids);
}

/* ---- Connections ---------------------------------------------------------
 */

static st__conn_t* conn_to(st__daemon_t* d, const st_node_id_t* id) {
  for (st__conn_t* c = d->conns; c != NULL; c = c->next)
    if (c->initiator && !c->closing && st__conn_purpose(c) == ST__CONN_COLL &&
        memcmp(&c->peer, id, sizeof(*id)) == 0)
      return c;
  return NULL;
}

/* Sends msg to member id on our COLL connection to it (dialled now when
 * there is none; queued until its stream is up). */
static int send_to(st__daemon_t* d, const st_node_id_t* id, const uint8_t* msg,
                   size_t len) {
  st__conn_t* c = conn_to(d, id);
  if (c == NULL && d->coll.stopping)
    return -EPIPE;
  if (c == NULL) {
    const st_member_t* mb = st_membership_find(d->m, id);
    if (mb == NULL)
      return -ENOENT;
    c = st__conn_dial(d, &mb->addr, id, ST__CONN_COLL);
    if (c == NULL)
      return -ECONNREFUSED;
    memcpy(&c->peer, id, sizeof(*id));
  }
  d->c.coll_bytes_out += len;
  /* Every frame reports its write (st__coll_on_sent), for pacing. */
  if (c->coll_out_head == NULL && st__conn_send(c, msg, len, true) == 0)
    return 0;
  out_t* o = malloc(sizeof(*o) + len);
  if (o == NULL)
    return -ENOMEM;
  o->next = NULL;
  o->len = len;
  memcpy(o->data, msg, len);
  if (c->coll_out_tail != NULL)
    c->coll_out_tail->next = o;
  else
    c->coll_out_head = o;
  c->coll_out_tail = o;
  return 0;
}

uint64_t st__coll_frames_queued(st__daemon_t* d, const st_node_id_t* id) {
  uint64_t n = 0;
  for (st__conn_t* c = d->conns; c != NULL; c = c->next) {
    if (!c->initiator || st__conn_purpose(c) != ST__CONN_COLL ||
        (id != NULL && memcmp(&c->peer, id, sizeof(*id)) != 0))
      continue;
    n += c->frames_out_pending;
    for (const out_t* o = c->coll_out_head; o != NULL; o = o->next)
      n++;
  }
  return n;
}

int st__coll_send_msg(st__daemon_t* d, const st_node_id_t* id,
                      const st_msg_t* msg) {
  uint8_t buf[ST__COLL_NAME_MAX + ST_COLL_REASON_MAX + 64];
  size_t len = 0;
  int rc = st_wire_encode(msg, buf, sizeof buf, &len);
  return rc != 0 ? rc : send_to(d, id, buf, len);
}

/* The stream is up: what waited goes out, in order. */
int st__coll_on_open(st__conn_t* c) {
  while (c->coll_out_head != NULL) {
    out_t* o = c->coll_out_head;
    int rc = st__conn_send(c, o->data, o->len, true);
    if (rc != 0)
      return rc;
    c->coll_out_head = o->next;
    if (c->coll_out_head == NULL)
      c->coll_out_tail = NULL;
    free(o);
  }
  return 0;
}

void st__coll_on_sent(st__conn_t* c) {
  st__daemon_t* d = c->d;
  bool any = false;
  for (const st__coll_op_t* op = d->coll.ops; op != NULL && !any; op = op->next)
    any = op->paced;
  if (!any || st__coll_frames_queued(d, &c->peer) > ST__COLL_PACE_FRAMES / 2)
    return;
  st__coll_op_t* op = d->coll.ops;
  while (op != NULL) {
    st__coll_op_t* next = op->next;
    if (op->paced)
      op_drain(d, op);
    op = next;
  }
}

static void free_out(st__conn_t* c) {
  while (c->coll_out_head != NULL) {
    out_t* o = c->coll_out_head;
    c->coll_out_head = o->next;
    free(o);
  }
  c->coll_out_tail = NULL;
}

/* ---- Operations ----------------------------------------------------------
 */

static void op_fail(st__daemon_t* d, st__coll_op_t* op, st_coll_result_t why,
                    const st_node_id_t* culprit, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void op_fail(st__daemon_t* d, st__coll_op_t* op, st_coll_result_t why,
                    const st_node_id_t* culprit, const char* fmt, ...) {
  /* The culprit's id goes into the sentence itself, so that the ABORT the
   * machine sends the others names it too. */
  char text[ST_COLL_REASON_MAX];
  size_t at = 0;
  if (culprit != NULL) {
    char hex[33];
    st_node_id_format(culprit, hex);
    at = (size_t) snprintf(text, sizeof text, "member %s: ", hex);
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text + at, sizeof text - at, fmt, ap);
  va_end(ap);
  st_coll_abort(op->m, why, op->g.n, text);
  op_drain(d, op);
}

static void remember_finished(st__daemon_t* d, uint64_t op_id) {
  d->coll.finished[d->coll.finished_at++ % ST__COLL_FINISHED] = op_id;
}

static bool recently_finished(const st__daemon_t* d, uint64_t op_id) {
  for (size_t i = 0; i < ST__COLL_FINISHED; i++)
    if (d->coll.finished[i] == op_id && op_id != 0)
      return true;
  return false;
}

static void op_unlink(st__daemon_t* d, st__coll_op_t* op) {
  for (st__coll_op_t** p = &d->coll.ops; *p != NULL; p = &(*p)->next)
    if (*p == op) {
      *p = op->next;
      return;
    }
}

/* Takes the machine's actions: SENDs to members, DONE to the caller;
 * a segment waits (op->paced) while ST__COLL_PACE_FRAMES frames wait to
 * go to its member. true when the operation ended (op is freed then). */
static bool op_drain(st__daemon_t* d, st__coll_op_t* op) {
  st_cact_t a;
  for (;;) {
    uint32_t to;
    op->paced =
        st_coll_next_is_segment(op->m, &to) &&
        st__coll_frames_queued(d, &op->g.ids[to]) >= ST__COLL_PACE_FRAMES;
    if (op->paced || !st_coll_next_action(op->m, &a))
      break;
    if (a.kind == ST_CACT_SEND) {
      int rc = send_to(d, &op->g.ids[a.to], a.data, a.len);
      if (rc != 0 && !st_coll_finished(op->m)) {
        char hex[33];
        st_node_id_format(&op->g.ids[a.to], hex);
        char text[120];
        snprintf(text, sizeof text, "member %s: cannot reach it (%s)", hex,
                 strerror(-rc));
        st_coll_abort(op->m, ST_COLL_FAIL_ABORTED, op->g.n, text);
      }
      continue;
    }
    /* DONE: the culprit's id leads the sentence. */
    char msg[ST_COLL_REASON_MAX + 80];
    if (a.result == ST_COLL_OK) {
      d->c.coll_ok++;
      msg[0] = '\0';
    } else {
      d->c.coll_failed++;
      char hex[33] = "";
      if (a.culprit < op->g.n)
        st_node_id_format(&op->g.ids[a.culprit], hex);
      snprintf(msg, sizeof msg, "%s%s%s%s",
               a.culprit < op->g.n ? "member " : "", hex,
               a.culprit < op->g.n ? ": " : "", a.why);
    }
    if (!op->withdrawn) { /* a withdrawn number is used again */
      remember_finished(d, op->g.op_id);
      if (op->g.all)
        st__coll_remember_all(&d->coll, op);
      /* What came for it and was kept (a member's first message to an
       * eager sender that had already finished when it started here)
       * will never be used. */
      forget_pending(d, op->g.op_id, NULL);
    }
    op_unlink(d, op);
    if (op->serving != NULL)
      st__store_served(d, op, a.result);
    else
      st__coll_session_done(op, a.result, msg);
    return true; /* the session (or the store) freed op */
  }
  return false;
}

int st__coll_start(st__daemon_t* d, st__coll_op_t* op, const void* input) {
  st_coll_spec_t spec;
  st_coll_spec_default(&spec);
  spec.op_id = op->g.op_id;
  spec.kind = op->kind;
  spec.rop = op->rop;
  spec.dtype = op->dtype;
  spec.root = op->root;
  spec.count = op->count;
  spec.n = op->g.n;
  spec.rank = op->g.rank;
  spec.members_hash = op->g.members_hash;
  int rc = op->work != NULL ? st_coll_new_in(&spec, op->work, &op->m)
                            : st_coll_new(&spec, input, &op->m);
  if (rc != 0)
    return rc;
  op->started_ms = op->heard_ms = st__dnow(d);
  op->next = d->coll.ops;
  d->coll.ops = op;
  if (!uv_is_active((uv_handle_t*) &d->coll.sweep))
    uv_timer_start(&d->coll.sweep, sweep_cb, 100, 100);
  if (op_drain(d, op))
    return 0;
  /* What came early, in arrival order; but an ABORT first: members that
   * gave up on this operation before it started here (their timeout) must
   * not let it complete on their early HELLOs. */
  uint64_t op_id = op->g.op_id;
  for (int pass = 0; pass < 2; pass++)
    if (feed_pending(d, op, op_id, pass == 0))
      return 0;
  return 0;
}

/* Feeds op the kept messages of op_id (only ABORTs when aborts_only); true
 * when op ended. */
static bool feed_pending(st__daemon_t* d, st__coll_op_t* op, uint64_t op_id,
                         bool aborts_only) {
  pend_t** p = &d->coll.pending;
  while (*p != NULL) {
    pend_t* e = *p;
    uint64_t type = 0;
    if (e->op_id != op_id ||
        (aborts_only && (st_wire_peek_type(e->data, e->len, &type) != 0 ||
                         type != ST_MSG_COLL_ABORT))) {
      p = &e->next;
      continue;
    }
    *p = e->next;
    d->coll.pending_bytes -= e->len;
    bool ended = st__coll_feed(d, op, &e->from, e->data, e->len);
    free(e);
    if (ended)
      return true; /* the rest are dropped as late when they are swept */
  }
  return false;
}

/* ---- Calls on "all" over other lists ------------------------------------
 *
 * Only a call on "all" shares its operation id with calls over other lists
 * (an explicit list's id hashes the list): when two nodes' views of the
 * members differed at the call, each waits for what the other never sends.
 * Every member's HELLO goes to every other member, so the node that gets
 * one naming another list answers it.
 */

/* "all_reduce(sum, root 0) of 10 float32 in a group of 2 (members h)". */
static void call_text(char* out, size_t len, uint8_t kind, uint8_t rop,
                      uint32_t root, uint64_t count, uint8_t dtype, uint32_t n,
                      uint64_t members_hash) {
  snprintf(out, len,
           "%s(%s, root %u) of %llu %s in a group of %u "
           "(members %016llx)",
           st_coll_kind_name(kind), st_coll_rop_name(rop), root,
           (unsigned long long) count, st_coll_dtype_name(dtype), n,
           (unsigned long long) members_hash);
}

static st__conn_t* conn_from(st__daemon_t* d, const st_node_id_t* id) {
  for (st__conn_t* c = d->conns; c != NULL; c = c->next)
    if (!c->initiator && !c->closing && st__conn_purpose(c) == ST__CONN_COLL &&
        memcmp(&c->peer, id, sizeof(*id)) == 0)
      return c;
  return NULL;
}

/* Sends member `to` a COLL_ABORT of op_id with the sentence text: on this
 * node's connection to it, or, when this node does not hold it in its
 * membership table (it has just joined: there is no address to dial), on
 * the connection it dialled to this node, which it reads too. */
static void tell_abort(st__daemon_t* d, const st_node_id_t* to, uint64_t op_id,
                       const char* text) {
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_COLL_ABORT;
  m.u.coll_abort = (st_msg_coll_abort_t){
      .op_id = op_id, .reason = text, .reason_len = (uint32_t) strlen(text)};
  uint8_t buf[ST_COLL_REASON_MAX + 128];
  size_t len = 0;
  if (st_wire_encode(&m, buf, sizeof buf, &len) != 0)
    return;
  st__conn_t* c = conn_from(d, to);
  if (st_membership_find(d->m, to) != NULL || c == NULL)
    (void) send_to(d, to, buf, len);
  else
    (void) st__conn_send(c, buf, len, true);
}

static bool alive(const st__daemon_t* d, const st_node_id_t* id) {
  const st_member_t* mb = st_membership_find(d->m, id);
  return mb != NULL &&
         (mb->state == ST_MEMBER_ALIVE || mb->state == ST_MEMBER_SUSPECT);
}

/* A HELLO of op's operation id from a member that is not in op's group,
 * op on "all" (else it is dropped, counted). The sender is told with a
 * COLL_ABORT naming both calls (op's own ABORTs go to its group, which
 * lacks it). When this node holds the sender alive or suspect, op fails
 * as that mismatch too; a sender it does not hold (a node that only holds
 * the cluster key cannot fail calls it has no part in) learns of its own
 * call's mismatch, and op goes on. true: op ended. */
static bool foreign_hello(st__daemon_t* d, st__coll_op_t* op,
                          const st_node_id_t* from,
                          const st_msg_coll_hello_t* h) {
  if (!op->g.all) {
    d->c.coll_dropped++;
    return false;
  }
  char hex[33], theirs[160], ours[160], text[ST_COLL_REASON_MAX];
  st_node_id_format(from, hex);
  call_text(theirs, sizeof theirs, h->kind, h->rop, h->root, h->count, h->dtype,
            h->n, h->members_hash);
  call_text(ours, sizeof ours, (uint8_t) op->kind, (uint8_t) op->rop, op->root,
            op->count, (uint8_t) op->dtype, op->g.n, op->g.members_hash);
  snprintf(text, sizeof text,
           "member %s: it called %s with this node in it; this member called "
           "%s without it (the members' lists differ; with \"all\", their "
           "views of the cluster did)",
           hex, theirs, ours);
  tell_abort(d, from, op->g.op_id, text);
  if (!alive(d, from))
    return false;
  st_coll_abort(op->m, ST_COLL_FAIL_MISMATCH, op->g.n, text);
  return op_drain(d, op);
}

void st__coll_remember_all(st__coll_t* c, const st__coll_op_t* op) {
  c->ended_all[c->ended_all_at++ % ST__COLL_ENDED_ALL] =
      (st__coll_ended_t){.op_id = op->g.op_id,
                         .members_hash = op->g.members_hash,
                         .count = op->count,
                         .n = op->g.n,
                         .root = op->root,
                         .kind = (uint8_t) op->kind,
                         .rop = (uint8_t) op->rop,
                         .dtype = (uint8_t) op->dtype};
}

/* A HELLO for a call on "all" that ended here, over another list: the
 * sender's view of "all" differed, and its call waits for this node's
 * part, which is over. The same list (a duplicate, or a member that sent
 * its HELLO to an eager sender that had already returned) is not one. */
bool st__coll_late_hello(const st__coll_t* c, const st_node_id_t* from,
                         const st_msg_coll_hello_t* h, char* text, size_t len) {
  const st__coll_ended_t* e = NULL;
  for (size_t i = 0; i < ST__COLL_ENDED_ALL && e == NULL; i++)
    if (c->ended_all[i].op_id == h->op_id && h->op_id != 0)
      e = &c->ended_all[i];
  if (e == NULL || e->members_hash == h->members_hash)
    return false;
  char hex[33], theirs[160], ours[160];
  st_node_id_format(from, hex);
  call_text(theirs, sizeof theirs, h->kind, h->rop, h->root, h->count, h->dtype,
            h->n, h->members_hash);
  call_text(ours, sizeof ours, e->kind, e->rop, e->root, e->count, e->dtype,
            e->n, e->members_hash);
  snprintf(text, len,
           "member %s: it called %s; this member called %s, which had ended "
           "here before that call came (the members' lists differ; with "
           "\"all\", their views of the cluster did)",
           hex, theirs, ours);
  return true;
}

bool st__coll_feed(st__daemon_t* d, st__coll_op_t* op, const st_node_id_t* from,
                   const uint8_t* data, size_t len) {
  int r = rank_of(op, from);
  st_msg_t msg;
  if ((uint32_t) r == op->g.rank ||
      st_wire_decode(data, len, &msg, &d->wc) != 0) {
    d->c.coll_dropped++;
    return false;
  }
  if (r < 0) {
    bool ended = msg.type == ST_MSG_COLL_HELLO &&
                 foreign_hello(d, op, from, &msg.u.coll_hello);
    if (msg.type != ST_MSG_COLL_HELLO)
      d->c.coll_dropped++;
    st_wire_msg_free(&msg);
    return ended;
  }
  op->heard_ms = st__dnow(d);
  st_coll_message(op->m, (uint32_t) r, &msg);
  st_wire_msg_free(&msg);
  return op_drain(d, op);
}

/* Drops what `from` (NULL: anyone) sent for op_id and is kept: before it
 * withdrew the call, or for an operation that ended here. Not counted:
 * nothing was lost. */
static void forget_pending(st__daemon_t* d, uint64_t op_id,
                           const st_node_id_t* from) {
  pend_t** p = &d->coll.pending;
  while (*p != NULL) {
    pend_t* e = *p;
    if (e->op_id == op_id &&
        (from == NULL || memcmp(&e->from, from, sizeof(*from)) == 0)) {
      *p = e->next;
      d->coll.pending_bytes -= e->len;
      free(e);
    } else {
      p = &e->next;
    }
  }
}

static st__coll_op_t* find_op(st__daemon_t* d, uint64_t op_id) {
  for (st__coll_op_t* op = d->coll.ops; op != NULL; op = op->next)
    if (op->g.op_id == op_id)
      return op;
  return NULL;
}

/* A COLL_FETCH: an ASK for a tensor published here (an op id in use or
 * just ended here is a replay, dropped), or the publisher's refusal of
 * one of our fetches, which ends it naming the publisher. */
static void on_fetch(st__conn_t* c, const st_msg_coll_fetch_t* f) {
  st__daemon_t* d = c->d;
  st__coll_op_t* op = find_op(d, f->op_id);
  if (f->code == ST_COLL_FETCH_ASK) {
    if (op != NULL || recently_finished(d, f->op_id)) {
      d->c.coll_dropped++;
      return;
    }
    if (st__store_on_ask(c, f) != 0)
      remember_finished(d, f->op_id); /* its ABORT is dropped quietly */
    return;
  }
  if (op == NULL || !op->fetch || rank_of(op, &c->peer) != (int) op->root) {
    d->c.coll_dropped++;
    return;
  }
  op->refused = f->code;
  op_fail(d, op, ST_COLL_FAIL_ABORTED, &c->peer, "%.*s", (int) f->text_len,
          f->text);
}

/* Keeps a frame of an operation not started here, until it does. */
static void keep(st__daemon_t* d, const st_node_id_t* from, uint64_t op_id,
                 const uint8_t* msg, size_t len) {
  if (d->coll.pending_bytes + len > ST__COLL_PENDING_MAX) {
    d->c.coll_dropped++;
    return;
  }
  pend_t* e = malloc(sizeof(*e) + len);
  if (e == NULL) {
    d->c.coll_dropped++;
    return;
  }
  *e =
      (pend_t){.op_id = op_id, .from = *from, .at_ms = st__dnow(d), .len = len};
  memcpy(e->data, msg, len);
  pend_t** p = &d->coll.pending;
  while (*p != NULL)
    p = &(*p)->next;
  *p = e;
  d->coll.pending_bytes += len;
}

/* A frame on a COLL connection: to its operation; answered, when it is a
 * late HELLO over another list for a call on "all" that ended here;
 * dropped, when its operation ended here; else kept for it. */
void st__coll_on_frame(st__conn_t* c, const uint8_t* msg, size_t len) {
  st__daemon_t* d = c->d;
  st_msg_t m;
  d->c.coll_bytes_in += len;
  if (st_wire_decode(msg, len, &m, &d->wc) != 0) {
    d->c.coll_dropped++;
    st__conn_close(c);
    return;
  }
  if (m.type == ST_MSG_COLL_FETCH) {
    on_fetch(c, &m.u.coll_fetch);
    st_wire_msg_free(&m);
    return;
  }
  uint64_t op_id = m.type == ST_MSG_COLL_HELLO   ? m.u.coll_hello.op_id
                   : m.type == ST_MSG_COLL_SEG   ? m.u.coll_seg.op_id
                   : m.type == ST_MSG_COLL_ABORT ? m.u.coll_abort.op_id
                                                 : 0;
  bool coll = m.type == ST_MSG_COLL_HELLO || m.type == ST_MSG_COLL_SEG ||
              m.type == ST_MSG_COLL_ABORT;
  /* An ABORT without a reason: the sender withdrew a call that met
   * nobody (st_coll_withdraw). */
  bool withdrawn =
      m.type == ST_MSG_COLL_ABORT && m.u.coll_abort.reason_len == 0;
  st__coll_op_t* op = find_op(d, op_id);
  char text[ST_COLL_REASON_MAX];
  bool late = op == NULL && m.type == ST_MSG_COLL_HELLO &&
              st__coll_late_hello(&d->coll, &c->peer, &m.u.coll_hello, text,
                                  sizeof text);
  st_wire_msg_free(&m);
  if (!coll) {
    d->c.coll_dropped++;
    st__conn_close(c);
  } else if (op != NULL) {
    st__coll_feed(d, op, &c->peer, msg, len);
  } else if (late) {
    tell_abort(d, &c->peer, op_id, text);
  } else if (recently_finished(d, op_id) ||
             st__coll_was_numbered(&d->coll, op_id)) {
    /* The rest of an operation that ended here. */
  } else if (withdrawn) {
    forget_pending(d, op_id, &c->peer);
  } else {
    keep(d, &c->peer, op_id, msg, len);
  }
}

/* The connection ended: operations that wait on its member fail. */
void st__coll_on_closed(st__conn_t* c) {
  st__daemon_t* d = c->d;
  bool owed = c->coll_out_head != NULL;
  free_out(c);
  st__coll_op_t* op = d->coll.ops;
  while (op != NULL) {
    st__coll_op_t* next = op->next;
    if (rank_of(op, &c->peer) >= 0 && (owed || !c->initiator))
      op_fail(d, op, ST_COLL_FAIL_ABORTED, &c->peer,
              "the connection to it closed");
    op = next;
  }
}

void st__coll_on_member_gone(st__daemon_t* d, const st_node_id_t* id,
                             bool left) {
  st__coll_op_t* op = d->coll.ops;
  while (op != NULL) {
    st__coll_op_t* next = op->next;
    if (rank_of(op, id) >= 0)
      op_fail(d, op, ST_COLL_FAIL_ABORTED, id,
              left ? "it left the cluster"
                   : "it is dead (the failure detector declared it)");
    op = next;
  }
  for (st__conn_t* c = d->conns; c != NULL; c = c->next)
    if (st__conn_purpose(c) == ST__CONN_COLL && !c->closing &&
        memcmp(&c->peer, id, sizeof(*id)) == 0)
      st__conn_close(c);
}

void st__coll_abort_op(st__daemon_t* d, st__coll_op_t* op, const char* why) {
  op_fail(d, op, ST_COLL_FAIL_ABORTED, NULL, "%s", why);
}

/* Whether op has heard from no member yet. */
static bool heard_nobody(const st__coll_op_t* op) {
  bool nobody = true;
  for (uint32_t r = 0; r < op->g.n; r++)
    nobody &= r == op->g.rank || !st_coll_heard(op->m, r);
  return nobody;
}

/* Whether the kept message e is a HELLO whose sender had not given its
 * operation up by `since` (no ABORT of it kept from then or before: one
 * that came later, while this node's call waited, still shows a crossing);
 * its fields into h. */
static bool live_hello(const st__daemon_t* d, const pend_t* e, uint64_t since,
                       st_msg_coll_hello_t* h) {
  st_msg_t m;
  if (st_wire_decode(e->data, e->len, &m, NULL) != 0)
    return false;
  bool hello = m.type == ST_MSG_COLL_HELLO;
  if (hello) {
    *h = m.u.coll_hello;
    h->data = NULL;
    h->data_len = 0;
  }
  st_wire_msg_free(&m);
  for (const pend_t* a = d->coll.pending; hello && a != NULL; a = a->next) {
    uint64_t type = 0;
    if (a->op_id == e->op_id && a->at_ms <= since &&
        memcmp(&a->from, &e->from, sizeof a->from) == 0 &&
        st_wire_peek_type(a->data, a->len, &type) == 0 &&
        type == ST_MSG_COLL_ABORT)
      hello = false;
  }
  return hello;
}

/* The crossed-call rule (docs/collectives.md, "Crossed calls"): op, a
 * call with no timeout, has heard nothing for ST__COLL_CROSSED_MS, and a
 * member it has not heard from sent this node, at least as long ago, the
 * HELLO of an operation over another member list that was never called
 * here. That member waits there, and this node's program waits here: with
 * one call at a time per program neither ever arrives (lists that differ,
 * or calls in another order). op fails as a mismatch naming both calls;
 * its sentence has the shape of the machine's own mismatch (gossip/coll.c,
 * hello_matches). */
static bool crossed_call(st__daemon_t* d, st__coll_op_t* op, uint64_t now) {
  /* A call with a timeout waits as long as its caller said; a fetch, and
   * its serving, wait on no program but this one. */
  if (op->deadline_ms != 0 || op->fetch || op->serving != NULL ||
      now - op->heard_ms < ST__COLL_CROSSED_MS)
    return false;
  for (const pend_t* e = d->coll.pending; e != NULL; e = e->next) {
    int r = rank_of(op, &e->from);
    st_msg_coll_hello_t h;
    if (now - e->at_ms < ST__COLL_CROSSED_MS || r < 0 ||
        st_coll_heard(op->m, (uint32_t) r) ||
        !live_hello(d, e, op->started_ms, &h) ||
        h.members_hash == op->g.members_hash)
      continue;
    char hex[33], text[ST_COLL_REASON_MAX];
    st_node_id_format(&e->from, hex);
    snprintf(text, sizeof text,
             "member %s: rank %d called %s(%s, root %u) of %llu %s in a "
             "group of %u (members %016llx); rank %u (this member) called "
             "%s(%s, root %u) of %llu %s in a group of %u (members %016llx): "
             "it has waited there for %.1f s while this call waited for it "
             "(every member must call with the same group list, in the "
             "same order)",
             hex, r, st_coll_kind_name(h.kind), st_coll_rop_name(h.rop), h.root,
             (unsigned long long) h.count, st_coll_dtype_name(h.dtype), h.n,
             (unsigned long long) h.members_hash, op->g.rank,
             st_coll_kind_name(op->kind), st_coll_rop_name(op->rop), op->root,
             (unsigned long long) op->count, st_coll_dtype_name(op->dtype),
             op->g.n, (unsigned long long) op->g.members_hash,
             (double) (now - e->at_ms) / 1000.0);
    /* Not withdrawn even when it met nobody: the member it crossed keeps
     * this ABORT beside this call's HELLO, which is how its own call sees
     * the crossing too, and how a later call on this list there fails at
     * once (in step again) rather than waiting. */
    st_coll_abort(op->m, ST_COLL_FAIL_MISMATCH, op->g.n, text);
    op_drain(d, op);
    return true;
  }
  return false;
}

/* Deadlines, crossed calls, and messages kept too long for an operation
 * that never came here. */
static void sweep_cb(uv_timer_t* t) {
  st__daemon_t* d = t->data;
  uint64_t now = st__dnow(d);
  st__coll_op_t* op = d->coll.ops;
  while (op != NULL) {
    st__coll_op_t* next = op->next;
    /* A paced operation goes on from its writes (st__coll_on_sent); here
     * too, in case the connection it waited on closed instead. */
    if (crossed_call(d, op, now) || (op->paced && op_drain(d, op))) {
      op = next;
      continue;
    }
    if (op->deadline_ms != 0 && now >= op->deadline_ms) {
      char waiting[256] = "";
      size_t w = 0;
      for (uint32_t r = 0; r < op->g.n && w + 40 < sizeof waiting; r++)
        if (r != op->g.rank && !st_coll_heard(op->m, r)) {
          char hex[33];
          st_node_id_format(&op->g.ids[r], hex);
          w += (size_t) snprintf(waiting + w, sizeof waiting - w, "%s%.12s",
                                 w ? ", " : "; no word yet from ", hex);
        }
      bool nobody = heard_nobody(op);
      char text[ST_COLL_REASON_MAX];
      snprintf(text, sizeof text, "timed out after %.1f s%s%s",
               (double) (now - op->started_ms) / 1000.0, waiting,
               nobody ? " (no member called it: the call is withdrawn, "
                        "and the next one takes its place)"
                      : "");
      /* Met nobody: withdraw (the others forget what we sent) and give
       * the number back; else fail it everywhere. */
      op->withdrawn = nobody && give_number_back(d, &op->g) &&
                      st_coll_withdraw(op->m, text) == 0;
      if (!op->withdrawn)
        st_coll_abort(op->m, ST_COLL_FAIL_TIMEOUT, op->g.n, text);
      op_drain(d, op);
    }
    op = next;
  }
  pend_t** p = &d->coll.pending;
  while (*p != NULL) {
    pend_t* e = *p;
    if (now - e->at_ms > ST__COLL_PENDING_MS) {
      *p = e->next;
      d->coll.pending_bytes -= e->len;
      d->c.coll_dropped++;
      free(e);
    } else {
      p = &e->next;
    }
  }
  if (d->coll.ops == NULL && d->coll.pending == NULL)
    uv_timer_stop(t);
}

void st__coll_init(st__daemon_t* d) {
  uv_timer_init(&d->loop, &d->coll.sweep);
  d->coll.sweep.data = d;
  d->coll.sweep_open = true;
}

void st__coll_close(st__daemon_t* d) {
  d->coll.stopping = true;
  st__coll_op_t* op = d->coll.ops;
  while (op != NULL) {
    st__coll_op_t* next = op->next;
    op_fail(d, op, ST_COLL_FAIL_ABORTED, NULL, "the node is stopping");
    op = next;
  }
  st__coll_sessions_close(d);
  while (d->coll.pending != NULL) {
    pend_t* e = d->coll.pending;
    d->coll.pending = e->next;
    free(e);
  }
  d->coll.pending_bytes = 0;
  st__store_close(d);
  free(d->coll.seqs);
  d->coll.seqs = NULL;
  d->coll.n_seqs = d->coll.cap_seqs = 0;
  if (d->coll.sweep_open) {
    uv_timer_stop(&d->coll.sweep);
    uv_close((uv_handle_t*) &d->coll.sweep, NULL);
    d->coll.sweep_open = false;
  }
}
