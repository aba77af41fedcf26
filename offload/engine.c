/* offload/engine.c — the engine's life: creation from a configuration,
 * parameter registration, finalize (group table, buffers, memory manager,
 * NVMe store, optimizer, initial values, threads), destroy, stats and the
 * narrow internal API. Uses every room below it (ranks, drain, stepper,
 * gpu, group); the loop's calls are loop.c, the step driver step.c.
 */
#include "offload/engine_internal.h"
#include "offload/engine_impl.h"
#include "core/dtype.h"
#include "plan/footprint.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ferry_param_register(ferry_engine *e, const char *name, const int64_t *shape, int ndim,
                         int group, const float *values, ferry_init_fn init, void *init_user) {
  if (!e) return FERRY_EINVAL;
  if (e->finalized)
    return ferry_err(&e->err, FERRY_ESTATE, "param register '%s': the engine is finalized",
                     name ? name : "(null)");
  return group_add_param(e, name, shape, ndim, group, values, init, init_user);
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
  if (status != FERRY_EAGAIN) {
    int op;
    double t0, t1;
    ferry_swap_req_times(r, &op, &t0, &t1);
    ferry_timeline_add(&e->tl, op ? FERRY_LANE_NVME_WRITE : FERRY_LANE_NVME_READ,
                       op ? "write" : "read", t0, t1);
  }
  return status;
}
static int st_poll(void *user, void *req) { return st_done(user, req, ferry_swap_poll(req)); }
static int st_wait(void *user, void *req) { return st_done(user, req, ferry_swap_wait(req)); }
static void st_why(void *user, char *out, size_t cap) {
  ferry_swap_error_copy(((ferry_engine *)user)->swap, out, cap);
}

/* The manager's copies, as spans on the H2D and D2H lanes (the hook runs
 * in stream order, so a begin is always followed by its end). */
static void on_copy(void *user, int dir, int begin) {
  ferry_engine *e = user;
  double now = ferry_now();
  if (begin) e->copy_t0[dir] = now;
  else ferry_timeline_add(&e->tl, dir ? FERRY_LANE_D2H : FERRY_LANE_H2D, dir ? "D2H" : "H2D",
                          e->copy_t0[dir], now);
}

/* ---- finalize ------------------------------------------------------------ */

static uint64_t available_ram(void) {
  ferry_host_info hi;
  if (ferry_host_get_info(&hi)) return 0;
  return hi.ram_available_bytes ? hi.ram_available_bytes : hi.ram_bytes;
}

/* The device budget the configuration gives, within the device's capacity. */
static size_t device_budget(ferry_engine *e) {
  ferry_device_info di;
  ferry_device_get_info(e->dev, &di);
  size_t budget = e->cv->gpu_budget ? (size_t)e->cv->gpu_budget : di.capacity;
  return budget > di.capacity ? di.capacity : budget;
}

/* One staging or grad buffer: the largest group in param dtype, whole pages. */
static size_t group_buffer_bytes(const ferry_engine *e) {
  return ferry_align_up(e->gt.max_group_n * e->esize, 4096);
}

/* The caller's reservation as it counts against the device budget. */
static size_t reserve_footprint(const ferry_engine *e) {
  return ferry_align_up(e->reserve_bytes, 256);
}

/* The engine's pinned host buffers by kind, in the bytes they are
 * allocated with (engine_drain_staged, engine_upload_staged, gpu.c), as
 * plan/footprint.c counts them for the planner too. */
typedef ferry_footprint_staging engine_staging;

static engine_staging staging_bytes(const ferry_engine *e) {
  _Static_assert(ENGINE_DRAIN_STAGES == 2 && ENGINE_STAGE_SLOTS == 2, "plan/footprint.c's stages");
  ferry_footprint_engine fe;
  memset(&fe, 0, sizeof fe);
  fe.group_n = e->gt.max_group_n;
  fe.esize = e->esize;
  fe.page = 4096; /* group_buffer_bytes */
  fe.drain_staged = engine_drain_staged(e);
  fe.gpu_sums = gpu_own_host_bytes(e);
  fe.upload_staged = engine_upload_staged(e);
  fe.params_off_device = e->param_home != FERRY_TIER_DEVICE;
  size_t piece;
  fe.reduce = drain_reduce_bytes(e, &piece); /* with ranks: the drain's fp32 buffers */
  fe.reduce += piece;
  fe.params_sharded = engine_params_sharded(e); /* stage 3: the host gather buffers */
  engine_staging st;
  ferry_footprint_staging_bytes(&fe, &st);
  return st;
}

