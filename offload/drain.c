/* offload/drain.c — the gradient drain: the device grad buffers the loop's
 * backward writes into, and the drain thread, which copies a group's grads
 * D2H once they are ready, accumulates them into the group's accumulators
 * (fp32 or bf16, in the host or written behind to NVMe; scaled by
 * 1/grad_accumulation) and, on the last micro-batch, adds their squared
 * norm and inf/NaN flag — while backward goes on. The copies are
 * double-buffered: the D2H of the next group runs on the engine's D2H
 * stream while the CPU sums the one before from the other pinned buffer.
 * With eager updates it hands each group whose grads are final to the
 * stepper; with grads "none" the staging buffer that holds them goes with
 * it (drain-owned, lent), and comes back once the stepper no longer holds
 * it. Uses stepper.c, gpu.c and group.c.
 */
#include "offload/engine_impl.h"
#include "core/dtype.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void *drain_main(void *arg);
static int drain_init_reduce(ferry_engine *e);

void drain_create(ferry_engine *e) {
  eng_drain *d = &e->drain;
  pthread_cond_init(&d->cv_work, NULL);
  pthread_cond_init(&d->cv_idle, NULL);
  pthread_cond_init(&d->cv_slot, NULL);
  for (int i = 0; i < ENGINE_GRAD_SLOTS; i++) d->slot[i].owner = -1;
}

int drain_init(ferry_engine *e, size_t gbytes) {
  eng_drain *d = &e->drain;
  d->qcap = e->gt.ngroups * 2 + 4;
  d->queue = calloc(d->qcap, sizeof *d->queue);
  d->norm = calloc(e->gt.ngroups, sizeof *d->norm);
  d->handed = calloc(e->gt.ngroups, sizeof *d->handed);
  d->pass = 1;
  if (!d->queue || !d->norm || !d->handed) return ferry_err(&e->err, FERRY_ENOMEM, "finalize: out of memory");
  int rc = FERRY_OK;
  for (int i = 0; i < ENGINE_GRAD_SLOTS && !rc; i++) {
    rc = ferry_device_alloc(e->dev, gbytes, &d->slot[i].dev);
    if (!rc) rc = ferry_event_create(e->dev, &d->slot[i].ready);
    if (!rc) rc = ferry_event_create(e->dev, &d->slot[i].drained);
  }
  for (int i = 0; i < ENGINE_DRAIN_STAGES && !rc; i++) {
    if (engine_drain_staged(e)) rc = ferry_host_alloc(e->dev, gbytes, &d->stage[i].buf);
    if (!rc) rc = ferry_event_create(e->dev, &d->stage[i].done);
  }
  if (!rc && e->nranks > 1) rc = drain_init_reduce(e);
  if (rc)
    return ferry_err(&e->err, rc, "finalize: engine buffers: %s", ferry_device_last_error(e->dev));
  return FERRY_OK;
}

size_t drain_reduce_bytes(const ferry_engine *e, size_t *piece) {
  *piece = 0;
  if (e->nranks <= 1) return 0;
  if (e->zero_stage >= 1)
    for (uint32_t g = 0; g < e->gt.ngroups; g++) {
      size_t r = e->gt.groups[g].hi - e->gt.groups[g].lo;
      if (r * sizeof(float) > *piece) *piece = r * sizeof(float);
    }
  return e->gt.max_group_n * sizeof(float);
}

/* With ranks: the pinned fp32 buffers the drain's collectives use (the
 * sizes engine_own_bytes counts). */
static int drain_init_reduce(ferry_engine *e) {
  eng_drain *d = &e->drain;
  size_t piece, full = drain_reduce_bytes(e, &piece);
  d->counts = calloc((size_t)e->nranks, sizeof *d->counts);
  if (!d->counts) return FERRY_ENOMEM;
  int rc = ferry_host_alloc(e->dev, full, (void **)&d->reduce);
  if (!rc && piece) rc = ferry_host_alloc(e->dev, piece, (void **)&d->piece);
  return rc;
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
  stepper_abandon_releases(e); /* an update waiting for a release goes on */
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
      ferry_event_destroy(d->slot[i].drained);
    }
    for (int i = 0; i < ENGINE_DRAIN_STAGES; i++) {
      if (d->stage[i].buf) ferry_host_free(e->dev, d->stage[i].buf);
      ferry_event_destroy(d->stage[i].done);
    }
    if (d->reduce) ferry_host_free(e->dev, d->reduce);
    if (d->piece) ferry_host_free(e->dev, d->piece);
  }
  free(d->counts);
  free(d->queue);
  free(d->norm);
  free(d->handed);
  pthread_cond_destroy(&d->cv_work);
  pthread_cond_destroy(&d->cv_idle);
  pthread_cond_destroy(&d->cv_slot);
}

