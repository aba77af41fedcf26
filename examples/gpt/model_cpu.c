/* examples/gpt/model_cpu.c — the decoder-only transformer on the CPU:
 * forward, backward and cross-entropy for GPT-2 (LayerNorm, GELU tanh,
 * learned positions, tied head) and Llama (RMSNorm, rotary positions,
 * SwiGLU, grouped-query attention). GEMMs through OpenBLAS's cblas_sgemm;
 * parameters and gradients come from a gpt_provider, one group at a time.
 * Owns only activations and scratch, sized once at create. The incremental
 * forward for sampling (gpt_kv) runs the same kernels on the new positions
 * alone, against each layer's cached keys and values.
 */
#include "gpt.h"

#include <cblas.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  float *n1, *mean1, *rstd1;
  float *qkv;  /* GPT-2: rows of [q k v]; Llama: planar q | k | v (after rotary) */
  float *att;  /* [B, H, T, T] softmax probabilities */
  float *ao;   /* [BT, C] attention output before the projection */
  float *xmid; /* [BT, C] residual after attention */
  float *n2, *mean2, *rstd2;
  float *h1, *h2, *h3; /* GPT-2: fc, gelu(fc); Llama: gate, up, silu(gate)*up */
} acts;

struct gpt_model {
  const gpt_schema *s;
  gpt_run_config rc;
  int B, T, BT, C, F, V, H, KV, hd, L;
  float **xres; /* L+1 residual streams [BT, C]: block inputs, then the last output */
  acts *a;      /* per block, or one shared set when checkpointing */
  int n_acts;
  float *nf, *meanf, *rstdf, *logits;
  float *rcos, *rsin; /* [T, hd/2] */
  int32_t *tok, *tgt;
  int have_targets, grads_pending;
  float loss;
  /* backward scratch */
  float *dres, *dtmp, *dn, *dqkv, *dao, *dh1, *dh2, *datt;
  size_t bytes;
  char err[1024]; /* a provider's message whole (the engine's swap file, offset, CRCs) */
};

static int fail(gpt_model *m, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m->err, sizeof m->err, fmt, ap);
  va_end(ap);
  return -1;
}

const char *gpt_model_last_error(const gpt_model *m) { return m ? m->err : ""; }
size_t gpt_model_activation_bytes(const gpt_model *m) { return m->bytes; }
const float *gpt_model_logits(const gpt_model *m) { return m->logits; }

static float *fa(gpt_model *m, size_t n, int *oom) {
  float *p = calloc(n ? n : 1, sizeof(float));
  if (!p) *oom = 1;
  m->bytes += n * sizeof(float);
  return p;
}

static void acts_alloc(gpt_model *m, acts *a, int *oom) {
  size_t BT = (size_t)m->BT, C = (size_t)m->C, F = (size_t)m->F;
  a->n1 = fa(m, BT * C, oom);
  a->mean1 = fa(m, BT, oom);
  a->rstd1 = fa(m, BT, oom);
  a->qkv = fa(m, BT * (C + 2 * (size_t)m->KV * m->hd), oom);
  a->att = fa(m, (size_t)m->B * m->H * m->T * m->T, oom);
  a->ao = fa(m, BT * C, oom);
  a->xmid = fa(m, BT * C, oom);
  a->n2 = fa(m, BT * C, oom);
  a->mean2 = fa(m, BT, oom);
  a->rstd2 = fa(m, BT, oom);
  a->h1 = fa(m, BT * F, oom);
  a->h2 = fa(m, BT * F, oom);
  a->h3 = m->s->cfg.family == GPT_LLAMA ? fa(m, BT * F, oom) : NULL;
}

static void acts_free(acts *a) {
  free(a->n1), free(a->mean1), free(a->rstd1), free(a->qkv), free(a->att), free(a->ao);
  free(a->xmid), free(a->n2), free(a->mean2), free(a->rstd2), free(a->h1), free(a->h2);
  free(a->h3);
}

/* Rotary tables [T, hd/2] as Hugging Face computes them: fp32 inv_freq and angle. */
static void rope_tables(const gpt_config *c, int hd, int T, float *cs, float *sn) {
  int half = hd / 2;
  for (int i = 0; i < half; i++) {
    float inv = (float)(1.0 / pow((double)c->rope_theta, (double)(2 * i) / hd));
    for (int t = 0; t < T; t++) {
      float ang = (float)t * inv;
      cs[t * half + i] = (float)cos((double)ang);
      sn[t * half + i] = (float)sin((double)ang);
    }
  }
}

