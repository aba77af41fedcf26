/* tests/gpt/test_cuda_init.c — the seeded init on a CUDA device
 * (gpt_cuda_init_tensor) against the CPU's (gpt_init_tensor), bit for bit:
 * tensors of every rule (norm weights, biases, normals, residual
 * projections) of `small` and `llama-tiny`, a tensor whose size is not a
 * multiple of 4 (the last Philox counter cut short), and llama-2-7b's
 * embedding (131M values: more than one pass of the grid-stride loop); in
 * fp32, and in bf16 and fp16 against the CPU's values rounded by
 * gpt_f32_to_bf16 / gpt_f32_to_f16; the resident model's init on the
 * device and its host copy. Then it times the device init of every tensor
 * of llama-2-13b (printed, not judged). Exits 77 without a CUDA device.
 * Built a second time as gpt.init_emulated (GPT_INIT_EMULATED: the kernels
 * on tests/gpt/cuda_emu/, without the 7B tensor and the timed pass).
 */
#include "gpt_cuda.h"
#include "gpt_init.h"

#include "ferry.h"
#include "tests/test.h"

#include <cuda_runtime.h>
#include <string.h>
#include <time.h>

/* param i on the device in dt = the CPU's values in dt, byte for byte */
static void same(const gpt_schema *s, int i, ferry_dtype dt, const char *what) {
  size_t n = s->params[i].numel, es = dt == FERRY_DT_F32 ? 4 : 2;
  float *cpu = malloc(n * sizeof *cpu);
  unsigned char *want = malloc(n * es), *got = malloc(n * es);
  REQUIRE(cpu && want && got);
  gpt_init_tensor(s, i, 11, cpu, 0);
  for (size_t k = 0; k < n; k++) {
    if (dt == FERRY_DT_F32) memcpy(want + 4 * k, &cpu[k], 4);
    else {
      uint16_t h = dt == FERRY_DT_BF16 ? gpt_f32_to_bf16(cpu[k]) : gpt_f32_to_f16(cpu[k]);
      memcpy(want + 2 * k, &h, 2);
    }
  }
  void *d;
  char err[256];
  REQUIRE(cudaMalloc(&d, n * es) == cudaSuccess);
  REQUIRE(cudaMemset(d, 0xff, n * es) == cudaSuccess);
  int rc = gpt_cuda_init_tensor(d, dt, n, s, i, 11, NULL, err, sizeof err);
  if (rc) fprintf(stderr, "%s: %s\n", what, err);
  EXPECT(rc == 0);
  REQUIRE(cudaMemcpy(got, d, n * es, cudaMemcpyDeviceToHost) == cudaSuccess);
  size_t off = 0, first = n;
  for (size_t k = 0; k < n; k++)
    if (memcmp(want + es * k, got + es * k, es)) {
      if (!off) first = k;
      off++;
    }
  if (off) {
    fprintf(stderr, "%s %s %s: %zu of %zu values differ, the first at %zu (cpu %a)\n", what,
            s->params[i].name, ferry_dtype_name(dt), off, n, first, cpu[first]);
    test_failures++;
  }
  cudaFree(d);
  free(cpu), free(want), free(got);
}

static void preset(const char *name, const char *const *tensors, int count) {
  gpt_config c;
  gpt_schema s;
  REQUIRE(gpt_config_preset(name, &c) == 0);
  REQUIRE(gpt_schema_build(&c, &s) == 0);
  static const ferry_dtype dts[] = {FERRY_DT_F32, FERRY_DT_BF16, FERRY_DT_F16};
  for (int t = 0; t < count; t++) {
    const gpt_param *q = gpt_schema_find(&s, tensors[t]);
    REQUIRE(q != NULL);
    for (int d = 0; d < 3; d++) same(&s, (int)(q - s.params), dts[d], name);
  }
  gpt_schema_free(&s);
}

/* the resident model's init on the device (gpt_cuda_resident_init_weights,
 * what a large pre-engine --device cuda run uses): every tensor of
 * llama-tiny, on the device and in its host copy, against the CPU's */
