/* tests/optim/test_grad_cuda.c — the gradient helpers as CUDA kernels
 * (optim/grad_cuda.h) against the CPU reference: accumulation into fp32
 * bit for bit for every grad dtype, the sum of squares in double within
 * rounding of the CPU's order and the same on every call (fixed order),
 * an inf or NaN seen as a non-finite sum. Uses the CUDA runtime directly
 * for buffers. Exits 77 when no CUDA device is present.
 */
#include "optim/grad_cuda.h"
#include "optim/scalar_impl.h"
#include "tests/test.h"

#include <cuda_runtime.h>
#include <math.h>
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

static unsigned long long seed = 7;

static float uniform(void) { return (float)((test_rand(&seed) >> 40) / 16777216.0) * 2 - 1; }

static void check_dtype(int gdt, size_t n, cudaStream_t st) {
  size_t gs = gdt == FERRY_DT_F32 ? 4 : 2;
  float *acc = malloc(n * 4), *back = malloc(n * 4);
  unsigned char *g = malloc(n * gs);
  REQUIRE(acc && back && g);
  for (size_t i = 0; i < n; i++) {
    acc[i] = uniform();
    ferry_dt_store(g, gdt, i, uniform() * 3.0f);
  }
  float *dacc;
  void *dg;
  double *dpart, *dout, out[2];
  CK(cudaMalloc((void **)&dacc, n * 4 + 4));
  CK(cudaMalloc(&dg, n * gs + 4));
  CK(cudaMalloc((void **)&dpart, OPTIM_CUDA_SUMSQ_BLOCKS * sizeof(double)));
  CK(cudaMalloc((void **)&dout, 2 * sizeof(double)));
  CK(cudaMemcpy(dacc, acc, n * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dg, g, n * gs, cudaMemcpyHostToDevice));
  char why[256] = "";
  float scale = 0.25f;
  EXPECT(optim_cuda_accumulate(dacc, dg, gdt, n, scale, st, why, sizeof why) == 0);
  EXPECT(optim_cuda_sumsq(dacc, FERRY_DT_F32, n, dpart, dout, st, why, sizeof why) == 0);
  EXPECT(optim_cuda_sumsq(dacc, FERRY_DT_F32, n, dpart, dout + 1, st, why, sizeof why) == 0);
  CK(cudaStreamSynchronize(st));
  CK(cudaMemcpy(back, dacc, n * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost));
  optim_ref_accumulate_range(acc, g, gdt, 0, n, scale);
  EXPECT(memcmp(acc, back, n * 4) == 0);
  double want = optim_ref_sumsq_range(acc, FERRY_DT_F32, 0, n);
  EXPECT(fabs(out[0] - want) <= 1e-9 * want); /* another order of additions */
  EXPECT(memcmp(&out[0], &out[1], sizeof(double)) == 0); /* fixed order: the same bits */
  printf("dtype %d, n %zu: sumsq %.17g (cpu %.17g)\n", gdt, n, out[0], want);
  /* a NaN among them: a non-finite sum */
  float nan = NAN;
  CK(cudaMemcpy(dacc + n / 2, &nan, 4, cudaMemcpyHostToDevice));
  EXPECT(optim_cuda_sumsq(dacc, FERRY_DT_F32, n, dpart, dout, st, why, sizeof why) == 0);
  CK(cudaStreamSynchronize(st));
  CK(cudaMemcpy(out, dout, sizeof(double), cudaMemcpyDeviceToHost));
  EXPECT(!isfinite(out[0]));
  CK(cudaFree(dacc));
  CK(cudaFree(dg));
  CK(cudaFree(dpart));
  CK(cudaFree(dout));
  free(acc);
  free(back);
  free(g);
}

int main(void) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) TEST_SKIP("no CUDA device");
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (int gdt = FERRY_DT_F32; gdt <= FERRY_DT_BF16; gdt++) {
    check_dtype(gdt, 1, st);
    check_dtype(gdt, 1000003, st);
  }
  CK(cudaStreamDestroy(st));
  return test_finish("optim.grad_cuda");
}
