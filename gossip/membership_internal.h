/* membership_internal.h: the membership machine's state, shared by its
 * three files: membership.c (the table, events, the SWIM/Lifeguard state
 * rules and actions), membership_probe.c (probing, indirect probes, nacks,
 * awareness, suspicion timers) and membership_gossip.c (the broadcast
 * queue, packets, push-pull). SWIM (Das et al. 2002) with Lifeguard
 * (Dadgar et al. 2018), as memberlist runs them. Internal to gossip/.
 *
 * Memory: a simulator holds thousands of machines that each know every
 * member, so a member costs 160 bytes in the table plus 8 to 16 in the
 * id -> index hash; the public st_member_t (with its status record) is
 * only materialized on demand. The table's order is the probe order
 * (shuffled each pass, as memberlist's nodes slice). */
#ifndef STARLING_GOSSIP_MEMBERSHIP_INTERNAL_H
#define STARLING_GOSSIP_MEMBERSHIP_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gossip/gossip.h"
#include "gossip/membership_constants.h"

#define ST__NONE UINT32_MAX

/* One member, compact (160 bytes). incarnation is always one the member
 * signed: an ALIVE raises it only with the member's signature (kept in
 * sig, to relay), and a SUSPECT or DEAD is accepted only at exactly it
 * (membership_rules.c). sig is the member's signature of its ALIVE at
 * incarnation, or of its leave when state is LEFT. */
typedef struct {
  st_node_id_t id;
  uint64_t incarnation;
  uint8_t sig[ST_SIGNATURE_BYTES];
  uint64_t since_ms; /* when state last changed */
  uint8_t pk[ST_PUBLIC_KEY_BYTES];
  uint8_t ip[16];
  uint16_t port;
  uint8_t ip_len;
  uint8_t state;   /* st_member_state_t */
  uint32_t bcast;  /* pending membership broadcast or ST__NONE */
  uint32_t status; /* index into statuses or ST__NONE */
  uint32_t susp;   /* index into suspicions or ST__NONE */
} st__mrec_t;

/* A slot of the id -> index hash, 4 bytes: 0 when empty, else
 * (index + 1) << ST__TAG_BITS | tag, the tag being 15 bits of the id's
 * hash that the slot's position does not already imply, compared before
 * the record is touched. */
#define ST__TAG_BITS 15u
#define ST__TAG_MASK ((1u << ST__TAG_BITS) - 1)
typedef uint32_t st__slot_t;
_Static_assert(ST_MEMBERSHIP_MAX_MEMBERS <= (1u << (32 - ST__TAG_BITS)),
               "an index + 1 must fit above the tag");

/* A pending broadcast: "tell others the current state of member id". The
 * message is encoded from the member's record when it is packed, so a
 * newer update about the same member replaces the older one in place. */
enum { ST__BC_MEMBER = 0, ST__BC_STATUS = 1, ST__BC_FREE = 2 };
typedef struct {
  st_node_id_t id;
  st_node_id_t from; /* SUSPECT/DEAD: the accuser to name */
  uint32_t mi;       /* the member's index in the table, a hint checked
                      * against id (kept current when the table moves) */
  uint32_t prev, next;
  uint8_t kind;
  uint8_t transmits;
} st__bcast_t;

typedef struct {
  st_msg_status_t rec;
  uint32_t bcast; /* or ST__NONE; also the free-list link when unused */
  bool used;
} st__status_t;

/* A running suspicion timer (Lifeguard's dynamic suspicion). who[0] is the
 * first accuser, who[1..n] the distinct confirmations. */
typedef struct {
  st_node_id_t id;
  uint64_t start_ms;
  uint64_t deadline_ms;
  uint64_t min_ms, max_ms; /* the timeout's bounds, fixed at the start */
  uint32_t k;              /* expected confirmations */
  uint32_t n;              /* confirmations so far (<= k) */
  st_node_id_t who[1 + ST_MEMBERSHIP_MAX_INDIRECT_CHECKS];
} st__susp_t;

