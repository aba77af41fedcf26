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
 * (ferry_plan_optim_nvme_bytes). Under `mpirun -np N` (or --ranks N, which
 * starts mpirun itself) every rank trains the model with the engine's ZeRO
 * stage over a communicator, and rank 0 reports the communication per step
 * and how much of it overlapped the compute (docs/PERFORMANCE.md).
 */
#include "bench/args.h"
#include "bench/bench.h"
#include "format/json_writer.h"

#include "format/config.h"
#include "offload/engine_internal.h"
#include "bench/synth_model.h"
#include "plan/plan.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void usage(FILE *f) {
  fprintf(f,
          "usage: ferry bench step --config FILE [--groups G] [--dim D] [--batch B]\n"
          "                        [--compute-ms MS] [--steps N] [--timeline FILE]\n"
          "                        [--state-dtype fp32|bf16|int8] [--master fp32|bf16]\n"
          "                        [--set KEY=VALUE]... [--no-validate] [--json]\n"
          "                        [--ranks N]\n"
          "       mpirun -np N ferry bench step ... (the same, N ranks)\n"
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
          "  --ranks N        N ranks of data parallelism: runs itself again under\n"
          "                   `mpirun --oversubscribe -np N` (OpenMPI's mpirun from PATH;\n"
          "                   as root OpenMPI also wants OMPI_ALLOW_RUN_AS_ROOT=1 and\n"
          "                   OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1), or checks that the\n"
          "                   launcher that started it made N ranks\n"
          "  --json           one JSON object: bench, config, device, validated, params,\n"
          "                   groups, steps, step_seconds,\n"
          "                   compute_s, h2d_s, d2h_s, optimizer_s, nvme_read_s,\n"
          "                   nvme_write_s, longest, overlap_ratio, state_dtype, master,\n"
          "                   nvme_read_bytes_per_step and nvme_write_bytes_per_step\n"
          "                   {params, grads, optimizer} (the timed steps' mean), and with\n"
          "                   the optimizer on NVMe plan_optimizer_nvme_bytes_per_step (the\n"
          "                   planner's read = write prediction) and optimizer_nvme_error\n"
          "                   (the larger of |measured/plan - 1| for read and write);\n"
          "                   ranks, zero_stage, comm (self or mpi),\n"
          "                   comm_seconds_per_step, comm_busy_seconds_per_step,\n"
          "                   comm_wait_seconds_per_step, comm_bytes_per_step,\n"
          "                   comm_ops_per_step, comm_hidden_fraction, alone_step_seconds\n"
          "                   and dist_overhead_seconds_per_step (null with one rank)\n"
          "\n"
          "With ranks (a communicator made with FERRY_COMM_AUTO and set on the engine:\n"
          "dist.zero_stage of the config, default 2) every rank runs the same batches,\n"
          "validates against its own all-resident run (losses within 1e-5 relative: the\n"
          "average of N equal grads may round), times the steps, then times the same\n"
          "engine alone (no communicator, the same grad home) at the same moment as the\n"
          "other ranks. Rank 0 prints its figures: communication per step (the engine's\n"
          "ferry_stats comm_seconds over the timed steps), the time the engine's threads\n"
          "waited on it (comm_wait_seconds), comm_hidden_fraction = the share of the\n"
          "communication lanes' busy time during which the compute lane was busy too\n"
          "(the timeline), and dist_overhead = step time with ranks - step time alone (the\n"
          "exposed communication less the optimizer work the sharding saves). Each rank\n"
          "swaps under its own folder DIR/rank<r> of every tiers.nvme.paths DIR.\n"
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

/* The ranks: set once by open_ranks, before any engine; one rank without a
 * launcher (comm is then a SELF communicator the engines do not get). */
static ferry_comm *comm;
static int rank, nranks = 1;

/* say's last message, without "ferry bench step: " and its newline. */
static char last_err[4096];

/* "ferry bench step: " and the message on stderr; the message is kept as
 * the cause abort_ranks tells the other ranks. */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_err, sizeof last_err, fmt, ap);
  va_end(ap);
  fprintf(stderr, "ferry bench step: %s", last_err);
  last_err[strcspn(last_err, "\n")] = '\0';
}

