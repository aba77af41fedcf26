/* plan/plan.h — the memory planner inside the library: model descriptions
 * (presets with exact parameter counts, Hugging Face config.json of the GPT-2
 * and Llama families), bytes per family and tier for every candidate
 * placement, a step-time model from bandwidths, and the profile format that
 * `ferry bench all` writes. Pure arithmetic, no I/O except reading a named
 * file; never prints. docs/PLANNING.md has the formulas.
 */
#ifndef FERRY_PLAN_PLAN_H
#define FERRY_PLAN_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "plan/gpt_layout.h"

/* ---- models ------------------------------------------------------------- */

typedef enum {
  FERRY_ARCH_GPT2 = 0,  /* learned positions, LayerNorm with bias, GELU MLP 4h, biases */
  FERRY_ARCH_LLAMA = 1, /* RMSNorm, RoPE, SwiGLU, grouped-query attention, no biases */
  FERRY_ARCH_DENSE = 2  /* --params N: a Llama-shaped model of exactly N parameters */
} ferry_plan_arch;

typedef struct {
  char name[64];
  ferry_plan_arch arch;
  int64_t vocab, hidden, ffn, layers, heads, kv_heads, head_dim, positions;
  int tied;      /* input embedding and LM head share one matrix */
  int qkv_bias;  /* Llama family: q/k/v projections have biases (Qwen2) */
  int o_bias;    /* Llama family: attention_bias also biases o_proj */
  int mlp_bias;  /* Llama family: mlp_bias */
  uint64_t params_override; /* FERRY_ARCH_DENSE: the count the user gave */
} ferry_plan_model;

int ferry_plan_preset_count(void);
const char *ferry_plan_preset_name(int i);
/* The published parameter count of preset i (what Hugging Face reports). */
uint64_t ferry_plan_preset_published(int i);
/* FERRY_ENOENT (with the list of names in `why`) for an unknown name. */
int ferry_plan_model_preset(const char *name, ferry_plan_model *out, char *why, size_t wl);
/* A Hugging Face config.json held in memory (strict JSON; unknown keys of the
 * config are allowed, missing required ones are errors naming the key). */
int ferry_plan_model_from_json(const char *text, size_t len, const char *name,
                               ferry_plan_model *out, char *why, size_t wl);
int ferry_plan_model_from_file(const char *path, ferry_plan_model *out, char *why, size_t wl);
/* A dense Llama-shaped stand-in with exactly n parameters (shape from
 * hidden = 128 * layers, used only for activations and group sizes). */
int ferry_plan_model_from_params(uint64_t n, ferry_plan_model *out, char *why, size_t wl);

uint64_t ferry_plan_model_params(const ferry_plan_model *m);
/* Parameters of one transformer block, of the embedding group and of the
 * head group (final norm, plus the LM head when it is not tied). */
uint64_t ferry_plan_block_params(const ferry_plan_model *m);
uint64_t ferry_plan_embed_params(const ferry_plan_model *m);
uint64_t ferry_plan_head_params(const ferry_plan_model *m);
/* The largest group: the unit the engine fetches and releases. */
uint64_t ferry_plan_largest_group(const ferry_plan_model *m);
int64_t ferry_plan_groups(const ferry_plan_model *m);

/* ---- hardware numbers ----------------------------------------------------- */

/* Bandwidths in 1e9 bytes per second, compute in 1e12 FLOP/s. */
typedef struct {
  double h2d_gbps, d2h_gbps;
  double nvme_read_gbps, nvme_write_gbps;
  double cpu_optimizer_gbps;  /* memory traffic the CPU optimizer sustains */
  double device_tflops;       /* dense 16-bit matmul throughput reached in training */
  double device_tflops_fp32;
  double device_mem_gbps;     /* device memory bandwidth (optimizer on the GPU) */
  unsigned measured;          /* FERRY_PLAN_BW_* bits that came from a profile */
} ferry_plan_bandwidth;

enum {
  FERRY_PLAN_BW_H2D = 1u << 0,
  FERRY_PLAN_BW_D2H = 1u << 1,
  FERRY_PLAN_BW_NVME_READ = 1u << 2,
  FERRY_PLAN_BW_NVME_WRITE = 1u << 3,
  FERRY_PLAN_BW_CPU_OPT = 1u << 4,
  FERRY_PLAN_BW_TFLOPS = 1u << 5,
  FERRY_PLAN_BW_TFLOPS32 = 1u << 6,
  FERRY_PLAN_BW_DEVMEM = 1u << 7
};