/* A forgotten DEAD member, kept to try to reconnect after a partition. */
typedef struct {
  st_node_id_t id;
  st_wire_addr_t addr;
  uint64_t incarnation; /* the last it signed */
  uint64_t at_ms;       /* when it was forgotten */
} st__grave_t;

/* A member forgotten by force-leave (st_membership_force_leave): not
 * taken back at an incarnation up to the one it had. */
typedef struct {
  st_node_id_t id;
  uint64_t incarnation;
  uint64_t at_ms;
} st__tomb_t;

/* A ping-req this member serves for a prober. */
typedef struct {
  bool used;
  bool want_nack;
  bool nack_sent;
  uint32_t our_seq;
  uint32_t req_seq;
  st_node_id_t target; /* the only member whose ACK of our_seq counts */
  st_node_id_t req_id;
  st_wire_addr_t req_addr;
  uint64_t nack_at_ms;
  uint64_t expire_ms;
} st__relay_t;

/* Where a queued action's bytes live: an offset into the arena, resolved
 * when the action is drained (the arena may move as it grows). */
typedef struct {
  st_maction_t a;
  size_t off;
} st__qaction_t;

struct st_membership_s {
  st_membership_config_t cfg;
  st_rng_t* rng;
  uint64_t hash_key;
  uint32_t boot_epoch;
  st_node_id_t self;
  bool joined;
  bool leaving;
  bool announce;    /* joined: re-queue our ALIVE after the seed's reply */
  bool quiet_merge; /* merging that reply: members added are not gossiped */
  st_membership_admit_fn
      admit; /* NULL: every member (st_membership_set_admit) */
  void* admit_ctx;
  st_membership_signer_t signer; /* st_membership_set_signer */

  /* The table, in probe order, and its id -> index hash (open
   * addressing, linear probing, power-of-two size, ST__NONE empty). */
  st__mrec_t* mem;
  uint32_t n_mem, cap_mem;
  st__slot_t* hash;
  uint32_t hash_cap;
  uint32_t n_alive; /* ALIVE or SUSPECT, self included */
  uint32_t n_down;  /* DEAD or LEFT, self excluded: awaiting reclaim */

  /* Probing. */
  uint32_t probe_index;
  uint32_t seq;
  bool probing;
  bool probe_acked;
  bool probe_indirect;
  st_node_id_t probe_target;
  uint32_t probe_seq;
  uint64_t probe_timeout_at;
  uint64_t probe_end_at;
  uint32_t nacks_expected;
  uint32_t nacks;
  /* The members asked to probe the target for us: with the target, the
   * only senders whose ACK (and, for them, NACK) of probe_seq counts. */
  st_node_id_t probe_via[ST_MEMBERSHIP_MAX_INDIRECT_CHECKS];
  uint32_t n_probe_via;
  uint64_t next_probe_at;
  uint32_t awareness;

  st__relay_t relays[ST_MEMBERSHIP_MAX_RELAYS];
  uint32_t n_relays;

  st__susp_t* susp;
  uint32_t n_susp, cap_susp;
  uint64_t susp_min_at; /* earliest suspicion deadline, UINT64_MAX if none */

  st__status_t* statuses;
  uint32_t n_status, cap_status, status_free;

  /* Broadcast queue: lists by transmit count, fewest first. */
  st__bcast_t* bc;
  uint32_t n_bc, cap_bc, bc_free;
  uint32_t* bc_head; /* [ST_MEMBERSHIP_MAX_TRANSMITS + 1] */
  uint32_t bc_pending;

  st__grave_t* grave; /* [ST_MEMBERSHIP_GRAVES] or NULL */
  uint32_t n_grave;
  st__tomb_t* tomb; /* [ST_MEMBERSHIP_GRAVES] or NULL */
  uint32_t n_tomb;

  uint64_t next_gossip_at;
  uint64_t next_push_pull_at;
  uint64_t next_reclaim_at;
  uint32_t push_pull_cursor;

