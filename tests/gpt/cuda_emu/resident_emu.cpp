/* tests/gpt/cuda_emu/resident_emu.cpp — examples/gpt/resident_cuda.cu (the
 * device-resident provider: runtime calls only) compiled for the host. */
#include "emu_device.h"

#include "resident_cuda.cu"
