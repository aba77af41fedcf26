/* tests/offload/test_checkpoint_lock.c — one writer per checkpoint folder
 * (issue 25, item 4): a save while another process holds DIR/.lock is
 * FERRY_EBUSY naming the folder and the holder's pid; a save removes the
 * .tmp-* folders of dead savers and keeps those of live ones; two
 * processes saving into one folder at once each get OK or FERRY_EBUSY,
 * never a destroyed save, and every checkpoint left verifies and loads.
 * argv[1]: a scratch folder.
 */
#include "tests/offload/ckpt_util.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>

#define P_RES "placement: { params = \"gpu\"; grads = \"gpu\"; optimizer = \"gpu\"; };"
#define SAVES 25

/* A child that holds the lock of `path` (made, with its pid, as a saver
 * does) until the parent writes to *release; returns its pid once held. */
static pid_t hold_lock(const char *path, int *release) {
  int ready[2], go[2];
  REQUIRE(pipe(ready) == 0 && pipe(go) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(ready[0]);
    close(go[1]); /* else the read below never sees the parent's close */
    int fd = open(path, O_RDWR | O_CREAT, 0644);
    if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB)) _exit(1);
    dprintf(fd, "%ld\n", (long)getpid());
    char c = 1;
    if (write(ready[1], &c, 1) != 1) _exit(1);
    if (read(go[0], &c, 1) < 0) _exit(1);
    _exit(0);
  }
  close(ready[1]);
  close(go[0]);
  char c;
  REQUIRE(read(ready[0], &c, 1) == 1);
  close(ready[0]);
  *release = go[1];
  return pid;
}

