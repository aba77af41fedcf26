/* tests/offload/test_faults.c — the engine's fault matrix on the host
 * backend (docs/RELIABILITY.md): an EIO or a flipped bit while the step
 * swaps optimizer state in from NVMe (engine->swap fault injection) fails
 * the step with its status, changes nothing half-way, refuses a checkpoint
 * of the half-done step, and a retry of ferry_step ends bit-identical to a
 * run without the fault; ENOSPC while a checkpoint is written (a small
 * tmpfs) leaves the previous one and no partial folder; a pinned-memory
 * limit too small (RLIMIT_MEMLOCK in a child) is the configured error or
 * fallback; device memory taken by the caller is refused with the numbers.
 * argv[1]: a scratch folder.
 */
#include "offload/engine_internal.h"
#include "tests/offload/ckpt_util.h"

#include <errno.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>

#define P_OPTNVME "placement: { params = \"host\"; grads = \"host\"; optimizer = \"nvme\"; };"
#define P_ALLNVME "placement: { params = \"nvme\"; grads = \"host\"; optimizer = \"nvme\"; };"
#define STEPS 8
#define FAULT_AT 4

typedef struct {
  double loss[STEPS];
  float params[CK_G * CK_D * CK_D];
} result;

/* STEPS steps; before step FAULT_AT the fault (kind 0: none) is armed.
 * A failing step is retried with ferry_step and then its micro-batch is
 * run again, as a training loop would. */
static int run_with_fault(const char *placement, const char *sets, ferry_fault_kind kind, int op,
                          result *out, const char *ckpt_dir) {
  ck_run r;
  ck_open(&r, "64K", placement, FERRY_DT_BF16, sets);
  int failures = 0;
  for (int step = 0; step < STEPS; step++) {
    if (kind && step == FAULT_AT) {
      ferry_fault f = {kind, op, -1, -1, 1, 0};
      REQUIRE(ferry_swap_fault_add(engine_swap(r.e), &f) == 0);
    }
    for (int attempt = 0;; attempt++) {
      REQUIRE(attempt < 4);
      synth_batch(&r.m, (unsigned long long)step + 1);
      int rc = synth_micro_batch(r.e, &r.m, r.s, r.calls);
      ferry_step_info info;
      if (!rc) rc = ferry_step(r.e, &info);
      if (!rc) break;
      failures++;
      const char *msg = ferry_engine_last_error(r.e);
      printf("  step %d: %s: %s\n", step, ferry_strerror(rc), msg);
      EXPECT(rc == FERRY_EIO || rc == FERRY_ECORRUPT);
      /* facts, not advice for API callers: the swap file, the offset, the
       * family and chunk, what the check found */
      EXPECT(strstr(msg, "ferry-engine-") && strstr(msg, ".swap offset") &&
             strstr(msg, "(optimizer #") && !strstr(msg, "call ferry_step"));
      if (kind == FERRY_FAULT_BITFLIP) EXPECT(strstr(msg, "CRC32C expected") != NULL);
      ferry_stream_synchronize(r.s);
      if (ckpt_dir) { /* a checkpoint of a half-done step is refused, clearly */
        int src = ferry_checkpoint_save(r.e, ckpt_dir, NULL, 0, NULL);
        printf("  save now: %s: %s\n", ferry_strerror(src), ferry_engine_last_error(r.e));
        const char *sm = ferry_engine_last_error(r.e);
        EXPECT(src == FERRY_ESTATE && strstr(sm, "half a step") && strstr(sm, ".swap offset") &&
               !strstr(sm, "call ferry_step"));
      }
      /* the retry: the failed updates run again; eager mode then ends the
       * step, the other mode completes the last one (redo this batch) */
      rc = ferry_step(r.e, &info);
      if (rc) printf("  retry: %s: %s\n", ferry_strerror(rc), ferry_engine_last_error(r.e));
      EXPECT(rc == 0);
      if (info.step == step + 1) break; /* this step is done */
    }
    out->loss[step] = r.m.loss;
    if (ckpt_dir && step == STEPS - 1) {
      int rc = ferry_checkpoint_save(r.e, ckpt_dir, NULL, 0, NULL);
      if (rc) printf("  save: %s\n", ferry_engine_last_error(r.e));
      EXPECT(rc == 0);
      EXPECT(ferry_checkpoint_verify(ckpt_dir, NULL) == 0);
    }
  }
  ck_read_params(&r, CK_G, CK_D, out->params);
  ferry_swap_stats ss;
  ferry_swap_get_stats(engine_swap(r.e), &ss);
  if (kind) EXPECT(ss.io_errors + ss.crc_errors >= 1); /* the fault did fire */
  if (kind) printf("  the store saw %llu I/O error(s), %llu CRC error(s)\n",
                   (unsigned long long)ss.io_errors, (unsigned long long)ss.crc_errors);
  ck_close(&r);
  return failures;
}

