/* tests/offload/test_step_atomic.c — a group's update is all or nothing,
 * and a group with nothing to update is left alone.
 * 1. Params of one group with different step counts (a param left out of
 *    earlier steps, optimizer.missing_grad = skip) are updated in one
 *    optimizer call: when a param's update cannot run (here its count is
 *    set, from inside, to FERRY_STEP_MAX, so its step would overflow), the
 *    update fails before any param of the group changed, and the retry
 *    ends bit for bit where a run without the failure ends.
 * 2. A step where no param of a group got a gradient (missing_grad = skip)
 *    reads and writes none of its optimizer state and commits none of its
 *    params (NVMe homes: the per-family bytes of ferry_stats do not move),
 *    and the next steps end where a run without that step ends.
 * 3. An update that fails after its optimizer pass (a fault injected from
 *    inside while its grads are zeroed, or while its new params are
 *    uploaded to a device home or committed to a host or NVMe home, after
 *    their first param's copy) fails the step with the state, the counts
 *    and the new params already the step's: the retry finishes only what
 *    is left (the optimizer runs once, each count moves once), and the run
 *    ends bit for bit where a run without the failure ends; fp32 params,
 *    a bf16 master (whose new params exist nowhere but the staging), and
 *    updates during backward.
 * argv[1]: a scratch folder (the NVMe swap files).
 */
#include "offload/engine_impl.h"
#include "offload/engine_internal.h"
#include "tests/offload/run_fixture.h"
#include "tests/test.h"
#include "core/dtype.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *scratch = "step-atomic-scratch";
static int eager; /* step_during_backward: updates queued as the backward hands grads in */

#define FP32 "params = \"fp32\";"
#define BF16_MASTER "params = \"bf16\"; master = \"bf16\";"

static void run_open_prec(run_t *R, const char *params_home, const char *optim_home,
                          const char *prec) {
  char more[1024], text[2400];
  snprintf(more, sizeof more,
           "step_during_backward = %s;\n"
           "optimizer: { type = \"adamw\"; lr = 0.01; weight_decay = 0.1; threads = 1; "
           "missing_grad = \"skip\"; };\n"
           "precision: { %s };\n"
           "placement: { params = \"%s\"; grads = \"host\"; optimizer = \"%s\"; };\n",
           eager ? "true" : "false", prec, params_home, optim_home);
  eu_nvme_text(text, sizeof text, scratch, more);
  run_engine(R, text, 0);
}

static void run_open(run_t *R, const char *params_home, const char *optim_home) {
  run_open_prec(R, params_home, optim_home, FP32);
}

/* One backward (groups in reverse) with the grads of `step`; params whose
 * bit is set in `none` get no grad (ferry_param_no_grad). Then ferry_step,
 * whose status is returned. */
static int run_step(run_t *R, int step, unsigned none) {
  for (int g = 1; g >= 0; g--) {
    REQUIRE(ferry_fetch(R->e, g, R->s) == 0);
    for (int k = 0; k < NP; k++) {
      if (group_of[k] != g) continue;
      void *gw = NULL;
      REQUIRE(ferry_param_device(R->e, names[k], NULL, &gw) == 0);
      REQUIRE(ferry_stream_synchronize(R->s) == 0); /* the buffer's zeroing */
      if (none & (1u << k)) {
        REQUIRE(ferry_param_no_grad(R->e, names[k]) == 0);
        continue;
      }
      ferry_dtype dt = engine_param_dtype(R->e); /* the device grads' */
      for (size_t i = 0; i < sizes[k]; i++) ferry_dt_store(gw, dt, i, grad_value(k, step, i));
    }
    REQUIRE(ferry_grads_ready(R->e, g, R->s) == 0);
    REQUIRE(ferry_release(R->e, g, R->s) == 0);
  }
  ferry_step_info info;
  return ferry_step(R->e, &info);
}

