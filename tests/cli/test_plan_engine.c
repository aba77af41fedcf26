/* tests/cli/test_plan_engine.c — the planner's per-tier bytes against what
 * the engine reports in ferry_stats (issue 8: within 5%, at least three
 * placements of a scaled-down model on the host backend).
 *
 * The model is a Llama-family config.json scaled down (8 blocks, hidden
 * 256, vocab 4096: 8.4 M params) read by the planner's own reader. The test
 * registers exactly the tensors the planner counts, group by group
 * (embedding, each block, head), in the engine configured the way
 * `ferry plan --write-config` writes it, runs three steps of the training
 * loop (fetch / release forward, fetch / grads_ready / release backward,
 * ferry_step) and compares ferry_stats' tier peaks with the plan.
 *
 * What is compared (docs/PLANNING.md, "What is validated"): ferry_stats
 * counts the memory manager's chunks (params, grads, fp32 master + states).
 * The plan's activations and workspace are the training framework's (this
 * loop has none), and the engine's own buffers (the two device grad slots,
 * the pinned staging) are allocated outside the manager. So the predicted
 * manager bytes of tier t are the plan's params + grads + master + optimizer
 * rows, less the device grad slots (2·G·p, the plan's device grad buffers).
 * The engine's staging (engine_own_bytes) is checked against the plan's
 * buffers row (drain 2·G·p; uploads 2·G·p for device params on the CPU
 * path; commit G·p for params off the device).
 *
 * Budgets: a tier where a family is cached (params streamed to the device,
 * NVMe optimizer state worked on in the host tier) fills to its budget, so
 * there the budget is the plan's own figure (for the host: homes + the
 * NVMe working set + staging, the plan's whole host tier) and the check is
 * that the engine starts and runs in it; a tier that only holds homes gets
 * twice the plan, and its peak must be the plan's figure. The NVMe bytes
 * per step of each family are printed beside the plan's prediction.
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
 * usage: test_plan_engine SCRATCH_DIR [LAYOUT...]
 */
#include "ferry.h"
#include "offload/engine_internal.h"
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
#define TOL 0.05

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
  uint64_t own_dev, own_host;         /* the engine's buffers outside the manager */
} measured;

/* Runs `steps` steps of the loop with no kernels: the bytes the engine holds
 * do not depend on the values. */
static int run_engine(ferry_config *c, const tensor *t, size_t nt, int groups, int steps,
                      measured *out) {
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
  for (int k = 0; k < steps && !rc; k++) {
    if (k == steps - 1) { /* the last step's NVMe bytes: after the others have finished */
      rc = engine_wait_step(e);
      if (!rc) rc = ferry_engine_get_stats(e, &st0);
    }
    for (int g = 0; g < groups && !rc; g++) {
      rc = ferry_fetch(e, g, s);
      if (!rc) rc = ferry_release(e, g, s);
    }
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
  if (!rc) rc = engine_wait_step(e);
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
    out->host_homes = st.peak[FERRY_TIER_HOST][FERRY_FAMILY_PARAMS] +
                      st.peak[FERRY_TIER_HOST][FERRY_FAMILY_GRADS];
    /* grad buffers; grad and upload staging, and for host/NVMe param homes
     * one more staging of the largest group */
    size_t own_dev, own_host;
    engine_own_bytes(e, &own_dev, &own_host);
    out->own_dev = own_dev;
    out->own_host = own_host;
  }
  free(first);
  if (s) ferry_stream_destroy(s);
  ferry_engine_destroy(e);
  return rc;
}

static double rel(double got, double want) {
  return want > 0 ? fabs(got - want) / want : (got > 0 ? INFINITY : 0);
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

int main(int argc, char **argv) {
  REQUIRE(argc >= 2);
  int n = 0;
  for (int i = 2; i < argc; i++)
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++)
      if (!strcmp(argv[i], layouts[k].name)) run_layout(argv[1], &layouts[k]), n++;
  REQUIRE(n == argc - 2); /* every name known */
  if (argc == 2)
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++)
      run_layout(argv[1], &layouts[k]);
  return test_failures ? 1 : 0;
}

