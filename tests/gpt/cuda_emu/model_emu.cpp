/* tests/gpt/cuda_emu/model_emu.cpp — examples/gpt/model_cuda.cu compiled
 * for the host: its kernels launched through EMU_LAUNCH (the MODEL_LAUNCH
 * hook), cuBLAS the emulation's (cublas.cpp). */
#include "emu_device.h"

#define MODEL_LAUNCH(kernel, grid, block, smem, st, ...)                                           \
  EMU_LAUNCH(kernel, grid, block, smem, st, __VA_ARGS__)

#include "model_cuda.cu"
