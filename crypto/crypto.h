/* crypto.h: identities, the cluster key, sealed UDP packets, the TCP
 * handshake and encrypted streams. libsodium only, and only inside crypto/
 * (STYLE.md rule 6): nothing here exposes a libsodium type.
 *
 * What each piece promises (docs/security.md has the threat model):
 *
 * - Identity: an Ed25519 key pair per node; the node id is the BLAKE2b-128
 *   hash of the public key (keyed by nothing, personalized "starling-nodeid"),
 *   so an id cannot be claimed without the key it names.
 * - Cluster key: 32 random bytes every member holds. Its key id is one byte
 *   derived from the key, carried in every packet and handshake so that the
 *   receiver picks the key without trial decryption. A keyring holds the
 *   current key (seals and opens) and optionally the previous one (opens
 *   only) for a rotation.
 * - UDP packets (crypto/packet.c): XChaCha20-Poly1305 under a subkey of the
 *   cluster key (crypto_kdf), a random 24-byte nonce, and as associated
 *   data the header before the nonce followed by the receiver's node id:
 *
 *     offset size field
 *          0    1 protocol version (ST_PACKET_VERSION)
 *          1    1 key id
 *          2    1 receiver kind (st_packet_to_t)
 *          3   16 sender node id
 *         19    8 sender boot epoch, little-endian
 *         27    8 per-boot packet counter, little-endian
 *         35   32 sender's Ed25519 public key
 *         67   24 nonce
 *         91    n ciphertext: plaintext + 16-byte tag
 *     91 + n   64 sender's Ed25519 signature of all the above + receiver id
 *
 *   at most ST_PACKET_MAX_BYTES on the wire. The receiver's id is not
 *   sent: the receiver uses its own (or 16 zero bytes for the kind
 *   ST_PACKET_TO_UNKNOWN), so a packet sent to one node fails
 *   authentication at any other. The sender id must be its key's, and the
 *   signature proves the key: a cluster-key holder cannot send in another
 *   member's name. A per-sender sliding window over (boot
 *   epoch, counter), RFC 6479 style, drops replays and packets from an
 *   older boot epoch; it advances only after authentication.
 * - TCP handshake (crypto/handshake.c): three messages, fresh ephemeral
 *   X25519 keys per connection, each side signing the transcript with its
 *   identity key, the cluster key mixed into the key derivation (Noise XX
 *   with a pre-shared key, in spirit). The peer's key is checked against the
 *   allow-list when one is given. Then one secretstream per direction.
 * - Streams (crypto/stream.c): crypto_secretstream_xchacha20poly1305, one
 *   message per frame; a frame is a 4-byte big-endian length and the
 *   ciphertext. A length over the configured maximum is refused from the
 *   4 length bytes alone, before anything is read or allocated.
 *
 * Every rejection is counted in an st_crypto_counters_t under a named
 * reason (st_crypto_drop_name) so that `starling status` can show it.
 *
 * Errors: 0 or a negative errno. -EBADMSG: malformed or failed
 * authentication; -EACCES: a valid peer that the allow-list refuses;
 * -ENOKEY: unknown key id; -EALREADY: a replay; -ESTALE: an old boot epoch;
 * -EMSGSIZE: over a size limit; -ENOSPC: a new sender while the replay
 * table is full; -ELOOP: the handshake peer is this node itself;
 * -EOVERFLOW: a packet counter at its maximum; -EINVAL: bad arguments;
 * -EPROTO: a call out of protocol order. Functions that take (err, err_len)
 * also write one sentence naming the bad input and what to do.
 */
#ifndef STARLING_CRYPTO_H
#define STARLING_CRYPTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ST_KEY_BYTES 32
#define ST_PUBLIC_KEY_BYTES 32
#define ST_SIGNATURE_BYTES 64
#define ST_NODE_ID_BYTES 16

