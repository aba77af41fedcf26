/* tests/offload/test_engine_cuda.c — the engine on a real GPU: a small
 * model (3 groups of two bf16 params) trained for a few steps with fixed
 * grads (copied H2D into the engine's grad buffers) in every placement of
 * params {gpu, host, nvme} x optimizer {gpu, host, nvme} (grads on the gpu
 * with the optimizer there, else on the host), against the same run on the
 * host backend: the fp32 masters (ferry_param_read) equal bit for bit (the
 * CUDA AdamW and grad kernels do the CPU's operations), and the bf16 params
 * in the device buffers are the masters rounded; then the compact layouts
 * (bf16 and int8 states, bf16 master) with the optimizer on the gpu in
 * every param home, the same way. Exits 77 with the reason
 * when there is no GPU. argv[1]: a scratch directory for the NVMe tier.
 */
#include "core/dtype.h"
#include "tests/offload/engine_util.h"
#include "tests/test.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#define NG 3
#define STEPS 3
#define ROWS 64
#define COLS 48

static char scratch[1024];
static int have_nvme;
/* optimizer.state_dtype and precision.master of the runs */
static const char *state_dtype = "fp32", *master = "fp32";

static size_t param_n(int k) { return k == 0 ? (size_t)ROWS * COLS : COLS; }

static void param_name(char *buf, size_t len, int g, int k) {
  snprintf(buf, len, "layer%d.%s", g, k == 0 ? "w" : "b");
}

static int init_fn(void *user, const char *name, float *v, size_t n) {
  (void)user;
  unsigned long long s = 1469598103934665603ull;
  for (const char *c = name; *c; c++) s = (s ^ (unsigned char)*c) * 1099511628211ull;
  for (size_t i = 0; i < n; i++) v[i] = (float)((test_rand(&s) >> 40) / 16777216.0) - 0.5f;
  return 0;
}

static ferry_engine *make(const char *device, const char *params, const char *optim) {
  char nvme[1200], text[2048];
  snprintf(nvme, sizeof nvme, "%s/%s-%s-%s-%s-%s", scratch, device, params, optim, state_dtype,
           master);
  mkdir(nvme, 0700);
  snprintf(text, sizeof text,
           "device = \"%s\";\n"
           "chunk_size = \"16K\";\n"
           "tiers: { gpu: { budget = \"64M\"; }; host: { budget = \"64M\"; pinned = %s; };\n"
           "         nvme: { paths = [\"%s\"]; block_size = \"4K\"; }; };\n"
           "optimizer: { type = \"adamw\"; lr = 0.01; weight_decay = 0.1; threads = 2;\n"
           "             state_dtype = \"%s\"; state_block = 64; };\n"
           "precision: { params = \"bf16\"; master = \"%s\"; };\n"
           "placement: { params = \"%s\"; grads = \"%s\"; optimizer = \"%s\"; };\n",
           device, strcmp(device, "cuda") ? "false" : "true", nvme, state_dtype, master, params,
           strcmp(optim, "gpu") ? "host" : "gpu", optim);
  ferry_engine *e = eu_engine(text, NULL);
  for (int g = 0; g < NG; g++)
    for (int k = 0; k < 2; k++) {
      char name[64];
      param_name(name, sizeof name, g, k);
      int64_t shape[2] = {ROWS, COLS};
      REQUIRE(ferry_param_register(e, name, k == 0 ? shape : shape + 1, k == 0 ? 2 : 1, g, NULL,
                                   init_fn, NULL) == 0);
    }
  int rc = ferry_engine_finalize(e);
  if (rc) fprintf(stderr, "finalize (%s, %s/%s): %s\n", device, params, optim, ferry_engine_last_error(e));
  REQUIRE(rc == 0);
  return e;
}

/* The fixed grads of group g at step t (bf16), in pinned memory. */
static void fill_grads(uint16_t *h, int g, int k, int t) {
  for (size_t i = 0; i < param_n(k); i++) {
    float x = sinf(0.37f * (float)i + 1.3f * (float)g + 0.7f * (float)t + (float)k) * 0.05f;
    ferry_dt_store(h, FERRY_DT_BF16, i, x);
  }
}

/* A step: forward fetches, backward with the grads copied H2D. */
static void train_step(ferry_engine *e, ferry_stream *s, uint16_t *host, int t) {
  for (int g = 0; g < NG; g++) {
    REQUIRE(ferry_fetch(e, g, s) == 0);
    REQUIRE(ferry_release(e, g, s) == 0);
  }
  for (int g = NG - 1; g >= 0; g--) {
    REQUIRE(ferry_fetch(e, g, s) == 0);
    for (int k = 0; k < 2; k++) {
      char name[64];
      param_name(name, sizeof name, g, k);
      void *w, *gw;
      REQUIRE(ferry_param_device(e, name, &w, &gw) == 0);
      uint16_t *h = host + (size_t)(g * 2 + k) * ROWS * COLS;
      fill_grads(h, g, k, t);
      REQUIRE(ferry_memcpy_async(s, gw, h, param_n(k) * 2, FERRY_COPY_H2D) == 0);
    }
    REQUIRE(ferry_grads_ready(e, g, s) == 0);
    REQUIRE(ferry_release(e, g, s) == 0);
  }
  ferry_step_info info;
  int rc = ferry_step(e, &info);
  if (rc) fprintf(stderr, "step %d: %s\n", t, ferry_engine_last_error(e));
  REQUIRE(rc == 0);
}

/* Masters of every param after STEPS steps, and whether the bf16 params
 * in the device buffers are those masters rounded. */