static void release_lock(pid_t pid, int release) {
  close(release);
  int st;
  REQUIRE(waitpid(pid, &st, 0) == pid);
  EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* A leftover temporary folder dir/name (a save's, by the protocol: .owner
 * inside). */
static void make_tmp(const char *dir, const char *name, int with_owner, char *path, size_t cap) {
  snprintf(path, cap, "%s/%s", dir, name);
  REQUIRE(mkdir(path, 0777) == 0);
  char f[2048];
  snprintf(f, sizeof f, "%s/model.safetensors", path);
  FILE *fp = fopen(f, "w");
  REQUIRE(fp);
  fputs("partial", fp);
  fclose(fp);
  if (with_owner) {
    snprintf(f, sizeof f, "%s/.owner", path);
    fp = fopen(f, "w");
    REQUIRE(fp);
    fclose(fp);
  }
}

static int exists(const char *p) {
  struct stat st;
  return stat(p, &st) == 0;
}

static void save_ok(ck_run *r, const char *dir, int64_t step) {
  ck_blob blob = {CK_MAGIC, step, 7};
  int rc = ferry_checkpoint_save(r->e, dir, &blob, sizeof blob, NULL);
  if (rc) fprintf(stderr, "save: %s\n", ferry_engine_last_error(r->e));
  EXPECT_EQ_INT(rc, FERRY_OK);
}

/* A saver of the race: trains and saves SAVES times (keep 2); exit 0 when
 * every save was OK or FERRY_EBUSY, 1 otherwise. */
static int racer(const char *dir, int start_fd, int id) {
  ck_run r;
  ck_open_dims(&r, "16M", P_RES, FERRY_DT_BF16, NULL, 4, 64);
  ferry_checkpoint_options o = ferry_checkpoint_options_default();
  o.keep = 2;
  char c;
  if (read(start_fd, &c, 1) < 0) return 1;
  int busy = 0, ok = 0;
  for (int i = 0; i < SAVES; i++) {
    double loss;
    if (ck_step(&r, (unsigned long long)i + 1, &loss)) return 1;
    ck_blob blob = {CK_MAGIC, i + 1, (uint64_t)id};
    int rc = ferry_checkpoint_save(r.e, dir, &blob, sizeof blob, &o);
    if (rc == FERRY_EBUSY) {
      busy++;
      if (!strstr(ferry_engine_last_error(r.e), dir)) {
        fprintf(stderr, "racer %d: EBUSY without the folder: %s\n", id,
                ferry_engine_last_error(r.e));
        return 1;
      }
    } else if (rc) {
      fprintf(stderr, "racer %d, save %d: %s\n", id, i, ferry_engine_last_error(r.e));
      return 1;
    } else {
      ok++;
    }
  }
  printf("racer %d: %d saved, %d refused as busy\n", id, ok, busy);
  fflush(stdout);
  ck_close(&r);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s SCRATCH\n", argv[0]);
    return 1;
  }
  ck_set_scratch(argv[1]);
  char dir[1400], lock[1500], p[2400];
  snprintf(dir, sizeof dir, "%s/lock-%ld", ck_scratch, (long)getpid());
  ck_rm(dir);
  REQUIRE(mkdir(dir, 0777) == 0);
  snprintf(lock, sizeof lock, "%s/.lock", dir);

  ck_run r;
  ck_open_dims(&r, "16M", P_RES, FERRY_DT_BF16, NULL, 4, 64);
  double loss;
  REQUIRE(ck_step(&r, 1, &loss) == 0);

  /* 1. another process holds the folder: FERRY_EBUSY naming it and the pid */
  int release;
  pid_t holder = hold_lock(lock, &release);
  ck_blob blob = {CK_MAGIC, 1, 7};
  int rc = ferry_checkpoint_save(r.e, dir, &blob, sizeof blob, NULL);
  const char *msg = ferry_engine_last_error(r.e);
  printf("busy: %s\n", msg);
  EXPECT_EQ_INT(rc, FERRY_EBUSY);
  char pid_text[64];
  snprintf(pid_text, sizeof pid_text, "process %ld", (long)holder);
  EXPECT(strstr(msg, dir) != NULL && strstr(msg, pid_text) != NULL);
  EXPECT_EQ_INT(ck_count_entries(dir, "step-"), 0);
  EXPECT_EQ_INT(ck_count_entries(dir, ".tmp-"), 0);
  release_lock(holder, release);
  save_ok(&r, dir, 1);
  EXPECT_EQ_INT(ck_count_entries(dir, "step-"), 1);

  /* 2. leftovers: a dead saver's (its .owner unlocked; or no .owner and a
   * dead pid in the name) go, a live one's (.owner locked; or no .owner
   * and a live pid) stay */
  pid_t dead = fork();
  REQUIRE(dead >= 0);
  if (dead == 0) _exit(0);
  REQUIRE(waitpid(dead, NULL, 0) == dead); /* reaped: its pid is free */
  char name[128], dead_owner[1600], dead_plain[1600], live_owner[1600], live_plain[1600];
  snprintf(name, sizeof name, ".tmp-step-000000000077-%ld", (long)dead);
  make_tmp(dir, name, 1, dead_owner, sizeof dead_owner);
  snprintf(name, sizeof name, ".tmp-step-000000000055-%ld", (long)dead);
  make_tmp(dir, name, 0, dead_plain, sizeof dead_plain);
  snprintf(name, sizeof name, ".tmp-step-000000000066-%ld", (long)getppid());
  make_tmp(dir, name, 0, live_plain, sizeof live_plain);
  snprintf(name, sizeof name, ".tmp-step-000000000088-%d", 424242);
  make_tmp(dir, name, 1, live_owner, sizeof live_owner);
  snprintf(p, sizeof p, "%s/.owner", live_owner);
  pid_t live = hold_lock(p, &release);
  REQUIRE(ck_step(&r, 2, &loss) == 0);
  save_ok(&r, dir, 2);
  EXPECT(!exists(dead_owner));
  EXPECT(!exists(dead_plain));
  EXPECT(exists(live_owner));
  EXPECT(exists(live_plain));
  release_lock(live, release); /* its owner is gone now */
  REQUIRE(ck_step(&r, 3, &loss) == 0);
  save_ok(&r, dir, 3);
  EXPECT(!exists(live_owner));
  EXPECT(exists(live_plain));
  ck_rm(live_plain);
  EXPECT_EQ_INT(ck_count_entries(dir, ".tmp-"), 0);
  snprintf(p, sizeof p, "%s/step-000000000003/.owner", dir);
  EXPECT(!exists(p));    /* the published folder holds no lock file */
  EXPECT(!exists(lock)); /* and the save let the folder go */
  ck_close(&r);

  /* 3. two processes saving into one folder at once */
  int start[2];
  REQUIRE(pipe(start) == 0);
  pid_t kids[2];
  for (int k = 0; k < 2; k++) {
    fflush(stdout);
    kids[k] = fork();
    REQUIRE(kids[k] >= 0);
    if (kids[k] == 0) {
      close(start[1]);
      _exit(racer(dir, start[0], k));
    }
  }
  close(start[0]);
  close(start[1]); /* both start */
  for (int k = 0; k < 2; k++) {
    int st;
    REQUIRE(waitpid(kids[k], &st, 0) == kids[k]);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  EXPECT_EQ_INT(ck_count_entries(dir, ".tmp-"), 0);
  EXPECT_EQ_INT(ck_count_entries(dir, ".trash-"), 0);
  EXPECT(ck_count_entries(dir, "step-") >= 1 && ck_count_entries(dir, "step-") <= 2);
  DIR *d = opendir(dir);
  REQUIRE(d);
  struct dirent *de;
  while ((de = readdir(d))) {
    if (strncmp(de->d_name, "step-", 5)) continue;
    snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
    ferry_checkpoint_info fi;
    rc = ferry_checkpoint_verify(p, &fi);
    if (rc) fprintf(stderr, "%s: %s\n", de->d_name, ferry_last_error());
    EXPECT_EQ_INT(rc, FERRY_OK);
    ck_open_dims(&r, "16M", P_RES, FERRY_DT_BF16, NULL, 4, 64);
    size_t len = 0;
    rc = ferry_checkpoint_load(r.e, p, &blob, sizeof blob, &len);
    if (rc) fprintf(stderr, "load %s: %s\n", p, ferry_engine_last_error(r.e));
    EXPECT(rc == 0 && len == sizeof blob && blob.magic == CK_MAGIC);
    ck_close(&r);
  }
  closedir(d);
  ck_rm(dir);
  return test_finish("offload.checkpoint_lock");
}
