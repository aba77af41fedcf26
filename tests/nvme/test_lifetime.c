/* tests/nvme/test_lifetime.c — swap files do not outlive their process
 * (issue 25, item 1). A child opens a store, writes a chunk and is killed
 * with SIGKILL, then with SIGINT (default disposition): a store's files
 * have no name, so the directory never holds one. With keep_files the
 * child's named file is locked while it lives (another store leaves it,
 * and a failing free-space check names it), and after its death the next
 * store removes it and says so. A store closed cleanly with keep_files
 * (its index written) is kept; probe files and index temporaries of dead
 * processes are removed.
 */
#include "nvme_test.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <sys/wait.h>

typedef struct {
  char all[8192];
} log_cap;

static void capture(void *user, int level, const char *msg) {
  log_cap *c = user;
  size_t n = strlen(c->all);
  if (level <= FERRY_LOG_WARN) snprintf(c->all + n, sizeof c->all - n, "%s\n", msg);
}

static ferry_swap_config cfg_in(const char *dir, int keep, log_cap *cap) {
  ferry_swap_config c = ferry_swap_config_default();
  c.paths[0] = dir;
  c.npaths = 1;
  c.slot_size = 1 << 20;
  c.nslots = 4;
  c.spare_slots = 1;
  c.keep_files = keep;
  c.name = "life";
  if (cap) c.log = (ferry_logger){capture, cap, FERRY_LOG_DEBUG};
  return c;
}

/* Entries of dir named "ferry-*.swap"; the last one's name into last. */
static int swap_files(const char *dir, char *last, size_t cap) {
  DIR *d = opendir(dir);
  REQUIRE(d);
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    size_t len = strlen(de->d_name);
    if (strncmp(de->d_name, "ferry-", 6) || len < 5 || strcmp(de->d_name + len - 5, ".swap"))
      continue;
    n++;
    if (last) snprintf(last, cap, "%s", de->d_name);
  }
  closedir(d);
  return n;
}

/* A child that opens a store in dir, writes chunk 0 and tells the parent
 * (a byte on the pipe); then it waits to be killed, or with close_clean
 * closes the store and exits 0. */
static pid_t spawn(const char *dir, int keep, int close_clean) {
  int p[2];
  REQUIRE(pipe(p) == 0);
  fflush(stdout);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(p[0]);
    ferry_swap_config c = cfg_in(dir, keep, NULL);
    ferry_swap *s = NULL;
    if (ferry_swap_open(&c, &s) != FERRY_OK) _exit(3);
    unsigned char *buf = nt_alloc(1 << 20);
    nt_fill(buf, 1 << 20, 5);
    ferry_swap_req r;
    if (ferry_swap_write(s, 0, buf, 1 << 20, &r, NULL, NULL) || ferry_swap_wait(&r)) _exit(4);
    if (close_clean) {
      ferry_swap_close(s);
      _exit(0);
    }
    char b = 1;
    if (write(p[1], &b, 1) != 1) _exit(5);
    for (;;)
      pause();
  }
  close(p[1]);
  char b;
  if (!close_clean) REQUIRE(read(p[0], &b, 1) == 1);
  close(p[0]);
  return pid;
}

static void kill_wait(pid_t pid, int sig) {
  REQUIRE(kill(pid, sig) == 0);
  int st;
  REQUIRE(waitpid(pid, &st, 0) == pid);
  EXPECT(WIFSIGNALED(st) && WTERMSIG(st) == sig);
}

/* The kernel lets go of a dead process's io_uring files (and their locks)
 * shortly after it is reaped: wait until the lock of path is free. */
static void wait_unlocked(const char *path) {
  for (int i = 0; i < 500; i++) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return;
    int free_now = flock(fd, LOCK_EX | LOCK_NB) == 0;
    close(fd);
    if (free_now) return;
    usleep(10000);
  }
}

/* Opens and closes a store in dir (its log into cap); what it removed. */
static ferry_swap_info open_close(const char *dir, log_cap *cap) {
  memset(cap, 0, sizeof *cap);
  ferry_swap_config c = cfg_in(dir, 0, cap);
  ferry_swap *s = NULL;
  REQUIRE(ferry_swap_open(&c, &s) == FERRY_OK);
  ferry_swap_info in;
  REQUIRE(ferry_swap_get_info(s, &in) == FERRY_OK);
  ferry_swap_close(s);
  printf("log: %s", cap->all);
  return in;
}

/* A store too large for the file system: FERRY_ENOSPC; its message. */
static void enospc_message(const char *dir, char *msg, size_t cap) {
  struct statvfs sv;
  REQUIRE(statvfs(dir, &sv) == 0);
  uint64_t free_b = (uint64_t)sv.f_bavail * sv.f_frsize;
  ferry_swap_config c = cfg_in(dir, 0, NULL);
  c.slot_size = 1u << 30;
  c.nslots = (uint32_t)(free_b >> 30) + 2;
  ferry_swap *s = NULL;
  EXPECT_EQ_INT(ferry_swap_open(&c, &s), FERRY_ENOSPC);
  snprintf(msg, cap, "%s", ferry_last_error());
  if (s) ferry_swap_close(s);
}

