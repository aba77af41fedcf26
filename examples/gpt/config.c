/* examples/gpt/config.c — model configs: the presets, Hugging Face
 * config.json (gpt2 and llama model types), checks, and the parameter
 * schema (Hugging Face names and shapes, one group per block).
 */
#include "gpt.h"

#include "core/file.h"
#include "core/json.h"
#include "core/untrusted.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static gpt_config gpt2_like(int vocab, int d, int layers, int heads, int seq) {
  gpt_config c = {.family = GPT_GPT2, .vocab = vocab, .d_model = d, .n_layer = layers,
                  .n_head = heads, .n_kv_head = heads, .d_ff = 4 * d, .max_seq = seq,
                  .norm_eps = 1e-5f, .rope_theta = 0, .tied = 1};
  return c;
}

static gpt_config llama_like(int vocab, int d, int layers, int heads, int kv, int ff, int seq) {
  gpt_config c = {.family = GPT_LLAMA, .vocab = vocab, .d_model = d, .n_layer = layers,
                  .n_head = heads, .n_kv_head = kv, .d_ff = ff, .max_seq = seq,
                  .norm_eps = 1e-5f, .rope_theta = 10000.0f, .tied = 0};
  return c;
}

int gpt_config_preset(const char *name, gpt_config *out) {
  if (!strcmp(name, "tiny")) *out = gpt2_like(256, 128, 5, 4, 256);
  else if (!strcmp(name, "small")) *out = gpt2_like(256, 384, 6, 6, 256);
  else if (!strcmp(name, "gpt2")) *out = gpt2_like(50257, 768, 12, 12, 1024);
  else if (!strcmp(name, "llama-tiny")) *out = llama_like(256, 128, 5, 4, 2, 344, 256);
  else if (!strcmp(name, "llama-small")) *out = llama_like(256, 384, 6, 6, 2, 1024, 256);
  /* the shapes of Hugging Face's TinyLlama-1.1B, Llama-2-7b and Llama-2-13b */
  else if (!strcmp(name, "llama-1b")) *out = llama_like(32000, 2048, 22, 32, 4, 5632, 2048);
  else if (!strcmp(name, "llama-2-7b")) *out = llama_like(32000, 4096, 32, 32, 32, 11008, 4096);
  else if (!strcmp(name, "llama-2-13b")) *out = llama_like(32000, 5120, 40, 40, 40, 13824, 4096);
  else return -1;
  return 0;
}

int gpt_config_check(const gpt_config *c, char *err, size_t el) {
  if (c->vocab < 1 || c->d_model < 1 || c->n_layer < 1 || c->n_head < 1 || c->d_ff < 1 ||
      c->max_seq < 1) {
    snprintf(err, el, "config: vocab, hidden size, layers, heads, intermediate size and "
             "positions must all be positive");
    return -1;
  }
  if (c->n_layer > 1024) {
    snprintf(err, el, "config: %d layers (at most 1024)", c->n_layer);
    return -1;
  }
  if (c->d_model % c->n_head) {
    snprintf(err, el, "config: hidden size %d is not a multiple of %d heads", c->d_model,
             c->n_head);
    return -1;
  }
  if (c->n_kv_head < 1 || c->n_head % c->n_kv_head) {
    snprintf(err, el, "config: %d attention heads are not a multiple of %d key/value heads",
             c->n_head, c->n_kv_head);
    return -1;
  }
  if (c->family == GPT_LLAMA && (c->d_model / c->n_head) % 2) {
    snprintf(err, el, "config: rotary positions need an even head size, not %d",
             c->d_model / c->n_head);
    return -1;
  }
  if (c->family == GPT_GPT2 && (!c->tied || c->n_kv_head != c->n_head)) {
    snprintf(err, el, "config: GPT-2 has tied embeddings and no grouped-query attention");
    return -1;
  }
  if (!(c->norm_eps > 0)) {
    snprintf(err, el, "config: the norm epsilon must be positive");
    return -1;
  }
  return 0;
}

