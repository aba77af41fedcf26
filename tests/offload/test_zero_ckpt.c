/* tests/offload/test_zero_ckpt.c — checkpoints of an engine with ranks,
 * under `mpirun -np 2` (host backend): every rank writes its pieces into
 * the one checkpoint, which has the files of a one-rank checkpoint. Per
 * case (stages 0-3; host, optimizer or everything on NVMe, int8 states,
 * 16 KiB shards): a save at
 * step 2 by 2 ranks lists the same files, sizes and CRC32Cs as a one-rank
 * engine's fed the averaged grads (grads are multiples of 2^-10, so the
 * runs are equal bit for bit) and records ranks 2 and the stage; a fresh
 * 2-rank engine that loads it repeats steps 2-3 bit for bit; a one-rank
 * engine that loads it too (required within 1e-5); the one-rank checkpoint
 * loads on 2 ranks; a flipped byte in rank 1's piece is refused on both
 * ranks; a save whose writes fail on rank 1 only (RLIMIT_FSIZE) fails on
 * both and leaves the earlier checkpoint and no temporary folder.
 * argv[1]: a scratch folder; argv[2] (optional): run only that case.
 */
#include "ferry.h"
#include "tests/offload/engine_util.h"
#include "tests/test.h"

#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NRANKS 2
#define SAVE_AT 2
#define STEPS 4

static int rank;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static const char *scratch;

static const struct {
  const char *name;
  int64_t shape[2];
  int ndim, group;
} model[] = {
    {"w0", {2600, 0}, 1, 0}, {"w1", {30, 70}, 2, 0}, {"w2", {5000, 0}, 1, 1}, {"w3", {24, 0}, 1, 2}};
#define NPARAMS 4
#define NGROUPS 3
#define NTOTAL (2600 + 2100 + 5000 + 24)

static size_t numel(int p) {
  return (size_t)model[p].shape[0] * (model[p].ndim > 1 ? (size_t)model[p].shape[1] : 1);
}

static int init_fn(void *user, const char *name, float *dst, size_t n) {
  (void)user;
  for (size_t i = 0; i < n; i++) dst[i] = 0.05f * cosf(0.11f * (float)i + (float)name[1]);
  return 0;
}

/* Rank r's grad: k * 2^-10 with k in [-64, 64] (sums of two are exact). */
static float grad(int r, int step, int p, size_t i) {
  uint64_t x = (uint64_t)r * 0x9e3779b97f4a7c15ull ^ (uint64_t)step * 0xbf58476d1ce4e5b9ull ^
               (uint64_t)p * 0x94d049bb133111ebull ^ (uint64_t)i * 0x2545f4914f6cdd1dull;
  x ^= x >> 29;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 32;
  return (float)((int)(x % 129) - 64) * (1.0f / 1024.0f);
}

typedef struct {
  const char *name, *sets;
  int stage;
  int fail_save; /* the failing-save check (host homes only: a file size limit
                    would also stop the swap store's writes) */
  uint64_t shard; /* max_shard_bytes (0: the default, one file per part) */
} scase;

static const scase cases[] = {
    {"host", "", 0, 0, 0},
    {"host", "", 1, 1, 0},
    {"host", "", 2, 1, 0},
    {"host, 16 KiB shards", "", 2, 0, 16384},
    {"optimizer on nvme", "placement.optimizer=nvme", 1, 0, 0},
    {"optimizer on nvme", "placement.optimizer=nvme", 2, 0, 0},
    {"int8 states", "optimizer.state_dtype=int8", 2, 1, 0},
    {"int8 states, 16 KiB shards", "optimizer.state_dtype=int8", 1, 0, 16384},
    {"host", "", 3, 1, 0},
    {"everything on nvme", "placement.params=nvme,placement.grads=nvme,placement.optimizer=nvme", 3,
     0, 16384},
};
#define NCASES (int)(sizeof cases / sizeof cases[0])

