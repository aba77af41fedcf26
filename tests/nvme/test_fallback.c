/* tests/nvme/test_fallback.c — the buffered fallback on a file system that
 * refuses O_DIRECT, emulated with the fault-injection hook
 * FERRY_FAULT_REFUSE_ODIRECT (no file system here refuses it): the probe
 * says so, the store says it once through its logger naming the
 * directories, drops the alignment rules, and still round-trips and checks
 * every byte. force_buffered (the caller's choice) says nothing.
 */
#include "nvme_test.h"

#include <sys/mount.h>

typedef struct {
  int lines, warn;
  char last[4096];
  char all[8192]; /* every warning, one a line */
} log_cap;

static void capture(void *user, int level, const char *msg) {
  log_cap *c = user;
  if (level == FERRY_LOG_WARN) {
    c->warn++;
    snprintf(c->last, sizeof c->last, "%s", msg);
    size_t n = strlen(c->all);
    snprintf(c->all + n, sizeof c->all - n, "%s\n", msg);
  }
  c->lines++;
}

static void roundtrip_unaligned(ferry_swap *s, uint32_t nslots) {
  static const size_t sizes[] = {1, 511, 4097, (1 << 20) + 3, (3 << 20) - 5};
  for (uint32_t k = 0; k < 2; k++) {
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && i < nslots; i++) {
      size_t n = sizes[i];
      unsigned char *a = malloc(n + 1), *b = malloc(n + 1);
      REQUIRE(a && b);
      nt_fill(a + 1, n, 100 * k + i); /* a+1: no alignment at all */
      ferry_swap_req r;
      EXPECT_EQ_INT(ferry_swap_write(s, (uint32_t)i, a + 1, n, &r, NULL, NULL), FERRY_OK);
      EXPECT_EQ_INT(ferry_swap_wait(&r), FERRY_OK);
      memset(b, 0, n + 1);
      EXPECT_EQ_INT(ferry_swap_read(s, (uint32_t)i, b + 1, n, &r, NULL, NULL), FERRY_OK);
      EXPECT_EQ_INT(ferry_swap_wait(&r), FERRY_OK);
      EXPECT(memcmp(a + 1, b + 1, n) == 0);
      free(a);
      free(b);
    }
  }
}

/* A real file system that creates the file and then refuses O_DIRECT
 * (ramfs; tmpfs before Linux 6.6): the probe must reach the buffered
 * retry, the store must warn and work, and nothing may stay behind. Needs
 * mount(2) (root); otherwise only the emulation above runs. */
static void ramfs_case(const char *dir) {
  char m[1200];
  snprintf(m, sizeof m, "%s/ramfs", dir);
  REQUIRE(mkdir(m, 0700) == 0);
  if (mount("ramfs", m, "ramfs", 0, NULL) != 0) {
    printf("ramfs part skipped: mount: %s\n", strerror(errno));
    rmdir(m);
    return;
  }
  ferry_path_info pi;
  char why[600];
  EXPECT_EQ_INT(ferry_path_probe(m, &pi, why, sizeof why), FERRY_OK);
  printf("ramfs probe: %s, o_direct %d\n", why, pi.o_direct);
  EXPECT_EQ_INT(pi.o_direct, 0);
  EXPECT_EQ_INT(nt_count_files(m), 0); /* no .ferry-probe-* left */

  log_cap cap = {0};
  ferry_swap_config c = ferry_swap_config_default();
  c.paths[0] = m;
  c.npaths = 1;
  c.slot_size = 3 << 20;
  c.nslots = 5;
  c.spare_slots = 1;
  c.log = (ferry_logger){capture, &cap, FERRY_LOG_DEBUG};
  ferry_swap *s = NULL;
  int rc = ferry_swap_open(&c, &s);
  EXPECT_EQ_INT(rc, FERRY_OK);
  if (rc != FERRY_OK) printf("open on ramfs: %s\n", ferry_last_error());
  if (s) {
    printf("warnings on ramfs:\n%s", cap.all);
    EXPECT(strstr(cap.all, "O_DIRECT refused") != NULL && strstr(cap.all, "ramfs") != NULL);
    EXPECT(strstr(cap.all, "reports no size") != NULL);
    roundtrip_unaligned(s, c.nslots);
    ferry_swap_close(s);
  }
  EXPECT_EQ_INT(nt_count_files(m), 0);
  /* io_uring drops its file references asynchronously after close */
  int um = -1;
  for (int i = 0; i < 200 && (um = umount(m)) != 0 && errno == EBUSY; i++) usleep(10000);
  if (um) {
    printf("umount %s: %s (detached instead)\n", m, strerror(errno));
    um = umount2(m, MNT_DETACH);
  }
  EXPECT_EQ_INT(um, 0);
  rmdir(m);
}

