/* bench/bench_compute.c — `ferry bench compute`: the compute rate the
 * planner's step-time model divides a step's FLOPs by (device_tflops,
 * device_tflops_fp32), measured at one model's own GEMMs: each linear of a
 * block forward and backward (dx, dW), the attention products of one head
 * and the LM head, with the transposes ferry-gpt's models use. On the host
 * backend: OpenBLAS's sgemm at the thread count ferry-gpt runs it with; on
 * cuda: cuBLAS (opened with dlopen, so the ferry command maps no cuBLAS
 * unless asked) in bf16 with fp32 accumulation and in fp32. A small product
 * of every transpose is checked against a C loop before anything is timed.
 * The rate is the planner's FLOPs of the step (ferry_plan_compute's, the
 * figure `ferry plan` divides) over the step's compute time: each GEMM's
 * time weighted by how often a step runs it, plus on the host the CPU
 * model's single-threaded elementwise passes (activations, softmax, norms,
 * the loss) and the params' conversions (through ferry_dtype_convert itself),
 * timed per element and counted at the model's shapes.
 */
#include "bench/args.h"
#include "bench/bench.h"
#include "bench/profile_out.h"
#include "core/core.h"
#include "format/json_writer.h"
#include "plan/plan.h"

#include "ferry.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef FERRY_BENCH_BLAS
#include <cblas.h>
#endif
#ifdef FERRY_HAVE_CUDA
#include "bench/compute_cuda.h"
#endif

#define PROG "ferry bench compute"

static void usage(FILE *f) {
  fprintf(f,
          "usage: ferry bench compute --model PRESET|config.json [--device auto|host|cuda]\n"
          "                           [--batch B] [--seq S] [--checkpointing on|off]\n"
          "                           [--threads N] [--iters N] [--profile-out FILE] [--json]\n"
          "\n"
          "Times the GEMMs of one training step of the model (the model description\n"
          "`ferry plan --model` reads; --config is an alias of --model): per block the\n"
          "forward, dx and dW products of every linear (q, k, v, o, gate, up, down;\n"
          "GPT-2: qkv, o, fc, proj), the attention products of one head, and the LM head.\n"
          "Each shape runs until 0.3 s or --iters runs have passed (the median counts);\n"
          "the step's compute time is the sum of count x time, each shape counted as\n"
          "often as a step runs it (a block's forward twice with checkpointing), and on\n"
          "the host the CPU model's elementwise passes, single-threaded as it runs them\n"
          "(an exp-bound and a streaming kernel timed per element, counted at the\n"
          "model's shapes, and the params' bf16 <-> fp32 conversions, 3 per param, timed\n"
          "through ferry_dtype_convert). The rate is the FLOPs `ferry plan` counts for the step over\n"
          "that time. A small product of every transpose is checked first.\n"
          "\n"
          "  host  OpenBLAS cblas_sgemm (fp32; ferry-gpt's CPU model), at OpenBLAS's\n"
          "        thread count (ferry-gpt's default) or --threads\n"
          "  cuda  cuBLAS cublasGemmEx, bf16 in and out with fp32 accumulation, and fp32\n"
          "\n"
          "options:\n"
          "  --model M          a preset (ferry plan --list-models) or a config.json\n"
          "  --params N         instead of --model: a dense Llama-shaped stand-in\n"
          "  --device KIND      auto (default: cuda when a GPU is present), host or cuda\n"
          "  --batch B, --seq S tokens per step, B x S (default 1 x 1024, S at most the\n"
          "                     model's positions)\n"
          "  --checkpointing    on (default, as ferry plan): the forward runs twice\n"
          "  --threads N        host: OpenBLAS threads (default: OpenBLAS's own count)\n"
          "  --iters N          most timed runs per shape, 1..100 (default 5)\n"
          "  --clock KIND       host: wall (default) or cpu, the process's CPU seconds: on a\n"
          "                     machine others share, with --threads 1, the time the work\n"
          "                     itself takes (compare with a run's CPU seconds per step)\n"
          "  --profile-out FILE write device_tflops and device_tflops_fp32 into FILE, a\n"
          "                     profile `ferry plan --profile` reads (its other keys kept)\n"
          "  --json             one object per shape, then one with \"result\": \"step\"\n"
          "                     (keys device, threads, kernel, model, tokens, flops (the\n"
          "                     plan's), gemm_flops, gemm_seconds, elementwise_seconds,\n"
          "                     seconds, gemm_tflops, tflops, tflops_fp32, validated)\n"
          "\n"
          "On the host backend both profile keys get the fp32 rate: the CPU model\n"
          "computes in fp32 whatever the params' dtype. exit status: 0 measured, 1 a\n"
          "check failed or no device, 2 bad usage.\n");
}

