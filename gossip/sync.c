/* sync.c: the plan of a multi-donor state sync (gossip.h, "Multi-donor
 * state sync"): which manifest the donors agree on, which donor fetches
 * which chunks, and the check of every chunk against its hash. No I/O: the
 * node's driver (node/daemon/daemon_sync.c) dials the donors and feeds
 * their answers here.
 *
 * Chunks are in one of three states: in the pool, out (with one donor's
 * range), verified. A range is a run of pool chunks taken at once; its
 * chunks arrive in order, each checked as it comes, so a donor that fails
 * halfway has delivered a verified prefix and only the rest goes back to
 * the pool. A donor that sends a bad chunk or breaks the order is dropped:
 * a hostile donor costs the joiner one chunk of bandwidth, never a wrong
 * float.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/gossip.h"

typedef enum { C_POOL = 0, C_OUT, C_DONE } chunk_state_t;

typedef struct {
  bool has;      /* a usable manifest came */
  bool agreeing; /* holds the agreed manifest */
  bool dropped;  /* failed: given no more ranges */
  uint8_t id[ST_XCHG_ANCHOR_BYTES];
  uint64_t round;
  uint64_t step;
  uint8_t* hashes;             /* n_chunks * ST_SYNC_HASH_BYTES */
  bool out;                    /* a range is out */
  uint64_t first, count, next; /* the range; next: the chunk expected */
} donor_t;

struct st_sync_plan_s {
  uint64_t n_params;
  uint64_t n_chunks;
  uint8_t* state; /* chunk_state_t per chunk */
  uint64_t verified;
  bool agreed;
  unsigned source; /* the donor whose manifest was agreed on */
  uint64_t step;   /* the agreeing donors' smallest */
  donor_t donors[ST_SYNC_MAX_DONORS];
};

uint64_t st_sync_chunks(uint64_t n_params) {
  return n_params / ST_SYNC_CHUNK_FLOATS +
         (n_params % ST_SYNC_CHUNK_FLOATS != 0);
}

int st_sync_plan_new(uint64_t n_params, st_sync_plan_t** out) {
  *out = NULL;
  uint64_t chunks = st_sync_chunks(n_params);
  if (n_params == 0 || chunks > ST_SYNC_MAX_CHUNKS)
    return -EINVAL;
  st_sync_plan_t* p = calloc(1, sizeof *p);
  if (p == NULL)
    return -ENOMEM;
  p->state = calloc((size_t) chunks, 1);
  if (p->state == NULL) {
    free(p);
    return -ENOMEM;
  }
  p->n_params = n_params;
  p->n_chunks = chunks;
  *out = p;
  return 0;
}

void st_sync_plan_free(st_sync_plan_t* p) {
  if (p == NULL)
    return;
  for (unsigned i = 0; i < ST_SYNC_MAX_DONORS; i++)
    free(p->donors[i].hashes);
  free(p->state);
  free(p);
}

int st_sync_plan_manifest(st_sync_plan_t* p, unsigned donor,
                          const st_msg_sync_reply_t* r) {
  static const uint8_t none[ST_XCHG_ANCHOR_BYTES];
  if (donor >= ST_SYNC_MAX_DONORS)
    return -EINVAL;
  if (p->agreed)
    return -EBUSY;
  size_t bytes = (size_t) p->n_chunks * ST_SYNC_HASH_BYTES;
  if (r->status != ST_SYNC_STATUS_OK || r->n_params != p->n_params ||
      r->hashes_len != bytes || r->hashes == NULL ||
      memcmp(r->anchor, none, sizeof none) == 0)
    return -EINVAL;
  donor_t* d = &p->donors[donor];
  uint8_t* h = realloc(d->hashes, bytes);
  if (h == NULL)
    return -ENOMEM;
  memcpy(h, r->hashes, bytes);
  d->hashes = h;
  d->has = true;
  memcpy(d->id, r->anchor, sizeof d->id);
  d->round = r->round;
  d->step = r->step;
  return 0;
}

static bool same_manifest(const st_sync_plan_t* p, const donor_t* a,
                          const donor_t* b) {
  return a->has && b->has && a->round == b->round &&
         memcmp(a->id, b->id, sizeof a->id) == 0 &&
         memcmp(a->hashes, b->hashes,
                (size_t) p->n_chunks * ST_SYNC_HASH_BYTES) == 0;
}

