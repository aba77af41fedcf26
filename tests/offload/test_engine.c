/* tests/offload/test_engine.c — the engine on the synthetic model (tests/
 * offload/synth.h) on the host backend: 20 steps under every placement give
 * bit-identical losses and params to the all-on-device run, with the device
 * budget at most 1/10 of the model-state bytes when offloaded; fp16 overflow
 * skips the step and backs the scale off; clipping scales the update by the
 * clip coefficient; 4 micro-batches equal one batch 4x as large; bad
 * configurations are refused; destroying the engine with work in flight
 * drains cleanly. Gradient homes: "none", "nvme" and bf16 accumulators are
 * bit-identical at one micro-batch, NVMe equals host at two (bf16 close);
 * "auto" resolves and bad grad placements are refused; finalize refuses a
 * host budget one byte below the working set and runs at it within the
 * budgets, with the NVMe bytes per family the placement implies.
 * argv[1]: a scratch directory for the NVMe tier.
 */
#include "bench/synth_model.h"
#include "offload/engine_internal.h"
#include "tests/test.h"

#include <sys/stat.h>
#include <unistd.h>

#define G 16
#define D 64
#define B 8
#define STEPS 20

static char nvme_dir[1024];

static const char *set_key, *set_value; /* one more setting, applied after the text */
static const char *prec_grads = "fp32";  /* precision.grads */

/* extra may start with "gpu=SIZE;" to set the device budget (default 16M).
 * The engine, or NULL with create's status in *rc. */
static ferry_engine *try_engine(const char *extra, int precision_dt, int *rc_out) {
  char gpu[32] = "16M";
  if (!strncmp(extra, "gpu=", 4)) {
    const char *semi = strchr(extra, ';');
    snprintf(gpu, sizeof gpu, "%.*s", (int)(semi - extra - 4), extra + 4);
    extra = semi + 1;
  }
  char text[4096];
  const char *prec = precision_dt == FERRY_DT_F32   ? "fp32"
                     : precision_dt == FERRY_DT_F16 ? "fp16"
                                                          : "bf16";
  snprintf(text, sizeof text,
           "device = \"host\";\n"
           "chunk_size = \"8K\";\n"
           "tiers: { gpu: { budget = \"%s\"; }; host: { budget = \"64M\"; pinned = false; };\n"
           "         nvme: { paths = [\"%s\"]; block_size = \"4K\"; queue_depth = 8; }; };\n"
           "%s"
           "precision: { params = \"%s\"; grads = \"%s\"; };\n"
           "%s\n",
           gpu, nvme_dir,
           strstr(extra, "optimizer: {") ? "" : "optimizer: { type = \"adamw\"; lr = 0.01; threads = 2; };\n",
           prec, prec_grads, extra);
  ferry_config *c = NULL;
  REQUIRE(ferry_config_create(&c) == 0);
  int rc = ferry_config_load_string(c, text, "test.cfg");
  if (rc) fprintf(stderr, "config: %s\n", ferry_config_last_error(c));
  REQUIRE(rc == 0);
  if (set_key) REQUIRE(ferry_config_set(c, set_key, set_value) == 0);
  ferry_engine *e = NULL;
  *rc_out = ferry_engine_create(c, NULL, &e);
  ferry_config_destroy(c);
  return e;
}

static ferry_engine *make_engine(const char *extra, int precision_dt) {
  int rc;
  ferry_engine *e = try_engine(extra, precision_dt, &rc);
  if (rc) fprintf(stderr, "engine create: %s\n", ferry_last_error());
  REQUIRE(rc == 0);
  return e;
}

typedef struct {
  double loss[STEPS];
  float *params; /* G * D * D */
  ferry_stats stats;
} run_result;

static int train(const char *extra, int dt, int steps, int accum, run_result *out) {
  ferry_engine *e = make_engine(extra, dt);
  synth_model m;
  REQUIRE(synth_init(&m, G, D, B, dt) == 0);
  int rc = synth_register(e, &m);
  if (!rc) rc = ferry_engine_finalize(e);
  if (rc) {
    fprintf(stderr, "finalize (%s): %s\n", extra, ferry_engine_last_error(e));
    ferry_engine_destroy(e);
    synth_free(&m);
    return rc;
  }
  ferry_stream *s = NULL;
  REQUIRE(ferry_stream_create(ferry_engine_device(e), &s) == 0);
  synth_call calls[2 * G];
  for (int step = 0; step < steps && !rc; step++) {
    double loss = 0;
    for (int k = 0; k < accum && !rc; k++) {
      synth_batch(&m, (unsigned long long)(k + 1)); /* the same data every step: it must fit */
      rc = synth_micro_batch(e, &m, s, calls);
      loss += m.loss;
    }
    ferry_step_info info;
    if (!rc) rc = ferry_step(e, &info);
    if (rc) fprintf(stderr, "step %d (%s): %s\n", step, extra, ferry_engine_last_error(e));
    out->loss[step] = loss / accum;
  }
  out->params = malloc(sizeof(float) * G * D * D);
  for (int g = 0; g < G && !rc; g++) {
    char name[32];
    snprintf(name, sizeof name, "layer%d.w", g);
    rc = ferry_param_read(e, name, out->params + (size_t)g * D * D, D * D);
  }
  ferry_engine_get_stats(e, &out->stats);
  ferry_stream_destroy(s);
  ferry_engine_destroy(e);
  synth_free(&m);
  return rc;
}