/* The documented defaults (docs/PLANNING.md), measured = 0. */
ferry_plan_bandwidth ferry_plan_bandwidth_default(void);
/* The profile key of bit b and its default's justification. */
const char *ferry_plan_bandwidth_key(unsigned bit);
const char *ferry_plan_bandwidth_source(unsigned bit);
/* The figure of bit b in *bw (0 for an unknown bit). */
double ferry_plan_bandwidth_value(const ferry_plan_bandwidth *bw, unsigned bit);
/* Reads a profile (docs/PLANNING.md, "Profile file") over *bw. Unknown keys,
 * wrong types and values <= 0 are refused with the key named. */
int ferry_plan_profile_parse(const char *text, size_t len, const char *name,
                             ferry_plan_bandwidth *bw, char *why, size_t wl);
int ferry_plan_profile_load(const char *path, ferry_plan_bandwidth *bw, char *why, size_t wl);

/* ---- the plan ------------------------------------------------------------- */

typedef enum { FERRY_PLAN_GPU = 0, FERRY_PLAN_HOST = 1, FERRY_PLAN_NVME = 2 } ferry_plan_tier;
#define FERRY_PLAN_TIERS 3

typedef enum {
  FERRY_FAM_PARAMS = 0, /* compute-precision params (16-bit, or fp32) */
  FERRY_FAM_GRADS,      /* fp32 accumulation, plus 16-bit device grad buffers */
  FERRY_FAM_MASTER,     /* fp32 master weights */
  FERRY_FAM_OPTIM,      /* optimizer states */
  FERRY_FAM_ACT,        /* activations kept for backward */
  FERRY_FAM_BUFFERS,    /* transfer and pinned staging buffers */
  FERRY_FAM_WORKSPACE,  /* runtime and backward scratch */
  FERRY_FAM_SWAP,       /* host: the NVMe homes' working set in the pool */
  FERRY_PLAN_FAMILIES
} ferry_plan_family;

typedef enum {
  FERRY_PLACE_ALL_GPU = 0,   /* everything on the device, optimizer on the GPU */
  FERRY_PLACE_ZERO_OFFLOAD,  /* params on device; grads + optimizer on host */
  FERRY_PLACE_ZERO3_OFFLOAD, /* params streamed from host per group */
  FERRY_PLACE_NVME_OPT,      /* params from host; master + states on NVMe */
  FERRY_PLACE_INFINITY,      /* params and master + states on NVMe */
  FERRY_PLACEMENTS
} ferry_plan_placement;

typedef enum { FERRY_PREC_FP32 = 0, FERRY_PREC_FP16 = 1, FERRY_PREC_BF16 = 2 } ferry_plan_prec;

/* Where a placement's gradients live (the engine's placement.grads as
 * "auto" resolves it; docs/PLANNING.md, "Gradient homes"). */
typedef enum {
  FERRY_PLAN_GRADS_GPU = 0,  /* fp32 (or bf16) accumulators on the device */
  FERRY_PLAN_GRADS_HOST = 1, /* accumulators in host RAM, the whole model */
  FERRY_PLAN_GRADS_NVME = 2, /* accumulators on NVMe, one group at a time in RAM */
  FERRY_PLAN_GRADS_NONE = 3  /* no accumulator: a group's grads live only in staging */
} ferry_plan_grads;

/* The device the engine runs on: a CUDA GPU, or the host backend's emulated
 * GPU (its device budget is host RAM; the CPU model computes in fp32). */
typedef enum { FERRY_PLAN_DEV_CUDA = 0, FERRY_PLAN_DEV_HOST = 1 } ferry_plan_device;

/* Constants of the RSS prediction (docs/PLANNING.md, "Peak RSS"). */
#define FERRY_PLAN_LIBRARY_OVERHEAD (64ull << 20) /* ferry's code, threads, tables */
#define FERRY_PLAN_CUDA_HOST_BYTES (512ull << 20) /* CUDA context + cuBLAS, host side */

