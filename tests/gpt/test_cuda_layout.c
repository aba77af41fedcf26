/* tests/gpt/test_cuda_layout.c — the CUDA model's device memory layout
 * (examples/gpt/cuda_layout.c), which runs here without a GPU: for every
 * preset, batch and sequence below, with and without checkpointing and for
 * bf16 and fp32 weights, the buffers are 256-aligned, do not overlap, lie
 * within the block and hold at least what the model writes into them (sizes
 * computed here independently); checkpointing shrinks the block; and the
 * planner's activation + workspace lines for the same model, batch,
 * sequence and checkpointing (bf16, what `ferry plan` prints) are at least
 * the block's bytes, so a budget planned with `ferry plan` holds it.
 */
#include "gpt_cuda.h"
#include "gpt_kernels.h"

#include "ferry.h"
#include "plan/plan.h"
#include "tests/test.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  size_t off, bytes;
  const char *name;
} span;

static int by_off(const void *a, const void *b) {
  const span *x = a, *y = b;
  return x->off < y->off ? -1 : x->off > y->off;
}

/* Non-empty spans: 256-aligned, disjoint, within [0, end). */
static int check_spans(span *v, int n, size_t end, const char *what) {
  int bad = 0, k = 0;
  for (int i = 0; i < n; i++)
    if (v[i].bytes) v[k++] = v[i];
  qsort(v, (size_t)k, sizeof *v, by_off);
  for (int i = 0; i < k; i++) {
    if (v[i].off % 256) fprintf(stderr, "%s: %s at %zu is not 256-aligned\n", what, v[i].name, v[i].off), bad++;
    if (v[i].off + v[i].bytes > end) fprintf(stderr, "%s: %s ends past %zu\n", what, v[i].name, end), bad++;
    if (i && v[i - 1].off + v[i - 1].bytes > v[i].off)
      fprintf(stderr, "%s: %s overlaps %s\n", what, v[i - 1].name, v[i].name), bad++;
  }
  return bad;
}

/* The bytes each buffer must hold, from the model's shapes, computed here
 * independently of plan/gpt_layout.c: R rows per chunk of chunk_b
 * sequences, activations of R rows (checkpointing) or all BT. */
static void needed(const gpt_schema *s, const gpt_run_config *rc, ferry_dtype wdt,
                   const gpt_cuda_layout_t *lay, size_t buf[FERRY_GL_COUNT],
                   size_t act[FERRY_GA_COUNT]) {
  const gpt_config *c = &s->cfg;
  size_t B = (size_t)rc->batch, T = (size_t)rc->seq, BT = B * T, C = (size_t)c->d_model;
  size_t F = (size_t)c->d_ff, V = (size_t)c->vocab, H = (size_t)c->n_head, hd = C / H;
  size_t L = (size_t)c->n_layer, q = C + 2 * (size_t)c->n_kv_head * hd;
  size_t cb = (size_t)lay->chunk_b, R = cb * T, A = rc->checkpoint ? R : BT;
  size_t ns = rc->checkpoint ? cb : B, ce = (size_t)lay->ce_rows;
  int ll = c->family == GPT_LLAMA;
  size_t big = 0;
  for (int i = 0; i < s->n_params; i++)
    if (s->params[i].ndim == 2 && s->params[i].numel > big) big = s->params[i].numel;
  size_t wide = C > q ? C : q, red = wide > F ? wide : F;
  size_t b[FERRY_GL_COUNT] = {
      [FERRY_GL_XRES] = (L + 1) * BT * C * 2, [FERRY_GL_NF] = BT * C * 2,
      [FERRY_GL_MEANF] = ll ? 0 : BT * 4, [FERRY_GL_RSTDF] = BT * 4, [FERRY_GL_LSEH] = BT * 4,
      [FERRY_GL_BLOCKS] = 0, [FERRY_GL_LOGITS] = ce * V * 4, [FERRY_GL_DLOGITS] = ce * V * 2,
      [FERRY_GL_ROWLOSS] = BT * 4, [FERRY_GL_LOSS] = 8, [FERRY_GL_TOK] = BT * 4,
      [FERRY_GL_TGT] = BT * 4, [FERRY_GL_ROPE_COS] = ll ? T * hd / 2 * 4 : 0,
      [FERRY_GL_ROPE_SIN] = ll ? T * hd / 2 * 4 : 0, [FERRY_GL_DRES] = BT * C * 4,
      [FERRY_GL_DN] = (R > ce ? R : ce) * C * 4, [FERRY_GL_ABF] = R * wide * 2, [FERRY_GL_DAO] = R * C * 2,
      [FERRY_GL_DQKV] = R * q * 4, [FERRY_GL_DH] = R * F * 4, [FERRY_GL_DG] = R * F * 2,
      [FERRY_GL_DU] = ll ? R * F * 2 : 0, [FERRY_GL_DELTA] = cb * H * T * 4,
      [FERRY_GL_PARTIAL] = (size_t)FERRY_GPT_PARTIAL_ROWS * 2 * red * 4,
      [FERRY_GL_WBF] = wdt == FERRY_DT_BF16 ? 0 : big * 2,
      [FERRY_GL_BLAS] = FERRY_GPT_BLAS_WORKSPACE};
  size_t a[FERRY_GA_COUNT] = {
      [FERRY_GA_N1] = A * C * 2, [FERRY_GA_MEAN1] = ll ? 0 : A * 4, [FERRY_GA_RSTD1] = A * 4,
      [FERRY_GA_QKV] = A * q * 2, [FERRY_GA_LSE] = ns * H * T * 4, [FERRY_GA_AO] = A * C * 2,
      [FERRY_GA_XMID] = A * C * 2, [FERRY_GA_N2] = A * C * 2, [FERRY_GA_MEAN2] = ll ? 0 : A * 4,
      [FERRY_GA_RSTD2] = A * 4, [FERRY_GA_H1] = A * F * 2, [FERRY_GA_H2] = A * F * 2,
      [FERRY_GA_H3] = ll ? A * F * 2 : 0};
  memcpy(buf, b, sizeof b);
  memcpy(act, a, sizeof a);
}

