/* examples/gpt/gpt_rng.h — the counter-based normal generator of the
 * weights' init, one set of lines for the CPU (init.c) and the GPU
 * (init_cuda.cu): value k of tensor i under seed is a pure function of
 * (seed, i, k), so the values depend neither on the order tensors are made
 * in, nor on how a tensor is split over threads, nor on the device.
 *
 * Counter c of tensor i gives values 4c .. 4c+3: Philox-4x32-10 with key
 * seed and counter (c low, c high, i, 0) gives four 32-bit words; each pair
 * (a, b) is one Box-Muller draw, u1 = (a + 1) / 2^32 in (0, 1] and angle
 * 2 pi b / 2^32, whose cosine and sine give two values.
 *
 * Bit-identical results on both sides. The integer part (Philox, the
 * octant of the angle, the exponent of u1) is exact anywhere. The
 * floating-point part runs in double precision with +, -, *, / and sqrt
 * only, the operations IEEE 754 rounds correctly on the CPU and on the
 * GPU; log, sin and cos are this file's own polynomials (not libm's nor
 * CUDA's, which differ in their last bits), evaluated in a fixed order.
 * What could still differ is contraction of a*b+c into one FMA, which
 * rounds once instead of twice: on the device every operation is an
 * explicit round-to-nearest intrinsic (__dmul_rn, __dadd_rn, ...), which
 * nvcc never contracts; on the host the files that include this header are
 * compiled with -ffp-contract=off (examples/gpt/CMakeLists.txt), and x86-64
 * evaluates double in double (FLT_EVAL_METHOD 0, checked below). The
 * result is rounded once to float; a 0.02 scale is then one fp32 multiply
 * (__fmul_rn on the device). The polynomials are accurate to about 1e-16,
 * far below that rounding: their job is equality, not the last ulp.
 */
#ifndef GPT_RNG_H
#define GPT_RNG_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define GPT_RNG_FN static inline __host__ __device__
#else
#define GPT_RNG_FN static inline
#include <float.h>
#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "gpt_rng.h needs double arithmetic evaluated in double (FLT_EVAL_METHOD 0)"
#endif
#endif

#ifdef __CUDA_ARCH__
#define GPT_RNG_ADD(a, b) __dadd_rn((a), (b))
#define GPT_RNG_SUB(a, b) __dsub_rn((a), (b))
#define GPT_RNG_MUL(a, b) __dmul_rn((a), (b))
#define GPT_RNG_DIV(a, b) __ddiv_rn((a), (b))
#define GPT_RNG_SQRT(a) __dsqrt_rn(a)
#define GPT_RNG_FMUL(a, b) __fmul_rn((a), (b))
#else
#define GPT_RNG_ADD(a, b) ((a) + (b))
#define GPT_RNG_SUB(a, b) ((a) - (b))
#define GPT_RNG_MUL(a, b) ((a) * (b))
#define GPT_RNG_DIV(a, b) ((a) / (b))
#define GPT_RNG_SQRT(a) sqrt(a)
#define GPT_RNG_FMUL(a, b) ((a) * (b))
#endif

/* Philox-4x32-10 (Salmon et al., SC'11): ten rounds of two 32x32->64
 * multiplies, the key bumped by the Weyl constants between rounds. */
GPT_RNG_FN void gpt_philox4x32(uint32_t ctr[4], uint64_t seed) {
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * ctr[0], p1 = (uint64_t)0xCD9E8D57u * ctr[2];
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ ctr[1] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ ctr[3] ^ k1;
    ctr[1] = (uint32_t)p1;
    ctr[3] = (uint32_t)p0;
    ctr[0] = n0;
    ctr[2] = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}

GPT_RNG_FN uint64_t gpt_rng_bits(double x) {
#ifdef __CUDA_ARCH__
  return (uint64_t)__double_as_longlong(x);
#else
  uint64_t u;
  memcpy(&u, &x, 8);
  return u;
#endif
}

GPT_RNG_FN double gpt_rng_from_bits(uint64_t u) {
#ifdef __CUDA_ARCH__
  return __longlong_as_double((long long)u);
#else
  double x;
  memcpy(&x, &u, 8);
  return x;
#endif
}

/* ln((a + 1) / 2^32), in (-22.2, 0]: u1 = m 2^e with m in [sqrt(1/2),
 * sqrt(2)), ln m = 2 atanh(s) = 2 s (1 + s^2/3 + s^4/5 + ...) with
 * s = (m - 1) / (m + 1), |s| < 0.172 (9 terms: error below 1e-17). */
