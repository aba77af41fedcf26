/* cli/bench.c — `ferry bench <what>`: dispatches to the benchmarks of
 * bench/ that are in this build.
 */
#include "bench/bench.h"
#include "cli/cli.h"

#include <string.h>

typedef int (*bench_fn)(int, char **);

static const struct {
  const char *name;
  const char *what;
} benches[] = {
    {"io", "NVMe/file I/O through the io_uring swap engine (GB/s, IOPS, latency)"},
    {"uring", "the io_uring floor: the simplest loop over the same bytes, no engine, no CRC"},
    {"adam", "CPU optimizer step (seconds per step, params/s, GB/s)"},
    {"copy", "host<->device copies on the backend (GB/s)"},
    {"memory", "tiered memory manager metadata and fetch cost"},
    {"step", "the engine's training step on a synthetic model, GPU compute as timed waits"},
    {"compute", "GEMMs at a model's shapes: OpenBLAS on host, cuBLAS bf16 on cuda (TFLOP/s)"},
    {"all", "io, adam, copy and compute in turn; writes the profile `ferry plan --profile` reads"},
};

static bench_fn lookup(const char *name) {
  if (!strcmp(name, "io")) return ferry_bench_io_main;
  if (!strcmp(name, "uring")) return ferry_bench_uring_main;
  if (!strcmp(name, "adam")) return ferry_bench_adam_main;
  if (!strcmp(name, "copy")) return ferry_bench_copy_main;
  if (!strcmp(name, "memory")) return ferry_bench_memory_main;
  if (!strcmp(name, "step")) return ferry_bench_step_main;
  if (!strcmp(name, "compute")) return ferry_bench_compute_main;
  if (!strcmp(name, "all")) return ferry_bench_all_main;
  return NULL;
}

static void usage(FILE *f) {
  fprintf(f, "usage: ferry bench <what> [options]   (ferry bench <what> --help)\n\nbenchmarks:\n");
  for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
    fprintf(f, "  %-8s %s%s\n", benches[i].name, benches[i].what,
            lookup(benches[i].name) ? "" : " [not in this build]");
}

int cli_bench(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++) {
    if (strcmp(argv[1], benches[i].name)) continue;
    bench_fn fn = lookup(argv[1]);
    if (!fn) {
      fprintf(stderr, "ferry bench: '%s' is not implemented in this build\n", argv[1]);
      return 2;
    }
    return fn(argc - 1, argv + 1);
  }
  fprintf(stderr, "ferry bench: unknown benchmark '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
