/* examples/gpt/sample.c — `sample`: the prompt encoded (with the bos / eos
 * the tokenizer's post-processor puts around a text, as transformers'
 * tokenizer(prompt) before generate) and run once through
 * the KV-cache forward (gpt_kv), then each next token drawn by the sampler
 * (temperature, top-k, top-p), decoded and written as it comes, until the
 * count or the eos id. The context is the model's max_seq; when it fills,
 * the cache restarts from the last half of the text. A progress line with
 * the elapsed time and tokens/s goes to stderr. --device cuda: the same
 * loop over the CUDA module's cache (gpt_cuda_kv); the sampler stays here.
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

/* The KV cache sampling runs on: the CPU's (gpt_kv) or, under --device
 * cuda, the CUDA model module's (gpt_cuda_kv, fp32 weights on the device). */
typedef struct {
  gpt_kv *kv;
  const gpt_cuda_api *cu;
  gpt_cuda_kv *ck;
  gpt_cuda_resident cr;
  int have_cr;
  gpt_provider p; /* the provider the cache reads: host or device weights */
  int max_pos, max_rows;
} kv_side;

static int side_forward(kv_side *k, const int32_t *ids, int n) {
  int rc = k->ck ? k->cu->kv_forward(k->ck, &k->p, ids, n) : gpt_kv_forward(k->kv, &k->p, ids, n);
  if (rc) errf("%s\n", k->ck ? k->cu->kv_last_error(k->ck) : gpt_kv_last_error(k->kv));
  return rc;
}
static const float *side_logits(const kv_side *k) {
  return k->ck ? k->cu->kv_logits(k->ck) : gpt_kv_logits(k->kv);
}
static int side_rows(const kv_side *k) { return k->ck ? k->cu->kv_rows(k->ck) : gpt_kv_rows(k->kv); }
static int side_pos(const kv_side *k) { return k->ck ? k->cu->kv_pos(k->ck) : gpt_kv_pos(k->kv); }
static void side_reset(kv_side *k) {
  if (k->ck) k->cu->kv_reset(k->ck);
  else gpt_kv_reset(k->kv);
}

/* The cache for s's max_seq positions; for CUDA the weights of the host
 * provider hp copied to the device first. 0, or 1 with the message out. */
static int side_open(kv_side *k, const gpt_schema *s, gpt_provider *hp, const float *host_w,
                     int cuda) {
  memset(k, 0, sizeof *k);
  k->max_pos = s->cfg.max_seq;
  k->max_rows = k->max_pos < GPT_KV_ROWS ? k->max_pos : GPT_KV_ROWS;
  if (!cuda) {
    k->p = *hp;
    if (gpt_kv_create(s, k->max_pos, &k->kv)) {
      errf("out of memory for the KV cache of %d positions\n", k->max_pos);
      return 1;
    }
    return 0;
  }
  char why[2048];
  if (gpt_cuda_load(&k->cu, why, sizeof why)) {
    errf("--device cuda: cannot load the CUDA model: %s\n", why);
    return 1;
  }
  if (k->cu->available(why, sizeof why)) {
    errf("--device cuda: %s\n", why);
    return 1;
  }
  if (k->cu->kv_create(s, k->max_pos, NULL, &k->ck, why, sizeof why)) {
    errf("--device cuda: %s\n", why);
    return 1;
  }
  /* the weights up on the cache's stream, so its first forward follows them */
  if (k->cu->resident_init(&k->cr, s, k->cu->kv_stream(k->ck))) {
    errf("--device cuda: out of device memory for the weights (%s)\n", k->cr.err);
    return 1;
  }
  k->have_cr = 1;
  if (k->cu->resident_upload(&k->cr, host_w)) {
    errf("--device cuda: the weights: %s\n", k->cr.err);
    return 1;
  }
  k->p = k->cu->resident_provider(&k->cr);
  return 0;
}

static void side_close(kv_side *k) {
  if (k->ck) k->cu->kv_free(k->ck); /* waits for its stream: the upload too */
  if (k->have_cr) k->cu->resident_free(&k->cr);
  gpt_kv_free(k->kv);
}

/* Runs ids[0..n) through the cache, max_rows at a time (the logits of the
 * last call's rows remain). */
static int kv_feed(kv_side *k, const int32_t *ids, int n) {
  for (int at = 0; at < n;) {
    int c = n - at < k->max_rows ? n - at : k->max_rows;
    if (side_forward(k, ids + at, c)) return 1;
    at += c;
  }
  return 0;
}

/* The progress line: live (\r) while stdout is not the terminal stderr
 * is; the last one always, on its own line (after the text's, when both go
 * to the terminal). */
