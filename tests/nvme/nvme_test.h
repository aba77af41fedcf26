/* tests/nvme/nvme_test.h — shared setup of the swap-store tests: a fresh
 * scratch directory under the build tree (or $FERRY_TEST_DIR), skip (77)
 * when io_uring or O_DIRECT is not available, aligned random buffers.
 */
#ifndef FERRY_NVME_TEST_H
#define FERRY_NVME_TEST_H

#include "nvme/nvme.h"
#include "tests/test.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Makes <base>/<name>-XXXXXX (and n subdirectories d0..dn-1 when n > 0),
 * after checking io_uring and O_DIRECT there. */
static inline void nt_setup(int argc, char **argv, const char *name, char *dir, size_t len) {
  const char *base = getenv("FERRY_TEST_DIR");
  if (!base) base = argc > 1 ? argv[1] : getenv("TMPDIR");
  if (!base) base = "/tmp";
  mkdir(base, 0700);
  char why[256];
  if (ferry_io_uring_probe(why, sizeof why) != FERRY_OK) TEST_SKIP("io_uring unavailable: %s", why);
  snprintf(dir, len, "%s/%s-XXXXXX", base, name);
  REQUIRE(mkdtemp(dir) != NULL);
  ferry_path_info pi;
  REQUIRE(ferry_path_probe(dir, &pi, why, sizeof why) == FERRY_OK);
  if (!pi.o_direct) {
    rmdir(dir);
    TEST_SKIP("O_DIRECT unavailable in %s (%s)", dir, pi.fs_type);
  }
}

static inline void nt_subdir(const char *dir, int i, char *out, size_t len) {
  snprintf(out, len, "%s/d%d", dir, i);
  mkdir(out, 0700);
}

static inline void nt_cleanup(const char *dir, int nsub) {
  char p[1200];
  for (int i = 0; i < nsub; i++) {
    snprintf(p, sizeof p, "%s/d%d", dir, i);
    rmdir(p);
  }
  rmdir(dir);
}

static inline unsigned char *nt_alloc(size_t n) {
  void *p = NULL;
  REQUIRE(posix_memalign(&p, 4096, n ? ferry_align_up(n, 4096) : 4096) == 0);
  return p;
}

static inline void nt_fill(unsigned char *p, size_t n, unsigned long long seed) {
  unsigned long long s = seed * 0x9E3779B97F4A7C15ull + 1;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    unsigned long long v = test_rand(&s);
    memcpy(p + i, &v, 8);
  }
  for (; i < n; i++) p[i] = (unsigned char)test_rand(&s);
}

/* Counts files in a directory (entries other than . and ..). */
#include <dirent.h>
static inline int nt_count_files(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && e->d_type != DT_DIR) n++;
  closedir(d);
  return n;
}

#endif
