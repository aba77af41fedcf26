/* offload/stepper.c — the update worker: the stepper thread takes groups
 * from its queue in order and updates each — the NVMe read of the next
 * group's optimizer state (a prefetch), the optimizer on this one (one
 * fused pass that also writes the params in their dtype: the CPU's, or with
 * device math the CUDA AdamW through gpu.c), the write-back of its state to
 * NVMe and the upload (device home) or commit (host and NVMe homes) of its
 * new params — while the loop computes. With grads "none" the grads are in
 * a drain staging buffer lent with the group, given back after its
 * optimizer pass. With a bf16 master (precision.master) the optimizer
 * updates a staged copy of the group's current params in place
 * (stepper_read_params), which is then uploaded or committed the same way.
 * A group where no param got a gradient (optimizer.missing_grad = skip)
 * is left alone: no state read or written, no params committed.
 * Uses group.c and gpu.c; the drain lends it staged grads through
 * stepper_queue and sees them given back through stepper_holds_grads.
 */
#include "offload/engine_impl.h"
#include "core/dtype.h"
#include "core/par.h"

#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static void *stepper_main(void *arg);

void stepper_create(ferry_engine *e) {
  pthread_cond_init(&e->stepper.cv, NULL);
  e->stepper.waits_for = -1;
  e->stepper.parked = -1;
}

int stepper_init(ferry_engine *e, size_t gbytes) {
  eng_stepper *st = &e->stepper;
  st->queue = calloc(e->gt.ngroups, sizeof *st->queue);
  st->spans = calloc(e->gt.max_count, sizeof *st->spans);
  st->span_t = calloc(e->gt.max_count, sizeof *st->span_t);
  st->dsts = calloc(e->gt.max_count, sizeof *st->dsts);
  st->counts = calloc((size_t)e->nranks, sizeof *st->counts);
  st->lent = calloc(e->gt.ngroups, sizeof *st->lent);
  st->uploaded = calloc(e->gt.ngroups, sizeof *st->uploaded);
  if (!st->queue || !st->spans || !st->span_t || !st->dsts || !st->counts || !st->lent ||
      !st->uploaded)
    return ferry_err(&e->err, FERRY_ENOMEM, "finalize: out of memory");
  int rc = FERRY_OK;
  for (int i = 0; i < ENGINE_STAGE_SLOTS && !rc; i++) {
    if (engine_upload_staged(e)) rc = ferry_host_alloc(e->dev, gbytes, &st->stage_up[i]);
    if (!rc) rc = ferry_event_create(e->dev, &st->stage_up_ev[i]);
  }
  for (uint32_t g = 0; g < e->gt.ngroups && !rc; g++)
    rc = ferry_event_create(e->dev, &st->uploaded[g]);
  if (rc)
    return ferry_err(&e->err, rc, "finalize: engine buffers: %s", ferry_device_last_error(e->dev));
  return FERRY_OK;
}

/* The param commit staging (host and NVMe homes), after the manager. */
int stepper_init_param_stage(ferry_engine *e) {
  if (e->param_home == FERRY_TIER_DEVICE) return FERRY_OK;
  size_t bytes = e->gt.max_group_n * e->esize;
  int rc = ferry_host_alloc(e->dev, bytes, &e->stepper.param_stage);
  if (rc)
    return ferry_err(&e->err, rc, "finalize: param staging of %zu bytes: %s", bytes,
                     ferry_device_last_error(e->dev));
  return FERRY_OK;
}

int stepper_start(ferry_engine *e) {
  if (pthread_create(&e->stepper.thread, NULL, stepper_main, e))
    return ferry_err(&e->err, FERRY_ENOMEM, "finalize: cannot start the step thread");
  e->stepper.started = 1;
  return FERRY_OK;
}

/* Lets the stepper finish what was queued, then stops it. */
void stepper_stop(ferry_engine *e) {
  pthread_mutex_lock(&e->mu);
  e->stepper.stop = 1;
  pthread_cond_broadcast(&e->stepper.cv);
  pthread_mutex_unlock(&e->mu);
  if (e->stepper.started) pthread_join(e->stepper.thread, NULL);
  e->stepper.started = 0;
}

void stepper_free(ferry_engine *e) {
  eng_stepper *st = &e->stepper;
  if (e->dev) {
    for (int i = 0; i < ENGINE_STAGE_SLOTS; i++) {
      if (st->stage_up[i]) ferry_host_free(e->dev, st->stage_up[i]);
      ferry_event_destroy(st->stage_up_ev[i]);
    }
    if (st->param_stage) ferry_host_free(e->dev, st->param_stage);
    for (uint32_t g = 0; st->uploaded && g < e->gt.ngroups; g++)
      ferry_event_destroy(st->uploaded[g]);
  }
  free(st->lent);
  free(st->uploaded);
  pthread_cond_destroy(&st->cv);
  free(st->queue);
  free(st->spans);
  free(st->span_t);
  free(st->dsts);
  free(st->counts);
}

