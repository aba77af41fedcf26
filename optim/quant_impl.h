/* optim/quant_impl.h — the compact-state codecs every kernel shares (scalar
 * reference, AVX2, AVX-512, CUDA): the 8-bit blockwise dynamic code of int8
 * states (signed for exp_avg / Lion's m, unsigned for exp_avg_sq; one fp32
 * absmax per block) and the counter-based hash behind stochastic rounding of
 * a bf16 master. Plain C, host and device functions under nvcc, so every
 * kernel computes exactly these bits.
 */
#ifndef FERRY_OPTIM_QUANT_IMPL_H
#define FERRY_OPTIM_QUANT_IMPL_H

#include "core/dtype.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define OPTIM_Q_FN static inline __host__ __device__
#else
#define OPTIM_Q_FN static inline
#endif

/* Smallest normal fp32: a block whose absmax is below it (zero, subnormal)
 * is stored as absmax 0 with all codes 0. */
#define OPTIM_Q_TINY 1.17549435e-38f

/* ---- the int8 code ------------------------------------------------------- */
/* a = |value x (1 / absmax)|, in [0, 1] up to rounding.
 * Signed: sign bit 0x80 (only with a nonzero magnitude); magnitude u of 7
 * bits = 4-bit exponent, 3-bit mantissa, u = 127 is 1.875, u < 8 linear in
 * steps of 2^-17. Unsigned: 5-bit exponent, 3-bit mantissa, u = 255 is
 * 1.875, u < 8 linear in steps of 2^-33. Rounding: to nearest, ties to even,
 * on the fp32 bits.
 * Non-finite values keep their own element, as in an fp32 state: a block
 * holding one stores its absmax (the max over its finite values) with the
 * sign bit set, and there the two largest magnitudes are inf (signed: with
 * its sign) and NaN. A finite value never takes them (|x| <= absmax gives at
 * most 1.0: u = 120 signed, 248 unsigned). */

OPTIM_Q_FN uint32_t optim_q_mag(float a, float lin_lim, float lin_scale, uint32_t bias,
                                uint32_t umax) {
  if (a < lin_lim) return (uint32_t)rintf(a * lin_scale);
  uint32_t b = ferry_f32_bits(a);
  uint32_t r = b + 0x7FFFFu + ((b >> 20) & 1u);
  uint32_t u = (r >> 20) - (bias << 3);
  return u < umax ? u : umax;
}

/* The codes of inf and NaN (magnitudes; a signed -inf adds 0x80), and the
 * largest code a finite value is clamped to. */
#define OPTIM_Q_S_INF 0x7Fu
#define OPTIM_Q_S_NAN 0x7Eu
#define OPTIM_Q_U_INF 0xFFu
#define OPTIM_Q_U_NAN 0xFEu

OPTIM_Q_FN int optim_q_finite(float x) { return fabsf(x) <= 3.40282347e38f; }
/* The sign bit of a block's absmax: the block holds inf or NaN codes. */
OPTIM_Q_FN int optim_q_marked(float absmax) { return (int)(ferry_f32_bits(absmax) >> 31); }

/* Encodes a finite x with inv = 1 / absmax (optim_q_put_s/_u below choose
 * the code of inf, NaN, and of a block whose inverse is 0). */
OPTIM_Q_FN uint8_t optim_q_enc_s(float x, float inv) {
  float y = x * inv;
  uint32_t u = optim_q_mag(fabsf(y), 0x1p-14f, 0x1p17f, 112u, OPTIM_Q_S_NAN - 1u);
  return (uint8_t)(u && y < 0.0f ? (u | 0x80u) : u);
}
OPTIM_Q_FN uint8_t optim_q_enc_u(float x, float inv) {
  return (uint8_t)optim_q_mag(fabsf(x * inv), 0x1p-30f, 0x1p33f, 96u, OPTIM_Q_U_NAN - 1u);
}

/* The code stored for x in a block of inverse inv (0: finite values code 0);
 * inf and NaN take their own codes. */
