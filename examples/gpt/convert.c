/* examples/gpt/convert.c — one-element fp16 / bf16 <-> fp32 conversions of
 * the example, through the library's (ferry_dtype_load/store: round to
 * nearest even, NaN kept quiet, fp16 overflow to inf); whole buffers go
 * through ferry_dtype_convert.
 */
#include "gpt.h"

float gpt_f16_to_f32(uint16_t h) { return ferry_dtype_load(&h, FERRY_DT_F16, 0); }

float gpt_bf16_to_f32(uint16_t h) { return ferry_dtype_load(&h, FERRY_DT_BF16, 0); }

uint16_t gpt_f32_to_bf16(float f) {
  uint16_t h;
  ferry_dtype_store(&h, FERRY_DT_BF16, 0, f);
  return h;
}

uint16_t gpt_f32_to_f16(float f) {
  uint16_t h;
  ferry_dtype_store(&h, FERRY_DT_F16, 0, f);
  return h;
}