/* Tests (stepper_set_fault): the fault armed at tail step `at` fires now:
 * FERRY_EIO with its message. */
static int injected(ferry_engine *e, uint32_t g, group_tail at) {
  static const char *const what[] = {"", "zeroing the grads", "the all-gather of the new params",
                                     "the new params' way home"};
  pthread_mutex_lock(&e->mu);
  int fire = e->stepper.fault_left > 0 && e->stepper.fault_at == (int)at;
  if (fire) e->stepper.fault_left--;
  pthread_mutex_unlock(&e->mu);
  if (!fire) return FERRY_OK;
  return ferry_err(&e->err, FERRY_EIO, "step: group %u: an injected fault in %s", g, what[at]);
}

void stepper_set_fault(ferry_engine *e, int at, int count) {
  pthread_mutex_lock(&e->mu);
  e->stepper.fault_at = at;
  e->stepper.fault_left = count;
  pthread_mutex_unlock(&e->mu);
}

/* Where the optimizer writes group g's new params: a pinned staging buffer,
 * uploaded by param_upload (device home), or the param staging buffer,
 * copied into the host copy when the group commits (host and NVMe homes:
 * the memory manager wants a host copy marked dirty before it is written,
 * which drops device copies, which must not be held then). */
static int param_prepare(ferry_engine *e, uint32_t g, int slot, void **dst) {
  eng_group *gr = &e->gt.groups[g];
  void *base = e->stepper.param_stage;
  if (e->param_home == FERRY_TIER_DEVICE) {
    int rc = ferry_event_synchronize(e->stepper.stage_up_ev[slot]); /* its last upload is done */
    if (rc) return ferry_err(&e->err, rc, "step: %s", ferry_device_last_error(e->dev));
    base = e->stepper.stage_up[slot];
  }
  for (uint32_t k = 0; k < gr->count; k++)
    dst[k] = (char *)base + group_param(e, g, k)->goff * e->esize;
  return FERRY_OK;
}

/* Waits (mu held) until the loop holds none of group g: its releases have
 * recorded every use of the group's device copies. Says so on the
 * stepper's condition: a drain waiting for a stage lent to the stepper
 * passes it on to a loop waiting for a grad buffer (drain.c checks that the
 * loop is not the one holding the drain up). */
static void wait_released(ferry_engine *e, eng_group *gr) {
  eng_stepper *st = &e->stepper;
  /* destroy (the drain stops first): the loop releases nothing any more */
  if (!gr->fetched || st->stop || st->released) return;
  st->waits_for = gr - e->gt.groups;
  pthread_cond_broadcast(&st->cv);
  while (gr->fetched && !st->stop && !st->released) pthread_cond_wait(&st->cv, &e->mu);
  st->waits_for = -1;
}

/* Device home: orders `stream` (where group g's params are about to be
 * written in place) after the loop's reads of them: waits until the loop
 * has released the group, then for every use its releases recorded. */
static int wait_readers(ferry_engine *e, uint32_t g, ferry_stream *stream) {
  pthread_mutex_lock(&e->mu);
  wait_released(e, &e->gt.groups[g]);
  pthread_mutex_unlock(&e->mu);
  int rc = ferry_mem_wait_users(e->mem, g, FERRY_FAMILY_PARAMS, stream);
  return rc ? engine_mem_err(e, rc, "step: params") : FERRY_OK;
}

/* Device home: upload group g's staged params into its device copy, in
 * place, once the loop's streams are done reading it. */
static int param_upload(ferry_engine *e, uint32_t g, int slot) {
  eng_group *gr = &e->gt.groups[g];
  int rc = wait_readers(e, g, e->up);
  if (rc) return rc;
  double t0 = ferry_now();
  for (uint32_t k = 0; k < gr->count && !rc; k++) {
    eng_param *p = group_param(e, g, k);
    void *d;
    rc = ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_PARAM], FERRY_TIER_DEVICE, &d);
    if (rc) return engine_mem_err(e, rc, "step: upload");
    rc = ferry_memcpy_async(e->up, d, (char *)e->stepper.stage_up[slot] + p->goff * e->esize,
                            p->n * e->esize, FERRY_COPY_H2D);
    if (!rc && k == 0 && (rc = injected(e, g, GROUP_TAIL_HOME))) return rc;
  }
  if (!rc) rc = ferry_event_record(e->stepper.stage_up_ev[slot], e->up);
  if (!rc) rc = ferry_event_record(e->stepper.uploaded[g], e->up);
  if (rc) return ferry_err(&e->err, rc, "step: upload: %s", ferry_device_last_error(e->dev));
  ferry_timeline_add(&e->tl, FERRY_LANE_H2D, "params enqueue", t0, ferry_now());
  return FERRY_OK;
}

/* The engine is being destroyed (its drain stops first): the loop will
 * release nothing it still holds. */
static int destroying(ferry_engine *e) {
  pthread_mutex_lock(&e->mu);
  int stop = e->stepper.released;
  pthread_mutex_unlock(&e->mu);
  return stop;
}

