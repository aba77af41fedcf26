/* examples/gpt/output.c — what ferry-gpt prints: error messages (with the
 * rank's prefix), the library's log lines, the engine's description, one
 * line or JSON object per step, the closing totals and footprint,
 * --stats-json and --timeline.
 */
#include "app.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* "rank R: " before every message on stderr once the run has several ranks
 * (set once the communicator exists). */
char g_rank_prefix[32];
char g_last_err[1024];

/* An error message on stderr: "[rank R: ]ferry-gpt: ...", one write, so the
 * lines of several ranks do not interleave. */
__attribute__((format(printf, 1, 2))) void errf(const char *fmt, ...) {
  char b[4096];
  int at = snprintf(b, sizeof b, "%sferry-gpt: ", g_rank_prefix);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b + at, sizeof b - (size_t)at, fmt, ap);
  va_end(ap);
  fputs(b, stderr);
  snprintf(g_last_err, sizeof g_last_err, "%.*s", (int)strcspn(b + at, "\n"), b + at);
}

/* The library's messages (warnings: buffered I/O, no fallocate, pageable
 * fallback, write-back failures) on stderr, one write per line, after the
 * prefix `user` ("rank R: " once there are ranks: handed over through
 * ferry_log_set, whose lock orders it before any thread reads it). Called
 * from any of ferry's threads. */
void gpt_log(void *user, int level, const char *message) {
  static const char *names[] = {"", "error", "warning", "info", "debug"};
  char b[1400];
  snprintf(b, sizeof b, "%sferry: %s: %s\n", (const char *)user,
           names[level >= 1 && level <= 4 ? level : 4], message);
  fputs(b, stderr);
}

void describe_engine(const ferry_config *fc, FILE *info) {
  static const char *keys[] = {"device",          "precision.params",    "placement.params",
                               "placement.grads", "placement.optimizer", "tiers.gpu.budget",
                               "optimizer.lr",    "grad_accumulation"};
  fprintf(info, "ferry-gpt: engine:");
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
    char v[256];
    if (ferry_config_get(fc, keys[i], v, sizeof v) == 0) fprintf(info, " %s=%s", keys[i], v);
  }
  fputc('\n', info);
}

void describe_model_states(ferry_engine *e, size_t numel, FILE *info) {
  static const char *const fam[FERRY_FAMILIES] = {"params", "grads", "optimizer"};
  static const char *const tier[FERRY_TIERS] = {"gpu", "host", "nvme"};
  ferry_stats st;
  if (ferry_engine_get_stats(e, &st)) return;
  /* a family's home is the deepest tier holding it (copies sit above it):
   * after finalize, its bytes there are what it occupies for the run */
  uint64_t home[FERRY_FAMILIES] = {0}, total = 0;
  int at[FERRY_FAMILIES] = {0};
  for (int f = 0; f < FERRY_FAMILIES; f++) {
    for (int t = FERRY_TIERS - 1; t >= 0 && !home[f]; t--)
      if (st.current[t][f]) home[f] = st.current[t][f], at[f] = t;
    total += home[f];
  }
  fprintf(info, "ferry-gpt: model states %.1f MiB (%.2f bytes/param):", total / MiB,
          numel ? (double)total / (double)numel : 0.0);
  for (int f = 0; f < FERRY_FAMILIES; f++) {
    if (home[f]) fprintf(info, "%s %s %.1f MiB on %s", f ? "," : "", fam[f], home[f] / MiB,
                         tier[at[f]]);
    else fprintf(info, "%s %s none", f ? "," : "", fam[f]);
  }
  fputc('\n', info);
}

static void json_peaks(const uint64_t *peak) {
  printf("\"peak_bytes\": {\"gpu\": %llu, \"host\": %llu, \"nvme\": %llu}",
         (unsigned long long)peak[0], (unsigned long long)peak[1], (unsigned long long)peak[2]);
}

/* Peak bytes per tier (gpu, host, nvme): with --engine its tiers (and *fs
 * its stats), else the process's peak RSS as host. */
static void train_peaks(const train_run *t, ferry_stats *fs, uint64_t peak[3]) {
  peak[0] = 0, peak[1] = gpt_peak_rss_bytes(), peak[2] = 0;
  if (!t->ge) return;
  ferry_engine_get_stats(gpt_engine_handle(t->ge), fs);
  for (int i = 0; i < 3; i++) peak[i] = fs->tier_peak[i];
}

/* The step's NVMe bytes per family and direction (JSON keys); the totals
 * so far become the next step's start. */
