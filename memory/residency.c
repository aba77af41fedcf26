/* memory/residency.c — where each chunk is: the per-chunk, per-tier state
 * machine (absent, loading, resident, dirty, writing) with use counts, the
 * asynchronous moves between tiers (H2D / D2H on the manager's copy streams
 * ordered by events, NVMe through the store interface), making room by
 * eviction, and fetch / release / mark dirty / write back / flush.
 * Copies are inclusive: a copy in a tier implies one in every tier between
 * it and the chunk's home, so a write-back always has somewhere to go.
 */
#include "memory/mem_impl.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#define NO_CHUNK UINT32_MAX

static int valid_state(int s) {
  return s == FERRY_RES_RESIDENT || s == FERRY_RES_DIRTY || s == FERRY_RES_WRITING;
}

void mem_set_state(ferry_mem *m, uint32_t ci, int tier, int to) {
  mem_chunk *c = &m->c[ci];
  int from = c->state[tier];
  int ok = 0;
  switch (from) {
  case FERRY_RES_ABSENT: ok = to == FERRY_RES_LOADING; break;
  case FERRY_RES_LOADING:
    ok = to == FERRY_RES_RESIDENT || to == FERRY_RES_DIRTY || to == FERRY_RES_ABSENT;
    break;
  case FERRY_RES_RESIDENT: ok = to == FERRY_RES_DIRTY || to == FERRY_RES_ABSENT; break;
  case FERRY_RES_DIRTY: ok = to == FERRY_RES_WRITING; break;
  case FERRY_RES_WRITING: ok = to == FERRY_RES_RESIDENT || to == FERRY_RES_DIRTY; break;
  }
  if (tier == c->home) ok = 0; /* a home copy is always resident */
  FERRY_ASSERT(ok,
               "memory: chunk %u (%s #%u, groups %u-%u) in the %s tier: illegal transition %s -> "
               "%s",
               ci, ferry_family_name(c->family), c->index, c->gfirst, c->glast,
               ferry_tier_name(tier), ferry_res_state_name(from), ferry_res_state_name(to));
  c->state[tier] = (uint8_t)to;
}

/* ---- pending work ------------------------------------------------------ */

static void pend_add(ferry_mem *m, uint32_t ci) {
  if (m->c[ci].pending) return;
  m->c[ci].pending = 1;
  m->pend[m->npend++] = ci;
}

static int has_work(const mem_chunk *c) {
  return c->io_active || c->d2h_active || c->load_issued || c->queued;
}

/* ---- the users of a device copy ------------------------------------------ */

/* Records that `s` used (read or wrote) chunk c's device copy so far: on
 * s's own event, else on a free one. When MEM_USE_STREAMS other streams hold
 * them all, s waits for one of them (round robin) and takes its event over,
 * so that event still stands for both streams' uses. */
static int note_use(mem_chunk *c, ferry_stream *s) {
  struct mem_use_mark *u = c->use_ev, *slot = NULL;
  for (int k = 0; k < MEM_USE_STREAMS; k++) {
    if (u[k].s == s) return ferry_event_record(u[k].ev, s);
    if (!u[k].s && !slot) slot = &u[k];
  }
  if (!slot) {
    slot = &u[c->use_next++ % MEM_USE_STREAMS];
    int rc = ferry_stream_wait_event(s, slot->ev);
    if (rc) return rc;
  }
  slot->s = s;
  return ferry_event_record(slot->ev, s);
}

/* Work enqueued on `s` (a copy stream) after this waits for every recorded
 * use of c's device copy, on whichever stream. */
static int wait_uses(const mem_chunk *c, ferry_stream *s) {
  int rc = FERRY_OK;
  for (int k = 0; k < MEM_USE_STREAMS && !rc; k++)
    if (c->use_ev[k].s) rc = ferry_stream_wait_event(s, c->use_ev[k].ev);
  return rc;
}

/* (mu held) Room may have come free: the waiters of ferry_mem_wait_change
 * (and of a transfer) look again. */
static void note_change(ferry_mem *m) {
  m->changes++;
  pthread_cond_broadcast(&m->cv);
}

/* A device copy still loading from the host, its H2D the only work in
 * flight: it may be dropped without waiting. Stream order keeps the space
 * safe: the next load into it goes through the same H2D stream, after the
 * dropped one and after every use the releases recorded (mem_drop_copy). The
 * H2D stays in flight (load_issued) until progress sees it done: until
 * then the host copy it reads is neither evicted (has_work) nor written
 * (ferry_mem_mark_dirty waits). */
static int loading_from_host(const mem_chunk *c, int tier) {
  return tier == FERRY_TIER_DEVICE && c->state[tier] == FERRY_RES_LOADING && c->load_issued &&
         !c->queued && !c->d2h_active && !c->io_active;
}

void mem_drop_copy(ferry_mem *m, uint32_t ci, int tier) {
  mem_chunk *c = &m->c[ci];
  FERRY_ASSERT(c->use[tier] == 0 && (!has_work(c) || loading_from_host(c, tier)),
               "memory: dropping chunk %u in the %s tier while in use (%u) or moving", ci,
               ferry_tier_name(tier), c->use[tier]);
  if (tier == FERRY_TIER_DEVICE && c->ev_load) {
    /* Every later load goes through h2d: once it waits for all the users,
     * the marks are spent (the space may go to another chunk). */
    (void)wait_uses(c, m->h2d);
    for (int k = 0; k < MEM_USE_STREAMS; k++) c->use_ev[k].s = NULL;
  }
  mem_set_state(m, ci, tier, FERRY_RES_ABSENT);
  mem_pool_free(&m->pool[tier], c->off[tier]);
  mem_stats_sub(m, tier, c->family, c->bytes);
  c->ahead = 0;
  note_change(m);
}

static int copy_mark(void *arg) {
  const struct mem_copy_mark *k = arg;
  k->m->cfg.on_copy(k->m->cfg.copy_user, k->dir, k->begin);
  return 0;
}

/* Brackets a copy on `s` with the on_copy hook while it is on; off, no host
 * function is launched at all. */
