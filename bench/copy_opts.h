/* bench/copy_opts.h — the copy plan that `ferry bench copy` (bench_copy.c)
 * and ferry-cuda-peak (cuda_peak.cu) read from the same options, so the two
 * measure the same sizes and directions: --size as a comma list, --direction
 * h2d|d2h|both|all. Plain C with no ferry dependency (nvcc compiles it too);
 * the size parser is the caller's.
 */
#ifndef FERRY_BENCH_COPY_OPTS_H
#define FERRY_BENCH_COPY_OPTS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { COPY_MAX_SIZES = 16 };

typedef struct {
  uint64_t sizes[COPY_MAX_SIZES];
  int nsizes;
  uint64_t max_size; /* the largest of sizes: the buffers' */
  unsigned dirs;     /* bit d: direction d (0 h2d, 1 d2h, 2 both) */
} copy_plan;

/* The JSON names of the directions; "bidirectional" counts its bytes twice. */
static const char *const copy_dir_names[3] = {"h2d", "d2h", "bidirectional"};

/* "4M,64M,1G" into p, each size read by parse (0 on success): 0, or 2 (said
 * on stderr with prog). */
static inline int copy_parse_sizes(copy_plan *p, const char *v, const char *prog,
                                   int (*parse)(const char *, uint64_t *)) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", v);
  p->nsizes = 0;
  p->max_size = 0;
  char *save = NULL;
  for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    uint64_t n = 0;
    if (p->nsizes == COPY_MAX_SIZES || parse(t, &n) || n == 0) {
      fprintf(stderr, "%s: --size '%s' is not a size such as 256M or a list of at most %d "
                      "such as 4M,64M,1G\n", prog, v, COPY_MAX_SIZES);
      return 2;
    }
    p->sizes[p->nsizes++] = n;
    if (n > p->max_size) p->max_size = n;
  }
  if (!p->nsizes) {
    fprintf(stderr, "%s: --size is empty\n", prog);
    return 2;
  }
  return 0;
}

/* h2d, d2h, both or all into p->dirs: 0, or 2 (said on stderr). */
static inline int copy_parse_direction(copy_plan *p, const char *v, const char *prog) {
  static const char *const names[] = {"h2d", "d2h", "both", "all"};
  static const unsigned masks[] = {1, 2, 4, 7};
  for (int k = 0; k < 4; k++)
    if (!strcmp(v, names[k])) {
      p->dirs = masks[k];
      return 0;
    }
  fprintf(stderr, "%s: --direction must be h2d, d2h, both or all, not '%s'\n", prog, v);
  return 2;
}

/* Both programs time a copy as the wall time from its first enqueue to the
 * end of the stream synchronizes, and report the median. */
static inline double copy_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int copy_cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Sorts t (n > 0 entries) and returns its median. */
static inline double copy_median(double *t, int n) {
  qsort(t, (size_t)n, sizeof *t, copy_cmp_d);
  return t[n / 2];
}

#endif
