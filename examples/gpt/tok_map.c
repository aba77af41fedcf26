/* examples/gpt/tok_map.c — the tokenizers' hash maps (tok_map.h): open
 * addressing with linear probing, FNV-1a for strings, a 64-bit mix for keys.
 */
#include "tok_map.h"

#include <stdlib.h>
#include <string.h>

static uint64_t fnv(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

static int smap_grow(gpt_smap *m) {
  size_t cap = m->cap ? m->cap * 2 : 1024;
  char **k = calloc(cap, sizeof *k);
  int *v = calloc(cap, sizeof *v);
  if (!k || !v) {
    free(k), free(v);
    return -1;
  }
  for (size_t i = 0; i < m->cap; i++)
    if (m->keys[i]) {
      size_t j = fnv(m->keys[i], strlen(m->keys[i])) & (cap - 1);
      while (k[j]) j = (j + 1) & (cap - 1);
      k[j] = m->keys[i], v[j] = m->vals[i];
    }
  free(m->keys), free(m->vals);
  m->keys = k, m->vals = v, m->cap = cap;
  return 0;
}

int gpt_smap_get(const gpt_smap *m, const char *s, size_t n) {
  if (!m->cap) return -1;
  size_t j = fnv(s, n) & (m->cap - 1);
  while (m->keys[j]) {
    if (!strncmp(m->keys[j], s, n) && m->keys[j][n] == 0) return m->vals[j];
    j = (j + 1) & (m->cap - 1);
  }
  return -1;
}

int gpt_smap_put(gpt_smap *m, const char *s, int v) {
  if ((m->n + 1) * 2 > m->cap && smap_grow(m)) return -1;
  size_t n = strlen(s), j = fnv(s, n) & (m->cap - 1);
  while (m->keys[j]) {
    if (!strcmp(m->keys[j], s)) {
      m->vals[j] = v;
      return 0;
    }
    j = (j + 1) & (m->cap - 1);
  }
  if (!(m->keys[j] = strdup(s))) return -1;
  m->vals[j] = v;
  m->n++;
  return 0;
}

void gpt_smap_free(gpt_smap *m) {
  for (size_t i = 0; i < m->cap; i++) free(m->keys[i]);
  free(m->keys), free(m->vals);
  memset(m, 0, sizeof *m);
}

static size_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  return (size_t)k;
}

static int umap_grow(gpt_umap *m) {
  size_t cap = m->cap ? m->cap * 2 : 1024;
  uint64_t *k = calloc(cap, sizeof *k), *v = calloc(cap, sizeof *v);
  if (!k || !v) {
    free(k), free(v);
    return -1;
  }
  for (size_t i = 0; i < m->cap; i++)
    if (m->keys[i]) {
      size_t j = mix(m->keys[i]) & (cap - 1);
      while (k[j]) j = (j + 1) & (cap - 1);
      k[j] = m->keys[i], v[j] = m->vals[i];
    }
  free(m->keys), free(m->vals);
  m->keys = k, m->vals = v, m->cap = cap;
  return 0;
}

int gpt_umap_get(const gpt_umap *m, uint64_t key, uint64_t *v) {
  if (!m->cap) return 0;
  key++;
  for (size_t j = mix(key) & (m->cap - 1); m->keys[j]; j = (j + 1) & (m->cap - 1))
    if (m->keys[j] == key) {
      *v = m->vals[j];
      return 1;
    }
  return 0;
}

int gpt_umap_add(gpt_umap *m, uint64_t key, uint64_t v) {
  if ((m->n + 1) * 2 > m->cap && umap_grow(m)) return -1;
  key++;
  size_t j = mix(key) & (m->cap - 1);
  for (; m->keys[j]; j = (j + 1) & (m->cap - 1))
    if (m->keys[j] == key) return 0;
  m->keys[j] = key, m->vals[j] = v, m->n++;
  return 0;
}

void gpt_umap_free(gpt_umap *m) {
  free(m->keys), free(m->vals);
  memset(m, 0, sizeof *m);
}
