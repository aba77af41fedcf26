/* plan/time.c — the step-time model: a candidate's traffic per step (PCIe,
 * CPU optimizer, NVMe, the collectives between ranks), each component's
 * seconds from the bandwidths, and the pipeline's step and bottleneck
 * (docs/PLANNING.md, "Step time", "Data parallelism").
 */
#include "plan/plan_impl.h"

#include "ferry.h"

#include <math.h>

/* The compute rate a step runs at: fp32 params, and the host backend's CPU
 * model (fp32 whatever the params' dtype), at device_tflops_fp32; 16-bit
 * params on a GPU at device_tflops. */
double ferry_plan_compute_tflops(const ferry_plan_input *in, unsigned *bit) {
  int fp32 = in->precision == FERRY_PREC_FP32 || in->device == FERRY_PLAN_DEV_HOST;
  if (bit) *bit = fp32 ? FERRY_PLAN_BW_TFLOPS32 : FERRY_PLAN_BW_TFLOPS;
  return fp32 ? in->bw.device_tflops_fp32 : in->bw.device_tflops;
}

/* Bytes one rank sends per step in ring collectives (docs/PLANNING.md,
 * "Data parallelism"): a reduce-scatter or an all-gather moves (N - 1) / N
 * of its buffer per rank, an all-reduce twice that. Grads go as fp32 (the
 * engine reduces its fp32 drain), params at their dtype. */
static void comm_bytes(const ferry_plan_input *in, const plan_place_ctx *x,
                       ferry_plan_candidate *c) {
  double N = x->N, A = (double)in->grad_accumulation, f = (N - 1) / N;
  double grads = 4 * x->P, params = x->P * x->pb;
  c->comm_grad_bytes = c->comm_param_bytes = 0;
  if (N > 1) {
    switch (x->stage) {
    case 0: c->comm_grad_bytes = A * 2 * f * grads; break;  /* all-reduce per micro-batch */
    case 1: c->comm_grad_bytes = f * grads; break;          /* reduce-scatter once */
    default: c->comm_grad_bytes = A * f * grads; break;     /* reduce-scatter per micro-batch */
    }
    /* the new params gathered after the step (1, 2); at 3 each rank keeps
     * its share and every forward and backward fetch gathers the group */
    c->comm_param_bytes = x->stage == 0 ? 0 : x->stage == 3 ? 2 * A * f * params : f * params;
  }
  c->comm_bytes = c->comm_grad_bytes + c->comm_param_bytes;
  /* the ring runs at its slowest link: the network between nodes, the
   * node's GPU links (PCIe unless --intra-gbps) between a node's ranks */
  double intra = in->intra_gbps > 0 ? in->intra_gbps : 8 * in->bw.h2d_gbps;
  c->comm_link_gbps = N <= 1            ? 0
                      : in->nodes <= 1  ? intra
                      : in->gpus <= 1   ? in->net_gbps
                                        : fmin(in->net_gbps, intra);
  c->comm_seconds = N > 1 ? c->comm_bytes / (c->comm_link_gbps / 8 * 1e9) : 0;
}

/* The pipeline's step: the longest component plus one group's worth of
 * each of the others (filling and draining the pipeline); `skip` is a
 * component left out (-1: none). */
static double pipeline_step(const double *sec, int64_t groups, int skip, int *bottleneck,
                            double *fill) {
  double mx = 0, sum = 0;
  int b = FERRY_COMP_COMPUTE;
  for (int i = 0; i < FERRY_COMPONENTS; i++) {
    if (i == skip) continue;
    sum += sec[i];
    if (sec[i] > mx) {
      mx = sec[i];
      b = i;
    }
  }
  double f = (sum - mx) / (double)groups;
  if (bottleneck) *bottleneck = b;
  if (fill) *fill = f;
  return mx + f;
}

/* The components as the pipeline overlaps them. On the host backend the
 * model's compute, the copies (memcpy) and the CPU optimizer all run on
 * the same cores, so they add up in one lane (held in the compute slot);
 * NVMe and the network overlap them. On a GPU each is its own lane. */
