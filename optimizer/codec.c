/* codec.c: compressed float32 vectors for averaging (issue #16): bf16,
 * int8 with a scale per chunk of 256 floats, and top-k sparsification,
 * each with error feedback (Seide et al. 2014, "1-bit SGD"; Stich et al.
 * 2018, "Sparsified SGD with memory"; the residual is CHOCO-Gossip's
 * compressed-difference memory, Koloskova et al. 2019). Sans-IO: bytes in,
 * floats out, on the calling thread.
 *
 * The byte layout is docs/protocol.md, "Compressed deltas
 * (optimizer/codec.c)"; the bounds are in optimizer.h. Every decoder
 * checks the whole message before it writes a float, so a refused message
 * leaves its output as it was.
 *
 * The loops work in blocks of BLOCK floats whose bytes are built in local
 * arrays and then copied to the message: the compiler then knows the
 * message bytes do not alias the floats, and vectorizes the rounding
 * (bf16, int8) and the checks. A residual is updated in place (resid ==
 * x), read and written through the one pointer.
 */
#include "optimizer/optimizer.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "codec.c writes the host's float bytes as little-endian float32"
#endif

#define BLOCK 256u
_Static_assert(ST_CODEC_INT8_CHUNK == BLOCK, "an int8 chunk is one block");

/* Absolute value bits at or above this are Inf or NaN. */
#define F32_INF_BITS 0x7f800000u
/* Adding then subtracting 1.5 * 2^23 rounds a float of magnitude below
 * 2^22 to the nearest integer, ties to even, in the default rounding mode
 * (no libm call, so the loop vectorizes on plain SSE2). */
#define ROUND_MAGIC_F32 12582912.0f
/* Floats top-k tests at once for any entry to keep (or to gather). */
#define GROUP 16u
/* Histogram bins of one level of the top-k radix select: 11 bits. */
#define TOPK_BINS 2048u

static const char* const kind_names[] = {"none", "bf16", "int8", "topk"};
static const char* const drop_names[ST_CODEC_DROP_COUNT] = {
    "codec_header", "codec_version", "codec_kind",  "codec_length",
    "codec_scale",  "codec_index",   "codec_value",
};