static const struct {
  const char *name, *cfg;
} placements[] = {
    {"all-on-device",
     "gpu=16M;"
     "placement: { params = \"gpu\"; grads = \"gpu\"; optimizer = \"gpu\"; };"},
    {"zero-offload",
     "gpu=1M;"
     "placement: { params = \"gpu\"; grads = \"host\"; optimizer = \"host\"; };"},
    {"zero3-offload",
     "gpu=112K;"
     "placement: { params = \"host\"; grads = \"host\"; optimizer = \"host\"; };"},
    {"optimizer-on-nvme",
     "gpu=112K;"
     "placement: { params = \"host\"; grads = \"host\"; optimizer = \"nvme\"; };"},
    {"zero-infinity",
     "gpu=112K;"
     "placement: { params = \"nvme\"; grads = \"host\"; optimizer = \"nvme\"; };"},
    {"grads-none",
     "gpu=112K;"
     "placement: { params = \"nvme\"; grads = \"none\"; optimizer = \"nvme\"; };"},
    {"grads-nvme",
     "gpu=112K;"
     "placement: { params = \"nvme\"; grads = \"nvme\"; optimizer = \"nvme\"; };"},
    {"grads-nvme-bf16", /* precision.grads = "bf16": exact with bf16 params at ga = 1 */
     "gpu=112K;"
     "placement: { params = \"nvme\"; grads = \"nvme\"; optimizer = \"nvme\"; };"},
};

static void test_placements(void) {
  size_t n = sizeof placements / sizeof placements[0];
  run_result r[12];
  memset(r, 0, sizeof r);
  /* model states: 16-bit params + fp32 grads + fp32 master, m, v = 18 B/param */
  const double model_state = 18.0 * G * D * D;
  for (size_t i = 0; i < n; i++) {
    /* with the optimizer state on NVMe, a host tier too small to cache it
     * all: every step reads and writes it */
    set_key = i >= 3 ? "tiers.host.budget" : NULL;
    set_value = "640K";
    prec_grads = strstr(placements[i].name, "bf16") ? "bf16" : "fp32";
    int rc = train(placements[i].cfg, FERRY_DT_BF16, STEPS, 1, &r[i]);
    set_key = NULL;
    prec_grads = "fp32";
    printf("%-18s rc %d  loss %.6f -> %.6f  device peak %llu B (%.3f of model states)  h2d %llu "
           "nvme r/w %llu/%llu\n",
           placements[i].name, rc, r[i].loss[0], r[i].loss[STEPS - 1],
           (unsigned long long)r[i].stats.tier_peak[FERRY_TIER_DEVICE],
           (double)r[i].stats.tier_peak[FERRY_TIER_DEVICE] / model_state,
           (unsigned long long)r[i].stats.bytes_h2d,
           (unsigned long long)r[i].stats.bytes_nvme_to_host,
           (unsigned long long)r[i].stats.bytes_host_to_nvme);
    EXPECT(rc == 0);
    if (rc) continue;
    EXPECT(r[i].loss[STEPS - 1] < 0.8 * r[i].loss[0]); /* it trains */
    if (i >= 2) EXPECT(112.0 * 1024 <= model_state / 10); /* the budget is below 1/10 */
    if (i == 0) continue;
    int same = memcmp(r[i].loss, r[0].loss, sizeof r[0].loss) == 0;
    int same_p = memcmp(r[i].params, r[0].params, sizeof(float) * G * D * D) == 0;
    if (!same || !same_p) fprintf(stderr, "  %s differs from all-on-device\n", placements[i].name);
    EXPECT(same);
    EXPECT(same_p);
  }
  for (size_t i = 3; i < n; i++) /* the state went to NVMe and came back every step */
    EXPECT(r[i].stats.bytes_host_to_nvme >= (uint64_t)(STEPS - 2) * 12 * G * D * D &&
           r[i].stats.bytes_nvme_to_host >= (uint64_t)(STEPS - 2) * 12 * G * D * D / 2);
  for (size_t i = 0; i < n; i++) free(r[i].params);
}

