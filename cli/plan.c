/* cli/plan.c — `ferry plan`: will this model fit on this machine, where does
 * each byte go, how fast will a step be. Reads the machine through the
 * public API (or flags), runs the planner of plan/plan.h, and prints a
 * table, one JSON object (--json), an engine config (--write-config) and an
 * SVG of the tiers (--svg).
 */
#include "cli/cli.h"

#include "ferry.h"
#include "plan/plan.h"
#include "core/outfile.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int cli_plan(int argc, char **argv);

/* The options of --help (after the introduction), and the output's. */
static void plan_usage_options(FILE *f);
static void plan_usage_output(FILE *f);

static void plan_usage(FILE *f) {
  fprintf(f,
"usage: ferry plan (--model PRESET|config.json | --params N) [options]\n"
"       ferry plan --largest [machine and training options]\n"
"\n"
"Answers, before a job starts or hardware is bought: does this model train on\n"
"this machine, where does each byte go (GPU, pinned host RAM, NVMe), how long\n"
"will one optimizer step take, and what limits it. For each of the five\n"
"placements the engine supports it prints the bytes of every family in every\n"
"tier, whether they fit and, if not, which tier is short by how much; the\n"
"step time split into compute, host-to-device, device-to-host, CPU optimizer\n"
"and NVMe, with the bottleneck named; the NVMe bytes per step of each family;\n"
"the process's peak RSS; and the largest batch that fits. The recommended\n"
"placement is the fastest one that fits. --largest answers the other way\n"
"round: the largest dense Llama-shaped model this machine trains.\n"
"docs/PLANNING.md has every formula and assumption.\n"
"\n"
"placements (the engine's placement.params / grads / optimizer):\n"
"  all-gpu         gpu  / gpu  / gpu    everything on the device\n"
"  zero-offload    gpu  / host / host   ZeRO-Offload: CPU optimizer\n"
"  zero3-offload   host / host / host   params streamed per group (ZeRO-3 offload)\n"
"  nvme-optimizer  host / nvme / nvme   fp32 master and states on NVMe\n"
"  zero-infinity   nvme / nvme / nvme   params too on NVMe (ZeRO-Infinity)\n"
"The grads column is placement.grads = \"auto\" when gradients are kept. When\n"
"the step runs during backward (no --clip-grad-norm, precision not fp16,\n"
"--grad-accumulation 1, one rank) \"auto\" keeps none: a group's grads live\n"
"only in staging, are applied and dropped. Each candidate prints its resolved\n"
"triple.\n"
"\n");
  plan_usage_options(f);
}

static void plan_usage_options(FILE *f) {
  fprintf(f,
"model (one of):\n"
"  --model NAME        a preset with its exact parameter count: gpt2, gpt2-medium,\n"
"                      gpt2-large, gpt2-xl, llama-1b, llama-2-7b, llama-2-13b,\n"
"                      llama-2-70b, llama-3-8b, llama-3-70b, mistral-7b, qwen2.5-14b\n"
"  --model FILE        a Hugging Face config.json of the GPT-2 family (gpt2) or the\n"
"                      Llama family (llama, mistral, qwen2)\n"
"  --params N          a dense Llama-shaped model of N parameters (13e9, 13B, 350M)\n"
"  --largest           instead of a model: search the largest --params model that\n"
"                      fits (binary search on the count, 1%% resolution) and print\n"
"                      its shape, placement, step time and footprint\n"
"  --list-models       print the presets and their parameter counts\n"
"\n"
"machine (defaults come from this machine, as `ferry info` sees it):\n"
"  --device cuda|host  the engine's device (default cuda). host: the host\n"
"                      backend's emulated GPU, whose budget is host RAM (it\n"
"                      adds to the RSS) and whose CPU model computes in fp32\n"
"  --gpu-mem SIZE      the GPU's memory (24G); budget = 95%% of it, as the engine\n"
"                      keeps 5%% for the CUDA context. Default: the free memory of\n"
"                      GPU 0 less 5%%. Without a GPU here this flag (or\n"
"                      --gpu-budget) is required.\n"
"  --gpu-budget SIZE   the device budget itself (tiers.gpu.budget), not 95%% of\n"
"                      anything; --device host needs it (or --gpu-mem)\n"
"  --host-mem SIZE     the machine's RAM (128G); budget = 80%% of it, the engine's\n"
"                      tiers.host.budget default. Default: 80%% of available RAM.\n"
"  --host-budget SIZE  the host budget itself (tiers.host.budget): the engine's\n"
"                      staging and pinned pool, reserved once at finalize\n"
"  --nvme SIZE         NVMe space for the swap files (2T); budget = SIZE\n"
"  --nvme-path DIR     probe DIR instead: its free space is the budget, and\n"
"                      --write-config puts DIR in tiers.nvme.paths\n"
"                      Without either, the NVMe placements do not fit.\n"
"  --profile FILE      measured bandwidths (JSON written by `ferry bench all`; the\n"
"                      format is in docs/PLANNING.md). Without it the defaults\n"
"                      used are printed.\n"
"\n"
"training:\n"
"  --batch B           micro-batch size (default 1)\n"
"  --seq S             sequence length in tokens (default 1024)\n"
"  --precision P       bf16 (default), fp16 or fp32: the dtype of the params the\n"
"                      GPU computes with and of the activations\n"
"  --optimizer O       adamw (default), adam, lamb (2 fp32 states), adagrad, sgd\n"
"                      (momentum), lion (1 state)\n"
"  --grad-accumulation N  micro-batches per optimizer step (default 1)\n"
"  --clip-grad-norm X  global-norm clipping (default 0 = off); > 0 keeps the\n"
"                      gradients until backward ends\n"
"  --grad-precision fp32|bf16  the gradient accumulators (precision.grads):\n"
"                      4 or 2 bytes per param (default fp32)\n"
"  --state-dtype fp32|bf16|int8  the optimizer states (optimizer.state_dtype,\n"
"                      default fp32): 4, 2 or 1 byte per element; int8 adds one\n"
"                      fp32 absmax per --state-block elements\n"
"  --state-block N     int8 states: elements per absmax (optimizer.state_block),\n"
"                      a power of two from 32 to 4096 (default 256)\n"
"  --master fp32|bf16  the master weights (precision.master, default fp32). bf16\n"
"                      needs --precision bf16: the params are the master (no\n"
"                      4-byte copy; updated with stochastic rounding)\n"
"  --checkpointing on|off   activation checkpointing per block (default on)\n"
"  --attention flash|materialized   flash (default): ferry-gpt's CUDA model,\n"
"                      whose device block (activations and workspace) the\n"
"                      plan lays out byte for byte; materialized: a trainer\n"
"                      that keeps the S x S scores (a formula)\n"
"  --chunk-size SIZE   the engine's chunk size (default 64M); families are\n"
"                      reserved in whole chunks\n"
"\n"
"data parallelism (`mpirun -np N`; every byte and second is then one rank's,\n"
"--batch is per rank):\n"
"  --gpus G            ranks (GPUs) per node (default 1). --host-mem, the RAM\n"
"                      available here, --nvme and --nvme-path are the node's and\n"
"                      split between its G ranks; the node's CPU memory bandwidth\n"
"                      and NVMe drives serve its G ranks\n"
"  --nodes M           nodes (default 1); N = G x M ranks\n"
"  --zero-stage S      dist.zero_stage (default 2): 0 replicates everything and\n"
"                      all-reduces grads; 1 shards the fp32 master and optimizer\n"
"                      states over the N ranks; 2 also the grads; 3 also the params\n"
"  --rank R            the rank whose bytes are planned, 0 to N - 1 (default: for\n"
"                      each family the rank holding the most of it; a group's\n"
"                      split between ranks snaps to 64 elements of a tensor)\n"
"  --net-gbps X        the network between nodes, per node, in gigabits per\n"
"                      second as NICs are rated (default 100: 12.5 GB/s)\n"
"  --intra-gbps X      the links between a node's GPUs, Gb/s (default: the PCIe\n"
"                      figure h2d_gbps x 8, e.g. 200 for 25 GB/s; NVLink: more)\n"
"                      The collectives run as rings at their slowest link: the\n"
"                      network when M > 1, else the GPU links.\n"
"\n");
  plan_usage_output(f);
}

static void plan_usage_output(FILE *f) {
  fprintf(f,
"output:\n"
"  --json              one JSON object: params, placement, placement_keys, fits,\n"
"                      tiers (gpu, host, nvme: bytes and budget), step_seconds,\n"
"                      bottleneck, max_batch, rss_bytes, nvme_bytes_per_step,\n"
"                      bandwidths, assumed, candidates[] (each with\n"
"                      placement_keys {params, grads, optimizer}, its tiers and\n"
"                      families, fits, why, components, step_seconds, rss_bytes,\n"
"                      nvme_bytes_per_step {read, write: {params, grads,\n"
"                      optimizer}}, nvme_file_bytes (the swap files: the NVMe\n"
"                      chunks and the spare slots), readahead, cached_groups,\n"
"                      comm). ranks,\n"
"                      gpus, nodes, zero_stage, net_gbps, intra_gbps,\n"
"                      comm_bytes_per_step, comm_seconds, comm_hidden_fraction\n"
"                      and comm_exposed_seconds at the top. With --largest:\n"
"                      fits and largest {params, layers, hidden, ffn, heads,\n"
"                      vocab, placement, placement_keys, step_seconds, ...}\n"
"  --write-config FILE write the engine config (libconfig) of the recommended\n"
"                      placement with the budgets used here, the resolved\n"
"                      placement.grads, precision.grads, grad_accumulation,\n"
"                      clip_grad_norm and device (with ranks or --zero-stage\n"
"                      also dist.zero_stage); tiers.nvme.budget is the plan's\n"
"                      swap files and 5%% (at most the NVMe space given)\n"
"  --svg FILE          draw each placement's tiers as stacked bars against budgets\n"
"  -h, --help          this text\n"
"\n"
"Sizes are powers of 1024 (24G = 24 GiB); bandwidths are 10^9 bytes/s.\n"
"\n"
"exit status: 0 a placement fits (--largest: a model was found); 1 none fits\n"
"(what is short by how much is printed), or --write-config failed; 2 bad usage\n"
"or an impossible request (zero budgets, bad sizes, no GPU and no --gpu-mem,\n"
"an unreadable config.json or profile).\n"
"\n"
"examples:\n"
"  ferry plan --model llama-2-13b --gpu-mem 24G --host-mem 32G --nvme 2T \\\n"
"             --batch 1 --seq 2048\n"
"  ferry plan --largest --gpu-mem 24G --host-mem 64G --nvme 8T --seq 2048\n"
"  ferry plan --model llama-100m.json --device host --gpu-budget 32M \\\n"
"             --host-budget 64M --nvme 64G --json\n");
}

