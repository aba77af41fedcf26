/* examples/gpt/blas_threads.c — OpenBLAS's threads under an address-space
 * limit (ulimit -v): at start, the program runs itself again with as many
 * threads as the limit holds; before the first step, their GEMM buffers
 * are mapped, as many threads as fit. Without a limit: nothing.
 */
#include "app.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

/* The process's mapped bytes now (VmSize), or 0 when unknown. */
static uint64_t vm_size_bytes(void) {
  int found;
  return gpt_proc_status_kb("VmSize", &found) * 1024;
}

/* One small GEMM large enough for OpenBLAS to run it on its threads: each
 * thread maps its GEMM buffer now, not in the middle of a step. */
static void blas_warm_up(void) {
  enum { W = 128 };
  static float a[W * W], b[W * W], c[W * W];
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, W, W, W, 1.0f, a, W, b, W, 0.0f, c, W);
}

/* Under an address-space limit (ulimit -v, RLIMIT_AS) OpenBLAS cannot map
 * a GEMM buffer (about 128 MiB a thread here) and then retries forever at
 * 100% CPU instead of failing. So with a limit its buffers are mapped at
 * start, one thread first to measure what one takes, then as many threads
 * as fit beside a reserve for the model (a note when fewer than asked);
 * too little room even for one is refused, naming the limit (exit 1).
 * Without a limit: nothing. */
int train_address_space(const train_run *t) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) || rl.rlim_cur == RLIM_INFINITY) return 0;
  const uint64_t reserve = 16ull << 20, first = 160ull << 20; /* beside them; one buffer */
  uint64_t lim = (uint64_t)rl.rlim_cur, used = vm_size_bytes();
  if (!used) return 0;
  if (used + first + reserve > lim) {
    errf("out of address space: ulimit -v (RLIMIT_AS) is %.1f MiB and %.1f MiB is mapped at "
         "start; OpenBLAS needs about %.0f MiB more for one thread's buffers, and the model "
         "its own: raise ulimit -v\n",
         lim / MiB, used / MiB, first / MiB);
    return 1;
  }
  int want = openblas_get_num_threads();
  openblas_set_num_threads(1);
  blas_warm_up();
  uint64_t after = vm_size_bytes(), each = after > used ? after - used : 0;
  if (each < (8ull << 20)) each = first; /* not measured: assume */
  int fit = 1;
  while (fit < want && after + (uint64_t)fit * each + reserve <= lim) fit++;
  openblas_set_num_threads(fit);
  if (fit > 1) blas_warm_up();
  const char *fitted = getenv("FERRY_GPT_BLAS_FITTED"); /* set by fit_blas_threads */
  if (fit < want || fitted)
    fprintf(t->info, "ferry-gpt: note: ulimit -v is %.1f MiB: OpenBLAS runs %d thread%s%s%s "
            "(each maps about %.0f MiB of buffers)\n", lim / MiB, fit, fit > 1 ? "s" : "",
            fitted ? " of the cores' " : "", fitted ? fitted : "", each / MiB);
  return 0;
}

/* OpenBLAS's worker threads each map a GEMM buffer (about 128 MiB) as
 * they start, when the library loads, and retry forever at 100% CPU when an
 * address-space limit (ulimit -v) refuses it. So under a limit that cannot
 * hold one per core beside 512 MiB for the rest, and with no thread count
 * of the user's in the environment, ferry-gpt runs itself again at once
 * (gpt_blas_start, blas.c: 1 returned) with OPENBLAS_NUM_THREADS set to
 * what fits (at least 1: no workers). */
int fit_blas_threads(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) || rl.rlim_cur == RLIM_INFINITY) return 0;
  if (getenv("OPENBLAS_NUM_THREADS") || getenv("GOTO_NUM_THREADS") || getenv("OMP_NUM_THREADS"))
    return 0;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  const uint64_t per = 136ull << 20, keep = 512ull << 20;
  uint64_t lim = (uint64_t)rl.rlim_cur;
  long fit = lim > keep ? (long)((lim - keep) / per) : 0;
  if (fit < 1) fit = 1;
  if (cores < 1 || fit >= cores) return 0;
  char v[32], c[32];
  snprintf(v, sizeof v, "%ld", fit);
  snprintf(c, sizeof c, "%ld", cores);
  return !setenv("OPENBLAS_NUM_THREADS", v, 1) && !setenv("FERRY_GPT_BLAS_FITTED", c, 1);
}
