/* allowlist.c: the optional list of node public keys a cluster accepts,
 * checked by the TCP handshake (crypto/handshake.c) after the peer has
 * proved it holds the key.
 *
 * The file is text in the spirit of OpenSSH's authorized_keys: one public
 * key per line as `starling keygen` prints it (43 characters of URL-safe
 * base64), optionally followed by whitespace and a free comment; a line
 * whose first non-blank character is '#' is a comment; blank lines are
 * skipped. A line that is not a key is refused with FILE:LINE, so that a
 * typo never silently shuts a node out (or, worse, reads as no list).
 * Duplicates are harmless and kept once. An empty list is allowed: it
 * admits no one, which the caller may report.
 *
 * An error never quotes the file: a bad token may be a secret pasted by
 * mistake (a cluster key is 43 characters of the same base64, like a
 * public key), and errors end up in logs. It names FILE:LINE and the
 * token's length. The list decides who may join, so, like sshd's
 * StrictModes for authorized_keys, a file that group or others can write
 * is refused ("chmod go-w FILE"); reading it is harmless (public keys).
 *
 * The keys are kept sorted, and looked up by binary search: a handshake
 * costs O(log n) comparisons of 32 bytes, nothing for any real cluster. */
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "crypto/crypto.h"
#include "crypto/crypto_internal.h"

/* A key line is 43 characters plus a comment; 1024 leaves room for a long
 * comment. A longer line is refused rather than split. */
#define ALLOW_LINE_MAX_BYTES 1024
/* A bound on the list so that a wrong path to a huge file fails instead of
 * allocating without limit: far above any cluster starling targets. */
#define ALLOW_MAX_KEYS (1u << 20)
#define PK_B64_CHARS 43 /* base64 of 32 bytes without padding */

struct st_allowlist_s {
  size_t count;
  uint8_t (*keys)[ST_PUBLIC_KEY_BYTES]; /* sorted, distinct */
};

static int key_cmp(const void* a, const void* b) {
  return memcmp(a, b, ST_PUBLIC_KEY_BYTES);
}

static int is_blank(int c) {
  return c == ' ' || c == '\t' || c == '\r';
}

/* The token starts with word (a key file's header, possibly glued to the
 * key by a ':' or '=' instead of a blank). */
static int token_starts_with(const char* tok, size_t tlen, const char* word) {
  size_t wlen = strlen(word);
  return tlen >= wlen && memcmp(tok, word, wlen) == 0;
}

/* Reads one line (without its '\n') into line. Returns 1 for a line, 0 at
 * the end of the file, or a negative errno: -EMSGSIZE for a line over the
 * limit, -EBADMSG for a NUL byte, -EIO for a read error. */
static int read_line(FILE* f, char line[ALLOW_LINE_MAX_BYTES], size_t* len) {
  size_t n = 0;
  int c;
  int any = 0;
  int rc = 1;
  while ((c = getc(f)) != EOF) {
    any = 1;
    if (c == '\n')
      break;
    if (c == '\0')
      rc = -EBADMSG;
    else if (n + 1 >= ALLOW_LINE_MAX_BYTES)
      rc = rc == 1 ? -EMSGSIZE : rc;
    else
      line[n++] = (char) c;
  }
  if (ferror(f))
    return -EIO;
  line[n] = '\0';
  *len = n;
  return any ? rc : 0;
}

/* Parses one line: 1 and the key in pk, 0 for a blank or comment line, or
 * -EBADMSG with a sentence (without the FILE:LINE prefix) in why. */
static int parse_line(char* line, size_t len, uint8_t pk[ST_PUBLIC_KEY_BYTES],
                      char* why, size_t why_len) {
  size_t i = 0;
  while (i < len && is_blank(line[i]))
    i++;
  if (i == len || line[i] == '#')
    return 0;
  size_t start = i;
  while (i < len && !is_blank(line[i]))
    i++;
  size_t tlen = i - start;
  const char* tok = line + start;
  /* A secret key file pasted here by mistake: say so. No message below
   * quotes the token: it may be a secret. */
  if (token_starts_with(tok, tlen, "starling-identity-v1") ||
      token_starts_with(tok, tlen, "starling-cluster-key-v1")) {
    snprintf(why, why_len,
             "this is a line of a secret key file, not a public key; "
             "put the public key that `starling keygen --show FILE` prints "
             "(and treat that secret key as leaked)");
    return -EBADMSG;
  }
  size_t bin_len = 0;
  const char* end = NULL;
  if (tlen != PK_B64_CHARS ||
      sodium_base642bin(pk, ST_PUBLIC_KEY_BYTES, tok, tlen, NULL, &bin_len,
                        &end, sodium_base64_VARIANT_URLSAFE_NO_PADDING) != 0 ||
      end != tok + tlen || bin_len != ST_PUBLIC_KEY_BYTES) {
    snprintf(why, why_len,
             "the first word (%zu characters, not shown) is not a public "
             "key (%d characters of URL-safe base64, as `starling keygen` "
             "prints it, then optionally a comment)",
             tlen, PK_B64_CHARS);
    return -EBADMSG;
  }
  /* About half of all 32-byte strings are not curve points: this catches
   * many typos that still decode. Every key crypto_sign makes passes. */
  if (!crypto_core_ed25519_is_valid_point(pk)) {
    snprintf(why, why_len,
             "the first word (%zu characters, not shown) is not a valid "
             "Ed25519 public key (a typo, or a secret key pasted by "
             "mistake?)",
             tlen);
    return -EBADMSG;
  }
  return 1;
}