static ferry_engine *engine(const scase *k, ferry_comm *comm, ferry_stream **s) {
  ferry_config *c = NULL;
  REQUIRE(ferry_config_create(&c) == 0);
  REQUIRE(ferry_config_load_string(c,
                                   "device = \"host\";\n"
                                   "tiers: { gpu: { budget = \"16M\"; }; host: { budget = \"64M\"; }; };\n"
                                   "placement: { params = \"host\"; grads = \"host\"; "
                                   "optimizer = \"host\"; };\n"
                                   "optimizer: { type = \"adamw\"; lr = 0.01; };\n",
                                   "ckpt.cfg") == 0);
  char sets[256], *save = NULL, v[16], dir[1200];
  snprintf(sets, sizeof sets, "%s", k->sets);
  for (char *kv = strtok_r(sets, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(kv, '=');
    REQUIRE(eq);
    *eq = 0;
    REQUIRE(ferry_config_set(c, kv, eq + 1) == 0);
  }
  snprintf(v, sizeof v, "%d", k->stage);
  REQUIRE(ferry_config_set(c, "dist.zero_stage", v) == 0);
  snprintf(dir, sizeof dir, "%.1000s/swap-%d-%s", scratch, rank, comm ? "dist" : "one");
  mkdir(dir, 0777);
  REQUIRE(ferry_config_set(c, "tiers.nvme.paths", dir) == 0);
  ferry_engine *e = NULL;
  REQUIRE(ferry_engine_create(c, NULL, &e) == 0);
  ferry_config_destroy(c);
  for (int p = 0; p < NPARAMS; p++)
    REQUIRE(ferry_param_register(e, model[p].name, model[p].shape, model[p].ndim, model[p].group,
                                 NULL, init_fn, NULL) == 0);
  if (comm) REQUIRE(ferry_engine_set_comm(e, comm) == 0);
  int rc = ferry_engine_finalize(e);
  if (rc) fprintf(stderr, "finalize: %s\n", ferry_engine_last_error(e));
  REQUIRE(rc == 0);
  REQUIRE(ferry_stream_create(ferry_engine_device(e), s) == 0);
  return e;
}

static void engine_done(ferry_engine *e, ferry_stream *s) {
  ferry_stream_destroy(s);
  ferry_engine_destroy(e);
}

/* Steps [from, to): this rank's grads, or (avg) both ranks' average. */
static void train(ferry_engine *e, ferry_stream *s, int from, int to, int avg) {
  static uint16_t g16[5000];
  for (int step = from; step < to; step++) {
    for (int g = 0; g < NGROUPS; g++) REQUIRE(ferry_fetch(e, g, s) == 0);
    for (int g = NGROUPS - 1; g >= 0; g--) {
      for (int p = 0; p < NPARAMS; p++) {
        if (model[p].group != g) continue;
        void *dg;
        REQUIRE(ferry_param_device(e, model[p].name, NULL, &dg) == 0);
        for (size_t i = 0; i < numel(p); i++) {
          float x = avg ? (grad(0, step, p, i) + grad(1, step, p, i)) * 0.5f : grad(rank, step, p, i);
          uint32_t b;
          memcpy(&b, &x, 4);
          g16[i] = (uint16_t)(b >> 16); /* bf16 params: exact */
        }
        REQUIRE(ferry_memcpy_async(s, dg, g16, numel(p) * 2, FERRY_COPY_H2D) == 0);
        REQUIRE(ferry_stream_synchronize(s) == 0);
      }
      REQUIRE(ferry_grads_ready(e, g, s) == 0);
      REQUIRE(ferry_release(e, g, s) == 0);
    }
    ferry_step_info info;
    int rc = ferry_step(e, &info);
    if (rc) fprintf(stderr, "step %d: %s\n", step, ferry_engine_last_error(e));
    REQUIRE(rc == 0);
  }
}

/* The fp32 masters (ferry_param_read: a collective with ranks). */
static void masters(ferry_engine *e, float *out) {
  size_t at = 0;
  for (int p = 0; p < NPARAMS; p++) {
    REQUIRE(ferry_param_read(e, model[p].name, out + at, numel(p)) == 0);
    at += numel(p);
  }
}

static double max_rel(const float *a, const float *b) {
  double m = 0;
  for (size_t i = 0; i < NTOTAL; i++) {
    double d = fabs((double)a[i] - b[i]) / fmax(fabs((double)b[i]), 1e-6);
    if (d > m) m = d;
  }
  return m;
}

/* A fresh engine (comm NULL: one rank, fed the averaged grads) loads dir
 * and takes steps SAVE_AT..STEPS-1; its masters into out. The load's
 * seconds. */
static double resumed(const scase *k, ferry_comm *comm, const char *dir, float *out) {
  ferry_stream *s;
  ferry_engine *e = engine(k, comm, &s);
  double t0 = now();
  int rc = ferry_checkpoint_load(e, dir, NULL, 0, NULL);
  double t = now() - t0;
  if (rc) fprintf(stderr, "rank %d: load %s: %s\n", rank, dir, ferry_engine_last_error(e));
  REQUIRE(rc == 0);
  train(e, s, SAVE_AT, STEPS, comm == NULL);
  masters(e, out);
  engine_done(e, s);
  return t;
}

/* The manifest of the newest checkpoint in dir, whole. */
static size_t manifest(const char *dir, char *buf, size_t cap) {
  char folder[1200], path[1300];
  REQUIRE(ferry_checkpoint_find(dir, folder, sizeof folder, NULL) == 0);
  snprintf(path, sizeof path, "%s/manifest", folder);
  FILE *f = fopen(path, "rb");
  REQUIRE(f);
  size_t n = fread(buf, 1, cap - 1, f);
  fclose(f);
  buf[n] = 0;
  return n;
}

/* Its "file ..." lines only. */
static void file_lines(const char *m, char *out, size_t cap) {
  out[0] = 0;
  for (const char *l = strstr(m, "\nfile "); l; l = strstr(l + 1, "\nfile ")) {
    const char *end = strchr(l + 1, '\n');
    strncat(out, l + 1, end ? (size_t)(end - l) : strlen(l + 1));
    if (strlen(out) + 300 > cap) break;
  }
}

/* Flips one byte near the end of the last optim file: of the last tensor
 * in data order, w3's, which rank 1 holds alone at stages 1 and 2 (w3 is
 * smaller than a piece's alignment). */
static void flip(const char *dir, uint64_t back) {
  char folder[1200], path[1600];
  REQUIRE(ferry_checkpoint_find(dir, folder, sizeof folder, NULL) == 0);
  /* model.safetensors, or the last shard */
  char last[256] = "", sub[1300];
  snprintf(sub, sizeof sub, "%s/optim", folder);
  DIR *d = opendir(sub);
  REQUIRE(d);
  struct dirent *de;
  while ((de = readdir(d))) {
    size_t n = strlen(de->d_name);
    if (n > 12 && n < sizeof last && !strcmp(de->d_name + n - 12, ".safetensors") &&
        strcmp(de->d_name, last) > 0)
      memcpy(last, de->d_name, n + 1);
  }
  closedir(d);
  REQUIRE(last[0]);
  snprintf(path, sizeof path, "%s/%s", sub, last);
  int fd = open(path, O_RDWR);
  REQUIRE(fd >= 0);
  struct stat st;
  REQUIRE(fstat(fd, &st) == 0);
  unsigned char b;
  REQUIRE(pread(fd, &b, 1, st.st_size - (off_t)back) == 1);
  b ^= 0x40;
  REQUIRE(pwrite(fd, &b, 1, st.st_size - (off_t)back) == 1);
  close(fd);
}

static int has_tmp(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  struct dirent *de;
  while (d && (de = readdir(d)))
    if (!strncmp(de->d_name, ".tmp-", 5)) n++;
  if (d) closedir(d);
  return n;
}

static int run_case(int ci, ferry_comm *comm) {
  const scase *k = &cases[ci];
  static float want[NTOTAL], got[NTOTAL], one[NTOTAL];
  static char m2[1 << 16], m1[1 << 16], f2[1 << 16], f1[1 << 16];
  char dd[1200], d1[1200];
  snprintf(dd, sizeof dd, "%.1000s/ck2-%d", scratch, ci);
  snprintf(d1, sizeof d1, "%.1000s/ck1-%d", scratch, ci);
  int bad = 0;
  ferry_stream *s, *s1;
  ferry_engine *a = engine(k, comm, &s), *b;
  train(a, s, 0, SAVE_AT, 0);
  double t0 = now();
  ferry_checkpoint_options o = ferry_checkpoint_options_default();
  o.max_shard_bytes = k->shard;
  int rc = ferry_checkpoint_save(a, dd, NULL, 0, &o);
  double t_save = now() - t0;
  if (rc) fprintf(stderr, "rank %d: save: %s\n", rank, ferry_engine_last_error(a));
  REQUIRE(rc == 0);
  if (rank == 0) { /* the same training on one rank, and its checkpoint */
    ferry_engine *r = engine(k, NULL, &s1);
    train(r, s1, 0, SAVE_AT, 1);
    REQUIRE(ferry_checkpoint_save(r, d1, NULL, 0, &o) == 0);
    engine_done(r, s1);
  }
  REQUIRE(ferry_comm_barrier(comm, NULL) == 0);
  /* one layout: the same files, sizes and CRCs as one rank's */
  manifest(dd, m2, sizeof m2);
  manifest(d1, m1, sizeof m1);
  char want_line[64];
  snprintf(want_line, sizeof want_line, "\nranks 2\nzero_stage %d\n", k->stage);
  EXPECT(strstr(m2, want_line) != NULL);
  EXPECT(strstr(m1, "\nranks 1\nzero_stage 0\n") != NULL);
  file_lines(m2, f2, sizeof f2);
  file_lines(m1, f1, sizeof f1);
  if (strcmp(f1, f2)) {
    fprintf(stderr, "rank %d: the files differ from one rank's:\n%s---\n%s", rank, f2, f1);
    bad++;
  }
  train(a, s, SAVE_AT, STEPS, 0);
  masters(a, want);
  /* 2 ranks -> 2 ranks: bit for bit */
  double t_load = resumed(k, comm, dd, got);
  if (memcmp(got, want, sizeof got)) fprintf(stderr, "rank %d: resumed on 2 ranks differs\n", rank), bad++;
  /* 2 ranks -> 1 rank (each rank alone, no communicator); 1 rank -> 2 */
  resumed(k, NULL, dd, one);
  double rel = max_rel(one, want);
  resumed(k, comm, d1, got);
  double rel12 = max_rel(got, want);
  int exact = !memcmp(one, want, sizeof one) && !memcmp(got, want, sizeof got);
  if (rel > 1e-5 || rel12 > 1e-5)
    fprintf(stderr, "rank %d: max relative difference 2 -> 1 %g, 1 -> 2 %g\n", rank, rel, rel12), bad++;
  /* a flipped byte of rank 1's piece: refused on both ranks */
  if (rank == 0) flip(dd, 3);
  REQUIRE(ferry_comm_barrier(comm, NULL) == 0);
  b = engine(k, comm, &s1);
  rc = ferry_checkpoint_load(b, dd, NULL, 0, NULL);
  const char *msg = ferry_engine_last_error(b);
  if (rc != FERRY_ECORRUPT || !strstr(msg, "CRC32C"))
    fprintf(stderr, "rank %d: damaged: %s: %s\n", rank, ferry_strerror(rc), msg), bad++;
  if (ci == 1 && rank == 1) printf("  damaged, rank 1: %s\n", msg);
  engine_done(b, s1);
  REQUIRE(ferry_comm_barrier(comm, NULL) == 0);
  if (rank == 0) flip(dd, 3); /* back */
  /* a save that fails on rank 1 only fails on both; step-2 stays */
  if (k->fail_save) {
    struct rlimit old, small;
    signal(SIGXFSZ, SIG_IGN);
    REQUIRE(getrlimit(RLIMIT_FSIZE, &old) == 0);
    small = old;
    small.rlim_cur = 8192; /* the soft limit only: it can be raised back */
    if (rank == 1) REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
    rc = ferry_checkpoint_save(a, dd, NULL, 0, NULL);
    if (rank == 1) REQUIRE(setrlimit(RLIMIT_FSIZE, &old) == 0);
    msg = ferry_engine_last_error(a);
    if (ci == 1) printf("  failing save, rank %d: %s\n", rank, msg);
    EXPECT(rc != 0);
    if (rank == 0) EXPECT(strstr(msg, "rank 1 failed") != NULL);
    REQUIRE(ferry_comm_barrier(comm, NULL) == 0);
    int64_t step = -1;
    char folder[1200];
    EXPECT(ferry_checkpoint_find(dd, folder, sizeof folder, &step) == 0 && step == SAVE_AT);
    EXPECT(ferry_checkpoint_verify(dd, NULL) == 0);
    EXPECT(has_tmp(dd) == 0);
    REQUIRE(ferry_comm_barrier(comm, NULL) == 0);
  }
  engine_done(a, s);
  if (rank == 0)
    printf("stage %d, %s: %s (save %.3f s, load %.3f s; 2 -> 1 and 1 -> 2: %s)\n", k->stage,
           k->name, bad ? "FAILED" : "ok", t_save, t_load, exact ? "bit for bit" : "within 1e-5");
  return bad;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--help")) {
    printf("usage: mpirun -np 2 test_zero_ckpt SCRATCH\n"
           "checkpoints of an engine with 2 ranks: layout, exact resume, 2 <-> 1 ranks, damage, "
           "a failing rank\n");
    return 0;
  }
  if (argc < 2) {
    fprintf(stderr, "usage: test_zero_ckpt SCRATCH (under mpirun -np 2)\n");
    return 2;
  }
  scratch = argv[1];
  mkdir(scratch, 0777);
  ferry_comm *comm = eu_mpi_comm(NRANKS);
  rank = ferry_comm_rank(comm);
  int bad = 0;
  int only = argc > 2 ? atoi(argv[2]) : -1; /* argv[2]: one case only */
  for (int c = 0; c < NCASES; c++)
    if (only < 0 || c == only) bad += run_case(c, comm);
  EXPECT(bad == 0);
  ferry_comm_destroy(comm);
  return test_finish("offload.zero_ckpt");
}