/* Initializes libsodium; call once before anything else here (idempotent,
 * thread-safe). Returns -EIO when the library cannot start. */
int st_crypto_init(void);

/* ==== Counters =============================================================
 */

typedef enum {
  /* UDP packets */
  ST_DROP_PACKET_SHORT = 0,    /* shorter than header + tag */
  ST_DROP_PACKET_LONG,         /* over ST_PACKET_MAX_BYTES */
  ST_DROP_PACKET_VERSION,      /* unknown protocol version or receiver
                                  kind */
  ST_DROP_PACKET_KEY_ID,       /* no key with that id in the keyring */
  ST_DROP_PACKET_AUTH,         /* failed authentication (altered, forged,
                                  or sealed with another cluster key) */
  ST_DROP_PACKET_REPLAY,       /* counter already seen or below the window */
  ST_DROP_PACKET_OLD_EPOCH,    /* boot epoch older than one already seen */
  ST_DROP_PACKET_SENDERS_FULL, /* replay table full: sender not tracked */
  ST_DROP_PACKET_SIGNATURE,    /* the sender's signature does not verify, or
                                  the sender id is not its key's */
  ST_DROP_PACKET_NOT_ALLOWED,  /* signed by a key not on the allow-list */
  /* TCP handshake */
  ST_DROP_HS_MALFORMED,   /* wrong version, sizes, or order */
  ST_DROP_HS_KEY_ID,      /* unknown cluster key id */
  ST_DROP_HS_MAC,         /* HS1's mac1 is not the cluster key's */
  ST_DROP_HS_AUTH,        /* decryption failed (e.g. wrong cluster key) */
  ST_DROP_HS_SIGNATURE,   /* transcript signature invalid */
  ST_DROP_HS_NOT_ALLOWED, /* peer key not on the allow-list */
  ST_DROP_HS_SELF,        /* peer presented our own identity */
  /* Streams */
  ST_DROP_FRAME_TOO_LARGE,    /* declared length over the maximum */
  ST_DROP_STREAM_AUTH,        /* altered, reordered or duplicated frame */
  ST_DROP_STREAM_TRUNCATED,   /* stream ended without its final frame */
  ST_DROP_STREAM_AFTER_FINAL, /* data after the final frame */
  ST_CRYPTO_DROP_COUNT
} st_crypto_drop_t;

typedef struct {
  uint64_t drops[ST_CRYPTO_DROP_COUNT];
} st_crypto_counters_t;

/* The counter's name in `starling status --json`, e.g. "packet_auth". */
const char* st_crypto_drop_name(st_crypto_drop_t reason);

/* ==== Identities ============================================================
 */

typedef struct {
  uint8_t b[ST_NODE_ID_BYTES];
} st_node_id_t;

typedef struct {
  uint8_t public_key[ST_PUBLIC_KEY_BYTES]; /* Ed25519 */
  uint8_t secret_key[64];                  /* Ed25519, libsodium layout */
  st_node_id_t id;
} st_identity_t;

void st_node_id_from_public_key(const uint8_t pk[ST_PUBLIC_KEY_BYTES],
                                st_node_id_t* id);
/* Lower-case hex, 32 characters; buf needs 33 bytes. */
void st_node_id_format(const st_node_id_t* id, char buf[33]);
/* -1, 0, 1 by bytes; the order "smallest id" refers to. */
int st_node_id_compare(const st_node_id_t* a, const st_node_id_t* b);

/* Base64 (URL-safe alphabet, no padding) of a public key, as written in
 * allow-lists and printed by `starling keygen`; buf needs 44 bytes. */
void st_public_key_format(const uint8_t pk[ST_PUBLIC_KEY_BYTES], char buf[44]);

int st_identity_generate(st_identity_t* id);
/* Wipes the secret key. */
void st_identity_wipe(st_identity_t* id);

