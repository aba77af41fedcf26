/* examples/gpt/kvcache_cuda.cu — the KV-cache forward for sampling on a
 * CUDA GPU (gpt_cuda_kv), mirroring model_cpu.c's gpt_kv step for step in
 * fp32: embedding at the cached offset, the norms, the projections, the
 * rotary at each new position, the new keys and values stored into each
 * layer's cache, each new query attending to every cached position up to
 * its own, the MLP, the residuals and the head. Weights are read through
 * the provider in its dtype (ldw: fp32 resident, bf16 / fp16 engine);
 * activations and the cache are fp32. Small kernels of its own, no
 * cuBLAS: one call is at most GPT_KV_ROWS rows, a weight-bound GEMV, and
 * the whole file runs under the host emulation (tests/gpt/cuda_emu) too.
 */
#include "gpt_cuda.h"

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

#ifndef MODEL_LAUNCH
#define MODEL_LAUNCH(kernel, grid, block, smem, st, ...)                                           \
  kernel<<<(grid), (block), (smem), (st)>>>(__VA_ARGS__)
#endif
#define KCK(call)                                                                          \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess)                                                                 \
      return kfail(kv, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
  } while (0)
#define KLAUNCH(kernel, grid, block, ...)                                                  \
  do {                                                                                     \
    MODEL_LAUNCH(kernel, grid, block, 0, kv->st, __VA_ARGS__);                             \
    KCK(cudaGetLastError());                                                               \
  } while (0)

enum { NT = 256 }; /* threads of every kernel here */

struct gpt_cuda_kv {
  const gpt_schema *s;
  int C, F, V, H, KV, hd, L, R; /* R: rows of one call */
  int max_pos, pos, rows;
  cudaStream_t st;
  int own_st;             /* st is the cache's own (made at create) */
  float *x, *y;           /* [R, C] residual streams: a block's input and output */
  float *n1, *qkv, *ao;   /* [R, C], [R, C + 2 KV hd] (as model_cpu.c's qkv_of), [R, C] */
  float *xmid, *n2;       /* [R, C] */
  float *h1, *h2, *h3;    /* [R, F] */
  float *logits;          /* [R, V] */
  float *S;               /* [R, H, max_pos] attention probabilities */
  float *cache;           /* per layer: keys [max_pos, KV hd], then values */
  float *rcos, *rsin;     /* [max_pos, hd / 2] */
  int32_t *tok;           /* [R] */
  float *host_logits;     /* [R, V] */
  char err[512];
};

static int kfail(gpt_cuda_kv *kv, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(kv->err, sizeof kv->err, fmt, ap);
  va_end(ap);
  return -1;
}

/* ---- kernels ----------------------------------------------------------------------- */

/* A block's sum of v (NT threads); every thread gets it. */
__device__ static float block_sum(float v, float *red) {
  red[threadIdx.x] = v;
  __syncthreads();
  for (int o = NT / 2; o > 0; o >>= 1) {
    if ((int)threadIdx.x < o) red[threadIdx.x] += red[threadIdx.x + o];
    __syncthreads();
  }
  float r = red[0];
  __syncthreads();
  return r;
}

__device__ static float block_max(float v, float *red) {
  red[threadIdx.x] = v;
  __syncthreads();
  for (int o = NT / 2; o > 0; o >>= 1) {
    if ((int)threadIdx.x < o) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + o]);
    __syncthreads();
  }
  float r = red[0];
  __syncthreads();
  return r;
}

/* Row i: wte[tok[i]] (+ wpe[t0 + i], GPT-2). Grid: n rows. */
__global__ void k_kv_embed(float *x, const void *wte, const void *wpe, int dt, const int32_t *tok,
                           int t0, int C) {
  int i = blockIdx.x;
  for (int c = threadIdx.x; c < C; c += NT)
    x[(size_t)i * C + c] = ldw(wte, (size_t)tok[i] * C + c, dt) +
                           (wpe ? ldw(wpe, (size_t)(t0 + i) * C + c, dt) : 0.0f);
}

