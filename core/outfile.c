/* core/outfile.c — ferry_outfile of core/outfile.h: user-visible files
 * replaced whole (temporary beside the target, fsync, rename, fsync of the
 * folder), and the check of stdout at exit. */
#include "core/outfile.h"

#include "ferry.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

int ferry_outfile_status(int err) {
  return err == ENOSPC || err == EDQUOT || err == EFBIG ? FERRY_ENOSPC
         : err == EACCES || err == EPERM || err == EROFS ? FERRY_EPERM
         : err == ENOENT                                 ? FERRY_ENOENT
         : err == ENOMEM                                 ? FERRY_ENOMEM
                                                         : FERRY_EIO;
}

const char *ferry_outfile_reason(int err, char *buf, size_t n) {
  struct rlimit rl;
  if (err == EFBIG && getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    snprintf(buf, n, "%s: the file size limit (RLIMIT_FSIZE, `ulimit -f`) is %llu bytes",
             strerror(err), (unsigned long long)rl.rlim_cur);
  else snprintf(buf, n, "%s", strerror(err));
  return buf;
}

/* "path: what: reason" into why; returns the status of err. */
static int fail(char *why, size_t wl, const char *path, const char *what, int err) {
  char r[200];
  if (why && wl)
    snprintf(why, wl, "%s: %s: %s", path, what, ferry_outfile_reason(err, r, sizeof r));
  return ferry_outfile_status(err);
}

/* The folder of path ("." when it has none), freshly allocated. */
static char *folder_of(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return strdup(".");
  if (slash == path) return strdup("/");
  return strndup(path, (size_t)(slash - path));
}

/* Removes the temporaries of base in folder left by processes that are
 * gone (killed while writing): ".BASE.tmp-PID-SEQ" with PID dead. */
static void remove_dead_temporaries(const char *folder, const char *base) {
  DIR *d = opendir(folder);
  if (!d) return;
  size_t bl = strlen(base);
  struct dirent *e;
  while ((e = readdir(d))) {
    const char *n = e->d_name;
    if (n[0] != '.' || strncmp(n + 1, base, bl) || strncmp(n + 1 + bl, ".tmp-", 5)) continue;
    char *end;
    long pid = strtol(n + bl + 6, &end, 10);
    if (pid <= 0 || *end != '-' || pid == (long)getpid()) continue;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) unlinkat(dirfd(d), n, 0);
  }
  closedir(d);
}

int ferry_outfile_open(ferry_outfile *o, const char *path, char *why, size_t wl) {
  static atomic_uint seq;
  memset(o, 0, sizeof *o);
  o->fd = -1;
  if (!path || !path[0]) {
    if (why && wl) snprintf(why, wl, "no path to write");
    return FERRY_EINVAL;
  }
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  if (!base[0]) {
    if (why && wl) snprintf(why, wl, "%s: a folder, not a file", path);
    return FERRY_EINVAL;
  }
  size_t cap = strlen(path) + 48;
  o->path = strdup(path);
  o->tmp = malloc(cap);
  if (!o->path || !o->tmp) {
    ferry_outfile_abort(o);
    if (why && wl) snprintf(why, wl, "%s: out of memory", path);
    return FERRY_ENOMEM;
  }
  char *folder = folder_of(path);
  if (folder) remove_dead_temporaries(folder, base);
  free(folder);
  mode_t mode = 0666;
  struct stat st;
  if (lstat(path, &st) == 0 && S_ISREG(st.st_mode)) mode = st.st_mode & 07777;
  int err = EEXIST;
  for (int tries = 0; tries < 100 && err == EEXIST; tries++) {
    snprintf(o->tmp, cap, "%.*s.%s.tmp-%ld-%u", (int)(base - path), path, base, (long)getpid(),
             atomic_fetch_add(&seq, 1));
    o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    err = o->fd < 0 ? errno : 0;
  }
  if (err) {
    int rc = fail(why, wl, path, "cannot create a file beside it", err);
    free(o->tmp);
    o->tmp = NULL; /* nothing to remove */
    ferry_outfile_abort(o);
    return rc;
  }
  if (mode != 0666) (void)fchmod(o->fd, mode); /* keeps the old file's permissions */
  o->f = fdopen(o->fd, "w");
  if (!o->f) {
    int rc = fail(why, wl, path, "fdopen", errno);
    ferry_outfile_abort(o);
    return rc;
  }
  return FERRY_OK;
}

void ferry_outfile_abort(ferry_outfile *o) {
  if (o->f) fclose(o->f); /* closes fd */
  else if (o->tmp && o->fd >= 0) close(o->fd); /* a zeroed outfile's fd 0 is not its own */
  o->f = NULL;
  o->fd = -1;
  if (o->tmp) unlink(o->tmp);
  free(o->tmp);
  free(o->path);
  o->tmp = o->path = NULL;
}

int ferry_outfile_commit(ferry_outfile *o, char *why, size_t wl) {
  if (!o->tmp) {
    if (why && wl) snprintf(why, wl, "nothing to write (the file was not opened)");
    return FERRY_ESTATE;
  }
  int rc = FERRY_OK;
  errno = 0;
  if (fflush(o->f) != 0 || ferror(o->f))
    rc = fail(why, wl, o->path, "write", errno ? errno : EIO);
  if (!rc && fsync(o->fd) != 0) rc = fail(why, wl, o->path, "fsync", errno);
  int cr = fclose(o->f);
  int ce = errno;
  o->f = NULL;
  o->fd = -1;
  if (!rc && cr != 0) rc = fail(why, wl, o->path, "close", ce);
  if (!rc && rename(o->tmp, o->path) != 0) rc = fail(why, wl, o->path, "rename", errno);
  if (rc) {
    ferry_outfile_abort(o);
    return rc;
  }
  free(o->tmp);
  o->tmp = NULL;
  char *dir = folder_of(o->path);
  int dfd = dir ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
  if (dfd < 0 || fsync(dfd) != 0) {
    int e = dir ? errno : ENOMEM;
    /* the new file is in place; only its durability is in doubt */
    if (e != EINVAL && e != EROFS) rc = fail(why, wl, o->path, "fsync of its folder", e);
  }
  if (dfd >= 0) close(dfd);
  free(dir);
  free(o->path);
  o->path = NULL;
  return rc;
}

void ferry_program_start(void) {
  signal(SIGXFSZ, SIG_IGN);
  for (int fd = 0; fd <= 2; fd++)
    if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
      int n = open("/dev/null", O_RDONLY);
      if (n >= 0 && n != fd) close(n); /* a lower one was free: left as it was */
    }
}

int ferry_stdout_finish(char *why, size_t wl) {
  errno = 0;
  int bad = fflush(stdout) != 0 || ferror(stdout);
  int e = errno;
  if (fclose(stdout) != 0 && !bad) bad = 1, e = errno;
  if (!bad) return 0;
  char r[200];
  if (why && wl)
    snprintf(why, wl, "writing stdout failed (%s): the output is lost",
             e ? ferry_outfile_reason(e, r, sizeof r) : "a full disk, or a closed descriptor");
  return -1;
}
