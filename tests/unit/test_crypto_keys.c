/* test_crypto_keys.c: the Check suite for the keys a node keeps on disk
 * (crypto/keyfile.c), the key ids and keyring (crypto/keys.c) and the
 * allow-list (crypto/allowlist.c): round trips that sign and verify with
 * the loaded key, the 0600 mode and the refusal to overwrite, a table of
 * files each refused with its own message, key ids checked against an
 * independent computation, a keyring given a real key id collision, and
 * allow-lists good and bad. The test calls libsodium directly only to check
 * crypto/ from outside. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crypto/crypto.h"
#include "crypto/crypto_internal.h"
#include "tests/unit/testutil.h"

#define B64 sodium_base64_VARIANT_URLSAFE_NO_PADDING

static char dir[512];
static char err[512];

static void setup(void) {
  ck_assert_int_eq(st_crypto_init(), 0);
  ck_assert_int_eq(tu_mkdtemp(dir, sizeof(dir)), 0);
  err[0] = '\0';
}

static void teardown(void) {
  tu_rmtree(dir);
}

static char* path_in(const char* name) {
  static char buf[16][1024];
  static int next;
  char* p = buf[next++ % 16];
  snprintf(p, sizeof(buf[0]), "%s/%s", dir, name);
  return p;
}

/* Reads a whole (small) file into buf; returns its length. */
static size_t slurp(const char* path, char* buf, size_t cap) {
  FILE* f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "open %s", path);
  size_t n = fread(buf, 1, cap - 1, f);
  fclose(f);
  buf[n] = '\0';
  return n;
}

/* Writes content to path with the given mode. */
static void put(const char* path, const char* content, size_t len,
                mode_t mode) {
  ck_assert_int_eq(tu_write_file(path, content, len), 0);
  ck_assert_int_eq(chmod(path, mode), 0);
}

static void b64(const uint8_t* bin, size_t len, char* out, size_t cap) {
  sodium_bin2base64(out, cap, bin, len, B64);
}

#define ck_assert_err_has(needle)              \
  ck_assert_msg(strstr(err, (needle)) != NULL, \
                "error message '%s' does not contain '%s'", err, (needle))

/* ---- Round trips -------------------------------------------------------- */

START_TEST(test_identity_round_trip) {
  st_identity_t a, b;
  ck_assert_int_eq(st_identity_generate(&a), 0);
  const char* p = path_in("node.key");
  ck_assert_int_eq(st_identity_write(p, &a, err, sizeof(err)), 0);
  memset(&b, 0xAB, sizeof(b));
  ck_assert_int_eq(st_identity_load(p, &b, err, sizeof(err)), 0);
  ck_assert_mem_eq(a.public_key, b.public_key, sizeof(a.public_key));
  ck_assert_mem_eq(a.secret_key, b.secret_key, sizeof(a.secret_key));
  ck_assert_mem_eq(a.id.b, b.id.b, sizeof(a.id.b));
  st_node_id_t id;
  st_node_id_from_public_key(b.public_key, &id);
  ck_assert_int_eq(st_node_id_compare(&id, &b.id), 0);

  /* The loaded key signs, and the original public key verifies. */
  static const uint8_t msg[] = "a transcript";
  uint8_t sig[crypto_sign_BYTES];
  ck_assert_int_eq(
      crypto_sign_detached(sig, NULL, msg, sizeof(msg), b.secret_key), 0);
  ck_assert_int_eq(
      crypto_sign_verify_detached(sig, msg, sizeof(msg), a.public_key), 0);
  sig[0] ^= 1;
  ck_assert_int_ne(
      crypto_sign_verify_detached(sig, msg, sizeof(msg), a.public_key), 0);

  /* The file: mode 0600, one line, the seed in base64. */
  struct stat st;
  ck_assert_int_eq(stat(p, &st), 0);
  ck_assert_uint_eq(st.st_mode & 07777, 0600);
  char text[256], want[256], seed[64];
  b64(a.secret_key, 32, seed, sizeof(seed));
  snprintf(want, sizeof(want), "starling-identity-v1 %s\n", seed);
  ck_assert_uint_eq(slurp(p, text, sizeof(text)), 65);
  ck_assert_str_eq(text, want);
  st_identity_wipe(&a);
  st_identity_wipe(&b);
}
END_TEST

