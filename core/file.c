/* core/file.c — ferry_read_file of core/file.h: a whole file into memory,
 * bounded by the caller's limit. */
#include "core/file.h"

#include "ferry.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ferry_read_file(const char *path, size_t limit, char **text, size_t *len, char *why,
                    size_t wl) {
  char scratch[1];
  if (!why || !wl) why = scratch, wl = sizeof scratch;
  FILE *f = fopen(path, "rb");
  if (!f) {
    int e = errno;
    snprintf(why, wl, "%s: cannot open: %s", path, strerror(e));
    return e == ENOENT ? FERRY_ENOENT : FERRY_EIO;
  }
  int rc = FERRY_OK;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap + 1);
  while (buf) {
    size_t r = fread(buf + n, 1, cap - n, f);
    n += r;
    if (n > limit) {
      rc = FERRY_EOVERFLOW;
      snprintf(why, wl, "%s: larger than %zu bytes", path, limit);
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
  if (!buf) {
    rc = FERRY_ENOMEM;
    snprintf(why, wl, "%s: out of memory", path);
  } else if (!rc && ferror(f)) {
    rc = FERRY_EIO;
    snprintf(why, wl, "%s: read error", path);
  }
  fclose(f);
  if (rc) {
    free(buf);
    return rc;
  }
  buf[n] = '\0';
  *text = buf;
  *len = n;
  return FERRY_OK;
}