int gpt_model_create(const gpt_schema *s, const gpt_run_config *rc, gpt_model **out) {
  *out = NULL;
  if (rc->batch < 1 || rc->seq < 1 || rc->seq > s->cfg.max_seq) return -1;
  gpt_model *m = calloc(1, sizeof *m);
  if (!m) return -1;
  const gpt_config *c = &s->cfg;
  m->s = s;
  m->rc = *rc;
  m->B = rc->batch, m->T = rc->seq, m->BT = rc->batch * rc->seq;
  m->C = c->d_model, m->F = c->d_ff, m->V = c->vocab, m->H = c->n_head, m->KV = c->n_kv_head;
  m->hd = c->d_model / c->n_head, m->L = c->n_layer;
  int oom = 0;
  size_t BT = (size_t)m->BT, C = (size_t)m->C;
  m->xres = calloc((size_t)m->L + 1, sizeof *m->xres);
  m->n_acts = rc->checkpoint ? 1 : m->L;
  m->a = calloc((size_t)m->n_acts, sizeof *m->a);
  if (!m->xres || !m->a) oom = 1;
  for (int l = 0; !oom && l <= m->L; l++) m->xres[l] = fa(m, BT * C, &oom);
  for (int l = 0; !oom && l < m->n_acts; l++) acts_alloc(m, &m->a[l], &oom);
  m->nf = fa(m, BT * C, &oom);
  m->meanf = fa(m, BT, &oom);
  m->rstdf = fa(m, BT, &oom);
  m->logits = fa(m, BT * (size_t)m->V, &oom);
  m->rcos = fa(m, (size_t)m->T * (m->hd / 2 + 1), &oom);
  m->rsin = fa(m, (size_t)m->T * (m->hd / 2 + 1), &oom);
  m->tok = calloc(BT, sizeof *m->tok);
  m->tgt = calloc(BT, sizeof *m->tgt);
  if (!m->tok || !m->tgt) oom = 1;
  m->dres = fa(m, BT * C, &oom);
  m->dtmp = fa(m, BT * C, &oom);
  m->dn = fa(m, BT * C, &oom);
  m->dqkv = fa(m, BT * (C + 2 * (size_t)m->KV * m->hd), &oom);
  m->dao = fa(m, BT * C, &oom);
  m->dh1 = fa(m, BT * (size_t)m->F, &oom);
  m->dh2 = fa(m, BT * (size_t)m->F, &oom);
  m->datt = fa(m, (size_t)m->T * m->T, &oom);
  if (oom) {
    gpt_model_free(m);
    return -1;
  }
  if (c->family == GPT_LLAMA) rope_tables(c, m->hd, m->T, m->rcos, m->rsin);
  *out = m;
  return 0;
}

void gpt_model_free(gpt_model *m) {
  if (!m) return;
  if (m->xres)
    for (int l = 0; l <= m->L; l++) free(m->xres[l]);
  free(m->xres);
  if (m->a)
    for (int l = 0; l < m->n_acts; l++) acts_free(&m->a[l]);
  free(m->a);
  free(m->nf), free(m->meanf), free(m->rstdf), free(m->logits), free(m->rcos), free(m->rsin);
  free(m->tok), free(m->tgt), free(m->dres), free(m->dtmp), free(m->dn), free(m->dqkv);
  free(m->dao), free(m->dh1), free(m->dh2), free(m->datt);
  free(m);
}

/* ---- kernels ------------------------------------------------------------------- */

/* y[N,out] = x[N,in] W (+ b). conv1d: W is [in, out] (GPT-2); else [out, in]. */
static void linear_fwd(float *y, const float *x, const float *W, const float *b, int N, int in,
                       int out, int conv1d) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, conv1d ? CblasNoTrans : CblasTrans, N, out, in, 1.0f,
              x, in, W, conv1d ? out : in, 0.0f, y, out);
  if (b)
    for (int n = 0; n < N; n++)
      for (int j = 0; j < out; j++) y[(size_t)n * out + j] += b[j];
}

/* dx (= or +=, by beta) dy W^T; dW += x^T dy (in W's layout); db += sum dy. */
static void linear_bwd(float *dx, float beta, float *dW, float *db, const float *dy,
                       const float *x, const float *W, int N, int in, int out, int conv1d) {
  if (dx)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, conv1d ? CblasTrans : CblasNoTrans, N, in, out, 1.0f,
                dy, out, W, conv1d ? out : in, beta, dx, in);
  if (conv1d)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, out, N, 1.0f, x, in, dy, out, 1.0f,
                dW, out);
  else
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, N, 1.0f, dy, out, x, in, 1.0f,
                dW, in);
  if (db)
    for (int n = 0; n < N; n++)
      for (int j = 0; j < out; j++) db[j] += dy[(size_t)n * out + j];
}

static void layernorm_fwd(float *y, float *mean, float *rstd, const float *x, const float *w,
                          const float *b, int N, int C, float eps) {
  for (int n = 0; n < N; n++) {
    const float *xr = x + (size_t)n * C;
    float *yr = y + (size_t)n * C;
    float mu = 0, var = 0;
    for (int i = 0; i < C; i++) mu += xr[i];
    mu /= (float)C;
    for (int i = 0; i < C; i++) var += (xr[i] - mu) * (xr[i] - mu);
    var /= (float)C;
    float rs = 1.0f / sqrtf(var + eps);
    for (int i = 0; i < C; i++) yr[i] = (xr[i] - mu) * rs * w[i] + b[i];
    mean[n] = mu, rstd[n] = rs;
  }
}

