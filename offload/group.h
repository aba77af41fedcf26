/* offload/group.h — the group room's state and calls (group.c): the
 * parameter table, the groups, each group's update state. Included through
 * offload/engine_impl.h, whose struct ferry_engine holds an eng_groups as
 * e->gt. The lowest room: it uses no other room's names.
 */
#ifndef FERRY_OFFLOAD_GROUP_H
#define FERRY_OFFLOAD_GROUP_H

#include "memory/memory.h"

typedef struct { /* (fixed) */
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
  uint64_t gindex;               /* element offset in the model, registration order (the
                                    stochastic-rounding index of a bf16 master) */
  size_t state_bytes;            /* bytes of one optimizer state of its piece
                                    (ferry_optimizer_state_bytes of pn) */
  /* This rank's piece (ZeRO stage >= 1 with ranks; else plo = 0, pn = n):
   * elements [plo, plo + pn) of the param, whose master, optimizer states
   * and (stage 2) grad accumulator are tensors of pn elements; pn = 0: no
   * tensor of those roles. */
  size_t plo, pn;
  /* Its own optimizer step count (bias correction uses it): a param that
   * got no gradient in a step is left as it is with optimizer.missing_grad
   * = skip, count included, as torch does. (stepper, after its update;
   * the loop while quiesced: checkpoints) */
  int64_t steps;
  /* This step's gradients (the loop writes them; the stepper reads them,
   * ordered by the group's update state): no_grad, the current
   * micro-batch said it has none (ferry_param_no_grad, taken in at its
   * group's grads_ready); got_grad, some micro-batch of this step handed
   * one in (cleared with the group's grads). */
  uint8_t no_grad, got_grad;
} eng_param;

/* A group's optimizer update, from its grads being final to its new params
 * being where the next fetch finds them. Transitions (group_set_state):
 *   IDLE ─queue─> QUEUED ─done─> UPDATED ─committed─> IDLE
 *   QUEUED ─failed─> FAILED ─retried by ferry_step─> QUEUED
 *   UPDATED ─commit failed─> FAILED
 * A group is fetched only in IDLE or FAILED (FAILED: fetch reports it). */
typedef enum {
  GROUP_IDLE = 0,    /* params current */
  GROUP_QUEUED = 1,  /* its update is queued or running */
  GROUP_UPDATED = 2, /* updated; the new params are not committed yet */
  GROUP_FAILED = 3,  /* the update failed (fail_status): before changing anything, or
                      * after its optimizer pass (eng_group.tail) */
  GROUP_STATE_COUNT
} group_state;

/* What an update that failed after its optimizer pass has left to do
 * (eng_group.tail): its optimizer state, its step counts and its staged new
 * params are the step's already, so its retry runs only the rest, in this
 * order, and never the optimizer again. */
typedef enum {
  GROUP_TAIL_NONE = 0, /* nothing pending (or the optimizer pass not run yet) */
  GROUP_TAIL_ZERO,     /* its grads to zero */
  GROUP_TAIL_GATHER,   /* the ranks' new params to all-gather */
  GROUP_TAIL_HOME      /* its new params to upload (device home) or commit */
} group_tail;

typedef struct {
  uint32_t first, count; /* (fixed) indices into by_group */
  size_t n;              /* (fixed) elements */
  int fetched;           /* (mu; the loop writes, group_fetched) holds on the device params */
  group_state state;     /* (mu) group_set_state */
  int fail_status;       /* (mu) the status of a FAILED update */
  group_tail tail;       /* (stepper) what a FAILED update left after its optimizer pass */
  /* NVMe grad home: the accumulator counts as zero (set at finalize and by
   * group_zero_grads instead of writing zeros; cleared by the drain's next
   * accumulation through group_grads_loaded, which fetches it without a
   * load). (the drain and the stepper or the loop: ordered by the group's
   * update state and drain_wait) */
  int grads_zero;
  /* (mu) a bf16 master's params the stepper has yet to stage, kept in the
   * host pool for it since ferry_grads_ready (marks.h) */
  int to_stage;
  /* The partition (fixed): rank r owns the group's elements [bounds[r],
   * bounds[r+1]) (nranks + 1 entries); this rank [lo, hi). One rank or
   * stage 0: lo = 0, hi = n. */
  size_t *bounds;
  size_t lo, hi;
} eng_group;