START_TEST(test_cluster_key_round_trip) {
  st_cluster_key_t a, b;
  ck_assert_int_eq(st_cluster_key_generate(&a), 0);
  const char* p = path_in("cluster.key");
  ck_assert_int_eq(st_cluster_key_write(p, &a, err, sizeof(err)), 0);
  memset(&b, 0xAB, sizeof(b));
  ck_assert_int_eq(st_cluster_key_load(p, &b, err, sizeof(err)), 0);
  ck_assert_mem_eq(a.key, b.key, sizeof(a.key));
  ck_assert_uint_eq(a.id, b.id);
  struct stat st;
  ck_assert_int_eq(stat(p, &st), 0);
  ck_assert_uint_eq(st.st_mode & 07777, 0600);
  char text[256], want[256], k[64];
  b64(a.key, 32, k, sizeof(k));
  snprintf(want, sizeof(want), "starling-cluster-key-v1 %s\n", k);
  ck_assert_uint_eq(slurp(p, text, sizeof(text)), 68);
  ck_assert_str_eq(text, want);
}
END_TEST

/* Files with a CRLF, no newline, or a mode stricter than 0600 still load. */
START_TEST(test_load_tolerated) {
  uint8_t key[32];
  char k[64], text[256];
  randombytes_buf(key, sizeof(key));
  b64(key, 32, k, sizeof(k));
  /* The file is "starling-cluster-key-v1" sep KEY end. */
  static const struct {
    const char* sep;
    const char* end;
    mode_t mode;
  } cases[] = {
      {" ", "", 0600},    {" ", "\r\n", 0600}, {"\t", "  \n\n", 0600},
      {"  ", "\n", 0400}, {" ", "\n", 0700},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char name[32];
    snprintf(name, sizeof(name), "ok%zu.key", i);
    const char* p = path_in(name);
    int n = snprintf(text, sizeof(text), "starling-cluster-key-v1%s%s%s",
                     cases[i].sep, k, cases[i].end);
    put(p, text, (size_t) n, cases[i].mode);
    st_cluster_key_t c;
    ck_assert_msg(st_cluster_key_load(p, &c, err, sizeof(err)) == 0,
                  "case %zu: %s", i, err);
    ck_assert_mem_eq(c.key, key, 32);
  }
}
END_TEST

/* ---- Writing refusals ------------------------------------------------------
 */

START_TEST(test_refuses_overwrite) {
  static const char precious[] = "precious old key\n";
  st_identity_t id;
  st_cluster_key_t key;
  ck_assert_int_eq(st_identity_generate(&id), 0);
  ck_assert_int_eq(st_cluster_key_generate(&key), 0);
  for (int kind = 0; kind < 2; kind++) {
    const char* p = path_in(kind ? "old-cluster.key" : "old-node.key");
    put(p, precious, strlen(precious), 0600);
    err[0] = '\0';
    int rc = kind ? st_cluster_key_write(p, &key, err, sizeof(err))
                  : st_identity_write(p, &id, err, sizeof(err));
    ck_assert_int_eq(rc, -EEXIST);
    ck_assert_err_has("refusing to overwrite");
    ck_assert_err_has("choose another path");
    ck_assert_err_has(p);
    char text[256];
    slurp(p, text, sizeof(text));
    ck_assert_str_eq(text, precious);
  }

  /* A symbolic link at the path, even a dangling one, is not followed. */
  const char* target = path_in("target");
  const char* link = path_in("link.key");
  ck_assert_int_eq(symlink(target, link), 0);
  ck_assert_int_eq(st_cluster_key_write(link, &key, err, sizeof(err)), -EEXIST);
  ck_assert_int_eq(access(target, F_OK), -1);
}
END_TEST

START_TEST(test_write_missing_directory) {
  st_cluster_key_t key;
  ck_assert_int_eq(st_cluster_key_generate(&key), 0);
  const char* p = path_in("no/such/dir/cluster.key");
  ck_assert_int_eq(st_cluster_key_write(p, &key, err, sizeof(err)), -ENOENT);
  ck_assert_err_has(p);
  ck_assert_err_has("cannot create");
}
END_TEST

/* A write that fails part-way (here: a file size limit of 16 bytes, the
 * portable stand-in for a full disk) leaves no file behind. */
START_TEST(test_write_failure_removes_file) {
  st_cluster_key_t key;
  ck_assert_int_eq(st_cluster_key_generate(&key), 0);
  const char* p = path_in("partial.key");
  struct rlimit old, lim;
  ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
  lim = old;
  lim.rlim_cur = 16;
  void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
  ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
  int rc = st_cluster_key_write(p, &key, err, sizeof(err));
  ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
  signal(SIGXFSZ, prev);
  ck_assert_int_eq(rc, -EFBIG);
  ck_assert_err_has(p);
  ck_assert_err_has("cannot write");
  ck_assert_int_eq(access(p, F_OK), -1);
  /* And the path is free for the next attempt. */
  ck_assert_int_eq(st_cluster_key_write(p, &key, err, sizeof(err)), 0);
}
END_TEST