/* Ed25519 detached signatures with an identity's key, for claims that
 * travel beyond the packet that carries them (membership's signed ALIVE,
 * STATUS and leave: docs/protocol.md). st_identity_sign writes the
 * signature of msg[0..len) to sig; st_identity_verify is true only when
 * sig is pk's signature of exactly msg[0..len). */
void st_identity_sign(const st_identity_t* id, const uint8_t* msg, size_t len,
                      uint8_t sig[ST_SIGNATURE_BYTES]);
bool st_identity_verify(const uint8_t pk[ST_PUBLIC_KEY_BYTES],
                        const uint8_t* msg, size_t len,
                        const uint8_t sig[ST_SIGNATURE_BYTES]);

/* Key files are text: one line "starling-identity-v1 BASE64" (the 32-byte
 * Ed25519 seed) or "starling-cluster-key-v1 BASE64" (the 32-byte key),
 * base64 URL-safe without padding. They are created with mode 0600 and
 * never overwritten (O_EXCL). Loading refuses, with a sentence saying how
 * to fix it: a file readable or writable by group or others ("chmod 600
 * FILE"), not a regular file, the wrong header, bad base64, the wrong
 * length. */
int st_identity_write(const char* path, const st_identity_t* id, char* err,
                      size_t err_len);
int st_identity_load(const char* path, st_identity_t* id, char* err,
                     size_t err_len);

/* ==== Cluster keys
 * ============================================================= */

typedef struct {
  uint8_t key[ST_KEY_BYTES];
  uint8_t id; /* first byte of BLAKE2b(key), personalized "starling-keyid" */
} st_cluster_key_t;

int st_cluster_key_generate(st_cluster_key_t* key);
/* The key whose 32 bytes are `bytes` (as a cluster request carries
 * them), with its id derived as every key's is. */
void st_cluster_key_from_bytes(st_cluster_key_t* key,
                               const uint8_t bytes[ST_KEY_BYTES]);
int st_cluster_key_write(const char* path, const st_cluster_key_t* key,
                         char* err, size_t err_len);
int st_cluster_key_load(const char* path, st_cluster_key_t* key, char* err,
                        size_t err_len);
void st_cluster_key_wipe(st_cluster_key_t* key);
/* Zeroes n bytes at p in a way the compiler keeps (secrets in buffers
 * that are not one of the types above). */
void st_crypto_wipe(void* p, size_t n);

/* The keys a node holds: it seals with `current` and opens with either. */
typedef struct {
  st_cluster_key_t current;
  st_cluster_key_t previous;
  bool has_previous;
  /* Subkeys derived with crypto_kdf: [0] current, [1] previous. */
  uint8_t packet_key[2][ST_KEY_BYTES];
} st_keyring_t;

/* previous may be NULL. Refuses two keys that share a key id (1 in 256:
 * generate another key) or that are equal. */
int st_keyring_init(st_keyring_t* ring, const st_cluster_key_t* current,
                    const st_cluster_key_t* previous, char* err,
                    size_t err_len);
void st_keyring_wipe(st_keyring_t* ring);

/* Live rotation (`starling keys`; docs/security.md, "Rotating the cluster
 * key"), in three steps on every node: install the new key (accepted, not
 * yet used to send), use it (it seals; the old one is still accepted),
 * remove the old one. Each returns 0 or a negative errno with one sentence
 * in err, and leaves the ring as it was on failure.
 *
 * install: key becomes the accepted (previous) key. 0 when it already is,
 * or is the current key; -EEXIST when another key holds that place (remove
 * it first); -EINVAL when it shares the current key's id (generate
 * another). */
int st_keyring_install(st_keyring_t* ring, const st_cluster_key_t* key,
                       char* err, size_t err_len);
/* Whether the ring holds key (sending or accepted), compared in constant
 * time. */
bool st_keyring_holds(const st_keyring_t* ring, const st_cluster_key_t* key);
/* use: the key of this id seals from now on, the other is still
 * accepted. 0 when it already seals; -ENOENT when the ring holds no key
 * of that id. */
