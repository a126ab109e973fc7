/* daemon_state.c: what the daemon keeps in its data directory (its lock,
 * identity, boot epoch, checkpoint and control socket paths, and the
 * removal of temporary files a crash left), the model fingerprint, and
 * address parsing and formatting. Everything the node writes there is
 * mode 0600, and the directory, when the node makes it, 0700. */
#include "node/daemon/daemon_internal.h"
#include "node/train/train_internal.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- Addresses ---------------------------------------------------------- */

/* A host name's address (getaddrinfo: /etc/hosts, then DNS; blocking, so
 * only at start-up and for `starling join`), an IPv4 one when it has
 * both. 0 or -1. */
static int resolve(const char* host, uint16_t port,
                   struct sockaddr_storage* ss) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM};
  struct addrinfo* res = NULL;
  if (getaddrinfo(host, NULL, &hints, &res) != 0 || res == NULL)
    return -1;
  const struct addrinfo* pick = res;
  for (const struct addrinfo* a = res; a != NULL; a = a->ai_next)
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
  int rc = -1;
  if ((pick->ai_family == AF_INET || pick->ai_family == AF_INET6) &&
      pick->ai_addrlen <= sizeof(*ss)) {
    memset(ss, 0, sizeof(*ss));
    memcpy(ss, pick->ai_addr, pick->ai_addrlen);
    if (pick->ai_family == AF_INET)
      ((struct sockaddr_in*) ss)->sin_port = htons(port);
    else
      ((struct sockaddr_in6*) ss)->sin6_port = htons(port);
    rc = 0;
  }
  freeaddrinfo(res);
  return rc;
}

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
  } else if (resolve(host, (uint16_t) port, ss) != 0) {
    st_set_err(err, err_len,
               "'%s': '%s' is neither an IPv4 or IPv6 address nor a host "
               "name this machine can resolve",
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

/* ---- The lock ------------------------------------------------------------ */

/* The PID written in the lock file by the node that holds it, or 0. The
 * holder writes it right after taking the lock, so an empty file is read
 * again for a moment (LOCK_PID_WAIT_MS) before "unknown". */
#define LOCK_PID_WAIT_MS 200
static long lock_holder_pid(int fd) {
  for (int waited = 0; waited <= LOCK_PID_WAIT_MS; waited += 10) {
    char text[32] = {0};
    ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
    char* end = NULL;
    long pid = n > 0 ? strtol(text, &end, 10) : 0;
    if (pid > 0 && end != NULL && *end == '\n')
      return pid;
    usleep(10 * 1000);
  }
  return 0;
}

/* Takes DATA_DIR/lock (flock, exclusive, not waiting) for the node's life
 * and writes this process's PID in it. Two nodes on one directory would
 * share an identity and a boot epoch and overwrite each other's
 * checkpoints; the second is refused here, before it writes anything in
 * the directory or touches the first one's control socket. flock rather
 * than fcntl locks: those belong to the process and vanish when any of its
 * descriptors of the file closes. The file stays when the node stops (an
 * unlink would race with a node starting); only the lock says anything. */
static int take_lock(st__daemon_t* d, char* err, size_t err_len) {
  char path[600];
  snprintf(path, sizeof(path), "%s/lock", d->data_dir);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    int e = errno;
    st_set_err(err, err_len, "cannot open the lock file '%s': %s", path,
               strerror(e));
    return -e;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    if (e == EWOULDBLOCK) {
      long pid = lock_holder_pid(fd);
      char who[32] = "PID unknown";
      if (pid > 0)
        snprintf(who, sizeof(who), "PID %ld", pid);
      st_set_err(err, err_len,
                 "a node is already running with control socket '%s' (%s, "
                 "which holds --data-dir '%s'); stop it, or give this node "
                 "another --data-dir",
                 d->control_path, who, d->data_dir);
    } else {
      st_set_err(err, err_len, "cannot lock '%s': %s", path, strerror(e));
    }
    close(fd);
    return e == EWOULDBLOCK ? -EBUSY : -e;
  }
  (void) fchmod(fd, 0600);
  char text[32];
  int n = snprintf(text, sizeof(text), "%ld\n", (long) getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t) n, 0) != n) {
    int e = errno != 0 ? errno : EIO;
    st_set_err(err, err_len, "cannot write '%s': %s", path, strerror(e));
    close(fd);
    return -e;
  }
  d->lock_fd = fd;
  return 0;
}

void st__state_release(st__daemon_t* d) {
  if (d->lock_fd >= 0)
    close(d->lock_fd);
  d->lock_fd = -1;
}

/* ---- Stale temporary files ------------------------------------------------
 */

#define CKPT_NAME "checkpoint.safetensors"
#define EPOCH_NAME "boot_epoch"

/* True for the names of the temporary files this node's own writers make
 * in its data directory, and only those: "checkpoint.safetensors.tmp."
 * followed by mkstemp's six letters or digits (safetensors_write.c), and
 * "boot_epoch.tmp". */
static bool is_own_temp(const char* name) {
  if (strcmp(name, EPOCH_NAME ".tmp") == 0)
    return true;
  const char* prefix = CKPT_NAME ".tmp.";
  size_t pl = strlen(prefix);
  if (strncmp(name, prefix, pl) != 0 || strlen(name) != pl + 6)
    return false;
  for (size_t i = pl; i < pl + 6; i++) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9');
    if (!ok)
      return false;
  }
  return true;
}

/* Removes the temporary files that a crash in the middle of a write left
 * (the lock is held: no other node writes here). Only regular files with
 * exactly those names go; returns how many did. */
