/* plan/footprint.c — the one footprint arithmetic of the planner and the
 * engine (plan/footprint.h): staging, the host pool's need of one step, the
 * room for reading ahead and the NVMe swap files, from chunk bytes.
 */
#include "plan/footprint.h"

#include <string.h>

static uint64_t align_up(uint64_t x, uint64_t a) { return a > 1 ? (x + a - 1) / a * a : x; }

uint64_t ferry_footprint_group_buffer(uint64_t group_n, size_t esize, size_t page) {
  return align_up(group_n * esize, page);
}

/* Drain: two stages always (one copying while the one before is summed or
 * stepped), or the GPU math's sums; uploads: two stages; commit: the
 * largest group (not page-rounded); with ranks the drain's fp32 buffers and
 * at stage 3 two host gather buffers. */
void ferry_footprint_staging_bytes(const ferry_footprint_engine *in, ferry_footprint_staging *out) {
  uint64_t g = ferry_footprint_group_buffer(in->group_n, in->esize, in->page);
  memset(out, 0, sizeof *out);
  out->reduce = in->reduce + (in->params_sharded ? 2 * g : 0);
  out->drain = in->drain_staged ? 2 * g : in->gpu_sums;
  out->upload = in->upload_staged ? 2 * g : 0;
  out->commit = in->params_off_device ? in->group_n * in->esize : 0;
  out->total = out->drain + out->upload + out->commit + out->reduce;
}

void ferry_footprint_host_need(const ferry_tier home[FERRY_FAMILIES],
                               const ferry_footprint_family fam[FERRY_FAMILIES],
                               ferry_footprint_host *n) {
  memset(n, 0, sizeof *n);
  for (int f = 0; f < FERRY_FAMILIES; f++) {
    if (home[f] == FERRY_TIER_NVME && 2 * fam[f].chunk_max > n->slack)
      n->slack = 2 * fam[f].chunk_max;
    if (home[f] == FERRY_TIER_HOST) n->home[f] = fam[f].total;
  }
  /* slack: two largest chunks, one for the hole a chunk is placed in and
   * one lost to the holes between held copies of mixed sizes (first fit; at
   * one chunk of slack a 4 MiB chunk found 11 MB free in four holes, none
   * of 4 MiB) */
  if (home[FERRY_FAMILY_OPTIM] == FERRY_TIER_NVME) n->optim = fam[FERRY_FAMILY_OPTIM].group_max;
  if (home[FERRY_FAMILY_GRADS] == FERRY_TIER_NVME) n->grads = 2 * fam[FERRY_FAMILY_GRADS].group_max;
  if (home[FERRY_FAMILY_PARAMS] == FERRY_TIER_NVME)
    n->params = 2 * fam[FERRY_FAMILY_PARAMS].group_max;
  n->total = n->optim + n->grads + n->params + n->slack;
  for (int f = 0; f < FERRY_FAMILIES; f++) n->total += n->home[f];
}

/* A read ahead into less room is evicted before its use and read twice
 * (llama-100m at 32M/64M: 127 group reads a step instead of 91; an
 * in-flight read under its device copy is not waited for by a fetch that
 * needs the room). */
void ferry_footprint_read_ahead(uint64_t pool, uint64_t dev_pool, const ferry_footprint_host *n,
                                size_t *param_ahead, int *optim_ahead) {
  uint64_t room = pool > n->total ? pool - n->total : 0;
  uint64_t left = room > dev_pool ? room - dev_pool : 0;
  *param_ahead = !n->params ? SIZE_MAX : (size_t)(left / (n->params / 2));
  *optim_ahead = !n->optim || left >= n->optim;
}

uint64_t ferry_footprint_param_cache(uint64_t pool, const ferry_footprint_host *n, int optim_ahead) {
  double room = (double)pool - (double)n->total + (double)n->params +
                (optim_ahead ? -(double)n->optim - (double)n->slack / 2 : (double)n->slack / 4);
  return room < 1 ? 1 : (uint64_t)room;
}

uint64_t ferry_footprint_nvme_swap(const ferry_tier home[FERRY_FAMILIES],
                                   const ferry_footprint_family fam[FERRY_FAMILIES],
                                   uint64_t chunk_size) {
  uint64_t bytes = 0;
  for (int f = 0; f < FERRY_FAMILIES; f++) {
    if (home[f] != FERRY_TIER_NVME) continue;
    /* memory/layout.c's spares: the largest chunk, and up to three of
     * min(chunk_size, that) within 1% of the family's bytes */
    uint64_t z = fam[f].chunk_max < chunk_size ? fam[f].chunk_max : chunk_size;
    uint64_t k = z ? fam[f].total / 100 / z : 0;
    bytes += fam[f].total + fam[f].chunk_max + (k < 3 ? k : 3) * z;
  }
  return bytes;
}

uint64_t ferry_footprint_nvme_files(const ferry_tier home[FERRY_FAMILIES],
                                    const ferry_footprint_family fam[FERRY_FAMILIES]) {
  return ferry_footprint_nvme_swap(home, fam, 0);
}
