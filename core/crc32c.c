/* core/crc32c.c — CRC32C, computed by ISA-L's crc32_iscsi (its dispatcher
 * picks the kernel for this CPU).
 */
#include "core/crc32c.h"

#include <isa-l/crc.h>

uint32_t ferry_crc32c(uint32_t crc, const void *data, size_t len) {
  const unsigned char *p = data;
  uint32_t c = ~crc;
  while (len) { /* ISA-L takes an int length */
    int n = len > (1u << 30) ? (1 << 30) : (int)len;
    c = crc32_iscsi((unsigned char *)p, n, c);
    p += n;
    len -= (size_t)n;
  }
  return ~c;
}