typedef struct {
  eng_param *params;  /* (fixed) in registration order */
  size_t nparams, capparams;
  uint32_t *by_group; /* (fixed) param indices sorted by (group, registration) */
  eng_group *groups;
  uint32_t ngroups;
  size_t max_group_n; /* (fixed) elements of the largest group */
  size_t max_count;   /* (fixed) params of the group with most */
} eng_groups;

int group_add_param(ferry_engine *e, const char *name, const int64_t *shape, int ndim, int group,
                    const float *values, ferry_init_fn init, void *init_user);
int group_build(ferry_engine *e);          /* finalize: order, offsets, buffers */
/* finalize (after group_build, with nranks, rank, zero_stage set): each
 * group's bounds, this rank's lo/hi and each param's plo/pn. The bounds
 * are r·n/N snapped down to a param-relative multiple of `align`
 * elements. */
int group_partition(ferry_engine *e, size_t align);
/* Rank r's share of param p: *off (param-relative) and the element count. */
size_t group_param_piece(const ferry_engine *e, const eng_param *p, int r, size_t *off);
/* finalize (e->ocfg set): each param's state_bytes, its tensors in the
 * manager */
int group_register(ferry_engine *e);
void group_check_chunks(ferry_engine *e);  /* finalize: no chunk holds two groups */
void group_free(eng_groups *gt);
/* The k-th param of group g. */
eng_param *group_param(ferry_engine *e, uint32_t g, uint32_t k);
eng_param *group_find(ferry_engine *e, const char *name);
/* Moves group g to `to` (mu held); aborts on a transition not in the chart. */
void group_set_state(ferry_engine *e, uint32_t g, group_state to);
/* QUEUED (or UPDATED) -> FAILED with the update's status (mu held). */
void group_set_failed(ferry_engine *e, uint32_t g, int status);
const char *group_state_name(group_state s);
/* A group whose update is queued, running or not committed yet. */
static inline int group_pending(const eng_group *gr) {
  return gr->state == GROUP_QUEUED || gr->state == GROUP_UPDATED;
}
/* The loop's holds on group g's device params: adds `delta` (+1 fetch, -1
 * release) and returns the new count (under mu: it takes it). */
int group_fetched(ferry_engine *e, uint32_t g, int delta);
const char *group_role_suffix(int role); /* "", ".grad", ".master", ... */
/* Zeroes group g's accumulated grads (held: the caller holds them in the
 * grads' work tier); a status with e->err set. grads "none": nothing; an
 * NVMe home: sets grads_zero (no write). Device math: zeroed in stream
 * order on e->down. */
int group_zero_grads(ferry_engine *e, uint32_t g, int held);
/* Group g's grads of one micro-batch are handed in: each of its params
 * not marked no_grad got a gradient in this step. */
void group_note_grads(ferry_engine *e, uint32_t g);
/* Whether param p is updated in this step: it got a gradient, or
 * optimizer.missing_grad = zero. */
int group_param_stepped(const ferry_engine *e, const eng_param *p);
/* NVMe grad home: whether group g's accumulators count as zero (the drain
 * then fetches them without a load), and that they are written now. */
int group_grads_fresh(const ferry_engine *e, uint32_t g);
void group_grads_loaded(ferry_engine *e, uint32_t g);
/* ferry_mem_fetch as the engine's threads call it: at the host pool's
 * minimum the drain's, the stepper's and the loop's working sets share it,
 * and room another thread holds comes free as that thread goes on, so on
 * FERRY_ENOMEM it waits for the manager to say room came free (a release,
 * a transfer done) and tries again, for about 10 s (others_busy, when
 * given: only while it says another thread may free room). */
#define GROUP_FETCH_WAIT 10.0 /* seconds a fetch waits for room */
int group_fetch(ferry_engine *e, uint32_t g, int family, ferry_tier tier, ferry_stream *s,
                unsigned flags, int (*others_busy)(ferry_engine *));
/* e->err gets "what: <the manager's message>"; returns rc. */
int engine_mem_err(ferry_engine *e, int rc, const char *what);

#endif
