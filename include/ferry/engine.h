/* ferry/engine.h — the engine: its configuration, the training-loop API and its statistics.
 * Part of the public API: include ferry.h, which includes this file. */
#ifndef FERRY_API_ENGINE_H
#define FERRY_API_ENGINE_H

#ifndef FERRY_H
#error "include ferry.h, not ferry/engine.h"
#endif

/* ------------------------------------------------------------------------ */
/* Engine configuration (offload/)                                           */

/* Every key of the engine's libconfig file (docs/CONFIG.md lists them with
 * their defaults) can be loaded from a file or a string, or set from C with
 * the same dotted name ("tiers.gpu.budget") and the same value syntax
 * ("20G"). Bad input is refused with FERRY_ECONFIG and a message naming the
 * file, line, key, value and what was expected; an unknown key is an error
 * with the nearest valid key suggested. */
typedef struct ferry_config ferry_config;

/* A configuration holding every default. */
FERRY_API int ferry_config_create(ferry_config **out);
FERRY_API void ferry_config_destroy(ferry_config *c);
FERRY_API const char *ferry_config_last_error(const ferry_config *c);
/* Applies a file's settings over the current values. Nothing is changed
 * when the file is refused. */
FERRY_API int ferry_config_load_file(ferry_config *c, const char *path);
/* The same from text; `name` stands for the file name in messages. */
FERRY_API int ferry_config_load_string(ferry_config *c, const char *text, const char *name);
/* Sets one key from its text form: sizes "64M", numbers, true/false, enum
 * names, arrays as "a, b". A value that starts with '[', '(' or '"' is
 * read in the config file's grammar: a list ["a", "b"] or (0.9, 0.95), or
 * a quoted string; anything else there is refused naming the key. An
 * empty path ("" or an element "") is refused; an empty list (or an empty
 * value) leaves tiers.nvme.paths empty. */
FERRY_API int ferry_config_set(ferry_config *c, const char *key, const char *value);
/* The current value of a key in its text form. */
FERRY_API int ferry_config_get(const ferry_config *c, const char *key, char *buf, size_t len);
/* Writes the whole configuration as a libconfig file that loads back to the
 * same values. */
FERRY_API int ferry_config_write_file(const ferry_config *c, const char *path);
/* The number of keys, and the i-th key's name, type, default and meaning
 * (for documentation and tools). */
FERRY_API int ferry_config_key_count(void);
FERRY_API int ferry_config_key_info(int i, const char **name, const char **type,
                                    const char **default_value, const char **description);

/* ------------------------------------------------------------------------ */
/* The engine: training-loop API (offload/)                                  */

/* A training loop registers its parameters once, then per step:
 *
 *   for g in 0..G-1:   ferry_fetch(e, g, s); forward kernels; ferry_release(e, g, s)
 *   for g in G-1..0:   ferry_fetch(e, g, s); backward kernels write the grads
 *                      into ferry_param_device's grad pointers;
 *                      ferry_grads_ready(e, g, s); ferry_release(e, g, s)
 *   ferry_step(e, &info)          (after grad_accumulation micro-batches)
 *
 * Param and grad device buffers have dtype precision.params. Everything else
 * (fp32 grads, master weights, optimizer states, where each byte lives and
 * when it moves) is the engine's. Each group's grads are handed in once per
 * micro-batch, and at most grad_accumulation micro-batches before
 * ferry_step: more is FERRY_ESTATE. An engine is called from one thread at
 * a time (its own threads are internal); separate engines are independent. */
typedef struct ferry_engine ferry_engine;

/* Called at finalize to fill a parameter's initial fp32 values. */
typedef int (*ferry_init_fn)(void *user, const char *name, float *values, size_t count);

/* Creates the engine from a configuration (copied). dev: the device to use,
 * or NULL to create one from the config (device, tiers.gpu.budget); the
 * engine never destroys a device it did not create. */
FERRY_API int ferry_engine_create(const ferry_config *cfg, ferry_device *dev,
                                  ferry_engine **out);