static void json_step_nvme(train_totals *tt) {
  uint64_t rd[FERRY_FAMILIES], wr[FERRY_FAMILIES];
  for (int k = 0; k < FERRY_FAMILIES; k++) {
    rd[k] = tt->fs.nvme_read_bytes[k] - tt->nvme_rd[k];
    wr[k] = tt->fs.nvme_write_bytes[k] - tt->nvme_wr[k];
    tt->nvme_rd[k] = tt->fs.nvme_read_bytes[k];
    tt->nvme_wr[k] = tt->fs.nvme_write_bytes[k];
  }
  printf(", ");
  gpt_footprint_json_families(stdout, "nvme_read_bytes", rd);
  printf(", ");
  gpt_footprint_json_families(stdout, "nvme_write_bytes", wr);
}

/* v as JSON: `fmt` when finite, else null (JSON has no NaN or infinity). */
static void json_number(FILE *f, double v, const char *fmt) {
  if (isfinite(v)) fprintf(f, fmt, v);
  else fputs("null", f);
}

/* Seconds as m:ss (h:mm:ss from an hour), for the progress line. */
static void clock_text(char *b, size_t n, double s) {
  long v = s > 0 ? (long)(s + 0.5) : 0;
  if (v >= 3600) snprintf(b, n, "%ld:%02ld:%02ld", v / 3600, v / 60 % 60, v % 60);
  else snprintf(b, n, "%ld:%02ld", v / 60, v % 60);
}

/* The step's line: JSON or the progress line (why: the error that ends the
 * run at this step, JSON's "error" field; the caller prints it on stderr). *stall0: the engine's stall
 * seconds so far, advanced to now. */
void train_report_step(const train_run *t, train_totals *tt, int st, float loss, double dt,
                              double *stall0, const char *why) {
  double tps = tt->tok_step / dt, stall = 0;
  uint64_t peak[3];
  train_peaks(t, &tt->fs, peak);
  if (t->ge) {
    stall = 100.0 * (tt->fs.stall_seconds - *stall0) / dt;
    *stall0 = tt->fs.stall_seconds;
  }
  if (t->o.json) {
    printf("{\"step\": %d, \"loss\": ", st);
    json_number(stdout, loss, "%.9g");
    printf(", \"tokens_per_s\": %.1f, ", tps);
    json_peaks(peak);
    printf(", \"stall_pct\": %.1f", stall);
    if (t->ge) json_step_nvme(tt);
    if (t->skipped) printf(", \"skipped\": true");
    if (why) {
      printf(", \"error\": ");
      gpt_json_string(stdout, why);
    }
    printf("}\n");
  } else {
    /* elapsed: from the launch; eta: the mean step so far times the steps left */
    int done = st - t->start + 1;
    char el[48], eta[48];
    clock_text(el, sizeof el, gpt_seconds_since_launch());
    clock_text(eta, sizeof eta, tt->t_all / (done > 0 ? done : 1) * (t->o.steps - st));
    printf("step %5d/%d  loss %.4f  %8.0f tok/s  gpu %.3f GiB  host %.3f GiB  nvme %.3f GiB  "
           "stall %.1f%%  elapsed %s  eta %s\n",
           st, t->o.steps, loss, tps, peak[0] / GiB, peak[1] / GiB, peak[2] / GiB, stall, el, eta);
    if (t->skipped)
      printf("step %5d: skipped by the engine (inf/NaN grads); the loss scale is now %g\n", st,
             (double)ferry_loss_scale(gpt_engine_handle(t->ge)));
  }
  fflush(stdout);
}

/* The run's footprint once its steps are done (tt->fs: the engine's stats
 * after the last step). */
static void train_footprint(const train_run *t, const train_totals *tt, gpt_footprint *f) {
  memset(f, 0, sizeof *f);
  f->params = (uint64_t)t->s.total_numel;
  f->peak_rss = gpt_peak_rss_bytes();
  if (t->m) f->activation_bytes = gpt_model_activation_bytes(t->m);
  /* sync mode (the CPU model): host scratch; stream mode: device memory */
  if (t->ge && !t->o.cuda) f->scratch_bytes = gpt_engine_scratch_bytes(t->ge);
  f->data_bytes = t->d.n * sizeof *t->d.tokens;
  if (!t->ge) f->resident_bytes = 16 * (uint64_t)t->s.total_numel; /* w, g, m, v in fp32 */
  if (t->ge) {
    gpt_footprint_engine(f, &tt->fs);
    memcpy(f->setup_read, tt->fs0.nvme_read_bytes, sizeof f->setup_read);
    memcpy(f->setup_write, tt->fs0.nvme_write_bytes, sizeof f->setup_write);
  }
  f->steps = tt->ran;
  f->startup_seconds = tt->startup;
  f->losses = tt->losses;
  f->nranks = t->nranks;
  f->rank_figs = t->rank_figs;
}

