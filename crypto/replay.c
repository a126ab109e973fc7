/* replay.c: per-sender replay windows for sealed UDP packets, following
 * RFC 6479 ("IPsec Anti-Replay Algorithm without Bit Shifting"), extended
 * with a boot epoch per sender: a sender that restarts starts counting
 * from 0 again under a larger epoch.
 *
 * For each sender the table keeps the highest (epoch, counter) accepted
 * and a ring of ST__REPLAY_BLOCKS 64-bit blocks. Counter c lives at bit
 * (c % 64) of block (c / 64) % ST__REPLAY_BLOCKS. The rules, in order:
 *
 *   epoch <  stored epoch                  -> -ESTALE (old boot)
 *   epoch >  stored epoch                  -> accept, fresh window
 *   counter > highest                      -> accept, slide the window
 *   highest - counter >= ST_REPLAY_WINDOW  -> -EALREADY (too old to know)
 *   bit of counter set                     -> -EALREADY (replay)
 *   otherwise                              -> accept, set the bit
 *
 * Sliding zeroes the blocks between the old highest block and the new one
 * (at most the whole ring) instead of shifting bits. The decision is split
 * into a pure check, made before the packet is authenticated, and an
 * update made after, so that forged packets can neither fill the table
 * nor move a window.
 *
 * The senders live in an open-addressing hash table (linear probing,
 * load <= 1/2, SipHash under a random per-table key; constants.h says
 * why) with backward-shift deletion (Knuth 6.4, Algorithm R), so that
 * forgetting a sender leaves no tombstones that would lengthen probes. */
#include <errno.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "crypto/constants.h"
#include "crypto/packet_internal.h"

typedef struct {
  st_node_id_t sender;
  uint64_t epoch;
  uint64_t highest;
  uint64_t blocks[ST__REPLAY_BLOCKS];
  size_t home; /* slot the hash of sender points to */
  bool used;
} entry_t;

struct st_replay_table_s {
  entry_t* slots;
  size_t mask; /* capacity - 1; capacity a power of two */
  size_t count;
  size_t max_senders;
  uint8_t hash_key[crypto_shorthash_KEYBYTES];
};

/* ---- The table ------------------------------------------------------------
 */

int st_replay_table_new(size_t max_senders, st_replay_table_t** out) {
  if (out == NULL)
    return -EINVAL;
  *out = NULL;
  if (max_senders == 0 || max_senders > ST__REPLAY_MAX_SENDERS)
    return -EINVAL;
  size_t cap = 8;
  while (cap < 2 * max_senders)
    cap *= 2;
  st_replay_table_t* t = calloc(1, sizeof(*t));
  if (t == NULL)
    return -ENOMEM;
  t->slots = calloc(cap, sizeof(*t->slots));
  if (t->slots == NULL) {
    free(t);
    return -ENOMEM;
  }
  t->mask = cap - 1;
  t->max_senders = max_senders;
  crypto_shorthash_keygen(t->hash_key);
  *out = t;
  return 0;
}

void st_replay_table_free(st_replay_table_t* t) {
  if (t == NULL)
    return;
  free(t->slots);
  sodium_memzero(t, sizeof(*t));
  free(t);
}

size_t st__replay_count(const st_replay_table_t* t) {
  return t->count;
}

static size_t home_slot(const st_replay_table_t* t, const st_node_id_t* id) {
  uint8_t h[crypto_shorthash_BYTES];
  crypto_shorthash(h, id->b, sizeof(id->b), t->hash_key);
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v |= (uint64_t) h[i] << (8 * i);
  return (size_t) v & t->mask;
}

/* The slot holding sender, or the empty slot where it would go; the load
 * factor <= 1/2 guarantees an empty slot ends every probe. */
static size_t find_slot(const st_replay_table_t* t, const st_node_id_t* id,
                        size_t home) {
  size_t i = home;
  while (t->slots[i].used &&
         memcmp(t->slots[i].sender.b, id->b, sizeof(id->b)) != 0)
    i = (i + 1) & t->mask;
  return i;
}

void st_replay_table_forget(st_replay_table_t* t, const st_node_id_t* sender) {
  if (t == NULL || sender == NULL)
    return;
  size_t i = find_slot(t, sender, home_slot(t, sender));
  if (!t->slots[i].used)
    return;
  /* Backward shift: walk the cluster after the hole; an entry whose home
   * is not cyclically in (hole, j] would become unreachable behind the
   * hole, so it moves into the hole, which moves to j. */
  size_t j = i;
  for (;;) {
    j = (j + 1) & t->mask;
    if (!t->slots[j].used)
      break;
    size_t k = t->slots[j].home;
    bool stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
    if (!stays) {
      t->slots[i] = t->slots[j];
      i = j;
    }
  }
  memset(&t->slots[i], 0, sizeof(t->slots[i]));
  t->count--;
}

/* ---- The window -------------------------------------------------------------
 */

static size_t block_of(uint64_t counter) {
  return (size_t) ((counter / ST__REPLAY_BLOCK_BITS) % ST__REPLAY_BLOCKS);
}

static uint64_t bit_of(uint64_t counter) {
  return (uint64_t) 1 << (counter % ST__REPLAY_BLOCK_BITS);
}

/* The decision for a tracked sender; see the rules at the top. */
static int decide(const entry_t* e, uint64_t epoch, uint64_t counter) {
  if (epoch < e->epoch)
    return -ESTALE;
  if (epoch > e->epoch || counter > e->highest)
    return 0;
  if (e->highest - counter >= ST_REPLAY_WINDOW)
    return -EALREADY;
  if (e->blocks[block_of(counter)] & bit_of(counter))
    return -EALREADY;
  return 0;
}

int st__replay_check(const st_replay_table_t* t, const st_node_id_t* sender,
                     uint64_t epoch, uint64_t counter) {
  const entry_t* e = &t->slots[find_slot(t, sender, home_slot(t, sender))];
  if (!e->used)
    return t->count < t->max_senders ? 0 : -ENOSPC;
  return decide(e, epoch, counter);
}

/* Restarts e's window at (epoch, counter). */
static void window_reset(entry_t* e, uint64_t epoch, uint64_t counter) {
  memset(e->blocks, 0, sizeof(e->blocks));
  e->epoch = epoch;
  e->highest = counter;
}

int st__replay_update(st_replay_table_t* t, const st_node_id_t* sender,
                      uint64_t epoch, uint64_t counter) {
  size_t home = home_slot(t, sender);
  entry_t* e = &t->slots[find_slot(t, sender, home)];
  if (!e->used) {
    if (t->count >= t->max_senders)
      return -ENOSPC;
    e->used = true;
    e->sender = *sender;
    e->home = home;
    t->count++;
    window_reset(e, epoch, counter);
  } else {
    int rc = decide(e, epoch, counter);
    if (rc != 0)
      return rc;
    if (epoch > e->epoch) {
      window_reset(e, epoch, counter);
    } else if (counter > e->highest) {
      /* Zero the blocks the window slides over: those after the highest
       * block up to the new one, at most the whole ring. */
      uint64_t old_block = e->highest / ST__REPLAY_BLOCK_BITS;
      uint64_t new_block = counter / ST__REPLAY_BLOCK_BITS;
      uint64_t n = new_block - old_block;
      if (n > ST__REPLAY_BLOCKS)
        n = ST__REPLAY_BLOCKS;
      for (uint64_t i = 1; i <= n; i++)
        e->blocks[(old_block + i) % ST__REPLAY_BLOCKS] = 0;
      e->highest = counter;
    }
  }
  e->blocks[block_of(counter)] |= bit_of(counter);
  return 0;
}
