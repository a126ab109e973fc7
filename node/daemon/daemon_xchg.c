/* daemon_xchg.c: pairwise gossip averaging and the joining node's state
 * transfer, driving the exchange machines of gossip/exchange.c over the
 * connections of daemon_conn.c and the trainer thread's mailbox.
 *
 * Averaging: every --gossip-every seconds a node that is not already in
 * an exchange picks a random live member whose status record carries the
 * same model fingerprint and averages with it. A peer in an exchange
 * answers busy; the initiator tries again at its next tick (with another
 * random peer). A node takes part in at most one averaging exchange at a
 * time, as initiator or responder, so the pair's sum stays preserved.
 *
 * Joining: a node started with seeds and without a checkpoint stays in
 * SYNCING until it has its state: from several donors at once when it can
 * (daemon_sync.c), else the parameters and the step of one live peer
 * (FETCH, here); a donor that dies mid-transfer, is busy or not ready yet makes
 * it try another at the next tick. A peer running another model refuses
 * with MISMATCH, and the joiner stops with a message naming both models.
 */
#include "node/daemon/daemon_internal.h"

#include <stdlib.h>
#include <string.h>

#define SYNC_RETRY_LOG_EVERY 10
#define SYNC_WAIT_TICKS 20 /* 5 s at the 250 ms sync tick */

void st__xchg_mark_start(st__daemon_t* d, const float* params, size_t n) {
  if (n == 0)
    return;
  const float* v = params;
  float* host = NULL;
  if (st_backend_kind(d->be) != ST_BACKEND_CPU) {
    host = malloc(n * sizeof(float));
    if (host == NULL || st_copy_to_host(d->be, host, params, n) != 0) {
      free(host);
      st__dwarn(d, "no start state (%zu floats): joiners fetch it in full", n);
      return;
    }
    v = host;
  }
  st_hash_t h;
  st_hash_init(&h);
  st_hash_update(&h, v, n * sizeof(float));
  st_hash_final(&h, d->start_hash);
  free(host);
  /* Its id: BLAKE2b-256("starling-held-v1" || hash), cut to 16 bytes, a
   * first 0 written as 1 (docs/protocol.md). Not an anchor's id, so that
   * a node from before held transfers, which names its compression
   * anchor in a FETCH, is never taken for one that holds the state. */
  static const char domain[] = "starling-held-v1";
  uint8_t full[ST_HASH_BYTES];
  st_hash_init(&h);
  st_hash_update(&h, domain, sizeof domain - 1);
  st_hash_update(&h, d->start_hash, sizeof d->start_hash);
  st_hash_final(&h, full);
  memcpy(d->start_id, full, sizeof d->start_id);
  if (d->start_id[0] == 0)
    d->start_id[0] = 1;
  d->start_known = true;
}

/* A FETCH, either side: the start state as the held one while this node
 * has not stepped (the donor checks its snapshot's hash before it sends
 * nothing, gossip/exchange.c). */
static void fill_held(st__daemon_t* d, uint64_t step, st_xchg_local_t* l) {
  memset(l->anchor, 0, sizeof l->anchor);
  l->has_held = d->start_known && step == 0;
  if (!l->has_held)
    return;
  memcpy(l->anchor, d->start_id, sizeof l->anchor);
  memcpy(l->held_hash, d->start_hash, sizeof l->held_hash);
}

static void fill_local(st__conn_t* c, st_xchg_local_t* l) {
  st__daemon_t* d = c->d;
  *l = d->local;
  st__tt_stats_t st;
  st__tt_stats(d->tt, &st);
  l->step = st.step;
  if (c->xkind == ST_XCHG_FETCH)
    fill_held(d, st.step, l);
  else
    st__compress_fill(d, c, l);
  if (d->state == ST__D_SYNCING)
    l->n_params = 0; /* nothing to give yet */
}

/* The node's slot for this exchange (one AVERAGE, and as a joiner one
 * FETCH, at a time). */
