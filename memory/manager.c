/* memory/manager.c — the tiered memory manager's life cycle: configuration
 * defaults and checks, create, finalize (layout, then reserving the tiers),
 * wiring the NVMe store, destroy. The top of memory/'s layers (mem_impl.h).
 */
#include "memory/mem_impl.h"

#include <stdlib.h>
#include <string.h>

ferry_mem_config ferry_mem_config_default(void) {
  ferry_mem_config c;
  memset(&c, 0, sizeof c);
  c.chunk_size = (size_t)64 << 20;
  for (int f = 0; f < FERRY_FAMILIES; f++) c.home[f] = FERRY_TIER_HOST;
  c.reach[FERRY_FAMILY_PARAMS] = FERRY_TIER_DEVICE;
  c.reach[FERRY_FAMILY_GRADS] = FERRY_TIER_DEVICE;
  c.reach[FERRY_FAMILY_OPTIM] = FERRY_TIER_HOST;
  c.policy = FERRY_EVICT_LRU;
  c.host_pinned = 1;
  c.pinned_fallback = 1;
  c.numa_local = 1;
  c.nvme_align = 4096;
  return c;
}

static int store_ok(const ferry_mem_store *s) {
  int n = !!s->write + !!s->read + !!s->poll + !!s->wait;
  return n == 0 || n == 4;
}

int ferry_mem_create(const ferry_mem_config *cfg, ferry_mem **out) {
  if (!out) return FERRY_EINVAL;
  *out = NULL;
  if (!cfg || !cfg->dev) return ferry_err_thread(FERRY_EINVAL, "memory: a device is required");
  if (cfg->chunk_size < 4096 || cfg->chunk_size > ((size_t)1 << 40))
    return ferry_err_thread(FERRY_EINVAL, "memory: chunk_size %zu is outside [4 KiB, 1 TiB]",
                            cfg->chunk_size);
  if (cfg->nvme_align && (cfg->nvme_align & (cfg->nvme_align - 1)))
    return ferry_err_thread(FERRY_EINVAL, "memory: nvme_align %zu is not a power of two",
                            cfg->nvme_align);
  if (cfg->policy != FERRY_EVICT_LRU && cfg->policy != FERRY_EVICT_TRACE)
    return ferry_err_thread(FERRY_EINVAL, "memory: unknown eviction policy %d", (int)cfg->policy);
  if ((unsigned)cfg->fit > FERRY_FIT_RANDOM)
    return ferry_err_thread(FERRY_EINVAL, "memory: unknown fit policy %d", (int)cfg->fit);
  for (int f = 0; f < FERRY_FAMILIES; f++) {
    if (cfg->home[f] < 0 || cfg->home[f] >= FERRY_TIERS || cfg->reach[f] < 0 ||
        cfg->reach[f] > cfg->home[f] || cfg->reach[f] == FERRY_TIER_NVME)
      return ferry_err_thread(FERRY_EINVAL,
                              "memory: the %s family: home %d / reach %d (need reach <= home, "
                              "reach device or host)",
                              ferry_family_name(f), cfg->home[f], cfg->reach[f]);
  }
  if (!store_ok(&cfg->store))
    return ferry_err_thread(FERRY_EINVAL, "memory: the store needs write, read, poll and wait");
  ferry_mem *m = calloc(1, sizeof *m);
  if (!m) return ferry_err_thread(FERRY_ENOMEM, "memory: out of memory");
  m->cfg = *cfg;
  for (int d = 0; d < 2; d++) /* the on_copy hook's host-function arguments, set once */
    for (int b = 0; b < 2; b++) m->marks[d][b] = (struct mem_copy_mark){m, d, b};
  m->copy_hook_on = m->cfg.on_copy != NULL;
  if (!m->cfg.nvme_align) m->cfg.nvme_align = 4096;
  ferry_errbuf_init(&m->err);
  pthread_mutex_init(&m->mu, NULL);
  pthread_cond_init(&m->cv, NULL);
  *out = m;
  return FERRY_OK;
}

int ferry_mem_layout(ferry_mem *m) {
  if (!m) return FERRY_EINVAL;
  pthread_mutex_lock(&m->mu);
  int rc = FERRY_OK;
  if (m->finalized) rc = ferry_err(&m->err, FERRY_ESTATE, "layout: already final");
  else if (!m->laid_out && (rc = mem_layout_build(m)) != FERRY_OK) mem_layout_free(m);
  else m->laid_out = 1;
  pthread_mutex_unlock(&m->mu);
  return rc;
}

int ferry_mem_finalize(ferry_mem *m) {
  if (!m) return FERRY_EINVAL;
  pthread_mutex_lock(&m->mu);
  int rc = FERRY_OK;
  if (m->finalized) {
    rc = ferry_err(&m->err, FERRY_ESTATE, "finalize: already final");
    goto out;
  }
  if ((!m->laid_out && (rc = mem_layout_build(m))) || (rc = mem_layout_check(m)) ||
      (rc = mem_tiers_reserve(m))) {
    mem_tiers_release(m);
    mem_layout_free(m);
    memset(&m->st, 0, sizeof m->st);
    goto out;
  }
  m->finalized = 1;
  m->laid_out = 1;
  char b[3][32];
  ferry_logf(&m->cfg.log, FERRY_LOG_INFO,
             "memory: %zu tensors in %u chunks; homes use device %s, host %s, nvme %s",
             m->nt, m->nc, ferry_format_size(m->home_bytes[0], b[0], sizeof b[0]),
             ferry_format_size(m->home_bytes[1], b[1], sizeof b[1]),
             ferry_format_size(m->home_bytes[2], b[2], sizeof b[2]));
out:
  pthread_mutex_unlock(&m->mu);
  return rc;
}

int ferry_mem_set_store(ferry_mem *m, const ferry_mem_store *store) {
  if (!m || !store) return FERRY_EINVAL;
  if (!store_ok(store))
    return ferry_err(&m->err, FERRY_EINVAL, "set store: write, read, poll and wait are needed");
  pthread_mutex_lock(&m->mu);
  int rc = FERRY_OK;
  for (uint32_t i = 0; m->finalized && i < m->nc; i++)
    if (m->c[i].io_active || (m->c[i].home == FERRY_TIER_NVME && !m->c[i].never_written)) {
      rc = ferry_err(&m->err, FERRY_ESTATE, "set store: chunks were already written to a store");
      goto out;
    }
  m->cfg.store = *store;
  free(m->io_mem);
  m->io_mem = NULL;
  if (m->finalized) rc = mem_alloc_io(m);
out:
  pthread_mutex_unlock(&m->mu);
  return rc;
}

const char *ferry_mem_last_error(ferry_mem *m) {
  static _Thread_local char copy[FERRY_ERR_MAX]; /* other threads may set the message meanwhile */
  if (!m) return "no manager";
  ferry_err_copy(&m->err, copy, sizeof copy);
  return copy;
}

void ferry_mem_destroy(ferry_mem *m) {
  if (!m) return;
  if (m->finalized) mem_drain(m);
  mem_tiers_release(m);
  mem_layout_free(m);
  mem_trace_free(m);
  mem_registry_free(m);
  pthread_cond_destroy(&m->cv);
  pthread_mutex_destroy(&m->mu);
  ferry_errbuf_destroy(&m->err);
  free(m);
}
