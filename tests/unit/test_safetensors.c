/* test_safetensors.c: the Check suite for checkpoints
 * (node/train/safetensors.c, node/train/safetensors_write.c) and the strict
 * JSON reader under them (base/json.c): round trips, the header layout, a
 * known-answer file as Python's safetensors writes it, atomic replacement, a
 * full disk, a table of hostile files each refused with its own message, and
 * random mutations that must never crash the reader (run it under ASan).
 *
 * ST_KEEP_SAFETENSORS=PATH keeps a copy of the round-trip file at PATH, for
 * tests/integration/check_safetensors_numpy.py. */
#ifdef __linux__
#define _GNU_SOURCE /* unshare(2), for the full-disk test */
#endif
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef __linux__
#include <sched.h>
#include <sys/mount.h>
#endif

#include "base/base.h"
#include "node/train/train.h"
#include "tests/unit/testutil.h"

static char dir[512];
static char err[512];

static void setup(void) {
  ck_assert_int_eq(tu_mkdtemp(dir, sizeof(dir)), 0);
  err[0] = '\0';
}

static void teardown(void) {
  tu_rmtree(dir);
}

static char* path_in(const char* name) {
  static char buf[1024];
  snprintf(buf, sizeof(buf), "%s/%s", dir, name);
  return buf;
}

static unsigned char* slurp(const char* path, size_t* len) {
  FILE* f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char* p = malloc((size_t) n + 1);
  ck_assert(fread(p, 1, (size_t) n, f) == (size_t) n);
  fclose(f);
  *len = (size_t) n;
  return p;
}

/* Files in dir other than "." and "..". */
static int count_entries(const char* d) {
  DIR* dp = opendir(d);
  ck_assert(dp != NULL);
  int n = 0;
  struct dirent* e;
  while ((e = readdir(dp)) != NULL)
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
      n++;
  closedir(dp);
  return n;
}

static uint64_t le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}

/* A file: 8-byte length (len, or strlen(header) when len is UINT64_MAX),
 * header, then data_len bytes of data. */
static unsigned char* build(const char* header, uint64_t len, size_t data_len,
                            size_t* out_len) {
  size_t h = strlen(header);
  if (len == UINT64_MAX)
    len = h;
  unsigned char* p = calloc(1, 8 + h + data_len + 1);
  for (int i = 0; i < 8; i++)
    p[i] = (unsigned char) (len >> (8 * i));
  memcpy(p + 8, header, h);
  for (size_t i = 0; i < data_len; i++)
    p[8 + h + i] = (unsigned char) (i * 37);
  *out_len = 8 + h + data_len;
  return p;
}

/* ==== Round trip ========================================================= */

/* Quotes, backslashes, control characters, 2-, 3- and 4-byte UTF-8. */
static const char* const kNasty =
    "say \"hi\" \\ back\\slash\n\ttab\x01\x1f "
    "caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80";

START_TEST(test_round_trip) {
  st_rng_t rng;
  st_rng_seed(&rng, tu_seed());
  float scale = 3.5f, bias[5], weight[12], cube[2 * 3 * 4], four[2 * 1 * 3 * 2];
  tu_fill_uniform(&rng, bias, 5, -1, 1);
  tu_fill_uniform(&rng, weight, 12, -1, 1);
  tu_fill_uniform(&rng, cube, 24, -100, 100);
  tu_fill_uniform(&rng, four, 12, -1e-30f, 1e-30f);
  st_tensor_desc_t t[] = {
      {"weight", weight, {3, 4}, 2}, {"scale", &scale, {0}, 0},
      {"empty", NULL, {0, 3}, 2},    {"layers.0.bias", bias, {5}, 1},
      {"cube", cube, {2, 3, 4}, 3},  {"four", four, {2, 1, 3, 2}, 4},
      {kNasty, bias, {2}, 1},
  };
  size_t nt = sizeof(t) / sizeof(t[0]);
  st_meta_kv_t meta[] = {{"model", "mlp:4-3"}, {"nasty", kNasty}, {kNasty, ""}};
  const char* path = path_in("ckpt.safetensors");
  ck_assert_int_eq(st_safetensors_write(path, t, nt, meta, 3, err, 512), 0);

  st_safetensors_t* st = NULL;
  ck_assert_msg(st_safetensors_read(path, &st, err, sizeof(err)) == 0, "%s",
                err);
  ck_assert_uint_eq(st_safetensors_count(st), nt);
  for (size_t i = 0; i < nt; i++) {
    size_t n = 99, shape[ST_SAFETENSORS_MAX_DIMS];
    int ndim = -1;
    const float* x = st_safetensors_tensor(st, t[i].name, &n, shape, &ndim);
    ck_assert_msg(x != NULL, "tensor %s", t[i].name);
    ck_assert_int_eq(ndim, t[i].ndim);
    size_t want = 1;
    for (int d = 0; d < ndim; d++) {
      ck_assert_uint_eq(shape[d], t[i].shape[d]);
      want *= t[i].shape[d];
    }
    ck_assert_uint_eq(n, want);
    ck_assert_uint_eq((uintptr_t) x % 4, 0);
    if (n > 0) /* bit-exact */
      ck_assert(memcmp(x, t[i].data, n * sizeof(float)) == 0);
  }
  ck_assert(st_safetensors_tensor(st, "nope", NULL, NULL, NULL) == NULL);
  ck_assert_str_eq(st_safetensors_meta(st, "model"), "mlp:4-3");
  ck_assert_str_eq(st_safetensors_meta(st, "nasty"), kNasty);
  ck_assert_str_eq(st_safetensors_meta(st, kNasty), "");
  ck_assert(st_safetensors_meta(st, "nope") == NULL);
  st_safetensors_free(st);

  const char* keep = getenv("ST_KEEP_SAFETENSORS");
  if (keep != NULL && *keep != '\0') {
    size_t len;
    unsigned char* bytes = slurp(path, &len);
    ck_assert_int_eq(tu_write_file(keep, bytes, len), 0);
    free(bytes);
  }
}
END_TEST

