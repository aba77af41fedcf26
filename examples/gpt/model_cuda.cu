/* examples/gpt/model_cuda.cu — the transformer on a CUDA GPU, mirroring
 * model_cpu.c step for step: bf16 GEMMs with fp32 accumulation on cuBLAS
 * (operands rounded to bf16 in two scratch buffers, results fp32), CUDA C
 * kernels for embeddings, norms, activations, rotary, causal softmax and
 * cross-entropy. Activations stay fp32 on the device; parameters and
 * gradients are the provider's device pointers. Owns activations only.
 */
#include "gpt_cuda.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(call)                                                                          \
  do {                                                                                    \
    cudaError_t e_ = (call);                                                              \
    if (e_ != cudaSuccess)                                                                \
      return fail(m, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
  } while (0)
#define CB(call)                                                                               \
  do {                                                                                         \
    cublasStatus_t s_ = (call);                                                                \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
      return fail(m, "%s:%d: %s: cuBLAS status %d", __FILE__, __LINE__, #call, (int)s_);      \
  } while (0)

typedef struct {
  float *n1, *mean1, *rstd1, *qkv, *att, *ao, *xmid, *n2, *mean2, *rstd2, *h1, *h2, *h3;
} dacts;

struct gpt_cuda_model {
  const gpt_schema *s;
  gpt_run_config rc;
  int B, T, BT, C, F, V, H, KV, hd, L;
  cublasHandle_t blas;
  float **xres;
  dacts *a;
  int n_acts;
  float *nf, *meanf, *rstdf, *logits, *rcos, *rsin, *rowloss;
  int32_t *tok, *tgt;
  float *dres, *dtmp, *dn, *dqkv, *dao, *dh1, *dh2, *datt;
  __nv_bfloat16 *bf[2];
  size_t bf_cap;
  int grads_pending;
  char err[512];
};

static int fail(gpt_cuda_model *m, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m->err, sizeof m->err, fmt, ap);
  va_end(ap);
  return -1;
}

extern "C" int gpt_cuda_available(char *why, size_t len) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    snprintf(why, len, "no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return -1;
  }
  return 0;
}

/* ---- kernels ------------------------------------------------------------------ */

__device__ static float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ static float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* One warp per row: blocks of 8 warps. */
#define ROWS_PER_BLOCK 8
static dim3 row_grid(int rows) { return dim3((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK); }
static dim3 row_block() { return dim3(32, ROWS_PER_BLOCK); }
static unsigned grid1(size_t n) { return (unsigned)((n + 255) / 256); }

__global__ void k_to_bf16(__nv_bfloat16 *d, const float *s, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) d[i] = __float2bfloat16(s[i]);
}

__global__ void k_embed(float *x, const float *wte, const float *wpe, const int32_t *tok, int BT,
                        int T, int C) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)BT * C) return;
  int n = (int)(i / C), c = (int)(i % C);
  float v = wte[(size_t)tok[n] * C + c];
  if (wpe) v += wpe[(size_t)(n % T) * C + c];
  x[i] = v;
}

__global__ void k_embed_bwd(float *dwte, float *dwpe, const float *d, const int32_t *tok, int BT,
                            int T, int C) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)BT * C) return;
  int n = (int)(i / C), c = (int)(i % C);
  atomicAdd(&dwte[(size_t)tok[n] * C + c], d[i]);
  if (dwpe) atomicAdd(&dwpe[(size_t)(n % T) * C + c], d[i]);
}

/* LayerNorm (b != NULL) or RMSNorm (b == NULL, mean unused). */
__global__ void k_norm_fwd(float *y, float *mean, float *rstd, const float *x, const float *w,
                           const float *b, int N, int C, float eps) {
  int n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.y, l = threadIdx.x;
  if (n >= N) return;
  const float *xr = x + (size_t)n * C;
  float mu = 0;
  if (b) {
    for (int i = l; i < C; i += 32) mu += xr[i];
    mu = warp_sum(mu) / C;
  }
  float ss = 0;
  for (int i = l; i < C; i += 32) ss += (xr[i] - mu) * (xr[i] - mu);
  float rs = rsqrtf(warp_sum(ss) / C + eps);
  for (int i = l; i < C; i += 32)
    y[(size_t)n * C + i] = (xr[i] - mu) * rs * w[i] + (b ? b[i] : 0.0f);
  if (l == 0) {
    if (mean) mean[n] = mu;
    rstd[n] = rs;
  }
}

__global__ void k_norm_bwd(float *dx, float *dw, float *db, const float *dy, const float *x,
                           const float *mean, const float *rstd, const float *w, int N, int C) {
  int n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.y, l = threadIdx.x;
  if (n >= N) return;
  const float *xr = x + (size_t)n * C, *dyr = dy + (size_t)n * C;
  float mu = db ? mean[n] : 0.0f, rs = rstd[n], s1 = 0, s2 = 0;
  for (int i = l; i < C; i += 32) {
    float xh = (xr[i] - mu) * rs, dxh = dyr[i] * w[i];
    s1 += dxh;
    s2 += dxh * xh;
  }
  s1 = db ? warp_sum(s1) / C : 0.0f;
  s2 = warp_sum(s2) / C;
  for (int i = l; i < C; i += 32) {
    float xh = (xr[i] - mu) * rs, dxh = dyr[i] * w[i];
    atomicAdd(&dw[i], dyr[i] * xh);
    if (db) atomicAdd(&db[i], dyr[i]);
    dx[(size_t)n * C + i] += rs * (dxh - s1 - xh * s2);
  }
}

__global__ void k_bias_add(float *y, const float *b, int N, int out) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < (size_t)N * out) y[i] += b[i % out];
}

