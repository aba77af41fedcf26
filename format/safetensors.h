/* format/safetensors.h — the safetensors reader and writer inside the
 * library (the public API is in include/ferry.h). Internal helpers shared
 * with checkpoints: the strict header parser over a buffer in memory.
 */
#ifndef FERRY_FORMAT_SAFETENSORS_H
#define FERRY_FORMAT_SAFETENSORS_H

#include "core/core.h"

/* The safetensors limit on the JSON header (Hugging Face refuses larger). */
#define FERRY_ST_MAX_HEADER (100u * 1000u * 1000u)

/* Checkpoints of ranks (offload/checkpoint_tensors.c): finishes a writer none of
 * whose tensor bytes were given, leaving them as holes that other
 * processes fill later with pwrite at the offsets the reader gives: lays
 * the files out (headers), sizes every file to its full length, writes
 * the index, fsyncs and closes. FERRY_ESTATE after any write. */
int st_writer_finish_holes(ferry_safetensors_writer *w);

/* The files the writer makes of the tensors added so far (the shards, and
 * the index beside two or more), as its layout will place them; nothing is
 * written, and more tensors may still be added. */
int st_writer_file_count(ferry_safetensors_writer *w, uint64_t *files);

/* A file's name below a root (its relative path), offered before the file
 * is opened: 0 lets it be opened; a status refuses it, why saying the
 * reason (the reader puts the file's path before it). */
typedef int (*st_allow_fn)(void *ctx, const char *rel, char *why, size_t wl);

/* Opens the model in root/sub (sub "" or NULL: root itself): its
 * model.safetensors.index.json, else its model.safetensors, with every
 * file (the index, each shard) opened through core/untrusted.h below root
 * and its name offered to allow first (NULL: every name is allowed). On
 * failure the thread's error (ferry_last_error) says why. */
int st_open_below(const char *root, const char *sub, st_allow_fn allow, void *ctx,
                  ferry_safetensors **out);

/* dir + "/" + name in a new malloc'd string (NULL when out of memory). */
char *st_path_join(const char *dir, const char *name);

#endif