/* ---- the shapes --------------------------------------------------------------- */

/* One row-major product C[M,N] = op(A) op(B), as cblas_sgemm takes it. */
typedef struct {
  char name[24];
  int ta, tb; /* 1: transposed */
  long M, N, K;
  double count; /* runs per training step */
  double seconds, flops;
} gemm_shape;

#define MAX_SHAPES 40

typedef struct {
  gemm_shape s[MAX_SHAPES];
  int n;
} shape_list;

static void add(shape_list *l, const char *name, int ta, int tb, long M, long N, long K,
                double count) {
  if (l->n >= MAX_SHAPES || M < 1 || N < 1 || K < 1 || count <= 0) return;
  gemm_shape *g = &l->s[l->n++];
  *g = (gemm_shape){.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .count = count};
  snprintf(g->name, sizeof g->name, "%s", name);
}

/* A linear y[n,out] = x[n,in] W: forward, dx and dW as examples/gpt's
 * linear_fwd / linear_bwd run them (conv1d: W is [in,out], GPT-2). */
static void add_linear(shape_list *l, const char *name, long n, long in, long out, int conv1d,
                       double fwd, double bwd) {
  char a[24];
  snprintf(a, sizeof a, "%s.fwd", name);
  add(l, a, 0, !conv1d, n, out, in, fwd);
  snprintf(a, sizeof a, "%s.dx", name);
  add(l, a, 0, conv1d, n, in, out, bwd);
  snprintf(a, sizeof a, "%s.dW", name);
  if (conv1d) add(l, a, 1, 0, in, out, n, bwd);
  else add(l, a, 1, 0, out, in, n, bwd);
}

/* Every GEMM of a step of model m over batch x seq tokens. */
static void model_shapes(const ferry_plan_model *m, long batch, long seq, int ckpt,
                         shape_list *l) {
  long n = batch * seq, C = (long)m->hidden, F = (long)m->ffn, L = (long)m->layers;
  long hd = (long)m->head_dim, H = (long)m->heads, kv = (long)(m->kv_heads * m->head_dim);
  double fwd = (double)L * (ckpt ? 2 : 1), bwd = (double)L;
  memset(l, 0, sizeof *l);
  if (m->arch == FERRY_ARCH_GPT2) {
    add_linear(l, "qkv", n, C, 3 * C, 1, fwd, bwd);
    add_linear(l, "o", n, C, C, 1, fwd, bwd);
    add_linear(l, "fc", n, C, F, 1, fwd, bwd);
    add_linear(l, "proj", n, F, C, 1, fwd, bwd);
  } else {
    add_linear(l, "q", n, C, H * hd, 0, fwd, bwd);
    add_linear(l, "k", n, C, kv, 0, fwd, bwd);
    add_linear(l, "v", n, C, kv, 0, fwd, bwd);
    add_linear(l, "o", n, H * hd, C, 0, fwd, bwd);
    add_linear(l, "gate", n, C, F, 0, fwd, bwd);
    add_linear(l, "up", n, C, F, 0, fwd, bwd);
    add_linear(l, "down", n, F, C, 0, fwd, bwd);
  }
  /* attention, per sequence and head (examples/gpt/model_cpu.c) */
  double heads = (double)batch * (double)H;
  add(l, "attn.qk", 0, 1, seq, seq, hd, heads * fwd);
  add(l, "attn.pv", 0, 0, seq, hd, seq, heads * fwd);
  add(l, "attn.dp", 0, 1, seq, seq, hd, heads * bwd);
  add(l, "attn.dv", 1, 0, seq, hd, seq, heads * bwd);
  add(l, "attn.dq", 0, 0, seq, hd, seq, heads * bwd);
  add(l, "attn.dk", 1, 0, seq, hd, seq, heads * bwd);
  /* the LM head, W [vocab, hidden]; not recomputed */
  add_linear(l, "head", n, C, (long)m->vocab, 0, 1, 1);
  for (int i = 0; i < l->n; i++)
    l->s[i].flops = 2.0 * (double)l->s[i].M * (double)l->s[i].N * (double)l->s[i].K;
}