/* (mu held) grads "none": the group the loop holds whose release the
 * stepper waits for while the drain waits for a stage lent to the stepper
 * (a loop that would wait for a grad buffer now waits forever); -1 none. */
static int loop_blocks_drain(ferry_engine *e) {
  int64_t g = stepper_waits_for(e);
  if (!e->drain.stage_wait || g < 0 || !e->gt.groups[g].fetched) return -1;
  return (int)g;
}

int drain_take_slot(ferry_engine *e, uint32_t g, int *slot) {
  eng_drain *d = &e->drain;
  pthread_mutex_lock(&e->mu);
  int got = -1;
  int held = -1;
  for (;;) {
    /* round robin: the slot handed in longest ago, whose D2H (which its
     * zeroing waits for in stream order) is the likeliest done; the lowest
     * free index would often be the one handed in just before, and the
     * loop's stream would wait for that group's D2H */
    for (int k = 0; k < ENGINE_GRAD_SLOTS && got < 0; k++) {
      int i = (d->slot_next + k) % ENGINE_GRAD_SLOTS;
      if (d->slot[i].owner < 0) got = i;
    }
    if (got >= 0 || d->status || (held = loop_blocks_drain(e)) >= 0) break;
    pthread_cond_wait(&d->cv_slot, &e->mu);
  }
  if (got >= 0) {
    d->slot[got].owner = (int)g;
    d->slot_next = (got + 1) % ENGINE_GRAD_SLOTS;
  }
  int ds = d->status;
  pthread_mutex_unlock(&e->mu);
  *slot = got;
  if (held >= 0)
    return ferry_err(&e->err, FERRY_ESTATE,
                     "param device: group %u's grad buffer: group %d is still fetched after "
                     "its grads were handed in, and with placement.grads = \"none\" its "
                     "update (which waits for that release) holds the staging the drain "
                     "needs; release a group after ferry_grads_ready",
                     g, held);
  return got < 0 ? ds : FERRY_OK;
}

int drain_submits_last(const ferry_engine *e) {
  return e->drain.sub_micro + 1 >= e->cv->grad_accumulation;
}

void drain_submit(ferry_engine *e, uint32_t g, int slot) {
  eng_drain *d = &e->drain;
  pthread_mutex_lock(&e->mu);
  int last = drain_submits_last(e);
  d->queue[d->qtail++ % d->qcap] = (eng_drain_item){g, slot, last};
  d->handed[g] = d->pass;
  if (++d->sub_in_micro == e->gt.ngroups) {
    d->sub_in_micro = 0;
    d->sub_micro++;
    d->pass++;
  }
  pthread_cond_signal(&d->cv_work);
  pthread_mutex_unlock(&e->mu);
}

int drain_may_submit(ferry_engine *e, uint32_t g, const char *op) {
  eng_drain *d = &e->drain;
  pthread_mutex_lock(&e->mu);
  int all = d->sub_micro >= e->cv->grad_accumulation;
  int again = d->handed[g] == d->pass;
  pthread_mutex_unlock(&e->mu);
  if (all) /* one more would queue the updates a second time */
    return ferry_err(&e->err, FERRY_ESTATE,
                     "%s: group %u: the step's %lld micro-batch(es) have handed in their grads "
                     "(grad_accumulation); call ferry_step before the next backward",
                     op, g, (long long)e->cv->grad_accumulation);
  if (again)
    return ferry_err(&e->err, FERRY_ESTATE,
                     "%s: group %u's grads are handed in already in this micro-batch; the "
                     "other groups' come first",
                     op, g);
  return FERRY_OK;
}

/* Stream-order stamps of a D2H's begin and end (host functions: they call
 * nothing but the clock). */
static int stamp_begin(void *arg) {
  ((eng_drain_stage *)arg)->t0 = ferry_now();
  return 0;
}
static int stamp_end(void *arg) {
  ((eng_drain_stage *)arg)->t1 = ferry_now();
  return 0;
}

