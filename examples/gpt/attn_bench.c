/* examples/gpt/attn_bench.c — ferry-gpt-attn: times the CUDA flash
 * attention kernels (gpt_attn.h) alone, forward and forward + backward,
 * with CUDA events after a warm-up, on a packed [q k v] bf16 buffer laid
 * out as the model's; first checks them against the CPU reference on a
 * short sequence of the same heads. Prints one line (JSON with --json).
 */
#include "gpt.h"
#include "gpt_attn.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *usage =
    "NAME\n"
    "    ferry-gpt-attn - time the causal flash attention kernels alone\n"
    "\n"
    "SYNOPSIS\n"
    "    ferry-gpt-attn [--batch B] [--seq T] [--heads H] [--kv-heads KV] [--head-dim D]\n"
    "                   [--iters N] [--warmup W] [--check-seq S] [--json]\n"
    "\n"
    "DESCRIPTION\n"
    "    Checks the kernels against the CPU reference on one sequence of S tokens, then\n"
    "    times forward, backward and forward + backward on the GPU (milliseconds per\n"
    "    call, CUDA events, after W warm-up calls), q k v packed in one bf16 buffer of\n"
    "    rows [q k v] as the model keeps them. Prints one line.\n"
    "\n"
    "OPTIONS\n"
    "    --batch B       sequences (default 1).\n"
    "    --seq T         tokens per sequence (default 2048).\n"
    "    --heads H       query heads (default 16).\n"
    "    --kv-heads KV   key/value heads, dividing H (default H).\n"
    "    --head-dim D    16, 32, ... 128 (default 64).\n"
    "    --iters N       timed calls of each (default 20).\n"
    "    --warmup W      untimed calls first (default 3).\n"
    "    --check-seq S   the check's sequence length (default min(T, 256); 0 skips it).\n"
    "    --json          one JSON object: batch, seq, heads, kv_heads, head_dim, iters,\n"
    "                    fwd_ms, bwd_ms, fwd_bwd_ms, tflops_fwd, tflops_fwd_bwd (causal\n"
    "                    FLOPs: forward 2 B H T^2 D, backward 2.5 times that),\n"
    "                    peak_bytes (the device bytes it allocated), extra_bytes (of\n"
    "                    those, lse and delta), max_abs_err (the check's largest\n"
    "                    |GPU - CPU| over o, dq, dk, dv; null and check_skipped\n"
    "                    without a check).\n"
    "    -h, --help      this text.\n"
    "\n"
    "EXIT STATUS\n"
    "    0 on success, 1 on a CUDA failure or without a GPU, 2 on bad usage.\n";

typedef struct {
  int B, T, H, KV, D, iters, warmup, check_seq, json;
} opts;

static void die(const char *what, cudaError_t e) {
  fprintf(stderr, "ferry-gpt-attn: %s: %s\n", what, cudaGetErrorString(e));
  exit(1);
}
#define CK(x)                                                                                      \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) die(#x, e_);                                                            \
  } while (0)

static int parse(int argc, char **argv, opts *o) {
  *o = (opts){1, 2048, 16, -1, 64, 20, 3, -1, 0};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(usage, stdout);
      exit(0);
    }
    if (!strcmp(a, "--json")) {
      o->json = 1;
      continue;
    }
    static const char *names[] = {"--batch",    "--seq",   "--heads",  "--kv-heads",
                                  "--head-dim", "--iters", "--warmup", "--check-seq"};
    int *dst[] = {&o->B, &o->T, &o->H, &o->KV, &o->D, &o->iters, &o->warmup, &o->check_seq};
    int k = -1;
    for (int n = 0; n < 8; n++)
      if (!strcmp(a, names[n])) k = n;
    if (k < 0 || i + 1 >= argc) {
      fprintf(stderr, "ferry-gpt-attn: %s: %s (ferry-gpt-attn --help)\n", a,
              k < 0 ? "unknown option" : "needs a value");
      return -1;
    }
    char *end;
    errno = 0;
    long v = strtol(argv[++i], &end, 10);
    if (errno || *end || end == argv[i] || v < 0 || v > 1 << 30 || (v == 0 && k != 6 && k != 7)) {
      fprintf(stderr, "ferry-gpt-attn: %s %s: not a %s integer\n", a, argv[i],
              k >= 6 ? "non-negative" : "positive");
      return -1;
    }
    *dst[k] = (int)v;
  }
  if (o->KV < 0) o->KV = o->H;
  if (o->check_seq < 0) o->check_seq = o->T < 256 ? o->T : 256;
  return 0;
}

