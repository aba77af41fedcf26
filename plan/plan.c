/* plan/plan.c — the memory planner: model presets, parameter counts and
 * Hugging Face config.json files (read with core/json.h), bytes per family and tier
 * of each candidate placement, the step-time model and DeepSpeed's published
 * estimator formulas for comparison. Arithmetic only: no printing, no exits.
 * The formulas and their sources are written down in docs/PLANNING.md.
 */
#include "plan/plan.h"

#include "core/file.h"
#include "core/json.h"

#include "ferry.h"

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(char *why, size_t wl, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(char *why, size_t wl, int status, const char *fmt, ...) {
  if (why && wl) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, wl, fmt, ap);
    va_end(ap);
  }
  return status;
}

/* ======================================================================== */
/* Models                                                                    */

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
    6738415616ull,  13015864320ull, 68976648192ull, 8030261248ull,
    70553706496ull, 7241732096ull,  14770033664ull,
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
  return fail(why, wl, FERRY_ENOENT, "unknown model preset '%s' (presets: %s; or a config.json)",
              name ? name : "", list);
}

static double q_dim(const ferry_plan_model *m) { return (double)m->heads * (double)m->head_dim; }
static double kv_dim(const ferry_plan_model *m) {
  return (double)m->kv_heads * (double)m->head_dim;
}

