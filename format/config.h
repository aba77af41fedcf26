/* format/config.h — the engine configuration: one table of keys (name,
 * type, default, limits, description) drives the libconfig reader, the
 * setters from C, the writer and docs/CONFIG.md, so file and C agree.
 */
#ifndef FERRY_FORMAT_CONFIG_H
#define FERRY_FORMAT_CONFIG_H

#include "core/core.h"

#define FERRY_CFG_MAX_PATHS 16

/* The enums of keys that have no library enum of their own. */
typedef enum { FERRY_NUMA_LOCAL = 0, FERRY_NUMA_INTERLEAVE = 1, FERRY_NUMA_NONE = 2 } ferry_numa_policy;
typedef enum { FERRY_MEMLOCK_ERROR = 0, FERRY_MEMLOCK_PAGEABLE = 1 } ferry_memlock_fallback;
typedef enum { FERRY_VERIFY_CRC32C = 0, FERRY_VERIFY_NONE = 1 } ferry_verify_mode;
/* optimizer.missing_grad: a param that got no gradient in a step is left
 * as it is (torch), or stepped with zero grads (DeepSpeed). */
typedef enum { FERRY_MISSING_GRAD_SKIP = 0, FERRY_MISSING_GRAD_ZERO = 1 } ferry_missing_grad;
/* placement.grads beside the tiers (ferry_tier): "auto", resolved at
 * ferry_engine_create, and "none" (no accumulator: the drain's staging). */
enum { FERRY_GRADS_AUTO = -1, FERRY_GRADS_NONE = -2 };

/* The typed values the engine reads. An enum key decodes straight into the
 * library's own enum (the table in config.c maps each name to its value). */
typedef struct {
  ferry_device_kind device;
  uint64_t chunk_size;
  uint64_t gpu_budget;      /* 0: free device memory (cuda); required for host */
  uint64_t host_budget;     /* 0: available RAM */
  int host_pinned;
  ferry_numa_policy host_numa;
  ferry_memlock_fallback host_memlock;
  int host_hugepages;
  int nvme_npaths;
  char nvme_paths[FERRY_CFG_MAX_PATHS][1024];
  uint64_t nvme_budget;     /* 0: what the layout needs */
  int64_t nvme_queue_depth;
  uint64_t nvme_block_size;
  ferry_verify_mode nvme_verify;
  int nvme_sqpoll;
  int64_t nvme_check_threads;
  int nvme_keep_files;
  ferry_tier place_params;
  int place_grads;          /* a ferry_tier, FERRY_GRADS_AUTO or FERRY_GRADS_NONE */
  ferry_tier place_optimizer;
  ferry_optim_type opt_type;
  double lr;
  double betas[2];
  double eps;
  double weight_decay;
  double momentum;
  int nesterov;
  int64_t threads;          /* 0: all cores */
  ferry_dtype opt_state_dtype; /* F32, BF16 or I8 (blockwise int8) */
  int64_t opt_state_block;  /* int8 states: elements per absmax block, a power of two */
  ferry_missing_grad missing_grad; /* a param without a grad in a step: skip or zero */
  ferry_dtype prec_params;     /* F32, F16 or BF16 */
  ferry_dtype prec_grads;      /* F32 or BF16: accumulators of host and NVMe grad homes */
  ferry_dtype prec_master;     /* F32 (a master copy) or BF16 (the params are the master) */
  double loss_scale;        /* 0: dynamic */
  double initial_scale;
  int64_t growth_interval;
  double backoff;
  double clip_grad_norm;    /* 0: off */
  int64_t grad_accumulation;
  ferry_evict_policy eviction;
  int fit;                  /* ferry_fit_policy: FIRST, LAST, RANDOM */
  int64_t fit_seed;         /* fit = random's seed */
  int64_t prefetch_depth;   /* groups ahead; 0: as far as the budget allows */
  int step_during_backward; /* update each group once its grads are final */
  int64_t zero_stage;       /* dist.zero_stage: 0..3 */
  double dist_timeout;      /* dist.timeout: seconds */
  char timeline[1024];      /* "" off */
  int log_level;               /* FERRY_LOG_* */
} ferry_config_values;

const ferry_config_values *ferry_config_values_get(const ferry_config *c);
/* A new configuration with src's values (src NULL: the defaults). */
int ferry_config_clone(const ferry_config *src, ferry_config **out);

/* The text of the libconfig file at path (malloc'd, NUL-terminated), read
 * through core/untrusted.h within FERRY_MAX_CONFIG_FILE bytes, every
 * @include in it checked the same way before libconfig opens it
 * (config_file.c). FERRY_ECONFIG, FERRY_ENOENT, FERRY_EIO... with why. */
int cfg_read_checked(const char *path, char **text, char *why, size_t wl);
/* FERRY_ECONFIG with why ("name:line: ...") when text holds an integer
 * without an L suffix that does not fit in 32 bits: libconfig 1.5 would
 * read another number (config_file.c). */
int cfg_check_integers(const char *text, const char *name, char *why, size_t wl);

#endif
