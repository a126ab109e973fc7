/* wire_same.h: field-by-field equality of decoded wire messages (NaN
 * floats equal to NaN, tensor chunks by content), shared by the wire Check
 * suites and the wire fuzz target's round-trip oracle. Test-only,
 * header-only. */
#ifndef STARLING_TESTS_WIRE_SAME_H
#define STARLING_TESTS_WIRE_SAME_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "gossip/gossip.h"

static int f32_same(float a, float b) {
  return (isnan(a) && isnan(b)) || memcmp(&a, &b, 4) == 0;
}

static int addr_same(const st_wire_addr_t* a, const st_wire_addr_t* b) {
  return a->ip_len == b->ip_len && a->port == b->port &&
         memcmp(a->ip, b->ip, a->ip_len) == 0;
}

static int msg_same(const st_msg_t* a, const st_msg_t* b) {
  if (a->type != b->type)
    return 0;
  switch (a->type) {
    case ST_MSG_HS1:
      return memcmp(&a->u.hs1, &b->u.hs1, sizeof a->u.hs1) == 0;
    case ST_MSG_HS2:
      return memcmp(&a->u.hs2, &b->u.hs2, sizeof a->u.hs2) == 0;
    case ST_MSG_HS3:
      return memcmp(&a->u.hs3, &b->u.hs3, sizeof a->u.hs3) == 0;
    case ST_MSG_PING:
      return a->u.ping.seq == b->u.ping.seq &&
             memcmp(&a->u.ping.target, &b->u.ping.target, 16) == 0;
    case ST_MSG_PING_REQ:
      return a->u.ping_req.seq == b->u.ping_req.seq &&
             memcmp(&a->u.ping_req.target, &b->u.ping_req.target, 16) == 0 &&
             addr_same(&a->u.ping_req.target_addr,
                       &b->u.ping_req.target_addr) &&
             a->u.ping_req.want_nack == b->u.ping_req.want_nack;
    case ST_MSG_ACK:
    case ST_MSG_NACK:
      return a->u.ack.seq == b->u.ack.seq;
    case ST_MSG_ALIVE:
      return memcmp(&a->u.alive.node, &b->u.alive.node, 16) == 0 &&
             a->u.alive.incarnation == b->u.alive.incarnation &&
             addr_same(&a->u.alive.addr, &b->u.alive.addr) &&
             memcmp(a->u.alive.public_key, b->u.alive.public_key, 32) == 0 &&
             memcmp(a->u.alive.signature, b->u.alive.signature, 64) == 0;
    case ST_MSG_SUSPECT: /* no signature on the wire */
      return memcmp(&a->u.suspect.node, &b->u.suspect.node, 16) == 0 &&
             a->u.suspect.incarnation == b->u.suspect.incarnation &&
             memcmp(&a->u.suspect.from, &b->u.suspect.from, 16) == 0;
    case ST_MSG_DEAD:
      return memcmp(&a->u.dead, &b->u.dead, sizeof a->u.dead) == 0;
    case ST_MSG_STATUS: {
      const st_msg_status_t *x = &a->u.status, *y = &b->u.status;
      return memcmp(&x->node, &y->node, 16) == 0 && x->seq == y->seq &&
             x->step == y->step && f32_same(x->loss, y->loss) &&
             f32_same(x->accuracy, y->accuracy) &&
             f32_same(x->samples_per_sec, y->samples_per_sec) &&
             memcmp(x->fingerprint, y->fingerprint, 16) == 0 &&
             x->ring_capable == y->ring_capable && x->synced == y->synced &&
             x->n_keys == y->n_keys &&
             memcmp(x->keys, y->keys, x->n_keys) == 0 &&
             memcmp(x->signature, y->signature, 64) == 0;
    }
    case ST_MSG_PUSH_PULL: {
      const st_msg_push_pull_t *x = &a->u.push_pull, *y = &b->u.push_pull;
      if (x->is_reply != y->is_reply || x->n_entries != y->n_entries)
        return 0;
      for (uint32_t i = 0; i < x->n_entries; i++) {
        const st_push_pull_entry_t *e = &x->entries[i], *f = &y->entries[i];
        if (memcmp(&e->node, &f->node, 16) != 0 ||
            e->incarnation != f->incarnation || e->state != f->state ||
            !addr_same(&e->addr, &f->addr) ||
            memcmp(e->public_key, f->public_key, 32) != 0 ||
            memcmp(e->signature, f->signature, 64) != 0)
          return 0;
      }
      return 1;
    }
    case ST_MSG_TENSOR_CHUNK: {
      const st_msg_tensor_chunk_t *x = &a->u.chunk, *y = &b->u.chunk;
      return x->transfer_id == y->transfer_id && x->offset == y->offset &&
             x->total == y->total && x->data_len == y->data_len &&
             (x->data_len == 0 || memcmp(x->data, y->data, x->data_len) == 0);
    }
    case ST_MSG_XCHG_REQ: {
      const st_msg_xchg_req_t *x = &a->u.xchg_req, *y = &b->u.xchg_req;
      return x->kind == y->kind &&
             memcmp(x->fingerprint, y->fingerprint, 16) == 0 &&
             strcmp(x->model, y->model) == 0 && x->n_params == y->n_params &&
             x->step == y->step && memcmp(x->anchor, y->anchor, 16) == 0;
    }
    case ST_MSG_XCHG_REPLY: {
      const st_msg_xchg_reply_t *x = &a->u.xchg_reply, *y = &b->u.xchg_reply;
      return x->status == y->status &&
             memcmp(x->fingerprint, y->fingerprint, 16) == 0 &&
             strcmp(x->model, y->model) == 0 && x->n_params == y->n_params &&
             x->step == y->step && memcmp(x->anchor, y->anchor, 16) == 0 &&
             x->tensors_len == y->tensors_len &&
             (x->tensors_len == 0 ||
              memcmp(x->tensors, y->tensors, x->tensors_len) == 0);
    }
    case ST_MSG_XCHG_DONE:
      return memcmp(a->u.xchg_done.hash, b->u.xchg_done.hash,
                    sizeof a->u.xchg_done.hash) == 0;
    case ST_MSG_XCHG_CODED: {
      const st_msg_xchg_coded_t *x = &a->u.xchg_coded, *y = &b->u.xchg_coded;
      return x->offset == y->offset && x->total == y->total &&
             x->data_len == y->data_len &&
             (x->data_len == 0 || memcmp(x->data, y->data, x->data_len) == 0);
    }
    case ST_MSG_SYNC_REQ: {
      const st_msg_sync_req_t *x = &a->u.sync_req, *y = &b->u.sync_req;
      return x->kind == y->kind &&
             memcmp(x->fingerprint, y->fingerprint, 16) == 0 &&
             x->n_params == y->n_params &&
             memcmp(x->anchor, y->anchor, sizeof x->anchor) == 0 &&
             x->first == y->first && x->count == y->count;
    }
    case ST_MSG_SYNC_REPLY: {
      const st_msg_sync_reply_t *x = &a->u.sync_reply, *y = &b->u.sync_reply;
      return x->status == y->status &&
             memcmp(x->anchor, y->anchor, sizeof x->anchor) == 0 &&
             x->round == y->round && x->step == y->step &&
             x->n_params == y->n_params && x->hashes_len == y->hashes_len &&
             (x->hashes_len == 0 ||
              memcmp(x->hashes, y->hashes, x->hashes_len) == 0);
    }
    case ST_MSG_RING_SEG: {
      const st_msg_ring_seg_t *x = &a->u.ring_seg, *y = &b->u.ring_seg;
      return x->round_id == y->round_id && x->phase == y->phase &&
             x->step == y->step && x->chunk == y->chunk &&
             x->offset == y->offset && x->data_len == y->data_len &&
             (x->data_len == 0 || memcmp(x->data, y->data, x->data_len) == 0);
    }
    case ST_MSG_RING_PROPOSE: {
      const st_msg_ring_propose_t *x = &a->u.ring_propose,
                                  *y = &b->u.ring_propose;
      return x->round_id == y->round_id &&
             memcmp(&x->proposer, &y->proposer, 16) == 0 &&
             x->n_members == y->n_members &&
             (x->n_members == 0 ||
              memcmp(x->members, y->members, 16 * (size_t) x->n_members) == 0);
    }
    case ST_MSG_RING_ACCEPT:
      return a->u.ring_accept.round_id == b->u.ring_accept.round_id &&
             a->u.ring_accept.accept == b->u.ring_accept.accept &&
             memcmp(a->u.ring_accept.tag, b->u.ring_accept.tag,
                    ST_RING_TAG_BYTES) == 0;
    case ST_MSG_RING_CONFIRM: {
      const st_msg_ring_confirm_t *x = &a->u.ring_confirm,
                                  *y = &b->u.ring_confirm;
      return x->round_id == y->round_id && x->n_members == y->n_members &&
             memcmp(x->tag, y->tag, ST_RING_TAG_BYTES) == 0 &&
             (x->n_members == 0 ||
              memcmp(x->members, y->members, 16 * (size_t) x->n_members) == 0);
    }
    case ST_MSG_RING_CANCEL:
      return a->u.ring_cancel.round_id == b->u.ring_cancel.round_id;
    case ST_MSG_RING_LANE:
      return a->u.ring_lane.round_id == b->u.ring_lane.round_id &&
             a->u.ring_lane.lane == b->u.ring_lane.lane &&
             a->u.ring_lane.lanes == b->u.ring_lane.lanes;
    case ST_MSG_COLL_HELLO: {
      const st_msg_coll_hello_t *x = &a->u.coll_hello, *y = &b->u.coll_hello;
      return x->op_id == y->op_id && x->kind == y->kind && x->rop == y->rop &&
             x->dtype == y->dtype && x->root == y->root &&
             x->count == y->count && x->n == y->n &&
             x->members_hash == y->members_hash && x->data_len == y->data_len &&
             (x->data_len == 0 || memcmp(x->data, y->data, x->data_len) == 0);
    }
    case ST_MSG_COLL_SEG: {
      const st_msg_coll_seg_t *x = &a->u.coll_seg, *y = &b->u.coll_seg;
      return x->op_id == y->op_id && x->phase == y->phase &&
             x->step == y->step && x->offset == y->offset &&
             x->data_len == y->data_len &&
             (x->data_len == 0 || memcmp(x->data, y->data, x->data_len) == 0);
    }
    case ST_MSG_COLL_ABORT:
      /* A reasonless ABORT (a withdrawal) decodes with reason NULL. */
      return a->u.coll_abort.op_id == b->u.coll_abort.op_id &&
             a->u.coll_abort.reason_len == b->u.coll_abort.reason_len &&
             (a->u.coll_abort.reason_len == 0 ||
              memcmp(a->u.coll_abort.reason, b->u.coll_abort.reason,
                     a->u.coll_abort.reason_len) == 0);
    case ST_MSG_COLL_FETCH:
      return a->u.coll_fetch.op_id == b->u.coll_fetch.op_id &&
             a->u.coll_fetch.code == b->u.coll_fetch.code &&
             a->u.coll_fetch.text_len == b->u.coll_fetch.text_len &&
             (a->u.coll_fetch.text_len == 0 ||
              memcmp(a->u.coll_fetch.text, b->u.coll_fetch.text,
                     a->u.coll_fetch.text_len) == 0);
    case ST_MSG_ADMIN_REQ: {
      const st_msg_admin_req_t *x = &a->u.admin_req, *y = &b->u.admin_req;
      return x->op == y->op && x->key_id == y->key_id &&
             x->subject_len == y->subject_len &&
             memcmp(x->subject, y->subject, x->subject_len) == 0;
    }
    case ST_MSG_ADMIN_REPLY: {
      const st_msg_admin_reply_t *x = &a->u.admin_reply, *y = &b->u.admin_reply;
      return x->result == y->result && x->n_keys == y->n_keys &&
             memcmp(x->keys, y->keys, x->n_keys) == 0 &&
             x->reason_len == y->reason_len &&
             (x->reason_len == 0 ||
              memcmp(x->reason, y->reason, x->reason_len) == 0);
    }
  }
  return 0;
}

#endif
