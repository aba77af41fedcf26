/* tests/plan/test_dist.c — the planner with ranks (docs/PLANNING.md, "Data
 * parallelism"): one rank plans exactly as before whatever the stage, each
 * ZeRO stage shards what it says per rank, the ring's communication bytes
 * match a hand computation, a slow network becomes the bottleneck, and bad
 * rank counts, stages and bandwidths are refused with the value named.
 */
#include "ferry.h"
#include "plan/plan.h"
#include "tests/test.h"

#include <math.h>
#include <string.h>

#define EXPECT_NEAR(a, b, tol) EXPECT(fabs((double)(a) - (double)(b)) <= (tol))

static ferry_plan_input input(const char *preset) {
  ferry_plan_input in = ferry_plan_input_default();
  REQUIRE(ferry_plan_model_preset(preset, &in.model, NULL, 0) == 0);
  in.budget[FERRY_PLAN_GPU] = 1ull << 50;
  in.budget[FERRY_PLAN_HOST] = 1ull << 50;
  in.budget[FERRY_PLAN_NVME] = 1ull << 50;
  return in;
}

/* A 24 GB GPU (95% of it) and 100 GiB of host budget, per rank. */
static ferry_plan_input workstation(const char *preset) {
  ferry_plan_input in = input(preset);
  in.budget[FERRY_PLAN_GPU] = (uint64_t)(24.0 * 0.95 * (1ull << 30));
  in.budget[FERRY_PLAN_HOST] = 100ull << 30;
  return in;
}

/* Plans into *r in place (ferry_plan_compute zeroes it first, padding
 * included, so two results compare with memcmp). */
static void plan_into(const ferry_plan_input *in, ferry_plan_result *r) {
  char why[256] = "";
  int rc = ferry_plan_compute(in, r, why, sizeof why);
  if (rc) fprintf(stderr, "  plan: %s\n", why);
  REQUIRE(rc == 0);
}

static ferry_plan_result plan(const ferry_plan_input *in) {
  ferry_plan_result r;
  plan_into(in, &r);
  return r;
}

/* One rank: every stage, any network, the same plan as the defaults. */
static void test_one_rank(void) {
  ferry_plan_input in = workstation("llama-2-13b");
  in.seq = 2048;
  in.clip_grad_norm = 1;
  in.grad_accumulation = 2;
  static ferry_plan_result base, r;
  plan_into(&in, &base);
  EXPECT_EQ_INT(base.ranks, 1);
  for (int s = 0; s <= 3; s++) {
    ferry_plan_input t = in;
    t.zero_stage = s;
    t.net_gbps = 0.001;
    t.intra_gbps = 0.001;
    plan_into(&t, &r);
    EXPECT(memcmp(&r, &base, sizeof r) == 0);
  }
  for (int p = 0; p < FERRY_PLACEMENTS; p++) {
    EXPECT(base.cand[p].comm_bytes == 0 && base.cand[p].comm_seconds == 0);
    EXPECT(base.cand[p].comm_hidden_fraction == 1 && base.cand[p].bottleneck != FERRY_COMP_NET);
  }
}

static double opt_fams(const ferry_plan_candidate *c, int t) {
  return (double)(c->bytes[t][FERRY_FAM_MASTER] + c->bytes[t][FERRY_FAM_OPTIM]);
}

