/* offload/step_gather.c — the ranks' part of a group's update (ZeRO stages
 * 1 and 2): the vote on its status and the all-gather of its new params.
 * Every update that would gather (a group with a stepped param, not a
 * retry past its gather) votes once, in queue order on the stepper's
 * channel, whether it succeeded, failed before its optimizer pass, failed
 * in its tail or was held back by a parked group (stepper.c). A failure on
 * any rank is a failure on every rank, before any rank gathers: every rank
 * keeps its tail (or its whole update) for the same retry, so the ranks'
 * collectives stay matched. Uses ranks.c (ranks_agree_on) and the comm.
 */
#include "offload/engine_impl.h"

#include <stdio.h>

int step_gathers(const ferry_engine *e, uint32_t g, int idle) {
  return engine_sharded(e) && !engine_params_sharded(e) && !idle &&
         e->gt.groups[g].tail != GROUP_TAIL_HOME;
}

int step_vote(ferry_engine *e, uint32_t g, int rc) {
  char op[64];
  snprintf(op, sizeof op, "step: group %u", g);
  e->stepper.voted = 1;
  rc = ranks_agree_on(e, e->ch_step, rc, op);
  if (rc) e->stepper.vote_failed = 1;
  return rc;
}

/* Every rank's range of group g's new params (written by its optimizer
 * into the staging) to every rank, in place, once the ranks agree that
 * every rank has its range (rc: this rank's status so far). */
int step_gather_params(ferry_engine *e, uint32_t g, int slot, int rc) {
  eng_group *gr = &e->gt.groups[g];
  char *base = e->param_home == FERRY_TIER_DEVICE ? (char *)e->stepper.stage_up[slot]
                                                  : (char *)e->stepper.param_stage;
  for (int r = 0; r < e->nranks; r++)
    e->stepper.counts[r] = (gr->bounds[r + 1] - gr->bounds[r]) * e->esize;
  double t0 = ferry_now();
  rc = step_vote(e, g, rc);
  if (rc) return rc;
  rc = ferry_comm_allgather(e->ch_step, base + gr->lo * e->esize, base, e->stepper.counts,
                            FERRY_DT_U8, NULL, NULL);
  if (rc)
    return ferry_err(&e->err, rc, "step: group %u: all-gather of the new params: %s", g,
                     ferry_comm_last_error(e->ch_step));
  ferry_timeline_add(&e->tl, FERRY_LANE_STEP, "wait for params", t0, ferry_now());
  return FERRY_OK;
}
