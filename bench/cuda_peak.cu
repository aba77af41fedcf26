/* bench/cuda_peak.cu — ferry-cuda-peak: the raw cudaMemcpyAsync ceiling that
 * `ferry bench copy` is held against (tools/gpu_check.sh divides one by the
 * other), the device memory an idle CUDA context takes (--context), and the
 * measured cuBLAS bf16 GEMM peak that model FLOPS utilisation is taken
 * against (--gemm N: N x N x N, bf16 in and out, fp32 compute).
 * Pinned host memory from cudaHostAlloc, device memory from cudaMalloc, two
 * non-blocking streams. The method is bench/bench_copy.c's: per size and
 * direction one untimed warm-up, then N timed iterations, each the wall
 * time from the first enqueue to the end of the stream synchronizes, and the
 * median reported; "bidirectional" is H2D on one stream and D2H on the other
 * at once, its bytes counted both ways. The bytes of one round trip are
 * checked first. --gemm: A and B filled with pseudo-random values in
 * [-1, 1) (never zeros: they run faster than data), a few entries of C
 * checked against a double-precision dot product on the host, then 3
 * untimed products and N timed ones, each between two CUDA events, the
 * median reported as 2 N^3 / seconds. No ferry library: the CUDA runtime
 * and cuBLAS alone.
 * Exit 0; 1 a CUDA call failed; 2 bad usage; 77 no usable GPU.
 */
#include "bench/copy_opts.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <ctype.h>
#include <math.h>
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
          "       ferry-cuda-peak --gemm N [--iters N] [--ordinal N] [--json]\n"
          "\n"
          "Measures cudaMemcpyAsync between pinned host memory and device memory: H2D,\n"
          "D2H and both at once on two streams (bidirectional, bytes counted twice), one\n"
          "untimed warm-up then N timed iterations per size and direction, the median\n"
          "reported; the same method as `ferry bench copy`, without ferry.\n"
          "--context creates a CUDA context and nothing else, reports the device memory\n"
          "in use (total - free, as cudaMemGetInfo says), then holds the context for\n"
          "SECONDS (default 0) so that nvidia-smi can sample it.\n"
          "--gemm N times cublasGemmEx at M = N = K = N (e.g. 8192): bf16 A, B and C,\n"
          "fp32 compute, random data checked at a few entries against the host; 3\n"
          "untimed products then --iters timed ones (default 20), each between CUDA\n"
          "events; the median reported as TFLOPS (2 N^3 flops per product).\n"
          "\n"
          "  --size SIZES     bytes per copy, a list such as 4M,64M,1G (default)\n"
          "  --direction DIR  h2d, d2h, both or all (default)\n"
          "  --iters N        timed iterations (default 5; --gemm: 20)\n"
          "  --ordinal N      CUDA device (default 0)\n"
          "  --json           one JSON object per line: bench, device, direction, bytes,\n"
          "                   seconds, gb_per_s, iters (--context: bench, device,\n"
          "                   used_bytes, free_bytes, total_bytes; --gemm: bench\n"
          "                   \"cuda_gemm\", device, m, n, k, dtype, compute, seconds,\n"
          "                   tflops, iters, max_rel_err)\n"
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
  int iters, ordinal, json, context, gemm; /* gemm: its N, 0 off */
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
  o->iters = 0; /* 0: the mode's default */
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
    else if (v && !strcmp(a, "--gemm"))
      bad = (o->gemm = atoi(argv[++i])) < 16 || o->gemm > 32768 || o->gemm % 16;
    else if (v && !strcmp(a, "--hold"))
      bad = !((o->hold = atof(argv[++i])) >= 0 && o->hold <= 600);
    else {
      fprintf(stderr, "ferry-cuda-peak: unknown or incomplete option '%s'\n", a);
      usage(stderr);
      return 2;
    }
    if (bad) {
      fprintf(stderr, "ferry-cuda-peak: bad value for %s (iters 1..1000, ordinal >= 0, "
                      "hold 0..600, gemm a multiple of 16 in 16..32768)\n", a);
      return 2;
    }
  }
  if (o->gemm && o->context) {
    fprintf(stderr, "ferry-cuda-peak: --gemm and --context are separate runs\n");
    return 2;
  }
  if (!o->iters) o->iters = o->gemm ? 20 : 5;
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

/* ---- --gemm: the cuBLAS bf16 GEMM peak ---------------------------------------- */

