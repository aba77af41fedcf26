/* tests/offload/test_repeat.c — the same seed gives the same run, again and
 * again: 10 steps of the synthetic model (bench/synth_model.h) repeated 25
 * times per placement, host backend, updates during backward and after it;
 * losses and master weights must be bit-identical to the first run. Catches
 * races between the optimizer thread and the loop (a unit of groups whose
 * params share chunks committed while one of them was still to be updated
 * gave about one run in 15 different with params on NVMe).
 * argv[1]: a scratch folder (the NVMe store).
 */
#include "tests/offload/ckpt_util.h"

#define STEPS 10
#define RUNS 25

#define MAXP (24 * 32 * 32)

typedef struct {
  double loss[STEPS];
  float params[MAXP];
} result;

static void run_once(const char *placement, const char *sets, int groups, int dim, result *out) {
  ck_run r;
  REQUIRE(groups * dim * dim <= MAXP);
  ck_open_dims(&r, "64K", placement, FERRY_DT_BF16, sets, groups, dim);
  for (int s = 0; s < STEPS; s++) {
    int rc = ck_step(&r, (unsigned long long)s + 1, &out->loss[s]);
    if (rc) fprintf(stderr, "step %d: %s\n", s, ferry_engine_last_error(r.e));
    REQUIRE(rc == 0);
  }
  ck_read_params(&r, groups, dim, out->params);
  ck_close(&r);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s SCRATCH\n", argv[0]);
    return 1;
  }
  ck_set_scratch(argv[1]);
#define P_NVME "placement: { params = \"nvme\"; grads = \"host\"; optimizer = \"nvme\"; };"
#define P_ZERO3 "placement: { params = \"host\"; grads = \"host\"; optimizer = \"host\"; };"
  /* 24 groups of 16x16: 512 bytes of bf16 params each, 8 per 4K chunk had
   * the layout packed groups together (it no longer does) */
  static const struct {
    const char *name, *placement, *sets;
    int groups, dim;
  } cases[] = {
      {"nvme, updates during backward", P_NVME, "tiers.host.budget=96K", CK_G, CK_D},
      {"nvme, step after backward", P_NVME, "tiers.host.budget=96K,step_during_backward=false",
       CK_G, CK_D},
      {"zero3 (host), updates during backward", P_ZERO3, NULL, CK_G, CK_D},
      {"zero3, 24 small groups, no clipping", P_ZERO3, "clip_grad_norm=0", 24, 16},
      {"nvme, 24 small groups, no clipping", P_NVME, "tiers.host.budget=192K,clip_grad_norm=0", 24,
       16},
  };
  static result first, again;
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    memset(&first, 0, sizeof first);
    run_once(cases[c].placement, cases[c].sets, cases[c].groups, cases[c].dim, &first);
    int differ = 0, at = -1;
    for (int k = 1; k < RUNS; k++) {
      memset(&again, 0, sizeof again);
      run_once(cases[c].placement, cases[c].sets, cases[c].groups, cases[c].dim, &again);
      if (memcmp(&again, &first, sizeof first)) {
        if (!differ)
          for (int s = 0; s < STEPS && at < 0; s++)
            if (again.loss[s] != first.loss[s]) at = s;
        differ++;
      }
    }
    printf("%-40s loss %.6f -> %.6f; %d of %d repeats differ", cases[c].name, first.loss[0],
           first.loss[STEPS - 1], differ, RUNS - 1);
    if (at >= 0) printf(" (first at step %d)", at);
    printf("\n");
    EXPECT(first.loss[STEPS - 1] < first.loss[0]);
    EXPECT(differ == 0);
  }
  return test_finish("test_repeat");
}
