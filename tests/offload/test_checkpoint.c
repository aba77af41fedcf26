/* tests/offload/test_checkpoint.c — checkpoints on the synthetic model
 * (bench/synth_model.h), host backend: 10 steps straight equal 5 steps, a
 * save, a NEW PROCESS (this program exec'd again) that loads and runs 5
 * more — losses, master weights and the exported weights bit for bit, for
 * the resident, ZeRO-3 and NVMe placements and fp16 dynamic loss scaling;
 * keep-K pruning; exported weights read back by the safetensors reader;
 * a checkpoint of another model, precision or a damaged one is refused.
 * argv[1]: a scratch folder.
 */
#include "tests/offload/ckpt_util.h"

#include <sys/stat.h>
#include <sys/wait.h>

#define STEPS 10
#define HALF 5

typedef struct {
  double loss[STEPS];
  float params[CK_G * CK_D * CK_D];
} result;

#define P_RESIDENT "placement: { params = \"gpu\"; grads = \"gpu\"; optimizer = \"gpu\"; };"
#define P_ZERO3 "placement: { params = \"host\"; grads = \"host\"; optimizer = \"host\"; };"
#define P_NVME "placement: { params = \"nvme\"; grads = \"host\"; optimizer = \"nvme\"; };"
#define P_NONE "placement: { params = \"nvme\"; grads = \"none\"; optimizer = \"nvme\"; };"
#define P_GNVME "placement: { params = \"nvme\"; grads = \"nvme\"; optimizer = \"nvme\"; };"
#define P_OFFLOAD "placement: { params = \"gpu\"; grads = \"host\"; optimizer = \"host\"; };"

static const struct {
  const char *name, *gpu, *placement, *sets;
  int dt;
} modes[] = {
    {"resident", "16M", P_RESIDENT, NULL, FERRY_DT_BF16},
    {"zero3", "64K", P_ZERO3, NULL, FERRY_DT_BF16},
    /* a host tier too small for the state: every step reads NVMe */
    {"nvme", "64K", P_NVME, "tiers.host.budget=96K", FERRY_DT_BF16},
    /* the gradient homes that keep nothing in the host (issue 21) */
    {"grads-none", "64K", P_NONE, "tiers.host.budget=96K", FERRY_DT_BF16},
    {"grads-nvme", "64K", P_GNVME, "tiers.host.budget=160K", FERRY_DT_BF16},
    {"fp16-dynamic", "16M", P_OFFLOAD, "precision.initial_scale=1e12,precision.growth_interval=2",
     FERRY_DT_F16},
};
#define OPEN(r, mode, dt) ck_open(r, modes[mode].gpu, modes[mode].placement, dt, modes[mode].sets)

/* Steps [from, to) with the batch of each step chosen by its number (the
 * data loader's position, which the blob carries). */
static void run(ck_run *r, int from, int to, result *out) {
  for (int step = from; step < to; step++) {
    double loss;
    int rc = ck_step(r, (unsigned long long)step + 1, &loss);
    if (rc) fprintf(stderr, "step %d: %s\n", step, ferry_engine_last_error(r->e));
    REQUIRE(rc == 0);
    out->loss[step] = loss;
  }
  ck_read_params(r, CK_G, CK_D, out->params);
}

static int write_result(const char *path, const result *r) {
  FILE *f = fopen(path, "wb");
  if (!f) return 1;
  int bad = fwrite(r, sizeof *r, 1, f) != 1;
  return fclose(f) || bad;
}

/* The second process: loads the checkpoint, runs the rest, writes what it
 * got and exports its weights. */
static int resume_main(int mode, const char *ckpt, const char *out, const char *export_path) {
  ck_run r;
  OPEN(&r, mode, modes[mode].dt);
  ck_blob blob;
  size_t len = 0;
  int rc = ferry_checkpoint_load(r.e, ckpt, &blob, sizeof blob, &len);
  if (rc) fprintf(stderr, "load: %s\n", ferry_engine_last_error(r.e));
  REQUIRE(rc == 0 && len == sizeof blob && blob.magic == CK_MAGIC);
  result res;
  memset(&res, 0, sizeof res);
  run(&r, (int)blob.next_step, STEPS, &res);
  REQUIRE(ferry_export_weights(r.e, export_path, 0) == 0);
  ferry_stats st;
  REQUIRE(ferry_engine_get_stats(r.e, &st) == 0);
  if (!strcmp(modes[mode].name, "nvme")) { /* the state really went through NVMe */
    printf("  resumed on nvme: %llu bytes read from NVMe, %llu written\n",
           (unsigned long long)st.bytes_nvme_to_host, (unsigned long long)st.bytes_host_to_nvme);
    REQUIRE(st.bytes_nvme_to_host > (uint64_t)HALF * 12 * CK_G * CK_D * CK_D);
  }
  ck_close(&r);
  return write_result(out, &res);
}

static int files_equal(const char *a, const char *b) {
  FILE *x = fopen(a, "rb"), *y = fopen(b, "rb");
  int same = x && y;
  while (same) {
    int c = fgetc(x), d = fgetc(y);
    if (c != d) same = 0;
    if (c == EOF || d == EOF) break;
  }
  if (x) fclose(x);
  if (y) fclose(y);
  return same;
}

