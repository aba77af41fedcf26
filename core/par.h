/* core/par.h — work split over transient threads: a function run once per
 * part, each part on its own thread; and a large memory range zeroed that
 * way, the first touch of a pool of gigabytes before it is pinned or used,
 * so that its page faults (the kernel clearing each page) run on every core
 * instead of one. Below FERRY_PAR_MIN_BYTES the caller's thread zeroes alone
 * and no thread is started, so small runs are as before.
 */
#ifndef FERRY_CORE_PAR_H
#define FERRY_CORE_PAR_H

#include <stddef.h>

/* The size from which ferry_par_zero uses threads. */
#define FERRY_PAR_MIN_BYTES ((size_t)1 << 30)
/* The most parts ferry_par_run runs at once. */
#define FERRY_PAR_MAX 64

/* The threads of ferry_par_zero and of a caller's split when it passes 0:
 * the online CPUs, at most FERRY_PAR_MAX. */
int ferry_par_threads(void);

/* fn(arg, k) for each part k in [0, parts), parts <= FERRY_PAR_MAX: part 0
 * on the caller's thread, each other on a thread of its own (or on the
 * caller's when none can be started); all done at the return. */
void ferry_par_run(int parts, void (*fn)(void *arg, int part), void *arg);

/* memset(p, 0, n), split into contiguous slices of at least 256 MiB, one
 * per thread, up to `threads` (0: ferry_par_threads()). */
void ferry_par_zero(void *p, size_t n, int threads);

#endif /* FERRY_CORE_PAR_H */
