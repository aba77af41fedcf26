/* offload/stepper.h — the stepper room's state and calls (stepper.c): the
 * update worker (the stepper thread), its queue, and where each group's
 * new params go. Included through offload/engine_impl.h (e->stepper). It
 * uses the group and gpu rooms; the drain, the step driver, the ranks and
 * the engine call it.
 */
#ifndef FERRY_OFFLOAD_STEPPER_H
#define FERRY_OFFLOAD_STEPPER_H

#include "optim/optim.h"

#include <pthread.h>

typedef struct {
  pthread_t thread;
  int started;           /* (loop) */
  pthread_cond_t cv;     /* with mu: queued / group done / released / stop / stage given back */
  uint32_t *queue;       /* (mu) groups waiting for their update, FIFO */
  size_t head, tail;
  uint32_t pending;      /* (mu) groups queued or being updated */
  float gscale;          /* (mu) grad scale of the queued updates */
  int status;            /* (mu) first error of an asynchronous step */
  char fail_why[768];    /* (mu) the message of the last failed update (file, offset...),
                          * quoted where the failure is reported later (fetch, save) */
  int stop;              /* (mu) */
  int released;          /* (mu) destroy: the loop releases nothing any more */
  int64_t waits_for;     /* (mu) the group whose release by the loop it waits for, -1 none */
  /* (mu) the group whose update failed after its optimizer pass (a tail,
   * eng_group.tail), -1 none: its new params are in the staging buffers
   * until its retry, so every other update fails with park_status, before
   * it changes anything, until then; ferry_step retries that group first */
  int64_t parked;
  int park_status;
  int fault_at, fault_left; /* (mu) tests: engine_set_step_fault */
  /* (mu) grads "none": per group, the drain's staging buffer its grads are
   * in, lent with its update until the optimizer pass over them is done;
   * NULL none */
  const void **lent;
  ferry_event **uploaded; /* (fixed) per group: the step's upload of a device-home group */
  /* (stepper; finalize's initial values before the thread starts) */
  void *stage_up[ENGINE_STAGE_SLOTS];   /* pinned, the largest group in param dtype */
  ferry_event *stage_up_ev[ENGINE_STAGE_SLOTS];
  void *param_stage;                    /* host/NVMe param homes: the largest group */
  ferry_optim_span *spans;              /* max params of a group */
  int64_t *span_t;                      /* per span: its param's step count */
  void **dsts;                          /* per param of a group: where new params go */
  size_t *counts;                       /* with ranks: bytes per rank of a group's gather */
} eng_stepper;

void stepper_create(ferry_engine *e);             /* create: its condition */
int stepper_init(ferry_engine *e, size_t gbytes); /* finalize: buffers */
int stepper_init_param_stage(ferry_engine *e);    /* finalize, after the manager */
int stepper_start(ferry_engine *e);
void stepper_stop(ferry_engine *e);
void stepper_free(ferry_engine *e); /* destroy, after stepper_stop */
/* (mu held) Queues group g's update; grads "none": `grads` is the drain's
 * staging buffer that holds them, lent until the optimizer pass over them
 * is done (stepper_holds_grads), else NULL. */
void stepper_queue(ferry_engine *e, uint32_t g, const void *grads);
/* (mu held) grads "none": group g's update still holds the grads lent with
 * it (a failed update keeps them for its retry). */
int stepper_holds_grads(const ferry_engine *e, uint32_t g);
/* (mu held) The grad scale of the updates queued next (each param's bias
 * correction uses its own step count, eng_param.steps). */
void stepper_set_gscale(ferry_engine *e, float gscale);
/* (mu held) Wakes whoever waits on the stepper (a release by the loop);
 * waits for the stepper's next change (a group done, a stage given back,
 * a release waited for). */
void stepper_wake(ferry_engine *e);
void stepper_wait_change(ferry_engine *e);
/* (mu held) The group whose release by the loop the stepper waits for, -1
 * none; whether updates are queued or running. */
int64_t stepper_waits_for(const ferry_engine *e);
int stepper_busy(const ferry_engine *e);
/* (mu held) destroy: the loop releases nothing any more, so an update
 * waiting for a release goes on. */
void stepper_abandon_releases(ferry_engine *e);
/* The message of the last failed update (takes mu), "" none. */
void stepper_fail_why(ferry_engine *e, char *out, size_t cap);
/* Device home: the event of group g's last upload (the next fetch waits). */
ferry_event *stepper_uploaded(const ferry_engine *e, uint32_t g);
/* Tests: the next `count` updates that reach tail step `at` (a
 * group_tail) fail there with FERRY_EIO (engine_set_step_fault). */
void stepper_set_fault(ferry_engine *e, int at, int count);
/* Runs again the updates that failed (the one with a tail first); 1 when
 * there were any. */
int stepper_retry_failed(ferry_engine *e);
/* Waits until no update is queued or running; returns (and clears) the
 * first error. */
int stepper_wait_all(ferry_engine *e);
/* Waits until group g's update is done; its failure status, or 0. */
int stepper_wait_group(ferry_engine *e, uint32_t g);
/* (mu held) A wait of at most `seconds` for the stepper's next change
 * (a group staged: marks.h). */
void stepper_wait_change_for(ferry_engine *e, double seconds);
/* Writes a group's params (param dtype) from fp32 values: vals (the
 * group's values, goff-indexed), or when NULL its fp32 master values, which
 * must be held in the optimizer's work tier (finalize). */
int stepper_write_params(ferry_engine *e, uint32_t g, const float *vals);
/* Copies group g's current params (param dtype, goff-indexed) from where
 * they live (host copy; NVMe through the host; device copy D2H on s) into
 * dst, host memory. Between its updates (the stepper, or quiesced). */
int stepper_read_params(ferry_engine *e, uint32_t g, void *dst, ferry_stream *s);

#endif