/* On a failed cuBLAS call: says which and returns 1. */
#define CKB(call)                                                                                  \
  do {                                                                                             \
    cublasStatus_t st_ = (call);                                                                   \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                            \
      fprintf(stderr, "ferry-cuda-peak: %s: cuBLAS status %d\n", #call, (int)st_);                \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

/* A counter hash of (seed, i) as a bf16 value in [-1, 1). */
__host__ __device__ static inline float gemm_value(unsigned seed, size_t i) {
  unsigned long long z = (unsigned long long)i * 0x9E3779B97F4A7C15ull + seed;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (float)(z >> 40) / 8388608.0f - 1.0f; /* 24 bits: [-1, 1) */
}

__global__ void gemm_fill(__nv_bfloat16 *x, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    x[i] = __float2bfloat16_rn(gemm_value(seed, i));
}

/* bf16 bits as a float (the host side; exact). */
static float bf16_bits_to_float(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* C (column-major, n x n) = A B for A, B, C of n x n bf16 on the device. */
static int gemm_once(cublasHandle_t h, int n, const __nv_bfloat16 *a, const __nv_bfloat16 *b,
                     __nv_bfloat16 *c) {
  const float one = 1.0f, zero = 0.0f;
  CKB(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16BF, n, b, CUDA_R_16BF,
                   n, &zero, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return 0;
}

/* Entries of C against a host dot product in double: the largest error as a
 * share of sum |a_ik b_kj| (bf16 rounding of C: about 2^-9). 0, or 1. */
static int gemm_check(int n, const __nv_bfloat16 *a, const __nv_bfloat16 *b,
                      const __nv_bfloat16 *c, double *max_rel) {
  uint16_t *row = (uint16_t *)malloc((size_t)n * 2), *col = (uint16_t *)malloc((size_t)n * 2);
  int ret = !row || !col;
  *max_rel = 0;
  for (int s = 0; s < 4 && !ret; s++) {
    int i = (int)((s * 2654435761u) % (unsigned)n), j = (int)((s * 40503u + 7u) % (unsigned)n);
    uint16_t cij;
    /* row i of A (stride n), column j of B (contiguous), C[i, j] */
    if (cudaMemcpy2D(row, 2, a + i, (size_t)n * 2, 2, (size_t)n, cudaMemcpyDeviceToHost) ||
        cudaMemcpy(col, b + (size_t)j * n, (size_t)n * 2, cudaMemcpyDeviceToHost) ||
        cudaMemcpy(&cij, c + (size_t)j * n + i, 2, cudaMemcpyDeviceToHost)) {
      fprintf(stderr, "ferry-cuda-peak: --gemm: reading the product back failed\n");
      ret = 1;
      break;
    }
    double ref = 0, mag = 0;
    for (int k = 0; k < n; k++) {
      double p = (double)bf16_bits_to_float(row[k]) * bf16_bits_to_float(col[k]);
      ref += p;
      mag += fabs(p);
    }
    double e = fabs((double)bf16_bits_to_float(cij) - ref) / (mag > 0 ? mag : 1);
    if (!(e <= *max_rel)) *max_rel = e; /* NaN sticks */
  }
  free(row), free(col);
  if (!ret && !(*max_rel < 1e-2)) {
    fprintf(stderr, "ferry-cuda-peak: --gemm: the product is wrong (error %.3g of sum |a b|)\n",
            *max_rel);
    ret = 1;
  }
  return ret;
}

/* Times o->iters products of o->gemm^3 after 3 untimed ones. */
static int gemm_timed(const peak_opts *o, cublasHandle_t h, const __nv_bfloat16 *a,
                      const __nv_bfloat16 *b, __nv_bfloat16 *c, double *t) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  int ret = 0;
  for (int it = -3; it < o->iters && !ret; it++) {
    CK(cudaEventRecord(e0, 0));
    ret = gemm_once(h, o->gemm, a, b, c);
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (it >= 0) t[it] = ms * 1e-3;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ret;
}

static int run_gemm(const peak_opts *o, const char *dev) {
  size_t n = (size_t)o->gemm, elems = n * n;
  __nv_bfloat16 *a = NULL, *b = NULL, *c = NULL;
  cublasHandle_t h = NULL;
  double *t = (double *)calloc((size_t)o->iters, sizeof *t), max_rel = 0;
  int ret = !t;
  if (!ret && (cudaMalloc((void **)&a, elems * 2) || cudaMalloc((void **)&b, elems * 2) ||
               cudaMalloc((void **)&c, elems * 2))) {
    fprintf(stderr, "ferry-cuda-peak: --gemm %zu: cannot allocate 3 x %zu bytes\n", n, elems * 2);
    ret = 1;
  }
  if (!ret && cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "ferry-cuda-peak: cublasCreate failed\n");
    ret = 1;
  }
  if (!ret) {
    gemm_fill<<<1024, 256>>>(a, elems, 1u);
    gemm_fill<<<1024, 256>>>(b, elems, 2u);
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess) err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
      fprintf(stderr, "ferry-cuda-peak: gemm_fill: %s\n", cudaGetErrorString(err));
      ret = 1;
    }
  }
  if (!ret) ret = gemm_once(h, o->gemm, a, b, c) || gemm_check(o->gemm, a, b, c, &max_rel);
  if (!ret) ret = gemm_timed(o, h, a, b, c, t);
  if (!ret) {
    double sec = copy_median(t, o->iters), tflops = 2.0 * (double)n * n * n / sec / 1e12;
    if (o->json)
      printf("{\"bench\":\"cuda_gemm\",\"device\":\"%s\",\"m\":%zu,\"n\":%zu,\"k\":%zu,"
             "\"dtype\":\"bf16\",\"compute\":\"fp32\",\"seconds\":%.9g,\"tflops\":%.6g,"
             "\"iters\":%d,\"max_rel_err\":%.3g}\n",
             dev, n, n, n, sec, tflops, o->iters, max_rel);
    else
      printf("cuda_gemm %s: bf16 %zu^3, fp32 compute: %.4f ms = %.1f TFLOPS (median of %d)\n", dev,
             n, sec * 1e3, tflops, o->iters);
    fflush(stdout);
  }
  if (h) cublasDestroy(h);
  cudaFree(a), cudaFree(b), cudaFree(c);
  free(t);
  return ret;
}

int main(int argc, char **argv) {
  peak_opts o;
  int ex = parse_args(&o, argc, argv);
  if (ex >= 0) return ex;
  char dev[256];
  ex = open_device(&o, dev, sizeof dev);
  if (ex) return ex;
  return o.context ? run_context(&o, dev) : o.gemm ? run_gemm(&o, dev) : run_copies(&o, dev);
}
