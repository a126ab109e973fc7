/* bench_exchange.c: `starling-bench exchange`, the limit an averaging
 * exchange is measured against (docs/benchmarks.md): the time to encrypt
 * and send the same bytes on this machine.
 *
 * Two endpoints joined by a loopback TCP connection, as two nodes are. Each
 * sends --mib MiB to the other in 1 MiB frames sealed with the stream
 * cipher the nodes use (crypto/stream.c), and opens the frames it receives,
 * both directions at once, every sealing and opening on its own thread (4
 * threads), so the figure is the floor for this machine whatever the
 * daemon's threading: the bytes must be encrypted, carried and decrypted.
 * Prints the median over --repeats of the wall time for both directions to
 * complete, and the AEAD throughput of one core measured in the same run.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "crypto/crypto.h"
#include "tools/bench/bench.h"
#include "tools/cli/cli.h"

#define CMD "starling-bench exchange"
#define FRAME_BYTES ST__BENCH_FRAME_BYTES

typedef struct {
  int fd;
  uint8_t key[ST_KEY_BYTES];
  size_t frames;
  int rc;
} side_t;

static void* sender(void* arg) {
  side_t* s = arg;
  st_stream_t st;
  uint8_t hdr[ST_STREAM_HEADER_BYTES];
  size_t cap = FRAME_BYTES + ST_STREAM_ABYTES + ST_FRAME_LENGTH_BYTES;
  uint8_t* plain = calloc(1, FRAME_BYTES);
  uint8_t* frame = malloc(cap);
  s->rc = -ENOMEM;
  if (plain != NULL && frame != NULL &&
      st_stream_tx_init(&st, s->key, hdr) == 0 &&
      st__bench_write_all(s->fd, hdr, sizeof(hdr)) == 0) {
    s->rc = 0;
    for (size_t i = 0; i < s->frames && s->rc == 0; i++) {
      size_t len = 0;
      s->rc = st_stream_seal_frame(&st, plain, FRAME_BYTES, false, frame, cap,
                                   &len);
      if (s->rc == 0)
        s->rc = st__bench_write_all(s->fd, frame, len);
    }
  }
  st_stream_wipe(&st);
  free(plain);
  free(frame);
  return NULL;
}

static void* receiver(void* arg) {
  side_t* s = arg;
  st_stream_t st;
  uint8_t hdr[ST_STREAM_HEADER_BYTES];
  uint8_t* ct = malloc(FRAME_BYTES + ST_STREAM_ABYTES);
  uint8_t* plain = malloc(FRAME_BYTES);
  s->rc = -ENOMEM;
  if (ct != NULL && plain != NULL &&
      st__bench_read_all(s->fd, hdr, sizeof(hdr)) == 0 &&
      st_stream_rx_init(&st, s->key, hdr) == 0) {
    s->rc = 0;
    for (size_t i = 0; i < s->frames && s->rc == 0; i++) {
      uint8_t lenb[ST_FRAME_LENGTH_BYTES];
      size_t ct_len = 0, got = 0;
      bool final = false;
      s->rc = st__bench_read_all(s->fd, lenb, sizeof(lenb));
      if (s->rc == 0)
        s->rc = st_frame_length(lenb, ST_FRAME_MAX_DEFAULT, NULL, &ct_len);
      if (s->rc == 0)
        s->rc = st__bench_read_all(s->fd, ct, ct_len);
      if (s->rc == 0)
        s->rc = st_stream_open_frame(&st, NULL, ct, ct_len, plain, FRAME_BYTES,
                                     &got, &final);
    }
  }
  st_stream_wipe(&st);
  free(ct);
  free(plain);
  return NULL;
}

/* A connected loopback TCP pair. */
static int tcp_pair(int fds[2]) {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof(a);
  if (l < 0 || bind(l, (struct sockaddr*) &a, sizeof(a)) != 0 ||
      listen(l, 1) != 0 || getsockname(l, (struct sockaddr*) &a, &al) != 0)
    return -EIO;
  fds[0] = socket(AF_INET, SOCK_STREAM, 0);
  if (fds[0] < 0 || connect(fds[0], (struct sockaddr*) &a, sizeof(a)) != 0)
    return -EIO;
  fds[1] = accept(l, NULL, NULL);
  close(l);
  int one = 1;
  setsockopt(fds[0], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fds[1], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fds[1] < 0 ? -EIO : 0;
}

/* One exchange: both directions at once. Returns seconds or < 0. */
static double one_exchange(size_t frames) {
  int fds[2];
  if (tcp_pair(fds) != 0)
    return -1;
  side_t s[4];
  memset(s, 0, sizeof(s));
  /* a->b on fds[0]/fds[1], b->a on fds[1]/fds[0]; keys differ per way. */
  for (int i = 0; i < 4; i++) {
    s[i].frames = frames;
    memset(s[i].key, i < 2 ? 0x11 : 0x22, ST_KEY_BYTES);
  }
  s[0].fd = fds[0]; /* sends a->b */
  s[1].fd = fds[1]; /* receives a->b */
  s[2].fd = fds[1]; /* sends b->a */
  s[3].fd = fds[0]; /* receives b->a */
  pthread_t t[4];
  double t0 = st_now_s();
  pthread_create(&t[0], NULL, sender, &s[0]);
  pthread_create(&t[1], NULL, receiver, &s[1]);
  pthread_create(&t[2], NULL, sender, &s[2]);
  pthread_create(&t[3], NULL, receiver, &s[3]);
  for (int i = 0; i < 4; i++)
    pthread_join(t[i], NULL);
  double dt = st_now_s() - t0;
  close(fds[0]);
  close(fds[1]);
  for (int i = 0; i < 4; i++)
    if (s[i].rc != 0)
      return -1;
  return dt;
}

/* Seal + open throughput of one core, MB/s of plaintext: a frame sealed
 * then opened, at the rates bench_common.c measures. */
static double aead_mbps(void) {
  double seal = 0, open = 0;
  st__bench_aead_rates(&seal, &open);
  return seal > 0 && open > 0 ? 1.0 / (1.0 / seal + 1.0 / open) / 1e6 : 0;
}

static int cmp_double(const void* x, const void* y) {
  double a = *(const double*) x, b = *(const double*) y;
  return (a > b) - (a < b);
}

int st__bench_exchange(int argc, char** argv) {
  static const struct option opts[] = {
      {"mib", required_argument, NULL, 'm'},
      {"repeats", required_argument, NULL, 'r'},
      {"json", no_argument, NULL, 'j'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  uint64_t mib = 40, repeats = 5;
  int json = 0, c;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (c) {
      case 'm':
        if (st__parse_u64(CMD, "--mib", optarg, 1, 1u << 16, &mib) != 0)
          return 2;
        break;
      case 'r':
        if (st__parse_u64(CMD, "--repeats", optarg, 1, 1000, &repeats) != 0)
          return 2;
        break;
      case 'j':
        json = 1;
        break;
      case 'h':
        printf(
            "usage: starling-bench exchange [--mib M] [--repeats R] "
            "[--json]\n\n"
            "The floor for one averaging exchange of M MiB each way "
            "(default 40,\nabout a 10M-parameter model): both "
            "directions sealed, carried over loopback\nTCP and opened at "
            "once, each on its own thread. Median of R runs (default "
            "5).\n");
        return 0;
      default:
        fprintf(stderr,
                "starling-bench exchange: bad option '%s'; see --help\n",
                argv[optind - 1]);
        return 2;
    }
  }
  if (st_crypto_init() != 0)
    return 1;
  double* t = calloc(repeats, sizeof(double));
  if (t == NULL)
    return 1;
  for (uint64_t r = 0; r < repeats; r++) {
    t[r] = one_exchange(mib);
    if (t[r] < 0) {
      fprintf(stderr, "starling-bench exchange: a transfer failed\n");
      free(t);
      return 1;
    }
  }
  qsort(t, repeats, sizeof(double), cmp_double);
  double med = t[repeats / 2];
  double aead = aead_mbps();
  if (json)
    printf("{\"mib\":%llu,\"limit_ms\":%.2f,\"aead_seal_open_mbps\":%.0f}\n",
           (unsigned long long) mib, med * 1e3, aead);
  else
    printf(
        "exchange floor for %llu MiB each way: %.1f ms (median of %llu); "
        "seal+open on one core: %.0f MB/s\n",
        (unsigned long long) mib, med * 1e3, (unsigned long long) repeats,
        aead);
  free(t);
  return 0;
}
