/* tests/gpt/test_cuda.c — the CUDA model against the same PyTorch fixtures
 * as the CPU reference test, for both families, with and without activation
 * checkpointing. bf16 GEMM operands (8-bit mantissa) with fp32 accumulation
 * set the tolerances:
 *   loss        |c - t| <= 1e-2 |t|
 *   logits      |c - t| <= 5e-2 + 2e-2 |t|
 *   gradients   max |c - t| <= 5e-2 * max |t| + 1e-6   (per tensor)
 * Exits 77 without a CUDA device. argv[1]: tests/fixtures/gpt.
 */
#include "gpt_cuda.h"

#include "ferry.h"
#include "tests/test.h"

#include <math.h>
#include <string.h>

static void *read_all(ferry_safetensors *f, const char *name, size_t *n) {
  ferry_safetensors_tensor t;
  size_t idx;
  REQUIRE(ferry_safetensors_find(f, name, &t, &idx) == 0);
  void *b = malloc(t.nbytes ? t.nbytes : 1);
  REQUIRE(ferry_safetensors_read(f, idx, 0, b, t.nbytes) == 0);
  if (n) *n = t.numel;
  return b;
}

static void run(const char *dir, const char *family) {
  char path[1024], err[512];
  gpt_config cfg;
  snprintf(path, sizeof path, "%s/%s/config.json", dir, family);
  REQUIRE(gpt_config_load_json(path, &cfg, err, sizeof err) == 0);
  gpt_schema s;
  REQUIRE(gpt_schema_build(&cfg, &s) == 0);
  gpt_resident hr;
  REQUIRE(gpt_resident_init(&hr, &s) == 0);
  gpt_provider hp = gpt_resident_provider(&hr);
  snprintf(path, sizeof path, "%s/%s/model.safetensors", dir, family);
  REQUIRE(gpt_weights_load(&s, &hp, path, err, sizeof err) == 0);
  gpt_cuda_resident dr;
  REQUIRE(gpt_cuda_resident_init(&dr, &s) == 0);
  REQUIRE(gpt_cuda_resident_upload(&dr, hr.weights) == 0);
  gpt_provider dp = gpt_cuda_resident_provider(&dr);
  ferry_safetensors *ref;
  snprintf(path, sizeof path, "%s/%s/reference.safetensors", dir, family);
  REQUIRE(ferry_safetensors_open(path, &ref) == 0);
  size_t nt, nl;
  int32_t *tok = read_all(ref, "tokens", &nt), *tgt = read_all(ref, "targets", NULL);
  float *lt = read_all(ref, "logits", &nl), *loss_t = read_all(ref, "loss", NULL);
  float *lc = malloc(nl * sizeof *lc), *gc = malloc(s.total_numel * sizeof *gc);
  for (int ck = 0; ck < 2; ck++) {
    gpt_run_config rc = {.batch = 2, .seq = (int)nt / 2, .checkpoint = ck};
    gpt_cuda_model *m;
    REQUIRE(gpt_cuda_model_create(&s, &rc, &m) == 0);
    float loss;
    REQUIRE(dp.zero_grad(dp.ctx) == 0);
    if (gpt_cuda_model_forward(m, &dp, tok, tgt, &loss) || gpt_cuda_model_backward(m, &dp)) {
      fprintf(stderr, "%s\n", gpt_cuda_model_last_error(m));
      exit(1);
    }
    REQUIRE(gpt_cuda_model_logits(m, lc) == 0);
    REQUIRE(gpt_cuda_resident_download_grads(&dr, gc) == 0);
    EXPECT(fabs(loss - loss_t[0]) <= 1e-2 * fabs(loss_t[0]));
    double ml = 0, mg = 0;
    for (size_t i = 0; i < nl; i++) {
      double d = fabs(lc[i] - lt[i]);
      if (d > 5e-2 + 2e-2 * fabs(lt[i])) test_failures++;
      if (d > ml) ml = d;
    }
    size_t at = 0;
    for (int i = 0; i < s.n_params; i++) {
      char name[160];
      snprintf(name, sizeof name, "grad.%s", s.params[i].name);
      size_t n;
      float *g = read_all(ref, name, &n);
      double mx = 0, md = 0;
      for (size_t k = 0; k < n; k++) {
        mx = fmax(mx, fabs(g[k]));
        md = fmax(md, fabs(gc[at + k] - g[k]));
      }
      if (md > 5e-2 * mx + 1e-6) {
        fprintf(stderr, "%s: grad %s: max err %g, max |grad| %g\n", family, s.params[i].name, md, mx);
        test_failures++;
      }
      if (md / (mx + 1e-30) > mg) mg = md / (mx + 1e-30);
      at += n;
      free(g);
    }
    printf("%s (cuda, checkpoint %d): loss %.5f (torch %.5f), max logit err %.3g, worst grad rel "
           "err %.3g\n", family, ck, loss, loss_t[0], ml, mg);
    gpt_cuda_model_free(m);
  }
  free(lc), free(gc), free(tok), free(tgt), free(lt), free(loss_t);
  ferry_safetensors_close(ref);
  gpt_cuda_resident_free(&dr);
  gpt_resident_free(&hr);
  gpt_schema_free(&s);
}

int main(int argc, char **argv) {
  char why[256];
  if (argc < 2) return 1;
  if (gpt_cuda_available(why, sizeof why)) TEST_SKIP("%s", why);
  run(argv[1], "gpt2");
  run(argv[1], "llama");
  return test_finish("gpt.cuda");
}
