/* tests/plan/test_host.c — the plan on the host backend (argv[1] = the ferry
 * binary, argv[2] = a scratch folder): the largest batch is held to the
 * machine's RAM (or, RAM unknown, the emulated device's budget), the text
 * names the compute figure the step uses and where it came from, and
 * --write-config asks for no pinning the host backend's RLIMIT_MEMLOCK
 * refuses (a cuda pool stays pinned: the driver pins outside the limit);
 * the step during backward as two phases, with NVMe (backward I/O).
 */
#include "ferry.h"
#include "plan/plan.h"
#include "tests/plan/profile_util.h"
#include "tests/test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static const char *bin, *dir;
static char out[1 << 18];

static int run(const char *args) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "%s 2>&1", args);
  FILE *p = popen(cmd, "r");
  REQUIRE(p);
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static ferry_plan_input host_input(uint64_t ram) {
  ferry_plan_input in = ferry_plan_input_default();
  REQUIRE(ferry_plan_model_preset("gpt2", &in.model, NULL, 0) == 0);
  in.device = FERRY_PLAN_DEV_HOST;
  in.seq = 128;
  in.budget[FERRY_PLAN_GPU] = 4ull << 30;
  in.budget[FERRY_PLAN_HOST] = 2ull << 30;
  in.host_ram = ram;
  return in;
}

static ferry_plan_candidate plan_at(ferry_plan_input in, int64_t batch) {
  in.batch = batch;
  ferry_plan_result r;
  REQUIRE(ferry_plan_compute(&in, &r, NULL, 0) == 0);
  return r.cand[FERRY_PLACE_ZERO_OFFLOAD];
}

/* The largest batch keeps the peak RSS within the RAM; one more exceeds it. */
static void test_batch_ram(void) {
  ferry_plan_input in = host_input(16ull << 30);
  ferry_plan_candidate c = plan_at(in, 1);
  EXPECT(c.max_batch > 1 && c.max_batch < (1ll << 20));
  EXPECT(plan_at(in, c.max_batch).rss.total <= in.host_ram);
  EXPECT(plan_at(in, c.max_batch + 1).rss.total > in.host_ram);
  /* more RAM, a larger batch */
  ferry_plan_candidate d = plan_at(host_input(32ull << 30), 1);
  EXPECT(d.max_batch > c.max_batch);
  /* RAM unknown: the activations within the device budget */
  ferry_plan_input u = host_input(0);
  ferry_plan_candidate e = plan_at(u, 1);
  EXPECT(e.max_batch > 1 && e.max_batch < (1ll << 20));
  EXPECT(plan_at(u, e.max_batch).rss.activations <= u.budget[FERRY_PLAN_GPU]);
  EXPECT(plan_at(u, e.max_batch + 1).rss.activations > u.budget[FERRY_PLAN_GPU]);
  /* RAM below batch 1's RSS (both budgets beside it): batch 1, no growth */
  ferry_plan_candidate f = plan_at(host_input(1ull << 30), 1);
  EXPECT_EQ_INT((int)f.max_batch, 1);
}

/* The compute figure a step uses, by device and precision. */
static void test_compute_figure(void) {
  ferry_plan_input in = host_input(16ull << 30);
  in.bw.device_tflops = 40, in.bw.device_tflops_fp32 = 0.2;
  unsigned bit = 0;
  EXPECT(ferry_plan_compute_tflops(&in, &bit) == 0.2 && bit == FERRY_PLAN_BW_TFLOPS32);
  in.device = FERRY_PLAN_DEV_CUDA;
  EXPECT(ferry_plan_compute_tflops(&in, &bit) == 40 && bit == FERRY_PLAN_BW_TFLOPS);
  in.precision = FERRY_PREC_FP32;
  EXPECT(ferry_plan_compute_tflops(&in, &bit) == 0.2 && bit == FERRY_PLAN_BW_TFLOPS32);
}

