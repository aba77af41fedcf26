/* bench/bench_adam.c — `ferry bench adam`: the CPU optimizer step. Validates
 * one step of the chosen kernels against the scalar reference (bit for bit;
 * LAMB within 1e-5), then times steps over --params parameters, for any state
 * dtype (fp32, bf16, int8) and master (fp32, bf16). --roofline times,
 * interleaved with ours, a read-modify-write kernel with no arithmetic that
 * moves the same bytes per element as the chosen combination; --two-pass times the step without the param copy followed by a
 * separate fp32 -> 16-bit downcast pass (what fusing saves).
 */
#include "bench/args.h"
#include "bench/bench.h"
#include "format/json_writer.h"
#include "core/core.h"
#include "optim/optim.h"

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f) {
  fprintf(f,
          "usage: ferry bench adam [options]\n"
          "  --params N          parameters (size suffixes k/M/G = powers of 1024; default 256M)\n"
          "  --optimizer NAME    adamw (default), adam, adagrad, lamb, sgd, lion\n"
          "  --grad DT           gradient dtype: fp32 (default), fp16, bf16\n"
          "  --param-copy DT     16-bit param copy written in the same pass: none (default),\n"
          "                      fp16, bf16\n"
          "  --state-dtype DT    optimizer state dtype: fp32 (default), bf16, int8 (blockwise,\n"
          "                      absmax per --state-block elements); --state is an alias\n"
          "  --state-block N     int8 states: elements per absmax block (default 256)\n"
          "  --master DT         fp32 (default): fp32 master weights; bf16: the bf16 params are\n"
          "                      the master, stochastic rounding, no param copy (--param-copy\n"
          "                      is ignored)\n"
          "  --threads N         worker threads (default 1; 0 = one per core; at most 64 per\n"
          "                      CPU and 1024)\n"
          "  --steps N           timed steps, 1..1000 (default 5); the median is reported\n"
          "  --simd LEVEL        scalar, avx2, avx512 (default: best the CPU has, or FERRY_SIMD)\n"
          "  --roofline          also time a no-arithmetic read-modify-write kernel with the\n"
          "                      same memory traffic (the same bytes per element of p, g, each\n"
          "                      state with its absmax, the copy), interleaved with ours\n"
          "  --two-pass          also time step-without-copy + a separate downcast pass\n"
          "                      (needs --param-copy fp16|bf16), interleaved with ours\n"
          "  --json              one JSON object on stdout\n"
          "  -h, --help          this text\n"
          "JSON keys: bench, optimizer, simd, params, threads, grad_dtype, param_copy,\n"
          "state_dtype, master_dtype, state_block, steps, seconds_per_step, params_per_s, bytes_per_param, gb_per_s, and\n"
          "with --roofline roofline_seconds_per_step, roofline_gb_per_s,\n"
          "roofline_bytes_per_param, fraction_of_roofline (median of per-pair roofline/ours\n"
          "ratios);\n"
          "with --two-pass two_pass_seconds_per_step, two_pass_bytes_per_param, fused_speedup.\n");
}

static int parse_dt(const char *s, int allow_none) {
  if (!strcmp(s, "fp32") || !strcmp(s, "f32")) return FERRY_DT_F32;
  if (!strcmp(s, "fp16") || !strcmp(s, "f16")) return FERRY_DT_F16;
  if (!strcmp(s, "bf16")) return FERRY_DT_BF16;
  if (allow_none && !strcmp(s, "none")) return FERRY_DT_NONE;
  return -1;
}

static const char *dt_name(int dt) {
  switch (dt) {
  case FERRY_DT_F32: return "fp32";
  case FERRY_DT_F16: return "fp16";
  case FERRY_DT_BF16: return "bf16";
  case FERRY_DT_I8: return "int8";
  default: return "none";
  }
}