  /* Actions and the bytes they borrow. */
  st__qaction_t* q;
  size_t q_len, q_head, q_cap;
  uint8_t* arena;
  size_t arena_len, arena_cap;
  uint64_t timer_emitted; /* last ST_MACT_TIMER deadline, 0 = none yet */

  /* Scratch for st_membership_at/find: a ring of copies. */
  st_member_t view[4];
  uint32_t view_next;

  st_wire_counters_t counters;
  struct st__membership_stats_s {
    uint64_t packets_in, packets_out, bytes_out;
    uint64_t msgs_ignored;  /* stale, unknown member, about self */
    uint64_t msgs_rejected; /* not allowed in a packet, bad claims */
    uint64_t refutes, suspects, deaths;
    uint64_t stalls;         /* local stalls detected (st__stall) */
    uint64_t refutes_resent; /* ALIVEs sent to a stale accuser */
    uint64_t buddy_asks;     /* SUSPECTs sent to a suspect that spoke */
    uint64_t push_pulls_in, push_pulls_out;
    uint64_t reconnects;  /* push-pulls tried with a dead member */
    uint64_t probe_hints; /* st_membership_probe_hint */
    /* Claims refused for their subject binding (membership_rules.c). */
    uint64_t claims_bad_signature;
    uint64_t claims_beyond_signed;
    uint64_t acks_wrong_sender;
  } stats;
};
typedef struct st__membership_stats_s st__membership_stats_t;

static inline bool st__is_down(uint8_t state) {
  return state == ST_MEMBER_DEAD || state == ST_MEMBER_LEFT;
}

/* ---- membership.c ---------------------------------------------------------
 */
void st__materialize(const st_membership_t* m, const st__mrec_t* r,
                     st_member_t* out);
uint32_t st__mem_find(const st_membership_t* m, const st_node_id_t* id);
st__mrec_t* st__mem_get(st_membership_t* m, const st_node_id_t* id);
bool st__id_eq(const st_node_id_t* a, const st_node_id_t* b);
bool st__id_zero(const st_node_id_t* a);
void st__rec_addr(const st__mrec_t* r, st_wire_addr_t* a);
void st__rec_set_addr(st__mrec_t* r, const st_wire_addr_t* a);
int st__push_action(st_membership_t* m, const st_maction_t* a,
                    const uint8_t* data, size_t len);
void st__emit_member(st_membership_t* m, const st__mrec_t* r);
void st__table_rehash(st_membership_t* m);
/* Points member i's pending broadcasts at index i (after it moved). */
void st__bc_rehint(st_membership_t* m, uint32_t i);
/* Adds a member (zeroed but for its id) at a random place in the probe
 * order; NULL at ST_MEMBERSHIP_MAX_MEMBERS or out of memory. Moves other
 * records: pointers into the table do not survive it. */
st__mrec_t* st__table_add(st_membership_t* m, const st_node_id_t* id);
void st__reclaim(st_membership_t* m, uint64_t now);
/* Whether id was force-left at an incarnation >= incarnation within the
 * last ST_MEMBERSHIP_GRAVE_KEEP_MS (an ALIVE for it is then ignored). */
bool st__tombstoned(const st_membership_t* m, const st_node_id_t* id,
                    uint64_t incarnation, uint64_t now);
uint32_t st__n_estimate(const st_membership_t* m);

/* ---- membership_rules.c ---------------------------------------------------
 */
void st__set_state(st_membership_t* m, uint64_t now, st__mrec_t* r,
                   uint8_t state);
int st__status_alloc(st_membership_t* m, st__mrec_t* r);
void st__on_status(st_membership_t* m, uint64_t now, const st_msg_status_t* s);
/* The SWIM state rules, for messages from packets and push-pull entries
 * alike (the trust model in membership.c's opening comment). */
void st__on_alive(st_membership_t* m, uint64_t now, const st_msg_alive_t* a);
void st__on_suspect(st_membership_t* m, uint64_t now,
                    const st_msg_suspect_t* s);