static void progress(int done, int total, double t0, int last) {
  static double shown;
  double t = now_s(), dt = t - t0;
  if (!last && (!isatty(2) || isatty(1) || t - shown < 0.5)) return;
  shown = t;
  /* the text on the same terminal has no newline of its own yet */
  const char *lead = !last ? "\r" : isatty(1) && isatty(2) ? "\n" : "";
  fprintf(stderr, "%ssampled %d/%d tokens, %.1f s, %.1f tokens/s%s", lead, done,
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
static int sample_generate(const sample_opts *o, gpt_tokenizer *tok, kv_side *kv, gpt_sampler *sm,
                           int vocab, int32_t **ids, size_t *n, size_t *cap) {
  int P = kv->max_pos, keep = P / 2 > 0 ? P / 2 : 1, done = 0;
  size_t len = *n < (size_t)P ? *n : (size_t)P;
  if (kv_feed(kv, *ids + *n - len, (int)len)) return 1;
  double t0 = now_s();
  while (done < o->ntok) {
    const float *lg = side_logits(kv) + (size_t)(side_rows(kv) - 1) * vocab;
    int32_t next = gpt_sampler_pick(sm, lg);
    if (push(ids, n, cap, next)) return 1;
    done++;
    if (next == o->eos) break;
    if (!o->json) {
      char b[64];
      size_t bl = gpt_tokenizer_decode(tok, next, b, sizeof b);
      fwrite(b, 1, bl, stdout);
      fflush(stdout);
    }
    progress(done, o->ntok, t0, 0);
    if (done == o->ntok) break;
    int rc;
    if (side_pos(kv) < P) {
      rc = kv_feed(kv, &next, 1);
    } else { /* the context is full: start again from the last `keep` tokens */
      side_reset(kv);
      rc = kv_feed(kv, *ids + *n - keep, keep);
    }
    if (rc) return 1;
  }
  if (!o->json) printf("\n");
  fflush(stdout); /* the text's end before the progress line, in one log too */
  progress(done, o->ntok, t0, 1);
  return 0;
}

static void json_ids(const char *key, const int32_t *ids, size_t n) {
  printf("\"%s\": [", key);
  for (size_t i = 0; i < n; i++) printf("%s%d", i ? ", " : "", (int)ids[i]);
  printf("]");
}

/* --json: the prompt's ids, the drawn ids and their text, one object. */
static int sample_json(const gpt_tokenizer *tok, const int32_t *ids, size_t n_prompt, size_t n) {
  char *text;
  size_t len;
  if (gpt_tokenizer_decode_text(tok, ids + n_prompt, n - n_prompt, 0, &text, &len)) {
    errf("out of memory\n");
    return 1;
  }
  printf("{");
  json_ids("prompt_ids", ids, n_prompt);
  printf(", ");
  json_ids("ids", ids + n_prompt, n - n_prompt);
  printf(", \"text\": ");
  gpt_json_string(stdout, text);
  printf("}\n");
  free(text);
  return 0;
}

int cmd_sample(int argc, char **argv) {
  sample_opts o;
  if (parse_sample(argc, argv, &o)) return 0;
  gpt_config cfg;
  load_model_config(o.model, &cfg);
  if (o.eos == -2) o.eos = gpt_config_token_id(o.model, "eos_token_id");
  gpt_tokenizer *tok = load_tokenizer(o.tokdir);
  gpt_schema s = {0};
  gpt_resident r = {0};
  kv_side kv = {0};
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
  if (side_open(&kv, &s, &p, r.weights, o.cuda)) goto out;
  if (gpt_sampler_create(V, &so, o.seed, &sm)) {
    errf("out of memory\n");
    goto out;
  }
  if (gpt_tokenizer_encode_text(tok, o.prompt, strlen(o.prompt), 1, &ids, &n, &cap, err,
                                sizeof err)) {
    errf("the prompt: %s\n", err);
    goto out;
  }
  if (n == 0) {
    errf("the prompt encodes to no tokens\n");
    goto out;
  }
  size_t n_prompt = n;
  if (!o.json) fputs(o.prompt, stdout);
  rc = sample_generate(&o, tok, &kv, sm, cfg.vocab, &ids, &n, &cap);
  if (!rc && o.json) rc = sample_json(tok, ids, n_prompt, n);
out:
  free(ids);
  gpt_sampler_free(sm);
  side_close(&kv);
  gpt_resident_free(&r);
  gpt_tokenizer_free(tok);
  gpt_schema_free(&s);
  return rc;
}