static size_t dt_size(int dt) {
  return dt == FERRY_DT_F32 ? 4 : dt == FERRY_DT_NONE ? 0 : dt == FERRY_DT_I8 ? 1 : 2;
}

static const char *opt_names[] = {"adamw", "adam", "adagrad", "lamb", "sgd", "lion"};


/* ---- buffers --------------------------------------------------------------- */

typedef struct {
  size_t n;
  int mdt, sdt, gdt, cdt;
  size_t sbytes; /* bytes of one state buffer (ferry_optimizer_state_bytes) */
  void *p, *g, *m, *v, *pc;
} bufset;

static void *big_alloc(size_t bytes) {
  void *p = NULL;
  if (posix_memalign(&p, 4096, bytes ? bytes : 64)) return NULL;
  return p;
}

static void buf_free(bufset *b) {
  free(b->p);
  free(b->g);
  free(b->m);
  free(b->v);
  free(b->pc);
  memset(b, 0, sizeof *b);
}

static uint16_t to16(float x, int dt) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if (dt == FERRY_DT_BF16) return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  /* fp16 for test data in a safe range: truncation is enough here */
  uint32_t s = (u >> 16) & 0x8000u, e = (u >> 23) & 0xffu, m = u & 0x7fffffu;
  if (e < 103) return (uint16_t)s;
  if (e < 113) return (uint16_t)(s | ((m | 0x800000u) >> (126 - e)));
  return (uint16_t)(s | ((e - 112) << 10) | (m >> 13));
}

static void fill_any(void *b, int dt, size_t i, float x) {
  if (dt == FERRY_DT_F32)
    ((float *)b)[i] = x;
  else
    ((uint16_t *)b)[i] = to16(x, dt);
}

/* Buffers for n params of cfg; int8 states start as zero (a zero state),
 * fp32/bf16 ones with small values. */
static int buf_make(bufset *b, size_t n, const ferry_optimizer_config *cfg, int gdt, int cdt,
                    unsigned seed) {
  int sdt = cfg->state_dtype;
  memset(b, 0, sizeof *b);
  b->n = n;
  b->mdt = cfg->master_dtype ? cfg->master_dtype : FERRY_DT_F32;
  b->sdt = sdt;
  b->gdt = gdt;
  b->cdt = cdt;
  b->sbytes = ferry_optimizer_state_bytes(cfg, n) + 64; /* slack: validation offsets */
  b->p = big_alloc(n * dt_size(b->mdt));
  b->g = big_alloc(n * dt_size(gdt));
  b->m = big_alloc(b->sbytes);
  b->v = big_alloc(b->sbytes);
  b->pc = cdt ? big_alloc(n * dt_size(cdt)) : NULL;
  if (!b->p || !b->g || !b->m || !b->v || (cdt && !b->pc)) {
    buf_free(b);
    return -1;
  }
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    float r = (float)(x >> 8) * (1.0f / 16777216.0f) - 0.5f;
    fill_any(b->p, b->mdt, i, r);
    fill_any(b->g, gdt, i, r * 0.25f);
    if (sdt != FERRY_DT_I8) {
      fill_any(b->m, sdt, i, r * 0.01f);
      fill_any(b->v, sdt, i, r * r * 1e-4f);
    }
    if (cdt) fill_any(b->pc, cdt, i, 0.0f);
  }
  if (sdt == FERRY_DT_I8) {
    memset(b->m, 0, b->sbytes);
    memset(b->v, 0, b->sbytes);
  }
  return 0;
}

static ferry_optim_span span_of(bufset *b, int gdt, int cdt) {
  ferry_optim_span s = {b->p, b->g, b->m, b->v, b->pc, b->n, gdt, cdt, 0};
  return s;
}

/* ---- the comparison kernels (threads over contiguous shares) -------------- */

typedef struct {
  bufset *b;
  int kind; /* 0 roofline, 1 downcast */
  int nst;  /* roofline: state buffers */
  size_t block;
  size_t lo, hi;
} share;

