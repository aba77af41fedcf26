/* tests/optim/test_adamw_cuda.c — the CUDA AdamW/Adam kernel against the CPU
 * scalar reference (same operations: bit-exact fp32, identical 16-bit
 * copies) over several steps and grad dtypes, through the public
 * ferry_optimizer_step_cuda. Uses the CUDA runtime directly for buffers.
 * Exits 77 when no CUDA device is present.
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

int main(void) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) TEST_SKIP("no CUDA device");
  unsigned long long seed = 99;
  const size_t n = 100003;
  for (int type = FERRY_OPTIM_ADAMW; type <= FERRY_OPTIM_ADAM; type++)
    for (int gdt = FERRY_DT_F32; gdt <= FERRY_DT_BF16; gdt++)
      for (int cdt = FERRY_DT_NONE; cdt <= FERRY_DT_BF16; cdt++) {
        ferry_optimizer_config cfg = ferry_optimizer_config_default((ferry_optim_type)type);
        cfg.weight_decay = 0.05f;
        cfg.threads = 1;
        cfg.simd = "scalar";
        ferry_optimizer *cpu = NULL, *gpu = NULL;
        REQUIRE(ferry_optimizer_create(&cfg, &cpu) == 0);
        REQUIRE(ferry_optimizer_create(&cfg, &gpu) == 0);
        size_t gs = gdt == FERRY_DT_F32 ? 4 : 2;
        float *p = malloc(n * 4), *m = calloc(n, 4), *v = calloc(n, 4), *hp = malloc(n * 4);
        float *hm = malloc(n * 4), *hv = malloc(n * 4);
        unsigned char *g = malloc(n * 4);
        uint16_t *pc = calloc(n, 2), *hpc = calloc(n, 2);
        for (size_t i = 0; i < n; i++)
          p[i] = (float)((test_rand(&seed) >> 40) / 16777216.0) - 0.5f;
        float *dp, *dm, *dv;
        void *dg, *dpc;
        CK(cudaMalloc((void **)&dp, n * 4));
        CK(cudaMalloc((void **)&dm, n * 4));
        CK(cudaMalloc((void **)&dv, n * 4));
        CK(cudaMalloc(&dg, n * 4));
        CK(cudaMalloc(&dpc, n * 2));
        CK(cudaMemcpy(dp, p, n * 4, cudaMemcpyHostToDevice));
        CK(cudaMemset(dm, 0, n * 4));
        CK(cudaMemset(dv, 0, n * 4));
        for (int step = 0; step < 5; step++) {
          for (size_t i = 0; i < n; i++) {
            float x = (float)((test_rand(&seed) >> 40) / 16777216.0) * 2 - 1;
            if (i == 7 && step == 3) x = NAN; /* NaN propagates the same way */
            ferry_dt_store(g, gdt, i, x * 128.0f);
          }
          CK(cudaMemcpy(dg, g, n * gs, cudaMemcpyHostToDevice));
          ferry_optim_span hs = {p, g, m, v, pc, n, gdt, cdt};
          ferry_optim_span ds = {dp, dg, dm, dv, dpc, n, gdt, cdt};
          EXPECT_EQ_INT(ferry_optimizer_step(cpu, &hs, 1, 1.0f / 128), 0);
          int rc = ferry_optimizer_step_cuda(gpu, &ds, 1, 1.0f / 128, NULL);
          if (rc) fprintf(stderr, "step_cuda: %s\n", ferry_optimizer_last_error(gpu));
          EXPECT_EQ_INT(rc, 0);
        }
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(hp, dp, n * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hm, dm, n * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hv, dv, n * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hpc, dpc, n * 2, cudaMemcpyDeviceToHost));
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
          int same = (memcmp(&p[i], &hp[i], 4) == 0 || (p[i] != p[i] && hp[i] != hp[i])) &&
                     (memcmp(&m[i], &hm[i], 4) == 0 || (m[i] != m[i] && hm[i] != hm[i])) &&
                     (memcmp(&v[i], &hv[i], 4) == 0 || (v[i] != v[i] && hv[i] != hv[i])) &&
                     (cdt == FERRY_DT_NONE || pc[i] == hpc[i] ||
                      ((pc[i] & 0x7fff) > 0x7c00 && (hpc[i] & 0x7fff) > 0x7c00));
          if (!same && bad++ < 3)
            fprintf(stderr, "type %d g %d c %d [%zu]: cpu %.9g gpu %.9g\n", type, gdt, cdt, i, p[i],
                    hp[i]);
        }
        EXPECT(bad == 0);
        EXPECT_EQ_INT(ferry_optimizer_get_step(gpu), 5);
        cudaFree(dp);
        cudaFree(dm);
        cudaFree(dv);
        cudaFree(dg);
        cudaFree(dpc);
        free(p), free(m), free(v), free(hp), free(hm), free(hv), free(g), free(pc), free(hpc);
        ferry_optimizer_destroy(cpu);
        ferry_optimizer_destroy(gpu);
      }
  return test_finish("optim.adamw_cuda");
}
