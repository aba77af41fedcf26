/* optim/kern_avx2.c — the optimizer kernels for AVX2 + FMA + F16C (8 floats
 * a vector), built with -mavx2 -mfma -mf16c on this file only, so the library
 * still runs on any x86-64; chosen at run time when CPUID reports them.
 */
#include <immintrin.h>
#include <stdint.h>

typedef __m256 vf;
typedef __m256d vd;
#define VW 8

static inline vf v_loadu(const float *p) { return _mm256_loadu_ps(p); }
static inline void v_storeu(float *p, vf x) { _mm256_storeu_ps(p, x); }
static inline vf v_set1(float x) { return _mm256_set1_ps(x); }
static inline vf v_add(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf v_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf v_div(vf a, vf b) { return _mm256_div_ps(a, b); }
static inline vf v_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf v_sqrt(vf a) { return _mm256_sqrt_ps(a); }

static inline vf v_load_f16(const uint16_t *p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
static inline void v_store_f16(uint16_t *p, vf x) {
  _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline vf v_load_bf16(const uint16_t *p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
/* Round to nearest even in integers; NaN made quiet. */
static inline void v_store_bf16(uint16_t *p, vf x, int native) {
  (void)native;
  __m256i u = _mm256_castps_si256(x);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, q, nan);
  __m128i lo = _mm256_castsi256_si128(r), hi = _mm256_extracti128_si256(r, 1);
  _mm_storeu_si128((__m128i *)p, _mm_packus_epi32(lo, hi));
}
/* sign with sign(0) = 0 and NaN kept */
static inline vf v_sign(vf c) {
  vf z = _mm256_setzero_ps();
  vf pos = _mm256_and_ps(_mm256_cmp_ps(c, z, _CMP_GT_OQ), _mm256_set1_ps(1.0f));
  vf neg = _mm256_and_ps(_mm256_cmp_ps(c, z, _CMP_LT_OQ), _mm256_set1_ps(-1.0f));
  return _mm256_blendv_ps(_mm256_or_ps(pos, neg), c, _mm256_cmp_ps(c, c, _CMP_UNORD_Q));
}

static inline vd vd_zero(void) { return _mm256_setzero_pd(); }
static inline void vd_sqacc(vd *a0, vd *a1, vf x) {
  vd lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x)),
     hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
  *a0 = _mm256_fmadd_pd(lo, lo, *a0);
  *a1 = _mm256_fmadd_pd(hi, hi, *a1);
}
static inline double vd_hsum(vd a0, vd a1) {
  double t[4];
  _mm256_storeu_pd(t, _mm256_add_pd(a0, a1));
  return (t[0] + t[1]) + (t[2] + t[3]);
}

/* 32-bit integer lanes: the int8 code and the stochastic-rounding hash */
typedef __m256i vi;
static inline vi vi_set1(uint32_t x) { return _mm256_set1_epi32((int)x); }
static inline vi vi_iota(void) { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }
static inline vi vi_loadu(const uint32_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline vi vi_and(vi a, vi b) { return _mm256_and_si256(a, b); }
static inline vi vi_or(vi a, vi b) { return _mm256_or_si256(a, b); }
static inline vi vi_xor(vi a, vi b) { return _mm256_xor_si256(a, b); }
static inline vi vi_add(vi a, vi b) { return _mm256_add_epi32(a, b); }
static inline vi vi_sub(vi a, vi b) { return _mm256_sub_epi32(a, b); }
static inline vi vi_mullo(vi a, vi b) { return _mm256_mullo_epi32(a, b); }
static inline vi vi_minu(vi a, vi b) { return _mm256_min_epu32(a, b); }
static inline vi vi_maxu(vi a, vi b) { return _mm256_max_epu32(a, b); }
#define vi_srli(a, n) _mm256_srli_epi32((a), (n))
#define vi_slli(a, n) _mm256_slli_epi32((a), (n))
/* a > b (signed) ? x : y */
static inline vi vi_sel_gt(vi a, vi b, vi x, vi y) {
  return _mm256_blendv_epi8(y, x, _mm256_cmpgt_epi32(a, b));
}
/* a ^ (b & c) */
static inline vi vi_xor_and(vi a, vi b, vi c) { return _mm256_xor_si256(a, _mm256_and_si256(b, c)); }
/* a lane with a > b (signed) */
static inline int vi_any_gt(vi a, vi b) {
  return _mm256_movemask_epi8(_mm256_cmpgt_epi32(a, b)) != 0;
}
/* a lane with (a & m) == 0 */
static inline int vi_any_zero_and(vi a, vi m) {
  return _mm256_movemask_epi8(_mm256_cmpeq_epi32(_mm256_and_si256(a, m), _mm256_setzero_si256())) != 0;
}
/* u | (a > t unsigned ? x : 0) */
static inline vi vi_or_if_gtu(vi u, vi a, vi t, vi x) {
  const vi flip = _mm256_set1_epi32((int)0x80000000u);
  vi gt = _mm256_cmpgt_epi32(_mm256_xor_si256(a, flip), _mm256_xor_si256(t, flip));
  return _mm256_or_si256(u, _mm256_and_si256(gt, x));
}
/* a NaN lane */
static inline int v_any_nan(vf x) { return _mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)); }
static inline vf vi_as_vf(vi a) { return _mm256_castsi256_ps(a); }
static inline vi vf_as_vi(vf a) { return _mm256_castps_si256(a); }
static inline vf vi_to_vf(vi a) { return _mm256_cvtepi32_ps(a); }
static inline vi vf_rint(vf a) { return _mm256_cvtps_epi32(a); } /* nearest even (MXCSR) */
static inline vi v_load_u8(const uint8_t *p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
static inline vi v_load_s8(const uint8_t *p) { /* sign-extended */
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
static inline void v_store_u8(uint8_t *p, vi x) { /* lanes hold 0..255 */
  __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
  _mm_storel_epi64((__m128i *)p, _mm_packus_epi16(w, w));
}
static inline void v_store_u16(uint16_t *p, vi x) { /* lanes hold 0..65535 */
  _mm_storeu_si128((__m128i *)p,
                   _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1)));
}

#define OPTIM_SIMD_PREFIX optim_kernels_avx2
#define OPTIM_SIMD_NAME   "avx2"
#include "optim/simd_body_impl.h"
