/* tests/offload/test_ckpt_counts.c — checkpoints of many params with their
 * own step counts: 4500 params with 230-byte names, each left out of one of
 * the first two steps, so their count lines take more than the 1 MiB a
 * manifest may hold. The save succeeds (the counts are in their own file);
 * a fresh engine registering the params in reverse order loads it and
 * trains on bit for bit as the uninterrupted run. A save whose shards
 * would take more files than a manifest lists is refused before any file
 * is written, naming the numbers, and the previous checkpoint still loads;
 * so is one whose shards' bytes would fit but whose tensors do not pack
 * (the count is the writer's own); a save of 45 tensors a shard writes
 * the files that count gives.
 * A manifest above 1 MiB, and a file of counts above what the manifest's
 * count allows, are refused.
 */
#include "format/manifest.h"
#include "tests/offload/ckpt_util.h"
#include "tests/offload/engine_util.h"
#include "tests/test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define NP 4500
#define NG 4
#define N 4 /* floats a param */
#define NAME_LEN 230

static char names[NP][NAME_LEN + 1];
static float init[NP][N]; /* read by the engine until finalize */

static int skipped(int k, int step) { return (step == 1 && k % 2 == 0) || (step == 2 && k % 2); }

static ferry_engine *open_engine(int reverse) {
  ferry_engine *e = eu_engine("device = \"host\";\n"
                              "chunk_size = \"64K\";\n"
                              "tiers: { gpu: { budget = \"4M\"; }; host: { budget = \"64M\"; "
                              "pinned = false; }; };\n"
                              "optimizer: { type = \"adamw\"; lr = 0.01; weight_decay = 0.1; "
                              "threads = 1; missing_grad = \"skip\"; };\n"
                              "precision: { params = \"fp32\"; };\n"
                              "placement: { params = \"host\"; optimizer = \"host\"; };\n",
                              NULL);
  for (int j = 0; j < NP; j++) {
    int k = reverse ? NP - 1 - j : j;
    for (int i = 0; i < N; i++) init[k][i] = 0.5f * cosf(0.11f * (float)(i + k));
    int64_t shape[1] = {N};
    REQUIRE(ferry_param_register(e, names[k], shape, 1, k % NG, init[k], NULL, NULL) == 0);
  }
  REQUIRE(ferry_engine_finalize(e) == 0);
  return e;
}

/* One step: every group's grads, the skipped params marked. */
static void run_step(ferry_engine *e, ferry_stream *s, int step) {
  for (int g = NG - 1; g >= 0; g--) {
    int rc = ferry_fetch(e, g, s);
    if (rc) fprintf(stderr, "fetch: %s\n", ferry_engine_last_error(e));
    REQUIRE(rc == 0);
    for (int k = g; k < NP; k += NG) {
      void *gw = NULL;
      REQUIRE(ferry_param_device(e, names[k], NULL, &gw) == 0);
      REQUIRE(ferry_stream_synchronize(s) == 0); /* the buffer's zeroing */
      if (skipped(k, step)) {
        REQUIRE(ferry_param_no_grad(e, names[k]) == 0);
        continue;
      }
      for (int i = 0; i < N; i++)
        ((float *)gw)[i] = 0.1f * sinf(0.37f * (float)(i + k) + (float)step);
    }
    rc = ferry_grads_ready(e, g, s);
    if (rc) fprintf(stderr, "grads ready: %s\n", ferry_engine_last_error(e));
    REQUIRE(rc == 0);
    REQUIRE(ferry_release(e, g, s) == 0);
  }
  ferry_step_info info;
  int rc = ferry_step(e, &info);
  if (rc) fprintf(stderr, "step: %s\n", ferry_engine_last_error(e));
  REQUIRE(rc == 0);
}

static float *read_all(ferry_engine *e) {
  float *w = malloc(sizeof(float) * NP * N);
  REQUIRE(w);
  for (int k = 0; k < NP; k++) REQUIRE(ferry_param_read(e, names[k], w + k * N, N) == 0);
  return w;
}