/* ---- Loading refusals ------------------------------------------------------
 */

/* Loads p as kind 0 (identity) or 1 (cluster key). */
static int load_kind(int kind, const char* p) {
  err[0] = '\0';
  if (kind) {
    st_cluster_key_t c;
    return st_cluster_key_load(p, &c, err, sizeof(err));
  }
  st_identity_t id;
  return st_identity_load(p, &id, err, sizeof(err));
}

START_TEST(test_load_refuses_mode) {
  static const mode_t modes[] = {0644, 0640, 0604, 0660, 0620, 0602, 0610};
  st_identity_t id;
  st_cluster_key_t key;
  ck_assert_int_eq(st_identity_generate(&id), 0);
  ck_assert_int_eq(st_cluster_key_generate(&key), 0);
  const char* paths[2] = {path_in("node.key"), path_in("cluster.key")};
  ck_assert_int_eq(st_identity_write(paths[0], &id, err, sizeof(err)), 0);
  ck_assert_int_eq(st_cluster_key_write(paths[1], &key, err, sizeof(err)), 0);
  for (int kind = 0; kind < 2; kind++) {
    for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
      ck_assert_int_eq(chmod(paths[kind], modes[i]), 0);
      ck_assert_int_eq(load_kind(kind, paths[kind]), -EACCES);
      char want[64];
      snprintf(want, sizeof(want), "(mode %04o)", (unsigned) modes[i]);
      ck_assert_err_has(want);
      ck_assert_err_has("chmod 600");
      ck_assert_err_has(paths[kind]);
      ck_assert_err_has((modes[i] & 044) ? "readable" : "by group or others");
    }
    ck_assert_int_eq(chmod(paths[kind], 0600), 0);
    ck_assert_msg(load_kind(kind, paths[kind]) == 0, "%s", err);
  }
  /* A file that is no key file (a wrong path) is not met with advice to
   * chmod it. */
  const char* notkey = path_in("notes.txt");
  put(notkey, "hello\n", 6, 0644);
  ck_assert_int_eq(load_kind(1, notkey), -EBADMSG);
  ck_assert_err_has("not a starling cluster key file");
  ck_assert_msg(strstr(err, "chmod") == NULL, "%s", err);
}
END_TEST

START_TEST(test_load_refuses_not_regular) {
  st_cluster_key_t key;
  ck_assert_int_eq(st_cluster_key_generate(&key), 0);
  const char* real = path_in("real.key");
  ck_assert_int_eq(st_cluster_key_write(real, &key, err, sizeof(err)), 0);
  for (int kind = 0; kind < 2; kind++) {
    /* A symbolic link to a good, private key file. */
    const char* link = path_in("link.key");
    unlink(link);
    ck_assert_int_eq(symlink(real, link), 0);
    ck_assert_int_eq(load_kind(kind, link), -ELOOP);
    ck_assert_err_has("symbolic link");
    ck_assert_err_has(link);

    /* A directory (mode 0700, so the mode check would pass). */
    ck_assert_int_eq(load_kind(kind, dir), -EINVAL);
    ck_assert_err_has("is a directory");

    /* A FIFO: refused at once, not waited on. */
    const char* fifo = path_in("fifo.key");
    unlink(fifo);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    ck_assert_int_eq(load_kind(kind, fifo), -EINVAL);
    ck_assert_err_has("not a regular file");

    /* A missing file. */
    const char* missing = path_in("missing.key");
    ck_assert_int_eq(load_kind(kind, missing), -ENOENT);
    ck_assert_err_has(missing);
    ck_assert_err_has("No such file");
  }
}
END_TEST

/* Each malformed file, as a cluster key (kind 1) or identity (kind 0): the
 * content ("%H" is the right header, "%O" the other kind's, "%K" a good
 * base64 key), the error and a phrase of the message. */
typedef struct {
  const char* name;
  const char* content;
  int rc;
  const char* phrase;
} bad_case_t;

