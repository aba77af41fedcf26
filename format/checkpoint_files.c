/* format/checkpoint_files.c — a checkpoint's files and folders, with no
 * engine: errno to status, paths, fsync, removing a tree, a file's size and
 * CRC32C, the step-* folders newest first, and the rename that publishes a
 * folder (checkpoint_files.h).
 */
#include "format/checkpoint_files.h"
#include "core/crc32c.h"
#include "core/untrusted.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int ckpt_io_status(int err) {
  return err == ENOSPC || err == EDQUOT  ? FERRY_ENOSPC
         : err == EACCES || err == EPERM ? FERRY_EPERM
         : err == ENOENT                 ? FERRY_ENOENT
                                         : FERRY_EIO;
}

int ckpt_join(char *out, size_t cap, const char *a, const char *b) {
  int n = snprintf(out, cap, "%s/%s", a, b);
  return n < 0 || (size_t)n >= cap ? FERRY_EOVERFLOW : FERRY_OK;
}

int ckpt_fsync(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  int r = fsync(fd) ? -errno : 0;
  close(fd);
  return r;
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(p) ? -1 : 0;
}

void ckpt_rm_tree(const char *path) { nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

/* Size and CRC32C of the open fd, streamed; closes fd. */
static int crc_fd(int fd, const char *path, uint64_t *bytes, uint32_t *crc, char *why,
                  size_t wl) {
  char *buf = malloc(1u << 20);
  if (!buf) {
    close(fd);
    snprintf(why, wl, "%.400s: out of memory", path);
    return FERRY_ENOMEM;
  }
  uint32_t c = 0;
  uint64_t n = 0;
  int rc = FERRY_OK;
  for (;;) {
    ssize_t r = read(fd, buf, 1u << 20);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      snprintf(why, wl, "%.400s: read: %.300s", path, strerror(errno));
      rc = FERRY_EIO;
      break;
    }
    if (r == 0) break;
    c = ferry_crc32c(c, buf, (size_t)r);
    n += (uint64_t)r;
  }
  free(buf);
  close(fd);
  *bytes = n;
  *crc = c;
  return rc;
}

int ckpt_file_crc(const char *path, uint64_t *bytes, uint32_t *crc, char *why, size_t wl) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    snprintf(why, wl, "%.400s: %.300s", path, strerror(err));
    return ckpt_io_status(err);
  }
  return crc_fd(fd, path, bytes, crc, why, wl);
}

int ckpt_file_crc_at(const char *folder, const char *rel, uint64_t *size, uint64_t *bytes,
                     uint32_t *crc, char *why, size_t wl) {
  int fd;
  int rc = ferry_open_untrusted(folder, rel, FERRY_MAX_ANY, &fd, size, why, wl);
  if (rc) return rc == FERRY_EINVAL ? FERRY_ECORRUPT : rc;
  char p[4096];
  snprintf(p, sizeof p, "%.2000s/%.2000s", folder, rel);
  return crc_fd(fd, p, bytes, crc, why, wl);
}

int64_t ckpt_step_of(const char *name) {
  if (strncmp(name, CKPT_PREFIX, strlen(CKPT_PREFIX))) return -1;
  const char *d = name + strlen(CKPT_PREFIX);
  if (!*d || strlen(d) > 18) return -1;
  int64_t v = 0;
  for (; *d; d++) {
    if (*d < '0' || *d > '9') return -1;
    v = v * 10 + (*d - '0');
  }
  return v;
}

static int cmp_entry_desc(const void *a, const void *b) {
  const ckpt_entry *x = a, *y = b;
  return x->step < y->step ? 1 : x->step > y->step ? -1 : 0;
}

int ckpt_list(const char *root, ckpt_entry **out, size_t *n) {
  *out = NULL;
  *n = 0;
  DIR *d = opendir(root);
  if (!d) return -errno;
  size_t cap = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    int64_t s = ckpt_step_of(de->d_name);
    size_t len = strlen(de->d_name);
    if (s < 0 || len >= sizeof((ckpt_entry *)0)->name) continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 16;
      ckpt_entry *ne = realloc(*out, cap * sizeof *ne);
      if (!ne) {
        closedir(d);
        free(*out);
        *out = NULL;
        return -ENOMEM;
      }
      *out = ne;
    }
    (*out)[*n].step = s;
    memcpy((*out)[*n].name, de->d_name, len + 1); /* len < sizeof name */
    (*n)++;
  }
  closedir(d);
  if (*n) qsort(*out, *n, sizeof **out, cmp_entry_desc);
  return 0;
}

int ckpt_rename_into_place(const char *tmp, const char *target, const char *trash) {
  if (rename(tmp, target) == 0) return 0;
  if (errno != EEXIST && errno != ENOTEMPTY && errno != EISDIR) return -errno;
  if (renameat2(AT_FDCWD, tmp, AT_FDCWD, target, RENAME_EXCHANGE) == 0) {
    ckpt_rm_tree(tmp); /* holds the old one now */
    return 0;
  }
  if (rename(target, trash)) return -errno;
  if (rename(tmp, target)) {
    int err = errno;
    rename(trash, target);
    return -err;
  }
  ckpt_rm_tree(trash);
  return 0;
}
