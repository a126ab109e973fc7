/* test_saved_model.c: the Check suite for checkpoints as usable models:
 * the input transform st_data_open records (node/train/data.c, data_idx.c,
 * data_csv.c), what st_trainer_save adds to make a checkpoint usable on its
 * own (trainer_checkpoint.c), and reading it back as a model
 * (saved_model.c): the same loss and accuracy as the trainer to the bit,
 * predictions, and checkpoints refused with the missing pieces named. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "node/train/train.h"
#include "node/train/train_internal.h"
#include "tests/unit/testutil.h"

static char dir[512];
static char err[1024];

static void setup(void) {
  ck_assert_int_eq(tu_mkdtemp(dir, sizeof(dir)), 0);
  err[0] = '\0';
}

static void teardown(void) {
  tu_rmtree(dir);
}

static const char* path_in(const char* name) {
  static char buf[4][600];
  static int at;
  char* p = buf[at++ % 4];
  snprintf(p, 600, "%s/%s", dir, name);
  return p;
}

/* A CSV of rows x 3 features (columns of unrelated scales) and a class
 * label in 0..2 that depends on the features, so that a model learns it. */
static void write_csv(const char* name, int rows, uint64_t seed) {
  st_rng_t rng;
  st_rng_seed(&rng, seed);
  FILE* f = fopen(path_in(name), "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "a,b,c,label\n");
  for (int i = 0; i < rows; i++) {
    double a = st_rng_uniform(&rng) * 100, b = st_rng_uniform(&rng) - 0.5,
           c = st_rng_uniform(&rng) * 3 + 7;
    int label = a > 66 ? 2 : a > 33 ? 1 : 0;
    fprintf(f, "%.4f,%.5f,%.3f,%d\n", a, b, c, label);
  }
  fclose(f);
}

/* Opens csv:train.csv,test.csv; normalize as given. */
static void open_csv(st_data_t* d, int normalize) {
  char spec[1400];
  snprintf(spec, sizeof(spec), "csv:%s,%s", path_in("train.csv"),
           path_in("test.csv"));
  st_data_options_t opt = {{-1, 0}, normalize, 0, 1};
  ck_assert_msg(st_data_open(d, spec, &opt, err, sizeof(err)) == 0, "%s", err);
}

/* The recorded statistics reproduce st_data_open's transform bit for bit. */
START_TEST(test_csv_stats_recorded) {
  write_csv("train.csv", 200, 1);
  write_csv("test.csv", 50, 2);
  st_data_t norm, raw;
  open_csv(&norm, 1);
  open_csv(&raw, 0);
  ck_assert_uint_eq(norm.train.norm_len, 3);
  ck_assert_uint_eq(raw.train.norm_len, 0);
  ck_assert_ptr_null(raw.train.norm_mean);
  ck_assert_int_eq(norm.train.shape_ndim, 1);
  ck_assert_uint_eq(norm.train.shape[0], 3);
  ck_assert(norm.train.input_scale == 1.0);
  ck_assert_float_gt(norm.train.norm_std[0], 20); /* the 0..100 column */
  st_dataset_t* sets[2][2] = {{&raw.train, &norm.train},
                              {&raw.test, &norm.test}};
  for (int s = 0; s < 2; s++) {
    ck_assert_int_eq(
        st_dataset_normalize(sets[s][0], norm.train.norm_mean,
                             norm.train.norm_std, 3, err, sizeof(err)),
        0);
    ck_assert_int_eq(
        memcmp(sets[s][0]->x, sets[s][1]->x, sets[s][0]->n * 3 * sizeof(float)),
        0);
  }
  /* A length that fits neither one scalar nor the features is refused. */
  ck_assert_int_eq(
      st_dataset_normalize(&raw.test, norm.train.norm_mean, norm.train.norm_std,
                           2, err, sizeof(err)),
      -EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "2 values"));
  st_data_close(&norm);
  st_data_close(&raw);
}
END_TEST

/* A raw IDX file of 4 images of 2x3 and its labels 0..3. */
static void write_idx_pair(void) {
  unsigned char im[16 + 24], lb[8 + 4];
  static const unsigned char im_head[16] = {0, 0, 8, 3, 0, 0, 0, 4,
                                            0, 0, 0, 2, 0, 0, 0, 3};
  static const unsigned char lb_head[8] = {0, 0, 8, 1, 0, 0, 0, 4};
  memcpy(im, im_head, 16);
  memcpy(lb, lb_head, 8);
  for (int i = 0; i < 24; i++)
    im[16 + i] = (unsigned char) (i * 11);
  for (int i = 0; i < 4; i++)
    lb[8 + i] = (unsigned char) i;
  ck_assert_int_eq(tu_write_file(path_in("im"), im, sizeof(im)), 0);
  ck_assert_int_eq(tu_write_file(path_in("lb"), lb, sizeof(lb)), 0);
}

