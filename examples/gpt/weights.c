/* examples/gpt/weights.c — the model's weights in and out: seeded random
 * init, loading Hugging Face safetensors (one file or a sharded folder;
 * F32/F16/BF16, names checked, shapes and dtypes checked) and saving fp32
 * safetensors, all through the parameter provider, one group at a time.
 */
#include "gpt.h"

#include "ferry.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int ends(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && !strcmp(s + a - b, suf);
}

static float randn(uint64_t *st) {
  double u1 = ((double)(gpt_rand(st) >> 11) + 1.0) / 9007199254740993.0;
  double u2 = (double)(gpt_rand(st) >> 11) / 9007199254740992.0;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

int gpt_weights_init(const gpt_schema *s, gpt_provider *p, uint64_t seed) {
  float resid = 0.02f / sqrtf(2.0f * (float)s->cfg.n_layer);
  for (int gi = 0; gi < s->n_groups; gi++) {
    gpt_group_view v;
    if (p->fetch(p->ctx, gi, GPT_FETCH_WRITE, &v)) return -1;
    for (int i = s->group_first[gi]; i < s->group_first[gi + 1]; i++) {
      const gpt_param *q = &s->params[i];
      float *w = v.w[q->slot];
      /* one stream per tensor, so a tensor's values do not depend on others */
      uint64_t st = seed * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xD1B54A32D192ED03ull;
      int is_norm = q->ndim == 1 && (strstr(q->name, "ln_") || strstr(q->name, "norm"));
      int is_bias = ends(q->name, ".bias") && !is_norm;
      int is_resid = strstr(q->name, "c_proj.weight") || strstr(q->name, "o_proj") ||
                     strstr(q->name, "down_proj");
      for (size_t k = 0; k < q->numel; k++) {
        if (is_norm && ends(q->name, ".weight")) w[k] = 1.0f;
        else if (is_norm || is_bias) w[k] = 0.0f;
        else w[k] = randn(&st) * (is_resid ? resid : 0.02f);
      }
    }
    if (p->release(p->ctx, gi, GPT_RELEASE_WRITTEN)) return -1;
  }
  return 0;
}

static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
  if (e == 0) {
    if (m == 0) {
      bits = sign;
    } else { /* subnormal */
      int sh = 0;
      while (!(m & 0x400)) m <<= 1, sh++;
      m &= 0x3ff;
      bits = sign | (uint32_t)(127 - 15 + 1 - sh) << 23 | m << 13;
    }
  } else if (e == 31) {
    bits = sign | 0x7f800000u | m << 13;
  } else {
    bits = sign | (e - 15 + 127) << 23 | m << 13;
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static float bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static void shape_str(char *b, size_t n, int ndim, const int64_t *sh) {
  size_t at = (size_t)snprintf(b, n, "[");
  for (int d = 0; d < ndim && at < n; d++)
    at += (size_t)snprintf(b + at, n - at, "%s%lld", d ? ", " : "", (long long)sh[d]);
  if (at < n) snprintf(b + at, n - at, "]");
}

/* Finds the file's tensor for schema name `name`: the name itself, or with
 * the "transformer." prefix GPT2LMHeadModel's state dict carries. */
static int find_tensor(ferry_safetensors *f, const gpt_schema *s, const char *name,
                       ferry_st_tensor *t, size_t *idx) {
  if (!ferry_safetensors_find(f, name, t, idx)) return 0;
  if (s->cfg.family == GPT_GPT2) {
    char alt[128];
    snprintf(alt, sizeof alt, "transformer.%s", name);
    if (!ferry_safetensors_find(f, alt, t, idx)) return 0;
  }
  return -1;
}

int gpt_weights_load(const gpt_schema *s, gpt_provider *p, const char *path, char *err,
                     size_t el) {
  ferry_safetensors *f;
  if (ferry_safetensors_open(path, &f)) {
    snprintf(err, el, "%s", ferry_last_error());
    return -1;
  }
  /* check every tensor before touching any weight */
  for (int i = 0; i < s->n_params; i++) {
    const gpt_param *q = &s->params[i];
    ferry_st_tensor t;
    size_t idx;
    char want[64], got[64];
    if (find_tensor(f, s, q->name, &t, &idx)) {
      snprintf(err, el, "%s: tensor '%s' is missing", path, q->name);
      goto fail;
    }
    if (t.dtype != FERRY_ST_F32 && t.dtype != FERRY_ST_F16 && t.dtype != FERRY_ST_BF16) {
      snprintf(err, el, "%s: tensor '%s' has dtype %s, expected F32, F16 or BF16", path, q->name,
               ferry_st_dtype_name(t.dtype));
      goto fail;
    }
    int same = t.ndim == q->ndim;
    for (int d = 0; same && d < q->ndim; d++) same = t.shape[d] == q->shape[d];
    if (!same) {
      shape_str(want, sizeof want, q->ndim, q->shape);
      shape_str(got, sizeof got, t.ndim, t.shape);
      snprintf(err, el, "%s: tensor '%s' has shape %s, the config needs %s", path, q->name, got,
               want);
      goto fail;
    }
  }
  enum { CHUNK = 1 << 16 };
  uint16_t *tmp = malloc(CHUNK * sizeof *tmp);
  if (!tmp) {
    snprintf(err, el, "out of memory");
    goto fail;
  }
  for (int gi = 0; gi < s->n_groups; gi++) {
    gpt_group_view v;
    if (p->fetch(p->ctx, gi, GPT_FETCH_WRITE, &v)) {
      snprintf(err, el, "fetch of group %d failed", gi);
      free(tmp);
      goto fail;
    }
    for (int i = s->group_first[gi]; i < s->group_first[gi + 1]; i++) {
      const gpt_param *q = &s->params[i];
      ferry_st_tensor t;
      size_t idx;
      find_tensor(f, s, q->name, &t, &idx);
      float *w = v.w[q->slot];
      int rc = 0;
      if (t.dtype == FERRY_ST_F32) {
        rc = ferry_safetensors_read(f, idx, 0, w, q->numel * sizeof(float));
      } else {
        for (size_t at = 0; !rc && at < q->numel; at += CHUNK) {
          size_t n = q->numel - at < CHUNK ? q->numel - at : CHUNK;
          rc = ferry_safetensors_read(f, idx, at * 2, tmp, n * 2);
          for (size_t k = 0; !rc && k < n; k++)
            w[at + k] = t.dtype == FERRY_ST_F16 ? f16_to_f32(tmp[k]) : bf16_to_f32(tmp[k]);
        }
      }
      if (rc) {
        snprintf(err, el, "%s", ferry_safetensors_last_error(f));
        p->release(p->ctx, gi, GPT_RELEASE_WRITTEN);
        free(tmp);
        goto fail;
      }
    }
    if (p->release(p->ctx, gi, GPT_RELEASE_WRITTEN)) {
      snprintf(err, el, "release of group %d failed", gi);
      free(tmp);
      goto fail;
    }
  }
  free(tmp);
  ferry_safetensors_close(f);
  return 0;
fail:
  ferry_safetensors_close(f);
  return -1;
}

int gpt_weights_save(const gpt_schema *s, gpt_provider *p, const char *path, uint64_t max_shard,
                     char *err, size_t el) {
  ferry_safetensors_writer *w;
  if (ferry_safetensors_writer_create(path, max_shard, &w)) {
    snprintf(err, el, "%s", ferry_last_error());
    return -1;
  }
  int rc = ferry_safetensors_writer_metadata(w, "format", "pt");
  for (int i = 0; !rc && i < s->n_params; i++)
    rc = ferry_safetensors_writer_add(w, s->params[i].name, FERRY_ST_F32, s->params[i].ndim,
                                      s->params[i].shape);
  const char *next;
  while (!rc && (next = ferry_safetensors_writer_next(w))) {
    const gpt_param *q = gpt_schema_find(s, next);
    gpt_group_view v;
    if (!q || p->fetch(p->ctx, q->group, GPT_FETCH_FORWARD, &v)) {
      snprintf(err, el, "%s: cannot fetch '%s'", path, next);
      ferry_safetensors_writer_destroy(w);
      return -1;
    }
    rc = ferry_safetensors_writer_write(w, next, v.w[q->slot], q->numel * sizeof(float));
    p->release(p->ctx, q->group, GPT_RELEASE_FORWARD);
  }
  if (!rc) rc = ferry_safetensors_writer_finish(w);
  if (rc) snprintf(err, el, "%s", ferry_safetensors_writer_last_error(w));
  ferry_safetensors_writer_destroy(w);
  return rc ? -1 : 0;
}