/* TinyLlama through zero-infinity at the minimum budgets, with the quiet
 * machine's profile (docs/PERFORMANCE.md): the step during backward runs
 * the optimizer's NVMe traffic in backward only, so the plan is the
 * forward's compute and the backward's drive one after the other, not the
 * two overlapped (9.04 s there, against 12.4-13.3 measured); with room to
 * read ahead the drive no longer waits out each group's update. */
static void test_backward_io(void) {
  ferry_plan_input in = ferry_plan_input_default();
  REQUIRE(ferry_plan_model_preset("llama-1b", &in.model, NULL, 0) == 0);
  in.device = FERRY_PLAN_DEV_HOST;
  in.seq = 128;
  in.checkpointing = 0;
  in.chunk_size = 64ull << 20;
  in.bw.h2d_gbps = 12.1201, in.bw.d2h_gbps = 31.2716;
  in.bw.nvme_read_gbps = 2.74203, in.bw.nvme_write_gbps = 6.10152;
  in.bw.cpu_optimizer_gbps = 49.5759, in.bw.device_tflops_fp32 = 0.130181;
  for (int t = 0; t < FERRY_PLAN_TIERS; t++) in.budget[t] = 1ull << 40;
  ferry_plan_result r;
  REQUIRE(ferry_plan_compute(&in, &r, NULL, 0) == 0);
  uint64_t host = r.cand[FERRY_PLACE_INFINITY].tier_bytes[FERRY_PLAN_HOST];
  in.budget[FERRY_PLAN_GPU] = r.cand[FERRY_PLACE_INFINITY].tier_bytes[FERRY_PLAN_GPU];
  double step[2];
  for (int x = 1; x <= 2; x++) {
    in.budget[FERRY_PLAN_HOST] = x * host;
    REQUIRE(ferry_plan_compute(&in, &r, NULL, 0) == 0);
    const ferry_plan_candidate *c = &r.cand[FERRY_PLACE_INFINITY];
    EXPECT(c->fits && c->grads == FERRY_PLAN_GRADS_NONE);
    EXPECT_EQ_INT(c->readahead_fits, x == 2);
    const double *s = c->seconds;
    double fwd = s[FERRY_COMP_COMPUTE] / 3;
    double bwd_nvme = s[FERRY_COMP_NVME] -
                      c->nvme_read[FERRY_PLAN_NV_PARAMS] / 2 / (in.bw.nvme_read_gbps * 1e9);
    double wait = x == 1 ? s[FERRY_COMP_CPU] : 0;
    EXPECT(c->backward_io_seconds > 0);
    EXPECT(c->step_seconds >= fwd + bwd_nvme + wait);
    double sum = 0;
    for (int k = 0; k < FERRY_COMPONENTS; k++) sum += s[k];
    EXPECT(c->step_seconds <= sum);
    step[x - 1] = c->step_seconds;
    printf("llama-1b zero-infinity host x%d: step %.3f s (backward I/O %.3f)\n", x,
           c->step_seconds, c->backward_io_seconds);
  }
  /* within 20% of the quiet machine's 12.4-13.3 s at the minimum */
  EXPECT(step[0] >= 0.8 * 13.34 && step[0] <= 1.2 * 12.38);
  EXPECT(step[1] < step[0]);
  /* the text names the term, from the same figures in a profile */
  char cmd[4096], prof[1024];
  snprintf(prof, sizeof prof, "%s/backward-io-profile.json", dir);
  write_profile(prof, "\"h2d_gbps\": 12.1201, \"d2h_gbps\": 31.2716, \"nvme_read_gbps\": 2.74203, "
                      "\"nvme_write_gbps\": 6.10152, \"cpu_optimizer_gbps\": 49.5759, "
                      "\"device_tflops_fp32\": 0.130181");
  snprintf(cmd, sizeof cmd, "'%s' plan --model llama-1b --device host --gpu-budget %llu "
           "--host-budget %llu --nvme 1T --seq 128 --chunk-size 64M --checkpointing off "
           "--profile '%s'", bin, (unsigned long long)in.budget[FERRY_PLAN_GPU],
           (unsigned long long)host, prof);
  EXPECT_EQ_INT(run(cmd), 0);
  EXPECT(strstr(out, "recommended: zero-infinity") && strstr(out, "  backward I/O  "));
  char want[64];
  snprintf(want, sizeof want, "step ~ %.3f s", step[0]);
  EXPECT(strstr(out, want) && strstr(out, "each group's state read after the group before it"));
  /* nothing on NVMe, or a GPU: the lanes overlap over the whole step */
  in.budget[FERRY_PLAN_HOST] = 1ull << 40;
  REQUIRE(ferry_plan_compute(&in, &r, NULL, 0) == 0);
  EXPECT(r.cand[FERRY_PLACE_ZERO3_OFFLOAD].backward_io_seconds == 0);
  in.device = FERRY_PLAN_DEV_CUDA;
  REQUIRE(ferry_plan_compute(&in, &r, NULL, 0) == 0);
  EXPECT(r.cand[FERRY_PLACE_INFINITY].backward_io_seconds == 0);
}

