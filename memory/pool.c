/* memory/pool.c — the tier pools' sub-allocator: first fit (or last or
 * random fit, for tests) with coalescing over a block array sized once at
 * init (a pool holding at most k allocations never has more than 2k + 1
 * blocks), so the steady state never allocates. Offsets only; the manager
 * locks.
 */
#include "memory/mem_impl.h"

#include <stdlib.h>
#include <string.h>

int mem_pool_init(mem_pool *p, size_t capacity, size_t align, size_t max_allocs) {
  memset(p, 0, sizeof *p);
  p->align = align;
  p->capacity = capacity / align * align;
  p->cap = 2 * max_allocs + 2;
  p->b = calloc(p->cap, sizeof *p->b);
  if (!p->b) return FERRY_ENOMEM;
  if (p->capacity) {
    p->b[0] = (mem_block){0, p->capacity, 0};
    p->n = 1;
  }
  return FERRY_OK;
}

void mem_pool_destroy(mem_pool *p) {
  free(p->b);
  memset(p, 0, sizeof *p);
}

void mem_pool_set_fit(mem_pool *p, int fit, uint64_t seed) {
  p->fit = fit;
  p->rng = seed ? seed : 1;
}

static uint64_t pool_rand(mem_pool *p) { /* xorshift64* */
  p->rng ^= p->rng >> 12;
  p->rng ^= p->rng << 25;
  p->rng ^= p->rng >> 27;
  return p->rng * 2685821657736338717ull;
}

/* The free block the policy picks for `need` bytes (p->n: none), and
 * whether the copy goes at its end. */
static size_t pick_block(mem_pool *p, size_t need, int *at_end) {
  size_t fits = 0, pick = p->n;
  *at_end = 0;
  for (size_t i = 0; i < p->n; i++) {
    if (p->b[i].used || p->b[i].size < need) continue;
    if (p->fit == FERRY_FIT_FIRST) return i;
    if (p->fit == FERRY_FIT_LAST) pick = i;
    else if (pool_rand(p) % ++fits == 0) pick = i; /* uniform over the fitting blocks */
  }
  if (pick < p->n) *at_end = p->fit == FERRY_FIT_LAST || (pool_rand(p) & 1);
  return pick;
}

int mem_pool_alloc(mem_pool *p, size_t bytes, size_t *off) {
  size_t need = ferry_align_up(bytes ? bytes : 1, p->align);
  int at_end;
  size_t i = pick_block(p, need, &at_end);
  if (i == p->n) return FERRY_ENOMEM;
  mem_block *b = &p->b[i];
  if (b->size > need) {
    if (p->n == p->cap) return FERRY_ENOMEM; /* cannot happen within max_allocs */
    memmove(&p->b[i + 2], &p->b[i + 1], (p->n - i - 1) * sizeof *p->b);
    p->n++;
    if (at_end) { /* the free rest stays below */
      b->size -= need;
      p->b[i + 1] = (mem_block){b->off + b->size, need, 0};
      b = &p->b[i + 1];
    } else {
      p->b[i + 1] = (mem_block){b->off + need, b->size - need, 0};
      b->size = need;
    }
  }
  b->used = 1;
  p->used += need;
  *off = b->off;
  return FERRY_OK;
}

/* The index of the first block at or above off. */
static size_t find_block(const mem_pool *p, size_t off) {
  size_t lo = 0, hi = p->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (p->b[mid].off < off) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

void mem_pool_free(mem_pool *p, size_t off) {
  size_t lo = find_block(p, off);
  FERRY_ASSERT(lo < p->n && p->b[lo].off == off && p->b[lo].used,
               "memory pool: free of offset %zu that is not a live block", off);
  size_t i = lo;
  p->b[i].used = 0;
  p->used -= p->b[i].size;
  if (i + 1 < p->n && !p->b[i + 1].used) {
    p->b[i].size += p->b[i + 1].size;
    memmove(&p->b[i + 1], &p->b[i + 2], (p->n - i - 2) * sizeof *p->b);
    p->n--;
  }
  if (i > 0 && !p->b[i - 1].used) {
    p->b[i - 1].size += p->b[i].size;
    memmove(&p->b[i], &p->b[i + 1], (p->n - i - 1) * sizeof *p->b);
    p->n--;
  }
}

size_t mem_pool_slide_down(mem_pool *p, size_t off) {
  size_t lo = find_block(p, off);
  FERRY_ASSERT(lo < p->n && p->b[lo].off == off && p->b[lo].used,
               "memory pool: slide of offset %zu that is not a live block", off);
  if (lo == 0 || p->b[lo - 1].used) return off;
  mem_block *f = &p->b[lo - 1], *u = &p->b[lo];
  size_t to = f->off, gap = f->size;
  *f = (mem_block){to, u->size, 1};
  *u = (mem_block){to + f->size, gap, 0};
  if (lo + 1 < p->n && !p->b[lo + 1].used) { /* the hole joins the one above */
    u->size += p->b[lo + 1].size;
    memmove(&p->b[lo + 1], &p->b[lo + 2], (p->n - lo - 2) * sizeof *p->b);
    p->n--;
  }
  return to;
}
