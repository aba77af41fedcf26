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
#include <time.h>

static int work_tier(int home) { return home == FERRY_TIER_NVME ? FERRY_TIER_HOST : home; }

static int mem_err(ferry_engine *e, int rc, const char *what) {
  return ferry_err(&e->err, rc, "%s: %s", what, ferry_mem_last_error(e->mem));
}

/* Where the optimizer writes group g's new params: a pinned staging buffer,
 * uploaded by param_commit (device home), or the param staging buffer,
 * copied into the host copy when the group commits (host and NVMe homes:
 * the memory manager wants a host copy marked dirty before it is written,
 * which drops device copies, which must not be held then). */
static int param_prepare(ferry_engine *e, uint32_t g, int slot, void **dst) {
  eng_group *gr = &e->groups[g];
  if (e->param_home == FERRY_TIER_DEVICE) {
    int rc = ferry_event_synchronize(e->stage_up_ev[slot]); /* its last upload is done */
    if (rc) return ferry_err(&e->err, rc, "step: %s", ferry_device_last_error(e->dev));
    for (uint32_t k = 0; k < gr->count; k++)
      dst[k] = (char *)e->stage_up[slot] + e->params[e->by_group[gr->first + k]].goff * e->esize;
    return FERRY_OK;
  }
  for (uint32_t k = 0; k < gr->count; k++)
    dst[k] = (char *)e->param_stage + e->params[e->by_group[gr->first + k]].goff * e->esize;
  return FERRY_OK;
}

/* Device home: upload group g's staged params into its device copy. */
static int param_commit(ferry_engine *e, uint32_t g, int slot) {
  eng_group *gr = &e->groups[g];
  int rc = FERRY_OK;
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

/* Host and NVMe homes: group g, none of it held by the loop: mark the host
 * copy dirty (dropping device copies), copy the staged params in, and write
 * an NVMe home back. */
static int commit_group(ferry_engine *e, uint32_t g) {
  int rc = FERRY_OK;
  int nvme = e->param_home == FERRY_TIER_NVME;
  eng_group *gr = &e->groups[g];
  if (nvme) {
    rc = ferry_mem_fetch(e->mem, g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL, 0);
    if (rc) return mem_err(e, rc, "step: params");
  }
  /* Loads of these params the loop waited for (its kernels ran after them)
   * may not be noticed yet: complete them, so their holds are dropped. */
  ferry_mem_poll(e->mem);
  rc = ferry_mem_mark_dirty(e->mem, g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL);
  /* The loop holds none of the group (after_update waited), so a device
   * copy still held is a load in flight (a prefetch from NVMe through the
   * host holds its chunk until the H2D is issued and seen complete): wait
   * for it (it is dropped as stale once it lands), at most about 10 s. */
  for (int tries = 0; rc == FERRY_EBUSY && tries < 100000; tries++) {
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
    ferry_mem_poll(e->mem);
    rc = ferry_mem_mark_dirty(e->mem, g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL);
  }
  for (uint32_t k = 0; k < gr->count && !rc; k++) {
    eng_param *p = &e->params[e->by_group[gr->first + k]];
    void *h;
    rc = ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_PARAM], FERRY_TIER_HOST, &h);
    if (!rc)
      memcpy(h, (char *)e->param_stage + p->goff * e->esize, p->n * e->esize);
  }
  if (nvme) {
    int r2 = ferry_mem_release(e->mem, g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL);
    if (!rc) rc = r2;
    if (!rc) rc = ferry_mem_writeback(e->mem, g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST);
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
  return e->param_home == FERRY_TIER_DEVICE ? param_commit(e, g, slot) : commit_group(e, g);
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
  return held ? FERRY_OK : ferry_mem_release(e->mem, g, FERRY_FAMILY_GRADS, gt, NULL);
}

/* Updates group i; `next` (UINT32_MAX: none) is the group expected after it,
 * whose optimizer state is prefetched meanwhile. */
