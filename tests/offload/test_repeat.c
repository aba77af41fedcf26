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

typedef struct {
  double loss[STEPS];
  float params[CK_G * CK_D * CK_D];
} result;

static void run_once(const char *placement, const char *sets, result *out) {
  ck_run r;
  ck_open(&r, "64K", placement, FERRY_OPTIM_DT_BF16, sets);
  for (int s = 0; s < STEPS; s++) {
    int rc = ck_step(&r, (unsigned long long)s + 1, &out->loss[s]);
    if (rc) fprintf(stderr, "step %d: %s\n", s, ferry_engine_last_error(r.e));
    REQUIRE(rc == 0);
  }
  for (int g = 0; g < CK_G; g++) {
    char name[32];
    snprintf(name, sizeof name, "layer%d.w", g);
    REQUIRE(ferry_param_read(r.e, name, out->params + (size_t)g * CK_D * CK_D, CK_D * CK_D) == 0);
  }
  ck_close(&r);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s SCRATCH\n", argv[0]);
    return 1;
  }
  ck_set_scratch(argv[1]);
  static const struct {
    const char *name, *placement, *sets;
  } cases[] = {
      {"nvme, updates during backward",
       "placement: { params = \"nvme\"; grads = \"host\"; optimizer = \"nvme\"; };",
       "tiers.host.budget=96K"},
      {"nvme, step after backward",
       "placement: { params = \"nvme\"; grads = \"host\"; optimizer = \"nvme\"; };",
       "tiers.host.budget=96K,step_during_backward=false"},
      {"zero3 (host), updates during backward",
       "placement: { params = \"host\"; grads = \"host\"; optimizer = \"host\"; };", NULL},
  };
  static result first, again;
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    run_once(cases[c].placement, cases[c].sets, &first);
    int differ = 0, at = -1;
    for (int k = 1; k < RUNS; k++) {
      memset(&again, 0, sizeof again);
      run_once(cases[c].placement, cases[c].sets, &again);
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
