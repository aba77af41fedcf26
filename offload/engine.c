/* offload/engine.c — the engine: creation from a configuration, parameter
 * registration, finalize (memory manager layout, NVMe store, optimizer,
 * initial values), fetch/release with trace-driven prefetch, device grad
 * buffers, and the gradient drain thread (D2H, fp32 accumulation, squared
 * norm and inf/NaN flag while backward goes on). The step is in step.c.
 */
#include "offload/engine_impl.h"
#include "optim/scalar_impl.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *role_suffix[FERRY_ROLE_COUNT] = {"", ".grad", ".master", ".exp_avg",
                                                    ".exp_avg_sq"};

int engine_fail(ferry_engine *e, int status, const char *what) {
  return ferry_err(&e->err, status, "%s", what);
}

const char *ferry_engine_last_error(const ferry_engine *e) {
  return e ? ferry_err_msg(&e->err) : "no engine";
}

ferry_device *ferry_engine_device(ferry_engine *e) { return e ? e->dev : NULL; }

static int tier_of(int t) {
  return t == CFG_TIER_GPU ? FERRY_TIER_DEVICE
         : t == CFG_TIER_HOST ? FERRY_TIER_HOST
                                     : FERRY_TIER_NVME;
}

/* The tier where the CPU (or the device, for device homes) works on a
 * family: its home, or host when the home is NVMe. */
static int work_tier(int home) { return home == FERRY_TIER_NVME ? FERRY_TIER_HOST : home; }

int ferry_engine_create(const ferry_config *cfg, ferry_device *dev, ferry_engine **out) {
  if (!out) return FERRY_EINVAL;
  *out = NULL;
  ferry_engine *e = calloc(1, sizeof *e);
  if (!e) return ferry_err_thread(FERRY_ENOMEM, "engine create: out of memory");
  ferry_errbuf_init(&e->err);
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv_work, NULL);
  pthread_cond_init(&e->cv_idle, NULL);
  pthread_cond_init(&e->cv_slot, NULL);
  pthread_cond_init(&e->cv_step, NULL);
  for (int i = 0; i < ENGINE_GRAD_SLOTS; i++) e->gslot[i].owner = -1;
  int rc = ferry_config_clone(cfg, &e->cfg);
  if (rc) {
    ferry_engine_destroy(e);
    return ferry_err_thread(rc, "engine create: out of memory");
  }
  const ferry_config_values *v = e->cv = ferry_config_values_get(e->cfg);
  e->log = (ferry_logger){NULL, NULL, 0};
  e->dtype = v->prec_params == 0   ? FERRY_OPTIM_DT_F32
             : v->prec_params == 1 ? FERRY_OPTIM_DT_F16
                                   : FERRY_OPTIM_DT_BF16;
  e->esize = e->dtype == FERRY_OPTIM_DT_F32 ? 4 : 2;
  e->param_home = tier_of(v->place_params);
  e->grad_home = tier_of(v->place_grads);
  e->optim_home = tier_of(v->place_optimizer);
  if ((e->param_home == FERRY_TIER_NVME || e->optim_home == FERRY_TIER_NVME) &&
      v->nvme_npaths == 0) {
    const char *what = v->place_params == CFG_TIER_NVME ? "params" : "optimizer";
    ferry_engine_destroy(e);
    return ferry_err_thread(FERRY_ECONFIG,
                            "engine create: placement puts %s on nvme but tiers.nvme.paths is "
                            "empty",
                            what);
  }
  if (e->optim_home == FERRY_TIER_DEVICE && e->grad_home != FERRY_TIER_DEVICE) {
    ferry_engine_destroy(e);
    return ferry_err_thread(FERRY_ECONFIG,
                            "engine create: placement.optimizer = \"gpu\" needs placement.grads "
                            "= \"gpu\" (the optimizer reads the grads where it runs)");
  }
  if (dev) {
    e->dev = dev;
  } else {
    ferry_device_config dc = ferry_device_config_default();
    dc.kind = v->device == 1 ? FERRY_DEVICE_CUDA : v->device == 2 ? FERRY_DEVICE_HOST
                                                                  : FERRY_DEVICE_AUTO;
    dc.capacity = (size_t)v->gpu_budget;
    rc = ferry_device_create(&dc, &e->dev);
    if (rc) {
      char msg[FERRY_ERR_MAX];
      snprintf(msg, sizeof msg, "%s", ferry_last_error());
      int no_budget = v->gpu_budget == 0;
      ferry_engine_destroy(e);
      return ferry_err_thread(rc, "engine create: %s%s", msg,
                              no_budget ? " (set tiers.gpu.budget)" : "");
    }
    e->own_dev = 1;
  }
  ferry_device_info di;
  ferry_device_get_info(e->dev, &di);
  if (!di.emulated && (e->grad_home == FERRY_TIER_DEVICE || e->optim_home == FERRY_TIER_DEVICE)) {
    ferry_engine_destroy(e);
    return ferry_err_thread(FERRY_ENOTSUP,
                            "engine create: grads or optimizer state on the gpu run the CPU "
                            "kernels on device memory, which only the host backend allows; "
                            "this build's CUDA path needs placement.grads = \"host\" and "
                            "placement.optimizer = \"host\" or \"nvme\"");
  }
  rc = ferry_timeline_init(&e->tl, v->timeline[0] ? 1u << 18 : 1u << 14);
  if (!rc) rc = ferry_stream_create(e->dev, &e->up);
  if (!rc) rc = ferry_stream_create(e->dev, &e->down);
  if (rc) {
    ferry_engine_destroy(e);
    return ferry_err_thread(rc, "engine create: cannot create streams");
  }
  *out = e;
  return FERRY_OK;
}

/* Lets the drain and the stepper finish what was handed to them, then
 * stops them. */
