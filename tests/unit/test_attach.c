/* test_attach.c: the Check suite for the attach protocol's sans-IO half
 * (attach/attach.h): segment sizes and header checks, the tensor list's
 * checks (a table of bad tensors, each refused with its own sentence), the
 * sentences naming the first difference between two lists, the
 * description and canonical text, request and reply round trips, a table
 * of hostile requests and replies (wrong types, missing keys, duplicate
 * names, zero and too many dimensions, overflowing counts, another
 * version), random mutations that must never crash the decoders (run it
 * under ASan), and the framing. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attach/attach.h"
#include "base/base.h"
#include "tests/unit/testutil.h"

static char err[512];

/* A list of three tensors: "w" [2, 3], "b" [3], "s" (a scalar). */
static void small_model(st_attach_model_t* m) {
  memset(m, 0, sizeof(*m));
  uint64_t w[] = {2, 3}, b[] = {3};
  ck_assert_int_eq(st_attach_model_add(m, "w", "F32", 2, w, err, 512), 0);
  ck_assert_int_eq(st_attach_model_add(m, "b", "F32", 1, b, err, 512), 0);
  ck_assert_int_eq(st_attach_model_add(m, "s", "F32", 0, NULL, err, 512), 0);
}

/* ==== Sizes and the header ================================================ */

START_TEST(test_sizes) {
  ck_assert_uint_eq(st_attach_area_bytes(0), 0);
  ck_assert_uint_eq(st_attach_area_bytes(1), 4096);
  ck_assert_uint_eq(st_attach_area_bytes(1024), 4096);
  ck_assert_uint_eq(st_attach_area_bytes(1025), 8192);
  ck_assert_uint_eq(st_attach_segment_bytes(0), 4096);
  ck_assert_uint_eq(st_attach_segment_bytes(1025), 4096 + 2 * 8192);
  ck_assert_uint_eq(st_attach_segment_bytes(ST_ATTACH_MAX_FLOATS),
                    4096 + 2 * (ST_ATTACH_MAX_FLOATS * 4));
  /* Counts no check lets through saturate rather than wrap. */
  ck_assert_uint_eq(st_attach_area_bytes(UINT64_MAX / 2), UINT64_MAX);
  ck_assert_uint_eq(st_attach_segment_bytes(UINT64_MAX / 4), UINT64_MAX);
  /* Area B follows area A. */
  static _Alignas(4096) uint8_t seg[4096 + 2 * 8192];
  st_attach_header_t* h = (st_attach_header_t*) seg;
  h->n_floats = 1025;
  ck_assert_ptr_eq(st_attach_area_a(seg), (float*) (seg + 4096));
  ck_assert_ptr_eq(st_attach_area_b(seg, 1025), (float*) (seg + 4096 + 8192));
}
END_TEST

START_TEST(test_check_header) {
  st_attach_header_t h;
  memset(&h, 0, sizeof h);
  h.magic = ST_ATTACH_MAGIC;
  h.version = ST_ATTACH_VERSION;
  h.n_floats = 10;
  h.segment_bytes = st_attach_segment_bytes(10);
  uint64_t size = h.segment_bytes;
  ck_assert_int_eq(st_attach_check_header(&h, size, 10, err, 512), 0);

  h.magic = 0x12345678;
  ck_assert_int_eq(st_attach_check_header(&h, size, 10, err, 512), -EPROTO);
  ck_assert_msg(strstr(err, "0x12345678") && strstr(err, "magic"), "%s", err);
  h.magic = ST_ATTACH_MAGIC;

  h.version = 2;
  ck_assert_int_eq(st_attach_check_header(&h, size, 10, err, 512), -EPROTO);
  ck_assert_msg(strstr(err, "version 2") && strstr(err, "version 1"), "%s",
                err);
  ck_assert_msg(strncmp(err, "version:", 8) == 0, "%s", err);
  h.version = ST_ATTACH_VERSION;

  /* The tensor list holds another count than the header. */
  ck_assert_int_eq(st_attach_check_header(&h, size, 11, err, 512), -EINVAL);
  ck_assert_msg(strstr(err, "10 floats") && strstr(err, "11"), "%s", err);
  /* The file is shorter or longer than the header says. */
  ck_assert_int_eq(st_attach_check_header(&h, size - 4096, 10, err, 512),
                   -EINVAL);
  ck_assert_int_eq(st_attach_check_header(&h, size + 1, 10, err, 512), -EINVAL);
  ck_assert_int_eq(st_attach_check_header(&h, 0, 10, err, 512), -EINVAL);
  /* The header's own size is wrong. */
  h.segment_bytes = size * 2;
  ck_assert_int_eq(st_attach_check_header(&h, size, 10, err, 512), -EINVAL);
  ck_assert_msg(strstr(err, "bytes"), "%s", err);
  /* A hostile count in the header and file. */
  h.n_floats = UINT64_MAX;
  h.segment_bytes = UINT64_MAX;
  ck_assert_int_eq(st_attach_check_header(&h, UINT64_MAX, UINT64_MAX, err, 512),
                   -EINVAL);
}
END_TEST