/* Every chunk of group g's params has a host copy. */
static int host_cached(ferry_engine *e, uint32_t g) {
  uint32_t first = 0, count = 0;
  ferry_mem_group_chunks(e->mem, g, FERRY_FAMILY_PARAMS, &first, &count);
  for (uint32_t c = first; c < first + count; c++) {
    ferry_mem_chunk_info ci;
    if (ferry_mem_chunk_get(e->mem, c, &ci) || ci.state[FERRY_TIER_HOST] == FERRY_RES_ABSENT)
      return 0;
  }
  return 1;
}

/* Host and NVMe homes: group g, none of it held by the loop: mark the host
 * copy dirty (dropping device copies), copy the staged params in, and write
 * an NVMe home back. */
static int param_commit(ferry_engine *e, uint32_t g) {
  int rc = FERRY_OK;
  int nvme = e->param_home == FERRY_TIER_NVME;
  eng_group *gr = &e->gt.groups[g];
  int cached = nvme && host_cached(e, g);
  if (nvme) {
    /* no read: the commit overwrites every param of the group, and no
     * chunk holds another group's */
    rc = group_fetch(e, g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL,
                     FERRY_MEM_NOLOAD | FERRY_MEM_NOTRACE, NULL);
    if (rc) return engine_mem_err(e, rc, "step: params");
  }
  /* Loads of these params the loop waited for (its kernels ran after them)
   * may not be noticed yet: complete them, so their holds are dropped. */
  ferry_mem_poll(e->mem);
  uint64_t seen = ferry_mem_changes(e->mem);
  rc = ferry_mem_mark_dirty(e->mem, g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL);
  /* The loop holds none of the group (after_update waited), so a device
   * copy still held is a load in flight (a prefetch from NVMe through the
   * host holds its chunk until the H2D is issued and seen complete): wait
   * for the manager's next change (it is dropped as stale once it lands),
   * at most GROUP_FETCH_WAIT (not at destroy, when the loop may still hold
   * it; stepper_abandon_releases wakes this wait). */
  double deadline = ferry_now() + GROUP_FETCH_WAIT;
  while (rc == FERRY_EBUSY && !destroying(e) &&
         ferry_mem_wait_change(e->mem, &seen, deadline) == FERRY_OK)
    rc = ferry_mem_mark_dirty(e->mem, g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL);
  int piece = engine_params_sharded(e); /* stage 3: the home holds this rank's pieces */
  int copied = 0, injected_rc = FERRY_OK;
  for (uint32_t k = 0; k < gr->count && !rc; k++) {
    eng_param *p = group_param(e, g, k);
    size_t off = piece ? p->plo : 0, n = piece ? p->pn : p->n;
    void *h;
    if (!n) continue;
    rc = ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_PARAM], FERRY_TIER_HOST, &h);
    if (!rc) memcpy(h, (char *)e->stepper.param_stage + (p->goff + off) * e->esize, n * e->esize);
    if (!rc && !copied++) rc = injected_rc = injected(e, g, GROUP_TAIL_HOME);
  }
  if (nvme) {
    int r2 = ferry_mem_release(e->mem, g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL);
    if (!rc) rc = r2;
    if (!rc) rc = ferry_mem_writeback(e->mem, g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST);
    /* a group the loop's eviction had dropped goes again once written (the
     * manager drops it when the write lands: no wait here), so that the
     * commit does not keep it in place of one the loop kept; a failed write
     * keeps it, dirty, and the eviction or flush that writes it again
     * reports the error */
    if (!rc && !cached && e->optim_ahead)
      rc = ferry_mem_evict_clean(e->mem, g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST);
  }
  if (injected_rc) return injected_rc;
  return rc ? engine_mem_err(e, rc, "step: params") : FERRY_OK;
}

/* Where device math brings group g's new params home. */
static gpu_home params_home(ferry_engine *e, uint32_t g) {
  return (gpu_home){e->stepper.param_stage, e->stepper.uploaded[g]};
}

/* n fp32 values stored in dtype dt; a tensor of many millions (the initial
 * values of a large model) split over all threads. */
typedef struct {
  void *dst;
  const float *src;
  ferry_dtype dt;
  size_t n, per;
} store_job;

static void store_part(void *arg, int k) {
  store_job *j = arg;
  size_t a = j->per * (size_t)k < j->n ? j->per * (size_t)k : j->n;
  size_t b = j->n - a > j->per ? a + j->per : j->n;
  for (size_t i = a; i < b; i++) ferry_dt_store(j->dst, j->dt, i, j->src[i]);
}

#define STORE_PART_MIN ((size_t)1 << 22)

static void store_values(void *dst, ferry_dtype dt, const float *src, size_t n) {
  size_t parts = n / STORE_PART_MIN, cpus = (size_t)ferry_par_threads();
  if (parts > cpus) parts = cpus;
  store_job j = {dst, src, dt, n, parts > 1 ? (n + parts - 1) / parts : n};
  if (parts > 1) ferry_par_run((int)parts, store_part, &j);
  else store_part(&j, 0);
}

