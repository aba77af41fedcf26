/* tests/offload/test_stage_marks.c — a bf16 master's staging marks (NVMe
 * params, updates during backward): ferry_grads_ready keeps a group's host
 * params for the stepper to stage, counted until it has (marks_unstaged),
 * and the loop's fetches wait on that count. Each group's CPU sum takes
 * 0.2 s (engine_set_sum_delay).
 * 1. With grad_accumulation = 2 the first micro-batch's grads queue no
 *    update: no group is marked then (its marks stayed counted until the
 *    step, so every fetch of the second micro-batch waited for the drain);
 *    the last micro-batch's are, and the step ends with none left.
 * 2. ferry_zero_grads right after a group's grads are handed in (backward
 *    threw): it waits for the drain, then for the update the drain queued,
 *    so no mark is left and no update runs once it returns (it waited for
 *    the stepper first, so that update ran beside the zeroing and after).
 * 3. The drain's sum of a marked group fails (engine_set_sum_faults), and
 *    the group handed in after it is not summed: no update comes for
 *    either, and their marks go with the failure (they stayed counted).
 * argv[1]: a scratch folder (the NVMe swap files).
 */
#include "core/dtype.h"
#include "offload/engine_impl.h"
#include "offload/engine_internal.h"
#include "tests/offload/engine_util.h"
#include "tests/test.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define G 2
#define N 64

static const char *scratch = "stage-marks-scratch";

static uint32_t unstaged(ferry_engine *e) {
  pthread_mutex_lock(&e->mu);
  uint32_t n = marks_unstaged(e);
  pthread_mutex_unlock(&e->mu);
  return n;
}

static int stepper_running(ferry_engine *e) {
  pthread_mutex_lock(&e->mu);
  int busy = stepper_busy(e);
  pthread_mutex_unlock(&e->mu);
  return busy;
}

/* The engine: G groups of one bf16 param each, params on NVMe, a bf16
 * master, `accumulation` micro-batches a step; *s a stream of its device. */
static ferry_engine *open_engine(int accumulation, ferry_stream **s) {
  char more[640], text[2400];
  snprintf(more, sizeof more,
           "grad_accumulation = %d;\n"
           "optimizer: { type = \"adamw\"; lr = 0.01; threads = 1; };\n"
           "precision: { params = \"bf16\"; master = \"bf16\"; };\n"
           "placement: { params = \"nvme\"; grads = \"host\"; optimizer = \"host\"; };\n",
           accumulation);
  eu_nvme_text(text, sizeof text, scratch, more);
  ferry_engine *e = eu_engine(text, NULL);
  engine_set_sum_delay(e, 0.2);
  for (int g = 0; g < G; g++) {
    char name[16];
    snprintf(name, sizeof name, "l%d.w", g);
    int64_t shape[1] = {N};
    REQUIRE(ferry_param_register(e, name, shape, 1, g, NULL, NULL, NULL) == 0);
  }
  REQUIRE(ferry_engine_finalize(e) == 0);
  REQUIRE(e->eager && e->master_bf16 && e->param_home == FERRY_TIER_NVME);
  REQUIRE(ferry_stream_create(ferry_engine_device(e), s) == 0);
  return e;
}

static void close_engine(ferry_engine *e, ferry_stream *s) {
  ferry_stream_destroy(s);
  ferry_engine_destroy(e);
}

/* Group g's backward in micro-batch `micro`: fetched, its grads written
 * and handed in, released. The first failing call's status. */
static int hand_in(ferry_engine *e, ferry_stream *s, int g, int micro) {
  char name[16];
  snprintf(name, sizeof name, "l%d.w", g);
  int rc = ferry_fetch(e, g, s);
  if (rc) return rc;
  void *gw = NULL;
  REQUIRE(ferry_param_device(e, name, NULL, &gw) == 0);
  REQUIRE(ferry_stream_synchronize(s) == 0); /* the buffer's zeroing */
  for (size_t i = 0; i < N; i++)
    ferry_dt_store(gw, FERRY_DT_BF16, i, 0.1f * sinf(0.3f * (float)i + (float)(g + micro)));
  rc = ferry_grads_ready(e, g, s);
  int r2 = ferry_release(e, g, s);
  return rc ? rc : r2;
}

