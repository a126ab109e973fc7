/* examples/client.c: a complete training program that brings its own model
 * to starling through the client library (starling/client.h,
 * docs/attach.md). It trains a softmax regression (multinomial logistic
 * regression) with its own SGD loop in plain C on synthetic data: C
 * Gaussian clusters in D dimensions, drawn from a fixed seed so that every
 * copy of this program sees the same problem, each training on its own
 * shard of the examples. The local `starling node --attach` averages the
 * parameters with the other nodes' programs between steps.
 *
 * Build it against the installed library:
 *
 *   cc examples/client.c $(pkg-config --cflags --libs starling) -lm -o client
 *
 * and run one per node, each attached to its node's control socket:
 *
 *   ./client --socket DATA_DIR/control.sock --steps 2000 --shard 0/2
 *
 * It prints its progress and final test loss, and exits with 1 and the
 * library's sentence when something goes wrong (no node, another program
 * attached, a model that differs from the cluster's, diverged training).
 * It uses only libc, libm and starling/client.h.
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <starling/client.h>

/* The problem: 4 classes in 16 dimensions, 8192 training examples shared
 * out among the shards and 1024 test examples every copy holds. */
#define D 16
#define C 4
#define N_TRAIN 8192
#define N_TEST 1024
#define SPREAD 0.5 /* of the class means; the noise has unit variance */

/* ---- Data ------------------------------------------------------------------
 */