static void read_all(run_t *R, float *out) {
  for (int k = 0; k < NP; k++) {
    REQUIRE(ferry_param_read(R->e, names[k], out, sizes[k]) == 0);
    out += sizes[k];
  }
}

#define TOTAL (96 + 17 + 80)

/* The params as the loop's forward sees them (fetched: the device copy),
 * widened to fp32; read_all reads the fp32 masters. */
static void read_fetched(run_t *R, float *out) {
  ferry_dtype dt = engine_param_dtype(R->e);
  for (int g = 0; g < 2; g++) {
    REQUIRE(ferry_fetch(R->e, g, R->s) == 0);
    REQUIRE(ferry_stream_synchronize(R->s) == 0);
    float *o = out;
    for (int k = 0; k < NP; k++) {
      if (group_of[k] == g) {
        void *pw = NULL;
        REQUIRE(ferry_param_device(R->e, names[k], &pw, NULL) == 0);
        for (size_t i = 0; i < sizes[k]; i++) o[i] = ferry_dt_load(pw, dt, i);
      }
      o += sizes[k];
    }
    REQUIRE(ferry_release(R->e, g, R->s) == 0);
  }
}

static eng_param *param_of(run_t *R, const char *name) {
  for (size_t i = 0; i < R->e->gt.nparams; i++)
    if (!strcmp(R->e->gt.params[i].name, name)) return &R->e->gt.params[i];
  REQUIRE(0);
  return NULL;
}

/* ---- 1. a failed update changes nothing ---------------------------------- */

static void check_failed_update(const char *params_home) {
  printf("-- an update that cannot step every param of its group (params %s)\n", params_home);
  /* a.b has no grad in step 1, so group 0's params then differ in count */
  float clean[TOTAL], got[TOTAL];
  run_t A;
  run_open(&A, params_home, "host");
  for (int step = 1; step <= 4; step++) REQUIRE(run_step(&A, step, step == 1 ? 2u : 0u) == 0);
  read_all(&A, clean);
  run_close(&A);

  run_t B;
  run_open(&B, params_home, "host");
  for (int step = 1; step <= 2; step++) REQUIRE(run_step(&B, step, step == 1 ? 2u : 0u) == 0);
  REQUIRE(engine_wait_step(B.e) == 0);
  eng_param *aw = param_of(&B, "a.w"), *ab = param_of(&B, "a.b");
  EXPECT(aw->steps == 2 && ab->steps == 1);
  int64_t keep = aw->steps;
  aw->steps = FERRY_STEP_MAX; /* its update would pass the most a count holds */
  int rc = run_step(&B, 3, 0);
  if (!rc) rc = engine_wait_step(B.e);
  printf("  step 3: %s: %s\n", ferry_strerror(rc), ferry_engine_last_error(B.e));
  EXPECT_EQ_INT(rc, FERRY_EOVERFLOW);
  EXPECT(ab->steps == 1); /* not counted */
  aw->steps = keep;
  ferry_step_info info;
  rc = ferry_step(B.e, &info); /* the retry completes step 3 */
  if (rc) printf("  retry: %s\n", ferry_engine_last_error(B.e));
  EXPECT_EQ_INT(rc, 0);
  EXPECT(aw->steps == 3 && ab->steps == 2);
  REQUIRE(run_step(&B, 4, 0) == 0);
  read_all(&B, got);
  EXPECT(memcmp(clean, got, sizeof clean) == 0);
  run_close(&B);
}

/* ---- 2. a group with no grad is left alone ------------------------------- */

static void flushed_stats(run_t *R, ferry_stats *st) {
  REQUIRE(engine_wait_step(R->e) == 0);
  REQUIRE(engine_flush(R->e) == 0);
  REQUIRE(ferry_engine_get_stats(R->e, st) == 0);
}

/* The bytes of group g's chunks of a family. */
static size_t group_bytes(run_t *R, uint32_t g, int family) {
  uint32_t first = 0, count = 0;
  size_t n = 0;
  ferry_mem_group_chunks(R->e->mem, g, family, &first, &count);
  for (uint32_t c = first; c < first + count; c++) {
    ferry_mem_chunk_info ci;
    REQUIRE(ferry_mem_chunk_get(R->e->mem, c, &ci) == 0);
    n += ci.bytes;
  }
  return n;
}