static long long file_size(const char *folder, const char *name) {
  char p[1400];
  struct stat st;
  snprintf(p, sizeof p, "%s/%s", folder, name);
  return stat(p, &st) ? -1 : (long long)st.st_size;
}

/* A fresh engine's load of folder: its status; msg gets the message. */
static int load_into_fresh(const char *folder, char *msg, size_t cap) {
  ferry_engine *e = open_engine(0);
  int rc = ferry_checkpoint_load(e, folder, NULL, 0, NULL);
  snprintf(msg, cap, "%s", rc ? ferry_engine_last_error(e) : "");
  if (rc) printf("refused: %.300s\n", msg);
  ferry_engine_destroy(e);
  return rc;
}

/* The manifest of folder with its count of params with their own step
 * count set to n (the file of counts unchanged), written over it. */
static void set_listed(const char *folder, uint64_t n) {
  char mp[1400], why[256], *text;
  size_t len;
  snprintf(mp, sizeof mp, "%s/manifest", folder);
  FILE *f = fopen(mp, "rb");
  static char buf[1 << 20];
  REQUIRE(f);
  len = fread(buf, 1, sizeof buf, f);
  fclose(f);
  ckpt_manifest m;
  REQUIRE(ckpt_manifest_parse(buf, len, 1, &m, why, sizeof why) == 0);
  m.steps_listed = n;
  REQUIRE(ckpt_manifest_format(&m, &text, &len) == 0);
  ckpt_manifest_free(&m);
  f = fopen(mp, "wb");
  REQUIRE(f && fwrite(text, 1, len, f) == len && fclose(f) == 0);
  free(text);
}

