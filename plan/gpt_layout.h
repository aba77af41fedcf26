/* plan/gpt_layout.h — the device memory of ferry-gpt's CUDA model, laid
 * out: every buffer of activations and workspace at its offset in the one
 * block the model is given, from the model's shape and the run's batch,
 * sequence and checkpointing. The model (examples/gpt) places its buffers
 * with it and `ferry plan` prints its activation and workspace lines from
 * it, so the plan and the device agree byte for byte. Pure arithmetic.
 *
 * The model runs each block's forward and backward over chunks of
 * `chunk_b` sequences of the batch (every layer is separable by sequence),
 * so the workspace holds one chunk, never the whole batch. Activations are
 * bf16; norm statistics, the attention's log-sum-exp and the loss are
 * fp32. Attention is flash-style: no T x T buffer anywhere. The head's
 * logits exist one chunk of `ce_rows` tokens at a time. With
 * checkpointing the block inputs (bf16) are all that is kept per block,
 * and one chunk's activations are recomputed in backward.
 */
#ifndef FERRY_PLAN_GPT_LAYOUT_H
#define FERRY_PLAN_GPT_LAYOUT_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int llama;              /* 1: RMSNorm, RoPE, SwiGLU, grouped-query; 0: GPT-2 */
  long vocab, C, F, L, H, KV; /* vocabulary, width, MLP width, layers, heads, kv heads */
  long B, T;              /* sequences per micro-batch, sequence length */
  int checkpoint;         /* keep block inputs only, recompute one chunk in backward */
  int weights_bf16;       /* weights read as bf16: no weight scratch */
  size_t largest_matrix;  /* elements of the largest weight matrix */
  long chunk_tokens;      /* 0: FERRY_GPT_CHUNK_TOKENS; else the chunk target (tests) */
  long loss_chunk_tokens; /* 0: from FERRY_GPT_CE_LOGIT_BYTES; else tokens per loss chunk */
} ferry_gpt_dims;

/* Tokens per chunk of a block's forward / backward the model aims for
 * (GEMMs of at least this many rows), and the fp32 logits of one chunk of
 * the loss at most (bytes). */
#define FERRY_GPT_CHUNK_TOKENS 8192
#define FERRY_GPT_CE_LOGIT_BYTES ((size_t)128 << 20)
/* Rows of per-block partial sums in the column reductions (norm weight
 * and bias grads): the `partial` workspace holds this many rows of two
 * vectors of the widest reduced width. */
#define FERRY_GPT_PARTIAL_ROWS 256
/* The cuBLAS / cuBLASLt workspace, part of the block. */
#define FERRY_GPT_BLAS_WORKSPACE ((size_t)32 << 20)

