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
  ferry_device_config dc = ferry_device_config_default();
  dc.kind = FERRY_DEVICE_HOST;
  dc.capacity = 2 * CS;
  REQUIRE(ferry_device_create(&dc, &dev) == 0);
  ferry_mem_config mc = ferry_mem_config_default();
  mc.dev = dev;
  mc.budget[FERRY_TIER_DEVICE] = 2 * CS;
  mc.budget[FERRY_TIER_HOST] = 8 * CS;
  mc.budget[FERRY_TIER_NVME] = 4 * NG * CS;
  mc.chunk_size = CS;
  mc.home[FERRY_FAMILY_PARAMS] = FERRY_TIER_NVME;
  mc.home[FERRY_FAMILY_OPTIM] = FERRY_TIER_NVME;
  mc.policy = FERRY_EVICT_LRU;
  mc.host_pinned = 0;
  mc.numa_local = 0;
  mc.nvme_align = 512;
  REQUIRE(ferry_mem_create(&mc, &m) == 0);
  for (uint32_t g = 0; g < NG; g++) {
    char name[32];
    int64_t np = CS / 2, no = CS / 4;
    uint32_t id;
    snprintf(name, sizeof name, "b%u.w", g);
    REQUIRE(ferry_mem_register(m, name, FERRY_DT_BF16, 1, &np, g, FERRY_ROLE_PARAM, &id) == 0);
    snprintf(name, sizeof name, "b%u.m", g);
    REQUIRE(ferry_mem_register(m, name, FERRY_DT_F32, 1, &no, g, FERRY_ROLE_EXP_AVG, &id) == 0);
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