/* One layout checked on its own; its bytes. */
static size_t check_layout(const gpt_schema *s, const gpt_run_config *rc, ferry_dtype wdt,
                           const char *name) {
  gpt_cuda_layout_t lay;
  size_t bytes = gpt_cuda_layout(s, rc, wdt, &lay);
  char what[160];
  snprintf(what, sizeof what, "%s b%d s%d ck%d %s", name, rc->batch, rc->seq, rc->checkpoint,
           wdt == FERRY_DT_BF16 ? "bf16" : "fp32");
  EXPECT(bytes > 0 && bytes == lay.bytes);
  size_t nb[FERRY_GL_COUNT], na[FERRY_GA_COUNT];
  needed(s, rc, wdt, &lay, nb, na);
  span v[FERRY_GL_COUNT + FERRY_GA_COUNT];
  /* chunks: whole sequences, at most the batch, at least FERRY_GPT_CHUNK_TOKENS
   * tokens when the batch has them; the loss's chunk within the tokens */
  EXPECT(lay.chunk_b >= 1 && lay.chunk_b <= rc->batch);
  EXPECT(lay.chunk_b == rc->batch ||
         lay.chunk_b * rc->seq >= (rc->chunk_tokens ? rc->chunk_tokens : FERRY_GPT_CHUNK_TOKENS));
  EXPECT(!rc->loss_chunk_tokens ||
         lay.ce_rows == (rc->loss_chunk_tokens < (long)rc->batch * rc->seq
                             ? rc->loss_chunk_tokens : (long)rc->batch * rc->seq));
  EXPECT(lay.ce_rows >= 1 && lay.ce_rows <= (long)rc->batch * rc->seq);
  /* no buffer grows with T x T: at twice the sequence, none more than doubles */
  if (2 * rc->seq <= s->cfg.max_seq) {
    gpt_run_config r2 = *rc;
    r2.seq *= 2;
    gpt_cuda_layout_t l2;
    REQUIRE(gpt_cuda_layout(s, &r2, wdt, &l2) > 0);
    for (int i = 0; i < FERRY_GA_COUNT; i++) EXPECT(l2.act[i].bytes <= 2 * lay.act[i].bytes);
    for (int i = 0; i < FERRY_GL_COUNT; i++)
      if (i != FERRY_GL_BLAS && i != FERRY_GL_WBF && i != FERRY_GL_PARTIAL &&
          i != FERRY_GL_LOSS)
        EXPECT(l2.buf[i].bytes <= 2 * lay.buf[i].bytes);
  }
  int bad = 0;
  for (int i = 0; i < FERRY_GL_COUNT; i++) {
    v[i] = (span){lay.buf[i].off, lay.buf[i].bytes, ferry_gpt_layout_buf_name(i)};
    if (lay.buf[i].bytes < nb[i])
      fprintf(stderr, "%s: %s has %zu bytes, needs %zu\n", what, v[i].name, lay.buf[i].bytes, nb[i]), bad++;
  }
  bad += check_spans(v, FERRY_GL_COUNT, bytes, what);
  for (int i = 0; i < FERRY_GA_COUNT; i++) {
    v[i] = (span){lay.act[i].off, lay.act[i].bytes, ferry_gpt_layout_act_name(i)};
    if (lay.act[i].bytes < na[i])
      fprintf(stderr, "%s: %s has %zu bytes, needs %zu\n", what, v[i].name, lay.act[i].bytes, na[i]), bad++;
  }
  bad += check_spans(v, FERRY_GA_COUNT, lay.block_bytes, what);
  EXPECT_EQ_INT(lay.n_acts, rc->checkpoint ? 1 : s->cfg.n_layer);
  EXPECT(lay.buf[FERRY_GL_BLOCKS].bytes >= (size_t)lay.n_acts * lay.block_bytes);
  EXPECT(lay.block_bytes % 256 == 0);
  EXPECT(wdt != FERRY_DT_BF16 || lay.wbf_elems == 0);
  /* the column reductions' workspace holds what the fused kernels ask for
   * at the widest reduced width (norm C, GPT-2's c_attn bias 3C, fc F) */
  {
    size_t rows = (size_t)lay.chunk_b * rc->seq, ce = (size_t)lay.ce_rows;
    int wide = s->cfg.d_ff > lay.qkvw ? s->cfg.d_ff : (int)lay.qkvw;
    wide = wide > s->cfg.d_model ? wide : s->cfg.d_model;
    EXPECT(lay.partial_floats >= gpt_norm_bwd_partial_floats(rows > ce ? rows : ce, wide));
    EXPECT(lay.buf[FERRY_GL_PARTIAL].bytes >= lay.partial_floats * sizeof(float));
  }
  /* activations then workspace, the split `ferry plan` prints */
  EXPECT(lay.activations == lay.buf[FERRY_GL_FIRST_WORKSPACE].off);
  EXPECT(lay.activations + lay.workspace == lay.bytes);
  if (bad) test_failures++;
  return bytes;
}

