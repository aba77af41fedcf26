/* tests/offload/test_compact.c — compact optimizer state in the engine
 * (optimizer.state_dtype fp32/bf16/int8, optimizer.state_block,
 * precision.master fp32/bf16) on the synthetic model (bench/synth_model.h),
 * host backend. For every layout (AdamW in each combination; Lion with
 * int8 states): every placement equals the resident run bit for bit
 * (losses and weights over several steps); the same run twice is
 * bit-identical; a save at step K, a load into a fresh engine and the rest
 * of the steps equal the uninterrupted run; the checkpoint holds the state
 * as it is kept (U8 / BF16 tensors, no master with a bf16 master); stats
 * and the timeline report the optimizer's bytes per parameter; the
 * optimizer family shrinks. Then: loading a checkpoint into another layout
 * is refused naming the key; bad configurations are refused naming the
 * keys; the export holds plain bf16 weights.
 * argv[1]: a scratch folder (NVMe store, checkpoints).
 */
#include "offload/engine_internal.h"
#include "tests/offload/ckpt_util.h"

#define STEPS 6
#define SAVE_AT 3
#define NP (CK_G * CK_D * CK_D)

typedef struct {
  double loss[STEPS];
  float params[NP];
} result;

#define P_RESIDENT "placement: { params = \"gpu\"; grads = \"gpu\"; optimizer = \"gpu\"; };"

static const struct {
  const char *name, *gpu, *placement, *sets;
} modes[] = {
    {"resident", "16M", P_RESIDENT, NULL},
    {"params gpu, optimizer host", "1M",
     "placement: { params = \"gpu\"; grads = \"host\"; optimizer = \"host\"; };", NULL},
    {"params host, optimizer host", "64K",
     "placement: { params = \"host\"; grads = \"host\"; optimizer = \"host\"; };", NULL},
    {"optimizer on nvme", "64K",
     "placement: { params = \"host\"; grads = \"host\"; optimizer = \"nvme\"; };",
     "tiers.host.budget=160K"},
    {"params and optimizer on nvme", "64K",
     "placement: { params = \"nvme\"; grads = \"host\"; optimizer = \"nvme\"; };",
     "tiers.host.budget=160K"},
    {"grads none", "64K",
     "placement: { params = \"nvme\"; grads = \"none\"; optimizer = \"nvme\"; };",
     "tiers.host.budget=160K"},
    {"grads on nvme", "64K",
     "placement: { params = \"nvme\"; grads = \"nvme\"; optimizer = \"nvme\"; };",
     "tiers.host.budget=192K"},
};
#define NMODES (int)(sizeof modes / sizeof modes[0])

static const struct {
  const char *name, *sets;
  int type, state_dtype, master_dtype;
} layouts[] = {
    {"adamw fp32 states, fp32 master", "optimizer.state_dtype=fp32", FERRY_OPTIM_ADAMW,
     FERRY_DT_F32, FERRY_DT_F32},
    {"adamw bf16 states, fp32 master", "optimizer.state_dtype=bf16", FERRY_OPTIM_ADAMW,
     FERRY_DT_BF16, FERRY_DT_F32},
    {"adamw int8 states, fp32 master", "optimizer.state_dtype=int8", FERRY_OPTIM_ADAMW,
     FERRY_DT_I8, FERRY_DT_F32},
    {"adamw fp32 states, bf16 master", "precision.master=bf16", FERRY_OPTIM_ADAMW, FERRY_DT_F32,
     FERRY_DT_BF16},
    {"adamw bf16 states, bf16 master", "optimizer.state_dtype=bf16,precision.master=bf16",
     FERRY_OPTIM_ADAMW, FERRY_DT_BF16, FERRY_DT_BF16},
    {"adamw int8 states, bf16 master", "optimizer.state_dtype=int8,precision.master=bf16",
     FERRY_OPTIM_ADAMW, FERRY_DT_I8, FERRY_DT_BF16},
    {"lion int8 states, fp32 master", "optimizer.type=lion,optimizer.state_dtype=int8",
     FERRY_OPTIM_LION, FERRY_DT_I8, FERRY_DT_F32},
    {"lion int8 states, bf16 master",
     "optimizer.type=lion,optimizer.state_dtype=int8,precision.master=bf16", FERRY_OPTIM_LION,
     FERRY_DT_I8, FERRY_DT_BF16},
};
#define NLAYOUTS (int)(sizeof layouts / sizeof layouts[0])

