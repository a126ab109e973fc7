/* bench.h: the benchmarks of `starling-bench`, one per tools/bench_*.c.
 * Internal to tools/. Each takes argv with argv[0] = the benchmark's name
 * and returns the exit status (0, 1 failure, 2 bad usage). */
#ifndef STARLING_BENCH_H
#define STARLING_BENCH_H

int st__bench_train(int argc, char** argv);
int st__bench_crypto(int argc, char** argv);
int st__bench_exchange(int argc, char** argv);
int st__bench_ring(int argc, char** argv);
int st__bench_codec(int argc, char** argv);

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "crypto/crypto.h"

/* tools/bench/bench_io.c */
/* Writes or reads exactly n bytes (EINTR retried); -EIO otherwise. */
int st__bench_write_all(int fd, const uint8_t* p, size_t n);
int st__bench_read_all(int fd, uint8_t* p, size_t n);
/* The daemon's connection handshake (gossip/session.c's framing, as
 * node/daemon/daemon_conn.c drives it) on a connected blocking socket as
 * identity me under keys, then both stream headers. When expected is not
 * NULL the peer must be that node (-EACCES otherwise, before our stream
 * header is sent). *peer (when not NULL) gets the authenticated peer's
 * id, *tx and *rx the streams to and from it (either may be NULL: that
 * direction's stream is wiped at once). 0, or a negative errno (-EIO for
 * a socket error or the peer's close, else the framer's refusal:
 * -EMSGSIZE, -EBADMSG, -EPROTO, -EACCES, crypto/'s). */
int st__bench_handshake(int fd, bool initiator, const st_identity_t* me,
                        const st_keyring_t* keys, const st_node_id_t* expected,
                        st_node_id_t* peer, st_stream_t* tx, st_stream_t* rx);

/* tools/bench/bench_common.c */
/* The frames the exchange and ring benchmarks send: 1 MiB of plaintext. */
#define ST__BENCH_FRAME_BYTES (1024u * 1024u)
/* Seal and open rates of the stream cipher on one core, bytes/s of
 * 1 MiB frames, best of 3 runs of 32 frames. */
void st__bench_aead_rates(double* seal_bps, double* open_bps);

#endif