static void cpu_lanes(const ferry_plan_input *in, const double *sec, double *lane) {
  for (int k = 0; k < FERRY_COMPONENTS; k++) lane[k] = sec[k];
  if (in->device != FERRY_PLAN_DEV_HOST) return;
  lane[FERRY_COMP_COMPUTE] += sec[FERRY_COMP_H2D] + sec[FERRY_COMP_D2H] + sec[FERRY_COMP_CPU];
  lane[FERRY_COMP_H2D] = lane[FERRY_COMP_D2H] = lane[FERRY_COMP_CPU] = 0;
}

/* The host backend with the step during backward (grads "none"): the
 * engine's schedule splits the step in two phases that do not overlap each
 * other. The forward holds 2 / (6 or 8) of the compute (the flops' share),
 * half the fetches and half the NVMe param reads (each pass reads the
 * family less the groups kept at its turn); the backward holds the rest:
 * its compute, the grads, the CPU optimizer, the optimizer state's reads
 * and writes and the params' write, since a group's update starts only once
 * its grads land and the next forward's first fetch waits for the last
 * update. Each phase is a pipeline of its own lanes, so the drive idles
 * through a compute-bound forward while the CPU waits through an
 * NVMe-bound backward. With no room to read the next group's optimizer
 * state ahead (readahead_fits), each group's read starts only after the
 * group before it is stepped: the drive also waits out the optimizer's
 * passes. Returns the two phases' step. */
static double phase_step(const ferry_plan_input *in, const ferry_plan_candidate *c,
                         double fwd_share, int64_t groups) {
  double fwd[FERRY_COMPONENTS] = {0}, bwd[FERRY_COMPONENTS], lf[FERRY_COMPONENTS],
         lb[FERRY_COMPONENTS];
  fwd[FERRY_COMP_COMPUTE] = fwd_share * c->seconds[FERRY_COMP_COMPUTE];
  if (c->placement != FERRY_PLACE_ZERO_OFFLOAD) /* its one upload is the step's */
    fwd[FERRY_COMP_H2D] = c->seconds[FERRY_COMP_H2D] / 2;
  fwd[FERRY_COMP_NVME] = in->gpus * c->nvme_read[FERRY_PLAN_NV_PARAMS] / 2 /
                         (in->bw.nvme_read_gbps * 1e9);
  for (int k = 0; k < FERRY_COMPONENTS; k++) bwd[k] = c->seconds[k] - fwd[k];
  cpu_lanes(in, fwd, lf);
  cpu_lanes(in, bwd, lb);
  if (c->readahead_bytes && !c->readahead_fits) lb[FERRY_COMP_NVME] += c->seconds[FERRY_COMP_CPU];
  return pipeline_step(lf, groups, -1, NULL, NULL) + pipeline_step(lb, groups, -1, NULL, NULL);
}

/* Placement p's traffic per step, each component's seconds, the bottleneck
 * and the step time of the pipeline. A step is grad_accumulation
 * micro-batches; with ranks, one rank's. */