/* ---- Small helpers ------------------------------------------------------ */

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint32_t rd_u32(const uint8_t* p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

static uint64_t rd_u64(const uint8_t* p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

static size_t min_sz(size_t a, size_t b) {
  return a < b ? a : b;
}

static void put_header(uint8_t* p, st_codec_kind_t kind, uint32_t param,
                       uint64_t n) {
  p[0] = ST_CODEC_VERSION;
  p[1] = (uint8_t) kind;
  p[2] = p[3] = 0;
  memcpy(p + 4, &param, 4);
  memcpy(p + 8, &n, 8);
}

static int spec_ok(const st_codec_spec_t* s) {
  if (s == NULL || (unsigned) s->kind > ST_CODEC_TOPK)
    return 0;
  if (s->kind == ST_CODEC_TOPK)
    return s->topk_ppm >= 1 && s->topk_ppm <= ST_CODEC_PPM;
  return s->topk_ppm == 0;
}

static uint64_t max_floats(const st_codec_spec_t* s) {
  return s->kind == ST_CODEC_TOPK ? ST_CODEC_TOPK_MAX_FLOATS
                                  : ST_CODEC_MAX_FLOATS;
}

/* ---- Specs and names ---------------------------------------------------- */

static const char codec_usage[] =
    "use none, bf16, int8 or topk:FRACTION (FRACTION in (0, 1] with at most "
    "6 decimals, e.g. topk:0.01 to send the largest 1% of the entries)";

/* Parses a decimal in (0, 1] with at most 6 decimals into millionths. */
static int parse_ppm(const char* s, uint32_t* ppm) {
  uint64_t v;
  if (st_parse_millionths(s, ST_CODEC_PPM, &v) != 0 || v < 1)
    return -EINVAL;
  *ppm = (uint32_t) v;
  return 0;
}

int st_codec_parse(const char* text, st_codec_spec_t* spec, char* err,
                   size_t err_len) {
  if (text == NULL || spec == NULL) {
    st_set_err(err, err_len, "no compression given; %s", codec_usage);
    return -EINVAL;
  }
  for (int k = ST_CODEC_NONE; k < ST_CODEC_TOPK; k++) {
    if (strcmp(text, kind_names[k]) == 0) {
      spec->kind = (st_codec_kind_t) k;
      spec->topk_ppm = 0;
      return 0;
    }
  }
  uint32_t ppm = 0;
  if (strncmp(text, "topk:", 5) != 0) {
    st_set_err(err, err_len, "compression '%s' is unknown; %s", text,
               codec_usage);
    return -EINVAL;
  }
  if (parse_ppm(text + 5, &ppm) != 0) {
    st_set_err(err, err_len,
               "compression '%s': '%s' is not a fraction in (0, 1] with at "
               "most 6 decimals; %s",
               text, text + 5, codec_usage);
    return -EINVAL;
  }
  spec->kind = ST_CODEC_TOPK;
  spec->topk_ppm = ppm;
  return 0;
}

int st_codec_name(const st_codec_spec_t* spec, char* buf, size_t len) {
  if (!spec_ok(spec) || buf == NULL)
    return -EINVAL;
  char tmp[32];
  if (spec->kind != ST_CODEC_TOPK) {
    snprintf(tmp, sizeof(tmp), "%s", kind_names[spec->kind]);
  } else {
    memcpy(tmp, "topk:", 5);
    st_format_millionths(spec->topk_ppm, tmp + 5, sizeof(tmp) - 5);
  }
  if (strlen(tmp) + 1 > len)
    return -ENOSPC;
  memcpy(buf, tmp, strlen(tmp) + 1);
  return 0;
}

const char* st_codec_drop_name(st_codec_drop_t reason) {
  if ((unsigned) reason >= ST_CODEC_DROP_COUNT)
    return "codec_unknown";
  return drop_names[reason];
}

uint64_t st_codec_topk_k(const st_codec_spec_t* spec, uint64_t n) {
  if (n == 0 || !spec_ok(spec) || spec->kind != ST_CODEC_TOPK ||
      n > ST_CODEC_TOPK_MAX_FLOATS)
    return 0;
  /* ppm <= 10^6 and n < 2^32: the product stays below 2^52. */
  uint64_t k = (spec->topk_ppm * n + ST_CODEC_PPM / 2) / ST_CODEC_PPM;
  return k < 1 ? 1 : k;
}

size_t st_codec_encoded_bytes(const st_codec_spec_t* spec, uint64_t n) {
  if (!spec_ok(spec) || n > max_floats(spec))
    return 0;
  switch (spec->kind) {
    case ST_CODEC_NONE:
      return ST_CODEC_HEADER_BYTES + 4 * n;
    case ST_CODEC_BF16:
      return ST_CODEC_HEADER_BYTES + 2 * n;
    case ST_CODEC_INT8:
      return ST_CODEC_HEADER_BYTES + n +
             4 * ((n + ST_CODEC_INT8_CHUNK - 1) / ST_CODEC_INT8_CHUNK);
    case ST_CODEC_TOPK:
      return ST_CODEC_HEADER_BYTES + 8 * st_codec_topk_k(spec, n);
  }
  return 0;
}

/* ---- bf16 --------------------------------------------------------------- */

/* Round to nearest even on the bits; finite values that round past the
 * largest bfloat16 saturate to it. NaN and Inf are the caller's. */
static uint16_t bf16_round_finite(uint32_t u) {
  uint32_t h = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  if ((h & 0x7f80u) == 0x7f80u)
    h = ((u >> 16) & 0x8000u) | 0x7f7fu;
  return (uint16_t) h;
}

uint16_t st_codec_f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > F32_INF_BITS)
    return (uint16_t) ((u >> 16) | 0x0040u); /* a quiet NaN, sign kept */
  if ((u & 0x7fffffffu) == F32_INF_BITS)
    return (uint16_t) (u >> 16);
  return bf16_round_finite(u);
}