static void test_swap_faults(void) {
  static const struct {
    const char *name;
    ferry_fault_kind kind;
    int op;
  } faults[] = {
      {"EIO on a read", FERRY_FAULT_EIO, 0},
      {"CRC mismatch on a read", FERRY_FAULT_BITFLIP, 0},
      {"EIO on a write", FERRY_FAULT_EIO, 1},
  };
  static const char *sets[] = {"tiers.host.budget=96K",
                               "tiers.host.budget=96K,step_during_backward=false"};
  char dir[1400];
  for (int s = 0; s < 2; s++) {
    result clean;
    EXPECT(run_with_fault(P_OPTNVME, sets[s], 0, 0, &clean, NULL) == 0);
    for (size_t f = 0; f < sizeof faults / sizeof faults[0]; f++) {
      snprintf(dir, sizeof dir, "%s/swapfault-%d-%zu", ck_scratch, s, f);
      ck_rm(dir);
      printf("%s, %s:\n", faults[f].name, s ? "step after backward" : "updates during backward");
      result got;
      int n = run_with_fault(P_OPTNVME, sets[s], faults[f].kind, faults[f].op, &got, dir);
      int same = !memcmp(got.loss, clean.loss, sizeof clean.loss) &&
                 !memcmp(got.params, clean.params, sizeof clean.params);
      printf("  %d failed step(s), after the retry %s\n", n, same ? "bit-identical" : "DIFFERENT");
      EXPECT(same);
      /* a read failure fails the step, unless it hit a prefetch that
       * completed before anyone waited: the demand fetch then reads the
       * chunk again, which must give the fault-free run */
      if (faults[f].op == 0) {
        if (n == 0) printf("  the failed read was a prefetch, read again on demand\n");
        EXPECT(n >= 1 || same);
      }
    }
  }
}

/* ---- ENOSPC ------------------------------------------------------------ */

static int enospc_child(const char *mnt) {
  ck_run r;
  ck_open_dims(&r, "16M", "placement: { params = \"gpu\"; grads = \"gpu\"; optimizer = \"gpu\"; };",
               FERRY_DT_BF16, NULL, 4, 96);
  double loss;
  REQUIRE(ck_step(&r, 1, &loss) == 0);
  char dir[2048];
  snprintf(dir, sizeof dir, "%s/ckpt", mnt);
  REQUIRE(ferry_checkpoint_save(r.e, dir, "first", 5, NULL) == 0);
  ferry_checkpoint_info before;
  REQUIRE(ferry_checkpoint_verify(dir, &before) == 0);
  REQUIRE(ck_step(&r, 2, &loss) == 0);
  int rc = ferry_checkpoint_save(r.e, dir, "second", 6, NULL); /* no room for two */
  printf("second save on a full disk: %s: %s\n", ferry_strerror(rc), ferry_engine_last_error(r.e));
  EXPECT(rc == FERRY_ENOSPC);
  EXPECT(strstr(ferry_engine_last_error(r.e), "No space") != NULL);
  ferry_checkpoint_info after;
  EXPECT(ferry_checkpoint_verify(dir, &after) == 0 && after.step == before.step &&
         after.total_bytes == before.total_bytes);
  EXPECT(ck_count_entries(dir, "step-") == 1);
  EXPECT(ck_count_entries(dir, ".") == 0); /* no partial folder */
  char blob[8];
  size_t len;
  EXPECT(ferry_checkpoint_load(r.e, dir, blob, sizeof blob, &len) == 0 && len == 5 &&
         !memcmp(blob, "first", 5));
  rc = ferry_checkpoint_save(r.e, dir, NULL, 0, NULL); /* again: the same */
  EXPECT(rc == FERRY_ENOSPC && ck_count_entries(dir, ".") == 0);
  ck_close(&r);
  return test_failures ? 1 : 0;
}