START_TEST(test_empty_file_round_trip) {
  /* No tensors, no metadata: the header is "{}" padded to 8 bytes. */
  const char* path = path_in("empty.safetensors");
  ck_assert_int_eq(st_safetensors_write(path, NULL, 0, NULL, 0, err, 512), 0);
  size_t len;
  unsigned char* b = slurp(path, &len);
  ck_assert_uint_eq(len, 16);
  ck_assert(memcmp(b + 8, "{}      ", 8) == 0);
  free(b);
  st_safetensors_t* st = NULL;
  ck_assert_int_eq(st_safetensors_read(path, &st, err, sizeof(err)), 0);
  ck_assert_uint_eq(st_safetensors_count(st), 0);
  st_safetensors_free(st);
}
END_TEST

START_TEST(test_header_layout) {
  float a[3] = {1, 2, 3}, b[2] = {4, 5};
  st_tensor_desc_t t[] = {{"b\"q", b, {2}, 1}, {"a", a, {3, 1}, 2}};
  st_meta_kv_t meta[] = {{"k", "v\\"}};
  const char* path = path_in("h.safetensors");
  ck_assert_int_eq(st_safetensors_write(path, t, 2, meta, 1, err, 512), 0);
  size_t len;
  unsigned char* f = slurp(path, &len);
  uint64_t n = le64(f);
  ck_assert_uint_eq(n % 8, 0);
  ck_assert_uint_eq(len, 8 + n + 5 * 4);
  /* Valid JSON object, space padding only, data right after. */
  st_json_limits_t lim = {8, 1000};
  st_json_doc_t* doc = NULL;
  ck_assert_int_eq(
      st_json_parse((char*) f + 8, (size_t) n, &lim, &doc, err, 512), 0);
  const st_json_t* root = st_json_root(doc);
  ck_assert_int_eq(root->type, ST_JSON_OBJECT);
  ck_assert_str_eq(root->child->key, "__metadata__"); /* first, like Python */
  ck_assert_str_eq(st_json_get(st_json_get(root, "__metadata__"), "k")->str,
                   "v\\");
  const st_json_t* e = st_json_get(root, "b\"q");
  ck_assert_str_eq(st_json_get(e, "dtype")->str, "F32");
  const st_json_t* off = st_json_get(e, "data_offsets");
  ck_assert_int_eq(off->child->integer, 0);
  ck_assert_int_eq(off->child->next->integer, 8);
  off = st_json_get(st_json_get(root, "a"), "data_offsets");
  ck_assert_int_eq(off->child->integer, 8);
  ck_assert_int_eq(off->child->next->integer, 20);
  st_json_free(doc);
  float got[5];
  memcpy(got, f + 8 + n, sizeof(got));
  ck_assert(got[0] == 4 && got[1] == 5 && got[2] == 1 && got[4] == 3);
  free(f);
}
END_TEST

/* ==== Known answer ======================================================= */

/* The bytes Python's safetensors writes for save_file({"a": [1.0, -2.5]}):
 * header length 56 (54 bytes of JSON and 2 spaces), then the two floats
 * little-endian. */
static const char kKnownHeader[] =
    "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}  ";