static void slot_release(st__conn_t* c) {
  st__daemon_t* d = c->d;
  if (!c->counted_active)
    return;
  c->counted_active = false;
  if (c->xkind == ST_XCHG_FETCH && c->initiator)
    d->fetch_active = false;
  else if (d->avg_active > 0)
    d->avg_active--;
}

static void xbuf_give_back(st__conn_t* c);

void st__xchg_settle(st__conn_t* c) {
  if (c->x == NULL || !st_xchg_finished(c->x) || c->tt_pending > 0)
    return;
  st_xchg_release_buffers(c->x);
  xbuf_give_back(c);
  slot_release(c);
}

void st__xchg_conn_freed(st__conn_t* c) {
  xbuf_give_back(c);
  slot_release(c);
}

static void finish_counts(st__conn_t* c, st_xchg_result_t r,
                          const st_xact_t* done) {
  const char* peer_model = done->peer_model;
  st__daemon_t* d = c->d;
  char id[33];
  st_node_id_format(&c->peer, id);
  d->c.by_result[r]++;
  if (c->x == NULL)
    slot_release(c); /* else once the exchange settles */
  if (c->xkind == ST_XCHG_AVERAGE) {
    if (r == ST_XCHG_OK) {
      d->c.ok++;
      if (done->coded_exchange)
        d->c.xchg_coded++;
      st__robust_record(c, done);
      double ms = (double) (uv_hrtime() / 1000u - c->started_us) / 1e3;
      d->c.exchange_ms_sum += ms;
      d->c.exchange_ms_last = ms;
      st__hist_observe(&d->c.exchange_s, ms / 1e3);
      st__event(d, "exchange", "averaged with %.12s in %.0f ms", id, ms);
    } else if (r == ST_XCHG_BUSY || r == ST_XCHG_NOT_READY)
      d->c.busy++;
    else if (r == ST_XCHG_FAIL_NONFINITE || r == ST_XCHG_FAIL_NORM ||
             r == ST_XCHG_FAIL_SIZE || r == ST_XCHG_FAIL_CODEC)
      d->c.dropped++;
    else
      d->c.failed++;
    if (r != ST_XCHG_OK)
      st__event(d, "exchange", "exchange with %.12s ended: %s", id,
                st_xchg_result_name(r));
  }
  if (r == ST_XCHG_FAIL_NONFINITE || r == ST_XCHG_FAIL_NORM ||
      r == ST_XCHG_FAIL_SIZE)
    st__dwarn(d, "dropped a snapshot from %.12s: %s", id,
              st_xchg_result_name(r));
  if (r == ST_XCHG_FAIL_CODEC)
    st__dwarn(d, "dropped a compressed snapshot from %.12s: %s", id,
              st_codec_drop_name((st_codec_drop_t) done->codec_drop));
  if (r == ST_XCHG_MISMATCH) {
    const char* theirs = peer_model != NULL ? peer_model : "another model";
    if (c->xkind == ST_XCHG_FETCH && c->initiator && d->cfg->attach) {
      st__attach_cluster_mismatch(d, theirs, done->peer_tensors,
                                  done->peer_tensors_len);
    } else if (c->xkind == ST_XCHG_FETCH && c->initiator) {
      char diff[160];
      st__compress_mismatch(theirs, d->local.model, diff, sizeof diff);
      st__daemon_fatal(d,
                       "the cluster runs %s but this node was started "
                       "with %s%s; start it with the cluster's --model, "
                       "--compress and --outer, or join another cluster",
                       theirs, d->local.model, diff);
    } else {
      st__dwarn(d,
                "refused an exchange with %.12s: it runs %s, this node "
                "runs %s",
                id, theirs, d->local.model);
    }
  }
  if ((r == ST_XCHG_FAIL_CLOSED || r == ST_XCHG_FAIL_TIMEOUT) &&
      st_membership_probe_hint(d->m, st__dnow(d), &c->peer) == 0)
    st__net_drain(d); /* probed next: suspected only if it fails that */
  if (c->xkind == ST_XCHG_FETCH && c->initiator && r != ST_XCHG_OK &&
      r != ST_XCHG_MISMATCH)
    st__dlog(d, "state transfer from %.12s failed (%s); trying another peer",
             id, st_xchg_result_name(r));
}

