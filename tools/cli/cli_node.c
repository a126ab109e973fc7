/* cli_node.c: `starling node`, the daemon (node/daemon/daemon.h): parses the
 * flags (the training flags are those of `starling train`) and runs it. */
#include <getopt.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gossip/gossip.h"
#include "node/daemon/daemon.h"
#include "tools/cli/cli.h"

#define CMD "starling node"

enum {
  OPT_LISTEN = ST__TRAIN_OPT_END,
  OPT_JOIN,
  OPT_CLUSTER_KEY,
  OPT_PREVIOUS_KEY,
  OPT_IDENTITY,
  OPT_ALLOW,
  OPT_DATA_DIR,
  OPT_CONTROL,
  OPT_METRICS,
  OPT_ADVERTISE,
  OPT_GOSSIP_EVERY,
  OPT_RING_EVERY,
  OPT_CHECKPOINT_EVERY,
  OPT_EVAL_EVERY,
  OPT_LOG_EVERY,
  OPT_NORM_MULT,
  OPT_CLIP_MULT,
  OPT_MIN_NODES,
  OPT_SYNC_DONORS,
  OPT_HANDSHAKE_RATE,
  OPT_RING_LANES,
  OPT_QUIET,
  OPT_ATTACH,
  OPT_COMPRESS,
  OPT_OUTER,
  OPT_OUTER_LR,
  OPT_OUTER_MOMENTUM,
  OPT_LOCAL_STEPS
};

static const struct option own_opts[] = {
    {"listen", required_argument, NULL, OPT_LISTEN},
    {"join", required_argument, NULL, OPT_JOIN},
    {"cluster-key", required_argument, NULL, OPT_CLUSTER_KEY},
    {"previous-key", required_argument, NULL, OPT_PREVIOUS_KEY},
    {"identity", required_argument, NULL, OPT_IDENTITY},
    {"allow", required_argument, NULL, OPT_ALLOW},
    {"data-dir", required_argument, NULL, OPT_DATA_DIR},
    {"control", required_argument, NULL, OPT_CONTROL},
    {"metrics", required_argument, NULL, OPT_METRICS},
    {"advertise", required_argument, NULL, OPT_ADVERTISE},
    {"gossip-every", required_argument, NULL, OPT_GOSSIP_EVERY},
    {"ring-every", required_argument, NULL, OPT_RING_EVERY},
    {"checkpoint-every", required_argument, NULL, OPT_CHECKPOINT_EVERY},
    {"eval-every", required_argument, NULL, OPT_EVAL_EVERY},
    {"log-every", required_argument, NULL, OPT_LOG_EVERY},
    {"norm-guard", required_argument, NULL, OPT_NORM_MULT},
    {"clip", required_argument, NULL, OPT_CLIP_MULT},
    {"min-nodes", required_argument, NULL, OPT_MIN_NODES},
    {"sync-donors", required_argument, NULL, OPT_SYNC_DONORS},
    {"handshake-rate", required_argument, NULL, OPT_HANDSHAKE_RATE},
    {"ring-lanes", required_argument, NULL, OPT_RING_LANES},
    {"quiet", no_argument, NULL, OPT_QUIET},
    {"attach", no_argument, NULL, OPT_ATTACH},
    {"compress", required_argument, NULL, OPT_COMPRESS},
    {"outer", required_argument, NULL, OPT_OUTER},
    {"outer-lr", required_argument, NULL, OPT_OUTER_LR},
    {"outer-momentum", required_argument, NULL, OPT_OUTER_MOMENTUM},
    {"local-steps", required_argument, NULL, OPT_LOCAL_STEPS},
    {"help", no_argument, NULL, 'h'},
};

/* The help text of `starling node`.
 * Long: one string per line of help, nothing else. */
