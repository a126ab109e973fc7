/* cli.h: the subcommands of the `starling` command and the flag-parsing
 * helpers they share. Internal to tools/. */
#ifndef STARLING_CLI_H
#define STARLING_CLI_H

#include <getopt.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "node/train/train.h"

/* Each subcommand takes argv with argv[0] = the subcommand's name and
 * returns the process exit status: 0 success, 1 failure at run time,
 * 2 bad usage, 130 interrupted. */
int st__cmd_train(int argc, char** argv);
int st__cmd_keygen(int argc, char** argv);
int st__cmd_node(int argc, char** argv);
int st__cmd_status(int argc, char** argv);
int st__cmd_peers(int argc, char** argv);
int st__cmd_leave(int argc, char** argv);
/* `starling join HOST:PORT...` (cli_join.c). */
int st__cmd_join(int argc, char** argv);
int st__cmd_keys(int argc, char** argv);
int st__cmd_force_leave(int argc, char** argv);
/* `starling eval` and `starling predict`: a checkpoint's model on data
 * (cli_eval.c). */
int st__cmd_eval(int argc, char** argv);
int st__cmd_predict(int argc, char** argv);
/* Execs /usr/bin/python3 -m starling.plot (cli_plot.c); returns only on
 * failure. */
int st__cmd_plot(int argc, char** argv);
/* `starling top`: a live view of the cluster from one node (cli_top.c). */
int st__cmd_top(int argc, char** argv);
/* `starling monitor`: the node's events as they happen (cli_monitor.c). */
int st__cmd_monitor(int argc, char** argv);

/* ==== The control socket's client (cli_control.c) =========================
 *
 * CMD names the command in messages ("top" -> "starling top: ..."). The
 * socket is control when not NULL, else DIR/control.sock. Messages are
 * whole lines, written into err (err_len bytes), not printed, so that a
 * full-screen view can print them after restoring the terminal. */

/* Connects to the node's control socket; writes the path used into path.
 * Returns the socket (the caller closes it), -2 when the path is too long
 * for a socket or -1 when no node answers there, the message in err. */
int st__control_connect(const char* cmd, const char* dir, const char* control,
                        char* path, size_t path_len, char* err, size_t err_len);
/* Sends the request line req (with its "\n", e.g. "status json\n") and
 * reads the node's whole answer into *out: malloc'd, NUL-terminated, owned
 * by the caller (free), *out_len bytes before the NUL. Returns 0; -2 or -1
 * as st__control_connect, or -1 when sending fails, the node does not
 * answer within 10 s or answers "error: ...", *out NULL and the message in
 * err. */
int st__control_ask(const char* cmd, const char* dir, const char* control,
                    const char* req, char** out, size_t* out_len, char* err,
                    size_t err_len);

/* Sends req (one request line) to the node, prints its answer on stdout
 * and returns the exit status: 0, 1 when the node refused (a text error,
 * said on stderr, or a JSON {"error": ...}, printed) or is not there, 2
 * for a bad --data-dir/--control. */
int st__control_relay(const char* cmd, const char* dir, const char* control,
                      const char* req);
/* Takes a flag without a value (such as --cluster) out of argv, before
 * any "--", so that st__control_flags parses the rest; whether it was
 * there. */
bool st__take_flag(int* argc, char** argv, const char* flag);
/* The flags of every command that talks to a node: --data-dir DIR,
 * --control PATH, --json and --help (help(stdout, cmd), then 0). With
 * args, the arguments after the flags are left from optind for the
 * caller; without, one is refused. Returns -1 to go on, or the exit
 * status (0 after --help, 2 for a bad flag or argument, said on stderr). */
int st__control_flags(const char* cmd, int argc, char** argv,
                      void (*help)(FILE*, const char*), bool args,
                      const char** dir, const char** control, int* json);

/* ==== Subcommands (cli_common.c) ==========================================
 *
 * `starling` and `starling-bench` are each one binary with subcommands, like
 * `serf agent` / `serf members`; both dispatch through this. */

typedef struct {
  const char* name;
  int (*run)(int argc, char** argv); /* argv[0] = name; the exit status */
  const char* summary;               /* one line for the usage */
} st__subcommand_t;