float st_codec_bf16_to_f32(uint16_t h) {
  return bits_f32((uint32_t) h << 16);
}

/* Encodes x[0..n) into body; with resid (== x, in place) also writes
 * x - decoded there. Returns nonzero when x held a NaN or Inf. */
static int encode_bf16(const float* x, size_t n, uint8_t* body, float* resid) {
  uint32_t bad = 0;
  for (size_t i0 = 0; i0 < n; i0 += BLOCK) {
    size_t m = min_sz(BLOCK, n - i0);
    uint16_t h[BLOCK];
    for (size_t j = 0; j < m; j++) {
      uint32_t u = f32_bits(x[i0 + j]);
      bad |= (u & 0x7fffffffu) >= F32_INF_BITS;
      h[j] = bf16_round_finite(u);
    }
    memcpy(body + 2 * i0, h, 2 * m);
    for (size_t j = 0; resid != NULL && j < m; j++)
      resid[i0 + j] -= bits_f32((uint32_t) h[j] << 16);
  }
  return bad != 0;
}

static int check_bf16(const uint8_t* body, size_t n) {
  uint32_t bad = 0;
  for (size_t i0 = 0; i0 < n; i0 += BLOCK) {
    size_t m = min_sz(BLOCK, n - i0);
    uint16_t h[BLOCK];
    memcpy(h, body + 2 * i0, 2 * m);
    for (size_t j = 0; j < m; j++)
      bad |= (h[j] & 0x7f80u) == 0x7f80u;
  }
  return bad != 0;
}

static void decode_bf16(const uint8_t* body, size_t n, float* out) {
  for (size_t i0 = 0; i0 < n; i0 += BLOCK) {
    size_t m = min_sz(BLOCK, n - i0);
    uint16_t h[BLOCK];
    uint32_t u[BLOCK];
    memcpy(h, body + 2 * i0, 2 * m);
    for (size_t j = 0; j < m; j++)
      u[j] = (uint32_t) h[j] << 16;
    memcpy(out + i0, u, 4 * m);
  }
}

/* ---- none (float32) ----------------------------------------------------- */

static int check_f32(const uint8_t* body, size_t n) {
  uint32_t bad = 0;
  for (size_t i0 = 0; i0 < n; i0 += BLOCK) {
    size_t m = min_sz(BLOCK, n - i0);
    uint32_t u[BLOCK];
    memcpy(u, body + 4 * i0, 4 * m);
    for (size_t j = 0; j < m; j++)
      bad |= (u[j] & 0x7fffffffu) >= F32_INF_BITS;
  }
  return bad != 0;
}

/* ---- int8 --------------------------------------------------------------- */

/* The scale of a chunk whose largest magnitude is m > 0: m / 127 rounded
 * to float32, one step up where that rounding (in the subnormals) left
 * m / scale above 127.5, one step down where 127 * scale would overflow.
 * Either way every |x| / scale <= 127.5, so |x - q * scale| <= scale / 2. */
static float int8_scale(float m) {
  float s = (float) ((double) m / 127.0);
  if ((double) s * 127.5 < (double) m)
    s = nextafterf(s, INFINITY);
  if ((double) s * 127.0 > (double) FLT_MAX)
    s = nextafterf(s, 0.0f);
  return s;
}

/* Quantizes one chunk v[0..m) with scale s > 0 into q. The quotient is
 * one correctly rounded float32 division (within 2^-24 |x / s|), so
 * |x - q s| <= s / 2 + 2^-24 |x|; the decoder's rounding of q * s adds at
 * most 2^-24 |q s| <= 2^-23 |x| (q != 0 means |x| >= s / 2): hence the
 * stated scale / 2 + 2^-22 |x|. */
