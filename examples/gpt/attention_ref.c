/* examples/gpt/attention_ref.c — the CPU references of causal attention
 * (gpt_attn.h): the shape check the CUDA kernels share, a naive forward and
 * backward that materialize each row's softmax (double accumulation), and a
 * tiled one in fp32 that visits the CUDA kernels' tiles in their order:
 * forward with online softmax over GPT_ATTN_BR x GPT_ATTN_BC tiles keeping
 * the log-sum-exp; backward from lse with delta = rowsum(dout * o), P
 * rebuilt per tile, dk/dv per key tile over the group's query heads and the
 * query tiles from the diagonal down, dq per query tile.
 */
#include "gpt_attn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BR = GPT_ATTN_BR, BC = GPT_ATTN_BC, HD_MAX = 128 };

int gpt_attn_check(const gpt_attn_shape *s, char *why, size_t len) {
  const char *r = NULL;
  if (!s)
    r = "no shape";
  else if (s->B < 1 || s->T < 1 || s->H < 1 || s->KV < 1)
    r = "B, T, H and KV must be positive";
  else if (s->H % s->KV)
    r = "heads must be a multiple of kv heads";
  else if (s->hd < 16 || s->hd > HD_MAX || s->hd % 16)
    r = "head dim must be 16, 32, ... 128";
  else if (s->ldq < (long)s->H * s->hd || s->ldo < (long)s->H * s->hd)
    r = "ldq and ldo must be at least heads * head dim";
  else if (s->ldk < (long)s->KV * s->hd || s->ldv < (long)s->KV * s->hd)
    r = "ldk and ldv must be at least kv heads * head dim";
  else if (!(s->scale > 0.0f) || !isfinite(s->scale))
    r = "scale must be positive and finite";
  if (!r) return 0;
  if (why && len) snprintf(why, len, "attention shape: %s", r);
  return -1;
}

/* row n = b T + t; head h's columns start at h hd */
static long at(long ld, int b, int T, int t, int head, int hd) {
  return ((long)b * T + t) * ld + (long)head * hd;
}
static long lse_at(const gpt_attn_shape *s, int b, int h, int t) {
  return ((long)b * s->H + h) * s->T + t;
}

static void fill_nan(float *p, long ld, const gpt_attn_shape *s, int heads) {
  for (long n = 0; n < (long)s->B * s->T; n++)
    for (int c = 0; c < heads * s->hd; c++)
      p[n * ld + c] = NAN;
}

/* ---- naive ------------------------------------------------------------------- */

/* P row t of (b, h) into p[0..t] (double), its log-sum-exp returned */
static double naive_row(const gpt_attn_shape *s, const float *q, const float *k, int b, int h,
                        int t, double *p) {
  int g = h / (s->H / s->KV), hd = s->hd;
  const float *qi = q + at(s->ldq, b, s->T, t, h, hd);
  double mx = -INFINITY, sum = 0;
  for (int j = 0; j <= t; j++) {
    const float *kj = k + at(s->ldk, b, s->T, j, g, hd);
    double d = 0;
    for (int c = 0; c < hd; c++)
      d += (double)qi[c] * kj[c];
    p[j] = d * s->scale;
    if (p[j] > mx) mx = p[j];
  }
  for (int j = 0; j <= t; j++)
    sum += (p[j] = exp(p[j] - mx));
  for (int j = 0; j <= t; j++)
    p[j] /= sum;
  return mx + log(sum);
}

void gpt_attn_naive_fwd(const gpt_attn_shape *s, const float *q, const float *k, const float *v,
                        float *o, float *lse) {
  double *p = malloc((size_t)s->T * sizeof *p);
  if (!p) { /* no status in the contract: NaN outputs fail any comparison */
    fill_nan(o, s->ldo, s, s->H);
    return;
  }
  int hd = s->hd;
  for (int b = 0; b < s->B; b++)
    for (int h = 0; h < s->H; h++)
      for (int t = 0; t < s->T; t++) {
        int g = h / (s->H / s->KV);
        lse[lse_at(s, b, h, t)] = (float)naive_row(s, q, k, b, h, t, p);
        float *oi = o + at(s->ldo, b, s->T, t, h, hd);
        for (int c = 0; c < hd; c++) {
          double acc = 0;
          for (int j = 0; j <= t; j++)
            acc += p[j] * v[at(s->ldv, b, s->T, j, g, hd) + c];
          oi[c] = (float)acc;
        }
      }
  free(p);
}

