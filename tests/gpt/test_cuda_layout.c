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

/* The bytes each buffer must hold, from the model's shapes. */
static void needed(const gpt_schema *s, const gpt_run_config *rc, ferry_dtype wdt,
                   size_t buf[GCL_COUNT], size_t act[GCA_COUNT]) {
  const gpt_config *c = &s->cfg;
  size_t B = (size_t)rc->batch, T = (size_t)rc->seq, BT = B * T, C = (size_t)c->d_model;
  size_t F = (size_t)c->d_ff, V = (size_t)c->vocab, H = (size_t)c->n_head, hd = C / H;
  size_t L = (size_t)c->n_layer, q = C + 2 * (size_t)c->n_kv_head * hd;
  int ll = c->family == GPT_LLAMA;
  size_t wide = BT * C > BT * q ? BT * C : BT * q, big = 0;
  wide = wide > BT * F ? wide : BT * F;
  for (int i = 0; i < s->n_params; i++)
    if (s->params[i].ndim == 2 && s->params[i].numel > big) big = s->params[i].numel;
  size_t b[GCL_COUNT] = {
      [GCL_XRES] = (L + 1) * BT * C * 4, [GCL_NF] = BT * C * 2, [GCL_MEANF] = BT * 4,
      [GCL_RSTDF] = BT * 4, [GCL_LOGITS] = BT * V * 4, [GCL_DLOGITS] = BT * V * 2,
      [GCL_ROWLOSS] = BT * 4, [GCL_LOSS] = 8, [GCL_TOK] = BT * 4, [GCL_TGT] = BT * 4,
      [GCL_ROPE_COS] = ll ? T * hd / 2 * 4 : 0, [GCL_ROPE_SIN] = ll ? T * hd / 2 * 4 : 0,
      [GCL_DRES] = BT * C * 4, [GCL_DN] = BT * C * 4, [GCL_DAO] = BT * C * 2,
      [GCL_DQKV] = BT * q * 4, [GCL_DH1] = BT * F * 4, [GCL_DH2] = ll ? BT * F * 4 : 0,
      [GCL_SCORES] = H * T * T * 4, [GCL_DSCORES] = H * T * T * 2, [GCL_ABF] = wide * 2,
      [GCL_WBF] = wdt == FERRY_DT_BF16 ? 0 : big * 2, [GCL_DTMP] = rc->checkpoint ? BT * C * 4 : 0,
      [GCL_CUBLAS] = GPT_CUDA_CUBLAS_WORKSPACE, [GCL_BLOCKS] = 0};
  size_t a[GCA_COUNT] = {
      [GCA_N1] = BT * C * 2, [GCA_MEAN1] = BT * 4, [GCA_RSTD1] = BT * 4, [GCA_QKV] = BT * q * 2,
      [GCA_ATT] = B * H * T * T * 2, [GCA_AO] = BT * C * 2, [GCA_XMID] = BT * C * 4,
      [GCA_N2] = BT * C * 2, [GCA_MEAN2] = BT * 4, [GCA_RSTD2] = BT * 4, [GCA_H1] = BT * F * 4,
      [GCA_H2] = BT * F * (ll ? 4 : 2), [GCA_H3] = ll ? BT * F * 2 : 0};
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
  size_t nb[GCL_COUNT], na[GCA_COUNT];
  needed(s, rc, wdt, nb, na);
  span v[GCL_COUNT + GCA_COUNT];
  int bad = 0;
  for (int i = 0; i < GCL_COUNT; i++) {
    v[i] = (span){lay.buf[i].off, lay.buf[i].bytes, gpt_cuda_layout_buf_name(i)};
    if (lay.buf[i].bytes < nb[i])
      fprintf(stderr, "%s: %s has %zu bytes, needs %zu\n", what, v[i].name, lay.buf[i].bytes, nb[i]), bad++;
  }
  bad += check_spans(v, GCL_COUNT, bytes, what);
  for (int i = 0; i < GCA_COUNT; i++) {
    v[i] = (span){lay.act[i].off, lay.act[i].bytes, gpt_cuda_layout_act_name(i)};
    if (lay.act[i].bytes < na[i])
      fprintf(stderr, "%s: %s has %zu bytes, needs %zu\n", what, v[i].name, lay.act[i].bytes, na[i]), bad++;
  }
  bad += check_spans(v, GCA_COUNT, lay.block_bytes, what);
  EXPECT_EQ_INT(lay.n_acts, rc->checkpoint ? 1 : s->cfg.n_layer);
  EXPECT(lay.buf[GCL_BLOCKS].bytes >= (size_t)lay.n_acts * lay.block_bytes);
  EXPECT(lay.block_bytes % 256 == 0);
  EXPECT(wdt != FERRY_DT_BF16 || lay.wbf_elems == 0);
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

/* The plan's activations + workspace on the GPU (bf16, the same for every
 * placement) against the layout's bytes. */
static void check_plan(const gpt_schema *s, const gpt_run_config *rc, size_t bytes,
                       const char *name) {
  ferry_plan_input in = ferry_plan_input_default();
  in.model = plan_model(&s->cfg, name);
  in.batch = rc->batch, in.seq = rc->seq, in.precision = FERRY_PREC_BF16;
  in.checkpointing = rc->checkpoint, in.flash_attention = 0;
  ferry_plan_result r;
  char why[256];
  REQUIRE(ferry_plan_compute(&in, &r, why, sizeof why) == 0);
  uint64_t act = r.cand[0].bytes[FERRY_PLAN_GPU][FERRY_FAM_ACT];
  uint64_t ws = r.cand[0].bytes[FERRY_PLAN_GPU][FERRY_FAM_WORKSPACE];
  for (int p = 1; p < FERRY_PLACEMENTS; p++)
    EXPECT(r.cand[p].bytes[FERRY_PLAN_GPU][FERRY_FAM_ACT] == act);
  printf("%-12s batch %d seq %4d ckpt %d: layout %8.1f MB, plan activations + workspace %8.1f MB\n",
         name, rc->batch, rc->seq, rc->checkpoint, bytes / 1e6, (act + ws) / 1e6);
  if (act + ws < bytes) {
    fprintf(stderr, "%s: the plan's %llu bytes of activations + workspace are less than the "
            "layout's %zu\n", name, (unsigned long long)(act + ws), bytes);
    test_failures++;
  }
}

int main(void) {
  static const char *presets[] = {"tiny", "small", "gpt2", "llama-tiny", "llama-small"};
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
        size_t b16 = check_layout(&s, &rc, FERRY_DT_BF16, presets[pi]);
        size_t b32 = check_layout(&s, &rc, FERRY_DT_F32, presets[pi]);
        EXPECT(b32 > b16);
        check_plan(&s, &rc, b16, presets[pi]);
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
