/* test_gossip_ring_form.c: the Check suite for the ring formation machine
 * (gossip/ring_form.c; the contract in gossip.h, "Ring formation").
 *
 * Rules, as a table: each case feeds one machine a script of events (its
 * own proposals, messages from other ids, ticks, round ends, members gone)
 * and compares, after each event, the actions it emitted (written as a
 * short string, below), its state and, where given, its counters. Node ids
 * are single characters, ordered as characters ('1' < '2' < ...); round
 * tags name round ids: 0 is the machine's own latest proposal, k > 0 the
 * external round 0x1000 + k.
 *
 * Actions as strings, in order, space-separated:
 *   P<to>:<tag>=<list>   SEND RING_PROPOSE     A<to>:<tag>  SEND ACCEPT yes
 *   C<to>:<tag>=<list>   SEND RING_CONFIRM     a<to>:<tag>  SEND ACCEPT no
 *   X<to>:<tag>          SEND RING_CANCEL      T<at_ms>     TIMER
 *   S:<tag>=<list>/<rank>                      START
 *
 * Then "formation under churn": a small deterministic simulator runs K
 * machines (2 .. 16) on a virtual clock over a seeded network (delays of
 * 0 to 50 ms, so reordering, and 5% loss), each node's driver proposing
 * every second at its own offset when its own view says it is the smallest
 * live id. Views start stale (some nodes do not yet know the smallest, so
 * proposals race); in churn scenarios nodes die (mostly ones that have
 * accepted and not yet started), the others' drivers learn it 0.5 to 3 s
 * later (member_gone, and a running round with that member aborted), and
 * the dead restart with a fresh machine 4 to 8 s later. The data plane is
 * a stand-in: a round ends well 150 to 200 ms after its last member
 * started, and fails 3 s after a member's start when some member never
 * started or died. Checked over many seeds: no node is ever in two rounds
 * at once; every START of a round carries the same list on every member
 * that starts it, and the starter is in it at its rank (so a round's
 * starters are a subset of its list); rounds keep forming (in every run,
 * at least 50 confirmed per simulated minute without churn, from 10 s on,
 * and at least 45 a minute once the churn is over and the dead are back;
 * one proposal a second is 60); a run is reproducible from its seed. Each
 * scenario prints one summary line ("complete": rounds that every member
 * of the list started). */
#include <check.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/gossip.h"
#include "tests/unit/testutil.h"

#define MAXM ST_RING_FORM_MAX_MEMBERS
#define EXT_ROUND(k) (UINT64_C(0x1000) + (uint64_t) (k))

/* ==== Ids, rounds and actions as strings ====================================
 */

static st_node_id_t id_of(char c) {
  st_node_id_t id;
  memset(&id, 0, sizeof id);
  id.b[0] = (uint8_t) c;
  id.b[15] = 0x5a;
  return id;
}

static char char_of(const st_node_id_t* id) {
  return (char) id->b[0];
}

typedef struct {
  st_ring_form_t* f;
  st_rng_t rng;
  char self;
  uint64_t own_round;   /* the latest own proposal's round */
  const char* distrust; /* members this node does not trust (cfg.trusts) */
  char acts[4096];
} h_t;

static bool h_trusts(const st_node_id_t* id, void* ctx) {
  const h_t* h = ctx;
  return h->distrust == NULL || strchr(h->distrust, (char) id->b[0]) == NULL;
}

static void h_init(h_t* h, char self, const char* distrust) {
  memset(h, 0, sizeof *h);
  st_rng_seed(&h->rng, 7);
  h->self = self;
  h->distrust = distrust;
  st_ring_form_config_t cfg;
  st_ring_form_config_default(&cfg);
  if (distrust != NULL) {
    cfg.trusts = h_trusts;
    cfg.trusts_ctx = h;
  }
  st_node_id_t id = id_of(self);
  ck_assert_int_eq(st_ring_form_new(&cfg, &id, &h->rng, &h->f), 0);
}

static uint64_t tag_round(const h_t* h, int tag) {
  return tag == 0 ? h->own_round : EXT_ROUND(tag);
}

static void tag_str(const h_t* h, uint64_t round, char* buf, size_t cap) {
  if (round != 0 && round == h->own_round)
    snprintf(buf, cap, "0");
  else if (round > EXT_ROUND(0) && round < EXT_ROUND(100))
    snprintf(buf, cap, "%d", (int) (round - EXT_ROUND(0)));
  else
    snprintf(buf, cap, "?");
}

static void list_str(const st_node_id_t* l, uint32_t n, char* buf) {
  for (uint32_t i = 0; i < n; i++)
    buf[i] = char_of(&l[i]);
  buf[n] = '\0';
}

static void append(h_t* h, const char* tok) {
  size_t n = strlen(h->acts);
  snprintf(h->acts + n, sizeof h->acts - n, "%s%s", n ? " " : "", tok);
}

/* Drains the machine's actions into h->acts, checking each SEND. */
static void drain(h_t* h) {
  h->acts[0] = '\0';
  st_rfact_t a;
  while (st_ring_form_next_action(h->f, &a)) {
    char tok[256], tag[8], list[MAXM + 1];
    switch (a.kind) {
      case ST_RFACT_SEND: {
        ck_assert_uint_le(a.len, ST_PACKET_MAX_PLAINTEXT);
        st_msg_t m;
        ck_assert_int_eq(st_wire_decode(a.data, a.len, &m, NULL), 0);
        char to = char_of(&a.to);
        switch (m.type) {
          case ST_MSG_RING_PROPOSE:
            ck_assert_int_eq(char_of(&m.u.ring_propose.proposer), h->self);
            tag_str(h, m.u.ring_propose.round_id, tag, sizeof tag);
            list_str(m.u.ring_propose.members, m.u.ring_propose.n_members,
                     list);
            snprintf(tok, sizeof tok, "P%c:%s=%s", to, tag, list);
            break;
          case ST_MSG_RING_ACCEPT:
            tag_str(h, m.u.ring_accept.round_id, tag, sizeof tag);
            snprintf(tok, sizeof tok, "%c%c:%s",
                     m.u.ring_accept.accept ? 'A' : 'a', to, tag);
            break;
          case ST_MSG_RING_CONFIRM:
            tag_str(h, m.u.ring_confirm.round_id, tag, sizeof tag);
            list_str(m.u.ring_confirm.members, m.u.ring_confirm.n_members,
                     list);
            snprintf(tok, sizeof tok, "C%c:%s=%s", to, tag, list);
            break;
          case ST_MSG_RING_CANCEL:
            tag_str(h, m.u.ring_cancel.round_id, tag, sizeof tag);
            snprintf(tok, sizeof tok, "X%c:%s", to, tag);
            break;
          default:
            ck_abort_msg("SEND of message type %d", m.type);
        }
        st_wire_msg_free(&m);
        break;
      }
      case ST_RFACT_START:
        tag_str(h, a.round_id, tag, sizeof tag);
        list_str(a.members, a.n_members, list);
        ck_assert_int_eq(char_of(&a.members[a.my_rank]), h->self);
        snprintf(tok, sizeof tok, "S:%s=%s/%u", tag, list, a.my_rank);
        break;
      case ST_RFACT_TIMER:
        snprintf(tok, sizeof tok, "T%llu", (unsigned long long) a.at_ms);
        break;
      default:
        ck_abort_msg("action kind %d", a.kind);
    }
    append(h, tok);
  }
}

/* One message as bytes: P propose, A/a accept yes/no, C confirm, X cancel,
 * Z garbage, N a PING (well formed, not ours). */
static size_t craft(char msg, char proposer, uint64_t round, const char* list,
                    uint8_t* buf, size_t cap) {
  st_node_id_t ids[MAXM + 8];
  uint32_t n = list ? (uint32_t) strlen(list) : 0;
  for (uint32_t i = 0; i < n; i++)
    ids[i] = id_of(list[i]);
  st_msg_t m;
  memset(&m, 0, sizeof m);
  switch (msg) {
    case 'P':
      m.type = ST_MSG_RING_PROPOSE;
      m.u.ring_propose.round_id = round;
      m.u.ring_propose.proposer = id_of(proposer);
      m.u.ring_propose.n_members = n;
      m.u.ring_propose.members = ids;
      break;
    case 'A':
    case 'a':
      m.type = ST_MSG_RING_ACCEPT;
      m.u.ring_accept.round_id = round;
      m.u.ring_accept.accept = msg == 'A';
      break;
    case 'C':
      m.type = ST_MSG_RING_CONFIRM;
      m.u.ring_confirm.round_id = round;
      m.u.ring_confirm.n_members = n;
      m.u.ring_confirm.members = ids;
      break;
    case 'X':
      m.type = ST_MSG_RING_CANCEL;
      m.u.ring_cancel.round_id = round;
      break;
    case 'N':
      m.type = ST_MSG_PING;
      m.u.ping.seq = 1;
      break;
    default:
      buf[0] = 0xc1; /* never used in msgpack */
      return 1;
  }
  size_t len = 0;
  ck_assert_int_eq(st_wire_encode(&m, buf, cap, &len), 0);
  return len;
}

