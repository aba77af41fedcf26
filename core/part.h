/* core/part.h — the one rule that splits a group's elements between ranks
 * (ZeRO stages 1-3): rank r of N starts at r·n/N, snapped down to a multiple
 * of `align` elements from the start of the tensor it falls in (so int8
 * blocks and SIMD tiles of a piece are those of the whole tensor), and a
 * tensor's piece is its overlap with the rank's range. offload/group.c
 * partitions the engine's groups with it; plan/ predicts each rank's pieces
 * with it, so the planner's bytes per rank are the engine's. Arithmetic
 * only.
 */
#ifndef FERRY_CORE_PART_H
#define FERRY_CORE_PART_H

#include <stddef.h>

/* r·n/N (r <= N) without overflow: the even split before snapping. */
size_t ferry_part_even(size_t n, size_t nranks, size_t r);
/* t snapped down to a multiple of `align` elements from `start`, the first
 * element of the tensor t falls in (t >= start). */
size_t ferry_part_snap(size_t t, size_t start, size_t align);
/* The piece of a tensor of n elements starting at element `start` of its
 * group that the range [lo, hi) holds: its element count, and in *off its
 * first element (tensor-relative). */
size_t ferry_part_piece(size_t lo, size_t hi, size_t start, size_t n, size_t *off);
/* Where rank r's range starts in a group of `count` tensors of n[i]
 * elements, in order (r = nranks: the group's end); rank r owns
 * [bound(r), bound(r + 1)). */
size_t ferry_part_bound(const size_t *n, size_t count, size_t nranks, size_t r, size_t align);

#endif
