/* tests/optim/test_kernels.c — every SIMD kernel against the scalar
 * reference: each optimizer x grad dtype x state dtype x copy dtype x SIMD
 * level, lengths 0, 1 and off the vector width, misaligned pointers, NaN and
 * inf gradients, special param values for the 16-bit copies. fp32 results
 * must be bit-exact (same operations in the same order).
 */
#include "optim/optim.h"
#include "optim/scalar_impl.h"
#include "tests/test.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static unsigned long long seed = 0x9e3779b97f4a7c15ull;

static float frand(void) { return (float)((test_rand(&seed) >> 11) * (1.0 / 9007199254740992.0)); }
static float srand1(void) { return 2.0f * frand() - 1.0f; }

static size_t esz(int dt) { return dt == FERRY_DT_F32 ? 4 : 2; }

/* 16-bit equal, allowing what the AVX512-BF16 instruction does differently:
 * subnormal results flushed to zero. */
static int eq16(uint16_t ref, uint16_t got, int dt, int native) {
  if (ref == got) return 1;
  int refnan = dt == FERRY_DT_BF16 ? (ref & 0x7fff) > 0x7f80 : (ref & 0x7fff) > 0x7c00;
  int gotnan = dt == FERRY_DT_BF16 ? (got & 0x7fff) > 0x7f80 : (got & 0x7fff) > 0x7c00;
  if (refnan && gotnan) return 1;
  if (native && dt == FERRY_DT_BF16 && (ref & 0x7f80) == 0 && (got & 0x7fff) == 0) return 1;
  return 0;
}

static int eqf(float ref, float got) {
  if (isnan(ref) && isnan(got)) return 1;
  return ferry_f32_bits(ref) == ferry_f32_bits(got);
}

static int cmp_buf(const void *ref, const void *got, int dt, size_t n, int native, const char *what,
                   const char *ctx) {
  for (size_t i = 0; i < n; i++) {
    int ok = dt == FERRY_DT_F32
                 ? eqf(((const float *)ref)[i], ((const float *)got)[i])
                 : eq16(((const uint16_t *)ref)[i], ((const uint16_t *)got)[i], dt, native);
    if (!ok) {
      if (dt == FERRY_DT_F32)
        fprintf(stderr, "%s: %s[%zu]: ref %.9g (0x%08x) got %.9g (0x%08x)\n", ctx, what, i,
                ((const float *)ref)[i], ferry_f32_bits(((const float *)ref)[i]), ((const float *)got)[i],
                ferry_f32_bits(((const float *)got)[i]));
      else
        fprintf(stderr, "%s: %s[%zu]: ref 0x%04x got 0x%04x\n", ctx, what, i,
                ((const uint16_t *)ref)[i], ((const uint16_t *)got)[i]);
      return 0;
    }
  }
  return 1;
}

#define MAXN 1100

typedef struct {
  float p[MAXN + 16];
  unsigned char g[4 * (MAXN + 16)], s1[4 * (MAXN + 16)], s2[4 * (MAXN + 16)], pc[4 * (MAXN + 16)];
} bufs;

static void fill(bufs *b, int gdt, int sdt, int special) {
  for (size_t i = 0; i < MAXN + 16; i++) {
    float p = srand1(), g = srand1() * 2.0f, m = srand1() * 0.1f, v = frand() * 0.01f;
    if (special) {
      /* param bit patterns of every kind for the 16-bit copies */
      uint32_t u = (uint32_t)test_rand(&seed);
      switch (i % 8) {
      case 0: p = ferry_f32_from_bits(u); break; /* anything, NaN included */
      case 1: p = ferry_f32_from_bits((u & 0x807fffffu) | 0x33000000u); break; /* near 2^-25 */
      case 2: p = ferry_f32_from_bits((u & 0x80ffffffu) | 0x38000000u); break; /* fp16 subnormal edge */
      case 3: p = 65504.0f + (float)(u % 64); break;                     /* fp16 overflow edge */
      case 4: p = ferry_f32_from_bits((u & 0x807fffffu)); break;               /* fp32 subnormal */
      case 5: p = ferry_f32_from_bits((u & 0xffff8000u) | 0x8000u); break;     /* bf16 ties */
      default: break;
      }
      if (i % 37 == 5) g = NAN;
      if (i % 41 == 7) g = INFINITY;
      if (i % 43 == 9) g = -INFINITY;
      if (i % 47 == 3) g = 1e30f; /* fp16: rounds to inf */
    }
    b->p[i] = p;
    ferry_dt_store(b->g, gdt, i, g);
    ferry_dt_store(b->s1, sdt, i, m);
    ferry_dt_store(b->s2, sdt, i, v);
  }
  memset(b->pc, 0x5a, sizeof b->pc);
}