/* ---- the options ----------------------------------------------------------------- */

typedef struct {
  const char *model, *params, *profile;
  int device; /* 0 auto, 1 host, 2 cuda */
  long long batch, seq, threads, iters;
  int ckpt, json, cpu_clock;
  ferry_plan_model m;
} options;

/* The clock of the host's timings: wall, or the process's CPU seconds. */
static int use_cpu_clock;
static double host_now(void) {
  if (!use_cpu_clock) return ferry_now();
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int load_model(options *o) {
  char why[512];
  int rc;
  if (!!o->model == !!o->params) {
    fprintf(stderr, PROG ": give one of --model PRESET|config.json or --params N\n");
    return 2;
  }
  if (o->params) {
    uint64_t n;
    if (bench_arg_count(PROG, "--params", o->params, 1000, 1ull << 50, &n)) return 2;
    rc = ferry_plan_model_from_params(n, &o->m, why, sizeof why);
  } else {
    /* a preset, else a config.json (a path, or a name ending in .json) */
    size_t n = strlen(o->model);
    int file = strchr(o->model, '/') || (n > 5 && !strcmp(o->model + n - 5, ".json"));
    rc = file ? FERRY_ENOENT : ferry_plan_model_preset(o->model, &o->m, why, sizeof why);
    if (file) rc = ferry_plan_model_from_file(o->model, &o->m, why, sizeof why);
  }
  if (rc) {
    fprintf(stderr, PROG ": %s\n", why);
    return 2;
  }
  if (o->m.arch == FERRY_ARCH_GPT2 && o->m.positions && o->seq > o->m.positions) {
    fprintf(stderr, PROG ": --seq %lld: %s has positions for %lld tokens\n", o->seq, o->m.name,
            (long long)o->m.positions);
    return 2;
  }
  return 0;
}

/* -1 to go on, or the exit code. */
static int parse_args(options *o, int argc, char **argv) {
  memset(o, 0, sizeof *o);
  o->batch = 1, o->seq = 1024, o->iters = 5, o->ckpt = 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int bad = 0;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--json"))
      o->json = 1;
    else if (!v) {
      fprintf(stderr, PROG ": unknown or incomplete option '%s' (see --help)\n", a);
      return 2;
    } else if (!strcmp(a, "--model") || !strcmp(a, "--config"))
      o->model = argv[++i];
    else if (!strcmp(a, "--params"))
      o->params = argv[++i];
    else if (!strcmp(a, "--profile-out"))
      o->profile = argv[++i];
    else if (!strcmp(a, "--device"))
      bad = bench_arg_choice(PROG, a, argv[++i], (const char *const[]){"auto", "host", "cuda", NULL},
                             &o->device);
    else if (!strcmp(a, "--clock"))
      bad = bench_arg_choice(PROG, a, argv[++i], (const char *const[]){"wall", "cpu", NULL},
                             &o->cpu_clock);
    else if (!strcmp(a, "--checkpointing")) {
      int off = 0;
      bad = bench_arg_choice(PROG, a, argv[++i], (const char *const[]){"on", "off", NULL}, &off);
      o->ckpt = !off;
    } else if (!strcmp(a, "--batch"))
      bad = bench_arg_int(PROG, a, argv[++i], 1, 4096, NULL, &o->batch);
    else if (!strcmp(a, "--seq"))
      bad = bench_arg_int(PROG, a, argv[++i], 1, 1 << 17, NULL, &o->seq);
    else if (!strcmp(a, "--threads"))
      bad = bench_arg_int(PROG, a, argv[++i], 1, 1024, NULL, &o->threads);
    else if (!strcmp(a, "--iters"))
      bad = bench_arg_int(PROG, a, argv[++i], 1, 100, NULL, &o->iters);
    else {
      fprintf(stderr, PROG ": unknown option '%s' (see --help)\n", a);
      return 2;
    }
    if (bad) return 2;
  }
  if (o->batch * o->seq > (1ll << 20)) {
    fprintf(stderr, PROG ": --batch x --seq %lld: at most 1M tokens\n", o->batch * o->seq);
    return 2;
  }
  int rc = load_model(o);
  return rc ? rc : -1;
}

