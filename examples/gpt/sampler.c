/* examples/gpt/sampler.c — the next token from a row of logits: greedy at
 * temperature 0, else drawn from softmax(logits / T) cut to the top-k most
 * likely ids and then to the smallest set whose probability reaches top-p
 * (nucleus). Seeded and deterministic: ties order by id.
 */
#include "gpt.h"

#include <math.h>
#include <stdlib.h>

struct gpt_sampler {
  gpt_sampling o;
  int V;
  uint64_t rng;
  float *pr;  /* [V] unnormalised probabilities */
  int32_t *ix; /* [V] ids by probability, most likely first */
};

int gpt_sampler_create(int vocab, const gpt_sampling *o, uint64_t seed, gpt_sampler **out) {
  *out = NULL;
  if (vocab < 1 || o->temperature < 0 || o->top_k < 0 || !(o->top_p > 0 && o->top_p <= 1))
    return -1;
  gpt_sampler *s = calloc(1, sizeof *s);
  if (!s) return -1;
  s->o = *o;
  s->V = vocab;
  s->rng = seed;
  s->pr = malloc((size_t)vocab * sizeof *s->pr);
  s->ix = malloc((size_t)vocab * sizeof *s->ix);
  if (!s->pr || !s->ix) {
    gpt_sampler_free(s);
    return -1;
  }
  *out = s;
  return 0;
}

void gpt_sampler_free(gpt_sampler *s) {
  if (!s) return;
  free(s->pr), free(s->ix);
  free(s);
}

/* qsort_r's order: the more probable first, then the lower id. */
static int by_prob(const void *a, const void *b, void *arg) {
  const float *pr = arg;
  int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
  float pi = pr[i], pj = pr[j];
  if (pi != pj) return pi > pj ? -1 : 1;
  return (i > j) - (i < j);
}

/* A uniform double in [0, 1) from the sampler's generator. */
static double uniform(gpt_sampler *s) { return (double)(gpt_rand(&s->rng) >> 11) / 9007199254740992.0; }

int gpt_sampler_pick(gpt_sampler *s, const float *lg) {
  int V = s->V, best = 0;
  for (int v = 1; v < V; v++)
    if (lg[v] > lg[best]) best = v;
  if (s->o.temperature <= 0) return best;
  float *pr = s->pr, temp = s->o.temperature;
  double sum = 0;
  for (int v = 0; v < V; v++) sum += pr[v] = expf((lg[v] - lg[best]) / temp);
  int k = s->o.top_k > 0 && s->o.top_k < V ? s->o.top_k : V;
  if (k == V && s->o.top_p >= 1) { /* no cut: the draw walks the ids in order */
    double u = uniform(s) * sum, acc = 0;
    int next;
    for (next = 0; next < V - 1; next++)
      if ((acc += pr[next]) > u) break;
    return next;
  }
  for (int v = 0; v < V; v++) s->ix[v] = v;
  qsort_r(s->ix, (size_t)V, sizeof *s->ix, by_prob, pr);
  double kept = 0;
  for (int i = 0; i < k; i++) kept += pr[s->ix[i]];
  if (s->o.top_p < 1) { /* the smallest prefix whose share reaches top_p */
    double want = s->o.top_p * kept, acc = 0;
    int n = 0;
    while (n < k && acc < want) acc += pr[s->ix[n++]];
    k = n > 0 ? n : 1;
    kept = acc > 0 ? acc : pr[s->ix[0]];
  }
  double u = uniform(s) * kept, acc = 0;
  for (int i = 0; i < k - 1; i++)
    if ((acc += pr[s->ix[i]]) > u) return s->ix[i];
  return s->ix[k - 1];
}
