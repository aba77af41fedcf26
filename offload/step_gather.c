/* offload/step_gather.c — the ranks' part of a group's update (ZeRO stages
 * 1 and 2): the vote on its status and the all-gather of its new params.
 * Every update that would gather (a group with a stepped param, not a
 * retry past its gather) votes once, in queue order on the stepper's
 * channel, whether it succeeded, failed before its optimizer pass, failed
 * in its tail or was held back by a parked group (stepper.c). A failure on
 * any rank is a failure on every rank, before any rank gathers: every rank
 * keeps its tail (or its whole update) for the same retry, so the ranks'
 * collectives stay matched; the others name the failed rank and its
 * message. Uses group.h and the comm (the stepper's channel); the stepper
 * keeps what each vote decided (stepper.c).
 */
#include "offload/step_gather.h"
#include "offload/engine_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A rank's part of the vote: its status and its message, so that the
 * other ranks name the cause. */
typedef struct {
  int32_t status;
  char why[FERRY_ERR_MAX - 4];
} vote_rec;

int step_gathers(const ferry_engine *e, uint32_t g, int idle) {
  return engine_sharded(e) && !engine_params_sharded(e) && !idle &&
         e->gt.groups[g].tail != GROUP_TAIL_HOME;
}

int step_vote(ferry_engine *e, uint32_t g, int rc, const char *why) {
  vote_rec *all = calloc((size_t)e->nranks, sizeof *all);
  size_t *counts = calloc((size_t)e->nranks, sizeof *counts);
  if (!all || !counts) {
    free(all);
    free(counts);
    return ferry_err(&e->err, FERRY_ENOMEM, "step: group %u: the ranks' vote: out of memory", g);
  }
  vote_rec *mine = all + e->rank;
  mine->status = rc;
  if (rc) {
    int most = (int)sizeof mine->why - 1;
    pthread_mutex_lock(&e->err.mu);
    snprintf(mine->why, sizeof mine->why, "%.*s", most, why ? why : e->err.msg);
    pthread_mutex_unlock(&e->err.mu);
  }
  for (int r = 0; r < e->nranks; r++)
    counts[r] = sizeof *all;
  int crc = ferry_comm_allgather(e->ch_step, mine, all, counts, FERRY_DT_U8, NULL, NULL);
  int other = -1;
  for (int r = 0; r < e->nranks && other < 0 && !crc; r++)
    if (all[r].status && r != e->rank) other = r;
  if (crc)
    rc = ferry_err(&e->err, crc, "step: group %u: the ranks' vote: %s", g,
                   ferry_comm_last_error(e->ch_step));
  else if (!rc && other >= 0)
    rc = ferry_err(&e->err, all[other].status, "step: group %u: rank %d failed: %.*s", g, other,
                   (int)sizeof all[other].why - 1, all[other].why);
  free(all);
  free(counts);
  return rc;
}

int step_gather_params(ferry_engine *e, uint32_t g, void *base) {
  eng_group *gr = &e->gt.groups[g];
  size_t *counts = calloc((size_t)e->nranks, sizeof *counts);
  if (!counts) return ferry_err(&e->err, FERRY_ENOMEM, "step: group %u: out of memory", g);
  for (int r = 0; r < e->nranks; r++)
    counts[r] = (gr->bounds[r + 1] - gr->bounds[r]) * e->esize;
  double t0 = ferry_now();
  int rc = ferry_comm_allgather(e->ch_step, (char *)base + gr->lo * e->esize, base, counts,
                                FERRY_DT_U8, NULL, NULL);
  free(counts);
  if (rc)
    return ferry_err(&e->err, rc, "step: group %u: all-gather of the new params: %s", g,
                     ferry_comm_last_error(e->ch_step));
  ferry_timeline_add(&e->tl, FERRY_LANE_STEP, "wait for params", t0, ferry_now());
  return FERRY_OK;
}
