/* device/arena.c — first-fit sub-allocation over a sorted block array with
 * coalescing of free neighbours. Lookups are binary searches, so checking
 * that a pointer range lies in a live allocation is O(log n).
 */
#include "device/arena.h"

#include "ferry.h"

#include <stdlib.h>
#include <string.h>

static int grow(ferry_arena *a) {
  if (a->n < a->cap) return FERRY_OK;
  size_t nc = a->cap ? a->cap * 2 : 64;
  ferry_arena_block *nb = realloc(a->b, nc * sizeof *nb);
  if (!nb) return FERRY_ENOMEM;
  a->b = nb;
  a->cap = nc;
  return FERRY_OK;
}

int ferry_arena_init(ferry_arena *a, size_t capacity, size_t align) {
  memset(a, 0, sizeof *a);
  if (align == 0 || (align & (align - 1))) return FERRY_EINVAL;
  a->align = align;
  a->capacity = capacity / align * align;
  if (a->capacity == 0) return FERRY_OK;
  if (grow(a)) return FERRY_ENOMEM;
  a->b[0] = (ferry_arena_block){0, a->capacity, 0};
  a->n = 1;
  return FERRY_OK;
}

void ferry_arena_destroy(ferry_arena *a) {
  free(a->b);
  memset(a, 0, sizeof *a);
}

int ferry_arena_alloc(ferry_arena *a, size_t bytes, size_t *off) {
  if (bytes == 0) bytes = a->align;
  if (bytes > a->capacity) return FERRY_ENOMEM;
  size_t need = (bytes + a->align - 1) / a->align * a->align;
  for (size_t i = 0; i < a->n; i++) {
    ferry_arena_block *blk = &a->b[i];
    if (blk->used || blk->size < need) continue;
    if (blk->size > need) {
      if (grow(a)) return FERRY_ENOMEM;
      blk = &a->b[i];
      memmove(&a->b[i + 2], &a->b[i + 1], (a->n - i - 1) * sizeof *a->b);
      a->b[i + 1] = (ferry_arena_block){blk->off + need, blk->size - need, 0};
      a->n++;
      blk->size = need;
    }
    blk->used = 1;
    a->used += need;
    a->nused++;
    if (a->used > a->peak) a->peak = a->used;
    *off = blk->off;
    return FERRY_OK;
  }
  return FERRY_ENOMEM;
}

/* Index of the block whose range holds off, or n. */
static size_t find(const ferry_arena *a, size_t off) {
  size_t lo = 0, hi = a->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (a->b[mid].off + a->b[mid].size <= off)
      lo = mid + 1;
    else
      hi = mid;
  }
  return (lo < a->n && a->b[lo].off <= off) ? lo : a->n;
}

int ferry_arena_free(ferry_arena *a, size_t off, size_t *size) {
  size_t i = find(a, off);
  if (i == a->n || a->b[i].off != off || !a->b[i].used) return FERRY_EINVAL;
  if (size) *size = a->b[i].size;
  a->b[i].used = 0;
  a->used -= a->b[i].size;
  a->nused--;
  if (i + 1 < a->n && !a->b[i + 1].used) { /* merge the next */
    a->b[i].size += a->b[i + 1].size;
    memmove(&a->b[i + 1], &a->b[i + 2], (a->n - i - 2) * sizeof *a->b);
    a->n--;
  }
  if (i > 0 && !a->b[i - 1].used) { /* merge into the previous */
    a->b[i - 1].size += a->b[i].size;
    memmove(&a->b[i], &a->b[i + 1], (a->n - i - 1) * sizeof *a->b);
    a->n--;
  }
  return FERRY_OK;
}

int ferry_arena_contains(const ferry_arena *a, size_t off, size_t len) {
  size_t i = find(a, off);
  if (i == a->n || !a->b[i].used) return 0;
  return len <= a->b[i].off + a->b[i].size - off;
}

size_t ferry_arena_largest_free(const ferry_arena *a) {
  size_t m = 0;
  for (size_t i = 0; i < a->n; i++)
    if (!a->b[i].used && a->b[i].size > m) m = a->b[i].size;
  return m;
}
