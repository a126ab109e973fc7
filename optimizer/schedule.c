/* schedule.c: learning-rate schedules, evaluated per update step.
 *
 * constant: base_lr.
 * step:     base_lr * gamma^floor(s / step_every) (PyTorch's StepLR).
 * cosine:   min_lr + (base_lr - min_lr) * (1 + cos(pi * s / span)) / 2 over
 *           span = total_steps - warmup_steps, then min_lr (SGDR, Loshchilov
 *           & Hutter 2017, without restarts; PyTorch's CosineAnnealingLR).
 * Each may start with a linear warm-up (Goyal et al. 2017): update k of the
 * first warmup_steps uses base_lr * (k + 1) / warmup_steps, and s above
 * counts steps after the warm-up.
 */
#include "optimizer/optimizer.h"

#include <errno.h>
#include <math.h>
#include <string.h>

static const char* const sched_names[] = {"constant", "step", "cosine"};

int st_sched_kind_parse(const char* s, st_sched_kind_t* kind) {
  for (int i = 0; i < 3; i++) {
    if (strcmp(s, sched_names[i]) == 0) {
      *kind = (st_sched_kind_t) i;
      return 0;
    }
  }
  return -EINVAL;
}

const char* st_sched_kind_name(st_sched_kind_t kind) {
  return (unsigned) kind < 3 ? sched_names[kind] : "unknown";
}

double st_schedule_lr(const st_schedule_t* s, uint64_t step) {
  if (step < s->warmup_steps)
    return s->base_lr * (double) (step + 1) / (double) s->warmup_steps;
  uint64_t after = step - s->warmup_steps;
  switch (s->kind) {
    case ST_SCHED_CONSTANT:
      return s->base_lr;
    case ST_SCHED_STEP:
      if (s->step_every == 0)
        return s->base_lr;
      return s->base_lr * pow(s->gamma, (double) (after / s->step_every));
    case ST_SCHED_COSINE: {
      uint64_t span = s->total_steps > s->warmup_steps
                          ? s->total_steps - s->warmup_steps
                          : 0;
      if (span == 0 || after >= span)
        return s->min_lr;
      double c = cos(M_PI * (double) after / (double) span);
      return s->min_lr + (s->base_lr - s->min_lr) * 0.5 * (1.0 + c);
    }
  }
  return s->base_lr;
}