/* ==== The rules, as a table =================================================
 */

typedef struct {
  char op;              /* p propose, m message, t tick, o round over, g gone */
  char msg;             /* m: P A a C X Z N (craft); o: F for a failed round */
  char from;            /* m: the sender; g: the member gone */
  int round;            /* m, o: round tag */
  const char* list;     /* m P, C: the members; p: the candidates */
  char proposer;        /* m P: the proposer field, when not `from` */
  uint64_t at;          /* now, ms */
  int rc;               /* the call's return */
  const char* want;     /* the actions */
  char state;           /* i p a r */
  const char* counters; /* "name=value ...", checked when given */
  const char* lanes;    /* "<from>:<tag>=<R|W|T> ...": st_ring_form_lane's
                           verdict on a lane of round tag from that node,
                           checked after the step when given */
} step_t;

typedef struct {
  const char* name;
  char self;
  step_t s[16];
} rule_t;

#define M(msg_, from_, round_, list_) \
  .op = 'm', .msg = msg_, .from = from_, .round = round_, .list = list_

static const rule_t rules[] = {
    {"lanes: wait while accepted, take only from the previous member",
     '3',
     {{.op = 'm',
       .msg = 'N',
       .from = '1',
       .want = "",
       .state = 'i',
       .rc = -EBADMSG,
       .lanes = "1:1=R 2:1=R"},
      {M('P', '1', 1, "1345"), .want = "A1:1 T250", .state = 'a',
       .lanes = "1:1=W 4:1=W 5:1=W 2:1=R 1:2=R 3:1=R"},
      {M('C', '1', 1, "135"), .at = 10, .want = "S:1=135/1", .state = 'r',
       .lanes = "1:1=T 5:1=R 4:1=R 1:2=R 3:1=R"},
      {.op = 'o',
       .round = 1,
       .at = 20,
       .want = "",
       .state = 'i',
       .lanes = "1:1=R"}}},
    {"lanes: rank 0 takes from the last member; a refused round's are refused",
     '1',
     {{.op = 'p',
       .list = "32",
       .want = "P2:0=123 P3:0=123 T250",
       .state = 'p',
       .lanes = "3:0=R 2:0=R"},
      {M('A', '2', 0, NULL), .want = "", .state = 'p'},
      {M('A', '3', 0, NULL), .want = "C2:0=123 C3:0=123 S:0=123/0",
       .state = 'r', .lanes = "3:0=T 2:0=R 3:1=R"},
      {M('P', '0', 1, "013"), .want = "a0:1", .state = 'r',
       .counters = "refused=1", .lanes = "0:1=R 3:0=T"}}},
    {"lanes: an accepted round given up is refused",
     '3',
     {{M('P', '1', 1, "13"), .want = "A1:1 T250", .state = 'a',
       .lanes = "1:1=W"},
      {.op = 't', .at = 2000, .want = "", .state = 'i', .lanes = "1:1=R"},
      {M('P', '2', 2, "23"), .at = 2100, .want = "A2:2 T2350", .state = 'a',
       .lanes = "2:2=W 1:1=R"},
      {M('X', '2', 2, NULL), .at = 2200, .want = "", .state = 'i',
       .lanes = "2:2=R"}}},
    {"idle accepts; its confirm starts it",
     '3',
     {{M('P', '1', 1, "134"), .want = "A1:1 T250", .state = 'a'},
      {M('C', '1', 1, "13"), .at = 10, .want = "S:1=13/1", .state = 'r',
       .counters = "started=1 confirmed=0"}}},
    {"a member re-sends its accept until confirmed",
     '3',
     {{M('P', '1', 1, "13"), .want = "A1:1 T250", .state = 'a'},
      {.op = 't', .at = 249, .want = "", .state = 'a'},
      {.op = 't',
       .at = 250,
       .want = "A1:1 T500",
       .state = 'a',
       .counters = "resent=1"},
      {.op = 't', .at = 500, .want = "A1:1 T750", .state = 'a'},
      {M('C', '1', 1, "13"), .at = 600, .want = "S:1=13/1", .state = 'r'},
      {.op = 't',
       .at = 5000,
       .want = "",
       .state = 'r',
       .counters = "timeouts=0"}}},
    {"a member times out without confirm",
     '3',
     {{M('P', '1', 1, "13"), .want = "A1:1 T250", .state = 'a'},
      {.op = 't', .at = 1999, .want = "A1:1 T2000", .state = 'a'},
      {.op = 't',
       .at = 2000,
       .want = "",
       .state = 'i',
       .counters = "timeouts=1 started=0"},
      {M('C', '1', 1, "13"), .at = 2001, .want = "", .state = 'i',
       .counters = "stale=1"}}},
    {"busy (accepted) refuses a larger proposer",
     '3',
     {{M('P', '1', 1, "13"), .want = "A1:1 T250", .state = 'a'},
      {M('P', '2', 2, "23"), .want = "a2:2", .state = 'a',
       .counters = "refused=1"},
      {M('X', '1', 1, NULL), .want = "", .state = 'i',
       .counters = "cancelled=1"},
      {M('P', '2', 3, "23"), .want = "A2:3 T250", .state = 'a'}}},
    {"a member switches to a smaller proposer",
     '5',
     {{M('P', '3', 1, "35"), .want = "A3:1 T250", .state = 'a'},
      {M('P', '2', 2, "25"), .want = "a3:1 A2:2 T250", .state = 'a',
       .counters = "cancelled=1 refused=0"},
      {M('C', '3', 1, "35"), .want = "", .state = 'a', .counters = "stale=1"},
      {M('P', '4', 3, "45"), .want = "a4:3", .state = 'a',
       .counters = "refused=1"},
      {M('C', '2', 2, "25"), .want = "S:2=25/1", .state = 'r'}}},
    {"equal round ids: the proposer ids decide",
     '5',
     {{M('P', '3', 1, "35"), .want = "A3:1 T250", .state = 'a'},
      {M('P', '2', 1, "25"), .want = "a3:1 A2:1 T250", .state = 'a'},
      {M('X', '3', 1, NULL), .want = "", .state = 'a', .counters = "stale=1"},
      {M('P', '4', 1, "45"), .want = "a4:1", .state = 'a'},
      {M('C', '2', 1, "25"), .want = "S:1=25/1", .state = 'r'}}},
    {"a collecting proposer gives way to a smaller one",
     '3',
     {{.op = 'p',
       .list = "54",
       .want = "P4:0=345 P5:0=345 T250",
       .state = 'p',
       .counters = "proposed=1"},
      {M('A', '4', 0, NULL), .want = "", .state = 'p'},
      {M('P', '1', 1, "13"), .want = "X4:0 X5:0 A1:1 T250", .state = 'a',
       .counters = "cancelled=1"},
      {M('A', '5', 0, NULL), .want = "X5:0", .state = 'a',
       .counters = "stale=1"},
      {M('C', '1', 1, "13"), .want = "S:1=13/1", .state = 'r'}}},
    {"a collecting proposer refuses a larger one",
     '3',
     {{.op = 'p', .list = "4", .want = "P4:0=34 T250", .state = 'p'},
      {M('P', '5', 1, "53"), .want = "a5:1", .state = 'p',
       .counters = "refused=1"},
      {M('A', '4', 0, NULL), .want = "C4:0=34 S:0=34/0", .state = 'r',
       .counters = "confirmed=1 started=1"}}},
    {"everyone answers: confirm at once; round over",
     '1',
     {{.op = 'p', .list = "32", .want = "P2:0=123 P3:0=123 T250", .state = 'p'},
      {M('A', '2', 0, NULL), .want = "", .state = 'p'},
      {M('A', '2', 0, NULL), .want = "", .state = 'p', .counters = "stale=0"},
      {M('A', '3', 0, NULL), .want = "C2:0=123 C3:0=123 S:0=123/0",
       .state = 'r'},
      {.op = 'o',
       .round = 0,
       .at = 100,
       .want = "",
       .state = 'i',
       .counters = "finished_ok=1"},
      {.op = 'p',
       .list = "2",
       .at = 200,
       .want = "P2:0=12 T450",
       .state = 'p'}}},
    {"the confirm list leaves out a member that switched in time",
     '1',
     {{.op = 'p',
       .list = "234",
       .want = "P2:0=1234 P3:0=1234 P4:0=1234 T250",
       .state = 'p'},
      {M('A', '2', 0, NULL), .want = "", .state = 'p'},
      {M('A', '3', 0, NULL), .want = "", .state = 'p'},
      {M('a', '3', 0, NULL), .want = "", .state = 'p'},
      {M('A', '4', 0, NULL), .want = "C2:0=124 C4:0=124 S:0=124/0",
       .state = 'r'},
      {M('a', '2', 0, NULL), .want = "", .state = 'r', .counters = "stale=1"}}},
    {"a proposer with fewer than 2 members cancels",
     '1',
     {{.op = 'p', .list = "23", .want = "P2:0=123 P3:0=123 T250", .state = 'p'},
      {M('a', '2', 0, NULL), .want = "", .state = 'p'},
      {M('a', '3', 0, NULL), .want = "", .state = 'i',
       .counters = "cancelled=1 confirmed=0 refused=0"}}},
    {"proposer: re-send to the silent, then confirm who accepted",
     '1',
     {{.op = 'p',
       .list = "234",
       .want = "P2:0=1234 P3:0=1234 P4:0=1234 T250",
       .state = 'p'},
      {M('A', '2', 0, NULL), .at = 10, .want = "", .state = 'p'},
      {.op = 't',
       .at = 250,
       .want = "P3:0=1234 P4:0=1234 T500",
       .state = 'p',
       .counters = "resent=2"},
      {.op = 't', .at = 499, .want = "", .state = 'p'},
      {.op = 't',
       .at = 500,
       .want = "C2:0=12 X3:0 X4:0 S:0=12/0",
       .state = 'r',
       .counters = "confirmed=1"},
      {M('A', '3', 0, NULL), .at = 600, .want = "X3:0", .state = 'r',
       .counters = "stale=1"},
      {M('A', '2', 0, NULL), .at = 700, .want = "C2:0=12", .state = 'r',
       .counters = "resent=3"},
      {.op = 'o', .round = 0, .at = 800, .want = "", .state = 'i'},
      {M('A', '2', 0, NULL), .at = 900, .want = "X2:0", .state = 'i',
       .counters = "resent=3"}}},
    {"proposer: nobody answers",
     '1',
     {{.op = 'p', .list = "2", .want = "P2:0=12 T250", .state = 'p'},
      {.op = 't', .at = 250, .want = "P2:0=12 T500", .state = 'p'},
      {.op = 't',
       .at = 500,
       .want = "X2:0",
       .state = 'i',
       .counters = "cancelled=1"}}},
    {"stale messages are ignored and counted",
     '3',
     {{M('C', '1', 1, "13"), .want = "", .state = 'i', .counters = "stale=1"},
      {M('X', '1', 1, NULL), .want = "", .state = 'i', .counters = "stale=2"},
      {M('A', '4', 1, NULL), .want = "", .state = 'i', .counters = "stale=3"},
      {M('P', '1', 1, "13"), .want = "A1:1 T250", .state = 'a'},
      {M('C', '2', 1, "23"), .want = "", .state = 'a', .counters = "stale=4"},
      {M('X', '1', 2, NULL), .want = "", .state = 'a', .counters = "stale=5"},
      {M('X', '2', 1, NULL), .want = "", .state = 'a', .counters = "stale=6"},
      {M('A', '1', 1, NULL), .want = "", .state = 'a', .counters = "stale=7"},
      {M('X', '1', 1, NULL), .want = "", .state = 'i',
       .counters = "stale=7 cancelled=1"}}},
    {"a member whose proposer is gone before confirm",
     '3',
     {{M('P', '1', 1, "134"), .want = "A1:1 T250", .state = 'a'},
      {.op = 'g', .from = '4', .want = "", .state = 'a'},
      {.op = 'g',
       .from = '1',
       .want = "",
       .state = 'i',
       .counters = "cancelled=1"},
      {M('C', '1', 1, "13"), .want = "", .state = 'i', .counters = "stale=1"}}},
    {"a proposer's candidate gone while collecting",
     '1',
     {{.op = 'p', .list = "23", .want = "P2:0=123 P3:0=123 T250", .state = 'p'},
      {M('A', '2', 0, NULL), .want = "", .state = 'p'},
      {.op = 'g', .from = '3', .want = "C2:0=12 S:0=12/0", .state = 'r'},
      {.op = 'g', .from = '2', .want = "", .state = 'r'},
      {.op = 'o',
       .msg = 'F',
       .round = 0,
       .want = "",
       .state = 'i',
       .counters = "finished_failed=1 finished_ok=0"}}},
    {"an accepted candidate gone: no confirm to it",
     '1',
     {{.op = 'p',
       .list = "234",
       .want = "P2:0=1234 P3:0=1234 P4:0=1234 T250",
       .state = 'p'},
      {M('A', '2', 0, NULL), .want = "", .state = 'p'},
      {M('A', '3', 0, NULL), .want = "", .state = 'p'},
      {.op = 'g', .from = '2', .want = "", .state = 'p'},
      {M('A', '4', 0, NULL), .want = "C3:0=134 C4:0=134 S:0=134/0",
       .state = 'r'}}},
    {"running refuses every proposal; round over frees it",
     '3',
     {{M('P', '2', 1, "23"), .want = "A2:1 T250", .state = 'a'},
      {M('C', '2', 1, "23"), .want = "S:1=23/1", .state = 'r'},
      {M('P', '1', 2, "13"), .want = "a1:2", .state = 'r',
       .counters = "refused=1"},
      {M('P', '2', 1, "23"), .want = "", .state = 'r', .counters = "stale=0"},
      {M('P', '2', 3, "23"), .want = "a2:3", .state = 'r',
       .counters = "refused=2"},
      {.op = 'p', .list = "4", .rc = -EBUSY, .want = "", .state = 'r'},
      {.op = 'o', .round = 2, .rc = -EINVAL, .want = "", .state = 'r'},
      {.op = 'o',
       .round = 1,
       .want = "",
       .state = 'i',
       .counters = "finished_ok=1"},
      {.op = 'o', .round = 1, .rc = -EINVAL, .want = "", .state = 'i'},
      {M('P', '1', 2, "13"), .want = "A1:2 T250", .state = 'a'}}},
    {"the same proposer with a new round: the old one is over",
     '3',
     {{M('P', '1', 1, "13"), .want = "A1:1 T250", .state = 'a'},
      {M('P', '1', 1, "13"), .want = "A1:1", .state = 'a',
       .counters = "stale=0 cancelled=0"},
      {M('P', '1', 2, "134"), .want = "A1:2 T250", .state = 'a',
       .counters = "cancelled=1"},
      {M('C', '1', 1, "13"), .want = "", .state = 'a', .counters = "stale=1"},
      {M('C', '1', 2, "13"), .want = "S:2=13/1", .state = 'r'}}},
    {"invalid proposals change nothing",
     '3',
     {{M('P', '1', 1, "1334"), .want = "", .state = 'i',
       .counters = "invalid=1"},
      {M('P', '1', 1, "14"), .want = "", .state = 'i', .counters = "invalid=2"},
      {M('P', '1', 1, "31"), .want = "", .state = 'i', .counters = "invalid=3"},
      {M('P', '1', 1, "23"), .proposer = '2', .want = "", .state = 'i',
       .counters = "invalid=4"},
      {M('P', '1', 1, "1"), .want = "", .state = 'i', .counters = "invalid=5"},
      {M('P', '1', 1, ""), .want = "", .state = 'i', .counters = "invalid=6"},
      {M('Z', '1', 1, NULL), .rc = -EBADMSG, .want = "", .state = 'i',
       .counters = "invalid=7"},
      {M('N', '1', 1, NULL), .rc = -EBADMSG, .want = "", .state = 'i',
       .counters = "invalid=8"},
      {M('P', '3', 1, "31"), .rc = -EBADMSG, .want = "", .state = 'i',
       .counters = "invalid=9 refused=0 stale=0"}}},
    {"invalid confirms change nothing",
     '3',
     {{M('P', '1', 1, "134"), .want = "A1:1 T250", .state = 'a'},
      {M('C', '1', 1, "1334"), .want = "", .state = 'a',
       .counters = "invalid=1"},
      {M('C', '1', 1, "14"), .want = "", .state = 'a', .counters = "invalid=2"},
      {M('C', '1', 1, "143"), .want = "", .state = 'a',
       .counters = "invalid=3"},
      {M('C', '1', 1, "135"), .want = "", .state = 'a',
       .counters = "invalid=4"},
      {M('C', '1', 1, "31"), .want = "", .state = 'a', .counters = "invalid=5"},
      {M('C', '1', 1, ""), .want = "", .state = 'a', .counters = "invalid=6"},
      {M('C', '1', 1, "134"), .want = "S:1=134/1", .state = 'r',
       .counters = "invalid=6 started=1"}}},
    {"propose: sorted, self and duplicates dropped, busy",
     '2',
     {{.op = 'p',
       .list = "5312352",
       .want = "P1:0=2135 P3:0=2135 P5:0=2135 T250",
       .state = 'p'},
      {.op = 'p', .list = "1", .rc = -EBUSY, .want = "", .state = 'p'},
      {M('P', '4', 1, "42"), .want = "a4:1", .state = 'p'}}},
    {"propose: nobody to propose to",
     '2',
     {{.op = 'p', .list = "2", .rc = -EINVAL, .want = "", .state = 'i'},
      {.op = 'p', .list = "", .rc = -EINVAL, .want = "", .state = 'i'},
      {.op = 'g', .from = '2', .rc = -EINVAL, .want = "", .state = 'i'},
      {.op = 'p',
       .list = "1",
       .want = "P1:0=21 T250",
       .state = 'p',
       .counters = "proposed=1"}}},
    {"late answers to a proposal given way to are released",
     '3',
     {{.op = 'p', .list = "45", .want = "P4:0=345 P5:0=345 T250", .state = 'p'},
      {M('P', '2', 1, "23"), .want = "X4:0 X5:0 A2:1 T250", .state = 'a'},
      {M('A', '4', 0, NULL), .want = "X4:0", .state = 'a'},
      {M('a', '5', 0, NULL), .want = "", .state = 'a', .counters = "stale=2"},
      {.op = 'g', .from = '4', .want = "", .state = 'a'},
      {M('A', '4', 0, NULL), .want = "", .state = 'a', .counters = "stale=3"}}},
};
#define NRULES ((int) (sizeof rules / sizeof rules[0]))