/* dx += d(layernorm)/dx applied to dy; dw, db accumulate. */
static void layernorm_bwd(float *dx, float *dw, float *db, const float *dy, const float *x,
                          const float *mean, const float *rstd, const float *w, int N, int C) {
  for (int n = 0; n < N; n++) {
    const float *xr = x + (size_t)n * C, *dyr = dy + (size_t)n * C;
    float *dxr = dx + (size_t)n * C;
    float mu = mean[n], rs = rstd[n], s1 = 0, s2 = 0;
    for (int i = 0; i < C; i++) {
      float xh = (xr[i] - mu) * rs, dxh = dyr[i] * w[i];
      s1 += dxh;
      s2 += dxh * xh;
    }
    s1 /= (float)C, s2 /= (float)C;
    for (int i = 0; i < C; i++) {
      float xh = (xr[i] - mu) * rs, dxh = dyr[i] * w[i];
      dw[i] += dyr[i] * xh;
      db[i] += dyr[i];
      dxr[i] += rs * (dxh - s1 - xh * s2);
    }
  }
}

static void rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, int N, int C,
                        float eps) {
  for (int n = 0; n < N; n++) {
    const float *xr = x + (size_t)n * C;
    float *yr = y + (size_t)n * C;
    float ss = 0;
    for (int i = 0; i < C; i++) ss += xr[i] * xr[i];
    float rs = 1.0f / sqrtf(ss / (float)C + eps);
    for (int i = 0; i < C; i++) yr[i] = xr[i] * rs * w[i];
    rstd[n] = rs;
  }
}

static void rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *rstd,
                        const float *w, int N, int C) {
  for (int n = 0; n < N; n++) {
    const float *xr = x + (size_t)n * C, *dyr = dy + (size_t)n * C;
    float *dxr = dx + (size_t)n * C;
    float rs = rstd[n], s2 = 0;
    for (int i = 0; i < C; i++) s2 += dyr[i] * w[i] * xr[i] * rs;
    s2 /= (float)C;
    for (int i = 0; i < C; i++) {
      float xh = xr[i] * rs;
      dw[i] += dyr[i] * xh;
      dxr[i] += rs * (dyr[i] * w[i] - xh * s2);
    }
  }
}

#define GELU_S 0.7978845608028654f /* sqrt(2/pi) */

/* tanh through one expf (glibc's tanhf goes through expm1f and was a fifth
 * of a training step); saturates cleanly for large |u|. */
static inline float fast_tanh(float u) {
  if (u > 15.0f) return 1.0f;
  if (u < -15.0f) return -1.0f;
  float e = expf(2.0f * u);
  return (e - 1.0f) / (e + 1.0f);
}

static void gelu_fwd(float *y, const float *x, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float v = x[i];
    y[i] = 0.5f * v * (1.0f + fast_tanh(GELU_S * (v + 0.044715f * v * v * v)));
  }
}

static void gelu_bwd(float *dx, const float *dy, const float *x, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float v = x[i], t = fast_tanh(GELU_S * (v + 0.044715f * v * v * v));
    float d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * GELU_S * (1.0f + 3 * 0.044715f * v * v);
    dx[i] = dy[i] * d;
  }
}

static inline float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Hugging Face's rotate_half rotary on rows of `heads` heads of hd; sign -1
 * applies the inverse rotation (the backward). */
static void rope(float *x, int ld, int BT, int T, int heads, int hd, const float *cs,
                 const float *sn, float sign) {
  int half = hd / 2;
  for (int n = 0; n < BT; n++) {
    int t = n % T;
    for (int h = 0; h < heads; h++) {
      float *p = x + (size_t)n * ld + h * hd;
      for (int i = 0; i < half; i++) {
        float c = cs[t * half + i], s = sign * sn[t * half + i];
        float a = p[i], b = p[i + half];
        p[i] = a * c - b * s;
        p[i + half] = b * c + a * s;
      }
    }
  }
}

typedef struct {
  float *q, *k, *v;
  int ldq, ldk, ldv;
} qkv_view;

static qkv_view qkv_of(const gpt_model *m, float *buf) {
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

/* One head, causal: nq queries at positions t0.. against nk keys (nk >=
 * t0 + nq); S [nq, nk] gets the probabilities, O [nq, hd] (row stride ldo)
 * the output. The full forward has t0 = 0 and nq = nk; the KV cache's step
 * has the cached positions before t0. */
static void attend(float *O, int ldo, float *S, const float *Q, int ldq, const float *K, int ldk,
                   const float *Vv, int ldv, int nq, int nk, int t0, int hd) {
  float scale = 1.0f / sqrtf((float)hd);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hd, scale, Q, ldq, K, ldk, 0.0f, S,
              nk);
  for (int i = 0; i < nq; i++) {
    float *r = S + (size_t)i * nk, mx = -INFINITY, sum = 0;
    int last = t0 + i;
    for (int j = 0; j <= last; j++) mx = r[j] > mx ? r[j] : mx;
    for (int j = 0; j <= last; j++) sum += (r[j] = expf(r[j] - mx));
    float inv = 1.0f / sum;
    for (int j = 0; j <= last; j++) r[j] *= inv;
    for (int j = last + 1; j < nk; j++) r[j] = 0;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hd, nk, 1.0f, S, nk, Vv, ldv, 0.0f, O,
              ldo);
}

