/* examples/gpt/blas.c — which OpenBLAS kernel ferry-gpt runs.
 *
 * Debian's OpenBLAS (DYNAMIC_ARCH) picks its kernels by CPU model as it
 * loads, and on a model it does not know falls back to Prescott, its SSE3
 * kernels: 3-4x slower on an AVX-512 CPU. Then ferry-gpt runs the kernel
 * the CPU's features call for (ferry_cpu_blas_kernel, core/cpu.c: CPUID
 * bits to an OPENBLAS_CORETYPE name; `ferry info` makes the same choice).
 * Any other pick of OpenBLAS's, and a user's own OPENBLAS_CORETYPE, is kept.
 *
 * How. OpenBLAS reads OPENBLAS_CORETYPE once, when it loads, which for
 * ferry-gpt (linked to it) is before main. So the choice takes a restart:
 * the same one ferry-gpt makes under ulimit -v to set OpenBLAS's thread
 * count (fit_blas_threads, blas_threads.c), so a run restarts at most once, for
 * both. Loading OpenBLAS with dlopen instead would put every cblas call of
 * the model behind a pointer (and the tests that link the model would need
 * the same loader), and learning OpenBLAS's own pick would still take a
 * first load that cannot be undone.
 *
 * The check. Before the restart a child process, ferry-gpt itself with
 * FERRY_GPT_BLAS_PROBE=1 and the chosen OPENBLAS_CORETYPE, runs small
 * GEMMs (every transpose, two sizes, alpha and beta) through the chosen
 * kernel against a plain C loop and exits 0 when they agree. A kernel that
 * disagrees, or dies (an instruction the CPU lacks), is not taken: the run
 * keeps OpenBLAS's own pick, with a warning. So the run restarts once at
 * most and never runs on a kernel that failed the check.
 *
 * Test hooks: FERRY_GPT_TEST_BLAS_PICK=NAME acts as if OpenBLAS had picked
 * NAME (Prescott: its fallback), FERRY_GPT_TEST_BLAS_BAD=1 spoils the
 * child's GEMM (tests/gpt/blas.py).
 */
#include "blas.h"

#include "core/core.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define PROBE_ENV "FERRY_GPT_BLAS_PROBE"
#define CHOSE_ENV "FERRY_GPT_BLAS_CHOSE" /* the kernel ferry-gpt set, across the restart */

static char g_rejected[32]; /* the kernel the check turned down in this process */

/* A value in [-1, 1) from a 32-bit LCG. */
static float lcg(uint32_t *s) {
  *s = *s * 1664525u + 1013904223u;
  return (float)((double)(*s >> 8) / (1 << 23) - 1.0);
}

/* C = alpha op(A) op(B) + beta C (row-major, m x n, inner k) by cblas_sgemm
 * and by a plain loop in double; 0 when every element agrees to 1e-4 of the
 * sum of its terms' magnitudes. */
static int check_one(int m, int n, int k, int ta, int tb, int spoil) {
  size_t na = (size_t)m * k, nb = (size_t)k * n, nc = (size_t)m * n;
  float *a = malloc(na * sizeof *a), *b = malloc(nb * sizeof *b), *c = malloc(nc * sizeof *c);
  double *ref = malloc(nc * sizeof *ref), *mag = malloc(nc * sizeof *mag);
  int bad = !a || !b || !c || !ref || !mag;
  uint32_t s = 12345u + (uint32_t)(m * 7 + ta * 3 + tb);
  for (size_t i = 0; !bad && i < na; i++) a[i] = lcg(&s);
  for (size_t i = 0; !bad && i < nb; i++) b[i] = lcg(&s);
  for (size_t i = 0; !bad && i < nc; i++) c[i] = lcg(&s);
  const float alpha = 0.75f, beta = -0.5f;
  const int lda = ta ? m : k, ldb = tb ? k : n;
  for (int i = 0; !bad && i < m; i++)
    for (int j = 0; j < n; j++) {
      double acc = beta * (double)c[(size_t)i * n + j], sum = fabs(acc);
      for (int p = 0; p < k; p++) {
        double x = ta ? a[(size_t)p * lda + i] : a[(size_t)i * lda + p];
        double y = tb ? b[(size_t)j * ldb + p] : b[(size_t)p * ldb + j];
        acc += alpha * x * y;
        sum += fabs(alpha * x * y);
      }
      ref[(size_t)i * n + j] = acc;
      mag[(size_t)i * n + j] = sum;
    }
  if (!bad) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
                n, k, alpha, a, lda, b, ldb, beta, c, n);
    if (spoil) c[nc / 2] += 1.0f;
  }
  for (size_t i = 0; !bad && i < nc; i++)
    if (!(fabs((double)c[i] - ref[i]) <= 1e-4 * mag[i] + 1e-6)) bad = 1;
  free(a), free(b), free(c), free(ref), free(mag);
  return bad;
}

