/* examples/gpt/tok_map.h — the hash maps of the tokenizers (open
 * addressing): a string -> int map (a vocabulary) and a 64-bit key -> 64-bit
 * value map (a merge: the pair of ids -> its rank and the merged id).
 */
#ifndef FERRY_GPT_TOK_MAP_H
#define FERRY_GPT_TOK_MAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  char **keys;
  int *vals;
  size_t cap, n;
} gpt_smap;

/* The value of s[0..n), or -1 when absent. */
int gpt_smap_get(const gpt_smap *m, const char *s, size_t n);
/* Sets s (NUL-terminated, copied) to v; -1 when out of memory. */
int gpt_smap_put(gpt_smap *m, const char *s, int v);
void gpt_smap_free(gpt_smap *m);

typedef struct {
  uint64_t *keys; /* key + 1; 0 is an empty slot */
  uint64_t *vals;
  size_t cap, n;
} gpt_umap;

/* 1 and *v when key is present, else 0. key < UINT64_MAX. */
int gpt_umap_get(const gpt_umap *m, uint64_t key, uint64_t *v);
/* Sets key to v unless present (the first value stays); -1 when out of memory. */
int gpt_umap_add(gpt_umap *m, uint64_t key, uint64_t v);
void gpt_umap_free(gpt_umap *m);

#endif /* FERRY_GPT_TOK_MAP_H */
