/* nvme/probe.c — can this process use io_uring, and what does a directory
 * offer (file system, free space, O_DIRECT and its alignment)? Used by
 * ferry info and by the swap store before it opens its files.
 */
#include "core/core.h"
#include "nvme/nvme.h"

#include <errno.h>
#include <stdatomic.h>
#include <time.h>
#include <fcntl.h>
#include <liburing.h>
#include <linux/magic.h>
#include <linux/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <unistd.h>

static void say(char *why, size_t len, const char *fmt, const char *a, int e) {
  if (why && len) snprintf(why, len, fmt, a, strerror(e));
}

int ferry_io_uring_probe(char *why, size_t why_len) {
  struct io_uring ring;
  int rc = io_uring_queue_init(4, &ring, 0);
  if (rc < 0) {
    say(why, why_len, "%sio_uring_queue_init failed: %s", "", -rc);
    return rc == -ENOSYS || rc == -EPERM ? FERRY_ENOTSUP : FERRY_EIO;
  }
  struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
  io_uring_prep_nop(sqe);
  rc = io_uring_submit(&ring);
  struct io_uring_cqe *cqe = NULL;
  if (rc >= 0) rc = io_uring_wait_cqe(&ring, &cqe);
  if (rc >= 0 && cqe) {
    rc = cqe->res;
    io_uring_cqe_seen(&ring, cqe);
  }
  io_uring_queue_exit(&ring);
  if (rc < 0) {
    say(why, why_len, "%sio_uring NOP request failed: %s", "", -rc);
    return FERRY_EIO;
  }
  if (why && why_len) snprintf(why, why_len, "ok");
  return FERRY_OK;
}

static const char *fs_name(long type) {
  switch ((unsigned long)type) {
  case EXT4_SUPER_MAGIC: return "ext4";
  case 0x58465342UL: return "xfs";
  case BTRFS_SUPER_MAGIC: return "btrfs";
  case TMPFS_MAGIC: return "tmpfs";
  case RAMFS_MAGIC: return "ramfs";
  case 0x65735546UL: return "fuse";
  case NFS_SUPER_MAGIC: return "nfs";
  case OVERLAYFS_SUPER_MAGIC: return "overlayfs";
  case 0x2fc12fc1UL: return "zfs";
  case 0xf2f52010UL: return "f2fs";
  default: return "unknown";
  }
}

/* The logical block size of the block device behind st_dev, from sysfs (a
 * partition's queue is its parent's); 0 when unknown (tmpfs, NFS, ...). */
static size_t logical_block_size(dev_t dev) {
  static const char *const fmt[] = {"/sys/dev/block/%u:%u/queue/logical_block_size",
                                    "/sys/dev/block/%u:%u/../queue/logical_block_size"};
  for (int i = 0; i < 2; i++) {
    char p[128];
    snprintf(p, sizeof p, fmt[i], major(dev), minor(dev));
    FILE *f = fopen(p, "r");
    if (!f) continue;
    unsigned long v = 0;
    int ok = fscanf(f, "%lu", &v) == 1;
    fclose(f);
    if (ok && v >= 512 && v <= (1ul << 16) && (v & (v - 1)) == 0) return (size_t)v;
  }
  return 0;
}

/* 1 when the comma-separated option list opts holds discard or discard=... */
static int has_discard(const char *opts) {
  for (const char *p = opts; p && *p;) {
    size_t n = strcspn(p, ",");
    if ((n == 7 || (n > 7 && p[7] == '=')) && !strncmp(p, "discard", 7)) return 1;
    p += n + (p[n] == ',');
  }
  return 0;
}

/* mountinfo writes space, tab, newline and backslash as \ooo */
static void unescape_octal(char *s) {
  char *w = s;
  for (char *r = s; *r;) {
    if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] >= '0' && r[2] <= '7' && r[3] >= '0' &&
        r[3] <= '7') {
      *w++ = (char)((r[1] - '0') * 64 + (r[2] - '0') * 8 + (r[3] - '0'));
      r += 4;
    } else {
      *w++ = *r++;
    }
  }
  *w = 0;
}

/* Whether the mount holding dir (device dev) discards freed blocks: of
 * the /proc/self/mountinfo lines for dev, the one whose mount point is the
 * longest prefix of dir's real path decides, by its mount or super
 * options. -1 when no line matches or the file cannot be read. */
static int mount_discard(const char *dir, dev_t dev) {
  char real[4096];
  if (!realpath(dir, real)) return -1;
  const char *info = "/proc/self/mountinfo";
#if FERRY_FAULT_INJECTION
  /* Test hook (fault-injection builds only): read a made-up mountinfo. */
  const char *fake = getenv("FERRY_FAULT_MOUNTINFO");
  if (fake && fake[0]) info = fake;
#endif
  FILE *f = fopen(info, "r");
  if (!f) return -1;
  char line[8192];
  size_t best = 0;
  int found = -1;
  while (fgets(line, sizeof line, f)) {
    unsigned maj, min;
    char mnt[4096], opts[2048];
    if (sscanf(line, "%*s %*s %u:%u %*s %4095s %2047s", &maj, &min, mnt, opts) != 4) continue;
    if (makedev(maj, min) != dev) continue;
    const char *sep = strstr(line, " - ");
    char sopts[2048] = ""; /* after " - ": file system type, source, super options */
    if (sep) (void)sscanf(sep + 3, "%*s %*s %2047s", sopts);
    unescape_octal(mnt);
    size_t n = strlen(mnt);
    int prefix = !strcmp(mnt, "/") || (!strncmp(real, mnt, n) && (real[n] == '/' || !real[n]));
    if (!prefix || (found >= 0 && n < best)) continue;
    best = n;
    found = has_discard(opts) || has_discard(sopts);
  }
  fclose(f);
  return found;
}

