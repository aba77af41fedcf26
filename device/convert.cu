/* device/convert.cu — the conversion kernel of the cuda backend
 * (ferry_convert_async): n elements of F32/F16/BF16 times a scale into any of
 * the three, with the bits of core's ferry_dtype_convert. It loads and
 * stores through core/dtype.h's own functions (host and device functions
 * under nvcc), multiplies in fp32 rounded to nearest even with no
 * contraction, and gives NaNs the bits the host's multiply gives them.
 * C entry point only.
 */
#include "core/dtype.h"

#include <cuda_runtime.h>
#include <stdint.h>

/* x * scale as the host computes it. The GPU's multiply answers every NaN
 * with one canonical NaN; the host's (x86 SSE, AArch64 without default-NaN
 * mode) answers with the NaN operand made quiet, x when both are NaN (how
 * the compiler orders the operands then is not fixed, so that one case may
 * differ), and with its default NaN, measured by the caller on the host and
 * passed in, for inf * 0. */
__device__ static inline float mul_as_host(float x, float scale, uint32_t default_nan) {
  uint32_t xu = __float_as_uint(x), su = __float_as_uint(scale);
  if ((xu & 0x7fffffffu) > 0x7f800000u) return __uint_as_float(xu | 0x400000u);
  if ((su & 0x7fffffffu) > 0x7f800000u) return __uint_as_float(su | 0x400000u);
  float r = __fmul_rn(x, scale);
  return r != r ? __uint_as_float(default_nan) : r;
}

/* One element per thread and step of a grid-stride loop. The dtypes are
 * the same for every thread, so the switches inside load and store never
 * diverge. In place (dst == src, dtypes of one size) each element is read
 * before it is written by the same thread. */
__global__ static void convert_kernel(void *dst, int dt, const void *src, int st, size_t n,
                                      float scale, uint32_t default_nan) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    ferry_dt_store(dst, dt, i, mul_as_host(ferry_dt_load(src, st, i), scale, default_nan));
}

/* Launches the conversion on `stream` (the current device must be the
 * stream's). n > 0; dt and st are F32, F16 or BF16 (the device layer
 * checked them). Returns the launch status, not an error left by earlier
 * calls. */
extern "C" cudaError_t ferry_cuda_convert_launch(cudaStream_t stream, void *dst, int dt,
                                                 const void *src, int st, size_t n, float scale,
                                                 uint32_t default_nan) {
  const unsigned threads = 256;
  /* Enough blocks to fill any current GPU many times over; larger n loops. */
  const size_t max_blocks = 8192;
  size_t want = (n + threads - 1) / threads;
  unsigned blocks = (unsigned)(want < max_blocks ? want : max_blocks);
  void *args[] = {&dst, &dt, (void *)&src, &st, &n, &scale, &default_nan};
  return cudaLaunchKernel((const void *)convert_kernel, dim3(blocks), dim3(threads), args, 0,
                          stream);
}
