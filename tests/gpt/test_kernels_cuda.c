/* tests/gpt/test_kernels_cuda.c — each launcher of gpt_kernels.h (the
 * CUDA kernels of kernels_cuda.cu) against its CPU reference (kernels_ref.c)
 * on random inputs: norms at C = 37 (ragged), 64, 768, 4096, 5120 with
 * 16 to 300 rows, weights in fp32 / bf16 / fp16, with and without the
 * residual add, in place; SwiGLU and GELU on ragged and misaligned sizes;
 * the cross-entropy at V = 32000, 50257 (ragged) and 128256 with 16 to 64
 * rows, in chunks; the cuBLASLt GEMM with each epilogue, in each transpose
 * a Linear needs, bf16 and fp32 D, with and without a workspace. Tolerances (the kernels differ from the references only
 * in accumulation order and in the last ulp of expf / tanhf):
 *   bf16 stores from the same single fp32 op (x + delta, x + b)   bit-exact
 *   other bf16 stores         |g - r| <= 2^-7 |r| + atol (one bf16 ulp)
 *   norm mean / rstd          1e-5 + 2e-5 |r|
 *   norm dx, dw, db           1e-4 max |r| + 1e-5 (per tensor)
 *   GELU db                   2^-7 sum |terms| + 1e-5 (per column)
 *   bias grad                 3e-5 sum |terms| + 1e-6 (per column, against double)
 *   cross-entropy lse, loss   2e-5 + 1e-6 |lse|
 *   cuBLASLt GEMM             1e-4 sum |a b| + one bf16 ulp (bf16 D); GELU
 *                             epilogue + 1e-3 (its own GELU), against double
 * The column sums (no atomics) give the same bits on a second run. A
 * launcher's refusal and a CUDA error come back as -1 with the text in err.
 * Exits 77 without a CUDA device. Built a second time as
 * gpt.kernels_emulated with the kernels compiled for the host
 * (tests/gpt/cuda_emu/), without the cuBLASLt GEMM.
 */
#include "gpt_cuda.h"
#include "gpt_kernels.h"

#include "core/dtype.h"
#include "ferry.h"
#include "tests/test.h"

#ifndef GPT_KERNELS_EMULATED /* the cuBLASLt GEMM is not emulated */
#include <cublasLt.h>
#endif
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

static unsigned long long seed = 0x9e3779b97f4a7c15ULL;
static cudaStream_t st;
static char err[512];

