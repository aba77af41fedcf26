/* plan/footprint.h — the one footprint arithmetic of the planner and the
 * engine: from the chunk bytes of each family and the engine's switches,
 * the engine's own pinned staging, the host pool's working set of one step
 * beside the host homes, the room that leaves for reading ahead, and the
 * NVMe swap files. `ferry plan` (plan/bytes.c) feeds it the chunks its model
 * of the layout predicts; the engine's finalize (offload/engine.c) feeds it
 * the chunks its layout made, and refuses a host budget below its answer.
 * Arithmetic only: no I/O, no allocation.
 */
#ifndef FERRY_PLAN_FOOTPRINT_H
#define FERRY_PLAN_FOOTPRINT_H

#include "ferry.h" /* ferry_tier, FERRY_TIERS, FERRY_FAMILIES */

#include <stddef.h>
#include <stdint.h>

/* One family's chunks (a chunk never holds two groups). */
typedef struct {
  uint64_t group_max; /* bytes of the group with the most */
  uint64_t total;     /* bytes of every group */
  uint64_t chunk_max; /* bytes of the largest chunk */
  uint64_t chunks;    /* how many chunks */
} ferry_footprint_family;

/* What decides the engine's pinned host buffers. */
typedef struct {
  uint64_t group_n;      /* elements of the largest group */
  size_t esize;          /* bytes of a param element */
  size_t page;           /* the buffers' alignment: 4096 (the planner's exact mode: 1) */
  int drain_staged;      /* the drain copies grads into pinned stages (not the GPU's math) */
  uint64_t gpu_sums;     /* ... else the GPU math's pinned sums of a group */
  int upload_staged;     /* params on the device, updated by the CPU: upload stages */
  int params_off_device; /* params homed off the device: a commit stage */
  uint64_t reduce;       /* with ranks: the drain's fp32 buffers (group and piece) */
  int params_sharded;    /* ZeRO stage 3: two host gather buffers */
} ferry_footprint_engine;

/* The engine's pinned host buffers by kind, as they are allocated. */
typedef struct {
  uint64_t drain, upload, commit, reduce, total;
} ferry_footprint_staging;

/* One step's need in the host pool: the working set of the NVMe homes
 * (the optimizer state of the group being updated; grads: one group
 * drained and one stepped; params: one group fetched and one committed;
 * slack: two largest chunks of those families) and the host homes whole. */
typedef struct {
  uint64_t optim, grads, params, slack;
  uint64_t home[FERRY_FAMILIES];
  uint64_t total;
} ferry_footprint_host;

/* Pinned staging and grad slots: the largest group in param dtype, whole pages. */
uint64_t ferry_footprint_group_buffer(uint64_t group_n, size_t esize, size_t page);
void ferry_footprint_staging_bytes(const ferry_footprint_engine *in, ferry_footprint_staging *out);
/* home[f]: the tier family f lives in. */
void ferry_footprint_host_need(const ferry_tier home[FERRY_FAMILIES],
                               const ferry_footprint_family fam[FERRY_FAMILIES],
                               ferry_footprint_host *out);
/* The host bytes NVMe params keep cached (the engine's ferry_mem_cap, the
 * planner's cached groups at each turn): the room the working set leaves
 * in the pool, plus its two param groups (free at a turn: the loop holds
 * one), less the optimizer read-ahead and half the slack when the
 * read-ahead fits (optim_ahead), else plus a quarter of the slack (the
 * hole a chunk is placed in is free at a turn, but partly cut into pieces
 * no whole group fills). At least 1. */
uint64_t ferry_footprint_param_cache(uint64_t pool, const ferry_footprint_host *n, int optim_ahead);
/* What the pool leaves beside the need for reading ahead, less the device
 * pool's bytes (a device copy of an NVMe-homed chunk keeps its host copy):
 * *param_ahead, the NVMe param groups the loop may read ahead (SIZE_MAX
 * without NVMe params); *optim_ahead, whether the next group's NVMe
 * optimizer state has room. */
void ferry_footprint_read_ahead(uint64_t pool, uint64_t dev_pool, const ferry_footprint_host *n,
                                size_t *param_ahead, int *optim_ahead);
/* The NVMe swap files: each NVMe-homed chunk's bytes in a slot of its own
 * and per family a spare slot of its largest chunk and up to three of
 * min(chunk_size, that) within 1% of its bytes (memory/layout.c and nvme/;
 * a slot's tail is rounded to the O_DIRECT alignment, which the chunk sizes
 * already are, and with several directories each slot to whole blocks,
 * which this leaves out). */
uint64_t ferry_footprint_nvme_swap(const ferry_tier home[FERRY_FAMILIES],
                                   const ferry_footprint_family fam[FERRY_FAMILIES],
                                   uint64_t chunk_size);
/* ferry_footprint_nvme_swap without a chunk size (no extra spares). */
uint64_t ferry_footprint_nvme_files(const ferry_tier home[FERRY_FAMILIES],
                                    const ferry_footprint_family fam[FERRY_FAMILIES]);

#endif
