/* tests/plan/test_models.c — model arithmetic of the planner: every preset's
 * parameter count equals the published one, a Hugging Face config.json of
 * each family (argv[1] = tests/plan/configs) parses to its preset, and the
 * strict JSON reader refuses what is not JSON.
 */
#include "ferry.h"
#include "core/json.h"
#include "plan/plan.h"
#include "tests/test.h"

#include <string.h>

static void test_presets(void) {
  EXPECT_EQ_INT(ferry_plan_preset_count(), 12);
  static const struct {
    const char *name;
    uint64_t count; /* as Hugging Face reports it */
  } want[] = {
      {"gpt2", 124439808ull},          {"gpt2-medium", 354823168ull},
      {"gpt2-large", 774030080ull},    {"gpt2-xl", 1557611200ull},
      {"llama-1b", 1100048384ull},     {"llama-2-7b", 6738415616ull},   {"llama-2-13b", 13015864320ull},
      {"llama-2-70b", 68976648192ull}, {"llama-3-8b", 8030261248ull},
      {"llama-3-70b", 70553706496ull}, {"mistral-7b", 7241732096ull},
      {"qwen2.5-14b", 14770033664ull},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    ferry_plan_model m;
    char why[256];
    REQUIRE(ferry_plan_model_preset(want[i].name, &m, why, sizeof why) == 0);
    uint64_t n = ferry_plan_model_params(&m);
    if (n != want[i].count)
      fprintf(stderr, "  %s: %llu, published %llu\n", want[i].name, (unsigned long long)n,
              (unsigned long long)want[i].count);
    EXPECT(n == want[i].count);
    EXPECT(ferry_plan_preset_published((int)i) == want[i].count);
    /* the groups add up to the whole model */
    EXPECT(ferry_plan_embed_params(&m) + (uint64_t)m.layers * ferry_plan_block_params(&m) +
               ferry_plan_head_params(&m) == n);
  }
  ferry_plan_model m;
  char why[512];
  EXPECT(ferry_plan_model_preset("llama-4", &m, why, sizeof why) == FERRY_ENOENT);
  EXPECT(strstr(why, "llama-2-13b") != NULL);
  /* Qwen2's q/k/v biases are 48 * (5120 + 2 * 1024) of its 14.77 B */
  ferry_plan_model_preset("qwen2.5-14b", &m, NULL, 0);
  uint64_t with = ferry_plan_model_params(&m);
  m.qkv_bias = 0;
  EXPECT(with - ferry_plan_model_params(&m) == 48ull * (5120 + 2 * 1024));
  /* GPT-2's tied head: untying adds exactly vocab x hidden */
  ferry_plan_model_preset("gpt2", &m, NULL, 0);
  m.tied = 0;
  EXPECT(ferry_plan_model_params(&m) == 124439808ull + 50257ull * 768);
}

static void test_dense(void) {
  ferry_plan_model m;
  char why[256];
  EXPECT(ferry_plan_model_from_params(13000000000ull, &m, why, sizeof why) == 0);
  EXPECT(ferry_plan_model_params(&m) == 13000000000ull);
  EXPECT(m.layers == 40 && m.hidden == 5120);
  EXPECT(ferry_plan_embed_params(&m) + (uint64_t)m.layers * ferry_plan_block_params(&m) +
             ferry_plan_head_params(&m) == 13000000000ull);
  EXPECT(ferry_plan_model_from_params(5000, &m, why, sizeof why) == 0);
  EXPECT(ferry_plan_model_params(&m) == 5000 && m.vocab == 0);
  EXPECT(ferry_plan_model_from_params(10, &m, why, sizeof why) == FERRY_EINVAL);
}

static void test_configs(const char *dir) {
  static const char *const names[] = {"gpt2",        "gpt2-xl",    "llama-1b",
                                      "llama-2-7b",  "llama-2-13b", "llama-3-8b",
                                      "mistral-7b",  "qwen2.5-14b"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char path[1024], why[512];
    snprintf(path, sizeof path, "%s/%s.json", dir, names[i]);
    ferry_plan_model f, p;
    int rc = ferry_plan_model_from_file(path, &f, why, sizeof why);
    if (rc) fprintf(stderr, "  %s: %s\n", path, why);
    REQUIRE(rc == 0);
    REQUIRE(ferry_plan_model_preset(names[i], &p, NULL, 0) == 0);
    EXPECT(f.arch == p.arch && f.vocab == p.vocab && f.hidden == p.hidden && f.ffn == p.ffn);
    EXPECT(f.layers == p.layers && f.heads == p.heads && f.kv_heads == p.kv_heads);
    EXPECT(f.head_dim == p.head_dim && f.tied == p.tied && f.qkv_bias == p.qkv_bias);
    EXPECT(f.o_bias == p.o_bias && f.mlp_bias == p.mlp_bias);
    if (f.arch == FERRY_ARCH_GPT2) EXPECT(f.positions == p.positions);
    EXPECT(ferry_plan_model_params(&f) == ferry_plan_model_params(&p));
    EXPECT(!strcmp(f.name, strrchr(path, '/') + 1));
  }
}

static int json_refused(const char *text, const char *needle) {
  ferry_json_value *v = NULL;
  char why[256] = "";
  int rc = ferry_json_parse(text, strlen(text), &v, why, sizeof why);
  if (rc == 0) {
    ferry_json_free(v);
    fprintf(stderr, "  accepted: %s\n", text);
    return 0;
  }
  if (!strstr(why, needle)) {
    fprintf(stderr, "  %s: message '%s' lacks '%s'\n", text, why, needle);
    return 0;
  }
  return 1;
}

