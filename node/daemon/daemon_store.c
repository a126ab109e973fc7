/* daemon_store.c: the tensors programs publish on this node, and the
 * fetches of them by other members (docs/collectives.md, "Publish and
 * fetch"; docs/protocol.md, COLL_FETCH). Publishing is one-sided: a
 * program hands the node a named tensor (daemon_coll_session.c's
 * "publish"), the node keeps a copy until the name is published again or
 * unpublished, and any member may fetch it at any time, with no call by
 * the publisher's program, which may have gone.
 *
 * A fetch is a broadcast over the pair (daemon_coll.c's machine), rooted
 * at the publisher, with the id the fetching node chose: its ASK names the
 * tensor; this node answers by starting that broadcast on the entry's
 * bytes (borrowed, not copied: an entry is counted, and one replaced
 * while being served lives until its fetches end), or refuses with
 * MISSING or BUSY: busy while more than ST__STORE_QUEUED_FRAMES frames
 * (256 MiB of segments) wait to be written to that member, or twice that
 * to all members, since a serve queues its sealed frames at once. The
 * client library retries a busy fetch until its timeout.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/daemon/daemon_internal.h"

struct st__store_entry_s {
  struct st__store_entry_s* next;
  char name[ST__COLL_NAME_MAX];
  size_t name_len;
  st_coll_dtype_t dtype;
  uint64_t count, version;
  unsigned refs; /* the store's, while listed, and one per serve */
  size_t bytes;
  uint8_t data[];
};
typedef struct st__store_entry_s entry_t;

static void unref(entry_t* e) {
  if (--e->refs == 0)
    free(e);
}

static entry_t** find(st__daemon_t* d, const char* name, size_t len) {
  entry_t** p = &d->store.entries;
  while (*p != NULL &&
         !((*p)->name_len == len && memcmp((*p)->name, name, len) == 0))
    p = &(*p)->next;
  return p;
}

int st__store_publish(st__daemon_t* d, const char* name, size_t len,
                      st_coll_dtype_t dtype, uint64_t count, const void* data,
                      uint64_t* version, char* err, size_t err_len) {
  size_t bytes = (size_t) (count * st_coll_elem_bytes(dtype));
  entry_t** p = find(d, name, len);
  size_t held = d->store.bytes - (*p != NULL ? (*p)->bytes : 0);
  if (bytes > ST__STORE_MAX_BYTES - held) {
    st_set_err(err, err_len,
               "the node keeps at most %u MiB of published tensors and holds "
               "%zu bytes besides this one: unpublish some first",
               (unsigned) (ST__STORE_MAX_BYTES >> 20), held);
    return -ENOSPC;
  }
  if (*p == NULL && d->store.n >= ST__STORE_MAX_NAMES) {
    st_set_err(err, err_len,
               "the node keeps at most %u published names: unpublish some "
               "first",
               ST__STORE_MAX_NAMES);
    return -ENOSPC;
  }
  entry_t* e = malloc(sizeof(*e) + (bytes > 0 ? bytes : 1));
  if (e == NULL) {
    st_set_err(err, err_len, "out of memory for %zu bytes", bytes);
    return -ENOMEM;
  }
  memcpy(e->name, name, len);
  e->name_len = len;
  e->dtype = dtype;
  e->count = count;
  e->bytes = bytes;
  e->refs = 1;
  if (bytes > 0)
    memcpy(e->data, data, bytes);
  e->version = *p != NULL ? (*p)->version + 1 : 1;
  if (*p != NULL) {
    entry_t* old = *p;
    e->next = old->next;
    d->store.bytes -= old->bytes;
    unref(old);
  } else {
    e->next = NULL;
    d->store.n++;
  }
  *p = e;
  d->store.bytes += bytes;
  d->c.store_published++;
  *version = e->version;
  return 0;
}

int st__store_unpublish(st__daemon_t* d, const char* name, size_t len) {
  entry_t** p = find(d, name, len);
  if (*p == NULL)
    return -ENOENT;
  entry_t* e = *p;
  *p = e->next;
  d->store.n--;
  d->store.bytes -= e->bytes;
  unref(e);
  return 0;
}

