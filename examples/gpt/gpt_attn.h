/* examples/gpt/gpt_attn.h — causal attention without the T x T matrix:
 * the contract of the CUDA flash kernels (attention_cuda.cu) and of their
 * CPU references (attention_ref.c: a naive one that materializes the
 * scores, and a tiled one with online softmax in the CUDA kernels' tile
 * order). Grouped-query attention is native: query head h reads kv head
 * h / (H / KV). q and k arrive already rotated (RoPE is applied in the
 * pass that rounds the q k v GEMM output to bf16).
 *
 * Layout: row n = b * T + t of each operand; head h's hd values start at
 * column h * hd of its row; ld* are the row strides in elements, so q, k
 * and v can be views into one packed q k v buffer. lse and delta are
 * [B][H][T] fp32. Memory beyond q, k, v, o and their grads is O(B T H).
 */
#ifndef FERRY_GPT_ATTN_H
#define FERRY_GPT_ATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int B, T, H, KV, hd;           /* H % KV == 0; hd a multiple of 16, at most 128 on CUDA */
  long ldq, ldk, ldv, ldo;       /* row strides (elements) of q, k, v, o and of their grads */
  float scale;                   /* softmax scale, 1 / sqrt(hd) */
} gpt_attn_shape;

/* The tile sizes the CUDA kernels use (rows of q, columns of k per tile);
 * the tiled CPU reference visits the same tiles in the same order. */
#define GPT_ATTN_BR 64
#define GPT_ATTN_BC 64

/* 0 when s is valid for the CUDA kernels; else -1 and why. */
int gpt_attn_check(const gpt_attn_shape *s, char *why, size_t len);

/* ---- CPU references (fp32) ----------------------------------------------------
 * fwd: o = softmax(scale q k^T, causal) v; lse[b][h][t] = log sum exp of
 * row t's scaled scores. bwd: dq, dk, dv written (=), strided like q, k, v;
 * dk, dv sum over the query heads of their group. */
void gpt_attn_naive_fwd(const gpt_attn_shape *s, const float *q, const float *k, const float *v,
                        float *o, float *lse);
void gpt_attn_naive_bwd(const gpt_attn_shape *s, const float *q, const float *k, const float *v,
                        const float *dout, float *dq, float *dk, float *dv);
void gpt_attn_ref_fwd(const gpt_attn_shape *s, const float *q, const float *k, const float *v,
                      float *o, float *lse);
/* Flash-style backward from lse: delta = rowsum(dout * o), P rebuilt per
 * tile from lse, never a T x T matrix. */
void gpt_attn_ref_bwd(const gpt_attn_shape *s, const float *q, const float *k, const float *v,
                      const float *o, const float *dout, const float *lse, float *dq, float *dk,
                      float *dv);

/* ---- CUDA (attention_cuda.cu, built where nvcc is) -----------------------------
 * q, k, v, o, dout: bf16 device memory (uint16_t bits); lse, delta, dq, dk,
 * dv: fp32 device memory. stream: a cudaStream_t (NULL: the default
 * stream). Everything is enqueued; nothing waits. 0, or -1 with the reason
 * (a CUDA error or an unsupported shape) in err. */
int gpt_attn_cuda_fwd(const gpt_attn_shape *s, const uint16_t *q, const uint16_t *k,
                      const uint16_t *v, uint16_t *o, float *lse, void *stream, char *err,
                      size_t errlen);
/* delta: B * H * T floats of workspace. dq, dk, dv written (=). */
int gpt_attn_cuda_bwd(const gpt_attn_shape *s, const uint16_t *q, const uint16_t *k,
                      const uint16_t *v, const uint16_t *o, const uint16_t *dout, const float *lse,
                      float *delta, float *dq, float *dk, float *dv, void *stream, char *err,
                      size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
