/* tests/cli/test_plan_engine.c — the planner's per-tier bytes against what
 * the engine reports in ferry_stats and in its finalize refusal (within
 * 2%, every placement of a scaled-down model on the host backend; the
 * staging equal), through the public API only.
 *
 * The model is a Llama-family config.json scaled down (8 blocks, hidden
 * 256, vocab 4096: 8.4 M params) read by the planner's own reader. The test
 * registers exactly the tensors the planner counts, group by group
 * (embedding, each block, head), in the engine configured the way
 * `ferry plan --write-config` writes it, runs three steps of the training
 * loop (fetch / release forward, fetch / grads_ready / release backward,
 * ferry_step) and compares ferry_stats' tier peaks with the plan.
 *
 * What is compared (docs/PLANNING.md, "What is validated"), through the
 * public API only (ferry.h: ferry_stats, the finalize refusal's text):
 * ferry_stats counts the memory manager's chunks (params, grads, fp32
 * master + states). The plan's activations and workspace are the training
 * framework's (this loop has none), and the engine's own buffers (the two
 * device grad slots, the pinned staging) are allocated outside the manager:
 * the manager's budget of a tier is the configured one less them, which
 * ferry_stats.budget shows. So the predicted manager bytes of tier t are
 * the plan's params + grads + master + optimizer rows, less the device grad
 * slots (the plan's device grad buffers), and the engine's host staging
 * (tiers.host.budget less ferry_stats.budget[host]) is the plan's buffers
 * row: both come from plan/footprint.c, so they must be equal. So do the
 * NVMe swap files (plan: nvme_file_bytes; engine: ferry_stats.
 * nvme_file_bytes, the store's files), within TOL.
 *
 * The host need: each placement is finalized once more with a 64 KiB host
 * budget, and the refusal names the engine's need (its staging, one step's
 * working set, the host homes) and the least budget; the plan's host tier
 * must be within 2% of that least budget (the plan reserves homes in whole
 * chunks, the engine's are trimmed) and never below it.
 *
 * Budgets: a tier where a family is cached (params streamed to the device,
 * NVMe optimizer state worked on in the host tier) fills to its budget, so
 * there the budget is the plan's own figure (for the host: homes + the
 * NVMe working set + staging, the plan's whole host tier) and the check is
 * that the engine starts and runs in it; a tier that only holds homes gets
 * twice the plan, and its peak must be the plan's figure. The NVMe bytes
 * per step of each family (the bytes between two forward passes) are
 * printed beside the plan's prediction.
 *
 * Gradients are resolved as placement.grads = "auto" does (no clipping,
 * bf16, one micro-batch: "none" off the GPU).
 *
 * Each optimizer layout named after the scratch folder is run (default all):
 * fp32 (states and master), bf16 (states), int8 (states, blocks of 256),
 * int8-m16 (int8 states, the bf16 params as the master): the planner's
 * optimizer and master rows follow ferry_optimizer_state_bytes, and the
 * engine is configured with optimizer.state_dtype / precision.master.
 *
 * `1.1b` is a 1.1B-parameter Llama (TinyLlama's shape, 64 MiB chunks) where
 * the plan's param reads once disagreed with the engine's by 14-57%: too
 * large to train here, it is finalized only, with the 64 KiB host budget,
 * for each NVMe placement, and the plan's staging, working set terms and
 * host tier are held against the refusal's.
 *
 * usage: test_plan_engine SCRATCH_DIR [LAYOUT...]
 */
#include "ferry.h"
#include "plan/plan.h"
#include "tests/test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *model_json =
    "{\"model_type\": \"llama\", \"hidden_size\": 256, \"intermediate_size\": 688,"
    " \"num_hidden_layers\": 8, \"num_attention_heads\": 4, \"num_key_value_heads\": 4,"
    " \"vocab_size\": 4096, \"tie_word_embeddings\": false}";

#define CHUNK (256u << 10)
#define TOL 0.02 /* the largest difference measured: 1.3% */

/* The planner's tensors of the Llama family (no biases), group by group. */
typedef struct {
  char name[96];
  int64_t shape[2];
  int ndim, group;
} tensor;

