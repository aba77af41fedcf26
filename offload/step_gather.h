/* offload/step_gather.h — the ranks' part of a group's update at ZeRO
 * stages 1 and 2 (step_gather.c): the vote on its status and the all-gather
 * of its new params. The stepper (stepper.c) calls it.
 */
#ifndef FERRY_OFFLOAD_STEP_GATHER_H
#define FERRY_OFFLOAD_STEP_GATHER_H

#include "offload/engine_state.h"

/* Whether group g's update takes part in the ranks' vote and all-gather
 * (idle: no param of it is stepped; a retry past its all-gather does not). */
int step_gathers(const ferry_engine *e, uint32_t g, int idle);
/* The vote on group g's update (a collective on the stepper's channel):
 * this rank's status rc and, when it failed, `why` (NULL: e->err's
 * message) to every rank. This rank's rc when it failed, else the first
 * other rank's failure naming it and its message, else 0. */
int step_vote(ferry_engine *e, uint32_t g, int rc, const char *why);
/* Every rank's range of group g's new params in `base` (the staging the
 * optimizer wrote, goff-indexed) to every rank, in place. */
int step_gather_params(ferry_engine *e, uint32_t g, void *base);

#endif
