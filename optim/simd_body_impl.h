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
/* A constant the compiler must keep (in a register, or spilled and read as a
 * memory operand) rather than rebuild with an immediate and a broadcast at
 * each use inside a loop. */
#define VQ_KEEP(x) __asm__("" : "+v"(x))

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

/* ---- compact state: bf16 master (stochastic rounding), the int8 code ---- */

/* optim_hash32(x) >> 16 on each lane: the hash's last step (x ^= x >> 16)
 * leaves the top half alone, so it is skipped. */
OPT_INLINE vi vq_hash_hi16(vi x) {
  x = vi_xor(x, vi_srli(x, 16));
  x = vi_mullo(x, vi_set1(0x7feb352du));
  x = vi_xor(x, vi_srli(x, 15));
  x = vi_mullo(x, vi_set1(0x846ca68bu));
  return vi_srli(x, 16);
}

/* The stochastic-rounding key of a tile: optim_sr_hikey of its elements
 * when they all share the high half of their index (one = 1), else one = 0
 * and each vector derives its own. */
typedef struct {
  vi hk;
  int one;
} vq_srkey;

OPT_INLINE vq_srkey vq_srkey_of(const optim_scalars *s, const optim_tile *t) {
  vq_srkey k;
  k.one = t->n == 0 || (t->index >> 32) == ((t->index + t->n - 1) >> 32);
  k.hk = vi_set1(optim_sr_hikey(s->sr_key, t->index));
  return k;
}

/* optim_sr_bits of elements idx0 .. idx0 + VW - 1 */
OPT_INLINE vi vq_sr_bits(const vq_srkey *sk, uint32_t key, uint64_t idx0) {
  uint32_t lo = (uint32_t)idx0;
  if (sk->one) return vq_hash_hi16(vi_xor(sk->hk, vi_add(vi_set1(lo), vi_iota())));
  if (lo <= 0xFFFFFFFFu - (VW - 1)) /* one high half: one key */
    return vq_hash_hi16(vi_xor(vi_set1(optim_sr_hikey(key, idx0)), vi_add(vi_set1(lo), vi_iota())));
  uint32_t r[VW];
  for (int l = 0; l < VW; l++)
    r[l] = optim_sr_bits(optim_sr_hikey(key, idx0 + (uint64_t)l), idx0 + (uint64_t)l);
  return vi_loadu(r);
}

OPT_INLINE vf vq_load_p(const optim_tile *t, int mdt, size_t i) {
  return mdt == FERRY_DT_BF16 ? v_load_bf16((const uint16_t *)t->p + i)
                              : v_loadu((const float *)t->p + i);
}

/* The random bits of a block's elements from index i0 on, when the block
 * (len elements) shares the high half of its index and one 2^16 range of
 * its low half (ok): x = hikey ^ idx, then x ^= x >> 16 is idx ^ c with one
 * constant c = hikey ^ (hikey >> 16) ^ (idx >> 16), so the hash starts at
 * its first multiply. */
typedef struct {
  vi idx, c, step, m1, m2; /* step, m1, m2: constants kept (VQ_KEEP) */
  int ok;
} vq_srblk;

OPT_INLINE vq_srblk vq_srblk_of(const optim_scalars *s, uint64_t i0, size_t len) {
  vq_srblk k;
  uint32_t lo = (uint32_t)i0, hk = optim_sr_hikey(s->sr_key, i0);
  k.ok = len && (i0 >> 32) == ((i0 + len - 1) >> 32) && (lo >> 16) == ((lo + len - 1) >> 16);
  k.idx = vi_add(vi_set1(lo), vi_iota());
  k.c = vi_set1(hk ^ (hk >> 16) ^ (lo >> 16));
  k.step = vi_set1(VW);
  k.m1 = vi_set1(0x7feb352du);
  k.m2 = vi_set1(0x846ca68bu);
  VQ_KEEP(k.step);
  VQ_KEEP(k.m1);
  VQ_KEEP(k.m2);
  return k;
}

/* optim_sr_bits of the next VW elements of a block with k->ok */
OPT_INLINE vi vq_srblk_next(vq_srblk *k) {
  vi x = vi_xor(k->idx, k->c);
  k->idx = vi_add(k->idx, k->step);
  x = vi_mullo(x, k->m1);
  x = vi_xor(x, vi_srli(x, 15));
  x = vi_mullo(x, k->m2);
  return vi_srli(x, 16);
}

