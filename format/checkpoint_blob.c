/* format/checkpoint_blob.c — ferry_checkpoint_read_blob: a checkpoint's
 * user.bin (the caller's blob) read with no engine, its size and CRC32C
 * checked against the manifest (itself checked whole) before a byte is
 * handed out, so a trainer can look at its own state before building an
 * engine and never mistakes a damaged file for a version or a settings
 * difference. Uses the manifest reader of checkpoint_manifest.c.
 */
#include "format/manifest.h"
#include "core/crc32c.h"
#include "core/file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ferry_checkpoint_read_blob(const char *folder, void *buf, size_t cap, size_t *len) {
  if (!folder || !folder[0] || (cap && !buf))
    return ferry_err_thread(FERRY_EINVAL, "checkpoint blob: no folder or no buffer");
  char mp[4096], bp[4096], why[1024] = "";
  if ((size_t)snprintf(mp, sizeof mp, "%s/" CKPT_MANIFEST_NAME, folder) >= sizeof mp ||
      (size_t)snprintf(bp, sizeof bp, "%s/user.bin", folder) >= sizeof bp)
    return ferry_err_thread(FERRY_EINVAL, "checkpoint blob: %.200s...: path too long", folder);
  char *text;
  size_t tlen;
  int rc = ferry_read_below(folder, CKPT_MANIFEST_NAME, CKPT_MANIFEST_MAX, &text, &tlen, why,
                            sizeof why);
  if (rc == FERRY_EOVERFLOW || rc == FERRY_EINVAL) rc = FERRY_ECORRUPT;
  if (rc) return ferry_err_thread(rc, "checkpoint blob: %s", why);
  ckpt_manifest m;
  rc = ckpt_manifest_parse(text, tlen, 1, &m, why, sizeof why);
  free(text);
  if (rc) return ferry_err_thread(rc, "checkpoint blob: %.1000s: %s", mp, why);
  const ckpt_file *f = NULL;
  for (size_t i = 0; i < m.nfiles && !f; i++)
    if (!strcmp(m.files[i].path, "user.bin")) f = &m.files[i];
  if (!f || f->bytes != m.blob_bytes) {
    ckpt_manifest_free(&m);
    return ferry_err_thread(FERRY_ECORRUPT, "checkpoint blob: %.1000s: %s", mp,
                            f ? "user.bin's size is not blob_bytes" : "lists no user.bin");
  }
  uint64_t bytes = f->bytes;
  uint32_t want = f->crc;
  ckpt_manifest_free(&m);
  if (len) *len = (size_t)bytes;
  if (bytes > cap)
    return ferry_err_thread(FERRY_EOVERFLOW, "checkpoint blob: %.1000s is %llu bytes, the buffer "
                            "%zu", bp, (unsigned long long)bytes, cap);
  char *data;
  size_t dlen;
  rc = ferry_read_below(folder, "user.bin", (size_t)bytes, &data, &dlen, why, sizeof why);
  if (rc == FERRY_EINVAL) return ferry_err_thread(FERRY_ECORRUPT, "checkpoint blob: %s", why);
  if (rc == FERRY_EOVERFLOW || (!rc && dlen != bytes)) {
    if (!rc) free(data);
    return ferry_err_thread(FERRY_ECORRUPT, "checkpoint blob: %.1000s: damaged: its size is not "
                            "the manifest's %llu bytes", bp, (unsigned long long)bytes);
  }
  if (rc) return ferry_err_thread(rc, "checkpoint blob: %s", why);
  uint32_t got = ferry_crc32c(0, data, dlen);
  if (got != want) {
    free(data);
    return ferry_err_thread(FERRY_ECORRUPT, "checkpoint blob: %.1000s: damaged: CRC32C %08x, "
                            "the manifest says %08x (the file changed after it was saved)",
                            bp, got, want);
  }
  memcpy(buf, data, dlen);
  free(data);
  return FERRY_OK;
}