static const bad_case_t bad_cases[] = {
    {"empty", "", -EBADMSG, "is empty"},
    {"blank", "\n", -EBADMSG, "not a starling"},
    {"wrong header", "ssh-ed25519 %K\n", -EBADMSG, "expected a first word"},
    {"header prefix", "starling %K\n", -EBADMSG, "expected a first word"},
    {"header glued", "%H%K\n", -EBADMSG, "expected a first word"},
    {"other kind", "%O %K\n", -EBADMSG, "was given where"},
    {"header only", "%H\n", -EBADMSG, "no key after the header"},
    {"key on next line", "%H\n%K\n", -EBADMSG, "no key after the header"},
    {"bad base64", "%H AAAAAAAAAAAAAAAAAAAAAA+AAAAAAAAAAAAAAAAAAAAAA\n",
     -EBADMSG, "not valid base64"},
    {"padded", "%H AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n", -EBADMSG,
     "not valid base64"},
    {"short key", "%H AAAAAAAAAAAAAAAAAAAAAA\n", -EBADMSG,
     "the key is 16 bytes, expected 32"},
    {"long key",
     "%H AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n",
     -EBADMSG, "the key is 48 bytes, expected 32"},
    {"trailing garbage", "%H %K extra\n", -EBADMSG, "unexpected text after"},
    {"second line", "%H %K\n%H %K\n", -EBADMSG, "unexpected text after"},
    {"nul after key", "%H %K\n\0", -EBADMSG, "unexpected text after"},
};

/* Expands a bad_case_t template; returns the length. */
static size_t expand(const char* tmpl, int kind, const char* key, char* out,
                     size_t cap) {
  const char* h = kind ? "starling-cluster-key-v1" : "starling-identity-v1";
  const char* o = kind ? "starling-identity-v1" : "starling-cluster-key-v1";
  size_t n = 0;
  for (const char* t = tmpl; *t; t++) {
    const char* ins = NULL;
    if (t[0] == '%' && t[1] == 'H')
      ins = h;
    else if (t[0] == '%' && t[1] == 'O')
      ins = o;
    else if (t[0] == '%' && t[1] == 'K')
      ins = key;
    if (ins != NULL) {
      size_t l = strlen(ins);
      ck_assert_uint_lt(n + l, cap);
      memcpy(out + n, ins, l);
      n += l;
      t++;
    } else {
      ck_assert_uint_lt(n + 1, cap);
      out[n++] = *t;
    }
  }
  ck_assert_uint_lt(n, cap);
  out[n] = '\0';
  return n;
}

START_TEST(test_load_refuses_bad_files) {
  uint8_t key[32];
  char k[64], text[512];
  randombytes_buf(key, sizeof(key));
  b64(key, 32, k, sizeof(k));
  for (int kind = 0; kind < 2; kind++) {
    for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
      const bad_case_t* c = &bad_cases[i];
      size_t n = expand(c->content, kind, k, text, sizeof(text));
      if (strcmp(c->name, "nul after key") == 0)
        n++; /* the template's NUL is part of the file */
      char name[64];
      snprintf(name, sizeof(name), "bad%d-%zu.key", kind, i);
      const char* p = path_in(name);
      put(p, text, n, 0600);
      int rc = load_kind(kind, p);
      ck_assert_msg(rc == c->rc, "%s (%s): rc %d, want %d; %s", c->name,
                    kind ? "cluster" : "identity", rc, c->rc, err);
      ck_assert_msg(strstr(err, c->phrase) != NULL, "%s: '%s' lacks '%s'",
                    c->name, err, c->phrase);
      ck_assert_msg(strstr(err, p) != NULL, "%s: '%s' lacks the path", c->name,
                    err);
      /* The message never echoes the key. */
      ck_assert_msg(strstr(err, k) == NULL, "%s: key echoed", c->name);
    }
  }
  /* The exact sentence for a mix-up, as an operator would read it. */
  const char* p = path_in("bad0-5.key"); /* "other kind", as an identity */
  ck_assert_int_eq(load_kind(1, p), 0);
  ck_assert_int_eq(load_kind(0, p), -EBADMSG);
  ck_assert_err_has(
      "a cluster key file was given where an identity was expected");
  ck_assert_int_eq(load_kind(1, path_in("bad1-5.key")), -EBADMSG);
  ck_assert_err_has(
      "not a starling cluster key file (expected a first word "
      "'starling-cluster-key-v1'); an identity file was given where a "
      "cluster key was expected");
}
END_TEST

START_TEST(test_load_refuses_huge) {
  static const size_t sizes[] = {257, 4096, 1u << 20};
  char* big = malloc(1u << 20);
  ck_assert_ptr_nonnull(big);
  memset(big, ' ', 1u << 20);
  memcpy(big, "starling-cluster-key-v1 ", 24);
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    const char* p = path_in("huge.key");
    unlink(p);
    put(p, big, sizes[i], 0600);
    ck_assert_int_eq(load_kind(1, p), -EMSGSIZE);
    ck_assert_err_has("too large to be a starling key file");
  }
  /* 256 bytes (the key, then blanks) is still a key file. */
  uint8_t key[32] = {0};
  char k[64];
  b64(key, 32, k, sizeof(k));
  memcpy(big + 24, k, 43);
  const char* p = path_in("edge.key");
  put(p, big, 256, 0600);
  ck_assert_msg(load_kind(1, p) == 0, "%s", err);
  free(big);
}
END_TEST

