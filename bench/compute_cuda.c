/* bench/compute_cuda.c — the cuda half of `ferry bench compute`: cuBLAS
 * opened with dlopen (the ferry command links the CUDA runtime only, so a
 * host run maps no cuBLAS), three buffers on GPU 0, a small product of every
 * transpose checked against a C loop, and cublasGemmEx timed with CUDA
 * events, bf16 in and out with fp32 accumulation (ferry-gpt's CUDA model)
 * or fp32. Row-major products run as their column-major transposes:
 * C^T = op(B)^T op(A)^T, the same transpose flags with A and B swapped.
 */
#include "bench/compute_cuda.h"

#include "core/dtype.h"

#include <cublas_api.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef cublasStatus_t (*create_fn)(cublasHandle_t *);
typedef cublasStatus_t (*destroy_fn)(cublasHandle_t);
typedef cublasStatus_t (*gemm_ex_fn)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                     int, int, const void *, const void *, cudaDataType, int,
                                     const void *, cudaDataType, int, const void *, void *,
                                     cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);

struct compute_cuda {
  void *lib;
  create_fn create;
  destroy_fn destroy;
  gemm_ex_fn gemm;
  cublasHandle_t h;
  void *a, *b, *c; /* elems x 4 bytes each */
  size_t elems;
  cudaEvent_t e0, e1;
};

int compute_cuda_present(void) {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

static int open_cublas(compute_cuda *c, const char *prog) {
  static const char *const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
  for (size_t i = 0; i < sizeof names / sizeof names[0] && !c->lib; i++)
    c->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!c->lib) {
    fprintf(stderr, "%s: --device cuda: cannot open cuBLAS (libcublas.so.13): %s\n", prog,
            dlerror());
    return 1;
  }
  *(void **)&c->create = dlsym(c->lib, "cublasCreate_v2");
  *(void **)&c->destroy = dlsym(c->lib, "cublasDestroy_v2");
  *(void **)&c->gemm = dlsym(c->lib, "cublasGemmEx");
  if (!c->create || !c->destroy || !c->gemm) {
    fprintf(stderr, "%s: --device cuda: cuBLAS lacks cublasCreate_v2, cublasDestroy_v2 or "
            "cublasGemmEx\n", prog);
    return 1;
  }
  if (c->create(&c->h) != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "%s: --device cuda: cublasCreate failed\n", prog);
    c->h = NULL;
    return 1;
  }
  return 0;
}

int compute_cuda_open(compute_cuda **out, size_t elems, char *device, size_t dl,
                      const char *prog) {
  *out = NULL;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n < 1) {
    fprintf(stderr, "%s: --device cuda: no CUDA device (%s)\n", prog,
            e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    return 1;
  }
  compute_cuda *c = calloc(1, sizeof *c);
  if (!c) return 1;
  *out = c;
  struct cudaDeviceProp p;
  if (cudaSetDevice(0) != cudaSuccess || cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
    fprintf(stderr, "%s: --device cuda: cannot open GPU 0\n", prog);
    return 1;
  }
  snprintf(device, dl, "cuda: %s", p.name);
  if (open_cublas(c, prog)) return 1;
  c->elems = elems < 4096 ? 4096 : elems;
  if (cudaMalloc(&c->a, c->elems * 4) != cudaSuccess ||
      cudaMalloc(&c->b, c->elems * 4) != cudaSuccess ||
      cudaMalloc(&c->c, c->elems * 4) != cudaSuccess ||
      cudaEventCreate(&c->e0) != cudaSuccess || cudaEventCreate(&c->e1) != cudaSuccess) {
    fprintf(stderr, "%s: --device cuda: cannot allocate 3 x %zu MiB on the GPU\n", prog,
            c->elems * 4 >> 20);
    return 1;
  }
  /* any values: the timed products read what is there; zeros keep them finite */
  if (cudaMemset(c->a, 0, c->elems * 4) || cudaMemset(c->b, 0, c->elems * 4)) return 1;
  return 0;
}

static int gemm(compute_cuda *c, int fp32, int ta, int tb, long M, long N, long K, float alpha,
                const void *A, const void *B, float beta, void *C) {
  cudaDataType t = fp32 ? CUDA_R_32F : CUDA_R_16BF;
  int lda = ta ? (int)M : (int)K, ldb = tb ? (int)K : (int)N;
  return c->gemm(c->h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N,
                 (int)M, (int)K, &alpha, B, t, ldb, A, t, lda, &beta, C, t, (int)N,
                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS;
}

/* Values in [-0.5, 0.5), rounded to bf16 when !fp32 (what the GPU reads). */
static void fill(float *x, size_t n, unsigned seed, int fp32) {
  uint32_t s = seed * 2654435761u + 777u;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    x[i] = (float)(s >> 8) * (1.0f / 16777216.0f) - 0.5f;
    if (!fp32) x[i] = ferry_bf16_to_f32(ferry_f32_to_bf16(x[i]));
  }
}

