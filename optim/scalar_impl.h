/* optim/scalar_impl.h — the scalar reference of every optimizer, one element
 * at a time: fp16/bf16 conversions (round to nearest even, NaN kept and made
 * quiet as the x86 conversion instructions do) and the per-element math.
 * kern_scalar.c is built from it, and the SIMD kernels use it for their tails,
 * so it spells out every fused multiply-add the vector code performs.
 */
#ifndef FERRY_OPTIM_SCALAR_IMPL_H
#define FERRY_OPTIM_SCALAR_IMPL_H

#include "optim/optim.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
static inline float f32_from_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

static inline float optim_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) /* inf, or NaN made quiet */
    return f32_from_bits(sign | 0x7f800000u | (man ? 0x400000u | (man << 13) : 0));
  if (exp == 0) {
    if (!man) return f32_from_bits(sign);
    /* subnormal: man x 2^-24, exact in fp32 */
    float v = (float)man * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t optim_f32_to_f16(float x) {
  uint32_t u = f32_bits(x);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
  if (a < 0x38800000u) {              /* below 2^-14: subnormal half (or zero) */
    if (a < 0x33000000u) return sign; /* below 2^-25: rounds to 0 (2^-25 ties to 0) */
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* value = m x 2^(e-150); half unit 2^-24 */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u); /* round to nearest even at bit 13 */
  return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

static inline float optim_bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

static inline uint16_t optim_f32_to_bf16(float x) {
  uint32_t u = f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float optim_load(const void *b, int dt, size_t i) {
  switch (dt) {
  case OPTIM_DT_F16: return optim_f16_to_f32(((const uint16_t *)b)[i]);
  case OPTIM_DT_BF16: return optim_bf16_to_f32(((const uint16_t *)b)[i]);
  default: return ((const float *)b)[i];
  }
}

static inline void optim_store(void *b, int dt, size_t i, float x) {
  switch (dt) {
  case OPTIM_DT_F16: ((uint16_t *)b)[i] = optim_f32_to_f16(x); break;
  case OPTIM_DT_BF16: ((uint16_t *)b)[i] = optim_f32_to_bf16(x); break;
  case OPTIM_DT_F32: ((float *)b)[i] = x; break;
  default: break;
  }
}

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
    float g = optim_load(t->g, t->gdt, i) * s->gscale;
    float p = t->p[i];
    float m = has1 ? optim_load(t->s1, t->sdt, i) : 0.0f;
    float v = has2 ? optim_load(t->s2, t->sdt, i) : 0.0f;
    optim_elem(&ls, g, &p, &m, &v);
    t->p[i] = p;
    if (has1 && !lamb) optim_store(t->s1, t->sdt, i, m);
    if (has2 && !lamb) optim_store(t->s2, t->sdt, i, v);
    if (t->cdt != OPTIM_DT_NONE) optim_store(t->pc, t->cdt, i, p);
  }
}

/* LAMB phase 1 over [b, e): m, v updated, sums of p^2 and u^2 added. */
static inline void optim_ref_lamb1_range(const optim_scalars *s, const optim_tile *t, size_t b,
                                         size_t e, double *psq, double *usq) {
  double ps = 0, us = 0;
  for (size_t i = b; i < e; i++) {
    float g = optim_load(t->g, t->gdt, i) * s->gscale;
    float p = t->p[i];
    float m = optim_load(t->s1, t->sdt, i), v = optim_load(t->s2, t->sdt, i);
    m = fmaf(s->beta1, m, s->omb1 * g);
    v = fmaf(s->beta2, v, (s->omb2 * g) * g);
    optim_store(t->s1, t->sdt, i, m);
    optim_store(t->s2, t->sdt, i, v);
    /* phase 2 reads the stored (possibly bf16-rounded) states: use them */
    m = optim_load(t->s1, t->sdt, i);
    v = optim_load(t->s2, t->sdt, i);
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
    double x = optim_load(g, dt, i);
    acc += x * x;
  }
  return acc;
}

static inline void optim_ref_accumulate_range(float *acc, const void *g, int dt, size_t b, size_t e,
                                              float scale) {
  for (size_t i = b; i < e; i++)
    acc[i] = fmaf(optim_load(g, dt, i), scale, acc[i]);
}

#endif /* FERRY_OPTIM_SCALAR_IMPL_H */
