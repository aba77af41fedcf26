/* optim/scalar_impl.h — the scalar reference of every optimizer, one element
 * at a time: the per-element math (the fp16/bf16 conversions are core's,
 * core/dtype.h).
 * kern_scalar.c is built from it, and the SIMD kernels use it for their tails,
 * so it spells out every fused multiply-add the vector code performs.
 */
#ifndef FERRY_OPTIM_SCALAR_IMPL_H
#define FERRY_OPTIM_SCALAR_IMPL_H

#include "core/dtype.h"
#include "optim/optim.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* sign(x) with sign(0) = 0 and NaN kept. */
static inline float optim_sign(float x) {
  if (x > 0.0f) return 1.0f;
  if (x < 0.0f) return -1.0f;
  return x == 0.0f ? 0.0f : x;
}

/* Adam's denominator: sqrt(v) / sqrt(1 - beta2^t) + eps. */
static inline float optim_adam_denom(const optim_scalars *s, float v) {
  return fmaf(sqrtf(v), s->inv_sqrt_bc2, s->eps);
}

/* LAMB's update direction: m_hat / (sqrt(v_hat) + eps) + wd p. */
static inline float optim_lamb_u(const optim_scalars *s, float p, float m, float v) {
  return fmaf(s->wd, p, (m * s->inv_bc1) / optim_adam_denom(s, v));
}

/* One element of every optimizer but LAMB phase 1. g is already scaled. */
static inline void optim_elem(const optim_scalars *s, float g, float *pp, float *pm, float *pv) {
  float p = *pp, m = *pm, v = *pv;
  switch (s->type) {
  case FERRY_OPTIM_ADAM: g = fmaf(s->wd, p, g); /* fall through */
  case FERRY_OPTIM_ADAMW:
    m = fmaf(s->beta1, m, s->omb1 * g);
    v = fmaf(s->beta2, v, (s->omb2 * g) * g);
    p = p * s->decay;
    p = fmaf(s->neg_step, m / optim_adam_denom(s, v), p);
    break;
  case FERRY_OPTIM_ADAGRAD:
    g = fmaf(s->wd, p, g);
    m = fmaf(g, g, m);
    p = fmaf(s->neg_step, g / (sqrtf(m) + s->eps), p);
    break;
  case FERRY_OPTIM_SGD:
    g = fmaf(s->wd, p, g);
    if (s->sgd_momentum) {
      m = fmaf(s->mom_c, m, s->damp_c * g);
      g = s->nesterov ? fmaf(s->beta1, m, g) : m;
    }
    p = fmaf(s->neg_step, g, p);
    break;
  case FERRY_OPTIM_LION: {
    float c = fmaf(s->beta1, m, s->omb1 * g);
    p = p * s->decay;
    p = fmaf(s->neg_step, optim_sign(c), p);
    m = fmaf(s->beta2, m, s->omb2 * g);
    break;
  }
  case FERRY_OPTIM_LAMB:                                /* phase 2: m and v are already updated */
    p = fmaf(s->neg_step, optim_lamb_u(s, p, m, v), p); /* neg_step: -lr x trust */
    break;
  default: break;
  }
  *pp = p;
  *pm = m;
  *pv = v;
}

/* The reference step over elements [b, e) of a tile. */
static inline void optim_ref_step_range(const optim_scalars *s, const optim_tile *t, size_t b,
                                        size_t e) {
  int has1 = t->s1 != NULL, has2 = t->s2 != NULL, lamb = s->type == FERRY_OPTIM_LAMB;
  optim_scalars ls = *s;
  if (lamb) ls.neg_step = s->neg_step * t->trust;
  for (size_t i = b; i < e; i++) {
    float g = ferry_dt_load(t->g, t->gdt, i) * s->gscale;
    float p = t->p[i];
    float m = has1 ? ferry_dt_load(t->s1, t->sdt, i) : 0.0f;
    float v = has2 ? ferry_dt_load(t->s2, t->sdt, i) : 0.0f;
    optim_elem(&ls, g, &p, &m, &v);
    t->p[i] = p;
    if (has1 && !lamb) ferry_dt_store(t->s1, t->sdt, i, m);
    if (has2 && !lamb) ferry_dt_store(t->s2, t->sdt, i, v);
    if (t->cdt != FERRY_DT_NONE) ferry_dt_store(t->pc, t->cdt, i, p);
  }
}

/* LAMB phase 1 over [b, e): m, v updated, sums of p^2 and u^2 added. */
static inline void optim_ref_lamb1_range(const optim_scalars *s, const optim_tile *t, size_t b,
                                         size_t e, double *psq, double *usq) {
  double ps = 0, us = 0;
  for (size_t i = b; i < e; i++) {
    float g = ferry_dt_load(t->g, t->gdt, i) * s->gscale;
    float p = t->p[i];
    float m = ferry_dt_load(t->s1, t->sdt, i), v = ferry_dt_load(t->s2, t->sdt, i);
    m = fmaf(s->beta1, m, s->omb1 * g);
    v = fmaf(s->beta2, v, (s->omb2 * g) * g);
    ferry_dt_store(t->s1, t->sdt, i, m);
    ferry_dt_store(t->s2, t->sdt, i, v);
    /* phase 2 reads the stored (possibly bf16-rounded) states: use them */
    m = ferry_dt_load(t->s1, t->sdt, i);
    v = ferry_dt_load(t->s2, t->sdt, i);
    float u = optim_lamb_u(s, p, m, v);
    ps += (double)p * p;
    us += (double)u * u;
  }
  *psq += ps;
  *usq += us;
}

static inline double optim_ref_sumsq_range(const void *g, int dt, size_t b, size_t e) {
  double acc = 0;
  for (size_t i = b; i < e; i++) {
    double x = ferry_dt_load(g, dt, i);
    acc += x * x;
  }
  return acc;
}

static inline void optim_ref_accumulate_range(float *acc, const void *g, int dt, size_t b, size_t e,
                                              float scale) {
  for (size_t i = b; i < e; i++)
    acc[i] = fmaf(ferry_dt_load(g, dt, i), scale, acc[i]);
}

#endif /* FERRY_OPTIM_SCALAR_IMPL_H */