static void run_layout(const char *scratch, const layout *ly) {
  printf("== optimizer layout %s\n", ly->name);
  mkdir(scratch, 0700);
  char nvme_dir[1024];
  snprintf(nvme_dir, sizeof nvme_dir, "%s/nvme", scratch);
  mkdir(nvme_dir, 0700);

  ferry_plan_input in = ferry_plan_input_default();
  char why[256];
  REQUIRE(ferry_plan_model_from_json(model_json, strlen(model_json), "tiny-llama", &in.model, why,
                                     sizeof why) == 0);
  in.chunk_size = CHUNK;
  in.batch = 1;
  in.seq = 128;
  in.device = FERRY_PLAN_DEV_HOST; /* the engine below runs on the host backend */
  in.budget[FERRY_PLAN_GPU] = in.budget[FERRY_PLAN_HOST] = in.budget[FERRY_PLAN_NVME] = 1ull << 40;
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
    double slots = 2 * G * pb; /* the plan's device grad buffers: the engine's own */
    want[FERRY_PLAN_GPU] -= slots;
    /* NVMe homes: the host tier caches their chunks; the plan's working set
     * is its swap row, the engine's staging its buffers row */
    int nvme_opt = p == FERRY_PLACE_NVME_OPT || p == FERRY_PLACE_INFINITY;
    double swap = (double)c->bytes[FERRY_PLAN_HOST][FERRY_FAM_SWAP];
    double buffers_row = (double)c->bytes[FERRY_PLAN_HOST][FERRY_FAM_BUFFERS];
    const char *pp, *pg, *po;
    ferry_plan_placement_tiers(p, &pp, &pg, &po);
    pg = ferry_plan_grads_name(c->grads);
    int dev_cached = strcmp(pp, "gpu") != 0;
    int host_cached = nvme_opt;
    ferry_config *cfg = NULL;
    REQUIRE(ferry_config_create(&cfg) == 0);
    int rc = set(cfg, "device", "host");
    rc |= setu(cfg, "chunk_size", CHUNK);
    rc |= set(cfg, "placement.params", pp);
    rc |= set(cfg, "placement.grads", pg);
    rc |= set(cfg, "placement.optimizer", po);
    rc |= set(cfg, "optimizer.type", "adamw");
    rc |= set(cfg, "precision.params", "bf16");
    rc |= set(cfg, "tiers.host.pinned", "false");
    if (ly->state_key) rc |= set(cfg, "optimizer.state_dtype", ly->state_key);
    if (ly->master_key) rc |= set(cfg, "precision.master", ly->master_key);
    rc |= set(cfg, "clip_grad_norm", "0");
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
    if (!strcmp(po, "nvme") || !strcmp(pp, "nvme")) {
      rc |= set(cfg, "tiers.nvme.paths", nvme_dir);
      rc |= set(cfg, "tiers.nvme.verify", "none");
    }
    REQUIRE(rc == 0);
    measured got;
    memset(&got, 0, sizeof got);
    rc = run_engine(cfg, t, nt, groups, 3, &got);
    ferry_config_destroy(cfg);
    EXPECT_EQ_INT(rc, 0);
    if (rc) continue;
    if (nvme_opt) { /* the host homes: the tier less its cached NVMe chunks */
      printf("%-15s %-5s %12.0f %12llu   (NVMe working set: the plan's swap row vs the "
             "engine's optimizer peak in the host; ran in the plan's host tier + 4 MiB: %llu)\n",
             ferry_plan_placement_name(p), "host", swap, (unsigned long long)got.host_optim,
             (unsigned long long)host_budget);
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
        fprintf(stderr, "FAILED: %s %s: engine %llu vs plan %.0f (%.2f%% > 5%%)\n",
                ferry_plan_placement_name(p), ferry_plan_tier_name(tr),
                (unsigned long long)got.manager[tr], want[tr], 100 * d);
        test_failures++;
      }
    }
    printf("%-15s %-5s %12.0f %12llu   (engine buffers: device grad slots)\n",
           ferry_plan_placement_name(p), "gpu", slots, (unsigned long long)got.own_dev);
    printf("%-15s %-5s %12.0f %12llu   (engine buffers: host staging vs the buffers row)\n",
           ferry_plan_placement_name(p), "host", buffers_row, (unsigned long long)got.own_host);
    if (rel((double)got.own_host, buffers_row) > TOL) {
      fprintf(stderr, "FAILED: %s: engine host staging %llu vs the plan's buffers row %.0f\n",
              ferry_plan_placement_name(p), (unsigned long long)got.own_host, buffers_row);
      test_failures++;
    }
  }
}
