/* offload/marks.c — a bf16 master's staging marks (NVMe params, updates
 * during backward): the groups whose host params ferry_grads_ready keeps
 * for the stepper to stage (eng_group.to_stage, counted in
 * e->marks.unstaged; the loop's fetches wait on that count). A mark goes
 * when the update stages its group (or fails to), when the drain's sum of
 * its grads fails or is not run after a drain failure (no update comes),
 * and at ferry_zero_grads (no update is queued or running then). Every
 * call holds mu; the callers wake the waiting fetch (the stepper's
 * condition).
 */
#include "offload/engine_impl.h"

void marks_set(ferry_engine *e, uint32_t g) {
  if (e->gt.groups[g].to_stage) return;
  e->gt.groups[g].to_stage = 1;
  e->marks.unstaged++;
}

uint32_t marks_unstaged(const ferry_engine *e) { return e->marks.unstaged; }

int marks_clear(ferry_engine *e, uint32_t g) {
  if (!e->gt.groups[g].to_stage) return 0;
  e->gt.groups[g].to_stage = 0;
  e->marks.unstaged--;
  return 1;
}

void marks_clear_all(ferry_engine *e) {
  for (uint32_t g = 0; g < e->gt.ngroups && e->marks.unstaged; g++) (void)marks_clear(e, g);
}
