/* examples/gpt/kernels_cuda.cu — the CUDA model's fused kernels other than
 * attention (gpt_kernels.h): residual add + RMSNorm / LayerNorm forward
 * and backward on bf16 activations, SwiGLU, GELU with its bias, the bias
 * add and its gradient, and the softmax cross-entropy over chunks of rows.
 * Each mirrors its CPU reference in kernels_ref.c line for line (the same
 * fp32 formulas, bf16 on the same stores). Layout of the work:
 *   row kernels      one warp per row, 8 rows per CTA; 8 elements per lane
 *                    per step, loaded as 16 bytes where aligned
 *   column sums      (norm dw/db, bias and GELU db) per-CTA partial sums over
 *                    a slice of rows into `partial`, then one reduction
 *                    kernel: no atomics, the same bits on every run
 *   cross-entropy    one CTA per row, fp32: one pass for max and sum with
 *                    online rescaling (forward), one for dlogits (backward)
 * Every launcher enqueues on the caller's stream, waits for nothing, and
 * returns 0 or -1 with the CUDA error in err.
 */
#include "gpt_kernels.h"

#include "ferry.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "cuda_device.cuh"

typedef __nv_bfloat16 bf16;

static int kfail(char *err, size_t len, const char *what, const char *why) {
  if (err && len) snprintf(err, len, "%s: %s", what, why);
  return -1;
}
/* the launch just made (or any earlier error on the device) */
static int launched(char *err, size_t len, const char *what) {
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? 0 : kfail(err, len, what, cudaGetErrorString(e));
}
static int al16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* every launch goes through KERNELS_LAUNCH: tests/gpt/cuda_emu/ defines its
 * own to run the kernels on the host */
#ifndef KERNELS_LAUNCH
#define KERNELS_LAUNCH(kernel, grid, block, smem, st, ...)                                         \
  kernel<<<(grid), (block), (smem), (st)>>>(__VA_ARGS__)
#endif

/* row kernels: a warp per row, ROWS warps per CTA, grid-stride over rows */
#define ROWS 8
#define FOR_EACH_ROW(r, rows) \
  for (size_t r = blockIdx.x * (size_t)ROWS + threadIdx.y; r < (rows); r += (size_t)gridDim.x * ROWS)

/* ---- device helpers ---------------------------------------------------------------- */

__device__ __forceinline__ static float rbf(float v) { return __bfloat162float(__float2bfloat16(v)); }

/* Eight elements from p as fp32: one 16-byte load (bf16) or two (fp32)
 * when vec and all 8 are there (p then 16-byte aligned), else m scalar
 * loads and zeros after them. */
__device__ __forceinline__ static void ld8_bf16(float *f, const bf16 *p, int m, int vec) {
  if (vec && m == 8) {
    uint4 v = *(const uint4 *)p;
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v;
#pragma unroll
    for (int k = 0; k < 4; k++) {
      float2 t = __bfloat1622float2(h[k]);
      f[2 * k] = t.x, f[2 * k + 1] = t.y;
    }
  } else {
#pragma unroll
    for (int k = 0; k < 8; k++) f[k] = k < m ? __bfloat162float(p[k]) : 0.0f;
  }
}
__device__ __forceinline__ static void ld8_f32(float *f, const float *p, int m, int vec) {
  if (vec && m == 8) {
    float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
  } else {
#pragma unroll
    for (int k = 0; k < 8; k++) f[k] = k < m ? p[k] : 0.0f;
  }
}
__device__ __forceinline__ static void st8_bf16(bf16 *p, const float *f, int m, int vec) {
  if (vec && m == 8) {
    uint4 v;
    __nv_bfloat162 *h = (__nv_bfloat162 *)&v;
#pragma unroll
    for (int k = 0; k < 4; k++) h[k] = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);
    *(uint4 *)p = v;
  } else {
#pragma unroll
    for (int k = 0; k < 8; k++)
      if (k < m) p[k] = __float2bfloat16(f[k]);
  }
}
__device__ __forceinline__ static void st8_f32(float *p, const float *f, int m, int vec) {
  if (vec && m == 8) {
    ((float4 *)p)[0] = make_float4(f[0], f[1], f[2], f[3]);
    ((float4 *)p)[1] = make_float4(f[4], f[5], f[6], f[7]);
  } else {
#pragma unroll
    for (int k = 0; k < 8; k++)
      if (k < m) p[k] = f[k];
  }
}

