/* keyfile.c: the secret key files of a node, as crypto.h describes them: a
 * node identity ("starling-identity-v1 SEED") and the cluster key
 * ("starling-cluster-key-v1 KEY"), one line of text each, the 32 bytes in
 * base64 (URL-safe alphabet, no padding).
 *
 * The rules follow OpenSSH's handling of private keys: a key file is
 * created with O_EXCL and mode 0600, so that an old key is never
 * overwritten and a new one is never readable by others, even for an
 * instant; a key file that group or others can read or write is refused
 * with the chmod that fixes it; a symbolic link or anything but a regular
 * file is refused (O_NOFOLLOW, fstat) so that a key is read from where the
 * operator put it. Reads are bounded (KEYFILE_MAX_BYTES) so that a wrong
 * path to a large file fails fast. Error messages name the file and never
 * echo its contents, which might be someone's secret.
 *
 * Errors: -ENOENT and the other open(2) errors as they come; -ELOOP a
 * symbolic link; -EINVAL not a regular file; -EACCES a mode open to group
 * or others; -EMSGSIZE a file over KEYFILE_MAX_BYTES; -EBADMSG a malformed
 * file (header, base64, length, trailing text); -EEXIST on write, a path
 * that already exists. */
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crypto/crypto.h"
#include "crypto/crypto_internal.h"

#define IDENTITY_HEADER "starling-identity-v1"
#define CLUSTER_HEADER "starling-cluster-key-v1"
#define B64_VARIANT sodium_base64_VARIANT_URLSAFE_NO_PADDING

/* A well-formed key file is 65 (identity) or 68 (cluster key) bytes: the
 * header, a space, 43 characters of base64 and a newline. 256 leaves room
 * for stray whitespace (a CRLF, an editor's extra newline) and still reads
 * in one call; anything larger is the wrong file. */
#define KEYFILE_MAX_BYTES 256

typedef struct {
  const char* header; /* the first word of the file */
  const char* what;   /* "identity", "cluster key" in sentences */
  const char* a_what; /* ... with its article */
  const char* other;  /* the other kind's header */
  const char* mixup;  /* the sentence when the other kind is given */
} kind_t;

static const kind_t identity_kind = {
    IDENTITY_HEADER, "identity", "an identity", CLUSTER_HEADER,
    "a cluster key file was given where an identity was expected"};
static const kind_t cluster_kind = {
    CLUSTER_HEADER, "cluster key", "a cluster key", IDENTITY_HEADER,
    "an identity file was given where a cluster key was expected"};

/* ---- Writing
 * --------------------------------------------------------------------- */

static int write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    p += w;
    n -= (size_t) w;
  }
  return 0;
}

/* Best effort: makes the new directory entry durable. A failure here does
 * not undo a key that is already written and synced. */
static void sync_parent_dir(const char* path) {
  char dir[4096];
  const char* slash = strrchr(path, '/');
  if (slash == NULL) {
    strcpy(dir, ".");
  } else {
    size_t n = slash == path ? 1 : (size_t) (slash - path);
    if (n >= sizeof(dir))
      return;
    memcpy(dir, path, n);
    dir[n] = '\0';
  }
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    (void) fsync(fd);
    close(fd);
  }
}

static int write_key_file(const char* path, const kind_t* kind,
                          const uint8_t secret[ST_KEY_BYTES], char* err,
                          size_t err_len) {
  char b64[sodium_base64_ENCODED_LEN(ST_KEY_BYTES, B64_VARIANT)];
  char line[128];
  int rc = 0;
  int fd = -1;
  int created = 0;

  sodium_bin2base64(b64, sizeof(b64), secret, ST_KEY_BYTES, B64_VARIANT);
  int n = snprintf(line, sizeof(line), "%s %s\n", kind->header, b64);
  if (n < 0 || (size_t) n >= sizeof(line)) {
    rc = -EINVAL; /* cannot happen: the header and key are fixed sizes */
    goto out;
  }

  /* O_EXCL also refuses a symbolic link at path, dangling or not. */
  fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    rc = -errno;
    if (rc == -EEXIST)
      st_set_err(err, err_len,
                 "%s: already exists; refusing to overwrite a key "
                 "file (choose another path, or remove the old file "
                 "first if you really mean to replace that key)",
                 path);
    else
      st_set_err(err, err_len, "%s: cannot create the %s file: %s", path,
                 kind->what, strerror(-rc));
    goto out;
  }
  created = 1;
  /* The umask can only clear bits of 0600; make the mode exactly 0600 so
   * that the owner can always read the key back. */
  if (fchmod(fd, 0600) != 0 || (rc = write_all(fd, line, (size_t) n)) != 0 ||
      fsync(fd) != 0) {
    if (rc == 0)
      rc = -errno;
    st_set_err(err, err_len, "%s: cannot write the %s file: %s", path,
               kind->what, strerror(-rc));
    goto out;
  }
  int fd_closing = fd;
  fd = -1;
  if (close(fd_closing) != 0) {
    rc = -errno;
    st_set_err(err, err_len, "%s: cannot write the %s file: %s", path,
               kind->what, strerror(-rc));
    goto out;
  }
  sync_parent_dir(path);

