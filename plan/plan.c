/* plan/plan.c — the planner's entry points: the input's defaults and its
 * validation, each candidate placement assembled (bytes, time, read-ahead,
 * peak RSS, largest batch) and the recommendation, the search for the
 * largest model that fits, and DeepSpeed's published estimator formulas for
 * comparison. Arithmetic only: no printing, no exits. The formulas and
 * their sources are written down in docs/PLANNING.md.
 */
#include "plan/plan_impl.h"

#include "ferry.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

ferry_plan_input ferry_plan_input_default(void) {
  ferry_plan_input in;
  memset(&in, 0, sizeof in);
  in.batch = 1;
  in.seq = 1024;
  in.precision = FERRY_PREC_BF16;
  in.optimizer = FERRY_OPTIM_ADAMW;
  in.checkpointing = 1;
  in.flash_attention = 1;
  in.chunk_size = 64ull << 20;
  in.bw = ferry_plan_bandwidth_default();
  in.grad_accumulation = 1;
  in.clip_grad_norm = 0;
  in.grad_precision = FERRY_PREC_FP32;
  in.device = FERRY_PLAN_DEV_CUDA;
  in.state_dtype = FERRY_DT_F32;
  in.state_block = 256;
  in.master_dtype = FERRY_DT_F32;
  in.gpus = in.nodes = 1;
  in.zero_stage = 2; /* the engine's dist.zero_stage default */
  in.rank = -1;
  in.net_gbps = 100;
  in.intra_gbps = 0;
  return in;
}

/* The process's peak RSS at batch b. */
static ferry_plan_rss rss_at(const ferry_plan_input *in, int64_t b) {
  ferry_plan_input t = *in;
  t.batch = b;
  ferry_plan_rss r;
  plan_rss_bytes(&t, &r);
  return r;
}

/* On the host backend the CPU model's activations are host allocations
 * outside every tier: the machine's RAM (host_ram) holds the peak RSS, or,
 * with host_ram unknown, the emulated device's budget holds the
 * activations. The bytes that bound at batch b (0 elsewhere). */
static uint64_t host_bound(const ferry_plan_input *in, int64_t b) {
  if (in->device != FERRY_PLAN_DEV_HOST) return 0;
  ferry_plan_rss r = rss_at(in, b);
  return in->host_ram ? r.total : r.activations;
}

/* Whether batch b fits placement p: its tiers, and host_bound within cap. */
static int batch_fits(const ferry_plan_input *in, int p, int64_t b, uint64_t cap) {
  return plan_tiers_fit(in, p, (double)b, NULL) && host_bound(in, b) <= cap;
}

/* The largest batch of placement p that fits at this sequence length. */
static int64_t max_batch(const ferry_plan_input *in, int p) {
  /* the RAM, or the device budget; when batch 1 needs more already (both
   * budgets given beside it), only the growth with the batch is held back */
  uint64_t cap = in->host_ram ? in->host_ram : in->budget[FERRY_PLAN_GPU], one = host_bound(in, 1);
  if (cap < one) cap = one;
  if (!batch_fits(in, p, 1, cap)) return 0;
  int64_t lo = 1, hi = 2;
  while (hi <= MAX_BATCH && batch_fits(in, p, hi, cap)) {
    lo = hi;
    hi *= 2;
  }
  if (hi > MAX_BATCH) hi = MAX_BATCH + 1;
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    if (batch_fits(in, p, mid, cap)) lo = mid;
    else hi = mid;
  }
  return lo;
}

/* The next group's NVMe optimizer chunks, read ahead when the host pool
 * has room for them beside the need of one step and the host copies of the
 * device pool's chunks (the engine's finalize, plan/footprint.h; not part
 * of the fit); and the NVMe swap files the layout asks for. */
static void candidate_readahead(const ferry_plan_input *in, int p, ferry_plan_candidate *c) {
  plan_fp fp;
  plan_footprint(in, p, &fp);
  c->readahead_bytes =
      fp.home[FERRY_FAMILY_OPTIM] == FERRY_TIER_NVME ? fp.fam[FERRY_FAMILY_OPTIM].group_max : 0;
  c->readahead_fits = plan_readahead_fits(in, c, &fp);
  c->nvme_file_bytes = plan_nvme_file_bytes(in, &fp);
}