void gpt_config_describe(const gpt_config *c, char *buf, size_t len) {
  snprintf(buf, len, "%s: vocab %d, d_model %d, %d layers, %d heads (%d kv), d_ff %d, max_seq %d%s",
           c->family == GPT_GPT2 ? "gpt2" : "llama", c->vocab, c->d_model, c->n_layer, c->n_head,
           c->n_kv_head, c->d_ff, c->max_seq, c->tied ? ", tied head" : "");
}

/* The config.json values this model reads (0 or -1: not given). */
typedef struct {
  char model_type[64];
  double n_embd, n_layer, n_head, n_kv, n_inner, vocab, n_pos, eps, theta, tie;
} json_config;

/* The numeric (or boolean) keys of both families and where each goes. */
static const struct {
  const char *key;
  size_t off;
} num_keys[] = {
    {"n_embd", offsetof(json_config, n_embd)},
    {"hidden_size", offsetof(json_config, n_embd)},
    {"n_layer", offsetof(json_config, n_layer)},
    {"num_hidden_layers", offsetof(json_config, n_layer)},
    {"n_head", offsetof(json_config, n_head)},
    {"num_attention_heads", offsetof(json_config, n_head)},
    {"num_key_value_heads", offsetof(json_config, n_kv)},
    {"n_inner", offsetof(json_config, n_inner)},
    {"intermediate_size", offsetof(json_config, n_inner)},
    {"vocab_size", offsetof(json_config, vocab)},
    {"n_positions", offsetof(json_config, n_pos)},
    {"max_position_embeddings", offsetof(json_config, n_pos)},
    {"layer_norm_epsilon", offsetof(json_config, eps)},
    {"rms_norm_eps", offsetof(json_config, eps)},
    {"rope_theta", offsetof(json_config, theta)},
    {"tie_word_embeddings", offsetof(json_config, tie)},
};

/* One top-level member, its key read: refuses what this model does not have,
 * keeps what it reads, skips the rest. 0, 1 (refused: err set), -1 (bad JSON). */
static int config_member(ferry_json_cur *j, const char *key, json_config *r, const char *path,
                         char *err, size_t el) {
  int k = ferry_json_kind(j), b;
  double v = 0;
  char sval[64] = "";
  /* features this model does not have: refuse rather than compute wrong */
  if ((!strcmp(key, "rope_scaling") && k != FERRY_JSON_NULL) ||
      ((!strcmp(key, "attention_bias") || !strcmp(key, "mlp_bias")) && k == FERRY_JSON_BOOL &&
       ferry_json_peek(j) == 't')) {
    snprintf(err, el, "%s: \"%s\" is not supported by this model", path, key);
    return 1;
  }
  if (k == FERRY_JSON_NUM) {
    if (ferry_json_number(j, &v, NULL, NULL)) return -1;
  } else if (k == FERRY_JSON_STR) {
    if (ferry_json_string(j, sval, sizeof sval, NULL)) return -1;
  } else if (k == FERRY_JSON_BOOL) {
    if (ferry_json_bool(j, &b)) return -1;
    v = b;
  } else {
    return ferry_json_skip(j);
  }
  for (size_t i = 0; i < sizeof num_keys / sizeof num_keys[0]; i++)
    if (!strcmp(key, num_keys[i].key) && k != FERRY_JSON_STR)
      *(double *)((char *)r + num_keys[i].off) = v;
  if (k != FERRY_JSON_STR) return 0;
  if (!strcmp(key, "model_type")) snprintf(r->model_type, sizeof r->model_type, "%s", sval);
  if (!strcmp(key, "activation_function") && strcmp(sval, "gelu_new") &&
      strcmp(sval, "gelu_pytorch_tanh")) {
    snprintf(err, el, "%s: activation_function '%s' not supported (gelu_new only)", path, sval);
    return 1;
  }
  if (!strcmp(key, "hidden_act") && strcmp(sval, "silu")) {
    snprintf(err, el, "%s: hidden_act '%s' not supported (silu only)", path, sval);
    return 1;
  }
  return 0;
}

