/* examples/gpt/main.c — the ferry-gpt program: `train` (fine-tune or train a
 * GPT-2 / Llama model on a text or token file), `sample` (generate text) and
 * `tokenize` (text to ids and back).
 * `train --engine CFG` runs on ferry's engine (gpt_engine provider: the
 * config's placement, the engine's optimizer and step); without --engine it
 * runs the pre-engine path (everything resident in host memory, AdamW).
 * This file is the dispatch alone; app.h maps the other files.
 */
#include "app.h"
#include "blas.h"
#include "core/outfile.h"

#include <stdio.h>
#include <string.h>

static int run(int argc, char **argv) {
  /* Startup, before anything else: OpenBLAS's threads under ulimit -v
   * (blas_threads.c) and its kernel (blas.c): one restart at most. */
  gpt_blas_start(argv, fit_blas_threads());
  if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
    fputs(k_main_help, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!strcmp(argv[1], "help")) {
    if (argc > 2 && !strcmp(argv[2], "train")) fputs(k_train_help, stdout);
    else if (argc > 2 && !strcmp(argv[2], "sample")) fputs(k_sample_help, stdout);
    else if (argc > 2 && !strcmp(argv[2], "tokenize")) fputs(k_tokenize_help, stdout);
    else fputs(k_main_help, stdout);
    return 0;
  }
  if (!strcmp(argv[1], "train")) return cmd_train(argc - 1, argv + 1);
  if (!strcmp(argv[1], "sample")) return cmd_sample(argc - 1, argv + 1);
  if (!strcmp(argv[1], "tokenize")) return cmd_tokenize(argc - 1, argv + 1);
  errf("unknown command '%s' (train, sample, tokenize, help)\n", argv[1]);
  return 2;
}

/* Lost output is a failure: a full disk or a closed stdout (--json) exits 1
 * with a message. A file over the size limit (`ulimit -f`) fails its write
 * with EFBIG, named, instead of a silent SIGXFSZ death. */
int main(int argc, char **argv) {
  ferry_program_start();
  int rc = run(argc, argv);
  char why[256];
  if (ferry_stdout_finish(why, sizeof why)) errf("%s\n", why), rc = rc ? rc : 1;
  return rc;
}
