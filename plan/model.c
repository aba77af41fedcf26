/* plan/model.c — model descriptions: the presets with their published
 * parameter counts, the parameter counts of a model's groups (embedding,
 * blocks, head), the dense stand-in of `--params N`, and Hugging Face
 * config.json files of the GPT-2 and Llama families (read with core/json.h).
 */
#include "plan/plan_impl.h"

#include "ferry.h"

#include "core/file.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  ferry_plan_model m;
  uint64_t published;
} preset;

#define GPT2(nm, h, l, hd)                                                        \
  {{nm, FERRY_ARCH_GPT2, 50257, h, 4 * (h), l, hd, hd, (h) / (hd), 1024, 1, 0, 0, 0, 0}, 0}
#define LLAMA(nm, v, h, f, l, a, kv, pos, tied, qb)                                   \
  {{nm, FERRY_ARCH_LLAMA, v, h, f, l, a, kv, (h) / (a), pos, tied, qb, 0, 0, 0}, 0}

static preset presets[] = {
    GPT2("gpt2", 768, 12, 12),
    GPT2("gpt2-medium", 1024, 24, 16),
    GPT2("gpt2-large", 1280, 36, 20),
    GPT2("gpt2-xl", 1600, 48, 25),
    LLAMA("llama-1b", 32000, 2048, 5632, 22, 32, 4, 2048, 0, 0),
    LLAMA("llama-2-7b", 32000, 4096, 11008, 32, 32, 32, 4096, 0, 0),
    LLAMA("llama-2-13b", 32000, 5120, 13824, 40, 40, 40, 4096, 0, 0),
    LLAMA("llama-2-70b", 32000, 8192, 28672, 80, 64, 8, 4096, 0, 0),
    LLAMA("llama-3-8b", 128256, 4096, 14336, 32, 32, 8, 8192, 0, 0),
    LLAMA("llama-3-70b", 128256, 8192, 28672, 80, 64, 8, 8192, 0, 0),
    LLAMA("mistral-7b", 32000, 4096, 14336, 32, 32, 8, 32768, 0, 0),
    LLAMA("qwen2.5-14b", 152064, 5120, 13824, 48, 40, 8, 32768, 0, 1),
};
#define NPRESETS (int)(sizeof presets / sizeof presets[0])

/* What Hugging Face reports for each preset, in the order above. */
static const uint64_t published[NPRESETS] = {
    124439808ull,   354823168ull,   774030080ull,   1557611200ull,
    1100048384ull,  6738415616ull,  13015864320ull, 68976648192ull,
    8030261248ull,  70553706496ull, 7241732096ull,  14770033664ull,
};

int ferry_plan_preset_count(void) { return NPRESETS; }
const char *ferry_plan_preset_name(int i) {
  return i >= 0 && i < NPRESETS ? presets[i].m.name : NULL;
}
uint64_t ferry_plan_preset_published(int i) { return i >= 0 && i < NPRESETS ? published[i] : 0; }

int ferry_plan_model_preset(const char *name, ferry_plan_model *out, char *why, size_t wl) {
  for (int i = 0; i < NPRESETS; i++)
    if (name && !strcmp(presets[i].m.name, name)) {
      *out = presets[i].m;
      return FERRY_OK;
    }
  char list[512] = "";
  size_t o = 0;
  for (int i = 0; i < NPRESETS && o < sizeof list; i++)
    o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", i ? ", " : "", presets[i].m.name);
  return plan_fail(why, wl, FERRY_ENOENT,
                   "unknown model preset '%s' (presets: %s; or a config.json)", name ? name : "",
                   list);
}

double plan_q_dim(const ferry_plan_model *m) { return (double)m->heads * (double)m->head_dim; }
double plan_kv_dim(const ferry_plan_model *m) {
  return (double)m->kv_heads * (double)m->head_dim;
}

static double block_params_d(const ferry_plan_model *m) {
  double h = (double)m->hidden, f = (double)m->ffn;
  if (m->arch == FERRY_ARCH_GPT2) /* c_attn, attn c_proj, c_fc, mlp c_proj (with biases), 2 LN */
    return h * 3 * h + 3 * h + h * h + h + h * f + f + f * h + h + 4 * h;
  double q = plan_q_dim(m), kv = plan_kv_dim(m);
  double p = h * q + 2 * h * kv + q * h + 3 * h * f + 2 * h; /* q k v o, gate up down, 2 RMSNorm */
  if (m->qkv_bias) p += q + 2 * kv;
  if (m->o_bias) p += h;
  if (m->mlp_bias) p += 2 * f + h;
  return p;
}