static void int8_quantize(const float* v, size_t m, float s, int8_t* q) {
  for (size_t j = 0; j < m; j++) {
    float t = v[j] / s;
    t = (t + ROUND_MAGIC_F32) - ROUND_MAGIC_F32;
    t = t > 127.0f ? 127.0f : t;
    t = t < -127.0f ? -127.0f : t;
    q[j] = (int8_t) (int) t;
  }
}

/* Encodes x[0..n) into body (scales, then values); with resid (== x) also
 * writes x - decoded there. Returns nonzero when x held a NaN or Inf. */
static int encode_int8(const float* x, size_t n, uint8_t* body, float* resid) {
  size_t chunks = (n + BLOCK - 1) / BLOCK;
  uint8_t* qbody = body + 4 * chunks;
  uint32_t bad = 0;
  for (size_t c = 0; c < chunks; c++) {
    size_t i0 = c * BLOCK, m = min_sz(BLOCK, n - i0);
    float amax = 0.0f;
    uint32_t nonfinite = 0;
    int8_t q[BLOCK];
    for (size_t j = 0; j < m; j++) {
      float a = fabsf(x[i0 + j]);
      amax = a > amax ? a : amax;
      nonfinite |= !(a <= FLT_MAX); /* NaN compares false */
    }
    bad |= nonfinite;
    float s = amax == 0.0f || nonfinite ? 0.0f : int8_scale(amax);
    if (s == 0.0f)
      memset(q, 0, m);
    else
      int8_quantize(x + i0, m, s, q);
    memcpy(body + 4 * c, &s, 4);
    memcpy(qbody + i0, q, m);
    for (size_t j = 0; resid != NULL && j < m; j++)
      resid[i0 + j] -= (float) q[j] * s;
  }
  return bad != 0;
}

/* Checks the scales and values of an int8 body of n floats in chunks of
 * chunk: 0, or the drop reason + 1. */
static int check_int8(const uint8_t* body, size_t n, size_t chunk) {
  size_t chunks = (n + chunk - 1) / chunk;
  const uint8_t* qbody = body + 4 * chunks;
  for (size_t c = 0; c < chunks; c++) {
    uint32_t u = rd_u32(body + 4 * c);
    float s = bits_f32(u);
    if ((u & 0x80000000u) != 0 || (u & 0x7fffffffu) >= F32_INF_BITS ||
        (double) s * 127.0 > (double) FLT_MAX)
      return ST_CODEC_DROP_SCALE + 1;
    if (s != 0.0f)
      continue;
    size_t i0 = c * chunk, m = min_sz(chunk, n - i0);
    for (size_t j = 0; j < m; j++)
      if (qbody[i0 + j] != 0)
        return ST_CODEC_DROP_VALUE + 1; /* a zero chunk has no values */
  }
  if (n > 0 && memchr(qbody, 0x80, n) != NULL)
    return ST_CODEC_DROP_VALUE + 1; /* -128: outside [-127, 127] */
  return 0;
}

static void decode_int8(const uint8_t* body, size_t n, size_t chunk,
                        float* out) {
  size_t chunks = (n + chunk - 1) / chunk;
  const uint8_t* qbody = body + 4 * chunks;
  for (size_t c = 0; c < chunks; c++) {
    float s = bits_f32(rd_u32(body + 4 * c));
    size_t end = min_sz(n, (c + 1) * chunk);
    for (size_t i0 = c * chunk; i0 < end; i0 += BLOCK) {
      size_t m = min_sz(BLOCK, end - i0);
      int8_t q[BLOCK];
      float v[BLOCK];
      memcpy(q, qbody + i0, m);
      for (size_t j = 0; j < m; j++)
        v[j] = (float) q[j] * s;
      memcpy(out + i0, v, 4 * m);
    }
  }
}

/* ---- top-k -------------------------------------------------------------- */