typedef struct {
  ferry_plan_model model;
  int64_t batch, seq;
  int precision;       /* ferry_plan_prec (the config's precision.params order) */
  int optimizer;       /* ferry_optim_type */
  int checkpointing;   /* keep one input per block, recompute in backward */
  int flash_attention; /* 1: no S x S scores kept (fused attention) */
  uint64_t budget[FERRY_PLAN_TIERS];
  uint64_t chunk_size; /* families are reserved in whole chunks; 0 = exact bytes */
  ferry_plan_bandwidth bw;
  int64_t grad_accumulation; /* micro-batches per optimizer step (>= 1) */
  double clip_grad_norm;     /* 0 = off; > 0 keeps gradients for the global norm */
  int grad_precision;        /* FERRY_PREC_FP32 or FERRY_PREC_BF16: accumulator bytes 4 or 2 */
  int device;                /* ferry_plan_device */
  /* Compact optimizer state (the engine's optimizer.state_dtype,
   * optimizer.state_block, precision.master): the optimizer family's bytes
   * and the CPU pass's traffic come from ferry_optimizer_state_bytes and
   * ferry_optimizer_bytes_per_param (include/ferry/optim.h). */
  int state_dtype;           /* FERRY_DT_F32 (0 reads as it), FERRY_DT_BF16, FERRY_DT_I8 */
  int64_t state_block;       /* int8: elements per absmax, a power of two 32..4096; 0 = 256 */
  int master_dtype;          /* FERRY_DT_F32 (0 reads as it) or FERRY_DT_BF16: the bf16
                                params are the master (needs precision bf16) */
  /* Data parallelism (docs/PLANNING.md, "Data parallelism"): `gpus` ranks
   * on each of `nodes` nodes, N = gpus * nodes ranks; batch is per rank and
   * every byte and second of a candidate is one rank's. budget[] is one
   * rank's (the CLI divides a node's RAM and NVMe between its ranks). */
  int gpus, nodes;           /* >= 1 each */
  int zero_stage;            /* dist.zero_stage: 0 replicate, 1 shard master and states,
                                2 also grads, 3 also params (default 2) */
  int rank;                  /* the rank whose bytes are planned (0 to N - 1); -1 (the
                                default): per family, the rank holding the most of it */
  double net_gbps;           /* inter-node bandwidth per node, Gb/s (bits; default 100) */
  double intra_gbps;         /* between a node's GPUs, Gb/s (bits); 0 = the PCIe figure,
                                8 * h2d_gbps */
  uint64_t host_ram;         /* --device host: the machine's RAM, which holds the CPU
                                model's activations beside both budgets (the largest
                                batch keeps the peak RSS within it); 0 = unknown: the
                                activations are held to the device budget instead */
} ferry_plan_input;

/* Past this many ranks a sharded family's bytes per rank are estimated
 * (the family's bytes / N); up to it they are the engine's partition's
 * (core/part.h), each rank's pieces packed as the engine packs them. */
#define FERRY_PLAN_EXACT_RANKS 1024

/* Defaults: batch 1, seq 1024, bf16, adamw, checkpointing on, flash
 * attention (ferry-gpt's CUDA model), chunk 64 MiB, default bandwidths, budgets 0, no accumulation,
 * no clipping, fp32 gradient accumulators, a CUDA device, fp32 states
 * (block 256), an fp32 master, and one rank (1 GPU, 1 node) at ZeRO
 * stage 2 with a 100 Gb/s network. */
ferry_plan_input ferry_plan_input_default(void);

/* The compute rate (TFLOP/s) the step-time model divides a step's FLOPs by:
 * device_tflops_fp32 for fp32 params and on the host backend, else
 * device_tflops; *bit (when given) names which (FERRY_PLAN_BW_TFLOPS*). */
double ferry_plan_compute_tflops(const ferry_plan_input *in, unsigned *bit);

/* FERRY_COMP_NET: the collectives between ranks (0 with one rank). */
enum { FERRY_COMP_COMPUTE = 0, FERRY_COMP_H2D, FERRY_COMP_D2H, FERRY_COMP_CPU, FERRY_COMP_NVME,
       FERRY_COMP_NET, FERRY_COMPONENTS };

/* The process's peak RSS (docs/PLANNING.md, "Peak RSS"). */
typedef struct {
  uint64_t host_budget;   /* the pool and staging, reserved once at finalize */
  uint64_t device_budget; /* --device host: the emulated device is host RAM */
  uint64_t activations;   /* --device host: the CPU model's activations and backward scratch */
  uint64_t scratch;       /* the trainer's host scratch (token ids; fp32 slots on the CPU) */
  uint64_t library;       /* FERRY_PLAN_LIBRARY_OVERHEAD */
  uint64_t cuda;          /* --device cuda: FERRY_PLAN_CUDA_HOST_BYTES */
  uint64_t total;
} ferry_plan_rss;

