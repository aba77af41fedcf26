/* tests/gpt/cuda_emu/cuda_fp16.h — fp16 for the emulated build: CUDA's
 * __half as its bits, converted as core/dtype.h does (round to nearest
 * even, subnormals kept). */
#ifndef GPT_EMU_CUDA_FP16_H
#define GPT_EMU_CUDA_FP16_H

#include "core/dtype.h"

struct __half {
  uint16_t bits;
};

static inline float __half2float(__half h) { return ferry_f16_to_f32(h.bits); }
static inline __half __float2half(float f) {
  __half h = {ferry_f32_to_f16(f)};
  return h;
}
static inline __half __float2half_rn(float f) { return __float2half(f); }

#endif
