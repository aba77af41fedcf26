/* offload/engine_impl.h — the engine's private structures and the calls
 * between its rooms. Each room is one file and calls go one way:
 *
 *   checkpoint_*.c ─> engine_walk.h (engine_walk.c, engine.c, ranks.c)
 *                     engine.c ─┐
 *                     step.c ───┼─> drain.c ─> stepper.c ─> group.c ─> gpu.c
 *                               └─ (every room may call group.c and gpu.c)
 *
 *   group.c    the group table: parameters, groups, their tensors in the
 *              memory manager, each group's update state
 *   stepper.c  the update worker (the stepper thread) and its queue
 *   drain.c    the gradient drain (the drain thread), device grad buffers
 *   step.c     the ferry_step driver: norm, scaling, queueing the updates
 *   engine.c   create, finalize, fetch/release, quiesce/restore
 *   engine_walk.c  the checkpoints' view of the engine (engine_walk.h)
 *   ranks.c    the ranks (ZeRO): channels, fingerprints, the global norm,
 *              stage 3's gathers at fetch; called by engine.c, step.c and
 *              the checkpoints (ranks_agree), calls group.c (the drain
 *              and the stepper use their own channels)
 *   gpu.c      the leaf operations on grads and optimizer state that live
 *              on a real GPU (CUDA kernels, copies); below group.c, every
 *              room may call it and it calls no other
 *
 * Threads: the loop (the caller of the public API), the drain thread and
 * the stepper thread. One mutex, `mu`, guards every field marked (mu); a
 * field marked (loop), (drain) or (stepper) is touched by that thread only;
 * (fixed) fields are written by create/finalize before the threads start
 * and only read afterwards.
 */
#ifndef FERRY_ENGINE_IMPL_H
#define FERRY_ENGINE_IMPL_H

#include "memory/memory.h"
#include "nvme/nvme.h"
#include "format/config.h"
#include "format/timeline.h"
#include "offload/engine_walk.h"

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

/* ---- group.c: the group table -------------------------------------------- */

typedef struct { /* (fixed) */
  char *name;
  int64_t shape[FERRY_MEM_MAX_DIMS];
  int ndim;
  size_t n;
  uint32_t group;
  const float *values;
  ferry_init_fn init;
  void *init_user;
  uint32_t id[FERRY_ROLE_COUNT]; /* memory manager ids per role (UINT32_MAX: none) */
  size_t goff;                   /* element offset within its group */
  uint64_t gindex;               /* element offset in the model, registration order (the
                                    stochastic-rounding index of a bf16 master) */
  size_t state_bytes;            /* bytes of one optimizer state of its piece
                                    (ferry_optimizer_state_bytes of pn) */
  /* This rank's piece (ZeRO stage >= 1 with ranks; else plo = 0, pn = n):
   * elements [plo, plo + pn) of the param, whose master, optimizer states
   * and (stage 2) grad accumulator are tensors of pn elements; pn = 0: no
   * tensor of those roles. */
  size_t plo, pn;
} eng_param;

/* A group's optimizer update, from its grads being final to its new params
 * being where the next fetch finds them. Transitions (group_set_state):
 *   IDLE ─queue─> QUEUED ─done─> UPDATED ─committed─> IDLE
 *   QUEUED ─failed─> FAILED ─retried by ferry_step─> QUEUED
 * A group is fetched only in IDLE or FAILED (FAILED: fetch reports it). */
typedef enum {
  GROUP_IDLE = 0,    /* params current */
  GROUP_QUEUED = 1,  /* its update is queued or running */
  GROUP_UPDATED = 2, /* updated; the new params are not committed yet */
  GROUP_FAILED = 3,  /* the update failed before changing anything (fail_status) */
  GROUP_STATE_COUNT
} group_state;

typedef struct {
  uint32_t first, count; /* (fixed) indices into by_group */
  size_t n;              /* (fixed) elements */
  ferry_event *uploaded; /* (fixed) the step's upload of a device-home group's params */
  int fetched;           /* (mu) holds on the device params */
  group_state state;     /* (mu) group_set_state */
  int fail_status;       /* (mu) the status of a FAILED update */
  ferry_stream *stream;  /* (loop) stream of the current fetch */
  int grad_slot;         /* (loop) device grad buffer held, -1 none */
  /* NVMe grad home: the accumulator counts as zero (set at finalize and by
   * group_zero_grads instead of writing zeros; the drain's next
   * accumulation fetches it without a load). (the drain and the stepper or
   * the loop: ordered by the group's update state and drain_wait) */
  int grads_zero;
  int grad_stage;        /* (mu) grads "none": the drain stage lent to its update, -1 none */
  int gslot;             /* (loop) ZeRO stage 3: the gather buffer holding its params, -1 none */
  /* The partition (fixed): rank r owns the group's elements [bounds[r],
   * bounds[r+1]) (nranks + 1 entries); this rank [lo, hi). One rank or
   * stage 0: lo = 0, hi = n. */
  size_t *bounds;
  size_t lo, hi;
  double sumsq;          /* (drain; the loop after drain_wait) of the accumulated grads
                            (stages 1 and 2 with ranks: of this rank's range) */
  int nonfinite;         /*   (last micro-batch) */
} eng_group;

