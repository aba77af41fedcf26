/* core/dtype.h — element types: the traits table behind ferry_dtype (name,
 * size, whether a float the kernels convert) and the fp16/bf16 <-> fp32
 * conversions every part uses (round to nearest even, NaN kept and made
 * quiet, as the x86 conversion instructions do). Inline, since the
 * optimizer's scalar reference and tails convert one element at a time.
 */
#ifndef FERRY_CORE_DTYPE_H
#define FERRY_CORE_DTYPE_H

#include "ferry.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Under nvcc the conversions below are host and device functions, so the
 * CUDA converter (device/convert.cu) runs these very lines. */
#ifdef __CUDACC__
#define FERRY_DTYPE_FN static inline __host__ __device__
#else
#define FERRY_DTYPE_FN static inline
#endif

typedef struct {
  const char *name; /* safetensors spelling: "F32", "BF16", ... */
  size_t size;      /* bytes per element */
  int convertible;  /* F32, F16, BF16: loads and stores as float */
  int rank;         /* position in safetensors' own dtype list (BOOL 0 ... U64 14):
                       its writer orders tensors by it, widest-listed first */
} ferry_dtype_traits;

/* The traits of dt; NULL for FERRY_DT_NONE and values out of range. */
const ferry_dtype_traits *ferry_dtype_traits_of(ferry_dtype dt);

FERRY_DTYPE_FN uint32_t ferry_f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
FERRY_DTYPE_FN float ferry_f32_from_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

FERRY_DTYPE_FN float ferry_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) /* inf, or NaN made quiet */
    return ferry_f32_from_bits(sign | 0x7f800000u | (man ? 0x400000u | (man << 13) : 0));
  if (exp == 0) {
    if (!man) return ferry_f32_from_bits(sign);
    /* subnormal: man x 2^-24, exact in fp32 */
    float v = (float)man * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return ferry_f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
}

FERRY_DTYPE_FN uint16_t ferry_f32_to_f16(float x) {
  uint32_t u = ferry_f32_bits(x);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
  if (a < 0x38800000u) {              /* below 2^-14: subnormal half (or zero) */
    if (a < 0x33000000u) return sign; /* below 2^-25: rounds to 0 (2^-25 ties to 0) */
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* value = m x 2^(e-150); half unit 2^-24 */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u); /* round to nearest even at bit 13 */
  return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

FERRY_DTYPE_FN float ferry_bf16_to_f32(uint16_t h) {
  return ferry_f32_from_bits((uint32_t)h << 16);
}

FERRY_DTYPE_FN uint16_t ferry_f32_to_bf16(float x) {
  uint32_t u = ferry_f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* Element i of an F32/F16/BF16 buffer (anything else reads as F32: the
 * callers pass only convertible dtypes). */
FERRY_DTYPE_FN float ferry_dt_load(const void *b, int dt, size_t i) {
  switch (dt) {
  case FERRY_DT_F16: return ferry_f16_to_f32(((const uint16_t *)b)[i]);
  case FERRY_DT_BF16: return ferry_bf16_to_f32(((const uint16_t *)b)[i]);
  default: return ((const float *)b)[i];
  }
}

/* Stores x as element i of an F32/F16/BF16 buffer; other dtypes: nothing. */
FERRY_DTYPE_FN void ferry_dt_store(void *b, int dt, size_t i, float x) {
  switch (dt) {
  case FERRY_DT_F16: ((uint16_t *)b)[i] = ferry_f32_to_f16(x); break;
  case FERRY_DT_BF16: ((uint16_t *)b)[i] = ferry_f32_to_bf16(x); break;
  case FERRY_DT_F32: ((float *)b)[i] = x; break;
  default: break;
  }
}

#endif
