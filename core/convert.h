/* core/convert.h — bulk bf16 <-> fp32 conversion and fp32 scaling,
 * vectorised (core/convert.c); ferry_dtype_convert calls it for these three
 * pairs. Same bits as the per-element ferry_bf16_to_f32 / ferry_f32_to_bf16
 * times scale. dst and src do not overlap, except that the fp32 scaling may
 * run in place (dst == src).
 */
#ifndef FERRY_CORE_CONVERT_H
#define FERRY_CORE_CONVERT_H

#include <stddef.h>
#include <stdint.h>

void ferry_convert_bf16_f32(float *restrict dst, const uint16_t *restrict src, size_t n,
                            float scale);
void ferry_convert_f32_bf16(uint16_t *restrict dst, const float *restrict src, size_t n,
                            float scale);

void ferry_convert_f32_f32(float *dst, const float *src, size_t n, float scale);

#endif