/* The sums of a and b over the CTA, on every thread (blockDim.x a multiple
 * of 32, blockDim.y 1); red: 32 slots of shared memory. */
__device__ static float2 block_sum2(float a, float b, float2 *red) {
  a = warp_sum(a), b = warp_sum(b);
  int w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads(); /* red is free: every thread has read the previous sums */
  if ((threadIdx.x & 31) == 0) red[w] = make_float2(a, b);
  __syncthreads();
  float2 t = make_float2(0.0f, 0.0f);
  for (int i = 0; i < nw; i++) t.x += red[i].x, t.y += red[i].y;
  return t;
}

/* ---- residual + norm ----------------------------------------------------------------- */

/* xout = bf16(x + delta) (or x), y = bf16(norm(xout) * w (+ b)); the
 * statistics from the stored xout, re-read by the lane that wrote it. */
__global__ void k_resid_norm_fwd(bf16 *xout, bf16 *y, float *mean, float *rstd, const bf16 *x,
                                 const float *delta, const void *w, const void *b, int wdt,
                                 size_t N, int C, float eps, int ln, int vec) {
  int l = threadIdx.x;
  FOR_EACH_ROW(n, N) {
    const bf16 *xr = x + n * C;
    bf16 *xo = xout ? xout + n * C : NULL;
    const bf16 *src = delta ? xo : xr;
    float mu = 0, ss = 0, v[8], d[8];
    for (int i = 8 * l; i < C; i += 256) {
      int m = min(8, C - i);
      ld8_bf16(v, xr + i, m, vec);
      if (delta) {
        ld8_f32(d, delta + n * C + i, m, vec);
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = rbf(v[k] + d[k]);
      }
      if (xo) st8_bf16(xo + i, v, m, vec);
#pragma unroll
      for (int k = 0; k < 8; k++) mu += v[k], ss += v[k] * v[k]; /* zeros past m */
    }
    if (ln) { /* the mean, then the variance about it (as model_cpu.c) */
      mu = warp_sum(mu) / (float)C, ss = 0;
      for (int i = 8 * l; i < C; i += 256) {
        int m = min(8, C - i);
        ld8_bf16(v, src + i, m, vec);
#pragma unroll
        for (int k = 0; k < 8; k++)
          if (k < m) ss += (v[k] - mu) * (v[k] - mu);
      }
    } else {
      mu = 0;
    }
    float rs = 1.0f / sqrtf(warp_sum(ss) / (float)C + eps);
    for (int i = 8 * l; i < C; i += 256) {
      int m = min(8, C - i);
      ld8_bf16(v, src + i, m, vec);
#pragma unroll
      for (int k = 0; k < 8; k++) {
        if (k >= m) break;
        float o = (v[k] - mu) * rs * ldw(w, i + k, wdt);
        v[k] = ln && b ? o + ldw(b, i + k, wdt) : o;
      }
      st8_bf16(y + n * C + i, v, m, vec);
    }
    if (l == 0) {
      if (ln && mean) mean[n] = mu;
      rstd[n] = rs;
    }
  }
}

/* The rows of CTA p of P: [p N / P, (p + 1) N / P). */
__device__ __forceinline__ static void slice_rows(size_t N, int P, size_t *r0, size_t *r1) {
  *r0 = (size_t)blockIdx.x * N / (size_t)P;
  *r1 = ((size_t)blockIdx.x + 1) * N / (size_t)P;
}

/* One CTA per slice of rows, the whole CTA on one row at a time (thread t
 * owns the 8-column chunks t, t + blockDim.x, ...): dx += the norm's
 * backward; the CTA's dw (and db) sums over its rows kept in shared memory
 * by the thread owning the column, then written to partial[p][2C]. */