static void stop_threads(ferry_engine *e) {
  pthread_mutex_lock(&e->mu);
  e->stop = 1;
  pthread_cond_broadcast(&e->cv_work);
  pthread_cond_broadcast(&e->cv_step);
  pthread_mutex_unlock(&e->mu);
  if (e->drain_started) pthread_join(e->drain, NULL);
  if (e->stepper_started) pthread_join(e->stepper, NULL);
  e->drain_started = e->stepper_started = 0;
}

void ferry_engine_destroy(ferry_engine *e) {
  if (!e) return;
  stop_threads(e);
  if (e->up) ferry_stream_synchronize(e->up);
  if (e->down) ferry_stream_synchronize(e->down);
  if (e->cv && e->cv->timeline[0] && e->finalized)
    ferry_timeline_write(&e->tl, e->cv->timeline, &e->err);
  ferry_mem_destroy(e->mem); /* waits for transfers in flight */
  ferry_swap_close(e->swap);
  ferry_optimizer_destroy(e->opt);
  ferry_optimizer_destroy(e->gopt);
  if (e->dev) {
    for (int i = 0; i < ENGINE_GRAD_SLOTS; i++) {
      ferry_device_free(e->dev, e->gslot[i].dev);
      ferry_event_destroy(e->gslot[i].ready);
    }
    for (int i = 0; i < ENGINE_STAGE_SLOTS; i++) {
      ferry_host_free(e->dev, e->stage_up[i]);
      ferry_event_destroy(e->stage_up_ev[i]);
    }
    ferry_host_free(e->dev, e->stage_down);
    ferry_host_free(e->dev, e->param_stage);
    for (uint32_t g = 0; e->groups && g < e->ngroups; g++) ferry_event_destroy(e->groups[g].uploaded);
    ferry_stream_destroy(e->up);
    ferry_stream_destroy(e->down);
    if (e->own_dev) ferry_device_destroy(e->dev);
  }
  for (size_t i = 0; i < e->nparams; i++) free(e->params[i].name);
  free(e->params);
  free(e->by_group);
  free(e->groups);
  free(e->spans);
  free(e->gspans);
  free(e->dsts);
  free(e->queue);
  free(e->sq);
  free(e->trace);
  free(e->trace_fam);
  ferry_timeline_destroy(&e->tl);
  ferry_config_destroy(e->cfg);
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cv_work);
  pthread_cond_destroy(&e->cv_idle);
  pthread_cond_destroy(&e->cv_slot);
  pthread_cond_destroy(&e->cv_step);
  ferry_errbuf_destroy(&e->err);
  free(e);
}

int ferry_param_register(ferry_engine *e, const char *name, const int64_t *shape, int ndim,
                         int group, const float *values, ferry_init_fn init, void *init_user) {
  if (!e) return FERRY_EINVAL;
  if (e->finalized)
    return ferry_err(&e->err, FERRY_ESTATE, "param register '%s': the engine is finalized",
                     name ? name : "(null)");
  if (!name || !*name || strlen(name) > FERRY_MEM_NAME_MAX - 12)
    return ferry_err(&e->err, FERRY_EINVAL, "param register: name is empty or longer than %d",
                     FERRY_MEM_NAME_MAX - 12);
  if (ndim < 1 || ndim > FERRY_MEM_MAX_DIMS || !shape)
    return ferry_err(&e->err, FERRY_EINVAL, "param register '%s': ndim %d (1..%d)", name, ndim,
                     FERRY_MEM_MAX_DIMS);
  if (group < 0 || (uint32_t)group >= FERRY_MEM_MAX_GROUPS)
    return ferry_err(&e->err, FERRY_EINVAL, "param register '%s': group %d out of range", name,
                     group);
  size_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] <= 0 || (uint64_t)shape[i] > (SIZE_MAX >> 4) / n)
      return ferry_err(&e->err, FERRY_EINVAL, "param register '%s': dimension %d is %lld", name,
                       i, (long long)shape[i]);
    n *= (size_t)shape[i];
  }
  for (size_t i = 0; i < e->nparams; i++)
    if (!strcmp(e->params[i].name, name))
      return ferry_err(&e->err, FERRY_EINVAL, "param register: '%s' is registered twice", name);
  if (e->nparams == e->capparams) {
    size_t nc = e->capparams ? 2 * e->capparams : 64;
    eng_param *np = realloc(e->params, nc * sizeof *np);
    if (!np) return ferry_err(&e->err, FERRY_ENOMEM, "param register: out of memory");
    e->params = np;
    e->capparams = nc;
  }
  eng_param *p = &e->params[e->nparams];
  memset(p, 0, sizeof *p);
  p->name = strdup(name);
  if (!p->name) return ferry_err(&e->err, FERRY_ENOMEM, "param register: out of memory");
  memcpy(p->shape, shape, (size_t)ndim * sizeof *shape);
  p->ndim = ndim;
  p->n = n;
  p->group = (uint32_t)group;
  p->values = values;
  p->init = init;
  p->init_user = init_user;
  for (int r = 0; r < FERRY_ROLE_COUNT; r++) p->id[r] = UINT32_MAX;
  e->nparams++;
  return FERRY_OK;
}

/* ---- the NVMe store behind ferry_mem_store --------------------------- */

