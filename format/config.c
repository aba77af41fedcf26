/* format/config.c — the engine configuration: a table of every key, the
 * libconfig file reader (unknown keys refused with a suggestion, every
 * error with file, line, key, value and what was expected), setters and
 * getters from C with the same syntax, and a writer.
 */
#include "format/config.h"
#include "core/outfile.h"
#include "core/untrusted.h"

#include <ctype.h>
#include <errno.h>
#include <libconfig.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { K_ENUM, K_SIZE, K_INT, K_POW2, K_FLOAT, K_BOOL, K_STR, K_PATHS, K_FLOAT2, K_SCALE } kind;

typedef struct {
  const char *name;
  kind k;
  size_t off;
  const char *def;     /* default, in the text syntax of ferry_config_set */
  const char *names;   /* K_ENUM: "a|b|c" */
  double lo, hi;       /* K_INT / K_FLOAT / K_FLOAT2 bounds (inclusive) */
  int lo_open;         /* K_FLOAT: lo excluded */
  const char *desc;
  const int *vals;     /* K_ENUM: the enum value of each name, in the names' order */
} key_def;

#define OFF(f) offsetof(ferry_config_values, f)

/* Every message of this file goes through here: a name or value read from
 * a file or given to a setter is shown with its control bytes written as
 * \xNN (core/untrusted.h), so a config file cannot drive a terminal. */
