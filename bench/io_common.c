/* bench/io_common.c — what the I/O benchmarks share (see io_common.h). */
#include "bench/io_common.h"
#include "core/core.h"

#include <stdio.h>
#include <string.h>

#include <stdlib.h>
#include <sys/mman.h>

#define HUGE_ALIGN ((size_t)2 << 20)

const char *bench_pages_name(int pages) {
  return pages == BENCH_PAGES_4K ? "4k" : pages == BENCH_PAGES_THP ? "thp" : "hugetlb";
}

size_t bench_pages_round(size_t len, int pages) {
  size_t a = pages == BENCH_PAGES_4K ? 4096 : HUGE_ALIGN;
  return (len + a - 1) / a * a;
}

void *bench_pages_alloc(size_t len, int pages) {
  void *p = NULL;
  if (pages == BENCH_PAGES_HUGETLB) {
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
    return p == MAP_FAILED ? NULL : p;
  }
  if (posix_memalign(&p, pages == BENCH_PAGES_THP ? HUGE_ALIGN : 4096, len)) return NULL;
  if (pages == BENCH_PAGES_THP) (void)madvise(p, len, MADV_HUGEPAGE); /* before the first touch */
  return p;
}

void bench_pages_free(void *p, size_t len, int pages) {
  if (!p) return;
  if (pages == BENCH_PAGES_HUGETLB) munmap(p, len);
  else free(p);
}

void bench_io_opts_init(bench_io_opts *o) {
  memset(o, 0, sizeof *o);
  o->mode = "read";
  o->size = 4ull << 30;
  o->bs = 1u << 20;
  o->qd = 32;
  o->pages = BENCH_PAGES_THP;
}

int bench_io_opt(bench_io_opts *o, int argc, char **argv, int *i, const char *prog) {
  const char *a = argv[*i];
  const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
  uint64_t *num = NULL;
  if (!strcmp(a, "--json")) o->json = 1;
  else if (!strcmp(a, "--no-hugepages")) o->pages = BENCH_PAGES_4K;
  else if (!strcmp(a, "--hugetlb")) o->pages = BENCH_PAGES_HUGETLB;
  else if (!strcmp(a, "--path") && v) o->path = argv[++*i];
  else if (!strcmp(a, "--mode") && v) o->mode = argv[++*i];
  else if (!strcmp(a, "--size") && v) num = &o->size;
  else if (!strcmp(a, "--bs") && v) num = &o->bs;
  else if (!strcmp(a, "--qd") && v) num = &o->qd;
  else return 0;
  if (num && ferry_parse_size(argv[++*i], num)) {
    fprintf(stderr, "%s: bad value '%s' for %s\n", prog, argv[*i], a);
    return -1;
  }
  return 1;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

void bench_latency_us(double *lat, size_t n, double *p50, double *p99) {
  *p50 = *p99 = 0;
  if (!n) return;
  qsort(lat, n, sizeof *lat, cmp_double);
  *p50 = lat[(size_t)(0.50 * (double)(n - 1))] * 1e6;
  *p99 = lat[(size_t)(0.99 * (double)(n - 1))] * 1e6;
}

void bench_io_json_head(json_out *j, const char *bench, const char *mode, uint64_t bs,
                        uint64_t qd, uint64_t bytes, double secs, double p50, double p99) {
  json_str(j, "bench", bench);
  json_str(j, "mode", mode);
  json_uint(j, "bs", bs);
  json_uint(j, "qd", qd);
  json_uint(j, "bytes", bytes);
  json_num(j, "seconds", secs);
  json_num(j, "gb_per_s", (double)bytes / secs / 1e9);
  json_num(j, "iops", (double)bytes / (double)bs / secs);
  json_num(j, "p50_us", p50);
  json_num(j, "p99_us", p99);
}