/* The selection is a radix select on the magnitude bits (for finite
 * floats, |x| orders as its 31 low bits do), in three levels of 11, 11 and
 * 9 bits: a histogram of the top 11 bits finds the bin that holds the k-th
 * largest, a histogram of the next 11 bits among the keys of that bin
 * narrows it, and the last 9 bits give the k-th largest key T itself.
 * Every key above T is kept, and of the keys equal to T the first `ties`
 * by index. No sort and no allocation: the histograms are on the stack,
 * so a small vector (a ring segment) pays no more than its size.
 *
 * The keys of the first level's bin are gathered into the message's body
 * (8k bytes, free until the pairs are written) when they fit in it, which
 * they do unless many magnitudes are equal: then levels two and three
 * read those few keys, and x is read three times in all (count, gather,
 * write). Otherwise each level reads x again. */
typedef struct {
  uint32_t t;    /* the k-th largest magnitude's bits */
  uint64_t ties; /* entries equal to t to keep, lowest index first */
} topk_cut_t;

static uint32_t key_of(const float* x, size_t i) {
  return f32_bits(x[i]) & 0x7fffffffu;
}

/* Walks bins from the top until `above` plus the bin reaches k. */
static uint32_t walk_bins(const uint32_t* hist, uint32_t bins, uint64_t k,
                          uint64_t* above) {
  uint32_t b = bins - 1;
  while (b > 0 && *above + hist[b] < k)
    *above += hist[b--];
  return b;
}

/* The histogram of the top 11 bits of the keys of x[0..n): nonzero when x
 * held a NaN or Inf. Four histograms, one for each i % 4, summed at the
 * end: neighbouring values mostly fall in the same bin, and one histogram
 * would make each increment wait for the previous one's store. */
static int count_top(const float* x, size_t n, uint32_t* hist) {
  uint32_t h4[4][TOPK_BINS];
  memset(h4, 0, sizeof(h4));
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; j++)
      h4[j][key_of(x, i + j) >> 20]++;
  for (; i < n; i++)
    h4[0][key_of(x, i) >> 20]++;
  for (uint32_t b = 0; b < TOPK_BINS; b++)
    hist[b] = h4[0][b] + h4[1][b] + h4[2][b] + h4[3][b];
  for (uint32_t b = F32_INF_BITS >> 20; b < TOPK_BINS; b++)
    if (hist[b] != 0)
      return 1;
  return 0;
}

/* Copies the keys of x whose top 11 bits are b into keys (4-byte slots).
 * Returns how many. Most groups of GROUP floats hold none, which one test
 * that the compiler vectorizes finds. */
static size_t gather_bin(const float* x, size_t n, uint32_t b, uint8_t* keys) {
  size_t c = 0;
  for (size_t i0 = 0; i0 < n; i0 += GROUP) {
    size_t m = min_sz(GROUP, n - i0);
    uint32_t any = 0;
    for (size_t j = 0; j < m; j++)
      any |= (key_of(x, i0 + j) >> 20) == b;
    for (size_t j = 0; any != 0 && j < m; j++) {
      uint32_t key = key_of(x, i0 + j);
      if ((key >> 20) == b)
        memcpy(keys + 4 * c++, &key, 4);
    }
  }
  return c;
}

/* Levels two and three over the keys that share the top 11 bits `prefix`:
 * from the gathered keys when keys != NULL (m of them), else from x (m =
 * n). Returns T. */
static uint32_t refine(const float* x, const uint8_t* keys, size_t m,
                       uint32_t prefix, uint64_t k, uint64_t* above) {
  static const unsigned shift[2] = {9, 0}, top[2] = {20, 9};
  uint32_t hist[TOPK_BINS];
  for (int l = 0; l < 2; l++) {
    uint32_t bins = 1u << (top[l] - shift[l]), mask = bins - 1;
    memset(hist, 0, sizeof(hist));
    for (size_t i = 0; i < m; i++) {
      uint32_t key;
      if (keys != NULL)
        memcpy(&key, keys + 4 * i, 4);
      else
        key = key_of(x, i);
      if ((key >> top[l]) == prefix)
        hist[(key >> shift[l]) & mask]++;
    }
    prefix = prefix << (top[l] - shift[l]) | walk_bins(hist, bins, k, above);
  }
  return prefix;
}

