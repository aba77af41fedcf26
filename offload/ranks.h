/* offload/ranks.h — the ranks room's state and calls (ranks.c): ZeRO
 * stage 3's gather buffers and its read-ahead along the trace, and the
 * collectives of the loop channel (fingerprints, the global norm, status
 * agreement, sharded reads). Included through offload/engine_impl.h
 * (e->ranks). It uses the stepper and group rooms; the step driver, the
 * engine and checkpoints call it. The communicator, its channels and the
 * rank figures are the engine's own (fixed) fields, which ranks_setup sets.
 */
#ifndef FERRY_OFFLOAD_RANKS_H
#define FERRY_OFFLOAD_RANKS_H

#include "memory/memory.h"

/* ZeRO stage 3 (loop; fixed pointers): the params of a fetched group are
 * gathered from every rank's piece through a pinned host buffer into a
 * device buffer (ngather of them, the largest group each). */
typedef struct {
  int ngather;
  void *gather_dev[ENGINE_GATHER_SLOTS];
  ferry_event *gather_free[ENGINE_GATHER_SLOTS]; /* the loop's last use (its release) */
  int gather_owner[ENGINE_GATHER_SLOTS];         /* group, -1 free */
  void *gather_host[2];      /* pinned, used in turn: one may hold a read-ahead */
  ferry_event *gather_up[2]; /* each one's last H2D done */
  int gather_turn;           /* the host buffer the next gather uses */
  size_t *gather_counts;
  int *gslot;                /* per group: the gather buffer holding its params, -1 none */
  /* the read-ahead along the trace: the gather of the next group (-1
   * none), started by a fetch, into gather slot ahead_slot through host
   * buffer ahead_host; the fetch of that group waits for it */
  int ahead_group, ahead_slot, ahead_host;
  ferry_comm_req *ahead_req;
} eng_ranks;

/* create: nothing gathered, nothing read ahead. */
void ranks_init(ferry_engine *e);
/* finalize, after group_build: with a communicator of more than one rank,
 * nranks, rank and zero_stage, the three channels (dup'ed in order: loop,
 * drain, stepper; spans onto the comm lanes), the fingerprint check (a
 * collective: every rank fails alike on a mismatch, naming the key) and
 * the refusals. Alone: nranks 1, rank 0, stage 0. */
int ranks_setup(ferry_engine *e);
void ranks_free(ferry_engine *e); /* destroy, after the threads stopped */
/* The step: this rank's (sumsq, nonfinite) summed with every rank's, in
 * rank order, on the loop channel (stages 1 and 2; else as it is). */
int ranks_global_norm(ferry_engine *e, double *sumsq, int *nonfinite);
/* ferry_param_read of a sharded master: every rank's piece of p (this
 * rank's is `piece`, pn floats) gathered into dst (p->n floats). */
int ranks_read_param(ferry_engine *e, const eng_param *p, const float *piece, float *dst);
void ranks_stats(const ferry_engine *e, ferry_stats *out); /* the comm_* figures */
/* Stage 3: the gather buffers (finalize: ngather device buffers of `gbytes`
 * and the pinned host one; their sizes are in engine_own_bytes) and their
 * release. */
int ranks_gather_init(ferry_engine *e, size_t gbytes);
void ranks_gather_free(ferry_engine *e);
/* Stage 3, the loop's fetch of group g on s: this rank's pieces (held in
 * the host tier) and every other rank's gathered into a free device
 * buffer (a collective on the loop channel), H2D on s. */
int ranks_fetch_params(ferry_engine *e, uint32_t g, ferry_stream *s);
/* Stage 3: the device params of fetched group g (its gather buffer). */
void *ranks_params_dev(const ferry_engine *e, uint32_t g);
/* Stage 3, the loop's release of group g on s (the last one frees its
 * buffer once s is past it). */
int ranks_release_params(ferry_engine *e, uint32_t g, ferry_stream *s);
/* Stage 3, after a fetch: starts the gather of the group the trace
 * expects next (within the iteration, into a free buffer, once its update
 * is committed), so it overlaps the loop's compute. The same decision on
 * every rank: it depends only on the loop's calls and the trace. */
void ranks_read_ahead(ferry_engine *e);
/* Stage 3: waits for a read-ahead the loop did not fetch and frees its
 * buffer (ferry_step, quiesce, destroy: the step changes those params). */
int ranks_drop_ahead(ferry_engine *e);
/* With ranks (a collective on the loop channel): every rank's status rc
 * gathered; this rank's when it failed, else the first other rank's
 * failure (named in e->err), else 0. Alone: rc. */
int ranks_agree(ferry_engine *e, int rc, const char *op);
/* With ranks: rank 0's status rc to every rank (the others' e->err names
 * it when it failed); alone: rc. */
int ranks_root_status(ferry_engine *e, int rc, const char *op);

#endif
