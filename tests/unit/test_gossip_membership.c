/* test_gossip_membership.c: the Check suite for the rules of the
 * membership machine (SWIM with Lifeguard, gossip/membership*.c), one
 * machine at a time: a harness feeds it hand-made packets from simulated
 * members, answers its pings and ping-reqs as told (ack, nack or silence),
 * runs its timers on a virtual clock, and records what it sends.
 *
 * Rules, table-driven: alive -> suspect after a missed ack and indirect
 * probes -> dead after the suspicion timeout (Lifeguard on and off);
 * distinct confirmations shorten the timeout, repeated ones do not;
 * refutation of SUSPECT and DEAD about oneself; stale incarnations are
 * ignored; a new boot epoch beats a higher counter of an older one; LEFT
 * versus DEAD; push-pull merges both ways; status records, newest seq
 * wins; each update sent exactly retransmit_mult * ceil(log10(N + 1))
 * times; packets never exceed ST_PACKET_MAX_PLAINTEXT bytes however many
 * updates wait; awareness rises on failed probes and stretches the probe
 * interval; nacks served and counted; bad packets refused and counted;
 * claims bound to their subject (issue #17): forged or altered ALIVE,
 * STATUS and leave refused, accusations beyond the signed incarnation
 * refused, refutation saturating, ACKs only from the member asked. The
 * simulated members sign with the stand-in of tests/member_identity.h;
 * test_ed25519_claims uses real keys. Clusters of machines are tested in
 * test_gossip_membership_net.c. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/gossip.h"
#include "tests/member_identity.h"
#include "gossip/membership_internal.h"
#include "tests/unit/testutil.h"

#define HMAX 128
#define INC1 ((uint64_t) 1 << 32) /* boot epoch 1, counter 0 */

/* ==== Harness ===============================================================
 */

typedef struct {
  int to;
  uint64_t at;
  uint32_t health; /* the machine's health when it was sent */
  size_t len;
  uint8_t data[ST_PACKET_MAX_PLAINTEXT];
} sent_t;

/* A simulated member's answer, delivered only if its condition still holds
 * when it is due (so a test may change who answers mid-probe). */
typedef struct {
  int from;
  int target; /* for a ping-req's answer: the member probed */
  uint64_t at;
  st_msg_type_t type;
  uint32_t seq;
} reply_t;

typedef struct {
  st_membership_t* m;
  st_rng_t rng;
  uint64_t now;
  int n; /* simulated members 1..n-1; 0 is the machine */
  st_node_id_t id[HMAX];
  uint8_t pk[HMAX][ST_PUBLIC_KEY_BYTES];
  st_wire_addr_t addr[HMAX];
  bool acks[HMAX];   /* member answers pings */
  bool relays[HMAX]; /* member serves ping-reqs (ack or nack) */
  uint64_t timer;
  sent_t* sent;
  size_t n_sent, cap_sent;
  reply_t reply[512];
  size_t n_reply;
  uint8_t* pp; /* the last push-pull sent */
  size_t pp_len;
  size_t pp_to[HMAX]; /* push-pulls sent to each member */
  uint64_t suspect_at[HMAX], dead_at[HMAX];
} h_t;

static int who(const h_t* h, const st_node_id_t* id) {
  for (int j = 0; j < h->n; j++)
    if (memcmp(id, &h->id[j], sizeof *id) == 0)
      return j;
  return -1;
}

static int route(const h_t* h, const st_wire_addr_t* a) {
  int i = a->ip[2] << 8 | a->ip[3];
  return i < h->n ? i : -1;
}

static void schedule(h_t* h, int from, int target, uint64_t delay,
                     st_msg_type_t type, uint32_t seq) {
  ck_assert_uint_lt(h->n_reply, 512);
  reply_t* r = &h->reply[h->n_reply++];
  r->from = from;
  r->target = target;
  r->at = h->now + delay;
  r->type = type;
  r->seq = seq;
}

/* The simulated members' side: answer what the machine sent to `to`. */
static void answer(h_t* h, int to, const uint8_t* p, size_t len) {
  size_t off = 0;
  while (off < len) {
    st_msg_t msg;
    size_t used;
    ck_assert_int_eq(st_wire_decode_next(p + off, len - off, &msg, &used, NULL),
                     0);
    off += used;
    if (msg.type == ST_MSG_PING && who(h, &msg.u.ping.target) == to)
      schedule(h, to, -1, 1, ST_MSG_ACK, msg.u.ping.seq);
    if (msg.type == ST_MSG_PING_REQ) {
      int t = who(h, &msg.u.ping_req.target);
      schedule(h, to, t, 2, ST_MSG_ACK, msg.u.ping_req.seq);
      if (msg.u.ping_req.want_nack)
        schedule(h, to, t, 400, ST_MSG_NACK, msg.u.ping_req.seq);
    }
    st_wire_msg_free(&msg);
  }
}

static void drain(h_t* h) {
  st_maction_t a;
  while (st_membership_next_action(h->m, &a)) {
    switch (a.kind) {
      case ST_MACT_SEND: {
        ck_assert_uint_gt(a.len, 0);
        ck_assert_uint_le(a.len, ST_PACKET_MAX_PLAINTEXT);
        if (h->n_sent == h->cap_sent) {
          h->cap_sent = h->cap_sent ? h->cap_sent * 2 : 256;
          h->sent = realloc(h->sent, h->cap_sent * sizeof *h->sent);
          ck_assert_ptr_nonnull(h->sent);
        }
        sent_t* s = &h->sent[h->n_sent++];
        s->to = route(h, &a.to);
        s->at = h->now;
        s->health = st_membership_health(h->m);
        s->len = a.len;
        memcpy(s->data, a.data, a.len);
        if (s->to > 0)
          answer(h, s->to, a.data, a.len);
        break;
      }
      case ST_MACT_PUSH_PULL:
        free(h->pp);
        h->pp = malloc(a.len);
        ck_assert_ptr_nonnull(h->pp);
        memcpy(h->pp, a.data, a.len);
        h->pp_len = a.len;
        if (route(h, &a.to) >= 0)
          h->pp_to[route(h, &a.to)]++;
        break;
      case ST_MACT_TIMER:
        h->timer = a.at_ms;
        break;
      case ST_MACT_MEMBER: {
        int j = who(h, &a.member.id);
        if (j < 0)
          break;
        if (a.member.state == ST_MEMBER_SUSPECT && !h->suspect_at[j])
          h->suspect_at[j] = h->now;
        if ((a.member.state == ST_MEMBER_DEAD ||
             a.member.state == ST_MEMBER_LEFT) &&
            !h->dead_at[j])
          h->dead_at[j] = h->now;
        if (a.member.state == ST_MEMBER_ALIVE)
          h->suspect_at[j] = h->dead_at[j] = 0;
        break;
      }
    }
  }
}

static int enc(const st_msg_t* msgs, int k, uint8_t* buf, size_t cap) {
  size_t pos = 0, len;
  for (int i = 0; i < k; i++) {
    ck_assert_int_eq(st_wire_encode(&msgs[i], buf + pos, cap - pos, &len), 0);
    pos += len;
  }
  return (int) pos;
}

static int feed_raw(h_t* h, int from, const uint8_t* p, size_t len) {
  int rc =
      st_membership_packet(h->m, h->now, &h->id[from], &h->addr[from], p, len);
  drain(h);
  return rc;
}

static int feed(h_t* h, int from, const st_msg_t* msgs, int k) {
  uint8_t buf[4096];
  int len = enc(msgs, k, buf, sizeof buf);
  return feed_raw(h, from, buf, (size_t) len);
}

static st_msg_t alive_msg(const h_t* h, int j, uint64_t inc) {
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_ALIVE;
  m.u.alive.node = h->id[j];
  m.u.alive.incarnation = inc;
  m.u.alive.addr = h->addr[j];
  memcpy(m.u.alive.public_key, h->pk[j], ST_PUBLIC_KEY_BYTES);
  member_sign_alive(h->pk[j], &m.u.alive); /* member j's own word */
  return m;
}

static st_msg_t accuse_msg(const h_t* h, st_msg_type_t type, int j,
                           uint64_t inc, int from) {
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = type;
  m.u.suspect.node = h->id[j];
  m.u.suspect.incarnation = inc;
  m.u.suspect.from = h->id[from];
  if (type == ST_MSG_DEAD && from == j) /* a leave, signed by its member */
    member_sign_leave(h->pk[j], &m.u.dead);
  return m;
}

/* A machine (member 0) that knows members 1..n-1 alive at INC1, each of
 * which answers pings and ping-reqs. */
static void h_init(h_t* h, int n, const st_membership_config_t* cfg) {
  memset(h, 0, sizeof *h);
  ck_assert_int_le(n, HMAX);
  h->n = n;
  h->timer = UINT64_MAX;
  h->now = 1000;
  for (int j = 0; j < n; j++) {
    member_identity(j, h->pk[j], &h->id[j], &h->addr[j]);
    h->acks[j] = h->relays[j] = true;
  }
  st_membership_config_t def;
  st_membership_config_default(&def);
  st_rng_seed(&h->rng, 1234);
  ck_assert_int_eq(st_membership_new(cfg ? cfg : &def, &h->id[0], &h->addr[0],
                                     h->pk[0], 1, &h->rng, &h->m),
                   0);
  member_set_signer(h->m, h->pk[0]);
  for (int j = 1; j < n; j++) {
    st_msg_t a = alive_msg(h, j, INC1);
    ck_assert_int_eq(feed(h, j, &a, 1), 0);
  }
  ck_assert_uint_eq(st_membership_count(h->m), (size_t) n);
}

static void h_free(h_t* h) {
  st_membership_free(h->m);
  free(h->sent);
  free(h->pp);
}

static void h_run(h_t* h, uint64_t until) {
  for (;;) {
    uint64_t t = h->timer;
    size_t ri = SIZE_MAX;
    for (size_t k = 0; k < h->n_reply; k++)
      if (h->reply[k].at < t) {
        t = h->reply[k].at;
        ri = k;
      }
    if (t > until)
      break;
    if (t > h->now)
      h->now = t;
    if (ri != SIZE_MAX) {
      reply_t r = h->reply[ri];
      h->reply[ri] = h->reply[--h->n_reply];
      bool target_acks = r.target > 0 && h->acks[r.target];
      bool due = r.target < 0           ? h->acks[r.from]
                 : r.type == ST_MSG_ACK ? h->relays[r.from] && target_acks
                                        : h->relays[r.from] && !target_acks;
      if (!due)
        continue;
      st_msg_t msg;
      memset(&msg, 0, sizeof msg);
      msg.type = r.type;
      msg.u.ack.seq = r.seq;
      feed(h, r.from, &msg, 1);
    } else {
      h->timer = UINT64_MAX;
      ck_assert_int_eq(st_membership_tick(h->m, h->now), 0);
      drain(h);
    }
  }
  h->now = until;
}

static int state_of(const h_t* h, int j) {
  const st_member_t* mb = st_membership_find(h->m, &h->id[j]);
  return mb ? (int) mb->state : -1;
}

