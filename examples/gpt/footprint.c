/* examples/gpt/footprint.c — a train run's memory footprint and NVMe
 * traffic, measured (peak RSS, the engine's stats) and reported (a text
 * line, a JSON fragment, the --stats-json file).
 */
#include "footprint.h"
#include "blas.h"
#include "core/outfile.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static const char *k_tiers[FERRY_TIERS] = {"gpu", "host", "nvme"};
static const char *k_families[FERRY_FAMILIES] = {"params", "grads", "optimizer"};

uint64_t gpt_proc_status_kb(const char *key, int *found) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  size_t kl = strlen(key);
  unsigned long long kb = 0;
  *found = 0;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, key, kl) && line[kl] == ':' && sscanf(line + kl + 1, " %llu kB", &kb) == 1) {
      *found = 1;
      break;
    }
  if (f) fclose(f);
  return kb;
}

uint64_t gpt_peak_rss_bytes(void) {
  int found;
  uint64_t kb = gpt_proc_status_kb("VmHWM", &found);
  if (found) return kb * 1024;
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (uint64_t)ru.ru_maxrss * 1024;
}

double gpt_seconds_since_launch(void) {
  static double first = -1;
  struct timespec now;
  clock_gettime(CLOCK_BOOTTIME, &now);
  double t = (double)now.tv_sec + now.tv_nsec * 1e-9;
  if (first < 0) first = t;
  char b[1024];
  FILE *f = fopen("/proc/self/stat", "r");
  size_t n = f ? fread(b, 1, sizeof b - 1, f) : 0;
  if (f) fclose(f);
  b[n] = '\0';
  /* field 22, starttime in clock ticks after boot; fields 3.. follow the
   * command name's closing parenthesis */
  const char *q = strrchr(b, ')');
  long hz = sysconf(_SC_CLK_TCK);
  for (int field = 2; q && *q && field < 22; q++)
    if (*q == ' ') field++;
  unsigned long long ticks;
  if (q && hz > 0 && sscanf(q, "%llu", &ticks) == 1 && (double)ticks / hz <= t)
    return t - (double)ticks / hz;
  return t - first;
}

void gpt_footprint_engine(gpt_footprint *f, const ferry_stats *fs) {
  f->engine = 1;
  for (int t = 0; t < FERRY_TIERS; t++) {
    f->tier_peak[t] = fs->tier_peak[t];
    f->budget[t] = fs->budget[t];
    f->optim_peak[t] = fs->peak[t][FERRY_FAMILY_OPTIM];
    f->params_peak[t] = fs->peak[t][FERRY_FAMILY_PARAMS];
  }
  for (int k = 0; k < FERRY_FAMILIES; k++)
    f->nvme_read[k] = fs->nvme_read_bytes[k], f->nvme_write[k] = fs->nvme_write_bytes[k];
  f->nvme_file = fs->nvme_file_bytes;
  f->nvme_data = fs->nvme_data_bytes;
  f->optim_bytes_per_param = fs->optim_bytes_per_param;
}

/* The value in the unit that suits `scale` (B, KiB, MiB, GiB), 1 decimal. */
static const char *size_in(uint64_t v, uint64_t scale, char *b, size_t len) {
  static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double d = 1;
  while (u < 4 && scale >= 1024 * (uint64_t)d) d *= 1024, u++;
  if (u == 0) snprintf(b, len, "%" PRIu64 " B", v);
  else snprintf(b, len, "%.1f %s", v / d, unit[u]);
  return b;
}

static const char *size_of(uint64_t v, char *b, size_t len) { return size_in(v, v, b, len); }

/* "a / b / c" of three family values. */
static const char *families(const uint64_t *v, char *b, size_t len) {
  char x[3][32];
  snprintf(b, len, "%s / %s / %s", size_of(v[0], x[0], 32), size_of(v[1], x[1], 32),
           size_of(v[2], x[2], 32));
  return b;
}

