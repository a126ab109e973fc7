/* bench_common.c: the stream cipher's rates on one core, the figure the
 * exchange and ring benchmarks compare against. Internal to tools/. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crypto/crypto.h"
#include "tools/bench/bench.h"
#include "tools/cli/cli.h"

#define FRAME_BYTES ST__BENCH_FRAME_BYTES

/* Seal and open rates, bytes/s of 1 MiB frames on one core (the frames
 * the ring sends), best of 3 runs of 32 frames, before any member runs. */
void st__bench_aead_rates(double* seal_bps, double* open_bps) {
  uint8_t key[ST_KEY_BYTES], hdr[ST_STREAM_HEADER_BYTES];
  memset(key, 7, sizeof(key));
  size_t cap = FRAME_BYTES + ST_STREAM_ABYTES + ST_FRAME_LENGTH_BYTES;
  uint8_t* plain = calloc(1, FRAME_BYTES);
  uint8_t* frame = malloc(cap);
  uint8_t* out = malloc(FRAME_BYTES);
  *seal_bps = *open_bps = 0;
  for (int r = 0; r < 3 && plain != NULL && frame != NULL && out != NULL; r++) {
    st_stream_t tx, rx;
    st_stream_tx_init(&tx, key, hdr);
    st_stream_rx_init(&rx, key, hdr);
    double ts = 0, to = 0;
    int frames = 32;
    for (int i = 0; i < frames; i++) {
      size_t len = 0, got = 0;
      bool final = false;
      double t0 = st_now_s();
      st_stream_seal_frame(&tx, plain, FRAME_BYTES, false, frame, cap, &len);
      double t1 = st_now_s();
      st_stream_open_frame(&rx, NULL, frame + ST_FRAME_LENGTH_BYTES,
                           len - ST_FRAME_LENGTH_BYTES, out, FRAME_BYTES, &got,
                           &final);
      to += st_now_s() - t1;
      ts += t1 - t0;
    }
    double bytes = (double) frames * FRAME_BYTES;
    if (bytes / ts > *seal_bps)
      *seal_bps = bytes / ts;
    if (bytes / to > *open_bps)
      *open_bps = bytes / to;
    st_stream_wipe(&tx);
    st_stream_wipe(&rx);
  }
  free(plain);
  free(frame);
  free(out);
}