static int cfg_err(ferry_errbuf *e, int status, const char *fmt, ...) FERRY_PRINTF(3, 4);
static int cfg_err(ferry_errbuf *e, int status, const char *fmt, ...) {
  char msg[FERRY_ERR_MAX], shown[FERRY_ERR_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return ferry_err(e, status, "%s", ferry_escape(msg, shown, sizeof shown));
}

/* The library's enum value of each name of an enum key, in the names' order
 * (every enum key has one, as long as its list of names). */
static const int v_device[] = {FERRY_DEVICE_AUTO, FERRY_DEVICE_CUDA, FERRY_DEVICE_HOST};
static const int v_tier[] = {FERRY_TIER_DEVICE, FERRY_TIER_HOST, FERRY_TIER_NVME};
static const int v_grads[] = {FERRY_GRADS_AUTO, FERRY_TIER_DEVICE, FERRY_TIER_HOST,
                              FERRY_TIER_NVME, FERRY_GRADS_NONE};
static const int v_optim[] = {FERRY_OPTIM_ADAMW, FERRY_OPTIM_ADAM, FERRY_OPTIM_ADAGRAD,
                              FERRY_OPTIM_LAMB,  FERRY_OPTIM_SGD,  FERRY_OPTIM_LION};
static const int v_prec[] = {FERRY_DT_F32, FERRY_DT_F16, FERRY_DT_BF16};
static const int v_prec_grads[] = {FERRY_DT_F32, FERRY_DT_BF16};
static const int v_state_dt[] = {FERRY_DT_F32, FERRY_DT_BF16, FERRY_DT_I8};
static const int v_evict[] = {FERRY_EVICT_TRACE, FERRY_EVICT_LRU};
static const int v_fit[] = {FERRY_FIT_FIRST, FERRY_FIT_LAST, FERRY_FIT_RANDOM};
static const int v_numa[] = {FERRY_NUMA_LOCAL, FERRY_NUMA_INTERLEAVE, FERRY_NUMA_NONE};
static const int v_memlock[] = {FERRY_MEMLOCK_ERROR, FERRY_MEMLOCK_PAGEABLE};
static const int v_verify[] = {FERRY_VERIFY_CRC32C, FERRY_VERIFY_NONE};
static const int v_missing[] = {FERRY_MISSING_GRAD_SKIP, FERRY_MISSING_GRAD_ZERO};
static const int v_log[] = {FERRY_LOG_SILENT, FERRY_LOG_ERROR, FERRY_LOG_WARN, FERRY_LOG_INFO,
                            FERRY_LOG_DEBUG};

static const key_def keys[] = {
    {"device", K_ENUM, OFF(device), "auto", "auto|cuda|host", 0, 0, 0,
     "which backend stands for the GPU: cuda when a device is present (auto), or the emulated "
     "host GPU", v_device},
    {"chunk_size", K_SIZE, OFF(chunk_size), "64M", NULL, 4096, 1e15, 0,
     "unit of residency, transfer and I/O; tensors are packed into chunks of this size", NULL},
    {"tiers.gpu.budget", K_SIZE, OFF(gpu_budget), "0", NULL, 0, 1e18, 0,
     "device memory ferry may use; 0 = free device memory less 5% (cuda); the host backend "
     "needs a value", NULL},
    {"tiers.host.budget", K_SIZE, OFF(host_budget), "0", NULL, 0, 1e18, 0,
     "host memory for the host tier and staging buffers; 0 = 80% of available RAM", NULL},
    {"tiers.host.pinned", K_BOOL, OFF(host_pinned), "true", NULL, 0, 0, 0,
     "page-lock the host tier for fast async copies", NULL},
    {"tiers.host.numa", K_ENUM, OFF(host_numa), "local", "local|interleave|none", 0, 0, 0,
     "NUMA placement of the host tier", v_numa},
    {"tiers.host.memlock_fallback", K_ENUM, OFF(host_memlock), "error", "error|pageable", 0, 0, 0,
     "when RLIMIT_MEMLOCK is below the pinned need: refuse to start, or use pageable memory "
     "(logged)", v_memlock},
    {"tiers.host.hugepages", K_BOOL, OFF(host_hugepages), "true", NULL, 0, 0, 0,
     "ask for transparent huge pages for the host tier", NULL},
    {"tiers.nvme.paths", K_PATHS, OFF(nvme_paths), "", NULL, 0, 0, 0,
     "directories for swap files, one file each, chunks striped across them", NULL},
    {"tiers.nvme.budget", K_SIZE, OFF(nvme_budget), "0", NULL, 0, 1e18, 0,
     "NVMe bytes ferry may reserve; 0 = what the layout needs", NULL},
    {"tiers.nvme.queue_depth", K_INT, OFF(nvme_queue_depth), "32", NULL, 1, 4096, 0,
     "io_uring requests in flight per ring", NULL},
    {"tiers.nvme.block_size", K_SIZE, OFF(nvme_block_size), "1M", NULL, 4096, 1 << 30, 0,
     "size of one I/O request", NULL},
    {"tiers.nvme.verify", K_ENUM, OFF(nvme_verify), "crc32c", "crc32c|none", 0, 0, 0,
     "checksum of every chunk written, checked on every read", v_verify},
    {"tiers.nvme.sqpoll", K_BOOL, OFF(nvme_sqpoll), "false", NULL, 0, 0, 0,
     "io_uring SQPOLL (a kernel thread polls submissions; costs a core)", NULL},
    {"tiers.nvme.check_threads", K_INT, OFF(nvme_check_threads), "1", NULL, 0, 64, 0,
     "threads that share the CRC checks of each burst of reads with the completion thread "
     "(0..64; 0: the completion thread checks alone)", NULL},
    {"tiers.nvme.keep_files", K_BOOL, OFF(nvme_keep_files), "false", NULL, 0, 0, 0,
     "keep swap files and their index at exit (a new engine starts a fresh store)", NULL},
    {"placement.params", K_ENUM, OFF(place_params), "gpu", "gpu|host|nvme", 0, 0, 0,
     "home tier of the 16-bit parameters (host or nvme: streamed per group)", v_tier},
    {"placement.grads", K_ENUM, OFF(place_grads), "auto", "auto|gpu|host|nvme|none", 0, 0, 0,
     "where gradients accumulate: auto = gpu with placement.optimizer = gpu, none when the "
     "step runs during backward (step_during_backward, no clipping, no fp16) with "
     "grad_accumulation = 1, else the optimizer's home; none = no accumulator, each group's "
     "grads live in the drain's staging until its update; nvme needs tiers.nvme.paths",
     v_grads},
    {"placement.optimizer", K_ENUM, OFF(place_optimizer), "host", "gpu|host|nvme", 0, 0, 0,
     "home tier of the master weights and optimizer states (gpu on cuda: the CUDA AdamW, "
     "so optimizer.type adamw or adam, with placement.grads = gpu or auto)",
     v_tier},
    {"optimizer.type", K_ENUM, OFF(opt_type), "adamw", "adamw|adam|adagrad|lamb|sgd|lion", 0, 0,
     0, "optimizer", v_optim},
    {"optimizer.lr", K_FLOAT, OFF(lr), "0.0001", NULL, 0, 1e3, 0,
     "learning rate, in [0, 1000]; 0 is accepted as in PyTorch (the optimizer states still "
     "update, the weights keep still)", NULL},
    {"optimizer.betas", K_FLOAT2, OFF(betas), "0.9, 0.999", NULL, 0, 1, 0,
     "Adam/LAMB/Lion betas, each in [0, 1)", NULL},
    {"optimizer.eps", K_FLOAT, OFF(eps), "1e-08", NULL, 0, 1, 0, "denominator epsilon", NULL},
    {"optimizer.weight_decay", K_FLOAT, OFF(weight_decay), "0.01", NULL, 0, 10, 0,
     "weight decay (decoupled for adamw and lion, L2 for the others)", NULL},
    {"optimizer.momentum", K_FLOAT, OFF(momentum), "0.9", NULL, 0, 1, 0, "SGD momentum", NULL},
    {"optimizer.nesterov", K_BOOL, OFF(nesterov), "false", NULL, 0, 0, 0, "SGD Nesterov momentum", NULL},
    {"optimizer.threads", K_INT, OFF(threads), "0", NULL, 0, 4096, 0,
     "CPU optimizer threads; 0 = one per core", NULL},
    {"optimizer.state_dtype", K_ENUM, OFF(opt_state_dtype), "fp32", "fp32|bf16|int8", 0, 0, 0,
     "dtype of the optimizer states (exp_avg, exp_avg_sq, momentum): bf16 halves them; int8 "
     "keeps one byte per value and an fp32 absmax per block of optimizer.state_block values "
     "(adamw, adam and lion)",
     v_state_dt},
    {"optimizer.state_block", K_POW2, OFF(opt_state_block), "256", NULL, 32, 4096, 0,
     "int8 states: values per fp32 absmax block, a power of two in [32, 4096]", NULL},
    {"optimizer.missing_grad", K_ENUM, OFF(missing_grad), "skip", "skip|zero", 0, 0, 0,
     "a param that gets no gradient in a step (ferry_param_no_grad; ferry.torch: its .grad "
     "stayed None): skip leaves it, its optimizer state and its own step count as they are "
     "(torch.optim); zero steps it with zero grads, so momentum and weight decay still move "
     "it (DeepSpeed)",
     v_missing},
    {"precision.params", K_ENUM, OFF(prec_params), "bf16", "fp32|fp16|bf16", 0, 0, 0,
     "dtype of the parameters the GPU computes with", v_prec},
    {"precision.grads", K_ENUM, OFF(prec_grads), "fp32", "fp32|bf16", 0, 0, 0,
     "dtype of the gradient accumulators of host and nvme grad homes (bf16 halves their "
     "bytes; not with placement.grads = gpu)", v_prec_grads},
    {"precision.master", K_ENUM, OFF(prec_master), "fp32", "fp32|bf16", 0, 0, 0,
     "master weights: fp32 (a master copy beside the params) or bf16 (no copy: the bf16 params "
     "are the master, updated in fp32 and written back with stochastic rounding; needs "
     "precision.params = bf16)",
     v_prec_grads},
    {"precision.loss_scale", K_SCALE, OFF(loss_scale), "dynamic", NULL, 0, 0, 0,
     "\"dynamic\" or a fixed scale > 0 (fp16; bf16 and fp32 use 1)", NULL},
    {"precision.initial_scale", K_FLOAT, OFF(initial_scale), "65536", NULL, 0, 1e30, 1,
     "first dynamic loss scale", NULL},
    {"precision.growth_interval", K_INT, OFF(growth_interval), "2000", NULL, 1, 1e9, 0,
     "steps without overflow before the dynamic scale doubles", NULL},
    {"precision.backoff", K_FLOAT, OFF(backoff), "0.5", NULL, 0, 1, 1,
     "factor applied to the dynamic scale on overflow", NULL},
    {"clip_grad_norm", K_FLOAT, OFF(clip_grad_norm), "0", NULL, 0, 1e30, 0,
     "clip gradients to this global L2 norm; 0 = off", NULL},
    {"grad_accumulation", K_INT, OFF(grad_accumulation), "1", NULL, 1, 1e6, 0,
     "micro-batches per optimizer step", NULL},
    {"eviction", K_ENUM, OFF(eviction), "furthest", "furthest|lru", 0, 0, 0,
     "eviction policy: furthest next use from the recorded trace, or least recently used", v_evict},
    {"fit", K_ENUM, OFF(fit), "first", "first|last|random", 0, 0, 0,
     "where a copy lands among the free blocks of a pool that fit it: the lowest, the highest, "
     "or a random one (fit_seed); last and random are for tests (no result may depend on it)",
     v_fit},
    {"fit_seed", K_INT, OFF(fit_seed), "1", NULL, 1, 9e15, 0,
     "seed of fit = random", NULL},
    {"prefetch_depth", K_INT, OFF(prefetch_depth), "0", NULL, 0, 1e6, 0,
     "groups fetched ahead; 0 = as far as the device budget allows", NULL},
    {"step_during_backward", K_BOOL, OFF(step_during_backward), "true", NULL, 0, 0, 0,
     "run each group's optimizer update as soon as its grads are final, overlapping backward "
     "(only without clipping and fp16 loss scaling, which need the whole gradient first)", NULL},
    {"dist.zero_stage", K_INT, OFF(zero_stage), "2", NULL, 0, 3, 0,
     "with ranks (ferry_engine_set_comm): 0 replicates everything and all-reduces the grads; 1 "
     "shards the fp32 master and optimizer state; 2 also reduce-scatters the grads as they are "
     "drained (sharded accumulators); 3 also shards the params (host or nvme homes), all-gathered at "
     "each fetch", NULL},
    {"dist.timeout", K_FLOAT, OFF(dist_timeout), "300", NULL, 0, 1e9, 1,
     "seconds a collective may wait for the other ranks before it fails (ferry-gpt passes it "
     "to ferry_comm_create; the engine's channels inherit the communicator's)", NULL},
    {"timeline", K_STR, OFF(timeline), "", NULL, 0, 0, 0,
     "write a Chrome trace JSON of every transfer and kernel to this file; \"\" = off", NULL},
    {"log_level", K_ENUM, OFF(log_level), "silent", "silent|error|warn|info|debug", 0, 0, 0,
     "engine log level (messages go to the log callback)", v_log},
};
#define NKEYS (int)(sizeof keys / sizeof keys[0])

struct ferry_config {
  ferry_config_values v;
  ferry_errbuf err;
};

static const char *kind_name(kind k) {
  switch (k) {
  case K_ENUM: return "enum";
  case K_SIZE: return "size";
  case K_INT: return "integer";
  case K_POW2: return "power of two";
  case K_FLOAT: return "number";
  case K_BOOL: return "boolean";
  case K_STR: return "string";
  case K_PATHS: return "list of strings";
  case K_FLOAT2: return "two numbers";
  case K_SCALE: return "\"dynamic\" or number";
  }
  return "?";
}

static const key_def *find_key(const char *name) {
  for (int i = 0; i < NKEYS; i++)
    if (!strcmp(keys[i].name, name)) return &keys[i];
  return NULL;
}

static size_t edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 64 || lb > 64) return 99;
  size_t row[65];
  for (size_t j = 0; j <= lb; j++) row[j] = j;
  for (size_t i = 1; i <= la; i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= lb; j++) {
      size_t up = row[j];
      size_t best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[lb];
}