typedef struct {
  eng_param *params;  /* (fixed) in registration order */
  size_t nparams, capparams;
  uint32_t *by_group; /* (fixed) param indices sorted by (group, registration) */
  eng_group *groups;
  uint32_t ngroups;
  size_t max_group_n; /* (fixed) elements of the largest group */
  size_t max_count;   /* (fixed) params of the group with most */
} eng_groups;

/* ---- drain.c: the gradient drain --------------------------------------- */

typedef struct {
  void *dev;             /* (fixed) device buffer (param dtype) */
  ferry_event *ready;    /* (fixed) backward's writes done (recorded by grads_ready) */
  ferry_event *drained;  /* (fixed) the last copy out of it done (on e->down) */
  int owner;             /* (mu) group, -1 free */
} eng_grad_slot;

/* A pinned buffer a group's grads are copied into (D2H) and summed from. */
typedef struct {
  void *buf;             /* (fixed) the largest group in param dtype */
  ferry_event *done;     /* (fixed) its D2H done (on e->down) */
  double t0, t1;         /* (e->down's host functions; the drain after `done`) the D2H's span */
  /* (mu) grads "none": 1 + the group whose grads it holds, lent to the
   * stepper until that group's optimizer pass is done (stepper_return_stage);
   * 0: the drain's */
  uint32_t lent;
} eng_drain_stage;

typedef struct {
  uint32_t group;
  int slot;              /* the device grad buffer its grads are in */
  int last;              /* of the step's last micro-batch: its grads become final */
} eng_drain_item;

typedef struct {
  pthread_t thread;
  int started;           /* (loop) */
  pthread_cond_t cv_work, cv_idle, cv_slot; /* with mu */
  /* (mu) groups whose grads are ready, FIFO: [qhead, qissue) are being
   * copied D2H (at most ENGINE_DRAIN_STAGES, item i into stage i % it),
   * [qissue, qtail) wait; qhead moves once a group is summed */
  eng_drain_item *queue;
  size_t qhead, qissue, qtail, qcap;
  int stop;              /* (mu) */
  int stage_wait;        /* (mu) waiting for a stage lent to the stepper */
  int status;            /* (mu) first error of the drain */
  int micro;             /* (mu) micro-batches drained completely this step */
  uint32_t in_micro;     /* (mu) groups drained in the current micro-batch */
  int sub_micro;         /* (mu) the same counts of the groups handed in */
  uint32_t sub_in_micro;
  eng_grad_slot slot[ENGINE_GRAD_SLOTS];
  eng_drain_stage stage[ENGINE_DRAIN_STAGES];
  double d2h_delay;      /* (fixed) tests: a stream sleep before each D2H */
  ferry_optimizer *opt;  /* (drain) one-thread optimizer for accumulation and stats */
  /* With ranks (drain; fixed pointers): pinned fp32 buffers of the largest
   * group (the all-reduce or the reduce-scatter's send) and of the largest
   * range of a rank (the reduce-scatter's receive); counts per rank. */
  float *reduce, *piece;
  size_t *counts;
} eng_drain;

/* ---- stepper.c: the update worker ---------------------------------------- */

typedef struct {
  pthread_t thread;
  int started;           /* (loop) */
  pthread_cond_t cv;     /* with mu: queued / group done / released / stop */
  uint32_t *queue;       /* (mu) groups waiting for their update, FIFO */
  size_t head, tail;
  uint32_t pending;      /* (mu) groups queued or being updated */
  float gscale;          /* (mu) grad scale of the queued updates */
  int64_t cur_step;      /* (mu) steps before the update being applied (bias correction) */
  int status;            /* (mu) first error of an asynchronous step */
  char fail_why[768];    /* (mu) the message of the last failed update (file, offset...),
                          * quoted where the failure is reported later (fetch, save) */
  int stop;              /* (mu) */
  int64_t waits_for;     /* (mu) the group whose release by the loop it waits for, -1 none */
  /* (stepper; finalize's initial values before the thread starts) */
  void *stage_up[ENGINE_STAGE_SLOTS];   /* pinned, the largest group in param dtype */
  ferry_event *stage_up_ev[ENGINE_STAGE_SLOTS];
  void *param_stage;                    /* host/NVMe param homes: the largest group */
  ferry_optim_span *spans;              /* max params of a group */
  void **dsts;                          /* per param of a group: where new params go */
  size_t *counts;                       /* with ranks: bytes per rank of a group's gather */
} eng_stepper;