__global__ void k_norm_bwd(float *dx, float *partial, const float *dy, const bf16 *x,
                           const float *mean, const float *rstd, const void *w, int wdt, size_t N,
                           int C, int ln, int P, int vec) {
  extern __shared__ float sacc[]; /* [C] dw, then [C] db (ln) */
  __shared__ float2 red[32];
  int nacc = ln ? 2 * C : C;
  for (int i = threadIdx.x; i < nacc; i += blockDim.x) sacc[i] = 0.0f;
  __syncthreads(); /* zeroed by other threads than the columns' owners */
  size_t r0, r1;
  slice_rows(N, P, &r0, &r1);
  float xv[8], dyv[8], dxv[8];
  for (size_t n = r0; n < r1; n++) {
    float mu = ln ? mean[n] : 0.0f, rs = rstd[n], s1 = 0, s2 = 0;
    for (int i = 8 * threadIdx.x; i < C; i += 8 * blockDim.x) {
      int m = min(8, C - i);
      ld8_bf16(xv, x + n * C + i, m, vec);
      ld8_f32(dyv, dy + n * C + i, m, vec);
#pragma unroll
      for (int k = 0; k < 8; k++) {
        float xh = (xv[k] - mu) * rs, dxh = dyv[k] * (k < m ? ldw(w, i + k, wdt) : 0.0f);
        s1 += dxh, s2 += dxh * xh;
      }
    }
    float2 t = block_sum2(s1, s2, red);
    s1 = ln ? t.x / (float)C : 0.0f;
    s2 = t.y / (float)C;
    for (int i = 8 * threadIdx.x; i < C; i += 8 * blockDim.x) {
      int m = min(8, C - i);
      ld8_bf16(xv, x + n * C + i, m, vec);
      ld8_f32(dyv, dy + n * C + i, m, vec);
      ld8_f32(dxv, dx + n * C + i, m, vec);
#pragma unroll
      for (int k = 0; k < 8; k++) {
        if (k >= m) break;
        float xh = (xv[k] - mu) * rs, dxh = dyv[k] * ldw(w, i + k, wdt);
        sacc[i + k] += dyv[k] * xh;
        if (ln) sacc[C + i + k] += dyv[k];
        dxv[k] += rs * (dxh - s1 - xh * s2);
      }
      st8_f32(dx + n * C + i, dxv, m, vec);
    }
  }
  __syncthreads();
  float *out = partial + (size_t)blockIdx.x * 2 * C;
  for (int i = threadIdx.x; i < nacc; i += blockDim.x) out[i] = sacc[i];
}

/* out0[c] += sum over the P slices of partial[p][c]; out1 (if any) the
 * same of partial[p][C + c]. One thread per column, slices in order. */
__global__ void k_partial_reduce(float *out0, float *out1, const float *partial, int P, int C) {
  FOR_EACH(c, (size_t)C) {
    float s = 0, t = 0;
    for (int p = 0; p < P; p++) {
      s += partial[(size_t)p * 2 * C + c];
      if (out1) t += partial[(size_t)p * 2 * C + C + c];
    }
    out0[c] += s;
    if (out1) out1[c] += t;
  }
}

/* The slices of the column sums: gpt_norm_bwd_partial_floats holds 2 C
 * floats per slice (kernels_ref.c decides how many). */
static int slices_of(size_t N, int C) { return (int)(gpt_norm_bwd_partial_floats(N, C) / (2 * (size_t)C)); }

/* ---- activations --------------------------------------------------------------------- */

#define GELU_S 0.7978845608028654f /* sqrt(2/pi) */
__device__ __forceinline__ static float gelu(float v) {
  return 0.5f * v * (1.0f + tanhf(GELU_S * (v + 0.044715f * v * v * v)));
}
__device__ __forceinline__ static float gelu_grad(float v) {
  float t = tanhf(GELU_S * (v + 0.044715f * v * v * v));
  return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * GELU_S * (1.0f + 3 * 0.044715f * v * v);
}
__device__ __forceinline__ static float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

/* elementwise kernels: a grid-stride loop over chunks of 8 elements, the
 * chunk from i, m of them there */
__device__ __forceinline__ static int chunk_len(size_t n, size_t i) { return n - i < 8 ? (int)(n - i) : 8; }

