/* daemon_sync.c: multi-donor state sync (issue #16; gossip.h, "Multi-donor
 * state sync"; docs/protocol.md). A joining node fetches the cluster's
 * agreed state (daemon_agreed.c) in chunks from --sync-donors donors at
 * once, each chunk checked against a manifest that at least two donors
 * sent alike, so that no single member can feed it a wrong state; this
 * file drives gossip/sync.c's plan over SYNC connections, and answers the
 * same requests as a donor.
 *
 * The joiner, at each sync tick (250 ms) while it syncs:
 * - ASK: it asks every live member that runs its model (up to
 *   ST_SYNC_MAX_DONORS) for its manifest, and waits for their answers (or
 *   ST__SYNC_ASK_MS);
 * - it agrees on the manifest most of them sent, if two did; else it asks
 *   again, up to ST__SYNC_ASK_TRIES times, and then falls back to the
 *   single-donor FETCH (daemon_xchg.c), as it does at once when no member
 *   holds an agreed state (no ring round yet), when only one member can
 *   give one, or with --sync-donors 1;
 * - FETCH: it keeps a range out with each of up to --sync-donors donors,
 *   a range being the donor's share of what is left, asked on the
 *   connection that brought the manifest: the donor keeps the state it
 *   described for that connection (a reference, daemon_agreed.c), so a
 *   ring round that ends meanwhile does not pull it away. Every chunk is
 *   checked as it comes. A donor that sends a bad chunk is dropped and
 *   counted; one that goes away has its undelivered chunks fetched from
 *   the others;
 * - when every agreeing donor went away or sent bad chunks it asks again
 *   from nothing; after ST__SYNC_ASK_TRIES + 1 such restarts in a row it
 *   waits first (3 s, doubling up to 48 s), and never falls back to one
 *   donor then;
 * - once every chunk is verified it checks the whole vector against the
 *   manifest's id, and hands it to the trainer with the step (the smallest
 *   the agreeing donors reported, within st__robust_step_bound).
 * A connection that makes no progress for ST__SYNC_IDLE_MS is reset.
 */
#include "node/daemon/daemon_internal.h"

#include <stdlib.h>
#include <string.h>

/* Answers to manifests are small; a donor that has not answered in this
 * long is counted as silent. */
#define ST__SYNC_ASK_MS 3000u
/* Rounds of asking before falling back to one donor, when donors hold
 * agreed states but no two the same (a round ending as they answered). */
#define ST__SYNC_ASK_TRIES 3
/* A sync connection with no message (or, for a donor, no chunk written)
 * for this long is reset: 1 MiB a chunk, so 30 s is a link below
 * 35 kB/s. */
#define ST__SYNC_IDLE_MS 30000u
/* Chunk frames a donor keeps in flight on one range. */
#define ST__SYNC_FRAMES_IN_FLIGHT 2

typedef enum { PH_ASK = 0, PH_FETCH } sync_phase_t;

/* What a joiner's connection waits for (c->sync_kind): a manifest, a
 * range, or nothing (IDLE: open, pinning the donor's state). */
#define KIND_IDLE 0

struct st__sync_s {
  sync_phase_t phase;
  st_sync_plan_t* plan;
  st__anchor_t* state; /* the agreed state being assembled */
  uint64_t n;
  unsigned n_donors;
  st_node_id_t ids[ST_SYNC_MAX_DONORS];
  st__conn_t* conns[ST_SYNC_MAX_DONORS]; /* the one open to each */
  /* This round of asking: answers, manifests that were usable, and
   * answers that said the donor holds no agreed state. */
  unsigned answered, usable, not_ready;
  uint64_t ask_deadline_ms;
  unsigned tries, restarts;
  unsigned backoffs; /* waits before asking again, in this sync */
  /* No one donor's word in this sync: a round heard two usable manifests,
   * unlike, or the donors that agreed sent bad chunks or a false id. */
  bool conflicted;
  bool said_wait;        /* logged that one member cannot settle it */
  uint64_t ask_after_ms; /* no new round of asking before (back-off) */
  uint64_t started_ms;
  unsigned bad_donors, lost_donors;
};

