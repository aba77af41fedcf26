/* tests/gpt/test_kv_timing.c — with the KV cache a sampled token costs about
 * the same at any position: `small`'s shape (6 layers, d 384) with 1024
 * positions, seeded, times single-token steps after a 64-token and after a
 * 512-token context. Each round takes the median of STEPS steps per
 * context; the ratio of the median of ROUNDS rounds must stay under 2
 * (attention over 512 cached positions adds about a fifth to the weights'
 * work; the full forward per token would be 8 times or more). Then 200
 * tokens from `small` itself, forward and sampler, in under 5 s. The times
 * are the process's CPU time with one OpenBLAS thread (the work itself:
 * other programs on a busy machine stretch the wall clock, not this);
 * medians, a generous bound, label `timing`, run alone (RUN_SERIAL). The
 * wall times are printed beside them.
 */
#include "gpt.h"

#include "tests/test.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { STEPS = 15, ROUNDS = 5 };

static double clock_s(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static double cpu_s(void) { return clock_s(CLOCK_PROCESS_CPUTIME_ID); }
static double wall_s(void) { return clock_s(CLOCK_MONOTONIC); }

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, by_value);
  return v[n / 2];
}

/* The median CPU seconds of one token after a context of `ctx` tokens. */
static double per_token(gpt_kv *kv, gpt_provider *p, const int32_t *tok, int ctx) {
  gpt_kv_reset(kv);
  for (int at = 0; at < ctx; at += GPT_KV_ROWS)
    REQUIRE(gpt_kv_forward(kv, p, tok + at, ctx - at < GPT_KV_ROWS ? ctx - at : GPT_KV_ROWS) == 0);
  double dt[STEPS];
  for (int i = 0; i < STEPS; i++) {
    double t0 = cpu_s();
    REQUIRE(gpt_kv_forward(kv, p, tok + ctx + i, 1) == 0);
    dt[i] = cpu_s() - t0;
  }
  return median(dt, STEPS);
}

static void setup(gpt_config *cfg, gpt_schema *s, gpt_resident *r, gpt_provider *p) {
  REQUIRE(gpt_schema_build(cfg, s) == 0);
  REQUIRE(gpt_resident_init(r, s) == 0);
  *p = gpt_resident_provider(r);
  REQUIRE(gpt_weights_init(s, p, 5) == 0);
}

int main(void) {
  gpt_config cfg;
  REQUIRE(gpt_config_preset("small", &cfg) == 0);
  cfg.max_seq = 1024;
  gpt_schema s;
  gpt_resident r;
  gpt_provider p;
  setup(&cfg, &s, &r, &p);
  int32_t tok[1024];
  unsigned long long seed = 1;
  for (int i = 0; i < 1024; i++) tok[i] = (int32_t)(test_rand(&seed) % (unsigned)cfg.vocab);
  gpt_kv *kv;
  REQUIRE(gpt_kv_create(&s, cfg.max_seq, &kv) == 0);
  double ratio[ROUNDS], t64 = 0, t512 = 0;
  for (int k = 0; k < ROUNDS; k++) {
    t64 = per_token(kv, &p, tok, 64);
    t512 = per_token(kv, &p, tok, 512);
    ratio[k] = t512 / t64;
    printf("round %d: %.2f ms CPU a token after 64, %.2f ms after 512 (x%.2f)\n", k, 1e3 * t64,
           1e3 * t512, ratio[k]);
  }
  double mr = median(ratio, ROUNDS);
  printf("median ratio 512 / 64: %.2f (bound 2)\n", mr);
  EXPECT(mr <= 2.0);
  gpt_kv_free(kv);
  gpt_resident_free(&r);
  gpt_schema_free(&s);

  /* 200 tokens from `small` (256 positions): a 1-token prompt, then each
   * token sampled (top-k 40, temperature 0.8) and fed back */
  REQUIRE(gpt_config_preset("small", &cfg) == 0);
  setup(&cfg, &s, &r, &p);
  gpt_sampler *sm;
  gpt_sampling so = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f};
  REQUIRE(gpt_kv_create(&s, cfg.max_seq, &kv) == 0);
  REQUIRE(gpt_sampler_create(cfg.vocab, &so, 1, &sm) == 0);
  int32_t next = 10;
  double t0 = cpu_s(), w0 = wall_s();
  for (int i = 0; i < 200; i++) {
    REQUIRE(gpt_kv_forward(kv, &p, &next, 1) == 0);
    next = gpt_sampler_pick(sm, gpt_kv_logits(kv));
  }
  double t200 = cpu_s() - t0;
  printf("200 tokens from small: %.2f s CPU (bound 5), %.2f s wall\n", t200, wall_s() - w0);
  EXPECT(t200 <= 5.0);
  gpt_sampler_free(sm);
  gpt_kv_free(kv);
  gpt_resident_free(&r);
  gpt_schema_free(&s);
  return test_finish("gpt.kv_timing");
}