/* A zero the compiler cannot see through: the no-arithmetic kernels write
 * every value back unchanged, yet must load g and store p, m, v. */
static volatile uint32_t g_zero = 0;

/* Read-modify-write of bytes [lo, hi) of a stream: every 32 bytes loaded and
 * stored back unchanged (xor with a zero the compiler cannot see). */
__attribute__((target("avx2"))) static void rmw_bytes(void *buf, size_t lo, size_t hi) {
  uint8_t *b = buf;
  const __m256i z = _mm256_set1_epi32((int)g_zero);
  size_t i = lo;
  for (; i + 32 <= hi; i += 32)
    _mm256_storeu_si256((__m256i *)(b + i),
                        _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b + i)), z));
  for (; i < hi; i++)
    b[i] ^= (uint8_t)g_zero;
}

/* Reads bytes [lo, hi); folds them into a sink the compiler must keep. */
static _Atomic uint32_t g_sink; /* written by every roofline thread */
__attribute__((target("avx2"))) static void read_bytes(const void *buf, size_t lo, size_t hi) {
  const uint8_t *b = buf;
  __m256i acc = _mm256_setzero_si256();
  size_t i = lo;
  for (; i + 32 <= hi; i += 32)
    acc = _mm256_xor_si256(acc, _mm256_loadu_si256((const __m256i *)(b + i)));
  uint32_t x = (uint32_t)_mm256_extract_epi32(acc, 0);
  for (; i < hi; i++)
    x ^= b[i];
  atomic_store_explicit(&g_sink, x, memory_order_relaxed);
}

/* Writes bytes [lo, hi). */
__attribute__((target("avx2"))) static void write_bytes(void *buf, size_t lo, size_t hi) {
  uint8_t *b = buf;
  const __m256i z = _mm256_set1_epi32((int)g_zero);
  size_t i = lo;
  for (; i + 32 <= hi; i += 32)
    _mm256_storeu_si256((__m256i *)(b + i), z);
  for (; i < hi; i++)
    b[i] = (uint8_t)g_zero;
}

/* The read-modify-write roofline over elements [lo, hi), in chunks of 2048
 * elements so every stream is in flight at once as in the fused step: p and
 * the states read and written, g read, the copy written; int8 states also
 * read and write their absmax (4 bytes per block). */
static void roof_rmw(bufset *b, int nst, size_t block, size_t lo, size_t hi) {
  size_t ms = dt_size(b->mdt), gs = dt_size(b->gdt), ss = dt_size(b->sdt), cs = dt_size(b->cdt);
  size_t codes = (b->n + 63) / 64 * 64;
  void *st[2] = {b->m, b->v};
  for (size_t c = lo; c < hi; c += 2048) {
    size_t e = c + 2048 < hi ? c + 2048 : hi;
    rmw_bytes(b->p, c * ms, e * ms);
    read_bytes(b->g, c * gs, e * gs);
    for (int k = 0; k < nst; k++) {
      rmw_bytes(st[k], c * ss, e * ss);
      if (b->sdt == FERRY_DT_I8)
        rmw_bytes((char *)st[k] + codes, c / block * 4, (e + block - 1) / block * 4);
    }
    if (cs) write_bytes(b->pc, c * cs, e * cs);
  }
}

__attribute__((target("avx2,f16c"))) static void downcast(const float *p, void *out, int cdt,
                                                          size_t lo, size_t hi) {
  uint16_t *o = out;
  size_t i = lo;
  if (cdt == FERRY_DT_F16) {
    for (; i + 8 <= hi; i += 8)
      _mm_storeu_si128((__m128i *)(o + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(p + i), _MM_FROUND_TO_NEAREST_INT));
  } else {
    const __m256i r = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    for (; i + 8 <= hi; i += 8) {
      __m256i u = _mm256_castps_si256(_mm256_loadu_ps(p + i));
      __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
      __m256i q = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, r), lsb), 16);
      _mm_storeu_si128((__m128i *)(o + i),
                       _mm_packus_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)));
    }
  }
  for (; i < hi; i++)
    o[i] = to16(p[i], cdt);
}

