/* tests/plan/test_cli.c — `ferry plan` as users run it (argv[1] = the ferry
 * binary, argv[2] = a scratch folder): --json has the documented keys and
 * every candidate, --write-config loads back with ferry_config_load_file,
 * --svg is written, profiles are read, and impossible requests exit non-zero
 * with what is short and by how much. With --gpus/--nodes/--zero-stage: one
 * rank prints what it printed before, ranks add their JSON keys and text
 * lines, a node's RAM and NVMe are split between its ranks, a slow network
 * is the bottleneck, --write-config writes dist.zero_stage, and bad values
 * are refused with the flag and value named.
 */
#include "ferry.h"
#include "core/json.h"
#include "plan/plan.h"
#include "tests/plan/profile_util.h"
#include "tests/test.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static const char *bin, *dir;
static char out[1 << 18];

/* Runs `ferry plan ARGS`, stdout (and stderr when `both`) into out. */
static int run(int both, const char *args) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "'%s' plan %s %s", bin, args, both ? "2>&1" : "2>/dev/null");
  FILE *p = popen(cmd, "r");
  REQUIRE(p);
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int has(const char *needle) {
  if (strstr(out, needle)) return 1;
  fprintf(stderr, "  output lacks '%s':\n%s\n", needle, out);
  return 0;
}

static const ferry_json_value *member(const ferry_json_value *o, const char *k, ferry_json_type t) {
  const ferry_json_value *v = ferry_json_get(o, k);
  if (!v || v->type != t) {
    fprintf(stderr, "  JSON key '%s' missing or of the wrong type\n", k);
    test_failures++;
    return NULL;
  }
  return v;
}

static void check_tiers(const ferry_json_value *tiers) {
  static const char *const names[] = {"gpu", "host", "nvme"};
  for (int t = 0; t < 3 && tiers; t++) {
    const ferry_json_value *o = member(tiers, names[t], FERRY_JSON_OBJ);
    if (!o) continue;
    member(o, "bytes", FERRY_JSON_NUM);
    member(o, "budget", FERRY_JSON_NUM);
  }
}