int st_keyring_use(st_keyring_t* ring, uint8_t key_id, char* err,
                   size_t err_len);
/* remove: forgets the accepted key of this id. -EBUSY for the key that
 * seals (use another first), -ENOENT when the ring holds none of that
 * id. */
int st_keyring_remove(st_keyring_t* ring, uint8_t key_id, char* err,
                      size_t err_len);

/* ==== Allow-list
 * =============================================================== */

typedef struct st_allowlist_s st_allowlist_t;

/* A text file: one public key per line (as st_public_key_format writes
 * it), optionally followed by whitespace and a comment; '#' starts a
 * comment line; blank lines are skipped. Refuses a malformed line
 * (-EBADMSG), naming the file, line and the bad token's length but never
 * the token (it may be a pasted secret), and a file that group or others
 * can write (-EACCES, "chmod go-w FILE"), as sshd's StrictModes does. */
int st_allowlist_load(const char* path, st_allowlist_t** out, char* err,
                      size_t err_len);
bool st_allowlist_contains(const st_allowlist_t* list,
                           const uint8_t pk[ST_PUBLIC_KEY_BYTES]);
size_t st_allowlist_count(const st_allowlist_t* list);
void st_allowlist_free(st_allowlist_t* list);

/* ==== UDP packets
 * ================================================================ */

#define ST_PACKET_VERSION 3
#define ST_PACKET_MAX_BYTES 1400
#define ST_PACKET_HEADER_BYTES 91 /* version .. nonce */
#define ST_PACKET_TAG_BYTES 16
/* The sender's Ed25519 signature, after the tag (docs/protocol.md). */
#define ST_PACKET_SIGNATURE_BYTES ST_SIGNATURE_BYTES
#define ST_PACKET_OVERHEAD \
  (ST_PACKET_HEADER_BYTES + ST_PACKET_TAG_BYTES + ST_PACKET_SIGNATURE_BYTES)
#define ST_PACKET_MAX_PLAINTEXT (ST_PACKET_MAX_BYTES - ST_PACKET_OVERHEAD)

/* Whom a packet is addressed to: the receiver kind byte of the header,
 * which says which receiver id the associated data holds. */
typedef enum {
  /* The receiver's node id, known to the sender: the normal case. */
  ST_PACKET_TO_NODE = 0,
  /* 16 zero bytes: the sender does not know the receiver's id yet (the
   * first contact with a seed given only by its address). Any node with
   * the cluster key opens such a packet, so it is not bound to one
   * receiver and can be redirected to any member: the membership layer
   * must accept only join messages from it. */
  ST_PACKET_TO_UNKNOWN = 1,
} st_packet_to_t;

typedef struct {
  st_node_id_t sender; /* proven: the packet is signed by sender_key, and
                          sender is that key's node id */
  uint8_t sender_key[ST_PUBLIC_KEY_BYTES]; /* Ed25519, for an allow-list */
  uint64_t boot_epoch;
  uint64_t counter;
  uint8_t key_id;
  /* ST_PACKET_TO_NODE or ST_PACKET_TO_UNKNOWN; on the latter the caller
   * must refuse anything but a join message (see st_packet_to_t). */
  uint8_t to_kind;
} st_packet_header_t;

/* What a node needs to seal: its keyring and identity (both borrowed: the
 * identity's id is the sender id, its key signs every packet), boot epoch
 * and the next counter (starts at 0, incremented per sealed packet). */
typedef struct {
  const st_keyring_t* keys;
  const st_identity_t* identity;
  uint64_t boot_epoch;
  uint64_t counter;
} st_packet_sealer_t;

/* Seals len bytes (len <= ST_PACKET_MAX_PLAINTEXT) into out, which must
 * hold len + ST_PACKET_OVERHEAD bytes, for the receiver `to` (borrowed;
 * only the node with that id can open it); *out_len receives the packet
 * size. to == NULL seals for an unknown receiver (ST_PACKET_TO_UNKNOWN):
 * only for the first contact with a seed whose id is not known yet. An
 * all-zero *to is refused (-EINVAL): pass NULL to mean "unknown". */