/* LayerNorm (b != NULL or layer) or RMSNorm of row blockIdx.x. */
__global__ void k_kv_norm(float *y, const float *x, const void *w, const void *b, int dt, int C,
                          float eps, int layer) {
  __shared__ float red[NT];
  const float *xr = x + (size_t)blockIdx.x * C;
  float *yr = y + (size_t)blockIdx.x * C;
  float mu = 0;
  if (layer) {
    float s = 0;
    for (int c = threadIdx.x; c < C; c += NT) s += xr[c];
    mu = block_sum(s, red) / (float)C;
  }
  float v = 0;
  for (int c = threadIdx.x; c < C; c += NT) v += (xr[c] - mu) * (xr[c] - mu);
  float rs = 1.0f / sqrtf(block_sum(v, red) / (float)C + eps);
  for (int c = threadIdx.x; c < C; c += NT)
    yr[c] = (xr[c] - mu) * rs * ldw(w, c, dt) + (layer ? ldw(b, c, dt) : 0.0f);
}

/* y[i, j] = sum_k x[i, k] W[k, j] (+ b[j]), W [in, out] (GPT-2's Conv1D):
 * a thread per output, reads along j coalesced. Grid: (out / NT, n). */
__global__ void k_kv_linear_io(float *y, int ldy, const float *x, const void *W, const void *b,
                               int dt, int in, int out) {
  int j = blockIdx.x * NT + threadIdx.x, i = blockIdx.y;
  if (j >= out) return;
  const float *xr = x + (size_t)i * in;
  float acc = 0;
  for (int k = 0; k < in; k++) acc += xr[k] * ldw(W, (size_t)k * out + j, dt);
  y[(size_t)i * ldy + j] = acc + (b ? ldw(b, j, dt) : 0.0f);
}

/* The same for W [out, in] (Linear): a warp per output, lanes along k.
 * Grid: (out / (NT / 32), n). */
__global__ void k_kv_linear_oi(float *y, int ldy, const float *x, const void *W, const void *b,
                               int dt, int in, int out) {
  int j = blockIdx.x * (NT / 32) + threadIdx.x / 32, lane = threadIdx.x % 32, i = blockIdx.y;
  const float *xr = x + (size_t)i * in;
  float acc = 0;
  if (j < out)
    for (int k = lane; k < in; k += 32) acc += xr[k] * ldw(W, (size_t)j * in + k, dt);
  acc = warp_sum(acc);
  if (j < out && lane == 0) y[(size_t)i * ldy + j] = acc + (b ? ldw(b, j, dt) : 0.0f);
}

/* Hugging Face's rotate_half rotary of row i at position t0 + i. Grid: n. */
__global__ void k_kv_rope(float *x, int ld, int heads, int hd, const float *cs, const float *sn,
                          int t0) {
  int i = blockIdx.x, half = hd / 2, t = t0 + i;
  for (int e = threadIdx.x; e < heads * half; e += NT) {
    float *p = x + (size_t)i * ld + (e / half) * hd;
    int k = e % half;
    float c = cs[t * half + k], s = sn[t * half + k], a = p[k], bb = p[k + half];
    p[k] = a * c - bb * s;
    p[k + half] = bb * c + a * s;
  }
}

/* Rows i of k and v (strides ldk, ldv) into the cache at t0 + i. Grid: n. */
__global__ void k_kv_store(float *kc, float *vc, const float *k, int ldk, const float *v, int ldv,
                           int t0, int kvd) {
  int i = blockIdx.x;
  for (int c = threadIdx.x; c < kvd; c += NT) {
    kc[(size_t)(t0 + i) * kvd + c] = k[(size_t)i * ldk + c];
    vc[(size_t)(t0 + i) * kvd + c] = v[(size_t)i * ldv + c];
  }
}

/* Query row i (position t0 + i), head h against cached keys 0..t0+i: the
 * softmax of the scaled scores into S (max_pos per row and head), then
 * their sum of values into ao. Grid: (H, n). */