static void *share_main(void *arg) {
  share *s = arg;
  bufset *b = s->b;
  if (s->kind == 1)
    downcast(b->p, b->pc, b->cdt, s->lo, s->hi);
  else
    roof_rmw(b, s->nst, s->block, s->lo, s->hi);
  return NULL;
}

static double run_shares(bufset *b, int kind, int threads, int nst, size_t block) {
  if (threads < 1) threads = 1;
  if (threads > 64) threads = 64;
  share sh[64];
  pthread_t th[64];
  double t0 = ferry_now();
  for (int i = 0; i < threads; i++) {
    /* shares start at block boundaries (int8 absmax) */
    size_t lo = b->n * i / threads / block * block, hi = b->n * (i + 1) / threads / block * block;
    if (i == threads - 1) hi = b->n;
    sh[i] = (share){b, kind, nst, block, lo, hi};
    if (i) pthread_create(&th[i], NULL, share_main, &sh[i]);
  }
  share_main(&sh[0]);
  for (int i = 1; i < threads; i++)
    pthread_join(th[i], NULL);
  return ferry_now() - t0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *x, int n) {
  qsort(x, (size_t)n, sizeof *x, cmp_double);
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* ---- validation -------------------------------------------------------------- */

static int validate(const ferry_optimizer_config *cfg, int gdt, int cdt, char *why, size_t len) {
  size_t n = (1u << 20) + 13;
  bufset a, b;
  if (buf_make(&a, n, cfg, gdt, cdt, 7) || buf_make(&b, n, cfg, gdt, cdt, 7)) {
    snprintf(why, len, "out of memory");
    buf_free(&a);
    return -1;
  }
  ferry_optimizer_config rc = *cfg;
  rc.simd = "scalar";
  rc.threads = 1;
  ferry_optimizer *ro = NULL, *fo = NULL;
  int rv = -1;
  if (ferry_optimizer_create(&rc, &ro) || ferry_optimizer_create(cfg, &fo)) {
    snprintf(why, len, "create: %s", ferry_last_error());
    goto out;
  }
  ferry_optim_span sa = span_of(&a, gdt, cdt), sb = span_of(&b, gdt, cdt);
  /* offset by one element: misaligned pointers, as real tensors may be */
  /* (int8 states stay aligned: their absmax are floats after the codes) */
  size_t ms = dt_size(a.mdt), so = cfg->state_dtype == FERRY_DT_I8 ? 0 : dt_size(a.sdt);
  sa.param = (char *)sa.param + ms, sb.param = (char *)sb.param + ms;
  sa.grad = (const char *)sa.grad + dt_size(gdt), sb.grad = (const char *)sb.grad + dt_size(gdt);
  sa.state1 = (char *)sa.state1 + so;
  sb.state1 = (char *)sb.state1 + so;
  sa.state2 = (char *)sa.state2 + so;
  sb.state2 = (char *)sb.state2 + so;
  if (cdt) sa.param_copy = (char *)sa.param_copy + 2, sb.param_copy = (char *)sb.param_copy + 2;
  sa.n = sb.n = n - 1;
  for (int step = 0; step < 2; step++)
    if (ferry_optimizer_step(ro, &sa, 1, 0.5f) || ferry_optimizer_step(fo, &sb, 1, 0.5f)) {
      snprintf(why, len, "step failed");
      goto out;
    }
  double tol = cfg->type == FERRY_OPTIM_LAMB ? 1e-5 : 0;
  for (size_t i = 0; i < n; i++) {
    float x = ferry_dtype_load(a.p, (ferry_dtype)a.mdt, i),
          y = ferry_dtype_load(b.p, (ferry_dtype)b.mdt, i);
    int ok = tol == 0 ? memcmp(&x, &y, 4) == 0 : fabs(x - y) <= tol * (fabs(x) + 1e-3);
    if (!ok) {
      snprintf(why, len, "param %zu: reference %.9g, kernels %.9g", i, x, y);
      goto out;
    }
  }
  if (tol == 0 && (memcmp(a.m, b.m, a.sbytes) || memcmp(a.v, b.v, a.sbytes))) {
    snprintf(why, len, "the %s states differ from the reference", dt_name(a.sdt));
    goto out;
  }
  if (tol == 0 && cdt && memcmp(a.pc, b.pc, n * 2) != 0) {
    /* AVX512-BF16 flushes subnormals: only those may differ */
    const uint16_t *x = a.pc, *y = b.pc;
    for (size_t i = 0; i < n; i++)
      if (x[i] != y[i] &&
          !((x[i] & 0x7f80) == 0 && (y[i] & 0x7fff) == 0 && cdt == FERRY_DT_BF16)) {
        snprintf(why, len, "param copy %zu: reference 0x%04x, kernels 0x%04x", i, x[i], y[i]);
        goto out;
      }
  }
  rv = 0;
out:
  ferry_optimizer_destroy(ro);
  ferry_optimizer_destroy(fo);
  buf_free(&a);
  buf_free(&b);
  return rv;
}

/* ---- the command -------------------------------------------------------------- */

typedef struct {
  uint64_t params;
  int type, gdt, cdt, sdt, threads, steps, json, roof, two;
  const char *simd;
  int mdt;            /* --master */
  uint64_t block;     /* --state-block */
} adam_opts;

/* Takes option a's value v: 0 taken, 1 a bad value (the caller says so),
 * 2 a usage error already said on stderr (an unknown option, or a value
 * out of its range, naming it). */
static int parse_value(adam_opts *o, const char *a, const char *v) {
  static const char *const prog = "ferry bench adam";
  long long x;
  if (!strcmp(a, "--params"))
    return bench_arg_count(prog, a, v, 1, 1ull << 40, &o->params) ? 2 : 0;
  if (!strcmp(a, "--optimizer")) {
    o->type = -1;
    for (int k = 0; k < 6; k++)
      if (!strcmp(v, opt_names[k])) o->type = k;
    return o->type < 0;
  }
  if (!strcmp(a, "--grad")) return (o->gdt = parse_dt(v, 0)) < 0;
  if (!strcmp(a, "--param-copy")) return (o->cdt = parse_dt(v, 1)) < 0 || o->cdt == FERRY_DT_F32;
  if (!strcmp(a, "--state") || !strcmp(a, "--state-dtype")) {
    o->sdt = !strcmp(v, "int8") ? FERRY_DT_I8 : parse_dt(v, 0);
    return o->sdt != FERRY_DT_F32 && o->sdt != FERRY_DT_BF16 && o->sdt != FERRY_DT_I8;
  }
  if (!strcmp(a, "--master")) {
    o->mdt = parse_dt(v, 0);
    return o->mdt != FERRY_DT_F32 && o->mdt != FERRY_DT_BF16;
  }
  if (!strcmp(a, "--state-block")) {
    if (bench_arg_int(prog, a, v, 32, 4096, "a power of two", &x)) return 2;
    if (x & (x - 1)) {
      fprintf(stderr, "%s: %s '%s': expected a power of two from 32 to 4096\n", prog, a, v);
      return 2;
    }
    o->block = (uint64_t)x;
    return 0;
  }
  if (!strcmp(a, "--threads")) {
    if (bench_arg_int(prog, a, v, 0, bench_max_threads(), "0 = one per core; " BENCH_THREADS_WHY,
                      &x))
      return 2;
    o->threads = (int)x;
    return 0;
  }
  if (!strcmp(a, "--steps")) {
    if (bench_arg_int(prog, a, v, 1, 1000, NULL, &x)) return 2;
    o->steps = (int)x;
    return 0;
  }
  if (!strcmp(a, "--simd")) {
    if (optim_simd_parse(v) < 0) {
      fprintf(stderr, "%s: unknown --simd '%s' (expected: scalar, avx2, avx512)\n", prog, v);
      return 2;
    }
    o->simd = v;
    return 0;
  }
  fprintf(stderr, "%s: unknown option '%s'\n", prog, a);
  usage(stderr);
  return 2;
}

/* Returns -1 to go on, or the exit code (0 after --help, 2 bad usage). */
static int parse_args(adam_opts *o, int argc, char **argv) {
  *o = (adam_opts){
      256ull << 20, FERRY_OPTIM_ADAMW, FERRY_DT_F32, FERRY_DT_NONE, FERRY_DT_F32, 1, 5, 0, 0, 0,
      NULL, FERRY_DT_F32, 256};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--json")) {
      o->json = 1;
    } else if (!strcmp(a, "--roofline")) {
      o->roof = 1;
    } else if (!strcmp(a, "--two-pass")) {
      o->two = 1;
    } else if (strncmp(a, "--", 2) || !v) {
      fprintf(stderr, "ferry bench adam: %s: %s (see --help)\n", a,
              strncmp(a, "--", 2) ? "not an option" : "needs a value");
      return 2;
    } else {
      i++;
      int bad = parse_value(o, a, v);
      if (bad == 2) return 2;
      if (bad) {
        fprintf(stderr, "ferry bench adam: bad value '%s' for %s (see --help)\n", v, a);
        return 2;
      }
    }
  }
  if (o->mdt == FERRY_DT_BF16) o->cdt = FERRY_DT_NONE; /* the params are the master */
  return -1;
}