static void test_cli(void) {
  char cmd[4096], cfg[1024], prof[1024];
  snprintf(cfg, sizeof cfg, "%s/host.cfg", dir);
  snprintf(prof, sizeof prof, "%s/host-profile.json", dir);
  /* the text: the figure used, where it came from; a sane largest batch */
  snprintf(cmd, sizeof cmd, "'%s' plan --model gpt2 --device host --gpu-budget 1G "
           "--host-budget 2G --seq 128 --write-config '%s'", bin, cfg);
  EXPECT_EQ_INT(run(cmd), 0);
  EXPECT(strstr(out, "device_tflops_fp32 12.5, default"));
  const char *lb = strstr(out, "largest batch at seq 128: "); /* this machine's RAM */
  EXPECT(lb && atoll(lb + 26) >= 1 && atoll(lb + 26) < 100000);
  EXPECT(!strstr(out, "16777216"));
  ferry_config *c = NULL;
  char v[64] = "";
  REQUIRE(ferry_config_create(&c) == 0);
  EXPECT(ferry_config_load_file(c, cfg) == 0);
  EXPECT(ferry_config_get(c, "tiers.host.pinned", v, sizeof v) == 0 && !strcmp(v, "false"));
  ferry_config_destroy(c);
  /* a profile's figure is named as such */
  write_profile(prof, "\"device_tflops_fp32\": 0.15");
  snprintf(cmd, sizeof cmd, "'%s' plan --model gpt2 --device host --gpu-budget 4G "
           "--host-mem 16G --seq 128 --profile '%s'", bin, prof);
  EXPECT_EQ_INT(run(cmd), 0);
  EXPECT(strstr(out, "device_tflops_fp32 0.15, from the profile"));
  /* cuda under an 8 MiB RLIMIT_MEMLOCK: the driver pins outside the limit
   * (memory/tier.c: the engine warns and continues), so the pool stays
   * pinned, and the text says why instead of asking for a larger limit */
  remove(cfg);
  snprintf(cmd, sizeof cmd, "ulimit -l 8192 && '%s' plan --model gpt2 --gpu-mem 24G "
           "--host-mem 64G --seq 128 --write-config '%s'", bin, cfg);
  EXPECT_EQ_INT(run(cmd), 0);
  EXPECT(strstr(out, "the CUDA driver pins outside that limit") || strstr(out, "must allow it"));
  REQUIRE(ferry_config_create(&c) == 0);
  EXPECT(ferry_config_load_file(c, cfg) == 0);
  EXPECT(ferry_config_get(c, "tiers.host.pinned", v, sizeof v) == 0 && !strcmp(v, "true"));
  ferry_config_destroy(c);
}

int main(int argc, char **argv) {
  REQUIRE(argc == 3);
  bin = argv[1], dir = argv[2];
  test_batch_ram();
  test_compute_figure();
  test_backward_io();
  test_cli();
  return test_finish("plan.host");
}