/* config.json's top-level members into r. */
static int read_config_json(const char *path, json_config *r, char *err, size_t el) {
  size_t len;
  char *text, key[128];
  char why[1024];
  /* no link as its last component, a regular file of at most 4 MiB */
  if (ferry_read_below(NULL, path, FERRY_MAX_MODEL_CONFIG, &text, &len, why, sizeof why)) {
    snprintf(err, el, "%s", why);
    return -1;
  }
  ferry_json_cur j;
  ferry_json_iter it;
  int more = 0, rc = 0;
  ferry_json_init(&j, text, len);
  if (ferry_json_enter(&j, '{', &it)) rc = -1;
  while (!rc && (more = ferry_json_more(&j, &it)) == 1)
    rc = ferry_json_string(&j, key, sizeof key, NULL) || ferry_json_expect(&j, ':')
             ? -1
             : config_member(&j, key, r, path, err, el);
  if (!rc && more < 0) rc = -1;
  if (rc < 0)
    snprintf(err, el, "%s: not valid JSON near byte %zu", path,
             (size_t)((j.err_at ? j.err_at : j.p) - text));
  free(text);
  return rc ? -1 : 0;
}

/* config.json: the top-level keys the two families use; others skipped. */
int gpt_config_load_json(const char *path, gpt_config *out, char *err, size_t el) {
  json_config r = {.eps = -1, .theta = 10000, .tie = -1};
  if (read_config_json(path, &r, err, el)) return -1;
  gpt_config c;
  if (!strcmp(r.model_type, "gpt2")) {
    c = gpt2_like((int)r.vocab, (int)r.n_embd, (int)r.n_layer, (int)r.n_head, (int)r.n_pos);
    if (r.n_inner > 0) c.d_ff = (int)r.n_inner;
    if (r.tie == 0) {
      snprintf(err, el, "%s: gpt2 with untied embeddings is not supported", path);
      return -1;
    }
  } else if (!strcmp(r.model_type, "llama")) {
    c = llama_like((int)r.vocab, (int)r.n_embd, (int)r.n_layer, (int)r.n_head,
                   r.n_kv > 0 ? (int)r.n_kv : (int)r.n_head, (int)r.n_inner, (int)r.n_pos);
    c.rope_theta = (float)r.theta;
    c.tied = r.tie == 1;
  } else {
    snprintf(err, el, "%s: model_type '%s' not supported (gpt2 or llama)", path, r.model_type);
    return -1;
  }
  if (r.eps > 0) c.norm_eps = (float)r.eps;
  if (gpt_config_check(&c, err, el)) return -1;
  *out = c;
  return 0;
}

int gpt_config_token_id(const char *model, const char *key) {
  size_t len = strlen(model), tl;
  char *text = NULL, why[256];
  struct stat st;
  int dir = !stat(model, &st) && S_ISDIR(st.st_mode); /* --model DIR: DIR/config.json */
  if (!dir && (len < 5 || strcmp(model + len - 5, ".json"))) return -1; /* a preset */
  if (dir ? ferry_read_below(model, "config.json", FERRY_MAX_MODEL_CONFIG, &text, &tl, why,
                             sizeof why)
          : ferry_read_file(model, FERRY_MAX_MODEL_CONFIG, &text, &tl, why, sizeof why))
    return -1;
  int id = -1;
  ferry_json_value *v = NULL;
  if (!ferry_json_parse(text, tl, &v, why, sizeof why)) {
    const ferry_json_value *e = ferry_json_get(v, key);
    if (e && e->type == FERRY_JSON_NUM && e->is_int && e->i >= 0 && e->i < (1 << 30))
      id = (int)e->i;
  }
  ferry_json_free(v);
  free(text);
  return id;
}

static void add(gpt_schema *s, int group, const char *name, int ndim, int64_t a, int64_t b,
                int decay) {
  gpt_param *p = &s->params[s->n_params];
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s", name);
  p->ndim = ndim;
  p->shape[0] = a;
  p->shape[1] = ndim > 1 ? b : 0;
  p->numel = (size_t)a * (ndim > 1 ? (size_t)b : 1);
  p->group = group;
  p->slot = s->n_params - s->group_first[group];
  p->decay = decay;
  s->total_numel += p->numel;
  s->n_params++;
}