/* ---- Messages ------------------------------------------------------------ */

static int send_msg(st__conn_t* c, const st_msg_t* m, bool ack) {
  uint8_t* buf = malloc(ST_WIRE_MAX_MESSAGE_BYTES);
  if (buf == NULL)
    return -1;
  size_t len = 0;
  int rc = st_wire_encode(m, buf, ST_WIRE_MAX_MESSAGE_BYTES, &len);
  if (rc == 0 && c->d->fault_sync_corrupt && m->type == ST_MSG_TENSOR_CHUNK)
    buf[len - 1] ^= 0x01; /* the last byte is the chunk's data's */
  if (rc != 0) {
    free(buf);
    return rc;
  }
  return st__conn_send_taken(c, buf, len, ack); /* sealed from buf */
}

static void reply(st__conn_t* c, uint8_t status, st__anchor_t* a,
                  const uint8_t* hashes, uint32_t hashes_len) {
  st__daemon_t* d = c->d;
  st_msg_t m = {.type = ST_MSG_SYNC_REPLY};
  st_msg_sync_reply_t* r = &m.u.sync_reply;
  r->status = status;
  r->n_params = d->local.n_params;
  if (a != NULL) {
    memcpy(r->anchor, st__agreed_id_of(a), sizeof r->anchor);
    r->round = a->round;
  }
  st__tt_stats_t st;
  st__tt_stats(d->tt, &st);
  r->step = st.step;
  r->hashes = hashes;
  r->hashes_len = hashes_len;
  uint8_t* lie = NULL;
  if (d->fault_sync_manifest && hashes_len > 0 &&
      (lie = malloc(hashes_len)) != NULL) {
    memcpy(lie, hashes, hashes_len);
    lie[0] ^= 0x01; /* the first chunk's hash */
    r->hashes = lie;
  }
  if (send_msg(c, &m, false) != 0)
    st__conn_close_reset(c);
  free(lie);
}

/* ---- The donor ----------------------------------------------------------- */

/* Sends the range's next chunks, up to the frames in flight. */
static void serve_more(st__conn_t* c) {
  while (!c->closing && c->sync_out < ST__SYNC_FRAMES_IN_FLIGHT &&
         c->sync_next < c->sync_end) {
    const st__anchor_t* a = c->anchor;
    uint64_t first = c->sync_next * ST_SYNC_CHUNK_FLOATS;
    uint64_t floats = a->n - first < ST_SYNC_CHUNK_FLOATS
                          ? a->n - first
                          : ST_SYNC_CHUNK_FLOATS;
    st_msg_t m = {.type = ST_MSG_TENSOR_CHUNK};
    m.u.chunk.offset = first;
    m.u.chunk.total = a->n;
    m.u.chunk.data = (const uint8_t*) (a->v + first);
    m.u.chunk.data_len = (uint32_t) (floats * sizeof(float));
    if (send_msg(c, &m, true) != 0) {
      st__conn_close_reset(c);
      return;
    }
    c->sync_out++;
    c->sync_next++;
    c->d->c.sync_served_chunks++;
  }
}

/* The status of a request to this node as donor; *a the state it is
 * about (the one this connection pinned with its manifest, else the
 * node's own), NULL when none. */
