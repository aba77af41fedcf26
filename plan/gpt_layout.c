/* plan/gpt_layout.c — ferry-gpt's CUDA model's device block laid out
 * (gpt_layout.h): the buffers at 256-aligned offsets, none overlapping,
 * and the split into activations kept for backward and workspace.
 */
#include "plan/gpt_layout.h"

#include <string.h>

#define ALIGN256(x) (((x) + (size_t)255) & ~(size_t)255)

static const char *k_buf_names[FERRY_GL_COUNT] = {
    "xres",  "nf",  "meanf", "rstdf", "lseh", "blocks",   "logits",   "dlogits", "rowloss",
    "loss",  "tok", "tgt",   "rope_cos", "rope_sin", "dres", "dn", "abf", "dao", "dqkv",
    "dh",    "dg",  "du",    "delta", "partial", "wbf", "blas"};
static const char *k_act_names[FERRY_GA_COUNT] = {"n1",   "mean1", "rstd1", "qkv", "lse",
                                                  "ao",   "xmid",  "n2",    "mean2", "rstd2",
                                                  "h1",   "h2",    "h3"};

const char *ferry_gpt_layout_buf_name(int i) {
  return i >= 0 && i < FERRY_GL_COUNT ? k_buf_names[i] : "?";
}
const char *ferry_gpt_layout_act_name(int i) {
  return i >= 0 && i < FERRY_GA_COUNT ? k_act_names[i] : "?";
}

/* Places `bytes` at *at (256-aligned) and advances *at. */
static ferry_gpt_span place(size_t *at, size_t bytes) {
  ferry_gpt_span s = {*at, bytes};
  *at = ALIGN256(*at + bytes);
  return s;
}

static size_t max3(size_t a, size_t b, size_t c) {
  size_t m = a > b ? a : b;
  return m > c ? m : c;
}

/* One block's saved activations for R rows of ns sequences. */
static size_t layout_block(const ferry_gpt_dims *d, size_t R, size_t ns, size_t qkvw,
                           ferry_gpt_span act[FERRY_GA_COUNT]) {
  size_t C = (size_t)d->C, F = (size_t)d->F, f4 = 4, b2 = 2, at = 0;
  int gpt2 = !d->llama;
  act[FERRY_GA_N1] = place(&at, R * C * b2);
  act[FERRY_GA_MEAN1] = place(&at, gpt2 ? R * f4 : 0);
  act[FERRY_GA_RSTD1] = place(&at, R * f4);
  act[FERRY_GA_QKV] = place(&at, R * qkvw * b2);
  act[FERRY_GA_LSE] = place(&at, ns * (size_t)d->H * (size_t)d->T * f4);
  act[FERRY_GA_AO] = place(&at, R * C * b2);
  act[FERRY_GA_XMID] = place(&at, R * C * b2);
  act[FERRY_GA_N2] = place(&at, R * C * b2);
  act[FERRY_GA_MEAN2] = place(&at, gpt2 ? R * f4 : 0);
  act[FERRY_GA_RSTD2] = place(&at, R * f4);
  act[FERRY_GA_H1] = place(&at, R * F * b2);
  act[FERRY_GA_H2] = place(&at, R * F * b2);
  act[FERRY_GA_H3] = place(&at, d->llama ? R * F * b2 : 0);
  return at;
}