static void test_resume(const char *self, int mode) {
  char dir[1400], out[1500], exp_straight[1500], exp_resumed[1500];
  snprintf(dir, sizeof dir, "%s/resume-%s", ck_scratch, modes[mode].name);
  ck_rm(dir);
  snprintf(out, sizeof out, "%s.result", dir);
  snprintf(exp_straight, sizeof exp_straight, "%s.straight.safetensors", dir);
  snprintf(exp_resumed, sizeof exp_resumed, "%s.resumed.safetensors", dir);

  result straight, first, resumed;
  memset(&straight, 0, sizeof straight);
  memset(&first, 0, sizeof first);
  ck_run r;
  OPEN(&r, mode, modes[mode].dt);
  run(&r, 0, STEPS, &straight);
  REQUIRE(ferry_export_weights(r.e, exp_straight, 0) == 0);
  ck_close(&r);

  OPEN(&r, mode, modes[mode].dt);
  run(&r, 0, HALF, &first);
  ck_blob blob = {CK_MAGIC, HALF, 0x1234};
  ferry_checkpoint_options o = ferry_checkpoint_options_default();
  o.max_shard_bytes = 20000; /* several shards and an index */
  int rc = ferry_checkpoint_save(r.e, dir, &blob, sizeof blob, &o);
  if (rc) fprintf(stderr, "save: %s\n", ferry_engine_last_error(r.e));
  REQUIRE(rc == 0);
  ck_close(&r);

  char modestr[16];
  snprintf(modestr, sizeof modestr, "%d", mode);
  fflush(stdout);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    execl(self, self, ck_scratch, "resume", modestr, dir, out, exp_resumed, (char *)NULL);
    _exit(127);
  }
  int st;
  REQUIRE(waitpid(pid, &st, 0) == pid);
  EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  FILE *f = fopen(out, "rb");
  REQUIRE(f && fread(&resumed, sizeof resumed, 1, f) == 1);
  fclose(f);
  memcpy(resumed.loss, first.loss, sizeof(double) * HALF);
  int same_loss = memcmp(resumed.loss, straight.loss, sizeof straight.loss) == 0;
  int same_params = memcmp(resumed.params, straight.params, sizeof straight.params) == 0;
  int same_export = files_equal(exp_straight, exp_resumed);
  printf("%-13s loss %.6f -> %.6f (resumed %.6f)  losses %s, master %s, exported weights %s\n",
         modes[mode].name, straight.loss[0], straight.loss[STEPS - 1], resumed.loss[STEPS - 1],
         same_loss ? "equal" : "DIFFER", same_params ? "equal" : "DIFFER",
         same_export ? "equal" : "DIFFER");
  EXPECT(straight.loss[STEPS - 1] < straight.loss[0]);
  EXPECT(same_loss);
  EXPECT(same_params);
  EXPECT(same_export);
}

/* The exported file is a plain safetensors model of the params. */
static void test_export(void) {
  ck_run r;
  OPEN(&r, 0, FERRY_DT_BF16);
  result res;
  run(&r, 0, 2, &res);
  char path[1400];
  snprintf(path, sizeof path, "%s/export-dir", ck_scratch);
  ck_rm(path);
  REQUIRE(ferry_export_weights(r.e, path, 5000) == 0); /* sharded */
  ferry_safetensors *f;
  REQUIRE(ferry_safetensors_open(path, &f) == 0);
  EXPECT(ferry_safetensors_count(f) == CK_G);
  EXPECT(ferry_safetensors_shard_count(f) > 1);
  const char *fmt = ferry_safetensors_metadata_find(f, "format");
  EXPECT(fmt && !strcmp(fmt, "pt"));
  static uint16_t w[CK_D * CK_D];
  for (int g = 0; g < CK_G; g++) {
    char name[32];
    snprintf(name, sizeof name, "layer%d.w", g);
    ferry_safetensors_tensor t;
    size_t i;
    REQUIRE(ferry_safetensors_find(f, name, &t, &i) == 0);
    EXPECT(t.dtype == FERRY_DT_BF16 && t.ndim == 2 && t.shape[0] == CK_D && t.shape[1] == CK_D);
    REQUIRE(ferry_safetensors_read(f, i, 0, w, sizeof w) == 0);
    /* the bf16 params are the master weights rounded to nearest even */
    int ok = 1;
    for (size_t k = 0; k < CK_D * CK_D; k++) {
      float m = res.params[(size_t)g * CK_D * CK_D + k];
      uint32_t b;
      memcpy(&b, &m, 4);
      uint16_t want = (uint16_t)((b + 0x7fff + ((b >> 16) & 1)) >> 16);
      ok &= w[k] == want;
    }
    EXPECT(ok);
  }
  ferry_safetensors_close(f);
  ck_close(&r);
}

