/* tests/offload/test_fetch_wait.c — the engine's threads wait for room on
 * the memory manager's condition, not by polling (group_fetch): a device
 * fetch blocked because another holder fills the budget wakes when that
 * group is released; one whose room never comes gives up after
 * GROUP_FETCH_WAIT with the manager's FERRY_ENOMEM ("tier full"), as the
 * poll it replaced did; ferry_mem_wait_change itself wakes on a release and
 * times out at its deadline. Host backend: two groups, a device pool that
 * holds one group's params.
 */
#include "offload/engine_impl.h"
#include "tests/offload/engine_util.h"
#include "tests/test.h"

#include <pthread.h>
#include <string.h>
#include <time.h>

#define N 16384 /* elements per group: 32 KiB bf16 chunks */

static float zeros[N];

/* Two groups of one param each; the device budget is the engine's two grad
 * buffers (64 KiB) and room for one group's params. */
static ferry_engine *two_groups(void) {
  ferry_engine *e = eu_engine("device = \"host\";\n"
                              "chunk_size = \"64K\";\n"
                              "precision: { params = \"bf16\"; };\n"
                              "tiers: { gpu: { budget = \"112K\"; };\n"
                              "         host: { budget = \"16M\"; pinned = false; }; };\n"
                              "optimizer: { type = \"sgd\"; lr = 0.01; threads = 1; };\n"
                              "placement: { params = \"host\"; grads = \"host\"; "
                              "optimizer = \"host\"; };\n",
                              NULL);
  int64_t shape[1] = {N};
  REQUIRE(ferry_param_register(e, "a", shape, 1, 0, zeros, NULL, NULL) == 0);
  REQUIRE(ferry_param_register(e, "b", shape, 1, 1, zeros, NULL, NULL) == 0);
  int rc = ferry_engine_finalize(e);
  if (rc) fprintf(stderr, "finalize: %s\n", ferry_engine_last_error(e));
  REQUIRE(rc == 0);
  ferry_stats st;
  REQUIRE(ferry_engine_get_stats(e, &st) == 0); /* room for one group's 32 KiB */
  REQUIRE(st.budget[FERRY_TIER_DEVICE] >= 32768 && st.budget[FERRY_TIER_DEVICE] < 65536);
  return e;
}

typedef struct {
  ferry_engine *e;
  ferry_stream *s;
  int rc;
  double t1;
} fetcher;

static void *fetch_b(void *arg) {
  fetcher *f = arg;
  f->rc = group_fetch(f->e, 1, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, f->s, 0, NULL);
  f->t1 = ferry_now();
  return NULL;
}

static void pause_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

/* group 1's fetch waits while group 0 fills the device pool, and goes on
 * once it is released */
static void test_wakes_on_release(void) {
  ferry_engine *e = two_groups();
  ferry_stream *s0, *s1;
  REQUIRE(ferry_stream_create(ferry_engine_device(e), &s0) == 0);
  REQUIRE(ferry_stream_create(ferry_engine_device(e), &s1) == 0);
  REQUIRE(group_fetch(e, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, s0, 0, NULL) == 0);
  /* the pool has no room for a second group: a plain fetch says so */
  EXPECT(ferry_mem_fetch(e->mem, 1, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, s1, 0) ==
         FERRY_ENOMEM);
  fetcher f = {e, s1, -100, 0};
  pthread_t th;
  REQUIRE(pthread_create(&th, NULL, fetch_b, &f) == 0);
  pause_s(0.3);
  double released = ferry_now();
  REQUIRE(ferry_mem_release(e->mem, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, s0) == 0);
  pthread_join(th, NULL);
  if (f.rc) fprintf(stderr, "fetch: %s\n", ferry_mem_last_error(e->mem));
  EXPECT(f.rc == FERRY_OK);
  EXPECT(f.t1 >= released);          /* it waited for the release */
  EXPECT(f.t1 - released < 2.0);     /* and was woken by it */
  if (f.rc == FERRY_OK)
    EXPECT(ferry_mem_release(e->mem, 1, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, s1) == 0);
  ferry_stream_synchronize(s0);
  ferry_stream_synchronize(s1);
  ferry_stream_destroy(s0);
  ferry_stream_destroy(s1);
  ferry_engine_destroy(e);
}

