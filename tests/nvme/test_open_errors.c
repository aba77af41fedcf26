/* tests/nvme/test_open_errors.c — opening a store fails early and clearly:
 * a missing directory, one that is not writable, a file instead of a
 * directory, a store larger than the free space (FERRY_ENOSPC with the
 * numbers), bad sizes; and a failed open leaves no file behind.
 */
#include "nvme_test.h"

#include <linux/magic.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>

static ferry_swap_config cfg1(const char *d, size_t slot, uint32_t n) {
  ferry_swap_config c = ferry_swap_config_default();
  c.paths[0] = d;
  c.npaths = 1;
  c.slot_size = slot;
  c.nslots = n;
  return c;
}

int main(int argc, char **argv) {
  char dir[1024];
  nt_setup(argc, argv, "open", dir, sizeof dir);
  ferry_swap *s = NULL;
  char p[1200];

  /* missing directory: named in the message */
  snprintf(p, sizeof p, "%s/does-not-exist", dir);
  ferry_swap_config c = cfg1(p, 1 << 20, 4);
  EXPECT_EQ_INT(ferry_swap_open(&c, &s), FERRY_ENOENT);
  EXPECT(s == NULL);
  EXPECT(strstr(ferry_last_error(), p) != NULL);
  EXPECT(strstr(ferry_last_error(), "No such file") != NULL);

  /* a file, not a directory */
  snprintf(p, sizeof p, "%s/plain-file", dir);
  FILE *f = fopen(p, "w");
  REQUIRE(f);
  fclose(f);
  c = cfg1(p, 1 << 20, 4);
  EXPECT_EQ_INT(ferry_swap_open(&c, &s), FERRY_EINVAL);
  EXPECT(strstr(ferry_last_error(), "not a directory") != NULL);
  unlink(p);

  /* not writable: as root permissions do not bind, so try it as nobody */
  snprintf(p, sizeof p, "%s/ro", dir);
  REQUIRE(mkdir(p, 0500) == 0);
  chmod(dir, 0755);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (geteuid() == 0 && setuid(65534) != 0) _exit(77);
    ferry_swap *cs = NULL;
    ferry_swap_config cc = cfg1(p, 1 << 20, 4);
    int rc = ferry_swap_open(&cc, &cs);
    if (rc == FERRY_OK) _exit(2);
    if (rc != FERRY_EPERM) _exit(3);
    if (!strstr(ferry_last_error(), p) || !strstr(ferry_last_error(), "Permission denied")) _exit(4);
    _exit(0);
  }
  int ws = 0;
  waitpid(pid, &ws, 0);
  if (WIFEXITED(ws) && WEXITSTATUS(ws) == 77) printf("note: unwritable-directory case skipped\n");
  else EXPECT_EQ_INT(WIFEXITED(ws) ? WEXITSTATUS(ws) : 100, 0);
  rmdir(p);
  chmod(dir, 0700);

  /* larger than the free space: fails at open, with the numbers, no file left */
  c = cfg1(dir, (size_t)1 << 30, 1u << 20); /* 1 PiB */
  EXPECT_EQ_INT(ferry_swap_open(&c, &s), FERRY_ENOSPC);
  const char *m = ferry_last_error();
  EXPECT(strstr(m, dir) && strstr(m, "needs") && strstr(m, "free"));
  printf("message: %s\n", m);
  EXPECT_EQ_INT(nt_count_files(dir), 0);

  /* same with three directories on one file system: their sum counts */
  ferry_path_info pi;
  char why[256];
  REQUIRE(ferry_path_probe(dir, &pi, why, sizeof why) == FERRY_OK);
  char d[3][1200];
  for (int i = 0; i < 3; i++) nt_subdir(dir, i, d[i], sizeof d[i]);
  /* 3 files of 1/3 of the free space + 1 GiB each: each alone would fit */
  c = cfg1(d[0], 3u << 20, (uint32_t)(pi.free_bytes / (3u << 20) + 1024));
  c.paths[1] = d[1];
  c.paths[2] = d[2];
  c.npaths = 3;
  c.spare_slots = 0;
  EXPECT_EQ_INT(ferry_swap_open(&c, &s), FERRY_ENOSPC);
  EXPECT(strstr(ferry_last_error(), "3 file(s)") != NULL);
  for (int i = 0; i < 3; i++) EXPECT_EQ_INT(nt_count_files(d[i]), 0);

  /* online discard, from the mount that holds the directory */
  EXPECT(pi.online_discard >= -1 && pi.online_discard <= 1);
  {
    struct statfs sf;
    ferry_path_info shm;
    if (statfs("/dev/shm", &sf) == 0 && sf.f_type == TMPFS_MAGIC &&
        ferry_path_probe("/dev/shm", &shm, why, sizeof why) == FERRY_OK)
      EXPECT_EQ_INT(shm.online_discard, 0); /* tmpfs never discards */
  }
