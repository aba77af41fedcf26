/* examples/gpt/init_cuda.cu — the seeded init of one tensor on a CUDA
 * device (gpt_cuda_init_tensor, gpt_init.h): the values init.c writes on
 * the CPU, bit for bit, through the same gpt_rng.h lines (device side:
 * explicit round-to-nearest intrinsics, no FMA contraction), rounded to
 * bf16 / fp16 by core/dtype.h's own conversions, as the CPU rounds them.
 * One thread per Philox counter (four values), grid-stride.
 */
#include "gpt_init.h"
#include "gpt_rng.h"

#include "core/dtype.h"

#include <cuda_runtime.h>
#include <stdio.h>

/* every launch goes through INIT_LAUNCH: tests/gpt/cuda_emu/ defines its
 * own to run the kernels on the host */
#ifndef INIT_LAUNCH
#define INIT_LAUNCH(kernel, grid, block, smem, st, ...)                                            \
  kernel<<<(grid), (block), (smem), (st)>>>(__VA_ARGS__)
#endif

__global__ static void k_init_normal(void *dst, int dt, size_t numel, uint64_t seed,
                                     uint32_t tensor, float scale) {
  size_t counters = (numel + 3) / 4;
  for (size_t c = blockIdx.x * (size_t)blockDim.x + threadIdx.x; c < counters;
       c += (size_t)gridDim.x * blockDim.x) {
    float v[4];
    gpt_rng_normal4(seed, tensor, (uint64_t)c, v);
    for (int j = 0; j < 4; j++)
      if (4 * c + j < numel) ferry_dt_store(dst, dt, 4 * c + j, GPT_RNG_FMUL(v[j], scale));
  }
}

__global__ static void k_init_fill(void *dst, int dt, size_t numel, float v) {
  for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < numel;
       k += (size_t)gridDim.x * blockDim.x)
    ferry_dt_store(dst, dt, k, v);
}

extern "C" int gpt_cuda_init_tensor(void *dst, int dtype, size_t numel, const gpt_schema *s,
                                    int i, uint64_t seed, void *stream, char *err,
                                    size_t errlen) {
  if (i < 0 || i >= s->n_params || numel != s->params[i].numel) {
    snprintf(err, errlen, "init: no parameter %d of %zu values", i, numel);
    return -1;
  }
  if (dtype != FERRY_DT_F32 && dtype != FERRY_DT_BF16 && dtype != FERRY_DT_F16) {
    snprintf(err, errlen, "init of '%s': dtype %d is not F32, BF16 or F16", s->params[i].name,
             dtype);
    return -1;
  }
  if (!numel) return 0;
  float scale;
  gpt_init_kind kind = gpt_init_rule(s, i, &scale);
  cudaStream_t st = (cudaStream_t)stream;
  const int threads = 256;
  size_t work = kind == GPT_INIT_NORMAL ? (numel + 3) / 4 : numel;
  size_t blocks = (work + threads - 1) / threads;
  if (blocks > 65536) blocks = 65536; /* grid-stride beyond */
  if (kind == GPT_INIT_NORMAL)
    INIT_LAUNCH(k_init_normal, (unsigned)blocks, threads, 0, st, dst, dtype, numel, seed,
                (uint32_t)i, scale);
  else
    INIT_LAUNCH(k_init_fill, (unsigned)blocks, threads, 0, st, dst, dtype, numel,
                kind == GPT_INIT_ONE ? 1.0f : 0.0f);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    snprintf(err, errlen, "init of '%s': %s", s->params[i].name, cudaGetErrorString(e));
    return -1;
  }
  return 0;
}