__global__ void k_swiglu_fwd(bf16 *h, const bf16 *g, const bf16 *u, size_t n, int vec) {
  float gv[8], uv[8];
  FOR_EACH(j, (n + 7) / 8) {
    size_t i = 8 * j;
    int m = chunk_len(n, i);
    ld8_bf16(gv, g + i, m, vec);
    ld8_bf16(uv, u + i, m, vec);
#pragma unroll
    for (int k = 0; k < 8; k++) gv[k] = gv[k] * sigm(gv[k]) * uv[k];
    st8_bf16(h + i, gv, m, vec);
  }
}

__global__ void k_swiglu_bwd(bf16 *dg, bf16 *du, const float *dh, const bf16 *g, const bf16 *u,
                             size_t n, int vec) {
  float gv[8], uv[8], dv[8], og[8], ou[8];
  FOR_EACH(j, (n + 7) / 8) {
    size_t i = 8 * j;
    int m = chunk_len(n, i);
    ld8_bf16(gv, g + i, m, vec);
    ld8_bf16(uv, u + i, m, vec);
    ld8_f32(dv, dh + i, m, vec);
#pragma unroll
    for (int k = 0; k < 8; k++) {
      float s = sigm(gv[k]);
      og[k] = dv[k] * uv[k] * s * (1.0f + gv[k] * (1.0f - s));
      ou[k] = dv[k] * gv[k] * s;
    }
    st8_bf16(dg + i, og, m, vec);
    st8_bf16(du + i, ou, m, vec);
  }
}

/* pre = bf16(x + b) (b may be NULL), y = bf16(gelu(pre)) when y; over [N, F]. */
__global__ void k_bias_gelu_fwd(bf16 *y, bf16 *pre, const float *x, const void *b, int wdt,
                                size_t n, int F, int vec) {
  float v[8];
  FOR_EACH(j, (n + 7) / 8) {
    size_t i = 8 * j;
    int m = chunk_len(n, i);
    ld8_f32(v, x + i, m, vec);
    int f = (int)(i % (size_t)F);
#pragma unroll
    for (int k = 0; k < 8; k++) {
      v[k] = rbf(v[k] + (b && k < m ? ldw(b, f, wdt) : 0.0f));
      if (++f == F) f = 0;
    }
    st8_bf16(pre + i, v, m, vec);
    if (y) { /* else the bias add alone */
#pragma unroll
      for (int k = 0; k < 8; k++) v[k] = gelu(v[k]);
      st8_bf16(y + i, v, m, vec);
    }
  }
}

/* Column sums of [N, F] over slice blockIdx.y of P, one thread per column
 * (blockIdx.x picks 256 columns), into partial[p][c] (2 F per slice). With
 * pre: the summed value is dpre = bf16(dy * gelu'(pre)), stored; else dy. */
__global__ void k_colsum(float *partial, bf16 *dpre, const float *dy, const bf16 *pre, size_t N,
                         int F, int P) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= F) return;
  size_t r0 = (size_t)blockIdx.y * N / (size_t)P, r1 = ((size_t)blockIdx.y + 1) * N / (size_t)P;
  float s = 0;
  for (size_t r = r0; r < r1; r++) {
    size_t i = r * F + c;
    float d = dy[i];
    if (pre) {
      d = rbf(d * gelu_grad(__bfloat162float(pre[i])));
      dpre[i] = __float2bfloat16(d);
    }
    s += d;
  }
  partial[(size_t)blockIdx.y * 2 * F + c] = s;
}

/* ---- cross-entropy --------------------------------------------------------------------- */

#define CE_THREADS 512

/* online max and sum: (m, s) with s = sum exp(x - m) over what was seen;
 * an empty state is (-inf, 0); a NaN logit makes s NaN */
