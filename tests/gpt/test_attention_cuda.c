/* tests/gpt/test_attention_cuda.c — the CUDA flash attention kernels
 * (examples/gpt/attention_cuda.cu) against the tiled CPU reference
 * (attention_ref.c) on the same bf16-rounded q, k, v and dout, forward and
 * backward: head dims 64 and 128 (and 32, 80 padded inside the kernels),
 * grouped-query heads, ragged T, packed [q k v] rows with padded and odd
 * strides (the scalar load path) and planar buffers, one shape at T = 2048.
 * The backward gets the kernels' own bf16 o (the reference the same values
 * as fp32). Tolerances, from bf16 rounding of o and of P and dS before
 * their tensor-core products (8-bit mantissa, fp32 accumulation):
 *   o           max |c - r| <= 1e-2 * max(1, max |r|)
 *   lse         max |c - r| <= 2e-3 * max(1, max |r|)
 *   dq, dk, dv  max |c - r| <= 2e-2 * max |r| + 1e-5   (per tensor)
 * Also: nothing outside the heads' columns is written, every head column
 * is, and two backward runs agree bit for bit (no atomics).
 * Exits 77 without a CUDA device. Built a second time as
 * gpt.attention_emulated with the kernels compiled for the host
 * (tests/gpt/cuda_emu/: the thread model and wmma emulated), without the
 * two T = 2048 shapes, so their tile logic is checked without a GPU.
 */
#include "gpt.h"
#include "gpt_attn.h"
#include "gpt_cuda.h"

#include "tests/test.h"

#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

static unsigned long long rng = 0x2545f4914f6cdd1dull;
static float q_amp = 2.5f; /* q in [-q_amp, q_amp] */
static float uni(float a) {
  return a * (2.0f * (float)(test_rand(&rng) >> 40) / 16777216.0f - 1.0f);
}

#define CU(x) REQUIRE((x) == cudaSuccess)

typedef struct {
  gpt_attn_shape s;
  long nin, nout, nlse;    /* elements of the q k v buffer(s), of o / dout, of lse */
  long offq, offk, offv;   /* q, k, v (and dq, dk, dv) within the buffer */
  float *in, *dout;        /* host fp32, bf16-rounded; padding 0 */
  uint16_t *in16, *dout16; /* host bf16 */
} problem;

static float bround(float x) { return gpt_bf16_to_f32(gpt_f32_to_bf16(x)); }

/* packed: one buffer of rows [q k v pad]; else q, k, v one after the other,
 * each with rows padded by `pad` */
static void setup(problem *p, int B, int T, int H, int KV, int hd, int packed, int pad) {
  memset(p, 0, sizeof *p);
  gpt_attn_shape *s = &p->s;
  *s = (gpt_attn_shape){B, T, H, KV, hd, 0, 0, 0, 0, 1.0f / sqrtf((float)hd)};
  long BT = (long)B * T;
  if (packed) {
    s->ldq = s->ldk = s->ldv = (long)(H + 2 * KV) * hd + pad;
    p->offq = 0, p->offk = (long)H * hd, p->offv = (long)(H + KV) * hd;
    p->nin = BT * s->ldq;
  } else {
    s->ldq = (long)H * hd + pad, s->ldk = s->ldv = (long)KV * hd + pad;
    p->offq = 0, p->offk = BT * s->ldq, p->offv = p->offk + BT * s->ldk;
    p->nin = p->offv + BT * s->ldv;
  }
  s->ldo = (long)H * hd + pad;
  p->nout = BT * s->ldo, p->nlse = (long)B * H * T;
  p->in = calloc(p->nin, sizeof(float)), p->dout = calloc(p->nout, sizeof(float));
  p->in16 = calloc(p->nin, 2), p->dout16 = calloc(p->nout, 2);
  REQUIRE(p->in && p->dout && p->in16 && p->dout16);
  for (long n = 0; n < BT; n++) {
    for (int c = 0; c < H * hd; c++)
      p->in[p->offq + n * s->ldq + c] = bround(uni(q_amp));
    for (int c = 0; c < KV * hd; c++)
      p->in[p->offk + n * s->ldk + c] = bround(uni(1.0f));
    for (int c = 0; c < KV * hd; c++)
      p->in[p->offv + n * s->ldv + c] = bround(uni(1.0f));
    for (int c = 0; c < H * hd; c++)
      p->dout[n * s->ldo + c] = bround(uni(1.0f));
  }
  for (long i = 0; i < p->nin; i++)
    p->in16[i] = gpt_f32_to_bf16(p->in[i]);
  for (long i = 0; i < p->nout; i++)
    p->dout16[i] = gpt_f32_to_bf16(p->dout[i]);
}
static void release(problem *p) { free(p->in), free(p->dout), free(p->in16), free(p->dout16); }

