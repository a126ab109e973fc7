/* outer.c: the outer optimizer of averaging (--outer; issue #16): the
 * setting, its canonical name, and the Nesterov step a node takes on the
 * mean of a ring round, or (noloco) of a gossip exchange (optimizer.h, "The
 * outer optimizer of averaging"; docs/compression.md, "The outer optimizer").
 */
#include "optimizer/optimizer.h"

#include <errno.h>
#include <string.h>

#include "base/base.h"

void st_outer_spec_default(st_outer_spec_t* spec) {
  spec->kind = ST_OUTER_NONE;
  spec->lr_ppm = ST_OUTER_LR_DEFAULT_PPM;
  spec->momentum_ppm = ST_OUTER_MOMENTUM_DEFAULT_PPM;
}

int st_outer_parse_kind(const char* text, st_outer_spec_t* spec, char* err,
                        size_t err_len) {
  if (text != NULL && strcmp(text, "none") == 0) {
    spec->kind = ST_OUTER_NONE;
    return 0;
  }
  if (text != NULL && strcmp(text, "nesterov") == 0) {
    spec->kind = ST_OUTER_NESTEROV;
    return 0;
  }
  if (text != NULL && strcmp(text, "noloco") == 0) {
    spec->kind = ST_OUTER_NOLOCO;
    return 0;
  }
  st_set_err(err, err_len,
             "outer optimizer '%s' is unknown; use none (plain averaging), "
             "nesterov or noloco",
             text != NULL ? text : "");
  return -EINVAL;
}

/* A decimal into *out millionths, within [min, max]; else -EINVAL with
 * "outer WHAT 'TEXT' is not a decimal in RANGE ..." in err. */
static int parse_setting(const char* text, uint64_t min, uint64_t max,
                         const char* what, const char* range,
                         const char* diloco, uint32_t* out, char* err,
                         size_t err_len) {
  uint64_t v;
  if (st_parse_millionths(text, max, &v) != 0 || v < min) {
    st_set_err(err, err_len,
               "outer %s '%s' is not a decimal in %s with at most 6 decimals "
               "(DiLoCo's is %s)",
               what, text != NULL ? text : "", range, diloco);
    return -EINVAL;
  }
  *out = (uint32_t) v;
  return 0;
}

int st_outer_parse_lr(const char* text, st_outer_spec_t* spec, char* err,
                      size_t err_len) {
  return parse_setting(text, 1, ST_OUTER_LR_MAX_PPM, "learning rate", "(0, 4]",
                       "0.7", &spec->lr_ppm, err, err_len);
}

int st_outer_parse_momentum(const char* text, st_outer_spec_t* spec, char* err,
                            size_t err_len) {
  return parse_setting(text, 0, ST_OUTER_MOMENTUM_MAX_PPM, "momentum", "[0, 1)",
                       "0.9", &spec->momentum_ppm, err, err_len);
}

int st_outer_name(const st_outer_spec_t* spec, char* buf, size_t len) {
  if (spec == NULL || buf == NULL)
    return -EINVAL;
  if (spec->kind == ST_OUTER_NONE) {
    if (len < sizeof "none")
      return -ENOSPC;
    memcpy(buf, "none", sizeof "none");
    return 0;
  }
  if ((spec->kind != ST_OUTER_NESTEROV && spec->kind != ST_OUTER_NOLOCO) ||
      spec->lr_ppm == 0 || spec->lr_ppm > ST_OUTER_LR_MAX_PPM ||
      spec->momentum_ppm > ST_OUTER_MOMENTUM_MAX_PPM)
    return -EINVAL;
  char lr[24], mom[24], tmp[64];
  st_format_millionths(spec->lr_ppm, lr, sizeof lr);
  st_format_millionths(spec->momentum_ppm, mom, sizeof mom);
  int w =
      snprintf(tmp, sizeof tmp, "%s:%s:%s",
               spec->kind == ST_OUTER_NOLOCO ? "noloco" : "nesterov", lr, mom);
  if (w < 0 || (size_t) w + 1 > len)
    return -ENOSPC;
  memcpy(buf, tmp, (size_t) w + 1);
  return 0;
}

void st_outer_step(const st_outer_spec_t* spec, float* anchor, float* m,
                   const float* mean, float* delta, size_t n) {
  const float lr = (float) spec->lr_ppm / 1e6f;
  const float mu = (float) spec->momentum_ppm / 1e6f;
  for (size_t i = 0; i < n; i++) {
    float g = anchor[i] - mean[i];
    float mi = mu * m[i] + g;
    float next = anchor[i] - lr * (g + mu * mi);
    m[i] = mi;
    delta[i] += next - mean[i];
    anchor[i] = next;
  }
}

void st_outer_step_own(const st_outer_spec_t* spec, float* anchor, float* m,
                       const float* own, float* delta, size_t n) {
  const float lr = (float) spec->lr_ppm / 1e6f;
  const float mu = (float) spec->momentum_ppm / 1e6f;
  for (size_t i = 0; i < n; i++) {
    float mean = own[i] + delta[i];
    float g = anchor[i] - mean;
    float mi = mu * m[i] + g;
    float next = anchor[i] - lr * (g + mu * mi);
    m[i] = mi;
    delta[i] = next - own[i];
    anchor[i] = next;
  }
}