static double embed_params_d(const ferry_plan_model *m) {
  double e = (double)m->vocab * (double)m->hidden;
  if (m->arch == FERRY_ARCH_GPT2) e += (double)m->positions * (double)m->hidden;
  return e;
}

static double head_params_d(const ferry_plan_model *m) {
  double h = (double)m->hidden;
  double norm = m->arch == FERRY_ARCH_GPT2 ? 2 * h : h;
  return norm + (m->tied ? 0 : (double)m->vocab * h);
}

/* Appends a weight of a x b elements and, when bias, its bias of a. */
static int push(double *n, int k, double a, double b, int bias) {
  n[k++] = a * b;
  if (bias) n[k++] = a;
  return k;
}

int plan_group_tensors(const ferry_plan_model *m, int kind, double n[PLAN_GROUP_TENSORS]) {
  if (m->arch == FERRY_ARCH_DENSE) return 0;
  double h = (double)m->hidden, f = (double)m->ffn, v = (double)m->vocab;
  int k = 0, gpt2 = m->arch == FERRY_ARCH_GPT2;
  if (kind == PLAN_GROUP_EMBED) {
    n[k++] = v * h;
    if (gpt2) n[k++] = (double)m->positions * h;
  } else if (kind == PLAN_GROUP_HEAD) {
    k = push(n, k, h, 1, gpt2); /* the final norm (GPT-2: and its bias) */
    if (!m->tied) n[k++] = v * h;
  } else if (gpt2) { /* ln_1, c_attn, c_proj, ln_2, c_fc, mlp c_proj: weight and bias */
    k = push(n, k, h, 1, 1);
    k = push(n, k, 3 * h, h, 1);
    k = push(n, k, h, h, 1);
    k = push(n, k, h, 1, 1);
    k = push(n, k, f, h, 1);
    k = push(n, k, h, f, 1);
  } else { /* norm, q k v o, norm, gate up down */
    double q = plan_q_dim(m), kv = plan_kv_dim(m);
    n[k++] = h;
    k = push(n, k, q, h, m->qkv_bias);
    k = push(n, k, kv, h, m->qkv_bias);
    k = push(n, k, kv, h, m->qkv_bias);
    k = push(n, k, h, q, m->o_bias);
    n[k++] = h;
    k = push(n, k, f, h, m->mlp_bias);
    k = push(n, k, f, h, m->mlp_bias);
    k = push(n, k, h, f, m->mlp_bias);
  }
  return k;
}

uint64_t ferry_plan_model_params(const ferry_plan_model *m) {
  if (m->arch == FERRY_ARCH_DENSE) return m->params_override;
  return (uint64_t)(embed_params_d(m) + (double)m->layers * block_params_d(m) + head_params_d(m));
}

uint64_t ferry_plan_block_params(const ferry_plan_model *m) {
  if (m->arch == FERRY_ARCH_DENSE) {
    double rest = (double)m->params_override - embed_params_d(m) - head_params_d(m);
    return (uint64_t)(rest / (double)m->layers);
  }
  return (uint64_t)block_params_d(m);
}
uint64_t ferry_plan_embed_params(const ferry_plan_model *m) { return (uint64_t)embed_params_d(m); }
uint64_t ferry_plan_head_params(const ferry_plan_model *m) {
  if (m->arch == FERRY_ARCH_DENSE) /* the remainder of the block division */
    return m->params_override - ferry_plan_embed_params(m) -
           (uint64_t)m->layers * ferry_plan_block_params(m);
  return (uint64_t)head_params_d(m);
}
uint64_t ferry_plan_largest_group(const ferry_plan_model *m) {
  uint64_t b = ferry_plan_block_params(m), e = ferry_plan_embed_params(m),
           h = ferry_plan_head_params(m);
  uint64_t g = b > e ? b : e;
  return g > h ? g : h;
}
int64_t ferry_plan_groups(const ferry_plan_model *m) { return m->layers + 2; }

int ferry_plan_model_from_params(uint64_t n, ferry_plan_model *out, char *why, size_t wl) {
  if (n < 1000) return plan_fail(why, wl, FERRY_EINVAL, "--params %llu: too small to be a model "
                            "(at least 1000)", (unsigned long long)n);
  if (n > 1000000000000000ull)
    return plan_fail(why, wl, FERRY_EINVAL, "--params %llu: more than 10^15 parameters",
                (unsigned long long)n);
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "dense-%llu", (unsigned long long)n);
  out->arch = FERRY_ARCH_DENSE;
  /* 12 L h^2 ~ n with h = 128 L (the aspect ratio of Llama-2 13B / GPT-3) */
  int64_t l = (int64_t)llround(cbrt((double)n / 196608.0));
  if (l < 1) l = 1;
  out->layers = l;
  out->hidden = 128 * l;
  out->heads = out->kv_heads = l;
  out->head_dim = 128;
  out->ffn = (8 * out->hidden / 3 + 127) / 128 * 128;
  out->vocab = 32000;
  if (2.0 * 32000 * (double)out->hidden > (double)n / 4) out->vocab = 0; /* tiny: no embeddings */
  out->positions = 0;
  out->params_override = n;
  return FERRY_OK;
}