int stepper_write_params(ferry_engine *e, uint32_t g, const float *vals) {
  eng_group *gr = &e->gt.groups[g];
  void **dst = e->stepper.dsts;
  if (engine_gpu_math(e)) { /* the masters are device memory: a kernel converts */
    gpu_param_dsts(e, g, dst);
    gpu_home home = params_home(e, g);
    int rc = gpu_write_params(e, g, dst, vals, &home);
    return rc || e->param_home == FERRY_TIER_DEVICE ? rc : param_commit(e, g);
  }
  int rc = param_prepare(e, g, 0, dst);
  if (rc) return rc;
  ferry_tier ot = work_tier(e->optim_home);
  for (uint32_t k = 0; k < gr->count; k++) {
    eng_param *p = group_param(e, g, k);
    const float *src = vals ? vals + p->goff : NULL;
    if (!src) ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_MASTER], ot, (void **)&src);
    store_values(dst[k], e->dtype, src, p->n);
  }
  return e->param_home == FERRY_TIER_DEVICE ? param_upload(e, g, 0) : param_commit(e, g);
}

int stepper_read_params(ferry_engine *e, uint32_t g, void *dst, ferry_stream *s) {
  eng_group *gr = &e->gt.groups[g];
  int rc;
  if (e->param_home == FERRY_TIER_DEVICE) {
    /* the device copy is the home (always resident); copies on s follow
     * the group's last upload when s is e->up, else the caller waited */
    for (uint32_t k = 0; k < gr->count; k++) {
      eng_param *p = group_param(e, g, k);
      void *d;
      rc = ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_PARAM], FERRY_TIER_DEVICE, &d);
      if (rc) return engine_mem_err(e, rc, "params");
      rc = ferry_memcpy_async(s, (char *)dst + p->goff * e->esize, d, p->n * e->esize,
                              FERRY_COPY_D2H);
      if (rc) return ferry_err(&e->err, rc, "params: %s", ferry_device_last_error(e->dev));
    }
    rc = ferry_stream_synchronize(s);
    return rc ? ferry_err(&e->err, rc, "params: %s", ferry_device_last_error(e->dev)) : FERRY_OK;
  }
  /* host home: the host copy; NVMe home: read into the host first */
  rc = group_fetch(e, g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL, FERRY_MEM_NOTRACE, NULL);
  if (rc) return engine_mem_err(e, rc, "params");
  for (uint32_t k = 0; k < gr->count && !rc; k++) {
    eng_param *p = group_param(e, g, k);
    void *h;
    rc = ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_PARAM], FERRY_TIER_HOST, &h);
    if (!rc) memcpy((char *)dst + p->goff * e->esize, h, p->n * e->esize);
  }
  int r2 = ferry_mem_release(e->mem, g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL);
  if (!rc) rc = r2;
  return rc ? engine_mem_err(e, rc, "params") : FERRY_OK;
}

/* Points the optimizer's spans at group g's tensors (all held) and at
 * where its new params go; returns how many. With ranks at stage >= 1 a
 * span covers this rank's piece of a param (master, states and, stage 2,
 * grads are piece tensors; stage 1's full accumulators and the params are
 * read and written at +plo); a param with no piece has no span, nor has
 * one this step leaves as it is (group_param_stepped). span_t[i]: the
 * step count of span i's param (its bias correction's). */
static uint32_t fill_spans(ferry_engine *e, uint32_t g, void **dst) {
  ferry_tier ot = work_tier(e->optim_home), gt = work_tier(e->grad_home);
  const char *lent = e->stepper.lent[g]; /* grads "none": where its grads are */
  int full_grads = !engine_grads_sharded(e);
  uint32_t ns = 0;
  for (uint32_t k = 0; k < e->gt.groups[g].count; k++) {
    eng_param *p = group_param(e, g, k);
    if (p->pn == 0 || !group_param_stepped(e, p)) continue;
    e->stepper.span_t[ns] = p->steps;
    ferry_optim_span *sp = &e->stepper.spans[ns++];
    char *copy = (char *)dst[k] + p->plo * e->esize;
    memset(sp, 0, sizeof *sp);
    if (e->master_bf16) /* the staged copy of its current params, updated in place */
      sp->param = (float *)(void *)copy;
    else
      ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_MASTER], ot, (void **)&sp->param);
    if (e->grads_none) {
      sp->grad = lent + p->goff * e->esize;
    } else {
      ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_GRAD], gt, (void **)&sp->grad);
      if (full_grads) sp->grad = (const char *)sp->grad + p->plo * ferry_dtype_size(e->grad_dtype);
    }
    if (p->id[FERRY_ROLE_EXP_AVG] != UINT32_MAX)
      ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_EXP_AVG], ot, &sp->state1);
    if (p->id[FERRY_ROLE_EXP_AVG_SQ] != UINT32_MAX)
      ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_EXP_AVG_SQ], ot, &sp->state2);
    sp->param_copy = e->master_bf16 ? NULL : copy;
    sp->n = p->pn;
    sp->grad_dtype = e->grad_dtype; /* "none": the staged grads' (param dtype) */
    sp->copy_dtype = e->master_bf16 ? FERRY_DT_NONE : e->dtype;
    sp->index = p->gindex + p->plo; /* the same for every placement, grouping and rank count */
  }
  return ns;
}

