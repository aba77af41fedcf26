/* examples/gpt/model_cuda.cu — the transformer on a CUDA GPU, mirroring
 * model_cpu.c step for step: bf16 GEMMs with fp32 accumulation on cuBLAS,
 * bf16 activations (the residual stream included) with fp32 statistics,
 * flash attention (attention_cuda.cu: no T x T matrix), the fused norm,
 * activation and chunked cross-entropy kernels of kernels_cuda.cu, and the
 * few small kernels below (embedding, rotary, residual add). Each block's
 * forward and backward run over chunks of whole sequences, so the
 * workspace holds one chunk; the loss runs over chunks of tokens, so the
 * full logits never exist. With checkpointing only the block inputs are
 * kept and one chunk is recomputed in backward. Parameters are read in the
 * provider's dtype (bf16 directly as GEMM operands; fp32 / fp16 rounded
 * into a bf16 scratch; small tensors through ldw()); grads are added into
 * the provider's fp32 accumulators. Every launch, copy and cuBLAS call goes
 * to one stream and nothing in forward/backward waits for the device. Owns
 * only the one block laid out by plan/gpt_layout.c (or uses the caller's),
 * pinned staging for tokens and the loss, two events.
 */
#include "gpt_cuda.h"
#include "gpt_attn.h"
#include "gpt_kernels.h"

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

#include "cuda_device.cuh"

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
/* Every kernel goes to the model's stream and is checked at once, through
 * MODEL_LAUNCH (tests/gpt/cuda_emu/ defines its own to run them on the host). */
#ifndef MODEL_LAUNCH
#define MODEL_LAUNCH(kernel, grid, block, smem, st, ...)                                           \
  kernel<<<(grid), (block), (smem), (st)>>>(__VA_ARGS__)
#endif
#define LAUNCH(kernel, grid, block, ...)                                                           \
  do {                                                                                             \
    MODEL_LAUNCH(kernel, grid, block, 0, m->st, __VA_ARGS__);                                      \
    CK(cudaGetLastError());                                                                        \
  } while (0)
#define TRY(x)        \
  do {                \
    if (x) return -1; \
  } while (0)

/* The fused kernels' launchers (gpt_attn.h, gpt_kernels.h) report into the
 * model's error text; they enqueue on the model's stream. */
#define KERN(call)            \
  do {                        \
    if (call) return -1;      \
  } while (0)
#define KST m->st, m->err, sizeof m->err
#define U16(p) ((uint16_t *)(p))
#define CU16(p) ((const uint16_t *)(p))

/* One chunk's activations of one block (plan/gpt_layout.h's FERRY_GA_*):
 * pointers at the chunk's first row. */
typedef struct {
  bf16 *n1, *qkv, *ao, *xmid, *n2, *h1, *h2, *h3;
  float *mean1, *rstd1, *lse, *mean2, *rstd2;
} dacts;

