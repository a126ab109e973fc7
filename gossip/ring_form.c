/* ring_form.c: the formation machine of the opportunistic ring all-reduce
 * (gossip.h, "Ring formation"; DESIGN.md, Averaging): which free, healthy
 * members take part in a round and in what order, agreed over UDP before
 * the data plane (gossip/ring.c) starts. It is a two-phase proposal with a
 * fixed tie-break, like the join phase of a view change: the proposer
 * collects votes for a fixed list, then confirms the list of those who
 * voted yes; nobody blocks on a dead member for longer than a timeout.
 *
 * Words: a *proposal* is (round id, proposer, list); the *list* is the
 * proposer first, then its candidates sorted by id: the ring order. The
 * *final list* is the proposer and the candidates that accepted, in the
 * list's order, sent in RING_CONFIRM: every member starts with that list.
 *
 * States: IDLE -> PROPOSING (st_ring_form_propose) -> RUNNING (confirmed)
 * or IDLE (cancelled); IDLE -> ACCEPTED (a proposal accepted) -> RUNNING
 * (CONFIRM) or IDLE (CANCEL, the proposer gone, timeout); RUNNING -> IDLE
 * (st_ring_form_round_over).
 *
 * Decisions the header leaves to this file:
 *
 * - Round ids are 64 random bits from the injected generator, never 0 (0
 *   means "none" in st_ring_form_round). Every lookup keys on the pair
 *   (round id, sender), so equal round ids from different proposers are
 *   two proposals, ordered by proposer id like any other pair.
 * - Proposing: self and duplicates among the candidates are dropped (the
 *   driver builds them from a view); none left is -EINVAL. More than
 *   ST_RING_FORM_MAX_MEMBERS - 1: a uniform random subset of that many
 *   (reservoir sampling), so that in a large cluster every member gets
 *   its turn instead of always the smallest ids. The answers are final once
 *   every candidate has answered (or gone), else at accept_wait_ms.
 * - Who wins: an IDLE member accepts. A member that has ACCEPTED P1 and
 *   gets P2: from a smaller proposer id it switches (accept=false to P1,
 *   then accept=true to P2); from P1's own proposer with another round it
 *   takes the new one (a proposer holds one proposal at a time, so the
 *   old one is over: no refusal is sent for it); the same proposal again
 *   (re-sent) is answered accept=true again; a larger proposer id is
 *   refused. A PROPOSING node gives way to a smaller proposer id:
 *   RING_CANCEL for its own round to the candidates that may hold it
 *   (accepted or not yet answered; refused and gone ones hold nothing),
 *   then it accepts. RUNNING refuses every proposal (a re-sent PROPOSE
 *   of the running round gets no answer). The smallest proposer id a
 *   member sees therefore always wins, whatever the order of arrival.
 * - The proposer's answers: accept=false from a candidate that had
 *   accepted (it switched to a smaller proposer) takes it out again, if
 *   it arrives before the answers are final. After they are final, a
 *   late accept=true from a candidate outside the final list is answered
 *   with RING_CANCEL (it would otherwise wait confirm_wait_ms), and a
 *   late refusal from one inside it changes nothing: that member will
 *   not start, and the data plane fails the round (the driver aborts
 *   it). Both are counted stale.
 * - Loss (UDP drops a few percent under load): the two waits are
 *   covered by retransmission. A proposer re-sends its PROPOSE once, at
 *   half its wait (accept_wait_ms / 2), to the candidates still silent,
 *   so that a lost PROPOSE or ACCEPT gets a second chance before the
 *   answers are final (a candidate answers a repeated proposal again).
 *   A member that accepted re-sends ACCEPT(yes) every accept_wait_ms / 2
 *   (the config is the cluster's) until CONFIRM or CANCEL comes; its
 *   proposer answers a repeated yes from a final member with CONFIRM
 *   again while the round runs (a lost CONFIRM would otherwise leave
 *   that member out and fail the round for all: with 16 members and 5%
 *   loss, half the rounds), with CANCEL once it is over or when the
 *   member is not in it, and ignores it while collecting.
 *   (Starting the member's re-sends only once the proposer's answers are
 *   final, at accept_wait_ms, cut them by three quarters in the
 *   simulator but cost 4% of the rounds: a lost CONFIRM then holds the
 *   ring 250 ms longer. The re-sends are 13-byte packets.)
 *   A member that gets its CONFIRM late starts late; the driver holds a
 *   data-plane lane of a round it has accepted but not yet seen confirmed
 *   (st_ring_form_lane: WAIT) rather than refuse it, for confirm_wait_ms
 *   at most: every other lane is refused at once (REFUSE), so that its
 *   sender aborts at once instead of at a connection deadline.
 * - Finalizing: >= 2 members (itself included): RING_CONFIRM to each
 *   accepted candidate, RING_CANCEL to those that never answered (their
 *   accept may be in flight; the CANCEL frees them at once), START for
 *   itself at rank 0. Else RING_CANCEL to the unanswered ones, and idle.
 * - Checks of a received list (PROPOSE, CONFIRM): 2 .. 64 ids, the
 *   proposer first (and, in a PROPOSE, equal to the authenticated sender:
 *   no proposing on another's behalf), no duplicate, the receiver in it;
 *   a CONFIRM's list must also keep the accepted proposal's order (a
 *   subsequence of it). A message that fails is counted invalid and
 *   changes nothing (no answer; timeouts end what it would have).
 * - Stale (counted, ignored): ACCEPT for a round we did not propose or
 *   from someone we did not ask; CONFIRM or CANCEL not from the proposer
 *   of the round we hold accepted, or for another round; anything for a
 *   round that is over. A message from our own id is invalid.
 * - member_gone: a proposer marks the candidate gone (no CONFIRM or
 *   CANCEL is sent to it; it counts as answered, not accepted); an
 *   accepted member whose proposer is gone returns to idle (cancelled).
 *   While RUNNING nothing changes: the driver aborts the data plane and
 *   then calls st_ring_form_round_over.
 * - Timers: a deadline and a resend time; every change of either emits a
 *   TIMER for the earlier. Ticks before it, or in other states, do
 *   nothing.
 * - Actions are a queue that each event empties first (the driver drains
 *   after every event); SEND data is encoded when drained, into one
 *   buffer, valid until the next call. The lists SENDs and START refer to
 *   are the machine's own and do not change within one event.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/gossip.h"

/* Defaults: see st_ring_form_config_t in gossip.h for the reasoning. */
#define DEFAULT_ACCEPT_WAIT_MS 500u
#define DEFAULT_CONFIRM_WAIT_MS 2000u