static atomic_uint probe_seq; /* this process's probe files, for unique names */

/* Whether dir's file system takes O_DIRECT, and its alignments: makes a
 * probe file, opens it with O_DIRECT and writes one block (ferry_path_probe's
 * second half; dev is dir's device). */
static int probe_direct(const char *dir, dev_t dev, ferry_path_info *out, char *why,
                        size_t why_len) {
  /* A name no other prober can hold (pid, a per-process count, the time:
   * pids repeat across containers sharing a directory), created with
   * O_EXCL; swap_reclaim.c removes one whose process died mid-probe. */
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  char path[4096];
  snprintf(path, sizeof path, "%s/" FERRY_PROBE_PREFIX "%ld-%u-%lx", dir, (long)getpid(),
           atomic_fetch_add(&probe_seq, 1), (unsigned long)ts.tv_nsec);
  int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0600);
  int direct = 1;
#if FERRY_FAULT_INJECTION
  /* Test hook (fault-injection builds only): behave as a file system that
   * refuses O_DIRECT after creating the file (ramfs; tmpfs before Linux
   * 6.6): the file stays, the open fails with EINVAL. */
  const char *refuse = getenv("FERRY_FAULT_REFUSE_ODIRECT");
  if (fd >= 0 && refuse && refuse[0] && strcmp(refuse, "0") != 0) {
    close(fd);
    fd = -1;
    errno = EINVAL;
  }
#endif
  if (fd < 0 && errno == EINVAL) { /* the file system refuses O_DIRECT */
    direct = 0;
    /* Some create the file first and refuse at open. With O_EXCL an
     * existing file would have failed with EEXIST, and the name is ours
     * alone: a file there now is one this call created. */
    if (unlink(path) != 0 && errno != ENOENT) {
      int e = errno;
      say(why, why_len, "%s: cannot remove the probe file it made there: %s", dir, e);
      return e == EACCES || e == EPERM || e == EROFS ? FERRY_EPERM : FERRY_EIO;
    }
    fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  }
  if (fd < 0) {
    int e = errno;
    say(why, why_len, "%s: cannot create a file there: %s", dir, e);
    return e == EACCES || e == EPERM || e == EROFS ? FERRY_EPERM : FERRY_EIO;
  }
  unlink(path); /* the open descriptor is all the probe needs from here */
  size_t mem_align = 0, off_align = 0;
#ifdef STATX_DIOALIGN
  struct statx sx;
  if (syscall(SYS_statx, fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
      (sx.stx_mask & STATX_DIOALIGN) && sx.stx_dio_offset_align) {
    mem_align = sx.stx_dio_mem_align;
    off_align = sx.stx_dio_offset_align;
  }
#endif
  if (!off_align) off_align = logical_block_size(dev);
  if (!off_align) off_align = 4096; /* neither answer: the safe common value */
  if (!mem_align) mem_align = off_align;
  if (direct) { /* opening is not enough on some file systems: write once */
    void *buf = NULL;
    if (posix_memalign(&buf, 4096, off_align > 4096 ? off_align : 4096) == 0) {
      memset(buf, 0, off_align > 4096 ? off_align : 4096);
      if (pwrite(fd, buf, off_align, 0) != (ssize_t)off_align) direct = 0;
      free(buf);
    } else {
      direct = 0;
    }
  }
  close(fd);
  out->o_direct = direct;
  out->dio_mem_align = direct ? mem_align : 1;
  out->dio_offset_align = direct ? off_align : 1;
  if (why && why_len) snprintf(why, why_len, "ok");
  return FERRY_OK;
}

int ferry_path_probe(const char *dir, ferry_path_info *out, char *why, size_t why_len) {
  if (!dir || !out) return FERRY_EINVAL;
  memset(out, 0, sizeof *out);
  struct stat st;
  if (stat(dir, &st) != 0) {
    int e = errno;
    say(why, why_len, "%s: %s", dir, e);
    if (e == ENOENT || e == ENOTDIR) return FERRY_ENOENT;
    return e == EACCES || e == EPERM ? FERRY_EPERM : FERRY_EIO;
  }
  if (!S_ISDIR(st.st_mode)) {
    if (why && why_len) snprintf(why, why_len, "%s: not a directory", dir);
    return FERRY_EINVAL;
  }
  struct statfs sf;
  if (statfs(dir, &sf) == 0) snprintf(out->fs_type, sizeof out->fs_type, "%s", fs_name(sf.f_type));
  struct statvfs sv;
  if (statvfs(dir, &sv) == 0) {
    out->free_bytes = (uint64_t)sv.f_bavail * sv.f_frsize;
    out->total_bytes = (uint64_t)sv.f_blocks * sv.f_frsize;
  }
  out->online_discard = mount_discard(dir, st.st_dev);
  return probe_direct(dir, st.st_dev, out, why, why_len);
}