static uint64_t moved(const ferry_stats *a, const ferry_stats *b, int write, int family) {
  return write ? b->nvme_write_bytes[family] - a->nvme_write_bytes[family]
               : b->nvme_read_bytes[family] - a->nvme_read_bytes[family];
}

static void check_no_grad_group(void) {
  printf("-- a step where no param of a group got a grad (NVMe homes)\n");
  float clean[TOTAL], got[TOTAL], before[TOTAL];
  run_t A; /* steps 1, 2, 4 */
  run_open(&A, "nvme", "nvme");
  REQUIRE(run_step(&A, 1, 0) == 0);
  REQUIRE(run_step(&A, 2, 0) == 0);
  REQUIRE(run_step(&A, 4, 0) == 0);
  read_all(&A, clean);
  run_close(&A);

  run_t B; /* steps 1, 2, one where no param has a grad, 4 */
  run_open(&B, "nvme", "nvme");
  REQUIRE(run_step(&B, 1, 0) == 0);
  REQUIRE(run_step(&B, 2, 0) == 0);
  ferry_stats s0, s1, s2;
  flushed_stats(&B, &s0);
  read_all(&B, before);
  REQUIRE(run_step(&B, 3, 7u) == 0);
  flushed_stats(&B, &s1);
  read_all(&B, got);
  EXPECT(memcmp(before, got, sizeof got) == 0);
  printf("  no grads: optimizer state read %llu, written %llu bytes; params written %llu\n",
         (unsigned long long)moved(&s0, &s1, 0, FERRY_FAMILY_OPTIM),
         (unsigned long long)moved(&s0, &s1, 1, FERRY_FAMILY_OPTIM),
         (unsigned long long)moved(&s0, &s1, 1, FERRY_FAMILY_PARAMS));
  EXPECT(moved(&s0, &s1, 0, FERRY_FAMILY_OPTIM) == 0);
  EXPECT(moved(&s0, &s1, 1, FERRY_FAMILY_OPTIM) == 0);
  EXPECT(moved(&s0, &s1, 1, FERRY_FAMILY_PARAMS) == 0);
  for (size_t i = 0; i < B.e->gt.nparams; i++) EXPECT(B.e->gt.params[i].steps == 2);
  REQUIRE(run_step(&B, 4, 0) == 0);
  read_all(&B, got);
  EXPECT(memcmp(clean, got, sizeof got) == 0);

  /* group 1 (b.w) without a grad, group 0 with: group 0's state and
   * params are written, once each, and nothing of group 1 */
  flushed_stats(&B, &s1);
  REQUIRE(run_step(&B, 5, 4u) == 0);
  flushed_stats(&B, &s2);
  size_t g0_optim = group_bytes(&B, 0, FERRY_FAMILY_OPTIM);
  size_t g0_params = group_bytes(&B, 0, FERRY_FAMILY_PARAMS);
  printf("  group 1 without grads: optimizer state written %llu bytes (group 0's: %zu), params "
         "%llu (group 0's: %zu)\n",
         (unsigned long long)moved(&s1, &s2, 1, FERRY_FAMILY_OPTIM), g0_optim,
         (unsigned long long)moved(&s1, &s2, 1, FERRY_FAMILY_PARAMS), g0_params);
  EXPECT(moved(&s1, &s2, 1, FERRY_FAMILY_OPTIM) == g0_optim);
  EXPECT(moved(&s1, &s2, 1, FERRY_FAMILY_PARAMS) == g0_params);
  EXPECT(param_of(&B, "b.w")->steps == 3 && param_of(&B, "a.w")->steps == 4);
  run_close(&B);
}

/* ---- 3. a failure after the optimizer pass --------------------------------- */

