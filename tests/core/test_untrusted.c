/* tests/core/test_untrusted.c — core/untrusted.h: a file below a folder
 * opened only through plain names with no link among them (a linked
 * folder, a linked file, "..", an absolute or empty component refused), a
 * FIFO and a device refused at once, the size limit, a link the user names
 * followed, and control characters escaped for display.
 */
#include "core/untrusted.h"
#include "ferry.h"
#include "tests/test.h"

#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[64];

static char *at(const char *rel) {
  static char p[4][256];
  static int i;
  i = (i + 1) % 4;
  snprintf(p[i], sizeof p[i], "%s/%s", root, rel);
  return p[i];
}

static int try_open(const char *rel, uint64_t max, char *why, size_t wl) {
  int fd = -1;
  uint64_t size = 0;
  int rc = ferry_open_untrusted(root, rel, max, &fd, &size, why, wl);
  if (!rc) close(fd);
  return rc;
}

static void test_open(void) {
  char why[512];
  REQUIRE(mkdtemp(strcpy(root, "/tmp/ferry_test_untrusted_XXXXXX")));
  REQUIRE(mkdir(at("d"), 0700) == 0);
  int fd = open(at("d/f"), O_WRONLY | O_CREAT, 0600);
  REQUIRE(fd >= 0 && write(fd, "12345678", 8) == 8);
  close(fd);
  REQUIRE(symlink(at("d"), at("ld")) == 0);
  REQUIRE(symlink(at("d/f"), at("d/lf")) == 0);
  REQUIRE(mkfifo(at("d/fifo"), 0600) == 0);
  uint64_t size = 0;
  fd = -1;
  EXPECT_EQ_INT(ferry_open_untrusted(root, "d/f", 8, &fd, &size, why, sizeof why), FERRY_OK);
  EXPECT(fd >= 0 && size == 8 && !(fcntl(fd, F_GETFL) & O_NONBLOCK));
  if (fd >= 0) close(fd);
  EXPECT_EQ_INT(try_open("d/f", 7, why, sizeof why), FERRY_EOVERFLOW);
  EXPECT(strstr(why, "larger than 7 bytes"));
  EXPECT_EQ_INT(try_open("ld/f", 8, why, sizeof why), FERRY_EINVAL);
  EXPECT(strstr(why, "ld is a symbolic link"));
  EXPECT_EQ_INT(try_open("d/lf", 8, why, sizeof why), FERRY_EINVAL);
  EXPECT(strstr(why, "d/lf: a symbolic link"));
  EXPECT_EQ_INT(try_open("d/fifo", 8, why, sizeof why), FERRY_EINVAL);
  EXPECT(strstr(why, "a FIFO"));
  EXPECT_EQ_INT(try_open("d", 8, why, sizeof why), FERRY_EINVAL);
  EXPECT(strstr(why, "a folder"));
  const char *bad[] = {"d/../d/f", "../x", "/etc/passwd", "d//f", "./d/f", ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    EXPECT_EQ_INT(try_open(bad[i], 8, why, sizeof why), FERRY_EINVAL);
    EXPECT(strstr(why, "not a plain name"));
  }
  EXPECT_EQ_INT(try_open("d/none", 8, why, sizeof why), FERRY_ENOENT);
  /* what the user names is followed; a device is still refused */
  fd = -1;
  EXPECT_EQ_INT(ferry_open_named(at("d/lf"), 8, &fd, NULL, why, sizeof why), FERRY_OK);
  if (fd >= 0) close(fd);
  EXPECT_EQ_INT(ferry_open_named("/dev/zero", 8, &fd, NULL, why, sizeof why), FERRY_EINVAL);
  EXPECT(strstr(why, "/dev/zero: a device"));
  EXPECT_EQ_INT(ferry_open_leaf(at("d/lf"), 8, &fd, NULL, why, sizeof why), FERRY_EINVAL);
  EXPECT_EQ_INT(ferry_open_leaf(at("ld/f"), 8, &fd, NULL, why, sizeof why), FERRY_OK);
  if (fd >= 0) close(fd);
  unlink(at("d/fifo"));
  unlink(at("d/lf"));
  unlink(at("d/f"));
  unlink(at("ld"));
  rmdir(at("d"));
  rmdir(root);
}

static void test_escape(void) {
  char out[64];
  EXPECT(!strcmp(ferry_escape("a\x1b]0;t\x07" "b\x7f\n", out, sizeof out),
                 "a\\x1b]0;t\\x07b\\x7f\\x0a"));
  EXPECT(!strcmp(ferry_escape("plain.name-1", out, sizeof out), "plain.name-1"));
  EXPECT(!strcmp(ferry_escape("\x1b\x1b", out, 6), "\\x1b")); /* cut whole, never half */
  EXPECT(!strcmp(ferry_escape(NULL, out, sizeof out), ""));
}

int main(void) {
  test_open();
  test_escape();
  return test_finish("test_untrusted");
}
