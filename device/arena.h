/* device/arena.h — a first-fit sub-allocator over one reserved range with a
 * hard capacity. Offsets only: the owner maps them to addresses. Used for the
 * device arena of every backend. Not thread-safe: the owner locks.
 */
#ifndef FERRY_ARENA_H
#define FERRY_ARENA_H

#include <stddef.h>

typedef struct {
  size_t off, size;
  int used;
} ferry_arena_block;

typedef struct {
  size_t capacity, align;
  size_t used, peak; /* bytes in used blocks (aligned sizes) */
  size_t nused;      /* live allocations */
  ferry_arena_block *b; /* sorted by offset, covering [0, capacity) */
  size_t n, cap;
} ferry_arena;

/* align must be a power of two; capacity is rounded down to it. */
int ferry_arena_init(ferry_arena *a, size_t capacity, size_t align);
void ferry_arena_destroy(ferry_arena *a);
/* FERRY_ENOMEM when no free block is large enough. 0 bytes allocates align. */
int ferry_arena_alloc(ferry_arena *a, size_t bytes, size_t *off);
/* FERRY_EINVAL unless off starts a used block; *size gets its size. */
int ferry_arena_free(ferry_arena *a, size_t off, size_t *size);
/* 1 when [off, off+len) lies inside one used block. */
int ferry_arena_contains(const ferry_arena *a, size_t off, size_t len);
size_t ferry_arena_largest_free(const ferry_arena *a);

#endif /* FERRY_ARENA_H */