int main(int argc, char **argv) {
  char dir[1024], name[512], path[1600], msg[8192];
  nt_setup(argc, argv, "lifetime", dir, sizeof dir);
  static const int sigs[2] = {SIGKILL, SIGINT};

  /* 1. a store's files have no name: nothing to leave behind */
  for (int k = 0; k < 2; k++) {
    pid_t pid = spawn(dir, 0, 0);
    EXPECT_EQ_INT(swap_files(dir, NULL, 0), 0);
    kill_wait(pid, sigs[k]);
    EXPECT_EQ_INT(swap_files(dir, NULL, 0), 0);
    EXPECT_EQ_INT(nt_count_files(dir), 0);
  }

  /* 2. kept files: locked while their process lives, removed after */
  for (int k = 0; k < 2; k++) {
    pid_t pid = spawn(dir, 1, 0);
    EXPECT_EQ_INT(swap_files(dir, name, sizeof name), 1);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    log_cap cap;
    EXPECT_EQ_INT((int)open_close(dir, &cap).reclaimed_files, 0); /* alive: left alone */
    EXPECT_EQ_INT(swap_files(dir, NULL, 0), 1);
    enospc_message(dir, msg, sizeof msg);
    printf("ENOSPC: %s\n", msg);
    char who[64];
    snprintf(who, sizeof who, "in use by process %ld", (long)pid);
    EXPECT(strstr(msg, name) != NULL && strstr(msg, who) != NULL);

    kill_wait(pid, sigs[k]);
    wait_unlocked(path);
    ferry_swap_info in = open_close(dir, &cap);
    EXPECT_EQ_INT((int)in.reclaimed_files, 1);
    EXPECT(in.reclaimed_bytes > 0);
    EXPECT(strstr(cap.all, "removed 1 file(s)") != NULL && strstr(cap.all, name) != NULL);
    EXPECT_EQ_INT(nt_count_files(dir), 0);
  }

  /* 3. a store closed with keep_files (its index written) is kept */
  {
    pid_t pid = spawn(dir, 1, 1);
    int st;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    EXPECT_EQ_INT(swap_files(dir, name, sizeof name), 1);
    log_cap cap;
    EXPECT_EQ_INT((int)open_close(dir, &cap).reclaimed_files, 0);
    EXPECT_EQ_INT(swap_files(dir, NULL, 0), 1);
    enospc_message(dir, msg, sizeof msg);
    EXPECT(strstr(msg, name) != NULL && strstr(msg, "kept with tiers.nvme.keep_files") != NULL);
    /* and it reopens, whole */
    char index[1600];
    name[strlen(name) - strlen("-0.swap")] = 0; /* ferry-life-PID-SEQ */
    snprintf(index, sizeof index, "%s/%s.index", dir, name);
    ferry_swap_config rc = ferry_swap_config_default();
    rc.name = "life";
    ferry_swap *s = NULL;
    REQUIRE(ferry_swap_reopen(&rc, index, &s) == FERRY_OK);
    EXPECT_EQ_INT((int)ferry_swap_chunk_len(s, 0), 1 << 20);
    EXPECT_EQ_INT(nt_count_files(dir), 1); /* the index is consumed */
    ferry_swap_close(s);                   /* keep_files off: removed */
    EXPECT_EQ_INT(nt_count_files(dir), 0);
  }

  /* 4. probe files and index temporaries of dead processes */
  {
    pid_t dead = fork();
    REQUIRE(dead >= 0);
    if (dead == 0) _exit(0);
    REQUIRE(waitpid(dead, NULL, 0) == dead);
    char a[1600], b[1600];
    snprintf(a, sizeof a, "%s/.ferry-probe-%ld-0-1f", dir, (long)dead);
    snprintf(b, sizeof b, "%s/ferry-life-%ld-3.index.tmp", dir, (long)dead);
    for (int i = 0; i < 2; i++) {
      FILE *f = fopen(i ? b : a, "w");
      REQUIRE(f);
      fclose(f);
    }
    log_cap cap;
    EXPECT_EQ_INT((int)open_close(dir, &cap).reclaimed_files, 0); /* (swap files only) */
    EXPECT(strstr(cap.all, ".ferry-probe-") != NULL && strstr(cap.all, ".index.tmp") != NULL);
    EXPECT_EQ_INT(nt_count_files(dir), 0);
  }
  nt_cleanup(dir, 0);
  return test_finish("nvme.lifetime");
}
