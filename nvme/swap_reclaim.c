/* nvme/swap_reclaim.c — what ferry left in a swap directory after its
 * process died, and the lock that makes telling that safe. A store's files
 * are anonymous (O_TMPFILE, or unlinked right after they are made) unless
 * keep_files names them; a named file is flock'ed by its store for as long
 * as the store lives. At open a store removes, in each of its directories,
 * the swap files nobody holds that no index keeps, the index temporaries
 * and probe files of dead processes, says what it removed, and remembers
 * what it could not (live owners, kept stores) for a later ENOSPC message.
 */
#include "nvme/swap_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

int swap_dir_lock(const char *dir, int shared) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  int r;
  do
    r = flock(fd, shared ? LOCK_SH : LOCK_EX);
  while (r != 0 && errno == EINTR);
  if (r != 0) { /* a file system without flock (some NFS): go on unguarded */
    close(fd);
    return -1;
  }
  return fd;
}

void swap_dir_unlock(int fd) {
  if (fd >= 0) close(fd); /* (the lock goes with it) */
}

/* Where the run of digits that ends at n[end] starts (end when none),
 * never before n[6] (after "ferry-"). */
static size_t digits_from(const char *n, size_t end) {
  size_t b = end;
  while (b > 6 && n[b - 1] >= '0' && n[b - 1] <= '9')
    b--;
  return b;
}

/* Parses "ferry-NAME-PID-SEQ-I.swap": *key_len gets the length of
 * "ferry-NAME-PID-SEQ", *pid the pid. 0 when the name is not one. */
static int parse_swap_name(const char *n, size_t *key_len, long *pid) {
  size_t len = strlen(n);
  if (len < 12 || strncmp(n, "ferry-", 6) || strcmp(n + len - 5, ".swap")) return 0;
  size_t end = len - 5; /* the three numbers before ".swap", '-' separated */
  long nums[3];
  for (int k = 2; k >= 0; k--) {
    size_t b = digits_from(n, end);
    if (b == end || b <= 6 || n[b - 1] != '-' || end - b > 18) return 0;
    nums[k] = strtol(n + b, NULL, 10);
    if (k == 2) *key_len = b - 1;
    end = b - 1;
  }
  *pid = nums[0];
  return *pid > 0 && end > 6; /* a NAME of at least one character */
}

/* The pid that starts a probe name (".ferry-probe-PID-...") or ends an
 * index temporary's key ("ferry-NAME-PID-SEQ.index.tmp"); 0 when none. */
static long leftover_pid(const char *n) {
  size_t pl = strlen(FERRY_PROBE_PREFIX);
  if (!strncmp(n, FERRY_PROBE_PREFIX, pl)) {
    char *end;
    long pid = strtol(n + pl, &end, 10);
    return end != n + pl && (*end == '-' || !*end) ? pid : 0;
  }
  size_t len = strlen(n);
  if (strncmp(n, "ferry-", 6) || len < 16 || strcmp(n + len - 10, ".index.tmp")) return 0;
  size_t e = len - 10, b = digits_from(n, e); /* SEQ */
  if (b == e || n[b - 1] != '-') return 0;
  e = b - 1; /* PID */
  b = digits_from(n, e);
  if (b == e || n[b - 1] != '-') return 0;
  return strtol(n + b, NULL, 10);
}

static int pid_alive(long pid) { return kill((pid_t)pid, 0) == 0 || errno == EPERM; }

/* Whether an index "KEY.index" of the store key (key_len bytes of name)
 * lies in dir or in one of s's directories: the store was kept on purpose. */
static int kept_by_index(const ferry_swap *s, const char *dir, const char *name, size_t key_len,
                         char *index, size_t cap) {
  for (int i = -1; i < s->npaths; i++) {
    const char *d = i < 0 ? dir : s->dirs[i];
    int n = snprintf(index, cap, "%s/%.*s.index", d, (int)key_len, name);
    struct stat st;
    if (n > 0 && (size_t)n < cap && stat(index, &st) == 0) return 1;
  }
  return 0;
}

