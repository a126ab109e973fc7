/* daemon_admin_net.c: cluster requests: `starling keys --cluster` and
 * `starling force-leave --cluster`. This node does what was asked itself,
 * then asks every live member to do the same over the authenticated TCP
 * transport (ADMIN_REQ, answered by one ADMIN_REPLY; gossip.h, "Cluster
 * requests"; docs/protocol.md); and this node's answer to a member that
 * asks. Every node decides by the same rules, the asking one included,
 * from what it sees itself: a key change that would cut a live member off
 * is refused (daemon_keys.c), and so is forgetting a member that is alive
 * here (daemon_force_leave.c). Whoever asks, no member can make another
 * shut out or forget a live one.
 *
 * Asking: one request at a time on a node. The change is made here first
 * (nothing is sent when this node refuses it); then every other member
 * this node holds alive or suspect is dialled, and the control client is
 * answered once each has answered or ADMIN_DEADLINE_MS has passed: one
 * line (or JSON entry) per member, "done", "already", "refused: WHY" or
 * "no answer: WHY". A member that joins meanwhile is not asked: run the
 * command again (a repeat is answered "already" where it was done).
 *
 * Asked: an ADMIN_REQ on an authenticated connection from a member this
 * node holds alive or suspect gets one ADMIN_REPLY (the result, this
 * node's keys after it, the reason); anything else is closed unanswered
 * and counted (rejected.cluster_request in status --json).
 */
#include "node/daemon/daemon_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Longer than a connection's own deadline (ST__HANDSHAKE_DEADLINE_MS, the
 * whole conversation), shorter than the CLI's 10 s wait for an answer. */
#define ADMIN_DEADLINE_MS 7000u
#define REASON_KEPT 200
/* A member that refuses is asked once more this much later: it judges
 * from its own view of the members' status, which may lag this node's by
 * a gossip round or two (a member's new keys not heard there yet). */
#define RETRY_AFTER_MS 1500u

typedef enum { T_WAITING, T_DONE, T_ALREADY, T_REFUSED, T_NO_ANSWER } tstate_t;

static const char* const kResult[] = {"waiting", "done", "already", "refused",
                                      "no answer"};

typedef struct {
  st_node_id_t id;
  uint8_t state; /* tstate_t */
  bool retried;
  uint64_t retry_at_ms; /* a refused member is asked again then; 0: not */
  char reason[REASON_KEPT];
} target_t;

struct st__admin_op_s {
  st__daemon_t* d;
  int fd; /* the control client's, dup'd */
  bool json;
  st_msg_admin_req_t req; /* holds an install's key: wiped at the end */
  uint8_t local;          /* this node's own result: st_admin_result_t */
  target_t* t;
  uint32_t n, waiting;
  uint64_t deadline_ms;
};

static const char* const kOpName[] = {"", "install", "use", "remove",
                                      "force-leave"};

/* What the request is about, for the answer and the log: "key 167" or
 * "member 7cc3a1b2c4d5". */
static void subject_name(const st_msg_admin_req_t* q, char* out, size_t len) {
  if (q->op == ST_ADMIN_FORCE_LEAVE) {
    st_node_id_t id;
    memcpy(id.b, q->subject, sizeof id.b);
    char hex[33];
    st_node_id_format(&id, hex);
    snprintf(out, len, "member %.12s", hex);
  } else {
    snprintf(out, len, "key %u", (unsigned) q->key_id);
  }
}

/* One request, under the rules of its kind. */
static st_admin_result_t grant(st__daemon_t* d, const st_msg_admin_req_t* q,
                               const char* asked_by, char* err,
                               size_t err_len) {
  if (q->op != ST_ADMIN_FORCE_LEAVE)
    return st__keys_grant(d, q, asked_by, err, err_len);
  st_node_id_t id;
  memcpy(id.b, q->subject, sizeof id.b);
  return st__force_leave_grant(d, &id, asked_by, err, err_len);
}

/* ---- Answering the control client -------------------------------------- */