static float frand(void) { /* uniform in [-1, 1) */
  return (float)((double)(test_rand(&seed) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}
static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  REQUIRE(p);
  return p;
}
/* n floats uniform in [-scale, scale) + shift, rounded to bf16 if bf */
static float *randv(size_t n, float scale, float shift, int bf) {
  float *p = xmalloc(n * sizeof *p);
  for (size_t i = 0; i < n; i++) {
    p[i] = frand() * scale + shift;
    if (bf) p[i] = gpt_bf16_round(p[i]);
  }
  return p;
}

/* ---- device buffers ---------------------------------------------------------------- */

static void *dalloc(size_t bytes) {
  void *d = NULL;
  REQUIRE(cudaMalloc(&d, bytes ? bytes : 1) == cudaSuccess);
  return d;
}
static void *dput(const void *h, size_t bytes) {
  void *d = dalloc(bytes);
  REQUIRE(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
  return d;
}
static void dget(void *h, const void *d, size_t bytes) {
  REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
  REQUIRE(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
}
/* fp32 values (bf16 already) as device bf16 */
static uint16_t *dput_bf16(const float *h, size_t n) {
  uint16_t *b = xmalloc(n * sizeof *b);
  for (size_t i = 0; i < n; i++) b[i] = ferry_f32_to_bf16(h[i]);
  uint16_t *d = dput(b, n * sizeof *b);
  free(b);
  return d;
}
static float *dget_bf16(const uint16_t *d, size_t n) {
  uint16_t *b = xmalloc(n * sizeof *b);
  float *h = xmalloc(n * sizeof *h);
  dget(b, d, n * sizeof *b);
  for (size_t i = 0; i < n; i++) h[i] = ferry_bf16_to_f32(b[i]);
  free(b);
  return h;
}
static float *dget_f32(const float *d, size_t n) {
  float *h = xmalloc(n * sizeof *h);
  dget(h, d, n * sizeof *h);
  return h;
}
/* weights: rounded in place to dt, put on the device in dt */
static void *dput_w(float *w, size_t n, int dt) {
  if (dt == FERRY_DT_F32) return dput(w, n * sizeof *w);
  uint16_t *b = xmalloc(n * sizeof *b);
  for (size_t i = 0; i < n; i++) {
    b[i] = dt == FERRY_DT_BF16 ? ferry_f32_to_bf16(w[i]) : ferry_f32_to_f16(w[i]);
    w[i] = dt == FERRY_DT_BF16 ? ferry_bf16_to_f32(b[i]) : ferry_f16_to_f32(b[i]);
  }
  void *d = dput(b, n * sizeof *b);
  free(b);
  return d;
}

/* ---- comparisons ----------------------------------------------------------------------- */

#define ULP (1.0 / 128) /* one bf16 ulp is at most 2^-7 of the value */

/* |g - r| <= rtol |r| + atol, both NaN counts as equal; the first miss printed */
static void expect_near(const float *g, const float *r, size_t n, double rtol, double atol,
                        const char *what) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; i++) {
    if (isnan(g[i]) && isnan(r[i])) continue;
    if (!(fabs((double)g[i] - r[i]) <= rtol * fabs((double)r[i]) + atol) && !bad++) first = i;
  }
  if (bad)
    fprintf(stderr, "%s: %zu of %zu off, first [%zu]: gpu %.9g ref %.9g\n", what, bad, n, first,
            (double)g[first], (double)r[first]);
  EXPECT(bad == 0);
}
static double max_abs(const float *r, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)r[i]));
  return m;
}
static void expect_same(const void *a, const void *b, size_t bytes, const char *what) {
  if (memcmp(a, b, bytes)) fprintf(stderr, "%s: not the same bits\n", what);
  EXPECT(memcmp(a, b, bytes) == 0);
}

/* ---- residual + norm -------------------------------------------------------------------- */