static void candidate(const ferry_plan_input *in, int p, ferry_plan_candidate *c) {
  memset(c, 0, sizeof *c);
  c->placement = p;
  c->grads = ferry_plan_grads_auto(in, p);
  c->optim_bytes_per_param = ferry_plan_optim_bytes_per_param(in, p);
  c->step_bytes_per_param = ferry_plan_step_bytes_per_param(in, p);
  plan_candidate_bytes(in, p, c);
  candidate_readahead(in, p, c); /* before the time: no room to read ahead is a wait */
  plan_candidate_time(in, p, c);
  plan_rss_bytes(in, &c->rss);
  c->max_batch = max_batch(in, p);
}

/* Every field of the input within its range; FERRY_EINVAL naming the
 * first that is not. */
static int check_input(const ferry_plan_input *in, char *why, size_t wl) {
  const ferry_plan_model *m = &in->model;
  if (m->layers < 1 || m->hidden < 1 || m->heads < 1 || m->kv_heads < 1 || m->ffn < 1 ||
      m->head_dim < 1 || m->vocab < 0)
    return plan_fail(why, wl, FERRY_EINVAL, "plan: model '%s' has a zero or negative dimension",
                m->name);
  if (in->batch < 1 || in->batch > MAX_BATCH)
    return plan_fail(why, wl, FERRY_EINVAL, "batch %lld: must be 1 to %lld", (long long)in->batch,
                (long long)MAX_BATCH);
  if (in->seq < 1 || in->seq > (1ll << 22))
    return plan_fail(why, wl, FERRY_EINVAL, "sequence length %lld: must be 1 to %lld",
                (long long)in->seq, 1ll << 22);
  if (m->arch == FERRY_ARCH_GPT2 && m->positions && in->seq > m->positions)
    return plan_fail(why, wl, FERRY_EINVAL,
                "sequence length %lld: %s has learned positions for at most %lld tokens",
                (long long)in->seq, m->name, (long long)m->positions);
  if (in->precision < 0 || in->precision > 2)
    return plan_fail(why, wl, FERRY_EINVAL, "precision %d: fp32, fp16 or bf16", in->precision);
  if (in->optimizer < 0 || in->optimizer > 5)
    return plan_fail(why, wl, FERRY_EINVAL, "optimizer %d: adamw, adam, adagrad, lamb, sgd or lion",
                in->optimizer);
  if (in->grad_accumulation < 1 || in->grad_accumulation > 1000000)
    return plan_fail(why, wl, FERRY_EINVAL, "grad accumulation %lld: must be 1 to 1000000",
                (long long)in->grad_accumulation);
  if (!(in->clip_grad_norm >= 0) || !isfinite(in->clip_grad_norm))
    return plan_fail(why, wl, FERRY_EINVAL, "clip_grad_norm must be >= 0 (0 = off)");
  if (in->grad_precision != FERRY_PREC_FP32 && in->grad_precision != FERRY_PREC_BF16)
    return plan_fail(why, wl, FERRY_EINVAL, "grad precision %d: fp32 or bf16", in->grad_precision);
  if (in->device != FERRY_PLAN_DEV_CUDA && in->device != FERRY_PLAN_DEV_HOST)
    return plan_fail(why, wl, FERRY_EINVAL, "device %d: cuda or host", in->device);
  int sdt = in->state_dtype ? in->state_dtype : FERRY_DT_F32;
  if (!ferry_plan_dtype_name(sdt))
    return plan_fail(why, wl, FERRY_EINVAL, "optimizer.state_dtype %d: fp32, bf16 or int8", sdt);
  int64_t sbk = in->state_block;
  if (sbk && (sbk < 32 || sbk > 4096 || (sbk & (sbk - 1))))
    return plan_fail(why, wl, FERRY_EINVAL,
                "optimizer.state_block %lld: a power of two from 32 to 4096 (default 256)",
                (long long)sbk);
  int mdt = in->master_dtype ? in->master_dtype : FERRY_DT_F32;
  if (mdt != FERRY_DT_F32 && mdt != FERRY_DT_BF16)
    return plan_fail(why, wl, FERRY_EINVAL, "precision.master %d: fp32 or bf16", mdt);
  if (mdt == FERRY_DT_BF16 && in->precision != FERRY_PREC_BF16)
    return plan_fail(why, wl, FERRY_EINVAL,
                "precision.master = bf16 needs bf16 params (precision.params = bf16, not %s): "
                "the params are the master",
                ferry_plan_precision_name(in->precision));
  if (in->gpus < 1 || in->gpus > 65536)
    return plan_fail(why, wl, FERRY_EINVAL, "gpus %d: ranks per node must be 1 to 65536", in->gpus);
  if (in->nodes < 1 || in->nodes > 65536)
    return plan_fail(why, wl, FERRY_EINVAL, "nodes %d: must be 1 to 65536", in->nodes);
  if (in->rank < -1 || (int64_t)in->rank >= (int64_t)in->gpus * in->nodes)
    return plan_fail(why, wl, FERRY_EINVAL, "rank %d: 0 to %lld (-1: the rank with the most)",
                     in->rank, (long long)in->gpus * in->nodes - 1);
  if (in->zero_stage < 0 || in->zero_stage > 3)
    return plan_fail(why, wl, FERRY_EINVAL, "zero_stage %d: 0, 1, 2 or 3 (dist.zero_stage)",
                in->zero_stage);
  if (!(in->net_gbps > 0) || !isfinite(in->net_gbps))
    return plan_fail(why, wl, FERRY_EINVAL, "net_gbps %g: the network's Gb/s must be > 0",
                in->net_gbps);
  if (!(in->intra_gbps >= 0) || !isfinite(in->intra_gbps))
    return plan_fail(why, wl, FERRY_EINVAL, "intra_gbps %g: must be > 0 (0: the PCIe figure)",
                in->intra_gbps);
  const double *bws[] = {&in->bw.h2d_gbps,           &in->bw.d2h_gbps,
                         &in->bw.nvme_read_gbps,     &in->bw.nvme_write_gbps,
                         &in->bw.cpu_optimizer_gbps, &in->bw.device_tflops,
                         &in->bw.device_tflops_fp32, &in->bw.device_mem_gbps};
  for (size_t i = 0; i < sizeof bws / sizeof bws[0]; i++)
    if (!(*bws[i] > 0) || !isfinite(*bws[i]))
      return plan_fail(why, wl, FERRY_EINVAL, "plan: bandwidth %s must be > 0",
                  ferry_plan_bandwidth_key(1u << i));
  return FERRY_OK;
}