/* ==== The tensor list ===================================================== */

START_TEST(test_model_add) {
  st_attach_model_t m;
  small_model(&m);
  ck_assert_uint_eq(m.n, 3);
  ck_assert_uint_eq(m.n_floats, 10);
  ck_assert_str_eq(m.t[0].name, "w");
  ck_assert_str_eq(m.t[0].dtype, "F32");
  ck_assert_int_eq(m.t[0].ndim, 2);
  ck_assert_uint_eq(m.t[0].shape[1], 3);
  ck_assert_uint_eq(m.t[0].n_elems, 6);
  ck_assert_uint_eq(m.t[0].offset, 0);
  ck_assert_uint_eq(m.t[1].offset, 6);
  ck_assert_uint_eq(m.t[2].n_elems, 1); /* a scalar */
  ck_assert_uint_eq(m.t[2].offset, 9);
  /* Eight dimensions, a 255-byte UTF-8 name, growth past the first
   * capacity. */
  uint64_t eight[8] = {1, 2, 1, 2, 1, 2, 1, 2};
  ck_assert_int_eq(st_attach_model_add(&m, "e", "F32", 8, eight, err, 512), 0);
  char longest[256];
  memset(longest, 'x', 255);
  memcpy(longest, "caf\xc3\xa9", 5);
  longest[255] = '\0';
  ck_assert_int_eq(st_attach_model_add(&m, longest, "F32", 0, NULL, err, 512),
                   0);
  for (int i = 0; i < 40; i++) {
    char name[16];
    snprintf(name, sizeof name, "layer.%d", i);
    uint64_t d[] = {(uint64_t) i + 1};
    ck_assert_int_eq(st_attach_model_add(&m, name, "F32", 1, d, err, 512), 0);
  }
  ck_assert_uint_eq(m.n, 45);
  ck_assert_uint_eq(m.n_floats, 10 + 16 + 1 + 40 * 41 / 2);
  ck_assert_str_eq(m.t[44].name, "layer.39");
  ck_assert_uint_eq(m.t[44].offset, m.n_floats - 40);
  st_attach_model_free(&m);
  ck_assert_ptr_null(m.t);
  ck_assert_uint_eq(m.n, 0);
  st_attach_model_free(NULL);
}
END_TEST

typedef struct {
  const char* name;
  const char* dtype;
  int ndim;
  uint64_t shape[9];
  const char* want; /* a piece of the sentence */
} bad_tensor_t;

START_TEST(test_model_add_rejects) {
  char long_name[300];
  memset(long_name, 'n', 256);
  long_name[256] = '\0';
  const bad_tensor_t table[] = {
      {NULL, "F32", 0, {0}, "tensor 3 has an empty name"},
      {"", "F32", 0, {0}, "tensor 3 has an empty name"},
      {long_name, "F32", 0, {0}, "longer than 255 bytes"},
      {"caf\xc3", "F32", 0, {0}, "not valid UTF-8"},
      {"\xed\xa0\x80", "F32", 0, {0}, "not valid UTF-8"},
      {"a\nb", "F32", 0, {0}, "control character at byte 1"},
      {"a\x7f", "F32", 0, {0}, "control character at byte 1"},
      {"ab\xc2\x85", "F32", 0, {0}, "control character at byte 2"},
      {"w", "F32", 1, {4}, "tensor 3: 'w' is already tensor 0"},
      {"x", "F16", 1, {4}, "dtype 'F16' is not supported"},
      {"x", NULL, 1, {4}, "dtype '(none)'"},
      {"x", "F32\n", 1, {4}, "dtype 'F32?'"},
      {"x", "F32", -1, {4}, "-1 dimensions"},
      {"x", "F32", 9, {1, 1, 1, 1, 1, 1, 1, 1, 1}, "9 dimensions"},
      {"x", "F32", 2, {4, 0}, "'x': dimension 1 is 0"},
      {"x", "F32", 1, {(1ull << 34) + 1}, "more than 2^34 elements"},
      {"x", "F32", 2, {1ull << 20, 1ull << 20}, "more than 2^34 elements"},
      {"x", "F32", 3, {1ull << 40, 1ull << 40, 1ull << 40}, "2^34"},
      {"x", "F32", 1, {1ull << 34}, "up to 'x' hold more than 2^34"},
  };
  for (size_t k = 0; k < sizeof table / sizeof table[0]; k++) {
    const bad_tensor_t* b = &table[k];
    st_attach_model_t m;
    small_model(&m);
    err[0] = '\0';
    int rc = st_attach_model_add(&m, b->name, b->dtype, b->ndim, b->shape, err,
                                 sizeof err);
    ck_assert_msg(rc == -EINVAL, "case %zu: rc %d", k, rc);
    ck_assert_msg(strstr(err, b->want) != NULL, "case %zu: '%s' lacks '%s'", k,
                  err, b->want);
    /* A refused tensor leaves the list as it was. */
    ck_assert_uint_eq(m.n, 3);
    ck_assert_uint_eq(m.n_floats, 10);
    st_attach_model_free(&m);
  }
  /* No error buffer: still refused. */
  st_attach_model_t m;
  small_model(&m);
  ck_assert_int_eq(st_attach_model_add(&m, "", "F32", 0, NULL, NULL, 0),
                   -EINVAL);
  st_attach_model_free(&m);
}
END_TEST

