/* examples/gpt/cuda_layout.c — the CUDA model's device memory layout:
 * where each activation and workspace buffer lies in the one block the
 * model is given (the engine's reserved block) or allocates. Plain C, so
 * the host computes the same bytes the engine reserves and CI checks them
 * (tests/gpt/test_cuda_layout.c) without a GPU.
 */
#include "gpt_cuda.h"

#include <string.h>

#define ALIGN256(x) (((x) + (size_t)255) & ~(size_t)255)

static const char *k_buf_names[GCL_COUNT] = {
    "xres", "nf",   "meanf", "rstdf", "logits", "dlogits", "rowloss", "loss", "tok",
    "tgt",  "rope_cos", "rope_sin", "dres", "dn", "dao", "dqkv", "dh1", "dh2", "scores",
    "dscores", "abf", "wbf", "dtmp", "cublas", "blocks"};
static const char *k_act_names[GCA_COUNT] = {"n1", "mean1", "rstd1", "qkv", "att", "ao", "xmid",
                                             "n2", "mean2", "rstd2", "h1", "h2", "h3"};

const char *gpt_cuda_layout_buf_name(int i) {
  return i >= 0 && i < GCL_COUNT ? k_buf_names[i] : "?";
}
const char *gpt_cuda_layout_act_name(int i) {
  return i >= 0 && i < GCA_COUNT ? k_act_names[i] : "?";
}

/* Places `bytes` at *at (256-aligned) and advances *at. */
static gpt_cuda_span place(size_t *at, size_t bytes) {
  gpt_cuda_span s = {*at, bytes};
  *at = ALIGN256(*at + bytes);
  return s;
}

/* One block's saved activations. */
static size_t layout_block(const gpt_config *c, size_t B, size_t T, size_t qkvw,
                           gpt_cuda_span act[GCA_COUNT]) {
  size_t BT = B * T, C = (size_t)c->d_model, F = (size_t)c->d_ff, H = (size_t)c->n_head;
  size_t f4 = sizeof(float), b2 = 2, at = 0;
  int llama = c->family == GPT_LLAMA;
  act[GCA_N1] = place(&at, BT * C * b2);
  act[GCA_MEAN1] = place(&at, BT * f4);
  act[GCA_RSTD1] = place(&at, BT * f4);
  act[GCA_QKV] = place(&at, BT * qkvw * b2);
  act[GCA_ATT] = place(&at, B * H * T * T * b2);
  act[GCA_AO] = place(&at, BT * C * b2);
  act[GCA_XMID] = place(&at, BT * C * f4);
  act[GCA_N2] = place(&at, BT * C * b2);
  act[GCA_MEAN2] = place(&at, BT * f4);
  act[GCA_RSTD2] = place(&at, BT * f4);
  act[GCA_H1] = place(&at, BT * F * f4);
  act[GCA_H2] = place(&at, BT * F * (llama ? f4 : b2));
  act[GCA_H3] = place(&at, llama ? BT * F * b2 : 0);
  return at;
}

/* The largest matrix of the schema (the weight scratch). */
static size_t largest_matrix(const gpt_schema *s) {
  size_t most = 0;
  for (int i = 0; i < s->n_params; i++)
    if (s->params[i].ndim == 2 && s->params[i].numel > most) most = s->params[i].numel;
  return most;
}

size_t gpt_cuda_layout(const gpt_schema *s, const gpt_run_config *rc, ferry_dtype wdt,
                       gpt_cuda_layout_t *out) {
  memset(out, 0, sizeof *out);
  const gpt_config *c = &s->cfg;
  if (rc->batch < 1 || rc->seq < 1 || rc->seq > c->max_seq || c->n_head < 1 || c->n_kv_head < 1)
    return 0;
  size_t B = (size_t)rc->batch, T = (size_t)rc->seq, BT = B * T, C = (size_t)c->d_model;
  size_t F = (size_t)c->d_ff, V = (size_t)c->vocab, H = (size_t)c->n_head;
  size_t hd = C / H, L = (size_t)c->n_layer, f4 = sizeof(float), b2 = 2;
  size_t qkvw = C + 2 * (size_t)c->n_kv_head * hd;
  int llama = c->family == GPT_LLAMA;
  out->qkvw = (int)qkvw;
  out->n_acts = rc->checkpoint ? 1 : (int)L;
  out->block_bytes = layout_block(c, B, T, qkvw, out->act);
  out->abf_elems = BT * C;
  if (BT * qkvw > out->abf_elems) out->abf_elems = BT * qkvw;
  if (BT * F > out->abf_elems) out->abf_elems = BT * F;
  out->wbf_elems = wdt == FERRY_DT_BF16 ? 0 : largest_matrix(s);
  gpt_cuda_span *b = out->buf;
  size_t at = 0;
  b[GCL_XRES] = place(&at, (L + 1) * BT * C * f4);
  b[GCL_NF] = place(&at, BT * C * b2);
  b[GCL_MEANF] = place(&at, BT * f4);
  b[GCL_RSTDF] = place(&at, BT * f4);
  b[GCL_LOGITS] = place(&at, BT * V * f4);
  b[GCL_DLOGITS] = place(&at, BT * V * b2);
  b[GCL_ROWLOSS] = place(&at, BT * f4);
  b[GCL_LOSS] = place(&at, sizeof(double));
  b[GCL_TOK] = place(&at, BT * sizeof(int32_t));
  b[GCL_TGT] = place(&at, BT * sizeof(int32_t));
  b[GCL_ROPE_COS] = place(&at, llama ? T * (hd / 2) * f4 : 0);
  b[GCL_ROPE_SIN] = place(&at, llama ? T * (hd / 2) * f4 : 0);
  b[GCL_DRES] = place(&at, BT * C * f4);
  b[GCL_DN] = place(&at, BT * C * f4);
  b[GCL_DAO] = place(&at, BT * C * b2);
  b[GCL_DQKV] = place(&at, BT * qkvw * f4);
  b[GCL_DH1] = place(&at, BT * F * f4);
  b[GCL_DH2] = place(&at, llama ? BT * F * f4 : 0);
  b[GCL_SCORES] = place(&at, H * T * T * f4);
  b[GCL_DSCORES] = place(&at, H * T * T * b2);
  b[GCL_ABF] = place(&at, out->abf_elems * b2);
  b[GCL_WBF] = place(&at, out->wbf_elems * b2);
  b[GCL_DTMP] = place(&at, rc->checkpoint ? BT * C * f4 : 0);
  b[GCL_CUBLAS] = place(&at, GPT_CUDA_CUBLAS_WORKSPACE);
  b[GCL_BLOCKS] = place(&at, (size_t)out->n_acts * out->block_bytes);
  out->bytes = at;
  return at;
}