/* max |c - r| and max |r| over the heads' columns of a [BT][ld] tensor */
static double worst(const float *c, const float *r, long rows, long ld, int cols, double *rmax) {
  double m = 0, rm = 0;
  for (long n = 0; n < rows; n++)
    for (int e = 0; e < cols; e++) {
      double d = fabs((double)c[n * ld + e] - r[n * ld + e]);
      if (!(d <= m)) m = d;
      if (fabs(r[n * ld + e]) > rm) rm = fabs(r[n * ld + e]);
    }
  *rmax = rm;
  return m;
}
static void expect_close(const char *name, const char *tag, const float *c, const float *r,
                         long rows, long ld, int cols, double rel, double abs_floor, int one) {
  double rm, d = worst(c, r, rows, ld, cols, &rm);
  double tol = one ? rel * (rm > 1 ? rm : 1) : rel * rm + abs_floor;
  printf("  %-4s max|cuda - ref| %.3g (tolerance %.3g, max|ref| %.3g)\n", name, d, tol, rm);
  if (!(d <= tol)) {
    fprintf(stderr, "%s: %s: %.3g > %.3g\n", tag, name, d, tol);
    test_failures++;
  }
}

/* the elements of a [BT][ld] layout that are no head column, as a mask */
static char *pad_mask(const problem *p, int for_out) {
  const gpt_attn_shape *s = &p->s;
  long BT = (long)s->B * s->T, n = for_out ? p->nout : p->nin;
  char *m = malloc(n);
  REQUIRE(m);
  memset(m, 1, n);
  for (long r = 0; r < BT; r++) {
    if (for_out) {
      memset(m + r * s->ldo, 0, (size_t)s->H * s->hd);
      continue;
    }
    memset(m + p->offq + r * s->ldq, 0, (size_t)s->H * s->hd);
    memset(m + p->offk + r * s->ldk, 0, (size_t)s->KV * s->hd);
    memset(m + p->offv + r * s->ldv, 0, (size_t)s->KV * s->hd);
  }
  return m;
}

/* every head column written (finite), nothing else (the 0xff fill kept);
 * the two backward runs bit for bit */
static void check_layout(const problem *p, const uint16_t *o16, const float *o, const float *g,
                         const float *g2) {
  char *mo = pad_mask(p, 1), *mi = pad_mask(p, 0);
  long bad_o = 0, bad_g = 0;
  for (long i = 0; i < p->nout; i++)
    bad_o += mo[i] ? o16[i] != 0xffff : !isfinite(o[i]);
  for (long i = 0; i < p->nin; i++) {
    uint32_t bits;
    memcpy(&bits, g + i, 4);
    bad_g += mi[i] ? bits != 0xffffffffu : !isfinite(g[i]);
  }
  EXPECT_EQ_INT(bad_o, 0);
  EXPECT_EQ_INT(bad_g, 0);
  EXPECT(memcmp(g, g2, p->nin * sizeof(float)) == 0);
  free(mo), free(mi);
}

