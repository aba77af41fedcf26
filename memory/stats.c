/* memory/stats.c — accounting: bytes held per tier and family with their
 * peaks, and what ferry_mem_get_stats / ferry_mem_metadata report (moves,
 * evictions, stalls, bookkeeping vs managed bytes), and which groups hold a
 * full tier's bytes (its message). Counters are updated under the
 * manager's lock by residency.c.
 */
#include "memory/mem_impl.h"

#include <stdio.h>
#include <string.h>

void mem_stats_add(ferry_mem *m, int tier, int family, size_t bytes) {
  ferry_stats *s = &m->st;
  s->current[tier][family] += bytes;
  if (s->current[tier][family] > s->peak[tier][family])
    s->peak[tier][family] = s->current[tier][family];
  s->tier_current[tier] += bytes;
  if (s->tier_current[tier] > s->tier_peak[tier]) s->tier_peak[tier] = s->tier_current[tier];
}

void mem_stats_sub(ferry_mem *m, int tier, int family, size_t bytes) {
  ferry_stats *s = &m->st;
  FERRY_ASSERT(s->current[tier][family] >= bytes,
               "memory stats: %s bytes of the %s tier below zero", ferry_family_name(family),
               ferry_tier_name(tier));
  s->current[tier][family] -= bytes;
  s->tier_current[tier] -= bytes;
}

static size_t metadata_locked(const ferry_mem *m) {
  size_t b = sizeof *m;
  size_t reg = 0;
  mem_registry_metadata(m, &reg);
  b += reg;
  if (m->finalized) {
    b += 2 * (m->nt + 1) * sizeof(uint32_t);                     /* order, by_group */
    b += ((size_t)m->ngroups + 1) * sizeof(uint32_t);            /* group_start */
    b += ((size_t)m->ngroups * FERRY_FAMILIES + 1) * sizeof(mem_range);
    b += ((size_t)m->nc + 1) * (sizeof(mem_chunk) + sizeof(uint32_t)); /* chunks, pending */
    b += 2 * (2 * (size_t)m->nc + 2) * sizeof(mem_block);        /* pools */
    if (m->io_mem) b += ferry_align_up(m->cfg.store.req_size ? m->cfg.store.req_size : 1, 64) * m->nc;
    for (uint32_t i = 0; i < m->nc; i++)
      if (m->c[i].use_ev[0].ev) /* an event handle and its backend state: about 128 bytes */
        b += ((m->c[i].ev_load ? 2 : 0) + MEM_USE_STREAMS) * 128;
  }
  b += m->captrace * sizeof(mem_trace_ent);
  if (m->tpos) b += m->ntrace * sizeof(uint32_t) +
                    ((size_t)m->ngroups * FERRY_FAMILIES + 1) * sizeof(uint32_t);
  return b;
}

static size_t managed_locked(const ferry_mem *m) {
  size_t b = 0;
  for (size_t i = 0; i < m->nt; i++) b += m->t[i].bytes;
  return b;
}

int ferry_mem_metadata(ferry_mem *m, size_t *metadata_bytes, size_t *managed_bytes) {
  if (!m || !metadata_bytes || !managed_bytes) return FERRY_EINVAL;
  pthread_mutex_lock(&m->mu);
  *metadata_bytes = metadata_locked(m);
  *managed_bytes = managed_locked(m);
  pthread_mutex_unlock(&m->mu);
  return FERRY_OK;
}

int ferry_mem_get_stats(ferry_mem *m, ferry_stats *out) {
  if (!m || !out) return FERRY_EINVAL;
  pthread_mutex_lock(&m->mu);
  *out = m->st;
  for (int t = 0; t < FERRY_TIERS; t++) out->budget[t] = m->cfg.budget[t];
  out->metadata_bytes = metadata_locked(m);
  out->managed_bytes = managed_locked(m);
  pthread_mutex_unlock(&m->mu);
  return FERRY_OK;
}

/* (mu held) */
void mem_describe_holders(ferry_mem *m, int tier, char *buf, size_t len) {
  size_t n = 0;
  buf[0] = 0;
  uint32_t g0 = 0, g1 = 0;
  size_t held = 0, other = 0;
  int have = 0, runs = 0;
  for (uint32_t i = 0; i <= m->nc; i++) {
    const mem_chunk *c = i < m->nc ? &m->c[i] : NULL;
    int holds = c && c->state[tier] != FERRY_RES_ABSENT && tier < c->home && c->use[tier] &&
                !(c->resv & (1u << tier)); /* not the chunk asking */
    if (c && !holds && !(c->resv & (1u << tier)) && c->state[tier] != FERRY_RES_ABSENT &&
        tier < c->home)
      other += c->bytes;
    if (have && (!holds || c->gfirst > g1 + 1 || c->gfirst < g0)) {
      if (n < len && runs < 12)
        n += (size_t)snprintf(buf + n, len - n, "%sgroup%s %u%s%.0u: %zu bytes", runs ? ", " : "",
                              g0 == g1 ? "" : "s", g0, g0 == g1 ? "" : "-", g0 == g1 ? 0 : g1,
                              held);
      runs++;
      have = 0;
    }
    if (holds) {
      if (!have) {
        g0 = c->gfirst;
        g1 = c->glast;
        held = 0;
        have = 1;
      }
      if (c->glast > g1) g1 = c->glast;
      held += c->bytes;
    }
  }
  if (n < len)
    snprintf(buf + n, len - n, "%s%zu bytes cached but moving or not yet evictable",
             runs ? "; " : "", other);
}

uint64_t ferry_mem_compactions(ferry_mem *m) {
  if (!m) return 0;
  pthread_mutex_lock(&m->mu);
  uint64_t n = m->compactions;
  pthread_mutex_unlock(&m->mu);
  return n;
}