void engine_own_bytes(const ferry_engine *e, size_t *own_dev, size_t *own_host) {
  size_t gbytes = group_buffer_bytes(e);
  engine_staging st = staging_bytes(e);
  /* device: the grad buffers (and device math's scratch) */
  *own_dev = ENGINE_GRAD_SLOTS * ferry_align_up(gbytes, 256) + gpu_own_dev_bytes(e);
  if (engine_params_sharded(e)) /* stage 3: the device gather buffers (ranks_gather_init) */
    *own_dev += (e->gt.ngroups < ENGINE_GATHER_SLOTS ? e->gt.ngroups : ENGINE_GATHER_SLOTS) *
                ferry_align_up(gbytes, 256);
  *own_host = st.drain + st.upload + st.commit + st.reduce;
}

/* The memory manager, with what the engine's own buffers leave of the
 * budgets. */
static int create_manager(ferry_engine *e, size_t dev_budget, size_t own_dev, size_t own_host) {
  const ferry_config_values *v = e->cv;
  ferry_mem_config mc = ferry_mem_config_default();
  mc.dev = e->dev;
  mc.budget[FERRY_TIER_DEVICE] = e->dev_pool = dev_budget - own_dev - reserve_footprint(e);
  uint64_t host = v->host_budget ? v->host_budget : available_ram() / 10 * 8;
  e->host_budget = host;
  /* staging larger than the budget: an empty pool, and check_host_pool
   * refuses naming the whole need */
  mc.budget[FERRY_TIER_HOST] = e->host_pool = host > own_host ? (size_t)(host - own_host) : 0;
  mc.budget[FERRY_TIER_NVME] = v->nvme_budget ? (size_t)v->nvme_budget : (size_t)1 << 62;
  mc.chunk_size = (size_t)v->chunk_size;
  mc.home[FERRY_FAMILY_PARAMS] = e->param_home;
  mc.home[FERRY_FAMILY_GRADS] = e->grad_home;
  mc.home[FERRY_FAMILY_OPTIM] = e->optim_home;
  mc.reach[FERRY_FAMILY_PARAMS] = FERRY_TIER_DEVICE;
  mc.reach[FERRY_FAMILY_GRADS] = work_tier(e->grad_home);
  mc.reach[FERRY_FAMILY_OPTIM] = work_tier(e->optim_home);
  mc.policy = v->eviction;
  mc.fit = (ferry_fit_policy)v->fit;
  mc.fit_seed = (uint64_t)v->fit_seed;
  mc.host_pinned = v->host_pinned;
  mc.pinned_fallback = v->host_memlock == FERRY_MEMLOCK_PAGEABLE;
  mc.numa_local = v->host_numa == FERRY_NUMA_LOCAL;
  mc.log = e->log;
  mc.on_copy = on_copy;
  mc.copy_user = e;
  mc.cancel = e->cancel;
  mc.cancel_user = e->cancel_user;
  int rc = ferry_mem_create(&mc, &e->mem);
  if (rc) return ferry_err(&e->err, rc, "finalize: memory manager: %s", ferry_last_error());
  /* The copy spans cost two host functions per copy: only for a timeline
   * that is written, or read through engine_timeline. */
  if (!v->timeline[0]) (void)ferry_mem_copy_hook(e->mem, 0);
  return FERRY_OK;
}

/* Bytes of a family's chunks as the layout made them: of the group with
 * the most, of the whole family, of its largest chunk (a chunk never holds
 * two groups), and their number. */
static void family_bytes(ferry_engine *e, int family, ferry_footprint_family *out) {
  memset(out, 0, sizeof *out);
  for (uint32_t g = 0; g < e->gt.ngroups; g++) {
    uint32_t first = 0, count = 0;
    size_t sum = 0;
    ferry_mem_group_chunks(e->mem, g, family, &first, &count);
    for (uint32_t c = first; c < first + count; c++) {
      ferry_mem_chunk_info ci;
      if (ferry_mem_chunk_get(e->mem, c, &ci)) continue;
      sum += ci.bytes;
      out->chunks++;
      if (ci.bytes > out->chunk_max) out->chunk_max = ci.bytes;
    }
    out->total += sum;
    if (sum > out->group_max) out->group_max = sum;
  }
}