static void test_json(void) {
  const char *args = "--model llama-2-13b --gpu-mem 24G --host-mem 128G --nvme 2T --batch 1 "
                     "--seq 2048 --json";
  EXPECT_EQ_INT(run(0, args), 0);
  ferry_json_value *v = NULL;
  char why[256];
  int rc = ferry_json_parse(out, strlen(out), &v, why, sizeof why);
  if (rc) fprintf(stderr, "  not JSON: %s\n%s\n", why, out);
  REQUIRE(rc == 0);
  const ferry_json_value *p = member(v, "params", FERRY_JSON_NUM);
  EXPECT(p && p->is_int && p->i == 13015864320ll);
  const ferry_json_value *pl = member(v, "placement", FERRY_JSON_STR);
  EXPECT(pl && !strcmp(pl->str, "nvme-optimizer"));
  const ferry_json_value *fits = member(v, "fits", FERRY_JSON_BOOL);
  EXPECT(fits && fits->b);
  check_tiers(member(v, "tiers", FERRY_JSON_OBJ));
  const ferry_json_value *gb =
      ferry_json_get(ferry_json_get(ferry_json_get(v, "tiers"), "gpu"), "budget");
  EXPECT(gb && gb->i == (int64_t)((double)(24ull << 30) * 0.95));
  const ferry_json_value *s = member(v, "step_seconds", FERRY_JSON_NUM);
  EXPECT(s && s->num > 0);
  const ferry_json_value *bn = member(v, "bottleneck", FERRY_JSON_STR);
  EXPECT(bn && !strcmp(bn->str, "nvme"));
  member(v, "max_batch", FERRY_JSON_NUM);
  const ferry_json_value *as = ferry_json_get(member(v, "bandwidths", FERRY_JSON_OBJ), "assumed");
  EXPECT(as && as->type == FERRY_JSON_ARR && as->n == 8);
  const ferry_json_value *c = member(v, "candidates", FERRY_JSON_ARR);
  REQUIRE(c && c->n == FERRY_PLACEMENTS);
  for (size_t i = 0; i < c->n; i++) {
    const ferry_json_value *e = &c->items[i];
    const ferry_json_value *nm = member(e, "placement", FERRY_JSON_STR);
    EXPECT(nm && !strcmp(nm->str, ferry_plan_placement_name((int)i)));
    member(e, "fits", FERRY_JSON_BOOL);
    member(e, "why", FERRY_JSON_STR);
    check_tiers(member(e, "tiers", FERRY_JSON_OBJ));
    member(e, "components", FERRY_JSON_OBJ);
    member(e, "step_seconds", FERRY_JSON_NUM);
    member(e, "bottleneck", FERRY_JSON_STR);
    const ferry_json_value *k = member(e, "placement_keys", FERRY_JSON_OBJ);
    const ferry_json_value *g = k ? member(k, "grads", FERRY_JSON_STR) : NULL;
    /* no clipping, bf16, one micro-batch: "auto" keeps no gradients off the GPU */
    EXPECT(g && !strcmp(g->str, i == 0 ? "gpu" : "none"));
    if (k) member(k, "params", FERRY_JSON_STR), member(k, "optimizer", FERRY_JSON_STR);
    const ferry_json_value *rss = member(e, "rss_bytes", FERRY_JSON_OBJ);
    const ferry_json_value *tot = rss ? member(rss, "total", FERRY_JSON_NUM) : NULL;
    const ferry_json_value *hb = rss ? member(rss, "host_budget", FERRY_JSON_NUM) : NULL;
    const ferry_json_value *cu = rss ? member(rss, "cuda_context", FERRY_JSON_NUM) : NULL;
    EXPECT(tot && hb && cu && hb->num == (double)(uint64_t)((double)(128ull << 30) * 0.8));
    EXPECT(tot && hb && cu && tot->num >= hb->num + cu->num + (64 << 20));
    const ferry_json_value *nv = member(e, "nvme_bytes_per_step", FERRY_JSON_OBJ);
    const ferry_json_value *rd = nv ? member(nv, "read", FERRY_JSON_OBJ) : NULL;
    const ferry_json_value *wr = nv ? member(nv, "write", FERRY_JSON_OBJ) : NULL;
    const ferry_json_value *ro = rd ? member(rd, "optimizer", FERRY_JSON_NUM) : NULL;
    if (wr) member(wr, "params", FERRY_JSON_NUM), member(wr, "grads", FERRY_JSON_NUM);
    EXPECT(ro && (i >= FERRY_PLACE_NVME_OPT ? ro->num > 12e9 * 13 : ro->num == 0));
  }
  ferry_json_free(v);
}

static void test_write_config(void) {
  char cfg[1024], args[2048];
  snprintf(cfg, sizeof cfg, "%s/plan-test.cfg", dir);
  remove(cfg);
  snprintf(args, sizeof args,
           "--model llama-2-13b --gpu-mem 24G --host-mem 128G --nvme-path '%s' --seq 2048 "
           "--optimizer lion --write-config '%s'", dir, cfg);
  int rc = run(1, args);
  /* the scratch folder's free space decides whether the NVMe placement fits */
  EXPECT(rc == 0 || rc == 1);
  if (rc == 1) EXPECT(has("nothing fits"));
  ferry_config *c = NULL;
  REQUIRE(ferry_config_create(&c) == 0);
  if (rc == 0) {
    int lrc = ferry_config_load_file(c, cfg);
    if (lrc) fprintf(stderr, "  %s\n", ferry_config_last_error(c));
    EXPECT(lrc == 0);
    char buf[1100];
    EXPECT(ferry_config_get(c, "optimizer.type", buf, sizeof buf) == 0 && !strcmp(buf, "lion"));
    EXPECT(ferry_config_get(c, "tiers.gpu.budget", buf, sizeof buf) == 0);
    EXPECT(strtoull(buf, NULL, 10) == (uint64_t)((double)(24ull << 30) * 0.95));
  }
  /* a placement that fits without NVMe, its tiers written */
  snprintf(args, sizeof args, "--model gpt2-xl --gpu-mem 12G --host-mem 64G --write-config '%s'",
           cfg);
  EXPECT_EQ_INT(run(1, args), 0);
  REQUIRE(ferry_config_load_file(c, cfg) == 0);
  char pp[64], po[64];
  ferry_config_get(c, "placement.params", pp, sizeof pp);
  ferry_config_get(c, "placement.optimizer", po, sizeof po);
  const char *wp, *wg, *wo;
  EXPECT(has("engine config for "));
  int found = 0;
  for (int p = 0; p < FERRY_PLACEMENTS; p++) {
    char line[128];
    snprintf(line, sizeof line, "engine config for %s written", ferry_plan_placement_name(p));
    if (!strstr(out, line)) continue;
    found = 1;
    ferry_plan_placement_tiers(p, &wp, &wg, &wo);
    EXPECT(!strcmp(pp, wp) && !strcmp(po, wo));
  }
  EXPECT(found);
  char pg[64], gp[64];
  ferry_config_get(c, "placement.grads", pg, sizeof pg);
  ferry_config_get(c, "precision.grads", gp, sizeof gp);
  EXPECT(!strcmp(pg, "gpu") || !strcmp(pg, "none"));
  EXPECT(!strcmp(gp, "fp32"));
  ferry_config_destroy(c);
  remove(cfg);
}