/* One micro-batch's backward; *first: the count right after the first
 * group's ferry_grads_ready (its sum takes 0.2 s: not staged yet). */
static void backward(ferry_engine *e, ferry_stream *s, int micro, uint32_t *first) {
  for (int g = G - 1; g >= 0; g--) {
    REQUIRE(hand_in(e, s, g, micro) == 0);
    if (g == G - 1) *first = unstaged(e);
  }
}

static void test_accumulation(void) {
  ferry_stream *s = NULL;
  ferry_engine *e = open_engine(2, &s);
  for (int step = 0; step < 2; step++) {
    uint32_t first0 = 0, first1 = 0;
    backward(e, s, 0, &first0);
    uint32_t after0 = unstaged(e);
    backward(e, s, 1, &first1);
    ferry_step_info info;
    REQUIRE(ferry_step(e, &info) == 0);
    REQUIRE(engine_wait_step(e) == 0);
    uint32_t end = unstaged(e);
    printf("step %d: marked after the first grads %u (micro-batch 1) and %u (micro-batch 2), "
           "%u after micro-batch 1, %u after the step\n",
           step + 1, first0, first1, after0, end);
    EXPECT_EQ_INT(first0, 0); /* micro-batch 1 queues no update: nothing to stage */
    EXPECT_EQ_INT(after0, 0);
    EXPECT_EQ_INT(first1, 1); /* the last micro-batch's: kept for the stepper */
    EXPECT_EQ_INT(end, 0);
  }
  close_engine(e, s);
}

static void test_zero_grads(void) {
  ferry_stream *s = NULL;
  ferry_engine *e = open_engine(1, &s);
  REQUIRE(hand_in(e, s, G - 1, 0) == 0);
  uint32_t marked = unstaged(e);
  REQUIRE(ferry_zero_grads(e) == 0); /* the backward threw: the micro-batch is redone */
  uint32_t left = unstaged(e);
  int running = stepper_running(e);
  printf("zero grads: %u marked before, %u after, an update running after: %d\n", marked, left,
         running);
  EXPECT_EQ_INT(marked, 1);
  EXPECT_EQ_INT(left, 0);
  EXPECT_EQ_INT(running, 0);
  uint32_t first = 0;
  backward(e, s, 0, &first); /* redone */
  REQUIRE(ferry_step(e, NULL) == 0);
  REQUIRE(engine_wait_step(e) == 0);
  EXPECT_EQ_INT(unstaged(e), 0);
  close_engine(e, s);
}

static void test_failed_sum(void) {
  ferry_stream *s = NULL;
  ferry_engine *e = open_engine(1, &s);
  engine_set_sum_faults(e, 1);
  REQUIRE(hand_in(e, s, G - 1, 0) == 0); /* its sum fails in 0.2 s */
  uint32_t marked = unstaged(e);
  /* the next group: not summed once the drain failed (a fetch after the
   * failure may report it: then nothing was handed in) */
  int rc0 = hand_in(e, s, 0, 0);
  uint32_t marked0 = unstaged(e);
  int rc = drain_wait(e);
  uint32_t left = unstaged(e);
  printf("failed sum: %u marked, %u with the next group (its hand-in: %d), drain %d, %u left\n",
         marked, marked0, rc0, rc, left);
  EXPECT_EQ_INT(marked, 1);
  EXPECT_EQ_INT(rc, FERRY_EIO);
  EXPECT_EQ_INT(left, 0);
  EXPECT_EQ_INT(ferry_zero_grads(e), FERRY_EIO); /* the drain's failure stays */
  EXPECT_EQ_INT(unstaged(e), 0);
  close_engine(e, s);
}

int main(int argc, char **argv) {
  if (argc > 1) scratch = argv[1];
  test_accumulation();
  test_zero_grads();
  test_failed_sum();
  return test_finish("offload.stage_marks");
}