static optim_tile tile_of(bufs *b, size_t off, size_t n, int gdt, int sdt, int cdt, int type,
                          int momentum) {
  optim_tile t;
  memset(&t, 0, sizeof t);
  t.p = b->p + off;
  t.g = b->g + off * esz(gdt);
  int need1 = type != FERRY_OPTIM_SGD || momentum;
  int need2 = type == FERRY_OPTIM_ADAMW || type == FERRY_OPTIM_ADAM || type == FERRY_OPTIM_LAMB;
  t.s1 = need1 ? b->s1 + off * esz(sdt) : NULL;
  t.s2 = need2 ? b->s2 + off * esz(sdt) : NULL;
  t.pc = cdt ? b->pc + off * esz(cdt) : NULL;
  t.n = n;
  t.gdt = gdt;
  t.sdt = sdt;
  t.cdt = cdt;
  t.trust = 0.75f;
  return t;
}

typedef struct {
  int type;
  float momentum, dampening, wd;
  int nesterov;
  const char *name;
} variant;

static const variant variants[] = {
    {FERRY_OPTIM_ADAMW, 0, 0, 0.01f, 0, "adamw"},
    {FERRY_OPTIM_ADAM, 0, 0, 0.01f, 0, "adam-l2"},
    {FERRY_OPTIM_ADAM, 0, 0, 0.0f, 0, "adam"},
    {FERRY_OPTIM_ADAGRAD, 0, 0, 0.01f, 0, "adagrad"},
    {FERRY_OPTIM_LAMB, 0, 0, 0.01f, 0, "lamb"},
    {FERRY_OPTIM_SGD, 0, 0, 0.01f, 0, "sgd"},
    {FERRY_OPTIM_SGD, 0.9f, 0.1f, 0.01f, 0, "sgd-momentum"},
    {FERRY_OPTIM_SGD, 0.9f, 0, 0.0f, 1, "sgd-nesterov"},
    {FERRY_OPTIM_LION, 0, 0, 0.1f, 0, "lion"},
};

static const char *dtn(int dt) {
  return dt == FERRY_DT_F16    ? "f16"
         : dt == FERRY_DT_BF16 ? "bf16"
         : dt == FERRY_DT_F32  ? "f32"
                               : "none";
}

static bufs A, B; /* reference, candidate */