__global__ void k_kv_attend(float *ao, int C, float *S, int max_pos, const float *q, int ldq,
                            const float *kc, const float *vc, int kvd, int t0, int grp, int hd) {
  __shared__ float red[NT];
  int h = blockIdx.x, i = blockIdx.y, last = t0 + i;
  const float *qr = q + (size_t)i * ldq + h * hd;
  const float *K = kc + (h / grp) * hd, *Vv = vc + (h / grp) * hd;
  float *r = S + ((size_t)i * gridDim.x + h) * max_pos, scale = 1.0f / sqrtf((float)hd);
  float mx = -INFINITY;
  for (int j = threadIdx.x; j <= last; j += NT) {
    float d = 0;
    for (int e = 0; e < hd; e++) d += qr[e] * K[(size_t)j * kvd + e];
    r[j] = scale * d;
    mx = fmaxf(mx, r[j]);
  }
  mx = block_max(mx, red);
  float sum = 0;
  for (int j = threadIdx.x; j <= last; j += NT) sum += (r[j] = expf(r[j] - mx));
  float inv = 1.0f / block_sum(sum, red);
  __syncthreads(); /* every r[j] written before any thread reads them all */
  for (int e = threadIdx.x; e < hd; e += NT) {
    float acc = 0;
    for (int j = 0; j <= last; j++) acc += r[j] * inv * Vv[(size_t)j * kvd + e];
    ao[(size_t)i * C + h * hd + e] = acc;
  }
}

/* y += x over n floats. */
__global__ void k_kv_add(float *y, const float *x, size_t n) {
  FOR_EACH(i, n) y[i] += x[i];
}

#define GELU_S 0.7978845608028654f
/* GPT-2: h2 = gelu_tanh(h1); Llama: h3 = silu(h1) * h2. */
__global__ void k_kv_act(float *h1, float *h2, float *h3, size_t n, int llama) {
  FOR_EACH(i, n) {
    float v = h1[i];
    if (llama) h3[i] = v / (1.0f + expf(-v)) * h2[i];
    else h2[i] = 0.5f * v * (1.0f + tanhf(GELU_S * (v + 0.044715f * v * v * v)));
  }
}

/* ---- the passes ---------------------------------------------------------------------- */

/* y[n, out] = x W (+ b), W in the provider's layout (conv1d: [in, out]). */
static int kv_linear(gpt_cuda_kv *kv, float *y, int ldy, const float *x, const void *W,
                     const void *b, int dt, int n, int in, int out, int conv1d) {
  if (conv1d)
    KLAUNCH(k_kv_linear_io, dim3((unsigned)((out + NT - 1) / NT), (unsigned)n), dim3(NT), y, ldy, x,
            W, b, dt, in, out);
  else
    KLAUNCH(k_kv_linear_oi, dim3((unsigned)((out + NT / 32 - 1) / (NT / 32)), (unsigned)n),
            dim3(NT), y, ldy, x, W, b, dt, in, out);
  return 0;
}

#define KFETCH(grp, view)                                                                   \
  do {                                                                                      \
    if (p->fetch(p->ctx, (grp), GPT_FETCH_FORWARD, (view)))                                 \
      return kfail(kv, "fetch of group %d failed: %s", (grp),                               \
                   p->last_error ? p->last_error(p->ctx) : "");                             \
  } while (0)
#define KRELEASE(grp)                                                                       \
  do {                                                                                      \
    if (p->release(p->ctx, (grp), GPT_RELEASE_FORWARD))                                     \
      return kfail(kv, "release of group %d failed: %s", (grp),                             \
                   p->last_error ? p->last_error(p->ctx) : "");                             \
  } while (0)

/* Block l on n rows: model_cpu.c's kv_block (block_qkv, rotary, store,
 * attend, block_out) in the same order. */
