/* examples/gpt/gpt_init.h — the seeded init of the weights, on the CPU
 * (init.c) and on a CUDA device (init_cuda.cu), giving the same values bit
 * for bit: GPT-2 style, norm weights 1, biases 0, residual projections
 * (c_proj / o_proj / down_proj weights) normal with std 0.02 / sqrt(2 L),
 * every other tensor normal with std 0.02; the normals are gpt_rng.h's,
 * value k of tensor i a function of (seed, i, k) only.
 */
#ifndef FERRY_GPT_INIT_H
#define FERRY_GPT_INIT_H

#include "gpt.h"

#include <math.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { GPT_INIT_ZERO = 0, GPT_INIT_ONE = 1, GPT_INIT_NORMAL = 2 } gpt_init_kind;

/* How param i starts, and for GPT_INIT_NORMAL the fp32 scale each standard
 * normal is multiplied by (once, in fp32). */
static inline gpt_init_kind gpt_init_rule(const gpt_schema *s, int i, float *scale) {
  const gpt_param *q = &s->params[i];
  size_t n = strlen(q->name);
  int is_norm = q->ndim == 1 && (strstr(q->name, "ln_") || strstr(q->name, "norm"));
  int weight = n >= 7 && !strcmp(q->name + n - 7, ".weight");
  int bias = n >= 5 && !strcmp(q->name + n - 5, ".bias");
  int resid = strstr(q->name, "c_proj.weight") || strstr(q->name, "o_proj") ||
              strstr(q->name, "down_proj");
  *scale = resid ? 0.02f / sqrtf(2.0f * (float)s->cfg.n_layer) : 0.02f;
  if (is_norm && weight) return GPT_INIT_ONE;
  if (is_norm || bias) return GPT_INIT_ZERO;
  return GPT_INIT_NORMAL;
}

/* Values [first, first + n) of param i under seed (fp32), on this thread. */
void gpt_init_values(const gpt_schema *s, int i, uint64_t seed, size_t first, size_t n,
                     float *dst);
/* All of param i's values, split over `threads` threads (0: one per online
 * CPU; parts of at least 256 Ki values, so small tensors stay on the
 * caller's thread; a part that gets no thread runs on the caller's). */
void gpt_init_tensor(const gpt_schema *s, int i, uint64_t seed, float *dst, int threads);

/* The same values written on a CUDA device: dst is device memory of numel
 * elements of dtype (a ferry_dtype: FERRY_DT_F32, or FERRY_DT_BF16 /
 * FERRY_DT_F16, rounded to nearest even as gpt_f32_to_bf16 / gpt_f32_to_f16
 * round the CPU's values), enqueued on stream (a cudaStream_t; NULL: the
 * default stream). numel must be param i's. 0, or -1 with err set. Built
 * with the CUDA model only (ferry_gpt_cuda and its module). */
int gpt_cuda_init_tensor(void *dst, int dtype, size_t numel, const gpt_schema *s, int i,
                         uint64_t seed, void *stream, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_GPT_INIT_H */
