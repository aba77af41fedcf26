/* optim/adamw_cuda.cu — AdamW/Adam on the GPU for parameters that stay on the
 * device: the same operations in the same order as the CPU kernels (explicit
 * fmaf, IEEE sqrt and division, no contraction: built with --fmad=false).
 * fp32/fp16/bf16 grads; fp32 or bf16 states, one thread per element; int8
 * states (optim/quant_impl.h's code), one thread block per absmax block with a
 * block reduction of the absmax; an fp32 master with an optional 16-bit copy,
 * or a bf16 master written back with the CPU's stochastic rounding.
 */
#include "optim/cuda_dtype_impl.h"
#include "optim/kernels.h"
#include "optim/quant_impl.h"

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

__device__ static inline float d_load_p(const void *P, int mdt, size_t i) {
  if (mdt == FERRY_DT_BF16) return __uint_as_float((uint32_t)((const uint16_t *)P)[i] << 16);
  return ((const float *)P)[i];
}

/* The param and its copy, as optim_p_store and ferry_dt_store do. */
__device__ static inline void d_store_p(const optim_scalars &s, void *P, int mdt, uint64_t index,
                                        void *PC, int cdt, size_t i, float p) {
  if (mdt == FERRY_DT_BF16) {
    uint64_t idx = index + i;
    ((uint16_t *)P)[i] = optim_bf16_sr(p, optim_sr_bits(optim_sr_hikey(s.sr_key, idx), idx));
  } else {
    ((float *)P)[i] = p;
  }
  if (cdt == FERRY_DT_F16)
    ((uint16_t *)PC)[i] = d_f32_to_f16(p);
  else if (cdt == FERRY_DT_BF16)
    ((uint16_t *)PC)[i] = d_f32_to_bf16(p);
  else if (cdt == FERRY_DT_F32)
    ((float *)PC)[i] = p;
}

/* m, v updated in fp32 (g already scaled; Adam's L2 term added here). */
__device__ static inline void d_moments(const optim_scalars &s, float p, float g, float *m,
                                        float *v) {
  if (s.type == FERRY_OPTIM_ADAM) g = fmaf(s.wd, p, g);
  *m = fmaf(s.beta1, *m, s.omb1 * g);
  *v = fmaf(s.beta2, *v, (s.omb2 * g) * g);
}

__device__ static inline float d_param(const optim_scalars &s, float p, float m, float v) {
  p = p * s.decay;
  return fmaf(s.neg_step, m / fmaf(sqrtf(v), s.inv_sqrt_bc2, s.eps), p);
}

__device__ static inline float d_load_s(const void *S, int sdt, size_t i) {
  if (sdt == FERRY_DT_BF16) return __uint_as_float((uint32_t)((const uint16_t *)S)[i] << 16);
  return ((const float *)S)[i];
}
__device__ static inline void d_store_s(void *S, int sdt, size_t i, float x) {
  if (sdt == FERRY_DT_BF16)
    ((uint16_t *)S)[i] = d_f32_to_bf16(x);
  else
    ((float *)S)[i] = x;
}

__global__ static void adam_kernel(optim_scalars s, optim_tile t) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < t.n; i += stride) {
    float g = d_load_g(t.g, t.gdt, i) * s.gscale;
    float p = d_load_p(t.p, t.mdt, i);
    float m = d_load_s(t.s1, t.sdt, i), v = d_load_s(t.s2, t.sdt, i);
    d_moments(s, p, g, &m, &v);
    p = d_param(s, p, m, v);
    d_store_p(s, t.p, t.mdt, t.index, t.pc, t.cdt, i, p);
    d_store_s(t.s1, t.sdt, i, m);
    d_store_s(t.s2, t.sdt, i, v);
  }
}

#define QTHREADS OPTIM_CUDA_QTHREADS

/* Int8 states: thread block k owns absmax block k. Pass 1: each thread
 * dequantizes and updates its elements, the block reduces the max of the
 * finite |m'|, |v'| bits (the float max) and ORs whether one was inf or NaN.
 * Pass 2 recomputes the same values, writes the param from the fp32 states
 * and the codes with the new absmax (inf and NaN their own codes); thread 0
 * stores the absmax (marked when the block holds inf or NaN). */
