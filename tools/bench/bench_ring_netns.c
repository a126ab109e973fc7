/* bench_ring_netns.c: the shaped links of `starling-bench ring --netns`.
 *
 * Each member runs in a network namespace of its own, "st-ring-TAG-R",
 * holding one end of a veth pair (eth0, address 10.77.0.(R + 1)/24); the
 * other end (pR) sits in a bridge namespace, "st-ring-TAG-br", enslaved to
 * the bridge br0. Nothing is made in the root namespace, so deleting the
 * namespaces removes every link and the host's own networking is never
 * touched. Both ends of every veth are shaped with
 *
 *   tc qdisc add dev DEV root tbf rate RATE burst 64kb latency 50ms
 *
 * (netem is not available on the kernels we run on): a member's upload and
 * its download are each RATE, as on a full-duplex switch port of that
 * speed. tbf counts whole frames (Ethernet, IP and TCP headers included),
 * so TCP's payload can reach at most 1448 / 1514 = 95.6% of RATE at MTU
 * 1500 (timestamps on), 8948 / 9014 = 99.3% at MTU 9000.
 *
 * The commands are ip(8) and tc(8) of iproute2, run without a shell. The
 * tests/bench comparison programs (Gloo, MPI) get the same topology from
 * tools/bench/bench_ring.sh, which runs the same commands.
 */
#define _GNU_SOURCE /* setns, CLONE_NEWNET */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tools/bench/bench_ring.h"

extern char** environ;

#define MAX_ARGS 24

/* Runs argv (NULL-terminated varargs) and waits; 0 when it exited 0. With
 * quiet, its stderr goes to /dev/null (cleanup of what may not exist). */
static int run(bool quiet, const char* arg0, ...) {
  const char* argv[MAX_ARGS];
  int argc = 0;
  va_list ap;
  va_start(ap, arg0);
  for (const char* a = arg0; a != NULL && argc < MAX_ARGS - 1;
       a = va_arg(ap, const char*))
    argv[argc++] = a;
  va_end(ap);
  argv[argc] = NULL;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (quiet)
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid;
  int rc = posix_spawnp(&pid, argv[0], &fa, NULL, (char* const*) argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    if (!quiet)
      fprintf(stderr, "starling-bench ring: cannot run %s: %s\n", argv[0],
              strerror(rc));
    return -1;
  }
  int st = 0;
  pid_t w;
  while ((w = waitpid(pid, &st, 0)) < 0 && errno == EINTR)
    ;
  if (w < 0 || !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
    if (!quiet) {
      fprintf(stderr, "starling-bench ring: failed:");
      for (int i = 0; i < argc; i++)
        fprintf(stderr, " %s", argv[i]);
      fprintf(stderr, "\n");
    }
    return -1;
  }
  return 0;
}

void st__ring_netns_name(const char* tag, uint32_t rank, char buf[64]) {
  snprintf(buf, 64, "st-ring-%s-%u", tag, rank);
}

static void bridge_name(const char* tag, char buf[64]) {
  snprintf(buf, 64, "st-ring-%s-br", tag);
}

void st__ring_addr(bool netns, uint32_t rank, char out[32]) {
  if (netns)
    snprintf(out, 32, "10.77.0.%u", rank + 1);
  else
    snprintf(out, 32, "127.0.0.1");
}

/* One member's namespace and its shaped veth pair to the bridge. */
static int member_up(const char* br, const char* tag, uint32_t r,
                     const char* rate, const char* mtu) {
  char ns[64], port[16], cidr[48], addr[32];
  st__ring_netns_name(tag, r, ns);
  snprintf(port, sizeof(port), "p%u", r);
  st__ring_addr(true, r, addr);
  snprintf(cidr, sizeof(cidr), "%s/24", addr);
  if (run(false, "ip", "netns", "add", ns, NULL) != 0 ||
      run(false, "ip", "-n", ns, "link", "set", "lo", "up", NULL) != 0 ||
      run(false, "ip", "-n", ns, "link", "add", "eth0", "mtu", mtu, "type",
          "veth", "peer", "name", port, "mtu", mtu, "netns", br, NULL) != 0 ||
      run(false, "ip", "-n", br, "link", "set", port, "master", "br0", NULL) !=
          0 ||
      run(false, "ip", "-n", br, "link", "set", port, "up", NULL) != 0 ||
      run(false, "ip", "-n", ns, "addr", "add", cidr, "dev", "eth0", NULL) !=
          0 ||
      run(false, "ip", "-n", ns, "link", "set", "eth0", "up", NULL) != 0)
    return -1;
  /* Both directions: the member's upload (eth0) and download (pR). */
  if (run(false, "tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", "tbf",
          "rate", rate, "burst", "64kb", "latency", "50ms", NULL) != 0 ||
      run(false, "tc", "-n", br, "qdisc", "add", "dev", port, "root", "tbf",
          "rate", rate, "burst", "64kb", "latency", "50ms", NULL) != 0)
    return -1;
  return 0;
}

int st__ring_netns_up(const char* tag, uint32_t n, const char* rate,
                      unsigned mtu) {
  char br[64], mtus[16];
  bridge_name(tag, br);
  snprintf(mtus, sizeof(mtus), "%u", mtu);
  int rc = 0;
  if (run(false, "ip", "netns", "add", br, NULL) != 0 ||
      run(false, "ip", "-n", br, "link", "add", "br0", "type", "bridge",
          NULL) != 0 ||
      run(false, "ip", "-n", br, "link", "set", "br0", "up", NULL) != 0)
    rc = -1;
  for (uint32_t r = 0; r < n && rc == 0; r++)
    rc = member_up(br, tag, r, rate, mtus);
  if (rc != 0)
    st__ring_netns_down(tag, n);
  return rc;
}

void st__ring_netns_down(const char* tag, uint32_t n) {
  char name[64];
  for (uint32_t r = 0; r < n; r++) {
    st__ring_netns_name(tag, r, name);
    run(true, "ip", "netns", "del", name, NULL);
  }
  bridge_name(tag, name);
  run(true, "ip", "netns", "del", name, NULL);
}

int st__ring_netns_enter(const char* name) {
  char path[128];
  snprintf(path, sizeof(path), "/run/netns/%s", name);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  int rc = setns(fd, CLONE_NEWNET);
  close(fd);
  return rc;
}
