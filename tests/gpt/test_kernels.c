/* tests/gpt/test_kernels.c — the CPU references of the fused kernels
 * (examples/gpt/kernels_ref.c) against plain formulations of their own:
 *   gpt_bf16_round   fixed cases (ties to even, NaN kept, overflow to inf,
 *                    subnormals) and, on random floats, the nearer of the
 *                    two bf16 neighbours found by truncation
 *   norm forward     a double-precision LayerNorm / RMSNorm of bf16(x + delta)
 *   backwards        central finite differences of a double-precision
 *                    forward (norm: dx, dw, db; SwiGLU; GELU; cross-entropy)
 *   cross-entropy    the row loss from a double log-sum-exp; chunks of rows
 *                    give the very bits of one call over all rows
 * Tolerances: a bf16 store is within half a bf16 ulp (2^-8 relative); the
 * finite differences within 1e-3 of the largest gradient of the tensor.
 */
#include "gpt_kernels.h"

#include "core/dtype.h"
#include "tests/test.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static unsigned long long seed = 0x2545f4914f6cdd1dULL;

static float frand(void) { /* uniform in [-1, 1) */
  return (float)((double)(test_rand(&seed) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}
static float *randv(size_t n, float scale) {
  float *p = malloc(n * sizeof *p);
  REQUIRE(p);
  for (size_t i = 0; i < n; i++) p[i] = frand() * scale;
  return p;
}
static float *bf16v(size_t n, float scale) {
  float *p = randv(n, scale);
  for (size_t i = 0; i < n; i++) p[i] = gpt_bf16_round(p[i]);
  return p;
}
/* n values a against b: |a - b| <= rtol |b| + atol; the first miss printed. */
static void expect_close(const float *a, const double *b, size_t n, double rtol, double atol,
                         const char *what) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; i++)
    if (!(fabs((double)a[i] - b[i]) <= rtol * fabs(b[i]) + atol)) {
      if (!bad++) first = i;
    }
  if (bad)
    fprintf(stderr, "%s: %zu of %zu off, first [%zu]: %.9g vs %.9g\n", what, bad, n, first,
            (double)a[first], b[first]);
  EXPECT(bad == 0);
}
/* every value a bf16 (the low 16 bits zero): what the kernel stores in bf16 */
static void expect_bf16(const float *a, size_t n, const char *what) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += (ferry_f32_bits(a[i]) & 0xffffu) != 0;
  if (bad) fprintf(stderr, "%s: %zu of %zu values not bf16\n", what, bad, n);
  EXPECT(bad == 0);
}
/* the same against the largest |b| (gradients from finite differences) */
static void expect_close_max(const float *a, const double *b, size_t n, double tol,
                             const char *what) {
  double mx = 0;
  for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(b[i]));
  expect_close(a, b, n, 0.0, tol * mx + 1e-7, what);
}

#define BF16_TOL (1.0 / 256) /* half a bf16 ulp is at most 2^-8 of the value */

/* ---- bf16 rounding ------------------------------------------------------------------ */

