/* plan/bytes.c — the bytes of a placement: the optimizer family's bytes
 * per param (optim/'s public formulas), activations and workspace, each
 * family's bytes per tier, the fit against the budgets, the NVMe bytes per
 * step and the process's peak RSS (docs/PLANNING.md, "Bytes per family and
 * tier", "NVMe bytes per step", "Peak RSS").
 */
#include "plan/plan_impl.h"

#include "plan/footprint.h"
#include "plan/gpt_layout.h"

#include "core/pack.h"
#include "core/part.h"

#include "ferry.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* The optimizer config whose formulas (ferry_optimizer_state_bytes,
 * ferry_optimizer_bytes_per_param) the plan uses. */
static ferry_optimizer_config plan_optim_config(const ferry_plan_input *in) {
  ferry_optimizer_config o = ferry_optimizer_config_default((ferry_optim_type)in->optimizer);
  o.state_dtype = in->state_dtype ? in->state_dtype : FERRY_DT_F32;
  o.state_block = in->state_block > 0 ? (size_t)in->state_block : 256;
  o.master_dtype = in->master_dtype ? in->master_dtype : FERRY_DT_F32;
  return o;
}

int plan_bf16_master(const ferry_plan_input *in) { return in->master_dtype == FERRY_DT_BF16; }

/* Bytes of one state buffer of n elements (int8: codes rounded up to 64 and
 * one fp32 absmax per block). */
static double state_bytes(const ferry_plan_input *in, double n) {
  ferry_optimizer_config o = plan_optim_config(in);
  return (double)ferry_optimizer_state_bytes(&o, (size_t)n);
}

/* Bytes per element of one state, large tensors (the absmax share included). */
static double state_per_param(const ferry_plan_input *in) {
  return state_bytes(in, 1 << 24) / (double)(1 << 24);
}

/* The master's bytes per param in the optimizer's home: 4 (fp32); with a
 * bf16 master the params are the master, 0 (the engine keeps no master
 * tensor: the step stages the current params from their home, read back
 * from the device when they live there). */
static double master_per_param(const ferry_plan_input *in, int p) {
  (void)p;
  return plan_bf16_master(in) ? 0 : 4;
}

double ferry_plan_optim_bytes_per_param(const ferry_plan_input *in, int p) {
  return master_per_param(in, p) + ferry_plan_optimizer_states(in->optimizer) * state_per_param(in);
}

double ferry_plan_step_bytes_per_param(const ferry_plan_input *in, int p) {
  ferry_optimizer_config o = plan_optim_config(in);
  int pdt = in->precision == FERRY_PREC_FP32 ? FERRY_DT_F32
            : in->precision == FERRY_PREC_FP16 ? FERRY_DT_F16 : FERRY_DT_BF16;
  /* the gradient read: the accumulator, or the drained 16-bit grads (none) */
  int gdt = ferry_plan_grads_auto(in, p) == FERRY_PLAN_GRADS_NONE ? pdt
            : in->grad_precision == FERRY_PREC_BF16 ? FERRY_DT_BF16 : FERRY_DT_F32;
  /* the param copy written: none when the params are the master */
  double b = ferry_optimizer_bytes_per_param(&o, gdt, plan_bf16_master(in) ? FERRY_DT_NONE : pdt);
  return b < 0 ? 0 : b;
}

/* Bytes of one activation element: the compute dtype on a GPU; the CPU
 * model (--device host) computes in fp32 whatever the params' dtype. */
static double act_dtype(const ferry_plan_input *in) {
  return in->device == FERRY_PLAN_DEV_HOST || in->precision == FERRY_PREC_FP32 ? 4 : 2;
}

#define RUNTIME_WORKSPACE (256.0 * 1024 * 1024) /* cuBLAS workspace, allocator slack */

/* Activation bytes of one block kept for backward (docs/PLANNING.md). */
static double block_activations(const ferry_plan_model *m, double ab, double b, double s,
                                int flash) {
  double h = (double)m->hidden, f = (double)m->ffn, a = (double)m->heads;
  double sb = s * b;
  if (m->arch == FERRY_ARCH_GPT2) {
    /* Korthikanti et al. 2022 eq. (1), generalised to dtype size ab and ffn f:
     * LN1 in, QKV in, Q, K, V, proj in (ab sbh each), two dropout masks (1 byte
     * sbh each); LN2 in, fc1 in (ab sbh), GELU in, fc2 in (ab sbf each); scores:
     * softmax out + dropout mask + dropout out = (2 ab + 1) a s^2 b. */
    double x = sb * h * (8 * ab + 2) + sb * f * 2 * ab;
    x += flash ? 4 * a * sb : (2 * ab + 1) * a * s * s * b;
    return x;
  }
  /* Llama family (no dropout): norm1 in/out, Q and K after RoPE, V, attention
   * out, norm2 in/out, gate, up and silu(gate)*up; fp32 rstd of both norms;
   * scores: the softmax output (ab a s^2 b) or, fused, the fp32 logsumexp. */
  double q = plan_q_dim(m), kv = plan_kv_dim(m);
  double x = ab * sb * (4 * h + 2 * q + 2 * kv + 3 * f) + 8 * sb;
  x += flash ? 4 * a * sb : ab * a * s * s * b;
  return x;
}

/* ferry-gpt's CUDA model's device block for this model and batch
 * (plan/gpt_layout.c, the bytes the model places): on a GPU with fused
 * attention, for the shapes the CUDA model runs (head_dim = hidden /
 * heads). 1 when *lay holds it; 0 when the formulas below apply instead. */