/* Whether `name` is a group: some key lives below it ("tiers", "tiers.gpu"). */
static int is_group(const char *name, size_t len) {
  for (int j = 0; j < NKEYS; j++)
    if (!strncmp(keys[j].name, name, len) && keys[j].name[len] == '.') return 1;
  return 0;
}

/* The valid key or group closest to `name`, or NULL when none is close: a
 * whole name (key, or group: every prefix of a key) within a third of the
 * name's length in edits, or a key whose last part is within a third of
 * the last part's length (at least 1 edit either way), so "budgte" finds
 * tiers.gpu.budget, "lr" optimizer.lr, "tiers.gpus" tiers.gpu, and "zzz"
 * or "foo" nothing. */
static const char *suggest(const char *name) {
  static char best_group[64];
  const char *best = NULL;
  size_t bd = (size_t)-1;
  const char *leaf = strrchr(name, '.');
  leaf = leaf ? leaf + 1 : name;
  size_t lim = strlen(name) / 3, llim = strlen(leaf) / 3;
  if (lim < 1) lim = 1;
  if (llim < 1) llim = 1;
  for (int i = 0; i < NKEYS; i++) {
    const char *kl = strrchr(keys[i].name, '.');
    kl = kl ? kl + 1 : keys[i].name;
    size_t d = edit_distance(name, keys[i].name);
    if (d > lim) d = (size_t)-1;
    size_t dl = edit_distance(leaf, kl);
    if (dl <= llim && dl + 1 < d) d = dl + 1; /* a leaf match ranks after a whole one */
    if (d < bd) {
      bd = d;
      best = keys[i].name;
    }
    /* the groups this key lives in */
    for (const char *dot = strchr(keys[i].name, '.'); dot; dot = strchr(dot + 1, '.')) {
      size_t gl = (size_t)(dot - keys[i].name);
      char g[64];
      if (gl >= sizeof g) break;
      memcpy(g, keys[i].name, gl);
      g[gl] = '\0';
      size_t gd = edit_distance(name, g);
      if (gd <= lim && gd < bd) {
        bd = gd;
        memcpy(best_group, g, gl + 1);
        best = best_group;
      }
    }
  }
  return best;
}

