/* tests/gpt/cuda_emu/kvcache_emu.cpp — examples/gpt/kvcache_cuda.cu (the
 * KV-cache forward for sampling) compiled for the host: its kernels
 * launched through EMU_LAUNCH (the MODEL_LAUNCH hook). */
#include "emu_device.h"

#define MODEL_LAUNCH(kernel, grid, block, smem, st, ...)                                           \
  EMU_LAUNCH(kernel, grid, block, smem, st, __VA_ARGS__)

#include "kvcache_cuda.cu"