static int kv_block(gpt_cuda_kv *kv, int l, const gpt_group_view *g, int n) {
  const gpt_config *c = &kv->s->cfg;
  int C = kv->C, F = kv->F, hd = kv->hd, kvd = kv->KV * hd, R = kv->R, dt = (int)g->wdt;
  int gpt2 = c->family == GPT_GPT2;
  float *q = kv->qkv, *k = gpt2 ? q + C : q + (size_t)R * C, *v = gpt2 ? q + 2 * C : k + (size_t)R * kvd;
  int ldq = gpt2 ? 3 * C : C, ldk = gpt2 ? 3 * C : kvd;
  float *kc = kv->cache + (size_t)l * 2 * kv->max_pos * kvd, *vc = kc + (size_t)kv->max_pos * kvd;
  const float *x = kv->x;
  if (gpt2) {
    KLAUNCH(k_kv_norm, dim3((unsigned)n), dim3(NT), kv->n1, x, (const void *)g->w[G2_LN1_W],
            (const void *)g->w[G2_LN1_B], dt, C, c->norm_eps, 1);
    if (kv_linear(kv, q, 3 * C, kv->n1, g->w[G2_QKV_W], g->w[G2_QKV_B], dt, n, C, 3 * C, 1)) return -1;
  } else {
    KLAUNCH(k_kv_norm, dim3((unsigned)n), dim3(NT), kv->n1, x, (const void *)g->w[LL_IN_NORM],
            (const void *)NULL, dt, C, c->norm_eps, 0);
    if (kv_linear(kv, q, C, kv->n1, g->w[LL_Q], NULL, dt, n, C, C, 0) ||
        kv_linear(kv, k, kvd, kv->n1, g->w[LL_K], NULL, dt, n, C, kvd, 0) ||
        kv_linear(kv, v, kvd, kv->n1, g->w[LL_V], NULL, dt, n, C, kvd, 0))
      return -1;
    KLAUNCH(k_kv_rope, dim3((unsigned)n), dim3(NT), q, ldq, kv->H, hd, (const float *)kv->rcos,
            (const float *)kv->rsin, kv->pos);
    KLAUNCH(k_kv_rope, dim3((unsigned)n), dim3(NT), k, ldk, kv->KV, hd, (const float *)kv->rcos,
            (const float *)kv->rsin, kv->pos);
  }
  KLAUNCH(k_kv_store, dim3((unsigned)n), dim3(NT), kc, vc, (const float *)k, ldk, (const float *)v,
          ldk, kv->pos, kvd);
  KLAUNCH(k_kv_attend, dim3((unsigned)kv->H, (unsigned)n), dim3(NT), kv->ao, C, kv->S, kv->max_pos,
          (const float *)q, ldq, (const float *)kc, (const float *)vc, kvd, kv->pos,
          kv->H / kv->KV, hd);
  size_t nc = (size_t)n * C, nf = (size_t)n * F;
  if (gpt2) {
    if (kv_linear(kv, kv->xmid, C, kv->ao, g->w[G2_ATTO_W], g->w[G2_ATTO_B], dt, n, C, C, 1)) return -1;
    KLAUNCH(k_kv_add, dim3(grid_for(nc, NT)), dim3(NT), kv->xmid, x, nc);
    KLAUNCH(k_kv_norm, dim3((unsigned)n), dim3(NT), kv->n2, (const float *)kv->xmid,
            (const void *)g->w[G2_LN2_W], (const void *)g->w[G2_LN2_B], dt, C, c->norm_eps, 1);
    if (kv_linear(kv, kv->h1, F, kv->n2, g->w[G2_FC_W], g->w[G2_FC_B], dt, n, C, F, 1)) return -1;
    KLAUNCH(k_kv_act, dim3(grid_for(nf, NT)), dim3(NT), kv->h1, kv->h2, kv->h3, nf, 0);
    if (kv_linear(kv, kv->y, C, kv->h2, g->w[G2_FCO_W], g->w[G2_FCO_B], dt, n, F, C, 1)) return -1;
  } else {
    if (kv_linear(kv, kv->xmid, C, kv->ao, g->w[LL_O], NULL, dt, n, C, C, 0)) return -1;
    KLAUNCH(k_kv_add, dim3(grid_for(nc, NT)), dim3(NT), kv->xmid, x, nc);
    KLAUNCH(k_kv_norm, dim3((unsigned)n), dim3(NT), kv->n2, (const float *)kv->xmid,
            (const void *)g->w[LL_POST_NORM], (const void *)NULL, dt, C, c->norm_eps, 0);
    if (kv_linear(kv, kv->h1, F, kv->n2, g->w[LL_GATE], NULL, dt, n, C, F, 0) ||
        kv_linear(kv, kv->h2, F, kv->n2, g->w[LL_UP], NULL, dt, n, C, F, 0))
      return -1;
    KLAUNCH(k_kv_act, dim3(grid_for(nf, NT)), dim3(NT), kv->h1, kv->h2, kv->h3, nf, 1);
    if (kv_linear(kv, kv->y, C, kv->h3, g->w[LL_DOWN], NULL, dt, n, F, C, 0)) return -1;
  }
  KLAUNCH(k_kv_add, dim3(grid_for(nc, NT)), dim3(NT), kv->y, (const float *)kv->xmid, nc);
  float *t = kv->x; /* the output is the next block's input */
  kv->x = kv->y, kv->y = t;
  return 0;
}