static void test_bf16_round(void) {
  static const struct {
    uint32_t in, out;
  } cases[] = {
      {0x3f800000u, 0x3f800000u}, /* 1 */
      {0x3f808000u, 0x3f800000u}, /* 1 + 2^-8: a tie, down to the even 1 */
      {0x3f818000u, 0x3f820000u}, /* 1 + 3 * 2^-8: a tie, up to the even */
      {0x3f808001u, 0x3f810000u}, /* just above the tie */
      {0x3f807fffu, 0x3f800000u}, /* just below it */
      {0xbf818000u, 0xbf820000u}, /* negative tie */
      {0x7f800000u, 0x7f800000u}, /* inf */
      {0xff800000u, 0xff800000u}, /* -inf */
      {0x7f7fffffu, 0x7f800000u}, /* FLT_MAX rounds to inf */
      {0x7f7f7fffu, 0x7f7f0000u}, /* the largest bf16 stays */
      {0x80000000u, 0x80000000u}, /* -0 */
      {0x00008000u, 0x00000000u}, /* subnormal tie down to 0 */
      {0x00018000u, 0x00020000u}, /* subnormal tie up to even */
      {0x00017fffu, 0x00010000u},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint32_t got = ferry_f32_bits(gpt_bf16_round(ferry_f32_from_bits(cases[i].in)));
    if (got != cases[i].out)
      fprintf(stderr, "bf16(%08x) = %08x, want %08x\n", cases[i].in, got, cases[i].out);
    EXPECT(got == cases[i].out);
  }
  /* NaN kept, also a NaN whose payload is only in the low bits */
  EXPECT(isnan(gpt_bf16_round(NAN)));
  EXPECT(isnan(gpt_bf16_round(ferry_f32_from_bits(0x7f800001u))));
  EXPECT(isnan(gpt_bf16_round(ferry_f32_from_bits(0xff80ffffu))));
  /* random finite floats: the nearer neighbour, the even one on a tie */
  int bad = 0;
  for (int k = 0; k < 200000; k++) {
    uint32_t u = (uint32_t)test_rand(&seed);
    if ((u & 0x7f800000u) == 0x7f800000u) continue; /* inf / NaN */
    float x = ferry_f32_from_bits(u), r = gpt_bf16_round(x);
    uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u; /* towards 0, away from 0 */
    /* past the largest bf16 the next value is 2^128 (stored as inf) */
    double vhi = (hi & 0x7fffffffu) == 0x7f800000u ? copysign(ldexp(1.0, 128), (double)x)
                                                    : (double)ferry_f32_from_bits(hi);
    double dlo = fabs((double)x - (double)ferry_f32_from_bits(lo)), dhi = fabs((double)x - vhi);
    uint32_t want = dlo < dhi ? lo : dhi < dlo ? hi : ((lo >> 16) & 1u) ? hi : lo;
    if (ferry_f32_bits(r) != want && !bad++)
      fprintf(stderr, "bf16(%08x) = %08x, want %08x\n", u, ferry_f32_bits(r), want);
  }
  EXPECT(bad == 0);
}

/* ---- residual + norm ------------------------------------------------------------------ */

/* one row's norm in double: y = (x - mu) / sqrt(var + eps) * w (+ b) */
static void norm_row_d(double *y, double *mu_out, double *rs_out, const double *x, const double *w,
                       const double *b, int C, double eps, int ln) {
  double mu = 0, var = 0;
  if (ln) {
    for (int i = 0; i < C; i++) mu += x[i];
    mu /= C;
  }
  for (int i = 0; i < C; i++) var += (x[i] - mu) * (x[i] - mu);
  double rs = 1.0 / sqrt(var / C + eps);
  for (int i = 0; i < C; i++) y[i] = (x[i] - mu) * rs * w[i] + (ln ? b[i] : 0.0);
  if (mu_out) *mu_out = mu;
  if (rs_out) *rs_out = rs;
}