static uint64_t inc_of(const h_t* h, int j) {
  const st_member_t* mb = st_membership_find(h->m, &h->id[j]);
  ck_assert_ptr_nonnull(mb);
  return mb->incarnation;
}

/* Calls fn on every message of every packet sent since index `from`. */
typedef bool (*msg_pred_t)(const st_msg_t* msg, const void* arg);
static size_t count_sent(const h_t* h, size_t from, msg_pred_t fn,
                         const void* arg) {
  size_t n = 0;
  for (size_t i = from; i < h->n_sent; i++) {
    size_t off = 0;
    while (off < h->sent[i].len) {
      st_msg_t msg;
      size_t used;
      ck_assert_int_eq(
          st_wire_decode_next(h->sent[i].data + off, h->sent[i].len - off, &msg,
                              &used, NULL),
          0);
      off += used;
      if (fn(&msg, arg))
        n++;
      st_wire_msg_free(&msg);
    }
  }
  return n;
}

typedef struct {
  st_msg_type_t type;
  const st_node_id_t* node;
  uint64_t inc;
} match_t;
static bool is_match(const st_msg_t* msg, const void* arg);

/* Whether packet i alone holds a message matching w. */
static bool sent_has(const h_t* h, size_t i, const match_t* w) {
  h_t one = *h;
  one.sent = &h->sent[i];
  one.n_sent = 1;
  return count_sent(&one, 0, is_match, w) > 0;
}

static bool is_match(const st_msg_t* msg, const void* arg) {
  const match_t* w = arg;
  if (msg->type != w->type)
    return false;
  if (w->type == ST_MSG_ALIVE)
    return memcmp(&msg->u.alive.node, w->node, sizeof *w->node) == 0 &&
           msg->u.alive.incarnation == w->inc;
  if (w->type == ST_MSG_SUSPECT || w->type == ST_MSG_DEAD)
    return memcmp(&msg->u.suspect.node, w->node, sizeof *w->node) == 0 &&
           msg->u.suspect.incarnation == w->inc;
  if (w->type == ST_MSG_PING)
    return memcmp(&msg->u.ping.target, w->node, sizeof *w->node) == 0;
  if (w->type == ST_MSG_PING_REQ)
    return memcmp(&msg->u.ping_req.target, w->node, sizeof *w->node) == 0;
  return true;
}

static uint64_t susp_min_ms(int n) {
  double scale = n > 1 ? log10((double) n) : 1.0;
  if (scale < 1.0)
    scale = 1.0;
  return 4 * (uint64_t) (scale * 1000.0);
}

/* ==== Failure detection =====================================================
 */

/* Member 4 of 5 stops answering: a PING, then PING_REQs through the 3
 * others 500 ms later, then SUSPECT at the end of the probe period, then
 * DEAD after the suspicion timeout: max (24 s) with Lifeguard when nobody
 * confirms, min (4 s) without. */
START_TEST(test_alive_suspect_dead) {
  bool lifeguard = _i == 0;
  st_membership_config_t cfg;
  st_membership_config_default(&cfg);
  cfg.lifeguard = lifeguard;
  h_t h;
  h_init(&h, 5, &cfg);
  h.acks[4] = false;
  h_run(&h, h.now + 30000);
  ck_assert_uint_gt(h.suspect_at[4], 0);
  match_t ping = {ST_MSG_PING, &h.id[4], 0},
          req = {ST_MSG_PING_REQ, &h.id[4], 0};
  /* The probe that failed first. */
  size_t first = SIZE_MAX;
  for (size_t i = 0; i < h.n_sent && first == SIZE_MAX; i++)
    if (h.sent[i].to == 4 && sent_has(&h, i, &ping))
      first = i;
  ck_assert_uint_ne(first, SIZE_MAX);
  uint64_t t_ping = h.sent[first].at;
  size_t n_req = 0;
  for (size_t i = first; i < h.n_sent && h.sent[i].at <= t_ping + 500; i++) {
    if (sent_has(&h, i, &req)) {
      ck_assert_uint_eq(h.sent[i].at, t_ping + 500);
      ck_assert_int_ne(h.sent[i].to, 4);
      n_req++;
    }
  }
  ck_assert_uint_eq(n_req, 3);
  ck_assert_uint_eq(h.suspect_at[4], t_ping + 1000);
  uint64_t timeout = lifeguard ? 6 * susp_min_ms(5) : susp_min_ms(5);
  ck_assert_uint_eq(h.dead_at[4], h.suspect_at[4] + timeout);
  ck_assert_int_eq(state_of(&h, 4), ST_MEMBER_DEAD);
  /* The others answered all along. */
  for (int j = 1; j < 4; j++)
    ck_assert_int_eq(state_of(&h, j), ST_MEMBER_ALIVE);
  h_free(&h);
}
END_TEST

/* Lifeguard's dynamic suspicion: member 7 of 8 is accused by member 1,
 * then confirmed by the listed members; the timeout is
 * max(min, max - (max - min) log(C + 1) / log(K + 1)) with C distinct
 * confirmations (not counting the first accuser), K = 3. */
static const struct {
  int confirmers[6];
  int n;
  int distinct;
} confirm_cases[] = {
    {{0}, 0, 0},          {{2}, 1, 1},
    {{2, 3}, 2, 2},       {{2, 3, 4}, 3, 3},
    {{2, 2, 2}, 3, 1},    {{1, 1}, 2, 0},
    {{2, 3, 2, 3}, 4, 2}, {{2, 3, 4, 5, 6}, 5, 3},
};

START_TEST(test_confirmations) {
  h_t h;
  h_init(&h, 8, NULL);
  uint64_t t0 = h.now;
  st_msg_t s = accuse_msg(&h, ST_MSG_SUSPECT, 7, INC1, 1);
  feed(&h, 1, &s, 1);
  ck_assert_int_eq(state_of(&h, 7), ST_MEMBER_SUSPECT);
  for (int c = 0; c < confirm_cases[_i].n; c++) {
    int from = confirm_cases[_i].confirmers[c];
    st_msg_t x = accuse_msg(&h, ST_MSG_SUSPECT, 7, INC1, from);
    feed(&h, from, &x, 1);
  }
  double min = (double) susp_min_ms(8), max = 6 * min;
  double frac = log(confirm_cases[_i].distinct + 1.0) / log(4.0);
  double raw = max - frac * (max - min);
  uint64_t timeout = raw < min ? (uint64_t) min : (uint64_t) raw;
  h_run(&h, t0 + timeout - 1);
  ck_assert_int_eq(state_of(&h, 7), ST_MEMBER_SUSPECT);
  h_run(&h, t0 + timeout);
  ck_assert_int_eq(state_of(&h, 7), ST_MEMBER_DEAD);
  ck_assert_uint_eq(h.dead_at[7], t0 + timeout);
  h_free(&h);
}
END_TEST

/* ==== State rules ===========================================================
 *
 * Each case feeds messages (from the member named) to a machine that
 * knows members 1..5 alive at I = INC1 + 5, and checks member 1's state
 * and incarnation afterwards (-1: unknown). */
#define I (INC1 + 5)
/* How a step's message is spoiled: not at all, a key that is not the id's,
 * signed by the packet's sender instead of its subject (a forgery by a
 * member that holds the cluster key), one signature bit flipped, or no
 * signature at all. */
enum { OK = 0, BAD_KEY, FORGED, BAD_SIG, NO_SIG };
typedef struct {
  st_msg_type_t type;
  int node, from;
  uint64_t inc;
  int spoil;
  int via; /* the packet's sender when not `from` (0: from) */
} step_t;
static const struct {
  const char* name;
  step_t steps[3];
  int n;
  int node;
  int state;
  uint64_t inc;
} rule_cases[] = {
    {"older alive ignored", {{ST_MSG_ALIVE, 1, 1, I - 1, OK, 0}}, 1, 1, 0, I},
    {"older suspect ignored",
     {{ST_MSG_SUSPECT, 1, 2, I - 1, OK, 0}},
     1,
     1,
     0,
     I},
    {"older dead ignored", {{ST_MSG_DEAD, 1, 2, I - 1, OK, 0}}, 1, 1, 0, I},
    {"suspect", {{ST_MSG_SUSPECT, 1, 2, I, OK, 0}}, 1, 1, 1, I},
    {"suspect beyond the signed inc refused",
     {{ST_MSG_SUSPECT, 1, 2, I + 2, OK, 0}},
     1,
     1,
     0,
     I},
    {"dead beyond the signed inc refused",
     {{ST_MSG_DEAD, 1, 2, UINT64_MAX, OK, 0}},
     1,
     1,
     0,
     I},
    {"forged alive for another member refused",
     {{ST_MSG_ALIVE, 1, 3, UINT64_MAX, FORGED, 0}},
     1,
     1,
     0,
     I},
    {"forged alive then suspect at its inc refused",
     {{ST_MSG_ALIVE, 1, 3, I + 1, FORGED, 0},
      {ST_MSG_SUSPECT, 1, 3, I + 1, OK, 0}},
     2,
     1,
     0,
     I},
    {"alive with a flipped signature bit refused",
     {{ST_MSG_ALIVE, 1, 1, I + 1, BAD_SIG, 0}},
     1,
     1,
     0,
     I},
    {"unsigned alive refused",
     {{ST_MSG_ALIVE, 1, 1, I + 1, NO_SIG, 0}},
     1,
     1,
     0,
     I},
    {"forged alive of a new member refused",
     {{ST_MSG_ALIVE, 9, 2, I, FORGED, 0}},
     1,
     9,
     -1,
     0},
    {"relayed leave signed by its member",
     {{ST_MSG_DEAD, 1, 1, I, OK, 3}},
     1,
     1,
     3,
     I},
    {"leave claimed by another member refused",
     {{ST_MSG_DEAD, 1, 1, I, FORGED, 3}},
     1,
     1,
     0,
     I},
    {"unsigned leave refused", {{ST_MSG_DEAD, 1, 1, I, NO_SIG, 0}}, 1, 1, 0, I},
    {"newer leave signed by its member",
     {{ST_MSG_DEAD, 1, 1, I + 3, OK, 2}},
     1,
     1,
     3,
     I + 3},
    {"newer leave claimed by another refused",
     {{ST_MSG_DEAD, 1, 1, I + 3, FORGED, 2}},
     1,
     1,
     0,
     I},
    {"dead", {{ST_MSG_DEAD, 1, 2, I, OK, 0}}, 1, 1, 2, I},
    {"same-inc alive does not clear suspect",
     {{ST_MSG_SUSPECT, 1, 2, I, OK, 0}, {ST_MSG_ALIVE, 1, 1, I, OK, 0}},
     2,
     1,
     1,
     I},
    {"newer alive refutes suspect",
     {{ST_MSG_SUSPECT, 1, 2, I, OK, 0}, {ST_MSG_ALIVE, 1, 1, I + 1, OK, 0}},
     2,
     1,
     0,
     I + 1},
    {"relayed newer alive refutes suspect",
     {{ST_MSG_SUSPECT, 1, 2, I, OK, 0}, {ST_MSG_ALIVE, 1, 3, I + 1, OK, 0}},
     2,
     1,
     0,
     I + 1},
    {"new boot epoch beats higher counter",
     {{ST_MSG_DEAD, 1, 2, INC1 + 1000, OK, 0},
      {ST_MSG_ALIVE, 1, 1, 2 * INC1, OK, 0}},
     2,
     1,
     0,
     2 * INC1},
    {"older epoch cannot resurrect",
     {{ST_MSG_ALIVE, 1, 1, 2 * INC1, OK, 0},
      {ST_MSG_DEAD, 1, 2, 2 * INC1, OK, 0},
      {ST_MSG_ALIVE, 1, 1, INC1 + 1000, OK, 0}},
     3,
     1,
     2,
     2 * INC1},
    {"leave", {{ST_MSG_DEAD, 1, 1, I, OK, 0}}, 1, 1, 3, I},
    {"left stays left on suspect",
     {{ST_MSG_DEAD, 1, 1, I, OK, 0}, {ST_MSG_SUSPECT, 1, 2, I, OK, 0}},
     2,
     1,
     3,
     I},
    {"left stays left on dead",
     {{ST_MSG_DEAD, 1, 1, I, OK, 0}, {ST_MSG_DEAD, 1, 2, I + 1, OK, 0}},
     2,
     1,
     3,
     I},
    {"left stays left on same-inc alive",
     {{ST_MSG_DEAD, 1, 1, I, OK, 0}, {ST_MSG_ALIVE, 1, 3, I, OK, 0}},
     2,
     1,
     3,
     I},
    {"rejoin after leave",
     {{ST_MSG_DEAD, 1, 1, I, OK, 0}, {ST_MSG_ALIVE, 1, 1, I + 1, OK, 0}},
     2,
     1,
     0,
     I + 1},
    {"dead stays dead on suspect",
     {{ST_MSG_DEAD, 1, 2, I, OK, 0}, {ST_MSG_SUSPECT, 1, 3, I + 1, OK, 0}},
     2,
     1,
     2,
     I},
    {"unknown member: suspect ignored",
     {{ST_MSG_SUSPECT, 9, 2, I, OK, 0}},
     1,
     9,
     -1,
     0},
    {"unknown member: dead ignored",
     {{ST_MSG_DEAD, 9, 2, I, OK, 0}},
     1,
     9,
     -1,
     0},
    {"unknown member: relayed alive learned",
     {{ST_MSG_ALIVE, 9, 2, I, OK, 0}},
     1,
     9,
     0,
     I},
    {"alive whose key is not the id's refused",
     {{ST_MSG_ALIVE, 9, 9, I, BAD_KEY, 0}},
     1,
     9,
     -1,
     0},
};
#define NRULES ((int) (sizeof rule_cases / sizeof rule_cases[0]))