static size_t model_tensors(const ferry_plan_model *m, tensor *t) {
  size_t n = 0;
  int64_t h = m->hidden, f = m->ffn, q = m->heads * m->head_dim, kv = m->kv_heads * m->head_dim;
#define T2(nm, g, a, b) (snprintf(t[n].name, sizeof t[n].name, "%s", nm), t[n].shape[0] = (a), \
                         t[n].shape[1] = (b), t[n].ndim = 2, t[n].group = (g), n++)
#define T1(nm, g, a) (snprintf(t[n].name, sizeof t[n].name, "%s", nm), t[n].shape[0] = (a), \
                      t[n].ndim = 1, t[n].group = (g), n++)
  T2("embed_tokens.weight", 0, m->vocab, h);
  for (int64_t l = 0; l < m->layers; l++) {
    int g = (int)l + 1;
    char b[64];
    static const char *const nm[] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                     "gate_proj", "up_proj", "down_proj"};
    const int64_t rows[] = {q, kv, kv, h, f, f, h}, cols[] = {h, h, h, q, h, h, f};
    for (int k = 0; k < 7; k++) {
      snprintf(b, sizeof b, "layers.%lld.%s", (long long)l, nm[k]);
      T2(b, g, rows[k], cols[k]);
    }
    snprintf(b, sizeof b, "layers.%lld.input_layernorm", (long long)l);
    T1(b, g, h);
    snprintf(b, sizeof b, "layers.%lld.post_attention_layernorm", (long long)l);
    T1(b, g, h);
  }
  int g = (int)m->layers + 1;
  T1("norm.weight", g, h);
  if (!m->tied) T2("lm_head.weight", g, m->vocab, h);
#undef T1
#undef T2
  return n;
}

static int set(ferry_config *c, const char *k, const char *v) {
  int rc = ferry_config_set(c, k, v);
  if (rc) fprintf(stderr, "config %s = %s: %s\n", k, v, ferry_config_last_error(c));
  return rc;
}

static int setu(ferry_config *c, const char *k, uint64_t v) {
  char b[32];
  snprintf(b, sizeof b, "%llu", (unsigned long long)v);
  return set(c, k, b);
}

typedef struct {
  uint64_t manager[FERRY_PLAN_TIERS]; /* ferry_stats tier peaks */
  uint64_t nvme_rd[FERRY_FAMILIES], nvme_wr[FERRY_FAMILIES]; /* the last step's NVMe bytes */
  uint64_t host_optim;                /* ferry_stats peak of the optimizer family on the host */
  uint64_t host_homes;                /* ... and of params + grads there */
  uint64_t host_params;               /* ... and of params alone */
  uint64_t own_dev, own_host;         /* the engine's buffers outside the manager: the
                                         configured budgets less the manager's */
  uint64_t nvme_file;                 /* the swap files (ferry_stats.nvme_file_bytes) */
} measured;

/* Runs `steps` steps of the loop with no kernels: the bytes the engine holds
 * do not depend on the values. */
