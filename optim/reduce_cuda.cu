/* optim/reduce_cuda.cu — the gradient helpers on the GPU (optim/grad_cuda.h):
 * accumulation of micro-batch grads into fp32 (the CPU's fmaf, built with
 * --fmad=false, so the same bits) and the sum of squares in double in a
 * fixed order (a first pass of OPTIM_CUDA_SUMSQ_BLOCKS blocks, each a tree
 * over its threads, then one block's tree over their results).
 */
#include "optim/cuda_dtype_impl.h"
#include "optim/grad_cuda.h"

#include <cuda_runtime.h>
#include <stdio.h>

#define SUMSQ_THREADS 256 /* a power of two, and == OPTIM_CUDA_SUMSQ_BLOCKS for pass 2 */

__global__ static void accumulate_kernel(float *acc, const void *g, int dt, size_t n, float scale) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    acc[i] = fmaf(d_load_g(g, dt, i), scale, acc[i]);
}

/* Sums sh[0..SUMSQ_THREADS) into sh[0] in a fixed tree order. */
__device__ static void block_tree_sum(double *sh) {
  __syncthreads();
  for (int s = SUMSQ_THREADS / 2; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
}

__global__ static void sumsq_pass1(const void *g, int dt, size_t n, double *partials) {
  __shared__ double sh[SUMSQ_THREADS];
  double acc = 0;
  size_t stride = (size_t)OPTIM_CUDA_SUMSQ_BLOCKS * SUMSQ_THREADS;
  for (size_t i = (size_t)blockIdx.x * SUMSQ_THREADS + threadIdx.x; i < n; i += stride) {
    double x = (double)d_load_g(g, dt, i);
    acc += x * x;
  }
  sh[threadIdx.x] = acc;
  block_tree_sum(sh);
  if (threadIdx.x == 0) partials[blockIdx.x] = sh[0];
}

__global__ static void sumsq_pass2(const double *partials, double *out) {
  __shared__ double sh[SUMSQ_THREADS];
  sh[threadIdx.x] = partials[threadIdx.x];
  block_tree_sum(sh);
  if (threadIdx.x == 0) *out = sh[0];
}

static int launch_status(const char *what, size_t n, char *why, size_t why_len) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return FERRY_OK;
  snprintf(why, why_len, "%s over %zu elements: %s", what, n, cudaGetErrorString(e));
  return FERRY_ENODEV;
}

extern "C" int optim_cuda_accumulate(float *acc, const void *g, int dt, size_t n, float scale,
                                     void *stream, char *why, size_t why_len) {
  if (n == 0) return FERRY_OK;
  int threads = 256;
  size_t want = (n + threads - 1) / threads;
  int blocks = want > 65535u * 8u ? 65535 * 8 : (int)want;
  accumulate_kernel<<<blocks, threads, 0, (cudaStream_t)stream>>>(acc, g, dt, n, scale);
  return launch_status("accumulate_kernel", n, why, why_len);
}

extern "C" int optim_cuda_sumsq(const void *g, int dt, size_t n, double *partials, double *out,
                                void *stream, char *why, size_t why_len) {
  static_assert(SUMSQ_THREADS == OPTIM_CUDA_SUMSQ_BLOCKS, "pass 2 has one thread per block");
  cudaStream_t s = (cudaStream_t)stream;
  sumsq_pass1<<<OPTIM_CUDA_SUMSQ_BLOCKS, SUMSQ_THREADS, 0, s>>>(g, dt, n, partials);
  int rc = launch_status("sumsq_pass1", n, why, why_len);
  if (rc) return rc;
  sumsq_pass2<<<1, SUMSQ_THREADS, 0, s>>>(partials, out);
  return launch_status("sumsq_pass2", n, why, why_len);
}