static uint8_t judge(st__conn_t* c, const st_msg_sync_req_t* q,
                     st__anchor_t** a) {
  st__daemon_t* d = c->d;
  *a = c->anchor != NULL ? c->anchor : d->anchor;
  if (memcmp(q->fingerprint, d->local.fingerprint, 16) != 0 ||
      q->n_params != d->local.n_params)
    return ST_SYNC_STATUS_MISMATCH;
  if (*a == NULL || (*a)->n != d->local.n_params || d->state == ST__D_SYNCING)
    return ST_SYNC_STATUS_NOT_READY;
  if (q->kind == ST_SYNC_RANGE &&
      memcmp(q->anchor, st__agreed_id_of(*a), sizeof(*a)->id) != 0)
    return ST_SYNC_STATUS_GONE;
  if (!c->serving_sync && d->sync_serving >= ST__SYNC_SERVE_MAX)
    return ST_SYNC_STATUS_BUSY;
  return ST_SYNC_STATUS_OK;
}

/* A request to this node as donor: a manifest (pinning the state it
 * describes to this connection) or a range of that state. */
static void serve(st__conn_t* c, const st_msg_sync_req_t* q) {
  st__daemon_t* d = c->d;
  c->deadline_ms = st__dnow(d) + ST__SYNC_IDLE_MS;
  st__anchor_t* a = NULL;
  uint8_t status = judge(c, q, &a);
  const uint8_t* hashes = NULL;
  if (status == ST_SYNC_STATUS_OK && q->kind == ST_SYNC_MANIFEST &&
      (hashes = st__agreed_hashes(a)) == NULL)
    status = ST_SYNC_STATUS_BUSY; /* no memory for the manifest */
  if (status == ST_SYNC_STATUS_OK && q->kind == ST_SYNC_RANGE &&
      (q->first >= st_sync_chunks(a->n) ||
       q->count > st_sync_chunks(a->n) - q->first)) {
    st__conn_close_reset(c); /* a range past the state: not an honest ask */
    return;
  }
  if (status != ST_SYNC_STATUS_OK) {
    d->c.sync_refused += status == ST_SYNC_STATUS_BUSY;
    reply(c, status, a, NULL, 0);
    st__conn_close(c);
    return;
  }
  if (c->anchor != a) {
    st__anchor_release(c->anchor);
    c->anchor = st__anchor_ref(a);
  }
  if (!c->serving_sync) {
    c->serving_sync = true;
    d->sync_serving++;
  }
  if (q->kind == ST_SYNC_MANIFEST) {
    d->c.sync_served_manifests++;
    reply(c, status, a, hashes,
          (uint32_t) (st_sync_chunks(a->n) * ST_SYNC_HASH_BYTES));
    return; /* the joiner may ask for ranges of it next */
  }
  c->sync_next = q->first;
  c->sync_end = q->first + q->count;
  reply(c, status, a, NULL, 0);
  serve_more(c);
}

/* ---- The joiner ---------------------------------------------------------- */

/* Lets go of every connection of the sync that is still open. */
static void drop_conns(st__sync_t* s) {
  for (unsigned i = 0; i < ST_SYNC_MAX_DONORS; i++) {
    if (s->conns[i] != NULL) {
      s->conns[i]->sync_slot = 0;
      st__conn_close(s->conns[i]);
      s->conns[i] = NULL;
    }
  }
}

/* Lets go of donor i's connection. */
static void drop_conn(st__sync_t* s, unsigned i, bool reset) {
  st__conn_t* c = s->conns[i];
  if (c == NULL)
    return;
  s->conns[i] = NULL;
  c->sync_slot = 0;
  if (reset)
    st__conn_close_reset(c);
  else
    st__conn_close(c);
}

void st__sync_free(st__daemon_t* d) {
  st__sync_t* s = d->sync;
  if (s == NULL)
    return;
  drop_conns(s);
  st_sync_plan_free(s->plan);
  st__anchor_release(s->state);
  free(s);
  d->sync = NULL;
}

/* Back to asking, from nothing. */
static void restart(st__sync_t* s) {
  drop_conns(s);
  st_sync_plan_free(s->plan);
  s->plan = NULL;
  st__anchor_release(s->state);
  s->state = NULL;
  s->phase = PH_ASK;
  s->tries = 0;
  s->restarts++;
}

