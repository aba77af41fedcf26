/* tests/offload/test_stream_order.c — the engine's stream order on the host
 * backend, with ferry_stream_sleep standing for slow GPU work: the step's
 * upload of new params (device home) waits for the loop's last read of the
 * group, so a reader still running when the step commits sees the old
 * values whole (no torn reads); the grad drain overlaps the D2H of one group
 * with the accumulation of the one before (double-buffered staging).
 */
#include "bench/synth_model.h"
#include "offload/engine_internal.h"
#include "format/timeline.h"
#include "tests/offload/engine_util.h"
#include "tests/test.h"

#include <stdint.h>

#define G 4
#define D 32
#define N (D * D)

static ferry_engine *make_engine(const char *extra) {
  char text[1024];
  snprintf(text, sizeof text,
           "device = \"host\";\n"
           "chunk_size = \"8K\";\n"
           "tiers: { gpu: { budget = \"1M\"; }; host: { budget = \"16M\"; pinned = false; }; };\n"
           "optimizer: { type = \"adamw\"; lr = 0.05; threads = 1; };\n"
           "precision: { params = \"bf16\"; };\n"
           "placement: { params = \"gpu\"; grads = \"host\"; optimizer = \"host\"; };\n"
           "%s\n",
           extra);
  return eu_engine(text, NULL);
}

static void register_params(ferry_engine *e, double d2h_delay) {
  engine_set_d2h_delay(e, d2h_delay);
  for (int g = 0; g < G; g++) {
    char name[32];
    snprintf(name, sizeof name, "layer%d.w", g);
    int64_t shape[2] = {D, D};
    REQUIRE(ferry_param_register(e, name, shape, 2, g, NULL, synth_init_weights,
                                 (void *)(intptr_t)g) == 0);
  }
  int rc = ferry_engine_finalize(e);
  if (rc) fprintf(stderr, "finalize: %s\n", ferry_engine_last_error(e));
  REQUIRE(rc == 0);
}

/* Stream kernels of the test (host functions: emulated device work). */
typedef struct {
  void *grad;   /* bf16 device grads */
  float value;
} fill_arg;
static int fill_grads(void *arg) {
  fill_arg *f = arg;
  for (size_t i = 0; i < N; i++) ferry_dt_store(f->grad, FERRY_DT_BF16, i, f->value * (float)(i % 7 + 1));
  return 0;
}
typedef struct {
  const void *param; /* bf16 device params */
  uint16_t seen[N];
} read_arg;
static int read_params(void *arg) {
  read_arg *r = arg;
  memcpy(r->seen, r->param, sizeof r->seen);
  return 0;
}

static void bf16_of(const float *v, uint16_t *out) {
  for (size_t i = 0; i < N; i++) ferry_dt_store(out, FERRY_DT_BF16, i, v[i]);
}

/* Backward over every group with fixed grads. With rd, group 0's params
 * are read once more after a long sleep, behind its release: the step
 * commits its new params meanwhile; rd gets what that read saw. */
static void backward(ferry_engine *e, ferry_stream *s, read_arg *rd) {
  static fill_arg fills[G];
  for (int g = G - 1; g >= 0; g--) {
    char name[32];
    snprintf(name, sizeof name, "layer%d.w", g);
    void *w, *gw;
    REQUIRE(ferry_fetch(e, g, s) == 0);
    REQUIRE(ferry_param_device(e, name, &w, &gw) == 0);
    fills[g] = (fill_arg){gw, 0.01f * (float)(g + 1)};
    REQUIRE(ferry_launch_host_func(s, fill_grads, &fills[g]) == 0);
    REQUIRE(ferry_grads_ready(e, g, s) == 0);
    if (g == 0 && rd) { /* the loop still reads group 0 well after its grads are in */
      rd->param = w;
      REQUIRE(ferry_stream_sleep(s, 0.3) == 0);
      REQUIRE(ferry_launch_host_func(s, read_params, rd) == 0);
    }
    REQUIRE(ferry_release(e, g, s) == 0);
  }
}