/* Drains all work in flight (a step included) and frees everything. */
FERRY_API void ferry_engine_destroy(ferry_engine *e);
/* The engine's last message: a copy taken under its lock (the engine's
 * threads may set it meanwhile), valid in this thread until its next call. */
FERRY_API const char *ferry_engine_last_error(const ferry_engine *e);
FERRY_API ferry_device *ferry_engine_device(ferry_engine *e);

/* Registers a parameter tensor of `group` (groups are numbered 0.. in
 * forward order). Initial values: `values` (count = product of shape), or
 * init(user, name, dst, count) at finalize, or zeros when both are NULL. */
FERRY_API int ferry_param_register(ferry_engine *e, const char *name, const int64_t *shape,
                                   int ndim, int group, const float *values, ferry_init_fn init,
                                   void *init_user);
/* Ends registration: lays out chunks, reserves every tier, places each
 * family, fills the initial values. */
FERRY_API int ferry_engine_finalize(ferry_engine *e);
/* Before finalize: keeps `bytes` of the device budget (tiers.gpu.budget)
 * out of the engine's pools for the caller's activations and workspace, so
 * the budget bounds the whole device footprint apart from the runtime's
 * context. Finalize fails with FERRY_ENOMEM, naming the sizes, when the
 * budget cannot hold the reservation beside the engine's own buffers and
 * its largest chunks. Called again, it replaces the amount. After finalize:
 * FERRY_EINVAL. */
FERRY_API int ferry_engine_reserve(ferry_engine *e, size_t bytes);
/* After finalize: the reserved block (device memory, 256-byte aligned, the
 * caller's to use until ferry_engine_destroy) and its size; NULL and 0 when
 * nothing was reserved. Before finalize: FERRY_EINVAL. */
FERRY_API int ferry_engine_reserved(ferry_engine *e, void **ptr, size_t *bytes);

/* Before finalize: cancel(user) is asked during finalize's long work (the
 * zeroing of the host homes, every 64 MiB on each of its threads; the
 * initial values, before each parameter; an init callback that fails), and
 * a non-zero answer stops finalize, which returns FERRY_ECANCELED; the
 * engine is then only destroyed (its swap files go with it). For a program
 * that stops its set-up on a signal: the handler sets a flag that cancel
 * reads (cancel is called from the engine's threads too, so it must be
 * thread-safe and quick). NULL: never cancelled (the default). After
 * finalize: FERRY_EINVAL. */
FERRY_API int ferry_engine_set_cancel(ferry_engine *e, int (*cancel)(void *user), void *user);

/* Before finalize: the ranks this engine trains with (a communicator of
 * every rank of the job; c must outlive the engine). The engine makes its
 * own channels from it (ferry_comm_dup) at finalize, a collective. Each
 * rank keeps its share of the optimizer state, grads and params as
 * dist.zero_stage says; every rank then calls the engine's functions in the
 * same order, with the same registrations and configuration (finalize
 * refuses a mismatch, naming the key). With ranks, the grads each rank
 * hands in are averaged over the ranks. A comm of one rank, or none: the
 * engine trains alone. After finalize: FERRY_ESTATE. */
FERRY_API int ferry_engine_set_comm(ferry_engine *e, ferry_comm *c);

/* Returns once work enqueued on s after it may read the group's params. */
FERRY_API int ferry_fetch(ferry_engine *e, int group, ferry_stream *s);
/* The loop is done with the group once s reaches this point. */
FERRY_API int ferry_release(ferry_engine *e, int group, ferry_stream *s);
/* Device pointers of a parameter (param) and of its gradient buffer (grad),
 * valid while its group is fetched. Either out pointer may be NULL.
 * The backward ferry_fetch zeroes the grad buffer asynchronously on its
 * stream s: write it with work queued on s after that fetch, or, from the
 * host (the host backend, a mapped buffer), only after
 * ferry_stream_synchronize(s); a host write before then may be lost. */