/* ---- Key ids and keyrings ------------------------------------------------
 */

/* The key id as crypto.h defines it, computed here independently. */
static uint8_t reference_key_id(const uint8_t key[32]) {
  uint8_t personal[crypto_generichash_blake2b_PERSONALBYTES] = {0};
  memcpy(personal, "starling-keyid", 14);
  uint8_t h[16];
  crypto_generichash_blake2b_salt_personal(h, sizeof(h), key, 32, NULL, 0, NULL,
                                           personal);
  return h[0];
}

START_TEST(test_key_id) {
  int seen[256] = {0};
  int distinct = 0;
  for (int i = 0; i < 2000; i++) {
    st_cluster_key_t a, b;
    ck_assert_int_eq(st_cluster_key_generate(&a), 0);
    memcpy(b.key, a.key, 32);
    b.id = (uint8_t) (a.id + 1);
    st__cluster_key_set_id(&b);
    ck_assert_uint_eq(a.id, b.id);
    ck_assert_uint_eq(a.id, reference_key_id(a.key));
    distinct += !seen[a.id]++;
  }
  /* 2000 draws from 256 ids miss about 256 * e^-7.8 < 1 of them. */
  ck_assert_int_gt(distinct, 240);

  /* Known answers, from Python: hashlib.blake2b(key, digest_size=16,
   * person=b"starling-keyid").digest()[0] for 32 zero bytes and for
   * bytes(range(32)). */
  st_cluster_key_t z;
  memset(z.key, 0, 32);
  st__cluster_key_set_id(&z);
  ck_assert_uint_eq(z.id, 243);
  for (int i = 0; i < 32; i++)
    z.key[i] = (uint8_t) i;
  st__cluster_key_set_id(&z);
  ck_assert_uint_eq(z.id, 42);
}
END_TEST

START_TEST(test_keyring) {
  st_cluster_key_t a, b;
  st_keyring_t ring;
  ck_assert_int_eq(st_cluster_key_generate(&a), 0);

  /* No previous key. */
  ck_assert_int_eq(st_keyring_init(&ring, &a, NULL, err, sizeof(err)), 0);
  ck_assert(!ring.has_previous);
  ck_assert_ptr_eq(st__keyring_find(&ring, a.id, NULL), &ring.current);

  /* The same key twice. */
  b = a;
  ck_assert_int_eq(st_keyring_init(&ring, &a, &b, err, sizeof(err)), -EINVAL);
  ck_assert_err_has("same");

  /* Two different keys with one key id: draw until two collide (about 20
   * draws by the birthday bound; 257 at most by pigeonhole). */
  st_cluster_key_t by_id[256];
  int have[256] = {0};
  int tries = 0;
  for (;;) {
    ck_assert_int_le(++tries, 257);
    st_cluster_key_t k;
    ck_assert_int_eq(st_cluster_key_generate(&k), 0);
    if (have[k.id]) {
      a = by_id[k.id];
      b = k;
      break;
    }
    have[k.id] = 1;
    by_id[k.id] = k;
  }
  ck_assert_uint_eq(a.id, b.id);
  ck_assert_mem_ne(a.key, b.key, 32);
  ck_assert_int_eq(st_keyring_init(&ring, &a, &b, err, sizeof(err)), -EINVAL);
  ck_assert_err_has("share key id");

  /* Two keys with different ids: both found, distinct packet keys. */
  do
    ck_assert_int_eq(st_cluster_key_generate(&b), 0);
  while (b.id == a.id);
  ck_assert_int_eq(st_keyring_init(&ring, &a, &b, err, sizeof(err)), 0);
  ck_assert(ring.has_previous);
  int slot = -1;
  ck_assert_ptr_eq(st__keyring_find(&ring, b.id, &slot), &ring.previous);
  ck_assert_int_eq(slot, 1);
  ck_assert_mem_ne(ring.packet_key[0], ring.packet_key[1], 32);
  st_keyring_wipe(&ring);
}
END_TEST

/* Live rotation: install, use, remove, as `starling keys` runs them; each
 * refusal leaves the ring as it was, and the packet keys always follow the
 * keys (the same as a ring built afresh from the same pair). */
