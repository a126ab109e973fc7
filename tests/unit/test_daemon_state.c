/* test_daemon_state.c: the Check suite of the daemon's data directory
 * (node/daemon/daemon_state.c): the boot epoch rule (max(previous + 1,
 * the clock)), the epoch file bound to the identity, the directory's lock,
 * the removal of stale temporary files, and the modes of what the node
 * writes there. st__state_prepare runs on a bare daemon struct, as
 * st_daemon_run calls it before any socket exists. Also the model
 * fingerprint with the averaging settings mixed in, against the vectors
 * docs/protocol.md gives (computed there with Python's hashlib). */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "node/daemon/daemon_internal.h"
#include "tests/unit/testutil.h"

static char root[256];    /* scratch, removed after each test */
static char datadir[512]; /* root/data: made by st__state_prepare */
static char err[1024];

static void setup(void) {
  ck_assert_int_eq(st_crypto_init(), 0);
  ck_assert_int_eq(tu_mkdtemp(root, sizeof(root)), 0);
  snprintf(datadir, sizeof(datadir), "%s/data", root);
}

static void teardown(void) {
  tu_rmtree(root);
}

typedef struct {
  st_daemon_config_t cfg;
  st__daemon_t d;
} node_t;

/* A daemon struct on datadir, as st_daemon_run makes it. */
static node_t* node_new(void) {
  node_t* n = calloc(1, sizeof(*n));
  ck_assert_ptr_nonnull(n);
  st_daemon_config_default(&n->cfg);
  n->cfg.data_dir = datadir;
  n->cfg.quiet = true;
  n->d.cfg = &n->cfg;
  n->d.lock_fd = -1;
  n->d.started_ms = st__dnow(&n->d);
  return n;
}

static void node_free(node_t* n) {
  st__state_release(&n->d);
  st_identity_wipe(&n->d.ident);
  free(n);
}

/* Starts a node's data directory and lets go of it: its boot epoch. */
static uint32_t boot_once(void) {
  node_t* n = node_new();
  int rc = st__state_prepare(&n->d, err, sizeof(err));
  ck_assert_msg(rc == 0, "%d %s", rc, err);
  uint32_t e = n->d.boot_epoch;
  node_free(n);
  return e;
}

static const char* path_in(const char* name) {
  static char buf[4][700];
  static int k;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof(buf[k]), "%s/%s", datadir, name);
  return buf[k];
}

static void write_text(const char* name, const char* text) {
  ck_assert_int_eq(tu_write_file(path_in(name), text, strlen(text)), 0);
}

static uint32_t clock_epoch(void) {
  return (uint32_t) (time(NULL) - ST__BOOT_EPOCH_ORIGIN_S);
}

/* ==== The epoch rule ===================================================== */

START_TEST(test_epoch_rule) {
  const int64_t o = ST__BOOT_EPOCH_ORIGIN_S;
  static const struct {
    const char* name;
    uint64_t prev;
    int64_t now_offset; /* from the origin */
    uint32_t want;
    int rc;
  } cases[] = {
      {"no file, clock before the origin", 0, -5, 1, 0},
      {"no file: the clock", 0, 1000, 1000, 0},
      {"behind the clock: the clock", 7, 1000, 1000, 0},
      {"ahead of the clock: one more", 5000, 1000, 5001, 0},
      {"equal to the clock: one more", 1000, 1000, 1001, 0},
      {"clock past 32 bits: capped", 3, (int64_t) UINT32_MAX + 10, UINT32_MAX,
       0},
      {"the last epoch", UINT32_MAX - 1, 0, UINT32_MAX, 0},
      {"no epoch left", UINT32_MAX, 0, 0, -EOVERFLOW},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    uint32_t got = 0;
    int rc = st__boot_epoch_next(cases[i].prev, o + cases[i].now_offset, &got);
    ck_assert_msg(rc == cases[i].rc, "%s: rc %d", cases[i].name, rc);
    if (rc == 0)
      ck_assert_msg(got == cases[i].want, "%s: %u, want %u", cases[i].name, got,
                    cases[i].want);
  }
  /* Today's clock part fits 32 bits for more than a century. */
  ck_assert_uint_lt((uint64_t) time(NULL) - (uint64_t) o, UINT32_MAX / 2);
}
END_TEST

/* ==== The epoch file ===================================================== */

