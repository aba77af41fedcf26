/* offload/engine.c — the engine's life and the loop's calls: creation from
 * a configuration, parameter registration, finalize (group table, buffers,
 * memory manager, NVMe store, optimizer, initial values, threads),
 * fetch/release with trace-driven prefetch, device grad pointers and
 * grads_ready, and the quiesce/restore pair checkpoints use. Uses drain.c,
 * stepper.c and group.c; the step driver is step.c.
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

const char *ferry_engine_last_error(const ferry_engine *e) {
  return e ? ferry_err_msg(&e->err) : "no engine";
}

ferry_device *ferry_engine_device(ferry_engine *e) { return e ? e->dev : NULL; }

/* Placement rules the configuration alone decides. */
static int check_placement(const ferry_engine *e) {
  const ferry_config_values *v = e->cv;
  const char *on_nvme = e->param_home == FERRY_TIER_NVME   ? "params"
                        : e->grad_home == FERRY_TIER_NVME  ? "grads"
                        : e->optim_home == FERRY_TIER_NVME ? "optimizer"
                                                           : NULL;
  if (on_nvme && v->nvme_npaths == 0)
    return ferry_err_thread(FERRY_ECONFIG,
                            "engine create: placement puts %s on nvme but tiers.nvme.paths is "
                            "empty (name the swap directories, or move placement.params, "
                            "placement.grads and placement.optimizer off nvme)",
                            on_nvme);
  if (e->optim_home == FERRY_TIER_DEVICE && e->grad_home != FERRY_TIER_DEVICE)
    return ferry_err_thread(FERRY_ECONFIG,
                            "engine create: placement.optimizer = \"gpu\" needs placement.grads "
                            "= \"gpu\" (the optimizer reads the grads where it runs)");
  if (e->grad_home == FERRY_TIER_DEVICE && v->prec_grads != FERRY_DT_F32)
    return ferry_err_thread(FERRY_ECONFIG,
                            "engine create: precision.grads = \"bf16\" is for host and nvme "
                            "grad homes; placement.grads is \"gpu\"%s (set precision.grads = "
                            "\"fp32\")",
                            v->place_grads == FERRY_GRADS_AUTO ? " (auto, with the optimizer on "
                                                                 "the gpu)" : "");
  return FERRY_OK;
}

/* The compact optimizer layouts the configuration asks for
 * (optimizer.state_dtype, optimizer.state_block, precision.master) and
 * what they need. */
static int check_compact(ferry_engine *e) {
  const ferry_config_values *v = e->cv;
  static const char *const opt_names[] = {"adamw", "adam", "adagrad", "lamb", "sgd", "lion"};
  e->master_bf16 = v->prec_master == FERRY_DT_BF16;
  if (e->master_bf16 && v->prec_params != FERRY_DT_BF16)
    return ferry_err_thread(FERRY_ECONFIG,
                            "engine create: precision.master = \"bf16\" needs precision.params "
                            "= \"bf16\" (the bf16 params are the master), not \"%s\"",
                            v->prec_params == FERRY_DT_F32 ? "fp32" : "fp16");
  if (v->opt_state_dtype == FERRY_DT_I8 && v->opt_type != FERRY_OPTIM_ADAMW &&
      v->opt_type != FERRY_OPTIM_ADAM && v->opt_type != FERRY_OPTIM_LION)
    return ferry_err_thread(FERRY_ECONFIG,
                            "engine create: optimizer.state_dtype = \"int8\" needs optimizer.type "
                            "\"adamw\", \"adam\" or \"lion\", not \"%s\" (or set "
                            "optimizer.state_dtype = \"fp32\" or \"bf16\")",
                            opt_names[v->opt_type]);
  ferry_optimizer_config oc = ferry_optimizer_config_default(v->opt_type);
  oc.momentum = (float)v->momentum;
  if (e->master_bf16 && ferry_optimizer_state_count(&oc) == 0)
    return ferry_err_thread(FERRY_ECONFIG,
                            "engine create: precision.master = \"bf16\" with optimizer.type "
                            "\"sgd\" and optimizer.momentum = 0 keeps no optimizer state at all; "
                            "not supported (set precision.master = \"fp32\" or a momentum)");
  return FERRY_OK;
}