/* ---- the reference -------------------------------------------------------------- */

/* Pseudo-random values in [-0.5, 0.5). */
static void fill(float *x, size_t n, unsigned seed) {
  uint32_t s = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    x[i] = (float)(s >> 8) * (1.0f / 16777216.0f) - 0.5f;
  }
}

/* C = alpha op(A) op(B) + beta C in double, row-major; e[i] = the sum of
 * |terms| of C[i] (the scale of its rounding error). */
static void ref_gemm(int ta, int tb, long M, long N, long K, float alpha, const float *A,
                     const float *B, float beta, const float *C0, double *C, double *e) {
  long lda = ta ? M : K, ldb = tb ? K : N;
  for (long i = 0; i < M; i++)
    for (long j = 0; j < N; j++) {
      double s = 0, a = 0;
      for (long k = 0; k < K; k++) {
        double x = ta ? A[k * lda + i] : A[i * lda + k], y = tb ? B[j * ldb + k] : B[k * ldb + j];
        s += x * y;
        a += fabs(x * y);
      }
      C[i * N + j] = alpha * s + beta * C0[i * N + j];
      e[i * N + j] = fabs(alpha) * a + fabs(beta * C0[i * N + j]);
    }
}

/* The largest error of got against ref, relative to each element's scale. */
static double rel_error(const float *got, const double *ref, const double *e, size_t n) {
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)got[i] - ref[i]) / (e[i] > 1e-30 ? e[i] : 1e-30);
    if (!(d <= worst)) worst = isnan(d) ? INFINITY : d;
  }
  return worst;
}

/* A backend: what it is, and the median seconds of one shape's product
 * over its own buffers, run until 0.3 s or `iters` runs (< 0: failed). */
typedef struct {
  const char *name;
  char device[160], kernel[64];
  int threads;
  double (*time_shape)(void *ctx, const gemm_shape *g, int iters);
  void *ctx;
} backend;

/* ---- host: OpenBLAS -------------------------------------------------------------- */

#ifdef FERRY_BENCH_BLAS
typedef struct {
  float *a, *b, *c;
  size_t cap; /* floats of each */
} host_ctx;

static void host_sgemm(int ta, int tb, long M, long N, long K, float alpha, const float *A,
                       const float *B, float beta, float *C) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              (int)M, (int)N, (int)K, alpha, A, ta ? (int)M : (int)K, B, tb ? (int)K : (int)N,
              beta, C, (int)N);
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

static double median_of(double *t, int n) {
  qsort(t, (size_t)n, sizeof *t, cmp_double);
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static double host_time(void *ctx, const gemm_shape *g, int iters) {
  host_ctx *h = ctx;
  double t[100], spent = 0;
  int n = 0;
  while (n < iters && (n == 0 || spent < 0.3)) {
    double t0 = host_now();
    host_sgemm(g->ta, g->tb, g->M, g->N, g->K, 1.0f, h->a, h->b, 0.0f, h->c);
    t[n] = host_now() - t0;
    spent += t[n++];
  }
  return median_of(t, n);
}

/* Every transpose, alpha and beta, against the reference: 0, or 1 said. */
static int host_check(double *worst) {
  enum { M = 67, N = 45, K = 129 };
  float A[M * K], B[K * N], C[M * N], C0[M * N];
  double R[M * N], E[M * N];
  *worst = 0;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      fill(A, M * K, 1 + ta), fill(B, K * N, 3 + tb), fill(C0, M * N, 7);
      memcpy(C, C0, sizeof C);
      host_sgemm(ta, tb, M, N, K, 0.75f, A, B, 0.5f, C);
      ref_gemm(ta, tb, M, N, K, 0.75f, A, B, 0.5f, C0, R, E);
      double err = rel_error(C, R, E, M * N);
      if (err > *worst) *worst = err;
      if (err > 1e-5) {
        fprintf(stderr, PROG ": check failed: sgemm (%c%c, %dx%dx%d) is off the reference "
                "by %.3g of its scale\n", ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, err);
        return 1;
      }
    }
  return 0;
}

