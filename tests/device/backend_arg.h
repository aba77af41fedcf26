/* tests/device/backend_arg.h — the backend a device test runs on, from its
 * first argument: "host", or "cuda" (exits 77 with the reason when the CUDA
 * backend is not compiled in or there is no CUDA device). */
#ifndef FERRY_TEST_BACKEND_ARG_H
#define FERRY_TEST_BACKEND_ARG_H

#include "ferry.h"
#include "tests/test.h"

#include <string.h>

/* 0 on an unknown name (the caller prints its usage). */
static inline int test_backend_arg(const char *which, ferry_device_kind *kind) {
  if (!strcmp(which, "host")) {
    *kind = FERRY_DEVICE_HOST;
    return 1;
  }
  if (strcmp(which, "cuda")) return 0;
  *kind = FERRY_DEVICE_CUDA;
  if (!ferry_cuda_compiled()) TEST_SKIP("the CUDA backend is not compiled into this build");
  ferry_gpu_info g[1];
  int n = 0;
  char why[256] = "";
  ferry_gpu_list(g, 1, &n, why, sizeof why);
  if (n == 0) TEST_SKIP("no CUDA device: %s", why);
  return 1;
}

#endif
