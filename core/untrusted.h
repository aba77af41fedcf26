/* core/untrusted.h — files and names someone else may have made: the one
 * way every reader opens a file it did not write (checkpoints, weights,
 * tokenizers, model configs, config files), and the one way a name read
 * from such a file is shown as text. Internal: the library, its tests and
 * examples/gpt.
 *
 * A file below the folder the user named is reached one component at a
 * time, none of them a symbolic link, "." or ".."; the file itself is
 * looked at before it is opened (O_PATH) and opened only when it is a
 * regular file (never a FIFO, a device or a folder, so nothing blocks), and
 * only up to the size limit of its kind.
 */
#ifndef FERRY_CORE_UNTRUSTED_H
#define FERRY_CORE_UNTRUSTED_H

#include <stddef.h>
#include <stdint.h>

/* Size limits per kind of file. */
#define FERRY_MAX_MODEL_CONFIG (4u << 20) /* a model's config.json */
#define FERRY_MAX_TOKENIZER (64u << 20)   /* vocab.json, merges.txt */
#define FERRY_MAX_ST_INDEX (256u << 20)   /* model.safetensors.index.json */
#define FERRY_MAX_CONFIG_FILE (256u << 10) /* a libconfig file, and each @include */
#define FERRY_MAX_ANY UINT64_MAX           /* data files, read in pieces */

/* Opens root/rel for reading. root: the folder the user named, followed as
 * given (NULL: the current folder). rel: a relative path whose components
 * are plain names (not empty, "." or ".."), none a symbolic link. The file
 * must be a regular file of at most max bytes. On success *fd (O_RDONLY,
 * close-on-exec, blocking) and *size (may be NULL). Returns FERRY_OK or,
 * with "root/rel: why" in why (may be NULL): FERRY_ENOENT, FERRY_EPERM,
 * FERRY_EIO (the system's reason), FERRY_EINVAL (a bad name, a link, not a
 * regular file), FERRY_EOVERFLOW (larger than max). */
int ferry_open_untrusted(const char *root, const char *rel, uint64_t max, int *fd,
                         uint64_t *size, char *why, size_t wl);

/* The file the user named: path followed as given (a link the user names
 * is theirs), then the same checks on what it reaches. */
int ferry_open_named(const char *path, uint64_t max, int *fd, uint64_t *size, char *why,
                     size_t wl);

/* A file the user named by its folder: the folder of path followed as
 * given, its last component opened as ferry_open_untrusted's rel. */
int ferry_open_leaf(const char *path, uint64_t max, int *fd, uint64_t *size, char *why,
                    size_t wl);

/* Copies s into out (cap bytes, always NUL-terminated, cut to fit) with
 * every control character (below 0x20, and 0x7f) written as \xNN, so a
 * name from a file cannot move the cursor, set a title or clear a
 * terminal. Returns out. */
char *ferry_escape(const char *s, char *out, size_t cap);

#endif /* FERRY_CORE_UNTRUSTED_H */
