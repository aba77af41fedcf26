/* examples/gpt/sample.c — `sample`: the prompt encoded and run once through
 * the KV-cache forward (gpt_kv), then each next token drawn by the sampler
 * (temperature, top-k, top-p), decoded and written as it comes, until the
 * count or the eos id. The context is the model's max_seq; when it fills,
 * the cache restarts from the last half of the text. A progress line with
 * the elapsed time and tokens/s goes to stderr.
 */
#include "app.h"

#include "core/file.h"
#include "core/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Runs ids[0..n) through the cache, max_rows at a time (the logits of the
 * last call's rows remain). */
static int kv_feed(gpt_kv *kv, gpt_provider *p, const int32_t *ids, int n) {
  for (int at = 0; at < n;) {
    int k = n - at < gpt_kv_max_rows(kv) ? n - at : gpt_kv_max_rows(kv);
    if (gpt_kv_forward(kv, p, ids + at, k)) {
      errf("%s\n", gpt_kv_last_error(kv));
      return 1;
    }
    at += k;
  }
  return 0;
}

/* The eos_token_id of a config.json (an integer), else -1. */
static int config_eos(const char *model) {
  size_t len = strlen(model), tl;
  char *text = NULL, why[256];
  if (len < 5 || strcmp(model + len - 5, ".json")) return -1; /* a preset */
  if (ferry_read_file(model, (size_t)1 << 24, &text, &tl, why, sizeof why)) return -1;
  int eos = -1;
  ferry_json_value *v = NULL;
  if (!ferry_json_parse(text, tl, &v, why, sizeof why)) {
    const ferry_json_value *e = ferry_json_get(v, "eos_token_id");
    if (e && e->type == FERRY_JSON_NUM && e->is_int && e->i >= 0 && e->i < (1 << 30))
      eos = (int)e->i;
  }
  ferry_json_free(v);
  free(text);
  return eos;
}

/* The progress line: live (\r) while stdout is not the terminal stderr
 * is; the last one always, on its own line. */
static void progress(int done, int total, double t0, int last) {
  static double shown;
  double t = now_s(), dt = t - t0;
  if (!last && (!isatty(2) || isatty(1) || t - shown < 0.5)) return;
  shown = t;
  fprintf(stderr, "%ssampled %d/%d tokens, %.1f s, %.1f tokens/s%s", last ? "" : "\r", done,
          total, dt, dt > 0 ? done / dt : 0.0, last ? "\n" : "");
  fflush(stderr);
}

static int push(int32_t **ids, size_t *n, size_t *cap, int32_t id) {
  if (*n == *cap) {
    size_t nc = *cap ? *cap * 2 : 64;
    int32_t *ni = realloc(*ids, nc * sizeof *ni);
    if (!ni) {
      errf("out of memory\n");
      return 1;
    }
    *ids = ni;
    *cap = nc;
  }
  (*ids)[(*n)++] = id;
  return 0;
}

/* Writes up to o->ntok sampled tokens after the prompt's `n` ids (ids
 * grows); stops after the eos id. */
static int sample_generate(const sample_opts *o, gpt_tokenizer *tok, gpt_kv *kv, gpt_sampler *sm,
                           gpt_provider *p, int vocab, int32_t **ids, size_t *n, size_t *cap) {
  int P = gpt_kv_max_pos(kv), keep = P / 2 > 0 ? P / 2 : 1, done = 0;
  size_t len = *n < (size_t)P ? *n : (size_t)P;
  if (kv_feed(kv, p, *ids + *n - len, (int)len)) return 1;
  double t0 = now_s();
  while (done < o->ntok) {
    const float *lg = gpt_kv_logits(kv) + (size_t)(gpt_kv_rows(kv) - 1) * vocab;
    int32_t next = gpt_sampler_pick(sm, lg);
    if (push(ids, n, cap, next)) return 1;
    done++;
    if (next == o->eos) break;
    char b[64];
    size_t bl = gpt_tokenizer_decode(tok, next, b, sizeof b);
    fwrite(b, 1, bl, stdout);
    fflush(stdout);
    progress(done, o->ntok, t0, 0);
    if (done == o->ntok) break;
    int rc;
    if (gpt_kv_pos(kv) < P) {
      rc = kv_feed(kv, p, &next, 1);
    } else { /* the context is full: start again from the last `keep` tokens */
      gpt_kv_reset(kv);
      rc = kv_feed(kv, p, *ids + *n - keep, keep);
    }
    if (rc) return 1;
  }
  printf("\n");
  progress(done, o->ntok, t0, 1);
  return 0;
}

int cmd_sample(int argc, char **argv) {
  sample_opts o;
  if (parse_sample(argc, argv, &o)) return 0;
  gpt_config cfg;
  load_model_config(o.model, &cfg);
  if (o.eos == -2) o.eos = config_eos(o.model);
  gpt_tokenizer *tok = load_tokenizer(o.tokdir);
  gpt_schema s = {0};
  gpt_resident r = {0};
  gpt_kv *kv = NULL;
  gpt_sampler *sm = NULL;
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
  int V = gpt_tokenizer_vocab(tok) < cfg.vocab ? gpt_tokenizer_vocab(tok) : cfg.vocab;
  gpt_sampling so = {.temperature = o.temp, .top_k = o.top_k, .top_p = o.top_p};
  if (gpt_kv_create(&s, cfg.max_seq, &kv) || gpt_sampler_create(V, &so, o.seed, &sm)) {
    errf("out of memory for the KV cache of %d positions\n", cfg.max_seq);
    goto out;
  }
  if (gpt_tokenizer_encode(tok, o.prompt, strlen(o.prompt), &ids, &n, &cap) || n == 0) {
    errf("the prompt encodes to no tokens\n");
    goto out;
  }
  fputs(o.prompt, stdout);
  rc = sample_generate(&o, tok, kv, sm, &p, cfg.vocab, &ids, &n, &cap);
out:
  free(ids);
  gpt_sampler_free(sm);
  gpt_kv_free(kv);
  gpt_resident_free(&r);
  gpt_tokenizer_free(tok);
  gpt_schema_free(&s);
  return rc;
}