/* ---- small helpers -------------------------------------------------------- */

static const char *gib(double b, char *buf, size_t n) {
  static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int i = 0;
  while (fabs(b) >= 1024 && i < 6) {
    b /= 1024;
    i++;
  }
  snprintf(buf, n, i ? "%.1f %s" : "%.0f %s", b, u[i]);
  return buf;
}

static const char *commas(uint64_t v, char *buf, size_t n) {
  char tmp[32];
  snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
  size_t len = strlen(tmp), o = 0;
  for (size_t i = 0; i < len && o + 2 < n; i++) {
    if (i && (len - i) % 3 == 0) buf[o++] = ',';
    buf[o++] = tmp[i];
  }
  buf[o] = '\0';
  return buf;
}

static int parse_int(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) {
    fprintf(stderr, "ferry plan: %s '%s': expected an integer from %lld to %lld\n", flag, s,
            (long long)lo, (long long)hi);
    return -1;
  }
  *out = v;
  return 0;
}

/* --clip-grad-norm X: a number >= 0 (0 = off). */
static int parse_clip(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v) || v < 0) {
    fprintf(stderr, "ferry plan: --clip-grad-norm '%s': expected a number >= 0 (0 = off)\n", s);
    return -1;
  }
  *out = v;
  return 0;
}

/* --net-gbps / --intra-gbps X: gigabits per second, a number > 0. */
static int parse_gbps(const char *flag, const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v) || !(v > 0) || v > 1e7) {
    fprintf(stderr, "ferry plan: %s '%s': expected a number > 0 (gigabits per second, e.g. "
                    "100 for 100 Gb/s)\n", flag, s);
    return -1;
  }
  *out = v;
  return 0;
}

/* "13e9", "13B", "350M", "1.5T", "7000000000": decimal powers for counts. */
static int parse_count(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || !isfinite(v) || v <= 0) return -1;
  double mul = 1;
  if (*end) {
    switch (toupper((unsigned char)*end)) {
    case 'K': mul = 1e3; break;
    case 'M': mul = 1e6; break;
    case 'B':
    case 'G': mul = 1e9; break;
    case 'T': mul = 1e12; break;
    default: return -1;
    }
    if (end[1]) return -1;
  }
  v *= mul;
  if (v > 1e18 || v != floor(v)) return -1;
  *out = (uint64_t)v;
  return 0;
}

static int parse_size_flag(const char *flag, const char *s, uint64_t *out) {
  if (ferry_parse_size(s, out)) {
    fprintf(stderr, "ferry plan: %s '%s': not a size (examples: 24G, 512M, 1.5T, 4096)\n", flag,
            s);
    return -1;
  }
  return 0;
}

/* A value the engine's configuration refuses for key (its range), said
 * with the flag: planning for it would plan an engine that cannot start and
 * write a config that does not load. 1 when refused. */
static int engine_refuses(const char *flag, const char *key, const char *v) {
  ferry_config *c = NULL;
  if (ferry_config_create(&c)) return 0; /* out of memory: --write-config says so */
  int bad = ferry_config_set(c, key, v) != FERRY_OK;
  if (bad) fprintf(stderr, "ferry plan: %s '%s': %s\n", flag, v, ferry_config_last_error(c));
  ferry_config_destroy(c);
  return bad;
}

static int pick(const char *flag, const char *s, const char *const *names, int n, int *out) {
  for (int i = 0; i < n; i++)
    if (!strcmp(s, names[i])) {
      *out = i;
      return 0;
    }
  fprintf(stderr, "ferry plan: %s '%s': expected one of", flag, s);
  for (int i = 0; i < n; i++) fprintf(stderr, " %s", names[i]);
  fprintf(stderr, "\n");
  return -1;
}

/* ---- hardware -------------------------------------------------------------- */

typedef struct {
  char text[3][256];  /* where each budget came from */
  char gpu_name[128];
  uint64_t memlock;   /* of this machine; UINT64_MAX unlimited */
  int pcie_gen, pcie_width;
  int host_here;      /* the host budget comes from this machine */
} hw_notes;

/* ---- SVG ------------------------------------------------------------------- */

static const char *const fam_color[FERRY_PLAN_FAMILIES] = {
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f"};

static void svg_escape(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '<') fputs("&lt;", f);
    else if (*s == '>') fputs("&gt;", f);
    else if (*s == '&') fputs("&amp;", f);
    else fputc(*s, f);
  }
}

/* The SVG's geometry: the 0% line, pixels for 100% of a budget, bar sizes. */
enum { SVG_W = 980, SVG_H = 460, SVG_BASE = 360, SVG_GROUP_W = 185, SVG_BAR_W = 44 };
static const double svg_full = 230;

/* The title, the key line and the axis lines. */
static void svg_head(FILE *f, const ferry_plan_input *in, const ferry_plan_result *r) {
  const int W = SVG_W, H = SVG_H, base = SVG_BASE;
  const double full = svg_full;
  fprintf(f,
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
          "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n"
          "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
          W, H, W, H);
  fprintf(f, "<text x=\"20\" y=\"24\" font-size=\"16\" font-weight=\"bold\">ferry plan: ");
  svg_escape(f, in->model.name);
  char pc[32];
  fprintf(f, " (%s params), batch %lld x seq %lld, %s, %s</text>\n",
          commas(r->params, pc, sizeof pc), (long long)in->batch, (long long)in->seq,
          ferry_plan_precision_name(in->precision), ferry_plan_optimizer_name(in->optimizer));
  fprintf(f, "<text x=\"20\" y=\"44\" fill=\"#555\">each bar: one tier's bytes as a share of "
             "its budget (dashed line = 100%%); red label = does not fit</text>\n");
  fprintf(f, "<line x1=\"40\" y1=\"%.0f\" x2=\"%d\" y2=\"%.0f\" stroke=\"#888\" "
             "stroke-dasharray=\"4 3\"/>\n<text x=\"8\" y=\"%.0f\" fill=\"#888\">100%%</text>\n",
          base - full, W - 20, base - full, base - full + 4);
  fprintf(f, "<line x1=\"40\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#000\"/>\n", base, W - 20,
          base);
}

/* One tier's bar of candidate c at x: its families stacked, total above. */
static void svg_bar(FILE *f, const ferry_plan_input *in, const ferry_plan_candidate *c, int t,
                    int x) {
  const int base = SVG_BASE, bar_w = SVG_BAR_W;
  const double full = svg_full;
  double budget = (double)in->budget[t];
  double y = base;
  double total = (double)c->tier_bytes[t];
  double scale = budget > 0 ? full / budget : 0;
  double shown = total * scale;
  double clip = shown > full * 1.25 ? full * 1.25 / shown : 1; /* keep bars on the page */
  for (int fam = 0; fam < FERRY_PLAN_FAMILIES; fam++) {
    double hgt = (double)c->bytes[t][fam] * scale * clip;
    if (total > 0 && budget == 0) hgt = (double)c->bytes[t][fam] / total * full * 1.25;
    if (hgt <= 0) continue;
    y -= hgt;
    char b[32];
    fprintf(f, "<rect x=\"%d\" y=\"%.1f\" width=\"%d\" height=\"%.1f\" fill=\"%s\">"
               "<title>%s %s %s</title></rect>\n",
            x, y, bar_w, hgt, fam_color[fam], ferry_plan_tier_name(t),
            ferry_plan_family_name(fam), gib((double)c->bytes[t][fam], b, sizeof b));
  }
  char b[32];
  int over = c->short_by[t] > 0;
  fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"10\" "
             "fill=\"%s\">%s%s</text>\n",
          x + bar_w / 2, y - 4, over ? "#c00" : "#333", gib(total, b, sizeof b),
          clip < 1 || (budget == 0 && total > 0) ? "+" : "");
  fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", x + bar_w / 2,
          base + 16, ferry_plan_tier_name(t));
}

/* Placement p's three bars, its name and its step time or "does not fit". */
static void svg_placement(FILE *f, const ferry_plan_input *in, const ferry_plan_result *r, int p) {
  const int base = SVG_BASE, bar_w = SVG_BAR_W;
  const ferry_plan_candidate *c = &r->cand[p];
  int gx = 50 + p * SVG_GROUP_W;
  for (int t = 0; t < FERRY_PLAN_TIERS; t++) svg_bar(f, in, c, t, gx + t * (bar_w + 10));
  fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-weight=\"bold\" "
             "fill=\"%s\">%s%s</text>\n",
          gx + (3 * bar_w + 20) / 2, base + 36, c->fits ? "#060" : "#c00",
          ferry_plan_placement_name(p), p == r->recommended ? " *" : "");
  if (c->fits)
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"#333\">step %.2f s "
               "(%s)</text>\n",
            gx + (3 * bar_w + 20) / 2, base + 52, c->step_seconds,
            ferry_plan_component_name(c->bottleneck));
  else
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"#c00\">does not "
               "fit</text>\n", gx + (3 * bar_w + 20) / 2, base + 52);
}

static int write_svg(const char *path, const ferry_plan_input *in, const ferry_plan_result *r) {
  ferry_outfile o;
  char why[512];
  if (ferry_outfile_open(&o, path, why, sizeof why)) {
    fprintf(stderr, "ferry plan: --svg %s\n", why);
    return -1;
  }
  FILE *f = o.f;
  svg_head(f, in, r);
  for (int p = 0; p < FERRY_PLACEMENTS; p++) svg_placement(f, in, r, p);
  for (int fam = 0; fam < FERRY_PLAN_FAMILIES; fam++) {
    int x = 50 + fam * 130;
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/>"
               "<text x=\"%d\" y=\"%d\">%s</text>\n",
            x, SVG_H - 26, fam_color[fam], x + 16, SVG_H - 16, ferry_plan_family_name(fam));
  }
  fprintf(f, "</svg>\n");
  if (ferry_outfile_commit(&o, why, sizeof why)) {
    fprintf(stderr, "ferry plan: --svg %s\n", why);
    return -1;
  }
  return 0;
}

/* ---- config ---------------------------------------------------------------- */