START_TEST(test_epoch_grows_and_survives_loss) {
  uint32_t before = clock_epoch();
  uint32_t e1 = boot_once();
  ck_assert_uint_ge(e1, before);
  uint32_t e2 = boot_once();
  ck_assert_uint_gt(e2, e1);
  /* Lost (or restored from an old backup): still forward. */
  ck_assert_int_eq(unlink(path_in("boot_epoch")), 0);
  uint32_t e3 = boot_once();
  ck_assert_uint_ge(e3, clock_epoch() - 1);
  write_text("boot_epoch", "1\n"); /* a restored old file, old format */
  uint32_t e4 = boot_once();
  ck_assert_uint_ge(e4, clock_epoch() - 1);
  ck_assert_uint_gt(e4, 2);
}
END_TEST

START_TEST(test_epoch_file_names_identity) {
  node_t* n = node_new();
  ck_assert_int_eq(st__state_prepare(&n->d, err, sizeof(err)), 0);
  char id[33], want[64], got[64] = {0};
  st_node_id_format(&n->d.ident.id, id);
  snprintf(want, sizeof(want), "%u %s\n", n->d.boot_epoch, id);
  node_free(n);
  FILE* f = fopen(path_in("boot_epoch"), "r");
  ck_assert_ptr_nonnull(f);
  ck_assert_ptr_nonnull(fgets(got, sizeof(got), f));
  fclose(f);
  ck_assert_str_eq(got, want);
}
END_TEST

START_TEST(test_epoch_file_other_identity_ignored) {
  boot_once(); /* makes the identity */
  /* Ahead of the clock, so that whether it was used shows. */
  write_text("boot_epoch", "4000000000 00112233445566778899aabbccddeeff\n");
  uint32_t e = boot_once();
  ck_assert_uint_lt(e, 4000000000u);
  ck_assert_uint_ge(e, clock_epoch() - 1);
  /* Its own file, and an older starling's (no id), are used. */
  write_text("boot_epoch", "4000000000\n");
  ck_assert_uint_eq(boot_once(), 4000000001u);
  ck_assert_uint_eq(boot_once(), 4000000002u);
}
END_TEST

START_TEST(test_epoch_file_corrupt) {
  static const char* bad[] = {
      "x\n",
      "12 short\n",
      "12 00112233445566778899aabbccddeeff extra\n",
      "4294967295\n", /* no epoch after it */
      "-3\n",
  };
  boot_once();
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    write_text("boot_epoch", bad[i]);
    node_t* n = node_new();
    int rc = st__state_prepare(&n->d, err, sizeof(err));
    ck_assert_msg(rc == -EBADMSG, "'%s': %d", bad[i], rc);
    ck_assert_msg(strstr(err, "boot_epoch") != NULL, "%s", err);
    node_free(n);
  }
}
END_TEST

/* ==== The lock =========================================================== */

START_TEST(test_second_node_refused) {
  node_t* a = node_new();
  ck_assert_int_eq(st__state_prepare(&a->d, err, sizeof(err)), 0);
  uint32_t epoch_a = a->d.boot_epoch;
  struct stat before;
  ck_assert_int_eq(stat(path_in("boot_epoch"), &before), 0);

  node_t* b = node_new();
  int rc = st__state_prepare(&b->d, err, sizeof(err));
  ck_assert_int_eq(rc, -EBUSY);
  char pid[32];
  snprintf(pid, sizeof(pid), "PID %ld", (long) getpid());
  ck_assert_msg(strstr(err, pid) != NULL, "%s", err);
  ck_assert_msg(strstr(err, datadir) != NULL, "%s", err);
  ck_assert_msg(strstr(err, "another --data-dir") != NULL, "%s", err);
  ck_assert_int_eq(b->d.lock_fd, -1);
  node_free(b);
  /* The refused node wrote nothing: the epoch file is the first's. */
  struct stat after;
  ck_assert_int_eq(stat(path_in("boot_epoch"), &after), 0);
  ck_assert_int_eq(after.st_ino, before.st_ino);

  node_free(a); /* lets go */
  node_t* c = node_new();
  ck_assert_int_eq(st__state_prepare(&c->d, err, sizeof(err)), 0);
  ck_assert_uint_gt(c->d.boot_epoch, epoch_a);
  node_free(c);
}
END_TEST

/* ==== Temporary files and modes ========================================== */

