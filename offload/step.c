/* offload/step.c — the ferry_step driver: once the drain has every group's
 * grads, the global norm (clip coefficient) and the inf/NaN flag (fp16:
 * skip the step and back the scale off), then the updates queued to the
 * stepper in forward order, so the step runs during the next forward. With
 * eager updates (no clipping, no fp16 scaling) the drain has queued them
 * already and the driver only closes the step. Also ferry_zero_grads and
 * ferry_loss_scale. Uses ranks.c, drain.c, stepper.c and group.c.
 */
#include "offload/engine_impl.h"

#include <math.h>
#include <string.h>

float ferry_loss_scale(const ferry_engine *e) {
  if (!e) return 1;
  return e->dynamic_scale ? e->scaler.scale : e->fixed_scale;
}

int ferry_zero_grads(ferry_engine *e) {
  if (!e) return FERRY_EINVAL;
  if (!e->finalized) return ferry_err(&e->err, FERRY_ESTATE, "zero grads: not finalized");
  /* the drain first: an update it queues (updates during backward) is
   * waited for too, so none runs beside the zeroing or after it returns */
  int rc = drain_wait(e), r2 = stepper_wait_all(e);
  /* none is queued or running: a staging mark left waits for no update */
  pthread_mutex_lock(&e->mu);
  marks_clear_all(e);
  pthread_mutex_unlock(&e->mu);
  if (r2) return r2; /* the stepper's first, as before: the drain's stays */
  if (rc) return rc;
  for (uint32_t g = 0; g < e->gt.ngroups; g++) {
    rc = group_zero_grads(e, g, 0);
    if (rc) return rc;
    drain_clear_norm(e, g);
  }
  /* the discarded micro-batches' marks go with their grads */
  for (size_t i = 0; i < e->gt.nparams; i++) e->gt.params[i].no_grad = e->gt.params[i].got_grad = 0;
  drain_reset_micro(e);
  return FERRY_OK;
}

/* The first step's fetch order is the trace from now on. */
static void end_tracing(ferry_engine *e) {
  if (!e->tracing) return;
  if (e->ntrace && ferry_mem_trace_set(e->mem, e->trace, e->trace_fam, e->ntrace))
    ferry_logf(&e->log, FERRY_LOG_WARN, "step: no access trace (%s): prefetch is off",
               ferry_mem_last_error(e->mem));
  e->tracing = 0;
}

/* The info of a step that only re-ran failed updates of the last one. */
static void retry_info(ferry_engine *e, ferry_step_info *info, double t0) {
  if (!info) return;
  memset(info, 0, sizeof *info);
  info->step = e->steps;
  info->loss_scale = ferry_loss_scale(e);
  info->clip_coef = 1;
  info->seconds = ferry_now() - t0;
}

/* Every micro-batch of this step has handed in its grads, and they are
 * accumulated. */
static int check_drained(ferry_engine *e) {
  int rc = drain_wait(e);
  if (rc)
    return ferry_err(&e->err, rc, "step: the gradient drain failed: %s", ferry_err_msg(&e->err));
  int micro;
  uint32_t part;
  drain_progress(e, &micro, &part);
  if (micro != e->cv->grad_accumulation || part != 0)
    return ferry_err(&e->err, FERRY_ESTATE,
                     "step: grad_accumulation = %lld, but %d micro-batches (and %u groups of "
                     "another) have handed in their grads",
                     (long long)e->cv->grad_accumulation, micro, part);
  return FERRY_OK;
}

/* Eager: every group's update is queued or done already; wait for the
 * last and count the step. */
static int close_eager(ferry_engine *e, int nonfinite) {
  int rc = stepper_wait_all(e);
  if (rc) return rc;
  if (nonfinite)
    ferry_logf(&e->log, FERRY_LOG_WARN,
               "step %lld: inf or NaN in the gradients (applied: the update runs during "
               "backward; set clip_grad_norm or fp16 loss scaling to have such steps skipped)",
               (long long)e->steps);
  pthread_mutex_lock(&e->mu);
  e->steps++;
  pthread_mutex_unlock(&e->mu);
  return FERRY_OK;
}

int ferry_step(ferry_engine *e, ferry_step_info *info) {
  if (!e) return FERRY_EINVAL;
  if (!e->finalized) return ferry_err(&e->err, FERRY_ESTATE, "step: not finalized");
  if (e->steps >= FERRY_STEP_MAX)
    return ferry_err(&e->err, FERRY_EOVERFLOW,
                     "step: %lld steps are taken, the most a step count holds (FERRY_STEP_MAX)",
                     (long long)e->steps);
  double t0 = ferry_now();
  int rc = ranks_drop_ahead(e);      /* stage 3: a read-ahead the loop left: its params change */
  if (!rc) rc = stepper_wait_all(e); /* one step at a time */
  if (rc) return rc;
  /* Updates that failed (an I/O error, a CRC mismatch) changed nothing and
   * kept their grads: run them again, with the same scale and step number. */
  if (stepper_retry_failed(e)) {
    rc = stepper_wait_all(e);
    if (rc) return rc;
    if (!e->eager) { /* that completes the last step; eager: this one goes on */
      retry_info(e, info, t0);
      return FERRY_OK;
    }
  }
  rc = check_drained(e);
  if (rc) return rc;
  end_tracing(e);
  double sumsq;
  int nonfinite;
  drain_take_norm(e, &sumsq, &nonfinite); /* in group order: deterministic */
  rc = ranks_global_norm(e, &sumsq, &nonfinite); /* stages 1 and 2: every rank's range */
  if (rc) return rc;
  float scale = ferry_loss_scale(e);
  int skip = 0;
  int64_t next_step;
  float clip = 1.0f;
  if (e->eager) {
    rc = close_eager(e, nonfinite);
    if (rc) return rc;
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
  drain_reset_micro(e);
  e->fetches = 0;
  if (skip) {
    for (uint32_t i = 0; i < e->gt.ngroups && !rc; i++) {
      rc = group_zero_grads(e, i, 0);
      if (rc) return rc;
    }
  } else if (!e->eager) {
    pthread_mutex_lock(&e->mu);
    stepper_set_gscale(e, clip / scale);
    e->steps++;
    for (uint32_t i = 0; i < e->gt.ngroups; i++) stepper_queue(e, i, NULL);
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