/* optim_bf16_sr of p with random bits r: (bits + r) >> 16, NaN made quiet
 * (the NaN blend only when a lane is NaN) */
OPT_INLINE void vq_store_sr(uint16_t *dst, vf p, vi r) {
  vi u = vf_as_vi(p);
  vi b = vi_srli(vi_add(u, r), 16);
  if (v_any_nan(p)) {
    vi q = vi_or(vi_srli(u, 16), vi_set1(0x40));
    b = vi_sel_gt(vi_and(u, vi_set1(0x7FFFFFFFu)), vi_set1(0x7F800000u), q, b);
  }
  v_store_u16(dst, b);
}

/* optim_p_store: fp32, or bf16 with stochastic rounding */
OPT_INLINE void vq_store_p(const optim_scalars *s, const optim_tile *t, const vq_srkey *sk, int mdt,
                           size_t i, vf p) {
  if (mdt != FERRY_DT_BF16) {
    v_storeu((float *)t->p + i, p);
    return;
  }
  vq_store_sr((uint16_t *)t->p + i, p, vq_sr_bits(sk, s->sr_key, t->index + i));
}

/* optim_q_dec_s (sgn) / optim_q_dec_u of codes c with absmax A, as the
 * reference spells it (the fallback of vq_dec_fast) */
OPT_INLINE vf vq_dec(vi c, vf A, int sgn) {
  vi u = sgn ? vi_and(c, vi_set1(0x7F)) : c;
  vf lin = v_mul(vi_to_vf(u), v_set1(sgn ? 0x1p-17f : 0x1p-33f));
  vi nor = vi_add(vi_slli(u, 20), vi_set1((sgn ? 112u : 96u) << 23)); /* ((u>>3)+bias)<<23 | (u&7)<<20 */
  vf x = v_mul(vi_as_vf(vi_sel_gt(vi_set1(8), u, vf_as_vi(lin), nor)), A);
  if (sgn) x = vi_as_vf(vi_xor(vf_as_vi(x), vi_slli(vi_and(c, vi_set1(0x80)), 24)));
  return x;
}

/* The same decode in two operations (three signed): the code's 7 (8)
 * bits moved to bits 20.. of an fp32, read as a float, are exactly the code's
 * value x 2^-112 (2^-96 unsigned): the exponent field is the code's exponent,
 * and the linear range lands on the fp32 subnormals. So one multiply by
 * As = absmax x 2^bias (exact while finite) rounds the same real product as
 * the reference. Signed codes come sign-extended (v_load_s8). Valid when
 * vq_dec_ok: subnormal inputs honoured (MXCSR.DAZ clear) and As finite (a NaN
 * absmax takes the reference's spelling, which keeps the NaN's sign rule). */
OPT_INLINE vf vq_dec_fast(vi c, vf As, int sgn) {
  if (!sgn) return v_mul(vi_as_vf(vi_slli(c, 20)), As);
  /* c sign-extended: << 20 puts the magnitude at bits 20..26 and copies of
   * the sign at 27..31; keep bit 31. -|q| x As rounds to -(|q| x As). */
  return v_mul(vi_as_vf(vi_and(vi_slli(c, 20), vi_set1(0x87F00000u))), As);
}
#define OPTIM_Q_DAZ 0x40u /* MXCSR: denormals are zeros */
OPT_INLINE int vq_dec_ok(float A1, float A2) {
  return !(_mm_getcsr() & OPTIM_Q_DAZ) && fabsf(A1) < 0x1p16f && fabsf(A2) < 0x1p32f;
}

/* vq_enc's constants (signed s, unsigned u), made once outside the loop */
typedef struct {
  vi adds, addu, lims, limu, low20, abs, neg, bit7;
} vq_encc;

OPT_INLINE vq_encc vq_encc_of(void) {
  vq_encc k;
  k.adds = vi_set1(0x80000u - (112u << 23));
  k.addu = vi_set1(0x80000u - (96u << 23));
  k.lims = vi_set1(0x38800000u);
  k.limu = vi_set1(0x30800000u);
  k.low20 = vi_set1(0xFFFFFu);
  k.abs = vi_set1(0x7FFFFFFFu);
  k.neg = vi_set1(0xB6800000u);
  k.bit7 = vi_set1(0x80u);
  VQ_KEEP(k.adds);
  VQ_KEEP(k.addu);
  VQ_KEEP(k.lims);
  VQ_KEEP(k.limu);
  VQ_KEEP(k.low20);
  VQ_KEEP(k.abs);
  VQ_KEEP(k.neg);
  VQ_KEEP(k.bit7);
  return k;
}