static const struct {
  const char* name;
  size_t off;
} counter_fields[] = {
    {"proposed", offsetof(st_ring_form_counters_t, proposed)},
    {"confirmed", offsetof(st_ring_form_counters_t, confirmed)},
    {"started", offsetof(st_ring_form_counters_t, started)},
    {"cancelled", offsetof(st_ring_form_counters_t, cancelled)},
    {"refused", offsetof(st_ring_form_counters_t, refused)},
    {"stale", offsetof(st_ring_form_counters_t, stale)},
    {"timeouts", offsetof(st_ring_form_counters_t, timeouts)},
    {"resent", offsetof(st_ring_form_counters_t, resent)},
    {"invalid", offsetof(st_ring_form_counters_t, invalid)},
    {"finished_ok", offsetof(st_ring_form_counters_t, finished_ok)},
    {"finished_failed", offsetof(st_ring_form_counters_t, finished_failed)},
    {"distrusted", offsetof(st_ring_form_counters_t, distrusted)},
};

static void check_counters(const st_ring_form_t* f, const char* spec,
                           const char* where) {
  const st_ring_form_counters_t* c = st_ring_form_counters(f);
  const char* p = spec;
  char name[32];
  unsigned long long want;
  int used;
  while (sscanf(p, " %31[a-z_]=%llu%n", name, &want, &used) == 2) {
    p += used;
    size_t i = 0, n = sizeof counter_fields / sizeof counter_fields[0];
    while (i < n && strcmp(counter_fields[i].name, name) != 0)
      i++;
    ck_assert_msg(i < n, "%s: no counter %s", where, name);
    uint64_t got;
    memcpy(&got, (const char*) c + counter_fields[i].off, sizeof got);
    ck_assert_msg(got == want, "%s: %s %llu, want %llu", where, name,
                  (unsigned long long) got, want);
  }
}

