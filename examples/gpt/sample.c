/* examples/gpt/sample.c — `sample`: the prompt encoded, then each next
 * token drawn from the model's last logits (greedy at temperature 0) and
 * printed as it comes.
 */
#include "app.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The next token from the logits lg of V ids: the most likely one at
 * temperature 0, else one drawn from softmax(lg / temp) (pr: V floats of
 * scratch). */
static int sample_pick(const float *lg, int V, float temp, float *pr, uint64_t *rng) {
  int best = 0;
  for (int v = 1; v < V; v++)
    if (lg[v] > lg[best]) best = v;
  int next = best;
  if (temp > 0) {
    double sum = 0;
    for (int v = 0; v < V; v++) sum += pr[v] = expf((lg[v] - lg[best]) / temp);
    double u = (double)(gpt_rand(rng) >> 11) / 9007199254740992.0 * sum, acc = 0;
    for (next = 0; next < V - 1; next++)
      if ((acc += pr[next]) > u) break;
  }
  return next;
}

/* Writes o->ntok sampled tokens after the prompt's `n` ids (ids grows). */
static int sample_generate(const sample_opts *o, const gpt_config *cfg, gpt_tokenizer *tok,
                           gpt_model *m, gpt_provider *p, int T, int32_t **ids, size_t *n,
                           size_t *cap) {
  int32_t *win = calloc((size_t)T, sizeof *win);
  float *pr = malloc((size_t)cfg->vocab * sizeof *pr);
  int rc = win && pr ? 0 : 1;
  if (rc) errf("out of memory\n");
  uint64_t rng = o->seed;
  int V = gpt_tokenizer_vocab(tok) < cfg->vocab ? gpt_tokenizer_vocab(tok) : cfg->vocab;
  for (int k = 0; k < o->ntok && !rc; k++) {
    size_t len = *n < (size_t)T ? *n : (size_t)T;
    memset(win, 0, (size_t)T * sizeof *win);
    memcpy(win, *ids + *n - len, len * sizeof *win); /* causal: padding after len is never seen */
    if (gpt_model_forward(m, p, win, NULL, NULL)) {
      errf("%s\n", gpt_model_last_error(m));
      rc = 1;
      break;
    }
    const float *lg = gpt_model_logits(m) + (len - 1) * (size_t)cfg->vocab;
    int next = sample_pick(lg, V, o->temp, pr, &rng);
    if (*n == *cap) {
      size_t nc = *cap ? *cap * 2 : 64;
      int32_t *ni = realloc(*ids, nc * sizeof *ni);
      if (!ni) {
        errf("out of memory\n");
        rc = 1;
        break;
      }
      *ids = ni;
      *cap = nc;
    }
    (*ids)[(*n)++] = next;
    char b[64];
    size_t bl = gpt_tokenizer_decode(tok, next, b, sizeof b);
    fwrite(b, 1, bl, stdout);
    fflush(stdout);
  }
  free(win);
  free(pr);
  return rc;
}

int cmd_sample(int argc, char **argv) {
  sample_opts o;
  if (parse_sample(argc, argv, &o)) return 0;
  gpt_config cfg;
  load_model_config(o.model, &cfg);
  gpt_tokenizer *tok = load_tokenizer(o.tokdir);
  gpt_schema s = {0};
  gpt_resident r = {0};
  gpt_model *m = NULL;
  int32_t *ids = NULL;
  size_t n = 0, cap = 0;
  char err[1024];
  int rc = 1; /* every exit below goes through `out`, which frees what is held */
  if (gpt_schema_build(&cfg, &s) || gpt_resident_init(&r, &s)) goto out;
  gpt_provider p = gpt_resident_provider(&r);
  if (gpt_weights_load(&s, &p, o.weights, err, sizeof err)) {
    errf("%s\n", err);
    goto out;
  }
  int T = cfg.max_seq < 256 ? cfg.max_seq : 256;
  gpt_run_config run = {.batch = 1, .seq = T};
  if (gpt_model_create(&s, &run, &m)) goto out;
  if (gpt_tokenizer_encode(tok, o.prompt, strlen(o.prompt), &ids, &n, &cap) || n == 0) {
    errf("the prompt encodes to no tokens\n");
    goto out;
  }
  fputs(o.prompt, stdout);
  rc = sample_generate(&o, &cfg, tok, m, &p, T, &ids, &n, &cap);
  if (!rc) printf("\n");
out:
  free(ids);
  gpt_model_free(m);
  gpt_resident_free(&r);
  gpt_tokenizer_free(tok);
  gpt_schema_free(&s);
  return rc;
}