/* optim_q_enc_s (sgn) / optim_q_enc_u of x with inv = 1 / absmax, for the
 * values of the block that absmax was taken from (|x| <= absmax, so the
 * magnitude stays below 1 + 2^-22 and the reference's clamp to the largest
 * code never acts; v >= +0, so its |.| is itself). The normal range rounds
 * on the bits, the exponent bias folded into the addend: (a + 2^19 - bias)
 * >> 20, exact but at a tie (the 20 low bits of the sum all zero), where
 * nearest-even may take one less. Ties and the linear range (|x| below
 * 2^-14, 2^-30 of the absmax) are rare, so the reference's full spelling
 * runs only when a lane has one. Signed: 0x80 when y < 0 and the magnitude
 * is nonzero, that is when the bits of y, unsigned, exceed those of -2^-18. */
OPT_INLINE vi vq_enc(vf x, vf inv, int sgn, const vq_encc *k) {
  const uint32_t bias = sgn ? 112u : 96u;
  const vi lim = sgn ? k->lims : k->limu;
  vf y = v_mul(x, inv);
  vi ya = sgn ? vi_and(vf_as_vi(y), k->abs) : vf_as_vi(y);
  vi r = vi_add(ya, sgn ? k->adds : k->addu);
  vi u = vi_srli(r, 20);
  if (vi_any_gt(lim, ya) | vi_any_zero_and(r, k->low20)) {
    r = vi_add(vi_add(ya, vi_set1(0x7FFFFu - (bias << 23))), vi_and(vi_srli(ya, 20), vi_set1(1)));
    vi ulin = vf_rint(v_mul(vi_as_vf(ya), v_set1(sgn ? 0x1p17f : 0x1p33f)));
    u = vi_sel_gt(lim, ya, ulin, vi_srli(r, 20));
  }
  if (sgn) u = vi_or_if_gtu(u, vf_as_vi(y), k->neg, k->bit7);
  return u;
}

/* The largest lane (unsigned). */
OPT_INLINE uint32_t vq_hmaxu(vi x) {
  float tmp[VW];
  v_storeu(tmp, vi_as_vf(x));
  uint32_t m = 0;
  for (int l = 0; l < VW; l++) {
    uint32_t b = ferry_f32_bits(tmp[l]);
    m = b > m ? b : m;
  }
  return m;
}

/* When a vector pass's max of the |x| bits went past the finite range: the
 * largest finite |x| bits of buf[0, n) into *h, and whether one was inf or
 * NaN. */
static inline int vq_finite_maxbits(const float *buf, size_t n, uint32_t *h) {
  uint32_t m = 0;
  int bad = 0;
  for (size_t j = 0; j < n; j++) {
    uint32_t a = ferry_f32_bits(buf[j]) & 0x7FFFFFFFu;
    if (a > 0x7F7FFFFFu)
      bad = 1;
    else if (a > m)
      m = a;
  }
  *h = m;
  return bad;
}

/* The codes of the inf and NaN states among the whole vectors of a block
 * (codes [b, b + n), fp32 states in buf1, buf2), which the vector encoder
 * does not spell: optim_q_put_s/_u's. */
static inline void vq_put_specials(uint8_t *c1, uint8_t *c2, const float *buf1, const float *buf2,
                                   size_t b, size_t n) {
  for (size_t j = 0; j < n; j++) {
    if (!optim_q_finite(buf1[j])) c1[b + j] = optim_q_put_s(buf1[j], 0.0f);
    if (c2 && !optim_q_finite(buf2[j])) c2[b + j] = optim_q_put_u(buf2[j], 0.0f);
  }
}

/* Pass 1 of an int8 block over whole vectors [b, vend): the new fp32 states
 * into buf1, buf2 (for Lion buf2 holds the sign argument c), the running
 * unsigned max of their |bits| into mx1, mx2. fast: vq_dec_fast. */
