/* offload/step.c — the optimizer step, pipelined over the groups in forward
 * order: the NVMe read of group i+1's optimizer state (a prefetch), the CPU
 * optimizer on group i (one fused pass that also writes the params in their
 * dtype), the write-back of group i's state to NVMe, and the upload of its
 * new params, all in flight at once. fp16 dynamic loss scaling (overflow:
 * skip, back off) and clipping by the global norm come first.
 */
#include "offload/engine_impl.h"
#include "optim/scalar_impl.h"

#include <math.h>
#include <string.h>

static int work_tier(int home) { return home == FERRY_TIER_NVME ? FERRY_TIER_HOST : home; }

static int mem_err(ferry_engine *e, int rc, const char *what) {
  return ferry_err(&e->err, rc, "%s: %s", what, ferry_mem_last_error(e->mem));
}

/* Where the new params of group g go: a pinned staging buffer (device
 * home, uploaded in param_commit), or the host copy (host or NVMe home).
 * dst[k] for the group's k-th param. */
static int param_prepare(ferry_engine *e, uint32_t g, int slot, void **dst) {
  eng_group *gr = &e->groups[g];
  int rc = FERRY_OK;
  if (e->param_home == FERRY_TIER_DEVICE) {
    rc = ferry_event_synchronize(e->stage_up_ev[slot]); /* its last upload is done */
    if (rc) return ferry_err(&e->err, rc, "step: %s", ferry_device_last_error(e->dev));
    for (uint32_t k = 0; k < gr->count; k++)
      dst[k] = (char *)e->stage_up[slot] + e->params[e->by_group[gr->first + k]].goff * e->esize;
    return FERRY_OK;
  }
  if (e->param_home == FERRY_TIER_NVME) {
    rc = ferry_mem_fetch(e->mem, g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL, FERRY_MEM_NOLOAD);
    if (rc) return mem_err(e, rc, "step: params");
  }
  for (uint32_t k = 0; k < gr->count && !rc; k++)
    rc = ferry_mem_tensor_ptr(e->mem, e->params[e->by_group[gr->first + k]].id[FERRY_ROLE_PARAM],
                              FERRY_TIER_HOST, &dst[k]);
  return rc ? mem_err(e, rc, "step: params") : FERRY_OK;
}

static int param_commit(ferry_engine *e, uint32_t g, int slot) {
  eng_group *gr = &e->groups[g];
  int rc = FERRY_OK;
  if (e->param_home == FERRY_TIER_DEVICE) {
    double t0 = ferry_now();
    for (uint32_t k = 0; k < gr->count && !rc; k++) {
      eng_param *p = &e->params[e->by_group[gr->first + k]];
      void *d;
      rc = ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_PARAM], FERRY_TIER_DEVICE, &d);
      if (rc) return mem_err(e, rc, "step: upload");
      rc = ferry_memcpy_async(e->up, d, (char *)e->stage_up[slot] + p->goff * e->esize,
                              p->n * e->esize, FERRY_COPY_H2D);
    }
    if (!rc) rc = ferry_event_record(e->stage_up_ev[slot], e->up);
    if (!rc) rc = ferry_event_record(gr->uploaded, e->up);
    if (rc) return ferry_err(&e->err, rc, "step: upload: %s", ferry_device_last_error(e->dev));
    ferry_timeline_add(&e->tl, FERRY_LANE_H2D, "params enqueue", t0, ferry_now());
    return FERRY_OK;
  }
  rc = ferry_mem_mark_dirty(e->mem, g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL);
  if (!rc && e->param_home == FERRY_TIER_NVME) {
    rc = ferry_mem_writeback(e->mem, g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST);
    int r2 = ferry_mem_release(e->mem, g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL);
    if (!rc) rc = r2;
  }
  return rc ? mem_err(e, rc, "step: params") : FERRY_OK;
}

int engine_write_params(ferry_engine *e, uint32_t g, int slot, const float *unused) {
  (void)unused;
  eng_group *gr = &e->groups[g];
  void **dst = e->dsts;
  int rc = param_prepare(e, g, slot, dst);
  if (rc) return rc;
  int ot = work_tier(e->optim_home);
  for (uint32_t k = 0; k < gr->count; k++) {
    eng_param *p = &e->params[e->by_group[gr->first + k]];
    float *master;
    ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_MASTER], ot, (void **)&master);
    for (size_t i = 0; i < p->n; i++) optim_store(dst[k], e->dtype, i, master[i]);
  }
  return param_commit(e, g, slot);
}