/* Ends the multi-donor attempt: the joiner fetches from one donor. */
static void fall_back(st__daemon_t* d, const char* why) {
  st__dlog(d, "state transfer from one donor: %s", why);
  d->c.sync_single++;
  d->sync_single = true;
  st__sync_free(d);
}

/* Asks on donor i's connection: a manifest, or a range of the agreed
 * state. -1 when it cannot be sent (the connection is let go). */
static int request(st__daemon_t* d, unsigned i, uint8_t kind, uint64_t first,
                   uint64_t count) {
  st__sync_t* s = d->sync;
  st__conn_t* c = s->conns[i];
  c->sync_kind = kind;
  c->sync_replied = false;
  c->sync_next = first;
  c->sync_end = first + count;
  if (c->phase_open == false)
    return 0; /* sent by st__sync_on_open once the stream is up */
  st_msg_t m = {.type = ST_MSG_SYNC_REQ};
  st_msg_sync_req_t* q = &m.u.sync_req;
  q->kind = kind;
  memcpy(q->fingerprint, d->local.fingerprint, 16);
  q->n_params = d->local.n_params;
  if (kind == ST_SYNC_RANGE) {
    uint64_t round, step;
    st_sync_plan_agreed(s->plan, q->anchor, &round, &step);
    q->first = first;
    q->count = count;
  }
  c->deadline_ms = st__dnow(d) + ST__SYNC_IDLE_MS;
  if (send_msg(c, &m, false) != 0) {
    drop_conn(s, i, true);
    return -1;
  }
  return 0;
}

/* Opens a connection to donor i for a request of kind. */
static int dial(st__daemon_t* d, unsigned i, const st_member_t* mb,
                uint8_t kind, uint64_t first, uint64_t count) {
  st__sync_t* s = d->sync;
  st__conn_t* c = st__conn_dial(d, &mb->addr, &mb->id, ST__CONN_SYNC);
  if (c == NULL)
    return -1;
  c->peer = mb->id;
  c->sync_slot = i + 1;
  s->conns[i] = c;
  return request(d, i, kind, first, count);
}

/* Live members running this node's model, other than itself: the donors
 * to ask, in membership order, at most ST_SYNC_MAX_DONORS. Returns how
 * many; *others counts live members running another model. */
static unsigned candidates(st__daemon_t* d, st_member_t* out,
                           unsigned* others) {
  unsigned k = 0;
  *others = 0;
  size_t n = st_membership_count(d->m);
  for (size_t i = 0; i < n && k < ST_SYNC_MAX_DONORS; i++) {
    const st_member_t* mb = st_membership_at(d->m, i);
    if (mb == NULL || mb->state != ST_MEMBER_ALIVE || !mb->has_status ||
        memcmp(&mb->id, &d->ident.id, sizeof(mb->id)) == 0)
      continue;
    if (memcmp(mb->status.fingerprint, d->local.fingerprint,
               sizeof d->local.fingerprint) != 0) {
      (*others)++;
      continue;
    }
    out[k++] = *mb;
  }
  return k;
}

/* A new round of asking every candidate for its manifest. */
static void ask(st__daemon_t* d) {
  st__sync_t* s = d->sync;
  drop_conns(s);
  st_member_t mb[ST_SYNC_MAX_DONORS];
  unsigned others = 0;
  unsigned k = candidates(d, mb, &others);
  if (k == 0 && others > 0) {
    fall_back(d, "no live member runs this node's model");
    return;
  }
  if (k == 1 && !s->conflicted) {
    fall_back(d, "one member can give the state");
    return;
  }
  if (k == 1) { /* donors disagreed or failed before: one cannot settle it */
    if (!s->said_wait)
      st__dwarn(d,
                "one member left to ask, after donors disagreed or failed: "
                "waiting for a second one rather than take its word");
    s->said_wait = true;
    return;
  }
  if (k == 0)
    return; /* nobody yet: the next tick asks again */
  st_sync_plan_free(s->plan);
  s->plan = NULL;
  if (st_sync_plan_new(d->local.n_params, &s->plan) != 0) {
    fall_back(d, "the state does not fit a manifest");
    return;
  }
  s->n_donors = k;
  s->answered = s->usable = s->not_ready = 0;
  s->ask_deadline_ms = st__dnow(d) + ST__SYNC_ASK_MS;
  s->tries++;
  for (unsigned i = 0; i < k; i++) {
    s->ids[i] = mb[i].id;
    dial(d, i, &mb[i], ST_SYNC_MANIFEST, 0, 0);
  }
}