static void usage(FILE* f) {
  fprintf(
      f,
      "usage: starling node --listen HOST:PORT --cluster-key FILE "
      "--data-dir DIR\n"
      "                     --model SPEC --data SPEC [--join HOST:PORT ...] "
      "[options]\n"
      "       starling node --attach --listen HOST:PORT --cluster-key FILE "
      "--data-dir DIR\n"
      "                     [--join HOST:PORT ...] [options]\n"
      "\n"
      "Runs a starling node: joins the cluster through a seed, trains its "
      "shard with\n"
      "local SGD and keeps its model close to its peers' by gossip "
      "averaging.\n"
      "Stop it with Ctrl-C, SIGTERM or 'starling leave': it announces its "
      "leave and\n"
      "writes a checkpoint; started again with the same --data-dir it "
      "resumes.\n"
      "\n"
      "With --attach the node trains no model of its own: a training program "
      "on this\n"
      "machine attaches to it through the control socket (the C library\n"
      "starling/client.h, or 'import starling' in Python) and brings the "
      "model; the\n"
      "node averages it with its peers (docs/attach.md). The first program "
      "to attach\n"
      "fixes the model (unless DATA_DIR holds a checkpoint, which does).\n"
      "\n"
      "Cluster:\n"
      "  --listen HOST:PORT   UDP and TCP address (port 0: any free port; "
      "HOST an\n"
      "                       address or a name; 0.0.0.0: every interface)\n"
      "  --advertise HOST:PORT  the address peers should use (default: "
      "--listen's,\n"
      "                       or the first non-loopback interface for "
      "0.0.0.0;\n"
      "                       port 0: the bound port)\n"
      "  --join HOST:PORT     a seed node (repeat for more); without it this "
      "node\n"
      "                       starts a cluster\n"
      "  --cluster-key FILE   the cluster key (starling keygen --cluster "
      "--out FILE)\n"
      "  --previous-key FILE  the key being rotated out (accepted, never "
      "used to send)\n"
      "  --identity FILE      this node's identity (default: "
      "DATA_DIR/identity.key,\n"
      "                       made on first start)\n"
      "  --allow FILE         accept only the public keys listed there\n"
      "  --data-dir DIR       identity, boot epoch, checkpoint, control "
      "socket\n"
      "  --control PATH       control socket (default DATA_DIR/control.sock)\n"
      "  --metrics ADDR       serve Prometheus metrics at "
      "http://ADDR/metrics (default:\n"
      "                       off); ADDR is HOST:PORT, or a bare PORT on "
      "127.0.0.1;\n"
      "                       port 0: any free one, shown by 'starling "
      "status'\n"
      "Intervals (--*-every T) are seconds, or durations with a unit: "
      "500ms, 30s,\n"
      "5m, 1h; --checkpoint-every and --log-every also take steps: "
      "500steps.\n"
      "  --gossip-every T     average with a random peer every T (default "
      "0.5 s;\n"
      "                       0: never)\n"
      "  --ring-every T       propose an exact ring all-reduce with the "
      "healthy peers\n"
      "                       every T (default 5 s; 0: never)\n"
      "  --ring-lanes L       encrypted connections a ring link uses, each "
      "sealed and\n"
      "                       opened on its own thread (1..8; default: a "
      "quarter of\n"
      "                       the cores, 1 to 4)\n"
      "  --min-nodes N        take the first step only once N nodes are "
      "alive and hold\n"
      "                       their state (synced), this one included "
      "(default 1: at\n"
      "                       once); training goes on whatever the count "
      "does after\n"
      "  --sync-donors K      a joiner fetches the cluster's agreed state (the "
      "last ring\n"
      "                       round's) from K donors at once, every chunk "
      "checked\n"
      "                       against a manifest two donors agree on "
      "(1..16; default\n"
      "                       3; 1: the whole state from one donor, as "
      "before)\n"
      "  --handshake-rate N   answer at most N connection handshakes a "
      "second (a\n"
      "                       bucket of N; past it, valid or replayed "
      "handshakes are\n"
      "                       closed unanswered and counted; 0: no limit; "
      "default 1000)\n"
      "  --checkpoint-every T write a checkpoint every T: a duration or "
      "N steps\n"
      "                       (default 30 s; 0: only at leave)\n"
      "  --eval-every T       evaluate on the test set every T (default "
      "5 s)\n"
      "  --log-every T        a progress line every T: a duration or N "
      "steps (default\n"
      "                       5 s; 0: none)\n"
      "  --norm-guard X       drop a peer's model whose norm exceeds X times "
      "ours\n"
      "                       (default 10; 0: off)\n"
      "  --clip X             scale a peer's pull on our model down to X "
      "times the\n"
      "                       median of the last 16 (robust averaging; "
      "default 3;\n"
      "                       0: off)\n"
      "  --compress C         what averaging sends: none (float32, the "
      "default),\n"
      "                       bf16, int8, or topk:F (the fraction F of "
      "largest\n"
      "                       entries), of each node's drift from the last "
      "ring\n"
      "                       round's mean; the same on every node\n"
      "                       (docs/compression.md)\n"
      "  --outer O            what averaging moves the nodes to: none "
      "(the mean,\n"
      "                       the default), nesterov (DiLoCo's outer "
      "step: a\n"
      "                       Nesterov step on a ring round's mean's move "
      "from the\n"
      "                       last round's vector) or noloco (the same "
      "step on\n"
      "                       each gossip exchange's pairwise mean); the "
      "same on\n"
      "                       every node\n"
      "  --outer-lr X         its learning rate, in (0, 4] (default 0.7)\n"
      "  --outer-momentum M   its momentum, in [0, 1) (default 0.9)\n"
      "  --local-steps H      while training, a ring round every H steps "
      "of the\n"
      "                       proposer instead of every --ring-every "
      "(default 0:\n"
      "                       by time); --ring-every still applies once the "
      "epochs\n"
      "                       are done\n"
      "  --quiet              only warnings and errors\n"
      "\n"
      "Training (as in 'starling train'):\n");
  st__train_flags_usage(f);
  fprintf(f,
          "\n"
          "Example (a cluster of two on one machine):\n"
          "  starling keygen --cluster --out cluster.key\n"
          "  starling node --listen 127.0.0.1:7946 --cluster-key cluster.key "
          "--data-dir n0 \\\n"
          "      --model mlp:784-256-128-10 --data fashion-mnist --shard 0/2 "
          "&\n"
          "  starling node --listen 127.0.0.1:7947 --join 127.0.0.1:7946 "
          "--cluster-key cluster.key \\\n"
          "      --data-dir n1 --model mlp:784-256-128-10 --data "
          "fashion-mnist --shard 1/2 &\n"
          "  starling peers --data-dir n0\n");
}