/* The per-step mean of the NVMe bytes after setup. */
static void per_step(const gpt_footprint *f, uint64_t rd[FERRY_FAMILIES],
                     uint64_t wr[FERRY_FAMILIES]) {
  for (int k = 0; k < FERRY_FAMILIES; k++) {
    rd[k] = f->steps ? (f->nvme_read[k] - f->setup_read[k]) / (uint64_t)f->steps : 0;
    wr[k] = f->steps ? (f->nvme_write[k] - f->setup_write[k]) / (uint64_t)f->steps : 0;
  }
}

/* A budget the engine treats as none (the nvme tier without a size). */
#define NO_BUDGET ((uint64_t)1 << 62)

/* "gpu 30.1/32.0 MiB" (one unit), "host 18.2 MiB/2.0 GiB", "nvme 12.1 MiB"
 * (no budget). */
static void print_engine_peaks(const gpt_footprint *f, FILE *out) {
  fprintf(out, "; engine peaks");
  for (int t = 0; t < FERRY_TIERS; t++) {
    char a[32], b[32], c[32];
    uint64_t p = f->tier_peak[t], bud = f->budget[t];
    size_of(p, a, sizeof a);
    fprintf(out, "%s %s ", t ? "," : "", k_tiers[t]);
    if (!bud || bud >= NO_BUDGET) {
      fputs(a, out);
      continue;
    }
    size_of(bud, b, sizeof b);
    size_in(p, bud, c, sizeof c); /* the peak in the budget's unit */
    const char *ua = strchr(a, ' '), *ub = strchr(b, ' ');
    if (ua && ub && !strcmp(ua, ub)) fprintf(out, "%.*s/%s", (int)(strchr(c, ' ') - c), c, b);
    else fprintf(out, "%s/%s", a, b);
  }
}

void gpt_footprint_print(const gpt_footprint *f, FILE *out) {
  char a[32], b[32], c[32], d[96], e[96];
  fprintf(out, "memory: peak RSS %s", size_of(f->peak_rss, a, sizeof a));
  if (f->engine) {
    print_engine_peaks(f, out);
    fprintf(out, "; optimizer %.4g B/param/step", f->optim_bytes_per_param);
  } else fprintf(out, "; pre-engine weights+grads+AdamW %s", size_of(f->resident_bytes, a, sizeof a));
  fprintf(out, "; trainer activations %s, scratch %s, data %s\n",
          size_of(f->activation_bytes, a, sizeof a), size_of(f->scratch_bytes, b, sizeof b),
          size_of(f->data_bytes, c, sizeof c));
  if (!f->engine) return;
  uint64_t rd[FERRY_FAMILIES], wr[FERRY_FAMILIES];
  per_step(f, rd, wr);
  fprintf(out, "nvme (params / grads / optimizer): read %s, written %s;",
          families(f->nvme_read, d, sizeof d), families(f->nvme_write, e, sizeof e));
  fprintf(out, " per step read %s, written %s", families(rd, d, sizeof d),
          families(wr, e, sizeof e));
  fprintf(out, " (before step 1: read %s, written %s)", families(f->setup_read, d, sizeof d),
          families(f->setup_write, e, sizeof e));
  if (f->nvme_file)
    fprintf(out, "; swap files %s on disk for %s of data", size_of(f->nvme_file, a, sizeof a),
            size_of(f->nvme_data, b, sizeof b));
  fputc('\n', out);
}

void gpt_footprint_json_families(FILE *out, const char *key, const uint64_t *v) {
  fprintf(out, "\"%s\": {", key);
  for (int k = 0; k < FERRY_FAMILIES; k++)
    fprintf(out, "%s\"%s\": %" PRIu64, k ? ", " : "", k_families[k], v[k]);
  fprintf(out, "}");
}

static void json_tiers(FILE *out, const char *key, const uint64_t *v) {
  fprintf(out, "\"%s\": {", key);
  for (int t = 0; t < FERRY_TIERS; t++)
    fprintf(out, "%s\"%s\": %" PRIu64, t ? ", " : "", k_tiers[t], v[t]);
  fprintf(out, "}");
}

