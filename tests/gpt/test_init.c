/* tests/gpt/test_init.c — the seeded init on the CPU (init.c): value k of
 * tensor i depends on (seed, i, k) only, so a tensor's values are the same
 * whatever the number of threads, however it is cut into pieces, and
 * whatever order the tensors are made in; the rules (norms 1, biases 0,
 * normals of std 0.02 and 0.02 / sqrt(2 L) for residual projections); and
 * a few values pinned bit for bit, which the GPU's init (gpt.cuda.init)
 * must give too; the lanes of gpt_rng_lanes.h (what init.c runs, built per
 * vector width) against gpt_rng.h's one counter at a time, edge words too.
 * `test_gpt_init --rate PRESET [THREADS]` instead times the init of every
 * tensor of a preset through the weights source (what the engine's init
 * callback calls) and prints the rate.
 */
#include "gpt.h"
#include "gpt_init.h"
#include "gpt_rng_lanes.h"

#include "ferry.h"
#include "tests/test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int index_of(const gpt_schema *s, const char *name) {
  const gpt_param *q = gpt_schema_find(s, name);
  REQUIRE(q != NULL);
  return (int)(q - s->params);
}

static float *tensor(const gpt_schema *s, int i, uint64_t seed, int threads) {
  float *w = malloc(s->params[i].numel * sizeof *w);
  REQUIRE(w != NULL);
  gpt_init_tensor(s, i, seed, w, threads);
  return w;
}

/* one tensor: 1, 3, 7 and one thread per CPU; pieces of odd lengths made
 * back to front */
static void same_any_split(const gpt_schema *s, int i) {
  size_t n = s->params[i].numel;
  float *one = tensor(s, i, 7, 1), *w = malloc(n * sizeof *w);
  REQUIRE(w != NULL);
  static const int threads[] = {3, 7, 0};
  for (int t = 0; t < 3; t++) {
    memset(w, 0xff, n * sizeof *w);
    gpt_init_tensor(s, i, 7, w, threads[t]);
    if (memcmp(one, w, n * sizeof *w)) {
      fprintf(stderr, "%s: %d threads differ from one\n", s->params[i].name, threads[t]);
      test_failures++;
    }
  }
  memset(w, 0xff, n * sizeof *w);
  size_t piece = 4099, at = n;
  while (at > 0) {
    size_t len = at < piece ? at : piece;
    gpt_init_values(s, i, 7, at - len, len, w + at - len);
    at -= len;
    piece = piece * 3 % 10007 + 1;
  }
  EXPECT(memcmp(one, w, n * sizeof *w) == 0);
  free(one);
  free(w);
}

/* gpt_weights_init (first to last) = the weights source in reverse order */
static void same_any_order(const char *preset) {
  gpt_config c;
  gpt_schema s;
  gpt_resident r;
  char err[256];
  REQUIRE(gpt_config_preset(preset, &c) == 0);
  REQUIRE(gpt_schema_build(&c, &s) == 0);
  REQUIRE(gpt_resident_init(&r, &s) == 0);
  gpt_provider p = gpt_resident_provider(&r);
  REQUIRE(gpt_weights_init(&s, &p, 5) == 0);
  gpt_weights_src *src;
  REQUIRE(gpt_weights_src_open(&s, NULL, 5, &src, err, sizeof err) == 0);
  for (int i = s.n_params - 1; i >= 0; i--) {
    size_t n = s.params[i].numel;
    float *w = malloc(n * sizeof *w);
    REQUIRE(w && gpt_weights_src_fill(src, i, w, err, sizeof err) == 0);
    if (memcmp(w, gpt_resident_w(&r, i), n * sizeof *w)) {
      fprintf(stderr, "%s %s: made last-to-first differs\n", preset, s.params[i].name);
      test_failures++;
    }
    free(w);
  }
  gpt_weights_src_close(src);
  gpt_resident_free(&r);
  gpt_schema_free(&s);
}

/* mean and std of a normal tensor within what its size allows */
static void normal_stats(const gpt_schema *s, int i, double want_std) {
  size_t n = s->params[i].numel;
  float *w = tensor(s, i, 1, 0);
  double sum = 0, sq = 0, big = 0;
  for (size_t k = 0; k < n; k++) {
    sum += w[k], sq += (double)w[k] * w[k];
    if (fabs(w[k]) > big) big = fabs(w[k]);
  }
  double mean = sum / (double)n, sd = sqrt(sq / (double)n - mean * mean);
  double se = want_std / sqrt((double)n); /* the mean's standard error */
  if (fabs(mean) > 5 * se || fabs(sd / want_std - 1) > 5 * sqrt(0.5 / (double)n) + 1e-3 ||
      big > 6.7 * want_std || big < 3 * want_std) {
    fprintf(stderr, "%s: mean %g std %g (want %g) max |w| %g\n", s->params[i].name, mean, sd,
            want_std, big);
    test_failures++;
  }
  free(w);
}