static void test_norm_fwd(int ln, size_t N, int C, int with_delta) {
  char what[96];
  float eps = 1e-5f;
  size_t n = N * (size_t)C;
  float *x = bf16v(n, 3.0f), *delta = with_delta ? randv(n, 0.5f) : NULL;
  float *w = randv((size_t)C, 1.0f), *b = randv((size_t)C, 0.2f);
  for (int i = 0; i < C; i++) w[i] += 1.0f;
  for (size_t i = 0; i < n; i++) x[i] = gpt_bf16_round(x[i] + 0.3f); /* a non-zero mean */
  float *xout = malloc(n * sizeof *xout), *y = malloc(n * sizeof *y);
  float *mean = malloc(N * sizeof *mean), *rstd = malloc(N * sizeof *rstd);
  double *xd = malloc(C * sizeof *xd), *wd = malloc(C * sizeof *wd), *bd = malloc(C * sizeof *bd);
  double *yd = malloc(n * sizeof *yd), *mud = malloc(N * sizeof *mud),
         *rsd = malloc(N * sizeof *rsd), *xod = malloc(n * sizeof *xod);
  REQUIRE(xout && y && mean && rstd && xd && wd && bd && yd && mud && rsd && xod);
  gpt_resid_norm_ref_fwd(xout, y, mean, rstd, x, delta, w, b, N, C, eps, ln);
  for (int i = 0; i < C; i++) wd[i] = w[i], bd[i] = b[i];
  for (size_t r = 0; r < N; r++) {
    for (int i = 0; i < C; i++) {
      double s = (double)x[r * C + i] + (delta ? (double)delta[r * C + i] : 0.0);
      xod[r * C + i] = s;
      xd[i] = xout[r * C + i]; /* the statistics come from the stored (rounded) sum */
    }
    norm_row_d(yd + r * C, &mud[r], &rsd[r], xd, wd, bd, C, eps, ln);
  }
  snprintf(what, sizeof what, "%s fwd N %zu C %d delta %d", ln ? "layernorm" : "rmsnorm", N, C,
           with_delta);
  /* xout: bf16 (low half zero) and within half an ulp of x + delta */
  expect_bf16(xout, n, what);
  expect_bf16(y, n, what);
  expect_close(xout, xod, n, BF16_TOL, 1e-30, what);
  expect_close(y, yd, n, BF16_TOL * 1.001, 1e-5, what);
  expect_close(rstd, rsd, N, 2e-5, 0, what);
  if (ln) expect_close(mean, mud, N, 1e-5, 1e-6, what);
  if (!with_delta) { /* xout = x; xout NULL is allowed then */
    EXPECT(memcmp(xout, x, n * sizeof *x) == 0);
    float *y2 = malloc(n * sizeof *y2);
    REQUIRE(y2);
    gpt_resid_norm_ref_fwd(NULL, y2, ln ? mean : NULL, rstd, x, NULL, w, b, N, C, eps, ln);
    EXPECT(memcmp(y2, y, n * sizeof *y) == 0);
    free(y2);
  }
  free(x), free(delta), free(w), free(b), free(xout), free(y), free(mean), free(rstd);
  free(xd), free(wd), free(bd), free(yd), free(mud), free(rsd), free(xod);
}

/* sum over the rows of dy . norm(x), in double (the loss whose gradients
 * the backward gives) */
static double norm_loss_d(const double *x, const double *w, const double *b, const float *dy,
                          size_t N, int C, double eps, int ln, double *row) {
  double L = 0;
  for (size_t r = 0; r < N; r++) {
    norm_row_d(row, NULL, NULL, x + r * C, w, b, C, eps, ln);
    for (int i = 0; i < C; i++) L += (double)dy[r * C + i] * row[i];
  }
  return L;
}

/* the loss's derivative in *p (one of x, w, b) by central differences */
static double norm_fd(double *p, const double *x, const double *w, const double *b,
                      const float *dy, size_t N, int C, double eps, int ln, double *row) {
  const double h = 1e-4, v = *p;
  *p = v + h;
  double lp = norm_loss_d(x, w, b, dy, N, C, eps, ln, row);
  *p = v - h;
  double lm = norm_loss_d(x, w, b, dy, N, C, eps, ln, row);
  *p = v;
  return (lp - lm) / (2 * h);
}

