/* tests/install/consumer/main.c — a program outside the ferry tree, built
 * against an installed copy: the header and the library agree on the
 * version, and a host device copies bytes there and back.
 */
#include <ferry.h>

#include <stdio.h>
#include <string.h>

#define N 4096

static int fail(const char *what, int rc, const char *msg) {
  fprintf(stderr, "consumer: %s failed: %s: %s\n", what, ferry_strerror(rc), msg);
  return 1;
}

int main(void) {
  if (strcmp(ferry_version(), FERRY_VERSION_STRING) != 0) {
    fprintf(stderr, "consumer: header says %s, library says %s\n", FERRY_VERSION_STRING,
            ferry_version());
    return 1;
  }
  ferry_device_config cfg = ferry_device_config_default();
  cfg.kind = FERRY_DEVICE_HOST;
  cfg.capacity = 1 << 20;
  ferry_device *dev = NULL;
  int rc = ferry_device_create(&cfg, &dev);
  if (rc) return fail("device create", rc, ferry_last_error());

  ferry_stream *s = NULL;
  unsigned char *in = NULL, *out = NULL;
  void *d = NULL;
  if ((rc = ferry_stream_create(dev, &s)) || (rc = ferry_host_alloc(dev, N, (void **)&in)) ||
      (rc = ferry_host_alloc(dev, N, (void **)&out)) || (rc = ferry_device_alloc(dev, N, &d))) {
    int r = fail("setup", rc, ferry_device_last_error(dev));
    ferry_device_destroy(dev);
    return r;
  }
  for (int i = 0; i < N; i++) in[i] = (unsigned char)(i * 7 + 3);
  memset(out, 0, N);
  if ((rc = ferry_memcpy_async(s, d, in, N, FERRY_COPY_H2D)) ||
      (rc = ferry_memcpy_async(s, out, d, N, FERRY_COPY_D2H)) ||
      (rc = ferry_stream_synchronize(s))) {
    int r = fail("copy", rc, ferry_device_last_error(dev));
    ferry_device_destroy(dev);
    return r;
  }
  int ok = memcmp(in, out, N) == 0;
  ferry_device_destroy(dev); /* frees the stream, the buffers and the arena */
  if (!ok) {
    fprintf(stderr, "consumer: bytes differ after H2D + D2H\n");
    return 1;
  }
  printf("consumer: ferry %s (cuda backend %s): %d bytes H2D + D2H on the host backend, "
         "all correct\n",
         ferry_version(), ferry_cuda_compiled() ? "compiled" : "not compiled", N);
  return 0;
}