/* Enqueues on e->down, after the loop's grads_ready event, the work on one
 * group's grads in its device buffer (stage st, index `si`): their copy
 * into the staging buffer, or with device math the kernels that sum them
 * into the device grads; the stage's `done` and the slot's `drained`
 * events follow. */
static int enqueue_d2h(ferry_engine *e, const eng_drain_item *it, int si) {
  eng_grad_slot *sl = &e->drain.slot[it->slot];
  eng_drain_stage *st = &e->drain.stage[si];
  int rc = ferry_stream_wait_event(e->down, sl->ready);
  if (!rc) rc = ferry_launch_host_func(e->down, stamp_begin, st);
  if (!rc && e->drain.d2h_delay > 0) rc = ferry_stream_sleep(e->down, e->drain.d2h_delay);
  if (rc) return ferry_err(&e->err, rc, "drain: %s", ferry_device_last_error(e->dev));
  if (engine_gpu_math(e)) {
    rc = gpu_drain_enqueue(e, it->group, sl->dev, si, it->last);
    if (rc) return rc;
  } else {
    rc = ferry_memcpy_async(e->down, st->buf, sl->dev, e->gt.groups[it->group].n * e->esize,
                            FERRY_COPY_D2H);
  }
  if (!rc) rc = ferry_launch_host_func(e->down, stamp_end, st);
  if (!rc) rc = ferry_event_record(st->done, e->down);
  if (!rc) rc = ferry_event_record(sl->drained, e->down);
  if (rc) return ferry_err(&e->err, rc, "drain: %s", ferry_device_last_error(e->dev));
  return FERRY_OK;
}

/* (mu held) grads "none": 1 + the group whose update holds stage si's
 * grads, 0 when the stage is the drain's (one whose update has given the
 * grads back is taken back here). */
static uint32_t stage_lent(ferry_engine *e, int si) {
  eng_drain_stage *st = &e->drain.stage[si];
  if (st->lent && !stepper_holds_grads(e, st->lent - 1)) st->lent = 0;
  return st->lent;
}

/* (mu held) Starts the D2H of every waiting group a staging buffer is free
 * for, in queue order. A device grad buffer goes back to the loop as soon
 * as its copy is enqueued: its next zeroing waits for `drained`. After a
 * failure nothing more is copied; the buffers are still given back. */
static void issue_copies(ferry_engine *e) {
  eng_drain *d = &e->drain;
  while (d->qissue < d->qtail && d->qissue - d->qhead < ENGINE_DRAIN_STAGES) {
    size_t pos = d->qissue;
    if (!d->status && stage_lent(e, (int)(pos % ENGINE_DRAIN_STAGES))) break; /* the stepper's */
    eng_drain_item it = d->queue[pos % d->qcap];
    int rc = FERRY_OK;
    if (!d->status) {
      pthread_mutex_unlock(&e->mu);
      rc = enqueue_d2h(e, &it, (int)(pos % ENGINE_DRAIN_STAGES));
      pthread_mutex_lock(&e->mu);
    }
    if (rc && !d->status) d->status = rc;
    d->slot[it.slot].owner = -1;
    d->qissue++;
    pthread_cond_broadcast(&d->cv_slot);
  }
}

/* Waits for the D2H into stage st (only what the CPU needs now) and puts
 * it on the timeline. */
static int wait_copy(ferry_engine *e, eng_drain_stage *st) {
  int rc = ferry_event_synchronize(st->done);
  if (rc) return ferry_err(&e->err, rc, "drain: %s", ferry_device_last_error(e->dev));
  if (engine_gpu_math(e)) ferry_timeline_add(&e->tl, FERRY_LANE_OPTIM0, "accumulate (gpu)", st->t0, st->t1);
  else ferry_timeline_add(&e->tl, FERRY_LANE_D2H, "grads D2H", st->t0, st->t1);
  return FERRY_OK;
}

/* acc = bf16(acc + scale * g), rounded to nearest even (bf16 accumulators:
 * the fp32 path's fused multiply-add, then one rounding). */
static void accumulate_bf16(uint16_t *acc, const void *g, ferry_dtype dt, size_t n, float scale) {
  for (size_t i = 0; i < n; i++) {
    float sum = fmaf(ferry_dt_load(g, (int)dt, i), scale, ferry_bf16_to_f32(acc[i]));
    acc[i] = ferry_f32_to_bf16(sum);
  }
}