#define MAXM ST_RING_FORM_MAX_MEMBERS
/* One event queues at most a SEND to every other member of two lists (a
 * proposer giving way cancels its own and answers the winner; finalizing
 * confirms some and cancels the others), START and TIMER. */
#define QUEUE_CAP (2 * MAXM + 4)

/* The largest message: RING_PROPOSE with 64 ids is fixarray 1, type 1,
 * version 1, round 9, proposer 18, array16 header 3, 64 x 18 bytes. */
#define PROPOSE_MAX_BYTES (33u + 18u * MAXM)
_Static_assert(PROPOSE_MAX_BYTES <= ST_PACKET_MAX_PLAINTEXT,
               "a full proposal fits one sealed UDP packet");

/* A candidate of our own proposal, as its answers came. */
typedef enum {
  C_PENDING = 0, /* no answer yet */
  C_ACCEPTED,
  C_REFUSED,
  C_GONE,  /* membership says dead or left */
  C_FINAL, /* in the final list (CONFIRM sent) */
  C_CLOSED /* CANCEL sent: given way, or never answered in time */
} cand_t;

typedef enum { Q_SEND, Q_START, Q_TIMER } q_kind_t;

typedef struct {
  uint8_t kind; /* q_kind_t */
  uint8_t type; /* SEND: st_msg_type_t */
  bool accept;  /* SEND of RING_ACCEPT */
  uint64_t round;
  st_node_id_t to;
} q_item_t;

struct st_ring_form_s {
  st_ring_form_config_t cfg;
  st_node_id_t self;
  st_rng_t* rng;
  st_ring_form_state_t state;
  uint64_t deadline_ms; /* PROPOSING, ACCEPTED: answers final, or give up */
  uint64_t resend_at;   /* PROPOSING, ACCEPTED: the next retransmission */
  st_ring_form_counters_t c;