__global__ static void adam_q_kernel(optim_scalars s, optim_tile t) {
  __shared__ uint32_t red1[QTHREADS], red2[QTHREADS];
  const size_t k = blockIdx.x, b = k * t.block;
  const size_t e = b + t.block < t.n ? b + t.block : t.n;
  uint8_t *c1 = (uint8_t *)t.s1, *c2 = (uint8_t *)t.s2;
  const float A1 = t.a1[k], A2 = t.a2[k];
  uint32_t mx1 = 0, mx2 = 0;
  int bad1 = 0, bad2 = 0;
  for (size_t i = b + threadIdx.x; i < e; i += blockDim.x) {
    float g = d_load_g(t.g, t.gdt, i) * s.gscale;
    float p = d_load_p(t.p, t.mdt, i);
    float m = optim_q_dec_s(c1[i], A1), v = optim_q_dec_u(c2[i], A2);
    d_moments(s, p, g, &m, &v);
    uint32_t a = __float_as_uint(m) & 0x7FFFFFFFu, c = __float_as_uint(v) & 0x7FFFFFFFu;
    bad1 |= a > 0x7F7FFFFFu;
    bad2 |= c > 0x7F7FFFFFu;
    mx1 = a > mx1 && a <= 0x7F7FFFFFu ? a : mx1;
    mx2 = c > mx2 && c <= 0x7F7FFFFFu ? c : mx2;
  }
  red1[threadIdx.x] = mx1;
  red2[threadIdx.x] = mx2;
  bad1 = __syncthreads_or(bad1);
  bad2 = __syncthreads_or(bad2);
  for (unsigned w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) {
      red1[threadIdx.x] = max(red1[threadIdx.x], red1[threadIdx.x + w]);
      red2[threadIdx.x] = max(red2[threadIdx.x], red2[threadIdx.x + w]);
    }
    __syncthreads();
  }
  const uint32_t h1 = red1[0], h2 = red2[0];
  const float N1 = optim_q_absmax(__uint_as_float(h1), bad1);
  const float N2 = optim_q_absmax(__uint_as_float(h2), bad2);
  const float i1 = optim_q_inv(N1), i2 = optim_q_inv(N2);
  for (size_t i = b + threadIdx.x; i < e; i += blockDim.x) {
    float g = d_load_g(t.g, t.gdt, i) * s.gscale;
    float p = d_load_p(t.p, t.mdt, i);
    float m = optim_q_dec_s(c1[i], A1), v = optim_q_dec_u(c2[i], A2);
    d_moments(s, p, g, &m, &v);
    p = d_param(s, p, m, v);
    d_store_p(s, t.p, t.mdt, t.index, t.pc, t.cdt, i, p);
    c1[i] = optim_q_put_s(m, i1);
    c2[i] = optim_q_put_u(v, i2);
  }
  if (threadIdx.x == 0) {
    t.a1[k] = N1;
    t.a2[k] = N2;
  }
}

extern "C" int optim_cuda_step(const optim_scalars *s, const optim_tile *t, void *stream, char *why,
                               size_t why_len) {
  if (t->n == 0) return FERRY_OK;
  int threads, blocks;
  if (!optim_cuda_grid(t->n, t->sdt, t->block, &blocks, &threads)) {
    snprintf(why, why_len, "%zu elements in absmax blocks of %zu: more than one grid holds", t->n,
             t->block);
    return FERRY_EINVAL;
  }
  if (t->sdt == FERRY_DT_I8)
    adam_q_kernel<<<blocks, threads, 0, (cudaStream_t)stream>>>(*s, *t);
  else
    adam_kernel<<<blocks, threads, 0, (cudaStream_t)stream>>>(*s, *t);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    snprintf(why, why_len, "%s<<<%d, %d>>> over %zu elements: %s",
             t->sdt == FERRY_DT_I8 ? "adam_q_kernel" : "adam_kernel", blocks, threads, t->n,
             cudaGetErrorString(e));
    return FERRY_ENODEV;
  }
  return FERRY_OK;
}

extern "C" int optim_cuda_ready(void *stream, char *why, size_t why_len) {
  (void)cudaGetLastError(); /* left by an earlier call, which reported it */
  cudaError_t e = cudaStreamQuery((cudaStream_t)stream);
  if (e != cudaSuccess && e != cudaErrorNotReady) {
    snprintf(why, why_len, "the device failed before this step: %s", cudaGetErrorString(e));
    return FERRY_ENODEV;
  }
  return FERRY_OK;
}