static void join_sets(char *out, size_t cap, const char *a, const char *b) {
  snprintf(out, cap, "%s%s%s", a ? a : "", a && b ? "," : "", b ? b : "");
}

static void open_mode(ck_run *r, int mode, const char *layout_sets) {
  char sets[512];
  join_sets(sets, sizeof sets, modes[mode].sets, layout_sets);
  ck_open(r, modes[mode].gpu, modes[mode].placement, FERRY_DT_BF16, sets);
}

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

static int same(const result *a, const result *b, int from) {
  for (int s = from; s < STEPS; s++)
    if (memcmp(&a->loss[s], &b->loss[s], sizeof a->loss[s])) return 0;
  return !memcmp(a->params, b->params, sizeof a->params);
}

/* What the layout's optimizer pass moves per parameter (bf16 params and,
 * on the resident engine, fp32 device grads). */
static double expected_bpp(int l, int grad_dtype) {
  ferry_optimizer_config oc = ferry_optimizer_config_default((ferry_optim_type)layouts[l].type);
  oc.state_dtype = layouts[l].state_dtype;
  oc.master_dtype = layouts[l].master_dtype;
  oc.state_block = 256;
  return ferry_optimizer_bytes_per_param(
      &oc, grad_dtype, layouts[l].master_dtype == FERRY_DT_BF16 ? FERRY_DT_NONE : FERRY_DT_BF16);
}

/* The checkpoint's optim/ part: the dtypes of the layout, no master with a
 * bf16 master. */
static void check_optim_part(const char *ckpt_dir, int l) {
  char path[1600];
  snprintf(path, sizeof path, "%.1400s/step-%012d/optim", ckpt_dir, SAVE_AT);
  ferry_safetensors *f = NULL;
  REQUIRE(ferry_safetensors_open(path, &f) == 0);
  int masters = 0, states = 0, wrong = 0;
  int want = layouts[l].state_dtype == FERRY_DT_I8 ? FERRY_DT_U8 : layouts[l].state_dtype;
  for (size_t i = 0; i < ferry_safetensors_count(f); i++) {
    ferry_safetensors_tensor t;
    REQUIRE(ferry_safetensors_get(f, i, &t) == 0);
    if (strstr(t.name, ".master")) {
      masters++;
      wrong += t.dtype != FERRY_DT_F32;
    } else {
      states++;
      wrong += (int)t.dtype != want;
    }
  }
  ferry_safetensors_close(f);
  int nstates = layouts[l].type == FERRY_OPTIM_LION ? 1 : 2;
  EXPECT(masters == (layouts[l].master_dtype == FERRY_DT_BF16 ? 0 : CK_G));
  EXPECT(states == nstates * CK_G);
  EXPECT(wrong == 0);
}

