/* offload/gpu.c — the engine's leaf operations on grads and optimizer state
 * that live on a real GPU (placement.optimizer = "gpu" on cuda, see
 * engine_gpu_math): the drain's accumulation and sums of squares (CUDA
 * kernels of optim/grad_cuda.h), the CUDA AdamW fused with the param copy,
 * zeroing, master-to-param conversion, and the copies that bring initial
 * values in and masters out. Everything is enqueued on e->down, so the
 * device math runs in the order the drain and the stepper hand it in; the
 * host side never dereferences device memory. The host backend never comes
 * here: its emulated device memory is the CPU kernels'. Compact optimizer
 * state passes through as it is (the CUDA kernels take bf16 and int8
 * states); with a bf16 master there is no master: the kernel updates the
 * device params in place (device home) or a device scratch filled from the
 * staged params (host and NVMe homes). Uses group.c's table only; the
 * stepper hands in its staging and spans.
 */
#include "offload/engine_impl.h"
#include "optim/grad_cuda.h"
#include "core/dtype.h"

#include <stdlib.h>

#include <math.h>

static int dev_err(ferry_engine *e, int rc, const char *what) {
  return ferry_err(&e->err, rc, "%s: %s", what, ferry_device_last_error(e->dev));
}

size_t gpu_own_dev_bytes(const ferry_engine *e) {
  if (!engine_gpu_math(e)) return 0;
  size_t sums = ferry_align_up(ENGINE_DRAIN_STAGES * e->gt.max_count * sizeof(double), 256);
  size_t b = ferry_align_up(OPTIM_CUDA_SUMSQ_BLOCKS * sizeof(double), 256) + sums;
  if (e->param_home != FERRY_TIER_DEVICE)
    b += ferry_align_up(ferry_align_up(e->gt.max_group_n * e->esize, 4096), 256);
  return b;
}

size_t gpu_own_host_bytes(const ferry_engine *e) {
  return engine_gpu_math(e) ? ENGINE_DRAIN_STAGES * e->gt.max_count * sizeof(double) : 0;
}

int gpu_init(ferry_engine *e) {
  if (!engine_gpu_math(e)) return FERRY_OK;
  eng_gpu *gp = &e->gpu;
  size_t nsums = gpu_own_host_bytes(e);
  int rc = ferry_stream_native(e->down, &gp->stream);
  if (!rc && !gp->stream) rc = FERRY_ENOTSUP; /* not a CUDA stream */
  if (!rc)
    rc = ferry_device_alloc(e->dev, OPTIM_CUDA_SUMSQ_BLOCKS * sizeof(double),
                            (void **)&gp->partials);
  if (!rc) rc = ferry_device_alloc(e->dev, nsums, (void **)&gp->dsums);
  if (!rc) rc = ferry_host_alloc(e->dev, nsums, (void **)&gp->hsums);
  if (!rc && e->param_home != FERRY_TIER_DEVICE)
    rc = ferry_device_alloc(e->dev, ferry_align_up(e->gt.max_group_n * e->esize, 4096),
                            &gp->params);
  if (!rc && e->param_home != FERRY_TIER_DEVICE)
    rc = ferry_event_create(e->dev, &gp->home_done);
  return rc ? dev_err(e, rc, "finalize: device math buffers") : FERRY_OK;
}

void gpu_free(ferry_engine *e) {
  eng_gpu *gp = &e->gpu;
  if (!e->dev) return;
  if (gp->partials) ferry_device_free(e->dev, gp->partials);
  if (gp->dsums) ferry_device_free(e->dev, gp->dsums);
  if (gp->hsums) ferry_host_free(e->dev, gp->hsums);
  if (gp->params) ferry_device_free(e->dev, gp->params);
  ferry_event_destroy(gp->home_done);
}

int gpu_upload_f32(ferry_engine *e, float *dst, const float *src, size_t n) {
  int rc = ferry_memcpy_async(e->down, dst, src, n * sizeof(float), FERRY_COPY_H2D);
  if (!rc) rc = ferry_stream_synchronize(e->down); /* src is the caller's, pageable */
  return rc ? dev_err(e, rc, "finalize: initial values") : FERRY_OK;
}

int gpu_read_f32(ferry_engine *e, float *dst, const float *src, size_t n) {
  int rc = ferry_memcpy_async(e->down, dst, src, n * sizeof(float), FERRY_COPY_D2H);
  if (!rc) rc = ferry_stream_synchronize(e->down);
  return rc ? dev_err(e, rc, "param read") : FERRY_OK;
}

int gpu_zero(ferry_engine *e, void *dst, size_t bytes) {
  int rc = ferry_memset_async(e->down, dst, 0, bytes);
  return rc ? dev_err(e, rc, "zero grads") : FERRY_OK;
}

void gpu_param_dsts(ferry_engine *e, uint32_t g, void **dst) {
  for (uint32_t k = 0; k < e->gt.groups[g].count; k++) {
    eng_param *p = group_param(e, g, k);
    if (e->param_home == FERRY_TIER_DEVICE)
      ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_PARAM], FERRY_TIER_DEVICE, &dst[k]);
    else
      dst[k] = (char *)e->gpu.params + p->goff * e->esize;
  }
}