static int mark(ferry_mem *m, ferry_stream *s, int dir, int begin) {
  if (!m->copy_hook_on) return FERRY_OK;
  return ferry_launch_host_func(s, copy_mark, &m->marks[dir][begin]);
}

static int issue_h2d(ferry_mem *m, uint32_t ci) {
  mem_chunk *c = &m->c[ci];
  (void)mark(m, m->h2d, 0, 1);
  int rc = ferry_memcpy_async(m->h2d, mem_tier_addr(m, c, FERRY_TIER_DEVICE),
                              mem_tier_addr(m, c, FERRY_TIER_HOST), c->bytes, FERRY_COPY_H2D);
  (void)mark(m, m->h2d, 0, 0);
  if (!rc) rc = ferry_event_record(c->ev_load, m->h2d);
  c->queued = 0;
  if (rc) {
    mem_set_state(m, ci, FERRY_TIER_DEVICE, FERRY_RES_ABSENT);
    mem_pool_free(&m->pool[0], c->off[0]);
    mem_stats_sub(m, FERRY_TIER_DEVICE, c->family, c->bytes);
    return ferry_err(&m->err, rc, "H2D of chunk %u: %s", ci, ferry_device_last_error(m->cfg.dev));
  }
  c->load_issued = 1;
  m->st.bytes_h2d += c->bytes;
  pend_add(m, ci);
  return FERRY_OK;
}

/* What the store says of chunk ci's failed transfer, for the error of its
 * fetch or write-back ("" when it says nothing or another chunk failed since). */
static const char *io_why(const ferry_mem *m, uint32_t ci) {
  return m->io_why[0] && m->io_why_chunk == ci ? m->io_why : "";
}

static void complete_io(ferry_mem *m, uint32_t ci, int status) {
  mem_chunk *c = &m->c[ci];
  c->io_active = 0;
  if (status != 0 && m->cfg.store.why) {
    m->io_why[0] = 0;
    m->cfg.store.why(m->cfg.store.user, m->io_why, sizeof m->io_why);
    m->io_why_chunk = ci;
  }
  if (c->io_write) {
    if (status == 0) {
      mem_set_state(m, ci, FERRY_TIER_HOST, FERRY_RES_RESIDENT);
      c->never_written = 0;
      m->st.bytes_host_to_nvme += c->bytes;
      m->st.nvme_write_bytes[c->family] += c->bytes;
      m->st.writebacks[FERRY_TIER_HOST]++;
    } else {
      mem_set_state(m, ci, FERRY_TIER_HOST, FERRY_RES_DIRTY);
      c->io_status = status;
    }
    if (c->drop_clean) { /* ferry_mem_evict_clean: goes once written */
      c->drop_clean = 0;
      if (status == 0 && mem_host_droppable(m, ci)) mem_drop_host(m, ci);
    }
  } else if (status == 0) {
    mem_set_state(m, ci, FERRY_TIER_HOST, FERRY_RES_RESIDENT);
    m->st.bytes_nvme_to_host += c->bytes;
    m->st.nvme_read_bytes[c->family] += c->bytes;
  } else {
    c->io_status = status;
    mem_set_state(m, ci, FERRY_TIER_HOST, FERRY_RES_ABSENT);
    mem_pool_free(&m->pool[1], c->off[1]);
    mem_stats_sub(m, FERRY_TIER_HOST, c->family, c->bytes);
  }
}

static void complete_d2h(ferry_mem *m, uint32_t ci) {
  mem_chunk *c = &m->c[ci];
  c->d2h_active = 0;
  mem_set_state(m, ci, FERRY_TIER_DEVICE, FERRY_RES_RESIDENT);
  if (c->home != FERRY_TIER_HOST && c->state[FERRY_TIER_HOST] == FERRY_RES_RESIDENT)
    mem_set_state(m, ci, FERRY_TIER_HOST, FERRY_RES_DIRTY);
  m->st.bytes_d2h += c->bytes;
  m->st.writebacks[FERRY_TIER_DEVICE]++;
}

/* One non-blocking pass over the chunks with work in flight. */
static int progress(ferry_mem *m) {
  int changed = 0;
  for (uint32_t k = 0; k < m->npend;) {
    uint32_t ci = m->pend[k];
    mem_chunk *c = &m->c[ci];
    if (c->io_active && !c->io_waiter) {
      int st = m->cfg.store.poll(m->cfg.store.user, c->io);
      if (st != FERRY_EAGAIN) {
        complete_io(m, ci, st);
        changed = 1;
      }
    }
    if (c->d2h_active && ferry_event_query(c->ev_wb) == 0) {
      complete_d2h(m, ci);
      changed = 1;
    }
    if (c->load_issued && ferry_event_query(c->ev_load) == 0) {
      c->load_issued = 0;
      if (c->state[FERRY_TIER_DEVICE] == FERRY_RES_LOADING)
        mem_set_state(m, ci, FERRY_TIER_DEVICE, FERRY_RES_RESIDENT);
      changed = 1;
    }
    if (c->queued) {
      int hs = c->home == FERRY_TIER_HOST ? FERRY_RES_RESIDENT : c->state[FERRY_TIER_HOST];
      if (valid_state(hs)) {
        (void)issue_h2d(m, ci);
        changed = 1;
      } else if (hs == FERRY_RES_ABSENT) { /* the host load failed */
        c->queued = 0;
        mem_set_state(m, ci, FERRY_TIER_DEVICE, FERRY_RES_ABSENT);
        mem_pool_free(&m->pool[0], c->off[0]);
        mem_stats_sub(m, FERRY_TIER_DEVICE, c->family, c->bytes);
        changed = 1;
      }
    }
    if (!has_work(c)) {
      c->pending = 0;
      m->pend[k] = m->pend[--m->npend];
    } else {
      k++;
    }
  }
  if (changed) note_change(m);
  return changed;
}

