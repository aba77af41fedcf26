/* cli/info.c — `ferry info`: what ferry sees of this machine, as text or as
 * one JSON object (--json).
 */
#include "cli/cli.h"

#include "core/core.h"
#include "ferry.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PATHS 16

static void info_usage(FILE *f) {
  fprintf(f,
          "usage: ferry info [--json] [--path DIR]...\n"
          "\n"
          "Describes this machine as ferry sees it: CPU model, cores, SIMD support\n"
          "(AVX2, FMA, F16C, AVX-512 and its bf16 extension), NUMA nodes and their\n"
          "memory, RAM, the locked-memory limit (RLIMIT_MEMLOCK, which bounds pinned\n"
          "memory), GPUs, whether the CUDA backend was compiled, which communicator\n"
          "backends (self, mpi, nccl) were compiled, the BLAS ferry-gpt loads and\n"
          "the kernel it runs there, whether io_uring\n"
          "works, and for each --path DIR its file system, free space and whether\n"
          "O_DIRECT works there (a small probe file is created and removed), and\n"
          "whether its mount discards freed blocks at once (-o discard; from\n"
          "/proc/self/mountinfo; JSON online_discard: true, false or null).\n"
          "\n"
          "options:\n"
          "  --json       print one JSON object (keys: version, cpu_model, cores,\n"
          "               threads, simd, numa_nodes, ram_bytes, memlock_bytes,\n"
          "               cuda_compiled, comm_compiled, blas, gpus, io_uring, paths)\n"
          "  --path DIR   probe a directory (repeatable, up to %d)\n"
          "  -h, --help   this text\n",
          MAX_PATHS);
}

static const struct {
  unsigned bit;
  const char *name;
} simd_names[] = {
    {FERRY_SIMD_SSE42, "sse4.2"},         {FERRY_SIMD_AVX2, "avx2"},
    {FERRY_SIMD_FMA, "fma"},              {FERRY_SIMD_F16C, "f16c"},
    {FERRY_SIMD_AVX512F, "avx512f"},      {FERRY_SIMD_AVX512BW, "avx512bw"},
    {FERRY_SIMD_AVX512VL, "avx512vl"},    {FERRY_SIMD_AVX512BF16, "avx512bf16"},
    {FERRY_SIMD_AVX512FP16, "avx512fp16"},
};

static const char *fmt_size(uint64_t b, char *buf, size_t n) {
  static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)b;
  int i = 0;
  while (v >= 1024 && i < 4) {
    v /= 1024;
    i++;
  }
  snprintf(buf, n, i ? "%.1f %s" : "%.0f %s", v, u[i]);
  return buf;
}

/* What `ferry info` was asked: --json and the --path directories. */
typedef struct {
  int json, npaths;
  const char *paths[MAX_PATHS];
} info_args;

/* OpenBLAS as ferry-gpt loads it, and the kernel ferry-gpt runs there: a
 * user's OPENBLAS_CORETYPE, else OpenBLAS's own pick or, where OpenBLAS
 * falls back, the one the CPU's features call for (ferry_cpu_blas_kernel,
 * the choice ferry-gpt makes; it checks it against a reference GEMM). */
typedef struct {
  int found;
  char config[256], pick[64], kernel[64], why[256];
  const char *by; /* "openblas", "cpuid" or "OPENBLAS_CORETYPE" */
} blas_info;

#define BLAS_SONAME "libopenblas.so.0"

