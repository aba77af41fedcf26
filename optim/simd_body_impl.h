/* optim/simd_body_impl.h — the vector kernels of every optimizer, written
 * once over a small vector vocabulary (vf, VW, v_fma, v_load_f16, ...) that
 * kern_avx2.c and kern_avx512.c define before including this file. Each
 * (optimizer, grad dtype, state dtype, copy dtype) gets its own specialised
 * loop; the tail of a tile runs the scalar reference (same operations).
 */
#ifndef OPTIM_SIMD_PREFIX
#error "define the vector vocabulary and OPTIM_SIMD_PREFIX before including simd_body_impl.h"
#endif

#include "optim/scalar_impl.h"

#define OPT_INLINE static inline __attribute__((always_inline))

OPT_INLINE vf vb_load(const void *b, int dt, size_t i) {
  switch (dt) {
  case FERRY_DT_F16: return v_load_f16((const uint16_t *)b + i);
  case FERRY_DT_BF16: return v_load_bf16((const uint16_t *)b + i);
  default: return v_loadu((const float *)b + i);
  }
}

OPT_INLINE void vb_store(void *b, int dt, size_t i, vf x, int nb) {
  switch (dt) {
  case FERRY_DT_F16: v_store_f16((uint16_t *)b + i, x); break;
  case FERRY_DT_BF16: v_store_bf16((uint16_t *)b + i, x, nb); break;
  case FERRY_DT_F32: v_storeu((float *)b + i, x); break;
  default: break;
  }
}

/* What a stored state reads back as (bf16 states round). */
OPT_INLINE vf vb_roundtrip(vf x, int dt, int nb) {
  if (dt != FERRY_DT_BF16) return x;
  uint16_t tmp[VW];
  v_store_bf16(tmp, x, nb);
  return v_load_bf16(tmp);
}

OPT_INLINE void step_body(const optim_scalars *s, const optim_tile *t, int type, int gdt, int sdt,
                          int cdt) {
  const vf gs = v_set1(s->gscale), b1 = v_set1(s->beta1), b2 = v_set1(s->beta2);
  const vf omb1 = v_set1(s->omb1), omb2 = v_set1(s->omb2), eps = v_set1(s->eps);
  const vf wd = v_set1(s->wd), decay = v_set1(s->decay), isb2 = v_set1(s->inv_sqrt_bc2);
  const vf ibc1 = v_set1(s->inv_bc1), momc = v_set1(s->mom_c), dampc = v_set1(s->damp_c);
  const float nstep_f = type == FERRY_OPTIM_LAMB ? s->neg_step * t->trust : s->neg_step;
  const vf nstep = v_set1(nstep_f);
  const int nb = s->native_bf16, mom = s->sgd_momentum, nest = s->nesterov;
  float *P = t->p;
  const size_t n = t->n;
  size_t i = 0;
  for (; i + VW <= n; i += VW) {
    vf p = v_loadu(P + i);
    vf g = v_set1(0.0f);
    if (type != FERRY_OPTIM_LAMB) g = v_mul(vb_load(t->g, gdt, i), gs);
    switch (type) {
    case FERRY_OPTIM_ADAM:
    case FERRY_OPTIM_ADAMW: {
      if (type == FERRY_OPTIM_ADAM) g = v_fma(wd, p, g);
      vf m = vb_load(t->s1, sdt, i), v = vb_load(t->s2, sdt, i);
      m = v_fma(b1, m, v_mul(omb1, g));
      v = v_fma(b2, v, v_mul(v_mul(omb2, g), g));
      p = v_mul(p, decay);
      p = v_fma(nstep, v_div(m, v_fma(v_sqrt(v), isb2, eps)), p);
      vb_store(t->s1, sdt, i, m, nb);
      vb_store(t->s2, sdt, i, v, nb);
      break;
    }
    case FERRY_OPTIM_ADAGRAD: {
      vf m = vb_load(t->s1, sdt, i);
      g = v_fma(wd, p, g);
      m = v_fma(g, g, m);
      p = v_fma(nstep, v_div(g, v_add(v_sqrt(m), eps)), p);
      vb_store(t->s1, sdt, i, m, nb);
      break;
    }
    case FERRY_OPTIM_SGD:
      g = v_fma(wd, p, g);
      if (mom) {
        vf m = vb_load(t->s1, sdt, i);
        m = v_fma(momc, m, v_mul(dampc, g));
        g = nest ? v_fma(b1, m, g) : m;
        vb_store(t->s1, sdt, i, m, nb);
      }
      p = v_fma(nstep, g, p);
      break;
    case FERRY_OPTIM_LION: {
      vf m = vb_load(t->s1, sdt, i);
      vf c = v_fma(b1, m, v_mul(omb1, g));
      p = v_mul(p, decay);
      p = v_fma(nstep, v_sign(c), p);
      m = v_fma(b2, m, v_mul(omb2, g));
      vb_store(t->s1, sdt, i, m, nb);
      break;
    }
    case FERRY_OPTIM_LAMB: {
      vf m = vb_load(t->s1, sdt, i), v = vb_load(t->s2, sdt, i);
      vf u = v_fma(wd, p, v_div(v_mul(m, ibc1), v_fma(v_sqrt(v), isb2, eps)));
      p = v_fma(nstep, u, p);
      break;
    }
    default: break;
    }
    v_storeu(P + i, p);
    if (cdt != FERRY_DT_NONE) vb_store(t->pc, cdt, i, p, nb);
  }
  if (i < n) optim_ref_step_range(s, t, i, n);
}

