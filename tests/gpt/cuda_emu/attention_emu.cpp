/* tests/gpt/cuda_emu/attention_emu.cpp — examples/gpt/attention_cuda.cu
 * compiled for the host: its kernels launched through EMU_LAUNCH (the
 * ATTN_LAUNCH hook), its CUDA headers the emulation's (this folder first on
 * the include path). */
#include "emu_device.h"

#define ATTN_LAUNCH(kernel, grid, block, smem, st, ...)                                            \
  EMU_LAUNCH(kernel, grid, block, smem, st, __VA_ARGS__)

#include "attention_cuda.cu"