/* --compress: 0, or 2 after saying why the text is not a codec. */
static int compress_flag(st_daemon_config_t* cfg, const char* v) {
  char err[256];
  if (st_codec_parse(v, &cfg->compress, err, sizeof err) == 0)
    return 0;
  fprintf(stderr, "starling node: --compress: %s\n", err);
  return 2;
}

/* Whether --outer-lr or --outer-momentum was given (they need --outer
 * nesterov). */
static bool outer_tuned;

/* --outer, --outer-lr, --outer-momentum: 0, or 2 after saying why. */
static int outer_flag(st_daemon_config_t* cfg, int opt, const char* v) {
  char err[256];
  int rc;
  if (opt == OPT_OUTER) {
    rc = st_outer_parse_kind(v, &cfg->outer, err, sizeof err);
  } else {
    outer_tuned = true;
    rc = opt == OPT_OUTER_LR
             ? st_outer_parse_lr(v, &cfg->outer, err, sizeof err)
             : st_outer_parse_momentum(v, &cfg->outer, err, sizeof err);
  }
  if (rc == 0)
    return 0;
  fprintf(stderr, "starling node: %s: %s\n",
          opt == OPT_OUTER      ? "--outer"
          : opt == OPT_OUTER_LR ? "--outer-lr"
                                : "--outer-momentum",
          err);
  return 2;
}

/* The node's numeric flags: where each goes and its range. */
static int seconds_flag(st_daemon_config_t* cfg, int opt, const char* v) {
  /* Checkpoints and progress lines also count steps: 500steps. */
  if (opt == OPT_CHECKPOINT_EVERY)
    return st__parse_interval(CMD, "--checkpoint-every", v, 1e7, UINT32_MAX,
                              true, &cfg->checkpoint_every_s,
                              &cfg->checkpoint_every_steps) != 0
               ? 2
               : 0;
  if (opt == OPT_LOG_EVERY)
    return st__parse_interval(CMD, "--log-every", v, 1e7, UINT32_MAX, true,
                              &cfg->log_every_s, &cfg->log_every_steps) != 0
               ? 2
               : 0;
  static const struct {
    int opt;
    const char* flag;
    double max;
    size_t field;
  } flags[] = {
      {OPT_GOSSIP_EVERY, "--gossip-every", 86400,
       offsetof(st_daemon_config_t, gossip_every_s)},
      {OPT_RING_EVERY, "--ring-every", 86400,
       offsetof(st_daemon_config_t, ring_every_s)},
      {OPT_EVAL_EVERY, "--eval-every", 1e7,
       offsetof(st_daemon_config_t, eval_every_s)},
      {OPT_NORM_MULT, "--norm-guard", 1e12,
       offsetof(st_daemon_config_t, norm_mult)},
      {OPT_CLIP_MULT, "--clip", 1e6, offsetof(st_daemon_config_t, clip_mult)},
  };
  for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++) {
    if (flags[i].opt != opt)
      continue;
    double* out = (double*) (void*) ((char*) cfg + flags[i].field);
    /* The intervals (--*-every) are durations: 30, 30s, 500ms, 5m, 1h. */
    bool interval = strstr(flags[i].flag, "-every") != NULL;
    int rc =
        interval
            ? st__parse_duration(CMD, flags[i].flag, v, flags[i].max, out)
            : st__parse_double(CMD, flags[i].flag, v, 0, flags[i].max, out);
    return rc != 0 ? 2 : 0;
  }
  return 2;
}