static int run_engine(ferry_config *c, const tensor *t, size_t nt, int groups, int steps,
                      uint64_t gpu_budget, uint64_t host_budget, measured *out) {
  ferry_engine *e = NULL;
  int rc = ferry_engine_create(c, NULL, &e);
  if (rc) {
    fprintf(stderr, "engine create: %s\n", ferry_last_error());
    return rc;
  }
  for (size_t i = 0; i < nt && !rc; i++)
    rc = ferry_param_register(e, t[i].name, t[i].shape, t[i].ndim, t[i].group, NULL, NULL, NULL);
  if (!rc) rc = ferry_engine_finalize(e);
  ferry_stream *s = NULL;
  if (!rc) rc = ferry_stream_create(ferry_engine_device(e), &s);
  /* the first tensor of each group: ferry_param_device hands out its grad slot */
  const char **first = calloc((size_t)groups, sizeof *first);
  if (!first) rc = FERRY_ENOMEM;
  for (size_t i = nt; i-- > 0 && !rc;) first[t[i].group] = t[i].name;
  ferry_stats st0;
  memset(&st0, 0, sizeof st0);
  for (int k = 0; k <= steps && !rc; k++) {
    /* forward; after the last step one more, whose fetches wait for the
     * step's update of each group: the last step's NVMe bytes are those
     * between the last two forward passes (backward, step, forward) */
    for (int g = 0; g < groups && !rc; g++) {
      rc = ferry_fetch(e, g, s);
      if (!rc) rc = ferry_release(e, g, s);
    }
    if (k == steps - 1 && !rc) rc = ferry_engine_get_stats(e, &st0);
    if (k == steps) break;
    for (int g = groups - 1; g >= 0 && !rc; g--) {
      void *w, *gw;
      rc = ferry_fetch(e, g, s);
      if (!rc) rc = ferry_param_device(e, first[g], &w, &gw);
      if (!rc) rc = ferry_grads_ready(e, g, s);
      if (!rc) rc = ferry_release(e, g, s);
    }
    if (!rc) rc = ferry_step(e, NULL);
  }
  if (!rc) rc = ferry_stream_synchronize(s);
  if (rc) fprintf(stderr, "engine: %s\n", ferry_engine_last_error(e));
  ferry_stats st;
  if (!rc) rc = ferry_engine_get_stats(e, &st);
  if (!rc) {
    for (int i = 0; i < FERRY_PLAN_TIERS; i++) out->manager[i] = st.tier_peak[i];
    out->host_optim = st.peak[FERRY_TIER_HOST][FERRY_FAMILY_OPTIM];
    for (int f = 0; f < FERRY_FAMILIES; f++) {
      out->nvme_rd[f] = st.nvme_read_bytes[f] - st0.nvme_read_bytes[f];
      out->nvme_wr[f] = st.nvme_write_bytes[f] - st0.nvme_write_bytes[f];
    }
    out->host_params = st.peak[FERRY_TIER_HOST][FERRY_FAMILY_PARAMS];
    out->nvme_file = st.nvme_file_bytes;
    out->host_homes = st.peak[FERRY_TIER_HOST][FERRY_FAMILY_PARAMS] +
                      st.peak[FERRY_TIER_HOST][FERRY_FAMILY_GRADS];
    /* grad buffers; grad and upload staging, and for host/NVMe param homes
     * one more staging of the largest group: what the manager was not given */
    out->own_dev = gpu_budget - st.budget[FERRY_TIER_DEVICE];
    out->own_host = host_budget - st.budget[FERRY_TIER_HOST];
  }
  free(first);
  if (s) ferry_stream_destroy(s);
  ferry_engine_destroy(e);
  return rc;
}

/* The engine's host need as finalize names it when tiers.host.budget is 64
 * KiB (below its staging: an empty pool, and the refusal names every
 * term), in MiB: its staging, one step's need in the pool and its terms,
 * and the least budget. */
typedef struct {
  double staging, need, optim, grads, params, slack, homes, least;
} engine_need;

static int refusal(ferry_config *c, const tensor *t, size_t nt, engine_need *out) {
  memset(out, 0, sizeof *out);
  ferry_engine *e = NULL;
  int rc = set(c, "tiers.host.budget", "64K");
  if (!rc) rc = ferry_engine_create(c, NULL, &e);
  for (size_t i = 0; i < nt && !rc; i++)
    rc = ferry_param_register(e, t[i].name, t[i].shape, t[i].ndim, t[i].group, NULL, NULL, NULL);
  if (!rc) rc = ferry_engine_finalize(e);
  if (rc == FERRY_ENOMEM) {
    const char *m = ferry_engine_last_error(e);
    const char *a = strstr(m, "the engine's staging takes "), *b = strstr(m, "one step needs ");
    const char *l = strstr(m, "to at least ");
    if (a && b && l && sscanf(a, "the engine's staging takes %lf", &out->staging) == 1 &&
        sscanf(b,
               "one step needs %lf MiB there (optimizer state of the largest group %lf + 2 x "
               "its grads %lf + 2 x its params %lf + 2 x the largest chunk %lf + host homes %lf",
               &out->need, &out->optim, &out->grads, &out->params, &out->slack,
               &out->homes) == 6 &&
        sscanf(l, "to at least %lf", &out->least) == 1)
      rc = 0;
    else fprintf(stderr, "refusal not understood: %s\n", m);
  } else {
    fprintf(stderr, "finalize at a 64 KiB host budget: %d (%s), want a refusal\n", rc,
            e ? ferry_engine_last_error(e) : ferry_last_error());
    rc = rc ? rc : FERRY_EINVAL;
  }
  ferry_engine_destroy(e);
  return rc;
}

#define MIB (1024.0 * 1024.0)

/* The plan's host tier against the engine's refusal of placement p: the
 * staging equal (both are plan/footprint.c's, to the message's 0.1 MiB),
 * the least budget within TOL and not above the plan's tier. */