/* dist: also write dist.zero_stage (ranks, or --zero-stage given). */
static int write_config(const char *path, const ferry_plan_input *in, const ferry_plan_result *r,
                        const char *nvme_path, int dist) {
  if (r->recommended < 0) {
    fprintf(stderr, "ferry plan: --write-config %s: not written, no placement fits\n", path);
    return -1;
  }
  ferry_config *c = NULL;
  if (ferry_config_create(&c)) {
    fprintf(stderr, "ferry plan: %s\n", ferry_last_error());
    return -1;
  }
  const char *pp, *pg, *po;
  ferry_plan_placement_tiers(r->recommended, &pp, &pg, &po);
  char gpu[32], host[32], chunk[32], nvme[32];
  snprintf(gpu, sizeof gpu, "%llu", (unsigned long long)in->budget[FERRY_PLAN_GPU]);
  snprintf(host, sizeof host, "%llu", (unsigned long long)in->budget[FERRY_PLAN_HOST]);
  snprintf(chunk, sizeof chunk, "%llu",
           (unsigned long long)(in->chunk_size ? in->chunk_size : 64ull << 20));
  /* NVMe: the plan's swap files and 5% (the plan is within 2% of the
   * engine's files), never above the space the plan was given */
  uint64_t files = r->cand[r->recommended].nvme_file_bytes, nb = files + files / 20;
  if (nb > in->budget[FERRY_PLAN_NVME]) nb = in->budget[FERRY_PLAN_NVME];
  snprintf(nvme, sizeof nvme, "%llu", (unsigned long long)nb);
  int uses_nvme = r->cand[r->recommended].tier_bytes[FERRY_PLAN_NVME] > 0;
  pg = ferry_plan_grads_name(r->cand[r->recommended].grads); /* "auto" resolved */
  char accum[32], clip[32], block[32], stage[8];
  snprintf(stage, sizeof stage, "%d", in->zero_stage);
  snprintf(block, sizeof block, "%lld", (long long)(in->state_block ? in->state_block : 256));
  snprintf(accum, sizeof accum, "%lld", (long long)in->grad_accumulation);
  snprintf(clip, sizeof clip, "%.9g", in->clip_grad_norm);
  /* the host backend copies with memcpy and would mlock a pinned pool, which
   * RLIMIT_MEMLOCK refuses: pageable there; CUDA pins in the driver, outside
   * that limit (memory/tier.c), so a cuda config keeps the pinned pool */
  int pinned = in->device != FERRY_PLAN_DEV_HOST;
  struct {
    const char *k, *v;
  } sets[] = {
      {"chunk_size", chunk},
      {"tiers.gpu.budget", gpu},
      {"tiers.host.budget", host},
      {"tiers.host.pinned", pinned ? "true" : "false"},
      {"placement.params", pp},
      {"placement.grads", pg},
      {"placement.optimizer", po},
      {"optimizer.type", ferry_plan_optimizer_name(in->optimizer)},
      {"precision.params", ferry_plan_precision_name(in->precision)},
      {"precision.grads", ferry_plan_precision_name(in->grad_precision)},
      {"grad_accumulation", accum},
      {"clip_grad_norm", clip},
      {"device", in->device == FERRY_PLAN_DEV_HOST ? "host" : "cuda"},
      {"tiers.nvme.budget", uses_nvme ? nvme : "0"},
      {"tiers.nvme.paths", uses_nvme && nvme_path ? nvme_path : NULL},
      {"optimizer.state_dtype", ferry_plan_dtype_name(in->state_dtype)},
      {"optimizer.state_block", block},
      {"precision.master", ferry_plan_dtype_name(in->master_dtype)},
      {"dist.zero_stage", dist ? stage : NULL},
  };
  int rc = 0;
  for (size_t i = 0; i < sizeof sets / sizeof sets[0] && !rc; i++) {
    if (!sets[i].v) continue;
    if (ferry_config_set(c, sets[i].k, sets[i].v)) {
      fprintf(stderr, "ferry plan: --write-config: %s\n", ferry_config_last_error(c));
      rc = -1;
    }
  }
  if (!rc && ferry_config_write_file(c, path)) {
    fprintf(stderr, "ferry plan: --write-config: %s\n", ferry_config_last_error(c));
    rc = -1;
  }
  if (!rc && uses_nvme && !nvme_path)
    fprintf(stderr, "ferry plan: note: %s uses NVMe but no --nvme-path was given: set "
                    "tiers.nvme.paths in %s before starting the engine\n", path, path);
  ferry_config_destroy(c);
  return rc;
}

/* ---- output ---------------------------------------------------------------- */

/* placement_keys: the engine's placement.params / grads / optimizer of
 * placement p, grads as "auto" resolves them. */
static void json_placement_keys(json_out *j, int p, int grads) {
  const char *pp, *pg, *po;
  ferry_plan_placement_tiers(p, &pp, &pg, &po);
  json_open(j, "placement_keys", '{');
  json_str(j, "params", pp);
  json_str(j, "grads", ferry_plan_grads_name(grads));
  json_str(j, "optimizer", po);
  json_close(j, '}');
}

/* A candidate's peak RSS, NVMe bytes per step, read-ahead and cached groups. */
static void json_footprint(json_out *j, const ferry_plan_candidate *c) {
  static const char *const fam[FERRY_PLAN_NV_FAMILIES] = {"params", "grads", "optimizer"};
  json_open(j, "rss_bytes", '{');
  json_uint(j, "total", c->rss.total);
  json_uint(j, "host_budget", c->rss.host_budget);
  json_uint(j, "device_budget", c->rss.device_budget);
  json_uint(j, "activations", c->rss.activations);
  json_uint(j, "scratch", c->rss.scratch);
  json_uint(j, "library", c->rss.library);
  json_uint(j, "cuda_context", c->rss.cuda);
  json_close(j, '}');
  json_open(j, "nvme_bytes_per_step", '{');
  for (int d = 0; d < 2; d++) {
    json_open(j, d ? "write" : "read", '{');
    for (int f = 0; f < FERRY_PLAN_NV_FAMILIES; f++)
      json_uint(j, fam[f], (uint64_t)llround(d ? c->nvme_write[f] : c->nvme_read[f]));
    json_close(j, '}');
  }
  json_close(j, '}');
  json_uint(j, "nvme_file_bytes", c->nvme_file_bytes);
  json_open(j, "home_bytes", '{');
  for (int f = 0; f < FERRY_PLAN_NV_FAMILIES; f++) json_uint(j, fam[f], c->home_bytes[f]);
  json_close(j, '}');
  json_open(j, "readahead", '{');
  json_uint(j, "bytes", c->readahead_bytes);
  json_bool(j, "fits", c->readahead_fits);
  json_close(j, '}');
  json_open(j, "cached_groups", '{');
  json_int(j, "host", c->cached_groups_host);
  json_int(j, "device", c->cached_groups_device);
  json_close(j, '}');
  json_num(j, "optim_bytes_per_param", c->optim_bytes_per_param);
  json_num(j, "step_bytes_per_param", c->step_bytes_per_param);
  json_open(j, "comm", '{');
  json_num(j, "grad_bytes", c->comm_grad_bytes);
  json_num(j, "param_bytes", c->comm_param_bytes);
  json_num(j, "bytes_per_step", c->comm_bytes);
  json_num(j, "link_gbps", c->comm_link_gbps);
  json_num(j, "seconds", c->comm_seconds);
  json_num(j, "exposed_seconds", c->comm_exposed_seconds);
  json_num(j, "hidden_fraction", c->comm_hidden_fraction);
  json_close(j, '}');
}

/* The model, the training input and the chosen (or closest) placement. */
static void json_summary(json_out *j, const ferry_plan_input *in, const ferry_plan_result *r,
                         const hw_notes *hw) {
  const ferry_plan_model *m = &in->model;
  static const char *const arch[] = {"gpt2", "llama", "dense"};
  json_str(j, "model", m->name);
  json_str(j, "arch", arch[m->arch]);
  json_uint(j, "params", r->params);
  json_uint(j, "largest_group_params", r->largest_group);
  json_int(j, "groups", r->groups);
  json_int(j, "layers", m->layers);
  json_int(j, "hidden", m->hidden);
  json_int(j, "batch", in->batch);
  json_int(j, "seq", in->seq);
  json_str(j, "precision", ferry_plan_precision_name(in->precision));
  json_str(j, "optimizer", ferry_plan_optimizer_name(in->optimizer));
  json_bool(j, "checkpointing", in->checkpointing);
  json_str(j, "attention", in->flash_attention ? "flash" : "materialized");
  ferry_gpt_layout lay;
  if (ferry_plan_gpt_layout(in, &lay)) {
    json_open(j, "cuda_block", '{');
    json_uint(j, "activations", lay.activations);
    json_uint(j, "workspace", lay.workspace);
    json_uint(j, "block_inputs", lay.buf[FERRY_GL_XRES].bytes);
    json_uint(j, "blocks_saved", (uint64_t)lay.n_acts);
    json_uint(j, "rows_saved", (uint64_t)lay.act_rows);
    json_uint(j, "chunk_sequences", (uint64_t)lay.chunk_b);
    json_uint(j, "loss_chunk_tokens", (uint64_t)lay.ce_rows);
    json_close(j, '}');
  }
  json_uint(j, "chunk_size", in->chunk_size);
  json_str(j, "device", in->device == FERRY_PLAN_DEV_HOST ? "host" : "cuda");
  json_int(j, "grad_accumulation", in->grad_accumulation);
  json_num(j, "clip_grad_norm", in->clip_grad_norm);
  json_str(j, "grad_precision", ferry_plan_precision_name(in->grad_precision));
  json_str(j, "state_dtype", ferry_plan_dtype_name(in->state_dtype));
  json_int(j, "state_block", in->state_block ? in->state_block : 256);
  json_str(j, "master", ferry_plan_dtype_name(in->master_dtype));
  int best = r->recommended >= 0 ? r->recommended : r->closest;
  const ferry_plan_candidate *b = &r->cand[best];
  json_int(j, "ranks", r->ranks);
  json_int(j, "gpus", in->gpus);
  json_int(j, "nodes", in->nodes);
  json_int(j, "zero_stage", in->zero_stage);
  json_int(j, "rank", in->rank);
  json_str(j, "family_bytes", r->bytes_estimated ? "estimated" : "exact");
  json_num(j, "net_gbps", in->net_gbps);
  json_num(j, "intra_gbps", in->intra_gbps > 0 ? in->intra_gbps : 8 * in->bw.h2d_gbps);
  json_num(j, "comm_bytes_per_step", b->comm_bytes);
  json_num(j, "comm_seconds", b->comm_seconds);
  json_num(j, "comm_exposed_seconds", b->comm_exposed_seconds);
  json_num(j, "comm_hidden_fraction", b->comm_hidden_fraction);
  if (r->recommended >= 0) json_str(j, "placement", ferry_plan_placement_name(best));
  else json_null(j, "placement");
  json_bool(j, "fits", r->recommended >= 0);
  json_str(j, "closest", ferry_plan_placement_name(r->closest));
  json_str(j, "why", b->why);
  json_open(j, "tiers", '{');
  for (int t = 0; t < FERRY_PLAN_TIERS; t++) {
    json_open(j, ferry_plan_tier_name(t), '{');
    json_uint(j, "bytes", b->tier_bytes[t]);
    json_uint(j, "budget", in->budget[t]);
    json_uint(j, "short_by", b->short_by[t]);
    json_str(j, "budget_source", hw->text[t]);
    json_close(j, '}');
  }
  json_close(j, '}');
  json_num(j, "step_seconds", b->step_seconds);
  json_str(j, "bottleneck", ferry_plan_component_name(b->bottleneck));
  json_int(j, "max_batch", b->max_batch);
  json_uint(j, "pinned_bytes", b->pinned_bytes);
  json_placement_keys(j, best, b->grads);
  json_footprint(j, b);
  if (hw->memlock == UINT64_MAX) json_null(j, "memlock_bytes");
  else json_uint(j, "memlock_bytes", hw->memlock);
}