/* The node's whole-number flags: --ring-lanes, --min-nodes,
 * --sync-donors and --handshake-rate. Returns 0 or 2 for a bad value. */
static int count_flag(st_daemon_config_t* cfg, int opt, const char* v) {
  static const struct {
    int opt;
    const char* flag;
    uint64_t lo, hi;
    size_t field;
  } flags[] = {
      {OPT_RING_LANES, "--ring-lanes", 1, ST_RING_MAX_LANES,
       offsetof(st_daemon_config_t, ring_lanes)},
      {OPT_MIN_NODES, "--min-nodes", 1, 100000,
       offsetof(st_daemon_config_t, min_nodes)},
      {OPT_SYNC_DONORS, "--sync-donors", 1, ST_SYNC_MAX_DONORS,
       offsetof(st_daemon_config_t, sync_donors)},
      {OPT_HANDSHAKE_RATE, "--handshake-rate", 0, 1000000,
       offsetof(st_daemon_config_t, handshake_rate)},
  };
  for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++) {
    if (flags[i].opt != opt)
      continue;
    uint64_t n;
    if (st__parse_u64(CMD, flags[i].flag, v, flags[i].lo, flags[i].hi, &n))
      return 2;
    *(uint32_t*) (void*) ((char*) cfg + flags[i].field) = (uint32_t) n;
    return 0;
  }
  return 2;
}

/* Applies one of the node's own flags (not a training flag) to cfg.
 * Returns 0, 2 for a bad value, or 1 when opt is not one of them. */
static int node_flag(st_daemon_config_t* cfg, int opt, const char* v) {
  int rc = 0;
  switch (opt) {
    case OPT_LISTEN:
      cfg->listen = v;
      break;
    case OPT_ADVERTISE:
      cfg->advertise = v;
      break;
    case OPT_JOIN:
      if (cfg->n_seeds == ST_DAEMON_MAX_SEEDS) {
        fprintf(stderr, "starling node: at most %d --join seeds\n",
                ST_DAEMON_MAX_SEEDS);
        rc = 2;
      } else {
        cfg->seeds[cfg->n_seeds++] = v;
      }
      break;
    case OPT_CLUSTER_KEY:
      cfg->cluster_key_path = v;
      break;
    case OPT_PREVIOUS_KEY:
      cfg->previous_key_path = v;
      break;
    case OPT_IDENTITY:
      cfg->identity_path = v;
      break;
    case OPT_ALLOW:
      cfg->allowlist_path = v;
      break;
    case OPT_DATA_DIR:
      cfg->data_dir = v;
      break;
    case OPT_CONTROL:
      cfg->control_path = v;
      break;
    case OPT_METRICS:
      cfg->metrics = v;
      break;
    case OPT_GOSSIP_EVERY:
    case OPT_RING_EVERY:
    case OPT_CHECKPOINT_EVERY:
    case OPT_EVAL_EVERY:
    case OPT_LOG_EVERY:
    case OPT_NORM_MULT:
    case OPT_CLIP_MULT:
      rc = seconds_flag(cfg, opt, v);
      break;
    case OPT_RING_LANES:
    case OPT_MIN_NODES:
    case OPT_SYNC_DONORS:
    case OPT_HANDSHAKE_RATE:
      rc = count_flag(cfg, opt, v);
      break;
    case OPT_QUIET:
      cfg->quiet = true;
      break;
    case OPT_ATTACH:
      cfg->attach = true;
      break;
    case OPT_COMPRESS:
      rc = compress_flag(cfg, v);
      break;
    case OPT_OUTER:
    case OPT_OUTER_LR:
    case OPT_OUTER_MOMENTUM:
      rc = outer_flag(cfg, opt, v);
      break;
    case OPT_LOCAL_STEPS:
      rc = st__parse_u64(CMD, "--local-steps", v, 0, UINT32_MAX,
                         &cfg->local_steps) != 0
               ? 2
               : 0;
      break;
    default:
      return 1;
  }
  return rc;
}

