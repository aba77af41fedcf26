/* bench/bench_step.c — `ferry bench step`: the engine's training step on the
 * synthetic model (a stack of linear layers) with GPU compute modelled as
 * timed waits on the compute stream (a GPU computes without using a CPU
 * core). Validates first (real kernels on host copies of the params that
 * ferry_memcpy_async brings down, so it runs on cuda too: the first steps
 * must equal the all-resident run's bit for bit; --no-validate skips it),
 * then times steps and reports the step time, each component's busy time
 * from the engine's timeline, and overlap_ratio = step time / the longest
 * component. It also counts the NVMe bytes per step of each family and,
 * with the optimizer on NVMe, sets the optimizer family's beside the
 * planner's prediction for the same groups and state layout
 * (ferry_plan_optim_nvme_bytes).
 */
#include "bench/bench.h"
#include "bench/json.h"

#include "offload/config.h"
#include "offload/engine_internal.h"
#include "bench/synth_model.h"
#include "plan/plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void usage(FILE *f) {
  fprintf(f,
          "usage: ferry bench step --config FILE [--groups G] [--dim D] [--batch B]\n"
          "                        [--compute-ms MS] [--steps N] [--timeline FILE]\n"
          "                        [--state-dtype fp32|bf16|int8] [--master fp32|bf16]\n"
          "                        [--set KEY=VALUE]... [--no-validate] [--json]\n"
          "\n"
          "Runs the engine configured by FILE on a synthetic model of G square linear\n"
          "layers of width D (one group each; G*D*D parameters). First it validates: two\n"
          "steps with real kernels must equal an all-resident run on the host backend bit\n"
          "for bit (the kernels run on the host, on params copied down from the device and\n"
          "grads copied up with ferry_memcpy_async, so this works on cuda; with the optimizer\n"
          "on a cuda device the losses must agree to 1e-5 relative). Then the GPU's\n"
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
          "  --state-dtype D  the optimizer states: --set optimizer.state_dtype=D\n"
          "  --master M       the master weights: --set precision.master=M (bf16 needs\n"
          "                   bf16 params)\n"
          "  --set KEY=VALUE  override a config key (e.g. tiers.host.budget=96M, device=cuda)\n"
          "  --no-validate    skip the validation (said in the output: validated false)\n"
          "  --json           one JSON object: bench, config, device, validated, params,\n"
          "                   groups, steps, step_seconds,\n"
          "                   compute_s, h2d_s, d2h_s, optimizer_s, nvme_read_s,\n"
          "                   nvme_write_s, longest, overlap_ratio, state_dtype, master,\n"
          "                   nvme_read_bytes_per_step and nvme_write_bytes_per_step\n"
          "                   {params, grads, optimizer} (the timed steps' mean), and with\n"
          "                   the optimizer on NVMe plan_optimizer_nvme_bytes_per_step (the\n"
          "                   planner's read = write prediction) and optimizer_nvme_error\n"
          "                   (the larger of |measured/plan - 1| for read and write)\n"
          "\n"
          "With the optimizer on NVMe, give a host budget too small to keep its state\n"
          "between steps (e.g. --set tiers.host.budget=16M): the planner counts every\n"
          "group read and written each step.\n");
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
  /* set once, before the stream's first mark reads it (no race with the
   * stream thread's mark_end of the kernel before) */
  if (marks[0].tl != sm->tl) marks[0].tl = sm->tl;
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

static const char *sets[34];
static int nsets;
static char state_set[64], master_set[64]; /* --state-dtype / --master as --set values */

/* The layout the configured engine runs (for the planner's prediction). */
typedef struct {
  int optim_on_nvme;
  ferry_plan_input in; /* optimizer, precision, state dtype / block, master */
} step_layout;

/* The config's optimizer and state layout as a plan input. The compact-state
 * keys read as their defaults where this build's config does not know them. */
