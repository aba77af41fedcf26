/* tests/gpt/cuda_emu/cublas.cpp — cuBLAS for the emulated build
 * (cublas_v2.h): cublasGemmEx column-major, C = alpha op(A) op(B) + beta C
 * with bf16 A and B, the products summed in double, C fp32 or rounded to
 * bf16; C is not read when beta is 0 (as cuBLAS). Arguments are checked
 * as cuBLAS does (leading dimensions, types), and beyond: each operand
 * lies in one device allocation, C overlaps neither A nor B, the handle's
 * stream is live; misuse aborts naming it. cublasSetStream resets the
 * workspace to the default one (as cuBLAS); a workspace must be
 * 256-byte aligned device memory. */
#include "cublas_v2.h"

#include "cuda_bf16.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

struct cublasContext {
  cudaStream_t stream;
  void *ws;
  size_t ws_bytes;
};

[[noreturn]] static void die(const char *why) {
  fprintf(stderr, "cuda emulation: cublasGemmEx: %s\n", why);
  abort();
}

/* bytes a column-major rows x cols operand spans at leading dimension ld */
static size_t span(int rows, int cols, int ld, size_t es) {
  return ((size_t)(cols - 1) * ld + rows) * es;
}

static int overlap(const void *a, size_t na, const void *b, size_t nb) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + nb && y < x + na;
}

/* C = alpha op(A) op(B) + beta C, column-major, in double */
static void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float al,
                 const __nv_bfloat16 *a, int lda, const __nv_bfloat16 *b, int ldb, float be,
                 void *C, cudaDataType_t ct, int ldc) {
  for (int j = 0; j < n; j++)
    for (int i = 0; i < m; i++) {
      double s = 0;
      for (int l = 0; l < k; l++) {
        float x =
            __bfloat162float(ta == CUBLAS_OP_N ? a[i + (size_t)l * lda] : a[l + (size_t)i * lda]);
        float y =
            __bfloat162float(tb == CUBLAS_OP_N ? b[l + (size_t)j * ldb] : b[j + (size_t)l * ldb]);
        s += (double)x * y;
      }
      size_t at_c = i + (size_t)j * ldc;
      float v = al * (float)s;
      if (ct == CUDA_R_32F) {
        float *c = (float *)C + at_c;
        *c = be != 0.0f ? v + be * *c : v;
      } else {
        __nv_bfloat16 *c = (__nv_bfloat16 *)C + at_c;
        *c = __float2bfloat16(be != 0.0f ? v + be * __bfloat162float(*c) : v);
      }
    }
}

/* $EMU_TRACE: each GEMM's shape and the largest magnitudes of its operands */
static void trace(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                  const __nv_bfloat16 *a, int lda, const __nv_bfloat16 *b, int ldb, float be,
                  const void *C, cudaDataType_t ct, int ldc) {
  int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
  int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
  double ma = 0, mb = 0, mc = 0;
  for (size_t i = 0; k && i < span(ar, ac, lda, 1); i++)
    ma = fmax(ma, fabs(__bfloat162float(a[i])));
  for (size_t i = 0; k && i < span(br, bc, ldb, 1); i++)
    mb = fmax(mb, fabs(__bfloat162float(b[i])));
  for (size_t i = 0; i < span(m, n, ldc, 1); i++)
    mc = fmax(mc, fabs(ct == CUDA_R_32F ? ((const float *)C)[i]
                                        : __bfloat162float(((const __nv_bfloat16 *)C)[i])));
  fprintf(stderr,
          "gemm %c%c m %d n %d k %d lda %d ldb %d ldc %d beta %g: max|A| %g max|B| %g "
          "max|C| %g\n",
          "NT"[ta], "NT"[tb], m, n, k, lda, ldb, ldc, be, ma, mb, mc);
}

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t *h) {
  *h = (cublasHandle_t)calloc(1, sizeof **h);
  return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  free(h);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t st) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  emu_check_stream(st, "cublasSetStream");
  h->stream = st, h->ws = NULL, h->ws_bytes = 0;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (bytes && ((uintptr_t)ws % 256)) return CUBLAS_STATUS_INVALID_VALUE;
  if (bytes) emu_check_device(ws, bytes, "cublasSetWorkspace");
  h->ws = ws, h->ws_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType_t at,
                            int lda, const void *B, cudaDataType_t bt, int ldb, const void *beta,
                            void *C, cudaDataType_t ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo) {
  (void)algo;
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (m < 0 || n < 0 || k < 0 || (ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) ||
      (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T))
    return CUBLAS_STATUS_INVALID_VALUE;
  int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m; /* A as stored */
  int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
  if (lda < (ar > 1 ? ar : 1) || ldb < (br > 1 ? br : 1) || ldc < (m > 1 ? m : 1))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (at != CUDA_R_16BF || bt != CUDA_R_16BF || (ct != CUDA_R_32F && ct != CUDA_R_16BF) ||
      compute != CUBLAS_COMPUTE_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED; /* all the model asks */
  emu_check_stream(h->stream, "cublasGemmEx (the handle's stream)");
  if (emu_is_device(alpha, 1) || emu_is_device(beta, 1)) die("alpha or beta in device memory");
  if (!m || !n) return CUBLAS_STATUS_SUCCESS;
  size_t es = ct == CUDA_R_32F ? 4 : 2, nc = span(m, n, ldc, es);
  emu_check_device(C, nc, "cublasGemmEx: C");
  float al = *(const float *)alpha, be = *(const float *)beta;
  const __nv_bfloat16 *a = (const __nv_bfloat16 *)A, *b = (const __nv_bfloat16 *)B;
  if (k) {
    size_t na = span(ar, ac, lda, 2), nb = span(br, bc, ldb, 2);
    emu_check_device(A, na, "cublasGemmEx: A");
    emu_check_device(B, nb, "cublasGemmEx: B");
    if (overlap(C, nc, A, na) || overlap(C, nc, B, nb)) die("C overlaps A or B");
  }
  emu_enqueue(h->stream, [=] {
    gemm(ta, tb, m, n, k, al, a, lda, b, ldb, be, C, ct, ldc);
    if (getenv("EMU_TRACE")) trace(ta, tb, m, n, k, a, lda, b, ldb, be, C, ct, ldc);
  });
  return CUBLAS_STATUS_SUCCESS;
}

} /* extern "C" */