/* Why a step cannot drop its grads as it applies them (placement.grads =
 * "none"), and what to set instead; NULL when it can. */
static const char *why_grads_kept(const ferry_engine *e, const char **fix) {
  const ferry_config_values *v = e->cv;
  *fix = NULL;
  if (!v->step_during_backward) *fix = "step_during_backward = true";
  else if (v->clip_grad_norm > 0) *fix = "clip_grad_norm = 0";
  else if (e->dtype == FERRY_DT_F16) *fix = "precision.params = \"bf16\" or \"fp32\"";
  else if (v->grad_accumulation != 1) *fix = "grad_accumulation = 1";
  if (!*fix) return NULL;
  if (!v->step_during_backward) return "step_during_backward = false waits for the whole gradient";
  if (v->clip_grad_norm > 0) return "clip_grad_norm needs the global norm before any update";
  if (e->dtype == FERRY_DT_F16) return "fp16 params check every gradient for overflow first";
  return "grad_accumulation > 1 sums micro-batches into kept gradients";
}

/* placement.grads as the engine uses it (create): "auto" decided, "none"
 * checked; also whether updates run during backward (eager). */
static int resolve_grads(ferry_engine *e) {
  const ferry_config_values *v = e->cv;
  /* Without a global decision (clipping, overflow skip) each group's update
   * can run as soon as its grads are final, during backward. */
  e->eager = v->step_during_backward && v->clip_grad_norm == 0 && e->dtype != FERRY_DT_F16;
  const char *fix, *why = why_grads_kept(e, &fix);
  int pg = v->place_grads;
  if (pg == FERRY_GRADS_AUTO)
    pg = e->optim_home == FERRY_TIER_DEVICE ? FERRY_TIER_DEVICE
         : !why                             ? FERRY_GRADS_NONE
                                            : (int)e->optim_home;
  if (pg == FERRY_GRADS_NONE && why)
    return ferry_err_thread(FERRY_ECONFIG,
                            "engine create: placement.grads = \"none\" keeps no gradients, but "
                            "%s: set %s, or placement.grads = \"host\", \"nvme\" or "
                            "\"auto\"",
                            why, fix);
  e->grads_none = pg == FERRY_GRADS_NONE;
  e->grad_home = e->grads_none ? FERRY_TIER_HOST : (ferry_tier)pg;
  e->grad_dtype = e->grads_none ? e->dtype : v->prec_grads;
  ferry_logf(&e->log, FERRY_LOG_INFO, "engine: placement.grads = \"%s\"%s%s",
             e->grads_none                        ? "none"
             : e->grad_home == FERRY_TIER_DEVICE ? "gpu"
                                                 : ferry_tier_name(e->grad_home),
             v->place_grads == FERRY_GRADS_AUTO ? " (auto)" : "",
             !e->grads_none && e->grad_dtype == FERRY_DT_BF16 ? ", bf16 accumulators" : "");
  return FERRY_OK;
}

ferry_tier ferry_engine_grad_home(const ferry_engine *e, int *none) {
  if (none) *none = e ? e->grads_none : 0;
  return e ? e->grad_home : FERRY_TIER_HOST;
}

/* Where the arithmetic on grads and optimizer state runs (engine_gpu_math):
 * on a real GPU when the optimizer state lives there, which needs the
 * grads there too (check_placement) and an optimizer with CUDA kernels. */