/* "(did you mean 'x'?)" for an unknown name, or "". */
static const char *suggestion(const char *name, char *buf, size_t len) {
  const char *s = suggest(name);
  if (s) snprintf(buf, len, " (did you mean '%s'?)", s);
  else buf[0] = '\0';
  return buf;
}

/* ---- parsing values from text -------------------------------------- */

static int enum_index(const key_def *k, const char *s) {
  const char *p = k->names;
  int i = 0;
  size_t n = strlen(s);
  while (*p) {
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    if (len == n && !strncmp(p, s, n)) return i;
    if (!bar) break;
    p = bar + 1;
    i++;
  }
  return -1;
}

static int parse_double(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  while (isspace((unsigned char)*end)) end++;
  if (errno || end == s || *end || !isfinite(v)) return -1;
  *out = v;
  return 0;
}

/* One setter per kind of key: each parses s (leading blanks skipped) into
 * dst, the key's field; on failure it writes what was expected and
 * returns -1. */

static int set_enum(const key_def *k, const char *s, char *dst, char *why, size_t wl) {
  int i = enum_index(k, s);
  if (i < 0) {
    snprintf(why, wl, "one of %s", k->names);
    return -1;
  }
  *(int *)dst = k->vals[i];
  return 0;
}

static int set_size(const key_def *k, const char *s, char *dst, char *why, size_t wl) {
  uint64_t b;
  int parsed = ferry_parse_size(s, &b) == 0;
  if (parsed && (double)b >= k->lo && (double)b <= k->hi) {
    *(uint64_t *)dst = b;
    return 0;
  }
  char lim[32];
  if (parsed && (double)b > k->hi) /* the limit the value passed, not the other one */
    snprintf(why, wl, "a size of at most %s", ferry_format_size((uint64_t)k->hi, lim, sizeof lim));
  else if (k->lo > 0)
    snprintf(why, wl, "a size such as \"64M\" or \"20G\" (at least %s)",
             ferry_format_size((uint64_t)k->lo, lim, sizeof lim));
  else
    snprintf(why, wl, "a size such as \"64M\" or \"20G\"");
  return -1;
}

static int set_int(const key_def *k, const char *s, char *dst, char *why, size_t wl) {
  char *end;
  errno = 0;
  long long x = strtoll(s, &end, 10);
  while (isspace((unsigned char)*end)) end++;
  if (errno || end == s || *end || (double)x < k->lo || (double)x > k->hi ||
      (k->k == K_POW2 && (x & (x - 1)))) {
    snprintf(why, wl, "%s in [%.0f, %.0f]", k->k == K_POW2 ? "a power of two" : "an integer", k->lo,
             k->hi);
    return -1;
  }
  *(int64_t *)dst = x;
  return 0;
}

static int set_float(const key_def *k, const char *s, char *dst, char *why, size_t wl) {
  double x;
  if (parse_double(s, &x) || x < k->lo || x > k->hi || (k->lo_open && x == k->lo)) {
    snprintf(why, wl, "a number in %s%g, %g]", k->lo_open ? "(" : "[", k->lo, k->hi);
    return -1;
  }
  *(double *)dst = x;
  return 0;
}

static int set_bool(const char *s, char *dst, char *why, size_t wl) {
  if (!strcmp(s, "true") || !strcmp(s, "1")) *(int *)dst = 1;
  else if (!strcmp(s, "false") || !strcmp(s, "0")) *(int *)dst = 0;
  else {
    snprintf(why, wl, "true or false");
    return -1;
  }
  return 0;
}

static int set_str(const char *s, char *dst, size_t cap, char *why, size_t wl) {
  if (strlen(s) >= cap) {
    snprintf(why, wl, "a string shorter than %zu bytes", cap);
    return -1;
  }
  snprintf(dst, cap, "%s", s);
  return 0;
}

/* Comma-separated paths; v keeps its old list unless every one is good. */
static int set_paths(ferry_config_values *v, const char *s, char *why, size_t wl) {
  ferry_config_values tmp = *v;
  tmp.nvme_npaths = 0;
  const char *p = s;
  while (*p) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    while (len && isspace((unsigned char)p[len - 1])) len--;
    if (len == 0 || len >= sizeof tmp.nvme_paths[0] || tmp.nvme_npaths == FERRY_CFG_MAX_PATHS) {
      snprintf(why, wl, "1 to %d non-empty paths separated by commas", FERRY_CFG_MAX_PATHS);
      return -1;
    }
    if (strchr("[\"", p[0]) || strchr("]\"", p[len - 1])) { /* grammar not parsed */
      snprintf(why, wl, "paths without quotes or brackets: a, b, or [\"a\", \"b\"] as a "
                        "whole");
      return -1;
    }
    memcpy(tmp.nvme_paths[tmp.nvme_npaths], p, len);
    tmp.nvme_paths[tmp.nvme_npaths++][len] = '\0';
    if (!comma) break;
    p = comma + 1;
    while (isspace((unsigned char)*p)) p++;
  }
  memcpy(v->nvme_paths, tmp.nvme_paths, sizeof v->nvme_paths);
  v->nvme_npaths = tmp.nvme_npaths;
  return 0;
}

