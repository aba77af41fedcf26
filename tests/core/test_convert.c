/* tests/core/test_convert.c — ferry_dtype_convert's vector loops for bf16 <->
 * fp32 (core/convert.c) give the bits of the per-element reference
 * (ferry_bf16_to_f32 / ferry_f32_to_bf16 times the scale): every bf16 value;
 * fp32 values with every upper half and the lower halves that decide the
 * rounding (exact, just below, at and just above the tie, the largest), NaNs
 * and infinities included; several scales; every length up to 70 at four
 * misalignments (the loops' vector bodies and tails). The fp32 scaling
 * (fp32 -> fp32) likewise, apart and in place.
 */
#include "core/dtype.h"

#include "tests/test.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const float k_scales[] = {1.0f, 0.5f, -3.0f, 1.0f / 3.0f, 1e-30f, 65536.0f};
#define NSCALES (sizeof k_scales / sizeof k_scales[0])

/* mismatches of bf16 -> fp32 over all 65536 values at every scale */
static size_t check_widen(void) {
  size_t n = 65536, bad = 0;
  uint16_t *src = malloc(n * sizeof *src);
  float *dst = malloc(n * sizeof *dst);
  REQUIRE(src && dst);
  for (size_t i = 0; i < n; i++) src[i] = (uint16_t)i;
  for (size_t s = 0; s < NSCALES; s++) {
    REQUIRE(ferry_dtype_convert(dst, FERRY_DT_F32, src, FERRY_DT_BF16, n, k_scales[s]) == 0);
    for (size_t i = 0; i < n; i++)
      bad += ferry_f32_bits(dst[i]) != ferry_f32_bits(ferry_bf16_to_f32(src[i]) * k_scales[s]);
  }
  free(src);
  free(dst);
  return bad;
}

/* mismatches of fp32 -> bf16 over every upper half with the lower halves
 * that decide the rounding, at every scale */
static size_t check_narrow(void) {
  static const uint16_t lows[] = {0x0000, 0x0001, 0x7ffe, 0x7fff, 0x8000,
                                  0x8001, 0xc000, 0xfffe, 0xffff, 0x1234};
  size_t nl = sizeof lows / sizeof lows[0], n = 65536 * nl, bad = 0;
  float *src = malloc(n * sizeof *src);
  uint16_t *dst = malloc(n * sizeof *dst);
  REQUIRE(src && dst);
  for (size_t hi = 0; hi < 65536; hi++)
    for (size_t l = 0; l < nl; l++)
      src[hi * nl + l] = ferry_f32_from_bits((uint32_t)hi << 16 | lows[l]);
  for (size_t s = 0; s < NSCALES; s++) {
    REQUIRE(ferry_dtype_convert(dst, FERRY_DT_BF16, src, FERRY_DT_F32, n, k_scales[s]) == 0);
    for (size_t i = 0; i < n; i++) bad += dst[i] != ferry_f32_to_bf16(src[i] * k_scales[s]);
  }
  free(src);
  free(dst);
  return bad;
}

/* mismatches of fp32 -> fp32 (apart, then in place) over the same values */
static size_t check_scale(void) {
  size_t n = 65536 * 3, bad = 0;
  float *src = malloc(n * sizeof *src), *dst = malloc(n * sizeof *dst);
  REQUIRE(src && dst);
  for (size_t i = 0; i < n; i++)
    src[i] = ferry_f32_from_bits((uint32_t)(i / 3) << 16 | (uint32_t)(i % 3) * 0x7fff);
  for (size_t s = 0; s < NSCALES; s++) {
    REQUIRE(ferry_dtype_convert(dst, FERRY_DT_F32, src, FERRY_DT_F32, n, k_scales[s]) == 0);
    for (size_t i = 0; i < n; i++)
      bad += ferry_f32_bits(dst[i]) != ferry_f32_bits(src[i] * k_scales[s]);
    REQUIRE(ferry_dtype_convert(dst, FERRY_DT_F32, dst, FERRY_DT_F32, n, k_scales[s]) == 0);
    for (size_t i = 0; i < n; i++)
      bad += ferry_f32_bits(dst[i]) != ferry_f32_bits(src[i] * k_scales[s] * k_scales[s]);
  }
  free(src);
  free(dst);
  return bad;
}

/* every length 0..70 at offsets 0..3 (both directions): the values right,
 * and the elements around the range untouched */
static size_t check_lengths(void) {
  enum { MAXN = 70, PAD = 8 };
  float f[MAXN + 2 * PAD], w[MAXN + 2 * PAD];
  uint16_t h[MAXN + 2 * PAD];
  size_t bad = 0;
  for (int i = 0; i < MAXN + 2 * PAD; i++) f[i] = (float)i * 1.37f - 40.0f;
  for (size_t off = 0; off < 4; off++)
    for (size_t n = 0; n <= MAXN; n++) {
      for (int i = 0; i < MAXN + 2 * PAD; i++) h[i] = 0xabcd, w[i] = -7.0f;
      REQUIRE(ferry_dtype_convert(h + PAD + off, FERRY_DT_BF16, f + PAD + off, FERRY_DT_F32, n,
                                  1.0f) == 0);
      REQUIRE(ferry_dtype_convert(w + PAD + off, FERRY_DT_F32, h + PAD + off, FERRY_DT_BF16, n,
                                  2.0f) == 0);
      for (size_t i = 0; i < MAXN + 2 * PAD; i++) {
        int in = i >= PAD + off && i < PAD + off + n;
        uint16_t wh = in ? ferry_f32_to_bf16(f[i]) : 0xabcd;
        float ww = in ? ferry_bf16_to_f32(wh) * 2.0f : -7.0f;
        bad += h[i] != wh || ferry_f32_bits(w[i]) != ferry_f32_bits(ww);
      }
    }
  return bad;
}

int main(void) {
  size_t w = check_widen(), n = check_narrow(), s = check_scale(), l = check_lengths();
  printf("bf16 -> fp32: %zu mismatches; fp32 -> bf16: %zu; fp32 -> fp32: %zu; lengths and "
         "offsets: %zu\n", w, n, s, l);
  REQUIRE(w == 0);
  REQUIRE(s == 0);
  REQUIRE(n == 0);
  REQUIRE(l == 0);
  return 0;
}