static void check_lanes(const h_t* h, const char* spec, const char* where) {
  static const char verdict[] = {[ST_RING_LANE_REFUSE] = 'R',
                                 [ST_RING_LANE_WAIT] = 'W',
                                 [ST_RING_LANE_TAKE] = 'T'};
  char from, want;
  int tag, used;
  for (const char* p = spec;
       sscanf(p, " %c:%d=%c%n", &from, &tag, &want, &used) == 3; p += used) {
    st_node_id_t id = id_of(from);
    st_ring_lane_verdict_t v = st_ring_form_lane(h->f, tag_round(h, tag), &id);
    ck_assert_msg(verdict[v] == want, "%s: lane %c:%d %c, want %c", where, from,
                  tag, verdict[v], want);
  }
}

static char state_char(st_ring_form_state_t s) {
  return st_ring_form_state_name(s)[0] == 'p'   ? 'p'
         : st_ring_form_state_name(s)[0] == 'a' ? 'a'
         : st_ring_form_state_name(s)[0] == 'r' ? 'r'
                                                : 'i';
}

static void run_rule(const rule_t* r, const char* distrust) {
  h_t h;
  h_init(&h, r->self, distrust);
  for (int k = 0; k < 16 && r->s[k].op != 0; k++) {
    const step_t* s = &r->s[k];
    char where[160];
    snprintf(where, sizeof where, "\"%s\", step %d", r->name, k + 1);
    int rc = 0;
    switch (s->op) {
      case 'p': {
        st_node_id_t c[MAXM];
        size_t n = strlen(s->list);
        for (size_t i = 0; i < n; i++)
          c[i] = id_of(s->list[i]);
        rc = st_ring_form_propose(h.f, s->at, c, n);
        if (rc == 0)
          h.own_round = st_ring_form_round(h.f);
        break;
      }
      case 'm': {
        uint8_t buf[2048];
        char proposer = s->proposer ? s->proposer : s->from;
        size_t len = craft(s->msg, proposer, tag_round(&h, s->round), s->list,
                           buf, sizeof buf);
        st_node_id_t from = id_of(s->from);
        rc = st_ring_form_message(h.f, s->at, &from, buf, len);
        break;
      }
      case 't':
        rc = st_ring_form_tick(h.f, s->at);
        break;
      case 'o':
        rc = st_ring_form_round_over(h.f, s->at, tag_round(&h, s->round),
                                     s->msg != 'F');
        break;
      case 'g': {
        st_node_id_t id = id_of(s->from);
        rc = st_ring_form_member_gone(h.f, s->at, &id);
        break;
      }
      default:
        ck_abort_msg("%s: op %c", where, s->op);
    }
    ck_assert_msg(rc == s->rc, "%s: rc %d, want %d", where, rc, s->rc);
    drain(&h);
    ck_assert_msg(strcmp(h.acts, s->want) == 0,
                  "%s: actions \"%s\", want \"%s\"", where, h.acts, s->want);
    char st = state_char(st_ring_form_state(h.f));
    ck_assert_msg(st == s->state, "%s: state %c, want %c", where, st, s->state);
    if (s->counters != NULL)
      check_counters(h.f, s->counters, where);
    if (s->lanes != NULL)
      check_lanes(&h, s->lanes, where);
  }
  st_ring_form_free(h.f);
}

/* One test for all the rules: a fork each would cost more than the rules
 * themselves (under ASan, most of the suite's time). Each failure names
 * its rule and step. */
START_TEST(test_rules) {
  for (int i = 0; i < NRULES; i++)
    run_rule(&rules[i], NULL);
}
END_TEST

/* Robust averaging (cfg.trusts): self does not trust member 9. */
static const rule_t distrust_rule = {
    "distrust: a list holding a member we do not trust is refused, in any "
    "state but running",
    '2',
    {{M('P', '1', 1, "129"), .want = "a1:1", .state = 'i',
      .counters = "distrusted=1 refused=1"},
     {M('P', '1', 2, "12"), .want = "A1:2 T250", .state = 'a'},
     {M('P', '0', 3, "029"), .at = 10, .want = "a0:3", .state = 'a',
      .counters = "distrusted=2"},
     {M('P', '1', 4, "192"), .at = 20, .want = "a1:4", .state = 'a',
      .counters = "distrusted=3"},
     {.op = 't', .at = 3000, .want = "", .state = 'i'},
     {.op = 'p',
      .at = 3000,
      .list = "34",
      .want = "P3:0=234 P4:0=234 T3250",
      .state = 'p'},
     {M('P', '1', 5, "129"), .at = 3001, .want = "a1:5", .state = 'p',
      .counters = "distrusted=4"}}};

START_TEST(test_distrust) {
  run_rule(&distrust_rule, "9");
}
END_TEST

/* ==== Other single-machine checks ===========================================
 */

/* More candidates than a round holds: a random 63 of them, distinct and
 * sorted, differing from one proposal to the next. */
START_TEST(test_many_candidates) {
  st_node_id_t c[200];
  for (int i = 0; i < 200; i++) {
    memset(&c[i], 0, sizeof c[i]);
    c[i].b[0] = (uint8_t) (i + 1); /* self is 0: the smallest */
    c[i].b[1] = 0x77;
  }
  st_ring_form_config_t cfg;
  st_ring_form_config_default(&cfg);
  st_rng_t r;
  st_rng_seed(&r, 99);
  st_node_id_t self;
  memset(&self, 0, sizeof self);
  st_ring_form_t* f;
  ck_assert_int_eq(st_ring_form_new(&cfg, &self, &r, &f), 0);
  uint8_t first[MAXM * 16];
  for (int round = 0; round < 2; round++) {
    ck_assert_int_eq(st_ring_form_propose(f, 0, c, 200), 0);
    st_rfact_t a;
    int sends = 0;
    while (st_ring_form_next_action(f, &a)) {
      if (a.kind != ST_RFACT_SEND)
        continue;
      st_msg_t m;
      ck_assert_int_eq(st_wire_decode(a.data, a.len, &m, NULL), 0);
      ck_assert_int_eq(m.type, ST_MSG_RING_PROPOSE);
      const st_msg_ring_propose_t* p = &m.u.ring_propose;
      ck_assert_uint_eq(p->n_members, MAXM);
      ck_assert(memcmp(&p->members[0], &self, 16) == 0);
      for (uint32_t i = 2; i < p->n_members; i++)
        ck_assert_int_lt(st_node_id_compare(&p->members[i - 1], &p->members[i]),
                         0);
      for (uint32_t i = 1; i < p->n_members; i++)
        ck_assert_uint_eq(p->members[i].b[1], 0x77);
      if (sends == 0 && round == 0)
        memcpy(first, p->members, sizeof first);
      else if (sends == 0)
        ck_assert(memcmp(first, p->members, sizeof first) != 0);
      sends++;
      st_wire_msg_free(&m);
    }
    ck_assert_int_eq(sends, MAXM - 1);
    /* Nobody answers: cancelled at the deadline. */
    ck_assert_int_eq(st_ring_form_tick(f, 500), 0);
    ck_assert_int_eq(st_ring_form_state(f), ST_RING_FORM_IDLE);
  }
  st_ring_form_free(f);
}
END_TEST

