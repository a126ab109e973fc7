/* hostile_client.c: a malicious member for the robust-averaging tests. It
 * attaches to its `starling node --attach` like examples/client.c (the same
 * tensor list: fc.weight [4, 16], fc.bias [4]), so its node joins the
 * cluster as a member in good standing, and then serves the cluster a
 * poisoned model through the real system: after every step it overwrites
 * the parameters the node handed back, so every averaging exchange pulls
 * the peer towards the poison.
 *
 *   --attack poison:V  every step, the parameters are a model that puts
 *                      every example in class 0: row 0 of the weights and
 *                      bias 0 are V, the rest 0 (finite, and of a norm the
 *                      norm guard lets through for V of a few units);
 *   --attack flip:K    every step, the parameters are -K times what the
 *                      node gave back (a sign-flipped, scaled model; each
 *                      exchange pulls its peer away from the consensus);
 *   --attack noise:S   every step, Gaussian noise of standard deviation S
 *                      is added to what the node gave back;
 *   --attack stale     every step, the parameters are put back to what the
 *                      node handed over at attach (a model that never
 *                      learns: the cluster's state when it came);
 *   --attack nan:P     with probability P a step, every parameter is NaN
 *                      (bursts of non-finite values; else left alone);
 *   --attack lie:Z     "a little is enough" (Baruch et al., NeurIPS 2019):
 *                      every step, the parameters are what the node gave
 *                      back moved Z times the typical size of the
 *                      cluster's per-step movement, coordinate by
 *                      coordinate, against the direction the cluster
 *                      moves (both as moving averages of what the node
 *                      hands back): a pull small enough to look like an
 *                      honest member's, always the same way;
 *   --attack step:S    the parameters are left alone, but the program says
 *                      it is at step S (and counts on from there), so its
 *                      node reports, and would hand a joiner, that step.
 *
 * It runs --steps steps, one every --step-us microseconds, and exits 0, or
 * 1 with the library's sentence.
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <starling/client.h>

#define D 16
#define C 4

static float weight[C * D], bias[C];

static void poison(float v) {
  memset(weight, 0, sizeof weight);
  memset(bias, 0, sizeof bias);
  for (int j = 0; j < D; j++)
    weight[j] = v;
  bias[0] = v;
}

static void flip(float k) {
  for (int i = 0; i < C * D; i++)
    weight[i] = fmaxf(-1e3f, fminf(1e3f, -k * weight[i]));
  for (int i = 0; i < C; i++)
    bias[i] = fmaxf(-1e3f, fminf(1e3f, -k * bias[i]));
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static double uniform(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17; /* xorshift64 */
  return (double) (rng >> 11) * 0x1.0p-53;
}

static void noise(float sd) {
  for (int i = 0; i < C * D + C; i++) {
    double u = uniform(), w = uniform();
    float z = (float) (sqrt(-2 * log(u > 0 ? u : 1e-300)) *
                       cos(6.283185307179586 * w));
    *(i < C * D ? &weight[i] : &bias[i - C * D]) += sd * z;
  }
}

typedef struct {
  char kind; /* p poison, f flip, n noise, s stale, x nan, t step, l lie */
  float v;
  unsigned long long step_from;
  float saved[C * D + C]; /* stale: the parameters at attach */
  /* lie: what the node gave back last, and per coordinate the moving
   * averages (1/16) of its movement and of that movement's size. */
  float last[C * D + C], drift[C * D + C], size[C * D + C];
  bool have_last;
} attack_t;

static float* param(int i) {
  return i < C * D ? &weight[i] : &bias[i - C * D];
}

/* lie:Z: moves each coordinate Z typical steps against the cluster's
 * direction of motion. */