__global__ void k_bias_grad(float *db, const float *dy, int N, int out) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= out) return;
  float s = 0;
  for (int n = 0; n < N; n++) s += dy[(size_t)n * out + j];
  db[j] += s;
}

__global__ void k_add(float *y, const float *x, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] += x[i];
}

#define GELU_S 0.7978845608028654f
__global__ void k_gelu_fwd(float *y, const float *x, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = x[i];
  y[i] = 0.5f * v * (1.0f + tanhf(GELU_S * (v + 0.044715f * v * v * v)));
}
__global__ void k_gelu_bwd(float *dx, const float *dy, const float *x, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = x[i], t = tanhf(GELU_S * (v + 0.044715f * v * v * v));
  dx[i] = dy[i] * (0.5f * (1.0f + t) +
                   0.5f * v * (1.0f - t * t) * GELU_S * (1.0f + 3 * 0.044715f * v * v));
}

__global__ void k_swiglu_fwd(float *h3, const float *g, const float *u, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  float s = 1.0f / (1.0f + expf(-g[i]));
  h3[i] = g[i] * s * u[i];
}
/* d(h3) in dg on entry: dg = d(gate), du = d(up) on return. */
__global__ void k_swiglu_bwd(float *dg, float *du, const float *g, const float *u, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  float gt = g[i], s = 1.0f / (1.0f + expf(-gt)), d = du[i];
  dg[i] = d * u[i] * s * (1.0f + gt * (1.0f - s));
  du[i] = d * gt * s;
}

__global__ void k_rope(float *x, int ld, int BT, int T, int heads, int hd, const float *cs,
                       const float *sn, float sign) {
  int half = hd / 2;
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)BT * heads * half) return;
  int k = (int)(i % half), h = (int)((i / half) % heads), n = (int)(i / ((size_t)half * heads));
  int t = n % T;
  float c = cs[t * half + k], s = sign * sn[t * half + k];
  float *p = x + (size_t)n * ld + h * hd;
  float a = p[k], b = p[k + half];
  p[k] = a * c - b * s;
  p[k + half] = b * c + a * s;
}

/* Rows of T scores: causal softmax in place (row i keeps j <= i). */
__global__ void k_softmax_causal(float *S, int rows, int T) {
  int r = blockIdx.x * ROWS_PER_BLOCK + threadIdx.y, l = threadIdx.x;
  if (r >= rows) return;
  int i = r % T;
  float *p = S + (size_t)r * T, mx = -INFINITY, sum = 0;
  for (int j = l; j <= i; j += 32) mx = fmaxf(mx, p[j]);
  mx = warp_max(mx);
  for (int j = l; j <= i; j += 32) sum += expf(p[j] - mx);
  sum = warp_sum(sum);
  for (int j = l; j < T; j += 32) p[j] = j <= i ? expf(p[j] - mx) / sum : 0.0f;
}

/* dP -> dS in place: dS = P (dP - sum(P dP)). */
__global__ void k_softmax_bwd(float *dP, const float *P, int rows, int T) {
  int r = blockIdx.x * ROWS_PER_BLOCK + threadIdx.y, l = threadIdx.x;
  if (r >= rows) return;
  int i = r % T;
  float *d = dP + (size_t)r * T;
  const float *p = P + (size_t)r * T;
  float dot = 0;
  for (int j = l; j <= i; j += 32) dot += p[j] * d[j];
  dot = warp_sum(dot);
  for (int j = l; j < T; j += 32) d[j] = j <= i ? p[j] * (d[j] - dot) : 0.0f;
}

/* Per-row cross-entropy; with grad != 0 the logits become dlogits. */
__global__ void k_xent(float *logits, float *rowloss, const int32_t *tgt, int N, int V, int grad) {
  int n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.y, l = threadIdx.x;
  if (n >= N) return;
  float *r = logits + (size_t)n * V, mx = -INFINITY, sum = 0;
  for (int v = l; v < V; v += 32) mx = fmaxf(mx, r[v]);
  mx = warp_max(mx);
  for (int v = l; v < V; v += 32) sum += expf(r[v] - mx);
  sum = warp_sum(sum);
  if (!grad) {
    if (l == 0) rowloss[n] = logf(sum) + mx - r[tgt[n]];
    return;
  }
  for (int v = l; v < V; v += 32)
    r[v] = (expf(r[v] - mx) / sum - (v == tgt[n] ? 1.0f : 0.0f)) / (float)N;
}

/* ---- GEMM helpers (row-major semantics over column-major cuBLAS) ----------------- */

static int bf16_of(gpt_cuda_model *m, int slot, const float *src, size_t n,
                   const __nv_bfloat16 **out) {
  if (n > m->bf_cap) return fail(m, "bf16 scratch of %zu elements too small for %zu", m->bf_cap, n);
  k_to_bf16<<<grid1(n), 256>>>(m->bf[slot], src, n);
  CK(cudaGetLastError());
  *out = m->bf[slot];
  return 0;
}

