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
#include "optim/quant_impl.h"

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

/* The master of element i: fp32, or a bf16 param. */
static inline float optim_p_load(const optim_tile *t, size_t i) {
  if (t->mdt == FERRY_DT_BF16) return ferry_bf16_to_f32(((const uint16_t *)t->p)[i]);
  return ((const float *)t->p)[i];
}
/* Stores the new master of element i: bf16 with stochastic rounding keyed by
 * (seed, step, t->index + i). */
static inline void optim_p_store(const optim_scalars *s, const optim_tile *t, size_t i, float p) {
  if (t->mdt == FERRY_DT_BF16) {
    uint64_t idx = t->index + i;
    uint32_t r = optim_sr_bits(optim_sr_hikey(s->sr_key, idx), idx);
    ((uint16_t *)t->p)[i] = optim_bf16_sr(p, r);
  } else {
    ((float *)t->p)[i] = p;
  }
}

/* The reference step over elements [b, e) of a tile (fp32 or bf16 states). */
static inline void optim_ref_step_range(const optim_scalars *s, const optim_tile *t, size_t b,
                                        size_t e) {
  int has1 = t->s1 != NULL, has2 = t->s2 != NULL, lamb = s->type == FERRY_OPTIM_LAMB;
  optim_scalars ls = *s;
  if (lamb) ls.neg_step = s->neg_step * t->trust;
  for (size_t i = b; i < e; i++) {
    float g = ferry_dt_load(t->g, t->gdt, i) * s->gscale;
    float p = optim_p_load(t, i);
    float m = has1 ? ferry_dt_load(t->s1, t->sdt, i) : 0.0f;
    float v = has2 ? ferry_dt_load(t->s2, t->sdt, i) : 0.0f;
    optim_elem(&ls, g, &p, &m, &v);
    optim_p_store(s, t, i, p);
    if (has1 && !lamb) ferry_dt_store(t->s1, t->sdt, i, m);
    if (has2 && !lamb) ferry_dt_store(t->s2, t->sdt, i, v);
    if (t->cdt != FERRY_DT_NONE) ferry_dt_store(t->pc, t->cdt, i, p);
  }
}

/* Int8 states (AdamW, Adam, Lion), pass 1 over [b, e) of one block whose
 * absmax are A1, A2: dequantize, update m, v in fp32 (not stored), raise the
 * running max of the finite |m|, |v| and flag non-finite values. */
static inline void optim_ref_q_pass1(const optim_scalars *s, const optim_tile *t, size_t b,
                                     size_t e, float A1, float A2, float *mx1, float *mx2,
                                     int *bad1, int *bad2) {
  const uint8_t *c1 = (const uint8_t *)t->s1, *c2 = (const uint8_t *)t->s2;
  for (size_t i = b; i < e; i++) {
    float g = ferry_dt_load(t->g, t->gdt, i) * s->gscale;
    float p = optim_p_load(t, i);
    float m = optim_q_dec_s(c1[i], A1), v = c2 ? optim_q_dec_u(c2[i], A2) : 0.0f;
    optim_elem(s, g, &p, &m, &v);
    float am = fabsf(m), av = fabsf(v);
    if (optim_q_finite(am))
      *mx1 = am > *mx1 ? am : *mx1;
    else
      *bad1 = 1;
    if (optim_q_finite(av))
      *mx2 = av > *mx2 ? av : *mx2;
    else
      *bad2 = 1;
  }
}

/* Pass 2 over [b, e): the same fp32 m', v' again, the param updated from
 * them, the codes written with the new absmax (inverses i1, i2; 0: finite
 * values code 0), inf and NaN with their own codes. */
static inline void optim_ref_q_pass2(const optim_scalars *s, const optim_tile *t, size_t b,
                                     size_t e, float A1, float A2, float i1, float i2) {
  uint8_t *c1 = (uint8_t *)t->s1, *c2 = (uint8_t *)t->s2;
  for (size_t i = b; i < e; i++) {
    float g = ferry_dt_load(t->g, t->gdt, i) * s->gscale;
    float p = optim_p_load(t, i);
    float m = optim_q_dec_s(c1[i], A1), v = c2 ? optim_q_dec_u(c2[i], A2) : 0.0f;
    optim_elem(s, g, &p, &m, &v);
    optim_p_store(s, t, i, p);
    if (t->cdt != FERRY_DT_NONE) ferry_dt_store(t->pc, t->cdt, i, p);
    c1[i] = optim_q_put_s(m, i1);
    if (c2) c2[i] = optim_q_put_u(v, i2);
  }
}

/* One int8 block [b, e) of a tile (b at a block start), its absmax at slot
 * k: pass 1, the new absmax, pass 2 (from L1), the absmax stored. */
static inline void optim_ref_qblock(const optim_scalars *s, const optim_tile *t, size_t b,
                                    size_t e, size_t k) {
  const int has2 = t->s2 != NULL;
  const float A1 = t->a1[k], A2 = has2 ? t->a2[k] : 0.0f;
  float mx1 = 0.0f, mx2 = 0.0f;
  int bad1 = 0, bad2 = 0;
  optim_ref_q_pass1(s, t, b, e, A1, A2, &mx1, &mx2, &bad1, &bad2);
  const float N1 = optim_q_absmax(mx1, bad1), N2 = optim_q_absmax(mx2, bad2);
  optim_ref_q_pass2(s, t, b, e, A1, A2, optim_q_inv(N1), optim_q_inv(N2));
  t->a1[k] = N1;
  if (has2) t->a2[k] = N2;
}

/* The reference int8 step over the blocks of a tile from block k0 on. */
static inline void optim_ref_qstep_from(const optim_scalars *s, const optim_tile *t, size_t k0) {
  for (size_t k = k0, b = k0 * t->block; b < t->n; k++, b += t->block)
    optim_ref_qblock(s, t, b, b + t->block < t->n ? b + t->block : t->n, k);
}

/* LAMB phase 1 over [b, e): m, v updated, sums of p^2 and u^2 added. */
static inline void optim_ref_lamb1_range(const optim_scalars *s, const optim_tile *t, size_t b,
                                         size_t e, double *psq, double *usq) {
  double ps = 0, us = 0;
  for (size_t i = b; i < e; i++) {
    float g = ferry_dt_load(t->g, t->gdt, i) * s->gscale;
    float p = optim_p_load(t, i);
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
