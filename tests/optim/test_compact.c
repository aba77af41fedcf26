/* tests/optim/test_compact.c — compact optimizer state: the int8 code's
 * round trip (random, heavy-tailed, all-zero, partial blocks, both codes,
 * non-finite), one step of every combination (AdamW, Adam, Lion x bf16/int8
 * states x fp32/bf16 master) against an fp32-state reference, stochastic
 * rounding unbiased and not round-to-nearest, determinism (twice, 1 vs 2
 * threads, resumed via set_step) and every SIMD level equal to the scalar
 * reference bit for bit.
 */
#include "optim/optim.h"
#include "optim/quant_impl.h"
#include "tests/test.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static unsigned long long seed = 0x243f6a8885a308d3ull;
static double urand(void) { return ((test_rand(&seed) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
static float srand1(void) { return (float)(2.0 * urand() - 1.0); }

/* ---- the code's round trip ------------------------------------------------ */

/* Bound (stated): |decode(encode(x)) - x| <= 2^-4 |x| (3 mantissa bits,
 * round to nearest) + half the linear step (2^-18 signed, 2^-34 unsigned) of
 * absmax, each widened by 2^-16 for the fp32 roundings of x / absmax and of
 * the decode's multiply. */
static int roundtrip(const float *x, size_t n, size_t block, int sgn, const char *what) {
  int ok = 1;
  for (size_t b = 0; b < n; b += block) {
    size_t e = b + block < n ? b + block : n;
    float mx = 0;
    int bad = 0;
    for (size_t i = b; i < e; i++) {
      float a = fabsf(x[i]);
      if (a <= 3.40282347e38f)
        mx = a > mx ? a : mx;
      else
        bad = 1;
    }
    float A = optim_q_absmax(mx, bad), inv = optim_q_inv(A), Am = fabsf(A);
    if (optim_q_marked(A) != bad) ok = 0;
    for (size_t i = b; i < e; i++) {
      uint8_t c = sgn ? optim_q_put_s(x[i], inv) : optim_q_put_u(x[i], inv);
      float d = sgn ? optim_q_dec_s(c, A) : optim_q_dec_u(c, A);
      if (!optim_q_finite(x[i])) { /* inf and NaN keep their own element */
        if (isnan(x[i]) ? !isnan(d) : d != x[i]) ok = 0;
        continue;
      }
      double lin = sgn ? 0x1p-18 : 0x1p-34;
      double bound = (0x1p-4 * fabs((double)x[i]) + lin * Am) * (1 + 0x1p-16);
      if (Am == 0.0f) bound = fabs((double)x[i]); /* below the smallest normal: 0 */
      if (!(fabs((double)d - x[i]) <= bound)) {
        fprintf(stderr, "%s: x[%zu] %.9g decodes to %.9g (absmax %.9g, code 0x%02x)\n", what, i,
                x[i], d, A, c);
        ok = 0;
        break;
      }
    }
  }
  return ok;
}

static void test_codec(void) {
  enum { N = 256 * 40 + 77 };
  float *x = malloc(N * sizeof *x);
  REQUIRE(x);
  for (int sgn = 0; sgn <= 1; sgn++) {
    for (size_t i = 0; i < N; i++) /* uniform */
      x[i] = sgn ? srand1() : (float)urand();
    EXPECT(roundtrip(x, N, 256, sgn, "uniform"));
    for (size_t i = 0; i < N; i++) { /* Cauchy: heavy tails */
      double c = tan(3.14159265358979 * (urand() - 0.5));
      x[i] = (float)(sgn ? c : fabs(c));
    }
    EXPECT(roundtrip(x, N, 256, sgn, "cauchy"));
    for (size_t i = 0; i < N; i++) { /* lognormal over ~40 decades */
      double z = sqrt(-2 * log(urand())) * cos(6.283185307179586 * urand());
      double v = exp(z * 20.0);
      if (v > 1e30) v = 1e30;
      if (v < 1e-30) v = 1e-30;
      x[i] = (float)(sgn && (test_rand(&seed) & 1) ? -v : v);
    }
    EXPECT(roundtrip(x, N, 64, sgn, "lognormal"));
    memset(x, 0, N * sizeof *x); /* all zero */
    EXPECT(roundtrip(x, N, 256, sgn, "zero"));
    for (size_t i = 0; i < 100; i++) /* partial last block (n = 100, block 64) */
      x[i] = sgn ? srand1() * 1e-3f : (float)urand() * 1e-6f;
    EXPECT(roundtrip(x, 100, 64, sgn, "partial"));
    x[5] = NAN; /* non-finite: its own code, the rest of the block within the bound */
    EXPECT(roundtrip(x, 100, 64, sgn, "nan"));
    x[5] = INFINITY;
    EXPECT(roundtrip(x, 100, 64, sgn, "inf"));
    x[7] = sgn ? -INFINITY : NAN;
    EXPECT(roundtrip(x, 100, 64, sgn, "two non-finite"));
    for (size_t i = 64; i < 100; i++) /* a block of inf and NaN only: absmax -0 */
      x[i] = i & 1 ? NAN : INFINITY;
    EXPECT(roundtrip(x, 100, 64, sgn, "non-finite only"));
  }
  /* exact points of the code */
  EXPECT(optim_q_enc_s(1.0f, 1.0f) == 120 && optim_q_dec_s(120, 1.0f) == 1.0f);
  EXPECT(optim_q_enc_s(-1.0f, 1.0f) == (0x80 | 120) && optim_q_dec_s(0xF8, 2.0f) == -2.0f);
  EXPECT(optim_q_enc_u(1.0f, 1.0f) == 248 && optim_q_dec_u(248, 3.0f) == 3.0f);
  EXPECT(optim_q_enc_s(0x1p-14f, 1.0f) == 8 && optim_q_dec_s(8, 1.0f) == 0x1p-14f);
  EXPECT(optim_q_enc_s(-0x1p-30f, 1.0f) == 0); /* rounds to 0: no negative zero code */
  EXPECT(optim_q_enc_u(0x1p-30f, 1.0f) == 8 && optim_q_dec_u(3, 1.0f) == 3 * 0x1p-33f);
  EXPECT(optim_q_enc_s(1.0625f, 1.0f) == 120); /* tie: to even mantissa */
  EXPECT(optim_q_enc_s(1.1875f, 1.0f) == 122);
  free(x);
}

/* ---- a model of two spans and its buffers ---------------------------------- */

#define NSPAN 2
static const size_t span_n[NSPAN] = {1337, 2600};

typedef struct {
  void *p[NSPAN], *g[NSPAN], *s1[NSPAN], *s2[NSPAN], *pc[NSPAN];
  size_t pbytes[NSPAN], sbytes[NSPAN], cbytes[NSPAN];
} model;

static size_t dsz(int dt) { return dt == FERRY_DT_F32 ? 4 : 2; }

static void model_init(model *md, const ferry_optimizer_config *c, int gdt, int cdt,
                       unsigned long long s0) {
  unsigned long long sd = s0;
  int mdt = c->master_dtype ? c->master_dtype : FERRY_DT_F32;
  for (int s = 0; s < NSPAN; s++) {
    size_t n = span_n[s];
    md->pbytes[s] = n * dsz(mdt);
    md->sbytes[s] = ferry_optimizer_state_bytes(c, n);
    md->cbytes[s] = cdt ? n * dsz(cdt) : 0;
    md->p[s] = malloc(md->pbytes[s]);
    md->g[s] = malloc(n * dsz(gdt));
    md->s1[s] = calloc(1, md->sbytes[s]);
    md->s2[s] = calloc(1, md->sbytes[s]);
    md->pc[s] = cdt ? calloc(1, md->cbytes[s]) : NULL;
    REQUIRE(md->p[s] && md->g[s] && md->s1[s] && md->s2[s] && (!cdt || md->pc[s]));
    for (size_t i = 0; i < n; i++) {
      float v = (float)((test_rand(&sd) >> 40) / 16777216.0) - 0.5f;
      ferry_dt_store(md->p[s], mdt, i, v);
    }
  }
}

static void model_grads(model *md, int gdt, unsigned long long s0) {
  unsigned long long sd = s0;
  for (int s = 0; s < NSPAN; s++)
    for (size_t i = 0; i < span_n[s]; i++) {
      float v = ((float)((test_rand(&sd) >> 40) / 16777216.0) - 0.5f) * 0.1f;
      if (s == 1 && i >= 1024 && i < 1280) v *= 1e-4f; /* a block of small values */
      ferry_dt_store(md->g[s], gdt, i, v);
    }
}

static void model_free(model *md) {
  for (int s = 0; s < NSPAN; s++) {
    free(md->p[s]);
    free(md->g[s]);
    free(md->s1[s]);
    free(md->s2[s]);
    free(md->pc[s]);
  }
}

static int model_same(const model *a, const model *b) {
  for (int s = 0; s < NSPAN; s++)
    if (memcmp(a->p[s], b->p[s], a->pbytes[s]) || memcmp(a->s1[s], b->s1[s], a->sbytes[s]) ||
        memcmp(a->s2[s], b->s2[s], a->sbytes[s]) ||
        (a->cbytes[s] && memcmp(a->pc[s], b->pc[s], a->cbytes[s])))
      return 0;
  return 1;
}

static int model_step(ferry_optimizer *o, model *md, int gdt, int cdt, int nstate) {
  ferry_optim_span sp[NSPAN];
  uint64_t idx = 0;
  for (int s = 0; s < NSPAN; s++) {
    ferry_optim_span x = {md->p[s],  md->g[s], md->s1[s], nstate > 1 ? md->s2[s] : NULL,
                          md->pc[s], span_n[s], gdt,      cdt,       idx};
    sp[s] = x;
    idx += span_n[s];
  }
  return ferry_optimizer_step(o, sp, NSPAN, 0.5f);
}

/* The decoded state i of a span. */
static float state_at(const ferry_optimizer_config *c, void *buf, size_t n, size_t i, int sgn) {
  if (c->state_dtype != FERRY_DT_I8) return ferry_dt_load(buf, c->state_dtype, i);
  size_t b = c->state_block ? c->state_block : 256;
  float A = optim_q_absmax_ptr(buf, n)[i / b];
  uint8_t code = ((uint8_t *)buf)[i];
  return sgn ? optim_q_dec_s(code, A) : optim_q_dec_u(code, A);
}

static ferry_optimizer *make(ferry_optimizer_config c, const char *simd, int threads) {
  c.simd = simd;
  c.threads = threads;
  c.bind = 0;
  c.tile = 700; /* int8: rounded up to a multiple of the block */
  ferry_optimizer *o = NULL;
  int rc = ferry_optimizer_create(&c, &o);
  if (rc) fprintf(stderr, "create: %s\n", ferry_last_error());
  REQUIRE(rc == 0 && o);
  return o;
}

static const char *tname(int t) {
  return t == FERRY_OPTIM_ADAMW ? "adamw" : t == FERRY_OPTIM_ADAM ? "adam" : "lion";
}

/* One step of a combination against an fp32-state, fp32-master optimizer
 * started from the decoded compact state: with an fp32 master the params are
 * bit-identical (the update uses the fp32 states before requantization);
 * with a bf16 master the result is one of the two bf16 neighbours of the
 * reference. New states: int8 within the code's bound of the reference
 * (absmax exactly the block's max |reference|), bf16 within 2^-8 relative. */
static void test_vs_reference(ferry_optimizer_config c, int gdt, const char *ctx) {
  int ns = ferry_optimizer_state_count(&c);
  int mdt = c.master_dtype ? c.master_dtype : FERRY_DT_F32;
  ferry_optimizer_config rc = c;
  rc.state_dtype = FERRY_DT_F32;
  rc.master_dtype = FERRY_DT_F32;
  model cm, rm;
  model_init(&cm, &c, gdt, 0, 11);
  model_init(&rm, &rc, gdt, 0, 11);
  ferry_optimizer *o = make(c, "scalar", 1), *r = make(rc, "scalar", 1);
  size_t block = c.state_block ? c.state_block : 256;
  for (int step = 1; step <= 3; step++) {
    model_grads(&cm, gdt, 100 + step);
    model_grads(&rm, gdt, 100 + step);
    for (int s = 0; s < NSPAN; s++) /* the reference starts from the decoded state */
      for (size_t i = 0; i < span_n[s]; i++) {
        ((float *)rm.p[s])[i] = ferry_dt_load(cm.p[s], mdt, i);
        ((float *)rm.s1[s])[i] = state_at(&c, cm.s1[s], span_n[s], i, 1);
        if (ns > 1) ((float *)rm.s2[s])[i] = state_at(&c, cm.s2[s], span_n[s], i, 0);
      }
    REQUIRE(ferry_optimizer_set_step(r, step - 1) == 0);
    REQUIRE(model_step(o, &cm, gdt, 0, ns) == 0);
    REQUIRE(model_step(r, &rm, gdt, 0, ns) == 0);
    int bad = 0;
    for (int s = 0; s < NSPAN && !bad; s++) {
      size_t n = span_n[s];
      for (size_t i = 0; i < n && !bad; i++) {
        float ref = ((float *)rm.p[s])[i], got = ferry_dt_load(cm.p[s], mdt, i);
        if (mdt == FERRY_DT_F32) {
          bad = ferry_f32_bits(ref) != ferry_f32_bits(got);
        } else {
          uint32_t rb = ferry_f32_bits(ref);
          float lo = ferry_bf16_to_f32((uint16_t)(rb >> 16));
          float hi = ferry_bf16_to_f32((uint16_t)((rb >> 16) + 1));
          bad = !(got == lo || (got == hi && (rb & 0xFFFF)));
        }
        if (bad) fprintf(stderr, "%s step %d: p[%d][%zu] ref %.9g got %.9g\n", ctx, step, s, i,
                         ref, got);
        for (int k = 0; k < ns && !bad; k++) {
          float *rs = k ? rm.s2[s] : rm.s1[s];
          void *cs = k ? cm.s2[s] : cm.s1[s];
          float x = rs[i], d = state_at(&c, cs, n, i, k == 0), bound;
          if (c.state_dtype == FERRY_DT_I8) {
            size_t b0 = i / block * block, b1 = b0 + block < n ? b0 + block : n;
            float mx = 0;
            for (size_t j = b0; j < b1; j++)
              mx = fabsf(rs[j]) > mx ? fabsf(rs[j]) : mx;
            float A = optim_q_absmax_ptr(cs, n)[i / block];
            if (A != (mx < OPTIM_Q_TINY ? 0.0f : mx)) {
              bad = 1;
              fprintf(stderr, "%s: absmax %.9g, max |ref| %.9g\n", ctx, A, mx);
            }
            bound = (0x1p-4f * fabsf(x) + (k ? 0x1p-34f : 0x1p-18f) * mx) * (1 + 0x1p-16f);
          } else {
            bound = 0x1p-8f * fabsf(x);
          }
          if (!(fabsf(d - x) <= bound)) {
            bad = 1;
            fprintf(stderr, "%s step %d: state%d[%d][%zu] ref %.9g got %.9g\n", ctx, step, k + 1,
                    s, i, x, d);
          }
        }
      }
    }
    EXPECT(!bad);
  }
  ferry_optimizer_destroy(o);
  ferry_optimizer_destroy(r);
  model_free(&cm);
  model_free(&rm);
}

/* Runs `steps` steps of c from the same start; the final buffers in *out. */
static void run(model *out, ferry_optimizer_config c, const char *simd, int threads, int gdt,
                int cdt, int steps) {
  int ns = ferry_optimizer_state_count(&c);
  model_init(out, &c, gdt, cdt, 7);
  ferry_optimizer *o = make(c, simd, threads);
  for (int k = 1; k <= steps; k++) {
    model_grads(out, gdt, 200 + k);
    REQUIRE(model_step(o, out, gdt, cdt, ns) == 0);
  }
  ferry_optimizer_destroy(o);
}

static void test_determinism(ferry_optimizer_config c, int gdt, int cdt, const char *ctx) {
  int ns = ferry_optimizer_state_count(&c);
  model a, b, r;
  run(&a, c, "scalar", 1, gdt, cdt, 3);
  run(&b, c, "scalar", 2, gdt, cdt, 3);
  if (!model_same(&a, &b)) fprintf(stderr, "%s: 1 vs 2 threads differ\n", ctx);
  EXPECT(model_same(&a, &b));
  model_free(&b);
  run(&b, c, "scalar", 1, gdt, cdt, 3);
  EXPECT(model_same(&a, &b));
  model_free(&b);
  /* resume: two steps, then a fresh optimizer at step 2 takes the third */
  run(&r, c, "scalar", 2, gdt, cdt, 2);
  ferry_optimizer *o = make(c, "scalar", 2);
  REQUIRE(ferry_optimizer_set_step(o, 2) == 0);
  model_grads(&r, gdt, 203);
  REQUIRE(model_step(o, &r, gdt, cdt, ns) == 0);
  if (!model_same(&a, &r)) fprintf(stderr, "%s: resumed run differs\n", ctx);
  EXPECT(model_same(&a, &r));
  ferry_optimizer_destroy(o);
  model_free(&r);
  /* every SIMD level this CPU runs equals the scalar reference */
  const char *lv[] = {"avx2", "avx512"};
  for (int l = 0; l < 2; l++) {
    if (!optim_kernels_get(optim_simd_parse(lv[l]))) continue;
    run(&b, c, lv[l], 2, gdt, cdt, 3);
    if (!model_same(&a, &b)) fprintf(stderr, "%s: %s differs from scalar\n", ctx, lv[l]);
    EXPECT(model_same(&a, &b));
    model_free(&b);
  }
  model_free(&a);
}

/* ---- stochastic rounding --------------------------------------------------- */

static void sr_check(const float *got, size_t n, float exact, const char *ctx) {
  uint32_t eb = ferry_f32_bits(exact);
  float lo = ferry_bf16_to_f32((uint16_t)(eb >> 16)), hi = ferry_bf16_to_f32((uint16_t)((eb >> 16) + 1));
  double f = ((double)exact - lo) / ((double)hi - lo), sum = 0;
  size_t ups = 0, other = 0;
  for (size_t i = 0; i < n; i++) {
    sum += got[i];
    ups += got[i] == hi;
    other += got[i] != hi && got[i] != lo;
  }
  double mean = sum / (double)n, se = sqrt(f * (1 - f) / (double)n) * fabs((double)hi - lo);
  printf("%s: exact %.9g mean %.9g (%.2f standard errors), rounded up %.4f (p %.4f)\n", ctx,
         exact, mean, fabs(mean - exact) / se, (double)ups / (double)n, f);
  EXPECT(other == 0);
  EXPECT(fabs(mean - (double)exact) <= 3 * se);
  /* not round-to-nearest: that would round every trial the same way */
  EXPECT(ups > (size_t)(0.9 * f * (double)n) && ups < (size_t)(1.1 * f * (double)n) + 1);
}

static void test_sr(void) {
  enum { N = 100000 };
  float *got = malloc(N * sizeof *got);
  uint16_t *p = malloc(N * 2);
  float *g = malloc(N * 4);
  REQUIRE(got && p && g);
  /* 10^5 elements of one step through the optimizer (SGD, bf16 master):
   * p = 1 - lr x g lands 0.3 of a bf16 unit above 1 */
  ferry_optimizer_config c = ferry_optimizer_config_default(FERRY_OPTIM_SGD);
  c.master_dtype = FERRY_DT_BF16;
  c.lr = 1.0f;
  c.seed = 12345;
  ferry_optimizer *o = make(c, NULL, 2);
  float step = -0.3f * 0x1p-7f;
  for (size_t i = 0; i < N; i++) {
    p[i] = 0x3F80; /* 1.0 */
    g[i] = step;
  }
  ferry_optim_span sp = {p, g, NULL, NULL, NULL, N, FERRY_DT_F32, FERRY_DT_NONE, 1000};
  REQUIRE(ferry_optimizer_step(o, &sp, 1, 1.0f) == 0);
  for (size_t i = 0; i < N; i++)
    got[i] = ferry_bf16_to_f32(p[i]);
  sr_check(got, N, fmaf(-1.0f, step, 1.0f), "sr over elements");
  /* one element over 10^5 steps (the key of each step), a negative value */
  float x = -3.0f - 0.7f * 0x1p-6f;
  for (size_t k = 0; k < N; k++) {
    uint32_t key = optim_sr_key(99, (int64_t)k + 1);
    got[k] = ferry_bf16_to_f32(optim_bf16_sr(x, optim_sr_bits(optim_sr_hikey(key, 5), 5)));
  }
  sr_check(got, N, x, "sr over steps");
  /* NaN stays NaN, inf stays inf */
  EXPECT((optim_bf16_sr(NAN, 0xFFFF) & 0x7FFF) > 0x7F80);
  EXPECT(optim_bf16_sr(INFINITY, 0xFFFF) == 0x7F80);
  ferry_optimizer_destroy(o);
  free(got);
  free(p);
  free(g);
}

/* ---- refusals and non-finite blocks ---------------------------------------- */

static void test_edges(void) {
  ferry_optimizer *o = NULL;
  ferry_optimizer_config c = ferry_optimizer_config_default(FERRY_OPTIM_LAMB);
  c.state_dtype = FERRY_DT_I8;
  EXPECT(ferry_optimizer_create(&c, &o) == FERRY_EINVAL && !o);
  c = ferry_optimizer_config_default(FERRY_OPTIM_ADAMW);
  c.master_dtype = FERRY_DT_BF16;
  o = make(c, NULL, 1);
  uint16_t p[8] = {0};
  float g[8] = {0}, m[8] = {0}, v[8] = {0};
  uint16_t pc[8];
  ferry_optim_span sp = {p, g, m, v, pc, 8, FERRY_DT_F32, FERRY_DT_BF16, 0};
  EXPECT(ferry_optimizer_step(o, &sp, 1, 1.0f) == FERRY_EINVAL);
  EXPECT(strstr(ferry_optimizer_last_error(o), "copy_dtype") != NULL);
  ferry_optimizer_destroy(o);
  /* a NaN gradient: its own element turns NaN (the NaN codes), its block's
   * absmax is the max of the other, finite values, marked by its sign bit;
   * the other blocks are unmarked */
  c = ferry_optimizer_config_default(FERRY_OPTIM_ADAMW);
  c.state_dtype = FERRY_DT_I8;
  c.state_block = 32;
  o = make(c, NULL, 1);
  enum { N = 100 };
  float P[N], G[N];
  size_t sb = ferry_optimizer_state_bytes(&c, N);
  EXPECT(sb == 128 + 4 * 4);
  uint8_t *s1 = calloc(1, sb), *s2 = calloc(1, sb);
  REQUIRE(s1 && s2);
  for (int i = 0; i < N; i++) {
    P[i] = 1.0f;
    G[i] = 0.01f * (float)(i + 1);
  }
  G[40] = NAN;
  ferry_optim_span q = {P, G, s1, s2, NULL, N, FERRY_DT_F32, FERRY_DT_NONE, 0};
  REQUIRE(ferry_optimizer_step(o, &q, 1, 1.0f) == 0);
  float *A1 = optim_q_absmax_ptr(s1, N), *A2 = optim_q_absmax_ptr(s2, N);
  EXPECT(optim_q_marked(A1[1]) && optim_q_marked(A2[1]) && -A1[1] > 0 && -A2[1] > 0);
  EXPECT(s1[40] == OPTIM_Q_S_NAN && s2[40] == OPTIM_Q_U_NAN && s1[33] != 0 && s2[33] != 0);
  EXPECT(isfinite(A1[0]) && isfinite(A1[2]) && isfinite(A1[3]) && A1[3] > 0);
  EXPECT(!optim_q_marked(A1[0]) && !optim_q_marked(A2[2]));
  EXPECT(isfinite(P[0]) && isnan(P[40]) && isfinite(P[39]) && isfinite(P[41]) && isfinite(P[99]));
  free(s1);
  free(s2);
  ferry_optimizer_destroy(o);
}

/* The buffers of one int8 run: params (pb bytes), two zeroed states (sb
 * bytes each), n fp32 gradients. */
static void q_buffers(size_t pb, size_t sb, size_t n, unsigned char **p, unsigned char **s1,
                      unsigned char **s2, float **g) {
  *p = malloc(pb), *s1 = calloc(1, sb), *s2 = calloc(1, sb), *g = malloc(n * 4);
  REQUIRE(*p && *s1 && *s2 && *g);
}

/* Every code decoded by every level: int8 states holding all 256 codes under
 * absmax values of many scales, 0, subnormal-range, NaN and marked, inf/NaN/huge
 * gradients, a partial last block, stochastic-rounding counters across
 * 2^16 and 2^32; every level's params, codes and absmax equal the scalar
 * reference's. */
static void test_all_codes(void) {
  enum { N = 64 * 37 + 21 };
  /* the negative ones: marked blocks (inf and NaN codes) */
  const float amax[] = {1.0f, 3e-20f, 0.0f, 7e5f, NAN, 1e-37f, 2.5f, 1e30f, -1.0f, -0.0f, -7e5f};
  const size_t na = sizeof amax / sizeof amax[0];
  const char *lv[] = {"scalar", "avx2", "avx512"};
  const int types[] = {FERRY_OPTIM_ADAMW, FERRY_OPTIM_ADAM, FERRY_OPTIM_LION};
  for (int ti = 0; ti < 3; ti++)
    for (int mi = 0; mi < 2; mi++) {
      ferry_optimizer_config c = ferry_optimizer_config_default((ferry_optim_type)types[ti]);
      c.state_dtype = FERRY_DT_I8;
      c.state_block = 64;
      c.master_dtype = mi ? FERRY_DT_BF16 : FERRY_DT_F32;
      c.seed = 3;
      size_t sb = ferry_optimizer_state_bytes(&c, N), pb = N * (mi ? 2 : 4);
      unsigned char *ref[3] = {0}, *got[3] = {0};
      for (int l = 0; l < 3; l++) {
        if (l && !optim_kernels_get(optim_simd_parse(lv[l]))) continue;
        unsigned char *p, *s1, *s2;
        float *g;
        q_buffers(pb, sb, N, &p, &s1, &s2, &g);
        for (size_t i = 0; i < N; i++) {
          s1[i] = (uint8_t)(i * 7);
          s2[i] = (uint8_t)(i * 13 + 5);
          ferry_dt_store(p, c.master_dtype, i, (float)((i % 97) - 48) * 0.01f);
          g[i] = (float)((int)(i % 31) - 15) * 1e-3f;
        }
        g[100] = INFINITY, g[700] = NAN, g[900] = 3e38f, g[1300] = -1e-30f;
        float *A1 = optim_q_absmax_ptr(s1, N), *A2 = optim_q_absmax_ptr(s2, N);
        for (size_t k = 0; k < (N + 63) / 64; k++) {
          A1[k] = amax[k % na];
          A2[k] = isnan(amax[(k + 3) % na]) ? fabsf(amax[(k + 3) % na]) : amax[(k + 3) % na];
        }
        ferry_optimizer *o = make(c, lv[l], 1);
        /* stochastic-rounding counters: blocks inside one 2^16 range, blocks
         * across one, a tile across the high half of the index */
        const uint64_t base[3] = {77, 65536 - 40, (1ull << 32) - 30};
        ferry_optim_span sp = {p, g, s1, types[ti] == FERRY_OPTIM_LION ? NULL : s2, NULL, N,
                               FERRY_DT_F32, FERRY_DT_NONE, base[ti]};
        REQUIRE(ferry_optimizer_step(o, &sp, 1, 1.0f) == 0);
        REQUIRE(ferry_optimizer_step(o, &sp, 1, 1.0f) == 0);
        ferry_optimizer_destroy(o);
        got[0] = p, got[1] = s1, got[2] = s2;
        if (!l) {
          ref[0] = p, ref[1] = s1, ref[2] = s2;
        } else {
          int same = !memcmp(ref[0], p, pb) && !memcmp(ref[1], s1, sb) &&
                     (types[ti] == FERRY_OPTIM_LION || !memcmp(ref[2], s2, sb));
          if (!same) {
            fprintf(stderr, "all codes: %s %s master %s differs from scalar\n", lv[l],
                    tname(types[ti]), mi ? "bf16" : "fp32");
            for (int q = 0; q < 3; q++) {
              size_t len = q ? sb : pb;
              for (size_t j = 0; j < len; j++)
                if (ref[q][j] != got[q][j]) {
                  fprintf(stderr, "  buffer %d byte %zu: 0x%02x vs 0x%02x\n", q, j, ref[q][j],
                          got[q][j]);
                  break;
                }
            }
          }
          EXPECT(same);
          free(got[0]), free(got[1]), free(got[2]);
        }
        free(g);
      }
      free(ref[0]), free(ref[1]), free(ref[2]);
    }
}

/* Codes at exact ties (the SIMD encoders take the reference's spelling
 * only when a lane needs it): with beta1 = beta2 = 0, m' = g and v' = g^2
 * exactly; the block's largest g is 2, and the others sit halfway between
 * two codes (g = +-1.0625 x 2^-j for m, g = 1.25 x 2^-j for v, whose square
 * is 1.5625 x 2^-2j), or round up to even (1.1875), or land in the linear
 * range. Every level's codes, absmax and params equal the scalar ones. */
static void test_ties(void) {
  enum { N = 64 * 5 };
  const char *lv[] = {"scalar", "avx2", "avx512"};
  for (int mi = 0; mi < 2; mi++) {
    ferry_optimizer_config c = ferry_optimizer_config_default(FERRY_OPTIM_ADAMW);
    c.state_dtype = FERRY_DT_I8;
    c.state_block = 64;
    c.master_dtype = mi ? FERRY_DT_BF16 : FERRY_DT_F32;
    c.beta1 = 0.0f;
    c.beta2 = 0.0f;
    size_t sb = ferry_optimizer_state_bytes(&c, N), pb = N * (mi ? 2 : 4);
    unsigned char *ref[3] = {0};
    for (int l = 0; l < 3; l++) {
      if (l && !optim_kernels_get(optim_simd_parse(lv[l]))) continue;
      unsigned char *p, *s1, *s2;
      float *g;
      q_buffers(pb, sb, N, &p, &s1, &s2, &g);
      for (size_t i = 0; i < N; i++) {
        const float base[4] = {1.0625f, 1.25f, 1.1875f, -1.0625f};
        float x = ldexpf(base[i % 4], -(int)(i / 4 % 40));
        g[i] = i % 64 == 7 ? 2.0f : (i % 64 == 9 ? 3e-9f : x);
        ferry_dt_store(p, c.master_dtype, i, 0.5f);
      }
      ferry_optimizer *o = make(c, lv[l], 1);
      ferry_optim_span sp = {p, g, s1, s2, NULL, N, FERRY_DT_F32, FERRY_DT_NONE, 5};
      REQUIRE(ferry_optimizer_step(o, &sp, 1, 1.0f) == 0);
      ferry_optimizer_destroy(o);
      free(g);
      if (!l) {
        ref[0] = p, ref[1] = s1, ref[2] = s2;
        /* ties to even: 1.0625 / 2 -> 1.0 x 2^-1 (down), 1.1875 / 2 -> 1.25 x 2^-1
         * (up), 1.5625 / 4 -> 1.5 x 2^-2 (down) */
        EXPECT(s1[0] == 0x70 && s1[2] == 0x72 && s1[3] == 0xF0 && s2[1] == 0xEC);
        continue;
      }
      int same = !memcmp(ref[0], p, pb) && !memcmp(ref[1], s1, sb) && !memcmp(ref[2], s2, sb);
      if (!same) fprintf(stderr, "ties: %s master %s differs from scalar\n", lv[l], mi ? "bf16" : "fp32");
      EXPECT(same);
      free(p), free(s1), free(s2);
    }
    free(ref[0]), free(ref[1]), free(ref[2]);
  }
}

/* ---- inf and NaN keep their own element, as in fp32 states ----------------- */

/* Three steps of int8 states and of fp32 states (same master, same seed)
 * from the same params, the first step's gradients holding 1e21 (v
 * overflows to inf), NaN, +inf and -inf, one per block. fp32 states keep
 * every other weight finite; so must int8 ones, at every level: a weight is
 * NaN exactly where the fp32 run's is, the 1e21 weight is the fp32 run's bit
 * for bit (its update is 0: m / inf), and after the first step (both from
 * zero states) every weight is. Every level equals the scalar reference. */
static void test_poison(int type, int mdt) {
  enum { N = 4 * 256 + 40, STEPS = 3 };
  const size_t bad_at[] = {10, 300, 600, 900};
  const float bad_g[] = {1e21f, NAN, INFINITY, -INFINITY};
  const char *lv[] = {"scalar", "avx2", "avx512"};
  ferry_optimizer_config c = ferry_optimizer_config_default((ferry_optim_type)type);
  c.master_dtype = mdt;
  c.seed = 5;
  if (type == FERRY_OPTIM_LION) c.lr = 1e-3f;
  ferry_optimizer_config rc = c;
  c.state_dtype = FERRY_DT_I8;
  const int two = type != FERRY_OPTIM_LION;
  const size_t pb = N * (mdt == FERRY_DT_BF16 ? 2 : 4), sb = ferry_optimizer_state_bytes(&c, N);
  unsigned char *rp, *rs1, *rs2, *sp0 = NULL;
  float *g;
  q_buffers(pb, N * 4, N, &rp, &rs1, &rs2, &g);
  free(g);
  unsigned char *p0 = malloc(pb);
  REQUIRE(p0);
  for (size_t i = 0; i < N; i++)
    ferry_dt_store(p0, mdt, i, srand1() * 0.5f);
  memcpy(rp, p0, pb);
  ferry_optimizer *r = make(rc, "scalar", 1);
  float *gs[STEPS];
  for (int st = 0; st < STEPS; st++) {
    gs[st] = malloc(N * 4);
    REQUIRE(gs[st]);
    for (size_t i = 0; i < N; i++)
      gs[st][i] = srand1() * 0.01f;
    if (!st)
      for (int j = 0; j < 4; j++)
        gs[st][bad_at[j]] = bad_g[j];
  }
  /* the fp32-state run, kept after each step */
  unsigned char *ref[STEPS];
  for (int st = 0; st < STEPS; st++) {
    ferry_optim_span sp = {rp, gs[st], rs1, two ? rs2 : NULL, NULL, N, FERRY_DT_F32, FERRY_DT_NONE, 0};
    REQUIRE(ferry_optimizer_step(r, &sp, 1, 1.0f) == 0);
    ref[st] = malloc(pb);
    REQUIRE(ref[st]);
    memcpy(ref[st], rp, pb);
  }
  ferry_optimizer_destroy(r);
  for (int l = 0; l < 3; l++) {
    if (l && !optim_kernels_get(optim_simd_parse(lv[l]))) continue;
    unsigned char *p, *s1, *s2;
    q_buffers(pb, sb, N, &p, &s1, &s2, &g);
    free(g);
    memcpy(p, p0, pb);
    ferry_optimizer *o = make(c, lv[l], 1);
    int bad = 0;
    for (int st = 0; st < STEPS && !bad; st++) {
      ferry_optim_span sp = {p, gs[st], s1, two ? s2 : NULL, NULL, N, FERRY_DT_F32, FERRY_DT_NONE, 0};
      EXPECT(ferry_optimizer_step(o, &sp, 1, 1.0f) == 0);
      size_t nans = 0;
      for (size_t i = 0; i < N && !bad; i++) {
        float want = ferry_dt_load(ref[st], mdt, i), got = ferry_dt_load(p, mdt, i);
        int exact = st == 0 || i == bad_at[0];
        nans += isnan(got);
        if (isnan(want) ? !isnan(got)
                        : !isfinite(got) || (exact && ferry_f32_bits(want) != ferry_f32_bits(got))) {
          fprintf(stderr, "poison: %s %s master %s step %d: p[%zu] %.9g, fp32 states %.9g\n",
                  lv[l], tname(type), mdt == FERRY_DT_BF16 ? "bf16" : "fp32", st + 1, i, got, want);
          bad = 1;
        }
      }
      EXPECT(nans == (two ? 3u : 1u)); /* Lion: sign(inf) is finite; Adam: inf / inf */
    }
    EXPECT(!bad);
    /* the states: inf, NaN and finite where the fp32 run's are (the
     * overflowed v is inf, its m finite) */
    float *A1 = optim_q_absmax_ptr(s1, N), *A2 = optim_q_absmax_ptr(s2, N);
    int cls_bad = 0;
    for (size_t i = 0; i < N; i++)
      for (int k = 0; k < 1 + two; k++) {
        float want = ((float *)(k ? rs2 : rs1))[i];
        float got = k ? optim_q_dec_u(s2[i], A2[i / 256]) : optim_q_dec_s(s1[i], A1[i / 256]);
        if (isnan(want) != isnan(got) || (isinf(want) && want != got) || (isinf(got) && want != got))
          cls_bad = 1;
      }
    EXPECT(!cls_bad);
    EXPECT(isinf(((float *)(two ? rs2 : rs1))[bad_at[two ? 0 : 2]]) && isfinite(((float *)rs1)[10]));
    if (!sp0) {
      sp0 = malloc(pb + 2 * sb);
      REQUIRE(sp0);
      memcpy(sp0, p, pb), memcpy(sp0 + pb, s1, sb), memcpy(sp0 + pb + sb, s2, sb);
    } else {
      EXPECT(!memcmp(sp0, p, pb) && !memcmp(sp0 + pb, s1, sb) && !memcmp(sp0 + pb + sb, s2, sb));
    }
    ferry_optimizer_destroy(o);
    free(p), free(s1), free(s2);
  }
  for (int st = 0; st < STEPS; st++)
    free(gs[st]), free(ref[st]);
  free(p0), free(sp0), free(rp), free(rs1), free(rs2);
}

int main(void) {
  test_codec();
  test_ties();
  test_all_codes();
  test_sr();
  test_edges();
  for (int mi = 0; mi < 2; mi++) {
    test_poison(FERRY_OPTIM_ADAMW, mi ? FERRY_DT_BF16 : FERRY_DT_F32);
    test_poison(FERRY_OPTIM_ADAM, mi ? FERRY_DT_BF16 : FERRY_DT_F32);
    test_poison(FERRY_OPTIM_LION, mi ? FERRY_DT_BF16 : FERRY_DT_F32);
  }
  const int types[] = {FERRY_OPTIM_ADAMW, FERRY_OPTIM_ADAM, FERRY_OPTIM_LION};
  const int sdts[] = {FERRY_DT_F32, FERRY_DT_BF16, FERRY_DT_I8};
  for (int ti = 0; ti < 3; ti++)
    for (int si = 0; si < 3; si++)
      for (int mi = 0; mi < 2; mi++) {
        ferry_optimizer_config c = ferry_optimizer_config_default((ferry_optim_type)types[ti]);
        c.state_dtype = sdts[si];
        c.master_dtype = mi ? FERRY_DT_BF16 : FERRY_DT_F32;
        c.state_block = si == 2 && ti == 1 ? 64 : 0;
        c.seed = 42;
        if (c.type == FERRY_OPTIM_LION) c.lr = 1e-3f;
        char ctx[96];
        snprintf(ctx, sizeof ctx, "%s state %s master %s", tname(types[ti]),
                 si == 0 ? "fp32" : si == 1 ? "bf16" : "int8", mi ? "bf16" : "fp32");
        if (si) test_vs_reference(c, FERRY_DT_BF16, ctx);
        for (int gi = 0; gi < 2; gi++) {
          int gdt = gi ? FERRY_DT_BF16 : FERRY_DT_F32;
          test_determinism(c, gdt, mi ? FERRY_DT_NONE : FERRY_DT_BF16, ctx);
        }
      }
  /* bf16 master for the other optimizers of the generic path */
  const int others[] = {FERRY_OPTIM_SGD, FERRY_OPTIM_ADAGRAD, FERRY_OPTIM_LAMB};
  for (int k = 0; k < 3; k++) {
    ferry_optimizer_config c = ferry_optimizer_config_default((ferry_optim_type)others[k]);
    c.master_dtype = FERRY_DT_BF16;
    c.momentum = others[k] == FERRY_OPTIM_SGD ? 0.9f : 0.0f;
    test_determinism(c, FERRY_DT_BF16, FERRY_DT_NONE, "bf16 master (sgd/adagrad/lamb)");
  }
  return test_finish("optim.compact");
}