/* splitmix64: a small seeded generator, the same on every platform. */
static uint64_t next_u64(uint64_t* s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double uniform(uint64_t* s) {
  return (double) (next_u64(s) >> 11) * 0x1.0p-53;
}

static double normal(uint64_t* s) {
  double u = uniform(s), v = uniform(s);
  return sqrt(-2 * log(u > 0 ? u : 1e-300)) * cos(6.283185307179586 * v);
}

typedef struct {
  float* x; /* [n, D] */
  int* y;   /* [n] */
  size_t n;
} dataset_t;

/* Examples first..first+n of the stream seeded by `seed`, keeping those
 * whose index is shard (mod shards). */
static int make_data(dataset_t* ds, const float* means, uint64_t seed, size_t n,
                     unsigned shard, unsigned shards) {
  ds->x = malloc(n * D * sizeof(float));
  ds->y = malloc(n * sizeof(int));
  if (ds->x == NULL || ds->y == NULL)
    return -ENOMEM;
  ds->n = 0;
  uint64_t s = seed;
  for (size_t i = 0; i < n; i++) {
    int y = (int) (next_u64(&s) % C);
    float x[D];
    for (int d = 0; d < D; d++)
      x[d] = means[y * D + d] + (float) normal(&s);
    if (i % shards != shard)
      continue;
    memcpy(ds->x + ds->n * D, x, sizeof x);
    ds->y[ds->n++] = y;
  }
  return 0;
}

/* ---- The model: logits = W x + b, softmax, cross-entropy ------------------
 */

static float weight[C * D]; /* "fc.weight" [C, D] */
static float bias[C];       /* "fc.bias" [C] */

/* Loss of one example; with grad_w/grad_b, adds its gradient there. */
static double example(const float* x, int y, float* grad_w, float* grad_b) {
  double z[C], max = -INFINITY, sum = 0;
  for (int c = 0; c < C; c++) {
    z[c] = bias[c];
    for (int d = 0; d < D; d++)
      z[c] += (double) weight[c * D + d] * x[d];
    if (z[c] > max)
      max = z[c];
  }
  for (int c = 0; c < C; c++)
    sum += exp(z[c] - max);
  if (grad_w != NULL) {
    for (int c = 0; c < C; c++) {
      double g = exp(z[c] - max) / sum - (c == y);
      grad_b[c] += (float) g;
      for (int d = 0; d < D; d++)
        grad_w[c * D + d] += (float) (g * x[d]);
    }
  }
  return log(sum) + max - z[y];
}

static int predict(const float* x) {
  int best = 0;
  double best_z = -INFINITY;
  for (int c = 0; c < C; c++) {
    double z = bias[c];
    for (int d = 0; d < D; d++)
      z += (double) weight[c * D + d] * x[d];
    if (z > best_z) {
      best_z = z;
      best = c;
    }
  }
  return best;
}

static void evaluate(const dataset_t* ds, double* loss, double* accuracy) {
  double total = 0;
  size_t right = 0;
  for (size_t i = 0; i < ds->n; i++) {
    total += example(ds->x + i * D, ds->y[i], NULL, NULL);
    right += predict(ds->x + i * D) == ds->y[i];
  }
  *loss = total / (double) ds->n;
  *accuracy = (double) right / (double) ds->n;
}

/* One SGD step on a minibatch of `batch` examples drawn from ds. Returns
 * the batch's mean loss. */
static double sgd_step(const dataset_t* ds, size_t batch, double lr,
                       uint64_t* rng) {
  float gw[C * D] = {0}, gb[C] = {0};
  double loss = 0;
  for (size_t k = 0; k < batch; k++) {
    size_t i = (size_t) (next_u64(rng) % ds->n);
    loss += example(ds->x + i * D, ds->y[i], gw, gb);
  }
  float scale = (float) (lr / (double) batch);
  for (int j = 0; j < C * D; j++)
    weight[j] -= scale * gw[j];
  for (int c = 0; c < C; c++)
    bias[c] -= scale * gb[c];
  return loss / (double) batch;
}

/* ---- The program -----------------------------------------------------------
 */

typedef struct {
  const char* socket;
  unsigned long long steps;
  unsigned shard, shards;
  double lr;
  size_t batch;
  unsigned long long seed;
  int reconnect;
  unsigned long long step_us; /* extra time per step: a bigger model */
} args_t;

static void usage(FILE* f) {
  fprintf(f,
          "usage: client --socket PATH [--steps N] [--shard K/N] [--lr X]\n"
          "              [--batch B] [--seed S] [--step-us U] [--reconnect]\n"
          "Trains a softmax regression on synthetic data through the local\n"
          "`starling node --attach` whose control socket is PATH\n"
          "(DATA_DIR/control.sock).\n"
          "  --steps N     train until step N (default 2000)\n"
          "  --shard K/N   train on shard K of N of the examples (default "
          "0/1)\n"
          "  --lr X        learning rate (default 0.1)\n"
          "  --batch B     examples per step (default 32)\n"
          "  --seed S      the problem's seed; the same on every node "
          "(default 1)\n"
          "  --step-us U   spend U more microseconds on every step (a bigger "
          "model)\n"
          "  --reconnect   wait for the node to come back if it goes away\n");
}

static int parse_args(int argc, char** argv, args_t* a) {
  *a = (args_t){NULL, 2000, 0, 1, 0.1, 32, 1, 0, 0};
  for (int i = 1; i < argc; i++) {
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    char* end = NULL;
    if (strcmp(argv[i], "--reconnect") == 0) {
      a->reconnect = 1;
      continue;
    }
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      exit(0);
    }
    if (v == NULL)
      goto bad;
    i++;
    if (strcmp(argv[i - 1], "--socket") == 0)
      a->socket = v;
    else if (strcmp(argv[i - 1], "--steps") == 0)
      a->steps = strtoull(v, &end, 10);
    else if (strcmp(argv[i - 1], "--shard") == 0) {
      if (sscanf(v, "%u/%u", &a->shard, &a->shards) != 2 || a->shards == 0 ||
          a->shard >= a->shards)
        goto bad;
    } else if (strcmp(argv[i - 1], "--lr") == 0)
      a->lr = strtod(v, &end);
    else if (strcmp(argv[i - 1], "--batch") == 0)
      a->batch = (size_t) strtoull(v, &end, 10);
    else if (strcmp(argv[i - 1], "--seed") == 0)
      a->seed = strtoull(v, &end, 10);
    else if (strcmp(argv[i - 1], "--step-us") == 0)
      a->step_us = strtoull(v, &end, 10);
    else
      goto bad;
    if (end != NULL && (*end != '\0' || end == v))
      goto bad;
  }
  if (a->socket != NULL && a->batch > 0 && a->lr > 0)
    return 0;
bad:
  usage(stderr);
  return 2;
}