/* A members list of 64 accepted at a member; the largest proposal and
 * confirm fit one packet. */
START_TEST(test_full_round) {
  st_ring_form_config_t cfg;
  st_ring_form_config_default(&cfg);
  st_rng_t r;
  st_rng_seed(&r, 5);
  st_node_id_t ids[MAXM];
  for (uint32_t i = 0; i < MAXM; i++) {
    memset(&ids[i], 0, sizeof ids[i]);
    ids[i].b[0] = (uint8_t) (i + 1);
  }
  st_ring_form_t *p, *m;
  ck_assert_int_eq(st_ring_form_new(&cfg, &ids[0], &r, &p), 0);
  ck_assert_int_eq(st_ring_form_new(&cfg, &ids[MAXM - 1], &r, &m), 0);
  ck_assert_int_eq(st_ring_form_propose(p, 0, ids + 1, MAXM - 1), 0);
  st_rfact_t a;
  uint8_t msg[ST_PACKET_MAX_PLAINTEXT];
  size_t len = 0;
  while (st_ring_form_next_action(p, &a))
    if (a.kind == ST_RFACT_SEND && a.to.b[0] == MAXM) {
      memcpy(msg, a.data, a.len);
      len = a.len;
    }
  ck_assert_uint_eq(len, 33 + 18 * MAXM);
  ck_assert_int_eq(st_ring_form_message(m, 1, &ids[0], msg, len), 0);
  ck_assert_int_eq(st_ring_form_state(m), ST_RING_FORM_ACCEPTED);
  /* Everyone accepts (the proposer sees the others' answers by hand). */
  for (uint32_t i = 1; i < MAXM; i++) {
    st_msg_t acc;
    memset(&acc, 0, sizeof acc);
    acc.type = ST_MSG_RING_ACCEPT;
    acc.u.ring_accept.round_id = st_ring_form_round(p);
    acc.u.ring_accept.accept = true;
    uint8_t b[32];
    size_t n = 0;
    ck_assert_int_eq(st_wire_encode(&acc, b, sizeof b, &n), 0);
    ck_assert_int_eq(st_ring_form_message(p, 2, &ids[i], b, n), 0);
  }
  ck_assert_int_eq(st_ring_form_state(p), ST_RING_FORM_RUNNING);
  int confirms = 0, starts = 0;
  while (st_ring_form_next_action(p, &a)) {
    if (a.kind == ST_RFACT_START) {
      starts++;
      ck_assert_uint_eq(a.n_members, MAXM);
      ck_assert_uint_eq(a.my_rank, 0);
    } else if (a.kind == ST_RFACT_SEND) {
      confirms++;
      ck_assert_uint_le(a.len, ST_PACKET_MAX_PLAINTEXT);
      if (a.to.b[0] == MAXM) {
        memcpy(msg, a.data, a.len);
        len = a.len;
      }
    }
  }
  ck_assert_int_eq(confirms, MAXM - 1);
  ck_assert_int_eq(starts, 1);
  ck_assert_int_eq(st_ring_form_message(m, 3, &ids[0], msg, len), 0);
  bool started = false;
  while (st_ring_form_next_action(m, &a)) {
    if (a.kind != ST_RFACT_START)
      continue;
    started = true;
    ck_assert_uint_eq(a.n_members, MAXM);
    ck_assert_uint_eq(a.my_rank, MAXM - 1);
    ck_assert_uint_eq(a.round_id, st_ring_form_round(p));
  }
  ck_assert(started);
  st_ring_form_free(p);
  st_ring_form_free(m);
}
END_TEST

/* Three real machines, P (the smallest id) proposing to A and B, every
 * SEND delivered at once; each START's tag kept in starts[i]. */
static void tagged_round(const uint8_t* const* tags, uint8_t starts[3][16]) {
  st_ring_form_config_t cfg;
  st_ring_form_config_default(&cfg);
  st_rng_t r;
  st_rng_seed(&r, 11);
  st_node_id_t ids[3];
  st_ring_form_t* f[3];
  for (int i = 0; i < 3; i++) {
    memset(&ids[i], 0, sizeof ids[i]);
    ids[i].b[0] = (uint8_t) (i + 1);
    ck_assert_int_eq(st_ring_form_new(&cfg, &ids[i], &r, &f[i]), 0);
    st_ring_form_set_tag(f[i], tags[i]);
  }
  int started = 0;
  ck_assert_int_eq(st_ring_form_propose(f[0], 0, ids + 1, 2), 0);
  for (bool more = true; more;) {
    more = false;
    for (int i = 0; i < 3; i++) {
      st_rfact_t a;
      while (st_ring_form_next_action(f[i], &a)) {
        if (a.kind == ST_RFACT_START) {
          memcpy(starts[i], a.tag, 16);
          started++;
        } else if (a.kind == ST_RFACT_SEND) {
          uint8_t msg[ST_PACKET_MAX_PLAINTEXT];
          memcpy(msg, a.data, a.len);
          int to = a.to.b[0] - 1;
          ck_assert_int_eq(st_ring_form_message(f[to], 1, &ids[i], msg, a.len),
                           0);
          more = true;
        }
      }
    }
  }
  ck_assert_int_eq(started, 3);
  for (int i = 0; i < 3; i++)
    st_ring_form_free(f[i]);
}

/* A round's tag is the proposer's when every member named it, else none;
 * every member's START says the same. */
START_TEST(test_tags) {
  static const uint8_t t[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14},
                       u[16] = {9, 9, 9}, none[16] = {0};
  const struct {
    const uint8_t* tags[3];
    const uint8_t* want;
  } cases[] = {{{t, t, t}, t},
               {{t, t, u}, none},
               {{u, t, t}, none},
               {{t, NULL, t}, none},
               {{NULL, NULL, NULL}, none}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    uint8_t starts[3][16];
    memset(starts, 0xee, sizeof starts);
    tagged_round(cases[k].tags, starts);
    for (int i = 0; i < 3; i++)
      ck_assert_msg(memcmp(starts[i], cases[k].want, 16) == 0,
                    "case %zu: member %d started with another tag", k, i);
  }
}
END_TEST

START_TEST(test_misuse) {
  st_ring_form_config_t cfg;
  st_ring_form_config_default(&cfg);
  ck_assert_uint_eq(cfg.accept_wait_ms, 500);
  ck_assert_uint_eq(cfg.confirm_wait_ms, 2000);
  st_rng_t r;
  st_rng_seed(&r, 1);
  st_node_id_t self = id_of('5');
  st_ring_form_t* f = (st_ring_form_t*) &r; /* set to NULL on failure */
  ck_assert_int_eq(st_ring_form_new(NULL, &self, &r, &f), -EINVAL);
  ck_assert_ptr_null(f);
  ck_assert_int_eq(st_ring_form_new(&cfg, NULL, &r, &f), -EINVAL);
  ck_assert_int_eq(st_ring_form_new(&cfg, &self, NULL, &f), -EINVAL);
  ck_assert_int_eq(st_ring_form_new(&cfg, &self, &r, NULL), -EINVAL);
  st_ring_form_config_t zero = cfg;
  zero.accept_wait_ms = 0;
  ck_assert_int_eq(st_ring_form_new(&zero, &self, &r, &f), -EINVAL);
  zero = cfg;
  zero.confirm_wait_ms = 0;
  ck_assert_int_eq(st_ring_form_new(&zero, &self, &r, &f), -EINVAL);
  ck_assert_int_eq(st_ring_form_new(&cfg, &self, &r, &f), 0);
  st_node_id_t one = id_of('1');
  ck_assert_int_eq(st_ring_form_propose(NULL, 0, &one, 1), -EINVAL);
  ck_assert_int_eq(st_ring_form_propose(f, 0, NULL, 1), -EINVAL);
  ck_assert_int_eq(st_ring_form_message(NULL, 0, &one, (const uint8_t*) "", 0),
                   -EINVAL);
  ck_assert_int_eq(st_ring_form_message(f, 0, NULL, (const uint8_t*) "", 0),
                   -EINVAL);
  ck_assert_int_eq(st_ring_form_message(f, 0, &one, NULL, 3), -EINVAL);
  ck_assert_int_eq(st_ring_form_message(f, 0, &one, NULL, 0), -EBADMSG);
  ck_assert_int_eq(st_ring_form_tick(NULL, 0), -EINVAL);
  ck_assert_int_eq(st_ring_form_round_over(NULL, 0, 1, true), -EINVAL);
  ck_assert_int_eq(st_ring_form_member_gone(f, 0, NULL), -EINVAL);
  ck_assert_int_eq(st_ring_form_state(NULL), ST_RING_FORM_IDLE);
  ck_assert_uint_eq(st_ring_form_round(f), 0);
  ck_assert_ptr_null(st_ring_form_counters(NULL));
  ck_assert_str_eq(st_ring_form_state_name(ST_RING_FORM_RUNNING), "running");
  ck_assert_str_eq(st_ring_form_state_name((st_ring_form_state_t) 9),
                   "unknown");
  st_rfact_t a;
  ck_assert(!st_ring_form_next_action(f, &a));
  ck_assert(!st_ring_form_next_action(NULL, &a));
  /* Undrained actions are dropped by the next event. */
  ck_assert_int_eq(st_ring_form_propose(f, 0, &one, 1), 0);
  ck_assert_int_eq(st_ring_form_tick(f, 1), 0);
  ck_assert(!st_ring_form_next_action(f, &a));
  st_ring_form_free(f);
  st_ring_form_free(NULL);
}
END_TEST