static void resident_same(void) {
  gpt_config c;
  gpt_schema s;
  REQUIRE(gpt_config_preset("llama-tiny", &c) == 0);
  REQUIRE(gpt_schema_build(&c, &s) == 0);
  gpt_cuda_resident r;
  REQUIRE(gpt_cuda_resident_init(&r, &s, NULL) == 0);
  size_t bytes = s.total_numel * sizeof(float);
  float *host = malloc(bytes), *dev = malloc(bytes), *want = malloc(bytes);
  REQUIRE(host && dev && want);
  for (int i = 0; i < s.n_params; i++) gpt_init_tensor(&s, i, 5, want + r.offset[i], 0);
  int rc = gpt_cuda_resident_init_weights(&r, 5, host);
  if (rc) fprintf(stderr, "resident init: %s\n", r.err);
  EXPECT(rc == 0);
  REQUIRE(cudaMemcpy(dev, r.weights, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
  EXPECT(memcmp(host, want, bytes) == 0);
  EXPECT(memcmp(dev, want, bytes) == 0);
  free(host), free(dev), free(want);
  gpt_cuda_resident_free(&r);
  gpt_schema_free(&s);
}

#ifndef GPT_INIT_EMULATED
static void timed_13b(void) {
  gpt_config c;
  gpt_schema s;
  char err[256];
  REQUIRE(gpt_config_preset("llama-2-13b", &c) == 0);
  REQUIRE(gpt_schema_build(&c, &s) == 0);
  size_t most = 0;
  for (int i = 0; i < s.n_params; i++)
    if (s.params[i].numel > most) most = s.params[i].numel;
  void *d;
  REQUIRE(cudaMalloc(&d, most * 2) == cudaSuccess);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < s.n_params; i++)
    EXPECT(gpt_cuda_init_tensor(d, FERRY_DT_BF16, s.params[i].numel, &s, i, 1, NULL, err,
                                sizeof err) == 0);
  EXPECT(cudaDeviceSynchronize() == cudaSuccess);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  printf("llama-2-13b: %zu values initialised on the device (bf16) in %.3f s\n", s.total_numel,
         sec);
  cudaFree(d);
  gpt_schema_free(&s);
}
#endif

int main(void) {
  char why[256];
  if (gpt_cuda_available(why, sizeof why)) TEST_SKIP("%s", why);
  static const char *const small[] = {"wte.weight",         "wpe.weight",
                                      "h.0.ln_1.weight",    "h.0.ln_1.bias",
                                      "h.2.attn.c_attn.weight", "h.5.mlp.c_proj.weight",
                                      "h.1.attn.c_proj.bias"};
  preset("small", small, 7);
  static const char *const llama[] = {"model.embed_tokens.weight",
                                      "model.layers.0.input_layernorm.weight",
                                      "model.layers.2.self_attn.o_proj.weight",
                                      "model.layers.4.mlp.down_proj.weight", "lm_head.weight"};
  preset("llama-tiny", llama, 5);
#ifndef GPT_INIT_EMULATED /* 131M values: hours on the emulation's fibers */
  static const char *const big[] = {"model.embed_tokens.weight"};
  preset("llama-2-7b", big, 1);
#endif
  /* 255 x 6 = 1530 values: the last counter gives 2 of its 4 */
  gpt_config c;
  gpt_schema s;
  REQUIRE(gpt_config_preset("llama-tiny", &c) == 0);
  c.vocab = 255, c.d_model = 6, c.n_head = 3, c.n_kv_head = 1, c.d_ff = 10;
  REQUIRE(gpt_schema_build(&c, &s) == 0);
  REQUIRE(s.params[0].numel % 4 == 2);
  same(&s, 0, FERRY_DT_F32, "odd");
  same(&s, 0, FERRY_DT_F16, "odd");
  gpt_schema_free(&s);
  resident_same();
#ifdef GPT_INIT_EMULATED
  return test_finish("gpt.init_emulated");
#else
  timed_13b();
  return test_finish("gpt.cuda.init");
#endif
}