static void attention_fwd(gpt_model *m, float *ao, float *att, qkv_view x) {
  int T = m->T, hd = m->hd, H = m->H, grp = m->H / m->KV;
  for (int b = 0; b < m->B; b++)
    for (int h = 0; h < H; h++)
      attend(ao + (size_t)b * T * m->C + h * hd, m->C, att + ((size_t)b * H + h) * T * T,
             x.q + (size_t)b * T * x.ldq + h * hd, x.ldq,
             x.k + (size_t)b * T * x.ldk + (h / grp) * hd, x.ldk,
             x.v + (size_t)b * T * x.ldv + (h / grp) * hd, x.ldv, T, T, 0, hd);
}

/* dx (zeroed here) from dao; att holds the forward probabilities. */
static void attention_bwd(gpt_model *m, qkv_view dx, const float *dao, const float *att,
                          qkv_view x) {
  int T = m->T, hd = m->hd, H = m->H, grp = m->H / m->KV;
  float scale = 1.0f / sqrtf((float)hd);
  float *dP = m->datt;
  for (int b = 0; b < m->B; b++)
    for (int h = 0; h < H; h++) {
      size_t qo = (size_t)b * T * x.ldq + h * hd;
      size_t ko = (size_t)b * T * x.ldk + (h / grp) * hd;
      size_t vo = (size_t)b * T * x.ldv + (h / grp) * hd;
      const float *P = att + ((size_t)b * H + h) * T * T;
      const float *dO = dao + (size_t)b * T * m->C + h * hd;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hd, 1.0f, dO, m->C, x.v + vo,
                  x.ldv, 0.0f, dP, T);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hd, T, 1.0f, P, T, dO, m->C, 1.0f,
                  dx.v + vo, dx.ldv);
      for (int i = 0; i < T; i++) {
        const float *pr = P + (size_t)i * T;
        float *dr = dP + (size_t)i * T, dot = 0;
        for (int j = 0; j <= i; j++) dot += pr[j] * dr[j];
        for (int j = 0; j <= i; j++) dr[j] = pr[j] * (dr[j] - dot);
        for (int j = i + 1; j < T; j++) dr[j] = 0;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, T, scale, dP, T, x.k + ko,
                  x.ldk, 0.0f, dx.q + qo, dx.ldq);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hd, T, scale, dP, T, x.q + qo, x.ldq,
                  1.0f, dx.k + ko, dx.ldk);
    }
}

/* ---- blocks ---------------------------------------------------------------------- */

/* The first norm and the q, k, v projections of BT rows of x into a->qkv
 * (Llama: before the rotary). */
static void block_qkv(gpt_model *m, acts *a, const gpt_group_view *g, const float *x, int BT) {
  const gpt_config *c = &m->s->cfg;
  int C = m->C;
  if (c->family == GPT_GPT2) {
    layernorm_fwd(a->n1, a->mean1, a->rstd1, x, g->w[G2_LN1_W], g->w[G2_LN1_B], BT, C, c->norm_eps);
    linear_fwd(a->qkv, a->n1, g->w[G2_QKV_W], g->w[G2_QKV_B], BT, C, 3 * C, 1);
  } else {
    int kv = m->KV * m->hd;
    qkv_view q = qkv_of(m, a->qkv);
    rmsnorm_fwd(a->n1, a->rstd1, x, g->w[LL_IN_NORM], BT, C, c->norm_eps);
    linear_fwd(q.q, a->n1, g->w[LL_Q], NULL, BT, C, C, 0);
    linear_fwd(q.k, a->n1, g->w[LL_K], NULL, BT, C, kv, 0);
    linear_fwd(q.v, a->n1, g->w[LL_V], NULL, BT, C, kv, 0);
  }
}

/* From the attention output a->ao of BT rows: the projection, the MLP and
 * both residuals into y. */
static void block_out(gpt_model *m, acts *a, const gpt_group_view *g, const float *x, float *y,
                      int BT) {
  const gpt_config *c = &m->s->cfg;
  int C = m->C, F = m->F;
  size_t n = (size_t)BT * C;
  if (c->family == GPT_GPT2) {
    linear_fwd(a->xmid, a->ao, g->w[G2_ATTO_W], g->w[G2_ATTO_B], BT, C, C, 1);
    for (size_t i = 0; i < n; i++) a->xmid[i] += x[i];
    layernorm_fwd(a->n2, a->mean2, a->rstd2, a->xmid, g->w[G2_LN2_W], g->w[G2_LN2_B], BT, C,
                  c->norm_eps);
    linear_fwd(a->h1, a->n2, g->w[G2_FC_W], g->w[G2_FC_B], BT, C, F, 1);
    gelu_fwd(a->h2, a->h1, (size_t)BT * F);
    linear_fwd(y, a->h2, g->w[G2_FCO_W], g->w[G2_FCO_B], BT, F, C, 1);
  } else {
    linear_fwd(a->xmid, a->ao, g->w[LL_O], NULL, BT, C, C, 0);
    for (size_t i = 0; i < n; i++) a->xmid[i] += x[i];
    rmsnorm_fwd(a->n2, a->rstd2, a->xmid, g->w[LL_POST_NORM], BT, C, c->norm_eps);
    linear_fwd(a->h1, a->n2, g->w[LL_GATE], NULL, BT, C, F, 0);
    linear_fwd(a->h2, a->n2, g->w[LL_UP], NULL, BT, C, F, 0);
    for (size_t i = 0; i < (size_t)BT * F; i++) a->h3[i] = a->h1[i] * sigm(a->h1[i]) * a->h2[i];
    linear_fwd(y, a->h3, g->w[LL_DOWN], NULL, BT, F, C, 0);
  }
  for (size_t i = 0; i < n; i++) y[i] += a->xmid[i];
}