static void spoil(const h_t* h, st_msg_t* msg, int how, int sender) {
  uint8_t* sig = msg->type == ST_MSG_ALIVE ? msg->u.alive.signature
                                           : msg->u.dead.signature;
  if (how == BAD_KEY)
    msg->u.alive.public_key[5] ^= 1;
  else if (how == FORGED && msg->type == ST_MSG_ALIVE)
    member_sign_alive(h->pk[sender], &msg->u.alive);
  else if (how == FORGED)
    member_sign_leave(h->pk[sender], &msg->u.dead);
  else if (how == BAD_SIG)
    sig[17] ^= 4;
  else if (how == NO_SIG)
    memset(sig, 0, ST_SIGNATURE_BYTES);
}

START_TEST(test_rules) {
  h_t h;
  h_init(&h, 9, NULL);
  h.n = 10; /* member 9 exists but the machine has not heard of it */
  member_identity(9, h.pk[9], &h.id[9], &h.addr[9]);
  for (int j = 1; j <= 5; j++) {
    st_msg_t a = alive_msg(&h, j, I);
    feed(&h, j, &a, 1);
  }
  size_t count = st_membership_count(h.m);
  for (int s = 0; s < rule_cases[_i].n; s++) {
    const step_t* st = &rule_cases[_i].steps[s];
    st_msg_t msg = st->type == ST_MSG_ALIVE
                       ? alive_msg(&h, st->node, st->inc)
                       : accuse_msg(&h, st->type, st->node, st->inc, st->from);
    int sender = st->via ? st->via : st->from;
    spoil(&h, &msg, st->spoil, sender);
    ck_assert_int_eq(feed(&h, sender, &msg, 1), 0);
  }
  int node = rule_cases[_i].node;
  ck_assert_msg(state_of(&h, node) == rule_cases[_i].state,
                "%s: state %d, want %d", rule_cases[_i].name,
                state_of(&h, node), rule_cases[_i].state);
  if (rule_cases[_i].state >= 0)
    ck_assert_uint_eq(inc_of(&h, node), rule_cases[_i].inc);
  else
    ck_assert_uint_eq(st_membership_count(h.m), count);
  h_free(&h);
}
END_TEST

/* Refutation: the machine hears itself accused. An accusation at its own
 * incarnation is refuted with that + 1 and an ALIVE broadcast; a newer one
 * names an incarnation it never signed and is refused (its incarnation
 * unchanged); a newer ALIVE of itself (its own signature, an older life's
 * replay) is outbid; older ones
 * (a refutation the accuser missed) are not refuted again, but answered
 * with one packet carrying the current ALIVE straight to the accuser
 * (`told`). Having to refute also raises awareness (Lifeguard). */
static const struct {
  st_msg_type_t type;
  uint64_t accused;
  uint64_t want;
  uint32_t health;
  size_t told;
} refute_cases[] = {
    {ST_MSG_SUSPECT, INC1, INC1 + 1, 1, 0},
    {ST_MSG_SUSPECT, INC1 + 5, INC1, 0, 0}, /* beyond what we signed */
    {ST_MSG_SUSPECT, INC1 - 1, INC1, 0, 1},
    {ST_MSG_DEAD, INC1, INC1 + 1, 1, 0},
    {ST_MSG_DEAD, UINT64_MAX, INC1, 0, 0}, /* beyond what we signed */
    {ST_MSG_DEAD, INC1 - 1, INC1, 0, 1},
    {ST_MSG_ALIVE, INC1 + 3, INC1 + 4, 1, 0}, /* a newer "us" than us */
    {ST_MSG_ALIVE, INC1, INC1, 0, 0},         /* ourselves, relayed back */
};

START_TEST(test_refute) {
  h_t h;
  h_init(&h, 4, NULL);
  size_t mark = h.n_sent;
  st_msg_t msg = refute_cases[_i].type == ST_MSG_ALIVE
                     ? alive_msg(&h, 0, refute_cases[_i].accused)
                     : accuse_msg(&h, refute_cases[_i].type, 0,
                                  refute_cases[_i].accused, 2);
  ck_assert_int_eq(feed(&h, 2, &msg, 1), 0);
  ck_assert_uint_eq(inc_of(&h, 0), refute_cases[_i].want);
  ck_assert_int_eq(state_of(&h, 0), ST_MEMBER_ALIVE);
  ck_assert_uint_eq(st_membership_health(h.m), refute_cases[_i].health);
  h_run(&h, h.now + 2000);
  match_t w = {ST_MSG_ALIVE, &h.id[0], refute_cases[_i].want};
  size_t n = count_sent(&h, mark, is_match, &w);
  if (refute_cases[_i].want != INC1) {
    ck_assert_uint_gt(n, 0);
  } else {
    ck_assert_uint_eq(n, refute_cases[_i].told);
    for (size_t i = mark; i < h.n_sent; i++)
      if (sent_has(&h, i, &w))
        ck_assert_int_eq(h.sent[i].to, 2); /* the accuser */
  }
  h_free(&h);
}
END_TEST

/* A packet straight from a member held suspect: the machine answers it
 * with the suspicion (the buddy system), so that the member refutes or
 * re-sends the refutation the machine missed; it never clears the
 * suspicion on its own. Nothing is sent back to a member held alive. */
START_TEST(test_buddy) {
  bool suspect = _i == 0;
  h_t h;
  h_init(&h, 5, NULL);
  if (suspect) {
    st_msg_t sus = accuse_msg(&h, ST_MSG_SUSPECT, 3, INC1, 1);
    feed(&h, 1, &sus, 1);
  }
  size_t mark = h.n_sent;
  st_msg_t nack;
  memset(&nack, 0, sizeof nack);
  nack.type = ST_MSG_NACK; /* any message: here a stray nack */
  nack.u.nack.seq = 777;
  ck_assert_int_eq(feed(&h, 3, &nack, 1), 0);
  match_t w = {ST_MSG_SUSPECT, &h.id[3], INC1};
  size_t asked = 0;
  for (size_t i = mark; i < h.n_sent; i++)
    if (h.sent[i].to == 3 && sent_has(&h, i, &w))
      asked++;
  ck_assert_uint_eq(asked, suspect ? 1 : 0);
  ck_assert_int_eq(state_of(&h, 3),
                   suspect ? ST_MEMBER_SUSPECT : ST_MEMBER_ALIVE);
  if (suspect) {
    /* Member 3 answers with its refutation: cleared. */
    st_msg_t alive = alive_msg(&h, 3, INC1 + 1);
    feed(&h, 3, &alive, 1);
    ck_assert_int_eq(state_of(&h, 3), ST_MEMBER_ALIVE);
  }
  h_free(&h);
}
END_TEST

/* A leaving machine declares itself LEFT (DEAD from itself), gossips it,
 * and does not refute what it hears about itself afterwards. */
START_TEST(test_leave_self) {
  h_t h;
  h_init(&h, 5, NULL);
  size_t mark = h.n_sent;
  ck_assert_int_eq(st_membership_leave(h.m, h.now), 0);
  drain(&h);
  ck_assert_int_eq(state_of(&h, 0), ST_MEMBER_LEFT);
  ck_assert_uint_eq(st_membership_alive_count(h.m), 4);
  match_t w = {ST_MSG_DEAD, &h.id[0], INC1};
  ck_assert_uint_gt(count_sent(&h, mark, is_match, &w), 0);
  st_msg_t s = accuse_msg(&h, ST_MSG_DEAD, 0, INC1, 2);
  feed(&h, 2, &s, 1);
  s = accuse_msg(&h, ST_MSG_SUSPECT, 0, INC1, 3);
  feed(&h, 3, &s, 1);
  ck_assert_uint_eq(inc_of(&h, 0), INC1);
  ck_assert_int_eq(state_of(&h, 0), ST_MEMBER_LEFT);
  /* It no longer probes. */
  mark = h.n_sent;
  h_run(&h, h.now + 5000);
  match_t p = {ST_MSG_PING, &h.id[1], 0};
  ck_assert_uint_eq(count_sent(&h, mark, is_match, &p), 0);
  h_free(&h);
}
END_TEST

/* ==== Push-pull ============================================================
 *
 * Two machines A (member 0) and B (member 1) with different views merge
 * through one push-pull (A's join with B as seed, B's reply). Per member:
 * what A and B hold before, what each must hold after. A remote DEAD only
 * makes the receiver suspect; a remote LEFT is taken as is; newer wins. */
