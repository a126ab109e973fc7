/* cli_train_sync.c: `starling train --sync`, synchronous data-parallel SGD
 * for the built-in trainer over the cluster's collectives (issue 15;
 * docs/collectives.md, "Synchronous SGD (starling train --sync)").
 *
 * Every member runs `starling train --sync` next to its node, on its own
 * shard; every step applies the mean of all the members' gradients, so
 * that N members with batch b step as one process with batch N·b. The
 * gradient goes in buckets, one a layer: the model's backward pass
 * (st_model_step_hooked) hands each layer's gradient, from the last layer
 * down, to one communication thread as soon as it is written, and that
 * thread all-reduces it (mean) through the client library while backward
 * goes on with the layers below. Buckets go out in the same order on every
 * member. When the last is back the trainer takes its optimizer step.
 *
 * A failed all-reduce (a member died, its program went away, a timeout)
 * drops the step everywhere; the survivors re-form the group without the
 * members that failed (named in the error, or removed by their node's
 * failure detector), meet at a barrier, rank 0 of the new group
 * broadcasts its state (step, parameters, optimizer state), and training goes
 * on with N-1 members: the same learning rate, a step of (N-1)·b examples, the
 * lost member's shard no longer seen. The same protocol as the Python package's
 * SyncDataParallel (sync.py).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/starling/client.h"
#include "node/train/train.h"
#include "tools/cli/cli.h"

#define MAX_MEMBERS 256
/* How a failed step waits for the failure detector (seconds), as sync.py:
 * until a member of the group is gone from the node's list, then until the
 * list has not changed for SETTLE_S; RECOVER_S bounds the whole re-forming. */
#define DETECT_S 30.0
#define SETTLE_S 0.5
#define RECOVER_S 180.0

typedef char member_id_t[33];

struct st__sync_s {
  st_comm_t* comm;
  char socket[4096]; /* the node's control socket, for messages */
  double timeout_s;
  FILE* log;
  st_trainer_t* t;
  float* host; /* n_params staging of the gradient (device backends) */
  member_id_t group[MAX_MEMBERS];
  size_t size, rank;
  member_id_t self; /* this node's id */
  char group_text[MAX_MEMBERS * 33];
  /* The communication thread and its queue of layers for this step. */
  pthread_t thread;
  int started;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int posted[ST_MODEL_MAX_LAYERS]; /* layers in the order they came */
  int n_posted, n_done, stop;
  int failed; /* a negative errno: the step's first failure */
  char failure[512];
  st__sync_stats_t stats;
};

/* ---- The group --------------------------------------------------------- */

static void group_text(st__sync_t* s) {
  char* p = s->group_text;
  for (size_t i = 0; i < s->size; i++)
    p += sprintf(p, "%s%s", i ? "," : "", s->group[i]);
  *p = '\0';
}

static int cmp_id(const void* a, const void* b) {
  return strcmp((const char*) a, (const char*) b);
}

/* The members of "all" now, into ids (sorted, as ranks are). */
static int members_now(st__sync_t* s, member_id_t* ids, size_t* n) {
  size_t rank = 0;
  int rc = st_comm_members(s->comm, ids, MAX_MEMBERS, n, &rank);
  if (rc == 0 && *n > MAX_MEMBERS)
    *n = MAX_MEMBERS;
  if (rc == 0)
    qsort(ids, *n, sizeof(member_id_t), cmp_id);
  return rc;
}

/* Whether the failure says member id's program went away (daemon_coll_
 * session.c): it is out for good. */
static bool named_gone(const char* failure, const char* id) {
  char pat[96];
  snprintf(pat, sizeof pat, "the program on member %s went away", id);
  return strstr(failure, pat) != NULL;
}

/* Whether the failure names member id among "no word yet from <12 hex>,
 * ..." (a timeout; daemon_coll.c): slow, or dead and not yet declared. */
static bool named_silent(const char* failure, const char* id) {
  const char* w = strstr(failure, "no word yet from ");
  if (w == NULL)
    return false;
  char prefix[13];
  memcpy(prefix, id, 12);
  prefix[12] = '\0';
  return strstr(w, prefix) != NULL;
}

/* The survivors of a failed step (docs/collectives.md, "Synchronous SGD
 * (starling train --sync)"): the group less the members whose program
 * went away, those the node no longer lists, and those the failure names
 * as not heard from. Except that a member never re-forms alone on
 * silence: when the silent are all the others, they stay, and only the
 * failure detector takes them out (a dead member's node is declared
 * within its bound; a slow one stays listed and is met again at the
 * re-forming's barrier). Waits until the list has settled for SETTLE_S
 * and a member is out (or the group stays on silence alone); up to
 * DETECT_S, then -ETIMEDOUT. Returns 0 with the new group in s,
 * -ECANCELED when the failure names this member as not heard from (the
 * others go on without it), or another negative errno. */