/* NVMe bytes per optimizer step, per engine family (params, grads, optimizer). */
enum { FERRY_PLAN_NV_PARAMS = 0, FERRY_PLAN_NV_GRADS, FERRY_PLAN_NV_OPTIM, FERRY_PLAN_NV_FAMILIES };

typedef struct {
  int placement;
  int grads;                           /* ferry_plan_grads, resolved as "auto" does */
  uint64_t bytes[FERRY_PLAN_TIERS][FERRY_PLAN_FAMILIES];
  uint64_t tier_bytes[FERRY_PLAN_TIERS];
  uint64_t short_by[FERRY_PLAN_TIERS]; /* bytes over budget, 0 when within */
  uint64_t pinned_bytes;               /* host bytes that are page-locked */
  int fits;
  char why[256];                       /* "fits", or which tiers are short by how much */
  /* traffic per step */
  double h2d_bytes, d2h_bytes, nvme_read_bytes, nvme_write_bytes, cpu_bytes, flops;
  double seconds[FERRY_COMPONENTS];
  double fill_seconds, step_seconds;
  double backward_io_seconds;          /* host backend, step during backward: what the step adds
                                          because the optimizer's NVMe traffic runs in backward
                                          only (and, with no read-ahead, waits on each group's
                                          update); included in step_seconds */
  int bottleneck;                      /* FERRY_COMP_* */
  int64_t max_batch;                   /* largest batch that fits at this seq; 0 = none */
  uint64_t readahead_bytes;            /* the next group's NVMe optimizer chunks (not in the fit) */
  int readahead_fits;                  /* the host pool has room for them beside the rest
                                          and the device pool's host copies (the engine's rule) */
  uint64_t nvme_file_bytes;            /* the NVMe swap files: the NVMe-homed chunks and a spare
                                          per family of its largest; the NVMe fit holds
                                          these against the budget, not the data */
  ferry_plan_rss rss;
  uint64_t home_bytes[FERRY_PLAN_NV_FAMILIES]; /* params, grads, optimizer: each family's
                                          bytes in its home tier, its chunks as the engine
                                          packs them (ferry-gpt's model states line; one
                                          rank's); 0 for grads "none" */
  double nvme_read[FERRY_PLAN_NV_FAMILIES], nvme_write[FERRY_PLAN_NV_FAMILIES];
  int64_t cached_groups_host;          /* NVMe params: groups the host pool keeps at a turn */
  int64_t cached_groups_device;        /* ... and the device pool (also in the host: inclusive) */
  double optim_bytes_per_param;        /* ferry_plan_optim_bytes_per_param */
  double step_bytes_per_param;         /* ferry_plan_step_bytes_per_param */
  /* communication per rank and step (ring collectives; 0 with one rank):
   * grads reduced (all-reduce at stage 0, reduce-scatter from 1), params
   * all-gathered after the step (stages 1, 2) or at each fetch (3) */
  double comm_grad_bytes, comm_param_bytes, comm_bytes;
  double comm_link_gbps;               /* the slowest link of the ring, Gb/s; 0 alone */
  double comm_seconds;                 /* = seconds[FERRY_COMP_NET] */
  double comm_exposed_seconds;         /* step_seconds less the step without communication */
  double comm_hidden_fraction;         /* 1 - exposed / comm_seconds; 1 when there is none */
} ferry_plan_candidate;

typedef struct {
  uint64_t params;
  int ranks;       /* gpus * nodes */
  uint64_t largest_group;
  int64_t groups;
  /* 1: the families' bytes are estimated (a model known by its count
   * alone, or sharded over more than FERRY_PLAN_EXACT_RANKS ranks); 0:
   * each rank's tensors packed as the engine packs them */
  int bytes_estimated;
  ferry_plan_candidate cand[FERRY_PLACEMENTS];
  int recommended; /* the fastest that fits; -1 when none */
  int closest;     /* when none fits: the one short by the fewest bytes */
} ferry_plan_result;

const char *ferry_plan_placement_name(int p);
const char *ferry_plan_placement_desc(int p);
/* Config values of a placement: "gpu"/"host"/"nvme" for params, grads, optimizer.
 * `grads` is the home when gradients are kept (clipping, fp16, accumulation);
 * the candidate's `grads` field says what "auto" resolves to for an input. */
