/* tests/gpt/test_reference.c — the CPU model against PyTorch, for the tiny
 * GPT-2 and the tiny Llama of tests/fixtures/gpt (made once by
 * examples/gpt/tools/gen_reference.py): logits, loss and every parameter
 * gradient, with and without activation checkpointing, then 10 AdamW steps'
 * losses. Tolerances (fp32 both sides, different summation orders):
 *   logits, loss       |c - t| <= 1e-5 + 1e-5 |t|
 *   each gradient      max |c - t| <= 2e-5 * max |t| + 1e-7   (per tensor)
 *   training losses    |c - t| <= 2e-5 * |t|   (10 steps compound rounding)
 * argv[1]: tests/fixtures/gpt.
 */
#include "gpt.h"

#include "ferry.h"
#include "tests/test.h"
#include "tests/gpt/fixture_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TOL_ABS 1e-5
#define TOL_REL 1e-5
#define TOL_GRAD 2e-5
#define TOL_TRAIN 2e-5

static double g_max_logit, g_max_grad, g_max_train;

static void *read_all(ferry_safetensors *f, const char *name, size_t *n, ferry_dtype want) {
  ferry_safetensors_tensor t;
  size_t idx;
  if (ferry_safetensors_find(f, name, &t, &idx) || t.dtype != want) {
    fprintf(stderr, "reference: no %s tensor '%s'\n", ferry_dtype_name(want), name);
    exit(1);
  }
  void *b = malloc(t.nbytes ? t.nbytes : 1);
  REQUIRE(ferry_safetensors_read(f, idx, 0, b, t.nbytes) == 0);
  if (n) *n = t.numel;
  return b;
}

static void run_family(const char *dir, const char *family) {
  char path[1024];
  fixture_model fm;
  fixture_model_load(&fm, dir, family);
  float *w0 = malloc(fm.s.total_numel * sizeof(float));
  memcpy(w0, fm.r.weights, fm.s.total_numel * sizeof(float));

  ferry_safetensors *ref;
  snprintf(path, sizeof path, "%s/%s/reference.safetensors", dir, family);
  if (ferry_safetensors_open(path, &ref)) {
    fprintf(stderr, "%s\n", ferry_last_error());
    exit(1);
  }
  size_t nt, nl;
  int32_t *tokens = read_all(ref, "tokens", &nt, FERRY_DT_I32);
  int32_t *targets = read_all(ref, "targets", NULL, FERRY_DT_I32);
  float *logits = read_all(ref, "logits", &nl, FERRY_DT_F32);
  float *loss_ref = read_all(ref, "loss", NULL, FERRY_DT_F32);
  int B = 2, T = (int)nt / 2;

  for (int ck = 0; ck < 2; ck++) {
    gpt_run_config rc = {.batch = B, .seq = T, .checkpoint = ck};
    gpt_model *m;
    REQUIRE(gpt_model_create(&fm.s, &rc, &m) == 0);
    float loss;
    fm.p.zero_grad(fm.p.ctx);
    REQUIRE(gpt_model_forward(m, &fm.p, tokens, targets, &loss) == 0);
    double me = 0;
    const float *lg = gpt_model_logits(m);
    for (size_t i = 0; i < nl; i++) {
      double d = fabs((double)lg[i] - logits[i]);
      if (d > TOL_ABS + TOL_REL * fabs(logits[i])) {
        if (me <= TOL_ABS + TOL_REL * fabs(logits[i]))
          fprintf(stderr, "%s: logit %zu: %g vs torch %g\n", family, i, lg[i], logits[i]);
        test_failures++;
      }
      if (d > me) me = d;
    }
    if (me > g_max_logit) g_max_logit = me;
    double dl = fabs((double)loss - loss_ref[0]);
    if (dl > TOL_ABS + TOL_REL * fabs(loss_ref[0])) {
      fprintf(stderr, "%s: loss %.7f vs torch %.7f\n", family, loss, loss_ref[0]);
      test_failures++;
    }
    REQUIRE(gpt_model_backward(m, &fm.p) == 0);
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < fm.s.n_params; i++) {
      char gname[128];
      snprintf(gname, sizeof gname, "grad.%s", fm.s.params[i].name);
      size_t n;
      float *gt = read_all(ref, gname, &n, FERRY_DT_F32);
      REQUIRE(n == fm.s.params[i].numel);
      const float *gc = gpt_resident_g(&fm.r, i);
      double mx = 0, md = 0;
      for (size_t k = 0; k < n; k++) {
        if (fabs(gt[k]) > mx) mx = fabs(gt[k]);
        double d = fabs((double)gc[k] - gt[k]);
        if (d > md) md = d;
      }
      double rel = md / (mx + 1e-30);
      if (md > TOL_GRAD * mx + 1e-7) {
        fprintf(stderr, "%s (checkpoint %d): grad of %s: max error %g, max |grad| %g\n", family, ck,
                fm.s.params[i].name, md, mx);
        test_failures++;
      }
      if (rel > worst) worst = rel, worst_name = fm.s.params[i].name;
      free(gt);
    }
    if (worst > g_max_grad) g_max_grad = worst;
    printf("%s checkpoint=%d: loss %.6f (torch %.6f), max |logit err| %.2e, worst grad rel err "
           "%.2e (%s)\n",
           family, ck, loss, loss_ref[0], me, worst, worst_name);
    gpt_model_free(m);
  }

  /* 10 AdamW steps */
  memcpy(fm.r.weights, w0, fm.s.total_numel * sizeof(float));
  size_t ntt;
  int32_t *ttok = read_all(ref, "train.tokens", &ntt, FERRY_DT_I32);
  int32_t *ttgt = read_all(ref, "train.targets", NULL, FERRY_DT_I32);
  size_t nsteps;
  float *tloss = read_all(ref, "train.losses", &nsteps, FERRY_DT_F32);
  const char *lr_s = ferry_safetensors_metadata_find(ref, "lr");
  const char *wd_s = ferry_safetensors_metadata_find(ref, "weight_decay");
  REQUIRE(lr_s && wd_s);
  gpt_adamw opt;
  REQUIRE(gpt_adamw_init(&opt, fm.s.total_numel, strtof(lr_s, NULL), strtof(wd_s, NULL)) == 0);
  gpt_run_config rc = {.batch = B, .seq = T, .checkpoint = 0};
  gpt_model *m;
  REQUIRE(gpt_model_create(&fm.s, &rc, &m) == 0);
  printf("%s train:", family);
  for (size_t st = 0; st < nsteps; st++) {
    float loss;
    fm.p.zero_grad(fm.p.ctx);
    REQUIRE(gpt_model_forward(m, &fm.p, ttok + st * B * T, ttgt + st * B * T, &loss) == 0);
    REQUIRE(gpt_model_backward(m, &fm.p) == 0);
    gpt_adamw_step(&opt, &fm.r);
    double d = fabs((double)loss - tloss[st]);
    if (d / fabs(tloss[st]) > g_max_train) g_max_train = d / fabs(tloss[st]);
    if (d > TOL_TRAIN * fabs(tloss[st])) {
      fprintf(stderr, "\n%s: step %zu loss %.7f vs torch %.7f\n", family, st, loss, tloss[st]);
      test_failures++;
    }
    printf(" %.4f", loss);
  }
  printf("\n");
  EXPECT(nsteps == 10);
  gpt_model_free(m);
  gpt_adamw_free(&opt);
  free(ttok), free(ttgt), free(tloss), free(tokens), free(targets), free(logits), free(loss_ref);
  free(w0);
  ferry_safetensors_close(ref);
  fixture_model_free(&fm);
}

