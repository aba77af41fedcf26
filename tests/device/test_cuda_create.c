/* tests/device/test_cuda_create.c — creating a cuda device. Without a GPU
 * (or without a usable driver) it fails with FERRY_ENODEV, and the message
 * carries the CUDA runtime's own words for why; with one it succeeds and
 * names the GPU. A build without the CUDA backend answers FERRY_ENOTSUP.
 * Runs everywhere: nothing here needs a GPU to be checked.
 */
#include "ferry.h"
#include "tests/test.h"

#include <string.h>

#ifdef FERRY_HAVE_CUDA
#include <cuda_runtime.h>
#endif

int main(void) {
  ferry_device_config c = ferry_device_config_default();
  c.kind = FERRY_DEVICE_CUDA;
  c.capacity = 1 << 20;
  ferry_device *d = (ferry_device *)1;
  int rc = ferry_device_create(&c, &d);
  printf("cuda device create: %s: %s\n", ferry_strerror(rc), rc ? ferry_last_error() : "ok");
#ifdef FERRY_HAVE_CUDA
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    EXPECT_EQ_INT(rc, FERRY_ENODEV);
    EXPECT(d == NULL);
    if (e != cudaSuccess) {
      EXPECT(strstr(ferry_last_error(), cudaGetErrorString(e)) != NULL);
      EXPECT(strstr(ferry_last_error(), cudaGetErrorName(e)) != NULL);
    }
    /* Auto falls back to the host backend and says why. */
    c.kind = FERRY_DEVICE_AUTO;
    EXPECT(ferry_device_create(&c, &d) == 0 && d != NULL);
    ferry_device_info info;
    EXPECT(ferry_device_get_info(d, &info) == 0 && info.kind == FERRY_DEVICE_HOST);
    ferry_device_destroy(d);
  } else {
    EXPECT_EQ_INT(rc, 0);
    REQUIRE(d != NULL);
    ferry_device_info info;
    EXPECT(ferry_device_get_info(d, &info) == 0 && info.kind == FERRY_DEVICE_CUDA);
    EXPECT(!info.emulated && info.name[0] != '\0' && info.capacity == (size_t)1 << 20);
    printf("device: %s, %zu bytes total, %zu free\n", info.name, info.total_memory,
           info.free_memory);
    /* An ordinal past the last device: FERRY_ENODEV, saying how many there are. */
    ferry_device *d2 = NULL;
    c.cuda_ordinal = n;
    EXPECT(ferry_device_create(&c, &d2) == FERRY_ENODEV && d2 == NULL);
    EXPECT(strstr(ferry_last_error(), "does not exist") != NULL);
    ferry_device_destroy(d);
  }
#else
  EXPECT_EQ_INT(rc, FERRY_ENOTSUP);
  EXPECT(d == NULL);
#endif
  return test_finish("test_cuda_create");
}
