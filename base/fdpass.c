/* fdpass.c: a descriptor passed with bytes on a Unix socket (SCM_RIGHTS),
 * both ways: the one place that builds and reads the control message, for
 * the attach segment (client to node) and the collectives segment (node
 * to client). */
#define _GNU_SOURCE /* MSG_CMSG_CLOEXEC */
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/base.h"

ssize_t st_send_fd(int sock, const void* p, size_t n, int fd, int flags) {
  struct iovec iov = {.iov_base = (void*) p, .iov_len = n};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int))];
  } ctl;
  if (fd >= 0) {
    memset(&ctl, 0, sizeof ctl);
    msg.msg_control = ctl.buf;
    msg.msg_controllen = sizeof ctl.buf;
    struct cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof(int));
  }
  return sendmsg(sock, &msg, flags);
}

ssize_t st_recv_fd(int sock, void* p, size_t n, int* fd, int flags) {
  struct iovec iov = {.iov_base = p, .iov_len = n};
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(4 * sizeof(int))];
  } ctl;
  struct msghdr msg = {.msg_iov = &iov,
                       .msg_iovlen = 1,
                       .msg_control = ctl.buf,
                       .msg_controllen = sizeof ctl.buf};
  ssize_t r = recvmsg(sock, &msg, flags | MSG_CMSG_CLOEXEC);
  if (r < 0)
    return r;
  for (struct cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != NULL;
       cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
      continue;
    size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; i++) {
      int got;
      memcpy(&got, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
      if (*fd < 0)
        *fd = got;
      else
        close(got);
    }
  }
  return r;
}