static int cuda_layout(const ferry_plan_input *in, double b, ferry_gpt_layout *lay) {
  memset(lay, 0, sizeof *lay);
  const ferry_plan_model *m = &in->model;
  if (in->device != FERRY_PLAN_DEV_CUDA || !in->flash_attention) return 0;
  if (m->heads < 1 || (m->head_dim && m->head_dim * m->heads != m->hidden)) return 0;
  ferry_gpt_dims d;
  memset(&d, 0, sizeof d);
  d.llama = m->arch != FERRY_ARCH_GPT2;
  d.vocab = (long)m->vocab, d.C = (long)m->hidden, d.F = (long)m->ffn, d.L = (long)m->layers;
  d.H = (long)m->heads, d.KV = (long)(m->kv_heads ? m->kv_heads : m->heads);
  d.B = (long)b, d.T = (long)in->seq, d.checkpoint = in->checkpointing != 0;
  d.weights_bf16 = in->precision == FERRY_PREC_BF16;
  /* the schema's largest matrix: the embedding, an MLP matrix, or GPT-2's c_attn */
  size_t C = (size_t)m->hidden, most = (size_t)m->vocab * C;
  if ((size_t)m->ffn * C > most) most = (size_t)m->ffn * C;
  if (!d.llama && 3 * C * C > most) most = 3 * C * C;
  d.largest_matrix = most;
  return ferry_gpt_layout_make(&d, lay) > 0;
}

int ferry_plan_gpt_layout(const ferry_plan_input *in, ferry_gpt_layout *out) {
  return cuda_layout(in, (double)in->batch, out);
}

/* Activations on the device for the whole step: blocks (all of them, or one
 * input each plus one block recomputed), and the head: final norm in/out and
 * the logits in compute dtype plus fp32 for the loss. */
static double activation_bytes(const ferry_plan_input *in, double b) {
  const ferry_plan_model *m = &in->model;
  ferry_gpt_layout lay;
  if (cuda_layout(in, b, &lay)) return (double)lay.activations;
  double ab = act_dtype(in), s = (double)in->seq;
  double h = (double)m->hidden, L = (double)m->layers;
  double blk = block_activations(m, ab, b, s, in->flash_attention);
  double blocks = in->checkpointing ? L * ab * s * b * h + blk : L * blk;
  double head = 2 * ab * s * b * h + (double)m->vocab * s * b * (ab + 4);
  return blocks + head;
}

/* Backward scratch: gradients flowing through one block (in, out, the widest
 * intermediate twice) and, with materialized attention, the scores' grad;
 * on a GPU also the runtime's workspace (cuBLAS, allocator slack). With
 * ferry-gpt's CUDA layout: its workspace and the runtime's own memory. */
static double workspace_bytes(const ferry_plan_input *in, double b) {
  const ferry_plan_model *m = &in->model;
  ferry_gpt_layout lay;
  if (cuda_layout(in, b, &lay)) return (double)lay.workspace + (double)FERRY_PLAN_CUDA_RUNTIME;
  double ab = act_dtype(in), s = (double)in->seq;
  double h = (double)m->hidden, f = (double)m->ffn;
  double wide = f > plan_q_dim(m) + 2 * plan_kv_dim(m) ? f : plan_q_dim(m) + 2 * plan_kv_dim(m);
  double w = (in->device == FERRY_PLAN_DEV_HOST ? 0 : RUNTIME_WORKSPACE) +
             ab * s * b * (2 * h + 2 * wide);
  if (!in->flash_attention) w += ab * (double)m->heads * s * s * b;
  return w;
}

static double round_chunk(double x, double ch) { return ch > 0 ? ceil(x / ch) * ch : x; }

/* One group's chunks of a family, as the engine's layout makes them: no
 * chunk holds two groups, and a chunk is as large as the tensors packed
 * into it (at most C, unless one tensor is larger), rounded up to a page
 * for the host and NVMe tiers: x bytes plus a page for each of its
 * ⌈x / C⌉ + 1 chunks (a tensor that does not fit closes a chunk early). */
static double group_chunks(double x, double ch) {
  return ch > 0 ? x + (ceil(x / ch) + 1) * 4096 : x;
}

int ferry_plan_grads_auto(const ferry_plan_input *in, int p) {
  if (p == FERRY_PLACE_ALL_GPU) return FERRY_PLAN_GRADS_GPU;
  /* the step runs during backward: no global norm to wait for, no fp16
   * dynamic scaling (it needs the whole gradient's overflow flag), one
   * micro-batch per step, one rank */
  int eager = !(in->clip_grad_norm > 0) && in->precision != FERRY_PREC_FP16 &&
              in->grad_accumulation <= 1 &&
              /* ranks average the grads into accumulators (the engine's "auto") */
              (int64_t)in->gpus * in->nodes <= 1;
  if (eager) return FERRY_PLAN_GRADS_NONE;
  return p == FERRY_PLACE_ZERO_OFFLOAD || p == FERRY_PLACE_ZERO3_OFFLOAD ? FERRY_PLAN_GRADS_HOST
                                                                          : FERRY_PLAN_GRADS_NVME;
}

enum { LAY_PARAMS, LAY_GRADS, LAY_MASTER, LAY_OPTIM };

/* A family's chunk alignment in the engine's layout (memory/layout.c,
 * chunk_align): the NVMe store's 4 KiB when a family lives on NVMe and
 * this one passes through the host pool, else the device pool's. */
static size_t layout_align(const plan_place_ctx *c, int fam) {
  int nvme = c->ph == FERRY_PLAN_NVME || c->oh == FERRY_PLAN_NVME || c->gh == FERRY_PLAN_GRADS_NVME;
  int on_gpu = fam == LAY_PARAMS  ? c->ph == FERRY_PLAN_GPU
               : fam == LAY_GRADS ? c->gh == FERRY_PLAN_GRADS_GPU
                                  : c->oh == FERRY_PLAN_GPU;
  return nvme && !on_gpu ? 4096 : FERRY_PACK_TENSOR_ALIGN;
}

/* The engine's partition of a group between ranks (core/part.h):
 * pieces start at multiples of 64 elements, or of the int8 state block
 * (offload/engine.c, finalize). */
static size_t part_align(const ferry_plan_input *in) {
  ferry_optimizer_config o = plan_optim_config(in);
  return o.state_dtype == FERRY_DT_I8 && o.state_block > 64 ? o.state_block : 64;
}

/* The tensors of a group kind (PLAN_GROUP_*) as rank `rank` holds them:
 * whole (rank < 0), or its pieces of the engine's partition (core/part.h)
 * in len[] (0: none); *range, the rank's elements of the group. Their
 * count, 0 for a model known by its count alone. */
