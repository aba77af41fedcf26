/* format/config_file.c — a libconfig file someone else may have made,
 * read before libconfig sees it (config.h, cfg_read_checked): the file
 * through core/untrusted.h (a regular file of at most
 * FERRY_MAX_CONFIG_FILE bytes), and every @include in it, nested ones too,
 * checked the same way before libconfig opens it itself (libconfig 1.5 has
 * no hook for its includes), so no include is a FIFO, a device or too big.
 * /dev/null, named on purpose, is the empty config.
 */
#include "format/config.h"

#include "core/file.h"
#include "core/untrusted.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define CFG_INCLUDE_DEPTH 10 /* libconfig's own limit */

/* The quoted name after "@include" at p (the rest of its line) into out;
 * -1 when it is not a plain "..." string. */
static int include_name(const char *p, char *out, size_t cap) {
  while (*p == ' ' || *p == '\t') p++;
  if (*p++ != '"') return -1;
  size_t n = 0;
  for (; *p && *p != '"' && *p != '\n'; p++) {
    if (*p == '\\' && p[1] && p[1] != '\n') p++; /* \" and \\: the next byte as it is */
    if (n + 1 >= cap) return -1;
    out[n++] = *p;
  }
  out[n] = '\0';
  return *p == '"' && n ? 0 : -1;
}

static int check_includes(const char *text, const char *from, int depth, char *why, size_t wl);

/* One @include's target (relative to the current folder, as libconfig
 * opens it): absent is left to libconfig to report; otherwise a regular
 * file within the limit, whose own includes are checked in turn. */
static int check_one(const char *name, const char *from, int depth, char *why, size_t wl) {
  char *text = NULL;
  size_t len;
  if (depth >= CFG_INCLUDE_DEPTH) {
    snprintf(why, wl, "%s: @include \"%.200s\": includes nested deeper than %d", from, name,
             CFG_INCLUDE_DEPTH);
    return FERRY_ECONFIG;
  }
  if (access(name, F_OK) != 0) return FERRY_OK;
  char fw[1024];
  int rc = ferry_read_file(name, FERRY_MAX_CONFIG_FILE, &text, &len, fw, sizeof fw);
  if (rc) {
    snprintf(why, wl, "%s: @include refused: %s", from, fw);
    return rc == FERRY_ENOMEM ? rc : FERRY_ECONFIG;
  }
  rc = check_includes(text, name, depth + 1, why, wl);
  free(text);
  return rc;
}

/* Every line of text that starts (after blanks) with @include. */
static int check_includes(const char *text, const char *from, int depth, char *why, size_t wl) {
  for (const char *line = text; line && *line;) {
    const char *p = line;
    while (*p == ' ' || *p == '\t') p++;
    if (!strncmp(p, "@include", 8)) {
      char name[4096];
      if (include_name(p + 8, name, sizeof name)) {
        snprintf(why, wl, "%s: an @include not followed by a \"quoted file name\"", from);
        return FERRY_ECONFIG;
      }
      int rc = check_one(name, from, depth, why, wl);
      if (rc) return rc;
    }
    line = strchr(p, '\n');
    if (line) line++;
  }
  return FERRY_OK;
}

/* /dev/null, the empty config a user may name on purpose. */
static int is_dev_null(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISCHR(st.st_mode) && major(st.st_rdev) == 1 &&
         minor(st.st_rdev) == 3;
}

int cfg_read_checked(const char *path, char **text, char *why, size_t wl) {
  size_t len;
  if (is_dev_null(path)) return (*text = calloc(1, 1)) ? FERRY_OK : FERRY_ENOMEM;
  int rc = ferry_read_file(path, FERRY_MAX_CONFIG_FILE, text, &len, why, wl);
  if (rc) return rc == FERRY_EINVAL || rc == FERRY_EOVERFLOW ? FERRY_ECONFIG : rc;
  if (memchr(*text, '\0', len)) {
    snprintf(why, wl, "%s: holds a NUL byte (not a text file)", path);
    rc = FERRY_ECONFIG;
  }
  if (!rc) rc = check_includes(*text, path, 0, why, wl);
  if (rc) {
    free(*text);
    *text = NULL;
  }
  return rc;
}
