/* tests/optim/test_adamw_cuda.c — the CUDA AdamW/Adam kernel against the CPU
 * scalar reference (same operations: bit-exact fp32, identical 16-bit
 * copies) over several steps, grad dtypes and copy dtypes (F32 copies are
 * four bytes: every buffer is sized by ferry_dtype_size), through the
 * public ferry_optimizer_step_cuda on a stream of its own, synchronized
 * before the host reads. Uses the CUDA runtime directly for buffers. Then
 * the compact states (bf16, int8 at blocks of 64 and 256) and the bf16
 * master (stochastic rounding): every byte of params and states equal to
 * the CPU's after five steps. Exits 77 when no CUDA device is present.
 */
#include "optim/optim.h"
#include "optim/scalar_impl.h"
#include "tests/test.h"

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#define CK(x)                                                                                      \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));          \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

/* 1 when the two elements are the same bits, or both NaN (the GPU's NaNs
 * carry other payloads than the CPU's). */
static int same_elem(const void *a, const void *b, size_t i, ferry_dtype dt) {
  size_t sz = ferry_dtype_size(dt);
  if (!memcmp((const char *)a + i * sz, (const char *)b + i * sz, sz)) return 1;
  float x = ferry_dtype_load(a, dt, i), y = ferry_dtype_load(b, dt, i);
  return x != x && y != y;
}

typedef struct {
  float *p, *m, *v, *hp, *hm, *hv; /* CPU state; GPU results read back */
  unsigned char *g;                 /* grads, n x 4 bytes (any grad dtype) */
  unsigned char *pc, *hpc;          /* param copies, n x the copy dtype's size */
  float *dp, *dm, *dv;
  void *dg, *dpc;
} bufs;

static void bufs_alloc(bufs *b, size_t n, size_t csz) {
  memset(b, 0, sizeof *b);
  b->p = malloc(n * 4), b->m = calloc(n, 4), b->v = calloc(n, 4);
  b->hp = malloc(n * 4), b->hm = malloc(n * 4), b->hv = malloc(n * 4);
  b->g = malloc(n * 4);
  b->pc = calloc(n, csz), b->hpc = calloc(n, csz);
  REQUIRE(b->p && b->m && b->v && b->hp && b->hm && b->hv && b->g && b->pc && b->hpc);
  CK(cudaMalloc((void **)&b->dp, n * 4));
  CK(cudaMalloc((void **)&b->dm, n * 4));
  CK(cudaMalloc((void **)&b->dv, n * 4));
  CK(cudaMalloc(&b->dg, n * 4));
  CK(cudaMalloc(&b->dpc, n * csz));
}

static void bufs_free(bufs *b) {
  CK(cudaFree(b->dp));
  CK(cudaFree(b->dm));
  CK(cudaFree(b->dv));
  CK(cudaFree(b->dg));
  CK(cudaFree(b->dpc));
  free(b->p), free(b->m), free(b->v), free(b->hp), free(b->hm), free(b->hv), free(b->g);
  free(b->pc), free(b->hpc);
}

/* Five steps of one optimizer type, grad dtype and copy dtype on the CPU
 * and on the GPU (on `st`), then every element compared. */
