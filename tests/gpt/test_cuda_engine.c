/* tests/gpt/test_cuda_engine.c — the CUDA model on the engine, as
 * `ferry-gpt train --device cuda --engine` runs it: 10 steps of `tiny` with
 * the engine on cuda (stream mode: the model in the engine's reserved
 * block, on the provider's stream) against the CPU model on the same
 * config with the engine on the host backend (sync mode), for
 * resident.cfg, offload-host.cfg and offload-nvme.cfg, and once with
 * activation checkpointing. Same seed, same batches: each step's loss
 * within 1e-2 relative, and the losses fall. Exits 77 without a CUDA
 * device. argv[1]: examples/configs, argv[2]: scratch directory,
 * argv[3]: a text file for data.
 */
#include "gpt_cuda.h"

#include "ferry.h"
#include "tests/test.h"

#include <math.h>
#include <string.h>
#include <sys/stat.h>

enum { STEPS = 10, BATCH = 4, SEQ = 64 };

typedef struct {
  const gpt_schema *s;
  gpt_data *d;
  uint64_t rng0;
  const char *configs, *nvme;
} setup;

static ferry_config *load(const setup *u, const char *file, const char *device) {
  char path[2048];
  snprintf(path, sizeof path, "%s/%s", u->configs, file);
  ferry_config *c;
  REQUIRE(ferry_config_create(&c) == 0);
  REQUIRE(ferry_config_load_file(c, path) == 0);
  REQUIRE(ferry_config_set(c, "device", device) == 0);
  REQUIRE(ferry_config_set(c, "tiers.nvme.paths", u->nvme) == 0);
  REQUIRE(ferry_config_set(c, "optimizer.lr", "2e-3") == 0);
  /* the cuda backend refuses a pageable host pool (offload-host.cfg's
   * pinned = false is for the host backend): found on an H100 */
  if (!strcmp(device, "cuda")) REQUIRE(ferry_config_set(c, "tiers.host.pinned", "true") == 0);
  return c;
}

static gpt_engine *engine(const setup *u, const ferry_config *c, const gpt_engine_options *o) {
  gpt_weights_src *src;
  char err[1024];
  REQUIRE(gpt_weights_src_open(u->s, NULL, 5, &src, err, sizeof err) == 0);
  gpt_engine *ge;
  if (gpt_engine_create(u->s, c, NULL, src, o, &ge, err, sizeof err)) {
    fprintf(stderr, "engine: %s\n", err);
    exit(1);
  }
  gpt_weights_src_close(src);
  return ge;
}

static void step_engine(gpt_engine *ge) {
  ferry_step_info si;
  if (gpt_engine_step(ge, &si)) {
    fprintf(stderr, "step: %s\n", ferry_engine_last_error(gpt_engine_handle(ge)));
    exit(1);
  }
}

/* The CPU model on the host backend. */
static void run_cpu(setup *u, const char *file, int ck, float *loss) {
  ferry_config *c = load(u, file, "host");
  gpt_engine *ge = engine(u, c, NULL);
  gpt_provider p = gpt_engine_provider(ge);
  gpt_run_config rc = {.batch = BATCH, .seq = SEQ, .checkpoint = ck};
  gpt_model *m;
  REQUIRE(gpt_model_create(u->s, &rc, &m) == 0);
  int32_t x[BATCH * SEQ], y[BATCH * SEQ];
  u->d->rng = u->rng0;
  for (int st = 0; st < STEPS; st++) {
    gpt_data_batch(u->d, BATCH, SEQ, x, y);
    if (p.zero_grad(p.ctx) || gpt_model_forward(m, &p, x, y, &loss[st]) ||
        gpt_model_backward(m, &p)) {
      fprintf(stderr, "cpu: %s\n", gpt_model_last_error(m));
      exit(1);
    }
    step_engine(ge);
  }
  gpt_model_free(m);
  gpt_engine_free(ge);
  ferry_config_destroy(c);
}