int main(int argc, char **argv) {
  const char *scratch = argc > 1 ? argv[1] : "ckpt-counts-scratch";
  char dir[1100], fresh[1100], folder[1300], msg[2048];
  mkdir(scratch, 0755);
  snprintf(dir, sizeof dir, "%s/ckpt", scratch);
  snprintf(fresh, sizeof fresh, "%s/never", scratch);
  ck_rm(dir);
  ck_rm(fresh);
  snprintf(folder, sizeof folder, "%s/step-%012d", dir, 2);
  for (int k = 0; k < NP; k++) {
    int n = snprintf(names[k], sizeof names[k], "blocks.%d.param%05d.", k % NG, k);
    memset(names[k] + n, 'w', (size_t)(NAME_LEN - n));
    names[k][NAME_LEN] = 0;
  }

  /* every param left out of one of two steps: 4500 count lines */
  ferry_engine *a = open_engine(0);
  ferry_stream *s;
  REQUIRE(ferry_stream_create(ferry_engine_device(a), &s) == 0);
  for (int step = 1; step <= 2; step++) run_step(a, s, step);
  int rc = ferry_checkpoint_save(a, dir, NULL, 0, NULL);
  if (rc) fprintf(stderr, "save: %s\n", ferry_engine_last_error(a));
  EXPECT_EQ_INT(rc, 0);
  long long counts = file_size(folder, CKPT_STEPS_NAME), man = file_size(folder, "manifest");
  printf("counts file %lld bytes, manifest %lld\n", counts, man);
  EXPECT(counts > (long long)CKPT_MANIFEST_MAX && man > 0 && man < 4096);

  /* resumed by an engine registering in reverse order: bit for bit */
  for (int step = 3; step <= 4; step++) run_step(a, s, step);
  float *wa = read_all(a);
  ferry_engine *b = open_engine(1);
  ferry_stream *sb;
  REQUIRE(ferry_stream_create(ferry_engine_device(b), &sb) == 0);
  rc = ferry_checkpoint_load(b, folder, NULL, 0, NULL);
  if (rc) fprintf(stderr, "load: %s\n", ferry_engine_last_error(b));
  REQUIRE(rc == 0);
  for (int step = 3; step <= 4; step++) run_step(b, sb, step);
  float *wb = read_all(b);
  EXPECT(memcmp(wa, wb, sizeof(float) * NP * N) == 0);
  free(wa);
  free(wb);
  ferry_stream_destroy(sb);
  ferry_engine_destroy(b);

  /* one tensor a shard: more files than a manifest lists; refused before
   * any file, the folder not even made, the previous checkpoint kept */
  ferry_checkpoint_options o = ferry_checkpoint_options_default();
  o.max_shard_bytes = N * sizeof(float);
  rc = ferry_checkpoint_save(a, dir, NULL, 0, &o);
  const char *err = ferry_engine_last_error(a);
  printf("refused: %s\n", err);
  EXPECT_EQ_INT(rc, FERRY_EOVERFLOW);
  EXPECT(strstr(err, "4096") && strstr(err, "nothing was written"));
  EXPECT_EQ_INT(ck_count_entries(dir, "step-"), 1);
  EXPECT_EQ_INT(ck_count_entries(dir, ".tmp"), 0);
  EXPECT_EQ_INT(ferry_checkpoint_save(a, fresh, NULL, 0, &o), FERRY_EOVERFLOW);
  struct stat st;
  EXPECT(stat(fresh, &st) != 0);
  EXPECT_EQ_INT(load_into_fresh(dir, msg, sizeof msg), 0);

  /* 79-byte shards: four 16-byte tensors each, so 1125 + 3375 shards, their
   * two indexes, user.bin and the counts take 4504 files, where the bytes
   * alone (72000 / 79 and 216000 / 79 shards) made 3651: refused before
   * any file too, naming the files the writer makes. 735-byte shards (45
   * tensors each: 100 + 300 shards, where the bytes alone made 98 + 294)
   * take 404 files, and the save writes them */
  o.max_shard_bytes = 79;
  rc = ferry_checkpoint_save(a, fresh, NULL, 0, &o);
  err = ferry_engine_last_error(a);
  printf("refused: %s\n", err);
  EXPECT_EQ_INT(rc, FERRY_EOVERFLOW);
  EXPECT(strstr(err, "takes 4504 files (params 1126, optimizer 3376)") &&
         strstr(err, "nothing was written"));
  EXPECT(stat(fresh, &st) != 0);
  o.max_shard_bytes = 735;
  rc = ferry_checkpoint_save(a, fresh, NULL, 0, &o);
  if (rc) fprintf(stderr, "save: %s\n", ferry_engine_last_error(a));
  EXPECT_EQ_INT(rc, 0);
  char saved[1400], part[1500];
  snprintf(saved, sizeof saved, "%s/step-%012d", fresh, 4);
  int files = ck_count_entries(saved, "") - 3; /* not params/, optim/ and the manifest */
  snprintf(part, sizeof part, "%s/params", saved);
  files += ck_count_entries(part, "");
  snprintf(part, sizeof part, "%s/optim", saved);
  files += ck_count_entries(part, "");
  EXPECT_EQ_INT(files, 404);
  ck_rm(fresh);
  ferry_stream_destroy(s);
  ferry_engine_destroy(a);

  /* a file of counts larger than the manifest's count allows (320 bytes a
   * line), refused before it is read */
  set_listed(folder, 10);
  EXPECT_EQ_INT(load_into_fresh(folder, msg, sizeof msg), FERRY_ECORRUPT);
  EXPECT(strstr(msg, "more than 3200 for 10 params") != NULL);
  EXPECT_EQ_INT(ferry_checkpoint_verify(folder, NULL), FERRY_ECORRUPT);

  /* a manifest above 1 MiB */
  char mp[1400];
  snprintf(mp, sizeof mp, "%s/manifest", folder);
  FILE *f = fopen(mp, "ab");
  REQUIRE(f);
  for (unsigned i = 0; i <= CKPT_MANIFEST_MAX / 64; i++)
    fputs("padding padding padding padding padding padding padding padding\n", f);
  REQUIRE(fclose(f) == 0);
  EXPECT_EQ_INT(load_into_fresh(folder, msg, sizeof msg), FERRY_ECORRUPT);
  EXPECT(strstr(msg, "manifest") != NULL);
  EXPECT_EQ_INT(ferry_checkpoint_verify(folder, NULL), FERRY_ECORRUPT);
  ck_rm(dir);
  return test_finish("offload.checkpoint_counts");
}