static void lie(attack_t* at) {
  for (int i = 0; i < C * D + C; i++) {
    float given = *param(i);
    if (at->have_last) {
      float d = given - at->last[i];
      at->drift[i] += (d - at->drift[i]) / 16;
      at->size[i] += (fabsf(d) - at->size[i]) / 16;
    }
    at->last[i] = given;
    float dir = at->drift[i] > 0 ? 1.0f : at->drift[i] < 0 ? -1.0f : 0.0f;
    *param(i) = given - at->v * at->size[i] * dir;
  }
  at->have_last = true;
}

static int parse_attack(const char* a, attack_t* at) {
  memset(at, 0, sizeof *at);
  if (sscanf(a, "poison:%f", &at->v) == 1)
    at->kind = 'p';
  else if (sscanf(a, "flip:%f", &at->v) == 1)
    at->kind = 'f';
  else if (sscanf(a, "noise:%f", &at->v) == 1)
    at->kind = 'n';
  else if (strcmp(a, "stale") == 0)
    at->kind = 's';
  else if (sscanf(a, "nan:%f", &at->v) == 1)
    at->kind = 'x';
  else if (sscanf(a, "step:%llu", &at->step_from) == 1)
    at->kind = 't';
  else if (sscanf(a, "lie:%f", &at->v) == 1)
    at->kind = 'l';
  return at->kind != 0 ? 0 : -1;
}

/* The attack's parameters for one step, written over what the node gave. */
static void attack_step(attack_t* at) {
  switch (at->kind) {
    case 'p':
      poison(at->v);
      break;
    case 'f':
      flip(at->v);
      break;
    case 'n':
      noise(at->v);
      break;
    case 's':
      memcpy(weight, at->saved, sizeof weight);
      memcpy(bias, at->saved + C * D, sizeof bias);
      break;
    case 'x':
      if (uniform() < at->v)
        for (int i = 0; i < C * D; i++)
          weight[i] = NAN;
      break;
    case 'l':
      lie(at);
      break;
  }
}

int main(int argc, char** argv) {
  const char* socket = NULL;
  const char* attack = "poison:4";
  unsigned long long steps = 1000, step_us = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--socket") == 0)
      socket = argv[i + 1];
    else if (strcmp(argv[i], "--attack") == 0)
      attack = argv[i + 1];
    else if (strcmp(argv[i], "--steps") == 0)
      steps = strtoull(argv[i + 1], NULL, 10);
    else if (strcmp(argv[i], "--step-us") == 0)
      step_us = strtoull(argv[i + 1], NULL, 10);
  }
  attack_t at;
  if (socket == NULL || parse_attack(attack, &at) != 0) {
    fprintf(stderr,
            "usage: hostile_client --socket PATH [--attack poison:V|flip:K|"
            "noise:S|stale|nan:P|step:S|lie:Z] [--steps N] [--step-us U]\n");
    return 2;
  }
  st_client_tensor_t t[] = {{"fc.weight", ST_CLIENT_F32, 2, {C, D}, weight},
                            {"fc.bias", ST_CLIENT_F32, 1, {C}, bias}};
  st_client_options_t o;
  st_client_options_default(&o);
  o.socket_path = socket;
  st_client_t* c = NULL;
  char err[512];
  if (st_client_attach(&o, t, 2, &c, err, sizeof err) != 0) {
    fprintf(stderr, "hostile_client: %s\n", err);
    return 1;
  }
  memcpy(at.saved, weight, sizeof weight);
  memcpy(at.saved + C * D, bias, sizeof bias);
  uint64_t s = at.kind == 't' ? at.step_from : st_client_cluster_step(c);
  printf("attacking (%s) from step %llu\n", attack, (unsigned long long) s);
  fflush(stdout);
  for (unsigned long long k = 0; k < steps; k++) {
    attack_step(&at);
    struct timespec ts = {(time_t) (step_us / 1000000),
                          (long) (step_us % 1000000) * 1000};
    nanosleep(&ts, NULL);
    if (st_client_step(c, ++s) < 0) {
      fprintf(stderr, "hostile_client: %s\n", st_client_error(c));
      return 1;
    }
  }
  st_client_detach(c);
  printf("done\n");
  return 0;
}
