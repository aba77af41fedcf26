/* optim/grad_cuda.h — the gradient helpers as CUDA kernels, for grads that
 * stay on the device (the engine with placement.optimizer = "gpu"): the
 * same math as the CPU helpers (ferry_optimizer_grad_accumulate,
 * ferry_optimizer_grad_stats), on a cudaStream_t given as void *, over
 * device pointers, enqueued only (nothing waits). Without CUDA every call
 * is FERRY_ENOTSUP with the reason in `why` (optim/cuda_none.c).
 */
#ifndef FERRY_OPTIM_GRAD_CUDA_H
#define FERRY_OPTIM_GRAD_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Blocks of the sum of squares' first pass: the doubles its `partials`
 * scratch holds. Fixed, so the order of the additions (and the result's
 * bits) never depends on the GPU. */
#define OPTIM_CUDA_SUMSQ_BLOCKS 256

/* acc[i] = fmaf(g[i], scale, acc[i]) for i < n; g has dtype dt (FERRY_DT_F32,
 * _F16, _BF16). */
int optim_cuda_accumulate(float *acc, const void *g, int dt, size_t n, float scale, void *stream,
                          char *why, size_t why_len);
/* *out (device) = the sum of g[i]^2 over i < n in double (a non-finite sum:
 * an inf or NaN among them): per block in a fixed tree order into
 * partials[OPTIM_CUDA_SUMSQ_BLOCKS] (device scratch), then one block adds
 * those in a fixed order. */
int optim_cuda_sumsq(const void *g, int dt, size_t n, double *partials, double *out, void *stream,
                     char *why, size_t why_len);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_OPTIM_GRAD_CUDA_H */
