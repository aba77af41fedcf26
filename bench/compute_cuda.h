/* bench/compute_cuda.h — the cuda half of `ferry bench compute`
 * (bench/compute_cuda.c, built with CUDA): cuBLAS opened with dlopen,
 * buffers on GPU 0, a checked small product, timed GEMMs.
 */
#ifndef FERRY_BENCH_COMPUTE_CUDA_H
#define FERRY_BENCH_COMPUTE_CUDA_H

#include <stddef.h>

typedef struct compute_cuda compute_cuda;

/* 1 when a CUDA device is present. */
int compute_cuda_present(void);
/* cuBLAS, a handle, and three device buffers of `elems` elements (4 bytes
 * each, so bf16 and fp32 share them); device: "cuda: NAME". 0, or 1 with
 * the reason on stderr (prog names the command). */
int compute_cuda_open(compute_cuda **out, size_t elems, char *device, size_t dl,
                      const char *prog);
/* Small bf16 and fp32 products of every transpose against a C loop over
 * the same (rounded) inputs; *worst: the largest error relative to each
 * element's scale. 0, or 1 said. */
int compute_cuda_check(compute_cuda *c, double *worst, const char *prog);
/* The median seconds of the row-major product C[M,N] = op(A) op(B) (ta, tb:
 * transposed), bf16 or fp32, run until 0.3 s or iters runs after one
 * warm-up; < 0 on a CUDA error. */
double compute_cuda_time(compute_cuda *c, int fp32, int ta, int tb, long M, long N, long K,
                         int iters);
void compute_cuda_close(compute_cuda *c);

#endif