/* The snapshot an AVERAGE's delta is measured from, for the gossip outer
 * step (--outer noloco): float32, the snapshot; compressed, anchor +
 * D(c_own), made in the machine's buffer (nothing reads it after the
 * APPLY), so that own + delta is the pair's decoded mean. What the codec
 * rounded away stays in the parameters (docs/compression.md). NULL when
 * no outer step runs. */
static const float* xchg_own(st__conn_t* c, size_t n) {
  if (c->d->cfg->outer.kind != ST_OUTER_NOLOCO)
    return NULL;
  float* drift = st_xchg_coded_own(c->x);
  if (drift == NULL)
    return st_xchg_own(c->x);
  if (c->anchor == NULL || c->anchor->n != n)
    return NULL;
  for (size_t i = 0; i < n; i++)
    drift[i] += c->anchor->v[i];
  return drift;
}

/* A FETCH's state, its step within the bound: taken (or, held, this
 * node's own parameters kept: the donor's were the same seeded
 * initialization, at step 0), and the node is synchronized. */
static void fetched(st__conn_t* c, const st_xact_t* a) {
  st__daemon_t* d = c->d;
  char id[33];
  st_node_id_format(&c->peer, id);
  if (a->held && a->step != 0) {
    /* A donor offers its start state only at step 0 (fill_held). */
    st__dwarn(d,
              "refused a state transfer from %.12s: it said this node "
              "holds its state, at step %llu",
              id, (unsigned long long) a->step);
    return;
  }
  int rc = a->held ? 0 : st__tt_set_state(d->tt, a->values, a->n, a->step);
  if (rc != 0 || d->state != ST__D_SYNCING)
    return;
  if (a->held)
    st__dlog(d,
             "synchronized from %.12s at step %llu: it holds this node's "
             "own seeded initialization, nothing was sent",
             id, (unsigned long long) a->step);
  else
    st__dlog(d, "synchronized from %.12s at step %llu", id,
             (unsigned long long) a->step);
  d->c.fetches_ok++;
  d->c.fetches_held += a->held;
  st__daemon_synced(d);
}

static void drain_actions(st__conn_t* c);

/* Runs the machine's actions; reading resumes once the machine has room
 * for the peer's frames again (paused in st__xchg_on_message). */
static void drain(st__conn_t* c) {
  drain_actions(c);
  if (c->paused && !c->closing && c->x != NULL && st_xchg_rx_room(c->x))
    st__conn_resume(c);
}

