/* tests/plan/test_placements.c — the planner's bytes and times: DeepSpeed's
 * published ZeRO-2/ZeRO-3 estimator formulas reproduced where assumptions
 * coincide, every family formula at exact (unchunked) sizes, impossible
 * requests explained, the largest batch, the step model and profiles.
 */
#include "ferry.h"
#include "plan/footprint.h"
#include "plan/plan.h"
#include "tests/test.h"

#include <math.h>
#include <string.h>

#define EXPECT_NEAR(a, b, tol) EXPECT(fabs((double)(a) - (double)(b)) <= (tol))

static ferry_plan_input input(const char *preset, uint64_t gpu, uint64_t host, uint64_t nvme) {
  ferry_plan_input in = ferry_plan_input_default();
  REQUIRE(ferry_plan_model_preset(preset, &in.model, NULL, 0) == 0);
  in.budget[FERRY_PLAN_GPU] = gpu;
  in.budget[FERRY_PLAN_HOST] = host;
  in.budget[FERRY_PLAN_NVME] = nvme;
  return in;
}

static double model_states(const ferry_plan_candidate *c, int tier) {
  const uint64_t *b = c->bytes[tier];
  return (double)(b[FERRY_FAM_PARAMS] + b[FERRY_FAM_GRADS] + b[FERRY_FAM_MASTER] +
                  b[FERRY_FAM_OPTIM]);
}

/* docs/PLANNING.md's table: with chunk rounding off, bf16 params, AdamW. */
static void test_deepspeed(void) {
  static const char *const models[] = {"gpt2-xl", "llama-2-7b", "llama-2-13b", "llama-2-70b",
                                       "qwen2.5-14b"};
  for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
    ferry_plan_input in = input(models[i], 1ull << 50, 1ull << 50, 1ull << 50);
    in.chunk_size = 0;
    in.clip_grad_norm = 1; /* gradients kept, in host RAM, as DeepSpeed keeps them */
    ferry_plan_result r;
    REQUIRE(ferry_plan_compute(&in, &r, NULL, 0) == 0);
    double P = (double)r.params, G = (double)r.largest_group, gpu, cpu;
    const ferry_plan_candidate *all = &r.cand[FERRY_PLACE_ALL_GPU];
    const ferry_plan_candidate *zo = &r.cand[FERRY_PLACE_ZERO_OFFLOAD];
    const ferry_plan_candidate *z3 = &r.cand[FERRY_PLACE_ZERO3_OFFLOAD];

    /* ZeRO-2 + offload_optimizer: GPU 2P equals ferry's params; CPU 16P x 1.5
     * equals ferry's host model states x 1.5; ferry adds two 16-bit group grad
     * buffers (4G) on the GPU that DeepSpeed's formula leaves out. */
    ferry_plan_deepspeed_estimate(2, 1, 0, r.params, r.largest_group, 1.5, &gpu, &cpu);
    EXPECT(gpu == 2 * P && (double)zo->bytes[FERRY_PLAN_GPU][FERRY_FAM_PARAMS] == gpu);
    EXPECT(model_states(zo, FERRY_PLAN_HOST) * 1.5 == cpu);
    EXPECT(model_states(zo, FERRY_PLAN_GPU) == gpu + 4 * G);
    /* ZeRO-3 + offload_optimizer only (params stay on the GPU): identical on
     * both sides when DeepSpeed's largest layer is ferry's largest group. */
    ferry_plan_deepspeed_estimate(3, 1, 0, r.params, r.largest_group, 1.5, &gpu, &cpu);
    EXPECT(model_states(zo, FERRY_PLAN_GPU) == gpu);
    EXPECT(model_states(zo, FERRY_PLAN_HOST) * 1.5 == cpu);
    /* ZeRO-3 + offload_optimizer + offload_param: CPU 18P x 1.5 equals ferry's
     * host model states x 1.5; on the GPU ferry double-buffers (the group in
     * use and the next, the grads being written and draining): 2 x 4G. */
    ferry_plan_deepspeed_estimate(3, 1, 1, r.params, r.largest_group, 1.5, &gpu, &cpu);
    EXPECT(model_states(z3, FERRY_PLAN_HOST) * 1.5 == cpu);
    EXPECT(model_states(z3, FERRY_PLAN_GPU) == 2 * gpu);
    /* ZeRO-3 without offload: 4 LL + 18P equals all-gpu; ferry's 18 bytes are
     * 2 (params) + 4 (fp32 grads) + 4 (master) + 8 (m, v), DeepSpeed's 2 + 16. */
    ferry_plan_deepspeed_estimate(3, 0, 0, r.params, r.largest_group, 1.5, &gpu, &cpu);
    EXPECT(model_states(all, FERRY_PLAN_GPU) == gpu);
    /* ZeRO-2 without offload counts 16-bit grads too: 20P vs ferry's 18P + 4G */
    ferry_plan_deepspeed_estimate(2, 0, 0, r.params, r.largest_group, 1.5, &gpu, &cpu);
    EXPECT(gpu == 20 * P && model_states(all, FERRY_PLAN_GPU) == 18 * P + 4 * G);
  }
}