void gpt_footprint_json(const gpt_footprint *f, FILE *out) {
  fprintf(out, "\"peak_rss_bytes\": %" PRIu64 ", \"activation_bytes\": %" PRIu64
          ", \"scratch_bytes\": %" PRIu64 ", \"data_bytes\": %" PRIu64
          ", \"resident_bytes\": %" PRIu64 ", ",
          f->peak_rss, f->activation_bytes, f->scratch_bytes, f->data_bytes, f->resident_bytes);
  json_tiers(out, "tier_peak", f->tier_peak);
  fprintf(out, ", ");
  json_tiers(out, "budget", f->budget);
  if (f->engine) fprintf(out, ", \"optim_bytes_per_param\": %.9g", f->optim_bytes_per_param);
  else fprintf(out, ", \"optim_bytes_per_param\": null");
  uint64_t rd[FERRY_FAMILIES], wr[FERRY_FAMILIES];
  per_step(f, rd, wr);
  const struct {
    const char *key;
    const uint64_t *v;
  } fam[] = {{"nvme_read_bytes", f->nvme_read},
             {"nvme_write_bytes", f->nvme_write},
             {"nvme_read_bytes_per_step", rd},
             {"nvme_write_bytes_per_step", wr},
             {"nvme_setup_read_bytes", f->setup_read},
             {"nvme_setup_write_bytes", f->setup_write}};
  for (size_t i = 0; i < sizeof fam / sizeof *fam; i++) {
    fprintf(out, ", ");
    gpt_footprint_json_families(out, fam[i].key, fam[i].v);
  }
  fprintf(out, ", ");
  json_tiers(out, "optim_peak", f->optim_peak);
  fprintf(out, ", ");
  json_tiers(out, "params_peak", f->params_peak);
  fprintf(out, ", \"nvme_file_bytes\": %" PRIu64 ", \"nvme_data_bytes\": %" PRIu64, f->nvme_file,
          f->nvme_data);
  fprintf(out, ", \"ranks\": %d", f->nranks > 1 ? f->nranks : 1);
  fprintf(out, ", \"startup_seconds\": %.3f", f->startup_seconds);
  if (f->nranks < 2 || !f->rank_figs) return;
  fprintf(out, ", \"per_rank\": [");
  for (int r = 0; r < f->nranks; r++) {
    const uint64_t *v = f->rank_figs + (size_t)r * GPT_RANK_FIGS;
    fprintf(out, "%s{\"rank\": %d, ", r ? ", " : "", r);
    json_tiers(out, "optim_peak", v + GPT_RANK_OPTIM);
    fprintf(out, ", ");
    json_tiers(out, "params_peak", v + GPT_RANK_PARAMS);
    fprintf(out, ", ");
    json_tiers(out, "tier_peak", v + GPT_RANK_TIER);
    fprintf(out, ", \"peak_rss_bytes\": %" PRIu64 ", \"comm_bytes\": %" PRIu64 "}",
            v[GPT_RANK_RSS], v[GPT_RANK_COMM]);
  }
  fprintf(out, "]");
}

void gpt_json_string(FILE *out, const char *s) {
  if (!s) {
    fputs("null", out);
    return;
  }
  fputc('"', out);
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') fprintf(out, "\\%c", ch);
    else if (ch < 0x20) fprintf(out, "\\u%04x", ch);
    else fputc(ch, out);
  }
  fputc('"', out);
}

int gpt_footprint_write(const gpt_footprint *f, const char *engine, const char *path, char *err,
                        size_t len) {
  ferry_outfile o;
  if (ferry_outfile_open(&o, path, err, len)) return -1;
  FILE *out = o.f;
  fprintf(out, "{\"params\": %llu, \"steps\": %d, \"losses\": [", (unsigned long long)f->params,
          f->steps);
  for (int i = 0; f->losses && i < f->steps; i++)
    if (isfinite(f->losses[i])) fprintf(out, "%s%.9g", i ? ", " : "", (double)f->losses[i]);
    else fprintf(out, "%snull", i ? ", " : ""); /* an fp16 step skipped: JSON has no NaN */
  fprintf(out, "], \"engine\": ");
  gpt_json_string(out, engine);
  fprintf(out, ", \"blas\": ");
  gpt_blas_json(out);
  fprintf(out, ", ");
  gpt_footprint_json(f, out);
  fprintf(out, "}\n");
  return ferry_outfile_commit(&o, err, len) ? -1 : 0;
}