int gpu_params_home(ferry_engine *e, uint32_t g, const gpu_home *home) {
  eng_group *gr = &e->gt.groups[g];
  int rc;
  if (e->param_home == FERRY_TIER_DEVICE) {
    rc = ferry_event_record(home->uploaded, e->down); /* the next fetch waits for it */
  } else {
    rc = ferry_memcpy_async(e->down, home->stage, e->gpu.params, gr->n * e->esize,
                            FERRY_COPY_D2H);
    /* param_commit copies it on the CPU: wait for this copy, not for the
     * drain's work enqueued on e->down since (other groups' grads) */
    if (!rc) rc = ferry_event_record(e->gpu.home_done, e->down);
    if (!rc) rc = ferry_event_synchronize(e->gpu.home_done);
  }
  return rc ? dev_err(e, rc, "step: params") : FERRY_OK;
}

int gpu_write_params(ferry_engine *e, uint32_t g, void **dst, const float *vals,
                     const gpu_home *home) {
  int rc = FERRY_OK;
  if (vals) { /* a bf16 master: the initial values, converted here and copied H2D */
    eng_group *gr = &e->gt.groups[g];
    char *h = malloc(gr->n * e->esize);
    if (!h) return ferry_err(&e->err, FERRY_ENOMEM, "finalize: out of memory");
    for (size_t i = 0; i < gr->n; i++) ferry_dt_store(h, e->dtype, i, vals[i]);
    for (uint32_t k = 0; k < gr->count && !rc; k++) {
      eng_param *p = group_param(e, g, k);
      rc = ferry_memcpy_async(e->down, dst[k], h + p->goff * e->esize, p->n * e->esize,
                              FERRY_COPY_H2D);
    }
    if (!rc) rc = ferry_stream_synchronize(e->down); /* h is pageable and freed now */
    free(h);
    if (rc) return dev_err(e, rc, "finalize: params from the initial values");
    return gpu_params_home(e, g, home);
  }
  for (uint32_t k = 0; k < e->gt.groups[g].count && !rc; k++) {
    eng_param *p = group_param(e, g, k);
    float *master;
    ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_MASTER], FERRY_TIER_DEVICE, (void **)&master);
    rc = ferry_convert_async(e->down, dst[k], e->dtype, master, FERRY_DT_F32, p->n, 1.0f);
  }
  if (rc) return dev_err(e, rc, "finalize: params from the masters");
  return gpu_params_home(e, g, home);
}

int gpu_stage_params(ferry_engine *e, uint32_t g, const void *stage) {
  /* stream order: the kernel after it, then gpu_params_home's D2H into
   * the same staging */
  int rc = ferry_memcpy_async(e->down, e->gpu.params, stage,
                              e->gt.groups[g].n * e->esize, FERRY_COPY_H2D);
  return rc ? dev_err(e, rc, "step: params") : FERRY_OK;
}

int gpu_optimizer_step(ferry_engine *e, const ferry_optim_span *spans, uint32_t ns, float gscale,
                       const int64_t *counts) {
  int rc = optim_step_cuda_counts(e->opt, spans, ns, gscale, counts, e->gpu.stream);
  if (rc) return ferry_err(&e->err, rc, "step: optimizer: %s", ferry_optimizer_last_error(e->opt));
  return FERRY_OK;
}

int gpu_drain_enqueue(ferry_engine *e, uint32_t g, const void *grads, int stage, int last) {
  eng_group *gr = &e->gt.groups[g];
  float scale = 1.0f / (float)e->cv->grad_accumulation;
  double *sums = e->gpu.dsums + (size_t)stage * e->gt.max_count;
  char why[256] = "";
  int rc = FERRY_OK;
  for (uint32_t k = 0; k < gr->count && !rc; k++) {
    eng_param *p = group_param(e, g, k);
    float *acc;
    ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_GRAD], FERRY_TIER_DEVICE, (void **)&acc);
    rc = optim_cuda_accumulate(acc, (const char *)grads + p->goff * e->esize, e->dtype, p->n,
                               scale, e->gpu.stream, why, sizeof why);
    if (!rc && last)
      rc = optim_cuda_sumsq(acc, FERRY_DT_F32, p->n, e->gpu.partials, sums + k, e->gpu.stream,
                            why, sizeof why);
  }
  if (rc) return ferry_err(&e->err, rc, "drain: %s", why);
  if (last) {
    rc = ferry_memcpy_async(e->down, e->gpu.hsums + (size_t)stage * e->gt.max_count, sums,
                            gr->count * sizeof(double), FERRY_COPY_D2H);
    if (rc) return dev_err(e, rc, "drain");
  }
  return FERRY_OK;
}

double gpu_drain_sumsq(ferry_engine *e, uint32_t g, int stage) {
  const double *h = e->gpu.hsums + (size_t)stage * e->gt.max_count;
  double s = 0;
  for (uint32_t k = 0; k < e->gt.groups[g].count; k++) s += h[k];
  return s;
}