FERRY_API int ferry_param_device(ferry_engine *e, const char *name, void **param, void **grad);
/* Param `name` got no gradient in this micro-batch (an unused expert; in
 * torch its .grad stayed None): call it before its group's ferry_grads_ready
 * of the micro-batch, whose grad buffer for it stays zero. A param that got
 * none in every micro-batch of a step is, with optimizer.missing_grad =
 * "skip" (the default, torch.optim's behaviour), left as it is by that
 * step: params, optimizer state and its own step count, which its later
 * bias corrections use (checkpoints keep it); with "zero" (DeepSpeed's) it
 * is stepped with zero grads. ferry_zero_grads discards the marks with the
 * grads. With ranks and "skip": FERRY_ENOTSUP. */
FERRY_API int ferry_param_no_grad(ferry_engine *e, const char *name);
/* The group's gradient buffers are complete once s reaches this point: the
 * engine drains them (D2H), accumulates them in fp32 and adds them to the
 * global norm, while the loop goes on. */
FERRY_API int ferry_grads_ready(ferry_engine *e, int group, ferry_stream *s);

typedef struct {
  int64_t step;        /* optimizer steps taken so far */
  int skipped;         /* 1: inf/NaN in the grads, step skipped (fp16) */
  double grad_norm;    /* global L2 norm of the (unscaled) grads */
  float loss_scale;    /* the scale to use for the next backward */
  float clip_coef;     /* applied to every grad (1 = no clipping) */
  double seconds;      /* wall time of ferry_step */
} ferry_step_info;

/* The optimizer step over every parameter, pipelined over the optimizer
 * chunks; returns when the params of the next forward are being uploaded
 * (the next ferry_fetch of a group waits only for that group). */
FERRY_API int ferry_step(ferry_engine *e, ferry_step_info *info);
/* Drops accumulated gradients (ferry_step does so after each step). */
FERRY_API int ferry_zero_grads(ferry_engine *e);
/* The loss scale to multiply the loss by before backward. */
FERRY_API float ferry_loss_scale(const ferry_engine *e);
/* Copies a parameter's current fp32 master values out (count elements);
 * with precision.master = "bf16" the params, which are the master, widened
 * to fp32. */
FERRY_API int ferry_param_read(ferry_engine *e, const char *name, float *dst, size_t count);
/* With ranks at dist.zero_stage >= 1 each rank holds a share of the fp32
 * master, so ferry_param_read is then a collective: every rank calls it, in
 * the same order, and every rank gets the whole tensor (a bf16 master, the
 * params themselves, is read locally at stages 0-2). */
/* Writes the timeline recorded so far as Chrome trace JSON. */
FERRY_API int ferry_engine_write_timeline(ferry_engine *e, const char *path);

/* ------------------------------------------------------------------------ */
/* Tiered memory: statistics (memory/)                                       */

/* Where the bytes are and how they moved. Tiers and families index the
 * arrays below. Budgets hold: peak[t][*] sums never exceed budget[t]. */
typedef enum { FERRY_TIER_DEVICE = 0, FERRY_TIER_HOST = 1, FERRY_TIER_NVME = 2, FERRY_TIERS = 3 } ferry_tier;
/* placement.eviction: which chunk leaves a full tier first (least recently
 * used, or the one the recorded trace needs last). */
typedef enum { FERRY_EVICT_LRU = 0, FERRY_EVICT_TRACE = 1 } ferry_evict_policy;
/* fit: where a copy lands among a pool's free blocks that fit it (last and
 * random are for tests: no result may depend on where a copy lands). */
typedef enum {
  FERRY_FIT_FIRST = 0,  /* the lowest free block that fits, at its start (default) */
  FERRY_FIT_LAST = 1,   /* the highest free block that fits, at its end */
  FERRY_FIT_RANDOM = 2  /* a random free block that fits, at its start or end (fit_seed) */
} ferry_fit_policy;
enum {
  FERRY_FAMILY_PARAMS = 0, /* 16-bit params */
  FERRY_FAMILY_GRADS = 1,  /* gradients */
  FERRY_FAMILY_OPTIM = 2,  /* optimizer state: the fp32 master (none with precision.master =
                              bf16), exp_avg, exp_avg_sq (optimizer.state_dtype) */
  FERRY_FAMILIES = 3
};

