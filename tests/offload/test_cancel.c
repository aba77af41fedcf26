/* tests/offload/test_cancel.c — ferry_engine_set_cancel: finalize asks the
 * caller's cancel during its long work and stops with FERRY_ECANCELED at the
 * first yes: in the zeroing of hundreds of MiB of host homes (asked every
 * 64 MiB on each thread: stopped at the first ask, nothing after it), in
 * the initial values (before each parameter: no init callback after the
 * yes; an init callback that fails while cancelled is FERRY_ECANCELED too),
 * and with NVMe homes (the swap directory empty after destroy; on a slow
 * disk, destroy drops the queued writes instead of waiting for them). Never
 * cancelled, finalize asks at least once per 64 MiB of homes and once per
 * parameter. Device homes on the host backend are zeroed the same way (one
 * pass by all threads, asking as it goes), and finalize zeroes no
 * optimizer state or grads of its own but those homed on NVMe (the others
 * were zeroed when reserved). set_cancel after finalize is refused.
 */
#include "offload/engine_internal.h"
#include "tests/offload/engine_util.h"
#include "tests/test.h"

#include <dirent.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#define G 4
#define D 2048 /* 4 Mi fp32 params a group: 64 MiB of params, grads, master, states */
#define SLOW_MS 100

static atomic_int g_asks;   /* cancel's asks so far */
static atomic_int g_yes_at; /* cancel says yes from this ask on (0: never) */
static atomic_int g_cancel; /* or from when this is set */
static atomic_int g_inits;  /* init callbacks run */
static int g_init_cancels;  /* group 1's init callback sets g_cancel */
static int g_init_fail;     /* and then fails */
static ferry_engine *g_slow; /* group 0's callback slows this engine's NVMe writes */

static int cancel(void *user) {
  int *tag = user;
  EXPECT(*tag == 42);
  int n = atomic_fetch_add(&g_asks, 1) + 1;
  int at = atomic_load(&g_yes_at);
  return (at && n >= at) || atomic_load(&g_cancel);
}

/* group 1's callback asks for the cancel when g_init_cancels (and fails
 * when g_init_fail) */
static int init(void *user, const char *name, float *v, size_t count) {
  (void)name;
  atomic_fetch_add(&g_inits, 1);
  for (size_t i = 0; i < count; i++) v[i] = 0.001f * (float)(i % 97);
  if ((intptr_t)user == 0 && g_slow) { /* every written piece lands SLOW_MS late */
    ferry_fault f = {FERRY_FAULT_DELAY, 1, -1, -1, 0, SLOW_MS};
    REQUIRE(ferry_swap_fault_add(engine_swap(g_slow), &f) == FERRY_OK);
  }
  if ((intptr_t)user == 1 && g_init_cancels) {
    atomic_store(&g_cancel, 1);
    if (g_init_fail) return -1;
  }
  return 0;
}

static const char *g_gpu_budget = "160M";

static ferry_engine *make_qd(const char *placement, const char *swap, int qd) {
  char text[1024];
  snprintf(text, sizeof text,
           "device = \"host\";\n"
           "chunk_size = \"16M\";\n"
           "tiers: { gpu: { budget = \"%s\"; }; host: { budget = \"1G\"; pinned = false; };\n"
           "         nvme: { paths = [\"%s\"]; queue_depth = %d; }; };\n"
           "optimizer: { type = \"adamw\"; lr = 0.01; threads = 1; };\n"
           "precision: { params = \"fp32\"; };\n"
           "placement: { %s };\n",
           g_gpu_budget, swap, qd, placement);
  ferry_engine *e = eu_engine(text, NULL);
  for (int g = 0; g < G; g++) {
    char name[32];
    snprintf(name, sizeof name, "layer%d.w", g);
    int64_t shape[2] = {D, D};
    REQUIRE(ferry_param_register(e, name, shape, 2, g, NULL, init, (void *)(intptr_t)g) == 0);
  }
  return e;
}