static void test_overflow(void) {
  /* fp16 with a huge initial scale: the scaled grads overflow, the step is
   * skipped and the scale backs off until the grads fit. */
  set_key = "precision.initial_scale";
  set_value = "1e30";
  ferry_engine *e = make_engine("gpu=16M;"
                                "placement: { params = \"gpu\"; grads = \"host\"; optimizer = "
                                "\"host\"; };",
                                FERRY_DT_F16);
  set_key = NULL;
  synth_model m;
  REQUIRE(synth_init(&m, G, D, B, FERRY_DT_F16) == 0);
  REQUIRE(synth_register(e, &m) == 0 && ferry_engine_finalize(e) == 0);
  ferry_stream *s;
  REQUIRE(ferry_stream_create(ferry_engine_device(e), &s) == 0);
  synth_call calls[2 * G];
  float w0[D * D], w1[D * D];
  REQUIRE(ferry_param_read(e, "layer0.w", w0, D * D) == 0);
  synth_batch(&m, 1);
  REQUIRE(synth_micro_batch(e, &m, s, calls) == 0);
  ferry_step_info info;
  REQUIRE(ferry_step(e, &info) == 0);
  EXPECT(info.skipped == 1 && info.step == 0);
  EXPECT(info.loss_scale == 0.5e30f);
  REQUIRE(ferry_param_read(e, "layer0.w", w1, D * D) == 0);
  EXPECT(memcmp(w0, w1, sizeof w0) == 0); /* nothing changed */
  int taken = 0;
  for (int i = 0; i < 200 && !taken; i++) {
    REQUIRE(synth_micro_batch(e, &m, s, calls) == 0);
    REQUIRE(ferry_step(e, &info) == 0);
    taken = !info.skipped;
  }
  EXPECT(taken && info.step == 1 && info.loss_scale < 1e6f);
  ferry_stream_destroy(s);
  ferry_engine_destroy(e);
  synth_free(&m);
}

/* one SGD step's update (p0 - p1) with and without clipping */
static void sgd_delta(const char *clip, float *delta, double *norm, float *coef) {
  char cfg[512];
  snprintf(cfg, sizeof cfg,
           "gpu=16M;"
     "placement: { params = \"gpu\"; grads = \"host\"; optimizer = \"host\"; };\n"
           "optimizer: { type = \"sgd\"; lr = 0.1; momentum = 0.0; weight_decay = 0.0; };\n%s",
           clip);
  ferry_engine *e = make_engine(cfg, FERRY_DT_F32);
  synth_model m;
  REQUIRE(synth_init(&m, G, D, B, FERRY_DT_F32) == 0);
  REQUIRE(synth_register(e, &m) == 0 && ferry_engine_finalize(e) == 0);
  ferry_stream *s;
  REQUIRE(ferry_stream_create(ferry_engine_device(e), &s) == 0);
  synth_call calls[2 * G];
  static float w0[G][D * D], w1[D * D];
  char name[32];
  for (int g = 0; g < G; g++) {
    snprintf(name, sizeof name, "layer%d.w", g);
    REQUIRE(ferry_param_read(e, name, w0[g], D * D) == 0);
  }
  synth_batch(&m, 7);
  REQUIRE(synth_micro_batch(e, &m, s, calls) == 0);
  ferry_step_info info;
  REQUIRE(ferry_step(e, &info) == 0);
  *norm = info.grad_norm;
  *coef = info.clip_coef;
  for (int g = 0; g < G; g++) {
    snprintf(name, sizeof name, "layer%d.w", g);
    REQUIRE(ferry_param_read(e, name, w1, D * D) == 0);
    for (int i = 0; i < D * D; i++) delta[g * D * D + i] = w0[g][i] - w1[i];
  }
  ferry_stream_destroy(s);
  ferry_engine_destroy(e);
  synth_free(&m);
}

static void test_clipping(void) {
  static float a[G * D * D], b[G * D * D];
  double na, nb;
  float ca, cb;
  sgd_delta("", a, &na, &ca);
  EXPECT(ca == 1.0f && na > 0);
  double max_norm = na / 4;
  char clip[64];
  snprintf(clip, sizeof clip, "clip_grad_norm = %.17g;", max_norm);
  sgd_delta(clip, b, &nb, &cb);
  EXPECT(nb == na);
  float want = ferry_clip_coef(na * na, 1.0f, (float)max_norm); /* as torch computes it */
  EXPECT(cb == want && cb < 0.26f && cb > 0.24f);
  /* the norm of lr * g is lr * norm: the update is lr * coef * g */
  double sa = 0, worst = 0;
  for (int i = 0; i < G * D * D; i++) {
    sa += (double)a[i] * a[i];
    double d = fabs((double)b[i] - (double)cb * a[i]);
    if (d > worst) worst = d;
  }
  EXPECT(fabs(sqrt(sa) - 0.1 * na) < 1e-3 * 0.1 * na);
  EXPECT(worst < 1e-6);
}