static int run_case(const optim_kernels *k, int native, const variant *vr, int gdt, int sdt,
                    int cdt, size_t n, size_t off, int64_t t, int special) {
  ferry_optimizer_config cfg = ferry_optimizer_config_default((ferry_optim_type)vr->type);
  cfg.momentum = vr->momentum;
  cfg.dampening = vr->dampening;
  cfg.nesterov = vr->nesterov;
  cfg.weight_decay = vr->wd;
  cfg.lr = vr->type == FERRY_OPTIM_LION ? 1e-3f : 1e-2f;
  cfg.lr_decay = vr->type == FERRY_OPTIM_ADAGRAD ? 0.01f : 0.0f;
  optim_scalars s;
  optim_scalars_make(&s, &cfg, cfg.lr, t, special ? 0.5f : 0.125f);
  optim_scalars sn = s;
  sn.native_bf16 = native;
  fill(&A, gdt, sdt, special);
  memcpy(&B, &A, sizeof A);
  int mom = vr->momentum != 0.0f;
  optim_tile ta = tile_of(&A, off, n, gdt, sdt, cdt, vr->type, mom);
  optim_tile tb = tile_of(&B, off, n, gdt, sdt, cdt, vr->type, mom);
  char ctx[160];
  snprintf(ctx, sizeof ctx, "%s%s %s g=%s s=%s c=%s n=%zu off=%zu t=%lld%s", k->name,
           native ? "+bf16" : "", vr->name, dtn(gdt), dtn(sdt), dtn(cdt), n, off, (long long)t,
           special ? " special" : "");
  int ok = 1;
  if (vr->type == FERRY_OPTIM_LAMB) {
    double pa = 0, ua = 0, pb = 0, ub = 0;
    optim_kernels_scalar.lamb_phase1(&s, &ta, &pa, &ua);
    k->lamb_phase1(&sn, &tb, &pb, &ub);
    if (!(fabs(pa - pb) <= 1e-12 * fabs(pa) + 1e-300 || (isnan(pa) && isnan(pb))) ||
        !(fabs(ua - ub) <= 1e-12 * fabs(ua) + 1e-300 || (isnan(ua) && isnan(ub)))) {
      fprintf(stderr, "%s: lamb sums ref (%.17g, %.17g) got (%.17g, %.17g)\n", ctx, pa, ua, pb, ub);
      ok = 0;
    }
  }
  optim_kernels_scalar.step(&s, &ta);
  k->step(&sn, &tb);
  size_t tot = MAXN + 16;
  ok &= cmp_buf(A.p, B.p, FERRY_DT_F32, tot, native, "p", ctx);
  ok &= cmp_buf(A.s1, B.s1, sdt, tot, native, "s1", ctx);
  ok &= cmp_buf(A.s2, B.s2, sdt, tot, native, "s2", ctx);
  if (cdt) ok &= cmp_buf(A.pc, B.pc, cdt, tot, native, "copy", ctx);
  return ok;
}

static void test_steps(const optim_kernels *k, int native) {
  static const size_t lens[] = {0, 1, 7, 8, 15, 16, 17, 31, 33, 100, 1000, 1027};
  int fails = 0;
  for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++)
    for (int gdt = FERRY_DT_F32; gdt <= FERRY_DT_BF16; gdt++)
      for (int sdt = FERRY_DT_F32; sdt <= FERRY_DT_BF16; sdt += 2)
        for (int cdt = FERRY_DT_NONE; cdt <= FERRY_DT_BF16; cdt++)
          for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
            for (size_t off = 0; off <= 1; off++)
              for (int special = 0; special <= 1; special++) {
                int64_t t = (li & 1) ? 1 : 5;
                if (!run_case(k, native, &variants[v], gdt, sdt, cdt, lens[li],
                              off + (li % 3 == 2 ? 2 : 0), t, special) &&
                    ++fails > 20)
                  REQUIRE(!"too many kernel mismatches");
              }
  EXPECT(fails == 0);
}

static void test_helpers(const optim_kernels *k) {
  static float f[MAXN + 16];
  static uint16_t h[MAXN + 16], bh[MAXN + 16];
  for (size_t i = 0; i < MAXN + 16; i++) {
    f[i] = srand1() * 100.0f;
    h[i] = ferry_f32_to_f16(f[i]);
    bh[i] = ferry_f32_to_bf16(f[i]);
  }
  const void *src[3] = {f, h, bh};
  for (int dt = FERRY_DT_F32; dt <= FERRY_DT_BF16; dt++) {
    const char *base = src[dt - 1];
    for (size_t n = 0; n < 1050; n += 17) {
      size_t off = n % 3;
      double r = optim_kernels_scalar.sumsq(base + off * esz(dt), dt, n);
      double g = k->sumsq(base + off * esz(dt), dt, n);
      EXPECT(fabs(r - g) <= 1e-12 * r);
      static float a1[MAXN + 16], a2[MAXN + 16];
      for (size_t i = 0; i < MAXN + 16; i++)
        a1[i] = a2[i] = srand1();
      optim_kernels_scalar.accumulate(a1 + off, base + off * esz(dt), dt, n, 0.25f);
      k->accumulate(a2 + off, base + off * esz(dt), dt, n, 0.25f);
      EXPECT(memcmp(a1, a2, sizeof a1) == 0);
    }
  }
  /* inf and NaN anywhere (body or tail) make the sum non-finite */
  for (size_t pos = 0; pos < 40; pos++) {
    float save = f[pos];
    f[pos] = pos & 1 ? NAN : -INFINITY;
    EXPECT(!isfinite(k->sumsq(f, FERRY_DT_F32, 40)));
    f[pos] = save;
    uint16_t hs = h[pos];
    h[pos] = 0x7c00; /* fp16 inf */
    EXPECT(!isfinite(k->sumsq(h, FERRY_DT_F16, 40)));
    h[pos] = hs;
  }
  EXPECT(isfinite(k->sumsq(f, FERRY_DT_F32, 40)));
}