OPT_INLINE void lamb1_body(const optim_scalars *s, const optim_tile *t, double *psq, double *usq,
                           int gdt, int sdt) {
  const vf gs = v_set1(s->gscale), b1 = v_set1(s->beta1), b2 = v_set1(s->beta2);
  const vf omb1 = v_set1(s->omb1), omb2 = v_set1(s->omb2), eps = v_set1(s->eps);
  const vf wd = v_set1(s->wd), isb2 = v_set1(s->inv_sqrt_bc2), ibc1 = v_set1(s->inv_bc1);
  const int nb = s->native_bf16;
  vd pa0 = vd_zero(), pa1 = vd_zero(), ua0 = vd_zero(), ua1 = vd_zero();
  const size_t n = t->n;
  size_t i = 0;
  for (; i + VW <= n; i += VW) {
    vf p = v_loadu((const float *)t->p + i);
    vf g = v_mul(vb_load(t->g, gdt, i), gs);
    vf m = vb_load(t->s1, sdt, i), v = vb_load(t->s2, sdt, i);
    m = v_fma(b1, m, v_mul(omb1, g));
    v = v_fma(b2, v, v_mul(v_mul(omb2, g), g));
    vb_store(t->s1, sdt, i, m, nb);
    vb_store(t->s2, sdt, i, v, nb);
    m = vb_roundtrip(m, sdt, nb);
    v = vb_roundtrip(v, sdt, nb);
    vf u = v_fma(wd, p, v_div(v_mul(m, ibc1), v_fma(v_sqrt(v), isb2, eps)));
    vd_sqacc(&pa0, &pa1, p);
    vd_sqacc(&ua0, &ua1, u);
  }
  *psq += vd_hsum(pa0, pa1);
  *usq += vd_hsum(ua0, ua1);
  if (i < n) optim_ref_lamb1_range(s, t, i, n, psq, usq);
}

#define OPT_C(TYPE, G, S)                                                                          \
  switch (t->cdt) {                                                                                \
  case FERRY_DT_F16: step_body(s, t, TYPE, G, S, FERRY_DT_F16); return;                            \
  case FERRY_DT_BF16: step_body(s, t, TYPE, G, S, FERRY_DT_BF16); return;                          \
  case FERRY_DT_F32: step_body(s, t, TYPE, G, S, FERRY_DT_F32); return;                            \
  default: step_body(s, t, TYPE, G, S, FERRY_DT_NONE); return;                                     \
  }
#define OPT_S(TYPE, G)                                                                             \
  if (t->sdt == FERRY_DT_BF16) {                                                                   \
    OPT_C(TYPE, G, FERRY_DT_BF16)                                                                  \
  } else {                                                                                         \
    OPT_C(TYPE, G, FERRY_DT_F32)                                                                   \
  }
#define OPT_G(TYPE)                                                                                \
  switch (t->gdt) {                                                                                \
  case FERRY_DT_F16: OPT_S(TYPE, FERRY_DT_F16) return;                                             \
  case FERRY_DT_BF16: OPT_S(TYPE, FERRY_DT_BF16) return;                                           \
  default: OPT_S(TYPE, FERRY_DT_F32) return;                                                       \
  }

