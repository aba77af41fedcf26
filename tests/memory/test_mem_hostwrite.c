/* tests/memory/test_mem_hostwrite.c — a host-tier writer against device
 * prefetches of the same group from another thread (the engine's step
 * thread committing params while the caller prefetches them). The writer
 * holds the group in the host tier, marks it dirty, writes it slowly and
 * releases; the prefetcher loops on prefetch to the device (FERRY_EBUSY
 * while the writer holds it dirty on the host). A device copy
 * loaded from the host bytes while the writer was still writing them would
 * be stale but clean: the writer's next device fetch would see it. Run with
 * the params' home in the host tier and on the (fake) NVMe store.
 */
#include "memory/memory.h"
#include "tests/memory/fake_store.h"
#include "tests/memory/mem_fixture.h"
#include "tests/test.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#define CS 4096
#define NG 2

static ferry_mem *m;
static uint32_t ids[NG];
static atomic_int stop;
static int iters = 3000;

static void *prefetcher(void *arg) {
  (void)arg;
  unsigned long long busy = 0;
  while (!atomic_load(&stop)) {
    int rc = ferry_mem_prefetch(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE);
    if (rc == FERRY_EBUSY) busy++;
    sched_yield();
  }
  return (void *)(uintptr_t)busy;
}

/* A device fetch and release of group 1 from another thread: its status. */
static void *other_fetch(void *arg) {
  (void)arg;
  int rc = ferry_mem_evict(m, 1, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE);
  if (rc && rc != FERRY_EBUSY) return (void *)(intptr_t)rc;
  rc = ferry_mem_fetch(m, 1, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, NULL, 0);
  if (rc == 0) rc = ferry_mem_release(m, 1, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, NULL);
  return (void *)(intptr_t)rc;
}

static int run_home(int home) {
  ferry_device *dev;
  fake_store fs;
  REQUIRE(mem_fixture_device(2 * CS, &dev) == 0);
  ferry_mem_config mc = mem_fixture_config(dev, (size_t[3]){2 * CS, 8 * CS, 8 * CS}, CS);
  mc.home[FERRY_FAMILY_PARAMS] = home;
  REQUIRE(ferry_mem_create(&mc, &m) == 0);
  for (uint32_t g = 0; g < NG; g++)
    REQUIRE(mem_fixture_register(m, g, ".w", FERRY_DT_BF16, CS / 2, FERRY_ROLE_PARAM, &ids[g]) ==
            0);
  REQUIRE(ferry_mem_finalize(m) == 0);
  if (home == FERRY_TIER_NVME) REQUIRE(fake_store_attach(&fs, m, 20) == 0);

  /* Deterministic: while this thread holds group 1 dirty on the host,
   * another thread's device fetch is FERRY_EBUSY; this thread's own device
   * fetch (after its writes) loads the new bytes. */
  void *h, *d;
  REQUIRE(ferry_mem_fetch(m, 1, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL, 0) == 0);
  REQUIRE(ferry_mem_mark_dirty(m, 1, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL) == 0);
  REQUIRE(ferry_mem_tensor_ptr(m, ids[1], FERRY_TIER_HOST, &h) == 0);
  memset(h, 0x5a, CS);
  pthread_t th;
  REQUIRE(pthread_create(&th, NULL, other_fetch, NULL) == 0);
  void *orc;
  pthread_join(th, &orc);
  EXPECT_EQ_INT((int)(intptr_t)orc, FERRY_EBUSY);
  REQUIRE(ferry_mem_fetch(m, 1, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, NULL, 0) == 0);
  REQUIRE(ferry_mem_tensor_ptr(m, ids[1], FERRY_TIER_DEVICE, &d) == 0);
  EXPECT(memcmp(d, h, CS) == 0);
  REQUIRE(ferry_mem_release(m, 1, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, NULL) == 0);
  REQUIRE(ferry_mem_release(m, 1, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL) == 0);
  REQUIRE(pthread_create(&th, NULL, other_fetch, NULL) == 0);
  pthread_join(th, &orc);
  EXPECT_EQ_INT((int)(intptr_t)orc, 0); /* released: loads again */

  static unsigned char truth[CS];
  memset(truth, 0, sizeof truth); /* a slot never written reads as zeros */
  atomic_store(&stop, 0);
  REQUIRE(pthread_create(&th, NULL, prefetcher, NULL) == 0);
  int stale = 0, stale_host = 0, fails = 0, ebusy = 0;
  for (int i = 0; i < iters; i++) {
    void *p;
    int rc = ferry_mem_fetch(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL, 0);
    if (rc) {
      fprintf(stderr, "host fetch: %s\n", ferry_mem_last_error(m));
      fails++;
      break;
    }
    if (ferry_mem_tensor_ptr(m, ids[0], FERRY_TIER_HOST, &p)) fails++;
    else if (memcmp(p, truth, CS)) stale++, stale_host++;
    rc = ferry_mem_mark_dirty(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL);
    if (rc == 0) {
      /* A slow writer: the prefetcher gets to run in the middle. */
      unsigned char v = (unsigned char)(i + 1);
      for (int q = 0; q < 4; q++) {
        memset((char *)p + q * (CS / 4), v, CS / 4);
        sched_yield();
      }
      memset(truth, v, CS);
    } else if (rc == FERRY_EBUSY) {
      ebusy++; /* the prefetcher held the device copy: nothing written */
    } else {
      fprintf(stderr, "mark dirty: %s\n", ferry_mem_last_error(m));
      fails++;
    }
    if (ferry_mem_release(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL)) fails++;
    rc = ferry_mem_fetch(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, NULL, 0);
    if (rc) {
      fprintf(stderr, "device fetch: %s\n", ferry_mem_last_error(m));
      fails++;
      break;
    }
    if (ferry_mem_tensor_ptr(m, ids[0], FERRY_TIER_DEVICE, &p)) fails++;
    else if (memcmp(p, truth, CS)) stale++;
    if (ferry_mem_release(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, NULL)) fails++;
  }
  atomic_store(&stop, 1);
  void *busy;
  pthread_join(th, &busy);
  printf("hostwrite (%s home): %d iterations, %d stale (%d on the host), %d writer EBUSY, %llu prefetch EBUSY\n",
         ferry_tier_name(home), iters, stale, stale_host, ebusy, (unsigned long long)(uintptr_t)busy);
  EXPECT_EQ_INT(stale, 0);
  EXPECT_EQ_INT(fails, 0);
  ferry_mem_destroy(m);
  if (home == FERRY_TIER_NVME) fake_store_close(&fs);
  ferry_device_destroy(dev);
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 1) iters = atoi(argv[1]);
  run_home(FERRY_TIER_HOST);
  run_home(FERRY_TIER_NVME);
  return test_finish("test_mem_hostwrite");
}
