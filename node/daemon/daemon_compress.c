/* daemon_compress.c: compressed gossip averaging (--compress; issue #16):
 * the cluster's codec in the model fingerprint, the anchor every member of
 * a ring round shares, and the codec work the exchange machine asks for,
 * run on libuv's thread pool (gossip.h, "Compressed averaging";
 * docs/compression.md).
 *
 * The anchor is the agreed state (daemon_agreed.c): the vector a ring
 * round moved every member to, bit for bit, named by its id, so two nodes
 * name the same id only when they hold the same vector. An exchange holds
 * a reference to the one it named in its REQ or REPLY, since a round may
 * end while it runs. Between rounds a
 * node's drift from the anchor is what SGD moved it since, small next to
 * the parameters, which is what makes int8 and top-k of it accurate.
 */
#include "node/daemon/daemon_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char MODEL_DOMAIN[] = "starling-compress-v1";

bool st__compress_on(const st__daemon_t* d) {
  return d->cfg->compress.kind != ST_CODEC_NONE;
}

st__anchor_t* st__compress_anchor(const st__daemon_t* d) {
  st__anchor_t* a = d->anchor != NULL ? d->anchor : d->start_anchor;
  return a != NULL && a->n == (size_t) d->local.n_params ? a : NULL;
}

void st__compress_start_anchor(st__daemon_t* d, const float* params, size_t n) {
  if (!st__compress_on(d) || n == 0)
    return;
  st__anchor_t* a = st__anchor_new(n);
  if (a == NULL || st_copy_to_host(d->be, a->v, params, n) != 0) {
    st__anchor_release(a);
    st__dwarn(d,
              "no start anchor (%zu floats): compressed averaging "
              "sends float32 until the first ring round",
              n);
    return;
  }
  a->round = 0; /* no ring round's: ids of rounds are never 0 */
  d->start_anchor = a;
}

void st__mark_setting(const st__daemon_t* d, const char* domain,
                      const char* key, const char* value) {
  st__daemon_t* w = (st__daemon_t*) d;
  /* The fingerprint: BLAKE2b-256(domain || fingerprint || value), cut. */
  st_hash_t h;
  uint8_t full[ST_HASH_BYTES];
  st_hash_init(&h);
  st_hash_update(&h, domain, strlen(domain));
  st_hash_update(&h, w->local.fingerprint, sizeof w->local.fingerprint);
  st_hash_update(&h, value, strlen(value));
  st_hash_final(&h, full);
  memcpy(w->local.fingerprint, full, sizeof w->local.fingerprint);
  /* The description names it, cutting the model's text to make room. */
  char suffix[64];
  int k = snprintf(suffix, sizeof suffix, " %s=%s", key, value);
  if (k < 0 || (size_t) k >= sizeof suffix)
    return; /* names are short (st_codec_name, st_outer_name) */
  size_t room = sizeof w->local.model - 1 - (size_t) k;
  if (strlen(w->local.model) > room)
    w->local.model[room] = '\0';
  strcat(w->local.model, suffix);
}

void st__compress_mark_model(const st__daemon_t* d) {
  if (!st__compress_on(d))
    return;
  char name[32];
  if (st_codec_name(&d->cfg->compress, name, sizeof name) != 0)
    return; /* validated when parsed */
  st__mark_setting(d, MODEL_DOMAIN, "compress", name);
}

/* The value a model description gives KEY (" KEY=VALUE", up to the next
 * space), or "none" when it names none. */
static void setting_of(const char* model, const char* key, char* out,
                       size_t out_len) {
  char pat[32];
  snprintf(pat, sizeof pat, " %s=", key);
  const char* at = strstr(model, pat);
  if (at == NULL) {
    snprintf(out, out_len, "none");
    return;
  }
  at += strlen(pat);
  size_t len = strcspn(at, " ");
  snprintf(out, out_len, "%.*s", (int) len, at);
}

void st__compress_mismatch(const char* theirs, const char* ours, char* out,
                           size_t out_len) {
  out[0] = '\0';
  static const char* const keys[] = {"compress", "outer"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    char a[64], b[64];
    setting_of(theirs, keys[i], a, sizeof a);
    setting_of(ours, keys[i], b, sizeof b);
    if (strcmp(a, b) != 0) {
      snprintf(out, out_len,
               ": the cluster's nodes run --%s %s, this node --%s %s", keys[i],
               a, keys[i], b);
      return;
    }
  }
}

