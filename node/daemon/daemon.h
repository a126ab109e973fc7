/* daemon.h: `starling node`, the daemon every machine runs (DESIGN.md,
 * Threads; docs/operations.md).
 *
 * One libuv loop thread owns every socket (UDP and TCP on the same port,
 * the Unix control socket), timer and signal, and drives the sans-IO
 * membership and exchange machines of gossip/ with real time. A trainer
 * thread (node/daemon/trainer_thread.h) steps the model back to back and talks
 * to the loop through a mailbox; it never waits on the network.
 *
 * The data directory holds what survives a restart: the node's identity
 * (identity.key, made on first start unless --identity names one), its
 * boot epoch (boot_epoch, raised on every start so that its incarnation
 * outranks its previous life, and bound to the identity), the latest
 * checkpoint (checkpoint.safetensors, the format `starling train` writes)
 * and, by default, the control socket (control.sock). A node holds the
 * directory's lock (lock, with its PID) for its whole life: a second node
 * on the same directory is refused. Every file is mode 0600, and the
 * directory, when the node makes it, 0700.
 */
#ifndef STARLING_NODE_DAEMON_H
#define STARLING_NODE_DAEMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "node/train/train.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ST_DAEMON_MAX_SEEDS 16

typedef struct {
  const char* listen;    /* "HOST:PORT" (UDP and TCP) */
  const char* advertise; /* "HOST:PORT" peers should use (port 0: the
                            bound one); NULL: the bound address, or the
                            first interface when that is 0.0.0.0 or :: */
  const char* seeds[ST_DAEMON_MAX_SEEDS]; /* "HOST:PORT" each */
  size_t n_seeds;
  const char* cluster_key_path;  /* required */
  const char* previous_key_path; /* NULL, or the key rotated out */
  const char* identity_path;     /* NULL: DATA_DIR/identity.key */
  const char* allowlist_path;    /* NULL: any cluster-key holder */
  const char* data_dir;          /* required */
  const char* control_path;      /* NULL: DATA_DIR/control.sock */
  const char* metrics; /* the Prometheus endpoint's "[HOST:]PORT" (a bare
                          port: on 127.0.0.1; port 0: any free one);
                          NULL: no endpoint (node/daemon/daemon_metrics.c) */

  st_train_config_t train; /* model parsed, schedule spanning the epochs */
  const char* data_spec;
  st_data_options_t data_opt;
  const char* device;
  uint32_t threads; /* 0: OpenBLAS's choice */

  double gossip_every_s;           /* pairwise averaging period; 0: off */
  double ring_every_s;             /* ring all-reduce proposal period; 0: off */
  double checkpoint_every_s;       /* 0: only at exit (or by steps) */
  uint64_t checkpoint_every_steps; /* or every this many steps; 0: by time */
  double eval_every_s;             /* test-set evaluation period */
  double status_every_s;           /* status record refresh */
  double log_every_s;              /* progress lines on stderr; 0: none */
  uint64_t log_every_steps; /* or a line each this many steps; 0: by time */
  double norm_mult;         /* exchange guard (st_xchg_config_t) */
  st_codec_spec_t compress; /* averaging's codec; {0}: none (float32) */
  st_outer_spec_t outer;    /* the outer optimizer on ring means (--outer;
                               daemon_outer.c); kind NONE: plain mean */
  uint64_t local_steps;     /* ring rounds every this many of the proposer's
                               steps instead of every ring_every_s; 0: off */
  double clip_mult;         /* robust averaging: clip at this times the median
                               delta norm (daemon_xchg.c); 0: off */
  uint32_t min_nodes;       /* the first step waits until this many nodes
                               are alive, this one included (1: at once) */
  uint32_t sync_donors;     /* a joiner fetches the agreed state from this
                               many donors at once (daemon_sync.c); 1: the
                               whole state from one (FETCH) */
  uint32_t handshake_rate;  /* HS1s answered a second, a bucket of as many
                               (daemon_conn.c); 0: no limit */
  uint32_t ring_lanes;      /* encrypted connections a ring link uses, 1 ..
                               ST_RING_MAX_LANES; 0: a quarter of the
                               cores, within 1 .. 4 */
  bool quiet;               /* only warnings and errors on stderr */
  bool attach; /* no built-in trainer: a local program attaches through the
                  control socket and brings the model (docs/attach.md);
                  train, data_spec, device are unused */
} st_daemon_config_t;

/* What --handshake-rate is by default. Answering an HS1 is an X25519 key
 * pair, a DH and an Ed25519 signature: about half of a whole handshake,
 * which takes about 350 us on both sides together (docs/security.md), so
 * a flood of valid or replayed HS1s costs under a fifth of a core; a
 * cluster's own connections are far fewer (a node dials a few a second). */
#define ST_DAEMON_HANDSHAKE_RATE 1000u

/* Defaults: gossip every 0.5 s, a ring every 5 s, checkpoint every 30 s,
 * evaluate every 5 s, status every 1 s, log every 5 s, norm guard 10,
 * min nodes 1, 3 sync donors, 1000 handshakes answered a second. */
void st_daemon_config_default(st_daemon_config_t* cfg);

/* Runs the daemon until it is told to leave (SIGINT, SIGTERM, or `starling
 * leave`): then it announces its leave, writes a checkpoint, closes every
 * handle and returns 0. A start-up failure (bad key file, address in use,
 * data that does not fit the model, a cluster that runs another model)
 * returns a negative errno with one sentence in err naming the cause and
 * what to do. */
int st_daemon_run(const st_daemon_config_t* cfg, char* err, size_t err_len);

/* From now until st_daemon_run's loop has its own handlers, SIGINT and
 * SIGTERM are noted instead of killing the process, and the node leaves as
 * soon as its loop runs. st_daemon_run calls it; a program calls it first
 * thing to cover its own start-up too (parsing, loading). Not thread-safe:
 * call it from the main thread before starting any. */
void st_daemon_catch_early_signals(void);

#ifdef __cplusplus
}
#endif

#endif
