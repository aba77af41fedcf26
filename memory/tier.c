/* memory/tier.c — reserving the tiers at finalize: the device arena (one
 * ferry_device_alloc of the device budget), the host pool (pinned through the
 * backend after an RLIMIT_MEMLOCK check, or pageable as a logged fallback
 * that the stats report and the cuda backend refuses; NUMA-local through
 * hwloc, bound before the pages are touched and pinned; huge pages by
 * madvise), the homes zeroed (the host pool's, and on the host backend
 * the device arena's, by all threads when they are gigabytes), the copy
 * streams, the per-chunk events and store requests. Nothing here
 * runs after start.
 */
#include "memory/mem_impl.h"

#include "core/par.h"

#include <errno.h>
#include <hwloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#define HUGE_2M ((size_t)2 << 20)

/* The NUMA node(s) of the calling thread's CPU, when there is more than one
 * node; ok 0 otherwise (nothing to bind). */
typedef struct {
  hwloc_topology_t topo;
  hwloc_nodeset_t nodes;
  int loaded, ok;
} numa_local;

static void numa_open(numa_local *n) {
  memset(n, 0, sizeof *n);
  if (hwloc_topology_init(&n->topo) != 0) return;
  n->loaded = hwloc_topology_load(n->topo) == 0;
  if (!n->loaded || hwloc_get_nbobjs_by_type(n->topo, HWLOC_OBJ_NUMANODE) < 2) return;
  hwloc_cpuset_t cpu = hwloc_bitmap_alloc();
  n->nodes = hwloc_bitmap_alloc();
  if (cpu && n->nodes && hwloc_get_last_cpu_location(n->topo, cpu, HWLOC_CPUBIND_THREAD) == 0 &&
      hwloc_cpuset_to_nodeset(n->topo, cpu, n->nodes) == 0)
    n->ok = 1;
  hwloc_bitmap_free(cpu);
}

static void numa_close(numa_local *n) {
  hwloc_bitmap_free(n->nodes);
  hwloc_topology_destroy(n->topo);
}

/* Binds the pageable range [p, p+len), not touched yet, to the local node:
 * its pages are placed there when first touched. Best effort, logged. */
static void bind_area(ferry_mem *m, void *p, size_t len) {
  numa_local n;
  numa_open(&n);
  if (n.ok) {
    if (hwloc_set_area_membind(n.topo, p, len, n.nodes, HWLOC_MEMBIND_BIND,
                               HWLOC_MEMBIND_BYNODESET) == 0)
      ferry_logf(&m->cfg.log, FERRY_LOG_INFO, "memory: host pool bound to the local NUMA node");
    else
      ferry_logf(&m->cfg.log, FERRY_LOG_WARN,
                 "memory: cannot bind the host pool to the local NUMA node: %s", strerror(errno));
  }
  numa_close(&n);
}

/* ferry_host_alloc with this thread's memory policy bound to the local node
 * for the call: the backend touches and pins the pages inside it (mlock,
 * cudaHostAlloc), so they are placed there before they are pinned (pinned
 * pages cannot move afterwards). The thread's policy is restored after. */
static int host_alloc_local(ferry_mem *m, size_t len, void **p) {
  numa_local n;
  if (m->cfg.numa_local) numa_open(&n);
  else memset(&n, 0, sizeof n);
  hwloc_nodeset_t old = n.ok ? hwloc_bitmap_alloc() : NULL;
  hwloc_membind_policy_t oldpol = HWLOC_MEMBIND_DEFAULT;
  const int flags = HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET;
  int bound = old && hwloc_get_membind(n.topo, old, &oldpol, flags) == 0 &&
              hwloc_set_membind(n.topo, n.nodes, HWLOC_MEMBIND_BIND, flags) == 0;
  if (n.ok && !bound)
    ferry_logf(&m->cfg.log, FERRY_LOG_WARN,
               "memory: cannot bind the pinned host pool to the local NUMA node: %s",
               strerror(errno));
  int rc = ferry_host_alloc(m->cfg.dev, len, p);
  if (bound) {
    if (hwloc_set_membind(n.topo, old, oldpol, flags) != 0)
      (void)hwloc_set_membind(n.topo, old, HWLOC_MEMBIND_DEFAULT, flags);
    if (!rc)
      ferry_logf(&m->cfg.log, FERRY_LOG_INFO,
                 "memory: pinned host pool placed on the local NUMA node");
  }
  hwloc_bitmap_free(old);
  if (n.topo) numa_close(&n);
  return rc;
}

/* 0 when the pool may be pinned, 1 when it must fall back to pageable
 * memory, or an error. */
