/* offload/engine_state.h — the engine's own state: struct ferry_engine,
 * the frame each room's state sits in (e->gt, e->drain, e->stepper, e->gpu,
 * e->ranks, each declared in its room's header), the buffer counts, and
 * the predicates on the placement every room reads. The rooms use it; it
 * uses none of them (a member that embeds a room's struct is that room's
 * slot). Included through offload/engine_impl.h.
 */
#ifndef FERRY_OFFLOAD_ENGINE_STATE_H
#define FERRY_OFFLOAD_ENGINE_STATE_H

#include "memory/memory.h"
#include "nvme/nvme.h"
#include "format/config.h"
#include "format/timeline.h"

#include <pthread.h>

#define ENGINE_GRAD_SLOTS 2   /* device grad buffers in flight (backward / drain) */
#define ENGINE_STAGE_SLOTS 2  /* pinned buffers for param uploads */
#define ENGINE_DRAIN_STAGES 2 /* pinned buffers for grad downloads (one copying, one summed) */
#define ENGINE_GATHER_SLOTS 4 /* ZeRO stage 3: device buffers of gathered params (fetched groups)  \
                               */
/* The stochastic-rounding seed of a bf16 master (precision.master): fixed,
 * so runs repeat and resume bit for bit (the counter is the step and each
 * element's index in registration order, eng_param.gindex). */
#define ENGINE_SR_SEED 0x6665727279535231ull

#include "offload/group.h"
#include "offload/gpu.h"
#include "offload/stepper.h"
#include "offload/drain.h"
#include "offload/ranks.h"
#include "offload/marks.h"

/* The loop's hold on a group it fetched (loop). */
typedef struct {
  ferry_stream *stream;  /* the stream of its current fetch */
  int grad_slot;         /* the drain's device grad buffer it holds, -1 none */
} eng_fetch;

/* ---- the engine ------------------------------------------------------------ */

struct ferry_engine {
  /* (fixed) */
  ferry_config *cfg;
  const ferry_config_values *cv;
  ferry_logger log;
  ferry_device *dev;
  int own_dev;
  int finalized;     /* (loop) */
  ferry_dtype dtype; /* of params and device grads */
  size_t esize;      /* bytes per param element */
  ferry_tier param_home, grad_home, optim_home;
  int grads_none;        /* placement.grads "none": no accumulator (grad_home says host) */
  ferry_dtype grad_dtype; /* of the accumulators (none: of the staged grads, e->dtype) */
  int nstates;       /* optimizer states per element (0, 1, 2) */
  int master_bf16;   /* precision.master = bf16: no master tensor, the params are the master */
  ferry_optimizer_config ocfg; /* the optimizer's configuration (finalize) */
  int eager;         /* update each group as soon as its grads are final */
  int gpu_math;      /* engine_gpu_math */
  size_t setup_zeroed; /* bytes finalize zeroed itself (engine_setup_zeroed_bytes) */
  int dynamic_scale;
  float fixed_scale;
  ferry_mem *mem;    /* thread-safe */
  ferry_swap *swap;  /* thread-safe */
  ferry_optimizer *opt;    /* (stepper) */
  ferry_stream *up, *down; /* param uploads (stepper), grad downloads (drain) */
  size_t host_pool;        /* (fixed) the manager's host budget: tiers.host.budget less staging
                            * (0 when the staging takes it all: finalize then refuses) */
  uint64_t host_budget;    /* (fixed) tiers.host.budget as resolved (default: 80% of RAM) */
  int optim_ahead;         /* (fixed) the stepper reads the next group's optimizer state ahead:
                              the pool has room for it beside the working set (or no NVMe) */
  size_t dev_pool;          /* (fixed) the manager's device budget */
  size_t param_ahead;      /* (fixed) NVMe params: groups the loop may read ahead (host room) */
  size_t reserve_bytes;    /* (loop) ferry_engine_reserve: the caller's share of the budget */
  void *reserved;          /* (fixed) its device block, allocated at finalize */
  int (*cancel)(void *user); /* (loop) ferry_engine_set_cancel: asked during finalize */
  void *cancel_user;
  ferry_timeline tl;       /* thread-safe */
  double copy_t0[2];       /* (the manager's copy hook, in stream order) */
  ferry_errbuf err;        /* any thread: the last failure's message */

