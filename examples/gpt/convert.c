/* examples/gpt/convert.c — fp16 / bf16 <-> fp32 scalar conversions of the
 * example: loading 16-bit safetensors, and the engine provider's per-group
 * fp32 scratch over 16-bit engine params and grads (round to nearest even,
 * NaN kept quiet, fp16 overflow to inf).
 */
#include "gpt.h"

#include <string.h>

float gpt_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
  if (e == 0) {
    if (m == 0) {
      bits = sign;
    } else { /* subnormal */
      int sh = 0;
      while (!(m & 0x400)) m <<= 1, sh++;
      m &= 0x3ff;
      bits = sign | (uint32_t)(127 - 15 + 1 - sh) << 23 | m << 13;
    }
  } else if (e == 31) {
    bits = sign | 0x7f800000u | m << 13;
  } else {
    bits = sign | (e - 15 + 127) << 23 | m << 13;
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

float gpt_bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t gpt_f32_to_bf16(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((b >> 16) | 0x40); /* quiet NaN */
  b += 0x7fffu + ((b >> 16) & 1);
  return (uint16_t)(b >> 16);
}

uint16_t gpt_f32_to_f16(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  uint32_t sign = (b >> 16) & 0x8000u, a = b & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);         /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);        /* rounds past 65504: inf */
  if (a < 0x38800000u) {                                          /* fp16 subnormal or zero */
    if (a < 0x33000000u) return (uint16_t)sign;                   /* below half the smallest */
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    int shift = 126 - (int)(a >> 23);                             /* 14 + (113 - e) - 1 */
    uint32_t v = m >> shift, rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (v & 1))) v++;
    return (uint16_t)(sign | v);
  }
  uint32_t v = ((a >> 13) - (112u << 10)), rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (v & 1))) v++;
  return (uint16_t)(sign | v);
}
