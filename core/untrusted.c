/* core/untrusted.c — core/untrusted.h: opening a file someone else may
 * have made (component by component, no link, no FIFO or device, a size
 * limit), and escaping the names such files carry before they are shown.
 */
#include "core/untrusted.h"

#include "ferry.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int sys_status(int e) {
  return e == ENOENT ? FERRY_ENOENT : e == EACCES || e == EPERM ? FERRY_EPERM : FERRY_EIO;
}

static const char *kind_of(mode_t m) {
  return S_ISLNK(m) ? "a symbolic link (ferry follows no link below the folder it is given)"
         : S_ISFIFO(m) ? "a FIFO, not a regular file"
         : S_ISCHR(m) || S_ISBLK(m) ? "a device, not a regular file"
         : S_ISDIR(m) ? "a folder, not a regular file"
         : S_ISSOCK(m) ? "a socket, not a regular file"
                       : "not a regular file";
}

/* Opens name in the folder dfd (following it only when follow): looked at
 * through O_PATH first, so a FIFO or a device is never opened; then opened
 * for reading without blocking and checked to be the same regular file. */
static int open_leaf(int dfd, const char *name, int follow, const char *shown, uint64_t max,
                     int *fd, uint64_t *size, char *why, size_t wl) {
  int nf = follow ? 0 : O_NOFOLLOW;
  struct stat a, b;
  int pfd = openat(dfd, name, O_PATH | O_CLOEXEC | nf);
  if (pfd < 0) {
    int e = errno;
    snprintf(why, wl, "%s: cannot open: %s", shown, strerror(e));
    return sys_status(e);
  }
  int r = fstat(pfd, &a);
  close(pfd);
  if (r) {
    snprintf(why, wl, "%s: fstat: %s", shown, strerror(errno));
    return FERRY_EIO;
  }
  if (!S_ISREG(a.st_mode)) {
    snprintf(why, wl, "%s: %s", shown, kind_of(a.st_mode));
    return FERRY_EINVAL;
  }
  if ((uint64_t)a.st_size > max) {
    snprintf(why, wl, "%s: larger than %llu bytes (it holds %llu; the limit for a file of its "
             "kind)", shown, (unsigned long long)max, (unsigned long long)a.st_size);
    return FERRY_EOVERFLOW;
  }
  int f = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | nf);
  if (f < 0) {
    int e = errno;
    snprintf(why, wl, "%s: cannot open: %s", shown, strerror(e));
    return sys_status(e);
  }
  if (fstat(f, &b) || !S_ISREG(b.st_mode) || b.st_dev != a.st_dev || b.st_ino != a.st_ino) {
    close(f);
    snprintf(why, wl, "%s: replaced while it was opened", shown);
    return FERRY_EINVAL;
  }
  int fl = fcntl(f, F_GETFL);
  if (fl >= 0) fcntl(f, F_SETFL, fl & ~O_NONBLOCK);
  *fd = f;
  if (size) *size = (uint64_t)b.st_size;
  return FERRY_OK;
}

int ferry_open_untrusted(const char *root, const char *rel, uint64_t max, int *fd,
                         uint64_t *size, char *why, size_t wl) {
  char scratch[1], shown[4200];
  if (!why || !wl) why = scratch, wl = sizeof scratch;
  if (!root) root = ".";
  if (!rel) rel = "";
  snprintf(shown, sizeof shown, "%.2000s/%.2000s", root, rel);
  size_t rl = strlen(rel);
  char *path = malloc(rl + 1);
  if (!path) {
    snprintf(why, wl, "%s: out of memory", shown);
    return FERRY_ENOMEM;
  }
  memcpy(path, rel, rl + 1);
  int dfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
  int rc = FERRY_OK;
  if (dfd < 0) {
    int e = errno;
    snprintf(why, wl, "%.2000s: cannot open the folder: %s", root, strerror(e));
    rc = sys_status(e);
  }
  char *comp = path;
  while (!rc) {
    char *slash = strchr(comp, '/');
    if (slash) *slash = '\0';
    if (!comp[0] || !strcmp(comp, ".") || !strcmp(comp, "..")) {
      snprintf(why, wl, "%s: \"%.200s\" is not a plain name (no absolute path, empty, \".\" or "
               "\"..\" component below the folder)", shown, comp);
      rc = FERRY_EINVAL;
      break;
    }
    if (!slash) {
      rc = open_leaf(dfd, comp, 0, shown, max, fd, size, why, wl);
      break;
    }
    int next = openat(dfd, comp, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (next < 0) {
      int e = errno;
      snprintf(why, wl, "%s: %.200s: %s", shown, comp, strerror(e));
      rc = sys_status(e);
    } else if (fstat(next, &st)) {
      snprintf(why, wl, "%s: %.200s: fstat: %s", shown, comp, strerror(errno));
      rc = FERRY_EIO;
      close(next);
    } else if (!S_ISDIR(st.st_mode)) {
      snprintf(why, wl, "%s: %.200s is %s", shown, comp,
               S_ISLNK(st.st_mode) ? "a symbolic link (ferry follows no link below the folder "
                                     "it is given)"
                                   : "not a folder");
      rc = FERRY_EINVAL;
      close(next);
    } else {
      close(dfd);
      dfd = next;
      comp = slash + 1;
    }
  }
  if (dfd >= 0) close(dfd);
  free(path);
  return rc;
}

int ferry_open_named(const char *path, uint64_t max, int *fd, uint64_t *size, char *why,
                     size_t wl) {
  char scratch[1];
  if (!why || !wl) why = scratch, wl = sizeof scratch;
  return open_leaf(AT_FDCWD, path, 1, path, max, fd, size, why, wl);
}

int ferry_open_leaf(const char *path, uint64_t max, int *fd, uint64_t *size, char *why,
                    size_t wl) {
  const char *slash = strrchr(path, '/');
  if (!slash) return ferry_open_untrusted(NULL, path, max, fd, size, why, wl);
  size_t dl = slash == path ? 1 : (size_t)(slash - path);
  char *dir = malloc(dl + 1);
  if (!dir) {
    if (why && wl) snprintf(why, wl, "%s: out of memory", path);
    return FERRY_ENOMEM;
  }
  memcpy(dir, path, dl);
  dir[dl] = '\0';
  int rc = ferry_open_untrusted(dir, slash + 1, max, fd, size, why, wl);
  free(dir);
  return rc;
}

char *ferry_escape(const char *s, char *out, size_t cap) {
  static const char hex[] = "0123456789abcdef";
  size_t n = 0;
  if (!cap) return out;
  for (; s && *s; s++) {
    unsigned char c = (unsigned char)*s;
    int ctl = c < 0x20 || c == 0x7f;
    size_t need = ctl ? 4 : 1;
    if (n + need >= cap) break;
    if (ctl) {
      out[n++] = '\\', out[n++] = 'x', out[n++] = hex[c >> 4], out[n++] = hex[c & 15];
    } else {
      out[n++] = (char)c;
    }
  }
  out[n] = '\0';
  return out;
}