/* ==== Formation under churn: the simulator ==================================
 */

/* Check's ck_assert writes to a pipe at every call; the simulator checks
 * millions of times, so it tests first and calls Check only to fail. */
#define REQ_MSG(cond, ...)       \
  do {                           \
    if (!(cond))                 \
      ck_abort_msg(__VA_ARGS__); \
  } while (0)
#define REQ(cond) REQ_MSG(cond, "line %d: %s", __LINE__, #cond)
#define REQ_EQ(a, b) REQ((a) == (b))
#define REQ_LT(a, b) REQ((a) < (b))
#define REQ_GE(a, b) REQ((a) >= (b))
#define REQ_NONNULL(p) REQ((p) != NULL)

#define SIM_MAX 16
#define SIM_EVERY_MS 1000   /* the driver's --ring-every */
#define SIM_ROUND_MS 150    /* the data plane's time once all started */
#define SIM_ABORT_MS 3000   /* its deadline for a member that never starts */
#define SIM_MAX_DELAY_MS 50 /* one-way network delay, uniform 0..this */
#define SIM_LOSS 0.05
#define SIM_RECS 1024

typedef enum {
  EV_DELIVER,
  EV_TICK,
  EV_PROPOSE,
  EV_ROUND_CHECK,
  EV_CHURN,
  EV_RESTART,
  EV_LEARN_GONE,
  EV_LEARN_ALIVE
} ev_kind_t;

typedef struct {
  uint64_t at, seq;
  uint8_t kind;  /* ev_kind_t */
  uint8_t node;  /* whom it happens to */
  uint8_t other; /* DELIVER: the sender; LEARN_*: the member learned of */
  uint32_t life; /* node's life the event belongs to (TICK, PROPOSE,
                    CHECK) */
  uint64_t round;
  uint8_t* data;
  size_t len;
} ev_t;

typedef struct {
  st_ring_form_t* f;
  st_rng_t rng;
  st_node_id_t id;
  bool alive;
  uint32_t life;
  bool view[SIM_MAX]; /* whom this node's driver believes live */
  uint64_t running;   /* the round START'ed and not over; 0 none */
  uint64_t started_ms;
  st_ring_form_counters_t past; /* earlier lives' counters */
} snode_t;

typedef struct {
  uint64_t round;
  uint32_t n;
  st_node_id_t list[MAXM];
  uint32_t starters; /* node indexes that started it */
  bool broken;       /* a member died while it ran */
  uint64_t last_start_ms;
} srec_t;

typedef struct {
  const char* name;
  int k;
  bool churn;
  int seeds;
  uint64_t end_ms;
  double min_per_min; /* confirmed rounds a simulated minute, at least */
} scen_t;

typedef struct {
  const scen_t* sc;
  uint64_t seed;
  st_rng_t net; /* the network's and the scenario's randomness */
  snode_t nodes[SIM_MAX];
  ev_t* q;
  size_t q_n, q_cap;
  uint64_t seq, now;
  uint64_t churn_from, churn_to, calm_from;
  srec_t* recs;
  size_t n_recs;
  /* Results. */
  uint64_t confirmed, confirmed_calm, complete, deaths, sent, lost;
  uint64_t digest;
  st_ring_form_counters_t sum;
  /* Packet buffers, reused (malloc per packet dominates under ASan). */
  uint8_t** pool;
  size_t pool_n, pool_cap;
} sim_t;

static uint8_t* buf_get(sim_t* s) {
  if (s->pool_n > 0)
    return s->pool[--s->pool_n];
  uint8_t* p = malloc(ST_PACKET_MAX_PLAINTEXT);
  REQ_NONNULL(p);
  return p;
}

static void buf_put(sim_t* s, uint8_t* p) {
  if (p == NULL)
    return;
  if (s->pool_n == s->pool_cap) {
    s->pool_cap = s->pool_cap ? 2 * s->pool_cap : 256;
    s->pool = realloc(s->pool, s->pool_cap * sizeof *s->pool);
    REQ_NONNULL(s->pool);
  }
  s->pool[s->pool_n++] = p;
}

static void q_push(sim_t* s, ev_t e) {
  e.seq = s->seq++;
  if (s->q_n == s->q_cap) {
    s->q_cap = s->q_cap ? 2 * s->q_cap : 256;
    s->q = realloc(s->q, s->q_cap * sizeof *s->q);
    REQ_NONNULL(s->q);
  }
  size_t i = s->q_n++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (s->q[p].at < e.at || (s->q[p].at == e.at && s->q[p].seq < e.seq))
      break;
    s->q[i] = s->q[p];
    i = p;
  }
  s->q[i] = e;
}

static bool ev_less(const ev_t* a, const ev_t* b) {
  return a->at < b->at || (a->at == b->at && a->seq < b->seq);
}

static ev_t q_pop(sim_t* s) {
  ev_t top = s->q[0];
  ev_t last = s->q[--s->q_n];
  size_t i = 0;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    const ev_t* best = &last;
    if (l < s->q_n && ev_less(&s->q[l], best))
      m = l, best = &s->q[l];
    if (r < s->q_n && ev_less(&s->q[r], best))
      m = r;
    if (m == i)
      break;
    s->q[i] = s->q[m];
    i = m;
  }
  if (s->q_n > 0)
    s->q[i] = last;
  return top;
}

static void ev_at(sim_t* s, uint64_t at, ev_kind_t kind, int node, int other) {
  ev_t e;
  memset(&e, 0, sizeof e);
  e.at = at;
  e.kind = (uint8_t) kind;
  e.node = (uint8_t) node;
  e.other = (uint8_t) other;
  e.life = s->nodes[node].life;
  q_push(s, e);
}

static int index_of(const sim_t* s, const st_node_id_t* id) {
  for (int i = 0; i < s->sc->k; i++)
    if (memcmp(&s->nodes[i].id, id, sizeof *id) == 0)
      return i;
  ck_abort_msg("unknown id");
  return -1;
}

static srec_t* rec_find(sim_t* s, uint64_t round) {
  for (size_t i = s->n_recs; i-- > 0;)
    if (s->recs[i].round == round)
      return &s->recs[i];
  return NULL;
}

static bool rec_has(const srec_t* r, const st_node_id_t* id) {
  for (uint32_t i = 0; i < r->n; i++)
    if (memcmp(&r->list[i], id, sizeof *id) == 0)
      return true;
  return false;
}

static void digest(sim_t* s, uint64_t v) {
  s->digest = (s->digest ^ v) * UINT64_C(0x100000001b3);
}