static void test_norm(int ln, size_t N, int C, int dt, int with_delta, int in_place) {
  char what[128];
  snprintf(what, sizeof what, "%s N %zu C %d %s delta %d in-place %d", ln ? "layernorm" : "rmsnorm",
           N, C, ferry_dtype_name(dt), with_delta, in_place);
  size_t n = N * (size_t)C;
  float eps = 1e-5f;
  float *x = randv(n, 3.0f, 0.3f, 1), *delta = randv(n, 0.5f, 0.0f, 0);
  float *w = randv((size_t)C, 0.5f, 1.0f, 0), *b = randv((size_t)C, 0.2f, 0.0f, 0);
  void *dw_ = dput_w(w, (size_t)C, dt), *db_ = dput_w(b, (size_t)C, dt);
  float *xo = xmalloc(n * sizeof *xo), *y = xmalloc(n * sizeof *y);
  float *mean = xmalloc(N * sizeof *mean), *rstd = xmalloc(N * sizeof *rstd);
  gpt_resid_norm_ref_fwd(xo, y, mean, rstd, x, with_delta ? delta : NULL, w, b, N, C, eps, ln);

  uint16_t *dx = dput_bf16(x, n), *dxo = in_place ? dx : dalloc(n * 2), *dy = dalloc(n * 2);
  float *ddelta = dput(delta, n * sizeof *delta), *dmean = dalloc(N * 4), *drstd = dalloc(N * 4);
  int rc = gpt_resid_norm_cuda_fwd(dxo, dy, ln ? dmean : NULL, drstd, dx,
                                   with_delta ? ddelta : NULL, dw_, db_, dt, N, C, eps, ln, st,
                                   err, sizeof err);
  if (rc) fprintf(stderr, "%s: %s\n", what, err);
  EXPECT(rc == 0);
  float *gxo = dget_bf16(dxo, n), *gy = dget_bf16(dy, n), *grs = dget_f32(drstd, N);
  expect_same(gxo, xo, n * sizeof *xo, what);
  expect_near(gy, y, n, ULP, 1e-5, what);
  expect_near(grs, rstd, N, 2e-5, 1e-5, what);
  if (ln) {
    float *gmu = dget_f32(dmean, N);
    expect_near(gmu, mean, N, 2e-5, 1e-5, what);
    free(gmu);
  }

  /* backward from the saved xout, mean, rstd (the reference's, on both) */
  float *gdy = randv(n, 1.0f, 0.0f, 0), *gx = randv(n, 0.1f, 0.0f, 0);
  float *gw = randv((size_t)C, 0.1f, 0.0f, 0), *gb = randv((size_t)C, 0.1f, 0.0f, 0);
  float *ddy = dput(gdy, n * 4), *dgx = dput(gx, n * 4), *dgw = dput(gw, (size_t)C * 4);
  float *dgb = dput(gb, (size_t)C * 4), *dmu = dput(mean, N * 4), *drs = dput(rstd, N * 4);
  uint16_t *dxs = dput_bf16(xo, n);
  float *part = dalloc(gpt_norm_bwd_partial_floats(N, C) * sizeof(float));
  float *dgw2 = dput(gw, (size_t)C * 4);
  gpt_norm_ref_bwd(gx, gw, gb, gdy, xo, mean, rstd, w, N, C, ln);
  for (int run = 0; run < 2; run++) { /* twice: the same bits */
    rc = gpt_norm_cuda_bwd(dgx, run ? dgw2 : dgw, dgb, ddy, dxs, ln ? dmu : NULL, drs, dw_, dt, N,
                           C, ln, part, st, err, sizeof err);
    if (rc) fprintf(stderr, "%s bwd: %s\n", what, err);
    EXPECT(rc == 0);
  }
  float *hx = dget_f32(dgx, n), *hw = dget_f32(dgw, (size_t)C), *hw2 = dget_f32(dgw2, (size_t)C);
  float *hb = dget_f32(dgb, (size_t)C);
  /* dx was added to twice on the device: subtract the second step */
  float *gx2 = xmalloc(n * sizeof *gx2), *gw2 = xmalloc((size_t)C * sizeof *gw2);
  float *gb2 = xmalloc((size_t)C * sizeof *gb2);
  memcpy(gx2, gx, n * sizeof *gx), memcpy(gw2, gw, (size_t)C * 4), memcpy(gb2, gb, (size_t)C * 4);
  gpt_norm_ref_bwd(gx2, gw2, gb2, gdy, xo, mean, rstd, w, N, C, ln);
  char w2[160];
  snprintf(w2, sizeof w2, "%s bwd dx", what);
  expect_near(hx, gx2, n, 0, 1e-4 * max_abs(gx2, n) + 1e-5, w2);
  snprintf(w2, sizeof w2, "%s bwd dw", what);
  expect_near(hw, gw, (size_t)C, 0, 1e-4 * max_abs(gw, (size_t)C) + 1e-5, w2);
  expect_same(hw, hw2, (size_t)C * 4, w2);
  if (ln) {
    /* db took both runs' sums: against two reference steps */
    snprintf(w2, sizeof w2, "%s bwd db", what);
    expect_near(hb, gb2, (size_t)C, 0, 1e-4 * max_abs(gb2, (size_t)C) + 1e-5, w2);
  }
  free(x), free(delta), free(w), free(b), free(xo), free(y), free(mean), free(rstd), free(gxo);
  free(gy), free(grs), free(gdy), free(gx), free(gw), free(gb), free(hx), free(hw), free(hw2);
  free(hb), free(gx2), free(gw2), free(gb2);
  cudaFree(dw_), cudaFree(db_), cudaFree(dx), cudaFree(dy), cudaFree(ddelta), cudaFree(dmean);
  cudaFree(drstd), cudaFree(ddy), cudaFree(dgx), cudaFree(dgw), cudaFree(dgb), cudaFree(dmu);
  cudaFree(drs), cudaFree(dxs), cudaFree(part), cudaFree(dgw2);
  if (!in_place) cudaFree(dxo);
}