static int check_memlock(ferry_mem *m, size_t need) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return 0;
  if ((uint64_t)rl.rlim_cur >= need) return 0;
  ferry_device_info di;
  ferry_device_get_info(m->cfg.dev, &di);
  char b1[32], b2[32];
  ferry_format_size(rl.rlim_cur, b1, sizeof b1);
  ferry_format_size(need, b2, sizeof b2);
  if (di.kind == FERRY_DEVICE_CUDA) {
    /* cudaHostAlloc pins in the driver, outside RLIMIT_MEMLOCK. */
    ferry_logf(&m->cfg.log, FERRY_LOG_WARN,
               "memory: RLIMIT_MEMLOCK is %s (%llu bytes), the pinned host pool needs %s; the "
               "CUDA driver pins outside that limit, continuing",
               b1, (unsigned long long)rl.rlim_cur, b2);
    return 0;
  }
  if (!di.host_lock_pinned) return 0; /* this backend does not lock pages */
  if (m->cfg.pinned_fallback) {
    ferry_logf(&m->cfg.log, FERRY_LOG_WARN,
               "memory: RLIMIT_MEMLOCK (ulimit -l) is %s (%llu bytes) but the pinned host pool "
               "needs %s (%zu bytes): using pageable host memory instead (slower copies)",
               b1, (unsigned long long)rl.rlim_cur, b2, need);
    return 1;
  }
  ferry_logf(&m->cfg.log, FERRY_LOG_ERROR,
             "memory: RLIMIT_MEMLOCK %llu bytes < pinned host pool %zu bytes",
             (unsigned long long)rl.rlim_cur, need);
  return ferry_err(&m->err, FERRY_ENOMEM,
                   "pinned host pool: RLIMIT_MEMLOCK (ulimit -l) is %s (%llu bytes) but the pool "
                   "needs %s (%zu bytes); raise the limit (ulimit -l, memlock in "
                   "/etc/security/limits.conf), lower tiers.host.budget, or allow the pageable "
                   "fallback",
                   b1, (unsigned long long)rl.rlim_cur, b2, need);
}

/* A pageable pool on the cuda backend is refused: the runtime runs copies
 * from and to pageable memory synchronously, and the manager issues them
 * under its lock, so every transfer would stall every thread that calls it.
 * (The host backend's copy engines are asynchronous for any memory.) */
static int refuse_pageable_on_cuda(ferry_mem *m, size_t len, const char *why) {
  ferry_device_info di;
  if (ferry_device_get_info(m->cfg.dev, &di) != 0 || di.kind != FERRY_DEVICE_CUDA)
    return FERRY_OK;
  ferry_logf(&m->cfg.log, FERRY_LOG_ERROR,
             "memory: refusing a pageable host pool of %zu bytes on cuda (%s)", len, why);
  return ferry_err(&m->err, FERRY_ENOTSUP,
                   "host pool of %zu bytes: %s; on the cuda backend the pool must be pinned (a "
                   "copy from or to pageable memory is synchronous and would run under the "
                   "memory manager's lock): set tiers.host.pinned = true (the CUDA driver pins "
                   "outside RLIMIT_MEMLOCK) or lower tiers.host.budget",
                   len, why);
}

/* The pinned pool, or FERRY_EAGAIN when it is to be pageable instead (the
 * memlock check or the allocation failed and the fallback is allowed). */
static int reserve_pinned(ferry_mem *m, size_t len, char *why, size_t why_len) {
  int rc = check_memlock(m, len);
  if (rc < 0) return rc;
  if (rc == 1) {
    snprintf(why, why_len, "RLIMIT_MEMLOCK is below the %zu bytes to pin", len);
    return FERRY_EAGAIN;
  }
  void *p = NULL;
  rc = host_alloc_local(m, len, &p);
  if (rc == 0) {
    m->host_base = p;
    m->host_is_pinned = 1;
    /* the host backend pins (mlock) only with host_lock_pinned: else the
     * pool is the device's allocation but pageable, and the stats say so */
    ferry_device_info di;
    int locked = ferry_device_get_info(m->cfg.dev, &di) != 0 || di.kind != FERRY_DEVICE_HOST ||
                 di.host_lock_pinned;
    m->st.host_pageable_bytes = locked ? 0 : len;
    ferry_logf(&m->cfg.log, FERRY_LOG_INFO, "memory: pinned host pool of %zu bytes%s", len,
               locked ? "" : " (the host backend without host_lock_pinned: pageable)");
    return FERRY_OK;
  }
  if (!m->cfg.pinned_fallback)
    return ferry_err(&m->err, rc, "pinned host pool of %zu bytes: %s", len,
                     ferry_device_last_error(m->cfg.dev));
  snprintf(why, why_len, "pinning it failed: %s", ferry_device_last_error(m->cfg.dev));
  return FERRY_EAGAIN;
}

