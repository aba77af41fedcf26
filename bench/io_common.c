/* bench/io_common.c — what the I/O benchmarks share (see io_common.h). */
#include "bench/io_common.h"
#include "core/core.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define HUGE_ALIGN ((size_t)2 << 20)

const char *bench_pages_name(int pages) {
  return pages == BENCH_PAGES_4K ? "4k" : pages == BENCH_PAGES_THP ? "thp" : "hugetlb";
}

size_t bench_pages_round(size_t len, int pages) {
  return ferry_align_up(len, pages == BENCH_PAGES_4K ? 4096 : HUGE_ALIGN);
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

static void opts_defaults(bench_io_opts *o) {
  memset(o, 0, sizeof *o);
  o->mode = "read";
  o->size = 4ull << 30;
  o->bs = 1u << 20;
  o->qd = 32;
  o->pages = BENCH_PAGES_THP;
}

/* Takes argv[*i] (and its value, advancing *i) if it is a common option:
 * 1 taken, 0 not one of them, -1 bad value (said on stderr). */
static int common_opt(bench_io_opts *o, int argc, char **argv, int *i, const char *prog) {
  const char *a = argv[*i];
  const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
  uint64_t *num = NULL;
  if (!strcmp(a, "--json")) o->json = 1;
  else if (!strcmp(a, "--no-hugepages")) o->pages = BENCH_PAGES_4K;
  else if (!strcmp(a, "--hugetlb")) o->pages = BENCH_PAGES_HUGETLB;
  else if (!strcmp(a, "--overwrite")) o->overwrite = 1;
  else if (!strcmp(a, "--path") && v) o->path = argv[++*i];
  else if (!strcmp(a, "--mode") && v) o->mode = argv[++*i];
  else if (!strcmp(a, "--size") && v) num = &o->size;
  else if (!strcmp(a, "--bs") && v) num = &o->bs;
  else if (!strcmp(a, "--qd") && v) num = &o->qd;
  else return 0;
  if (num && ferry_parse_size(argv[++*i], num)) {
    fprintf(stderr, "%s: %s '%s': expected a size such as 1M or 4G\n", prog, a, argv[*i]);
    return -1;
  }
  return 1;
}

int bench_io_parse(bench_io_opts *o, int argc, char **argv, const char *prog,
                   void (*usage)(FILE *),
                   int (*own_opt)(const char *arg, const char *val, void *ctx), void *ctx) {
  opts_defaults(o);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    }
    int own = own_opt ? own_opt(a, i + 1 < argc ? argv[i + 1] : NULL, ctx) : 0;
    if (own < 0) return 2;
    if (own) {
      i += own - 1;
      continue;
    }
    int took = common_opt(o, argc, argv, &i, prog);
    if (took < 0) return 2;
    if (!took) {
      fprintf(stderr, "%s: unknown or incomplete option '%s'\n", prog, a);
      usage(stderr);
      return 2;
    }
  }
  if (!o->path) {
    fprintf(stderr, "%s: --path DIR is required\n", prog);
    usage(stderr);
    return 2;
  }
  if (o->overwrite && strcmp(o->mode, "write")) {
    fprintf(stderr, "%s: --overwrite times a second write pass; it needs --mode write, not '%s'\n",
            prog, o->mode);
    return 2;
  }
  return -1;
}

int bench_io_check_geometry(const bench_io_opts *o, const char *prog, uint64_t align,
                            uint64_t max_ops) {
  char a[32], b[32];
  if (!o->bs || o->bs % align || o->bs > (1u << 30)) {
    fprintf(stderr, "%s: --bs %s: expected %s%s from %s to 1.00 GiB\n", prog,
            ferry_format_size(o->bs, a, sizeof a), align > 1 ? "a multiple of " : "a size",
            align > 1 ? ferry_format_size(align, b, sizeof b) : "",
            align > 1 ? "that size" : "1 B");
    return 2;
  }
  if (!o->qd || o->qd > 1024) {
    fprintf(stderr, "%s: --qd %llu: expected 1 to 1024 requests in flight\n", prog,
            (unsigned long long)o->qd);
    return 2;
  }
  if (o->size < o->bs || o->size / o->bs > max_ops) {
    fprintf(stderr, "%s: --size %s: expected from --bs (%s) to %llu blocks of it\n", prog,
            ferry_format_size(o->size, a, sizeof a), ferry_format_size(o->bs, b, sizeof b),
            (unsigned long long)max_ops);
    return 2;
  }
  return 0;
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