static const unsigned char kKnownData[8] = {0x00, 0x00, 0x80, 0x3f,
                                            0x00, 0x00, 0x20, 0xc0};

START_TEST(test_known_answer) {
  ck_assert_uint_eq(strlen(kKnownHeader), 56);
  unsigned char file[8 + 56 + 8] = {56};
  memcpy(file + 8, kKnownHeader, 56);
  memcpy(file + 64, kKnownData, 8);
  const char* path = path_in("known.safetensors");
  ck_assert_int_eq(tu_write_file(path, file, sizeof(file)), 0);
  st_safetensors_t* st = NULL;
  ck_assert_msg(st_safetensors_read(path, &st, err, sizeof(err)) == 0, "%s",
                err);
  size_t n, shape[ST_SAFETENSORS_MAX_DIMS];
  int ndim;
  const float* x = st_safetensors_tensor(st, "a", &n, shape, &ndim);
  ck_assert(x != NULL && n == 2 && ndim == 1 && shape[0] == 2);
  ck_assert(x[0] == 1.0f && x[1] == -2.5f);
  st_safetensors_free(st);

  /* And our writer produces exactly those bytes. */
  float a[2] = {1.0f, -2.5f};
  st_tensor_desc_t t = {"a", a, {2}, 1};
  const char* ours = path_in("ours.safetensors");
  ck_assert_int_eq(st_safetensors_write(ours, &t, 1, NULL, 0, err, 512), 0);
  size_t len;
  unsigned char* b = slurp(ours, &len);
  ck_assert_uint_eq(len, sizeof(file));
  ck_assert(memcmp(b, file, len) == 0);
  free(b);
}
END_TEST

/* ==== Atomic replacement and failures ===================================== */

START_TEST(test_overwrite_atomic) {
  const char* path = path_in("ckpt.safetensors");
  float one = 1, two[2] = {2, 3};
  st_tensor_desc_t t1 = {"x", &one, {1}, 1}, t2 = {"x", two, {2}, 1};
  ck_assert_int_eq(st_safetensors_write(path, &t1, 1, NULL, 0, err, 512), 0);
  struct stat sb;
  ck_assert_int_eq(stat(path, &sb), 0);
  ck_assert_int_eq(sb.st_mode & 0777, 0600); /* a new checkpoint: owner only */
  /* One that others could read (an older starling wrote 0644) is replaced
   * by one they cannot. */
  ck_assert_int_eq(chmod(path, 0644), 0);
  ck_assert_int_eq(st_safetensors_write(path, &t2, 1, NULL, 0, err, 512), 0);
  st_safetensors_t* st = NULL;
  ck_assert_int_eq(st_safetensors_read(path, &st, err, sizeof(err)), 0);
  size_t n;
  const float* x = st_safetensors_tensor(st, "x", &n, NULL, NULL);
  ck_assert(n == 2 && x[0] == 2 && x[1] == 3);
  st_safetensors_free(st);
  ck_assert_int_eq(count_entries(dir), 1); /* no temporary file left */
  ck_assert_int_eq(stat(path, &sb), 0);
  ck_assert_int_eq(sb.st_mode & 0777, 0600);
}
END_TEST

START_TEST(test_missing_directory) {
  const char* path = path_in("no/such/dir/ckpt.safetensors");
  float one = 1;
  st_tensor_desc_t t = {"x", &one, {1}, 1};
  ck_assert_int_eq(st_safetensors_write(path, &t, 1, NULL, 0, err, 512),
                   -ENOENT);
  ck_assert_msg(strstr(err, path) != NULL, "%s", err);
  ck_assert_msg(strstr(err, strerror(ENOENT)) != NULL, "%s", err);
  ck_assert_int_eq(count_entries(dir), 0);
}
END_TEST

/* A full disk: a 64 KiB tmpfs, a checkpoint that fits, then one that does
 * not. Needs root (or CAP_SYS_ADMIN); skipped with a reason otherwise. The
 * mount is made in a private mount namespace where possible, and undone
 * before any assertion can end the test. */
