/* daemon_keys.c: the node's cluster keys, live (`starling keys`;
 * docs/security.md, "Rotating the cluster key"), through the control
 * socket: list them, install a new one (accepted, not yet used to send),
 * use it (it seals packets and new handshakes; the other is still
 * accepted), remove the one no longer needed. Connections already up keep
 * their session keys; only new packets and handshakes see the change.
 *
 * Requests (one line, as the other control requests):
 *   keys [json]                 the keys held
 *   keys install PATH [json]    PATH a cluster key file (`starling keygen
 *                               --cluster`), read by the node
 *   keys use ID [json]          ID the key id, as `starling keygen --show`
 *   keys remove ID [json]       and `starling keys` print it (0..255)
 * Answers: the keys after the request ("key 167  sends and accepts" lines,
 * or {"keys":[{"id":167,"sends":true},...]}), or "error: SENTENCE" /
 * {"error":"SENTENCE"}. Each change is logged. The change lives as long
 * as the process: a node restarted later takes --cluster-key and
 * --previous-key again (docs/security.md says which to give).
 *
 * The listing adds the cluster's view, from each live member's own signed
 * STATUS (its keys field): which keys are accepted and sent with where.
 *
 * The cluster rule (st__keys_grant): a request from another member
 * (`starling keys --cluster` on its machine; daemon_admin_net.c), and this
 * node's own part of one, is granted only when it cannot cut a live
 * member off, judged from what the members signed about themselves:
 *   install K  as `keys install` (the accepted place is free or holds K);
 *   use K      only when every live member accepts K;
 *   remove K   only when no live member sends with K.
 * So a member can help rotate the cluster key but cannot use a rotation
 * to shut anyone out. Requests on this node's own control socket (the
 * operator's) are not bound by it: evicting a member that holds the key
 * means using a key it does not accept (docs/security.md).
 */
#include "node/daemon/daemon_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- The cluster's view ----------------------------------------------------
 *
 * From each live member's own signed STATUS (its keys field): for each key
 * id any of them holds, how many accept it and how many send with it, and
 * which live members do not accept it. That is when the next step of a
 * rotation is safe: use a key once every member accepts it, remove the
 * old one once no member sends with it. */

#define MISSING_SHOWN 16 /* member ids listed per key; the count is exact */

typedef struct {
  uint32_t live;    /* alive or suspect members, this node included */
  uint32_t unknown; /* of them, those whose STATUS has not said yet */
  uint32_t accepts[256];
  uint32_t sends[256];
} key_census_t;

static bool live(const st_member_t* m) {
  return m->state == ST_MEMBER_ALIVE || m->state == ST_MEMBER_SUSPECT;
}

static bool member_accepts(const st_member_t* m, uint8_t id) {
  return m->has_status && m->status.n_keys > 0 &&
         (m->status.keys[0] == id ||
          (m->status.n_keys == 2 && m->status.keys[1] == id));
}

static void census(const st__daemon_t* d, key_census_t* c) {
  memset(c, 0, sizeof *c);
  size_t n = st_membership_count(d->m);
  for (size_t i = 0; i < n; i++) {
    const st_member_t* m = st_membership_at(d->m, i);
    if (m == NULL || !live(m))
      continue;
    c->live++;
    if (!m->has_status || m->status.n_keys == 0) {
      c->unknown++;
      continue;
    }
    c->sends[m->status.keys[0]]++;
    for (uint8_t k = 0; k < m->status.n_keys; k++)
      c->accepts[m->status.keys[k]]++;
  }
}

/* The ids of up to MISSING_SHOWN live members that do not accept key id,
 * as a JSON array or a text list, into b. */
