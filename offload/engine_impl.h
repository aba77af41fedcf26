/* offload/engine_impl.h — the engine's private structures, shared by
 * engine.c (creation, registration, finalize, fetch/release, the gradient
 * drain) and step.c (the pipelined optimizer step).
 */
#ifndef FERRY_ENGINE_IMPL_H
#define FERRY_ENGINE_IMPL_H

#include "memory/memory.h"
#include "nvme/nvme.h"
#include "offload/config.h"
#include "offload/timeline.h"

#include <pthread.h>

#define ENGINE_GRAD_SLOTS 2   /* device grad buffers in flight (backward / drain) */
#define ENGINE_STAGE_SLOTS 2  /* pinned buffers for D2H grads and param uploads */

typedef struct {
  char *name;
  int64_t shape[FERRY_MEM_MAX_DIMS];
  int ndim;
  size_t n;
  uint32_t group;
  const float *values;
  ferry_init_fn init;
  void *init_user;
  uint32_t id[FERRY_ROLE_COUNT]; /* memory manager ids per role (UINT32_MAX: none) */
  size_t goff;                   /* element offset within its group */
} eng_param;

typedef struct {
  uint32_t first, count; /* indices into e->by_group */
  size_t n;              /* elements */
  int fetched;           /* holds on the device params */
  ferry_stream *stream;  /* stream of the current fetch */
  int grad_slot;         /* device grad buffer held, -1 none */
  ferry_event *uploaded; /* the step's upload of a device-home group's params */
  double sumsq;          /* of the accumulated grads (last micro-batch) */
  int nonfinite;
  int step_queued;       /* its update is queued, running or not committed */
  int updated;           /* its optimizer update is done, params not committed */
  int failed;            /* its update failed before changing anything (the status):
                            the next ferry_step runs it again */
} eng_group;

typedef struct {
  void *dev;             /* device buffer (param dtype) */
  int owner;             /* group, -1 free */
  ferry_event *ready;    /* backward's writes done (recorded by grads_ready) */
} eng_grad_slot;

struct ferry_engine {
  ferry_config *cfg;
  const ferry_config_values *cv;
  ferry_errbuf err;
  ferry_logger log;
  ferry_device *dev;
  int own_dev;
  int finalized;
  int dtype;        /* FERRY_OPTIM_DT_* of params and device grads */
  size_t esize;     /* bytes per param element */
  int param_home, grad_home, optim_home; /* FERRY_TIER_* */
  int nstates;      /* optimizer states per element (0, 1, 2) */

  eng_param *params;
  size_t nparams, capparams;
  uint32_t *by_group; /* param indices sorted by (group, registration) */
  eng_group *groups;
  uint32_t ngroups;
  size_t max_group_n;

  ferry_mem *mem;
  ferry_swap *swap;
  ferry_optimizer *opt;
  ferry_loss_scaler scaler;
  int dynamic_scale;
  float fixed_scale;

  ferry_stream *up, *down; /* engine copy streams: param uploads, grad downloads */
  eng_grad_slot gslot[ENGINE_GRAD_SLOTS];
  void *stage_up[ENGINE_STAGE_SLOTS];   /* pinned, max group in param dtype */
  ferry_event *stage_up_ev[ENGINE_STAGE_SLOTS];
  void *stage_down;                     /* pinned, max group in param dtype */
  void *param_stage;                    /* host/NVMe param homes: the largest group */
  ferry_optim_span *spans;              /* max params of a group */
  ferry_grad_span *gspans;
  void **dsts;                          /* per param of a group: where new params go */

  /* gradient drain */
  pthread_t drain;
  int drain_started;
  pthread_mutex_t mu;
  pthread_cond_t cv_work, cv_idle, cv_slot;
  uint32_t *queue;     /* groups whose grads are ready, FIFO */
  size_t qhead, qtail, qcap;
  int draining;        /* the drain thread is working on one */
  int stop;
  int drain_status;    /* first error of the drain */
  int micro;           /* micro-batches drained completely this step */
  uint32_t drained_in_micro; /* groups drained in the current micro-batch */

  /* the step runs on its own thread; fetch(g) waits until group g is done */
  pthread_t stepper;
  int stepper_started;
  pthread_cond_t cv_step;   /* step requested / group done / step over */
  uint32_t *sq;             /* groups waiting for their update, FIFO */
  size_t sq_head, sq_tail;
  uint32_t step_pending;    /* groups queued or being updated */
  float step_gscale;        /* grad scale of the queued updates */
  int step_status;          /* first error of an asynchronous step */
  int eager;                /* update each group as soon as its grads are final */
  ferry_optimizer *gopt;    /* one-thread optimizer for the drain's helpers */

  size_t fetches;           /* ferry_fetch calls since the last step */
  int64_t steps;
  int64_t cur_step;    /* steps before the update being applied (bias correction) */
  int tracing;         /* recording the first step's fetch order */
  uint32_t *trace;     /* the loop's fetches of the first step (groups) */
  int *trace_fam;
  size_t ntrace, captrace;
  ferry_timeline tl;
  double copy_t0[2];   /* start of the manager's H2D / D2H copy in flight */
};

/* step.c */
int engine_step(ferry_engine *e, ferry_step_info *info);
void *engine_step_main(void *arg);
/* Waits until no step is running; returns (and clears) its error. */
int engine_wait_step(ferry_engine *e);
/* Waits until group g of a running step is updated. */
int engine_wait_step_group(ferry_engine *e, uint32_t g);
/* Queues group g's update (e->mu held). */
void engine_queue_step(ferry_engine *e, uint32_t g);
/* Writes a group's params (param dtype) from its fp32 master values, which
 * must be held in the optimizer's work tier (finalize). */
int engine_write_params(ferry_engine *e, uint32_t g, int slot, const float *unused);
/* engine.c: prefetch what the trace expects next */
void engine_prefetch(ferry_engine *e);
/* engine.c */
int engine_wait_drain(ferry_engine *e);
int engine_fail(ferry_engine *e, int status, const char *what);

#endif
