/* tests/offload/test_host_grads.c — gradients written from the host, as
 * include/ferry/engine.h says: the backward ferry_fetch zeroes the grad
 * buffer asynchronously on its stream, so the loop synchronizes that
 * stream before its host writes. Host backend, two groups, fp32 params,
 * plain SGD: after each of 20 steps every one of the 2 x 4096 params is
 * p - lr x g exactly (no written value lost to the zeroing; without the
 * synchronization the zeroing lands after the writes and all are lost).
 */
#include "tests/offload/engine_util.h"
#include "tests/test.h"

#include <string.h>

#define N 4096
#define G 2
#define STEPS 20

static float init[G][N];

static int write_grads(ferry_engine *e, ferry_stream *s, int step, float want[G][N]) {
  for (int g = 0; g < G; g++) { /* forward: nothing to compute */
    if (ferry_fetch(e, g, s) || ferry_release(e, g, s)) return 1;
  }
  for (int g = G - 1; g >= 0; g--) {
    char name[8];
    snprintf(name, sizeof name, "w%d", g);
    float *grad = NULL;
    if (ferry_fetch(e, g, s) || ferry_param_device(e, name, NULL, (void **)&grad)) return 1;
    if (ferry_stream_synchronize(s)) return 1; /* the zeroing is done: host writes are safe */
    for (int i = 0; i < N; i++) {
      float gv = (float)((i + step + g) % 64 + 1) * 0x1p-10f;
      grad[i] = gv;
      want[g][i] -= 0.5f * gv; /* exact: dyadic values */
    }
    if (ferry_grads_ready(e, g, s) || ferry_release(e, g, s)) return 1;
  }
  ferry_step_info info;
  return ferry_stream_synchronize(s) || ferry_step(e, &info);
}

int main(void) {
  ferry_engine *e = eu_engine("device = \"host\";\n"
                              "precision: { params = \"fp32\"; };\n"
                              "tiers: { gpu: { budget = \"16M\"; }; "
                              "host: { budget = \"16M\"; pinned = false; }; };\n"
                              "optimizer: { type = \"sgd\"; lr = 0.5; momentum = 0.0; weight_decay = 0.0; "
                              "threads = 1; };\n",
                              NULL);
  static float want[G][N];
  for (int g = 0; g < G; g++) {
    for (int i = 0; i < N; i++) init[g][i] = want[g][i] = (float)(i % 128) * 0x1p-7f;
    char name[8];
    snprintf(name, sizeof name, "w%d", g);
    int64_t shape[1] = {N};
    REQUIRE(ferry_param_register(e, name, shape, 1, g, init[g], NULL, NULL) == 0);
  }
  int rc = ferry_engine_finalize(e);
  if (rc) fprintf(stderr, "finalize: %s\n", ferry_engine_last_error(e));
  REQUIRE(rc == 0);
  ferry_stream *s = NULL;
  REQUIRE(ferry_stream_create(ferry_engine_device(e), &s) == 0);
  size_t lost = 0;
  for (int step = 0; step < STEPS; step++) {
    if (write_grads(e, s, step, want)) {
      fprintf(stderr, "step %d: %s\n", step, ferry_engine_last_error(e));
      REQUIRE(!"step failed");
    }
    for (int g = 0; g < G; g++) {
      static float got[N];
      char name[8];
      snprintf(name, sizeof name, "w%d", g);
      REQUIRE(ferry_param_read(e, name, got, N) == 0);
      for (int i = 0; i < N; i++) lost += got[i] != want[g][i];
    }
  }
  printf("%d steps of %d x %d grads written from the host: %zu values lost\n", STEPS, G, N, lost);
  EXPECT(lost == 0);
  ferry_stream_destroy(s);
  ferry_engine_destroy(e);
  return test_finish("offload.host_grads");
}