static ferry_engine *make(const char *placement, const char *swap) {
  return make_qd(placement, swap, 32);
}

static void reset(int yes_at) {
  atomic_store(&g_asks, 0);
  atomic_store(&g_yes_at, yes_at);
  atomic_store(&g_cancel, 0);
  atomic_store(&g_inits, 0);
  g_init_cancels = g_init_fail = 0;
}

static const char *host = "params = \"host\"; grads = \"host\"; optimizer = \"host\";";
static int tag = 42;

/* A finalize never cancelled asked at least once per 64 MiB of the homes in
 * `tier` (at least 4 such pieces) and once per param. */
static void expect_asks(ferry_engine *e, int tier, const char *label) {
  ferry_stats st;
  REQUIRE(ferry_engine_get_stats(e, &st) == 0);
  uint64_t homes = 0;
  for (int f = 0; f < FERRY_FAMILIES; f++) homes += st.current[tier][f];
  int pieces = (int)(homes >> 26);
  printf("%s: %d asks, %.0f MiB of %s homes\n", label, atomic_load(&g_asks),
         (double)homes / 1048576, tier == FERRY_TIER_HOST ? "host" : "device");
  EXPECT(pieces >= 4);
  EXPECT(atomic_load(&g_asks) >= pieces + G);
}

static void test_never(const char *swap) {
  reset(0);
  ferry_engine *e = make(host, swap);
  REQUIRE(ferry_engine_set_cancel(e, cancel, &tag) == 0);
  int rc = ferry_engine_finalize(e);
  if (rc) fprintf(stderr, "finalize: %s\n", ferry_engine_last_error(e));
  EXPECT_EQ_INT(rc, 0);
  expect_asks(e, FERRY_TIER_HOST, "never");
  EXPECT_EQ_INT(atomic_load(&g_inits), G);
  EXPECT_EQ_INT(ferry_engine_set_cancel(e, cancel, &tag), FERRY_EINVAL);
  EXPECT_EQ_INT((int)engine_setup_zeroed_bytes(e), 0);
  ferry_engine_destroy(e);
}

static void test_in_zeroing(const char *swap) {
  reset(1);
  ferry_engine *e = make(host, swap);
  REQUIRE(ferry_engine_set_cancel(e, cancel, &tag) == 0);
  EXPECT_EQ_INT(ferry_engine_finalize(e), FERRY_ECANCELED);
  const char *msg = ferry_engine_last_error(e);
  printf("in the zeroing: %s (%d asks)\n", msg, atomic_load(&g_asks));
  EXPECT(strstr(msg, "zeroing the host homes") && strstr(msg, "cancelled"));
  /* each thread asks once before it sees the stop, no more */
  EXPECT(atomic_load(&g_asks) >= 1 && atomic_load(&g_asks) <= 64);
  EXPECT_EQ_INT(atomic_load(&g_inits), 0);
  ferry_engine_destroy(e);
}

static void test_in_values(const char *placement, const char *swap, int fail) {
  reset(0);
  g_init_cancels = 1;
  g_init_fail = fail;
  ferry_engine *e = make(placement, swap);
  REQUIRE(ferry_engine_set_cancel(e, cancel, &tag) == 0);
  EXPECT_EQ_INT(ferry_engine_finalize(e), FERRY_ECANCELED);
  const char *msg = ferry_engine_last_error(e);
  printf("in the initial values%s: %s\n", fail ? " (the callback fails)" : "", msg);
  EXPECT(strstr(msg, "initial values") && strstr(msg, "cancelled"));
  EXPECT_EQ_INT(atomic_load(&g_inits), 2); /* groups 0 and 1, none after the yes */
  ferry_engine_destroy(e);
}

/* NVMe homes on a slow disk (each 1 MiB piece written lands 100 ms late,
 * two at a time), cancelled in the initial values of group 2: groups 0
 * and 1 have queued their writes (at least one group's optimizer state,
 * 48 MiB: 2.4 s of writes), and destroy awaits only the pieces on the
 * disk, not the queue (at most a quarter of it). */
