/* examples/gpt/adamw.c — the PRE-ENGINE optimizer: a plain AdamW over the
 * resident provider with torch.optim.AdamW's order of operations, decay on
 * matrices only. The engine's pipelined CPU step replaces it.
 */
#include "gpt.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int gpt_adamw_init(gpt_adamw *a, size_t n, float lr, float wd) {
  memset(a, 0, sizeof *a);
  a->lr = lr, a->beta1 = 0.9f, a->beta2 = 0.999f, a->eps = 1e-8f, a->weight_decay = wd;
  a->m = calloc(n ? n : 1, sizeof(float));
  a->v = calloc(n ? n : 1, sizeof(float));
  if (!a->m || !a->v) {
    gpt_adamw_free(a);
    return -1;
  }
  return 0;
}

void gpt_adamw_free(gpt_adamw *a) {
  free(a->m), free(a->v);
  a->m = a->v = NULL;
}

void gpt_adamw_step(gpt_adamw *a, gpt_resident *r) {
  a->step++;
  double bc1 = 1.0 - pow((double)a->beta1, (double)a->step);
  double bc2 = 1.0 - pow((double)a->beta2, (double)a->step);
  float step_size = (float)(a->lr / bc1), bc2s = (float)sqrt(bc2);
  float b1 = a->beta1, b2 = a->beta2;
  const gpt_schema *s = r->schema;
  for (int i = 0; i < s->n_params; i++) {
    float *p = gpt_resident_w(r, i), *g = gpt_resident_g(r, i);
    float *m = a->m + r->offset[i], *v = a->v + r->offset[i];
    float decay = s->params[i].decay ? 1.0f - a->lr * a->weight_decay : 1.0f;
    for (size_t k = 0; k < s->params[i].numel; k++) {
      p[k] *= decay;
      m[k] = m[k] * b1 + g[k] * (1.0f - b1);
      v[k] = v[k] * b2 + g[k] * g[k] * (1.0f - b2);
      float denom = sqrtf(v[k]) / bc2s + a->eps;
      p[k] += -step_size * (m[k] / denom);
    }
  }
}