/* The sum of squares and inf/NaN flag of group g's grads (per param, in
 * order: the same sum whatever holds them), from `src` (dtype dt) or, with
 * src NULL, from its accumulators in tier gt: with ranks at stages 1 and 2,
 * of this rank's pieces only (the step sums the ranks'). */
static int group_stats(ferry_engine *e, uint32_t g, const void *src, ferry_dtype dt, ferry_tier gt,
                       double *sumsq, int *nonfinite) {
  int rc = FERRY_OK;
  size_t es = ferry_dtype_size(dt);
  for (uint32_t k = 0; k < e->gt.groups[g].count && !rc; k++) {
    eng_param *p = group_param(e, g, k);
    void *data = NULL;
    size_t n = p->n;
    if (src) {
      data = (char *)(uintptr_t)src + p->goff * es;
    } else {
      if (p->pn == 0) continue;
      n = p->pn; /* the whole param alone or at stage 0 */
      ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_GRAD], gt, &data);
      if (!engine_grads_sharded(e)) data = (char *)data + p->plo * es; /* stage 1: its piece */
    }
    ferry_grad_span as = {data, n, dt};
    double s = 0;
    int nf = 0;
    rc = ferry_optimizer_grad_stats(e->drain.opt, &as, 1, &s, &nf);
    *sumsq += s;
    *nonfinite |= nf;
  }
  return rc;
}

/* Holds group g's accumulators in tier gt for the drain to add to. NVMe
 * home: marked dirty; one that counts as zero is fetched without a load
 * and zeroed here (no NVMe read of zeros). */
static int hold_accumulators(ferry_engine *e, uint32_t g, ferry_tier gt) {
  eng_group *gr = &e->gt.groups[g];
  int nvme = e->grad_home == FERRY_TIER_NVME, fresh = nvme && group_grads_fresh(e, g);
  unsigned flags = (fresh ? FERRY_MEM_NOLOAD : 0) | FERRY_MEM_NOTRACE;
  int rc = group_fetch(e, g, FERRY_FAMILY_GRADS, gt, NULL, flags, NULL);
  if (rc) return engine_mem_err(e, rc, "drain: grads");
  if (nvme) rc = ferry_mem_mark_dirty(e->mem, g, FERRY_FAMILY_GRADS, gt, NULL);
  if (rc) {
    ferry_mem_release(e->mem, g, FERRY_FAMILY_GRADS, gt, NULL);
    return engine_mem_err(e, rc, "drain: grads");
  }
  for (uint32_t k = 0; fresh && k < gr->count; k++) {
    eng_param *p = group_param(e, g, k);
    size_t n = engine_grads_sharded(e) ? p->pn : p->n;
    if (n == 0) continue;
    void *acc;
    ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_GRAD], gt, &acc);
    memset(acc, 0, n * ferry_dtype_size(e->grad_dtype));
  }
  if (fresh) group_grads_loaded(e, g);
  return FERRY_OK;
}

/* With ranks: group g's downloaded grads (param dtype, group-flat) widened
 * into the fp32 reduce buffer. */
static void widen_grads(ferry_engine *e, uint32_t g, const void *buf) {
  size_t n = e->gt.groups[g].n;
  float *r = e->drain.reduce;
  if (e->dtype == FERRY_DT_F32)
    memcpy(r, buf, n * sizeof(float));
  else
    for (size_t i = 0; i < n; i++)
      r[i] = ferry_dt_load(buf, (int)e->dtype, i);
}

/* The collective's failure as the drain's error. */
static int comm_err(ferry_engine *e, int rc, uint32_t g, const char *what) {
  return ferry_err(&e->err, rc, "drain: group %u: %s over the ranks: %s", g, what,
                   ferry_comm_last_error(e->ch_drain));
}

/* The reduce buffer (group g, fp32) averaged over the ranks: stage 0 in
 * place, stages 1 and 2 this rank's range into the piece buffer. The wait
 * is the drain's: the loop's backward goes on meanwhile. */
static int reduce_grads(ferry_engine *e, uint32_t g) {
  eng_group *gr = &e->gt.groups[g];
  eng_drain *d = &e->drain;
  int rc;
  if (e->zero_stage == 0) {
    rc = ferry_comm_allreduce(e->ch_drain, d->reduce, d->reduce, gr->n, FERRY_DT_F32,
                              FERRY_REDUCE_AVG, NULL, NULL);
    return rc ? comm_err(e, rc, g, "all-reduce of the grads") : FERRY_OK;
  }
  for (int r = 0; r < e->nranks; r++)
    d->counts[r] = gr->bounds[r + 1] - gr->bounds[r];
  rc = ferry_comm_reduce_scatter(e->ch_drain, d->reduce, d->piece, d->counts, FERRY_DT_F32,
                                 FERRY_REDUCE_AVG, NULL, NULL);
  return rc ? comm_err(e, rc, g, "reduce-scatter of the grads") : FERRY_OK;
}