/* dS_ij = P_ij (dP_ij - sum_l P_il dP_il), dP_ij = dout_i . v_j;
 * dq_i = scale sum_j dS_ij k_j; dk_j, dv_j summed over rows and the group's heads */
void gpt_attn_naive_bwd(const gpt_attn_shape *s, const float *q, const float *k, const float *v,
                        const float *dout, float *dq, float *dk, float *dv) {
  int T = s->T, hd = s->hd, grp = s->H / s->KV;
  double *p = malloc((size_t)T * sizeof *p), *dp = malloc((size_t)T * sizeof *dp);
  double *ak = calloc((size_t)T * hd, sizeof *ak), *av = calloc((size_t)T * hd, sizeof *av);
  if (!p || !dp || !ak || !av) {
    free(p), free(dp), free(ak), free(av);
    fill_nan(dq, s->ldq, s, s->H), fill_nan(dk, s->ldk, s, s->KV), fill_nan(dv, s->ldv, s, s->KV);
    return;
  }
  for (int b = 0; b < s->B; b++)
    for (int g = 0; g < s->KV; g++) {
      memset(ak, 0, (size_t)T * hd * sizeof *ak);
      memset(av, 0, (size_t)T * hd * sizeof *av);
      for (int h = g * grp; h < (g + 1) * grp; h++)
        for (int i = 0; i < T; i++) {
          naive_row(s, q, k, b, h, i, p);
          const float *doi = dout + at(s->ldo, b, T, i, h, hd);
          const float *qi = q + at(s->ldq, b, T, i, h, hd);
          double D = 0;
          for (int j = 0; j <= i; j++) {
            const float *vj = v + at(s->ldv, b, T, j, g, hd);
            double d = 0;
            for (int c = 0; c < hd; c++)
              d += (double)doi[c] * vj[c];
            dp[j] = d;
            D += p[j] * d;
          }
          float *dqi = dq + at(s->ldq, b, T, i, h, hd);
          for (int c = 0; c < hd; c++) {
            double acc = 0;
            for (int j = 0; j <= i; j++)
              acc += p[j] * (dp[j] - D) * k[at(s->ldk, b, T, j, g, hd) + c];
            dqi[c] = (float)(acc * s->scale);
          }
          for (int j = 0; j <= i; j++) {
            double ds = p[j] * (dp[j] - D) * s->scale;
            for (int c = 0; c < hd; c++) {
              ak[(long)j * hd + c] += ds * qi[c];
              av[(long)j * hd + c] += p[j] * doi[c];
            }
          }
        }
      for (int j = 0; j < T; j++)
        for (int c = 0; c < hd; c++) {
          dk[at(s->ldk, b, T, j, g, hd) + c] = (float)ak[(long)j * hd + c];
          dv[at(s->ldv, b, T, j, g, hd) + c] = (float)av[(long)j * hd + c];
        }
    }
  free(p), free(dp), free(ak), free(av);
}

/* ---- tiled (the CUDA kernels' order, fp32) --------------------------------------- */

/* out[r][c] = sum_d a_r[d] b_c[d] over rows r < nr, c < nc of two strided
 * operands (the S = Q K^T and dP = dO V^T of one tile pair) */
static void tile_dots(const float *a, long lda, int nr, const float *bm, long ldb, int nc, int hd,
                      float out[BR][BC]) {
  for (int r = 0; r < nr; r++)
    for (int c = 0; c < nc; c++) {
      float d = 0;
      for (int e = 0; e < hd; e++)
        d += a[r * lda + e] * bm[c * ldb + e];
      out[r][c] = d;
    }
}

