/* memory/evict.c — eviction behind one small interface (pick a victim among
 * the evictable copies of a tier) with two policies: LRU, and
 * furthest-next-use from an access trace of group fetches, recorded during
 * the first step and replayed cyclically after it; a copy read ahead goes
 * last, and a spent write-back in flight is found for the caller to wait
 * on rather than evict what the trace uses again. The trace also tells the
 * engine what to prefetch (ferry_mem_trace_peek) and a prefetch what it may
 * evict (only copies needed after its own).
 */
#include "memory/mem_impl.h"

#include <stdlib.h>
#include <string.h>

#define NO_CHUNK UINT32_MAX

static size_t key(const ferry_mem *m, uint32_t group, int family) {
  return (size_t)group * FERRY_FAMILIES + (size_t)family;
}

/* Fetches from the trace cursor until (group, family) is used again;
 * UINT64_MAX when never. */
static uint64_t next_use(const ferry_mem *m, uint32_t group, int family) {
  if (group >= m->ngroups) return UINT64_MAX;
  size_t k = key(m, group, family);
  uint32_t a = m->tpos_start[k], b = m->tpos_start[k + 1];
  if (a == b) return UINT64_MAX;
  uint32_t lo = a, hi = b;
  while (lo < hi) { /* first position >= cursor */
    uint32_t mid = lo + (hi - lo) / 2;
    if (m->tpos[mid] < m->cursor) lo = mid + 1;
    else hi = mid;
  }
  if (lo < b) return m->tpos[lo] - m->cursor;
  return m->tpos[a] + m->ntrace - m->cursor;
}

static uint64_t chunk_next_use(const ferry_mem *m, const mem_chunk *c) {
  uint64_t best = UINT64_MAX;
  for (uint32_t g = c->gfirst; g <= c->glast; g++) {
    uint64_t d = next_use(m, g, c->family);
    if (d < best) best = d;
  }
  return best;
}

uint64_t mem_evict_next_use(ferry_mem *m, uint32_t ci) {
  int trace = m->cfg.policy == FERRY_EVICT_TRACE && m->tpos && !m->recording;
  return trace ? chunk_next_use(m, &m->c[ci]) : 0;
}

uint32_t mem_evict_spent_write(ferry_mem *m, int tier) {
  if (tier != FERRY_TIER_HOST) return NO_CHUNK;
  for (uint32_t k = 0; k < m->npend; k++) {
    uint32_t o = m->pend[k];
    const mem_chunk *c = &m->c[o];
    if (c->io_active && c->io_write && !c->use[tier] && !c->ahead &&
        c->state[FERRY_TIER_DEVICE] == FERRY_RES_ABSENT && mem_evict_next_use(m, o) == UINT64_MAX)
      return o;
  }
  return NO_CHUNK;
}

int ferry_mem_cap(ferry_mem *m, int family, size_t bytes) {
  if (!m || family < 0 || family >= FERRY_FAMILIES) return FERRY_EINVAL;
  pthread_mutex_lock(&m->mu);
  m->cap_family = family;
  m->cap_bytes = bytes;
  pthread_mutex_unlock(&m->mu);
  return FERRY_OK;
}

int mem_evict_scope(const ferry_mem *m, int tier, uint32_t ci) {
  const mem_chunk *c = &m->c[ci];
  if (tier != FERRY_TIER_HOST || !m->cap_bytes) return MEM_PICK_ANY;
  size_t held = m->st.current[tier][m->cap_family];
  if (c->family == m->cap_family && held + c->bytes > m->cap_bytes) return MEM_PICK_CAPPED;
  /* within the cap, the capped family's copies go last, whoever asks (but
   * before another family's read ahead, which is needed sooner) */
  if (c->family == m->cap_family) return MEM_PICK_OTHERS_SPENT;
  return held <= m->cap_bytes ? MEM_PICK_OTHERS : MEM_PICK_ANY;
}

uint32_t mem_evict_pick(ferry_mem *m, int tier, int (*eligible)(ferry_mem *, uint32_t, int),
                        int scope) {
  int trace = m->cfg.policy == FERRY_EVICT_TRACE && m->tpos && !m->recording;
  uint32_t best = NO_CHUNK;
  uint64_t best_next = 0, best_lru = 0;
  int best_ahead = 0;
  for (uint32_t ci = 0; ci < m->nc; ci++) {
    const mem_chunk *c = &m->c[ci];
    if (scope != MEM_PICK_ANY && (c->family == m->cap_family) != (scope == MEM_PICK_CAPPED))
      continue;
    if ((scope == MEM_PICK_OTHERS_SPENT || scope == MEM_PICK_CAPPED) && c->ahead) continue;
    if (!eligible(m, ci, tier)) continue;
    uint64_t nx = trace ? chunk_next_use(m, c) : 0;
    /* A copy read ahead and not fetched since is about to be used (evicted
     * first, as an untraced optimizer chunk would be, it is read twice):
     * it goes after every other. Then furthest next use first; among
     * equals (and for LRU), least recent. */
    int a = c->ahead != 0;
    if (best == NO_CHUNK || a < best_ahead ||
        (a == best_ahead && (nx > best_next || (nx == best_next && c->last_use < best_lru)))) {
      best = ci;
      best_next = nx;
      best_lru = c->last_use;
      best_ahead = a;
    }
  }
  return best;
}

/* A prefetch of chunk ci may evict victim v only when the trace needs v
 * later than ci (ci not in the trace, or no trace: the policy's pick).
 * Else it would evict a copy loaded ahead for a sooner use, to be read
 * again, and so on down the read-ahead: each prefetch undoing the one
 * before. */
