/* wire_scan.c: the pre-validator of the wire codec. It walks the raw bytes
 * of a received message (the msgpack format spec,
 * github.com/msgpack/msgpack/blob/master/spec.md) without allocating, and
 * checks every declared length and count against the bytes that remain,
 * at every nesting level, before gossip/wire.c hands the bytes to
 * msgpack-c. msgpack-c sizes its allocations from declared counts (an
 * array32 header of five bytes may ask for 4 billion objects of 24 bytes);
 * after this walk, no count it sees exceeds ST__WIRE_MAX_ELEMENTS (but for
 * a push-pull's entries, at most ST_WIRE_PUSH_PULL_MAX_ENTRIES and no more
 * than the bytes left hold at the smallest entry, and a ring formation's
 * members, at most ST_RING_FORM_MAX_MEMBERS) and no length exceeds
 * the buffer. No msgpack-c call lives here; nor in the check of an
 * exchange's model description, the other raw-byte check kept here. */
#include "gossip/wire_internal.h"

#include <errno.h>

static uint64_t be(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++)
    v = v << 8 | p[i];
  return v;
}

/* ==== One header ============================================================
 */

/* The kind of a type byte from 0xc0 to 0xdf (those whose header has bytes
 * after the type byte), and how many bytes follow it in the header. */
static int head_kind_typed(uint8_t b, st__wire_head_t* h, size_t* extra) {
  switch (b) {
    case 0xc0:
      h->kind = ST__WK_NIL;
      break;
    case 0xc2:
    case 0xc3:
      h->kind = ST__WK_BOOL;
      break;
    case 0xc4: /* bin 8, 16, 32 */
    case 0xc5:
    case 0xc6:
      h->kind = ST__WK_BIN;
      *extra = (size_t) 1 << (b - 0xc4);
      break;
    case 0xc7: /* ext 8, 16, 32: length, then the ext type byte */
    case 0xc8:
    case 0xc9:
      h->kind = ST__WK_EXT;
      *extra = ((size_t) 1 << (b - 0xc7)) + 1;
      break;
    case 0xca:
    case 0xcb:
      h->kind = ST__WK_FLOAT;
      *extra = b == 0xca ? 4 : 8;
      break;
    case 0xcc: /* uint 8, 16, 32, 64 */
    case 0xcd:
    case 0xce:
    case 0xcf:
      h->kind = ST__WK_UINT;
      *extra = (size_t) 1 << (b - 0xcc);
      break;
    case 0xd0: /* int 8, 16, 32, 64 */
    case 0xd1:
    case 0xd2:
    case 0xd3:
      *extra = (size_t) 1 << (b - 0xd0);
      break;
    case 0xd4: /* fixext 1, 2, 4, 8, 16: ext type byte, then the data */
    case 0xd5:
    case 0xd6:
    case 0xd7:
    case 0xd8:
      h->kind = ST__WK_EXT;
      *extra = 1 + ((size_t) 1 << (b - 0xd4));
      break;
    case 0xd9: /* str 8, 16, 32 */
    case 0xda:
    case 0xdb:
      h->kind = ST__WK_STR;
      *extra = (size_t) 1 << (b - 0xd9);
      break;
    case 0xdc: /* array 16, 32 */
    case 0xdd:
      h->kind = ST__WK_ARRAY;
      *extra = b == 0xdc ? 2 : 4;
      break;
    case 0xde: /* map 16, 32 */
    case 0xdf:
      h->kind = ST__WK_MAP;
      *extra = b == 0xde ? 2 : 4;
      break;
    default: /* 0xc1: never used */
      return -EBADMSG;
  }
  return 0;
}

/* The length, count or value a header holds after its type byte: q, the
 * extra bytes after it (checked to be there). */
static void head_fields(uint8_t b, const uint8_t* q, size_t extra,
                        st__wire_head_t* h) {
  switch (b) {
    case 0xc4:
    case 0xc5:
    case 0xc6:
    case 0xd9:
    case 0xda:
    case 0xdb:
    case 0xdc:
    case 0xdd:
    case 0xde:
    case 0xdf:
      h->n = be(q, extra);
      break;
    case 0xc7:
    case 0xc8:
    case 0xc9:
      h->n = be(q, extra - 1);
      break;
    case 0xcc:
    case 0xcd:
    case 0xce:
    case 0xcf:
      h->value = be(q, extra);
      break;
    case 0xd0:
    case 0xd1:
    case 0xd2:
    case 0xd3: {
      /* Negative exactly when the top bit of the first byte is set. */
      h->kind = (q[0] & 0x80) ? ST__WK_NINT : ST__WK_UINT;
      h->value = be(q, extra);
      break;
    }
    default:
      break;
  }
}

