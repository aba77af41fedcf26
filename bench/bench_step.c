/* bench/bench_step.c — `ferry bench step`: the engine's training step on the
 * synthetic model (a stack of linear layers) with GPU compute modelled as
 * timed waits on the compute stream (a GPU computes without using a CPU
 * core). Validates first (real kernels: the first steps must equal the
 * all-resident run's bit for bit), then times steps and reports the step time, each
 * component's busy time from the engine's timeline, and
 * overlap_ratio = step time / the longest component.
 */
#include "bench/bench.h"
#include "bench/json.h"

#include "offload/config.h"
#include "offload/engine_internal.h"
#include "bench/synth_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void usage(FILE *f) {
  fprintf(f,
          "usage: ferry bench step --config FILE [--groups G] [--dim D] [--batch B]\n"
          "                        [--compute-ms MS] [--steps N] [--timeline FILE]\n"
          "                        [--set KEY=VALUE]... [--json]\n"
          "\n"
          "Runs the engine configured by FILE on a synthetic model of G square linear\n"
          "layers of width D (one group each; G*D*D parameters). First it validates: two\n"
          "steps with real kernels must equal an all-resident run bit for bit. Then the GPU's\n"
          "forward and backward are modelled as timed waits on the compute stream (MS\n"
          "per group forward, twice that backward) and N steps are timed after one\n"
          "warm-up step. Reported: seconds per step, the busy time of each component\n"
          "(compute, H2D, D2H, optimizer, NVMe read, NVMe write) from the engine's\n"
          "timeline, and overlap_ratio = step time / the longest component (1.0 means\n"
          "everything else hid behind the slowest part).\n"
          "\n"
          "  --config FILE    engine config (e.g. examples/configs/offload-nvme.cfg)\n"
          "  --groups G       layers (default 24)\n"
          "  --dim D          width (default 512: 262144 params per layer)\n"
          "  --batch B        rows per batch for validation (default 8)\n"
          "  --compute-ms MS  modelled forward time per group (default 4)\n"
          "  --steps N        timed steps (default 5)\n"
          "  --timeline FILE  write the Chrome trace of the timed steps\n"
          "  --set KEY=VALUE  override a config key (e.g. tiers.host.budget=96M)\n"
          "  --json           one JSON object: bench, config, params, steps, step_seconds,\n"
          "                   compute_s, h2d_s, d2h_s, optimizer_s, nvme_read_s,\n"
          "                   nvme_write_s, longest, overlap_ratio\n");
}

typedef struct {
  ferry_stream *s;
  double fwd;
  ferry_timeline *tl;
} sleep_model;

/* Compute spans on the timeline: a host function marks where the stream
 * starts the modelled kernel, another where it ends. */
typedef struct {
  ferry_timeline *tl;
  double t0;
} span_mark;
static span_mark marks[2];
static int mark_begin(void *arg) {
  ((span_mark *)arg)->t0 = ferry_now();
  return 0;
}
static int mark_end(void *arg) {
  span_mark *m = arg;
  ferry_timeline_add(m->tl, FERRY_LANE_COMPUTE, "kernel", m->t0, ferry_now());
  return 0;
}

static int timed_kernel(const sleep_model *sm, double seconds) {
  marks[0].tl = sm->tl;
  int rc = ferry_launch_host_func(sm->s, mark_begin, &marks[0]);
  if (!rc) rc = ferry_stream_sleep(sm->s, seconds);
  if (!rc) rc = ferry_launch_host_func(sm->s, mark_end, &marks[0]);
  return rc;
}

/* One micro-batch with compute as timed waits; grads stay as the engine
 * zeroed them (the step's cost does not depend on their values). */
static int timed_micro_batch(ferry_engine *e, int groups, const sleep_model *sm) {
  for (int g = 0; g < groups; g++) {
    int rc = ferry_fetch(e, g, sm->s);
    if (!rc) rc = timed_kernel(sm, sm->fwd);
    if (!rc) rc = ferry_release(e, g, sm->s);
    if (rc) return rc;
  }
  for (int g = groups - 1; g >= 0; g--) {
    char name[32];
    snprintf(name, sizeof name, "layer%d.w", g);
    void *w, *gw;
    int rc = ferry_fetch(e, g, sm->s);
    if (!rc) rc = ferry_param_device(e, name, &w, &gw);
    if (!rc) rc = timed_kernel(sm, 2 * sm->fwd);
    if (!rc) rc = ferry_grads_ready(e, g, sm->s);
    if (!rc) rc = ferry_release(e, g, sm->s);
    if (rc) return rc;
  }
  return FERRY_OK;
}

static const char *sets[32];
static int nsets;

/* The engine of the config file (then the --set values); resident_bytes >
 * 0: the same settings with everything on the device (a device that
 * large), the reference. */