static void block_fwd(gpt_model *m, acts *a, const gpt_group_view *g, const float *x, float *y) {
  qkv_view q = qkv_of(m, a->qkv);
  block_qkv(m, a, g, x, m->BT);
  if (m->s->cfg.family == GPT_LLAMA) {
    rope(q.q, q.ldq, m->BT, m->T, m->H, m->hd, m->rcos, m->rsin, 1.0f);
    rope(q.k, q.ldk, m->BT, m->T, m->KV, m->hd, m->rcos, m->rsin, 1.0f);
  }
  attention_fwd(m, a->ao, a->att, q);
  block_out(m, a, g, x, y, m->BT);
}

/* m->dres holds d(out); on return d(in). Gradients added into g->g. */
static void block_bwd(gpt_model *m, acts *a, const gpt_group_view *g, const float *x) {
  int BT = m->BT, C = m->C, F = m->F;
  size_t nf = (size_t)BT * F;
  float *dres = m->dres;
  if (m->s->cfg.family == GPT_GPT2) {
    linear_bwd(m->dh2, 0.0f, g->g[G2_FCO_W], g->g[G2_FCO_B], dres, a->h2, g->w[G2_FCO_W], BT, F,
               C, 1);
    gelu_bwd(m->dh1, m->dh2, a->h1, nf);
    linear_bwd(m->dn, 0.0f, g->g[G2_FC_W], g->g[G2_FC_B], m->dh1, a->n2, g->w[G2_FC_W], BT, C, F,
               1);
    layernorm_bwd(dres, g->g[G2_LN2_W], g->g[G2_LN2_B], m->dn, a->xmid, a->mean2, a->rstd2,
                  g->w[G2_LN2_W], BT, C);
    linear_bwd(m->dao, 0.0f, g->g[G2_ATTO_W], g->g[G2_ATTO_B], dres, a->ao, g->w[G2_ATTO_W], BT,
               C, C, 1);
    memset(m->dqkv, 0, (size_t)BT * 3 * C * sizeof(float));
    attention_bwd(m, qkv_of(m, m->dqkv), m->dao, a->att, qkv_of(m, a->qkv));
    linear_bwd(m->dn, 0.0f, g->g[G2_QKV_W], g->g[G2_QKV_B], m->dqkv, a->n1, g->w[G2_QKV_W], BT, C,
               3 * C, 1);
    layernorm_bwd(dres, g->g[G2_LN1_W], g->g[G2_LN1_B], m->dn, x, a->mean1, a->rstd1,
                  g->w[G2_LN1_W], BT, C);
  } else {
    int kv = m->KV * m->hd;
    linear_bwd(m->dh2, 0.0f, g->g[LL_DOWN], NULL, dres, a->h3, g->w[LL_DOWN], BT, F, C, 0);
    /* dh2 = d(h3): split into d(gate) (dh1) and d(up) (in place in dh2) */
    for (size_t i = 0; i < nf; i++) {
      float gt = a->h1[i], sg = sigm(gt), d = m->dh2[i];
      m->dh1[i] = d * a->h2[i] * sg * (1.0f + gt * (1.0f - sg));
      m->dh2[i] = d * gt * sg;
    }
    linear_bwd(m->dn, 0.0f, g->g[LL_GATE], NULL, m->dh1, a->n2, g->w[LL_GATE], BT, C, F, 0);
    linear_bwd(m->dn, 1.0f, g->g[LL_UP], NULL, m->dh2, a->n2, g->w[LL_UP], BT, C, F, 0);
    rmsnorm_bwd(dres, g->g[LL_POST_NORM], m->dn, a->xmid, a->rstd2, g->w[LL_POST_NORM], BT, C);
    linear_bwd(m->dao, 0.0f, g->g[LL_O], NULL, dres, a->ao, g->w[LL_O], BT, C, C, 0);
    memset(m->dqkv, 0, (size_t)BT * (C + 2 * kv) * sizeof(float));
    qkv_view dq = qkv_of(m, m->dqkv), q = qkv_of(m, a->qkv);
    attention_bwd(m, dq, m->dao, a->att, q);
    rope(dq.q, dq.ldq, BT, m->T, m->H, m->hd, m->rcos, m->rsin, -1.0f);
    rope(dq.k, dq.ldk, BT, m->T, m->KV, m->hd, m->rcos, m->rsin, -1.0f);
    linear_bwd(m->dn, 0.0f, g->g[LL_Q], NULL, dq.q, a->n1, g->w[LL_Q], BT, C, C, 0);
    linear_bwd(m->dn, 1.0f, g->g[LL_K], NULL, dq.k, a->n1, g->w[LL_K], BT, C, kv, 0);
    linear_bwd(m->dn, 1.0f, g->g[LL_V], NULL, dq.v, a->n1, g->w[LL_V], BT, C, kv, 0);
    rmsnorm_bwd(dres, g->g[LL_IN_NORM], m->dn, x, a->rstd1, g->w[LL_IN_NORM], BT, C);
  }
}