static void drain_actions(st__conn_t* c) {
  st__daemon_t* d = c->d;
  st_xact_t a;
  while (c->x != NULL && st_xchg_next_action(c->x, &a)) {
    switch (a.kind) {
      case ST_XACT_SEND: {
        /* A chunk's buffer goes to its sealing job as it is. */
        uint8_t* taken = a.len >= st__offload_bytes()
                             ? st_xchg_take_send_buffer(c->x, &a)
                             : NULL;
        int rc = taken != NULL ? st__conn_send_taken(c, taken, a.len, true)
                               : st__conn_send(c, a.data, a.len, true);
        if (rc != 0)
          st_xchg_closed(c->x, st__dnow(d));
        break;
      }
      case ST_XACT_WANT_SNAPSHOT: {
        /* The trainer writes straight into the machine's buffer, which
         * lives until the conn is freed (after this request's event). */
        c->snap = st_xchg_snapshot_buffer(c->x);
        if (c->snap == NULL ||
            st__tt_request_snapshot(d->tt, c->id, c->snap) != 0) {
          st_xchg_closed(c->x, st__dnow(d));
          break;
        }
        c->tt_pending++;
        break;
      }
      case ST_XACT_APPLY:
        if (c->xkind == ST_XCHG_FETCH && c->initiator) {
          uint64_t bound = st__robust_step_bound(d, &c->peer);
          if (a.step > bound) {
            char id[33];
            st_node_id_format(&c->peer, id);
            d->c.fetch_step_refused++;
            st__dwarn(d,
                      "refused the state of %.12s: its step %llu is beyond "
                      "what the other members report (at most %llu)",
                      id, (unsigned long long) a.step,
                      (unsigned long long) bound);
            break;
          }
          fetched(c, &a);
        } else {
          /* A clipped move is applied as it is (the outer step's state is
           * not fed a peer robust averaging distrusts). */
          if (!a.clipped)
            st__outer_xchg_apply(d, (float*) a.values, xchg_own(c, a.n), a.n);
          else if (d->cfg->outer.kind == ST_OUTER_NOLOCO)
            d->c.outer_skipped++;
          if (st__tt_request_apply(d->tt, c->id, a.values, 1.0f) == 0)
            c->tt_pending++;
        }
        break;
      case ST_XACT_ENCODE:
      case ST_XACT_DECODE:
        st__compress_submit(c, &a); /* on the pool; st__xchg_codec_done */
        break;
      case ST_XACT_TIMER:
        c->deadline_ms = a.at_ms;
        break;
      case ST_XACT_DONE:
        finish_counts(c, a.result, &a);
        st__xchg_settle(c); /* or once the trainer is done with it */
        /* A peer that did not take the exchange in its time gets a reset:
         * the rest of a transfer is of no use to it, and the kernel would
         * go on sending it megabytes at its pace after a graceful close. */
        if (a.result == ST_XCHG_FAIL_TIMEOUT)
          st__conn_close_reset(c);
        else
          st__conn_close(c);
        break;
    }
  }
}

/* The node's exchange buffer for c's machine when no other machine holds
 * it (NULL: the machine allocates its own). Given back when c's exchange
 * settles, or with c. */
static float* xbuf_take(st__conn_t* c) {
  st__daemon_t* d = c->d;
  size_t n = (size_t) d->local.n_params;
  if (n == 0 || d->xbuf_held)
    return NULL;
  if (d->xbuf == NULL || d->xbuf_n != n) {
    free(d->xbuf);
    d->xbuf = malloc(n * sizeof(float));
    d->xbuf_n = d->xbuf != NULL ? n : 0;
  }
  if (d->xbuf != NULL)
    d->xbuf_held = c->holds_xbuf = true;
  return d->xbuf;
}

static void xbuf_give_back(st__conn_t* c) {
  if (c->holds_xbuf) {
    c->holds_xbuf = false;
    c->d->xbuf_held = false;
  }
}

void st__xchg_on_ready(st__conn_t* c) {
  st__daemon_t* d = c->d;
  st_xchg_local_t l;
  fill_local(c, &l);
  l.n_params = d->local.n_params;
  if (l.n_params > 0)
    l.buf = xbuf_take(c);
  st_xchg_config_t xcfg = st__robust_xchg_config(c);
  if (st_xchg_new_initiator(&xcfg, c->xkind, &l, st__dnow(d), &c->x) != 0) {
    st__conn_close(c);
    return;
  }
  drain(c);
}