#define MIB(x) ((double)(x) / 1048576.0)

/* One step's working set in the host pool, each term (see
 * check_host_pool and plan/footprint.h). */
typedef ferry_footprint_host host_need;

static host_need host_working_set(ferry_engine *e) {
  const ferry_tier home[FERRY_FAMILIES] = {e->param_home, e->grad_home, e->optim_home};
  ferry_footprint_family fam[FERRY_FAMILIES];
  for (int f = 0; f < FERRY_FAMILIES; f++) family_bytes(e, f, &fam[f]);
  host_need n;
  ferry_footprint_host_need(home, fam, &n);
  return n;
}

/* Finalize: the manager's host pool (tiers.host.budget less the engine's
 * staging) holds one step's working set, or FERRY_ENOMEM naming every
 * number. */
static int check_host_pool(ferry_engine *e, size_t own_host) {
  host_need n = host_working_set(e);
  if (e->host_budget > own_host && e->host_pool >= n.total) {
    /* NVMe params and the next group's optimizer state read ahead through
     * the host: only into what the working set leaves once the host copies
     * of the device's cached params are counted (copies are inclusive:
     * every device copy of an NVMe-homed chunk keeps its host copy) */
    ferry_footprint_read_ahead(e->host_pool, e->dev_pool, &n, &e->param_ahead, &e->optim_ahead);
    /* NVMe params cached in the host pool: at most what the planner
     * counts, so that which groups stay does not depend on the threads'
     * timing (uncapped at the minimum budget, the stepper's optimizer reads
     * took the room of cached groups before or after the loop used them:
     * int8 states read 3.7-9.2% fewer params than planned, run to run) */
    if (e->param_home == FERRY_TIER_NVME)
      return ferry_mem_cap(e->mem, FERRY_FAMILY_PARAMS,
                           ferry_footprint_param_cache(e->host_pool, &n, e->optim_ahead));
    return FERRY_OK;
  }
  engine_staging st = staging_bytes(e);
  double least = ceil(MIB(own_host + n.total) * 10) / 10;
  return ferry_err(
      &e->err, FERRY_ENOMEM,
      "finalize: tiers.host.budget of %.1f MiB is too small: the engine's staging "
      "takes %.1f MiB (drain %.1f, uploads %.1f, param commit %.1f, ranks %.1f) and leaves a "
      "pool of %.1f MiB, but one step needs %.1f MiB there (optimizer state of the "
      "largest group %.1f + 2 x its grads %.1f + 2 x its params %.1f + 2 x the "
      "largest chunk %.1f + host homes %.1f: params %.1f, grads %.1f, optimizer %.1f); set "
      "tiers.host.budget to at least %.1f MiB",
      MIB(e->host_budget), MIB(own_host), MIB(st.drain), MIB(st.upload), MIB(st.commit),
      MIB(st.reduce), MIB(e->host_pool), MIB(n.total), MIB(n.optim), MIB(n.grads), MIB(n.params),
      MIB(n.slack), MIB(n.home[0] + n.home[1] + n.home[2]), MIB(n.home[FERRY_FAMILY_PARAMS]),
      MIB(n.home[FERRY_FAMILY_GRADS]), MIB(n.home[FERRY_FAMILY_OPTIM]), least);
}