typedef struct {
  int state;
  uint64_t inc;
} view_t;
static const struct {
  int member;
  view_t a, b, a_after, b_after;
} pp_cases[] = {
    {2, {0, INC1 + 3}, {0, INC1 + 5}, {0, INC1 + 5}, {0, INC1 + 5}},
    {3, {-1, 0}, {0, INC1 + 1}, {0, INC1 + 1}, {0, INC1 + 1}},
    {4, {0, INC1 + 2}, {-1, 0}, {0, INC1 + 2}, {0, INC1 + 2}},
    {5, {2, INC1 + 1}, {0, INC1 + 1}, {2, INC1 + 1}, {1, INC1 + 1}},
    {6, {3, INC1 + 1}, {0, INC1 + 1}, {3, INC1 + 1}, {3, INC1 + 1}},
    {7, {2, INC1 + 1}, {0, INC1 + 2}, {0, INC1 + 2}, {0, INC1 + 2}},
    {8, {1, INC1 + 1}, {0, INC1 + 1}, {1, INC1 + 1}, {1, INC1 + 1}},
    /* Accusations newer than the receiver's view come with the member's
     * signed ALIVE at their incarnation (the entry's signature). */
    {10, {0, INC1 + 1}, {1, INC1 + 3}, {1, INC1 + 3}, {1, INC1 + 3}},
    {11, {0, INC1 + 2}, {2, INC1 + 4}, {1, INC1 + 4}, {2, INC1 + 4}},
};
#define NPP ((int) (sizeof pp_cases / sizeof pp_cases[0]))

static void set_view(h_t* h, int j, view_t v) {
  if (v.state < 0)
    return;
  st_msg_t a = alive_msg(h, j, v.inc); /* accusations name a signed inc */
  feed(h, j, &a, 1);
  if (v.state == 1) {
    st_msg_t s = accuse_msg(h, ST_MSG_SUSPECT, j, v.inc, 9);
    feed(h, 9, &s, 1);
  } else if (v.state >= 2) {
    st_msg_t d = accuse_msg(h, ST_MSG_DEAD, j, v.inc, v.state == 3 ? j : 9);
    feed(h, 9, &d, 1);
  }
}

/* Turns h (member 0's harness) into member `self`'s machine. */
static void h_init_as(h_t* h, int n, int self) {
  h_init(h, n, NULL);
  st_membership_free(h->m);
  st_rng_seed(&h->rng, 99 + (uint64_t) self);
  st_membership_config_t cfg;
  st_membership_config_default(&cfg);
  ck_assert_int_eq(st_membership_new(&cfg, &h->id[self], &h->addr[self],
                                     h->pk[self], 1, &h->rng, &h->m),
                   0);
  member_set_signer(h->m, h->pk[self]);
}

/* a (member 0's machine) joins through b (member 1's): a pushes its state
 * to b, b merges it and replies, a merges the reply. */
static void join_through(h_t* a, h_t* b) {
  ck_assert_int_eq(st_membership_join(a->m, a->now, &a->addr[1], 1), 0);
  drain(a);
  ck_assert_ptr_nonnull(a->pp);
  free(b->pp);
  b->pp = NULL;
  ck_assert_int_eq(
      st_membership_push_pull_in(b->m, b->now, &a->addr[0], a->pp, a->pp_len),
      0);
  drain(b);
  ck_assert_ptr_nonnull(b->pp); /* the reply */
  ck_assert_int_eq(
      st_membership_push_pull_in(a->m, a->now, &a->addr[1], b->pp, b->pp_len),
      0);
  drain(a);
}

/* st_membership_set_admit: a member whose key the predicate refuses never
 * enters the table, neither on its own word nor by another's rumour; an
 * admitted one does; members already known stay. */
static bool refuse_index5(const uint8_t pk[ST_PUBLIC_KEY_BYTES], void* ctx) {
  int* calls = ctx;
  (*calls)++;
  return pk[1] != 5;
}

START_TEST(test_admit) {
  h_t h;
  h_init(&h, 3, NULL);
  for (int j = 5; j <= 6; j++)
    member_identity(j, h.pk[j], &h.id[j], &h.addr[j]);
  int calls = 0;
  st_membership_set_admit(h.m, refuse_index5, &calls);
  st_msg_t rumour = alive_msg(&h, 5, INC1);
  feed(&h, 1, &rumour, 1); /* member 1 speaks of 5 */
  ck_assert_int_eq(state_of(&h, 5), -1);
  feed(&h, 5, &rumour, 1); /* 5 itself */
  ck_assert_int_eq(state_of(&h, 5), -1);
  ck_assert_int_eq(calls, 2);
  st_msg_t six = alive_msg(&h, 6, INC1);
  feed(&h, 1, &six, 1);
  ck_assert_int_eq(state_of(&h, 6), ST_MEMBER_ALIVE);
  ck_assert_int_eq(state_of(&h, 1), ST_MEMBER_ALIVE);
  ck_assert_uint_eq(st_membership_count(h.m), 4);
  /* Back to everyone: 5 enters. */
  st_membership_set_admit(h.m, NULL, NULL);
  feed(&h, 1, &rumour, 1);
  ck_assert_int_eq(state_of(&h, 5), ST_MEMBER_ALIVE);
  h_free(&h);
}
END_TEST

START_TEST(test_push_pull_merge) {
  h_t a, b;
  h_init_as(&a, 12, 0);
  h_init_as(&b, 12, 1);
  st_msg_t x = alive_msg(&a, 9, INC1);
  feed(&a, 9, &x, 1);
  feed(&b, 9, &x, 1);
  for (int c = 0; c < NPP; c++) {
    set_view(&a, pp_cases[c].member, pp_cases[c].a);
    set_view(&b, pp_cases[c].member, pp_cases[c].b);
  }
  join_through(&a, &b);
  ck_assert_int_eq(state_of(&a, 1), ST_MEMBER_ALIVE);
  ck_assert_int_eq(state_of(&b, 0), ST_MEMBER_ALIVE);
  for (int c = 0; c < NPP; c++) {
    int j = pp_cases[c].member;
    ck_assert_msg(state_of(&a, j) == pp_cases[c].a_after.state &&
                      inc_of(&a, j) == pp_cases[c].a_after.inc,
                  "member %d at A: state %d inc %llx", j, state_of(&a, j),
                  (unsigned long long) inc_of(&a, j));
    ck_assert_msg(state_of(&b, j) == pp_cases[c].b_after.state &&
                      inc_of(&b, j) == pp_cases[c].b_after.inc,
                  "member %d at B: state %d inc %llx", j, state_of(&b, j),
                  (unsigned long long) inc_of(&b, j));
  }
  /* A reply is not answered again. */
  free(a.pp);
  a.pp = NULL;
  ck_assert_int_eq(
      st_membership_push_pull_in(a.m, a.now, &a.addr[1], b.pp, b.pp_len), 0);
  drain(&a);
  ck_assert_ptr_null(a.pp);
  h_free(&a);
  h_free(&b);
}
END_TEST

/* A joiner's first periodic push-pull is drawn over the interval scaled to
 * the cluster its seed's reply revealed (x3 at 100 members: 90 s), not over
 * the unscaled 30 s drawn at its first event, when it knew only itself: at
 * 10,000 members the join is itself a full push-pull, and a second one
 * within 30 s from every joiner cost the simulator most of its time. */
START_TEST(test_join_push_pull_schedule) {
  h_t b;
  h_init_as(&b, 100, 1);
  for (int j = 2; j < b.n; j++) {
    st_msg_t x = alive_msg(&b, j, INC1);
    ck_assert_int_eq(feed(&b, j, &x, 1), 0);
  }
  uint64_t latest = 0;
  for (int k = 0; k < 16; k++) {
    h_t a;
    h_init(&a, 100, NULL);
    st_membership_free(a.m);
    st_rng_seed(&a.rng, 500 + (uint64_t) k);
    st_membership_config_t cfg;
    st_membership_config_default(&cfg);
    ck_assert_int_eq(
        st_membership_new(&cfg, &a.id[0], &a.addr[0], a.pk[0], 1, &a.rng, &a.m),
        0);
    member_set_signer(a.m, a.pk[0]);
    join_through(&a, &b);
    ck_assert_uint_eq(st_membership_count(a.m), 100);
    uint64_t t0 = a.now, sent = 0;
    for (int j = 0; j < a.n; j++)
      sent += a.pp_to[j];
    uint64_t after = 0;
    while (after == 0 && a.now < t0 + 120000) {
      h_run(&a, a.now + 500);
      uint64_t now_sent = 0;
      for (int j = 0; j < a.n; j++)
        now_sent += a.pp_to[j];
      if (now_sent > sent)
        after = a.now - t0;
    }
    ck_assert_msg(after > 0 && after <= 90500,
                  "seed %d: first push-pull %llu ms after the join", k,
                  (unsigned long long) after);
    if (after > latest)
      latest = after;
    h_free(&a);
  }
  ck_assert_msg(latest > 31000,
                "every first push-pull within the unscaled 30 s (latest %llu)",
                (unsigned long long) latest);
  h_free(&b);
}
END_TEST

/* ==== Status records ========================================================
 */

static st_msg_t status_msg(const h_t* h, int j, uint64_t seq, uint64_t step) {
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = ST_MSG_STATUS;
  m.u.status.node = h->id[j];
  m.u.status.seq = seq;
  m.u.status.step = step;
  m.u.status.loss = 0.5f;
  member_sign_status(h->pk[j], &m.u.status);
  return m;
}

static const struct {
  uint64_t seqs[4];
  uint64_t steps[4];
  int n;
  uint64_t want_step;
} status_cases[] = {
    {{5}, {50}, 1, 50},
    {{5, 3}, {50, 30}, 2, 50},
    {{5, 7}, {50, 70}, 2, 70},
    {{5, 5}, {50, 51}, 2, 50},
    {{9, 2, 10, 4}, {90, 20, 100, 40}, 4, 100},
};

START_TEST(test_status) {
  h_t h;
  h_init(&h, 4, NULL);
  for (int k = 0; k < status_cases[_i].n; k++) {
    st_msg_t s =
        status_msg(&h, 1, status_cases[_i].seqs[k], status_cases[_i].steps[k]);
    feed(&h, 2, &s, 1); /* relayed */
  }
  const st_member_t* mb = st_membership_find(h.m, &h.id[1]);
  ck_assert(mb->has_status);
  ck_assert_uint_eq(mb->status.step, status_cases[_i].want_step);
  /* Unknown members' and our own records from others are ignored. */
  st_msg_t u = status_msg(&h, 0, 1ull << 40, 1);
  feed(&h, 2, &u, 1);
  mb = st_membership_find(h.m, &h.id[0]);
  ck_assert(!mb->has_status);
  h_free(&h);
}
END_TEST

/* Our own status: seq carries the boot epoch, grows, and is gossiped. */
START_TEST(test_set_status) {
  h_t h;
  h_init(&h, 4, NULL);
  st_msg_status_t s;
  memset(&s, 0, sizeof s);
  s.step = 10;
  ck_assert_int_eq(st_membership_set_status(h.m, h.now, &s), 0);
  drain(&h);
  const st_member_t* mb = st_membership_find(h.m, &h.id[0]);
  ck_assert(mb->has_status);
  uint64_t seq1 = mb->status.seq;
  ck_assert_uint_gt(seq1, INC1);
  s.step = 11;
  ck_assert_int_eq(st_membership_set_status(h.m, h.now, &s), 0);
  drain(&h);
  mb = st_membership_find(h.m, &h.id[0]);
  ck_assert_uint_eq(mb->status.seq, seq1 + 1);
  size_t mark = h.n_sent;
  h_run(&h, h.now + 2000);
  match_t w = {ST_MSG_STATUS, NULL, 0};
  ck_assert_uint_gt(count_sent(&h, mark, is_match, &w), 0);
  h_free(&h);
}
END_TEST

