/* tests/offload/test_stage_marks.c — a bf16 master's staging marks (NVMe
 * params, updates during backward): ferry_grads_ready keeps a group's host
 * params for the stepper to stage, counted until it has (stepper_unstaged),
 * and the loop's fetches wait on that count. With grad_accumulation = 2 the
 * first micro-batch's grads queue no update: no group is marked then (its
 * marks stayed counted until the step, so every fetch of the second
 * micro-batch waited for the drain); the last micro-batch's are, and the
 * step ends with none left.
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
#include <sys/stat.h>
#include <unistd.h>

#define G 2
#define N 64

static uint32_t unstaged(ferry_engine *e) {
  pthread_mutex_lock(&e->mu);
  uint32_t n = stepper_unstaged(e);
  pthread_mutex_unlock(&e->mu);
  return n;
}

/* One micro-batch's backward; *first: the count right after the first
 * group's ferry_grads_ready (its sum takes 0.2 s: not staged yet). */
static void backward(ferry_engine *e, ferry_stream *s, int micro, uint32_t *first) {
  for (int g = G - 1; g >= 0; g--) {
    char name[16];
    snprintf(name, sizeof name, "l%d.w", g);
    REQUIRE(ferry_fetch(e, g, s) == 0);
    void *gw = NULL;
    REQUIRE(ferry_param_device(e, name, NULL, &gw) == 0);
    REQUIRE(ferry_stream_synchronize(s) == 0); /* the buffer's zeroing */
    for (size_t i = 0; i < N; i++)
      ferry_dt_store(gw, FERRY_DT_BF16, i, 0.1f * sinf(0.3f * (float)i + (float)(g + micro)));
    REQUIRE(ferry_grads_ready(e, g, s) == 0);
    if (g == G - 1) *first = unstaged(e);
    REQUIRE(ferry_release(e, g, s) == 0);
  }
}

int main(int argc, char **argv) {
  const char *scratch = argc > 1 ? argv[1] : "stage-marks-scratch";
  char nvme[1200], text[2400];
  snprintf(nvme, sizeof nvme, "%.1000s/nvme-%ld", scratch, (long)getpid());
  mkdir(scratch, 0755);
  mkdir(nvme, 0755);
  snprintf(text, sizeof text,
           "device = \"host\";\n"
           "chunk_size = \"4K\";\n"
           "grad_accumulation = 2;\n"
           "tiers: { gpu: { budget = \"1M\"; }; host: { budget = \"16M\"; pinned = false; };\n"
           "         nvme: { paths = [\"%s\"]; block_size = \"4K\"; queue_depth = 8; }; };\n"
           "optimizer: { type = \"adamw\"; lr = 0.01; threads = 1; };\n"
           "precision: { params = \"bf16\"; master = \"bf16\"; };\n"
           "placement: { params = \"nvme\"; grads = \"host\"; optimizer = \"host\"; };\n",
           nvme);
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
  ferry_stream *s = NULL;
  REQUIRE(ferry_stream_create(ferry_engine_device(e), &s) == 0);
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
  ferry_stream_destroy(s);
  ferry_engine_destroy(e);
  return test_finish("offload.stage_marks");
}