static void say(int fd, const char* text, size_t len) {
  (void) !send(fd, text, len, MSG_NOSIGNAL | MSG_DONTWAIT);
}

static void say_error(int fd, bool json, const char* err) {
  st_json_buf_t b;
  st_json_buf_init(&b);
  st__put_error(&b, json, err);
  if (!b.failed)
    say(fd, b.p, b.len);
  st_json_buf_free(&b);
}

/* One member's line or JSON entry. */
static void put_member(st_json_buf_t* b, bool json, bool first,
                       const st_node_id_t* id, bool self, uint8_t state,
                       const char* reason) {
  char hex[33], line[160];
  st_node_id_format(id, hex);
  if (json) {
    snprintf(line, sizeof line,
             "%s{\"id\":\"%s\",\"self\":%s,\"result\":\"%s\"", first ? "" : ",",
             hex, self ? "true" : "false", kResult[state]);
    st_json_buf_puts(b, line);
    if (reason[0] != '\0') {
      st_json_buf_puts(b, ",\"reason\":");
      st_json_buf_string(b, reason);
    }
    st_json_buf_puts(b, "}");
    return;
  }
  snprintf(line, sizeof line, "%.12s%s  %s%s", hex, self ? "*" : " ",
           kResult[state], reason[0] != '\0' ? ": " : "");
  st_json_buf_puts(b, line);
  st_json_buf_puts(b, reason);
  st_json_buf_puts(b, "\n");
}

/* The answer: a summary (an error when any member refused or did not
 * answer), then every member, this node first. */
static void answer(struct st__admin_op_s* op) {
  uint32_t failed = 0;
  for (uint32_t i = 0; i < op->n; i++)
    failed += op->t[i].state == T_REFUSED || op->t[i].state == T_NO_ANSWER;
  char summary[200], what[40];
  subject_name(&op->req, what, sizeof what);
  snprintf(summary, sizeof summary,
           "%s %s on %u members: %u refused or did not answer%s",
           kOpName[op->req.op], what, op->n + 1, failed,
           failed ? " (run it again once the cause is fixed)" : "");
  st_json_buf_t b;
  st_json_buf_init(&b);
  if (op->json) {
    st_json_buf_puts(&b, failed ? "{\"error\":" : "{\"summary\":");
    st_json_buf_string(&b, summary);
    char head[96];
    snprintf(head, sizeof head, ",\"op\":\"%s\",", kOpName[op->req.op]);
    st_json_buf_puts(&b, head);
    if (op->req.op == ST_ADMIN_FORCE_LEAVE) {
      st_node_id_t id;
      char hex[33];
      memcpy(id.b, op->req.subject, sizeof id.b);
      st_node_id_format(&id, hex);
      snprintf(head, sizeof head, "\"member\":\"%s\",\"members\":[", hex);
    } else {
      snprintf(head, sizeof head, "\"key\":%u,\"members\":[",
               (unsigned) op->req.key_id);
    }
    st_json_buf_puts(&b, head);
  } else {
    st_json_buf_puts(&b, failed ? "error: " : "");
    st_json_buf_puts(&b, summary);
    st_json_buf_puts(&b, "\n");
  }
  put_member(&b, op->json, true, &op->d->ident.id, true,
             op->local == ST_ADMIN_DONE ? T_DONE : T_ALREADY, "");
  for (uint32_t i = 0; i < op->n; i++)
    put_member(&b, op->json, false, &op->t[i].id, false, op->t[i].state,
               op->t[i].reason);
  if (op->json)
    st_json_buf_puts(&b, "]}\n");
  if (!b.failed)
    say(op->fd, b.p, b.len);
  st_json_buf_free(&b);
}

/* Answers the client and ends the request; connections still asking let
 * go of it (their own deadline closes them). */
static void finish(struct st__admin_op_s* op) {
  st__daemon_t* d = op->d;
  for (st__conn_t* c = d->conns; c != NULL; c = c->next)
    if (c->admin_op == op)
      c->admin_op = NULL;
  answer(op);
  close(op->fd);
  st_crypto_wipe(&op->req, sizeof op->req);
  free(op->t);
  free(op);
  d->admin_op = NULL;
}