int mem_prefetch_may_evict(const ferry_mem *m, uint32_t v, uint32_t ci) {
  if (!m->tpos || m->recording) return 1;
  uint64_t mine = chunk_next_use(m, &m->c[ci]);
  return mine == UINT64_MAX || chunk_next_use(m, &m->c[v]) > mine;
}

static void build_index(ferry_mem *m) {
  free(m->tpos);
  free(m->tpos_start);
  m->tpos = NULL;
  m->tpos_start = NULL;
  if (!m->ntrace || !m->ngroups) return;
  size_t nk = (size_t)m->ngroups * FERRY_FAMILIES;
  m->tpos_start = calloc(nk + 1, sizeof *m->tpos_start);
  m->tpos = malloc(m->ntrace * sizeof *m->tpos);
  uint32_t *fill = calloc(nk + 1, sizeof *fill);
  if (!m->tpos_start || !m->tpos || !fill) {
    free(m->tpos);
    free(m->tpos_start);
    free(fill);
    m->tpos = m->tpos_start = NULL;
    return; /* falls back to LRU */
  }
  for (size_t i = 0; i < m->ntrace; i++)
    m->tpos_start[key(m, m->trace[i].group, m->trace[i].family) + 1]++;
  for (size_t k = 0; k < nk; k++) m->tpos_start[k + 1] += m->tpos_start[k];
  for (size_t i = 0; i < m->ntrace; i++) {
    size_t k = key(m, m->trace[i].group, m->trace[i].family);
    m->tpos[m->tpos_start[k] + fill[k]++] = (uint32_t)i;
  }
  free(fill);
  m->cursor = 0;
}

void mem_trace_on_fetch(ferry_mem *m, uint32_t group, int family) {
  if (m->recording) {
    if (m->ntrace == m->captrace) {
      size_t nc = m->captrace ? m->captrace * 2 : 256;
      mem_trace_ent *nt = realloc(m->trace, nc * sizeof *nt);
      if (!nt) return; /* a shorter trace: eviction quality only */
      m->trace = nt;
      m->captrace = nc;
    }
    m->trace[m->ntrace++] = (mem_trace_ent){group, (uint8_t)family};
    return;
  }
  if (!m->tpos) return;
  /* Replay: move the cursor past the next occurrence of this fetch. */
  const mem_trace_ent *e = &m->trace[m->cursor];
  if (e->group == group && e->family == family) {
    m->cursor = (m->cursor + 1) % m->ntrace;
    return;
  }
  uint64_t d = next_use(m, group, family);
  if (d != UINT64_MAX) m->cursor = (size_t)((m->cursor + d + 1) % m->ntrace);
}

int ferry_mem_trace_record(ferry_mem *m, int on) {
  if (!m) return FERRY_EINVAL;
  pthread_mutex_lock(&m->mu);
  if (on) {
    m->ntrace = 0;
    m->recording = 1;
  } else if (m->recording) {
    m->recording = 0;
    build_index(m);
  }
  pthread_mutex_unlock(&m->mu);
  return FERRY_OK;
}

int ferry_mem_trace_set(ferry_mem *m, const uint32_t *groups, const int *families, size_t n) {
  if (!m || (n && (!groups || !families))) return FERRY_EINVAL;
  pthread_mutex_lock(&m->mu);
  int rc = FERRY_OK;
  if (!m->finalized) {
    rc = ferry_err(&m->err, FERRY_ESTATE, "trace set: not finalized");
    goto out;
  }
  for (size_t i = 0; i < n; i++)
    if (groups[i] >= m->ngroups || families[i] < 0 || families[i] >= FERRY_FAMILIES) {
      rc = ferry_err(&m->err, FERRY_EINVAL, "trace set: entry %zu (group %u, family %d) is unknown",
                     i, groups[i], families[i]);
      goto out;
    }
  if (n > m->captrace) {
    mem_trace_ent *nt = realloc(m->trace, n * sizeof *nt);
    if (!nt) {
      rc = ferry_err(&m->err, FERRY_ENOMEM, "trace set: out of memory");
      goto out;
    }
    m->trace = nt;
    m->captrace = n;
  }
  for (size_t i = 0; i < n; i++) m->trace[i] = (mem_trace_ent){groups[i], (uint8_t)families[i]};
  m->ntrace = n;
  m->recording = 0;
  build_index(m);
out:
  pthread_mutex_unlock(&m->mu);
  return rc;
}

size_t ferry_mem_trace_length(ferry_mem *m) {
  if (!m) return 0;
  pthread_mutex_lock(&m->mu);
  size_t n = m->ntrace;
  pthread_mutex_unlock(&m->mu);
  return n;
}

int ferry_mem_trace_peek(ferry_mem *m, size_t ahead, uint32_t *group, int *family) {
  if (!m || !group || !family || ahead == 0) return FERRY_EINVAL;
  pthread_mutex_lock(&m->mu);
  int rc = FERRY_ENOENT;
  if (m->tpos && !m->recording) {
    const mem_trace_ent *e = &m->trace[(m->cursor + ahead - 1) % m->ntrace];
    *group = e->group;
    *family = e->family;
    rc = FERRY_OK;
  }
  pthread_mutex_unlock(&m->mu);
  return rc;
}

void mem_trace_free(ferry_mem *m) {
  free(m->trace);
  free(m->tpos);
  free(m->tpos_start);
  m->trace = NULL;
  m->tpos = m->tpos_start = NULL;
}
