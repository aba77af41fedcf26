/* tests/plan/test_ranks.c — the planner's bytes per rank against the
 * engine's partition, under `mpirun -np N` (2 and 3; the host backend).
 *
 * A thin Llama config.json (4 blocks, hidden 128, vocab 2048: tensors of
 * many sizes, one larger than a chunk) is planned with in.rank = this
 * rank, and the engine is finalized with the same tensors, group by
 * group, the communicator and the configuration `ferry plan
 * --write-config` writes, for ZeRO stages 0 (nothing sharded) to 3,
 * every placement the engine takes with ranks (all-gpu's GPU math and,
 * at stage 3, params on the GPU or a bf16 master are refused) and four
 * optimizer layouts (fp32
 * and int8 states, each with an fp32 or a bf16 master). Byte for byte:
 * each family's bytes in its home (the plan's home_bytes, the engine's
 * ferry_stats current bytes in the family's home after finalize: ferry-gpt's
 * model states line), the NVMe swap files, the engine's host staging (the
 * plan's buffers row) and, with the optimizer or the grads on NVMe, the
 * plan's NVMe bytes per step of those families (a whole family read and
 * written); with NVMe homes, one step's working set in the host pool (the
 * plan's swap row) against the one the engine's refusal at a 64 KiB host
 * budget names (to its 0.1 MiB per term). The plan's default (in.rank =
 * -1) holds at least each rank's homes, tiers and swap files.
 *
 * usage: mpirun -np N test_plan_ranks SCRATCH (exit 77 without MPI)
 */
#include "ferry.h"
#include "plan/plan.h"
#include "tests/test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *model_json =
    "{\"model_type\": \"llama\", \"hidden_size\": 128, \"intermediate_size\": 344,"
    " \"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 4,"
    " \"vocab_size\": 2048, \"tie_word_embeddings\": false}";

#define CHUNK (64u << 10)

static int rank, nranks;

/* One tensor of the engine's registration: its name, group and shape
 * (cols 1: one dimension). */
typedef struct {
  char name[64];
  int group;
  int64_t shape[2];
} reg_tensor;

static void push(reg_tensor *t, size_t *n, const char *name, int group, int64_t rows,
                 int64_t cols) {
  reg_tensor *x = &t[(*n)++];
  snprintf(x->name, sizeof x->name, "%s", name);
  x->group = group;
  x->shape[0] = rows;
  x->shape[1] = cols;
}

/* The planner's tensors of a Llama without biases, in registration order
 * (plan_group_tensors: per block the norm, q k v o, the norm, gate up
 * down); how many. */
static size_t llama_tensors(const ferry_plan_model *m, reg_tensor *t) {
  const int64_t h = m->hidden, f = m->ffn, q = m->heads * m->head_dim;
  const int64_t kv = m->kv_heads * m->head_dim;
  static const char *const part[] = {"input_layernorm", "q_proj", "k_proj", "v_proj", "o_proj",
                                     "post_attention_layernorm", "gate_proj", "up_proj",
                                     "down_proj"};
  const int64_t rows[] = {h, q, kv, kv, h, h, f, f, h}, cols[] = {1, h, h, h, q, 1, h, h, f};
  size_t n = 0;
  push(t, &n, "embed_tokens.weight", 0, m->vocab, h);
  for (int64_t l = 0; l < m->layers; l++)
    for (int k = 0; k < 9; k++) {
      char b[64];
      snprintf(b, sizeof b, "layers.%lld.%s", (long long)l, part[k]);
      push(t, &n, b, (int)l + 1, rows[k], cols[k]);
    }
  push(t, &n, "norm.weight", (int)m->layers + 1, h, 1);
  push(t, &n, "lm_head.weight", (int)m->layers + 1, m->vocab, h);
  return n;
}

typedef struct {
  const char *name;
  int state_dtype, master_dtype;
} layout;

static const layout layouts[] = {
    {"fp32", FERRY_DT_F32, FERRY_DT_F32},
    {"int8", FERRY_DT_I8, FERRY_DT_F32},
    {"fp32-m16", FERRY_DT_F32, FERRY_DT_BF16},
    {"int8-m16", FERRY_DT_I8, FERRY_DT_BF16},
};

static int set(ferry_config *c, const char *k, const char *v) {
  int rc = ferry_config_set(c, k, v);
  if (rc) fprintf(stderr, "config %s = %s: %s\n", k, v, ferry_config_last_error(c));
  return rc;
}

/* What the engine holds on this rank after finalize. */
typedef struct {
  uint64_t home[FERRY_FAMILIES]; /* each family's bytes in its deepest tier */
  uint64_t nvme_file;
  uint64_t staging; /* tiers.host.budget less the manager's */
} held;

/* The engine of candidate c on this rank, finalized at a host budget of 1
 * GiB (*out: what it holds), or of 64 KiB (host_need > 0: *host_need, the
 * MiB of one step's working set its refusal names, the sum of its
 * optimizer, grads, params and largest-chunk terms). */
