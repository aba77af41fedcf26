/* tests/gpt/cuda_emu/cuda_runtime.h — the CUDA runtime calls of the CUDA
 * model, its kernels and their tests, for the emulated build
 * (runtime.cpp): "device" memory is host memory the emulation tracks (with
 * guard pages, filled with 0xff = NaN), streams run their work as late as
 * CUDA allows, and misuse (a host pointer where a device one belongs, a copy out of an
 * allocation, a destroyed stream) aborts naming the call. Plus the vector
 * types. C and C++. */
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
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
enum {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorNoDevice = 100
};
enum {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum { cudaStreamDefault = 0, cudaStreamNonBlocking = 1 };
enum { cudaEventDefault = 0, cudaEventDisableTiming = 2 };
enum { cudaHostAllocDefault = 0, cudaHostRegisterDefault = 0 };

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags);
cudaError_t cudaMallocHost(void **p, size_t n);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaHostRegister(void *p, size_t n, unsigned flags);
cudaError_t cudaHostUnregister(void *p);
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, int kind);
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, int kind, cudaStream_t st);
cudaError_t cudaMemset(void *d, int v, size_t n);
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaStreamCreate(cudaStream_t *st);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *st, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t st);
cudaError_t cudaStreamSynchronize(cudaStream_t st);
cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t ev, unsigned flags);
cudaError_t cudaEventCreate(cudaEvent_t *ev);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t ev);
cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t st);
cudaError_t cudaEventSynchronize(cudaEvent_t ev);
cudaError_t cudaEventQuery(cudaEvent_t ev);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t e);

/* the emulation's own: whether [p, p + n) lies in one device allocation;
 * that stream s is live (0: the default stream), else abort naming what */
int emu_is_device(const void *p, size_t n);
void emu_check_device(const void *p, size_t n, const char *what);
void emu_check_stream(cudaStream_t s, const char *what);

/* the vector types (CUDA's alignments) */
typedef struct __attribute__((aligned(8))) {
  float x, y;
} float2;
typedef struct __attribute__((aligned(16))) {
  float x, y, z, w;
} float4;
typedef struct __attribute__((aligned(8))) {
  unsigned x, y;
} uint2;
typedef struct __attribute__((aligned(16))) {
  unsigned x, y, z, w;
} uint4;
static inline float2 make_float2(float x, float y) {
  float2 r = {x, y};
  return r;
}
static inline float4 make_float4(float x, float y, float z, float w) {
  float4 r = {x, y, z, w};
  return r;
}
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) {
  uint4 u = {a, b, c, d};
  return u;
}

#ifdef __cplusplus
}
#include <functional>
/* op in stream order on s (runtime.cpp): launches and cuBLAS calls */
void emu_enqueue(cudaStream_t s, std::function<void()> op);
#endif

#endif
