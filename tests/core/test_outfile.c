/* tests/core/test_outfile.c — core/outfile.h: a file replaced whole; a
 * symlink planted at the target replaced, its file untouched; an abort and
 * a failed write (past RLIMIT_FSIZE, SIGXFSZ ignored) keep the old file
 * byte for byte and leave no temporary; the old file's mode kept; the
 * temporaries of a dead process removed.
 */
#include "core/outfile.h"

#include "ferry.h"
#include "tests/test.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[] = "/tmp/ferry-outfile-XXXXXX";

static const char *at(const char *name) {
  static char p[2][256];
  static int k;
  k ^= 1;
  snprintf(p[k], sizeof p[k], "%s/%s", g_dir, name);
  return p[k];
}

static void put(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  REQUIRE(f && fputs(text, f) >= 0 && fclose(f) == 0);
}

static int holds(const char *path, const char *text) {
  char b[256] = "";
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(b, 1, sizeof b - 1, f);
  fclose(f);
  b[n] = '\0';
  return strcmp(b, text) == 0;
}

/* Files in the folder whose name holds ".tmp-". */
static int temporaries(void) {
  DIR *d = opendir(g_dir);
  REQUIRE(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strstr(e->d_name, ".tmp-")) n++;
  closedir(d);
  return n;
}

static int write_text(const char *path, const char *text, char *why, size_t wl) {
  ferry_outfile o;
  int rc = ferry_outfile_open(&o, path, why, wl);
  if (rc) return rc;
  fputs(text, o.f);
  return ferry_outfile_commit(&o, why, wl);
}

int main(void) {
  REQUIRE(mkdtemp(g_dir));
  char why[512];
  /* a new file, then replaced */
  EXPECT_EQ_INT(write_text(at("a.json"), "one\n", why, sizeof why), FERRY_OK);
  EXPECT(holds(at("a.json"), "one\n"));
  EXPECT_EQ_INT(write_text(at("a.json"), "two\n", why, sizeof why), FERRY_OK);
  EXPECT(holds(at("a.json"), "two\n"));
  /* the old file's mode is kept */
  REQUIRE(chmod(at("a.json"), 0600) == 0);
  EXPECT_EQ_INT(write_text(at("a.json"), "three\n", why, sizeof why), FERRY_OK);
  struct stat st;
  REQUIRE(stat(at("a.json"), &st) == 0);
  EXPECT_EQ_INT(st.st_mode & 0777, 0600);
  /* a symlink at the target: replaced by the file, its target untouched */
  put(at("victim"), "outside\n");
  REQUIRE(symlink(at("victim"), at("link.json")) == 0);
  EXPECT_EQ_INT(write_text(at("link.json"), "new\n", why, sizeof why), FERRY_OK);
  EXPECT(holds(at("victim"), "outside\n"));
  REQUIRE(lstat(at("link.json"), &st) == 0);
  EXPECT(S_ISREG(st.st_mode));
  EXPECT(holds(at("link.json"), "new\n"));
  /* an abort keeps the old file */
  ferry_outfile o;
  REQUIRE(ferry_outfile_open(&o, at("a.json"), why, sizeof why) == FERRY_OK);
  fputs("half", o.f);
  ferry_outfile_abort(&o);
  EXPECT(holds(at("a.json"), "three\n"));
  ferry_outfile_abort(&o); /* twice is harmless */
  int null = open("/dev/null", O_RDONLY); /* a zeroed outfile leaves descriptor 0 alone */
  REQUIRE(null >= 0 && dup2(null, 0) == 0);
  ferry_outfile z = {0};
  ferry_outfile_abort(&z);
  EXPECT(fcntl(0, F_GETFD) >= 0);
  /* a write past the file size limit fails, named; the old file stays */
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit old, small = {4096, 0};
  REQUIRE(getrlimit(RLIMIT_FSIZE, &old) == 0);
  small.rlim_max = old.rlim_max;
  REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
  REQUIRE(ferry_outfile_open(&o, at("a.json"), why, sizeof why) == FERRY_OK);
  for (int i = 0; i < 1000; i++) fputs("0123456789", o.f);
  EXPECT_EQ_INT(ferry_outfile_commit(&o, why, sizeof why), FERRY_ENOSPC);
  EXPECT(strstr(why, "a.json") && strstr(why, "file size limit") && strstr(why, "4096 bytes"));
  REQUIRE(setrlimit(RLIMIT_FSIZE, &old) == 0);
  EXPECT(holds(at("a.json"), "three\n"));
  EXPECT_EQ_INT(temporaries(), 0);
  /* a dead process's temporary is removed, a live one's kept */
  char live[64];
  snprintf(live, sizeof live, ".a.json.tmp-%ld-7", (long)getppid());
  put(at(".a.json.tmp-999999999-0"), "dead");
  put(at(live), "live");
  EXPECT_EQ_INT(write_text(at("a.json"), "three\n", why, sizeof why), FERRY_OK);
  EXPECT(access(at(".a.json.tmp-999999999-0"), F_OK) != 0);
  EXPECT(access(at(live), F_OK) == 0);
  unlink(at(live));
  /* a missing folder, a folder as the target */
  EXPECT_EQ_INT(write_text(at("no/such/x"), "x", why, sizeof why), FERRY_ENOENT);
  EXPECT(strstr(why, "no/such/x") != NULL);
  REQUIRE(mkdir(at("sub"), 0777) == 0);
  EXPECT(write_text(at("sub"), "x", why, sizeof why) != FERRY_OK);
  EXPECT_EQ_INT(temporaries(), 0);
  const char *names[] = {"a.json", "victim", "link.json"};
  for (int i = 0; i < 3; i++) unlink(at(names[i]));
  rmdir(at("sub"));
  rmdir(g_dir);
  return test_finish("core.outfile");
}