/* With ranks at stage >= 1: every rank's range of group g's new params
 * (written by its optimizer into the staging) to every rank, in place. */
static int gather_params(ferry_engine *e, uint32_t g, int slot) {
  /* stage 3: each rank commits its piece; fetches gather them */
  if (!engine_sharded(e) || engine_params_sharded(e)) return FERRY_OK;
  eng_group *gr = &e->gt.groups[g];
  char *base = e->param_home == FERRY_TIER_DEVICE ? (char *)e->stepper.stage_up[slot]
                                                  : (char *)e->stepper.param_stage;
  for (int r = 0; r < e->nranks; r++)
    e->stepper.counts[r] = (gr->bounds[r + 1] - gr->bounds[r]) * e->esize;
  double t0 = ferry_now();
  int rc = injected(e, g, GROUP_TAIL_GATHER); /* every rank arms it */
  if (rc) return rc;
  rc = ferry_comm_allgather(e->ch_step, base + gr->lo * e->esize, base, e->stepper.counts,
                                FERRY_DT_U8, NULL, NULL);
  if (rc)
    return ferry_err(&e->err, rc, "step: group %u: all-gather of the new params: %s", g,
                     ferry_comm_last_error(e->ch_step));
  ferry_timeline_add(&e->tl, FERRY_LANE_STEP, "wait for params", t0, ferry_now());
  return FERRY_OK;
}

/* How many params of group g this step updates: the others get no
 * gradient (optimizer.missing_grad = skip) and are left as they are. */
static uint32_t group_stepped(ferry_engine *e, uint32_t g) {
  uint32_t n = 0;
  for (uint32_t k = 0; k < e->gt.groups[g].count; k++)
    n += group_param_stepped(e, group_param(e, g, k)) != 0;
  return n;
}

/* A bf16 master: the staging (or, with device math, the device scratch)
 * starts as group i's current params, so a failed update leaves the params
 * themselves unchanged. Read before the group's optimizer state and grads
 * are held: the stepper then holds one family at a time in the host pool
 * (at the pool's minimum, a params read beside its own state hold and the
 * loop's holds left no hole for a chunk, and the loop waited on the step).
 * A group with a param this step leaves out (group_stepped) is staged the
 * same way, so that param's staged copy stays its current value. */
static int stage_master(ferry_engine *e, uint32_t i, int slot) {
  if (!e->master_bf16 && group_stepped(e, i) == e->gt.groups[i].count) return FERRY_OK;
  int rc;
  if (engine_gpu_math(e)) {
    if (e->param_home == FERRY_TIER_DEVICE) return FERRY_OK; /* in place there */
    rc = stepper_read_params(e, i, e->stepper.param_stage, e->up);
    return rc ? rc : gpu_stage_params(e, i, e->stepper.param_stage);
  }
  rc = param_prepare(e, i, slot, e->stepper.dsts); /* the stage's last upload is done */
  void *base = e->param_home == FERRY_TIER_DEVICE ? e->stepper.stage_up[slot]
                                                  : e->stepper.param_stage;
  return rc ? rc : stepper_read_params(e, i, base, e->up);
}

/* The optimizer pass over group i (its state and grads held): the CPU's
 * fused pass, which writes the new params into a staging buffer, or with
 * device math the CUDA AdamW on e->down, fused with the param copy (device
 * home: in place, once the loop's reads of them are done). Each param's
 * bias correction uses its own step count (eng_param.steps): all equal
 * unless some param was left out of a step. One call for the whole group,
 * which checks every span before it changes any, so that a failed update
 * changed nothing (after_update). */
static int run_optimizer(ferry_engine *e, uint32_t i, int slot, float gscale) {
  void **dst = e->stepper.dsts;
  int gpu = engine_gpu_math(e), rc = FERRY_OK;
  if (gpu) {
    gpu_param_dsts(e, i, dst);
    if (e->param_home == FERRY_TIER_DEVICE)
      rc = wait_readers(e, i, e->down); /* a bf16 master: updated in place there */
  } else {
    rc = param_prepare(e, i, slot, dst);
  }
  if (rc) return rc;
  uint32_t ns = fill_spans(e, i, dst);
  double t2 = ferry_now();
  if (gpu) return gpu_optimizer_step(e, e->stepper.spans, ns, gscale, e->stepper.span_t);
  rc = optim_step_counts(e->opt, e->stepper.spans, ns, gscale, e->stepper.span_t);
  if (rc && rc != FERRY_ENOMEM)
    rc = ferry_err(&e->err, rc, "step: optimizer: %s", ferry_optimizer_last_error(e->opt));
  ferry_timeline_add(&e->tl, FERRY_LANE_OPTIM0, "optimizer", t2, ferry_now());
  return rc;
}

