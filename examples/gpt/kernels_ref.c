/* examples/gpt/kernels_ref.c — the CPU references of the fused kernels of
 * gpt_kernels.h: residual add + RMSNorm / LayerNorm forward and backward,
 * SwiGLU, GELU with its bias, and the chunked softmax cross-entropy. Each
 * computes what its CUDA kernel (kernels_cuda.cu) computes, in the same
 * fp32 formulas as model_cpu.c, and rounds to bf16 wherever the kernel
 * stores bf16, so the two agree to within accumulation order.
 */
#include "gpt_kernels.h"

#include "core/dtype.h"

#include <math.h>
#include <string.h>

float gpt_bf16_round(float x) { return ferry_bf16_to_f32(ferry_f32_to_bf16(x)); }

/* ---- residual + norm ---------------------------------------------------------- */

/* The column sums of the CUDA kernels (norm dw/db, bias grads) run in up to
 * 256 slices of rows, each writing 2 x C partial sums; the size is plain C
 * so that the plan counts it without a GPU. */
#define COLSUM_SLICES 256

size_t gpt_norm_bwd_partial_floats(size_t N, int C) {
  size_t slices = N < COLSUM_SLICES ? N : COLSUM_SLICES;
  return (slices ? slices : 1) * 2 * (size_t)(C > 0 ? C : 0);
}

void gpt_resid_norm_ref_fwd(float *xout, float *y, float *mean, float *rstd, const float *x,
                            const float *delta, const float *w, const float *b, size_t N, int C,
                            float eps, int layernorm) {
  for (size_t n = 0; n < N; n++) {
    const float *xr = x + n * C;
    float *yr = y + n * C;
    if (delta) { /* the residual stream's new value, rounded as stored */
      float *xo = xout + n * C;
      for (int i = 0; i < C; i++) xo[i] = gpt_bf16_round(xr[i] + delta[n * C + i]);
      xr = xo;
    } else if (xout && xout != x) {
      memcpy(xout + n * C, xr, (size_t)C * sizeof(float));
    }
    float mu = 0, ss = 0;
    if (layernorm) {
      for (int i = 0; i < C; i++) mu += xr[i];
      mu /= (float)C;
    }
    for (int i = 0; i < C; i++) ss += (xr[i] - mu) * (xr[i] - mu);
    float rs = 1.0f / sqrtf(ss / (float)C + eps);
    for (int i = 0; i < C; i++) {
      float v = (xr[i] - mu) * rs * w[i];
      yr[i] = gpt_bf16_round(layernorm ? v + b[i] : v);
    }
    if (layernorm && mean) mean[n] = mu;
    rstd[n] = rs;
  }
}

void gpt_norm_ref_bwd(float *dx, float *dw, float *db, const float *dy, const float *x,
                      const float *mean, const float *rstd, const float *w, size_t N, int C,
                      int layernorm) {
  for (size_t n = 0; n < N; n++) {
    const float *xr = x + n * C, *dyr = dy + n * C;
    float *dxr = dx + n * C;
    float mu = layernorm ? mean[n] : 0.0f, rs = rstd[n], s1 = 0, s2 = 0;
    for (int i = 0; i < C; i++) {
      float xh = (xr[i] - mu) * rs, dxh = dyr[i] * w[i];
      s1 += dxh;
      s2 += dxh * xh;
    }
    s1 = layernorm ? s1 / (float)C : 0.0f;
    s2 /= (float)C;
    for (int i = 0; i < C; i++) {
      float xh = (xr[i] - mu) * rs, dxh = dyr[i] * w[i];
      dw[i] += dyr[i] * xh;
      if (layernorm && db) db[i] += dyr[i];
      dxr[i] += rs * (dxh - s1 - xh * s2);
    }
  }
}

/* ---- activations -------------------------------------------------------------- */

static float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

void gpt_swiglu_ref_fwd(float *h, const float *g, const float *u, size_t n) {
  for (size_t i = 0; i < n; i++) h[i] = gpt_bf16_round(g[i] * sigm(g[i]) * u[i]);
}

void gpt_swiglu_ref_bwd(float *dg, float *du, const float *dh, const float *g, const float *u,
                        size_t n) {
  for (size_t i = 0; i < n; i++) {
    float gt = g[i], s = sigm(gt), d = dh[i];
    dg[i] = gpt_bf16_round(d * u[i] * s * (1.0f + gt * (1.0f - s)));
    du[i] = gpt_bf16_round(d * gt * s);
  }
}

#define GELU_S 0.7978845608028654f /* sqrt(2/pi) */

void gpt_gelu_bias_ref_fwd(float *y, float *pre, const float *x, const float *b, size_t N, int F) {
  for (size_t n = 0; n < N; n++)
    for (int f = 0; f < F; f++) {
      size_t i = n * F + f;
      float v = gpt_bf16_round(x[i] + (b ? b[f] : 0.0f));
      pre[i] = v;
      y[i] = gpt_bf16_round(0.5f * v * (1.0f + tanhf(GELU_S * (v + 0.044715f * v * v * v))));
    }
}

void gpt_gelu_bias_ref_bwd(float *dpre, float *db, const float *dy, const float *pre, size_t N,
                           int F) {
  for (size_t n = 0; n < N; n++)
    for (int f = 0; f < F; f++) {
      size_t i = n * F + f;
      float v = pre[i], t = tanhf(GELU_S * (v + 0.044715f * v * v * v));
      float d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * GELU_S * (1.0f + 3 * 0.044715f * v * v);
      dpre[i] = gpt_bf16_round(dy[i] * d);
      if (db) db[f] += dpre[i];
    }
}

/* ---- cross-entropy ------------------------------------------------------------- */

void gpt_ce_ref_fwd(const float *logits, const int32_t *tgt, size_t n, int V, float *rowloss,
                    float *lse) {
  for (size_t r = 0; r < n; r++) {
    const float *x = logits + r * V;
    float mx = -INFINITY;
    for (int v = 0; v < V; v++) mx = x[v] > mx ? x[v] : mx;
    double s = 0;
    for (int v = 0; v < V; v++) s += exp((double)x[v] - (double)mx);
    float l = (float)((double)mx + log(s));
    int t = tgt[r];
    lse[r] = l;
    rowloss[r] = t >= 0 && t < V ? l - x[t] : NAN;
  }
}

void gpt_ce_ref_bwd(float *dlogits, const float *logits, const int32_t *tgt, const float *lse,
                    size_t n, int V, float scale) {
  for (size_t r = 0; r < n; r++) {
    const float *x = logits + r * V;
    float *d = dlogits + r * V;
    for (int v = 0; v < V; v++)
      d[v] = gpt_bf16_round(scale * (expf(x[v] - lse[r]) - (v == tgt[r] ? 1.0f : 0.0f)));
  }
}