static double block_params_d(const ferry_plan_model *m) {
  double h = (double)m->hidden, f = (double)m->ffn;
  if (m->arch == FERRY_ARCH_GPT2) /* c_attn, attn c_proj, c_fc, mlp c_proj (with biases), 2 LN */
    return h * 3 * h + 3 * h + h * h + h + h * f + f + f * h + h + 4 * h;
  double q = q_dim(m), kv = kv_dim(m);
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
  if (n < 1000) return fail(why, wl, FERRY_EINVAL, "--params %llu: too small to be a model "
                            "(at least 1000)", (unsigned long long)n);
  if (n > 1000000000000000ull)
    return fail(why, wl, FERRY_EINVAL, "--params %llu: more than 10^15 parameters",
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
static int parse_json(const char *text, size_t len, const char *name, int status,
                      ferry_json_value **root, char *why, size_t wl) {
  char pwhy[256];
  if (ferry_json_parse(text, len, root, pwhy, sizeof pwhy))
    return fail(why, wl, status, "%s: not valid JSON: %s", name, pwhy);
  return FERRY_OK;
}

/* An integer field of config.json; `dflt` < 0 means required. */
static int cfg_int(const ferry_json_value *root, const char *key, int64_t dflt, int64_t *out,
                   const char *name, char *why, size_t wl) {
  const ferry_json_value *v = ferry_json_get(root, key);
  if (!v || v->type == FERRY_JSON_NULL) {
    if (dflt < 0)
      return fail(why, wl, FERRY_EINVAL, "%s: missing required key \"%s\"", name, key);
    *out = dflt;
    return 0;
  }
  if (v->type != FERRY_JSON_NUM || !v->is_int || v->i <= 0 || v->i > (1ll << 40))
    return fail(why, wl, FERRY_EINVAL, "%s:%d: \"%s\" must be a positive integer", name, v->line,
                key);
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
    return fail(why, wl, FERRY_EINVAL, "%s:%d: \"%s\" must be true or false", name, v->line, key);
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
    return fail(why, wl, FERRY_EINVAL, "%s: expected a JSON object at the top", name);
  const ferry_json_value *mt = ferry_json_get(root, "model_type");
  const char *t = mt && mt->type == FERRY_JSON_STR ? mt->str : NULL;
  if (mt && !t)
    return fail(why, wl, FERRY_EINVAL, "%s:%d: \"model_type\" must be a string", name, mt->line);
  if (ferry_json_get(root, "num_local_experts") || ferry_json_get(root, "num_experts"))
    return fail(why, wl, FERRY_ENOTSUP,
                "%s: mixture-of-experts models are not supported by the planner", name);
  *gpt2 = t ? !strcmp(t, "gpt2") : ferry_json_get(root, "n_embd") != NULL;
  int llama = t ? (!strcmp(t, "llama") || !strcmp(t, "mistral") || !strcmp(t, "qwen2"))
                : ferry_json_get(root, "hidden_size") != NULL;
  if (!*gpt2 && !llama) {
    if (t)
      return fail(why, wl, FERRY_ENOTSUP,
                  "%s: model_type \"%s\" is not supported (gpt2, llama, mistral, qwen2)", name, t);
    return fail(why, wl, FERRY_ENOTSUP,
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
    return fail(why, wl, FERRY_EINVAL,
                "%s: num_key_value_heads %lld must divide num_attention_heads %lld", name,
                (long long)m->kv_heads, (long long)m->heads);
  return FERRY_OK;
}

int ferry_plan_model_from_json(const char *text, size_t len, const char *name,
                               ferry_plan_model *out, char *why, size_t wl) {
  if (!name) name = "config.json";
  ferry_json_value *root = NULL;
  if (parse_json(text, len, name, FERRY_EINVAL, &root, why, wl)) return FERRY_EINVAL;
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
      rc = fail(why, wl, FERRY_EINVAL, "%s: hidden size %lld is not a multiple of %lld heads",
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

/* ======================================================================== */
/* Bandwidths and the profile file                                           */

static const struct {
  unsigned bit;
  const char *key;
  size_t off;
  double def;
  const char *source;
} bw_keys[] = {
    {FERRY_PLAN_BW_H2D, "h2d_gbps", offsetof(ferry_plan_bandwidth, h2d_gbps), 25.0,
     "PCIe Gen4 x16 pinned copies (~25 GB/s of 31.5 GB/s raw)"},
    {FERRY_PLAN_BW_D2H, "d2h_gbps", offsetof(ferry_plan_bandwidth, d2h_gbps), 25.0,
     "PCIe Gen4 x16 pinned copies"},
    {FERRY_PLAN_BW_NVME_READ, "nvme_read_gbps", offsetof(ferry_plan_bandwidth, nvme_read_gbps),
     3.5, "one PCIe Gen3/Gen4 NVMe drive, large O_DIRECT reads"},
    {FERRY_PLAN_BW_NVME_WRITE, "nvme_write_gbps", offsetof(ferry_plan_bandwidth, nvme_write_gbps),
     3.0, "one NVMe drive, sustained large writes"},
    {FERRY_PLAN_BW_CPU_OPT, "cpu_optimizer_gbps",
     offsetof(ferry_plan_bandwidth, cpu_optimizer_gbps), 25.0,
     "memory-bound CPU Adam, 25-29 GB/s measured at 2 threads (shared/ANCHORS.md)"},
    {FERRY_PLAN_BW_TFLOPS, "device_tflops", offsetof(ferry_plan_bandwidth, device_tflops), 50.0,
     "16-bit training throughput of a workstation GPU (~30-40% of an RTX 4090 / A100 peak)"},
    {FERRY_PLAN_BW_TFLOPS32, "device_tflops_fp32",
     offsetof(ferry_plan_bandwidth, device_tflops_fp32), 12.5, "a quarter of device_tflops"},
    {FERRY_PLAN_BW_DEVMEM, "device_mem_gbps", offsetof(ferry_plan_bandwidth, device_mem_gbps),
     900.0, "GDDR6X / HBM2e device memory (optimizer on the GPU)"},
};
#define NBW (int)(sizeof bw_keys / sizeof bw_keys[0])

ferry_plan_bandwidth ferry_plan_bandwidth_default(void) {
  ferry_plan_bandwidth b;
  memset(&b, 0, sizeof b);
  for (int i = 0; i < NBW; i++) *(double *)((char *)&b + bw_keys[i].off) = bw_keys[i].def;
  return b;
}

const char *ferry_plan_bandwidth_key(unsigned bit) {
  for (int i = 0; i < NBW; i++)
    if (bw_keys[i].bit == bit) return bw_keys[i].key;
  return NULL;
}
const char *ferry_plan_bandwidth_source(unsigned bit) {
  for (int i = 0; i < NBW; i++)
    if (bw_keys[i].bit == bit) return bw_keys[i].source;
  return NULL;
}

int ferry_plan_profile_parse(const char *text, size_t len, const char *name,
                             ferry_plan_bandwidth *bw, char *why, size_t wl) {
  if (!name) name = "profile";
  ferry_json_value *root = NULL;
  if (parse_json(text, len, name, FERRY_ECONFIG, &root, why, wl)) return FERRY_ECONFIG;
  int rc = FERRY_ECONFIG;
  ferry_plan_bandwidth b = *bw;
  if (root->type != FERRY_JSON_OBJ) {
    fail(why, wl, rc, "%s: expected a JSON object", name);
    goto out;
  }
  const ferry_json_value *fmt = ferry_json_get(root, "format");
  const ferry_json_value *ver = ferry_json_get(root, "version");
  if (!fmt || fmt->type != FERRY_JSON_STR || strcmp(fmt->str, "ferry-profile")) {
    fail(why, wl, rc, "%s: \"format\": \"ferry-profile\" is missing", name);
    goto out;
  }
  if (!ver || ver->type != FERRY_JSON_NUM || !ver->is_int || ver->i != 1) {
    fail(why, wl, rc, "%s: \"version\" must be 1 (this ferry reads profile version 1)", name);
    goto out;
  }
  for (size_t i = 0; i < root->n; i++) {
    const char *k = root->keys[i];
    const ferry_json_value *v = &root->items[i];
    if (!strcmp(k, "format") || !strcmp(k, "version")) continue;
    if (!strcmp(k, "machine") || !strcmp(k, "created") || !strcmp(k, "ferry_version")) {
      if (v->type != FERRY_JSON_STR) {
        fail(why, wl, rc, "%s:%d: \"%s\" must be a string", name, v->line, k);
        goto out;
      }
      continue;
    }
    if (!strcmp(k, "sources")) { /* free-form notes per measurement */
      if (v->type != FERRY_JSON_OBJ) {
        fail(why, wl, rc, "%s:%d: \"sources\" must be an object", name, v->line);
        goto out;
      }
      continue;
    }
    int j = 0;
    while (j < NBW && strcmp(bw_keys[j].key, k)) j++;
    if (j == NBW) {
      char known[400] = "";
      size_t o = 0;
      for (int t = 0; t < NBW && o < sizeof known; t++)
        o += (size_t)snprintf(known + o, sizeof known - o, "%s%s", t ? ", " : "", bw_keys[t].key);
      fail(why, wl, rc, "%s:%d: unknown key \"%s\" (known: %s, machine, created, "
           "ferry_version, sources)", name, v->line, k, known);
      goto out;
    }
    if (v->type != FERRY_JSON_NUM || !(v->num > 0) || v->num > 1e7) {
      fail(why, wl, rc, "%s:%d: \"%s\" must be a number > 0 (GB/s or TFLOP/s)", name, v->line,
           k);
      goto out;
    }
    *(double *)((char *)&b + bw_keys[j].off) = v->num;
    b.measured |= bw_keys[j].bit;
  }
  if ((b.measured & FERRY_PLAN_BW_TFLOPS) && !(b.measured & FERRY_PLAN_BW_TFLOPS32) &&
      !(bw->measured & FERRY_PLAN_BW_TFLOPS32))
    b.device_tflops_fp32 = b.device_tflops / 4;
  *bw = b;
  rc = FERRY_OK;
out:
  ferry_json_free(root);
  return rc;
}

int ferry_plan_profile_load(const char *path, ferry_plan_bandwidth *bw, char *why, size_t wl) {
  char *text;
  size_t len;
  int rc = ferry_read_file(path, 1u << 20, &text, &len, why, wl);
  if (rc) return rc == FERRY_ENOENT ? rc : FERRY_ECONFIG;
  rc = ferry_plan_profile_parse(text, len, path, bw, why, wl);
  free(text);
  return rc;
}

/* ======================================================================== */
/* Names                                                                     */

static const char *const place_names[FERRY_PLACEMENTS] = {
    "all-gpu", "zero-offload", "zero3-offload", "nvme-optimizer", "zero-infinity"};
static const char *const place_desc[FERRY_PLACEMENTS] = {
    "everything on the GPU, optimizer on the GPU",
    "params on the GPU; grads, master and optimizer states on the host (ZeRO-Offload)",
    "params streamed from the host per group; grads and optimizer on the host (ZeRO-3 offload)",
    "params streamed from the host; master and optimizer states on NVMe",
    "params, master and optimizer states on NVMe (ZeRO-Infinity)"};
/* grads: the home when they are kept (placement.grads = "auto" may resolve
 * to "none": ferry_plan_grads_auto) */
static const char *const place_tiers[FERRY_PLACEMENTS][3] = {
    {"gpu", "gpu", "gpu"},    {"gpu", "host", "host"},  {"host", "host", "host"},
    {"host", "nvme", "nvme"}, {"nvme", "nvme", "nvme"}};

const char *ferry_plan_placement_name(int p) {
  return p >= 0 && p < FERRY_PLACEMENTS ? place_names[p] : "?";
}
const char *ferry_plan_placement_desc(int p) {
  return p >= 0 && p < FERRY_PLACEMENTS ? place_desc[p] : "?";
}
void ferry_plan_placement_tiers(int p, const char **params, const char **grads,
                                const char **optimizer) {
  if (p < 0 || p >= FERRY_PLACEMENTS) p = 0;
  if (params) *params = place_tiers[p][0];
  if (grads) *grads = place_tiers[p][1];
  if (optimizer) *optimizer = place_tiers[p][2];
}
const char *ferry_plan_grads_name(int g) {
  static const char *const n[] = {"gpu", "host", "nvme", "none"};
  return g >= 0 && g <= 3 ? n[g] : "?";
}
const char *ferry_plan_family_name(int f) {
  static const char *const n[FERRY_PLAN_FAMILIES] = {
      "params", "grads", "master", "optimizer", "activations", "buffers", "workspace", "swap"};
  return f >= 0 && f < FERRY_PLAN_FAMILIES ? n[f] : "?";
}
const char *ferry_plan_tier_name(int t) {
  static const char *const n[FERRY_PLAN_TIERS] = {"gpu", "host", "nvme"};
  return t >= 0 && t < FERRY_PLAN_TIERS ? n[t] : "?";
}
const char *ferry_plan_component_name(int c) {
  static const char *const n[FERRY_COMPONENTS] = {"compute", "h2d", "d2h", "cpu_optimizer",
                                                  "nvme", "network"};
  return c >= 0 && c < FERRY_COMPONENTS ? n[c] : "?";
}
const char *ferry_plan_precision_name(int prec) {
  static const char *const n[] = {"fp32", "fp16", "bf16"};
  return prec >= 0 && prec <= 2 ? n[prec] : "?";
}
const char *ferry_plan_optimizer_name(int opt) {
  static const char *const n[] = {"adamw", "adam", "adagrad", "lamb", "sgd", "lion"};
  return opt >= 0 && opt <= 5 ? n[opt] : "?";
}
int ferry_plan_optimizer_states(int opt) {
  return opt == FERRY_OPTIM_ADAMW || opt == FERRY_OPTIM_ADAM || opt == FERRY_OPTIM_LAMB ? 2 : 1;
}

const char *ferry_plan_dtype_name(int dt) {
  switch (dt) {
  case FERRY_DT_F32: return "fp32";
  case FERRY_DT_BF16: return "bf16";
  case FERRY_DT_I8: return "int8";
  default: return NULL;
  }
}

/* The optimizer config whose formulas (ferry_optimizer_state_bytes,
 * ferry_optimizer_bytes_per_param) the plan uses. */
static ferry_optimizer_config plan_optim_config(const ferry_plan_input *in) {
  ferry_optimizer_config o = ferry_optimizer_config_default((ferry_optim_type)in->optimizer);
  o.state_dtype = in->state_dtype ? in->state_dtype : FERRY_DT_F32;
  o.state_block = in->state_block > 0 ? (size_t)in->state_block : 256;
  o.master_dtype = in->master_dtype ? in->master_dtype : FERRY_DT_F32;
  return o;
}

static int bf16_master(const ferry_plan_input *in) { return in->master_dtype == FERRY_DT_BF16; }

/* Bytes of one state buffer of n elements (int8: codes rounded up to 64 and
 * one fp32 absmax per block). */
static double state_bytes(const ferry_plan_input *in, double n) {
  ferry_optimizer_config o = plan_optim_config(in);
  return (double)ferry_optimizer_state_bytes(&o, (size_t)n);
}

/* Bytes per element of one state, large tensors (the absmax share included). */
static double state_per_param(const ferry_plan_input *in) {
  return state_bytes(in, 1 << 24) / (double)(1 << 24);
}

/* The master's bytes per param in the optimizer's home: 4 (fp32); with a
 * bf16 master the params are the master, 0 (the engine keeps no master
 * tensor: the step stages the current params from their home, read back
 * from the device when they live there). */
static double master_per_param(const ferry_plan_input *in, int p) {
  (void)p;
  return bf16_master(in) ? 0 : 4;
}

double ferry_plan_optim_bytes_per_param(const ferry_plan_input *in, int p) {
  return master_per_param(in, p) + ferry_plan_optimizer_states(in->optimizer) * state_per_param(in);
}

double ferry_plan_step_bytes_per_param(const ferry_plan_input *in, int p) {
  ferry_optimizer_config o = plan_optim_config(in);
  int pdt = in->precision == FERRY_PREC_FP32 ? FERRY_DT_F32
            : in->precision == FERRY_PREC_FP16 ? FERRY_DT_F16 : FERRY_DT_BF16;
  /* the gradient read: the accumulator, or the drained 16-bit grads (none) */
  int gdt = ferry_plan_grads_auto(in, p) == FERRY_PLAN_GRADS_NONE ? pdt
            : in->grad_precision == FERRY_PREC_BF16 ? FERRY_DT_BF16 : FERRY_DT_F32;
  /* the param copy written: none when the params are the master */
  double b = ferry_optimizer_bytes_per_param(&o, gdt, bf16_master(in) ? FERRY_DT_NONE : pdt);
  return b < 0 ? 0 : b;
}

/* ======================================================================== */
/* The plan                                                                  */

ferry_plan_input ferry_plan_input_default(void) {
  ferry_plan_input in;
  memset(&in, 0, sizeof in);
  in.batch = 1;
  in.seq = 1024;
  in.precision = FERRY_PREC_BF16;
  in.optimizer = FERRY_OPTIM_ADAMW;
  in.checkpointing = 1;
  in.flash_attention = 0;
  in.chunk_size = 64ull << 20;
  in.bw = ferry_plan_bandwidth_default();
  in.grad_accumulation = 1;
  in.clip_grad_norm = 0;
  in.grad_precision = FERRY_PREC_FP32;
  in.device = FERRY_PLAN_DEV_CUDA;
  in.state_dtype = FERRY_DT_F32;
  in.state_block = 256;
  in.master_dtype = FERRY_DT_F32;
  in.gpus = in.nodes = 1;
  in.zero_stage = 2; /* the engine's dist.zero_stage default */
  in.net_gbps = 100;
  in.intra_gbps = 0;
  return in;
}

/* Bytes of one activation element: the compute dtype on a GPU; the CPU
 * model (--device host) computes in fp32 whatever the params' dtype. */
static double act_dtype(const ferry_plan_input *in) {
  return in->device == FERRY_PLAN_DEV_HOST || in->precision == FERRY_PREC_FP32 ? 4 : 2;
}

#define RUNTIME_WORKSPACE (256.0 * 1024 * 1024) /* cuBLAS workspace, allocator slack */

/* Activation bytes of one block kept for backward (docs/PLANNING.md). */
static double block_activations(const ferry_plan_model *m, double ab, double b, double s,
                                int flash) {
  double h = (double)m->hidden, f = (double)m->ffn, a = (double)m->heads;
  double sb = s * b;
  if (m->arch == FERRY_ARCH_GPT2) {
    /* Korthikanti et al. 2022 eq. (1), generalised to dtype size ab and ffn f:
     * LN1 in, QKV in, Q, K, V, proj in (ab sbh each), two dropout masks (1 byte
     * sbh each); LN2 in, fc1 in (ab sbh), GELU in, fc2 in (ab sbf each); scores:
     * softmax out + dropout mask + dropout out = (2 ab + 1) a s^2 b. */
    double x = sb * h * (8 * ab + 2) + sb * f * 2 * ab;
    x += flash ? 4 * a * sb : (2 * ab + 1) * a * s * s * b;
    return x;
  }
  /* Llama family (no dropout): norm1 in/out, Q and K after RoPE, V, attention
   * out, norm2 in/out, gate, up and silu(gate)*up; fp32 rstd of both norms;
   * scores: the softmax output (ab a s^2 b) or, fused, the fp32 logsumexp. */
  double q = q_dim(m), kv = kv_dim(m);
  double x = ab * sb * (4 * h + 2 * q + 2 * kv + 3 * f) + 8 * sb;
  x += flash ? 4 * a * sb : ab * a * s * s * b;
  return x;
}

/* Activations on the device for the whole step: blocks (all of them, or one
 * input each plus one block recomputed), and the head: final norm in/out and
 * the logits in compute dtype plus fp32 for the loss. */
static double activation_bytes(const ferry_plan_input *in, double b) {
  const ferry_plan_model *m = &in->model;
  double ab = act_dtype(in), s = (double)in->seq;
  double h = (double)m->hidden, L = (double)m->layers;
  double blk = block_activations(m, ab, b, s, in->flash_attention);
  double blocks = in->checkpointing ? L * ab * s * b * h + blk : L * blk;
  double head = 2 * ab * s * b * h + (double)m->vocab * s * b * (ab + 4);
  return blocks + head;
}

/* Backward scratch: gradients flowing through one block (in, out, the widest
 * intermediate twice) and, with materialized attention, the scores' grad;
 * on a GPU also the runtime's workspace (cuBLAS, allocator slack). */
static double workspace_bytes(const ferry_plan_input *in, double b) {
  const ferry_plan_model *m = &in->model;
  double ab = act_dtype(in), s = (double)in->seq;
  double h = (double)m->hidden, f = (double)m->ffn;
  double wide = f > q_dim(m) + 2 * kv_dim(m) ? f : q_dim(m) + 2 * kv_dim(m);
  double w = (in->device == FERRY_PLAN_DEV_HOST ? 0 : RUNTIME_WORKSPACE) +
             ab * s * b * (2 * h + 2 * wide);
  if (!in->flash_attention) w += ab * (double)m->heads * s * s * b;
  return w;
}

static double round_chunk(double x, double ch) { return ch > 0 ? ceil(x / ch) * ch : x; }

/* One group's chunks of a family, as the engine's layout makes them: no
 * chunk holds two groups, and a chunk is as large as the tensors packed
 * into it (at most C, unless one tensor is larger), rounded up to a page
 * for the host and NVMe tiers: x bytes plus a page for each of its
 * ⌈x / C⌉ + 1 chunks (a tensor that does not fit closes a chunk early). */
static double group_chunks(double x, double ch) {
  return ch > 0 ? x + (ceil(x / ch) + 1) * 4096 : x;
}

int ferry_plan_grads_auto(const ferry_plan_input *in, int p) {
  if (p == FERRY_PLACE_ALL_GPU) return FERRY_PLAN_GRADS_GPU;
  /* the step runs during backward: no global norm to wait for, no fp16
   * dynamic scaling (it needs the whole gradient's overflow flag), one
   * micro-batch per step, one rank */
  int eager = !(in->clip_grad_norm > 0) && in->precision != FERRY_PREC_FP16 &&
              in->grad_accumulation <= 1 &&
              /* ranks average the grads into accumulators (the engine's "auto") */
              (int64_t)in->gpus * in->nodes <= 1;
  if (eager) return FERRY_PLAN_GRADS_NONE;
  return p == FERRY_PLACE_ZERO_OFFLOAD || p == FERRY_PLACE_ZERO3_OFFLOAD ? FERRY_PLAN_GRADS_HOST
                                                                          : FERRY_PLAN_GRADS_NVME;
}

/* What a placement puts where, and the sizes its formulas share. */
typedef struct {
  int ph, gh, oh;          /* homes: FERRY_PLAN_GPU/HOST/NVME; gh a ferry_plan_grads */
  double P, G, ch;         /* params, largest group, chunk size */
  double pb, gb, ob;       /* bytes per param: param dtype, grad accumulator, optimizer family */
  double mb, sb;           /* bytes per param of the master (0: the params are it), of a state */
  int k;                   /* optimizer states */
  int cpu_path;            /* the CPU does the optimizer's arithmetic */
  double grp_p, grp_g, grp_o; /* one group's chunks of each family (grads and optimizer:
                                 this rank's piece) */
  double N;                /* ranks */
  int stage;               /* ZeRO stage */
  double so, sg, sp;       /* share of the whole family this rank keeps: optimizer and
                              master (stage >= 1), grads (>= 2), params (3); 1 alone */
} place_ctx;

static place_ctx place_context(const ferry_plan_input *in, int p) {
  static const int ph[FERRY_PLACEMENTS] = {FERRY_PLAN_GPU, FERRY_PLAN_GPU, FERRY_PLAN_HOST,
                                           FERRY_PLAN_HOST, FERRY_PLAN_NVME};
  static const int oh[FERRY_PLACEMENTS] = {FERRY_PLAN_GPU, FERRY_PLAN_HOST, FERRY_PLAN_HOST,
                                           FERRY_PLAN_NVME, FERRY_PLAN_NVME};
  place_ctx c;
  memset(&c, 0, sizeof c);
  c.ph = ph[p];
  c.oh = oh[p];
  c.gh = ferry_plan_grads_auto(in, p);
  c.P = (double)ferry_plan_model_params(&in->model);
  c.G = (double)ferry_plan_largest_group(&in->model);
  c.ch = (double)in->chunk_size;
  c.pb = in->precision == FERRY_PREC_FP32 ? 4 : 2;
  c.gb = in->grad_precision == FERRY_PREC_BF16 ? 2 : 4;
  c.k = ferry_plan_optimizer_states(in->optimizer);
  c.mb = master_per_param(in, p);
  c.sb = state_per_param(in);
  c.ob = c.mb + c.k * c.sb;
  c.cpu_path = in->device == FERRY_PLAN_DEV_HOST || c.oh != FERRY_PLAN_GPU;
  c.N = (double)in->gpus * (double)in->nodes;
  c.stage = in->zero_stage;
  c.so = c.stage >= 1 ? 1 / c.N : 1;
  c.sg = c.stage >= 2 ? 1 / c.N : 1;
  c.sp = c.stage >= 3 ? 1 / c.N : 1;
  c.grp_p = group_chunks(c.G * c.pb, c.ch); /* gathered: the whole group */
  c.grp_g = group_chunks(c.G * c.gb * c.sg, c.ch);
  c.grp_o = group_chunks(c.G * c.ob * c.so, c.ch);
  return c;
}

/* Elements of the model's largest single tensor (a chunk of its own when
 * it outgrows a chunk). */
static double largest_tensor(const ferry_plan_model *m) {
  double h = (double)m->hidden, f = (double)m->ffn, v = (double)m->vocab * h;
  double t = h * f;
  if (m->arch == FERRY_ARCH_GPT2) t = fmax(fmax(t, 3 * h * h), (double)m->positions * h);
  else t = fmax(t, h * q_dim(m));
  return fmax(t, v);
}

/* The engine's own host buffers, out of tiers.host.budget at finalize:
 * drain staging (2 groups, always), upload staging (2 groups, device-home
 * params on the CPU path) and commit staging (1 group, params off the device). */
static double staging_bytes(const place_ctx *c) {
  double g = c->G * c->pb;
  double up = c->ph == FERRY_PLAN_GPU && c->cpu_path ? 2 * g : 0;
  return 2 * g + up + (c->ph != FERRY_PLAN_GPU ? g : 0);
}

/* The host pool's working set of the NVMe homes: one group's optimizer
 * chunks, two of grads (one drained, one stepped), two of params (one
 * fetched, one committed), and two largest chunks of slack (the engine's host_working_set). */
static double swap_bytes(const ferry_plan_input *in, const place_ctx *c) {
  double w = 0, big = 0, t = largest_tensor(&in->model);
  if (c->oh == FERRY_PLAN_NVME) w += c->grp_o, big = fmax(big, fmax(c->mb, c->sb) * t);
  if (c->gh == FERRY_PLAN_GRADS_NVME) w += 2 * c->grp_g, big = fmax(big, c->gb * t);
  if (c->ph == FERRY_PLAN_NVME) w += 2 * c->grp_p, big = fmax(big, c->pb * t);
  if (w > 0 && c->ch > 0) w += 2 * fmax(c->ch, big);
  return w;
}

/* Bytes per tier and family of placement p at batch b. */
static void place_bytes(const ferry_plan_input *in, int p, double b,
                        double out[FERRY_PLAN_TIERS][FERRY_PLAN_FAMILIES]) {
  memset(out, 0, sizeof(double) * FERRY_PLAN_TIERS * FERRY_PLAN_FAMILIES);
  place_ctx c = place_context(in, p);
  double params = round_chunk(c.P * c.pb * c.sp, c.ch); /* this rank's share */
  double grads = round_chunk(c.P * c.gb * c.sg, c.ch);
  double *gpu = out[FERRY_PLAN_GPU], *host = out[FERRY_PLAN_HOST];
  /* activations and scratch: the device's on a GPU; the CPU model's host
   * allocations on --device host (in the RSS, not in the device budget) */
  if (in->device == FERRY_PLAN_DEV_CUDA) {
    gpu[FERRY_FAM_ACT] = activation_bytes(in, b);
    gpu[FERRY_FAM_WORKSPACE] = workspace_bytes(in, b);
  }
  gpu[FERRY_FAM_GRADS] = 2 * c.G * c.pb; /* grad buffers: being written, being drained */
  /* params: the whole family at home, else two groups (in use, next); at
   * stage 3 the home keeps this rank's share and the device two gathered groups */
  if (c.ph == FERRY_PLAN_GPU) gpu[FERRY_FAM_PARAMS] = params + (c.sp < 1 ? 2 * c.grp_p : 0);
  else gpu[FERRY_FAM_PARAMS] = 2 * c.grp_p;
  out[c.ph][FERRY_FAM_PARAMS] += c.ph == FERRY_PLAN_GPU ? 0 : params;
  if (c.gh == FERRY_PLAN_GRADS_GPU) gpu[FERRY_FAM_GRADS] += grads;
  else if (c.gh == FERRY_PLAN_GRADS_HOST) host[FERRY_FAM_GRADS] = grads;
  else if (c.gh == FERRY_PLAN_GRADS_NVME) out[FERRY_PLAN_NVME][FERRY_FAM_GRADS] = grads;
  out[c.oh][FERRY_FAM_MASTER] = round_chunk(c.P * c.mb * c.so, c.ch);
  out[c.oh][FERRY_FAM_OPTIM] = c.k * round_chunk(state_bytes(in, c.P * c.so), c.ch);
  host[FERRY_FAM_BUFFERS] = staging_bytes(&c);
  host[FERRY_FAM_SWAP] = swap_bytes(in, &c);
}

static void fmt_bytes(double b, char *buf, size_t n) {
  static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int i = 0;
  while (b >= 1024 && i < 6) {
    b /= 1024;
    i++;
  }
  if (i == 0) snprintf(buf, n, "%.0f B", b);
  else snprintf(buf, n, "%.1f %s", b, u[i]);
}

static int tiers_fit(const ferry_plan_input *in, int p, double b, double *short_by) {
  double by[FERRY_PLAN_TIERS][FERRY_PLAN_FAMILIES];
  place_bytes(in, p, b, by);
  int ok = 1;
  for (int t = 0; t < FERRY_PLAN_TIERS; t++) {
    double tot = 0;
    for (int f = 0; f < FERRY_PLAN_FAMILIES; f++) tot += by[t][f];
    double s = tot > (double)in->budget[t] ? tot - (double)in->budget[t] : 0;
    if (short_by) short_by[t] = s;
    if (s > 0) ok = 0;
  }
  return ok;
}

#define MAX_BATCH (1ll << 24)

/* Placement p's bytes per tier and family at the input's batch, whether they
 * fit the budgets and, when not, by how much (in words, in c->why). */
static void candidate_bytes(const ferry_plan_input *in, int p, ferry_plan_candidate *c) {
  double by[FERRY_PLAN_TIERS][FERRY_PLAN_FAMILIES], shortb[FERRY_PLAN_TIERS];
  place_bytes(in, p, (double)in->batch, by);
  for (int t = 0; t < FERRY_PLAN_TIERS; t++) {
    double tot = 0;
    for (int f = 0; f < FERRY_PLAN_FAMILIES; f++) {
      c->bytes[t][f] = (uint64_t)llround(by[t][f]);
      tot += (double)c->bytes[t][f];
    }
    c->tier_bytes[t] = (uint64_t)tot;
  }
  c->fits = tiers_fit(in, p, (double)in->batch, shortb);
  for (int t = 0; t < FERRY_PLAN_TIERS; t++) c->short_by[t] = (uint64_t)llround(shortb[t]);
  c->pinned_bytes = in->budget[FERRY_PLAN_HOST]; /* pool + staging, pinned at finalize */
  if (c->fits) {
    snprintf(c->why, sizeof c->why, "fits");
    return;
  }
  size_t o = 0;
  for (int t = 0; t < FERRY_PLAN_TIERS; t++) {
    if (!c->short_by[t]) continue;
    char s[32], need[32], have[32];
    fmt_bytes((double)c->short_by[t], s, sizeof s);
    fmt_bytes((double)c->tier_bytes[t], need, sizeof need);
    fmt_bytes((double)in->budget[t], have, sizeof have);
    o += (size_t)snprintf(c->why + o, sizeof c->why - o, "%s%s short by %s (needs %s, budget %s)",
                          o ? "; " : "", ferry_plan_tier_name(t), s, need, have);
    if (o >= sizeof c->why) break;
  }
}

/* Bytes of one family of the whole model as the engine lays it out: each
 * group's tensors packed into chunks trimmed to what they hold (4 KiB
 * alignment on the way to NVMe), e bytes per element. */
static double family_bytes(const ferry_plan_model *m, double e) {
  double E = (double)ferry_plan_embed_params(m), B = (double)ferry_plan_block_params(m);
  double H = (double)ferry_plan_head_params(m);
  return round_chunk(E * e, 4096) + (double)m->layers * round_chunk(B * e, 4096) +
         round_chunk(H * e, 4096);
}

/* The optimizer family of the whole model on NVMe: per group, the master
 * (when there is one) and each state, as ferry_optimizer_state_bytes packs
 * a group's elements, each rounded to 4 KiB. */
static double optim_group_bytes(const ferry_plan_input *in, const place_ctx *c, double n) {
  return round_chunk(n * c->mb, 4096) + c->k * round_chunk(state_bytes(in, n), 4096);
}

/* ... this rank's share of each group (stage >= 1: 1/N of it). */
static double optim_family_bytes(const ferry_plan_input *in, const place_ctx *c) {
  const ferry_plan_model *m = &in->model;
  double so = c->so;
  return optim_group_bytes(in, c, (double)ferry_plan_embed_params(m) * so) +
         (double)m->layers * optim_group_bytes(in, c, (double)ferry_plan_block_params(m) * so) +
         optim_group_bytes(in, c, (double)ferry_plan_head_params(m) * so);
}

double ferry_plan_optim_nvme_bytes(const ferry_plan_input *in, int p, const uint64_t *group_params,
                                   size_t ngroups) {
  if (!in || p < 0 || p >= FERRY_PLACEMENTS || (ngroups && !group_params)) return 0;
  place_ctx c = place_context(in, p);
  double o = 0;
  for (size_t i = 0; i < ngroups; i++)
    o += optim_group_bytes(in, &c, (double)group_params[i] * c.so);
  return o;
}

/* Param bytes of the first (front) or last (!front) n groups. */
static double end_groups_bytes(const ferry_plan_model *m, int64_t n, int front, double pb) {
  int64_t L = m->layers;
  double E = (double)ferry_plan_embed_params(m), B = (double)ferry_plan_block_params(m);
  double H = (double)ferry_plan_head_params(m);
  if (n <= 0) return 0;
  if (n >= L + 2) return (E + (double)L * B + H) * pb;
  double edge = front ? E : H; /* the embedding opens forward; the head closes it */
  return (edge + (double)(n - 1 > L ? L : n - 1) * B) * pb;
}

/* NVMe params: how many groups each pool keeps at the forward/backward turn:
 * the head (used back to back) and whole groups in the room the tier's
 * budget leaves beside everything else. */
static void cached_groups(const ferry_plan_input *in, const place_ctx *c,
                          ferry_plan_candidate *w) {
  const ferry_plan_candidate *k = w;
  int64_t groups = ferry_plan_groups(&in->model);
  w->cached_groups_host = w->cached_groups_device = 0;
  if (c->ph != FERRY_PLAN_NVME || c->grp_p <= 0) return;
  for (int t = FERRY_PLAN_GPU; t <= FERRY_PLAN_HOST; t++) {
    double room = (double)in->budget[t] - (double)k->tier_bytes[t];
    int64_t n = 1 + (room > 0 ? (int64_t)floor(room / c->grp_p) : 0);
    if (n > groups) n = groups;
    if (t == FERRY_PLAN_GPU) w->cached_groups_device = n;
    else w->cached_groups_host = n;
  }
}

/* NVMe bytes per step, per family and direction (docs/PLANNING.md, "NVMe
 * bytes per step"). A copy in the device implies one in the host pool, so
 * the host's cached groups are the ones not read again. */
static void nvme_traffic(const ferry_plan_input *in, const place_ctx *c, ferry_plan_candidate *k) {
  const ferry_plan_model *m = &in->model;
  double A = (double)in->grad_accumulation;
  memset(k->nvme_read, 0, sizeof k->nvme_read);
  memset(k->nvme_write, 0, sizeof k->nvme_write);
  if (c->oh == FERRY_PLAN_NVME) { /* the master (if any) and each state: this rank's share */
    double o = optim_family_bytes(in, c);
    k->nvme_read[FERRY_PLAN_NV_OPTIM] = o;
    k->nvme_write[FERRY_PLAN_NV_OPTIM] = o;
  }
  if (c->gh == FERRY_PLAN_GRADS_NVME) { /* written per micro-batch, read back to accumulate
                                           (A - 1) times and once by the step */
    double g = family_bytes(m, c->gb) * c->sg;
    k->nvme_write[FERRY_PLAN_NV_GRADS] = A * g;
    k->nvme_read[FERRY_PLAN_NV_GRADS] = A * g;
  }
  if (c->ph == FERRY_PLAN_NVME) { /* forward and backward per micro-batch, less the turns */
    double pf = family_bytes(m, c->pb);
    cached_groups(in, c, k);
    double back = end_groups_bytes(m, k->cached_groups_host, 0, c->pb);
    double front = end_groups_bytes(m, k->cached_groups_host, 1, c->pb);
    k->nvme_read[FERRY_PLAN_NV_PARAMS] = 2 * A * pf - A * back - (A - 1) * front;
    /* written once by the step (from the master, or the params themselves
     * updated in place); a bf16 master is the params: no master traffic,
     * but the step reads the params it updates once more (staged from
     * their home; by then the group has left the host pool) */
    if (bf16_master(in)) k->nvme_read[FERRY_PLAN_NV_PARAMS] += pf;
    k->nvme_write[FERRY_PLAN_NV_PARAMS] = pf;
    /* stage 3: each rank reads and writes its share, the rest is gathered */
    k->nvme_read[FERRY_PLAN_NV_PARAMS] *= c->sp;
    k->nvme_write[FERRY_PLAN_NV_PARAMS] *= c->sp;
  }
  k->nvme_read_bytes = k->nvme_write_bytes = 0;
  for (int f = 0; f < FERRY_PLAN_NV_FAMILIES; f++) {
    k->nvme_read_bytes += k->nvme_read[f];
    k->nvme_write_bytes += k->nvme_write[f];
  }
}

/* The process's peak RSS: the budgets reserved at finalize, the trainer's
 * host memory, the library and the CUDA context (docs/PLANNING.md). */
static void rss_bytes(const ferry_plan_input *in, ferry_plan_rss *r) {
  const ferry_plan_model *m = &in->model;
  int host = in->device == FERRY_PLAN_DEV_HOST;
  double b = (double)in->batch, pb = in->precision == FERRY_PREC_FP32 ? 4 : 2;
  memset(r, 0, sizeof *r);
  r->host_budget = in->budget[FERRY_PLAN_HOST];
  r->device_budget = host ? in->budget[FERRY_PLAN_GPU] : 0;
  if (host) r->activations = (uint64_t)llround(activation_bytes(in, b) + workspace_bytes(in, b));
  /* token ids in and targets (int32); the CPU model over 16-bit params keeps
   * fp32 weights and grads of two groups (the embedding, the largest other) */
  double scratch = 8 * b * (double)in->seq;
  if (host && pb < 4) {
    double E = (double)ferry_plan_embed_params(m), B = (double)ferry_plan_block_params(m);
    double H = (double)ferry_plan_head_params(m);
    scratch += 2 * 4 * (E + fmax(B, H));
  }
  r->scratch = (uint64_t)llround(scratch);
  r->library = FERRY_PLAN_LIBRARY_OVERHEAD;
  r->cuda = host ? 0 : FERRY_PLAN_CUDA_HOST_BYTES;
  r->total = r->host_budget + r->device_budget + r->activations + r->scratch + r->library + r->cuda;
}

/* Bytes one rank sends per step in ring collectives (docs/PLANNING.md,
 * "Data parallelism"): a reduce-scatter or an all-gather moves (N - 1) / N
 * of its buffer per rank, an all-reduce twice that. Grads go as fp32 (the
 * engine reduces its fp32 drain), params at their dtype. */
static void comm_bytes(const ferry_plan_input *in, const place_ctx *x, ferry_plan_candidate *c) {
  double N = x->N, A = (double)in->grad_accumulation, f = (N - 1) / N;
  double grads = 4 * x->P, params = x->P * x->pb;
  c->comm_grad_bytes = c->comm_param_bytes = 0;
  if (N > 1) {
    switch (x->stage) {
    case 0: c->comm_grad_bytes = A * 2 * f * grads; break;  /* all-reduce per micro-batch */
    case 1: c->comm_grad_bytes = f * grads; break;          /* reduce-scatter once */
    default: c->comm_grad_bytes = A * f * grads; break;     /* reduce-scatter per micro-batch */
    }
    /* the new params gathered after the step (1, 2); at 3 each rank keeps
     * its share and every forward and backward fetch gathers the group */
    c->comm_param_bytes = x->stage == 0 ? 0 : x->stage == 3 ? 2 * A * f * params : f * params;
  }
  c->comm_bytes = c->comm_grad_bytes + c->comm_param_bytes;
  /* the ring runs at its slowest link: the network between nodes, the
   * node's GPU links (PCIe unless --intra-gbps) between a node's ranks */
  double intra = in->intra_gbps > 0 ? in->intra_gbps : 8 * in->bw.h2d_gbps;
  c->comm_link_gbps = N <= 1            ? 0
                      : in->nodes <= 1  ? intra
                      : in->gpus <= 1   ? in->net_gbps
                                        : fmin(in->net_gbps, intra);
  c->comm_seconds = N > 1 ? c->comm_bytes / (c->comm_link_gbps / 8 * 1e9) : 0;
}

/* The pipeline's step: the longest component plus one group's worth of
 * each of the others (filling and draining the pipeline); `skip` is a
 * component left out (-1: none). */
static double pipeline_step(const double *sec, int64_t groups, int skip, int *bottleneck,
                            double *fill) {
  double mx = 0, sum = 0;
  int b = FERRY_COMP_COMPUTE;
  for (int i = 0; i < FERRY_COMPONENTS; i++) {
    if (i == skip) continue;
    sum += sec[i];
    if (sec[i] > mx) {
      mx = sec[i];
      b = i;
    }
  }
  double f = (sum - mx) / (double)groups;
  if (bottleneck) *bottleneck = b;
  if (fill) *fill = f;
  return mx + f;
}

/* Placement p's traffic per step, each component's seconds, the bottleneck
 * and the step time of the pipeline. A step is grad_accumulation
 * micro-batches; with ranks, one rank's. */
static void candidate_time(const ferry_plan_input *in, int p, ferry_plan_candidate *c) {
  const ferry_plan_model *m = &in->model;
  place_ctx x = place_context(in, p);
  double P = x.P, pb = x.pb, A = (double)in->grad_accumulation;
  double tokens = A * (double)in->batch * (double)in->seq;
  double fwd_bwd = in->checkpointing ? 8 : 6; /* recompute adds one forward */
  double attn = (in->checkpointing ? 16 : 12) * (double)m->layers * (double)in->seq * q_dim(m);
  c->flops = fwd_bwd * P * tokens + attn * tokens;
  int none = x.gh == FERRY_PLAN_GRADS_NONE;
  /* grad in (the accumulator, or the drained 16-bit grads), master r/w,
   * states r/w, param out: ferry_optimizer_bytes_per_param */
  double opt_bytes = ferry_plan_step_bytes_per_param(in, p);
  double tflops = in->precision == FERRY_PREC_FP32 || in->device == FERRY_PLAN_DEV_HOST
                      ? in->bw.device_tflops_fp32 : in->bw.device_tflops;
  if (p == FERRY_PLACE_ZERO_OFFLOAD) c->h2d_bytes = P * pb;
  else if (p != FERRY_PLACE_ALL_GPU) c->h2d_bytes = 2 * A * P * pb; /* fwd and bwd fetches */
  if (p != FERRY_PLACE_ALL_GPU) {
    c->d2h_bytes = A * P * pb;
    /* a bf16 master whose params live on the device: the step reads them back */
    if (bf16_master(in) && x.ph == FERRY_PLAN_GPU) c->d2h_bytes += P * pb;
    /* + the drained grads summed into the accumulator (first micro-batch
     * writes it, later ones read and write it); the step updates this
     * rank's share, and from stage 2 the accumulator is a share too */
    double accum = x.sg == 1 ? P * (A * (pb + x.gb) + (A - 1) * x.gb)
                             : P * A * pb + P * x.sg * (A * x.gb + (A - 1) * x.gb);
    c->cpu_bytes = P * x.so * opt_bytes + (none ? 0 : accum);
  }
  nvme_traffic(in, &x, c);
  comm_bytes(in, &x, c);
  /* a node's CPU memory bandwidth and NVMe drives serve its `gpus` ranks */
  double share = (double)in->gpus;
  c->seconds[FERRY_COMP_COMPUTE] = c->flops / (tflops * 1e12);
  if (p == FERRY_PLACE_ALL_GPU) /* the step runs on the GPU after backward, not overlapped */
    c->seconds[FERRY_COMP_COMPUTE] += P * x.so * opt_bytes / (in->bw.device_mem_gbps * 1e9);
  c->seconds[FERRY_COMP_H2D] = c->h2d_bytes / (in->bw.h2d_gbps * 1e9);
  c->seconds[FERRY_COMP_D2H] = c->d2h_bytes / (in->bw.d2h_gbps * 1e9);
  c->seconds[FERRY_COMP_CPU] = share * c->cpu_bytes / (in->bw.cpu_optimizer_gbps * 1e9);
  c->seconds[FERRY_COMP_NVME] = share * (c->nvme_read_bytes / (in->bw.nvme_read_gbps * 1e9) +
                                         c->nvme_write_bytes / (in->bw.nvme_write_gbps * 1e9));
  c->seconds[FERRY_COMP_NET] = c->comm_seconds;
  int64_t groups = ferry_plan_groups(m);
  c->step_seconds = pipeline_step(c->seconds, groups, -1, &c->bottleneck, &c->fill_seconds);
  /* communication overlaps compute and the optimizer: what it adds to the
   * step is the part not hidden */
  double alone = pipeline_step(c->seconds, groups, FERRY_COMP_NET, NULL, NULL);
  c->comm_exposed_seconds = c->comm_seconds > 0 ? c->step_seconds - alone : 0;
  c->comm_hidden_fraction =
      c->comm_seconds > 0 ? 1 - c->comm_exposed_seconds / c->comm_seconds : 1;
}

/* The largest batch of placement p that fits at this sequence length. */
static int64_t max_batch(const ferry_plan_input *in, int p) {
  if (!tiers_fit(in, p, 1, NULL)) return 0;
  int64_t lo = 1, hi = 2;
  while (hi <= MAX_BATCH && tiers_fit(in, p, (double)hi, NULL)) {
    lo = hi;
    hi *= 2;
  }
  if (hi > MAX_BATCH) hi = MAX_BATCH + 1;
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    if (tiers_fit(in, p, (double)mid, NULL)) lo = mid;
    else hi = mid;
  }
  return lo;
}

/* The next group's NVMe optimizer chunks, read ahead when the host budget
 * has room beside the working set (not part of the fit). */
static void candidate_readahead(const ferry_plan_input *in, int p, ferry_plan_candidate *c) {
  place_ctx x = place_context(in, p);
  c->readahead_bytes = x.oh == FERRY_PLAN_NVME ? (uint64_t)llround(x.grp_o) : 0;
  c->readahead_fits = c->tier_bytes[FERRY_PLAN_HOST] + c->readahead_bytes <=
                      in->budget[FERRY_PLAN_HOST];
}

static void candidate(const ferry_plan_input *in, int p, ferry_plan_candidate *c) {
  memset(c, 0, sizeof *c);
  c->placement = p;
  c->grads = ferry_plan_grads_auto(in, p);
  c->optim_bytes_per_param = ferry_plan_optim_bytes_per_param(in, p);
  c->step_bytes_per_param = ferry_plan_step_bytes_per_param(in, p);
  candidate_bytes(in, p, c);
  candidate_time(in, p, c);
  candidate_readahead(in, p, c);
  rss_bytes(in, &c->rss);
  c->max_batch = max_batch(in, p);
}

int ferry_plan_compute(const ferry_plan_input *in, ferry_plan_result *out, char *why, size_t wl) {
  if (!in || !out) return fail(why, wl, FERRY_EINVAL, "plan: NULL argument");
  const ferry_plan_model *m = &in->model;
  if (m->layers < 1 || m->hidden < 1 || m->heads < 1 || m->kv_heads < 1 || m->ffn < 1 ||
      m->head_dim < 1 || m->vocab < 0)
    return fail(why, wl, FERRY_EINVAL, "plan: model '%s' has a zero or negative dimension",
                m->name);
  if (in->batch < 1 || in->batch > MAX_BATCH)
    return fail(why, wl, FERRY_EINVAL, "batch %lld: must be 1 to %lld", (long long)in->batch,
                (long long)MAX_BATCH);
  if (in->seq < 1 || in->seq > (1ll << 22))
    return fail(why, wl, FERRY_EINVAL, "sequence length %lld: must be 1 to %lld",
                (long long)in->seq, 1ll << 22);
  if (m->arch == FERRY_ARCH_GPT2 && m->positions && in->seq > m->positions)
    return fail(why, wl, FERRY_EINVAL,
                "sequence length %lld: %s has learned positions for at most %lld tokens",
                (long long)in->seq, m->name, (long long)m->positions);
  if (in->precision < 0 || in->precision > 2)
    return fail(why, wl, FERRY_EINVAL, "precision %d: fp32, fp16 or bf16", in->precision);
  if (in->optimizer < 0 || in->optimizer > 5)
    return fail(why, wl, FERRY_EINVAL, "optimizer %d: adamw, adam, adagrad, lamb, sgd or lion",
                in->optimizer);
  if (in->grad_accumulation < 1 || in->grad_accumulation > 1000000)
    return fail(why, wl, FERRY_EINVAL, "grad accumulation %lld: must be 1 to 1000000",
                (long long)in->grad_accumulation);
  if (!(in->clip_grad_norm >= 0) || !isfinite(in->clip_grad_norm))
    return fail(why, wl, FERRY_EINVAL, "clip_grad_norm must be >= 0 (0 = off)");
  if (in->grad_precision != FERRY_PREC_FP32 && in->grad_precision != FERRY_PREC_BF16)
    return fail(why, wl, FERRY_EINVAL, "grad precision %d: fp32 or bf16", in->grad_precision);
  if (in->device != FERRY_PLAN_DEV_CUDA && in->device != FERRY_PLAN_DEV_HOST)
    return fail(why, wl, FERRY_EINVAL, "device %d: cuda or host", in->device);
  int sdt = in->state_dtype ? in->state_dtype : FERRY_DT_F32;
  if (!ferry_plan_dtype_name(sdt))
    return fail(why, wl, FERRY_EINVAL, "optimizer.state_dtype %d: fp32, bf16 or int8", sdt);
  int64_t sbk = in->state_block;
  if (sbk && (sbk < 32 || sbk > 4096 || (sbk & (sbk - 1))))
    return fail(why, wl, FERRY_EINVAL,
                "optimizer.state_block %lld: a power of two from 32 to 4096 (default 256)",
                (long long)sbk);
  int mdt = in->master_dtype ? in->master_dtype : FERRY_DT_F32;
  if (mdt != FERRY_DT_F32 && mdt != FERRY_DT_BF16)
    return fail(why, wl, FERRY_EINVAL, "precision.master %d: fp32 or bf16", mdt);
  if (mdt == FERRY_DT_BF16 && in->precision != FERRY_PREC_BF16)
    return fail(why, wl, FERRY_EINVAL,
                "precision.master = bf16 needs bf16 params (precision.params = bf16, not %s): "
                "the params are the master",
                ferry_plan_precision_name(in->precision));
  if (in->gpus < 1 || in->gpus > 65536)
    return fail(why, wl, FERRY_EINVAL, "gpus %d: ranks per node must be 1 to 65536", in->gpus);
  if (in->nodes < 1 || in->nodes > 65536)
    return fail(why, wl, FERRY_EINVAL, "nodes %d: must be 1 to 65536", in->nodes);
  if (in->zero_stage < 0 || in->zero_stage > 3)
    return fail(why, wl, FERRY_EINVAL, "zero_stage %d: 0, 1, 2 or 3 (dist.zero_stage)",
                in->zero_stage);
  if (!(in->net_gbps > 0) || !isfinite(in->net_gbps))
    return fail(why, wl, FERRY_EINVAL, "net_gbps %g: the network's Gb/s must be > 0",
                in->net_gbps);
  if (!(in->intra_gbps >= 0) || !isfinite(in->intra_gbps))
    return fail(why, wl, FERRY_EINVAL, "intra_gbps %g: must be > 0 (0: the PCIe figure)",
                in->intra_gbps);
  const double *bws[] = {&in->bw.h2d_gbps,           &in->bw.d2h_gbps,
                         &in->bw.nvme_read_gbps,     &in->bw.nvme_write_gbps,
                         &in->bw.cpu_optimizer_gbps, &in->bw.device_tflops,
                         &in->bw.device_tflops_fp32, &in->bw.device_mem_gbps};
  for (size_t i = 0; i < sizeof bws / sizeof bws[0]; i++)
    if (!(*bws[i] > 0) || !isfinite(*bws[i]))
      return fail(why, wl, FERRY_EINVAL, "plan: bandwidth %s must be > 0",
                  ferry_plan_bandwidth_key(1u << i));
  memset(out, 0, sizeof *out);
  out->params = ferry_plan_model_params(m);
  out->ranks = in->gpus * in->nodes;
  out->largest_group = ferry_plan_largest_group(m);
  out->groups = ferry_plan_groups(m);
  out->recommended = -1;
  out->closest = 0;
  double best_short = -1;
  for (int p = 0; p < FERRY_PLACEMENTS; p++) {
    ferry_plan_candidate *c = &out->cand[p];
    candidate(in, p, c);
    if (c->fits && (out->recommended < 0 ||
                    c->step_seconds < out->cand[out->recommended].step_seconds * (1 - 1e-9)))
      out->recommended = p;
    double s = 0;
    for (int t = 0; t < FERRY_PLAN_TIERS; t++) s += (double)c->short_by[t];
    if (best_short < 0 || s < best_short) {
      best_short = s;
      out->closest = p;
    }
  }
  if (out->recommended >= 0) out->closest = out->recommended;
  return FERRY_OK;
}

/* ======================================================================== */
/* The largest model that fits                                              */

/* Whether a dense model of n parameters fits: -1 on an input error. */
static int dense_fits(const ferry_plan_input *base, uint64_t n, ferry_plan_input *in,
                      ferry_plan_result *r, char *why, size_t wl) {
  *in = *base;
  if (ferry_plan_model_from_params(n, &in->model, why, wl)) return -1;
  if (ferry_plan_compute(in, r, why, wl)) return -1;
  return r->recommended >= 0;
}

int ferry_plan_largest(const ferry_plan_input *in, double resolution,
                       ferry_plan_largest_result *out, char *why, size_t wl) {
  if (!in || !out) return fail(why, wl, FERRY_EINVAL, "plan: NULL argument");
  if (!(resolution > 0 && resolution <= 1))
    return fail(why, wl, FERRY_EINVAL, "plan: resolution %g: must be in (0, 1]", resolution);
  memset(out, 0, sizeof *out);
  ferry_plan_input t;
  ferry_plan_result r;
  const uint64_t cap = 1000000000000000ull;
  uint64_t lo = 1000000, hi = 0;
  int f = dense_fits(in, lo, &t, &r, why, wl);
  out->evaluations++;
  if (f < 0) return FERRY_EINVAL;
  if (!f) { /* below a million: try the smallest model */
    hi = lo;
    lo = 1000;
    f = dense_fits(in, lo, &t, &r, why, wl);
    out->evaluations++;
    if (f <= 0) return f < 0 ? FERRY_EINVAL : FERRY_OK; /* nothing fits */
  }
  while (!hi) { /* doubling */
    uint64_t n = lo * 2 > cap ? cap : lo * 2;
    f = dense_fits(in, n, &t, &r, why, wl);
    out->evaluations++;
    if (f < 0) return FERRY_EINVAL;
    if (f && n == cap) return fail(why, wl, FERRY_EINVAL, "plan: 10^15 parameters still fit");
    if (f) lo = n;
    else hi = n;
  }
  while ((double)hi > (double)lo * (1 + resolution)) { /* geometric bisection */
    uint64_t mid = (uint64_t)llround(sqrt((double)lo * (double)hi));
    if (mid <= lo || mid >= hi) break;
    f = dense_fits(in, mid, &t, &r, why, wl);
    out->evaluations++;
    if (f < 0) return FERRY_EINVAL;
    if (f) lo = mid;
    else hi = mid;
  }
  out->params = lo;
  out->next = hi;
  if (dense_fits(in, hi, &t, &out->above, why, wl) < 0) return FERRY_EINVAL;
  if (dense_fits(in, lo, &out->in, &out->fit, why, wl) < 0) return FERRY_EINVAL;
  out->evaluations += 2;
  return FERRY_OK;
}

/* ======================================================================== */
/* DeepSpeed's estimators (published formulas, one node, one GPU)            */

void ferry_plan_deepspeed_estimate(int stage, int offload_optimizer, int offload_params,
                                   uint64_t params, uint64_t largest_layer, double abf,
                                   double *gpu_bytes, double *cpu_bytes) {
  double P = (double)params, LL = (double)largest_layer;
  if (stage == 2) {
    if (offload_optimizer) { /* 16-bit params on the GPU; max(4 * gpus, 16) = 16 on the CPU */
      *gpu_bytes = 2 * P;
      *cpu_bytes = 16 * P * abf;
    } else { /* 16-bit params and grads, plus 16 bytes of fp32 states per param */
      *gpu_bytes = 4 * P + 16 * P;
      *cpu_bytes = 4 * P * abf;
    }
    return;
  }
  /* stage 3: the largest layer's 16-bit params and grads stay on the GPU */
  if (offload_optimizer && offload_params) {
    *gpu_bytes = 4 * LL;
    *cpu_bytes = 18 * P * abf;
  } else if (offload_optimizer) {
    *gpu_bytes = 4 * LL + 2 * P;
    *cpu_bytes = 16 * P * abf;
  } else {
    *gpu_bytes = 4 * LL + 18 * P;
    *cpu_bytes = 4 * LL * abf;
  }
}