typedef struct {
  char text[1536]; /* names, for the log line or the ENOSPC message */
  size_t len;
  unsigned count, listed;
  uint64_t bytes;
} name_list;

static void list_add(name_list *l, const char *name, const char *extra) {
  l->count++;
  if (l->len >= sizeof l->text - 64) return;
  int n = snprintf(l->text + l->len, sizeof l->text - l->len, "%s%s%s", l->len ? ", " : "", name,
                   extra);
  if (n > 0 && l->len + (size_t)n < sizeof l->text - 64) {
    l->len += (size_t)n;
    l->listed++;
  } else {
    l->text[l->len] = 0;
  }
}

static void list_end(name_list *l) {
  if (l->count > l->listed)
    snprintf(l->text + l->len, sizeof l->text - l->len, "%sand %u more", l->len ? ", " : "",
             l->count - l->listed);
}

/* One directory entry: reclaimed (into gone), or left (into left) with why. */
static void consider(ferry_swap *s, const char *dir, const char *name, name_list *gone,
                     name_list *left) {
  char path[2300], why[1300], idx[1100], size[32];
  if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) return;
  size_t key_len = 0;
  long pid = leftover_pid(name);
  if (pid > 0) { /* a probe file or an index temporary: small; its pid tells */
    if (pid == (long)getpid() || pid_alive(pid)) return;
    if (unlink(path) == 0) list_add(gone, name, "");
    return;
  }
  if (!parse_swap_name(name, &key_len, &pid)) return;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return;
  }
  ferry_format_size((uint64_t)st.st_blocks * 512, size, sizeof size);
  /* its store is alive: it holds the lock, or (a store that takes none: an
   * older ferry's) the process its name names still runs */
  if (flock(fd, LOCK_EX | LOCK_NB) != 0 || (pid != (long)getpid() && pid_alive(pid))) {
    snprintf(why, sizeof why, " (%s, in use by process %ld)", size, pid);
    list_add(left, path, why);
    left->bytes += (uint64_t)st.st_blocks * 512;
  } else if (kept_by_index(s, dir, name, key_len, idx, sizeof idx)) {
    snprintf(why, sizeof why, " (%s, kept with tiers.nvme.keep_files: index %s)", size, idx);
    list_add(left, path, why);
    left->bytes += (uint64_t)st.st_blocks * 512;
  } else if (unlink(path) == 0) { /* no owner holds it, no index keeps it */
    snprintf(why, sizeof why, " (%s, process %ld)", size, pid);
    list_add(gone, name, why);
    gone->bytes += (uint64_t)st.st_blocks * 512;
    s->reclaimed_files++;
    s->reclaimed_bytes += (uint64_t)st.st_blocks * 512;
  }
  close(fd);
}

void swap_reclaim_dirs(ferry_swap *s) {
  for (int i = 0; i < s->npaths; i++) {
    int dup = 0;
    for (int j = 0; j < i; j++)
      dup |= !strcmp(s->dirs[i], s->dirs[j]);
    if (dup) continue;
    int lk = swap_dir_lock(s->dirs[i], 0); /* no store is between create and flock */
    DIR *d = opendir(s->dirs[i]);
    if (!d) {
      swap_dir_unlock(lk);
      continue; /* the probe says why */
    }
    name_list gone = {0}, left = {0};
    struct dirent *de;
    while ((de = readdir(d)))
      consider(s, s->dirs[i], de->d_name, &gone, &left);
    closedir(d);
    swap_dir_unlock(lk);
    if (gone.count) {
      char b[32];
      list_end(&gone);
      ferry_logf(&s->log, FERRY_LOG_WARN,
                 "swap '%s': removed %u file(s) (%s) that ferry processes no longer running left "
                 "in %s: %s",
                 s->name, gone.count, ferry_format_size(gone.bytes, b, sizeof b), s->dirs[i],
                 gone.text);
    }
    if (left.count) {
      list_end(&left);
      free(s->stale[i]);
      s->stale[i] = strdup(left.text);
    }
  }
}

const char *swap_stale_of(const ferry_swap *s, int i) { return s->stale[i] ? s->stale[i] : ""; }