static int choose_math(ferry_engine *e, const ferry_device_info *di) {
  const ferry_config_values *v = e->cv;
  e->gpu_math = !di->emulated && e->optim_home == FERRY_TIER_DEVICE;
  if (!di->emulated && e->grad_home == FERRY_TIER_DEVICE && !e->gpu_math)
    return ferry_err_thread(FERRY_ENOTSUP,
                            "engine create: placement.grads = \"gpu\" on %s needs "
                            "placement.optimizer = \"gpu\" too (the CPU optimizer cannot read "
                            "device memory)",
                            di->name);
  if (e->gpu_math && v->opt_type != FERRY_OPTIM_ADAMW && v->opt_type != FERRY_OPTIM_ADAM)
    return ferry_err_thread(FERRY_ENOTSUP,
                            "engine create: placement.optimizer = \"gpu\" on %s runs the CUDA "
                            "AdamW: optimizer.type must be \"adamw\" or \"adam\" (or put the "
                            "optimizer on the host or nvme)",
                            di->name);
  return FERRY_OK;
}

/* The engine's own device, unless the caller gave one. */
static int open_device(ferry_engine *e, ferry_device *dev) {
  const ferry_config_values *v = e->cv;
  if (dev) {
    e->dev = dev;
  } else {
    ferry_device_config dc = ferry_device_config_default();
    dc.kind = v->device;
    dc.capacity = (size_t)v->gpu_budget;
    int rc = ferry_device_create(&dc, &e->dev);
    if (rc) {
      char msg[FERRY_ERR_MAX];
      snprintf(msg, sizeof msg, "%s", ferry_last_error());
      return ferry_err_thread(rc, "engine create: %s%s", msg,
                              v->gpu_budget == 0 ? " (set tiers.gpu.budget)" : "");
    }
    e->own_dev = 1;
  }
  ferry_device_info di;
  ferry_device_get_info(e->dev, &di);
  return choose_math(e, &di);
}

int ferry_engine_create(const ferry_config *cfg, ferry_device *dev, ferry_engine **out) {
  if (!out) return FERRY_EINVAL;
  *out = NULL;
  ferry_engine *e = calloc(1, sizeof *e);
  if (!e) return ferry_err_thread(FERRY_ENOMEM, "engine create: out of memory");
  ferry_errbuf_init(&e->err);
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->drain.cv_work, NULL);
  pthread_cond_init(&e->drain.cv_idle, NULL);
  pthread_cond_init(&e->drain.cv_slot, NULL);
  pthread_cond_init(&e->stepper.cv, NULL);
  for (int i = 0; i < ENGINE_GRAD_SLOTS; i++) e->drain.slot[i].owner = -1;
  e->stepper.waits_for = -1;
  e->nranks = 1;
  e->ahead_group = e->ahead_slot = -1;
  int rc = ferry_config_clone(cfg, &e->cfg);
  if (rc) {
    ferry_engine_destroy(e);
    return ferry_err_thread(rc, "engine create: out of memory");
  }
  const ferry_config_values *v = e->cv = ferry_config_values_get(e->cfg);
  e->log = (ferry_logger){NULL, NULL, 0};
  e->dtype = v->prec_params;
  e->esize = ferry_dtype_size(e->dtype);
  e->param_home = v->place_params;
  e->optim_home = v->place_optimizer;
  rc = check_compact(e);
  if (!rc) rc = resolve_grads(e);
  if (!rc) rc = check_placement(e);
  if (!rc) rc = open_device(e, dev);
  if (rc) {
    char msg[FERRY_ERR_MAX];
    snprintf(msg, sizeof msg, "%s", ferry_last_error());
    ferry_engine_destroy(e);
    return ferry_err_thread(rc, "%s", msg);
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

void ferry_engine_destroy(ferry_engine *e) {
  if (!e) return;
  drain_stop(e); /* first: the drain may still queue updates */
  stepper_stop(e);
  ranks_drop_ahead(e); /* stage 3: a read-ahead's gather, before its channel goes */
  ranks_free(e);       /* the threads' channels: after the threads */
  if (e->up) ferry_stream_synchronize(e->up);
  if (e->down) ferry_stream_synchronize(e->down);
  if (e->cv && e->cv->timeline[0] && e->finalized)
    ferry_timeline_write(&e->tl, e->cv->timeline, &e->err);
  ferry_mem_destroy(e->mem); /* waits for transfers in flight */
  ferry_swap_close(e->swap);
  ferry_optimizer_destroy(e->opt);
  drain_free(e);
  stepper_free(e);
  gpu_free(e);
  ranks_gather_free(e);
  if (e->dev && e->reserved) ferry_device_free(e->dev, e->reserved);
  if (e->dev) {
    ferry_stream_destroy(e->up);
    ferry_stream_destroy(e->down);
    if (e->own_dev) ferry_device_destroy(e->dev);
  }
  group_free(&e->gt);
  free(e->trace);
  free(e->trace_fam);
  ferry_timeline_destroy(&e->tl);
  ferry_config_destroy(e->cfg);
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->drain.cv_work);
  pthread_cond_destroy(&e->drain.cv_idle);
  pthread_cond_destroy(&e->drain.cv_slot);
  pthread_cond_destroy(&e->stepper.cv);
  ferry_errbuf_destroy(&e->err);
  free(e);
}

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
  mc.host_pinned = v->host_pinned;
  mc.pinned_fallback = v->host_memlock == FERRY_MEMLOCK_PAGEABLE;
  mc.numa_local = v->host_numa == FERRY_NUMA_LOCAL;
  mc.log = e->log;
  mc.on_copy = on_copy;
  mc.copy_user = e;
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
  sc.verify = v->nvme_verify == FERRY_VERIFY_CRC32C;
  sc.name = "engine";
  sc.log = e->log;
  int rc = ferry_swap_open(&sc, &e->swap);
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

