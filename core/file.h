/* core/file.h — reading a whole (small) file into memory: the JSON files of
 * the planner and of safetensors indexes, ferry-gpt's configs, vocabularies
 * and token files, checkpoint manifests. Every file is opened through
 * core/untrusted.h (a regular file only, never blocking, bounded).
 * Internal: the library, its tests and examples/gpt.
 */
#ifndef FERRY_CORE_FILE_H
#define FERRY_CORE_FILE_H

#include <stddef.h>
#include <stdint.h>

/* Reads the file at path (ferry_open_named: the user named it) into a fresh
 * buffer (*text, NUL-terminated; *len bytes before the NUL). Returns
 * FERRY_OK, or with "path: why" in `why`: FERRY_ENOENT / FERRY_EPERM /
 * FERRY_EIO (cannot open, with the system's reason), FERRY_EINVAL (not a
 * regular file), FERRY_EOVERFLOW (larger than limit bytes), FERRY_ENOMEM,
 * FERRY_EIO (a read error). why may be NULL. */
int ferry_read_file(const char *path, size_t limit, char **text, size_t *len, char *why, size_t wl);

/* The same for root/rel, a file below the folder the user named
 * (ferry_open_untrusted; root NULL: rel is split at its last '/' into a
 * folder followed as given and a name opened as a file below it, as
 * ferry_open_leaf). */
int ferry_read_below(const char *root, const char *rel, size_t limit, char **text, size_t *len,
                     char *why, size_t wl);

/* Reads fd, opened through core/untrusted.h with size bytes, whole (a file
 * that grew past limit since is refused); shown names it in why. Closes
 * fd. */
int ferry_read_fd(int fd, const char *shown, uint64_t size, size_t limit, char **text,
                  size_t *len, char *why, size_t wl);

#endif /* FERRY_CORE_FILE_H */