/* Blocks (dropping the lock) until chunk ci's transfers advance. */
static void wait_step(ferry_mem *m, uint32_t ci) {
  mem_chunk *c = &m->c[ci];
  if (progress(m)) return;
  if (c->io_active && !c->io_waiter) {
    c->io_waiter = 1;
    pthread_mutex_unlock(&m->mu);
    int st = m->cfg.store.wait(m->cfg.store.user, c->io);
    pthread_mutex_lock(&m->mu);
    c->io_waiter = 0;
    complete_io(m, ci, st);
    progress(m);
    note_change(m);
    return;
  }
  ferry_event *ev = c->d2h_active ? c->ev_wb : c->load_issued ? c->ev_load : NULL;
  if (ev) {
    pthread_mutex_unlock(&m->mu);
    (void)ferry_event_synchronize(ev);
    pthread_mutex_lock(&m->mu);
    progress(m);
    return;
  }
  /* Another thread drives it (store wait, finding space): sleep briefly. */
  struct timespec ts;
  ferry_deadline_after(CLOCK_REALTIME, 0.002, &ts);
  pthread_cond_timedwait(&m->cv, &m->mu, &ts);
  progress(m);
}

/* ---- moves --------------------------------------------------------------- */

/* Starts writing a dirty copy one tier down. FERRY_EAGAIN: the other side
 * is busy (the caller waits and retries). */
static int start_writeback(ferry_mem *m, uint32_t ci, int tier) {
  mem_chunk *c = &m->c[ci];
  if (c->state[tier] != FERRY_RES_DIRTY) return FERRY_OK;
  if (c->use[tier]) return FERRY_EBUSY; /* its holder may still be writing */
  if (tier == FERRY_TIER_DEVICE) {
    /* not into a host copy still moving: an NVMe read landing after the
     * D2H would put the old bytes back over the new (a NOLOAD device copy
     * is dirty while its host copy still loads) */
    if (c->state[FERRY_TIER_HOST] == FERRY_RES_WRITING ||
        c->state[FERRY_TIER_HOST] == FERRY_RES_LOADING || c->io_active)
      return FERRY_EAGAIN;
    if (c->load_issued) return FERRY_EAGAIN; /* NOLOAD: its ordering event is pending */
    int rc = wait_uses(c, m->d2h); /* every holder's writes, on every stream */
    if (!rc) (void)mark(m, m->d2h, 1, 1);
    if (!rc)
      rc = ferry_memcpy_async(m->d2h, mem_tier_addr(m, c, FERRY_TIER_HOST),
                              mem_tier_addr(m, c, FERRY_TIER_DEVICE), c->bytes, FERRY_COPY_D2H);
    if (!rc) (void)mark(m, m->d2h, 1, 0);
    if (!rc) rc = ferry_event_record(c->ev_wb, m->d2h);
    if (rc)
      return ferry_err(&m->err, rc, "D2H of chunk %u: %s", ci,
                       ferry_device_last_error(m->cfg.dev));
    mem_set_state(m, ci, tier, FERRY_RES_WRITING);
    c->d2h_active = 1;
    pend_add(m, ci);
    return FERRY_OK;
  }
  FERRY_ASSERT(tier == FERRY_TIER_HOST && c->home == FERRY_TIER_NVME,
               "memory: write-back of chunk %u from the %s tier", ci, ferry_tier_name(tier));
  if (c->d2h_active || c->io_active) return FERRY_EAGAIN;
  if (!m->cfg.store.write)
    return ferry_err(&m->err, FERRY_ENOTSUP, "write-back of chunk %u: no NVMe store is set", ci);
  c->io_status = 0;
  int rc = m->cfg.store.write(m->cfg.store.user, c->io, (uint32_t)c->off[FERRY_TIER_NVME],
                              mem_tier_addr(m, c, FERRY_TIER_HOST), c->bytes);
  if (rc) return ferry_err(&m->err, rc, "NVMe write of chunk %u failed to start", ci);
  mem_set_state(m, ci, tier, FERRY_RES_WRITING);
  c->io_active = 1;
  c->io_write = 1;
  pend_add(m, ci);
  return FERRY_OK;
}

/* Writes back (if dirty) and waits until the copy in `tier` is clean. */
static int clean_copy(ferry_mem *m, uint32_t ci, int tier) {
  mem_chunk *c = &m->c[ci];
  for (;;) {
    int s = c->state[tier];
    if (s == FERRY_RES_RESIDENT || s == FERRY_RES_ABSENT) return FERRY_OK;
    if (s == FERRY_RES_DIRTY) {
      if (c->io_status && tier == FERRY_TIER_HOST) {
        int st = c->io_status;
        c->io_status = 0;
        const char *w = io_why(m, ci);
        return ferry_err(&m->err, st, "NVMe write of chunk %u (%s #%u) failed: %s%s%s", ci,
                         ferry_family_name(c->family), c->index, ferry_strerror(st),
                         w[0] ? ": " : "", w);
      }
      int rc = start_writeback(m, ci, tier);
      if (rc && rc != FERRY_EAGAIN) return rc;
      if (rc == FERRY_EAGAIN) wait_step(m, ci);
      continue;
    }
    wait_step(m, ci); /* LOADING or WRITING */
  }
}

int mem_evictable(ferry_mem *m, uint32_t ci, int tier) {
  const mem_chunk *c = &m->c[ci];
  if (tier >= c->home || c->use[tier] || (c->resv & (1u << tier))) return 0;
  if (loading_from_host(c, tier)) return 1;
  if (has_work(c)) return 0;
  if (c->state[tier] != FERRY_RES_RESIDENT && c->state[tier] != FERRY_RES_DIRTY) return 0;
  /* A host copy under an idle device copy goes with it (inclusion). */
  if (tier == FERRY_TIER_HOST && c->state[FERRY_TIER_DEVICE] != FERRY_RES_ABSENT)
    return mem_evictable(m, ci, FERRY_TIER_DEVICE);
  return 1;
}

int mem_host_droppable(ferry_mem *m, uint32_t ci) {
  return m->c[ci].state[FERRY_TIER_DEVICE] == FERRY_RES_ABSENT &&
         mem_evictable(m, ci, FERRY_TIER_HOST);
}