/* Each family of each placement at exact sizes (chunk_size 0). */
static void test_families(void) {
  ferry_plan_input in = input("llama-2-7b", 1ull << 50, 1ull << 50, 1ull << 50);
  in.chunk_size = 0;
  ferry_plan_result r;
  REQUIRE(ferry_plan_compute(&in, &r, NULL, 0) == 0);
  uint64_t P = r.params, G = r.largest_group;
  EXPECT(G == ferry_plan_block_params(&in.model)); /* a block outweighs the embedding here */
  const ferry_plan_candidate *inf = &r.cand[FERRY_PLACE_INFINITY];
  /* no clipping, bf16, one micro-batch: the step runs during backward and
   * "auto" keeps no gradients anywhere but the device's two group buffers */
  for (int p = 1; p < FERRY_PLACEMENTS; p++) {
    EXPECT(r.cand[p].grads == FERRY_PLAN_GRADS_NONE);
    EXPECT(r.cand[p].bytes[FERRY_PLAN_HOST][FERRY_FAM_GRADS] == 0);
    EXPECT(r.cand[p].bytes[FERRY_PLAN_NVME][FERRY_FAM_GRADS] == 0);
    EXPECT(r.cand[p].bytes[FERRY_PLAN_GPU][FERRY_FAM_GRADS] == 4 * G);
  }
  EXPECT(r.cand[FERRY_PLACE_ALL_GPU].grads == FERRY_PLAN_GRADS_GPU);
  EXPECT(inf->bytes[FERRY_PLAN_NVME][FERRY_FAM_PARAMS] == 2 * P);
  EXPECT(inf->bytes[FERRY_PLAN_NVME][FERRY_FAM_MASTER] == 4 * P);
  EXPECT(inf->bytes[FERRY_PLAN_NVME][FERRY_FAM_OPTIM] == 8 * P);
  EXPECT(inf->bytes[FERRY_PLAN_GPU][FERRY_FAM_PARAMS] == 4 * G);
  EXPECT(inf->tier_bytes[FERRY_PLAN_NVME] == 14 * P);
  /* host: drain 2 G p + commit G p; working set: one group's optimizer
   * chunks (master + 2 states: 12 G) + two groups of params (2 x 2 G); no
   * slack without chunks */
  EXPECT(inf->bytes[FERRY_PLAN_HOST][FERRY_FAM_BUFFERS] == 6 * G);
  EXPECT(inf->bytes[FERRY_PLAN_HOST][FERRY_FAM_SWAP] == 12 * G + 4 * G);
  EXPECT(inf->tier_bytes[FERRY_PLAN_HOST] == 22 * G);
  const ferry_plan_candidate *no = &r.cand[FERRY_PLACE_NVME_OPT];
  EXPECT(no->bytes[FERRY_PLAN_HOST][FERRY_FAM_PARAMS] == 2 * P);
  EXPECT(no->tier_bytes[FERRY_PLAN_NVME] == 12 * P);
  /* zero-offload: drain 2 G p + uploads 2 G p (params on the device, CPU optimizer) */
  EXPECT(r.cand[FERRY_PLACE_ZERO_OFFLOAD].bytes[FERRY_PLAN_HOST][FERRY_FAM_BUFFERS] == 8 * G);
  /* kept gradients: clipping puts them at home (host, or NVMe beside the
   * optimizer); bf16 accumulators halve them; NVMe grads add two groups */
  in.clip_grad_norm = 1;
  in.grad_precision = FERRY_PREC_BF16;
  REQUIRE(ferry_plan_compute(&in, &r, NULL, 0) == 0);
  EXPECT(r.cand[FERRY_PLACE_ZERO3_OFFLOAD].grads == FERRY_PLAN_GRADS_HOST);
  EXPECT(r.cand[FERRY_PLACE_ZERO3_OFFLOAD].bytes[FERRY_PLAN_HOST][FERRY_FAM_GRADS] == 2 * P);
  EXPECT(inf->grads == FERRY_PLAN_GRADS_NVME);
  EXPECT(inf->bytes[FERRY_PLAN_NVME][FERRY_FAM_GRADS] == 2 * P);
  EXPECT(inf->bytes[FERRY_PLAN_HOST][FERRY_FAM_SWAP] == 12 * G + 4 * G + 2 * 2 * G);
  /* fp16 needs the whole gradient (dynamic scaling); so does accumulation */
  in.clip_grad_norm = 0;
  in.precision = FERRY_PREC_FP16;
  EXPECT(ferry_plan_grads_auto(&in, FERRY_PLACE_NVME_OPT) == FERRY_PLAN_GRADS_NVME);
  in.precision = FERRY_PREC_BF16;
  in.grad_accumulation = 4;
  EXPECT(ferry_plan_grads_auto(&in, FERRY_PLACE_ZERO_OFFLOAD) == FERRY_PLAN_GRADS_HOST);
  in.grad_accumulation = 1;
  EXPECT(ferry_plan_grads_auto(&in, FERRY_PLACE_ZERO_OFFLOAD) == FERRY_PLAN_GRADS_NONE);
  in.grad_precision = FERRY_PREC_FP32;
  /* one fp32 state for SGD, Adagrad and Lion; fp32 params are 4 bytes */
  for (int opt = 0; opt <= 5; opt++) {
    in.optimizer = opt;
    in.precision = FERRY_PREC_FP32;
    REQUIRE(ferry_plan_compute(&in, &r, NULL, 0) == 0);
    uint64_t k = opt == FERRY_OPTIM_ADAMW || opt == FERRY_OPTIM_ADAM || opt == FERRY_OPTIM_LAMB
                     ? 2 : 1;
    EXPECT(r.cand[FERRY_PLACE_ZERO_OFFLOAD].bytes[FERRY_PLAN_HOST][FERRY_FAM_OPTIM] == 4 * k * P);
    EXPECT(r.cand[FERRY_PLACE_ZERO_OFFLOAD].bytes[FERRY_PLAN_GPU][FERRY_FAM_PARAMS] == 4 * P);
  }
  /* chunk rounding: each family reserves whole 64 MiB chunks */
  in = input("gpt2", 1ull << 50, 1ull << 50, 1ull << 50);
  REQUIRE(ferry_plan_compute(&in, &r, NULL, 0) == 0);
  uint64_t ch = 64ull << 20;
  EXPECT(r.cand[FERRY_PLACE_ZERO_OFFLOAD].bytes[FERRY_PLAN_HOST][FERRY_FAM_MASTER] ==
         (4 * r.params + ch - 1) / ch * ch);
}