/* The CUDA model on the engine on cuda. */
static void run_cuda(setup *u, const char *file, int ck, float *loss) {
  ferry_config *c = load(u, file, "cuda");
  char b[64];
  REQUIRE(ferry_config_get(c, "tiers.gpu.budget", b, sizeof b) == 0);
  if (strtoull(b, NULL, 10) < (512ull << 20)) REQUIRE(ferry_config_set(c, "tiers.gpu.budget", "512M") == 0);
  gpt_run_config rc = {.batch = BATCH, .seq = SEQ, .checkpoint = ck};
  gpt_cuda_layout_t lay;
  gpt_engine_options o = {GPT_ENGINE_STREAM,
                          gpt_cuda_layout(u->s, &rc, gpt_engine_config_dtype(c), &lay), NULL};
  gpt_engine *ge = engine(u, c, &o);
  gpt_provider p = gpt_engine_provider(ge);
  gpt_cuda_mem mem = {NULL, 0, NULL, gpt_engine_dtype(ge)};
  gpt_engine_model_memory(ge, &mem.base, &mem.bytes);
  REQUIRE(mem.base && mem.bytes == lay.bytes);
  REQUIRE(ferry_stream_native(gpt_engine_stream(ge), &mem.stream) == 0 && mem.stream);
  gpt_cuda_model *m;
  char err[512];
  if (gpt_cuda_model_create(u->s, &rc, &mem, &m, err, sizeof err)) {
    fprintf(stderr, "cuda model: %s\n", err);
    exit(1);
  }
  int32_t x[BATCH * SEQ], y[BATCH * SEQ];
  u->d->rng = u->rng0;
  for (int st = 0; st < STEPS; st++) {
    gpt_data_batch(u->d, BATCH, SEQ, x, y);
    if (p.zero_grad(p.ctx) || gpt_cuda_model_forward(m, &p, x, y) ||
        gpt_cuda_model_backward(m, &p)) {
      fprintf(stderr, "cuda: %s\n", gpt_cuda_model_last_error(m));
      exit(1);
    }
    step_engine(ge);
    REQUIRE(gpt_cuda_model_loss(m, &loss[st]) == 0);
  }
  gpt_cuda_model_free(m);
  gpt_engine_free(ge);
  ferry_config_destroy(c);
}

static void compare(setup *u, const char *file, int ck) {
  float lc[STEPS], lg[STEPS];
  run_cpu(u, file, ck, lc);
  run_cuda(u, file, ck, lg);
  int bad = 0;
  for (int i = 0; i < STEPS; i++) bad += !(fabsf(lg[i] - lc[i]) <= 1e-2f * fabsf(lc[i]));
  EXPECT_EQ_INT(bad, 0);
  EXPECT(lg[STEPS - 1] < lg[0]);
  printf("%s ckpt %d: cpu %.4f -> %.4f, cuda %.4f -> %.4f, %d step(s) off by more than 1e-2\n",
         file, ck, lc[0], lc[STEPS - 1], lg[0], lg[STEPS - 1], bad);
  for (int i = 0; bad && i < STEPS; i++) printf("  step %d: cpu %.6f cuda %.6f\n", i + 1, lc[i], lg[i]);
}

int main(int argc, char **argv) {
  char why[256];
  REQUIRE(argc == 4);
  if (gpt_cuda_available(why, sizeof why)) TEST_SKIP("%s", why);
  char nvme[2048], err[512];
  snprintf(nvme, sizeof nvme, "%s/nvme-swap", argv[2]);
  mkdir(argv[2], 0777);
  mkdir(nvme, 0777);
  gpt_config cfg;
  gpt_schema s;
  gpt_tokenizer *tok;
  gpt_data d;
  REQUIRE(gpt_config_preset("tiny", &cfg) == 0 && gpt_schema_build(&cfg, &s) == 0);
  REQUIRE(gpt_tokenizer_bytes(&tok) == 0);
  if (gpt_data_load(&d, argv[3], tok, cfg.vocab, 5, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  setup u = {&s, &d, d.rng, argv[1], nvme};
  compare(&u, "resident.cfg", 0);
  compare(&u, "offload-host.cfg", 0);
  compare(&u, "offload-nvme.cfg", 0);
  compare(&u, "offload-nvme.cfg", 1);
  gpt_data_free(&d);
  gpt_tokenizer_free(tok);
  gpt_schema_free(&s);
  return test_finish("gpt.cuda.engine");
}
