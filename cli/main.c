/* cli/main.c — the `ferry` command: dispatches to its subcommands. */
#include "cli/cli.h"

#include "core/outfile.h"
#include "ferry.h"

#include <string.h>

static void usage(FILE *f) {
  fprintf(f,
          "usage: ferry <command> [options]\n"
          "\n"
          "ferry %s — an offload-centric memory engine for training models larger than\n"
          "GPU memory.\n"
          "\n"
          "commands:\n"
          "  plan        will a model fit: bytes per tier for each placement, step time,\n"
          "              bottleneck, largest batch; writes the engine config\n"
          "  info        describe this machine: CPU, SIMD, NUMA, RAM, locked-memory\n"
          "              limit, GPUs, io_uring, and for each --path DIR its file system\n"
          "              and O_DIRECT\n"
          "  bench       run a benchmark (io, uring, adam, copy, memory, step, compute,\n"
          "              all): validates, then times\n"
          "  config      check an engine config file, list every key, write a config\n"
          "  checkpoint  verify a checkpoint (every file's size and CRC32C) or describe\n"
          "              what it holds: step, format, tensors, families, sizes\n"
          "  version     print the library version\n"
          "  help        this text; `ferry help <command>` is `ferry <command> --help`\n"
          "\n"
          "Run `ferry <command> --help` for a command's options.\n",
          ferry_version());
}

static int dispatch(const char *cmd, int argc, char **argv) {
  if (!strcmp(cmd, "info")) return cli_info(argc, argv);
  if (!strcmp(cmd, "bench")) return cli_bench(argc, argv);
  if (!strcmp(cmd, "config")) return cli_config(argc, argv);
  if (!strcmp(cmd, "plan")) return cli_plan(argc, argv);
  if (!strcmp(cmd, "checkpoint")) return cli_checkpoint(argc, argv);
  return -1;
}

static int run(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "help") && argc > 2) { /* ferry help <command>: its --help */
    static char opt[] = "--help";
    char *help[] = {argv[2], opt, NULL};
    int rc = dispatch(argv[2], 2, help);
    if (rc >= 0) return rc;
    fprintf(stderr, "ferry help: unknown command '%s'\n\n", argv[2]);
    usage(stderr);
    return 2;
  }
  int rc = dispatch(cmd, argc - 1, argv + 1);
  if (rc >= 0) return rc;
  if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
    printf("ferry %s\n", ferry_version());
    return 0;
  }
  if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
    usage(stdout);
    return 0;
  }
  fprintf(stderr, "ferry: unknown command '%s'\n\n", cmd);
  usage(stderr);
  return 2;
}

/* Lost output is a failure: a full disk or a closed stdout exits 1 with a
 * message, never 0 with an empty file. A file over the size limit
 * (`ulimit -f`) fails its write with EFBIG, named, instead of a silent
 * SIGXFSZ death. */
int main(int argc, char **argv) {
  ferry_program_start();
  int rc = run(argc, argv);
  char why[256];
  if (ferry_stdout_finish(why, sizeof why)) fprintf(stderr, "ferry: %s\n", why), rc = rc ? rc : 1;
  return rc;
}