  /* Our latest proposal, kept after it ended to answer late accepts. */
  uint64_t my_round; /* 0: none yet */
  uint32_t my_n;     /* list length, self at 0 */
  uint32_t my_pending;
  st_node_id_t my_list[MAXM];
  uint8_t my_cand[MAXM];                    /* cand_t; [0] (self) unused */
  uint8_t my_tags[MAXM][ST_RING_TAG_BYTES]; /* each ACCEPT's tag */
  uint8_t tag[ST_RING_TAG_BYTES];           /* ours (st_ring_form_set_tag) */

  /* The proposal accepted (ACCEPTED). */
  uint64_t acc_round;
  st_node_id_t acc_proposer;
  uint32_t acc_n;
  st_node_id_t acc_list[MAXM];

  /* The running round (RUNNING): the final list. */
  uint64_t run_round;
  uint32_t run_n, run_rank;
  st_node_id_t run_list[MAXM];
  uint8_t run_tag[ST_RING_TAG_BYTES];

  q_item_t queue[QUEUE_CAP];
  unsigned q_head, q_len;
  uint8_t enc[ST_PACKET_MAX_PLAINTEXT];
};

/* ==== Names and configuration ===============================================
 */

static const char* const state_names[] = {
    [ST_RING_FORM_IDLE] = "idle",
    [ST_RING_FORM_PROPOSING] = "proposing",
    [ST_RING_FORM_ACCEPTED] = "accepted",
    [ST_RING_FORM_RUNNING] = "running",
};

const char* st_ring_form_state_name(st_ring_form_state_t s) {
  if ((unsigned) s > ST_RING_FORM_RUNNING)
    return "unknown";
  return state_names[s];
}

void st_ring_form_config_default(st_ring_form_config_t* cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->accept_wait_ms = DEFAULT_ACCEPT_WAIT_MS;
  cfg->confirm_wait_ms = DEFAULT_CONFIRM_WAIT_MS;
}

/* ==== The machine's pieces ==================================================
 */

static bool id_eq(const st_node_id_t* a, const st_node_id_t* b) {
  return memcmp(a->b, b->b, sizeof a->b) == 0;
}

static int id_cmp_qsort(const void* a, const void* b) {
  return st_node_id_compare(a, b);
}

static void push(st_ring_form_t* f, const q_item_t* it) {
  /* QUEUE_CAP bounds one event's actions; the cap is a programmer's bound. */
  if (f->q_len < QUEUE_CAP)
    f->queue[(f->q_head + f->q_len++) % QUEUE_CAP] = *it;
}

static void push_send(st_ring_form_t* f, const st_node_id_t* to,
                      st_msg_type_t type, uint64_t round, bool accept) {
  q_item_t it = {Q_SEND, (uint8_t) type, accept, round, *to};
  push(f, &it);
}

static uint64_t after(uint64_t now_ms, uint32_t ms) {
  return now_ms + ms < now_ms ? UINT64_MAX : now_ms + ms;
}

/* The retransmission interval: half the proposer's wait, so that a lost
 * PROPOSE or ACCEPT gets a second chance before the answers are final. */
static uint32_t resend_ms(const st_ring_form_t* f) {
  return f->cfg.accept_wait_ms / 2 > 0 ? f->cfg.accept_wait_ms / 2 : 1;
}

/* Emits the TIMER for the earlier of the deadline and the resend. */
static void timer(st_ring_form_t* f) {
  q_item_t it = {.kind = Q_TIMER};
  push(f, &it);
}

static void arm(st_ring_form_t* f, uint64_t now_ms, uint32_t wait_ms) {
  f->deadline_ms = after(now_ms, wait_ms);
  f->resend_at = after(now_ms, resend_ms(f));
  timer(f);
}

/* Each event starts with an empty queue (gossip.h: drain after every
 * event). */
static void begin(st_ring_form_t* f) {
  f->q_head = 0;
  f->q_len = 0;
}

/* Index of id in list[0..n), or -1. */
static int find(const st_node_id_t* list, uint32_t n, const st_node_id_t* id) {
  for (uint32_t i = 0; i < n; i++)
    if (id_eq(&list[i], id))
      return (int) i;
  return -1;
}

/* A received list: 2 .. MAXM ids, first == proposer, no duplicates, self
 * in it (its index in *rank). */
