/* tests/cli/make_checkpoint.c — writes a tiny checkpoint for the
 * `ferry checkpoint` tests (tests/cli/hostile_test.sh): the synthetic model
 * of tests/offload/ckpt_util.h (8 layers of 32x32, bf16 params, AdamW
 * states on the host), two steps, saved into DIR (argv[1]) as
 * DIR/step-000000000002 with a 4-byte blob.
 */
#include "tests/offload/ckpt_util.h"

#define P_HOST "placement: { params = \"gpu\"; grads = \"host\"; optimizer = \"host\"; };"

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: make_checkpoint DIR\n");
    return 2;
  }
  char scratch[1000];
  snprintf(scratch, sizeof scratch, "%.900s.scratch", argv[1]);
  ck_set_scratch(scratch);
  ck_run r;
  ck_open(&r, "16M", P_HOST, FERRY_DT_BF16, NULL);
  double loss;
  REQUIRE(ck_step(&r, 1, &loss) == 0);
  REQUIRE(ck_step(&r, 2, &loss) == 0);
  int rc = ferry_checkpoint_save(r.e, argv[1], "blob", 4, NULL);
  if (rc) fprintf(stderr, "save: %s\n", ferry_engine_last_error(r.e));
  REQUIRE(rc == 0);
  ck_close(&r);
  ck_rm(scratch);
  return test_finish("make_checkpoint");
}