/* IDX: one scalar, the image shape, the 1/255 scale; images alone load
 * without labels; a CSV of features alone loads every column. */
START_TEST(test_idx_shape_and_unlabelled) {
  write_idx_pair();
  char spec[1400];
  snprintf(spec, sizeof(spec), "idx:%s,%s", path_in("im"), path_in("lb"));
  st_data_t d;
  st_data_options_t opt = {{-1, 0}, 1, 0, 1};
  ck_assert_msg(st_data_open(&d, spec, &opt, err, sizeof(err)) == 0, "%s", err);
  ck_assert_uint_eq(d.train.norm_len, 1);
  ck_assert_int_eq(d.train.shape_ndim, 2);
  ck_assert_uint_eq(d.train.shape[0], 2);
  ck_assert_uint_eq(d.train.shape[1], 3);
  ck_assert(d.train.input_scale == 255.0);
  st_data_close(&d);

  st_dataset_t ds;
  ck_assert_int_eq(st_dataset_load_idx(&ds, path_in("im"), NULL, err, 512), 0);
  ck_assert_uint_eq(ds.n, 4);
  ck_assert_uint_eq(ds.n_classes, 0);
  for (size_t i = 0; i < 4; i++)
    ck_assert_float_eq(ds.y[i], 0);
  ck_assert_float_eq(ds.x[1], 11 / 255.0f);
  st_dataset_free(&ds);

  ck_assert_int_eq(tu_write_file(path_in("f.csv"), "x,y\n1,2\n3,4\n", 12), 0);
  ck_assert_int_eq(
      st_dataset_load_csv_features(&ds, path_in("f.csv"), err, 512), 0);
  ck_assert_uint_eq(ds.dim, 2);
  ck_assert_uint_eq(ds.n, 2);
  ck_assert_uint_eq(ds.n_classes, 0);
  ck_assert_float_eq(ds.x[3], 4);
  st_dataset_free(&ds);
}
END_TEST

/* Trains model on the CSV pair for 30 steps and saves it to ckpt. */
static void train_and_save(st_backend_t* be, st_data_t* d, const char* model,
                           st_trainer_t* t) {
  st_train_config_t cfg;
  st_train_config_default(&cfg);
  ck_assert_int_eq(st_model_spec_parse(model, &cfg.model, err, 512), 0);
  cfg.batch = 16;
  ck_assert_msg(st_trainer_init(t, be, &d->train, &cfg, err, 512) == 0, "%s",
                err);
  for (int i = 0; i < 30; i++)
    ck_assert_int_eq(st_trainer_step(t, NULL), 0);
  ck_assert_msg(
      st_trainer_save(t, path_in("ckpt"), NULL, 0, err, sizeof(err)) == 0, "%s",
      err);
}

/* The evaluation chunk shrinks for wide models (their workspace stays
 * near ST__EVAL_WORKSPACE_FLOATS) and is the spec's alone. */
START_TEST(test_eval_rows) {
  static const struct {
    const char* model;
    size_t rows;
  } cases[] = {
      {"mlp:784-256-128-10", 1000},  /* 2746 floats a row: 1527, capped */
      {"mlp:784-4096-1664-10", 284}, /* 14748 a row */
      {"mlp:3-20000-3", 69},         /* 60008 a row */
      {"softmax:16000000-2", 64},    /* the floor */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    st_model_spec_t spec;
    ck_assert_int_eq(st_model_spec_parse(cases[i].model, &spec, err, 512), 0);
    ck_assert_msg(st__eval_rows(&spec) == cases[i].rows, "%s: %zu, want %zu",
                  cases[i].model, st__eval_rows(&spec), cases[i].rows);
  }
}
END_TEST

/* A wide model evaluates 100 examples in chunks of 69: the saved model
 * takes the trainer's chunks and scores exactly what it scores. */