/* The planner's model for a gpt_config. */
static ferry_plan_model plan_model(const gpt_config *c, const char *name) {
  ferry_plan_model m;
  memset(&m, 0, sizeof m);
  snprintf(m.name, sizeof m.name, "%s", name);
  m.arch = c->family == GPT_GPT2 ? FERRY_ARCH_GPT2 : FERRY_ARCH_LLAMA;
  m.vocab = c->vocab, m.hidden = c->d_model, m.ffn = c->d_ff, m.layers = c->n_layer;
  m.heads = c->n_head, m.kv_heads = c->n_kv_head, m.head_dim = c->d_model / c->n_head;
  m.positions = c->max_seq, m.tied = c->tied;
  return m;
}

/* The plan's activations and workspace on the GPU (bf16, flash attention,
 * the same for every placement) are the layout's, plus the runtime's own
 * allowance in the workspace: `ferry plan` prints the model's real block. */
static void check_plan(const gpt_schema *s, const gpt_run_config *rc, const char *name) {
  ferry_plan_input in = ferry_plan_input_default();
  in.model = plan_model(&s->cfg, name);
  in.batch = rc->batch, in.seq = rc->seq, in.precision = FERRY_PREC_BF16;
  in.checkpointing = rc->checkpoint, in.flash_attention = 1;
  ferry_plan_result r;
  char why[256];
  REQUIRE(ferry_plan_compute(&in, &r, why, sizeof why) == 0);
  uint64_t act = r.cand[0].bytes[FERRY_PLAN_GPU][FERRY_FAM_ACT];
  uint64_t ws = r.cand[0].bytes[FERRY_PLAN_GPU][FERRY_FAM_WORKSPACE];
  for (int p = 1; p < FERRY_PLACEMENTS; p++)
    EXPECT(r.cand[p].bytes[FERRY_PLAN_GPU][FERRY_FAM_ACT] == act);
  gpt_cuda_layout_t lay;
  REQUIRE(gpt_cuda_layout(s, rc, FERRY_DT_BF16, &lay) > 0);
  printf("%-12s batch %d seq %4d ckpt %d: activations %9.1f MB, workspace %8.1f MB (plan %8.1f)\n",
         name, rc->batch, rc->seq, rc->checkpoint, lay.activations / 1e6, lay.workspace / 1e6,
         ws / 1e6);
  if (act != lay.activations || ws != lay.workspace + FERRY_PLAN_CUDA_RUNTIME) {
    fprintf(stderr, "%s: the plan's activations %llu / workspace %llu are not the layout's "
            "%zu / %zu + the runtime's\n", name, (unsigned long long)act, (unsigned long long)ws,
            lay.activations, lay.workspace);
    test_failures++;
  }
}

