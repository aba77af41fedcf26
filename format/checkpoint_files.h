/* format/checkpoint_files.h — a checkpoint's files and folders with no
 * engine (checkpoint_files.c), and opening and checking one
 * (checkpoint_verify.c): what `ferry checkpoint verify|info`, the
 * engine's save and load share.
 */
#ifndef FERRY_FORMAT_CHECKPOINT_FILES_H
#define FERRY_FORMAT_CHECKPOINT_FILES_H

#include "format/manifest.h"
#include "format/safetensors.h"

#define CKPT_PREFIX "step-" /* a checkpoint folder's name: step-<digits> */


int ckpt_io_status(int err); /* errno -> FERRY_* */
/* out = a/b; FERRY_EOVERFLOW when it does not fit. */
int ckpt_join(char *out, size_t cap, const char *a, const char *b);
int ckpt_fsync(const char *path); /* -errno on failure */
/* Removes a folder and everything under it (no symlinks followed). */
void ckpt_rm_tree(const char *path);
/* Size and CRC32C of a file, streamed. */
int ckpt_file_crc(const char *path, uint64_t *bytes, uint32_t *crc, char *why, size_t wl);
/* The same for folder/rel, a file of a checkpoint someone else may have
 * made (core/untrusted.h: no link, a regular file); *size: its size when
 * opened. A link or a file that is not regular is FERRY_ECORRUPT. */
int ckpt_file_crc_at(const char *folder, const char *rel, uint64_t *size, uint64_t *bytes,
                     uint32_t *crc, char *why, size_t wl);
/* Parses "step-<digits>" (the folder of one checkpoint); -1 otherwise. */
int64_t ckpt_step_of(const char *name);
typedef struct {
  int64_t step;
  char name[64];
} ckpt_entry;
/* The checkpoint folders in root, newest first (malloc'd); -errno. */
int ckpt_list(const char *root, ckpt_entry **out, size_t *n);
/* Moves the complete folder tmp to target, replacing one already there. */
int ckpt_rename_into_place(const char *tmp, const char *target, const char *trash);

/* Finds the checkpoint folder of path (path itself, or its newest step-*
 * folder), reads its manifest into *m and checks every file it lists
 * (sizes and CRC32C when check_crc); on failure *m is empty and why says
 * what is wrong. */
int ckpt_open(const char *path, char *folder, size_t cap, ckpt_manifest *m, int check_crc,
              char *why, size_t wl);
/* st_allow_fn (format/safetensors.h) over a manifest (ctx): rel is listed;
 * else FERRY_ECORRUPT, why "not listed in the manifest". */
int ckpt_listed(void *ctx, const char *rel, char *why, size_t wl);
/* Opens folder/sub as a safetensors model whose every file the manifest
 * lists (and so was checked): each name checked before its file is
 * opened, no link followed below folder. */
int ckpt_open_part(const ckpt_manifest *m, const char *folder, const char *sub,
                   ferry_safetensors **out, char *why, size_t wl);

#endif