/* C[M,N] (fp32) = alpha op(A)[M,K] op(B)[K,N] + beta C, A and B bf16 row-major. */
static int rgemm(gpt_cuda_model *m, int ta, int tb, int M, int N, int K, float alpha,
                 const __nv_bfloat16 *A, int lda, long long sa, const __nv_bfloat16 *B, int ldb,
                 long long sb, float beta, float *C, int ldc, long long sc, int batch) {
  CB(cublasGemmStridedBatchedEx(m->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, CUDA_R_16BF,
                                ldb, sb, A, CUDA_R_16BF, lda, sa, &beta, C, CUDA_R_32F, ldc, sc,
                                batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return 0;
}

/* y[N,out] = x W (+b); conv1d: W [in,out], else [out,in]. */
static int linear_fwd(gpt_cuda_model *m, float *y, const float *x, const float *W, const float *b,
                      int N, int in, int out, int conv1d) {
  const __nv_bfloat16 *xb, *wb;
  if (bf16_of(m, 0, x, (size_t)N * in, &xb) || bf16_of(m, 1, W, (size_t)in * out, &wb)) return -1;
  if (rgemm(m, 0, !conv1d, N, out, in, 1.0f, xb, in, 0, wb, conv1d ? out : in, 0, 0.0f, y, out, 0,
            1))
    return -1;
  if (b) k_bias_add<<<grid1((size_t)N * out), 256>>>(y, b, N, out);
  CK(cudaGetLastError());
  return 0;
}

static int linear_bwd(gpt_cuda_model *m, float *dx, float beta, float *dW, float *db,
                      const float *dy, const float *x, const float *W, int N, int in, int out,
                      int conv1d) {
  const __nv_bfloat16 *dyb, *b2;
  if (bf16_of(m, 0, dy, (size_t)N * out, &dyb)) return -1;
  if (dx) {
    if (bf16_of(m, 1, W, (size_t)in * out, &b2) ||
        rgemm(m, 0, conv1d, N, in, out, 1.0f, dyb, out, 0, b2, conv1d ? out : in, 0, beta, dx, in,
              0, 1))
      return -1;
  }
  if (bf16_of(m, 1, x, (size_t)N * in, &b2)) return -1;
  if (conv1d) {
    if (rgemm(m, 1, 0, in, out, N, 1.0f, b2, in, 0, dyb, out, 0, 1.0f, dW, out, 0, 1)) return -1;
  } else {
    if (rgemm(m, 1, 0, out, in, N, 1.0f, dyb, out, 0, b2, in, 0, 1.0f, dW, in, 0, 1)) return -1;
  }
  if (db) k_bias_grad<<<grid1((size_t)out), 256>>>(db, dy, N, out);
  CK(cudaGetLastError());
  return 0;
}

typedef struct {
  float *q, *k, *v;
  int ldq, ldk, ldv;
} qkv_view;

static qkv_view qkv_of(const gpt_cuda_model *m, float *buf) {
  qkv_view r;
  if (m->s->cfg.family == GPT_GPT2) {
    r.q = buf, r.k = buf + m->C, r.v = buf + 2 * m->C;
    r.ldq = r.ldk = r.ldv = 3 * m->C;
  } else {
    int kv = m->KV * m->hd;
    r.q = buf, r.k = buf + (size_t)m->BT * m->C, r.v = r.k + (size_t)m->BT * kv;
    r.ldq = m->C, r.ldk = r.ldv = kv;
  }
  return r;
}

static size_t qkv_elems(const gpt_cuda_model *m) {
  return (size_t)m->BT * (m->C + 2 * (size_t)m->KV * m->hd);
}

/* Batched over the KV heads sharing one offset j within their query group:
 * heads h = kv*grp + j. Offsets are in elements of the bf16 copies. */
static int attention_fwd(gpt_cuda_model *m, float *ao, float *att, qkv_view x, float *qkv_base) {
  int T = m->T, hd = m->hd, H = m->H, KV = m->KV, grp = H / KV;
  float scale = 1.0f / sqrtf((float)hd);
  const __nv_bfloat16 *qb, *pb;
  if (bf16_of(m, 0, qkv_base, qkv_elems(m), &qb)) return -1;
  size_t oq = (size_t)(x.q - qkv_base), ok = (size_t)(x.k - qkv_base);
  for (int b = 0; b < m->B; b++)
    for (int j = 0; j < grp; j++)
      if (rgemm(m, 0, 1, T, T, hd, scale, qb + oq + (size_t)b * T * x.ldq + j * hd, x.ldq,
                (long long)grp * hd, qb + ok + (size_t)b * T * x.ldk, x.ldk, hd, 0.0f,
                att + ((size_t)b * H + j) * T * T, T, (long long)grp * T * T, KV))
        return -1;
  k_softmax_causal<<<row_grid(m->B * H * T), row_block()>>>(att, m->B * H * T, T);
  CK(cudaGetLastError());
  if (bf16_of(m, 1, att, (size_t)m->B * H * T * T, &pb)) return -1;
  size_t ov = (size_t)(x.v - qkv_base);
  for (int b = 0; b < m->B; b++)
    for (int j = 0; j < grp; j++)
      if (rgemm(m, 0, 0, T, hd, T, 1.0f, pb + ((size_t)b * H + j) * T * T, T,
                (long long)grp * T * T, qb + ov + (size_t)b * T * x.ldv, x.ldv, hd, 0.0f,
                ao + (size_t)b * T * m->C + j * hd, m->C, (long long)grp * hd, KV))
        return -1;
  return 0;
}

static int attention_bwd(gpt_cuda_model *m, qkv_view dx, const float *dao, const float *att,
                         qkv_view x, float *qkv_base) {
  int T = m->T, hd = m->hd, H = m->H, KV = m->KV, grp = H / KV;
  float scale = 1.0f / sqrtf((float)hd);
  const __nv_bfloat16 *d0, *s1;
  size_t oq = (size_t)(x.q - qkv_base), ok = (size_t)(x.k - qkv_base), ov = (size_t)(x.v - qkv_base);
  long long sP = (long long)grp * T * T;
  /* dP = dO V^T */
  if (bf16_of(m, 0, dao, (size_t)m->BT * m->C, &d0) || bf16_of(m, 1, qkv_base, qkv_elems(m), &s1))
    return -1;
  for (int b = 0; b < m->B; b++)
    for (int j = 0; j < grp; j++)
      if (rgemm(m, 0, 1, T, T, hd, 1.0f, d0 + (size_t)b * T * m->C + j * hd, m->C,
                (long long)grp * hd, s1 + ov + (size_t)b * T * x.ldv, x.ldv, hd, 0.0f,
                m->datt + ((size_t)b * H + j) * T * T, T, sP, KV))
        return -1;
  /* dV += P^T dO (heads of a group add into one kv head: one j at a time) */
  if (bf16_of(m, 1, att, (size_t)m->B * H * T * T, &s1)) return -1;
  for (int b = 0; b < m->B; b++)
    for (int j = 0; j < grp; j++)
      if (rgemm(m, 1, 0, T, hd, T, 1.0f, s1 + ((size_t)b * H + j) * T * T, T, sP,
                d0 + (size_t)b * T * m->C + j * hd, m->C, (long long)grp * hd, 1.0f,
                dx.v + (size_t)b * T * dx.ldv, dx.ldv, hd, KV))
        return -1;
  k_softmax_bwd<<<row_grid(m->B * H * T), row_block()>>>(m->datt, att, m->B * H * T, T);
  CK(cudaGetLastError());
  /* dQ = scale dS K, dK += scale dS^T Q */
  if (bf16_of(m, 0, m->datt, (size_t)m->B * H * T * T, &d0) ||
      bf16_of(m, 1, qkv_base, qkv_elems(m), &s1))
    return -1;
  for (int b = 0; b < m->B; b++)
    for (int j = 0; j < grp; j++) {
      if (rgemm(m, 0, 0, T, hd, T, scale, d0 + ((size_t)b * H + j) * T * T, T, sP,
                s1 + ok + (size_t)b * T * x.ldk, x.ldk, hd, 0.0f,
                dx.q + (size_t)b * T * dx.ldq + j * hd, dx.ldq, (long long)grp * hd, KV))
        return -1;
      if (rgemm(m, 1, 0, T, hd, T, scale, d0 + ((size_t)b * H + j) * T * T, T, sP,
                s1 + oq + (size_t)b * T * x.ldq + j * hd, x.ldq, (long long)grp * hd, 1.0f,
                dx.k + (size_t)b * T * dx.ldk, dx.ldk, hd, KV))
        return -1;
    }
  return 0;
}

/* ---- create / free ------------------------------------------------------------------ */

static float *dalloc(gpt_cuda_model *m, size_t n, int *bad) {
  void *p = NULL;
  if (cudaMalloc(&p, (n ? n : 1) * sizeof(float)) != cudaSuccess) {
    *bad = 1;
    return NULL;
  }
  cudaMemset(p, 0, (n ? n : 1) * sizeof(float));
  return (float *)p;
}

extern "C" int gpt_cuda_model_create(const gpt_schema *s, const gpt_run_config *rc,
                                     gpt_cuda_model **out) {
  *out = NULL;
  if (rc->batch < 1 || rc->seq < 1 || rc->seq > s->cfg.max_seq) return -1;
  gpt_cuda_model *m = (gpt_cuda_model *)calloc(1, sizeof *m);
  if (!m) return -1;
  const gpt_config *c = &s->cfg;
  m->s = s;
  m->rc = *rc;
  m->B = rc->batch, m->T = rc->seq, m->BT = rc->batch * rc->seq;
  m->C = c->d_model, m->F = c->d_ff, m->V = c->vocab, m->H = c->n_head, m->KV = c->n_kv_head;
  m->hd = c->d_model / c->n_head, m->L = c->n_layer;
  if (cublasCreate(&m->blas) != CUBLAS_STATUS_SUCCESS) {
    free(m);
    return -1;
  }
  int bad = 0;
  size_t BT = m->BT, C = m->C, F = m->F, V = m->V, att = (size_t)m->B * m->H * m->T * m->T;
  m->xres = (float **)calloc((size_t)m->L + 1, sizeof *m->xres);
  m->n_acts = rc->checkpoint ? 1 : m->L;
  m->a = (dacts *)calloc((size_t)m->n_acts, sizeof *m->a);
  if (!m->xres || !m->a) bad = 1;
  for (int l = 0; !bad && l <= m->L; l++) m->xres[l] = dalloc(m, BT * C, &bad);
  for (int l = 0; !bad && l < m->n_acts; l++) {
    dacts *a = &m->a[l];
    a->n1 = dalloc(m, BT * C, &bad), a->mean1 = dalloc(m, BT, &bad), a->rstd1 = dalloc(m, BT, &bad);
    a->qkv = dalloc(m, qkv_elems(m), &bad), a->att = dalloc(m, att, &bad);
    a->ao = dalloc(m, BT * C, &bad), a->xmid = dalloc(m, BT * C, &bad);
    a->n2 = dalloc(m, BT * C, &bad), a->mean2 = dalloc(m, BT, &bad), a->rstd2 = dalloc(m, BT, &bad);
    a->h1 = dalloc(m, BT * F, &bad), a->h2 = dalloc(m, BT * F, &bad);
    a->h3 = c->family == GPT_LLAMA ? dalloc(m, BT * F, &bad) : NULL;
  }
  m->nf = dalloc(m, BT * C, &bad), m->meanf = dalloc(m, BT, &bad), m->rstdf = dalloc(m, BT, &bad);
  m->logits = dalloc(m, BT * V, &bad), m->rowloss = dalloc(m, BT, &bad);
  size_t half = (size_t)m->hd / 2 + 1;
  m->rcos = dalloc(m, (size_t)m->T * half, &bad), m->rsin = dalloc(m, (size_t)m->T * half, &bad);
  m->tok = (int32_t *)dalloc(m, BT, &bad), m->tgt = (int32_t *)dalloc(m, BT, &bad);
  m->dres = dalloc(m, BT * C, &bad), m->dtmp = dalloc(m, BT * C, &bad), m->dn = dalloc(m, BT * C, &bad);
  m->dqkv = dalloc(m, qkv_elems(m), &bad), m->dao = dalloc(m, BT * C, &bad);
  m->dh1 = dalloc(m, BT * F, &bad), m->dh2 = dalloc(m, BT * F, &bad), m->datt = dalloc(m, att, &bad);
  /* the largest GEMM operand */
  size_t cap = qkv_elems(m);
  size_t cand[] = {att, BT * F, V * C, BT * V, C * 3 * C, C * F};
  for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++) cap = cand[i] > cap ? cand[i] : cap;
  for (size_t i = 0; i < (size_t)s->n_params; i++)
    cap = s->params[i].numel > cap ? s->params[i].numel : cap;
  m->bf_cap = cap;
  for (int i = 0; i < 2; i++)
    if (cudaMalloc((void **)&m->bf[i], cap * sizeof(__nv_bfloat16)) != cudaSuccess) bad = 1;
  if (!bad && c->family == GPT_LLAMA) {
    int h2 = m->hd / 2;
    float *hc = (float *)malloc((size_t)m->T * h2 * sizeof(float) * 2), *hs = hc + (size_t)m->T * h2;
    for (int i = 0; i < h2; i++) {
      float inv = (float)(1.0 / pow((double)c->rope_theta, (double)(2 * i) / m->hd));
      for (int t = 0; t < m->T; t++) {
        float ang = (float)t * inv;
        hc[t * h2 + i] = (float)cos((double)ang);
        hs[t * h2 + i] = (float)sin((double)ang);
      }
    }
    if (cudaMemcpy(m->rcos, hc, (size_t)m->T * h2 * sizeof(float), cudaMemcpyHostToDevice) ||
        cudaMemcpy(m->rsin, hs, (size_t)m->T * h2 * sizeof(float), cudaMemcpyHostToDevice))
      bad = 1;
    free(hc);
  }
  if (bad) {
    gpt_cuda_model_free(m);
    return -1;
  }
  *out = m;
  return 0;
}

extern "C" void gpt_cuda_model_free(gpt_cuda_model *m) {
  if (!m) return;
  if (m->xres)
    for (int l = 0; l <= m->L; l++) cudaFree(m->xres[l]);
  if (m->a)
    for (int l = 0; l < m->n_acts; l++) {
      dacts *a = &m->a[l];
      float *ps[] = {a->n1, a->mean1, a->rstd1, a->qkv, a->att, a->ao, a->xmid,
                     a->n2, a->mean2, a->rstd2, a->h1, a->h2, a->h3};
      for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) cudaFree(ps[i]);
    }
  float *ps[] = {m->nf, m->meanf, m->rstdf, m->logits, m->rowloss, m->rcos, m->rsin, m->dres,
                 m->dtmp, m->dn, m->dqkv, m->dao, m->dh1, m->dh2, m->datt};
  for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) cudaFree(ps[i]);
  cudaFree(m->tok), cudaFree(m->tgt), cudaFree(m->bf[0]), cudaFree(m->bf[1]);
  free(m->xres), free(m->a);
  if (m->blas) cublasDestroy(m->blas);
  free(m);
}

