/* tests/memory/test_mem_memlock.c — the pinned host pool against a low
 * RLIMIT_MEMLOCK, in child processes (setrlimit there only): without the
 * fallback, finalize fails with FERRY_ENOMEM and a message giving the limit
 * and the bytes needed; with it, the pool is pageable, a warning gives its
 * size and the stats report it (host_pageable_bytes); a host device that
 * does not lock its pinned allocations reports its pool pageable too.
 */
#include "memory/mem_impl.h"
#include "tests/test.h"

#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static char logbuf[4096];
static void capture(void *user, int level, const char *msg) {
  size_t n = strlen(logbuf);
  snprintf(logbuf + n, sizeof logbuf - n, "%d:%s\n", level, msg);
}

/* Returns the child's verdict: 0 ok, 1 failed. fallback 2: a host device
 * that does not lock (host_lock_pinned 0): the pool is its "pinned"
 * allocation, pageable, and the stats say so. */
static int child(int fallback, rlim_t limit, size_t budget) {
  struct rlimit rl = {limit, limit};
  if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) return 2;
  ferry_device_config dc = ferry_device_config_default();
  dc.kind = FERRY_DEVICE_HOST;
  dc.capacity = 1 << 16;
  dc.host_lock_pinned = fallback != 2;
  ferry_device *dev;
  if (ferry_device_create(&dc, &dev)) return 1;
  ferry_mem_config mc = ferry_mem_config_default();
  mc.dev = dev;
  mc.budget[0] = 1 << 16;
  mc.budget[1] = budget;
  mc.chunk_size = 4096;
  mc.pinned_fallback = fallback;
  mc.numa_local = 0;
  mc.log = (ferry_logger){capture, NULL, FERRY_LOG_DEBUG};
  ferry_mem *m;
  if (ferry_mem_create(&mc, &m)) return 1;
  int64_t n = 1024;
  ferry_mem_register(m, "w", FERRY_DT_F16, 1, &n, 0, FERRY_ROLE_PARAM, NULL);
  int rc = ferry_mem_finalize(m);
  int bad = 0;
  char need[32];
  snprintf(need, sizeof need, "%zu bytes", budget);
  if (fallback == 2) {
    ferry_stats st;
    memset(&st, 0, sizeof st);
    bad = rc != 0 || ferry_mem_get_stats(m, &st) != 0 || st.host_pageable_bytes != budget ||
          !strstr(logbuf, "without host_lock_pinned: pageable");
    printf("no lock: rc %d, host_pageable_bytes %llu\n", rc,
           (unsigned long long)st.host_pageable_bytes);
  } else if (!fallback) {
    const char *e = ferry_mem_last_error(m);
    printf("no fallback: rc %d: %s\n", rc, e);
    bad = rc != FERRY_ENOMEM || !strstr(e, "RLIMIT_MEMLOCK") || !strstr(e, need) ||
          !strstr(e, "65536 bytes");
  } else {
    printf("fallback: rc %d, pinned %d, log:\n%s", rc, m->host_is_pinned, logbuf);
    bad = rc != 0 || m->host_is_pinned || !strstr(logbuf, "pageable") ||
          !strstr(logbuf, "RLIMIT_MEMLOCK");
    /* Not silent: a warning with the size, and the stats say so. */
    char warn[64];
    snprintf(warn, sizeof warn, "%d:memory: pageable host pool of %zu bytes", FERRY_LOG_WARN,
             budget);
    ferry_stats st;
    bad |= !strstr(logbuf, warn) || ferry_mem_get_stats(m, &st) != 0 ||
           st.host_pageable_bytes != budget;
    if (!bad) { /* the pool works */
      bad |= ferry_mem_fetch(m, 0, 0, FERRY_TIER_DEVICE, NULL, 0) != 0;
      bad |= ferry_mem_release(m, 0, 0, FERRY_TIER_DEVICE, NULL) != 0;
    }
  }
  ferry_mem_destroy(m);
  ferry_device_destroy(dev);
  return bad;
}

static int run_child(int fallback, rlim_t limit, size_t budget) {
  fflush(stdout);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int r = child(fallback, limit, budget);
    fflush(stdout);
    _exit(r);
  }
  int st;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 3;
}

int main(void) {
  struct rlimit rl;
  REQUIRE(getrlimit(RLIMIT_MEMLOCK, &rl) == 0);
  if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 65536)
    TEST_SKIP("RLIMIT_MEMLOCK hard limit below 64 KiB");
  EXPECT_EQ_INT(run_child(0, 65536, (size_t)1 << 20), 0);
  EXPECT_EQ_INT(run_child(1, 65536, (size_t)1 << 20), 0);
  EXPECT_EQ_INT(run_child(2, 65536, (size_t)1 << 20), 0);
  return test_finish("test_mem_memlock");
}