/* A parameter's initial fp32 values into dst (host memory): its values,
 * its init callback, or zeros. */
static int initial_values(ferry_engine *e, const eng_param *p, float *dst) {
  if (p->values) {
    memcpy(dst, p->values, p->n * sizeof(float));
  } else if (p->init) {
    int irc = p->init(p->init_user, p->name, dst, p->n);
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
 * optimizer's work tier. Device math: through `tmp` (host, the largest
 * param) and copies. */
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
      if (p->id[r] == UINT32_MAX) continue;
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
    int rc = ferry_mem_fetch(e->mem, g, FERRY_FAMILY_OPTIM, ot, NULL, FERRY_MEM_NOTRACE);
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
 * slot reads as zeros and is never read before its first write), or zeros
 * written in their home. */
static int init_grads(ferry_engine *e, uint32_t g, ferry_tier gt) {
  if (e->grads_none || e->grad_home == FERRY_TIER_NVME) return group_zero_grads(e, g, 0);
  int rc = ferry_mem_fetch(e->mem, g, FERRY_FAMILY_GRADS, gt, NULL, FERRY_MEM_NOTRACE);
  if (!rc) rc = ferry_mem_mark_dirty(e->mem, g, FERRY_FAMILY_GRADS, gt, NULL);
  if (rc) return engine_mem_err(e, rc, "finalize: grads");
  rc = group_zero_grads(e, g, 1);
  ferry_mem_release(e->mem, g, FERRY_FAMILY_GRADS, gt, NULL);
  return rc;
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

int ferry_engine_finalize(ferry_engine *e) {
  if (!e) return FERRY_EINVAL;
  if (e->finalized) return ferry_err(&e->err, FERRY_ESTATE, "finalize: already finalized");
  if (e->gt.nparams == 0) return ferry_err(&e->err, FERRY_ESTATE, "finalize: no parameters");
  int rc = group_build(e);
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
    for (size_t i = 0; i < e->gt.nparams; i++)
      e->gt.params[i].state_bytes = ferry_optimizer_state_bytes(&oc, e->gt.params[i].pn);
    rc = group_register(e);
    if (!rc) rc = ferry_mem_layout(e->mem);
    if (rc) return layout_err(e, rc, dev_budget, own_dev);
    group_check_chunks(e);
    /* the whole host need (homes, one step's working set, the staging)
     * before the manager's own checks, which see only the homes */
    rc = check_host_pool(e, own_host);
    if (rc) return rc;
    rc = ferry_mem_finalize(e->mem);
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

/* ---- forward / backward ------------------------------------------------ */

static int check_group(ferry_engine *e, int group, const char *op) {
  if (!e->finalized) return ferry_err(&e->err, FERRY_ESTATE, "%s: call ferry_engine_finalize first", op);
  if (group < 0 || (uint32_t)group >= e->gt.ngroups)
    return ferry_err(&e->err, FERRY_EINVAL, "%s: group %d (the model has %u)", op, group,
                     e->gt.ngroups);
  return FERRY_OK;
}

/* Prefetches the groups the trace expects next, as far as the budget or
 * prefetch_depth allows. Never waits; a full budget just stops it. */
static void prefetch(ferry_engine *e) {
  if (e->param_home == FERRY_TIER_DEVICE) return; /* always resident */
  if (engine_params_sharded(e)) {                 /* stage 3: the next group's gather */
    ranks_read_ahead(e);
    return;
  }
  uint32_t ng = e->gt.ngroups;
  size_t depth = e->cv->prefetch_depth ? (size_t)e->cv->prefetch_depth : ng;
  if (depth >= ng) depth = ng - 1;
  if (depth > e->param_ahead) depth = e->param_ahead; /* NVMe params: the host's room */
  /* and at most one group through the host: deeper read-ahead of NVMe
   * params is evicted before its use and read again (llama-100m, host
   * budget 96M, steps 2-3: 112 and 116 group reads with two ahead, 90 and
   * 99 with one, 86 with none; 160M and 17 ahead: 114-131). One group
   * ahead still overlaps the next group's read with this one's compute. */
  if (e->param_home == FERRY_TIER_NVME && depth > 1 && !e->cv->prefetch_depth) depth = 1;
  size_t len = ferry_mem_trace_length(e->mem);

  for (size_t k = 1; k <= depth; k++) {
    /* never past this iteration: the step is about to change those params */
    if (e->fetches + k > len) return;
    uint32_t g;
    int fam;
    if (ferry_mem_trace_peek(e->mem, k, &g, &fam)) return;
    if (fam != FERRY_FAMILY_PARAMS) continue;
    pthread_mutex_lock(&e->mu);
    int pending = group_pending(&e->gt.groups[g]);
    pthread_mutex_unlock(&e->mu);
    if (pending) return; /* the running step has not written it yet */
    if (ferry_mem_prefetch(e->mem, g, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE)) return;
  }
}

/* The first step's fetches, in the loop's order, become the trace. */
static void record_trace(ferry_engine *e, int group) {
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
}

/* The drain or the stepper has work (it may free room the loop's fetch
 * needs). */
static int threads_busy(ferry_engine *e) {
  pthread_mutex_lock(&e->mu);
  int busy = e->stepper.pending || e->drain.qhead != e->drain.qtail;
  pthread_mutex_unlock(&e->mu);
  return busy;
}

int ferry_fetch(ferry_engine *e, int group, ferry_stream *s) {
  if (!e) return FERRY_EINVAL;
  int rc = check_group(e, group, "fetch");
  if (rc) return rc;
  if (!s) return ferry_err(&e->err, FERRY_EINVAL, "fetch: stream is NULL");
  eng_group *gr = &e->gt.groups[group];
  double t0 = ferry_now();
  rc = stepper_wait_group(e, (uint32_t)group); /* its update of the last step is done */
  if (rc) {
    char why[768];
    pthread_mutex_lock(&e->mu);
    snprintf(why, sizeof why, "%s", e->stepper.fail_why);
    pthread_mutex_unlock(&e->mu);
    if (!why[0]) snprintf(why, sizeof why, "%s", ferry_strerror(rc));
    return ferry_err(&e->err, rc,
                     "fetch: group %d: its optimizer update failed (%s); it is retried at the "
                     "next step",
                     group, why);
  }
  if (engine_params_sharded(e)) { /* stage 3: every rank's pieces gathered */
    rc = ranks_fetch_params(e, (uint32_t)group, s);
    if (rc) return rc;
  } else {
    rc =
        group_fetch(e, (uint32_t)group, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, s, 0, threads_busy);
    if (rc) return engine_mem_err(e, rc, "fetch");
    /* params uploaded by the last step (device home): ordered on e->up */
    rc = ferry_stream_wait_event(s, gr->uploaded);
    if (rc) return ferry_err(&e->err, rc, "fetch: %s", ferry_device_last_error(e->dev));
  }
  pthread_mutex_lock(&e->mu);
  gr->fetched++;
  pthread_mutex_unlock(&e->mu);
  gr->stream = s;
  e->fetches++;
  if (e->tracing) record_trace(e, group); /* the loop's own order: the threads fetch too */
  else prefetch(e);
  ferry_timeline_add(&e->tl, FERRY_LANE_STEP, "fetch", t0, ferry_now());
  return FERRY_OK;
}

int ferry_release(ferry_engine *e, int group, ferry_stream *s) {
  if (!e) return FERRY_EINVAL;
  int rc = check_group(e, group, "release");
  if (rc) return rc;
  eng_group *gr = &e->gt.groups[group];
  pthread_mutex_lock(&e->mu);
  int fetched = gr->fetched;
  pthread_mutex_unlock(&e->mu);
  if (fetched == 0)
    return ferry_err(&e->err, FERRY_ESTATE, "release: group %d is not fetched", group);
  if (engine_params_sharded(e)) {
    rc = ranks_release_params(e, (uint32_t)group, s);
    if (rc) return rc;
  } else {
    rc = ferry_mem_release(e->mem, (uint32_t)group, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, s);
    if (rc) return engine_mem_err(e, rc, "release");
  }
  pthread_mutex_lock(&e->mu);
  gr->fetched--;
  pthread_cond_broadcast(&e->stepper.cv); /* an update may wait for the release */
  pthread_mutex_unlock(&e->mu);
  return FERRY_OK;
}

int ferry_param_device(ferry_engine *e, const char *name, void **param, void **grad) {
  if (!e) return FERRY_EINVAL;
  if (!e->finalized) return ferry_err(&e->err, FERRY_ESTATE, "param device: not finalized");
  eng_param *p = name ? group_find(e, name) : NULL;
  if (!p) return ferry_err(&e->err, FERRY_ENOENT, "param device: no parameter '%s'", name ? name : "(null)");
  eng_group *gr = &e->gt.groups[p->group];
  pthread_mutex_lock(&e->mu);
  int fetched = gr->fetched;
  pthread_mutex_unlock(&e->mu);
  if (!fetched)
    return ferry_err(&e->err, FERRY_ESTATE, "param device '%s': group %u is not fetched", p->name,
                     p->group);
  if (param && engine_params_sharded(e)) { /* stage 3: in the group's gather buffer */
    *param = (char *)e->gather_dev[gr->gslot] + p->goff * e->esize;
  } else if (param) {
    int rc = ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_PARAM], FERRY_TIER_DEVICE, param);
    if (rc) return engine_mem_err(e, rc, "param device");
  }
  if (grad) {
    if (gr->grad_slot < 0) { /* take a device grad buffer, zeroed in stream order */
      int got;
      int rc = drain_take_slot(e, p->group, &got);
      if (rc == FERRY_ESTATE) return rc; /* the loop holds up the drain: said why */
      if (rc) return ferry_err(&e->err, rc, "param device: the gradient drain failed");
      gr->grad_slot = got;
      /* after the drain's last copy out of it */
      rc = ferry_stream_wait_event(gr->stream, e->drain.slot[got].drained);
      if (!rc) rc = ferry_memset_async(gr->stream, e->drain.slot[got].dev, 0, gr->n * e->esize);
      if (rc) return ferry_err(&e->err, rc, "param device: %s", ferry_device_last_error(e->dev));
    }
    *grad = (char *)e->drain.slot[gr->grad_slot].dev + p->goff * e->esize;
  }
  return FERRY_OK;
}

