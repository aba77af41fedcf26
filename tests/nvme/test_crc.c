/* tests/nvme/test_crc.c — ferry_crc32c (ISA-L) against the CRC32C check
 * value and a bitwise reference, over many lengths and alignments, and
 * chained in pieces.
 */
#include "core/crc32c.h"
#include "tests/test.h"

#include <string.h>

static uint32_t ref_crc32c(uint32_t crc, const unsigned char *p, size_t n) {
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; i++) {
    c ^= p[i];
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}

int main(void) {
  EXPECT_EQ_INT(ferry_crc32c(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ_INT(ref_crc32c(0, (const unsigned char *)"123456789", 9), 0xE3069283u);
  EXPECT_EQ_INT(ferry_crc32c(0, "", 0), 0);
  static unsigned char buf[70000];
  unsigned long long s = 42;
  for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)test_rand(&s);
  size_t lens[] = {1, 2, 3, 7, 8, 15, 16, 31, 63, 64, 255, 256, 1000, 4095, 4096, 4097, 65536, 69999};
  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
    for (size_t off = 0; off < 9; off += 4) {
      size_t n = lens[i];
      if (off + n > sizeof buf) continue;
      uint32_t want = ref_crc32c(0, buf + off, n);
      EXPECT_EQ_INT(ferry_crc32c(0, buf + off, n), want);
      size_t h = n / 3;
      EXPECT_EQ_INT(ferry_crc32c(ferry_crc32c(0, buf + off, h), buf + off + h, n - h), want);
    }
  }
  /* one flipped bit always changes the CRC */
  uint32_t c0 = ferry_crc32c(0, buf, 4096);
  buf[1234] ^= 8;
  EXPECT(ferry_crc32c(0, buf, 4096) != c0);
  return test_finish("nvme.crc");
}
