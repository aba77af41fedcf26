/* offload/config.h — the engine configuration: one table of keys (name,
 * type, default, limits, description) drives the libconfig reader, the
 * setters from C, the writer and docs/CONFIG.md, so file and C agree.
 */
#ifndef FERRY_OFFLOAD_CONFIG_H
#define FERRY_OFFLOAD_CONFIG_H

#include "core/core.h"

#define FERRY_CFG_MAX_PATHS 16

typedef enum { CFG_TIER_GPU = 0, CFG_TIER_HOST = 1, CFG_TIER_NVME = 2 } cfg_tier;

/* The typed values the engine reads. Enums are indices into the key's list
 * of names (see the table in config.c). */
typedef struct {
  int device;               /* 0 auto, 1 cuda, 2 host */
  uint64_t chunk_size;
  uint64_t gpu_budget;      /* 0: free device memory (cuda); required for host */
  uint64_t host_budget;     /* 0: available RAM */
  int host_pinned;
  int host_numa;            /* 0 local, 1 interleave, 2 none */
  int host_memlock;         /* 0 error, 1 pageable */
  int host_hugepages;
  int nvme_npaths;
  char nvme_paths[FERRY_CFG_MAX_PATHS][1024];
  uint64_t nvme_budget;     /* 0: what the layout needs */
  int64_t nvme_queue_depth;
  uint64_t nvme_block_size;
  int nvme_verify;          /* 0 crc32c, 1 none */
  int nvme_sqpoll;
  int64_t nvme_check_threads;
  int nvme_keep_files;
  int place_params;         /* cfg_tier */
  int place_grads;          /* cfg_tier (gpu or host) */
  int place_optimizer;      /* cfg_tier */
  int opt_type;             /* 0 adamw 1 adam 2 adagrad 3 lamb 4 sgd 5 lion */
  double lr;
  double betas[2];
  double eps;
  double weight_decay;
  double momentum;
  int nesterov;
  int64_t threads;          /* 0: all cores */
  int prec_params;          /* 0 fp32 1 fp16 2 bf16 */
  double loss_scale;        /* 0: dynamic */
  double initial_scale;
  int64_t growth_interval;
  double backoff;
  double clip_grad_norm;    /* 0: off */
  int64_t grad_accumulation;
  int eviction;             /* 0 furthest, 1 lru */
  int64_t prefetch_depth;   /* groups ahead; 0: as far as the budget allows */
  int step_during_backward; /* update each group once its grads are final */
  char timeline[1024];      /* "" off */
  int log_level;            /* FERRY_LOG_* */
} ferry_config_values;

const ferry_config_values *ferry_config_values_get(const ferry_config *c);
/* A new configuration with src's values (src NULL: the defaults). */
int ferry_config_clone(const ferry_config *src, ferry_config **out);

#endif