static void k_adamw(const optim_scalars *s, const optim_tile *t) { OPT_G(FERRY_OPTIM_ADAMW) }
static void k_adam(const optim_scalars *s, const optim_tile *t) { OPT_G(FERRY_OPTIM_ADAM) }
static void k_adagrad(const optim_scalars *s, const optim_tile *t) { OPT_G(FERRY_OPTIM_ADAGRAD) }
static void k_sgd(const optim_scalars *s, const optim_tile *t) { OPT_G(FERRY_OPTIM_SGD) }
static void k_lion(const optim_scalars *s, const optim_tile *t) { OPT_G(FERRY_OPTIM_LION) }
static void k_lamb2(const optim_scalars *s, const optim_tile *t) {
  OPT_S(FERRY_OPTIM_LAMB, FERRY_DT_F32) /* phase 2 reads no gradient */
}

static void k_step(const optim_scalars *s, const optim_tile *t) {
  if (t->sdt == FERRY_DT_I8) {
    optim_ref_qstep_from(s, t, 0);
    return;
  }
  if (t->mdt == FERRY_DT_BF16) {
    optim_ref_step_range(s, t, 0, t->n);
    return;
  }
  switch (s->type) {
  case FERRY_OPTIM_ADAMW: k_adamw(s, t); break;
  case FERRY_OPTIM_ADAM: k_adam(s, t); break;
  case FERRY_OPTIM_ADAGRAD: k_adagrad(s, t); break;
  case FERRY_OPTIM_SGD: k_sgd(s, t); break;
  case FERRY_OPTIM_LION: k_lion(s, t); break;
  case FERRY_OPTIM_LAMB: k_lamb2(s, t); break;
  default: break;
  }
}

static void k_lamb1(const optim_scalars *s, const optim_tile *t, double *psq, double *usq) {
  if (t->mdt == FERRY_DT_BF16) {
    optim_ref_lamb1_range(s, t, 0, t->n, psq, usq);
    return;
  }
  int bf = t->sdt == FERRY_DT_BF16;
  switch (t->gdt) {
  case FERRY_DT_F16:
    bf ? lamb1_body(s, t, psq, usq, FERRY_DT_F16, FERRY_DT_BF16)
       : lamb1_body(s, t, psq, usq, FERRY_DT_F16, FERRY_DT_F32);
    break;
  case FERRY_DT_BF16:
    bf ? lamb1_body(s, t, psq, usq, FERRY_DT_BF16, FERRY_DT_BF16)
       : lamb1_body(s, t, psq, usq, FERRY_DT_BF16, FERRY_DT_F32);
    break;
  default:
    bf ? lamb1_body(s, t, psq, usq, FERRY_DT_F32, FERRY_DT_BF16)
       : lamb1_body(s, t, psq, usq, FERRY_DT_F32, FERRY_DT_F32);
    break;
  }
}

OPT_INLINE double sumsq_body(const void *g, int dt, size_t n) {
  vd a0 = vd_zero(), a1 = vd_zero();
  size_t i = 0;
  for (; i + VW <= n; i += VW)
    vd_sqacc(&a0, &a1, vb_load(g, dt, i));
  return vd_hsum(a0, a1) + optim_ref_sumsq_range(g, dt, i, n);
}

static double k_sumsq(const void *g, int dt, size_t n) {
  switch (dt) {
  case FERRY_DT_F16: return sumsq_body(g, FERRY_DT_F16, n);
  case FERRY_DT_BF16: return sumsq_body(g, FERRY_DT_BF16, n);
  default: return sumsq_body(g, FERRY_DT_F32, n);
  }
}

OPT_INLINE void acc_body(float *acc, const void *g, int dt, size_t n, float scale) {
  const vf sc = v_set1(scale);
  size_t i = 0;
  for (; i + VW <= n; i += VW)
    v_storeu(acc + i, v_fma(vb_load(g, dt, i), sc, v_loadu(acc + i)));
  optim_ref_accumulate_range(acc, g, dt, i, n, scale);
}

static void k_accumulate(float *acc, const void *g, int dt, size_t n, float scale) {
  switch (dt) {
  case FERRY_DT_F16: acc_body(acc, g, FERRY_DT_F16, n, scale); break;
  case FERRY_DT_BF16: acc_body(acc, g, FERRY_DT_BF16, n, scale); break;
  default: acc_body(acc, g, FERRY_DT_F32, n, scale); break;
  }
}

const optim_kernels OPTIM_SIMD_PREFIX = {
    /* .name = */ OPTIM_SIMD_NAME,
    /* .step = */ k_step,
    /* .lamb_phase1 = */ k_lamb1,
    /* .sumsq = */ k_sumsq,
    /* .accumulate = */ k_accumulate,
};