void mem_drop_host(ferry_mem *m, uint32_t ci) {
  mem_drop_copy(m, ci, FERRY_TIER_HOST);
  m->st.evictions[FERRY_TIER_HOST]++;
}

/* Makes `tier` clean and drops it; 1 when dropped, 0 when it became busy. */
static int evict_one(ferry_mem *m, uint32_t ci, int tier, int *rc) {
  if (tier == FERRY_TIER_HOST && m->c[ci].state[FERRY_TIER_DEVICE] != FERRY_RES_ABSENT) {
    if (!evict_one(m, ci, FERRY_TIER_DEVICE, rc)) return 0;
    m->st.evictions[FERRY_TIER_DEVICE]++;
  }
  if (loading_from_host(&m->c[ci], tier)) { /* dropped in stream order: no wait */
    *rc = 0;
    mem_drop_copy(m, ci, tier);
    return 1;
  }
  *rc = clean_copy(m, ci, tier);
  if (*rc == FERRY_EBUSY) *rc = 0; /* held meanwhile: not a victim any more */
  if (*rc) return 0;
  if (!mem_evictable(m, ci, tier)) return 0;
  mem_drop_copy(m, ci, tier);
  return 1;
}

/* A copy in `tier` still moving that frees up on its own once done (none:
 * NO_CHUNK): nobody holds it, and a host copy under a device copy nobody
 * holds frees up with it, once that copy's own transfer is done. */
static uint32_t moving_copy(const ferry_mem *m, int tier) {
  for (uint32_t k = 0; k < m->npend; k++) {
    const mem_chunk *o = &m->c[m->pend[k]];
    if (o->state[tier] != FERRY_RES_ABSENT && !o->use[tier] && tier < o->home &&
        (tier == FERRY_TIER_DEVICE || o->state[FERRY_TIER_DEVICE] == FERRY_RES_ABSENT ||
         !o->use[FERRY_TIER_DEVICE]))
      return m->pend[k];
  }
  return NO_CHUNK;
}

/* Finds space for chunk ci in `tier`, evicting what the policy picks. A
 * prefetch never evicts what is needed before ci, nor waits for a device
 * copy still moving (a host wait on the device, maybe on the loop's
 * thread): FERRY_ENOMEM, and the read-ahead stops there. A victim the
 * trace uses again waits instead for a spent write-back to land (evicted,
 * it would be read again: with the optimizer's write-backs in flight,
 * backward evicted the params the next forward then read); a prefetch
 * stops there too rather than wait. Under a cap
 * (ferry_mem_cap) the victims come from one side first: a prefetch stops
 * when that side has none, a fetch waits for the copies still moving,
 * compacts the host pool when its free bytes would fit (a chunk larger
 * than the holes would else evict the capped family's copies and vary
 * with where copies landed), and then takes any. */
static int alloc_space(ferry_mem *m, uint32_t ci, int tier, int prefetch) {
  mem_chunk *c = &m->c[ci];
  mem_pool *p = &m->pool[tier];
  int any = 0; /* the cap's side had nothing left to give: any victim */
  for (;;) {
    int scope = any ? MEM_PICK_ANY : mem_evict_scope(m, tier, ci);
    if (scope != MEM_PICK_CAPPED && p->used + ferry_align_up(c->bytes, p->align) <= p->capacity &&
        mem_pool_alloc(p, c->bytes, &c->off[tier]) == 0) {
      mem_stats_add(m, tier, c->family, c->bytes);
      return FERRY_OK;
    }
    uint32_t v = mem_evict_pick(m, tier, mem_evictable, scope);
    if (v == NO_CHUNK && scope != MEM_PICK_ANY) { /* the cap (ferry_mem_cap) */
      if (prefetch) return FERRY_ENOMEM;
      uint32_t w = moving_copy(m, tier);
      if (w != NO_CHUNK) {
        wait_step(m, w);
      } else if (!(tier == FERRY_TIER_HOST &&
                   p->capacity - p->used >= ferry_align_up(c->bytes, p->align) &&
                   mem_compact_host(m))) {
        any = 1; /* (room enough, in holes too small: gathered into one) */
      }
      continue;
    }
    if (prefetch && (v == NO_CHUNK ? tier == FERRY_TIER_DEVICE : !mem_prefetch_may_evict(m, v, ci)))
      return FERRY_ENOMEM; /* no message: the caller stops its read-ahead */
    if (v == NO_CHUNK) { /* copies still moving free up on their own: wait for one */
      uint32_t moving = moving_copy(m, tier);
      if (moving != NO_CHUNK) {
        wait_step(m, moving);
        continue;
      }
      if (tier == FERRY_TIER_HOST && p->capacity - p->used >= ferry_align_up(c->bytes, p->align) &&
          mem_compact_host(m))
        continue; /* room enough, in holes too small: gathered into one */
      char held[768], b1[32];
      mem_describe_holders(m, tier, held, sizeof held);
      return ferry_err(&m->err, FERRY_ENOMEM,
                       "%s tier full: chunk %u (%s #%u, groups %u-%u) needs %zu bytes; budget %s "
                       "(%zu bytes), %zu in use, of which %zu by the homes of families; held by "
                       "fetched groups: %s",
                       ferry_tier_name(tier), ci, ferry_family_name(c->family), c->index,
                       c->gfirst, c->glast, c->bytes,
                       ferry_format_size(p->capacity, b1, sizeof b1), p->capacity, p->used,
                       m->home_bytes[tier], held);
    }
    uint32_t w = mem_evict_next_use(m, v) != UINT64_MAX ? mem_evict_spent_write(m, tier) : NO_CHUNK;
    if (w != NO_CHUNK) {
      if (prefetch) return FERRY_ENOMEM;
      wait_step(m, w);
      continue;
    }
    int rc;
    if (evict_one(m, v, tier, &rc)) m->st.evictions[tier]++;
    else if (rc) return rc;
  }
}

static void unpin(ferry_mem *m, uint32_t ci, int from, int to) {
  for (int t = from; t < to; t++) {
    FERRY_ASSERT(m->c[ci].use[t] > 0, "memory: chunk %u: use count of the %s tier below zero", ci,
                 ferry_tier_name(t));
    m->c[ci].use[t]--;
  }
}