void gpt_attn_ref_fwd(const gpt_attn_shape *s, const float *q, const float *k, const float *v,
                      float *o, float *lse) {
  int T = s->T, hd = s->hd, grp = s->H / s->KV;
  float S[BR][BC], acc[BR][HD_MAX]; /* 48 KiB of stack */
  float m[BR], l[BR];
  for (int b = 0; b < s->B; b++)
    for (int h = 0; h < s->H; h++)
      for (int i0 = 0; i0 < T; i0 += BR) {
        int g = h / grp, nr = T - i0 < BR ? T - i0 : BR;
        for (int r = 0; r < nr; r++) {
          m[r] = -INFINITY, l[r] = 0;
          for (int c = 0; c < hd; c++)
            acc[r][c] = 0;
        }
        for (int j0 = 0; j0 < i0 + nr; j0 += BC) { /* key tiles up to the diagonal */
          int nc = T - j0 < BC ? T - j0 : BC;
          tile_dots(q + at(s->ldq, b, T, i0, h, hd), s->ldq, nr, k + at(s->ldk, b, T, j0, g, hd),
                    s->ldk, nc, hd, S);
          for (int r = 0; r < nr; r++) {
            float mx = m[r];
            for (int c = 0; c < nc; c++) {
              S[r][c] = j0 + c <= i0 + r ? S[r][c] * s->scale : -INFINITY;
              if (S[r][c] > mx) mx = S[r][c];
            }
            float alpha = expf(m[r] - mx), sum = 0; /* m[r] = -inf first: alpha 0 */
            for (int c = 0; c < nc; c++)
              sum += (S[r][c] = expf(S[r][c] - mx));
            l[r] = l[r] * alpha + sum;
            m[r] = mx;
            for (int e = 0; e < hd; e++) {
              float a = acc[r][e] * alpha;
              for (int c = 0; c < nc; c++)
                a += S[r][c] * v[at(s->ldv, b, T, j0 + c, g, hd) + e];
              acc[r][e] = a;
            }
          }
        }
        for (int r = 0; r < nr; r++) {
          float *oi = o + at(s->ldo, b, T, i0 + r, h, hd);
          for (int e = 0; e < hd; e++)
            oi[e] = acc[r][e] / l[r];
          lse[lse_at(s, b, h, i0 + r)] = m[r] + logf(l[r]);
        }
      }
}

/* P and dS of the tile pair (q rows i0.., keys j0..) of head h, from lse and
 * delta: P[r][c] = exp(scale S - lse), 0 above the diagonal; dS = P (dP - delta) */
static void tile_grads(const gpt_attn_shape *s, const float *q, const float *k, const float *v,
                       const float *dout, const float *lse_h, const float *delta, int b, int h,
                       int i0, int nr, int j0, int nc, float P[BR][BC], float dS[BR][BC]) {
  int T = s->T, hd = s->hd, g = h / (s->H / s->KV);
  tile_dots(q + at(s->ldq, b, T, i0, h, hd), s->ldq, nr, k + at(s->ldk, b, T, j0, g, hd), s->ldk,
            nc, hd, P);
  tile_dots(dout + at(s->ldo, b, T, i0, h, hd), s->ldo, nr, v + at(s->ldv, b, T, j0, g, hd), s->ldv,
            nc, hd, dS);
  for (int r = 0; r < nr; r++)
    for (int c = 0; c < nc; c++) {
      float p = j0 + c <= i0 + r ? expf(P[r][c] * s->scale - lse_h[i0 + r]) : 0.0f;
      P[r][c] = p;
      dS[r][c] = p * (dS[r][c] - delta[r]);
    }
}

/* delta[r] = dout_i . o_i for the nr rows of a q tile */
static void tile_delta(const gpt_attn_shape *s, const float *o, const float *dout, int b, int h,
                       int i0, int nr, float *delta) {
  for (int r = 0; r < nr; r++) {
    const float *oi = o + at(s->ldo, b, s->T, i0 + r, h, s->hd);
    const float *di = dout + at(s->ldo, b, s->T, i0 + r, h, s->hd);
    float d = 0;
    for (int e = 0; e < s->hd; e++)
      d += oi[e] * di[e];
    delta[r] = d;
  }
}