/* A provider whose fetch fails with a long message, as the engine's with
 * a swap file, its offset and two CRCs: the model keeps it whole (it was
 * cut at 255 bytes). */
static char g_long_err[700];
static int fail_fetch(void *ctx, int group, gpt_fetch_mode mode, gpt_group_view *out) {
  (void)ctx, (void)group, (void)mode, (void)out;
  return -1;
}
static const char *long_err(void *ctx) {
  (void)ctx;
  return g_long_err;
}

static void test_long_provider_error(const char *dir) {
  char path[1024], err[512];
  gpt_config cfg;
  snprintf(path, sizeof path, "%s/gpt2/config.json", dir);
  REQUIRE(gpt_config_load_json(path, &cfg, err, sizeof err) == 0);
  gpt_schema s;
  REQUIRE(gpt_schema_build(&cfg, &s) == 0);
  gpt_resident r;
  REQUIRE(gpt_resident_init(&r, &s) == 0);
  gpt_provider p = gpt_resident_provider(&r);
  p.fetch = fail_fetch;
  p.last_error = long_err;
  memset(g_long_err, 'x', sizeof g_long_err - 1);
  snprintf(g_long_err + 600, 99, "CRC32C expected 0x1234abcd, found 0x0badf00d");
  g_long_err[599] = ' ';
  gpt_run_config rc = {.batch = 1, .seq = 4};
  gpt_model *m;
  REQUIRE(gpt_model_create(&s, &rc, &m) == 0);
  int32_t tok[4] = {1, 2, 3, 4};
  float loss;
  EXPECT(gpt_model_forward(m, &p, tok, tok, &loss) != 0);
  EXPECT(strstr(gpt_model_last_error(m), "found 0x0badf00d") != NULL);
  gpt_model_free(m);
  gpt_resident_free(&r);
  gpt_schema_free(&s);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_gpt_reference FIXTURES/gpt\n");
    return 1;
  }
  test_long_provider_error(argv[1]);
  run_family(argv[1], "gpt2");
  run_family(argv[1], "llama");
  printf("max errors: logits %.2e (abs), gradients %.2e (relative to max |grad|), training "
         "losses %.2e (relative)\n",
         g_max_logit, g_max_grad, g_max_train);
  return test_finish("gpt.reference");
}
