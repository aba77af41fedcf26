/* tests/memory/test_mem_threads.c — the memory manager under concurrency:
 * four threads fetch, write, release and prefetch their own groups through
 * shared tiny budgets (device, host, and an asynchronous fake NVMe store),
 * one of them flushing now and then. Every fetch checks contents; budgets
 * must hold at the end; run under TSan in CI.
 */
#include "memory/memory.h"
#include "tests/memory/fake_store.h"
#include "tests/memory/mem_fixture.h"
#include "tests/test.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define NTHREADS 4
#define PER 6
#define NG (NTHREADS * PER)
#define CS 4096

static ferry_mem *m;
static ferry_device *dev;
static fake_store fs;
static uint32_t ids[NG][3];
static size_t budget[3];
static int iters = 1500;

typedef struct {
  int t;
  unsigned char truth[PER][3][CS];
  int enomem, ebusy, fails;
} worker;

static int check(worker *w, int k, int fam, int tier) {
  void *p;
  if (ferry_mem_tensor_ptr(m, ids[w->t * PER + k][fam], tier, &p)) return 1;
  return memcmp(p, w->truth[k][fam], CS) != 0;
}

static void *run(void *arg) {
  worker *w = arg;
  unsigned long long rs = 977 + (unsigned long long)w->t * 31;
  for (int i = 0; i < iters; i++) {
    int k = (int)(test_rand(&rs) % PER);
    uint32_t g = (uint32_t)(w->t * PER + k);
    unsigned r = (unsigned)(test_rand(&rs) % 10);
    int fam = r < 4 ? FERRY_FAMILY_PARAMS : r < 7 ? FERRY_FAMILY_OPTIM : FERRY_FAMILY_GRADS;
    int tier = fam == FERRY_FAMILY_OPTIM || r == 3 ? FERRY_TIER_HOST : FERRY_TIER_DEVICE;
    if (r == 9) {
      (void)ferry_mem_prefetch(m, (uint32_t)(test_rand(&rs) % NG), FERRY_FAMILY_PARAMS,
                               FERRY_TIER_DEVICE);
      if (w->t == 0 && i % 50 == 0 && ferry_mem_flush(m)) w->fails++;
      continue;
    }
    int rc = ferry_mem_fetch(m, g, fam, tier, NULL, 0);
    if (rc == FERRY_ENOMEM) {
      w->enomem++;
      continue;
    }
    if (rc) {
      fprintf(stderr, "thread %d fetch: %s\n", w->t, ferry_mem_last_error(m));
      w->fails++;
      continue;
    }
    if (check(w, k, fam, tier)) {
      fprintf(stderr, "thread %d: group %u %s in the %s tier: contents differ\n", w->t, g,
              ferry_family_name(fam), ferry_tier_name(tier));
      w->fails++;
    }
    if (test_rand(&rs) % 3) {
      unsigned char v = (unsigned char)test_rand(&rs);
      void *p;
      if (ferry_mem_tensor_ptr(m, ids[g][fam], tier, &p)) w->fails++;
      /* Declare the write first: on FERRY_EBUSY nothing may be written. */
      rc = ferry_mem_mark_dirty(m, g, fam, tier, NULL);
      if (rc == 0) {
        memset(p, v, CS);
        memset(w->truth[k][fam], v, CS);
      } else if (rc == FERRY_EBUSY) {
        w->ebusy++;
      } else {
        w->fails++;
      }
    }
    if (ferry_mem_release(m, g, fam, tier, NULL)) w->fails++;
  }
  return NULL;
}

int main(int argc, char **argv) {
  if (argc > 1) iters = atoi(argv[1]);
  budget[0] = 8 * CS;
  budget[1] = 2 * NG * CS + 8 * CS; /* params and grads live here; optimizer cache */
  budget[2] = (size_t)NG * 3 * CS;
  REQUIRE(mem_fixture_device(budget[0], &dev) == 0);
  ferry_mem_config mc = mem_fixture_config(dev, budget, CS);
  mc.home[FERRY_FAMILY_OPTIM] = FERRY_TIER_NVME;
  REQUIRE(ferry_mem_create(&mc, &m) == 0);
  for (uint32_t g = 0; g < NG; g++) {
    uint32_t *id = ids[g];
    REQUIRE(mem_fixture_register(m, g, ".w", FERRY_DT_BF16, CS / 2, FERRY_ROLE_PARAM, &id[0]) == 0);
    REQUIRE(mem_fixture_register(m, g, ".w.grad", FERRY_DT_BF16, CS / 2, FERRY_ROLE_GRAD, &id[1]) ==
            0);
    REQUIRE(mem_fixture_register(m, g, ".w.master", FERRY_DT_F32, CS / 4, FERRY_ROLE_MASTER,
                                 &id[2]) == 0);
  }
  int rc = ferry_mem_finalize(m);
  if (rc) fprintf(stderr, "%s\n", ferry_mem_last_error(m));
  REQUIRE(rc == 0);
  REQUIRE(fake_store_attach(&fs, m, 30) == 0);
  static worker w[NTHREADS];
  pthread_t th[NTHREADS];
  for (int t = 0; t < NTHREADS; t++) {
    memset(&w[t], 0, sizeof w[t]);
    w[t].t = t;
    REQUIRE(pthread_create(&th[t], NULL, run, &w[t]) == 0);
  }
  int fails = 0, enomem = 0, ebusy = 0;
  for (int t = 0; t < NTHREADS; t++) {
    pthread_join(th[t], NULL);
    fails += w[t].fails;
    enomem += w[t].enomem;
    ebusy += w[t].ebusy;
  }
  EXPECT_EQ_INT(fails, 0);
  REQUIRE(ferry_mem_flush(m) == 0);
  for (int t = 0; t < NTHREADS; t++)
    for (int k = 0; k < PER; k++)
      for (int f = 0; f < 3; f++) {
        uint32_t g = (uint32_t)(t * PER + k);
        REQUIRE(ferry_mem_fetch(m, g, f, FERRY_TIER_HOST, NULL, 0) == 0);
        EXPECT(check(&w[t], k, f, FERRY_TIER_HOST) == 0);
        REQUIRE(ferry_mem_release(m, g, f, FERRY_TIER_HOST, NULL) == 0);
      }
  ferry_stats st;
  REQUIRE(ferry_mem_get_stats(m, &st) == 0);
  for (int t = 0; t < 3; t++) EXPECT(st.tier_peak[t] <= budget[t]);
  printf("threads: %llu fetches, %d ENOMEM, %d EBUSY, evictions %llu/%llu, stalls %llu (%.3f s)\n",
         (unsigned long long)st.fetches, enomem, ebusy, (unsigned long long)st.evictions[0],
         (unsigned long long)st.evictions[1], (unsigned long long)st.stalls, st.stall_seconds);
  ferry_mem_destroy(m);
  fake_store_close(&fs);
  ferry_device_destroy(dev);
  return test_finish("test_mem_threads");
}