/* The invariants, at every START. */
static void on_start(sim_t* s, int i, const st_rfact_t* a) {
  snode_t* nd = &s->nodes[i];
  REQ_MSG(nd->running == 0, "seed %llu: node %d in two rounds at once",
          (unsigned long long) s->seed, i);
  REQ_EQ(st_ring_form_state(nd->f), ST_RING_FORM_RUNNING);
  REQ(a->n_members >= 2 && a->n_members <= MAXM);
  REQ_LT(a->my_rank, a->n_members);
  REQ(memcmp(&a->members[a->my_rank], &nd->id, 16) == 0);
  for (uint32_t x = 0; x < a->n_members; x++)
    for (uint32_t y = x + 1; y < a->n_members; y++)
      REQ(memcmp(&a->members[x], &a->members[y], 16) != 0);
  srec_t* r = rec_find(s, a->round_id);
  if (r == NULL) {
    REQ_LT(s->n_recs, SIM_RECS);
    r = &s->recs[s->n_recs++];
    memset(r, 0, sizeof *r);
    r->round = a->round_id;
    r->n = a->n_members;
    memcpy(r->list, a->members, a->n_members * sizeof a->members[0]);
  } else {
    REQ_MSG(r->n == a->n_members && memcmp(r->list, a->members, r->n * 16) == 0,
            "seed %llu: round %llx started with two lists",
            (unsigned long long) s->seed, (unsigned long long) a->round_id);
  }
  REQ_MSG(!(r->starters & (1u << i)), "node %d started a round twice", i);
  r->starters |= 1u << i;
  r->last_start_ms = s->now;
  if (a->my_rank == 0) {
    s->confirmed++;
    if (s->now >= s->calm_from)
      s->confirmed_calm++;
  }
  nd->running = a->round_id;
  nd->started_ms = s->now;
  digest(s, a->round_id ^ ((uint64_t) i << 56) ^ s->now);
  ev_t e;
  memset(&e, 0, sizeof e);
  e.at = s->now + SIM_ROUND_MS + st_rng_below(&s->net, 51);
  e.kind = EV_ROUND_CHECK;
  e.node = (uint8_t) i;
  e.life = nd->life;
  e.round = a->round_id;
  q_push(s, e);
}

/* The driver: after every event into node i's machine. */
static void sim_drain(sim_t* s, int i) {
  snode_t* nd = &s->nodes[i];
  st_rfact_t a;
  while (st_ring_form_next_action(nd->f, &a)) {
    switch (a.kind) {
      case ST_RFACT_SEND: {
        s->sent++;
        digest(s, a.len);
        if (st_rng_uniform(&s->net) < SIM_LOSS) {
          s->lost++;
          break;
        }
        ev_t e;
        memset(&e, 0, sizeof e);
        e.at = s->now + st_rng_below(&s->net, SIM_MAX_DELAY_MS + 1);
        e.kind = EV_DELIVER;
        e.node = (uint8_t) index_of(s, &a.to);
        e.other = (uint8_t) i;
        e.data = buf_get(s);
        memcpy(e.data, a.data, a.len);
        e.len = a.len;
        q_push(s, e);
        break;
      }
      case ST_RFACT_START:
        on_start(s, i, &a);
        break;
      case ST_RFACT_TIMER:
        ev_at(s, a.at_ms > s->now ? a.at_ms : s->now, EV_TICK, i, 0);
        break;
    }
  }
}

static void add_counters(st_ring_form_counters_t* to,
                         const st_ring_form_counters_t* c) {
  uint64_t* t = (uint64_t*) to;
  const uint64_t* f = (const uint64_t*) c;
  for (size_t k = 0; k < sizeof *c / sizeof(uint64_t); k++)
    t[k] += f[k];
}

static void node_start(sim_t* s, int i) {
  snode_t* nd = &s->nodes[i];
  st_ring_form_config_t cfg;
  st_ring_form_config_default(&cfg);
  st_rng_seed(&nd->rng, s->seed * 1000003 + (uint64_t) i * 131 + nd->life);
  REQ_EQ(st_ring_form_new(&cfg, &nd->id, &nd->rng, &nd->f), 0);
  nd->alive = true;
  nd->running = 0;
  ev_at(s, s->now + st_rng_below(&s->net, SIM_EVERY_MS), EV_PROPOSE, i, 0);
}

/* The driver aborts its running round when a member of it is gone. */
static void abort_if_member(sim_t* s, int i, const st_node_id_t* gone) {
  snode_t* nd = &s->nodes[i];
  if (nd->running == 0)
    return;
  srec_t* r = rec_find(s, nd->running);
  if (r == NULL || !rec_has(r, gone))
    return;
  REQ_EQ(st_ring_form_round_over(nd->f, s->now, nd->running, false), 0);
  nd->running = 0;
  sim_drain(s, i);
}

static void kill_node(sim_t* s, int v) {
  snode_t* nd = &s->nodes[v];
  s->deaths++;
  /* Rounds it was in are broken for everyone running them. */
  for (int j = 0; j < s->sc->k; j++) {
    srec_t* r = s->nodes[j].running ? rec_find(s, s->nodes[j].running) : NULL;
    if (r != NULL && rec_has(r, &nd->id))
      r->broken = true;
  }
  add_counters(&nd->past, st_ring_form_counters(nd->f));
  st_ring_form_free(nd->f);
  nd->f = NULL;
  nd->alive = false;
  nd->running = 0;
  nd->life++;
  for (int j = 0; j < s->sc->k; j++)
    if (j != v)
      ev_at(s, s->now + 500 + st_rng_below(&s->net, 2501), EV_LEARN_GONE, j, v);
  ev_at(s, s->now + 4000 + st_rng_below(&s->net, 4001), EV_RESTART, v, 0);
}

/* Churn: mostly a node that has accepted and not yet started (the hard
 * case), else one proposing, else anyone; never below half the nodes. */
static void churn(sim_t* s) {
  int k = s->sc->k, alive = 0, accepted[SIM_MAX], n_acc = 0, any[SIM_MAX],
      n_any = 0, prop[SIM_MAX], n_prop = 0;
  for (int i = 0; i < k; i++) {
    if (!s->nodes[i].alive)
      continue;
    alive++;
    any[n_any++] = i;
    st_ring_form_state_t st = st_ring_form_state(s->nodes[i].f);
    if (st == ST_RING_FORM_ACCEPTED)
      accepted[n_acc++] = i;
    else if (st == ST_RING_FORM_PROPOSING)
      prop[n_prop++] = i;
  }
  int min_alive = k / 2 > 2 ? k / 2 : 2;
  if (alive > min_alive) {
    double u = st_rng_uniform(&s->net);
    int v;
    if (n_acc > 0 && u < 0.7)
      v = accepted[st_rng_below(&s->net, (uint64_t) n_acc)];
    else if (n_prop > 0 && u < 0.85)
      v = prop[st_rng_below(&s->net, (uint64_t) n_prop)];
    else
      v = any[st_rng_below(&s->net, (uint64_t) n_any)];
    kill_node(s, v);
  }
  /* Often enough to catch nodes between accept and start. */
  uint64_t next = s->now + 100 + st_rng_below(&s->net, 1900);
  if (next < s->churn_to)
    ev_at(s, next, EV_CHURN, 0, 0);
}

/* Whether node i's driver proposes now: alive, knows someone else, and
 * sees no live id smaller than its own. Fills the candidates. */
static size_t should_propose(const sim_t* s, int i, st_node_id_t* cand) {
  const snode_t* nd = &s->nodes[i];
  size_t n = 0;
  for (int j = 0; j < s->sc->k; j++) {
    if (j == i || !nd->view[j])
      continue;
    if (st_node_id_compare(&s->nodes[j].id, &nd->id) < 0)
      return 0;
    cand[n++] = s->nodes[j].id;
  }
  return n;
}

static void sim_event(sim_t* s, const ev_t* e) {
  snode_t* nd = &s->nodes[e->node];
  int i = e->node;
  switch ((ev_kind_t) e->kind) {
    case EV_DELIVER:
      if (!nd->alive)
        break; /* lost with the process */
      REQ_EQ(st_ring_form_message(nd->f, s->now, &s->nodes[e->other].id,
                                  e->data, e->len),
             0);
      sim_drain(s, i);
      break;
    case EV_TICK:
      if (!nd->alive || e->life != nd->life)
        break;
      REQ_EQ(st_ring_form_tick(nd->f, s->now), 0);
      sim_drain(s, i);
      break;
    case EV_PROPOSE: {
      if (!nd->alive || e->life != nd->life)
        break;
      st_node_id_t cand[SIM_MAX];
      size_t n = should_propose(s, i, cand);
      if (n > 0) {
        int rc = st_ring_form_propose(nd->f, s->now, cand, n);
        REQ(rc == 0 || rc == -EBUSY);
        sim_drain(s, i);
      }
      ev_at(s, s->now + SIM_EVERY_MS, EV_PROPOSE, i, 0);
      break;
    }
    case EV_ROUND_CHECK: {
      /* The data plane: done SIM_ROUND_MS after the last member started;
       * a member that never starts, or died, fails it at SIM_ABORT_MS
       * (unless the driver learned of a death first). */
      if (!nd->alive || e->life != nd->life || nd->running != e->round)
        break; /* aborted already */
      srec_t* r = rec_find(s, e->round);
      bool all = !r->broken;
      for (uint32_t m = 0; all && m < r->n; m++)
        all = (r->starters & (1u << index_of(s, &r->list[m]))) != 0;
      bool ok = all && s->now >= r->last_start_ms + SIM_ROUND_MS;
      if (ok || s->now >= nd->started_ms + SIM_ABORT_MS) {
        REQ_EQ(st_ring_form_round_over(nd->f, s->now, e->round, ok), 0);
        nd->running = 0;
        sim_drain(s, i);
      } else {
        ev_t again = *e;
        again.data = NULL;
        again.at = s->now + 50;
        q_push(s, again);
      }
      break;
    }
    case EV_CHURN:
      churn(s);
      break;
    case EV_RESTART: {
      /* A fresh machine; its view is partial at first. */
      for (int j = 0; j < s->sc->k; j++) {
        nd->view[j] = j == i;
        if (j == i || !s->nodes[j].alive)
          continue;
        if (st_rng_below(&s->net, 2) == 0)
          nd->view[j] = true;
        else
          ev_at(s, s->now + st_rng_below(&s->net, 2001), EV_LEARN_ALIVE, i, j);
        ev_at(s, s->now + 200 + st_rng_below(&s->net, 1801), EV_LEARN_ALIVE, j,
              i);
      }
      node_start(s, i);
      break;
    }
    case EV_LEARN_GONE: {
      if (!nd->alive)
        break;
      nd->view[e->other] = false;
      REQ_EQ(st_ring_form_member_gone(nd->f, s->now, &s->nodes[e->other].id),
             0);
      sim_drain(s, i);
      abort_if_member(s, i, &s->nodes[e->other].id);
      break;
    }
    case EV_LEARN_ALIVE:
      if (nd->alive && s->nodes[e->other].alive)
        nd->view[e->other] = true;
      break;
  }
}

