/* tests/memory/mem_fixture.h — the memory manager's set-up shared by the
 * tests that run it on the host device: the device of a given capacity, a
 * manager config with budgets and chunk size and the test defaults
 * (unpinned, not NUMA-local host memory, 512-byte NVMe alignment), and the
 * registration of a group's tensor named "b<group><suffix>".
 */
#ifndef FERRY_TEST_MEM_FIXTURE_H
#define FERRY_TEST_MEM_FIXTURE_H

#include "memory/memory.h"

#include <stdio.h>

/* A host-kind device of `capacity` bytes into *dev; a status. */
static inline int mem_fixture_device(size_t capacity, ferry_device **dev) {
  ferry_device_config dc = ferry_device_config_default();
  dc.kind = FERRY_DEVICE_HOST;
  dc.capacity = capacity;
  return ferry_device_create(&dc, dev);
}

/* The default config on dev with these budgets (device, host, NVMe) and
 * chunk size, host memory unpinned and not NUMA-local, NVMe aligned to 512. */
static inline ferry_mem_config mem_fixture_config(ferry_device *dev, const size_t budget[3],
                                                  size_t chunk_size) {
  ferry_mem_config mc = ferry_mem_config_default();
  mc.dev = dev;
  for (int t = 0; t < 3; t++) mc.budget[t] = budget[t];
  mc.chunk_size = chunk_size;
  mc.host_pinned = 0;
  mc.numa_local = 0;
  mc.nvme_align = 512;
  return mc;
}

/* A one-dimensional tensor of n elements named "b<g><suffix>" in group g. */
static inline int mem_fixture_register(ferry_mem *m, uint32_t g, const char *suffix,
                                       ferry_dtype dt, int64_t n, ferry_role role, uint32_t *id) {
  char name[64];
  snprintf(name, sizeof name, "b%u%s", g, suffix);
  return ferry_mem_register(m, name, dt, 1, &n, g, role, id);
}

#endif
