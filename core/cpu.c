/* core/cpu.c — which SIMD instruction sets this CPU and OS support (CPUID
 * and XGETBV), shared by optim/ (kernel choice) and ferry info, and the
 * OpenBLAS kernel they call for when OpenBLAS does not know the CPU (one
 * choice for ferry-gpt and ferry info).
 */
#include "core/core.h"

#include <string.h>

const char *ferry_cpu_blas_kernel(unsigned simd, const char *pick) {
  /* OpenBLAS (DYNAMIC_ARCH) falls back to Prescott, its SSE3 kernels, on
   * a CPU model it does not know; any other pick is its own and is kept. */
  if (!pick || strcmp(pick, "Prescott")) return NULL;
  const unsigned avx512 = FERRY_SIMD_AVX512F | FERRY_SIMD_AVX512BW | FERRY_SIMD_AVX512VL;
  const unsigned avx2 = FERRY_SIMD_AVX2 | FERRY_SIMD_FMA;
  if ((simd & avx512) == avx512)
    return simd & FERRY_SIMD_AVX512BF16 ? "Cooperlake" : "SkylakeX";
  if ((simd & avx2) == avx2) return "Haswell";
  return NULL;
}

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t xgetbv0(void) {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}

unsigned ferry_cpu_simd(void) {
  unsigned a, b, c, d, f = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  if (c & (1u << 20)) f |= FERRY_SIMD_SSE42;
  int osxsave = (c & (1u << 27)) != 0;
  uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  int ymm = (xcr0 & 0x6) == 0x6;      /* XMM and YMM state enabled */
  int zmm = (xcr0 & 0xe6) == 0xe6;    /* plus opmask and ZMM state */
  if (ymm && (c & (1u << 12))) f |= FERRY_SIMD_FMA;
  if (ymm && (c & (1u << 29))) f |= FERRY_SIMD_F16C;
  if (__get_cpuid_max(0, NULL) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  if (ymm && (b & (1u << 5))) f |= FERRY_SIMD_AVX2;
  if (zmm && (b & (1u << 16))) f |= FERRY_SIMD_AVX512F;
  if (zmm && (b & (1u << 30))) f |= FERRY_SIMD_AVX512BW;
  if (zmm && (b & (1u << 31))) f |= FERRY_SIMD_AVX512VL;
  if (zmm && (d & (1u << 23))) f |= FERRY_SIMD_AVX512FP16;
  unsigned a1, b1, c1, d1;
  __cpuid_count(7, 1, a1, b1, c1, d1);
  if (zmm && (a1 & (1u << 5))) f |= FERRY_SIMD_AVX512BF16;
  return f;
}
#else
unsigned ferry_cpu_simd(void) { return 0; }
#endif
