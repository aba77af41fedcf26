/* tests/optim/test_optimizer.c — the public optimizer API and its thread
 * pool: multi-span steps on 1-3 threads equal the scalar reference bit for
 * bit (LAMB within a tolerance: its norms are summed per tile), async steps
 * with completion, step count, FERRY_SIMD, bad arguments, gradient helpers,
 * the dynamic loss scaler.
 */
#include "optim/optim.h"
#include "optim/scalar_impl.h"
#include "tests/test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static unsigned long long seed = 12345;
static float srand1(void) {
  return (float)((test_rand(&seed) >> 11) * (2.0 / 9007199254740992.0)) - 1.0f;
}

#define NSPAN 4
static const size_t span_n[NSPAN] = {5000, 1, 0, 12345};

typedef struct {
  float *p[NSPAN], *m[NSPAN], *v[NSPAN];
  uint16_t *g[NSPAN], *pc[NSPAN];
} model;

static void model_init(model *md, unsigned long long sd) {
  unsigned long long save = seed;
  seed = sd;
  for (int s = 0; s < NSPAN; s++) {
    size_t n = span_n[s] + 1;
    md->p[s] = malloc(n * 4);
    md->m[s] = calloc(n, 4);
    md->v[s] = calloc(n, 4);
    md->g[s] = malloc(n * 2);
    md->pc[s] = calloc(n, 2);
    for (size_t i = 0; i < n; i++)
      md->p[s][i] = srand1();
  }
  seed = save;
}

static void model_grads(model *md, unsigned long long sd) {
  unsigned long long save = seed;
  seed = sd;
  for (int s = 0; s < NSPAN; s++)
    for (size_t i = 0; i < span_n[s] + 1; i++)
      md->g[s][i] = ferry_f32_to_f16(srand1() * 64.0f);
  seed = save;
}

static void model_free(model *md) {
  for (int s = 0; s < NSPAN; s++) {
    free(md->p[s]);
    free(md->m[s]);
    free(md->v[s]);
    free(md->g[s]);
    free(md->pc[s]);
  }
}

static void spans_of(model *md, ferry_optim_span *sp) {
  for (int s = 0; s < NSPAN; s++) {
    ferry_optim_span x = {md->p[s],  md->g[s],  md->m[s],           md->v[s],
                          md->pc[s], span_n[s], FERRY_DT_F16, FERRY_DT_BF16, 0};
    sp[s] = x;
  }
}

/* The reference: whole spans through the scalar kernels. */
static void ref_step(model *md, const ferry_optimizer_config *cfg, int64_t t, float gscale) {
  optim_scalars s;
  optim_scalars_make(&s, cfg, cfg->lr, t, gscale);
  for (int k = 0; k < NSPAN; k++) {
    int mom = cfg->type != FERRY_OPTIM_SGD || cfg->momentum != 0;
    int two = cfg->type == FERRY_OPTIM_ADAMW || cfg->type == FERRY_OPTIM_ADAM ||
              cfg->type == FERRY_OPTIM_LAMB;
    optim_tile tl = {md->p[k],      md->g[k],  mom ? md->m[k] : NULL, two ? md->v[k] : NULL,
                     md->pc[k],     span_n[k], FERRY_DT_F16,          FERRY_DT_F32,
                     FERRY_DT_BF16, 1.0f,      FERRY_DT_F32,          0,
                     0,             NULL,      NULL};
    if (cfg->type == FERRY_OPTIM_LAMB) {
      double ps = 0, us = 0;
      optim_kernels_scalar.lamb_phase1(&s, &tl, &ps, &us);
      tl.trust = ps > 0 && us > 0 ? (float)(sqrt(ps) / sqrt(us)) : 1.0f;
    }
    optim_kernels_scalar.step(&s, &tl);
  }
}

static int compare(model *a, model *b, double tol) {
  for (int s = 0; s < NSPAN; s++)
    for (size_t i = 0; i < span_n[s] + 1; i++) {
      float x = a->p[s][i], y = b->p[s][i];
      int ok = tol == 0 ? ferry_f32_bits(x) == ferry_f32_bits(y) : fabs(x - y) <= tol * (fabs(x) + 1e-3);
      if (!ok) {
        fprintf(stderr, "span %d [%zu]: %.9g vs %.9g\n", s, i, x, y);
        return 0;
      }
      if (tol == 0 &&
          (a->m[s][i] != b->m[s][i] || a->v[s][i] != b->v[s][i] || a->pc[s][i] != b->pc[s][i])) {
        fprintf(stderr, "span %d [%zu]: state or copy differs\n", s, i);
        return 0;
      }
    }
  return 1;
}