typedef struct {
  const char* prog;    /* "starling", "starling-bench" */
  const char* intro;   /* the usage before the list of subcommands */
  const char* outro;   /* the usage after it */
  const char* noun;    /* "command", "benchmark": in "unknown command 'x'" */
  const char* version; /* NULL: no `version` subcommand */
  const st__subcommand_t* commands;
  size_t n_commands;
} st__program_t;

/* Writes p's usage to f: intro, one line a subcommand (and `version`),
 * outro. */
void st__program_usage(const st__program_t* p, FILE* f);
/* Runs the subcommand argv[1] with argv + 1 and returns its exit status;
 * --help, -h and help print the usage (0); no subcommand or an unknown one
 * prints the usage to stderr (2). */
int st__program_main(const st__program_t* p, int argc, char** argv);

/* Parsers for flag values. On bad input they print
 * "CMD: --FLAG: 'TEXT' is not ..." to stderr and return -EINVAL; CMD is
 * the whole command as the user typed it ("starling node",
 * "starling-bench ring"). */
int st__parse_u64(const char* cmd, const char* flag, const char* text,
                  uint64_t min, uint64_t max, uint64_t* out);
/* A duration: a number of seconds, or a number with a unit (ms, s, m, h),
 * in [0, max_s]; *out in seconds. 0, or -EINVAL with the reason on
 * stderr. */
/* A progress interval (--checkpoint-every, --log-every): a duration as
 * st__parse_duration (into *seconds) or a number of steps with the unit
 * "steps" (1 to max_steps, into *steps); the other is set to 0, and both
 * are 0 for "0" (never). With bare_is_seconds false a number without a
 * unit other than 0 is refused, naming both ways to write it (for a flag
 * that once counted steps). 0, or -EINVAL with the reason on stderr. */
int st__parse_interval(const char* cmd, const char* flag, const char* text,
                       double max_s, uint64_t max_steps, bool bare_is_seconds,
                       double* seconds, uint64_t* steps);
int st__parse_duration(const char* cmd, const char* flag, const char* text,
                       double max_s, double* out);
int st__parse_double(const char* cmd, const char* flag, const char* text,
                     double min, double max, double* out);

/* ==== Training flags (cli_train_flags.c) ================================
 *
 * The flags that say what to train and how (--model, --data, the optimizer,
 * the schedule, --device, --threads, ...), parsed in one place so that
 * every command that trains (`starling train`, `starling node`) accepts the
 * same flags with the same defaults, ranges and messages.
 *
 * A command copies st__train_long_opts into its own getopt_long table,
 * followed by its own options, and in its loop passes every result it does
 * not handle itself to st__train_flag:
 *
 *   struct option opts[ST__TRAIN_OPT_COUNT + N_OWN + 1];
 *   memcpy(opts, st__train_long_opts,
 *          st__train_long_opts_count() * sizeof(opts[0]));
 *   ... own entries, numbered from ST__TRAIN_OPT_END, then {NULL, 0, 0, 0}
 *   st__train_flags_init(&f);
 *   while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1)
 *     switch (c) { own cases; default:
 *       rc = st__train_flag(CMD, c, optarg, &f);  1: unknown, 2: bad value }
 *   rc = st__train_flags_finish(CMD, &f);
 */

/* Option ids 256..(256+ST__TRAIN_OPT_COUNT-1) are reserved for the training
 * flags; other commands number their own options from ST__TRAIN_OPT_END. */
enum { ST__TRAIN_OPT_FIRST = 256, ST__TRAIN_OPT_END = 320 };

/* The training flags' ids, in the order of st__train_long_opts. A command
 * that takes only some of them (starling-bench) names these in its table. */