/* ==== Dissemination =========================================================
 *
 * One update (our refutation) is sent exactly
 * retransmit_mult * ceil(log10(N + 1)) times, N counting us. */
static const struct {
  int n;
  size_t want;
} retransmit_cases[] = {{2, 4}, {9, 4}, {10, 8}, {50, 8}, {100, 12}};

START_TEST(test_retransmit_limit) {
  h_t h;
  h_init(&h, retransmit_cases[_i].n, NULL);
  h_run(&h, h.now + 120000); /* the joins' updates drain */
  size_t mark = h.n_sent;
  st_msg_t s = accuse_msg(&h, ST_MSG_SUSPECT, 0, INC1, 1);
  feed(&h, 1, &s, 1);
  h_run(&h, h.now + 60000);
  match_t w = {ST_MSG_ALIVE, &h.id[0], INC1 + 1};
  ck_assert_uint_eq(count_sent(&h, mark, is_match, &w),
                    retransmit_cases[_i].want);
  h_free(&h);
}
END_TEST

/* 120 members learned at once and 60 status records: every packet fits,
 * decodes message by message, and the first ones are packed full. */
START_TEST(test_packet_size) {
  h_t h;
  h_init(&h, 2, NULL);
  h.n = 121;
  for (int j = 2; j < h.n; j++) {
    member_identity(j, h.pk[j], &h.id[j], &h.addr[j]);
    h.acks[j] = h.relays[j] = true;
  }
  size_t mark = h.n_sent;
  uint8_t buf[1200];
  for (int j = 2; j < h.n; j++) {
    st_msg_t msgs[2] = {alive_msg(&h, j, INC1), status_msg(&h, j, 3, 30)};
    int len = enc(msgs, j % 2 ? 2 : 1, buf, sizeof buf);
    ck_assert_int_eq(feed_raw(&h, 1, buf, (size_t) len), 0);
  }
  ck_assert_uint_eq(st_membership_count(h.m), 121);
  h_run(&h, h.now + 10000);
  size_t full = 0;
  for (size_t i = mark; i < h.n_sent; i++) {
    ck_assert_uint_le(h.sent[i].len, ST_PACKET_MAX_PLAINTEXT);
    if (h.sent[i].len > ST_PACKET_MAX_PLAINTEXT - 100)
      full++;
  }
  ck_assert_uint_gt(full, 10);
  h_free(&h);
}
END_TEST

/* ==== Lifeguard: awareness and nacks ========================================
 *
 * Nobody answers anything: each failed probe raises awareness by the 3
 * nacks that did not come, up to awareness_max - 1 = 7, and the gap after
 * each probe is probe_interval * (awareness + 1). Without Lifeguard the
 * score stays 0 and the gap 1 s. */
START_TEST(test_awareness) {
  bool lifeguard = _i == 0;
  st_membership_config_t cfg;
  st_membership_config_default(&cfg);
  cfg.lifeguard = lifeguard;
  h_t h;
  h_init(&h, 12, &cfg);
  for (int j = 1; j < h.n; j++)
    h.acks[j] = h.relays[j] = false;
  size_t mark = h.n_sent;
  h_run(&h, h.now + 40000);
  uint64_t last_at = 0;
  uint32_t last_health = 0, max_health = 0;
  int probes = 0;
  for (size_t i = mark; i < h.n_sent; i++) {
    sent_t one = h.sent[i];
    match_t p = {ST_MSG_PING, &h.id[one.to > 0 ? one.to : 1], 0};
    if (one.to <= 0 || !sent_has(&h, i, &p))
      continue;
    if (probes > 0)
      ck_assert_uint_eq(one.at - last_at, 1000 * (uint64_t) (last_health + 1));
    ck_assert_uint_ge(one.health, last_health);
    last_at = one.at;
    last_health = one.health;
    if (one.health > max_health)
      max_health = one.health;
    probes++;
  }
  ck_assert_int_ge(probes, 5);
  ck_assert_uint_eq(max_health, lifeguard ? 7 : 0);
  h_free(&h);
}
END_TEST

/* A local stall: the machine has a probe in flight and holds member 2
 * suspect, then is not woken until 2 s after both the probe's end and the
 * suspicion's deadline; the target's ack and member 2's refutation wait in
 * its receive queue. With Lifeguard the tick that finds its deadline that
 * overdue treats it as a stall (awareness + 1, deadlines re-armed from
 * now), so the backlog read next clears both and nobody is wrongly
 * suspected or declared dead. Plain SWIM concludes at once. */
START_TEST(test_stall) {
  bool lifeguard = _i == 0;
  st_membership_config_t cfg;
  st_membership_config_default(&cfg);
  cfg.lifeguard = lifeguard;
  h_t h;
  h_init(&h, 5, &cfg);
  h_run(&h, h.now + 3000);
  st_msg_t sus = accuse_msg(&h, ST_MSG_SUSPECT, 2, INC1, 1);
  feed(&h, 1, &sus, 1);
  ck_assert_int_eq(state_of(&h, 2), ST_MEMBER_SUSPECT);
  /* Silence, so that the probe started next stays open. */
  for (int j = 1; j < h.n; j++)
    h.acks[j] = h.relays[j] = false;
  for (int k = 0; k < 3000 && !h.m->probing; k++)
    h_run(&h, h.now + 1);
  ck_assert(h.m->probing);
  int t = who(&h, &h.m->probe_target);
  uint32_t seq = h.m->probe_seq;
  ck_assert_int_gt(t, 0);
  uint64_t until = h.m->probe_end_at > h.m->susp_min_at ? h.m->probe_end_at
                                                        : h.m->susp_min_at;
  uint32_t health = st_membership_health(h.m);
  h.now = until + 2000;
  ck_assert_int_eq(st_membership_tick(h.m, h.now), 0);
  drain(&h);
  if (!lifeguard) {
    ck_assert_int_eq(state_of(&h, 2), ST_MEMBER_DEAD);
    if (t != 2)
      ck_assert_int_eq(state_of(&h, t), ST_MEMBER_SUSPECT);
    h_free(&h);
    return;
  }
  ck_assert_int_eq(state_of(&h, 2), ST_MEMBER_SUSPECT);
  if (t != 2)
    ck_assert_int_eq(state_of(&h, t), ST_MEMBER_ALIVE);
  ck_assert_uint_eq(h.m->stats.stalls, 1);
  ck_assert_uint_eq(st_membership_health(h.m), health + 1);
  /* The backlog: the target's ack, member 2's refutation. */
  st_msg_t ack;
  memset(&ack, 0, sizeof ack);
  ack.type = ST_MSG_ACK;
  ack.u.ack.seq = seq;
  feed(&h, t, &ack, 1);
  st_msg_t alive = alive_msg(&h, 2, INC1 + 1);
  feed(&h, 2, &alive, 1);
  for (int j = 1; j < h.n; j++)
    h.acks[j] = h.relays[j] = true;
  h_run(&h, h.now + 60000);
  for (int j = 1; j < h.n; j++)
    ck_assert_int_eq(state_of(&h, j), ST_MEMBER_ALIVE);
  ck_assert_uint_eq(h.m->stats.stalls, 1);
  h_free(&h);
}
END_TEST

/* The machine as a ping-req intermediary: ping the target, forward its
 * ack, or send a nack at 80% of the probe timeout (400 ms) when asked. */
static const struct {
  bool target_acks;
  bool want_nack;
  size_t acks, nacks;
} relay_cases[] = {
    {true, true, 1, 0},
    {false, true, 0, 1},
    {false, false, 0, 0},
    {true, false, 1, 0},
};

START_TEST(test_nack_served) {
  h_t h;
  h_init(&h, 4, NULL);
  h.acks[2] = relay_cases[_i].target_acks;
  h_run(&h, h.now + 10); /* settle */
  size_t mark = h.n_sent;
  uint64_t t0 = h.now;
  st_msg_t req;
  memset(&req, 0, sizeof req);
  req.type = ST_MSG_PING_REQ;
  req.u.ping_req.seq = 777;
  req.u.ping_req.target = h.id[2];
  req.u.ping_req.target_addr = h.addr[2];
  req.u.ping_req.want_nack = relay_cases[_i].want_nack;
  feed(&h, 1, &req, 1);
  match_t ping = {ST_MSG_PING, &h.id[2], 0};
  ck_assert_uint_ge(count_sent(&h, mark, is_match, &ping), 1);
  h_run(&h, t0 + 600);
  size_t acks = 0, nacks = 0;
  for (size_t i = mark; i < h.n_sent; i++) {
    if (h.sent[i].to != 1)
      continue;
    size_t off = 0;
    while (off < h.sent[i].len) {
      st_msg_t msg;
      size_t used;
      ck_assert_int_eq(
          st_wire_decode_next(h.sent[i].data + off, h.sent[i].len - off, &msg,
                              &used, NULL),
          0);
      off += used;
      if (msg.type == ST_MSG_ACK && msg.u.ack.seq == 777)
        acks++;
      if (msg.type == ST_MSG_NACK && msg.u.nack.seq == 777) {
        nacks++;
        ck_assert_uint_eq(h.sent[i].at, t0 + 400);
      }
    }
  }
  ck_assert_uint_eq(acks, relay_cases[_i].acks);
  ck_assert_uint_eq(nacks, relay_cases[_i].nacks);
  h_free(&h);
}
END_TEST

/* The machine as prober: a target that does not answer, intermediaries
 * that nack (the prober is fine: awareness stays 0) or that are silent
 * (the prober's own link is suspect: +3); then a probe that succeeds
 * lowers it by 1. */
START_TEST(test_nack_counted) {
  bool nacks = _i == 0;
  h_t h;
  h_init(&h, 5, NULL);
  for (int j = 1; j < h.n; j++) {
    h.acks[j] = false;
    h.relays[j] = nacks;
  }
  /* Run until the first probe has ended. */
  uint64_t t_end = 0;
  while (t_end == 0) {
    h_run(&h, h.now + 1);
    for (int j = 1; j < h.n; j++)
      if (h.suspect_at[j])
        t_end = h.suspect_at[j];
  }
  ck_assert_uint_eq(st_membership_health(h.m), nacks ? 0 : 3);
  uint32_t before = st_membership_health(h.m);
  /* The next probe went out with the end of this one; it is answered. */
  for (int j = 1; j < h.n; j++)
    h.acks[j] = true;
  h_run(&h, h.now + 10);
  ck_assert_uint_eq(st_membership_health(h.m), before ? before - 1 : 0);
  h_free(&h);
}
END_TEST

/* ==== Bad packets ===========================================================
 */