static void settle(target_t* t, tstate_t state, const char* reason,
                   size_t reason_len) {
  t->state = (uint8_t) state;
  if (reason_len >= sizeof t->reason)
    reason_len = sizeof t->reason - 1;
  memcpy(t->reason, reason, reason_len);
  t->reason[reason_len] = '\0';
  for (char* c = t->reason; *c != '\0'; c++)     /* a member's words: no */
    if ((unsigned char) *c < 0x20 || *c == 0x7f) /* control bytes */
      *c = '?';
}

/* A member answered or will not: the request ends with the last (true:
 * it ended, op is gone). A refusal is kept waiting for one retry. */
static bool target_done(struct st__admin_op_s* op, uint32_t i, tstate_t state,
                        const char* reason, size_t reason_len) {
  if (i >= op->n || op->t[i].state != T_WAITING)
    return false;
  uint64_t retry_at = st__dnow(op->d) + RETRY_AFTER_MS;
  if (state == T_REFUSED && !op->t[i].retried &&
      retry_at + ST__HANDSHAKE_DEADLINE_MS <= op->deadline_ms) {
    op->t[i].retried = true;
    op->t[i].retry_at_ms = retry_at;
    return false; /* still waiting: the sweep asks again */
  }
  settle(&op->t[i], state, reason, reason_len);
  if (--op->waiting > 0)
    return false;
  finish(op);
  return true;
}

/* ---- Asking ------------------------------------------------------------ */

/* Dials target i; false when that cannot start (then it is the caller's
 * to settle). */
static bool dial(struct st__admin_op_s* op, uint32_t i,
                 const st_wire_addr_t* addr) {
  st__conn_t* c = st__conn_dial(op->d, addr, &op->t[i].id, ST__CONN_ADMIN);
  if (c == NULL)
    return false;
  c->peer = op->t[i].id;
  c->admin_op = op;
  c->admin_target = i;
  return true;
}

/* Dials every other live member; a member that cannot be dialled is
 * settled at once. */
static void ask_members(struct st__admin_op_s* op) {
  st__daemon_t* d = op->d;
  size_t count = st_membership_count(d->m);
  op->t = calloc(count > 0 ? count : 1, sizeof *op->t);
  if (op->t == NULL)
    return;
  for (size_t i = 0; i < count; i++) {
    const st_member_t* mb = st_membership_at(d->m, i);
    if (mb == NULL ||
        (mb->state != ST_MEMBER_ALIVE && mb->state != ST_MEMBER_SUSPECT) ||
        memcmp(&mb->id, &d->ident.id, sizeof mb->id) == 0)
      continue;
    st_member_t m = *mb;
    target_t* t = &op->t[op->n];
    t->id = m.id;
    t->state = T_WAITING;
    op->n++;
    op->waiting++;
    if (!dial(op, op->n - 1, &m.addr)) { /* the caller finishes if none wait */
      static const char why[] = "cannot connect";
      settle(t, T_NO_ANSWER, why, sizeof why - 1);
      op->waiting--;
    }
  }
}

/* The refused members due to be asked again. */
static void retry_due(struct st__admin_op_s* op, uint64_t now) {
  for (uint32_t i = 0; i < op->n && op->waiting > 0; i++) {
    target_t* t = &op->t[i];
    if (t->state != T_WAITING || t->retry_at_ms == 0 || now < t->retry_at_ms)
      continue;
    t->retry_at_ms = 0;
    const st_member_t* mb = st_membership_find(op->d->m, &t->id);
    st_wire_addr_t addr;
    if (mb != NULL)
      addr = mb->addr;
    static const char why[] = "gone before it could be asked again";
    if ((mb == NULL || !dial(op, i, &addr)) &&
        target_done(op, i, T_NO_ANSWER, why, sizeof why - 1))
      return;
  }
}

