/* bench_ring_member.c: one member of `starling-bench ring`, a forked
 * process running the real ring all-reduce (gossip/ring.c) over the real
 * encrypted streams (crypto/handshake.c, crypto/stream.c), as a node does.
 *
 * Connections: the member listens on its address (port from the OS) and
 * dials the next member; its receiver thread accepts the previous one.
 * With --lanes L (as the daemon's --ring-lanes, where each lane opens
 * with RING_LANE instead of being dialled in order) there are L
 * such connections from a member to the next (dialled one after the other,
 * so the k-th accepted is lane k), each with its own handshake and
 * secretstream: segment i of the member's send stream goes on lane i % L,
 * and the next member takes them back in that order (the lane striper,
 * gossip/lanes.c, as in the daemon). So L threads seal and
 * L open at once, where one secretstream (sequential by construction: each
 * frame's nonce follows from the last) keeps one core per direction.
 *
 * Each connection runs the three-message handshake framed as the daemon
 * frames it (node/daemon/daemon_conn.c: a 4-byte big-endian length, then the
 * st_wire_encode'd HS1, HS2 or HS3), checks that the peer is the member it
 * expects, and then each side sends its stream header; data flows one way
 * only, rank -> rank + 1. The connections are kept for every round (the
 * daemon dials afresh each round: a handshake per round is not measured).
 *
 * Threads, so that sending, receiving, decrypting and adding overlap:
 *
 *   driver    owns the st_ring_t: feeds it the frames the receiver opened
 *             (st_ring_message: decode and add), reports written frames
 *             (st_ring_sent), and copies each SEND into a slot for the
 *             sender (the machine's buffer is only valid until its next
 *             call)
 *   sender    (one a lane) seals a slot into a frame and writes it to the
 *             next member
 *   receiver  (one a lane) reads a frame from the previous member and opens
 *             it into a free slot
 *
 * joined by one mutex and three condition variables. The machine lets at
 * most in_flight (--in-flight, default 4) SENDs be unwritten, so that many
 * out-slots a lane suffice (there are ST__BENCH_RING_MAX_IN_FLIGHT); four
 * in-slots a lane let its receiver run ahead of the driver by a few
 * segments.
 *
 * Rounds: the parent is the barrier. Before each round the member makes
 * the machine and writes its data into the snapshot buffer (not timed),
 * says 'R', waits for 'G', and times from the snapshot to DONE(OK). It then
 * checks the mean against the parent's reference (a float64 mean rounded
 * to float32) and reports its figures (st__ring_report_t).
 */
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "gossip/gossip.h"
#include "tools/bench/bench.h"
#include "tools/bench/bench_ring.h"
#include "tools/cli/cli.h"

#define SLOT_BYTES ST_WIRE_MAX_MESSAGE_BYTES
#define MAX_LANES ST__BENCH_RING_MAX_LANES
#define OUT_SLOTS ST__BENCH_RING_MAX_IN_FLIGHT
#define IN_SLOTS 4u
/* Every blocking socket call gives up after this long, so a member whose
 * neighbour died fails instead of hanging (the parent bounds the run too). */
#define IO_TIMEOUT_S 60

typedef struct {
  uint8_t* buf;
  size_t len;
} slot_t;

typedef struct member_s member_t;

/* One connection to the next member and one from the previous. */
typedef struct {
  member_t* m;
  unsigned idx;
  int next_fd, prev_fd;
  st_stream_t tx, rx;    /* to the next member, from the previous one */
  slot_t out[OUT_SLOTS]; /* SENDs for the sender, in order */
  unsigned out_head, out_count;
  uint64_t written;    /* frames the sender has written */
  slot_t in[IN_SLOTS]; /* opened frames for the driver, in order */
  unsigned in_head, in_count;
  bool rx_final; /* the previous member's final frame came */
} lane_t;

