/* test_daemon_ring_coded.c: the Check suite for the decoder a coded ring
 * round uses in the daemon (node/daemon/daemon_ring_coded.c,
 * st__ring_codec_decode): it decodes with the round's codec and counts a
 * refused segment by reason, as the exchanges count theirs
 * (compression.dropped). (The rounds themselves: test_gossip_ring.c's
 * coded cases and tests/integration/test_node_compress.sh.) */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "node/daemon/daemon_internal.h"

START_TEST(test_refused_segments_counted_by_reason) {
  st__daemon_t* d = calloc(1, sizeof(*d));
  ck_assert_ptr_nonnull(d);
  char err[128];
  ck_assert_int_eq(st_codec_parse("int8", &d->ring_spec, err, sizeof err), 0);
  const float x[3] = {0.5f, -1.0f, 0.3f};
  uint8_t msg[64];
  size_t len = 0;
  ck_assert_int_eq(st_codec_encode(&d->ring_spec, x, 3, msg, sizeof msg, &len),
                   0);
  ck_assert_uint_eq(len, 16 + 4 + 3); /* header, one scale, three q */

  /* A good segment decodes and counts nothing. */
  float out[3] = {0};
  ck_assert_int_eq(st__ring_codec_decode(d, msg, len, out, 3), 0);
  ck_assert(fabsf(out[1] + 1.0f) < 1e-6f);
  for (int i = 0; i < ST_CODEC_DROP_COUNT; i++)
    ck_assert_uint_eq(d->c.codec_drops[i], 0);

  /* A NaN scale (bytes 16..19): refused, out untouched, counted. */
  uint8_t bad[64];
  memcpy(bad, msg, len);
  const uint8_t nan_le[4] = {0x00, 0x00, 0xc0, 0x7f};
  memcpy(bad + 16, nan_le, 4);
  float keep[3] = {7, 7, 7};
  ck_assert_int_ne(st__ring_codec_decode(d, bad, len, keep, 3), 0);
  ck_assert(keep[0] == 7 && keep[1] == 7 && keep[2] == 7);
  ck_assert_uint_eq(d->c.codec_drops[ST_CODEC_DROP_SCALE], 1);

  /* A length that does not match n, and a short header. */
  ck_assert_int_ne(st__ring_codec_decode(d, msg, len - 1, keep, 3), 0);
  ck_assert_uint_eq(d->c.codec_drops[ST_CODEC_DROP_LENGTH], 1);
  ck_assert_int_ne(st__ring_codec_decode(d, msg, 8, keep, 3), 0);
  ck_assert_uint_eq(d->c.codec_drops[ST_CODEC_DROP_HEADER], 1);
  free(d);
}
END_TEST

static Suite* suite(void) {
  Suite* s = suite_create("daemon_ring_coded");
  TCase* tc = tcase_create("decode");
  tcase_add_test(tc, test_refused_segments_counted_by_reason);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner* r = srunner_create(suite());
  srunner_run_all(r, CK_ENV);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