static void test_svg_and_profile(void) {
  char path[1024], prof[1024], args[3072];
  snprintf(path, sizeof path, "%s/plan-test.svg", dir);
  snprintf(prof, sizeof prof, "%s/plan-profile.json", dir);
  write_profile(prof, "\"h2d_gbps\": 11, \"d2h_gbps\": 12, \"nvme_read_gbps\": 6.5, "
                      "\"nvme_write_gbps\": 5, \"cpu_optimizer_gbps\": 40, \"device_tflops\": 100, "
                      "\"device_tflops_fp32\": 20, \"device_mem_gbps\": 1000");
  snprintf(args, sizeof args, "--model mistral-7b --gpu-mem 24G --host-mem 256G --nvme 1T "
           "--profile '%s' --svg '%s'", prof, path);
  EXPECT_EQ_INT(run(1, args), 0);
  EXPECT(!strstr(out, "assumed"));
  FILE *f = fopen(path, "r");
  REQUIRE(f);
  static char svg[1 << 16];
  size_t n = fread(svg, 1, sizeof svg - 1, f);
  svg[n] = '\0';
  fclose(f);
  EXPECT(strstr(svg, "<svg") != NULL && strstr(svg, "zero-infinity") != NULL);
  snprintf(args, sizeof args, "--model mistral-7b --gpu-mem 24G --host-mem 256G --json "
           "--profile '%s'", prof);
  EXPECT_EQ_INT(run(0, args), 0);
  EXPECT(has("\"assumed\":[]") && has("\"h2d_gbps\":11"));
  write_profile(prof, "\"pcie_gbps\": 11");
  snprintf(args, sizeof args, "--model gpt2 --gpu-mem 8G --host-mem 8G --profile '%s'", prof);
  EXPECT_EQ_INT(run(1, args), 2);
  EXPECT(has("unknown key \"pcie_gbps\""));
  remove(prof);
  remove(path);
}

