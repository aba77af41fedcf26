/* bench/io_common.h — what the I/O benchmarks (`bench io`, `bench uring`)
 * share: their common options, latency percentiles, and buffers by page
 * kind: plain 4 KiB pages,
 * transparent huge pages (2 MiB aligned, MADV_HUGEPAGE before the first
 * touch: what the host backend's pinned pool gets) or reserved hugetlb
 * pages (what fio's --mem=shmhuge gets; needs vm.nr_hugepages). The page
 * kind decides how many scatter-gather segments a request is, which on
 * some disks decides its speed.
 */
#ifndef FERRY_BENCH_IO_COMMON_H
#define FERRY_BENCH_IO_COMMON_H

#include "format/json_writer.h"

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

/* Options both take: --path --mode --size --bs --qd --json --no-hugepages
 * --hugetlb --overwrite. overwrite: a write is timed on its second pass,
 * over blocks the first (untimed) pass wrote, as a swap file is written in
 * training; a fresh file's first pass also times the file system turning
 * fallocated (unwritten) extents into written ones, and on a disk that
 * discards freed blocks, the device filling the holes left by the file
 * before. */
typedef struct {
  const char *path, *mode;
  uint64_t size, bs, qd;
  int json, pages, overwrite;
} bench_io_opts;

/* Parses argv (options from argv[1]) into o, after the defaults (mode
 * read, size 4G, bs 1M, qd 32, thp pages). own_opt, when not NULL, is
 * asked first about each word (val: the word after it, or NULL) and
 * returns 0 (not its own), 1 (took the word), 2 (took it and val) or -1
 * (a bad value, said on stderr). Returns -1 to go on, or the exit code: 0
 * after --help (usage(stdout)), 2 after a bad or unknown option, a missing
 * --path, or --overwrite without --mode write (said on stderr, prog
 * first). */
/* --bs (a multiple of align, at most 1G), --qd (1..1024) and --size (at
 * least --bs, at most max_ops blocks of it): 0, or 2 after a usage error
 * naming the option, its value and the range. */
int bench_io_check_geometry(const bench_io_opts *o, const char *prog, uint64_t align,
                            uint64_t max_ops);
int bench_io_parse(bench_io_opts *o, int argc, char **argv, const char *prog,
                   void (*usage)(FILE *),
                   int (*own_opt)(const char *arg, const char *val, void *ctx), void *ctx);
/* The keys every I/O result starts with (the contract): bench,
 * mode, bs, qd, bytes, seconds, gb_per_s, iops, p50_us, p99_us. */
void bench_io_json_head(json_out *j, const char *bench, const char *mode, uint64_t bs,
                        uint64_t qd, uint64_t bytes, double secs, double p50, double p99);
/* Sorts lat[0..n) and gives its 50th and 99th percentiles in microseconds. */
void bench_latency_us(double *lat, size_t n, double *p50, double *p99);

enum { BENCH_PAGES_4K, BENCH_PAGES_THP, BENCH_PAGES_HUGETLB };

/* "4k", "thp", "hugetlb" */
const char *bench_pages_name(int pages);
/* len bytes of the given kind, or NULL (hugetlb: none reserved). */
void *bench_pages_alloc(size_t len, int pages);
void bench_pages_free(void *p, size_t len, int pages);
/* len rounded up to the kind's alignment. */
size_t bench_pages_round(size_t len, int pages);

#endif