int ferry_grads_ready(ferry_engine *e, int group, ferry_stream *s) {
  if (!e) return FERRY_EINVAL;
  int rc = check_group(e, group, "grads ready");
  if (rc) return rc;
  eng_group *gr = &e->gt.groups[group];
  if (gr->grad_slot < 0)
    return ferry_err(&e->err, FERRY_ESTATE,
                     "grads ready: group %d has no gradient buffer (ask ferry_param_device for "
                     "its grad pointers after fetching it)",
                     group);
  rc = ferry_event_record(e->drain.slot[gr->grad_slot].ready, s);
  if (rc) return ferry_err(&e->err, rc, "grads ready: %s", ferry_device_last_error(e->dev));
  drain_submit(e, (uint32_t)group, gr->grad_slot); /* the drain owns it now */
  gr->grad_slot = -1;
  return FERRY_OK;
}

/* A bf16 master is the params: the group's, read where they are (the
 * uploads of the last step done first), widened to fp32. */
static int read_bf16_master(ferry_engine *e, const eng_param *p, float *dst) {
  eng_group *gr = &e->gt.groups[p->group];
  ferry_stream *s = NULL;
  void *buf = malloc(gr->n * e->esize);
  int rc = buf ? ferry_stream_synchronize(e->up) : FERRY_ENOMEM;
  if (!rc) rc = ferry_stream_synchronize(e->down); /* device math's last kernels */
  if (!rc) rc = ferry_stream_create(e->dev, &s);
  if (rc) {
    free(buf);
    return ferry_err(&e->err, rc, "param read: %s",
                     rc == FERRY_ENOMEM ? "out of memory" : ferry_device_last_error(e->dev));
  }
  rc = stepper_read_params(e, p->group, buf, s);
  for (size_t i = 0; !rc && i < p->n; i++)
    dst[i] = ferry_dt_load((const char *)buf + p->goff * e->esize, e->dtype, i);
  ferry_stream_destroy(s);
  free(buf);
  return rc;
}