/* Sizes of the fixed-size values and of the length fields, by type byte. */
int st__wire_read_head(const uint8_t* p, size_t left, st__wire_head_t* h) {
  if (left == 0)
    return -EBADMSG;
  uint8_t b = p[0];
  size_t extra = 0; /* bytes after the type byte that the header holds */
  h->n = 0;
  h->value = 0;
  if (b <= 0x7f) {
    h->kind = ST__WK_UINT;
    h->value = b;
  } else if (b <= 0x8f) {
    h->kind = ST__WK_MAP;
    h->n = b & 0x0f;
  } else if (b <= 0x9f) {
    h->kind = ST__WK_ARRAY;
    h->n = b & 0x0f;
  } else if (b <= 0xbf) {
    h->kind = ST__WK_STR;
    h->n = b & 0x1f;
  } else if (b >= 0xe0) {
    h->kind = ST__WK_NINT;
  } else if (head_kind_typed(b, h, &extra) != 0) {
    return -EBADMSG; /* 0xc1: never used */
  }
  if (extra > left - 1)
    return -EBADMSG; /* cut short */
  h->head = 1 + extra;
  head_fields(b, p + 1, extra, h);
  return 0;
}

/* ==== The envelope ==========================================================
 */

int st__wire_peek_envelope(const uint8_t* buf, size_t len, uint64_t* type,
                           uint64_t* version) {
  st__wire_head_t h;
  size_t pos = 0;
  if (st__wire_read_head(buf, len, &h) != 0)
    return -EBADMSG;
  if (h.kind != ST__WK_ARRAY || h.n < 2)
    return -EBADMSG;
  pos += h.head;
  if (st__wire_read_head(buf + pos, len - pos, &h) != 0)
    return -EBADMSG;
  if (h.kind != ST__WK_UINT)
    return -EBADMSG;
  *type = h.value;
  pos += h.head;
  if (st__wire_read_head(buf + pos, len - pos, &h) != 0)
    return -EBADMSG;
  if (h.kind != ST__WK_UINT)
    return -EBADMSG;
  *version = h.value;
  return 0;
}

/* ==== The walk ==============================================================
 */

void st__wire_rules_for(uint64_t type, st__wire_rules_t* r) {
  r->max_depth = ST_WIRE_MAX_DEPTH;
  r->big_index = 0;
  r->big_max = 0;
  r->big_min_each = 1;
  if (type == ST_MSG_PUSH_PULL) {
    r->max_depth = ST__WIRE_PUSH_PULL_DEPTH;
    r->big_index = ST__WIRE_PUSH_PULL_ENTRIES_INDEX;
    r->big_max = ST_WIRE_PUSH_PULL_MAX_ENTRIES;
    r->big_min_each = ST__WIRE_PUSH_PULL_MIN_ENTRY_BYTES;
  } else if (type == ST_MSG_RING_PROPOSE || type == ST_MSG_RING_CONFIRM) {
    r->big_index = type == ST_MSG_RING_PROPOSE
                       ? ST__WIRE_RING_PROPOSE_MEMBERS_INDEX
                       : ST__WIRE_RING_CONFIRM_MEMBERS_INDEX;
    r->big_max = ST_RING_FORM_MAX_MEMBERS;
    r->big_min_each = ST__WIRE_RING_MEMBER_MIN_BYTES;
  }
}

/* Iterative: owed[d] is the number of objects still to read in the open
 * container at depth d + 1 (the top-level object is at depth 1), and
 * owed_total their sum; each of them needs one byte at least, so a new
 * container may only declare as many as the bytes left minus owed_total.
 * top_n is the top-level array's count, so that top_n - owed[0] tells
 * which of its elements is being read. */