static void test_activations(void) {
  ferry_plan_input in = input("gpt2", 1ull << 50, 1ull << 50, 0);
  in.chunk_size = 0;
  in.seq = 1024;
  in.batch = 4;
  in.checkpointing = 0;
  in.flash_attention = 0; /* the formula of a trainer that keeps the scores */
  ferry_plan_result r;
  REQUIRE(ferry_plan_compute(&in, &r, NULL, 0) == 0);
  /* Korthikanti et al. 2022: s b h (34 + 5 a s / h) per layer in 16 bits */
  double s = 1024, b = 4, h = 768, a = 12, L = 12, V = 50257;
  double layers = L * s * b * h * (34 + 5 * a * s / h);
  double head = 2 * 2 * s * b * h + V * s * b * 6;
  EXPECT(fabs((double)r.cand[0].bytes[FERRY_PLAN_GPU][FERRY_FAM_ACT] - (layers + head)) < 1);
  uint64_t full = r.cand[0].bytes[FERRY_PLAN_GPU][FERRY_FAM_ACT];
  in.checkpointing = 1;
  REQUIRE(ferry_plan_compute(&in, &r, NULL, 0) == 0);
  double ck = L * 2 * s * b * h + layers / L + head;
  EXPECT(fabs((double)r.cand[0].bytes[FERRY_PLAN_GPU][FERRY_FAM_ACT] - ck) < 1);
  EXPECT(r.cand[0].bytes[FERRY_PLAN_GPU][FERRY_FAM_ACT] < full);
  /* flash: ferry-gpt's CUDA block (tests/gpt/test_cuda_layout.c checks it
   * byte for byte), far below the scores' formula */
  in.flash_attention = 1;
  REQUIRE(ferry_plan_compute(&in, &r, NULL, 0) == 0);
  EXPECT((double)r.cand[0].bytes[FERRY_PLAN_GPU][FERRY_FAM_ACT] < ck);
  /* activations are the same in every placement */
  for (int p = 1; p < FERRY_PLACEMENTS; p++)
    EXPECT(r.cand[p].bytes[FERRY_PLAN_GPU][FERRY_FAM_ACT] ==
           r.cand[0].bytes[FERRY_PLAN_GPU][FERRY_FAM_ACT]);
}

static int has(const char *s, const char *needle) {
  if (strstr(s, needle)) return 1;
  fprintf(stderr, "  '%s' lacks '%s'\n", s, needle);
  return 0;
}