OPT_INLINE void qpass1_body(const optim_scalars *s, const optim_tile *t, size_t b, size_t vend,
                            size_t k, int type, int gdt, int mdt, int fast, float *buf1,
                            float *buf2, vi *mx1, vi *mx2) {
  const vf gs = v_set1(s->gscale), b1 = v_set1(s->beta1), b2 = v_set1(s->beta2);
  const vf omb1 = v_set1(s->omb1), omb2 = v_set1(s->omb2), wd = v_set1(s->wd);
  const vi absm = vi_set1(0x7FFFFFFFu);
  const int two = type != FERRY_OPTIM_LION;
  const uint8_t *c1 = (const uint8_t *)t->s1, *c2 = (const uint8_t *)t->s2;
  const float A1 = t->a1[k], A2 = two ? t->a2[k] : 0.0f;
  const vf A1v = v_set1(fast ? A1 * 0x1p112f : A1), A2v = v_set1(fast ? A2 * 0x1p96f : A2);
  vi m1 = *mx1, m2 = *mx2;
  for (size_t i = b; i < vend; i += VW) {
    vf g = v_mul(vb_load(t->g, gdt, i), gs);
    vi q1 = fast ? v_load_s8(c1 + i) : v_load_u8(c1 + i);
    vf m = fast ? vq_dec_fast(q1, A1v, 1) : vq_dec(q1, A1v, 1), x;
    if (two) {
      if (type == FERRY_OPTIM_ADAM) g = v_fma(wd, vq_load_p(t, mdt, i), g);
      vi q2 = v_load_u8(c2 + i);
      vf v = fast ? vq_dec_fast(q2, A2v, 0) : vq_dec(q2, A2v, 0);
      m = v_fma(b1, m, v_mul(omb1, g));
      x = v_fma(b2, v, v_mul(v_mul(omb2, g), g));
      m2 = vi_maxu(m2, vf_as_vi(x)); /* v >= +0 or NaN: its bits are |v|'s */
    } else {
      x = v_fma(b1, m, v_mul(omb1, g)); /* c */
      m = v_fma(b2, m, v_mul(omb2, g));
    }
    m1 = vi_maxu(m1, vi_and(vf_as_vi(m), absm));
    v_storeu(buf1 + (i - b), m);
    v_storeu(buf2 + (i - b), x);
  }
  *mx1 = m1;
  *mx2 = m2;
}

/* One int8 block [b, e) (AdamW, Adam, Lion), as optim_ref_qblock. Pass 1
 * reads codes and gradients, computes the new fp32 states and keeps them in
 * two block-local buffers on the stack (2 x block floats, in L1: the step is
 * compute-bound, so pass 2 reloads instead of dequantizing and updating
 * again; for Lion the second buffer holds the sign argument c), and takes
 * the absmax as the integer max of the |x| bits (equal to the float max;
 * > 0x7F7FFFFF when one is inf or NaN, and then the finite max is taken
 * again from the buffers). Pass 2 updates the param from the fp32 states
 * and writes the codes with the new absmax, then the codes of inf and NaN.
 * A partial last block's tail (< VW elements) runs the scalar reference's
 * passes, and so does a whole block that holds inf or NaN codes (a marked
 * absmax: rare, and the vector decoders do not spell those codes). */
