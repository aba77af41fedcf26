/* optim/kernels.h — the contract between the optimizer and its kernels (CPU
 * and CUDA): per-step scalars, the tile, buffer element types. A face of
 * optim/ with optim.h, whose kernel tables take these types (bench_adam
 * times the kernels alone). Plain C types only, so nvcc can include it.
 */
#ifndef FERRY_OPTIM_KERNELS_H
#define FERRY_OPTIM_KERNELS_H

#include "ferry.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* SIMD levels, in order of preference. */
enum { OPTIM_SIMD_SCALAR = 0, OPTIM_SIMD_AVX2 = 1, OPTIM_SIMD_AVX512 = 2, OPTIM_SIMD_COUNT = 3 };

/* Everything a kernel needs that is the same for every element of a step.
 * Derived once per step from the hyper-parameters and the step count, so the
 * scalar reference and the SIMD kernels perform the same operations in the
 * same order (bit-exact results in fp32). */
typedef struct {
  int type;           /* FERRY_OPTIM_* */
  float gscale;       /* gradient multiplier: 1/loss_scale x clip coefficient */
  float lr;           /* learning rate of this step */
  float beta1, beta2; /* Adam/LAMB/Lion betas; SGD: momentum in beta1 */
  float omb1, omb2;   /* 1 - beta1, 1 - beta2 */
  float eps;
  float wd;           /* weight decay (L2 for Adam, Adagrad, SGD; LAMB's term) */
  float decay;        /* 1 - lr * wd: decoupled decay (AdamW, Lion) */
  float neg_step;     /* -lr / (1 - beta1^t) (Adam/AdamW); -lr (SGD, Lion, LAMB);
                         -lr / (1 + (t - 1) lr_decay) (Adagrad) */
  float inv_bc1;      /* 1 / (1 - beta1^t) (LAMB) */
  float inv_sqrt_bc2; /* 1 / sqrt(1 - beta2^t) */
  float mom_c;        /* SGD: momentum, or 0 on the first step */
  float damp_c;       /* SGD: 1 - dampening, or 1 on the first step */
  int sgd_momentum;   /* SGD: a momentum buffer is used */
  int nesterov;       /* SGD */
  int native_bf16;    /* AVX-512: use the AVX512-BF16 conversion instruction */
  uint32_t sr_key;    /* bf16 master: stochastic-rounding key of this step
                         (optim_sr_key(seed, step), optim/quant_impl.h) */
} optim_scalars;

/* Element types of the buffers of a tile: ferry_dtype (include/ferry.h). */

/* A contiguous run of elements of one tensor. Pointers are already offset to
 * the run's first element; none needs any alignment beyond its type's. */
typedef struct {
  void *p;       /* master (mdt: fp32, or bf16 params), read and written */
  const void *g; /* gradient, gdt */
  void *s1;      /* m / momentum buffer / Adagrad sum, sdt (NULL when unused) */
  void *s2;      /* v (Adam, AdamW, LAMB), sdt */
  void *pc;      /* 16-bit copy of the updated params, cdt; NULL when none */
  size_t n;
  int gdt, sdt, cdt;
  float trust; /* LAMB phase 2: trust ratio of this tensor */
  int mdt;     /* master: FERRY_DT_F32 (0 reads as it) or FERRY_DT_BF16 */
  uint64_t index; /* bf16 master: stochastic-rounding counter of element 0 */
  /* int8 states (sdt FERRY_DT_I8): s1/s2 point at the tile's first code, a1/a2
   * at the absmax of its first block; the tile starts at a block boundary. */
  size_t block; /* elements per absmax block */
  float *a1, *a2;
} optim_tile;

/* ---- CUDA AdamW (adamw_cuda.cu, or cuda_none.c) ------------------------ */

/* AdamW/Adam over device pointers with the same math as the CPU kernels, on
 * stream (a cudaStream_t, NULL = default). FERRY_ENOTSUP when not built. */
int optim_cuda_step(const optim_scalars *s, const optim_tile *t, void *stream, char *why,
                    size_t why_len);
/* Before a step's first launch: clears an error an earlier CUDA call left
 * behind (its caller has it), then fails (FERRY_ENODEV, why) when the
 * device or stream has failed already (a sticky error: every later call
 * fails too). FERRY_ENOTSUP when not built. */
int optim_cuda_ready(void *stream, char *why, size_t why_len);

#define OPTIM_CUDA_THREADS 256  /* a thread per element (fp32 and bf16 states) */
#define OPTIM_CUDA_QTHREADS 256 /* int8 states: a block of threads per absmax block */
#define OPTIM_CUDA_BLOCKS_MAX (65535 * 8) /* fp32 and bf16 states: a grid-stride loop beyond */

/* The grid of optim_cuda_step over n elements of states sdt (int8: absmax
 * blocks of `block`): its blocks and threads, or 0 when one grid cannot
 * hold it (int8: more than 2^31 - 1 absmax blocks). Plain C: the step
 * checks every span's launch with it before its first launch. */
static inline int optim_cuda_grid(size_t n, int sdt, size_t block, int *blocks, int *threads) {
  if (sdt == FERRY_DT_I8) {
    size_t nb = block ? (n + block - 1) / block : 0;
    if (!block || nb > 0x7FFFFFFFu) return 0;
    *blocks = (int)nb;
    *threads = OPTIM_CUDA_QTHREADS;
  } else {
    size_t want = (n + OPTIM_CUDA_THREADS - 1) / OPTIM_CUDA_THREADS;
    *blocks = want > (size_t)OPTIM_CUDA_BLOCKS_MAX ? OPTIM_CUDA_BLOCKS_MAX : (int)want;
    *threads = OPTIM_CUDA_THREADS;
  }
  return 1;
}

#ifdef __cplusplus
}
#endif

#endif /* FERRY_OPTIM_KERNELS_H */