static void json_bandwidths(json_out *j, const ferry_plan_input *in) {
  json_open(j, "bandwidths", '{');
  json_open(j, "assumed", '[');
  for (unsigned bit = 1; bit <= FERRY_PLAN_BW_DEVMEM; bit <<= 1)
    if (!(in->bw.measured & bit)) json_str(j, NULL, ferry_plan_bandwidth_key(bit));
  json_close(j, ']');
  json_num(j, "h2d_gbps", in->bw.h2d_gbps);
  json_num(j, "d2h_gbps", in->bw.d2h_gbps);
  json_num(j, "nvme_read_gbps", in->bw.nvme_read_gbps);
  json_num(j, "nvme_write_gbps", in->bw.nvme_write_gbps);
  json_num(j, "cpu_optimizer_gbps", in->bw.cpu_optimizer_gbps);
  json_num(j, "device_tflops", in->bw.device_tflops);
  json_num(j, "device_tflops_fp32", in->bw.device_tflops_fp32);
  json_num(j, "device_mem_gbps", in->bw.device_mem_gbps);
  json_close(j, '}');
}

/* One element of "candidates": placement p, every tier and family. */
static void json_candidate(json_out *j, const ferry_plan_input *in, const ferry_plan_candidate *c,
                           int p) {
  const char *pp, *pg, *po;
  ferry_plan_placement_tiers(p, &pp, &pg, &po);
  json_open(j, NULL, '{');
  pg = ferry_plan_grads_name(c->grads);
  json_str(j, "placement", ferry_plan_placement_name(p));
  json_str(j, "params_tier", pp);
  json_str(j, "grads_tier", pg);
  json_str(j, "optimizer_tier", po);
  json_placement_keys(j, p, c->grads);
  json_bool(j, "fits", c->fits);
  json_str(j, "why", c->why);
  json_open(j, "tiers", '{');
  for (int t = 0; t < FERRY_PLAN_TIERS; t++) {
    json_open(j, ferry_plan_tier_name(t), '{');
    json_uint(j, "bytes", c->tier_bytes[t]);
    json_uint(j, "budget", in->budget[t]);
    json_uint(j, "short_by", c->short_by[t]);
    json_open(j, "families", '{');
    for (int f = 0; f < FERRY_PLAN_FAMILIES; f++)
      json_uint(j, ferry_plan_family_name(f), c->bytes[t][f]);
    json_close(j, '}');
    json_close(j, '}');
  }
  json_close(j, '}');
  json_uint(j, "pinned_bytes", c->pinned_bytes);
  json_open(j, "traffic_bytes", '{');
  json_num(j, "h2d", c->h2d_bytes);
  json_num(j, "d2h", c->d2h_bytes);
  json_num(j, "nvme_read", c->nvme_read_bytes);
  json_num(j, "nvme_write", c->nvme_write_bytes);
  json_num(j, "cpu", c->cpu_bytes);
  json_close(j, '}');
  json_num(j, "flops", c->flops);
  json_open(j, "components", '{');
  for (int k = 0; k < FERRY_COMPONENTS; k++)
    json_num(j, ferry_plan_component_name(k), c->seconds[k]);
  json_num(j, "fill_drain", c->fill_seconds);
  json_num(j, "backward_io", c->backward_io_seconds);
  json_close(j, '}');
  json_num(j, "step_seconds", c->step_seconds);
  json_str(j, "bottleneck", ferry_plan_component_name(c->bottleneck));
  json_int(j, "max_batch", c->max_batch);
  json_footprint(j, c);
  json_close(j, '}');
}

static void print_json(const ferry_plan_input *in, const ferry_plan_result *r,
                       const hw_notes *hw) {
  json_out j;
  json_begin(&j, stdout);
  json_summary(&j, in, r, hw);
  json_bandwidths(&j, in);
  json_open(&j, "candidates", '[');
  for (int p = 0; p < FERRY_PLACEMENTS; p++) json_candidate(&j, in, &r->cand[p], p);
  json_close(&j, ']');
  json_end(&j);
}

static void cell_gib(double b) {
  if (b <= 0) printf(" %14s", "-");
  else printf(" %14.1f", b / (1024.0 * 1024 * 1024));
}

/* The ranks of a data-parallel plan (nothing with one rank). */
static void print_ranks(const ferry_plan_input *in, const ferry_plan_result *r) {
  static const char *const what[] = {"everything replicated, grads all-reduced",
                                     "master and optimizer states sharded",
                                     "master, optimizer states and grads sharded",
                                     "master, optimizer states, grads and params sharded"};
  if (r->ranks <= 1) return;
  printf("ranks      %d = %d GPU%s x %d node%s, ZeRO stage %d (%s); every figure is one "
         "rank's, batch per rank\n",
         r->ranks, in->gpus, in->gpus > 1 ? "s" : "", in->nodes, in->nodes > 1 ? "s" : "",
         in->zero_stage, what[in->zero_stage]);
  char intra[48];
  if (in->intra_gbps > 0) snprintf(intra, sizeof intra, "%g Gb/s (--intra-gbps)", in->intra_gbps);
  else snprintf(intra, sizeof intra, "%g Gb/s (8 x h2d_gbps)", 8 * in->bw.h2d_gbps);
  printf("           network %g Gb/s per node%s, GPU links %s\n", in->net_gbps,
         in->nodes > 1 ? "" : " (unused: one node)", intra);
  if (in->zero_stage < 1) return;
  if (r->ranks > FERRY_PLAN_EXACT_RANKS)
    printf("           family bytes estimated: a family's bytes / %d (past %d ranks)\n",
           r->ranks, FERRY_PLAN_EXACT_RANKS);
  else if (in->rank >= 0)
    printf("           family bytes: rank %d's pieces, as the engine splits the groups\n",
           in->rank);
  else
    printf("           family bytes: per family the rank holding the most (--rank R: one "
           "rank's)\n");
}

/* The model, the training input, the budgets and the assumed bandwidths. */
static void print_input(const ferry_plan_input *in, const ferry_plan_result *r,
                        const hw_notes *hw) {
  const ferry_plan_model *m = &in->model;
  char a[32];
  printf("model      %s: %s parameters", m->name, commas(r->params, a, sizeof a));
  if (m->arch == FERRY_ARCH_DENSE)
    printf(" (dense; shape assumed for activations: %lld layers, hidden %lld)\n"
           "           family bytes estimated: no tensors to pack as the engine does\n",
           (long long)m->layers, (long long)m->hidden);
  else
    printf(" (%s: %lld layers, hidden %lld, ffn %lld, %lld heads, %lld kv heads, vocab %lld%s%s)\n",
           m->arch == FERRY_ARCH_GPT2 ? "gpt2" : "llama", (long long)m->layers,
           (long long)m->hidden, (long long)m->ffn, (long long)m->heads, (long long)m->kv_heads,
           (long long)m->vocab, m->tied ? ", tied embeddings" : "",
           m->qkv_bias ? ", q/k/v biases" : "");
  printf("           %lld groups (embedding, %lld blocks, head); largest %s parameters\n",
         (long long)r->groups, (long long)m->layers, commas(r->largest_group, a, sizeof a));
  char blk[48] = "";
  if (in->state_dtype == FERRY_DT_I8)
    snprintf(blk, sizeof blk, ", block %lld", (long long)(in->state_block ? in->state_block : 256));
  printf("training   batch %lld x seq %lld, %s params, %s (%d %s state%s%s, %s master), "
         "checkpointing %s, attention %s\n",
         (long long)in->batch, (long long)in->seq, ferry_plan_precision_name(in->precision),
         ferry_plan_optimizer_name(in->optimizer), ferry_plan_optimizer_states(in->optimizer),
         ferry_plan_dtype_name(in->state_dtype),
         ferry_plan_optimizer_states(in->optimizer) > 1 ? "s" : "", blk,
         ferry_plan_dtype_name(in->master_dtype), in->checkpointing ? "on" : "off",
         in->flash_attention ? "flash" : "materialized");
  printf("           grad accumulation %lld, clip_grad_norm %s, %s grad accumulators, device %s\n",
         (long long)in->grad_accumulation, in->clip_grad_norm > 0 ? "on" : "off",
         ferry_plan_precision_name(in->grad_precision),
         in->device == FERRY_PLAN_DEV_HOST ? "host (emulated GPU, fp32 CPU model)" : "cuda");
  ferry_gpt_layout lay;
  if (ferry_plan_gpt_layout(in, &lay)) {
    char x[32], y[32], z[32], rt[32];
    printf("cuda       activations %s (block inputs %s; %d block%s of %ld rows saved), "
           "workspace %s + %s runtime\n",
           gib((double)lay.activations, a, sizeof a),
           gib((double)lay.buf[FERRY_GL_XRES].bytes, x, sizeof x), lay.n_acts,
           lay.n_acts > 1 ? "s" : "", lay.act_rows, gib((double)lay.workspace, y, sizeof y),
           gib((double)FERRY_PLAN_CUDA_RUNTIME, rt, sizeof rt));
    printf("           ferry-gpt's CUDA model (plan/gpt_layout.c): passes over %ld sequence%s, "
           "the loss over %ld tokens at a time; one block's share %s\n",
           lay.chunk_b, lay.chunk_b > 1 ? "s" : "", lay.ce_rows,
           gib((double)(lay.bytes - lay.buf[FERRY_GL_XRES].bytes), z, sizeof z));
  }
  print_ranks(in, r);
  for (int t = 0; t < FERRY_PLAN_TIERS; t++)
    printf("%s %-4s %10s  %s\n", t ? "          " : "budgets   ", ferry_plan_tier_name(t),
           gib((double)in->budget[t], a, sizeof a), hw->text[t]);
  if ((in->bw.measured & 0xff) == 0xff) return;
  printf("assumed    %s (no measurement; `ferry bench all` writes a --profile):\n",
         in->bw.measured ? "some bandwidths from defaults" : "default bandwidths");
  for (unsigned bit = 1; bit <= FERRY_PLAN_BW_DEVMEM; bit <<= 1) {
    if (in->bw.measured & bit) continue;
    double v = ferry_plan_bandwidth_value(&in->bw, bit);
    const char *key = ferry_plan_bandwidth_key(bit);
    const char *src = ferry_plan_bandwidth_source(bit);
    if ((bit == FERRY_PLAN_BW_H2D || bit == FERRY_PLAN_BW_D2H) && hw->pcie_gen)
      src = "from this GPU's PCIe link: 80% of its raw rate";
    printf("             %-20s %7.1f %s  %s\n", key, v,
           strstr(key, "tflops") ? "TFLOP/s" : "GB/s   ", src);
  }
}