/* The JSON text of `name` as a tree; `status` with "name: not valid JSON:
 * line L, column C: what" when it is not JSON. */
int plan_parse_json(const char *text, size_t len, const char *name, int status,
                    ferry_json_value **root, char *why, size_t wl) {
  char pwhy[256];
  if (ferry_json_parse(text, len, root, pwhy, sizeof pwhy))
    return plan_fail(why, wl, status, "%s: not valid JSON: %s", name, pwhy);
  return FERRY_OK;
}

/* An integer field of config.json; `dflt` < 0 means required. */
static int cfg_int(const ferry_json_value *root, const char *key, int64_t dflt, int64_t *out,
                   const char *name, char *why, size_t wl) {
  const ferry_json_value *v = ferry_json_get(root, key);
  if (!v || v->type == FERRY_JSON_NULL) {
    if (dflt < 0)
      return plan_fail(why, wl, FERRY_EINVAL, "%s: missing required key \"%s\"", name, key);
    *out = dflt;
    return 0;
  }
  if (v->type != FERRY_JSON_NUM || !v->is_int || v->i <= 0 || v->i > (1ll << 40))
    return plan_fail(why, wl, FERRY_EINVAL, "%s:%d: \"%s\" must be a positive integer", name,
                     v->line, key);
  *out = v->i;
  return 0;
}

static int cfg_bool(const ferry_json_value *root, const char *key, int dflt, int *out,
                    const char *name, char *why, size_t wl) {
  const ferry_json_value *v = ferry_json_get(root, key);
  if (!v || v->type == FERRY_JSON_NULL) {
    *out = dflt;
    return 0;
  }
  if (v->type != FERRY_JSON_BOOL)
    return plan_fail(why, wl, FERRY_EINVAL, "%s:%d: \"%s\" must be true or false", name, v->line,
                     key);
  *out = v->b;
  return 0;
}

/* The integer keys of one family's config.json and where each goes; `dflt`
 * < 0 means required. Read in this order (the first error is reported). */
typedef struct {
  const char *key;
  int64_t dflt;
  size_t off; /* in ferry_plan_model */
} int_key;

static const int_key gpt2_keys[] = {
    {"n_embd", -1, offsetof(ferry_plan_model, hidden)},
    {"n_layer", -1, offsetof(ferry_plan_model, layers)},
    {"n_head", -1, offsetof(ferry_plan_model, heads)},
    {"vocab_size", -1, offsetof(ferry_plan_model, vocab)},
    {"n_positions", 1024, offsetof(ferry_plan_model, positions)},
    {"n_inner", 0, offsetof(ferry_plan_model, ffn)},
};

static const int_key llama_keys[] = {
    {"hidden_size", -1, offsetof(ferry_plan_model, hidden)},
    {"intermediate_size", -1, offsetof(ferry_plan_model, ffn)},
    {"num_hidden_layers", -1, offsetof(ferry_plan_model, layers)},
    {"num_attention_heads", -1, offsetof(ferry_plan_model, heads)},
    {"vocab_size", -1, offsetof(ferry_plan_model, vocab)},
    {"max_position_embeddings", 0, offsetof(ferry_plan_model, positions)},
    {"head_dim", 0, offsetof(ferry_plan_model, head_dim)},
};

static int cfg_ints(const ferry_json_value *root, const int_key *keys, size_t n,
                    ferry_plan_model *m, const char *name, char *why, size_t wl) {
  for (size_t i = 0; i < n; i++) {
    int rc = cfg_int(root, keys[i].key, keys[i].dflt, (int64_t *)((char *)m + keys[i].off), name,
                     why, wl);
    if (rc) return rc;
  }
  return 0;
}

/* Which family the config describes: *gpt2 set, or 0 for the Llama family
 * (*type: its model_type, or NULL when it has none). */
