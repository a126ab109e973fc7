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
 */
#include "node/daemon/daemon_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    st_json_buf_puts(b, "]}\n");
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
}

static void put_error(bool json, const char* err, st_json_buf_t* b) {
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
static int parse_id(const char* text, uint8_t* id) {
  char* end = NULL;
  unsigned long v = strtoul(text, &end, 10);
  if (text[0] < '0' || text[0] > '9' || *end != '\0' || v > 255)
    return -1;
  *id = (uint8_t) v;
  return 0;
}

/* install PATH: the key file read here (the requester is this node's own
 * user: the socket is 0600). */
static int install(st__daemon_t* d, const char* path, char* err,
                   size_t err_len) {
  st_cluster_key_t k;
  int rc = st_cluster_key_load(path, &k, err, err_len);
  if (rc == 0)
    rc = st_keyring_install(&d->keys, &k, err, err_len);
  if (rc == 0)
    st__dlog(d,
             "cluster key %u installed (accepted; sends with %u), asked by "
             "`starling keys`",
             (unsigned) k.id, (unsigned) d->keys.current.id);
  st_cluster_key_wipe(&k);
  return rc;
}

void st__keys_request(st__daemon_t* d, char* args, bool json,
                      st_json_buf_t* b) {
  size_t n = strlen(args);
  if (n >= 5 && strcmp(args + n - 5, " json") == 0)
    args[n - 5] = '\0';
  while (*args == ' ')
    args++;
  char err[400] = "";
  int rc = 0;
  uint8_t id = 0;
  if (args[0] == '\0') {
    put_keys(d, json, b);
    return;
  }
  if (strncmp(args, "install ", 8) == 0 && args[8] == '/') {
    rc = install(d, args + 8, err, sizeof err);
  } else if (strncmp(args, "use ", 4) == 0) {
    rc = parse_id(args + 4, &id) != 0
             ? (snprintf(err, sizeof err,
                         "'%s' is not a key id (a whole number 0..255, as "
                         "`starling keys` shows)",
                         args + 4),
                -EINVAL)
             : st_keyring_use(&d->keys, id, err, sizeof err);
    if (rc == 0)
      st__dlog(d, "cluster key %u now sends, asked by `starling keys`",
               (unsigned) id);
  } else if (strncmp(args, "remove ", 7) == 0) {
    rc = parse_id(args + 7, &id) != 0
             ? (snprintf(err, sizeof err,
                         "'%s' is not a key id (a whole number 0..255, as "
                         "`starling keys` shows)",
                         args + 7),
                -EINVAL)
             : st_keyring_remove(&d->keys, id, err, sizeof err);
    if (rc == 0)
      st__dlog(d, "cluster key %u removed, asked by `starling keys`",
               (unsigned) id);
  } else {
    snprintf(err, sizeof err,
             "unknown keys request; expected list, install /PATH, use ID or "
             "remove ID");
    rc = -EINVAL;
  }
  if (rc != 0)
    put_error(json, err, b);
  else
    put_keys(d, json, b);
}
