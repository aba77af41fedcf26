/* tests/memory/test_mem_compact.c — the host pool's compaction: params on
 * NVMe, six small groups held on the device (their host copies below them)
 * with three released and evicted between them, so the host pool has
 * room for the large group in bytes but only in holes of one small chunk,
 * and nothing to evict. The large group's fetch must gather the holes by
 * moving the host copies that only device holds pin, and every moved copy
 * must keep its bytes (checked after the device copies are dropped).
 * Under each fit policy: where the copies land may not matter.
 */
#include "memory/memory.h"
#include "tests/memory/fake_store.h"
#include "tests/test.h"

#include <stdio.h>
#include <string.h>

#define SMALL 6
#define S 4096 /* bytes of a small group's chunk */

static void fill(void *p, size_t n, int g) {
  for (size_t i = 0; i < n; i++) ((unsigned char *)p)[i] = (unsigned char)(g * 37 + i * 11);
}

static int same(const void *p, size_t n, int g) {
  for (size_t i = 0; i < n; i++)
    if (((const unsigned char *)p)[i] != (unsigned char)(g * 37 + i * 11)) return 0;
  return 1;
}

static void run(ferry_fit_policy fit) {
  ferry_device_config dc = ferry_device_config_default();
  dc.kind = FERRY_DEVICE_HOST;
  dc.capacity = 1 << 20;
  ferry_device *dev;
  REQUIRE(ferry_device_create(&dc, &dev) == 0);
  ferry_mem_config mc = ferry_mem_config_default();
  mc.dev = dev;
  mc.budget[FERRY_TIER_DEVICE] = 16 * S;
  mc.budget[FERRY_TIER_HOST] = SMALL * S; /* full with the six small copies */
  mc.budget[FERRY_TIER_NVME] = 1 << 20;
  mc.chunk_size = S;
  mc.home[FERRY_FAMILY_PARAMS] = FERRY_TIER_NVME;
  mc.nvme_align = 512;
  mc.host_pinned = 0;
  mc.numa_local = 0;
  mc.fit = fit;
  mc.fit_seed = 7;
  ferry_mem *m;
  REQUIRE(ferry_mem_create(&mc, &m) == 0);
  uint32_t ids[SMALL + 1];
  int64_t big = 2 * S / 2, small = S / 2; /* bf16 elements */
  REQUIRE(ferry_mem_register(m, "big", FERRY_DT_BF16, 1, &big, 0, FERRY_ROLE_PARAM, &ids[0]) == 0);
  for (int g = 1; g <= SMALL; g++) {
    char name[16];
    snprintf(name, sizeof name, "small%d", g);
    REQUIRE(ferry_mem_register(m, name, FERRY_DT_BF16, 1, &small, (uint32_t)g, FERRY_ROLE_PARAM,
                               &ids[g]) == 0);
  }
  int rc = ferry_mem_finalize(m);
  if (rc) fprintf(stderr, "finalize: %s\n", ferry_mem_last_error(m));
  REQUIRE(rc == 0);
  fake_store fs;
  REQUIRE(fake_store_attach(&fs, m, 20) == 0);

  /* each small group written in the host tier, then held on the device */
  for (int g = 1; g <= SMALL; g++) {
    REQUIRE(ferry_mem_fetch(m, (uint32_t)g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL, 0) == 0);
    void *p;
    REQUIRE(ferry_mem_mark_dirty(m, (uint32_t)g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL) == 0);
    REQUIRE(ferry_mem_tensor_ptr(m, ids[g], FERRY_TIER_HOST, &p) == 0);
    fill(p, S, g);
    REQUIRE(ferry_mem_release(m, (uint32_t)g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL) == 0);
  }
  for (int g = 1; g <= SMALL; g++)
    REQUIRE(ferry_mem_fetch(m, (uint32_t)g, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, NULL, 0) == 0);
  REQUIRE(ferry_mem_poll(m) == 0);
  /* every other one let go and evicted: holes of one small chunk between */
  for (int g = 2; g <= SMALL; g += 2) {
    REQUIRE(ferry_mem_release(m, (uint32_t)g, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, NULL) == 0);
    REQUIRE(ferry_mem_evict(m, (uint32_t)g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST) == 0);
  }
  uint64_t before = ferry_mem_compactions(m);
  rc = ferry_mem_fetch(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, NULL, 0);
  if (rc) fprintf(stderr, "fit %d: fetch of the large group: %s\n", (int)fit, ferry_mem_last_error(m));
  EXPECT(rc == 0);
  /* first fit packs the copies from the start: the holes are between */
  EXPECT(fit == FERRY_FIT_RANDOM || ferry_mem_compactions(m) == before + 1);
  if (!rc) REQUIRE(ferry_mem_release(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, NULL) == 0);
  REQUIRE(ferry_mem_poll(m) == 0);

  /* the moved copies kept their bytes: device copies dropped, host read */
  for (int g = 1; g <= SMALL; g += 2) {
    REQUIRE(ferry_mem_release(m, (uint32_t)g, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, NULL) == 0);
    REQUIRE(ferry_mem_evict(m, (uint32_t)g, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE) == 0);
    REQUIRE(ferry_mem_fetch(m, (uint32_t)g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL, 0) == 0);
    void *p;
    REQUIRE(ferry_mem_tensor_ptr(m, ids[g], FERRY_TIER_HOST, &p) == 0);
    EXPECT(same(p, S, g));
    REQUIRE(ferry_mem_release(m, (uint32_t)g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL) == 0);
  }
  for (int g = 2; g <= SMALL; g += 2) { /* and the evicted ones, back from NVMe */
    REQUIRE(ferry_mem_fetch(m, (uint32_t)g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL, 0) == 0);
    void *p;
    REQUIRE(ferry_mem_tensor_ptr(m, ids[g], FERRY_TIER_HOST, &p) == 0);
    EXPECT(same(p, S, g));
    REQUIRE(ferry_mem_release(m, (uint32_t)g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL) == 0);
  }
  printf("fit %d: %llu compaction(s)\n", (int)fit, (unsigned long long)ferry_mem_compactions(m));
  ferry_mem_destroy(m);
  fake_store_close(&fs);
  ferry_device_destroy(dev);
}

int main(void) {
  run(FERRY_FIT_FIRST);
  run(FERRY_FIT_LAST);
  run(FERRY_FIT_RANDOM);
  return test_finish("test_mem_compact");
}