/* ==== Differences, description, canonical text ========================== */

static void add(st_attach_model_t* m, const char* name, int ndim, uint64_t d0,
                uint64_t d1) {
  uint64_t s[2] = {d0, d1};
  ck_assert_int_eq(st_attach_model_add(m, name, "F32", ndim, s, err, 512), 0);
}

START_TEST(test_model_diff) {
  st_attach_model_t a = {0}, b = {0};
  char out[512];
  ck_assert(!st_attach_model_diff(&a, "here", &b, "there", out, sizeof out));
  add(&a, "fc0.weight", 2, 128, 784);
  add(&a, "fc.weight", 2, 10, 128);
  add(&b, "fc0.weight", 2, 128, 784);
  add(&b, "fc.weight", 2, 10, 64);
  ck_assert(st_attach_model_diff(&a, "here", &b, "there", out, sizeof out));
  ck_assert_str_eq(out,
                   "tensor 1: 'fc.weight' F32 [10, 128] here, 'fc.weight' F32 "
                   "[10, 64] there");
  st_attach_model_free(&b);

  /* Another name; another rank (a scalar reads "[]"). */
  add(&b, "fc0.weight", 2, 128, 784);
  add(&b, "fc.w", 0, 0, 0);
  ck_assert(st_attach_model_diff(&a, "in the program", &b, "in the cluster",
                                 out, sizeof out));
  ck_assert_str_eq(out,
                   "tensor 1: 'fc.weight' F32 [10, 128] in the program, 'fc.w' "
                   "F32 [] in the cluster");
  st_attach_model_free(&b);

  /* The same tensors, one more on either side. */
  add(&b, "fc0.weight", 2, 128, 784);
  add(&b, "fc.weight", 2, 10, 128);
  ck_assert(!st_attach_model_diff(&a, "here", &b, "there", out, sizeof out));
  add(&b, "fc.bias", 1, 10, 0);
  ck_assert(st_attach_model_diff(&a, "here", &b, "there", out, sizeof out));
  ck_assert_str_eq(out,
                   "2 tensors here, 3 there: tensor 2 'fc.bias' F32 [10] is "
                   "only there");
  ck_assert(st_attach_model_diff(&b, "here", &a, "there", out, sizeof out));
  ck_assert_str_eq(out,
                   "3 tensors here, 2 there: tensor 2 'fc.bias' F32 [10] is "
                   "only here");
  /* A short buffer gets a truncated, terminated sentence. */
  char tiny[12];
  ck_assert(st_attach_model_diff(&b, "here", &a, "there", tiny, sizeof tiny));
  ck_assert_str_eq(tiny, "3 tensors h");
  st_attach_model_free(&a);
  st_attach_model_free(&b);
}
END_TEST

START_TEST(test_model_describe) {
  st_attach_model_t m;
  small_model(&m);
  char out[96];
  st_attach_model_describe(&m, out, sizeof out);
  ck_assert_str_eq(out, "attached:3 tensors,10 params,w");
  /* Without room for the whole first name, none of it. */
  char small[30];
  st_attach_model_describe(&m, small, sizeof small);
  ck_assert_str_eq(small, "attached:3 tensors,10 params");
  char tiny[10];
  st_attach_model_describe(&m, tiny, sizeof tiny);
  ck_assert_str_eq(tiny, "attached:");
  st_attach_model_describe(&m, tiny, 0); /* writes nothing */
  st_attach_model_free(&m);
}
END_TEST