/* dk, dv: per key tile of one kv head, over the group's query heads and the
 * q tiles from the diagonal down (attention_cuda.cu's k_attn_bwd_dkdv) */
static void ref_bwd_dkdv(const gpt_attn_shape *s, const float *q, const float *k, const float *v,
                         const float *o, const float *dout, const float *lse, float *dk,
                         float *dv) {
  int T = s->T, hd = s->hd, grp = s->H / s->KV;
  float P[BR][BC], dS[BR][BC], ak[BC][HD_MAX], av[BC][HD_MAX]; /* 96 KiB of stack */
  float delta[BR];
  for (int b = 0; b < s->B; b++)
    for (int g = 0; g < s->KV; g++)
      for (int j0 = 0; j0 < T; j0 += BC) {
        int nc = T - j0 < BC ? T - j0 : BC;
        memset(ak, 0, sizeof ak), memset(av, 0, sizeof av);
        for (int h = g * grp; h < (g + 1) * grp; h++)
          for (int i0 = j0 / BR * BR; i0 < T; i0 += BR) {
            int nr = T - i0 < BR ? T - i0 : BR;
            tile_delta(s, o, dout, b, h, i0, nr, delta);
            tile_grads(s, q, k, v, dout, lse + lse_at(s, b, h, 0), delta, b, h, i0, nr, j0, nc, P,
                       dS);
            for (int c = 0; c < nc; c++)
              for (int e = 0; e < hd; e++) {
                float a = av[c][e], d = ak[c][e];
                for (int r = 0; r < nr; r++) {
                  a += P[r][c] * dout[at(s->ldo, b, T, i0 + r, h, hd) + e];
                  d += dS[r][c] * q[at(s->ldq, b, T, i0 + r, h, hd) + e];
                }
                av[c][e] = a, ak[c][e] = d;
              }
          }
        for (int c = 0; c < nc; c++)
          for (int e = 0; e < hd; e++) {
            dk[at(s->ldk, b, T, j0 + c, g, hd) + e] = ak[c][e] * s->scale;
            dv[at(s->ldv, b, T, j0 + c, g, hd) + e] = av[c][e];
          }
      }
}

void gpt_attn_ref_bwd(const gpt_attn_shape *s, const float *q, const float *k, const float *v,
                      const float *o, const float *dout, const float *lse, float *dq, float *dk,
                      float *dv) {
  int T = s->T, hd = s->hd, grp = s->H / s->KV;
  float P[BR][BC], dS[BR][BC], aq[BR][HD_MAX]; /* 64 KiB of stack */
  float delta[BR];
  ref_bwd_dkdv(s, q, k, v, o, dout, lse, dk, dv);
  /* dq: per q tile, the key tiles up to the diagonal (k_attn_bwd_dq) */
  for (int b = 0; b < s->B; b++)
    for (int h = 0; h < s->H; h++)
      for (int i0 = 0; i0 < T; i0 += BR) {
        int g = h / grp, nr = T - i0 < BR ? T - i0 : BR;
        memset(aq, 0, sizeof aq);
        tile_delta(s, o, dout, b, h, i0, nr, delta);
        for (int j0 = 0; j0 < i0 + nr; j0 += BC) {
          int nc = T - j0 < BC ? T - j0 : BC;
          tile_grads(s, q, k, v, dout, lse + lse_at(s, b, h, 0), delta, b, h, i0, nr, j0, nc, P,
                     dS);
          for (int r = 0; r < nr; r++)
            for (int e = 0; e < hd; e++) {
              float a = aq[r][e];
              for (int c = 0; c < nc; c++)
                a += dS[r][c] * k[at(s->ldk, b, T, j0 + c, g, hd) + e];
              aq[r][e] = a;
            }
        }
        for (int r = 0; r < nr; r++)
          for (int e = 0; e < hd; e++)
            dq[at(s->ldq, b, T, i0 + r, h, hd) + e] = aq[r][e] * s->scale;
      }
}