/* Bytes per tier and family, one column per placement, and whether it fits. */
static void print_bytes(const ferry_plan_input *in, const ferry_plan_result *r) {
  char a[32];
  printf("\nbytes (GiB)       ");
  for (int p = 0; p < FERRY_PLACEMENTS; p++) printf(" %14s", ferry_plan_placement_name(p));
  printf("\n  %-17s", "params/grads/opt");
  for (int p = 0; p < FERRY_PLACEMENTS; p++) {
    const char *pp, *pg, *po;
    char cell[48];
    ferry_plan_placement_tiers(p, &pp, &pg, &po);
    snprintf(cell, sizeof cell, "%s/%s/%s", pp, ferry_plan_grads_name(r->cand[p].grads), po);
    printf("%15s", cell);
  }
  printf("\n");
  for (int t = 0; t < FERRY_PLAN_TIERS; t++) {
    for (int f = 0; f < FERRY_PLAN_FAMILIES; f++) {
      int any = 0;
      for (int p = 0; p < FERRY_PLACEMENTS; p++) any |= r->cand[p].bytes[t][f] > 0;
      if (!any) continue;
      printf("  %-4s %-12s", ferry_plan_tier_name(t), ferry_plan_family_name(f));
      for (int p = 0; p < FERRY_PLACEMENTS; p++) cell_gib((double)r->cand[p].bytes[t][f]);
      printf("\n");
    }
    snprintf(a, sizeof a, "total/%.1f", (double)in->budget[t] / (1024.0 * 1024 * 1024));
    printf("  %-4s %-12s", ferry_plan_tier_name(t), a);
    for (int p = 0; p < FERRY_PLACEMENTS; p++) {
      char cell[32];
      snprintf(cell, sizeof cell, "%.1f%s",
               (double)r->cand[p].tier_bytes[t] / (1024.0 * 1024 * 1024),
               r->cand[p].short_by[t] ? " !" : "");
      printf(" %14s", r->cand[p].tier_bytes[t] ? cell : "-");
    }
    printf("\n");
    if (t != FERRY_PLAN_NVME) continue;
    /* the swap files: the chunks' bytes and the spare slots */
    printf("  %-4s %-12s", ferry_plan_tier_name(t), "swap files");
    for (int p = 0; p < FERRY_PLACEMENTS; p++) {
      char cell[32];
      uint64_t fb = r->cand[p].nvme_file_bytes;
      snprintf(cell, sizeof cell, "%.1f%s", (double)fb / (1024.0 * 1024 * 1024),
               fb > in->budget[t] ? " !" : "");
      printf(" %14s", fb ? cell : "-");
    }
    printf("\n");
  }
  printf("  fits             ");
  for (int p = 0; p < FERRY_PLACEMENTS; p++) printf(" %14s", r->cand[p].fits ? "yes" : "no");
  printf("\n  %-16s", "read-ahead");
  for (int p = 0; p < FERRY_PLACEMENTS; p++) {
    const ferry_plan_candidate *c = &r->cand[p];
    char cell[32];
    snprintf(cell, sizeof cell, "%.1f%s", (double)c->readahead_bytes / (1024.0 * 1024 * 1024),
             c->readahead_fits ? "" : " !");
    printf(" %14s", c->readahead_bytes ? cell : "-");
  }
  printf("\n  %-16s", "peak RSS");
  for (int p = 0; p < FERRY_PLACEMENTS; p++) cell_gib((double)r->cand[p].rss.total);
}

/* NVMe bytes per step, per direction and engine family (rows with bytes). */
static void print_nvme_rows(const ferry_plan_result *r) {
  static const char *const fam[FERRY_PLAN_NV_FAMILIES] = {"params", "grads", "optimizer"};
  int header = 0;
  for (int d = 0; d < 2; d++)
    for (int f = 0; f < FERRY_PLAN_NV_FAMILIES; f++) {
      int any = 0;
      for (int p = 0; p < FERRY_PLACEMENTS; p++)
        any |= (d ? r->cand[p].nvme_write[f] : r->cand[p].nvme_read[f]) > 0;
      if (!any) continue;
      if (!header++) printf("\n\nnvme per step (GiB)");
      printf("\n  %-5s %-10s", d ? "write" : "read", fam[f]);
      for (int p = 0; p < FERRY_PLACEMENTS; p++)
        cell_gib(d ? r->cand[p].nvme_write[f] : r->cand[p].nvme_read[f]);
    }
}

/* Seconds per component, one column per placement, and the step. */
static void print_step(const ferry_plan_result *r) {
  printf("\n\nstep (seconds)    ");
  for (int p = 0; p < FERRY_PLACEMENTS; p++) printf(" %14s", ferry_plan_placement_name(p));
  printf("\n");
  for (int k = 0; k < FERRY_COMPONENTS; k++) {
    if (k == FERRY_COMP_NET && r->ranks <= 1) continue;
    printf("  %-16s", ferry_plan_component_name(k));
    for (int p = 0; p < FERRY_PLACEMENTS; p++) {
      double s = r->cand[p].seconds[k];
      if (s <= 0) printf(" %14s", "-");
      else printf(" %14.3f", s);
    }
    printf("\n");
  }
  printf("  %-16s", "fill + drain");
  for (int p = 0; p < FERRY_PLACEMENTS; p++) printf(" %14.3f", r->cand[p].fill_seconds);
  int bio = 0;
  for (int p = 0; p < FERRY_PLACEMENTS; p++) bio |= r->cand[p].backward_io_seconds > 0;
  if (bio) { /* the host backend's step during backward (docs/PLANNING.md) */
    printf("\n  %-16s", "backward I/O");
    for (int p = 0; p < FERRY_PLACEMENTS; p++) {
      double s = r->cand[p].backward_io_seconds;
      if (s <= 0) printf(" %14s", "-");
      else printf(" %14.3f", s);
    }
  }
  printf("\n  %-16s", "step");
  for (int p = 0; p < FERRY_PLACEMENTS; p++) printf(" %14.3f", r->cand[p].step_seconds);
  printf("\n  %-16s", "bottleneck");
  for (int p = 0; p < FERRY_PLACEMENTS; p++)
    printf(" %14s", ferry_plan_component_name(r->cand[p].bottleneck));
  printf("\n  %-16s", "largest batch");
  for (int p = 0; p < FERRY_PLACEMENTS; p++) printf(" %14lld", (long long)r->cand[p].max_batch);
  if (r->ranks > 1) {
    printf("\n  %-16s", "comm GiB/rank");
    for (int p = 0; p < FERRY_PLACEMENTS; p++) cell_gib(r->cand[p].comm_bytes);
    printf("\n  %-16s", "comm hidden");
    for (int p = 0; p < FERRY_PLACEMENTS; p++)
      printf(" %13.0f%%", 100 * r->cand[p].comm_hidden_fraction);
  }
  print_nvme_rows(r);
  printf("\n\n");
}

/* The recommended placement's homes, peak RSS, NVMe bytes per step and
 * read-ahead. */
static void print_footprint(const ferry_plan_input *in, int p, const ferry_plan_candidate *c,
                            int estimated) {
  const ferry_plan_rss *s = &c->rss;
  const char *pp, *pg, *po;
  char a[32], b[32], d[32], e[32], f[32], g[32], h[32];
  ferry_plan_placement_tiers(p, &pp, &pg, &po);
  printf("  placement.params = %s, placement.grads = %s (\"auto\"), placement.optimizer = %s\n",
         pp, ferry_plan_grads_name(c->grads), po);
  printf("  peak RSS ~ %s = host budget %s + device budget %s + activations %s + scratch %s "
         "+ library %s + CUDA context %s\n",
         gib((double)s->total, a, sizeof a), gib((double)s->host_budget, b, sizeof b),
         gib((double)s->device_budget, d, sizeof d), gib((double)s->activations, e, sizeof e),
         gib((double)s->scratch, f, sizeof f), gib((double)s->library, g, sizeof g),
         gib((double)s->cuda, h, sizeof h));
  if (c->nvme_read_bytes > 0 || c->nvme_write_bytes > 0)
    printf("  NVMe per step: read params %s, grads %s, optimizer %s; write params %s, grads %s, "
           "optimizer %s\n",
           gib(c->nvme_read[0], a, sizeof a), gib(c->nvme_read[1], b, sizeof b),
           gib(c->nvme_read[2], d, sizeof d), gib(c->nvme_write[0], e, sizeof e),
           gib(c->nvme_write[1], f, sizeof f), gib(c->nvme_write[2], g, sizeof g));
  if (c->cached_groups_host > 0)
    printf("  NVMe params kept at the forward/backward turn: %lld group(s) (host pool; %lld of "
           "them also on the device)\n", (long long)c->cached_groups_host,
           (long long)(c->cached_groups_device < c->cached_groups_host ? c->cached_groups_device
                                                                       : c->cached_groups_host));
  if (c->readahead_bytes)
    printf("  read-ahead: the next group's optimizer chunks, %s: %s\n",
           gib((double)c->readahead_bytes, a, sizeof a),
           c->readahead_fits ? "fits beside the working set"
                             : "no room (the step waits for each group's read)");
  printf("  optimizer: %s states%s, %s master: %.4g bytes per param at home, %.4g moved per "
         "param and step (read + written)\n",
         ferry_plan_dtype_name(in->state_dtype), in->state_dtype == FERRY_DT_I8 ? " + absmax" : "",
         ferry_plan_dtype_name(in->master_dtype), c->optim_bytes_per_param,
         c->step_bytes_per_param);
  const uint64_t *hb = c->home_bytes;
  printf("  model states %s: params %s, grads %s, optimizer %s (each family's home%s)\n",
         gib((double)(hb[0] + hb[1] + hb[2]), a, sizeof a), gib((double)hb[0], b, sizeof b),
         hb[1] ? gib((double)hb[1], d, sizeof d) : "none", gib((double)hb[2], e, sizeof e),
         estimated ? ", estimated" : ", as the engine packs it");
  (void)p;
}

