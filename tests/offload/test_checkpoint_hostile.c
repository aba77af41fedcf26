/* tests/offload/test_checkpoint_hostile.c — damaged and hostile checkpoints
 * are refused with FERRY_ECORRUPT and the reason, by verify and by load
 * (which then leaves the engine as it was): a manifest that is truncated,
 * of another version, with a wrong CRC, a ".." path, a missing or resized
 * file, counts the next step would overflow (then a step count at
 * FERRY_STEP_MAX loads and the step after it is refused); and, with the manifest's CRCs made to match so the safetensors
 * reader itself is reached, a wrong header length, overlapping and
 * out-of-range offsets, an unknown dtype, a huge shape, a truncated body;
 * a version 2 manifest (no ranks lines) still loads.
 * argv[1]: a scratch folder.
 */
#include "format/manifest.h"
#include "core/crc32c.h"
#include "tests/offload/ckpt_util.h"

#define P_RES "placement: { params = \"gpu\"; grads = \"gpu\"; optimizer = \"gpu\"; };"

static char good[1600], bad[1400];

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  REQUIRE(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  REQUIRE(b && fread(b, 1, (size_t)n, f) == (size_t)n);
  fclose(f);
  b[n] = 0;
  *len = (size_t)n;
  return b;
}

static void spit(const char *path, const void *b, size_t n) {
  FILE *f = fopen(path, "wb");
  REQUIRE(f && fwrite(b, 1, n, f) == n);
  fclose(f);
}

static void copy_good(void) {
  char cmd[3100];
  ck_rm(bad);
  snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", good, bad);
  REQUIRE(system(cmd) == 0);
}

/* Recomputes the size and CRC of every file the manifest lists. */
static void reseal(void) {
  char mp[1600];
  snprintf(mp, sizeof mp, "%s/manifest", bad);
  size_t len;
  char *text = slurp(mp, &len);
  ckpt_manifest m;
  char why[256];
  REQUIRE(ckpt_manifest_parse(text, len, 0, &m, why, sizeof why) == 0);
  free(text);
  for (size_t i = 0; i < m.nfiles; i++) {
    char fp[1800];
    snprintf(fp, sizeof fp, "%s/%s", bad, m.files[i].path);
    size_t n;
    char *b = slurp(fp, &n);
    m.files[i].bytes = n;
    m.files[i].crc = ferry_crc32c(0, b, n);
    free(b);
  }
  REQUIRE(ckpt_manifest_format(&m, &text, &len) == 0);
  spit(mp, text, len);
  free(text);
  ckpt_manifest_free(&m);
}

/* The manifest's last line made to match the lines above it again. */
static void recrc_manifest(void) {
  char mp[1600];
  snprintf(mp, sizeof mp, "%s/manifest", bad);
  size_t len;
  char *text = slurp(mp, &len);
  char *at = strstr(text, "\ncrc32c ");
  REQUIRE(at);
  at++;
  snprintf(at, len + 1 - (size_t)(at - text), "crc32c %08x\n",
           (unsigned)ferry_crc32c(0, text, (size_t)(at - text)));
  spit(mp, text, strlen(text));
  free(text);
}

/* Replaces the first `from` in a text file by `to`. */
static void edit(const char *rel, const char *from, const char *to) {
  char p[1600];
  snprintf(p, sizeof p, "%s/%s", bad, rel);
  size_t len;
  char *b = slurp(p, &len);
  char *at = strstr(b, from);
  if (!at) fprintf(stderr, "edit: '%s' not in %s\n", from, rel);
  REQUIRE(at);
  size_t fl = strlen(from), tl = strlen(to);
  char *o = malloc(len - fl + tl);
  memcpy(o, b, (size_t)(at - b));
  memcpy(o + (at - b), to, tl);
  memcpy(o + (at - b) + tl, at + fl, len - (size_t)(at - b) - fl);
  spit(p, o, len - fl + tl);
  free(o);
  free(b);
}

/* Rewrites params/model.safetensors with its JSON header edited (the
 * 8-byte length follows, padded to 8 with spaces). */
