/* bench/bench.h — entry points of the benchmarks. Each validates its result
 * first, then times, and prints one JSON object per result with --json.
 * `ferry bench <name>` calls them, and so do the standalone programs.
 * A benchmark whose file is not in the build is absent (weak symbol): the
 * caller says so instead of running something else.
 */
#ifndef FERRY_BENCH_H
#define FERRY_BENCH_H

#if defined(__GNUC__)
#define FERRY_BENCH_WEAK __attribute__((weak))
#else
#define FERRY_BENCH_WEAK
#endif

/* argv[0] is the benchmark's name ("io", "adam", ...). Returns an exit code. */
int ferry_bench_io_main(int argc, char **argv) FERRY_BENCH_WEAK;     /* bench/bench_io.c */
int ferry_bench_uring_main(int argc, char **argv) FERRY_BENCH_WEAK;  /* bench/bench_uring.c */
int ferry_bench_adam_main(int argc, char **argv) FERRY_BENCH_WEAK;   /* bench/bench_adam.c */
int ferry_bench_copy_main(int argc, char **argv) FERRY_BENCH_WEAK;   /* bench/bench_copy.c */
int ferry_bench_memory_main(int argc, char **argv) FERRY_BENCH_WEAK; /* bench/bench_memory.c */
int ferry_bench_step_main(int argc, char **argv) FERRY_BENCH_WEAK;   /* bench/bench_step.c */
int ferry_bench_all_main(int argc, char **argv) FERRY_BENCH_WEAK;    /* bench/bench_all.c */
int ferry_bench_compute_main(int argc, char **argv) FERRY_BENCH_WEAK; /* bench/bench_compute.c */

#endif