static int st_write(void *user, void *req, uint32_t slot, const void *buf, size_t len) {
  ferry_engine *e = user;
  return ferry_swap_write(e->swap, slot, buf, len, req, NULL, NULL);
}
static int st_read(void *user, void *req, uint32_t slot, void *buf, size_t len) {
  ferry_engine *e = user;
  return ferry_swap_read(e->swap, slot, buf, len, req, NULL, NULL);
}
/* A finished request becomes a span on the NVMe read or write lane. */
static int st_done(ferry_engine *e, ferry_swap_req *r, int status) {
  if (status != FERRY_EAGAIN)
    ferry_timeline_add(&e->tl, r->op ? FERRY_LANE_NVME_WRITE : FERRY_LANE_NVME_READ,
                       r->op ? "write" : "read", r->t_submit, r->t_done);
  return status;
}
static int st_poll(void *user, void *req) { return st_done(user, req, ferry_swap_poll(req)); }
static int st_wait(void *user, void *req) { return st_done(user, req, ferry_swap_wait(req)); }

/* The manager's copies, as spans on the H2D and D2H lanes (the hook runs
 * in stream order, so a begin is always followed by its end). */
static void on_copy(void *user, int dir, int begin) {
  ferry_engine *e = user;
  double now = ferry_now();
  if (begin) e->copy_t0[dir] = now;
  else ferry_timeline_add(&e->tl, dir ? FERRY_LANE_D2H : FERRY_LANE_H2D, dir ? "D2H" : "H2D",
                          e->copy_t0[dir], now);
}

static int cmp_group(const void *a, const void *b, void *ctx) {
  const eng_param *p = ctx;
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  if (p[x].group != p[y].group) return p[x].group < p[y].group ? -1 : 1;
  return x < y ? -1 : x > y;
}

static uint64_t available_ram(void) {
  ferry_host_info hi;
  if (ferry_host_info_get(&hi)) return 0;
  return hi.ram_available_bytes ? hi.ram_available_bytes : hi.ram_bytes;
}

static int mem_err(ferry_engine *e, int rc, const char *what) {
  return ferry_err(&e->err, rc, "%s: %s", what, ferry_mem_last_error(e->mem));
}

/* Fills master (values, init callback, or zeros), zero states, zero grads,
 * and the params from the master values. */
static int init_values(ferry_engine *e) {
  int ot = work_tier(e->optim_home), gt = work_tier(e->grad_home);
  for (uint32_t g = 0; g < e->ngroups; g++) {
    eng_group *gr = &e->groups[g];
    int rc = ferry_mem_fetch(e->mem, g, FERRY_FAMILY_OPTIM, ot, NULL, 0);
    if (!rc) rc = ferry_mem_mark_dirty(e->mem, g, FERRY_FAMILY_OPTIM, ot, NULL);
    if (rc) return mem_err(e, rc, "finalize: optimizer state");
    for (uint32_t k = 0; k < gr->count; k++) {
      eng_param *p = &e->params[e->by_group[gr->first + k]];
      float *master;
      ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_MASTER], ot, (void **)&master);
      if (p->values) {
        memcpy(master, p->values, p->n * sizeof(float));
      } else if (p->init) {
        int irc = p->init(p->init_user, p->name, master, p->n);
        if (irc) {
          ferry_mem_release(e->mem, g, FERRY_FAMILY_OPTIM, ot, NULL);
          return ferry_err(&e->err, FERRY_EINVAL, "finalize: init callback of '%s' returned %d",
                           p->name, irc);
        }
      } else {
        memset(master, 0, p->n * sizeof(float));
      }
      for (int r = FERRY_ROLE_EXP_AVG; r <= FERRY_ROLE_EXP_AVG_SQ; r++) {
        if (p->id[r] == UINT32_MAX) continue;
        void *st;
        ferry_mem_tensor_ptr(e->mem, p->id[r], ot, &st);
        memset(st, 0, p->n * sizeof(float));
      }
    }
    rc = engine_write_params(e, g, 0, NULL);
    ferry_mem_release(e->mem, g, FERRY_FAMILY_OPTIM, ot, NULL);
    if (!rc && e->optim_home == FERRY_TIER_NVME) /* after the release: held copies stay */
      rc = ferry_mem_writeback(e->mem, g, FERRY_FAMILY_OPTIM, ot);
    if (rc) return rc == FERRY_EINVAL ? rc : mem_err(e, rc, "finalize: initial values");
    rc = ferry_mem_fetch(e->mem, g, FERRY_FAMILY_GRADS, gt, NULL, 0);
    if (!rc) rc = ferry_mem_mark_dirty(e->mem, g, FERRY_FAMILY_GRADS, gt, NULL);
    if (rc) return mem_err(e, rc, "finalize: grads");
    for (uint32_t k = 0; k < gr->count; k++) {
      eng_param *p = &e->params[e->by_group[gr->first + k]];
      void *acc;
      ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_GRAD], gt, &acc);
      memset(acc, 0, p->n * sizeof(float));
    }
    ferry_mem_release(e->mem, g, FERRY_FAMILY_GRADS, gt, NULL);
  }
  int rc = ferry_stream_synchronize(e->up);
  if (!rc) rc = ferry_mem_flush(e->mem);
  if (rc) return mem_err(e, rc, "finalize: flush");
  return FERRY_OK;
}

static void *drain_main(void *arg);