static int rank_tensors(const ferry_plan_input *in, const plan_place_ctx *c, int kind, int rank,
                        size_t len[PLAN_GROUP_TENSORS], size_t *range) {
  double n[PLAN_GROUP_TENSORS];
  int nt = plan_group_tensors(&in->model, kind, n);
  size_t whole[PLAN_GROUP_TENSORS], total = 0;
  for (int i = 0; i < nt; i++) total += whole[i] = len[i] = (size_t)n[i];
  *range = total;
  if (nt <= 0 || rank < 0) return nt;
  size_t N = (size_t)c->N, a = part_align(in);
  size_t lo = ferry_part_bound(whole, (size_t)nt, N, (size_t)rank, a);
  size_t hi = ferry_part_bound(whole, (size_t)nt, N, (size_t)rank + 1, a), start = 0, off;
  for (int i = 0; i < nt; i++) {
    len[i] = ferry_part_piece(lo, hi, start, whole[i], &off);
    start += whole[i];
  }
  *range = hi - lo;
  return nt;
}

/* One group's chunks of a family (kind: PLAN_GROUP_*) as the engine's
 * layout packs them (core/pack.h), in the order the engine registers the
 * tensors: per tensor the param, the grad, or the master (when there is
 * one) and each state; rank >= 0: that rank's pieces (the engine
 * registers none for an empty piece, but a one-element param at stage 3),
 * else the whole tensors. chunk[]: each chunk's bytes (NULL: not wanted,
 * else room for PLAN_GROUP_CHUNKS); *elems (NULL: not wanted), the
 * elements of the tensors. 0 when the model has no tensor list or there
 * are no chunks, where the estimates apply instead. */
enum { PLAN_GROUP_CHUNKS = 3 * PLAN_GROUP_TENSORS };
static int pack_group_chunks(const ferry_plan_input *in, const plan_place_ctx *c, int fam,
                             int kind, int rank, ferry_pack_sum *s, uint64_t *chunk,
                             double *elems) {
  size_t len[PLAN_GROUP_TENSORS], range;
  size_t b[PLAN_GROUP_CHUNKS];
  int nt = rank_tensors(in, c, kind, rank, len, &range), k = 0;
  memset(s, 0, sizeof *s);
  if (elems) *elems = 0;
  if (nt <= 0 || c->ch <= 0) return 0;
  for (int i = 0; i < nt; i++) {
    double x = (double)len[i];
    if (rank >= 0 && !len[i] && fam != LAY_PARAMS) continue; /* no piece, no tensor */
    if (rank >= 0 && !len[i]) x = 1;                         /* stage 3's stand-in */
    if (elems) *elems += x;
    if (fam == LAY_PARAMS) b[k++] = (size_t)(x * c->pb);
    else if (fam == LAY_GRADS) b[k++] = (size_t)(x * c->gb);
    else if (c->mb > 0) b[k++] = (size_t)(x * c->mb);
    for (int j = 0; fam == LAY_OPTIM && j < c->k; j++) b[k++] = (size_t)state_bytes(in, x);
  }
  ferry_pack_group(b, (size_t)k, (size_t)c->ch, layout_align(c, fam), s, chunk);
  return 1;
}

/* A family packed over the model's groups (the embedding, each block, the
 * head) as rank `rank` holds it (< 0: whole), summed; *gmax, the bytes of
 * the group with the most; *elems, the elements. 0 when pack_group_chunks
 * does not apply. */
static int pack_rank(const ferry_plan_input *in, const plan_place_ctx *c, int fam, int rank,
                     ferry_pack_sum *all, double *gmax, double *elems) {
  memset(all, 0, sizeof *all);
  *gmax = *elems = 0;
  for (int kind = PLAN_GROUP_EMBED; kind <= PLAN_GROUP_HEAD; kind++) {
    ferry_pack_sum g;
    double e;
    if (!pack_group_chunks(in, c, fam, kind, rank, &g, NULL, &e)) return 0;
    uint64_t times = kind == PLAN_GROUP_BLOCK ? (uint64_t)in->model.layers : 1;
    all->chunks += times * g.chunks;
    all->bytes += times * g.bytes;
    *elems += (double)times * e;
    if (g.largest > all->largest) all->largest = g.largest;
    if ((double)g.bytes > *gmax) *gmax = (double)g.bytes;
  }
  return 1;
}

/* A family sharded over N ranks as the plan counts it, into c: frank, the
 * rank planned (in->rank, or with -1 the one holding the most bytes of it,
 * the first of equals: its chunks are the ones listed), and fsum, fgmax,
 * felems, that rank's chunks summed, largest group and elements, or with
 * -1 each the largest of any rank (a bound for every rank). frank -1 when
 * the family is not sharded (share 1), when the model has no tensor list,
 * or past FERRY_PLAN_EXACT_RANKS ranks (the estimates apply). */
static void family_ranks(const ferry_plan_input *in, plan_place_ctx *c, int fam, double share) {
  double n[PLAN_GROUP_TENSORS];
  c->frank[fam] = -1;
  if (share >= 1 || c->ch <= 0 || c->N > FERRY_PLAN_EXACT_RANKS ||
      plan_group_tensors(&in->model, PLAN_GROUP_BLOCK, n) <= 0)
    return;
  ferry_pack_sum *m = &c->fsum[fam];
  if (in->rank >= 0) {
    c->frank[fam] = in->rank;
    pack_rank(in, c, fam, in->rank, m, &c->fgmax[fam], &c->felems[fam]);
    return;
  }
  memset(m, 0, sizeof *m);
  c->fgmax[fam] = c->felems[fam] = 0;
  for (int r = 0; r < (int)c->N; r++) {
    ferry_pack_sum all;
    double g, e;
    pack_rank(in, c, fam, r, &all, &g, &e);
    if (c->frank[fam] < 0 || all.bytes > m->bytes) c->frank[fam] = r;
    if (all.bytes > m->bytes) m->bytes = all.bytes;
    if (all.chunks > m->chunks) m->chunks = all.chunks;
    if (all.largest > m->largest) m->largest = all.largest;
    if (g > c->fgmax[fam]) c->fgmax[fam] = g;
    if (e > c->felems[fam]) c->felems[fam] = e;
  }
}

/* A family's chunks as this rank holds it (share < 1: sharded, as
 * family_ranks counts it), summed; *gmax, the bytes of the group with the
 * most. 0 when it is estimated instead (no tensor list, no chunks, too
 * many ranks). */
