/* tests/gpt/cuda_emu/cuda_runtime.h — the few CUDA runtime calls the
 * attention kernels and their test make, on host memory, for the emulated
 * build (gpt.attention_emulated): "device" memory is malloc'd, copies are
 * memcpy, nothing fails. C and C++. */
#ifndef GPT_EMU_CUDA_RUNTIME_H
#define GPT_EMU_CUDA_RUNTIME_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int cudaError_t;
typedef void *cudaStream_t;
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1 };
enum { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2 };
enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

static inline cudaError_t cudaMalloc(void **p, size_t n) {
  *p = malloc(n ? n : 1);
  return *p ? cudaSuccess : cudaErrorInvalidValue;
}
static inline cudaError_t cudaFree(void *p) {
  free(p);
  return cudaSuccess;
}
static inline cudaError_t cudaMemcpy(void *d, const void *s, size_t n, int kind) {
  (void)kind;
  memcpy(d, s, n);
  return cudaSuccess;
}
static inline cudaError_t cudaMemset(void *d, int v, size_t n) {
  memset(d, v, n);
  return cudaSuccess;
}
static inline cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
static inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
static inline const char *cudaGetErrorString(cudaError_t e) {
  return e ? "invalid value (emulated)" : "no error";
}

#ifdef __cplusplus
}
#endif

#endif
