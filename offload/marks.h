/* offload/marks.h — the marks room (marks.c): a bf16 master's staging
 * marks (NVMe params, updates during backward), the groups whose host
 * params ferry_grads_ready keeps for the stepper to stage (eng_group's
 * to_stage) and their count, which the loop's fetches wait on. Included
 * through offload/engine_impl.h (e->marks). Every call holds mu. The
 * loop marks; the stepper, the drain and ferry_zero_grads unmark.
 */
#ifndef FERRY_OFFLOAD_MARKS_H
#define FERRY_OFFLOAD_MARKS_H

#include <stdint.h>

typedef struct {
  uint32_t unstaged;     /* (mu) groups whose to_stage is set */
} eng_marks;

/* Group g's params are kept for the stepper to stage. */
void marks_set(ferry_engine *e, uint32_t g);
/* The groups marked and not unmarked yet. */
uint32_t marks_unstaged(const ferry_engine *e);
/* Group g's mark gone: staged, or no update comes (its drain sum failed);
 * 1 when it was marked (the caller wakes a fetch waiting on the count). */
int marks_clear(ferry_engine *e, uint32_t g);
/* Every mark gone (no update queued or running). */
void marks_clear_all(ferry_engine *e);

#endif
