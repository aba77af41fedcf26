/* bench/bench_copy.c — `ferry bench copy`: host<->device copy bandwidth on
 * the chosen backend (H2D, D2H, and both at once on two streams), from
 * pinned host memory, at one or more sizes. Validates the bytes of one round
 * trip, then times. tools/cuda_peak.cu measures the same copies with the
 * CUDA runtime alone (the same sizes, directions, warm-up and median), so
 * tools/gpu_check.sh divides one by the other.
 */
#include "bench/args.h"
#include "bench/bench.h"
#include "core/core.h"
#include "bench/copy_opts.h"
#include "format/json_writer.h"

#include "ferry.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f) {
  fprintf(f,
          "usage: ferry bench copy [--device auto|host|cuda] [--size SIZE[,SIZE...]]\n"
          "                        [--direction h2d|d2h|both|all] [--iters N] [--json]\n"
          "\n"
          "Measures copies between pinned host memory and device memory: H2D, D2H, and\n"
          "H2D and D2H at once on two streams (bidirectional). The bytes of one round\n"
          "trip of the largest size are checked first; then each size and direction is\n"
          "timed over N iterations after one untimed warm-up, and the median is reported\n"
          "(wall time from the first enqueue to the end of the stream synchronize).\n"
          "\n"
          "  --device KIND    backend (default auto: cuda when a GPU is present, else host)\n"
          "  --size SIZES     bytes per copy, one size or a comma list (default 256M;\n"
          "                   e.g. 4M,64M,1G)\n"
          "  --direction DIR  h2d, d2h, both (bidirectional: H2D and D2H at once on two\n"
          "                   streams, bytes counted twice) or all (default)\n"
          "  --iters N        timed iterations per size and direction (default 5)\n"
          "  --json           one JSON object per size and direction: bench, device,\n"
          "                   direction (h2d, d2h, bidirectional), bytes, seconds,\n"
          "                   gb_per_s, iters\n");
}

/* On failure: says which call failed and returns 1 (the device's error
 * when there is one, dev being the caller's device). */
#define TRY(call)                                                                                  \
  do {                                                                                             \
    int rc_ = (call);                                                                              \
    if (rc_) {                                                                                     \
      fprintf(stderr, "ferry bench copy: %s: %s: %s\n", #call, ferry_strerror(rc_),                \
              dev ? ferry_device_last_error(dev) : ferry_last_error());                            \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

typedef struct {
  ferry_device_kind kind;
  copy_plan plan;
  int iters, json;
} copy_opts;

static int parse_size(const char *s, uint64_t *out) { return ferry_parse_size(s, out); }

/* Returns -1 to go on, or the exit code (0 after --help, 2 bad usage). */
static int parse_args(copy_opts *o, int argc, char **argv) {
  *o = (copy_opts){.kind = FERRY_DEVICE_AUTO,
                   .plan = {.sizes = {256ull << 20}, .nsizes = 1, .max_size = 256ull << 20, .dirs = 7},
                   .iters = 5};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--json"))
      o->json = 1;
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--device") && v) {
      i++;
      if (!strcmp(v, "auto"))
        o->kind = FERRY_DEVICE_AUTO;
      else if (!strcmp(v, "host"))
        o->kind = FERRY_DEVICE_HOST;
      else if (!strcmp(v, "cuda"))
        o->kind = FERRY_DEVICE_CUDA;
      else {
        fprintf(stderr, "ferry bench copy: --device must be auto, host or cuda, not '%s'\n", v);
        return 2;
      }
    } else if (!strcmp(a, "--size") && v) {
      i++;
      if (copy_parse_sizes(&o->plan, v, "ferry bench copy", parse_size)) return 2;
    } else if (!strcmp(a, "--direction") && v) {
      i++;
      if (copy_parse_direction(&o->plan, v, "ferry bench copy")) return 2;
    } else if (!strcmp(a, "--iters") && v) {
      i++;
      long long x;
      if (bench_arg_int("ferry bench copy", a, v, 1, 1000, NULL, &x)) return 2;
      o->iters = (int)x;
    } else {
      fprintf(stderr, "ferry bench copy: unknown or incomplete option '%s'\n", a);
      usage(stderr);
      return 2;
    }
  }
  /* two pinned host buffers of the largest size, and two device buffers
   * (host memory too on the host backend): refuse up front what cannot fit */
  uint64_t avail = bench_mem_available();
  if (avail && 4.0 * (double)o->plan.max_size > 0.9 * (double)avail) {
    char a[32], b[32], c[32];
    fprintf(stderr, "ferry bench copy: --size %s needs up to %s of RAM (two host and two "
                    "device buffers of it); %s is available\n",
            ferry_format_size(o->plan.max_size, a, sizeof a),
            ferry_format_size(4 * o->plan.max_size, b, sizeof b),
            ferry_format_size(avail, c, sizeof c));
    return 2;
  }
  return -1;
}

/* The device, its buffers of size bytes each, and two streams. */
typedef struct {
  ferry_device *dev;
  ferry_device_info info;
  unsigned char *h_in, *h_out, *d_a, *d_b;
  ferry_stream *s1, *s2;
} copy_rig;

/* 0, or 1 (said on stderr); r->dev is set as soon as it exists, for the
 * caller to destroy either way. */
