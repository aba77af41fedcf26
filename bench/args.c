/* bench/args.c — the benchmarks' option values (bench/args.h): integers,
 * numbers and sizes checked against their range, each refusal naming the
 * option and the value; and the memory a benchmark may plan on. */
#include "bench/args.h"

#include "ferry.h"
#include "core/core.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int bench_arg_int(const char *prog, const char *opt, const char *v, long long lo, long long hi,
                  const char *why, long long *out) {
  char *end = NULL;
  errno = 0;
  long long x = v && *v && !isspace((unsigned char)*v) ? strtoll(v, &end, 10) : 0;
  if (!v || !end || end == v || *end || errno || x < lo || x > hi) {
    fprintf(stderr, "%s: %s '%s': expected an integer from %lld to %lld%s%s%s\n", prog, opt,
            v ? v : "", lo, hi, why ? " (" : "", why ? why : "", why ? ")" : "");
    return -1;
  }
  *out = x;
  return 0;
}

int bench_arg_choice(const char *prog, const char *opt, const char *v,
                     const char *const *names, int *out) {
  int n = 0;
  while (names[n]) {
    if (v && !strcmp(v, names[n])) {
      *out = n;
      return 0;
    }
    n++;
  }
  fprintf(stderr, "%s: %s must be ", prog, opt);
  for (int k = 0; k < n; k++)
    fprintf(stderr, "%s%s", k == 0 ? "" : k == n - 1 ? " or " : ", ", names[k]);
  fprintf(stderr, ", not '%s'\n", v ? v : "");
  return -1;
}

int bench_arg_num(const char *prog, const char *opt, const char *v, double lo, double hi,
                  double *out) {
  char *end = NULL;
  errno = 0;
  double x = v && *v && !isspace((unsigned char)*v) ? strtod(v, &end) : 0;
  if (!v || !end || end == v || *end || errno || !isfinite(x) || x < lo || x > hi) {
    fprintf(stderr, "%s: %s '%s': expected a number from %g to %g\n", prog, opt, v ? v : "", lo,
            hi);
    return -1;
  }
  *out = x;
  return 0;
}

/* A size-suffixed value in [lo, hi]; count: a number of things (256M
 * params), else bytes. */
static int suffixed(const char *prog, const char *opt, const char *v, uint64_t lo, uint64_t hi,
                    int count, uint64_t *out) {
  uint64_t x;
  if (v && !ferry_parse_size(v, &x) && x >= lo && x <= hi) {
    *out = x;
    return 0;
  }
  char a[32], b[32];
  if (count)
    fprintf(stderr, "%s: %s '%s': expected a count such as 256M (k, M, G: powers of 1024) "
                    "from %llu to %llu\n", prog, opt, v ? v : "", (unsigned long long)lo,
            (unsigned long long)hi);
  else
    fprintf(stderr, "%s: %s '%s': expected a size such as 64M from %s to %s\n", prog, opt,
            v ? v : "", ferry_format_size(lo, a, sizeof a), ferry_format_size(hi, b, sizeof b));
  return -1;
}

int bench_arg_count(const char *prog, const char *opt, const char *v, uint64_t lo, uint64_t hi,
                    uint64_t *out) {
  return suffixed(prog, opt, v, lo, hi, 1, out);
}

int bench_arg_size(const char *prog, const char *opt, const char *v, uint64_t lo, uint64_t hi,
                   uint64_t *out) {
  return suffixed(prog, opt, v, lo, hi, 0, out);
}

long long bench_max_threads(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  long long m = 64LL * (n > 0 ? n : 1);
  return m < 1024 ? m : 1024;
}

uint64_t bench_mem_available(void) {
  ferry_host_info hi; /* MemAvailable, as ferry info reports it */
  if (ferry_host_get_info(&hi) == FERRY_OK && hi.ram_available_bytes) return hi.ram_available_bytes;
  long pages = sysconf(_SC_AVPHYS_PAGES), ps = sysconf(_SC_PAGESIZE);
  return pages > 0 && ps > 0 ? (uint64_t)pages * (uint64_t)ps : 0;
}
