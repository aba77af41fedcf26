/* bench/cuda_peak.cu — ferry-cuda-peak: the raw cudaMemcpyAsync ceiling that
 * `ferry bench copy` is held against (tools/gpu_check.sh divides one by the
 * other), and the device memory an idle CUDA context takes (--context).
 * Pinned host memory from cudaHostAlloc, device memory from cudaMalloc, two
 * non-blocking streams. The method is bench/bench_copy.c's: per size and
 * direction one untimed warm-up, then N timed iterations, each the wall
 * time from the first enqueue to the end of the stream synchronizes, and the
 * median reported; "bidirectional" is H2D on one stream and D2H on the other
 * at once, its bytes counted both ways. The bytes of one round trip are
 * checked first. No ferry library: the CUDA runtime alone.
 * Exit 0; 1 a CUDA call failed; 2 bad usage; 77 no usable GPU.
 */
#include "bench/copy_opts.h"

#include <cuda_runtime.h>

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f) {
  fprintf(f,
          "usage: ferry-cuda-peak [--size SIZE[,SIZE...]] [--direction h2d|d2h|both|all]\n"
          "                       [--iters N] [--ordinal N] [--json]\n"
          "       ferry-cuda-peak --context [--hold SECONDS] [--ordinal N] [--json]\n"
          "\n"
          "Measures cudaMemcpyAsync between pinned host memory and device memory: H2D,\n"
          "D2H and both at once on two streams (bidirectional, bytes counted twice), one\n"
          "untimed warm-up then N timed iterations per size and direction, the median\n"
          "reported; the same method as `ferry bench copy`, without ferry.\n"
          "--context creates a CUDA context and nothing else, reports the device memory\n"
          "in use (total - free, as cudaMemGetInfo says), then holds the context for\n"
          "SECONDS (default 0) so that nvidia-smi can sample it.\n"
          "\n"
          "  --size SIZES     bytes per copy, a list such as 4M,64M,1G (default)\n"
          "  --direction DIR  h2d, d2h, both or all (default)\n"
          "  --iters N        timed iterations (default 5)\n"
          "  --ordinal N      CUDA device (default 0)\n"
          "  --json           one JSON object per line: bench, device, direction, bytes,\n"
          "                   seconds, gb_per_s, iters (--context: bench, device,\n"
          "                   used_bytes, free_bytes, total_bytes)\n"
          "Exit 0; 1 a CUDA call failed; 2 bad usage; 77 no usable GPU.\n");
}