int ferry_engine_finalize(ferry_engine *e) {
  if (!e) return FERRY_EINVAL;
  if (e->finalized) return ferry_err(&e->err, FERRY_ESTATE, "finalize: already finalized");
  if (e->nparams == 0) return ferry_err(&e->err, FERRY_ESTATE, "finalize: no parameters");
  const ferry_config_values *v = e->cv;

  /* groups: 0..max, each non-empty */
  e->by_group = malloc(e->nparams * sizeof *e->by_group);
  if (!e->by_group) return ferry_err(&e->err, FERRY_ENOMEM, "finalize: out of memory");
  uint32_t maxg = 0;
  for (size_t i = 0; i < e->nparams; i++) {
    e->by_group[i] = (uint32_t)i;
    if (e->params[i].group > maxg) maxg = e->params[i].group;
  }
  qsort_r(e->by_group, e->nparams, sizeof *e->by_group, cmp_group, e->params);
  e->ngroups = maxg + 1;
  e->groups = calloc(e->ngroups, sizeof *e->groups);
  e->queue = calloc(e->ngroups * 2 + 4, sizeof *e->queue);
  e->qcap = e->ngroups * 2 + 4;
  e->sq = calloc(e->ngroups, sizeof *e->sq);
  if (!e->groups || !e->queue || !e->sq) return ferry_err(&e->err, FERRY_ENOMEM, "finalize: out of memory");
  size_t maxcount = 0;
  for (size_t i = 0; i < e->nparams;) {
    uint32_t g = e->params[e->by_group[i]].group;
    eng_group *gr = &e->groups[g];
    gr->first = (uint32_t)i;
    gr->grad_slot = -1;
    while (i < e->nparams && e->params[e->by_group[i]].group == g) {
      e->params[e->by_group[i]].goff = gr->n;
      gr->n += e->params[e->by_group[i]].n;
      gr->count++;
      i++;
    }
    if (gr->count > maxcount) maxcount = gr->count;
    if (gr->n > e->max_group_n) e->max_group_n = gr->n;
  }
  for (uint32_t g = 0; g < e->ngroups; g++)
    if (e->groups[g].count == 0)
      return ferry_err(&e->err, FERRY_EINVAL,
                       "finalize: group %u has no parameters (groups must be numbered 0..%u "
                       "without gaps)",
                       g, maxg);
  e->spans = calloc(maxcount, sizeof *e->spans);
  e->gspans = calloc(maxcount, sizeof *e->gspans);
  e->dsts = calloc(maxcount, sizeof *e->dsts);
  if (!e->spans || !e->gspans || !e->dsts) return ferry_err(&e->err, FERRY_ENOMEM, "finalize: out of memory");

  /* the engine's own device and pinned buffers, outside the manager */
  size_t gbytes = ferry_align_up(e->max_group_n * e->esize, 4096);
  ferry_device_info di;
  ferry_device_get_info(e->dev, &di);
  size_t dev_budget = v->gpu_budget ? (size_t)v->gpu_budget : di.capacity;
  if (dev_budget > di.capacity) dev_budget = di.capacity;
  size_t own_dev = ENGINE_GRAD_SLOTS * ferry_align_up(gbytes, 256);
  if (own_dev >= dev_budget)
    return ferry_err(&e->err, FERRY_ENOMEM,
                     "finalize: the device budget (%zu bytes) cannot hold the %d gradient "
                     "buffers of the largest group (%zu bytes each)",
                     dev_budget, ENGINE_GRAD_SLOTS, gbytes);
  int rc = 0;
  for (int i = 0; i < ENGINE_GRAD_SLOTS && !rc; i++) {
    rc = ferry_device_alloc(e->dev, gbytes, &e->gslot[i].dev);
    if (!rc) rc = ferry_event_create(e->dev, &e->gslot[i].ready);
  }
  for (int i = 0; i < ENGINE_STAGE_SLOTS && !rc; i++) {
    rc = ferry_host_alloc(e->dev, gbytes, &e->stage_up[i]);
    if (!rc) rc = ferry_event_create(e->dev, &e->stage_up_ev[i]);
  }
  if (!rc) rc = ferry_host_alloc(e->dev, gbytes, &e->stage_down);
  for (uint32_t g = 0; g < e->ngroups && !rc; g++)
    rc = ferry_event_create(e->dev, &e->groups[g].uploaded);
  if (rc)
    return ferry_err(&e->err, rc, "finalize: engine buffers: %s", ferry_device_last_error(e->dev));
  /* the grad staging above, and the param commit staging allocated below
   * (host and NVMe param homes): both come out of the host budget */
  size_t own_host = (ENGINE_STAGE_SLOTS + 1) * gbytes +
                    (e->param_home != FERRY_TIER_DEVICE ? e->max_group_n * e->esize : 0);

  /* the memory manager */
  ferry_mem_config mc = ferry_mem_config_default();
  mc.dev = e->dev;
  mc.budget[FERRY_TIER_DEVICE] = dev_budget - own_dev;
  uint64_t host = v->host_budget ? v->host_budget : available_ram() / 10 * 8;
  if (host <= own_host)
    return ferry_err(&e->err, FERRY_ENOMEM,
                     "finalize: host budget %llu bytes cannot hold the engine's staging buffers "
                     "(%zu bytes)",
                     (unsigned long long)host, own_host);
  mc.budget[FERRY_TIER_HOST] = (size_t)(host - own_host);
  mc.budget[FERRY_TIER_NVME] = v->nvme_budget ? (size_t)v->nvme_budget : (size_t)1 << 62;
  mc.chunk_size = (size_t)v->chunk_size;
  mc.home[FERRY_FAMILY_PARAMS] = e->param_home;
  mc.home[FERRY_FAMILY_GRADS] = e->grad_home;
  mc.home[FERRY_FAMILY_OPTIM] = e->optim_home;
  mc.reach[FERRY_FAMILY_PARAMS] = FERRY_TIER_DEVICE;
  mc.reach[FERRY_FAMILY_GRADS] = work_tier(e->grad_home);
  mc.reach[FERRY_FAMILY_OPTIM] = work_tier(e->optim_home);
  mc.policy = v->eviction == 0 ? FERRY_EVICT_TRACE : FERRY_EVICT_LRU;
  mc.host_pinned = v->host_pinned;
  mc.pinned_fallback = v->host_memlock == 1;
  mc.numa_local = v->host_numa == 0;
  mc.log = e->log;
  mc.on_copy = on_copy;
  mc.copy_user = e;
  rc = ferry_mem_create(&mc, &e->mem);
  if (rc) return ferry_err(&e->err, rc, "finalize: memory manager: %s", ferry_last_error());

  int opt_type = v->opt_type; /* 0 adamw 1 adam 2 adagrad 3 lamb 4 sgd 5 lion */
  e->nstates = (opt_type == 0 || opt_type == 1 || opt_type == 3) ? 2
               : (opt_type == 4 && v->momentum == 0)             ? 0
                                                                   : 1;
  for (size_t i = 0; i < e->nparams && !rc; i++) {
    eng_param *p = &e->params[e->by_group[i]];
    for (int r = 0; r < FERRY_ROLE_COUNT && !rc; r++) {
      if (r == FERRY_ROLE_EXP_AVG && e->nstates < 1) continue;
      if (r == FERRY_ROLE_EXP_AVG_SQ && e->nstates < 2) continue;
      char nm[FERRY_MEM_NAME_MAX + 1];
      snprintf(nm, sizeof nm, "%s%s", p->name, role_suffix[r]);
      ferry_mem_dtype dt = r != FERRY_ROLE_PARAM       ? FERRY_MEM_F32
                           : e->dtype == FERRY_OPTIM_DT_F16 ? FERRY_MEM_F16
                           : e->dtype == FERRY_OPTIM_DT_BF16 ? FERRY_MEM_BF16
                                                             : FERRY_MEM_F32;
      rc = ferry_mem_register(e->mem, nm, dt, p->ndim, p->shape, p->group, (ferry_role)r,
                              &p->id[r]);
    }
  }
  if (!rc) rc = ferry_mem_finalize(e->mem);
  if (rc) return mem_err(e, rc, "finalize: layout");

  /* A chunk never holds two groups (memory/layout.c), so committing one
   * group's params touches no other group's chunks: the commit after each
   * update relies on it. Checked here; the staging holds the largest group. */
  for (uint32_t g = 0; g < e->ngroups; g++) {
    uint32_t first_c = 0, count_c = 0;
    ferry_mem_group_chunks(e->mem, g, FERRY_FAMILY_PARAMS, &first_c, &count_c);
    for (uint32_t c = first_c; c < first_c + count_c; c++) {
      ferry_mem_chunk_info ci;
      FERRY_ASSERT(ferry_mem_chunk_get(e->mem, c, &ci) == 0 && ci.group_first == g &&
                       ci.group_last == g,
                   "finalize: param chunk %u of group %u holds other groups", c, g);
    }
  }
  if (e->param_home != FERRY_TIER_DEVICE) {
    rc = ferry_host_alloc(e->dev, e->max_group_n * e->esize, &e->param_stage);
    if (rc)
      return ferry_err(&e->err, rc, "finalize: param staging of %zu bytes: %s",
                       e->max_group_n * e->esize, ferry_device_last_error(e->dev));
  }

  /* the NVMe store */
  uint32_t nslots = 0;
  size_t slot = 0;
  ferry_mem_store_layout(e->mem, &nslots, &slot);
  if (nslots) {
    ferry_swap_config sc = ferry_swap_config_default();
    for (int i = 0; i < v->nvme_npaths; i++) sc.paths[i] = v->nvme_paths[i];
    sc.npaths = v->nvme_npaths;
    sc.slot_size = slot;
    sc.nslots = nslots;
    sc.block_size = (size_t)v->nvme_block_size;
    sc.queue_depth = (unsigned)v->nvme_queue_depth;
    sc.sqpoll = v->nvme_sqpoll;
    sc.check_threads = (unsigned)v->nvme_check_threads;
    sc.keep_files = v->nvme_keep_files;
    sc.verify = v->nvme_verify == 0;
    sc.name = "engine";
    sc.log = e->log;
    rc = ferry_swap_open(&sc, &e->swap);
    if (rc) return ferry_err(&e->err, rc, "finalize: NVMe store: %s", ferry_last_error());
    ferry_mem_store st = {e, sizeof(ferry_swap_req), st_write, st_read, st_poll, st_wait};
    rc = ferry_mem_set_store(e->mem, &st);
    if (rc) return mem_err(e, rc, "finalize: NVMe store");
  }

  /* the optimizer */
  static const ferry_optim_type types[] = {FERRY_OPTIM_ADAMW, FERRY_OPTIM_ADAM, FERRY_OPTIM_ADAGRAD,
                                           FERRY_OPTIM_LAMB,  FERRY_OPTIM_SGD,  FERRY_OPTIM_LION};
  ferry_optimizer_config oc = ferry_optimizer_config_default(types[opt_type]);
  oc.lr = (float)v->lr;
  oc.beta1 = (float)v->betas[0];
  oc.beta2 = (float)v->betas[1];
  oc.eps = (float)v->eps;
  oc.weight_decay = (float)v->weight_decay;
  oc.momentum = (float)v->momentum;
  oc.nesterov = v->nesterov;
  oc.threads = (int)v->threads;
  rc = ferry_optimizer_create(&oc, &e->opt);
  if (rc) return ferry_err(&e->err, rc, "finalize: optimizer: %s", ferry_last_error());
  /* the drain accumulates on its own thread while the step may be running */
  ferry_optimizer_config gc = oc;
  gc.threads = 1;
  gc.bind = 0;
  rc = ferry_optimizer_create(&gc, &e->gopt);
  if (rc) return ferry_err(&e->err, rc, "finalize: optimizer: %s", ferry_last_error());

  e->dynamic_scale = e->dtype == FERRY_OPTIM_DT_F16 && v->loss_scale == 0;
  /* Without a global decision (clipping, overflow skip) each group's update
   * can run as soon as its grads are final, during backward. */
  e->eager = v->step_during_backward && v->clip_grad_norm == 0 && e->dtype != FERRY_OPTIM_DT_F16;
  e->fixed_scale = e->dtype == FERRY_OPTIM_DT_F16 && v->loss_scale > 0 ? (float)v->loss_scale : 1;
  ferry_loss_scaler_init(&e->scaler, (float)v->initial_scale, 2.0f, (float)v->backoff,
                         (int)v->growth_interval);

  rc = init_values(e);
  if (rc) return rc;
  if (pthread_create(&e->drain, NULL, drain_main, e))
    return ferry_err(&e->err, FERRY_ENOMEM, "finalize: cannot start the drain thread");
  e->drain_started = 1;
  if (pthread_create(&e->stepper, NULL, engine_step_main, e))
    return ferry_err(&e->err, FERRY_ENOMEM, "finalize: cannot start the step thread");
  e->stepper_started = 1;
  e->tracing = 1; /* the loop's fetches until the first step become the trace */
  ferry_timeline_reset(&e->tl);
  e->finalized = 1;
  return FERRY_OK;
}

