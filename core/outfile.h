/* core/outfile.h — the one way to write a user-visible file (weights,
 * configs, plans, stats, timelines): a temporary file beside the target,
 * written, fsynced and renamed over it, then the folder fsynced. A failure
 * leaves the old file whole and removes the temporary; a symlink planted at
 * the target's name is replaced, never written through. Also the check of
 * stdout at a program's exit. Internal: the library, its tests, the `ferry`
 * command and examples/gpt.
 */
#ifndef FERRY_CORE_OUTFILE_H
#define FERRY_CORE_OUTFILE_H

#include <stddef.h>
#include <stdio.h>

typedef struct {
  FILE *f;    /* the stream over the temporary file (stdio writes) */
  int fd;     /* its descriptor (positioned writes: pwrite, ftruncate) */
  char *path; /* the target */
  char *tmp;  /* the temporary beside it: ".NAME.tmp-PID-SEQ" */
} ferry_outfile;

/* Creates the temporary beside path (O_CREAT | O_EXCL | O_NOFOLLOW, the
 * mode of a regular file already at path, else 0666 less the umask), and
 * removes the temporaries of path that processes now gone left behind.
 * Returns FERRY_OK, or with "path: why" in `why`: FERRY_ENOENT, FERRY_EPERM,
 * FERRY_ENOSPC, FERRY_EIO, FERRY_ENOMEM. why may be NULL. */
int ferry_outfile_open(ferry_outfile *o, const char *path, char *why, size_t wl);

/* Flushes and checks the stream, fsyncs and closes the temporary, renames
 * it over the target and fsyncs the folder. On failure the temporary is
 * removed (as ferry_outfile_abort) and the status says why, as open's. */
int ferry_outfile_commit(ferry_outfile *o, char *why, size_t wl);

/* Closes and removes the temporary; the target is untouched. Safe on a
 * zeroed, committed or aborted outfile. */
void ferry_outfile_abort(ferry_outfile *o);

/* The status of a failed system call's errno: FERRY_ENOSPC (ENOSPC, EDQUOT,
 * EFBIG), FERRY_EPERM, FERRY_ENOENT, else FERRY_EIO. */
int ferry_outfile_status(int err);

/* strerror(err) into buf; for EFBIG it adds the file size limit
 * (RLIMIT_FSIZE, `ulimit -f`) when one is set. Returns buf. */
const char *ferry_outfile_reason(int err, char *buf, size_t n);

/* For programs (`ferry`, ferry-gpt), first in main: makes descriptors 0, 1
 * and 2 open (/dev/null, read-only) when they are closed, so no file opened
 * later takes their number and a write to a closed stdout fails (EBADF)
 * rather than landing in that file; and ignores SIGXFSZ, so a write past
 * the file size limit (`ulimit -f`) fails with EFBIG, which callers name,
 * instead of killing the process without a word. */
void ferry_program_start(void);

/* Flushes and closes stdout. Returns 0, or -1 with the reason in why (the
 * output was lost: a full disk, a closed pipe or descriptor). */
int ferry_stdout_finish(char *why, size_t wl);

#endif /* FERRY_CORE_OUTFILE_H */