/* Whether a manifest is still awaited. */
static bool asking(const st__sync_t* s) {
  for (unsigned i = 0; i < s->n_donors; i++)
    if (s->conns[i] != NULL && s->conns[i]->sync_kind == ST_SYNC_MANIFEST)
      return true;
  return false;
}

/* Asks again from nothing after a wait of 3 s, doubling up to 48 s with
 * each back-off in this sync. Returns the wait. */
static uint64_t back_off(st__daemon_t* d) {
  st__sync_t* s = d->sync;
  uint64_t wait_ms = (uint64_t) ST__SYNC_ASK_MS
                     << (s->backoffs < 4 ? s->backoffs : 4);
  restart(s);
  s->restarts = 0;
  s->backoffs++;
  d->c.sync_backoffs++;
  s->ask_after_ms = st__dnow(d) + wait_ms;
  return wait_ms;
}

/* After a round of asking: agree, or ask again, or fall back. */
static void decide(st__daemon_t* d) {
  st__sync_t* s = d->sync;
  unsigned agree = st_sync_plan_agree(s->plan, 2);
  if (agree >= 2) {
    s->state = st__anchor_new((size_t) d->local.n_params);
    if (s->state == NULL) {
      fall_back(d, "no memory to assemble the state");
      return;
    }
    s->n = d->local.n_params;
    s->phase = PH_FETCH;
    for (unsigned i = 0; i < s->n_donors; i++)
      if (!st_sync_plan_usable(s->plan, i))
        drop_conn(s, i, false);
    st__dlog(d,
             "%u of %u donors agree on the state; fetching it from up to "
             "%u at once",
             agree, s->n_donors, d->cfg->sync_donors);
    return;
  }
  s->conflicted = s->conflicted || s->usable >= 2;
  if (s->usable == 0 && s->not_ready > 0 && s->not_ready == s->answered &&
      !s->conflicted) {
    fall_back(d, "no member holds an agreed state yet (no ring round)");
  } else if (s->tries >= ST__SYNC_ASK_TRIES && s->usable < 2 &&
             !s->conflicted) {
    fall_back(d, "no two donors sent a manifest");
  } else if (s->tries >= ST__SYNC_ASK_TRIES && s->usable >= 2) {
    /* Two or more donors describe different states, round after round:
     * one of them lies (or is broken), and taking one donor's word is
     * what multi-donor sync is for not doing. Ask again, for as long as
     * it takes a ring round to make two agree. */
    unsigned usable = s->usable, tries = s->tries;
    uint64_t wait_ms = back_off(d);
    d->c.sync_disagreed++;
    st__dwarn(d,
              "donors described different agreed states (%u usable "
              "manifests, no two alike, in the last of %u rounds): not "
              "taking any one donor's word; asking again in %.0f s",
              usable, tries, (double) wait_ms / 1000.0);
  } else if (s->tries >= ST__SYNC_ASK_TRIES) {
    /* Fewer than two manifests, after donors disagreed or failed in this
     * sync: the same. */
    uint64_t wait_ms = back_off(d);
    st__dwarn(d,
              "no two donors sent a manifest, after donors disagreed or "
              "failed in this sync: not taking any one donor's word; "
              "asking again in %.0f s",
              (double) wait_ms / 1000.0);
  } else {
    ask(d);
  }
}