START_TEST(test_disk_full) {
#ifdef __linux__
  if (unshare(CLONE_NEWNS) == 0)
    mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
  if (mount("tmpfs", dir, "tmpfs", 0, "size=64k") != 0) {
    printf("test_disk_full: skipped: cannot mount a tmpfs (%s); needs root\n",
           strerror(errno));
    return;
  }
  const char* path = path_in("ckpt.safetensors");
  float small[4] = {1, 2, 3, 4};
  size_t big_n = 64 * 1024; /* 256 KiB of floats */
  float* big = calloc(big_n, sizeof(float));
  st_tensor_desc_t t1 = {"x", small, {4}, 1}, t2 = {"x", big, {big_n}, 1};
  int rc1 = st_safetensors_write(path, &t1, 1, NULL, 0, err, 512);
  int rc2 = st_safetensors_write(path, &t2, 1, NULL, 0, err, 512);
  int entries = count_entries(dir);
  st_safetensors_t* st = NULL;
  int rc3 = st_safetensors_read(path, &st, NULL, 0);
  size_t n = 0;
  const float* x =
      rc3 == 0 ? st_safetensors_tensor(st, "x", &n, NULL, NULL) : NULL;
  int intact = x != NULL && n == 4 && memcmp(x, small, sizeof(small)) == 0;
  st_safetensors_free(st);
  free(big);
  umount2(dir, MNT_DETACH);
  ck_assert_int_eq(rc1, 0);
  ck_assert_int_eq(rc2, -ENOSPC);
  ck_assert_msg(strstr(err, path) != NULL, "%s", err);
  ck_assert_msg(strstr(err, strerror(ENOSPC)) != NULL, "%s", err);
  ck_assert_int_eq(entries, 1); /* the old file, no temporary */
  ck_assert(intact);
#else
  printf("test_disk_full: skipped: needs Linux mount(2)\n");
#endif
}
END_TEST

START_TEST(test_write_rejects) {
  static const float v[2] = {1, 2};
  static const struct {
    st_tensor_desc_t t[2];
    size_t nt;
    st_meta_kv_t m[2];
    size_t nm;
    const char* expect;
  } cases[] = {
      {{{"a", v, {1}, 1}, {"a", v, {2}, 1}}, 2, {{0}}, 0, "duplicate tensor"},
      {{{"", v, {1}, 1}}, 1, {{0}}, 0, "non-empty"},
      {{{"__metadata__", v, {1}, 1}}, 1, {{0}}, 0, "__metadata__"},
      {{{"a", v, {1}, 9}}, 1, {{0}}, 0, "ndim 9"},
      {{{"a", v, {1}, -1}}, 1, {{0}}, 0, "ndim -1"},
      {{{"a", NULL, {2}, 1}}, 1, {{0}}, 0, "no data"},
      {{{"\xff", v, {1}, 1}}, 1, {{0}}, 0, "UTF-8"},
      {{{"a", v, {1}, 1}},
       1,
       {{"k", "1"}, {"k", "2"}},
       2,
       "duplicate metadata"},
      {{{"a", v, {1}, 1}}, 1, {{"k", NULL}}, 1, "metadata entry 0"},
      {{{"a", v, {SIZE_MAX / 2, 4}, 2}}, 1, {{0}}, 0, "too large"},
  };
  const char* path = path_in("x.safetensors");
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    int rc = st_safetensors_write(path, cases[i].t, cases[i].nt, cases[i].m,
                                  cases[i].nm, err, sizeof(err));
    ck_assert_msg(rc == -EINVAL || rc == -EFBIG, "case %zu: rc %d", i, rc);
    ck_assert_msg(strstr(err, cases[i].expect) != NULL, "case %zu: %s", i, err);
    ck_assert_msg(strstr(err, path) != NULL, "case %zu: %s", i, err);
  }
  ck_assert_int_eq(count_entries(dir), 0);
}
END_TEST

/* ==== Hostile files ======================================================= */

#define T(name, shape, off)                                                   \
  "\"" name "\":{\"dtype\":\"F32\",\"shape\":" shape ",\"data_offsets\":" off \
  "}"
#define AUTO UINT64_MAX