static void test_threads_equal_reference(void) {
  static const ferry_optim_type types[] = {FERRY_OPTIM_ADAMW, FERRY_OPTIM_ADAM, FERRY_OPTIM_ADAGRAD,
                                           FERRY_OPTIM_LAMB,  FERRY_OPTIM_SGD,  FERRY_OPTIM_LION};
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
    for (int threads = 1; threads <= 3; threads++) {
      ferry_optimizer_config cfg = ferry_optimizer_config_default(types[ti]);
      cfg.threads = threads;
      cfg.tile = 1000 + 24 * threads; /* tiles end off the vector width */
      if (types[ti] == FERRY_OPTIM_SGD) cfg.momentum = 0.9f;
      ferry_optimizer *o = NULL;
      REQUIRE(ferry_optimizer_create(&cfg, &o) == 0);
      model a, b;
      model_init(&a, 7);
      model_init(&b, 7);
      ferry_optim_span sp[NSPAN];
      spans_of(&b, sp);
      for (int step = 1; step <= 3; step++) {
        model_grads(&a, 100 + step);
        model_grads(&b, 100 + step);
        ref_step(&a, &cfg, step, 0.5f);
        EXPECT_EQ_INT(ferry_optimizer_step(o, sp, NSPAN, 0.5f), 0);
      }
      EXPECT_EQ_INT(ferry_optimizer_get_step(o), 3);
      if (!compare(&a, &b, types[ti] == FERRY_OPTIM_LAMB ? 1e-5 : 0)) {
        fprintf(stderr, "type %d threads %d differs from the reference\n", (int)types[ti], threads);
        test_failures++;
      }
      model_free(&a);
      model_free(&b);
      ferry_optimizer_destroy(o);
    }
}

typedef struct {
  pthread_mutex_t mu;
  int calls, status;
} done_rec;

static void on_done(void *user, int status) {
  done_rec *r = user;
  pthread_mutex_lock(&r->mu);
  r->calls++;
  r->status = status;
  pthread_mutex_unlock(&r->mu);
}

