/* examples/gpt/model_cuda.cu — the transformer on a CUDA GPU, mirroring
 * model_cpu.c step for step: bf16 GEMMs with fp32 accumulation on cuBLAS,
 * CUDA C kernels for embeddings, norms, activations, rotary, causal softmax
 * and cross-entropy. Parameters are read in the provider's dtype (bf16
 * directly as GEMM operands; fp32 / fp16 rounded into a bf16 scratch; small
 * tensors through ldw()); grads are added into the provider's fp32
 * accumulators. Every launch, copy and cuBLAS call goes to one stream and
 * nothing in forward/backward waits for the device. Owns only the one
 * block of activations and workspace laid out by cuda_layout.c (or uses the
 * caller's), pinned staging for tokens and the loss, two events.
 */
#include "gpt_cuda.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef __nv_bfloat16 bf16;

#define CK(call)                                                                          \
  do {                                                                                    \
    cudaError_t e_ = (call);                                                              \
    if (e_ != cudaSuccess)                                                                \
      return fail(m, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
  } while (0)
#define CB(call)                                                                          \
  do {                                                                                    \
    cublasStatus_t s_ = (call);                                                           \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                      \
      return fail(m, "%s:%d: %s: cuBLAS status %d", __FILE__, __LINE__, #call, (int)s_); \
  } while (0)
/* Every kernel goes to the model's stream and is checked at once. */
#define LAUNCH(kernel, grid, block, ...)                         \
  do {                                                           \
    kernel<<<(grid), (block), 0, m->st>>>(__VA_ARGS__);          \
    CK(cudaGetLastError());                                      \
  } while (0)
#define TRY(x)        \
  do {                \
    if (x) return -1; \
  } while (0)

/* One block's saved activations (cuda_layout.h's GCA_*). */
typedef struct {
  bf16 *n1, *qkv, *att, *ao, *n2, *h3;
  float *mean1, *rstd1, *xmid, *mean2, *rstd2, *h1;
  void *h2; /* GPT-2: bf16 gelu(fc); Llama: fp32 up */
} dacts;

struct gpt_cuda_model {
  const gpt_schema *s;
  gpt_run_config rc;
  int B, T, BT, C, F, V, H, KV, hd, L, qkvw;
  gpt_cuda_layout_t lay;
  cudaStream_t st;
  int own_stream;
  cublasHandle_t blas;
  char *base;
  int own_base;
  dacts *a; /* lay.n_acts */
  float *xres, *meanf, *rstdf, *logits, *rowloss, *rcos, *rsin;
  bf16 *nf, *dlogits;
  double *loss_acc;
  int32_t *tok, *tgt;
  float *dres, *dn, *dqkv, *dh1, *dh2, *scores, *dtmp;
  bf16 *dao, *dscores, *abf, *wbf;
  int32_t *tok_h;  /* pinned: tokens [BT], targets [BT] */
  double *loss_h;  /* pinned: the loss sum */
  cudaEvent_t ev_tok, ev_loss;
  int n_loss, grads_pending, have_logits;
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
    (void)cudaGetLastError();
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

/* A weight element of dtype dt (FERRY_DT_F32 / F16 / BF16) as fp32. */
__device__ __forceinline__ static float ldw(const void *p, size_t i, int dt) {
  if (dt == FERRY_DT_BF16) return __bfloat162float(((const bf16 *)p)[i]);
  if (dt == FERRY_DT_F16) return __half2float(((const __half *)p)[i]);
  return ((const float *)p)[i];
}

/* Elementwise kernels: 256 threads, a grid-stride loop, at most 2^20 blocks
 * (never 0). Row kernels: one warp per row, 8 rows per block, grid-stride
 * over rows (the loop condition is the same for the whole warp). */
#define ROWS_PER_BLOCK 8
#define GRID_CAP ((size_t)1 << 20)
static unsigned grid1(size_t n) {
  size_t g = (n + 255) / 256;
  return (unsigned)(g < 1 ? 1 : g > GRID_CAP ? GRID_CAP : g);
}
static unsigned row_grid(size_t rows) {
  size_t g = (rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
  return (unsigned)(g < 1 ? 1 : g > GRID_CAP ? GRID_CAP : g);
}
static dim3 row_block() { return dim3(32, ROWS_PER_BLOCK); }
#define FOR_EACH(i, n) \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)
#define FOR_EACH_ROW(r, rows)                                                       \
  for (size_t r = blockIdx.x * (size_t)ROWS_PER_BLOCK + threadIdx.y; r < (rows);    \
       r += (size_t)gridDim.x * ROWS_PER_BLOCK)

/* d = bf16(s (dtype st) + bias[i % out] (dtype bt)); bias may be NULL. */
__global__ void k_to_bf16(bf16 *d, const void *s, int st, const void *bias, int bt, size_t n,
                          size_t out) {
  FOR_EACH(i, n) {
    float v = ldw(s, i, st);
    if (bias) v += ldw(bias, i % out, bt);
    d[i] = __float2bfloat16(v);
  }
}

__global__ void k_embed(float *x, const void *wte, const void *wpe, int dt, const int32_t *tok,
                        size_t BT, int T, int C) {
  FOR_EACH(i, BT * C) {
    size_t n = i / C, c = i % C;
    float v = ldw(wte, (size_t)tok[n] * C + c, dt);
    x[i] = v + (wpe ? ldw(wpe, (n % T) * C + c, dt) : 0.0f);
  }
}

__global__ void k_embed_bwd(float *dwte, float *dwpe, const float *d, const int32_t *tok,
                            size_t BT, int T, int C) {
  FOR_EACH(i, BT * C) {
    size_t n = i / C, c = i % C;
    atomicAdd(&dwte[(size_t)tok[n] * C + c], d[i]);
    if (dwpe) atomicAdd(&dwpe[(n % T) * C + c], d[i]);
  }
}

/* LayerNorm (ln = 1: mean, bias) or RMSNorm (ln = 0) of fp32 rows into
 * bf16; the weight and bias in dtype dt; mean (ln only) and rstd saved. */
__global__ void k_norm_fwd(bf16 *y, float *mean, float *rstd, const float *x, const void *w,
                           const void *b, int dt, size_t N, int C, float eps, int ln) {
  int l = threadIdx.x;
  FOR_EACH_ROW(n, N) {
    const float *xr = x + n * C;
    float mu = 0;
    if (ln) {
      for (int i = l; i < C; i += 32) mu += xr[i];
      mu = warp_sum(mu) / (float)C;
    }
    float ss = 0;
    for (int i = l; i < C; i += 32) ss += (xr[i] - mu) * (xr[i] - mu);
    float rs = 1.0f / sqrtf(warp_sum(ss) / (float)C + eps);
    for (int i = l; i < C; i += 32) {
      float v = (xr[i] - mu) * rs * ldw(w, i, dt);
      y[n * C + i] = __float2bfloat16(ln ? v + ldw(b, i, dt) : v);
    }
    if (l == 0) {
      if (ln) mean[n] = mu;
      rstd[n] = rs;
    }
  }
}

/* dx += d(norm)/dx applied to dy; dw (and db, ln) accumulate. */
__global__ void k_norm_bwd(float *dx, float *dw, float *db, const float *dy, const float *x,
                           const float *mean, const float *rstd, const void *w, int dt, size_t N,
                           int C, int ln) {
  int l = threadIdx.x;
  FOR_EACH_ROW(n, N) {
    const float *xr = x + n * C, *dyr = dy + n * C;
    float mu = ln ? mean[n] : 0.0f, rs = rstd[n], s1 = 0, s2 = 0;
    for (int i = l; i < C; i += 32) {
      float xh = (xr[i] - mu) * rs, dxh = dyr[i] * ldw(w, i, dt);
      s1 += dxh;
      s2 += dxh * xh;
    }
    s1 = ln ? warp_sum(s1) / (float)C : 0.0f;
    s2 = warp_sum(s2) / (float)C;
    for (int i = l; i < C; i += 32) {
      float xh = (xr[i] - mu) * rs, dxh = dyr[i] * ldw(w, i, dt);
      atomicAdd(&dw[i], dyr[i] * xh);
      if (ln) atomicAdd(&db[i], dyr[i]);
      dx[n * C + i] += rs * (dxh - s1 - xh * s2);
    }
  }
}

__global__ void k_bias_add(float *y, const void *b, int dt, size_t N, int out) {
  FOR_EACH(i, N * out) y[i] += ldw(b, i % out, dt);
}

/* db[j] += sum over rows of dy[., j]: one thread per column. */
__global__ void k_bias_grad(float *db, const float *dy, size_t N, int out) {
  for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < (size_t)out;
       j += (size_t)gridDim.x * blockDim.x) {
    float s = 0;
    for (size_t n = 0; n < N; n++) s += dy[n * out + j];
    db[j] += s;
  }
}

__global__ void k_add(float *y, const float *x, size_t n) {
  FOR_EACH(i, n) y[i] += x[i];
}

#define GELU_S 0.7978845608028654f
__global__ void k_gelu_fwd(bf16 *y, const float *x, size_t n) {
  FOR_EACH(i, n) {
    float v = x[i];
    y[i] = __float2bfloat16(0.5f * v * (1.0f + tanhf(GELU_S * (v + 0.044715f * v * v * v))));
  }
}
/* d *= gelu'(x), in place. */
__global__ void k_gelu_bwd(float *d, const float *x, size_t n) {
  FOR_EACH(i, n) {
    float v = x[i], t = tanhf(GELU_S * (v + 0.044715f * v * v * v));
    d[i] *= 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * GELU_S * (1.0f + 3 * 0.044715f * v * v);
  }
}

__global__ void k_swiglu_fwd(bf16 *h3, const float *g, const float *u, size_t n) {
  FOR_EACH(i, n) {
    float s = 1.0f / (1.0f + expf(-g[i]));
    h3[i] = __float2bfloat16(g[i] * s * u[i]);
  }
}
/* d(h3) in du on entry: dg = d(gate), du = d(up) on return. */
__global__ void k_swiglu_bwd(float *dg, float *du, const float *g, const float *u, size_t n) {
  FOR_EACH(i, n) {
    float gt = g[i], s = 1.0f / (1.0f + expf(-gt)), d = du[i];
    dg[i] = d * u[i] * s * (1.0f + gt * (1.0f - s));
    du[i] = d * gt * s;
  }
}

/* Hugging Face's rotate_half rotary on rows of `heads` heads of hd (fp32);
 * sign -1 applies the inverse rotation (the backward). */
__global__ void k_rope(float *x, int ld, size_t BT, int T, int heads, int hd, const float *cs,
                       const float *sn, float sign) {
  int half = hd / 2;
  FOR_EACH(i, BT * heads * half) {
    size_t k = i % half, h = (i / half) % heads, n = i / ((size_t)half * heads);
    size_t t = n % T;
    float c = cs[t * half + k], s = sign * sn[t * half + k];
    float *p = x + n * ld + h * hd;
    float a = p[k], b = p[k + half];
    p[k] = a * c - b * s;
    p[k + half] = b * c + a * s;
  }
}

/* The rotary tables as model_cpu.c computes them (fp32 inv_freq and angle). */
__global__ void k_rope_table(float *cs, float *sn, int T, int hd, float theta) {
  int half = hd / 2;
  FOR_EACH(i, (size_t)T * half) {
    int t = (int)(i / half), k = (int)(i % half);
    float inv = (float)(1.0 / pow((double)theta, (double)(2 * k) / hd));
    float ang = (float)t * inv;
    cs[i] = (float)cos((double)ang);
    sn[i] = (float)sin((double)ang);
  }
}

/* Rows of T fp32 scores -> causal softmax probabilities in bf16 (row i
 * keeps j <= i; the rest 0). */
__global__ void k_softmax_causal(bf16 *P, const float *S, size_t rows, int T) {
  int l = threadIdx.x;
  FOR_EACH_ROW(r, rows) {
    int i = (int)(r % T);
    const float *p = S + r * T;
    float mx = -INFINITY, sum = 0;
    for (int j = l; j <= i; j += 32) mx = fmaxf(mx, p[j]);
    mx = warp_max(mx);
    for (int j = l; j <= i; j += 32) sum += expf(p[j] - mx);
    sum = warp_sum(sum);
    float inv = 1.0f / sum;
    for (int j = l; j < T; j += 32) P[r * T + j] = __float2bfloat16(j <= i ? expf(p[j] - mx) * inv : 0.0f);
  }
}

/* dS = P (dP - sum_j P dP) in bf16 (a GEMM operand only). */
__global__ void k_softmax_bwd(bf16 *dS, const float *dP, const bf16 *P, size_t rows, int T) {
  int l = threadIdx.x;
  FOR_EACH_ROW(r, rows) {
    int i = (int)(r % T);
    const float *d = dP + r * T;
    const bf16 *p = P + r * T;
    float dot = 0;
    for (int j = l; j <= i; j += 32) dot += __bfloat162float(p[j]) * d[j];
    dot = warp_sum(dot);
    for (int j = l; j < T; j += 32)
      dS[r * T + j] = __float2bfloat16(j <= i ? __bfloat162float(p[j]) * (d[j] - dot) : 0.0f);
  }
}

/* A row's max and sum of exp(x - max), on every lane of the warp. */
__device__ static void row_softmax_stats(const float *r, int V, int l, float *mx_, float *sum_) {
  float mx = -INFINITY, sum = 0;
  for (int v = l; v < V; v += 32) mx = fmaxf(mx, r[v]);
  mx = warp_max(mx);
  for (int v = l; v < V; v += 32) sum += expf(r[v] - mx);
  *mx_ = mx, *sum_ = warp_sum(sum);
}

/* Per-row cross-entropy of fp32 logits. */
__global__ void k_xent_fwd(float *rowloss, const float *logits, const int32_t *tgt, size_t N, int V) {
  int l = threadIdx.x;
  FOR_EACH_ROW(n, N) {
    const float *r = logits + n * V;
    float mx, sum;
    row_softmax_stats(r, V, l, &mx, &sum);
    if (l == 0) rowloss[n] = logf(sum) + mx - r[tgt[n]];
  }
}

/* d(loss)/d(logits) = (softmax - onehot) / N, in bf16. */
__global__ void k_xent_bwd(bf16 *d, const float *logits, const int32_t *tgt, size_t N, int V) {
  int l = threadIdx.x;
  FOR_EACH_ROW(n, N) {
    const float *r = logits + n * V;
    float mx, sum;
    row_softmax_stats(r, V, l, &mx, &sum);
    float inv = 1.0f / sum, invn = 1.0f / (float)N;
    int t = tgt[n];
    for (int v = l; v < V; v += 32)
      d[n * V + v] = __float2bfloat16((expf(r[v] - mx) * inv - (v == t ? 1.0f : 0.0f)) * invn);
  }
}

/* acc += mean of the N row losses: one block of 256 threads. */
__global__ void k_loss_add(double *acc, const float *rowloss, int N) {
  __shared__ double part[256];
  double s = 0;
  for (int i = threadIdx.x; i < N; i += 256) s += rowloss[i];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *acc += part[0] / N;
}

/* ---- GEMM helpers (row-major semantics over column-major cuBLAS) ----------------- */

/* C[M,N] (fp32 or bf16, ct) = alpha op(A)[M,K] op(B)[K,N] + beta C; A and B
 * bf16 row-major (op = transpose when ta / tb); `batch` strided problems.
 * Column-major cuBLAS computes C^T = op(B)^T op(A)^T: B first. */
static int rgemm(gpt_cuda_model *m, int ta, int tb, int M, int N, int K, float alpha,
                 const bf16 *A, int lda, long long sa, const bf16 *B, int ldb, long long sb,
                 float beta, void *C, cudaDataType_t ct, int ldc, long long sc, int batch) {
  CB(cublasGemmStridedBatchedEx(m->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, CUDA_R_16BF,
                                ldb, sb, A, CUDA_R_16BF, lda, sa, &beta, C, ct, ldc, sc, batch,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return 0;
}

/* n fp32 elements rounded into the activation scratch. */
static int act_bf16(gpt_cuda_model *m, const float *src, size_t n, const bf16 **out) {
  if (n > m->lay.abf_elems)
    return fail(m, "bf16 scratch of %zu elements too small for %zu", m->lay.abf_elems, n);
  LAUNCH(k_to_bf16, grid1(n), 256, m->abf, src, (int)FERRY_DT_F32, NULL, 0, n, (size_t)1);
  *out = m->abf;
  return 0;
}

/* A weight as a bf16 GEMM operand: itself when bf16, else rounded into the
 * weight scratch. */
static int weight_bf16(gpt_cuda_model *m, const float *w, ferry_dtype dt, size_t n,
                       const bf16 **out) {
  if (dt == FERRY_DT_BF16) {
    *out = (const bf16 *)w;
    return 0;
  }
  if (dt != FERRY_DT_F32 && dt != FERRY_DT_F16)
    return fail(m, "weights of dtype %d: the CUDA model reads fp32, fp16 or bf16", (int)dt);
  if (n > m->lay.wbf_elems)
    return fail(m, "weights of dtype %d need a weight scratch of %zu elements, the layout has "
                "%zu (create the model with gpt_cuda_mem.wdt = the provider's dtype)",
                (int)dt, n, m->lay.wbf_elems);
  LAUNCH(k_to_bf16, grid1(n), 256, m->wbf, (const void *)w, (int)dt, NULL, 0, n, (size_t)1);
  *out = m->wbf;
  return 0;
}

/* A weight of a view. */
typedef struct {
  const float *p;
  ferry_dtype dt;
} wref;
static wref W_(const gpt_group_view *v, int slot) {
  wref r = {v->w[slot], v->wdt};
  return r;
}

/* y[N,out] (yt) = x[N,in] W; conv1d: W [in,out], else [out,in]. */
static int linear_fwd(gpt_cuda_model *m, void *y, cudaDataType_t yt, const bf16 *x, wref W, int N,
                      int in, int out, int conv1d) {
  const bf16 *wb = NULL; /* set by weight_bf16 on success (gcc -O2 cannot tell) */
  TRY(weight_bf16(m, W.p, W.dt, (size_t)in * out, &wb));
  return rgemm(m, 0, !conv1d, N, out, in, 1.0f, x, in, 0, wb, conv1d ? out : in, 0, 0.0f, y, yt,
               out, 0, 1);
}

/* dx[N,in] (dxt; = or += by beta) = dy W^T (dx may be NULL); dW += x^T dy
 * in W's layout. dy and x are bf16 operands. */
static int linear_bwd(gpt_cuda_model *m, void *dx, cudaDataType_t dxt, float beta, float *dW,
                      const bf16 *dy, const bf16 *x, wref W, int N, int in, int out, int conv1d) {
  if (dx) {
    const bf16 *wb = NULL;
    TRY(weight_bf16(m, W.p, W.dt, (size_t)in * out, &wb));
    TRY(rgemm(m, 0, conv1d, N, in, out, 1.0f, dy, out, 0, wb, conv1d ? out : in, 0, beta, dx, dxt,
              in, 0, 1));
  }
  if (conv1d) return rgemm(m, 1, 0, in, out, N, 1.0f, x, in, 0, dy, out, 0, 1.0f, dW, CUDA_R_32F, out, 0, 1);
  return rgemm(m, 1, 0, out, in, N, 1.0f, dy, out, 0, x, in, 0, 1.0f, dW, CUDA_R_32F, in, 0, 1);
}

/* Offsets (elements) and row strides of q, k, v in a qkv buffer: GPT-2 rows
 * of [q k v]; Llama planar q | k | v. */
typedef struct {
  size_t oq, ok, ov;
  int ldq, ldk, ldv;
} qkv_off;

static qkv_off qkv_of(const gpt_cuda_model *m) {
  qkv_off r;
  if (m->s->cfg.family == GPT_GPT2) {
    r.oq = 0, r.ok = (size_t)m->C, r.ov = 2 * (size_t)m->C;
    r.ldq = r.ldk = r.ldv = 3 * m->C;
  } else {
    size_t kv = (size_t)m->KV * m->hd;
    r.oq = 0, r.ok = (size_t)m->BT * m->C, r.ov = r.ok + (size_t)m->BT * kv;
    r.ldq = m->C, r.ldk = r.ldv = (int)kv;
  }
  return r;
}

/* ---- attention: one batch row at a time; query head h = kv * grp + j -------------------
 * Each rgemm is batched over the KV heads sharing one offset j within their
 * query group: query heads are grp * hd columns apart, kv heads hd, score
 * blocks grp * T * T. */

static int attention_fwd(gpt_cuda_model *m, dacts *a) {
  int T = m->T, hd = m->hd, H = m->H, KV = m->KV, grp = H / KV, C = m->C;
  float scale = 1.0f / sqrtf((float)hd);
  qkv_off x = qkv_of(m);
  long long sTT = (long long)grp * T * T, sQ = (long long)grp * hd;
  for (int b = 0; b < m->B; b++) {
    const bf16 *q = a->qkv + x.oq + (size_t)b * T * x.ldq, *k = a->qkv + x.ok + (size_t)b * T * x.ldk;
    const bf16 *v = a->qkv + x.ov + (size_t)b * T * x.ldv;
    bf16 *P = a->att + (size_t)b * H * T * T;
    for (int j = 0; j < grp; j++)
      TRY(rgemm(m, 0, 1, T, T, hd, scale, q + (size_t)j * hd, x.ldq, sQ, k, x.ldk, hd, 0.0f,
                m->scores + (size_t)j * T * T, CUDA_R_32F, T, sTT, KV));
    LAUNCH(k_softmax_causal, row_grid((size_t)H * T), row_block(), P, m->scores, (size_t)H * T, T);
    for (int j = 0; j < grp; j++)
      TRY(rgemm(m, 0, 0, T, hd, T, 1.0f, P + (size_t)j * T * T, T, sTT, v, x.ldv, hd, 0.0f,
                a->ao + (size_t)b * T * C + (size_t)j * hd, CUDA_R_16BF, C, sQ, KV));
  }
  return 0;
}

/* m->dqkv (zeroed by the caller) from m->dao; a holds P and q, k, v. */
static int attention_bwd(gpt_cuda_model *m, dacts *a) {
  int T = m->T, hd = m->hd, H = m->H, KV = m->KV, grp = H / KV, C = m->C;
  float scale = 1.0f / sqrtf((float)hd);
  qkv_off x = qkv_of(m);
  long long sTT = (long long)grp * T * T, sQ = (long long)grp * hd;
  for (int b = 0; b < m->B; b++) {
    size_t rq = x.oq + (size_t)b * T * x.ldq, rk = x.ok + (size_t)b * T * x.ldk;
    size_t rv = x.ov + (size_t)b * T * x.ldv;
    const bf16 *P = a->att + (size_t)b * H * T * T, *dO = m->dao + (size_t)b * T * C;
    for (int j = 0; j < grp; j++) { /* dP = dO V^T; dV += P^T dO */
      TRY(rgemm(m, 0, 1, T, T, hd, 1.0f, dO + (size_t)j * hd, C, sQ, a->qkv + rv, x.ldv, hd, 0.0f,
                m->scores + (size_t)j * T * T, CUDA_R_32F, T, sTT, KV));
      TRY(rgemm(m, 1, 0, T, hd, T, 1.0f, P + (size_t)j * T * T, T, sTT, dO + (size_t)j * hd, C, sQ,
                1.0f, m->dqkv + rv, CUDA_R_32F, x.ldv, hd, KV));
    }
    LAUNCH(k_softmax_bwd, row_grid((size_t)H * T), row_block(), m->dscores, m->scores, P,
           (size_t)H * T, T);
    for (int j = 0; j < grp; j++) { /* dQ = scale dS K; dK += scale dS^T Q */
      const bf16 *dS = m->dscores + (size_t)j * T * T;
      TRY(rgemm(m, 0, 0, T, hd, T, scale, dS, T, sTT, a->qkv + rk, x.ldk, hd, 0.0f,
                m->dqkv + rq + (size_t)j * hd, CUDA_R_32F, x.ldq, sQ, KV));
      TRY(rgemm(m, 1, 0, T, hd, T, scale, dS, T, sTT, a->qkv + rq + (size_t)j * hd, x.ldq, sQ, 1.0f,
                m->dqkv + rk, CUDA_R_32F, x.ldk, hd, KV));
    }
  }
  return 0;
}

/* ---- norms and small helpers --------------------------------------------------------- */

static int norm_fwd(gpt_cuda_model *m, bf16 *y, float *mean, float *rstd, const float *x,
                    const gpt_group_view *v, int ws, int bs) {
  int ln = bs >= 0;
  LAUNCH(k_norm_fwd, row_grid((size_t)m->BT), row_block(), y, mean, rstd, x,
         (const void *)v->w[ws], ln ? (const void *)v->w[bs] : (const void *)NULL, (int)v->wdt,
         (size_t)m->BT, m->C, m->s->cfg.norm_eps, ln);
  return 0;
}

static int norm_bwd(gpt_cuda_model *m, const gpt_group_view *v, int ws, int bs, const float *x,
                    const float *mean, const float *rstd) {
  int ln = bs >= 0;
  LAUNCH(k_norm_bwd, row_grid((size_t)m->BT), row_block(), m->dres, v->g[ws],
         ln ? v->g[bs] : (float *)NULL, m->dn, x, mean, rstd, (const void *)v->w[ws], (int)v->wdt,
         (size_t)m->BT, m->C, ln);
  return 0;
}

static int bias_add(gpt_cuda_model *m, float *y, const gpt_group_view *v, int slot, int out) {
  LAUNCH(k_bias_add, grid1((size_t)m->BT * out), 256, y, (const void *)v->w[slot], (int)v->wdt,
         (size_t)m->BT, out);
  return 0;
}

static int bias_grad(gpt_cuda_model *m, float *db, const float *dy, int out) {
  LAUNCH(k_bias_grad, grid1((size_t)out), 256, db, dy, (size_t)m->BT, out);
  return 0;
}

static int add(gpt_cuda_model *m, float *y, const float *x) {
  LAUNCH(k_add, grid1((size_t)m->BT * m->C), 256, y, x, (size_t)m->BT * m->C);
  return 0;
}

/* ---- blocks ------------------------------------------------------------------------------- */

static int block_fwd_gpt2(gpt_cuda_model *m, dacts *a, const gpt_group_view *g, const float *x,
                          float *y) {
  int BT = m->BT, C = m->C, F = m->F;
  size_t nq = (size_t)BT * 3 * C, nf = (size_t)BT * F;
  TRY(norm_fwd(m, a->n1, a->mean1, a->rstd1, x, g, G2_LN1_W, G2_LN1_B));
  TRY(linear_fwd(m, m->dqkv, CUDA_R_32F, a->n1, W_(g, G2_QKV_W), BT, C, 3 * C, 1));
  LAUNCH(k_to_bf16, grid1(nq), 256, a->qkv, (const void *)m->dqkv, (int)FERRY_DT_F32,
         (const void *)g->w[G2_QKV_B], (int)g->wdt, nq, (size_t)3 * C);
  TRY(attention_fwd(m, a));
  TRY(linear_fwd(m, a->xmid, CUDA_R_32F, a->ao, W_(g, G2_ATTO_W), BT, C, C, 1));
  TRY(bias_add(m, a->xmid, g, G2_ATTO_B, C));
  TRY(add(m, a->xmid, x));
  TRY(norm_fwd(m, a->n2, a->mean2, a->rstd2, a->xmid, g, G2_LN2_W, G2_LN2_B));
  TRY(linear_fwd(m, a->h1, CUDA_R_32F, a->n2, W_(g, G2_FC_W), BT, C, F, 1));
  TRY(bias_add(m, a->h1, g, G2_FC_B, F));
  LAUNCH(k_gelu_fwd, grid1(nf), 256, (bf16 *)a->h2, a->h1, nf);
  TRY(linear_fwd(m, y, CUDA_R_32F, (const bf16 *)a->h2, W_(g, G2_FCO_W), BT, F, C, 1));
  TRY(bias_add(m, y, g, G2_FCO_B, C));
  return add(m, y, a->xmid);
}

static int block_fwd_llama(gpt_cuda_model *m, dacts *a, const gpt_group_view *g, const float *x,
                           float *y) {
  int BT = m->BT, C = m->C, F = m->F, kv = m->KV * m->hd;
  size_t nq = (size_t)BT * m->qkvw, nf = (size_t)BT * F;
  qkv_off o = qkv_of(m);
  float *q = m->dqkv + o.oq, *k = m->dqkv + o.ok, *v = m->dqkv + o.ov; /* fp32, then rounded */
  TRY(norm_fwd(m, a->n1, NULL, a->rstd1, x, g, LL_IN_NORM, -1));
  TRY(linear_fwd(m, q, CUDA_R_32F, a->n1, W_(g, LL_Q), BT, C, C, 0));
  TRY(linear_fwd(m, k, CUDA_R_32F, a->n1, W_(g, LL_K), BT, C, kv, 0));
  TRY(linear_fwd(m, v, CUDA_R_32F, a->n1, W_(g, LL_V), BT, C, kv, 0));
  LAUNCH(k_rope, grid1((size_t)BT * m->H * (m->hd / 2)), 256, q, o.ldq, (size_t)BT, m->T, m->H,
         m->hd, m->rcos, m->rsin, 1.0f);
  LAUNCH(k_rope, grid1((size_t)BT * m->KV * (m->hd / 2)), 256, k, o.ldk, (size_t)BT, m->T, m->KV,
         m->hd, m->rcos, m->rsin, 1.0f);
  LAUNCH(k_to_bf16, grid1(nq), 256, a->qkv, (const void *)m->dqkv, (int)FERRY_DT_F32,
         (const void *)NULL, 0, nq, (size_t)1);
  TRY(attention_fwd(m, a));
  TRY(linear_fwd(m, a->xmid, CUDA_R_32F, a->ao, W_(g, LL_O), BT, C, C, 0));
  TRY(add(m, a->xmid, x));
  TRY(norm_fwd(m, a->n2, NULL, a->rstd2, a->xmid, g, LL_POST_NORM, -1));
  TRY(linear_fwd(m, a->h1, CUDA_R_32F, a->n2, W_(g, LL_GATE), BT, C, F, 0));
  TRY(linear_fwd(m, a->h2, CUDA_R_32F, a->n2, W_(g, LL_UP), BT, C, F, 0));
  LAUNCH(k_swiglu_fwd, grid1(nf), 256, a->h3, a->h1, (const float *)a->h2, nf);
  TRY(linear_fwd(m, y, CUDA_R_32F, a->h3, W_(g, LL_DOWN), BT, F, C, 0));
  return add(m, y, a->xmid);
}

static int block_fwd(gpt_cuda_model *m, dacts *a, const gpt_group_view *g, const float *x, float *y) {
  return m->s->cfg.family == GPT_GPT2 ? block_fwd_gpt2(m, a, g, x, y) : block_fwd_llama(m, a, g, x, y);
}

/* m->dres holds d(out); on return d(in). Grads added into g->g. */
static int block_bwd_gpt2(gpt_cuda_model *m, dacts *a, const gpt_group_view *g, const float *x) {
  int BT = m->BT, C = m->C, F = m->F;
  size_t n = (size_t)BT * C, nf = (size_t)BT * F, nq = (size_t)BT * 3 * C;
  const bf16 *dy;
  TRY(act_bf16(m, m->dres, n, &dy));
  TRY(linear_bwd(m, m->dh1, CUDA_R_32F, 0.0f, g->g[G2_FCO_W], dy, (const bf16 *)a->h2,
                 W_(g, G2_FCO_W), BT, F, C, 1));
  TRY(bias_grad(m, g->g[G2_FCO_B], m->dres, C));
  LAUNCH(k_gelu_bwd, grid1(nf), 256, m->dh1, a->h1, nf);
  TRY(act_bf16(m, m->dh1, nf, &dy));
  TRY(linear_bwd(m, m->dn, CUDA_R_32F, 0.0f, g->g[G2_FC_W], dy, a->n2, W_(g, G2_FC_W), BT, C, F, 1));
  TRY(bias_grad(m, g->g[G2_FC_B], m->dh1, F));
  TRY(norm_bwd(m, g, G2_LN2_W, G2_LN2_B, a->xmid, a->mean2, a->rstd2));
  TRY(act_bf16(m, m->dres, n, &dy));
  TRY(linear_bwd(m, m->dao, CUDA_R_16BF, 0.0f, g->g[G2_ATTO_W], dy, a->ao, W_(g, G2_ATTO_W), BT,
                 C, C, 1));
  TRY(bias_grad(m, g->g[G2_ATTO_B], m->dres, C));
  CK(cudaMemsetAsync(m->dqkv, 0, nq * sizeof(float), m->st));
  TRY(attention_bwd(m, a));
  TRY(act_bf16(m, m->dqkv, nq, &dy));
  TRY(linear_bwd(m, m->dn, CUDA_R_32F, 0.0f, g->g[G2_QKV_W], dy, a->n1, W_(g, G2_QKV_W), BT, C,
                 3 * C, 1));
  TRY(bias_grad(m, g->g[G2_QKV_B], m->dqkv, 3 * C));
  return norm_bwd(m, g, G2_LN1_W, G2_LN1_B, x, a->mean1, a->rstd1);
}

static int block_bwd_llama(gpt_cuda_model *m, dacts *a, const gpt_group_view *g, const float *x) {
  int BT = m->BT, C = m->C, F = m->F, kv = m->KV * m->hd;
  size_t n = (size_t)BT * C, nf = (size_t)BT * F, nq = (size_t)BT * m->qkvw;
  qkv_off o = qkv_of(m);
  const bf16 *dy;
  TRY(act_bf16(m, m->dres, n, &dy));
  TRY(linear_bwd(m, m->dh2, CUDA_R_32F, 0.0f, g->g[LL_DOWN], dy, a->h3, W_(g, LL_DOWN), BT, F, C, 0));
  LAUNCH(k_swiglu_bwd, grid1(nf), 256, m->dh1, m->dh2, a->h1, (const float *)a->h2, nf);
  TRY(act_bf16(m, m->dh1, nf, &dy));
  TRY(linear_bwd(m, m->dn, CUDA_R_32F, 0.0f, g->g[LL_GATE], dy, a->n2, W_(g, LL_GATE), BT, C, F, 0));
  TRY(act_bf16(m, m->dh2, nf, &dy));
  TRY(linear_bwd(m, m->dn, CUDA_R_32F, 1.0f, g->g[LL_UP], dy, a->n2, W_(g, LL_UP), BT, C, F, 0));
  TRY(norm_bwd(m, g, LL_POST_NORM, -1, a->xmid, NULL, a->rstd2));
  TRY(act_bf16(m, m->dres, n, &dy));
  TRY(linear_bwd(m, m->dao, CUDA_R_16BF, 0.0f, g->g[LL_O], dy, a->ao, W_(g, LL_O), BT, C, C, 0));
  CK(cudaMemsetAsync(m->dqkv, 0, nq * sizeof(float), m->st));
  TRY(attention_bwd(m, a));
  LAUNCH(k_rope, grid1((size_t)BT * m->H * (m->hd / 2)), 256, m->dqkv + o.oq, o.ldq, (size_t)BT,
         m->T, m->H, m->hd, m->rcos, m->rsin, -1.0f);
  LAUNCH(k_rope, grid1((size_t)BT * m->KV * (m->hd / 2)), 256, m->dqkv + o.ok, o.ldk, (size_t)BT,
         m->T, m->KV, m->hd, m->rcos, m->rsin, -1.0f);
  TRY(act_bf16(m, m->dqkv, nq, &dy));
  TRY(linear_bwd(m, m->dn, CUDA_R_32F, 0.0f, g->g[LL_Q], dy + o.oq, a->n1, W_(g, LL_Q), BT, C, C, 0));
  TRY(linear_bwd(m, m->dn, CUDA_R_32F, 1.0f, g->g[LL_K], dy + o.ok, a->n1, W_(g, LL_K), BT, C, kv, 0));
  TRY(linear_bwd(m, m->dn, CUDA_R_32F, 1.0f, g->g[LL_V], dy + o.ov, a->n1, W_(g, LL_V), BT, C, kv, 0));
  return norm_bwd(m, g, LL_IN_NORM, -1, x, NULL, a->rstd1);
}

static int block_bwd(gpt_cuda_model *m, dacts *a, const gpt_group_view *g, const float *x) {
  return m->s->cfg.family == GPT_GPT2 ? block_bwd_gpt2(m, a, g, x) : block_bwd_llama(m, a, g, x);
}

/* ---- passes -------------------------------------------------------------------------------- */

#define FETCH(grp, mode, view)                                                                  \
  do {                                                                                          \
    if (p->fetch(p->ctx, (grp), (mode), (view)))                                                \
      return fail(m, "fetch of group %d failed: %s", (grp),                                     \
                  p->last_error ? p->last_error(p->ctx) : "");                                  \
  } while (0)
#define RELEASE(grp, mode)                                                                      \
  do {                                                                                          \
    if (p->release(p->ctx, (grp), (mode)))                                                      \
      return fail(m, "release of group %d failed: %s", (grp),                                   \
                  p->last_error ? p->last_error(p->ctx) : "");                                  \
  } while (0)

static float *xres(const gpt_cuda_model *m, int l) { return m->xres + (size_t)l * m->BT * m->C; }

/* The LM head's weight [V, C] and the view it comes from. */
static wref head_weight(const gpt_cuda_model *m, const gpt_group_view *e, const gpt_group_view *h) {
  if (m->s->cfg.family == GPT_GPT2) return W_(e, G2_WTE);
  return m->s->cfg.tied ? W_(e, LL_EMB) : W_(h, LL_HEAD);
}

/* Tokens and targets into pinned staging (once the last copy out of it is
 * done), then H2D on the stream. */
static int stage_tokens(gpt_cuda_model *m, const int32_t *tokens, const int32_t *targets) {
  size_t n = (size_t)m->BT;
  for (size_t i = 0; i < n; i++)
    if (tokens[i] < 0 || tokens[i] >= m->V || (targets && (targets[i] < 0 || targets[i] >= m->V)))
      return fail(m, "token or target out of range (vocab %d) at %zu", m->V, i);
  CK(cudaEventSynchronize(m->ev_tok));
  memcpy(m->tok_h, tokens, n * sizeof(int32_t));
  CK(cudaMemcpyAsync(m->tok, m->tok_h, n * sizeof(int32_t), cudaMemcpyHostToDevice, m->st));
  if (targets) {
    memcpy(m->tok_h + n, targets, n * sizeof(int32_t));
    CK(cudaMemcpyAsync(m->tgt, m->tok_h + n, n * sizeof(int32_t), cudaMemcpyHostToDevice, m->st));
  }
  CK(cudaEventRecord(m->ev_tok, m->st));
  return 0;
}

/* The final norm and the logits. */
static int head_fwd(gpt_cuda_model *m, gpt_provider *p) {
  const gpt_config *c = &m->s->cfg;
  gpt_group_view e, h;
  memset(&e, 0, sizeof e);
  int hg = m->L + 1, need_emb = c->family == GPT_GPT2 || c->tied;
  FETCH(hg, GPT_FETCH_FORWARD, &h);
  if (need_emb) FETCH(0, GPT_FETCH_FORWARD, &e);
  if (c->family == GPT_GPT2)
    TRY(norm_fwd(m, m->nf, m->meanf, m->rstdf, xres(m, m->L), &h, G2_LNF_W, G2_LNF_B));
  else
    TRY(norm_fwd(m, m->nf, NULL, m->rstdf, xres(m, m->L), &h, LL_NORM, -1));
  TRY(linear_fwd(m, m->logits, CUDA_R_32F, m->nf, head_weight(m, &e, &h), m->BT, m->C, m->V, 0));
  if (need_emb) RELEASE(0, GPT_RELEASE_FORWARD);
  RELEASE(hg, GPT_RELEASE_FORWARD);
  return 0;
}

/* The row losses, their mean added to the device sum, copied back async. */
static int loss_fwd(gpt_cuda_model *m) {
  LAUNCH(k_xent_fwd, row_grid((size_t)m->BT), row_block(), m->rowloss, m->logits, m->tgt,
         (size_t)m->BT, m->V);
  LAUNCH(k_loss_add, 1, 256, m->loss_acc, m->rowloss, m->BT);
  CK(cudaMemcpyAsync(m->loss_h, m->loss_acc, sizeof(double), cudaMemcpyDeviceToHost, m->st));
  CK(cudaEventRecord(m->ev_loss, m->st));
  m->n_loss++;
  return 0;
}

extern "C" int gpt_cuda_model_forward(gpt_cuda_model *m, gpt_provider *p, const int32_t *tokens,
                                      const int32_t *targets) {
  const gpt_config *c = &m->s->cfg;
  TRY(stage_tokens(m, tokens, targets));
  gpt_group_view e, g;
  FETCH(0, GPT_FETCH_FORWARD, &e);
  LAUNCH(k_embed, grid1((size_t)m->BT * m->C), 256, xres(m, 0), (const void *)e.w[0],
         c->family == GPT_GPT2 ? (const void *)e.w[G2_WPE] : (const void *)NULL, (int)e.wdt, m->tok,
         (size_t)m->BT, m->T, m->C);
  RELEASE(0, GPT_RELEASE_FORWARD);
  for (int l = 0; l < m->L; l++) {
    FETCH(1 + l, GPT_FETCH_FORWARD, &g);
    TRY(block_fwd(m, &m->a[m->rc.checkpoint ? 0 : l], &g, xres(m, l), xres(m, l + 1)));
    RELEASE(1 + l, GPT_RELEASE_FORWARD);
  }
  TRY(head_fwd(m, p));
  m->have_logits = 1;
  m->grads_pending = targets != NULL;
  if (targets) TRY(loss_fwd(m));
  return 0;
}

/* dlogits, the head's grads, d(residual) of the last block. */
static int head_bwd(gpt_cuda_model *m, gpt_provider *p) {
  const gpt_config *c = &m->s->cfg;
  int BT = m->BT, C = m->C, V = m->V;
  LAUNCH(k_xent_bwd, row_grid((size_t)BT), row_block(), m->dlogits, m->logits, m->tgt,
         (size_t)BT, V);
  gpt_group_view e, h;
  memset(&e, 0, sizeof e);
  int hg = m->L + 1, need_emb = c->family == GPT_GPT2 || c->tied;
  FETCH(hg, GPT_FETCH_BACKWARD, &h);
  if (need_emb) FETCH(0, GPT_FETCH_BACKWARD, &e);
  float *dW = c->family == GPT_GPT2 ? e.g[G2_WTE] : c->tied ? e.g[LL_EMB] : h.g[LL_HEAD];
  TRY(linear_bwd(m, m->dn, CUDA_R_32F, 0.0f, dW, m->dlogits, m->nf, head_weight(m, &e, &h), BT, C,
                 V, 0));
  CK(cudaMemsetAsync(m->dres, 0, (size_t)BT * C * sizeof(float), m->st));
  if (c->family == GPT_GPT2)
    TRY(norm_bwd(m, &h, G2_LNF_W, G2_LNF_B, xres(m, m->L), m->meanf, m->rstdf));
  else
    TRY(norm_bwd(m, &h, LL_NORM, -1, xres(m, m->L), NULL, m->rstdf));
  if (need_emb) RELEASE(0, GPT_RELEASE_PARTIAL);
  RELEASE(hg, GPT_RELEASE_GRADS);
  return 0;
}

extern "C" int gpt_cuda_model_backward(gpt_cuda_model *m, gpt_provider *p) {
  if (!m->grads_pending) return fail(m, "backward without a forward with targets");
  m->grads_pending = 0;
  const gpt_config *c = &m->s->cfg;
  TRY(head_bwd(m, p));
  gpt_group_view e, g;
  for (int l = m->L - 1; l >= 0; l--) {
    FETCH(1 + l, GPT_FETCH_BACKWARD, &g);
    dacts *a = &m->a[m->rc.checkpoint ? 0 : l];
    if (m->rc.checkpoint) TRY(block_fwd(m, a, &g, xres(m, l), m->dtmp)); /* recompute */
    TRY(block_bwd(m, a, &g, xres(m, l)));
    RELEASE(1 + l, GPT_RELEASE_GRADS);
  }
  FETCH(0, GPT_FETCH_BACKWARD, &e);
  LAUNCH(k_embed_bwd, grid1((size_t)m->BT * m->C), 256, e.g[0],
         c->family == GPT_GPT2 ? e.g[G2_WPE] : (float *)NULL, m->dres, m->tok, (size_t)m->BT, m->T,
         m->C);
  RELEASE(0, GPT_RELEASE_GRADS);
  return 0;
}

extern "C" int gpt_cuda_model_loss(gpt_cuda_model *m, float *loss) {
  if (!m->n_loss) return fail(m, "no forward with targets since the last loss read");
  CK(cudaEventSynchronize(m->ev_loss));
  *loss = (float)(*m->loss_h / m->n_loss);
  m->n_loss = 0;
  CK(cudaMemsetAsync(m->loss_acc, 0, sizeof(double), m->st));
  return 0;
}

extern "C" int gpt_cuda_model_logits(gpt_cuda_model *m, float *host) {
  if (!m->have_logits) return fail(m, "no forward yet");
  CK(cudaMemcpyAsync(host, m->logits, (size_t)m->BT * m->V * sizeof(float), cudaMemcpyDeviceToHost,
                     m->st));
  CK(cudaStreamSynchronize(m->st));
  return 0;
}

/* ---- create / free ------------------------------------------------------------------ */

/* Pointers into the block from the layout. */
static void resolve(gpt_cuda_model *m) {
  const gpt_cuda_span *b = m->lay.buf;
  char *p = m->base;
#define AT(T_, i) ((T_ *)(b[i].bytes ? p + b[i].off : NULL))
  m->xres = AT(float, GCL_XRES), m->nf = AT(bf16, GCL_NF), m->meanf = AT(float, GCL_MEANF);
  m->rstdf = AT(float, GCL_RSTDF), m->logits = AT(float, GCL_LOGITS);
  m->dlogits = AT(bf16, GCL_DLOGITS), m->rowloss = AT(float, GCL_ROWLOSS);
  m->loss_acc = AT(double, GCL_LOSS), m->tok = AT(int32_t, GCL_TOK), m->tgt = AT(int32_t, GCL_TGT);
  m->rcos = AT(float, GCL_ROPE_COS), m->rsin = AT(float, GCL_ROPE_SIN);
  m->dres = AT(float, GCL_DRES), m->dn = AT(float, GCL_DN), m->dao = AT(bf16, GCL_DAO);
  m->dqkv = AT(float, GCL_DQKV), m->dh1 = AT(float, GCL_DH1), m->dh2 = AT(float, GCL_DH2);
  m->scores = AT(float, GCL_SCORES), m->dscores = AT(bf16, GCL_DSCORES);
  m->abf = AT(bf16, GCL_ABF), m->wbf = AT(bf16, GCL_WBF), m->dtmp = AT(float, GCL_DTMP);
#undef AT
  const gpt_cuda_span *s = m->lay.act;
  for (int l = 0; l < m->lay.n_acts; l++) {
    char *q = p + b[GCL_BLOCKS].off + (size_t)l * m->lay.block_bytes;
#define AT(T_, i) ((T_ *)(s[i].bytes ? q + s[i].off : NULL))
    dacts *a = &m->a[l];
    a->n1 = AT(bf16, GCA_N1), a->mean1 = AT(float, GCA_MEAN1), a->rstd1 = AT(float, GCA_RSTD1);
    a->qkv = AT(bf16, GCA_QKV), a->att = AT(bf16, GCA_ATT), a->ao = AT(bf16, GCA_AO);
    a->xmid = AT(float, GCA_XMID), a->n2 = AT(bf16, GCA_N2), a->mean2 = AT(float, GCA_MEAN2);
    a->rstd2 = AT(float, GCA_RSTD2), a->h1 = AT(float, GCA_H1), a->h2 = AT(void, GCA_H2);
    a->h3 = AT(bf16, GCA_H3);
#undef AT
  }
}

/* The stream, the block, cuBLAS on them, pinned staging, events. */
static int create_runtime(gpt_cuda_model *m, const gpt_cuda_mem *mem) {
  if (mem && mem->stream) {
    m->st = (cudaStream_t)mem->stream;
  } else {
    CK(cudaStreamCreateWithFlags(&m->st, cudaStreamNonBlocking));
    m->own_stream = 1;
  }
  if (mem && mem->base) {
    if (mem->bytes < m->lay.bytes)
      return fail(m, "the given device block has %zu bytes, the layout needs %zu", mem->bytes,
                  m->lay.bytes);
    if ((uintptr_t)mem->base % 256)
      return fail(m, "the given device block is not 256-byte aligned");
    m->base = (char *)mem->base;
  } else {
    CK(cudaMalloc((void **)&m->base, m->lay.bytes));
    m->own_base = 1;
  }
  resolve(m);
  CB(cublasCreate(&m->blas));
  CB(cublasSetStream(m->blas, m->st));
  CB(cublasSetWorkspace(m->blas, m->base + m->lay.buf[GCL_CUBLAS].off,
                        m->lay.buf[GCL_CUBLAS].bytes));
  CK(cudaHostAlloc((void **)&m->tok_h, 2 * (size_t)m->BT * sizeof(int32_t), cudaHostAllocDefault));
  CK(cudaHostAlloc((void **)&m->loss_h, sizeof(double), cudaHostAllocDefault));
  CK(cudaEventCreateWithFlags(&m->ev_tok, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&m->ev_loss, cudaEventDisableTiming));
  /* in stream order: a defined block (and a zero loss sum), the rotary tables */
  CK(cudaMemsetAsync(m->base, 0, m->lay.bytes, m->st));
  if (m->s->cfg.family == GPT_LLAMA)
    LAUNCH(k_rope_table, grid1((size_t)m->T * (m->hd / 2)), 256, m->rcos, m->rsin, m->T, m->hd,
           m->s->cfg.rope_theta);
  return 0;
}

extern "C" int gpt_cuda_model_create(const gpt_schema *s, const gpt_run_config *rc,
                                     const gpt_cuda_mem *mem, gpt_cuda_model **out, char *err,
                                     size_t errlen) {
  *out = NULL;
  gpt_cuda_model *m = (gpt_cuda_model *)calloc(1, sizeof *m);
  if (!m) return snprintf(err, errlen, "out of memory"), -1;
  const gpt_config *c = &s->cfg;
  m->s = s;
  m->rc = *rc;
  if (!gpt_cuda_layout(s, rc, mem ? mem->wdt : FERRY_DT_F32, &m->lay)) {
    snprintf(err, errlen, "batch %d, seq %d: out of range (1 <= seq <= %d)", rc->batch, rc->seq,
             c->max_seq);
    free(m);
    return -1;
  }
  m->B = rc->batch, m->T = rc->seq, m->BT = rc->batch * rc->seq;
  m->C = c->d_model, m->F = c->d_ff, m->V = c->vocab, m->H = c->n_head, m->KV = c->n_kv_head;
  m->hd = c->d_model / c->n_head, m->L = c->n_layer, m->qkvw = m->lay.qkvw;
  m->a = (dacts *)calloc((size_t)m->lay.n_acts, sizeof *m->a);
  if (!m->a) fail(m, "out of memory");
  if (!m->a || create_runtime(m, mem)) {
    snprintf(err, errlen, "CUDA model (%zu bytes of device memory): %s", m->lay.bytes, m->err);
    gpt_cuda_model_free(m);
    return -1;
  }
  *out = m;
  return 0;
}

extern "C" void gpt_cuda_model_free(gpt_cuda_model *m) {
  if (!m) return;
  if (m->st) cudaStreamSynchronize(m->st); /* nothing of ours in flight below */
  if (m->blas) cublasDestroy(m->blas);
  if (m->ev_tok) cudaEventDestroy(m->ev_tok);
  if (m->ev_loss) cudaEventDestroy(m->ev_loss);
  if (m->tok_h) cudaFreeHost(m->tok_h);
  if (m->loss_h) cudaFreeHost(m->loss_h);
  if (m->own_base) cudaFree(m->base);
  if (m->own_stream) cudaStreamDestroy(m->st);
  free(m->a);
  free(m);
}

extern "C" const char *gpt_cuda_model_last_error(const gpt_cuda_model *m) { return m ? m->err : ""; }
extern "C" void *gpt_cuda_model_stream(const gpt_cuda_model *m) { return (void *)m->st; }
extern "C" size_t gpt_cuda_model_bytes(const gpt_cuda_model *m) { return m->lay.bytes; }

/* ---- the device-resident provider ------------------------------------------------------------ */

extern "C" int gpt_cuda_resident_init(gpt_cuda_resident *r, const gpt_schema *s, void *stream) {
  memset(r, 0, sizeof *r);
  r->schema = s;
  r->stream = stream;
  size_t n = s->total_numel ? s->total_numel : 1;
  r->offset = (size_t *)calloc((size_t)s->n_params, sizeof *r->offset);
  if (!r->offset || cudaMalloc((void **)&r->weights, n * sizeof(float)) != cudaSuccess ||
      cudaMalloc((void **)&r->grads, n * sizeof(float)) != cudaSuccess) {
    (void)cudaGetLastError();
    gpt_cuda_resident_free(r);
    return -1;
  }
  size_t at = 0;
  for (int i = 0; i < s->n_params; i++) r->offset[i] = at, at += s->params[i].numel;
  return 0;
}

/* cudaFree waits for the device's work; the stream may already be gone. */
extern "C" void gpt_cuda_resident_free(gpt_cuda_resident *r) {
  cudaFree(r->weights), cudaFree(r->grads), free(r->offset);
  memset(r, 0, sizeof *r);
}

static int cres_fetch(void *ctx, int group, gpt_fetch_mode mode, gpt_group_view *out) {
  gpt_cuda_resident *r = (gpt_cuda_resident *)ctx;
  const gpt_schema *s = r->schema;
  if (group < 0 || group >= s->n_groups) return -1;
  if (mode == GPT_FETCH_WRITE) {
    snprintf(r->err, sizeof r->err, "the device-resident weights are written by upload");
    return -1;
  }
  memset(out, 0, sizeof *out);
  out->wdt = FERRY_DT_F32;
  for (int i = s->group_first[group]; i < s->group_first[group + 1]; i++) {
    out->w[s->params[i].slot] = r->weights + r->offset[i];
    out->g[s->params[i].slot] = mode == GPT_FETCH_BACKWARD ? r->grads + r->offset[i] : NULL;
  }
  return 0;
}

static int cres_release(void *ctx, int group, gpt_release_mode mode) {
  (void)ctx, (void)group, (void)mode;
  return 0;
}

static int cres_zero(void *ctx) {
  gpt_cuda_resident *r = (gpt_cuda_resident *)ctx;
  cudaError_t e = cudaMemsetAsync(r->grads, 0, r->schema->total_numel * sizeof(float),
                                  (cudaStream_t)r->stream);
  if (e == cudaSuccess) return 0;
  snprintf(r->err, sizeof r->err, "zero grads: %s", cudaGetErrorString(e));
  return -1;
}

static const char *cres_err(void *ctx) { return ((gpt_cuda_resident *)ctx)->err; }

extern "C" gpt_provider gpt_cuda_resident_provider(gpt_cuda_resident *r) {
  gpt_provider p = {r, cres_fetch, cres_release, cres_zero, cres_err};
  return p;
}

extern "C" int gpt_cuda_resident_upload(gpt_cuda_resident *r, const float *w) {
  cudaError_t e = cudaMemcpyAsync(r->weights, w, r->schema->total_numel * sizeof(float),
                                  cudaMemcpyHostToDevice, (cudaStream_t)r->stream);
  if (e == cudaSuccess) return 0;
  snprintf(r->err, sizeof r->err, "upload: %s", cudaGetErrorString(e));
  return -1;
}

extern "C" int gpt_cuda_resident_download_grads(gpt_cuda_resident *r, float *g) {
  cudaError_t e = cudaMemcpyAsync(g, r->grads, r->schema->total_numel * sizeof(float),
                                  cudaMemcpyDeviceToHost, (cudaStream_t)r->stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize((cudaStream_t)r->stream);
  if (e == cudaSuccess) return 0;
  snprintf(r->err, sizeof r->err, "download grads: %s", cudaGetErrorString(e));
  return -1;
}

extern "C" int gpt_cuda_host_register(void *p, size_t bytes) {
  if (cudaHostRegister(p, bytes, cudaHostRegisterDefault) == cudaSuccess) return 0;
  (void)cudaGetLastError();
  return -1;
}

extern "C" void gpt_cuda_host_unregister(void *p) {
  if (cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
}