static void test_json(void) {
  ferry_json_value *v = NULL;
  const char *ok = "{\"a\": [1, -2.5e3, true, false, null, \"x\\u00e9\\ud83d\\ude00\\n\"],"
                   " \"b\": {\"c\": 9007199254740993}, \"d\": 0}";
  REQUIRE(ferry_json_parse(ok, strlen(ok), &v, NULL, 0) == 0);
  const ferry_json_value *a = ferry_json_get(v, "a");
  REQUIRE(a && a->type == FERRY_JSON_ARR && a->n == 6);
  EXPECT(a->items[0].is_int && a->items[0].i == 1);
  EXPECT(!a->items[1].is_int && a->items[1].num == -2500);
  EXPECT(a->items[2].type == FERRY_JSON_BOOL && a->items[2].b == 1);
  EXPECT(a->items[4].type == FERRY_JSON_NULL);
  EXPECT(!strcmp(a->items[5].str, "x\xc3\xa9\xf0\x9f\x98\x80\n"));
  const ferry_json_value *c = ferry_json_get(ferry_json_get(v, "b"), "c");
  EXPECT(c && c->is_int && c->i == 9007199254740993ll); /* exact past 2^53 */
  EXPECT(ferry_json_get(v, "zz") == NULL);
  ferry_json_free(v);

  EXPECT(json_refused("{\"a\": 1,}", "trailing comma"));
  EXPECT(json_refused("[1, 2,]", "trailing comma"));
  EXPECT(json_refused("{\"a\": 1, \"a\": 2}", "duplicate key \"a\""));
  EXPECT(json_refused("{\"a\": 1} // c", "unexpected content"));
  EXPECT(json_refused("{/* c */}", "expected a quoted key"));
  EXPECT(json_refused("{'a': 1}", "expected a quoted key"));
  EXPECT(json_refused("[01]", "leading zero"));
  EXPECT(json_refused("[1.]", "digit expected"));
  EXPECT(json_refused("[NaN]", "unexpected character"));
  EXPECT(json_refused("[\"\\x\"]", "invalid escape"));
  EXPECT(json_refused("[\"a\tb\"]", "control character"));
  EXPECT(json_refused("[\"\\ud800\"]", "surrogate"));
  EXPECT(json_refused("[\"\xc3\x28\"]", "invalid UTF-8"));
  EXPECT(json_refused("{\"a\": 1", "expected ',' or '}'"));
  EXPECT(json_refused("", "unexpected end"));
  EXPECT(json_refused("{\"a\":\n  tru}", "line 2"));
  char deep[200];
  memset(deep, '[', 100);
  memset(deep + 100, ']', 99);
  deep[199] = '\0';
  EXPECT(json_refused(deep, "nesting deeper than 64"));
}

static int model_refused(const char *text, int status, const char *needle) {
  ferry_plan_model m;
  char why[512] = "";
  int rc = ferry_plan_model_from_json(text, strlen(text), "t.json", &m, why, sizeof why);
  if (rc != status || !strstr(why, needle)) {
    fprintf(stderr, "  %s: rc %d, message '%s' (wanted %d, '%s')\n", text, rc, why, status,
            needle);
    return 0;
  }
  return 1;
}

static void test_config_errors(void) {
  EXPECT(model_refused("{\"model_type\": \"llama\", \"hidden_size\": 4096}", FERRY_EINVAL,
                       "missing required key \"intermediate_size\""));
  EXPECT(model_refused("{\"n_embd\": 768, \"n_layer\": 12, \"n_head\": 12.5, \"vocab_size\": 3}",
                       FERRY_EINVAL, "\"n_head\" must be a positive integer"));
  EXPECT(model_refused("{\"model_type\": \"t5\"}", FERRY_ENOTSUP, "\"t5\" is not supported"));
  EXPECT(model_refused("{\"model_type\": \"mixtral\", \"num_local_experts\": 8}", FERRY_ENOTSUP,
                       "mixture-of-experts"));
  EXPECT(model_refused("[1]", FERRY_EINVAL, "JSON object"));
  EXPECT(model_refused("{\"n_embd\": 768,}", FERRY_EINVAL, "not valid JSON"));
  EXPECT(model_refused("{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": "
                       "128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                       "\"num_key_value_heads\": 3, \"vocab_size\": 10}",
                       FERRY_EINVAL, "must divide"));
  /* Llama's attention_bias biases q, k, v and o; head_dim may differ from h/heads */
  const char *t = "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128,"
                  " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"head_dim\": 32,"
                  " \"num_key_value_heads\": 2, \"vocab_size\": 10, \"attention_bias\": true,"
                  " \"tie_word_embeddings\": true}";
  ferry_plan_model m;
  REQUIRE(ferry_plan_model_from_json(t, strlen(t), "t.json", &m, NULL, 0) == 0);
  uint64_t q = 4 * 32, kv = 2 * 32;
  uint64_t block = 64 * q + 2 * 64 * kv + q * 64 + 3 * 64 * 128 + 2 * 64 + q + 2 * kv + 64;
  EXPECT(ferry_plan_model_params(&m) == 10 * 64 + 2 * block + 64);
}

int main(int argc, char **argv) {
  REQUIRE(argc > 1);
  test_presets();
  test_dense();
  test_configs(argv[1]);
  test_json();
  test_config_errors();
  return test_finish("plan.models");
}
