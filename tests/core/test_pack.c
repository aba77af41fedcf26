/* tests/core/test_pack.c — the chunk packing rule at its limits: a tensor
 * of exactly one chunk, empty tensors beside it, a tensor one byte over.
 */
#include "core/pack.h"
#include "tests/test.h"

int main(void) {
  size_t off = 7;

  /* a tensor of exactly one chunk fills it; an empty tensor after it takes
   * a byte, so it starts the next chunk (at offset 0), and no chunk holds
   * more than the chunk size */
  ferry_packer p = ferry_packer_make(4096);
  EXPECT_EQ_INT(ferry_packer_place(&p, 4096, &off), 1);
  EXPECT_EQ_INT(off, 0);
  EXPECT_EQ_INT(p.fill, 4096);
  EXPECT_EQ_INT(ferry_packer_place(&p, 0, &off), 1);
  EXPECT_EQ_INT(off, 0);
  EXPECT(p.fill <= 4096);

  /* a group of those: two chunks, neither above the chunk size */
  size_t b[3] = {4096, 0, 0};
  uint64_t chunk[3] = {0};
  ferry_pack_sum s = {0, 0, 0};
  ferry_pack_group(b, 3, 4096, 256, &s, chunk);
  EXPECT_EQ_INT(s.chunks, 2);
  EXPECT_EQ_INT(s.largest, 4096);
  EXPECT_EQ_INT(chunk[0], 4096);
  EXPECT_EQ_INT(chunk[1], 512); /* two empty tensors at 0 and 256 */
  EXPECT_EQ_INT(s.bytes, 4096 + 512);

  /* empty tensors in a chunk with room: each at the next aligned offset */
  p = ferry_packer_make(4096);
  EXPECT_EQ_INT(ferry_packer_place(&p, 100, &off), 1);
  EXPECT_EQ_INT(ferry_packer_place(&p, 0, &off), 0);
  EXPECT_EQ_INT(off, 256);
  EXPECT_EQ_INT(p.fill, 257);

  /* a tensor ending 256 bytes short leaves room for an empty one, at the
   * last aligned offset */
  p = ferry_packer_make(4096);
  EXPECT_EQ_INT(ferry_packer_place(&p, 3840, &off), 1);
  EXPECT_EQ_INT(ferry_packer_place(&p, 0, &off), 0);
  EXPECT_EQ_INT(off, 3840);
  EXPECT(p.fill <= 4096);

  /* one byte over a chunk: a chunk of its own, closed; the next starts anew */
  p = ferry_packer_make(4096);
  EXPECT_EQ_INT(ferry_packer_place(&p, 4097, &off), 1);
  EXPECT_EQ_INT(ferry_packer_place(&p, 1, &off), 1);
  EXPECT_EQ_INT(off, 0);

  return test_failures ? 1 : 0;
}