static int pack_family(const ferry_plan_input *in, const plan_place_ctx *c, int fam,
                       double share, ferry_pack_sum *all, double *gmax) {
  double e;
  if (share >= 1) return pack_rank(in, c, fam, -1, all, gmax, &e);
  *all = c->fsum[fam];
  *gmax = c->fgmax[fam];
  return c->frank[fam] >= 0;
}

/* The largest group's chunks of a family as packed, else as group_chunks
 * estimates them (x: its bytes). */
static double group_max(const ferry_plan_input *in, const plan_place_ctx *c, int fam,
                        double share, double x) {
  ferry_pack_sum all;
  double g;
  return pack_family(in, c, fam, share, &all, &g) ? g : group_chunks(x, c->ch);
}

/* Elements of the largest range of a group the planned rank holds (the
 * drain's piece buffer): its partition's (with in->rank -1, any rank's),
 * else ⌈G / N⌉. */
static double rank_range_max(const ferry_plan_input *in, const plan_place_ctx *c) {
  size_t len[PLAN_GROUP_TENSORS], range, most = 0;
  if (c->frank[LAY_OPTIM] < 0) return ceil(c->G / c->N);
  int r0 = in->rank >= 0 ? in->rank : 0, r1 = in->rank >= 0 ? in->rank + 1 : (int)c->N;
  for (int r = r0; r < r1; r++)
    for (int kind = PLAN_GROUP_EMBED; kind <= PLAN_GROUP_HEAD; kind++)
      if (rank_tensors(in, c, kind, r, len, &range) > 0 && range > most) most = range;
  return (double)most;
}

plan_place_ctx plan_place_context(const ferry_plan_input *in, int p) {
  static const int ph[FERRY_PLACEMENTS] = {FERRY_PLAN_GPU, FERRY_PLAN_GPU, FERRY_PLAN_HOST,
                                           FERRY_PLAN_HOST, FERRY_PLAN_NVME};
  static const int oh[FERRY_PLACEMENTS] = {FERRY_PLAN_GPU, FERRY_PLAN_HOST, FERRY_PLAN_HOST,
                                           FERRY_PLAN_NVME, FERRY_PLAN_NVME};
  plan_place_ctx c;
  memset(&c, 0, sizeof c);
  c.ph = ph[p];
  c.oh = oh[p];
  c.gh = ferry_plan_grads_auto(in, p);
  c.P = (double)ferry_plan_model_params(&in->model);
  c.G = (double)ferry_plan_largest_group(&in->model);
  c.ch = (double)in->chunk_size;
  c.pb = in->precision == FERRY_PREC_FP32 ? 4 : 2;
  c.gb = in->grad_precision == FERRY_PREC_BF16 ? 2 : 4;
  c.k = ferry_plan_optimizer_states(in->optimizer);
  c.mb = master_per_param(in, p);
  c.sb = state_per_param(in);
  c.ob = c.mb + c.k * c.sb;
  c.cpu_path = in->device == FERRY_PLAN_DEV_HOST || c.oh != FERRY_PLAN_GPU;
  c.N = (double)in->gpus * (double)in->nodes;
  c.stage = in->zero_stage;
  c.so = c.stage >= 1 ? 1 / c.N : 1;
  c.sg = c.stage >= 2 ? 1 / c.N : 1;
  c.sp = c.stage >= 3 ? 1 / c.N : 1;
  family_ranks(in, &c, LAY_PARAMS, c.sp);
  family_ranks(in, &c, LAY_GRADS, c.sg);
  family_ranks(in, &c, LAY_MASTER, c.so);
  family_ranks(in, &c, LAY_OPTIM, c.so);
  c.range_max = rank_range_max(in, &c);
  c.grp_p = group_max(in, &c, LAY_PARAMS, 1, c.G * c.pb); /* gathered: the whole group */
  c.grp_g = group_max(in, &c, LAY_GRADS, c.sg, c.G * c.gb * c.sg);
  c.grp_o = group_max(in, &c, LAY_OPTIM, c.so, c.G * c.ob * c.so);
  return c;
}

/* Elements of the model's largest single tensor (a chunk of its own when
 * it outgrows a chunk). */
static double largest_tensor(const ferry_plan_model *m) {
  double h = (double)m->hidden, f = (double)m->ffn, v = (double)m->vocab * h;
  double t = h * f;
  if (m->arch == FERRY_ARCH_GPT2) t = fmax(fmax(t, 3 * h * h), (double)m->positions * h);
  else t = fmax(t, h * plan_q_dim(m));
  return fmax(t, v);
}

/* Tensors of a block, the group with the most (the GPU math's pinned sums
 * hold one per tensor). */
static double block_tensors(const ferry_plan_model *m) {
  if (m->arch == FERRY_ARCH_GPT2) return 12; /* 2 LN, c_attn, c_proj, c_fc, mlp c_proj: w + b */
  return 9 + (m->qkv_bias ? 3 : 0) + (m->o_bias ? 1 : 0) + (m->mlp_bias ? 3 : 0);
}

/* Bytes of one group's tensors of n elements in a family (LAY_OPTIM: the
 * master, when there is one, and each state). */
static double group_bytes(const ferry_plan_input *in, const plan_place_ctx *c, int fam, double n) {
  switch (fam) {
  case LAY_PARAMS: return n * c->pb;
  case LAY_GRADS: return n * c->gb;
  case LAY_MASTER: return n * c->mb;
  default: return n * c->mb + c->k * state_bytes(in, n);
  }
}

/* A family as the engine's layout packs it, this rank's share of each
 * group: the largest group, the whole (reserved in whole chunks: ⌈x / C⌉·C,
 * each state apart; the layout's trimmed chunks hold at most that), the
 * largest chunk and the chunks. The largest group and chunk and the count
 * packed tensor by tensor (pack_family), as the engine's finalize counts
 * them; for a model known by its count alone estimated: the largest group
 * (group_chunks), the largest chunk (C, or a tensor larger than C in a
 * chunk of its own). With chunk_size 0: the exact bytes, no chunks. */
