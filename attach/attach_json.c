/* attach_json.c: the attach protocol's frames (attach/attach.h,
 * docs/attach.md): the attach request a program sends with its shared
 * segment, the node's reply, and the 4-byte length framing.
 *
 * The node decodes requests from any local process that can open its
 * control socket, so the decoder is hardened: the text is parsed by the
 * strict, bounded reader of base/ (limits derived below), every member's
 * type is checked before it is read, counts are checked before anything is
 * allocated for them, and names are checked before they are echoed. The
 * version is checked first, so a program of another release is told so
 * (-EPROTO with both versions) rather than that its request is malformed.
 * Members a decoder does not know are ignored: a later release of the same
 * protocol version may add some.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attach/attach.h"
#include "attach/attach_internal.h"
#include "base/base.h"

/* A request nests object > "tensors" array > tensor object > "shape"
 * array: depth 4. Its values: the root, its 3 members, and per tensor the
 * object, its 3 members and at most ST_ATTACH_MAX_DIMS dimensions; plus a
 * few unknown members. A tensor of more dimensions is refused by its own
 * count check before the limit is reached: the limit only bounds memory.
 * The frame limit (4 MiB) bounds the text anyway; this bounds the nodes. */
#define REQUEST_DEPTH 4
#define REQUEST_VALUES \
  (64 + (size_t) ST_ATTACH_MAX_TENSORS * (4 + ST_ATTACH_MAX_DIMS))
/* A reply is one flat object of three members (a few more allowed). */
#define REPLY_DEPTH 1
#define REPLY_VALUES 32

/* ---- The attach request ---------------------------------------------------
 */

char* st_attach_request_encode(const st_attach_model_t* m, int64_t pid,
                               size_t* len) {
  st_json_buf_t b;
  st_json_buf_init(&b);
  char head[96];
  snprintf(head, sizeof head,
           "{\"version\":%u,\"pid\":%" PRId64 ",\"tensors\":[",
           ST_ATTACH_VERSION, pid);
  st_json_buf_puts(&b, head);
  for (size_t i = 0; i < m->n; i++) {
    const st_attach_tensor_t* t = &m->t[i];
    st_json_buf_puts(&b, i > 0 ? ",{\"name\":" : "{\"name\":");
    st_json_buf_string(&b, t->name);
    st_json_buf_puts(&b, ",\"dtype\":");
    st_json_buf_string(&b, t->dtype);
    st_json_buf_puts(&b, ",\"shape\":[");
    for (int d = 0; d < t->ndim; d++) {
      if (d > 0)
        st_json_buf_puts(&b, ",");
      st_json_buf_u64(&b, t->shape[d]);
    }
    st_json_buf_puts(&b, "]}");
  }
  st_json_buf_puts(&b, "]}");
  if (b.failed) {
    st_json_buf_free(&b);
    return NULL;
  }
  if (len != NULL)
    *len = b.len;
  return b.p;
}

/* A type's name with its article, for sentences ("an array"). */
static const char* a_type(st_json_type_t t) {
  switch (t) {
    case ST_JSON_NULL:
      return "null";
    case ST_JSON_BOOL:
      return "a boolean";
    case ST_JSON_NUMBER:
      return "a number";
    case ST_JSON_STRING:
      return "a string";
    case ST_JSON_ARRAY:
      return "an array";
    default:
      return "an object";
  }
}

/* An integer member within [lo, hi]: 0, -ENOENT when absent, -EBADMSG for
 * another type or range. */
static int get_int(const st_json_t* obj, const char* key, int64_t lo,
                   int64_t hi, int64_t* out) {
  const st_json_t* v = st_json_get(obj, key);
  if (v == NULL)
    return -ENOENT;
  if (v->type != ST_JSON_NUMBER || !v->is_int || v->integer < lo ||
      v->integer > hi)
    return -EBADMSG;
  *out = v->integer;
  return 0;
}

/* The member `key` of the request's tensor idx, of type want. */
static const st_json_t* member(const st_json_t* obj, const char* key,
                               st_json_type_t want, size_t idx, char* err,
                               size_t err_len) {
  const st_json_t* v = st_json_get(obj, key);
  if (v == NULL) {
    st_set_err(err, err_len,
               "tensor %zu of the attach request has no '%s'; the client "
               "library writes it: is the program using another one?",
               idx, key);
    return NULL;
  }
  if (v->type != want) {
    st_set_err(err, err_len,
               "tensor %zu of the attach request: '%s' is %s, not %s", idx, key,
               a_type(v->type), a_type(want));
    return NULL;
  }
  return v;
}