/* ---- forward / backward ------------------------------------------------ */

static int check_group(ferry_engine *e, int group, const char *op) {
  if (!e->finalized) return ferry_err(&e->err, FERRY_ESTATE, "%s: call ferry_engine_finalize first", op);
  if (group < 0 || (uint32_t)group >= e->ngroups)
    return ferry_err(&e->err, FERRY_EINVAL, "%s: group %d (the model has %u)", op, group,
                     e->ngroups);
  return FERRY_OK;
}

/* Prefetches the groups the trace expects next, as far as the budget or
 * prefetch_depth allows. Never waits; a full budget just stops it. */
void engine_prefetch(ferry_engine *e) {
  if (e->param_home == FERRY_TIER_DEVICE) return; /* always resident */
  size_t depth = e->cv->prefetch_depth ? (size_t)e->cv->prefetch_depth : e->ngroups;
  if (depth >= e->ngroups) depth = e->ngroups - 1;
  size_t len = ferry_mem_trace_length(e->mem);

  for (size_t k = 1; k <= depth; k++) {
    /* never past this iteration: the step is about to change those params */
    if (e->fetches + k > len) return;
    uint32_t g;
    int fam;
    if (ferry_mem_trace_peek(e->mem, k, &g, &fam)) return;
    if (fam != FERRY_FAMILY_PARAMS) continue;
    pthread_mutex_lock(&e->mu);
    int queued = e->groups[g].step_queued;
    pthread_mutex_unlock(&e->mu);
    if (queued) return; /* the running step has not written it yet */
    if (ferry_mem_prefetch(e->mem, g, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE)) return;
  }
}

