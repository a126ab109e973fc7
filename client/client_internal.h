/* client_internal.h: what client.c (the step boundary and the API) shares
 * with client_session.c (the shared segment, the socket and the attach
 * conversation). Internal to client/; the public header is
 * client/starling/client.h. */
#ifndef STARLING_CLIENT_INTERNAL_H
#define STARLING_CLIENT_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/un.h>

#include "attach/attach.h"
#include "client/starling/client.h"

/* How often a step boundary with nothing to serve asks the socket whether
 * the node is still there: often enough that a program learns within a
 * fraction of a second that its node went away, rarely enough that a
 * boundary costs a clock read (vDSO, no system call) and a compare. */
#define ST__CLIENT_CHECK_INTERVAL_S 0.1
/* Between two attach attempts while waiting for the node to come back. */
#define ST__CLIENT_RETRY_INTERVAL_S 0.5
/* The "ready" / "error ..." line: one sentence. */
#define ST__CLIENT_LINE_MAX 1024
/* The reply frame: {"ok":..,"step":..,"source":..} or a sentence; a few
 * hundred bytes, capped well above that. */
#define ST__CLIENT_REPLY_MAX (64u << 10)

struct st_client_s {
  st_client_options_t opt;
  char path[sizeof(((struct sockaddr_un*) 0)->sun_path)];
  st_attach_model_t model; /* names, shapes, offsets in the segment */
  float** data;            /* per tensor: the program's memory, borrowed */
  int sock;                /* the node's control connection; -1: none */
  uint8_t* seg;            /* the mapped segment; NULL: none */
  uint64_t seg_bytes;
  st_attach_header_t* h; /* = seg */
  uint64_t acked;        /* the last req_seq served (= h->ack_seq) */
  uint64_t gate_seq;     /* the req_seq st_client_pending saw last */
  bool gated;            /* the next step serves only gate_seq */
  uint64_t cluster_step;
  double next_check_s; /* coarse monotonic time of the next liveness check */
  bool gone;           /* the node went away for good: -ENOTCONN */
  char err[512];
};

/* Seconds on CLOCK_MONOTONIC_COARSE: a vDSO read, for the step boundary's
 * time gate. */
double st__client_coarse_now_s(void);

/* Creates a segment holding the tensors' current values in area A,
 * connects to c->path, runs the attach conversation (attach.h, steps 1 to
 * 4) with everything bounded by deadline_s (st_now_s; INFINITY: none), and
 * on the node's ok replaces c's segment and socket with the new ones,
 * copies area B into the tensors and takes the reply's step. On failure c
 * is unchanged but for c->err, and the negative errno of client.h's
 * st_client_attach is returned. */
int st__client_session_open(st_client_t* c, double deadline_s);

/* Whether the node closed the connection (or it failed): reads and drops
 * anything pending without blocking. */
bool st__client_peer_closed(int sock);

/* Sends the detach frame without blocking ({"op":"detach","final":B};
 * final: area A holds the program's last parameters); errors are ignored
 * (the node treats a closed connection as a detach without them). */
void st__client_send_detach(int sock, bool final);

/* Bounded socket I/O (every wait a poll() against deadline_s, st_now_s;
 * INFINITY: none; sends are MSG_NOSIGNAL). wait_fd: 0, -ETIMEDOUT or
 * -errno. send_all: the whole of p[0..n), pass_fd (>= 0) in SCM_RIGHTS
 * with the first byte. recv_all: exactly n bytes, -ECONNRESET when the
 * node closed first. recv_line: one line without its '\n' (nothing after
 * it consumed), -EMSGSIZE beyond cap. */
int st__client_wait_fd(int fd, short events, double deadline_s);
int st__client_send_all(int sock, const uint8_t* p, size_t n, int pass_fd,
                        double deadline_s);
int st__client_recv_all(int sock, uint8_t* p, size_t n, double deadline_s);
int st__client_recv_line(int sock, char* line, size_t cap, double deadline_s);
/* recv_line, and the descriptor that came with the line's bytes in
 * SCM_RIGHTS into *fd (-1: none; the caller closes it). */
int st__client_recv_line_fd(int sock, char* line, size_t cap, int* fd,
                            double deadline_s);

/* Unmaps c's segment and closes its socket. */
void st__client_session_close(st_client_t* c);

/* comm.c: sets c's error sentence (st_comm_error) to text, for the
 * algorithms of comm_algos.c. */
void st__comm_set_error(st_comm_t* c, const char* text);

#endif