static void blas_probe(unsigned simd, blas_info *b) {
  memset(b, 0, sizeof *b);
  const char *user = getenv("OPENBLAS_CORETYPE");
  int one = !getenv("OPENBLAS_NUM_THREADS"); /* no thread pool for a question */
  if (one) setenv("OPENBLAS_NUM_THREADS", "1", 1);
  void *h = dlopen(BLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (one) unsetenv("OPENBLAS_NUM_THREADS");
  if (!h) {
    snprintf(b->why, sizeof b->why, "%s", dlerror());
    return;
  }
  char *(*corename)(void), *(*config)(void);
  *(void **)&corename = dlsym(h, "openblas_get_corename");
  *(void **)&config = dlsym(h, "openblas_get_config");
  if (!corename || !config) {
    snprintf(b->why, sizeof b->why, "%s has no openblas_get_corename", BLAS_SONAME);
    return;
  }
  b->found = 1;
  snprintf(b->config, sizeof b->config, "%s", config());
  snprintf(b->pick, sizeof b->pick, "%s", corename());
  const char *choice = user ? NULL : ferry_cpu_blas_kernel(simd, b->pick);
  snprintf(b->kernel, sizeof b->kernel, "%s", choice ? choice : b->pick);
  b->by = user ? "OPENBLAS_CORETYPE" : choice ? "cpuid" : "openblas";
}

/* What was probed: the host, the BLAS, the GPUs, io_uring and each --path. */
typedef struct {
  ferry_host_info h;
  int hrc;
  blas_info blas;
  ferry_gpu_info gpus[FERRY_MAX_GPUS];
  int ngpu, grc;
  char gpu_why[256];
  int urc;
  char uring_why[256];
  ferry_path_info pinfo[MAX_PATHS];
  int prc[MAX_PATHS];
  char pwhy[MAX_PATHS][256];
} info_probe;

/* -1: parsed; else the exit code (0 after --help, 2 on bad usage). */
static int info_parse(int argc, char **argv, info_args *a) {
  a->json = 0;
  a->npaths = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json")) {
      a->json = 1;
    } else if (!strcmp(argv[i], "--path")) {
      if (i + 1 >= argc) {
        fprintf(stderr, "ferry info: --path needs a directory\n");
        return 2;
      }
      if (a->npaths == MAX_PATHS) {
        fprintf(stderr, "ferry info: at most %d --path options\n", MAX_PATHS);
        return 2;
      }
      a->paths[a->npaths++] = argv[++i];
    } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      info_usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "ferry info: unknown option '%s'\n", argv[i]);
      info_usage(stderr);
      return 2;
    }
  }
  return -1;
}

static void info_gather(const info_args *a, info_probe *pr) {
  memset(pr, 0, sizeof *pr);
  pr->hrc = ferry_host_get_info(&pr->h);
  blas_probe(pr->h.simd, &pr->blas);
  pr->grc = ferry_gpu_list(pr->gpus, FERRY_MAX_GPUS, &pr->ngpu, pr->gpu_why, sizeof pr->gpu_why);
  pr->urc = ferry_io_uring_probe(pr->uring_why, sizeof pr->uring_why);
  for (int i = 0; i < a->npaths; i++)
    pr->prc[i] = ferry_path_probe(a->paths[i], &pr->pinfo[i], pr->pwhy[i], sizeof pr->pwhy[i]);
}

static void json_host(json_out *j, const ferry_host_info *h) {
  json_str(j, "version", ferry_version());
  json_str(j, "cpu_model", h->cpu_model);
  json_int(j, "cores", h->cores);
  json_int(j, "threads", h->threads);
  json_open(j, "simd", '[');
  for (size_t k = 0; k < sizeof simd_names / sizeof simd_names[0]; k++)
    if (h->simd & simd_names[k].bit) json_str(j, NULL, simd_names[k].name);
  json_close(j, ']');
  json_int(j, "numa_nodes", h->numa_nodes);
  json_open(j, "numa_memory_bytes", '[');
  for (int k = 0; k < h->numa_nodes && k < FERRY_MAX_NUMA; k++)
    json_uint(j, NULL, h->numa_memory[k]);
  json_close(j, ']');
  json_uint(j, "ram_bytes", h->ram_bytes);
  json_uint(j, "ram_available_bytes", h->ram_available_bytes);
  if (h->memlock_bytes == UINT64_MAX) json_null(j, "memlock_bytes");
  else json_uint(j, "memlock_bytes", h->memlock_bytes);
  json_bool(j, "memlock_unlimited", h->memlock_bytes == UINT64_MAX);
  json_uint(j, "hugepage_bytes", h->hugepage_bytes);
  json_bool(j, "cuda_compiled", ferry_cuda_compiled());
  json_open(j, "comm_compiled", '[');
  for (int k = FERRY_COMM_SELF; k <= FERRY_COMM_NCCL; k++)
    if (ferry_comm_compiled((ferry_comm_kind)k)) json_str(j, NULL, ferry_comm_kind_name(k));
  json_close(j, ']');
}

