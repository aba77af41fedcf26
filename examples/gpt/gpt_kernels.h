/* examples/gpt/gpt_kernels.h — the CUDA model's fused kernels other than
 * attention (kernels_cuda.cu) and their CPU references (kernels_ref.c):
 * the residual add fused into RMSNorm / LayerNorm forward and backward,
 * SwiGLU and GELU on bf16 activations, and the softmax cross-entropy run
 * in chunks of tokens, so no B x T x V fp32 logits are ever held; and a
 * GEMM on cuBLASLt with the bias or bias + GELU in its epilogue (gemm_lt.cu).
 *
 * Activations are bf16 (uint16_t bits here, __nv_bfloat16 in CUDA); norm
 * statistics, softmax sums and the loss accumulate in fp32. Weights come
 * in their dtype wdt (FERRY_DT_F32 / F16 / BF16, as ferry_dtype's values).
 * The CUDA launchers enqueue on `stream` (a cudaStream_t) and return 0, or
 * -1 with the CUDA error in err. The CPU references take fp32 activations
 * rounded exactly as the kernels round them (bf16 on every store the
 * kernel makes in bf16), so tests compare to within accumulation order.
 */
#ifndef FERRY_GPT_KERNELS_H
#define FERRY_GPT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- residual + norm -----------------------------------------------------------
 * xout = bf16(x + delta) (delta fp32, NULL: xout = x, xout may be NULL then;
 * xout may be x);
 * y = bf16(norm(xout) * w (+ b)), statistics from the rounded xout.
 * layernorm: mean saved and b added; else RMSNorm (mean may be NULL). */
int gpt_resid_norm_cuda_fwd(uint16_t *xout, uint16_t *y, float *mean, float *rstd,
                            const uint16_t *x, const float *delta, const void *w, const void *b,
                            int wdt, size_t N, int C, float eps, int layernorm, void *stream,
                            char *err, size_t errlen);
/* dx += d(norm)/dx applied to dy (fp32); dw (and db) += their grads (fp32,
 * no atomics per element: per-block partial sums, then one reduction into
 * `partial`, a workspace of gpt_norm_bwd_partial_floats(N, C) floats: plain
 * C in kernels_ref.c, so a plan counts it without a GPU). */
size_t gpt_norm_bwd_partial_floats(size_t N, int C);
int gpt_norm_cuda_bwd(float *dx, float *dw, float *db, const float *dy, const uint16_t *x,
                      const float *mean, const float *rstd, const void *w, int wdt, size_t N,
                      int C, int layernorm, float *partial, void *stream, char *err,
                      size_t errlen);

/* ---- activations ----------------------------------------------------------------
 * SwiGLU: h = bf16(silu(g) * u); backward from dh (fp32): dg, du bf16. */
int gpt_swiglu_cuda_fwd(uint16_t *h, const uint16_t *g, const uint16_t *u, size_t n,
                        void *stream, char *err, size_t errlen);
int gpt_swiglu_cuda_bwd(uint16_t *dg, uint16_t *du, const float *dh, const uint16_t *g,
                        const uint16_t *u, size_t n, void *stream, char *err, size_t errlen);
/* GELU (tanh) with the bias fused: pre = bf16(x + b) saved, y = bf16(gelu(pre));
 * x [N, F] fp32 (a GEMM output), b [F] in wdt. Backward: dpre = bf16(dy *
 * gelu'(pre)); db += column sums of dpre (fp32, through `partial` as above,
 * gpt_norm_bwd_partial_floats(N, F) floats). */
int gpt_gelu_bias_cuda_fwd(uint16_t *y, uint16_t *pre, const float *x, const void *b, int wdt,
                           size_t N, int F, void *stream, char *err, size_t errlen);
int gpt_gelu_bias_cuda_bwd(uint16_t *dpre, float *db, const float *dy, const uint16_t *pre,
                           size_t N, int F, float *partial, void *stream, char *err,
                           size_t errlen);
/* y = bf16(x + b), x fp32 [N, F] (a GEMM output), b in wdt (NULL: none);
 * the column sums of an fp32 dy added into db through `partial`. */
