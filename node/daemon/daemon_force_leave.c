/* daemon_force_leave.c: `starling force-leave ID` (serf's force-leave)
 * through the control socket: this node forgets a member that failed and
 * will not come back, at once, instead of listing it dead for 30 s and
 * trying to reconnect to it for an hour (st_membership_force_leave in
 * gossip.h). The request is "force-leave ID [json]", ID a member id or a
 * unique prefix of one (4 to 32 hex digits, as `starling peers` prints
 * them), matched against the members this node holds and those it keeps
 * for reconnect attempts. "force-leave cluster ID" asks every live member
 * too (daemon_admin_net.c). The rule, on every node and for every asker:
 * only a member that failed here may be forgotten; one alive or suspect
 * here is refused (it leaves by itself, `starling leave` on its
 * machine), so no member can make another forget a live one.
 */
#include "node/daemon/daemon_internal.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#define GRAVES_MAX 64

/* Whether id's hex form starts with prefix (lower-case hex). */
static bool id_matches(const st_node_id_t* id, const char* prefix) {
  char hex[33];
  st_node_id_format(id, hex);
  return strncmp(hex, prefix, strlen(prefix)) == 0;
}

/* The one member (held or buried) whose id starts with prefix, or the
 * whole id given when no member here has it: 0, or -ENOENT (none) or
 * -EEXIST (several) with the sentence in err. */
static int resolve(const st__daemon_t* d, const char* prefix, st_node_id_t* out,
                   char* err, size_t err_len) {
  int found = 0;
  size_t n = st_membership_count(d->m);
  for (size_t i = 0; i < n; i++) {
    const st_member_t* m = st_membership_at(d->m, i);
    if (m != NULL && id_matches(&m->id, prefix) && found++ == 0)
      *out = m->id;
  }
  st_node_id_t graves[GRAVES_MAX];
  size_t ng = st_membership_graves(d->m, graves, GRAVES_MAX);
  for (size_t i = 0; i < ng; i++)
    if (id_matches(&graves[i], prefix) && found++ == 0)
      *out = graves[i];
  if (found == 1)
    return 0;
  if (found == 0 && strlen(prefix) == 2 * sizeof out->b) {
    /* A whole id this node does not know (forgotten already, say): named
     * as given, for the members that may still know it. */
    for (size_t i = 0; i < sizeof out->b; i++) {
      unsigned v;
      sscanf(prefix + 2 * i, "%2x", &v);
      out->b[i] = (uint8_t) v;
    }
    return 0;
  }
  snprintf(err, err_len,
           found == 0 ? "no member %s here (`starling peers` lists them)"
                      : "%s names several members; give more of the id",
           prefix);
  return found == 0 ? -ENOENT : -EEXIST;
}

/* args: "ID" (lower-cased here), or an error sentence into err. */
static int parse(char* args, char* err, size_t err_len) {
  size_t n = strlen(args);
  if (n >= 5 && strcmp(args + n - 5, " json") == 0)
    args[n -= 5] = '\0';
  bool hex = n >= 4 && n <= 32;
  for (size_t i = 0; i < n && hex; i++) {
    args[i] = (char) tolower((unsigned char) args[i]);
    hex = isxdigit((unsigned char) args[i]) != 0;
  }
  if (hex)
    return 0;
  snprintf(err, err_len,
           "'%s' is not a member id: give 4 to 32 hex digits of it, as "
           "`starling peers` prints them",
           args);
  return -EINVAL;
}

int st__force_leave_resolve(st__daemon_t* d, char* args, st_node_id_t* out,
                            char* err, size_t err_len) {
  int rc = parse(args, err, err_len);
  if (rc == 0 && d->m == NULL) {
    snprintf(err, err_len, "the node is not on the network yet");
    rc = -EAGAIN;
  }
  return rc == 0 ? resolve(d, args, out, err, err_len) : rc;
}

st_admin_result_t st__force_leave_grant(st__daemon_t* d, const st_node_id_t* id,
                                        const char* asked_by, char* err,
                                        size_t err_len) {
  char hex[33];
  st_node_id_format(id, hex);
  int rc = st_membership_force_leave(d->m, st__dnow(d), id);
  if (rc == 0) {
    st__net_drain(d);
    st__dlog(d, "member %.12s forgotten, asked by %s", hex, asked_by);
    return ST_ADMIN_DONE;
  }
  if (rc == -ENOENT)
    return ST_ADMIN_ALREADY; /* not known here: nothing to forget */
  if (rc == -EBUSY)
    snprintf(err, err_len,
             "member %.12s is alive here: only it can leave (`starling "
             "leave` on its machine); force-leave is for members that "
             "failed",
             hex);
  else if (rc == -EINVAL)
    snprintf(err, err_len, "%.12s is this node: use `starling leave`", hex);
  else
    snprintf(err, err_len, "cannot forget member %.12s: %s", hex,
             strerror(-rc));
  return ST_ADMIN_REFUSED;
}

void st__force_leave_request(st__daemon_t* d, char* args, bool json,
                             st_json_buf_t* b) {
  char err[300] = "";
  st_node_id_t id;
  int rc = st__force_leave_resolve(d, args, &id, err, sizeof err);
  st_admin_result_t res =
      rc == 0 ? st__force_leave_grant(d, &id, "`starling force-leave`", err,
                                      sizeof err)
              : ST_ADMIN_REFUSED;
  if (rc == 0 && res == ST_ADMIN_ALREADY) {
    snprintf(err, sizeof err, "no member %s here (`starling peers` lists them)",
             args);
    rc = -ENOENT;
  } else if (rc == 0 && res == ST_ADMIN_REFUSED) {
    rc = -EPERM;
  }
  if (rc != 0) {
    st__put_error(b, json, err);
    return;
  }
  char hex[33];
  st_node_id_format(&id, hex);
  st_json_buf_puts(b, json ? "{\"forgotten\":" : "forgotten: ");
  if (json)
    st_json_buf_string(b, hex);
  else
    st_json_buf_puts(b, hex);
  st_json_buf_puts(b, json ? "}\n"
                           : " (this node no longer lists it or tries to "
                             "reach it)\n");
}