static void json_blas(json_out *j, const blas_info *b) {
  if (!b->found) {
    json_null(j, "blas");
    json_str(j, "blas_reason", b->why);
    return;
  }
  json_open(j, "blas", '{');
  json_str(j, "library", BLAS_SONAME);
  json_str(j, "config", b->config);
  json_str(j, "openblas_kernel", b->pick);
  json_str(j, "kernel", b->kernel);
  json_str(j, "chosen_by", b->by);
  json_close(j, '}');
}

static void json_gpus(json_out *j, const info_probe *pr) {
  json_open(j, "gpus", '[');
  for (int k = 0; k < pr->ngpu; k++) {
    const ferry_gpu_info *g = &pr->gpus[k];
    json_open(j, NULL, '{');
    json_int(j, "ordinal", g->ordinal);
    json_str(j, "name", g->name);
    json_uint(j, "total_bytes", g->total_memory);
    json_uint(j, "free_bytes", g->free_memory);
    char cc[16];
    snprintf(cc, sizeof cc, "%d.%d", g->cc_major, g->cc_minor);
    json_str(j, "compute_capability", cc);
    json_int(j, "pcie_gen", g->pcie_gen);
    json_int(j, "pcie_width", g->pcie_width);
    json_close(j, '}');
  }
  json_close(j, ']');
  if (pr->ngpu == 0) json_str(j, "gpus_reason", pr->gpu_why);
}

static void json_paths(json_out *j, const info_args *a, const info_probe *pr) {
  json_open(j, "paths", '[');
  for (int k = 0; k < a->npaths; k++) {
    const ferry_path_info *pi = &pr->pinfo[k];
    json_open(j, NULL, '{');
    json_str(j, "path", a->paths[k]);
    json_bool(j, "ok", pr->prc[k] == 0);
    if (pr->prc[k]) {
      json_str(j, "error", pr->pwhy[k]);
    } else {
      json_str(j, "fs_type", pi->fs_type);
      json_bool(j, "o_direct", pi->o_direct);
      json_str(j, "io_mode", pi->o_direct ? "direct" : "buffered");
      json_uint(j, "dio_mem_align", pi->dio_mem_align);
      json_uint(j, "dio_offset_align", pi->dio_offset_align);
      json_uint(j, "free_bytes", pi->free_bytes);
      json_uint(j, "total_bytes", pi->total_bytes);
      if (pi->online_discard >= 0) json_bool(j, "online_discard", pi->online_discard);
      else json_null(j, "online_discard");
    }
    json_close(j, '}');
  }
  json_close(j, ']');
}

/* --json: one object; a path that fails its probe is reported in it but
 * leaves the exit code 0. */
static int info_print_json(const info_args *a, const info_probe *pr) {
  json_out j;
  json_begin(&j, stdout);
  json_host(&j, &pr->h);
  json_blas(&j, &pr->blas);
  json_gpus(&j, pr);
  json_bool(&j, "io_uring", pr->urc == 0);
  if (pr->urc) json_str(&j, "io_uring_reason", pr->uring_why);
  json_paths(&j, a, pr);
  json_end(&j);
  return pr->hrc || pr->grc ? 1 : 0;
}

static void text_host(const ferry_host_info *h) {
  char a[32], b[32];
  printf("ferry %s\n", ferry_version());
  printf("cpu:        %s\n", h->cpu_model);
  printf("cores:      %d physical, %d threads\n", h->cores, h->threads);
  printf("simd:      ");
  for (size_t k = 0; k < sizeof simd_names / sizeof simd_names[0]; k++)
    if (h->simd & simd_names[k].bit) printf(" %s", simd_names[k].name);
  printf("%s\n", h->simd ? "" : " none");
  printf("numa nodes: %d\n", h->numa_nodes);
  for (int k = 0; k < h->numa_nodes && k < FERRY_MAX_NUMA; k++)
    printf("  node %d:   %s\n", k, fmt_size(h->numa_memory[k], a, sizeof a));
  printf("ram:        %s (%s available)\n", fmt_size(h->ram_bytes, a, sizeof a),
         fmt_size(h->ram_available_bytes, b, sizeof b));
  if (h->memlock_bytes == UINT64_MAX) printf("memlock:    unlimited\n");
  else
    printf("memlock:    %s (RLIMIT_MEMLOCK; bounds pinned host memory)\n",
           fmt_size(h->memlock_bytes, a, sizeof a));
  if (h->hugepage_bytes) printf("huge pages: %s\n", fmt_size(h->hugepage_bytes, a, sizeof a));
  printf("cuda:       backend %s\n", ferry_cuda_compiled() ? "compiled" : "not compiled");
  printf("comm:       ");
  for (int k = FERRY_COMM_SELF; k <= FERRY_COMM_NCCL; k++)
    printf("%s %s%s", ferry_comm_kind_name(k),
           ferry_comm_compiled((ferry_comm_kind)k) ? "compiled" : "not compiled",
           k < FERRY_COMM_NCCL ? ", " : "\n");
}