unsigned st_sync_plan_agree(st_sync_plan_t* p, unsigned min_agree) {
  if (p->agreed)
    return st_sync_plan_usable_count(p);
  if (min_agree < 2)
    min_agree = 2;
  unsigned best = ST_SYNC_MAX_DONORS, best_n = 0;
  uint64_t best_step = 0;
  for (unsigned i = 0; i < ST_SYNC_MAX_DONORS; i++) {
    if (!p->donors[i].has)
      continue;
    unsigned n = 0;
    uint64_t low = UINT64_MAX;
    for (unsigned j = 0; j < ST_SYNC_MAX_DONORS; j++) {
      if (same_manifest(p, &p->donors[i], &p->donors[j])) {
        n++;
        if (p->donors[j].step < low)
          low = p->donors[j].step;
      }
    }
    if (n > best_n || (n == best_n && n > 0 && low > best_step)) {
      best = i;
      best_n = n;
      best_step = low;
    }
  }
  if (best_n < min_agree)
    return 0;
  p->agreed = true;
  p->source = best;
  p->step = best_step;
  for (unsigned j = 0; j < ST_SYNC_MAX_DONORS; j++)
    p->donors[j].agreeing = same_manifest(p, &p->donors[best], &p->donors[j]);
  return best_n;
}

void st_sync_plan_agreed(const st_sync_plan_t* p,
                         uint8_t id[ST_XCHG_ANCHOR_BYTES], uint64_t* round,
                         uint64_t* step) {
  const donor_t* d = &p->donors[p->agreed ? p->source : 0];
  memcpy(id, d->id, ST_XCHG_ANCHOR_BYTES);
  *round = p->agreed ? d->round : 0;
  *step = p->agreed ? p->step : 0;
}

bool st_sync_plan_usable(const st_sync_plan_t* p, unsigned donor) {
  return p->agreed && donor < ST_SYNC_MAX_DONORS && p->donors[donor].agreeing &&
         !p->donors[donor].dropped;
}

unsigned st_sync_plan_usable_count(const st_sync_plan_t* p) {
  unsigned n = 0;
  for (unsigned i = 0; i < ST_SYNC_MAX_DONORS; i++)
    n += st_sync_plan_usable(p, i);
  return n;
}

bool st_sync_plan_take(st_sync_plan_t* p, unsigned donor, uint64_t max_chunks,
                       uint64_t* first, uint64_t* count) {
  if (!st_sync_plan_usable(p, donor) || p->donors[donor].out || max_chunks == 0)
    return false;
  uint64_t i = 0;
  while (i < p->n_chunks && p->state[i] != C_POOL)
    i++;
  if (i == p->n_chunks)
    return false;
  uint64_t n = 0;
  while (i + n < p->n_chunks && n < max_chunks && p->state[i + n] == C_POOL)
    p->state[i + n++] = C_OUT;
  donor_t* d = &p->donors[donor];
  d->out = true;
  d->first = d->next = i;
  d->count = n;
  *first = i;
  *count = n;
  return true;
}

void st_sync_plan_end(st_sync_plan_t* p, unsigned donor, bool drop) {
  if (donor >= ST_SYNC_MAX_DONORS)
    return;
  donor_t* d = &p->donors[donor];
  if (drop)
    d->dropped = true;
  if (!d->out)
    return;
  for (uint64_t c = d->next; c < d->first + d->count; c++)
    if (p->state[c] == C_OUT)
      p->state[c] = C_POOL;
  d->out = false;
}

st_sync_chunk_t st_sync_plan_chunk(st_sync_plan_t* p, unsigned donor,
                                   uint64_t offset, const uint8_t* data,
                                   size_t len, uint64_t* chunk) {
  donor_t* d = donor < ST_SYNC_MAX_DONORS ? &p->donors[donor] : NULL;
  if (d == NULL || !d->out || d->next >= d->first + d->count) {
    if (d != NULL)
      st_sync_plan_end(p, donor, true);
    return ST_SYNC_CHUNK_ORDER;
  }
  uint64_t c = d->next;
  uint64_t start = c * ST_SYNC_CHUNK_FLOATS;
  uint64_t floats = p->n_params - start < ST_SYNC_CHUNK_FLOATS
                        ? p->n_params - start
                        : ST_SYNC_CHUNK_FLOATS;
  if (offset != start || len != floats * sizeof(float)) {
    st_sync_plan_end(p, donor, true);
    return ST_SYNC_CHUNK_ORDER;
  }
  uint8_t h[ST_SYNC_HASH_BYTES];
  st_hash_once(data, len, h, sizeof h);
  /* The agreed manifest's hash: every agreeing donor holds the same. */
  const uint8_t* want =
      p->donors[p->source].hashes + (size_t) c * ST_SYNC_HASH_BYTES;
  if (memcmp(h, want, sizeof h) != 0) {
    st_sync_plan_end(p, donor, true);
    return ST_SYNC_CHUNK_BAD;
  }
  if (p->state[c] != C_DONE) {
    p->state[c] = C_DONE;
    p->verified++;
  }
  d->next = c + 1;
  *chunk = c;
  return ST_SYNC_CHUNK_OK;
}

bool st_sync_plan_busy(const st_sync_plan_t* p, unsigned donor) {
  return donor < ST_SYNC_MAX_DONORS && p->donors[donor].out;
}

bool st_sync_plan_complete(const st_sync_plan_t* p) {
  return p->verified == p->n_chunks;
}

uint64_t st_sync_plan_verified(const st_sync_plan_t* p) {
  return p->verified;
}