static int host_open(const options *o, const shape_list *l, backend *b, host_ctx *h) {
  if (o->threads) openblas_set_num_threads((int)o->threads);
  size_t cap = 1;
  for (int i = 0; i < l->n; i++) {
    const gemm_shape *g = &l->s[i];
    size_t x[3] = {(size_t)(g->M * g->K), (size_t)(g->K * g->N), (size_t)(g->M * g->N)};
    for (int k = 0; k < 3; k++) cap = x[k] > cap ? x[k] : cap;
  }
  uint64_t avail = bench_mem_available();
  if (avail && 3.0 * 4.0 * (double)cap > 0.8 * (double)avail) {
    fprintf(stderr, PROG ": the largest GEMM needs 3 x %zu MiB; %llu MiB are available\n",
            cap * 4 >> 20, (unsigned long long)(avail >> 20));
    return 1;
  }
  h->a = malloc(cap * 4), h->b = malloc(cap * 4), h->c = malloc(cap * 4), h->cap = cap;
  if (!h->a || !h->b || !h->c) {
    fprintf(stderr, PROG ": out of memory for 3 x %zu MiB\n", cap * 4 >> 20);
    return 1;
  }
  fill(h->a, cap, 11), fill(h->b, cap, 13), memset(h->c, 0, cap * 4);
  b->name = "host";
  b->threads = openblas_get_num_threads();
  const char *core = openblas_get_corename();
  snprintf(b->kernel, sizeof b->kernel, "%.40s", core ? core : "?");
  ferry_host_info hi;
  if (ferry_host_get_info(&hi) == FERRY_OK)
    snprintf(b->device, sizeof b->device, "host: %.80s, OpenBLAS %.40s, %d threads", hi.cpu_model,
             b->kernel, b->threads);
  else
    snprintf(b->device, sizeof b->device, "host: OpenBLAS %.40s, %d threads", b->kernel,
             b->threads);
  /* ferry-gpt runs the kernel the CPU's features call for (examples/gpt/blas.c) */
  const char *want = ferry_cpu_blas_kernel(ferry_cpu_simd(), core);
  if (want && !getenv("OPENBLAS_CORETYPE"))
    fprintf(stderr, PROG ": note: OpenBLAS runs its %s kernel here, ferry-gpt would run %s: "
            "rerun as OPENBLAS_CORETYPE=%s ferry bench compute ...\n", b->kernel, want, want);
  b->time_shape = host_time;
  b->ctx = h;
  return 0;
}

static void host_close(host_ctx *h) {
  free(h->a), free(h->b), free(h->c);
}

/* ---- host: the CPU model's elementwise passes ------------------------------------ */

/* Elements of a step the CPU model passes over with an exp (SwiGLU / GELU,
 * the attention softmax, the loss), with plain streaming arithmetic (norms,
 * residuals, rotary, biases, the softmax's other passes, the loss's maxima,
 * zeroing), after examples/gpt/model_cpu.c; and the params' conversions:
 * 16-bit params widened to fp32 at each fetch (forward and backward) and
 * the grads handed back (n_conv, the step's 3 x params). */
static void elementwise_counts(const ferry_plan_model *m, long batch, long seq, int ckpt,
                               double *n_exp, double *n_pass, double *n_conv) {
  double n = (double)batch * (double)seq, C = (double)m->hidden, F = (double)m->ffn;
  double att = (double)batch * (double)m->heads * (double)seq * (double)seq;
  double V = (double)m->vocab, f = ckpt ? 2 : 1, L = (double)m->layers;
  double P = (double)ferry_plan_model_params(m);
  *n_exp = L * (f * (n * F + att / 2) + n * F) + 3 * n * V;
  double fwd = 12 * n * C + 2 * n * F + 2 * att, bwd = 12 * n * C + 3 * n * F + 3 * att;
  if (m->arch == FERRY_ARCH_GPT2) fwd += n * (5 * C + F), bwd += n * (5 * C + F);
  *n_pass = L * (f * fwd + bwd) + 4 * n * V;
  *n_conv = 3 * P;
}

static float exp_kernel(float *y, const float *x, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i]));
  return y[n / 2];
}

static float pass_kernel(float *y, const float *x, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] += 0.5f * x[i];
  return y[n / 3];
}

/* One conversion pass as the trainers run it (ferry_dtype_convert): two
 * widenings of bf16 params to fp32 for each narrowing of fp32 grads. */