/* ---- passes ---------------------------------------------------------------------------- */

#define FETCH(grp, mode, view)                                                                  \
  do {                                                                                          \
    if (p->fetch(p->ctx, (grp), (mode), (view)))                                                \
      return fail(m, "fetch of group %d failed: %s", (grp), p->last_error ? p->last_error(p->ctx) \
                                                                        : "");                  \
    if ((view)->wdt != FERRY_DT_F32)                                                            \
      return fail(m, "group %d: the CPU model reads fp32 weights, the provider gave dtype %d "   \
                  "(use the engine provider's synchronous mode)", (grp), (int)(view)->wdt);     \
  } while (0)
#define RELEASE(grp, mode)                                                                      \
  do {                                                                                          \
    if (p->release(p->ctx, (grp), (mode)))                                                      \
      return fail(m, "release of group %d failed: %s", (grp),                                   \
                  p->last_error ? p->last_error(p->ctx) : "");                                  \
  } while (0)

static const float *head_weight(const gpt_model *m, const gpt_group_view *emb,
                                const gpt_group_view *head) {
  if (m->s->cfg.family == GPT_GPT2) return emb->w[G2_WTE];
  return m->s->cfg.tied ? emb->w[LL_EMB] : head->w[LL_HEAD];
}

static int check_tokens(gpt_model *m, const int32_t *tokens, const int32_t *targets, int BT) {
  for (int i = 0; i < BT; i++) {
    if (tokens[i] < 0 || tokens[i] >= m->V)
      return fail(m, "token %d out of range (vocab %d)", tokens[i], m->V);
    if (targets && (targets[i] < 0 || targets[i] >= m->V))
      return fail(m, "target %d out of range (vocab %d)", targets[i], m->V);
  }
  return 0;
}

/* xres[0] of BT rows: the token embeddings, plus (GPT-2) the learned
 * position of row n, t0 + n % T. */
static int embed_fwd(gpt_model *m, gpt_provider *p, const int32_t *tokens, int BT, int t0, int T) {
  const gpt_config *c = &m->s->cfg;
  int C = m->C;
  gpt_group_view e;
  FETCH(0, GPT_FETCH_FORWARD, &e);
  float *x = m->xres[0];
  for (int n = 0; n < BT; n++) {
    const float *te = e.w[0] + (size_t)tokens[n] * C;
    const float *pe = c->family == GPT_GPT2 ? e.w[G2_WPE] + (size_t)(t0 + n % T) * C : NULL;
    for (int i = 0; i < C; i++) x[(size_t)n * C + i] = te[i] + (pe ? pe[i] : 0.0f);
  }
  RELEASE(0, GPT_RELEASE_FORWARD);
  return 0;
}

/* The final norm of xres[L]'s BT rows and the head: m->logits [BT, V]. */
static int head_fwd(gpt_model *m, gpt_provider *p, int BT) {
  const gpt_config *c = &m->s->cfg;
  gpt_group_view e = {0}, h;
  int hg = m->L + 1, need_emb = c->family == GPT_GPT2 || c->tied;
  FETCH(hg, GPT_FETCH_FORWARD, &h);
  if (need_emb) FETCH(0, GPT_FETCH_FORWARD, &e);
  if (c->family == GPT_GPT2)
    layernorm_fwd(m->nf, m->meanf, m->rstdf, m->xres[m->L], h.w[G2_LNF_W], h.w[G2_LNF_B], BT,
                  m->C, c->norm_eps);
  else
    rmsnorm_fwd(m->nf, m->rstdf, m->xres[m->L], h.w[LL_NORM], BT, m->C, c->norm_eps);
  linear_fwd(m->logits, m->nf, head_weight(m, &e, &h), NULL, BT, m->C, m->V, 0);
  if (need_emb) RELEASE(0, GPT_RELEASE_FORWARD);
  RELEASE(hg, GPT_RELEASE_FORWARD);
  return 0;
}

int gpt_model_forward(gpt_model *m, gpt_provider *p, const int32_t *tokens,
                      const int32_t *targets, float *loss) {
  int BT = m->BT, V = m->V;
  if (check_tokens(m, tokens, targets, BT)) return -1;
  memcpy(m->tok, tokens, (size_t)BT * sizeof *tokens);
  m->have_targets = targets != NULL;
  if (targets) memcpy(m->tgt, targets, (size_t)BT * sizeof *targets);
  gpt_group_view g;
  if (embed_fwd(m, p, tokens, BT, 0, m->T)) return -1;
  for (int l = 0; l < m->L; l++) {
    FETCH(1 + l, GPT_FETCH_FORWARD, &g);
    block_fwd(m, &m->a[m->rc.checkpoint ? 0 : l], &g, m->xres[l], m->xres[l + 1]);
    RELEASE(1 + l, GPT_RELEASE_FORWARD);
  }
  if (head_fwd(m, p, BT)) return -1;
  if (targets) {
    double sum = 0;
    for (int n = 0; n < BT; n++) {
      const float *r = m->logits + (size_t)n * V;
      float mx = -INFINITY;
      for (int v = 0; v < V; v++) mx = r[v] > mx ? r[v] : mx;
      double s = 0;
      for (int v = 0; v < V; v++) s += exp((double)(r[v] - mx));
      sum += log(s) + mx - r[targets[n]];
    }
    m->loss = (float)(sum / BT);
    if (loss) *loss = m->loss;
  }
  m->grads_pending = targets != NULL;
  return 0;
}