/* Test hook (tests/cli/bench_step_ranks_test.sh): rank
 * $FERRY_BENCH_TEST_FAIL_RANK fails at its second timed step, as an I/O
 * error in that rank alone would, and waits $FERRY_BENCH_TEST_LINGER
 * seconds before it ends the job, as under a slow launcher. */
static int test_fails_here(void) {
  const char *r = getenv("FERRY_BENCH_TEST_FAIL_RANK");
  return r && nranks > 1 && atoi(r) == rank;
}

/* A failed engine call with ranks: the other ranks may wait in a collective
 * for this one, so they are told the cause (say's last message; their
 * waits fail at once naming this rank) and the job ends here. */
static void abort_ranks(void) {
  if (nranks <= 1) return;
  fflush(stdout);
  fflush(stderr);
  char pre[32];
  const char *why = last_err;
  size_t n = (size_t)snprintf(pre, sizeof pre, "rank %d: ", rank);
  if (!strncmp(why, pre, n)) why += n; /* ferry_comm_fail names the rank */
  if (ferry_comm_fail(comm, why))
    say("rank %d: telling the other ranks: %s\n", rank, ferry_comm_last_error(comm));
  const char *linger = getenv("FERRY_BENCH_TEST_LINGER");
  if (linger && atoi(linger) > 0 && test_fails_here()) sleep((unsigned)atoi(linger));
  ferry_comm_abort(comm, 1);
}

/* The layout the configured engine runs (for the planner's prediction). */
typedef struct {
  int optim_on_nvme;
  int zero_stage;      /* dist.zero_stage */
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
  l->zero_stage = ferry_config_get(c, "dist.zero_stage", b, sizeof b) ? 0 : atoi(b);
}

/* With ranks, each rank's swap files go under DIR/rank<r> of every
 * tiers.nvme.paths DIR (the engine wants a store of its own per rank). */
static int rank_nvme_paths(ferry_config *c) {
  const ferry_config_values *v = ferry_config_values_get(c);
  if (nranks <= 1 || v->nvme_npaths == 0) return FERRY_OK;
  char paths[FERRY_CFG_MAX_PATHS * 1040] = "";
  size_t o = 0;
  for (int i = 0; i < v->nvme_npaths && o < sizeof paths; i++) {
    mkdir(v->nvme_paths[i], 0700);
    o += (size_t)snprintf(paths + o, sizeof paths - o, "%s%s/rank%d", i ? "," : "",
                          v->nvme_paths[i], rank);
  }
  return o < sizeof paths ? ferry_config_set(c, "tiers.nvme.paths", paths) : FERRY_EINVAL;
}

/* Which engine open_engine makes from the config. */
typedef struct {
  size_t resident_bytes; /* > 0: the all-resident reference of that device size */
  int with_comm;         /* set the ranks' communicator on it (with ranks) */
  const char *grads;     /* placement.grads to use instead of the config's, or NULL */
} engine_kind;

/* The engine of the config file (then the --set values); resident_bytes >
 * 0: the same settings with everything on the device (a device that
 * large, the host backend), the reference. *optim_on_device (may be NULL):
 * the configured optimizer runs on the device. */