static int step_group(ferry_engine *e, uint32_t i, uint32_t next, float gscale) {
  eng_group *gr = &e->groups[i];
  int ot = work_tier(e->optim_home), gt = work_tier(e->grad_home);
  double t0 = ferry_now();
  int rc = ferry_mem_fetch(e->mem, i, FERRY_FAMILY_OPTIM, ot, NULL, 0);
  if (rc) return mem_err(e, rc, "step: optimizer state");
  double t1 = ferry_now();
  if (t1 - t0 > 1e-4) ferry_timeline_add(&e->tl, FERRY_LANE_STEP, "wait for state", t0, t1);
  if (next != UINT32_MAX) /* the read of the next group overlaps this group's update */
    (void)ferry_mem_prefetch(e->mem, next, FERRY_FAMILY_OPTIM, ot);
  rc = ferry_mem_fetch(e->mem, i, FERRY_FAMILY_GRADS, gt, NULL, 0);
  if (rc) {
    ferry_mem_release(e->mem, i, FERRY_FAMILY_OPTIM, ot, NULL);
    return mem_err(e, rc, "step: grads");
  }
  int slot = (int)(i % ENGINE_STAGE_SLOTS);
  void **dst = e->dsts;
  rc = ferry_mem_mark_dirty(e->mem, i, FERRY_FAMILY_OPTIM, ot, NULL); /* before writing */
  if (rc) rc = mem_err(e, rc, "step: optimizer state");
  if (!rc) rc = param_prepare(e, i, slot, dst);
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
  if (!rc) rc = ferry_optimizer_set_step(e->opt, e->cur_step);
  if (!rc) rc = ferry_optimizer_step(e->opt, e->spans, gr->count, gscale);
  if (rc && rc != FERRY_ENOMEM) rc = ferry_err(&e->err, rc, "step: optimizer: %s", ferry_optimizer_last_error(e->opt));
  double t3 = ferry_now();
  ferry_timeline_add(&e->tl, FERRY_LANE_OPTIM0, "optimizer", t2, t3);
  if (!rc) rc = zero_group_grads(e, i, 1);
  ferry_mem_release(e->mem, i, FERRY_FAMILY_GRADS, gt, NULL);
  ferry_mem_release(e->mem, i, FERRY_FAMILY_OPTIM, ot, NULL);
  /* write i back while the next group computes (held copies are never
   * written back, so after the release) */
  if (!rc && e->optim_home == FERRY_TIER_NVME) {
    /* the update is done: a write that cannot start leaves the state dirty
     * on the host, written again at eviction or flush (which report it) */
    int wrc = ferry_mem_writeback(e->mem, i, FERRY_FAMILY_OPTIM, ot);
    if (wrc)
      ferry_logf(&e->log, FERRY_LOG_WARN, "step: write-back of group %u: %s", i,
                 ferry_mem_last_error(e->mem));
  }
  /* a device home is written in place (only this group's bytes): upload now */
  if (!rc && e->param_home == FERRY_TIER_DEVICE) rc = param_commit(e, i, slot);
  return rc;
}

/* Ends group g's update (e->mu held) when it is queued and done (updated
 * or failed). */
static void finish_group(ferry_engine *e, uint32_t g) {
  eng_group *gr = &e->groups[g];
  if (gr->step_queued && (gr->updated || gr->failed)) {
    gr->step_queued = 0;
    gr->updated = 0;
    e->step_pending--;
  }
  pthread_cond_broadcast(&e->cv_step);
}

/* After group g's update. Host and NVMe homes: the new params are copied
 * into the group's own chunks (no chunk holds two groups) once the loop
 * holds none of them, which drops the stale device copy; the group's
 * fetches wait until then (step_queued). */
static int after_update(ferry_engine *e, uint32_t g, int rc) {
  eng_group *gr = &e->groups[g];
  pthread_mutex_lock(&e->mu);
  if (rc) { /* step_group fails only before it changes anything */
    gr->failed = rc;
    if (!e->step_status) e->step_status = rc;
  }
  if (!rc) gr->updated = 1;
  if (e->param_home == FERRY_TIER_DEVICE) {
    finish_group(e, g);
    pthread_mutex_unlock(&e->mu);
    return rc;
  }
  while (gr->fetched && !e->stop) pthread_cond_wait(&e->cv_step, &e->mu);
  int updated = gr->updated;
  pthread_mutex_unlock(&e->mu);
  int crc = updated ? commit_group(e, g) : FERRY_OK; /* a failed group keeps its old params */
  pthread_mutex_lock(&e->mu);
  if (crc && !e->step_status) e->step_status = crc;
  finish_group(e, g);
  pthread_mutex_unlock(&e->mu);
  return crc ? crc : rc;
}

int engine_wait_step(ferry_engine *e) {
  pthread_mutex_lock(&e->mu);
  while (e->step_pending) pthread_cond_wait(&e->cv_step, &e->mu);
  int rc = e->step_status;
  e->step_status = 0;
  pthread_mutex_unlock(&e->mu);
  return rc;
}

int engine_wait_step_group(ferry_engine *e, uint32_t g) {
  pthread_mutex_lock(&e->mu);
  while (e->groups[g].step_queued) pthread_cond_wait(&e->cv_step, &e->mu);
  int rc = e->groups[g].failed;
  if (rc) e->step_status = 0; /* reported here: the next ferry_step retries */
  pthread_mutex_unlock(&e->mu);
  return rc;
}

void engine_queue_step(ferry_engine *e, uint32_t g) {
  FERRY_ASSERT(!e->groups[g].step_queued, "group %u queued for its update twice", g);
  e->groups[g].step_queued = 1;
  e->sq[e->sq_tail++ % e->ngroups] = g;
  e->step_pending++;
  pthread_cond_broadcast(&e->cv_step);
}