/* Trains from the cluster's step to args->steps. Returns 0 or 1. */
static int train(st_client_t* c, const args_t* a, const dataset_t* tr,
                 const dataset_t* te) {
  uint64_t rng = a->seed * 1000003u + a->shard;
  uint64_t s = st_client_cluster_step(c);
  double loss, acc;
  evaluate(te, &loss, &acc);
  printf(
      "training from step %llu to %llu on shard %u/%u (%zu examples); "
      "test loss %.4f accuracy %.3f\n",
      (unsigned long long) s, a->steps, a->shard, a->shards, tr->n, loss, acc);
  while (s < a->steps) {
    loss = sgd_step(tr, a->batch, a->lr, &rng);
    if (a->step_us > 0) {
      struct timespec ts = {(time_t) (a->step_us / 1000000),
                            (long) (a->step_us % 1000000) * 1000};
      nanosleep(&ts, NULL);
    }
    int rc = st_client_step(c, ++s);
    if (rc < 0) {
      fprintf(stderr, "client: step %llu: %s\n", (unsigned long long) s,
              st_client_error(c));
      return 1;
    }
    if (rc & ST_CLIENT_DID_STATE) {
      s = st_client_cluster_step(c);
      printf("took the node's parameters (step %llu)\n",
             (unsigned long long) s);
    }
    if (s % 200 == 0) {
      double test_loss;
      evaluate(te, &test_loss, &acc);
      st_client_report(c, test_loss, acc);
      printf("step %6llu  batch loss %.4f  test loss %.4f  accuracy %.3f\n",
             (unsigned long long) s, loss, test_loss, acc);
      fflush(stdout);
    }
  }
  return 0;
}

/* After training (rc 0) or a failure: the final figures, and the detach,
 * which hands the node the last parameters. Nothing when c is NULL. */
static void finish(st_client_t* c, int rc, const dataset_t* te) {
  if (c == NULL)
    return;
  double loss, acc;
  evaluate(te, &loss, &acc);
  st_client_report(c, loss, acc);
  if (rc == 0)
    printf("final loss %.4f accuracy %.3f\n", loss, acc);
  if (st_client_detach(c) != 0 && rc == 0)
    fprintf(stderr, "client: the node had gone away before the detach\n");
}

int main(int argc, char** argv) {
  args_t a;
  int rc = parse_args(argc, argv, &a);
  if (rc != 0)
    return rc;
  /* The problem, the same for every copy: the class means, then the
   * examples (this shard's) and the test set. */
  float means[C * D];
  uint64_t s = a.seed;
  for (int j = 0; j < C * D; j++)
    means[j] = (float) (SPREAD * normal(&s));
  dataset_t train_set, test_set;
  memset(&test_set, 0, sizeof(test_set));
  if (make_data(&train_set, means, a.seed + 1, N_TRAIN, a.shard, a.shards) ||
      make_data(&test_set, means, a.seed + 2, N_TEST, 0, 1)) {
    fprintf(stderr, "client: out of memory\n");
    free(train_set.x);
    free(train_set.y);
    free(test_set.x);
    free(test_set.y);
    return 1;
  }
  /* Zeros: softmax regression needs no symmetry breaking, and a program
   * that is not the first takes the cluster's parameters anyway. */
  st_client_tensor_t t[] = {{"fc.weight", ST_CLIENT_F32, 2, {C, D}, weight},
                            {"fc.bias", ST_CLIENT_F32, 1, {C}, bias}};
  st_client_options_t o;
  st_client_options_default(&o);
  o.socket_path = a.socket;
  o.reconnect = a.reconnect;
  st_client_t* c = NULL;
  char err[512];
  rc = st_client_attach(&o, t, 2, &c, err, sizeof err);
  if (rc != 0)
    fprintf(stderr, "client: %s\n", err);
  else
    rc = train(c, &a, &train_set, &test_set) != 0 ? 1 : 0;
  finish(c, rc, &test_set);
  free(train_set.x);
  free(train_set.y);
  free(test_set.x);
  free(test_set.y);
  return rc != 0 ? 1 : 0;
}