/* Two ranks: what each stage shards is about half per rank, the rest whole. */
static void test_sharding(void) {
  ferry_plan_input in = input("llama-2-7b");
  in.clip_grad_norm = 1; /* grads kept: an accumulator per home */
  ferry_plan_result one = plan(&in);
  for (int s = 0; s <= 3; s++) {
    ferry_plan_input t = in;
    t.gpus = 2;
    t.zero_stage = s;
    ferry_plan_result r = plan(&t);
    EXPECT_EQ_INT(r.ranks, 2);
    const ferry_plan_candidate *zo1 = &one.cand[FERRY_PLACE_ZERO_OFFLOAD];
    const ferry_plan_candidate *zo2 = &r.cand[FERRY_PLACE_ZERO_OFFLOAD];
    double opt = opt_fams(zo2, FERRY_PLAN_HOST) / opt_fams(zo1, FERRY_PLAN_HOST);
    double grads = (double)zo2->bytes[FERRY_PLAN_HOST][FERRY_FAM_GRADS] /
                   (double)zo1->bytes[FERRY_PLAN_HOST][FERRY_FAM_GRADS];
    const ferry_plan_candidate *z31 = &one.cand[FERRY_PLACE_ZERO3_OFFLOAD];
    const ferry_plan_candidate *z32 = &r.cand[FERRY_PLACE_ZERO3_OFFLOAD];
    double params = (double)z32->bytes[FERRY_PLAN_HOST][FERRY_FAM_PARAMS] /
                    (double)z31->bytes[FERRY_PLAN_HOST][FERRY_FAM_PARAMS];
    /* NVMe: the optimizer family's bytes per step, per rank */
    const ferry_plan_candidate *no1 = &one.cand[FERRY_PLACE_NVME_OPT];
    const ferry_plan_candidate *no2 = &r.cand[FERRY_PLACE_NVME_OPT];
    double nv = no2->nvme_read[FERRY_PLAN_NV_OPTIM] / no1->nvme_read[FERRY_PLAN_NV_OPTIM];
    double nvg = no2->nvme_write[FERRY_PLAN_NV_GRADS] / no1->nvme_write[FERRY_PLAN_NV_GRADS];
    printf("stage %d, 2 ranks / 1: optimizer %.4f, grads %.4f, params %.4f, nvme optimizer "
           "%.4f, nvme grads %.4f\n",
           s, opt, grads, params, nv, nvg);
    /* chunk rounding (64 MiB) keeps the halves within a chunk or two */
    EXPECT(s >= 1 ? opt > 0.49 && opt < 0.51 : opt == 1);
    EXPECT(s >= 1 ? nv > 0.499 && nv < 0.501 : nv == 1);
    EXPECT(s >= 2 ? grads > 0.49 && grads < 0.51 : grads == 1);
    EXPECT(s >= 2 ? nvg > 0.499 && nvg < 0.501 : nvg == 1);
    EXPECT(s >= 3 ? params > 0.49 && params < 0.51 : params == 1);
    /* the CPU optimizer updates this rank's share only (stage 0: all of it) */
    double cpu = zo2->seconds[FERRY_COMP_CPU] / zo1->seconds[FERRY_COMP_CPU];
    EXPECT(s == 0 ? cpu == 2 : cpu < 1.5); /* the node's CPU serves both ranks */
    /* at stage 3 a device home keeps its share and two gathered groups */
    const ferry_plan_candidate *ag = &r.cand[FERRY_PLACE_ALL_GPU];
    const ferry_plan_candidate *ag1 = &one.cand[FERRY_PLACE_ALL_GPU];
    if (s == 3)
      EXPECT(ag->bytes[FERRY_PLAN_GPU][FERRY_FAM_PARAMS] <
             ag1->bytes[FERRY_PLAN_GPU][FERRY_FAM_PARAMS] * 0.6);
  }
  /* the peak optimizer bytes per rank against the target of issue 23: <= 0.55 of one rank's */
  ferry_plan_input t = in;
  t.nodes = 2;
  ferry_plan_result r = plan(&t);
  EXPECT(opt_fams(&r.cand[FERRY_PLACE_NVME_OPT], FERRY_PLAN_NVME) <=
         0.55 * opt_fams(&one.cand[FERRY_PLACE_NVME_OPT], FERRY_PLAN_NVME));
}

/* The ring's bytes against a hand computation: gpt2, P = 124,439,808, bf16
 * params (2 B), grads reduced as fp32 (4 B), N = 4 ranks: a reduce-scatter
 * or all-gather moves 3/4 of its buffer per rank, an all-reduce 6/4. */
static void test_comm_bytes(void) {
  const double P = 124439808.0;
  ferry_plan_input in = input("gpt2");
  in.gpus = 4;
  in.clip_grad_norm = 1;
  struct {
    int stage, accum;
    double grads, params; /* bytes per rank and step */
  } want[] = {
      {0, 1, 746638848.0, 0},            /* 2 * 3/4 * 4P = 6P */
      {1, 1, 373319424.0, 186659712.0},  /* 3/4 * 4P once; 3/4 * 2P gathered */
      {1, 3, 373319424.0, 186659712.0},  /* stage 1 reduces once, at the last micro-batch */
      {2, 3, 1119958272.0, 186659712.0}, /* 3 micro-batches x 3P; 1.5P */
      {3, 1, 373319424.0, 373319424.0},  /* 3P; forward + backward gathers 2 x 1.5P */
      {0, 2, 1493277696.0, 0},           /* 12P */
  };
  EXPECT_EQ_INT((int64_t)ferry_plan_model_params(&in.model), (int64_t)P);
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    ferry_plan_input t = in;
    t.zero_stage = want[i].stage;
    t.grad_accumulation = want[i].accum;
    ferry_plan_result r = plan(&t);
    for (int p = 0; p < FERRY_PLACEMENTS; p++) {
      const ferry_plan_candidate *c = &r.cand[p];
      EXPECT_NEAR(c->comm_grad_bytes, want[i].grads, 0.5);
      EXPECT_NEAR(c->comm_param_bytes, want[i].params, 0.5);
      EXPECT_NEAR(c->comm_bytes, want[i].grads + want[i].params, 1);
      /* one node: the GPU links, 8 x h2d_gbps = 200 Gb/s = 25e9 B/s */
      EXPECT_NEAR(c->comm_link_gbps, 200, 1e-9);
      EXPECT_NEAR(c->comm_seconds, c->comm_bytes / 25e9, 1e-12);
      EXPECT(c->seconds[FERRY_COMP_NET] == c->comm_seconds);
    }
  }
  /* two nodes of two: the network (100 Gb/s) is the slower link; one GPU
   * per node: the network alone; --intra-gbps slower than the network: it */
  ferry_plan_input t = in;
  t.gpus = 2;
  t.nodes = 2;
  ferry_plan_result r = plan(&t);
  EXPECT_NEAR(r.cand[0].comm_link_gbps, 100, 1e-9);
  EXPECT_NEAR(r.cand[0].comm_seconds, r.cand[0].comm_bytes / 12.5e9, 1e-12);
  t.intra_gbps = 40;
  r = plan(&t);
  EXPECT_NEAR(r.cand[0].comm_link_gbps, 40, 1e-9);
  t.gpus = 1;
  t.nodes = 4;
  r = plan(&t);
  EXPECT_NEAR(r.cand[0].comm_link_gbps, 100, 1e-9);
  EXPECT_NEAR(r.cand[0].comm_bytes, 373319424.0 + 186659712.0, 1); /* N = 4 again, stage 2 */
}