enum {
  ST__TRAIN_OPT_MODEL = ST__TRAIN_OPT_FIRST,
  ST__TRAIN_OPT_DATA,
  ST__TRAIN_OPT_LABEL_COL,
  ST__TRAIN_OPT_REGRESSION,
  ST__TRAIN_OPT_NO_NORMALIZE,
  ST__TRAIN_OPT_SHARD,
  ST__TRAIN_OPT_EPOCHS,
  ST__TRAIN_OPT_BATCH,
  ST__TRAIN_OPT_LR,
  ST__TRAIN_OPT_OPTIMIZER,
  ST__TRAIN_OPT_MOMENTUM,
  ST__TRAIN_OPT_BETA1,
  ST__TRAIN_OPT_BETA2,
  ST__TRAIN_OPT_EPS,
  ST__TRAIN_OPT_WEIGHT_DECAY,
  ST__TRAIN_OPT_CLIP_NORM,
  ST__TRAIN_OPT_SCHEDULE,
  ST__TRAIN_OPT_WARMUP,
  ST__TRAIN_OPT_STEP_EVERY,
  ST__TRAIN_OPT_GAMMA,
  ST__TRAIN_OPT_MIN_LR,
  ST__TRAIN_OPT_SEED,
  ST__TRAIN_OPT_DEVICE,
  ST__TRAIN_OPT_THREADS,
  ST__TRAIN_OPT_HOGWILD,
  ST__TRAIN_OPT_HOGWILD_LOCKED,
  ST__TRAIN_OPT_COUNT = ST__TRAIN_OPT_HOGWILD_LOCKED - ST__TRAIN_OPT_FIRST + 1
};
_Static_assert(ST__TRAIN_OPT_FIRST + ST__TRAIN_OPT_COUNT <= ST__TRAIN_OPT_END,
               "the training flags outgrew their range of option ids");

typedef struct {
  st_train_config_t cfg; /* cfg.model parsed by st__train_flags_finish */
  const char* model;     /* --model text; borrowed from argv */
  const char* data;      /* --data text; borrowed from argv */
  st_data_options_t data_opt;
  const char* device; /* default "auto"; borrowed from argv */
  uint64_t threads;   /* 0: OpenBLAS's choice (HogWild: every CPU) */
  int optimizer_given, momentum_given;
} st__train_flags_t;

/* The training flags' struct option entries, NULL-terminated, to be copied
 * into a command's own long option table. */
extern const struct option st__train_long_opts[];
/* Entries before the terminator (ST__TRAIN_OPT_COUNT). */
size_t st__train_long_opts_count(void);

/* The defaults of `starling train`: st_train_config_default, every CSV
 * column but the last a feature, features standardized, device "auto". */
void st__train_flags_init(st__train_flags_t* f);

/* Handles one getopt_long result: returns 0 when opt was a training flag
 * and its value was good, 2 when the value was bad (message already printed
 * as "CMD: --flag: ..."), 1 when opt is not a training flag. value
 * (optarg) is borrowed and must outlive f. */
int st__train_flag(const char* cmd, int opt, const char* value,
                   st__train_flags_t* f);

/* After the loop: requires --model and --data (message naming cmd, with an
 * example), parses the model spec into f->cfg.model, applies "--momentum
 * alone means momentum SGD", checks that --schedule step has --step-every,
 * sets regression targets for linear models, and gives --hogwild its
 * threads (--threads, or every online CPU). Returns 0 or 2 (reported). */
int st__train_flags_finish(const char* cmd, st__train_flags_t* f);

/* The help text of these flags, as `starling train --help` prints it: the
 * sections "Model and data:" and "Optimization:", then "Running:" with
 * --device and --threads. It ends inside "Running:" (no blank line after),
 * so that a command prints its own running options next. */
void st__train_flags_usage(FILE* out);

/* ==== Synchronous SGD (cli_train_sync.c) =================================
 *
 * `starling train --sync`: the built-in trainer's gradient averaged over
 * the members every step through the local node's collectives. */

typedef struct st__sync_s st__sync_t;

typedef struct {
  uint64_t steps;        /* steps whose gradients were averaged */
  uint64_t failed_steps; /* steps dropped by a failure */
  uint64_t reforms;      /* times the group re-formed */
  uint64_t moved_steps;  /* re-formings that found this member at another
                            step than rank 0 (it took rank 0's) */
  size_t size, rank;     /* the group now, and this member's rank */
} st__sync_stats_t;

/* Opens a communicator on the node at socket; the members of group (NULL:
 * every member alive now, then kept as that list) check that they train
 * alike (the model, batch, epochs, optimizer, rate, schedule, shard count:
 * a difference is an error naming it), agree on the fewest steps per
 * epoch (set in t), and take rank 0's state (position, parameters, optimizer
 * state). *out is set even on failure (close it). err names what failed. */