OPTIM_Q_FN uint8_t optim_q_put_s(float x, float inv) {
  if (!optim_q_finite(x))
    return (uint8_t)(x != x ? OPTIM_Q_S_NAN : x < 0.0f ? OPTIM_Q_S_INF | 0x80u : OPTIM_Q_S_INF);
  return inv != 0.0f ? optim_q_enc_s(x, inv) : 0;
}
OPTIM_Q_FN uint8_t optim_q_put_u(float x, float inv) {
  if (!optim_q_finite(x)) return (uint8_t)(x != x ? OPTIM_Q_U_NAN : OPTIM_Q_U_INF);
  return inv != 0.0f ? optim_q_enc_u(x, inv) : 0;
}

/* The code's value before scaling by absmax. */
OPTIM_Q_FN float optim_q_val(uint32_t u, float lin_step, uint32_t bias) {
  return u < 8u ? (float)u * lin_step
                : ferry_f32_from_bits((((u >> 3) + bias) << 23) | ((u & 7u) << 20));
}
/* inf, or NaN for the NaN code */
OPTIM_Q_FN float optim_q_special(int nan) {
  return ferry_f32_from_bits(nan ? 0x7FC00000u : 0x7F800000u);
}
OPTIM_Q_FN float optim_q_dec_s(uint8_t c, float absmax) {
  if (optim_q_marked(absmax)) {
    if ((c & 0x7Fu) >= OPTIM_Q_S_NAN) {
      float x = optim_q_special((c & 0x7Fu) == OPTIM_Q_S_NAN);
      return (c & 0x80u) ? -x : x;
    }
    absmax = -absmax;
  }
  float x = optim_q_val(c & 0x7Fu, 0x1p-17f, 112u) * absmax;
  return (c & 0x80u) ? -x : x;
}
OPTIM_Q_FN float optim_q_dec_u(uint8_t c, float absmax) {
  if (optim_q_marked(absmax)) {
    if (c >= OPTIM_Q_U_NAN) return optim_q_special(c == OPTIM_Q_U_NAN);
    absmax = -absmax;
  }
  return optim_q_val(c, 0x1p-33f, 96u) * absmax;
}

/* The absmax stored for a block whose largest finite |value| is amax and
 * where `bad` says a value was inf or NaN: 0 for a block below the smallest
 * normal, else amax; negated (the mark) when bad. */
OPTIM_Q_FN float optim_q_absmax(float amax, int bad) {
  float a = amax < OPTIM_Q_TINY ? 0.0f : amax;
  return bad ? -a : a;
}
/* 1 / |absmax|, or 0 when the finite codes are all 0 (absmax 0, or a NaN
 * absmax): x * 0 = 0 encodes as 0 for any finite x. */
OPTIM_Q_FN float optim_q_inv(float absmax) {
  float a = fabsf(absmax);
  return a > 0.0f ? 1.0f / a : 0.0f;
}

/* The int8 buffer of a state of n elements: codes first, then the absmax. */
static inline float *optim_q_absmax_ptr(void *state, size_t n) {
  return (float *)((char *)state + (n + 63) / 64 * 64);
}

/* ---- stochastic rounding ------------------------------------------------- */

/* lowbias32 (a 32-bit integer hash with low bias). */
OPTIM_Q_FN uint32_t optim_hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

/* The key of one step: mixes the seed and the step count. */
OPTIM_Q_FN uint32_t optim_sr_key(uint64_t seed, int64_t step) {
  uint64_t st = (uint64_t)step;
  uint32_t h = optim_hash32((uint32_t)(st >> 32) ^ 0x9e3779b9u);
  h = optim_hash32(h ^ (uint32_t)st);
  h = optim_hash32(h ^ (uint32_t)(seed >> 32));
  return optim_hash32(h ^ (uint32_t)seed);
}
/* The key of the 2^32 elements sharing the high half of their index. */
OPTIM_Q_FN uint32_t optim_sr_hikey(uint32_t key, uint64_t idx) {
  return optim_hash32(key ^ (uint32_t)(idx >> 32) ^ 0x85ebca6bu);
}
/* 16 random bits of element idx. */
OPTIM_Q_FN uint32_t optim_sr_bits(uint32_t hikey, uint64_t idx) {
  return optim_hash32(hikey ^ (uint32_t)idx) >> 16;
}
/* fp32 -> bf16 with stochastic rounding by r (16 bits); NaN kept, quiet. */
OPTIM_Q_FN uint16_t optim_bf16_sr(float x, uint32_t r) {
  uint32_t u = ferry_f32_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + r) >> 16);
}

#endif /* FERRY_OPTIM_QUANT_IMPL_H */