static int config_family(const ferry_json_value *root, const char *name, const char **type,
                         int *gpt2, char *why, size_t wl) {
  if (root->type != FERRY_JSON_OBJ)
    return plan_fail(why, wl, FERRY_EINVAL, "%s: expected a JSON object at the top", name);
  const ferry_json_value *mt = ferry_json_get(root, "model_type");
  const char *t = mt && mt->type == FERRY_JSON_STR ? mt->str : NULL;
  if (mt && !t)
    return plan_fail(why, wl, FERRY_EINVAL, "%s:%d: \"model_type\" must be a string", name,
                     mt->line);
  if (ferry_json_get(root, "num_local_experts") || ferry_json_get(root, "num_experts"))
    return plan_fail(why, wl, FERRY_ENOTSUP,
                "%s: mixture-of-experts models are not supported by the planner", name);
  *gpt2 = t ? !strcmp(t, "gpt2") : ferry_json_get(root, "n_embd") != NULL;
  int llama = t ? (!strcmp(t, "llama") || !strcmp(t, "mistral") || !strcmp(t, "qwen2"))
                : ferry_json_get(root, "hidden_size") != NULL;
  if (!*gpt2 && !llama) {
    if (t)
      return plan_fail(why, wl, FERRY_ENOTSUP,
                  "%s: model_type \"%s\" is not supported (gpt2, llama, mistral, qwen2)", name, t);
    return plan_fail(why, wl, FERRY_ENOTSUP,
                "%s: neither a GPT-2 (n_embd) nor a Llama-family (hidden_size) config", name);
  }
  *type = t;
  return FERRY_OK;
}

static int gpt2_config(const ferry_json_value *root, ferry_plan_model *m, const char *name,
                       char *why, size_t wl) {
  m->arch = FERRY_ARCH_GPT2;
  int rc = cfg_ints(root, gpt2_keys, sizeof gpt2_keys / sizeof gpt2_keys[0], m, name, why, wl);
  if (!rc) rc = cfg_bool(root, "tie_word_embeddings", 1, &m->tied, name, why, wl);
  if (rc) return rc;
  if (!m->ffn) m->ffn = 4 * m->hidden;
  m->kv_heads = m->heads;
  return FERRY_OK;
}

static int llama_config(const ferry_json_value *root, const char *type, ferry_plan_model *m,
                        const char *name, char *why, size_t wl) {
  m->arch = FERRY_ARCH_LLAMA;
  int ab = 0, mb = 0;
  int rc = cfg_ints(root, llama_keys, sizeof llama_keys / sizeof llama_keys[0], m, name, why, wl);
  if (!rc) rc = cfg_bool(root, "tie_word_embeddings", 0, &m->tied, name, why, wl);
  if (!rc) rc = cfg_int(root, "num_key_value_heads", m->heads, &m->kv_heads, name, why, wl);
  if (!rc) rc = cfg_bool(root, "attention_bias", 0, &ab, name, why, wl);
  if (!rc) rc = cfg_bool(root, "mlp_bias", 0, &mb, name, why, wl);
  if (rc) return rc;
  int qwen = type && !strcmp(type, "qwen2");
  m->qkv_bias = qwen || ab; /* Qwen2 always biases q/k/v; Llama's attention_bias all four */
  m->o_bias = ab && !qwen;
  m->mlp_bias = mb;
  if (m->kv_heads > m->heads || m->heads % m->kv_heads)
    return plan_fail(why, wl, FERRY_EINVAL,
                "%s: num_key_value_heads %lld must divide num_attention_heads %lld", name,
                (long long)m->kv_heads, (long long)m->heads);
  return FERRY_OK;
}

int ferry_plan_model_from_json(const char *text, size_t len, const char *name,
                               ferry_plan_model *out, char *why, size_t wl) {
  if (!name) name = "config.json";
  ferry_json_value *root = NULL;
  if (plan_parse_json(text, len, name, FERRY_EINVAL, &root, why, wl)) return FERRY_EINVAL;
  ferry_plan_model m;
  memset(&m, 0, sizeof m);
  const char *type = NULL, *base = strrchr(name, '/');
  int gpt2 = 0;
  snprintf(m.name, sizeof m.name, "%s", base ? base + 1 : name);
  int rc = config_family(root, name, &type, &gpt2, why, wl);
  if (!rc)
    rc = gpt2 ? gpt2_config(root, &m, name, why, wl) : llama_config(root, type, &m, name, why, wl);
  if (!rc && !m.head_dim) {
    if (m.hidden % m.heads)
      rc = plan_fail(why, wl, FERRY_EINVAL, "%s: hidden size %lld is not a multiple of %lld heads",
                name, (long long)m.hidden, (long long)m.heads);
    else m.head_dim = m.hidden / m.heads;
  }
  if (!rc) *out = m;
  ferry_json_free(root);
  return rc;
}

int ferry_plan_model_from_file(const char *path, ferry_plan_model *out, char *why, size_t wl) {
  char *text;
  size_t len;
  int rc = ferry_read_file(path, 16u << 20, &text, &len, why, wl);
  if (rc) return rc;
  rc = ferry_plan_model_from_json(text, len, path, out, why, wl);
  free(text);
  return rc;
}