int st_packet_seal(st_packet_sealer_t* s, const st_node_id_t* to,
                   const uint8_t* plain, size_t len, uint8_t* out,
                   size_t out_cap, size_t* out_len);

/* Per-sender replay windows, RFC 6479 style: for each sender the highest
 * (boot epoch, counter) accepted and a bitmap of the last
 * ST_REPLAY_WINDOW counters below it. Bounded: at most max_senders are
 * tracked; a packet from a further sender is dropped
 * (ST_DROP_PACKET_SENDERS_FULL) rather than evicting one, which would
 * reopen that sender's old packets to replay. */
#define ST_REPLAY_WINDOW 1024
typedef struct st_replay_table_s st_replay_table_t;
int st_replay_table_new(size_t max_senders, st_replay_table_t** out);
void st_replay_table_free(st_replay_table_t* t);
/* Forgets a sender (a member declared dead and gone). */
void st_replay_table_forget(st_replay_table_t* t, const st_node_id_t* sender);

/* Checks and opens a packet addressed to self (this node's id, borrowed):
 * size, version, key id, receiver kind, that the sender id is its public
 * key's, the replay window (checked before and updated only after
 * authentication), then decrypts into plain (cap >= len -
 * ST_PACKET_OVERHEAD) and verifies the sender's signature. A packet sealed
 * for another receiver fails authentication (ST_DROP_PACKET_AUTH); one
 * that names a sender whose key did not sign it, ST_DROP_PACKET_SIGNATURE
 * (a cluster-key holder cannot speak for another member). With allow
 * (may be NULL: any key), a packet signed by a key not on it is dropped
 * (ST_DROP_PACKET_NOT_ALLOWED, -EACCES) before its sender takes a place in
 * the replay table. On success fills *hdr and
 * *plain_len; hdr->to_kind == ST_PACKET_TO_UNKNOWN says the packet was not
 * bound to this node, and the caller must then accept only a join
 * message. On rejection increments the matching counter in c (may be
 * NULL) and returns the error; nothing is parsed before authentication
 * except the fixed header fields needed to pick the key and window. */
int st_packet_open(const st_keyring_t* keys, const st_node_id_t* self,
                   const st_allowlist_t* allow, st_replay_table_t* replay,
                   st_crypto_counters_t* c, const uint8_t* in, size_t len,
                   uint8_t* plain, size_t plain_cap, size_t* plain_len,
                   st_packet_header_t* hdr);

/* ==== TCP handshake
 * ================================================================ */

#define ST_HS_VERSION 1
/* The sealed payload of messages 2 and 3: the sender's Ed25519 public key
 * and its signature of the transcript, plus the AEAD tag. */
#define ST_HS_SEALED_BYTES (ST_PUBLIC_KEY_BYTES + ST_SIGNATURE_BYTES + 16)

/* Message 1, initiator -> responder: "-> e", and mac1: BLAKE2b-128 of
 * the first 34 bytes (version, key id, e) under a key derived from the
 * cluster key the key id names (WireGuard's mac1). The responder checks
 * it before any public-key work. */
#define ST_HS_MAC_BYTES 16
typedef struct {
  uint8_t version;
  uint8_t key_id;
  uint8_t ephemeral[32];
  uint8_t mac[ST_HS_MAC_BYTES];
} st_hs_msg1_t;

/* Message 2, responder -> initiator: "<- e, ee, psk, s, sig" */
typedef struct {
  uint8_t ephemeral[32];
  uint8_t sealed[ST_HS_SEALED_BYTES];
} st_hs_msg2_t;

/* Message 3, initiator -> responder: "-> s, sig" */
typedef struct {
  uint8_t sealed[ST_HS_SEALED_BYTES];
} st_hs_msg3_t;