extern "C" const char *gpt_cuda_model_last_error(const gpt_cuda_model *m) { return m ? m->err : ""; }

/* ---- blocks and passes ------------------------------------------------------------------ */

#define TRY(x) \
  do {         \
    if (x) return -1; \
  } while (0)

static int norm_fwd(gpt_cuda_model *m, float *y, float *mean, float *rstd, const float *x,
                    const float *w, const float *b) {
  k_norm_fwd<<<row_grid(m->BT), row_block()>>>(y, mean, rstd, x, w, b, m->BT, m->C,
                                               m->s->cfg.norm_eps);
  CK(cudaGetLastError());
  return 0;
}

static int norm_bwd(gpt_cuda_model *m, float *dx, float *dw, float *db, const float *dy,
                    const float *x, const float *mean, const float *rstd, const float *w) {
  k_norm_bwd<<<row_grid(m->BT), row_block()>>>(dx, dw, db, dy, x, mean, rstd, w, m->BT, m->C);
  CK(cudaGetLastError());
  return 0;
}

static int block_fwd(gpt_cuda_model *m, dacts *a, const gpt_group_view *g, const float *x, float *y) {
  int BT = m->BT, C = m->C, F = m->F;
  size_t n = (size_t)BT * C, nf = (size_t)BT * F;
  qkv_view q = qkv_of(m, a->qkv);
  if (m->s->cfg.family == GPT_GPT2) {
    TRY(norm_fwd(m, a->n1, a->mean1, a->rstd1, x, g->w[G2_LN1_W], g->w[G2_LN1_B]));
    TRY(linear_fwd(m, a->qkv, a->n1, g->w[G2_QKV_W], g->w[G2_QKV_B], BT, C, 3 * C, 1));
    TRY(attention_fwd(m, a->ao, a->att, q, a->qkv));
    TRY(linear_fwd(m, a->xmid, a->ao, g->w[G2_ATTO_W], g->w[G2_ATTO_B], BT, C, C, 1));
    k_add<<<grid1(n), 256>>>(a->xmid, x, n);
    TRY(norm_fwd(m, a->n2, a->mean2, a->rstd2, a->xmid, g->w[G2_LN2_W], g->w[G2_LN2_B]));
    TRY(linear_fwd(m, a->h1, a->n2, g->w[G2_FC_W], g->w[G2_FC_B], BT, C, F, 1));
    k_gelu_fwd<<<grid1(nf), 256>>>(a->h2, a->h1, nf);
    TRY(linear_fwd(m, y, a->h2, g->w[G2_FCO_W], g->w[G2_FCO_B], BT, F, C, 1));
  } else {
    int kv = m->KV * m->hd;
    TRY(norm_fwd(m, a->n1, NULL, a->rstd1, x, g->w[LL_IN_NORM], NULL));
    TRY(linear_fwd(m, q.q, a->n1, g->w[LL_Q], NULL, BT, C, C, 0));
    TRY(linear_fwd(m, q.k, a->n1, g->w[LL_K], NULL, BT, C, kv, 0));
    TRY(linear_fwd(m, q.v, a->n1, g->w[LL_V], NULL, BT, C, kv, 0));
    k_rope<<<grid1((size_t)BT * m->H * m->hd / 2), 256>>>(q.q, q.ldq, BT, m->T, m->H, m->hd,
                                                          m->rcos, m->rsin, 1.0f);
    k_rope<<<grid1((size_t)BT * m->KV * m->hd / 2), 256>>>(q.k, q.ldk, BT, m->T, m->KV, m->hd,
                                                           m->rcos, m->rsin, 1.0f);
    TRY(attention_fwd(m, a->ao, a->att, q, a->qkv));
    TRY(linear_fwd(m, a->xmid, a->ao, g->w[LL_O], NULL, BT, C, C, 0));
    k_add<<<grid1(n), 256>>>(a->xmid, x, n);
    TRY(norm_fwd(m, a->n2, NULL, a->rstd2, a->xmid, g->w[LL_POST_NORM], NULL));
    TRY(linear_fwd(m, a->h1, a->n2, g->w[LL_GATE], NULL, BT, C, F, 0));
    TRY(linear_fwd(m, a->h2, a->n2, g->w[LL_UP], NULL, BT, C, F, 0));
    k_swiglu_fwd<<<grid1(nf), 256>>>(a->h3, a->h1, a->h2, nf);
    TRY(linear_fwd(m, y, a->h3, g->w[LL_DOWN], NULL, BT, F, C, 0));
  }
  k_add<<<grid1(n), 256>>>(y, a->xmid, n);
  CK(cudaGetLastError());
  return 0;
}