/* The io_uring swap store, when the layout puts chunks on NVMe. */
static int open_store(ferry_engine *e) {
  const ferry_config_values *v = e->cv;
  uint32_t nslots = 0;
  size_t slot = 0;
  ferry_mem_store_layout(e->mem, &nslots, &slot);
  if (!nslots) return FERRY_OK;
  /* each slot of its chunk's bytes, and the spares of each NVMe family */
  uint32_t nsizes = 0;
  ferry_mem_store_slot_sizes(e->mem, NULL, 0, &nsizes);
  size_t *sizes = malloc((size_t)nsizes * sizeof *sizes);
  if (!sizes) return ferry_err(&e->err, FERRY_ENOMEM, "finalize: NVMe store: out of memory");
  if (ferry_mem_store_slot_sizes(e->mem, sizes, nsizes, &nsizes)) {
    free(sizes);
    return engine_mem_err(e, FERRY_EINVAL, "finalize: NVMe store");
  }
  ferry_swap_config sc = ferry_swap_config_default();
  for (int i = 0; i < v->nvme_npaths; i++) sc.paths[i] = v->nvme_paths[i];
  sc.npaths = v->nvme_npaths;
  sc.slot_size = slot;
  sc.nslots = nslots;
  sc.slot_sizes = sizes;
  sc.spare_slots = nsizes - nslots;
  sc.block_size = (size_t)v->nvme_block_size;
  sc.queue_depth = (unsigned)v->nvme_queue_depth;
  sc.sqpoll = v->nvme_sqpoll;
  sc.check_threads = (unsigned)v->nvme_check_threads;
  sc.keep_files = v->nvme_keep_files;
  sc.verify = v->nvme_verify == FERRY_VERIFY_CRC32C;
  sc.name = "engine";
  sc.log = e->log;
  int rc = ferry_swap_open(&sc, &e->swap);
  free(sizes);
  if (rc) return ferry_err(&e->err, rc, "finalize: NVMe store: %s", ferry_last_error());
  ferry_mem_store st = {e, sizeof(ferry_swap_req), st_write, st_read, st_poll, st_wait, st_why};
  rc = ferry_mem_set_store(e->mem, &st);
  if (rc) return engine_mem_err(e, rc, "finalize: NVMe store");
  return FERRY_OK;
}

/* The optimizer's configuration from the engine's. */
static ferry_optimizer_config optimizer_config(const ferry_config_values *v) {
  ferry_optimizer_config oc = ferry_optimizer_config_default(v->opt_type);
  oc.lr = (float)v->lr;
  oc.beta1 = (float)v->betas[0];
  oc.beta2 = (float)v->betas[1];
  oc.eps = (float)v->eps;
  oc.weight_decay = (float)v->weight_decay;
  oc.momentum = (float)v->momentum;
  oc.nesterov = v->nesterov;
  oc.threads = (int)v->threads;
  oc.state_dtype = v->opt_state_dtype;
  oc.state_block = (size_t)v->opt_state_block;
  oc.master_dtype = v->prec_master;
  oc.seed = ENGINE_SR_SEED;
  return oc;
}

static int check_cancel(ferry_engine *e, const char *phase);

/* A parameter's initial fp32 values into dst (host memory): its values,
 * its init callback (a failure while cancelled: FERRY_ECANCELED), or
 * zeros. */
static int initial_values(ferry_engine *e, const eng_param *p, float *dst) {
  int rc = check_cancel(e, "initial values");
  if (rc) return rc;
  if (p->values) {
    memcpy(dst, p->values, p->n * sizeof(float));
  } else if (p->init) {
    int irc = p->init(p->init_user, p->name, dst, p->n);
    if (irc && (rc = check_cancel(e, "initial values"))) return rc;
    if (irc)
      return ferry_err(&e->err, FERRY_EINVAL, "finalize: init callback of '%s' returned %d",
                       p->name, irc);
  } else {
    memset(dst, 0, p->n * sizeof(float));
  }
  return FERRY_OK;
}

/* One group's fp32 master (none with a bf16 master) and zero states (the
 * packed bytes: a zeroed int8 buffer is a zero state), held in the
 * optimizer's work tier; states homed on the device or the host are their
 * home, zeroed when reserved, and are not written again. Device math:
 * through `tmp` (host, the largest param) and copies. */
static int init_master(ferry_engine *e, uint32_t g, ferry_tier ot, float *tmp) {
  int gpu = engine_gpu_math(e);
  for (uint32_t k = 0; k < e->gt.groups[g].count; k++) {
    eng_param *p = group_param(e, g, k);
    int rc = FERRY_OK;
    if (engine_sharded(e)) { /* tmp: the group's values; the master is this rank's piece */
      if (!e->master_bf16 && p->pn) {
        float *master;
        ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_MASTER], ot, (void **)&master);
        memcpy(master, tmp + p->goff + p->plo, p->pn * sizeof(float));
      }
    } else if (!e->master_bf16) {
      float *master;
      ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_MASTER], ot, (void **)&master);
      rc = initial_values(e, p, gpu ? tmp : master);
      if (!rc && gpu) rc = gpu_upload_f32(e, master, tmp, p->n);
    }
    for (int r = FERRY_ROLE_EXP_AVG; r <= FERRY_ROLE_EXP_AVG_SQ && !rc; r++) {
      if (p->id[r] == UINT32_MAX || e->optim_home != FERRY_TIER_NVME) continue;
      e->setup_zeroed += p->state_bytes;
      void *st;
      ferry_mem_tensor_ptr(e->mem, p->id[r], ot, &st);
      if (gpu) rc = gpu_zero(e, st, p->state_bytes);
      else memset(st, 0, p->state_bytes);
    }
    if (rc) return rc;
  }
  return FERRY_OK;
}

