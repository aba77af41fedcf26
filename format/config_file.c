/* format/config_file.c — a libconfig file someone else may have made,
 * read before libconfig sees it (config.h, cfg_read_checked): the file
 * through core/untrusted.h (a regular file of at most
 * FERRY_MAX_CONFIG_FILE bytes), and every @include in it, nested ones too,
 * checked the same way before libconfig opens it itself (libconfig 1.5 has
 * no hook for its includes), so no include is a FIFO, a device or too big;
 * and no integer that libconfig 1.5 would read wrong (cfg_check_integers).
 * /dev/null, named on purpose, is the empty config.
 */
#include "format/config.h"

#include "core/file.h"
#include "core/untrusted.h"

#include <ctype.h>
#include <stdint.h>
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

/* ---- integers libconfig 1.5 reads in 32 bits ------------------------------
 * Its scanner keeps the low 32 bits of an integer written without an L
 * suffix, decimal or hex, and gives no error: chunk_size = 4294971392 (4 GiB
 * and 4 KiB) read as 4096, a host budget of 32 GiB in bytes as 0 (the
 * default). The text is walked as libconfig tokenizes it (strings, comments
 * and names skipped) and such an integer refused. */

/* Past the comment or string at p (p itself when none). */
static const char *skip_non_value(const char *p) {
  if (*p == '#' || (p[0] == '/' && p[1] == '/')) return p + strcspn(p, "\n");
  if (p[0] == '/' && p[1] == '*') {
    const char *e = strstr(p + 2, "*/");
    return e ? e + 2 : p + strlen(p);
  }
  if (*p == '"') {
    for (p++; *p && *p != '"'; p++)
      if (*p == '\\' && p[1]) p++;
    return *p ? p + 1 : p;
  }
  return p;
}

static int is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '_' || c == '-' || c == '*';
}

/* The number at p: its end in *end; 1 when it is an integer without an L
 * suffix outside libconfig's 32 bits (a decimal outside [-2^31, 2^31 - 1],
 * a hex above 0x7fffffff). */
static int wide_integer(const char *p, const char **end) {
  int neg = *p == '-';
  if (*p == '-' || *p == '+') p++;
  int hex = p[0] == '0' && (p[1] == 'x' || p[1] == 'X');
  const char *d = p + (hex ? 2 : 0), *q = d;
  uint64_t v = 0;
  int big = 0;
  for (; hex ? isxdigit((unsigned char)*q) : isdigit((unsigned char)*q); q++) {
    unsigned x = isdigit((unsigned char)*q) ? (unsigned)(*q - '0')
                                             : (unsigned)(tolower((unsigned char)*q) - 'a' + 10);
    if (v > (UINT64_MAX - x) / (hex ? 16 : 10)) big = 1;
    else v = v * (hex ? 16 : 10) + x;
  }
  if (!hex && (*q == '.' || *q == 'e' || *q == 'E')) { /* a float: no limit here */
    while (isdigit((unsigned char)*q) || *q == '.' || *q == 'e' || *q == 'E' ||
           ((*q == '-' || *q == '+') && (q[-1] == 'e' || q[-1] == 'E')))
      q++;
    *end = q;
    return 0;
  }
  int suffix = *q == 'L';
  while (*q == 'L') q++;
  *end = q;
  if (suffix || q == d) return 0;
  return big || v > (hex || !neg ? 0x7fffffffull : 0x80000000ull);
}

int cfg_check_integers(const char *text, const char *name, char *why, size_t wl) {
  int line = 1;
  for (const char *p = text; *p;) {
    const char *q = skip_non_value(p);
    if (q != p) {
      for (; p < q; p++) line += *p == '\n';
      continue;
    }
    if (isalpha((unsigned char)*p) || *p == '_' || *p == '*' || *p == '@') { /* a name */
      for (p++; is_name_char(*p); p++) {}
      continue;
    }
    int num = isdigit((unsigned char)*p) ||
              ((*p == '-' || *p == '+' || *p == '.') && isdigit((unsigned char)p[1]));
    if (!num) {
      line += *p++ == '\n';
      continue;
    }
    const char *e;
    if (wide_integer(p, &e)) {
      int n = (int)(e - p);
      snprintf(why, wl,
               "%s:%d: the integer %.*s is beyond 32 bits, where libconfig keeps an integer "
               "written without an L suffix (it would read another number); write %.*sL, or a "
               "size as a quoted string such as \"4G\"",
               name, line, n > 40 ? 40 : n, p, n > 40 ? 40 : n, p);
      return FERRY_ECONFIG;
    }
    p = e;
  }
  return FERRY_OK;
}

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
  rc = cfg_check_integers(text, name, why, wl);
  if (!rc) rc = check_includes(text, name, depth + 1, why, wl);
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
  if (!rc) rc = cfg_check_integers(*text, path, why, wl);
  if (!rc) rc = check_includes(*text, path, 0, why, wl);
  if (rc) {
    free(*text);
    *text = NULL;
  }
  return rc;
}