/* Opens the allow-list and checks that only its owner may write it. */
static int open_allowlist(const char* path, FILE** out, char* err,
                          size_t err_len) {
  int rc = 0;
  FILE* f = fopen(path, "rb");
  if (f == NULL) {
    rc = -errno;
    st_set_err(err, err_len, "%s: cannot open the allow-list: %s", path,
               strerror(-rc));
    return rc;
  }
  struct stat st;
  if (fstat(fileno(f), &st) != 0) {
    rc = -errno;
    st_set_err(err, err_len, "%s: cannot stat the allow-list: %s", path,
               strerror(-rc));
    fclose(f);
    return rc;
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    st_set_err(err, err_len,
               "%s: writable by group or others (mode %04o); anyone "
               "who can write the allow-list decides who may join; "
               "run: chmod go-w %s",
               path, (unsigned) (st.st_mode & 07777), path);
    fclose(f);
    return -EACCES;
  }
  *out = f;
  return 0;
}

/* Appends pk to list, growing it (cap: its room, in keys) up to
 * ALLOW_MAX_KEYS. lineno: for the message. */
static int add_key(st_allowlist_t* list, size_t* cap,
                   const uint8_t pk[ST_PUBLIC_KEY_BYTES], const char* path,
                   size_t lineno, char* err, size_t err_len) {
  if (list->count == *cap) {
    if (*cap >= ALLOW_MAX_KEYS) {
      st_set_err(err, err_len,
                 "%s:%zu: more than %u keys; is this the right "
                 "file?",
                 path, lineno, ALLOW_MAX_KEYS);
      return -EMSGSIZE;
    }
    size_t ncap = *cap == 0 ? 16 : *cap * 2;
    void* p = realloc(list->keys, ncap * ST_PUBLIC_KEY_BYTES);
    if (p == NULL) {
      st_set_err(err, err_len, "%s: out of memory", path);
      return -ENOMEM;
    }
    list->keys = p;
    *cap = ncap;
  }
  memcpy(list->keys[list->count++], pk, ST_PUBLIC_KEY_BYTES);
  return 0;
}

/* Sort, then keep each key once. */
static void sort_unique(st_allowlist_t* list) {
  if (list->count == 0)
    return;
  qsort(list->keys, list->count, ST_PUBLIC_KEY_BYTES, key_cmp);
  size_t n = 1;
  for (size_t i = 1; i < list->count; i++)
    if (memcmp(list->keys[i], list->keys[n - 1], ST_PUBLIC_KEY_BYTES) != 0)
      memmove(list->keys[n++], list->keys[i], ST_PUBLIC_KEY_BYTES);
  list->count = n;
}

int st_allowlist_load(const char* path, st_allowlist_t** out, char* err,
                      size_t err_len) {
  char line[ALLOW_LINE_MAX_BYTES];
  char why[256];
  st_allowlist_t* list = NULL;
  size_t cap = 0;
  size_t lineno = 0;
  *out = NULL;

  FILE* f = NULL;
  int rc = open_allowlist(path, &f, err, err_len);
  if (rc != 0)
    return rc;
  list = calloc(1, sizeof(*list));
  if (list == NULL) {
    rc = -ENOMEM;
    st_set_err(err, err_len, "%s: out of memory", path);
    goto out;
  }
  for (;;) {
    size_t len = 0;
    uint8_t pk[ST_PUBLIC_KEY_BYTES];
    int r = read_line(f, line, &len);
    if (r == 0)
      break;
    lineno++;
    if (r == -EIO) {
      rc = -EIO;
      st_set_err(err, err_len, "%s:%zu: cannot read the allow-list", path,
                 lineno);
      goto out;
    }
    if (r < 0) {
      rc = -EBADMSG;
      st_set_err(err, err_len,
                 "%s:%zu: %s; an allow-list is text, one public key "
                 "per line",
                 path, lineno, r == -EMSGSIZE ? "line too long" : "a NUL byte");
      goto out;
    }
    r = parse_line(line, len, pk, why, sizeof(why));
    if (r < 0) {
      rc = r;
      st_set_err(err, err_len, "%s:%zu: %s", path, lineno, why);
      goto out;
    }
    if (r == 0)
      continue;
    rc = add_key(list, &cap, pk, path, lineno, err, err_len);
    if (rc != 0)
      goto out;
  }
  sort_unique(list);
  *out = list;
  list = NULL;

out:
  fclose(f);
  st_allowlist_free(list);
  return rc;
}

bool st_allowlist_contains(const st_allowlist_t* list,
                           const uint8_t pk[ST_PUBLIC_KEY_BYTES]) {
  if (list == NULL || list->count == 0)
    return false;
  return bsearch(pk, list->keys, list->count, ST_PUBLIC_KEY_BYTES, key_cmp) !=
         NULL;
}

size_t st_allowlist_count(const st_allowlist_t* list) {
  return list == NULL ? 0 : list->count;
}

void st_allowlist_free(st_allowlist_t* list) {
  if (list == NULL)
    return;
  free(list->keys);
  free(list);
}
