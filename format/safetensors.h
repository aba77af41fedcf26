/* format/safetensors.h — the safetensors reader and writer inside the
 * library (the public API is in include/ferry.h). Internal helpers shared
 * with checkpoints: the strict header parser over a buffer in memory.
 */
#ifndef FERRY_FORMAT_SAFETENSORS_H
#define FERRY_FORMAT_SAFETENSORS_H

#include "core/core.h"

/* The safetensors limit on the JSON header (Hugging Face refuses larger). */
#define FERRY_ST_MAX_HEADER (100u * 1000u * 1000u)

/* Checkpoints of ranks (offload/checkpoint.c): finishes a writer none of
 * whose tensor bytes were given, leaving them as holes that other
 * processes fill later with pwrite at the offsets the reader gives: lays
 * the files out (headers), sizes every file to its full length, writes
 * the index, fsyncs and closes. FERRY_ESTATE after any write. */
int st_writer_finish_holes(ferry_safetensors_writer *w);

/* dir + "/" + name in a new malloc'd string (NULL when out of memory). */
char *st_path_join(const char *dir, const char *name);

#endif