static int block_bwd(gpt_cuda_model *m, dacts *a, const gpt_group_view *g, const float *x) {
  int BT = m->BT, C = m->C, F = m->F;
  size_t nf = (size_t)BT * F;
  float *dres = m->dres;
  if (m->s->cfg.family == GPT_GPT2) {
    TRY(linear_bwd(m, m->dh2, 0.0f, g->g[G2_FCO_W], g->g[G2_FCO_B], dres, a->h2, g->w[G2_FCO_W],
                   BT, F, C, 1));
    k_gelu_bwd<<<grid1(nf), 256>>>(m->dh1, m->dh2, a->h1, nf);
    TRY(linear_bwd(m, m->dn, 0.0f, g->g[G2_FC_W], g->g[G2_FC_B], m->dh1, a->n2, g->w[G2_FC_W], BT,
                   C, F, 1));
    TRY(norm_bwd(m, dres, g->g[G2_LN2_W], g->g[G2_LN2_B], m->dn, a->xmid, a->mean2, a->rstd2,
                 g->w[G2_LN2_W]));
    TRY(linear_bwd(m, m->dao, 0.0f, g->g[G2_ATTO_W], g->g[G2_ATTO_B], dres, a->ao,
                   g->w[G2_ATTO_W], BT, C, C, 1));
    CK(cudaMemset(m->dqkv, 0, qkv_elems(m) * sizeof(float)));
    TRY(attention_bwd(m, qkv_of(m, m->dqkv), m->dao, a->att, qkv_of(m, a->qkv), a->qkv));
    TRY(linear_bwd(m, m->dn, 0.0f, g->g[G2_QKV_W], g->g[G2_QKV_B], m->dqkv, a->n1,
                   g->w[G2_QKV_W], BT, C, 3 * C, 1));
    TRY(norm_bwd(m, dres, g->g[G2_LN1_W], g->g[G2_LN1_B], m->dn, x, a->mean1, a->rstd1,
                 g->w[G2_LN1_W]));
  } else {
    int kv = m->KV * m->hd;
    TRY(linear_bwd(m, m->dh2, 0.0f, g->g[LL_DOWN], NULL, dres, a->h3, g->w[LL_DOWN], BT, F, C, 0));
    k_swiglu_bwd<<<grid1(nf), 256>>>(m->dh1, m->dh2, a->h1, a->h2, nf);
    TRY(linear_bwd(m, m->dn, 0.0f, g->g[LL_GATE], NULL, m->dh1, a->n2, g->w[LL_GATE], BT, C, F, 0));
    TRY(linear_bwd(m, m->dn, 1.0f, g->g[LL_UP], NULL, m->dh2, a->n2, g->w[LL_UP], BT, C, F, 0));
    TRY(norm_bwd(m, dres, g->g[LL_POST_NORM], NULL, m->dn, a->xmid, NULL, a->rstd2,
                 g->w[LL_POST_NORM]));
    TRY(linear_bwd(m, m->dao, 0.0f, g->g[LL_O], NULL, dres, a->ao, g->w[LL_O], BT, C, C, 0));
    CK(cudaMemset(m->dqkv, 0, qkv_elems(m) * sizeof(float)));
    qkv_view dq = qkv_of(m, m->dqkv), q = qkv_of(m, a->qkv);
    TRY(attention_bwd(m, dq, m->dao, a->att, q, a->qkv));
    k_rope<<<grid1((size_t)BT * m->H * m->hd / 2), 256>>>(dq.q, dq.ldq, BT, m->T, m->H, m->hd,
                                                          m->rcos, m->rsin, -1.0f);
    k_rope<<<grid1((size_t)BT * m->KV * m->hd / 2), 256>>>(dq.k, dq.ldk, BT, m->T, m->KV, m->hd,
                                                           m->rcos, m->rsin, -1.0f);
    TRY(linear_bwd(m, m->dn, 0.0f, g->g[LL_Q], NULL, dq.q, a->n1, g->w[LL_Q], BT, C, C, 0));
    TRY(linear_bwd(m, m->dn, 1.0f, g->g[LL_K], NULL, dq.k, a->n1, g->w[LL_K], BT, C, kv, 0));
    TRY(linear_bwd(m, m->dn, 1.0f, g->g[LL_V], NULL, dq.v, a->n1, g->w[LL_V], BT, C, kv, 0));
    TRY(norm_bwd(m, dres, g->g[LL_IN_NORM], NULL, m->dn, x, NULL, a->rstd1, g->w[LL_IN_NORM]));
  }
  CK(cudaGetLastError());
  return 0;
}