static int survivors(st__sync_t* s) {
  member_id_t now[MAX_MEMBERS], prev[MAX_MEMBERS], next[MAX_MEMBERS];
  size_t n_now = 0, n_prev = 0, n_next = 0;
  double start = st_now_s(), stable_since = start;
  bool mismatch = strstr(s->failure, " (this member) called ") != NULL;
  size_t silent = 0;
  for (size_t i = 0; i < s->size; i++)
    silent += named_silent(s->failure, s->group[i]);
  if (named_silent(s->failure, s->self) && silent + 1 < s->size) {
    /* The others did not hear from this member in time: they go on
     * without it, and it must not go on alone. (Named with every other
     * but the one that failed, it is kept: that one would be alone.) */
    char why[sizeof s->failure];
    snprintf(why, sizeof why, "%s", s->failure);
    snprintf(s->failure, sizeof s->failure,
             "this member was too slow for the others (named among those "
             "not heard from; raise --sync-timeout): %.400s",
             why);
    return -ECANCELED;
  }
  for (;;) {
    int rc = members_now(s, now, &n_now);
    if (rc != 0)
      return rc;
    n_next = 0;
    /* here[i]: listed, its program not gone; quiet[i]: not heard from. */
    bool here[MAX_MEMBERS], quiet[MAX_MEMBERS], alone_on_silence = true;
    for (size_t i = 0; i < s->size; i++) {
      const char* id = s->group[i];
      here[i] = bsearch(id, now, n_now, sizeof(member_id_t), cmp_id) != NULL &&
                !named_gone(s->failure, id);
      quiet[i] = named_silent(s->failure, id);
      if (here[i] && strcmp(id, s->self) != 0)
        alone_on_silence &= quiet[i];
    }
    for (size_t i = 0; i < s->size; i++)
      if (here[i] && (alone_on_silence || !quiet[i]))
        memcpy(next[n_next++], s->group[i], sizeof(member_id_t));
    double t = st_now_s();
    if (n_now != n_prev || memcmp(now, prev, n_now * sizeof(member_id_t)))
      stable_since = t;
    memcpy(prev, now, n_now * sizeof(member_id_t));
    n_prev = n_now;
    bool shrunk = n_next < s->size;
    /* Kept on silence alone: the same group again at once (its barrier
     * waits for the slow; a dead one is out at a later turn). Likewise
     * after a mismatch, which a member that re-formed meets from one still
     * in the step (its barrier against that step's all-reduce): both are
     * alive, and the failed call kept them in step. */
    bool again = !shrunk && n_next > 1 && (alone_on_silence || mismatch);
    if ((shrunk || again) && t - stable_since >= SETTLE_S)
      break;
    if (!shrunk && t - start >= DETECT_S)
      return -ETIMEDOUT; /* nobody left: the same group would not match */
    usleep(100000);
  }
  memcpy(s->group, next, n_next * sizeof(member_id_t));
  s->size = n_next;
  group_text(s);
  return 0;
}

/* ---- The communication thread -------------------------------------------- */

/* All-reduces layer l's gradient (mean over the group). */
static int reduce_layer(st__sync_t* s, int l) {
  const st_model_t* m = &s->t->model;
  size_t off = m->w_off[l], n = m->b_off[l] + m->spec.sizes[l + 1] - off;
  float* g = s->host != NULL ? s->host + off : m->grads + off;
  return st_comm_all_reduce(s->comm, s->group_text, g, n, ST_COMM_F32,
                            ST_COMM_MEAN, s->timeout_s);
}

static void* comm_thread(void* arg) {
  st__sync_t* s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->stop && s->n_done == s->n_posted)
      pthread_cond_wait(&s->cv, &s->mu);
    if (s->stop)
      break;
    int l = s->posted[s->n_done];
    int skip = s->failed != 0; /* after a failure the rest are not sent */
    pthread_mutex_unlock(&s->mu);
    int rc = skip ? 0 : reduce_layer(s, l);
    pthread_mutex_lock(&s->mu);
    if (rc != 0 && s->failed == 0) {
      s->failed = rc;
      snprintf(s->failure, sizeof s->failure, "%s", st_comm_error(s->comm));
    }
    s->n_done++;
    pthread_cond_broadcast(&s->cv);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* st_model_step_hooked's layer_done: layer l's gradient is written. */