/* ---- gpu.c: device math ------------------------------------------------------ */

/* What the CUDA path keeps beside the drain and the stepper (allocated at
 * finalize only when engine_gpu_math). */
typedef struct {
  void *stream;          /* (fixed) e->down's cudaStream_t: all device math runs on it */
  double *partials;      /* (fixed) device: the sum of squares' first pass */
  double *dsums;         /* (fixed) device: per drain stage, one sum per param of a group */
  double *hsums;         /* (fixed) pinned: their copies (the drain, after the stage's event) */
  void *params;          /* (fixed) device: a group's new params (host and NVMe param homes) */
} eng_gpu;

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
  ferry_timeline tl;       /* thread-safe */
  double copy_t0[2];       /* (the manager's copy hook, in stream order) */
  ferry_errbuf err;        /* any thread: the last failure's message */

  pthread_mutex_t mu;
  eng_groups gt;
  eng_drain drain;
  eng_stepper stepper;
  eng_gpu gpu;

  /* Ranks (ferry_engine_set_comm; comm/). comm: the caller's (loop, before
   * finalize). Channels (fixed; NULL alone), one per thread, dup'ed at
   * finalize in this order on every rank: the loop's (fingerprints, norm,
   * param reads), the drain's (grads), the stepper's (new params). */
  ferry_comm *comm;
  ferry_comm *ch_loop, *ch_drain, *ch_step;
  int nranks, rank; /* (fixed) 1 and 0 alone */
  int zero_stage;   /* (fixed) dist.zero_stage with ranks; 0 alone */
  /* ZeRO stage 3 (loop; fixed pointers): the params of a fetched group are
   * gathered from every rank's piece through a pinned host buffer into a
   * device buffer (ngather of them, the largest group each) */
  int ngather;
  void *gather_dev[ENGINE_GATHER_SLOTS];
  ferry_event *gather_free[ENGINE_GATHER_SLOTS]; /* the loop's last use (its release) */
  int gather_owner[ENGINE_GATHER_SLOTS];         /* group, -1 free */
  void *gather_host[2];      /* pinned, used in turn: one may hold a read-ahead */
  ferry_event *gather_up[2]; /* each one's last H2D done */
  int gather_turn;           /* the host buffer the next gather uses */
  size_t *gather_counts;
  /* the read-ahead along the trace: the gather of the next group (-1
   * none), started by a fetch, into gather slot ahead_slot through host
   * buffer ahead_host; the fetch of that group waits for it */
  int ahead_group, ahead_slot, ahead_host;
  ferry_comm_req *ahead_req;

  /* (loop) the step driver and the loop's fetches */
  ferry_loss_scaler scaler;
  int64_t steps;       /* (loop writes under mu) optimizer steps taken */
  size_t fetches;      /* ferry_fetch calls since the last step */
  int tracing;         /* recording the first step's fetch order */
  uint32_t *trace;     /* the loop's fetches of the first step (groups) */
  int *trace_fam;
  size_t ntrace, captrace;
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

/* group.c */
int group_add_param(ferry_engine *e, const char *name, const int64_t *shape, int ndim, int group,
                    const float *values, ferry_init_fn init, void *init_user);
int group_build(ferry_engine *e);          /* finalize: order, offsets, buffers */
/* finalize (after group_build, with nranks, rank, zero_stage set): each
 * group's bounds, this rank's lo/hi and each param's plo/pn. The bounds
 * are r·n/N snapped down to a param-relative multiple of `align`
 * elements. */