static void run_case(int type, ferry_dtype gdt, ferry_dtype cdt, cudaStream_t st,
                     unsigned long long *seed) {
  const size_t n = 100003;
  ferry_optimizer_config cfg = ferry_optimizer_config_default((ferry_optim_type)type);
  cfg.weight_decay = 0.05f;
  cfg.threads = 1;
  cfg.simd = "scalar";
  ferry_optimizer *cpu = NULL, *gpu = NULL;
  REQUIRE(ferry_optimizer_create(&cfg, &cpu) == 0);
  REQUIRE(ferry_optimizer_create(&cfg, &gpu) == 0);
  size_t gs = ferry_dtype_size(gdt);
  size_t csz = cdt == FERRY_DT_NONE ? 2 : ferry_dtype_size(cdt); /* F32 copies are 4 bytes */
  bufs b;
  bufs_alloc(&b, n, csz);
  for (size_t i = 0; i < n; i++) b.p[i] = (float)((test_rand(seed) >> 40) / 16777216.0) - 0.5f;
  CK(cudaMemcpyAsync(b.dp, b.p, n * 4, cudaMemcpyHostToDevice, st));
  CK(cudaMemsetAsync(b.dm, 0, n * 4, st));
  CK(cudaMemsetAsync(b.dv, 0, n * 4, st));
  CK(cudaMemsetAsync(b.dpc, 0, n * csz, st));
  for (int step = 0; step < 5; step++) {
    CK(cudaStreamSynchronize(st)); /* the previous step's grads were read */
    for (size_t i = 0; i < n; i++) {
      float x = (float)((test_rand(seed) >> 40) / 16777216.0) * 2 - 1;
      if (i == 7 && step == 3) x = NAN; /* NaN propagates the same way */
      ferry_dt_store(b.g, gdt, i, x * 128.0f);
    }
    CK(cudaMemcpyAsync(b.dg, b.g, n * gs, cudaMemcpyHostToDevice, st));
    ferry_optim_span hs = {b.p, b.g, b.m, b.v, b.pc, n, gdt, cdt, 0};
    ferry_optim_span ds = {b.dp, b.dg, b.dm, b.dv, b.dpc, n, gdt, cdt, 0};
    EXPECT_EQ_INT(ferry_optimizer_step(cpu, &hs, 1, 1.0f / 128), 0);
    int rc = ferry_optimizer_step_cuda(gpu, &ds, 1, 1.0f / 128, (void *)st);
    if (rc) fprintf(stderr, "step_cuda: %s\n", ferry_optimizer_last_error(gpu));
    EXPECT_EQ_INT(rc, 0);
  }
  CK(cudaMemcpyAsync(b.hp, b.dp, n * 4, cudaMemcpyDeviceToHost, st));
  CK(cudaMemcpyAsync(b.hm, b.dm, n * 4, cudaMemcpyDeviceToHost, st));
  CK(cudaMemcpyAsync(b.hv, b.dv, n * 4, cudaMemcpyDeviceToHost, st));
  CK(cudaMemcpyAsync(b.hpc, b.dpc, n * csz, cudaMemcpyDeviceToHost, st));
  CK(cudaStreamSynchronize(st)); /* kernel errors surface here */
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    int same = same_elem(b.p, b.hp, i, FERRY_DT_F32) && same_elem(b.m, b.hm, i, FERRY_DT_F32) &&
               same_elem(b.v, b.hv, i, FERRY_DT_F32) &&
               (cdt == FERRY_DT_NONE || same_elem(b.pc, b.hpc, i, cdt));
    if (!same && bad++ < 3)
      fprintf(stderr, "type %d g %d c %d [%zu]: cpu %.9g gpu %.9g\n", type, (int)gdt, (int)cdt,
              i, b.p[i], b.hp[i]);
  }
  EXPECT(bad == 0);
  EXPECT_EQ_INT(ferry_optimizer_get_step(gpu), 5);
  bufs_free(&b);
  ferry_optimizer_destroy(cpu);
  ferry_optimizer_destroy(gpu);
}

/* Compact state: five steps on the CPU (scalar) and the GPU, every byte of
 * params and states compared (int8 codes and absmax included; NaN-free). */