START_TEST(test_keyring_rotation) {
  st_cluster_key_t a, b, c, same_id;
  ck_assert_int_eq(st_cluster_key_generate(&a), 0);
  do
    ck_assert_int_eq(st_cluster_key_generate(&b), 0);
  while (b.id == a.id);
  do
    ck_assert_int_eq(st_cluster_key_generate(&c), 0);
  while (c.id == a.id || c.id == b.id);
  do
    ck_assert_int_eq(st_cluster_key_generate(&same_id), 0);
  while (same_id.id != a.id);
  st_keyring_t ring, fresh, before;
  ck_assert_int_eq(st_keyring_init(&ring, &a, NULL, err, sizeof(err)), 0);

  /* Nothing to use or remove yet; the key in use cannot go. */
  before = ring;
  ck_assert_int_eq(st_keyring_use(&ring, b.id, err, sizeof(err)), -ENOENT);
  ck_assert_err_has("install it first");
  ck_assert_int_eq(st_keyring_remove(&ring, b.id, err, sizeof(err)), -ENOENT);
  ck_assert_int_eq(st_keyring_remove(&ring, a.id, err, sizeof(err)), -EBUSY);
  ck_assert_err_has("use` another first");
  ck_assert_int_eq(st_keyring_install(&ring, &same_id, err, sizeof(err)),
                   -EINVAL);
  ck_assert_err_has("shares key id");
  ck_assert_mem_eq(&ring, &before, sizeof ring);
  ck_assert_int_eq(st_keyring_use(&ring, a.id, err, sizeof(err)), 0);
  ck_assert_int_eq(st_keyring_install(&ring, &a, err, sizeof(err)), 0);
  ck_assert_mem_eq(&ring, &before, sizeof ring);

  /* 1. install b: accepted, a still seals. Twice is fine; a third key is
   * refused while b is there. */
  ck_assert_int_eq(st_keyring_install(&ring, &b, err, sizeof(err)), 0);
  ck_assert_int_eq(st_keyring_install(&ring, &b, err, sizeof(err)), 0);
  ck_assert_int_eq(st_keyring_init(&fresh, &a, &b, err, sizeof(err)), 0);
  ck_assert_mem_eq(&ring, &fresh, sizeof ring);
  before = ring;
  ck_assert_int_eq(st_keyring_install(&ring, &c, err, sizeof(err)), -EEXIST);
  ck_assert_err_has("remove it first");
  ck_assert_mem_eq(&ring, &before, sizeof ring);

  /* 2. use b: b seals, a is accepted. */
  ck_assert_int_eq(st_keyring_use(&ring, b.id, err, sizeof(err)), 0);
  ck_assert_int_eq(st_keyring_init(&fresh, &b, &a, err, sizeof(err)), 0);
  ck_assert_mem_eq(&ring, &fresh, sizeof ring);
  ck_assert_ptr_eq(st__keyring_find(&ring, a.id, NULL), &ring.previous);

  /* 3. remove a: b alone. */
  ck_assert_int_eq(st_keyring_remove(&ring, a.id, err, sizeof(err)), 0);
  ck_assert(!ring.has_previous);
  ck_assert_ptr_null(st__keyring_find(&ring, a.id, NULL));
  ck_assert_int_eq(st_keyring_init(&fresh, &b, NULL, err, sizeof(err)), 0);
  ck_assert_mem_eq(&ring.current, &fresh.current, sizeof ring.current);
  ck_assert_mem_eq(ring.packet_key[0], fresh.packet_key[0], 32);
  st_keyring_wipe(&ring);
  st_keyring_wipe(&fresh);
}
END_TEST

/* ---- Allow-lists -----------------------------------------------------------
 */

START_TEST(test_allowlist_good) {
  st_identity_t ids[5];
  char pk[5][44];
  for (int i = 0; i < 5; i++) {
    ck_assert_int_eq(st_identity_generate(&ids[i]), 0);
    st_public_key_format(ids[i].public_key, pk[i]);
  }
  /* ids[4] is left out; the last line has no newline. */
  char text[2048];
  snprintf(text, sizeof(text),
           "# cluster alpha\n"
           "\n"
           "%s\n"
           "   %s  # node b, indented, with a comment\n"
           "\t\n"
           "%s\tgpu-box-3\r\n"
           "  # an indented comment\n"
           "%s # a duplicate of the first\r\n"
           "%s\r\n"
           "%s",
           pk[0], pk[1], pk[2], pk[0], pk[3], pk[3]);
  const char* p = path_in("allow.txt");
  put(p, text, strlen(text), 0644);
  st_allowlist_t* list = NULL;
  ck_assert_msg(st_allowlist_load(p, &list, err, sizeof(err)) == 0, "%s", err);
  ck_assert_uint_eq(st_allowlist_count(list), 4);
  for (int i = 0; i < 4; i++)
    ck_assert_msg(st_allowlist_contains(list, ids[i].public_key), "key %d", i);
  ck_assert(!st_allowlist_contains(list, ids[4].public_key));
  uint8_t near[32];
  memcpy(near, ids[0].public_key, 32);
  near[31] ^= 1;
  ck_assert(!st_allowlist_contains(list, near));
  st_allowlist_free(list);

  /* Comments only: a valid, empty list that admits no one. */
  const char* q = path_in("empty.txt");
  put(q, "# nobody yet\n\n", 14, 0644);
  ck_assert_int_eq(st_allowlist_load(q, &list, err, sizeof(err)), 0);
  ck_assert_uint_eq(st_allowlist_count(list), 0);
  ck_assert(!st_allowlist_contains(list, ids[0].public_key));
  st_allowlist_free(list);
  st_allowlist_free(NULL);
}
END_TEST