int group_partition(ferry_engine *e, size_t align);
/* Rank r's share of param p: *off (param-relative) and the element count. */
size_t group_param_piece(const ferry_engine *e, const eng_param *p, int r, size_t *off);
int group_register(ferry_engine *e);       /* finalize: tensors in the manager */
void group_check_chunks(ferry_engine *e);  /* finalize: no chunk holds two groups */
void group_free(eng_groups *gt);
/* The k-th param of group g. */
static inline eng_param *group_param(ferry_engine *e, uint32_t g, uint32_t k) {
  return &e->gt.params[e->gt.by_group[e->gt.groups[g].first + k]];
}
eng_param *group_find(ferry_engine *e, const char *name);
/* Moves group g to `to` (mu held); aborts on a transition not in the chart. */
void group_set_state(ferry_engine *e, uint32_t g, group_state to);
const char *group_state_name(group_state s);
/* A group whose update is queued, running or not committed yet. */
static inline int group_pending(const eng_group *gr) {
  return gr->state == GROUP_QUEUED || gr->state == GROUP_UPDATED;
}
const char *group_role_suffix(int role); /* "", ".grad", ".master", ... */
/* Zeroes group g's accumulated grads (held: the caller holds them in the
 * grads' work tier); a status with e->err set. grads "none": nothing; an
 * NVMe home: sets grads_zero (no write). */
int group_zero_grads(ferry_engine *e, uint32_t g, int held);
/* ferry_mem_fetch as the engine's threads call it: at the host pool's
 * minimum the drain's, the stepper's and the loop's working sets share it,
 * and room another thread holds comes free as that thread goes on, so
 * FERRY_ENOMEM is tried again every 0.1 ms for about 10 s (others_busy,
 * when given: only while it says another thread may free room). */
int group_fetch(ferry_engine *e, uint32_t g, int family, ferry_tier tier, ferry_stream *s,
                unsigned flags, int (*others_busy)(ferry_engine *));
/* e->err gets "what: <the manager's message>"; returns rc. */
int engine_mem_err(ferry_engine *e, int rc, const char *what);

/* stepper.c */
int stepper_init(ferry_engine *e, size_t gbytes); /* finalize: buffers */
int stepper_init_param_stage(ferry_engine *e);    /* finalize, after the manager */
int stepper_start(ferry_engine *e);
void stepper_stop(ferry_engine *e);
void stepper_free(ferry_engine *e);
void stepper_queue(ferry_engine *e, uint32_t g); /* (mu held) */
/* grads "none" (mu held): group g's grads are in drain stage si, lent to
 * its update until the optimizer pass over them is done. */
void stepper_lend_stage(ferry_engine *e, uint32_t g, int si);
/* Runs again the updates that failed; 1 when there were any. */
int stepper_retry_failed(ferry_engine *e);
/* Waits until no update is queued or running; returns (and clears) the
 * first error. */
int stepper_wait_all(ferry_engine *e);
/* Waits until group g's update is done; its failure status, or 0. */
int stepper_wait_group(ferry_engine *e, uint32_t g);
/* Writes a group's params (param dtype) from fp32 values: vals (the
 * group's values, goff-indexed), or when NULL its fp32 master values, which
 * must be held in the optimizer's work tier (finalize). */
int stepper_write_params(ferry_engine *e, uint32_t g, const float *vals);
/* Copies group g's current params (param dtype, goff-indexed) from where
 * they live (host copy; NVMe through the host; device copy D2H on s) into
 * dst, host memory. Between its updates (the stepper, or quiesced). */
int stepper_read_params(ferry_engine *e, uint32_t g, void *dst, ferry_stream *s);

/* drain.c */
int drain_init(ferry_engine *e, size_t gbytes); /* finalize: buffers */
int drain_init_optimizer(ferry_engine *e, const ferry_optimizer_config *oc);
int drain_start(ferry_engine *e);
void drain_stop(ferry_engine *e);
void drain_free(ferry_engine *e);
/* A free device grad buffer for group g (waits while both are draining). */
int drain_take_slot(ferry_engine *e, uint32_t g, int *slot);
void drain_submit(ferry_engine *e, uint32_t g, int slot); /* its grads are ready there */
/* Waits until every submitted group is drained; the drain's first error. */
int drain_wait(ferry_engine *e);
void drain_progress(ferry_engine *e, int *micro, uint32_t *in_micro);
/* With ranks: bytes of the drain's fp32 reduce buffer (the largest group;
 * the return) and of its piece buffer (*piece: the largest range of this
 * rank, stages 1 and 2). 0 alone. After group_partition. */
size_t drain_reduce_bytes(const ferry_engine *e, size_t *piece);
void drain_reset_micro(ferry_engine *e);

/* gpu.c (only when engine_gpu_math; every call is stream-ordered on e->down) */
size_t gpu_own_dev_bytes(const ferry_engine *e);  /* its device scratch */
size_t gpu_own_host_bytes(const ferry_engine *e); /* its pinned sums */
int gpu_init(ferry_engine *e);                   /* finalize: stream, scratch */
void gpu_free(ferry_engine *e);
/* n floats H2D into device memory, then waits (finalize's initial values). */
int gpu_upload_f32(ferry_engine *e, float *dst, const float *src, size_t n);
/* n floats D2H from device memory, then waits (ferry_param_read). */
int gpu_read_f32(ferry_engine *e, float *dst, const float *src, size_t n);
int gpu_zero(ferry_engine *e, void *dst, size_t bytes);
/* Group g's params in their dtype from its device masters (or, a bf16
 * master, from vals: its fp32 initial values, goff-indexed, host memory)
 * into dst[k] per param (device memory), then gpu_params_home. */