static void layer_ready(void* arg, int l) {
  st__sync_t* s = arg;
  const st_model_t* m = &s->t->model;
  if (s->host != NULL) { /* waits for the device */
    size_t off = m->w_off[l], n = m->b_off[l] + m->spec.sizes[l + 1] - off;
    if (st_copy_to_host(m->be, s->host + off, m->grads + off, n) != 0) {
      pthread_mutex_lock(&s->mu);
      if (s->failed == 0) {
        s->failed = -EIO;
        snprintf(s->failure, sizeof s->failure,
                 "cannot read the gradient from the device: %s",
                 st_backend_last_error(m->be));
      }
      pthread_mutex_unlock(&s->mu);
    }
  }
  pthread_mutex_lock(&s->mu);
  s->posted[s->n_posted++] = l;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* Waits for every posted bucket; returns the step's failure (0: none). */
static int wait_buckets(st__sync_t* s) {
  pthread_mutex_lock(&s->mu);
  while (s->n_done < s->n_posted)
    pthread_cond_wait(&s->cv, &s->mu);
  int rc = s->failed;
  s->n_posted = s->n_done = 0;
  s->failed = 0;
  pthread_mutex_unlock(&s->mu);
  return rc;
}

/* ---- Parameters everywhere equal --------------------------------------------
 */

/* One vector of the model's size on the backend (parameters, momentum,
 * second moment) from rank 0 to every member, through s->host on a device
 * backend (read from the device on rank 0 only: the others' is
 * overwritten). A device error is -EIO, which ends the run (reform). */
static int broadcast_vector(st__sync_t* s, float* v) {
  st_model_t* m = &s->t->model;
  float* p = v;
  if (s->host != NULL) {
    bool root = s->self[0] == '\0' || s->size == 0 ||
                strcmp(s->group[0], s->self) == 0; /* unknown: stage */
    if (root && st_copy_to_host(m->be, s->host, v, m->n_params) != 0)
      return -EIO;
    p = s->host;
  }
  int rc = st_comm_broadcast(s->comm, s->group_text, 0, p, m->n_params,
                             ST_COMM_F32, s->timeout_s);
  if (rc == 0 && s->host != NULL)
    rc = st_copy_to_device(m->be, v, s->host, m->n_params);
  return rc;
}

/* Rank 0's training state to every member of the group: its position (the
 * step, and the optimizer's update count), its parameters and its
 * optimizer state. All of it, not the parameters alone: a step can succeed
 * on one member and fail on another (the last segment of an all-reduce
 * reached one before its sender died; docs/collectives.md, "Failures"), so
 * after a re-forming one member may have applied a step, and updated its
 * momentum, that another dropped. Left so, the two would step on with
 * different momenta, and one would call an all-reduce the other never
 * makes after its last step. */
static int broadcast_state(st__sync_t* s) {
  st_trainer_t* t = s->t;
  double pos[2] = {(double) t->step, (double) t->optim.t};
  int rc = st_comm_broadcast(s->comm, s->group_text, 0, pos, 2, ST_COMM_F64,
                             s->timeout_s);
  if (rc == 0)
    rc = broadcast_vector(s, t->model.params);
  if (rc == 0 && t->optim.m != NULL)
    rc = broadcast_vector(s, t->optim.m);
  if (rc == 0 && t->optim.v != NULL)
    rc = broadcast_vector(s, t->optim.v);
  if (rc != 0)
    return rc;
  uint32_t rank = 0, size = 0;
  st_comm_last_group(s->comm, &rank, &size);
  s->rank = rank;
  uint64_t step = (uint64_t) pos[0];
  if (step != t->step) {
    fprintf(s->log,
            "sync: this member was at step %" PRIu64 ", rank 0 at step %" PRIu64
            " (a step that succeeded on one and failed on the other); it "
            "goes on from rank 0's\n",
            t->step, step);
    s->stats.moved_steps++;
    if (st_trainer_set_position(t, step) != 0)
      return -EINVAL;
  }
  t->optim.t = (uint64_t) pos[1];
  return 0;
}

/* After a failed step: the survivors, a barrier of theirs, then rank 0's
 * parameters; again while that fails, up to RECOVER_S. The barrier comes
 * first because it is symmetric: a broadcast's root passes without the
 * others, and a root that re-formed ahead of them would step on alone. A
 * barrier that met nobody is withdrawn on every side, so retries of one
 * group stay in step. */
static int reform(st__sync_t* s) {
  double start = st_now_s();
  for (;;) {
    int rc = survivors(s);
    if (rc == 0)
      rc = st_comm_barrier(s->comm, s->group_text, s->timeout_s);
    if (rc == 0)
      rc = broadcast_state(s);
    if (rc == 0) {
      s->stats.reforms++;
      fprintf(s->log,
              "sync: the group re-formed with %zu members (this one rank "
              "%zu) after: %s\n",
              s->size, s->rank, s->failure);
      return 0;
    }
    if (rc == -EIO) { /* the device, not the group: say so and stop */
      snprintf(s->failure, sizeof s->failure,
               "cannot move the state through the device: %s",
               st_backend_last_error(s->t->model.be));
      return rc;
    }
    if (rc == -ENOTCONN || rc == -ECANCELED || st_now_s() - start >= RECOVER_S)
      return rc;
    snprintf(s->failure, sizeof s->failure, "%s", st_comm_error(s->comm));
  }
}

/* A device error of step t->step, said on stderr; returns rc. */
static int step_failed(const st_trainer_t* t, int rc) {
  const char* why = st_backend_last_error(t->model.be);
  fprintf(stderr, "starling train: step %" PRIu64 " failed: %s\n", t->step,
          *why ? why : strerror(-rc));
  return rc;
}

int st__sync_step(st__sync_t* s, st_trainer_t* t, double* loss) {
  int rc = st_trainer_gradient(t, loss, layer_ready, s);
  int comm_rc = wait_buckets(s);
  if (rc == -EDOM)
    return rc; /* diverged: the caller says so, as without --sync */
  if (rc != 0)
    return step_failed(t, rc);
  if (comm_rc == 0) {
    if (s->host != NULL) {
      rc = st_copy_to_device(t->model.be, t->model.grads, s->host,
                             t->model.n_params);
      if (rc != 0)
        return step_failed(t, rc);
    }
    s->stats.steps++;
    rc = st_trainer_apply(t);
    return rc == 0 || rc == -EDOM ? rc : step_failed(t, rc);
  }
  if (comm_rc == -ENOTCONN) {
    fprintf(stderr,
            "starling train: --sync: the node at %s went away at step %" PRIu64
            " (%s); start it again, then this command\n",
            s->socket, t->step, s->failure);
    return comm_rc;
  }
  s->stats.failed_steps++;
  st_trainer_skip(t);
  fprintf(s->log, "sync: step %" PRIu64 " dropped on every member: %s\n",
          t->step, s->failure);
  rc = reform(s);
  if (rc != 0)
    fprintf(stderr,
            "starling train: --sync: the group could not re-form (%s); the "
            "last failure: %s\n",
            strerror(-rc), s->failure);
  return rc != 0 ? rc : 1;
}

/* ---- Opening: the members agree, then start equal
 * ---------------------------- */

/* FNV-1a of the model's text, 52 bits so that a double holds it. */
static double text_hash(const char* text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char* p = text; *p; p++)
    h = (h ^ (unsigned char) *p) * 0x100000001b3ull;
  return (double) (h >> 12);
}