static bool list_ok(const st_ring_form_t* f, const st_node_id_t* list,
                    uint32_t n, const st_node_id_t* proposer, uint32_t* rank) {
  if (n < 2 || n > MAXM || !id_eq(&list[0], proposer))
    return false;
  int me = -1;
  for (uint32_t i = 0; i < n; i++) {
    for (uint32_t j = i + 1; j < n; j++)
      if (id_eq(&list[i], &list[j]))
        return false;
    if (id_eq(&list[i], &f->self))
      me = (int) i;
  }
  if (me < 0)
    return false;
  *rank = (uint32_t) me;
  return true;
}

/* Whether sub[0..k) is sup[0..n) with some ids left out, order kept. */
static bool subsequence(const st_node_id_t* sub, uint32_t k,
                        const st_node_id_t* sup, uint32_t n) {
  uint32_t j = 0;
  for (uint32_t i = 0; i < k; i++) {
    while (j < n && !id_eq(&sup[j], &sub[i]))
      j++;
    if (j == n)
      return false;
    j++;
  }
  return true;
}

static void go_idle(st_ring_form_t* f) {
  f->state = ST_RING_FORM_IDLE;
  f->acc_round = 0;
  f->run_round = 0;
}

/* ==== Proposer ==============================================================
 */

/* Our answers are final: confirm the members that accepted, or cancel. */
static void finalize(st_ring_form_t* f) {
  f->run_n = 0;
  f->run_list[f->run_n++] = f->self;
  memcpy(f->run_tag, f->tag, ST_RING_TAG_BYTES);
  for (uint32_t i = 1; i < f->my_n; i++) {
    if (f->my_cand[i] != C_ACCEPTED)
      continue;
    f->run_list[f->run_n++] = f->my_list[i];
    if (memcmp(f->my_tags[i], f->tag, ST_RING_TAG_BYTES) != 0)
      memset(f->run_tag, 0, ST_RING_TAG_BYTES); /* not all hold ours */
  }
  bool go = f->run_n >= 2;
  for (uint32_t i = 1; i < f->my_n; i++) {
    if (f->my_cand[i] == C_ACCEPTED && go) {
      f->my_cand[i] = C_FINAL;
      push_send(f, &f->my_list[i], ST_MSG_RING_CONFIRM, f->my_round, false);
    } else if (f->my_cand[i] == C_PENDING || f->my_cand[i] == C_ACCEPTED) {
      f->my_cand[i] = C_CLOSED;
      push_send(f, &f->my_list[i], ST_MSG_RING_CANCEL, f->my_round, false);
    }
  }
  f->my_pending = 0;
  if (!go) {
    f->c.cancelled++;
    go_idle(f);
    return;
  }
  f->c.confirmed++;
  f->c.started++;
  f->state = ST_RING_FORM_RUNNING;
  f->run_round = f->my_round;
  f->run_rank = 0;
  q_item_t it = {.kind = Q_START};
  push(f, &it);
}

/* A smaller proposer came while we collect: withdraw our proposal from
 * every candidate that may hold it. */
static void give_way(st_ring_form_t* f) {
  for (uint32_t i = 1; i < f->my_n; i++) {
    if (f->my_cand[i] == C_PENDING || f->my_cand[i] == C_ACCEPTED) {
      f->my_cand[i] = C_CLOSED;
      push_send(f, &f->my_list[i], ST_MSG_RING_CANCEL, f->my_round, false);
    }
  }
  f->my_pending = 0;
  f->c.cancelled++;
  go_idle(f);
}

/* Keeps the candidate of candidates[i] in the reservoir my_list[1..]. */
static void sample(st_ring_form_t* f, const st_node_id_t* cand, size_t seen) {
  if (seen < MAXM - 1) {
    f->my_list[1 + seen] = *cand;
    return;
  }
  uint64_t j = st_rng_below(f->rng, (uint64_t) seen + 1);
  if (j < MAXM - 1)
    f->my_list[1 + j] = *cand;
}

