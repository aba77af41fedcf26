/* tests/gpt/cuda_emu/init_emu.cpp — examples/gpt/init_cuda.cu (the seeded
 * init on the device) compiled for the host: its kernels launched through
 * EMU_LAUNCH (the INIT_LAUNCH hook). gpt_rng.h takes its host lines here
 * (no __CUDA_ARCH__), so this checks the kernels' indexing, tails and
 * rounding to 16 bits, not the device intrinsics. */
#include "emu_device.h"

#define INIT_LAUNCH(kernel, grid, block, smem, st, ...)                                            \
  EMU_LAUNCH(kernel, grid, block, smem, st, __VA_ARGS__)

#include "init_cuda.cu"
