/* tests/memory/test_mem_cap.c — the host cap on one family
 * (ferry_mem_cap): params and optimizer state on the (fake) NVMe store, one
 * chunk per group and family, the host pool eight chunks, the params capped
 * at three. Within the cap, an optimizer fetch into a full pool evicts an
 * optimizer copy, never a param (by LRU the oldest copy, a param, would
 * go); a params fetch at the cap evicts a param even with free room, so
 * the params never hold more than the cap.
 */
#include "memory/memory.h"
#include "tests/memory/fake_store.h"
#include "tests/memory/mem_fixture.h"
#include "tests/test.h"

#include <stdio.h>

#define CS 4096
#define NG 6

static int host_copy(ferry_mem *m, uint32_t g, int family) {
  uint32_t first = 0, count = 0;
  ferry_mem_chunk_info ci;
  if (ferry_mem_group_chunks(m, g, family, &first, &count) || count != 1 ||
      ferry_mem_chunk_get(m, first, &ci))
    return -1;
  return ci.state[FERRY_TIER_HOST] != FERRY_RES_ABSENT;
}

static size_t host_bytes(ferry_mem *m, int family) {
  ferry_stats st;
  return ferry_mem_get_stats(m, &st) ? 0 : st.current[FERRY_TIER_HOST][family];
}

static int touch(ferry_mem *m, uint32_t g, int family) {
  int rc = ferry_mem_fetch(m, g, family, FERRY_TIER_HOST, NULL, 0);
  return rc ? rc : ferry_mem_release(m, g, family, FERRY_TIER_HOST, NULL);
}

int main(void) {
  ferry_device *dev;
  ferry_mem *m;
  fake_store fs;
  REQUIRE(mem_fixture_device(2 * CS, &dev) == 0);
  ferry_mem_config mc = mem_fixture_config(dev, (size_t[3]){2 * CS, 8 * CS, 4 * NG * CS}, CS);
  mc.home[FERRY_FAMILY_PARAMS] = FERRY_TIER_NVME;
  mc.home[FERRY_FAMILY_OPTIM] = FERRY_TIER_NVME;
  mc.policy = FERRY_EVICT_LRU;
  REQUIRE(ferry_mem_create(&mc, &m) == 0);
  for (uint32_t g = 0; g < NG; g++) {
    uint32_t id;
    REQUIRE(mem_fixture_register(m, g, ".w", FERRY_DT_BF16, CS / 2, FERRY_ROLE_PARAM, &id) == 0);
    REQUIRE(mem_fixture_register(m, g, ".m", FERRY_DT_F32, CS / 4, FERRY_ROLE_EXP_AVG, &id) == 0);
  }
  REQUIRE(ferry_mem_finalize(m) == 0);
  REQUIRE(fake_store_attach(&fs, m, 20) == 0);
  REQUIRE(ferry_mem_cap(m, FERRY_FAMILY_PARAMS, 3 * CS) == 0);
  EXPECT(ferry_mem_cap(m, FERRY_FAMILIES, CS) == FERRY_EINVAL);

  /* three params (the oldest copies), five optimizer groups: the pool is full */
  for (uint32_t g = 0; g < 3; g++) REQUIRE(touch(m, g, FERRY_FAMILY_PARAMS) == 0);
  for (uint32_t g = 0; g < 5; g++) REQUIRE(touch(m, g, FERRY_FAMILY_OPTIM) == 0);
  EXPECT_EQ_INT((int)host_bytes(m, FERRY_FAMILY_PARAMS), 3 * CS);
  /* within the cap: an optimizer copy goes, every param stays */
  REQUIRE(touch(m, 5, FERRY_FAMILY_OPTIM) == 0);
  for (uint32_t g = 0; g < 3; g++) EXPECT_EQ_INT(host_copy(m, g, FERRY_FAMILY_PARAMS), 1);
  EXPECT_EQ_INT(host_copy(m, 0, FERRY_FAMILY_OPTIM), 0);

  /* free room, but the params at their cap: a param goes (the oldest) */
  for (uint32_t g = 1; g < NG; g++) REQUIRE(ferry_mem_evict(m, g, FERRY_FAMILY_OPTIM, FERRY_TIER_HOST) == 0);
  REQUIRE(touch(m, 3, FERRY_FAMILY_PARAMS) == 0);
  EXPECT_EQ_INT((int)host_bytes(m, FERRY_FAMILY_PARAMS), 3 * CS);
  EXPECT_EQ_INT(host_copy(m, 0, FERRY_FAMILY_PARAMS), 0);
  EXPECT_EQ_INT(host_copy(m, 3, FERRY_FAMILY_PARAMS), 1);

  /* no cap: the params take the free room */
  REQUIRE(ferry_mem_cap(m, FERRY_FAMILY_PARAMS, 0) == 0);
  REQUIRE(touch(m, 4, FERRY_FAMILY_PARAMS) == 0);
  EXPECT_EQ_INT((int)host_bytes(m, FERRY_FAMILY_PARAMS), 4 * CS);
  printf("cap: params held within the cap, optimizer copies evicted first\n");
  ferry_mem_destroy(m);
  fake_store_close(&fs);
  ferry_device_destroy(dev);
  return test_finish("test_mem_cap");
}
