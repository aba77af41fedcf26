/* tests/fuzz/fuzz_safetensors.c — libFuzzer target for the safetensors
 * reader: any input is parsed from memory; when it opens, every tensor's
 * info, every metadata pair and every tensor's bytes (in pieces) are read,
 * so a header check that lets a bad offset through shows up under ASan.
 */
#include "ferry.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ferry_safetensors *f;
  if (ferry_safetensors_open_memory(data, size, &f) != 0) return 0;
  static unsigned char buf[4096];
  for (size_t i = 0; i < ferry_safetensors_count(f); i++) {
    ferry_safetensors_tensor t;
    if (ferry_safetensors_get(f, i, &t) != 0) __builtin_trap();
    if (t.offset + t.nbytes > size) __builtin_trap(); /* the reader promised in-bounds */
    ferry_safetensors_tensor u;
    size_t idx;
    if (ferry_safetensors_find(f, t.name, &u, &idx) != 0 || idx != i) __builtin_trap();
    for (uint64_t at = 0; at < t.nbytes; at += sizeof buf) {
      size_t n = t.nbytes - at < sizeof buf ? (size_t)(t.nbytes - at) : sizeof buf;
      if (ferry_safetensors_read(f, i, at, buf, n) != 0) __builtin_trap();
    }
    if (ferry_safetensors_read(f, i, t.nbytes, buf, 1) == 0) __builtin_trap();
  }
  for (size_t i = 0; i < ferry_safetensors_metadata_count(f); i++) {
    const char *k, *v;
    if (ferry_safetensors_metadata_get(f, i, &k, &v) != 0) __builtin_trap();
    if (ferry_safetensors_metadata_find(f, k) == NULL) __builtin_trap();
    (void)strlen(v);
  }
  ferry_safetensors_close(f);
  return 0;
}
