/* optim/kern_avx512.c — the optimizer kernels for AVX-512 (16 floats a
 * vector), built with -mavx512f/bw/vl/bf16 on this file only and chosen at run
 * time. fp32 -> bf16 uses the AVX512-BF16 instruction when the CPU has it
 * (note: it flushes subnormals to zero), integer rounding otherwise.
 */
#include <immintrin.h>
#include <stdint.h>

typedef __m512 vf;
typedef __m512d vd;
#define VW 16

static inline vf v_loadu(const float *p) { return _mm512_loadu_ps(p); }
static inline void v_storeu(float *p, vf x) { _mm512_storeu_ps(p, x); }
static inline vf v_set1(float x) { return _mm512_set1_ps(x); }
static inline vf v_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf v_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf v_div(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vf v_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf v_sqrt(vf a) { return _mm512_sqrt_ps(a); }

static inline vf v_load_f16(const uint16_t *p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
static inline void v_store_f16(uint16_t *p, vf x) {
  _mm256_storeu_si256((__m256i *)p,
                      _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline vf v_load_bf16(const uint16_t *p) {
  __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
static inline void v_store_bf16(uint16_t *p, vf x, int native) {
  if (native) {
    __m256bh h = _mm512_cvtneps_pbh(x);
    _mm256_storeu_si256((__m256i *)p, (__m256i)h);
    return;
  }
  __m512i u = _mm512_castps_si512(x);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, q);
  _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(r));
}
static inline vf v_sign(vf c) {
  vf z = _mm512_setzero_ps();
  vf s = _mm512_mask_mov_ps(z, _mm512_cmp_ps_mask(c, z, _CMP_GT_OQ), _mm512_set1_ps(1.0f));
  s = _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(c, z, _CMP_LT_OQ), _mm512_set1_ps(-1.0f));
  return _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(c, c, _CMP_UNORD_Q), c);
}

static inline vd vd_zero(void) { return _mm512_setzero_pd(); }
static inline void vd_sqacc(vd *a0, vd *a1, vf x) {
  vd lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
  vd hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
  *a0 = _mm512_fmadd_pd(lo, lo, *a0);
  *a1 = _mm512_fmadd_pd(hi, hi, *a1);
}
static inline double vd_hsum(vd a0, vd a1) {
  double t[8];
  _mm512_storeu_pd(t, _mm512_add_pd(a0, a1));
  return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}

/* 32-bit integer lanes: the int8 code and the stochastic-rounding hash */
typedef __m512i vi;
static inline vi vi_set1(uint32_t x) { return _mm512_set1_epi32((int)x); }
static inline vi vi_iota(void) {
  return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}
static inline vi vi_loadu(const uint32_t *p) { return _mm512_loadu_si512((const void *)p); }
static inline vi vi_and(vi a, vi b) { return _mm512_and_si512(a, b); }
static inline vi vi_or(vi a, vi b) { return _mm512_or_si512(a, b); }
static inline vi vi_xor(vi a, vi b) { return _mm512_xor_si512(a, b); }
static inline vi vi_add(vi a, vi b) { return _mm512_add_epi32(a, b); }
static inline vi vi_sub(vi a, vi b) { return _mm512_sub_epi32(a, b); }
static inline vi vi_mullo(vi a, vi b) { return _mm512_mullo_epi32(a, b); }
static inline vi vi_minu(vi a, vi b) { return _mm512_min_epu32(a, b); }
static inline vi vi_maxu(vi a, vi b) { return _mm512_max_epu32(a, b); }
#define vi_srli(a, n) _mm512_srli_epi32((a), (n))
#define vi_slli(a, n) _mm512_slli_epi32((a), (n))
static inline vi vi_sel_gt(vi a, vi b, vi x, vi y) {
  return _mm512_mask_mov_epi32(y, _mm512_cmpgt_epi32_mask(a, b), x);
}
/* a ^ (b & c) */
static inline vi vi_xor_and(vi a, vi b, vi c) { return _mm512_ternarylogic_epi32(a, b, c, 0x78); }
/* a lane with a > b (signed) */
static inline int vi_any_gt(vi a, vi b) { return _mm512_cmpgt_epi32_mask(a, b) != 0; }
/* a lane with (a & m) == 0 */
static inline int vi_any_zero_and(vi a, vi m) { return _mm512_testn_epi32_mask(a, m) != 0; }
/* u | (a > t unsigned ? x : 0) */
static inline vi vi_or_if_gtu(vi u, vi a, vi t, vi x) {
  return _mm512_mask_or_epi32(u, _mm512_cmpgt_epu32_mask(a, t), u, x);
}
/* a NaN lane */
static inline int v_any_nan(vf x) { return _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q) != 0; }
static inline vf vi_as_vf(vi a) { return _mm512_castsi512_ps(a); }
static inline vi vf_as_vi(vf a) { return _mm512_castps_si512(a); }
static inline vf vi_to_vf(vi a) { return _mm512_cvtepi32_ps(a); }
static inline vi vf_rint(vf a) { return _mm512_cvtps_epi32(a); } /* nearest even (MXCSR) */
static inline vi v_load_u8(const uint8_t *p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}
static inline vi v_load_s8(const uint8_t *p) { /* sign-extended */
  return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
}
static inline void v_store_u8(uint8_t *p, vi x) {
  _mm_storeu_si128((__m128i *)p, _mm512_cvtepi32_epi8(x));
}
static inline void v_store_u16(uint16_t *p, vi x) {
  _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(x));
}

#define OPTIM_SIMD_PREFIX optim_kernels_avx512
#define OPTIM_SIMD_NAME   "avx512"
#include "optim/simd_body_impl.h"
