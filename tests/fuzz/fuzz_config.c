/* tests/fuzz/fuzz_config.c — libFuzzer target for the configuration reader
 * (ferry_config_load_string in format/config.c, over libconfig): any text
 * is loaded into a fresh configuration; a refusal must leave a message, and
 * what loads must read back through every key's getter.
 */
#include "ferry.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 16) return 0;
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = 0;
  ferry_config *c;
  if (ferry_config_create(&c) != 0) __builtin_trap();
  int rc = ferry_config_load_string(c, text, "fuzz.cfg");
  if (rc != 0 && !ferry_config_last_error(c)[0]) __builtin_trap();
  if (rc == 0) {
    char buf[4096];
    for (int i = 0; i < ferry_config_key_count(); i++) {
      const char *name, *type, *def, *desc;
      if (ferry_config_key_info(i, &name, &type, &def, &desc) != 0) __builtin_trap();
      if (ferry_config_get(c, name, buf, sizeof buf) != 0) __builtin_trap();
    }
  }
  ferry_config_destroy(c);
  free(text);
  return 0;
}