static void test_layout(int l, const char *scratch) {
  static result ref, again, got;
  ck_run r;
  /* the resident run, its stats and timeline, and the same run again */
  memset(&ref, 0, sizeof ref);
  open_mode(&r, 0, layouts[l].sets);
  char tl[1400];
  snprintf(tl, sizeof tl, "%.1200s/timeline-%d.json", scratch, l);
  (void)engine_timeline(r.e);
  run(&r, 0, STEPS, &ref);
  ferry_stats st;
  REQUIRE(ferry_engine_get_stats(r.e, &st) == 0);
  double want = expected_bpp(l, FERRY_DT_F32);
  EXPECT(want > 0 && st.optim_bytes_per_param == want);
  REQUIRE(ferry_engine_write_timeline(r.e, tl) == 0);
  ck_close(&r);
  FILE *f = fopen(tl, "r");
  REQUIRE(f);
  char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  EXPECT(strstr(buf, "\"optim_bytes_per_param\":") != NULL);
  EXPECT(ref.loss[STEPS - 1] < ref.loss[0]);
  for (int i = 0; i < NP; i++) EXPECT(isfinite(ref.params[i]));

  memset(&again, 0, sizeof again);
  open_mode(&r, 0, layouts[l].sets);
  run(&r, 0, STEPS, &again);
  ck_close(&r);
  EXPECT(same(&again, &ref, 0));

  /* every placement equals the resident run */
  int differ = 0;
  for (int m = 1; m < NMODES; m++) {
    memset(&got, 0, sizeof got);
    open_mode(&r, m, layouts[l].sets);
    run(&r, 0, STEPS, &got);
    ck_close(&r);
    if (!same(&got, &ref, 0)) {
      fprintf(stderr, "  %s: %s differs from resident\n", layouts[l].name, modes[m].name);
      differ++;
    }
  }
  EXPECT(differ == 0);

  /* save at SAVE_AT, load into a fresh engine, go on: the same run; on the
   * resident engine and with everything on NVMe */
  static const int resume_modes[] = {0, 4};
  for (size_t k = 0; k < sizeof resume_modes / sizeof resume_modes[0]; k++) {
    int m = resume_modes[k];
    char dir[1400];
    snprintf(dir, sizeof dir, "%.1200s/ckpt-%d-%d", scratch, l, m);
    ck_rm(dir);
    memset(&got, 0, sizeof got);
    open_mode(&r, m, layouts[l].sets);
    run(&r, 0, SAVE_AT, &got);
    int rc = ferry_checkpoint_save(r.e, dir, NULL, 0, NULL);
    if (rc) fprintf(stderr, "save: %s\n", ferry_engine_last_error(r.e));
    REQUIRE(rc == 0);
    ck_close(&r);
    check_optim_part(dir, l);
    open_mode(&r, m, layouts[l].sets);
    rc = ferry_checkpoint_load(r.e, dir, NULL, 0, NULL);
    if (rc) fprintf(stderr, "load: %s\n", ferry_engine_last_error(r.e));
    REQUIRE(rc == 0);
    run(&r, SAVE_AT, STEPS, &got);
    ck_close(&r);
    if (!same(&got, &ref, SAVE_AT)) {
      fprintf(stderr, "  %s: resumed run (%s) differs\n", layouts[l].name, modes[m].name);
      EXPECT(0);
    }
  }
  printf("%-34s loss %.6f -> %.6f, %5.2f bytes/param/step; %d of %d placements differ\n",
         layouts[l].name, ref.loss[0], ref.loss[STEPS - 1], want, differ, NMODES - 1);
}

/* The optimizer family (host home) and the NVMe bytes it takes shrink with
 * the layout: exactly the tensors' bytes rounded to chunks. */