OPT_INLINE void qblock_body(const optim_scalars *s, const optim_tile *t, size_t b, size_t e,
                            size_t k, int type, int gdt, int mdt, int cdt, float *buf1,
                            float *buf2) {
  const vf eps = v_set1(s->eps), decay = v_set1(s->decay), isb2 = v_set1(s->inv_sqrt_bc2);
  const vf nstep = v_set1(s->neg_step);
  const int two = type != FERRY_OPTIM_LION, nb = s->native_bf16;
  uint8_t *c1 = (uint8_t *)t->s1, *c2 = (uint8_t *)t->s2;
  const float A1 = t->a1[k], A2 = two ? t->a2[k] : 0.0f;
  if (optim_q_marked(A1) | optim_q_marked(A2)) {
    optim_ref_qblock(s, t, b, e, k);
    return;
  }
  vi mx1 = vi_set1(0), mx2 = vi_set1(0);
  const size_t vend = b + (e - b) / VW * VW;
  if (vq_dec_ok(A1, A2))
    qpass1_body(s, t, b, vend, k, type, gdt, mdt, 1, buf1, buf2, &mx1, &mx2);
  else
    qpass1_body(s, t, b, vend, k, type, gdt, mdt, 0, buf1, buf2, &mx1, &mx2);
  size_t i = vend;
  float f1 = 0.0f, f2 = 0.0f;
  int bad1 = 0, bad2 = 0;
  if (i < e) optim_ref_q_pass1(s, t, i, e, A1, A2, &f1, &f2, &bad1, &bad2);
  uint32_t h1 = vq_hmaxu(mx1), h2 = vq_hmaxu(mx2);
  if (h1 > 0x7F7FFFFFu) bad1 |= vq_finite_maxbits(buf1, vend - b, &h1);
  if (h2 > 0x7F7FFFFFu) bad2 |= vq_finite_maxbits(buf2, vend - b, &h2);
  if (ferry_f32_from_bits(h1) > f1) f1 = ferry_f32_from_bits(h1);
  if (ferry_f32_from_bits(h2) > f2) f2 = ferry_f32_from_bits(h2);
  const float N1 = optim_q_absmax(f1, bad1), N2 = optim_q_absmax(f2, bad2);
  const float i1 = optim_q_inv(N1), i2 = optim_q_inv(N2);
  const vf i1v = v_set1(i1), i2v = v_set1(i2);
  const vi zero = vi_set1(0);
  const vq_encc kc = vq_encc_of();
  const vq_srkey sk = vq_srkey_of(s, t);
  vq_srblk sb = vq_srblk_of(s, t->index + b, vend - b);
  for (i = b; i < vend; i += VW) {
    vf p = vq_load_p(t, mdt, i);
    vf m = v_loadu(buf1 + (i - b)), x = v_loadu(buf2 + (i - b));
    p = v_mul(p, decay);
    if (two) {
      p = v_fma(nstep, v_div(m, v_fma(v_sqrt(x), isb2, eps)), p);
      v_store_u8(c2 + i, i2 != 0.0f ? vq_enc(x, i2v, 0, &kc) : zero);
    } else {
      p = v_fma(nstep, v_sign(x), p);
    }
    v_store_u8(c1 + i, i1 != 0.0f ? vq_enc(m, i1v, 1, &kc) : zero);
    if (mdt == FERRY_DT_BF16 && sb.ok)
      vq_store_sr((uint16_t *)t->p + i, p, vq_srblk_next(&sb));
    else
      vq_store_p(s, t, &sk, mdt, i, p);
    if (cdt != FERRY_DT_NONE) vb_store(t->pc, cdt, i, p, nb);
  }
  if (bad1 | bad2) vq_put_specials(c1, two ? c2 : NULL, buf1, buf2, b, vend - b);
  if (i < e) optim_ref_q_pass2(s, t, i, e, A1, A2, i1, i2);
  t->a1[k] = N1;
  if (two) t->a2[k] = N2;
}

#ifndef OPTIM_Q_AHEAD
#define OPTIM_Q_AHEAD 1024 /* elements */
#endif

OPT_INLINE void qstep_body(const optim_scalars *s, const optim_tile *t, int type, int gdt, int mdt,
                           int cdt) {
  const size_t B = t->block, n = t->n;
  float buf1[4096], buf2[4096]; /* block-local (state_block <= 4096) */
  const size_t gsz = gdt == FERRY_DT_F32 ? 4 : 2, msz = mdt == FERRY_DT_BF16 ? 2 : 4;
  for (size_t k = 0, b = 0; b < n; k++, b += B) {
    /* the loop is compute-heavy and the hardware prefetcher falls behind:
     * ask for the lines of the elements OPTIM_Q_AHEAD on (into all caches) */
    size_t pe = b + OPTIM_Q_AHEAD + B < n ? b + OPTIM_Q_AHEAD + B : n;
    for (size_t j = b + OPTIM_Q_AHEAD; j < pe; j += 64) {
      for (size_t x = 0; x < 64 * gsz; x += 64)
        __builtin_prefetch((const char *)t->g + j * gsz + x, 0, 3);
      for (size_t x = 0; x < 64 * msz; x += 64)
        __builtin_prefetch((const char *)t->p + j * msz + x, 1, 3);
      __builtin_prefetch((const uint8_t *)t->s1 + j, 1, 3);
      if (t->s2) __builtin_prefetch((const uint8_t *)t->s2 + j, 1, 3);
    }
    qblock_body(s, t, b, b + B < n ? b + B : n, k, type, gdt, mdt, cdt, buf1, buf2);
  }
}

