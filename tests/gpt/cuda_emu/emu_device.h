/* tests/gpt/cuda_emu/emu_device.h — the CUDA thread model on the host for
 * the emulated build of the model's kernels (gpt.attention_emulated,
 * gpt.cuda_emulated): the qualifiers and built-ins they use, and
 * emu_launch, which runs a grid in its stream's order one CTA at a time,
 * each CUDA thread a fiber (emu.cpp) switched at __syncthreads, __syncwarp
 * and shuffles. CTAs and threads run highest index first, or lowest first
 * with $EMU_ORDER=low, so a read that misses its barrier sees poison or a
 * value not yet final in one order or the other; 99 KiB of dynamic shared
 * memory, filled with 0xff (NaN) before each CTA. __shared__ variables are
 * thread_local: one copy for the one running CTA. A launch checks what
 * CUDA refuses (an empty grid, over 1024 threads, dynamic shared memory
 * over 48 KiB without the kernel's opt-in) and that every pointer argument
 * is device memory. */
#ifndef GPT_EMU_DEVICE_H
#define GPT_EMU_DEVICE_H

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime.h"

#include <algorithm>
#include <functional>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <tuple>
#include <type_traits>

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

extern dim3 threadIdx, blockIdx, blockDim, gridDim; /* threadIdx: the running fiber's */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__      thread_local
#define __launch_bounds__(n)
#define __align__(n) __attribute__((aligned(n)))
#define __expf       expf
using std::max;
using std::min;

enum { EMU_SMEM = 99 * 1024, EMU_SMEM_DEFAULT = 48 * 1024 };

void __syncthreads(void);
void __syncwarp(unsigned mask = 0xffffffffu);
float __shfl_xor_sync(unsigned mask, float v, int lane_mask);
int __any_sync(unsigned mask, int pred);
static inline int emu_lane(void) { return (int)(threadIdx.x % 32); }
void emu_check(int ok, const char *what); /* aborts with what unless ok */

/* fibers never run between two barriers at once: plain adds are atomic */
static inline float atomicAdd(float *p, float v) {
  float o = *p;
  *p = o + v;
  return o;
}
static inline double atomicAdd(double *p, double v) {
  double o = *p;
  *p = o + v;
  return o;
}

/* the dynamic shared memory a kernel opted into (emu.cpp) */
void emu_set_smem_limit(const void *kernel, int bytes);
int emu_smem_limit(const void *kernel);
template <typename K>
static inline cudaError_t cudaFuncSetAttribute(K kernel, int attr, int bytes) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || bytes > EMU_SMEM)
    return cudaErrorInvalidValue;
  emu_set_smem_limit((const void *)kernel, bytes);
  return cudaSuccess;
}

/* $EMU_ORDER is "low": CTAs and their threads run lowest index first (else
 * highest first) */
int emu_low_first(void);
/* one CTA of `threads` fibers running body; aborts on a barrier deadlock */
void emu_run_block(unsigned threads, size_t smem, const std::function<void()> &body);

template <typename T> static inline void emu_check_arg(const T &a) {
  if constexpr (std::is_pointer<T>::value)
    if (a) emu_check_device((const void *)a, 1, "a kernel's pointer argument");
}

/* the parameters of a kernel type as a tuple, so the arguments convert as
 * a call converts them (NULL to a pointer) */
template <typename F> struct emu_params;
template <typename... P> struct emu_params<void(P...)> { using type = std::tuple<P...>; };

template <typename... P>
static void emu_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                       std::tuple<P...> args) {
  unsigned threads = block.x * block.y * block.z;
  emu_check(grid.x && grid.y && grid.z && grid.y < 65536 && grid.z < 65536, "launch: grid");
  emu_check(threads && threads <= 1024, "launch: block size");
  emu_check(smem <= EMU_SMEM_DEFAULT || (int)smem <= emu_smem_limit((const void *)kernel),
            "launch: dynamic shared memory over 48 KiB without cudaFuncSetAttribute");
  emu_check_stream(st, "launch");
  std::apply([](const P &...p) { (emu_check_arg(p), ...); }, args);
  emu_enqueue(st, [=] {
    gridDim = grid, blockDim = block;
    size_t nb = (size_t)grid.x * grid.y * grid.z;
    for (size_t k = 0; k < nb; k++) {
      size_t b = emu_low_first() ? k : nb - 1 - k;
      blockIdx = dim3((unsigned)(b % grid.x), (unsigned)(b / grid.x % grid.y),
                      (unsigned)(b / ((size_t)grid.x * grid.y)));
      emu_run_block(threads, smem, [&] { std::apply(kernel, args); });
    }
  });
}

/* kernel<<<grid, block, smem, st>>>(...) */
#define EMU_LAUNCH(kernel, grid, block, smem, st, ...)                                             \
  emu_launch(kernel, grid, block, smem, st,                                                        \
             typename emu_params<std::remove_pointer_t<decltype(kernel)>>::type(__VA_ARGS__))

#endif