static ferry_engine *open_engine(const char *path, size_t resident_bytes) {
  ferry_config *c = NULL;
  if (ferry_config_create(&c)) return NULL;
  int rc = ferry_config_load_file(c, path);
  for (int i = 0; i < nsets && !rc; i++) {
    char kv[1024];
    snprintf(kv, sizeof kv, "%s", sets[i]);
    char *eq = strchr(kv, '=');
    if (!eq) {
      fprintf(stderr, "ferry bench step: --set wants KEY=VALUE, not '%s'\n", sets[i]);
      ferry_config_destroy(c);
      return NULL;
    }
    *eq = '\0';
    rc = ferry_config_set(c, kv, eq + 1);
  }
  if (!rc && resident_bytes) {
    char b[32];
    snprintf(b, sizeof b, "%zu", resident_bytes);
    rc = ferry_config_set(c, "placement.params", "gpu");
    if (!rc) rc = ferry_config_set(c, "placement.grads", "gpu");
    if (!rc) rc = ferry_config_set(c, "placement.optimizer", "gpu");
    if (!rc) rc = ferry_config_set(c, "tiers.gpu.budget", b);
    if (!rc) rc = ferry_config_set(c, "device", "host");
    if (!rc) rc = ferry_config_set(c, "timeline", "");
  }
  if (rc) {
    fprintf(stderr, "ferry bench step: %s\n", ferry_config_last_error(c));
    ferry_config_destroy(c);
    return NULL;
  }
  const ferry_config_values *v = ferry_config_values_get(c);
  for (int i = 0; i < v->nvme_npaths; i++) mkdir(v->nvme_paths[i], 0700);
  ferry_engine *e = NULL;
  if (ferry_engine_create(c, NULL, &e)) {
    fprintf(stderr, "ferry bench step: engine: %s\n", ferry_last_error());
    e = NULL;
  }
  ferry_config_destroy(c);
  return e;
}

/* Two steps with real kernels on one batch; the losses of three forwards. */
static int validate_run(ferry_engine *e, int groups, int dim, int batch, double loss[3]) {
  synth_model m;
  if (synth_init(&m, groups, dim, batch, engine_param_dtype(e))) return FERRY_ENOMEM;
  int rc = synth_register(e, &m);
  if (!rc) rc = ferry_engine_finalize(e);
  ferry_stream *s = NULL;
  if (!rc) rc = ferry_stream_create(ferry_engine_device(e), &s);
  synth_call *calls = calloc((size_t)groups * 2, sizeof *calls);
  if (!calls) rc = FERRY_ENOMEM;
  for (int k = 0; k < 3 && !rc; k++) {
    synth_batch(&m, 1);
    rc = synth_micro_batch(e, &m, s, calls);
    loss[k] = m.loss;
    if (!rc && k < 2) rc = ferry_step(e, NULL);
  }
  free(calls);
  synth_free(&m);
  return rc;
}