/* The child's work: 0 when the kernel OpenBLAS loaded agrees everywhere. */
static int probe_main(void) {
  static const int sizes[][3] = {{7, 5, 9}, {97, 80, 131}};
  const char *spoil = getenv("FERRY_GPT_TEST_BLAS_BAD");
  int bad = 0;
  for (int z = 0; z < 2; z++)
    for (int t = 0; t < 4; t++)
      bad |= check_one(sizes[z][0], sizes[z][1], sizes[z][2], t & 1, t >> 1,
                       spoil && *spoil && z == 1 && t == 3);
  return bad;
}

/* The environment with OPENBLAS_CORETYPE=kernel, one OpenBLAS thread and
 * PROBE_ENV, built before fork (the child only calls execve). */
static char **probe_env(const char *kernel, char *core, size_t len) {
  static const char *drop[] = {"OPENBLAS_CORETYPE=", "OPENBLAS_NUM_THREADS=", PROBE_ENV "="};
  size_t n = 0;
  while (environ[n]) n++;
  char **env = malloc((n + 4) * sizeof *env);
  if (!env) return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    int keep = 1;
    for (size_t d = 0; d < sizeof drop / sizeof *drop; d++)
      if (!strncmp(environ[i], drop[d], strlen(drop[d]))) keep = 0;
    if (keep) env[k++] = environ[i];
  }
  snprintf(core, len, "OPENBLAS_CORETYPE=%s", kernel);
  env[k++] = core;
  env[k++] = (char *)"OPENBLAS_NUM_THREADS=1";
  env[k++] = (char *)PROBE_ENV "=1";
  env[k] = NULL;
  return env;
}

/* 1 when ferry-gpt, run again with OPENBLAS_CORETYPE=kernel, passes the
 * reference GEMM. */
static int probe_passes(char **argv, const char *kernel) {
  char core[64];
  char **env = probe_env(kernel, core, sizeof core);
  if (!env) return 0;
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    execve("/proc/self/exe", argv, env);
    _exit(127);
  }
  free(env);
  int st = 0;
  pid_t r = -1;
  if (pid > 0)
    do r = waitpid(pid, &st, 0);
    while (r < 0 && errno == EINTR);
  return r == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* The kernel to restart with (NULL: none): the CPU's, where OpenBLAS fell
 * back and the reference GEMM agrees. */
static const char *choose(char **argv) {
  const char *pick = getenv("FERRY_GPT_TEST_BLAS_PICK");
  if (!pick || !*pick) pick = openblas_get_corename();
  const char *kernel = ferry_cpu_blas_kernel(ferry_cpu_simd(), pick);
  if (!kernel) return NULL;
  if (probe_passes(argv, kernel)) return kernel;
  snprintf(g_rejected, sizeof g_rejected, "%s", kernel);
  fprintf(stderr, "ferry-gpt: warning: OpenBLAS took its %s kernel (a CPU it does not know); "
          "its %s kernel, which this CPU's features call for, failed a check against a reference "
          "GEMM here, so %s stays (OPENBLAS_CORETYPE picks one)\n", pick, kernel, pick);
  return NULL;
}

void gpt_blas_start(char **argv, int restart) {
  if (getenv(PROBE_ENV)) exit(probe_main() ? 1 : 0);
  const int fitted = restart;
  const char *cmd = argv[0] ? argv[1] : NULL;
  const char *kernel = NULL, *chose = getenv(CHOSE_ENV), *core = getenv("OPENBLAS_CORETYPE");
  if (chose && core && !strcmp(chose, core))
    fprintf(stderr, "ferry-gpt: note: OpenBLAS does not know this CPU: it runs its %s kernel, "
            "which the CPU's features call for (OPENBLAS_CORETYPE picks another)\n",
            openblas_get_corename());
  if (!core && cmd && (!strcmp(cmd, "train") || !strcmp(cmd, "sample"))) kernel = choose(argv);
  if (kernel && !setenv("OPENBLAS_CORETYPE", kernel, 1) && !setenv(CHOSE_ENV, kernel, 1))
    restart = 1;
  if (!restart) return;
  fflush(NULL);
  execv("/proc/self/exe", argv); /* returns only on failure: go on as we are */
  if (kernel) unsetenv("OPENBLAS_CORETYPE"), unsetenv(CHOSE_ENV);
  if (fitted) unsetenv("OPENBLAS_NUM_THREADS"), unsetenv("FERRY_GPT_BLAS_FITTED");
}

void gpt_blas_json(FILE *out) {
  const char *chose = getenv(CHOSE_ENV), *core = getenv("OPENBLAS_CORETYPE");
  const char *by = !core ? "openblas" : chose && !strcmp(chose, core) ? "cpuid"
                                                                      : "OPENBLAS_CORETYPE";
  fprintf(out, "{\"config\": \"%s\", \"kernel\": \"%s\", \"chosen_by\": \"%s\", \"rejected\": ",
          openblas_get_config(), openblas_get_corename(), by);
  if (g_rejected[0]) fprintf(out, "\"%s\"}", g_rejected);
  else fprintf(out, "null}");
}