typedef enum { ST_HS_INITIATOR = 0, ST_HS_RESPONDER = 1 } st_hs_role_t;

/* Handshake state. Holds secrets: always end with st_handshake_finish or
 * st_handshake_wipe. The fields are internal to crypto/handshake.c. */
typedef struct {
  int role;
  int step;
  uint8_t key_id;
  uint8_t e_secret[32];
  uint8_t e_public[32];
  uint8_t peer_e[32];
  uint8_t hash[64];  /* transcript hash h */
  uint8_t chain[32]; /* chaining key ck */
  uint8_t peer_pk[ST_PUBLIC_KEY_BYTES];
  const st_identity_t* self;
  const st_keyring_t* keys;
  const st_allowlist_t* allow;
  st_crypto_counters_t* counters;
} st_handshake_t;

/* Keys and peer of a completed handshake. Holds secrets: wipe with
 * st_session_wipe after initializing the streams. */
typedef struct {
  uint8_t tx_key[ST_KEY_BYTES];
  uint8_t rx_key[ST_KEY_BYTES];
  uint8_t peer_public_key[ST_PUBLIC_KEY_BYTES];
  st_node_id_t peer_id;
} st_session_t;

/* self, keys, allow (NULL: any key holder) and counters (may be NULL) are
 * borrowed until the handshake is finished or wiped. */
int st_handshake_init(st_handshake_t* hs, st_hs_role_t role,
                      const st_identity_t* self, const st_keyring_t* keys,
                      const st_allowlist_t* allow,
                      st_crypto_counters_t* counters);
/* The initiator writes 1 and 3 and reads 2; the responder reads 1 and 3
 * and writes 2. A call out of order returns -EPROTO. Any failure wipes the
 * state: the connection must be dropped. */
int st_handshake_write_msg1(st_handshake_t* hs, st_hs_msg1_t* out);
/* The mac1 of m (its first 34 bytes) under cluster key psk, into out: what
 * write_msg1 puts in m->mac and read_msg1 checks (for tests and tools
 * that build a message 1 themselves). */
void st_handshake_msg1_mac(const st_cluster_key_t* psk, const st_hs_msg1_t* m,
                           uint8_t out[ST_HS_MAC_BYTES]);
int st_handshake_read_msg1(st_handshake_t* hs, const st_hs_msg1_t* in);
int st_handshake_write_msg2(st_handshake_t* hs, st_hs_msg2_t* out);
int st_handshake_read_msg2(st_handshake_t* hs, const st_hs_msg2_t* in);
int st_handshake_write_msg3(st_handshake_t* hs, st_hs_msg3_t* out);
int st_handshake_read_msg3(st_handshake_t* hs, const st_hs_msg3_t* in);
/* After the last message: derives the session and wipes the state. */
int st_handshake_finish(st_handshake_t* hs, st_session_t* out);
void st_handshake_wipe(st_handshake_t* hs);
void st_session_wipe(st_session_t* s);

/* ==== Hashing =============================================================
 *
 * BLAKE2b-256, incremental, for verifying transferred tensors (state
 * transfer and averaging exchanges) and for model fingerprints. Not keyed:
 * integrity against corruption and bugs; the stream already authenticates.
 */

#define ST_HASH_BYTES 32

typedef struct {
  _Alignas(64) uint8_t state[384]; /* libsodium's blake2b state; internal */
} st_hash_t;

/* The incremental calls: init, any number of updates (len 0 is allowed,
 * data may then be NULL), final; out is BLAKE2b-256 of the bytes fed in
 * order, however they were split. final wipes the state; init it again to
 * reuse it. h may live anywhere an st_hash_t is aligned (64 bytes: a
 * malloc'd struct that holds one needs aligned_alloc). */