START_TEST(test_stale_temporaries_removed) {
  boot_once();
  static const char* gone[] = {"checkpoint.safetensors.tmp.Ab9xYz",
                               "checkpoint.safetensors.tmp.000000",
                               "boot_epoch.tmp"};
  static const char* kept[] = {
      "checkpoint.safetensors.tmp.Ab9xY",   /* five */
      "checkpoint.safetensors.tmp.Ab9xYz0", /* seven */
      "checkpoint.safetensors.tmp.Ab-xYz",  /* not mkstemp's */
      "model.safetensors.tmp.Ab9xYz",       /* not the node's name */
      "boot_epoch.tmp.old",
      "notes.txt",
  };
  for (size_t i = 0; i < 3; i++)
    write_text(gone[i], "x");
  for (size_t i = 0; i < sizeof(kept) / sizeof(kept[0]); i++)
    write_text(kept[i], "x");
  /* A directory with the name is not a file the writer left. */
  ck_assert_int_eq(mkdir(path_in("checkpoint.safetensors.tmp.dirdir"), 0700),
                   0);
  boot_once();
  for (size_t i = 0; i < 3; i++)
    ck_assert_msg(access(path_in(gone[i]), F_OK) != 0, "%s kept", gone[i]);
  for (size_t i = 0; i < sizeof(kept) / sizeof(kept[0]); i++)
    ck_assert_msg(access(path_in(kept[i]), F_OK) == 0, "%s gone", kept[i]);
  ck_assert_int_eq(access(path_in("checkpoint.safetensors.tmp.dirdir"), F_OK),
                   0);
}
END_TEST

START_TEST(test_modes) {
  mode_t old = umask(0);
  boot_once();
  umask(old);
  struct stat sb;
  ck_assert_int_eq(stat(datadir, &sb), 0);
  ck_assert_int_eq(sb.st_mode & 0777, 0700);
  static const char* files[] = {"lock", "boot_epoch", "identity.key"};
  for (size_t i = 0; i < 3; i++) {
    ck_assert_int_eq(stat(path_in(files[i]), &sb), 0);
    ck_assert_msg((sb.st_mode & 0777) == 0600, "%s: %o", files[i],
                  sb.st_mode & 0777);
  }
}
END_TEST

static void hex16(const uint8_t fp[16], char out[33]) {
  for (int i = 0; i < 16; i++)
    snprintf(out + 2 * i, 3, "%02x", fp[i]);
}

/* The fingerprint of mlp:784-256-128-10, then with --outer nesterov, and
 * with --compress int8 --outer nesterov --outer-lr 1 --outer-momentum 0.5:
 * docs/protocol.md, "Keys and fingerprints". */
START_TEST(test_fingerprint_vectors) {
  static const struct {
    const char *compress, *lr, *momentum, *fp, *desc;
  } cases[] = {
      {NULL, NULL, NULL, "eb69d04d4f66d3f33cbf13c7d0ecebdd",
       "mlp:784-256-128-10 f32"},
      {NULL, "0.7", "0.9", "0ade279110819c9755366f0e08c37b42",
       "mlp:784-256-128-10 f32 outer=nesterov:0.7:0.9"},
      {"int8", "1.0", "0.50", "f6852666180a2014bc92ea245e285195",
       "mlp:784-256-128-10 f32 compress=int8 outer=nesterov:1:0.5"},
  };
  st_model_spec_t spec;
  ck_assert_int_eq(
      st_model_spec_parse("mlp:784-256-128-10", &spec, err, sizeof err), 0);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    node_t* n = node_new();
    if (cases[i].compress != NULL)
      ck_assert_int_eq(
          st_codec_parse(cases[i].compress, &n->cfg.compress, err, sizeof err),
          0);
    if (cases[i].lr != NULL) {
      n->cfg.outer.kind = ST_OUTER_NESTEROV;
      ck_assert_int_eq(
          st_outer_parse_lr(cases[i].lr, &n->cfg.outer, err, sizeof err), 0);
      ck_assert_int_eq(st_outer_parse_momentum(cases[i].momentum, &n->cfg.outer,
                                               err, sizeof err),
                       0);
    }
    st__model_fingerprint(&spec, n->d.local.fingerprint, n->d.local.model,
                          sizeof n->d.local.model);
    st__compress_mark_model(&n->d);
    st__outer_mark_model(&n->d);
    char hex[33];
    hex16(n->d.local.fingerprint, hex);
    ck_assert_str_eq(hex, cases[i].fp);
    ck_assert_str_eq(n->d.local.model, cases[i].desc);
    free(n); /* nothing of its data directory was made */
  }
}
END_TEST

/* ---- The outer optimizer's state across a restart (daemon_outer_state.c) */