static void test_norm_bwd(int ln, size_t N, int C) {
  char what[96];
  float eps = 1e-5f;
  size_t n = N * (size_t)C;
  float *x = bf16v(n, 2.0f), *dy = randv(n, 1.0f), *w = randv((size_t)C, 1.0f);
  float *b = randv((size_t)C, 0.2f), *dx0 = randv(n, 0.1f), *dw0 = randv((size_t)C, 0.1f);
  float *db0 = randv((size_t)C, 0.1f);
  float *y = malloc(n * sizeof *y), *mean = malloc(N * sizeof *mean), *rstd = malloc(N * sizeof *rstd);
  float *dx = malloc(n * sizeof *dx), *dw = malloc(C * sizeof *dw), *db = malloc(C * sizeof *db);
  double *xd = malloc(n * sizeof *xd), *wd = malloc(C * sizeof *wd), *bd = malloc(C * sizeof *bd);
  double *row = malloc(C * sizeof *row), *gx = malloc(n * sizeof *gx), *gw = malloc(C * sizeof *gw),
         *gb = malloc(C * sizeof *gb);
  REQUIRE(y && mean && rstd && dx && dw && db && xd && wd && bd && row && gx && gw && gb);
  for (int i = 0; i < C; i++) w[i] += 1.0f, wd[i] = w[i], bd[i] = b[i];
  for (size_t i = 0; i < n; i++) x[i] = gpt_bf16_round(x[i] + 0.5f), xd[i] = x[i];
  gpt_resid_norm_ref_fwd(NULL, y, mean, rstd, x, NULL, w, b, N, C, eps, ln);
  memcpy(dx, dx0, n * sizeof *dx), memcpy(dw, dw0, C * sizeof *dw), memcpy(db, db0, C * sizeof *db);
  gpt_norm_ref_bwd(dx, dw, ln ? db : NULL, dy, x, mean, rstd, w, N, C, ln);
  for (size_t i = 0; i < n; i++) dx[i] -= dx0[i];
  for (int i = 0; i < C; i++) dw[i] -= dw0[i], db[i] -= db0[i];
  for (size_t i = 0; i < n; i++) gx[i] = norm_fd(&xd[i], xd, wd, bd, dy, N, C, eps, ln, row);
  for (int i = 0; i < C; i++) {
    gw[i] = norm_fd(&wd[i], xd, wd, bd, dy, N, C, eps, ln, row);
    gb[i] = norm_fd(&bd[i], xd, wd, bd, dy, N, C, eps, ln, row);
  }
  snprintf(what, sizeof what, "%s bwd dx N %zu C %d", ln ? "layernorm" : "rmsnorm", N, C);
  expect_close_max(dx, gx, n, 1e-3, what);
  snprintf(what, sizeof what, "%s bwd dw N %zu C %d", ln ? "layernorm" : "rmsnorm", N, C);
  expect_close_max(dw, gw, (size_t)C, 1e-3, what);
  if (ln) {
    snprintf(what, sizeof what, "layernorm bwd db N %zu C %d", N, C);
    expect_close_max(db, gb, (size_t)C, 1e-3, what);
  }
  free(x), free(dy), free(w), free(b), free(dx0), free(dw0), free(db0), free(y), free(mean);
  free(rstd), free(dx), free(dw), free(db), free(xd), free(wd), free(bd), free(row), free(gx);
  free(gw), free(gb);
}

/* ---- activations ---------------------------------------------------------------------- */

static double silu_d(double g) { return g / (1.0 + exp(-g)); }
static double gelu_d(double v) {
  return 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}

static void test_swiglu(size_t n) {
  float *g = bf16v(n, 6.0f), *u = bf16v(n, 2.0f), *dh = randv(n, 1.0f);
  float *h = malloc(n * sizeof *h), *dg = malloc(n * sizeof *dg), *du = malloc(n * sizeof *du);
  double *hd = malloc(n * sizeof *hd), *gd = malloc(n * sizeof *gd), *ud = malloc(n * sizeof *ud);
  REQUIRE(h && dg && du && hd && gd && ud);
  gpt_swiglu_ref_fwd(h, g, u, n);
  gpt_swiglu_ref_bwd(dg, du, dh, g, u, n);
  const double e = 1e-5;
  for (size_t i = 0; i < n; i++) {
    hd[i] = silu_d(g[i]) * u[i];
    gd[i] = dh[i] * (silu_d(g[i] + e) - silu_d(g[i] - e)) / (2 * e) * u[i];
    ud[i] = dh[i] * silu_d(g[i]); /* linear in u: exact */
  }
  expect_bf16(h, n, "swiglu fwd"), expect_bf16(dg, n, "swiglu dg"), expect_bf16(du, n, "swiglu du");
  expect_close(h, hd, n, BF16_TOL * 1.001, 1e-7, "swiglu fwd");
  expect_close(dg, gd, n, BF16_TOL * 1.01, 1e-6, "swiglu bwd dg");
  expect_close(du, ud, n, BF16_TOL * 1.001, 1e-7, "swiglu bwd du");
  free(g), free(u), free(dh), free(h), free(dg), free(du), free(hd), free(gd), free(ud);
}