/* Parses the command line into cfg and f. Returns 0, 2 for a bad flag, or
 * -1 after --help. */
static int parse_args(int argc, char** argv, const struct option* opts,
                      st_daemon_config_t* cfg, st__train_flags_t* f) {
  optind = 1;
  opterr = 0;
  outer_tuned = false;
  int c, rc = 0;
  while (rc == 0 && (c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    const char* v = optarg;
    if (c == 'h') {
      usage(stdout);
      return -1;
    }
    if (c == ':') {
      fprintf(stderr, "starling node: %s needs a value\n", argv[optind - 1]);
      rc = 2;
      break;
    }
    rc = node_flag(cfg, c, v);
    if (rc != 1)
      continue;
    rc = st__train_flag(CMD, c, v, f);
    if (rc == 1) {
      fprintf(stderr,
              "starling node: unknown option '%s'; see 'starling node "
              "--help'\n",
              argv[optind - 1]);
      rc = 2;
    }
  }
  return rc;
}

/* The outer optimizer's flags together: tuned only with --outer; nesterov
 * needs ring rounds, noloco gossip. 0, or 2 after saying
 * why. */
static int check_outer(const st_daemon_config_t* cfg) {
  if (outer_tuned && cfg->outer.kind == ST_OUTER_NONE) {
    fprintf(stderr,
            "starling node: --outer-lr and --outer-momentum set the outer "
            "optimizer; add --outer nesterov\n");
    return 2;
  }
  if (cfg->outer.kind == ST_OUTER_NOLOCO && cfg->gossip_every_s <= 0) {
    fprintf(stderr,
            "starling node: --outer noloco steps on the means of gossip "
            "exchanges, and --gossip-every 0 turns them off; set "
            "--gossip-every\n");
    return 2;
  }
  if (cfg->outer.kind == ST_OUTER_NESTEROV && cfg->ring_every_s <= 0 &&
      cfg->local_steps == 0) {
    fprintf(stderr,
            "starling node: --outer steps on the mean of ring rounds, and "
            "--ring-every 0 turns them off; set --ring-every or "
            "--local-steps\n");
    return 2;
  }
  return 0;
}

int st__cmd_node(int argc, char** argv) {
  /* A SIGTERM from here on ends in an orderly leave (daemon.h). */
  st_daemon_catch_early_signals();
  size_t nt = st__train_long_opts_count();
  size_t no = sizeof(own_opts) / sizeof(own_opts[0]);
  struct option* opts = calloc(nt + no + 1, sizeof(*opts));
  if (opts == NULL)
    return 1;
  memcpy(opts, st__train_long_opts, nt * sizeof(*opts));
  memcpy(opts + nt, own_opts, no * sizeof(*opts));

  st_daemon_config_t cfg;
  st_daemon_config_default(&cfg);
  st__train_flags_t f;
  st__train_flags_init(&f);
  int rc = parse_args(argc, argv, opts, &cfg, &f);
  free(opts);
  if (rc != 0)
    return rc < 0 ? 0 : rc;
  if (optind < argc) {
    fprintf(stderr,
            "starling node: unexpected argument '%s'; see 'starling node "
            "--help'\n",
            argv[optind]);
    return 2;
  }
  const char* missing = cfg.listen == NULL             ? "--listen HOST:PORT"
                        : cfg.cluster_key_path == NULL ? "--cluster-key FILE"
                        : cfg.data_dir == NULL         ? "--data-dir DIR"
                                                       : NULL;
  if (missing != NULL) {
    fprintf(stderr,
            "starling node: %s is required; see 'starling node --help'\n",
            missing);
    return 2;
  }
  if ((rc = check_outer(&cfg)) != 0)
    return rc;
  if (cfg.attach) {
    if (f.model != NULL || f.data != NULL) {
      fprintf(stderr,
              "starling node: --attach takes the model and data from the "
              "attached program; drop %s\n",
              f.model != NULL ? "--model" : "--data");
      return 2;
    }
  } else if ((rc = st__train_flags_finish(CMD, &f)) != 0) {
    return rc;
  }
  cfg.train = f.cfg;
  cfg.data_spec = f.data;
  cfg.data_opt = f.data_opt;
  cfg.device = f.device;
  cfg.threads = (uint32_t) f.threads;

  char err[1024] = "";
  rc = st_daemon_run(&cfg, err, sizeof(err));
  if (rc != 0) {
    fprintf(stderr, "starling node: %s\n", err);
    return 1;
  }
  return 0;
}