static void read_layout(const ferry_config *c, step_layout *l) {
  const ferry_config_values *v = ferry_config_values_get(c);
  char b[64];
  l->optim_on_nvme = v->place_optimizer == FERRY_TIER_NVME;
  l->in = ferry_plan_input_default();
  l->in.optimizer = (int)v->opt_type;
  l->in.precision = v->prec_params == FERRY_DT_F32   ? FERRY_PREC_FP32
                    : v->prec_params == FERRY_DT_F16 ? FERRY_PREC_FP16
                                                     : FERRY_PREC_BF16;
  if (!ferry_config_get(c, "optimizer.state_dtype", b, sizeof b))
    l->in.state_dtype = !strcmp(b, "int8") ? FERRY_DT_I8
                        : !strcmp(b, "bf16") ? FERRY_DT_BF16 : FERRY_DT_F32;
  if (!ferry_config_get(c, "optimizer.state_block", b, sizeof b))
    l->in.state_block = strtoll(b, NULL, 10);
  if (!ferry_config_get(c, "precision.master", b, sizeof b))
    l->in.master_dtype = !strcmp(b, "bf16") ? FERRY_DT_BF16 : FERRY_DT_F32;
}

/* The engine of the config file (then the --set values); resident_bytes >
 * 0: the same settings with everything on the device (a device that
 * large, the host backend), the reference. *optim_on_device (may be NULL):
 * the configured optimizer runs on the device. */
static ferry_engine *open_engine(const char *path, size_t resident_bytes, int *optim_on_device,
                                 step_layout *layout) {
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
  if (optim_on_device) *optim_on_device = v->place_optimizer == FERRY_TIER_DEVICE;
  if (layout) read_layout(c, layout);
  ferry_engine *e = NULL;
  if (ferry_engine_create(c, NULL, &e)) {
    fprintf(stderr, "ferry bench step: engine: %s\n", ferry_last_error());
    e = NULL;
  }
  ferry_config_destroy(c);
  return e;
}

/* Two steps with real kernels on one batch; the losses of three forwards.
 * The kernels run on the host on staged copies (synth_micro_batch_staged):
 * no device pointer is dereferenced on the host, whatever the backend. */
static int validate_run(ferry_engine *e, int groups, int dim, int batch, double loss[3]) {
  synth_model m;
  synth_stage st = {0};
  if (synth_init(&m, groups, dim, batch, engine_param_dtype(e))) {
    synth_free(&m);
    return FERRY_ENOMEM;
  }
  int rc = synth_register(e, &m);
  if (!rc) rc = ferry_engine_finalize(e);
  ferry_stream *s = NULL;
  if (!rc) rc = ferry_stream_create(ferry_engine_device(e), &s);
  if (!rc) rc = synth_stage_open(&st, ferry_engine_device(e), &m);
  synth_call *calls = calloc((size_t)groups * 2, sizeof *calls);
  if (!calls && !rc) rc = FERRY_ENOMEM;
  for (int k = 0; k < 3 && !rc; k++) {
    synth_batch(&m, 1);
    rc = synth_micro_batch_staged(e, &m, s, &st, calls);
    loss[k] = m.loss;
    if (!rc && k < 2) rc = ferry_step(e, NULL);
  }
  if (rc && s) ferry_stream_synchronize(s); /* nothing queued may outlive the buffers */
  synth_stage_close(&st);
  free(calls);
  synth_free(&m);
  return rc;
}

/* ---- the command -------------------------------------------------------------- */

typedef struct {
  const char *cfg, *timeline;
  int groups, dim, batch, steps, json, validate;
  double compute_ms;
} step_opts;

/* Returns -1 to go on, or the exit code (0 after --help, 2 bad usage).
 * --set values go to sets[]. */
