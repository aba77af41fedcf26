/* offload/drain.c — the gradient drain: the device grad buffers the loop's
 * backward writes into, and the drain thread, which waits for a group's
 * grads, copies them D2H, accumulates them into the fp32 host grads (scaled
 * by 1/grad_accumulation) and, on the last micro-batch, adds their squared
 * norm and inf/NaN flag — while backward goes on. With eager updates it
 * hands each group whose grads are final to the stepper. Uses stepper.c
 * and group.c.
 */
#include "offload/engine_impl.h"

#include <stdlib.h>

static void *drain_main(void *arg);

int drain_init(ferry_engine *e, size_t gbytes) {
  eng_drain *d = &e->drain;
  d->qcap = e->gt.ngroups * 2 + 4;
  d->queue = calloc(d->qcap, sizeof *d->queue);
  if (!d->queue) return ferry_err(&e->err, FERRY_ENOMEM, "finalize: out of memory");
  int rc = FERRY_OK;
  for (int i = 0; i < ENGINE_GRAD_SLOTS && !rc; i++) {
    rc = ferry_device_alloc(e->dev, gbytes, &d->slot[i].dev);
    if (!rc) rc = ferry_event_create(e->dev, &d->slot[i].ready);
  }
  if (!rc) rc = ferry_host_alloc(e->dev, gbytes, &d->stage);
  if (rc)
    return ferry_err(&e->err, rc, "finalize: engine buffers: %s", ferry_device_last_error(e->dev));
  return FERRY_OK;
}

/* Its own one-thread optimizer (accumulation and stats), since the drain
 * runs while the step may be running. */
int drain_init_optimizer(ferry_engine *e, const ferry_optimizer_config *oc) {
  ferry_optimizer_config gc = *oc;
  gc.threads = 1;
  gc.bind = 0;
  int rc = ferry_optimizer_create(&gc, &e->drain.opt);
  if (rc) return ferry_err(&e->err, rc, "finalize: optimizer: %s", ferry_last_error());
  return FERRY_OK;
}

int drain_start(ferry_engine *e) {
  if (pthread_create(&e->drain.thread, NULL, drain_main, e))
    return ferry_err(&e->err, FERRY_ENOMEM, "finalize: cannot start the drain thread");
  e->drain.started = 1;
  return FERRY_OK;
}

/* Lets the drain finish what was handed to it, then stops it. */
void drain_stop(ferry_engine *e) {
  pthread_mutex_lock(&e->mu);
  e->drain.stop = 1;
  pthread_cond_broadcast(&e->drain.cv_work);
  pthread_mutex_unlock(&e->mu);
  if (e->drain.started) pthread_join(e->drain.thread, NULL);
  e->drain.started = 0;
}

void drain_free(ferry_engine *e) {
  eng_drain *d = &e->drain;
  ferry_optimizer_destroy(d->opt);
  if (e->dev) {
    for (int i = 0; i < ENGINE_GRAD_SLOTS; i++) {
      ferry_device_free(e->dev, d->slot[i].dev);
      ferry_event_destroy(d->slot[i].ready);
    }
    ferry_host_free(e->dev, d->stage);
  }
  free(d->queue);
}

int drain_take_slot(ferry_engine *e, uint32_t g, int *slot) {
  eng_drain *d = &e->drain;
  pthread_mutex_lock(&e->mu);
  int got = -1;
  for (;;) {
    for (int i = 0; i < ENGINE_GRAD_SLOTS && got < 0; i++)
      if (d->slot[i].owner < 0) got = i;
    if (got >= 0 || d->status) break;
    pthread_cond_wait(&d->cv_slot, &e->mu);
  }
  if (got >= 0) d->slot[got].owner = (int)g;
  int ds = d->status;
  pthread_mutex_unlock(&e->mu);
  *slot = got;
  return got < 0 ? ds : FERRY_OK;
}

void drain_submit(ferry_engine *e, uint32_t g) {
  eng_drain *d = &e->drain;
  pthread_mutex_lock(&e->mu);
  d->queue[d->qtail++ % d->qcap] = g;
  pthread_cond_signal(&d->cv_work);
  pthread_mutex_unlock(&e->mu);
}

/* Copies group g's grads D2H into the staging buffer and frees its device
 * buffer. */
