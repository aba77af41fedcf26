/* core/crc32c.h — CRC32C (Castagnoli), the one checksum of ferry: the swap
 * store's blocks and index (nvme/) and the checkpoint files (offload/).
 * Internal: never included by code outside the library and its tests.
 */
#ifndef FERRY_CRC32C_H
#define FERRY_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* CRC32C (Castagnoli), the iSCSI CRC: crc32c(0, "123456789", 9) is
 * 0xE3069283. Chains: crc32c(crc32c(0, a), b) = crc32c(0, a||b). */
uint32_t ferry_crc32c(uint32_t crc, const void *data, size_t len);

#endif /* FERRY_CRC32C_H */