/* A slow network is the bottleneck and mostly exposed; a fast one hides. */
static void test_bottleneck(void) {
  ferry_plan_input in = workstation("llama-2-7b");
  in.nodes = 2;
  in.net_gbps = 0.1;
  ferry_plan_result r = plan(&in);
  REQUIRE(r.recommended >= 0);
  const ferry_plan_candidate *c = &r.cand[r.recommended];
  /* no clipping, bf16, one micro-batch: alone "auto" keeps no grads; ranks
   * average theirs into accumulators in the optimizer's home */
  EXPECT_EQ_INT(r.cand[FERRY_PLACE_ZERO_OFFLOAD].grads, FERRY_PLAN_GRADS_HOST);
  EXPECT_EQ_INT(r.cand[FERRY_PLACE_NVME_OPT].grads, FERRY_PLAN_GRADS_NVME);
  EXPECT_EQ_INT(c->bottleneck, FERRY_COMP_NET);
  EXPECT(!strcmp(ferry_plan_component_name(c->bottleneck), "network"));
  EXPECT(c->comm_hidden_fraction >= 0 && c->comm_hidden_fraction < 0.1);
  /* exposed = the step less the same step without communication */
  double mx = 0, sum = 0;
  for (int k = 0; k < FERRY_COMPONENTS; k++)
    if (k != FERRY_COMP_NET) mx = fmax(mx, c->seconds[k]), sum += c->seconds[k];
  double alone = mx + (sum - mx) / (double)r.groups;
  EXPECT_NEAR(c->comm_exposed_seconds, c->step_seconds - alone, 1e-9 * c->step_seconds);
  EXPECT_NEAR(c->comm_hidden_fraction, 1 - c->comm_exposed_seconds / c->comm_seconds, 1e-12);
  in.net_gbps = 10000;
  r = plan(&in);
  c = &r.cand[r.recommended];
  EXPECT(c->bottleneck != FERRY_COMP_NET);
  EXPECT(c->comm_hidden_fraction > 0.9 && c->comm_hidden_fraction <= 1);
  EXPECT(c->comm_seconds > 0);
}

static void test_refusals(void) {
  ferry_plan_input in = input("gpt2");
  ferry_plan_result r;
  char why[256];
  struct {
    int gpus, nodes, stage;
    double net, intra;
    const char *named;
  } bad[] = {{0, 1, 2, 100, 0, "gpus 0"},        {1, 0, 2, 100, 0, "nodes 0"},
             {2, 1, 4, 100, 0, "zero_stage 4"},  {2, 1, -1, 100, 0, "zero_stage -1"},
             {2, 2, 2, -1, 0, "net_gbps -1"},    {2, 2, 2, 0, 0, "net_gbps 0"},
             {2, 2, 2, 100, -5, "intra_gbps -5"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ferry_plan_input t = in;
    t.gpus = bad[i].gpus;
    t.nodes = bad[i].nodes;
    t.zero_stage = bad[i].stage;
    t.net_gbps = bad[i].net;
    t.intra_gbps = bad[i].intra;
    why[0] = '\0';
    EXPECT_EQ_INT(ferry_plan_compute(&t, &r, why, sizeof why), FERRY_EINVAL);
    if (!strstr(why, bad[i].named)) fprintf(stderr, "  '%s' lacks '%s'\n", why, bad[i].named);
    EXPECT(strstr(why, bad[i].named) != NULL);
  }
}

int main(void) {
  test_one_rank();
  test_sharding();
  test_comm_bytes();
  test_bottleneck();
  test_refusals();
  return test_finish("plan.dist");
}