static const struct {
  const char* what;
  const char* header;
  uint64_t len; /* the 8-byte length field; AUTO: strlen(header) */
  size_t data_len;
  const char* expect;
} kBad[] = {
    {"length beyond file", "{}", 100, 0, "beyond the end of the 10-byte"},
    {"huge length", "{}", (uint64_t) 1 << 63, 0, "over the 104857600-byte"},
    {"empty header", "", AUTO, 0, "unexpected end of input"},
    {"invalid JSON", "{\"a\":}", AUTO, 0, "not valid JSON"},
    {"truncated JSON", "{\"a\":{\"dtype\":\"F32\"", AUTO, 0,
     "unexpected end of input"},
    {"unterminated string", "{\"a", AUTO, 0, "unexpected end of input"},
    {"not an object", "[1,2]", AUTO, 0, "a JSON array, not an object"},
    {"trailing JSON", "{} x", AUTO, 0, "trailing characters"},
    {"NUL padding", "{}##", AUTO, 0, "trailing characters"}, /* # -> NUL */
    {"entry not object", "{\"a\":5}", AUTO, 0, "a JSON number, not an object"},
    {"missing field", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", AUTO, 8,
     "missing the field \"data_offsets\""},
    {"unknown field",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],"
     "\"x\":1}}",
     AUTO, 4, "unknown field \"x\" in tensor \"a\""},
    {"bad dtype",
     "{\"w\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}", AUTO,
     4, "unsupported dtype F16 for tensor \"w\"; starling reads F32"},
    {"dtype not string",
     "{\"a\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", AUTO, 4,
     "dtype of tensor \"a\" is a JSON number"},
    {"shape/offsets mismatch", "{" T("a", "[3]", "[0,8]") "}", AUTO, 8,
     "holds 3 float32 values (12 bytes) but its data_offsets span 8"},
    {"huge shape",
     "{" T("a", "[4503599627370496,4503599627370496]", "[0,8]") "}", AUTO, 8,
     "holds over"},
    {"offsets out of bounds", "{" T("a", "[4]", "[0,16]") "}", AUTO, 8,
     "out of bounds of the 8-byte data buffer"},
    {"offsets reversed", "{" T("a", "[0]", "[8,0]") "}", AUTO, 8,
     "out of bounds"},
    {"three offsets", "{" T("a", "[1]", "[0,4,8]") "}", AUTO, 8,
     "not an array of two non-negative integers"},
    {"overlap", "{" T("a", "[2]", "[0,8]") "," T("b", "[2]", "[4,12]") "}",
     AUTO, 12, "tensors \"a\" and \"b\" overlap"},
    {"empty inside another",
     "{" T("a", "[2]", "[0,8]") "," T("z", "[0]", "[4,4]") "}", AUTO, 8,
     "overlap"},
    {"gap", "{" T("a", "[1]", "[0,4]") "," T("b", "[1]", "[8,12]") "}", AUTO,
     12, "4-byte gap in the data buffer before tensor \"b\""},
    {"trailing bytes", "{" T("a", "[2]", "[0,8]") "}", AUTO, 12,
     "4 trailing bytes"},
    {"duplicate keys",
     "{" T("a", "[1]", "[0,4]") "," T("a", "[1]", "[4,8]") "}", AUTO, 8,
     "duplicate object key near '\"a\"'"},
    {"deep nesting",
     "{\"a\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
     AUTO, 0, "nesting deeper than 8"},
    {"negative shape", "{" T("a", "[-1]", "[0,4]") "}", AUTO, 4,
     "shape of tensor \"a\" is not an array of non-negative integers"},
    {"negative offset", "{" T("a", "[1]", "[-4,0]") "}", AUTO, 4,
     "data_offsets of tensor \"a\" is not an array of two non-negative"},
    {"float shape", "{" T("a", "[1.0]", "[0,4]") "}", AUTO, 4,
     "non-negative integers"},
    {"integer beyond 2^53", "{" T("a", "[9007199254740993]", "[0,4]") "}", AUTO,
     4, "integer out of range"},
    {"too many dims", "{" T("a", "[1,1,1,1,1,1,1,1,1]", "[0,4]") "}", AUTO, 4,
     "has 9 dimensions; starling supports at most 8"},
    {"metadata not string", "{\"__metadata__\":{\"k\":1}}", AUTO, 0,
     "metadata value of \"k\" is a JSON number, not a string"},
    {"metadata not object", "{\"__metadata__\":\"x\"}", AUTO, 0,
     "__metadata__ is a JSON string"},
    {"control character", "{\"a\x01\":1}", AUTO, 0, "control character 0x1"},
    {"invalid UTF-8", "{\"a\xc0\x80\":1}", AUTO, 0, "invalid UTF-8"},
    {"lone surrogate", "{\"\\ud800\":1}", AUTO, 0, "invalid Unicode"},
    {"NUL escape", "{\"a\\u0000\":1}", AUTO, 0, "\\u0000 is not allowed"},
    {"bad escape", "{\"a\\x\":1}", AUTO, 0, "invalid escape"},
    {"leading zero", "{" T("a", "[01]", "[0,4]") "}", AUTO, 4, "invalid token"},
};