static void sim_run(sim_t* s, const scen_t* sc, uint64_t seed) {
  /* The caller's records and buffers, reused from run to run. */
  srec_t* recs = s->recs;
  uint8_t** pool = s->pool;
  size_t pool_n = s->pool_n, pool_cap = s->pool_cap;
  memset(s, 0, sizeof *s);
  s->sc = sc;
  s->seed = seed;
  s->recs = recs;
  s->pool = pool;
  s->pool_n = pool_n;
  s->pool_cap = pool_cap;
  st_rng_seed(&s->net, seed);
  s->churn_from = sc->churn ? 5000 : UINT64_MAX;
  s->churn_to = sc->churn ? sc->end_ms / 2 : 0;
  /* Progress is measured once views have settled and the dead are back
   * (a restart is at most 8 s after the last death, then learned within
   * 2 s). */
  s->calm_from = sc->churn ? s->churn_to + 12000 : 10000;
  int k = sc->k;
  /* Random ids, so that the smallest is anyone. */
  for (int i = 0; i < k; i++)
    for (size_t b = 0; b < sizeof s->nodes[i].id.b; b++)
      s->nodes[i].id.b[b] = (uint8_t) st_rng_next(&s->net);
  int smallest = 0;
  for (int i = 1; i < k; i++)
    if (st_node_id_compare(&s->nodes[i].id, &s->nodes[smallest].id) < 0)
      smallest = i;
  /* Stale views at the start: half the nodes learn of the smallest only
   * within 5 s (so several believe they are the smallest and their
   * proposals race), and one pair in ten learns of each other within 3 s. */
  for (int i = 0; i < k; i++) {
    for (int j = 0; j < k; j++) {
      bool late = i != j && ((j == smallest && st_rng_below(&s->net, 2) == 0) ||
                             st_rng_below(&s->net, 10) == 0);
      s->nodes[i].view[j] = !late;
      if (late) {
        uint64_t at = st_rng_below(&s->net, j == smallest ? 5001 : 3001);
        ev_at(s, at, EV_LEARN_ALIVE, i, j);
      }
    }
  }
  for (int i = 0; i < k; i++)
    node_start(s, i);
  if (sc->churn)
    ev_at(s, s->churn_from, EV_CHURN, 0, 0);
  while (s->q_n > 0 && s->q[0].at <= sc->end_ms) {
    ev_t e = q_pop(s);
    REQ_GE(e.at, s->now);
    s->now = e.at;
    sim_event(s, &e);
    buf_put(s, e.data);
  }
  while (s->q_n > 0)
    buf_put(s, q_pop(s).data);
  free(s->q);
  for (int i = 0; i < k; i++) {
    add_counters(&s->sum, &s->nodes[i].past);
    if (s->nodes[i].f != NULL) {
      add_counters(&s->sum, st_ring_form_counters(s->nodes[i].f));
      st_ring_form_free(s->nodes[i].f);
    }
  }
  for (size_t r = 0; r < s->n_recs; r++) {
    bool all = true;
    for (uint32_t m = 0; all && m < s->recs[r].n; m++)
      all =
          (s->recs[r].starters & (1u << index_of(s, &s->recs[r].list[m]))) != 0;
    s->complete += all;
  }
  /* The counters agree with what the driver saw. */
  REQ_EQ(s->sum.confirmed, s->confirmed);
}

static const scen_t scens[] = {
    {"steady", 2, false, 40, 60000, 50},  {"steady", 3, false, 40, 60000, 50},
    {"steady", 5, false, 40, 60000, 50},  {"steady", 7, false, 40, 60000, 50},
    {"steady", 10, false, 24, 60000, 50}, {"steady", 16, false, 16, 60000, 50},
    {"churn", 3, true, 40, 90000, 45},    {"churn", 5, true, 40, 90000, 45},
    {"churn", 7, true, 40, 90000, 45},    {"churn", 10, true, 24, 90000, 45},
    {"churn", 16, true, 16, 90000, 45},
};
#define NSCENS ((int) (sizeof scens / sizeof scens[0]))

START_TEST(test_churn) {
  const scen_t* sc = &scens[_i];
  uint64_t base = tu_seed();
  double min_rate = 1e9;
  uint64_t confirmed = 0, complete = 0, deaths = 0, sent = 0, lost = 0;
  st_ring_form_counters_t sum;
  memset(&sum, 0, sizeof sum);
  sim_t* s = malloc(sizeof *s);
  ck_assert_ptr_nonnull(s);
  s->recs = malloc(SIM_RECS * sizeof *s->recs);
  ck_assert_ptr_nonnull(s->recs);
  s->pool = NULL;
  s->pool_n = s->pool_cap = 0;
  for (int k = 0; k < sc->seeds; k++) {
    uint64_t seed = base + (uint64_t) k * 7919 + (uint64_t) _i;
    sim_run(s, sc, seed);
    double calm_min = (double) (sc->end_ms - s->calm_from) / 60000.0;
    double rate = (double) s->confirmed_calm / calm_min;
    ck_assert_msg(rate >= sc->min_per_min,
                  "%s K=%d seed %llu: %.1f rounds a minute, want >= %.0f",
                  sc->name, sc->k, (unsigned long long) seed, rate,
                  sc->min_per_min);
    if (rate < min_rate)
      min_rate = rate;
    confirmed += s->confirmed;
    complete += s->complete;
    deaths += s->deaths;
    sent += s->sent;
    lost += s->lost;
    add_counters(&sum, &s->sum);
    if (k == 0) {
      /* Reproducible from its seed. */
      uint64_t d = s->digest, c = s->confirmed, n = s->sent;
      sim_run(s, sc, seed);
      ck_assert_msg(s->digest == d && s->confirmed == c && s->sent == n,
                    "seed %llu is not reproducible", (unsigned long long) seed);
    }
  }
  free(s->recs);
  for (size_t i = 0; i < s->pool_n; i++)
    free(s->pool[i]);
  free(s->pool);
  free(s);
  printf(
      "ring_form sim %-6s K=%-2d seeds=%-3d: %4.1f rounds/min (calm: >= "
      "%4.1f), %3.0f%% complete, deaths %llu, msgs %llu (%llu lost), "
      "cancelled %llu, refused %llu, stale %llu, timeouts %llu, resent "
      "%llu\n",
      sc->name, sc->k, sc->seeds,
      (double) confirmed / sc->seeds / ((double) sc->end_ms / 60000.0),
      min_rate, confirmed ? 100.0 * (double) complete / (double) confirmed : 0,
      (unsigned long long) deaths, (unsigned long long) sent,
      (unsigned long long) lost, (unsigned long long) sum.cancelled,
      (unsigned long long) sum.refused, (unsigned long long) sum.stale,
      (unsigned long long) sum.timeouts, (unsigned long long) sum.resent);
  fflush(stdout);
}
END_TEST

static Suite* ring_form_suite(void) {
  Suite* s = suite_create("gossip_ring_form");
  TCase* tr = tcase_create("rules");
  tcase_add_test(tr, test_rules);
  tcase_add_test(tr, test_distrust);
  tcase_add_test(tr, test_many_candidates);
  tcase_add_test(tr, test_full_round);
  tcase_add_test(tr, test_tags);
  tcase_add_test(tr, test_misuse);
  suite_add_tcase(s, tr);
  TCase* ts = tcase_create("simulator");
  tcase_add_loop_test(ts, test_churn, 0, NSCENS);
  tcase_set_timeout(ts, 120);
  suite_add_tcase(s, ts);
  return s;
}

int main(void) {
  tu_seed(); /* print the seed once, before the forks */
  SRunner* sr = srunner_create(ring_form_suite());
  srunner_run_all(sr, CK_ENV);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