int ferry_bench_step_main(int argc, char **argv) {
  const char *cfg = NULL, *timeline = NULL;
  int groups = 24, dim = 512, batch = 8, steps = 5, json = 0;
  double compute_ms = 4;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--json")) json = 1;
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else if (v && !strcmp(a, "--config")) cfg = argv[++i];
    else if (v && !strcmp(a, "--timeline")) timeline = argv[++i];
    else if (v && !strcmp(a, "--set") && nsets < 32) sets[nsets++] = argv[++i];
    else if (v && !strcmp(a, "--groups")) groups = atoi(argv[++i]);
    else if (v && !strcmp(a, "--dim")) dim = atoi(argv[++i]);
    else if (v && !strcmp(a, "--batch")) batch = atoi(argv[++i]);
    else if (v && !strcmp(a, "--steps")) steps = atoi(argv[++i]);
    else if (v && !strcmp(a, "--compute-ms")) compute_ms = atof(argv[++i]);
    else {
      fprintf(stderr, "ferry bench step: unknown or incomplete option '%s'\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (!cfg) {
    fprintf(stderr, "ferry bench step: --config FILE is required\n");
    return 2;
  }
  if (groups < 1 || groups > 4096 || dim < 8 || dim > 8192 || batch < 1 || steps < 1 ||
      !(compute_ms >= 0 && compute_ms < 10000)) {
    fprintf(stderr, "ferry bench step: out-of-range option (groups 1..4096, dim 8..8192, "
                    "batch >= 1, steps >= 1, compute-ms 0..10000)\n");
    return 2;
  }

  /* validate: the configured engine's first steps equal the all-resident
   * engine's bit for bit (real kernels, one batch twice) */
  size_t params = (size_t)groups * dim * dim;
  double ref[3], got[3];
  ferry_engine *e = open_engine(cfg, params * 24 + ((size_t)64 << 20));
  if (!e) return 1;
  int rc = validate_run(e, groups, dim, batch, ref);
  if (rc) fprintf(stderr, "ferry bench step: resident reference: %s\n", ferry_engine_last_error(e));
  ferry_engine_destroy(e);
  if (rc) return 1;
  e = open_engine(cfg, 0);
  if (!e) return 1;
  int ret = 1;
  rc = validate_run(e, groups, dim, batch, got);
  if (rc || memcmp(ref, got, sizeof ref)) {
    fprintf(stderr, "ferry bench step: validation failed (%s; losses %.9g %.9g %.9g, resident "
                    "%.9g %.9g %.9g)\n",
            rc ? ferry_engine_last_error(e) : "differs from the resident run", got[0], got[1],
            got[2], ref[0], ref[1], ref[2]);
    goto out;
  }
  ferry_engine_destroy(e); /* a fresh engine for timing: the trace of these steps */
  e = open_engine(cfg, 0);
  if (!e) return 1;
  synth_model m;
  if (synth_init(&m, groups, dim, batch, engine_param_dtype(e))) goto out;
  rc = synth_register(e, &m);
  if (!rc) rc = ferry_engine_finalize(e);
  synth_free(&m);
  ferry_stream *s = NULL;
  if (!rc) rc = ferry_stream_create(ferry_engine_device(e), &s);
  if (rc) {
    fprintf(stderr, "ferry bench step: %s\n", ferry_engine_last_error(e));
    goto out;
  }
  sleep_model sm = {s, compute_ms * 1e-3, engine_timeline(e)};
  rc = timed_micro_batch(e, groups, &sm); /* warm-up */
  if (!rc) rc = ferry_step(e, NULL);
  if (!rc) rc = ferry_stream_synchronize(s);
  ferry_timeline_reset(engine_timeline(e));
  double t0 = ferry_now();
  for (int k = 0; k < steps && !rc; k++) {
    rc = timed_micro_batch(e, groups, &sm);
    if (!rc) rc = ferry_step(e, NULL);
  }
  /* the last step's optimizer work belongs to the measured time */
  if (!rc) rc = ferry_stream_synchronize(s);
  if (!rc) rc = engine_wait_step(e);
  double t1 = ferry_now();
  if (rc) {
    fprintf(stderr, "ferry bench step: %s\n", ferry_engine_last_error(e));
    goto out;
  }
  double per = (t1 - t0) / steps;
  double comp = ferry_timeline_busy(engine_timeline(e), FERRY_LANE_COMPUTE, t0, t1) / steps;
  double busy[6];
  static const int lanes[6] = {-1, FERRY_LANE_H2D, FERRY_LANE_D2H, FERRY_LANE_OPTIM0,
                               FERRY_LANE_NVME_READ, FERRY_LANE_NVME_WRITE};
  static const char *names[6] = {"compute", "h2d", "d2h", "optimizer", "nvme_read", "nvme_write"};
  busy[0] = comp;
  for (int k = 1; k < 6; k++) busy[k] = ferry_timeline_busy(engine_timeline(e), lanes[k], t0, t1) / steps;
  int longest = 0;
  for (int k = 1; k < 6; k++)
    if (busy[k] > busy[longest]) longest = k;
  double ratio = per / busy[longest];
  if (timeline && ferry_engine_write_timeline(e, timeline))
    fprintf(stderr, "ferry bench step: %s\n", ferry_engine_last_error(e));
  ferry_stats st;
  ferry_engine_get_stats(e, &st);
  if (json) {
    json_out j;
    json_begin(&j, stdout);
    json_str(&j, "bench", "step");
    json_str(&j, "config", cfg);
    json_uint(&j, "params", params);
    json_int(&j, "groups", groups);
    json_int(&j, "steps", steps);
    json_num(&j, "step_seconds", per);
    json_num(&j, "compute_s", busy[0]);
    json_num(&j, "h2d_s", busy[1]);
    json_num(&j, "d2h_s", busy[2]);
    json_num(&j, "optimizer_s", busy[3]);
    json_num(&j, "nvme_read_s", busy[4]);
    json_num(&j, "nvme_write_s", busy[5]);
    json_str(&j, "longest", names[longest]);
    json_num(&j, "overlap_ratio", ratio);
    json_uint(&j, "peak_gpu_bytes", st.tier_peak[FERRY_TIER_DEVICE]);
    json_uint(&j, "peak_host_bytes", st.tier_peak[FERRY_TIER_HOST]);
    json_uint(&j, "peak_nvme_bytes", st.tier_peak[FERRY_TIER_NVME]);
    json_num(&j, "stall_seconds", st.stall_seconds);
    json_end(&j);
  } else {
    printf("step: %zu params in %d groups, %s\n", params, groups, cfg);
    printf("  validation: losses %.6g %.6g %.6g equal the all-resident run's bit for bit\n",
           got[0], got[1], got[2]);
    printf("  step time %.4f s (mean of %d)\n", per, steps);
    for (int k = 0; k < 6; k++)
      printf("  %-10s busy %.4f s%s\n", names[k], busy[k], k == longest ? "  <- longest" : "");
    printf("  overlap_ratio %.3f (step time / longest component)\n", ratio);
    printf("  peaks: gpu %llu, host %llu, nvme %llu bytes; stalls %.3f s\n",
           (unsigned long long)st.tier_peak[FERRY_TIER_DEVICE],
           (unsigned long long)st.tier_peak[FERRY_TIER_HOST],
           (unsigned long long)st.tier_peak[FERRY_TIER_NVME], st.stall_seconds);
  }
  ret = 0;
out:
  ferry_engine_destroy(e);
  return ret;
}