START_TEST(test_hostile) {
  const char* path = path_in("bad.safetensors");
  for (size_t i = 0; i < sizeof(kBad) / sizeof(kBad[0]); i++) {
    size_t len;
    unsigned char* f =
        build(kBad[i].header, kBad[i].len, kBad[i].data_len, &len);
    for (size_t j = 8; j < 8 + strlen(kBad[i].header); j++)
      if (f[j] == '#')
        f[j] = '\0';
    ck_assert_int_eq(tu_write_file(path, f, len), 0);
    free(f);
    st_safetensors_t* st = (st_safetensors_t*) 1;
    int rc = st_safetensors_read(path, &st, err, sizeof(err));
    const char* expect = kBad[i].expect;
    ck_assert_msg(rc < 0, "%s: accepted", kBad[i].what);
    ck_assert_msg(st == NULL, "%s", kBad[i].what);
    ck_assert_msg(strstr(err, expect) != NULL, "%s: got \"%s\"", kBad[i].what,
                  err);
    ck_assert_msg(strstr(err, path) != NULL, "%s: %s", kBad[i].what, err);
  }
}
END_TEST

START_TEST(test_bad_files) {
  st_safetensors_t* st = NULL;
  const char* path = path_in("short.safetensors");
  ck_assert_int_eq(tu_write_file(path, "\x02\0\0\0\0", 5), 0);
  ck_assert_int_eq(st_safetensors_read(path, &st, err, sizeof(err)), -EBADMSG);
  ck_assert_msg(strstr(err, "shorter than the 8-byte") != NULL, "%s", err);
  ck_assert_int_eq(st_safetensors_read(dir, &st, err, sizeof(err)), -EINVAL);
  ck_assert_msg(strstr(err, "not a regular file") != NULL, "%s", err);
  path = path_in("absent.safetensors");
  ck_assert_int_eq(st_safetensors_read(path, &st, err, sizeof(err)), -ENOENT);
  ck_assert_msg(strstr(err, path) != NULL, "%s", err);
  ck_assert(st == NULL);
}
END_TEST

/* ==== Random mutations =====================================================
 */

/* Flips 1 to 4 random bytes of a valid file (mostly in the header, where
 * the parser lives) a few thousand times, and sometimes cuts the file
 * short or lengthens it. The reader must accept or refuse, never crash or
 * leak; ASan and UBSan builds make that a real check. */
START_TEST(test_mutations) {
  float a[6] = {1, 2, 3, 4, 5, 6}, s = 7;
  st_tensor_desc_t t[] = {
      {"layers.0.weight", a, {2, 3}, 2}, {"s", &s, {0}, 0}, {"e", a, {0}, 1}};
  st_meta_kv_t meta[] = {{"model", "mlp:3-2"}, {"step", "12"}};
  const char* path = path_in("valid.safetensors");
  ck_assert_int_eq(st_safetensors_write(path, t, 3, meta, 2, err, 512), 0);
  size_t len;
  unsigned char* orig = slurp(path, &len);
  size_t header_end = 8 + (size_t) le64(orig);
  unsigned char* f = malloc(len + 16);
  st_rng_t rng;
  st_rng_seed(&rng, tu_seed() ^ 0x5afe);
  const char* mpath = path_in("mutant.safetensors");
  int accepted = 0;
  for (int it = 0; it < 3000; it++) {
    memcpy(f, orig, len);
    size_t n = len;
    int flips = 1 + (int) st_rng_below(&rng, 4);
    for (int k = 0; k < flips; k++) {
      size_t at = st_rng_below(&rng, 10) < 9 ? st_rng_below(&rng, header_end)
                                             : st_rng_below(&rng, len);
      f[at] = st_rng_below(&rng, 2) ? (unsigned char) st_rng_next(&rng)
                                    : f[at] ^ (unsigned char) (1u << (it % 8));
    }
    if (it % 50 == 0)
      n = st_rng_below(&rng, len + 1);
    else if (it % 50 == 1)
      n = len + 1 + st_rng_below(&rng, 16);
    ck_assert_int_eq(tu_write_file(mpath, f, n), 0);
    st_safetensors_t* st = NULL;
    err[0] = '\0';
    int rc = st_safetensors_read(mpath, &st, err, sizeof(err));
    if (rc == 0) {
      accepted++;
      ck_assert(st != NULL);
      ck_assert_uint_le(st_safetensors_count(st), 3);
      st_safetensors_free(st);
    } else {
      ck_assert(st == NULL);
      ck_assert_msg(err[0] != '\0', "rc %d with no message", rc);
    }
  }
  printf("test_mutations: %d of 3000 mutants accepted\n", accepted);
  free(f);
  free(orig);
}
END_TEST

/* The same idea straight on the JSON reader, from memory, many more
 * times: random bytes drawn from JSON's alphabet. */