static int download(ferry_engine *e, uint32_t g) {
  eng_drain *d = &e->drain;
  int slot = -1;
  pthread_mutex_lock(&e->mu);
  for (int i = 0; i < ENGINE_GRAD_SLOTS; i++)
    if (d->slot[i].owner == (int)g) slot = i;
  pthread_mutex_unlock(&e->mu);
  FERRY_ASSERT(slot >= 0, "drain: group %u has no gradient buffer", g);
  int rc = ferry_event_synchronize(d->slot[slot].ready);
  double t1 = ferry_now();
  if (!rc)
    rc = ferry_memcpy_async(e->down, d->stage, d->slot[slot].dev, e->gt.groups[g].n * e->esize,
                            FERRY_COPY_D2H);
  if (!rc) rc = ferry_stream_synchronize(e->down);
  ferry_timeline_add(&e->tl, FERRY_LANE_D2H, "grads D2H", t1, ferry_now());
  pthread_mutex_lock(&e->mu);
  d->slot[slot].owner = -1;
  pthread_cond_broadcast(&d->cv_slot);
  pthread_mutex_unlock(&e->mu);
  if (rc) return ferry_err(&e->err, rc, "drain: %s", ferry_device_last_error(e->dev));
  return FERRY_OK;
}

static int drain_one(ferry_engine *e, uint32_t g) {
  eng_group *gr = &e->gt.groups[g];
  eng_drain *d = &e->drain;
  int rc = download(e, g);
  if (rc) return rc;
  double t2 = ferry_now();
  ferry_tier gt = work_tier(e->grad_home);
  rc = ferry_mem_fetch(e->mem, g, FERRY_FAMILY_GRADS, gt, NULL, 0);
  if (rc) return engine_mem_err(e, rc, "drain: grads");
  float scale = 1.0f / (float)e->cv->grad_accumulation;
  int last = d->micro + 1 >= e->cv->grad_accumulation;
  double sumsq = 0;
  int nonfinite = 0;
  for (uint32_t k = 0; k < gr->count && !rc; k++) {
    eng_param *p = group_param(e, g, k);
    float *acc;
    ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_GRAD], gt, (void **)&acc);
    ferry_grad_span gs = {(char *)d->stage + p->goff * e->esize, p->n, e->dtype};
    rc = ferry_optimizer_grad_accumulate(d->opt, acc, &gs, scale);
    if (!rc && last) {
      ferry_grad_span as = {acc, p->n, FERRY_DT_F32};
      double s = 0;
      int nf = 0;
      rc = ferry_optimizer_grad_stats(d->opt, &as, 1, &s, &nf);
      sumsq += s;
      nonfinite |= nf;
    }
  }
  ferry_mem_release(e->mem, g, FERRY_FAMILY_GRADS, gt, NULL);
  ferry_timeline_add(&e->tl, FERRY_LANE_OPTIM0, "accumulate", t2, ferry_now());
  if (rc) return ferry_err(&e->err, rc, "drain: %s", ferry_optimizer_last_error(d->opt));
  gr->sumsq = sumsq;
  gr->nonfinite = nonfinite;
  if (last && e->eager) { /* its grads are final: update it now, during backward */
    pthread_mutex_lock(&e->mu);
    e->stepper.gscale = 1.0f / e->fixed_scale;
    stepper_queue(e, g);
    pthread_mutex_unlock(&e->mu);
  }
  return FERRY_OK;
}

static void *drain_main(void *arg) {
  ferry_engine *e = arg;
  eng_drain *d = &e->drain;
  pthread_mutex_lock(&e->mu);
  for (;;) {
    while (d->qhead == d->qtail && !d->stop) pthread_cond_wait(&d->cv_work, &e->mu);
    if (d->qhead == d->qtail) break;
    uint32_t g = d->queue[d->qhead % d->qcap];
    d->busy = 1;
    int failed = d->status;
    pthread_mutex_unlock(&e->mu);
    int rc = failed ? FERRY_OK : drain_one(e, g);
    pthread_mutex_lock(&e->mu);
    d->qhead++;
    d->busy = 0;
    if (rc && !d->status) d->status = rc;
    if (++d->in_micro == e->gt.ngroups) {
      d->in_micro = 0;
      d->micro++;
    }
    if (d->qhead == d->qtail) pthread_cond_broadcast(&d->cv_idle);
    pthread_cond_broadcast(&d->cv_slot);
  }
  pthread_mutex_unlock(&e->mu);
  return NULL;
}

int drain_wait(ferry_engine *e) {
  eng_drain *d = &e->drain;
  pthread_mutex_lock(&e->mu);
  while (d->qhead != d->qtail || d->busy) pthread_cond_wait(&d->cv_idle, &e->mu);
  int rc = d->status;
  pthread_mutex_unlock(&e->mu);
  return rc;
}

void drain_progress(ferry_engine *e, int *micro, uint32_t *in_micro) {
  pthread_mutex_lock(&e->mu);
  *micro = e->drain.micro;
  *in_micro = e->drain.in_micro;
  pthread_mutex_unlock(&e->mu);
}

void drain_reset_micro(ferry_engine *e) {
  pthread_mutex_lock(&e->mu);
  e->drain.micro = 0;
  e->drain.in_micro = 0;
  pthread_mutex_unlock(&e->mu);
}