/* After group g's optimizer pass: each param it stepped counts the step. */
static void count_steps(ferry_engine *e, uint32_t g) {
  for (uint32_t k = 0; k < e->gt.groups[g].count; k++) {
    eng_param *p = group_param(e, g, k);
    if (group_param_stepped(e, p)) p->steps++;
  }
}

/* The tail of group i's update, the steps after its optimizer pass, each
 * run from where eng_group.tail says and moving it on once done, so that a
 * retry after a failure in one runs only the rest (never the optimizer
 * again). First the zeroing of its grads (held: the first try holds them). */
static int tail_zero(ferry_engine *e, uint32_t i, int held) {
  eng_group *gr = &e->gt.groups[i];
  if (gr->tail != GROUP_TAIL_ZERO) return FERRY_OK;
  int rc = injected(e, i, GROUP_TAIL_ZERO);
  if (!rc) rc = group_zero_grads(e, i, held);
  if (!rc) gr->tail = GROUP_TAIL_GATHER;
  return rc;
}

/* Then the new params, from the staging buffers (which a pending tail
 * keeps: stepper.parked): the ranks' all-gather, and the way home. Device
 * math: recorded (device home) or staged for the commit; the CPU's params
 * of a device home are uploaded now (only this group's bytes). The tail
 * ends in after_update, after the commit of host and NVMe homes. */
static int tail_params(ferry_engine *e, uint32_t i, int slot) {
  eng_group *gr = &e->gt.groups[i];
  if (gr->tail == GROUP_TAIL_GATHER) {
    int rc = gather_params(e, i, slot);
    if (rc) return rc;
    gr->tail = GROUP_TAIL_HOME;
  }
  gpu_home home = params_home(e, i);
  if (engine_gpu_math(e)) {
    int rc = e->param_home == FERRY_TIER_DEVICE ? injected(e, i, GROUP_TAIL_HOME) : FERRY_OK;
    return rc ? rc : gpu_params_home(e, i, &home);
  }
  return e->param_home == FERRY_TIER_DEVICE ? param_upload(e, i, slot) : FERRY_OK;
}

/* After group i's optimizer pass (its state released): the NVMe write-back
 * of the state, and the new params where the next fetch finds them. */
static int after_optimizer(ferry_engine *e, uint32_t i, int slot) {
  if (e->optim_home == FERRY_TIER_NVME) {
    /* the update is done: a write that cannot start leaves the state dirty
     * on the host, written again at eviction or flush (which report it) */
    int wrc = ferry_mem_writeback(e->mem, i, FERRY_FAMILY_OPTIM, work_tier(e->optim_home));
    if (wrc)
      ferry_logf(&e->log, FERRY_LOG_WARN, "step: write-back of group %u: %s", i,
                 ferry_mem_last_error(e->mem));
  }
  return tail_params(e, i, slot); /* while the write-back runs */
}

/* grads "none": group g's update is done with the grads lent with it;
 * the drain, waiting on the stepper's condition, takes its stage back
 * (drain.c). */
static void return_grads(ferry_engine *e, uint32_t g) {
  pthread_mutex_lock(&e->mu);
  e->stepper.lent[g] = NULL;
  pthread_cond_broadcast(&e->stepper.cv);
  pthread_mutex_unlock(&e->mu);
}

/* Holds group i's optimizer state and grads in their work tiers and starts
 * the NVMe read of the next group's optimizer state (a prefetch that
 * overlaps this update). With grads "none" its grads are in the drain's
 * stage. */
static int hold_state(ferry_engine *e, uint32_t i, uint32_t next) {
  ferry_tier ot = work_tier(e->optim_home), gt = work_tier(e->grad_home);
  double t0 = ferry_now();
  int rc = group_fetch(e, i, FERRY_FAMILY_OPTIM, ot, NULL, FERRY_MEM_NOTRACE, NULL);
  if (rc) return engine_mem_err(e, rc, "step: optimizer state");
  double t1 = ferry_now();
  if (t1 - t0 > 1e-4) ferry_timeline_add(&e->tl, FERRY_LANE_STEP, "wait for state", t0, t1);
  if (next != UINT32_MAX && e->optim_ahead) /* only into room the working set leaves */
    (void)ferry_mem_prefetch(e->mem, next, FERRY_FAMILY_OPTIM, ot);
  if (e->grads_none) return FERRY_OK;
  /* NVMe grads are not read ahead: with eager updates the next group's are
   * not final yet (the drain writes them), and in a tight pool a read ahead
   * is evicted before its use and read twice */
  rc = group_fetch(e, i, FERRY_FAMILY_GRADS, gt, NULL, FERRY_MEM_NOTRACE, NULL);
  if (rc) {
    ferry_mem_release(e->mem, i, FERRY_FAMILY_OPTIM, ot, NULL);
    return engine_mem_err(e, rc, "step: grads");
  }
  return FERRY_OK;
}

