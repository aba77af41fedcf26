/* offload/engine_walk.h — the engine as its checkpoints see it, and all
 * they see of it: its layout and handles (engine_walk_facts), a walk over
 * its params (registration or group order) with each rank's share of one,
 * and the calls that hold it still around a checkpoint (engine_quiesce,
 * engine_progress_get, engine_restore) and make its ranks agree
 * (ranks_agree, ranks_root_status). engine_walk.c is the one place that
 * reads the engine's fields for them; checkpoint_*.c include this header,
 * never engine_impl.h, and the engine never calls them back.
 */
#ifndef FERRY_ENGINE_WALK_H
#define FERRY_ENGINE_WALK_H

#include "memory/memory.h"

/* What a finalized engine is, and its handles, as a checkpoint reads it. */
typedef struct {
  /* the layout */
  ferry_dtype dtype;           /* of the params */
  size_t esize;                /* bytes per param element */
  int nstates;                 /* optimizer states per element (0, 1, 2) */
  int master_bf16;             /* no master tensor: the bf16 params are the master */
  ferry_optim_type opt_type;   /* optimizer.type */
  ferry_optimizer_config ocfg; /* the optimizer's configuration (state_dtype, state_block) */
  int dynamic_scale;           /* the loss scale is dynamic (a checkpoint carries it) */
  ferry_tier param_home, optim_home;
  size_t nparams; /* params registered */

  /* the ranks (alone: 1 rank, rank 0, stage 0) */
  int nranks, rank, zero_stage;
  int sharded;        /* master and states are pieces (ZeRO >= 1 with ranks) */
  int params_sharded; /* the params too (stage 3 with ranks) */

  /* the handles */
  ferry_mem *mem; /* the memory manager holding every tensor (thread-safe) */
  ferry_device *dev;
  ferry_comm *ch;    /* the loop's channel to the other ranks (NULL alone) */
  ferry_errbuf *err; /* where a failure's message goes */
  const ferry_logger *log;
} engine_facts;

void engine_walk_facts(ferry_engine *e, engine_facts *out);

/* One param as a checkpoint sees it (its fields live as long as the engine). */
typedef struct {
  size_t index; /* in registration order */
  const char *name;
  int ndim;
  const int64_t *shape;
  size_t n;           /* elements */
  size_t plo, pn;     /* this rank's piece: elements [plo, plo + pn) (alone: 0, n) */
  const uint32_t *id; /* the manager's tensor of each role (UINT32_MAX: none) */
  int64_t steps;      /* its own optimizer step count (<= the engine's) */
} engine_param_view;

/* A walk over the params: by_group 1 in group order (by group, then
 * registration: the order of the groups' tensors), 0 in registration
 * order:
 *   engine_param_iter it = engine_params(e, 1);
 *   for (const engine_param_view *p; (p = engine_params_next(&it));) ...
 * engine_params_next returns NULL at the end. */
typedef struct {
  ferry_engine *e;
  size_t next;
  int by_group;
  engine_param_view cur;
} engine_param_iter;
engine_param_iter engine_params(ferry_engine *e, int by_group);
const engine_param_view *engine_params_next(engine_param_iter *it);
/* The param of registration index i (< nparams). */
void engine_param_at(ferry_engine *e, size_t i, engine_param_view *out);
/* Sets param i's own step count (after engine_restore, from a checkpoint). */
void engine_param_set_steps(ferry_engine *e, size_t i, int64_t steps);
/* The registration index of the param called name: hint first (its index
 * when a checkpoint was saved), else a lookup. 0, or -1: no such param. */
int engine_param_index(ferry_engine *e, const char *name, size_t hint, size_t *index);
/* Rank r's share of p: its element count and *off (param-relative). */
size_t engine_param_piece(ferry_engine *e, const engine_param_view *p, int r, size_t *off);
/* The suffix of role r's tensor name after the param's ("", ".master", ...). */
const char *engine_role_suffix(int role);

/* loop.c */
/* Waits until the loop is between steps (no step, no drain, no micro-batch
 * half handed in, no group fetched, uploads done); `op` names the caller in
 * errors. */
int engine_quiesce(ferry_engine *e, const char *op);
/* The step counter and loss scale a checkpoint saves and loads back. */
typedef struct {
  int64_t steps;
  float scale;
  int good_steps;
  int64_t skipped;
} engine_progress;
void engine_progress_get(const ferry_engine *e, engine_progress *out);
/* Sets them (after a quiesce, from a checkpoint): the next update uses
 * step p->steps for its bias correction, and so does every param's own
 * count until engine_param_set_steps says otherwise. */
void engine_restore(ferry_engine *e, const engine_progress *p);

/* ranks.c */
/* With ranks (a collective on the loop channel): every rank's status rc
 * gathered; this rank's when it failed, else the first other rank's
 * failure (named in e->err), else 0. Alone: rc. */
int ranks_agree(ferry_engine *e, int rc, const char *op);
/* With ranks: rank 0's status rc to every rank (the others' e->err names
 * it when it failed); alone: rc. */
int ranks_root_status(ferry_engine *e, int rc, const char *op);

#endif
