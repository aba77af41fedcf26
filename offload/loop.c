/* offload/loop.c — the loop's calls between create and destroy: fetch and
 * release with the trace-driven prefetch (stage 3: the ranks' gathers),
 * the device param and grad pointers, grads_ready, ferry_param_read, and
 * the quiesce/restore pair checkpoints use. Uses ranks.c, drain.c,
 * stepper.c, gpu.c and group.c; the engine's life is engine.c.
 */
#include "offload/engine_impl.h"
#include "core/dtype.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
  int busy = stepper_busy(e) || drain_busy(e);
  pthread_mutex_unlock(&e->mu);
  return busy;
}

/* A bf16 master, updated during backward (NVMe params, one rank's whole
 * groups): the stepper stages the params it updates from the host copy the
 * loop fetched, kept there for it from ferry_grads_ready. */
static int stage_marks(const ferry_engine *e) {
  return e->master_bf16 && e->eager && e->param_home == FERRY_TIER_NVME &&
         !engine_params_sharded(e);
}

/* ... and at the minimum host budget (no optimizer read-ahead), the loop
 * fetches a group only while at most one group waits to be staged, or the
 * threads have no work. Further ahead, the capped params could not hold
 * the kept groups beside the loop's fetch: one was evicted and read again,
 * and each read again slowed the stepper and evicted the next (the thin
 * Llama of cli.plan.family_bytes, bf16 master: +35-50% param reads in
 * some steps, run to run). */
static void wait_staged(ferry_engine *e) {
  if (!stage_marks(e) || e->optim_ahead) return;
  pthread_mutex_lock(&e->mu);
  while (marks_unstaged(e) > 1 && stepper_waits_for(e) < 0 &&
         (stepper_busy(e) || drain_busy(e)))
    stepper_wait_change_for(e, 0.01);
  pthread_mutex_unlock(&e->mu);
}

int ferry_fetch(ferry_engine *e, int group, ferry_stream *s) {
  if (!e) return FERRY_EINVAL;
  int rc = check_group(e, group, "fetch");
  if (rc) return rc;
  if (!s) return ferry_err(&e->err, FERRY_EINVAL, "fetch: stream is NULL");
  double t0 = ferry_now();
  rc = stepper_wait_group(e, (uint32_t)group); /* its update of the last step is done */
  if (rc) {
    char why[768];
    stepper_fail_why(e, why, sizeof why);
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
    wait_staged(e);
    rc =
        group_fetch(e, (uint32_t)group, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, s, 0, threads_busy);
    if (rc) return engine_mem_err(e, rc, "fetch");
    /* params uploaded by the last step (device home): ordered on e->up */
    rc = ferry_stream_wait_event(s, stepper_uploaded(e, (uint32_t)group));
    if (rc) return ferry_err(&e->err, rc, "fetch: %s", ferry_device_last_error(e->dev));
  }
  group_fetched(e, (uint32_t)group, 1);
  e->fetch[group].stream = s;
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
  group_fetched(e, (uint32_t)group, -1);
  pthread_mutex_lock(&e->mu);
  stepper_wake(e); /* an update may wait for the release */
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
    *param = (char *)ranks_params_dev(e, p->group) + p->goff * e->esize;
  } else if (param) {
    int rc = ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_PARAM], FERRY_TIER_DEVICE, param);
    if (rc) return engine_mem_err(e, rc, "param device");
  }
  if (grad) {
    eng_fetch *f = &e->fetch[p->group];
    if (f->grad_slot < 0) { /* take a device grad buffer, zeroed in stream order */
      int got;
      int rc = drain_may_submit(e, p->group, "param device");
      if (rc) return rc;
      rc = drain_take_slot(e, p->group, &got);
      if (rc == FERRY_ESTATE) return rc; /* the loop holds up the drain: said why */
      if (rc)
        return ferry_err(&e->err, rc, "param device: the gradient drain failed: %s",
                         ferry_err_msg(&e->err));
      f->grad_slot = got;
      rc = drain_slot_zero(e, got, f->stream, gr->n * e->esize, "param device");
      if (rc) return rc;
    }
    *grad = (char *)drain_slot_dev(e, f->grad_slot) + p->goff * e->esize;
  }
  return FERRY_OK;
}

int ferry_grads_ready(ferry_engine *e, int group, ferry_stream *s) {
  if (!e) return FERRY_EINVAL;
  int rc = check_group(e, group, "grads ready");
  if (rc) return rc;
  eng_fetch *f = &e->fetch[group];
  if (f->grad_slot < 0)
    return ferry_err(&e->err, FERRY_ESTATE,
                     "grads ready: group %d has no gradient buffer (ask ferry_param_device for "
                     "its grad pointers after fetching it)",
                     group);
  rc = drain_may_submit(e, (uint32_t)group, "grads ready");
  if (rc) return rc;
  rc = drain_slot_ready(e, f->grad_slot, s, "grads ready");
  if (rc) return rc;
  group_note_grads(e, (uint32_t)group); /* before the drain (and an eager update) sees them */
  /* A bf16 master stages the params it updates from their host copy, held
   * here now: kept until then (the last victim), else the loop's next
   * fetches may evict it first and the update reads it again from NVMe.
   * Only on the step's last micro-batch: an earlier one's grads queue no
   * update, and its marks kept every fetch until then waiting for the
   * drain (wait_staged) */
  int marks = stage_marks(e);
  if (marks) {
    pthread_mutex_lock(&e->mu);
    marks = drain_submits_last(e);
    pthread_mutex_unlock(&e->mu);
  }
  if (marks) {
    (void)ferry_mem_prefetch(e->mem, (uint32_t)group, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST);
    pthread_mutex_lock(&e->mu);
    marks_set(e, (uint32_t)group);
    pthread_mutex_unlock(&e->mu);
  }
  drain_submit(e, (uint32_t)group, f->grad_slot); /* the drain owns it now */
  f->grad_slot = -1;
  return FERRY_OK;
}

int ferry_param_no_grad(ferry_engine *e, const char *name) {
  if (!e) return FERRY_EINVAL;
  if (!e->finalized) return ferry_err(&e->err, FERRY_ESTATE, "param no grad: not finalized");
  eng_param *p = name ? group_find(e, name) : NULL;
  if (!p)
    return ferry_err(&e->err, FERRY_ENOENT, "param no grad: no parameter '%s'",
                     name ? name : "(null)");
  if (e->nranks > 1 && e->cv->missing_grad == FERRY_MISSING_GRAD_SKIP)
    return ferry_err(&e->err, FERRY_ENOTSUP,
                     "param no grad '%s': with ranks every param is stepped (the ranks' grads "
                     "are averaged); set optimizer.missing_grad = \"zero\"",
                     p->name);
  p->no_grad = 1;
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
  pthread_mutex_unlock(&e->mu);
  stepper_fail_why(e, text, sizeof text);
  if (!text[0]) snprintf(text, sizeof text, "%s", ferry_strerror(why));
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
  for (size_t i = 0; i < e->gt.nparams; i++) {
    e->gt.params[i].steps = p->steps;
    e->gt.params[i].no_grad = e->gt.params[i].got_grad = 0;
  }
  pthread_mutex_unlock(&e->mu);
  ferry_optimizer_set_step(e->opt, p->steps);
  if (e->dynamic_scale) {
    e->scaler.scale = p->scale;
    e->scaler.good_steps = p->good_steps;
    e->scaler.skipped = p->skipped;
  }
}