int ferry_fetch(ferry_engine *e, int group, ferry_stream *s) {
  if (!e) return FERRY_EINVAL;
  int rc = check_group(e, group, "fetch");
  if (rc) return rc;
  if (!s) return ferry_err(&e->err, FERRY_EINVAL, "fetch: stream is NULL");
  eng_group *gr = &e->groups[group];
  double t0 = ferry_now();
  rc = engine_wait_step_group(e, (uint32_t)group); /* its update of the last step is done */
  if (rc)
    return ferry_err(&e->err, rc,
                     "fetch: group %d: its optimizer update failed (%s); release the groups held "
                     "and call ferry_step to run it again",
                     group, ferry_strerror(rc));
  rc = ferry_mem_fetch(e->mem, (uint32_t)group, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, s, 0);
  if (rc) return mem_err(e, rc, "fetch");
  /* params uploaded by the last step (device home): ordered on e->up */
  rc = ferry_stream_wait_event(s, gr->uploaded);
  if (rc) return ferry_err(&e->err, rc, "fetch: %s", ferry_device_last_error(e->dev));
  pthread_mutex_lock(&e->mu);
  gr->fetched++;
  pthread_mutex_unlock(&e->mu);
  gr->stream = s;
  e->fetches++;
  if (e->tracing) { /* only the loop's own order: the engine's threads fetch too */
    if (e->ntrace == e->captrace) {
      size_t nc = e->captrace ? 2 * e->captrace : 64;
      uint32_t *nt = realloc(e->trace, nc * sizeof *nt);
      int *nf = nt ? realloc(e->trace_fam, nc * sizeof *nf) : NULL;
      if (nt) e->trace = nt;
      if (nf) e->trace_fam = nf;
      if (nt && nf) e->captrace = nc;
    }
    if (e->ntrace < e->captrace) {
      e->trace[e->ntrace] = (uint32_t)group;
      e->trace_fam[e->ntrace++] = FERRY_FAMILY_PARAMS;
    }
  } else {
    engine_prefetch(e);
  }
  ferry_timeline_add(&e->tl, FERRY_LANE_STEP, "fetch", t0, ferry_now());
  return FERRY_OK;
}

int ferry_release(ferry_engine *e, int group, ferry_stream *s) {
  if (!e) return FERRY_EINVAL;
  int rc = check_group(e, group, "release");
  if (rc) return rc;
  eng_group *gr = &e->groups[group];
  if (gr->fetched == 0)
    return ferry_err(&e->err, FERRY_ESTATE, "release: group %d is not fetched", group);
  rc = ferry_mem_release(e->mem, (uint32_t)group, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, s);
  if (rc) return mem_err(e, rc, "release");
  pthread_mutex_lock(&e->mu);
  gr->fetched--;
  pthread_cond_broadcast(&e->cv_step); /* an update may wait for the release */
  pthread_mutex_unlock(&e->mu);
  return FERRY_OK;
}