static void check_tail_fault(const char *params_home, const char *prec, int point) {
  static const char *const what[] = {"", "the zeroing of the grads", "",
                                     "the upload or commit of the new params"};
  printf("-- a fault in %s after the optimizer pass (params %s, %s%s)\n", what[point],
         params_home, strstr(prec, "master") ? "a bf16 master" : "fp32",
         eager ? ", updates during backward" : "");
  float clean3[TOTAL], fetched3[TOTAL], clean[TOTAL], got[TOTAL];
  run_t A;
  run_open_prec(&A, params_home, "host", prec);
  for (int step = 1; step <= 4; step++) {
    REQUIRE(run_step(&A, step, 0) == 0);
    if (step != 3) continue;
    read_all(&A, clean3);
    read_fetched(&A, fetched3);
  }
  read_all(&A, clean);
  run_close(&A);

  run_t B;
  run_open_prec(&B, params_home, "host", prec);
  for (int step = 1; step <= 2; step++) REQUIRE(run_step(&B, step, 0) == 0);
  REQUIRE(engine_wait_step(B.e) == 0);
  engine_set_step_fault(B.e, point, 1);
  int rc = run_step(&B, 3, 0);
  if (!rc) rc = engine_wait_step(B.e);
  printf("  step 3: %s: %s\n", ferry_strerror(rc), ferry_engine_last_error(B.e));
  EXPECT_EQ_INT(rc, FERRY_EIO);
  /* the first group updated (forward order, or backward's during backward)
   * failed after its optimizer pass, counted once; the other is held back */
  uint32_t failed = eager ? 1 : 0;
  for (size_t i = 0; i < B.e->gt.nparams; i++)
    EXPECT(B.e->gt.params[i].steps == (B.e->gt.params[i].group == failed ? 3 : 2));
  ferry_step_info info;
  rc = ferry_step(B.e, &info); /* the retry finishes step 3 */
  if (!rc) rc = engine_wait_step(B.e);
  if (rc) printf("  retry: %s\n", ferry_engine_last_error(B.e));
  EXPECT_EQ_INT(rc, 0);
  for (size_t i = 0; i < B.e->gt.nparams; i++) EXPECT(B.e->gt.params[i].steps == 3);
  read_all(&B, got);
  int same3 = memcmp(clean3, got, sizeof got) == 0;
  read_fetched(&B, got); /* the params step 4's forward sees */
  same3 = same3 && memcmp(fetched3, got, sizeof got) == 0;
  REQUIRE(run_step(&B, 4, 0) == 0);
  read_all(&B, got);
  int same = memcmp(clean, got, sizeof clean) == 0;
  printf("  after the retry: %s; after step 4: %s\n", same3 ? "bit-identical" : "DIFFERENT",
         same ? "bit-identical" : "DIFFERENT");
  EXPECT(same3 && same);
  run_close(&B);
}

int main(int argc, char **argv) {
  if (argc > 1) scratch = argv[1];
  check_failed_update("host");
  check_failed_update("nvme");
  check_no_grad_group();
  check_tail_fault("host", FP32, ENGINE_FAULT_ZERO);
  check_tail_fault("gpu", FP32, ENGINE_FAULT_ZERO);
  check_tail_fault("gpu", FP32, ENGINE_FAULT_HOME);   /* the upload */
  check_tail_fault("host", FP32, ENGINE_FAULT_HOME);  /* the commit */
  check_tail_fault("nvme", FP32, ENGINE_FAULT_HOME);
  check_tail_fault("gpu", BF16_MASTER, ENGINE_FAULT_HOME);
  check_tail_fault("nvme", BF16_MASTER, ENGINE_FAULT_HOME);
  eager = 1; /* group 1 fails, group 0 (its backward goes on) is held back */
  check_tail_fault("gpu", FP32, ENGINE_FAULT_ZERO);
  check_tail_fault("nvme", FP32, ENGINE_FAULT_HOME);
  return test_finish("offload.step_atomic");
}