/* The recommended placement: its step, what limits it, its tiers, the
 * largest batch and whether pinning it fits RLIMIT_MEMLOCK. */
static void print_recommended(const ferry_plan_input *in, const ferry_plan_result *r,
                              const hw_notes *hw) {
  const ferry_plan_candidate *c = &r->cand[r->recommended];
  char a[32], b[32], d[32];
  printf("recommended: %s — %s\n", ferry_plan_placement_name(r->recommended),
         ferry_plan_placement_desc(r->recommended));
  printf("  step ~ %.3f s, bottleneck %s (%.3f s", c->step_seconds,
         ferry_plan_component_name(c->bottleneck), c->seconds[c->bottleneck]);
  switch (c->bottleneck) {
  case FERRY_COMP_NVME:
    printf(": %s read, %s written per step", gib(c->nvme_read_bytes, a, sizeof a),
           gib(c->nvme_write_bytes, b, sizeof b));
    break;
  case FERRY_COMP_H2D: printf(": %s uploaded per step", gib(c->h2d_bytes, a, sizeof a)); break;
  case FERRY_COMP_D2H: printf(": %s of grads drained", gib(c->d2h_bytes, a, sizeof a)); break;
  case FERRY_COMP_CPU: printf(": %s of CPU memory traffic", gib(c->cpu_bytes, a, sizeof a)); break;
  case FERRY_COMP_NET:
    printf(": %s sent per rank over %g Gb/s", gib(c->comm_bytes, a, sizeof a), c->comm_link_gbps);
    break;
  default: printf(": %.3g FLOP", c->flops); break;
  }
  printf("); compute alone %.3f s\n", c->seconds[FERRY_COMP_COMPUTE]);
  if (c->backward_io_seconds > 0)
    printf("  backward I/O +%.3f s: the optimizer's NVMe traffic runs in backward only (step\n"
           "    during backward)%s\n", c->backward_io_seconds,
           c->readahead_bytes && !c->readahead_fits
               ? ", each group's state read after the group before it is stepped"
               : "");
  double tok = (double)in->batch * (double)in->seq;
  unsigned bit;
  double rate = ferry_plan_compute_tflops(in, &bit);
  printf("  %.0f tokens/s, %.3g TFLOP/s achieved (%s %.3g, %s)", tok / c->step_seconds,
         c->flops / c->step_seconds / 1e12, ferry_plan_bandwidth_key(bit), rate,
         in->bw.measured & bit ? "from the profile" : "default");
  if (r->ranks > 1)
    printf(" per rank; %.0f tokens/s over the %d ranks", tok * r->ranks / c->step_seconds,
           r->ranks);
  printf("\n");
  printf("  tiers:");
  for (int t = 0; t < FERRY_PLAN_TIERS; t++)
    printf("%s %s %s of %s", t ? "," : "", ferry_plan_tier_name(t),
           gib((double)c->tier_bytes[t], a, sizeof a), gib((double)in->budget[t], b, sizeof b));
  printf("\n");
  printf("  largest batch at seq %lld: %lld\n", (long long)in->seq, (long long)c->max_batch);
  if (r->ranks > 1)
    printf("  communication per rank and step: %s (grads %s %s, params %s all-gathered) over "
           "%g Gb/s: %.3f s, %.0f%% hidden behind compute and the optimizer (adds %.3f s)\n",
           gib(c->comm_bytes, a, sizeof a), gib(c->comm_grad_bytes, b, sizeof b),
           in->zero_stage == 0 ? "all-reduced" : "reduce-scattered",
           gib(c->comm_param_bytes, d, sizeof d), c->comm_link_gbps, c->comm_seconds,
           100 * c->comm_hidden_fraction, c->comm_exposed_seconds);
  print_footprint(in, r->recommended, c, r->bytes_estimated);
  /* the host backend pins nothing (--write-config says pinned = false) */
  if (in->device == FERRY_PLAN_DEV_HOST || hw->memlock == UINT64_MAX ||
      c->pinned_bytes <= hw->memlock)
    return;
  if (hw->host_here) /* cudaHostAlloc pins in the driver, outside the limit */
    printf("  note: the host tier is pinned (%s) and RLIMIT_MEMLOCK here is %s: the CUDA "
           "driver pins outside that limit; the engine warns and continues\n",
           gib((double)c->pinned_bytes, a, sizeof a), gib((double)hw->memlock, b, sizeof b));
  else
    printf("  note: %s of the host tier is pinned; the target machine's `ulimit -l` must "
           "allow it (here it is %s)\n",
           gib((double)c->pinned_bytes, a, sizeof a), gib((double)hw->memlock, b, sizeof b));
}

static void print_text(const ferry_plan_input *in, const ferry_plan_result *r, const hw_notes *hw) {
  print_input(in, r, hw);
  print_bytes(in, r);
  print_step(r);
  for (int p = 0; p < FERRY_PLACEMENTS; p++)
    if (!r->cand[p].fits)
      printf("%-15s does not fit: %s\n", ferry_plan_placement_name(p), r->cand[p].why);
  if (in->budget[FERRY_PLAN_NVME] == 0)
    printf("(no NVMe given: --nvme SIZE or --nvme-path DIR plans the NVMe placements)\n");
  printf("\n");
  if (r->recommended >= 0) {
    print_recommended(in, r, hw);
    return;
  }
  const ferry_plan_candidate *c = &r->cand[r->closest];
  printf("nothing fits. Closest: %s, %s.\n", ferry_plan_placement_name(r->closest), c->why);
  if (in->batch > 1 && c->max_batch == 0)
    printf("A smaller batch does not help: even batch 1 does not fit there.\n");
}

/* ---- main ------------------------------------------------------------------- */

/* The flags as given. */
typedef struct {
  const char *model, *params, *gpu_mem, *host_mem, *nvme, *nvme_path, *profile, *cfg_out, *svg;
  const char *gpu_budget, *host_budget;
  int json, largest;
  int zero_stage_given; /* --zero-stage was on the command line */
} plan_flags;

/* Whether the plan is data-parallel: ranks, or a ZeRO stage asked for. */
static int plan_dist(const plan_flags *fl, const ferry_plan_input *in) {
  return fl->zero_stage_given || in->gpus * in->nodes > 1;
}

#define PLAN_GO (-1) /* parse_flags: go on and plan */

static void list_models(void) {
  for (int k = 0; k < ferry_plan_preset_count(); k++) {
    ferry_plan_model m;
    char c[32];
    ferry_plan_model_preset(ferry_plan_preset_name(k), &m, NULL, 0);
    printf("%-14s %18s params\n", m.name, commas(ferry_plan_model_params(&m), c, sizeof c));
  }
}

/* Flag o with its value v: 0, or 2 after saying what is wrong. */
static int take_value(const char *o, const char *v, plan_flags *fl, ferry_plan_input *in) {
  static const char *const precs[] = {"fp32", "fp16", "bf16"};
  static const char *const opts[] = {"adamw", "adam", "adagrad", "lamb", "sgd", "lion"};
  static const char *const onoff[] = {"off", "on"};
  static const char *const attn[] = {"materialized", "flash"};
  static const char *const devs[] = {"cuda", "host"};
  static const char *const gprecs[] = {"fp32", "bf16"};
  static const char *const sdts[] = {"fp32", "bf16", "int8"};
  static const int sdt_val[] = {FERRY_DT_F32, FERRY_DT_BF16, FERRY_DT_I8};
  static const struct {
    const char *flag;
    size_t off;
  } strs[] = {
      {"--model", offsetof(plan_flags, model)},
      {"--params", offsetof(plan_flags, params)},
      {"--gpu-mem", offsetof(plan_flags, gpu_mem)},
      {"--host-mem", offsetof(plan_flags, host_mem)},
      {"--nvme", offsetof(plan_flags, nvme)},
      {"--nvme-path", offsetof(plan_flags, nvme_path)},
      {"--profile", offsetof(plan_flags, profile)},
      {"--write-config", offsetof(plan_flags, cfg_out)},
      {"--svg", offsetof(plan_flags, svg)},
      {"--gpu-budget", offsetof(plan_flags, gpu_budget)},
      {"--host-budget", offsetof(plan_flags, host_budget)},
  };
  for (size_t k = 0; k < sizeof strs / sizeof strs[0]; k++)
    if (!strcmp(o, strs[k].flag)) {
      *(const char **)((char *)fl + strs[k].off) = v;
      return 0;
    }
  int bad = 0;
  if (!strcmp(o, "--batch")) bad = parse_int(o, v, 1, 1 << 24, &in->batch);
  else if (!strcmp(o, "--seq")) bad = parse_int(o, v, 1, 1 << 22, &in->seq);
  else if (!strcmp(o, "--precision")) bad = pick(o, v, precs, 3, &in->precision);
  else if (!strcmp(o, "--optimizer")) bad = pick(o, v, opts, 6, &in->optimizer);
  else if (!strcmp(o, "--checkpointing")) bad = pick(o, v, onoff, 2, &in->checkpointing);
  else if (!strcmp(o, "--attention")) bad = pick(o, v, attn, 2, &in->flash_attention);
  else if (!strcmp(o, "--device")) bad = pick(o, v, devs, 2, &in->device);
  else if (!strcmp(o, "--grad-accumulation"))
    bad = parse_int(o, v, 1, 1000000, &in->grad_accumulation);
  else if (!strcmp(o, "--clip-grad-norm"))
    bad = parse_clip(v, &in->clip_grad_norm) || engine_refuses(o, "clip_grad_norm", v);
  else if (!strcmp(o, "--gpus") || !strcmp(o, "--nodes") || !strcmp(o, "--zero-stage")) {
    int stage = o[2] == 'z';
    int64_t n = 0;
    bad = parse_int(o, v, stage ? 0 : 1, stage ? 3 : 65536, &n);
    *(stage ? &in->zero_stage : o[2] == 'g' ? &in->gpus : &in->nodes) = (int)n;
    fl->zero_stage_given |= stage;
  }
  else if (!strcmp(o, "--rank")) {
    int64_t n = 0;
    bad = parse_int(o, v, 0, (int64_t)65536 * 65536 - 1, &n);
    in->rank = (int)n;
  }
  else if (!strcmp(o, "--net-gbps") || !strcmp(o, "--intra-gbps"))
    bad = parse_gbps(o, v, o[2] == 'n' ? &in->net_gbps : &in->intra_gbps);
  else if (!strcmp(o, "--grad-precision")) {
    int g = 0;
    bad = pick(o, v, gprecs, 2, &g);
    in->grad_precision = g ? FERRY_PREC_BF16 : FERRY_PREC_FP32;
  }
  else if (!strcmp(o, "--state-dtype") || !strcmp(o, "--master")) {
    int d = 0;
    int master = o[2] == 'm';
    bad = pick(o, v, sdts, master ? 2 : 3, &d);
    *(master ? &in->master_dtype : &in->state_dtype) = sdt_val[d];
  }
  else if (!strcmp(o, "--state-block")) {
    bad = parse_int(o, v, 32, 4096, &in->state_block);
    if (!bad && (in->state_block & (in->state_block - 1))) {
      fprintf(stderr, "ferry plan: --state-block %s: a power of two from 32 to 4096\n", v);
      bad = 1;
    }
  }
  else if (!strcmp(o, "--chunk-size")) {
    bad = parse_size_flag(o, v, &in->chunk_size);
    if (!bad && in->chunk_size < 4096) {
      fprintf(stderr, "ferry plan: --chunk-size %s: at least 4096 bytes\n", v);
      bad = 1;
    }
    if (!bad) bad = engine_refuses(o, "chunk_size", v);
  }
  return bad ? 2 : 0;
}

