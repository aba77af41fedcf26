/* tests/offload/test_checkpoint_kill.c — kill -9 while a checkpoint is
 * written: a child (this program exec'd as "saver") trains and saves into
 * one folder over and over (keep 2, the same step names each round, so
 * replacing and pruning are hit too); the parent kills it at random moments
 * (half the rounds as soon as a save is seen in progress) and then checks
 * that the newest checkpoint, and every one left, verifies
 * and loads. argv[1]: a scratch folder.
 */
#include "tests/offload/ckpt_util.h"

#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#define ROUNDS 12
#define KG 8
#define KD 96
#define P_RES "placement: { params = \"gpu\"; grads = \"gpu\"; optimizer = \"gpu\"; };"

static int saver_main(const char *dir) {
  ck_run r;
  ck_open_dims(&r, "16M", P_RES, FERRY_DT_BF16, NULL, KG, KD);
  ferry_checkpoint_options o = ferry_checkpoint_options_default();
  o.keep = 2;
  o.max_shard_bytes = 40000;
  for (int64_t step = 0;; step++) {
    double loss;
    if (ck_step(&r, (unsigned long long)step + 1, &loss)) return 1;
    ck_blob blob = {CK_MAGIC, step + 1, 7};
    if (ferry_checkpoint_save(r.e, dir, &blob, sizeof blob, &o)) {
      fprintf(stderr, "saver: %s\n", ferry_engine_last_error(r.e));
      return 1;
    }
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s SCRATCH [saver DIR]\n", argv[0]);
    return 1;
  }
  ck_set_scratch(argv[1]);
  if (argc == 4 && !strcmp(argv[2], "saver")) return saver_main(argv[3]);
  char self[1024], dir[1400];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  REQUIRE(n > 0);
  self[n] = 0;
  snprintf(dir, sizeof dir, "%s/kill", ck_scratch);
  ck_rm(dir);
  unsigned long long seed = (unsigned long long)time(NULL) * 2654435761u | 1;
  printf("seed %llu\n", seed);
  ck_run r; /* the loader, after the children: it checks each round */
  int mid_write = 0;
  for (int round = 0; round < ROUNDS; round++) {
    fflush(stdout);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      execl(self, self, ck_scratch, "saver", dir, (char *)NULL);
      _exit(127);
    }
    /* wait for a first checkpoint, then kill at a random moment */
    double t0 = now_s();
    while (ck_count_entries(dir, "step-") < 1 && now_s() - t0 < 20) usleep(2000);
    REQUIRE(ck_count_entries(dir, "step-") >= 1);
    /* even rounds kill at a random moment; odd rounds wait for a save in
     * progress (a .tmp- folder) and kill on sight, so some kills land
     * mid-write however slow the build (a sanitizer) makes training */
    if (round % 2 == 0) {
      usleep((useconds_t)(test_rand(&seed) % 150000));
    } else {
      usleep((useconds_t)(test_rand(&seed) % 20000));
      t0 = now_s();
      while (ck_count_entries(dir, ".tmp-") < 1 && now_s() - t0 < 20) usleep(100);
    }
    kill(pid, SIGKILL);
    int st;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    EXPECT(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    int tmp = ck_count_entries(dir, ".tmp-") + ck_count_entries(dir, ".trash-");
    mid_write += tmp > 0;
    ferry_checkpoint_info info;
    int rc = ferry_checkpoint_verify(dir, &info);
    if (rc) fprintf(stderr, "round %d: %s\n", round, ferry_last_error());
    EXPECT(rc == 0);
    /* every checkpoint folder left verifies */
    DIR *d = opendir(dir);
    REQUIRE(d);
    struct dirent *de;
    int folders = 0;
    while ((de = readdir(d))) {
      if (strncmp(de->d_name, "step-", 5)) continue;
      char p[2800];
      snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
      ferry_checkpoint_info fi;
      rc = ferry_checkpoint_verify(p, &fi);
      if (rc) fprintf(stderr, "round %d: %s: %s\n", round, de->d_name, ferry_last_error());
      EXPECT(rc == 0);
      folders++;
    }
    closedir(d);
    /* and the newest loads into an engine, blob and all */
    ck_open_dims(&r, "16M", P_RES, FERRY_DT_BF16, NULL, KG, KD);
    ck_blob blob;
    size_t len;
    rc = ferry_checkpoint_load(r.e, dir, &blob, sizeof blob, &len);
    if (rc) fprintf(stderr, "round %d: load: %s\n", round, ferry_engine_last_error(r.e));
    EXPECT(rc == 0 && len == sizeof blob && blob.magic == CK_MAGIC && blob.next_step == info.step);
    ck_close(&r);
    printf("round %2d: killed with %d partial folder(s) left; %d checkpoint(s), newest step %lld "
           "verifies and loads\n",
           round, tmp, folders, (long long)info.step);
  }
  printf("%d of %d kills landed while a checkpoint was being written\n", mid_write, ROUNDS);
  EXPECT(mid_write >= 1);
  return test_finish("test_checkpoint_kill");
}