int st_ring_form_propose(st_ring_form_t* f, uint64_t now_ms,
                         const st_node_id_t* candidates, size_t n) {
  if (f == NULL || (candidates == NULL && n > 0))
    return -EINVAL;
  begin(f);
  if (f->state != ST_RING_FORM_IDLE)
    return -EBUSY;
  size_t seen = 0;
  for (size_t i = 0; i < n; i++) {
    if (id_eq(&candidates[i], &f->self))
      continue;
    sample(f, &candidates[i], seen++);
  }
  uint32_t k = seen < MAXM - 1 ? (uint32_t) seen : MAXM - 1;
  qsort(f->my_list + 1, k, sizeof f->my_list[0], id_cmp_qsort);
  uint32_t m = 0; /* distinct ids kept, after sorting */
  for (uint32_t i = 0; i < k; i++)
    if (m == 0 || !id_eq(&f->my_list[m], &f->my_list[1 + i]))
      f->my_list[1 + m++] = f->my_list[1 + i];
  if (m == 0)
    return -EINVAL;
  uint64_t round;
  do
    round = st_rng_next(f->rng);
  while (round == 0);
  f->my_round = round;
  f->my_list[0] = f->self;
  f->my_n = 1 + m;
  f->my_pending = m;
  memset(f->my_cand, C_PENDING, sizeof f->my_cand);
  memset(f->my_tags, 0, sizeof f->my_tags);
  f->state = ST_RING_FORM_PROPOSING;
  f->c.proposed++;
  for (uint32_t i = 1; i < f->my_n; i++)
    push_send(f, &f->my_list[i], ST_MSG_RING_PROPOSE, round, false);
  arm(f, now_ms, f->cfg.accept_wait_ms);
  return 0;
}

static void on_accept(st_ring_form_t* f, const st_node_id_t* from,
                      const st_msg_ring_accept_t* m) {
  int i = f->my_round != 0 && m->round_id == f->my_round
              ? find(f->my_list, f->my_n, from)
              : -1;
  if (i < 1) {
    f->c.stale++; /* not our proposal, or not someone we asked */
    return;
  }
  uint8_t* cand = &f->my_cand[i];
  bool collecting = f->state == ST_RING_FORM_PROPOSING;
  if (collecting && m->accept)
    memcpy(f->my_tags[i], m->tag, ST_RING_TAG_BYTES); /* the latest */
  if (collecting && *cand == C_PENDING) {
    *cand = m->accept ? C_ACCEPTED : C_REFUSED;
    f->my_pending--;
    if (f->my_pending == 0)
      finalize(f);
    return;
  }
  if (collecting && *cand == C_ACCEPTED) {
    if (!m->accept)
      *cand = C_REFUSED; /* it switched to a smaller proposer */
    return;              /* else a retransmission: nothing new */
  }
  if (m->accept && *cand == C_FINAL) {
    /* It waits for a CONFIRM that was lost: again while the round runs,
     * else the round is over for it. */
    bool runs = f->state == ST_RING_FORM_RUNNING && f->run_round == f->my_round;
    push_send(f, from, runs ? ST_MSG_RING_CONFIRM : ST_MSG_RING_CANCEL,
              f->my_round, false);
    f->c.resent += runs;
    return;
  }
  /* Late: after the answers were final, or a no from a final member. A
   * late yes outside the final list is released at once. */
  f->c.stale++;
  if (m->accept && *cand != C_GONE)
    push_send(f, from, ST_MSG_RING_CANCEL, f->my_round, false);
}

/* ==== Member ================================================================
 */

static void accept_proposal(st_ring_form_t* f, uint64_t now_ms,
                            const st_msg_ring_propose_t* m) {
  f->state = ST_RING_FORM_ACCEPTED;
  f->acc_round = m->round_id;
  f->acc_proposer = m->proposer;
  f->acc_n = m->n_members;
  memcpy(f->acc_list, m->members, m->n_members * sizeof m->members[0]);
  push_send(f, &m->proposer, ST_MSG_RING_ACCEPT, m->round_id, true);
  arm(f, now_ms, f->cfg.confirm_wait_ms);
}

static void refuse(st_ring_form_t* f, const st_msg_ring_propose_t* m) {
  f->c.refused++;
  push_send(f, &m->proposer, ST_MSG_RING_ACCEPT, m->round_id, false);
}

/* Whether every member of the list but us is one this node averages with
 * (cfg.trusts). */
static bool trusts_all(const st_ring_form_t* f,
                       const st_msg_ring_propose_t* m) {
  if (f->cfg.trusts == NULL)
    return true;
  for (uint32_t i = 0; i < m->n_members; i++)
    if (!id_eq(&m->members[i], &f->self) &&
        !f->cfg.trusts(&m->members[i], f->cfg.trusts_ctx))
      return false;
  return true;
}

static void refuse_distrusted(st_ring_form_t* f,
                              const st_msg_ring_propose_t* m) {
  f->c.distrusted++;
  refuse(f, m);
}

