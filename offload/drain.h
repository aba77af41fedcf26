/* offload/drain.h — the drain room's state and calls (drain.c): the device
 * grad buffers the loop's backward writes into, the pinned stages grads are
 * copied into, and the drain thread with its queue. Included through
 * offload/engine_impl.h (e->drain). It uses the stepper, gpu and group
 * rooms; the step driver and the engine call it.
 */
#ifndef FERRY_OFFLOAD_DRAIN_H
#define FERRY_OFFLOAD_DRAIN_H

#include "optim/optim.h"

#include <pthread.h>

typedef struct {
  void *dev;             /* (fixed) device buffer (param dtype) */
  ferry_event *ready;    /* (fixed) backward's writes done (recorded by drain_slot_ready) */
  ferry_event *drained;  /* (fixed) the last copy out of it done (on e->down) */
  int owner;             /* (mu) group, -1 free */
} eng_grad_slot;

/* A pinned buffer a group's grads are copied into (D2H) and summed from. */
typedef struct {
  void *buf;             /* (fixed) the largest group in param dtype */
  ferry_event *done;     /* (fixed) its D2H done (on e->down) */
  double t0, t1;         /* (e->down's host functions; the drain after `done`) the D2H's span */
  /* (mu) grads "none": 1 + the group whose grads it holds, lent to that
   * group's update (drain_lend_stage) until the stepper no longer holds
   * them (stepper_holds_grads; drain_stage_lent takes it back); 0: the
   * drain's */
  uint32_t lent;
} eng_drain_stage;

typedef struct {
  uint32_t group;
  int slot;              /* the device grad buffer its grads are in */
  int last;              /* of the step's last micro-batch: its grads become final */
} eng_drain_item;

/* A group's accumulated grads' squared norm and inf/NaN flag (the drain;
 * the loop after drain_wait). */
typedef struct {
  double sumsq;          /* (stages 1 and 2 with ranks: of this rank's range) */
  int nonfinite;         /* (last micro-batch) */
} eng_drain_norm;

typedef struct {
  pthread_t thread;
  int started;           /* (loop) */
  pthread_cond_t cv_work, cv_idle, cv_slot; /* with mu */
  /* (mu) groups whose grads are ready, FIFO: [qhead, qissue) are being
   * copied D2H (at most ENGINE_DRAIN_STAGES, item i into stage i % it),
   * [qissue, qtail) wait; qhead moves once a group is summed */
  eng_drain_item *queue;
  size_t qhead, qissue, qtail, qcap;
  int stop;              /* (mu) */
  int stage_wait;        /* (mu) waiting for a stage lent to the stepper */
  int status;            /* (mu) first error of the drain */
  int micro;             /* (mu) micro-batches drained completely this step */
  uint32_t in_micro;     /* (mu) groups drained in the current micro-batch */
  int sub_micro;         /* (mu) the same counts of the groups handed in */
  uint32_t sub_in_micro;
  /* (mu) the serial of the micro-batch being handed in (up by one when all
   * groups are in, and at drain_reset_micro); per group, the serial of its
   * last hand-in (0: none) */
  uint64_t pass, *handed;
  eng_grad_slot slot[ENGINE_GRAD_SLOTS];
  int slot_next;         /* (mu) the slot drain_take_slot tries first (round robin) */
  eng_drain_stage stage[ENGINE_DRAIN_STAGES];
  eng_drain_norm *norm;  /* per group (the drain; the loop after drain_wait) */
  double d2h_delay;      /* (fixed) tests: a stream sleep before each D2H */
  double sum_delay;      /* (fixed) tests: a sleep at the start of each CPU sum */
  int sum_faults;        /* (drain; tests set it while the drain is idle) CPU sums to fail */
  ferry_optimizer *opt;  /* (drain) one-thread optimizer for accumulation and stats */
  /* With ranks (drain; fixed pointers): pinned fp32 buffers of the largest
   * group (the all-reduce or the reduce-scatter's send) and of the largest
   * range of a rank (the reduce-scatter's receive); counts per rank. */
  float *reduce, *piece;
  size_t *counts;
} eng_drain;

void drain_create(ferry_engine *e);            /* create: conditions, free slots */
int drain_init(ferry_engine *e, size_t gbytes); /* finalize: buffers */
int drain_init_optimizer(ferry_engine *e, const ferry_optimizer_config *oc);
int drain_start(ferry_engine *e);
void drain_stop(ferry_engine *e);
void drain_free(ferry_engine *e); /* destroy, after drain_stop */
/* A free device grad buffer for group g (waits while both are draining). */
int drain_take_slot(ferry_engine *e, uint32_t g, int *slot);
/* The loop's use of a grad buffer it took: its device memory; zeroing it
 * on s after the drain's last copy out of it; backward's writes done on s
 * (a status with e->err set, `op` naming the call). */
void *drain_slot_dev(const ferry_engine *e, int slot);
int drain_slot_zero(ferry_engine *e, int slot, ferry_stream *s, size_t bytes, const char *op);
int drain_slot_ready(ferry_engine *e, int slot, ferry_stream *s, const char *op);
void drain_submit(ferry_engine *e, uint32_t g, int slot); /* its grads are ready there */
/* (mu held) The grads handed in next are of the step's last micro-batch
 * (final once summed). */
int drain_submits_last(const ferry_engine *e);
/* Whether group g's grads may be handed in now: FERRY_ESTATE (e->err says
 * what to call) when every micro-batch of the step is in (ferry_step
 * first) or g's grads are in already in this micro-batch. */
int drain_may_submit(ferry_engine *e, uint32_t g, const char *op);
/* Waits until every submitted group is drained; the drain's first error. */
int drain_wait(ferry_engine *e);
void drain_progress(ferry_engine *e, int *micro, uint32_t *in_micro);
/* (mu held) Groups are handed in and not summed yet. */
int drain_busy(const ferry_engine *e);
/* With ranks: bytes of the drain's fp32 reduce buffer (the largest group;
 * the return) and of its piece buffer (*piece: the largest range of this
 * rank, stages 1 and 2). 0 alone. After group_partition. */
size_t drain_reduce_bytes(const ferry_engine *e, size_t *piece);
void drain_reset_micro(ferry_engine *e);
/* After drain_wait: the groups' squared norms summed in group order (the
 * same sum on every run) and their inf/NaN flag, cleared for the next
 * step; drain_clear_norm clears group g's alone (ferry_zero_grads). */
void drain_take_norm(ferry_engine *e, double *sumsq, int *nonfinite);
void drain_clear_norm(ferry_engine *e, uint32_t g);
/* Tests: every D2H is preceded by a stream sleep of `seconds`. */
void drain_set_d2h_delay(ferry_engine *e, double seconds);
/* Tests: every CPU sum of a group's grads starts with a sleep of `seconds`
 * (inside its "accumulate" span), standing for a slow sum. */
void drain_set_sum_delay(ferry_engine *e, double seconds);
/* Tests: the next `count` CPU sums fail with FERRY_EIO (after the delay),
 * standing for a failed read of the accumulators. */
void drain_set_sum_faults(ferry_engine *e, int count);

#endif