static float conv_kernel(float *y, const float *x, uint16_t *h, size_t n) {
  (void)ferry_dtype_convert(h, FERRY_DT_BF16, x, FERRY_DT_F32, n, 1.0f);
  (void)ferry_dtype_convert(y, FERRY_DT_F32, h, FERRY_DT_BF16, n, 1.0f);
  (void)ferry_dtype_convert(y, FERRY_DT_F32, h, FERRY_DT_BF16, n, 1.0f);
  return y[n / 5];
}

/* Seconds per element of each kernel over n-element buffers (the median
 * of 5 passes, one untimed); the conversion's per converted element. */
static int elementwise_rates(size_t n, double *t_exp, double *t_pass, double *t_conv) {
  float *x = malloc(n * 4), *y = malloc(n * 4);
  uint16_t *h = malloc(n * 2);
  if (!x || !y || !h) {
    free(x), free(y), free(h);
    return 1;
  }
  fill(x, n, 5), fill(y, n, 9);
  double t[3][5];
  volatile float sink = 0;
  for (int k = 0; k < 3; k++)
    for (int r = -1; r < 5; r++) {
      double t0 = host_now();
      sink += k == 2 ? conv_kernel(y, x, h, n) : k ? pass_kernel(y, x, n) : exp_kernel(y, x, n);
      if (r >= 0) t[k][r] = (host_now() - t0) / (double)(k == 2 ? 3 * n : n);
    }
  (void)sink;
  *t_exp = median_of(t[0], 5), *t_pass = median_of(t[1], 5), *t_conv = median_of(t[2], 5);
  free(x), free(y), free(h);
  return 0;
}
#endif

/* The FLOPs `ferry plan` counts for this step. */
static double plan_flops(const options *o) {
  ferry_plan_input in = ferry_plan_input_default();
  in.model = o->m;
  in.batch = o->batch, in.seq = o->seq, in.checkpointing = o->ckpt;
  in.budget[0] = in.budget[1] = in.budget[2] = 1ull << 50;
  static ferry_plan_result r;
  return ferry_plan_compute(&in, &r, NULL, 0) ? 0 : r.cand[0].flops;
}

/* ---- cuda: cuBLAS --------------------------------------------------------------------- */

static int time_all(const options *o, backend *b, shape_list *l, const char *dtype,
                    double *flops, double *seconds);
/* A step's figures: its GEMMs (bf16 on cuda), the host's elementwise
 * passes, the plan's FLOPs and the rates. */
typedef struct {
  double gemm_flops, gemm_sec, elem_sec, flops, tflops, tflops32, check;
} step_figures;

#ifdef FERRY_HAVE_CUDA
typedef struct {
  compute_cuda *c;
  int fp32;
} cuda_ctx;

static double cuda_time(void *ctx, const gemm_shape *g, int iters) {
  cuda_ctx *x = ctx;
  return compute_cuda_time(x->c, x->fp32, g->ta, g->tb, g->M, g->N, g->K, iters);
}

/* Times l in bf16, then fp32: 0, or 1 said. */
static int cuda_run(const options *o, shape_list *l, backend *b, step_figures *f) {
  size_t cap = 1;
  for (int i = 0; i < l->n; i++) {
    const gemm_shape *g = &l->s[i];
    size_t x[3] = {(size_t)(g->M * g->K), (size_t)(g->K * g->N), (size_t)(g->M * g->N)};
    for (int k = 0; k < 3; k++) cap = x[k] > cap ? x[k] : cap;
  }
  cuda_ctx x = {NULL, 0};
  if (compute_cuda_open(&x.c, cap, b->device, sizeof b->device, PROG)) return 1;
  b->name = "cuda";
  snprintf(b->kernel, sizeof b->kernel, "cublasGemmEx");
  b->time_shape = cuda_time;
  b->ctx = &x;
  int rc = compute_cuda_check(x.c, &f->check, PROG);
  double f32, s32;
  if (!rc) rc = time_all(o, b, l, "bf16", &f->gemm_flops, &f->gemm_sec);
  if (!rc) f->tflops = f->flops / f->gemm_sec / 1e12;
  x.fp32 = 1;
  if (!rc) rc = time_all(o, b, l, "fp32", &f32, &s32);
  if (!rc) f->tflops32 = f->flops / s32 / 1e12;
  compute_cuda_close(x.c);
  return rc;
}
#endif