START_TEST(test_model_canonical) {
  st_attach_model_t m;
  small_model(&m);
  size_t len = 0;
  char* text = st_attach_model_canonical(&m, &len);
  ck_assert_str_eq(text, "w\tF32\t2,3\nb\tF32\t3\ns\tF32\t\n");
  ck_assert_uint_eq(len, strlen(text));
  free(text);
  st_attach_model_free(&m);
  text = st_attach_model_canonical(&m, &len);
  ck_assert_str_eq(text, "");
  ck_assert_uint_eq(len, 0);
  free(text);
}
END_TEST

/* The canonical text parses back into the same list, and what parses
 * prints back to the same text. */
START_TEST(test_model_parse) {
  st_attach_model_t m, back;
  small_model(&m);
  size_t len = 0;
  char* text = st_attach_model_canonical(&m, &len);
  ck_assert_int_eq(st_attach_model_parse(text, len, &back, err, sizeof err), 0);
  ck_assert(!st_attach_model_diff(&m, "a", &back, "b", err, sizeof err));
  ck_assert_uint_eq(back.n_floats, m.n_floats);
  ck_assert_uint_eq(back.t[1].offset, 6);
  size_t len2 = 0;
  char* again = st_attach_model_canonical(&back, &len2);
  ck_assert_uint_eq(len2, len);
  ck_assert_mem_eq(again, text, len);
  free(again);
  free(text);
  st_attach_model_free(&back);
  st_attach_model_free(&m);
  /* Eight dimensions of 1..8, the most there are. */
  const char* deep = "x\tF32\t1,2,3,4,5,6,7,8\n";
  ck_assert_int_eq(
      st_attach_model_parse(deep, strlen(deep), &back, err, sizeof err), 0);
  ck_assert_int_eq(back.t[0].ndim, 8);
  ck_assert_uint_eq(back.n_floats, 40320);
  st_attach_model_free(&back);
}
END_TEST

/* Lists from another node are hostile: each is refused with a sentence,
 * and the model is left empty. */