static eng_param *find_param(ferry_engine *e, const char *name) {
  uint32_t id;
  if (!e->mem || ferry_mem_lookup(e->mem, name, &id)) return NULL;
  ferry_mem_tensor_info ti;
  if (ferry_mem_tensor_get(e->mem, id, &ti) || ti.role != FERRY_ROLE_PARAM) return NULL;
  /* ids of PARAM tensors are registered in by_group order, 1 + nroles apart */
  for (size_t i = 0; i < e->nparams; i++)
    if (e->params[i].id[FERRY_ROLE_PARAM] == id) return &e->params[i];
  return NULL;
}

int ferry_param_device(ferry_engine *e, const char *name, void **param, void **grad) {
  if (!e) return FERRY_EINVAL;
  if (!e->finalized) return ferry_err(&e->err, FERRY_ESTATE, "param device: not finalized");
  eng_param *p = name ? find_param(e, name) : NULL;
  if (!p) return ferry_err(&e->err, FERRY_ENOENT, "param device: no parameter '%s'", name ? name : "(null)");
  eng_group *gr = &e->groups[p->group];
  if (!gr->fetched)
    return ferry_err(&e->err, FERRY_ESTATE, "param device '%s': group %u is not fetched", p->name,
                     p->group);
  if (param) {
    int rc = ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_PARAM], FERRY_TIER_DEVICE, param);
    if (rc) return mem_err(e, rc, "param device");
  }
  if (grad) {
    if (gr->grad_slot < 0) { /* take a device grad buffer, zeroed in stream order */
      pthread_mutex_lock(&e->mu);
      int got = -1;
      for (;;) {
        for (int i = 0; i < ENGINE_GRAD_SLOTS && got < 0; i++)
          if (e->gslot[i].owner < 0) got = i;
        if (got >= 0 || e->drain_status) break;
        pthread_cond_wait(&e->cv_slot, &e->mu);
      }
      if (got >= 0) e->gslot[got].owner = (int)p->group;
      int ds = e->drain_status;
      pthread_mutex_unlock(&e->mu);
      if (got < 0) return ferry_err(&e->err, ds, "param device: the gradient drain failed");
      gr->grad_slot = got;
      int rc = ferry_memset_async(gr->stream, e->gslot[got].dev, 0, gr->n * e->esize);
      if (rc) return ferry_err(&e->err, rc, "param device: %s", ferry_device_last_error(e->dev));
    }
    *grad = (char *)e->gslot[gr->grad_slot].dev + p->goff * e->esize;
  }
  return FERRY_OK;
}

int ferry_grads_ready(ferry_engine *e, int group, ferry_stream *s) {
  if (!e) return FERRY_EINVAL;
  int rc = check_group(e, group, "grads ready");
  if (rc) return rc;
  eng_group *gr = &e->groups[group];
  if (gr->grad_slot < 0)
    return ferry_err(&e->err, FERRY_ESTATE,
                     "grads ready: group %d has no gradient buffer (ask ferry_param_device for "
                     "its grad pointers after fetching it)",
                     group);
  rc = ferry_event_record(e->gslot[gr->grad_slot].ready, s);
  if (rc) return ferry_err(&e->err, rc, "grads ready: %s", ferry_device_last_error(e->dev));
  pthread_mutex_lock(&e->mu);
  e->queue[e->qtail++ % e->qcap] = (uint32_t)group;
  gr->grad_slot = -1; /* the drain owns it now (gslot[].owner still names the group) */
  pthread_cond_signal(&e->cv_work);
  pthread_mutex_unlock(&e->mu);
  return FERRY_OK;
}

/* ---- the drain thread ----------------------------------------------------- */

static int drain_one(ferry_engine *e, uint32_t g) {
  eng_group *gr = &e->groups[g];
  int slot = -1;
  pthread_mutex_lock(&e->mu);
  for (int i = 0; i < ENGINE_GRAD_SLOTS; i++)
    if (e->gslot[i].owner == (int)g) slot = i;
  pthread_mutex_unlock(&e->mu);
  FERRY_ASSERT(slot >= 0, "drain: group %u has no gradient buffer", g);
  double t0 = ferry_now();
  int rc = ferry_event_synchronize(e->gslot[slot].ready);
  double t1 = ferry_now();
  if (!rc) rc = ferry_memcpy_async(e->down, e->stage_down, e->gslot[slot].dev, gr->n * e->esize,
                                   FERRY_COPY_D2H);
  if (!rc) rc = ferry_stream_synchronize(e->down);
  double t2 = ferry_now();
  ferry_timeline_add(&e->tl, FERRY_LANE_D2H, "grads D2H", t1, t2);
  (void)t0;
  pthread_mutex_lock(&e->mu);
  e->gslot[slot].owner = -1;
  pthread_cond_broadcast(&e->cv_slot);
  pthread_mutex_unlock(&e->mu);
  if (rc) return ferry_err(&e->err, rc, "drain: %s", ferry_device_last_error(e->dev));

  int gt = work_tier(e->grad_home);
  rc = ferry_mem_fetch(e->mem, g, FERRY_FAMILY_GRADS, gt, NULL, 0);
  if (rc) return mem_err(e, rc, "drain: grads");
  float scale = 1.0f / (float)e->cv->grad_accumulation;
  int last = e->micro + 1 >= e->cv->grad_accumulation;
  double sumsq = 0;
  int nonfinite = 0;
  for (uint32_t k = 0; k < gr->count && !rc; k++) {
    eng_param *p = &e->params[e->by_group[gr->first + k]];
    float *acc;
    ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_GRAD], gt, (void **)&acc);
    ferry_grad_span gs = {(char *)e->stage_down + p->goff * e->esize, p->n, e->dtype};
    rc = ferry_optimizer_grad_accumulate(e->gopt, acc, &gs, scale);
    if (!rc && last) {
      ferry_grad_span as = {acc, p->n, FERRY_OPTIM_DT_F32};
      double s = 0;
      int nf = 0;
      rc = ferry_optimizer_grad_stats(e->gopt, &as, 1, &s, &nf);
      sumsq += s;
      nonfinite |= nf;
    }
  }
  ferry_mem_release(e->mem, g, FERRY_FAMILY_GRADS, gt, NULL);
  ferry_timeline_add(&e->tl, FERRY_LANE_OPTIM0, "accumulate", t2, ferry_now());
  if (rc) return ferry_err(&e->err, rc, "drain: %s", ferry_optimizer_last_error(e->gopt));
  gr->sumsq = sumsq;
  gr->nonfinite = nonfinite;
  if (last && e->eager) { /* its grads are final: update it now, during backward */
    pthread_mutex_lock(&e->mu);
    e->step_gscale = 1.0f / e->fixed_scale;
    engine_queue_step(e, g);
    pthread_mutex_unlock(&e->mu);
  }
  return FERRY_OK;
}

