/* core/pack.h — the one rule that packs a group's tensors into chunks:
 * offsets 256-byte aligned, a chunk of at most `size` bytes, a tensor that
 * does not fit the open chunk starting the next one, a tensor larger than
 * a chunk in a chunk of its own. memory/layout.c lays out every family with
 * it; plan/ predicts the layout with it (the chunks of a group of known
 * tensors), so the planner's bytes are the engine's. Arithmetic only.
 */
#ifndef FERRY_CORE_PACK_H
#define FERRY_CORE_PACK_H

#include <stddef.h>
#include <stdint.h>

/* Tensor offsets within a chunk (the device pool's alignment). */
#define FERRY_PACK_TENSOR_ALIGN 256

/* The packing of one family's tensors, one after the other. */
typedef struct {
  size_t size; /* the chunk size */
  size_t fill; /* bytes used in the last chunk started */
  int open;    /* the last chunk takes more tensors */
} ferry_packer;

/* A packer of chunks of at most `size` bytes, no chunk started. */
ferry_packer ferry_packer_make(size_t size);
/* The next tensor starts a chunk (a new group: no chunk holds two). */
void ferry_packer_break(ferry_packer *p);
/* Places a tensor of `bytes` (an empty one takes 1): its offset in its
 * chunk in *offset; 1 when it starts a chunk. Afterwards p->fill is that
 * chunk's bytes so far. */
int ferry_packer_place(ferry_packer *p, size_t bytes, size_t *offset);

/* A group's chunks: how many, their bytes (each rounded up to `align`)
 * and the largest. */
typedef struct {
  uint64_t chunks, bytes, largest;
} ferry_pack_sum;

/* Adds to *sum the chunks of one group of n tensors of bytes[i], in the
 * order given, at this chunk size and chunk alignment; each chunk's bytes
 * in order in chunk[] (room for n; NULL: not wanted). */
void ferry_pack_group(const size_t *bytes, size_t n, size_t size, size_t align, ferry_pack_sum *sum,
                      uint64_t *chunk);

#endif
