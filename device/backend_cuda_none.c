/* device/backend_cuda_none.c — what the CUDA entry points answer in a build
 * without the CUDA backend (no nvcc, or FERRY_CUDA=OFF).
 */
#include "core/core.h"

#include <stdio.h>

int ferry_cuda_compiled(void) { return 0; }

int ferry_gpu_list(ferry_gpu_info *out, int max, int *count, char *why, size_t why_len) {
  (void)out;
  (void)max;
  if (!count) return FERRY_EINVAL;
  *count = 0;
  if (why && why_len) snprintf(why, why_len, "the CUDA backend was not compiled into this build");
  return FERRY_OK;
}