__device__ __forceinline__ static void ol_add(float &m, float &s, float x) {
  if (x > m) {
    s = s * expf(m - x) + 1.0f;
    m = x;
  } else if (x != -INFINITY) {
    s += expf(x - m);
  }
}
__device__ __forceinline__ static void ol_merge(float &m, float &s, float m2, float s2) {
  float M = fmaxf(m, m2);
  if (M == -INFINITY) {
    s += s2;
    return;
  }
  float a = m == -INFINITY && s == 0.0f ? 0.0f : s * expf(m - M);
  float c = m2 == -INFINITY && s2 == 0.0f ? 0.0f : s2 * expf(m2 - M);
  m = M, s = a + c;
}

/* rowloss[r] = lse - logit[tgt], lse[r] saved: one CTA per row. */
__global__ void __launch_bounds__(CE_THREADS) k_ce_fwd(float *rowloss, float *lse,
                                                       const float *logits, const int32_t *tgt,
                                                       size_t n, int V, int vec) {
  __shared__ float2 red[32];
  for (size_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float *x = logits + r * V;
    float m = -INFINITY, s = 0.0f;
    if (vec) {
      for (int j = threadIdx.x; j < V / 4; j += blockDim.x) {
        float4 q = ((const float4 *)x)[j];
        ol_add(m, s, q.x), ol_add(m, s, q.y), ol_add(m, s, q.z), ol_add(m, s, q.w);
      }
    } else {
      for (int v = threadIdx.x; v < V; v += blockDim.x) ol_add(m, s, x[v]);
    }
    for (int o = 16; o > 0; o >>= 1) {
      float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
      ol_merge(m, s, m2, s2);
    }
    __syncthreads(); /* red is free */
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = make_float2(m, s);
    __syncthreads();
    if (threadIdx.x == 0) {
      m = -INFINITY, s = 0.0f;
      for (int i = 0; i < (int)(blockDim.x >> 5); i++) ol_merge(m, s, red[i].x, red[i].y);
      float l = m + logf(s);
      int t = tgt[r];
      lse[r] = l;
      rowloss[r] = t >= 0 && t < V ? l - x[t] : NAN;
    }
  }
}

/* dlogits = bf16(scale * (exp(logit - lse) - onehot(tgt))): one CTA per row. */
__global__ void __launch_bounds__(CE_THREADS) k_ce_bwd(bf16 *d, const float *logits,
                                                       const int32_t *tgt, const float *lse,
                                                       size_t n, int V, float scale, int vec) {
  for (size_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float *x = logits + r * V;
    bf16 *dr = d + r * V;
    float l = lse[r];
    int t = tgt[r];
    if (vec) {
      for (int j = threadIdx.x; j < V / 4; j += blockDim.x) {
        float4 q = ((const float4 *)x)[j];
        int v = 4 * j;
        uint2 o;
        __nv_bfloat162 *h = (__nv_bfloat162 *)&o;
        h[0] = __floats2bfloat162_rn(scale * (expf(q.x - l) - (v == t ? 1.0f : 0.0f)),
                                     scale * (expf(q.y - l) - (v + 1 == t ? 1.0f : 0.0f)));
        h[1] = __floats2bfloat162_rn(scale * (expf(q.z - l) - (v + 2 == t ? 1.0f : 0.0f)),
                                     scale * (expf(q.w - l) - (v + 3 == t ? 1.0f : 0.0f)));
        ((uint2 *)dr)[j] = o;
      }
    } else {
      for (int v = threadIdx.x; v < V; v += blockDim.x)
        dr[v] = __float2bfloat16(scale * (expf(x[v] - l) - (v == t ? 1.0f : 0.0f)));
    }
  }
}

/* ---- launchers ------------------------------------------------------------------------- */

extern "C" int gpt_resid_norm_cuda_fwd(uint16_t *xout, uint16_t *y, float *mean, float *rstd,
                                       const uint16_t *x, const float *delta, const void *w,
                                       const void *b, int wdt, size_t N, int C, float eps,
                                       int layernorm, void *stream, char *err, size_t errlen) {
  const char *what = "gpt_resid_norm_cuda_fwd";
  if (C <= 0) return kfail(err, errlen, what, "C <= 0");
  if (delta && !xout) return kfail(err, errlen, what, "a delta needs xout");
  if (!N) return 0;
  int vec = C % 8 == 0 && al16(x) && al16(y) && (!xout || al16(xout)) && (!delta || al16(delta));
  KERNELS_LAUNCH(k_resid_norm_fwd, grid_for(N, ROWS), dim3(32, ROWS), 0, (cudaStream_t)stream,
                 (bf16 *)xout, (bf16 *)y, mean, rstd, (const bf16 *)x, delta, w, b, wdt, N, C, eps,
                 layernorm, vec);
  return launched(err, errlen, what);
}

