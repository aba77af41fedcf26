/* tests/gpt/test_weights.c — the model's weights on disk: a file loaded and
 * saved again gives the same bytes (and the fixture's own bytes), seeded
 * init is reproducible, sharded folders load, F16/BF16 convert, the
 * "transformer." prefix is accepted, and a missing tensor, a wrong shape
 * or a wrong dtype is refused naming the tensor.
 * argv[1]: tests/fixtures/gpt, argv[2]: scratch directory.
 */
#include "gpt.h"

#include "ferry.h"
#include "tests/test.h"

#include <math.h>
#include <string.h>
#include <sys/stat.h>

static const char *g_tmp;

static char *tmp(const char *name) {
  static char b[4][1024];
  static int k;
  char *p = b[k++ % 4];
  if (snprintf(p, 1024, "%s/%s", g_tmp, name) >= 1024) abort();
  return p;
}

static int same_file(const char *a, const char *b) {
  FILE *x = fopen(a, "rb"), *y = fopen(b, "rb");
  int same = x && y;
  while (same) {
    int c = fgetc(x), d = fgetc(y);
    if (c != d) same = 0;
    if (c == EOF || d == EOF) break;
  }
  if (x) fclose(x);
  if (y) fclose(y);
  if (!same) fprintf(stderr, "files differ: %s %s\n", a, b);
  return same;
}

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static uint16_t to_f16(float f) { /* normal range only, truncating */
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t s = (u >> 16) & 0x8000, e = (u >> 23) & 0xff, m = u & 0x7fffff;
  if (e < 113) return (uint16_t)s; /* flush tiny to zero */
  return (uint16_t)(s | (e - 112) << 10 | m >> 13);
}

enum { V_PLAIN, V_MISSING, V_SHAPE, V_DTYPE, V_BF16, V_F16, V_PREFIX };

/* Writes the resident weights with one change (variant) to `name`. */
static void write_variant(const char *path, const gpt_schema *s, gpt_resident *r, int variant,
                          const char *victim) {
  ferry_safetensors_writer *w;
  REQUIRE(ferry_safetensors_writer_create(path, 0, &w) == 0);
  for (int i = 0; i < s->n_params; i++) {
    const gpt_param *q = &s->params[i];
    char name[160];
    snprintf(name, sizeof name, "%s%s", variant == V_PREFIX ? "transformer." : "", q->name);
    int hit = victim && !strcmp(q->name, victim);
    if (variant == V_MISSING && hit) continue;
    ferry_dtype dt = variant == V_BF16 ? FERRY_DT_BF16 : variant == V_F16 ? FERRY_DT_F16
                        : variant == V_DTYPE && hit ? FERRY_DT_I32 : FERRY_DT_F32;
    int64_t shape[2] = {q->shape[0], q->shape[1]};
    int ndim = q->ndim;
    if (variant == V_SHAPE && hit) shape[0] += 1;
    REQUIRE(ferry_safetensors_writer_add(w, name, dt, ndim, shape) == 0);
  }
  const char *next;
  while ((next = ferry_safetensors_writer_next(w))) {
    const char *base = strncmp(next, "transformer.", 12) ? next : next + 12;
    int i = (int)(gpt_schema_find(s, base) - s->params);
    const gpt_param *q = &s->params[i];
    const float *src = gpt_resident_w(r, i);
    size_t n = q->numel + (variant == V_SHAPE && victim && !strcmp(q->name, victim)
                               ? (q->ndim > 1 ? (size_t)q->shape[1] : 1) : 0);
    if (variant == V_BF16 || variant == V_F16) {
      uint16_t *h = malloc(n * 2);
      for (size_t k = 0; k < n; k++) h[k] = variant == V_BF16 ? to_bf16(src[k]) : to_f16(src[k]);
      REQUIRE(ferry_safetensors_writer_write(w, next, h, n * 2) == 0);
      free(h);
    } else {
      float *f = calloc(n, sizeof *f);
      memcpy(f, src, q->numel * sizeof *f);
      REQUIRE(ferry_safetensors_writer_write(w, next, f, n * 4) == 0);
      free(f);
    }
  }
  REQUIRE(ferry_safetensors_writer_finish(w) == 0);
  ferry_safetensors_writer_destroy(w);
}