static void on_propose(st_ring_form_t* f, uint64_t now_ms,
                       const st_node_id_t* from,
                       const st_msg_ring_propose_t* m) {
  uint32_t rank;
  if (!id_eq(&m->proposer, from) ||
      !list_ok(f, m->members, m->n_members, from, &rank)) {
    f->c.invalid++;
    return;
  }
  bool trusted = trusts_all(f, m);
  switch (f->state) {
    case ST_RING_FORM_IDLE:
      if (trusted)
        accept_proposal(f, now_ms, m);
      else
        refuse_distrusted(f, m);
      break;
    case ST_RING_FORM_ACCEPTED:
      if (id_eq(from, &f->acc_proposer)) {
        if (m->round_id == f->acc_round) {
          /* The same proposal again (re-sent): the same answer. */
          push_send(f, from, ST_MSG_RING_ACCEPT, m->round_id, true);
        } else if (trusted) {
          f->c.cancelled++; /* its proposer moved on to a new round */
          accept_proposal(f, now_ms, m);
        } else {
          refuse_distrusted(f, m);
        }
      } else if (st_node_id_compare(from, &f->acc_proposer) < 0 && trusted) {
        f->c.cancelled++;
        push_send(f, &f->acc_proposer, ST_MSG_RING_ACCEPT, f->acc_round, false);
        accept_proposal(f, now_ms, m);
      } else if (!trusted) {
        refuse_distrusted(f, m);
      } else {
        refuse(f, m);
      }
      break;
    case ST_RING_FORM_PROPOSING:
      if (!trusted) {
        refuse_distrusted(f, m);
      } else if (st_node_id_compare(from, &f->self) < 0) {
        give_way(f);
        accept_proposal(f, now_ms, m);
      } else {
        refuse(f, m);
      }
      break;
    case ST_RING_FORM_RUNNING:
      /* A re-sent PROPOSE of the running round needs no answer. */
      if (m->round_id != f->run_round || !id_eq(from, &f->run_list[0]))
        refuse(f, m);
      break;
  }
}

static bool holds_accepted(const st_ring_form_t* f, const st_node_id_t* from,
                           uint64_t round) {
  return f->state == ST_RING_FORM_ACCEPTED && round == f->acc_round &&
         id_eq(from, &f->acc_proposer);
}

static void on_confirm(st_ring_form_t* f, const st_node_id_t* from,
                       const st_msg_ring_confirm_t* m) {
  if (!holds_accepted(f, from, m->round_id)) {
    f->c.stale++;
    return;
  }
  uint32_t rank;
  if (!list_ok(f, m->members, m->n_members, &f->acc_proposer, &rank) ||
      !subsequence(m->members, m->n_members, f->acc_list, f->acc_n)) {
    f->c.invalid++;
    return;
  }
  f->state = ST_RING_FORM_RUNNING;
  f->run_round = m->round_id;
  f->run_n = m->n_members;
  f->run_rank = rank;
  memcpy(f->run_list, m->members, m->n_members * sizeof m->members[0]);
  memcpy(f->run_tag, m->tag, ST_RING_TAG_BYTES);
  f->acc_round = 0;
  f->c.started++;
  q_item_t it = {.kind = Q_START};
  push(f, &it);
}

static void on_cancel(st_ring_form_t* f, const st_node_id_t* from,
                      const st_msg_ring_cancel_t* m) {
  if (!holds_accepted(f, from, m->round_id)) {
    f->c.stale++;
    return;
  }
  f->c.cancelled++;
  go_idle(f);
}

int st_ring_form_message(st_ring_form_t* f, uint64_t now_ms,
                         const st_node_id_t* from, const uint8_t* data,
                         size_t len) {
  if (f == NULL || from == NULL || (data == NULL && len > 0))
    return -EINVAL;
  begin(f);
  st_msg_t m;
  if (st_wire_decode(data, len, &m, NULL) != 0) {
    f->c.invalid++;
    return -EBADMSG;
  }
  int rc = 0;
  if (id_eq(from, &f->self)) {
    f->c.invalid++; /* our own id from elsewhere: a replay or an impostor */
    rc = -EBADMSG;
  } else if (m.type == ST_MSG_RING_PROPOSE) {
    on_propose(f, now_ms, from, &m.u.ring_propose);
  } else if (m.type == ST_MSG_RING_ACCEPT) {
    on_accept(f, from, &m.u.ring_accept);
  } else if (m.type == ST_MSG_RING_CONFIRM) {
    on_confirm(f, from, &m.u.ring_confirm);
  } else if (m.type == ST_MSG_RING_CANCEL) {
    on_cancel(f, from, &m.u.ring_cancel);
  } else {
    f->c.invalid++; /* well formed, but not ours */
    rc = -EBADMSG;
  }
  st_wire_msg_free(&m);
  return rc;
}