enum {
  BAD_TRUNC,
  BAD_HS1,
  BAD_PUSH_PULL,
  BAD_EMPTY,
  BAD_LONG,
  BAD_SELF,
  BAD_COUNT,
  BAD_PING_OTHER,
  BAD_GARBAGE_TAIL,
  NBAD
};

START_TEST(test_bad_packets) {
  h_t h;
  h_init(&h, 4, NULL);
  size_t count = st_membership_count(h.m);
  uint8_t buf[2048];
  size_t len = 0;
  int from = 1, want_rc = -EBADMSG;
  st_msg_t msgs[2];
  memset(msgs, 0, sizeof msgs);
  switch (_i) {
    case BAD_TRUNC:
      msgs[0] = alive_msg(&h, 3, INC1 + 9);
      len = (size_t) enc(msgs, 1, buf, sizeof buf) - 3;
      break;
    case BAD_HS1:
      msgs[0].type = ST_MSG_HS1;
      msgs[0].u.hs1.version = ST_HS_VERSION;
      len = (size_t) enc(msgs, 1, buf, sizeof buf);
      want_rc = 0; /* well formed: skipped and counted, not fatal */
      break;
    case BAD_PUSH_PULL:
      msgs[0].type = ST_MSG_PUSH_PULL;
      len = (size_t) enc(msgs, 1, buf, sizeof buf);
      want_rc = 0;
      break;
    case BAD_EMPTY:
      len = 0;
      break;
    case BAD_LONG:
      memset(buf, 0xc0, sizeof buf); /* msgpack nil, many */
      len = ST_PACKET_MAX_PLAINTEXT + 1;
      break;
    case BAD_SELF:
      msgs[0] = alive_msg(&h, 3, INC1 + 9);
      len = (size_t) enc(msgs, 1, buf, sizeof buf);
      from = 0;
      break;
    case BAD_COUNT: {
      /* An array declaring 2^32 - 1 elements in 7 bytes. */
      const uint8_t b[] = {0xdd, 0xff, 0xff, 0xff, 0xff, 0x14, 0x01};
      memcpy(buf, b, sizeof b);
      len = sizeof b;
      break;
    }
    case BAD_PING_OTHER:
      msgs[0].type = ST_MSG_PING;
      msgs[0].u.ping.seq = 5;
      msgs[0].u.ping.target = h.id[2];
      len = (size_t) enc(msgs, 1, buf, sizeof buf);
      want_rc = 0;
      break;
    case BAD_GARBAGE_TAIL:
      msgs[0] = accuse_msg(&h, ST_MSG_SUSPECT, 3, INC1, 1);
      len = (size_t) enc(msgs, 1, buf, sizeof buf);
      buf[len++] = 0xc1; /* never used in msgpack */
      break;
  }
  const st_wire_counters_t* c = st_membership_counters(h.m);
  uint64_t drops = 0;
  for (int r = 0; r < ST_WIRE_DROP_COUNT; r++)
    drops += c->drops[r];
  size_t mark = h.n_sent;
  const st__membership_stats_t* stats = st__membership_stats(h.m);
  uint64_t rejected = stats->msgs_rejected;
  ck_assert_int_eq(
      st_membership_packet(h.m, h.now, &h.id[from], &h.addr[from], buf, len),
      want_rc);
  drain(&h);
  uint64_t after = 0;
  for (int r = 0; r < ST_WIRE_DROP_COUNT; r++)
    after += c->drops[r];
  ck_assert_uint_eq(after + stats->msgs_rejected, drops + rejected + 1);
  ck_assert_uint_eq(st_membership_count(h.m), count);
  ck_assert_uint_eq(inc_of(&h, 3), INC1);
  if (_i == BAD_GARBAGE_TAIL) /* the message before the garbage counted */
    ck_assert_int_eq(state_of(&h, 3), ST_MEMBER_SUSPECT);
  else
    ck_assert_int_eq(state_of(&h, 3), ST_MEMBER_ALIVE);
  ck_assert_uint_eq(h.n_sent, mark); /* nothing answered */
  h_free(&h);
}
END_TEST

/* The names the CLI, the daemon's log and the simulator print. */
START_TEST(test_member_state_names) {
  ck_assert_str_eq(st_member_state_name(ST_MEMBER_ALIVE), "alive");
  ck_assert_str_eq(st_member_state_name(ST_MEMBER_SUSPECT), "suspect");
  ck_assert_str_eq(st_member_state_name(ST_MEMBER_DEAD), "dead");
  ck_assert_str_eq(st_member_state_name(ST_MEMBER_LEFT), "left");
  ck_assert_str_eq(st_member_state_name((st_member_state_t) 4), "?");
  ck_assert_str_eq(st_member_state_name((st_member_state_t) 255), "?");
}
END_TEST

/* An update that reaches its last transmission leaves the queue alone: when
 * N has just fallen across a power of ten (a reclaim: 10 -> 9 members
 * lowers the limit from 8 to 4) the list at the new limit still holds
 * updates until the next gossip tick purges them. Retiring one update
 * must not cut them out of the queue (it did: a second unlink emptied that
 * list, and bc_pending never returned to 0). */
static uint32_t queue_len(const st_membership_t* m, uint32_t t) {
  uint32_t n = 0;
  for (uint32_t i = m->bc_head[t]; i != ST__NONE; i = m->bc[i].next)
    n++;
  return n;
}

static void clear_queue(st_membership_t* m) {
  for (uint32_t i = 0; i < m->n_mem; i++) {
    st__bc_drop(m, &m->mem[i].bcast);
    if (m->mem[i].status != ST__NONE)
      st__bc_drop(m, &m->statuses[m->mem[i].status].bcast);
  }
  ck_assert_uint_eq(m->bc_pending, 0);
}

static void send_one(h_t* h) {
  ck_assert_int_eq(st__send_packet(h->m, &h->addr[1], &h->id[1], NULL, NULL),
                   0);
  drain(h);
}

START_TEST(test_retire_at_shrunk_limit) {
  h_t h;
  h_init(&h, 10, NULL);
  st_membership_t* m = h.m;
  uint32_t lim_before = st__retransmit_limit(m);
  st_msg_t dead = accuse_msg(&h, ST_MSG_DEAD, 9, INC1, 1);
  ck_assert_int_eq(feed(&h, 1, &dead, 1), 0);
  ck_assert_int_eq(state_of(&h, 9), ST_MEMBER_DEAD);
  clear_queue(m);
  /* With 9 members left the limit will be retransmit_mult x
   * ceil(log10(10)). Under the old limit, B reaches that count and A one
   * less... */
  uint32_t lim = m->cfg.retransmit_mult;
  ck_assert_uint_lt(lim, lim_before);
  ck_assert_uint_ge(lim, 2);
  st__mrec_t* b = &m->mem[st__mem_find(m, &h.id[2])];
  st__bc_queue_member(m, b, &h.id[0]);
  send_one(&h);
  st__mrec_t* a = &m->mem[st__mem_find(m, &h.id[3])];
  st__bc_queue_member(m, a, &h.id[0]);
  for (uint32_t k = 0; k + 1 < lim; k++)
    send_one(&h);
  /* ...and then the limit shrinks under them. */
  st__reclaim(m, h.now + m->cfg.dead_reclaim_ms + 1);
  ck_assert_uint_eq(st__retransmit_limit(m), lim);
  b = &m->mem[st__mem_find(m, &h.id[2])];
  a = &m->mem[st__mem_find(m, &h.id[3])];
  ck_assert_uint_eq(m->bc[a->bcast].transmits, lim - 1);
  ck_assert_uint_eq(m->bc[b->bcast].transmits, lim);
  ck_assert_uint_eq(queue_len(m, lim), 1);
  /* A's last transmission: A retires, B stays queued at the limit. */
  send_one(&h);
  ck_assert_uint_eq(a->bcast, ST__NONE);
  ck_assert_uint_ne(b->bcast, ST__NONE);
  ck_assert_uint_eq(queue_len(m, lim), 1);
  ck_assert_uint_eq(m->bc_pending, 1);
  /* The next gossip tick purges B: nothing is left pending. */
  st__gossip_tick(m, h.now);
  drain(&h);
  ck_assert_uint_eq(m->bc_pending, 0);
  ck_assert_uint_eq(b->bcast, ST__NONE);
  h_free(&h);
}
END_TEST

/* Dead members are forgotten after dead_reclaim_ms, so memory stays
 * bounded under churn. */
START_TEST(test_reclaim) {
  h_t h;
  h_init(&h, 6, NULL);
  st_msg_t d = accuse_msg(&h, ST_MSG_DEAD, 4, INC1, 1);
  feed(&h, 1, &d, 1);
  d = accuse_msg(&h, ST_MSG_DEAD, 5, INC1, 5);
  feed(&h, 5, &d, 1);
  ck_assert_uint_eq(st_membership_count(h.m), 6);
  h_run(&h, h.now + ST_MEMBERSHIP_DEAD_RECLAIM_MS - 100);
  ck_assert_uint_eq(st_membership_count(h.m), 6);
  h_run(&h, h.now + ST_MEMBERSHIP_DEAD_RECLAIM_MS);
  ck_assert_uint_eq(st_membership_count(h.m), 4);
  ck_assert_int_eq(state_of(&h, 4), -1);
  for (int j = 0; j < 4; j++)
    ck_assert_int_eq(state_of(&h, j), ST_MEMBER_ALIVE);
  h_free(&h);
}
END_TEST

/* Reconnect after a partition: member 4 is declared dead and, 30 s later,
 * forgotten; the machine still tries a push-pull with it now and then
 * (with it held dead and, after, buried), so that the two sides of a
 * healed split find each other again. Member 5, who left, is not
 * contacted, and neither is anyone once the graves expire. */
START_TEST(test_reconnect) {
  h_t h;
  h_init(&h, 6, NULL);
  st_msg_t d = accuse_msg(&h, ST_MSG_DEAD, 4, INC1, 1);
  feed(&h, 1, &d, 1);
  d = accuse_msg(&h, ST_MSG_DEAD, 5, INC1, 5);
  feed(&h, 5, &d, 1);
  h_run(&h, h.now + ST_MEMBERSHIP_DEAD_RECLAIM_MS * 2);
  ck_assert_int_eq(state_of(&h, 4), -1);
  size_t before = h.pp_to[4];
  /* Push-pull every 30 s at 6 members: 10 tries in 5 minutes. */
  h_run(&h, h.now + 300000);
  ck_assert_uint_ge(h.pp_to[4], before + 8);
  ck_assert_uint_eq(h.pp_to[5], 0);
  h_run(&h, h.now + ST_MEMBERSHIP_GRAVE_KEEP_MS);
  before = h.pp_to[4];
  h_run(&h, h.now + 300000);
  ck_assert_uint_eq(h.pp_to[4], before);
  h_free(&h);
}
END_TEST

/* Force-leave (st_membership_force_leave): a dead member (4) is forgotten
 * at once and never contacted again, and a buried one (3) leaves the
 * graves; an old ALIVE does not bring either back, a newer one (a
 * restart) does. Alive members, strangers and the node itself are
 * refused. */