static void test_gelu(size_t N, int F, int with_bias) {
  char what[80];
  size_t n = N * (size_t)F;
  float *x = randv(n, 4.0f), *b = with_bias ? randv((size_t)F, 1.0f) : NULL, *dy = randv(n, 1.0f);
  float *y = malloc(n * sizeof *y), *pre = malloc(n * sizeof *pre), *dpre = malloc(n * sizeof *dpre);
  float *db = calloc((size_t)F, sizeof *db);
  double *yd = malloc(n * sizeof *yd), *pd = malloc(n * sizeof *pd), *gd = malloc(n * sizeof *gd);
  double *dbd = calloc((size_t)F, sizeof *dbd);
  REQUIRE(y && pre && dpre && db && yd && pd && gd && dbd);
  gpt_gelu_bias_ref_fwd(y, pre, x, b, N, F);
  gpt_gelu_bias_ref_bwd(dpre, db, dy, pre, N, F);
  const double e = 1e-5;
  for (size_t i = 0; i < n; i++) {
    int f = (int)(i % F);
    pd[i] = (double)x[i] + (b ? (double)b[f] : 0.0);
    double p = pre[i];
    yd[i] = gelu_d(p);
    gd[i] = dy[i] * (gelu_d(p + e) - gelu_d(p - e)) / (2 * e);
    dbd[f] += dpre[i]; /* the column sums of the stored dpre */
  }
  snprintf(what, sizeof what, "gelu N %zu F %d bias %d", N, F, with_bias);
  expect_bf16(pre, n, what), expect_bf16(y, n, what), expect_bf16(dpre, n, what);
  expect_close(pre, pd, n, BF16_TOL, 1e-30, what);
  expect_close(y, yd, n, BF16_TOL * 1.001, 1e-6, what);
  expect_close(dpre, gd, n, BF16_TOL * 1.01, 1e-6, what);
  expect_close(db, dbd, (size_t)F, 1e-5, 1e-5, what);
  free(x), free(b), free(dy), free(y), free(pre), free(dpre), free(db), free(yd), free(pd);
  free(gd), free(dbd);
}

/* ---- cross-entropy ---------------------------------------------------------------------- */

/* log sum exp of a row in double, no shift (the rows here stay below e^700) */
static double lse_d(const float *x, int V, int bump, double h) {
  double s = 0;
  for (int v = 0; v < V; v++) s += exp((double)x[v] + (v == bump ? h : 0.0));
  return log(s);
}