/* Another thread than the caller may be writing the host copy. */
static int host_written_elsewhere(const mem_chunk *c) {
  return c->host_writer > 1 || (c->host_writer && !pthread_equal(c->writer, pthread_self()));
}

/* Before chunk ci is held in `tier`: a host reader waits until no dirty
 * device copy is newer; a device load may not read a host copy another
 * thread is writing. */
static int acquire_check(ferry_mem *m, uint32_t ci, int tier, int *waited) {
  mem_chunk *c = &m->c[ci];
  if (tier == FERRY_TIER_HOST && c->state[FERRY_TIER_DEVICE] != FERRY_RES_ABSENT) {
    /* Host readers need the newest bytes: the device copy's, if dirty. */
    while (c->state[FERRY_TIER_DEVICE] == FERRY_RES_DIRTY ||
           c->state[FERRY_TIER_DEVICE] == FERRY_RES_WRITING) {
      *waited = 1;
      int rc = clean_copy(m, ci, FERRY_TIER_DEVICE);
      if (rc == FERRY_EBUSY)
        return ferry_err(&m->err, rc,
                         "fetch to the host: chunk %u (%s #%u, groups %u-%u) is dirty on the "
                         "device and held there %u time(s); release it first",
                         ci, ferry_family_name(c->family), c->index, c->gfirst, c->glast,
                         c->use[FERRY_TIER_DEVICE]);
      if (rc) return rc;
    }
  }
  if (tier == FERRY_TIER_DEVICE && c->state[FERRY_TIER_DEVICE] == FERRY_RES_ABSENT &&
      host_written_elsewhere(c))
    return ferry_err(&m->err, FERRY_EBUSY,
                     "fetch to the device: chunk %u (%s #%u, groups %u-%u) is being written on "
                     "the host by another thread (marked dirty there, held %u time(s)); release "
                     "it there first",
                     ci, ferry_family_name(c->family), c->index, c->gfirst, c->glast,
                     c->hold_host);
  return FERRY_OK;
}

/* Fills the host copy of chunk ci, whose space was just reserved: zeros
 * when its NVMe slot was never written, else an NVMe read is started. */
static int start_host_fill(ferry_mem *m, uint32_t ci) {
  mem_chunk *c = &m->c[ci];
  int t = FERRY_TIER_HOST, rc = FERRY_OK;
  if (c->never_written) {
    memset(mem_tier_addr(m, c, t), 0, c->bytes);
    mem_set_state(m, ci, t, FERRY_RES_RESIDENT);
  } else if (!m->cfg.store.read) {
    rc = ferry_err(&m->err, FERRY_ENOTSUP, "load of chunk %u: no NVMe store is set", ci);
  } else {
    c->io_status = 0;
    rc = m->cfg.store.read(m->cfg.store.user, c->io, (uint32_t)c->off[FERRY_TIER_NVME],
                           mem_tier_addr(m, c, t), c->bytes);
    if (rc) rc = ferry_err(&m->err, rc, "NVMe read of chunk %u failed to start", ci);
    else {
      c->io_active = 1;
      c->io_write = 0;
      pend_add(m, ci);
    }
  }
  return rc;
}

/* acquire's flag for a prefetch (beside FERRY_MEM_*): see alloc_space. */
#define ACQUIRE_PREFETCH (1u << 31)

/* Holds chunk ci in tiers tier..home-1, reserving space and starting loads
 * where it is absent. On failure nothing of this call stays held. */
static int acquire(ferry_mem *m, uint32_t ci, int tier, uint32_t group, unsigned flags,
                   int *waited) {
  mem_chunk *c = &m->c[ci];
  int rc = acquire_check(m, ci, tier, waited);
  if (rc) return rc;
  for (int t = c->home - 1; t >= tier; t--) {
    c->use[t]++;
    if (c->state[t] != FERRY_RES_ABSENT) continue;
    mem_set_state(m, ci, t, FERRY_RES_LOADING);
    c->resv |= (uint8_t)(1u << t);
    rc = alloc_space(m, ci, t, (flags & ACQUIRE_PREFETCH) != 0);
    c->resv &= (uint8_t)~(1u << t);
    pthread_cond_broadcast(&m->cv);
    if (rc) {
      mem_set_state(m, ci, t, FERRY_RES_ABSENT);
      unpin(m, ci, t, c->home);
      return rc;
    }
    if (t == FERRY_TIER_HOST && t == tier && (flags & FERRY_MEM_NOLOAD) && c->gfirst == group &&
        c->glast == group) {
      mem_set_state(m, ci, t, FERRY_RES_DIRTY); /* the caller writes every byte: no read */
    } else if (t == FERRY_TIER_HOST) {
      if ((rc = start_host_fill(m, ci))) {
        mem_set_state(m, ci, t, FERRY_RES_ABSENT);
        mem_pool_free(&m->pool[1], c->off[1]);
        mem_stats_sub(m, t, c->family, c->bytes);
        unpin(m, ci, t, c->home);
        return rc;
      }
    } else if ((flags & FERRY_MEM_NOLOAD) && c->gfirst == group && c->glast == group) {
      /* No bytes to move; the event orders the caller after earlier users. */
      rc = ferry_event_record(c->ev_load, m->h2d);
      FERRY_ASSERT(rc == 0, "memory: event record failed: %s",
                   ferry_device_last_error(m->cfg.dev));
      c->load_issued = 1;
      pend_add(m, ci);
      mem_set_state(m, ci, t, FERRY_RES_DIRTY);
    } else {
      int hs = c->home == FERRY_TIER_HOST ? FERRY_RES_RESIDENT : c->state[FERRY_TIER_HOST];
      if (valid_state(hs)) {
        if ((rc = issue_h2d(m, ci))) {
          unpin(m, ci, t, c->home);
          return rc;
        }
      } else {
        c->queued = 1;
        pend_add(m, ci);
      }
    }
  }
  return FERRY_OK;
}

/* ---- the API ------------------------------------------------------------- */

