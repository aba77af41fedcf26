/* optim/adamw_cuda.cu — AdamW/Adam on the GPU for parameters that stay on the
 * device: the same operations in the same order as the CPU kernels (explicit
 * fmaf, IEEE sqrt and division, no contraction: built with --fmad=false), fp32
 * master and states, fp32/fp16/bf16 grads, optional 16-bit param copy.
 */
#include "optim/cuda_dtype_impl.h"
#include "optim/kernels_impl.h"

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

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
  adam_kernel<<<blocks, threads, 0, (cudaStream_t)stream>>>(*s, (float *)t->p, t->g, t->gdt, (float *)t->s1,
                                                            (float *)t->s2, t->pc, t->cdt, t->n);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    snprintf(why, why_len, "adam_kernel<<<%d, %d>>> over %zu elements: %s", blocks, threads, t->n,
             cudaGetErrorString(e));
    return FERRY_ENODEV;
  }
  return FERRY_OK;
}