/* The request on the control line: "keys ..." (daemon_keys.c parses it)
 * or "force-leave ID". 0, or a negative errno with the sentence in err. */
static int parse(st__daemon_t* d, const char* verb, char* args,
                 st_msg_admin_req_t* q, char* err, size_t err_len) {
  if (strcmp(verb, "force-leave") == 0) {
    st_node_id_t id;
    int rc = st__force_leave_resolve(d, args, &id, err, err_len);
    if (rc == 0) {
      q->op = ST_ADMIN_FORCE_LEAVE;
      q->subject_len = sizeof id.b;
      memcpy(q->subject, id.b, sizeof id.b);
    }
    return rc;
  }
  int rc = st__keys_parse(args, q, err, err_len);
  if (rc == 1) {
    snprintf(err, err_len,
             "--cluster needs install FILE, use ID or remove ID (the "
             "listing shows the cluster already)");
    rc = -EINVAL;
  }
  return rc;
}

void st__admin_cluster_takeover(st__daemon_t* d, int fd, const char* verb,
                                char* args, bool json) {
  int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0)
    return;
  char err[400] = "";
  st_msg_admin_req_t q;
  memset(&q, 0, sizeof q);
  int rc = 0;
  char who[48];
  snprintf(who, sizeof who, "`starling %s --cluster`", verb);
  if (d->admin_op != NULL) {
    snprintf(err, sizeof err,
             "another cluster request (`--cluster`) is running on this "
             "node; wait for its answer");
    rc = -EBUSY;
  } else if (d->m == NULL) {
    snprintf(err, sizeof err, "the node has not joined a cluster yet");
    rc = -EAGAIN;
  } else {
    rc = parse(d, verb, args, &q, err, sizeof err);
  }
  struct st__admin_op_s* op = NULL;
  if (rc == 0) {
    st_admin_result_t local = grant(d, &q, who, err, sizeof err);
    op = local == ST_ADMIN_REFUSED ? NULL : calloc(1, sizeof *op);
    if (op != NULL) {
      op->local = (uint8_t) local;
    } else if (local != ST_ADMIN_REFUSED) {
      snprintf(err, sizeof err, "out of memory");
    }
  }
  if (op == NULL) {
    say_error(own, json, err);
    close(own);
    st_crypto_wipe(&q, sizeof q);
    return;
  }
  op->d = d;
  op->fd = own;
  op->json = json;
  op->req = q;
  st_crypto_wipe(&q, sizeof q);
  op->deadline_ms = st__dnow(d) + ADMIN_DEADLINE_MS;
  d->admin_op = op;
  ask_members(op);
  if (op->waiting == 0)
    finish(op);
}

void st__admin_sweep(st__daemon_t* d) {
  struct st__admin_op_s* op = d->admin_op;
  if (op == NULL)
    return;
  if (st__dnow(d) < op->deadline_ms) {
    retry_due(op, st__dnow(d));
    return;
  }
  static const char why[] = "no answer within 7 s";
  for (uint32_t i = 0; i < op->n; i++)
    if (op->t[i].state == T_WAITING)
      settle(&op->t[i], T_NO_ANSWER, why, sizeof why - 1);
  finish(op);
}

void st__admin_close(st__daemon_t* d) {
  struct st__admin_op_s* op = d->admin_op;
  if (op == NULL)
    return;
  static const char why[] = "this node is stopping";
  for (uint32_t i = 0; i < op->n; i++)
    if (op->t[i].state == T_WAITING)
      settle(&op->t[i], T_NO_ANSWER, why, sizeof why - 1);
  finish(op);
}

/* ---- The connection ---------------------------------------------------- */

static int send_msg(st__conn_t* c, const st_msg_t* m) {
  uint8_t buf[ST_ADMIN_REASON_MAX + 64];
  size_t len = 0;
  int rc = st_wire_encode(m, buf, sizeof buf, &len);
  if (rc == 0)
    rc = st__conn_send(c, buf, len, false);
  st_crypto_wipe(buf, sizeof buf);
  return rc;
}