static void test_ce(size_t n, int V, float offset) {
  char what[80];
  size_t nv = n * (size_t)V;
  float *lg = randv(nv, 8.0f), *loss = malloc(n * sizeof *loss), *lse = malloc(n * sizeof *lse);
  float *d = malloc(nv * sizeof *d);
  int32_t *tgt = malloc(n * sizeof *tgt);
  double *ld = malloc(n * sizeof *ld), *sd = malloc(n * sizeof *sd), *gd = malloc(nv * sizeof *gd);
  REQUIRE(loss && lse && d && tgt && ld && sd && gd);
  for (size_t r = 0; r < n; r++) {
    tgt[r] = (int32_t)(test_rand(&seed) % (unsigned)V);
    for (int v = 0; v < V; v++) lg[r * V + v] += offset * (float)(r % 3); /* shifted rows */
  }
  float scale = 1.0f / (float)n;
  gpt_ce_ref_fwd(lg, tgt, n, V, loss, lse);
  gpt_ce_ref_bwd(d, lg, tgt, lse, n, V, scale);
  for (size_t r = 0; r < n; r++) {
    const float *x = lg + r * V;
    sd[r] = lse_d(x, V, -1, 0);
    ld[r] = sd[r] - x[tgt[r]];
  }
  snprintf(what, sizeof what, "ce fwd n %zu V %d offset %g", n, V, (double)offset);
  expect_bf16(d, nv, what);
  expect_close(lse, sd, n, 1e-6, 1e-6, what);
  expect_close(loss, ld, n, 1e-5, 1e-5, what);
  /* d(scale * loss_r)/d x_v by central differences on some rows (small V),
   * else exp(x - lse) - onehot in double */
  const double h = 1e-3;
  for (size_t r = 0; r < n; r += 3) {
    const float *x = lg + r * V;
    for (int v = 0; v < V; v++) {
      if (V > 2000) {
        gd[v] = scale * (exp((double)x[v] - sd[r]) - (v == tgt[r] ? 1.0 : 0.0));
        continue;
      }
      double lp = lse_d(x, V, v, h) - (x[tgt[r]] + (v == tgt[r] ? h : 0.0));
      double lm = lse_d(x, V, v, -h) - (x[tgt[r]] - (v == tgt[r] ? h : 0.0));
      gd[v] = scale * (lp - lm) / (2 * h);
    }
    snprintf(what, sizeof what, "ce bwd row %zu V %d", r, V);
    expect_close(d + r * V, gd, (size_t)V, BF16_TOL * 1.01, 1e-7 * scale, what);
  }
  /* chunks of rows (3, 5, 1, the rest) give the bits of one call */
  float *loss2 = malloc(n * sizeof *loss2), *lse2 = malloc(n * sizeof *lse2);
  float *d2 = malloc(nv * sizeof *d2);
  REQUIRE(loss2 && lse2 && d2);
  size_t sizes[] = {3, 5, 1};
  for (size_t r = 0, k = 0; r < n; k++) {
    size_t c = k < 3 ? sizes[k] : n - r;
    c = c > n - r ? n - r : c;
    gpt_ce_ref_fwd(lg + r * V, tgt + r, c, V, loss2 + r, lse2 + r);
    gpt_ce_ref_bwd(d2 + r * V, lg + r * V, tgt + r, lse2 + r, c, V, scale);
    r += c;
  }
  EXPECT(memcmp(loss, loss2, n * sizeof *loss) == 0);
  EXPECT(memcmp(lse, lse2, n * sizeof *lse) == 0);
  EXPECT(memcmp(d, d2, nv * sizeof *d) == 0);
  /* a target out of range: a NaN loss, no onehot term */
  int32_t bad = V;
  float l1, s1;
  gpt_ce_ref_fwd(lg, &bad, 1, V, &l1, &s1);
  EXPECT(isnan(l1) && s1 == lse[0]);
  gpt_ce_ref_bwd(d2, lg, &bad, &s1, 1, V, 1.0f);
  int neg = 0;
  for (int v = 0; v < V; v++) neg += d2[v] < 0;
  EXPECT(neg == 0);
  free(lg), free(loss), free(lse), free(d), free(tgt), free(ld), free(sd), free(gd), free(loss2);
  free(lse2), free(d2);
}

int main(void) {
  test_bf16_round();
  for (int ln = 0; ln < 2; ln++) {
    test_norm_fwd(ln, 7, 64, 1);
    test_norm_fwd(ln, 5, 37, 1);
    test_norm_fwd(ln, 3, 768, 0);
    test_norm_bwd(ln, 3, 24);
    test_norm_bwd(ln, 2, 37);
  }
  test_swiglu(1000);
  test_swiglu(13);
  test_gelu(5, 48, 1);
  test_gelu(3, 37, 0);
  test_ce(10, 50, 0.0f);
  test_ce(13, 1000, 40.0f);
  test_ce(4, 32000, 0.0f);
  return test_finish("gpt.kernels");
}