/* The chunks a donor takes at once: its share of what is left. */
static uint64_t share(const st__daemon_t* d, const st__sync_t* s) {
  uint64_t left = st_sync_chunks(s->n) - st_sync_plan_verified(s->plan);
  uint64_t k = d->cfg->sync_donors;
  return left / k + (left % k != 0);
}

static void finish(st__daemon_t* d) {
  st__sync_t* s = d->sync;
  uint8_t want[ST_XCHG_ANCHOR_BYTES], got[ST_XCHG_ANCHOR_BYTES];
  uint64_t round = 0, step = 0;
  st_sync_plan_agreed(s->plan, want, &round, &step);
  st__agreed_id(s->state->v, (size_t) s->n, round, got);
  if (memcmp(want, got, sizeof want) != 0) {
    /* Every chunk matched a manifest whose id does not name them: the
     * agreeing donors lied alike. Start over. */
    st__dwarn(d,
              "the state assembled from the agreeing donors does not "
              "match their manifest's id; asking again");
    d->c.sync_donors_bad += st_sync_plan_usable_count(s->plan);
    s->conflicted = true;
    restart(s);
    return;
  }
  uint64_t bound = st__robust_step_bound(d, NULL);
  if (step > bound)
    step = bound;
  double ms = (double) (st__dnow(d) - s->started_ms);
  unsigned used = st_sync_plan_usable_count(s->plan) + s->lost_donors;
  unsigned bad = s->bad_donors, lost = s->lost_donors;
  drop_conns(s);
  if (st__tt_set_state(d->tt, s->state->v, (size_t) s->n, step) != 0)
    return; /* the trainer is stopping */
  /* This node now holds the agreed state too: it can serve it and name it
   * in compressed exchanges before its first ring round. */
  memcpy(s->state->id, got, sizeof got);
  s->state->id_made = true;
  s->state->round = round;
  st__agreed_take(d, s->state);
  s->state = NULL;
  st__dlog(d,
           "synchronized from %u donors at step %llu: the agreed state of "
           "ring round %016llx, in %.0f ms (%u dropped for bad chunks, %u "
           "went away)",
           used, (unsigned long long) step, (unsigned long long) round, ms, bad,
           lost);
  d->c.sync_ok++;
  d->c.fetches_ok++;
  st__sync_free(d);
  st__daemon_synced(d);
}

/* Gives every usable donor without one a range, up to --sync-donors out
 * at once, on its open connection when it has one. */
static void fetch_more(st__daemon_t* d) {
  st__sync_t* s = d->sync;
  unsigned out = 0;
  for (unsigned i = 0; i < s->n_donors; i++)
    out += st_sync_plan_busy(s->plan, i);
  for (unsigned i = 0; i < s->n_donors && out < d->cfg->sync_donors; i++) {
    if (st_sync_plan_busy(s->plan, i) || !st_sync_plan_usable(s->plan, i))
      continue;
    const st_member_t* mb = st_membership_find(d->m, &s->ids[i]);
    if (mb == NULL || mb->state != ST_MEMBER_ALIVE) {
      drop_conn(s, i, false);
      st_sync_plan_end(s->plan, i, true);
      continue;
    }
    st_member_t m = *mb;
    uint64_t first, count;
    if (!st_sync_plan_take(s->plan, i, share(d, s), &first, &count))
      return; /* nothing left in the pool: the rest is out */
    int rc = s->conns[i] != NULL ? request(d, i, ST_SYNC_RANGE, first, count)
                                 : dial(d, i, &m, ST_SYNC_RANGE, first, count);
    if (rc != 0) {
      st_sync_plan_end(s->plan, i, true);
      continue;
    }
    out++;
  }
}

