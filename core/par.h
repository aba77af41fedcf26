/* core/par.h — work split over transient threads: a function run once per
 * part, each part on its own thread; and a large memory range zeroed that
 * way, the first touch of a pool of gigabytes before it is pinned or used,
 * so that its page faults (the kernel clearing each page) run on every core
 * instead of one. Below FERRY_PAR_MIN_BYTES the caller's thread zeroes alone
 * and no thread is started, so small runs are as before. The zeroing can be
 * stopped between pieces of FERRY_PAR_PIECE bytes (a set-up cancelled).
 */
#ifndef FERRY_CORE_PAR_H
#define FERRY_CORE_PAR_H

#include <stddef.h>

/* The size from which ferry_par_zero uses threads. */
#define FERRY_PAR_MIN_BYTES ((size_t)1 << 30)
/* The bytes each thread zeroes between two asks of ferry_par_zero_stop's
 * stop (tens of milliseconds of page faults). */
#define FERRY_PAR_PIECE ((size_t)64 << 20)
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

/* ferry_par_zero that asks stop(user) before each piece of FERRY_PAR_PIECE
 * bytes, on every thread (stop must be thread-safe; NULL: never stops), and
 * leaves the rest as it is once one ask says non-zero. 1 when stopped (the
 * range then partly zeroed), 0 when all is zeroed. */
int ferry_par_zero_stop(void *p, size_t n, int threads, int (*stop)(void *user), void *user);

#endif /* FERRY_CORE_PAR_H */
