/* memory/query.c — read-only questions to the manager: where a tensor's
 * bytes are in a tier (ferry_mem_tensor_ptr) and a chunk's family, groups,
 * states and use counts (ferry_mem_chunk_get). Nothing here moves a copy.
 */
#include "memory/mem_impl.h"

int ferry_mem_tensor_ptr(ferry_mem *m, uint32_t id, int tier, void **ptr) {
  if (!m || !ptr) return FERRY_EINVAL;
  *ptr = NULL;
  pthread_mutex_lock(&m->mu);
  int rc = FERRY_OK;
  if (!m->finalized || id >= m->nt) {
    rc = ferry_err(&m->err, id >= m->nt ? FERRY_ENOENT : FERRY_ESTATE,
                   "tensor ptr: no tensor %u, or not finalized", id);
  } else if (tier != FERRY_TIER_DEVICE && tier != FERRY_TIER_HOST) {
    rc = ferry_err(&m->err, FERRY_EINVAL, "tensor ptr: tier %d has no addresses", tier);
  } else {
    const mem_tensor *t = &m->t[id];
    const mem_chunk *c = &m->c[t->chunk];
    int s = c->state[tier];
    if (tier > c->home || s == FERRY_RES_ABSENT || (c->resv & (1u << tier)) ||
        (tier == FERRY_TIER_HOST && s == FERRY_RES_LOADING))
      rc = ferry_err(&m->err, FERRY_ESTATE,
                     "tensor '%.200s' is not resident in the %s tier (chunk %u is %s there); "
                     "fetch its group %u first",
                     t->name, ferry_tier_name(tier), t->chunk,
                     tier > c->home ? "never" : ferry_res_state_name(s), t->group);
    else
      *ptr = (char *)mem_tier_addr(m, c, tier) + t->offset;
  }
  pthread_mutex_unlock(&m->mu);
  return rc;
}

int ferry_mem_chunk_get(ferry_mem *m, uint32_t chunk, ferry_mem_chunk_info *out) {
  if (!m || !out) return FERRY_EINVAL;
  pthread_mutex_lock(&m->mu);
  int rc = FERRY_OK;
  if (!m->laid_out || chunk >= m->nc) {
    rc = ferry_err(&m->err, FERRY_ENOENT, "no chunk %u", chunk);
  } else {
    const mem_chunk *c = &m->c[chunk];
    out->family = c->family;
    out->home = c->home;
    out->index = c->index;
    out->bytes = c->bytes;
    out->group_first = c->gfirst;
    out->group_last = c->glast;
    out->ntensors = c->ntensors;
    for (int t = 0; t < FERRY_TIERS; t++) {
      out->state[t] = (ferry_res_state)c->state[t];
      out->use[t] = c->use[t];
    }
  }
  pthread_mutex_unlock(&m->mu);
  return rc;
}