/* A node with --outer nesterov, a model of n parameters, and (fill) an
 * outer state whose anchor[i] = i / 8 and momentum[i] = -i / 16. */
static node_t* outer_node(size_t n, const char* momentum, bool fill) {
  node_t* x = node_new();
  st__state_paths(&x->d);
  x->cfg.outer.kind = ST_OUTER_NESTEROV;
  if (momentum != NULL)
    ck_assert_int_eq(
        st_outer_parse_momentum(momentum, &x->cfg.outer, err, sizeof err), 0);
  snprintf(x->d.local.model, sizeof x->d.local.model,
           "linear:%zu-1 f32 outer=nesterov:0.7:0.9", n - 1);
  x->d.local.n_params = n;
  if (fill) {
    x->d.outer_anchor = malloc(n * sizeof(float));
    x->d.outer_m = malloc(n * sizeof(float));
    ck_assert(x->d.outer_anchor != NULL && x->d.outer_m != NULL);
    for (size_t i = 0; i < n; i++) {
      x->d.outer_anchor[i] = (float) i / 8.0f;
      x->d.outer_m[i] = -(float) i / 16.0f;
    }
    x->d.outer_n = n;
  }
  return x;
}

static void outer_node_free(node_t* x) {
  st__outer_free(&x->d);
  free(x);
}

/* Saved at a leave, the anchor and momentum come back at the resume,
 * exactly; a file written under another setting, for another model or
 * size, or corrupt, is left unused (the state starts afresh, nothing
 * crashes); a node without --outer ignores it. */
START_TEST(test_outer_state_across_restart) {
  ck_assert_int_eq(mkdir(datadir, 0700), 0);
  node_t* a = outer_node(1000, NULL, true);
  ck_assert_int_eq(st__outer_save(&a->d, true), 0);
  ck_assert_int_eq(access(path_in("outer.safetensors"), F_OK), 0);
  outer_node_free(a);

  node_t* b = outer_node(1000, NULL, false);
  st__outer_resume(&b->d);
  ck_assert_uint_eq(b->d.outer_n, 1000);
  ck_assert_uint_eq(b->d.c.outer_resumed, 1);
  for (size_t i = 0; i < 1000; i++) {
    ck_assert(b->d.outer_anchor[i] == (float) i / 8.0f);
    ck_assert(b->d.outer_m[i] == -(float) i / 16.0f);
  }
  outer_node_free(b);

  node_t* other[3] = {outer_node(1000, "0.5", false),
                      outer_node(1000, NULL, false),
                      outer_node(1001, NULL, false)};
  other[1]->d.local.model[0] = 'm'; /* another model description */
  for (int k = 0; k < 3; k++) {
    st__outer_resume(&other[k]->d);
    ck_assert_ptr_null(other[k]->d.outer_anchor);
    ck_assert_uint_eq(other[k]->d.c.outer_resumed, 0);
    outer_node_free(other[k]);
  }
  node_t* off = outer_node(1000, NULL, false);
  off->cfg.outer.kind = ST_OUTER_NONE;
  st__outer_resume(&off->d);
  ck_assert_ptr_null(off->d.outer_anchor);
  ck_assert_int_eq(st__outer_save(&off->d, true), 0); /* nothing to write */
  outer_node_free(off);

  /* Cut short: refused by the reader, not used. */
  ck_assert_int_eq(truncate(path_in("outer.safetensors"), 5000), 0);
  node_t* c = outer_node(1000, NULL, false);
  st__outer_resume(&c->d);
  ck_assert_ptr_null(c->d.outer_anchor);
  ck_assert_uint_eq(c->d.c.outer_resumed, 0);
  outer_node_free(c);
}
END_TEST

static Suite* daemon_state_suite(void) {
  Suite* s = suite_create("daemon_state");
  TCase* tc = tcase_create("data_dir");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_epoch_rule);
  tcase_add_test(tc, test_epoch_grows_and_survives_loss);
  tcase_add_test(tc, test_epoch_file_names_identity);
  tcase_add_test(tc, test_epoch_file_other_identity_ignored);
  tcase_add_test(tc, test_epoch_file_corrupt);
  tcase_add_test(tc, test_second_node_refused);
  tcase_add_test(tc, test_stale_temporaries_removed);
  tcase_add_test(tc, test_modes);
  tcase_add_test(tc, test_fingerprint_vectors);
  tcase_add_test(tc, test_outer_state_across_restart);
  tcase_set_timeout(tc, 60);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(daemon_state_suite());
  srunner_run_all(sr, CK_ENV);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
