/* examples/gpt/gemm_lt.cu — one GEMM of the CUDA model on cuBLASLt
 * (gpt_gemm_lt in gpt_kernels.h): bf16 operands, fp32 accumulation, D in
 * bf16 or fp32, with the bias or the bias + GELU fused into the epilogue,
 * in the caller's workspace. Row-major operands are handed to cuBLASLt's
 * column-major view as D^T = op(B)^T . op(A)^T, so no copy is made.
 * Descriptors live for one call; the algorithm is cuBLASLt's first
 * heuristic pick that fits the workspace and the pointers' alignment.
 */
#include "gpt_kernels.h"

#include "ferry.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>

/* the largest power of two up to 256 that divides p's address */
static uint32_t align_of(const void *p) {
  uint32_t a = 256;
  while (a > 1 && ((uintptr_t)p % a)) a >>= 1;
  return a;
}

/* The descriptors of one call, destroyed together. */
typedef struct {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t first, second, d;
  cublasLtMatmulPreference_t pref;
} lt_call;

static void lt_call_free(lt_call *c) {
  if (c->pref) cublasLtMatmulPreferenceDestroy(c->pref);
  if (c->d) cublasLtMatrixLayoutDestroy(c->d);
  if (c->second) cublasLtMatrixLayoutDestroy(c->second);
  if (c->first) cublasLtMatrixLayoutDestroy(c->first);
  if (c->op) cublasLtMatmulDescDestroy(c->op);
}

/* Sets up c for the row-major product; returns the first failing status. */
static cublasStatus_t lt_describe(lt_call *c, int m, int n, int k, const void *A, int ta,
                                  const void *B, int tb, void *D, cudaDataType_t dt, int epi,
                                  const void *bias, void *aux, void *ws, size_t ws_bytes) {
  /* column-major: the first operand is B ([n, k] after op), the second A
   * ([k, m] after op), D is [n, m] with ld n */
  cublasOperation_t opf = tb ? CUBLAS_OP_T : CUBLAS_OP_N, ops = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasLtEpilogue_t e = epi == GPT_EPI_BIAS            ? CUBLASLT_EPILOGUE_BIAS
                         : epi == GPT_EPI_GELU_AUX_BIAS ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                        : CUBLASLT_EPILOGUE_DEFAULT;
  cublasStatus_t s = cublasLtMatmulDescCreate(&c->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (!s) s = cublasLtMatmulDescSetAttribute(c->op, CUBLASLT_MATMUL_DESC_TRANSA, &opf, sizeof opf);
  if (!s) s = cublasLtMatmulDescSetAttribute(c->op, CUBLASLT_MATMUL_DESC_TRANSB, &ops, sizeof ops);
  if (!s) s = cublasLtMatmulDescSetAttribute(c->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e);
  if (!s && epi != GPT_EPI_NONE)
    s = cublasLtMatmulDescSetAttribute(c->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                       sizeof bias);
  if (!s && epi == GPT_EPI_GELU_AUX_BIAS) {
    int64_t ld = n;
    s = cublasLtMatmulDescSetAttribute(c->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                       sizeof aux);
    if (!s)
      s = cublasLtMatmulDescSetAttribute(c->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                         sizeof ld);
  }
  if (!s)
    s = tb ? cublasLtMatrixLayoutCreate(&c->first, CUDA_R_16BF, k, n, k)
           : cublasLtMatrixLayoutCreate(&c->first, CUDA_R_16BF, n, k, n);
  if (!s)
    s = ta ? cublasLtMatrixLayoutCreate(&c->second, CUDA_R_16BF, m, k, m)
           : cublasLtMatrixLayoutCreate(&c->second, CUDA_R_16BF, k, m, k);
  if (!s) s = cublasLtMatrixLayoutCreate(&c->d, dt, n, m, n);
  if (!s) s = cublasLtMatmulPreferenceCreate(&c->pref);
  uint64_t wsb = ws ? ws_bytes : 0;
  if (!s)
    s = cublasLtMatmulPreferenceSetAttribute(c->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &wsb, sizeof wsb);
  const cublasLtMatmulPreferenceAttributes_t al[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  const void *ptr[4] = {B, A, D, D};
  for (int i = 0; i < 4 && !s; i++) {
    uint32_t a = align_of(ptr[i]);
    s = cublasLtMatmulPreferenceSetAttribute(c->pref, al[i], &a, sizeof a);
  }
  return s;
}

extern "C" int gpt_gemm_lt(void *lt, int m, int n, int k, const uint16_t *A, int ta,
                           const uint16_t *B, int tb, void *D, int ddt, float alpha, float beta,
                           int epi, const void *bias, void *aux, void *ws, size_t ws_bytes,
                           void *stream, char *err, size_t errlen) {
  const char *why = NULL;
  if (m <= 0 || n <= 0 || k <= 0) why = "m, n and k must be positive";
  else if (ddt != FERRY_DT_BF16 && ddt != FERRY_DT_F32) why = "D must be bf16 or fp32";
  else if (epi < GPT_EPI_NONE || epi > GPT_EPI_GELU_AUX_BIAS) why = "unknown epilogue";
  else if (epi != GPT_EPI_NONE && !bias) why = "the epilogue needs a bias";
  else if (epi == GPT_EPI_GELU_AUX_BIAS && (!aux || n % 8)) why = "GELU_AUX_BIAS needs aux and n % 8 == 0";
  if (why) {
    if (err && errlen) snprintf(err, errlen, "gpt_gemm_lt: %s", why);
    return -1;
  }
  cudaDataType_t dt = ddt == FERRY_DT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
  lt_call c = {};
  cublasLtHandle_t h = (cublasLtHandle_t)lt;
  cublasStatus_t s = lt_describe(&c, m, n, k, A, ta, B, tb, D, dt, epi, bias, aux, ws, ws_bytes);
  cublasLtMatmulHeuristicResult_t res = {};
  int found = 0;
  if (!s) s = cublasLtMatmulAlgoGetHeuristic(h, c.op, c.first, c.second, c.d, c.d, c.pref, 1, &res,
                                             &found);
  if (!s && !found) {
    lt_call_free(&c);
    if (err && errlen)
      snprintf(err, errlen, "gpt_gemm_lt: no cuBLASLt algorithm for m %d n %d k %d in %zu bytes",
               m, n, k, ws ? ws_bytes : (size_t)0);
    return -1;
  }
  if (!s)
    s = cublasLtMatmul(h, c.op, &alpha, B, c.first, A, c.second, &beta, D, c.d, D, c.d, &res.algo,
                       ws, ws ? ws_bytes : 0, (cudaStream_t)stream);
  lt_call_free(&c);
  if (s) {
    if (err && errlen)
      snprintf(err, errlen, "gpt_gemm_lt: m %d n %d k %d: %s", m, n, k, cublasLtGetStatusString(s));
    return -1;
  }
  return 0;
}