void st__compress_sized(st__daemon_t* d) {
  d->local.coded_bytes =
      st__compress_on(d)
          ? st_codec_encoded_bytes(&d->cfg->compress, d->local.n_params)
          : 0;
}

void st__compress_fill(st__daemon_t* d, st__conn_t* c, st_xchg_local_t* l) {
  memset(l->anchor, 0, sizeof l->anchor);
  st__anchor_t* a = st__compress_anchor(d);
  if (!st__compress_on(d) || a == NULL || a->n != l->n_params ||
      c->anchor != NULL)
    return;
  c->anchor = st__anchor_ref(a);
  memcpy(l->anchor, st__agreed_id_of(c->anchor), sizeof l->anchor);
}

/* ---- The codec work, on libuv's thread pool -------------------------------
 *
 * ENCODE and DECODE touch only buffers the exchange machine owns (valid
 * until st_xchg_free, which waits for the connection, held by the job),
 * the anchor (held by the connection, read-only) and the codec's spec: a
 * pool thread may run them while the loop goes on. The machine does not
 * touch those buffers until it hears the result. */

typedef struct {
  uv_work_t work;
  st__conn_t* c;
  st_xact_t a; /* the action: kind, work, n, coded, coded_len */
  st_codec_spec_t spec;
  const float* anchor; /* ENCODE: c->anchor's floats */
  int rc;
  st_codec_drop_t why; /* DECODE refused: the reason */
} codec_job_t;

/* ENCODE: drift from the anchor, encoded, decoded back over work. */
static int encode_drift(codec_job_t* j) {
  const st_xact_t* a = &j->a;
  for (size_t i = 0; i < a->n; i++)
    a->work[i] -= j->anchor[i];
  size_t len = 0;
  int rc =
      st_codec_encode(&j->spec, a->work, a->n, a->coded, a->coded_len, &len);
  if (rc == 0 && len != a->coded_len)
    rc = -EPROTO;
  if (rc == 0)
    rc = st_codec_decode(&j->spec, a->coded, a->coded_len, a->work, a->n, NULL);
  return rc;
}

static void codec_work(uv_work_t* w) {
  codec_job_t* j = w->data;
  if (j->a.kind == ST_XACT_ENCODE)
    j->rc = encode_drift(j);
  else
    j->rc = st_codec_decode(&j->spec, j->a.coded, j->a.coded_len, j->a.work,
                            j->a.n, &j->why);
}

static void codec_after(uv_work_t* w, int status) {
  codec_job_t* j = w->data;
  st__conn_t* c = j->c;
  st__daemon_t* d = c->d;
  int rc = status != 0 ? status : j->rc;
  bool decode = j->a.kind == ST_XACT_DECODE;
  if (decode && j->rc != 0 && (unsigned) j->why < ST_CODEC_DROP_COUNT)
    d->c.codec_drops[j->why]++;
  st__xchg_codec_done(c, decode, rc, (int) j->why);
  free(j);
  st__conn_release(c);
}

void st__compress_submit(st__conn_t* c, const st_xact_t* a) {
  st__daemon_t* d = c->d;
  codec_job_t* j = calloc(1, sizeof *j);
  bool encode = a->kind == ST_XACT_ENCODE;
  bool anchored = c->anchor != NULL && c->anchor->n == a->n;
  if (j == NULL || (encode && !anchored)) {
    int rc = j == NULL ? -ENOMEM : -EINVAL;
    free(j);
    st__xchg_codec_done(c, !encode, rc, 0);
    return;
  }
  j->c = c;
  j->a = *a;
  j->spec = d->cfg->compress;
  j->anchor = anchored ? c->anchor->v : NULL;
  j->why = ST_CODEC_DROP_HEADER;
  j->work.data = j;
  c->tt_pending++; /* the connection (and its machine) outlive the job */
  if (uv_queue_work(&d->loop, &j->work, codec_work, codec_after) != 0) {
    c->tt_pending--;
    free(j);
    st__xchg_codec_done(c, !encode, -EAGAIN, 0);
  }
}