static int zero_group_grads(ferry_engine *e, uint32_t g, int held) {
  int gt = work_tier(e->grad_home);
  int rc = held ? 0 : ferry_mem_fetch(e->mem, g, FERRY_FAMILY_GRADS, gt, NULL, 0);
  if (rc) return mem_err(e, rc, "step: grads");
  eng_group *gr = &e->groups[g];
  for (uint32_t k = 0; k < gr->count; k++) {
    eng_param *p = &e->params[e->by_group[gr->first + k]];
    void *acc;
    ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_GRAD], gt, &acc);
    memset(acc, 0, p->n * sizeof(float));
  }
  gr->sumsq = 0;
  gr->nonfinite = 0;
  return held ? FERRY_OK : ferry_mem_release(e->mem, g, FERRY_FAMILY_GRADS, gt, NULL);
}

static int step_group(ferry_engine *e, uint32_t i, float gscale) {
  eng_group *gr = &e->groups[i];
  int ot = work_tier(e->optim_home), gt = work_tier(e->grad_home);
  double t0 = ferry_now();
  int rc = ferry_mem_fetch(e->mem, i, FERRY_FAMILY_OPTIM, ot, NULL, 0);
  if (rc) return mem_err(e, rc, "step: optimizer state");
  double t1 = ferry_now();
  if (t1 - t0 > 1e-4) ferry_timeline_add(&e->tl, FERRY_LANE_STEP, "wait for state", t0, t1);
  if (i + 1 < e->ngroups) /* the read of group i+1 overlaps this group's update */
    (void)ferry_mem_prefetch(e->mem, i + 1, FERRY_FAMILY_OPTIM, ot);
  rc = ferry_mem_fetch(e->mem, i, FERRY_FAMILY_GRADS, gt, NULL, 0);
  if (rc) {
    ferry_mem_release(e->mem, i, FERRY_FAMILY_OPTIM, ot, NULL);
    return mem_err(e, rc, "step: grads");
  }
  int slot = (int)(i % ENGINE_STAGE_SLOTS);
  void **dst = e->dsts;
  rc = param_prepare(e, i, slot, dst);
  for (uint32_t k = 0; k < gr->count && !rc; k++) {
    eng_param *p = &e->params[e->by_group[gr->first + k]];
    ferry_optim_span *sp = &e->spans[k];
    memset(sp, 0, sizeof *sp);
    ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_MASTER], ot, (void **)&sp->param);
    ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_GRAD], gt, (void **)&sp->grad);
    if (p->id[FERRY_ROLE_EXP_AVG] != UINT32_MAX)
      ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_EXP_AVG], ot, &sp->state1);
    if (p->id[FERRY_ROLE_EXP_AVG_SQ] != UINT32_MAX)
      ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_EXP_AVG_SQ], ot, &sp->state2);
    sp->param_copy = dst[k];
    sp->n = p->n;
    sp->grad_dtype = FERRY_OPTIM_DT_F32;
    sp->copy_dtype = e->dtype;
  }
  double t2 = ferry_now();
  /* every group's update uses the same step number for its bias correction */
  if (!rc) rc = ferry_optimizer_set_step(e->opt, e->steps);
  if (!rc) rc = ferry_optimizer_step(e->opt, e->spans, gr->count, gscale);
  if (rc && rc != FERRY_ENOMEM) rc = ferry_err(&e->err, rc, "step: optimizer: %s", ferry_optimizer_last_error(e->opt));
  double t3 = ferry_now();
  ferry_timeline_add(&e->tl, FERRY_LANE_OPTIM0, "optimizer", t2, t3);
  if (!rc) rc = zero_group_grads(e, i, 1);
  ferry_mem_release(e->mem, i, FERRY_FAMILY_GRADS, gt, NULL);
  if (!rc) rc = ferry_mem_mark_dirty(e->mem, i, FERRY_FAMILY_OPTIM, ot, NULL);
  if (!rc && e->optim_home == FERRY_TIER_NVME) /* write i back while i+1 computes */
    rc = ferry_mem_writeback(e->mem, i, FERRY_FAMILY_OPTIM, ot);
  if (rc && rc != FERRY_OK) rc = mem_err(e, rc, "step: optimizer state write-back");
  ferry_mem_release(e->mem, i, FERRY_FAMILY_OPTIM, ot, NULL);
  if (!rc) rc = param_commit(e, i, slot);
  return rc;
}

int engine_wait_step(ferry_engine *e) {
  pthread_mutex_lock(&e->mu);
  while (e->step_request) pthread_cond_wait(&e->cv_step, &e->mu);
  int rc = e->step_status;
  e->step_status = 0;
  pthread_mutex_unlock(&e->mu);
  return rc;
}