int ferry_param_read(ferry_engine *e, const char *name, float *dst, size_t count) {
  if (!e || !dst) return FERRY_EINVAL;
  if (!e->finalized) return ferry_err(&e->err, FERRY_ESTATE, "param read: not finalized");
  eng_param *p = name ? group_find(e, name) : NULL;
  if (!p) return ferry_err(&e->err, FERRY_ENOENT, "param read: no parameter '%s'", name ? name : "(null)");
  if (count != p->n)
    return ferry_err(&e->err, FERRY_EINVAL, "param read '%s': count %zu, the tensor has %zu",
                     p->name, count, p->n);
  int rc = stepper_wait_all(e);
  if (!rc) rc = drain_wait(e);
  if (rc) return rc;
  if (e->master_bf16) return read_bf16_master(e, p, dst);
  ferry_tier ot = work_tier(e->optim_home);
  rc = ferry_mem_fetch(e->mem, p->group, FERRY_FAMILY_OPTIM, ot, NULL, FERRY_MEM_NOTRACE);
  if (rc) return engine_mem_err(e, rc, "param read");
  float *master = NULL;
  if (p->pn) ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_MASTER], ot, (void **)&master);
  if (engine_sharded(e))
    rc = ranks_read_param(e, p, master, dst); /* a collective */
  else if (engine_gpu_math(e))
    rc = gpu_read_f32(e, dst, master, count); /* after the kernels */
  else memcpy(dst, master, count * sizeof(float));
  ferry_mem_release(e->mem, p->group, FERRY_FAMILY_OPTIM, ot, NULL);
  return rc;
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
  }
  return rc;
}