static int reserve_host(ferry_mem *m, size_t len) {
  char why[FERRY_ERR_MAX + 64] = "tiers.host.pinned is false";
  if (m->cfg.host_pinned) {
    int rc = reserve_pinned(m, len, why, sizeof why);
    if (rc != FERRY_EAGAIN) return rc;
  }
  int rc = refuse_pageable_on_cuda(m, len, why);
  if (rc) return rc;
  size_t maplen = ferry_align_up(len, HUGE_2M);
  void *p = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return ferry_err(&m->err, FERRY_ENOMEM, "host pool: cannot map %zu bytes: %s", maplen,
                     strerror(errno));
  if (madvise(p, maplen, MADV_HUGEPAGE) != 0)
    ferry_logf(&m->cfg.log, FERRY_LOG_DEBUG, "memory: no transparent huge pages for the host pool");
  if (m->cfg.numa_local) bind_area(m, p, maplen); /* before the first touch */
  m->host_base = p;
  m->host_map_len = maplen;
  m->host_is_pinned = 0;
  m->st.host_pageable_bytes = len;
  /* A fallback the caller did not choose is a warning; a chosen one is info. */
  ferry_logf(&m->cfg.log, m->cfg.host_pinned ? FERRY_LOG_WARN : FERRY_LOG_INFO,
             "memory: pageable host pool of %zu bytes (%s); copies from it are slower", len, why);
  return FERRY_OK;
}

int mem_alloc_io(ferry_mem *m) {
  if (m->io_mem || !m->cfg.store.read || m->nslots == 0) return FERRY_OK;
  size_t rs = ferry_align_up(m->cfg.store.req_size ? m->cfg.store.req_size : 1, 64);
  m->io_mem = aligned_alloc(64, rs * m->nc);
  if (!m->io_mem) return ferry_err(&m->err, FERRY_ENOMEM, "store requests: out of memory");
  memset(m->io_mem, 0, rs * m->nc);
  for (uint32_t i = 0; i < m->nc; i++) m->c[i].io = m->io_mem + rs * i;
  return FERRY_OK;
}

/* The homes of tier t in [lo, hi) of its pool, allocated first and so
 * packed from the pool's start: gigabytes of them (a model's params and
 * states held in host memory, or in the host backend's device arena)
 * zeroed, first touched when pageable, by all threads; the rest of a pool
 * stays untouched until used. */
static int zero_homes(ferry_mem *m, int t, size_t lo, size_t hi) {
  char *base = t == FERRY_TIER_HOST ? m->host_base : m->dev_base;
  const char *what = t == FERRY_TIER_HOST ? "host" : "device";
  double t0 = ferry_now();
  if (ferry_par_zero_stop(base + lo, hi - lo, 0, m->cfg.cancel, m->cfg.cancel_user))
    return ferry_err(&m->err, FERRY_ECANCELED, "zeroing the %s homes: cancelled by the caller",
                     what);
  ferry_logf(&m->cfg.log, FERRY_LOG_DEBUG, "memory: %s homes of %zu bytes zeroed in %.2f s", what,
             hi - lo, ferry_now() - t0);
  return FERRY_OK;
}

