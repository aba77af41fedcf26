/* core/file.h — reading a whole (small) file into memory: the JSON files of
 * the planner and of safetensors indexes, ferry-gpt's configs, vocabularies
 * and token files. Internal: the library, its tests and examples/gpt.
 */
#ifndef FERRY_CORE_FILE_H
#define FERRY_CORE_FILE_H

#include <stddef.h>

/* Reads the file at path into a fresh buffer (*text, NUL-terminated; *len
 * bytes before the NUL). Returns FERRY_OK, or with "path: why" in `why`:
 * FERRY_ENOENT / FERRY_EIO (cannot open, with the system's reason),
 * FERRY_EOVERFLOW (larger than limit bytes), FERRY_ENOMEM, FERRY_EIO (a read
 * error). why may be NULL. */
int ferry_read_file(const char *path, size_t limit, char **text, size_t *len, char *why, size_t wl);

#endif /* FERRY_CORE_FILE_H */