static void text_blas(const blas_info *b) {
  if (!b->found) {
    printf("blas:       none for ferry-gpt (%s)\n", b->why);
    return;
  }
  printf("blas:       %s (%s): ferry-gpt runs its %s kernel", BLAS_SONAME, b->config, b->kernel);
  if (!strcmp(b->by, "cpuid"))
    printf(", which the CPU's features call for\n"
           "            (OpenBLAS alone falls back to %s; ferry-gpt checks %s against a\n"
           "            reference GEMM at start)\n", b->pick, b->kernel);
  else printf(" (%s)\n", !strcmp(b->by, "openblas") ? "OpenBLAS's own pick" : "OPENBLAS_CORETYPE");
}

static void text_gpus(const info_probe *pr) {
  char a[32], b[32];
  if (pr->ngpu == 0) printf("gpus:       none (%s)\n", pr->gpu_why);
  for (int k = 0; k < pr->ngpu; k++) {
    const ferry_gpu_info *g = &pr->gpus[k];
    printf("gpu %d:      %s, %s total, %s free, compute %d.%d", g->ordinal, g->name,
           fmt_size(g->total_memory, a, sizeof a), fmt_size(g->free_memory, b, sizeof b),
           g->cc_major, g->cc_minor);
    if (g->pcie_gen) printf(", PCIe gen %d x%d", g->pcie_gen, g->pcie_width);
    printf("\n");
  }
}

static void text_path(const char *path, const ferry_path_info *pi) {
  char a[32], b[32];
  printf("path %s: %s, %s free of %s, %s", path, pi->fs_type,
         fmt_size(pi->free_bytes, a, sizeof a), fmt_size(pi->total_bytes, b, sizeof b),
         pi->o_direct ? "O_DIRECT works" : "O_DIRECT refused: buffered I/O");
  if (pi->o_direct)
    printf(" (alignment: memory %zu, offset %zu)", pi->dio_mem_align, pi->dio_offset_align);
  printf("\n");
  if (pi->online_discard == 1)
    printf("  mounted with online discard: a removed swap file's blocks are trimmed at once,\n"
           "  and on thin or virtual disks the next first write over them is slower\n"
           "  (fstrim from a timer, and mounting without discard, avoids it)\n");
}

/* Text: a path that fails its probe makes the exit code 1. */
static int info_print_text(const info_args *a, const info_probe *pr) {
  text_host(&pr->h);
  text_blas(&pr->blas);
  text_gpus(pr);
  printf("io_uring:   %s\n", pr->urc == 0 ? "works" : pr->uring_why);
  for (int k = 0; k < a->npaths; k++) {
    if (pr->prc[k]) printf("path %s: error: %s\n", a->paths[k], pr->pwhy[k]);
    else text_path(a->paths[k], &pr->pinfo[k]);
  }
  int bad = pr->hrc || pr->grc;
  for (int k = 0; k < a->npaths; k++) bad |= pr->prc[k] != 0;
  return bad ? 1 : 0;
}

int cli_info(int argc, char **argv) {
  info_args a;
  int rc = info_parse(argc, argv, &a);
  if (rc >= 0) return rc;
  info_probe pr;
  info_gather(&a, &pr);
  return a.json ? info_print_json(&a, &pr) : info_print_text(&a, &pr);
}