/* The combinations --two-pass and --roofline model: -1 to go on, or 2
 * (said on stderr). */
static int check_args(const adam_opts *o) {
  /* the buffers live in RAM (at most 20 bytes a param: fp32 master and
   * grads, two fp32 states, a 16-bit copy): refuse up front what cannot fit */
  uint64_t avail = bench_mem_available();
  if (avail && (double)o->params * 20 > 0.9 * (double)avail) {
    char need[32], have[32];
    fprintf(stderr, "ferry bench adam: --params %llu needs up to %s of RAM (20 bytes a param); "
                    "%s is available: lower --params\n", (unsigned long long)o->params,
            ferry_format_size(o->params * 20, need, sizeof need),
            ferry_format_size(avail, have, sizeof have));
    return 2;
  }
  if (o->two && !o->cdt) {
    fprintf(stderr, "ferry bench adam: --two-pass needs --param-copy fp16 or bf16\n");
    return 2;
  }
  if (o->roof && o->type == FERRY_OPTIM_LAMB) {
    fprintf(stderr, "ferry bench adam: --roofline models one pass: not for lamb\n");
    return 2;
  }
  if (o->two && o->mdt == FERRY_DT_BF16) {
    fprintf(stderr, "ferry bench adam: --two-pass needs an fp32 master (--master fp32)\n");
    return 2;
  }
  return -1;
}