static void check_need(const ferry_plan_candidate *c, const engine_need *n) {
  const char *pn = ferry_plan_placement_name(c->placement);
  double staging = (double)c->bytes[FERRY_PLAN_HOST][FERRY_FAM_BUFFERS] / MIB;
  double tier = (double)c->tier_bytes[FERRY_PLAN_HOST] / MIB;
  printf("%-15s host need: staging plan %.1f engine %.1f MiB; host tier plan %.1f, engine's "
         "least budget %.1f MiB (%.2f%%)\n",
         pn, staging, n->staging, tier, n->least, 100 * (tier - n->least) / n->least);
  if (fabs(staging - n->staging) > 0.051) {
    fprintf(stderr, "FAILED: %s: staging plan %.2f vs engine %.1f MiB\n", pn, staging, n->staging);
    test_failures++;
  }
  if (tier < n->least - 0.1 || (tier - n->least) / n->least > TOL) {
    fprintf(stderr, "FAILED: %s: the plan's host tier %.1f MiB vs the engine's least %.1f MiB\n",
            pn, tier, n->least);
    test_failures++;
  }
}

static double rel(double got, double want) {
  return want > 0 ? fabs(got - want) / want : (got > 0 ? INFINITY : 0);
}

/* The plan's host rows against the refusal's terms: the NVMe working set
 * (the swap row) and the host homes, each within TOL. */
static void plan_terms(const ferry_plan_candidate *c, const engine_need *n) {
  const char *pn = ferry_plan_placement_name(c->placement);
  const uint64_t *h = c->bytes[FERRY_PLAN_HOST];
  double swap = (double)h[FERRY_FAM_SWAP] / MIB;
  double homes = (double)(h[FERRY_FAM_PARAMS] + h[FERRY_FAM_GRADS] + h[FERRY_FAM_MASTER] +
                          h[FERRY_FAM_OPTIM]) / MIB;
  double eswap = n->optim + n->grads + n->params + n->slack;
  printf("%-15s working set plan %.1f engine %.1f MiB (optimizer %.1f + grads %.1f + params "
         "%.1f + slack %.1f); host homes plan %.1f engine %.1f MiB\n",
         pn, swap, eswap, n->optim, n->grads, n->params, n->slack, homes, n->homes);
  if (rel(swap, eswap) > TOL || rel(homes, n->homes) > TOL) {
    fprintf(stderr, "FAILED: %s: the plan's working set or host homes beyond %.0f%%\n", pn,
            100 * TOL);
    test_failures++;
  }
}

/* The plan's NVMe bytes of the last step beside the engine's, per family
 * (printed; docs/PLANNING.md, "NVMe bytes per step"). */
static void print_nvme(const ferry_plan_candidate *c, const measured *got) {
  static const char *const fam[] = {"params", "grads", "optimizer"};
  for (int f = 0; f < FERRY_PLAN_NV_FAMILIES; f++) {
    if (c->nvme_read[f] <= 0 && c->nvme_write[f] <= 0 && !got->nvme_rd[f] && !got->nvme_wr[f])
      continue;
    printf("%-15s nvme  %-9s read plan %12.0f engine %12llu, write plan %12.0f engine %12llu\n",
           ferry_plan_placement_name(c->placement), fam[f], c->nvme_read[f],
           (unsigned long long)got->nvme_rd[f], c->nvme_write[f],
           (unsigned long long)got->nvme_wr[f]);
  }
}

/* An optimizer layout: its name, the plan's state and master dtypes, and
 * the config values (NULL: the key is left at its default). */
typedef struct {
  const char *name;
  int state_dtype, master_dtype;
  const char *state_key, *master_key;
} layout;

static const layout layouts[] = {
    {"fp32", FERRY_DT_F32, FERRY_DT_F32, NULL, NULL},
    {"bf16", FERRY_DT_BF16, FERRY_DT_F32, "bf16", NULL},
    {"int8", FERRY_DT_I8, FERRY_DT_F32, "int8", NULL},
    {"int8-m16", FERRY_DT_I8, FERRY_DT_BF16, "int8", "bf16"},
};

static void run_layout(const char *scratch, const layout *ly);
static void run_big(const char *scratch);