void st__on_dead(st_membership_t* m, uint64_t now, const st_msg_suspect_t* d);
void st__refute(st_membership_t* m, uint64_t now, uint64_t accused_inc);
/* Signs this node's ALIVE at its record's incarnation into its record. */
void st__sign_self(st_membership_t* m);
/* Signs a STATUS of this node (fills s->signature). */
void st__sign_status(st_membership_t* m, st_msg_status_t* s);
/* Whether the leave of member `node` at incarnation `inc` carries its
 * signature sig, checked with key pk; counts a failure. */
bool st__leave_ok(st_membership_t* m, const uint8_t* pk,
                  const st_node_id_t* node, uint64_t inc, const uint8_t* sig);

/* ---- membership_probe.c ----------------------------------------------------
 */
uint64_t st__scaled(const st_membership_t* m, uint64_t ms);
void st__awareness(st_membership_t* m, int delta);
void st__probe_tick(st_membership_t* m, uint64_t now);
void st__relay_tick(st_membership_t* m, uint64_t now);
void st__on_ping(st_membership_t* m, uint64_t now, const st_node_id_t* from,
                 const st_wire_addr_t* from_addr, const st_msg_ping_t* p);
void st__on_ping_req(st_membership_t* m, uint64_t now, const st_node_id_t* from,
                     const st_wire_addr_t* from_addr,
                     const st_msg_ping_req_t* p);
/* The machine was woken late_ms after its deadline: a local stall. */
void st__stall(st_membership_t* m, uint64_t now, uint64_t late_ms);
void st__on_ack(st_membership_t* m, uint64_t now, const st_node_id_t* from,
                uint32_t seq);
void st__on_nack(st_membership_t* m, uint64_t now, const st_node_id_t* from,
                 uint32_t seq);
void st__susp_start(st_membership_t* m, uint64_t now, st__mrec_t* r,
                    const st_node_id_t* from);
bool st__susp_confirm(st_membership_t* m, uint64_t now, st__mrec_t* r,
                      const st_node_id_t* from);
void st__susp_stop(st_membership_t* m, st__mrec_t* r);
void st__susp_tick(st_membership_t* m, uint64_t now);
uint64_t st__suspicion_min_ms(const st_membership_t* m, uint32_t n);

/* ---- membership_gossip.c
 * -----------------------------------------------------
 */
int st__bc_init(st_membership_t* m);
void st__bc_queue_member(st_membership_t* m, st__mrec_t* r,
                         const st_node_id_t* from);
void st__bc_queue_status(st_membership_t* m, uint32_t status_idx);
void st__bc_drop(st_membership_t* m, uint32_t* idx);
/* Frees the pool when nothing is pending and it is large. */
void st__bc_shrink(st_membership_t* m);
uint32_t st__retransmit_limit(const st_membership_t* m);
/* Sends one UDP packet: head (already encoded, may be empty) followed by
 * as many pending broadcasts as fit in ST_PACKET_MAX_PLAINTEXT bytes. */
int st__send_packet(st_membership_t* m, const st_wire_addr_t* to,
                    const st_node_id_t* to_id, const st_msg_t* head,
                    const st_msg_t* head2);
void st__gossip_tick(st_membership_t* m, uint64_t now);
void st__push_pull_tick(st_membership_t* m, uint64_t now);
uint64_t st__push_pull_interval_ms(const st_membership_t* m);
int st__push_pull_send(st_membership_t* m, const st_wire_addr_t* to,
                       const st_node_id_t* to_id, bool is_reply);
void st__merge_entry(st_membership_t* m, uint64_t now,
                     const st_push_pull_entry_t* e);
uint32_t st__random_members(st_membership_t* m, uint32_t k,
                            const st_node_id_t* exclude, uint64_t now,
                            bool alive_only, uint32_t* out);

/* Statistics for tests and the simulator. */
const st__membership_stats_t* st__membership_stats(const st_membership_t* m);

#endif /* STARLING_GOSSIP_MEMBERSHIP_INTERNAL_H */