void st__xchg_on_message(st__conn_t* c, const uint8_t* msg, size_t len) {
  st__daemon_t* d = c->d;
  if (c->x == NULL && !c->initiator) {
    st_msg_t m;
    if (st_wire_decode(msg, len, &m, &d->wc) != 0 ||
        m.type != ST_MSG_XCHG_REQ) {
      st__conn_close(c);
      return;
    }
    c->xkind = (st_xchg_kind_t) m.u.xchg_req.kind;
    st_xchg_local_t l;
    fill_local(c, &l);
    bool busy = false;
    if (c->xkind == ST_XCHG_AVERAGE) {
      /* Waiting (--min-nodes): at step 0 still, it would pull a peer's
       * trained model back towards the initialization. */
      busy = d->avg_active > 0 || d->state == ST__D_SYNCING ||
             d->state == ST__D_WAITING || d->state == ST__D_LEAVING;
      if (!busy) {
        d->avg_active++;
        c->counted_active = true;
      }
    }
    if (c->xkind == ST_XCHG_FETCH) {
      /* A donor serves ST__FETCH_SERVE_MAX transfers at a time (each
       * holds a copy of the parameters); the slot is freed with the
       * connection (daemon_conn.c). */
      busy = d->fetch_serving >= ST__FETCH_SERVE_MAX;
      if (busy) {
        d->c.fetches_refused++;
      } else {
        d->fetch_serving++;
        c->serving_fetch = true;
      }
    }
    if (!busy && l.n_params > 0)
      l.buf = xbuf_take(c);
    st_xchg_config_t xcfg = st__robust_xchg_config(c);
    if (st_xchg_new_responder(&xcfg, &l, busy, st__dnow(d), &c->x) != 0) {
      st__conn_close(c);
      return;
    }
  }
  if (c->x == NULL)
    return;
  st_xchg_message(c->x, st__dnow(d), msg, len);
  drain(c);
  if (c->x != NULL && !st_xchg_rx_room(c->x) && !c->paused)
    st__conn_pause(c); /* the peer is ahead of us: drain() resumes */
}

void st__xchg_on_closed(st__conn_t* c) {
  st__daemon_t* d = c->d;
  if (c->x != NULL) {
    st_xchg_closed(c->x, st__dnow(d));
    drain(c);
  } else if (c->counted_active) {
    st_xact_t none = {.kind = ST_XACT_DONE, .result = ST_XCHG_FAIL_CLOSED};
    finish_counts(c, ST_XCHG_FAIL_CLOSED, &none);
  }
}

void st__xchg_on_sent(st__conn_t* c) {
  if (c->x == NULL)
    return;
  st_xchg_sent(c->x, st__dnow(c->d));
  drain(c);
}

void st__xchg_on_tt_event(st__daemon_t* d, const st__tt_event_t* ev) {
  st__conn_t* c = st__conn_find(d, ev->tag);
  if (c == NULL)
    return;
  if (ev->kind == ST__TT_EV_SNAPSHOT) {
    if (c->x != NULL && !c->handle_closed) {
      /* No snapshot (an attached program's parameters were not finite):
       * the exchange ends, since the buffer holds no parameters. */
      if (ev->ok)
        st_xchg_snapshot(c->x, st__dnow(d), c->snap, st__tt_n_params(d->tt),
                         ev->step);
      else
        st_xchg_closed(c->x, st__dnow(d));
      drain(c);
    }
    c->snap = NULL;
  }
  st__conn_release(c);
}

void st__xchg_codec_done(st__conn_t* c, bool decode, int rc, int reason) {
  /* Also once the connection is closed: a peer that finished first
   * closes while our DECODE runs, and the exchange ends as it says
   * (gossip/exchange.c, st_xchg_closed). The machine lives until the conn
   * is freed, which waits for this job. */
  if (c->x == NULL)
    return;
  uint64_t now = st__dnow(c->d);
  if (decode)
    st_xchg_decoded(c->x, now, rc, reason);
  else
    st_xchg_encoded(c->x, now, rc);
  drain(c);
}

void st__xchg_sweep(st__daemon_t* d) {
  uint64_t now = st__dnow(d);
  st__conn_t* next;
  for (st__conn_t* c = d->conns; c != NULL; c = next) {
    next = c->next;
    if (c->x != NULL && !c->handle_closed && !c->closing) {
      st_xchg_tick(c->x, now);
      drain(c);
    }
  }
}

/* A random live member other than this node, with a status record; when
 * same_model, only a synchronized one whose fingerprint equals ours; when
 * past_zero, only one whose reported step is past 0 (a donor that has trained:
 * joiners started together would otherwise ask each other, and hear NOT_READY).
 */