/* A bf16 master: group g's initial fp32 values into vals (goff-indexed). */
static int group_initial_values(ferry_engine *e, uint32_t g, float *vals) {
  for (uint32_t k = 0; k < e->gt.groups[g].count; k++) {
    eng_param *p = group_param(e, g, k);
    int rc = initial_values(e, p, vals + p->goff);
    if (rc) return rc;
  }
  return FERRY_OK;
}

static int init_groups(ferry_engine *e, float *tmp);
static int init_grads(ferry_engine *e, uint32_t g, ferry_tier gt);

/* Fills master, zero states, zero grads, and the params from the master
 * values (a bf16 master: from the initial values). */
static int init_values(ferry_engine *e) {
  float *tmp = NULL;
  if (engine_gpu_math(e) || e->master_bf16 || engine_sharded(e)) {
    size_t maxn = e->gt.max_group_n; /* bf16 master or sharded: a group's values */
    if (!e->master_bf16 && !engine_sharded(e))
      for (size_t i = maxn = 0; i < e->gt.nparams; i++)
        if (e->gt.params[i].n > maxn) maxn = e->gt.params[i].n;
    tmp = malloc(maxn * sizeof(float));
    if (!tmp) return ferry_err(&e->err, FERRY_ENOMEM, "finalize: out of memory");
  }
  int rc = init_groups(e, tmp);
  free(tmp);
  if (rc) return rc; /* init_groups set the message (an init callback's, or the copy's) */
  rc = ferry_stream_synchronize(e->up);
  if (!rc) rc = ferry_stream_synchronize(e->down);
  if (rc) return ferry_err(&e->err, rc, "finalize: %s", ferry_device_last_error(e->dev));
  rc = ferry_mem_flush(e->mem);
  if (rc) return engine_mem_err(e, rc, "finalize: flush");
  return FERRY_OK;
}

/* init_values per group. */
static int init_groups(ferry_engine *e, float *tmp) {
  ferry_tier ot = work_tier(e->optim_home), gt = work_tier(e->grad_home);
  for (uint32_t g = 0; g < e->gt.ngroups; g++) {
    int rc = check_cancel(e, "initial values");
    if (rc) return rc;
    /* init_master writes every byte of every tensor (master, and states
     * homed on NVMe; other homes were zeroed when reserved): no zero-fill
     * of the group's chunks first (gigabytes on one thread) */
    rc = ferry_mem_fetch(e->mem, g, FERRY_FAMILY_OPTIM, ot, NULL,
                         FERRY_MEM_NOLOAD | FERRY_MEM_NOTRACE);
    if (!rc) rc = ferry_mem_mark_dirty(e->mem, g, FERRY_FAMILY_OPTIM, ot, NULL);
    if (rc) return engine_mem_err(e, rc, "finalize: optimizer state");
    /* the group's values first when the master is not whole (every rank
     * computes the same: the registrations agree) */
    int whole = !e->master_bf16 && !engine_sharded(e);
    if (!whole) rc = group_initial_values(e, g, tmp);
    if (!rc) rc = init_master(e, g, ot, tmp);
    if (rc) {
      ferry_mem_release(e->mem, g, FERRY_FAMILY_OPTIM, ot, NULL);
      return rc;
    }
    if (!rc) rc = stepper_write_params(e, g, whole ? NULL : tmp);
    ferry_mem_release(e->mem, g, FERRY_FAMILY_OPTIM, ot, NULL);
    if (!rc && e->optim_home == FERRY_TIER_NVME) /* after the release: held copies stay */
      rc = ferry_mem_writeback(e->mem, g, FERRY_FAMILY_OPTIM, ot);
    if (rc) return rc == FERRY_EINVAL ? rc : engine_mem_err(e, rc, "finalize: initial values");
    rc = init_grads(e, g, gt);
    if (rc) return rc;
  }
  return FERRY_OK;
}