/* --stats-json FILE: the footprint, the steps and their losses. */
int train_write_stats(const train_run *t, const gpt_footprint *f) {
  char err[512];
  if (!t->o.stats_json || t->rank > 0) return 0; /* rank 0's file holds every rank's peaks */
  if (gpt_footprint_write(f, t->o.engine, t->o.stats_json, err, sizeof err)) {
    errf("--stats-json %s\n", err);
    return 1;
  }
  return 0;
}

/* The closing lines: totals, peaks, stalls and (--engine) bytes moved, then
 * the footprint (JSON keys, or the memory and nvme lines). */
void train_report_totals(const train_run *t, train_totals *tt, gpt_footprint *f) {
  int ran = tt->ran, start = t->start;
  double tps = tt->t_all > 0 ? (double)ran * tt->tok_step / tt->t_all : 0;
  uint64_t peak[3];
  double stall = 0;
  train_peaks(t, &tt->fs, peak);
  if (t->ge) stall = tt->t_all > 0 ? 100.0 * tt->fs.stall_seconds / tt->t_all : 0;
  const ferry_stats *fs = &tt->fs;
  train_footprint(t, tt, f);
  if (t->o.json) {
    printf("{\"final\": true, \"steps\": %d, \"first_step\": %d, \"tokens\": %lld, "
           "\"seconds\": %.3f, \"tokens_per_s\": %.1f, \"first_loss\": ",
           ran, start, (long long)ran * tt->tok_step, tt->t_all, tps);
    json_number(stdout, ran ? tt->first : 0.0, "%.6f");
    printf(", \"last_loss\": ");
    json_number(stdout, ran ? tt->last : 0.0, "%.6f");
    printf(", ");
    json_peaks(peak);
    printf(", \"stall_pct\": %.1f, \"rss_bytes\": %llu", stall,
           (unsigned long long)f->peak_rss);
    if (t->ge)
      printf(", \"bytes_moved\": {\"h2d\": %llu, \"d2h\": %llu, \"host_to_nvme\": %llu, "
             "\"nvme_to_host\": %llu}, \"engine\": \"%s\", ",
             (unsigned long long)fs->bytes_h2d, (unsigned long long)fs->bytes_d2h,
             (unsigned long long)fs->bytes_host_to_nvme,
             (unsigned long long)fs->bytes_nvme_to_host, t->o.engine);
    else
      printf(", \"engine\": \"pre-engine (resident)\", ");
    gpt_footprint_json(f, stdout);
    printf("}\n");
  } else {
    if (ran)
      printf("done: %d steps (%d..%d), %lld tokens in %.2f s, %.0f tok/s, loss %.4f -> %.4f\n",
             ran, start, t->o.steps, (long long)ran * tt->tok_step, tt->t_all, tps, tt->first,
             tt->last);
    else
      printf("done: no step to run (the run was already at step %d = --steps)\n", start - 1);
    if (t->ge)
      printf("peaks: gpu %.1f MiB, host %.1f MiB, nvme %.1f MiB (engine tiers); process RSS "
             "%.1f MiB; stalled %.1f%% of the time; moved h2d %.1f MiB, d2h %.1f MiB, "
             "host->nvme %.1f MiB, nvme->host %.1f MiB\n",
             peak[0] / MiB, peak[1] / MiB, peak[2] / MiB, f->peak_rss / MiB, stall,
             fs->bytes_h2d / MiB, fs->bytes_d2h / MiB, fs->bytes_host_to_nvme / MiB,
             fs->bytes_nvme_to_host / MiB);
    else
      printf("peak host %.1f MiB (process RSS)\n", f->peak_rss / MiB);
  }
  gpt_footprint_print(f, t->info);
  fflush(stdout);
}

/* --timeline: the engine's Chrome trace. */
int train_write_timeline(const train_run *t) {
  if (!t->ge || !t->o.timeline) return 0;
  char path[4200];
  const char *p = t->o.timeline;
  if (t->nranks > 1) { /* one file per rank: a.json -> a.rank<R>.json */
    const char *slash = strrchr(p, '/'), *dot = strrchr(p, '.');
    if (!dot || (slash && dot < slash) || dot == (slash ? slash + 1 : p)) dot = p + strlen(p);
    snprintf(path, sizeof path, "%.*s.rank%d%.100s", (int)(dot - p) > 4000 ? 4000 : (int)(dot - p),
             p, t->rank, dot);
    p = path;
  }
  if (ferry_engine_write_timeline(gpt_engine_handle(t->ge), p)) {
    errf("--timeline %s: %s\n", p, ferry_engine_last_error(gpt_engine_handle(t->ge)));
    return 1;
  }
  fprintf(t->info, "ferry-gpt: wrote the timeline %s%s (Chrome trace JSON: chrome://tracing or "
          "https://ui.perfetto.dev)\n", p, t->nranks > 1 ? " and one per other rank" : "");
  return 0;
}
