/* tests/gpt/cuda_emu/kernels_emu.cpp — examples/gpt/kernels_cuda.cu
 * compiled for the host: its kernels launched through EMU_LAUNCH (the
 * KERNELS_LAUNCH hook); its extern __shared__ array is the emulation's
 * dynamic shared memory (emu.cpp's smem). */
#include "emu_device.h"

#define KERNELS_LAUNCH(kernel, grid, block, smem, st, ...)                                         \
  EMU_LAUNCH(kernel, grid, block, smem, st, __VA_ARGS__)
#define sacc smem

#include "kernels_cuda.cu"
