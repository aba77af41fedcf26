/* tests/offload/test_handin.c — a group's grads are handed in once per
 * micro-batch: a second hand-in of a group in the same micro-batch, or one
 * more micro-batch than grad_accumulation before ferry_step, is refused
 * with FERRY_ESTATE saying what to call (it used to queue the group's
 * update twice and abort: "update state queued -> queued"); nothing
 * changes, and the next step runs as if the refused calls were never made.
 */
#include "bench/synth_model.h"
#include "tests/offload/engine_util.h"
#include "tests/test.h"

#include <string.h>

#define G 3
#define D 16

static ferry_engine *make_engine(int accumulation, int eager) {
  char text[1024];
  snprintf(text, sizeof text,
           "device = \"host\";\n"
           "chunk_size = \"8K\";\n"
           "grad_accumulation = %d;\n"
           "step_during_backward = %s;\n"
           "tiers: { gpu: { budget = \"1M\"; }; host: { budget = \"16M\"; pinned = false; }; };\n"
           "optimizer: { type = \"sgd\"; lr = 0.1; momentum = 0.0; weight_decay = 0.0; threads = 1; };\n"
           "precision: { params = \"fp32\"; };\n"
           "placement: { params = \"host\"; optimizer = \"host\"; };\n",
           accumulation, eager ? "true" : "false");
  return eu_engine(text, NULL);
}

/* One backward's hand-in of group g with grads `v` (forward left out: the
 * grads are given). */
static int hand_in(ferry_engine *e, ferry_stream *s, int g, float v) {
  char name[32];
  snprintf(name, sizeof name, "layer%d.w", g);
  void *gw = NULL;
  int rc = ferry_fetch(e, g, s);
  if (rc) return rc;
  rc = ferry_param_device(e, name, NULL, &gw);
  if (!rc) rc = ferry_stream_synchronize(s); /* the buffer's zeroing */
  if (!rc)
    for (int i = 0; i < D * D; i++) ((float *)gw)[i] = v;
  if (!rc) rc = ferry_grads_ready(e, g, s);
  int r2 = ferry_release(e, g, s);
  return rc ? rc : r2;
}

static float first_weight(ferry_engine *e, int g) {
  char name[32];
  snprintf(name, sizeof name, "layer%d.w", g);
  float w[D * D];
  REQUIRE(ferry_param_read(e, name, w, D * D) == 0);
  return w[0];
}

static void expect_refused(ferry_engine *e, int rc, const char *word) {
  const char *msg = ferry_engine_last_error(e);
  printf("refused: %s\n", msg);
  EXPECT_EQ_INT(rc, FERRY_ESTATE);
  EXPECT(strstr(msg, word) != NULL);
}

/* accumulation micro-batches, then the refused extra hand-ins, then a step:
 * the weights move as far as one step of the given grads. */
static void run(int accumulation, int eager) {
  printf("-- grad_accumulation %d, step_during_backward %d\n", accumulation, eager);
  ferry_engine *e = make_engine(accumulation, eager);
  synth_model m;
  REQUIRE(synth_init(&m, G, D, 2, FERRY_DT_F32) == 0);
  REQUIRE(synth_register(e, &m) == 0);
  REQUIRE(ferry_engine_finalize(e) == 0);
  ferry_stream *s = NULL;
  REQUIRE(ferry_stream_create(ferry_engine_device(e), &s) == 0);
  float w0 = first_weight(e, 0);
  for (int k = 0; k < accumulation; k++) {
    EXPECT_EQ_INT(hand_in(e, s, G - 1, 1.0f), 0);
    /* the same group again in this micro-batch */
    expect_refused(e, hand_in(e, s, G - 1, 5.0f), "already");
    for (int g = G - 2; g >= 0; g--) EXPECT_EQ_INT(hand_in(e, s, g, 1.0f), 0);
  }
  /* a micro-batch more than grad_accumulation before ferry_step */
  for (int g = G - 1; g >= 0; g--) expect_refused(e, hand_in(e, s, g, 7.0f), "ferry_step");
  ferry_step_info info;
  EXPECT_EQ_INT(ferry_step(e, &info), 0);
  float w1 = first_weight(e, 0);
  printf("w %.6f -> %.6f, grad norm %g\n", w0, w1, info.grad_norm);
  EXPECT(fabsf((w0 - w1) - 0.1f) < 1e-5f); /* sgd: lr x the mean grad 1 */
  /* the next step takes grads again */
  for (int k = 0; k < accumulation; k++)
    for (int g = G - 1; g >= 0; g--) EXPECT_EQ_INT(hand_in(e, s, g, 1.0f), 0);
  EXPECT_EQ_INT(ferry_step(e, &info), 0);
  EXPECT(fabsf((w1 - first_weight(e, 0)) - 0.1f) < 1e-5f);
  ferry_stream_destroy(s);
  ferry_engine_destroy(e);
  synth_free(&m);
}

int main(void) {
  run(1, 1);
  run(1, 0);
  run(2, 0);
  return test_finish("offload.handin");
}