/* ---- activations -------------------------------------------------------------------------- */

/* off: elements skipped at the start of every buffer (1: not 16-byte aligned) */
static void test_swiglu(size_t n, size_t off) {
  char what[80];
  snprintf(what, sizeof what, "swiglu n %zu offset %zu", n, off);
  float *g = randv(n, 6.0f, 0.0f, 1), *u = randv(n, 2.0f, 0.0f, 1), *dh = randv(n, 1.0f, 0.0f, 0);
  float *h = xmalloc(n * 4), *dg = xmalloc(n * 4), *du = xmalloc(n * 4);
  gpt_swiglu_ref_fwd(h, g, u, n);
  gpt_swiglu_ref_bwd(dg, du, dh, g, u, n);
  uint16_t *bg = xmalloc((n + off) * 2), *bu = xmalloc((n + off) * 2);
  for (size_t i = 0; i < n; i++) bg[off + i] = ferry_f32_to_bf16(g[i]), bu[off + i] = ferry_f32_to_bf16(u[i]);
  float *hdh = xmalloc((n + off) * 4);
  memcpy(hdh + off, dh, n * 4);
  uint16_t *dg_ = dput(bg, (n + off) * 2), *du_ = dput(bu, (n + off) * 2);
  uint16_t *dhh = dalloc((n + off) * 2), *ddg = dalloc((n + off) * 2), *ddu = dalloc((n + off) * 2);
  float *ddh = dput(hdh, (n + off) * 4);
  EXPECT(gpt_swiglu_cuda_fwd(dhh + off, dg_ + off, du_ + off, n, st, err, sizeof err) == 0);
  EXPECT(gpt_swiglu_cuda_bwd(ddg + off, ddu + off, ddh + off, dg_ + off, du_ + off, n, st, err,
                             sizeof err) == 0);
  float *gh = dget_bf16(dhh + off, n), *gdg = dget_bf16(ddg + off, n), *gdu = dget_bf16(ddu + off, n);
  expect_near(gh, h, n, ULP, 1e-7, what);
  expect_near(gdg, dg, n, ULP, 1e-7, what);
  expect_near(gdu, du, n, ULP, 1e-7, what);
  free(g), free(u), free(dh), free(h), free(dg), free(du), free(bg), free(bu), free(hdh);
  free(gh), free(gdg), free(gdu);
  cudaFree(dg_), cudaFree(du_), cudaFree(dhh), cudaFree(ddg), cudaFree(ddu), cudaFree(ddh);
}

/* GELU with its bias (forward, backward with db), then the bias add alone
 * and the bias gradient, on [N, F] */