/* The command line: PLAN_GO, or the exit status of --help, --list-models or
 * a bad flag. */
static int parse_flags(int argc, char **argv, plan_flags *fl, ferry_plan_input *in) {
  static const char *const with_value[] = {
      "--model",  "--params",    "--gpu-mem",    "--host-mem",     "--nvme",
      "--nvme-path", "--batch",  "--seq",        "--precision",    "--optimizer",
      "--checkpointing", "--profile", "--write-config", "--svg", "--attention",
      "--chunk-size", "--gpu-budget", "--host-budget", "--device", "--grad-accumulation",
      "--clip-grad-norm", "--grad-precision", "--state-dtype", "--state-block", "--master",
      "--gpus", "--nodes", "--zero-stage", "--net-gbps", "--intra-gbps", "--rank"};
  for (int i = 1; i < argc; i++) {
    const char *o = argv[i];
    if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
      plan_usage(stdout);
      return 0;
    }
    if (!strcmp(o, "--json") || !strcmp(o, "--largest")) {
      *(o[2] == 'j' ? &fl->json : &fl->largest) = 1;
      continue;
    }
    if (!strcmp(o, "--list-models")) {
      list_models();
      return 0;
    }
    int known = 0;
    for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++)
      known |= !strcmp(o, with_value[k]);
    if (!known) {
      fprintf(stderr, "ferry plan: unknown option '%s' (ferry plan --help)\n", o);
      return 2;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "ferry plan: %s needs a value\n", o);
      return 2;
    }
    if (take_value(o, argv[++i], fl, in)) return 2;
  }
  if (in->master_dtype == FERRY_DT_BF16 && in->precision != FERRY_PREC_BF16) {
    fprintf(stderr, "ferry plan: --master bf16 needs --precision bf16 (the params are the "
                    "master), not --precision %s\n", ferry_plan_precision_name(in->precision));
    return 2;
  }
  return PLAN_GO;
}

/* The model of --params, or of --model (a preset, or a config.json). */
static int read_model(const plan_flags *fl, ferry_plan_model *m) {
  char why[512];
  if (!!fl->model == !!fl->params) {
    fprintf(stderr, "ferry plan: give one of --model PRESET|config.json or --params N "
                    "(ferry plan --help; ferry plan --list-models)\n");
    return 2;
  }
  if (fl->params) {
    uint64_t n;
    if (parse_count(fl->params, &n)) {
      fprintf(stderr, "ferry plan: --params '%s': expected a parameter count such as 13e9, "
                      "13B, 350M or 7000000000\n", fl->params);
      return 2;
    }
    if (ferry_plan_model_from_params(n, m, why, sizeof why)) {
      fprintf(stderr, "ferry plan: %s\n", why);
      return 2;
    }
    return 0;
  }
  const char *model = fl->model;
  size_t ml = strlen(model);
  int file = strchr(model, '/') || (ml > 5 && !strcmp(model + ml - 5, ".json"));
  if (!file && ferry_plan_model_preset(model, m, why, sizeof why)) {
    if (access(model, F_OK)) { /* a config.json in the current folder without ".json" */
      fprintf(stderr, "ferry plan: %s\n", why);
      return 2;
    }
    file = 1;
  }
  if (file && ferry_plan_model_from_file(model, m, why, sizeof why)) {
    fprintf(stderr, "ferry plan: %s\n", why);
    return 2;
  }
  return 0;
}

/* --gpu-budget / --host-budget (tier t, the value v, the machine flag `mem`
 * that may not come with it): the budget itself. 0 when set, 2 on an
 * error, -1 when the flag was not given. */
static int exact_budget(int t, const char *v, const char *mem, ferry_plan_input *in,
                        hw_notes *hw) {
  static const char *const flag[] = {"--gpu-budget", "--host-budget"};
  static const char *const mflag[] = {"--gpu-mem", "--host-mem"};
  char a[32];
  if (!v) return -1;
  if (mem) {
    fprintf(stderr, "ferry plan: give %s SIZE or %s SIZE, not both\n", mflag[t], flag[t]);
    return 2;
  }
  if (parse_size_flag(flag[t], v, &in->budget[t]) ||
      engine_refuses(flag[t], t == FERRY_PLAN_GPU ? "tiers.gpu.budget" : "tiers.host.budget", v))
    return 2;
  if (in->budget[t] == 0) {
    fprintf(stderr, "ferry plan: %s %s: a budget of 0 holds nothing\n", flag[t], v);
    return 2;
  }
  snprintf(hw->text[t], sizeof hw->text[t], "%s %s (tiers.%s.budget)%s", flag[t],
           gib((double)in->budget[t], a, sizeof a), ferry_plan_tier_name(t),
           t == FERRY_PLAN_GPU && in->device == FERRY_PLAN_DEV_HOST
               ? ", the host backend's emulated device" : "");
  return 0;
}

/* A node's budget of tier t split between its --gpus ranks (each rank is a
 * process with its own tiers), said in the budget's source. */
static void node_share(ferry_plan_input *in, int t, hw_notes *hw) {
  if (in->gpus <= 1) return;
  in->budget[t] /= (uint64_t)in->gpus;
  size_t n = strlen(hw->text[t]);
  snprintf(hw->text[t] + n, sizeof hw->text[t] - n, ", / %d ranks per node", in->gpus);
}

/* The GPU budget: --gpu-budget, 95% of --gpu-mem, or of GPU 0's free memory. */
static int gpu_budget(const plan_flags *fl, ferry_plan_input *in, hw_notes *hw) {
  char a[32];
  int rc = exact_budget(FERRY_PLAN_GPU, fl->gpu_budget, fl->gpu_mem, in, hw);
  if (rc >= 0) return rc;
  if (!fl->gpu_mem && in->device == FERRY_PLAN_DEV_HOST) {
    fprintf(stderr, "ferry plan: --device host: give the emulated device's budget, "
                    "--gpu-budget SIZE (or --gpu-mem SIZE)\n");
    return 2;
  }
  if (fl->gpu_mem) {
    uint64_t g;
    if (parse_size_flag("--gpu-mem", fl->gpu_mem, &g)) return 2;
    if (g == 0) {
      fprintf(stderr, "ferry plan: --gpu-mem %s: a GPU with no memory holds nothing; give the "
                      "device's memory, e.g. --gpu-mem 24G\n", fl->gpu_mem);
      return 2;
    }
    in->budget[FERRY_PLAN_GPU] = (uint64_t)((double)g * 0.95);
    snprintf(hw->text[0], sizeof hw->text[0],
             "95%% of --gpu-mem %s (5%% left for the CUDA context)", gib((double)g, a, sizeof a));
    return 0;
  }
  ferry_gpu_info gpus[FERRY_MAX_GPUS];
  int n = 0;
  char gwhy[256] = "";
  ferry_gpu_list(gpus, FERRY_MAX_GPUS, &n, gwhy, sizeof gwhy);
  if (n == 0) {
    fprintf(stderr,
            "ferry plan: no GPU on this machine (%s) and no --gpu-mem: give the memory of the "
            "GPU to plan for, e.g. --gpu-mem 24G\n", gwhy[0] ? gwhy : "none found");
    return 2;
  }
  in->budget[FERRY_PLAN_GPU] = (uint64_t)((double)gpus[0].free_memory * 0.95);
  snprintf(hw->gpu_name, sizeof hw->gpu_name, "%s", gpus[0].name);
  snprintf(hw->text[0], sizeof hw->text[0], "95%% of the %s free on GPU 0 (%s)",
           gib((double)gpus[0].free_memory, a, sizeof a), gpus[0].name);
  hw->pcie_gen = gpus[0].pcie_gen;
  hw->pcie_width = gpus[0].pcie_width;
  return 0;
}

/* The host budget: --host-budget, 80% of --host-mem, or of the RAM available here (host:
 * this machine's information, when have_host). */
static int host_budget(const plan_flags *fl, const ferry_host_info *host, int have_host,
                       ferry_plan_input *in, hw_notes *hw) {
  char a[32];
  int rc = exact_budget(FERRY_PLAN_HOST, fl->host_budget, fl->host_mem, in, hw);
  if (rc >= 0) return rc;
  if (fl->host_mem) {
    uint64_t h;
    if (parse_size_flag("--host-mem", fl->host_mem, &h)) return 2;
    if (h == 0) {
      fprintf(stderr, "ferry plan: --host-mem %s: the process itself needs host memory; give "
                      "the machine's RAM, e.g. --host-mem 128G\n", fl->host_mem);
      return 2;
    }
    in->budget[FERRY_PLAN_HOST] = (uint64_t)((double)h * 0.8);
    in->host_ram = h / (uint64_t)in->gpus;
    snprintf(hw->text[1], sizeof hw->text[1], "80%% of --host-mem %s (tiers.host.budget default)",
             gib((double)h, a, sizeof a));
    node_share(in, FERRY_PLAN_HOST, hw);
    return 0;
  }
  if (!have_host) {
    fprintf(stderr, "ferry plan: cannot read this machine's memory (%s): give --host-mem\n",
            ferry_last_error());
    return 2;
  }
  in->budget[FERRY_PLAN_HOST] = (uint64_t)((double)host->ram_available_bytes * 0.8);
  hw->host_here = 1;
  snprintf(hw->text[1], sizeof hw->text[1], "80%% of the %s of RAM available here",
           gib((double)host->ram_available_bytes, a, sizeof a));
  node_share(in, FERRY_PLAN_HOST, hw);
  return 0;
}

