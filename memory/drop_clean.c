/* memory/drop_clean.c — host copies dropped once clean, without waiting:
 * ferry_mem_evict_clean drops a group's clean host copies (NVMe home) at
 * once and marks those being written back, which residency.c drops when
 * their write lands (a failed write keeps the copy dirty, its error for the
 * eviction or flush that writes it again). The engine's stepper uses it to
 * let a committed group go again without blocking behind its write.
 */
#include "memory/mem_impl.h"

int ferry_mem_evict_clean(ferry_mem *m, uint32_t group, int family, int tier) {
  if (!m) return FERRY_EINVAL;
  const mem_range *r = NULL;
  pthread_mutex_lock(&m->mu);
  int rc = mem_check_call(m, group, family, tier, "evict when clean", &r);
  if (!rc && tier != FERRY_TIER_HOST)
    rc = ferry_err(&m->err, FERRY_EINVAL, "evict when clean: the host tier only (NVMe writes)");
  for (uint32_t ci = rc ? 0 : r->first; !rc && ci < r->first + r->count; ci++) {
    mem_chunk *c = &m->c[ci];
    if (c->home != FERRY_TIER_NVME) continue;
    if (c->state[FERRY_TIER_HOST] == FERRY_RES_WRITING && c->io_active && c->io_write)
      c->drop_clean = 1;
    else if (c->state[FERRY_TIER_HOST] == FERRY_RES_RESIDENT && mem_host_droppable(m, ci))
      mem_drop_host(m, ci);
  }
  pthread_mutex_unlock(&m->mu);
  return rc;
}