/* Threads of the CTA-per-slice kernels: a warp per 256 columns, 1 to 8 warps. */
static int chunk_threads(int C) {
  int warps = (C + 255) / 256;
  return 32 * (warps < 1 ? 1 : warps > 8 ? 8 : warps);
}

extern "C" int gpt_norm_cuda_bwd(float *dx, float *dw, float *db, const float *dy,
                                 const uint16_t *x, const float *mean, const float *rstd,
                                 const void *w, int wdt, size_t N, int C, int layernorm,
                                 float *partial, void *stream, char *err, size_t errlen) {
  const char *what = "gpt_norm_cuda_bwd";
  if (C <= 0) return kfail(err, errlen, what, "C <= 0");
  if (!N) return 0;
  cudaStream_t st = (cudaStream_t)stream;
  int P = slices_of(N, C), vec = C % 8 == 0 && al16(x) && al16(dy) && al16(dx);
  size_t smem = (size_t)(layernorm ? 2 : 1) * C * sizeof(float);
  if (smem > 32 * 1024) { /* over the default 48 KiB with the static part */
    cudaError_t e = cudaFuncSetAttribute(k_norm_bwd, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    if (e != cudaSuccess) {
      (void)cudaGetLastError(); /* not left for the next launch to report */
      return kfail(err, errlen, what, cudaGetErrorString(e));
    }
  }
  KERNELS_LAUNCH(k_norm_bwd, P, chunk_threads(C), smem, st, dx, partial, dy, (const bf16 *)x, mean,
                 rstd, w, wdt, N, C, layernorm, P, vec);
  if (launched(err, errlen, what)) return -1;
  KERNELS_LAUNCH(k_partial_reduce, grid_for((size_t)C, 256), 256, 0, st, dw, layernorm ? db : NULL,
                 partial, P, C);
  return launched(err, errlen, what);
}

extern "C" int gpt_swiglu_cuda_fwd(uint16_t *h, const uint16_t *g, const uint16_t *u, size_t n,
                                   void *stream, char *err, size_t errlen) {
  if (!n) return 0;
  int vec = al16(h) && al16(g) && al16(u);
  KERNELS_LAUNCH(k_swiglu_fwd, grid_for((n + 7) / 8, 256), 256, 0, (cudaStream_t)stream, (bf16 *)h,
                 (const bf16 *)g, (const bf16 *)u, n, vec);
  return launched(err, errlen, "gpt_swiglu_cuda_fwd");
}

extern "C" int gpt_swiglu_cuda_bwd(uint16_t *dg, uint16_t *du, const float *dh, const uint16_t *g,
                                   const uint16_t *u, size_t n, void *stream, char *err,
                                   size_t errlen) {
  if (!n) return 0;
  int vec = al16(dg) && al16(du) && al16(dh) && al16(g) && al16(u);
  KERNELS_LAUNCH(k_swiglu_bwd, grid_for((n + 7) / 8, 256), 256, 0, (cudaStream_t)stream, (bf16 *)dg,
                 (bf16 *)du, dh, (const bf16 *)g, (const bf16 *)u, n, vec);
  return launched(err, errlen, "gpt_swiglu_cuda_bwd");
}

/* pre = bf16(x + b) and, with y, y = bf16(gelu(pre)) */
static int bias_gelu(uint16_t *y, uint16_t *pre, const float *x, const void *b, int wdt, size_t N,
                     int F, void *stream, char *err, size_t errlen, const char *what) {
  if (F <= 0) return kfail(err, errlen, what, "F <= 0");
  size_t n = N * (size_t)F;
  if (!n) return 0;
  int vec = al16(pre) && al16(x) && (!y || al16(y));
  KERNELS_LAUNCH(k_bias_gelu_fwd, grid_for((n + 7) / 8, 256), 256, 0, (cudaStream_t)stream,
                 (bf16 *)y, (bf16 *)pre, x, b, wdt, n, F, vec);
  return launched(err, errlen, what);
}

extern "C" int gpt_gelu_bias_cuda_fwd(uint16_t *y, uint16_t *pre, const float *x, const void *b,
                                      int wdt, size_t N, int F, void *stream, char *err,
                                      size_t errlen) {
  return bias_gelu(y, pre, x, b, wdt, N, F, stream, err, errlen, "gpt_gelu_bias_cuda_fwd");
}

extern "C" int gpt_bias_bf16_cuda(uint16_t *y, const float *x, const void *b, int wdt, size_t N,
                                  int F, void *stream, char *err, size_t errlen) {
  return bias_gelu(NULL, y, x, b, wdt, N, F, stream, err, errlen, "gpt_bias_bf16_cuda");
}

/* db += column sums of dy, or (pre) of dpre = bf16(dy * gelu'(pre)), stored */
static int col_sums(float *db, uint16_t *dpre, const float *dy, const uint16_t *pre, size_t N,
                    int F, float *partial, void *stream, char *err, size_t errlen,
                    const char *what) {
  if (F <= 0) return kfail(err, errlen, what, "F <= 0");
  if (!N) return 0;
  cudaStream_t st = (cudaStream_t)stream;
  int P = slices_of(N, F);
  dim3 grid((unsigned)((F + 255) / 256), (unsigned)P);
  KERNELS_LAUNCH(k_colsum, grid, 256, 0, st, partial, (bf16 *)dpre, dy, (const bf16 *)pre, N, F, P);
  if (launched(err, errlen, what)) return -1;
  if (db) {
    KERNELS_LAUNCH(k_partial_reduce, grid_for((size_t)F, 256), 256, 0, st, db, NULL, partial, P, F);
    return launched(err, errlen, what);
  }
  return 0;
}

extern "C" int gpt_gelu_bias_cuda_bwd(uint16_t *dpre, float *db, const float *dy,
                                      const uint16_t *pre, size_t N, int F, float *partial,
                                      void *stream, char *err, size_t errlen) {
  return col_sums(db, dpre, dy, pre, N, F, partial, stream, err, errlen, "gpt_gelu_bias_cuda_bwd");
}

extern "C" int gpt_bias_grad_cuda(float *db, const float *dy, size_t N, int F, float *partial,
                                  void *stream, char *err, size_t errlen) {
  return col_sums(db, NULL, dy, NULL, N, F, partial, stream, err, errlen, "gpt_bias_grad_cuda");
}

extern "C" int gpt_ce_cuda_fwd(const float *logits, const int32_t *tgt, size_t n, int V,
                               float *rowloss, float *lse, void *stream, char *err, size_t errlen) {
  if (V <= 0) return kfail(err, errlen, "gpt_ce_cuda_fwd", "V <= 0");
  if (!n) return 0;
  int vec = V % 4 == 0 && al16(logits);
  KERNELS_LAUNCH(k_ce_fwd, grid_for(n, 1), CE_THREADS, 0, (cudaStream_t)stream, rowloss, lse,
                 logits, tgt, n, V, vec);
  return launched(err, errlen, "gpt_ce_cuda_fwd");
}

extern "C" int gpt_ce_cuda_bwd(uint16_t *dlogits, const float *logits, const int32_t *tgt,
                               const float *lse, size_t n, int V, float scale, void *stream,
                               char *err, size_t errlen) {
  if (V <= 0) return kfail(err, errlen, "gpt_ce_cuda_bwd", "V <= 0");
  if (!n) return 0;
  int vec = V % 4 == 0 && al16(logits) && ((uintptr_t)dlogits & 7u) == 0;
  KERNELS_LAUNCH(k_ce_bwd, grid_for(n, 1), CE_THREADS, 0, (cudaStream_t)stream, (bf16 *)dlogits,
                 logits, tgt, lse, n, V, scale, vec);
  return launched(err, errlen, "gpt_ce_cuda_bwd");
}