static bool pick_from(st__daemon_t* d, bool same_model, bool past_zero,
                      st_member_t* out) {
  size_t n = st_membership_count(d->m);
  if (n < 2)
    return false;
  size_t start = (size_t) st_rng_below(&d->rng, n);
  for (size_t k = 0; k < n; k++) {
    const st_member_t* mb = st_membership_at(d->m, (start + k) % n);
    if (mb == NULL || mb->state != ST_MEMBER_ALIVE || !mb->has_status ||
        memcmp(&mb->id, &d->ident.id, sizeof(mb->id)) == 0)
      continue;
    if (same_model && memcmp(mb->status.fingerprint, d->local.fingerprint,
                             sizeof(d->local.fingerprint)) != 0)
      continue;
    /* Nor one still fetching its state: it would answer BUSY, after this
     * node had set a model-sized buffer aside (or taken the one that a
     * state transfer it serves to that very joiner wants). */
    if (same_model && !mb->status.synced)
      continue;
    if (past_zero && mb->status.step == 0)
      continue;
    /* A donor whose reported step is implausible is not asked. (The copy
     * first: the bound's own queries reuse st_membership_at's buffers.) */
    st_member_t cand = *mb;
    if (!same_model && cand.status.step > st__robust_step_bound(d, &cand.id))
      continue;
    *out = cand;
    return true;
  }
  return false;
}

/* An averaging partner (same_model), or a donor: one that has trained if
 * there is one, else any. */
static bool pick_peer(st__daemon_t* d, bool same_model, st_member_t* out) {
  if (same_model)
    return pick_from(d, true, false, out);
  return pick_from(d, false, true, out) || pick_from(d, false, false, out);
}

static void start_exchange(st__daemon_t* d, const st_member_t* peer,
                           st_xchg_kind_t kind) {
  st__conn_t* c = st__conn_dial(d, &peer->addr, &peer->id, ST__CONN_XCHG);
  if (c == NULL)
    return;
  c->peer = peer->id;
  c->xkind = kind;
  c->counted_active = true;
  if (kind == ST_XCHG_FETCH)
    d->fetch_active = true;
  else
    d->avg_active++;
}

void st__xchg_gossip_tick(st__daemon_t* d) {
  st__robust_refresh(d); /* who counts, as members come and go */
  if ((d->state != ST__D_TRAINING && d->state != ST__D_DONE) ||
      d->avg_active > 0)
    return;
  st_member_t peer;
  if (pick_peer(d, true, &peer))
    start_exchange(d, &peer, ST_XCHG_AVERAGE);
}

/* Whether every live member but this node has a status record: the steps
 * a donor's is judged against (st__robust_step_bound). */
static bool statuses_known(const st__daemon_t* d) {
  size_t n = st_membership_count(d->m);
  for (size_t i = 0; i < n; i++) {
    const st_member_t* mb = st_membership_at(d->m, i);
    if (mb != NULL && mb->state == ST_MEMBER_ALIVE && !mb->has_status &&
        memcmp(&mb->id, &d->ident.id, sizeof(mb->id)) != 0)
      return false;
  }
  return true;
}

void st__xchg_sync_tick(st__daemon_t* d) {
  if (d->state != ST__D_SYNCING || d->fetch_active)
    return;
  /* A joiner first hears every member's status (or waits SYNC_WAIT_TICKS
   * for it): a donor's step is believed only next to the others'. */
  if (++d->sync_ticks < SYNC_WAIT_TICKS && !statuses_known(d))
    return;
  if (st__sync_tick(d))
    return; /* several donors at once (daemon_sync.c) */
  st_member_t peer;
  if (!pick_peer(d, false, &peer)) {
    if (++d->fetch_attempts % SYNC_RETRY_LOG_EVERY == 0)
      st__dlog(d,
               "waiting for a live peer to synchronize from (%zu members "
               "known)",
               st_membership_count(d->m));
    return;
  }
  d->fetch_attempts++;
  start_exchange(d, &peer, ST_XCHG_FETCH);
}