OPT_INLINE void step_body(const optim_scalars *s, const optim_tile *t, int type, int gdt, int sdt,
                          int cdt, int mdt) {
  const vf gs = v_set1(s->gscale), b1 = v_set1(s->beta1), b2 = v_set1(s->beta2);
  const vf omb1 = v_set1(s->omb1), omb2 = v_set1(s->omb2), eps = v_set1(s->eps);
  const vf wd = v_set1(s->wd), decay = v_set1(s->decay), isb2 = v_set1(s->inv_sqrt_bc2);
  const vf ibc1 = v_set1(s->inv_bc1), momc = v_set1(s->mom_c), dampc = v_set1(s->damp_c);
  const float nstep_f = type == FERRY_OPTIM_LAMB ? s->neg_step * t->trust : s->neg_step;
  const vf nstep = v_set1(nstep_f);
  const int nb = s->native_bf16, mom = s->sgd_momentum, nest = s->nesterov;
  const vq_srkey sk = vq_srkey_of(s, t);
  const size_t n = t->n;
  size_t i = 0;
  for (; i + VW <= n; i += VW) {
    vf p = vq_load_p(t, mdt, i);
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
    vq_store_p(s, t, &sk, mdt, i, p);
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
    vf p = vq_load_p(t, t->mdt, i);
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
  if (t->mdt == FERRY_DT_BF16) {                                                                   \
    step_body(s, t, TYPE, G, S, FERRY_DT_NONE, FERRY_DT_BF16);                                     \
    return;                                                                                        \
  }                                                                                                \
  switch (t->cdt) {                                                                                \
  case FERRY_DT_F16: step_body(s, t, TYPE, G, S, FERRY_DT_F16, FERRY_DT_F32); return;              \
  case FERRY_DT_BF16: step_body(s, t, TYPE, G, S, FERRY_DT_BF16, FERRY_DT_F32); return;            \
  case FERRY_DT_F32: step_body(s, t, TYPE, G, S, FERRY_DT_F32, FERRY_DT_F32); return;              \
  default: step_body(s, t, TYPE, G, S, FERRY_DT_NONE, FERRY_DT_F32); return;                       \
  }
/* int8 states: master and copy, then gradient */
#define OPT_QM(TYPE, G)                                                                            \
  if (t->mdt == FERRY_DT_BF16) {                                                                   \
    qstep_body(s, t, TYPE, G, FERRY_DT_BF16, FERRY_DT_NONE);                                       \
    return;                                                                                        \
  }                                                                                                \
  switch (t->cdt) {                                                                                \
  case FERRY_DT_F16: qstep_body(s, t, TYPE, G, FERRY_DT_F32, FERRY_DT_F16); return;                \
  case FERRY_DT_BF16: qstep_body(s, t, TYPE, G, FERRY_DT_F32, FERRY_DT_BF16); return;              \
  case FERRY_DT_F32: qstep_body(s, t, TYPE, G, FERRY_DT_F32, FERRY_DT_F32); return;                \
  default: qstep_body(s, t, TYPE, G, FERRY_DT_F32, FERRY_DT_NONE); return;                         \
  }
#define OPT_QG(TYPE)                                                                               \
  switch (t->gdt) {                                                                                \
  case FERRY_DT_F16: OPT_QM(TYPE, FERRY_DT_F16)                                                    \
  case FERRY_DT_BF16: OPT_QM(TYPE, FERRY_DT_BF16)                                                  \
  default: OPT_QM(TYPE, FERRY_DT_F32)                                                              \
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

static void k_q_adamw(const optim_scalars *s, const optim_tile *t) { OPT_QG(FERRY_OPTIM_ADAMW) }
static void k_q_adam(const optim_scalars *s, const optim_tile *t) { OPT_QG(FERRY_OPTIM_ADAM) }
static void k_q_lion(const optim_scalars *s, const optim_tile *t) { OPT_QG(FERRY_OPTIM_LION) }

static void k_step(const optim_scalars *s, const optim_tile *t) {
  if (t->sdt == FERRY_DT_I8) {
    switch (s->type) {
    case FERRY_OPTIM_ADAMW: k_q_adamw(s, t); return;
    case FERRY_OPTIM_ADAM: k_q_adam(s, t); return;
    case FERRY_OPTIM_LION: k_q_lion(s, t); return;
    default: optim_ref_qstep_from(s, t, 0); return; /* refused at create: unreachable */
    }
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