/* ==== The other events ======================================================
 */

int st_ring_form_new(const st_ring_form_config_t* cfg, const st_node_id_t* self,
                     st_rng_t* rng, st_ring_form_t** out) {
  if (out != NULL)
    *out = NULL;
  if (cfg == NULL || self == NULL || rng == NULL || out == NULL ||
      cfg->accept_wait_ms == 0 || cfg->confirm_wait_ms == 0)
    return -EINVAL;
  st_ring_form_t* f = calloc(1, sizeof *f);
  if (f == NULL)
    return -ENOMEM;
  f->cfg = *cfg;
  f->self = *self;
  f->rng = rng;
  f->state = ST_RING_FORM_IDLE;
  *out = f;
  return 0;
}

void st_ring_form_free(st_ring_form_t* f) {
  free(f);
}

void st_ring_form_set_tag(st_ring_form_t* f, const uint8_t* tag) {
  if (f == NULL)
    return;
  if (tag != NULL)
    memcpy(f->tag, tag, ST_RING_TAG_BYTES);
  else
    memset(f->tag, 0, ST_RING_TAG_BYTES);
}

int st_ring_form_tick(st_ring_form_t* f, uint64_t now_ms) {
  if (f == NULL)
    return -EINVAL;
  begin(f);
  if (f->state == ST_RING_FORM_PROPOSING) {
    if (now_ms >= f->deadline_ms) {
      finalize(f);
    } else if (now_ms >= f->resend_at) {
      /* Once: the candidates still silent get the proposal again. */
      for (uint32_t i = 1; i < f->my_n; i++) {
        if (f->my_cand[i] == C_PENDING) {
          push_send(f, &f->my_list[i], ST_MSG_RING_PROPOSE, f->my_round, false);
          f->c.resent++;
        }
      }
      f->resend_at = UINT64_MAX;
      timer(f);
    }
  } else if (f->state == ST_RING_FORM_ACCEPTED) {
    if (now_ms >= f->deadline_ms) {
      f->c.timeouts++;
      go_idle(f);
    } else if (now_ms >= f->resend_at) {
      /* Until CONFIRM or CANCEL: our ACCEPT, or their answer, was lost. */
      push_send(f, &f->acc_proposer, ST_MSG_RING_ACCEPT, f->acc_round, true);
      f->c.resent++;
      f->resend_at = after(now_ms, resend_ms(f));
      timer(f);
    }
  }
  return 0;
}

int st_ring_form_round_over(st_ring_form_t* f, uint64_t now_ms,
                            uint64_t round_id, bool ok) {
  if (f == NULL)
    return -EINVAL;
  begin(f);
  if (f->state != ST_RING_FORM_RUNNING || round_id != f->run_round)
    return -EINVAL;
  if (ok)
    f->c.finished_ok++;
  else
    f->c.finished_failed++;
  go_idle(f);
  return 0;
}

int st_ring_form_member_gone(st_ring_form_t* f, uint64_t now_ms,
                             const st_node_id_t* id) {
  if (f == NULL || id == NULL)
    return -EINVAL;
  begin(f);
  if (id_eq(id, &f->self))
    return -EINVAL;
  /* Our proposal, collecting or over: no CONFIRM or CANCEL goes to it. */
  int i = f->my_round != 0 ? find(f->my_list, f->my_n, id) : -1;
  if (i >= 1 && f->my_cand[i] != C_FINAL) { /* FINAL: the driver aborts */
    bool collecting = f->state == ST_RING_FORM_PROPOSING;
    if (collecting && f->my_cand[i] == C_PENDING)
      f->my_pending--;
    f->my_cand[i] = C_GONE;
    if (collecting && f->my_pending == 0)
      finalize(f);
  }
  if (f->state == ST_RING_FORM_ACCEPTED && id_eq(id, &f->acc_proposer)) {
    f->c.cancelled++;
    go_idle(f);
  }
  return 0;
}

