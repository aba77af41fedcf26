/* examples/gpt/gpt_rng_lanes.h — gpt_rng.h's normals for GPT_RNG_LANES
 * counters at once, on the CPU: the same operations in the same order, one
 * loop over the lanes per step, with the branches made selects, so that the
 * compiler runs the lanes in SIMD registers. Every operation is one IEEE
 * 754 operation (+, -, *, /, sqrt, exact conversions) done alone (the
 * includer is compiled with -ffp-contract=off), so lane l gives
 * gpt_rng_normal4's values bit for bit (tests/gpt/test_init.c compares
 * them, edge words included).
 */
#ifndef GPT_RNG_LANES_H
#define GPT_RNG_LANES_H

#include "gpt_rng.h"

#define GPT_RNG_LANES 16

/* gpt_rng_log_u1 of each a[l], times -2, square-rooted: the radius. */
static inline void gpt_rng_lanes_radius(const uint32_t *a, double *r) {
  for (int l = 0; l < GPT_RNG_LANES; l++) {
    double n = (double)a[l] + 1.0; /* exact: (a + 1) at most 2^32 */
    uint64_t b = gpt_rng_bits(n);
    int64_t e = (int64_t)(b >> 52) - 1023 - 32;
    double m = gpt_rng_from_bits((b & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull);
    int big = m > 1.4142135623730951;
    m = big ? m * 0.5 : m; /* exact */
    e += big;
    double s = (m - 1.0) / (m + 1.0);
    double z = s * s;
    double t = 0.058823529411764705;
    t = 0.06666666666666667 + z * t;
    t = 0.07692307692307693 + z * t;
    t = 0.09090909090909091 + z * t;
    t = 0.1111111111111111 + z * t;
    t = 0.14285714285714285 + z * t;
    t = 0.2 + z * t;
    t = 0.3333333333333333 + z * t;
    t = 1.0 + z * t;
    double ln = (2.0 * s) * t + (double)e * 0.6931471805599453;
    r[l] = sqrt(-2.0 * ln);
  }
}

/* gpt_rng_cos_sin of each b[l]. */
static inline void gpt_rng_lanes_cos_sin(const uint32_t *b, double *c_out, double *s_out) {
  for (int l = 0; l < GPT_RNG_LANES; l++) {
    uint32_t o = b[l] >> 29, r = b[l] & 0x1FFFFFFFu;
    r = (o & 1u) ? 0x20000000u - r : r;
    double x = (double)r * 1.4629180792671596e-09;
    double z = x * x;
    double t = 7.647163731819816e-13;
    t = 1.6059043836821613e-10 - z * t;
    t = 2.505210838544172e-08 - z * t;
    t = 2.7557319223985893e-06 - z * t;
    t = 0.0001984126984126984 - z * t;
    t = 0.008333333333333333 - z * t;
    t = 0.16666666666666666 - z * t;
    t = 1.0 - z * t;
    double s = x * t;
    t = 4.779477332387385e-14;
    t = 1.1470745597729725e-11 - z * t;
    t = 2.08767569878681e-09 - z * t;
    t = 2.755731922398589e-07 - z * t;
    t = 2.48015873015873e-05 - z * t;
    t = 0.001388888888888889 - z * t;
    t = 0.041666666666666664 - z * t;
    t = 0.5 - z * t;
    double c = 1.0 - z * t;
    int swap = ((o + 1u) & 2u) != 0;
    double cs = swap ? s : c, sn = swap ? c : s;
    c_out[l] = (o - 2u) < 4u ? -cs : cs;
    s_out[l] = o >= 4u ? -sn : sn;
  }
}

/* Values 4 c0 .. 4 (c0 + GPT_RNG_LANES) - 1 of tensor i under seed, each
 * times scale (one fp32 multiply), into out. */
static inline void gpt_rng_lanes_normal(uint64_t seed, uint32_t tensor, uint64_t c0, float scale,
                                        float *out) {
  uint32_t w0[GPT_RNG_LANES], w1[GPT_RNG_LANES], w2[GPT_RNG_LANES], w3[GPT_RNG_LANES];
  for (int l = 0; l < GPT_RNG_LANES; l++) {
    uint64_t c = c0 + (uint64_t)l;
    w0[l] = (uint32_t)c, w1[l] = (uint32_t)(c >> 32), w2[l] = tensor, w3[l] = 0;
  }
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int round = 0; round < 10; round++) { /* gpt_philox4x32, lane by lane */
    for (int l = 0; l < GPT_RNG_LANES; l++) {
      uint64_t p0 = (uint64_t)0xD2511F53u * w0[l], p1 = (uint64_t)0xCD9E8D57u * w2[l];
      uint32_t n0 = (uint32_t)(p1 >> 32) ^ w1[l] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ w3[l] ^ k1;
      w1[l] = (uint32_t)p1;
      w3[l] = (uint32_t)p0;
      w0[l] = n0;
      w2[l] = n2;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  double r[GPT_RNG_LANES], co[GPT_RNG_LANES], si[GPT_RNG_LANES];
  for (int p = 0; p < 2; p++) {
    gpt_rng_lanes_radius(p ? w2 : w0, r);
    gpt_rng_lanes_cos_sin(p ? w3 : w1, co, si);
    for (int l = 0; l < GPT_RNG_LANES; l++) {
      out[4 * l + 2 * p] = (float)(r[l] * co[l]) * scale;
      out[4 * l + 2 * p + 1] = (float)(r[l] * si[l]) * scale;
    }
  }
}

#endif /* GPT_RNG_LANES_H */