static void rules(void) {
  gpt_config c;
  gpt_schema s;
  REQUIRE(gpt_config_preset("small", &c) == 0);
  REQUIRE(gpt_schema_build(&c, &s) == 0);
  float resid = 0.02f / sqrtf(12.0f); /* 6 layers */
  for (int i = 0; i < s.n_params; i++) {
    const gpt_param *q = &s.params[i];
    float scale;
    gpt_init_kind k = gpt_init_rule(&s, i, &scale);
    int ln = strstr(q->name, "ln_") != NULL, bias = strstr(q->name, ".bias") != NULL;
    int proj = strstr(q->name, "c_proj.weight") != NULL;
    EXPECT(k == (ln && !bias ? GPT_INIT_ONE : bias ? GPT_INIT_ZERO : GPT_INIT_NORMAL));
    if (k == GPT_INIT_NORMAL) EXPECT(scale == (proj ? resid : 0.02f));
    if (k == GPT_INIT_NORMAL) continue;
    float *w = tensor(&s, i, 1, 0);
    for (size_t j = 0; j < q->numel; j++) EXPECT(w[j] == (k == GPT_INIT_ONE ? 1.0f : 0.0f));
    free(w);
  }
  normal_stats(&s, index_of(&s, "wte.weight"), 0.02);
  normal_stats(&s, index_of(&s, "h.3.mlp.c_fc.weight"), 0.02);
  normal_stats(&s, index_of(&s, "h.0.mlp.c_proj.weight"), resid);
  /* another seed, another tensor of the same shape: other values */
  int a = index_of(&s, "h.0.mlp.c_fc.weight"), b = index_of(&s, "h.1.mlp.c_fc.weight");
  float *x = tensor(&s, a, 1, 0), *y = tensor(&s, a, 2, 0), *z = tensor(&s, b, 1, 0);
  size_t same_seed = 0, same_tensor = 0;
  for (size_t k = 0; k < s.params[a].numel; k++) same_seed += x[k] == y[k], same_tensor += x[k] == z[k];
  EXPECT(same_seed < 100 && same_tensor < 100);
  free(x), free(y), free(z);
  gpt_schema_free(&s);
}

/* Values the init gives on every machine (and on the GPU), bit for bit. */
static void pinned(void) {
  gpt_config c;
  gpt_schema s;
  REQUIRE(gpt_config_preset("llama-tiny", &c) == 0);
  REQUIRE(gpt_schema_build(&c, &s) == 0);
  static const struct {
    const char *name;
    size_t k;
    float v;
  } pin[] = {
      {"model.embed_tokens.weight", 0, 0x1.f2994ep-8f},
      {"model.embed_tokens.weight", 1, -0x1.84565cp-8f},
      {"model.embed_tokens.weight", 2, -0x1.46acdcp-8f},
      {"model.embed_tokens.weight", 3, -0x1.48eff8p-6f},
      {"model.embed_tokens.weight", 12345, -0x1.ab966ap-6f},
      {"model.layers.2.self_attn.o_proj.weight", 0, -0x1.b2e17ap-7f},
      {"model.layers.2.self_attn.o_proj.weight", 1001, -0x1.99aa36p-8f},
      {"model.layers.4.mlp.down_proj.weight", 44031, 0x1.ef6bdp-8f},
      {"lm_head.weight", 7, 0x1.9fc2cep-7f},
  };
  for (size_t p = 0; p < sizeof pin / sizeof pin[0]; p++) {
    int i = index_of(&s, pin[p].name);
    float v;
    gpt_init_values(&s, i, 1, pin[p].k, 1, &v);
    if (memcmp(&v, &pin[p].v, 4)) {
      fprintf(stderr, "%s[%zu]: %a, pinned %a\n", pin[p].name, pin[p].k, v, pin[p].v);
      test_failures++;
    }
  }
  gpt_schema_free(&s);
}

/* The lanes' radius and angle against gpt_rng.h's for chosen words: 0, 1,
 * the largest, both sides of each u1 mantissa's sqrt(2) cut and of each
 * octant, then pseudo-random ones. */