int gpt_model_backward(gpt_model *m, gpt_provider *p) {
  if (!m->grads_pending) return fail(m, "backward without a forward with targets");
  m->grads_pending = 0;
  const gpt_config *c = &m->s->cfg;
  int BT = m->BT, C = m->C, V = m->V;
  /* dlogits in place of the logits: (softmax - onehot) / BT */
  for (int n = 0; n < BT; n++) {
    float *r = m->logits + (size_t)n * V, mx = -INFINITY;
    for (int v = 0; v < V; v++) mx = r[v] > mx ? r[v] : mx;
    double s = 0;
    for (int v = 0; v < V; v++) s += exp((double)(r[v] - mx));
    float inv = (float)(1.0 / s);
    for (int v = 0; v < V; v++) r[v] = expf(r[v] - mx) * inv / (float)BT;
    r[m->tgt[n]] -= 1.0f / (float)BT;
  }
  gpt_group_view e, h, g;
  int hg = m->L + 1, need_emb = c->family == GPT_GPT2 || c->tied;
  FETCH(hg, GPT_FETCH_BACKWARD, &h);
  if (need_emb) FETCH(0, GPT_FETCH_BACKWARD, &e);
  float *dW = c->family == GPT_GPT2 ? e.g[G2_WTE] : c->tied ? e.g[LL_EMB] : h.g[LL_HEAD];
  linear_bwd(m->dn, 0.0f, dW, NULL, m->logits, m->nf, head_weight(m, &e, &h), BT, C, V, 0);
  memset(m->dres, 0, (size_t)BT * C * sizeof(float));
  if (c->family == GPT_GPT2)
    layernorm_bwd(m->dres, h.g[G2_LNF_W], h.g[G2_LNF_B], m->dn, m->xres[m->L], m->meanf, m->rstdf,
                  h.w[G2_LNF_W], BT, C);
  else
    rmsnorm_bwd(m->dres, h.g[LL_NORM], m->dn, m->xres[m->L], m->rstdf, h.w[LL_NORM], BT, C);
  if (need_emb) RELEASE(0, GPT_RELEASE_PARTIAL);
  RELEASE(hg, GPT_RELEASE_GRADS);
  for (int l = m->L - 1; l >= 0; l--) {
    FETCH(1 + l, GPT_FETCH_BACKWARD, &g);
    acts *a = &m->a[m->rc.checkpoint ? 0 : l];
    if (m->rc.checkpoint) block_fwd(m, a, &g, m->xres[l], m->dtmp); /* recompute */
    block_bwd(m, a, &g, m->xres[l]);
    RELEASE(1 + l, GPT_RELEASE_GRADS);
  }
  FETCH(0, GPT_FETCH_BACKWARD, &e);
  for (int n = 0; n < BT; n++) {
    float *te = e.g[0] + (size_t)m->tok[n] * C;
    float *pe = c->family == GPT_GPT2 ? e.g[G2_WPE] + (size_t)(n % m->T) * C : NULL;
    const float *d = m->dres + (size_t)n * C;
    for (int i = 0; i < C; i++) {
      te[i] += d[i];
      if (pe) pe[i] += d[i];
    }
  }
  RELEASE(0, GPT_RELEASE_GRADS);
  return 0;
}

/* ---- the incremental forward (KV cache) -------------------------------------------- */

struct gpt_kv {
  gpt_model *m;       /* batch 1, seq = rows: the scratch of one call's new rows */
  int max_pos, pos;   /* positions the cache holds at most; positions seen */
  int rows;           /* rows of the last call (its logits) */
  float **kc, **vc;   /* per layer [max_pos, KV*hd]: keys (after rotary) and values */
  float *S;           /* [rows, max_pos] attention probabilities of one head */
  float *rcos, *rsin; /* [max_pos, hd/2] */
};