static ferry_footprint_family layout_family(const ferry_plan_input *in, const plan_place_ctx *c,
                                            int fam, double share, uint64_t *data) {
  const ferry_plan_model *m = &in->model;
  ferry_footprint_family f;
  ferry_pack_sum all;
  double most, P = c->P * share;
  int packed = pack_family(in, c, fam, share, &all, &most);
  if (packed && share < 1) P = c->felems[fam]; /* the rank's elements of the family */
  double total = fam == LAY_OPTIM ? round_chunk(P * c->mb, c->ch) +
                                        c->k * round_chunk(state_bytes(in, P), c->ch)
                                  : round_chunk(group_bytes(in, c, fam, P), c->ch);
  if (packed) {
    f.group_max = (uint64_t)most;
    f.total = (uint64_t)llround(total);
    *data = all.bytes;
    f.chunk_max = all.largest;
    f.chunks = all.chunks;
    return f;
  }
  const double n[3] = {(double)ferry_plan_embed_params(m), (double)ferry_plan_block_params(m),
                       (double)ferry_plan_head_params(m)};
  const double times[3] = {1, (double)m->layers, 1};
  double chunks = 0;
  for (int i = 0; i < 3; i++) {
    double x = group_bytes(in, c, fam, n[i] * share);
    if (x > 0) chunks += times[i] * (c->ch > 0 ? ceil(x / c->ch) : 1);
  }
  double gmax = group_chunks(group_bytes(in, c, fam, c->G * share), c->ch);
  double per[] = {c->pb, c->gb, c->mb, fmax(c->mb, c->sb)};
  double big = per[fam] * largest_tensor(m);
  f.group_max = (uint64_t)llround(gmax);
  f.total = (uint64_t)llround(total);
  f.chunk_max = c->ch > 0 ? (uint64_t)llround(big > c->ch ? big : fmin(c->ch, gmax)) : 0;
  f.chunks = (uint64_t)chunks;
  *data = f.total;
  return f;
}

void plan_footprint(const ferry_plan_input *in, int p, plan_fp *fp) {
  plan_place_ctx c = plan_place_context(in, p);
  memset(fp, 0, sizeof *fp);
  /* grads "none": no accumulator (the engine names the host, and holds none there) */
  fp->home[FERRY_FAMILY_PARAMS] = (ferry_tier)c.ph;
  fp->home[FERRY_FAMILY_GRADS] = c.gh == FERRY_PLAN_GRADS_GPU    ? FERRY_TIER_DEVICE
                                 : c.gh == FERRY_PLAN_GRADS_NVME ? FERRY_TIER_NVME
                                                                 : FERRY_TIER_HOST;
  fp->home[FERRY_FAMILY_OPTIM] = (ferry_tier)c.oh;
  uint64_t master_data;
  fp->fam[FERRY_FAMILY_PARAMS] = layout_family(in, &c, LAY_PARAMS, c.sp, &fp->data[0]);
  if (c.gh != FERRY_PLAN_GRADS_NONE)
    fp->fam[FERRY_FAMILY_GRADS] = layout_family(in, &c, LAY_GRADS, c.sg, &fp->data[1]);
  fp->fam[FERRY_FAMILY_OPTIM] = layout_family(in, &c, LAY_OPTIM, c.so, &fp->data[2]);
  fp->master = layout_family(in, &c, LAY_MASTER, c.so, &master_data).total;
  ferry_footprint_host_need(fp->home, fp->fam, &fp->need);
  fp->nvme_files = ferry_footprint_nvme_files(fp->home, fp->fam);
  /* the engine's pinned staging: the GPU's own math (all-gpu on CUDA)
   * drains into its sums, not into staging */
  int gpu_math = in->device == FERRY_PLAN_DEV_CUDA && c.oh == FERRY_PLAN_GPU;
  ferry_footprint_engine fe;
  memset(&fe, 0, sizeof fe);
  fe.group_n = (uint64_t)c.G;
  fe.esize = (size_t)c.pb;
  fe.page = c.ch > 0 ? 4096 : 1;
  fe.drain_staged = !gpu_math;
  fe.gpu_sums = gpu_math ? (uint64_t)(2 * block_tensors(&in->model) * sizeof(double)) : 0;
  fe.upload_staged = c.ph == FERRY_PLAN_GPU && !gpu_math;
  fe.params_off_device = c.ph != FERRY_PLAN_GPU;
  if (c.N > 1) /* the drain's fp32 buffers: the group and, sharded, a rank's piece */
    fe.reduce = (uint64_t)(4 * c.G + (c.stage >= 1 ? 4 * c.range_max : 0));
  fe.params_sharded = c.N > 1 && c.stage >= 3;
  ferry_footprint_staging_bytes(&fe, &fp->staging);
  fp->grad_slots = 2 * ferry_footprint_group_buffer(fe.group_n, fe.esize, fe.page);
}

uint64_t plan_nvme_file_bytes(const ferry_plan_input *in, const plan_fp *fp) {
  /* the engine's chunk size: the plan's, or --write-config's 64 MiB; its
   * spares from each family's data (memory/layout.c, check_chunks) */
  ferry_footprint_family fam[FERRY_FAMILIES];
  memcpy(fam, fp->fam, sizeof fam);
  for (int f = 0; f < FERRY_FAMILIES; f++) fam[f].total = fp->data[f];
  return ferry_footprint_nvme_swap(fp->home, fam, in->chunk_size ? in->chunk_size : 64ull << 20);
}

int plan_readahead_fits(const ferry_plan_input *in, const ferry_plan_candidate *c,
                        const plan_fp *fp) {
  uint64_t host = in->budget[FERRY_PLAN_HOST], gpu = in->budget[FERRY_PLAN_GPU];
  uint64_t pool = host > fp->staging.total ? host - fp->staging.total : 0;
  /* the device pool: the device budget less the engine's grad slots and
   * what the trainer reserves (activations, workspace) */
  uint64_t own = fp->grad_slots + c->bytes[FERRY_PLAN_GPU][FERRY_FAM_ACT] +
                 c->bytes[FERRY_PLAN_GPU][FERRY_FAM_WORKSPACE];
  size_t param_ahead;
  int fits;
  ferry_footprint_read_ahead(pool, gpu > own ? gpu - own : 0, &fp->need, &param_ahead, &fits);
  return fits;
}