/* On a failed CUDA call: says which and returns 1. */
#define CK(call)                                                                                   \
  do {                                                                                             \
    cudaError_t err_ = (call);                                                                     \
    if (err_ != cudaSuccess) {                                                                     \
      fprintf(stderr, "ferry-cuda-peak: %s: %s: %s\n", #call, cudaGetErrorName(err_),              \
              cudaGetErrorString(err_));                                                           \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

typedef struct {
  copy_plan plan;
  int iters, ordinal, json, context;
  double hold;
} peak_opts;

/* "64M", "1G", "4096": binary suffixes K M G, as ferry_parse_size reads
 * them. 0, or -1. */
static int parse_size(const char *s, uint64_t *out) {
  char *end = NULL;
  if (!isdigit((unsigned char)*s)) return -1;
  unsigned long long v = strtoull(s, &end, 10);
  uint64_t mul = 1;
  switch (toupper((unsigned char)*end)) {
  case 'K': mul = 1ull << 10; end++; break;
  case 'M': mul = 1ull << 20; end++; break;
  case 'G': mul = 1ull << 30; end++; break;
  default: break;
  }
  if (*end == 'i' || *end == 'I') end++;
  if (*end == 'b' || *end == 'B') end++;
  if (*end || v == 0 || v > (1ull << 40) / mul) return -1;
  *out = (uint64_t)v * mul;
  return 0;
}

/* Returns -1 to go on, or the exit code (0 after --help, 2 bad usage). */
static int parse_args(peak_opts *o, int argc, char **argv) {
  memset(o, 0, sizeof *o);
  o->plan.dirs = 7;
  o->iters = 5;
  if (copy_parse_sizes(&o->plan, "4M,64M,1G", "ferry-cuda-peak", parse_size)) return 2;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int bad = 0;
    if (!strcmp(a, "--json"))
      o->json = 1;
    else if (!strcmp(a, "--context"))
      o->context = 1;
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else if (v && !strcmp(a, "--size")) {
      if (copy_parse_sizes(&o->plan, argv[++i], "ferry-cuda-peak", parse_size)) return 2;
    } else if (v && !strcmp(a, "--direction")) {
      if (copy_parse_direction(&o->plan, argv[++i], "ferry-cuda-peak")) return 2;
    } else if (v && !strcmp(a, "--iters"))
      bad = (o->iters = atoi(argv[++i])) < 1 || o->iters > 1000;
    else if (v && !strcmp(a, "--ordinal"))
      bad = (o->ordinal = atoi(argv[++i])) < 0;
    else if (v && !strcmp(a, "--hold"))
      bad = !((o->hold = atof(argv[++i])) >= 0 && o->hold <= 600);
    else {
      fprintf(stderr, "ferry-cuda-peak: unknown or incomplete option '%s'\n", a);
      usage(stderr);
      return 2;
    }
    if (bad) {
      fprintf(stderr, "ferry-cuda-peak: bad value for %s (iters 1..1000, ordinal >= 0, "
                      "hold 0..600)\n", a);
      return 2;
    }
  }
  return -1;
}

/* The device o->ordinal exists and is selected; its name in name. 0, or 77
 * (no usable GPU, said on stderr), or 1. */
static int open_device(const peak_opts *o, char *name, size_t len) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n <= o->ordinal) {
    fprintf(stderr, "ferry-cuda-peak: skip: no usable CUDA device %d (%s)\n", o->ordinal,
            err != cudaSuccess ? cudaGetErrorString(err) : "fewer devices than that");
    return 77;
  }
  CK(cudaSetDevice(o->ordinal));
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, o->ordinal));
  snprintf(name, len, "%s", p.name);
  CK(cudaFree(0)); /* the context now, not inside the first timed call */
  return 0;
}

/* The buffers of max_size bytes each and the two streams. */
typedef struct {
  unsigned char *h_in, *h_out, *d_a, *d_b;
  cudaStream_t s1, s2;
} peak_rig;

static int rig_open(peak_rig *r, uint64_t size) {
  CK(cudaHostAlloc((void **)&r->h_in, size, cudaHostAllocDefault));
  CK(cudaHostAlloc((void **)&r->h_out, size, cudaHostAllocDefault));
  CK(cudaMalloc((void **)&r->d_a, size));
  CK(cudaMalloc((void **)&r->d_b, size));
  CK(cudaStreamCreateWithFlags(&r->s1, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&r->s2, cudaStreamNonBlocking));
  return 0;
}

static void rig_close(peak_rig *r) {
  if (r->s1) cudaStreamDestroy(r->s1);
  if (r->s2) cudaStreamDestroy(r->s2);
  if (r->d_a) cudaFree(r->d_a);
  if (r->d_b) cudaFree(r->d_b);
  if (r->h_in) cudaFreeHost(r->h_in);
  if (r->h_out) cudaFreeHost(r->h_out);
}

/* One round trip of size bytes returns every byte: 0, or 1. */
static int validate(const peak_rig *r, uint64_t size) {
  for (uint64_t i = 0; i < size; i++) r->h_in[i] = (unsigned char)(i * 2654435761u >> 13);
  memset(r->h_out, 0, size);
  CK(cudaMemcpyAsync(r->d_a, r->h_in, size, cudaMemcpyHostToDevice, r->s1));
  CK(cudaMemcpyAsync(r->h_out, r->d_a, size, cudaMemcpyDeviceToHost, r->s1));
  CK(cudaStreamSynchronize(r->s1));
  if (memcmp(r->h_in, r->h_out, size)) {
    fprintf(stderr, "ferry-cuda-peak: validation failed: the round trip changed bytes\n");
    return 1;
  }
  return 0;
}