out:
  if (fd >= 0)
    close(fd);
  if (rc != 0 && created)
    unlink(path);
  sodium_memzero(b64, sizeof(b64));
  sodium_memzero(line, sizeof(line));
  return rc;
}

int st_identity_write(const char* path, const st_identity_t* id, char* err,
                      size_t err_len) {
  /* The file holds the 32-byte seed; libsodium's secret key is the seed
   * followed by the public key. */
  return write_key_file(path, &identity_kind, id->secret_key, err, err_len);
}

int st_cluster_key_write(const char* path, const st_cluster_key_t* key,
                         char* err, size_t err_len) {
  return write_key_file(path, &cluster_kind, key->key, err, err_len);
}

/* ---- Loading
 * --------------------------------------------------------------------- */

static int is_space(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* Opens path, checks that it is a regular file, and reads it whole into
 * buf (cap bytes; the file must be smaller); *mode receives its mode. */
static int read_key_file(const char* path, const kind_t* kind, char* buf,
                         size_t cap, size_t* len, mode_t* mode, char* err,
                         size_t err_len) {
  int rc = 0;
  /* O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then
   * refuses it. It changes nothing for a regular file. */
  int fd =
      open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    rc = -errno;
    if (rc == -ELOOP)
      st_set_err(err, err_len,
                 "%s: is a symbolic link; give the path of the %s "
                 "file itself",
                 path, kind->what);
    else
      st_set_err(err, err_len, "%s: cannot open the %s file: %s", path,
                 kind->what, strerror(-rc));
    return rc;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    rc = -errno;
    st_set_err(err, err_len, "%s: cannot stat the %s file: %s", path,
               kind->what, strerror(-rc));
    goto out;
  }
  if (!S_ISREG(st.st_mode)) {
    rc = -EINVAL;
    st_set_err(err, err_len, "%s: is %s, not a %s file", path,
               S_ISDIR(st.st_mode) ? "a directory" : "not a regular file",
               kind->what);
    goto out;
  }
  size_t n = 0;
  while (n < cap) {
    ssize_t r = read(fd, buf + n, cap - n);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      rc = -errno;
      st_set_err(err, err_len, "%s: cannot read the %s file: %s", path,
                 kind->what, strerror(-rc));
      goto out;
    }
    if (r == 0)
      break;
    n += (size_t) r;
  }
  if (n == cap) {
    rc = -EMSGSIZE;
    st_set_err(err, err_len,
               "%s: too large to be a starling key file (over %zu "
               "bytes); is this the right path?",
               path, cap - 1);
    goto out;
  }
  *len = n;
  *mode = st.st_mode;
out:
  close(fd);
  return rc;
}

/* Checks that the first word of a key file (buf, len bytes) is the kind's
 * header, and sets *word_end to where it ends. 0 or -EBADMSG. */
static int check_header(const char* path, const kind_t* kind, const char* buf,
                        size_t len, size_t* word_end, char* err,
                        size_t err_len) {
  size_t i = 0;
  while (i < len && !is_space(buf[i]))
    i++;
  *word_end = i;
  size_t hlen = strlen(kind->header);
  size_t olen = strlen(kind->other);
  if (len == 0) {
    st_set_err(err, err_len,
               "%s: is empty; not a starling %s file (expected a "
               "first word '%s')",
               path, kind->what, kind->header);
    return -EBADMSG;
  }
  if (i != hlen || memcmp(buf, kind->header, hlen) != 0) {
    int other = i == olen && memcmp(buf, kind->other, olen) == 0;
    st_set_err(err, err_len,
               "%s: not a starling %s file (expected a first word "
               "'%s')%s%s",
               path, kind->what, kind->header, other ? "; " : "",
               other ? kind->mixup : "");
    return -EBADMSG;
  }
  return 0;
}

/* Finds the base64 token after the header (which ends at word_end):
 * [*start, *end) of buf. 0 or -EBADMSG. */