typedef struct {
  uint64_t budget[FERRY_TIERS];
  uint64_t current[FERRY_TIERS][FERRY_FAMILIES]; /* bytes held now */
  uint64_t peak[FERRY_TIERS][FERRY_FAMILIES];    /* high-water mark per family */
  uint64_t tier_current[FERRY_TIERS];            /* sums over families */
  uint64_t tier_peak[FERRY_TIERS];               /* high-water mark of the sum */
  uint64_t bytes_h2d, bytes_d2h;                 /* host <-> device */
  uint64_t bytes_host_to_nvme, bytes_nvme_to_host;
  uint64_t evictions[FERRY_TIERS];               /* copies dropped to make room */
  uint64_t writebacks[FERRY_TIERS];              /* dirty copies written one tier down */
  uint64_t fetches, fetch_hits;                  /* fetches; of which all resident */
  uint64_t stalls;                               /* fetches that had to wait */
  double stall_seconds;                          /* time callers waited for chunks */
  uint64_t metadata_bytes, managed_bytes;        /* bookkeeping vs tensor bytes */
  uint64_t host_pageable_bytes; /* host pool bytes that are pageable, not pinned (pinning was
                                   off, or failed and the fallback allowed it, or the host
                                   backend without host_lock_pinned); 0 when pinned */
  uint64_t nvme_read_bytes[FERRY_FAMILIES];  /* NVMe -> host bytes per family (completed reads) */
  uint64_t nvme_write_bytes[FERRY_FAMILIES]; /* host -> NVMe bytes per family (completed writes) */
  /* The engine's optimizer pass: bytes per parameter per step it reads and
   * writes (ferry_optimizer_bytes_per_param of its master, states, grads and
   * param copy); 0 from the memory manager alone. */
  double optim_bytes_per_param;
  /* Communication between ranks (ferry_engine_set_comm; 0 alone), summed
   * over the engine's channels: collectives, bytes this rank sent, time
   * they ran, and time the engine's threads waited for them. */
  uint64_t comm_ops, comm_bytes;
  double comm_seconds, comm_wait_seconds;
  /* Swap files that processes no longer running had left in the NVMe
   * directories and finalize removed (named in a WARN log line). */
  uint64_t nvme_reclaimed_files, nvme_reclaimed_bytes;
  /* The swap files on disk (every directory's, the bytes they take) and
   * the NVMe-homed chunks' bytes they hold; the rest is the spare slots
   * (about one chunk per family and 1%) and, with several directories, the
   * rounding of each slot to whole blocks (0 without NVMe). */
  uint64_t nvme_file_bytes, nvme_data_bytes;
} ferry_stats;

/* The engine's tiers: current and peak bytes per tier and family, bytes
 * moved per direction, evictions, stalls. */
FERRY_API int ferry_engine_get_stats(ferry_engine *e, ferry_stats *out);
/* Deprecated since 0.2, removed in 0.3. */
FERRY_API FERRY_DEPRECATED("ferry_engine_get_stats") int ferry_engine_stats(ferry_engine *e,
                                                                           ferry_stats *out);

/* Where the engine keeps the gradient accumulators: placement.grads as
 * ferry_engine_create resolved it ("auto" decided), FERRY_TIER_DEVICE,
 * FERRY_TIER_HOST or FERRY_TIER_NVME. *none (may be NULL) is set to 1 when
 * there is no accumulator (placement.grads "none": a group's grads live only
 * in the drain's pinned staging until its update, and the tier returned is
 * FERRY_TIER_HOST), else 0. For programs that print the placement. A NULL
 * engine: FERRY_TIER_HOST and 0. */
FERRY_API ferry_tier ferry_engine_grad_home(const ferry_engine *e, int *none);

#endif /* FERRY_API_ENGINE_H */
