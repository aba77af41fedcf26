/* tests/gpt/test_kvcache.c — the KV-cache forward (gpt_kv) against the full
 * CPU forward, and the sampler. For the tiny GPT-2 and Llama fixtures
 * (learned positions; rotary and grouped-query attention) and two seeded
 * presets longer than one call's rows: the logits of every position, fed
 * one token at a time and in chunks, equal the full forward's within
 *   |kv - full| <= 1e-5 + 1e-5 |full|   (fp32 both, other summation orders).
 * The sampler: greedy is the argmax, a seed repeats its draws, top-k and
 * top-p keep only the ids they must, the kept ids' frequencies follow their
 * renormalised probabilities, bad options are refused.
 * argv[1]: tests/fixtures/gpt.
 */
#include "gpt.h"

#include "tests/test.h"
#include "tests/gpt/fixture_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double g_worst;

/* Full forward of T tokens (batch 1) against the cache fed in `chunks`
 * (sizes summing to T, 0-terminated). */
static void compare(const gpt_schema *s, gpt_provider *p, const int32_t *tok, int T,
                    const int *chunks, const char *what) {
  gpt_run_config rc = {.batch = 1, .seq = T};
  gpt_model *m;
  REQUIRE(gpt_model_create(s, &rc, &m) == 0);
  REQUIRE(gpt_model_forward(m, p, tok, NULL, NULL) == 0);
  const float *full = gpt_model_logits(m);
  int V = s->cfg.vocab;
  gpt_kv *kv;
  REQUIRE(gpt_kv_create(s, T, &kv) == 0);
  double worst = 0;
  int at = 0, bad = 0;
  for (int c = 0; chunks[c]; c++) {
    int n = chunks[c];
    if (gpt_kv_forward(kv, p, tok + at, n)) {
      fprintf(stderr, "%s: %s\n", what, gpt_kv_last_error(kv));
      exit(1);
    }
    EXPECT_EQ_INT(gpt_kv_rows(kv), n);
    const float *lg = gpt_kv_logits(kv);
    for (int i = 0; i < n; i++)
      for (int v = 0; v < V; v++) {
        double t = full[(size_t)(at + i) * V + v], d = fabs(lg[(size_t)i * V + v] - t);
        if (d > worst) worst = d;
        if (d > 1e-5 + 1e-5 * fabs(t) && bad++ < 3)
          fprintf(stderr, "%s: position %d id %d: %g vs %g\n", what, at + i, v,
                  lg[(size_t)i * V + v], t);
      }
    at += n;
  }
  REQUIRE(at == T);
  EXPECT(bad == 0);
  EXPECT_EQ_INT(gpt_kv_pos(kv), T);
  /* the context is full: one more is refused, and nothing moves */
  EXPECT(gpt_kv_forward(kv, p, tok, 1) != 0);
  EXPECT(strstr(gpt_kv_last_error(kv), "context is full") != NULL);
  EXPECT_EQ_INT(gpt_kv_pos(kv), T);
  gpt_kv_reset(kv);
  EXPECT_EQ_INT(gpt_kv_pos(kv), 0);
  int32_t bad_tok = V;
  EXPECT(gpt_kv_forward(kv, p, &bad_tok, 1) != 0);
  printf("%-28s max |kv - full| = %.3g\n", what, worst);
  if (worst > g_worst) g_worst = worst;
  gpt_kv_free(kv);
  gpt_model_free(m);
}

static void tokens(int32_t *tok, int T, int V, unsigned long long seed) {
  for (int i = 0; i < T; i++) tok[i] = (int32_t)(test_rand(&seed) % (unsigned)V);
}

static void fixture(const char *dir, const char *family) {
  fixture_model fm;
  fixture_model_load(&fm, dir, family);
  int T = fm.cfg.max_seq;
  int32_t *tok = malloc((size_t)T * sizeof *tok);
  tokens(tok, T, fm.cfg.vocab, 7);
  int ones[1025] = {0}, mixed[] = {5, 1, 1, T - 7, 0};
  for (int i = 0; i < T; i++) ones[i] = 1;
  char what[128];
  snprintf(what, sizeof what, "%s, one at a time", family);
  compare(&fm.s, &fm.p, tok, T, ones, what);
  snprintf(what, sizeof what, "%s, chunks 5 1 1 %d", family, T - 7);
  compare(&fm.s, &fm.p, tok, T, mixed, what);
  free(tok);
  fixture_model_free(&fm);
}

/* A seeded preset at 150 positions: calls of the most rows and across them. */
static void preset(const char *name) {
  gpt_config cfg;
  REQUIRE(gpt_config_preset(name, &cfg) == 0);
  gpt_schema s;
  REQUIRE(gpt_schema_build(&cfg, &s) == 0);
  gpt_resident r;
  REQUIRE(gpt_resident_init(&r, &s) == 0);
  gpt_provider p = gpt_resident_provider(&r);
  REQUIRE(gpt_weights_init(&s, &p, 11) == 0);
  int T = 150;
  int32_t tok[150];
  tokens(tok, T, cfg.vocab, 3);
  int chunks[] = {GPT_KV_ROWS, 1, 2, GPT_KV_ROWS, T - 3 - 2 * GPT_KV_ROWS, 0};
  char what[128];
  snprintf(what, sizeof what, "%s, chunks of %d", name, GPT_KV_ROWS);
  compare(&s, &p, tok, T, chunks, what);
  gpt_kv *kv;
  EXPECT(gpt_kv_create(&s, cfg.max_seq + 1, &kv) != 0); /* past max_position_embeddings */
  REQUIRE(gpt_kv_create(&s, cfg.max_seq, &kv) == 0);
  EXPECT_EQ_INT(gpt_kv_max_pos(kv), cfg.max_seq);
  EXPECT(gpt_kv_forward(kv, &p, tok, GPT_KV_ROWS + 1) != 0); /* more rows than one call takes */
  gpt_kv_free(kv);
  gpt_resident_free(&r);
  gpt_schema_free(&s);
}

