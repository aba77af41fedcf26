/* bench/args.h — option values of the benchmarks, parsed one way: a whole
 * integer, number or size within its range, or a usage error on stderr that
 * names the program, the option, the value given and what was expected
 * (the caller then exits 2).
 */
#ifndef FERRY_BENCH_ARGS_H
#define FERRY_BENCH_ARGS_H

#include <stdint.h>

/* v as a base-10 integer in [lo, hi] into *out: 0, or -1 after
 * "PROG: OPT 'V': expected an integer from LO to HI[ (WHY)]" (why may be
 * NULL: it says where the limit comes from). */
int bench_arg_int(const char *prog, const char *opt, const char *v, long long lo, long long hi,
                  const char *why, long long *out);
/* v as a finite number in [lo, hi]. */
int bench_arg_num(const char *prog, const char *opt, const char *v, double lo, double hi,
                  double *out);
/* v as a size ("64M", "4096") in [lo, hi] bytes. */
int bench_arg_size(const char *prog, const char *opt, const char *v, uint64_t lo, uint64_t hi,
                   uint64_t *out);
/* v as a count with the size suffixes ("256M" parameters) in [lo, hi]. */
int bench_arg_count(const char *prog, const char *opt, const char *v, uint64_t lo, uint64_t hi,
                    uint64_t *out);
/* v as one of the NULL-terminated names: its index into *out, or -1 after
 * "PROG: OPT must be A, B or C, not 'V'". */
int bench_arg_choice(const char *prog, const char *opt, const char *v,
                     const char *const *names, int *out);
/* The most optimizer threads a bench takes: 64 per CPU, at most the
 * optimizer pool's 1024 (beyond it the pool would clamp silently). */
long long bench_max_threads(void);
#define BENCH_THREADS_WHY "at most 64 per CPU and 1024 in all"
/* Bytes of memory the system has available now (MemAvailable), or 0 when
 * unknown. */
uint64_t bench_mem_available(void);

#endif
