/* bench_ring.h: the pieces of `starling-bench ring` (bench_ring.c), shared
 * by its files. Internal to tools/.
 *
 *   bench_ring.c         flags, the parent that forks the members, the
 *                        AEAD measurement, the figures
 *   bench_ring_member.c  one member: the handshakes, the streams, the
 *                        driver of gossip/ring.c and its two I/O threads
 *   bench_ring_netns.c   the shaped network namespaces of --netns
 */
#ifndef STARLING_BENCH_RING_H
#define STARLING_BENCH_RING_H

#include <stdbool.h>
#include <stdint.h>

#include "crypto/crypto.h"

/* The most segments in flight --in-flight allows: a lane's out-slots. */
#define ST__BENCH_RING_MAX_IN_FLIGHT 16u
/* The most --lanes: encrypted TCP connections from a member to the next,
 * each with its own handshake, secretstream, sender and receiver thread. */
#define ST__BENCH_RING_MAX_LANES 8u

/* What the parent gives a member (a forked child; everything is its own
 * copy after the fork). */
typedef struct {
  uint32_t n;      /* members */
  uint32_t rank;   /* this member, 0 .. n - 1 in ring order */
  uint64_t floats; /* per all-reduce */
  uint32_t rounds; /* the warm-up round and the measured ones */
  uint64_t seed;   /* every member's data derives from it (st__ring_fill) */
  uint32_t segment_floats;         /* st_ring_config_t's, from --segment-kib */
  uint32_t in_flight;              /* st_ring_config_t's, from --in-flight */
  uint32_t lanes;                  /* --lanes: segment i goes on lane
                                      i % lanes */
  const st_keyring_t* keys;        /* the one cluster key */
  const st_identity_t* identities; /* n of them; the member uses its own
                                      and checks both neighbours' */
  const float* ref;                /* the float64 mean, rounded to float32
                                      (floats of them; the parent's, shared
                                      copy-on-write by the fork) */
  const char* netns;               /* NULL: loopback; else the namespace */
  bool corrupt;                    /* --corrupt: member 0 alters one float
                                      of its data after the reference was
                                      made, to show that checking works */
  int up_fd;                       /* member -> parent pipe */
  int down_fd;                     /* parent -> member pipe */
} st__ring_member_cfg_t;

/* One round's figures, member -> parent through the pipe. CPU times are
 * thread CPU seconds (CLOCK_THREAD_CPUTIME_ID): user and kernel time. */
typedef struct {
  double t_start, t_end; /* CLOCK_MONOTONIC seconds: snapshot given,
                            DONE(OK) drained */
  double cpu_seal;       /* sender thread in st_stream_seal_frame */
  double cpu_write;      /* sender thread in write(2) */
  double cpu_read;       /* receiver thread in read(2) */
  double cpu_open;       /* receiver thread in st_stream_open_frame */
  double cpu_machine;    /* driver in st_ring_*: decode, reduce, encode,
                            the snapshot copy and the final delta pass */
  double cpu_copy;       /* driver copying SEND data to the sender's slot */
  double cpu_process;    /* the whole member process */
  double tail;           /* wall seconds from the event that completed the
                            round (the last segment or write) to DONE: the
                            last addition and the delta pass over the
                            whole vector, which nothing overlaps */
  double max_err;        /* max |mean - reference| */
  int32_t result;        /* st_ring_result_t; -1 an I/O or setup error */
  int32_t verified;      /* 1: within tolerance and APPLY seen */
  uint8_t hash[16];      /* BLAKE2b-128 of the mean, for bit-identity */
} st__ring_report_t;

/* Member m's data: floats [first, first + count) of a vector uniform in
 * [-1, 1), a function of (seed, m, index) only, so the parent can compute
 * the reference mean without the members. */
void st__ring_fill(uint64_t seed, uint32_t m, uint64_t first, uint64_t count,
                   float* out);

/* Runs one member in the forked child; returns its exit status (0 ok,
 * 1 failure or a mismatch). */
int st__ring_member(const st__ring_member_cfg_t* cfg);

/* The member's address and namespace name: 127.0.0.1 on loopback, else
 * 10.77.0.(rank + 1) in namespace "st-ring-TAG-RANK". */
void st__ring_addr(bool netns, uint32_t rank, char out[32]);

/* --netns: creates a bridge namespace and one namespace per member, each
 * joined to the bridge by a veth pair shaped with tbf at `rate` (a tc
 * rate, e.g. "1gbit") in both directions, MTU mtu. Returns 0, or -1 after
 * removing what it made. st__ring_netns_down removes everything by name,
 * ignoring what is not there; safe to call twice. */
int st__ring_netns_up(const char* tag, uint32_t n, const char* rate,
                      unsigned mtu);
void st__ring_netns_down(const char* tag, uint32_t n);
/* The namespace's name, "st-ring-TAG-RANK"; buf needs 64 bytes. */
void st__ring_netns_name(const char* tag, uint32_t rank, char buf[64]);
/* Moves the calling (single-threaded) process into that namespace. */
int st__ring_netns_enter(const char* name);

#endif
