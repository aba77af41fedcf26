/* tests/memory/test_mem_evict_clean.c — ferry_mem_evict_clean: a dirty
 * host copy of an NVMe-home group, its write-back started, is marked to go
 * once clean and the call returns without waiting for the write. The copy
 * stays (its bytes are what is being written) until the write lands, then
 * goes, and reads back the same bytes. A write that fails leaves the copy
 * dirty on the host, not dropped, and the eviction that writes it again
 * reports the error; a held copy is left as it is.
 */
#include "memory/memory.h"
#include "tests/memory/fake_store.h"
#include "tests/test.h"

#include <stdio.h>
#include <string.h>

#define CS 4096

static ferry_mem *m;
static uint32_t id;

static int host_state(void) {
  uint32_t first = 0, count = 0;
  ferry_mem_group_chunks(m, 0, FERRY_FAMILY_PARAMS, &first, &count);
  REQUIRE(count == 1);
  ferry_mem_chunk_info ci;
  REQUIRE(ferry_mem_chunk_get(m, first, &ci) == 0);
  return ci.state[FERRY_TIER_HOST];
}

/* Fetches group 0 to the host, fills it with v and marks it dirty. */
static void write_host(unsigned char v) {
  void *h;
  REQUIRE(ferry_mem_fetch(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL, 0) == 0);
  REQUIRE(ferry_mem_mark_dirty(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL) == 0);
  REQUIRE(ferry_mem_tensor_ptr(m, id, FERRY_TIER_HOST, &h) == 0);
  memset(h, v, CS);
  REQUIRE(ferry_mem_release(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL) == 0);
}

/* Lets held writes go and waits until the host copy is in state `want`. */
static int wait_host_state(fake_store *fs, int want) {
  pthread_mutex_lock(&fs->mu);
  fs->hold_writes = 0;
  pthread_cond_broadcast(&fs->cv);
  pthread_mutex_unlock(&fs->mu);
  double deadline = ferry_now() + 10;
  uint64_t seen = ferry_mem_changes(m);
  while (host_state() != want && ferry_now() < deadline)
    (void)ferry_mem_wait_change(m, &seen, ferry_now() + 0.05);
  return host_state() == want;
}

int main(void) {
  ferry_device *dev;
  ferry_device_config dc = ferry_device_config_default();
  dc.kind = FERRY_DEVICE_HOST;
  dc.capacity = 2 * CS;
  REQUIRE(ferry_device_create(&dc, &dev) == 0);
  ferry_mem_config mc = ferry_mem_config_default();
  mc.dev = dev;
  mc.budget[FERRY_TIER_DEVICE] = 2 * CS;
  mc.budget[FERRY_TIER_HOST] = 4 * CS;
  mc.budget[FERRY_TIER_NVME] = 4 * CS;
  mc.chunk_size = CS;
  mc.home[FERRY_FAMILY_PARAMS] = FERRY_TIER_NVME;
  mc.host_pinned = 0;
  mc.numa_local = 0;
  mc.nvme_align = 512;
  REQUIRE(ferry_mem_create(&mc, &m) == 0);
  int64_t n = CS / 4;
  REQUIRE(ferry_mem_register(m, "w", FERRY_DT_F32, 1, &n, 0, FERRY_ROLE_PARAM, &id) == 0);
  REQUIRE(ferry_mem_finalize(m) == 0);
  fake_store fs;
  REQUIRE(fake_store_attach(&fs, m, 0) == 0);

  /* the drop comes after the write, and the call does not wait for it */
  write_host(0x5a);
  pthread_mutex_lock(&fs.mu);
  fs.hold_writes = 1;
  pthread_mutex_unlock(&fs.mu);
  REQUIRE(ferry_mem_writeback(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST) == 0);
  EXPECT_EQ_INT(ferry_mem_evict_clean(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST), 0);
  EXPECT_EQ_INT(host_state(), FERRY_RES_WRITING); /* returned with the write held */
  ferry_mem_poll(m);
  EXPECT_EQ_INT(host_state(), FERRY_RES_WRITING);
  EXPECT(fs.writes == 0);
  EXPECT(wait_host_state(&fs, FERRY_RES_ABSENT));
  EXPECT(fs.writes == 1);
  ferry_stats st;
  REQUIRE(ferry_mem_get_stats(m, &st) == 0);
  EXPECT(st.nvme_write_bytes[FERRY_FAMILY_PARAMS] == CS);
  EXPECT(st.evictions[FERRY_TIER_HOST] == 1);
  void *h;
  REQUIRE(ferry_mem_fetch(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL, 0) == 0);
  REQUIRE(ferry_mem_tensor_ptr(m, id, FERRY_TIER_HOST, &h) == 0);
  EXPECT(((unsigned char *)h)[0] == 0x5a && ((unsigned char *)h)[CS - 1] == 0x5a);
  REQUIRE(ferry_mem_release(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL) == 0);

  /* a clean copy goes at once; a held one stays */
  EXPECT_EQ_INT(host_state(), FERRY_RES_RESIDENT);
  REQUIRE(ferry_mem_fetch(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL, 0) == 0);
  EXPECT_EQ_INT(ferry_mem_evict_clean(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST), 0);
  EXPECT_EQ_INT(host_state(), FERRY_RES_RESIDENT);
  REQUIRE(ferry_mem_release(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL) == 0);
  EXPECT_EQ_INT(ferry_mem_evict_clean(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST), 0);
  EXPECT_EQ_INT(host_state(), FERRY_RES_ABSENT);

  /* a failed write: the copy stays dirty on the host, and the eviction
   * that writes it again says why */
  write_host(0x33);
  pthread_mutex_lock(&fs.mu);
  fs.hold_writes = 1;
  fs.fail_writes = 1;
  pthread_mutex_unlock(&fs.mu);
  REQUIRE(ferry_mem_writeback(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST) == 0);
  EXPECT_EQ_INT(ferry_mem_evict_clean(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST), 0);
  EXPECT(wait_host_state(&fs, FERRY_RES_DIRTY));
  int rc = ferry_mem_evict(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST);
  printf("evict after the failed write: %s: %s\n", ferry_strerror(rc), ferry_mem_last_error(m));
  EXPECT_EQ_INT(rc, FERRY_EIO);
  EXPECT(strstr(ferry_mem_last_error(m), "NVMe write of chunk") != NULL);
  EXPECT_EQ_INT(host_state(), FERRY_RES_DIRTY); /* kept: its bytes are the only copy */
  REQUIRE(ferry_mem_tensor_ptr(m, id, FERRY_TIER_HOST, &h) == 0);
  EXPECT(((unsigned char *)h)[0] == 0x33);
  /* written again (the store works now), then dropped */
  EXPECT_EQ_INT(ferry_mem_evict(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST), 0);
  EXPECT_EQ_INT(host_state(), FERRY_RES_ABSENT);
  REQUIRE(ferry_mem_fetch(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL, 0) == 0);
  REQUIRE(ferry_mem_tensor_ptr(m, id, FERRY_TIER_HOST, &h) == 0);
  EXPECT(((unsigned char *)h)[0] == 0x33);
  REQUIRE(ferry_mem_release(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL) == 0);

  /* arguments */
  EXPECT_EQ_INT(ferry_mem_evict_clean(NULL, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST),
                FERRY_EINVAL);
  EXPECT_EQ_INT(ferry_mem_evict_clean(m, 7, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST), FERRY_ENOENT);

  ferry_mem_destroy(m);
  fake_store_close(&fs);
  ferry_device_destroy(dev);
  return test_finish("memory.mem.evict_clean");
}
