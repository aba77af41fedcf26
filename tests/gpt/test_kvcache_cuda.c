/* tests/gpt/test_kvcache_cuda.c — the CUDA KV-cache forward (gpt_cuda_kv,
 * kvcache_cuda.cu) against the CPU one (gpt_kv), which gpt.kvcache holds
 * to the full forward: the tiny GPT-2 and Llama fixtures fed one token at a
 * time, then in chunks, and two seeded presets with a call of GPT_KV_ROWS
 * rows, weights fp32 on the device (the resident provider).
 * Both sides fp32, other summation orders:
 *   |cuda - cpu| <= 1e-4 + 1e-4 |cpu|
 * Without a device it exits 77; the emulated build (tests/gpt/cuda_emu)
 * runs the same kernels on the host. argv[1]: tests/fixtures/gpt.
 */
#include "gpt_cuda.h"

#include "tests/test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double g_worst;

static void compare(const gpt_schema *s, gpt_provider *hp, gpt_provider *dp, const int32_t *tok,
                    int T, const int *chunks, const char *what) {
  gpt_kv *kv;
  gpt_cuda_kv *ck;
  char err[512];
  REQUIRE(gpt_kv_create(s, T, &kv) == 0);
  if (gpt_cuda_kv_create(s, T, NULL, &ck, err, sizeof err)) {
    fprintf(stderr, "%s: %s\n", what, err);
    exit(1);
  }
  int V = s->cfg.vocab, at = 0, bad = 0;
  double worst = 0;
  for (int c = 0; chunks[c]; c++) {
    int n = chunks[c];
    REQUIRE(gpt_kv_forward(kv, hp, tok + at, n) == 0);
    if (gpt_cuda_kv_forward(ck, dp, tok + at, n)) {
      fprintf(stderr, "%s: %s\n", what, gpt_cuda_kv_last_error(ck));
      exit(1);
    }
    EXPECT_EQ_INT(gpt_cuda_kv_rows(ck), n);
    const float *a = gpt_kv_logits(kv), *b = gpt_cuda_kv_logits(ck);
    for (size_t i = 0; i < (size_t)n * V; i++) {
      double d = fabs((double)b[i] - a[i]);
      if (d > worst) worst = d;
      if (d > 1e-4 + 1e-4 * fabs(a[i]) && bad++ < 3)
        fprintf(stderr, "%s: position %d id %d: %g vs %g\n", what, at + (int)(i / V),
                (int)(i % V), b[i], a[i]);
    }
    at += n;
  }
  EXPECT(bad == 0);
  EXPECT_EQ_INT(gpt_cuda_kv_pos(ck), T);
  EXPECT(gpt_cuda_kv_forward(ck, dp, tok, 1) != 0); /* full */
  EXPECT(strstr(gpt_cuda_kv_last_error(ck), "context is full") != NULL);
  gpt_cuda_kv_reset(ck);
  EXPECT_EQ_INT(gpt_cuda_kv_pos(ck), 0);
  printf("%-28s max |cuda - cpu| = %.3g\n", what, worst);
  if (worst > g_worst) g_worst = worst;
  gpt_cuda_kv_free(ck);
  gpt_kv_free(kv);
}

/* cfg's weights from `weights` (a safetensors file), else seeded. */
static void family(const gpt_config *cfg, const char *weights, int T, const int *chunks,
                   const char *what) {
  gpt_schema s;
  REQUIRE(gpt_schema_build(cfg, &s) == 0);
  gpt_resident r;
  REQUIRE(gpt_resident_init(&r, &s) == 0);
  gpt_provider hp = gpt_resident_provider(&r);
  char err[512];
  if (weights ? gpt_weights_load(&s, &hp, weights, err, sizeof err)
              : gpt_weights_init(&s, &hp, 11)) {
    fprintf(stderr, "%s: %s\n", what, weights ? err : "init failed");
    exit(1);
  }
  gpt_cuda_resident cr;
  REQUIRE(gpt_cuda_resident_init(&cr, &s, NULL) == 0);
  REQUIRE(gpt_cuda_resident_upload(&cr, r.weights) == 0);
  gpt_provider dp = gpt_cuda_resident_provider(&cr);
  int32_t *tok = malloc((size_t)T * sizeof *tok);
  unsigned long long seed = 5;
  for (int i = 0; i < T; i++) tok[i] = (int32_t)(test_rand(&seed) % (unsigned)cfg->vocab);
  compare(&s, &hp, &dp, tok, T, chunks, what);
  free(tok);
  gpt_cuda_resident_free(&cr);
  gpt_resident_free(&r);
  gpt_schema_free(&s);
}

int main(int argc, char **argv) {
  char why[256];
  if (argc < 2) {
    fprintf(stderr, "usage: test_gpt_kvcache_cuda FIXTURES_DIR\n");
    return 2;
  }
  if (gpt_cuda_available(why, sizeof why)) TEST_SKIP("%s", why);
  const char *fam[] = {"gpt2", "llama"};
  for (int f = 0; f < 2; f++) {
    char path[1024], w[1024], err[512], what[64];
    gpt_config cfg;
    snprintf(path, sizeof path, "%s/%s/config.json", argv[1], fam[f]);
    snprintf(w, sizeof w, "%s/%s/model.safetensors", argv[1], fam[f]);
    REQUIRE(gpt_config_load_json(path, &cfg, err, sizeof err) == 0);
    int T = cfg.max_seq, chunks[] = {1, 1, 1, 2, 5, 1, T - 11, 0};
    snprintf(what, sizeof what, "%s, chunks 1 1 1 2 5 1 %d", fam[f], T - 11);
    family(&cfg, w, T, chunks, what);
  }
  const char *pre[] = {"tiny", "llama-tiny"};
  for (int k = 0; k < 2; k++) {
    gpt_config cfg;
    REQUIRE(gpt_config_preset(pre[k], &cfg) == 0);
    int chunks[] = {GPT_KV_ROWS, 1, 5, 0};
    family(&cfg, NULL, GPT_KV_ROWS + 6, chunks, pre[k]);
  }
  printf("worst |cuda - cpu|: %.3g\n", g_worst);
  return test_finish("gpt.kvcache_cuda");
}