void plan_candidate_time(const ferry_plan_input *in, int p, ferry_plan_candidate *c) {
  const ferry_plan_model *m = &in->model;
  plan_place_ctx x = plan_place_context(in, p);
  double P = x.P, pb = x.pb, A = (double)in->grad_accumulation;
  double tokens = A * (double)in->batch * (double)in->seq;
  double fwd_bwd = in->checkpointing ? 8 : 6; /* recompute adds one forward */
  double attn = (in->checkpointing ? 16 : 12) * (double)m->layers * (double)in->seq * plan_q_dim(m);
  c->flops = fwd_bwd * P * tokens + attn * tokens;
  int none = x.gh == FERRY_PLAN_GRADS_NONE;
  /* grad in (the accumulator, or the drained 16-bit grads), master r/w,
   * states r/w, param out: ferry_optimizer_bytes_per_param */
  double opt_bytes = ferry_plan_step_bytes_per_param(in, p);
  double tflops = ferry_plan_compute_tflops(in, NULL);
  if (p == FERRY_PLACE_ZERO_OFFLOAD) c->h2d_bytes = P * pb;
  else if (p != FERRY_PLACE_ALL_GPU) c->h2d_bytes = 2 * A * P * pb; /* fwd and bwd fetches */
  if (p != FERRY_PLACE_ALL_GPU) {
    c->d2h_bytes = A * P * pb;
    /* a bf16 master whose params live on the device: the step reads them back */
    if (plan_bf16_master(in) && x.ph == FERRY_PLAN_GPU) c->d2h_bytes += P * pb;
    /* + the drained grads summed into the accumulator (first micro-batch
     * writes it, later ones read and write it); the step updates this
     * rank's share, and from stage 2 the accumulator is a share too */
    double accum = x.sg == 1 ? P * (A * (pb + x.gb) + (A - 1) * x.gb)
                             : P * A * pb + P * x.sg * (A * x.gb + (A - 1) * x.gb);
    c->cpu_bytes = P * x.so * opt_bytes + (none ? 0 : accum);
  }
  plan_nvme_traffic(in, &x, c);
  comm_bytes(in, &x, c);
  /* a node's CPU memory bandwidth and NVMe drives serve its `gpus` ranks */
  double share = (double)in->gpus;
  c->seconds[FERRY_COMP_COMPUTE] = c->flops / (tflops * 1e12);
  if (p == FERRY_PLACE_ALL_GPU) /* the step runs on the GPU after backward, not overlapped;
                                  on the host backend the CPU runs it */
    c->seconds[FERRY_COMP_COMPUTE] +=
        P * x.so * opt_bytes /
        ((in->device == FERRY_PLAN_DEV_HOST ? in->bw.cpu_optimizer_gbps : in->bw.device_mem_gbps) *
         1e9);
  c->seconds[FERRY_COMP_H2D] = c->h2d_bytes / (in->bw.h2d_gbps * 1e9);
  c->seconds[FERRY_COMP_D2H] = c->d2h_bytes / (in->bw.d2h_gbps * 1e9);
  c->seconds[FERRY_COMP_CPU] = share * c->cpu_bytes / (in->bw.cpu_optimizer_gbps * 1e9);
  /* reads and writes share the drive: their times add (bench/README.md,
   * "The NVMe figures"; the write figure is a rewrite's, as a step's is) */
  c->seconds[FERRY_COMP_NVME] = share * (c->nvme_read_bytes / (in->bw.nvme_read_gbps * 1e9) +
                                         c->nvme_write_bytes / (in->bw.nvme_write_gbps * 1e9));
  c->seconds[FERRY_COMP_NET] = c->comm_seconds;
  int64_t groups = ferry_plan_groups(m);
  double lane[FERRY_COMPONENTS];
  cpu_lanes(in, c->seconds, lane);
  c->step_seconds = pipeline_step(lane, groups, -1, &c->bottleneck, &c->fill_seconds);
  c->backward_io_seconds = 0;
  if (in->device == FERRY_PLAN_DEV_HOST && none && c->seconds[FERRY_COMP_NVME] > 0) {
    /* never past every component one after the other */
    double sum = 0;
    for (int k = 0; k < FERRY_COMPONENTS; k++) sum += c->seconds[k];
    double two = fmin(sum, phase_step(in, c, 2 / fwd_bwd, groups));
    c->backward_io_seconds = fmax(0, two - c->step_seconds);
    c->step_seconds += c->backward_io_seconds;
  }
  if (in->device == FERRY_PLAN_DEV_HOST && c->bottleneck == FERRY_COMP_COMPUTE) /* the CPU lane's largest */
    for (int k = FERRY_COMP_H2D; k <= FERRY_COMP_CPU; k++)
      if (c->seconds[k] > c->seconds[c->bottleneck]) c->bottleneck = k;
  /* communication overlaps compute and the optimizer: what it adds to the
   * step is the part not hidden */
  double alone = pipeline_step(lane, groups, FERRY_COMP_NET, NULL, NULL);
  c->comm_exposed_seconds = c->comm_seconds > 0 ? c->step_seconds - alone : 0;
  c->comm_hidden_fraction =
      c->comm_seconds > 0 ? 1 - c->comm_exposed_seconds / c->comm_seconds : 1;
}
