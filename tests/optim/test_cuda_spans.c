/* tests/optim/test_cuda_spans.c — the CUDA step's span bookkeeping, on the
 * CPU: the step's two device calls (optim_cuda_ready, optim_cuda_step) are
 * replaced by fakes (optim_set_cuda_ops) that record each launch, so any
 * build runs it. A group's update is one call over its spans, each at its
 * own step count (optim_step_cuda_counts), and is all or nothing as the
 * stepper's retry wants (a failed update changed nothing; its retry steps
 * every span):
 * 1. every span is launched once, in order, at its own count;
 * 2. a span whose int8 grid no launch holds (the third of three) fails the
 *    call before the first launch (the first two were launched, and a
 *    retry launched them again);
 * 3. a device that failed before the step fails it before the first
 *    launch;
 * 4. a launch that fails after others (only a device failure can, which
 *    fails the later calls too) says how many were launched.
 */
#include "optim/optim.h"
#include "tests/test.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define NS 3

static int ready_status;         /* the fake optim_cuda_ready's answer */
static int fail_at = -1;         /* the launch that fails (-1 none) */
static size_t launched_n[8];     /* each launch's element count */
static float launched_step[8];   /* and its -lr / (1 - beta1^t), which t sets */
static int nlaunch, nready;

static int fake_ready(void *stream, char *why, size_t why_len) {
  (void)stream;
  nready++;
  if (ready_status) snprintf(why, why_len, "fake: the device failed");
  return ready_status;
}

static int fake_launch(const optim_scalars *s, const optim_tile *t, void *stream, char *why,
                       size_t why_len) {
  (void)stream;
  int blocks, threads; /* refused as optim_cuda_step refuses it */
  if (!optim_cuda_grid(t->n, t->sdt, t->block, &blocks, &threads)) {
    snprintf(why, why_len, "fake: no grid holds %zu elements", t->n);
    return FERRY_EINVAL;
  }
  if (nlaunch == fail_at) {
    snprintf(why, why_len, "fake: launch %d failed", nlaunch);
    return FERRY_ENODEV;
  }
  if (nlaunch < 8) {
    launched_n[nlaunch] = t->n;
    launched_step[nlaunch] = s->neg_step;
  }
  nlaunch++;
  return FERRY_OK;
}

static void reset(void) {
  nlaunch = nready = 0;
  ready_status = 0;
  fail_at = -1;
  memset(launched_n, 0, sizeof launched_n);
}

static ferry_optimizer *fake_optimizer(ferry_dtype states) {
  ferry_optimizer_config cfg = ferry_optimizer_config_default(FERRY_OPTIM_ADAMW);
  cfg.threads = 1;
  cfg.state_dtype = states;
  ferry_optimizer *o = NULL;
  REQUIRE(ferry_optimizer_create(&cfg, &o) == 0);
  optim_cuda_ops ops = {fake_ready, fake_launch};
  optim_set_cuda_ops(o, &ops);
  return o;
}

int main(void) {
  /* never dereferenced: the fakes launch nothing */
  static float param[4], grad[4], s1[4], s2[4];
  ferry_optim_span sp[NS];
  for (int i = 0; i < NS; i++) {
    memset(&sp[i], 0, sizeof sp[i]);
    sp[i].param = param;
    sp[i].grad = grad;
    sp[i].state1 = s1;
    sp[i].state2 = s2;
    sp[i].n = 100u * (size_t)(i + 1);
    sp[i].grad_dtype = FERRY_DT_F32;
    sp[i].copy_dtype = FERRY_DT_NONE;
  }
  const int64_t counts[NS] = {4, 0, 2};

  /* 1. */
  ferry_optimizer *o = fake_optimizer(FERRY_DT_F32);
  reset();
  EXPECT_EQ_INT(optim_step_cuda_counts(o, sp, NS, 1.0f, counts, NULL), 0);
  EXPECT_EQ_INT(nready, 1);
  EXPECT_EQ_INT(nlaunch, NS);
  ferry_optimizer_config cfg = ferry_optimizer_config_default(FERRY_OPTIM_ADAMW);
  for (int i = 0; i < NS; i++) {
    optim_scalars want;
    optim_scalars_make(&want, &cfg, cfg.lr, counts[i] + 1, 1.0f);
    EXPECT(launched_n[i] == sp[i].n);
    EXPECT(launched_step[i] == want.neg_step);
  }
  EXPECT(ferry_optimizer_get_step(o) == 0); /* the counts are the caller's */

  /* 3. */
  reset();
  ready_status = FERRY_ENODEV;
  EXPECT_EQ_INT(optim_step_cuda_counts(o, sp, NS, 1.0f, counts, NULL), FERRY_ENODEV);
  printf("device failed before: %s\n", ferry_optimizer_last_error(o));
  EXPECT_EQ_INT(nlaunch, 0);
  EXPECT(strstr(ferry_optimizer_last_error(o), "nothing was launched") != NULL);

  /* 4. */
  reset();
  fail_at = 1;
  EXPECT_EQ_INT(optim_step_cuda_counts(o, sp, NS, 1.0f, counts, NULL), FERRY_ENODEV);
  printf("launch failed: %s\n", ferry_optimizer_last_error(o));
  EXPECT(strstr(ferry_optimizer_last_error(o), "span 1: fake: launch 1 failed (1 of 3 spans "
                                               "launched before)") != NULL);
  ferry_optimizer_destroy(o);

  /* 2. */
  o = fake_optimizer(FERRY_DT_I8);
  reset();
  sp[2].n = (size_t)1 << 40; /* 2^32 absmax blocks of 256 */
  EXPECT_EQ_INT(optim_step_cuda_counts(o, sp, NS, 1.0f, counts, NULL), FERRY_EINVAL);
  printf("a grid too large: %s; %d launched\n", ferry_optimizer_last_error(o), nlaunch);
  EXPECT_EQ_INT(nlaunch, 0);
  EXPECT_EQ_INT(nready, 0);
  EXPECT(strstr(ferry_optimizer_last_error(o), "span 2:") != NULL);
  sp[2].n = 300;
  reset();
  EXPECT_EQ_INT(optim_step_cuda_counts(o, sp, NS, 1.0f, counts, NULL), 0);
  EXPECT_EQ_INT(nlaunch, NS); /* each once */
  ferry_optimizer_destroy(o);
  return test_finish("optim.cuda_spans");
}