static ferry_engine *open_engine(const char *path, engine_kind k, int *optim_on_device,
                                 step_layout *layout) {
  size_t resident_bytes = k.resident_bytes;
  ferry_config *c = NULL;
  if (ferry_config_create(&c)) return NULL;
  int rc = ferry_config_load_file(c, path);
  for (int i = 0; i < nsets && !rc; i++) {
    char kv[1024];
    snprintf(kv, sizeof kv, "%s", sets[i]);
    char *eq = strchr(kv, '=');
    if (!eq) {
      say("--set wants KEY=VALUE, not '%s'\n", sets[i]);
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
  if (!rc && k.grads) rc = ferry_config_set(c, "placement.grads", k.grads);
  if (!rc) rc = rank_nvme_paths(c);
  if (rc) {
    say("%s\n", ferry_config_last_error(c));
    ferry_config_destroy(c);
    return NULL;
  }
  const ferry_config_values *v = ferry_config_values_get(c);
  for (int i = 0; i < v->nvme_npaths; i++) mkdir(v->nvme_paths[i], 0700);
  if (optim_on_device) *optim_on_device = v->place_optimizer == FERRY_TIER_DEVICE;
  if (layout) read_layout(c, layout);
  ferry_engine *e = NULL;
  if (ferry_engine_create(c, NULL, &e)) {
    say("engine: %s\n", ferry_last_error());
    e = NULL;
  }
  if (e && k.with_comm && nranks > 1 && ferry_engine_set_comm(e, comm)) {
    say("engine: %s\n", ferry_engine_last_error(e));
    ferry_engine_destroy(e);
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
  int ranks; /* --ranks N; 0: as launched */
} step_opts;

/* The integer options of bench step and their ranges. */
typedef struct {
  const char *name;
  long long lo, hi;
  size_t off; /* of the int in step_opts */
} int_range;
static const int_range int_opts[] = {
    {"--groups", 1, 4096, offsetof(step_opts, groups)},
    {"--dim", 8, 8192, offsetof(step_opts, dim)},
    {"--batch", 1, 65536, offsetof(step_opts, batch)},
    {"--steps", 1, 100000, offsetof(step_opts, steps)},
    {"--ranks", 1, 1024, offsetof(step_opts, ranks)},
};

static int int_opt(const char *a) {
  for (int k = 0; k < (int)(sizeof int_opts / sizeof int_opts[0]); k++)
    if (!strcmp(a, int_opts[k].name)) return k;
  return -1;
}

/* Returns -1 to go on, or the exit code (0 after --help, 2 bad usage).
 * --set values go to sets[]. */
static int parse_args(step_opts *o, int argc, char **argv) {
  *o = (step_opts){NULL, NULL, 24, 512, 8, 5, 0, 1, 4, 0};
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
        say("%s '%s': expected %s\n", a, val, st ? "fp32, bf16 or int8" : "fp32 or bf16");
        return 2;
      }
      char *dst = st ? state_set : master_set;
      snprintf(dst, 64, "%s=%s", st ? "optimizer.state_dtype" : "precision.master", val);
    }
    else if (v && int_opt(a) >= 0) {
      const int_range *r = &int_opts[int_opt(a)];
      long long x;
      if (bench_arg_int("ferry bench step", a, argv[++i], r->lo, r->hi, NULL, &x)) return 2;
      *(int *)((char *)o + r->off) = (int)x;
    } else if (v && !strcmp(a, "--compute-ms")) {
      if (bench_arg_num("ferry bench step", a, argv[++i], 0, 10000, &o->compute_ms)) return 2;
    } else {
      say("%s '%s'\n",
          int_opt(a) >= 0 || !strcmp(a, "--compute-ms") || !strcmp(a, "--config") ||
                  !strcmp(a, "--set") || !strcmp(a, "--timeline")
              ? "a value is missing after"
              : "unknown option",
          a);
      usage(stderr);
      return 2;
    }
  }
  if (!o->cfg) {
    say("--config FILE is required\n");
    return 2;
  }
  /* after the --set values: the flags win */
  if (state_set[0]) sets[nsets++] = state_set;
  if (master_set[0]) sets[nsets++] = master_set;
  /* the resident reference holds the whole model in RAM (24 bytes a param
   * and 64 MiB): refuse up front what cannot fit */
  uint64_t avail = bench_mem_available();
  double need = (double)o->groups * o->dim * o->dim * 24 + (64 << 20);
  if (avail && need > 0.9 * (double)avail) {
    char a[32], b[32];
    say("--groups %d with --dim %d needs %s of RAM for the "
        "resident reference run; %s is available: lower --groups or --dim\n",
        o->groups, o->dim, ferry_format_size((uint64_t)need, a, sizeof a),
        ferry_format_size(avail, b, sizeof b));
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
  engine_kind resident = {model_params(o) * 24 + ((size_t)64 << 20), 0, NULL};
  ferry_engine *e = open_engine(o->cfg, resident, NULL, NULL);
  if (!e) return 1;
  int rc = validate_run(e, o->groups, o->dim, o->batch, ref);
  if (rc) say("resident reference: %s\n", ferry_engine_last_error(e));
  ferry_engine_destroy(e);
  if (rc) return 1;
  int optim_dev = 0;
  e = open_engine(o->cfg, (engine_kind){0, 1, NULL}, &optim_dev, NULL);
  if (!e) return 1;
  int ret = 0;
  ferry_device_info info;
  /* with ranks every rank runs the same batches: the average of N equal
   * grads may round (3g / 3), so 1e-5 relative as on a cuda optimizer */
  int tolerant = (optim_dev && !ferry_device_get_info(ferry_engine_device(e), &info) &&
                  info.kind == FERRY_DEVICE_CUDA) || nranks > 1;
  rc = validate_run(e, o->groups, o->dim, o->batch, got);
  if (rc) {
    say("rank %d: validation failed: %s\n", rank, ferry_engine_last_error(e));
    abort_ranks();
  }
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
    say("%s\n", ferry_engine_last_error(e));
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
  /* nor are the write-backs of the chunks it left dirty in the host pool:
   * how many are still there depends on timing, so the byte counts start
   * clean (and end clean: the flush before the last stats) */
  if (!rc) rc = engine_flush(e);
  if (!rc) rc = ferry_engine_get_stats(e, before);
  ferry_timeline_reset(engine_timeline(e));
  *t0 = ferry_now();
  for (int k = 0; k < o->steps && !rc; k++) {
    if (k == 1 && test_fails_here()) return FERRY_EIO; /* run_timed says why */
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
  /* with ranks, per timed step (ferry_stats' comm figures, the timeline) */
  double comm_s, comm_wait_s, comm_bytes, comm_ops;
  double comm_busy_s;  /* the comm lanes' union */
  double hidden;       /* share of comm_busy_s during which the compute lane was busy */
  double alone;        /* step seconds of the same engine alone; 0: not timed */
} step_result;

static int by_start(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The union of the spans of `lanes` within [from, to], merged and sorted,
 * into iv (pairs; room for every span): the number of intervals. */
static size_t lane_union(const ferry_timeline *tl, const int *lanes, int nl, double from,
                         double to, double *iv) {
  size_t n = atomic_load(&tl->n), m = 0;
  if (n > tl->cap) n = tl->cap;
  for (size_t i = 0; i < n; i++) {
    const ferry_span *sp = &tl->spans[i];
    int in = 0;
    for (int k = 0; k < nl; k++) in |= sp->lane == lanes[k];
    double a = fmax(sp->t0, from), b = fmin(sp->t1, to);
    if (!in || b <= a) continue;
    iv[2 * m] = a;
    iv[2 * m + 1] = b;
    m++;
  }
  qsort(iv, m, 2 * sizeof *iv, by_start);
  size_t u = 0;
  for (size_t i = 0; i < m; i++) {
    if (u && iv[2 * i] <= iv[2 * (u - 1) + 1]) {
      iv[2 * (u - 1) + 1] = fmax(iv[2 * (u - 1) + 1], iv[2 * i + 1]);
    } else {
      iv[2 * u] = iv[2 * i];
      iv[2 * u + 1] = iv[2 * i + 1];
      u++;
    }
  }
  return u;
}

/* The comm lanes' busy seconds within [t0, t1] and the share of them
 * during which the compute lane was busy too. */
static int comm_overlap(const ferry_timeline *tl, double t0, double t1, double *busy,
                        double *hidden) {
  static const int comm_lanes[3] = {FERRY_LANE_COMM_LOOP, FERRY_LANE_COMM_DRAIN,
                                    FERRY_LANE_COMM_STEP};
  static const int compute_lane[1] = {FERRY_LANE_COMPUTE};
  size_t n = atomic_load(&tl->n);
  if (n > tl->cap) n = tl->cap;
  double *c = malloc((n ? n : 1) * 2 * sizeof *c), *k = malloc((n ? n : 1) * 2 * sizeof *k);
  if (!c || !k) {
    free(c);
    free(k);
    return FERRY_ENOMEM;
  }
  size_t nc = lane_union(tl, comm_lanes, 3, t0, t1, c);
  size_t nk = lane_union(tl, compute_lane, 1, t0, t1, k);
  double all = 0, both = 0;
  for (size_t i = 0; i < nc; i++) all += c[2 * i + 1] - c[2 * i];
  for (size_t i = 0, j = 0; i < nc && j < nk;) { /* two sorted, disjoint lists */
    double a = fmax(c[2 * i], k[2 * j]), b = fmin(c[2 * i + 1], k[2 * j + 1]);
    if (b > a) both += b - a;
    if (c[2 * i + 1] < k[2 * j + 1]) i++;
    else j++;
  }
  free(c);
  free(k);
  *busy = all;
  *hidden = all > 0 ? both / all : 0;
  return FERRY_OK;
}

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
  r->layout.in.gpus = nranks; /* one rank's share at dist.zero_stage >= 1 */
  r->layout.in.zero_stage = r->layout.zero_stage;
  r->plan_optim = ferry_plan_optim_nvme_bytes(&r->layout.in, FERRY_PLACE_NVME_OPT, groups,
                                              (size_t)o->groups);
  free(groups);
  if (r->plan_optim > 0)
    r->optim_error = fmax(fabs(r->nvme_rd[FERRY_FAMILY_OPTIM] / r->plan_optim - 1),
                          fabs(r->nvme_wr[FERRY_FAMILY_OPTIM] / r->plan_optim - 1));
}

/* A measured NVMe byte count against the planner's, as "+0.00%"; "n/a"
 * when nothing moved (report_text says why). */
static const char *vs_plan(double got, double plan, char *buf, size_t len) {
  if (got == 0) return "n/a";
  snprintf(buf, len, "%+.2f%%", 100 * (got / plan - 1));
  return buf;
}

static void report_text(const step_opts *o, const double got[3], const step_result *r) {
  const ferry_stats *st = &r->st;
  printf("step: %zu params in %d groups, %s, device %s\n", model_params(o), o->groups, o->cfg,
         r->device);
  if (o->validate)
    printf("  validation: losses %.6g %.6g %.6g %s the all-resident run's\n", got[0], got[1],
           got[2], nranks > 1 ? "within 1e-5 of" : "equal");
  else
    printf("  validation: skipped (--no-validate)\n");
  printf("  step time %.4f s (mean of %d)\n", r->per, o->steps);
  for (int k = 0; k < NCOMP; k++)
    printf("  %-10s busy %.4f s%s\n", comp_names[k], r->busy[k],
           k == r->longest ? "  <- longest" : "");
  printf("  overlap_ratio %.3f (step time / longest component)\n", r->per / r->busy[r->longest]);
  char a[32], b[32], c[32]; /* sizes in binary units, as every text the ferry command prints */
  printf("  peaks: gpu %s, host %s, nvme %s; stalls %.3f s\n",
         ferry_format_size(st->tier_peak[FERRY_TIER_DEVICE], a, sizeof a),
         ferry_format_size(st->tier_peak[FERRY_TIER_HOST], b, sizeof b),
         ferry_format_size(st->tier_peak[FERRY_TIER_NVME], c, sizeof c), st->stall_seconds);
  const ferry_plan_input *li = &r->layout.in;
  printf("  optimizer: %s states, %s master\n", ferry_plan_dtype_name(li->state_dtype),
         ferry_plan_dtype_name(li->master_dtype));
  for (int f = 0; f < FERRY_FAMILIES; f++)
    if (r->nvme_rd[f] > 0 || r->nvme_wr[f] > 0)
      printf("  nvme %-9s per step: read %s, written %s\n", fam_names[f],
             ferry_format_size((uint64_t)r->nvme_rd[f], a, sizeof a),
             ferry_format_size((uint64_t)r->nvme_wr[f], b, sizeof b));
  if (r->plan_optim > 0) {
    printf("  nvme optimizer per step: planner %s read and written; measured read %s, "
           "written %s\n", ferry_format_size((uint64_t)r->plan_optim, a, sizeof a),
           vs_plan(r->nvme_rd[FERRY_FAMILY_OPTIM], r->plan_optim, b, sizeof b),
           vs_plan(r->nvme_wr[FERRY_FAMILY_OPTIM], r->plan_optim, c, sizeof c));
    if (r->nvme_rd[FERRY_FAMILY_OPTIM] == 0)
      printf("  (n/a: nothing was read back: the host tier's budget kept the optimizer states "
             "between steps; the planner counts the read a model larger than host memory "
             "makes)\n");
  }
  if (nranks <= 1) return;
  printf("  ranks %d (%s), dist.zero_stage %d; rank 0's figures per step:\n", nranks,
         ferry_comm_kind_name(ferry_comm_get_kind(comm)), r->layout.zero_stage);
  printf("  communication %.4f s (%.0f collectives, %s sent; the comm lanes busy "
         "%.4f s), the engine's threads waited %.4f s on it\n",
         r->comm_s, r->comm_ops, ferry_format_size((uint64_t)r->comm_bytes, a, sizeof a),
         r->comm_busy_s, r->comm_wait_s);
  printf("  comm_hidden_fraction %.3f (of the comm lanes' busy time, the compute lane was busy "
         "too)\n", r->hidden);
  printf("  alone (no communicator, every rank at once) %.4f s per step: ranks add %+.4f s\n",
         r->alone, r->per - r->alone);
}

static void report(const step_opts *o, const double got[3], const step_result *r) {
  if (rank != 0) return; /* only rank 0 prints */
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
  json_int(&j, "ranks", nranks);
  json_int(&j, "zero_stage", r->layout.zero_stage);
  json_str(&j, "comm", ferry_comm_kind_name(ferry_comm_get_kind(comm)));
  json_num(&j, "comm_seconds_per_step", r->comm_s);
  json_num(&j, "comm_busy_seconds_per_step", r->comm_busy_s);
  json_num(&j, "comm_wait_seconds_per_step", r->comm_wait_s);
  json_num(&j, "comm_bytes_per_step", r->comm_bytes);
  json_num(&j, "comm_ops_per_step", r->comm_ops);
  if (nranks > 1 && isfinite(r->hidden)) json_num(&j, "comm_hidden_fraction", r->hidden);
  else json_null(&j, "comm_hidden_fraction");
  if (nranks > 1) {
    json_num(&j, "alone_step_seconds", r->alone);
    json_num(&j, "dist_overhead_seconds_per_step", r->per - r->alone);
  } else {
    json_null(&j, "alone_step_seconds");
    json_null(&j, "dist_overhead_seconds_per_step");
  }
  json_end(&j);
}

/* The ranks' figures of the timed steps (between `before` and r->st, over
 * [t0, t1]). */
static void comm_per_step(ferry_engine *e, const step_opts *o, const ferry_stats *before,
                          double t0, double t1, step_result *r) {
  r->comm_s = (r->st.comm_seconds - before->comm_seconds) / o->steps;
  r->comm_wait_s = (r->st.comm_wait_seconds - before->comm_wait_seconds) / o->steps;
  r->comm_bytes = (double)(r->st.comm_bytes - before->comm_bytes) / o->steps;
  r->comm_ops = (double)(r->st.comm_ops - before->comm_ops) / o->steps;
  if (comm_overlap(engine_timeline(e), t0, t1, &r->comm_busy_s, &r->hidden)) r->hidden = NAN;
  r->comm_busy_s /= o->steps;
}

/* The same engine without the communicator (grads kept where the ranks kept
 * them), timed by every rank at once as with ranks: *alone, seconds per
 * step. 0, or 1 (said on stderr; the job ends). */
static int time_alone(const step_opts *o, const char *grads, double *alone) {
  if (ferry_comm_barrier(comm, NULL)) {
    say("rank %d: barrier: %s\n", rank, ferry_comm_last_error(comm));
    abort_ranks();
    return 1;
  }
  ferry_engine *e = open_engine(o->cfg, (engine_kind){0, 0, grads}, NULL, NULL);
  ferry_stream *s = NULL;
  ferry_stats before;
  double t0, t1;
  int rc = !e || prepare_timing(e, o, &s);
  if (!rc && time_steps(e, s, o, &t0, &t1, &before)) {
    say("alone: %s\n", ferry_engine_last_error(e));
    rc = 1;
  }
  if (!rc) *alone = (t1 - t0) / o->steps;
  ferry_engine_destroy(e);
  if (rc) abort_ranks();
  return rc;
}

/* Times steps on a fresh engine (the trace of these steps) and reports: 0,
 * or 1 (said on stderr). With ranks, then the same engine alone. */
static int run_timed(const step_opts *o, const double got[3]) {
  step_result r;
  memset(&r, 0, sizeof r);
  ferry_engine *e = open_engine(o->cfg, (engine_kind){0, 1, NULL}, NULL, &r.layout);
  if (!e) {
    abort_ranks();
    return 1;
  }
  ferry_stream *s = NULL;
  ferry_stats before;
  double t0, t1;
  int ret = 1;
  if (prepare_timing(e, o, &s)) {
    abort_ranks();
    goto out;
  }
  if (time_steps(e, s, o, &t0, &t1, &before)) {
    say("rank %d: %s\n", rank,
        test_fails_here() ? "test hook: this rank fails at its second timed step "
                            "(FERRY_BENCH_TEST_FAIL_RANK)"
                          : ferry_engine_last_error(e));
    abort_ranks();
    goto out;
  }
  ferry_device_info info;
  r.device = ferry_device_get_info(ferry_engine_device(e), &info) ? "?" : info.name;
  r.per = (t1 - t0) / o->steps;
  r.longest = component_busy(e, t0, t1, o->steps, r.busy);
  if (o->timeline && rank == 0 && ferry_engine_write_timeline(e, o->timeline))
    say("%s\n", ferry_engine_last_error(e));
  /* the timed steps' dirty chunks still in the host pool, written now
   * (after t1: not timed), so each is counted once */
  if (engine_flush(e)) {
    say("rank %d: %s\n", rank, ferry_engine_last_error(e));
    abort_ranks();
    goto out;
  }
  ferry_engine_get_stats(e, &r.st);
  nvme_per_step(o, &before, &r);
  if (nranks > 1) {
    static const char *const home[] = {"gpu", "host", "nvme"};
    int none = 0;
    ferry_tier gh = ferry_engine_grad_home(e, &none);
    comm_per_step(e, o, &before, t0, t1, &r);
    ferry_engine_destroy(e);
    e = NULL;
    if (time_alone(o, none ? "none" : home[gh], &r.alone)) goto out;
  }
  report(o, got, &r);
  ret = 0;
out:
  ferry_engine_destroy(e);
  return ret;
}

/* The ranks of this run: a communicator (FERRY_COMM_AUTO: MPI under a
 * launcher, else one rank); --ranks N without a launcher runs this command
 * again under mpirun. -1 to go on, or the exit code. */
#define RELAUNCHED "FERRY_BENCH_STEP_RELAUNCHED"
static int relaunch(int n, int argc, char **argv) {
  char exe[PATH_MAX], np[16];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  char **args = calloc((size_t)argc + 8, sizeof *args);
  if (len <= 0 || !args) {
    say("--ranks %d: cannot find this program to run it under "
        "mpirun; run `mpirun -np %d ferry bench step ...` yourself\n",
        n, n);
    free(args);
    return 2;
  }
  exe[len] = '\0';
  snprintf(np, sizeof np, "%d", n);
  int k = 0;
  args[k++] = (char *)"mpirun";
  args[k++] = (char *)"--oversubscribe";
  args[k++] = (char *)"-np";
  args[k++] = np;
  args[k++] = exe;
  args[k++] = (char *)"bench";
  args[k++] = (char *)"step";
  for (int i = 1; i < argc; i++) args[k++] = argv[i];
  setenv(RELAUNCHED, "1", 1);
  fflush(stdout);
  fflush(stderr);
  execvp(args[0], args);
  say("--ranks %d: cannot run mpirun (%s): install OpenMPI "
      "(openmpi-bin), or start `mpirun -np %d ferry bench step ...` yourself\n",
      n, strerror(errno), n);
  free(args);
  return 2;
}

static int open_ranks(const step_opts *o, int argc, char **argv) {
  ferry_comm_options co = ferry_comm_options_default();
  co.kind = FERRY_COMM_AUTO;
  if (ferry_comm_create(&co, &comm)) {
    say("communicator: %s\n", ferry_last_error());
    return 1;
  }
  rank = ferry_comm_rank(comm);
  nranks = ferry_comm_size(comm);
  if (o->ranks > 1 && nranks == 1) {
    ferry_comm_destroy(comm);
    comm = NULL;
    if (getenv(RELAUNCHED)) {
      say("--ranks %d: started under mpirun, but the "
          "communicator has one rank (is this ferry built with MPI? `ferry info`)\n",
          o->ranks);
      return 1;
    }
    return relaunch(o->ranks, argc, argv);
  }
  if (o->ranks && o->ranks != nranks) {
    if (rank == 0) say("--ranks %d, but the launcher started %d ranks\n", o->ranks, nranks);
    ferry_comm_destroy(comm);
    comm = NULL;
    return 2;
  }
  return -1;
}

/* Whether any rank failed (a collective; with one rank, `failed`). */
static int any_failed(int failed) {
  if (nranks <= 1) return failed;
  int32_t mine = failed, any = 0;
  if (ferry_comm_allreduce(comm, &mine, &any, 1, FERRY_DT_I32, FERRY_REDUCE_MAX, NULL, NULL)) {
    say("rank %d: %s\n", rank, ferry_comm_last_error(comm));
    abort_ranks();
  }
  return any != 0;
}

int ferry_bench_step_main(int argc, char **argv) {
  step_opts o;
  int ex = parse_args(&o, argc, argv);
  if (ex >= 0) return ex;
  ex = open_ranks(&o, argc, argv);
  if (ex >= 0) return ex;
  double got[3] = {0, 0, 0};
  if (any_failed(o.validate && validate(&o, got))) {
    ex = 1;
  } else {
    if (!o.validate && rank == 0)
      say("validation skipped (--no-validate): the step is timed "
          "without checking its numbers\n");
    ex = run_timed(&o, got);
  }
  ferry_comm_destroy(comm);
  comm = NULL;
  return ex;
}