/* Group g's update has staged its params (or failed to): no longer kept. */
static void staged(ferry_engine *e, uint32_t g) {
  pthread_mutex_lock(&e->mu);
  if (marks_clear(e, g)) pthread_cond_broadcast(&e->stepper.cv); /* a fetch waits on the count */
  pthread_mutex_unlock(&e->mu);
}

/* Updates group i; `next` (UINT32_MAX: none) is the group expected after it,
 * whose optimizer state is prefetched meanwhile. *idle: no param of the
 * group got a gradient (optimizer.missing_grad = skip), so nothing is
 * read, stepped, written or committed; its grads are zeroed all the same. */
static int update_group(ferry_engine *e, uint32_t i, uint32_t next, float gscale, int *idle) {
  ferry_tier ot = work_tier(e->optim_home), gt = work_tier(e->grad_home);
  int slot = (int)(i % ENGINE_STAGE_SLOTS);
  eng_group *gr = &e->gt.groups[i];
  *idle = 0;
  if (gr->tail) { /* the retry of a failure after its optimizer pass */
    staged(e, i);
    int rc = tail_zero(e, i, 0);
    return rc ? rc : tail_params(e, i, slot);
  }
  *idle = group_stepped(e, i) == 0;
  if (*idle) {
    staged(e, i); /* nothing to stage: the loop stops waiting for it */
    if (e->grads_none) return_grads(e, i);
    return group_zero_grads(e, i, 0);
  }
  int rc = stage_master(e, i, slot);
  staged(e, i);
  if (!rc) rc = hold_state(e, i, next);
  if (rc) return rc;
  rc = ferry_mem_mark_dirty(e->mem, i, FERRY_FAMILY_OPTIM, ot, NULL); /* before writing */
  if (rc) rc = engine_mem_err(e, rc, "step: optimizer state");
  if (!rc) rc = run_optimizer(e, i, slot, gscale);
  if (!rc) {
    count_steps(e, i);
    gr->tail = GROUP_TAIL_ZERO; /* from here on a failure leaves a tail */
  }
  if (!rc && e->grads_none) return_grads(e, i); /* a failed update keeps them for its retry */
  if (!rc) rc = tail_zero(e, i, 1);
  if (!e->grads_none) ferry_mem_release(e->mem, i, FERRY_FAMILY_GRADS, gt, NULL);
  ferry_mem_release(e->mem, i, FERRY_FAMILY_OPTIM, ot, NULL);
  /* held copies are never written back, so after the release */
  return rc ? rc : after_optimizer(e, i, slot);
}

/* Ends group g's update (mu held): IDLE, or FAILED with status rc; it
 * leaves the queue's pending count. */
static void finish_group(ferry_engine *e, uint32_t g, int rc) {
  if (rc) group_set_failed(e, g, rc);
  else group_set_state(e, g, GROUP_IDLE);
  e->stepper.pending--;
  /* also a drain waiting for the stage a failed update holds */
  pthread_cond_broadcast(&e->stepper.cv);
  ferry_mem_notify(e->mem); /* a loop's fetch waits for room while the stepper is busy */
}

/* After group g's update. Host and NVMe homes: the new params are copied
 * into the group's own chunks (no chunk holds two groups) once the loop
 * holds none of them, which drops the stale device copy; the group's
 * fetches wait until then (UPDATED). A failed update either changed
 * nothing, or failed in its tail (eng_group.tail), whose new params the
 * staging buffers keep: every other update is held back until its retry
 * (parked). An idle update (update_group) has no new params. */
static void after_update(ferry_engine *e, uint32_t g, int rc, int idle) {
  eng_group *gr = &e->gt.groups[g];
  eng_stepper *st = &e->stepper;
  pthread_mutex_lock(&e->mu);
  if (!rc) group_set_state(e, g, GROUP_UPDATED);
  if (e->param_home != FERRY_TIER_DEVICE && !idle) {
    wait_released(e, gr);
    if (!rc) {
      pthread_mutex_unlock(&e->mu);
      rc = param_commit(e, g);
      pthread_mutex_lock(&e->mu);
    }
  }
  if (rc) {
    pthread_mutex_lock(&e->err.mu); /* its message, for a later report */
    snprintf(st->fail_why, sizeof st->fail_why, "%s", e->err.msg);
    pthread_mutex_unlock(&e->err.mu);
    if (!st->status) st->status = rc;
    if (gr->tail) st->parked = g, st->park_status = rc;
  } else {
    gr->tail = GROUP_TAIL_NONE;
    if (st->parked == (int64_t)g) st->parked = -1;
  }
  finish_group(e, g, rc);
  pthread_mutex_unlock(&e->mu);
}

/* Group g's update while another group's tail is pending (parked): it
 * fails with that failure's status before it changes anything (it keeps
 * its grads), and runs at the retry. */
static void hold_back(ferry_engine *e, uint32_t g) {
  staged(e, g);
  pthread_mutex_lock(&e->mu);
  if (!e->stepper.status) e->stepper.status = e->stepper.park_status;
  finish_group(e, g, e->stepper.park_status);
  pthread_mutex_unlock(&e->mu);
}