int mem_check_call(ferry_mem *m, uint32_t group, int family, int tier, const char *op,
                   const mem_range **r) {
  if (!m->finalized) return ferry_err(&m->err, FERRY_ESTATE, "%s: the layout is not final", op);
  if (family < 0 || family >= FERRY_FAMILIES)
    return ferry_err(&m->err, FERRY_EINVAL, "%s: unknown family %d", op, family);
  if (tier < 0 || tier >= FERRY_TIER_NVME)
    return ferry_err(&m->err, FERRY_EINVAL, "%s: tier %d is not device or host", op, tier);
  if (group >= m->ngroups) return ferry_err(&m->err, FERRY_ENOENT, "%s: no group %u", op, group);
  if (tier < m->cfg.reach[family])
    return ferry_err(&m->err, FERRY_EINVAL,
                     "%s: the %s family does not reach the %s tier (reach is %s)", op,
                     ferry_family_name(family), ferry_tier_name(tier),
                     ferry_tier_name(m->cfg.reach[family]));
  *r = &m->ranges[(size_t)group * FERRY_FAMILIES + family];
  return FERRY_OK;
}

static int all_resident(ferry_mem *m, const mem_range *r, int tier) {
  for (uint32_t ci = r->first; ci < r->first + r->count; ci++) {
    const mem_chunk *c = &m->c[ci];
    for (int t = tier; t < c->home; t++)
      if (!valid_state(c->state[t]) || (c->resv & (1u << t))) return 0;
    if (tier == FERRY_TIER_HOST && c->state[FERRY_TIER_DEVICE] != FERRY_RES_ABSENT &&
        c->state[FERRY_TIER_DEVICE] != FERRY_RES_RESIDENT &&
        c->state[FERRY_TIER_DEVICE] != FERRY_RES_LOADING)
      return 0;
  }
  return 1;
}

static int do_fetch(ferry_mem *m, uint32_t group, int family, int tier, ferry_stream *stream,
                    unsigned flags, int hold) {
  const mem_range *r;
  pthread_mutex_lock(&m->mu);
  int rc = mem_check_call(m, group, family, tier, hold ? "fetch" : "prefetch", &r);
  if (rc) goto out;
  if (m->npend) progress(m);
  if (hold) {
    m->st.fetches++;
    if (!(flags & FERRY_MEM_NOTRACE)) mem_trace_on_fetch(m, group, family);
  }
  uint64_t now = ++m->clock;
  if (hold && all_resident(m, r, tier)) { /* the fast path: no moves, no allocation */
    for (uint32_t ci = r->first; ci < r->first + r->count; ci++) {
      mem_chunk *c = &m->c[ci];
      for (int t = tier; t < c->home; t++) c->use[t]++;
      if (tier == FERRY_TIER_HOST) c->hold_host++;
      c->last_use = now;
      c->ahead = 0;
    }
    m->st.fetch_hits++;
    goto out;
  }
  int waited = 0;
  double t0 = ferry_now();
  uint32_t done = r->first;
  for (; done < r->first + r->count; done++) {
    if ((rc = acquire(m, done, tier, group, flags, &waited))) break;
    m->c[done].last_use = now;
    if (hold) m->c[done].ahead = 0;
  }
  if (rc) { /* nothing stays held */
    for (uint32_t ci = r->first; ci < done; ci++) unpin(m, ci, tier, m->c[ci].home);
    goto out;
  }
  /* Wait: host targets until the bytes are there; device targets until the
   * H2D is issued, then order the stream after it. */
  for (uint32_t ci = r->first; ci < r->first + r->count && !rc; ci++) {
    mem_chunk *c = &m->c[ci];
    for (;;) {
      int s = c->state[tier];
      if (s == FERRY_RES_ABSENT) {
        const char *w = c->io_status ? io_why(m, ci) : "";
        rc = ferry_err(&m->err, c->io_status ? c->io_status : FERRY_ENOMEM,
                       "fetch of group %u (%s) to the %s tier: chunk %u (%s #%u) could not be "
                       "loaded (%s%s%s)",
                       group, ferry_family_name(family), ferry_tier_name(tier), ci,
                       ferry_family_name(c->family), c->index,
                       c->io_status ? ferry_strerror(c->io_status) : "space taken concurrently",
                       w[0] ? ": " : "", w);
        break;
      }
      int busy = (c->resv & (1u << tier)) ||
                 (tier == FERRY_TIER_HOST ? s == FERRY_RES_LOADING : c->queued != 0);
      if (!busy && tier == FERRY_TIER_DEVICE && !stream && c->load_issued) busy = 1;
      if (!busy) break;
      waited = 1;
      wait_step(m, ci);
    }
    if (!rc && tier == FERRY_TIER_DEVICE && stream && c->load_issued)
      rc = ferry_stream_wait_event(stream, c->ev_load);
    if (!rc && !hold) break;
  }
  if (rc || !hold) {
    for (uint32_t ci = r->first; ci < r->first + r->count; ci++) unpin(m, ci, tier, m->c[ci].home);
  } else if (tier == FERRY_TIER_HOST) {
    for (uint32_t ci = r->first; ci < r->first + r->count; ci++) m->c[ci].hold_host++;
  }
  if (waited && hold) {
    m->st.stalls++;
    m->st.stall_seconds += ferry_now() - t0;
  }
out:
  pthread_mutex_unlock(&m->mu);
  return rc;
}

int ferry_mem_fetch(ferry_mem *m, uint32_t group, int family, int tier, ferry_stream *stream,
                    unsigned flags) {
  if (!m) return FERRY_EINVAL;
  return do_fetch(m, group, family, tier, stream, flags, 1);
}

