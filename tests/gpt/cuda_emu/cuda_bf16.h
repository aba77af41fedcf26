/* tests/gpt/cuda_emu/cuda_bf16.h — bf16 for the emulated build: the bits
 * and round-to-nearest-even conversions of CUDA's __nv_bfloat16 and
 * __nv_bfloat162. */
#ifndef GPT_EMU_CUDA_BF16_H
#define GPT_EMU_CUDA_BF16_H

#include "cuda_runtime.h"

#include <stdint.h>
#include <string.h>

struct __nv_bfloat16 {
  uint16_t bits;
};
struct __attribute__((aligned(4))) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};

static inline float __bfloat162float(__nv_bfloat16 h) {
  uint32_t u = (uint32_t)h.bits << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline __nv_bfloat16 __float2bfloat16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  __nv_bfloat16 h;
  if ((u & 0x7fffffffu) > 0x7f800000u) { /* NaN stays NaN */
    h.bits = (uint16_t)((u >> 16) | 0x40);
    return h;
  }
  u += 0x7fffu + ((u >> 16) & 1);
  h.bits = (uint16_t)(u >> 16);
  return h;
}
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  __nv_bfloat162 r = {__float2bfloat16(a), __float2bfloat16(b)};
  return r;
}
static inline float2 __bfloat1622float2(__nv_bfloat162 h) {
  return make_float2(__bfloat162float(h.x), __bfloat162float(h.y));
}

#endif
