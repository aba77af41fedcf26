/* core/file.c — ferry_read_file and ferry_read_below of core/file.h: a
 * whole file into memory, opened through core/untrusted.h and bounded by
 * the caller's limit. */
#include "core/file.h"
#include "core/untrusted.h"

#include "ferry.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int ferry_read_fd(int fd, const char *shown, uint64_t size, size_t limit, char **text,
                  size_t *len, char *why, size_t wl) {
  char scratch[1];
  if (!why || !wl) why = scratch, wl = sizeof scratch;
  size_t cap = (size_t)size + 1, n = 0;
  char *buf = malloc(cap + 1);
  int rc = FERRY_OK;
  while (buf) {
    ssize_t r = read(fd, buf + n, cap - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      rc = FERRY_EIO;
      snprintf(why, wl, "%s: read error: %s", shown, strerror(errno));
      break;
    }
    n += (size_t)r;
    if (n > limit) {
      rc = FERRY_EOVERFLOW;
      snprintf(why, wl, "%s: larger than %zu bytes", shown, limit);
      break;
    }
    if (r == 0) break;
    if (n == cap) {
      char *t = realloc(buf, cap * 2 + 1);
      if (!t) free(buf);
      buf = t;
      cap *= 2;
    }
  }
  close(fd);
  if (!buf) {
    snprintf(why, wl, "%s: out of memory", shown);
    return FERRY_ENOMEM;
  }
  if (rc) {
    free(buf);
    return rc;
  }
  buf[n] = '\0';
  *text = buf;
  *len = n;
  return FERRY_OK;
}

int ferry_read_file(const char *path, size_t limit, char **text, size_t *len, char *why,
                    size_t wl) {
  char scratch[1];
  if (!why || !wl) why = scratch, wl = sizeof scratch;
  int fd;
  uint64_t size;
  int rc = ferry_open_named(path, limit, &fd, &size, why, wl);
  if (rc) return rc;
  return ferry_read_fd(fd, path, size, limit, text, len, why, wl);
}

int ferry_read_below(const char *root, const char *rel, size_t limit, char **text, size_t *len,
                     char *why, size_t wl) {
  char scratch[1], shown[4200];
  if (!why || !wl) why = scratch, wl = sizeof scratch;
  int fd;
  uint64_t size;
  int rc = root ? ferry_open_untrusted(root, rel, limit, &fd, &size, why, wl)
                : ferry_open_leaf(rel, limit, &fd, &size, why, wl);
  if (rc) return rc;
  snprintf(shown, sizeof shown, "%.2000s%s%.2000s", root ? root : "", root ? "/" : "", rel);
  return ferry_read_fd(fd, shown, size, limit, text, len, why, wl);
}