static int set_float2(const char *s, char *dst, char *why, size_t wl) {
  double a, b;
  char buf[128];
  snprintf(buf, sizeof buf, "%s", s);
  char *comma = strchr(buf, ',');
  if (comma) *comma = '\0';
  if (!comma || parse_double(buf, &a) || parse_double(comma + 1, &b) || a < 0 || a >= 1 ||
      b < 0 || b >= 1) {
    snprintf(why, wl, "two numbers in [0, 1), e.g. \"0.9, 0.999\"");
    return -1;
  }
  ((double *)dst)[0] = a;
  ((double *)dst)[1] = b;
  return 0;
}

/* "dynamic" (stored as 0) or a fixed scale > 0. */
static int set_scale(const char *s, char *dst, char *why, size_t wl) {
  double x;
  if (!strcmp(s, "dynamic")) {
    *(double *)dst = 0;
    return 0;
  }
  if (parse_double(s, &x) || !(x > 0)) {
    snprintf(why, wl, "\"dynamic\" or a number > 0");
    return -1;
  }
  *(double *)dst = x;
  return 0;
}

/* Sets one key in `v` from text; on failure writes what was expected. */
static int set_text(ferry_config_values *v, const key_def *k, const char *s, char *why,
                    size_t wl) {
  char *dst = (char *)v + k->off;
  while (isspace((unsigned char)*s)) s++;
  switch (k->k) {
  case K_ENUM: return set_enum(k, s, dst, why, wl);
  case K_SIZE: return set_size(k, s, dst, why, wl);
  case K_INT:
  case K_POW2: return set_int(k, s, dst, why, wl);
  case K_FLOAT: return set_float(k, s, dst, why, wl);
  case K_BOOL: return set_bool(s, dst, why, wl);
  case K_STR: return set_str(s, dst, sizeof v->timeline, why, wl); /* the one string key */
  case K_PATHS: return set_paths(v, s, why, wl);
  case K_FLOAT2: return set_float2(s, dst, why, wl);
  case K_SCALE: return set_scale(s, dst, why, wl);
  }
  return -1;
}

/* The fewest digits that read back as x ("0.0003", not the %.17g
 * "0.00029999999999999997"): what the user wrote, for any value they can. */
static void shortest(char *buf, size_t len, double x) {
  for (int p = 1; p <= 17; p++) {
    snprintf(buf, len, "%.*g", p, x);
    if (strtod(buf, NULL) == x) return;
  }
}

static void get_text(const ferry_config_values *v, const key_def *k, char *buf, size_t len) {
  const char *src = (const char *)v + k->off;
  switch (k->k) {
  case K_ENUM: {
    /* the name whose value the field holds (set_enum only stores values
     * from vals) */
    int val = *(const int *)src;
    const char *p = k->names, *bar;
    for (int j = 0; (bar = strchr(p, '|')) && k->vals[j] != val; j++) p = bar + 1;
    snprintf(buf, len, "%.*s", bar ? (int)(bar - p) : (int)strlen(p), p);
    return;
  }
  case K_SIZE: snprintf(buf, len, "%llu", (unsigned long long)*(const uint64_t *)src); return;
  case K_INT:
  case K_POW2: snprintf(buf, len, "%lld", (long long)*(const int64_t *)src); return;
  case K_FLOAT: shortest(buf, len, *(const double *)src); return;
  case K_BOOL: snprintf(buf, len, "%s", *(const int *)src ? "true" : "false"); return;
  case K_STR: snprintf(buf, len, "%s", src); return;
  case K_PATHS: {
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < v->nvme_npaths && o < len; i++)
      o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? ", " : "", v->nvme_paths[i]);
    return;
  }
  case K_FLOAT2: {
    char a[40], b[40];
    shortest(a, sizeof a, ((const double *)src)[0]);
    shortest(b, sizeof b, ((const double *)src)[1]);
    snprintf(buf, len, "%s, %s", a, b);
    return;
  }
  case K_SCALE: {
    double x = *(const double *)src;
    if (x == 0) snprintf(buf, len, "dynamic");
    else shortest(buf, len, x);
    return;
  }
  }
}

/* ---- public --------------------------------------------------------- */

int ferry_config_create(ferry_config **out) {
  if (!out) return FERRY_EINVAL;
  ferry_config *c = calloc(1, sizeof *c);
  if (!c) return ferry_err_thread(FERRY_ENOMEM, "config create: out of memory");
  ferry_errbuf_init(&c->err);
  char why[256];
  for (int i = 0; i < NKEYS; i++)
    FERRY_ASSERT(set_text(&c->v, &keys[i], keys[i].def, why, sizeof why) == 0,
                 "default of config key %s ('%s') is invalid: %s", keys[i].name, keys[i].def, why);
  *out = c;
  return FERRY_OK;
}

void ferry_config_destroy(ferry_config *c) {
  if (!c) return;
  ferry_errbuf_destroy(&c->err);
  free(c);
}

const char *ferry_config_last_error(const ferry_config *c) {
  return c ? ferry_err_msg(&c->err) : "no config";
}

const ferry_config_values *ferry_config_values_get(const ferry_config *c) { return &c->v; }

int ferry_config_clone(const ferry_config *src, ferry_config **out) {
  int rc = ferry_config_create(out);
  if (rc == 0 && src) (*out)->v = src->v;
  return rc;
}

static int set_grammar(ferry_config *c, const key_def *k, const char *key, const char *value);

int ferry_config_set(ferry_config *c, const char *key, const char *value) {
  if (!c) return FERRY_EINVAL;
  if (!key || !value) return cfg_err(&c->err, FERRY_EINVAL, "config set: key or value is NULL");
  const key_def *k = find_key(key);
  if (!k) {
    char sug[128];
    if (is_group(key, strlen(key)))
      return cfg_err(&c->err, FERRY_ECONFIG,
                       "config key '%s' is a group, not a value: set one of its keys (%s.*, "
                       "see `ferry config keys`)", key, key);
    return cfg_err(&c->err, FERRY_ECONFIG, "unknown config key '%s'%s", key,
                     suggestion(key, sug, sizeof sug));
  }
  char why[256];
  const char *p = value;
  while (isspace((unsigned char)*p)) p++;
  if (*p == '[' || *p == '(' || *p == '"') return set_grammar(c, k, key, value);
  if (set_text(&c->v, k, value, why, sizeof why))
    return cfg_err(&c->err, FERRY_ECONFIG, "config key '%s': value '%s' is invalid: expected %s",
                     key, value, why);
  return FERRY_OK;
}