/* Medians over the timed steps (0 for a comparison not asked for). */
typedef struct {
  double sec, rsec, tsec, frac;
} adam_times;

/* One untimed round, then o->steps timed steps of ours, each paired with
 * the roofline kernel and the two-pass step when asked for. Returns the
 * first failed step's status, or 0. */
static int time_steps(ferry_optimizer *opt, bufset *b, const adam_opts *o, int threads, int nst,
                      adam_times *t) {
  int gdt = o->gdt, cdt = o->cdt, steps = o->steps, roof = o->roof, two = o->two;
  size_t blk = o->sdt == FERRY_DT_I8 ? (size_t)o->block : 256;
  ferry_optim_span sp = span_of(b, gdt, cdt);
  ferry_optim_span sp_nocopy = sp;
  sp_nocopy.copy_dtype = FERRY_DT_NONE;
  /* one untimed round: page faults, caches, thread start */
  ferry_optimizer_step(opt, &sp, 1, 1.0f);
  if (roof) run_shares(b, 0, threads, nst, blk);
  double *t_ours = calloc((size_t)steps, sizeof(double));
  double *t_roof = calloc((size_t)steps, sizeof(double));
  double *t_two = calloc((size_t)steps, sizeof(double));
  double *t_ratio = calloc((size_t)steps, sizeof(double));
  int rc = 0;
  for (int s = 0; s < steps && !rc; s++) {
    /* alternate which runs first, so drifting load hits both alike */
    if (roof && (s & 1)) t_roof[s] = run_shares(b, 0, threads, nst, blk);
    double t0 = ferry_now();
    rc = ferry_optimizer_step(opt, &sp, 1, 1.0f);
    t_ours[s] = ferry_now() - t0;
    if (roof && !(s & 1)) t_roof[s] = run_shares(b, 0, threads, nst, blk);
    if (roof) t_ratio[s] = t_roof[s] / t_ours[s];
    if (two) {
      t0 = ferry_now();
      rc |= ferry_optimizer_step(opt, &sp_nocopy, 1, 1.0f);
      t_two[s] = ferry_now() - t0 + run_shares(b, 1, threads, nst, blk);
    }
  }
  if (!rc) {
    t->sec = median(t_ours, steps);
    t->rsec = roof ? median(t_roof, steps) : 0;
    t->tsec = two ? median(t_two, steps) : 0;
    /* the median of per-pair ratios: robust to load that changes between pairs */
    t->frac = roof ? median(t_ratio, steps) : 0;
  }
  free(t_ours);
  free(t_roof);
  free(t_two);
  free(t_ratio);
  return rc;
}