/* Group g's zero accumulators: none kept ("none"), a flag (NVMe home: the
 * slot reads as zeros and is never read before its first write), or their
 * device or host home, zeroed when reserved (gigabytes not written again
 * on one thread): group_zero_grads's flags only. */
static int init_grads(ferry_engine *e, uint32_t g, ferry_tier gt) {
  if (e->grads_none || e->grad_home == FERRY_TIER_NVME) return group_zero_grads(e, g, 0);
  int rc = ferry_mem_fetch(e->mem, g, FERRY_FAMILY_GRADS, gt, NULL, FERRY_MEM_NOTRACE);
  if (!rc) rc = ferry_mem_mark_dirty(e->mem, g, FERRY_FAMILY_GRADS, gt, NULL);
  if (rc) return engine_mem_err(e, rc, "finalize: grads");
  for (uint32_t k = 0; k < e->gt.groups[g].count; k++) group_param(e, g, k)->got_grad = 0;
  ferry_mem_release(e->mem, g, FERRY_FAMILY_GRADS, gt, NULL);
  return FERRY_OK;
}

/* The engine's own device and pinned buffers, outside the manager, and the
 * caller's reservation (ferry_engine_reserve). */
static int alloc_buffers(ferry_engine *e, size_t dev_budget, size_t own_dev) {
  size_t gbytes = group_buffer_bytes(e), res = reserve_footprint(e);
  if (own_dev >= dev_budget || res >= dev_budget - own_dev) {
    char what[96] = "";
    if (e->reserve_bytes)
      snprintf(what, sizeof what, "the reservation (%zu bytes, ferry_engine_reserve) beside ",
               e->reserve_bytes);
    return ferry_err(&e->err, FERRY_ENOMEM,
                     "finalize: the device budget (%zu bytes) cannot hold %sthe engine's %d "
                     "gradient buffers of the largest group (%zu bytes in all) and room for its "
                     "chunks",
                     dev_budget, what, ENGINE_GRAD_SLOTS, own_dev);
  }
  int rc = drain_init(e, gbytes);
  if (!rc) rc = stepper_init(e, gbytes);
  if (!rc) rc = ranks_gather_init(e, gbytes);
  if (!rc && e->reserve_bytes) {
    rc = ferry_device_alloc(e->dev, e->reserve_bytes, &e->reserved);
    if (rc)
      return ferry_err(&e->err, rc, "finalize: the reservation of %zu bytes: %s", e->reserve_bytes,
                       ferry_device_last_error(e->dev));
  }
  return rc;
}

/* The optimizer (the stepper's, all threads) and the drain's, and the
 * scaling of the step. */
static int create_optimizers(ferry_engine *e, const ferry_optimizer_config *oc) {
  const ferry_config_values *v = e->cv;
  int rc = ferry_optimizer_create(oc, &e->opt);
  if (rc) return ferry_err(&e->err, rc, "finalize: optimizer: %s", ferry_last_error());
  rc = drain_init_optimizer(e, oc);
  if (rc) return rc;
  int fp16 = e->dtype == FERRY_DT_F16;
  e->dynamic_scale = fp16 && v->loss_scale == 0; /* e->eager: resolve_grads */
  e->fixed_scale = fp16 && v->loss_scale > 0 ? (float)v->loss_scale : 1;
  ferry_loss_scaler_init(&e->scaler, (float)v->initial_scale, 2.0f, (float)v->backoff,
                         (int)v->growth_interval);
  return FERRY_OK;
}

/* The layout's failure; one for lack of device room names the reservation
 * that took part of the budget. */
static int layout_err(ferry_engine *e, int rc, size_t dev_budget, size_t own_dev) {
  rc = engine_mem_err(e, rc, "finalize: layout");
  if (rc != FERRY_ENOMEM || !e->reserve_bytes) return rc;
  char msg[FERRY_ERR_MAX];
  snprintf(msg, sizeof msg, "%s", ferry_err_msg(&e->err));
  return ferry_err(&e->err, rc,
                   "%s (the device budget of %zu bytes less the engine's gradient buffers, %zu "
                   "bytes, and the reservation, %zu bytes, leaves %zu bytes for its chunks)",
                   msg, dev_budget, own_dev, e->reserve_bytes,
                   dev_budget - own_dev - reserve_footprint(e));
}

