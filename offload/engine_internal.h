/* offload/engine_internal.h — the narrow internal API of the engine for
 * tests and benchmarks, which need a few of its insides (its swap store for
 * fault injection, its timeline, the bytes it keeps outside the manager)
 * but never its struct.
 */
#ifndef FERRY_ENGINE_INTERNAL_H
#define FERRY_ENGINE_INTERNAL_H

#include "nvme/nvme.h"
#include "format/timeline.h"

/* Waits until no optimizer update is queued or running; returns (and
 * clears) the first error of the last step. */
int engine_wait_step(ferry_engine *e);
/* The io_uring swap store (NULL when nothing lives on NVMe). */
ferry_swap *engine_swap(ferry_engine *e);
/* The engine's timeline; asking for it switches the manager's copy spans
 * on (they are off unless the config names a timeline file). */
ferry_timeline *engine_timeline(ferry_engine *e);
ferry_dtype engine_param_dtype(const ferry_engine *e);
/* The bytes of device memory and of host memory the engine keeps outside
 * the memory manager (grad buffers; staging), out of the budgets
 * (finalized engines). */
void engine_own_bytes(const ferry_engine *e, size_t *own_dev, size_t *own_host);
/* Tests (before finalize): every grad D2H of the drain is preceded by a
 * stream sleep of `seconds` on the D2H stream, standing for a slow link. */
void engine_set_d2h_delay(ferry_engine *e, double seconds);
/* Tests (before finalize): every CPU sum of the drain starts with a sleep
 * of `seconds`, standing for a slow sum. */
void engine_set_sum_delay(ferry_engine *e, double seconds);
/* Tests (while the drain is idle): the next `count` CPU sums of the drain
 * fail with FERRY_EIO, standing for a failed read of the accumulators; the
 * drain then fails (as a real failure does). */
void engine_set_sum_faults(ferry_engine *e, int count);
/* Tests: the next `count` times an update reaches `point` after its
 * optimizer pass, it fails there with FERRY_EIO as the real call would:
 * the zeroing of its grads, the ranks' all-gather of its new params (every
 * rank arms it), their upload (device home) or commit (host and NVMe
 * homes), those two after the group's first param is copied. count 0
 * disarms. The points are the values of group_tail (offload/group.h). */
enum { ENGINE_FAULT_ZERO = 1, ENGINE_FAULT_GATHER = 2, ENGINE_FAULT_HOME = 3 };
void engine_set_step_fault(ferry_engine *e, int point, int count);

/* Finalized engines: the bytes of a family's chunks (all groups); the host
 * pool's one-step working set that finalize checks (check_host_pool in
 * engine.c); and a flush of every dirty copy to its home (waits for the
 * NVMe writes, so ferry_stats counts them). */
size_t engine_family_chunk_bytes(ferry_engine *e, int family);
size_t engine_host_need(ferry_engine *e);
int engine_flush(ferry_engine *e);
/* The bytes of optimizer state and grads finalize zeroed itself: those of
 * NVMe homes only (a device or host home was zeroed when it was reserved). */
size_t engine_setup_zeroed_bytes(ferry_engine *e);

#endif