int main(int argc, char **argv) {
#if !FERRY_FAULT_INJECTION
  (void)argc;
  (void)argv;
  TEST_SKIP("fault injection not compiled in (FERRY_FAULT_INJECTION=OFF)");
#else
  char dir[1024];
  nt_setup(argc, argv, "fallback", dir, sizeof dir); /* O_DIRECT works here */
  char d[2][1200];
  for (int i = 0; i < 2; i++) nt_subdir(dir, i, d[i], sizeof d[i]);

  ferry_path_info pi;
  char why[256];
  REQUIRE(setenv("FERRY_FAULT_REFUSE_ODIRECT", "1", 1) == 0);
  REQUIRE(ferry_path_probe(d[0], &pi, why, sizeof why) == FERRY_OK);
  EXPECT_EQ_INT(pi.o_direct, 0);
  EXPECT_EQ_INT((int)pi.dio_mem_align, 1);
  EXPECT_EQ_INT((int)pi.dio_offset_align, 1);
  EXPECT_EQ_INT(nt_count_files(d[0]), 0); /* the probe file is gone */

  log_cap cap = {0};
  ferry_swap_config c = ferry_swap_config_default();
  c.paths[0] = d[0];
  c.paths[1] = d[1];
  c.npaths = 2;
  c.slot_size = 3 << 20;
  c.nslots = 5;
  c.spare_slots = 1;
  c.log = (ferry_logger){capture, &cap, FERRY_LOG_DEBUG};
  ferry_swap *s = NULL;
  REQUIRE(ferry_swap_open(&c, &s) == FERRY_OK);
  EXPECT_EQ_INT(cap.warn, 1); /* once per store, not once per directory or request */
  printf("log: %s\n", cap.last);
  EXPECT(strstr(cap.last, "O_DIRECT refused") != NULL);
  EXPECT(strstr(cap.last, d[0]) != NULL && strstr(cap.last, d[1]) != NULL);
  EXPECT(strstr(cap.last, "buffered") != NULL);
  ferry_swap_info in;
  REQUIRE(ferry_swap_get_info(s, &in) == FERRY_OK);
  EXPECT_EQ_INT(in.o_direct, 0);
  EXPECT_EQ_INT((int)in.mem_align, 1);
  EXPECT_EQ_INT((int)in.offset_align, 1);
  roundtrip_unaligned(s, c.nslots);
  EXPECT_EQ_INT(cap.warn, 1);

  /* the CRC still guards every block */
  EXPECT_EQ_INT(ferry_swap_corrupt_on_disk(s, 3, 12345, 2), FERRY_OK);
  size_t n = ferry_swap_chunk_len(s, 3);
  unsigned char *b = malloc(n);
  REQUIRE(b);
  ferry_swap_req r;
  EXPECT_EQ_INT(ferry_swap_read(s, 3, b, n, &r, NULL, NULL), FERRY_OK);
  EXPECT_EQ_INT(ferry_swap_wait(&r), FERRY_ECORRUPT);
  EXPECT(strstr(ferry_swap_last_error(s), "CRC32C expected") != NULL);
  free(b);
  ferry_swap_close(s);
  for (int i = 0; i < 2; i++) EXPECT_EQ_INT(nt_count_files(d[i]), 0);

  /* the caller's own choice (force_buffered) is not a warning */
  REQUIRE(unsetenv("FERRY_FAULT_REFUSE_ODIRECT") == 0);
  memset(&cap, 0, sizeof cap);
  c.force_buffered = 1;
  REQUIRE(ferry_swap_open(&c, &s) == FERRY_OK);
  EXPECT_EQ_INT(cap.warn, 0);
  REQUIRE(ferry_swap_get_info(s, &in) == FERRY_OK);
  EXPECT_EQ_INT(in.o_direct, 0);
  roundtrip_unaligned(s, c.nslots);
  ferry_swap_close(s);

  /* and with the hook off, the same directories get O_DIRECT again */
  memset(&cap, 0, sizeof cap);
  c.force_buffered = 0;
  REQUIRE(ferry_swap_open(&c, &s) == FERRY_OK);
  EXPECT_EQ_INT(cap.warn, 0);
  REQUIRE(ferry_swap_get_info(s, &in) == FERRY_OK);
  EXPECT_EQ_INT(in.o_direct, 1);
  ferry_swap_close(s);

  ramfs_case(dir);
  nt_cleanup(dir, 2);
  return test_finish("nvme.fallback");
#endif
}