START_TEST(test_model_parse_rejects) {
  static const struct {
    const char* text;
    size_t len; /* 0: strlen */
    const char* says;
  } bad[] = {
      {"", 0, "empty"},
      {"w\tF32\t2", 0, "does not end with a newline"},
      {"w\tF32\n", 0, "line 1"},
      {"w F32 2\n", 0, "line 1"},
      {"w\tF32\t2\nw\tF32\t3\n", 0, "already tensor 0"},
      {"w\tF16\t2\n", 0, "F16"},
      {"w\tF32\t-1\n", 0, "malformed"},
      {"w\tF32\t+1\n", 0, "malformed"},
      {"w\tF32\t 1\n", 0, "malformed"},
      {"w\tF32\t01\n", 0, "malformed"},
      {"w\tF32\t1,\n", 0, "malformed"},
      {"w\tF32\t,1\n", 0, "malformed"},
      {"w\tF32\t1,,1\n", 0, "malformed"},
      {"w\tF32\t0\n", 0, "w"},
      {"w\tF32\t18446744073709551616\n", 0, "malformed"},
      {"w\tF32\t99999999999999999999\n", 0, "malformed"},
      {"w\tF32\t4294967296,4294967296\n", 0, "2^34"},
      {"w\tF32\t1,1,1,1,1,1,1,1,1\n", 0, "malformed"},
      {"\tF32\t1\n", 0, "name"},
      {"a\x1b[31m\tF32\t1\n", 0, "control"},
      {"w\tF32\t1\nv\0\tF32\t1\n", 16, "NUL"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    st_attach_model_t m;
    size_t len = bad[i].len ? bad[i].len : strlen(bad[i].text);
    err[0] = '\0';
    int rc = st_attach_model_parse(bad[i].text, len, &m, err, sizeof err);
    ck_assert_msg(rc == -EINVAL, "case %zu: rc %d", i, rc);
    ck_assert_msg(strstr(err, bad[i].says) != NULL, "case %zu: '%s'", i, err);
    ck_assert_ptr_null(m.t);
    ck_assert_uint_eq(m.n, 0);
  }
  /* A name of ST_ATTACH_NAME_MAX bytes parses; one more does not. */
  char line[ST_ATTACH_NAME_MAX + 16];
  for (int over = 0; over < 2; over++) {
    size_t n = ST_ATTACH_NAME_MAX + (size_t) over;
    memset(line, 'n', n);
    memcpy(line + n, "\tF32\t1\n", 7);
    st_attach_model_t m;
    int rc = st_attach_model_parse(line, n + 7, &m, err, sizeof err);
    ck_assert_msg(rc == (over ? -EINVAL : 0), "%s", err);
    st_attach_model_free(&m);
  }
}
END_TEST

/* ==== The request ========================================================= */

static const char* const kNasty = "say \"hi\" \\ caf\xc3\xa9 \xf0\x9f\x98\x80";

START_TEST(test_request_round_trip) {
  st_attach_model_t m;
  small_model(&m);
  uint64_t d[] = {5, 7};
  ck_assert_int_eq(st_attach_model_add(&m, kNasty, "F32", 2, d, err, 512), 0);
  size_t len = 0;
  char* json = st_attach_request_encode(&m, 4242, &len);
  ck_assert_ptr_nonnull(json);
  ck_assert_uint_eq(len, strlen(json));
  ck_assert_msg(
      strncmp(json, "{\"version\":1,\"pid\":4242,\"tensors\":[", 35) == 0, "%s",
      json);
  st_attach_model_t back;
  uint32_t version = 0;
  int64_t pid = 0;
  ck_assert_msg(st_attach_request_decode(json, len, &back, &version, &pid, err,
                                         sizeof err) == 0,
                "%s", err);
  ck_assert_uint_eq(version, 1);
  ck_assert_int_eq(pid, 4242);
  char diff[512];
  ck_assert_msg(
      !st_attach_model_diff(&m, "sent", &back, "received", diff, sizeof diff),
      "%s", diff);
  ck_assert_uint_eq(back.n_floats, m.n_floats);
  ck_assert_uint_eq(back.t[3].offset, 10);
  ck_assert_str_eq(back.t[3].name, kNasty);
  free(json);
  st_attach_model_free(&back);
  st_attach_model_free(&m);
}
END_TEST

typedef struct {
  const char* json;
  int rc;
  const char* want; /* a piece of the sentence */
} hostile_t;

#define HEAD "{\"version\":1,\"pid\":7,\"tensors\":"
#define T(name, shape) \
  "{\"name\":" name ",\"dtype\":\"F32\",\"shape\":" shape "}"

/* Requests a local process might send, each refused with its own code
 * and sentence. */
static const hostile_t kHostile[] = {
    {"", -EBADMSG, "not valid JSON"},
    {"{", -EBADMSG, "not valid JSON"},
    {"[]", -EBADMSG, "an array, not an object"},
    {"{}", -EBADMSG, "no protocol 'version'"},
    {"{\"version\":\"1\"}", -EBADMSG, "'version'"},
    {"{\"version\":1.5}", -EBADMSG, "'version'"},
    {"{\"version\":-1}", -EBADMSG, "'version'"},
    {"{\"version\":4294967296}", -EBADMSG, "'version'"},
    {"{\"version\":2,\"pid\":7,\"tensors\":[]}", -EPROTO,
     "version: the program speaks attach protocol version 2 and this node "
     "version 1"},
    {"{\"version\":0}", -EPROTO, "version 0"},
    {"{\"version\":1}", -EBADMSG, "'pid'"},
    {"{\"version\":1,\"pid\":\"7\"}", -EBADMSG, "'pid'"},
    {"{\"version\":1,\"pid\":-7}", -EBADMSG, "'pid'"},
    {"{\"version\":1,\"pid\":7}", -EBADMSG, "no 'tensors' array"},
    {HEAD "{}}", -EBADMSG, "no 'tensors' array"},
    {HEAD "[]}", -EINVAL, "lists no tensors"},
    {HEAD "[1]}", -EBADMSG, "tensor 0 of the attach request is a number"},
    {HEAD "[{\"dtype\":\"F32\",\"shape\":[1]}]}", -EBADMSG,
     "tensor 0 of the attach request has no 'name'"},
    {HEAD "[" T("1", "[1]") "]}", -EBADMSG, "'name' is a number, not a"},
    {HEAD "[{\"name\":\"a\",\"shape\":[1]}]}", -EBADMSG, "no 'dtype'"},
    {HEAD "[{\"name\":\"a\",\"dtype\":\"F16\",\"shape\":[1]}]}", -EINVAL,
     "dtype 'F16' is not supported"},
    {HEAD "[{\"name\":\"a\",\"dtype\":\"F32\"}]}", -EBADMSG, "no 'shape'"},
    {HEAD "[" T("\"a\"", "\"x\"") "]}", -EBADMSG, "'shape' is a string"},
    {HEAD "[" T("\"a\"", "[0]") "]}", -EINVAL, "'a': dimension 0 is 0"},
    {HEAD "[" T("\"a\"", "[-1]") "]}", -EBADMSG, "dimension 0 is not"},
    {HEAD "[" T("\"a\"", "[1.5]") "]}", -EBADMSG, "dimension 0 is not"},
    {HEAD "[" T("\"a\"", "[\"1\"]") "]}", -EBADMSG, "dimension 0 is not"},
    {HEAD "[" T("\"a\"", "[[1]]") "]}", -EBADMSG, "not valid JSON"},
    {HEAD "[" T("\"a\"", "[9007199254740993]") "]}", -EBADMSG, "beyond 2^53"},
    {HEAD "[" T("\"a\"", "[1,1,1,1,1,1,1,1,1]") "]}", -EINVAL,
     "has 9 dimensions"},
    {HEAD "[" T("\"a\"", "[4194304,4194304]") "]}", -EINVAL,
     "more than 2^34 elements"},
    {HEAD "[" T("\"a\"", "[17179869184]") "," T("\"b\"", "[1]") "]}", -EINVAL,
     "up to 'b' hold more than 2^34"},
    {HEAD
     "[" T("\"a\"", "[1]") "," T("\"b\"", "[2]") "," T("\"a\"", "[3]") "]}",
     -EINVAL, "tensor 2: 'a' is already tensor 0"},
    {HEAD "[" T("\"\"", "[1]") "]}", -EINVAL, "tensor 0 has an empty name"},
    {HEAD "[" T("\"a\\u0001\"", "[1]") "]}", -EINVAL, "control character"},
    {HEAD "[" T("\"a\\u0000\"", "[1]") "]}", -EBADMSG, "not valid JSON"},
    {HEAD "[" T("\"\\ud800\"", "[1]") "]}", -EBADMSG, "not valid JSON"},
    {"{\"version\":1,\"version\":1,\"pid\":7,\"tensors\":[]}", -EBADMSG,
     "not valid JSON"},
    {HEAD "[" T("\"a\"", "[1]") "]} x", -EBADMSG, "not valid JSON"},
    {HEAD "[" T("\"a\"", "[1]") "]", -EBADMSG, "not valid JSON"},
    {HEAD "[[[[[[[[1]]]]]]]]}", -EBADMSG, "not valid JSON"},
};

START_TEST(test_request_hostile) {
  for (size_t k = 0; k < sizeof kHostile / sizeof kHostile[0]; k++) {
    const hostile_t* h = &kHostile[k];
    st_attach_model_t m;
    uint32_t version = 99;
    int64_t pid = 99;
    err[0] = '\0';
    int rc = st_attach_request_decode(h->json, strlen(h->json), &m, &version,
                                      &pid, err, sizeof err);
    ck_assert_msg(rc == h->rc, "case %zu (%s): rc %d, want %d (%s)", k, h->json,
                  rc, h->rc, err);
    ck_assert_msg(strstr(err, h->want) != NULL, "case %zu: '%s' lacks '%s'", k,
                  err, h->want);
    ck_assert_ptr_null(m.t); /* nothing to free after a failure */
    ck_assert_uint_eq(m.n, 0);
  }
  /* A 256-byte name; the text need not be NUL-terminated. */
  char json[600];
  char name[257];
  memset(name, 'n', 256);
  name[256] = '\0';
  int n = snprintf(json, sizeof json, HEAD "[" T("\"%s\"", "[1]") "]}", name);
  st_attach_model_t m;
  uint32_t version;
  int64_t pid;
  ck_assert_int_eq(st_attach_request_decode(json, (size_t) n, &m, &version,
                                            &pid, err, sizeof err),
                   -EINVAL);
  ck_assert_msg(strstr(err, "longer than 255"), "%s", err);
  /* More than a frame holds. */
  ck_assert_int_eq(st_attach_request_decode(json, ST_ATTACH_FRAME_MAX + 1, &m,
                                            &version, &pid, err, sizeof err),
                   -EBADMSG);
}
END_TEST

/* A request of n tensors "t0", "t1", ... of shape [1]; dup repeats t0 as
 * the last one. */
static char* many_tensors(size_t n, int dup, size_t* len) {
  st_json_buf_t b;
  st_json_buf_init(&b);
  st_json_buf_puts(&b, HEAD "[");
  for (size_t i = 0; i < n; i++) {
    char one[96];
    snprintf(one, sizeof one,
             "%s{\"name\":\"t%zu\",\"dtype\":\"F32\",\"shape\":[1]}",
             i ? "," : "", dup && i + 1 == n ? 0 : i);
    st_json_buf_puts(&b, one);
  }
  st_json_buf_puts(&b, "]}");
  ck_assert(!b.failed);
  *len = b.len;
  return b.p;
}

START_TEST(test_request_counts) {
  st_attach_model_t m;
  uint32_t version;
  int64_t pid;
  size_t len;
  /* The most tensors a request may list, checked for duplicates by
   * sorting (a quadratic check would take seconds here). */
  char* json = many_tensors(ST_ATTACH_MAX_TENSORS, 0, &len);
  double t0 = st_now_s();
  ck_assert_msg(st_attach_request_decode(json, len, &m, &version, &pid, err,
                                         sizeof err) == 0,
                "%s", err);
  ck_assert_double_lt(st_now_s() - t0, 5.0);
  ck_assert_uint_eq(m.n, ST_ATTACH_MAX_TENSORS);
  ck_assert_uint_eq(m.n_floats, ST_ATTACH_MAX_TENSORS);
  st_attach_model_free(&m);
  free(json);
  json = many_tensors(ST_ATTACH_MAX_TENSORS, 1, &len);
  ck_assert_int_eq(
      st_attach_request_decode(json, len, &m, &version, &pid, err, sizeof err),
      -EINVAL);
  ck_assert_msg(strstr(err, "tensor 65535: 't0' is already tensor 0"), "%s",
                err);
  free(json);
  json = many_tensors(ST_ATTACH_MAX_TENSORS + 1, 0, &len);
  ck_assert_int_eq(
      st_attach_request_decode(json, len, &m, &version, &pid, err, sizeof err),
      -EINVAL);
  ck_assert_msg(strstr(err, "65537 tensors; at most 65536"), "%s", err);
  free(json);
}
END_TEST

/* Random byte flips, insertions and cuts of a valid request: the decoder
 * must answer every one with 0 (and a list that passes its own checks) or
 * a negative errno, never crash or leak (ASan). */
START_TEST(test_request_mutations) {
  st_attach_model_t m;
  small_model(&m);
  size_t len;
  char* good = st_attach_request_encode(&m, 1, &len);
  st_attach_model_free(&m);
  st_rng_t rng;
  st_rng_seed(&rng, tu_seed());
  static const char alphabet[] =
      "{}[]\",:0123456789-.eE \\uFtruefalsnl\x01\xff";
  char* buf = malloc(len + 8);
  for (int iter = 0; iter < 20000; iter++) {
    memcpy(buf, good, len);
    size_t n = len;
    int edits = 1 + (int) st_rng_below(&rng, 4);
    for (int e = 0; e < edits; e++) {
      size_t at = st_rng_below(&rng, n);
      char c = alphabet[st_rng_below(&rng, sizeof alphabet - 1)];
      switch (st_rng_below(&rng, 3)) {
        case 0:
          buf[at] = c;
          break;
        case 1:
          n = at; /* cut */
          break;
        default:
          if (n < len + 8) {
            memmove(buf + at + 1, buf + at, n - at);
            buf[at] = c;
            n++;
          }
      }
      if (n == 0)
        break;
    }
    uint32_t version;
    int64_t pid;
    int rc =
        st_attach_request_decode(buf, n, &m, &version, &pid, err, sizeof err);
    ck_assert_int_le(rc, 0);
    if (rc == 0) {
      ck_assert_uint_ge(m.n, 1);
      uint64_t total = 0;
      for (size_t i = 0; i < m.n; i++) {
        ck_assert_uint_eq(m.t[i].offset, total);
        total += m.t[i].n_elems;
      }
      ck_assert_uint_eq(total, m.n_floats);
    } else {
      ck_assert(strlen(err) > 0);
    }
    st_attach_model_free(&m);
  }
  free(buf);
  free(good);
}
END_TEST

/* ==== The reply =========================================================== */

START_TEST(test_reply_round_trip) {
  size_t len;
  char* json = st_attach_reply_encode(true, 1234, "cluster", NULL, &len);
  ck_assert_str_eq(json, "{\"ok\":true,\"step\":1234,\"source\":\"cluster\"}");
  bool ok = false;
  uint64_t step = 0;
  char source[32], error[128];
  ck_assert_int_eq(st_attach_reply_decode(json, len, &ok, &step, source,
                                          sizeof source, error, sizeof error),
                   0);
  ck_assert(ok);
  ck_assert_uint_eq(step, 1234);
  ck_assert_str_eq(source, "cluster");
  ck_assert_str_eq(error, "");
  free(json);

  json =
      st_attach_reply_encode(false, 0, NULL, "busy: \"x\" is attached", &len);
  ck_assert_str_eq(json,
                   "{\"ok\":false,\"error\":\"busy: \\\"x\\\" is attached\"}");
  ck_assert_int_eq(st_attach_reply_decode(json, len, &ok, &step, source,
                                          sizeof source, error, sizeof error),
                   0);
  ck_assert(!ok);
  ck_assert_uint_eq(step, 0);
  ck_assert_str_eq(error, "busy: \"x\" is attached");
  /* Small buffers truncate. */
  char tiny[6];
  ck_assert_int_eq(st_attach_reply_decode(json, len, &ok, &step, source,
                                          sizeof source, tiny, sizeof tiny),
                   0);
  ck_assert_str_eq(tiny, "busy:");
  free(json);
}
END_TEST

START_TEST(test_reply_hostile) {
  const char* const bad[] = {
      "",
      "nope",
      "[]",
      "{}",
      "{\"ok\":1,\"step\":1}",
      "{\"ok\":\"true\",\"step\":1}",
      "{\"ok\":true}",
      "{\"ok\":true,\"step\":-1}",
      "{\"ok\":true,\"step\":1.5}",
      "{\"ok\":true,\"step\":\"1\"}",
      "{\"ok\":true,\"step\":18446744073709551615}",
      "{\"ok\":true,\"step\":1,\"source\":5}",
      "{\"ok\":false}",
      "{\"ok\":false,\"error\":{}}",
      "{\"ok\":true,\"ok\":false,\"step\":1}",
      "{\"ok\":true,\"step\":1,\"x\":[1]}",
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    bool ok = true;
    uint64_t step = 7;
    char source[32] = "x", error[200] = "";
    int rc = st_attach_reply_decode(bad[k], strlen(bad[k]), &ok, &step, source,
                                    sizeof source, error, sizeof error);
    ck_assert_msg(rc == -EBADMSG, "case %zu (%s): rc %d", k, bad[k], rc);
    ck_assert_msg(!ok && strlen(error) > 0, "case %zu: %s", k, error);
    ck_assert_msg(strstr(error, "reply") || strstr(error, "refused"),
                  "case %zu: %s", k, error);
  }
  /* Control characters in a refusal come out as '?'. */
  const char* j = "{\"ok\":false,\"error\":\"a\\nb\\u001bc\"}";
  bool ok;
  uint64_t step;
  char error[64];
  ck_assert_int_eq(
      st_attach_reply_decode(j, strlen(j), &ok, &step, NULL, 0, error, 64), 0);
  ck_assert_str_eq(error, "a?b?c");
  /* Unknown members are ignored; source is optional. */
  j = "{\"ok\":true,\"step\":3,\"later\":\"x\"}";
  char source[8] = "junk";
  ck_assert_int_eq(
      st_attach_reply_decode(j, strlen(j), &ok, &step, source, 8, error, 64),
      0);
  ck_assert(ok);
  ck_assert_uint_eq(step, 3);
  ck_assert_str_eq(source, "");
}
END_TEST

/* ==== Frames ============================================================== */

START_TEST(test_frames) {
  size_t n = 0;
  uint8_t* f = st_attach_frame("{\"a\":1}", 7, &n);
  ck_assert_uint_eq(n, 11);
  ck_assert(memcmp(f, "\x07\x00\x00\x00{\"a\":1}", 11) == 0);
  ck_assert_uint_eq(st_attach_frame_len(f), 7);
  free(f);
  const uint8_t le[4] = {0x04, 0x03, 0x02, 0x01};
  ck_assert_uint_eq(st_attach_frame_len(le), 0x01020304u);
  f = st_attach_frame("", 0, &n);
  ck_assert_uint_eq(n, 4);
  ck_assert_uint_eq(st_attach_frame_len(f), 0);
  free(f);
  /* Longer than a frame may be. */
  ck_assert_ptr_null(st_attach_frame("x", ST_ATTACH_FRAME_MAX + 1, &n));
}
END_TEST

static Suite* attach_suite(void) {
  Suite* s = suite_create("attach");
  TCase* tc = tcase_create("protocol");
  tcase_add_test(tc, test_sizes);
  tcase_add_test(tc, test_check_header);
  tcase_add_test(tc, test_model_add);
  tcase_add_test(tc, test_model_add_rejects);
  tcase_add_test(tc, test_model_diff);
  tcase_add_test(tc, test_model_describe);
  tcase_add_test(tc, test_model_canonical);
  tcase_add_test(tc, test_model_parse);
  tcase_add_test(tc, test_model_parse_rejects);
  tcase_add_test(tc, test_request_round_trip);
  tcase_add_test(tc, test_request_hostile);
  tcase_add_test(tc, test_request_counts);
  tcase_add_test(tc, test_request_mutations);
  tcase_add_test(tc, test_reply_round_trip);
  tcase_add_test(tc, test_reply_hostile);
  tcase_add_test(tc, test_frames);
  tcase_set_timeout(tc, 120);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(attach_suite());
  srunner_run_all(sr, CK_ENV);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
