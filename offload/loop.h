/* offload/loop.h — the loop room's calls for checkpoints (loop.c; the
 * public fetch, release and read calls are in include/ferry.h): the
 * quiesce that waits until the loop is between steps, and the progress a
 * checkpoint saves and restores. They are declared once, in the
 * checkpoints' face onto the engine (engine_walk.h: engine_quiesce,
 * engine_progress_get, engine_restore), and defined in loop.c. Included
 * through offload/engine_impl.h.
 */
#ifndef FERRY_OFFLOAD_LOOP_H
#define FERRY_OFFLOAD_LOOP_H

#include "offload/engine_walk.h"

#endif