int ferry_config_get(const ferry_config *c, const char *key, char *buf, size_t len) {
  if (!c || !key || !buf || !len) return FERRY_EINVAL;
  const key_def *k = find_key(key);
  if (!k) return FERRY_ENOENT;
  get_text(&c->v, k, buf, len);
  return FERRY_OK;
}

int ferry_config_key_count(void) { return NKEYS; }

int ferry_config_key_info(int i, const char **name, const char **type, const char **def,
                          const char **desc) {
  if (i < 0 || i >= NKEYS) return FERRY_EINVAL;
  if (name) *name = keys[i].name;
  if (type) *type = keys[i].k == K_ENUM ? keys[i].names : kind_name(keys[i].k);
  if (def) *def = keys[i].def;
  if (desc) *desc = keys[i].desc;
  return FERRY_OK;
}

/* ---- the libconfig reader --------------------------------------------- */

typedef struct {
  ferry_config *c;
  ferry_config_values tmp;
  const char *fname;
} reader;

static int rd_err(reader *r, const config_setting_t *s, const char *fmt, ...) FERRY_PRINTF(3, 4);
static int rd_err(reader *r, const config_setting_t *s, const char *fmt, ...) {
  char msg[FERRY_ERR_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char *file = s && config_setting_source_file(s) ? config_setting_source_file(s) : r->fname;
  return cfg_err(&r->c->err, FERRY_ECONFIG, "%s:%u: %s", file,
                   s ? config_setting_source_line(s) : 0u, msg);
}

/* The text form of a scalar setting, for set_text and messages. */
static int scalar_text(const config_setting_t *s, char *buf, size_t len) {
  switch (config_setting_type(s)) {
  case CONFIG_TYPE_INT:
  case CONFIG_TYPE_INT64:
    snprintf(buf, len, "%lld", config_setting_get_int64(s));
    return 0;
  case CONFIG_TYPE_FLOAT: shortest(buf, len, config_setting_get_float(s)); return 0;
  case CONFIG_TYPE_BOOL: snprintf(buf, len, "%s", config_setting_get_bool(s) ? "true" : "false"); return 0;
  case CONFIG_TYPE_STRING: snprintf(buf, len, "%s", config_setting_get_string(s)); return 0;
  default: return -1;
  }
}

/* value_text of the list keys (tiers.nvme.paths, optimizer.betas): "a, b",
 * or one scalar given without brackets where --set allows it. */
static int list_text(const config_setting_t *s, const key_def *k, int strict, char *text,
                     size_t tl, char *why, size_t wl, const config_setting_t **where) {
  int t = config_setting_type(s);
  if (t != CONFIG_TYPE_ARRAY && t != CONFIG_TYPE_LIST) {
    if (strict || t == CONFIG_TYPE_GROUP) {
      snprintf(why, wl, "expected %s in [ ... ]", kind_name(k->k));
      return -1;
    }
    /* --set tiers.nvme.paths="/x": one path (a quoted string) */
    if (k->k == K_PATHS && t != CONFIG_TYPE_STRING) {
      snprintf(why, wl, "expected a quoted path or a list of them in [ ... ]");
      return -1;
    }
    if (k->k == K_PATHS && !config_setting_get_string(s)[0]) {
      snprintf(why, wl, "a path is empty (write the swap directory, or [] for no NVMe tier)");
      return -1;
    }
    if (scalar_text(s, text, tl) == 0 && strlen(text) < tl - 1) return 0;
    snprintf(why, wl, "value too long");
    return -1;
  }
  size_t o = 0;
  int n = config_setting_length(s);
  for (int i = 0; i < n; i++) {
    const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
    char one[1100];
    int et = config_setting_type(e);
    *where = e;
    if ((k->k == K_PATHS && et != CONFIG_TYPE_STRING) ||
        (k->k == K_FLOAT2 && et != CONFIG_TYPE_FLOAT && et != CONFIG_TYPE_INT &&
         et != CONFIG_TYPE_INT64) ||
        scalar_text(e, one, sizeof one)) {
      snprintf(why, wl, "element %d: expected %s", i, k->k == K_PATHS ? "a string" : "a number");
      return -1;
    }
    if (k->k == K_PATHS && !one[0]) {
      snprintf(why, wl, "element %d: the path is empty (write the swap directory)", i);
      return -1;
    }
    if (k->k == K_PATHS && strchr(one, ',')) {
      snprintf(why, wl, "path \"%.180s\" contains a comma, which is not supported", one);
      return -1;
    }
    o += (size_t)snprintf(text + o, tl - o, "%s%s", i ? ", " : "", one);
    if (o >= tl) {
      *where = s;
      snprintf(why, wl, "value too long");
      return -1;
    }
  }
  *where = s;
  return 0;
}

/* The text form (for set_text) of a setting `s` given for key k: a list
 * for the list keys ("a, b"), a scalar for the others. `strict` (files)
 * also wants each scalar in its own type: a quoted string for enums and
 * strings, a bare number for numbers, true or false for booleans; --set
 * values (not strict) may quote any scalar. On failure it writes why into
 * `why`, points *where at the offending setting and returns -1. */
static int value_text(const config_setting_t *s, const key_def *k, int strict, char *text,
                      size_t tl, char *why, size_t wl, const config_setting_t **where) {
  int t = config_setting_type(s);
  *where = s;
  text[0] = '\0';
  if (k->k == K_PATHS || k->k == K_FLOAT2) return list_text(s, k, strict, text, tl, why, wl, where);
  if (t == CONFIG_TYPE_GROUP || t == CONFIG_TYPE_ARRAY || t == CONFIG_TYPE_LIST) {
    snprintf(why, wl, "expected %s%s%s, not a %s", kind_name(k->k), k->k == K_ENUM ? " " : "",
             k->k == K_ENUM ? k->names : "", t == CONFIG_TYPE_GROUP ? "group" : "list");
    return -1;
  }
  if (strict) {
    if (k->k == K_BOOL && t != CONFIG_TYPE_BOOL) {
      snprintf(why, wl, "expected true or false");
      return -1;
    }
    if ((k->k == K_ENUM || k->k == K_STR) && t != CONFIG_TYPE_STRING) {
      snprintf(why, wl, "expected a quoted string%s%s", k->k == K_ENUM ? ", one of " : "",
               k->k == K_ENUM ? k->names : "");
      return -1;
    }
    if ((k->k == K_INT || k->k == K_POW2 || k->k == K_FLOAT) && t == CONFIG_TYPE_STRING) {
      snprintf(why, wl, "expected %s, not a string (write it without quotes)", kind_name(k->k));
      return -1;
    }
  }
  if ((k->k == K_INT || k->k == K_POW2) && t == CONFIG_TYPE_FLOAT) {
    snprintf(why, wl, "expected an integer");
    return -1;
  }
  if (scalar_text(s, text, tl) || strlen(text) >= tl - 1) {
    snprintf(why, wl, "value too long");
    return -1;
  }
  return 0;
}

static int apply(reader *r, const config_setting_t *s, const key_def *k, const char *path) {
  char text[2048], why[256];
  const config_setting_t *where = s;
  if (value_text(s, k, 1, text, sizeof text, why, sizeof why, &where))
    return rd_err(r, where, "key '%s': %s", path, why);
  if (k->k == K_PATHS && !text[0]) { /* paths = []: no NVMe tier */
    r->tmp.nvme_npaths = 0;
    return FERRY_OK;
  }
  if (set_text(&r->tmp, k, text, why, sizeof why))
    return rd_err(r, s, "key '%s': value %s is invalid: expected %s", path, text, why);
  return FERRY_OK;
}

/* ferry_config_set of a value written in the config grammar (a list
 * [..] or (..), or a quoted string): libconfig parses the line
 * `v = VALUE;`, whose one setting then goes through value_text and
 * set_text as a file's would, all or nothing. */
static int set_grammar(ferry_config *c, const key_def *k, const char *key, const char *value) {
  char why[256], text[2048];
  if (strpbrk(value, "\n\r") || strlen(value) > 4 * sizeof text)
    return cfg_err(&c->err, FERRY_ECONFIG,
                     "config key '%s': value '%.200s' is invalid: %s", key, value,
                     strpbrk(value, "\n\r") ? "it spans lines" : "too long");
  size_t n = strlen(value) + 16;
  char *line = malloc(n);
  if (!line) return cfg_err(&c->err, FERRY_ENOMEM, "config key '%s': out of memory", key);
  snprintf(line, n, "v = %s;", value);
  char wide[512];
  if (cfg_check_integers(value, key, wide, sizeof wide)) { /* "key:1: the integer ..." */
    free(line);
    return cfg_err(&c->err, FERRY_ECONFIG, "config key '%s': value '%s' is invalid: %s", key,
                     value, strstr(wide, "the integer") ? strstr(wide, "the integer") : wide);
  }
  config_t cf;
  config_init(&cf);
  int ok = config_read_string(&cf, line) == CONFIG_TRUE;
  free(line);
  const config_setting_t *root = config_root_setting(&cf), *s = NULL;
  if (ok && config_setting_length(root) == 1) s = config_setting_get_elem(root, 0);
  if (!s) {
    int rc = cfg_err(&c->err, FERRY_ECONFIG,
                       "config key '%s': value '%s' is invalid: %s%s (write a list as "
                       "[\"a\", \"b\"] or a, b, and a string as \"text\" or bare)",
                       key, value, ok ? "more than one value" : "not in the config grammar: ",
                       ok ? "" : config_error_text(&cf));
    config_destroy(&cf);
    return rc;
  }
  const config_setting_t *where;
  int rc = FERRY_OK;
  if (value_text(s, k, 0, text, sizeof text, why, sizeof why, &where))
    rc = cfg_err(&c->err, FERRY_ECONFIG, "config key '%s': value '%s' is invalid: %s", key,
                   value, why);
  config_destroy(&cf);
  if (rc) return rc;
  ferry_config_values tmp = c->v;
  if (k->k == K_PATHS && !text[0]) {
    tmp.nvme_npaths = 0;
  } else if (set_text(&tmp, k, text, why, sizeof why)) {
    return cfg_err(&c->err, FERRY_ECONFIG, "config key '%s': value '%s' is invalid: expected %s",
                     key, value, why);
  }
  c->v = tmp;
  return FERRY_OK;
}

/* The keys below group g, relative to it, comma-separated and cut short
 * with "..." when they do not fit in buf. */
static const char *group_keys(const char *g, char *buf, size_t len) {
  size_t gl = strlen(g), o = 0;
  buf[0] = '\0';
  for (int j = 0; j < NKEYS; j++) {
    if (strncmp(keys[j].name, g, gl) || keys[j].name[gl] != '.') continue;
    const char *rel = keys[j].name + gl + 1;
    if (o + strlen(rel) + 8 >= len) {
      snprintf(buf + o, len - o, ", ...");
      break;
    }
    o += (size_t)snprintf(buf + o, len - o, "%s%s", o ? ", " : "", rel);
  }
  return buf;
}

static int walk(reader *r, const config_setting_t *g, const char *prefix) {
  int n = config_setting_length(g);
  for (int i = 0; i < n; i++) {
    const config_setting_t *s = config_setting_get_elem(g, (unsigned)i);
    const char *nm = config_setting_name(s);
    char path[256];
    snprintf(path, sizeof path, "%s%s%s", prefix, prefix[0] ? "." : "", nm ? nm : "?");
    const key_def *k = find_key(path);
    if (k) {
      int rc = apply(r, s, k, path);
      if (rc) return rc;
      continue;
    }
    if (is_group(path, strlen(path))) { /* a group is valid when some key lives below it */
      if (config_setting_type(s) != CONFIG_TYPE_GROUP)
        return rd_err(r, s, "'%s' is a group, not a value; expected %s: { ... } (its keys: %s)",
                      path, nm ? nm : "?", group_keys(path, (char[256]){0}, 256));
      int rc = walk(r, s, path);
      if (rc) return rc;
      continue;
    }
    char sug[128];
    return rd_err(r, s, "unknown key '%s'%s", path, suggestion(path, sug, sizeof sug));
  }
  return FERRY_OK;
}

static int load(ferry_config *c, config_t *cf, int ok, const char *name) {
  reader r = {c, c->v, name};
  if (!ok) {
    const char *f = config_error_file(cf);
    /* libconfig's text is often "syntax error" itself: say it once */
    const char *t = config_error_text(cf) ? config_error_text(cf) : "";
    int plain = !strcmp(t, "syntax error");
    int rc = cfg_err(&c->err, FERRY_ECONFIG, "%s:%d: %s%s%s", f ? f : name,
                       config_error_line(cf), strncmp(t, "syntax error", 12) ? "syntax error: " : "",
                       t,
                       plain ? " (each setting is name = value; with the value a number, true or "
                               "false, a \"quoted string\", a [list] or a { group }: "
                               "device = \"host\";)"
                             : "");
    config_destroy(cf);
    return rc;
  }
  int rc = walk(&r, config_root_setting(cf), "");
  config_destroy(cf);
  if (rc) return rc;
  c->v = r.tmp; /* all or nothing */
  return FERRY_OK;
}

int ferry_config_load_file(ferry_config *c, const char *path) {
  if (!c) return FERRY_EINVAL;
  if (!path) return cfg_err(&c->err, FERRY_EINVAL, "config load: path is NULL");
  char *text, why[1200];
  int rc = cfg_read_checked(path, &text, why, sizeof why); /* config_file.c */
  if (rc) return cfg_err(&c->err, rc, "%s", why);
  config_t cf;
  config_init(&cf);
  int ok = config_read_string(&cf, text) == CONFIG_TRUE;
  free(text);
  return load(c, &cf, ok, path);
}

int ferry_config_load_string(ferry_config *c, const char *text, const char *name) {
  if (!c) return FERRY_EINVAL;
  if (!text) return cfg_err(&c->err, FERRY_EINVAL, "config load: text is NULL");
  char why[512];
  if (cfg_check_integers(text, name ? name : "<string>", why, sizeof why))
    return cfg_err(&c->err, FERRY_ECONFIG, "%s", why);
  config_t cf;
  config_init(&cf);
  int ok = config_read_string(&cf, text) == CONFIG_TRUE;
  return load(c, &cf, ok, name ? name : "<string>");
}

/* ---- writer -------------------------------------------------------------- */

static void write_quoted(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', f);
    fputc(*s, f);
  }
  fputc('"', f);
}