static double family_bytes(const ferry_plan_input *in, const plan_place_ctx *c, int fam, double e,
                           double share);
static double optim_family_bytes(const ferry_plan_input *in, const plan_place_ctx *c);

/* Each family's bytes in its home, this rank's (ferry-gpt's model states
 * line): its chunks as packed, else estimated (family_bytes). */
static void home_bytes(const ferry_plan_input *in, int p, ferry_plan_candidate *k) {
  plan_place_ctx c = plan_place_context(in, p);
  k->home_bytes[FERRY_PLAN_NV_PARAMS] = (uint64_t)llround(family_bytes(in, &c, LAY_PARAMS, c.pb, c.sp));
  k->home_bytes[FERRY_PLAN_NV_GRADS] =
      c.gh == FERRY_PLAN_GRADS_NONE ? 0 : (uint64_t)llround(family_bytes(in, &c, LAY_GRADS, c.gb, c.sg));
  k->home_bytes[FERRY_PLAN_NV_OPTIM] = (uint64_t)llround(optim_family_bytes(in, &c));
}

/* Bytes per tier and family of placement p at batch b; *files: its NVMe
 * swap files. */
static void place_bytes(const ferry_plan_input *in, int p, double b,
                        double out[FERRY_PLAN_TIERS][FERRY_PLAN_FAMILIES], double *files) {
  memset(out, 0, sizeof(double) * FERRY_PLAN_TIERS * FERRY_PLAN_FAMILIES);
  plan_place_ctx c = plan_place_context(in, p);
  plan_fp fp;
  plan_footprint(in, p, &fp);
  *files = (double)plan_nvme_file_bytes(in, &fp);
  double *gpu = out[FERRY_PLAN_GPU], *host = out[FERRY_PLAN_HOST];
  /* activations and scratch: the device's on a GPU; the CPU model's host
   * allocations on --device host (in the RSS, not in the device budget) */
  if (in->device == FERRY_PLAN_DEV_CUDA) {
    gpu[FERRY_FAM_ACT] = activation_bytes(in, b);
    gpu[FERRY_FAM_WORKSPACE] = workspace_bytes(in, b);
  }
  gpu[FERRY_FAM_GRADS] = (double)fp.grad_slots; /* grad buffers: being written, being drained */
  /* each family whole in its home (this rank's share); the params also two
   * groups on the device (in use, next) when they live elsewhere, and at
   * stage 3 two gathered groups beside the device home's share */
  double params = (double)fp.fam[FERRY_FAMILY_PARAMS].total;
  out[c.ph][FERRY_FAM_PARAMS] = params;
  if (c.ph != FERRY_PLAN_GPU || c.sp < 1) gpu[FERRY_FAM_PARAMS] += 2 * c.grp_p;
  if (c.gh != FERRY_PLAN_GRADS_NONE)
    out[fp.home[FERRY_FAMILY_GRADS]][FERRY_FAM_GRADS] += (double)fp.fam[FERRY_FAMILY_GRADS].total;
  out[c.oh][FERRY_FAM_MASTER] = (double)fp.master;
  out[c.oh][FERRY_FAM_OPTIM] = (double)(fp.fam[FERRY_FAMILY_OPTIM].total - fp.master);
  host[FERRY_FAM_BUFFERS] = (double)fp.staging.total;
  host[FERRY_FAM_SWAP] = (double)(fp.need.optim + fp.need.grads + fp.need.params + fp.need.slack);
}

static void fmt_bytes(double b, char *buf, size_t n) {
  static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int i = 0;
  while (b >= 1024 && i < 6) {
    b /= 1024;
    i++;
  }
  if (i == 0) snprintf(buf, n, "%.0f B", b);
  else snprintf(buf, n, "%.1f %s", b, u[i]);
}

/* What tier t needs of its budget: its families' bytes; on NVMe the swap
 * files that hold them (each chunk's slot and the spares), which the
 * engine's finalize holds against tiers.nvme.budget. */
static double tier_need(const double by[FERRY_PLAN_FAMILIES], int t, double files) {
  double tot = 0;
  for (int f = 0; f < FERRY_PLAN_FAMILIES; f++) tot += by[f];
  return t == FERRY_PLAN_NVME && files > tot ? files : tot;
}

int plan_tiers_fit(const ferry_plan_input *in, int p, double b, double *short_by) {
  double by[FERRY_PLAN_TIERS][FERRY_PLAN_FAMILIES], files;
  place_bytes(in, p, b, by, &files);
  int ok = 1;
  for (int t = 0; t < FERRY_PLAN_TIERS; t++) {
    double tot = tier_need(by[t], t, files);
    double s = tot > (double)in->budget[t] ? tot - (double)in->budget[t] : 0;
    if (short_by) short_by[t] = s;
    if (s > 0) ok = 0;
  }
  return ok;
}

/* Placement p's bytes per tier and family at the input's batch, whether they
 * fit the budgets and, when not, by how much (in words, in c->why). */
void plan_candidate_bytes(const ferry_plan_input *in, int p, ferry_plan_candidate *c) {
  double by[FERRY_PLAN_TIERS][FERRY_PLAN_FAMILIES], shortb[FERRY_PLAN_TIERS], files;
  place_bytes(in, p, (double)in->batch, by, &files);
  for (int t = 0; t < FERRY_PLAN_TIERS; t++) {
    double tot = 0;
    for (int f = 0; f < FERRY_PLAN_FAMILIES; f++) {
      c->bytes[t][f] = (uint64_t)llround(by[t][f]);
      tot += (double)c->bytes[t][f];
    }
    c->tier_bytes[t] = (uint64_t)tot;
  }
  c->fits = plan_tiers_fit(in, p, (double)in->batch, shortb);
  for (int t = 0; t < FERRY_PLAN_TIERS; t++) c->short_by[t] = (uint64_t)llround(shortb[t]);
  c->pinned_bytes = in->budget[FERRY_PLAN_HOST]; /* pool + staging, pinned at finalize */
  home_bytes(in, p, c);
  if (c->fits) {
    snprintf(c->why, sizeof c->why, "fits");
    return;
  }
  size_t o = 0;
  for (int t = 0; t < FERRY_PLAN_TIERS; t++) {
    if (!c->short_by[t]) continue;
    char s[32], need[32], have[32];
    fmt_bytes((double)c->short_by[t], s, sizeof s);
    fmt_bytes(tier_need(by[t], t, files), need, sizeof need);
    fmt_bytes((double)in->budget[t], have, sizeof have);
    o += (size_t)snprintf(c->why + o, sizeof c->why - o, "%s%s short by %s (needs %s, budget %s)",
                          o ? "; " : "", ferry_plan_tier_name(t), s, need, have);
    if (o >= sizeof c->why) break;
  }
}

