/* tests/fuzz/fuzz_manifest.c — libFuzzer target for the checkpoint
 * manifest reader (format/checkpoint_manifest.c): the first byte chooses
 * whether the final CRC is checked (so mutations reach every line), the
 * rest is the manifest; a version 5 manifest is followed by a NUL and its
 * file of per-param step counts. What parses must format and parse back
 * the same (a version 4 manifest's counts come back as version 5's file).
 */
#include "format/manifest.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int check_crc = data[0] & 1;
  ckpt_manifest m;
  char why[256];
  const char *text0 = (const char *)data + 1, *nul = memchr(text0, 0, size - 1);
  size_t mlen = nul ? (size_t)(nul - text0) : size - 1;
  if (ckpt_manifest_parse(text0, mlen, check_crc, &m, why, sizeof why) != 0) {
    if (!why[0]) __builtin_trap(); /* every refusal has a reason */
    return 0;
  }
  if (m.version == 5 && nul &&
      ckpt_param_steps_parse(nul + 1, size - 2 - mlen, &m, why, sizeof why) != 0) {
    if (!why[0]) __builtin_trap();
    ckpt_manifest_free(&m);
    return 0;
  }
  for (size_t i = 0; i < m.nfiles; i++) { /* no absolute path, no "." or ".." component */
    const char *p = m.files[i].path;
    if (!p[0] || p[0] == '/') __builtin_trap();
    for (const char *c = p; c; c = strchr(c, '/') ? strchr(c, '/') + 1 : NULL)
      if (!strncmp(c, "./", 2) || !strcmp(c, ".") || !strncmp(c, "../", 3) || !strcmp(c, ".."))
        __builtin_trap();
  }
  char *text;
  size_t len;
  if (ckpt_manifest_format(&m, &text, &len) != 0) __builtin_trap();
  ckpt_manifest back;
  if (ckpt_manifest_parse(text, len, 1, &back, why, sizeof why) != 0) __builtin_trap();
  char *steps;
  size_t slen;
  if (ckpt_param_steps_format(&m, &steps, &slen) != 0) __builtin_trap();
  if (m.nsteps && ckpt_param_steps_parse(steps, slen, &back, why, sizeof why) != 0)
    __builtin_trap();
  free(steps);
  for (size_t i = 0; i < m.nsteps && back.nsteps == m.nsteps; i++)
    if (back.steps[i].index != m.steps[i].index || back.steps[i].steps != m.steps[i].steps ||
        strcmp(back.steps[i].name, m.steps[i].name))
      __builtin_trap();
  if (back.step != m.step || back.nfiles != m.nfiles || back.blob_bytes != m.blob_bytes ||
      back.loss_scale_bits != m.loss_scale_bits || back.state_block != m.state_block ||
      strcmp(back.state_dtype, m.state_dtype) || strcmp(back.master_dtype, m.master_dtype) ||
      (m.nfiles && memcmp(back.files, m.files, m.nfiles * sizeof *m.files) != 0) ||
      back.steps_listed != m.steps_listed || back.nsteps != m.nsteps)
    __builtin_trap();
  ckpt_manifest_free(&back);
  ckpt_manifest_free(&m);
  free(text);
  return 0;
}