static void put_missing(const st__daemon_t* d, uint8_t id, bool json,
                        st_json_buf_t* b) {
  size_t n = st_membership_count(d->m), shown = 0;
  for (size_t i = 0; i < n && shown < MISSING_SHOWN; i++) {
    const st_member_t* m = st_membership_at(d->m, i);
    if (m == NULL || !live(m) || member_accepts(m, id))
      continue;
    char hex[33];
    st_node_id_format(&m->id, hex);
    if (json) {
      if (shown > 0)
        st_json_buf_puts(b, ",");
      st_json_buf_string(b, hex);
    } else {
      st_json_buf_puts(b, shown > 0 ? ", " : "");
      st_json_buf_append(b, hex, 12);
    }
    shown++;
  }
}

static void put_cluster(const st__daemon_t* d, bool json, st_json_buf_t* b) {
  key_census_t c;
  census(d, &c);
  char line[200];
  if (json)
    snprintf(line, sizeof line,
             ",\"cluster\":{\"members\":%u,\"not_said\":%u,\"keys\":[", c.live,
             c.unknown);
  else
    snprintf(line, sizeof line,
             "cluster: %u live members%s (from their signed status)\n", c.live,
             c.unknown ? ", some not yet heard" : "");
  st_json_buf_puts(b, line);
  bool first = true;
  for (unsigned id = 0; id < 256; id++) {
    if (c.accepts[id] == 0)
      continue;
    uint32_t missing = c.live - c.accepts[id];
    if (json)
      snprintf(line, sizeof line,
               "%s{\"id\":%u,\"accepted_by\":%u,\"sends_on\":%u,"
               "\"not_accepted_by\":%u,\"missing\":[",
               first ? "" : ",", id, c.accepts[id], c.sends[id], missing);
    else
      snprintf(line, sizeof line,
               "key %-3u  accepted by %u of %u, sends on %u%s", id,
               c.accepts[id], c.live, c.sends[id],
               missing ? "; not accepted by " : "\n");
    st_json_buf_puts(b, line);
    if (missing)
      put_missing(d, (uint8_t) id, json, b);
    if (json)
      st_json_buf_puts(b, "]}");
    else if (missing)
      st_json_buf_puts(b, missing > MISSING_SHOWN ? ", ...\n" : "\n");
    first = false;
  }
  if (json)
    st_json_buf_puts(b, "]}");
}

static void put_keys(const st__daemon_t* d, bool json, st_json_buf_t* b) {
  const st_keyring_t* r = &d->keys;
  char line[160];
  if (json) {
    snprintf(line, sizeof line, "{\"keys\":[{\"id\":%u,\"sends\":true}",
             (unsigned) r->current.id);
    st_json_buf_puts(b, line);
    if (r->has_previous) {
      snprintf(line, sizeof line, ",{\"id\":%u,\"sends\":false}",
               (unsigned) r->previous.id);
      st_json_buf_puts(b, line);
    }
    st_json_buf_puts(b, "]");
    put_cluster(d, true, b);
    st_json_buf_puts(b, "}\n");
    return;
  }
  snprintf(line, sizeof line,
           "key %-3u  sends and accepts (packets and handshakes)\n",
           (unsigned) r->current.id);
  st_json_buf_puts(b, line);
  if (r->has_previous) {
    snprintf(line, sizeof line, "key %-3u  accepts only\n",
             (unsigned) r->previous.id);
    st_json_buf_puts(b, line);
  }
  put_cluster(d, false, b);
}

/* ---- The cluster rule
 * -------------------------------------------------------- */

static const char* short_id(const st_node_id_t* id, char hex[33]) {
  st_node_id_format(id, hex);
  hex[12] = '\0';
  return hex;
}

/* 0 when every live member accepts key id (use), or none sends with it
 * (remove); else -EPERM naming the first member in the way. */