/* Finds the cut of x[0..n) for k in [1, n], using body (8k bytes) as
 * scratch; nonzero when x held a NaN or Inf. */
static int topk_cut(const float* x, size_t n, uint64_t k, uint8_t* body,
                    topk_cut_t* cut) {
  uint32_t hist[TOPK_BINS];
  if (count_top(x, n, hist) != 0)
    return 1;
  uint64_t above = 0; /* keys known to be above T */
  uint32_t b = walk_bins(hist, TOPK_BINS, k, &above);
  if ((uint64_t) hist[b] <= 2 * k) {
    size_t m = gather_bin(x, n, b, body);
    cut->t = refine(x, body, m, b, k, &above);
  } else {
    cut->t = refine(x, NULL, n, b, k, &above);
  }
  cut->ties = k - above;
  return 0;
}

/* Writes the kept (index, value) pairs of x in index order; with resid
 * (== x) zeroes the kept entries there (they were sent exactly). Groups of
 * GROUP entries with none at or above the cut are skipped after one test
 * that the compiler vectorizes. */
static void topk_emit(const float* x, size_t n, topk_cut_t cut, uint8_t* body,
                      float* resid) {
  uint8_t* p = body;
  for (size_t i0 = 0; i0 < n; i0 += GROUP) {
    size_t m = min_sz(GROUP, n - i0);
    uint32_t any = 0;
    for (size_t j = 0; j < m; j++)
      any |= key_of(x, i0 + j) >= cut.t;
    for (size_t j = 0; any != 0 && j < m; j++) {
      uint32_t key = key_of(x, i0 + j), idx = (uint32_t) (i0 + j);
      if (key < cut.t || (key == cut.t && cut.ties == 0))
        continue; /* below the cut, or a tie beyond the k-th by index */
      cut.ties -= key == cut.t;
      memcpy(p, &idx, 4);
      memcpy(p + 4, &x[idx], 4);
      p += 8;
      if (resid != NULL)
        resid[idx] = 0.0f;
    }
  }
}

/* 0, or the drop reason + 1. */
static int check_topk(const uint8_t* body, uint64_t k, uint64_t n) {
  for (uint64_t j = 0; j < k; j++) {
    uint32_t idx = rd_u32(body + 8 * j);
    uint32_t v = rd_u32(body + 8 * j + 4);
    if (idx >= n || (j > 0 && idx <= rd_u32(body + 8 * (j - 1))))
      return ST_CODEC_DROP_INDEX + 1;
    if ((v & 0x7fffffffu) >= F32_INF_BITS)
      return ST_CODEC_DROP_VALUE + 1;
  }
  return 0;
}

static void decode_topk(const uint8_t* body, uint64_t k, size_t n, float* out) {
  memset(out, 0, n * sizeof(float));
  for (uint64_t j = 0; j < k; j++)
    out[rd_u32(body + 8 * j)] = bits_f32(rd_u32(body + 8 * j + 4));
}

/* ---- Encoding ------------------------------------------------------------ */

/* Encodes x into buf (of at least st_codec_encoded_bytes), leaving the
 * error in resid (== x) when it is not NULL. Nonzero when x held a NaN or
 * Inf. */