static void test_async_and_steps(void) {
  ferry_optimizer_config cfg = ferry_optimizer_config_default(FERRY_OPTIM_ADAMW);
  cfg.threads = 2;
  cfg.tile = 777;
  ferry_optimizer *o = NULL;
  REQUIRE(ferry_optimizer_create(&cfg, &o) == 0);
  ferry_optimizer_info info;
  EXPECT_EQ_INT(ferry_optimizer_get_info(o, &info), 0);
  EXPECT_EQ_INT(info.threads, 2);
  printf("optimizer: %s kernels, %d threads, %d bound\n", info.simd, info.threads, info.bound);
  model a, b;
  model_init(&a, 9);
  model_init(&b, 9);
  model_grads(&a, 1);
  model_grads(&b, 1);
  ferry_optim_span sp[NSPAN];
  spans_of(&b, sp);
  /* resume at step 41: bias corrections of step 42 */
  EXPECT_EQ_INT(ferry_optimizer_set_step(o, 41), 0);
  done_rec r = {PTHREAD_MUTEX_INITIALIZER, 0, -99};
  EXPECT_EQ_INT(ferry_optimizer_step_async(o, sp, NSPAN, 1.0f, on_done, &r), 0);
  int q = ferry_optimizer_query(o);
  EXPECT(q == 0 || q == FERRY_EAGAIN);
  int busy = ferry_optimizer_step_async(o, sp, NSPAN, 1.0f, NULL, NULL);
  EXPECT(busy == FERRY_EBUSY || busy == 0);
  if (busy == 0) { /* the first one was already over: undo the second */
    EXPECT_EQ_INT(ferry_optimizer_wait(o), 0);
    test_failures += 0;
  }
  EXPECT_EQ_INT(ferry_optimizer_wait(o), 0);
  EXPECT_EQ_INT(ferry_optimizer_query(o), 0);
  pthread_mutex_lock(&r.mu);
  EXPECT_EQ_INT(r.calls, 1);
  EXPECT_EQ_INT(r.status, 0);
  pthread_mutex_unlock(&r.mu);
  ref_step(&a, &cfg, 42, 1.0f);
  if (busy == 0) ref_step(&a, &cfg, 43, 1.0f);
  EXPECT(compare(&a, &b, 0));
  EXPECT_EQ_INT(ferry_optimizer_get_step(o), busy == 0 ? 43 : 42);
  /* an empty step still counts */
  EXPECT_EQ_INT(ferry_optimizer_step(o, NULL, 0, 1.0f), 0);
  /* bad arguments leave a message and change nothing */
  int64_t before = ferry_optimizer_get_step(o);
  ferry_optim_span bad = sp[0];
  bad.state2 = NULL;
  EXPECT_EQ_INT(ferry_optimizer_step(o, &bad, 1, 1.0f), FERRY_EINVAL);
  EXPECT(strstr(ferry_optimizer_last_error(o), "state2") != NULL);
  bad = sp[0];
  bad.grad_dtype = 42;
  EXPECT_EQ_INT(ferry_optimizer_step(o, &bad, 1, 1.0f), FERRY_EINVAL);
  EXPECT_EQ_INT(ferry_optimizer_step(o, sp, NSPAN, NAN), FERRY_EINVAL);
  EXPECT_EQ_INT(ferry_optimizer_get_step(o), before);
  EXPECT_EQ_INT(ferry_optimizer_set_step(o, -1), FERRY_EINVAL);
  /* the step count never overflows: past FERRY_STEP_MAX is refused, and a
   * step from it fails and changes nothing */
  EXPECT_EQ_INT(ferry_optimizer_set_step(o, FERRY_STEP_MAX + 1), FERRY_EINVAL);
  EXPECT_EQ_INT(ferry_optimizer_set_step(o, INT64_MAX), FERRY_EINVAL);
  EXPECT_EQ_INT(ferry_optimizer_set_step(o, FERRY_STEP_MAX), 0);
  model c;
  model_init(&c, 9);
  memcpy(c.p[0], b.p[0], sizeof(float) * span_n[0]);
  EXPECT_EQ_INT(ferry_optimizer_step(o, sp, NSPAN, 1.0f), FERRY_EOVERFLOW);
  EXPECT(strstr(ferry_optimizer_last_error(o), "FERRY_STEP_MAX") != NULL);
  EXPECT(memcmp(c.p[0], b.p[0], sizeof(float) * span_n[0]) == 0);
  EXPECT(ferry_optimizer_get_step(o) == FERRY_STEP_MAX);
  model_free(&c);
  EXPECT_EQ_INT(ferry_optimizer_set_step(o, before), 0);
  EXPECT_EQ_INT(ferry_optimizer_set_lr(o, -1.0f), FERRY_EINVAL);
  EXPECT_EQ_INT(ferry_optimizer_set_lr(o, 1e-4f), 0);
  int crc = ferry_optimizer_step_cuda(o, sp, 0, 1.0f, NULL);
  EXPECT(crc == 0 || crc == FERRY_ENOTSUP);
  model_free(&a);
  model_free(&b);
  ferry_optimizer_destroy(o);
}

static void test_config_errors(void) {
  ferry_optimizer *o = (ferry_optimizer *)1;
  ferry_optimizer_config cfg = ferry_optimizer_config_default(FERRY_OPTIM_ADAM);
  cfg.beta1 = 1.0f;
  EXPECT_EQ_INT(ferry_optimizer_create(&cfg, &o), FERRY_EINVAL);
  EXPECT(o == NULL);
  EXPECT(strstr(ferry_last_error(), "betas") != NULL);
  cfg = ferry_optimizer_config_default(FERRY_OPTIM_SGD);
  cfg.nesterov = 1;
  EXPECT_EQ_INT(ferry_optimizer_create(&cfg, &o), FERRY_EINVAL);
  cfg = ferry_optimizer_config_default((ferry_optim_type)99);
  EXPECT_EQ_INT(ferry_optimizer_create(&cfg, &o), FERRY_EINVAL);
  cfg = ferry_optimizer_config_default(FERRY_OPTIM_ADAM);
  cfg.simd = "mmx";
  EXPECT_EQ_INT(ferry_optimizer_create(&cfg, &o), FERRY_EINVAL);
  EXPECT_EQ_INT(ferry_optimizer_create(NULL, &o), FERRY_EINVAL);
  ferry_optimizer_destroy(NULL);
  EXPECT(strcmp(ferry_optimizer_last_error(NULL), "") == 0);

  /* FERRY_SIMD forces a level; an unknown one is refused */
  cfg = ferry_optimizer_config_default(FERRY_OPTIM_ADAMW);
  cfg.threads = 1;
  setenv("FERRY_SIMD", "scalar", 1);
  EXPECT_EQ_INT(ferry_optimizer_create(&cfg, &o), 0);
  ferry_optimizer_info info;
  ferry_optimizer_get_info(o, &info);
  EXPECT(strcmp(info.simd, "scalar") == 0);
  ferry_optimizer_destroy(o);
  setenv("FERRY_SIMD", "sse9", 1);
  EXPECT_EQ_INT(ferry_optimizer_create(&cfg, &o), FERRY_ENOTSUP);
  unsetenv("FERRY_SIMD");
}