static int cluster_rule(const st__daemon_t* d, uint8_t op, uint8_t id,
                        char* err, size_t err_len) {
  size_t n = st_membership_count(d->m);
  for (size_t i = 0; i < n; i++) {
    const st_member_t* m = st_membership_at(d->m, i);
    if (m == NULL || !live(m))
      continue;
    char hex[33];
    if (!m->has_status || m->status.n_keys == 0) {
      snprintf(err, err_len,
               "member %s has not said which keys it holds yet; try again "
               "in a few seconds",
               short_id(&m->id, hex));
      return -EPERM;
    }
    if (op == ST_ADMIN_KEY_USE && !member_accepts(m, id)) {
      snprintf(err, err_len,
               "member %s does not accept key %u: install it everywhere "
               "first (`starling keys --cluster install FILE`)",
               short_id(&m->id, hex), (unsigned) id);
      return -EPERM;
    }
    if (op == ST_ADMIN_KEY_REMOVE && m->status.keys[0] == id) {
      snprintf(err, err_len,
               "member %s still sends with key %u: use the new key "
               "everywhere first (`starling keys --cluster use ID`)",
               short_id(&m->id, hex), (unsigned) id);
      return -EPERM;
    }
  }
  return 0;
}

/* Whether the ring already is as q asks. */
static bool already(const st_keyring_t* r, const st_msg_admin_req_t* q,
                    const st_cluster_key_t* k) {
  bool held_prev = r->has_previous && r->previous.id == q->key_id;
  switch (q->op) {
    case ST_ADMIN_KEY_INSTALL:
      return st_keyring_holds(r, k);
    case ST_ADMIN_KEY_USE:
      return r->current.id == q->key_id;
    default:
      return r->current.id != q->key_id && !held_prev;
  }
}

st_admin_result_t st__keys_grant(st__daemon_t* d, const st_msg_admin_req_t* q,
                                 const char* asked_by, char* err,
                                 size_t err_len) {
  static const char* const done[] = {
      "", "installed (accepted, not yet used to send)", "now sends", "removed"};
  st_cluster_key_t k;
  memset(&k, 0, sizeof k);
  if (q->op == ST_ADMIN_KEY_INSTALL) {
    st_cluster_key_from_bytes(&k, q->subject);
    if (k.id != q->key_id) {
      snprintf(err, err_len, "the key sent has id %u, not %u", (unsigned) k.id,
               (unsigned) q->key_id);
      st_cluster_key_wipe(&k);
      return ST_ADMIN_REFUSED;
    }
  }
  st_admin_result_t res = ST_ADMIN_DONE;
  int rc = 0;
  bool held = d->keys.has_previous && d->keys.previous.id == q->key_id;
  if (already(&d->keys, q, &k))
    res = ST_ADMIN_ALREADY;
  else if (q->op == ST_ADMIN_KEY_USE && !held)
    rc = st_keyring_use(&d->keys, q->key_id, err, err_len); /* says why */
  else if (q->op != ST_ADMIN_KEY_INSTALL)
    rc = cluster_rule(d, q->op, q->key_id, err, err_len);
  if (res == ST_ADMIN_DONE && rc == 0)
    rc = q->op == ST_ADMIN_KEY_INSTALL
             ? st_keyring_install(&d->keys, &k, err, err_len)
         : q->op == ST_ADMIN_KEY_USE
             ? st_keyring_use(&d->keys, q->key_id, err, err_len)
             : st_keyring_remove(&d->keys, q->key_id, err, err_len);
  st_cluster_key_wipe(&k);
  if (rc != 0)
    return ST_ADMIN_REFUSED;
  if (res == ST_ADMIN_DONE) {
    st__dlog(d, "cluster key %u %s, asked by %s", (unsigned) q->key_id,
             done[q->op], asked_by);
    st__status_publish(d);
  }
  return res;
}

void st__put_error(st_json_buf_t* b, bool json, const char* err) {
  if (json) {
    st_json_buf_puts(b, "{\"error\":");
    st_json_buf_string(b, err);
    st_json_buf_puts(b, "}\n");
  } else {
    st_json_buf_puts(b, "error: ");
    st_json_buf_puts(b, err);
    st_json_buf_puts(b, "\n");
  }
}

