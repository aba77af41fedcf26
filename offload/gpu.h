/* offload/gpu.h — the gpu room's state and calls (gpu.c): the leaf
 * operations on grads and optimizer state that live on a real GPU (only
 * when engine_gpu_math; every call is stream-ordered on e->down). Included
 * through offload/engine_impl.h (e->gpu). It uses the group room; the
 * drain, the stepper and the engine call it.
 */
#ifndef FERRY_OFFLOAD_GPU_H
#define FERRY_OFFLOAD_GPU_H

#include "optim/optim.h"

/* What the CUDA path keeps beside the drain and the stepper (allocated at
 * finalize only when engine_gpu_math). */
typedef struct {
  void *stream;          /* (fixed) e->down's cudaStream_t: all device math runs on it */
  double *partials;      /* (fixed) device: the sum of squares' first pass */
  double *dsums;         /* (fixed) device: per drain stage, one sum per param of a group */
  double *hsums;         /* (fixed) pinned: their copies (the drain, after the stage's event) */
  void *params;          /* (fixed) device: a group's new params (host and NVMe param homes) */
  ferry_event *home_done; /* (fixed) host and NVMe homes: after the new params' D2H; recorded
                             and waited by finalize, then by the stepper alone */
} eng_gpu;

size_t gpu_own_dev_bytes(const ferry_engine *e);  /* its device scratch */
size_t gpu_own_host_bytes(const ferry_engine *e); /* its pinned sums */
int gpu_init(ferry_engine *e);                   /* finalize: stream, scratch */
void gpu_free(ferry_engine *e);
/* n floats H2D into device memory, then waits (finalize's initial values). */
int gpu_upload_f32(ferry_engine *e, float *dst, const float *src, size_t n);
/* n floats D2H from device memory, then waits (ferry_param_read). */
int gpu_read_f32(ferry_engine *e, float *dst, const float *src, size_t n);
int gpu_zero(ferry_engine *e, void *dst, size_t bytes);
/* Where group g's new params go and come home: the stepper's param
 * staging (host and NVMe param homes) and the event the next fetch of a
 * device-home group waits for. */
typedef struct {
  void *stage;
  ferry_event *uploaded;
} gpu_home;
/* Group g's params in their dtype from its device masters (or, a bf16
 * master, from vals: its fp32 initial values, goff-indexed, host memory)
 * into dst[k] per param (device memory), then gpu_params_home. */
int gpu_write_params(ferry_engine *e, uint32_t g, void **dst, const float *vals,
                     const gpu_home *home);
/* A bf16 master, host and NVMe param homes: the staged current params
 * (`stage`, the stepper's param staging) H2D into the device scratch the
 * kernel updates in place. */
int gpu_stage_params(ferry_engine *e, uint32_t g, const void *stage);
/* Where the optimizer writes group g's new params: the device params
 * (device home: fused, in place) or the device scratch (host homes). */
void gpu_param_dsts(ferry_engine *e, uint32_t g, void **dst);
/* Host and NVMe param homes: the scratch's new params D2H into the param
 * staging, then waits for that copy. Device home: records the group's
 * `uploaded`. */
int gpu_params_home(ferry_engine *e, uint32_t g, const gpu_home *home);
/* The CUDA AdamW over ns `spans` (params of one group) with grad scale
 * gscale, span i's bias correction at its param's step count counts[i]
 * (every span checked before the first launch). */
int gpu_optimizer_step(ferry_engine *e, const ferry_optim_span *spans, uint32_t ns, float gscale,
                       const int64_t *counts);
/* The drain: group g's grads (param dtype, device) scaled into its fp32
 * device grads; on the last micro-batch, each param's sum of squares into
 * drain stage `stage`'s sums, copied D2H. */
int gpu_drain_enqueue(ferry_engine *e, uint32_t g, const void *grads, int stage, int last);
/* After the stage's event: the group's sum of squares (params in order). */
double gpu_drain_sumsq(ferry_engine *e, uint32_t g, int stage);

#endif
