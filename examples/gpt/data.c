/* examples/gpt/data.c — training data: a text file encoded by the
 * tokenizer, or a raw file of little-endian uint16 (.u16, .bin) or uint32
 * (.u32) token ids; batches of windows at seeded random offsets, and each
 * rank's share of a global batch (data parallel).
 */
#include "gpt.h"

#include "core/file.h"

#include <stdlib.h>
#include <string.h>

static int ends(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && !strcmp(s + a - b, suf);
}

int gpt_data_load(gpt_data *d, const char *path, const gpt_tokenizer *tok, int vocab,
                  uint64_t seed, char *err, size_t el) {
  memset(d, 0, sizeof *d);
  d->rng = seed ^ 0xDA7A5EEDull;
  size_t len;
  char *raw;
  if (ferry_read_file(path, SIZE_MAX, &raw, &len, NULL, 0)) {
    snprintf(err, el, "%s: cannot read", path);
    return -1;
  }
  int w = ends(path, ".u16") || ends(path, ".bin") ? 2 : ends(path, ".u32") ? 4 : 0;
  if (w) {
    if (len % (size_t)w) {
      snprintf(err, el, "%s: %zu bytes is not a whole number of uint%d tokens", path, len, 8 * w);
      free(raw);
      return -1;
    }
    d->n = len / (size_t)w;
    d->tokens = malloc((d->n ? d->n : 1) * sizeof *d->tokens);
    if (!d->tokens) {
      free(raw);
      snprintf(err, el, "out of memory");
      return -1;
    }
    const unsigned char *b = (const unsigned char *)raw;
    for (size_t i = 0; i < d->n; i++) {
      uint32_t v = b[i * w] | (uint32_t)b[i * w + 1] << 8;
      if (w == 4) v |= (uint32_t)b[i * w + 2] << 16 | (uint32_t)b[i * w + 3] << 24;
      d->tokens[i] = (int32_t)v;
    }
  } else {
    size_t cap = 0;
    if (gpt_tokenizer_encode(tok, raw, len, &d->tokens, &d->n, &cap)) {
      snprintf(err, el, "%s: the tokenizer cannot encode this text", path);
      free(raw);
      gpt_data_free(d);
      return -1;
    }
  }
  free(raw);
  for (size_t i = 0; i < d->n; i++)
    if (d->tokens[i] < 0 || d->tokens[i] >= vocab) {
      snprintf(err, el, "%s: token %d at position %zu is outside the model's vocabulary (%d)", path,
               d->tokens[i], i, vocab);
      gpt_data_free(d);
      return -1;
    }
  return 0;
}

void gpt_data_free(gpt_data *d) {
  free(d->tokens);
  d->tokens = NULL;
  d->n = 0;
}

int gpt_data_batch(gpt_data *d, int batch, int seq, int32_t *tokens, int32_t *targets) {
  return gpt_data_batch_rank(d, batch, seq, 0, 1, tokens, targets);
}

int gpt_data_batch_rank(gpt_data *d, int batch, int seq, int rank, int nranks, int32_t *tokens,
                        int32_t *targets) {
  if ((size_t)seq + 1 > d->n || nranks < 1 || rank < 0 || rank >= nranks) return -1;
  size_t span = d->n - (size_t)seq; /* offsets 0 .. n-seq-1 */
  long first = (long)rank * batch, end = first + batch, all = (long)nranks * batch;
  for (long w = 0; w < all; w++) {
    size_t o = (size_t)(gpt_rand(&d->rng) % span); /* every draw moves the generator */
    if (w < first || w >= end) continue;
    size_t b = (size_t)(w - first);
    memcpy(tokens + b * seq, d->tokens + o, (size_t)seq * sizeof *tokens);
    memcpy(targets + b * seq, d->tokens + o + 1, (size_t)seq * sizeof *targets);
  }
  return 0;
}