/* The scalar conversions against their definition. */
static void test_conversions(void) {
  /* fp16 -> fp32 -> fp16 is the identity on every non-NaN pattern */
  for (uint32_t b = 0; b < 65536; b++) {
    float x = ferry_f16_to_f32((uint16_t)b);
    uint16_t back = ferry_f32_to_f16(x);
    if ((b & 0x7fff) > 0x7c00)
      EXPECT(isnan(x) && (back & 0x7fff) > 0x7c00);
    else if (back != b) {
      fprintf(stderr, "f16 0x%04x -> %g -> 0x%04x\n", b, x, back);
      EXPECT(back == b);
      break;
    }
  }
  EXPECT(ferry_f32_to_f16(65519.0f) == 0x7bff);
  EXPECT(ferry_f32_to_f16(65520.0f) == 0x7c00);
  EXPECT(ferry_f32_to_f16(-1e9f) == 0xfc00);
  EXPECT(ferry_f32_to_f16(5.9604644775390625e-8f) == 0x0001);  /* 2^-24 */
  EXPECT(ferry_f32_to_f16(2.98023223876953125e-8f) == 0x0000); /* 2^-25 ties to even 0 */
  EXPECT(ferry_f32_to_f16(2.9802326e-8f) == 0x0001);           /* just above */
  EXPECT(ferry_f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00);      /* tie to even */
  EXPECT(ferry_f32_to_f16(1.0f + 3.0f / 2048) == 0x3c02);
  EXPECT((ferry_f32_to_f16(NAN) & 0x7fff) > 0x7c00);
  EXPECT(ferry_f32_to_bf16(1.0f) == 0x3f80);
  EXPECT(ferry_f32_to_bf16(ferry_f32_from_bits(0x3f808000u)) == 0x3f80); /* tie to even */
  EXPECT(ferry_f32_to_bf16(ferry_f32_from_bits(0x3f818000u)) == 0x3f82);
  EXPECT(ferry_f32_to_bf16(ferry_f32_from_bits(0x7f7fffffu)) == 0x7f80); /* rounds to inf */
  EXPECT((ferry_f32_to_bf16(NAN) & 0x7fff) > 0x7f80);
  EXPECT((ferry_f32_to_bf16(ferry_f32_from_bits(0x7f800001u)) & 0x7fff) > 0x7f80); /* NaN kept */
  for (uint32_t b = 0; b < 65536; b++) {
    if ((b & 0x7fff) > 0x7f80) continue;
    EXPECT(ferry_f32_to_bf16(ferry_bf16_to_f32((uint16_t)b)) == b);
  }
}

int main(void) {
  test_conversions();
  int tested = 0;
  for (int level = OPTIM_SIMD_AVX2; level < OPTIM_SIMD_COUNT; level++) {
    const optim_kernels *k = optim_kernels_get(level);
    if (!k) {
      printf("%s kernels: not supported by this CPU, skipped\n",
             level == OPTIM_SIMD_AVX2 ? "avx2" : "avx512");
      continue;
    }
    tested++;
    test_steps(k, 0);
    if (level == OPTIM_SIMD_AVX512 && (ferry_cpu_simd() & FERRY_SIMD_AVX512BF16)) test_steps(k, 1);
    test_helpers(k);
    printf("%s kernels: checked against the scalar reference\n", k->name);
  }
  test_steps(&optim_kernels_scalar, 0); /* the reference against itself: harness sanity */
  if (!tested) printf("no SIMD level on this CPU: only the scalar reference was checked\n");
  return test_finish("optim.kernels");
}
