/* optim/optim.h — internal contracts of the CPU optimizers: the per-step
 * scalars every kernel reads, the tile a kernel works on, the table of kernels
 * one SIMD level provides (scalar reference, AVX2, AVX-512), and the
 * core-bound thread pool that runs tiles. A face of optim/: its tests and
 * bench_adam use it too.
 */
#ifndef FERRY_OPTIM_H
#define FERRY_OPTIM_H

#include "core/core.h"
#include "optim/kernels.h"

#include <stddef.h>
#include <stdint.h>

/* The kernels of one SIMD level. `step` runs every optimizer except LAMB's
 * first phase: for LAMB it is the second phase (apply trust x update). */
typedef struct {
  const char *name;
  void (*step)(const optim_scalars *s, const optim_tile *t);
  /* LAMB phase 1: update m and v, add sum(p^2) and sum(u^2) of this tile. */
  void (*lamb_phase1)(const optim_scalars *s, const optim_tile *t, double *p_sumsq,
                      double *u_sumsq);
  /* Adds sum(g^2) (in double) of n elements of dtype dt; a non-finite sum
   * means an inf or NaN among them. */
  double (*sumsq)(const void *g, int dt, size_t n);
  /* acc[i] += scale * g[i] */
  void (*accumulate)(float *acc, const void *g, int dt, size_t n, float scale);
} optim_kernels;

extern const optim_kernels optim_kernels_scalar;
extern const optim_kernels optim_kernels_avx2;
extern const optim_kernels optim_kernels_avx512;

/* The table of a level, or NULL when this CPU cannot run it. */
const optim_kernels *optim_kernels_get(int level);
/* "scalar", "avx2", "avx512" -> level; -1 when unknown. */
int optim_simd_parse(const char *name);
/* The best level this CPU runs, after FERRY_SIMD when set (a forced level
 * the CPU lacks yields -1). */
int optim_simd_default(void);

/* ferry_optimizer_step and ferry_optimizer_step_cuda with a step count per
 * span: span i's bias correction (and rounding key) is at step counts[i] + 1,
 * and the optimizer's own count stays as it is. One call for spans whose
 * counts differ (params left out of earlier steps): every span and count is
 * checked before anything changes, so a failure leaves every span as it
 * was. counts NULL: FERRY_EINVAL. */
int optim_step_counts(ferry_optimizer *o, const ferry_optim_span *spans, size_t count,
                      float grad_scale, const int64_t *counts);
int optim_step_cuda_counts(ferry_optimizer *o, const ferry_optim_span *spans, size_t count,
                           float grad_scale, const int64_t *counts, void *cuda_stream);

/* The CUDA step's two calls (kernels.h): optim_cuda_ready before the first
 * launch, optim_cuda_step for each span. */
typedef struct {
  int (*ready)(void *stream, char *why, size_t why_len);
  int (*launch)(const optim_scalars *s, const optim_tile *t, void *stream, char *why,
                size_t why_len);
} optim_cuda_ops;
/* Tests: the CUDA step calls ops instead (a build without CUDA runs the
 * step's checks and span bookkeeping on fakes); NULL: the real ones. */
void optim_set_cuda_ops(ferry_optimizer *o, const optim_cuda_ops *ops);

/* Fills the per-step scalars from the hyper-parameters for step t (>= 1). */
void optim_scalars_make(optim_scalars *s, const ferry_optimizer_config *cfg, float lr, int64_t t,
                        float gscale);

/* ---- thread pool ------------------------------------------------------- */

typedef struct optim_pool optim_pool;
typedef struct optim_job optim_job;

/* A job is a sequence of phases, each a parallel loop over tiles. The worker
 * that completes the last tile of a phase calls `phase_done`, which returns
 * the tile count of the next phase (0: the job is over); then `finished` is
 * called once, after which the pool no longer touches the job. */
struct optim_job {
  size_t ntiles;
  void (*tile)(optim_job *j, size_t tile, int worker);
  size_t (*phase_done)(optim_job *j); /* may be NULL: one phase */
  void (*finished)(optim_job *j);
  /* pool-private */
  size_t next, done;
  optim_job *link;
};

/* threads <= 0: one per core. bind: pin worker i to core i (mod cores) with
 * hwloc; failures to bind are logged, not fatal. */
int optim_pool_create(int threads, int bind, const ferry_logger *lg, optim_pool **out,
                      ferry_errbuf *err);
void optim_pool_destroy(optim_pool *p);
int optim_pool_threads(const optim_pool *p);
int optim_pool_bound(const optim_pool *p);
/* Queues the job; returns at once. A job with 0 tiles finishes at once
 * (phase_done still runs). */
void optim_pool_submit(optim_pool *p, optim_job *j);
/* Submits and waits for `finished`. Used by synchronous helpers. */
typedef void (*optim_for_fn)(void *arg, size_t tile, int worker);
void optim_pool_for(optim_pool *p, size_t ntiles, optim_for_fn fn, void *arg);

#endif /* FERRY_OPTIM_H */