void st_hash_init(st_hash_t* h);
void st_hash_update(st_hash_t* h, const void* data, size_t len);
void st_hash_final(st_hash_t* h, uint8_t out[ST_HASH_BYTES]);

/* One call: out = BLAKE2b of data[0..len) with a digest of out_len bytes
 * (16..32; other lengths are a programmer error). The digest length is a
 * parameter of BLAKE2b, so a 16-byte result (a fingerprint) is BLAKE2b-128,
 * not the first 16 bytes of BLAKE2b-256; out_len 32 equals the incremental
 * calls' result. */
void st_hash_once(const void* data, size_t len, uint8_t* out, size_t out_len);

/* ==== Streams
 * ======================================================================= */

#define ST_STREAM_HEADER_BYTES 24 /* sent once, first, by each direction */
#define ST_STREAM_ABYTES 17       /* per-frame overhead of secretstream */
#define ST_FRAME_LENGTH_BYTES 4
/* Default cap on a frame's ciphertext: a 1 MiB tensor chunk plus room for
 * its msgpack envelope, plus the secretstream overhead. */
#define ST_FRAME_MAX_DEFAULT (1024u * 1024u + 1024u + ST_STREAM_ABYTES)

/* Opaque secretstream state (libsodium's, 52 bytes) plus bookkeeping; the
 * fields are internal to crypto/stream.c. A zeroed (wiped) stream is
 * refused by every call. */
typedef struct {
  _Alignas(16) uint8_t state[64];
  uint64_t frames; /* frames sealed or opened */
  int final_seen;  /* the final frame was sealed or opened */
  int direction;   /* 0 none (wiped), 1 sending, 2 receiving */
  int poisoned;    /* a frame failed: every later call fails */
} st_stream_t;

/* Sending side: initializes from the session's tx key and writes the
 * stream header to send first. */
int st_stream_tx_init(st_stream_t* s, const uint8_t key[ST_KEY_BYTES],
                      uint8_t header[ST_STREAM_HEADER_BYTES]);
/* Receiving side: from the rx key and the header the peer sent. */
int st_stream_rx_init(st_stream_t* s, const uint8_t key[ST_KEY_BYTES],
                      const uint8_t header[ST_STREAM_HEADER_BYTES]);

/* Seals one message into a frame: 4-byte big-endian ciphertext length,
 * then the ciphertext (len + ST_STREAM_ABYTES). final marks the last frame
 * of the stream. out must hold len + ST_STREAM_ABYTES + 4 bytes. */
int st_stream_seal_frame(st_stream_t* s, const uint8_t* msg, size_t len,
                         bool final, uint8_t* out, size_t out_cap,
                         size_t* out_len);

/* Reads a frame's length from its first 4 bytes and refuses (counting
 * ST_DROP_FRAME_TOO_LARGE) a length over max_frame or under
 * ST_STREAM_ABYTES, before the caller reads or allocates anything more. */
int st_frame_length(const uint8_t hdr[ST_FRAME_LENGTH_BYTES], size_t max_frame,
                    st_crypto_counters_t* c, size_t* ct_len);

/* Opens a frame's ciphertext (without the length prefix) into msg (cap >=
 * ct_len - ST_STREAM_ABYTES). A failure (altered, reordered, duplicated,
 * or after the final frame) is counted and poisons the stream: every later
 * call fails too. *final is set when this was the last frame. */
int st_stream_open_frame(st_stream_t* s, st_crypto_counters_t* c,
                         const uint8_t* ct, size_t ct_len, uint8_t* msg,
                         size_t msg_cap, size_t* msg_len, bool* final);

/* Called when the connection ends: -EBADMSG (and ST_DROP_STREAM_TRUNCATED
 * counted) unless the final frame was received. */
int st_stream_rx_end(st_stream_t* s, st_crypto_counters_t* c);

void st_stream_wipe(st_stream_t* s);

#ifdef __cplusplus
}
#endif

#endif /* STARLING_CRYPTO_H */