/* Bytes per parameter a step moves: the library's traffic formula
 * (ferry_optimizer_bytes_per_param), plus LAMB's second pass. */
static double bytes_per_param(const adam_opts *o, const ferry_optimizer_config *cfg) {
  double bpp = ferry_optimizer_bytes_per_param(cfg, o->gdt, o->cdt);
  if (o->type == FERRY_OPTIM_LAMB) /* phase 2 reads p, m, v again and writes p */
    bpp += 2.0 * (double)dt_size(o->mdt) + 2.0 * (double)dt_size(o->sdt);
  return bpp;
}

static void report(const adam_opts *o, const ferry_optimizer_info *info, const adam_times *t,
                   double bpp) {
  double sec = t->sec, rsec = t->rsec, tsec = t->tsec, frac = t->frac;
  double rbpp = bpp; /* the roofline moves the same bytes (not modelled for LAMB) */
  double two_bpp = bpp + 4.0; /* the downcast pass reads p again */
  double n = (double)o->params;
  if (o->json) {
    json_out j;
    json_begin(&j, stdout);
    json_str(&j, "bench", "adam");
    json_str(&j, "optimizer", opt_names[o->type]);
    json_str(&j, "simd", info->simd);
    json_uint(&j, "params", (unsigned long long)o->params);
    json_int(&j, "threads", info->threads);
    json_str(&j, "grad_dtype", dt_name(o->gdt));
    json_str(&j, "param_copy", dt_name(o->cdt));
    json_str(&j, "state_dtype", dt_name(o->sdt));
    json_str(&j, "master_dtype", dt_name(o->mdt));
    json_uint(&j, "state_block", (unsigned long long)o->block);
    json_int(&j, "steps", o->steps);
    json_num(&j, "seconds_per_step", sec);
    json_num(&j, "params_per_s", n / sec);
    json_num(&j, "bytes_per_param", bpp);
    json_num(&j, "gb_per_s", n * bpp / sec / 1e9);
    if (o->roof) {
      json_num(&j, "roofline_seconds_per_step", rsec);
      json_num(&j, "roofline_gb_per_s", n * rbpp / rsec / 1e9);
      json_num(&j, "roofline_bytes_per_param", rbpp);
      json_num(&j, "fraction_of_roofline", frac);
    }
    if (o->two) {
      json_num(&j, "two_pass_seconds_per_step", tsec);
      json_num(&j, "two_pass_bytes_per_param", two_bpp);
      json_num(&j, "fused_speedup", tsec / sec);
    }
    json_end(&j);
    return;
  }
  printf("adam bench: %s (%s kernels), %llu params, %d threads, grad %s, copy %s, states %s, "
         "master %s\n",
         opt_names[o->type], info->simd, (unsigned long long)o->params, info->threads,
         dt_name(o->gdt), dt_name(o->cdt), dt_name(o->sdt), dt_name(o->mdt));
  printf("  ours:     %.4f s/step  %.3f Gparam/s  %.4g B/param  %.2f GB/s (median of %d)\n", sec,
         n / sec / 1e9, bpp, n * bpp / sec / 1e9, o->steps);
  if (o->roof)
    printf("  roofline: %.4f s/step  %.2f GB/s  -> ours at %.2f of the roofline\n", rsec,
           n * rbpp / rsec / 1e9, frac);
  if (o->two)
    printf("  two-pass: %.4f s/step  %.0f B/param  -> fused is %.2fx faster\n", tsec, two_bpp,
           tsec / sec);
}

