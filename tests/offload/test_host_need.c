/* tests/offload/test_host_need.c — one check sees the whole host need
 * (issue 25, item 15): with the optimizer state on NVMe, a host budget too
 * small for the families that live there, one too small only for a step's
 * working set, and one below the engine's own staging are all refused by
 * the same check, naming the same least budget; that budget finalizes and
 * trains. (The layout's own check, which sees only the homes, used to
 * refuse first with a smaller figure that then failed further on.)
 * argv[1]: a scratch folder.
 */
#include "tests/offload/ckpt_util.h"

#define P_NVME "placement: { params = \"host\"; grads = \"host\"; optimizer = \"nvme\"; };"
#define G      8
#define D      256

/* Finalizes with tiers.host.budget = budget; FERRY_OK, or the status and
 * the least budget (MiB) the message names (*least). */
static int try_budget(const char *budget, double *least, char *msg, size_t cap) {
  char sets[128];
  snprintf(sets, sizeof sets, "tiers.host.budget=%s", budget);
  ck_run r;
  int rc = ck_open_full(&r, "16M", P_NVME, FERRY_DT_BF16, sets, G, D, NULL, 1);
  snprintf(msg, cap, "%s", r.e ? ferry_engine_last_error(r.e) : ferry_last_error());
  *least = 0;
  const char *at = strstr(msg, "set tiers.host.budget to at least ");
  if (at) *least = strtod(at + strlen("set tiers.host.budget to at least "), NULL);
  if (rc == 0) {
    double loss;
    rc = ck_step(&r, 1, &loss);
    if (rc) snprintf(msg, cap, "step: %s", ferry_engine_last_error(r.e));
  }
  ck_close(&r);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s SCRATCH\n", argv[0]);
    return 1;
  }
  ck_set_scratch(argv[1]);
  char msg[4096], b[64];
  double least = 0, l2 = 0;

  /* far too small: the homes (params, grads: 3 MiB) do not fit */
  int rc = try_budget("2M", &least, msg, sizeof msg);
  printf("2M: %s\n", msg);
  EXPECT_EQ_INT(rc, FERRY_ENOMEM);
  EXPECT(strstr(msg, "tiers.host.budget of 2.0 MiB is too small") != NULL);
  EXPECT(strstr(msg, "host homes") != NULL && strstr(msg, "optimizer state") != NULL);
  EXPECT(least > 3.0);

  /* below the engine's staging alone: the same check, the same figure */
  rc = try_budget("64K", &l2, msg, sizeof msg);
  printf("64K: %s\n", msg);
  EXPECT_EQ_INT(rc, FERRY_ENOMEM);
  EXPECT(l2 == least);

  /* the homes fit, the step's working set does not: the same figure */
  snprintf(b, sizeof b, "%lluK", (unsigned long long)(least * 1024) - 300);
  rc = try_budget(b, &l2, msg, sizeof msg);
  printf("%s: %s\n", b, msg);
  EXPECT_EQ_INT(rc, FERRY_ENOMEM);
  EXPECT(l2 == least);

  /* the figure named is enough */
  snprintf(b, sizeof b, "%lluK", (unsigned long long)(least * 1024) + 1);
  rc = try_budget(b, &l2, msg, sizeof msg);
  if (rc) printf("%s: %s\n", b, msg);
  EXPECT_EQ_INT(rc, FERRY_OK);
  return test_finish("offload.host_need");
}