GPT_RNG_FN double gpt_rng_log_u1(uint32_t a) {
  double n = (double)((uint64_t)a + 1); /* exact: at most 2^32 */
  uint64_t b = gpt_rng_bits(n);
  int e = (int)(b >> 52) - 1023 - 32;
  double m = gpt_rng_from_bits((b & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull);
  if (m > 1.4142135623730951) {
    m = GPT_RNG_MUL(m, 0.5); /* exact */
    e += 1;
  }
  double s = GPT_RNG_DIV(GPT_RNG_SUB(m, 1.0), GPT_RNG_ADD(m, 1.0));
  double z = GPT_RNG_MUL(s, s);
  double t = 0.058823529411764705;
  t = GPT_RNG_ADD(0.06666666666666667, GPT_RNG_MUL(z, t));
  t = GPT_RNG_ADD(0.07692307692307693, GPT_RNG_MUL(z, t));
  t = GPT_RNG_ADD(0.09090909090909091, GPT_RNG_MUL(z, t));
  t = GPT_RNG_ADD(0.1111111111111111, GPT_RNG_MUL(z, t));
  t = GPT_RNG_ADD(0.14285714285714285, GPT_RNG_MUL(z, t));
  t = GPT_RNG_ADD(0.2, GPT_RNG_MUL(z, t));
  t = GPT_RNG_ADD(0.3333333333333333, GPT_RNG_MUL(z, t));
  t = GPT_RNG_ADD(1.0, GPT_RNG_MUL(z, t));
  return GPT_RNG_ADD(GPT_RNG_MUL(GPT_RNG_MUL(2.0, s), t),
                     GPT_RNG_MUL((double)e, 0.6931471805599453));
}

/* cos and sin of 2 pi b / 2^32: the top 3 bits pick the octant, the other
 * 29 the angle within it, reflected in odd octants so that the polynomials
 * only see [0, pi/4] (Taylor to x^15 / x^16: error below 1e-16). */
GPT_RNG_FN void gpt_rng_cos_sin(uint32_t b, double *c_out, double *s_out) {
  uint32_t o = b >> 29, r = b & 0x1FFFFFFFu;
  if (o & 1u) r = 0x20000000u - r;
  double x = GPT_RNG_MUL((double)r, 1.4629180792671596e-09); /* (pi/4) / 2^29 */
  double z = GPT_RNG_MUL(x, x);
  double t = 7.647163731819816e-13;
  t = GPT_RNG_SUB(1.6059043836821613e-10, GPT_RNG_MUL(z, t));
  t = GPT_RNG_SUB(2.505210838544172e-08, GPT_RNG_MUL(z, t));
  t = GPT_RNG_SUB(2.7557319223985893e-06, GPT_RNG_MUL(z, t));
  t = GPT_RNG_SUB(0.0001984126984126984, GPT_RNG_MUL(z, t));
  t = GPT_RNG_SUB(0.008333333333333333, GPT_RNG_MUL(z, t));
  t = GPT_RNG_SUB(0.16666666666666666, GPT_RNG_MUL(z, t));
  t = GPT_RNG_SUB(1.0, GPT_RNG_MUL(z, t));
  double s = GPT_RNG_MUL(x, t);
  t = 4.779477332387385e-14;
  t = GPT_RNG_SUB(1.1470745597729725e-11, GPT_RNG_MUL(z, t));
  t = GPT_RNG_SUB(2.08767569878681e-09, GPT_RNG_MUL(z, t));
  t = GPT_RNG_SUB(2.755731922398589e-07, GPT_RNG_MUL(z, t));
  t = GPT_RNG_SUB(2.48015873015873e-05, GPT_RNG_MUL(z, t));
  t = GPT_RNG_SUB(0.001388888888888889, GPT_RNG_MUL(z, t));
  t = GPT_RNG_SUB(0.041666666666666664, GPT_RNG_MUL(z, t));
  t = GPT_RNG_SUB(0.5, GPT_RNG_MUL(z, t));
  double c = GPT_RNG_SUB(1.0, GPT_RNG_MUL(z, t));
  /* octants 1, 2, 5, 6 swap cosine and sine; the cosine is negative in
   * 2..5, the sine in 4..7 */
  double cs = ((o + 1u) & 2u) ? s : c, sn = ((o + 1u) & 2u) ? c : s;
  *c_out = (o - 2u) < 4u ? -cs : cs;
  *s_out = o >= 4u ? -sn : sn;
}

/* Values 4c .. 4c+3 of tensor i under seed: standard normals in fp32. */
GPT_RNG_FN void gpt_rng_normal4(uint64_t seed, uint32_t tensor, uint64_t c, float out[4]) {
  uint32_t w[4] = {(uint32_t)c, (uint32_t)(c >> 32), tensor, 0};
  gpt_philox4x32(w, seed);
  for (int p = 0; p < 2; p++) {
    double r = GPT_RNG_SQRT(GPT_RNG_MUL(-2.0, gpt_rng_log_u1(w[2 * p])));
    double co, si;
    gpt_rng_cos_sin(w[2 * p + 1], &co, &si);
    out[2 * p] = (float)GPT_RNG_MUL(r, co);
    out[2 * p + 1] = (float)GPT_RNG_MUL(r, si);
  }
}

#endif /* GPT_RNG_H */