/* One group's x bytes of a family as the engine lays them out: packed into
 * chunks of at most ch bytes trimmed to what they hold, each rounded to
 * 4 KiB on the way to NVMe (half a page each on average). */
static double group_nvme(double x, double ch) {
  return ch > 0 ? x + ceil(x / ch) * 2048 : round_chunk(x, 4096);
}

/* Bytes of a family of the whole model as the engine lays it out (e bytes
 * per element, this rank's share): packed (pack_family), else group_nvme
 * for each group. */
static double family_bytes(const ferry_plan_input *in, const plan_place_ctx *c, int fam, double e,
                           double share) {
  const ferry_plan_model *m = &in->model;
  ferry_pack_sum all;
  double most;
  if (pack_family(in, c, fam, share, &all, &most)) return (double)all.bytes;
  double E = (double)ferry_plan_embed_params(m), B = (double)ferry_plan_block_params(m);
  double H = (double)ferry_plan_head_params(m);
  return share * (group_nvme(E * e, c->ch) + (double)m->layers * group_nvme(B * e, c->ch) +
                  group_nvme(H * e, c->ch));
}

/* The optimizer family of the whole model on NVMe: per group, the master
 * (when there is one) and each state, as ferry_optimizer_state_bytes packs
 * a group's elements, each rounded to 4 KiB. */
static double optim_group_bytes(const ferry_plan_input *in, const plan_place_ctx *c, double n) {
  return round_chunk(n * c->mb, 4096) + c->k * round_chunk(state_bytes(in, n), 4096);
}

/* ... this rank's share of each group (stage >= 1: 1/N of it); packed
 * tensor by tensor when the model has them. */
static double optim_family_bytes(const ferry_plan_input *in, const plan_place_ctx *c) {
  const ferry_plan_model *m = &in->model;
  double so = c->so, most;
  ferry_pack_sum all;
  if (pack_family(in, c, LAY_OPTIM, so, &all, &most)) return (double)all.bytes;
  return optim_group_bytes(in, c, (double)ferry_plan_embed_params(m) * so) +
         (double)m->layers * optim_group_bytes(in, c, (double)ferry_plan_block_params(m) * so) +
         optim_group_bytes(in, c, (double)ferry_plan_head_params(m) * so);
}

double ferry_plan_optim_nvme_bytes(const ferry_plan_input *in, int p, const uint64_t *group_params,
                                   size_t ngroups) {
  if (!in || p < 0 || p >= FERRY_PLACEMENTS || (ngroups && !group_params)) return 0;
  plan_place_ctx c = plan_place_context(in, p);
  double o = 0;
  for (size_t i = 0; i < ngroups; i++)
    o += optim_group_bytes(in, &c, (double)group_params[i] * c.so);
  return o;
}

/* One group kind's param chunks as the engine packs them (PLAN_GROUP_*):
 * their bytes, how many (0: not packed, the group whole) and each one's. */
typedef struct {
  double bytes;
  int n;
  uint64_t chunk[PLAN_GROUP_CHUNKS];
} plan_group_params;

/* The groups from one end (front: the embedding first; back: the head
 * first) whose params fit in `room` bytes, at least `least` of them; their
 * count, and in *bytes theirs and those of the next group's last chunks
 * that fit beside them (the cap evicts a group's chunks first to last, so
 * the room left keeps the group's tail). */
static int64_t end_groups(const ferry_plan_model *m, const plan_group_params kb[3], double room,
                          int front, int64_t least, double *bytes) {
  int64_t n = m->layers + 2, k = 0;
  *bytes = 0;
  for (; k < n; k++) {
    int64_t i = front ? k : n - 1 - k; /* forward order */
    const plan_group_params *g =
        &kb[i == 0 ? PLAN_GROUP_EMBED : i <= m->layers ? PLAN_GROUP_BLOCK : PLAN_GROUP_HEAD];
    if (k >= least && *bytes + g->bytes > room) {
      for (int c = g->n - 1; c >= 0 && *bytes + (double)g->chunk[c] <= room; c--)
        *bytes += (double)g->chunk[c];
      break;
    }
    *bytes += g->bytes;
  }
  return k;
}

/* NVMe params: the groups the host pool keeps at each turn of the loop.
 * At the forward -> backward turn the head (used back to back) and the last
 * groups, at the backward -> forward turn the first ones (the step's commit
 * writes the new params into the host copy, which stays): as many as fit,
 * and the next group's last chunks (end_groups), in the bytes the engine
 * caps its cached params at
 * (ferry_footprint_param_cache: the room the budget leaves beside the
 * plan's host tier, plus the working set's two param groups, less the
 * optimizer read-ahead when it fits). Within the cap no other family's move
 * evicts them (memory/evict.c), so nothing else competes at the turns. The
 * device pool: whole groups beside the head. *back, *front: the bytes
 * kept. */
