/* examples/gpt/provider.c — the resident parameter provider: every weight
 * and gradient in two fp32 allocations in host memory. What tests and the
 * pre-engine trainer use; the engine replaces it with the same callbacks.
 */
#include "gpt.h"

#include <stdlib.h>
#include <string.h>

int gpt_resident_init(gpt_resident *r, const gpt_schema *s) {
  memset(r, 0, sizeof *r);
  r->schema = s;
  r->weights = calloc(s->total_numel ? s->total_numel : 1, sizeof(float));
  r->grads = calloc(s->total_numel ? s->total_numel : 1, sizeof(float));
  r->offset = calloc((size_t)s->n_params, sizeof *r->offset);
  r->fetched = calloc((size_t)s->n_groups, sizeof *r->fetched);
  if (!r->weights || !r->grads || !r->offset || !r->fetched) {
    gpt_resident_free(r);
    return -1;
  }
  size_t at = 0;
  for (int i = 0; i < s->n_params; i++) {
    r->offset[i] = at;
    at += s->params[i].numel;
  }
  return 0;
}

void gpt_resident_free(gpt_resident *r) {
  free(r->weights), free(r->grads), free(r->offset), free(r->fetched);
  memset(r, 0, sizeof *r);
}

float *gpt_resident_w(gpt_resident *r, int i) { return r->weights + r->offset[i]; }
float *gpt_resident_g(gpt_resident *r, int i) { return r->grads + r->offset[i]; }

static int res_fetch(void *ctx, int group, gpt_fetch_mode mode, gpt_group_view *out) {
  gpt_resident *r = ctx;
  const gpt_schema *s = r->schema;
  if (group < 0 || group >= s->n_groups) return -1;
  memset(out, 0, sizeof *out);
  out->wdt = FERRY_DT_F32;
  for (int i = s->group_first[group]; i < s->group_first[group + 1]; i++) {
    int slot = s->params[i].slot;
    out->w[slot] = r->weights + r->offset[i];
    out->g[slot] = mode == GPT_FETCH_BACKWARD ? r->grads + r->offset[i] : NULL;
  }
  r->fetched[group]++;
  return 0;
}

static int res_release(void *ctx, int group, gpt_release_mode mode) {
  gpt_resident *r = ctx;
  (void)mode;
  if (group < 0 || group >= r->schema->n_groups || r->fetched[group] <= 0) {
    strcpy(r->err, "release of a group that was not fetched");
    return -1;
  }
  r->fetched[group]--;
  return 0;
}

static int res_zero(void *ctx) {
  gpt_resident *r = ctx;
  memset(r->grads, 0, r->schema->total_numel * sizeof(float));
  return 0;
}

static const char *res_err(void *ctx) { return ((gpt_resident *)ctx)->err; }

gpt_provider gpt_resident_provider(gpt_resident *r) {
  gpt_provider p = {r, res_fetch, res_release, res_zero, res_err};
  return p;
}