/* The device copy of n floats as fp32 or bf16. */
static int upload(void *dst, const float *x, size_t n, int fp32) {
  if (fp32) return cudaMemcpy(dst, x, n * 4, cudaMemcpyHostToDevice) != cudaSuccess;
  uint16_t *h = malloc(n * 2);
  if (!h) return 1;
  for (size_t i = 0; i < n; i++) h[i] = ferry_f32_to_bf16(x[i]);
  int rc = cudaMemcpy(dst, h, n * 2, cudaMemcpyHostToDevice) != cudaSuccess;
  free(h);
  return rc;
}

static int download(float *x, const void *src, size_t n, int fp32) {
  if (fp32) return cudaMemcpy(x, src, n * 4, cudaMemcpyDeviceToHost) != cudaSuccess;
  uint16_t *h = malloc(n * 2);
  if (!h) return 1;
  int rc = cudaMemcpy(h, src, n * 2, cudaMemcpyDeviceToHost) != cudaSuccess;
  for (size_t i = 0; i < n && !rc; i++) x[i] = ferry_bf16_to_f32(h[i]);
  free(h);
  return rc;
}

int compute_cuda_check(compute_cuda *c, double *worst, const char *prog) {
  enum { M = 67, N = 45, K = 129 };
  static float A[M * K], B[K * N], C[M * N];
  *worst = 0;
  for (int fp32 = 0; fp32 < 2; fp32++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        fill(A, M * K, 1 + ta, fp32), fill(B, K * N, 3 + tb, fp32);
        if (upload(c->a, A, M * K, fp32) || upload(c->b, B, K * N, fp32) ||
            gemm(c, fp32, ta, tb, M, N, K, 0.75f, c->a, c->b, 0.0f, c->c) ||
            cudaDeviceSynchronize() != cudaSuccess || download(C, c->c, M * N, fp32)) {
          fprintf(stderr, "%s: --device cuda: the check's product failed\n", prog);
          return 1;
        }
        /* the same sums in double; bf16 out rounds to 2^-8 of the value */
        double tol = fp32 ? 1e-5 : 1e-2;
        long lda = ta ? M : K, ldb = tb ? K : N;
        for (long i = 0; i < M; i++)
          for (long j = 0; j < N; j++) {
            double s = 0, a = 0;
            for (long k = 0; k < K; k++) {
              double x = ta ? A[k * lda + i] : A[i * lda + k];
              double y = tb ? B[j * ldb + k] : B[k * ldb + j];
              s += x * y, a += fabs(x * y);
            }
            double err = fabs(C[i * N + j] - 0.75 * s) / (0.75 * a > 1e-30 ? 0.75 * a : 1e-30);
            if (!(err <= *worst)) *worst = isnan(err) ? INFINITY : err;
          }
        if (*worst > tol) {
          fprintf(stderr, "%s: --device cuda: check failed: %s GEMM (%c%c, %dx%dx%d) is off the "
                  "reference by %.3g of its scale\n", prog, fp32 ? "fp32" : "bf16",
                  ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, *worst);
          return 1;
        }
      }
  return 0;
}

static int cmp_float(const void *x, const void *y) {
  float a = *(const float *)x, b = *(const float *)y;
  return a < b ? -1 : a > b;
}

double compute_cuda_time(compute_cuda *c, int fp32, int ta, int tb, long M, long N, long K,
                         int iters) {
  float t[100];
  double spent = 0;
  int n = 0;
  if (gemm(c, fp32, ta, tb, M, N, K, 1.0f, c->a, c->b, 0.0f, c->c)) return -1; /* warm-up */
  while (n < iters && n < 100 && (n == 0 || spent < 0.3)) {
    if (cudaEventRecord(c->e0, 0) ||
        gemm(c, fp32, ta, tb, M, N, K, 1.0f, c->a, c->b, 0.0f, c->c) ||
        cudaEventRecord(c->e1, 0) || cudaEventSynchronize(c->e1) ||
        cudaEventElapsedTime(&t[n], c->e0, c->e1))
      return -1;
    t[n] /= 1e3f;
    spent += t[n++];
  }
  qsort(t, (size_t)n, sizeof *t, cmp_float);
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

void compute_cuda_close(compute_cuda *c) {
  if (!c) return;
  if (c->e0) cudaEventDestroy(c->e0);
  if (c->e1) cudaEventDestroy(c->e1);
  cudaFree(c->a), cudaFree(c->b), cudaFree(c->c);
  if (c->h) c->destroy(c->h);
  if (c->lib) dlclose(c->lib);
  free(c);
}