static int find_key_token(const char* path, const kind_t* kind, const char* buf,
                          size_t len, size_t word_end, size_t* start,
                          size_t* end, char* err, size_t err_len) {
  /* One or more blanks, then the base64 token. */
  size_t key_start = word_end;
  while (key_start < len && (buf[key_start] == ' ' || buf[key_start] == '\t'))
    key_start++;
  size_t key_end = key_start;
  while (key_end < len && !is_space(buf[key_end]))
    key_end++;
  if (key_end == key_start || key_start == word_end) {
    st_set_err(err, err_len,
               "%s: no key after the header '%s'; the file is "
               "damaged or truncated",
               path, kind->header);
    return -EBADMSG;
  }
  /* Then only whitespace: a newline, a CRLF, trailing blanks. */
  for (size_t j = key_end; j < len; j++) {
    if (!is_space(buf[j])) {
      st_set_err(err, err_len,
                 "%s: unexpected text after the key; a %s file holds "
                 "one line, '%s KEY'",
                 path, kind->what, kind->header);
      return -EBADMSG;
    }
  }
  *start = key_start;
  *end = key_end;
  return 0;
}

/* Loads the 32 secret bytes of a key file of the given kind. */
static int load_key_file(const char* path, const kind_t* kind,
                         uint8_t secret[ST_KEY_BYTES], char* err,
                         size_t err_len) {
  /* One byte over the limit, to tell "exactly at the limit" from "more". */
  char buf[KEYFILE_MAX_BYTES + 1];
  /* Room for any base64 token that fits in buf, to report its length. */
  uint8_t bin[KEYFILE_MAX_BYTES];
  size_t len = 0;
  size_t bin_len = 0;
  mode_t mode = 0;
  int rc =
      read_key_file(path, kind, buf, sizeof(buf), &len, &mode, err, err_len);
  if (rc != 0)
    goto out;

  /* The header: the first word, exactly. */
  size_t i = 0;
  rc = check_header(path, kind, buf, len, &i, err, err_len);
  if (rc != 0)
    goto out;

  /* The mode is checked after the header, so that a file that is no key
   * file at all (a wrong path) is not met with advice to chmod it. */
  if ((mode & 077) != 0) {
    rc = -EACCES;
    const char* how = (mode & 044)   ? "readable"
                      : (mode & 022) ? "writable"
                                     : "accessible";
    st_set_err(err, err_len,
               "%s: %s by group or others (mode %04o); %s file must "
               "be private to its owner; run: chmod 600 %s",
               path, how, (unsigned) (mode & 07777), kind->a_what, path);
    goto out;
  }
  size_t key_start = 0, key_end = 0;
  rc = find_key_token(path, kind, buf, len, i, &key_start, &key_end, err,
                      err_len);
  if (rc != 0)
    goto out;
  const char* end = NULL;
  if (sodium_base642bin(bin, sizeof(bin), buf + key_start, key_end - key_start,
                        NULL, &bin_len, &end, B64_VARIANT) != 0 ||
      end != buf + key_end) {
    rc = -EBADMSG;
    st_set_err(err, err_len,
               "%s: the key is not valid base64 (URL-safe alphabet, "
               "no padding); the file is damaged",
               path);
    goto out;
  }
  if (bin_len != ST_KEY_BYTES) {
    rc = -EBADMSG;
    st_set_err(err, err_len,
               "%s: the key is %zu bytes, expected %d; the file is "
               "damaged or truncated",
               path, bin_len, ST_KEY_BYTES);
    goto out;
  }
  memcpy(secret, bin, ST_KEY_BYTES);

out:
  sodium_memzero(buf, sizeof(buf));
  sodium_memzero(bin, sizeof(bin));
  return rc;
}

int st_identity_load(const char* path, st_identity_t* id, char* err,
                     size_t err_len) {
  uint8_t seed[ST_KEY_BYTES];
  int rc = load_key_file(path, &identity_kind, seed, err, err_len);
  if (rc != 0)
    goto out;
  rc = st__identity_from_seed(id, seed);
  if (rc != 0)
    st_set_err(err, err_len, "%s: cannot derive the key pair", path);
out:
  sodium_memzero(seed, sizeof(seed));
  return rc;
}

int st_cluster_key_load(const char* path, st_cluster_key_t* key, char* err,
                        size_t err_len) {
  uint8_t k[ST_KEY_BYTES];
  int rc = load_key_file(path, &cluster_kind, k, err, err_len);
  if (rc != 0)
    goto out;
  memcpy(key->key, k, ST_KEY_BYTES);
  st__cluster_key_set_id(key);
out:
  sodium_memzero(k, sizeof(k));
  return rc;
}