int ferry_engine_reserve(ferry_engine *e, size_t bytes) {
  if (!e) return FERRY_EINVAL;
  if (e->finalized || e->mem)
    return ferry_err(&e->err, FERRY_EINVAL, "reserve: call it before ferry_engine_finalize");
  if (bytes > SIZE_MAX - 256)
    return ferry_err(&e->err, FERRY_EINVAL, "reserve: %zu bytes", bytes);
  e->reserve_bytes = bytes;
  return FERRY_OK;
}

int ferry_engine_reserved(ferry_engine *e, void **ptr, size_t *bytes) {
  if (!e || !ptr || !bytes) return FERRY_EINVAL;
  if (!e->finalized)
    return ferry_err(&e->err, FERRY_EINVAL, "reserved: call it after ferry_engine_finalize");
  *ptr = e->reserved;
  *bytes = e->reserved ? e->reserve_bytes : 0;
  return FERRY_OK;
}

int ferry_engine_set_cancel(ferry_engine *e, int (*cancel)(void *user), void *user) {
  if (!e) return FERRY_EINVAL;
  if (e->finalized || e->mem)
    return ferry_err(&e->err, FERRY_EINVAL, "set_cancel: call it before ferry_engine_finalize");
  e->cancel = cancel;
  e->cancel_user = user;
  return FERRY_OK;
}

/* FERRY_ECANCELED naming the phase when the caller's cancel says so. */
static int check_cancel(ferry_engine *e, const char *phase) {
  if (!e->cancel || !e->cancel(e->cancel_user)) return FERRY_OK;
  return ferry_err(&e->err, FERRY_ECANCELED, "finalize: cancelled by the caller (%s)", phase);
}

/* The loop's per-group fetch state (loop.c). */
static int alloc_fetches(ferry_engine *e) {
  e->fetch = calloc(e->gt.ngroups, sizeof *e->fetch);
  if (!e->fetch) return ferry_err(&e->err, FERRY_ENOMEM, "finalize: out of memory");
  for (uint32_t g = 0; g < e->gt.ngroups; g++) e->fetch[g].grad_slot = -1;
  return FERRY_OK;
}

int ferry_engine_finalize(ferry_engine *e) {
  if (!e) return FERRY_EINVAL;
  if (e->finalized) return ferry_err(&e->err, FERRY_ESTATE, "finalize: already finalized");
  if (e->gt.nparams == 0) return ferry_err(&e->err, FERRY_ESTATE, "finalize: no parameters");
  int rc = group_build(e);
  if (!rc) rc = alloc_fetches(e);
  size_t own_dev = 0, own_host = 0, dev_budget = 0;
  ferry_optimizer_config oc = optimizer_config(e->cv);
  if (!rc) rc = ranks_setup(e);
  /* pieces start at multiples of 64 elements, or of the int8 state block */
  size_t align = oc.state_dtype == FERRY_DT_I8 && oc.state_block > 64 ? oc.state_block : 64;
  if (!rc) rc = group_partition(e, align);
  if (!rc) {
    engine_own_bytes(e, &own_dev, &own_host);
    dev_budget = device_budget(e);
    rc = alloc_buffers(e, dev_budget, own_dev);
    if (!rc) rc = gpu_init(e);
  }
  if (!rc) rc = create_manager(e, dev_budget, own_dev, own_host);
  if (!rc) {
    e->ocfg = oc;
    e->nstates = ferry_optimizer_state_count(&oc);
    rc = group_register(e);
    if (!rc) rc = ferry_mem_layout(e->mem);
    if (rc) return layout_err(e, rc, dev_budget, own_dev);
    group_check_chunks(e);
    /* the whole host need (homes, one step's working set, the staging)
     * before the manager's own checks, which see only the homes */
    rc = check_host_pool(e, own_host);
    if (rc) return rc;
    rc = ferry_mem_finalize(e->mem);
    if (rc == FERRY_ECANCELED) return engine_mem_err(e, rc, "finalize");
    if (rc) return layout_err(e, rc, dev_budget, own_dev);
    rc = stepper_init_param_stage(e);
  }
  if (!rc) rc = open_store(e);
  if (!rc) rc = create_optimizers(e, &oc);
  if (!rc) rc = init_values(e);
  if (!rc) rc = drain_start(e);
  if (!rc) rc = stepper_start(e);
  if (rc) return rc;
  e->tracing = 1; /* the loop's fetches until the first step become the trace */
  ferry_timeline_reset(&e->tl);
  e->tl.optim_bytes_per_param = engine_optim_bytes_per_param(e);
  e->finalized = 1;
  return FERRY_OK;
}