static void test_family_bytes(void) {
  static const char *const sets[] = {
      "optimizer.state_dtype=fp32",
      "optimizer.state_dtype=bf16",
      "optimizer.state_dtype=int8",
      "optimizer.state_dtype=int8,precision.master=bf16",
  };
  size_t host[4], nvme[4];
  uint64_t written[4];
  for (int i = 0; i < 4; i++) {
    ck_run r;
    open_mode(&r, 2, sets[i]); /* optimizer on the host */
    host[i] = engine_family_chunk_bytes(r.e, FERRY_FAMILY_OPTIM);
    ck_close(&r);
    char s[256];
    join_sets(s, sizeof s, modes[3].sets, sets[i]);
    ck_open(&r, modes[3].gpu, modes[3].placement, FERRY_DT_BF16, s); /* on NVMe */
    run(&r, 0, 1, &(result){0});
    REQUIRE(engine_flush(r.e) == 0);
    ferry_stats st;
    REQUIRE(ferry_engine_get_stats(r.e, &st) == 0);
    nvme[i] = engine_family_chunk_bytes(r.e, FERRY_FAMILY_OPTIM);
    written[i] = st.nvme_write_bytes[FERRY_FAMILY_OPTIM];
    EXPECT(written[i] > 0);
    ck_close(&r);
    printf("optimizer family, %-48s %6zu bytes (host home), %6zu (nvme home), %7llu written to "
           "NVMe (finalize + 1 step)\n",
           sets[i], host[i], nvme[i], (unsigned long long)written[i]);
  }
  /* per 32x32 group: fp32 master 4096 bytes + 2 states of 4096 (fp32),
   * 2048 (bf16) or 1040 (int8: 1024 codes + 4 absmax floats), each at a
   * 256-byte offset in chunks of at most 4K that never hold two groups;
   * NVMe slots round each chunk up to the store's 4K blocks */
  static const size_t host_group[4] = {3 * 4096, 4096 + 2 * 2048, 4096 + 2 * 1280, 2 * 1280};
  static const size_t nvme_group[4] = {3 * 4096, 2 * 4096, 2 * 4096, 4096};
  for (int i = 0; i < 4; i++) {
    EXPECT(host[i] == host_group[i] * CK_G);
    EXPECT(nvme[i] == nvme_group[i] * CK_G);
  }
  EXPECT(host[1] < host[0] && host[2] < host[1] && host[3] < host[2]);
  EXPECT(written[1] < written[0] && written[3] < written[2] && written[3] < written[1]);
}

/* A checkpoint loads only into the layout it was saved from. */
static void test_mismatch(const char *scratch) {
  char dir[1400];
  snprintf(dir, sizeof dir, "%.1200s/ckpt-mismatch", scratch);
  ck_rm(dir);
  ck_run r;
  result res;
  open_mode(&r, 2, "optimizer.state_dtype=int8,optimizer.state_block=128");
  run(&r, 0, 2, &res);
  REQUIRE(ferry_checkpoint_save(r.e, dir, NULL, 0, NULL) == 0);
  ck_close(&r);
  static const struct {
    const char *sets, *key;
  } other[] = {
      {"optimizer.state_dtype=fp32", "optimizer.state_dtype"},
      {"optimizer.state_dtype=bf16", "optimizer.state_dtype"},
      {"optimizer.state_dtype=int8,optimizer.state_block=256", "optimizer.state_block"},
      {"optimizer.state_dtype=int8,optimizer.state_block=128,precision.master=bf16",
       "precision.master"},
  };
  for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
    open_mode(&r, 2, other[i].sets);
    float before[CK_D * CK_D], after[CK_D * CK_D];
    REQUIRE(ferry_param_read(r.e, "layer1.w", before, CK_D * CK_D) == 0);
    int rc = ferry_checkpoint_load(r.e, dir, NULL, 0, NULL);
    const char *msg = ferry_engine_last_error(r.e);
    EXPECT(rc == FERRY_ECORRUPT);
    if (!strstr(msg, other[i].key)) fprintf(stderr, "  load with %s: %s\n", other[i].sets, msg);
    EXPECT(strstr(msg, other[i].key) != NULL);
    REQUIRE(ferry_param_read(r.e, "layer1.w", after, CK_D * CK_D) == 0);
    EXPECT(!memcmp(before, after, sizeof before)); /* unchanged */
    ck_close(&r);
  }
  /* the same layout loads */
  open_mode(&r, 4, "optimizer.state_dtype=int8,optimizer.state_block=128");
  EXPECT(ferry_checkpoint_load(r.e, dir, NULL, 0, NULL) == 0);
  ck_close(&r);
}

