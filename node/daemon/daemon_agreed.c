/* daemon_agreed.c: the agreed state. A ring round ends with every member
 * holding the same vector, bit for bit (the all-gather copies the same
 * floats to all; the outer optimizer's step is the same arithmetic on the
 * same inputs). A node keeps the one of the last round it finished, named
 * by its id (docs/protocol.md), for two uses:
 *
 * - the anchor of compressed averaging (daemon_compress.c): two nodes that
 *   name the same id send each other their drift from it;
 * - the state a joining node fetches from several donors at once
 *   (daemon_sync.c), every chunk checked against a manifest of chunk
 *   hashes that at least two donors sent alike. The manifest is made when
 *   a joiner first asks for it, so a cluster nobody joins never pays for
 *   it.
 *
 * Cost: one copy of the parameters, copied at each round on the loop
 * thread; its id (a pass of BLAKE2b) and manifest only when asked for.
 */
#include "node/daemon/daemon_internal.h"

#include <stdlib.h>
#include <string.h>

static const char ANCHOR_DOMAIN[] = "starling-anchor-v1";

st__anchor_t* st__anchor_ref(st__anchor_t* a) {
  if (a != NULL)
    a->refs++;
  return a;
}

void st__anchor_release(st__anchor_t* a) {
  if (a != NULL && --a->refs == 0) {
    free(a->hashes);
    free(a);
  }
}

void st__agreed_id(const float* v, size_t n, uint64_t round_id,
                   uint8_t id[ST_XCHG_ANCHOR_BYTES]) {
  st_hash_t h;
  uint8_t full[ST_HASH_BYTES];
  uint8_t hdr[16];
  for (int i = 0; i < 8; i++) {
    hdr[i] = (uint8_t) (round_id >> (8 * i));
    hdr[8 + i] = (uint8_t) ((uint64_t) n >> (8 * i));
  }
  st_hash_init(&h);
  st_hash_update(&h, ANCHOR_DOMAIN, sizeof ANCHOR_DOMAIN - 1);
  st_hash_update(&h, hdr, sizeof hdr);
  st_hash_update(&h, v, n * sizeof(float));
  st_hash_final(&h, full);
  memcpy(id, full, ST_XCHG_ANCHOR_BYTES);
  if (id[0] == 0) /* never all zero: that is "none" */
    id[0] = 1;
}

st__anchor_t* st__anchor_new(size_t n) {
  st__anchor_t* a = malloc(sizeof *a + n * sizeof(float));
  if (a == NULL)
    return NULL;
  memset(a, 0, sizeof *a);
  a->refs = 1;
  a->n = n;
  return a;
}

void st__agreed_take(st__daemon_t* d, st__anchor_t* a) {
  st__anchor_release(d->anchor);
  d->anchor = a;
  /* The start anchor served until there was an agreed state. */
  st__anchor_release(d->start_anchor);
  d->start_anchor = NULL;
}

void st__agreed_ring_done(st__daemon_t* d, const float* v, size_t n,
                          uint64_t round_id) {
  if (v == NULL || n == 0)
    return;
  st__anchor_t* a = st__anchor_new(n);
  if (a == NULL) {
    st__dwarn(d,
              "no memory for the agreed state (%zu floats): compressed "
              "averaging sends float32 and joiners cannot fetch it from "
              "this node until the next ring round",
              n);
    st__anchor_release(d->anchor);
    d->anchor = NULL;
    return;
  }
  a->round = round_id;
  memcpy(a->v, v, n * sizeof(float));
  st__agreed_take(d, a);
  d->c.anchors++;
}

const uint8_t* st__agreed_id_of(st__anchor_t* a) {
  if (!a->id_made) {
    st__agreed_id(a->v, a->n, a->round, a->id);
    a->id_made = true;
  }
  return a->id;
}

const uint8_t* st__agreed_hashes(st__anchor_t* a) {
  if (a->hashes != NULL)
    return a->hashes;
  uint64_t chunks = st_sync_chunks(a->n);
  if (chunks > ST_SYNC_MAX_CHUNKS)
    return NULL;
  a->hashes = malloc((size_t) chunks * ST_SYNC_HASH_BYTES);
  if (a->hashes == NULL)
    return NULL;
  for (uint64_t c = 0; c < chunks; c++) {
    size_t first = (size_t) c * ST_SYNC_CHUNK_FLOATS;
    size_t len = a->n - first < ST_SYNC_CHUNK_FLOATS ? a->n - first
                                                     : ST_SYNC_CHUNK_FLOATS;
    st_hash_once(a->v + first, len * sizeof(float),
                 a->hashes + c * ST_SYNC_HASH_BYTES, ST_SYNC_HASH_BYTES);
  }
  return a->hashes;
}
