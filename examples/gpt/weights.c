/* examples/gpt/weights.c — the model's weights in and out: a per-tensor
 * source of initial values (the seeded init of init.c, or Hugging Face
 * safetensors: one file or a sharded folder; F32/F16/BF16, names, shapes
 * and dtypes checked up front), loading through the parameter provider
 * one group at a time, and saving fp32 safetensors from a per-tensor
 * reader.
 */
#include "gpt.h"
#include "gpt_init.h"

#include "core/untrusted.h"
#include "ferry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void shape_str(char *b, size_t n, int ndim, const int64_t *sh) {
  size_t at = (size_t)snprintf(b, n, "[");
  for (int d = 0; d < ndim && at < n; d++)
    at += (size_t)snprintf(b + at, n - at, "%s%lld", d ? ", " : "", (long long)sh[d]);
  if (at < n) snprintf(b + at, n - at, "]");
}

/* Finds the file's tensor for schema name `name`: the name itself, or with
 * the "transformer." prefix GPT2LMHeadModel's state dict carries. */
static int find_tensor(ferry_safetensors *f, const gpt_schema *s, const char *name,
                       ferry_safetensors_tensor *t, size_t *idx) {
  if (!ferry_safetensors_find(f, name, t, idx)) return 0;
  if (s->cfg.family == GPT_GPT2) {
    char alt[128];
    snprintf(alt, sizeof alt, "transformer.%s", name);
    if (!ferry_safetensors_find(f, alt, t, idx)) return 0;
  }
  return -1;
}

struct gpt_weights_src {
  const gpt_schema *s;
  uint64_t seed;
  ferry_safetensors *f; /* NULL: random init */
  uint16_t *tmp;        /* 16-bit conversion buffer */
};

enum { SRC_CHUNK = 1 << 16 };