int ferry_engine_write_timeline(ferry_engine *e, const char *path) {
  if (!e || !path) return FERRY_EINVAL;
  if (e->finalized) stepper_wait_all(e);
  return ferry_timeline_write(&e->tl, path, &e->err);
}

double engine_optim_bytes_per_param(const ferry_engine *e) {
  /* what the optimizer's pass reads and writes: the grads it reads (the
   * accumulators, or the staged grads of "none") and the param copy it
   * writes (none with a bf16 master, which is updated in place) */
  if (!e->mem) return 0;
  double b = ferry_optimizer_bytes_per_param(&e->ocfg, e->grad_dtype,
                                             e->master_bf16 ? FERRY_DT_NONE : e->dtype);
  return b > 0 ? b : 0;
}

int ferry_engine_get_stats(ferry_engine *e, ferry_stats *out) {
  if (!e || !out) return FERRY_EINVAL;
  if (!e->mem) {
    memset(out, 0, sizeof *out);
    return FERRY_OK;
  }
  int rc = ferry_mem_get_stats(e->mem, out);
  if (!rc) out->optim_bytes_per_param = engine_optim_bytes_per_param(e);
  if (!rc) ranks_stats(e, out);
  ferry_swap_info si;
  if (!rc && e->swap && ferry_swap_get_info(e->swap, &si) == FERRY_OK) {
    out->nvme_reclaimed_files = si.reclaimed_files;
    out->nvme_reclaimed_bytes = si.reclaimed_bytes;
    out->nvme_file_bytes = si.file_bytes * (uint64_t)e->cv->nvme_npaths;
    const ferry_tier home[FERRY_FAMILIES] = {e->param_home, e->grad_home, e->optim_home};
    for (int f = 0; f < FERRY_FAMILIES; f++)
      if (home[f] == FERRY_TIER_NVME) out->nvme_data_bytes += engine_family_chunk_bytes(e, f);
  }
  return rc;
}

/* ---- the narrow internal API (engine_internal.h) ---------------------------- */

int engine_wait_step(ferry_engine *e) { return stepper_wait_all(e); }
ferry_swap *engine_swap(ferry_engine *e) { return e->swap; }
ferry_timeline *engine_timeline(ferry_engine *e) {
  if (e->mem) (void)ferry_mem_copy_hook(e->mem, 1); /* its reader wants the copy spans */
  return &e->tl;
}
ferry_dtype engine_param_dtype(const ferry_engine *e) { return e->dtype; }
void engine_set_d2h_delay(ferry_engine *e, double seconds) { drain_set_d2h_delay(e, seconds); }
void engine_set_sum_delay(ferry_engine *e, double seconds) { drain_set_sum_delay(e, seconds); }
void engine_set_sum_faults(ferry_engine *e, int count) { drain_set_sum_faults(e, count); }
_Static_assert((int)ENGINE_FAULT_ZERO == (int)GROUP_TAIL_ZERO &&
                   (int)ENGINE_FAULT_GATHER == (int)GROUP_TAIL_GATHER &&
                   (int)ENGINE_FAULT_HOME == (int)GROUP_TAIL_HOME,
               "engine_set_step_fault's points are the group_tail values");
void engine_set_step_fault(ferry_engine *e, int point, int count) {
  stepper_set_fault(e, point, count);
}
size_t engine_family_chunk_bytes(ferry_engine *e, int family) {
  ferry_footprint_family fam;
  family_bytes(e, family, &fam);
  return fam.total;
}
size_t engine_host_need(ferry_engine *e) { return host_working_set(e).total; }
size_t engine_setup_zeroed_bytes(ferry_engine *e) { return e->setup_zeroed; }
int engine_flush(ferry_engine *e) {
  int rc = ferry_mem_flush(e->mem);
  return rc ? engine_mem_err(e, rc, "flush") : FERRY_OK;
}

int ferry_engine_stats(ferry_engine *e, ferry_stats *out) { return ferry_engine_get_stats(e, out); }
