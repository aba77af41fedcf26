/* core/pack.c — the chunk packing rule (core/pack.h): where each tensor of
 * a group goes, and a group's chunks summed.
 */
#include "core/pack.h"

#include "core/core.h"

ferry_packer ferry_packer_make(size_t size) {
  ferry_packer p = {size, 0, 0};
  return p;
}

void ferry_packer_break(ferry_packer *p) { p->open = 0; }

int ferry_packer_place(ferry_packer *p, size_t bytes, size_t *offset) {
  size_t off = ferry_align_up(p->fill, FERRY_PACK_TENSOR_ALIGN);
  size_t takes = bytes ? bytes : 1; /* an empty tensor takes a byte: full chunks refuse it */
  int own = bytes > p->size; /* a chunk of its own, closed at once */
  int fresh = own || !p->open || off + takes > p->size;
  if (fresh) off = 0;
  *offset = off;
  p->fill = off + takes;
  p->open = !own;
  return fresh;
}

void ferry_pack_group(const size_t *bytes, size_t n, size_t size, size_t align, ferry_pack_sum *sum,
                      uint64_t *chunk) {
  ferry_packer p = ferry_packer_make(size);
  uint64_t cur = 0, k = 0;
  for (size_t i = 0; i < n; i++) {
    size_t off;
    if (ferry_packer_place(&p, bytes[i], &off)) {
      sum->chunks++;
      k++;
      cur = 0;
    }
    uint64_t now = ferry_align_up(p.fill, align); /* the chunk's bytes so far */
    sum->bytes += now - cur;
    cur = now;
    if (now > sum->largest) sum->largest = now;
    if (chunk) chunk[k - 1] = now;
  }
}