int ferry_plan_compute(const ferry_plan_input *in, ferry_plan_result *out, char *why, size_t wl) {
  if (!in || !out) return plan_fail(why, wl, FERRY_EINVAL, "plan: NULL argument");
  int rc = check_input(in, why, wl);
  if (rc) return rc;
  const ferry_plan_model *m = &in->model;
  memset(out, 0, sizeof *out);
  out->params = ferry_plan_model_params(m);
  out->ranks = in->gpus * in->nodes;
  out->largest_group = ferry_plan_largest_group(m);
  out->groups = ferry_plan_groups(m);
  out->bytes_estimated = m->arch == FERRY_ARCH_DENSE ||
                         (out->ranks > FERRY_PLAN_EXACT_RANKS && in->zero_stage >= 1);
  out->recommended = -1;
  out->closest = 0;
  double best_short = -1;
  for (int p = 0; p < FERRY_PLACEMENTS; p++) {
    ferry_plan_candidate *c = &out->cand[p];
    candidate(in, p, c);
    if (c->fits && (out->recommended < 0 ||
                    c->step_seconds < out->cand[out->recommended].step_seconds * (1 - 1e-9)))
      out->recommended = p;
    double s = 0;
    for (int t = 0; t < FERRY_PLAN_TIERS; t++) s += (double)c->short_by[t];
    if (best_short < 0 || s < best_short) {
      best_short = s;
      out->closest = p;
    }
  }
  if (out->recommended >= 0) out->closest = out->recommended;
  return FERRY_OK;
}

