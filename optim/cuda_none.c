/* optim/cuda_none.c — stands in for optim/adamw_cuda.cu and
 * optim/reduce_cuda.cu when ferry is built without CUDA: the device AdamW
 * and gradient helpers report "not supported".
 */
#include "optim/grad_cuda.h"
#include "optim/optim.h"

#include <stdio.h>

static int no_cuda(char *why, size_t why_len) {
  snprintf(why, why_len, "this ferry was built without CUDA (FERRY_CUDA=OFF or no nvcc)");
  return FERRY_ENOTSUP;
}

int optim_cuda_step(const optim_scalars *s, const optim_tile *t, void *stream, char *why,
                    size_t why_len) {
  (void)s;
  (void)t;
  (void)stream;
  return no_cuda(why, why_len);
}

int optim_cuda_ready(void *stream, char *why, size_t why_len) {
  (void)stream;
  return no_cuda(why, why_len);
}

int optim_cuda_accumulate(float *acc, const void *g, int dt, size_t n, float scale, void *stream,
                          char *why, size_t why_len) {
  (void)acc, (void)g, (void)dt, (void)n, (void)scale, (void)stream;
  return no_cuda(why, why_len);
}

int optim_cuda_sumsq(const void *g, int dt, size_t n, double *partials, double *out, void *stream,
                     char *why, size_t why_len) {
  (void)g, (void)dt, (void)n, (void)partials, (void)out, (void)stream;
  return no_cuda(why, why_len);
}