static int read_tensor(const st_json_t* e, size_t idx, st_attach_model_t* m,
                       char* err, size_t err_len) {
  if (e->type != ST_JSON_OBJECT) {
    st_set_err(err, err_len,
               "tensor %zu of the attach request is %s, not an object", idx,
               a_type(e->type));
    return -EBADMSG;
  }
  const st_json_t* name = member(e, "name", ST_JSON_STRING, idx, err, err_len);
  const st_json_t* dtype =
      name ? member(e, "dtype", ST_JSON_STRING, idx, err, err_len) : NULL;
  const st_json_t* shape =
      dtype ? member(e, "shape", ST_JSON_ARRAY, idx, err, err_len) : NULL;
  if (shape == NULL)
    return -EBADMSG;
  if (shape->count > ST_ATTACH_MAX_DIMS) {
    st_set_err(err, err_len,
               "tensor %zu of the attach request has %zu dimensions; at most "
               "%d are supported",
               idx, shape->count, ST_ATTACH_MAX_DIMS);
    return -EINVAL;
  }
  uint64_t dims[ST_ATTACH_MAX_DIMS];
  int nd = 0;
  for (const st_json_t* d = shape->child; d != NULL; d = d->next, nd++) {
    if (d->type != ST_JSON_NUMBER || !d->is_int || d->integer < 0) {
      st_set_err(err, err_len,
                 "tensor %zu of the attach request: dimension %d is not a "
                 "non-negative integer",
                 idx, nd);
      return -EBADMSG;
    }
    dims[nd] = (uint64_t) d->integer;
  }
  /* The name is checked (length, UTF-8, control characters) before any
   * message prints it. */
  return st__attach_model_append(m, name->str, dtype->str, nd, dims, err,
                                 err_len);
}

/* The version (checked first) and the pid of a parsed request. */
static int read_head(const st_json_t* root, uint32_t* version, int64_t* pid,
                     char* err, size_t err_len) {
  if (root->type != ST_JSON_OBJECT) {
    st_set_err(err, err_len, "the attach request is %s, not an object",
               a_type(root->type));
    return -EBADMSG;
  }
  int64_t v = 0;
  if (get_int(root, "version", 0, UINT32_MAX, &v) != 0) {
    st_set_err(err, err_len,
               "the attach request has no protocol 'version' (an integer); "
               "is the program using a starling client library?");
    return -EBADMSG;
  }
  *version = (uint32_t) v;
  if (v != ST_ATTACH_VERSION) {
    st_set_err(err, err_len,
               "version: the program speaks attach protocol version %" PRId64
               " and this node version %u; use a client library and a node "
               "of the same starling release",
               v, ST_ATTACH_VERSION);
    return -EPROTO;
  }
  if (get_int(root, "pid", 0, INT32_MAX, pid) != 0) {
    st_set_err(err, err_len,
               "the attach request has no 'pid' (a non-negative integer)");
    return -EBADMSG;
  }
  return 0;
}

static int read_tensors(const st_json_t* root, st_attach_model_t* m, char* err,
                        size_t err_len) {
  const st_json_t* ts = st_json_get(root, "tensors");
  if (ts == NULL || ts->type != ST_JSON_ARRAY) {
    st_set_err(err, err_len, "the attach request has no 'tensors' array");
    return -EBADMSG;
  }
  if (ts->count == 0) {
    st_set_err(err, err_len,
               "the attach request lists no tensors; register at least one");
    return -EINVAL;
  }
  if (ts->count > ST_ATTACH_MAX_TENSORS) {
    st_set_err(err, err_len,
               "the attach request lists %zu tensors; at most %u are "
               "supported",
               ts->count, ST_ATTACH_MAX_TENSORS);
    return -EINVAL;
  }
  size_t idx = 0;
  for (const st_json_t* e = ts->child; e != NULL; e = e->next, idx++) {
    int rc = read_tensor(e, idx, m, err, err_len);
    if (rc != 0)
      return rc;
  }
  return st__attach_model_unique(m, err, err_len);
}

int st_attach_request_decode(const char* json, size_t len, st_attach_model_t* m,
                             uint32_t* version, int64_t* pid, char* err,
                             size_t err_len) {
  memset(m, 0, sizeof(*m));
  *version = 0;
  *pid = 0;
  if (len > ST_ATTACH_FRAME_MAX) {
    st_set_err(err, err_len,
               "the attach request is %zu bytes, more than the %u a frame "
               "may hold",
               len, ST_ATTACH_FRAME_MAX);
    return -EBADMSG;
  }
  const st_json_limits_t lim = {REQUEST_DEPTH, REQUEST_VALUES};
  st_json_doc_t* doc = NULL;
  char why[160];
  int rc = st_json_parse(json, len, &lim, &doc, why, sizeof why);
  if (rc != 0) {
    st_set_err(err, err_len, "the attach request is not valid JSON (%s)", why);
    return rc;
  }
  const st_json_t* root = st_json_root(doc);
  rc = read_head(root, version, pid, err, err_len);
  if (rc == 0)
    rc = read_tensors(root, m, err, err_len);
  st_json_free(doc);
  if (rc != 0)
    st_attach_model_free(m);
  return rc;
}