static void test_accumulation(void) {
  /* 4 micro-batches of B rows equal one batch of 4B rows (same rows) */
  const char *cfg = "gpu=16M;"
     "placement: { params = \"gpu\"; grads = \"host\"; optimizer = \"host\"; };\n"
                    "optimizer: { type = \"sgd\"; lr = 0.1; momentum = 0.9; };\n";
  char cfg4[512];
  snprintf(cfg4, sizeof cfg4, "%sgrad_accumulation = 4;", cfg);
  ferry_engine *e1 = make_engine(cfg, FERRY_DT_F32), *e4 = make_engine(cfg4, FERRY_DT_F32);
  synth_model big, small;
  REQUIRE(synth_init(&big, G, D, 4 * B, FERRY_DT_F32) == 0);
  REQUIRE(synth_init(&small, G, D, B, FERRY_DT_F32) == 0);
  REQUIRE(synth_register(e1, &big) == 0 && ferry_engine_finalize(e1) == 0);
  REQUIRE(synth_register(e4, &small) == 0 && ferry_engine_finalize(e4) == 0);
  ferry_stream *s1, *s4;
  REQUIRE(ferry_stream_create(ferry_engine_device(e1), &s1) == 0);
  REQUIRE(ferry_stream_create(ferry_engine_device(e4), &s4) == 0);
  synth_call calls[2 * G];
  for (int step = 0; step < 3; step++) {
    synth_batch(&big, (unsigned long long)step + 11);
    REQUIRE(synth_micro_batch(e1, &big, s1, calls) == 0);
    REQUIRE(ferry_step(e1, NULL) == 0);
    ferry_step_info info;
    for (int k = 0; k < 4; k++) {
      memcpy(small.input, big.input + (size_t)k * B * D, sizeof(float) * B * D);
      memcpy(small.target, big.target + (size_t)k * B * D, sizeof(float) * B * D);
      REQUIRE(synth_micro_batch(e4, &small, s4, calls) == 0);
      if (k < 3) EXPECT(ferry_step(e4, &info) == FERRY_ESTATE); /* not yet */
    }
    REQUIRE(ferry_step(e4, &info) == 0);
  }
  static float w1[D * D], w4[D * D];
  double worst = 0;
  for (int g = 0; g < G; g++) {
    char name[32];
    snprintf(name, sizeof name, "layer%d.w", g);
    REQUIRE(ferry_param_read(e1, name, w1, D * D) == 0);
    REQUIRE(ferry_param_read(e4, name, w4, D * D) == 0);
    for (int i = 0; i < D * D; i++) {
      double d = fabs((double)w1[i] - w4[i]);
      if (d > worst) worst = d;
    }
  }
  printf("accumulation: max |w(1 x 4B) - w(4 x B)| = %.3g\n", worst);
  EXPECT(worst < 1e-5);
  ferry_engine_destroy(e1);
  ferry_engine_destroy(e4);
  synth_free(&big);
  synth_free(&small);
}