void ferry_plan_placement_tiers(int p, const char **params, const char **grads,
                                const char **optimizer);
/* "gpu", "host", "nvme" or "none" (placement.grads). */
const char *ferry_plan_grads_name(int g);
/* The engine's placement.grads = "auto" for placement p and this input. */
int ferry_plan_grads_auto(const ferry_plan_input *in, int p);
const char *ferry_plan_family_name(int f);
const char *ferry_plan_tier_name(int t);
const char *ferry_plan_component_name(int c);
const char *ferry_plan_precision_name(int prec);
const char *ferry_plan_optimizer_name(int opt);
/* Number of optimizer states per parameter (adam/adamw/lamb 2, others 1). */
int ferry_plan_optimizer_states(int opt);
/* "fp32", "bf16", "int8" (optimizer.state_dtype, precision.master); NULL
 * for another dtype. */
const char *ferry_plan_dtype_name(int dt);
/* The optimizer family's bytes per parameter: the fp32 master (none when
 * the params are the master) plus each state at its dtype, int8 with its
 * absmax share; placement p, as the master may need a host copy. */
double ferry_plan_optim_bytes_per_param(const ferry_plan_input *in, int p);
/* Bytes the CPU (or GPU) optimizer pass moves per parameter and step:
 * ferry_optimizer_bytes_per_param for this input's states, master, the
 * gradient it reads and the param copy it writes. */
double ferry_plan_step_bytes_per_param(const ferry_plan_input *in, int p);
/* The optimizer family (the master when there is one, then each state) of
 * groups of these parameter counts as placement p lays it out on NVMe, each
 * group's tensors rounded to 4 KiB: the bytes a step reads, and writes back,
 * with the optimizer on NVMe (used for the model's groups, and by `ferry
 * bench step` for its synthetic model's); with ranks (in->gpus, in->nodes)
 * at in->zero_stage >= 1, one rank's share of each group. */
double ferry_plan_optim_nvme_bytes(const ferry_plan_input *in, int p, const uint64_t *group_params,
                                   size_t ngroups);

/* Validates the input (FERRY_EINVAL with the reason) and fills `out`. A plan
 * in which nothing fits is still a success: see out->recommended. */
int ferry_plan_compute(const ferry_plan_input *in, ferry_plan_result *out, char *why, size_t wl);
/* ferry-gpt's CUDA block for in's model and micro-batch (plan/gpt_layout.h):
 * 1 when the plan counts its activations and workspace from it (a GPU, flash
 * attention, head_dim = hidden / heads), else 0 (the formulas apply). */
int ferry_plan_gpt_layout(const ferry_plan_input *in, ferry_gpt_layout *out);
/* Beside that layout (which holds the cuBLAS workspace), in the plan's
 * workspace: the cuBLAS handle's own device memory and allocator slack
 * (not yet measured on a GPU). */
#define FERRY_PLAN_CUDA_RUNTIME ((uint64_t)64 << 20)

/* The largest dense Llama-shaped model (ferry_plan_model_from_params) that
 * fits in->budget: a search over the parameter count, doubling from 1M and
 * then bisecting geometrically until the next size up is within
 * `resolution` (0.01 = 1%) and does not fit. in->model is ignored. On
 * success out->params is the answer and `fit` its plan, `next` the plan of
 * the size `resolution` larger (which does not fit); out->params = 0 when
 * not even 1000 parameters fit. */
typedef struct {
  uint64_t params;   /* the largest that fits; 0 = none */
  uint64_t next;     /* the next size up, which does not fit */
  ferry_plan_input in; /* the input with the model found */
  ferry_plan_result fit, above;
  int evaluations;   /* plans computed */
} ferry_plan_largest_result;
int ferry_plan_largest(const ferry_plan_input *in, double resolution,
                       ferry_plan_largest_result *out, char *why, size_t wl);

/* DeepSpeed's published estimators of model-state bytes on one GPU
 * (estimate_zero2_model_states_mem_needs / estimate_zero3_..., one node, one
 * GPU, zero_init on): stage 2 or 3, offload_optimizer cpu or not,
 * offload_param cpu or not (stage 3 only), with additional_buffer_factor
 * `abf` (DeepSpeed's default 1.5) applied to the CPU figure. */
void ferry_plan_deepspeed_estimate(int stage, int offload_optimizer, int offload_params,
                                   uint64_t params, uint64_t largest_layer, double abf,
                                   double *gpu_bytes, double *cpu_bytes);

#endif