static int rig_open(copy_rig *r, const copy_opts *o) {
  uint64_t size = o->plan.max_size;
  ferry_device *dev = NULL;
  ferry_device_config cfg = ferry_device_config_default();
  cfg.kind = o->kind;
  cfg.capacity = (size_t)size * 2 + (1u << 20);
  unsigned char *h_in = NULL, *h_out = NULL, *d_a = NULL, *d_b = NULL;
  ferry_stream *s1 = NULL, *s2 = NULL;
  ferry_event *e0 = NULL, *e1 = NULL;
  ferry_device_info info;
  TRY(ferry_device_create(&cfg, &dev));
  r->dev = dev;
  TRY(ferry_device_get_info(dev, &info));
  TRY(ferry_host_alloc(dev, size, (void **)&h_in));
  TRY(ferry_host_alloc(dev, size, (void **)&h_out));
  TRY(ferry_device_alloc(dev, size, (void **)&d_a));
  TRY(ferry_device_alloc(dev, size, (void **)&d_b));
  TRY(ferry_stream_create(dev, &s1));
  TRY(ferry_stream_create(dev, &s2));
  TRY(ferry_event_create(dev, &e0));
  TRY(ferry_event_create(dev, &e1));
  *r = (copy_rig){dev, info, h_in, h_out, d_a, d_b, s1, s2};
  return 0;
}

/* A round trip returns every byte: 0, or 1 (said on stderr). */
static int validate(const copy_rig *r, uint64_t size) {
  ferry_device *dev = r->dev;
  unsigned char *h_in = r->h_in, *h_out = r->h_out, *d_a = r->d_a;
  ferry_stream *s1 = r->s1;
  for (uint64_t i = 0; i < size; i++)
    h_in[i] = (unsigned char)(i * 2654435761u >> 13);
  memset(h_out, 0, size);
  TRY(ferry_memcpy_async(s1, d_a, h_in, size, FERRY_COPY_H2D));
  TRY(ferry_memcpy_async(s1, h_out, d_a, size, FERRY_COPY_D2H));
  TRY(ferry_stream_synchronize(s1));
  if (memcmp(h_in, h_out, size)) {
    fprintf(stderr, "ferry bench copy: validation failed: the round trip changed bytes\n");
    return 1;
  }
  return 0;
}

/* The median seconds of iters copies in direction dir (0 h2d, 1 d2h, 2
 * both), after one untimed warm-up; t has iters entries. 0, or 1 (said on
 * stderr). */
static int time_direction(const copy_rig *r, uint64_t size, int dir, int iters, double *t,
                          double *median) {
  ferry_device *dev = r->dev;
  unsigned char *h_in = r->h_in, *h_out = r->h_out, *d_a = r->d_a, *d_b = r->d_b;
  ferry_stream *s1 = r->s1, *s2 = r->s2;
  for (int it = -1; it < iters; it++) { /* it = -1: untimed warm-up */
    double t0 = copy_now();
    if (dir == 0 || dir == 2) TRY(ferry_memcpy_async(s1, d_a, h_in, size, FERRY_COPY_H2D));
    if (dir == 1 || dir == 2) TRY(ferry_memcpy_async(s2, h_out, d_b, size, FERRY_COPY_D2H));
    TRY(ferry_stream_synchronize(s1));
    TRY(ferry_stream_synchronize(s2));
    if (it >= 0) t[it] = copy_now() - t0;
  }
  *median = copy_median(t, iters);
  return 0;
}

static void report(const copy_opts *o, const char *device, int dir, uint64_t bytes, double sec) {
  double gbs = (double)bytes / sec / 1e9;
  if (o->json) {
    json_out j;
    json_begin(&j, stdout);
    json_str(&j, "bench", "copy");
    json_str(&j, "device", device);
    json_str(&j, "direction", copy_dir_names[dir]);
    json_uint(&j, "bytes", bytes);
    json_num(&j, "seconds", sec);
    json_num(&j, "gb_per_s", gbs);
    json_int(&j, "iters", o->iters);
    json_end(&j);
  } else {
    char b[32]; /* sizes in binary units; rates in GB/s (10^9 bytes/s), as everywhere */
    printf("copy %-13s %s: %s in %.4f s = %.2f GB/s (median of %d)\n", copy_dir_names[dir],
           device, ferry_format_size(bytes, b, sizeof b), sec, gbs, o->iters);
  }
}

/* Validates, then times and reports each size and direction: 0, or 1
 * (said on stderr). */
static int run(copy_rig *r, const copy_opts *o) {
  double *t = calloc((size_t)o->iters, sizeof *t);
  if (!t) return 1;
  const copy_plan *p = &o->plan;
  int ret = rig_open(r, o) || validate(r, p->max_size);
  for (int k = 0; k < p->nsizes && !ret; k++) {
    uint64_t size = p->sizes[k];
    for (int dir = 0; dir < 3 && !ret; dir++) {
      if (!(p->dirs & (1u << dir))) continue;
      double sec;
      ret = time_direction(r, size, dir, o->iters, t, &sec);
      if (!ret) report(o, r->info.name, dir, dir == 2 ? 2 * size : size, sec);
    }
  }
  free(t);
  return ret;
}

int ferry_bench_copy_main(int argc, char **argv) {
  copy_opts o;
  int ex = parse_args(&o, argc, argv);
  if (ex >= 0) return ex;
  copy_rig r = {0};
  int ret = run(&r, &o);
  ferry_device_destroy(r.dev);
  return ret;
}