static int encode_into(const st_codec_spec_t* spec, const float* x, size_t n,
                       uint8_t* buf, float* resid) {
  uint8_t* body = buf + ST_CODEC_HEADER_BYTES;
  switch (spec->kind) {
    case ST_CODEC_NONE:
      put_header(buf, spec->kind, 0, n);
      if (n > 0)
        memcpy(body, x, 4 * n);
      if (resid != NULL && n > 0)
        memset(resid, 0, 4 * n);
      return check_f32(body, n);
    case ST_CODEC_BF16:
      put_header(buf, spec->kind, 0, n);
      return encode_bf16(x, n, body, resid);
    case ST_CODEC_INT8:
      put_header(buf, spec->kind, ST_CODEC_INT8_CHUNK, n);
      return encode_int8(x, n, body, resid);
    case ST_CODEC_TOPK: {
      uint64_t k = st_codec_topk_k(spec, n);
      put_header(buf, spec->kind, (uint32_t) k, n);
      topk_cut_t cut;
      if (n > 0 && topk_cut(x, n, k, body, &cut) != 0)
        return 1;
      if (n > 0)
        topk_emit(x, n, cut, body, resid);
      return 0;
    }
  }
  return 1;
}

/* Argument checks shared by both encoders: 0 or a negative errno. */
static int encode_check(const st_codec_spec_t* spec, const void* x, size_t n,
                        const uint8_t* buf, size_t cap, size_t* len) {
  if (!spec_ok(spec) || (x == NULL && n > 0) || buf == NULL || len == NULL)
    return -EINVAL;
  if (n > max_floats(spec))
    return -E2BIG;
  if (cap < st_codec_encoded_bytes(spec, n))
    return -EMSGSIZE;
  return 0;
}

int st_codec_encode(const st_codec_spec_t* spec, const float* x, size_t n,
                    uint8_t* buf, size_t cap, size_t* len) {
  int rc = encode_check(spec, x, n, buf, cap, len);
  if (rc != 0)
    return rc;
  if (encode_into(spec, x, n, buf, NULL) != 0)
    return -EINVAL;
  *len = st_codec_encoded_bytes(spec, n);
  return 0;
}

/* ---- Decoding ------------------------------------------------------------ */

/* Checks the header and the length: 0, or the drop reason + 1. *param
 * gets the chunk size (int8) or k (top-k). */
static int check_header(const st_codec_spec_t* spec, const uint8_t* buf,
                        size_t len, uint64_t n, uint64_t* param) {
  if (len < ST_CODEC_HEADER_BYTES)
    return ST_CODEC_DROP_HEADER + 1;
  if (buf[0] != ST_CODEC_VERSION)
    return ST_CODEC_DROP_VERSION + 1;
  if (buf[1] != (uint8_t) spec->kind)
    return ST_CODEC_DROP_KIND + 1;
  uint32_t p = rd_u32(buf + 4);
  if (buf[2] != 0 || buf[3] != 0)
    return ST_CODEC_DROP_HEADER + 1;
  if (rd_u64(buf + 8) != n || n > max_floats(spec))
    return ST_CODEC_DROP_LENGTH + 1;
  uint64_t want = 0;
  switch (spec->kind) {
    case ST_CODEC_NONE:
    case ST_CODEC_BF16:
      if (p != 0)
        return ST_CODEC_DROP_HEADER + 1;
      want = st_codec_encoded_bytes(spec, n);
      break;
    case ST_CODEC_INT8:
      if (p < 1 || p > ST_CODEC_INT8_MAX_CHUNK)
        return ST_CODEC_DROP_HEADER + 1;
      want = ST_CODEC_HEADER_BYTES + n + 4 * ((n + p - 1) / p);
      break;
    case ST_CODEC_TOPK:
      if (p != st_codec_topk_k(spec, n))
        return ST_CODEC_DROP_LENGTH + 1;
      want = ST_CODEC_HEADER_BYTES + 8 * (uint64_t) p;
      break;
  }
  if (len != want)
    return ST_CODEC_DROP_LENGTH + 1;
  *param = p;
  return 0;
}