int engine_wait_step_group(ferry_engine *e, uint32_t g) {
  pthread_mutex_lock(&e->mu);
  while (e->step_request && e->step_done <= g && !e->step_status)
    pthread_cond_wait(&e->cv_step, &e->mu);
  int rc = e->step_status;
  pthread_mutex_unlock(&e->mu);
  return rc;
}

/* The stepper thread: updates groups 0, 1, ... and says after each. */
void *engine_step_main(void *arg) {
  ferry_engine *e = arg;
  pthread_mutex_lock(&e->mu);
  for (;;) {
    while (!e->step_request && !e->stop) pthread_cond_wait(&e->cv_step, &e->mu);
    if (!e->step_request) break;
    float gscale = e->step_gscale;
    pthread_mutex_unlock(&e->mu);
    double t0 = ferry_now();
    int rc = FERRY_OK;
    for (uint32_t i = 0; i < e->ngroups && !rc; i++) {
      rc = step_group(e, i, gscale);
      pthread_mutex_lock(&e->mu);
      e->step_done = i + 1;
      pthread_cond_broadcast(&e->cv_step);
      pthread_mutex_unlock(&e->mu);
    }
    ferry_timeline_add(&e->tl, FERRY_LANE_STEP, "optimizer step", t0, ferry_now());
    pthread_mutex_lock(&e->mu);
    if (rc) e->step_status = rc;
    else e->steps++;
    e->step_request = 0;
    pthread_cond_broadcast(&e->cv_step);
  }
  pthread_mutex_unlock(&e->mu);
  return NULL;
}

int engine_step(ferry_engine *e, ferry_step_info *info) {
  double t0 = ferry_now();
  int rc = engine_wait_step(e); /* one step at a time */
  if (rc) return rc;
  rc = engine_wait_drain(e);
  if (rc) return ferry_err(&e->err, rc, "step: the gradient drain failed: %s", ferry_err_msg(&e->err));
  if (e->micro != e->cv->grad_accumulation || e->drained_in_micro != 0)
    return ferry_err(&e->err, FERRY_ESTATE,
                     "step: grad_accumulation = %lld, but %d micro-batches (and %u groups of "
                     "another) have handed in their grads",
                     (long long)e->cv->grad_accumulation, e->micro, e->drained_in_micro);
  if (e->tracing) { /* the first step's fetch order is the trace from now on */
    ferry_mem_trace_record(e->mem, 0);
    e->tracing = 0;
  }
  double sumsq = 0;
  int nonfinite = 0;
  for (uint32_t g = 0; g < e->ngroups; g++) { /* fixed order: deterministic */
    sumsq += e->groups[g].sumsq;
    nonfinite |= e->groups[g].nonfinite || !isfinite(e->groups[g].sumsq);
  }
  float scale = ferry_loss_scale(e);
  int skip = e->dynamic_scale ? ferry_loss_scaler_update(&e->scaler, nonfinite) : nonfinite;
  if (nonfinite && !e->dynamic_scale)
    ferry_logf(&e->log, FERRY_LOG_WARN, "step %lld: inf or NaN in the gradients; step skipped",
               (long long)e->steps);
  float clip = 1.0f;
  if (e->cv->clip_grad_norm > 0 && !nonfinite)
    clip = ferry_clip_coef(sumsq, scale, (float)e->cv->clip_grad_norm);
  pthread_mutex_lock(&e->mu);
  e->micro = 0;
  e->drained_in_micro = 0;
  pthread_mutex_unlock(&e->mu);
  int64_t next_step = e->steps + (skip ? 0 : 1); /* read before the stepper may bump it */
  e->fetches = 0;
  if (skip) {
    for (uint32_t i = 0; i < e->ngroups && !rc; i++) rc = zero_group_grads(e, i, 0);
    if (rc) return rc;
  } else {
    pthread_mutex_lock(&e->mu);
    e->step_gscale = clip / scale;
    e->step_done = 0;
    e->step_request = 1;
    pthread_cond_broadcast(&e->cv_step);
    pthread_mutex_unlock(&e->mu);
  }
  double t1 = ferry_now();
  ferry_timeline_add(&e->tl, FERRY_LANE_STEP, "ferry_step", t0, t1);
  if (info) {
    info->step = next_step;
    info->skipped = skip;
    info->grad_norm = sqrt(sumsq) / scale;
    info->loss_scale = ferry_loss_scale(e);
    info->clip_coef = clip;
    info->seconds = t1 - t0;
  }
  return FERRY_OK;
}