/* ==== Actions and queries ===================================================
 */

/* Encodes the SEND it into f->enc; false if it does not encode (never, by
 * construction: lists are within MAXM and fit the buffer). */
static bool encode_send(st_ring_form_t* f, const q_item_t* it,
                        st_rfact_t* out) {
  st_msg_t m;
  memset(&m, 0, sizeof m);
  m.type = (st_msg_type_t) it->type;
  switch (m.type) {
    case ST_MSG_RING_PROPOSE:
      m.u.ring_propose.round_id = it->round;
      m.u.ring_propose.proposer = f->self;
      m.u.ring_propose.n_members = f->my_n;
      m.u.ring_propose.members = f->my_list;
      break;
    case ST_MSG_RING_ACCEPT:
      m.u.ring_accept.round_id = it->round;
      m.u.ring_accept.accept = it->accept;
      memcpy(m.u.ring_accept.tag, f->tag, ST_RING_TAG_BYTES);
      break;
    case ST_MSG_RING_CONFIRM:
      m.u.ring_confirm.round_id = it->round;
      m.u.ring_confirm.n_members = f->run_n;
      m.u.ring_confirm.members = f->run_list;
      memcpy(m.u.ring_confirm.tag, f->run_tag, ST_RING_TAG_BYTES);
      break;
    default:
      m.u.ring_cancel.round_id = it->round;
      break;
  }
  size_t len = 0;
  if (st_wire_encode(&m, f->enc, sizeof f->enc, &len) != 0)
    return false;
  out->kind = ST_RFACT_SEND;
  out->to = it->to;
  out->data = f->enc;
  out->len = len;
  return true;
}

bool st_ring_form_next_action(st_ring_form_t* f, st_rfact_t* out) {
  if (f == NULL || out == NULL)
    return false;
  while (f->q_len > 0) {
    q_item_t it = f->queue[f->q_head];
    f->q_head = (f->q_head + 1) % QUEUE_CAP;
    f->q_len--;
    memset(out, 0, sizeof *out);
    switch ((q_kind_t) it.kind) {
      case Q_SEND:
        if (!encode_send(f, &it, out))
          continue; /* defensive: nothing to send */
        return true;
      case Q_START:
        out->kind = ST_RFACT_START;
        out->round_id = f->run_round;
        out->members = f->run_list;
        out->n_members = f->run_n;
        out->my_rank = f->run_rank;
        out->tag = f->run_tag;
        return true;
      case Q_TIMER:
        out->kind = ST_RFACT_TIMER;
        out->at_ms =
            f->resend_at < f->deadline_ms ? f->resend_at : f->deadline_ms;
        return true;
    }
  }
  return false;
}

st_ring_form_state_t st_ring_form_state(const st_ring_form_t* f) {
  return f == NULL ? ST_RING_FORM_IDLE : f->state;
}

uint64_t st_ring_form_round(const st_ring_form_t* f) {
  if (f == NULL)
    return 0;
  switch (f->state) {
    case ST_RING_FORM_PROPOSING:
      return f->my_round;
    case ST_RING_FORM_ACCEPTED:
      return f->acc_round;
    case ST_RING_FORM_RUNNING:
      return f->run_round;
    default:
      return 0;
  }
}

st_ring_lane_verdict_t st_ring_form_lane(const st_ring_form_t* f,
                                         uint64_t round_id,
                                         const st_node_id_t* from) {
  if (f == NULL || from == NULL || round_id == 0 || id_eq(from, &f->self))
    return ST_RING_LANE_REFUSE;
  if (f->state == ST_RING_FORM_ACCEPTED && round_id == f->acc_round)
    return find(f->acc_list, f->acc_n, from) >= 0 ? ST_RING_LANE_WAIT
                                                  : ST_RING_LANE_REFUSE;
  if (f->state == ST_RING_FORM_RUNNING && round_id == f->run_round) {
    const st_node_id_t* prev =
        &f->run_list[(f->run_rank + f->run_n - 1) % f->run_n];
    return id_eq(from, prev) ? ST_RING_LANE_TAKE : ST_RING_LANE_REFUSE;
  }
  return ST_RING_LANE_REFUSE;
}

const st_ring_form_counters_t* st_ring_form_counters(const st_ring_form_t* f) {
  return f == NULL ? NULL : &f->c;
}