/* The final norm and the head of n rows into kv->logits. */
static int kv_head(gpt_cuda_kv *kv, gpt_provider *p, int n) {
  const gpt_config *c = &kv->s->cfg;
  int hg = kv->L + 1, gpt2 = c->family == GPT_GPT2, need_emb = gpt2 || c->tied;
  gpt_group_view e, h;
  memset(&e, 0, sizeof e);
  KFETCH(hg, &h);
  if (need_emb) KFETCH(0, &e);
  int dt = (int)h.wdt, nw = gpt2 ? (int)G2_LNF_W : (int)LL_NORM;
  KLAUNCH(k_kv_norm, dim3((unsigned)n), dim3(NT), kv->n1, (const float *)kv->x,
          (const void *)h.w[nw], (const void *)(gpt2 ? h.w[G2_LNF_B] : NULL), dt, kv->C,
          c->norm_eps, gpt2);
  const void *W = gpt2 ? e.w[G2_WTE] : c->tied ? e.w[LL_EMB] : h.w[LL_HEAD];
  if (kv_linear(kv, kv->logits, kv->V, kv->n1, W, NULL, need_emb ? (int)e.wdt : dt, n, kv->C, kv->V, 0))
    return -1;
  if (need_emb) KRELEASE(0);
  KRELEASE(hg);
  return 0;
}

extern "C" int gpt_cuda_kv_forward(gpt_cuda_kv *kv, gpt_provider *p, const int32_t *tokens, int n) {
  const gpt_config *c = &kv->s->cfg;
  if (n < 1 || n > kv->R) return kfail(kv, "%d rows in one call (1 to %d)", n, kv->R);
  if (kv->pos + n > kv->max_pos)
    return kfail(kv, "the context is full (%d positions, %d more asked)", kv->max_pos, n);
  for (int i = 0; i < n; i++)
    if (tokens[i] < 0 || tokens[i] >= kv->V)
      return kfail(kv, "token %d out of range (vocab %d)", tokens[i], kv->V);
  KCK(cudaMemcpyAsync(kv->tok, tokens, (size_t)n * sizeof *tokens, cudaMemcpyHostToDevice, kv->st));
  gpt_group_view g;
  KFETCH(0, &g);
  KLAUNCH(k_kv_embed, dim3((unsigned)n), dim3(NT), kv->x, (const void *)g.w[0],
          (const void *)(c->family == GPT_GPT2 ? g.w[G2_WPE] : NULL), (int)g.wdt,
          (const int32_t *)kv->tok, kv->pos, kv->C);
  KRELEASE(0);
  for (int l = 0; l < kv->L; l++) {
    KFETCH(1 + l, &g);
    if (kv_block(kv, l, &g, n)) return -1;
    KRELEASE(1 + l);
  }
  if (kv_head(kv, p, n)) return -1;
  KCK(cudaMemcpyAsync(kv->host_logits, kv->logits, (size_t)n * kv->V * sizeof(float),
                      cudaMemcpyDeviceToHost, kv->st));
  KCK(cudaStreamSynchronize(kv->st));
  kv->pos += n;
  kv->rows = n;
  return 0;
}

/* ---- create, free ------------------------------------------------------------------- */

extern "C" void gpt_cuda_kv_free(gpt_cuda_kv *kv) {
  if (!kv) return;
  if (kv->st) cudaStreamSynchronize(kv->st);
  float *bufs[] = {kv->x, kv->y, kv->n1, kv->qkv, kv->ao, kv->xmid, kv->n2, kv->h1, kv->h2,
                   kv->h3, kv->logits, kv->S, kv->cache, kv->rcos, kv->rsin};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) cudaFree(bufs[i]);
  cudaFree(kv->tok);
  if (kv->host_logits) cudaFreeHost(kv->host_logits);
  if (kv->own_st) cudaStreamDestroy(kv->st);
  free(kv);
}

static int kv_alloc(gpt_cuda_kv *kv, float **p, size_t n) {
  KCK(cudaMalloc((void **)p, (n ? n : 1) * sizeof(float)));
  return 0;
}

