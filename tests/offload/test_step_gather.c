/* tests/offload/test_step_gather.c — under `mpirun -np 2` (host backend):
 * when the ranks' all-gather of a group's new params fails after the
 * optimizer pass (ZeRO stages 1 and 2; a fault injected from inside on
 * every rank, engine_set_step_fault), the step fails and the retry of
 * ferry_step does only the all-gather and what follows it: the optimizer
 * runs once, and every rank's params (the fp32 masters and the params its
 * forward fetches) end bit for bit where a run without the failure ends.
 * Host and device param homes.
 */
#include "ferry.h"
#include "core/dtype.h"
#include "offload/engine_internal.h"
#include "tests/offload/engine_util.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define NRANKS 2
#define NP 3
#define TOTAL (300 + 40 + 260)
static const char *names[NP] = {"a.w", "a.b", "b.w"};
static const int group_of[NP] = {0, 0, 1};
static const size_t sizes[NP] = {300, 40, 260};
static const size_t offset[NP] = {0, 300, 340}; /* in the model, registration order */
static int rank;

/* Rank r's grad of step `step`: multiples of 2^-10, so the ranks' average
 * is exact. */
static float grad_value(int k, int step, size_t i) {
  float x = 0.1f * sinf(0.37f * (float)i + 1.3f * (float)step + (float)k + 0.7f * (float)rank);
  return roundf(x * 1024.0f) / 1024.0f;
}

static ferry_engine *open_engine(ferry_comm *comm, int stage, const char *params_home,
                                 ferry_stream **s) {
  char text[1024];
  snprintf(text, sizeof text,
           "device = \"host\";\n"
           "chunk_size = \"4K\";\n"
           "step_during_backward = false;\n"
           "tiers: { gpu: { budget = \"4M\"; }; host: { budget = \"32M\"; pinned = false; }; };\n"
           "optimizer: { type = \"adamw\"; lr = 0.01; weight_decay = 0.1; threads = 1; "
           "missing_grad = \"zero\"; };\n"
           "precision: { params = \"fp32\"; };\n"
           "placement: { params = \"%s\"; grads = \"host\"; optimizer = \"host\"; };\n"
           "dist: { zero_stage = %d; };\n",
           params_home, stage);
  ferry_engine *e = eu_engine(text, NULL);
  static float init[TOTAL];
  for (size_t i = 0; i < TOTAL; i++) init[i] = 0.5f * cosf(0.11f * (float)i);
  for (int k = 0; k < NP; k++) {
    int64_t shape[1] = {(int64_t)sizes[k]};
    REQUIRE(ferry_param_register(e, names[k], shape, 1, group_of[k], init + offset[k], NULL,
                                 NULL) == 0);
  }
  REQUIRE(ferry_engine_set_comm(e, comm) == 0);
  int rc = ferry_engine_finalize(e);
  if (rc) fprintf(stderr, "finalize: %s\n", ferry_engine_last_error(e));
  REQUIRE(rc == 0);
  REQUIRE(ferry_stream_create(ferry_engine_device(e), s) == 0);
  return e;
}

/* One backward with this rank's grads of `step`, then ferry_step. */
static int run_step(ferry_engine *e, ferry_stream *s, int step) {
  for (int g = 1; g >= 0; g--) {
    REQUIRE(ferry_fetch(e, g, s) == 0);
    for (int k = 0; k < NP; k++) {
      if (group_of[k] != g) continue;
      void *gw = NULL;
      REQUIRE(ferry_param_device(e, names[k], NULL, &gw) == 0);
      REQUIRE(ferry_stream_synchronize(s) == 0);
      for (size_t i = 0; i < sizes[k]; i++) ((float *)gw)[i] = grad_value(k, step, i);
    }
    REQUIRE(ferry_grads_ready(e, g, s) == 0);
    REQUIRE(ferry_release(e, g, s) == 0);
  }
  ferry_step_info info;
  return ferry_step(e, &info);
}

/* The fp32 masters (a collective), then the params the forward fetches. */
static void read_params(ferry_engine *e, ferry_stream *s, float *out) {
  for (int k = 0; k < NP; k++)
    REQUIRE(ferry_param_read(e, names[k], out + offset[k], sizes[k]) == 0);
  for (int g = 0; g < 2; g++) {
    REQUIRE(ferry_fetch(e, g, s) == 0);
    REQUIRE(ferry_stream_synchronize(s) == 0);
    for (int k = 0; k < NP; k++) {
      void *pw = NULL;
      if (group_of[k] != g) continue;
      REQUIRE(ferry_param_device(e, names[k], &pw, NULL) == 0);
      memcpy(out + TOTAL + offset[k], pw, sizes[k] * sizeof(float));
    }
    REQUIRE(ferry_release(e, g, s) == 0);
  }
}

static void check(ferry_comm *comm, int stage, const char *params_home) {
  static float clean3[2 * TOTAL], clean[2 * TOTAL], got[2 * TOTAL];
  ferry_stream *s;
  ferry_engine *e = open_engine(comm, stage, params_home, &s);
  for (int step = 1; step <= 4; step++) {
    REQUIRE(run_step(e, s, step) == 0);
    if (step == 3) read_params(e, s, clean3);
  }
  read_params(e, s, clean);
  ferry_stream_destroy(s);
  ferry_engine_destroy(e);

  e = open_engine(comm, stage, params_home, &s);
  for (int step = 1; step <= 2; step++) REQUIRE(run_step(e, s, step) == 0);
  REQUIRE(engine_wait_step(e) == 0);
  engine_set_step_fault(e, ENGINE_FAULT_GATHER, 1); /* on every rank */
  int rc = run_step(e, s, 3);
  if (!rc) rc = engine_wait_step(e);
  if (rank == 0) printf("  step 3: %s: %s\n", ferry_strerror(rc), ferry_engine_last_error(e));
  EXPECT_EQ_INT(rc, FERRY_EIO);
  ferry_step_info info;
  rc = ferry_step(e, &info); /* the retry: the all-gather again, then the rest */
  if (!rc) rc = engine_wait_step(e);
  if (rc) printf("  rank %d: retry: %s\n", rank, ferry_engine_last_error(e));
  EXPECT_EQ_INT(rc, 0);
  read_params(e, s, got);
  int same3 = memcmp(clean3, got, sizeof got) == 0;
  REQUIRE(run_step(e, s, 4) == 0);
  read_params(e, s, got);
  int same = memcmp(clean, got, sizeof got) == 0;
  printf("  rank %d: after the retry %s, after step 4 %s\n", rank,
         same3 ? "bit-identical" : "DIFFERENT", same ? "bit-identical" : "DIFFERENT");
  EXPECT(same3 && same);
  ferry_stream_destroy(s);
  ferry_engine_destroy(e);
  REQUIRE(ferry_comm_barrier(comm, NULL) == 0);
}

int main(void) {
  ferry_comm *comm = eu_mpi_comm(NRANKS);
  rank = ferry_comm_rank(comm);
  static const char *homes[] = {"host", "gpu"};
  for (int stage = 1; stage <= 2; stage++)
    for (int h = 0; h < 2; h++) {
      if (rank == 0)
        printf("-- a failed all-gather of the new params (stage %d, params %s)\n", stage, homes[h]);
      check(comm, stage, homes[h]);
    }
  ferry_comm_destroy(comm);
  return test_finish("offload.step_gather");
}