/* The median seconds of iters copies in direction dir (0 h2d, 1 d2h, 2
 * both) after one untimed warm-up; t has iters entries. 0, or 1. */
static int time_direction(const peak_rig *r, uint64_t size, int dir, int iters, double *t,
                          double *median) {
  for (int it = -1; it < iters; it++) {
    double t0 = copy_now();
    if (dir == 0 || dir == 2)
      CK(cudaMemcpyAsync(r->d_a, r->h_in, size, cudaMemcpyHostToDevice, r->s1));
    if (dir == 1 || dir == 2)
      CK(cudaMemcpyAsync(r->h_out, r->d_b, size, cudaMemcpyDeviceToHost, r->s2));
    CK(cudaStreamSynchronize(r->s1));
    CK(cudaStreamSynchronize(r->s2));
    if (it >= 0) t[it] = copy_now() - t0;
  }
  *median = copy_median(t, iters);
  return 0;
}

static void report(const peak_opts *o, const char *dev, int dir, uint64_t bytes, double sec) {
  double gbs = (double)bytes / sec / 1e9;
  if (o->json)
    printf("{\"bench\":\"cuda_peak\",\"device\":\"%s\",\"direction\":\"%s\",\"bytes\":%llu,"
           "\"seconds\":%.9g,\"gb_per_s\":%.6g,\"iters\":%d}\n",
           dev, copy_dir_names[dir], (unsigned long long)bytes, sec, gbs, o->iters);
  else
    printf("cuda_peak %-13s %s: %llu bytes in %.4f s = %.2f GB/s (median of %d)\n",
           copy_dir_names[dir], dev, (unsigned long long)bytes, sec, gbs, o->iters);
  fflush(stdout);
}

/* Validates at the largest size, then times each size and direction. */
static int run_copies(const peak_opts *o, const char *dev) {
  peak_rig r;
  memset(&r, 0, sizeof r);
  double *t = (double *)calloc((size_t)o->iters, sizeof *t);
  const copy_plan *p = &o->plan;
  int ret = !t || rig_open(&r, p->max_size) || validate(&r, p->max_size);
  for (int k = 0; k < p->nsizes && !ret; k++)
    for (int dir = 0; dir < 3 && !ret; dir++) {
      if (!(p->dirs & (1u << dir))) continue;
      double sec;
      ret = time_direction(&r, p->sizes[k], dir, o->iters, t, &sec);
      if (!ret) report(o, dev, dir, dir == 2 ? 2 * p->sizes[k] : p->sizes[k], sec);
    }
  rig_close(&r);
  free(t);
  return ret;
}

/* The memory a context takes: reported, then held for o->hold seconds. */
static int run_context(const peak_opts *o, const char *dev) {
  size_t free_b = 0, total_b = 0;
  CK(cudaMemGetInfo(&free_b, &total_b));
  if (o->json)
    printf("{\"bench\":\"cuda_context\",\"device\":\"%s\",\"used_bytes\":%zu,"
           "\"free_bytes\":%zu,\"total_bytes\":%zu}\n",
           dev, total_b - free_b, free_b, total_b);
  else
    printf("cuda context on %s: %zu bytes in use of %zu (total - free)\n", dev,
           total_b - free_b, total_b);
  fflush(stdout);
  if (o->hold > 0) {
    struct timespec ts = {(time_t)o->hold, (long)((o->hold - (double)(time_t)o->hold) * 1e9)};
    while (nanosleep(&ts, &ts)) {
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  peak_opts o;
  int ex = parse_args(&o, argc, argv);
  if (ex >= 0) return ex;
  char dev[256];
  ex = open_device(&o, dev, sizeof dev);
  if (ex) return ex;
  return o.context ? run_context(&o, dev) : run_copies(&o, dev);
}