/* The stepper thread: updates queued groups in order and says after each. */
void *engine_step_main(void *arg) {
  ferry_engine *e = arg;
  pthread_mutex_lock(&e->mu);
  for (;;) {
    while (e->sq_head == e->sq_tail && !e->stop) pthread_cond_wait(&e->cv_step, &e->mu);
    if (e->sq_head == e->sq_tail) break;
    uint32_t g = e->sq[e->sq_head++ % e->ngroups];
    /* the next to prefetch: queued already, or (eager: backward order) g-1 */
    uint32_t next = e->sq_head != e->sq_tail ? e->sq[e->sq_head % e->ngroups]
                    : e->eager                ? (g > 0 ? g - 1 : UINT32_MAX)
                    : g + 1 < e->ngroups      ? g + 1
                                              : UINT32_MAX;
    float gscale = e->step_gscale;
    pthread_mutex_unlock(&e->mu);
    int rc = step_group(e, g, next, gscale); /* groups are independent: a failure stops none */
    after_update(e, g, rc);
    pthread_mutex_lock(&e->mu);
  }
  pthread_mutex_unlock(&e->mu);
  return NULL;
}

int engine_step(ferry_engine *e, ferry_step_info *info) {
  double t0 = ferry_now();
  int rc = engine_wait_step(e); /* one step at a time */
  if (rc) return rc;
  /* Updates that failed (an I/O error, a CRC mismatch) changed nothing and
   * kept their grads: run them again, with the same scale and step number. */
  int retried = 0;
  pthread_mutex_lock(&e->mu);
  for (uint32_t g = 0; g < e->ngroups; g++)
    if (e->groups[g].failed) {
      e->groups[g].failed = 0;
      engine_queue_step(e, g);
      retried = 1;
    }
  pthread_mutex_unlock(&e->mu);
  if (retried) {
    rc = engine_wait_step(e);
    if (rc) return rc;
    if (!e->eager) { /* that completes the last step; eager: this one goes on */
      if (info) {
        memset(info, 0, sizeof *info);
        info->step = e->steps;
        info->loss_scale = ferry_loss_scale(e);
        info->clip_coef = 1;
        info->seconds = ferry_now() - t0;
      }
      return FERRY_OK;
    }
  }
  rc = engine_wait_drain(e);
  if (rc) return ferry_err(&e->err, rc, "step: the gradient drain failed: %s", ferry_err_msg(&e->err));
  if (e->micro != e->cv->grad_accumulation || e->drained_in_micro != 0)
    return ferry_err(&e->err, FERRY_ESTATE,
                     "step: grad_accumulation = %lld, but %d micro-batches (and %u groups of "
                     "another) have handed in their grads",
                     (long long)e->cv->grad_accumulation, e->micro, e->drained_in_micro);
  if (e->tracing) { /* the first step's fetch order is the trace from now on */
    if (e->ntrace && ferry_mem_trace_set(e->mem, e->trace, e->trace_fam, e->ntrace))
      ferry_logf(&e->log, FERRY_LOG_WARN, "step: no access trace (%s): prefetch is off",
                 ferry_mem_last_error(e->mem));
    e->tracing = 0;
  }
  double sumsq = 0;
  int nonfinite = 0;
  for (uint32_t g = 0; g < e->ngroups; g++) { /* fixed order: deterministic */
    sumsq += e->groups[g].sumsq;
    nonfinite |= e->groups[g].nonfinite || !isfinite(e->groups[g].sumsq);
    e->groups[g].sumsq = 0;
    e->groups[g].nonfinite = 0;
  }
  float scale = ferry_loss_scale(e);
  int skip;
  int64_t next_step;
  float clip = 1.0f;
  if (e->eager) {
    /* every group's update is queued or done already: wait for the last */
    rc = engine_wait_step(e);
    if (rc) return rc;
    skip = 0;
    if (nonfinite)
      ferry_logf(&e->log, FERRY_LOG_WARN,
                 "step %lld: inf or NaN in the gradients (applied: the update runs during "
                 "backward; set clip_grad_norm or fp16 loss scaling to have such steps skipped)",
                 (long long)e->steps);
    pthread_mutex_lock(&e->mu);
    e->steps++;
    e->cur_step = e->steps;
    pthread_mutex_unlock(&e->mu);
    next_step = e->steps;
  } else {
    skip = e->dynamic_scale ? ferry_loss_scaler_update(&e->scaler, nonfinite) : nonfinite;
    if (nonfinite && !e->dynamic_scale)
      ferry_logf(&e->log, FERRY_LOG_WARN, "step %lld: inf or NaN in the gradients; step skipped",
                 (long long)e->steps);
    if (e->cv->clip_grad_norm > 0 && !nonfinite)
      clip = ferry_clip_coef(sumsq, scale, (float)e->cv->clip_grad_norm);
    next_step = e->steps + (skip ? 0 : 1);
  }
  pthread_mutex_lock(&e->mu);
  e->micro = 0;
  e->drained_in_micro = 0;
  pthread_mutex_unlock(&e->mu);
  e->fetches = 0;
  if (skip) {
    for (uint32_t i = 0; i < e->ngroups && !rc; i++) rc = zero_group_grads(e, i, 0);
    if (rc) return rc;
  } else if (!e->eager) {
    pthread_mutex_lock(&e->mu);
    e->step_gscale = clip / scale;
    e->cur_step = e->steps;
    e->steps++;
    for (uint32_t i = 0; i < e->ngroups; i++) engine_queue_step(e, i);
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
