/* core/convert.c — the bulk bf16 <-> fp32 conversions that trainers run on
 * every step (bf16 params widened for the host's fp32 compute, fp32 grads
 * narrowed back), as branch-free loops over restrict pointers that the
 * compiler vectorises. The bits are those of ferry_bf16_to_f32 and
 * ferry_f32_to_bf16 (core/dtype.h) times one scale: a multiply and integer
 * operations only, so every instruction set gives the same bits. On x86-64
 * with GCC (not under TSan) each loop is also built for AVX2 and AVX-512, the
 * best one the CPU has is picked at load time. Compiled with -O3 and
 * -ffp-contract=off (core/CMakeLists.txt).
 */
#include "core/convert.h"

#include "core/dtype.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define CONVERT_CLONES __attribute__((target_clones("default", "avx2", "arch=x86-64-v4")))
#else
#define CONVERT_CLONES
#endif

CONVERT_CLONES
void ferry_convert_bf16_f32(float *restrict dst, const uint16_t *restrict src, size_t n,
                            float scale) {
  for (size_t i = 0; i < n; i++) dst[i] = ferry_f32_from_bits((uint32_t)src[i] << 16) * scale;
}

CONVERT_CLONES
void ferry_convert_f32_bf16(uint16_t *restrict dst, const float *restrict src, size_t n,
                            float scale) {
  for (size_t i = 0; i < n; i++) {
    uint32_t u = ferry_f32_bits(src[i] * scale);
    /* a NaN made quiet, anything else rounded to nearest even at bit 16 */
    uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
    uint32_t r = nan ? u | 0x400000u : u + 0x7fffu + ((u >> 16) & 1u);
    dst[i] = (uint16_t)(r >> 16);
  }
}

/* In place (dst == src) or apart: one pointer when they are the same buffer,
 * so that neither loop needs the compiler's overlap check. */
CONVERT_CLONES
static void scale_in_place(float *x, size_t n, float scale) {
  for (size_t i = 0; i < n; i++) x[i] *= scale;
}

CONVERT_CLONES
static void scale_apart(float *restrict dst, const float *restrict src, size_t n, float scale) {
  for (size_t i = 0; i < n; i++) dst[i] = src[i] * scale;
}

void ferry_convert_f32_f32(float *dst, const float *src, size_t n, float scale) {
  if (dst == src)
    scale_in_place(dst, n, scale);
  else
    scale_apart(dst, src, n, scale);
}