int ferry_mem_prefetch(ferry_mem *m, uint32_t group, int family, int tier) {
  if (!m) return FERRY_EINVAL;
  /* A prefetch holds while it finds space and starts loads, then lets go. */
  const mem_range *r;
  pthread_mutex_lock(&m->mu);
  int rc = mem_check_call(m, group, family, tier, "prefetch", &r);
  if (rc) goto out;
  if (m->npend) progress(m);
  int waited = 0;
  uint32_t done = r->first;
  for (; done < r->first + r->count; done++)
    if ((rc = acquire(m, done, tier, group, ACQUIRE_PREFETCH, &waited))) break;
  for (uint32_t ci = r->first; ci < done; ci++) {
    unpin(m, ci, tier, m->c[ci].home);
    m->c[ci].ahead = 1; /* its fetch comes next: evicted last until then */
  }
  if (done > r->first) note_change(m);
out:
  pthread_mutex_unlock(&m->mu);
  return rc;
}

int ferry_mem_release(ferry_mem *m, uint32_t group, int family, int tier, ferry_stream *stream) {
  if (!m) return FERRY_EINVAL;
  const mem_range *r;
  pthread_mutex_lock(&m->mu);
  int rc = mem_check_call(m, group, family, tier, "release", &r);
  if (rc) goto out;
  for (uint32_t ci = r->first; ci < r->first + r->count; ci++)
    for (int t = tier; t < m->c[ci].home; t++)
      if (!m->c[ci].use[t]) {
        rc = ferry_err(&m->err, FERRY_ESTATE,
                       "release of group %u (%s) in the %s tier: chunk %u is not held there", group,
                       ferry_family_name(family), ferry_tier_name(tier), ci);
        goto out;
      }
  for (uint32_t ci = r->first; ci < r->first + r->count; ci++) {
    mem_chunk *c = &m->c[ci];
    if (tier == FERRY_TIER_DEVICE && stream && c->use_ev[0].ev) {
      int e = note_use(c, stream);
      if (e && !rc) rc = ferry_err(&m->err, e, "release: %s", ferry_device_last_error(m->cfg.dev));
    }
    unpin(m, ci, tier, c->home);
    if (tier == FERRY_TIER_HOST && c->hold_host && --c->hold_host == 0)
      c->host_writer = 0; /* the host writers are done: loads from it may start */
  }
  note_change(m);
  if (m->npend) progress(m);
out:
  pthread_mutex_unlock(&m->mu);
  return rc;
}

int ferry_mem_mark_dirty(ferry_mem *m, uint32_t group, int family, int tier,
                         ferry_stream *stream) {
  if (!m) return FERRY_EINVAL;
  const mem_range *r;
  pthread_mutex_lock(&m->mu);
  int rc = mem_check_call(m, group, family, tier, "mark dirty", &r);
  if (rc) goto out;
  if (m->npend) progress(m);
  for (uint32_t ci = r->first; ci < r->first + r->count; ci++) {
    const mem_chunk *c = &m->c[ci];
    if (tier < c->home && !c->use[tier]) {
      rc = ferry_err(&m->err, FERRY_ESTATE,
                     "mark dirty of group %u (%s) in the %s tier: chunk %u is not held there",
                     group, ferry_family_name(family), ferry_tier_name(tier), ci);
      goto out;
    }
    if (tier == FERRY_TIER_HOST && c->state[FERRY_TIER_DEVICE] != FERRY_RES_ABSENT) {
      int ds = c->state[FERRY_TIER_DEVICE];
      if (c->use[FERRY_TIER_DEVICE] || ds == FERRY_RES_DIRTY || ds == FERRY_RES_WRITING) {
        rc = ferry_err(&m->err, FERRY_EBUSY,
                       "mark dirty of group %u (%s) on the host: chunk %u has a %s device copy "
                       "held %u time(s); release (and write back) the device copy first",
                       group, ferry_family_name(family), ci, ferry_res_state_name(ds),
                       c->use[FERRY_TIER_DEVICE]);
        goto out;
      }
    }
  }
  for (uint32_t ci = r->first; ci < r->first + r->count; ci++) {
    mem_chunk *c = &m->c[ci];
    if (tier == FERRY_TIER_HOST) {
      /* The device copy is stale now: drop it once nothing moves. */
      /* (also an H2D from it still in flight for a copy dropped since) */
      while ((c->state[FERRY_TIER_DEVICE] != FERRY_RES_ABSENT && has_work(c)) || c->load_issued)
        wait_step(m, ci);
      if (c->state[FERRY_TIER_DEVICE] != FERRY_RES_ABSENT) {
        if (c->state[FERRY_TIER_DEVICE] != FERRY_RES_RESIDENT || c->use[FERRY_TIER_DEVICE]) {
          rc = ferry_err(&m->err, FERRY_EBUSY,
                         "mark dirty of group %u (%s) on the host: chunk %u was fetched to the "
                         "device meanwhile",
                         group, ferry_family_name(family), ci);
          goto out;
        }
        mem_drop_copy(m, ci, FERRY_TIER_DEVICE);
      }
      /* Held here: its holder writes until release; no other thread loads
       * from it meanwhile (a device fetch or prefetch is FERRY_EBUSY). */
      if (c->hold_host) {
        if (!c->host_writer) {
          c->host_writer = 1;
          c->writer = pthread_self();
        } else if (!pthread_equal(c->writer, pthread_self())) {
          c->host_writer = 2;
        }
      }
    }
    if (tier == c->home) continue;
    while (c->state[tier] == FERRY_RES_WRITING || (tier == FERRY_TIER_HOST && c->d2h_active))
      wait_step(m, ci);
    if (c->state[tier] != FERRY_RES_DIRTY) mem_set_state(m, ci, tier, FERRY_RES_DIRTY);
    if (tier == FERRY_TIER_DEVICE && stream && c->use_ev[0].ev) {
      int e = note_use(c, stream);
      if (e && !rc) rc = ferry_err(&m->err, e, "mark dirty: %s", ferry_device_last_error(m->cfg.dev));
    }
  }
out:
  pthread_mutex_unlock(&m->mu);
  return rc;
}

