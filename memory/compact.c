/* memory/compact.c — compaction of the host pool: slides the copies whose
 * address nobody may hold down over the holes below them, so the free
 * bytes gather into one hole above them. The last resort of a fetch that
 * finds bytes enough free but no hole that fits and nothing to evict: the
 * held copies of first fit's mixed sizes can leave free room in holes none
 * of which fits a chunk (a 512 KiB chunk found 2.2 MiB free in holes
 * between the host copies under one group's device copies).
 *
 * A host copy is movable when only device-tier holds pin it (the copy a
 * device copy keeps below it, whose holders use the device's address), no
 * transfer reads or writes it, and it is no host home. Uses pool.c only.
 */
#include "memory/mem_impl.h"

#include <string.h>

static int movable(const mem_chunk *c) {
  if (c->home <= FERRY_TIER_HOST) return 0; /* homes stay where callers found them */
  int h = c->state[FERRY_TIER_HOST], d = c->state[FERRY_TIER_DEVICE];
  if (h != FERRY_RES_RESIDENT && h != FERRY_RES_DIRTY) return 0;
  if (d == FERRY_RES_LOADING || d == FERRY_RES_WRITING) return 0;
  if (c->io_active || c->d2h_active || c->load_issued || c->queued) return 0;
  if (c->hold_host || c->host_writer || (c->resv & (1u << FERRY_TIER_HOST))) return 0;
  return c->use[FERRY_TIER_HOST] <= c->use[FERRY_TIER_DEVICE]; /* no host-tier holder */
}

static void sift(const mem_chunk *c, uint32_t *ids, size_t i, size_t end) {
  for (;;) {
    size_t l = 2 * i + 1, big = i;
    if (l < end && c[ids[l]].off[1] > c[ids[big]].off[1]) big = l;
    if (l + 1 < end && c[ids[l + 1]].off[1] > c[ids[big]].off[1]) big = l + 1;
    if (big == i) return;
    uint32_t t = ids[i];
    ids[i] = ids[big];
    ids[big] = t;
    i = big;
  }
}

/* Sorts ids[0..n) by their host offsets (heap sort: no allocation). */
static void sort_by_offset(const mem_chunk *c, uint32_t *ids, size_t n) {
  for (size_t k = n / 2; k-- > 0;) sift(c, ids, k, n);
  for (size_t end = n; end > 1; end--) {
    uint32_t t = ids[0];
    ids[0] = ids[end - 1];
    ids[end - 1] = t;
    sift(c, ids, 0, end - 1);
  }
}

size_t mem_compact_host(ferry_mem *m) {
  mem_pool *p = &m->pool[FERRY_TIER_HOST];
  size_t n = 0, moved = 0;
  for (uint32_t ci = 0; ci < m->nc; ci++)
    if (m->c[ci].state[FERRY_TIER_HOST] != FERRY_RES_ABSENT) m->compact_ids[n++] = ci;
  sort_by_offset(m->c, m->compact_ids, n);
  for (size_t k = 0; k < n; k++) { /* lowest first: each hole below is final */
    mem_chunk *c = &m->c[m->compact_ids[k]];
    if (!movable(c)) continue;
    size_t to = mem_pool_slide_down(p, c->off[FERRY_TIER_HOST]);
    if (to == c->off[FERRY_TIER_HOST]) continue;
    memmove(m->host_base + to, m->host_base + c->off[FERRY_TIER_HOST], c->bytes);
    c->off[FERRY_TIER_HOST] = to;
    moved += c->bytes;
  }
  if (moved) m->compactions++;
  return moved;
}