/* no release comes: the fetch gives up after GROUP_FETCH_WAIT with the
 * manager's FERRY_ENOMEM */
static void test_times_out(void) {
  ferry_engine *e = two_groups();
  ferry_stream *s;
  REQUIRE(ferry_stream_create(ferry_engine_device(e), &s) == 0);
  REQUIRE(group_fetch(e, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, s, 0, NULL) == 0);
  double t0 = ferry_now();
  int rc = group_fetch(e, 1, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, s, 0, NULL);
  double took = ferry_now() - t0;
  EXPECT(rc == FERRY_ENOMEM);
  EXPECT(took >= GROUP_FETCH_WAIT - 0.05 && took < GROUP_FETCH_WAIT + 5);
  EXPECT(strstr(ferry_mem_last_error(e->mem), "device tier full") != NULL);
  EXPECT(engine_mem_err(e, rc, "fetch") == FERRY_ENOMEM);
  EXPECT(strncmp(ferry_engine_last_error(e), "fetch: device tier full", 23) == 0);
  EXPECT(ferry_mem_release(e->mem, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, s) == 0);
  ferry_stream_synchronize(s);
  ferry_stream_destroy(s);
  ferry_engine_destroy(e);
}

static int nobody(ferry_engine *e) {
  (void)e;
  return 0;
}

/* others_busy saying no one else can free room: no wait at all */
static void test_no_wait_when_alone(void) {
  ferry_engine *e = two_groups();
  ferry_stream *s;
  REQUIRE(ferry_stream_create(ferry_engine_device(e), &s) == 0);
  REQUIRE(group_fetch(e, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, s, 0, NULL) == 0);
  double t0 = ferry_now();
  EXPECT(group_fetch(e, 1, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, s, 0, nobody) ==
         FERRY_ENOMEM);
  EXPECT(ferry_now() - t0 < 1.0);
  EXPECT(ferry_mem_release(e->mem, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_DEVICE, s) == 0);
  ferry_stream_synchronize(s);
  ferry_stream_destroy(s);
  ferry_engine_destroy(e);
}

typedef struct {
  ferry_mem *m;
  uint64_t seen;
  int rc;
} waiter;

static void *wait_change(void *arg) {
  waiter *w = arg;
  w->rc = ferry_mem_wait_change(w->m, &w->seen, ferry_now() + 30);
  return NULL;
}

/* the manager's count: a wait wakes on a release, times out at its
 * deadline, and ferry_mem_notify moves it */
static void test_mem_wait_change(void) {
  ferry_engine *e = two_groups();
  ferry_mem *m = e->mem;
  uint64_t seen = ferry_mem_changes(m);
  double t0 = ferry_now();
  EXPECT(ferry_mem_wait_change(m, &seen, t0 + 0.2) == FERRY_ETIMEDOUT);
  EXPECT(ferry_now() - t0 >= 0.19);
  REQUIRE(ferry_mem_fetch(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL, 0) == 0);
  waiter w = {m, ferry_mem_changes(m), -100};
  pthread_t th;
  REQUIRE(pthread_create(&th, NULL, wait_change, &w) == 0);
  pause_s(0.1);
  REQUIRE(ferry_mem_release(m, 0, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL) == 0);
  pthread_join(th, NULL);
  EXPECT(w.rc == FERRY_OK);
  EXPECT(w.seen == ferry_mem_changes(m));
  seen = ferry_mem_changes(m);
  EXPECT(ferry_mem_notify(m) == FERRY_OK);
  EXPECT(ferry_mem_wait_change(m, &seen, ferry_now() + 5) == FERRY_OK);
  EXPECT(ferry_mem_wait_change(NULL, &seen, 0) == FERRY_EINVAL);
  ferry_engine_destroy(e);
}

int main(void) {
  test_mem_wait_change();
  test_wakes_on_release();
  test_no_wait_when_alone();
  test_times_out();
  return test_finish("offload.fetch_wait");
}