static void test_bad_config(void) {
  ferry_config *c;
  REQUIRE(ferry_config_create(&c) == 0);
  ferry_engine *e = NULL;
  REQUIRE(ferry_config_set(c, "device", "host") == 0);
  REQUIRE(ferry_config_set(c, "tiers.gpu.budget", "1M") == 0);
  REQUIRE(ferry_config_set(c, "placement.optimizer", "gpu") == 0);
  REQUIRE(ferry_config_set(c, "placement.grads", "host") == 0);
  EXPECT(ferry_engine_create(c, NULL, &e) == FERRY_ECONFIG && e == NULL);
  EXPECT(strstr(ferry_last_error(), "placement.grads") != NULL);
  REQUIRE(ferry_config_set(c, "placement.grads", "auto") == 0);
  REQUIRE(ferry_config_set(c, "placement.optimizer", "nvme") == 0);
  EXPECT(ferry_engine_create(c, NULL, &e) == FERRY_ECONFIG); /* no nvme paths */
  EXPECT(strstr(ferry_last_error(), "tiers.nvme.paths") != NULL);
  REQUIRE(ferry_config_set(c, "placement.optimizer", "host") == 0);
  REQUIRE(ferry_config_set(c, "tiers.gpu.budget", "0") == 0);
  EXPECT(ferry_engine_create(c, NULL, &e) == FERRY_EINVAL); /* host backend needs a budget */
  EXPECT(strstr(ferry_last_error(), "tiers.gpu.budget") != NULL);
  ferry_config_destroy(c);

  /* registration errors */
  e = make_engine("gpu=1M;", FERRY_DT_BF16);
  int64_t shape[2] = {4, 4}, bad[2] = {4, 0};
  EXPECT(ferry_param_register(e, "a", shape, 2, 0, NULL, NULL, NULL) == 0);
  EXPECT(ferry_param_register(e, "a", shape, 2, 0, NULL, NULL, NULL) == FERRY_EINVAL);
  EXPECT(ferry_param_register(e, "b", bad, 2, 0, NULL, NULL, NULL) == FERRY_EINVAL);
  EXPECT(ferry_param_register(e, "", shape, 2, 0, NULL, NULL, NULL) == FERRY_EINVAL);
  EXPECT(ferry_param_register(e, "c", shape, 2, 2, NULL, NULL, NULL) == 0); /* group 1 empty */
  EXPECT(ferry_fetch(e, 0, NULL) == FERRY_ESTATE);
  EXPECT(ferry_engine_finalize(e) == FERRY_EINVAL);
  EXPECT(strstr(ferry_engine_last_error(e), "group 1") != NULL);
  ferry_engine_destroy(e);

  /* a tensor larger than the device budget: refused at finalize with numbers */
  e = make_engine("gpu=64K;"
     "placement: { params = \"host\"; };",
                  FERRY_DT_BF16);
  int64_t huge[2] = {256, 256}; /* 128 KiB of bf16 */
  EXPECT(ferry_param_register(e, "huge", huge, 2, 0, NULL, NULL, NULL) == 0);
  int rc = ferry_engine_finalize(e);
  EXPECT(rc == FERRY_ENOMEM);
  printf("too big: %s\n", ferry_engine_last_error(e));
  ferry_engine_destroy(e);

  /* the host budget pays for the engine's own pinned buffers: with params
   * on the host, 2 D2H buffers + the param commit staging of the largest
   * group (3 x 128 KiB here; no upload staging, which only device-home
   * params use) */
  set_key = "tiers.host.budget";
  set_value = "320K";
  e = make_engine("gpu=1M;"
                  "placement: { params = \"host\"; };",
                  FERRY_DT_BF16);
  set_key = NULL;
  EXPECT(ferry_param_register(e, "huge", huge, 2, 0, NULL, NULL, NULL) == 0);
  rc = ferry_engine_finalize(e);
  EXPECT(rc == FERRY_ENOMEM);
  printf("host budget: %s\n", ferry_engine_last_error(e));
  EXPECT(strstr(ferry_engine_last_error(e), "the engine's staging takes 0.4 MiB") != NULL &&
         strstr(ferry_engine_last_error(e), "leaves a pool of 0.0 MiB") != NULL);
  ferry_engine_destroy(e);
}

static int slow_kernel(void *arg) {
  (void)arg;
  usleep(20000);
  return 0;
}

/* A finalized bf16 engine on the synthetic model, and a stream of its device. */
static ferry_engine *synth_engine(const char *cfg, synth_model *m, ferry_stream **s) {
  ferry_engine *e = make_engine(cfg, FERRY_DT_BF16);
  REQUIRE(synth_init(m, G, D, B, FERRY_DT_BF16) == 0);
  REQUIRE(synth_register(e, m) == 0 && ferry_engine_finalize(e) == 0);
  REQUIRE(ferry_stream_create(ferry_engine_device(e), s) == 0);
  return e;
}

static void test_destroy_in_flight(void) {
  synth_model m;
  ferry_stream *s;
  ferry_engine *e = synth_engine("gpu=112K;"
                                 "placement: { params = \"host\"; optimizer = \"nvme\"; };",
                                 &m, &s);
  synth_call calls[2 * G];
  synth_batch(&m, 3);
  REQUIRE(synth_micro_batch(e, &m, s, calls) == 0);
  REQUIRE(ferry_step(e, NULL) == 0);
  /* backward of two groups left in flight behind slow kernels */
  for (int g = G - 1; g >= G - 2; g--) {
    char name[32];
    snprintf(name, sizeof name, "layer%d.w", g);
    REQUIRE(ferry_fetch(e, g, s) == 0);
    void *w, *gw;
    REQUIRE(ferry_param_device(e, name, &w, &gw) == 0);
    REQUIRE(ferry_launch_host_func(s, slow_kernel, NULL) == 0);
    REQUIRE(ferry_grads_ready(e, g, s) == 0);
    REQUIRE(ferry_release(e, g, s) == 0);
  }
  ferry_engine_destroy(e); /* the device, s included, goes with it */
  synth_free(&m);
}