static int finalize(const ferry_plan_candidate *c, const layout *ly, int stage, const char *nvme,
                    const reg_tensor *t, size_t nt, ferry_comm *comm, held *out,
                    double *host_need) {
  const char *pp, *pg, *po;
  ferry_plan_placement_tiers(c->placement, &pp, &pg, &po);
  ferry_config *cfg = NULL;
  REQUIRE(ferry_config_create(&cfg) == 0);
  char b[64];
  int rc = set(cfg, "device", "host");
  rc |= set(cfg, "placement.params", pp);
  rc |= set(cfg, "placement.grads", ferry_plan_grads_name(c->grads));
  rc |= set(cfg, "placement.optimizer", po);
  rc |= set(cfg, "precision.params", "bf16");
  rc |= set(cfg, "tiers.host.pinned", "false");
  rc |= set(cfg, "clip_grad_norm", "0");
  rc |= set(cfg, "chunk_size", "64K");
  rc |= set(cfg, "tiers.gpu.budget", "1G");
  rc |= set(cfg, "tiers.host.budget", host_need ? "64K" : "1G");
  if (c->placement >= FERRY_PLACE_NVME_OPT) {
    rc |= set(cfg, "tiers.nvme.paths", nvme);
    rc |= set(cfg, "tiers.nvme.verify", "none");
  }
  snprintf(b, sizeof b, "%d", stage);
  rc |= set(cfg, "dist.zero_stage", b);
  if (ly->state_dtype == FERRY_DT_I8) rc |= set(cfg, "optimizer.state_dtype", "int8");
  if (ly->master_dtype == FERRY_DT_BF16) rc |= set(cfg, "precision.master", "bf16");
  REQUIRE(rc == 0);
  ferry_engine *e = NULL;
  rc = ferry_engine_create(cfg, NULL, &e);
  if (!rc) rc = ferry_engine_set_comm(e, comm);
  for (size_t i = 0; i < nt && !rc; i++)
    rc = ferry_param_register(e, t[i].name, t[i].shape, t[i].shape[1] == 1 ? 1 : 2, t[i].group,
                               NULL, NULL, NULL);
  if (!rc) rc = ferry_engine_finalize(e);
  if (host_need) {
    const char *m = rc == FERRY_ENOMEM ? strstr(ferry_engine_last_error(e), "(optimizer state") : NULL;
    double o, g, p, k;
    if (m && sscanf(m, "(optimizer state of the largest group %lf + 2 x its grads %lf + 2 x its "
                       "params %lf + 2 x the largest chunk %lf", &o, &g, &p, &k) == 4) {
      *host_need = o + g + p + k;
      rc = 0;
    } else {
      fprintf(stderr, "rank %d: want a host refusal: %d %s\n", rank, rc,
              e ? ferry_engine_last_error(e) : "");
      rc = rc ? rc : FERRY_EINVAL;
    }
    ferry_engine_destroy(e);
    ferry_config_destroy(cfg);
    return rc;
  }
  ferry_stats st;
  if (!rc) rc = ferry_engine_get_stats(e, &st);
  if (rc) fprintf(stderr, "rank %d: engine: %s\n", rank, e ? ferry_engine_last_error(e) : "");
  if (!rc) {
    for (int f = 0; f < FERRY_FAMILIES; f++) {
      out->home[f] = 0;
      for (int tr = FERRY_TIERS - 1; tr >= 0 && !out->home[f]; tr--) out->home[f] = st.current[tr][f];
    }
    out->nvme_file = st.nvme_file_bytes;
    out->staging = (1ull << 30) - st.budget[FERRY_TIER_HOST];
  }
  ferry_engine_destroy(e);
  ferry_config_destroy(cfg);
  return rc;
}

static int same(const char *what, const char *label, double plan, double engine) {
  int ok = plan == engine;
  printf("rank %d/%d %-40s %-9s plan %10.0f engine %10.0f%s\n", rank, nranks, label, what, plan,
         engine, ok ? "" : "  DIFFERS");
  return ok;
}

/* One stage, placement and layout: this rank's plan against its engine;
 * the number of figures that differ. */