/* Validates, then times and reports: 0, or 1 (said on stderr). */
static int run(const adam_opts *o) {
  ferry_optimizer_config cfg = ferry_optimizer_config_default((ferry_optim_type)o->type);
  cfg.threads = o->threads;
  cfg.state_dtype = o->sdt;
  cfg.state_block = (size_t)o->block;
  cfg.master_dtype = o->mdt;
  cfg.simd = o->simd;
  if (o->type == FERRY_OPTIM_SGD) cfg.momentum = 0.9f;
  if (o->simd && !optim_kernels_get(optim_simd_parse(o->simd))) {
    fprintf(stderr, "ferry bench adam: --simd %s: this CPU (or this build) lacks those kernels "
                    "(`ferry info` lists its SIMD)\n", o->simd);
    return 1;
  }
  char why[256];
  if (validate(&cfg, o->gdt, o->cdt, why, sizeof why)) {
    fprintf(stderr, "ferry bench adam: validation against the scalar reference failed: %s\n", why);
    return 1;
  }
  ferry_optimizer *opt = NULL;
  if (ferry_optimizer_create(&cfg, &opt)) {
    fprintf(stderr, "ferry bench adam: %s\n", ferry_last_error());
    return 1;
  }
  ferry_optimizer_info info;
  ferry_optimizer_get_info(opt, &info);
  bufset b;
  if (buf_make(&b, (size_t)o->params, &cfg, o->gdt, o->cdt, 1)) {
    fprintf(stderr, "ferry bench adam: cannot allocate buffers for %llu params\n",
            (unsigned long long)o->params);
    ferry_optimizer_destroy(opt);
    return 1;
  }
  adam_times t;
  int ret = 0;
  if (time_steps(opt, &b, o, info.threads, ferry_optimizer_state_count(&cfg), &t)) {
    fprintf(stderr, "ferry bench adam: step failed: %s\n", ferry_optimizer_last_error(opt));
    ret = 1;
  } else {
    report(o, &info, &t, bytes_per_param(o, &cfg));
  }
  buf_free(&b);
  ferry_optimizer_destroy(opt);
  return ret;
}

int ferry_bench_adam_main(int argc, char **argv) {
  adam_opts o;
  int ex = parse_args(&o, argc, argv);
  if (ex < 0) ex = check_args(&o);
  if (ex >= 0) return ex;
  return run(&o);
}
