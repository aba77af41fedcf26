/* offload/engine_impl.h — the engine's private face: its own state
 * (engine_state.h: struct ferry_engine, the frame the rooms' states sit in)
 * and every room's header, which checkpoints and the rooms include; and
 * engine.c's own calls. Each room is a source file with its header of the
 * same stem; it declares its state there and changes another room's state
 * only through that room's functions. Calls go one way (offload/README.md):
 *
 *   checkpoint_*.c ──> engine_walk.h (engine_walk.c, loop.c, ranks.c)
 *   create.c  engine.c  loop.c  step.c  engine_walk.c    the loop's API
 *         └─────────┴─────────┴───────┴───────┘
 *      ranks.c ──────────┐
 *      drain.c ──────────┴──> stepper.c ──> gpu.c ──> group.c
 *
 *   group.c    the group table: params, groups, their tensors in the
 *              memory manager, each group's update state (e->gt)
 *   gpu.c      the leaf operations on grads and optimizer state that live
 *              on a real GPU (CUDA kernels, copies) (e->gpu)
 *   stepper.c  the update worker (the stepper thread), its queue, the
 *              grads lent with an update (e->stepper)
 *   drain.c    the gradient drain (the drain thread), device grad buffers,
 *              staging, the groups' grad norms (e->drain)
 *   ranks.c    the ranks (ZeRO): channels, fingerprints, the global norm,
 *              stage 3's gathers at fetch and their read-ahead (e->ranks)
 *   step.c     the ferry_step driver: norm, scaling, queueing the updates
 *   loop.c     fetch/release, device pointers, grads_ready, param read,
 *              quiesce/restore (the loop's per-group e->fetch)
 *   create.c   create and destroy
 *   engine.c   finalize, stats, the narrow internal API
 *   engine_walk.c  the checkpoints' view of the engine (engine_walk.h);
 *              checkpoint_*.c see nothing else of it
 *
 * Threads: the loop (the caller of the public API), the drain thread and
 * the stepper thread. One mutex, `mu`, guards every field marked (mu); a
 * field marked (loop), (drain) or (stepper) is touched by that thread only;
 * (fixed) fields are written by create/finalize before the threads start
 * and only read afterwards.
 */
#ifndef FERRY_ENGINE_IMPL_H
#define FERRY_ENGINE_IMPL_H

#include "offload/engine_state.h"
#include "offload/loop.h"

/* engine.c: ferry_optimizer_bytes_per_param of the engine's optimizer
 * pass (ferry_stats.optim_bytes_per_param, the timeline's metadata). */
double engine_optim_bytes_per_param(const ferry_engine *e);

#endif