/* Splits "a.b.c" into its components; returns their number. */
static int components(const char *name, char comp[][64], int max) {
  int n = 0;
  while (*name && n < max) {
    const char *d = strchr(name, '.');
    size_t len = d ? (size_t)(d - name) : strlen(name);
    snprintf(comp[n++], 64, "%.*s", (int)len, name);
    name += len;
    if (*name == '.') name++;
  }
  return n;
}

int ferry_config_write_file(const ferry_config *c, const char *path) {
  if (!c || !path) return FERRY_EINVAL;
  ferry_config *mc = (ferry_config *)c;
  ferry_outfile o; /* the user's old file stays whole until the new one is complete */
  char why[512];
  int rc = ferry_outfile_open(&o, path, why, sizeof why);
  if (rc) return cfg_err(&mc->err, rc, "%s", why);
  FILE *f = o.f;
  fprintf(f, "# ferry engine configuration (every key; see docs/CONFIG.md)\n");
  char open[8][64];
  int nopen = 0;
  for (int i = 0; i < NKEYS; i++) {
    const key_def *k = &keys[i];
    char comp[8][64];
    int n = components(k->name, comp, 8);
    int common = 0; /* groups already open that this key lives in */
    while (common < nopen && common < n - 1 && !strcmp(open[common], comp[common])) common++;
    for (; nopen > common; nopen--) fprintf(f, "%*s};\n", 2 * (nopen - 1), "");
    for (; nopen < n - 1; nopen++) {
      fprintf(f, "%*s%s: {\n", 2 * nopen, "", comp[nopen]);
      memcpy(open[nopen], comp[nopen], 64);
    }
    char val[2048];
    get_text(&c->v, k, val, sizeof val);
    fprintf(f, "%*s%s = ", 2 * nopen, "", comp[n - 1]);
    switch (k->k) {
    case K_ENUM:
    case K_STR:
    case K_SIZE:
    case K_SCALE: write_quoted(f, val); break;
    case K_PATHS:
      fputc('[', f);
      for (int j = 0; j < c->v.nvme_npaths; j++) {
        if (j) fputs(", ", f);
        write_quoted(f, c->v.nvme_paths[j]);
      }
      fputc(']', f);
      break;
    case K_FLOAT2: fprintf(f, "[%s]", val); break;
    default: fputs(val, f); break;
    }
    fputs(";\n", f);
  }
  for (; nopen > 0; nopen--) fprintf(f, "%*s};\n", 2 * (nopen - 1), "");
  rc = ferry_outfile_commit(&o, why, sizeof why);
  return rc ? cfg_err(&mc->err, rc, "%s", why) : FERRY_OK;
}
