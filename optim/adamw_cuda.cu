/* optim/adamw_cuda.cu — AdamW/Adam on the GPU for parameters that stay on the
 * device: the same operations in the same order as the CPU kernels (explicit
 * fmaf, IEEE sqrt and division, no contraction: built with --fmad=false), fp32
 * master and states, fp32/fp16/bf16 grads, optional 16-bit param copy.
 */
#include "optim/kernels_impl.h"

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

__device__ static inline float d_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return __uint_as_float(sign | 0x7f800000u | (man ? 0x400000u | (man << 13) : 0));
  if (exp == 0) {
    float v = (float)man * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
}

__device__ static inline uint16_t d_f32_to_f16(float x) {
  uint32_t u = __float_as_uint(x);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
  if (a < 0x38800000u) {
    if (a < 0x33000000u) return sign;
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e;
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
  return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

__device__ static inline uint16_t d_f32_to_bf16(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__device__ static inline float d_load_g(const void *g, int dt, size_t i) {
  if (dt == FERRY_DT_F16) return d_f16_to_f32(((const uint16_t *)g)[i]);
  if (dt == FERRY_DT_BF16) return __uint_as_float((uint32_t)((const uint16_t *)g)[i] << 16);
  return ((const float *)g)[i];
}

__global__ static void adam_kernel(optim_scalars s, float *P, const void *G, int gdt, float *M,
                                   float *V, void *PC, int cdt, size_t n) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float g = d_load_g(G, gdt, i) * s.gscale;
    float p = P[i], m = M[i], v = V[i];
    if (s.type == FERRY_OPTIM_ADAM) g = fmaf(s.wd, p, g);
    m = fmaf(s.beta1, m, s.omb1 * g);
    v = fmaf(s.beta2, v, (s.omb2 * g) * g);
    p = p * s.decay;
    p = fmaf(s.neg_step, m / fmaf(sqrtf(v), s.inv_sqrt_bc2, s.eps), p);
    P[i] = p;
    M[i] = m;
    V[i] = v;
    if (cdt == FERRY_DT_F16)
      ((uint16_t *)PC)[i] = d_f32_to_f16(p);
    else if (cdt == FERRY_DT_BF16)
      ((uint16_t *)PC)[i] = d_f32_to_bf16(p);
    else if (cdt == FERRY_DT_F32)
      ((float *)PC)[i] = p;
  }
}

extern "C" int optim_cuda_step(const optim_scalars *s, const optim_tile *t, void *stream, char *why,
                               size_t why_len) {
  if (t->n == 0) return FERRY_OK;
  int threads = 256;
  size_t want = (t->n + threads - 1) / threads;
  int blocks = want > 65535u * 8u ? 65535 * 8 : (int)want;
  adam_kernel<<<blocks, threads, 0, (cudaStream_t)stream>>>(*s, t->p, t->g, t->gdt, (float *)t->s1,
                                                            (float *)t->s2, t->pc, t->cdt, t->n);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    snprintf(why, why_len, "adam_kernel<<<%d, %d>>> over %zu elements: %s", blocks, threads, t->n,
             cudaGetErrorString(e));
    return FERRY_ENODEV;
  }
  return FERRY_OK;
}