/* Moves the sync on as far as it can now. May free d->sync. */
static void advance(st__daemon_t* d) {
  st__sync_t* s = d->sync;
  if (s->restarts > ST__SYNC_ASK_TRIES) {
    /* The donors that agreed went away or sent bad chunks, sync after
     * sync: one donor's word would let a member that outlasts them feed
     * this node a state nobody vouched for. Wait, and ask again. */
    s->conflicted = true; /* nor later in this sync (ask, decide) */
    uint64_t wait_ms = back_off(d);
    st__dwarn(d,
              "the agreeing donors failed %d times in a row: not taking any "
              "one donor's word; asking again in %.0f s",
              ST__SYNC_ASK_TRIES + 1, (double) wait_ms / 1000.0);
    return;
  }
  if (s->phase == PH_ASK) {
    if (s->plan == NULL) {
      if (st__dnow(d) < s->ask_after_ms)
        return; /* backing off (decide) */
      ask(d);
    } else if (!asking(s) || st__dnow(d) >= s->ask_deadline_ms) {
      decide(d);
    }
    if (d->sync == NULL || s->phase == PH_ASK)
      return;
  }
  if (st_sync_plan_complete(s->plan)) {
    finish(d);
    return;
  }
  fetch_more(d);
  bool out = false;
  for (unsigned i = 0; i < s->n_donors; i++)
    out = out || st_sync_plan_busy(s->plan, i);
  if (!out && st_sync_plan_usable_count(s->plan) == 0) {
    st__dwarn(d,
              "every agreeing donor went away or sent bad chunks; asking "
              "the members again");
    restart(s);
  }
}

bool st__sync_tick(st__daemon_t* d) {
  if (d->cfg->sync_donors < 2 || d->sync_single)
    return false;
  if (d->sync == NULL) {
    d->sync = calloc(1, sizeof *d->sync);
    if (d->sync == NULL)
      return false;
    d->sync->started_ms = st__dnow(d);
  }
  advance(d);
  return !d->sync_single;
}

/* A frame of a range: the next chunk, checked. */
static void range_chunk(st__conn_t* c, st__sync_t* s, unsigned i,
                        const st_msg_tensor_chunk_t* ch) {
  st__daemon_t* d = c->d;
  uint64_t idx = 0;
  st_sync_chunk_t r =
      st_sync_plan_chunk(s->plan, i, ch->offset, ch->data, ch->data_len, &idx);
  if (r == ST_SYNC_CHUNK_OK) {
    memcpy(s->state->v + idx * ST_SYNC_CHUNK_FLOATS, ch->data, ch->data_len);
    d->c.sync_chunks_ok++;
    c->deadline_ms = st__dnow(d) + ST__SYNC_IDLE_MS;
    if (idx + 1 == c->sync_end) {
      st_sync_plan_end(s->plan, i, false);
      c->sync_kind = KIND_IDLE;
      advance(d); /* the next range, or the end */
    }
    return;
  }
  char id[33];
  st_node_id_format(&c->peer, id);
  d->c.sync_chunks_bad++;
  d->c.sync_donors_bad++;
  s->bad_donors++;
  st__dwarn(d,
            "donor %.12s sent %s (chunk at float %llu); dropped it for the "
            "rest of the sync",
            id,
            r == ST_SYNC_CHUNK_BAD ? "a chunk that does not match the "
                                     "agreed manifest"
                                   : "a chunk out of order",
            (unsigned long long) ch->offset);
  drop_conn(s, i, true);
  advance(d);
}