/* The NVMe budget: --nvme, the free space of --nvme-path, or none. */
static int nvme_budget(const plan_flags *fl, ferry_plan_input *in, hw_notes *hw) {
  char a[32];
  if (fl->nvme && fl->nvme_path) {
    fprintf(stderr, "ferry plan: give --nvme SIZE or --nvme-path DIR, not both\n");
    return 2;
  }
  if (fl->nvme) {
    if (parse_size_flag("--nvme", fl->nvme, &in->budget[FERRY_PLAN_NVME])) return 2;
    if (in->budget[FERRY_PLAN_NVME] == 0) {
      fprintf(stderr, "ferry plan: --nvme %s: zero bytes of NVMe; leave the flag out to plan "
                      "without NVMe\n", fl->nvme);
      return 2;
    }
    snprintf(hw->text[2], sizeof hw->text[2], "--nvme %s",
             gib((double)in->budget[2], a, sizeof a));
    node_share(in, FERRY_PLAN_NVME, hw);
  } else if (fl->nvme_path) {
    ferry_path_info pi;
    char pwhy[256] = "";
    if (ferry_path_probe(fl->nvme_path, &pi, pwhy, sizeof pwhy)) {
      fprintf(stderr, "ferry plan: --nvme-path %s: %s\n", fl->nvme_path, pwhy);
      return 2;
    }
    in->budget[FERRY_PLAN_NVME] = pi.free_bytes;
    snprintf(hw->text[2], sizeof hw->text[2], "free space of %s (%s%s)", fl->nvme_path,
             pi.fs_type, pi.o_direct ? ", O_DIRECT works" : ", no O_DIRECT: buffered I/O, slower");
    node_share(in, FERRY_PLAN_NVME, hw);
  } else {
    snprintf(hw->text[2], sizeof hw->text[2], "none given (--nvme SIZE or --nvme-path DIR)");
  }
  return 0;
}

/* Every budget, from the flags or this machine (what each came from in hw). */
static int machine_budgets(const plan_flags *fl, ferry_plan_input *in, hw_notes *hw) {
  memset(hw, 0, sizeof *hw);
  hw->memlock = UINT64_MAX;
  ferry_host_info host;
  int have_host = ferry_host_get_info(&host) == 0;
  if (have_host) hw->memlock = host.memlock_bytes;
  if (gpu_budget(fl, in, hw) || host_budget(fl, &host, have_host, in, hw) ||
      nvme_budget(fl, in, hw))
    return 2;
  if (!in->host_ram && have_host) in->host_ram = host.ram_bytes / (uint64_t)in->gpus;
  return 0;
}

/* Bandwidths: the PCIe link of the GPU when known, then the profile. */
static int bandwidths(const plan_flags *fl, const hw_notes *hw, ferry_plan_input *in) {
  if (hw->pcie_gen >= 1 && hw->pcie_width >= 1) {
    static const double lane[] = {0, 0.25, 0.5, 0.985, 1.969, 3.938, 7.877}; /* GB/s */
    int g = hw->pcie_gen > 6 ? 6 : hw->pcie_gen;
    in->bw.h2d_gbps = in->bw.d2h_gbps = 0.8 * lane[g] * hw->pcie_width;
  }
  char why[512];
  if (fl->profile && ferry_plan_profile_load(fl->profile, &in->bw, why, sizeof why)) {
    fprintf(stderr, "ferry plan: --profile: %s\n", why);
    return 2;
  }
  return 0;
}

/* --largest as text: the model found, its placement and step, and why the
 * next size up does not fit. */
static void largest_text(const ferry_plan_largest_result *L, const hw_notes *hw) {
  const ferry_plan_model *m = &L->in.model;
  const ferry_plan_result *r = &L->fit;
  const ferry_plan_candidate *c = &r->cand[r->recommended];
  char a[32], b[32];
  print_ranks(&L->in, r);
  for (int t = 0; t < FERRY_PLAN_TIERS; t++)
    printf("%s %-4s %10s  %s\n", t ? "          " : "budgets   ", ferry_plan_tier_name(t),
           gib((double)L->in.budget[t], a, sizeof a), hw->text[t]);
  printf("largest    %s parameters fit (dense Llama shape: %lld layers, hidden %lld, ffn %lld, "
         "%lld heads, vocab %lld; search resolution 1%%, %d plans)\n",
         commas(L->params, a, sizeof a), (long long)m->layers, (long long)m->hidden,
         (long long)m->ffn, (long long)m->heads, (long long)m->vocab, L->evaluations);
  printf("           batch %lld x seq %lld, %s params\n", (long long)L->in.batch,
         (long long)L->in.seq, ferry_plan_precision_name(L->in.precision));
  printf("placement  %s, step ~ %.3f s (bottleneck %s)\n",
         ferry_plan_placement_name(r->recommended), c->step_seconds,
         ferry_plan_component_name(c->bottleneck));
  printf("  tiers:");
  for (int t = 0; t < FERRY_PLAN_TIERS; t++)
    printf("%s %s %s of %s", t ? "," : "", ferry_plan_tier_name(t),
           gib((double)c->tier_bytes[t], a, sizeof a), gib((double)L->in.budget[t], b, sizeof b));
  printf("\n");
  print_footprint(&L->in, r->recommended, c, r->bytes_estimated);
  const ferry_plan_candidate *n = &L->above.cand[L->above.closest];
  printf("next       %s parameters do not fit: closest %s, %s\n", commas(L->next, a, sizeof a),
         ferry_plan_placement_name(L->above.closest), n->why);
}

static void largest_json(const ferry_plan_largest_result *L) {
  const ferry_plan_model *m = &L->in.model;
  const ferry_plan_result *r = &L->fit;
  json_out j;
  json_begin(&j, stdout);
  json_bool(&j, "fits", L->params > 0);
  json_int(&j, "ranks", L->in.gpus * L->in.nodes);
  json_int(&j, "zero_stage", L->in.zero_stage);
  json_open(&j, "largest", '{');
  json_uint(&j, "params", L->params);
  if (L->params) {
    const ferry_plan_candidate *c = &r->cand[r->recommended];
    json_int(&j, "layers", m->layers);
    json_int(&j, "hidden", m->hidden);
    json_int(&j, "ffn", m->ffn);
    json_int(&j, "heads", m->heads);
    json_int(&j, "vocab", m->vocab);
    json_str(&j, "placement", ferry_plan_placement_name(r->recommended));
    json_placement_keys(&j, r->recommended, c->grads);
    json_num(&j, "step_seconds", c->step_seconds);
    json_str(&j, "bottleneck", ferry_plan_component_name(c->bottleneck));
    json_open(&j, "tiers", '{');
    for (int t = 0; t < FERRY_PLAN_TIERS; t++) {
      json_open(&j, ferry_plan_tier_name(t), '{');
      json_uint(&j, "bytes", c->tier_bytes[t]);
      json_uint(&j, "budget", L->in.budget[t]);
      json_close(&j, '}');
    }
    json_close(&j, '}');
    json_footprint(&j, c);
    json_uint(&j, "next_params", L->next);
    json_str(&j, "next_why", L->above.cand[L->above.closest].why);
  }
  json_num(&j, "resolution", 0.01);
  json_int(&j, "evaluations", L->evaluations);
  json_close(&j, '}');
  json_end(&j);
}

/* --largest: the search over dense models on the machine the flags give. */
static int plan_largest(const plan_flags *fl, ferry_plan_input *in, hw_notes *hw) {
  if (fl->model || fl->params) {
    fprintf(stderr, "ferry plan: --largest searches the model size: leave out --model and "
                    "--params\n");
    return 2;
  }
  if (machine_budgets(fl, in, hw) || bandwidths(fl, hw, in)) return 2;
  static ferry_plan_largest_result L;
  char why[512];
  if (ferry_plan_largest(in, 0.01, &L, why, sizeof why)) {
    fprintf(stderr, "ferry plan: --largest: %s\n", why);
    return 2;
  }
  if (fl->json) largest_json(&L);
  else if (L.params) largest_text(&L, hw);
  else printf("largest    none: not even a dense model of 1,000 parameters fits these budgets\n");
  if (!L.params) return 1;
  if (fl->cfg_out && write_config(fl->cfg_out, &L.in, &L.fit, fl->nvme_path, plan_dist(fl, in)))
    return 1;
  return 0;
}

int cli_plan(int argc, char **argv) {
  plan_flags fl;
  memset(&fl, 0, sizeof fl);
  ferry_plan_input in = ferry_plan_input_default();
  hw_notes hw;
  int rc = parse_flags(argc, argv, &fl, &in);
  if (rc != PLAN_GO) return rc;
  if (fl.largest) return plan_largest(&fl, &in, &hw);
  if (read_model(&fl, &in.model) || machine_budgets(&fl, &in, &hw) || bandwidths(&fl, &hw, &in))
    return 2;
  ferry_plan_result r;
  char why[512];
  if (ferry_plan_compute(&in, &r, why, sizeof why)) {
    fprintf(stderr, "ferry plan: %s\n", why);
    return 2;
  }
  if (fl.json) print_json(&in, &r, &hw);
  else print_text(&in, &r, &hw);
  rc = r.recommended >= 0 ? 0 : 1;
  if (fl.cfg_out) {
    if (write_config(fl.cfg_out, &in, &r, fl.nvme_path, plan_dist(&fl, &in))) rc = rc ? rc : 1;
    else if (!fl.json) printf("engine config for %s written to %s\n",
                              ferry_plan_placement_name(r.recommended), fl.cfg_out);
  }
  if (fl.svg) {
    if (write_svg(fl.svg, &in, &r)) rc = rc ? rc : 1;
    else if (!fl.json) printf("tiers drawn in %s\n", fl.svg);
  }
  return rc;
}
