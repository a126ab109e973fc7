/* test_daemon_metrics.c: the Check suite for the pure parts of the
 * Prometheus endpoint (node/daemon/daemon_metrics.c): the duration
 * histogram's buckets and the --metrics address. (The endpoint itself,
 * its exposition and a real Prometheus scraping it are checked on real
 * processes in tests/integration/test_node_metrics.sh.) */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <string.h>

#include "node/daemon/daemon_internal.h"

/* Prometheus buckets are "less than or equal": a value on a bound counts
 * in that bound's bucket, one past the last bound in +Inf. */
START_TEST(test_hist_buckets) {
  st__hist_t h;
  memset(&h, 0, sizeof(h));
  st__hist_observe(&h, 0);
  st__hist_observe(&h, st__hist_bounds_s[0]);
  st__hist_observe(&h, 0.0051);
  st__hist_observe(&h, 1.0);
  st__hist_observe(&h, st__hist_bounds_s[ST__HIST_BUCKETS - 1]);
  st__hist_observe(&h, 1e6);
  ck_assert_uint_eq(h.counts[0], 2);
  ck_assert_uint_eq(h.counts[1], 1);
  size_t one_s = 0;
  while (st__hist_bounds_s[one_s] != 1.0)
    one_s++;
  ck_assert_uint_eq(h.counts[one_s], 1);
  ck_assert_uint_eq(h.counts[ST__HIST_BUCKETS - 1], 1);
  ck_assert_uint_eq(h.counts[ST__HIST_BUCKETS], 1);
  ck_assert_uint_eq(h.count, 6);
  ck_assert_double_eq_tol(h.sum_s, 0.005 + 0.0051 + 1 + 60 + 1e6, 1e-9);
  for (size_t i = 1; i < ST__HIST_BUCKETS; i++)
    ck_assert(st__hist_bounds_s[i] > st__hist_bounds_s[i - 1]);
}
END_TEST

static uint16_t port_of(const struct sockaddr_storage* ss) {
  return ntohs(((const struct sockaddr_in*) ss)->sin_port);
}

/* A bare port is on the loopback address; HOST:PORT as --listen takes it;
 * anything else is refused with a sentence naming it. */
START_TEST(test_parse) {
  struct sockaddr_storage ss;
  char err[256], ip[64];
  ck_assert_int_eq(st__metrics_parse("9100", &ss, err, sizeof(err)), 0);
  ck_assert_int_eq(ss.ss_family, AF_INET);
  inet_ntop(AF_INET, &((struct sockaddr_in*) &ss)->sin_addr, ip, sizeof(ip));
  ck_assert_str_eq(ip, "127.0.0.1");
  ck_assert_uint_eq(port_of(&ss), 9100);
  ck_assert_int_eq(st__metrics_parse("0", &ss, err, sizeof(err)), 0);
  ck_assert_uint_eq(port_of(&ss), 0);
  ck_assert_int_eq(st__metrics_parse("0.0.0.0:9100", &ss, err, sizeof(err)), 0);
  ck_assert_int_eq(st__metrics_parse("[::1]:9100", &ss, err, sizeof(err)), 0);
  ck_assert_int_eq(ss.ss_family, AF_INET6);
  const char* bad[] = {
      "",      "99999", "000009100", "127.0.0.1:99999", "nohost:9100",
      ":9100", "9100x", "127.0.0.1:"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    err[0] = '\0';
    ck_assert_int_eq(st__metrics_parse(bad[i], &ss, err, sizeof(err)), -EINVAL);
    ck_assert_msg(strstr(err, bad[i]) != NULL, "'%s': %s", bad[i], err);
  }
}
END_TEST

static Suite* metrics_suite(void) {
  Suite* s = suite_create("daemon_metrics");
  TCase* tc = tcase_create("pure");
  tcase_add_test(tc, test_hist_buckets);
  tcase_add_test(tc, test_parse);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(metrics_suite());
  srunner_run_all(sr, CK_ENV);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
