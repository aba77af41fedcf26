/* offload/create.c — the engine's birth and death: create (the placement
 * the configuration decides: grads "auto" and "none", compact optimizer
 * layouts, device math or the CPU's, the device and the streams) and
 * destroy (the threads stopped first, then every room's buffers). Uses
 * every room's create and free calls; finalize is engine.c.
 */
#include "offload/engine_impl.h"

#include <stdio.h>
#include <stdlib.h>

const char *ferry_engine_last_error(const ferry_engine *e) {
  static _Thread_local char copy[FERRY_ERR_MAX]; /* the engine's threads may set it meanwhile */
  if (!e) return "no engine";
  ferry_err_copy(&e->err, copy, sizeof copy);
  return copy;
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
  drain_create(e);
  stepper_create(e);
  ranks_init(e);
  e->nranks = 1;
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
  /* not finalized (cancelled or failed): the NVMe writes still queued are
   * scratch, since the files go with the store; only those on the disk
   * are awaited */
  if (e->swap && !e->finalized && !e->cv->nvme_keep_files) ferry_swap_discard(e->swap);
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
  free(e->fetch);
  free(e->trace);
  free(e->trace_fam);
  ferry_timeline_destroy(&e->tl);
  ferry_config_destroy(e->cfg);
  pthread_mutex_destroy(&e->mu);
  ferry_errbuf_destroy(&e->err);
  free(e);
}