size_t ferry_gpt_layout_make(const ferry_gpt_dims *d, ferry_gpt_layout *out) {
  memset(out, 0, sizeof *out);
  if (d->B < 1 || d->T < 1 || d->chunk_tokens < 0 || d->loss_chunk_tokens < 0 || d->C < 1 || d->F < 1 || d->L < 1 || d->vocab < 1 || d->H < 1 ||
      d->KV < 1 || d->H % d->KV || d->C % d->H || (d->llama && (d->C / d->H) % 2))
    return 0;
  size_t B = (size_t)d->B, T = (size_t)d->T, BT = B * T, C = (size_t)d->C;
  size_t F = (size_t)d->F, V = (size_t)d->vocab, hd = C / (size_t)d->H, L = (size_t)d->L;
  size_t H = (size_t)d->H, f4 = 4, b2 = 2;
  size_t qkvw = C + 2 * (size_t)d->KV * hd;
  size_t target = d->chunk_tokens > 0 ? (size_t)d->chunk_tokens : FERRY_GPT_CHUNK_TOKENS;
  size_t cb = (target + T - 1) / T;
  if (cb > B) cb = B;
  size_t R = cb * T; /* rows of one chunk */
  size_t ce = FERRY_GPT_CE_LOGIT_BYTES / (V * f4) / 64 * 64;
  if (ce < 64) ce = 64;
  if (d->loss_chunk_tokens > 0) ce = (size_t)d->loss_chunk_tokens;
  if (ce > BT) ce = BT;
  out->qkvw = (long)qkvw;
  out->chunk_b = (long)cb;
  out->ce_rows = (long)ce;
  out->n_acts = d->checkpoint ? 1 : (int)L;
  out->act_rows = (long)(d->checkpoint ? R : BT);
  out->block_bytes = layout_block(d, (size_t)out->act_rows, d->checkpoint ? cb : B, qkvw, out->act);
  out->abf_elems = R * (qkvw > C ? qkvw : C);
  out->wbf_elems = d->weights_bf16 ? 0 : d->largest_matrix;
  out->partial_floats = (size_t)FERRY_GPT_PARTIAL_ROWS * 2 * max3(C, F, qkvw);
  ferry_gpt_span *b = out->buf;
  size_t at = 0;
  b[FERRY_GL_XRES] = place(&at, (L + 1) * BT * C * b2);
  b[FERRY_GL_NF] = place(&at, BT * C * b2);
  b[FERRY_GL_MEANF] = place(&at, d->llama ? 0 : BT * f4);
  b[FERRY_GL_RSTDF] = place(&at, BT * f4);
  b[FERRY_GL_LSEH] = place(&at, BT * f4);
  b[FERRY_GL_BLOCKS] = place(&at, (size_t)out->n_acts * out->block_bytes);
  out->activations = at;
  b[FERRY_GL_LOGITS] = place(&at, ce * V * f4);
  b[FERRY_GL_DLOGITS] = place(&at, ce * V * b2);
  b[FERRY_GL_ROWLOSS] = place(&at, BT * f4);
  b[FERRY_GL_LOSS] = place(&at, sizeof(double));
  b[FERRY_GL_TOK] = place(&at, BT * 4);
  b[FERRY_GL_TGT] = place(&at, BT * 4);
  b[FERRY_GL_ROPE_COS] = place(&at, d->llama ? T * (hd / 2) * f4 : 0);
  b[FERRY_GL_ROPE_SIN] = place(&at, d->llama ? T * (hd / 2) * f4 : 0);
  b[FERRY_GL_DRES] = place(&at, BT * C * f4);
  b[FERRY_GL_DN] = place(&at, (R > ce ? R : ce) * C * f4); /* also d(final norm) per loss chunk */
  b[FERRY_GL_ABF] = place(&at, out->abf_elems * b2);
  b[FERRY_GL_DAO] = place(&at, R * C * b2);
  b[FERRY_GL_DQKV] = place(&at, R * qkvw * f4);
  b[FERRY_GL_DH] = place(&at, R * F * f4);
  b[FERRY_GL_DG] = place(&at, R * F * b2);
  b[FERRY_GL_DU] = place(&at, d->llama ? R * F * b2 : 0);
  b[FERRY_GL_DELTA] = place(&at, cb * H * T * f4);
  b[FERRY_GL_PARTIAL] = place(&at, out->partial_floats * f4);
  b[FERRY_GL_WBF] = place(&at, out->wbf_elems * b2);
  b[FERRY_GL_BLAS] = place(&at, FERRY_GPT_BLAS_WORKSPACE);
  out->bytes = at;
  out->workspace = at - out->activations;
  return at;
}