int main(int argc, char **argv) {
  REQUIRE(argc >= 2);
  int n = 0;
  for (int i = 2; i < argc; i++) {
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++)
      if (!strcmp(argv[i], layouts[k].name)) run_layout(argv[1], &layouts[k]), n++;
    if (!strcmp(argv[i], "1.1b")) run_big(argv[1]), n++;
  }
  REQUIRE(n == argc - 2); /* every name known */
  if (argc == 2) {
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++)
      run_layout(argv[1], &layouts[k]);
    run_big(argv[1]);
  }
  return test_failures ? 1 : 0;
}

/* The plan of a config.json on the host backend, budgets unbounded (rows
 * do not depend on them); the scratch folder and its nvme/ made. */
static ferry_plan_input host_input(const char *json, const char *name, const char *scratch,
                                   char *nvme_dir, size_t cap) {
  mkdir(scratch, 0700);
  snprintf(nvme_dir, cap, "%s/nvme", scratch);
  mkdir(nvme_dir, 0700);
  ferry_plan_input in = ferry_plan_input_default();
  char why[256];
  REQUIRE(ferry_plan_model_from_json(json, strlen(json), name, &in.model, why, sizeof why) == 0);
  in.device = FERRY_PLAN_DEV_HOST; /* the engine below runs on the host backend */
  in.budget[FERRY_PLAN_GPU] = in.budget[FERRY_PLAN_HOST] = in.budget[FERRY_PLAN_NVME] = 1ull << 50;
  return in;
}

/* The engine's config of candidate c as `ferry plan --write-config` writes
 * it (tiers of the placement, grads as "auto" resolved them, bf16, no
 * clipping), pageable host memory, NVMe in nvme_dir; budgets are the
 * caller's. *pp, *po: the params' and optimizer's tiers. */
static ferry_config *placement_config(const ferry_plan_candidate *c, const char *nvme_dir,
                                      const char **pp, const char **po) {
  const char *pg;
  ferry_plan_placement_tiers(c->placement, pp, &pg, po);
  pg = ferry_plan_grads_name(c->grads);
  ferry_config *cfg = NULL;
  REQUIRE(ferry_config_create(&cfg) == 0);
  int rc = set(cfg, "device", "host");
  rc |= set(cfg, "placement.params", *pp);
  rc |= set(cfg, "placement.grads", pg);
  rc |= set(cfg, "placement.optimizer", *po);
  rc |= set(cfg, "optimizer.type", "adamw");
  rc |= set(cfg, "precision.params", "bf16");
  rc |= set(cfg, "tiers.host.pinned", "false");
  rc |= set(cfg, "clip_grad_norm", "0");
  if (!strcmp(*po, "nvme") || !strcmp(*pp, "nvme")) {
    rc |= set(cfg, "tiers.nvme.paths", nvme_dir);
    rc |= set(cfg, "tiers.nvme.verify", "none");
  }
  REQUIRE(rc == 0);
  return cfg;
}