int mem_tiers_reserve(ferry_mem *m) {
  ferry_device *dev = m->cfg.dev;
  int rc;
  int need_dev = 0, need_host = 0;
  for (int f = 0; f < FERRY_FAMILIES; f++) {
    if (m->cfg.reach[f] == FERRY_TIER_DEVICE) need_dev = 1;
    if (m->cfg.reach[f] <= FERRY_TIER_HOST && m->cfg.home[f] >= FERRY_TIER_HOST) need_host = 1;
  }
  size_t dev_len = need_dev ? m->cfg.budget[FERRY_TIER_DEVICE] : 0;
  size_t host_len = need_host ? m->cfg.budget[FERRY_TIER_HOST] : 0;
  if ((rc = mem_pool_init(&m->pool[0], dev_len, MEM_DEVICE_ALIGN, m->nc)) ||
      (rc = mem_pool_init(&m->pool[1], host_len, mem_host_align(m), m->nc)))
    return ferry_err(&m->err, FERRY_ENOMEM, "pools: out of memory");
  mem_pool_set_fit(&m->pool[0], m->cfg.fit, m->cfg.fit_seed);
  mem_pool_set_fit(&m->pool[1], m->cfg.fit, m->cfg.fit_seed + 1);
  dev_len = m->pool[0].capacity;
  host_len = m->pool[1].capacity;
  if (dev_len) {
    void *p = NULL;
    if ((rc = ferry_device_alloc(dev, dev_len, &p)))
      return ferry_err(&m->err, rc, "device tier: reserving the budget of %zu bytes: %s", dev_len,
                       ferry_device_last_error(dev));
    m->dev_base = p;
  }
  if (host_len && (rc = reserve_host(m, host_len))) return rc;
  if ((rc = ferry_stream_create(dev, &m->h2d)) || (rc = ferry_stream_create(dev, &m->d2h)))
    return ferry_err(&m->err, rc, "copy streams: %s", ferry_device_last_error(dev));

  /* Home copies: reserved for good, zeroed (the host homes below, at once;
   * the device homes too when the device is the host backend's arena, whose
   * memory this thread can write: else one memset per chunk on one copy
   * engine, gigabytes of first touch on one thread) */
  ferry_device_info di;
  int dev_direct = ferry_device_get_info(dev, &di) == 0 && di.kind == FERRY_DEVICE_HOST;
  size_t home_lo[2] = {SIZE_MAX, SIZE_MAX}, home_hi[2] = {0, 0};
  for (uint32_t i = 0; i < m->nc; i++) {
    mem_chunk *c = &m->c[i];
    if (c->home <= FERRY_TIER_HOST) {
      rc = mem_pool_alloc(&m->pool[c->home], c->bytes, &c->off[c->home]);
      FERRY_ASSERT(rc == 0, "memory: home of chunk %u (%zu bytes) does not fit its checked pool",
                   i, c->bytes);
      if (c->home == FERRY_TIER_HOST || dev_direct) {
        size_t o = c->off[c->home];
        if (o < home_lo[c->home]) home_lo[c->home] = o;
        if (o + c->bytes > home_hi[c->home]) home_hi[c->home] = o + c->bytes;
      } else if ((rc = ferry_memset_async(m->h2d, mem_tier_addr(m, c, 0), 0, c->bytes)))
        return ferry_err(&m->err, rc, "zeroing device chunks: %s", ferry_device_last_error(dev));
    }
    mem_stats_add(m, c->home, c->family, c->bytes);
    /* use events also for device homes: ferry_mem_wait_users orders
     * in-place writers after the readers */
    if (m->cfg.reach[c->family] == FERRY_TIER_DEVICE) {
      for (int k = 0; k < MEM_USE_STREAMS && !rc; k++)
        rc = ferry_event_create(dev, &c->use_ev[k].ev);
      if (!rc && c->home > FERRY_TIER_DEVICE) {
        rc = ferry_event_create(dev, &c->ev_load);
        if (!rc) rc = ferry_event_create(dev, &c->ev_wb);
      }
      if (rc) return ferry_err(&m->err, rc, "chunk events: %s", ferry_device_last_error(dev));
    }
  }
  if ((rc = ferry_stream_synchronize(m->h2d)))
    return ferry_err(&m->err, rc, "zeroing device chunks: %s", ferry_device_last_error(dev));
  for (int t = 0; t < 2; t++)
    if (home_hi[t] > home_lo[t] && (rc = zero_homes(m, t, home_lo[t], home_hi[t]))) return rc;
  m->pend = calloc((size_t)m->nc + 1, sizeof *m->pend);
  m->compact_ids = calloc((size_t)m->nc + 1, sizeof *m->compact_ids);
  if (!m->pend || !m->compact_ids) return ferry_err(&m->err, FERRY_ENOMEM, "out of memory");
  return mem_alloc_io(m);
}

void mem_tiers_release(ferry_mem *m) {
  ferry_device *dev = m->cfg.dev;
  if (m->h2d) ferry_stream_destroy(m->h2d);
  if (m->d2h) ferry_stream_destroy(m->d2h);
  m->h2d = m->d2h = NULL;
  for (uint32_t i = 0; m->c && i < m->nc; i++) {
    ferry_event_destroy(m->c[i].ev_load);
    ferry_event_destroy(m->c[i].ev_wb);
    for (int k = 0; k < MEM_USE_STREAMS; k++) ferry_event_destroy(m->c[i].use_ev[k].ev);
  }
  if (m->dev_base) ferry_device_free(dev, m->dev_base);
  if (m->host_base) {
    if (m->host_is_pinned) ferry_host_free(dev, m->host_base);
    else munmap(m->host_base, m->host_map_len);
  }
  m->dev_base = m->host_base = NULL;
  mem_pool_destroy(&m->pool[0]);
  mem_pool_destroy(&m->pool[1]);
  free(m->io_mem);
  m->io_mem = NULL;
  free(m->pend);
  m->pend = NULL;
  free(m->compact_ids);
  m->compact_ids = NULL;
}