/* compare: 0 runs only (forward and backward finite, for the long shape) */
static void run(int B, int T, int H, int KV, int hd, int packed, int pad, int compare) {
  char tag[160], err[256];
  snprintf(tag, sizeof tag, "B %d T %d H %d KV %d hd %d %s pad %d", B, T, H, KV, hd,
           packed ? "packed" : "planar", pad);
  printf("%s\n", tag);
  problem p;
  setup(&p, B, T, H, KV, hd, packed, pad);
  const gpt_attn_shape *s = &p.s;
  long BT = (long)B * T;
  REQUIRE(gpt_attn_check(s, err, sizeof err) == 0);

  uint16_t *din, *dout, *dgo;
  float *dlse, *ddelta, *dgrad, *dgrad2;
  CU(cudaMalloc((void **)&din, p.nin * 2));
  CU(cudaMalloc((void **)&dout, p.nout * 2));
  CU(cudaMalloc((void **)&dgo, p.nout * 2));
  CU(cudaMalloc((void **)&dlse, p.nlse * sizeof(float)));
  CU(cudaMalloc((void **)&ddelta, p.nlse * sizeof(float)));
  CU(cudaMalloc((void **)&dgrad, p.nin * sizeof(float)));
  CU(cudaMalloc((void **)&dgrad2, p.nin * sizeof(float)));
  CU(cudaMemcpy(din, p.in16, p.nin * 2, cudaMemcpyHostToDevice));
  CU(cudaMemcpy(dgo, p.dout16, p.nout * 2, cudaMemcpyHostToDevice));
  CU(cudaMemset(dout, 0xff, p.nout * 2)); /* NaN bits: unwritten shows */
  CU(cudaMemset(dgrad, 0xff, p.nin * sizeof(float)));
  CU(cudaMemset(dgrad2, 0xff, p.nin * sizeof(float)));

  int rc = gpt_attn_cuda_fwd(s, din + p.offq, din + p.offk, din + p.offv, dout, dlse, NULL, err,
                             sizeof err);
  if (rc) fprintf(stderr, "%s: forward: %s\n", tag, err);
  REQUIRE(rc == 0);
  rc = gpt_attn_cuda_bwd(s, din + p.offq, din + p.offk, din + p.offv, dout, dgo, dlse, ddelta,
                         dgrad + p.offq, dgrad + p.offk, dgrad + p.offv, NULL, err, sizeof err);
  if (rc) fprintf(stderr, "%s: backward: %s\n", tag, err);
  REQUIRE(rc == 0);
  REQUIRE(gpt_attn_cuda_bwd(s, din + p.offq, din + p.offk, din + p.offv, dout, dgo, dlse, ddelta,
                            dgrad2 + p.offq, dgrad2 + p.offk, dgrad2 + p.offv, NULL, err,
                            sizeof err) == 0);
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) fprintf(stderr, "%s: %s\n", tag, cudaGetErrorString(e));
  REQUIRE(e == cudaSuccess);

  uint16_t *o16 = malloc(p.nout * 2);
  float *o = malloc(p.nout * sizeof(float)), *lse = malloc(p.nlse * sizeof(float));
  float *g = malloc(p.nin * sizeof(float)), *g2 = malloc(p.nin * sizeof(float));
  REQUIRE(o16 && o && lse && g && g2);
  CU(cudaMemcpy(o16, dout, p.nout * 2, cudaMemcpyDeviceToHost));
  CU(cudaMemcpy(lse, dlse, p.nlse * sizeof(float), cudaMemcpyDeviceToHost));
  CU(cudaMemcpy(g, dgrad, p.nin * sizeof(float), cudaMemcpyDeviceToHost));
  CU(cudaMemcpy(g2, dgrad2, p.nin * sizeof(float), cudaMemcpyDeviceToHost));
  for (long i = 0; i < p.nout; i++)
    o[i] = gpt_bf16_to_f32(o16[i]);

  check_layout(&p, o16, o, g, g2);

  if (compare) {
    float *ro = calloc(p.nout, sizeof(float)), *rl = malloc(p.nlse * sizeof(float));
    float *rg = calloc(p.nin, sizeof(float));
    REQUIRE(ro && rl && rg);
    const float *q = p.in + p.offq, *k = p.in + p.offk, *v = p.in + p.offv;
    gpt_attn_ref_fwd(s, q, k, v, ro, rl);
    expect_close("o", tag, o, ro, BT, s->ldo, H * hd, 1e-2, 0, 1);
    expect_close("lse", tag, lse, rl, (long)B * H, T, T, 2e-3, 0, 1);
    /* the reference backward on the kernels' own o */
    gpt_attn_ref_bwd(s, q, k, v, o, p.dout, rl, rg + p.offq, rg + p.offk, rg + p.offv);
    expect_close("dq", tag, g + p.offq, rg + p.offq, BT, s->ldq, H * hd, 2e-2, 1e-5, 0);
    expect_close("dk", tag, g + p.offk, rg + p.offk, BT, s->ldk, KV * hd, 2e-2, 1e-5, 0);
    expect_close("dv", tag, g + p.offv, rg + p.offv, BT, s->ldv, KV * hd, 2e-2, 1e-5, 0);
    free(ro), free(rl), free(rg);
  }
  free(o16), free(o), free(lse), free(g), free(g2);
  cudaFree(din), cudaFree(dout), cudaFree(dgo), cudaFree(dlse), cudaFree(ddelta);
  cudaFree(dgrad), cudaFree(dgrad2);
  release(&p);
}

int main(void) {
  char why[256];
  if (gpt_cuda_available(why, sizeof why)) TEST_SKIP("%s", why);
  run(1, 1, 1, 1, 64, 0, 0, 1);
  run(2, 37, 4, 2, 64, 1, 0, 1);
  run(1, 130, 8, 1, 128, 1, 16, 1);
  run(2, 200, 4, 4, 128, 0, 8, 1);
  run(1, 64, 2, 1, 32, 0, 0, 1);  /* hd 32: padded to 64 inside */
  run(1, 100, 2, 2, 80, 1, 0, 1); /* hd 80: padded to 128 */
  run(1, 77, 4, 2, 64, 1, 3, 1);  /* odd stride: the scalar loads */
  run(2, 129, 8, 2, 128, 1, 0, 1);
  q_amp = 40.0f; /* scores in the hundreds: nearly one-hot rows */
  run(1, 150, 4, 2, 64, 1, 0, 1);
  q_amp = 2.5f;
#ifndef GPT_ATTN_EMULATED           /* the long shapes on a GPU only */
  run(1, 2048, 2, 1, 64, 1, 0, 1);  /* long: compared */
  run(2, 2048, 8, 2, 128, 1, 0, 0); /* long: runs, writes every head column, deterministic */
#endif
  /* a shape the kernels refuse: the reason, no launch */
  gpt_attn_shape bad = {1, 16, 4, 3, 64, 256, 192, 192, 256, 0.125f};
  EXPECT(gpt_attn_cuda_fwd(&bad, NULL, NULL, NULL, NULL, NULL, NULL, why, sizeof why) == -1);
  EXPECT(strstr(why, "multiple") != NULL);
  return test_finish("gpt.cuda.attention");
}
