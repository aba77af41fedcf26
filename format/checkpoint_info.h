/* format/checkpoint_info.h — what a checkpoint holds, for `ferry
 * checkpoint info`, read without an engine: the manifest (its own CRC
 * checked) and the safetensors headers of params/ and optim/, grouped into
 * families. Reads no tensor data and checks no file CRC (that is
 * ferry_checkpoint_verify's job).
 */
#ifndef FERRY_FORMAT_CHECKPOINT_INFO_H
#define FERRY_FORMAT_CHECKPOINT_INFO_H

#include "format/manifest.h"

#define CKPT_INFO_MAX_FAMILIES 16

/* The tensors of one kind: "params" (params/), and in optim/ each name
 * suffix after the last '.' ("master", "exp_avg", "exp_avg_sq", ...). */
typedef struct {
  char name[32];
  uint64_t tensors;
  uint64_t bytes;     /* of their data */
  char dtype[16];     /* their dtype, or "mixed" */
} ckpt_family;

typedef struct {
  char folder[4096];  /* the checkpoint folder found */
  ckpt_manifest m;    /* the parsed manifest (files owned: ckpt_info_free) */
  uint64_t total_bytes; /* of every file the manifest lists */
  int nfamilies;
  ckpt_family families[CKPT_INFO_MAX_FAMILIES];
} ckpt_info;

/* Fills *out from `path` (a checkpoint folder, or a DIR of them: its
 * newest, as ferry_checkpoint_load would pick). On failure: FERRY_ENOENT
 * (no checkpoint there), FERRY_ECORRUPT (the manifest or a header is
 * damaged), FERRY_EIO or FERRY_ENOMEM, with the file and the reason in
 * why; *out then holds nothing to free. */
int ckpt_info_read(const char *path, ckpt_info *out, char *why, size_t why_len);
void ckpt_info_free(ckpt_info *info);

#endif