static void test_gelu_bias(size_t N, int F, int dt, int with_bias) {
  char what[96];
  snprintf(what, sizeof what, "gelu/bias N %zu F %d %s bias %d", N, F, ferry_dtype_name(dt),
           with_bias);
  size_t n = N * (size_t)F;
  float *x = randv(n, 4.0f, 0.0f, 0), *b = randv((size_t)F, 1.0f, 0.0f, 0);
  float *dy = randv(n, 1.0f, 0.0f, 0), *db0 = randv((size_t)F, 0.1f, 0.0f, 0);
  void *db_ = dput_w(b, (size_t)F, dt);
  float *y = xmalloc(n * 4), *pre = xmalloc(n * 4), *dpre = xmalloc(n * 4);
  float *db = xmalloc((size_t)F * 4);
  memcpy(db, db0, (size_t)F * 4);
  gpt_gelu_bias_ref_fwd(y, pre, x, with_bias ? b : NULL, N, F);
  gpt_gelu_bias_ref_bwd(dpre, db, dy, pre, N, F);

  float *dx = dput(x, n * 4), *ddy = dput(dy, n * 4), *ddb = dput(db0, (size_t)F * 4);
  uint16_t *dyo = dalloc(n * 2), *dpo = dalloc(n * 2), *ddp = dalloc(n * 2);
  float *part = dalloc(gpt_norm_bwd_partial_floats(N, F) * sizeof(float));
  EXPECT(gpt_gelu_bias_cuda_fwd(dyo, dpo, dx, with_bias ? db_ : NULL, dt, N, F, st, err,
                                sizeof err) == 0);
  EXPECT(gpt_gelu_bias_cuda_bwd(ddp, ddb, ddy, dpo, N, F, part, st, err, sizeof err) == 0);
  float *gy = dget_bf16(dyo, n), *gp = dget_bf16(dpo, n), *gdp = dget_bf16(ddp, n);
  float *gdb = dget_f32(ddb, (size_t)F);
  expect_same(gp, pre, n * 4, what);
  expect_near(gy, y, n, ULP, 1e-6, what);
  expect_near(gdp, dpre, n, ULP, 1e-6, what);
  size_t bad = 0;
  for (int f = 0; f < F; f++) { /* the sums of terms each within one ulp */
    double mag = 0;
    for (size_t r = 0; r < N; r++) mag += fabs((double)dpre[r * F + f]);
    bad += !(fabs((double)gdb[f] - db[f]) <= ULP * mag + 1e-5);
  }
  if (bad) fprintf(stderr, "%s: db off in %zu columns\n", what, bad);
  EXPECT(bad == 0);

  /* y = bf16(x + b): the very bits of the reference's pre */
  EXPECT(gpt_bias_bf16_cuda(dyo, dx, with_bias ? db_ : NULL, dt, N, F, st, err, sizeof err) == 0);
  float *gyb = dget_bf16(dyo, n);
  expect_same(gyb, pre, n * 4, what);
  /* db += the column sums of dy, twice: the same bits each time */
  REQUIRE(cudaMemcpy(ddb, db0, (size_t)F * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  EXPECT(gpt_bias_grad_cuda(ddb, ddy, N, F, part, st, err, sizeof err) == 0);
  float *g1 = dget_f32(ddb, (size_t)F);
  REQUIRE(cudaMemcpy(ddb, db0, (size_t)F * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  EXPECT(gpt_bias_grad_cuda(ddb, ddy, N, F, part, st, err, sizeof err) == 0);
  float *g2 = dget_f32(ddb, (size_t)F);
  expect_same(g1, g2, (size_t)F * 4, what);
  bad = 0;
  for (int f = 0; f < F; f++) {
    double s = db0[f], mag = fabs((double)db0[f]);
    for (size_t r = 0; r < N; r++) s += dy[r * F + f], mag += fabs((double)dy[r * F + f]);
    bad += !(fabs((double)g1[f] - s) <= 3e-5 * mag + 1e-6);
  }
  if (bad) fprintf(stderr, "%s: bias grad off in %zu columns\n", what, bad);
  EXPECT(bad == 0);
  free(x), free(b), free(dy), free(db0), free(y), free(pre), free(dpre), free(db), free(gy);
  free(gp), free(gdp), free(gdb), free(gyb), free(g1), free(g2);
  cudaFree(db_), cudaFree(dx), cudaFree(ddy), cudaFree(ddb), cudaFree(dyo), cudaFree(dpo);
  cudaFree(ddp), cudaFree(part);
}

/* ---- cross-entropy ------------------------------------------------------------------------ */

static void test_ce(size_t n, int V) {
  char what[80];
  snprintf(what, sizeof what, "ce n %zu V %d", n, V);
  size_t nv = n * (size_t)V;
  float *lg = randv(nv, 8.0f, 0.0f, 0);
  int32_t *tgt = xmalloc(n * sizeof *tgt);
  for (size_t r = 0; r < n; r++) {
    tgt[r] = (int32_t)(test_rand(&seed) % (unsigned)V);
    for (int v = 0; v < V; v++) lg[r * V + v] += 30.0f * (float)(r % 3); /* shifted rows */
  }
  tgt[n - 1] = -1; /* out of range: a NaN loss, no onehot */
  float scale = 1.0f / (float)n;
  float *loss = xmalloc(n * 4), *lse = xmalloc(n * 4), *d = xmalloc(nv * 4);
  gpt_ce_ref_fwd(lg, tgt, n, V, loss, lse);
  gpt_ce_ref_bwd(d, lg, tgt, lse, n, V, scale);

  float *dlg = dput(lg, nv * 4), *dloss = dalloc(n * 4), *dlse = dalloc(n * 4);
  int32_t *dtgt = dput(tgt, n * sizeof *tgt);
  uint16_t *dd = dalloc(nv * 2), *dd2 = dalloc(nv * 2);
  EXPECT(gpt_ce_cuda_fwd(dlg, dtgt, n, V, dloss, dlse, st, err, sizeof err) == 0);
  float *gl = dget_f32(dloss, n), *gs = dget_f32(dlse, n);
  for (size_t r = 0; r < n; r++) {
    double tol = 2e-5 + 1e-6 * fabs((double)lse[r]);
    if (!(fabs((double)gs[r] - lse[r]) <= tol) ||
        !(r == n - 1 ? isnan(gl[r]) : fabs((double)gl[r] - loss[r]) <= tol)) {
      fprintf(stderr, "%s row %zu: gpu lse %.9g loss %.9g, ref %.9g %.9g\n", what, r,
              (double)gs[r], (double)gl[r], (double)lse[r], (double)loss[r]);
      EXPECT(0);
    }
  }
  /* backward from the reference's lse, so only expf's last ulp differs */
  REQUIRE(cudaMemcpy(dlse, lse, n * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  EXPECT(gpt_ce_cuda_bwd(dd, dlg, dtgt, dlse, n, V, scale, st, err, sizeof err) == 0);
  float *gd = dget_bf16(dd, nv);
  expect_near(gd, d, nv, ULP, 1e-12, what);
  /* in two chunks (the first 5 rows, then the rest): the same bits */
  size_t c = 5;
  float *dloss2 = dalloc(n * 4), *dlse2 = dalloc(n * 4);
  EXPECT(gpt_ce_cuda_fwd(dlg, dtgt, c, V, dloss2, dlse2, st, err, sizeof err) == 0);
  EXPECT(gpt_ce_cuda_fwd(dlg + c * V, dtgt + c, n - c, V, dloss2 + c, dlse2 + c, st, err,
                         sizeof err) == 0);
  EXPECT(gpt_ce_cuda_bwd(dd2, dlg, dtgt, dlse, c, V, scale, st, err, sizeof err) == 0);
  EXPECT(gpt_ce_cuda_bwd(dd2 + c * V, dlg + c * V, dtgt + c, dlse + c, n - c, V, scale, st, err,
                         sizeof err) == 0);
  float *gl2 = dget_f32(dloss2, n), *gs2 = dget_f32(dlse2, n), *gd2 = dget_bf16(dd2, nv);
  expect_same(gl2, gl, (n - 1) * 4, what); /* the last is NaN */
  expect_same(gs2, gs, n * 4, what);
  expect_same(gd2, gd, nv * 4, what);
  free(lg), free(tgt), free(loss), free(lse), free(d), free(gl), free(gs), free(gd), free(gl2);
  free(gs2), free(gd2);
  cudaFree(dlg), cudaFree(dloss), cudaFree(dlse), cudaFree(dtgt), cudaFree(dd), cudaFree(dd2);
  cudaFree(dloss2), cudaFree(dlse2);
}

/* ---- GEMM on cuBLASLt ------------------------------------------------------------------------ */

#ifndef GPT_KERNELS_EMULATED

static double gelu_d(double v) {
  return 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}

/* D [m, n] = op(A) op(B) (+ beta D) (+ bias, gelu) against a double GEMM
 * of the same bf16 operands */
static void test_gemm(void *lt, void *ws, size_t wsb, int m, int n, int k, int ta, int tb,
                      int ddt, float beta, int epi) {
  char what[128];
  snprintf(what, sizeof what, "gemm m %d n %d k %d ta %d tb %d %s beta %g epi %d ws %zu", m, n, k,
           ta, tb, ferry_dtype_name(ddt), (double)beta, epi, wsb);
  size_t mn = (size_t)m * n;
  int bf = ddt == FERRY_DT_BF16;
  float *a = randv((size_t)m * k, 1.0f, 0.0f, 1), *b = randv((size_t)k * n, 1.0f, 0.0f, 1);
  float *d0 = randv(mn, 1.0f, 0.0f, bf), *bias = randv((size_t)n, 1.0f, 0.0f, bf);
  float *r = xmalloc(mn * 4), *raux = xmalloc(mn * 4), *tol = xmalloc(mn * 4);
  float *taux = xmalloc(mn * 4);
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      double acc = 0, mag = 0;
      for (int l = 0; l < k; l++) {
        double x = a[ta ? (size_t)l * m + i : (size_t)i * k + l];
        double y = b[tb ? (size_t)j * k + l : (size_t)l * n + j];
        acc += x * y, mag += fabs(x * y);
      }
      acc += beta * d0[(size_t)i * n + j] + (epi != GPT_EPI_NONE ? bias[j] : 0.0);
      size_t o = (size_t)i * n + j;
      int gl = epi == GPT_EPI_GELU_AUX_BIAS;
      raux[o] = (float)acc;
      r[o] = (float)(gl ? gelu_d(acc) : acc);
      /* fp32 accumulation in any order, the bf16 store; cuBLASLt's own GELU */
      taux[o] = (float)(1e-4 * mag + 1e-6 + (bf ? ULP * fabs(acc) : 0.0));
      tol[o] = gl ? (float)(1.2e-4 * mag + 1e-3 + (bf ? ULP * fabs((double)r[o]) : 0.0)) : taux[o];
    }
  uint16_t *da = dput_bf16(a, (size_t)m * k), *db = dput_bf16(b, (size_t)k * n);
  void *dd = bf ? (void *)dput_bf16(d0, mn) : dput(d0, mn * 4);
  void *dbias = bf ? (void *)dput_bf16(bias, (size_t)n) : dput(bias, (size_t)n * 4);
  void *daux = dalloc(mn * 4);
  int rc = gpt_gemm_lt(lt, m, n, k, da, ta, db, tb, dd, ddt, 1.0f, beta, epi, dbias, daux, ws, wsb,
                       st, err, sizeof err);
  if (rc) fprintf(stderr, "%s: %s\n", what, err);
  EXPECT(rc == 0);
  float *g = bf ? dget_bf16(dd, mn) : dget_f32(dd, mn);
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < mn; i++)
    if (!(fabs((double)g[i] - r[i]) <= tol[i]) && !bad++) first = i;
  if (epi == GPT_EPI_GELU_AUX_BIAS) {
    float *ga = bf ? dget_bf16(daux, mn) : dget_f32(daux, mn);
    for (size_t i = 0; i < mn; i++)
      if (!(fabs((double)ga[i] - raux[i]) <= taux[i]) && !bad++)
        first = i;
    free(ga);
  }
  if (bad)
    fprintf(stderr, "%s: %zu off, first [%zu]: gpu %.9g ref %.9g\n", what, bad, first,
            (double)g[first], (double)r[first]);
  EXPECT(bad == 0);
  free(a), free(b), free(d0), free(bias), free(r), free(raux), free(tol), free(taux);
  free(g);
  cudaFree(da), cudaFree(db), cudaFree(dd), cudaFree(dbias), cudaFree(daux);
}

static void test_gemms(void) {
  cublasLtHandle_t lt;
  REQUIRE(cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS);
  size_t wsb = (size_t)32 << 20;
  void *ws = dalloc(wsb);
  const int BF = FERRY_DT_BF16, F32 = FERRY_DT_F32;
  /* a Linear's forward y = x W^T (+ b, gelu), its dx = dy W and dW += dy^T x */
  for (int epi = 0; epi < 3; epi++) test_gemm(lt, ws, wsb, 64, 768, 256, 0, 1, BF, 0.0f, epi);
  test_gemm(lt, ws, wsb, 64, 256, 768, 0, 0, F32, 1.0f, GPT_EPI_NONE);
  test_gemm(lt, ws, wsb, 768, 256, 64, 1, 0, F32, 1.0f, GPT_EPI_NONE);
  test_gemm(lt, ws, wsb, 33, 40, 72, 0, 1, F32, 0.0f, GPT_EPI_BIAS);
  test_gemm(lt, ws, wsb, 48, 64, 32, 1, 1, BF, 0.5f, GPT_EPI_GELU_AUX_BIAS);
  test_gemm(lt, NULL, 0, 64, 768, 256, 0, 1, BF, 0.0f, GPT_EPI_BIAS); /* no workspace */
  /* refused: GELU_AUX_BIAS with n % 8 != 0 */
  err[0] = 0;
  EXPECT(gpt_gemm_lt(lt, 8, 37, 8, ws, 0, ws, 1, ws, BF, 1.0f, 0.0f, GPT_EPI_GELU_AUX_BIAS, ws, ws,
                     ws, wsb, st, err, sizeof err) == -1);
  EXPECT(strstr(err, "gpt_gemm_lt") != NULL);
  cudaFree(ws);
  REQUIRE(cublasLtDestroy(lt) == CUBLAS_STATUS_SUCCESS);
}
#endif

/* a refusal and a CUDA error: -1 and the text in err, nothing left behind */
static void test_errors(void) {
  uint16_t *d = dalloc(64);
  float *f = dalloc(64);
  err[0] = 0;
  EXPECT(gpt_resid_norm_cuda_fwd(NULL, d, NULL, f, d, f, f, NULL, FERRY_DT_F32, 1, 8, 1e-5f, 0, st,
                                 err, sizeof err) == -1);
  EXPECT(strstr(err, "gpt_resid_norm_cuda_fwd") != NULL);
  err[0] = 0; /* more shared memory than any device has */
  EXPECT(gpt_norm_cuda_bwd(f, f, f, f, d, f, f, f, FERRY_DT_F32, 1, 1 << 22, 1, f, st, err,
                           sizeof err) == -1);
  EXPECT(err[0] != 0);
  printf("refused as expected: %s\n", err);
  EXPECT(cudaGetLastError() == cudaSuccess);
  cudaFree(d), cudaFree(f);
}

int main(void) {
  char why[256];
  if (gpt_cuda_available(why, sizeof why)) TEST_SKIP("%s", why);
  REQUIRE(cudaStreamCreate(&st) == cudaSuccess);
  test_errors();
  static const int dts[] = {FERRY_DT_F32, FERRY_DT_BF16, FERRY_DT_F16};
  for (int ln = 0; ln < 2; ln++) {
    for (int k = 0; k < 3; k++) test_norm(ln, 16, 768, dts[k], 1, 0);
    test_norm(ln, 33, 37, FERRY_DT_BF16, 1, 0);
    test_norm(ln, 64, 64, FERRY_DT_F32, 0, 0);
    test_norm(ln, 64, 4096, FERRY_DT_BF16, 1, 1);
    test_norm(ln, 300, 5120, FERRY_DT_BF16, 1, 0);
    test_norm(ln, 17, 5120, FERRY_DT_F32, 0, 1);
  }
  test_swiglu(16 * 4096, 0);
  test_swiglu(16 * 4096 + 5, 1);
  test_swiglu(7, 0);
  for (int k = 0; k < 3; k++) test_gelu_bias(64, 3072, dts[k], 1);
  test_gelu_bias(33, 37, FERRY_DT_BF16, 1);
  test_gelu_bias(300, 1000, FERRY_DT_F32, 0);
  test_ce(16, 32000);
  test_ce(64, 32000);
  test_ce(17, 50257);
  test_ce(16, 128256);
  test_ce(64, 128256);
#ifndef GPT_KERNELS_EMULATED
  test_gemms();
#endif
  REQUIRE(cudaStreamDestroy(st) == cudaSuccess);
  return test_finish("gpt.cuda.kernels");
}