START_TEST(test_json_random) {
  static const char alphabet[] = "{}[]\",:0123456789-+.eE \\utrufalsn\x01\xc3";
  st_rng_t rng;
  st_rng_seed(&rng, tu_seed() ^ 0x150b);
  char text[64];
  st_json_limits_t lim = {4, 32};
  int ok = 0;
  for (int it = 0; it < 200000; it++) {
    size_t n = st_rng_below(&rng, sizeof(text));
    for (size_t i = 0; i < n; i++)
      text[i] = alphabet[st_rng_below(&rng, sizeof(alphabet) - 1)];
    st_json_doc_t* doc = NULL;
    if (st_json_parse(text, n, &lim, &doc, err, sizeof(err)) == 0) {
      ok++;
      st_json_free(doc);
    }
  }
  ck_assert_int_gt(ok, 0);
}
END_TEST

/* ==== JSON reader and escaper ==============================================
 */

static const st_json_t* parse_ok(st_json_doc_t** doc, const char* text) {
  st_json_limits_t lim = {8, 1000};
  int rc = st_json_parse(text, strlen(text), &lim, doc, err, sizeof(err));
  ck_assert_msg(rc == 0, "%s: %s", text, err);
  return st_json_root(*doc);
}

START_TEST(test_json_values) {
  st_json_doc_t* doc;
  const st_json_t* v =
      parse_ok(&doc,
               " [9007199254740992, -9007199254740992, 0, -0, 1.5e3, "
               "true, false, null, \"\\ud83d\\ude00\\u00e9\\/\"] ");
  ck_assert_int_eq(v->count, 9);
  const st_json_t* x = v->child;
  ck_assert(x->is_int && x->integer == ST_JSON_MAX_INT);
  x = x->next;
  ck_assert(x->is_int && x->integer == -ST_JSON_MAX_INT);
  x = x->next->next->next;
  ck_assert(!x->is_int && x->number == 1500.0);
  x = x->next;
  ck_assert(x->type == ST_JSON_BOOL && x->boolean);
  x = x->next->next;
  ck_assert(x->type == ST_JSON_NULL);
  x = x->next;
  ck_assert_str_eq(x->str, "\xf0\x9f\x98\x80\xc3\xa9/");
  ck_assert_uint_eq(x->str_len, 7);
  st_json_free(doc);

  st_json_limits_t lim = {8, 3};
  ck_assert_int_eq(st_json_parse("[1,2,3]", 7, &lim, &doc, err, 512), -EBADMSG);
  ck_assert_msg(strstr(err, "more than 3 values") != NULL, "%s", err);
  /* Not NUL-terminated: the reader must stop at len. */
  ck_assert_int_eq(st_json_parse("[1]xyz", 3, &lim, &doc, err, 512), 0);
  st_json_free(doc);

  /* Beyond 2^53: refused, but kept as a double by st_json_parse_inexact,
   * which reads integers within 2^53 exactly as st_json_parse does. */
  static const char big[] = "[393627155608633344, 9007199254740992]";
  lim = (st_json_limits_t){.max_depth = 2, .max_values = 4};
  ck_assert_int_eq(st_json_parse(big, strlen(big), &lim, &doc, err, 512),
                   -EBADMSG);
  ck_assert_msg(strstr(err, "beyond 2^53") != NULL, "%s", err);
  ck_assert_int_eq(
      st_json_parse_inexact(big, strlen(big), &lim, &doc, err, 512), 0);
  x = st_json_root(doc)->child;
  ck_assert(!x->is_int && x->number == 393627155608633344.0);
  ck_assert(x->next->is_int && x->next->integer == ST_JSON_MAX_INT);
  st_json_free(doc);
}
END_TEST

START_TEST(test_json_escape_round_trip) {
  st_json_buf_t b;
  st_json_buf_init(&b);
  st_json_buf_puts(&b, "{");
  st_json_buf_string(&b, kNasty);
  st_json_buf_puts(&b, ":");
  st_json_buf_string(&b, "\x7f\b\f\r/");
  st_json_buf_puts(&b, "}");
  ck_assert(!b.failed);
  ck_assert(strstr(b.p, "\\u0001") != NULL && strstr(b.p, "\\n\\t") != NULL);
  st_json_doc_t* doc;
  const st_json_t* root = parse_ok(&doc, b.p);
  ck_assert_str_eq(root->child->key, kNasty);
  ck_assert_str_eq(root->child->str, "\x7f\b\f\r/");
  st_json_free(doc);
  st_json_buf_free(&b);

  char* mem = NULL;
  size_t mem_len = 0;
  FILE* f = open_memstream(&mem, &mem_len);
  ck_assert(f != NULL);
  ck_assert_int_eq(st_json_write_string(f, "a\"b\\c\n"), 0);
  fclose(f);
  ck_assert_str_eq(mem, "\"a\\\"b\\\\c\\n\"");
  free(mem);
  ck_assert(st_json_utf8_valid("caf\xc3\xa9", 5));
  ck_assert(!st_json_utf8_valid("\xed\xa0\x80", 3));     /* a surrogate */
  ck_assert(!st_json_utf8_valid("\xf4\x90\x80\x80", 4)); /* > U+10FFFF */
  ck_assert(!st_json_utf8_valid("\xe2\x9c", 2));         /* truncated */
}
END_TEST