int gpt_weights_src_open(const gpt_schema *s, const char *path, uint64_t seed,
                         gpt_weights_src **out, char *err, size_t el) {
  gpt_weights_src *w = calloc(1, sizeof *w);
  if (!w) {
    snprintf(err, el, "out of memory");
    return -1;
  }
  w->s = s;
  w->seed = seed;
  *out = w;
  if (!path) return 0;
  if (ferry_safetensors_open(path, &w->f)) {
    snprintf(err, el, "%s", ferry_last_error());
    goto fail;
  }
  /* check every tensor before any value is handed out */
  for (int i = 0; i < s->n_params; i++) {
    const gpt_param *q = &s->params[i];
    ferry_safetensors_tensor t;
    size_t idx;
    char want[64], got[64];
    if (find_tensor(w->f, s, q->name, &t, &idx)) {
      snprintf(err, el, "%s: tensor '%s' is missing", path, q->name);
      goto fail;
    }
    if (t.dtype != FERRY_DT_F32 && t.dtype != FERRY_DT_F16 && t.dtype != FERRY_DT_BF16) {
      snprintf(err, el, "%s: tensor '%s' has dtype %s, expected F32, F16 or BF16", path, q->name,
               ferry_dtype_name(t.dtype));
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
  w->tmp = malloc(SRC_CHUNK * sizeof *w->tmp);
  if (!w->tmp) {
    snprintf(err, el, "out of memory");
    goto fail;
  }
  return 0;
fail:
  gpt_weights_src_close(w);
  *out = NULL;
  return -1;
}

int gpt_weights_unused(const gpt_schema *s, const char *path, char *list, size_t cap,
                       char *err, size_t el) {
  ferry_safetensors *f;
  if (ferry_safetensors_open(path, &f)) {
    snprintf(err, el, "%s", ferry_last_error());
    return -1;
  }
  size_t n = ferry_safetensors_count(f);
  unsigned char *used = calloc(n ? n : 1, 1);
  if (!used) {
    ferry_safetensors_close(f);
    snprintf(err, el, "out of memory");
    return -1;
  }
  for (int i = 0; i < s->n_params; i++) {
    ferry_safetensors_tensor t;
    size_t idx;
    if (!find_tensor(f, s, s->params[i].name, &t, &idx) && idx < n) used[idx] = 1;
  }
  int unused = 0;
  size_t at = 0;
  if (cap) list[0] = '\0';
  for (size_t k = 0; k < n; k++) {
    ferry_safetensors_tensor t;
    if (used[k] || ferry_safetensors_get(f, k, &t)) continue;
    char shown[256]; /* a name from the file: its control characters escaped */
    if (unused < 8 && at < cap) /* the first 8 by name, then how many more */
      at += (size_t)snprintf(list + at, cap - at, "%s'%s'", unused ? ", " : "",
                             ferry_escape(t.name, shown, sizeof shown));
    unused++;
  }
  if (unused > 8 && at < cap) snprintf(list + at, cap - at, " and %d more", unused - 8);
  free(used);
  ferry_safetensors_close(f);
  return unused;
}

void gpt_weights_src_close(gpt_weights_src *w) {
  if (!w) return;
  if (w->f) ferry_safetensors_close(w->f);
  free(w->tmp);
  free(w);
}

int gpt_weights_src_fill(gpt_weights_src *w, int i, float *dst, char *err, size_t el) {
  if (i < 0 || i >= w->s->n_params) {
    snprintf(err, el, "no parameter %d", i);
    return -1;
  }
  if (!w->f) {
    gpt_init_tensor(w->s, i, w->seed, dst, 0);
    return gpt_cancelled() ? snprintf(err, el, "interrupted"), -1 : 0;
  }
  const gpt_param *q = &w->s->params[i];
  ferry_safetensors_tensor t;
  size_t idx;
  find_tensor(w->f, w->s, q->name, &t, &idx); /* checked at open */
  int rc = 0;
  if (t.dtype == FERRY_DT_F32) {
    rc = ferry_safetensors_read(w->f, idx, 0, dst, q->numel * sizeof(float));
  } else {
    for (size_t at = 0; !rc && at < q->numel; at += SRC_CHUNK) {
      size_t n = q->numel - at < SRC_CHUNK ? q->numel - at : SRC_CHUNK;
      rc = ferry_safetensors_read(w->f, idx, at * 2, w->tmp, n * 2);
      for (size_t k = 0; !rc && k < n; k++)
        dst[at + k] = t.dtype == FERRY_DT_F16 ? gpt_f16_to_f32(w->tmp[k]) : gpt_bf16_to_f32(w->tmp[k]);
    }
  }
  if (rc) {
    snprintf(err, el, "%s", ferry_safetensors_last_error(w->f));
    return -1;
  }
  return gpt_cancelled() ? snprintf(err, el, "interrupted"), -1 : 0;
}

/* Every group written through the provider from the source. */
static int fill_provider(const gpt_schema *s, gpt_provider *p, gpt_weights_src *w, char *err,
                         size_t el) {
  for (int gi = 0; gi < s->n_groups; gi++) {
    gpt_group_view v;
    if (p->fetch(p->ctx, gi, GPT_FETCH_WRITE, &v)) {
      snprintf(err, el, "fetch of group %d failed", gi);
      return -1;
    }
    int rc = 0;
    if (v.wdt != FERRY_DT_F32) {
      snprintf(err, el, "group %d: the provider's weights are not fp32 host memory", gi);
      rc = -1;
    }
    for (int i = s->group_first[gi]; !rc && i < s->group_first[gi + 1]; i++)
      rc = gpt_weights_src_fill(w, i, v.w[s->params[i].slot], err, el);
    if (p->release(p->ctx, gi, GPT_RELEASE_WRITTEN) && !rc) {
      snprintf(err, el, "release of group %d failed", gi);
      rc = -1;
    }
    if (rc) return -1;
  }
  return 0;
}

int gpt_weights_init(const gpt_schema *s, gpt_provider *p, uint64_t seed) {
  char err[256];
  gpt_weights_src *w;
  if (gpt_weights_src_open(s, NULL, seed, &w, err, sizeof err)) return -1;
  int rc = fill_provider(s, p, w, err, sizeof err);
  gpt_weights_src_close(w);
  return rc;
}

int gpt_weights_load(const gpt_schema *s, gpt_provider *p, const char *path, char *err,
                     size_t el) {
  gpt_weights_src *w;
  if (gpt_weights_src_open(s, path, 0, &w, err, el)) return -1;
  int rc = fill_provider(s, p, w, err, el);
  gpt_weights_src_close(w);
  return rc;
}

int gpt_weights_save_with(const gpt_schema *s, gpt_weights_read_fn read, void *user,
                          const char *path, uint64_t max_shard, char *err, size_t el) {
  size_t most = 1;
  for (int i = 0; i < s->n_params; i++)
    if (s->params[i].numel > most) most = s->params[i].numel;
  float *buf = malloc(most * sizeof *buf); /* one tensor at a time */
  ferry_safetensors_writer *w;
  if (!buf) {
    snprintf(err, el, "out of memory");
    return -1;
  }
  if (ferry_safetensors_writer_create(path, max_shard, &w)) {
    snprintf(err, el, "%s", ferry_last_error());
    free(buf);
    return -1;
  }
  int rc = ferry_safetensors_writer_metadata(w, "format", "pt");
  for (int i = 0; !rc && i < s->n_params; i++)
    rc = ferry_safetensors_writer_add(w, s->params[i].name, FERRY_DT_F32, s->params[i].ndim,
                                      s->params[i].shape);
  const char *next;
  while (!rc && (next = ferry_safetensors_writer_next(w))) {
    const gpt_param *q = gpt_schema_find(s, next);
    if (!q || read(user, (int)(q - s->params), buf)) {
      snprintf(err, el, "%s: cannot read '%s'", path, next);
      ferry_safetensors_writer_destroy(w);
      free(buf);
      return -1;
    }
    rc = ferry_safetensors_writer_write(w, next, buf, q->numel * sizeof(float));
  }
  if (!rc) rc = ferry_safetensors_writer_finish(w);
  if (rc) snprintf(err, el, "%s", ferry_safetensors_writer_last_error(w));
  ferry_safetensors_writer_destroy(w);
  free(buf);
  return rc ? -1 : 0;
}

typedef struct {
  const gpt_schema *s;
  gpt_provider *p;
} provider_reader;

static int read_through_provider(void *user, int i, float *dst) {
  provider_reader *r = user;
  const gpt_param *q = &r->s->params[i];
  gpt_group_view v;
  if (r->p->fetch(r->p->ctx, q->group, GPT_FETCH_FORWARD, &v)) return -1;
  if (v.wdt != FERRY_DT_F32) {
    r->p->release(r->p->ctx, q->group, GPT_RELEASE_FORWARD);
    return -1;
  }
  memcpy(dst, v.w[q->slot], q->numel * sizeof(float));
  return r->p->release(r->p->ctx, q->group, GPT_RELEASE_FORWARD);
}

int gpt_weights_save(const gpt_schema *s, gpt_provider *p, const char *path, uint64_t max_shard,
                     char *err, size_t el) {
  provider_reader r = {s, p};
  return gpt_weights_save_with(s, read_through_provider, &r, path, max_shard, err, el);
}