int gpt_kv_create(const gpt_schema *s, int max_pos, gpt_kv **out) {
  *out = NULL;
  const gpt_config *c = &s->cfg;
  if (max_pos < 1 || max_pos > c->max_seq) return -1;
  gpt_kv *kv = calloc(1, sizeof *kv);
  if (!kv) return -1;
  *out = kv;
  kv->max_pos = max_pos;
  int rows = max_pos < GPT_KV_ROWS ? max_pos : GPT_KV_ROWS;
  gpt_run_config rc = {.batch = 1, .seq = rows, .checkpoint = 1};
  if (gpt_model_create(s, &rc, &kv->m)) {
    gpt_kv_free(kv);
    *out = NULL;
    return -1;
  }
  gpt_model *m = kv->m;
  int oom = 0;
  size_t kvd = (size_t)m->KV * m->hd, half = (size_t)m->hd / 2 + 1;
  kv->kc = calloc((size_t)m->L, sizeof *kv->kc);
  kv->vc = calloc((size_t)m->L, sizeof *kv->vc);
  if (!kv->kc || !kv->vc) oom = 1;
  for (int l = 0; !oom && l < m->L; l++) {
    kv->kc[l] = fa(m, (size_t)max_pos * kvd, &oom);
    kv->vc[l] = fa(m, (size_t)max_pos * kvd, &oom);
  }
  kv->S = fa(m, (size_t)rows * max_pos, &oom);
  kv->rcos = fa(m, (size_t)max_pos * half, &oom);
  kv->rsin = fa(m, (size_t)max_pos * half, &oom);
  if (oom) {
    gpt_kv_free(kv);
    *out = NULL;
    return -1;
  }
  if (c->family == GPT_LLAMA) rope_tables(c, m->hd, max_pos, kv->rcos, kv->rsin);
  return 0;
}

void gpt_kv_free(gpt_kv *kv) {
  if (!kv) return;
  if (kv->m)
    for (int l = 0; l < kv->m->L; l++) {
      if (kv->kc) free(kv->kc[l]);
      if (kv->vc) free(kv->vc[l]);
    }
  free(kv->kc), free(kv->vc), free(kv->S), free(kv->rcos), free(kv->rsin);
  gpt_model_free(kv->m);
  free(kv);
}

void gpt_kv_reset(gpt_kv *kv) { kv->pos = kv->rows = 0; }
int gpt_kv_pos(const gpt_kv *kv) { return kv->pos; }
int gpt_kv_rows(const gpt_kv *kv) { return kv->rows; }
int gpt_kv_max_pos(const gpt_kv *kv) { return kv->max_pos; }
int gpt_kv_max_rows(const gpt_kv *kv) { return kv->m->T; }
const float *gpt_kv_logits(const gpt_kv *kv) { return kv->m->logits; }
const char *gpt_kv_last_error(const gpt_kv *kv) { return kv->m->err; }
size_t gpt_kv_bytes(const gpt_kv *kv) { return kv->m->bytes; }

/* Block l on n new rows at positions pos..pos+n-1: their keys and values
 * join the cache, their queries attend to every cached position up to
 * their own. The same kernels as block_fwd, in the same order. */
static void kv_block(gpt_kv *kv, int l, const gpt_group_view *g, const float *x, float *y, int n) {
  gpt_model *m = kv->m;
  acts *a = &m->a[0];
  int t0 = kv->pos, hd = m->hd, half = hd / 2, kvd = m->KV * hd, grp = m->H / m->KV;
  qkv_view q = qkv_of(m, a->qkv);
  block_qkv(m, a, g, x, n);
  if (m->s->cfg.family == GPT_LLAMA) {
    rope(q.q, q.ldq, n, n, m->H, hd, kv->rcos + (size_t)t0 * half, kv->rsin + (size_t)t0 * half,
         1.0f);
    rope(q.k, q.ldk, n, n, m->KV, hd, kv->rcos + (size_t)t0 * half, kv->rsin + (size_t)t0 * half,
         1.0f);
  }
  for (int i = 0; i < n; i++) {
    memcpy(kv->kc[l] + (size_t)(t0 + i) * kvd, q.k + (size_t)i * q.ldk, (size_t)kvd * sizeof(float));
    memcpy(kv->vc[l] + (size_t)(t0 + i) * kvd, q.v + (size_t)i * q.ldv, (size_t)kvd * sizeof(float));
  }
  for (int h = 0; h < m->H; h++)
    attend(a->ao + h * hd, m->C, kv->S, q.q + h * hd, q.ldq, kv->kc[l] + (h / grp) * hd, kvd,
           kv->vc[l] + (h / grp) * hd, kvd, n, t0 + n, t0, hd);
  block_out(m, a, g, x, y, n);
}

int gpt_kv_forward(gpt_kv *kv, gpt_provider *p, const int32_t *tokens, int n) {
  gpt_model *m = kv->m;
  if (n < 1 || n > m->T) return fail(m, "%d rows in one call (1 to %d)", n, m->T);
  if (kv->pos + n > kv->max_pos)
    return fail(m, "the context is full (%d positions, %d more asked)", kv->max_pos, n);
  if (check_tokens(m, tokens, NULL, n)) return -1;
  if (embed_fwd(m, p, tokens, n, kv->pos, n)) return -1;
  gpt_group_view g;
  for (int l = 0; l < m->L; l++) {
    FETCH(1 + l, GPT_FETCH_FORWARD, &g);
    kv_block(kv, l, &g, m->xres[l], m->xres[l + 1], n);
    RELEASE(1 + l, GPT_RELEASE_FORWARD);
  }
  if (head_fwd(m, p, n)) return -1;
  kv->pos += n;
  kv->rows = n;
  return 0;
}