static size_t remove_stale_temps(st__daemon_t* d) {
  DIR* dir = opendir(d->data_dir);
  if (dir == NULL)
    return 0;
  size_t removed = 0;
  struct dirent* e;
  while ((e = readdir(dir)) != NULL) {
    struct stat sb;
    if (!is_own_temp(e->d_name) ||
        fstatat(dirfd(dir), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISREG(sb.st_mode))
      continue;
    if (unlinkat(dirfd(dir), e->d_name, 0) == 0)
      removed++;
    else
      st__dwarn(d, "cannot remove the stale temporary file '%s/%s': %s",
                d->data_dir, e->d_name, strerror(errno));
  }
  closedir(dir);
  if (removed > 0)
    st__dlog(d,
             "removed %zu temporary file%s that an interrupted write left in "
             "%s",
             removed, removed == 1 ? "" : "s", d->data_dir);
  return removed;
}

/* ---- Boot epoch -----------------------------------------------------------
 */

int st__boot_epoch_next(uint64_t prev, int64_t unix_now_s, uint32_t* next) {
  if (prev >= UINT32_MAX)
    return -EOVERFLOW;
  uint64_t clock = 0;
  if (unix_now_s > ST__BOOT_EPOCH_ORIGIN_S)
    clock = (uint64_t) (unix_now_s - ST__BOOT_EPOCH_ORIGIN_S);
  if (clock > UINT32_MAX)
    clock = UINT32_MAX;
  *next = (uint32_t) (prev + 1 > clock ? prev + 1 : clock);
  return 0;
}

/* Reads DATA_DIR/boot_epoch into *prev (0 when there is none, or when it
 * belongs to another identity: that is said and it is ignored). The file
 * is "EPOCH NODE-ID\n"; an older starling wrote "EPOCH\n", taken as this
 * node's. */
static int read_boot_epoch(st__daemon_t* d, const char* path, uint64_t* prev,
                           char* err, size_t err_len) {
  *prev = 0;
  FILE* f = fopen(path, "r");
  if (f == NULL)
    return 0;
  char line[128] = {0};
  char* end = NULL;
  uint64_t v = 0;
  if (fgets(line, sizeof(line), f) != NULL)
    v = strtoull(line, &end, 10);
  fclose(f);
  char mine[33], theirs[33] = "";
  st_node_id_format(&d->ident.id, mine);
  bool ok = end != NULL && end != line && v < UINT32_MAX;
  if (ok && *end == ' ') {
    ok = strlen(end + 1) == 33 && end[33] == '\n';
    if (ok)
      memcpy(theirs, end + 1, 32);
  } else if (ok) {
    ok = *end == '\n' || *end == '\0';
  }
  if (!ok) {
    st_set_err(err, err_len,
               "'%s' is corrupt (expected 'EPOCH NODE-ID'); remove it (the "
               "next boot epoch then comes from the clock)",
               path);
    return -EBADMSG;
  }
  if (theirs[0] != '\0' && strcmp(theirs, mine) != 0) {
    st__dwarn(d,
              "'%s' belongs to node %s, not to this node's identity %s: "
              "ignored (the boot epoch comes from the clock)",
              path, theirs, mine);
    return 0;
  }
  *prev = v;
  return 0;
}

/* Reads the previous boot epoch, writes the next one with this node's id
 * atomically (temporary file, fsync, rename) before the node says anything
 * on the network, so two lives never share an epoch (docs/security.md,
 * "Boot epochs"). */
static int next_boot_epoch(st__daemon_t* d, char* err, size_t err_len) {
  char path[600], tmp[620];
  snprintf(path, sizeof(path), "%s/" EPOCH_NAME, d->data_dir);
  snprintf(tmp, sizeof(tmp), "%s/" EPOCH_NAME ".tmp", d->data_dir);
  uint64_t prev = 0;
  int rc = read_boot_epoch(d, path, &prev, err, err_len);
  if (rc != 0)
    return rc;
  uint32_t next;
  if (st__boot_epoch_next(prev, (int64_t) time(NULL), &next) != 0) {
    st_set_err(err, err_len,
               "'%s' holds the largest boot epoch there is; give this node a "
               "new identity and remove the file",
               path);
    return -EOVERFLOW;
  }
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    st_set_err(err, err_len, "cannot write '%s': %s", tmp, strerror(errno));
    return -errno;
  }
  char id[33], text[64];
  st_node_id_format(&d->ident.id, id);
  int n = snprintf(text, sizeof(text), "%u %s\n", next, id);
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
  int dfd = open(d->data_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  d->boot_epoch = next;
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

/* The identity: --identity, or DATA_DIR/identity.key, made on first start. */
static int load_identity(st__daemon_t* d, char* err, size_t err_len) {
  const st_daemon_config_t* cfg = d->cfg;
  char idpath[600];
  if (cfg->identity_path != NULL)
    return st_identity_load(cfg->identity_path, &d->ident, err, err_len);
  snprintf(idpath, sizeof(idpath), "%s/identity.key", d->data_dir);
  if (access(idpath, F_OK) == 0)
    return st_identity_load(idpath, &d->ident, err, err_len);
  int rc = st_identity_generate(&d->ident);
  if (rc == 0)
    rc = st_identity_write(idpath, &d->ident, err, err_len);
  return rc;
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
  /* A node already running on this directory keeps it untouched: the lock
   * comes before anything is written here. */
  if ((rc = take_lock(d, err, err_len)) != 0)
    return rc;
  /* --control may name a socket outside the directory. */
  if (st__control_in_use(d->control_path)) {
    st_set_err(err, err_len,
               "a node is already running with control socket '%s' (same "
               "--control?); stop it with 'starling leave --control %s' or "
               "use another --control",
               d->control_path, d->control_path);
    return -EADDRINUSE;
  }
  if ((rc = load_identity(d, err, err_len)) != 0)
    return rc;
  remove_stale_temps(d);
  return next_boot_epoch(d, err, err_len);
}