int st_codec_decode(const st_codec_spec_t* spec, const uint8_t* buf, size_t len,
                    float* out, size_t n, st_codec_drop_t* reason) {
  if (!spec_ok(spec) || (buf == NULL && len > 0) || (out == NULL && n > 0))
    return -EINVAL;
  uint64_t param = 0;
  int bad = check_header(spec, buf, len, n, &param);
  const uint8_t* body = buf + ST_CODEC_HEADER_BYTES;
  if (bad == 0) {
    switch (spec->kind) {
      case ST_CODEC_NONE:
        bad = check_f32(body, n) ? ST_CODEC_DROP_VALUE + 1 : 0;
        break;
      case ST_CODEC_BF16:
        bad = check_bf16(body, n) ? ST_CODEC_DROP_VALUE + 1 : 0;
        break;
      case ST_CODEC_INT8:
        bad = check_int8(body, n, param);
        break;
      case ST_CODEC_TOPK:
        bad = check_topk(body, param, n);
        break;
    }
  }
  if (bad != 0) {
    st_codec_drop_t why = (st_codec_drop_t) (bad - 1);
    if (reason != NULL)
      *reason = why;
    return why == ST_CODEC_DROP_VERSION || why == ST_CODEC_DROP_KIND ? -EPROTO
                                                                     : -EBADMSG;
  }
  switch (spec->kind) {
    case ST_CODEC_NONE:
      if (n > 0)
        memcpy(out, body, 4 * n);
      break;
    case ST_CODEC_BF16:
      decode_bf16(body, n, out);
      break;
    case ST_CODEC_INT8:
      decode_int8(body, n, param, out);
      break;
    case ST_CODEC_TOPK:
      decode_topk(body, param, n, out);
      break;
  }
  return 0;
}

/* ---- Error feedback ----------------------------------------------------- */

int st_codec_ef_init(st_codec_ef_t* ef, const st_codec_spec_t* spec, size_t n) {
  memset(ef, 0, sizeof(*ef));
  if (!spec_ok(spec))
    return -EINVAL;
  if (n > max_floats(spec))
    return -E2BIG;
  ef->spec = *spec;
  ef->n = n;
  ef->residual = calloc(n > 0 ? n : 1, sizeof(float));
  return ef->residual != NULL ? 0 : -ENOMEM;
}

void st_codec_ef_close(st_codec_ef_t* ef) {
  free(ef->residual);
  ef->residual = NULL;
  ef->n = 0;
}

void st_codec_ef_reset(st_codec_ef_t* ef) {
  if (ef->n > 0)
    memset(ef->residual, 0, ef->n * sizeof(float));
}

/* r += x; nonzero when a sum is NaN or Inf. */
static int add_into(float* r, const float* x, size_t n) {
  uint32_t bad = 0;
  for (size_t i0 = 0; i0 < n; i0 += BLOCK) {
    size_t m = min_sz(BLOCK, n - i0);
    float a[BLOCK], b[BLOCK];
    uint32_t u[BLOCK];
    memcpy(a, r + i0, 4 * m);
    memcpy(b, x + i0, 4 * m);
    for (size_t j = 0; j < m; j++)
      a[j] += b[j];
    memcpy(u, a, 4 * m);
    for (size_t j = 0; j < m; j++)
      bad |= (u[j] & 0x7fffffffu) >= F32_INF_BITS;
    memcpy(r + i0, a, 4 * m);
  }
  return bad != 0;
}

int st_codec_ef_encode(st_codec_ef_t* ef, const float* x, uint8_t* buf,
                       size_t cap, size_t* len) {
  int rc = encode_check(&ef->spec, x, ef->n, buf, cap, len);
  if (rc != 0)
    return rc;
  if (add_into(ef->residual, x, ef->n) != 0) {
    st_codec_ef_reset(ef);
    return -EINVAL;
  }
  /* y = x + r is finite: no encoder can fail now. */
  encode_into(&ef->spec, ef->residual, ef->n, buf, ef->residual);
  *len = st_codec_encoded_bytes(&ef->spec, ef->n);
  return 0;
}