static void edit_header(const char *from, const char *to) {
  char p[1600];
  snprintf(p, sizeof p, "%s/params/model.safetensors", bad);
  size_t len;
  unsigned char *b = (unsigned char *)slurp(p, &len);
  uint64_t hl = 0;
  for (int i = 0; i < 8; i++) hl |= (uint64_t)b[i] << (8 * i);
  char *h = calloc(1, hl + strlen(to) + 16);
  memcpy(h, b + 8, hl);
  char *at = strstr(h, from);
  REQUIRE(at);
  size_t fl = strlen(from), tl = strlen(to);
  memmove(at + tl, at + fl, hl - (size_t)(at - h) - fl + 1);
  memcpy(at, to, tl);
  size_t nl = strlen(h);
  while (nl % 8) h[nl++] = ' ';
  FILE *f = fopen(p, "wb");
  REQUIRE(f);
  for (int i = 0; i < 8; i++) fputc((int)(nl >> (8 * i) & 0xff), f);
  fwrite(h, 1, nl, f);
  fwrite(b + 8 + hl, 1, len - 8 - hl, f);
  fclose(f);
  free(h);
  free(b);
}

static ck_run eng;
static float before[CK_D * CK_D];

static void expect_refused(const char *what, const char *needle) {
  int rc = ferry_checkpoint_verify(bad, NULL);
  const char *msg = ferry_last_error();
  printf("%-28s verify: %s: %s\n", what, ferry_strerror(rc), msg);
  EXPECT(rc == FERRY_ECORRUPT);
  if (needle && !strstr(msg, needle)) {
    fprintf(stderr, "  the reason lacks '%s'\n", needle);
    test_failures++;
  }
  rc = ferry_checkpoint_load(eng.e, bad, NULL, 0, NULL);
  EXPECT(rc == FERRY_ECORRUPT);
  float now[CK_D * CK_D];
  REQUIRE(ferry_param_read(eng.e, "layer0.w", now, CK_D * CK_D) == 0);
  EXPECT(memcmp(now, before, sizeof now) == 0);
}