static void test_helpers(void) {
  ferry_optimizer_config cfg = ferry_optimizer_config_default(FERRY_OPTIM_ADAMW);
  cfg.threads = 2;
  cfg.tile = 1000;
  ferry_optimizer *o = NULL;
  REQUIRE(ferry_optimizer_create(&cfg, &o) == 0);
  enum { N1 = 3001, N2 = 77 };
  static float f[N1];
  static uint16_t h[N2];
  double ref = 0;
  for (int i = 0; i < N1; i++) {
    f[i] = srand1();
    ref += (double)f[i] * f[i];
  }
  for (int i = 0; i < N2; i++) {
    h[i] = ferry_f32_to_bf16(srand1() * 8);
    double x = ferry_bf16_to_f32(h[i]);
    ref += x * x;
  }
  ferry_grad_span gs[3] = {
      {f, N1, FERRY_DT_F32}, {NULL, 0, FERRY_DT_F16}, {h, N2, FERRY_DT_BF16}};
  double sum = -1;
  int nf = -1;
  EXPECT_EQ_INT(ferry_optimizer_grad_stats(o, gs, 3, &sum, &nf), 0);
  EXPECT(fabs(sum - ref) <= 1e-12 * ref);
  EXPECT_EQ_INT(nf, 0);
  f[2500] = INFINITY;
  EXPECT_EQ_INT(ferry_optimizer_grad_stats(o, gs, 3, &sum, &nf), 0);
  EXPECT_EQ_INT(nf, 1);
  f[2500] = 0;
  h[76] = 0x7fc0; /* bf16 NaN */
  EXPECT_EQ_INT(ferry_optimizer_grad_stats(o, gs, 3, &sum, &nf), 0);
  EXPECT_EQ_INT(nf, 1);
  gs[0].dtype = 7;
  EXPECT_EQ_INT(ferry_optimizer_grad_stats(o, gs, 3, &sum, &nf), FERRY_EINVAL);

  /* accumulation of fp16 micro-batch grads into fp32 */
  static float acc[N1], want[N1];
  static uint16_t g16[N1];
  for (int i = 0; i < N1; i++) {
    acc[i] = want[i] = srand1();
    g16[i] = ferry_f32_to_f16(srand1());
    want[i] = fmaf(ferry_f16_to_f32(g16[i]), 0.5f, want[i]);
  }
  ferry_grad_span g = {g16, N1, FERRY_DT_F16};
  EXPECT_EQ_INT(ferry_optimizer_grad_accumulate(o, acc, &g, 0.5f), 0);
  EXPECT(memcmp(acc, want, sizeof acc) == 0);

  /* clip coefficient as torch.nn.utils.clip_grad_norm_ */
  EXPECT(ferry_clip_coef(4.0, 1.0f, 10.0f) == 1.0f);
  EXPECT(fabsf(ferry_clip_coef(400.0 * 1024 * 1024, 1024.0f, 1.0f) - 1.0f / 20) < 1e-6f);
  ferry_optimizer_destroy(o);

  /* loss scaler: grow after `interval` clean steps, back off and skip on overflow */
  ferry_loss_scaler ls;
  ferry_loss_scaler_init(&ls, 0, 0, 0, 3);
  EXPECT(ls.scale == 65536.0f);
  EXPECT_EQ_INT(ferry_loss_scaler_update(&ls, 0), 0);
  EXPECT_EQ_INT(ferry_loss_scaler_update(&ls, 0), 0);
  EXPECT(ls.scale == 65536.0f);
  EXPECT_EQ_INT(ferry_loss_scaler_update(&ls, 0), 0);
  EXPECT(ls.scale == 131072.0f);
  EXPECT_EQ_INT(ferry_loss_scaler_update(&ls, 1), 1);
  EXPECT(ls.scale == 65536.0f);
  EXPECT_EQ_INT(ls.skipped, 1);
  EXPECT_EQ_INT(ls.good_steps, 0);
}

int main(void) {
  test_config_errors();
  test_threads_equal_reference();
  test_async_and_steps();
  test_helpers();
  return test_finish("optim.optimizer");
}