static void run_compact(int type, int sdt, int mdt, size_t block, cudaStream_t st,
                        unsigned long long *seed) {
  const size_t n = 70001; /* a partial last block */
  ferry_optimizer_config cfg = ferry_optimizer_config_default((ferry_optim_type)type);
  cfg.weight_decay = 0.05f;
  cfg.threads = 1;
  cfg.simd = "scalar";
  cfg.state_dtype = sdt;
  cfg.master_dtype = mdt;
  cfg.state_block = block;
  cfg.seed = 7;
  ferry_optimizer *cpu = NULL, *gpu = NULL;
  REQUIRE(ferry_optimizer_create(&cfg, &cpu) == 0);
  REQUIRE(ferry_optimizer_create(&cfg, &gpu) == 0);
  size_t pb = n * ferry_dtype_size((ferry_dtype)mdt), sb = ferry_optimizer_state_bytes(&cfg, n);
  unsigned char *p = malloc(pb), *m = calloc(1, sb), *v = calloc(1, sb), *g = malloc(n * 2);
  unsigned char *hp = malloc(pb), *hm = malloc(sb), *hv = malloc(sb);
  REQUIRE(p && m && v && g && hp && hm && hv);
  void *dp, *dm, *dv, *dg;
  CK(cudaMalloc(&dp, pb));
  CK(cudaMalloc(&dm, sb));
  CK(cudaMalloc(&dv, sb));
  CK(cudaMalloc(&dg, n * 2));
  for (size_t i = 0; i < n; i++)
    ferry_dt_store(p, mdt, i, (float)((test_rand(seed) >> 40) / 16777216.0) - 0.5f);
  CK(cudaMemcpyAsync(dp, p, pb, cudaMemcpyHostToDevice, st));
  CK(cudaMemsetAsync(dm, 0, sb, st));
  CK(cudaMemsetAsync(dv, 0, sb, st));
  for (int step = 0; step < 5; step++) {
    CK(cudaStreamSynchronize(st));
    for (size_t i = 0; i < n; i++) {
      float x = (float)((test_rand(seed) >> 40) / 16777216.0) * 2 - 1;
      if (i >= 512 && i < 1024) x *= 1e-5f; /* blocks of small values */
      ferry_dt_store(g, FERRY_DT_BF16, i, x);
    }
    CK(cudaMemcpyAsync(dg, g, n * 2, cudaMemcpyHostToDevice, st));
    ferry_optim_span hs = {p, g, m, v, NULL, n, FERRY_DT_BF16, FERRY_DT_NONE, 1000};
    ferry_optim_span ds = {dp, dg, dm, dv, NULL, n, FERRY_DT_BF16, FERRY_DT_NONE, 1000};
    EXPECT_EQ_INT(ferry_optimizer_step(cpu, &hs, 1, 0.5f), 0);
    int rc = ferry_optimizer_step_cuda(gpu, &ds, 1, 0.5f, (void *)st);
    if (rc) fprintf(stderr, "step_cuda: %s\n", ferry_optimizer_last_error(gpu));
    EXPECT_EQ_INT(rc, 0);
  }
  CK(cudaMemcpyAsync(hp, dp, pb, cudaMemcpyDeviceToHost, st));
  CK(cudaMemcpyAsync(hm, dm, sb, cudaMemcpyDeviceToHost, st));
  CK(cudaMemcpyAsync(hv, dv, sb, cudaMemcpyDeviceToHost, st));
  CK(cudaStreamSynchronize(st));
  int same = !memcmp(p, hp, pb) && !memcmp(m, hm, sb) && !memcmp(v, hv, sb);
  if (!same)
    fprintf(stderr, "compact type %d state %d master %d block %zu: GPU differs (p %d m %d v %d)\n",
            type, sdt, mdt, block, memcmp(p, hp, pb) != 0, memcmp(m, hm, sb) != 0,
            memcmp(v, hv, sb) != 0);
  EXPECT(same);
  CK(cudaFree(dp));
  CK(cudaFree(dm));
  CK(cudaFree(dv));
  CK(cudaFree(dg));
  free(p), free(m), free(v), free(g), free(hp), free(hm), free(hv);
  ferry_optimizer_destroy(cpu);
  ferry_optimizer_destroy(gpu);
}

int main(void) {
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0)
    TEST_SKIP("no CUDA device: %s", e != cudaSuccess ? cudaGetErrorString(e) : "none present");
  /* A stream of our own: nothing on the legacy default stream. */
  cudaStream_t st = NULL;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  unsigned long long seed = 99;
  for (int type = FERRY_OPTIM_ADAMW; type <= FERRY_OPTIM_ADAM; type++)
    for (int gdt = FERRY_DT_F32; gdt <= FERRY_DT_BF16; gdt++)
      for (int cdt = FERRY_DT_NONE; cdt <= FERRY_DT_BF16; cdt++)
        run_case(type, (ferry_dtype)gdt, (ferry_dtype)cdt, st, &seed);
  for (int type = FERRY_OPTIM_ADAMW; type <= FERRY_OPTIM_ADAM; type++)
    for (int mdt = FERRY_DT_F32; mdt <= FERRY_DT_BF16; mdt += FERRY_DT_BF16 - FERRY_DT_F32) {
      run_compact(type, FERRY_DT_F32, mdt, 0, st, &seed);
      run_compact(type, FERRY_DT_BF16, mdt, 0, st, &seed);
      run_compact(type, FERRY_DT_I8, mdt, 0, st, &seed);
      run_compact(type, FERRY_DT_I8, mdt, 64, st, &seed);
    }
  CK(cudaStreamDestroy(st));
  return test_finish("optim.adamw_cuda");
}