/* Every member's settings, min and max over the group; a difference in one
 * that must agree is an error naming it. *steps gets the fewest steps per
 * epoch (shards differ by an example at most; every member runs that
 * many, so that none waits for a step the others never take). */
static int agree(st__sync_t* s, const char* group, const st_trainer_t* t,
                 size_t* steps, char* err, size_t err_len) {
  char model[256];
  st_model_spec_format(&t->cfg.model, model, sizeof model);
  enum { N = 8 };
  static const char* const names[N] = {
      "the model (--model)",           "the batch (--batch)",
      "the epochs (--epochs)",         "the optimizer (--optimizer)",
      "the learning rate (--lr)",      "the schedule (--schedule)",
      "the shard count (--shard K/N)", NULL /* steps per epoch: the fewest */};
  double v[N] = {text_hash(model),        (double) t->cfg.batch,
                 (double) t->cfg.epochs,  (double) t->cfg.opt.kind,
                 t->cfg.sched.base_lr,    (double) t->cfg.sched.kind,
                 (double) t->cfg.shard_n, (double) t->steps_per_epoch};
  double lo[N], hi[N];
  memcpy(lo, v, sizeof v);
  memcpy(hi, v, sizeof v);
  int rc = st_comm_all_reduce(s->comm, group, lo, N, ST_COMM_F64, ST_COMM_MIN,
                              s->timeout_s);
  if (rc == 0)
    rc = st_comm_all_reduce(s->comm, group, hi, N, ST_COMM_F64, ST_COMM_MAX,
                            s->timeout_s);
  if (rc != 0) {
    st_set_err(err, err_len,
               "the first step with the other members failed (every member "
               "of the group must run starling train --sync: --group, "
               "default every member alive): %s",
               st_comm_error(s->comm));
    return rc;
  }
  for (int i = 0; i < N; i++)
    if (names[i] != NULL && lo[i] != hi[i]) {
      st_set_err(err, err_len,
                 "the members disagree on %s (from %.17g to %.17g): run the "
                 "same training flags on every member, each with its own "
                 "--shard K/N",
                 names[i], lo[i], hi[i]);
      return -EINVAL;
    }
  *steps = (size_t) lo[N - 1];
  return 0;
}