int main(void) {
  static const char *presets[] = {"tiny", "small", "gpt2", "llama-tiny", "llama-small"};
  /* llama-2-13b's shape (the preset once ferry-gpt has it): one block's
   * activations and the workspace at batch 8 x seq 2048 with checkpointing,
   * the "at most 4 GB" */
  {
    gpt_config c;
    REQUIRE(gpt_config_preset("llama-small", &c) == 0);
    c.vocab = 32000, c.d_model = 5120, c.d_ff = 13824, c.n_layer = 40, c.n_head = 40;
    c.n_kv_head = 40, c.max_seq = 4096;
    gpt_schema s;
    REQUIRE(gpt_schema_build(&c, &s) == 0);
    gpt_run_config rc = {.batch = 8, .seq = 2048, .checkpoint = 1};
    gpt_cuda_layout_t lay;
    REQUIRE(gpt_cuda_layout(&s, &rc, FERRY_DT_BF16, &lay) > 0);
    size_t one = lay.bytes - lay.buf[FERRY_GL_XRES].bytes;
    printf("llama-2-13b batch 8 seq 2048 ckpt: block inputs %.2f GB, one block's activations "
           "and workspace %.2f GB\n", lay.buf[FERRY_GL_XRES].bytes / 1e9, one / 1e9);
    EXPECT(one <= 4000000000u);
    gpt_schema_free(&s);
  }
  static const int shapes[][2] = {{2, 16}, {4, 128}, {8, 256}, {1, 1}, {8, 1024}};
  for (size_t pi = 0; pi < sizeof presets / sizeof *presets; pi++) {
    gpt_config c;
    gpt_schema s;
    REQUIRE(gpt_config_preset(presets[pi], &c) == 0);
    REQUIRE(gpt_schema_build(&c, &s) == 0);
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
      if (shapes[k][1] > c.max_seq) continue;
      size_t full = 0, ck = 0;
      for (int ckpt = 0; ckpt < 2; ckpt++) {
        gpt_run_config rc = {.batch = shapes[k][0], .seq = shapes[k][1], .checkpoint = ckpt};
        gpt_run_config small = rc;
        small.chunk_tokens = rc.seq, small.loss_chunk_tokens = 7; /* one sequence, ragged loss */
        check_layout(&s, &small, FERRY_DT_BF16, presets[pi]);
        size_t b16 = check_layout(&s, &rc, FERRY_DT_BF16, presets[pi]);
        size_t b32 = check_layout(&s, &rc, FERRY_DT_F32, presets[pi]);
        EXPECT(b32 > b16);
        check_plan(&s, &rc, presets[pi]);
        *(ckpt ? &ck : &full) = b16;
      }
      EXPECT(ck < full);
    }
    gpt_run_config bad = {.batch = 1, .seq = c.max_seq + 1, .checkpoint = 0};
    gpt_cuda_layout_t lay;
    EXPECT(gpt_cuda_layout(&s, &bad, FERRY_DT_BF16, &lay) == 0);
    gpt_schema_free(&s);
  }
  return test_finish("gpt.cuda_layout");
}