/* What the reader adds to jansson: limits refused before a tree exists
 * (the comma count), 64-bit overflow read inexactly, no control bytes of
 * the text in a message; and the escaper's repair of bytes that are not
 * UTF-8 (its output is still JSON that reads back). */
START_TEST(test_json_limits_and_repair) {
  st_json_doc_t* doc = NULL;
  st_json_limits_t lim = {2, 4};
  /* Four commas: at least five values, refused at the fourth (byte 8). */
  ck_assert_int_eq(st_json_parse("[1,2,3,4,5", 10, &lim, &doc, err, 512),
                   -EBADMSG);
  ck_assert_msg(strstr(err, "at byte 8: more than 4 values") != NULL, "%s",
                err);
  /* Commas inside strings are not values. */
  ck_assert_int_eq(
      st_json_parse("[\",,,,,\\\"\",\"\"]", 14, &lim, &doc, err, 512), 0);
  ck_assert_str_eq(st_json_root(doc)->child->str, ",,,,,\"");
  st_json_free(doc);
  ck_assert_int_eq(st_json_parse("[[[", 3, &lim, &doc, err, 512), -EBADMSG);
  ck_assert_msg(strstr(err, "at byte 2: nesting deeper than 2") != NULL, "%s",
                err);

  static const char huge[] = "[18446744073709551615, 7, 1.0]";
  lim = (st_json_limits_t){2, 8};
  ck_assert_int_eq(st_json_parse(huge, strlen(huge), &lim, &doc, err, 512),
                   -EBADMSG);
  ck_assert_msg(strstr(err, "number out of range") != NULL, "%s", err);
  ck_assert_int_eq(
      st_json_parse_inexact(huge, strlen(huge), &lim, &doc, err, 512), 0);
  const st_json_t* x = st_json_root(doc)->child;
  ck_assert(!x->is_int && x->number == 18446744073709551615.0);
  ck_assert(x->next->is_int && x->next->integer == 7);
  st_json_free(doc);

  static const char ctl[] = "{\"a\x1b[2J\":1}";
  ck_assert_int_eq(st_json_parse(ctl, strlen(ctl), &lim, &doc, err, 512),
                   -EBADMSG);
  for (const char* c = err; *c != '\0'; c++)
    ck_assert_msg((unsigned char) *c >= 0x20, "control byte in \"%s\"", err);

  st_json_buf_t b;
  st_json_buf_init(&b);
  st_json_buf_string(&b, "a\xff\xc3\xa9\xe2\x9c");
  ck_assert(!b.failed);
  ck_assert_str_eq(b.p, "\"a\xef\xbf\xbd\xc3\xa9\xef\xbf\xbd\xef\xbf\xbd\"");
  ck_assert_int_eq(st_json_parse(b.p, b.len, &lim, &doc, err, 512), 0);
  st_json_free(doc);
  st_json_buf_free(&b);
}
END_TEST

static Suite* safetensors_suite(void) {
  Suite* s = suite_create("safetensors");
  TCase* tc = tcase_create("checkpoints");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_round_trip);
  tcase_add_test(tc, test_empty_file_round_trip);
  tcase_add_test(tc, test_header_layout);
  tcase_add_test(tc, test_known_answer);
  tcase_add_test(tc, test_overwrite_atomic);
  tcase_add_test(tc, test_missing_directory);
  tcase_add_test(tc, test_disk_full);
  tcase_add_test(tc, test_write_rejects);
  tcase_add_test(tc, test_hostile);
  tcase_add_test(tc, test_bad_files);
  tcase_add_test(tc, test_mutations);
  tcase_set_timeout(tc, 120);
  suite_add_tcase(s, tc);
  TCase* tj = tcase_create("json");
  tcase_add_test(tj, test_json_values);
  tcase_add_test(tj, test_json_escape_round_trip);
  tcase_add_test(tj, test_json_random);
  tcase_add_test(tj, test_json_limits_and_repair);
  tcase_set_timeout(tj, 120);
  suite_add_tcase(s, tj);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(safetensors_suite());
  srunner_run_all(sr, CK_ENV);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
