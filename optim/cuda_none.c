/* optim/cuda_none.c — stands in for optim/adamw_cuda.cu when ferry is built
 * without CUDA: the device AdamW reports "not supported".
 */
#include "optim/optim.h"

#include <stdio.h>

int optim_cuda_step(const optim_scalars *s, const optim_tile *t, void *stream, char *why,
                    size_t why_len) {
  (void)s;
  (void)t;
  (void)stream;
  snprintf(why, why_len, "this ferry was built without CUDA (FERRY_CUDA=OFF or no nvcc)");
  return FERRY_ENOTSUP;
}