static void run(const char *device, const char *params, const char *optim, float *masters,
                int *params_ok) {
  ferry_engine *e = make(device, params, optim);
  ferry_device *dev = ferry_engine_device(e);
  ferry_stream *s = NULL;
  REQUIRE(ferry_stream_create(dev, &s) == 0);
  uint16_t *host = NULL;
  REQUIRE(ferry_host_alloc(dev, (size_t)NG * 2 * ROWS * COLS * 2, (void **)&host) == 0);
  for (int t = 0; t < STEPS; t++) train_step(e, s, host, t);
  REQUIRE(ferry_stream_synchronize(s) == 0);
  float *m = masters; /* every master first: no group held while the engine waits */
  for (int g = 0; g < NG; g++)
    for (int k = 0; k < 2; k++) {
      char name[64];
      param_name(name, sizeof name, g, k);
      int rc = ferry_param_read(e, name, m, param_n(k));
      if (rc) fprintf(stderr, "param read: %s\n", ferry_engine_last_error(e));
      REQUIRE(rc == 0);
      m += param_n(k);
    }
  *params_ok = 1;
  m = masters;
  for (int g = 0; g < NG; g++) {
    REQUIRE(ferry_fetch(e, g, s) == 0);
    for (int k = 0; k < 2; k++) {
      char name[64];
      param_name(name, sizeof name, g, k);
      void *w;
      REQUIRE(ferry_param_device(e, name, &w, NULL) == 0);
      REQUIRE(ferry_memcpy_async(s, host, w, param_n(k) * 2, FERRY_COPY_D2H) == 0);
      REQUIRE(ferry_stream_synchronize(s) == 0);
      for (size_t i = 0; i < param_n(k); i++) {
        uint16_t want;
        ferry_dt_store(&want, FERRY_DT_BF16, 0, m[i]);
        if (host[i] != want) *params_ok = 0;
      }
      m += param_n(k);
    }
    REQUIRE(ferry_release(e, g, s) == 0);
  }
  ferry_host_free(dev, host);
  ferry_stream_destroy(s);
  ferry_engine_destroy(e);
}

static void compare(const char *params, const char *optim) {
  if ((!strcmp(params, "nvme") || !strcmp(optim, "nvme")) && !have_nvme) {
    printf("%-5s/%-5s skipped: no io_uring here\n", params, optim);
    return;
  }
  size_t total = (size_t)NG * (ROWS * COLS + COLS);
  float *gpu = malloc(total * sizeof(float)), *cpu = malloc(total * sizeof(float));
  REQUIRE(gpu && cpu);
  int gpu_ok = 0, cpu_ok = 0;
  run("cuda", params, optim, gpu, &gpu_ok);
  run("host", params, optim, cpu, &cpu_ok);
  size_t differ = 0, moved = 0;
  double maxd = 0;
  float *init = malloc((size_t)ROWS * COLS * sizeof(float)), *m = cpu;
  REQUIRE(init);
  for (int g = 0; g < NG; g++) /* the steps changed the params */
    for (int k = 0; k < 2; k++) {
      char name[64];
      param_name(name, sizeof name, g, k);
      init_fn(NULL, name, init, param_n(k));
      for (size_t i = 0; i < param_n(k); i++) moved += m[i] != init[i];
      m += param_n(k);
    }
  free(init);
  EXPECT(moved > total / 2);
  for (size_t i = 0; i < total; i++) {
    if (memcmp(&gpu[i], &cpu[i], sizeof(float))) differ++;
    double d = fabs((double)gpu[i] - cpu[i]);
    if (d > maxd) maxd = d;
  }
  printf("params %-5s optimizer %-5s states %-4s master %-4s: %zu of %zu masters differ (max "
         "%.3g); device params %s/%s\n",
         params, optim, state_dtype, master, differ, total, maxd, gpu_ok ? "ok" : "WRONG",
         cpu_ok ? "ok" : "WRONG");
  EXPECT_EQ_INT(differ, 0);
  EXPECT(gpu_ok && cpu_ok);
  free(gpu);
  free(cpu);
}

int main(int argc, char **argv) {
  REQUIRE(argc == 2);
  if (!ferry_cuda_compiled()) TEST_SKIP("this ferry was built without CUDA");
  ferry_gpu_info gi[FERRY_MAX_GPUS];
  int count = 0;
  char why[256] = "";
  if (ferry_gpu_list(gi, FERRY_MAX_GPUS, &count, why, sizeof why) || count == 0)
    TEST_SKIP("no CUDA device (%s)", why[0] ? why : "none listed");
  snprintf(scratch, sizeof scratch, "%s", argv[1]);
  mkdir(scratch, 0700);
  have_nvme = ferry_io_uring_probe(why, sizeof why) == 0;
  if (!have_nvme) printf("io_uring: %s: the nvme placements are skipped\n", why);
  static const char *const homes[] = {"gpu", "host", "nvme"};
  for (int p = 0; p < 3; p++)
    for (int o = 0; o < 3; o++) compare(homes[p], homes[o]);
  /* compact optimizer state with the CUDA kernels (optimizer on the gpu),
   * every param home, against the host backend's CPU kernels */
  static const char *const layouts[][2] = {
      {"bf16", "fp32"}, {"int8", "fp32"}, {"fp32", "bf16"}, {"int8", "bf16"}};
  for (size_t l = 0; l < sizeof layouts / sizeof layouts[0]; l++) {
    state_dtype = layouts[l][0];
    master = layouts[l][1];
    for (int p = 0; p < 3; p++) compare(homes[p], "gpu");
  }
  return test_finish("engine.cuda");
}
