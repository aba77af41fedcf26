/* bench/bench_copy.c — `ferry bench copy`: host<->device copy bandwidth on
 * the chosen backend (H2D, D2H, and both at once on two streams), from
 * pinned host memory. Validates the bytes of one round trip, then times.
 */
#include "bench/bench.h"
#include "bench/json.h"

#include "ferry.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f) {
  fprintf(f,
          "usage: ferry bench copy [--device auto|host|cuda] [--size SIZE] [--iters N] [--json]\n"
          "\n"
          "Measures copies between pinned host memory and device memory: H2D, D2H, and\n"
          "H2D and D2H at once on two streams (bidirectional). The bytes of one round\n"
          "trip are checked first; then each direction is timed over N iterations and\n"
          "the median is reported.\n"
          "\n"
          "  --device KIND  backend (default auto: cuda when a GPU is present, else host)\n"
          "  --size SIZE    bytes per copy (default 256M)\n"
          "  --iters N      timed iterations per direction (default 5)\n"
          "  --json         one JSON object per direction: bench, device, direction,\n"
          "                 bytes, seconds, gb_per_s\n");
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

#define TRY(call)                                                                        \
  do {                                                                                   \
    int rc_ = (call);                                                                    \
    if (rc_) {                                                                           \
      fprintf(stderr, "ferry bench copy: %s: %s: %s\n", #call, ferry_strerror(rc_),      \
              dev ? ferry_device_last_error(dev) : ferry_last_error());                  \
      goto out;                                                                          \
    }                                                                                    \
  } while (0)

int ferry_bench_copy_main(int argc, char **argv) {
  ferry_device_kind kind = FERRY_DEVICE_AUTO;
  uint64_t size = 256ull << 20;
  int iters = 5, json = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--json")) json = 1;
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--device") && v) {
      i++;
      if (!strcmp(v, "auto")) kind = FERRY_DEVICE_AUTO;
      else if (!strcmp(v, "host")) kind = FERRY_DEVICE_HOST;
      else if (!strcmp(v, "cuda")) kind = FERRY_DEVICE_CUDA;
      else {
        fprintf(stderr, "ferry bench copy: --device must be auto, host or cuda, not '%s'\n", v);
        return 2;
      }
    } else if (!strcmp(a, "--size") && v) {
      i++;
      if (ferry_parse_size(v, &size) || size == 0) {
        fprintf(stderr, "ferry bench copy: --size '%s' is not a size such as 256M\n", v);
        return 2;
      }
    } else if (!strcmp(a, "--iters") && v) {
      i++;
      iters = atoi(v);
      if (iters < 1 || iters > 1000) {
        fprintf(stderr, "ferry bench copy: --iters must be 1..1000\n");
        return 2;
      }
    } else {
      fprintf(stderr, "ferry bench copy: unknown or incomplete option '%s'\n", a);
      usage(stderr);
      return 2;
    }
  }

  int ret = 1;
  ferry_device *dev = NULL;
  ferry_device_config cfg = ferry_device_config_default();
  cfg.kind = kind;
  cfg.capacity = (size_t)size * 2 + (1u << 20);
  unsigned char *h_in = NULL, *h_out = NULL, *d_a = NULL, *d_b = NULL;
  ferry_stream *s1 = NULL, *s2 = NULL;
  ferry_event *e0 = NULL, *e1 = NULL;
  double *t = calloc((size_t)iters, sizeof *t);
  if (!t) return 1;
  TRY(ferry_device_create(&cfg, &dev));
  ferry_device_info info;
  TRY(ferry_device_get_info(dev, &info));
  TRY(ferry_host_alloc(dev, size, (void **)&h_in));
  TRY(ferry_host_alloc(dev, size, (void **)&h_out));
  TRY(ferry_device_alloc(dev, size, (void **)&d_a));
  TRY(ferry_device_alloc(dev, size, (void **)&d_b));
  TRY(ferry_stream_create(dev, &s1));
  TRY(ferry_stream_create(dev, &s2));
  TRY(ferry_event_create(dev, &e0));
  TRY(ferry_event_create(dev, &e1));

  /* validate: a round trip returns every byte */
  for (uint64_t i = 0; i < size; i++) h_in[i] = (unsigned char)(i * 2654435761u >> 13);
  memset(h_out, 0, size);
  TRY(ferry_memcpy_async(s1, d_a, h_in, size, FERRY_COPY_H2D));
  TRY(ferry_memcpy_async(s1, h_out, d_a, size, FERRY_COPY_D2H));
  TRY(ferry_stream_synchronize(s1));
  if (memcmp(h_in, h_out, size)) {
    fprintf(stderr, "ferry bench copy: validation failed: the round trip changed bytes\n");
    goto out;
  }

  static const char *names[] = {"h2d", "d2h", "bidirectional"};
  for (int dir = 0; dir < 3; dir++) {
    for (int it = -1; it < iters; it++) { /* it = -1: untimed warm-up */
      double t0 = now();
      if (dir == 0 || dir == 2) TRY(ferry_memcpy_async(s1, d_a, h_in, size, FERRY_COPY_H2D));
      if (dir == 1 || dir == 2) TRY(ferry_memcpy_async(s2, h_out, d_b, size, FERRY_COPY_D2H));
      TRY(ferry_stream_synchronize(s1));
      TRY(ferry_stream_synchronize(s2));
      if (it >= 0) t[it] = now() - t0;
    }
    qsort(t, (size_t)iters, sizeof *t, cmp_d);
    double sec = t[iters / 2];
    uint64_t bytes = dir == 2 ? 2 * size : size;
    double gbs = (double)bytes / sec / 1e9;
    if (json) {
      json_out j;
      json_begin(&j, stdout);
      json_str(&j, "bench", "copy");
      json_str(&j, "device", info.name);
      json_str(&j, "direction", names[dir]);
      json_uint(&j, "bytes", bytes);
      json_num(&j, "seconds", sec);
      json_num(&j, "gb_per_s", gbs);
      json_int(&j, "iters", iters);
      json_end(&j);
    } else {
      printf("copy %-13s %s: %llu bytes in %.4f s = %.2f GB/s (median of %d)\n", names[dir],
             info.name, (unsigned long long)bytes, sec, gbs, iters);
    }
  }
  ret = 0;
out:
  free(t);
  ferry_device_destroy(dev);
  return ret;
}