/* Stage 1, the last micro-batch: group g's full local accumulators (held)
 * averaged over the ranks, and this rank's range written back into them
 * (the stepper reads its piece at +plo). */
static int reduce_accumulators(ferry_engine *e, uint32_t g, ferry_tier gt) {
  eng_group *gr = &e->gt.groups[g];
  eng_drain *d = &e->drain;
  for (uint32_t k = 0; k < gr->count; k++) {
    eng_param *p = group_param(e, g, k);
    void *acc;
    ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_GRAD], gt, &acc);
    for (size_t i = 0; i < p->n; i++)
      d->reduce[p->goff + i] = ferry_dt_load(acc, (int)e->grad_dtype, i);
  }
  int rc = reduce_grads(e, g);
  for (uint32_t k = 0; k < gr->count && !rc; k++) {
    eng_param *p = group_param(e, g, k);
    if (p->pn == 0) continue;
    void *acc;
    ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_GRAD], gt, &acc);
    const float *src = d->piece + (p->goff + p->plo - gr->lo);
    for (size_t i = 0; i < p->pn; i++)
      ferry_dt_store(acc, e->grad_dtype, p->plo + i, src[i]);
  }
  return rc;
}

/* Adds `src` (dtype dt; its element 0 is group g's element `base`) scaled
 * into group g's accumulators: the whole of each param, or with sharded
 * accumulators (stage 2) this rank's pieces. */
static int add_to_accumulators(ferry_engine *e, uint32_t g, ferry_tier gt, const void *src,
                               ferry_dtype dt, size_t base, float scale) {
  eng_group *gr = &e->gt.groups[g];
  int gs = engine_grads_sharded(e), rc = FERRY_OK;
  size_t es = ferry_dtype_size(dt);
  for (uint32_t k = 0; k < gr->count && !rc; k++) {
    eng_param *p = group_param(e, g, k);
    size_t off = gs ? p->plo : 0, n = gs ? p->pn : p->n;
    if (n == 0) continue;
    void *acc;
    ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_GRAD], gt, &acc);
    const void *from = (const char *)src + (p->goff + off - base) * es;
    if (e->grad_dtype == FERRY_DT_BF16) {
      accumulate_bf16(acc, from, dt, n, scale);
    } else {
      ferry_grad_span gsp = {from, n, dt};
      rc = ferry_optimizer_grad_accumulate(e->drain.opt, acc, &gsp, scale);
    }
  }
  return rc ? ferry_err(&e->err, rc, "drain: %s", ferry_optimizer_last_error(e->drain.opt)) : rc;
}

/* The CPU path: sums group g's downloaded grads (stage buf) into its
 * accumulators (fp32, or bf16 rounded per add); on the last micro-batch,
 * their squared norm and inf/NaN flag. With grads "none" there is nothing
 * to add to: the stats come from the staged grads themselves. An NVMe home
 * is written behind. With ranks the grads are averaged first: stage 0
 * all-reduces them (fp32) and adds the whole group, stage 2 reduce-scatters
 * them and adds this rank's range to its pieces, stage 1 adds the local
 * grads and, on the last micro-batch, reduce-scatters the accumulators. */
