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
 *   --attack step:S    the parameters are left alone, but the program says
 *                      it is at step S (and counts on from there), so its
 *                      node reports, and would hand a joiner, that step.
 *
 * It runs --steps steps, one every --step-us microseconds, and exits 0, or
 * 1 with the library's sentence.
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <math.h>
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
    weight[i] *= -k;
  for (int i = 0; i < C; i++)
    bias[i] *= -k;
  /* Bounded, so that the node never refuses it as non-finite. */
  for (int i = 0; i < C * D; i++)
    weight[i] = fmaxf(-1e3f, fminf(1e3f, weight[i]));
  for (int i = 0; i < C; i++)
    bias[i] = fmaxf(-1e3f, fminf(1e3f, bias[i]));
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
  float v = 0;
  unsigned long long step_from = 0;
  int is_poison = sscanf(attack, "poison:%f", &v) == 1;
  int is_step = !is_poison && sscanf(attack, "step:%llu", &step_from) == 1;
  if (socket == NULL ||
      (!is_poison && !is_step && sscanf(attack, "flip:%f", &v) != 1)) {
    fprintf(stderr,
            "usage: hostile_client --socket PATH "
            "[--attack poison:V|flip:K|step:S] [--steps N] [--step-us U]\n");
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
  uint64_t s = is_step ? step_from : st_client_cluster_step(c);
  printf("attacking (%s) from step %llu\n", attack, (unsigned long long) s);
  fflush(stdout);
  for (unsigned long long k = 0; k < steps; k++) {
    if (is_poison)
      poison(v);
    else if (!is_step)
      flip(v);
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