/* A donor's answer to a request, as the joiner. */
static void joiner_reply(st__conn_t* c, st__sync_t* s, unsigned i,
                         const st_msg_sync_reply_t* r) {
  st__daemon_t* d = c->d;
  c->sync_replied = true;
  c->deadline_ms = st__dnow(d) + ST__SYNC_IDLE_MS;
  if (c->sync_kind == ST_SYNC_MANIFEST) {
    s->answered++;
    s->not_ready += r->status == ST_SYNC_STATUS_NOT_READY;
    c->sync_kind = KIND_IDLE;
    if (st_sync_plan_manifest(s->plan, i, r) == 0) {
      s->usable++;
      d->c.sync_manifests++;
    } else {
      drop_conn(s, i, false);
    }
    if (!asking(s))
      advance(d);
    return;
  }
  if (r->status != ST_SYNC_STATUS_OK) {
    /* Busy: later; anything else: this donor no longer serves it. */
    st_sync_plan_end(s->plan, i, r->status != ST_SYNC_STATUS_BUSY);
    drop_conn(s, i, false);
  }
}

static void joiner_frame(st__conn_t* c, const st_msg_t* m) {
  st__sync_t* s = c->d->sync;
  unsigned i = c->sync_slot - 1;
  bool want_reply = c->sync_kind != KIND_IDLE && !c->sync_replied;
  if (want_reply && m->type == ST_MSG_SYNC_REPLY) {
    joiner_reply(c, s, i, &m->u.sync_reply);
  } else if (!want_reply && c->sync_kind == ST_SYNC_RANGE &&
             m->type == ST_MSG_TENSOR_CHUNK) {
    range_chunk(c, s, i, &m->u.chunk);
  } else {
    /* Anything else is not the conversation: the donor is dropped. */
    if (s->plan != NULL)
      st_sync_plan_end(s->plan, i, true);
    drop_conn(s, i, true);
  }
}

/* ---- The connection's callbacks ----------------------------------------- */

int st__sync_on_open(st__conn_t* c) {
  st__daemon_t* d = c->d;
  c->phase_open = true;
  if (c->sync_slot == 0 || d->sync == NULL || d->sync->plan == NULL)
    return -1;
  unsigned i = c->sync_slot - 1;
  return request(d, i, c->sync_kind, c->sync_next, c->sync_end - c->sync_next);
}

void st__sync_on_frame(st__conn_t* c, const uint8_t* msg, size_t len) {
  st__daemon_t* d = c->d;
  st_msg_t m;
  if (st_wire_decode(msg, len, &m, &d->wc) != 0) {
    st__conn_close_reset(c);
    return;
  }
  if (!c->initiator) {
    /* One request at a time: none while a range is being sent. */
    if (m.type != ST_MSG_SYNC_REQ || c->sync_next < c->sync_end)
      st__conn_close_reset(c);
    else
      serve(c, &m.u.sync_req);
  } else if (c->sync_slot != 0 && d->sync != NULL) {
    joiner_frame(c, &m);
  } else {
    st__conn_close(c); /* the sync is over */
  }
  st_wire_msg_free(&m);
}

void st__sync_on_sent(st__conn_t* c) {
  if (c->initiator || c->sync_out == 0)
    return;
  c->sync_out--;
  c->deadline_ms = st__dnow(c->d) + ST__SYNC_IDLE_MS;
  serve_more(c);
}

void st__sync_on_closed(st__conn_t* c) {
  st__daemon_t* d = c->d;
  if (!c->initiator || c->sync_slot == 0 || d->sync == NULL)
    return;
  st__sync_t* s = d->sync;
  unsigned i = c->sync_slot - 1;
  c->sync_slot = 0;
  s->conns[i] = NULL;
  if (c->sync_kind == ST_SYNC_MANIFEST && !c->sync_replied) {
    s->answered++; /* silent or gone: counted, not usable */
    if (!asking(s))
      advance(d);
    return;
  }
  if (s->plan != NULL && st_sync_plan_busy(s->plan, i)) {
    char id[33];
    st_node_id_format(&c->peer, id);
    st__dlog(d,
             "donor %.12s went away mid-range; its chunks go to the "
             "others",
             id);
    d->c.sync_donors_lost++;
    s->lost_donors++;
    st_sync_plan_end(s->plan, i, true);
    advance(d);
  }
}