int st__sync_open(st__sync_t** out, const char* socket, const char* group,
                  double timeout_s, st_trainer_t* t, FILE* log, char* err,
                  size_t err_len);
/* One step: the gradient (its buckets all-reduced as backward writes
 * them), then the optimizer's step. 0: applied; 1: dropped on every member
 * and the group re-formed from the survivors (logged); -EDOM: the loss or
 * the gradient is not finite (for the caller to say); another negative
 * errno, already said on stderr: a device error, the node went away, or
 * the group could not re-form. */
int st__sync_step(st__sync_t* s, st_trainer_t* t, double* loss);
void st__sync_info(const st__sync_t* s, st__sync_stats_t* st);
/* Stops the communication thread and closes the communicator; NULL is
 * fine. */
void st__sync_close(st__sync_t* s);

/* ==== Algorithms over the cluster (cli_kmeans.c, cli_lstsq.c; shared
 * parts in cli_algos.c) ======================================================
 *
 * `starling kmeans` and `starling lstsq` run on every member of a group,
 * each next to its node and on its own shard, and cooperate through the
 * client library (st_comm_kmeans, st_comm_lstsq; algos/algos.h;
 * docs/collectives.md). */

int st__cmd_kmeans(int argc, char** argv);
int st__cmd_lstsq(int argc, char** argv);

/* Their common flags' option ids; each command numbers its own from
 * ST__ALGO_OPT_END. */
enum {
  ST__ALGO_OPT_SOCKET = 400,
  ST__ALGO_OPT_DATA_DIR,
  ST__ALGO_OPT_DATA,
  ST__ALGO_OPT_SHARD,
  ST__ALGO_OPT_LABEL_COL,
  ST__ALGO_OPT_GROUP,
  ST__ALGO_OPT_TIMEOUT,
  ST__ALGO_OPT_OUT,
  ST__ALGO_OPT_JSON,
  ST__ALGO_OPT_END
};

/* --label-col none: every CSV column is a feature. */
#define ST__ALGO_NO_LABEL (-2)

typedef struct {
  const char* cmd;    /* "starling kmeans" */
  const char* socket; /* the node's control socket */
  const char* data_dir;
  const char* data; /* --data SPEC */
  uint32_t shard_k, shard_n;
  int label_col;     /* -1: the last column; ST__ALGO_NO_LABEL: none */
  const char* group; /* NULL: every member alive now */
  double timeout_s;
  const char* out; /* NULL: no file */
  int json;
  char socket_buf[4096];
} st__algo_args_t;

/* The common flags' struct option entries, NULL-terminated, and their
 * number. */
extern const struct option st__algo_long_opts[];
size_t st__algo_long_opts_count(void);
/* Defaults: shard 0/1, timeout 300 s, the group "all", and label_col. */
void st__algo_args_init(st__algo_args_t* a, const char* cmd, int label_col);
/* One getopt_long result: 0 handled, 2 bad value (reported), 1 not a
 * common flag. v is borrowed and must outlive a. */
int st__algo_flag(st__algo_args_t* a, int opt, const char* v);
/* After the loop: requires --data and --socket or --data-dir (the message
 * shows example); 0 or 2 (reported). */
int st__algo_finish(st__algo_args_t* a, const char* example);
/* The help text of the common flags. */
void st__algo_flags_usage(FILE* f);
/* Loads this member's shard of --data (float32 rows, unnormalized): with
 * a label column, y holds it (any real number); a CSV without one
 * (label_col ST__ALGO_NO_LABEL) has every column a feature. 0 or a negative
 * errno with err naming the file and the problem. */
int st__algo_load(const st__algo_args_t* a, st_dataset_t* ds, char* err,
                  size_t err_len);

/* Warns on stderr when every member held the same rows (same_data, as
 * st_comm_kmeans_info_t's): each counted size times. */
void st__algo_say_same_data(const char* cmd, int same_data, uint32_t size,
                            size_t rows);
/* Writes [v0, v1, ...] with every digit (%.17g). */
void st__algo_json_doubles(FILE* f, const double* v, size_t n);
/* A float32 copy of v (malloc'd; NULL when out of memory). */
float* st__algo_to_floats(const double* v, size_t n);

#endif