static int accumulate_cpu(ferry_engine *e, uint32_t g, const void *buf, int last, double *sumsq,
                          int *nonfinite) {
  eng_drain *d = &e->drain;
  ferry_tier gt = work_tier(e->grad_home);
  if (e->grads_none) {
    int rc = group_stats(e, g, buf, e->dtype, gt, sumsq, nonfinite);
    return rc ? ferry_err(&e->err, rc, "drain: %s", ferry_optimizer_last_error(d->opt)) : rc;
  }
  const void *src = buf;
  ferry_dtype sdt = e->dtype;
  size_t base = 0;
  int rc = FERRY_OK;
  if (e->nranks > 1 && e->zero_stage != 1) { /* averaged before they are added */
    widen_grads(e, g, buf);
    rc = reduce_grads(e, g);
    if (rc) return rc;
    sdt = FERRY_DT_F32;
    src = e->zero_stage == 0 ? (const void *)d->reduce : (const void *)d->piece;
    base = e->zero_stage == 0 ? 0 : e->gt.groups[g].lo;
  }
  rc = hold_accumulators(e, g, gt);
  if (rc) return rc;
  rc = add_to_accumulators(e, g, gt, src, sdt, base, 1.0f / (float)e->cv->grad_accumulation);
  if (!rc && last && e->nranks > 1 && e->zero_stage == 1) rc = reduce_accumulators(e, g, gt);
  if (!rc && last) {
    rc = group_stats(e, g, NULL, e->grad_dtype, gt, sumsq, nonfinite);
    if (rc) rc = ferry_err(&e->err, rc, "drain: %s", ferry_optimizer_last_error(d->opt));
  }
  int r2 = ferry_mem_release(e->mem, g, FERRY_FAMILY_GRADS, gt, NULL);
  /* written behind (held copies are never written back: after the release) */
  if (!r2 && e->grad_home == FERRY_TIER_NVME)
    r2 = ferry_mem_writeback(e->mem, g, FERRY_FAMILY_GRADS, gt);
  if (rc) return rc;
  return r2 ? engine_mem_err(e, r2, "drain: grads") : FERRY_OK;
}

/* Group g's grads of item `it`, in stage si, are summed (the CPU sums them
 * now; device math has, once the stage's event is done): on the last
 * micro-batch, its squared norm and inf/NaN flag, and with eager updates
 * its update is queued. */
static int accumulate(ferry_engine *e, const eng_drain_item *it, int si) {
  uint32_t g = it->group;
  double t2 = ferry_now(), sumsq = 0;
  int nonfinite = 0, rc = FERRY_OK;
  if (engine_gpu_math(e)) {
    sumsq = it->last ? gpu_drain_sumsq(e, g, si) : 0;
    nonfinite = !isfinite(sumsq);
  } else {
    if (e->drain.sum_delay > 0) { /* tests: a slow sum */
      double d = e->drain.sum_delay;
      struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
      while (nanosleep(&ts, &ts) != 0) continue;
    }
    if (e->drain.sum_faults > 0 && e->drain.sum_faults--) /* tests: a failed sum */
      rc = ferry_err(&e->err, FERRY_EIO, "drain: group %u: test fault in its sum", g);
    else
      rc = accumulate_cpu(e, g, e->drain.stage[si].buf, it->last, &sumsq, &nonfinite);
    ferry_timeline_add(&e->tl, FERRY_LANE_OPTIM0, "accumulate", t2, ferry_now());
  }
  if (rc) return rc;
  e->drain.norm[g] = (eng_drain_norm){sumsq, nonfinite};
  if (it->last && e->eager) { /* its grads are final: update it now, during backward */
    const void *lent = NULL;
    pthread_mutex_lock(&e->mu);
    stepper_set_gscale(e, 1.0f / e->fixed_scale);
    if (e->grads_none) { /* its grads stay there, lent with its update */
      e->drain.stage[si].lent = g + 1;
      lent = e->drain.stage[si].buf;
    }
    stepper_queue(e, g, lent);
    pthread_mutex_unlock(&e->mu);
  }
  return FERRY_OK;
}

/* (mu held) The oldest group in the queue is summed: count it. */
static void finish_item(ferry_engine *e, int rc) {
  eng_drain *d = &e->drain;
  d->qhead++;
  if (rc && !d->status) d->status = rc;
  if (++d->in_micro == e->gt.ngroups) {
    d->in_micro = 0;
    d->micro++;
  }
  if (d->qhead == d->qtail) pthread_cond_broadcast(&d->cv_idle);
  ferry_mem_notify(e->mem); /* a loop's fetch waits for room while the drain is busy */
}

/* (mu held) grads "none": until the oldest group's copy is issued, which
 * waits for its stage to come back from the stepper (a wait on the
 * stepper's condition); a stage lent to an update that failed fails the
 * drain (those grads are kept for its retry). Each wake passes the
 * stepper's news on to a loop waiting for a grad buffer. */