/* keep = 2: only the two newest step folders stay. */
static void test_keep(void) {
  char dir[1400];
  snprintf(dir, sizeof dir, "%s/keep", ck_scratch);
  ck_rm(dir);
  ck_run r;
  OPEN(&r, 0, FERRY_DT_BF16);
  ferry_checkpoint_options o = ferry_checkpoint_options_default();
  o.keep = 2;
  for (int s = 0; s < 4; s++) {
    double loss;
    REQUIRE(ck_step(&r, 1, &loss) == 0);
    REQUIRE(ferry_checkpoint_save(r.e, dir, NULL, 0, &o) == 0);
  }
  REQUIRE(ferry_checkpoint_save(r.e, dir, "x", 1, &o) == 0); /* the same step again: replaced */
  EXPECT(ck_count_entries(dir, "step-") == 2);
  EXPECT(ck_count_entries(dir, ".") == 0);
  ferry_checkpoint_info info;
  EXPECT(ferry_checkpoint_verify(dir, &info) == 0 && info.step == 4 && info.blob_bytes == 1);
  char old[1500];
  snprintf(old, sizeof old, "%s/step-000000000003", dir);
  EXPECT(ferry_checkpoint_verify(old, &info) == 0 && info.step == 3);
  /* find: the folder load would read, without reading it */
  char found[1600];
  int64_t fstep = 0;
  EXPECT(ferry_checkpoint_find(dir, found, sizeof found, &fstep) == 0 && fstep == 4 &&
         strstr(found, "/step-000000000004"));
  EXPECT(ferry_checkpoint_find(old, found, sizeof found, &fstep) == 0 && fstep == 3 &&
         !strcmp(found, old));
  snprintf(old, sizeof old, "%s/step-000000000002", dir);
  EXPECT(ferry_checkpoint_verify(old, &info) == FERRY_ENOENT);
  EXPECT(ferry_checkpoint_find(old, found, sizeof found, &fstep) == FERRY_ENOENT);
  /* misuse */
  size_t len;
  char small[1];
  EXPECT(ferry_checkpoint_load(r.e, dir, small, 0, &len) == FERRY_EOVERFLOW && len == 1);
  EXPECT(ferry_checkpoint_save(r.e, dir, NULL, 3, &o) == FERRY_EINVAL);
  ck_close(&r);
}

/* A checkpoint of another model or precision is refused, nothing changed. */
static void test_mismatch(void) {
  char dir[1400];
  snprintf(dir, sizeof dir, "%s/mismatch", ck_scratch);
  ck_rm(dir);
  ck_run r;
  OPEN(&r, 0, FERRY_DT_BF16);
  double loss;
  REQUIRE(ck_step(&r, 1, &loss) == 0);
  REQUIRE(ferry_checkpoint_save(r.e, dir, NULL, 0, NULL) == 0);
  ck_close(&r);

  OPEN(&r, 0, FERRY_DT_F16); /* another precision */
  int rc = ferry_checkpoint_load(r.e, dir, NULL, 0, NULL);
  printf("fp16 engine, bf16 checkpoint: %s: %s\n", ferry_strerror(rc), ferry_engine_last_error(r.e));
  EXPECT(rc == FERRY_ECORRUPT && strstr(ferry_engine_last_error(r.e), "BF16"));
  ck_close(&r);

  ck_open(&r, "16M", P_RESIDENT, FERRY_DT_BF16, "optimizer.type=sgd,optimizer.momentum=0.9");
  rc = ferry_checkpoint_load(r.e, dir, NULL, 0, NULL);
  printf("sgd engine, adamw checkpoint: %s: %s\n", ferry_strerror(rc), ferry_engine_last_error(r.e));
  EXPECT(rc == FERRY_ECORRUPT && strstr(ferry_engine_last_error(r.e), "adamw"));
  ck_close(&r);

  ck_open_dims(&r, "16M", P_RESIDENT, FERRY_DT_BF16, NULL, CK_G, CK_D / 2); /* other shapes */
  float before[CK_D / 2 * CK_D / 2], after[CK_D / 2 * CK_D / 2];
  REQUIRE(ferry_param_read(r.e, "layer3.w", before, CK_D / 2 * CK_D / 2) == 0);
  rc = ferry_checkpoint_load(r.e, dir, NULL, 0, NULL);
  printf("other shapes: %s: %s\n", ferry_strerror(rc), ferry_engine_last_error(r.e));
  EXPECT(rc == FERRY_ECORRUPT && strstr(ferry_engine_last_error(r.e), "layer"));
  REQUIRE(ferry_param_read(r.e, "layer3.w", after, CK_D / 2 * CK_D / 2) == 0);
  EXPECT(memcmp(before, after, sizeof before) == 0);
  ck_close(&r);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s SCRATCH [resume MODE CKPT OUT EXPORT]\n", argv[0]);
    return 1;
  }
  ck_set_scratch(argv[1]);
  if (argc == 7 && !strcmp(argv[2], "resume"))
    return resume_main(atoi(argv[3]), argv[4], argv[5], argv[6]);
  char self[1024];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  REQUIRE(n > 0);
  self[n] = 0;
  for (int m = 0; m < (int)(sizeof modes / sizeof modes[0]); m++) test_resume(self, m);
  test_export();
  test_keep();
  test_mismatch();
  return test_finish("test_checkpoint");
}