int ferry_mem_wait_users(ferry_mem *m, uint32_t group, int family, ferry_stream *stream) {
  if (!m || !stream) return FERRY_EINVAL;
  const mem_range *r = NULL;
  pthread_mutex_lock(&m->mu);
  int rc = mem_check_call(m, group, family, FERRY_TIER_DEVICE, "wait for users", &r);
  for (uint32_t ci = rc ? 0 : r->first; !rc && ci < r->first + r->count; ci++) {
    mem_chunk *c = &m->c[ci];
    if (c->state[FERRY_TIER_DEVICE] == FERRY_RES_ABSENT || !c->use_ev[0].ev) continue;
    int e = wait_uses(c, stream);
    if (e) rc = ferry_err(&m->err, e, "wait for users: %s", ferry_device_last_error(m->cfg.dev));
  }
  pthread_mutex_unlock(&m->mu);
  return rc;
}

int ferry_mem_writeback(ferry_mem *m, uint32_t group, int family, int tier) {
  if (!m) return FERRY_EINVAL;
  const mem_range *r;
  pthread_mutex_lock(&m->mu);
  int rc = mem_check_call(m, group, family, tier, "write back", &r);
  if (rc) goto out;
  if (m->npend) progress(m);
  for (uint32_t ci = r->first; ci < r->first + r->count && !rc; ci++) {
    if (tier >= m->c[ci].home) continue;
    while ((rc = start_writeback(m, ci, tier)) == FERRY_EAGAIN) wait_step(m, ci);
    if (rc == FERRY_EBUSY) rc = 0; /* held: written back after release */
  }
out:
  pthread_mutex_unlock(&m->mu);
  return rc;
}

int ferry_mem_evict(ferry_mem *m, uint32_t group, int family, int tier) {
  if (!m) return FERRY_EINVAL;
  const mem_range *r;
  pthread_mutex_lock(&m->mu);
  int rc = mem_check_call(m, group, family, tier, "evict", &r);
  if (rc) goto out;
  if (m->npend) progress(m);
  for (uint32_t ci = r->first; ci < r->first + r->count && !rc; ci++) {
    mem_chunk *c = &m->c[ci];
    for (int t = FERRY_TIER_DEVICE; t <= tier && !rc; t++) {
      if (t >= c->home) continue;
      while (c->state[t] == FERRY_RES_LOADING && !c->use[t]) wait_step(m, ci);
      if (c->state[t] == FERRY_RES_ABSENT) continue;
      if (c->use[t]) {
        rc = ferry_err(&m->err, FERRY_EBUSY,
                       "evict group %u (%s) from the %s tier: chunk %u is held %u time(s)", group,
                       ferry_family_name(family), ferry_tier_name(t), ci, c->use[t]);
        break;
      }
      int e;
      if (evict_one(m, ci, t, &e)) m->st.evictions[t]++;
      else if (e) rc = e;
      else if (c->state[t] != FERRY_RES_ABSENT)
        rc = ferry_err(&m->err, FERRY_EBUSY, "evict: chunk %u became busy", ci);
    }
  }
out:
  pthread_mutex_unlock(&m->mu);
  return rc;
}

int ferry_mem_flush(ferry_mem *m) {
  if (!m) return FERRY_EINVAL;
  pthread_mutex_lock(&m->mu);
  int rc = m->finalized ? FERRY_OK : ferry_err(&m->err, FERRY_ESTATE, "flush: not finalized");
  for (int t = FERRY_TIER_DEVICE; t < FERRY_TIER_NVME && !rc; t++) {
    for (uint32_t ci = 0; ci < m->nc && !rc; ci++) {
      if (t >= m->c[ci].home) continue;
      int e = start_writeback(m, ci, t);
      if (e && e != FERRY_EAGAIN && e != FERRY_EBUSY) rc = e;
    }
    for (uint32_t ci = 0; ci < m->nc && !rc; ci++)
      if (t < m->c[ci].home && (rc = clean_copy(m, ci, t)) == FERRY_EBUSY) rc = 0;
  }
  pthread_mutex_unlock(&m->mu);
  return rc;
}

uint64_t ferry_mem_changes(ferry_mem *m) {
  if (!m) return 0;
  pthread_mutex_lock(&m->mu);
  uint64_t n = m->changes;
  pthread_mutex_unlock(&m->mu);
  return n;
}

int ferry_mem_notify(ferry_mem *m) {
  if (!m) return FERRY_EINVAL;
  pthread_mutex_lock(&m->mu);
  note_change(m);
  pthread_mutex_unlock(&m->mu);
  return FERRY_OK;
}

int ferry_mem_wait_change(ferry_mem *m, uint64_t *seen, double deadline) {
  if (!m || !seen) return FERRY_EINVAL;
  pthread_mutex_lock(&m->mu);
  if (m->npend) progress(m);
  while (m->changes == *seen) {
    double left = deadline - ferry_now();
    if (left <= 0) break;
    if (m->npend) { /* a transfer in flight: waited for, it moves the count when done */
      wait_step(m, m->pend[0]);
      continue;
    }
    struct timespec ts;
    ferry_deadline_after(CLOCK_REALTIME, left, &ts);
    pthread_cond_timedwait(&m->cv, &m->mu, &ts);
  }
  int moved = m->changes != *seen;
  *seen = m->changes;
  pthread_mutex_unlock(&m->mu);
  return moved ? FERRY_OK : FERRY_ETIMEDOUT;
}

int ferry_mem_poll(ferry_mem *m) {
  if (!m) return FERRY_EINVAL;
  pthread_mutex_lock(&m->mu);
  if (m->npend) progress(m);
  pthread_mutex_unlock(&m->mu);
  return FERRY_OK;
}

int ferry_mem_copy_hook(ferry_mem *m, int on) {
  if (!m) return FERRY_EINVAL;
  if (on && !m->cfg.on_copy)
    return ferry_err(&m->err, FERRY_ESTATE, "copy hook: the config has no on_copy to call");
  pthread_mutex_lock(&m->mu);
  m->copy_hook_on = on != 0;
  pthread_mutex_unlock(&m->mu);
  return FERRY_OK;
}

/* Waits for everything in flight (destroy). */
void mem_drain(ferry_mem *m) {
  pthread_mutex_lock(&m->mu);
  while (m->npend) wait_step(m, m->pend[0]);
  pthread_mutex_unlock(&m->mu);
}