/* The group as an explicit list: --group's, or "all" as it stood when the
 * members agreed (so that a node that joins later does not stall
 * training). */
static int freeze_group(st__sync_t* s, const char* group, char* err,
                        size_t err_len) {
  uint32_t rank = 0, size = 0;
  st_comm_last_group(s->comm, &rank, &size);
  member_id_t ids[MAX_MEMBERS];
  size_t n = 0, self = 0;
  int rc = st_comm_members(s->comm, ids, MAX_MEMBERS, &n, &self);
  if (rc == 0 && self < n && self < MAX_MEMBERS)
    memcpy(s->self, ids[self], sizeof(member_id_t));
  if (group == NULL) {
    rc = members_now(s, s->group, &s->size);
    if (rc == 0 && s->size != size)
      rc = -EAGAIN;
    if (rc != 0) {
      st_set_err(err, err_len,
                 "the members changed while the group formed (%u agreed, "
                 "%zu listed now); start again",
                 size, s->size);
      return rc;
    }
  } else {
    s->size = 0;
    for (const char* p = group; *p && s->size < MAX_MEMBERS;) {
      size_t len = strcspn(p, ",");
      snprintf(s->group[s->size++], sizeof(member_id_t), "%.*s", (int) len, p);
      p += len + (p[len] == ',');
    }
    qsort(s->group, s->size, sizeof(member_id_t), cmp_id);
  }
  s->rank = rank;
  group_text(s);
  return 0;
}

int st__sync_open(st__sync_t** out, const char* socket, const char* group,
                  double timeout_s, st_trainer_t* t, FILE* log, char* err,
                  size_t err_len) {
  st__sync_t* s = calloc(1, sizeof(*s));
  if (s == NULL)
    return -ENOMEM;
  s->timeout_s = timeout_s;
  snprintf(s->socket, sizeof s->socket, "%s", socket);
  s->log = log;
  s->t = t;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  *out = s;
  if (t->pool != NULL) {
    st_set_err(err, err_len,
               "--sync and --hogwild are two ways to train; "
               "give one");
    return -EINVAL;
  }
  if (st_backend_kind(t->be) != ST_BACKEND_CPU) {
    s->host = malloc(t->model.n_params * sizeof(float));
    if (s->host == NULL)
      return -ENOMEM;
  }
  int rc = st_comm_open(socket, &s->comm, err, err_len);
  size_t steps = 0;
  if (rc == 0)
    rc = agree(s, group, t, &steps, err, err_len);
  if (rc == 0)
    rc = freeze_group(s, group, err, err_len);
  if (rc != 0)
    return rc;
  if (steps < t->steps_per_epoch) {
    fprintf(log,
            "sync: %zu steps an epoch, as the member with the smallest shard "
            "(this one has %zu)\n",
            steps, t->steps_per_epoch);
    t->steps_per_epoch = steps;
    t->cfg.sched.total_steps = (uint64_t) steps * t->cfg.epochs;
  }
  rc = broadcast_state(s);
  if (rc != 0) {
    st_set_err(err, err_len, "the first broadcast of the parameters failed: %s",
               st_comm_error(s->comm));
    return rc;
  }
  rc = pthread_create(&s->thread, NULL, comm_thread, s);
  if (rc != 0) {
    st_set_err(err, err_len, "cannot start the communication thread: %s",
               strerror(rc));
    return -rc;
  }
  s->started = 1;
  fprintf(log,
          "sync: %zu members (this one rank %zu), the mean gradient every "
          "step in %d buckets (one a layer), rank 0's state to start\n",
          s->size, s->rank, t->model.spec.n_layers);
  return 0;
}

void st__sync_info(const st__sync_t* s, st__sync_stats_t* st) {
  *st = s->stats;
  st->size = s->size;
  st->rank = s->rank;
}

void st__sync_close(st__sync_t* s) {
  if (s == NULL)
    return;
  if (s->started) {
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
  }
  st_comm_close(s->comm);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s->host);
  free(s);
}