static void *drain_main(void *arg) {
  ferry_engine *e = arg;
  pthread_mutex_lock(&e->mu);
  for (;;) {
    while (e->qhead == e->qtail && !e->stop) pthread_cond_wait(&e->cv_work, &e->mu);
    if (e->qhead == e->qtail) break;
    uint32_t g = e->queue[e->qhead % e->qcap];
    e->draining = 1;
    pthread_mutex_unlock(&e->mu);
    int rc = e->drain_status ? FERRY_OK : drain_one(e, g);
    pthread_mutex_lock(&e->mu);
    e->qhead++;
    e->draining = 0;
    if (rc && !e->drain_status) e->drain_status = rc;
    if (++e->drained_in_micro == e->ngroups) {
      e->drained_in_micro = 0;
      e->micro++;
    }
    if (e->qhead == e->qtail) pthread_cond_broadcast(&e->cv_idle);
    pthread_cond_broadcast(&e->cv_slot);
  }
  pthread_mutex_unlock(&e->mu);
  return NULL;
}

int engine_wait_drain(ferry_engine *e) {
  pthread_mutex_lock(&e->mu);
  while (e->qhead != e->qtail || e->draining) pthread_cond_wait(&e->cv_idle, &e->mu);
  int rc = e->drain_status;
  pthread_mutex_unlock(&e->mu);
  return rc;
}

int ferry_zero_grads(ferry_engine *e) {
  if (!e) return FERRY_EINVAL;
  if (!e->finalized) return ferry_err(&e->err, FERRY_ESTATE, "zero grads: not finalized");
  int rc = engine_wait_step(e);
  if (!rc) rc = engine_wait_drain(e);
  if (rc) return rc;
  int gt = work_tier(e->grad_home);
  for (uint32_t g = 0; g < e->ngroups; g++) {
    rc = ferry_mem_fetch(e->mem, g, FERRY_FAMILY_GRADS, gt, NULL, 0);
    if (rc) return mem_err(e, rc, "zero grads");
    eng_group *gr = &e->groups[g];
    for (uint32_t k = 0; k < gr->count; k++) {
      eng_param *p = &e->params[e->by_group[gr->first + k]];
      void *acc;
      ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_GRAD], gt, &acc);
      memset(acc, 0, p->n * sizeof(float));
    }
    ferry_mem_release(e->mem, g, FERRY_FAMILY_GRADS, gt, NULL);
    gr->sumsq = 0;
    gr->nonfinite = 0;
  }
  pthread_mutex_lock(&e->mu);
  e->micro = 0;
  e->drained_in_micro = 0;
  pthread_mutex_unlock(&e->mu);
  return FERRY_OK;
}

float ferry_loss_scale(const ferry_engine *e) {
  if (!e) return 1;
  return e->dynamic_scale ? e->scaler.scale : e->fixed_scale;
}

int ferry_step(ferry_engine *e, ferry_step_info *info) {
  if (!e) return FERRY_EINVAL;
  if (!e->finalized) return ferry_err(&e->err, FERRY_ESTATE, "step: not finalized");
  return engine_step(e, info);
}

int ferry_param_read(ferry_engine *e, const char *name, float *dst, size_t count) {
  if (!e || !dst) return FERRY_EINVAL;
  if (!e->finalized) return ferry_err(&e->err, FERRY_ESTATE, "param read: not finalized");
  eng_param *p = name ? find_param(e, name) : NULL;
  if (!p) return ferry_err(&e->err, FERRY_ENOENT, "param read: no parameter '%s'", name ? name : "(null)");
  if (count != p->n)
    return ferry_err(&e->err, FERRY_EINVAL, "param read '%s': count %zu, the tensor has %zu",
                     p->name, count, p->n);
  int rc = engine_wait_step(e);
  if (!rc) rc = engine_wait_drain(e);
  if (rc) return rc;
  int ot = work_tier(e->optim_home);
  rc = ferry_mem_fetch(e->mem, p->group, FERRY_FAMILY_OPTIM, ot, NULL, 0);
  if (rc) return mem_err(e, rc, "param read");
  float *master;
  ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_MASTER], ot, (void **)&master);
  memcpy(dst, master, count * sizeof(float));
  ferry_mem_release(e->mem, p->group, FERRY_FAMILY_OPTIM, ot, NULL);
  return FERRY_OK;
}

int ferry_engine_write_timeline(ferry_engine *e, const char *path) {
  if (!e || !path) return FERRY_EINVAL;
  if (e->finalized) engine_wait_step(e);
  return ferry_timeline_write(&e->tl, path, &e->err);
}

int ferry_engine_stats(ferry_engine *e, ferry_stats *out) {
  if (!e || !out) return FERRY_EINVAL;
  if (!e->mem) {
    memset(out, 0, sizeof *out);
    return FERRY_OK;
  }
  return ferry_mem_get_stats(e->mem, out);
}