static unsigned long long rs = 88172645463325252ull;
static float urand(void) {
  rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
  return (float)(rs >> 40) / 8388608.0f - 1.0f;
}

typedef struct {
  gpt_attn_shape s;
  long BT, W;                /* rows; row width of the packed q k v */
  uint16_t *qkv, *o, *dout;  /* device bf16 */
  float *lse, *delta, *dqkv; /* device fp32 */
  size_t bytes, extra;
} bench;

static void *dalloc(bench *b, size_t n) {
  void *p;
  CK(cudaMalloc(&p, n));
  b->bytes += n;
  return p;
}

/* device buffers for (B, T) of o's heads; q k v and dout random bf16
 * (q wider: peaked rows); host copies of the bf16 values when hq / hdo */
static void make(bench *b, const opts *o, int B, int T, float *hq, float *hdo) {
  memset(b, 0, sizeof *b);
  b->W = (long)(o->H + 2 * o->KV) * o->D, b->BT = (long)B * T;
  b->s = (gpt_attn_shape){
      B, T, o->H, o->KV, o->D, b->W, b->W, b->W, (long)o->H * o->D, 1.0f / sqrtf((float)o->D)};
  size_t nq = (size_t)b->BT * b->W, no = (size_t)b->BT * o->H * o->D;
  uint16_t *h = malloc(nq * 2), *hd = malloc(no * 2);
  if (!h || !hd) fprintf(stderr, "ferry-gpt-attn: out of host memory\n"), exit(1);
  for (size_t i = 0; i < nq; i++) {
    int isq = (long)(i % b->W) < (long)o->H * o->D;
    h[i] = gpt_f32_to_bf16(urand() * (isq ? 2.5f : 1.0f));
    if (hq) hq[i] = gpt_bf16_to_f32(h[i]);
  }
  for (size_t i = 0; i < no; i++) {
    hd[i] = gpt_f32_to_bf16(urand());
    if (hdo) hdo[i] = gpt_bf16_to_f32(hd[i]);
  }
  b->qkv = dalloc(b, nq * 2), b->o = dalloc(b, no * 2), b->dout = dalloc(b, no * 2);
  b->extra = 2 * (size_t)B * o->H * T * sizeof(float);
  b->lse = dalloc(b, b->extra / 2), b->delta = dalloc(b, b->extra / 2);
  b->dqkv = dalloc(b, nq * sizeof(float));
  CK(cudaMemcpy(b->qkv, h, nq * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(b->dout, hd, no * 2, cudaMemcpyHostToDevice));
  free(h), free(hd);
}
static void unmake(bench *b) {
  cudaFree(b->qkv), cudaFree(b->o), cudaFree(b->dout), cudaFree(b->lse), cudaFree(b->delta);
  cudaFree(b->dqkv);
}

static void fwd(bench *b) {
  char err[256];
  long hq = (long)b->s.H * b->s.hd, hk = (long)b->s.KV * b->s.hd;
  if (gpt_attn_cuda_fwd(&b->s, b->qkv, b->qkv + hq, b->qkv + hq + hk, b->o, b->lse, NULL, err,
                        sizeof err))
    fprintf(stderr, "ferry-gpt-attn: %s\n", err), exit(1);
}
static void bwd(bench *b) {
  char err[256];
  long hq = (long)b->s.H * b->s.hd, hk = (long)b->s.KV * b->s.hd;
  if (gpt_attn_cuda_bwd(&b->s, b->qkv, b->qkv + hq, b->qkv + hq + hk, b->o, b->dout, b->lse,
                        b->delta, b->dqkv, b->dqkv + hq, b->dqkv + hq + hk, NULL, err, sizeof err))
    fprintf(stderr, "ferry-gpt-attn: %s\n", err), exit(1);
}

/* the largest |GPU - CPU reference| over o, dq, dk, dv on (1, T) */
static double check(const opts *o, int T) {
  bench b;
  long nq = (long)T * ((o->H + 2 * o->KV) * o->D), no = (long)T * o->H * o->D;
  float *q = malloc(nq * sizeof(float)), *dout = malloc(no * sizeof(float));
  float *ro = malloc(no * sizeof(float)), *rl = malloc((size_t)o->H * T * sizeof(float));
  float *rg = calloc(nq, sizeof(float)), *g = malloc(nq * sizeof(float));
  float *go = malloc(no * sizeof(float));
  uint16_t *o16 = malloc(no * 2);
  if (!q || !dout || !ro || !rl || !rg || !g || !go || !o16)
    fprintf(stderr, "ferry-gpt-attn: out of host memory\n"), exit(1);
  make(&b, o, 1, T, q, dout);
  fwd(&b), bwd(&b);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(o16, b.o, no * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(g, b.dqkv, nq * sizeof(float), cudaMemcpyDeviceToHost));
  for (long i = 0; i < no; i++)
    go[i] = gpt_bf16_to_f32(o16[i]);
  long hq = (long)o->H * o->D, hk = (long)o->KV * o->D;
  gpt_attn_ref_fwd(&b.s, q, q + hq, q + hq + hk, ro, rl);
  gpt_attn_ref_bwd(&b.s, q, q + hq, q + hq + hk, go, dout, rl, rg, rg + hq, rg + hq + hk);
  double worst = 0;
  for (long i = 0; i < no; i++)
    worst = fmax(worst, fabs((double)go[i] - ro[i]));
  for (long i = 0; i < nq; i++)
    worst = fmax(worst, fabs((double)g[i] - rg[i]));
  unmake(&b);
  free(q), free(dout), free(ro), free(rl), free(rg), free(g), free(go), free(o16);
  return worst;
}

/* milliseconds per call of fwd (what 1), bwd (2) or both (3) */
static double timed(bench *b, int what, int iters, cudaEvent_t e0, cudaEvent_t e1) {
  CK(cudaEventRecord(e0, NULL));
  for (int i = 0; i < iters; i++) {
    if (what & 1) fwd(b);
    if (what & 2) bwd(b);
  }
  CK(cudaEventRecord(e1, NULL));
  CK(cudaEventSynchronize(e1));
  float ms;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  return iters ? ms / iters : 0;
}

int main(int argc, char **argv) {
  opts o;
  if (parse(argc, argv, &o)) return 2;
  char why[256];
  gpt_attn_shape s = {o.B,
                      o.T,
                      o.H,
                      o.KV,
                      o.D,
                      (long)(o.H + 2 * o.KV) * o.D,
                      (long)(o.H + 2 * o.KV) * o.D,
                      (long)(o.H + 2 * o.KV) * o.D,
                      (long)o.H * o.D,
                      1.0f};
  if (gpt_attn_check(&s, why, sizeof why)) {
    fprintf(stderr, "ferry-gpt-attn: %s (ferry-gpt-attn --help)\n", why);
    return 2;
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    fprintf(stderr, "ferry-gpt-attn: no CUDA device\n");
    return 1;
  }
  double err = o.check_seq ? check(&o, o.check_seq) : NAN;

  bench b;
  make(&b, &o, o.B, o.T, NULL, NULL);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < o.warmup; i++)
    fwd(&b), bwd(&b);
  CK(cudaDeviceSynchronize());
  double f = timed(&b, 1, o.iters, e0, e1), bw = timed(&b, 2, o.iters, e0, e1);
  double fb = timed(&b, 3, o.iters, e0, e1);
  double flops = 2.0 * o.B * o.H * (double)o.T * o.T * o.D; /* causal forward */
  double tf = f > 0 ? flops / (f * 1e9) : 0, tfb = fb > 0 ? 3.5 * flops / (fb * 1e9) : 0;
  if (o.json) {
    printf("{\"batch\": %d, \"seq\": %d, \"heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, "
           "\"iters\": %d, \"fwd_ms\": %.4f, \"bwd_ms\": %.4f, \"fwd_bwd_ms\": %.4f, "
           "\"tflops_fwd\": %.2f, \"tflops_fwd_bwd\": %.2f, \"peak_bytes\": %zu, "
           "\"extra_bytes\": %zu, ",
           o.B, o.T, o.H, o.KV, o.D, o.iters, f, bw, fb, tf, tfb, b.bytes, b.extra);
    if (o.check_seq)
      printf("\"max_abs_err\": %.3g, \"check_seq\": %d}\n", err, o.check_seq);
    else
      printf("\"max_abs_err\": null, \"check_skipped\": \"--check-seq 0\"}\n");
  } else {
    printf("attention B %d T %d H %d KV %d D %d: forward %.3f ms (%.1f TFLOPS), backward %.3f "
           "ms, forward + backward %.3f ms (%.1f TFLOPS); %zu device bytes (%zu beyond q k v o "
           "and grads)",
           o.B, o.T, o.H, o.KV, o.D, f, tf, bw, fb, tfb, b.bytes, b.extra);
    if (o.check_seq) printf("; max |GPU - CPU| %.3g at T %d", err, o.check_seq);
    printf("\n");
  }
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  unmake(&b);
  return 0;
}