static int parse_args(step_opts *o, int argc, char **argv) {
  *o = (step_opts){NULL, NULL, 24, 512, 8, 5, 0, 1, 4};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--json"))
      o->json = 1;
    else if (!strcmp(a, "--no-validate"))
      o->validate = 0;
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else if (v && !strcmp(a, "--config"))
      o->cfg = argv[++i];
    else if (v && !strcmp(a, "--timeline"))
      o->timeline = argv[++i];
    else if (v && !strcmp(a, "--set") && nsets < 32)
      sets[nsets++] = argv[++i];
    else if (v && (!strcmp(a, "--state-dtype") || !strcmp(a, "--master"))) {
      int st = a[2] == 's';
      const char *val = argv[++i];
      int ok = !strcmp(val, "fp32") || !strcmp(val, "bf16") || (st && !strcmp(val, "int8"));
      if (!ok) {
        fprintf(stderr, "ferry bench step: %s '%s': expected %s\n", a, val,
                st ? "fp32, bf16 or int8" : "fp32 or bf16");
        return 2;
      }
      char *dst = st ? state_set : master_set;
      snprintf(dst, 64, "%s=%s", st ? "optimizer.state_dtype" : "precision.master", val);
    }
    else if (v && !strcmp(a, "--groups"))
      o->groups = atoi(argv[++i]);
    else if (v && !strcmp(a, "--dim"))
      o->dim = atoi(argv[++i]);
    else if (v && !strcmp(a, "--batch"))
      o->batch = atoi(argv[++i]);
    else if (v && !strcmp(a, "--steps"))
      o->steps = atoi(argv[++i]);
    else if (v && !strcmp(a, "--compute-ms"))
      o->compute_ms = atof(argv[++i]);
    else {
      fprintf(stderr, "ferry bench step: unknown or incomplete option '%s'\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (!o->cfg) {
    fprintf(stderr, "ferry bench step: --config FILE is required\n");
    return 2;
  }
  /* after the --set values: the flags win */
  if (state_set[0]) sets[nsets++] = state_set;
  if (master_set[0]) sets[nsets++] = master_set;
  if (o->groups < 1 || o->groups > 4096 || o->dim < 8 || o->dim > 8192 || o->batch < 1 ||
      o->steps < 1 || !(o->compute_ms >= 0 && o->compute_ms < 10000)) {
    fprintf(stderr, "ferry bench step: out-of-range option (groups 1..4096, dim 8..8192, "
                    "batch >= 1, steps >= 1, compute-ms 0..10000)\n");
    return 2;
  }
  return -1;
}

static size_t model_params(const step_opts *o) { return (size_t)o->groups * o->dim * o->dim; }

/* The losses agree: bit for bit, or within 1e-5 relative when the
 * optimizer ran on a cuda device (its kernels round differently). */
static int losses_agree(const double ref[3], const double got[3], int tolerant) {
  if (!tolerant) return !memcmp(ref, got, sizeof(double) * 3);
  for (int k = 0; k < 3; k++)
    if (!(fabs(got[k] - ref[k]) <= 1e-5 * fabs(ref[k]))) return 0;
  return 1;
}

/* The configured engine's first steps equal the all-resident engine's
 * (real kernels, one batch twice); got: the configured engine's losses. 0,
 * or 1 (said on stderr). */
static int validate(const step_opts *o, double got[3]) {
  double ref[3];
  ferry_engine *e = open_engine(o->cfg, model_params(o) * 24 + ((size_t)64 << 20), NULL, NULL);
  if (!e) return 1;
  int rc = validate_run(e, o->groups, o->dim, o->batch, ref);
  if (rc) fprintf(stderr, "ferry bench step: resident reference: %s\n", ferry_engine_last_error(e));
  ferry_engine_destroy(e);
  if (rc) return 1;
  int optim_dev = 0;
  e = open_engine(o->cfg, 0, &optim_dev, NULL);
  if (!e) return 1;
  int ret = 0;
  ferry_device_info info;
  int tolerant = optim_dev && !ferry_device_get_info(ferry_engine_device(e), &info) &&
                 info.kind == FERRY_DEVICE_CUDA;
  rc = validate_run(e, o->groups, o->dim, o->batch, got);
  if (rc || !losses_agree(ref, got, tolerant)) {
    fprintf(stderr,
            "ferry bench step: validation failed (%s; losses %.9g %.9g %.9g, resident "
            "%.9g %.9g %.9g)\n",
            rc ? ferry_engine_last_error(e) : "differs from the resident run", got[0], got[1],
            got[2], ref[0], ref[1], ref[2]);
    ret = 1;
  }
  ferry_engine_destroy(e);
  return ret;
}

/* Registers the synthetic model on e (no data: compute is modelled) and
 * makes the compute stream: 0, or 1 (said on stderr, except when the
 * model's buffers cannot be had). */
static int prepare_timing(ferry_engine *e, const step_opts *o, ferry_stream **s) {
  synth_model m;
  if (synth_init(&m, o->groups, o->dim, o->batch, engine_param_dtype(e))) return 1;
  int rc = synth_register(e, &m);
  if (!rc) rc = ferry_engine_finalize(e);
  synth_free(&m);
  if (!rc) rc = ferry_stream_create(ferry_engine_device(e), s);
  if (rc) {
    fprintf(stderr, "ferry bench step: %s\n", ferry_engine_last_error(e));
    return 1;
  }
  return 0;
}

/* One warm-up step, then o->steps timed steps from *t0 to *t1, the last
 * step's optimizer work included. Returns a status. */
static int time_steps(ferry_engine *e, ferry_stream *s, const step_opts *o, double *t0,
                      double *t1, ferry_stats *before) {
  sleep_model sm = {s, o->compute_ms * 1e-3, engine_timeline(e)};
  int rc = timed_micro_batch(e, o->groups, &sm); /* warm-up */
  if (!rc) rc = ferry_step(e, NULL);
  if (!rc) rc = ferry_stream_synchronize(s);
  if (!rc) rc = engine_wait_step(e); /* the warm-up's NVMe writes are not the timed steps' */
  if (!rc) rc = ferry_engine_get_stats(e, before);
  ferry_timeline_reset(engine_timeline(e));
  *t0 = ferry_now();
  for (int k = 0; k < o->steps && !rc; k++) {
    rc = timed_micro_batch(e, o->groups, &sm);
    if (!rc) rc = ferry_step(e, NULL);
  }
  /* the last step's optimizer work belongs to the measured time */
  if (!rc) rc = ferry_stream_synchronize(s);
  if (!rc) rc = engine_wait_step(e);
  *t1 = ferry_now();
  return rc;
}

enum { NCOMP = 6 };
static const char *comp_names[NCOMP] = {"compute",   "h2d",       "d2h",
                                        "optimizer", "nvme_read", "nvme_write"};

/* Each component's busy seconds per step between t0 and t1, from the
 * engine's timeline; returns the longest one's index. */
static int component_busy(ferry_engine *e, double t0, double t1, int steps, double busy[NCOMP]) {
  static const int lanes[NCOMP] = {-1,
                                   FERRY_LANE_H2D,
                                   FERRY_LANE_D2H,
                                   FERRY_LANE_OPTIM0,
                                   FERRY_LANE_NVME_READ,
                                   FERRY_LANE_NVME_WRITE};
  busy[0] = ferry_timeline_busy(engine_timeline(e), FERRY_LANE_COMPUTE, t0, t1) / steps;
  for (int k = 1; k < NCOMP; k++)
    busy[k] = ferry_timeline_busy(engine_timeline(e), lanes[k], t0, t1) / steps;
  int longest = 0;
  for (int k = 1; k < NCOMP; k++)
    if (busy[k] > busy[longest]) longest = k;
  return longest;
}

/* What was measured, for report(). */
typedef struct {
  const char *device; /* the engine's device name */
  double per;         /* seconds per step */
  double busy[NCOMP];
  int longest;
  ferry_stats st;
  double nvme_rd[FERRY_FAMILIES], nvme_wr[FERRY_FAMILIES]; /* per timed step */
  step_layout layout;
  double plan_optim;  /* the planner's optimizer NVMe bytes per step (read = write); 0: off NVMe */
  double optim_error; /* max |measured / plan - 1| of read and write */
} step_result;

static const char *fam_names[FERRY_FAMILIES] = {"params", "grads", "optimizer"};

/* The NVMe bytes of the timed steps and, with the optimizer on NVMe, the
 * planner's figure for the synthetic model's groups and this layout. */
static void nvme_per_step(const step_opts *o, const ferry_stats *before, step_result *r) {
  for (int f = 0; f < FERRY_FAMILIES; f++) {
    r->nvme_rd[f] = (double)(r->st.nvme_read_bytes[f] - before->nvme_read_bytes[f]) / o->steps;
    r->nvme_wr[f] = (double)(r->st.nvme_write_bytes[f] - before->nvme_write_bytes[f]) / o->steps;
  }
  r->plan_optim = r->optim_error = 0;
  if (!r->layout.optim_on_nvme) return;
  uint64_t *groups = malloc((size_t)o->groups * sizeof *groups);
  if (!groups) return;
  for (int g = 0; g < o->groups; g++) groups[g] = (uint64_t)o->dim * (uint64_t)o->dim;
  r->plan_optim = ferry_plan_optim_nvme_bytes(&r->layout.in, FERRY_PLACE_NVME_OPT, groups,
                                              (size_t)o->groups);
  free(groups);
  if (r->plan_optim > 0)
    r->optim_error = fmax(fabs(r->nvme_rd[FERRY_FAMILY_OPTIM] / r->plan_optim - 1),
                          fabs(r->nvme_wr[FERRY_FAMILY_OPTIM] / r->plan_optim - 1));
}

static void report_text(const step_opts *o, const double got[3], const step_result *r) {
  const ferry_stats *st = &r->st;
  printf("step: %zu params in %d groups, %s, device %s\n", model_params(o), o->groups, o->cfg,
         r->device);
  if (o->validate)
    printf("  validation: losses %.6g %.6g %.6g equal the all-resident run's\n", got[0], got[1],
           got[2]);
  else
    printf("  validation: skipped (--no-validate)\n");
  printf("  step time %.4f s (mean of %d)\n", r->per, o->steps);
  for (int k = 0; k < NCOMP; k++)
    printf("  %-10s busy %.4f s%s\n", comp_names[k], r->busy[k],
           k == r->longest ? "  <- longest" : "");
  printf("  overlap_ratio %.3f (step time / longest component)\n", r->per / r->busy[r->longest]);
  printf("  peaks: gpu %llu, host %llu, nvme %llu bytes; stalls %.3f s\n",
         (unsigned long long)st->tier_peak[FERRY_TIER_DEVICE],
         (unsigned long long)st->tier_peak[FERRY_TIER_HOST],
         (unsigned long long)st->tier_peak[FERRY_TIER_NVME], st->stall_seconds);
  const ferry_plan_input *li = &r->layout.in;
  printf("  optimizer: %s states, %s master\n", ferry_plan_dtype_name(li->state_dtype),
         ferry_plan_dtype_name(li->master_dtype));
  for (int f = 0; f < FERRY_FAMILIES; f++)
    if (r->nvme_rd[f] > 0 || r->nvme_wr[f] > 0)
      printf("  nvme %-9s per step: read %.0f, written %.0f bytes\n", fam_names[f],
             r->nvme_rd[f], r->nvme_wr[f]);
  if (r->plan_optim > 0)
    printf("  nvme optimizer per step: planner %.0f bytes read and written; measured read "
           "%+.2f%%, written %+.2f%%\n", r->plan_optim,
           100 * (r->nvme_rd[FERRY_FAMILY_OPTIM] / r->plan_optim - 1),
           100 * (r->nvme_wr[FERRY_FAMILY_OPTIM] / r->plan_optim - 1));
}

static void report(const step_opts *o, const double got[3], const step_result *r) {
  if (!o->json) {
    report_text(o, got, r);
    return;
  }
  const double *busy = r->busy;
  const ferry_stats *st = &r->st;
  json_out j;
  json_begin(&j, stdout);
  json_str(&j, "bench", "step");
  json_str(&j, "config", o->cfg);
  json_str(&j, "device", r->device);
  json_bool(&j, "validated", o->validate);
  json_uint(&j, "params", model_params(o));
  json_int(&j, "groups", o->groups);
  json_int(&j, "steps", o->steps);
  json_num(&j, "step_seconds", r->per);
  json_num(&j, "compute_s", busy[0]);
  json_num(&j, "h2d_s", busy[1]);
  json_num(&j, "d2h_s", busy[2]);
  json_num(&j, "optimizer_s", busy[3]);
  json_num(&j, "nvme_read_s", busy[4]);
  json_num(&j, "nvme_write_s", busy[5]);
  json_str(&j, "longest", comp_names[r->longest]);
  json_num(&j, "overlap_ratio", r->per / busy[r->longest]);
  json_uint(&j, "peak_gpu_bytes", st->tier_peak[FERRY_TIER_DEVICE]);
  json_uint(&j, "peak_host_bytes", st->tier_peak[FERRY_TIER_HOST]);
  json_uint(&j, "peak_nvme_bytes", st->tier_peak[FERRY_TIER_NVME]);
  json_num(&j, "stall_seconds", st->stall_seconds);
  json_str(&j, "state_dtype", ferry_plan_dtype_name(r->layout.in.state_dtype));
  json_str(&j, "master", ferry_plan_dtype_name(r->layout.in.master_dtype));
  for (int d = 0; d < 2; d++) {
    json_open(&j, d ? "nvme_write_bytes_per_step" : "nvme_read_bytes_per_step", '{');
    for (int f = 0; f < FERRY_FAMILIES; f++)
      json_uint(&j, fam_names[f], (uint64_t)llround(d ? r->nvme_wr[f] : r->nvme_rd[f]));
    json_close(&j, '}');
  }
  if (r->plan_optim > 0) {
    json_uint(&j, "plan_optimizer_nvme_bytes_per_step", (uint64_t)llround(r->plan_optim));
    json_num(&j, "optimizer_nvme_error", r->optim_error);
  } else {
    json_null(&j, "plan_optimizer_nvme_bytes_per_step");
    json_null(&j, "optimizer_nvme_error");
  }
  json_end(&j);
}

/* Times steps on a fresh engine (the trace of these steps) and reports: 0,
 * or 1 (said on stderr). */
static int run_timed(const step_opts *o, const double got[3]) {
  step_result r;
  memset(&r, 0, sizeof r);
  ferry_engine *e = open_engine(o->cfg, 0, NULL, &r.layout);
  if (!e) return 1;
  ferry_stream *s = NULL;
  ferry_stats before;
  double t0, t1;
  int ret = 1;
  if (prepare_timing(e, o, &s)) goto out;
  if (time_steps(e, s, o, &t0, &t1, &before)) {
    fprintf(stderr, "ferry bench step: %s\n", ferry_engine_last_error(e));
    goto out;
  }
  ferry_device_info info;
  r.device = ferry_device_get_info(ferry_engine_device(e), &info) ? "?" : info.name;
  r.per = (t1 - t0) / o->steps;
  r.longest = component_busy(e, t0, t1, o->steps, r.busy);
  if (o->timeline && ferry_engine_write_timeline(e, o->timeline))
    fprintf(stderr, "ferry bench step: %s\n", ferry_engine_last_error(e));
  ferry_engine_get_stats(e, &r.st);
  nvme_per_step(o, &before, &r);
  report(o, got, &r);
  ret = 0;
out:
  ferry_engine_destroy(e);
  return ret;
}

int ferry_bench_step_main(int argc, char **argv) {
  step_opts o;
  int ex = parse_args(&o, argc, argv);
  if (ex >= 0) return ex;
  double got[3] = {0, 0, 0};
  if (o.validate && validate(&o, got)) return 1;
  if (!o.validate)
    fprintf(stderr, "ferry bench step: validation skipped (--no-validate): the step is timed "
                    "without checking its numbers\n");
  return run_timed(&o, got);
}