START_TEST(test_wide_model_matches_trainer) {
  write_csv("train.csv", 300, 3);
  write_csv("test.csv", 100, 4);
  st_backend_t* be = NULL;
  ck_assert_int_eq(st_backend_open(&be, "cpu", 1, err, 512), 0);
  st_data_t d, raw;
  st_trainer_t t;
  open_csv(&d, 1);
  train_and_save(be, &d, "mlp:3-20000-3", &t);
  ck_assert_uint_eq(t.model.max_batch, 69);
  double loss0, acc0, loss1, acc1;
  ck_assert_int_eq(st_trainer_evaluate(&t, &d.test, &loss0, &acc0), 0);
  st_saved_model_t sm;
  ck_assert_msg(st_saved_model_open(&sm, be, path_in("ckpt"), err, 1024) == 0,
                "%s", err);
  open_csv(&raw, 0);
  ck_assert_int_eq(st_saved_model_prepare(&sm, &raw.test, err, 1024), 0);
  ck_assert_int_eq(
      st_saved_model_evaluate(&sm, &raw.test, &loss1, &acc1, err, 1024), 0);
  ck_assert(loss0 == loss1);
  ck_assert(acc0 == acc1);
  st_saved_model_close(&sm);
  st_trainer_close(&t);
  st_data_close(&d);
  st_data_close(&raw);
  st_backend_close(be);
}
END_TEST

/* The saved model scores the raw test set exactly as the trainer scored
 * the normalized one, and its predictions are that model's. */
START_TEST(test_round_trip_matches_trainer) {
  write_csv("train.csv", 300, 3);
  write_csv("test.csv", 100, 4);
  st_backend_t* be = NULL;
  ck_assert_int_eq(st_backend_open(&be, "cpu", 1, err, 512), 0);
  st_data_t d, raw;
  st_trainer_t t;
  open_csv(&d, 1);
  train_and_save(be, &d, "mlp:3-8-3", &t);
  double loss0, acc0;
  ck_assert_int_eq(st_trainer_evaluate(&t, &d.test, &loss0, &acc0), 0);

  st_saved_model_t sm;
  ck_assert_msg(st_saved_model_open(&sm, be, path_in("ckpt"), err, 1024) == 0,
                "%s", err);
  ck_assert_str_eq(sm.model_text, "mlp:3-8-3");
  ck_assert_uint_eq(sm.classes, 3);
  ck_assert_int_eq(sm.input_ndim, 1);
  ck_assert_uint_eq(sm.input_shape[0], 3);
  ck_assert_uint_eq(sm.norm_len, 3);
  ck_assert_uint_eq(sm.step, 30);
  ck_assert_int_eq(memcmp(sm.norm_std, d.train.norm_std, 3 * sizeof(float)), 0);
  open_csv(&raw, 0);
  ck_assert_int_eq(st_saved_model_prepare(&sm, &raw.test, err, 1024), 0);
  double loss1, acc1;
  ck_assert_int_eq(
      st_saved_model_evaluate(&sm, &raw.test, &loss1, &acc1, err, 1024), 0);
  ck_assert(loss0 == loss1);
  ck_assert(acc0 == acc1);
  ck_assert_double_gt(acc1, 0.5);

  float probs[100 * 3];
  ck_assert_int_eq(st_saved_model_predict(&sm, &raw.test, 0, 100, probs), 0);
  size_t correct = 0;
  for (size_t r = 0; r < 100; r++) {
    const float* p = probs + r * 3;
    ck_assert_float_eq_tol(p[0] + p[1] + p[2], 1.0f, 1e-5f);
    size_t best = p[1] > p[0] ? 1 : 0;
    best = p[2] > p[best] ? 2 : best;
    correct += best == (size_t) raw.test.y[r];
  }
  ck_assert(fabs((double) correct / 100.0 - acc1) < 1e-12);
  ck_assert_int_eq(st_saved_model_predict(&sm, &raw.test, 99, 2, probs),
                   -EINVAL);

  /* Examples of another width are refused, naming both. */
  raw.train.dim = 2;
  ck_assert_int_eq(st_saved_model_prepare(&sm, &raw.train, err, 1024), -EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "has 2 features per example"));
  ck_assert_ptr_nonnull(strstr(err, "expects 3 inputs"));
  raw.train.dim = 3;
  st_saved_model_close(&sm);
  st_data_close(&raw);
  st_trainer_close(&t);
  st_data_close(&d);
  st_backend_close(be);
}
END_TEST