#if FERRY_FAULT_INJECTION
  { /* made-up mountinfo lines for dir's device: the longest mount point
     * above dir decides, by its mount or its super options */
    struct stat sd;
    char real[4096], fake[1300];
    REQUIRE(stat(dir, &sd) == 0 && realpath(dir, real));
    snprintf(fake, sizeof fake, "%s/mountinfo", d[0]);
    const char *cases[][3] = {
        {"rw,relatime", "rw,discard,errors=remount-ro", "1"}, /* ext4: in the super options */
        {"rw,discard", "rw", "1"},
        {"rw,relatime", "rw,space_cache=v2,discard=async", "1"}, /* btrfs */
        {"rw,relatime", "rw,nodiscard", "0"},
        {"rw,relatime", "rw,discard_max=1", "0"}, /* not the option itself */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
      FILE *mf = fopen(fake, "w");
      REQUIRE(mf);
      /* "/" with the opposite answer, then dir's own mount point (with a
       * space escaped as mountinfo does when the path has one) */
      fprintf(mf, "1 0 %u:%u / / %s - ext4 /dev/x %s\n", major(sd.st_dev), minor(sd.st_dev),
              cases[k][2][0] == '1' ? "rw" : "rw,discard", "rw");
      fprintf(mf, "2 1 %u:%u / %s %s - fs /dev/y %s\n", major(sd.st_dev), minor(sd.st_dev), real,
              cases[k][0], cases[k][1]);
      fprintf(mf, "3 1 %u:%u / %s/x\\040y rw,discard - fs /dev/z rw,discard\n", major(sd.st_dev),
              minor(sd.st_dev), real); /* below dir: not its mount */
      fclose(mf);
      setenv("FERRY_FAULT_MOUNTINFO", fake, 1);
      ferry_path_info q;
      REQUIRE(ferry_path_probe(dir, &q, why, sizeof why) == FERRY_OK);
      if (q.online_discard != cases[k][2][0] - '0')
        fprintf(stderr, "mountinfo case %zu (%s / %s): online_discard %d\n", k, cases[k][0],
                cases[k][1], q.online_discard);
      EXPECT_EQ_INT(q.online_discard, cases[k][2][0] - '0');
    }
    FILE *mf = fopen(fake, "w"); /* no line for dir's device */
    REQUIRE(mf);
    fprintf(mf, "1 0 %u:%u / / rw,discard - ext4 /dev/x rw\n", major(sd.st_dev) + 1, minor(sd.st_dev));
    fclose(mf);
    ferry_path_info q;
    REQUIRE(ferry_path_probe(dir, &q, why, sizeof why) == FERRY_OK);
    EXPECT_EQ_INT(q.online_discard, -1);
    unsetenv("FERRY_FAULT_MOUNTINFO");
    unlink(fake);
  }
#endif

  /* bad sizes */
  c = cfg1(dir, 0, 4);
  EXPECT_EQ_INT(ferry_swap_open(&c, &s), FERRY_EINVAL);
  c = cfg1(dir, 1 << 20, 0);
  EXPECT_EQ_INT(ferry_swap_open(&c, &s), FERRY_EINVAL);
  c = cfg1(dir, SIZE_MAX / 2, UINT32_MAX - 10);
  EXPECT(ferry_swap_open(&c, &s) != FERRY_OK);
  c.npaths = 0;
  EXPECT_EQ_INT(ferry_swap_open(&c, &s), FERRY_EINVAL);
  EXPECT_EQ_INT(ferry_swap_open(NULL, &s), FERRY_EINVAL);
  c = cfg1(dir, 1 << 20, 4);
  c.check_threads = 65;
  EXPECT_EQ_INT(ferry_swap_open(&c, &s), FERRY_EINVAL);
  EXPECT(strstr(ferry_last_error(), "check_threads 65 (0..64)") != NULL);

  nt_cleanup(dir, 3);
  return test_finish("nvme.open_errors");
}