static void run(const char *fixdir, const char *family, const char *victim) {
  char path[1024], err[512];
  gpt_config cfg;
  snprintf(path, sizeof path, "%s/%s/config.json", fixdir, family);
  REQUIRE(gpt_config_load_json(path, &cfg, err, sizeof err) == 0);
  gpt_schema s;
  REQUIRE(gpt_schema_build(&cfg, &s) == 0);
  gpt_resident r, r2;
  REQUIRE(gpt_resident_init(&r, &s) == 0);
  REQUIRE(gpt_resident_init(&r2, &s) == 0);
  gpt_provider p = gpt_resident_provider(&r), p2 = gpt_resident_provider(&r2);
  size_t bytes = s.total_numel * sizeof(float);

  /* fixture -> save: the fixture's bytes; -> load -> save: the same again */
  snprintf(path, sizeof path, "%s/%s/model.safetensors", fixdir, family);
  REQUIRE(gpt_weights_load(&s, &p, path, err, sizeof err) == 0);
  char a[1024], b[1024];
  if (snprintf(a, sizeof a, "%s", tmp("a.safetensors")) >= (int)sizeof a) abort();
  if (snprintf(b, sizeof b, "%s", tmp("b.safetensors")) >= (int)sizeof b) abort();
  REQUIRE(gpt_weights_save(&s, &p, a, 0, err, sizeof err) == 0);
  EXPECT(same_file(path, a));
  REQUIRE(gpt_weights_load(&s, &p2, a, err, sizeof err) == 0);
  EXPECT(memcmp(r.weights, r2.weights, bytes) == 0);
  REQUIRE(gpt_weights_save(&s, &p2, b, 0, err, sizeof err) == 0);
  EXPECT(same_file(a, b));

  /* seeded init: same seed, same bytes; another seed differs */
  REQUIRE(gpt_weights_init(&s, &p, 42) == 0);
  REQUIRE(gpt_weights_init(&s, &p2, 42) == 0);
  EXPECT(memcmp(r.weights, r2.weights, bytes) == 0);
  REQUIRE(gpt_weights_init(&s, &p2, 43) == 0);
  EXPECT(memcmp(r.weights, r2.weights, bytes) != 0);
  REQUIRE(gpt_weights_save(&s, &p, a, 0, err, sizeof err) == 0);
  REQUIRE(gpt_weights_load(&s, &p2, a, err, sizeof err) == 0);
  REQUIRE(gpt_weights_save(&s, &p2, b, 0, err, sizeof err) == 0);
  EXPECT(same_file(a, b));

  /* sharded folder */
  char dir[1024];
  if (snprintf(dir, sizeof dir, "%s/%s_sharded", g_tmp, family) >= (int)sizeof dir) abort();
  REQUIRE(gpt_weights_save(&s, &p, dir, 64 << 10, err, sizeof err) == 0);
  if (snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir) >= (int)sizeof path) abort();
  struct stat st;
  EXPECT(stat(path, &st) == 0);
  memset(r2.weights, 0, bytes);
  if (gpt_weights_load(&s, &p2, dir, err, sizeof err)) fprintf(stderr, "%s\n", err);
  EXPECT(memcmp(r.weights, r2.weights, bytes) == 0);

  /* the "transformer." prefix (GPT2LMHeadModel state dicts) */
  if (cfg.family == GPT_GPT2) {
    write_variant(tmp("prefix.safetensors"), &s, &r, V_PREFIX, NULL);
    memset(r2.weights, 0, bytes);
    EXPECT(gpt_weights_load(&s, &p2, tmp("prefix.safetensors"), err, sizeof err) == 0);
    EXPECT(memcmp(r.weights, r2.weights, bytes) == 0);
  }
  /* 16-bit files convert */
  for (int v = V_BF16; v <= V_F16; v++) {
    write_variant(tmp("half.safetensors"), &s, &r, v, NULL);
    if (gpt_weights_load(&s, &p2, tmp("half.safetensors"), err, sizeof err)) {
      fprintf(stderr, "%s\n", err);
      test_failures++;
    }
    /* bf16 keeps 8 bits of mantissa; the test's f16 writer truncates to
     * 11 and flushes values below 2^-14 to zero */
    size_t off = 0;
    for (size_t k = 0; k < s.total_numel; k++) {
      double x = fabs(r.weights[k]), d = fabs(r.weights[k] - r2.weights[k]);
      if (d > (v == V_BF16 ? 8e-3 * x : 2e-3 * x + 7e-5)) off++;
    }
    EXPECT_EQ_INT(off, 0);
  }
  /* refusals name the tensor */
  struct {
    int variant;
    const char *why;
  } bad[] = {{V_MISSING, "is missing"}, {V_SHAPE, "has shape"}, {V_DTYPE, "has dtype I32"}};
  for (int i = 0; i < 3; i++) {
    write_variant(tmp("bad.safetensors"), &s, &r, bad[i].variant, victim);
    err[0] = 0;
    EXPECT(gpt_weights_load(&s, &p2, tmp("bad.safetensors"), err, sizeof err) != 0);
    if (!strstr(err, victim) || !strstr(err, bad[i].why)) {
      fprintf(stderr, "refusal %d: '%s' lacks '%s' / '%s'\n", i, err, victim, bad[i].why);
      test_failures++;
    }
  }
  printf("%s: %zu params, round trips identical\n", family, s.total_numel);
  gpt_resident_free(&r);
  gpt_resident_free(&r2);
  gpt_schema_free(&s);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: test_gpt_weights FIXTURES/gpt SCRATCH\n");
    return 1;
  }
  g_tmp = argv[2];
  mkdir(g_tmp, 0777);
  run(argv[1], "gpt2", "h.1.mlp.c_fc.bias");
  run(argv[1], "llama", "model.layers.0.self_attn.k_proj.weight");
  return test_finish("gpt.weights");
}