START_TEST(test_force_leave) {
  h_t h;
  h_init(&h, 6, NULL);
  st_node_id_t stranger;
  memset(&stranger, 0x77, sizeof stranger);
  ck_assert_int_eq(st_membership_force_leave(h.m, h.now, &h.id[2]), -EBUSY);
  ck_assert_int_eq(st_membership_force_leave(h.m, h.now, &stranger), -ENOENT);
  ck_assert_int_eq(st_membership_force_leave(h.m, h.now, &h.id[0]), -EINVAL);
  st_msg_t d = accuse_msg(&h, ST_MSG_DEAD, 3, INC1, 1);
  feed(&h, 1, &d, 1);
  h_run(&h, h.now + ST_MEMBERSHIP_DEAD_RECLAIM_MS * 2); /* 3 is buried */
  ck_assert_int_eq(state_of(&h, 3), -1);
  st_node_id_t graves[4];
  ck_assert_uint_eq(st_membership_graves(h.m, graves, 4), 1);
  d = accuse_msg(&h, ST_MSG_DEAD, 4, INC1, 1);
  feed(&h, 1, &d, 1);
  ck_assert_int_eq(state_of(&h, 4), ST_MEMBER_DEAD);
  ck_assert_int_eq(st_membership_force_leave(h.m, h.now, &h.id[4]), 0);
  ck_assert_int_eq(state_of(&h, 4), -1);
  ck_assert_int_eq(st_membership_force_leave(h.m, h.now, &h.id[3]), 0);
  ck_assert_uint_eq(st_membership_graves(h.m, graves, 4), 0);
  ck_assert_int_eq(st_membership_force_leave(h.m, h.now, &h.id[3]), -ENOENT);
  /* Rumours of them at the incarnation they had are ignored. */
  st_msg_t a[2] = {alive_msg(&h, 3, INC1), alive_msg(&h, 4, INC1)};
  feed(&h, 2, a, 2);
  ck_assert_int_eq(state_of(&h, 3), -1);
  ck_assert_int_eq(state_of(&h, 4), -1);
  size_t before3 = h.pp_to[3], before4 = h.pp_to[4];
  h_run(&h, h.now + 300000); /* ten push-pull periods: no reconnect */
  ck_assert_uint_eq(h.pp_to[3], before3);
  ck_assert_uint_eq(h.pp_to[4], before4);
  /* Restarted (a new boot epoch): back. */
  a[0] = alive_msg(&h, 4, INC1 << 1);
  feed(&h, 4, a, 1);
  ck_assert_int_eq(state_of(&h, 4), ST_MEMBER_ALIVE);
  h_free(&h);
}
END_TEST

/* The defaults are memberlist's LAN configuration. */
/* A hint from another layer (a broken stream): the member is probed next,
 * in the very next probe period, ahead of the shuffled order; it becomes
 * suspect only because it then fails that probe, and an answering member
 * stays alive. Every member is hinted in turn, so the test holds whatever
 * the shuffled order. */
START_TEST(test_probe_hint) {
  st_membership_config_t cfg;
  st_membership_config_default(&cfg);
  h_t h;
  h_init(&h, 12, &cfg);
  h_run(&h, h.now + 5000);
  for (int t = 1; t < 12; t++) {
    size_t before = h.n_sent;
    ck_assert_int_eq(st_membership_probe_hint(h.m, h.now, &h.id[t]), 0);
    drain(&h);
    /* Within one probe interval, the next PING goes to t. */
    h_run(&h, h.now + cfg.probe_interval_ms + 1);
    int first = -1;
    for (size_t i = before; i < h.n_sent && first < 0; i++) {
      st_msg_t msg;
      size_t used;
      if (st_wire_decode_next(h.sent[i].data, h.sent[i].len, &msg, &used,
                              NULL) == 0) {
        if (msg.type == ST_MSG_PING)
          first = who(&h, &msg.u.ping.target);
        st_wire_msg_free(&msg);
      }
    }
    ck_assert_msg(first == t, "hinted %d, next probe went to %d", t, first);
    ck_assert_int_eq(state_of(&h, t), ST_MEMBER_ALIVE); /* it answered */
  }
  /* Not a member, or self: refused. */
  st_node_id_t stranger;
  memset(&stranger, 0xEE, sizeof stranger);
  ck_assert_int_eq(st_membership_probe_hint(h.m, h.now, &stranger), -ENOENT);
  ck_assert_int_eq(st_membership_probe_hint(h.m, h.now, &h.id[0]), -ENOENT);
  h_free(&h);
}
END_TEST

START_TEST(test_defaults) {
  st_membership_config_t c;
  st_membership_config_default(&c);
  ck_assert_uint_eq(c.probe_interval_ms, 1000);
  ck_assert_uint_eq(c.probe_timeout_ms, 500);
  ck_assert_uint_eq(c.indirect_checks, 3);
  ck_assert_uint_eq(c.suspicion_mult, 4);
  ck_assert_uint_eq(c.suspicion_max_mult, 6);
  ck_assert_uint_eq(c.retransmit_mult, 4);
  ck_assert_uint_eq(c.gossip_interval_ms, 200);
  ck_assert_uint_eq(c.gossip_nodes, 3);
  ck_assert_uint_eq(c.push_pull_interval_ms, 30000);
  ck_assert_uint_eq(c.awareness_max, 8);
  ck_assert(c.lifeguard);
  c.probe_timeout_ms = 2000; /* longer than the interval */
  st_rng_t rng;
  st_rng_seed(&rng, 1);
  st_node_id_t id;
  memset(&id, 1, sizeof id);
  st_wire_addr_t addr = {4, {127, 0, 0, 1}, 1};
  uint8_t pk[ST_PUBLIC_KEY_BYTES] = {0};
  st_membership_t* m = NULL;
  ck_assert_int_eq(st_membership_new(&c, &id, &addr, pk, 1, &rng, &m), -EINVAL);
}
END_TEST

/* ==== Claims bound to their subject (issue #17) =============================
 *
 * A member that holds the cluster key may relay claims about others but
 * not forge them: ALIVE, STATUS and leave carry the subject's signature,
 * SUSPECT and DEAD name an incarnation the subject signed, and a probe's
 * ACK counts only from the member asked. Each refusal is counted. */

static st_membership_claim_stats_t claims(const h_t* h) {
  st_membership_claim_stats_t c;
  st_membership_claim_stats(h->m, &c);
  return c;
}

START_TEST(test_claims_counted) {
  h_t h;
  h_init(&h, 4, NULL);
  st_msg_t a = alive_msg(&h, 1, UINT64_MAX);
  member_sign_alive(h.pk[3], &a.u.alive); /* 3 forges 1's ALIVE */
  feed(&h, 3, &a, 1);
  ck_assert_uint_eq(inc_of(&h, 1), INC1);
  ck_assert_uint_eq(claims(&h).bad_signature, 1);
  /* The same forgery relayed again by another costs one more check. */
  feed(&h, 2, &a, 1);
  ck_assert_uint_eq(claims(&h).bad_signature, 2);
  /* Its ALIVE at INC1 repeated: no change, no verification. */
  st_msg_t same = alive_msg(&h, 1, INC1);
  same.u.alive.signature[0] ^= 1;
  feed(&h, 2, &same, 1);
  ck_assert_uint_eq(claims(&h).bad_signature, 2);
  st_msg_t s = accuse_msg(&h, ST_MSG_SUSPECT, 1, INC1 + 1, 3);
  feed(&h, 3, &s, 1);
  ck_assert_int_eq(state_of(&h, 1), ST_MEMBER_ALIVE);
  ck_assert_uint_eq(claims(&h).beyond_signed, 1);
  h_free(&h);
}
END_TEST

/* A STATUS is its subject's: a forged one (seq 2^64-1, which would pin a
 * false fingerprint for good) or one with a flipped bit is refused, and
 * the subject's own records keep flowing. */
START_TEST(test_status_signed) {
  h_t h;
  h_init(&h, 4, NULL);
  st_msg_t f = status_msg(&h, 1, UINT64_MAX, 999);
  memset(f.u.status.fingerprint, 0xEE, sizeof f.u.status.fingerprint);
  member_sign_status(h.pk[2], &f.u.status);
  feed(&h, 2, &f, 1);
  ck_assert(!st_membership_find(h.m, &h.id[1])->has_status);
  st_msg_t b = status_msg(&h, 1, 7, 70);
  b.u.status.step = 71; /* changed after signing */
  feed(&h, 2, &b, 1);
  ck_assert(!st_membership_find(h.m, &h.id[1])->has_status);
  ck_assert_uint_eq(claims(&h).bad_signature, 2);
  st_msg_t ok = status_msg(&h, 1, 8, 80);
  feed(&h, 2, &ok, 1); /* relayed, signed by 1 */
  const st_member_t* mb = st_membership_find(h.m, &h.id[1]);
  ck_assert(mb->has_status);
  ck_assert_uint_eq(mb->status.step, 80);
  st_msg_t next = status_msg(&h, 1, 9, 90);
  feed(&h, 1, &next, 1);
  ck_assert_uint_eq(st_membership_find(h.m, &h.id[1])->status.step, 90);
  h_free(&h);
}
END_TEST

/* Refutation at the highest incarnation we signed: a forged ALIVE of us at
 * 2^64-1 changes nothing; our own (replayed) one at 2^64-1 is outbid by
 * saturation, and accusations at it are refuted without wrapping to 0. */
START_TEST(test_refute_saturates) {
  h_t h;
  h_init(&h, 4, NULL);
  st_msg_t f = alive_msg(&h, 0, UINT64_MAX);
  member_sign_alive(h.pk[2], &f.u.alive);
  feed(&h, 2, &f, 1);
  ck_assert_uint_eq(inc_of(&h, 0), INC1);
  ck_assert_uint_eq(claims(&h).bad_signature, 1);
  st_msg_t own = alive_msg(&h, 0, UINT64_MAX); /* signed by us */
  feed(&h, 2, &own, 1);
  ck_assert_uint_eq(inc_of(&h, 0), UINT64_MAX);
  ck_assert_int_eq(state_of(&h, 0), ST_MEMBER_ALIVE);
  for (int k = 0; k < 2; k++) {
    st_msg_t s =
        accuse_msg(&h, k ? ST_MSG_DEAD : ST_MSG_SUSPECT, 0, UINT64_MAX, 2);
    feed(&h, 2, &s, 1);
    ck_assert_uint_eq(inc_of(&h, 0), UINT64_MAX);
    ck_assert_int_eq(state_of(&h, 0), ST_MEMBER_ALIVE);
  }
  ck_assert_uint_eq(h.m->stats.refutes, 3);
  h_free(&h);
}
END_TEST

/* Waits (silence all round) until the machine's probe is open; returns its
 * target. */
static int open_probe(h_t* h) {
  for (int j = 1; j < h->n; j++)
    h->acks[j] = h->relays[j] = false;
  for (int k = 0; k < 3000 && !h->m->probing; k++)
    h_run(h, h->now + 1);
  ck_assert(h->m->probing);
  int t = who(h, &h->m->probe_target);
  ck_assert_int_gt(t, 0);
  return t;
}

static void feed_ack(h_t* h, int from, st_msg_type_t type, uint32_t seq) {
  st_msg_t ack;
  memset(&ack, 0, sizeof ack);
  ack.type = type;
  ack.u.ack.seq = seq;
  feed(h, from, &ack, 1);
}