static void run_layout(const char *scratch, const layout *ly) {
  printf("== optimizer layout %s\n", ly->name);
  char nvme_dir[1024], why[256];
  ferry_plan_input in = host_input(model_json, "tiny-llama", scratch, nvme_dir, sizeof nvme_dir);
  in.chunk_size = CHUNK;
  in.batch = 1;
  in.seq = 128;
  in.state_dtype = ly->state_dtype;
  in.master_dtype = ly->master_dtype;
  ferry_plan_result r;
  REQUIRE(ferry_plan_compute(&in, &r, why, sizeof why) == 0);

  static tensor t[256];
  size_t nt = model_tensors(&in.model, t);
  uint64_t sum = 0;
  for (size_t i = 0; i < nt; i++) sum += (uint64_t)(t[i].shape[0] * (t[i].ndim == 2 ? t[i].shape[1] : 1));
  EXPECT_EQ_INT(sum, r.params); /* the engine holds what the planner counts */
  int groups = (int)ferry_plan_groups(&in.model);
  double G = (double)r.largest_group, pb = 2;

  static const int places[] = {FERRY_PLACE_ALL_GPU, FERRY_PLACE_ZERO_OFFLOAD,
                               FERRY_PLACE_ZERO3_OFFLOAD, FERRY_PLACE_NVME_OPT,
                               FERRY_PLACE_INFINITY};
  printf("%-15s %-5s %12s %12s %7s   (manager bytes: plan vs ferry_stats peak)\n", "placement",
         "tier", "plan", "engine", "diff");
  for (size_t pi = 0; pi < sizeof places / sizeof places[0]; pi++) {
    int p = places[pi];
    const ferry_plan_candidate *c = &r.cand[p];
    double want[FERRY_PLAN_TIERS];
    for (int tr = 0; tr < FERRY_PLAN_TIERS; tr++)
      want[tr] = (double)(c->bytes[tr][FERRY_FAM_PARAMS] + c->bytes[tr][FERRY_FAM_GRADS] +
                          c->bytes[tr][FERRY_FAM_MASTER] + c->bytes[tr][FERRY_FAM_OPTIM]);
    /* the plan's device grad buffers (whole pages): the engine's own */
    double slots = 2 * ceil(G * pb / 4096) * 4096;
    want[FERRY_PLAN_GPU] -= slots;
    /* NVMe homes: the host tier caches their chunks; the plan's working set
     * is its swap row, the engine's staging its buffers row */
    int nvme_opt = p == FERRY_PLACE_NVME_OPT || p == FERRY_PLACE_INFINITY;
    double swap = (double)c->bytes[FERRY_PLAN_HOST][FERRY_FAM_SWAP];
    double buffers_row = (double)c->bytes[FERRY_PLAN_HOST][FERRY_FAM_BUFFERS];
    const char *pp, *po;
    ferry_config *cfg = placement_config(c, nvme_dir, &pp, &po);
    int dev_cached = strcmp(pp, "gpu") != 0;
    int host_cached = nvme_opt;
    int rc = setu(cfg, "chunk_size", CHUNK);
    if (ly->state_key) rc |= set(cfg, "optimizer.state_dtype", ly->state_key);
    if (ly->master_key) rc |= set(cfg, "precision.master", ly->master_key);
    /* budgets: the plan's figure where a family is cached, twice it where
     * the tier only holds homes; each plus the engine's own buffers of it */
    uint64_t gpu_budget = (uint64_t)(want[FERRY_PLAN_GPU] * (dev_cached ? 1 : 2) + slots);
    /* host cached: the plan's tier plus its largest chunk (the embedding's
     * fp32 state, vocab x hidden x 4 = 4 MiB). At the minimum itself
     * first fit can leave the free room in holes no chunk fits while the
     * loop waits on the step (a known engine defect, issue 22's note: 1 in
     * ~5 runs, timing-dependent); the check here is the plan's bytes */
    uint64_t host_budget =
        host_cached ? c->tier_bytes[FERRY_PLAN_HOST] + (uint64_t)4096 * 256 * 4
                    : (uint64_t)(want[FERRY_PLAN_HOST] * 2 + buffers_row + (1 << 20));
    rc |= setu(cfg, "tiers.gpu.budget", gpu_budget);
    rc |= setu(cfg, "tiers.host.budget", host_budget);
    REQUIRE(rc == 0);
    measured got;
    memset(&got, 0, sizeof got);
    rc = run_engine(cfg, t, nt, groups, 3, gpu_budget, host_budget, &got);
    engine_need need;
    if (!rc) rc = refusal(cfg, t, nt, &need);
    ferry_config_destroy(cfg);
    EXPECT_EQ_INT(rc, 0);
    if (rc) continue;
    check_need(c, &need);
    if (nvme_opt) { /* the host homes: the tier less its cached NVMe chunks */
      printf("%-15s %-5s %12.0f %12llu   (NVMe working set: the plan's swap row vs the "
             "engine's optimizer peak in the host; ran in the plan's host tier + 4 MiB: %llu)\n",
             ferry_plan_placement_name(p), "host", swap, (unsigned long long)got.host_optim,
             (unsigned long long)host_budget);
      /* the swap files: the plan's (plan/footprint.c) and the store's */
      double df = rel((double)got.nvme_file, (double)c->nvme_file_bytes);
      printf("%-15s %-5s %12llu %12llu %6.2f%%  (NVMe swap files)\n",
             ferry_plan_placement_name(p), "nvme", (unsigned long long)c->nvme_file_bytes,
             (unsigned long long)got.nvme_file, 100 * df);
      if (df > TOL || !got.nvme_file) {
        fprintf(stderr, "FAILED: %s swap files: engine %llu vs plan %llu\n",
                ferry_plan_placement_name(p), (unsigned long long)got.nvme_file,
                (unsigned long long)c->nvme_file_bytes);
        test_failures++;
      }
      /* homes only: NVMe-homed params pass through the host pool too */
      got.manager[FERRY_PLAN_HOST] =
          got.host_homes - (strcmp(pp, "nvme") ? 0 : got.host_params);
    }
    { /* the NVMe prediction at the budgets the engine ran with */
      ferry_plan_input at = in;
      ferry_plan_result ra;
      at.budget[FERRY_PLAN_GPU] = gpu_budget;
      at.budget[FERRY_PLAN_HOST] = host_budget;
      if (ferry_plan_compute(&at, &ra, why, sizeof why) == 0) print_nvme(&ra.cand[p], &got);
    }
    for (int tr = 0; tr < FERRY_PLAN_TIERS; tr++) {
      double d = rel((double)got.manager[tr], want[tr]);
      printf("%-15s %-5s %12.0f %12llu %6.2f%%%s\n", ferry_plan_placement_name(p),
             ferry_plan_tier_name(tr), want[tr], (unsigned long long)got.manager[tr], 100 * d,
             tr == FERRY_PLAN_GPU && dev_cached    ? "  (cached: budget = plan)"
             : tr == FERRY_PLAN_HOST && host_cached ? "  (params + grads homes)"
                                                    : "");
      if (d > TOL) {
        fprintf(stderr, "FAILED: %s %s: engine %llu vs plan %.0f (%.2f%% > %.0f%%)\n",
                ferry_plan_placement_name(p), ferry_plan_tier_name(tr),
                (unsigned long long)got.manager[tr], want[tr], 100 * d, 100 * TOL);
        test_failures++;
      }
    }
    printf("%-15s %-5s %12.0f %12llu   (engine buffers: device grad slots)\n",
           ferry_plan_placement_name(p), "gpu", slots, (unsigned long long)got.own_dev);
    printf("%-15s %-5s %12.0f %12llu   (engine buffers: host staging vs the buffers row)\n",
           ferry_plan_placement_name(p), "host", buffers_row, (unsigned long long)got.own_host);
    if (got.own_host != (uint64_t)buffers_row) { /* both plan/footprint.c's */
      fprintf(stderr, "FAILED: %s: engine host staging %llu vs the plan's buffers row %.0f\n",
              ferry_plan_placement_name(p), (unsigned long long)got.own_host, buffers_row);
      test_failures++;
    }
  }
}