static int run_case(int stage, int p, const layout *ly, const char *nvme, ferry_comm *comm) {
  ferry_plan_input in = ferry_plan_input_default();
  char why[256], label[96];
  REQUIRE(ferry_plan_model_from_json(model_json, strlen(model_json), "thin", &in.model, why,
                                     sizeof why) == 0);
  in.device = FERRY_PLAN_DEV_HOST;
  in.budget[FERRY_PLAN_GPU] = in.budget[FERRY_PLAN_HOST] = in.budget[FERRY_PLAN_NVME] = 1ull << 50;
  in.chunk_size = CHUNK;
  in.seq = 64;
  in.gpus = nranks;
  in.zero_stage = stage;
  in.state_dtype = ly->state_dtype;
  in.master_dtype = ly->master_dtype;
  in.rank = rank;
  static ferry_plan_result r, most;
  REQUIRE(ferry_plan_compute(&in, &r, why, sizeof why) == 0);
  EXPECT(!r.bytes_estimated);
  static reg_tensor t[64];
  size_t nt = llama_tensors(&in.model, t);
  const ferry_plan_candidate *c = &r.cand[p];
  held got;
  snprintf(label, sizeof label, "stage %d %s %s", stage, ferry_plan_placement_name(p), ly->name);
  int rc = finalize(c, ly, stage, nvme, t, nt, comm, &got, NULL);
  EXPECT_EQ_INT(rc, 0);
  if (rc) return 1;
  static const char *const fam[] = {"params", "grads", "optimizer"};
  int bad = 0;
  for (int f = 0; f < FERRY_FAMILIES; f++)
    bad += !same(fam[f], label, (double)c->home_bytes[f], (double)got.home[f]);
  bad += !same("swapfiles", label, (double)c->nvme_file_bytes, (double)got.nvme_file);
  bad += !same("staging", label, (double)c->bytes[FERRY_PLAN_HOST][FERRY_FAM_BUFFERS],
               (double)got.staging);
  /* a family on NVMe: read and written whole each step */
  if (p == FERRY_PLACE_NVME_OPT || p == FERRY_PLACE_INFINITY)
    bad += !same("nvme r/w", label, c->nvme_read[FERRY_PLAN_NV_OPTIM],
                 (double)got.home[FERRY_FAMILY_OPTIM]) +
           !(c->nvme_write[FERRY_PLAN_NV_OPTIM] == c->nvme_read[FERRY_PLAN_NV_OPTIM]);
  if (c->grads == FERRY_PLAN_GRADS_NVME)
    bad += !same("nvme r/w", label, c->nvme_write[FERRY_PLAN_NV_GRADS],
                 (double)got.home[FERRY_FAMILY_GRADS]);
  /* NVMe homes: one step's working set in the host pool (the plan's swap
   * row), to the refusal's 0.1 MiB per term */
  double need = 0;
  if (p == FERRY_PLACE_NVME_OPT || p == FERRY_PLACE_INFINITY) {
    EXPECT_EQ_INT(finalize(c, ly, stage, nvme, t, nt, comm, &got, &need), 0);
    double swap = (double)c->bytes[FERRY_PLAN_HOST][FERRY_FAM_SWAP] / (1 << 20);
    int ok = swap > need - 0.2 && swap < need + 0.2;
    printf("rank %d/%d %-40s %-9s plan %10.2f engine %10.1f MiB%s\n", rank, nranks, label,
           "workset", swap, need, ok ? "" : "  DIFFERS");
    bad += !ok;
  }
  /* the default plan: per family the rank with the most */
  in.rank = -1;
  REQUIRE(ferry_plan_compute(&in, &most, why, sizeof why) == 0);
  for (int f = 0; f < FERRY_FAMILIES; f++)
    EXPECT(most.cand[p].home_bytes[f] >= c->home_bytes[f]);
  /* ... and its tiers and swap files bound this rank's (each rank runs at
   * the default's budgets; a rank's largest group or chunk may be another
   * rank's than the one with the most bytes) */
  for (int tr = 0; tr < FERRY_PLAN_TIERS; tr++)
    EXPECT(most.cand[p].tier_bytes[tr] >= c->tier_bytes[tr]);
  EXPECT(most.cand[p].nvme_file_bytes >= c->nvme_file_bytes);
  return bad;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: mpirun -np N test_plan_ranks SCRATCH\n");
    return 2;
  }
  mkdir(argv[1], 0777);
  if (!ferry_comm_compiled(FERRY_COMM_MPI)) TEST_SKIP("this build has no MPI");
  ferry_comm_options co = ferry_comm_options_default();
  co.kind = FERRY_COMM_MPI;
  co.timeout = 60;
  ferry_comm *comm = NULL;
  REQUIRE(ferry_comm_create(&co, &comm) == 0);
  rank = ferry_comm_rank(comm);
  nranks = ferry_comm_size(comm);
  if (nranks < 2) {
    ferry_comm_destroy(comm);
    TEST_SKIP("needs ranks (mpirun -np 2 or more)");
  }
  char nvme[1200];
  snprintf(nvme, sizeof nvme, "%.1000s/np%d-rank%d", argv[1], nranks, rank);
  mkdir(nvme, 0777);
  static const int places[] = {FERRY_PLACE_ZERO_OFFLOAD, FERRY_PLACE_ZERO3_OFFLOAD,
                               FERRY_PLACE_NVME_OPT, FERRY_PLACE_INFINITY};
  int bad = 0;
  for (int stage = 0; stage <= 3; stage++)
    for (size_t pi = 0; pi < sizeof places / sizeof places[0]; pi++)
      for (size_t l = 0; l < sizeof layouts / sizeof layouts[0]; l++) {
        /* refused by the engine with ranks at stage 3 */
        if (stage == 3 && (places[pi] == FERRY_PLACE_ZERO_OFFLOAD ||
                           layouts[l].master_dtype == FERRY_DT_BF16))
          continue;
        bad += run_case(stage, places[pi], &layouts[l], nvme, comm);
      }
  EXPECT_EQ_INT(bad, 0);
  ferry_comm_destroy(comm);
  return test_finish("plan.ranks");
}