static void test_impossible(void) {
  EXPECT_EQ_INT(run(1, "--model llama-2-70b --gpu-mem 8G --host-mem 16G"), 1);
  EXPECT(has("nothing fits") && has("short by") && has("no NVMe given"));
  EXPECT_EQ_INT(run(1, "--model llama-2-70b --gpu-mem 8G --host-mem 16G --json"), 1);
  EXPECT(has("\"fits\":false") && has("\"placement\":null") && has("\"closest\":"));
  static const struct {
    const char *args, *needle;
  } bad[] = {
      {"--model gpt2 --gpu-mem 0 --host-mem 8G", "--gpu-mem 0"},
      {"--model gpt2 --gpu-mem 8G --host-mem 0", "--host-mem 0"},
      {"--model gpt2 --gpu-mem 8G --host-mem 8G --nvme 0", "--nvme 0"},
      {"--model gpt2 --gpu-mem 12X --host-mem 8G", "not a size"},
      {"--model gpt2 --gpu-mem -5G --host-mem 8G", "not a size"},
      {"--model gpt2 --gpu-mem 8G --host-mem 8G --batch 0", "--batch '0'"},
      {"--model gpt2 --gpu-mem 8G --host-mem 8G --seq 4096", "at most 1024"},
      {"--model gpt5 --gpu-mem 8G --host-mem 8G", "unknown model preset 'gpt5'"},
      {"--model /nonexistent/config.json --gpu-mem 8G", "cannot open"},
      {"--params lots --gpu-mem 8G", "--params 'lots'"},
      {"--gpu-mem 8G", "give one of --model"},
      {"--model gpt2 --params 1B --gpu-mem 8G", "give one of --model"},
      {"--model gpt2 --gpu-mem 8G --precision fp8", "expected one of fp32 fp16 bf16"},
      {"--model gpt2 --gpu-mem 8G --nvme 1T --nvme-path /tmp", "not both"},
      {"--model gpt2 --frobnicate", "unknown option"},
      {"--model gpt2 --device host --host-mem 8G", "--gpu-budget"},
      {"--model gpt2 --gpu-mem 8G --gpu-budget 4G --host-mem 8G", "not both"},
      {"--model gpt2 --gpu-mem 8G --host-mem 8G --host-budget 4G", "not both"},
      {"--model gpt2 --gpu-budget 0 --host-mem 8G", "--gpu-budget 0"},
      {"--model gpt2 --gpu-mem 8G --host-mem 8G --clip-grad-norm -1", "--clip-grad-norm"},
      {"--model gpt2 --gpu-mem 8G --host-mem 8G --grad-precision fp16", "fp32 bf16"},
      {"--model gpt2 --gpu-mem 8G --host-mem 8G --grad-accumulation 0", "--grad-accumulation"},
      {"--model gpt2 --gpu-mem 8G --host-mem 8G --device tpu", "cuda host"},
      {"--largest --model gpt2 --gpu-mem 8G --host-mem 8G", "--largest"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = run(1, bad[i].args);
    if (rc != 2) fprintf(stderr, "  '%s' exited %d\n", bad[i].args, rc);
    EXPECT(rc == 2 && has(bad[i].needle));
  }
  /* no GPU here and no --gpu-mem: said so */
  ferry_gpu_info g[FERRY_MAX_GPUS];
  int n = 0;
  ferry_gpu_list(g, FERRY_MAX_GPUS, &n, NULL, 0);
  if (n == 0) {
    EXPECT_EQ_INT(run(1, "--model gpt2 --host-mem 8G"), 2);
    EXPECT(has("no GPU on this machine") && has("--gpu-mem"));
  }
  EXPECT_EQ_INT(run(1, "--help"), 0);
  EXPECT(has("usage: ferry plan") && has("exit status"));
  EXPECT_EQ_INT(run(1, "--list-models"), 0);
  EXPECT(has("13,015,864,320"));
  EXPECT_EQ_INT(run(1, "--params 13B --gpu-mem 24G --host-mem 512G"), 0);
  EXPECT(has("13,000,000,000 parameters"));
}

/* Exact budgets on the host backend: the budgets as given, both in the RSS
 * with the CPU model's activations, no CUDA context; kept gradients. */
static void test_exact_budgets(void) {
  EXPECT_EQ_INT(run(0, "--model gpt2 --device host --gpu-budget 2G --host-budget 4G --nvme 8G "
                       "--seq 256 --clip-grad-norm 1 --grad-precision bf16 --json"), 0);
  EXPECT(has("\"device\":\"host\"") && has("\"grad_precision\":\"bf16\""));
  EXPECT(has("\"budget\":2147483648") && has("\"host_budget\":4294967296"));
  EXPECT(has("\"device_budget\":2147483648") && has("\"cuda_context\":0"));
  EXPECT(has("\"grads\":\"nvme\"")); /* clipping keeps them: NVMe beside the optimizer */
  EXPECT_EQ_INT(run(0, "--model gpt2 --device host --gpu-budget 2G --host-budget 4G --nvme 8G "
                       "--seq 256"), 0);
  EXPECT(has("peak RSS ~ ") && has("device host") && has("params/grads/opt") &&
         has("gpu/gpu/gpu"));
}

/* --state-dtype, --state-block, --master: JSON keys and values, the text
 * line, and the usage errors (a bf16 master needs bf16 params). */
static void test_compact_state(void) {
  const char *base = "--model llama-2-13b --gpu-mem 24G --host-mem 128G --nvme 2T --seq 2048";
  static const char *const opt[] = {"", "--state-dtype bf16", "--state-dtype int8",
                                    "--state-dtype int8 --master bf16"};
  static const double home[] = {12, 8, 6.03125, 2.03125}, step[] = {28, 20, 16.0625, 10.0625};
  double nvme_s[4] = {0};
  for (int i = 0; i < 4; i++) {
    char args[2048];
    snprintf(args, sizeof args, "%s %s --json", base, opt[i]);
    EXPECT_EQ_INT(run(0, args), 0);
    ferry_json_value *v = NULL;
    if (ferry_json_parse(out, strlen(out), &v, NULL, 0)) {
      test_failures++;
      continue;
    }
    const ferry_json_value *sd = member(v, "state_dtype", FERRY_JSON_STR);
    const ferry_json_value *ms = member(v, "master", FERRY_JSON_STR);
    const ferry_json_value *sb = member(v, "state_block", FERRY_JSON_NUM);
    EXPECT(sd && !strcmp(sd->str, i == 0 ? "fp32" : i == 1 ? "bf16" : "int8"));
    EXPECT(ms && !strcmp(ms->str, i == 3 ? "bf16" : "fp32"));
    EXPECT(sb && sb->i == 256);
    const ferry_json_value *ob = member(v, "optim_bytes_per_param", FERRY_JSON_NUM);
    const ferry_json_value *tb = member(v, "step_bytes_per_param", FERRY_JSON_NUM);
    EXPECT(ob && ob->num == home[i]);
    EXPECT(tb && tb->num == step[i]);
    const ferry_json_value *c = ferry_json_get(v, "candidates");
    if (c && c->n == FERRY_PLACEMENTS) {
      const ferry_json_value *e = &c->items[FERRY_PLACE_NVME_OPT];
      const ferry_json_value *k = ferry_json_get(e, "components");
      const ferry_json_value *n = k ? ferry_json_get(k, "nvme") : NULL;
      EXPECT(n && n->type == FERRY_JSON_NUM);
      if (n) nvme_s[i] = n->num;
    }
    ferry_json_free(v);
  }
  EXPECT(nvme_s[3] > 0 && nvme_s[3] < nvme_s[2] && nvme_s[2] < nvme_s[1] &&
         nvme_s[1] < nvme_s[0]);
  EXPECT(nvme_s[3] > 0 && nvme_s[0] / nvme_s[3] >= 2.5);
  char args[2048];
  snprintf(args, sizeof args, "%s --state-dtype int8 --state-block 1024 --master bf16", base);
  EXPECT_EQ_INT(run(0, args), 0);
  EXPECT(has("2 int8 states, block 1024, bf16 master"));
  EXPECT(has("optimizer: int8 states + absmax, bf16 master"));
  /* usage errors name the flag and value; exit 2 */
  snprintf(args, sizeof args, "%s --precision fp32 --master bf16", base);
  EXPECT_EQ_INT(run(1, args), 2);
  EXPECT(has("--master bf16 needs --precision bf16"));
  snprintf(args, sizeof args, "%s --precision fp16 --master bf16", base);
  EXPECT_EQ_INT(run(1, args), 2);
  EXPECT(has("not --precision fp16"));
  snprintf(args, sizeof args, "%s --state-dtype fp8", base);
  EXPECT_EQ_INT(run(1, args), 2);
  EXPECT(has("--state-dtype 'fp8'"));
  snprintf(args, sizeof args, "%s --state-block 300", base);
  EXPECT_EQ_INT(run(1, args), 2);
  EXPECT(has("--state-block 300"));
  snprintf(args, sizeof args, "%s --master fp16", base);
  EXPECT_EQ_INT(run(1, args), 2);
  EXPECT(has("--master 'fp16'"));
  /* --write-config: the engine's keys, loaded back by the engine's config */
  char cfg[1024];
  snprintf(cfg, sizeof cfg, "%s/plan-compact.cfg", dir);
  remove(cfg);
  snprintf(args, sizeof args, "--model gpt2-xl --gpu-mem 12G --host-mem 64G --state-dtype int8 "
           "--state-block 512 --master bf16 --write-config '%s'", cfg);
  EXPECT_EQ_INT(run(1, args), 0);
  ferry_config *c = NULL;
  REQUIRE(ferry_config_create(&c) == 0);
  int lrc = ferry_config_load_file(c, cfg);
  if (lrc) fprintf(stderr, "  %s\n", ferry_config_last_error(c));
  EXPECT(lrc == 0);
  char buf[64];
  EXPECT(ferry_config_get(c, "optimizer.state_dtype", buf, sizeof buf) == 0 &&
         !strcmp(buf, "int8"));
  EXPECT(ferry_config_get(c, "optimizer.state_block", buf, sizeof buf) == 0 &&
         !strcmp(buf, "512"));
  EXPECT(ferry_config_get(c, "precision.master", buf, sizeof buf) == 0 && !strcmp(buf, "bf16"));
  ferry_config_destroy(c);
  remove(cfg);
}

/* ---- data parallelism: --gpus, --nodes, --zero-stage, --net-gbps (issue 23) ---- */

static const ferry_json_value *dist_num(const ferry_json_value *o, const char *k) {
  const ferry_json_value *v = o ? ferry_json_get(o, k) : NULL;
  if (!v || v->type != FERRY_JSON_NUM) {
    fprintf(stderr, "  JSON number '%s' missing\n", k);
    test_failures++;
    return NULL;
  }
  return v;
}

#define DIST_BASE "--model llama-2-7b --gpu-mem 24G --host-mem 128G --nvme 2T --seq 2048"

/* One rank: the flags at their defaults change nothing in the text. */
static void test_dist_one_rank(void) {
  static char before[1 << 18];
  EXPECT_EQ_INT(run(0, DIST_BASE), 0);
  memcpy(before, out, sizeof before);
  EXPECT(!strstr(out, "ranks ") && !strstr(out, "network"));
  EXPECT_EQ_INT(run(0, DIST_BASE " --gpus 1 --nodes 1 --zero-stage 3 --net-gbps 1"), 0);
  EXPECT(strcmp(before, out) == 0);
}

static void test_dist_json(void) {
  EXPECT_EQ_INT(run(0, DIST_BASE " --gpus 2 --nodes 2 --zero-stage 3 --net-gbps 50 --json"), 0);
  ferry_json_value *v = NULL;
  char why[256];
  int rc = ferry_json_parse(out, strlen(out), &v, why, sizeof why);
  if (rc) fprintf(stderr, "  not JSON: %s\n%s\n", why, out);
  REQUIRE(rc == 0);
  const ferry_json_value *x;
  EXPECT((x = dist_num(v, "ranks")) && x->i == 4);
  EXPECT((x = dist_num(v, "gpus")) && x->i == 2);
  EXPECT((x = dist_num(v, "nodes")) && x->i == 2);
  EXPECT((x = dist_num(v, "zero_stage")) && x->i == 3);
  EXPECT((x = dist_num(v, "net_gbps")) && x->num == 50);
  EXPECT((x = dist_num(v, "intra_gbps")) && x->num == 200);
  const ferry_json_value *cb = dist_num(v, "comm_bytes_per_step"), *cs = dist_num(v, "comm_seconds");
  const ferry_json_value *hf = dist_num(v, "comm_hidden_fraction");
  dist_num(v, "comm_exposed_seconds");
  EXPECT(cb && cs && cb->num > 0 && cs->num > 0);
  /* the link is the 50 Gb/s network: 6.25e9 bytes per second */
  EXPECT(cb && cs && cs->num > cb->num / 6.25e9 * (1 - 1e-9) &&
         cs->num < cb->num / 6.25e9 * (1 + 1e-9));
  EXPECT(hf && hf->num >= 0 && hf->num <= 1);
  /* the host budget: 80% of the node's 128 GiB, split between 2 ranks */
  const ferry_json_value *hb =
      ferry_json_get(ferry_json_get(ferry_json_get(v, "tiers"), "host"), "budget");
  EXPECT(hb && hb->i == (int64_t)((uint64_t)((double)(128ull << 30) * 0.8) / 2));
  const ferry_json_value *c = ferry_json_get(v, "candidates");
  REQUIRE(c && c->type == FERRY_JSON_ARR && c->n == 5);
  for (size_t i = 0; i < c->n; i++) {
    const ferry_json_value *cm = ferry_json_get(&c->items[i], "comm");
    EXPECT(cm && cm->type == FERRY_JSON_OBJ);
    const ferry_json_value *g = dist_num(cm, "grad_bytes"), *p = dist_num(cm, "param_bytes");
    dist_num(cm, "bytes_per_step"), dist_num(cm, "seconds"), dist_num(cm, "hidden_fraction");
    dist_num(cm, "exposed_seconds"), dist_num(cm, "link_gbps");
    EXPECT(g && p && g->num > 0 && p->num > 0);
    dist_num(ferry_json_get(&c->items[i], "components"), "network");
  }
  ferry_json_free(v);
}

static void test_dist_text(void) {
  EXPECT_EQ_INT(run(0, DIST_BASE " --gpus 4 --nodes 2"), 0);
  EXPECT(has("ranks      8 = 4 GPUs x 2 nodes, ZeRO stage 2"));
  EXPECT(has("  network   "));
  EXPECT(has("comm hidden"));
  EXPECT(has("communication per rank and step:"));
  EXPECT(has("/ 4 ranks per node"));
  /* a 10 Mb/s network: the bottleneck */
  EXPECT_EQ_INT(run(0, DIST_BASE " --nodes 2 --gpus 1 --net-gbps 0.01 --json"), 0);
  ferry_json_value *v = NULL;
  REQUIRE(ferry_json_parse(out, strlen(out), &v, NULL, 0) == 0);
  const ferry_json_value *b = ferry_json_get(v, "bottleneck");
  EXPECT(b && b->type == FERRY_JSON_STR && !strcmp(b->str, "network"));
  ferry_json_free(v);
  EXPECT_EQ_INT(run(0, DIST_BASE " --nodes 2 --net-gbps 0.01"), 0);
  EXPECT(has("bottleneck network ("));
}

static void test_dist_refusals(void) {
  static const struct {
    const char *flags, *named;
  } bad[] = {
      {"--gpus 0", "--gpus '0'"},          {"--nodes 0", "--nodes '0'"},
      {"--net-gbps -1", "--net-gbps '-1'"}, {"--zero-stage 4", "--zero-stage '4'"},
      {"--intra-gbps 0", "--intra-gbps '0'"}, {"--gpus two", "--gpus 'two'"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char args[512];
    snprintf(args, sizeof args, DIST_BASE " %s", bad[i].flags);
    EXPECT_EQ_INT(run(1, args), 2);
    EXPECT(has(bad[i].named));
  }
}

/* Whether key k at the top of the plan JSON in out is the string want, and
 * every candidate has home_bytes. */
static int json_top_is(const char *k, const char *want) {
  ferry_json_value *v = NULL;
  REQUIRE(ferry_json_parse(out, strlen(out), &v, NULL, 0) == 0);
  const ferry_json_value *x = ferry_json_get(v, k);
  int ok = x && x->type == FERRY_JSON_STR && !strcmp(x->str, want);
  if (!ok) fprintf(stderr, "  JSON '%s' is not '%s'\n", k, want);
  const ferry_json_value *c = ferry_json_get(v, "candidates");
  /* each candidate's homes, the optimizer's never empty */
  for (size_t i = 0; ok && c && i < c->n; i++) {
    const ferry_json_value *h = ferry_json_get(&c->items[i], "home_bytes");
    const ferry_json_value *o = h ? ferry_json_get(h, "optimizer") : NULL;
    ok = o && o->type == FERRY_JSON_NUM && o->i > 0;
  }
  ferry_json_free(v);
  return ok;
}

/* The families' bytes: exact for a model with tensors (one rank, or the
 * rank asked for), estimated and said so for a model known by its count
 * or past FERRY_PLAN_EXACT_RANKS ranks; --rank within the ranks. */
static void test_family_bytes_marker(void) {
  EXPECT_EQ_INT(run(0, "--params 1B --gpu-mem 24G --host-mem 64G --nvme 1T"), 0);
  EXPECT(has("family bytes estimated: no tensors to pack"));
  EXPECT(has("  model states ") && has("estimated)"));
  EXPECT_EQ_INT(run(0, "--params 1B --gpu-mem 24G --host-mem 64G --nvme 1T --json"), 0);
  EXPECT(json_top_is("family_bytes", "estimated"));
  EXPECT_EQ_INT(run(0, DIST_BASE " --json"), 0);
  EXPECT(json_top_is("family_bytes", "exact"));
  EXPECT_EQ_INT(run(0, DIST_BASE), 0);
  EXPECT(has("as the engine packs it)") && !strstr(out, "estimated"));
  EXPECT_EQ_INT(run(0, DIST_BASE " --gpus 2 --rank 1"), 0);
  EXPECT(has("family bytes: rank 1's pieces"));
  EXPECT_EQ_INT(run(0, DIST_BASE " --gpus 2"), 0);
  EXPECT(has("family bytes: per family the rank holding the most"));
  EXPECT_EQ_INT(run(0, DIST_BASE " --gpus 8 --nodes 256 --json"), 0);
  EXPECT(json_top_is("family_bytes", "estimated"));
  EXPECT_EQ_INT(run(0, DIST_BASE " --gpus 8 --nodes 256"), 0);
  EXPECT(has("family bytes estimated: a family's bytes / 2048 (past 1024 ranks)"));
  EXPECT_EQ_INT(run(1, DIST_BASE " --gpus 2 --rank 2"), 2);
  EXPECT(has("rank 2: 0 to 1"));
}

/* The engine config --write-config wrote, loaded by the engine's reader. */
static ferry_config *load_written(const char *path) {
  ferry_config *c = NULL;
  REQUIRE(ferry_config_create(&c) == 0);
  int rc = ferry_config_load_file(c, path);
  if (rc) fprintf(stderr, "  %s\n", ferry_config_last_error(c));
  EXPECT(rc == 0);
  return c;
}

/* dist.zero_stage in the written config: loaded back, or (an engine config
 * without the dist keys yet) refused naming the key. */
static void test_dist_write_config(void) {
  char cfg[1024], args[2048];
  snprintf(cfg, sizeof cfg, "%s/plan-dist.cfg", dir);
  remove(cfg);
  snprintf(args, sizeof args, DIST_BASE " --gpus 2 --zero-stage 1 --write-config '%s'", cfg);
  int rc = run(1, args);
  if (rc == 1) {
    EXPECT(has("dist.zero_stage"));
    return;
  }
  EXPECT_EQ_INT(rc, 0);
  ferry_config *c = load_written(cfg);
  char buf[64];
  EXPECT(ferry_config_get(c, "dist.zero_stage", buf, sizeof buf) == 0 && !strcmp(buf, "1"));
  /* the per-rank host budget */
  EXPECT(ferry_config_get(c, "tiers.host.budget", buf, sizeof buf) == 0);
  EXPECT(strtoull(buf, NULL, 10) == (uint64_t)((double)(128ull << 30) * 0.8) / 2);
  ferry_config_destroy(c);
  remove(cfg);
}

int main(int argc, char **argv) {
  REQUIRE(argc > 2);
  bin = argv[1];
  dir = argv[2];
  test_exact_budgets();
  test_json();
  test_write_config();
  test_svg_and_profile();
  test_impossible();
  test_compact_state();
  test_dist_one_rank();
  test_dist_json();
  test_dist_text();
  test_dist_refusals();
  test_dist_write_config();
  test_family_bytes_marker();
  return test_finish("plan.cli");
}