int gpu_write_params(ferry_engine *e, uint32_t g, void **dst, const float *vals);
/* A bf16 master, host and NVMe param homes: the staged current params
 * (the stepper's param staging) H2D into the device scratch the kernel
 * updates in place. */
int gpu_stage_params(ferry_engine *e, uint32_t g);
/* Where the optimizer writes group g's new params: the device params
 * (device home: fused, in place) or the device scratch (host homes). */
void gpu_param_dsts(ferry_engine *e, uint32_t g, void **dst);
/* Host and NVMe param homes: the scratch's new params D2H into the param
 * staging, then waits. Device home: records the group's `uploaded`. */
int gpu_params_home(ferry_engine *e, uint32_t g);
/* The CUDA AdamW over the stepper's spans of group g. */
int gpu_optimizer_step(ferry_engine *e, uint32_t g, float gscale);
/* The drain: group g's grads (param dtype, device) scaled into its fp32
 * device grads; on the last micro-batch, each param's sum of squares into
 * drain stage `stage`'s sums, copied D2H. */
int gpu_drain_enqueue(ferry_engine *e, uint32_t g, const void *grads, int stage, int last);
/* After the stage's event: the group's sum of squares (params in order). */
double gpu_drain_sumsq(ferry_engine *e, uint32_t g, int stage);

/* ranks.c (ferry_engine_set_comm is there too) */
/* finalize, after group_build: with a communicator of more than one rank,
 * nranks, rank and zero_stage, the three channels (dup'ed in order: loop,
 * drain, stepper; spans onto the comm lanes), the fingerprint check (a
 * collective: every rank fails alike on a mismatch, naming the key) and
 * the refusals. Alone: nranks 1, rank 0, stage 0. */
int ranks_setup(ferry_engine *e);
void ranks_free(ferry_engine *e); /* destroy, after the threads stopped */
/* The step: this rank's (sumsq, nonfinite) summed with every rank's, in
 * rank order, on the loop channel (stages 1 and 2; else as it is). */
int ranks_global_norm(ferry_engine *e, double *sumsq, int *nonfinite);
/* ferry_param_read of a sharded master: every rank's piece of p (this
 * rank's is `piece`, pn floats) gathered into dst (p->n floats). */
int ranks_read_param(ferry_engine *e, const eng_param *p, const float *piece, float *dst);
void ranks_stats(const ferry_engine *e, ferry_stats *out); /* the comm_* figures */
/* Stage 3: the gather buffers (finalize: ngather device buffers of `gbytes`
 * and the pinned host one; their sizes are in engine_own_bytes) and their
 * release. */
int ranks_gather_init(ferry_engine *e, size_t gbytes);
void ranks_gather_free(ferry_engine *e);
/* Stage 3, the loop's fetch of group g on s: this rank's pieces (held in
 * the host tier) and every other rank's gathered into a free device
 * buffer (a collective on the loop channel), H2D on s. */
int ranks_fetch_params(ferry_engine *e, uint32_t g, ferry_stream *s);
/* Stage 3, the loop's release of group g on s (the last one frees its
 * buffer once s is past it). */
int ranks_release_params(ferry_engine *e, uint32_t g, ferry_stream *s);
/* Stage 3, after a fetch: starts the gather of the group the trace
 * expects next (within the iteration, into a free buffer, once its update
 * is committed), so it overlaps the loop's compute. The same decision on
 * every rank: it depends only on the loop's calls and the trace. */
void ranks_read_ahead(ferry_engine *e);
/* Stage 3: waits for a read-ahead the loop did not fetch and frees its
 * buffer (ferry_step, quiesce, destroy: the step changes those params). */
int ranks_drop_ahead(ferry_engine *e);
/* ranks_agree, ranks_root_status: engine_walk.h */

/* engine.c: ferry_optimizer_bytes_per_param of the engine's optimizer
 * pass (ferry_stats.optim_bytes_per_param, the timeline's metadata). */
double engine_optim_bytes_per_param(const ferry_engine *e);

/* engine.c: for checkpoints: engine_quiesce, engine_progress_get, engine_restore
 * (engine_walk.h) */

#endif