static void lanes_edges(void) {
  enum { N = 4096 };
  static uint32_t w[N];
  size_t n = 0;
  w[n++] = 0, w[n++] = 1, w[n++] = 0xFFFFFFFFu, w[n++] = 0xFFFFFFFEu, w[n++] = 0x7FFFFFFFu;
  for (int k = 1; k <= 32; k++) { /* a + 1 near 2^k sqrt(2) */
    double cut = ldexp(1.4142135623730951, k - 1);
    for (int d = -2; d <= 2; d++) {
      double v = floor(cut) + d - 1;
      if (v >= 0 && v <= 4294967295.0) w[n++] = (uint32_t)v;
    }
  }
  for (uint32_t o = 0; o < 8; o++) /* octant edges */
    for (int d = -2; d <= 2; d++) w[n++] = (o << 29) + (uint32_t)d;
  uint32_t x = 2463534242u;
  while (n % GPT_RNG_LANES || n < N - 2 * GPT_RNG_LANES) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    w[n++] = x;
  }
  size_t bad = 0;
  for (size_t at = 0; at < n; at += GPT_RNG_LANES) {
    double r[GPT_RNG_LANES], c[GPT_RNG_LANES], s[GPT_RNG_LANES];
    gpt_rng_lanes_radius(w + at, r);
    gpt_rng_lanes_cos_sin(w + at, c, s);
    for (int l = 0; l < GPT_RNG_LANES; l++) {
      double rr = GPT_RNG_SQRT(GPT_RNG_MUL(-2.0, gpt_rng_log_u1(w[at + l]))), cc, ss;
      gpt_rng_cos_sin(w[at + l], &cc, &ss);
      if (memcmp(&rr, &r[l], 8) || memcmp(&cc, &c[l], 8) || memcmp(&ss, &s[l], 8)) {
        if (bad++ < 5)
          fprintf(stderr, "word %08x: lanes r %a cos %a sin %a, one at a time %a %a %a\n",
                  w[at + l], r[l], c[l], s[l], rr, cc, ss);
      }
    }
  }
  EXPECT(bad == 0);
}

/* gpt_init_values (the lanes, in the build this CPU picks) against
 * gpt_rng_normal4 value by value: seeds, tensors, a start past the
 * counter's low word, a start within a counter, odd lengths. */
static void lanes_whole(void) {
  gpt_config c;
  gpt_schema s;
  REQUIRE(gpt_config_preset("llama-tiny", &c) == 0);
  REQUIRE(gpt_schema_build(&c, &s) == 0);
  static const uint64_t seeds[] = {1, 0xDEADBEEFCAFEF00Dull};
  static const char *names[] = {"model.embed_tokens.weight", "model.layers.2.self_attn.o_proj.weight"};
  static const size_t firsts[] = {0, 3, 1001, ((size_t)1 << 34) - 200};
  enum { LEN = 5 * 4 * GPT_RNG_LANES + 7 };
  size_t bad = 0;
  for (int a = 0; a < 2; a++)
    for (int b = 0; b < 2; b++)
      for (int f = 0; f < 4; f++) {
        int i = index_of(&s, names[b]);
        float scale, got[LEN];
        REQUIRE(gpt_init_rule(&s, i, &scale) == GPT_INIT_NORMAL);
        gpt_init_values(&s, i, seeds[a], firsts[f], LEN, got);
        for (size_t k = 0; k < LEN; k++) {
          size_t at = firsts[f] + k;
          float v[4], want;
          gpt_rng_normal4(seeds[a], (uint32_t)i, at / 4, v);
          want = GPT_RNG_FMUL(v[at % 4], scale);
          if (memcmp(&want, &got[k], 4) && bad++ < 5)
            fprintf(stderr, "%s[%zu] seed %llx: %a, one at a time %a\n", names[b], at,
                    (unsigned long long)seeds[a], got[k], want);
        }
      }
  EXPECT(bad == 0);
  gpt_schema_free(&s);
}

static int rate(const char *preset, int threads) {
  gpt_config c;
  gpt_schema s;
  char err[256];
  REQUIRE(gpt_config_preset(preset, &c) == 0);
  REQUIRE(gpt_schema_build(&c, &s) == 0);
  size_t most = 0;
  for (int i = 0; i < s.n_params; i++)
    if (s.params[i].numel > most) most = s.params[i].numel;
  float *w = malloc(most * sizeof *w);
  REQUIRE(w != NULL);
  memset(w, 0, most * sizeof *w);
  gpt_weights_src *src;
  REQUIRE(gpt_weights_src_open(&s, NULL, 1, &src, err, sizeof err) == 0);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < s.n_params; i++) {
    if (threads) gpt_init_tensor(&s, i, 1, w, threads);
    else REQUIRE(gpt_weights_src_fill(src, i, w, err, sizeof err) == 0);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  printf("%s: %zu values in %.2f s, %.1f M values/s (%s)\n", preset, s.total_numel, sec,
         (double)s.total_numel / sec / 1e6, threads ? "threads given" : "weights source");
  gpt_weights_src_close(src);
  free(w);
  gpt_schema_free(&s);
  return 0;
}

int main(int argc, char **argv) {
  if (argc >= 3 && !strcmp(argv[1], "--rate")) return rate(argv[2], argc > 3 ? atoi(argv[3]) : 0);
  gpt_config c;
  gpt_schema s;
  REQUIRE(gpt_config_preset("gpt2", &c) == 0);
  REQUIRE(gpt_schema_build(&c, &s) == 0);
  same_any_split(&s, index_of(&s, "h.0.mlp.c_fc.weight")); /* 2.4M values */
  same_any_split(&s, index_of(&s, "h.0.attn.c_proj.weight"));
  gpt_schema_free(&s);
  same_any_order("tiny");
  same_any_order("llama-tiny");
  rules();
  pinned();
  lanes_edges();
  lanes_whole();
  return test_finish("gpt.init");
}