static void test_impossible(void) {
  /* 70B on a 16 GiB GPU with 16 GiB of RAM and no NVMe: nothing fits */
  ferry_plan_input in = input("llama-2-70b", 16ull << 30, 16ull << 30, 0);
  ferry_plan_result r;
  REQUIRE(ferry_plan_compute(&in, &r, NULL, 0) == 0);
  EXPECT(r.recommended == -1);
  for (int p = 0; p < FERRY_PLACEMENTS; p++) {
    EXPECT(!r.cand[p].fits && r.cand[p].max_batch == 0);
    EXPECT(has(r.cand[p].why, "short by"));
  }
  EXPECT(has(r.cand[FERRY_PLACE_ALL_GPU].why, "gpu short by"));
  EXPECT(has(r.cand[FERRY_PLACE_INFINITY].why, "nvme short by"));
  EXPECT(has(r.cand[FERRY_PLACE_INFINITY].why, "budget 0 B"));
  /* the shortfall is exact: bytes - budget */
  const ferry_plan_candidate *c = &r.cand[FERRY_PLACE_ZERO3_OFFLOAD];
  EXPECT(c->short_by[FERRY_PLAN_HOST] == c->tier_bytes[FERRY_PLAN_HOST] - (16ull << 30));
  EXPECT(c->short_by[FERRY_PLAN_GPU] == 0);
  /* the closest is the one short by the fewest bytes */
  double best = 1e300;
  int bi = -1;
  for (int p = 0; p < FERRY_PLACEMENTS; p++) {
    double s = 0;
    for (int t = 0; t < FERRY_PLAN_TIERS; t++) s += (double)r.cand[p].short_by[t];
    if (s < best) best = s, bi = p;
  }
  EXPECT(r.closest == bi);

  char why[256];
  in = input("gpt2", 8ull << 30, 8ull << 30, 0);
  in.seq = 2048;
  EXPECT(ferry_plan_compute(&in, &r, why, sizeof why) == FERRY_EINVAL);
  EXPECT(has(why, "at most 1024"));
  in.seq = 512;
  in.batch = 0;
  EXPECT(ferry_plan_compute(&in, &r, why, sizeof why) == FERRY_EINVAL && has(why, "batch 0"));
  in.batch = 1;
  in.bw.h2d_gbps = 0;
  EXPECT(ferry_plan_compute(&in, &r, why, sizeof why) == FERRY_EINVAL && has(why, "h2d_gbps"));
}

static void test_recommend_and_batch(void) {
  /* llama-2-13b on 24 GB / 128 GB / 2 TB: the NVMe-optimizer placement wins */
  ferry_plan_input in = input("llama-2-13b", (uint64_t)(24.0 * 0.95 * (1ull << 30)),
                              (uint64_t)(128.0 * 0.8 * (1ull << 30)), 2ull << 40);
  in.seq = 2048;
  ferry_plan_result r;
  REQUIRE(ferry_plan_compute(&in, &r, NULL, 0) == 0);
  EXPECT(r.recommended == FERRY_PLACE_NVME_OPT);
  EXPECT(!r.cand[FERRY_PLACE_ALL_GPU].fits && !r.cand[FERRY_PLACE_ZERO_OFFLOAD].fits);
  EXPECT(!r.cand[FERRY_PLACE_ZERO3_OFFLOAD].fits && r.cand[FERRY_PLACE_INFINITY].fits);
  EXPECT(r.cand[FERRY_PLACE_NVME_OPT].bottleneck == FERRY_COMP_NVME);
  for (int p = 0; p < FERRY_PLACEMENTS; p++) {
    const ferry_plan_candidate *c = &r.cand[p];
    double mx = 0, sum = 0;
    for (int k = 0; k < FERRY_COMPONENTS; k++) {
      mx = fmax(mx, c->seconds[k]);
      sum += c->seconds[k];
    }
    EXPECT(c->seconds[c->bottleneck] == mx);
    EXPECT(c->step_seconds >= mx && c->step_seconds <= sum + 1e-12);
    if (!c->fits) continue;
    /* the largest batch fits, one more does not */
    ferry_plan_input b = in;
    ferry_plan_result rb;
    b.batch = c->max_batch;
    REQUIRE(ferry_plan_compute(&b, &rb, NULL, 0) == 0);
    EXPECT(rb.cand[p].fits);
    b.batch = c->max_batch + 1;
    REQUIRE(ferry_plan_compute(&b, &rb, NULL, 0) == 0);
    EXPECT(!rb.cand[p].fits && rb.cand[p].short_by[FERRY_PLAN_GPU] > 0);
  }
  /* compute: 6 P T (+ 2 P T recomputed) + attention 12 L S h T (x 4/3) */
  double P = (double)r.params, T = 2048, L = 40, h = 5120;
  EXPECT(fabs(r.cand[1].flops - (8 * P * T + 16 * L * 2048 * h * T)) < 1e3);
  EXPECT(fabs(r.cand[1].seconds[FERRY_COMP_COMPUTE] - r.cand[1].flops / 50e12) < 1e-9);
  /* traffic: ZeRO-Infinity reads and writes 12 B/param of fp32 state; the
   * 16-bit params are written once; every group stays in the 102 GiB host
   * pool (42 groups cached at each turn; the step's commit keeps the new
   * params in the host copy), so none is read */
  const ferry_plan_candidate *inf = &r.cand[FERRY_PLACE_INFINITY];
  EXPECT(inf->cached_groups_host == 42);
  EXPECT(fabs(inf->nvme_read[FERRY_PLAN_NV_OPTIM] / (12 * P) - 1) < 1e-4);
  EXPECT(inf->nvme_read[FERRY_PLAN_NV_PARAMS] == 0);
  EXPECT(inf->nvme_read[FERRY_PLAN_NV_GRADS] == 0 && inf->nvme_write[FERRY_PLAN_NV_GRADS] == 0);
  EXPECT(fabs(inf->nvme_read_bytes / (12 * P) - 1) < 1e-4);
  EXPECT(fabs(inf->nvme_write_bytes / (14 * P) - 1) < 1e-4);
  EXPECT(inf->h2d_bytes == 4 * P && inf->d2h_bytes == 2 * P);
  /* grads "none": the optimizer reads the 16-bit grads, no accumulation pass */
  EXPECT(fabs(inf->seconds[FERRY_COMP_CPU] - P * 28 / 25e9) < 1e-9);
  /* a tight host budget, a MiB above the least: the working set's two
   * param groups (and a quarter of its slack) hold the head and two blocks
   * at the forward -> backward turn, the embedding and two blocks at the
   * other */
  ferry_plan_input t = in;
  t.budget[FERRY_PLAN_HOST] = inf->tier_bytes[FERRY_PLAN_HOST] + (1 << 20);
  ferry_plan_result rt;
  REQUIRE(ferry_plan_compute(&t, &rt, NULL, 0) == 0);
  const ferry_plan_candidate *ti = &rt.cand[FERRY_PLACE_INFINITY];
  double head = 2.0 * (double)ferry_plan_head_params(&in.model);
  double emb = 2.0 * (double)ferry_plan_embed_params(&in.model);
  double blk = 2.0 * (double)ferry_plan_block_params(&in.model);
  EXPECT(ti->fits && ti->cached_groups_host == 3);
  EXPECT(fabs(ti->nvme_read[FERRY_PLAN_NV_PARAMS] / (4 * P - head - emb - 4 * blk) - 1) < 1e-4);
  /* at the least, the room is the embedding and two blocks, 10 KiB short
   * of the head (its norm) and two: the head and a block at that turn, and
   * of the next block all its chunks but the first (its first norm and
   * q_proj, 52.4 MB), as the cap evicts a group's chunks first to last */
  t.budget[FERRY_PLAN_HOST] = inf->tier_bytes[FERRY_PLAN_HOST];
  REQUIRE(ferry_plan_compute(&t, &rt, NULL, 0) == 0);
  ti = &rt.cand[FERRY_PLACE_INFINITY];
  double first = 2.0 * (5120 + 5120 * 5120);
  EXPECT(ti->fits && ti->cached_groups_host == 2);
  EXPECT(fabs(ti->nvme_read[FERRY_PLAN_NV_PARAMS] / (4 * P - head - emb - 4 * blk + first) - 1) <
         1e-5);
  /* NVMe grads: written per micro-batch, read back A - 1 times and by the step */
  t = in;
  t.grad_accumulation = 4;
  REQUIRE(ferry_plan_compute(&t, &rt, NULL, 0) == 0);
  ti = &rt.cand[FERRY_PLACE_INFINITY];
  EXPECT(ti->grads == FERRY_PLAN_GRADS_NVME);
  EXPECT(fabs(ti->nvme_write[FERRY_PLAN_NV_GRADS] / (16 * P) - 1) < 1e-4);
  EXPECT(fabs(ti->nvme_read[FERRY_PLAN_NV_GRADS] / (16 * P) - 1) < 1e-4);
  /* a small model on a big GPU: all on the device */
  in = input("gpt2", 24ull << 30, 64ull << 30, 0);
  REQUIRE(ferry_plan_compute(&in, &r, NULL, 0) == 0);
  EXPECT(r.recommended == FERRY_PLACE_ALL_GPU);
  EXPECT(r.cand[0].max_batch >= 1);
}