/* ---- The reply ------------------------------------------------------------
 */

char* st_attach_reply_encode(bool ok, uint64_t step, const char* source,
                             const char* error, size_t* len) {
  st_json_buf_t b;
  st_json_buf_init(&b);
  if (ok) {
    st_json_buf_puts(&b, "{\"ok\":true,\"step\":");
    st_json_buf_u64(&b, step);
    st_json_buf_puts(&b, ",\"source\":");
    st_json_buf_string(&b, source != NULL ? source : "");
  } else {
    st_json_buf_puts(&b, "{\"ok\":false,\"error\":");
    st_json_buf_string(&b, error != NULL ? error : "");
  }
  st_json_buf_puts(&b, "}");
  if (b.failed) {
    st_json_buf_free(&b);
    return NULL;
  }
  if (len != NULL)
    *len = b.len;
  return b.p;
}

/* A string member copied into out (control characters as '?'); "" when
 * absent. -EBADMSG when present but not a string. */
static int copy_string(const st_json_t* root, const char* key, char* out,
                       size_t out_len) {
  const st_json_t* v = st_json_get(root, key);
  if (v == NULL)
    return out_len > 0 ? (out[0] = '\0', 0) : 0;
  if (v->type != ST_JSON_STRING)
    return -EBADMSG;
  st__attach_printable(v->str, out, out_len);
  return 0;
}

static int read_reply(const st_json_t* root, bool* ok, uint64_t* step,
                      char* source, size_t source_len, char* error,
                      size_t error_len) {
  const st_json_t* okv = st_json_get(root, "ok");
  if (root->type != ST_JSON_OBJECT || okv == NULL ||
      okv->type != ST_JSON_BOOL) {
    st_set_err(error, error_len,
               "the node's attach reply has no 'ok' (true or false)");
    return -EBADMSG;
  }
  if (!okv->boolean) {
    if (copy_string(root, "error", error, error_len) != 0 ||
        st_json_get(root, "error") == NULL) {
      st_set_err(error, error_len,
                 "the node refused the attach without an 'error' string");
      return -EBADMSG;
    }
    return 0;
  }
  int64_t s = 0;
  if (get_int(root, "step", 0, ST_JSON_MAX_INT, &s) != 0 ||
      copy_string(root, "source", source, source_len) != 0) {
    st_set_err(error, error_len,
               "the node's attach reply has no 'step' (a non-negative "
               "integer) or a 'source' that is not a string");
    return -EBADMSG;
  }
  *ok = true;
  *step = (uint64_t) s;
  return 0;
}

int st_attach_reply_decode(const char* json, size_t len, bool* ok,
                           uint64_t* step, char* source, size_t source_len,
                           char* error, size_t error_len) {
  *ok = false;
  *step = 0;
  if (source_len > 0)
    source[0] = '\0';
  if (error_len > 0)
    error[0] = '\0';
  const st_json_limits_t lim = {REPLY_DEPTH, REPLY_VALUES};
  st_json_doc_t* doc = NULL;
  char why[160];
  int rc = len > ST_ATTACH_FRAME_MAX
               ? -EBADMSG
               : st_json_parse(json, len, &lim, &doc, why, sizeof why);
  if (rc != 0) {
    if (len > ST_ATTACH_FRAME_MAX)
      snprintf(why, sizeof why, "%zu bytes, more than a frame holds", len);
    st_set_err(error, error_len,
               "the node's attach reply is not valid JSON (%s)", why);
    return rc;
  }
  rc = read_reply(st_json_root(doc), ok, step, source, source_len, error,
                  error_len);
  st_json_free(doc);
  return rc;
}

/* ---- Frames ---------------------------------------------------------------
 */

uint8_t* st_attach_frame(const char* json, size_t len, size_t* out_len) {
  if (len > ST_ATTACH_FRAME_MAX)
    return NULL;
  uint8_t* f = malloc(4 + len);
  if (f == NULL)
    return NULL;
  for (int i = 0; i < 4; i++)
    f[i] = (uint8_t) (len >> (8 * i));
  memcpy(f + 4, json, len);
  *out_len = 4 + len;
  return f;
}

uint32_t st_attach_frame_len(const uint8_t hdr[4]) {
  return (uint32_t) hdr[0] | (uint32_t) hdr[1] << 8 | (uint32_t) hdr[2] << 16 |
         (uint32_t) hdr[3] << 24;
}