/* A key id as printed: a whole number 0..255. */
static int parse_id(const char* text, uint8_t* id, char* err, size_t err_len) {
  char* end = NULL;
  unsigned long v = strtoul(text, &end, 10);
  if (text[0] < '0' || text[0] > '9' || *end != '\0' || v > 255) {
    snprintf(err, err_len,
             "'%s' is not a key id (a whole number 0..255, as `starling "
             "keys` shows)",
             text);
    return -EINVAL;
  }
  *id = (uint8_t) v;
  return 0;
}

int st__keys_parse(char* args, st_msg_admin_req_t* q, char* err,
                   size_t err_len) {
  size_t n = strlen(args);
  if (n >= 5 && strcmp(args + n - 5, " json") == 0)
    args[n - 5] = '\0';
  while (*args == ' ')
    args++;
  memset(q, 0, sizeof *q);
  if (args[0] == '\0')
    return 1;
  if (strncmp(args, "install ", 8) == 0 && args[8] == '/') {
    /* The key file is read here: the requester is this node's own user
     * (the socket is 0600). */
    st_cluster_key_t k;
    int rc = st_cluster_key_load(args + 8, &k, err, err_len);
    if (rc != 0)
      return rc;
    q->op = ST_ADMIN_KEY_INSTALL;
    q->key_id = k.id;
    q->subject_len = sizeof k.key;
    memcpy(q->subject, k.key, sizeof k.key);
    st_cluster_key_wipe(&k);
    return 0;
  }
  if (strncmp(args, "use ", 4) == 0) {
    q->op = ST_ADMIN_KEY_USE;
    return parse_id(args + 4, &q->key_id, err, err_len);
  }
  if (strncmp(args, "remove ", 7) == 0) {
    q->op = ST_ADMIN_KEY_REMOVE;
    return parse_id(args + 7, &q->key_id, err, err_len);
  }
  snprintf(err, err_len,
           "unknown keys request; expected list, install /PATH, use ID or "
           "remove ID");
  return -EINVAL;
}

/* A request on this node's own control socket: the operator's, not bound
 * by the cluster rule. */
static int apply_local(st__daemon_t* d, const st_msg_admin_req_t* q, char* err,
                       size_t err_len) {
  int rc;
  if (q->op == ST_ADMIN_KEY_INSTALL) {
    st_cluster_key_t k;
    st_cluster_key_from_bytes(&k, q->subject);
    rc = st_keyring_install(&d->keys, &k, err, err_len);
    st_cluster_key_wipe(&k);
    if (rc == 0)
      st__dlog(d,
               "cluster key %u installed (accepted; sends with %u), asked by "
               "`starling keys`",
               (unsigned) q->key_id, (unsigned) d->keys.current.id);
  } else if (q->op == ST_ADMIN_KEY_USE) {
    rc = st_keyring_use(&d->keys, q->key_id, err, err_len);
    if (rc == 0)
      st__dlog(d, "cluster key %u now sends, asked by `starling keys`",
               (unsigned) q->key_id);
  } else {
    rc = st_keyring_remove(&d->keys, q->key_id, err, err_len);
    if (rc == 0)
      st__dlog(d, "cluster key %u removed, asked by `starling keys`",
               (unsigned) q->key_id);
  }
  return rc;
}

void st__keys_request(st__daemon_t* d, char* args, bool json,
                      st_json_buf_t* b) {
  char err[400] = "";
  st_msg_admin_req_t q;
  int rc = st__keys_parse(args, &q, err, sizeof err);
  if (rc == 1) {
    put_keys(d, json, b);
    return;
  }
  if (rc == 0)
    rc = apply_local(d, &q, err, sizeof err);
  st_crypto_wipe(&q, sizeof q);
  if (rc != 0) {
    st__put_error(b, json, err);
    return;
  }
  st__status_publish(d); /* the cluster hears of it now */
  put_keys(d, json, b);
}