/* ---- the run ----------------------------------------------------------------------- */

static void print_shape(const options *o, const backend *b, const gemm_shape *g,
                        const char *dtype) {
  double gf = g->flops / g->seconds / 1e9;
  if (!o->json) {
    printf("  %-10s %-4s %c%c %6ld x %6ld x %6ld  x%-8.0f %9.3f ms  %8.1f GFLOP/s\n", g->name,
           dtype, g->ta ? 'T' : 'N', g->tb ? 'T' : 'N', g->M, g->N, g->K, g->count,
           g->seconds * 1e3, gf);
    return;
  }
  json_out j;
  json_begin(&j, stdout);
  json_str(&j, "bench", "compute");
  json_str(&j, "result", "gemm");
  json_str(&j, "device", b->name);
  json_str(&j, "gemm", g->name);
  json_str(&j, "dtype", dtype);
  json_int(&j, "m", g->M);
  json_int(&j, "n", g->N);
  json_int(&j, "k", g->K);
  json_num(&j, "count", g->count);
  json_num(&j, "seconds", g->seconds);
  json_num(&j, "gflops", gf);
  json_end(&j);
}

/* Times every shape of l on b; the step's FLOPs and seconds. 0, or 1. */
static int time_all(const options *o, backend *b, shape_list *l, const char *dtype,
                    double *flops, double *seconds) {
  *flops = *seconds = 0;
  for (int i = 0; i < l->n; i++) {
    gemm_shape *g = &l->s[i];
    g->seconds = b->time_shape(b->ctx, g, (int)o->iters);
    if (!(g->seconds > 0)) {
      fprintf(stderr, PROG ": timing %s failed\n", g->name);
      return 1;
    }
    print_shape(o, b, g, dtype);
    *flops += g->count * g->flops;
    *seconds += g->count * g->seconds;
  }
  return 0;
}

static void print_step(const options *o, const backend *b, const step_figures *f) {
  long long tokens = o->batch * o->seq;
  int host = !strcmp(b->name, "host");
  double sec = f->gemm_sec + f->elem_sec;
  if (!o->json) {
    printf("%s: %s, %lld tokens (batch %lld x seq %lld), checkpointing %s\n", o->m.name,
           b->device, tokens, o->batch, o->seq, o->ckpt ? "on" : "off");
    printf("step GEMMs %.4g FLOP in %.3f s (%.4g TFLOP/s%s; checked: error %.2g of scale)\n",
           f->gemm_flops, f->gemm_sec, f->gemm_flops / f->gemm_sec / 1e12, host ? "" : " bf16",
           f->check);
    if (host)
      printf("elementwise passes %.3f s (one thread)%s\n", f->elem_sec,
             o->cpu_clock ? "; CPU seconds, not wall" : "");
    printf("step %.4g FLOP as ferry plan counts them in %.3f s: %.4g TFLOP/s", f->flops, sec,
           f->tflops);
    if (host) printf(" (device_tflops and device_tflops_fp32)\n");
    else printf(" bf16 (device_tflops), %.4g TFLOP/s fp32 (device_tflops_fp32)\n", f->tflops32);
    return;
  }
  json_out j;
  json_begin(&j, stdout);
  json_str(&j, "bench", "compute");
  json_str(&j, "result", "step");
  json_str(&j, "device", b->device);
  json_int(&j, "threads", b->threads);
  json_str(&j, "kernel", b->kernel);
  json_str(&j, "model", o->m.name);
  json_int(&j, "tokens", tokens);
  json_bool(&j, "checkpointing", o->ckpt);
  json_str(&j, "clock", o->cpu_clock ? "cpu" : "wall");
  json_num(&j, "flops", f->flops);
  json_num(&j, "gemm_flops", f->gemm_flops);
  json_num(&j, "gemm_seconds", f->gemm_sec);
  json_num(&j, "elementwise_seconds", f->elem_sec);
  json_num(&j, "seconds", sec);
  json_num(&j, "gemm_tflops", f->gemm_flops / f->gemm_sec / 1e12);
  json_num(&j, "tflops", f->tflops);
  json_num(&j, "tflops_fp32", f->tflops32);
  json_num(&j, "check_error", f->check);
  json_bool(&j, "validated", 1);
  json_end(&j);
}