/* ---- for checkpoints ------------------------------------------------------ */

int engine_quiesce(ferry_engine *e, const char *op) {
  if (!e->finalized) return ferry_err(&e->err, FERRY_ESTATE, "%s: call ferry_engine_finalize first", op);
  int rc = ranks_drop_ahead(e); /* stage 3: the params may change */
  if (rc) return rc;
  rc = stepper_wait_all(e);
  pthread_mutex_lock(&e->mu);
  int failed = -1, why = 0, fetched = -1;
  char text[768];
  for (uint32_t g = 0; g < e->gt.ngroups && failed < 0; g++)
    if (e->gt.groups[g].state == GROUP_FAILED) failed = (int)g, why = e->gt.groups[g].fail_status;
  snprintf(text, sizeof text, "%s", e->stepper.fail_why[0] ? e->stepper.fail_why : ferry_strerror(why));
  pthread_mutex_unlock(&e->mu);
  if (failed >= 0) /* the state is half a step: never saved, never overwritten */
    return ferry_err(&e->err, FERRY_ESTATE,
                     "%s: the optimizer update of group %d failed (%s): the state is half a "
                     "step until the update is retried at the next step",
                     op, failed, text);
  if (rc)
    return ferry_err(&e->err, rc, "%s: the last step failed (%s)", op, ferry_strerror(rc));
  rc = drain_wait(e);
  if (rc) return ferry_err(&e->err, rc, "%s: the gradient drain failed: %s", op, ferry_err_msg(&e->err));
  int micro;
  uint32_t part;
  drain_progress(e, &micro, &part);
  pthread_mutex_lock(&e->mu);
  for (uint32_t g = 0; g < e->gt.ngroups && fetched < 0; g++)
    if (e->gt.groups[g].fetched) fetched = (int)g;
  pthread_mutex_unlock(&e->mu);
  if (micro || part)
    return ferry_err(&e->err, FERRY_ESTATE,
                     "%s: %d micro-batch(es) and %d group(s) of grads are accumulated; call it "
                     "between steps (after ferry_step)",
                     op, micro, (int)part);
  if (fetched >= 0)
    return ferry_err(&e->err, FERRY_ESTATE, "%s: group %d is fetched; release every group first", op,
                     fetched);
  rc = ferry_stream_synchronize(e->up);
  if (!rc) rc = ferry_stream_synchronize(e->down); /* device math's last kernels */
  if (rc) return ferry_err(&e->err, rc, "%s: %s", op, ferry_device_last_error(e->dev));
  return FERRY_OK;
}

