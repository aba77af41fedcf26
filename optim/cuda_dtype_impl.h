/* optim/cuda_dtype_impl.h — the element conversions the optimizer's CUDA
 * kernels share (adamw_cuda.cu, reduce_cuda.cu): fp16/bf16 to fp32 and back,
 * rounding to nearest even with NaNs kept, as the CPU kernels do. Device
 * code only: included by .cu files.
 */
#ifndef FERRY_OPTIM_CUDA_DTYPE_IMPL_H
#define FERRY_OPTIM_CUDA_DTYPE_IMPL_H

#include "ferry.h"

#include <stddef.h>
#include <stdint.h>

__device__ static inline float d_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return __uint_as_float(sign | 0x7f800000u | (man ? 0x400000u | (man << 13) : 0));
  if (exp == 0) {
    float v = (float)man * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
}

__device__ static inline uint16_t d_f32_to_f16(float x) {
  uint32_t u = __float_as_uint(x);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
  if (a < 0x38800000u) {
    if (a < 0x33000000u) return sign;
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e;
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
  return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

__device__ static inline uint16_t d_f32_to_bf16(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__device__ static inline float d_load_g(const void *g, int dt, size_t i) {
  if (dt == FERRY_DT_F16) return d_f16_to_f32(((const uint16_t *)g)[i]);
  if (dt == FERRY_DT_BF16) return __uint_as_float((uint32_t)((const uint16_t *)g)[i] << 16);
  return ((const float *)g)[i];
}

#endif /* FERRY_OPTIM_CUDA_DTYPE_IMPL_H */