/* An ACK of our probe counts only from the target (or a relay we asked):
 * another member's ACK of the same seq keeps nobody alive. */
START_TEST(test_ack_wrong_sender) {
  h_t h;
  h_init(&h, 6, NULL);
  int t = open_probe(&h);
  int other = t == 1 ? 2 : 1;
  uint32_t seq = h.m->probe_seq;
  feed_ack(&h, other, ST_MSG_ACK, seq);
  ck_assert(h.m->probing && !h.m->probe_acked);
  ck_assert_uint_eq(claims(&h).ack_wrong_sender, 1);
  /* After the indirect probes go out, the relays' acks count; a NACK from
   * a member not asked does not. */
  while (!h.m->probe_indirect)
    h_run(&h, h.now + 1);
  ck_assert_uint_gt(h.m->n_probe_via, 0);
  int via = who(&h, &h.m->probe_via[0]);
  int stranger = -1;
  for (int j = 1; j < h.n && stranger < 0; j++) {
    bool asked = j == t;
    for (uint32_t i = 0; i < h.m->n_probe_via; i++)
      asked |= who(&h, &h.m->probe_via[i]) == j;
    if (!asked)
      stranger = j;
  }
  ck_assert_int_gt(stranger, 0);
  feed_ack(&h, stranger, ST_MSG_NACK, seq);
  ck_assert_uint_eq(h.m->nacks, 0);
  ck_assert_uint_eq(claims(&h).ack_wrong_sender, 2);
  feed_ack(&h, via, ST_MSG_ACK, seq);
  ck_assert(h.m->probe_acked || !h.m->probing);
  h_free(&h);
}
END_TEST

/* Serving a ping-req for member 1 about member 2: only 2's ACK of our ping
 * is forwarded to 1. */
START_TEST(test_relay_ack_wrong_sender) {
  h_t h;
  h_init(&h, 4, NULL);
  h.acks[2] = false; /* the harness does not answer for 2 */
  h_run(&h, h.now + 10);
  st_msg_t req;
  memset(&req, 0, sizeof req);
  req.type = ST_MSG_PING_REQ;
  req.u.ping_req.seq = 555;
  req.u.ping_req.target = h.id[2];
  req.u.ping_req.target_addr = h.addr[2];
  feed(&h, 1, &req, 1);
  uint32_t our = 0;
  for (uint32_t i = 0; i < ST_MEMBERSHIP_MAX_RELAYS; i++)
    if (h.m->relays[i].used && h.m->relays[i].req_seq == 555)
      our = h.m->relays[i].our_seq;
  ck_assert_uint_ne(our, 0);
  size_t mark = h.n_sent;
  feed_ack(&h, 3, ST_MSG_ACK, our);
  ck_assert_uint_eq(claims(&h).ack_wrong_sender, 1);
  ck_assert_uint_eq(h.n_sent, mark); /* nothing forwarded */
  feed_ack(&h, 2, ST_MSG_ACK, our);
  ck_assert_uint_eq(h.n_sent, mark + 1);
  ck_assert_int_eq(h.sent[mark].to, 1);
  h_free(&h);
}
END_TEST

/* A push-pull relays signed claims: an entry whose signature is not its
 * member's changes nothing, a genuine one is merged. */
START_TEST(test_push_pull_forged_entry) {
  h_t h;
  h_init(&h, 5, NULL);
  st_push_pull_entry_t e[3];
  memset(e, 0, sizeof e);
  for (int k = 0; k < 3; k++) {
    int j = k + 1;
    st_msg_t a = alive_msg(&h, j, INC1 + 7);
    e[k].node = h.id[j];
    e[k].incarnation = INC1 + 7;
    e[k].state = ST_MEMBER_ALIVE;
    e[k].addr = h.addr[j];
    memcpy(e[k].public_key, h.pk[j], ST_PUBLIC_KEY_BYTES);
    memcpy(e[k].signature, a.u.alive.signature, ST_SIGNATURE_BYTES);
  }
  e[0].signature[3] ^= 1; /* 1's entry spoiled */
  st_msg_t lv = accuse_msg(&h, ST_MSG_DEAD, 2, INC1 + 7, 4);
  member_sign_leave(h.pk[4], &lv.u.dead); /* 4 says 2 left */
  e[1].state = ST_MEMBER_LEFT;
  memcpy(e[1].signature, lv.u.dead.signature, ST_SIGNATURE_BYTES);
  st_msg_t pp;
  memset(&pp, 0, sizeof pp);
  pp.type = ST_MSG_PUSH_PULL;
  pp.u.push_pull.is_reply = true;
  pp.u.push_pull.n_entries = 3;
  pp.u.push_pull.entries = e;
  uint8_t buf[2048];
  size_t len;
  ck_assert_int_eq(st_wire_encode(&pp, buf, sizeof buf, &len), 0);
  ck_assert_int_eq(st_membership_push_pull_in(h.m, h.now, &h.addr[4], buf, len),
                   0);
  drain(&h);
  ck_assert_uint_eq(inc_of(&h, 1), INC1);
  ck_assert_int_eq(state_of(&h, 2), ST_MEMBER_ALIVE);
  ck_assert_uint_eq(inc_of(&h, 2), INC1);
  ck_assert_uint_eq(inc_of(&h, 3), INC1 + 7);
  ck_assert_uint_eq(claims(&h).bad_signature, 2); /* 1's ALIVE, 2's leave */
  h_free(&h);
}
END_TEST

/* With real identities and the default verifier (Ed25519): a member's
 * signed ALIVE is accepted, a flipped bit or another's signature is not. */
static void sign_real(void* ctx, const uint8_t* msg, size_t len,
                      uint8_t sig[ST_SIGNATURE_BYTES]) {
  st_identity_sign((const st_identity_t*) ctx, msg, len, sig);
}

START_TEST(test_ed25519_claims) {
  st_identity_t a, b, c;
  ck_assert_int_eq(st_identity_generate(&a), 0);
  ck_assert_int_eq(st_identity_generate(&b), 0);
  ck_assert_int_eq(st_identity_generate(&c), 0);
  st_membership_config_t cfg;
  st_membership_config_default(&cfg);
  st_rng_t rng;
  st_rng_seed(&rng, 7);
  st_wire_addr_t addr = {4, {127, 0, 0, 1}, 7946};
  st_membership_t* m = NULL;
  ck_assert_int_eq(
      st_membership_new(&cfg, &a.id, &addr, a.public_key, 1, &rng, &m), 0);
  st_membership_signer_t sg = {sign_real, NULL, &a};
  st_membership_set_signer(m, &sg);
  st_msg_t msg;
  memset(&msg, 0, sizeof msg);
  msg.type = ST_MSG_ALIVE;
  msg.u.alive.node = b.id;
  msg.u.alive.incarnation = INC1;
  msg.u.alive.addr = addr;
  msg.u.alive.addr.port = 7947;
  memcpy(msg.u.alive.public_key, b.public_key, ST_PUBLIC_KEY_BYTES);
  uint8_t claim[ST_MEMBERSHIP_CLAIM_MAX_BYTES];
  size_t n = st_membership_alive_claim(&msg.u.alive, claim);
  ck_assert_uint_eq(n, 17 + 16 + 8 + 1 + 4 + 2);
  st_identity_sign(&c, claim, n, msg.u.alive.signature); /* c forges */
  uint8_t buf[512];
  size_t len;
  ck_assert_int_eq(st_wire_encode(&msg, buf, sizeof buf, &len), 0);
  ck_assert_int_eq(st_membership_packet(m, 1000, &c.id, &addr, buf, len), 0);
  ck_assert_ptr_null(st_membership_find(m, &b.id));
  st_identity_sign(&b, claim, n, msg.u.alive.signature);
  ck_assert_int_eq(st_wire_encode(&msg, buf, sizeof buf, &len), 0);
  ck_assert_int_eq(st_membership_packet(m, 1001, &c.id, &addr, buf, len), 0);
  ck_assert_ptr_nonnull(st_membership_find(m, &b.id));
  st_membership_claim_stats_t cs;
  st_membership_claim_stats(m, &cs);
  ck_assert_uint_eq(cs.bad_signature, 1);
  st_membership_free(m);
  st_identity_wipe(&a);
  st_identity_wipe(&b);
  st_identity_wipe(&c);
}
END_TEST

static Suite* suite(void) {
  Suite* s = suite_create("gossip_membership");
  TCase* tf = tcase_create("failure_detection");
  tcase_add_loop_test(tf, test_alive_suspect_dead, 0, 2);
  tcase_add_loop_test(tf, test_confirmations, 0,
                      (int) (sizeof confirm_cases / sizeof confirm_cases[0]));
  tcase_add_loop_test(tf, test_awareness, 0, 2);
  tcase_add_loop_test(tf, test_nack_served, 0,
                      (int) (sizeof relay_cases / sizeof relay_cases[0]));
  tcase_add_loop_test(tf, test_nack_counted, 0, 2);
  tcase_add_loop_test(tf, test_stall, 0, 2);
  suite_add_tcase(s, tf);
  TCase* tr = tcase_create("rules");
  tcase_add_loop_test(tr, test_rules, 0, NRULES);
  tcase_add_loop_test(tr, test_refute, 0,
                      (int) (sizeof refute_cases / sizeof refute_cases[0]));
  tcase_add_test(tr, test_leave_self);
  tcase_add_loop_test(tr, test_buddy, 0, 2);
  tcase_add_test(tr, test_admit);
  tcase_add_test(tr, test_push_pull_merge);
  tcase_add_test(tr, test_join_push_pull_schedule);
  tcase_add_loop_test(tr, test_status, 0,
                      (int) (sizeof status_cases / sizeof status_cases[0]));
  tcase_add_test(tr, test_set_status);
  tcase_add_test(tr, test_reclaim);
  tcase_add_test(tr, test_retire_at_shrunk_limit);
  tcase_add_test(tr, test_member_state_names);
  tcase_add_test(tr, test_reconnect);
  tcase_add_test(tr, test_force_leave);
  tcase_add_test(tr, test_defaults);
  tcase_add_test(tr, test_probe_hint);
  suite_add_tcase(s, tr);
  TCase* tb = tcase_create("subject_binding");
  tcase_add_test(tb, test_claims_counted);
  tcase_add_test(tb, test_status_signed);
  tcase_add_test(tb, test_refute_saturates);
  tcase_add_test(tb, test_ack_wrong_sender);
  tcase_add_test(tb, test_relay_ack_wrong_sender);
  tcase_add_test(tb, test_push_pull_forged_entry);
  tcase_add_test(tb, test_ed25519_claims);
  suite_add_tcase(s, tb);
  TCase* td = tcase_create("dissemination");
  tcase_add_loop_test(
      td, test_retransmit_limit, 0,
      (int) (sizeof retransmit_cases / sizeof retransmit_cases[0]));
  tcase_add_test(td, test_packet_size);
  tcase_add_loop_test(td, test_bad_packets, 0, NBAD);
  tcase_set_timeout(td, 60);
  suite_add_tcase(s, td);
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