struct gpt_cuda_model {
  const gpt_schema *s;
  gpt_run_config rc;
  int B, T, BT, C, F, V, H, KV, hd, L, qkvw, kvw;
  int cb, ce;    /* sequences per block chunk, tokens per loss chunk */
  gpt_cuda_layout_t lay;
  cudaStream_t st;
  int own_stream;
  cublasHandle_t blas;
  char *base, *blocks;
  int own_base;
  bf16 *xres, *nf, *dlogits, *abf, *dao, *dg, *du, *wbf;
  float *meanf, *rstdf, *lseh, *logits, *rowloss, *rcos, *rsin;
  float *dres, *dn, *dqkv, *dh, *delta, *partial;
  double *loss_acc;
  int32_t *tok, *tgt;
  int32_t *tok_h;  /* pinned: tokens [BT], targets [BT] */
  double *loss_h;  /* pinned: the loss sum */
  cudaEvent_t ev_tok, ev_loss;
  int n_loss, grads_pending, have_forward;
  char err[1024]; /* a provider's message whole (the engine's swap file, offset, CRCs) */
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

/* ---- the model's own small kernels -------------------------------------------- */

/* Elementwise kernels: 256 threads, a grid-stride loop. */
static unsigned grid1(size_t n) { return grid_for(n, 256); }

/* d = bf16(s (dtype st)). */
__global__ void k_to_bf16(bf16 *d, const void *s, int st, size_t n) {
  FOR_EACH(i, n) d[i] = __float2bfloat16(ldw(s, i, st));
}

/* x = bf16(wte[tok] + wpe[t]) (wpe NULL: Llama). */
__global__ void k_embed(bf16 *x, const void *wte, const void *wpe, int dt, const int32_t *tok,
                        size_t BT, int T, int C) {
  FOR_EACH(i, BT * C) {
    size_t n = i / C, c = i % C;
    float v = ldw(wte, (size_t)tok[n] * C + c, dt);
    x[i] = __float2bfloat16(v + (wpe ? ldw(wpe, (n % T) * C + c, dt) : 0.0f));
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

/* The residual add: y = bf16(x + d + b) over rows of C (b in dtype bt, or
 * NULL). */
__global__ void k_residual(bf16 *y, const bf16 *x, const float *d, const void *b, int bt, size_t N,
                           int C) {
  FOR_EACH(i, N * C) {
    float v = __bfloat162float(x[i]) + d[i];
    if (b) v += ldw(b, i % C, bt);
    y[i] = __float2bfloat16(v);
  }
}

/* Rows of q k v (fp32, row width W = C + 2 kvw, q at 0, k at C, v at C +
 * kvw) rounded into bf16: with rotary tables (Llama), q's H heads and k's
 * KV heads rotated by Hugging Face's rotate_half rule at position row % T
 * (sign -1: the inverse rotation, the backward); with a bias (GPT-2, in
 * dtype bt) the bias added first. One thread per pair (or element). */
__global__ void k_qkv_round(bf16 *dst, const float *src, size_t N, int T, int C, int kvw, int hd,
                            const float *cs, const float *sn, float sign, const void *bias,
                            int bt) {
  int W = C + 2 * kvw, half = hd / 2;
  if (!cs) {
    FOR_EACH(i, N * W) {
      float v = src[i];
      if (bias) v += ldw(bias, i % W, bt);
      dst[i] = __float2bfloat16(v);
    }
    return;
  }
  /* rotated part: (C + kvw) / 2 pairs per row; v copied */
  int pairs = (C + kvw) / 2, per_row = pairs + kvw;
  FOR_EACH(i, N * per_row) {
    size_t n = i / per_row;
    int j = (int)(i % per_row);
    const float *r = src + n * W;
    bf16 *o = dst + n * W;
    if (j >= pairs) { /* v */
      int c = C + kvw + (j - pairs);
      o[c] = __float2bfloat16(r[c]);
      continue;
    }
    int head = j / half, k = j % half; /* heads 0..H-1 are q, then k's */
    int c0 = head * hd + k;            /* q: head * hd; k: C + (head - H) * hd = head * hd too */
    int t = (int)(n % T);
    float c = cs[t * half + k], s = sign * sn[t * half + k];
    float a = r[c0], b = r[c0 + half];
    o[c0] = __float2bfloat16(a * c - b * s);
    o[c0 + half] = __float2bfloat16(b * c + a * s);
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
 * bf16 row-major with leading dimensions lda, ldb (op = transpose when ta /
 * tb). Column-major cuBLAS computes C^T = op(B)^T op(A)^T: B first. */
static int rgemm(gpt_cuda_model *m, int ta, int tb, int M, int N, int K, float alpha,
                 const bf16 *A, int lda, const bf16 *B, int ldb, float beta, void *C,
                 cudaDataType_t ct, int ldc) {
  CB(cublasGemmEx(m->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M,
                  K, &alpha, B, CUDA_R_16BF, ldb, A, CUDA_R_16BF, lda, &beta, C, ct, ldc,
                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return 0;
}

/* n fp32 elements rounded into the activation scratch. */
static int act_bf16(gpt_cuda_model *m, const float *src, size_t n, const bf16 **out) {
  if (n > m->lay.abf_elems)
    return fail(m, "bf16 scratch of %zu elements too small for %zu", m->lay.abf_elems, n);
  LAUNCH(k_to_bf16, grid1(n), 256, m->abf, (const void *)src, (int)FERRY_DT_F32, n);
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
  LAUNCH(k_to_bf16, grid1(n), 256, m->wbf, (const void *)w, (int)dt, n);
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

/* y[N,out] (yt, row stride ldy; = or += by beta) = x[N,in] W, x with row
 * stride ldx; conv1d: W [in,out], else [out,in]. */
static int linear_fwd(gpt_cuda_model *m, void *y, cudaDataType_t yt, int ldy, float beta,
                      const bf16 *x, int ldx, wref W, int N, int in, int out, int conv1d) {
  const bf16 *wb = NULL; /* set by weight_bf16 on success (gcc -O2 cannot tell) */
  TRY(weight_bf16(m, W.p, W.dt, (size_t)in * out, &wb));
  return rgemm(m, 0, !conv1d, N, out, in, 1.0f, x, ldx, wb, conv1d ? out : in, beta, y, yt, ldy);
}

/* dx[N,in] (dxt, row stride in; = or += by beta) = dy W^T (dx may be
 * NULL); dW += x^T dy in W's layout. dy (row stride lddy) and x (row
 * stride ldx) are bf16 operands. */
static int linear_bwd(gpt_cuda_model *m, void *dx, cudaDataType_t dxt, float beta, float *dW,
                      const bf16 *dy, int lddy, const bf16 *x, int ldx, wref W, int N, int in,
                      int out, int conv1d) {
  if (dx) {
    const bf16 *wb = NULL;
    TRY(weight_bf16(m, W.p, W.dt, (size_t)in * out, &wb));
    TRY(rgemm(m, 0, conv1d, N, in, out, 1.0f, dy, lddy, wb, conv1d ? out : in, beta, dx, dxt, in));
  }
  if (conv1d) return rgemm(m, 1, 0, in, out, N, 1.0f, x, ldx, dy, lddy, 1.0f, dW, CUDA_R_32F, out);
  return rgemm(m, 1, 0, out, in, N, 1.0f, dy, lddy, x, ldx, 1.0f, dW, CUDA_R_32F, in);
}

/* ---- chunks and views --------------------------------------------------------- */

/* Block l's activations for the chunk starting at sequence b0: with
 * checkpointing the one chunk-sized set (recomputed), else block l's rows
 * of b0's chunk. */
static dacts acts_of(const gpt_cuda_model *m, int l, int b0) {
  const ferry_gpt_span *s = m->lay.act;
  int ck = m->rc.checkpoint;
  char *q = m->blocks + (size_t)(ck ? 0 : l) * m->lay.block_bytes;
  size_t r0 = ck ? 0 : (size_t)b0 * m->T; /* first row */
  size_t C = (size_t)m->C, F = (size_t)m->F, W = (size_t)m->qkvw;
  dacts a;
#define AT(T_, i, width) ((T_ *)(s[i].bytes ? q + s[i].off + r0 * (width) * sizeof(T_) : NULL))
  a.n1 = AT(bf16, FERRY_GA_N1, C), a.mean1 = AT(float, FERRY_GA_MEAN1, 1);
  a.rstd1 = AT(float, FERRY_GA_RSTD1, 1), a.qkv = AT(bf16, FERRY_GA_QKV, W);
  a.lse = AT(float, FERRY_GA_LSE, (size_t)m->H), a.ao = AT(bf16, FERRY_GA_AO, C);
  a.xmid = AT(bf16, FERRY_GA_XMID, C), a.n2 = AT(bf16, FERRY_GA_N2, C);
  a.mean2 = AT(float, FERRY_GA_MEAN2, 1), a.rstd2 = AT(float, FERRY_GA_RSTD2, 1);
  a.h1 = AT(bf16, FERRY_GA_H1, F), a.h2 = AT(bf16, FERRY_GA_H2, F), a.h3 = AT(bf16, FERRY_GA_H3, F);
#undef AT
  return a;
}

/* The residual stream's rows: block l's input (l = L: the last output). */
static bf16 *xres(const gpt_cuda_model *m, int l) { return m->xres + (size_t)l * m->BT * m->C; }

/* The attention shape of a chunk of nb sequences: rows [q k v] of width
 * qkvw, the output rows of width C. */
static gpt_attn_shape attn_shape(const gpt_cuda_model *m, int nb) {
  gpt_attn_shape a;
  a.B = nb, a.T = m->T, a.H = m->H, a.KV = m->KV, a.hd = m->hd;
  a.ldq = a.ldk = a.ldv = m->qkvw, a.ldo = m->C;
  a.scale = 1.0f / sqrtf((float)m->hd);
  return a;
}

/* Norm forward of N rows: xout = x + delta (when delta), y = norm(xout). */
static int norm_fwd(gpt_cuda_model *m, bf16 *xout, bf16 *y, float *mean, float *rstd,
                    const bf16 *x, const float *delta, const gpt_group_view *v, int ws, int bs,
                    size_t N) {
  int ln = bs >= 0;
  KERN(gpt_resid_norm_cuda_fwd(U16(xout), U16(y), mean, rstd, CU16(x), delta,
                               (const void *)v->w[ws], ln ? (const void *)v->w[bs] : NULL,
                               (int)v->wdt, N, m->C, m->s->cfg.norm_eps, ln, KST));
  return 0;
}

/* dres += d(norm)/dx of dy = m->dn, over N rows; the norm's grads added. */
static int norm_bwd(gpt_cuda_model *m, float *dres, const gpt_group_view *v, int ws, int bs,
                    const bf16 *x, const float *mean, const float *rstd, size_t N) {
  int ln = bs >= 0;
  KERN(gpt_norm_cuda_bwd(dres, v->g[ws], ln ? v->g[bs] : NULL, m->dn, CU16(x), mean, rstd,
                         (const void *)v->w[ws], (int)v->wdt, N, m->C, ln, m->partial, KST));
  return 0;
}

/* ---- blocks: one chunk of nb sequences (N = nb T rows) --------------------------
 * x: the chunk's block input; y: its output, or NULL in backward's
 * recompute (which stops once the MLP's input is saved). */

static int block_fwd_gpt2(gpt_cuda_model *m, const dacts *a, const gpt_group_view *g,
                          const bf16 *x, bf16 *y, int nb) {
  int N = nb * m->T, C = m->C, F = m->F;
  gpt_attn_shape sh = attn_shape(m, nb);
  TRY(norm_fwd(m, NULL, a->n1, a->mean1, a->rstd1, x, NULL, g, G2_LN1_W, G2_LN1_B, N));
  TRY(linear_fwd(m, m->dqkv, CUDA_R_32F, 3 * C, 0.0f, a->n1, C, W_(g, G2_QKV_W), N, C, 3 * C, 1));
  LAUNCH(k_qkv_round, grid1((size_t)N * 3 * C), 256, a->qkv, m->dqkv, (size_t)N, m->T, C, C,
         m->hd, (const float *)NULL, (const float *)NULL, 1.0f, (const void *)g->w[G2_QKV_B],
         (int)g->wdt);
  KERN(gpt_attn_cuda_fwd(&sh, CU16(a->qkv), CU16(a->qkv + C), CU16(a->qkv + 2 * C), U16(a->ao),
                         a->lse, KST));
  TRY(linear_fwd(m, m->dn, CUDA_R_32F, C, 0.0f, a->ao, C, W_(g, G2_ATTO_W), N, C, C, 1));
  LAUNCH(k_residual, grid1((size_t)N * C), 256, a->xmid, x, m->dn, (const void *)g->w[G2_ATTO_B],
         (int)g->wdt, (size_t)N, C);
  TRY(norm_fwd(m, NULL, a->n2, a->mean2, a->rstd2, a->xmid, NULL, g, G2_LN2_W, G2_LN2_B, N));
  TRY(linear_fwd(m, m->dh, CUDA_R_32F, F, 0.0f, a->n2, C, W_(g, G2_FC_W), N, C, F, 1));
  KERN(gpt_gelu_bias_cuda_fwd(U16(a->h2), U16(a->h1), m->dh, (const void *)g->w[G2_FC_B],
                              (int)g->wdt, (size_t)N, F, KST));
  if (!y) return 0;
  TRY(linear_fwd(m, m->dn, CUDA_R_32F, C, 0.0f, a->h2, F, W_(g, G2_FCO_W), N, F, C, 1));
  LAUNCH(k_residual, grid1((size_t)N * C), 256, y, a->xmid, m->dn, (const void *)g->w[G2_FCO_B],
         (int)g->wdt, (size_t)N, C);
  return 0;
}

static int block_fwd_llama(gpt_cuda_model *m, const dacts *a, const gpt_group_view *g,
                           const bf16 *x, bf16 *y, int nb) {
  int N = nb * m->T, C = m->C, F = m->F, kv = m->kvw, W = m->qkvw;
  gpt_attn_shape sh = attn_shape(m, nb);
  TRY(norm_fwd(m, NULL, a->n1, NULL, a->rstd1, x, NULL, g, LL_IN_NORM, -1, N));
  TRY(linear_fwd(m, m->dqkv, CUDA_R_32F, W, 0.0f, a->n1, C, W_(g, LL_Q), N, C, C, 0));
  TRY(linear_fwd(m, m->dqkv + C, CUDA_R_32F, W, 0.0f, a->n1, C, W_(g, LL_K), N, C, kv, 0));
  TRY(linear_fwd(m, m->dqkv + C + kv, CUDA_R_32F, W, 0.0f, a->n1, C, W_(g, LL_V), N, C, kv, 0));
  LAUNCH(k_qkv_round, grid1((size_t)N * ((C + kv) / 2 + kv)), 256, a->qkv, m->dqkv, (size_t)N,
         m->T, C, kv, m->hd, (const float *)m->rcos, (const float *)m->rsin, 1.0f,
         (const void *)NULL, 0);
  KERN(gpt_attn_cuda_fwd(&sh, CU16(a->qkv), CU16(a->qkv + C), CU16(a->qkv + C + kv), U16(a->ao),
                         a->lse, KST));
  TRY(linear_fwd(m, m->dn, CUDA_R_32F, C, 0.0f, a->ao, C, W_(g, LL_O), N, C, C, 0));
  TRY(norm_fwd(m, a->xmid, a->n2, NULL, a->rstd2, x, m->dn, g, LL_POST_NORM, -1, N));
  TRY(linear_fwd(m, a->h1, CUDA_R_16BF, F, 0.0f, a->n2, C, W_(g, LL_GATE), N, C, F, 0));
  TRY(linear_fwd(m, a->h2, CUDA_R_16BF, F, 0.0f, a->n2, C, W_(g, LL_UP), N, C, F, 0));
  KERN(gpt_swiglu_cuda_fwd(U16(a->h3), CU16(a->h1), CU16(a->h2), (size_t)N * F, KST));
  if (!y) return 0;
  TRY(linear_fwd(m, m->dn, CUDA_R_32F, C, 0.0f, a->h3, F, W_(g, LL_DOWN), N, F, C, 0));
  LAUNCH(k_residual, grid1((size_t)N * C), 256, y, a->xmid, m->dn, (const void *)NULL, 0,
         (size_t)N, C);
  return 0;
}

static int block_fwd(gpt_cuda_model *m, const dacts *a, const gpt_group_view *g, const bf16 *x,
                     bf16 *y, int nb) {
  return m->s->cfg.family == GPT_GPT2 ? block_fwd_gpt2(m, a, g, x, y, nb)
                                      : block_fwd_llama(m, a, g, x, y, nb);
}

/* The attention's backward into m->dqkv (fp32 rows [dq dk dv]), then those
 * rounded into m->abf (rotated back, Llama). */
static int attention_bwd(gpt_cuda_model *m, const dacts *a, int nb, int rope) {
  int C = m->C, kv = m->kvw, N = nb * m->T;
  gpt_attn_shape sh = attn_shape(m, nb);
  KERN(gpt_attn_cuda_bwd(&sh, CU16(a->qkv), CU16(a->qkv + C), CU16(a->qkv + C + kv), CU16(a->ao),
                         CU16(m->dao), a->lse, m->delta, m->dqkv, m->dqkv + C, m->dqkv + C + kv,
                         KST));
  if ((size_t)N * m->qkvw > m->lay.abf_elems) return fail(m, "bf16 scratch too small for d(qkv)");
  if (rope)
    LAUNCH(k_qkv_round, grid1((size_t)N * ((C + kv) / 2 + kv)), 256, m->abf, m->dqkv, (size_t)N,
           m->T, C, kv, m->hd, (const float *)m->rcos, (const float *)m->rsin, -1.0f,
           (const void *)NULL, 0);
  else
    LAUNCH(k_qkv_round, grid1((size_t)N * m->qkvw), 256, m->abf, m->dqkv, (size_t)N, m->T, C, kv,
           m->hd, (const float *)NULL, (const float *)NULL, 1.0f, (const void *)NULL, 0);
  return 0;
}

/* dres (the chunk's rows) holds d(out); on return d(in). Grads added into g->g. */
static int block_bwd_gpt2(gpt_cuda_model *m, const dacts *a, const gpt_group_view *g,
                          const bf16 *x, float *dres, int nb) {
  int N = nb * m->T, C = m->C, F = m->F;
  const bf16 *dy = NULL;
  TRY(act_bf16(m, dres, (size_t)N * C, &dy));
  TRY(linear_bwd(m, m->dh, CUDA_R_32F, 0.0f, g->g[G2_FCO_W], dy, C, a->h2, F, W_(g, G2_FCO_W), N,
                 F, C, 1));
  KERN(gpt_bias_grad_cuda(g->g[G2_FCO_B], dres, (size_t)N, C, m->partial, KST));
  KERN(gpt_gelu_bias_cuda_bwd(U16(m->dg), g->g[G2_FC_B], m->dh, CU16(a->h1), (size_t)N, F,
                              m->partial, KST));
  TRY(linear_bwd(m, m->dn, CUDA_R_32F, 0.0f, g->g[G2_FC_W], m->dg, F, a->n2, C, W_(g, G2_FC_W), N,
                 C, F, 1));
  TRY(norm_bwd(m, dres, g, G2_LN2_W, G2_LN2_B, a->xmid, a->mean2, a->rstd2, N));
  TRY(act_bf16(m, dres, (size_t)N * C, &dy));
  TRY(linear_bwd(m, m->dao, CUDA_R_16BF, 0.0f, g->g[G2_ATTO_W], dy, C, a->ao, C,
                 W_(g, G2_ATTO_W), N, C, C, 1));
  KERN(gpt_bias_grad_cuda(g->g[G2_ATTO_B], dres, (size_t)N, C, m->partial, KST));
  TRY(attention_bwd(m, a, nb, 0));
  KERN(gpt_bias_grad_cuda(g->g[G2_QKV_B], m->dqkv, (size_t)N, 3 * C, m->partial, KST));
  TRY(linear_bwd(m, m->dn, CUDA_R_32F, 0.0f, g->g[G2_QKV_W], m->abf, 3 * C, a->n1, C,
                 W_(g, G2_QKV_W), N, C, 3 * C, 1));
  return norm_bwd(m, dres, g, G2_LN1_W, G2_LN1_B, x, a->mean1, a->rstd1, N);
}

static int block_bwd_llama(gpt_cuda_model *m, const dacts *a, const gpt_group_view *g,
                           const bf16 *x, float *dres, int nb) {
  int N = nb * m->T, C = m->C, F = m->F, kv = m->kvw, W = m->qkvw;
  const bf16 *dy = NULL;
  TRY(act_bf16(m, dres, (size_t)N * C, &dy));
  TRY(linear_bwd(m, m->dh, CUDA_R_32F, 0.0f, g->g[LL_DOWN], dy, C, a->h3, F, W_(g, LL_DOWN), N, F,
                 C, 0));
  KERN(gpt_swiglu_cuda_bwd(U16(m->dg), U16(m->du), m->dh, CU16(a->h1), CU16(a->h2),
                           (size_t)N * F, KST));
  TRY(linear_bwd(m, m->dn, CUDA_R_32F, 0.0f, g->g[LL_GATE], m->dg, F, a->n2, C, W_(g, LL_GATE), N,
                 C, F, 0));
  TRY(linear_bwd(m, m->dn, CUDA_R_32F, 1.0f, g->g[LL_UP], m->du, F, a->n2, C, W_(g, LL_UP), N, C,
                 F, 0));
  TRY(norm_bwd(m, dres, g, LL_POST_NORM, -1, a->xmid, NULL, a->rstd2, N));
  TRY(act_bf16(m, dres, (size_t)N * C, &dy));
  TRY(linear_bwd(m, m->dao, CUDA_R_16BF, 0.0f, g->g[LL_O], dy, C, a->ao, C, W_(g, LL_O), N, C, C,
                 0));
  TRY(attention_bwd(m, a, nb, 1));
  TRY(linear_bwd(m, m->dn, CUDA_R_32F, 0.0f, g->g[LL_Q], m->abf, W, a->n1, C, W_(g, LL_Q), N, C,
                 C, 0));
  TRY(linear_bwd(m, m->dn, CUDA_R_32F, 1.0f, g->g[LL_K], m->abf + C, W, a->n1, C, W_(g, LL_K), N,
                 C, kv, 0));
  TRY(linear_bwd(m, m->dn, CUDA_R_32F, 1.0f, g->g[LL_V], m->abf + C + kv, W, a->n1, C,
                 W_(g, LL_V), N, C, kv, 0));
  return norm_bwd(m, dres, g, LL_IN_NORM, -1, x, NULL, a->rstd1, N);
}

static int block_bwd(gpt_cuda_model *m, const dacts *a, const gpt_group_view *g, const bf16 *x,
                     float *dres, int nb) {
  return m->s->cfg.family == GPT_GPT2 ? block_bwd_gpt2(m, a, g, x, dres, nb)
                                      : block_bwd_llama(m, a, g, x, dres, nb);
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

/* The LM head's weight [V, C] and the view it comes from. */
static wref head_weight(const gpt_cuda_model *m, const gpt_group_view *e, const gpt_group_view *h) {
  if (m->s->cfg.family == GPT_GPT2) return W_(e, G2_WTE);
  return m->s->cfg.tied ? W_(e, LL_EMB) : W_(h, LL_HEAD);
}

/* The head's groups: the head, and the embedding when the head reads it
 * (GPT-2's tied wte, a tied Llama). */
static int head_needs_emb(const gpt_cuda_model *m) {
  return m->s->cfg.family == GPT_GPT2 || m->s->cfg.tied;
}
static int head_fetch(gpt_cuda_model *m, gpt_provider *p, gpt_fetch_mode mode, gpt_group_view *e,
                      gpt_group_view *h) {
  memset(e, 0, sizeof *e);
  FETCH(m->L + 1, mode, h);
  if (head_needs_emb(m)) FETCH(0, mode, e);
  return 0;
}
static int head_release(gpt_cuda_model *m, gpt_provider *p, gpt_release_mode emb,
                        gpt_release_mode head) {
  if (head_needs_emb(m)) RELEASE(0, emb);
  RELEASE(m->L + 1, head);
  return 0;
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

/* Rows [r0, r0 + n) of the logits (fp32, into m->logits) from the final
 * norm's output. */
static int head_logits(gpt_cuda_model *m, wref W, int r0, int n) {
  return linear_fwd(m, m->logits, CUDA_R_32F, m->V, 0.0f, m->nf + (size_t)r0 * m->C, m->C, W, n,
                    m->C, m->V, 0);
}

static int ce_chunk(const gpt_cuda_model *m, int r0) { return m->BT - r0 < m->ce ? m->BT - r0 : m->ce; }

/* The final norm; with targets, the loss chunk by chunk: the logits of ce
 * tokens, their row losses and log-sum-exp, never all the logits. */
static int head_fwd(gpt_cuda_model *m, gpt_provider *p, int targets) {
  const gpt_config *c = &m->s->cfg;
  gpt_group_view e, h;
  TRY(head_fetch(m, p, GPT_FETCH_FORWARD, &e, &h));
  if (c->family == GPT_GPT2)
    TRY(norm_fwd(m, NULL, m->nf, m->meanf, m->rstdf, xres(m, m->L), NULL, &h, G2_LNF_W, G2_LNF_B,
                 (size_t)m->BT));
  else
    TRY(norm_fwd(m, NULL, m->nf, NULL, m->rstdf, xres(m, m->L), NULL, &h, LL_NORM, -1,
                 (size_t)m->BT));
  for (int r0 = 0; targets && r0 < m->BT; r0 += m->ce) {
    int n = ce_chunk(m, r0);
    TRY(head_logits(m, head_weight(m, &e, &h), r0, n));
    KERN(gpt_ce_cuda_fwd(m->logits, m->tgt + r0, (size_t)n, m->V, m->rowloss + r0, m->lseh + r0,
                         KST));
  }
  TRY(head_release(m, p, GPT_RELEASE_FORWARD, GPT_RELEASE_FORWARD));
  return 0;
}

/* The row losses' mean added to the device sum, copied back async. */
static int loss_fwd(gpt_cuda_model *m) {
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
    for (int b0 = 0; b0 < m->B; b0 += m->cb) {
      int nb = m->B - b0 < m->cb ? m->B - b0 : m->cb;
      size_t r0 = (size_t)b0 * m->T * m->C;
      dacts a = acts_of(m, l, b0);
      TRY(block_fwd(m, &a, &g, xres(m, l) + r0, xres(m, l + 1) + r0, nb));
    }
    RELEASE(1 + l, GPT_RELEASE_FORWARD);
  }
  TRY(head_fwd(m, p, targets != NULL));
  m->have_forward = 1;
  m->grads_pending = targets != NULL;
  if (targets) TRY(loss_fwd(m));
  return 0;
}

/* The head's backward chunk by chunk: the logits again, their grads (bf16),
 * d(final norm) into m->dn, the head weight's grads; then the final norm's
 * backward into the chunk's rows of m->dres (zeroed first). */
static int head_bwd(gpt_cuda_model *m, gpt_provider *p) {
  const gpt_config *c = &m->s->cfg;
  int C = m->C, V = m->V, gpt2 = c->family == GPT_GPT2;
  gpt_group_view e, h;
  TRY(head_fetch(m, p, GPT_FETCH_BACKWARD, &e, &h));
  float *dW = gpt2 ? e.g[G2_WTE] : c->tied ? e.g[LL_EMB] : h.g[LL_HEAD];
  wref W = head_weight(m, &e, &h);
  CK(cudaMemsetAsync(m->dres, 0, (size_t)m->BT * C * sizeof(float), m->st));
  for (int r0 = 0; r0 < m->BT; r0 += m->ce) {
    int n = ce_chunk(m, r0);
    TRY(head_logits(m, W, r0, n));
    KERN(gpt_ce_cuda_bwd(U16(m->dlogits), m->logits, m->tgt + r0, m->lseh + r0, (size_t)n, V,
                         1.0f / (float)m->BT, KST));
    TRY(linear_bwd(m, m->dn, CUDA_R_32F, 0.0f, dW, m->dlogits, V, m->nf + (size_t)r0 * C, C, W, n,
                   C, V, 0));
    const bf16 *x = xres(m, m->L) + (size_t)r0 * C;
    float *dres = m->dres + (size_t)r0 * C;
    if (gpt2)
      TRY(norm_bwd(m, dres, &h, G2_LNF_W, G2_LNF_B, x, m->meanf + r0, m->rstdf + r0, (size_t)n));
    else
      TRY(norm_bwd(m, dres, &h, LL_NORM, -1, x, NULL, m->rstdf + r0, (size_t)n));
  }
  TRY(head_release(m, p, GPT_RELEASE_PARTIAL, GPT_RELEASE_GRADS));
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
    for (int b0 = 0; b0 < m->B; b0 += m->cb) {
      int nb = m->B - b0 < m->cb ? m->B - b0 : m->cb;
      size_t r0 = (size_t)b0 * m->T * m->C;
      dacts a = acts_of(m, l, b0);
      const bf16 *x = xres(m, l) + r0;
      if (m->rc.checkpoint) TRY(block_fwd(m, &a, &g, x, NULL, nb)); /* recompute */
      TRY(block_bwd(m, &a, &g, x, m->dres + r0, nb));
    }
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

extern "C" int gpt_cuda_model_logits(gpt_cuda_model *m, gpt_provider *p, float *host) {
  if (!m->have_forward) return fail(m, "no forward yet");
  gpt_group_view e, h;
  TRY(head_fetch(m, p, GPT_FETCH_FORWARD, &e, &h));
  for (int r0 = 0; r0 < m->BT; r0 += m->ce) {
    int n = ce_chunk(m, r0);
    TRY(head_logits(m, head_weight(m, &e, &h), r0, n));
    CK(cudaMemcpyAsync(host + (size_t)r0 * m->V, m->logits, (size_t)n * m->V * sizeof(float),
                       cudaMemcpyDeviceToHost, m->st));
    CK(cudaStreamSynchronize(m->st)); /* the chunk buffer is reused */
  }
  TRY(head_release(m, p, GPT_RELEASE_FORWARD, GPT_RELEASE_FORWARD));
  return 0;
}

/* ---- create / free ------------------------------------------------------------------ */

/* Pointers into the block from the layout. */
static void resolve(gpt_cuda_model *m) {
  const ferry_gpt_span *b = m->lay.buf;
  char *p = m->base;
#define AT(T_, i) ((T_ *)(b[i].bytes ? p + b[i].off : NULL))
  m->xres = AT(bf16, FERRY_GL_XRES), m->nf = AT(bf16, FERRY_GL_NF);
  m->meanf = AT(float, FERRY_GL_MEANF), m->rstdf = AT(float, FERRY_GL_RSTDF);
  m->lseh = AT(float, FERRY_GL_LSEH), m->blocks = AT(char, FERRY_GL_BLOCKS);
  m->logits = AT(float, FERRY_GL_LOGITS), m->dlogits = AT(bf16, FERRY_GL_DLOGITS);
  m->rowloss = AT(float, FERRY_GL_ROWLOSS), m->loss_acc = AT(double, FERRY_GL_LOSS);
  m->tok = AT(int32_t, FERRY_GL_TOK), m->tgt = AT(int32_t, FERRY_GL_TGT);
  m->rcos = AT(float, FERRY_GL_ROPE_COS), m->rsin = AT(float, FERRY_GL_ROPE_SIN);
  m->dres = AT(float, FERRY_GL_DRES), m->dn = AT(float, FERRY_GL_DN);
  m->abf = AT(bf16, FERRY_GL_ABF), m->dao = AT(bf16, FERRY_GL_DAO);
  m->dqkv = AT(float, FERRY_GL_DQKV), m->dh = AT(float, FERRY_GL_DH);
  m->dg = AT(bf16, FERRY_GL_DG), m->du = AT(bf16, FERRY_GL_DU);
  m->delta = AT(float, FERRY_GL_DELTA), m->partial = AT(float, FERRY_GL_PARTIAL);
  m->wbf = AT(bf16, FERRY_GL_WBF);
#undef AT
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
  CB(cublasSetWorkspace(m->blas, m->base + m->lay.buf[FERRY_GL_BLAS].off,
                        m->lay.buf[FERRY_GL_BLAS].bytes));
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
  const gpt_config *c = &s->cfg;
  char why[160];
  int hd = c->d_model / c->n_head;
  long qkvw = c->d_model + 2L * c->n_kv_head * hd;
  gpt_attn_shape sh = {1, rc->seq, c->n_head, c->n_kv_head, hd, qkvw, qkvw, qkvw, c->d_model, 1.0f};
  if (gpt_attn_check(&sh, why, sizeof why))
    return snprintf(err, errlen, "the CUDA model's attention: %s", why), -1;
  gpt_cuda_model *m = (gpt_cuda_model *)calloc(1, sizeof *m);
  if (!m) return snprintf(err, errlen, "out of memory"), -1;
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
  m->hd = c->d_model / c->n_head, m->L = c->n_layer, m->qkvw = (int)m->lay.qkvw;
  m->kvw = m->KV * m->hd, m->cb = (int)m->lay.chunk_b, m->ce = (int)m->lay.ce_rows;
  size_t rows = (size_t)m->cb * m->T > (size_t)m->ce ? (size_t)m->cb * m->T : (size_t)m->ce;
  int wide = m->F > m->qkvw ? m->F : m->qkvw;
  if (gpt_norm_bwd_partial_floats(rows, wide > m->C ? wide : m->C) > m->lay.partial_floats) {
    snprintf(err, errlen, "the layout's partial sums (%zu floats) are smaller than the fused "
             "kernels need", m->lay.partial_floats);
    free(m);
    return -1;
  }
  if (create_runtime(m, mem)) {
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
  free(m);
}

extern "C" const char *gpt_cuda_model_last_error(const gpt_cuda_model *m) { return m ? m->err : ""; }
extern "C" void *gpt_cuda_model_stream(const gpt_cuda_model *m) { return (void *)m->st; }
extern "C" size_t gpt_cuda_model_bytes(const gpt_cuda_model *m) { return m->lay.bytes; }