/* Without normalization the checkpoint says so and holds the identity. */
START_TEST(test_unnormalized_regression) {
  ck_assert_int_eq(
      tu_write_file(path_in("train.csv"), "1,3\n2,5\n3,7\n4,9\n", 16), 0);
  ck_assert_int_eq(tu_write_file(path_in("test.csv"), "5,11\n", 5), 0);
  st_backend_t* be = NULL;
  ck_assert_int_eq(st_backend_open(&be, "cpu", 1, err, 512), 0);
  char spec[1400];
  snprintf(spec, sizeof(spec), "csv:%s,%s", path_in("train.csv"),
           path_in("test.csv"));
  st_data_options_t opt = {{-1, 1}, 0, 0, 1};
  st_data_t d;
  ck_assert_int_eq(st_data_open(&d, spec, &opt, err, sizeof(err)), 0);
  st_trainer_t t;
  train_and_save(be, &d, "linear:1-1", &t);
  st_saved_model_t sm;
  ck_assert_msg(st_saved_model_open(&sm, be, path_in("ckpt"), err, 1024) == 0,
                "%s", err);
  ck_assert_uint_eq(sm.classes, 0);
  ck_assert_uint_eq(sm.norm_len, 1);
  ck_assert_float_eq(sm.norm_mean[0], 0);
  ck_assert_float_eq(sm.norm_std[0], 1);
  float out[1];
  ck_assert_int_eq(st_saved_model_prepare(&sm, &d.test, err, 1024), 0);
  ck_assert_int_eq(st_saved_model_predict(&sm, &d.test, 0, 1, out), 0);
  ck_assert(isfinite(out[0]));
  double loss, acc;
  ck_assert_int_eq(st_saved_model_evaluate(&sm, &d.test, &loss, &acc, err, 512),
                   0);
  ck_assert(isnan(acc));
  st_saved_model_close(&sm);
  st_trainer_close(&t);
  st_data_close(&d);
  st_backend_close(be);
}
END_TEST

/* Files that are not usable models are refused with what is missing. */
START_TEST(test_refusals) {
  st_backend_t* be = NULL;
  ck_assert_int_eq(st_backend_open(&be, "cpu", 1, err, 512), 0);
  static const float w[6] = {0}, b[2] = {0};
  st_tensor_desc_t tensors[2] = {{"layers.0.weight", w, {2, 3}, 2},
                                 {"layers.0.bias", b, {2}, 1}};
  st_meta_kv_t old[2] = {{"format", "starling-checkpoint-1"},
                         {"model", "softmax:3-2"}};
  st_meta_kv_t attached[1] = {{"attach_model", "x"}};
  st_meta_kv_t none[1] = {{"other", "x"}};
  struct {
    const st_meta_kv_t* meta;
    size_t n_meta;
    const char* want[3];
  } cases[] = {
      {old,
       2,
       {"lacks the metadata classes, input_shape, input_scale and the "
        "tensors normalize.mean, normalize.std",
        "older starling", NULL}},
      {attached, 1, {"checkpoint of an attached program", NULL}},
      {none, 1, {"not a starling checkpoint (its metadata has no 'format')"}},
  };
  st_saved_model_t sm;
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    ck_assert_int_eq(
        st_safetensors_write(path_in("bad"), tensors, 2, cases[i].meta,
                             cases[i].n_meta, err, 512),
        0);
    ck_assert_int_eq(st_saved_model_open(&sm, be, path_in("bad"), err, 1024),
                     -EINVAL);
    for (int k = 0; k < 3 && cases[i].want[k]; k++)
      ck_assert_msg(strstr(err, cases[i].want[k]) != NULL,
                    "case %zu: '%s' not in '%s'", i, cases[i].want[k], err);
  }
  ck_assert_int_lt(st_saved_model_open(&sm, be, path_in("none"), err, 1024), 0);
  ck_assert_ptr_nonnull(strstr(err, "cannot open"));
  st_backend_close(be);
}
END_TEST

static Suite* saved_model_suite(void) {
  Suite* s = suite_create("saved_model");
  TCase* tc = tcase_create("saved_model");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_csv_stats_recorded);
  tcase_add_test(tc, test_idx_shape_and_unlabelled);
  tcase_add_test(tc, test_round_trip_matches_trainer);
  tcase_add_test(tc, test_eval_rows);
  tcase_add_test(tc, test_wide_model_matches_trainer);
  tcase_add_test(tc, test_unnormalized_regression);
  tcase_add_test(tc, test_refusals);
  tcase_set_timeout(tc, 60);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(saved_model_suite());
  srunner_run_all(sr, CK_ENV);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