/* Sends a refusal of op_id to the member that asked. */
static void refuse(st__conn_t* c, uint64_t op_id, uint8_t code,
                   const char* text) {
  st_msg_t m = {.type = ST_MSG_COLL_FETCH};
  m.u.coll_fetch = (st_msg_coll_fetch_t){.op_id = op_id,
                                         .code = code,
                                         .text = text,
                                         .text_len = (uint32_t) strlen(text)};
  if (code == ST_COLL_FETCH_BUSY)
    c->d->c.store_busy++;
  else
    c->d->c.store_missing++;
  st__coll_send_msg(c->d, &c->peer, &m);
}

/* Whether one more fetch by peer may be served now: a serve queues all
 * its frames at once (the broadcast's root sends every segment as it
 * starts), so a member that asks faster than it reads, or many members at
 * once, would otherwise grow this node's send queues without bound. */
static bool room_for(st__daemon_t* d, const st_node_id_t* peer) {
  uint64_t mine = st__coll_frames_queued(d, peer);
  uint64_t all = st__coll_frames_queued(d, NULL);
  return mine <= ST__STORE_QUEUED_FRAMES && all <= 2 * ST__STORE_QUEUED_FRAMES;
}

/* The pair {this node, c's member} into g; false (counted as dropped)
 * when that member is not alive here: a non-member gets no answer, not
 * even a refusal. */
static bool pair_of(st__conn_t* c, st__coll_group_t* g) {
  st_node_id_t ids[2] = {c->d->ident.id, c->peer};
  char err[200];
  if (st__coll_group(c->d, ids, 2, false, g, err, sizeof err) == 0)
    return true;
  c->d->c.coll_dropped++;
  return false;
}

int st__store_on_ask(st__conn_t* c, const st_msg_coll_fetch_t* f) {
  st__daemon_t* d = c->d;
  st__coll_group_t g;
  if (!pair_of(c, &g))
    return 1;
  char name[ST__COLL_NAME_MAX + 1];
  size_t len =
      f->text_len < ST__COLL_NAME_MAX ? f->text_len : ST__COLL_NAME_MAX;
  memcpy(name, f->text, len);
  name[len] = '\0';
  entry_t* e = *find(d, f->text, len);
  char text[ST__COLL_NAME_MAX + 200];
  st__coll_op_t* op = NULL;
  if (e == NULL) {
    snprintf(text, sizeof text, "nothing is published under \"%s\" there",
             name);
    refuse(c, f->op_id, ST_COLL_FETCH_MISSING, text);
  } else if (!room_for(d, &c->peer)) {
    snprintf(text, sizeof text,
             "it serves as many fetches as it may at once; try again");
    refuse(c, f->op_id, ST_COLL_FETCH_BUSY, text);
  } else {
    op = calloc(1, sizeof(*op));
  }
  if (op == NULL) {
    st__coll_group_free(&g);
    return 1;
  }
  op->g = g;
  op->g.op_id = f->op_id;
  op->kind = ST_COLL_BROADCAST;
  op->rop = ST_COLL_SUM;
  op->dtype = e->dtype;
  op->count = e->count;
  op->root = op->g.rank;
  op->shm_off = -1;
  op->work = e->data;
  op->no_result = true;
  op->serving = e;
  e->refs++;
  op->deadline_ms = st__dnow(d) + ST__STORE_SERVE_MS;
  if (st__coll_start(d, op, NULL) != 0) {
    unref(e);
    st__coll_group_free(&op->g);
    free(op);
    return 1;
  }
  return 0;
}

void st__store_served(st__daemon_t* d, st__coll_op_t* op,
                      st_coll_result_t result) {
  if (result == ST_COLL_OK)
    d->c.store_served++;
  unref(op->serving);
  st_coll_free(op->m);
  st__coll_group_free(&op->g);
  free(op);
}

void st__store_close(st__daemon_t* d) {
  while (d->store.entries != NULL) {
    entry_t* e = d->store.entries;
    d->store.entries = e->next;
    unref(e);
  }
  d->store.n = 0;
  d->store.bytes = 0;
}