enum {
  /* kept for backward (the plan's activations) */
  FERRY_GL_XRES = 0, /* (L+1) x BT x C bf16: block inputs, then the last block's output */
  FERRY_GL_NF,       /* BT x C bf16: the final norm's output */
  FERRY_GL_MEANF,    /* BT fp32 */
  FERRY_GL_RSTDF,    /* BT fp32 */
  FERRY_GL_LSEH,     /* BT fp32: the loss's log-sum-exp per token */
  FERRY_GL_BLOCKS,   /* n_acts x block_bytes: the blocks' saved activations */
  /* workspace */
  FERRY_GL_LOGITS,   /* ce_rows x V fp32: one chunk's logits */
  FERRY_GL_DLOGITS,  /* ce_rows x V bf16: their grads, a GEMM operand */
  FERRY_GL_ROWLOSS,  /* BT fp32 */
  FERRY_GL_LOSS,     /* 1 double: the loss sum since the last read */
  FERRY_GL_TOK,      /* BT int32 */
  FERRY_GL_TGT,      /* BT int32 */
  FERRY_GL_ROPE_COS, /* T x hd/2 fp32 (Llama; 0 bytes for GPT-2) */
  FERRY_GL_ROPE_SIN,
  FERRY_GL_DRES,     /* BT x C fp32: d(residual) */
  FERRY_GL_DN,       /* max(R, ce_rows) x C fp32: d(norm output); forward: projection outputs */
  FERRY_GL_ABF,      /* R x max(C, qkvw) bf16: fp32 grads rounded as GEMM operands */
  FERRY_GL_DAO,      /* R x C bf16: d(attention output) */
  FERRY_GL_DQKV,     /* R x qkvw fp32: d(q k v); forward: the q k v GEMM output */
  FERRY_GL_DH,       /* R x F fp32: d(MLP hidden); forward (GPT-2): fc output */
  FERRY_GL_DG,       /* R x F bf16: d(gate) / GPT-2 d(fc + bias) */
  FERRY_GL_DU,       /* R x F bf16: d(up) (0 bytes for GPT-2) */
  FERRY_GL_DELTA,    /* chunk_b x H x T fp32: attention backward's rowsum(dO o) */
  FERRY_GL_PARTIAL,  /* partial_floats fp32: column reductions */
  FERRY_GL_WBF,      /* the largest matrix, bf16: fp32 / fp16 weights rounded */
  FERRY_GL_BLAS,     /* the cuBLAS workspace */
  FERRY_GL_COUNT
};
#define FERRY_GL_FIRST_WORKSPACE FERRY_GL_LOGITS

enum {
  FERRY_GA_N1 = 0, /* bf16 x C */
  FERRY_GA_MEAN1,  /* fp32 (GPT-2) */
  FERRY_GA_RSTD1,  /* fp32 */
  FERRY_GA_QKV,    /* bf16 x qkvw: rows [q k v], q and k rotated (Llama) */
  FERRY_GA_LSE,    /* fp32 x H per token: attention's log-sum-exp [b][h][t] */
  FERRY_GA_AO,     /* bf16 x C: attention output */
  FERRY_GA_XMID,   /* bf16 x C: residual after attention */
  FERRY_GA_N2,     /* bf16 x C */
  FERRY_GA_MEAN2,  /* fp32 (GPT-2) */
  FERRY_GA_RSTD2,  /* fp32 */
  FERRY_GA_H1,     /* bf16 x F: GPT-2 fc + bias (GELU's input); Llama gate */
  FERRY_GA_H2,     /* bf16 x F: GPT-2 gelu(fc + bias); Llama up */
  FERRY_GA_H3,     /* bf16 x F: Llama silu(gate) * up (0 bytes for GPT-2) */
  FERRY_GA_COUNT
};

typedef struct {
  size_t off, bytes;
} ferry_gpt_span;

typedef struct {
  ferry_gpt_span buf[FERRY_GL_COUNT]; /* offsets from the block's base */
  ferry_gpt_span act[FERRY_GA_COUNT]; /* offsets within one block's activations */
  long qkvw;             /* C + 2 KV hd */
  long chunk_b;          /* sequences per chunk of a block's pass */
  long act_rows;         /* rows each block's activations hold: BT, or chunk_b T */
  long ce_rows;          /* tokens per chunk of the loss */
  int n_acts;            /* blocks whose activations are kept: L, or 1 with checkpointing */
  size_t block_bytes;    /* one block's activations (256-aligned) */
  size_t abf_elems, wbf_elems, partial_floats;
  size_t activations;    /* bytes kept for backward: buffers before FERRY_GL_FIRST_WORKSPACE */
  size_t workspace;      /* the rest */
  size_t bytes;          /* the whole block */
} ferry_gpt_layout;

/* The layout for d; returns out->bytes, 0 when d is out of range (no
 * batch, no heads, KV not dividing H, ...). */
size_t ferry_gpt_layout_make(const ferry_gpt_dims *d, ferry_gpt_layout *out);
/* "xres", "n1", ...: the name of buffer i / activation i. */
const char *ferry_gpt_layout_buf_name(int i);
const char *ferry_gpt_layout_act_name(int i);

#ifdef __cplusplus
}
#endif

#endif