void engine_progress_get(const ferry_engine *e, engine_progress *out) {
  out->steps = e->steps;
  out->scale = e->scaler.scale;
  out->good_steps = e->scaler.good_steps;
  out->skipped = e->scaler.skipped;
}

void engine_restore(ferry_engine *e, const engine_progress *p) {
  pthread_mutex_lock(&e->mu);
  e->steps = p->steps;
  e->stepper.cur_step = p->steps;
  pthread_mutex_unlock(&e->mu);
  ferry_optimizer_set_step(e->opt, p->steps);
  if (e->dynamic_scale) {
    e->scaler.scale = p->scale;
    e->scaler.good_steps = p->good_steps;
    e->scaler.skipped = p->skipped;
  }
}

/* ---- the narrow internal API (engine_internal.h) ---------------------------- */

int engine_wait_step(ferry_engine *e) { return stepper_wait_all(e); }
ferry_swap *engine_swap(ferry_engine *e) { return e->swap; }
ferry_timeline *engine_timeline(ferry_engine *e) {
  if (e->mem) (void)ferry_mem_copy_hook(e->mem, 1); /* its reader wants the copy spans */
  return &e->tl;
}
ferry_dtype engine_param_dtype(const ferry_engine *e) { return e->dtype; }
void engine_set_d2h_delay(ferry_engine *e, double seconds) { e->drain.d2h_delay = seconds; }
size_t engine_family_chunk_bytes(ferry_engine *e, int family) {
  ferry_footprint_family fam;
  family_bytes(e, family, &fam);
  return fam.total;
}
size_t engine_host_need(ferry_engine *e) { return host_working_set(e).total; }
int engine_flush(ferry_engine *e) {
  int rc = ferry_mem_flush(e->mem);
  return rc ? engine_mem_err(e, rc, "flush") : FERRY_OK;
}

int ferry_engine_stats(ferry_engine *e, ferry_stats *out) { return ferry_engine_get_stats(e, out); }