#define FETCH(grp, mode, view)                                              \
  do {                                                                      \
    if (p->fetch(p->ctx, (grp), (mode), (view)))                            \
      return fail(m, "fetch of group %d failed", (grp));                    \
  } while (0)
#define RELEASE(grp, mode)                                                  \
  do {                                                                      \
    if (p->release(p->ctx, (grp), (mode)))                                  \
      return fail(m, "release of group %d failed", (grp));                  \
  } while (0)

static const float *head_weight(const gpt_cuda_model *m, const gpt_group_view *e,
                                const gpt_group_view *h) {
  if (m->s->cfg.family == GPT_GPT2) return e->w[G2_WTE];
  return m->s->cfg.tied ? e->w[LL_EMB] : h->w[LL_HEAD];
}

extern "C" int gpt_cuda_model_forward(gpt_cuda_model *m, gpt_provider *p, const int32_t *tokens,
                                      const int32_t *targets, float *loss) {
  const gpt_config *c = &m->s->cfg;
  int BT = m->BT, C = m->C, V = m->V;
  for (int i = 0; i < BT; i++)
    if (tokens[i] < 0 || tokens[i] >= V || (targets && (targets[i] < 0 || targets[i] >= V)))
      return fail(m, "token or target out of range at %d", i);
  CK(cudaMemcpy(m->tok, tokens, (size_t)BT * sizeof(int32_t), cudaMemcpyHostToDevice));
  if (targets) CK(cudaMemcpy(m->tgt, targets, (size_t)BT * sizeof(int32_t), cudaMemcpyHostToDevice));
  gpt_group_view e, h, g;
  FETCH(0, GPT_FETCH_FORWARD, &e);
  k_embed<<<grid1((size_t)BT * C), 256>>>(m->xres[0], e.w[0],
                                          c->family == GPT_GPT2 ? e.w[G2_WPE] : NULL, m->tok, BT,
                                          m->T, C);
  CK(cudaGetLastError());
  RELEASE(0, GPT_RELEASE_FORWARD);
  for (int l = 0; l < m->L; l++) {
    FETCH(1 + l, GPT_FETCH_FORWARD, &g);
    TRY(block_fwd(m, &m->a[m->rc.checkpoint ? 0 : l], &g, m->xres[l], m->xres[l + 1]));
    RELEASE(1 + l, GPT_RELEASE_FORWARD);
  }
  int hg = m->L + 1, need_emb = c->family == GPT_GPT2 || c->tied;
  FETCH(hg, GPT_FETCH_FORWARD, &h);
  if (need_emb) FETCH(0, GPT_FETCH_FORWARD, &e);
  if (c->family == GPT_GPT2)
    TRY(norm_fwd(m, m->nf, m->meanf, m->rstdf, m->xres[m->L], h.w[G2_LNF_W], h.w[G2_LNF_B]));
  else
    TRY(norm_fwd(m, m->nf, NULL, m->rstdf, m->xres[m->L], h.w[LL_NORM], NULL));
  TRY(linear_fwd(m, m->logits, m->nf, head_weight(m, &e, &h), NULL, BT, C, V, 0));
  if (need_emb) RELEASE(0, GPT_RELEASE_FORWARD);
  RELEASE(hg, GPT_RELEASE_FORWARD);
  m->grads_pending = targets != NULL;
  if (targets) {
    k_xent<<<row_grid(BT), row_block()>>>(m->logits, m->rowloss, m->tgt, BT, V, 0);
    CK(cudaGetLastError());
    float *rl = (float *)malloc((size_t)BT * sizeof(float));
    if (!rl) return fail(m, "out of memory");
    if (cudaMemcpy(rl, m->rowloss, (size_t)BT * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) {
      free(rl);
      return fail(m, "copying the losses back failed");
    }
    double sum = 0;
    for (int i = 0; i < BT; i++) sum += rl[i];
    free(rl);
    if (loss) *loss = (float)(sum / BT);
  }
  return 0;
}

extern "C" int gpt_cuda_model_backward(gpt_cuda_model *m, gpt_provider *p) {
  if (!m->grads_pending) return fail(m, "backward without a forward with targets");
  m->grads_pending = 0;
  const gpt_config *c = &m->s->cfg;
  int BT = m->BT, C = m->C, V = m->V;
  k_xent<<<row_grid(BT), row_block()>>>(m->logits, m->rowloss, m->tgt, BT, V, 1);
  CK(cudaGetLastError());
  gpt_group_view e, h, g;
  int hg = m->L + 1, need_emb = c->family == GPT_GPT2 || c->tied;
  FETCH(hg, GPT_FETCH_BACKWARD, &h);
  if (need_emb) FETCH(0, GPT_FETCH_BACKWARD, &e);
  float *dW = c->family == GPT_GPT2 ? e.g[G2_WTE] : c->tied ? e.g[LL_EMB] : h.g[LL_HEAD];
  TRY(linear_bwd(m, m->dn, 0.0f, dW, NULL, m->logits, m->nf, head_weight(m, &e, &h), BT, C, V, 0));
  CK(cudaMemset(m->dres, 0, (size_t)BT * C * sizeof(float)));
  if (c->family == GPT_GPT2)
    TRY(norm_bwd(m, m->dres, h.g[G2_LNF_W], h.g[G2_LNF_B], m->dn, m->xres[m->L], m->meanf,
                 m->rstdf, h.w[G2_LNF_W]));
  else
    TRY(norm_bwd(m, m->dres, h.g[LL_NORM], NULL, m->dn, m->xres[m->L], NULL, m->rstdf,
                 h.w[LL_NORM]));
  if (need_emb) RELEASE(0, GPT_RELEASE_PARTIAL);
  RELEASE(hg, GPT_RELEASE_GRADS);
  for (int l = m->L - 1; l >= 0; l--) {
    FETCH(1 + l, GPT_FETCH_BACKWARD, &g);
    dacts *a = &m->a[m->rc.checkpoint ? 0 : l];
    if (m->rc.checkpoint) TRY(block_fwd(m, a, &g, m->xres[l], m->dtmp));
    TRY(block_bwd(m, a, &g, m->xres[l]));
    RELEASE(1 + l, GPT_RELEASE_GRADS);
  }
  FETCH(0, GPT_FETCH_BACKWARD, &e);
  k_embed_bwd<<<grid1((size_t)BT * C), 256>>>(e.g[0], c->family == GPT_GPT2 ? e.g[G2_WPE] : NULL,
                                              m->dres, m->tok, BT, m->T, C);
  CK(cudaGetLastError());
  RELEASE(0, GPT_RELEASE_GRADS);
  CK(cudaDeviceSynchronize());
  return 0;
}

extern "C" int gpt_cuda_model_logits(gpt_cuda_model *m, float *host) {
  CK(cudaMemcpy(host, m->logits, (size_t)m->BT * m->V * sizeof(float), cudaMemcpyDeviceToHost));
  return 0;
}

/* ---- the device-resident provider ------------------------------------------------------------ */

extern "C" int gpt_cuda_resident_init(gpt_cuda_resident *r, const gpt_schema *s) {
  memset(r, 0, sizeof *r);
  r->schema = s;
  size_t n = s->total_numel ? s->total_numel : 1;
  r->offset = (size_t *)calloc((size_t)s->n_params, sizeof *r->offset);
  if (!r->offset || cudaMalloc((void **)&r->weights, n * sizeof(float)) != cudaSuccess ||
      cudaMalloc((void **)&r->grads, n * sizeof(float)) != cudaSuccess) {
    gpt_cuda_resident_free(r);
    return -1;
  }
  size_t at = 0;
  for (int i = 0; i < s->n_params; i++) r->offset[i] = at, at += s->params[i].numel;
  return 0;
}

extern "C" void gpt_cuda_resident_free(gpt_cuda_resident *r) {
  cudaFree(r->weights), cudaFree(r->grads), free(r->offset);
  memset(r, 0, sizeof *r);
}

static int cres_fetch(void *ctx, int group, gpt_fetch_mode mode, gpt_group_view *out) {
  gpt_cuda_resident *r = (gpt_cuda_resident *)ctx;
  const gpt_schema *s = r->schema;
  if (group < 0 || group >= s->n_groups) return -1;
  memset(out, 0, sizeof *out);
  for (int i = s->group_first[group]; i < s->group_first[group + 1]; i++) {
    out->w[s->params[i].slot] = r->weights + r->offset[i];
    out->g[s->params[i].slot] = mode == GPT_FETCH_BACKWARD ? r->grads + r->offset[i] : NULL;
  }
  return 0;
}

static int cres_release(void *ctx, int group, gpt_release_mode mode) { return 0; }

static int cres_zero(void *ctx) {
  gpt_cuda_resident *r = (gpt_cuda_resident *)ctx;
  return cudaMemset(r->grads, 0, r->schema->total_numel * sizeof(float)) == cudaSuccess ? 0 : -1;
}

static const char *cres_err(void *ctx) { return ((gpt_cuda_resident *)ctx)->err; }

extern "C" gpt_provider gpt_cuda_resident_provider(gpt_cuda_resident *r) {
  gpt_provider p = {r, cres_fetch, cres_release, cres_zero, cres_err};
  return p;
}

extern "C" int gpt_cuda_resident_upload(gpt_cuda_resident *r, const float *w) {
  return cudaMemcpy(r->weights, w, r->schema->total_numel * sizeof(float),
                    cudaMemcpyHostToDevice) == cudaSuccess ? 0 : -1;
}

extern "C" int gpt_cuda_resident_download_grads(gpt_cuda_resident *r, float *g) {
  return cudaMemcpy(g, r->grads, r->schema->total_numel * sizeof(float),
                    cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
}
