/* gen_fuzz_seeds.c: writes the seed corpora of the packet, stream and
 * handshake fuzz targets (tests/fuzz/corpus/TARGET/) from real protocol
 * runs with the targets' fixed keys (fuzz_common.h). The output is
 * committed; run this again only when a format changes:
 *
 *   build/gen_fuzz_seeds tests/fuzz/corpus
 *
 * (fuzz_wire_decode's corpus comes from its own suite, test_wire.c.) */
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>

#include "tests/fuzz/fuzz_common.h"

static const char* root;

static void put(const char* target, const char* name, const uint8_t* a,
                size_t a_len, const uint8_t* b, size_t b_len) {
  char dir[512], path[600];
  snprintf(dir, sizeof(dir), "%s/%s", root, target);
  mkdir(dir, 0755);
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE* f = fopen(path, "wb");
  if (f == NULL || fwrite(a, 1, a_len, f) != a_len ||
      (b_len && fwrite(b, 1, b_len, f) != b_len) || fclose(f) != 0) {
    perror(path);
    exit(1);
  }
}

/* A few messages of every kind that travels in packets and frames. */
static size_t sample_messages(uint8_t out[][2048], size_t* lens) {
  st_msg_t m[6];
  memset(m, 0, sizeof(m));
  m[0].type = ST_MSG_PING;
  m[0].u.ping.seq = 7;
  memset(m[0].u.ping.target.b, 0xab, ST_NODE_ID_BYTES);
  m[1].type = ST_MSG_ACK;
  m[1].u.ack.seq = 7;
  m[2].type = ST_MSG_ALIVE;
  m[2].u.alive.incarnation = 3;
  m[2].u.alive.addr = (st_wire_addr_t){4, {127, 0, 0, 1}, 7946};
  m[3].type = ST_MSG_SUSPECT;
  m[3].u.suspect.incarnation = 9;
  m[4].type = ST_MSG_STATUS;
  m[4].u.status.step = 1000;
  m[4].u.status.loss = 0.5f;
  m[4].u.status.accuracy = 0.875f;
  m[4].u.status.ring_capable = true;
  m[4].u.status.synced = true;
  m[4].u.status.n_keys = 2;
  m[4].u.status.keys[0] = 167;
  m[4].u.status.keys[1] = 42;
  static const uint8_t floats[64] = {0, 0, 128, 63, 0, 0, 0, 64};
  m[5].type = ST_MSG_TENSOR_CHUNK;
  m[5].u.chunk.transfer_id = 1;
  m[5].u.chunk.offset = 0;
  m[5].u.chunk.total = 16;
  m[5].u.chunk.data = floats;
  m[5].u.chunk.data_len = sizeof(floats);
  for (size_t i = 0; i < 6; i++)
    if (st_wire_encode(&m[i], out[i], 2048, &lens[i]) != 0)
      exit(1);
  return 6;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: gen_fuzz_seeds CORPUS_DIR\n");
    return 2;
  }
  root = argv[1];
  st_keyring_t ring;
  st_identity_t a, b;
  fuzz_keyring(&ring, 0x42);
  fuzz_identity(&a, 0x0a);
  fuzz_identity(&b, 0x0b);

  uint8_t msgs[6][2048];
  size_t lens[6];
  size_t n = sample_messages(msgs, lens);
  const uint8_t mode0 = 0, mode1 = 1;
  char name[64];

  /* Packets: mode 1 (plaintext to seal) and mode 0 (sealed datagrams),
   * sealed for the target's receiver (identity 0x02), and the first one
   * also for an unknown receiver (mode bit 1, ST_PACKET_TO_UNKNOWN). */
  st_identity_t self, receiver;
  fuzz_identity(&self, 0x01);
  fuzz_identity(&receiver, 0x02);
  st_packet_sealer_t sealer = {&ring, &self, 7, 0};
  const uint8_t mode1_unknown = 3;
  for (size_t i = 0; i < n; i++) {
    if (lens[i] > ST_PACKET_MAX_PLAINTEXT)
      continue;
    for (int unknown = 0; unknown <= (i == 0); unknown++) {
      const st_node_id_t* to = unknown ? NULL : &receiver.id;
      const char* suffix = unknown ? "-unknown" : "";
      snprintf(name, sizeof(name), "plain-%zu%s", i, suffix);
      put("fuzz_packet_open", name, unknown ? &mode1_unknown : &mode1, 1,
          msgs[i], lens[i]);
      uint8_t pkt[ST_PACKET_MAX_BYTES];
      size_t pkt_len;
      if (st_packet_seal(&sealer, to, msgs[i], lens[i], pkt, sizeof(pkt),
                         &pkt_len) != 0)
        return 1;
      snprintf(name, sizeof(name), "sealed-%zu%s", i, suffix);
      put("fuzz_packet_open", name, &mode0, 1, pkt, pkt_len);
    }
  }

  /* Streams: mode 1 (a message to seal) and mode 0 (a genuine connection:
   * the stream header, then frames, the last one final). */
  uint8_t key[ST_KEY_BYTES], header[ST_STREAM_HEADER_BYTES];
  memset(key, 0x5a, sizeof(key));
  st_stream_t tx;
  if (st_stream_tx_init(&tx, key, header) != 0)
    return 1;
  uint8_t stream[8192];
  size_t pos = 0;
  for (size_t i = 0; i < n; i++) {
    snprintf(name, sizeof(name), "message-%zu", i);
    put("fuzz_stream_frame", name, &mode1, 1, msgs[i], lens[i]);
    size_t flen;
    if (lens[i] + ST_STREAM_ABYTES + 4 <= sizeof(stream) - pos &&
        st_stream_seal_frame(&tx, msgs[i], lens[i], i + 1 == n, stream + pos,
                             sizeof(stream) - pos, &flen) == 0)
      pos += flen;
  }
  uint8_t conn[ST_STREAM_HEADER_BYTES + sizeof(stream)];
  memcpy(conn, header, sizeof(header));
  memcpy(conn + sizeof(header), stream, pos);
  put("fuzz_stream_frame", "frames", &mode0, 1, conn, sizeof(header) + pos);
  st_stream_wipe(&tx);

  /* Handshake messages from a real handshake, wire-encoded. */
  st_handshake_t hi, hr;
  st_msg_t m1 = {.type = ST_MSG_HS1}, m2 = {.type = ST_MSG_HS2},
           m3 = {.type = ST_MSG_HS3};
  if (st_handshake_init(&hi, ST_HS_INITIATOR, &a, &ring, NULL, NULL) != 0 ||
      st_handshake_init(&hr, ST_HS_RESPONDER, &b, &ring, NULL, NULL) != 0 ||
      st_handshake_write_msg1(&hi, &m1.u.hs1) != 0 ||
      st_handshake_read_msg1(&hr, &m1.u.hs1) != 0 ||
      st_handshake_write_msg2(&hr, &m2.u.hs2) != 0 ||
      st_handshake_read_msg2(&hi, &m2.u.hs2) != 0 ||
      st_handshake_write_msg3(&hi, &m3.u.hs3) != 0)
    return 1;
  st_handshake_wipe(&hi);
  st_handshake_wipe(&hr);
  const st_msg_t* hs[3] = {&m1, &m2, &m3};
  for (int i = 0; i < 3; i++) {
    uint8_t buf[512];
    size_t len;
    if (st_wire_encode(hs[i], buf, sizeof(buf), &len) != 0)
      return 1;
    char target[64];
    snprintf(target, sizeof(target), "fuzz_handshake_msg%d", i + 1);
    put(target, "genuine", buf, len, NULL, 0);
  }
  printf("seeds written under %s\n", root);
  return 0;
}
