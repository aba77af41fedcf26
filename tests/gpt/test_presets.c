/* tests/gpt/test_presets.c — ferry-gpt's presets against `ferry plan`'s:
 * every preset both know by name has the same shape in both and the same
 * parameter count (ferry-gpt's schema = the planner's arithmetic = the
 * published count), and a preset equals what ferry-gpt reads from the
 * Hugging Face config.json of that model (tests/plan/configs, argv[1]).
 */
#include "gpt.h"

#include "ferry.h"
#include "plan/plan.h"
#include "tests/test.h"

#include <string.h>

static void same_as_plan(const char *name) {
  gpt_config c;
  gpt_schema s;
  ferry_plan_model m;
  char why[512];
  REQUIRE(gpt_config_preset(name, &c) == 0);
  REQUIRE(gpt_schema_build(&c, &s) == 0);
  REQUIRE(ferry_plan_model_preset(name, &m, why, sizeof why) == 0);
  uint64_t published = 0;
  for (int i = 0; i < ferry_plan_preset_count(); i++)
    if (!strcmp(ferry_plan_preset_name(i), name)) published = ferry_plan_preset_published(i);
  if (s.total_numel != ferry_plan_model_params(&m) || s.total_numel != published) {
    fprintf(stderr, "%s: ferry-gpt %zu params, ferry plan %llu, published %llu\n", name,
            s.total_numel, (unsigned long long)ferry_plan_model_params(&m),
            (unsigned long long)published);
    test_failures++;
  }
  EXPECT((c.family == GPT_LLAMA) == (m.arch == FERRY_ARCH_LLAMA));
  EXPECT(c.vocab == m.vocab && c.d_model == m.hidden && c.d_ff == m.ffn);
  EXPECT(c.n_layer == m.layers && c.n_head == m.heads && c.n_kv_head == m.kv_heads);
  EXPECT(c.d_model / c.n_head == m.head_dim && c.max_seq == m.positions && c.tied == m.tied);
  printf("%s: %zu params in both\n", name, s.total_numel);
  gpt_schema_free(&s);
}

/* the preset = ferry-gpt's reading of the model's config.json */
static void same_as_json(const char *dir, const char *name) {
  char path[1024], err[512];
  gpt_config p, j;
  snprintf(path, sizeof path, "%s/%s.json", dir, name);
  REQUIRE(gpt_config_preset(name, &p) == 0);
  int rc = gpt_config_load_json(path, &j, err, sizeof err);
  if (rc) fprintf(stderr, "%s\n", err);
  REQUIRE(rc == 0);
  EXPECT(p.family == j.family && p.vocab == j.vocab && p.d_model == j.d_model);
  EXPECT(p.n_layer == j.n_layer && p.n_head == j.n_head && p.n_kv_head == j.n_kv_head);
  EXPECT(p.d_ff == j.d_ff && p.max_seq == j.max_seq && p.tied == j.tied);
  EXPECT(p.norm_eps == j.norm_eps && p.rope_theta == j.rope_theta);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_gpt_presets tests/plan/configs\n");
    return 1;
  }
  /* every preset of ferry-gpt that `ferry plan` knows too */
  static const char *const gpt[] = {"tiny",       "small",    "gpt2",       "llama-tiny",
                                    "llama-small", "llama-1b", "llama-2-7b", "llama-2-13b"};
  int both = 0;
  for (size_t i = 0; i < sizeof gpt / sizeof gpt[0]; i++) {
    ferry_plan_model m;
    if (ferry_plan_model_preset(gpt[i], &m, NULL, 0)) continue;
    same_as_plan(gpt[i]);
    both++;
  }
  EXPECT_EQ_INT(both, 4); /* gpt2, llama-1b, llama-2-7b, llama-2-13b */
  same_as_json(argv[1], "gpt2");
  same_as_json(argv[1], "llama-1b");
  same_as_json(argv[1], "llama-2-7b");
  same_as_json(argv[1], "llama-2-13b");
  gpt_config c;
  REQUIRE(gpt_config_preset("llama-1b", &c) == 0);
  EXPECT(c.d_model == 2048 && c.d_ff == 5632 && c.n_layer == 22 && c.n_head == 32);
  EXPECT(c.n_kv_head == 4 && c.max_seq == 2048);
  EXPECT(gpt_config_preset("llama-3b", &c) == -1);
  return test_finish("gpt.presets");
}