struct member_s {
  const st__ring_member_cfg_t* cfg;
  int listen_fd;
  uint16_t next_port;
  pthread_mutex_t mu;
  pthread_cond_t cv_driver, cv_sender, cv_receiver;
  lane_t lanes[MAX_LANES];
  unsigned n_lanes;
  unsigned dialled, accepted; /* lanes connected, in lane order */
  st_lanes_t stripe; /* the driver's: which lane a segment goes or comes on;
                        kept for every round, as the connections are */
  bool quit;         /* no more rounds: seal the final frames */
  int err;           /* the first I/O error */
  unsigned ready;    /* I/O threads done with their handshake */
  double cpu_seal, cpu_write, cpu_read, cpu_open;
};

static double cpu_now(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static double thread_cpu(void) {
  return cpu_now(CLOCK_THREAD_CPUTIME_ID);
}

static uint64_t now_ms(void) {
  return (uint64_t) (st_now_s() * 1e3);
}

static uint64_t mix64(uint64_t z) { /* splitmix64's finalizer */
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Multiples of 2^-23 in [-1, 1): exact in float32 and in float64. */
void st__ring_fill(uint64_t seed, uint32_t m, uint64_t first, uint64_t count,
                   float* out) {
  uint64_t base = seed ^ ((uint64_t) (m + 1) * 0xd1b54a32d192ed03ull);
  for (uint64_t i = 0; i < count; i++) {
    uint64_t z = mix64(base + (first + i) * 0x9e3779b97f4a7c15ull);
    out[i] = (float) ((int32_t) (z >> 40) - (1 << 23)) * 0x1p-23f;
  }
}

/* Records the first error and wakes every thread. */
static void fail(member_t* m, int err) {
  pthread_mutex_lock(&m->mu);
  if (m->err == 0)
    m->err = err;
  pthread_cond_broadcast(&m->cv_driver);
  pthread_cond_broadcast(&m->cv_sender);
  pthread_cond_broadcast(&m->cv_receiver);
  pthread_mutex_unlock(&m->mu);
}

/* ==== Blocking I/O and the handshake ========================================
 */

static void tune(int fd) {
  int one = 1;
  struct timeval tv = {IO_TIMEOUT_S, 0};
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* The handshake on a connected socket, then both stream headers, checking
 * that the peer is the member expected. Data flows one way: the stream of
 * the direction that carries nothing is wiped at once. */
static int handshake(lane_t* l, int fd, bool initiator, uint32_t peer) {
  const st__ring_member_cfg_t* c = l->m->cfg;
  return st__bench_handshake(
      fd, initiator, &c->identities[c->rank], c->keys, &c->identities[peer].id,
      NULL, initiator ? &l->tx : NULL, initiator ? NULL : &l->rx);
}

/* ==== The I/O threads =======================================================
 */

static void* sender_main(void* arg) {
  lane_t* l = arg;
  member_t* m = l->m;
  const st__ring_member_cfg_t* c = m->cfg;
  uint32_t next = (c->rank + 1) % c->n;
  size_t cap = SLOT_BYTES + ST_STREAM_ABYTES + ST_FRAME_LENGTH_BYTES;
  uint8_t* frame = malloc(cap);
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_port = htons(m->next_port);
  char addr[32];
  st__ring_addr(c->netns != NULL, next, addr);
  inet_pton(AF_INET, addr, &a.sin_addr);
  /* Lane k dials once lane k - 1 is through its handshake, so that the
   * next member accepts the lanes in order. */
  pthread_mutex_lock(&m->mu);
  while (m->dialled < l->idx && m->err == 0)
    pthread_cond_wait(&m->cv_sender, &m->mu);
  int rc = m->err;
  pthread_mutex_unlock(&m->mu);
  if (rc == 0 && (frame == NULL || l->next_fd < 0 ||
                  connect(l->next_fd, (struct sockaddr*) &a, sizeof(a)) != 0))
    rc = -EIO;
  if (rc == 0) {
    tune(l->next_fd);
    rc = handshake(l, l->next_fd, true, next);
  }
  pthread_mutex_lock(&m->mu);
  m->ready++;
  m->dialled++;
  pthread_cond_broadcast(&m->cv_driver);
  pthread_cond_broadcast(&m->cv_sender);
  pthread_mutex_unlock(&m->mu);
  while (rc == 0) {
    pthread_mutex_lock(&m->mu);
    while (l->out_count == 0 && !m->quit && m->err == 0)
      pthread_cond_wait(&m->cv_sender, &m->mu);
    bool last = l->out_count == 0 && m->quit && m->err == 0;
    slot_t* s = m->err == 0 && !last ? &l->out[l->out_head] : NULL;
    pthread_mutex_unlock(&m->mu);
    if (s == NULL && !last)
      break;
    size_t len = 0;
    double t0 = thread_cpu();
    /* The last frame is the stream's final one, empty. */
    rc = st_stream_seal_frame(&l->tx, last ? NULL : s->buf, last ? 0 : s->len,
                              last, frame, cap, &len);
    double t1 = thread_cpu();
    if (rc == 0)
      rc = st__bench_write_all(l->next_fd, frame, len);
    double t2 = thread_cpu();
    pthread_mutex_lock(&m->mu);
    m->cpu_seal += t1 - t0;
    m->cpu_write += t2 - t1;
    if (!last) {
      l->out_head = (l->out_head + 1) % OUT_SLOTS;
      l->out_count--;
      l->written++;
      pthread_cond_broadcast(&m->cv_driver);
    }
    pthread_mutex_unlock(&m->mu);
    if (last)
      break;
  }
  if (rc != 0)
    fail(m, rc);
  st_stream_wipe(&l->tx);
  free(frame);
  return NULL;
}

static void* receiver_main(void* arg) {
  lane_t* l = arg;
  member_t* m = l->m;
  const st__ring_member_cfg_t* c = m->cfg;
  uint8_t* ct = malloc(ST_FRAME_MAX_DEFAULT);
  struct pollfd p = {m->listen_fd, POLLIN, 0};
  int rc = -EIO, fd = -1;
  /* The k-th connection accepted is lane k (sender_main dials in order). */
  pthread_mutex_lock(&m->mu);
  while (m->accepted < l->idx && m->err == 0)
    pthread_cond_wait(&m->cv_receiver, &m->mu);
  bool go = m->err == 0;
  pthread_mutex_unlock(&m->mu);
  if (go && ct != NULL && poll(&p, 1, IO_TIMEOUT_S * 1000) == 1 &&
      (fd = accept(m->listen_fd, NULL, NULL)) >= 0) {
    pthread_mutex_lock(&m->mu); /* the driver may shut it down */
    l->prev_fd = fd;
    pthread_mutex_unlock(&m->mu);
    tune(fd);
    rc = handshake(l, fd, false, (c->rank + c->n - 1) % c->n);
  }
  pthread_mutex_lock(&m->mu);
  m->ready++;
  m->accepted++;
  pthread_cond_broadcast(&m->cv_driver);
  pthread_cond_broadcast(&m->cv_receiver);
  pthread_mutex_unlock(&m->mu);
  while (rc == 0) {
    uint8_t lb[ST_FRAME_LENGTH_BYTES];
    size_t ct_len = 0, len = 0;
    bool final = false;
    double t0 = thread_cpu();
    if ((rc = st__bench_read_all(fd, lb, sizeof(lb))) != 0 ||
        (rc = st_frame_length(lb, ST_FRAME_MAX_DEFAULT, NULL, &ct_len)) != 0 ||
        (rc = st__bench_read_all(fd, ct, ct_len)) != 0)
      break;
    double t1 = thread_cpu();
    pthread_mutex_lock(&m->mu);
    while (l->in_count == IN_SLOTS && m->err == 0)
      pthread_cond_wait(&m->cv_receiver, &m->mu);
    /* The slot after the queued ones: the driver does not touch it. */
    slot_t* s = &l->in[(l->in_head + l->in_count) % IN_SLOTS];
    rc = m->err;
    pthread_mutex_unlock(&m->mu);
    if (rc != 0)
      break;
    double t2 = thread_cpu();
    rc = st_stream_open_frame(&l->rx, NULL, ct, ct_len, s->buf, SLOT_BYTES,
                              &len, &final);
    double t3 = thread_cpu();
    pthread_mutex_lock(&m->mu);
    m->cpu_read += t1 - t0;
    m->cpu_open += t3 - t2;
    if (rc == 0 && final) {
      l->rx_final = true;
    } else if (rc == 0) {
      s->len = len;
      l->in_count++;
    }
    pthread_cond_broadcast(&m->cv_driver);
    pthread_mutex_unlock(&m->mu);
    if (final)
      break;
  }
  if (rc != 0)
    fail(m, rc);
  st_stream_wipe(&l->rx);
  free(ct);
  return NULL;
}

/* ==== The driver ============================================================
 */

typedef struct {
  bool done, applied;
  st_ring_result_t result;
  uint64_t acked; /* `written` already reported to the machine */
  double cpu_machine, cpu_copy;
  double tail; /* st__ring_report_t.tail */
} drive_t;

/* Drains the machine's actions; SENDs are copied to the sender's slots. */
static void drain(member_t* m, st_ring_t* x, drive_t* d) {
  st_ract_t a;
  for (;;) {
    double t0 = thread_cpu();
    bool got = st_ring_next_action(x, &a);
    d->cpu_machine += thread_cpu() - t0; /* a SEND is encoded here */
    if (!got)
      return;
    if (a.kind == ST_RACT_SEND) {
      /* Segment i of the send stream goes on lane i % lanes. */
      lane_t* l = &m->lanes[st_lanes_send_lane(&m->stripe)];
      pthread_mutex_lock(&m->mu);
      /* The machine keeps at most in_flight SENDs unwritten. */
      slot_t* s = &l->out[(l->out_head + l->out_count) % OUT_SLOTS];
      bool room = l->out_count < OUT_SLOTS && a.len <= SLOT_BYTES;
      pthread_mutex_unlock(&m->mu);
      if (!room) {
        st_ring_abort(x, now_ms(), ST_RING_FAIL_ABORTED);
        continue;
      }
      double t1 = thread_cpu();
      memcpy(s->buf, a.data, a.len);
      s->len = a.len;
      d->cpu_copy += thread_cpu() - t1;
      pthread_mutex_lock(&m->mu);
      l->out_count++;
      st_lanes_send_done(&m->stripe);
      pthread_cond_broadcast(&m->cv_sender);
      pthread_mutex_unlock(&m->mu);
    } else if (a.kind == ST_RACT_APPLY) {
      d->applied = a.n == m->cfg->floats;
    } else if (a.kind == ST_RACT_DONE) {
      d->done = true;
      d->result = a.result;
    }
  }
}

/* Feeds the machine until DONE: written frames, then one opened frame at a
 * time, draining after each so that a segment is forwarded at once. */
static uint64_t written_total(const member_t* m) { /* under mu */
  uint64_t w = 0;
  for (unsigned i = 0; i < m->n_lanes; i++)
    w += m->lanes[i].written;
  return w;
}

static void drive(member_t* m, st_ring_t* x, drive_t* d) {
  while (!d->done) {
    /* The next segment of the receive stream comes on lane fed % L. */
    uint32_t k = st_lanes_recv_lane(&m->stripe);
    lane_t* l = &m->lanes[k];
    pthread_mutex_lock(&m->mu);
    /* Only the final frame of the lane the next segment comes on matters:
     * the previous member, once done, ends each lane after its own last
     * frame, and another lane may end while this one still has data. */
    while (l->in_count == 0 && written_total(m) == d->acked && m->err == 0 &&
           !l->rx_final) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_sec += 1;
      if (pthread_cond_timedwait(&m->cv_driver, &m->mu, &ts) == ETIMEDOUT)
        break;
    }
    uint64_t written = written_total(m);
    uint64_t newly = written - d->acked;
    d->acked = written;
    slot_t* s = l->in_count > 0 ? &l->in[l->in_head] : NULL;
    int err = m->err;
    bool ended = l->rx_final;
    pthread_mutex_unlock(&m->mu);
    double t0 = thread_cpu(), w0 = st_now_s();
    uint64_t now = now_ms();
    for (uint64_t i = 0; i < newly; i++)
      st_ring_sent(x, now);
    if (s != NULL) {
      /* Taken from the lane whose turn it is: always FEED, but for a
       * segment beyond the round's (the machine would refuse it too). */
      if (st_lanes_accept(&m->stripe, k) == ST_LANES_FEED)
        st_ring_message(x, now, s->buf, s->len);
      else
        st_ring_abort(x, now, ST_RING_FAIL_PROTOCOL);
      pthread_mutex_lock(&m->mu);
      l->in_head = (l->in_head + 1) % IN_SLOTS;
      l->in_count--;
      pthread_cond_broadcast(&m->cv_receiver);
      pthread_mutex_unlock(&m->mu);
    } else if (err != 0 || (ended && st_lanes_end(&m->stripe, k) ==
                                         ST_LANES_ERR_EARLY_END)) {
      /* An I/O error, or the previous member ended the lane while this
       * round still expects segments on it. */
      st_ring_abort(x, now, ST_RING_FAIL_CLOSED);
    }
    st_ring_tick(x, now);
    d->cpu_machine += thread_cpu() - t0;
    drain(m, x, d);
    if (d->done)
      d->tail = st_now_s() - w0;
  }
}

/* One round: returns 0 when it completed and matched the reference. */
/* Checks the round's mean against the parent's reference and fills the
 * report's verdict. The bound: inputs in [-1, 1), n - 1 float32 additions
 * along the ring (each off by at most 2^-24 of a partial sum <= k), the
 * division by n and the reference's own rounding:
 * |mean - ref| < (n + 4) 2^-24. */
static void check_mean(const st__ring_member_cfg_t* c, const st_ring_t* x,
                       const drive_t* d, st__ring_report_t* rep) {
  const float* mean = st_ring_mean(x);
  double tol = (c->n + 4) * 0x1p-24, worst = 0;
  if (d->result == ST_RING_OK && mean != NULL) {
    for (uint64_t i = 0; i < c->floats; i++) {
      double e = fabs((double) mean[i] - (double) c->ref[i]);
      if (!(e <= worst)) /* NaN counts as worst */
        worst = isnan(e) ? INFINITY : e;
    }
    st_hash_once(mean, c->floats * sizeof(float), rep->hash, sizeof(rep->hash));
  }
  rep->max_err = worst;
  rep->verified =
      d->result == ST_RING_OK && mean != NULL && d->applied && worst <= tol;
}

/* The round's machine with the member's data in its snapshot buffer (not
 * timed), the receive stream's segments told to the striper; then 'R' to
 * the parent and its 'G'. -1 on any failure (x freed). */
static int round_prepare(member_t* m, uint32_t round, drive_t* d,
                         st_ring_t** out) {
  const st__ring_member_cfg_t* c = m->cfg;
  st_ring_config_t rc;
  st_ring_config_default(&rc);
  rc.segment_floats = c->segment_floats;
  rc.in_flight = c->in_flight;
  st_ring_t* x = NULL;
  if (st_ring_new(&rc, round + 1, c->n, c->rank, c->floats, now_ms(), &x) != 0)
    return -1;
  st_ring_progress_t p;
  st_ring_progress(x, &p);
  st_lanes_expect(&m->stripe, p.segments_to_receive);
  drain(m, x, d); /* TIMER, WANT_SNAPSHOT */
  float* own = st_ring_snapshot_buffer(x);
  uint8_t go = 'R';
  if (own != NULL) {
    st__ring_fill(c->seed, c->rank, 0, c->floats, own);
    if (c->corrupt && c->rank == 0)
      own[c->floats / 2] += 0.5f; /* the mean moves by 0.5 / n */
  }
  if (own == NULL || st__bench_write_all(c->up_fd, &go, 1) != 0 ||
      st__bench_read_all(c->down_fd, &go, 1) != 0 || go != 'G') {
    st_ring_free(x);
    return -1;
  }
  *out = x;
  return 0;
}

/* One round: returns 0 when it completed and matched the reference. */
static int round_run(member_t* m, uint32_t round, st__ring_report_t* rep,
                     uint64_t* acked) {
  const st__ring_member_cfg_t* c = m->cfg;
  st_ring_t* x = NULL;
  drive_t d;
  memset(&d, 0, sizeof(d));
  memset(rep, 0, sizeof(*rep));
  rep->result = -1;
  d.acked = *acked;
  if (round_prepare(m, round, &d, &x) != 0)
    return -1;
  pthread_mutex_lock(&m->mu);
  double s0 = m->cpu_seal, w0 = m->cpu_write, r0 = m->cpu_read,
         o0 = m->cpu_open;
  pthread_mutex_unlock(&m->mu);
  double p0 = cpu_now(CLOCK_PROCESS_CPUTIME_ID);
  rep->t_start = st_now_s();
  double t0 = thread_cpu();
  st_ring_snapshot(x, now_ms(), st_ring_snapshot_buffer(x), c->floats);
  d.cpu_machine = thread_cpu() - t0;
  drain(m, x, &d);
  drive(m, x, &d);
  rep->t_end = st_now_s();
  rep->cpu_process = cpu_now(CLOCK_PROCESS_CPUTIME_ID) - p0;
  pthread_mutex_lock(&m->mu);
  rep->cpu_seal = m->cpu_seal - s0;
  rep->cpu_write = m->cpu_write - w0;
  rep->cpu_read = m->cpu_read - r0;
  rep->cpu_open = m->cpu_open - o0;
  pthread_mutex_unlock(&m->mu);
  rep->cpu_machine = d.cpu_machine;
  rep->cpu_copy = d.cpu_copy;
  rep->tail = d.tail;
  rep->result = (int32_t) d.result;
  *acked = d.acked;
  check_mean(c, x, &d, rep);
  st_ring_free(x);
  return rep->verified ? 0 : -1;
}

/* ==== The member's life =====================================================
 */

/* The member's state, its slots, and the striper: lane k of L each way,
 * the k-th dialled and the k-th accepted (sender_main, receiver_main).
 * false when a slot could not be allocated. */
static bool member_init(member_t* m, const st__ring_member_cfg_t* c) {
  memset(m, 0, sizeof(*m));
  m->cfg = c;
  m->listen_fd = -1;
  m->n_lanes = c->lanes >= 1 && c->lanes <= MAX_LANES ? c->lanes : 1;
  pthread_mutex_init(&m->mu, NULL);
  pthread_cond_init(&m->cv_driver, NULL);
  pthread_cond_init(&m->cv_sender, NULL);
  pthread_cond_init(&m->cv_receiver, NULL);
  st_lanes_init(&m->stripe, m->n_lanes); /* n_lanes is within range */
  bool ok = true;
  for (unsigned k = 0; k < m->n_lanes; k++) {
    lane_t* l = &m->lanes[k];
    l->m = m;
    l->idx = k;
    l->next_fd = l->prev_fd = -1;
    st_lanes_join(&m->stripe, k, m->n_lanes, false);
    for (unsigned i = 0; i < OUT_SLOTS; i++)
      ok = ok && (l->out[i].buf = malloc(SLOT_BYTES)) != NULL;
    for (unsigned i = 0; i < IN_SLOTS; i++)
      ok = ok && (l->in[i].buf = malloc(SLOT_BYTES)) != NULL;
  }
  return ok;
}

/* Listens, tells the parent the port, learns the next member's. */
static int member_listen(member_t* m) {
  const st__ring_member_cfg_t* c = m->cfg;
  char addr[32];
  st__ring_addr(c->netns != NULL, c->rank, addr);
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  inet_pton(AF_INET, addr, &a.sin_addr);
  socklen_t al = sizeof(a);
  m->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
  if (m->listen_fd < 0 ||
      bind(m->listen_fd, (struct sockaddr*) &a, sizeof(a)) != 0 ||
      listen(m->listen_fd, (int) MAX_LANES) != 0 ||
      getsockname(m->listen_fd, (struct sockaddr*) &a, &al) != 0)
    return -1;
  uint16_t port = ntohs(a.sin_port);
  if (st__bench_write_all(c->up_fd, (uint8_t*) &port, sizeof(port)) != 0 ||
      st__bench_read_all(c->down_fd, (uint8_t*) &m->next_port, sizeof(port)) !=
          0)
    return -1;
  return 0;
}

/* Starts each lane's receiver and sender and waits for their handshakes;
 * returns the lanes whose two threads run (0 on an error before any). */
static unsigned start_lanes(member_t* m, pthread_t* ts, pthread_t* tr) {
  unsigned started = 0;
  for (; started < m->n_lanes; started++) {
    lane_t* l = &m->lanes[started];
    l->next_fd = socket(AF_INET, SOCK_STREAM, 0); /* connected by the sender */
    if (pthread_create(&tr[started], NULL, receiver_main, l) != 0)
      break;
    if (pthread_create(&ts[started], NULL, sender_main, l) != 0) {
      fail(m, -EAGAIN);
      shutdown(m->listen_fd, SHUT_RDWR);
      pthread_join(tr[started], NULL);
      break;
    }
  }
  if (started < m->n_lanes)
    fail(m, -EAGAIN);
  pthread_mutex_lock(&m->mu);
  while (m->ready < 2 * started && m->err == 0)
    pthread_cond_wait(&m->cv_driver, &m->mu);
  pthread_mutex_unlock(&m->mu);
  return started;
}

/* Lets the senders seal their final frames and joins every thread; after
 * a failure first unblocks them all (the neighbours see the connections
 * end). */
static void stop_lanes(member_t* m, unsigned started, const pthread_t* ts,
                       const pthread_t* tr, bool failed) {
  pthread_mutex_lock(&m->mu);
  m->quit = true;
  pthread_cond_broadcast(&m->cv_sender);
  pthread_mutex_unlock(&m->mu);
  if (failed) {
    fail(m, -ECANCELED);
    for (unsigned k = 0; k < m->n_lanes; k++) {
      pthread_mutex_lock(&m->mu);
      int prev = m->lanes[k].prev_fd;
      pthread_mutex_unlock(&m->mu);
      if (m->lanes[k].next_fd >= 0)
        shutdown(m->lanes[k].next_fd, SHUT_RDWR);
      if (prev >= 0)
        shutdown(prev, SHUT_RDWR);
    }
    shutdown(m->listen_fd, SHUT_RDWR); /* a receiver still in poll */
  }
  for (unsigned k = 0; k < started; k++) {
    pthread_join(ts[k], NULL);
    pthread_join(tr[k], NULL);
  }
}

static void member_free(member_t* m) {
  for (unsigned k = 0; k < m->n_lanes; k++) {
    lane_t* l = &m->lanes[k];
    for (unsigned i = 0; i < OUT_SLOTS; i++)
      free(l->out[i].buf);
    for (unsigned i = 0; i < IN_SLOTS; i++)
      free(l->in[i].buf);
    if (l->next_fd >= 0)
      close(l->next_fd);
    if (l->prev_fd >= 0)
      close(l->prev_fd);
  }
  if (m->listen_fd >= 0)
    close(m->listen_fd);
}

int st__ring_member(const st__ring_member_cfg_t* c) {
  /* The machine allocates its two vectors in every st_ring_new. Served by
   * mmap (glibc's choice for large blocks) they would be page-faulted and
   * zeroed again inside every timed round, a third of the time at 64 MiB;
   * kept in the heap and never trimmed, the warm-up round pays that once
   * and the measured rounds see a node's steady state. */
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, INT32_MAX);
  member_t m;
  pthread_t ts[MAX_LANES], tr[MAX_LANES];
  int status = 1;
  if (!member_init(&m, c) || member_listen(&m) != 0)
    goto out;
  unsigned started = start_lanes(&m, ts, tr);
  pthread_mutex_lock(&m.mu);
  status = m.err == 0 ? 0 : 1;
  pthread_mutex_unlock(&m.mu);
  uint64_t acked = 0;
  for (uint32_t r = 0; r < c->rounds && status == 0; r++) {
    st__ring_report_t rep;
    int rc = round_run(&m, r, &rep, &acked);
    if (st__bench_write_all(c->up_fd, (uint8_t*) &rep, sizeof(rep)) != 0 ||
        rc != 0)
      status = 1;
  }
  stop_lanes(&m, started, ts, tr, status != 0);
  if (m.err != 0)
    status = 1;
out:
  member_free(&m);
  return status;
}