static void test_enospc(void) {
  char mnt[1400];
  snprintf(mnt, sizeof mnt, "%s/tmpfs", ck_scratch);
  mkdir(mnt, 0777);
  fflush(stdout);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    /* a private mount namespace: the tmpfs goes away with the child */
    int ns = unshare(CLONE_NEWNS) == 0 && mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0;
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=800k") != 0) {
      printf("SKIP ENOSPC: cannot mount a tmpfs at %s (%s)\n", mnt, strerror(errno));
      fflush(stdout);
      _exit(77);
    }
    int rc = enospc_child(mnt);
    fflush(stdout);
    if (!ns) umount(mnt);
    _exit(rc);
  }
  int st;
  REQUIRE(waitpid(pid, &st, 0) == pid);
  int code = WIFEXITED(st) ? WEXITSTATUS(st) : 99;
  EXPECT(code == 0 || code == 77);
}

/* ---- RLIMIT_MEMLOCK ---------------------------------------------------- */

static int memlock_child(int fallback) {
  struct rlimit rl = {64 << 10, 64 << 10};
  if (setrlimit(RLIMIT_MEMLOCK, &rl)) return 2;
  ferry_device_config dc = ferry_device_config_default();
  dc.kind = FERRY_DEVICE_HOST;
  dc.capacity = 16 << 20;
  dc.host_lock_pinned = 1;
  ferry_device *dev;
  if (ferry_device_create(&dc, &dev)) return 3;
  ck_run r;
  char sets[128];
  snprintf(sets, sizeof sets, "tiers.host.pinned=true,tiers.host.memlock_fallback=%s",
           fallback ? "pageable" : "error");
  int rc = ck_open_full(&r, "16M", P_OPTNVME, FERRY_DT_BF16, sets, CK_G, CK_D, dev, 1);
  const char *msg = ferry_engine_last_error(r.e);
  printf("memlock 64K, memlock_fallback %s: finalize %s%s%s\n", fallback ? "pageable" : "error",
         ferry_strerror(rc), rc ? ": " : "", rc ? msg : "");
  int bad;
  if (!fallback) {
    bad = rc != FERRY_ENOMEM || !strstr(msg, "RLIMIT_MEMLOCK");
  } else {
    double loss;
    bad = rc != 0 || ck_step(&r, 1, &loss) != 0 || ck_step(&r, 2, &loss) != 0;
  }
  ck_close(&r);
  ferry_device_destroy(dev);
  return bad;
}

static void test_memlock(void) {
  for (int fb = 0; fb < 2; fb++) {
    fflush(stdout);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int rc = memlock_child(fb);
      fflush(stdout);
      _exit(rc);
    }
    int st;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
}

/* ---- device memory taken by the caller ------------------------------------ */

static void test_device_exhausted(void) {
  ferry_device_config dc = ferry_device_config_default();
  dc.kind = FERRY_DEVICE_HOST;
  dc.capacity = 4 << 20;
  ferry_device *dev;
  REQUIRE(ferry_device_create(&dc, &dev) == 0);
  void *mine;
  REQUIRE(ferry_device_alloc(dev, (4 << 20) - (256 << 10), &mine) == 0); /* the caller's */
  ck_run r;
  int rc = ck_open_full(&r, "4M", P_OPTNVME, FERRY_DT_BF16, NULL, CK_G, CK_D, dev, 1);
  const char *msg = ferry_engine_last_error(r.e);
  printf("device budget 4M, 3.75M taken by the caller: finalize %s: %s\n", ferry_strerror(rc), msg);
  EXPECT(rc == FERRY_ENOMEM);
  EXPECT(strstr(msg, "bytes") != NULL);
  ck_close(&r);
  /* a budget that fits what is left: it trains inside it */
  rc = ck_open_full(&r, "192K", P_OPTNVME, FERRY_DT_BF16, NULL, CK_G, CK_D, dev, 1);
  if (rc) printf("192K budget: %s\n", ferry_engine_last_error(r.e));
  EXPECT(rc == 0);
  if (!rc) {
    double loss;
    EXPECT(ck_step(&r, 1, &loss) == 0 && ck_step(&r, 2, &loss) == 0);
    ferry_stats st;
    ferry_engine_get_stats(r.e, &st);
    printf("192K budget: device peak %llu bytes of %llu\n",
           (unsigned long long)st.tier_peak[FERRY_TIER_DEVICE],
           (unsigned long long)st.budget[FERRY_TIER_DEVICE]);
    EXPECT(st.tier_peak[FERRY_TIER_DEVICE] <= st.budget[FERRY_TIER_DEVICE]);
  }
  ck_close(&r);
  ferry_device_free(dev, mine);
  ferry_device_destroy(dev);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s SCRATCH\n", argv[0]);
    return 1;
  }
  ck_set_scratch(argv[1]);
  /* children fork before this process starts engine threads */
  test_memlock();
  test_enospc();
  test_device_exhausted();
  test_swap_faults();
  return test_finish("test_faults");
}