/* ======================================================================== */
/* The largest model that fits                                              */

/* Whether a dense model of n parameters fits: -1 on an input error. */
static int dense_fits(const ferry_plan_input *base, uint64_t n, ferry_plan_input *in,
                      ferry_plan_result *r, char *why, size_t wl) {
  *in = *base;
  if (ferry_plan_model_from_params(n, &in->model, why, wl)) return -1;
  if (ferry_plan_compute(in, r, why, wl)) return -1;
  return r->recommended >= 0;
}

int ferry_plan_largest(const ferry_plan_input *in, double resolution,
                       ferry_plan_largest_result *out, char *why, size_t wl) {
  if (!in || !out) return plan_fail(why, wl, FERRY_EINVAL, "plan: NULL argument");
  if (!(resolution > 0 && resolution <= 1))
    return plan_fail(why, wl, FERRY_EINVAL, "plan: resolution %g: must be in (0, 1]", resolution);
  memset(out, 0, sizeof *out);
  ferry_plan_input t;
  ferry_plan_result r;
  const uint64_t cap = 1000000000000000ull;
  uint64_t lo = 1000000, hi = 0;
  int f = dense_fits(in, lo, &t, &r, why, wl);
  out->evaluations++;
  if (f < 0) return FERRY_EINVAL;
  if (!f) { /* below a million: try the smallest model */
    hi = lo;
    lo = 1000;
    f = dense_fits(in, lo, &t, &r, why, wl);
    out->evaluations++;
    if (f <= 0) return f < 0 ? FERRY_EINVAL : FERRY_OK; /* nothing fits */
  }
  while (!hi) { /* doubling */
    uint64_t n = lo * 2 > cap ? cap : lo * 2;
    f = dense_fits(in, n, &t, &r, why, wl);
    out->evaluations++;
    if (f < 0) return FERRY_EINVAL;
    if (f && n == cap) return plan_fail(why, wl, FERRY_EINVAL, "plan: 10^15 parameters still fit");
    if (f) lo = n;
    else hi = n;
  }
  while ((double)hi > (double)lo * (1 + resolution)) { /* geometric bisection */
    uint64_t mid = (uint64_t)llround(sqrt((double)lo * (double)hi));
    if (mid <= lo || mid >= hi) break;
    f = dense_fits(in, mid, &t, &r, why, wl);
    out->evaluations++;
    if (f < 0) return FERRY_EINVAL;
    if (f) lo = mid;
    else hi = mid;
  }
  out->params = lo;
  out->next = hi;
  if (dense_fits(in, hi, &t, &out->above, why, wl) < 0) return FERRY_EINVAL;
  if (dense_fits(in, lo, &out->in, &out->fit, why, wl) < 0) return FERRY_EINVAL;
  out->evaluations += 2;
  return FERRY_OK;
}

/* ======================================================================== */
/* DeepSpeed's estimators (published formulas, one node, one GPU)            */

void ferry_plan_deepspeed_estimate(int stage, int offload_optimizer, int offload_params,
                                   uint64_t params, uint64_t largest_layer, double abf,
                                   double *gpu_bytes, double *cpu_bytes) {
  double P = (double)params, LL = (double)largest_layer;
  if (stage == 2) {
    if (offload_optimizer) { /* 16-bit params on the GPU; max(4 * gpus, 16) = 16 on the CPU */
      *gpu_bytes = 2 * P;
      *cpu_bytes = 16 * P * abf;
    } else { /* 16-bit params and grads, plus 16 bytes of fp32 states per param */
      *gpu_bytes = 4 * P + 16 * P;
      *cpu_bytes = 4 * P * abf;
    }
    return;
  }
  /* stage 3: the largest layer's 16-bit params and grads stay on the GPU */
  if (offload_optimizer && offload_params) {
    *gpu_bytes = 4 * LL;
    *cpu_bytes = 18 * P * abf;
  } else if (offload_optimizer) {
    *gpu_bytes = 4 * LL + 2 * P;
    *cpu_bytes = 16 * P * abf;
  } else {
    *gpu_bytes = 4 * LL + 18 * P;
    *cpu_bytes = 4 * LL * abf;
  }
}

