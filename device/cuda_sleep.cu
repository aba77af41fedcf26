/* device/cuda_sleep.cu — the one kernel of the cuda device backend: a timed
 * wait that occupies a stream like GPU compute of known duration, without a
 * CPU core (ferry_stream_sleep). One thread spins on the GPU's nanosecond
 * %globaltimer, parked with __nanosleep between reads. C entry points only.
 */
#include <cuda_runtime.h>

static __device__ __forceinline__ unsigned long long global_ns(void) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

static __global__ void ferry_sleep_kernel(unsigned long long ns) {
  const unsigned long long t0 = global_ns();
  /* 100 us naps keep the error well under a millisecond while the SM issues
   * almost nothing; __nanosleep may wake early, so the clock decides. */
  while (global_ns() - t0 < ns)
    __nanosleep(100000);
}

/* Launches one sleep of `ns` nanoseconds on `stream` (the current device
 * must be the stream's). Returns the launch status, not a sticky error
 * left by earlier calls. */
extern "C" cudaError_t ferry_cuda_sleep_launch(cudaStream_t stream, unsigned long long ns) {
  void *args[] = {&ns};
  return cudaLaunchKernel((const void *)ferry_sleep_kernel, dim3(1), dim3(1), args, 0, stream);
}

/* Loads the kernel's module on the current device now (module loading is
 * lazy), so the first sleep does not pay for it inside a timed region. */
extern "C" cudaError_t ferry_cuda_sleep_prepare(void) {
  cudaFuncAttributes attr;
  return cudaFuncGetAttributes(&attr, (const void *)ferry_sleep_kernel);
}