int main(int argc, char **argv) {
  if (argc < 2) return 1;
  ck_set_scratch(argv[1]);
  snprintf(good, sizeof good, "%s/good", ck_scratch);
  snprintf(bad, sizeof bad, "%s/bad", ck_scratch);
  ck_rm(good);
  ck_open(&eng, "16M", P_RES, FERRY_DT_BF16, NULL);
  double loss;
  REQUIRE(ck_step(&eng, 1, &loss) == 0);
  ferry_checkpoint_options o = ferry_checkpoint_options_default();
  o.max_shard_bytes = 20000;
  REQUIRE(ferry_checkpoint_save(eng.e, good, "blob", 4, &o) == 0);
  char sub[sizeof good + 32];
  REQUIRE(strlen(good) < 1400);
  snprintf(sub, sizeof sub, "%s/step-000000000001", good);
  memcpy(good, sub, strlen(sub) + 1); /* strlen(good) < 1400 above: fits */
  REQUIRE(ck_step(&eng, 2, &loss) == 0); /* the engine moves on: a load would change it */
  REQUIRE(ferry_param_read(eng.e, "layer0.w", before, CK_D * CK_D) == 0);

  copy_good();
  EXPECT(ferry_checkpoint_verify(bad, NULL) == 0); /* the copy itself is fine */
  char mp[1600];
  snprintf(mp, sizeof mp, "%s/manifest", bad);

  size_t len;
  char *m = slurp(mp, &len);
  spit(mp, m, len / 2);
  expect_refused("truncated manifest", "manifest line");
  copy_good();
  edit("manifest", "ferry-checkpoint 3", "ferry-checkpoint 9");
  expect_refused("another format version", "version 9");
  copy_good();
  edit("manifest", "step 1\n", "step 2\n");
  expect_refused("manifest CRC", "CRC32C");
  /* counts from the file that the next step would overflow (CRC matching) */
  static const char *const counts[][4] = {
      {"step at int64's limit", "step 1\n", "step 9223372036854775807\n",
       "step: 9223372036854775807 is above the limit"},
      {"step past FERRY_STEP_MAX", "step 1\n", "step 9007199254740993\n",
       "above the limit 9007199254740992"},
      {"good steps at int's limit", "loss_scale_good_steps 0\n",
       "loss_scale_good_steps 2147483647\n", "loss_scale_good_steps"},
      {"skipped at int64's limit", "loss_scale_skipped 0\n",
       "loss_scale_skipped 9223372036854775807\n", "loss_scale_skipped"},
  };
  for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
    copy_good();
    edit("manifest", counts[i][1], counts[i][2]);
    recrc_manifest();
    expect_refused(counts[i][0], counts[i][3]);
  }
  copy_good();
  edit("manifest", "file params/model.safetensors", "file params/../model.safetensors");
  expect_refused("'..' in a path", "..");
  copy_good();
  edit("user.bin", "blob", "blob!");
  expect_refused("a file's size", "truncated or replaced");
  free(m);
  copy_good();
  edit("user.bin", "blob", "blub");
  expect_refused("a file's CRC", "CRC32C");

  /* resealed: the manifest agrees, the safetensors reader must refuse */
  copy_good();
  {
    char p[1600];
    snprintf(p, sizeof p, "%s/params/model.safetensors", bad);
    size_t n;
    unsigned char *b = (unsigned char *)slurp(p, &n);
    b[0] = 0xff;
    b[3] = 0x10; /* a header length past the file */
    spit(p, b, n);
    free(b);
  }
  reseal();
  expect_refused("wrong header length", NULL);
  copy_good();
  edit_header("\"data_offsets\":[2048,4096]", "\"data_offsets\":[1024,3072]");
  reseal();
  expect_refused("overlapping offsets", NULL);
  copy_good();
  edit_header("\"data_offsets\":[0,2048]", "\"data_offsets\":[0,999999]");
  reseal();
  expect_refused("out-of-range offsets", NULL);
  copy_good();
  edit_header("\"dtype\":\"BF16\"", "\"dtype\":\"Q4_K\"");
  reseal();
  expect_refused("unknown dtype", NULL);
  copy_good();
  edit_header("\"shape\":[32,32]", "\"shape\":[4294967296,4294967296,4294967296]");
  reseal();
  expect_refused("huge shape", NULL);
  copy_good();
  {
    char p[1600];
    snprintf(p, sizeof p, "%s/params/model.safetensors", bad);
    size_t n;
    char *b = slurp(p, &n);
    spit(p, b, n - 100);
    free(b);
  }
  reseal();
  expect_refused("truncated body", NULL);
  /* an older format still loads: version 2 has no ranks lines */
  copy_good();
  edit("manifest", "ferry-checkpoint 3", "ferry-checkpoint 2");
  edit("manifest", "ranks 1\nzero_stage 0\n", "");
  recrc_manifest();
  EXPECT(ferry_checkpoint_verify(bad, NULL) == 0);
  EXPECT(ferry_checkpoint_load(eng.e, bad, NULL, 0, NULL) == 0);
  /* and the good one still loads */
  EXPECT(ferry_checkpoint_load(eng.e, good, NULL, 0, NULL) == 0);
  /* a step count at FERRY_STEP_MAX loads; the step after it is refused
   * and changes nothing */
  copy_good();
  edit("manifest", "step 1\n", "step 9007199254740992\n");
  recrc_manifest();
  EXPECT(ferry_checkpoint_verify(bad, NULL) == 0);
  EXPECT(ferry_checkpoint_load(eng.e, bad, NULL, 0, NULL) == 0);
  REQUIRE(ferry_param_read(eng.e, "layer0.w", before, CK_D * CK_D) == 0);
  int src = ck_step(&eng, 3, &loss);
  printf("%-28s step: %s: %s\n", "a step past FERRY_STEP_MAX", ferry_strerror(src),
         ferry_engine_last_error(eng.e));
  EXPECT(src == FERRY_EOVERFLOW && strstr(ferry_engine_last_error(eng.e), "FERRY_STEP_MAX"));
  float after[CK_D * CK_D];
  int rrc = ferry_param_read(eng.e, "layer0.w", after, CK_D * CK_D);
  if (rrc) { /* the updates run during backward were refused the same way: said once */
    EXPECT(rrc == FERRY_EOVERFLOW);
    REQUIRE(ferry_param_read(eng.e, "layer0.w", after, CK_D * CK_D) == 0);
  }
  EXPECT(memcmp(after, before, sizeof after) == 0);
  ck_close(&eng);
  return test_finish("test_checkpoint_hostile");
}
