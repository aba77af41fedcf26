/* tests/gpt/cuda_emu/emu_device.h — the CUDA thread model on the host for
 * the emulated build of the attention kernels (gpt.attention_emulated):
 * the qualifiers and built-ins they use, and emu_launch, which runs a grid
 * one CTA at a time, each CUDA thread a fiber (emu.cpp) switched at
 * __syncthreads, __syncwarp and shuffles, highest thread first so a read
 * that misses its barrier sees poison; 99 KiB of dynamic shared memory,
 * filled with 0xff (NaN) before each CTA. */
#ifndef GPT_EMU_DEVICE_H
#define GPT_EMU_DEVICE_H

#include "cuda_bf16.h"
#include "cuda_runtime.h"

#include <algorithm>
#include <functional>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <type_traits>

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint4 {
  unsigned x, y, z, w;
};
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) {
  uint4 u = {a, b, c, d};
  return u;
}

extern dim3 threadIdx, blockIdx, blockDim, gridDim; /* threadIdx: the running fiber's */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__
#define __launch_bounds__(n)
#define __align__(n) __attribute__((aligned(n)))
#define __expf       expf
using std::min;

enum { EMU_SMEM = 99 * 1024 };

void __syncthreads(void);
void __syncwarp(unsigned mask = 0xffffffffu);
float __shfl_xor_sync(unsigned mask, float v, int lane_mask);
int __any_sync(unsigned mask, int pred);
static inline int emu_lane(void) { return (int)(threadIdx.x % 32); }
void emu_check(int ok, const char *what); /* aborts with what unless ok */

template <typename K> static inline cudaError_t cudaFuncSetAttribute(K, int, int bytes) {
  return bytes > EMU_SMEM ? cudaErrorInvalidValue : cudaSuccess;
}

/* one CTA of `threads` fibers running body; aborts on a barrier deadlock */
void emu_run_block(unsigned threads, size_t smem, const std::function<void()> &body);

template <typename... P, typename... A>
static void emu_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t,
                       A... args) {
  emu_check(smem <= EMU_SMEM && block.y == 1 && block.z == 1, "launch: shape or shared memory");
  gridDim = grid, blockDim = block;
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        blockIdx = dim3(x, y, z);
        emu_run_block(block.x, smem, [&] { kernel(args...); });
      }
}

#endif