extern "C" int gpt_cuda_kv_create(const gpt_schema *s, int max_pos, void *stream, gpt_cuda_kv **out,
                                  char *err, size_t errlen) {
  *out = NULL;
  const gpt_config *c = &s->cfg;
  if (max_pos < 1 || max_pos > c->max_seq) {
    snprintf(err, errlen, "max_pos %d outside 1..%d", max_pos, c->max_seq);
    return -1;
  }
  gpt_cuda_kv *kv = (gpt_cuda_kv *)calloc(1, sizeof *kv);
  if (!kv) {
    snprintf(err, errlen, "out of host memory");
    return -1;
  }
  kv->s = s;
  kv->C = c->d_model, kv->F = c->d_ff, kv->V = c->vocab, kv->H = c->n_head, kv->KV = c->n_kv_head;
  kv->hd = c->d_model / c->n_head, kv->L = c->n_layer, kv->max_pos = max_pos;
  kv->R = max_pos < GPT_KV_ROWS ? max_pos : GPT_KV_ROWS;
  kv->st = (cudaStream_t)stream;
  kv->own_st = !stream && cudaStreamCreate(&kv->st) == cudaSuccess;
  size_t R = (size_t)kv->R, C = (size_t)kv->C, F = (size_t)kv->F, kvd = (size_t)kv->KV * kv->hd;
  size_t half = (size_t)kv->hd / 2 + 1;
  int bad = !kv->st || kv_alloc(kv, &kv->x, R * C) ||
            kv_alloc(kv, &kv->y, R * C) || kv_alloc(kv, &kv->n1, R * C) ||
            kv_alloc(kv, &kv->qkv, R * (C + 2 * kvd)) || kv_alloc(kv, &kv->ao, R * C) ||
            kv_alloc(kv, &kv->xmid, R * C) || kv_alloc(kv, &kv->n2, R * C) ||
            kv_alloc(kv, &kv->h1, R * F) || kv_alloc(kv, &kv->h2, R * F) ||
            kv_alloc(kv, &kv->h3, R * F) || kv_alloc(kv, &kv->logits, R * kv->V) ||
            kv_alloc(kv, &kv->S, R * kv->H * max_pos) ||
            kv_alloc(kv, &kv->cache, (size_t)kv->L * 2 * max_pos * kvd) ||
            kv_alloc(kv, &kv->rcos, max_pos * half) || kv_alloc(kv, &kv->rsin, max_pos * half) ||
            cudaMalloc((void **)&kv->tok, R * sizeof(int32_t)) != cudaSuccess ||
            cudaMallocHost((void **)&kv->host_logits, R * kv->V * sizeof(float)) != cudaSuccess;
  if (!bad && c->family == GPT_LLAMA) { /* model_cpu.c's rope_tables, uploaded */
    int h2 = kv->hd / 2;
    float *cs = (float *)malloc((size_t)max_pos * h2 * sizeof(float) * 2);
    bad = !cs;
    for (int i = 0; !bad && i < h2; i++) {
      float inv = (float)(1.0 / pow((double)c->rope_theta, (double)(2 * i) / kv->hd));
      for (int t = 0; t < max_pos; t++) {
        float ang = (float)t * inv;
        cs[t * h2 + i] = (float)cos((double)ang);
        cs[(size_t)max_pos * h2 + t * h2 + i] = (float)sin((double)ang);
      }
    }
    size_t tb = (size_t)max_pos * h2 * sizeof(float);
    bad = bad || cudaMemcpy(kv->rcos, cs, tb, cudaMemcpyHostToDevice) != cudaSuccess ||
          cudaMemcpy(kv->rsin, cs + (size_t)max_pos * h2, tb, cudaMemcpyHostToDevice) != cudaSuccess;
    free(cs);
  }
  if (bad) {
    snprintf(err, errlen, "the KV cache of %d positions: %s", max_pos,
             kv->err[0] ? kv->err : "out of device memory");
    gpt_cuda_kv_free(kv);
    return -1;
  }
  *out = kv;
  return 0;
}

extern "C" void gpt_cuda_kv_reset(gpt_cuda_kv *kv) { kv->pos = kv->rows = 0; }
extern "C" int gpt_cuda_kv_pos(const gpt_cuda_kv *kv) { return kv->pos; }
extern "C" int gpt_cuda_kv_rows(const gpt_cuda_kv *kv) { return kv->rows; }
extern "C" const float *gpt_cuda_kv_logits(const gpt_cuda_kv *kv) { return kv->host_logits; }
extern "C" const char *gpt_cuda_kv_last_error(const gpt_cuda_kv *kv) { return kv->err; }
extern "C" void *gpt_cuda_kv_stream(const gpt_cuda_kv *kv) { return (void *)kv->st; }