/* A larger list: every member found, no outsider. */
START_TEST(test_allowlist_many) {
  enum { N = 300 };
  static uint8_t keys[N][32];
  FILE* f = fopen(path_in("many.txt"), "w");
  ck_assert_ptr_nonnull(f);
  for (int i = 0; i < N; i++) {
    st_identity_t id;
    ck_assert_int_eq(st_identity_generate(&id), 0);
    memcpy(keys[i], id.public_key, 32);
    char pk[44];
    st_public_key_format(id.public_key, pk);
    fprintf(f, "%s node-%d\n", pk, i);
  }
  fclose(f);
  ck_assert_int_eq(chmod(path_in("many.txt"), 0644), 0); /* whatever umask */
  st_allowlist_t* list = NULL;
  ck_assert_int_eq(
      st_allowlist_load(path_in("many.txt"), &list, err, sizeof(err)), 0);
  ck_assert_uint_eq(st_allowlist_count(list), N);
  for (int i = 0; i < N; i++)
    ck_assert(st_allowlist_contains(list, keys[i]));
  for (int i = 0; i < 50; i++) {
    st_identity_t id;
    ck_assert_int_eq(st_identity_generate(&id), 0);
    ck_assert(!st_allowlist_contains(list, id.public_key));
  }
  st_allowlist_free(list);
}
END_TEST