static void wait_stage(ferry_engine *e) {
  eng_drain *d = &e->drain;
  while (d->qissue == d->qhead && !d->status) {
    uint32_t lent = d->stage[d->qhead % ENGINE_DRAIN_STAGES].lent;
    FERRY_ASSERT(lent, "drain: the oldest group's copy waits, but its stage is not lent");
    const eng_group *gr = &e->gt.groups[lent - 1];
    if (gr->state == GROUP_FAILED) {
      d->status = gr->fail_status;
    } else {
      d->stage_wait = 1;
      pthread_cond_broadcast(&d->cv_slot); /* a loop waiting for a buffer checks the cycle */
      stepper_wait_change(e);
      d->stage_wait = 0;
    }
    issue_copies(e);
  }
}

/* The drain thread: per group in queue order, its D2H (started as soon as
 * a staging buffer is free), then, once the CPU needs it, the wait for that
 * copy and the sum — with the next group's copy started before the sum. */
static void *drain_main(void *arg) {
  ferry_engine *e = arg;
  eng_drain *d = &e->drain;
  pthread_mutex_lock(&e->mu);
  for (;;) {
    while (d->qhead == d->qtail && !d->stop) pthread_cond_wait(&d->cv_work, &e->mu);
    if (d->qhead == d->qtail) break;
    issue_copies(e); /* the oldest group's copy at least */
    wait_stage(e);
    size_t pos = d->qhead;
    eng_drain_item it = d->queue[pos % d->qcap];
    int si = (int)(pos % ENGINE_DRAIN_STAGES);
    eng_drain_stage *st = &d->stage[si];
    int failed = d->status;
    pthread_mutex_unlock(&e->mu);
    int rc = failed ? FERRY_OK : wait_copy(e, st);
    pthread_mutex_lock(&e->mu);
    issue_copies(e); /* a group handed in meanwhile: its copy overlaps this sum */
    failed = failed || d->status;
    pthread_mutex_unlock(&e->mu);
    if (!rc && !failed) rc = accumulate(e, &it, si);
    pthread_mutex_lock(&e->mu);
    if ((rc || failed) && marks_clear(e, it.group)) /* no update comes to stage its params */
      stepper_wake(e);                               /* a fetch waits on the count */
    finish_item(e, rc);
  }
  pthread_mutex_unlock(&e->mu);
  return NULL;
}

int drain_wait(ferry_engine *e) {
  eng_drain *d = &e->drain;
  pthread_mutex_lock(&e->mu);
  while (d->qhead != d->qtail) pthread_cond_wait(&d->cv_idle, &e->mu);
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
  e->drain.sub_micro = 0;
  e->drain.sub_in_micro = 0;
  e->drain.pass++;
  pthread_mutex_unlock(&e->mu);
}

int drain_busy(const ferry_engine *e) { return e->drain.qhead != e->drain.qtail; }

void *drain_slot_dev(const ferry_engine *e, int slot) { return e->drain.slot[slot].dev; }

int drain_slot_zero(ferry_engine *e, int slot, ferry_stream *s, size_t bytes, const char *op) {
  const eng_grad_slot *sl = &e->drain.slot[slot];
  int rc = ferry_stream_wait_event(s, sl->drained); /* after the drain's last copy out of it */
  if (!rc) rc = ferry_memset_async(s, sl->dev, 0, bytes);
  return rc ? ferry_err(&e->err, rc, "%s: %s", op, ferry_device_last_error(e->dev)) : FERRY_OK;
}

int drain_slot_ready(ferry_engine *e, int slot, ferry_stream *s, const char *op) {
  int rc = ferry_event_record(e->drain.slot[slot].ready, s);
  return rc ? ferry_err(&e->err, rc, "%s: %s", op, ferry_device_last_error(e->dev)) : FERRY_OK;
}

void drain_take_norm(ferry_engine *e, double *sumsq, int *nonfinite) {
  *sumsq = 0;
  *nonfinite = 0;
  for (uint32_t g = 0; g < e->gt.ngroups; g++) {
    eng_drain_norm *n = &e->drain.norm[g];
    *sumsq += n->sumsq;
    *nonfinite |= n->nonfinite || !isfinite(n->sumsq);
    *n = (eng_drain_norm){0, 0};
  }
}

void drain_clear_norm(ferry_engine *e, uint32_t g) { e->drain.norm[g] = (eng_drain_norm){0, 0}; }

void drain_set_d2h_delay(ferry_engine *e, double seconds) { e->drain.d2h_delay = seconds; }
void drain_set_sum_delay(ferry_engine *e, double seconds) { e->drain.sum_delay = seconds; }
void drain_set_sum_faults(ferry_engine *e, int count) { e->drain.sum_faults = count; }