static void cached_groups(const ferry_plan_input *in, const plan_place_ctx *c,
                          ferry_plan_candidate *w, double *back, double *front) {
  const ferry_plan_candidate *k = w;
  *back = *front = 0;
  w->cached_groups_host = w->cached_groups_device = 0;
  if (c->ph != FERRY_PLAN_NVME || c->grp_p <= 0) return;
  plan_fp fp;
  plan_footprint(in, k->placement, &fp);
  const ferry_plan_model *m = &in->model;
  for (int t = FERRY_PLAN_GPU; t <= FERRY_PLAN_HOST; t++) {
    double room = fmax(0, (double)in->budget[t] - (double)k->tier_bytes[t]);
    if (t == FERRY_PLAN_GPU) { /* the device pool: whole groups beside the head */
      int64_t n = 1 + (int64_t)floor(room / c->grp_p), groups = ferry_plan_groups(m);
      w->cached_groups_device = n > groups ? groups : n;
      continue;
    }
    /* the engine caps its cached params at this (ferry_mem_cap), from its
     * largest groups' own bytes: the need's when packed, else estimated
     * apart (the need rounds them up) */
    ferry_footprint_host n = fp.need;
    int ahead = plan_readahead_fits(in, k, &fp);
    ferry_pack_sum all;
    double most;
    plan_group_params kb[3];
    int packed = pack_family(in, c, LAY_PARAMS, c->sp, &all, &most);
    int rank = c->sp < 1 ? c->frank[LAY_PARAMS] : -1; /* stage 3: the rank's pieces */
    if (!packed) { /* estimated: group_nvme */
      if (n.optim) n.optim = (uint64_t)optim_group_bytes(in, c, c->G * c->so);
      if (ahead) n.params = 2 * (uint64_t)group_nvme(c->G * c->pb * c->sp, c->ch);
      n.total += n.optim + n.params - fp.need.optim - fp.need.params;
    }
    for (int g = PLAN_GROUP_EMBED; g <= PLAN_GROUP_HEAD; g++) {
      double x = (double)(g == PLAN_GROUP_EMBED ? ferry_plan_embed_params(m)
                          : g == PLAN_GROUP_BLOCK ? ferry_plan_block_params(m)
                                                  : ferry_plan_head_params(m));
      ferry_pack_sum s;
      kb[g].n = packed && pack_group_chunks(in, c, LAY_PARAMS, g, rank, &s, kb[g].chunk, NULL)
                    ? (int)s.chunks : 0;
      kb[g].bytes = kb[g].n ? (double)s.bytes : group_nvme(x * c->pb, c->ch);
    }
    room = (double)ferry_footprint_param_cache((uint64_t)room + fp.need.total, &n, ahead);
    w->cached_groups_host = end_groups(m, kb, room, 0, 1, back);
    end_groups(m, kb, room, 1, 0, front);
  }
}

/* NVMe bytes per step, per family and direction (docs/PLANNING.md, "NVMe
 * bytes per step"). A copy in the device implies one in the host pool, so
 * the host's cached groups are the ones not read again. */
void plan_nvme_traffic(const ferry_plan_input *in, const plan_place_ctx *c,
                       ferry_plan_candidate *k) {
  double A = (double)in->grad_accumulation;
  memset(k->nvme_read, 0, sizeof k->nvme_read);
  memset(k->nvme_write, 0, sizeof k->nvme_write);
  if (c->oh == FERRY_PLAN_NVME) { /* the master (if any) and each state: this rank's share */
    double o = optim_family_bytes(in, c);
    k->nvme_read[FERRY_PLAN_NV_OPTIM] = o;
    k->nvme_write[FERRY_PLAN_NV_OPTIM] = o;
  }
  if (c->gh == FERRY_PLAN_GRADS_NVME) { /* written per micro-batch, read back to accumulate
                                           (A - 1) times and once by the step */
    double g = family_bytes(in, c, LAY_GRADS, c->gb, c->sg);
    k->nvme_write[FERRY_PLAN_NV_GRADS] = A * g;
    k->nvme_read[FERRY_PLAN_NV_GRADS] = A * g;
  }
  if (c->ph == FERRY_PLAN_NVME) { /* forward and backward per micro-batch, less the turns */
    /* stage 3: each rank reads and writes its pieces, the rest is
     * gathered (packed as the engine packs them, else its share) */
    int pieces = c->sp < 1 && c->frank[LAY_PARAMS] >= 0;
    double pf = family_bytes(in, c, LAY_PARAMS, c->pb, pieces ? c->sp : 1), back, front;
    cached_groups(in, c, k, &back, &front);
    /* every turn keeps its groups (the step's commit leaves the new params
     * in the host copy); the whole family cached reads nothing. A bf16
     * master stages the params it updates from the host copy backward has
     * just fetched: no read of its own */
    k->nvme_read[FERRY_PLAN_NV_PARAMS] = A * fmax(0, 2 * pf - back - front);
    /* written once by the step (from the master, or the params themselves
     * updated in place) */
    k->nvme_write[FERRY_PLAN_NV_PARAMS] = pf;
    if (!pieces) {
      k->nvme_read[FERRY_PLAN_NV_PARAMS] *= c->sp;
      k->nvme_write[FERRY_PLAN_NV_PARAMS] *= c->sp;
    }
  }
  k->nvme_read_bytes = k->nvme_write_bytes = 0;
  for (int f = 0; f < FERRY_PLAN_NV_FAMILIES; f++) {
    k->nvme_read_bytes += k->nvme_read[f];
    k->nvme_write_bytes += k->nvme_write[f];
  }
}

/* The process's peak RSS: the budgets reserved at finalize, the trainer's
 * host memory, the library and the CUDA context (docs/PLANNING.md). */
void plan_rss_bytes(const ferry_plan_input *in, ferry_plan_rss *r) {
  const ferry_plan_model *m = &in->model;
  int host = in->device == FERRY_PLAN_DEV_HOST;
  double b = (double)in->batch, pb = in->precision == FERRY_PREC_FP32 ? 4 : 2;
  memset(r, 0, sizeof *r);
  r->host_budget = in->budget[FERRY_PLAN_HOST];
  r->device_budget = host ? in->budget[FERRY_PLAN_GPU] : 0;
  if (host) r->activations = (uint64_t)llround(activation_bytes(in, b) + workspace_bytes(in, b));
  /* token ids in and targets (int32); the CPU model over 16-bit params keeps
   * fp32 weights and grads of two groups (the embedding, the largest other) */
  double scratch = 8 * b * (double)in->seq;
  if (host && pb < 4) {
    double E = (double)ferry_plan_embed_params(m), B = (double)ferry_plan_block_params(m);
    double H = (double)ferry_plan_head_params(m);
    scratch += 2 * 4 * (E + fmax(B, H));
  }
  r->scratch = (uint64_t)llround(scratch);
  r->library = FERRY_PLAN_LIBRARY_OVERHEAD;
  r->cuda = host ? 0 : FERRY_PLAN_CUDA_HOST_BYTES;
  r->total = r->host_budget + r->device_budget + r->activations + r->scratch + r->library + r->cuda;
}