static void commit_waits_for_reader(const char *mode) {
  ferry_engine *e = make_engine(mode);
  register_params(e, 0);
  ferry_stream *s = NULL;
  REQUIRE(ferry_stream_create(ferry_engine_device(e), &s) == 0);
  float before[N], after[N];
  uint16_t old16[N], new16[N];
  REQUIRE(ferry_param_read(e, "layer0.w", before, N) == 0);
  bf16_of(before, old16);

  static read_arg rd;
  memset(&rd, 0, sizeof rd);
  backward(e, s, &rd);
  ferry_step_info info;
  int rc = ferry_step(e, &info);
  if (rc) fprintf(stderr, "step: %s\n", ferry_engine_last_error(e));
  REQUIRE(rc == 0);
  REQUIRE(engine_wait_step(e) == 0); /* the upload is enqueued (behind the reader) */
  REQUIRE(ferry_stream_synchronize(s) == 0);
  EXPECT(memcmp(rd.seen, old16, sizeof old16) == 0); /* the old params, whole */

  /* the next fetch sees the new ones */
  REQUIRE(ferry_param_read(e, "layer0.w", after, N) == 0);
  bf16_of(after, new16);
  EXPECT(memcmp(new16, old16, sizeof old16) != 0);
  memset(&rd, 0, sizeof rd);
  void *w;
  REQUIRE(ferry_fetch(e, 0, s) == 0);
  REQUIRE(ferry_param_device(e, "layer0.w", &w, NULL) == 0);
  rd.param = w;
  REQUIRE(ferry_launch_host_func(s, read_params, &rd) == 0);
  REQUIRE(ferry_release(e, 0, s) == 0);
  REQUIRE(ferry_stream_synchronize(s) == 0);
  EXPECT(memcmp(rd.seen, new16, sizeof new16) == 0);
  printf("commit after a slow reader (%s): %s\n", mode,
         memcmp(rd.seen, new16, sizeof new16) == 0 ? "ok" : "wrong");
  ferry_stream_destroy(s);
  ferry_engine_destroy(e);
}

/* Backward with a slow D2H link (a 0.1 s stream sleep before each grad
 * copy) and a slow sum (a 0.05 s sleep at the start of each): the drain
 * sums group g from one staging buffer while group g+1's copy, enqueued
 * before, runs into the other, so every sum but the last ends while another
 * group's D2H runs. The single-buffered drain enqueued a copy only after
 * the sum before, so none did. (Without the slow sum the copy's begin stamp
 * and the end of a sum of a few microseconds race, and under TSan the sum
 * won all four.) */
static void drain_overlaps(void) {
  ferry_engine *e = make_engine("step_during_backward = false;");
  engine_set_sum_delay(e, 0.05);
  register_params(e, 0.1);
  ferry_stream *s = NULL;
  REQUIRE(ferry_stream_create(ferry_engine_device(e), &s) == 0);
  backward(e, s, NULL);
  REQUIRE(ferry_stream_synchronize(s) == 0);
  REQUIRE(ferry_step(e, NULL) == 0); /* waits for the drain */
  REQUIRE(engine_wait_step(e) == 0);
  const ferry_timeline *tl = engine_timeline(e);
  size_t n = atomic_load(&tl->n), nd2h = 0, nacc = 0, inside = 0;
  if (n > tl->cap) n = tl->cap;
  for (size_t i = 0; i < n; i++) {
    const ferry_span *a = &tl->spans[i];
    nd2h += a->lane == FERRY_LANE_D2H && !strcmp(a->name, "grads D2H");
    if (a->lane != FERRY_LANE_OPTIM0 || strcmp(a->name, "accumulate")) continue;
    nacc++;
    for (size_t j = 0; j < n; j++) {
      const ferry_span *c = &tl->spans[j];
      if (c->lane == FERRY_LANE_D2H && !strcmp(c->name, "grads D2H") && c->t0 <= a->t1 &&
          a->t1 <= c->t1) {
        inside++;
        break;
      }
    }
  }
  printf("drain: %zu D2H spans, %zu sums, %zu of them ending during a D2H\n", nd2h, nacc, inside);
  EXPECT_EQ_INT(nd2h, G);
  EXPECT_EQ_INT(nacc, G);
  /* G - 1 unless a thread is descheduled for 50 ms; the single-buffered
   * drain ends none inside a copy, so one still tells the two apart. */
  EXPECT(inside >= 1);
  ferry_stream_destroy(s);
  ferry_engine_destroy(e);
}

int main(void) {
  drain_overlaps();
  /* eager: the update runs during backward, as soon as group 0's grads are in */
  commit_waits_for_reader("step_during_backward = true;");
  /* at ferry_step */
  commit_waits_for_reader("step_during_backward = false;");
  return test_finish("offload.stream_order");
}
