/* probe_net.h: what the test clients of tests/integration/ (ring_lane_probe,
 * fetch_probe, hs1_probe) share to reach a node: a TCP connection to "IP:PORT".
 * Header only, so that each probe stays one source file. */
#ifndef STARLING_TESTS_PROBE_NET_H
#define STARLING_TESTS_PROBE_NET_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* A socket connected to hostport ("IPv4:PORT"), or -1. When rcvbuf > 0
 * the receive buffer is set to it before connect, so that it bounds the
 * window the node sees. */
static inline int probe_dial(const char* hostport, int rcvbuf) {
  char host[64];
  const char* colon = strrchr(hostport, ':');
  if (colon == NULL || (size_t) (colon - hostport) >= sizeof(host))
    return -1;
  memcpy(host, hostport, (size_t) (colon - hostport));
  host[colon - hostport] = '\0';
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t) atoi(colon + 1));
  if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
    return -1;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd >= 0 && rcvbuf > 0)
    (void) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  if (fd >= 0 && connect(fd, (struct sockaddr*) &a, sizeof(a)) != 0) {
    close(fd);
    fd = -1;
  }
  return fd;
}

#endif