/* --profile-out: both keys into the file, its other keys kept. */
static int write_keys(const options *o, const backend *b, double tflops, double tflops32) {
  char src[2][512], machine[300], why[600];
  long long tokens = o->batch * o->seq;
  int host = !strcmp(b->name, "host");
  snprintf(src[0], sizeof src[0],
           "ferry bench compute --device %s --model %s --batch %lld --seq %lld: %s GEMMs of one "
           "step, %lld tokens, %s%s",
           b->name, o->m.name, o->batch, o->seq, host ? "sgemm" : "cuBLAS bf16", tokens,
           b->device, host ? "; the host computes in fp32" : "");
  snprintf(src[1], sizeof src[1], "%.480s%s", src[0], host ? "" : "; fp32 GEMMs");
  snprintf(machine, sizeof machine, "%s", b->device);
  const unsigned bits[2] = {FERRY_PLAN_BW_TFLOPS, FERRY_PLAN_BW_TFLOPS32};
  const double v[2] = {tflops, tflops32};
  const char *s[2] = {src[0], src[1]};
  if (bench_profile_update(o->profile, bits, v, s, 2, machine, why, sizeof why)) {
    fprintf(stderr, PROG ": --profile-out %s: %s\n", o->profile, why);
    return 1;
  }
  if (!o->json) printf("profile %s: device_tflops %.4g, device_tflops_fp32 %.4g\n", o->profile,
                       tflops, tflops32);
  return 0;
}

#ifdef FERRY_BENCH_BLAS
/* The host's step: GEMMs, then the elementwise passes. 0, or 1 said. */
static int host_run(const options *o, shape_list *l, backend *b, step_figures *f) {
  host_ctx h;
  memset(&h, 0, sizeof h);
  if (host_check(&f->check) || host_open(o, l, b, &h)) {
    host_close(&h);
    return 1;
  }
  int rc = time_all(o, b, l, "fp32", &f->gemm_flops, &f->gemm_sec);
  host_close(&h);
  double ne, np, nc, te, tp, tc;
  elementwise_counts(&o->m, (long)o->batch, (long)o->seq, o->ckpt, &ne, &np, &nc);
  size_t n = (size_t)(o->batch * o->seq * o->m.ffn);
  if (!rc && elementwise_rates(n < (1u << 16) ? 1u << 16 : n > (1u << 24) ? 1u << 24 : n, &te,
                               &tp, &tc)) {
    fprintf(stderr, PROG ": out of memory for the elementwise passes\n");
    rc = 1;
  }
  if (rc) return 1;
  f->elem_sec = ne * te + np * tp + nc * tc;
  f->tflops = f->tflops32 = f->flops / (f->gemm_sec + f->elem_sec) / 1e12;
  return 0;
}
#endif

int ferry_bench_compute_main(int argc, char **argv) {
  options o;
  int ex = parse_args(&o, argc, argv);
  if (ex >= 0) return ex;
  shape_list l;
  model_shapes(&o.m, (long)o.batch, (long)o.seq, o.ckpt, &l);
  backend b;
  memset(&b, 0, sizeof b);
  step_figures f;
  memset(&f, 0, sizeof f);
  f.flops = plan_flops(&o);
  use_cpu_clock = o.cpu_clock;
  int device = o.device;
#ifdef FERRY_HAVE_CUDA
  if (device == 0) device = compute_cuda_present() ? 2 : 1;
#else
  if (device == 0) device = 1;
#endif
  if (device == 2) {
#ifdef FERRY_HAVE_CUDA
    if (cuda_run(&o, &l, &b, &f)) return 1;
#else
    fprintf(stderr, PROG ": --device cuda: this ferry was built without CUDA\n");
    return 1;
#endif
  } else {
#ifdef FERRY_BENCH_BLAS
    if (host_run(&o, &l, &b, &f)) return 1;
#else
    fprintf(stderr, PROG ": --device host: this ferry was built without OpenBLAS "
                    "(apt-get install libopenblas-dev)\n");
    return 1;
#endif
  }
  print_step(&o, &b, &f);
  if (o.profile && write_keys(&o, &b, f.tflops, f.tflops32)) return 1;
  return 0;
}