int st__admin_on_open(st__conn_t* c) {
  if (c->admin_op == NULL)
    return -ECANCELED; /* the request ended while this one dialled */
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_ADMIN_REQ;
  m.u.admin_req = c->admin_op->req;
  int rc = send_msg(c, &m);
  st_crypto_wipe(&m, sizeof m);
  return rc;
}

/* A member asks: it must be one this node holds alive or suspect. */
static void serve(st__conn_t* c, const st_msg_admin_req_t* q) {
  st__daemon_t* d = c->d;
  const st_member_t* mb =
      d->m != NULL ? st_membership_find(d->m, &c->peer) : NULL;
  if (mb == NULL ||
      (mb->state != ST_MEMBER_ALIVE && mb->state != ST_MEMBER_SUSPECT)) {
    d->c.admin_rejected++;
    st__conn_close(c);
    return;
  }
  char hex[33], who[64], err[ST_ADMIN_REASON_MAX] = "";
  st_node_id_format(&c->peer, hex);
  snprintf(who, sizeof who, "member %.12s (`--cluster`)", hex);
  st_admin_result_t res = grant(d, q, who, err, sizeof err);
  if (res == ST_ADMIN_DONE)
    d->c.admin_granted++;
  else if (res == ST_ADMIN_ALREADY)
    d->c.admin_already++;
  else
    d->c.admin_refused++;
  if (res == ST_ADMIN_REFUSED) {
    char what[40];
    subject_name(q, what, sizeof what);
    st__dlog(d, "refused %s's request to %s %s: %s", who, kOpName[q->op], what,
             err);
  }
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_ADMIN_REPLY;
  st_msg_admin_reply_t* r = &m.u.admin_reply;
  r->result = (uint8_t) res;
  r->n_keys = d->keys.has_previous ? 2 : 1;
  r->keys[0] = d->keys.current.id;
  r->keys[1] = d->keys.previous.id;
  r->reason = err;
  r->reason_len = res == ST_ADMIN_REFUSED ? (uint32_t) strlen(err) : 0;
  (void) send_msg(c, &m);
  st__conn_close(c);
}

void st__admin_on_frame(st__conn_t* c, const uint8_t* msg, size_t len) {
  st__daemon_t* d = c->d;
  st_msg_t m;
  int rc = st_wire_decode(msg, len, &m, &d->wc);
  st_msg_type_t want = c->initiator ? ST_MSG_ADMIN_REPLY : ST_MSG_ADMIN_REQ;
  if (rc != 0 || m.type != want) {
    if (rc == 0)
      st_wire_msg_free(&m);
    if (!c->initiator)
      d->c.admin_rejected++;
    else if (c->admin_op != NULL) {
      static const char why[] = "it answered with something else";
      target_done(c->admin_op, c->admin_target, T_NO_ANSWER, why,
                  sizeof why - 1);
    }
    c->admin_op = NULL;
    st__conn_close(c);
    return;
  }
  if (!c->initiator) {
    serve(c, &m.u.admin_req);
    st_crypto_wipe(&m, sizeof m);
    return;
  }
  struct st__admin_op_s* op = c->admin_op;
  c->admin_op = NULL;
  const st_msg_admin_reply_t* r = &m.u.admin_reply;
  if (op != NULL)
    target_done(op, c->admin_target,
                r->result == ST_ADMIN_DONE      ? T_DONE
                : r->result == ST_ADMIN_ALREADY ? T_ALREADY
                                                : T_REFUSED,
                r->reason, r->reason_len);
  st_wire_msg_free(&m);
  st__conn_close(c);
}

void st__admin_on_closed(st__conn_t* c) {
  struct st__admin_op_s* op = c->admin_op;
  if (op == NULL)
    return;
  c->admin_op = NULL;
  static const char why[] = "the connection ended before an answer";
  target_done(op, c->admin_target, T_NO_ANSWER, why, sizeof why - 1);
}