int st__wire_scan(const uint8_t* buf, size_t len, const st__wire_rules_t* r,
                  size_t* used, st_wire_drop_t* why) {
  uint64_t owed[ST__WIRE_SCAN_DEPTH_MAX];
  size_t open = 0; /* containers open */
  uint64_t owed_total = 0;
  uint64_t top_n = 0;
  size_t pos = 0;
  if (r->max_depth > ST__WIRE_SCAN_DEPTH_MAX) {
    *why = ST_WIRE_DROP_LIMIT; /* a caller's error; refuse, do not overrun */
    return -EBADMSG;
  }
  do {
    st__wire_head_t h;
    if (st__wire_read_head(buf + pos, len - pos, &h) != 0) {
      *why = ST_WIRE_DROP_MALFORMED;
      return -EBADMSG;
    }
    pos += h.head;
    /* Which element of the top-level array this is (only meaningful when
     * open == 1), read before it is counted as read. */
    uint64_t index = open > 0 ? top_n - owed[0] : 0;
    /* This object is one of those owed by the innermost open container. */
    if (open > 0) {
      owed[open - 1]--;
      owed_total--;
    }
    if (h.kind == ST__WK_STR || h.kind == ST__WK_BIN || h.kind == ST__WK_EXT) {
      if (h.n > len - pos) {
        *why = ST_WIRE_DROP_LIMIT;
        return -EBADMSG;
      }
      pos += (size_t) h.n;
    }
    /* The objects still owed must fit in what is left; a large fixed-size
     * value can leave fewer bytes than an earlier count promised. */
    size_t left = len - pos;
    if (owed_total > left) {
      *why = ST_WIRE_DROP_MALFORMED; /* truncated */
      return -EBADMSG;
    }
    uint64_t children = 0;
    switch (h.kind) {
      case ST__WK_ARRAY:
      case ST__WK_MAP: {
        int big = h.kind == ST__WK_ARRAY && open == 1 && r->big_index != 0 &&
                  index == r->big_index;
        uint64_t max = big ? r->big_max : ST__WIRE_MAX_ELEMENTS;
        uint64_t each = big ? r->big_min_each : 1;
        if (h.n > max) {
          *why = ST_WIRE_DROP_LIMIT;
          return -EBADMSG;
        }
        children = h.kind == ST__WK_MAP ? 2 * h.n : h.n;
        /* children <= 6900 and each <= 129: no overflow. */
        if (children * each > left - owed_total) {
          *why = ST_WIRE_DROP_LIMIT;
          return -EBADMSG;
        }
        break;
      }
      default:
        break;
    }
    if (children > 0) {
      /* The children sit at depth open + 2. */
      if (open + 2 > r->max_depth) {
        *why = ST_WIRE_DROP_LIMIT;
        return -EBADMSG;
      }
      if (open == 0)
        top_n = children;
      owed[open++] = children;
      owed_total += children;
    }
    while (open > 0 && owed[open - 1] == 0)
      open--;
  } while (open > 0);
  *used = pos;
  return 0;
}

/* ==== Model descriptions ====================================================
 */

/* Decodes the UTF-8 sequence at p[0..left) into *cp; returns its length,
 * or 0 when it is malformed (RFC 3629, section 4: the second byte's range
 * depends on the first, which rules out overlong forms, surrogates and
 * code points past U+10FFFF). */
static size_t utf8_next(const uint8_t* p, size_t left, uint32_t* cp) {
  uint8_t b = p[0];
  size_t len;
  uint8_t lo = 0x80, hi = 0xbf; /* the second byte's range */
  if (b < 0x80) {
    *cp = b;
    return 1;
  } else if (b >= 0xc2 && b <= 0xdf) {
    len = 2;
    *cp = b & 0x1f;
  } else if (b >= 0xe0 && b <= 0xef) {
    len = 3;
    *cp = b & 0x0f;
    if (b == 0xe0)
      lo = 0xa0; /* overlong */
    else if (b == 0xed)
      hi = 0x9f; /* surrogates */
  } else if (b >= 0xf0 && b <= 0xf4) {
    len = 4;
    *cp = b & 0x07;
    if (b == 0xf0)
      lo = 0x90; /* overlong */
    else if (b == 0xf4)
      hi = 0x8f; /* past U+10FFFF */
  } else {
    return 0; /* a continuation byte, 0xc0, 0xc1 or 0xf5.. */
  }
  if (len > left)
    return 0;
  for (size_t i = 1; i < len; i++) {
    uint8_t c = p[i];
    if (c < (i == 1 ? lo : 0x80) || c > (i == 1 ? hi : 0xbf))
      return 0;
    *cp = *cp << 6 | (c & 0x3f);
  }
  return len;
}

bool st__wire_model_ok(const char* s, size_t n) {
  const uint8_t* p = (const uint8_t*) s;
  size_t pos = 0;
  while (pos < n) {
    uint32_t cp;
    size_t k = utf8_next(p + pos, n - pos, &cp);
    if (k == 0)
      return false;
    if (cp < 0x20 || (cp >= 0x7f && cp <= 0x9f))
      return false; /* C0, DEL, C1 */
    if ((cp >= 0x2028 && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069))
      return false; /* separators, bidirectional controls */
    pos += k;
  }
  return true;
}