static void sampler(void) {
  enum { V = 6 };
  /* probabilities 0.5, 0.3, 0.15, 0.04, 0.01, 0 (at temperature 1) */
  const double pr[V] = {0.5, 0.3, 0.15, 0.04, 0.01, 1e-30};
  float lg[V];
  for (int v = 0; v < V; v++) lg[(v + 2) % V] = (float)log(pr[v]); /* the argmax is id 2 */
  gpt_sampler *s;
  gpt_sampling o = {.temperature = 0, .top_p = 1};
  REQUIRE(gpt_sampler_create(V, &o, 1, &s) == 0);
  for (int i = 0; i < 10; i++) EXPECT_EQ_INT(gpt_sampler_pick(s, lg), 2);
  gpt_sampler_free(s);
  /* top_k 1 and a tiny top_p are greedy at any temperature */
  gpt_sampling greedy[] = {{2.0f, 1, 1.0f}, {2.0f, 0, 0.01f}};
  for (int g = 0; g < 2; g++) {
    REQUIRE(gpt_sampler_create(V, &greedy[g], 5, &s) == 0);
    for (int i = 0; i < 100; i++) EXPECT_EQ_INT(gpt_sampler_pick(s, lg), 2);
    gpt_sampler_free(s);
  }
  /* kept sets and frequencies: top-k 3; top-p 0.75 keeps {0.5, 0.3}; both; none */
  struct {
    gpt_sampling o;
    int kept;
  } cases[] = {{{1.0f, 3, 1.0f}, 3}, {{1.0f, 0, 0.75f}, 2}, {{1.0f, 4, 0.9f}, 3},
               {{1.0f, 0, 1.0f}, 5}};
  for (int c = 0; c < 4; c++) {
    enum { N = 40000 };
    int count[V] = {0}, again[64];
    REQUIRE(gpt_sampler_create(V, &cases[c].o, 9, &s) == 0);
    for (int i = 0; i < N; i++) {
      int id = gpt_sampler_pick(s, lg);
      REQUIRE(id >= 0 && id < V);
      count[(id - 2 + V) % V]++; /* back to pr's order */
      if (i < 64) again[i] = id;
    }
    gpt_sampler_free(s);
    double kept = 0;
    for (int v = 0; v < cases[c].kept; v++) kept += pr[v];
    for (int v = 0; v < V; v++) {
      double want = v < cases[c].kept ? pr[v] / kept : 0, got = (double)count[v] / N;
      if (v >= cases[c].kept) EXPECT_EQ_INT(count[v], 0);
      else if (fabs(got - want) > 0.015) {
        fprintf(stderr, "case %d id %d: frequency %.4f, want %.4f\n", c, v, got, want);
        EXPECT(0);
      }
    }
    /* the same seed draws the same ids */
    REQUIRE(gpt_sampler_create(V, &cases[c].o, 9, &s) == 0);
    for (int i = 0; i < 64; i++) EXPECT_EQ_INT(gpt_sampler_pick(s, lg), again[i]);
    gpt_sampler_free(s);
  }
  /* temperature sharpens: at 0.25 id 2 (0.5) dominates the 0.3 one 0.5^4 : 0.3^4 */
  gpt_sampling cold = {0.25f, 0, 1.0f};
  REQUIRE(gpt_sampler_create(V, &cold, 3, &s) == 0);
  int top = 0;
  for (int i = 0; i < 10000; i++) top += gpt_sampler_pick(s, lg) == 2;
  gpt_sampler_free(s);
  EXPECT(fabs(top / 10000.0 - 0.0625 / (0.0625 + 0.0081 + 0.0005063 + 2.56e-6)) < 0.02);
  /* refusals */
  gpt_sampling bad[] = {{-1.0f, 0, 1.0f}, {1.0f, -1, 1.0f}, {1.0f, 0, 0.0f}, {1.0f, 0, 1.5f},
                        {1.0f, 0, NAN}};
  for (int b = 0; b < 5; b++) {
    s = (gpt_sampler *)&s;
    EXPECT(gpt_sampler_create(V, &bad[b], 1, &s) != 0);
    EXPECT(s == NULL);
  }
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_gpt_kvcache FIXTURES_DIR\n");
    return 2;
  }
  fixture(argv[1], "gpt2");
  fixture(argv[1], "llama");
  preset("tiny");
  preset("llama-tiny");
  sampler();
  printf("worst |kv - full| over every position: %.3g\n", g_worst);
  return test_finish("gpt.kvcache");
}
