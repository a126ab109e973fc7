/* optim.c: the optimizers over a flat parameter buffer: SGD, heavy-ball
 * momentum, Nesterov momentum (both as PyTorch's torch.optim.SGD defines
 * them) and AdamW (Loshchilov & Hutter, "Decoupled Weight Decay
 * Regularization", 2019), with optional gradient-norm clipping
 * (Pascanu et al., 2013) applied to the whole buffer before the update.
 *
 * The arithmetic lives in kernels/ (one fused update kernel per optimizer,
 * on either backend); this file owns the state buffers and the step count.
 */
#include "optimizer/optimizer.h"

#include <errno.h>
#include <math.h>
#include <string.h>

static const char* const kind_names[] = {"sgd", "momentum", "nesterov",
                                         "adamw"};

void st_opt_config_default(st_opt_config_t* cfg) {
  memset(cfg, 0, sizeof(*cfg));
  cfg->kind = ST_OPT_SGD;
  cfg->momentum = 0.9f;
  cfg->beta1 = 0.9f;
  cfg->beta2 = 0.999f;
  cfg->eps = 1e-8f;
}

int st_opt_kind_parse(const char* s, st_opt_kind_t* kind) {
  for (int i = 0; i < 4; i++) {
    if (strcmp(s, kind_names[i]) == 0) {
      *kind = (st_opt_kind_t) i;
      return 0;
    }
  }
  return -EINVAL;
}

const char* st_opt_kind_name(st_opt_kind_t kind) {
  return (unsigned) kind < 4 ? kind_names[kind] : "unknown";
}

int st_optim_init(st_optim_t* o, st_backend_t* be, const st_opt_config_t* cfg,
                  size_t n) {
  memset(o, 0, sizeof(*o));
  if ((unsigned) cfg->kind > ST_OPT_ADAMW || cfg->clip_norm < 0 ||
      cfg->weight_decay < 0)
    return -EINVAL;
  o->be = be;
  o->cfg = *cfg;
  o->n = n;
  int rc = 0;
  if (cfg->kind != ST_OPT_SGD)
    rc = st_buf_alloc(be, n, &o->m);
  if (rc == 0 && cfg->kind == ST_OPT_ADAMW)
    rc = st_buf_alloc(be, n, &o->v);
  if (rc != 0)
    st_optim_close(o);
  return rc;
}

void st_optim_close(st_optim_t* o) {
  if (o->be == NULL)
    return;
  st_buf_free(o->be, o->m);
  st_buf_free(o->be, o->v);
  memset(o, 0, sizeof(*o));
}

int st_optim_step(st_optim_t* o, float* params, float* grads, float lr,
                  double* grad_norm) {
  const st_opt_config_t* c = &o->cfg;
  int rc;
  if (c->clip_norm > 0 || grad_norm != NULL) {
    double sumsq = 0;
    rc = st_sumsq(o->be, grads, o->n, &sumsq);
    if (rc != 0)
      return rc;
    double norm = sqrt(sumsq);
    if (grad_norm != NULL)
      *grad_norm = norm;
    /* Scale by clip/norm when the norm exceeds the threshold (a non-finite
     * norm is left for the caller to detect: scaling cannot repair it). */
    if (c->clip_norm > 0 && isfinite(norm) && norm > c->clip_norm) {
      rc = st_axpby(o->be, o->n, 0.0f, grads, (float) (c->clip_norm / norm),
                    grads);
      if (rc != 0)
        return rc;
    }
  }
  o->t++;
  switch (c->kind) {
    case ST_OPT_SGD:
      return st_sgd_update(o->be, params, grads, o->n, lr, c->weight_decay);
    case ST_OPT_MOMENTUM:
    case ST_OPT_NESTEROV:
      return st_momentum_update(o->be, params, grads, o->m, o->n, lr,
                                c->momentum, c->weight_decay,
                                c->kind == ST_OPT_NESTEROV);
    case ST_OPT_ADAMW: {
      double bc1 = 1.0 - pow((double) c->beta1, (double) o->t);
      double bc2 = 1.0 - pow((double) c->beta2, (double) o->t);
      return st_adamw_update(o->be, params, grads, o->m, o->v, o->n, lr,
                             c->beta1, c->beta2, c->eps, c->weight_decay,
                             (float) bc1, (float) bc2);
    }
  }
  return -EINVAL;
}