static void test_profile(void) {
  ferry_plan_bandwidth bw = ferry_plan_bandwidth_default();
  EXPECT(bw.measured == 0 && bw.h2d_gbps == 25 && bw.nvme_read_gbps == 3.5);
  const char *good = "{\"format\": \"ferry-profile\", \"version\": 1, \"machine\": \"box\","
                     " \"h2d_gbps\": 12.5, \"nvme_read_gbps\": 7, \"device_tflops\": 80,"
                     " \"sources\": {\"h2d_gbps\": \"ferry bench copy\"}}";
  char why[512];
  REQUIRE(ferry_plan_profile_parse(good, strlen(good), "p.json", &bw, why, sizeof why) == 0);
  EXPECT(bw.h2d_gbps == 12.5 && bw.nvme_read_gbps == 7 && bw.device_tflops == 80);
  EXPECT(bw.device_tflops_fp32 == 20 && bw.d2h_gbps == 25);
  EXPECT(bw.measured == (FERRY_PLAN_BW_H2D | FERRY_PLAN_BW_NVME_READ | FERRY_PLAN_BW_TFLOPS));
  static const struct {
    const char *text, *needle;
  } bad[] = {
      {"{\"format\": \"ferry-profile\", \"version\": 1, \"h2d_gbs\": 1}", "unknown key \"h2d_gbs\""},
      {"{\"format\": \"ferry-profile\", \"version\": 1, \"h2d_gbps\": -1}", "\"h2d_gbps\" must be"},
      {"{\"format\": \"ferry-profile\", \"version\": 1, \"h2d_gbps\": \"9\"}", "must be a number"},
      {"{\"version\": 1}", "\"format\""},
      {"{\"format\": \"ferry-profile\", \"version\": 2}", "version"},
      {"{\"format\": \"ferry-profile\", \"version\": 1,}", "not valid JSON"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ferry_plan_bandwidth b2 = ferry_plan_bandwidth_default();
    EXPECT(ferry_plan_profile_parse(bad[i].text, strlen(bad[i].text), "p.json", &b2, why,
                                    sizeof why) == FERRY_ECONFIG);
    EXPECT(has(why, bad[i].needle) && has(why, "p.json"));
    EXPECT(b2.h2d_gbps == 25); /* a refused profile changes nothing */
  }
}

/* Peak RSS: budgets, the CPU model's memory on --device host, the library
 * and, on CUDA, the context; --device host computes activations in fp32. */
static void test_rss(void) {
  ferry_plan_input in = input("gpt2", 32ull << 20, 64ull << 20, 1ull << 30);
  in.seq = 256;
  ferry_plan_result r;
  REQUIRE(ferry_plan_compute(&in, &r, NULL, 0) == 0);
  const ferry_plan_rss *c = &r.cand[FERRY_PLACE_INFINITY].rss;
  EXPECT(c->host_budget == 64ull << 20 && c->device_budget == 0 && c->activations == 0);
  EXPECT(c->library == FERRY_PLAN_LIBRARY_OVERHEAD && c->cuda == FERRY_PLAN_CUDA_HOST_BYTES);
  EXPECT(c->scratch == 8 * 256); /* token ids in and out */
  EXPECT(c->total == c->host_budget + c->scratch + c->library + c->cuda);
  uint64_t act16 = r.cand[0].bytes[FERRY_PLAN_GPU][FERRY_FAM_ACT];
  in.device = FERRY_PLAN_DEV_HOST;
  REQUIRE(ferry_plan_compute(&in, &r, NULL, 0) == 0);
  c = &r.cand[FERRY_PLACE_INFINITY].rss;
  /* the emulated device's budget and the CPU model's fp32 activations are host RAM */
  EXPECT(r.cand[0].bytes[FERRY_PLAN_GPU][FERRY_FAM_ACT] == 0);
  EXPECT(c->device_budget == 32ull << 20 && c->cuda == 0);
  EXPECT(c->activations > act16); /* fp32 activations and backward scratch */
  double E = (double)ferry_plan_embed_params(&in.model);
  double B = (double)ferry_plan_block_params(&in.model);
  EXPECT(c->scratch == (uint64_t)(8 * 256 + 8 * (E + B)));
  EXPECT(c->total ==
         c->host_budget + c->device_budget + c->activations + c->scratch + c->library);
}

/* Compact optimizer state (issue 22): bytes per param from the optimizer's
 * own formulas, int8 < bf16 < fp32 in every family and NVMe count, the
 * llama-2-13b NVMe-bound step >= 2.5x shorter with a bf16 master and int8
 * states, and the combinations the planner refuses. */
static void test_compact_state(void) {
  static const int sdt[] = {FERRY_DT_F32, FERRY_DT_BF16, FERRY_DT_I8, FERRY_DT_I8};
  static const int mdt[] = {FERRY_DT_F32, FERRY_DT_F32, FERRY_DT_F32, FERRY_DT_BF16};
  /* AdamW, bf16 grads and copy: 28 / 20 / 16.0625 / 10.0625 (optim.h) */
  static const double step_bpp[] = {28, 20, 16.0625, 10.0625};
  static const double home_bpp[] = {12, 8, 6.03125, 2.03125};
  ferry_plan_result r[4];
  for (int i = 0; i < 4; i++) {
    ferry_plan_input in = input("llama-2-13b", 24ull << 30, 32ull << 30, 2ull << 40);
    in.seq = 2048;
    in.state_dtype = sdt[i];
    in.master_dtype = mdt[i];
    REQUIRE(ferry_plan_compute(&in, &r[i], NULL, 0) == 0);
    const ferry_plan_candidate *no = &r[i].cand[FERRY_PLACE_NVME_OPT];
    EXPECT_NEAR(no->optim_bytes_per_param, home_bpp[i], 1e-9);
    /* eager step (grads "none"): the drained bf16 grads are what it reads */
    EXPECT_NEAR(no->step_bytes_per_param, step_bpp[i], 1e-9);
    EXPECT_NEAR(no->seconds[FERRY_COMP_CPU],
                (double)r[i].params * step_bpp[i] / (in.bw.cpu_optimizer_gbps * 1e9), 1e-6);
    /* the optimizer family on NVMe: read and written once a step */
    double fam = no->nvme_read[FERRY_PLAN_NV_OPTIM];
    EXPECT_NEAR(fam / ((double)r[i].params * home_bpp[i]), 1.0, 0.001);
    EXPECT_NEAR(no->nvme_write[FERRY_PLAN_NV_OPTIM], fam, 1);
    /* ZeRO-Infinity: a bf16 master is the params, counted once: written
     * once by the step as with an fp32 master, read at most for forward and
     * backward (the step stages them from the host copy backward fetched:
     * no read of its own); no master bytes */
    const ferry_plan_candidate *zi = &r[i].cand[FERRY_PLACE_INFINITY];
    double pf = 2.0 * (double)r[i].params;
    EXPECT_NEAR(zi->nvme_write[FERRY_PLAN_NV_PARAMS],
                r[0].cand[FERRY_PLACE_INFINITY].nvme_write[FERRY_PLAN_NV_PARAMS], 1);
    EXPECT(zi->nvme_read[FERRY_PLAN_NV_PARAMS] >= 0 && zi->nvme_read[FERRY_PLAN_NV_PARAMS] < 2 * pf);
    EXPECT_NEAR(zi->nvme_read[FERRY_PLAN_NV_OPTIM], fam, 1);
    if (mdt[i] == FERRY_DT_BF16) EXPECT_EQ_INT(no->bytes[FERRY_PLAN_NVME][FERRY_FAM_MASTER], 0);
  }
  /* monotone: int8 < bf16 < fp32 in every count that holds states */
  for (int i = 1; i < 4; i++) {
    for (int p = FERRY_PLACE_ZERO_OFFLOAD; p < FERRY_PLACEMENTS; p++) {
      const ferry_plan_candidate *a = &r[i - 1].cand[p], *b = &r[i].cand[p];
      int home = p >= FERRY_PLACE_NVME_OPT ? FERRY_PLAN_NVME : FERRY_PLAN_HOST;
      EXPECT(b->bytes[home][FERRY_FAM_OPTIM] + b->bytes[home][FERRY_FAM_MASTER] <
             a->bytes[home][FERRY_FAM_OPTIM] + a->bytes[home][FERRY_FAM_MASTER]);
      EXPECT(b->step_bytes_per_param < a->step_bytes_per_param);
      EXPECT(b->seconds[FERRY_COMP_CPU] < a->seconds[FERRY_COMP_CPU]);
      if (p >= FERRY_PLACE_NVME_OPT) {
        EXPECT(b->nvme_read_bytes < a->nvme_read_bytes);
        EXPECT(b->nvme_write_bytes < a->nvme_write_bytes);
        EXPECT(b->tier_bytes[FERRY_PLAN_NVME] < a->tier_bytes[FERRY_PLAN_NVME]);
      }
    }
  }
  /* the target: llama-2-13b, one drive, NVMe-bound (nvme-optimizer, ~97 s
   * with fp32): >= 2.5x shorter with a bf16 master and int8 states */
  const ferry_plan_candidate *f32 = &r[0].cand[FERRY_PLACE_NVME_OPT];
  const ferry_plan_candidate *i8m = &r[3].cand[FERRY_PLACE_NVME_OPT];
  EXPECT_EQ_INT(f32->bottleneck, FERRY_COMP_NVME);
  EXPECT(f32->step_seconds > 90);
  printf("llama-2-13b nvme-optimizer step: fp32 %.3f s, bf16 %.3f, int8 %.3f, bf16 master + "
         "int8 %.3f (%.2fx)\n", f32->step_seconds, r[1].cand[FERRY_PLACE_NVME_OPT].step_seconds,
         r[2].cand[FERRY_PLACE_NVME_OPT].step_seconds, i8m->step_seconds,
         f32->step_seconds / i8m->step_seconds);
  EXPECT(f32->step_seconds / i8m->step_seconds >= 2.5);
  EXPECT(f32->seconds[FERRY_COMP_NVME] / i8m->seconds[FERRY_COMP_NVME] >= 2.5);
  EXPECT(r[0].cand[FERRY_PLACE_INFINITY].step_seconds /
             r[3].cand[FERRY_PLACE_INFINITY].step_seconds >= 2.5);

  /* refused: a bf16 master over fp16 or fp32 params, a bad block, a bad dtype */
  ferry_plan_input in = input("gpt2", 24ull << 30, 32ull << 30, 0);
  ferry_plan_result x;
  char why[256];
  in.master_dtype = FERRY_DT_BF16;
  in.precision = FERRY_PREC_FP32;
  EXPECT_EQ_INT(ferry_plan_compute(&in, &x, why, sizeof why), FERRY_EINVAL);
  EXPECT(strstr(why, "precision.master") && strstr(why, "fp32"));
  in.precision = FERRY_PREC_FP16;
  EXPECT_EQ_INT(ferry_plan_compute(&in, &x, why, sizeof why), FERRY_EINVAL);
  in.precision = FERRY_PREC_BF16;
  EXPECT_EQ_INT(ferry_plan_compute(&in, &x, why, sizeof why), 0);
  in.state_dtype = FERRY_DT_I8;
  in.state_block = 100;
  EXPECT_EQ_INT(ferry_plan_compute(&in, &x, why, sizeof why), FERRY_EINVAL);
  EXPECT(strstr(why, "optimizer.state_block") != NULL);
  in.state_block = 64; /* a smaller block: more absmax bytes */
  EXPECT_EQ_INT(ferry_plan_compute(&in, &x, why, sizeof why), 0);
  EXPECT_NEAR(x.cand[FERRY_PLACE_NVME_OPT].optim_bytes_per_param, 2 * (1 + 4.0 / 64), 1e-9);
  in.state_dtype = FERRY_DT_F16;
  EXPECT_EQ_INT(ferry_plan_compute(&in, &x, why, sizeof why), FERRY_EINVAL);
  EXPECT(strstr(why, "optimizer.state_dtype") != NULL);
}

/* plan/footprint.c by hand: staging, one step's need, the read-ahead's
 * room and the swap files (the engine's finalize counts with the same). */
static void test_footprint(void) {
  ferry_footprint_engine fe;
  memset(&fe, 0, sizeof fe);
  fe.group_n = 1000;
  fe.esize = 2;
  fe.page = 4096;
  fe.drain_staged = 1;
  fe.params_off_device = 1;
  ferry_footprint_staging st;
  ferry_footprint_staging_bytes(&fe, &st);
  EXPECT(st.drain == 2 * 4096 && st.upload == 0 && st.commit == 2000 && st.reduce == 0);
  EXPECT(st.total == 2 * 4096 + 2000);
  fe.drain_staged = 0; /* the GPU's own math: its sums instead */
  fe.gpu_sums = 144;
  fe.params_sharded = 1;
  fe.reduce = 100;
  ferry_footprint_staging_bytes(&fe, &st);
  EXPECT(st.drain == 144 && st.reduce == 100 + 2 * 4096);
  const ferry_tier home[FERRY_FAMILIES] = {FERRY_TIER_NVME, FERRY_TIER_HOST, FERRY_TIER_NVME};
  ferry_footprint_family fam[FERRY_FAMILIES] = {
      {100, 1000, 60, 20}, {40, 400, 40, 10}, {300, 3000, 90, 40}};
  ferry_footprint_host n;
  ferry_footprint_host_need(home, fam, &n);
  EXPECT(n.optim == 300 && n.grads == 0 && n.params == 200 && n.slack == 180);
  EXPECT(n.home[FERRY_FAMILY_GRADS] == 400 && n.total == 300 + 200 + 180 + 400);
  EXPECT(ferry_footprint_nvme_files(home, fam) == 1000 + 60 + 3000 + 90);
  /* extra spares of min(chunk size, largest) within 1%: 3000 / 100 / 10 = 3 */
  EXPECT(ferry_footprint_nvme_swap(home, fam, 10) == 1000 + 60 + 1 * 10 + 3000 + 90 + 3 * 10);
  size_t ahead;
  int optim_ahead;
  ferry_footprint_read_ahead(n.total + 500, 100, &n, &ahead, &optim_ahead);
  EXPECT(ahead == 4 && optim_ahead == 1); /* 400 left: four groups of params, one of state */
  ferry_footprint_read_ahead(n.total + 350, 100, &n, &ahead, &optim_ahead);
  EXPECT(ahead == 2 && optim_ahead == 0);
  ferry_footprint_read_ahead(n.total, 100, &n, &ahead, &optim_ahead);
  EXPECT(ahead == 0 && optim_ahead == 0);
}

/* The NVMe fit holds the swap files against the budget, not the data: a
 * budget between the two is short by the files' excess, named in why. */
static void test_nvme_files_fit(void) {
  ferry_plan_input in = ferry_plan_input_default();
  char why[256];
  REQUIRE(ferry_plan_model_preset("llama-1b", &in.model, why, sizeof why) == 0);
  in.budget[FERRY_PLAN_GPU] = in.budget[FERRY_PLAN_HOST] = 1ull << 40;
  in.budget[FERRY_PLAN_NVME] = 1ull << 40;
  ferry_plan_result r;
  REQUIRE(ferry_plan_compute(&in, &r, why, sizeof why) == 0);
  const ferry_plan_candidate *c = &r.cand[FERRY_PLACE_INFINITY];
  uint64_t data = c->tier_bytes[FERRY_PLAN_NVME], files = c->nvme_file_bytes;
  EXPECT(files > data && c->fits);
  in.budget[FERRY_PLAN_NVME] = (data + files) / 2;
  REQUIRE(ferry_plan_compute(&in, &r, why, sizeof why) == 0);
  c = &r.cand[FERRY_PLACE_INFINITY];
  EXPECT(!c->fits && c->short_by[FERRY_PLAN_NVME] == files - in.budget[FERRY_PLAN_NVME]);
  EXPECT(strstr(c->why, "nvme short by") != NULL);
  in.budget[FERRY_PLAN_NVME] = files;
  REQUIRE(ferry_plan_compute(&in, &r, why, sizeof why) == 0);
  EXPECT(r.cand[FERRY_PLACE_INFINITY].fits);
}

int main(void) {
  test_nvme_files_fit();
  test_footprint();
  test_compact_state();
  test_rss();
  test_deepspeed();
  test_families();
  test_activations();
  test_impossible();
  test_recommend_and_batch();
  test_profile();
  return test_finish("plan.placements");
}