/* A 1.1B-parameter Llama (TinyLlama's shape) at 64 MiB chunks, finalized
 * only: each placement's refusal of a 64 KiB host budget against the plan
 * (the staging equal, the working set's terms and the host tier within
 * TOL). The device budget is 1 GiB: finalize refuses before it checks it. */
static void run_big(const char *scratch) {
  static const char *const big_json =
      "{\"model_type\": \"llama\", \"hidden_size\": 2048, \"intermediate_size\": 5632,"
      " \"num_hidden_layers\": 22, \"num_attention_heads\": 32, \"num_key_value_heads\": 4,"
      " \"vocab_size\": 32000, \"tie_word_embeddings\": false}";
  printf("== 1.1B (finalize only)\n");
  char nvme_dir[1024], why[256];
  ferry_plan_input in = host_input(big_json, "llama-1.1b", scratch, nvme_dir, sizeof nvme_dir);
  ferry_plan_result r;
  REQUIRE(ferry_plan_compute(&in, &r, why, sizeof why) == 0);
  printf("%llu params, largest group %llu\n", (unsigned long long)r.params,
         (unsigned long long)r.largest_group);
  static tensor t[512];
  size_t nt = model_tensors(&in.model, t);
  for (int p = 0; p < FERRY_PLACEMENTS; p++) {
    const ferry_plan_candidate *c = &r.cand[p];
    const char *pp, *po;
    ferry_config *cfg = placement_config(c, nvme_dir, &pp, &po);
    REQUIRE(set(cfg, "tiers.gpu.budget", "1G") == 0);
    engine_need n;
    int rc = refusal(cfg, t, nt, &n);
    ferry_config_destroy(cfg);
    EXPECT_EQ_INT(rc, 0);
    if (rc) continue;
    check_need(c, &n);
    /* the working set's terms, each as the plan counts it */
    plan_terms(c, &n);
  }
}
