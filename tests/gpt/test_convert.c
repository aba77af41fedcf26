/* tests/gpt/test_convert.c — the example's fp16 / bf16 <-> fp32
 * conversions (convert.c), which the engine provider runs on every fetch and
 * grad hand-in: every 16-bit value survives a round trip, ties round to
 * even, fp16 overflows to inf and underflows through its subnormals.
 */
#include "gpt.h"

#include "tests/test.h"

#include <math.h>
#include <string.h>

static float bits_f(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}

int main(void) {
  for (uint32_t h = 0; h < 65536; h++) {
    float a = gpt_f16_to_f32((uint16_t)h), b = gpt_bf16_to_f32((uint16_t)h);
    if (isnan(a)) EXPECT(isnan(gpt_f16_to_f32(gpt_f32_to_f16(a))));
    else EXPECT(gpt_f32_to_f16(a) == h);
    if (isnan(b)) EXPECT(isnan(gpt_bf16_to_f32(gpt_f32_to_bf16(b))));
    else EXPECT(gpt_f32_to_bf16(b) == h);
  }
  /* ties to even */
  EXPECT(gpt_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80);       /* 1.0 */
  EXPECT(gpt_f32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82);   /* up to the even 1 + 2^-6 */
  EXPECT(gpt_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81);
  EXPECT(gpt_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00);
  EXPECT(gpt_f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02);
  /* fp16 range */
  EXPECT(gpt_f32_to_f16(65504.0f) == 0x7bff);
  EXPECT(gpt_f32_to_f16(65519.0f) == 0x7bff);
  EXPECT(gpt_f32_to_f16(65520.0f) == 0x7c00);
  EXPECT(gpt_f32_to_f16(-1e9f) == 0xfc00);
  EXPECT(gpt_f32_to_f16(0x1p-24f) == 0x0001);               /* smallest subnormal */
  EXPECT(gpt_f32_to_f16(0x1p-25f) == 0x0000);               /* half of it: to even (0) */
  EXPECT(gpt_f32_to_f16(0x1p-25f * 1.5f) == 0x0001);
  EXPECT(gpt_f32_to_f16(-0x1p-14f) == 0x8400);              /* smallest normal */
  EXPECT(gpt_f32_to_f16(0x1p-14f - 0x1p-25f) == 0x0400);    /* rounds up into the normals */
  EXPECT(isnan(gpt_bf16_to_f32(gpt_f32_to_bf16(bits_f(0x7f800001u))))); /* signalling NaN */
  EXPECT(gpt_f32_to_bf16(INFINITY) == 0x7f80);
  return test_finish("gpt.convert");
}
