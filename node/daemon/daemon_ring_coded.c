/* daemon_ring_coded.c: coded ring rounds under --compress (issue #16;
 * gossip.h, "Coded rounds"; docs/compression.md, "The ring").
 *
 * A ring round goes coded when every member holds the same anchor (the
 * agreed state of the last round they all took part in): formation's tag
 * is the anchor's id, and a round has a tag only when all its members
 * named it (gossip/ring_form.c). The machine then averages the drifts
 * from that anchor, small next to the parameters, each segment in the
 * codec, and gives anchor + mean drift as the mean: the same bits on every
 * member, the next agreed state.
 *
 * The ring's codec is the cluster's --compress, but int8 for top-k: a sum
 * of n sparse drifts is not sparse, and re-sparsifying a partial sum at
 * every hop would leave most of it with the member of that hop (kept, not
 * lost, but the members would agree far less after a round). A node at
 * rest (its epochs done) names no tag, so the rounds that end a run are
 * float32 and leave the nodes bit for bit alike.
 */
#include "node/daemon/daemon_internal.h"

#include <errno.h>
#include <string.h>

/* The ring machine's codec (ctx: the daemon): d->ring_spec's. */
static size_t codec_max_bytes(void* ctx, size_t n) {
  const st__daemon_t* d = ctx;
  return st_codec_encoded_bytes(&d->ring_spec, n);
}

static int codec_encode(void* ctx, const float* x, size_t n, uint8_t* out,
                        size_t cap, size_t* len) {
  const st__daemon_t* d = ctx;
  return st_codec_encode(&d->ring_spec, x, n, out, cap, len);
}

int st__ring_codec_decode(void* ctx, const uint8_t* in, size_t len, float* out,
                          size_t n) {
  st__daemon_t* d = ctx;
  st_codec_drop_t why = ST_CODEC_DROP_COUNT;
  int rc = st_codec_decode(&d->ring_spec, in, len, out, n, &why);
  if (rc != 0 && (unsigned) why < ST_CODEC_DROP_COUNT)
    d->c.codec_drops[why]++;
  return rc;
}

void st__ring_coded_tag(st__daemon_t* d) {
  if (d->rf == NULL)
    return;
  st__anchor_t* a = st__compress_anchor(d);
  bool named = st__compress_on(d) && a != NULL && d->state != ST__D_DONE;
  st_ring_form_set_tag(d->rf, named ? st__agreed_id_of(a) : NULL);
}

int st__ring_coded_config(st__daemon_t* d, const uint8_t* tag,
                          st_ring_config_t* cfg) {
  static const uint8_t none[ST_RING_TAG_BYTES];
  if (tag == NULL || memcmp(tag, none, sizeof none) == 0)
    return 0;
  st__anchor_t* a = st__compress_anchor(d);
  if (a == NULL || memcmp(st__agreed_id_of(a), tag, ST_RING_TAG_BYTES) != 0)
    return -ESTALE;
  d->ring_spec = d->cfg->compress;
  if (d->ring_spec.kind == ST_CODEC_TOPK) {
    d->ring_spec.kind = ST_CODEC_INT8;
    d->ring_spec.topk_ppm = 0;
  }
  d->ring_codec.max_bytes = codec_max_bytes;
  d->ring_codec.encode = codec_encode;
  d->ring_codec.decode = st__ring_codec_decode;
  d->ring_codec.ctx = d;
  st__ring_coded_release(d);
  d->ring_anchor = st__anchor_ref(a);
  cfg->codec = &d->ring_codec;
  cfg->base = d->ring_anchor->v;
  return 0;
}

void st__ring_coded_release(st__daemon_t* d) {
  st__anchor_release(d->ring_anchor);
  d->ring_anchor = NULL;
}
