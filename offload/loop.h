/* offload/loop.h — the loop room's calls for checkpoints (loop.c; the
 * public fetch, release and read calls are in include/ferry.h): the
 * quiesce that waits until the loop is between steps, and the progress a
 * checkpoint saves and restores. Included through offload/engine_impl.h.
 */
#ifndef FERRY_OFFLOAD_LOOP_H
#define FERRY_OFFLOAD_LOOP_H

#include "core/core.h"

/* Waits until the loop is between steps (no step, no drain, no micro-batch
 * half handed in, no group fetched, uploads done); `op` names the caller in
 * errors. */
int engine_quiesce(ferry_engine *e, const char *op);
/* The step counter and loss scale a checkpoint saves and loads back. */
typedef struct {
  int64_t steps;
  float scale;
  int good_steps;
  int64_t skipped;
} engine_progress;
void engine_progress_get(const ferry_engine *e, engine_progress *out);
/* Sets them (after a quiesce, from a checkpoint): the next update uses
 * step p->steps for its bias correction. */
void engine_restore(ferry_engine *e, const engine_progress *p);

#endif