START_TEST(test_allowlist_bad) {
  st_identity_t id;
  ck_assert_int_eq(st_identity_generate(&id), 0);
  char good[44];
  st_public_key_format(id.public_key, good);
  /* 32 bytes of 0xff: valid base64, not a curve point. */
  uint8_t ff[32];
  memset(ff, 0xff, sizeof(ff));
  char notpoint[64];
  b64(ff, 32, notpoint, sizeof(notpoint));
  char longline[1100];
  memset(longline, 'A', sizeof(longline) - 1);
  longline[sizeof(longline) - 1] = '\0';
  /* A cluster key pasted by mistake: same alphabet and length as a public
   * key. One that is not a curve point (about half are) fails the point
   * check; its base64 must not appear in the error. */
  st_cluster_key_t ck;
  do {
    ck_assert_int_eq(st_cluster_key_generate(&ck), 0);
  } while (crypto_core_ed25519_is_valid_point(ck.key));
  char secret[64], glued[128], comment[128];
  b64(ck.key, 32, secret, sizeof(secret));
  snprintf(glued, sizeof(glued), "starling-cluster-key-v1:%s", secret);
  snprintf(comment, sizeof(comment), "%s # pasted from cluster.key", secret);
  const struct {
    const char* bad_line; /* appears as line 3 */
    const char* phrase;
    const char* secret; /* must not appear in the error */
  } cases[] = {
      {"AAAA", "(4 characters, not shown) is not a public key", "AAAA"},
      {"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
       "(44 characters, not shown) is not a public key", "AAAAAAAA"},
      {"AAAAAAAAAAAAAAAAAAAAAA+AAAAAAAAAAAAAAAAAAAAAA", "is not a public key",
       "AAAAAAAA"},
      {"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", "is not a public key",
       "AAAAAAAA"},
      {notpoint, "(43 characters, not shown) is not a valid Ed25519", notpoint},
      {comment, "(43 characters, not shown) is not a valid Ed25519", secret},
      {glued, "secret key file", secret},
      {"starling-identity-v1 AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
       "secret key file", "AAAAAAAA"},
      {longline, "line too long", "AAAAAAAA"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char text[4096];
    snprintf(text, sizeof(text), "# header\n%s\n%s\n%s\n", good,
             cases[i].bad_line, good);
    const char* p = path_in("bad-allow.txt");
    unlink(p);
    put(p, text, strlen(text), 0644);
    st_allowlist_t* list = (st_allowlist_t*) 1;
    err[0] = '\0';
    ck_assert_int_eq(st_allowlist_load(p, &list, err, sizeof(err)), -EBADMSG);
    ck_assert_ptr_null(list);
    char where[1100];
    snprintf(where, sizeof(where), "%s:3: ", p);
    ck_assert_msg(strstr(err, where) == err, "case %zu: '%s'", i, err);
    ck_assert_msg(strstr(err, cases[i].phrase) != NULL,
                  "case %zu: '%s' lacks '%s'", i, err, cases[i].phrase);
    ck_assert_msg(strstr(err, cases[i].secret) == NULL,
                  "case %zu: '%s' quotes the file", i, err);
  }
  st_cluster_key_wipe(&ck);
  /* A NUL byte on line 2. */
  const char* p = path_in("nul-allow.txt");
  put(p, "# x\nAB\0CD\n", 10, 0644);
  st_allowlist_t* list = NULL;
  ck_assert_int_eq(st_allowlist_load(p, &list, err, sizeof(err)), -EBADMSG);
  ck_assert_err_has(":2: a NUL byte");

  /* A missing file. */
  const char* missing = path_in("no-such-allow.txt");
  ck_assert_int_eq(st_allowlist_load(missing, &list, err, sizeof(err)),
                   -ENOENT);
  ck_assert_ptr_null(list);
  ck_assert_err_has(missing);
}
END_TEST

/* Like sshd's StrictModes: an allow-list that group or others can write
 * is refused with the chmod that fixes it; readable is fine. */
START_TEST(test_allowlist_mode) {
  st_identity_t id;
  ck_assert_int_eq(st_identity_generate(&id), 0);
  char text[64];
  st_public_key_format(id.public_key, text);
  strcat(text, "\n");
  const char* p = path_in("allow-mode.txt");
  static const struct {
    mode_t mode;
    int rc;
  } cases[] = {
      {0644, 0},       {0600, 0},       {0444, 0},       {0604, 0},
      {0664, -EACCES}, {0646, -EACCES}, {0666, -EACCES}, {0620, -EACCES},
      {0602, -EACCES}, {0777, -EACCES},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    unlink(p);
    put(p, text, strlen(text), cases[i].mode);
    st_allowlist_t* list = (st_allowlist_t*) 1;
    err[0] = '\0';
    ck_assert_msg(st_allowlist_load(p, &list, err, sizeof(err)) == cases[i].rc,
                  "mode %04o: '%s'", (unsigned) cases[i].mode, err);
    if (cases[i].rc == 0) {
      ck_assert_uint_eq(st_allowlist_count(list), 1);
      st_allowlist_free(list);
      continue;
    }
    ck_assert_ptr_null(list);
    char fix[1100];
    snprintf(fix, sizeof(fix), "chmod go-w %s", p);
    ck_assert_err_has(fix);
    ck_assert_err_has("writable by group or others");
  }
}
END_TEST

static Suite* crypto_keys_suite(void) {
  Suite* s = suite_create("crypto_keys");
  TCase* tf = tcase_create("key files");
  tcase_add_checked_fixture(tf, setup, teardown);
  tcase_add_test(tf, test_identity_round_trip);
  tcase_add_test(tf, test_cluster_key_round_trip);
  tcase_add_test(tf, test_load_tolerated);
  tcase_add_test(tf, test_refuses_overwrite);
  tcase_add_test(tf, test_write_missing_directory);
  tcase_add_test(tf, test_write_failure_removes_file);
  tcase_add_test(tf, test_load_refuses_mode);
  tcase_add_test(tf, test_load_refuses_not_regular);
  tcase_add_test(tf, test_load_refuses_bad_files);
  tcase_add_test(tf, test_load_refuses_huge);
  suite_add_tcase(s, tf);
  TCase* tk = tcase_create("key ids");
  tcase_add_checked_fixture(tk, setup, teardown);
  tcase_add_test(tk, test_key_id);
  tcase_add_test(tk, test_keyring);
  tcase_add_test(tk, test_keyring_rotation);
  suite_add_tcase(s, tk);
  TCase* ta = tcase_create("allow-list");
  tcase_add_checked_fixture(ta, setup, teardown);
  tcase_add_test(ta, test_allowlist_good);
  tcase_add_test(ta, test_allowlist_many);
  tcase_add_test(ta, test_allowlist_bad);
  tcase_add_test(ta, test_allowlist_mode);
  tcase_set_timeout(ta, 60);
  suite_add_tcase(s, ta);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(crypto_keys_suite());
  srunner_run_all(sr, CK_ENV);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