  pthread_mutex_t mu;
  /* the rooms' own state, each declared in its room's header */
  eng_groups gt;       /* group.h */
  eng_drain drain;     /* drain.h */
  eng_stepper stepper; /* stepper.h */
  eng_gpu gpu;         /* gpu.h */
  eng_ranks ranks;     /* ranks.h */
  eng_marks marks;     /* marks.h */

  /* Ranks (ferry_engine_set_comm; comm/). comm: the caller's (loop, before
   * finalize). The rank figures and the channels are the engine's shape,
   * set by ranks_setup at finalize (fixed). Channels (NULL alone), one per
   * thread, dup'ed in this order on every rank: the loop's (fingerprints, norm,
   * param reads), the drain's (grads), the stepper's (new params). */
  ferry_comm *comm;
  ferry_comm *ch_loop, *ch_drain, *ch_step;
  int nranks, rank; /* (fixed) 1 and 0 alone */
  int zero_stage;   /* (fixed) dist.zero_stage with ranks; 0 alone */
  int ckpt_phases;  /* (loop) checkpoint.c: a sharded save's gathered parts (params, optim) */

  /* (loop) the step driver and the loop's fetches */
  ferry_loss_scaler scaler;
  int64_t steps;       /* (loop writes under mu) optimizer steps taken */
  size_t fetches;      /* ferry_fetch calls since the last step */
  int tracing;         /* recording the first step's fetch order */
  uint32_t *trace;     /* the loop's fetches of the first step (groups) */
  int *trace_fam;
  size_t ntrace, captrace;
  eng_fetch *fetch;    /* (loop) per group, allocated at finalize */
};

/* The tier where the CPU (or the device, for device homes) works on a
 * family: its home, or host when the home is NVMe. */
static inline ferry_tier work_tier(ferry_tier home) {
  return home == FERRY_TIER_NVME ? FERRY_TIER_HOST : home;
}

/* Which kernels do the arithmetic on grads and optimizer state: 1 when both
 * live on a real GPU (placement.optimizer = "gpu" on cuda: CUDA kernels on
 * e->down, gpu.c), 0 for the CPU kernels (host memory, or the host
 * backend's emulated device memory, which the CPU reads). Set once at
 * create; the only choice between the paths. Everything around the leaf
 * operations (which groups, their order, their states) is the same code. */
static inline int engine_gpu_math(const ferry_engine *e) { return e->gpu_math; }

/* Which pinned staging buffers the engine allocates (outside the manager,
 * out of tiers.host.budget): the drain's two on the CPU path (device math
 * sums on the GPU); the two upload buffers for device-home params on the
 * CPU path; the param commit buffer for host and NVMe param homes. */
static inline int engine_drain_staged(const ferry_engine *e) { return !e->gpu_math; }
static inline int engine_upload_staged(const ferry_engine *e) {
  return e->param_home == FERRY_TIER_DEVICE && !e->gpu_math;
}

/* With ranks at ZeRO stage >= 1: master and optimizer state are pieces. */
static inline int engine_sharded(const ferry_engine *e) {
  return e->nranks > 1 && e->zero_stage >= 1;
}
/* The grad accumulators are pieces (stage 2 with ranks). */
static inline int engine_grads_sharded(const ferry_engine *e) {
  return e->nranks > 1 && e->zero_stage >= 2;
}
/* The params are pieces too, gathered at fetch (stage 3 with ranks). */
static inline int engine_params_sharded(const ferry_engine *e) {
  return e->nranks > 1 && e->zero_stage >= 3;
}

#endif
