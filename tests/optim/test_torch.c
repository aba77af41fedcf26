/* tests/optim/test_torch.c — ferry's CPU optimizers against PyTorch's
 * torch.optim (AdamW, Adam, Adagrad, SGD) over 300 steps, from the committed
 * fixture written by gen_torch_fixtures.py (params and grads come from a hash
 * both sides compute exactly). Every SIMD level the CPU has is checked.
 * usage: test_optim_torch <torch_fixtures.txt>
 */
#include "optim/optim.h"
#include "optim/scalar_impl.h"
#include "tests/test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

static float hval(uint64_t seed, uint64_t step, uint64_t i) {
  uint64_t h = splitmix64((seed * 1000003u + step) * 1000003u + i);
  return (float)(((double)(h >> 40) / 16777216.0) * 2.0 - 1.0);
}

#define MAXN   256
#define MAXCHK 8

typedef struct {
  char name[64], gdt[8];
  int type, n, steps, nesterov;
  float lr, b1, b2, eps, wd, mom, damp, lrd, scale;
  int nchk, chk_step[MAXCHK];
  float chk_p[MAXCHK][MAXN];
  float s1[MAXN], s2[MAXN];
  int has_s1, has_s2;
} fcase;

static int read_floats(FILE *f, float *x, int n) {
  for (int i = 0; i < n; i++)
    if (fscanf(f, "%f", &x[i]) != 1) return -1;
  return 0;
}

/* Reads the next case; 0 at end of file, -1 on a malformed file. */
static int read_case(FILE *f, fcase *c) {
  char tok[64];
  memset(c, 0, sizeof *c);
  for (;;) {
    if (fscanf(f, "%63s", tok) != 1) return 0;
    if (tok[0] == '#') {
      int ch;
      while ((ch = fgetc(f)) != EOF && ch != '\n') {
      }
      continue;
    }
    break;
  }
  if (strcmp(tok, "case")) return -1;
  if (fscanf(f, "%63s %d %d %d %f %f %f %f %f %f %f %d %f %7s %f", c->name, &c->type, &c->n,
             &c->steps, &c->lr, &c->b1, &c->b2, &c->eps, &c->wd, &c->mom, &c->damp, &c->nesterov,
             &c->lrd, c->gdt, &c->scale) != 15 ||
      c->n > MAXN)
    return -1;
  for (;;) {
    if (fscanf(f, "%63s", tok) != 1) return -1;
    if (!strcmp(tok, "end")) return 1;
    if (!strcmp(tok, "p")) {
      if (c->nchk == MAXCHK || fscanf(f, "%d", &c->chk_step[c->nchk]) != 1 ||
          read_floats(f, c->chk_p[c->nchk], c->n))
        return -1;
      c->nchk++;
    } else if (!strcmp(tok, "s1")) {
      if (read_floats(f, c->s1, c->n)) return -1;
      c->has_s1 = 1;
    } else if (!strcmp(tok, "s2")) {
      if (read_floats(f, c->s2, c->n)) return -1;
      c->has_s2 = 1;
    } else {
      return -1;
    }
  }
}

/* |a - b| <= rtol |b| + atol, reporting the worst element. */
static int close_all(const float *got, const float *want, int n, double rtol, double atol,
                     const char *what, const char *ctx) {
  double worst = 0;
  int wi = 0;
  for (int i = 0; i < n; i++) {
    double d = fabs((double)got[i] - want[i]) / (rtol * fabs(want[i]) + atol);
    if (!(d <= worst)) {
      worst = d;
      wi = i;
    }
  }
  if (!(worst <= 1.0)) {
    fprintf(stderr, "%s: %s[%d] = %.9g, torch %.9g (%.2f x tolerance)\n", ctx, what, wi, got[wi],
            want[wi], worst);
    return 0;
  }
  return 1;
}

static void run_case(const fcase *c, int seed, const char *simd) {
  ferry_optimizer_config cfg = ferry_optimizer_config_default((ferry_optim_type)c->type);
  cfg.lr = c->lr;
  cfg.beta1 = c->b1;
  cfg.beta2 = c->b2;
  cfg.eps = c->eps;
  cfg.weight_decay = c->wd;
  cfg.momentum = c->mom;
  cfg.dampening = c->damp;
  cfg.nesterov = c->nesterov;
  cfg.lr_decay = c->lrd;
  cfg.threads = 1;
  cfg.simd = simd;
  ferry_optimizer *o = NULL;
  REQUIRE(ferry_optimizer_create(&cfg, &o) == 0);
  static float p[MAXN], m[MAXN], v[MAXN], g32[MAXN];
  static uint16_t g16[MAXN];
  memset(m, 0, sizeof m);
  memset(v, 0, sizeof v);
  for (int i = 0; i < c->n; i++)
    p[i] = hval((uint64_t)seed, 0, (uint64_t)i);
  int bf = !strcmp(c->gdt, "bf16");
  ferry_optim_span sp = {p,
                         bf ? (const void *)g16 : (const void *)g32,
                         m,
                         v,
                         NULL,
                         (size_t)c->n,
                         bf ? FERRY_DT_BF16 : FERRY_DT_F32,
                         FERRY_DT_NONE,
                         0};
  char ctx[128];
  int k = 0;
  /* fp32 rounding differs from torch's in order (lerp vs fma, divide by
   * sqrt(bc2) vs multiply): allow a few hundred ulps after 300 steps */
  const double rtol = 2e-5, atol = 2e-6;
  for (int step = 1; step <= c->steps; step++) {
    for (int i = 0; i < c->n; i++) {
      float g = hval((uint64_t)seed, (uint64_t)step, (uint64_t)i);
      if (bf)
        g16[i] = ferry_f32_to_bf16(ferry_bf16_to_f32(ferry_f32_to_bf16(g)) * c->scale);
      else
        g32[i] = g * c->scale;
    }
    EXPECT_EQ_INT(ferry_optimizer_step(o, &sp, 1, 1.0f / c->scale), 0);
    if (k < c->nchk && c->chk_step[k] == step) {
      snprintf(ctx, sizeof ctx, "%s (%s) step %d", c->name, simd, step);
      EXPECT(close_all(p, c->chk_p[k], c->n, rtol, atol, "p", ctx));
      k++;
    }
  }
  snprintf(ctx, sizeof ctx, "%s (%s) final", c->name, simd);
  if (c->has_s1) EXPECT(close_all(m, c->s1, c->n, rtol, atol * 1e-2, "state1", ctx));
  if (c->has_s2) EXPECT(close_all(v, c->s2, c->n, rtol, 1e-10, "state2", ctx));
  EXPECT_EQ_INT(k, c->nchk);
  ferry_optimizer_destroy(o);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s <torch_fixtures.txt>\n", argv[0]);
    return 2;
  }
  FILE *f = fopen(argv[1], "r");
  if (!f) {
    fprintf(stderr, "%s: cannot open %s\n", argv[0], argv[1]);
    return 1;
  }
  static fcase c;
  int seed = 0, rc;
  static const char *levels[] = {"scalar", "avx2", "avx512"};
  while ((rc = read_case(f, &c)) == 1) {
    seed++;
    for (int l = 0; l < OPTIM_SIMD_COUNT; l++)
      if (optim_kernels_get(l)) run_case(&c, seed, levels[l]);
    printf("%s: %d steps match torch\n", c.name, c.steps);
  }
  fclose(f);
  REQUIRE(rc == 0);
  EXPECT(seed >= 7);
  return test_finish("optim.torch");
}