int gpt_bias_bf16_cuda(uint16_t *y, const float *x, const void *b, int wdt, size_t N, int F,
                       void *stream, char *err, size_t errlen);
int gpt_bias_grad_cuda(float *db, const float *dy, size_t N, int F, float *partial, void *stream,
                       char *err, size_t errlen);

/* ---- cross-entropy in chunks ------------------------------------------------------
 * One chunk of n rows of fp32 logits [n, V] (row stride V). fwd: rowloss[i]
 * = lse_i - logit[i][tgt[i]], lse[i] saved. bwd: dlogits = bf16(scale *
 * (exp(logit - lse) - onehot(tgt))), written over nothing else (its own
 * bf16 buffer [n, V]). A target outside [0, V) gives a NaN row loss and
 * no onehot term. */
int gpt_ce_cuda_fwd(const float *logits, const int32_t *tgt, size_t n, int V, float *rowloss,
                    float *lse, void *stream, char *err, size_t errlen);
int gpt_ce_cuda_bwd(uint16_t *dlogits, const float *logits, const int32_t *tgt, const float *lse,
                    size_t n, int V, float scale, void *stream, char *err, size_t errlen);

/* ---- GEMM on cuBLASLt with a fused epilogue (gemm_lt.cu) ----------------------------
 * Row-major D [m, n] = alpha op(A) [m, k] . op(B) [k, n] + beta D: A and B
 * bf16 (ta: A stored [k, m]; tb: B stored [n, k], as a Linear's weight
 * [out, in]), fp32 accumulation, D in ddt (FERRY_DT_BF16 / FERRY_DT_F32).
 * epi GPT_EPI_BIAS adds bias [n] before D is stored; GPT_EPI_GELU_AUX_BIAS
 * also stores the biased sum in aux [m, n] and D = gelu(it) (tanh form,
 * fp32 before rounding; n % 8 == 0). bias and aux in ddt. lt: a
 * cublasLtHandle_t; ws / ws_bytes: the caller's workspace, the algorithm
 * chosen among those that fit it. */
enum { GPT_EPI_NONE = 0, GPT_EPI_BIAS = 1, GPT_EPI_GELU_AUX_BIAS = 2 };
int gpt_gemm_lt(void *lt, int m, int n, int k, const uint16_t *A, int ta, const uint16_t *B,
                int tb, void *D, int ddt, float alpha, float beta, int epi, const void *bias,
                void *aux, void *ws, size_t ws_bytes, void *stream, char *err, size_t errlen);

/* ---- CPU references (kernels_ref.c) --------------------------------------------------
 * The same contracts on host memory, activations as fp32 holding bf16
 * values (gpt_bf16_round), weights as fp32. */
float gpt_bf16_round(float x);
void gpt_resid_norm_ref_fwd(float *xout, float *y, float *mean, float *rstd, const float *x,
                            const float *delta, const float *w, const float *b, size_t N, int C,
                            float eps, int layernorm);
void gpt_norm_ref_bwd(float *dx, float *dw, float *db, const float *dy, const float *x,
                      const float *mean, const float *rstd, const float *w, size_t N, int C,
                      int layernorm);
void gpt_swiglu_ref_fwd(float *h, const float *g, const float *u, size_t n);
void gpt_swiglu_ref_bwd(float *dg, float *du, const float *dh, const float *g, const float *u,
                        size_t n);
void gpt_gelu_bias_ref_fwd(float *y, float *pre, const float *x, const float *b, size_t N, int F);
void gpt_gelu_bias_ref_bwd(float *dpre, float *db, const float *dy, const float *pre, size_t N,
                           int F);
void gpt_ce_ref_fwd(const float *logits, const int32_t *tgt, size_t n, int V, float *rowloss,
                    float *lse);
void gpt_ce_ref_bwd(float *dlogits, const float *logits, const int32_t *tgt, const float *lse,
                    size_t n, int V, float scale);

#ifdef __cplusplus
}
#endif

#endif