/* The stepper thread: updates queued groups in order and says after each. */
static void *stepper_main(void *arg) {
  ferry_engine *e = arg;
  eng_stepper *st = &e->stepper;
  uint32_t ng = e->gt.ngroups;
  pthread_mutex_lock(&e->mu);
  for (;;) {
    while (st->head == st->tail && !st->stop) pthread_cond_wait(&st->cv, &e->mu);
    if (st->head == st->tail) break;
    uint32_t g = st->queue[st->head++ % ng];
    /* the next to prefetch: queued already, or (eager: backward order) g-1 */
    uint32_t next = st->head != st->tail ? st->queue[st->head % ng]
                    : e->eager           ? (g > 0 ? g - 1 : UINT32_MAX)
                    : g + 1 < ng         ? g + 1
                                         : UINT32_MAX;
    float gscale = st->gscale;
    if (st->parked >= 0 && st->parked != (int64_t)g) {
      pthread_mutex_unlock(&e->mu);
      hold_back(e, g);
      pthread_mutex_lock(&e->mu);
      continue;
    }
    pthread_mutex_unlock(&e->mu);
    int idle = 0;
    int rc = update_group(e, g, next, gscale, &idle); /* groups are independent */
    after_update(e, g, rc, idle);
    pthread_mutex_lock(&e->mu);
  }
  pthread_mutex_unlock(&e->mu);
  return NULL;
}

void stepper_queue(ferry_engine *e, uint32_t g, const void *grads) {
  group_set_state(e, g, GROUP_QUEUED);
  if (grads) e->stepper.lent[g] = grads; /* a retry keeps what it was lent */
  e->stepper.queue[e->stepper.tail++ % e->gt.ngroups] = g;
  e->stepper.pending++;
  pthread_cond_broadcast(&e->stepper.cv);
}

int stepper_retry_failed(ferry_engine *e) {
  int retried = 0;
  pthread_mutex_lock(&e->mu);
  int64_t parked = e->stepper.parked; /* its tail first: it holds the staging buffers */
  if (parked >= 0 && e->gt.groups[parked].state == GROUP_FAILED) {
    stepper_queue(e, (uint32_t)parked, NULL);
    retried = 1;
  }
  for (uint32_t g = 0; g < e->gt.ngroups; g++)
    if (e->gt.groups[g].state == GROUP_FAILED) {
      stepper_queue(e, g, NULL);
      retried = 1;
    }
  pthread_mutex_unlock(&e->mu);
  return retried;
}

int stepper_wait_all(ferry_engine *e) {
  pthread_mutex_lock(&e->mu);
  while (e->stepper.pending) pthread_cond_wait(&e->stepper.cv, &e->mu);
  int rc = e->stepper.status;
  e->stepper.status = 0;
  pthread_mutex_unlock(&e->mu);
  return rc;
}

int stepper_wait_group(ferry_engine *e, uint32_t g) {
  eng_group *gr = &e->gt.groups[g];
  pthread_mutex_lock(&e->mu);
  while (group_pending(gr)) pthread_cond_wait(&e->stepper.cv, &e->mu);
  int rc = gr->state == GROUP_FAILED ? gr->fail_status : 0;
  if (rc) e->stepper.status = 0; /* reported here: the next ferry_step retries */
  pthread_mutex_unlock(&e->mu);
  return rc;
}

void stepper_wait_change_for(ferry_engine *e, double seconds) {
  struct timespec ts;
  ferry_deadline_after(CLOCK_REALTIME, seconds, &ts);
  pthread_cond_timedwait(&e->stepper.cv, &e->mu, &ts);
}

int stepper_holds_grads(const ferry_engine *e, uint32_t g) { return e->stepper.lent[g] != NULL; }
void stepper_set_gscale(ferry_engine *e, float gscale) { e->stepper.gscale = gscale; }
void stepper_wake(ferry_engine *e) { pthread_cond_broadcast(&e->stepper.cv); }
void stepper_wait_change(ferry_engine *e) { pthread_cond_wait(&e->stepper.cv, &e->mu); }
int64_t stepper_waits_for(const ferry_engine *e) { return e->stepper.waits_for; }
int stepper_busy(const ferry_engine *e) { return e->stepper.pending != 0; }
ferry_event *stepper_uploaded(const ferry_engine *e, uint32_t g) { return e->stepper.uploaded[g]; }

void stepper_abandon_releases(ferry_engine *e) {
  e->stepper.released = 1;
  pthread_cond_broadcast(&e->stepper.cv);
  if (e->mem) ferry_mem_notify(e->mem); /* a commit waiting on the manager gives up */
}

void stepper_fail_why(ferry_engine *e, char *out, size_t cap) {
  pthread_mutex_lock(&e->mu);
  snprintf(out, cap, "%s", e->stepper.fail_why);
  pthread_mutex_unlock(&e->mu);
}