int gpt_schema_build(const gpt_config *c, gpt_schema *s) {
  char err[256];
  memset(s, 0, sizeof *s);
  if (gpt_config_check(c, err, sizeof err)) return -1;
  s->cfg = *c;
  s->n_groups = c->n_layer + 2;
  s->params = calloc((size_t)(c->n_layer + 2) * GPT_MAX_SLOTS, sizeof *s->params);
  if (!s->params) return -1;
  const int64_t C = c->d_model, F = c->d_ff, V = c->vocab, hd = C / c->n_head;
  char n[96];
  s->group_first[0] = 0;
  if (c->family == GPT_GPT2) {
    add(s, 0, "wte.weight", 2, V, C, 1);
    add(s, 0, "wpe.weight", 2, c->max_seq, C, 1);
    for (int l = 0; l < c->n_layer; l++) {
      int g = 1 + l;
      s->group_first[g] = s->n_params;
#define P(suffix, nd, a, b, dec)                              \
  snprintf(n, sizeof n, "h.%d.%s", l, suffix);                \
  add(s, g, n, nd, a, b, dec);
      P("ln_1.weight", 1, C, 0, 0) P("ln_1.bias", 1, C, 0, 0);
      P("attn.c_attn.weight", 2, C, 3 * C, 1) P("attn.c_attn.bias", 1, 3 * C, 0, 0);
      P("attn.c_proj.weight", 2, C, C, 1) P("attn.c_proj.bias", 1, C, 0, 0);
      P("ln_2.weight", 1, C, 0, 0) P("ln_2.bias", 1, C, 0, 0);
      P("mlp.c_fc.weight", 2, C, F, 1) P("mlp.c_fc.bias", 1, F, 0, 0);
      P("mlp.c_proj.weight", 2, F, C, 1) P("mlp.c_proj.bias", 1, C, 0, 0);
#undef P
    }
    int g = c->n_layer + 1;
    s->group_first[g] = s->n_params;
    add(s, g, "ln_f.weight", 1, C, 0, 0);
    add(s, g, "ln_f.bias", 1, C, 0, 0);
  } else {
    const int64_t Q = c->n_head * hd, KV = c->n_kv_head * hd;
    add(s, 0, "model.embed_tokens.weight", 2, V, C, 1);
    for (int l = 0; l < c->n_layer; l++) {
      int g = 1 + l;
      s->group_first[g] = s->n_params;
#define P(suffix, nd, a, b, dec)                              \
  snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);     \
  add(s, g, n, nd, a, b, dec);
      P("input_layernorm.weight", 1, C, 0, 0);
      P("self_attn.q_proj.weight", 2, Q, C, 1) P("self_attn.k_proj.weight", 2, KV, C, 1);
      P("self_attn.v_proj.weight", 2, KV, C, 1) P("self_attn.o_proj.weight", 2, C, Q, 1);
      P("post_attention_layernorm.weight", 1, C, 0, 0);
      P("mlp.gate_proj.weight", 2, F, C, 1) P("mlp.up_proj.weight", 2, F, C, 1);
      P("mlp.down_proj.weight", 2, C, F, 1);
#undef P
    }
    int g = c->n_layer + 1;
    s->group_first[g] = s->n_params;
    add(s, g, "model.norm.weight", 1, C, 0, 0);
    if (!c->tied) add(s, g, "lm_head.weight", 2, V, C, 1);
  }
  s->group_first[s->n_groups] = s->n_params;
  return 0;
}

void gpt_schema_free(gpt_schema *s) {
  free(s->params);
  s->params = NULL;
}

const gpt_param *gpt_schema_find(const gpt_schema *s, const char *name) {
  for (int i = 0; i < s->n_params; i++)
    if (!strcmp(s->params[i].name, name)) return &s->params[i];
  return NULL;
}