/* Refused configurations name the keys. */
static void test_config(void) {
  ferry_config *c = NULL;
  REQUIRE(ferry_config_create(&c) == 0);
  EXPECT(ferry_config_set(c, "optimizer.state_block", "100") == FERRY_ECONFIG);
  EXPECT(strstr(ferry_config_last_error(c), "power of two") != NULL);
  EXPECT(ferry_config_set(c, "optimizer.state_block", "8192") == FERRY_ECONFIG);
  EXPECT(ferry_config_set(c, "optimizer.state_block", "64") == 0);
  EXPECT(ferry_config_set(c, "optimizer.state_dtype", "int4") == FERRY_ECONFIG);
  EXPECT(strstr(ferry_config_last_error(c), "fp32|bf16|int8") != NULL);
  EXPECT(ferry_config_set(c, "precision.master", "fp16") == FERRY_ECONFIG);
  char buf[64];
  REQUIRE(ferry_config_get(c, "precision.master", buf, sizeof buf) == 0);
  EXPECT(!strcmp(buf, "fp32"));
  ferry_config_destroy(c);

  static const struct {
    const char *sets, *key;
    int dt;
  } bad[] = {
      {"precision.master=bf16", "precision.params", FERRY_DT_F32},
      {"precision.master=bf16", "precision.params", FERRY_DT_F16},
      {"optimizer.type=sgd,optimizer.state_dtype=int8", "optimizer.type", FERRY_DT_BF16},
      {"optimizer.type=lamb,optimizer.state_dtype=int8", "optimizer.type", FERRY_DT_BF16},
      {"optimizer.type=sgd,optimizer.momentum=0,precision.master=bf16", "precision.master",
       FERRY_DT_BF16},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ferry_config *cc = ck_config("16M", P_RESIDENT, bad[i].dt, bad[i].sets);
    ferry_engine *e = NULL;
    int rc = ferry_engine_create(cc, NULL, &e);
    ferry_config_destroy(cc);
    EXPECT(rc == FERRY_ECONFIG && !e);
    if (!strstr(ferry_last_error(), bad[i].key))
      fprintf(stderr, "  %s: %s\n", bad[i].sets, ferry_last_error());
    EXPECT(strstr(ferry_last_error(), bad[i].key) != NULL);
    ferry_engine_destroy(e);
  }
}

/* The export writes the plain bf16 params (never codes or states). */
static void test_export(const char *scratch) {
  char path[1400];
  snprintf(path, sizeof path, "%.1200s/export.safetensors", scratch);
  ck_run r;
  result res;
  open_mode(&r, 4, "optimizer.state_dtype=int8,precision.master=bf16");
  run(&r, 0, 2, &res);
  REQUIRE(ferry_export_weights(r.e, path, 0) == 0);
  ck_close(&r);
  ferry_safetensors *f = NULL;
  REQUIRE(ferry_safetensors_open(path, &f) == 0);
  EXPECT(ferry_safetensors_count(f) == CK_G);
  for (size_t i = 0; i < ferry_safetensors_count(f); i++) {
    ferry_safetensors_tensor t;
    REQUIRE(ferry_safetensors_get(f, i, &t) == 0);
    EXPECT(t.dtype == FERRY_DT_BF16 && t.ndim == 2 && !strchr(t.name, '_'));
    /* the values are the weights the engine reads back */
    uint16_t w[CK_D * CK_D];
    int g = atoi(t.name + strlen("layer"));
    REQUIRE(ferry_safetensors_read(f, i, 0, w, sizeof w) == 0);
    for (int k = 0; k < CK_D * CK_D; k++) {
      uint32_t bits = (uint32_t)w[k] << 16;
      float x;
      memcpy(&x, &bits, sizeof x);
      EXPECT(x == res.params[(size_t)g * CK_D * CK_D + (size_t)k]);
    }
  }
  ferry_safetensors_close(f);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s SCRATCH\n", argv[0]);
    return 1;
  }
  ck_set_scratch(argv[1]);
  test_config();
  for (int l = 0; l < NLAYOUTS; l++) test_layout(l, argv[1]);
  test_family_bytes();
  test_mismatch(argv[1]);
  test_export(argv[1]);
  return test_finish("test_compact");
}
