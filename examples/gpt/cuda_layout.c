/* examples/gpt/cuda_layout.c — the CUDA model's device memory layout for a
 * schema and a run: the model's shape handed to plan/gpt_layout.c, the
 * arithmetic `ferry plan` uses, so the engine reserves, the model places
 * and the plan prints the same bytes. Plain C, tested without a GPU
 * (tests/gpt/test_cuda_layout.c).
 */
#include "gpt_cuda.h"

#include <string.h>

/* The largest matrix of the schema (the weight scratch). */
static size_t largest_matrix(const gpt_schema *s) {
  size_t most = 0;
  for (int i = 0; i < s->n_params; i++)
    if (s->params[i].ndim == 2 && s->params[i].numel > most) most = s->params[i].numel;
  return most;
}

ferry_gpt_dims gpt_cuda_dims(const gpt_schema *s, const gpt_run_config *rc, ferry_dtype wdt) {
  const gpt_config *c = &s->cfg;
  ferry_gpt_dims d;
  memset(&d, 0, sizeof d);
  d.llama = c->family == GPT_LLAMA;
  d.vocab = c->vocab, d.C = c->d_model, d.F = c->d_ff, d.L = c->n_layer;
  d.H = c->n_head, d.KV = c->n_kv_head, d.B = rc->batch, d.T = rc->seq;
  d.checkpoint = rc->checkpoint != 0;
  d.weights_bf16 = wdt == FERRY_DT_BF16;
  d.largest_matrix = largest_matrix(s);
  d.chunk_tokens = rc->chunk_tokens, d.loss_chunk_tokens = rc->loss_chunk_tokens;
  return d;
}

size_t gpt_cuda_layout(const gpt_schema *s, const gpt_run_config *rc, ferry_dtype wdt,
                       gpt_cuda_layout_t *out) {
  memset(out, 0, sizeof *out);
  if (rc->seq > s->cfg.max_seq) return 0;
  ferry_gpt_dims d = gpt_cuda_dims(s, rc, wdt);
  return ferry_gpt_layout_make(&d, out);
}