/* placement.grads: "auto" resolves as the design says (ferry_engine_grad_home
 * tells); "none" without its conditions and bf16 grads on the gpu are
 * refused, naming what fails and what to set. */
static void test_grad_homes_config(void) {
  static const struct {
    const char *extra;
    int dt, rc, home, none;
    const char *msg;
  } cases[] = {
      {"placement: { optimizer = \"host\"; };", FERRY_DT_BF16, 0, FERRY_TIER_HOST, 1, NULL},
      {"placement: { optimizer = \"nvme\"; };", FERRY_DT_BF16, 0, FERRY_TIER_HOST, 1, NULL},
      {"placement: { optimizer = \"nvme\"; };\nclip_grad_norm = 1.0;", FERRY_DT_BF16, 0,
       FERRY_TIER_NVME, 0, NULL},
      {"placement: { optimizer = \"host\"; };\ngrad_accumulation = 2;", FERRY_DT_BF16, 0,
       FERRY_TIER_HOST, 0, NULL},
      {"placement: { optimizer = \"host\"; };", FERRY_DT_F16, 0, FERRY_TIER_HOST, 0, NULL},
      {"placement: { grads = \"gpu\"; optimizer = \"gpu\"; };", FERRY_DT_BF16, 0,
       FERRY_TIER_DEVICE, 0, NULL},
      {"placement: { optimizer = \"gpu\"; };", FERRY_DT_BF16, 0, FERRY_TIER_DEVICE, 0, NULL},
      {"placement: { grads = \"host\"; };", FERRY_DT_BF16, 0, FERRY_TIER_HOST, 0, NULL},
      {"placement: { grads = \"none\"; };\nclip_grad_norm = 1.0;", FERRY_DT_BF16, FERRY_ECONFIG,
       0, 0, "set clip_grad_norm = 0"},
      {"placement: { grads = \"none\"; };\ngrad_accumulation = 2;", FERRY_DT_BF16,
       FERRY_ECONFIG, 0, 0, "set grad_accumulation = 1"},
      {"placement: { grads = \"none\"; };\nstep_during_backward = false;", FERRY_DT_BF16,
       FERRY_ECONFIG, 0, 0, "set step_during_backward = true"},
      {"placement: { grads = \"none\"; };", FERRY_DT_F16, FERRY_ECONFIG, 0, 0,
       "fp16 params check every gradient"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc, none = -1;
    ferry_engine *e = try_engine(cases[i].extra, cases[i].dt, &rc);
    if (rc != cases[i].rc) fprintf(stderr, "case %zu: rc %d: %s\n", i, rc, ferry_last_error());
    EXPECT(rc == cases[i].rc);
    if (!rc) {
      EXPECT((int)ferry_engine_grad_home(e, &none) == cases[i].home && none == cases[i].none);
    } else {
      EXPECT(strstr(ferry_last_error(), cases[i].msg) != NULL);
      EXPECT(strstr(ferry_last_error(), "placement.grads") != NULL);
    }
    ferry_engine_destroy(e);
  }
  prec_grads = "bf16"; /* accumulators in bf16 are for host and nvme homes */
  int rc;
  ferry_engine *e = try_engine("placement: { optimizer = \"gpu\"; };", FERRY_DT_BF16, &rc);
  EXPECT(rc == FERRY_ECONFIG && e == NULL && strstr(ferry_last_error(), "precision.grads"));
  prec_grads = "fp32";
}

/* grad_accumulation = 2: NVMe accumulators equal host ones bit for bit;
 * bf16 accumulators round once per micro-batch: close, not equal. */
static void test_grad_accumulators(void) {
  static run_result r[3];
  static const char *const homes[3] = {"host", "nvme", "nvme"};
  memset(r, 0, sizeof r);
  set_key = "tiers.host.budget";
  set_value = "640K";
  for (int i = 0; i < 3; i++) {
    char cfg[256];
    snprintf(cfg, sizeof cfg,
             "gpu=112K;placement: { params = \"host\"; grads = \"%s\"; optimizer = \"nvme\"; };"
             "grad_accumulation = 2;",
             homes[i]);
    prec_grads = i == 2 ? "bf16" : "fp32";
    EXPECT(train(cfg, FERRY_DT_BF16, 6, 2, &r[i]) == 0);
  }
  set_key = NULL;
  prec_grads = "fp32";
  EXPECT(memcmp(r[0].loss, r[1].loss, sizeof r[0].loss) == 0);
  EXPECT(memcmp(r[0].params, r[1].params, sizeof(float) * G * D * D) == 0);
  double worst = 0;
  for (int i = 0; i < G * D * D; i++) {
    double d = fabs((double)r[0].params[i] - r[2].params[i]);
    if (d > worst) worst = d;
  }
  printf("bf16 accumulators, 2 micro-batches: loss %.6f -> %.6f (fp32: %.6f), max |dw| %.3g\n",
         r[2].loss[0], r[2].loss[5], r[0].loss[5], worst);
  EXPECT(r[2].loss[5] < 0.8 * r[2].loss[0]);
  EXPECT(fabs(r[2].loss[5] - r[0].loss[5]) < 0.05 * r[0].loss[5]);
  EXPECT(worst < 0.05); /* lr 0.01 x 6 steps: a few ulps of Adam's step, not a different run */
  for (int i = 0; i < 3; i++) free(r[i].params);
}

static char last_msg[2048]; /* all_nvme's finalize failure */

/* An engine with every family on NVMe and grads `grads`; host budget
 * `host` (bytes; 0: 64M); finalized, or NULL with finalize's status. */
static ferry_engine *all_nvme(const char *grads, size_t host, const char *more, synth_model *m,
                              int *rc) {
  char cfg[512], budget[32];
  snprintf(cfg, sizeof cfg,
           "gpu=112K;placement: { params = \"nvme\"; grads = \"%s\"; optimizer = \"nvme\"; };%s",
           grads, more);
  snprintf(budget, sizeof budget, "%zu", host);
  set_key = host ? "tiers.host.budget" : NULL;
  set_value = budget;
  ferry_engine *e = make_engine(cfg, FERRY_DT_BF16);
  set_key = NULL;
  REQUIRE(synth_init(m, G, D, B, FERRY_DT_BF16) == 0);
  *rc = synth_register(e, m);
  if (!*rc) *rc = ferry_engine_finalize(e);
  if (*rc) {
    snprintf(last_msg, sizeof last_msg, "%s", ferry_engine_last_error(e));
    printf("finalize (grads %s, host %zu): %s\n", grads, host, last_msg);
    ferry_engine_destroy(e);
    synth_free(m);
    return NULL;
  }
  return e;
}

/* One micro-batch and its step; the step's updates done. */
static int one_step(ferry_engine *e, synth_model *m, ferry_stream *s) {
  synth_call calls[2 * G];
  synth_batch(m, 5);
  int rc = synth_micro_batch(e, m, s, calls);
  if (!rc) rc = ferry_step(e, NULL);
  if (!rc) rc = engine_wait_step(e);
  if (rc) fprintf(stderr, "step: %s\n", ferry_engine_last_error(e));
  return rc;
}

static uint64_t d_read(const ferry_stats *a, const ferry_stats *b, int f) {
  return b->nvme_read_bytes[f] - a->nvme_read_bytes[f];
}
static uint64_t d_write(const ferry_stats *a, const ferry_stats *b, int f) {
  return b->nvme_write_bytes[f] - a->nvme_write_bytes[f];
}

/* Finalize refuses a host budget one byte below the working set; at it,
 * 3 steps run, the tiers stay within their budgets, and the NVMe bytes
 * per family are what the placement implies. */
static void test_host_working_set(const char *grads, const char *more) {
  synth_model m;
  int rc;
  ferry_engine *e = all_nvme(grads, 0, more, &m, &rc);
  REQUIRE(e);
  size_t own_dev, own_host, need = engine_host_need(e);
  engine_own_bytes(e, &own_dev, &own_host);
  ferry_engine_destroy(e);
  synth_free(&m);
  EXPECT(all_nvme(grads, own_host + need - 1, more, &m, &rc) == NULL && rc == FERRY_ENOMEM);
  EXPECT(strstr(last_msg, "tiers.host.budget of") != NULL);
  EXPECT(strstr(last_msg, "one step needs") != NULL);
  e = all_nvme(grads, own_host + need, more, &m, &rc);
  REQUIRE(e);
  ferry_stream *s;
  REQUIRE(ferry_stream_create(ferry_engine_device(e), &s) == 0);
  size_t fam_optim = engine_family_chunk_bytes(e, FERRY_FAMILY_OPTIM);
  size_t fam_grads = engine_family_chunk_bytes(e, FERRY_FAMILY_GRADS);
  ferry_stats s0, s1, s2, s3;
  REQUIRE(ferry_engine_get_stats(e, &s0) == 0);
  EXPECT(one_step(e, &m, s) == 0); /* the first step records the trace */
  REQUIRE(ferry_engine_get_stats(e, &s1) == 0);
  synth_call calls[2 * G];
  EXPECT(synth_micro_batch(e, &m, s, calls) == 0); /* the drain alone (no step runs) ... */
  REQUIRE(ferry_engine_get_stats(e, &s2) == 0);
  EXPECT(ferry_step(e, NULL) == 0 && engine_wait_step(e) == 0);
  EXPECT(one_step(e, &m, s) == 0);
  EXPECT(engine_flush(e) == 0);
  REQUIRE(ferry_engine_get_stats(e, &s3) == 0);
  printf("grads %s%s: host need %zu + staging %zu B; per step nvme writes optim %.2f grads %.2f, "
         "grads reads %.2f (x family bytes); host peak %llu of %llu\n",
         grads, more, need, own_host, (double)d_write(&s0, &s3, FERRY_FAMILY_OPTIM) / 3 / fam_optim,
         fam_grads ? (double)d_write(&s0, &s3, FERRY_FAMILY_GRADS) / 3 / fam_grads : 0.0,
         fam_grads ? (double)d_read(&s0, &s3, FERRY_FAMILY_GRADS) / 3 / fam_grads : 0.0,
         (unsigned long long)s3.tier_peak[FERRY_TIER_HOST],
         (unsigned long long)s3.budget[FERRY_TIER_HOST]);
  for (int t = FERRY_TIER_DEVICE; t <= FERRY_TIER_HOST; t++)
    EXPECT(s3.tier_peak[t] <= s3.budget[t]);
  EXPECT(d_write(&s0, &s3, FERRY_FAMILY_OPTIM) == 3 * fam_optim); /* each group once a step */
  EXPECT(d_write(&s0, &s3, FERRY_FAMILY_GRADS) == 3 * fam_grads);
  if (!strcmp(grads, "none")) EXPECT(fam_grads == 0 && d_read(&s0, &s3, FERRY_FAMILY_GRADS) == 0);
  if (!strcmp(more, "clip_grad_norm = 1e30;")) /* the step waits: the drain ran alone */
    EXPECT(d_read(&s1, &s2, FERRY_FAMILY_GRADS) == 0); /* no read of zeros */
  EXPECT(d_read(&s0, &s3, FERRY_FAMILY_GRADS) <= 3 * fam_grads);
  ferry_stream_destroy(s);
  ferry_engine_destroy(e);
  synth_free(&m);
}

/* grads "none": a loop that keeps groups fetched after handing in their
 * grads holds up its own updates (which wait for the release to commit),
 * whose staging the drain needs; asking for another grad buffer then is
 * refused, not a deadlock; releasing the groups lets everything end, and
 * so does destroying the engine with them held. */
static void test_none_held_groups(int release) {
  synth_model m;
  ferry_stream *s;
  ferry_engine *e =
      synth_engine("gpu=1M;placement: { params = \"host\"; grads = \"none\"; };", &m, &s);
  int rc = 0, g = G - 1;
  for (; g >= 0 && !rc; g--) {
    char name[32];
    snprintf(name, sizeof name, "layer%d.w", g);
    void *w, *gw;
    REQUIRE(ferry_fetch(e, g, s) == 0);
    rc = ferry_param_device(e, name, &w, &gw);
    if (!rc) REQUIRE(ferry_grads_ready(e, g, s) == 0); /* ... and no release */
  }
  printf("held groups: group %d: %s\n", g + 1, rc ? ferry_engine_last_error(e) : "(no error)");
  EXPECT(rc == FERRY_ESTATE && strstr(ferry_engine_last_error(e), "still fetched"));
  /* released, everything ends; or destroyed with the groups still held */
  for (int k = G - 1; k > g && release; k--) EXPECT(ferry_release(e, k, s) == 0);
  if (release) EXPECT(engine_wait_step(e) == 0);
  ferry_stream_destroy(s);
  ferry_engine_destroy(e);
  synth_free(&m);
}

int main(int argc, char **argv) {
  snprintf(nvme_dir, sizeof nvme_dir, "%s", argc > 1 ? argv[1] : "/tmp/ferry-test-engine");
  mkdir(nvme_dir, 0700);
  char why[256];
  if (ferry_io_uring_probe(why, sizeof why)) TEST_SKIP("io_uring unavailable: %s", why);
  test_bad_config();
  test_placements();
  test_overflow();
  test_clipping();
  test_accumulation();
  test_destroy_in_flight();
  test_grad_homes_config();
  test_none_held_groups(1);
  test_none_held_groups(0);
  test_grad_accumulators();
  test_host_working_set("none", "");
  test_host_working_set("nvme", "");
  test_host_working_set("nvme", "clip_grad_norm = 1e30;");
  return test_finish("test_engine");
}