static void test_slow_nvme(const char *swap) {
  reset(0);
  g_init_cancels = 1;
  ferry_engine *e = make_qd("params = \"nvme\"; grads = \"host\"; optimizer = \"nvme\";", swap, 2);
  g_slow = e;
  REQUIRE(ferry_engine_set_cancel(e, cancel, &tag) == 0);
  double t0 = ferry_now();
  EXPECT_EQ_INT(ferry_engine_finalize(e), FERRY_ECANCELED);
  double t1 = ferry_now();
  ferry_engine_destroy(e);
  double t2 = ferry_now();
  g_slow = NULL;
  double queued = 48.0 * SLOW_MS / 1000.0 / 2;
  printf("slow NVMe: finalize cancelled after %.3f s, destroy took %.3f s (at least %.2f s of "
         "writes queued)\n",
         t1 - t0, t2 - t1, queued);
  EXPECT(t2 - t1 < queued / 4);
}

/* Everything in the host backend's device arena: its homes zeroed in one
 * pass that asks every 64 MiB (never cancelled), and stopped at the first
 * yes before any init callback. */
static void test_device_homes(const char *swap) {
  static const char *gpu = "params = \"gpu\"; grads = \"gpu\"; optimizer = \"gpu\";";
  g_gpu_budget = "1G";
  reset(0);
  ferry_engine *e = make(gpu, swap);
  REQUIRE(ferry_engine_set_cancel(e, cancel, &tag) == 0);
  int rc = ferry_engine_finalize(e);
  if (rc) fprintf(stderr, "finalize: %s\n", ferry_engine_last_error(e));
  EXPECT_EQ_INT(rc, 0);
  expect_asks(e, FERRY_TIER_DEVICE, "device homes");
  EXPECT_EQ_INT((int)engine_setup_zeroed_bytes(e), 0);
  ferry_engine_destroy(e);
  reset(1);
  e = make(gpu, swap);
  REQUIRE(ferry_engine_set_cancel(e, cancel, &tag) == 0);
  EXPECT_EQ_INT(ferry_engine_finalize(e), FERRY_ECANCELED);
  const char *msg = ferry_engine_last_error(e);
  printf("in the device zeroing: %s\n", msg);
  EXPECT(strstr(msg, "zeroing the device homes") && strstr(msg, "cancelled"));
  EXPECT_EQ_INT(atomic_load(&g_inits), 0);
  ferry_engine_destroy(e);
  g_gpu_budget = "160M";
}

/* The optimizer state homed on NVMe: finalize zeroes its two fp32 states
 * itself (the host buffers they are written from are not fresh). */
static void test_nvme_states_zeroed(const char *swap) {
  reset(0);
  ferry_engine *e = make("params = \"host\"; grads = \"host\"; optimizer = \"nvme\";", swap);
  int rc = ferry_engine_finalize(e);
  if (rc) fprintf(stderr, "finalize: %s\n", ferry_engine_last_error(e));
  EXPECT_EQ_INT(rc, 0);
  EXPECT(engine_setup_zeroed_bytes(e) == (size_t)2 * G * D * D * sizeof(float));
  ferry_engine_destroy(e);
}

/* files left in dir (none expected) */
static int files_in(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d)))
    if (de->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

int main(int argc, char **argv) {
  const char *swap = argc > 1 ? argv[1] : "cancel-scratch";
  mkdir(swap, 0755);
  test_never(swap);
  test_in_zeroing(swap);
  test_in_values(host, swap, 0);
  test_in_values(host, swap, 1);
  test_in_values("params = \"nvme\"; grads = \"host\"; optimizer = \"nvme\";", swap, 0);
  test_slow_nvme(swap);
  test_device_homes(swap);
  test_nvme_states_zeroed(swap);
  EXPECT_EQ_INT(files_in(swap), 0);
  EXPECT_EQ_INT(ferry_engine_set_cancel(NULL, cancel, &tag), FERRY_EINVAL);
  return test_finish("offload.cancel");
}
