/* daemon_state.c: what the daemon keeps in its data directory (identity,
 * boot epoch, checkpoint and control socket paths), the model fingerprint,
 * and address parsing and formatting. */
#include "node/daemon/daemon_internal.h"
#include "node/train/train_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- Addresses ---------------------------------------------------------- */

int st__addr_parse(const char* text, struct sockaddr_storage* ss,
                   st_wire_addr_t* wa, char* err, size_t err_len) {
  char host[256];
  const char* colon = strrchr(text, ':');
  if (colon == NULL || colon == text || strlen(text) >= sizeof(host)) {
    st_set_err(err, err_len, "'%s' is not HOST:PORT (e.g. 127.0.0.1:7946)",
               text);
    return -EINVAL;
  }
  size_t hl = (size_t) (colon - text);
  memcpy(host, text, hl);
  host[hl] = '\0';
  if (hl > 2 && host[0] == '[' && host[hl - 1] == ']') {
    memmove(host, host + 1, hl - 2);
    host[hl - 2] = '\0';
  }
  char* end = NULL;
  errno = 0;
  unsigned long port = strtoul(colon + 1, &end, 10);
  if (colon[1] == '\0' || *end != '\0' || errno != 0 || port > 65535) {
    st_set_err(err, err_len, "'%s': the port is not a number in 0..65535",
               text);
    return -EINVAL;
  }
  if (strcmp(host, "localhost") == 0)
    strcpy(host, "127.0.0.1");
  memset(ss, 0, sizeof(*ss));
  struct sockaddr_in* s4 = (struct sockaddr_in*) ss;
  struct sockaddr_in6* s6 = (struct sockaddr_in6*) ss;
  if (inet_pton(AF_INET, host, &s4->sin_addr) == 1) {
    s4->sin_family = AF_INET;
    s4->sin_port = htons((uint16_t) port);
  } else if (inet_pton(AF_INET6, host, &s6->sin6_addr) == 1) {
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons((uint16_t) port);
  } else {
    st_set_err(err, err_len,
               "'%s': '%s' is not an IPv4 or IPv6 address (names are not "
               "resolved; give the address)",
               text, host);
    return -EINVAL;
  }
  if (wa != NULL)
    st__addr_from_sockaddr((const struct sockaddr*) ss, wa);
  return 0;
}

void st__addr_from_sockaddr(const struct sockaddr* sa, st_wire_addr_t* wa) {
  /* Copied out rather than cast: a struct sockaddr may be less aligned
   * than the family's own struct. */
  memset(wa, 0, sizeof(*wa));
  if (sa->sa_family == AF_INET) {
    struct sockaddr_in s4;
    memcpy(&s4, sa, sizeof(s4));
    wa->ip_len = 4;
    memcpy(wa->ip, &s4.sin_addr, 4);
    wa->port = ntohs(s4.sin_port);
  } else if (sa->sa_family == AF_INET6) {
    struct sockaddr_in6 s6;
    memcpy(&s6, sa, sizeof(s6));
    wa->ip_len = 16;
    memcpy(wa->ip, &s6.sin6_addr, 16);
    wa->port = ntohs(s6.sin6_port);
  }
}

void st__addr_to_sockaddr(const st_wire_addr_t* wa,
                          struct sockaddr_storage* ss) {
  memset(ss, 0, sizeof(*ss));
  if (wa->ip_len == 16) {
    struct sockaddr_in6* s6 = (struct sockaddr_in6*) ss;
    s6->sin6_family = AF_INET6;
    memcpy(&s6->sin6_addr, wa->ip, 16);
    s6->sin6_port = htons(wa->port);
  } else {
    struct sockaddr_in* s4 = (struct sockaddr_in*) ss;
    s4->sin_family = AF_INET;
    memcpy(&s4->sin_addr, wa->ip, 4);
    s4->sin_port = htons(wa->port);
  }
}

void st__addr_format(const st_wire_addr_t* wa, char* buf, size_t len) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (wa->ip_len == 16) {
    inet_ntop(AF_INET6, wa->ip, ip, sizeof(ip));
    snprintf(buf, len, "[%s]:%u", ip, wa->port);
  } else {
    inet_ntop(AF_INET, wa->ip, ip, sizeof(ip));
    snprintf(buf, len, "%s:%u", ip, wa->port);
  }
}

/* ---- Fingerprint --------------------------------------------------------- */

/* What must match between peers for averaging to make sense: the
 * architecture (which fixes the parameter layout) and the dtype. Learning
 * rates, batch sizes and optimizers may differ per node. */
void st__model_fingerprint(const st_model_spec_t* spec, uint8_t fp[16],
                           char* desc, size_t desc_len) {
  char model[256];
  st_model_spec_format(spec, model, sizeof(model));
  snprintf(desc, desc_len, "%s f32", model);
  char canon[300];
  int n = snprintf(canon, sizeof(canon), "starling-model-v1 %s", desc);
  st_hash_once(canon, (size_t) n, fp, 16);
}

/* ---- Data directory ------------------------------------------------------ */

static int ensure_dir(const char* path, char* err, size_t err_len) {
  struct stat sb;
  if (stat(path, &sb) == 0) {
    if (!S_ISDIR(sb.st_mode)) {
      st_set_err(err, err_len,
                 "--data-dir '%s' exists and is not a directory; give a "
                 "directory",
                 path);
      return -ENOTDIR;
    }
  } else if (mkdir(path, 0700) != 0) {
    st_set_err(err, err_len,
               "--data-dir '%s': cannot create it (%s); create it or pick "
               "another place",
               path, strerror(errno));
    return -errno;
  }
  if (access(path, W_OK | X_OK) != 0) {
    st_set_err(err, err_len,
               "--data-dir '%s' is not writable by this user; fix its "
               "permissions or pick another",
               path);
    return -EACCES;
  }
  return 0;
}

/* Reads the previous boot epoch (0 when the file is new), writes the next
 * one atomically (temporary file, fsync, rename) before the node says
 * anything on the network, so two lives never share an epoch. */
static int next_boot_epoch(const char* dir, uint32_t* out, char* err,
                           size_t err_len) {
  char path[600], tmp[620];
  snprintf(path, sizeof(path), "%s/boot_epoch", dir);
  snprintf(tmp, sizeof(tmp), "%s/boot_epoch.tmp", dir);
  uint64_t prev = 0;
  FILE* f = fopen(path, "r");
  if (f != NULL) {
    char line[64] = {0};
    char* end = NULL;
    if (fgets(line, sizeof(line), f) != NULL)
      prev = strtoull(line, &end, 10);
    fclose(f);
    if (end == NULL || end == line || (*end != '\n' && *end != '\0') ||
        prev >= UINT32_MAX) {
      st_set_err(err, err_len,
                 "'%s' is corrupt (expected one decimal number); remove it "
                 "only if this node's identity is also new",
                 path);
      return -EBADMSG;
    }
  }
  uint32_t next = (uint32_t) prev + 1;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) {
    st_set_err(err, err_len, "cannot write '%s': %s", tmp, strerror(errno));
    return -errno;
  }
  char text[32];
  int n = snprintf(text, sizeof(text), "%u\n", next);
  int rc = 0;
  if (write(fd, text, (size_t) n) != n || fsync(fd) != 0)
    rc = errno != 0 ? -errno : -EIO;
  if (close(fd) != 0 && rc == 0)
    rc = -errno;
  if (rc == 0 && rename(tmp, path) != 0)
    rc = -errno;
  if (rc != 0) {
    unlink(tmp);
    st_set_err(err, err_len, "cannot write '%s': %s (is the disk full?)", path,
               strerror(-rc));
    return rc;
  }
  int dfd = open(dir, O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  *out = next;
  return 0;
}

void st__state_paths(st__daemon_t* d) {
  const st_daemon_config_t* cfg = d->cfg;
  snprintf(d->data_dir, sizeof(d->data_dir), "%s", cfg->data_dir);
  snprintf(d->checkpoint_path, sizeof(d->checkpoint_path),
           "%s/checkpoint.safetensors", d->data_dir);
  if (cfg->control_path != NULL)
    snprintf(d->control_path, sizeof(d->control_path), "%s", cfg->control_path);
  else
    snprintf(d->control_path, sizeof(d->control_path), "%s/control.sock",
             d->data_dir);
}

int st__state_prepare(st__daemon_t* d, char* err, size_t err_len) {
  const st_daemon_config_t* cfg = d->cfg;
  if (strlen(cfg->data_dir) >= 400) {
    st_set_err(err, err_len, "--data-dir '%s' is too long", cfg->data_dir);
    return -ENAMETOOLONG;
  }
  st__state_paths(d);
  int rc = ensure_dir(cfg->data_dir, err, err_len);
  if (rc != 0)
    return rc;
  /* A node already running on this directory keeps it untouched. */
  if (st__control_in_use(d->control_path)) {
    st_set_err(err, err_len,
               "a node is already running with control socket '%s' (same "
               "--data-dir?); stop it with 'starling leave --control %s' or "
               "use another --data-dir",
               d->control_path, d->control_path);
    return -EADDRINUSE;
  }

  char idpath[600];
  if (cfg->identity_path != NULL) {
    snprintf(idpath, sizeof(idpath), "%s", cfg->identity_path);
    rc = st_identity_load(idpath, &d->ident, err, err_len);
    if (rc != 0)
      return rc;
  } else {
    snprintf(idpath, sizeof(idpath), "%s/identity.key", d->data_dir);
    if (access(idpath, F_OK) == 0) {
      rc = st_identity_load(idpath, &d->ident, err, err_len);
      if (rc != 0)
        return rc;
    } else {
      rc = st_identity_generate(&d->ident);
      if (rc == 0)
        rc = st_identity_write(idpath, &d->ident, err, err_len);
      if (rc != 0)
        return rc;
    }
  }
  return next_boot_epoch(d->data_dir, &d->boot_epoch, err, err_len);
}
