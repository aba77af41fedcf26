/* offload/ranks.c — the engine's ranks (ZeRO data parallelism, comm/): the
 * communicator the caller hands in, the engine's three channels (the
 * loop's, the drain's, the stepper's) and their spans on the timeline, the
 * finalize-time fingerprint check that every rank has the same
 * configuration and registration, the refusals of what ranks do not
 * support yet, the global grad norm over the ranks and the collective read
 * of a sharded master, and ZeRO stage 3's gathers at fetch with their
 * read-ahead (its own state, e->ranks: ranks.h). The drain and the stepper
 * call their channels themselves. Uses stepper.c and group.c.
 */
#include "offload/engine_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ferry_engine_set_comm(ferry_engine *e, ferry_comm *c) {
  if (!e) return FERRY_EINVAL;
  if (e->finalized)
    return ferry_err(&e->err, FERRY_ESTATE, "set comm: call it before ferry_engine_finalize");
  if (c && ferry_comm_get_kind(c) == FERRY_COMM_NCCL)
    return ferry_err(&e->err, FERRY_ENOTSUP,
                     "set comm: an NCCL communicator: the engine's collectives run on host "
                     "buffers (grads after their D2H, params before their upload), which NCCL "
                     "does not serve; NCCL for the engine is not implemented yet (create the "
                     "communicator with kind FERRY_COMM_MPI)");
  e->comm = c;
  return FERRY_OK;
}

/* Each channel's collectives as spans on its own lane. */
static void span_loop(void *user, const char *name, double t0, double t1) {
  ferry_timeline_add(&((ferry_engine *)user)->tl, FERRY_LANE_COMM_LOOP, name, t0, t1);
}
static void span_drain(void *user, const char *name, double t0, double t1) {
  ferry_timeline_add(&((ferry_engine *)user)->tl, FERRY_LANE_COMM_DRAIN, name, t0, t1);
}
static void span_step(void *user, const char *name, double t0, double t1) {
  ferry_timeline_add(&((ferry_engine *)user)->tl, FERRY_LANE_COMM_STEP, name, t0, t1);
}

/* Keys whose values may differ between ranks (they name per-rank things or
 * only change what a rank reports): left out of the fingerprint.
 *   tiers.nvme.paths  each rank's own swap files
 *   timeline          each rank's own trace file
 *   log_level         what a rank logs
 * (The configuration has no device ordinal: a program picks each rank's GPU
 * when it creates the device, from ferry_comm_local_rank.) */
static int per_rank_key(const char *name) {
  return !strcmp(name, "tiers.nvme.paths") || !strcmp(name, "timeline") ||
         !strcmp(name, "log_level");
}

static uint64_t fnv(uint64_t h, const void *data, size_t len) {
  const unsigned char *b = data;
  for (size_t i = 0; i < len; i++)
    h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}
#define FNV0       0xcbf29ce484222325ull
#define VALUE_TEXT 200 /* bytes of a key's value shown in a mismatch */

/* The registration's fingerprint: names, shapes and groups in order. */
static uint64_t registration_hash(const ferry_engine *e) {
  uint64_t h = FNV0;
  for (size_t i = 0; i < e->gt.nparams; i++) {
    const eng_param *p = &e->gt.params[i];
    h = fnv(h, p->name, strlen(p->name) + 1);
    h = fnv(h, &p->ndim, sizeof p->ndim);
    h = fnv(h, p->shape, (size_t)p->ndim * sizeof p->shape[0]);
    h = fnv(h, &p->group, sizeof p->group);
  }
  return h;
}

/* The value of key i as text ("" when per-rank). */
static void key_value(const ferry_engine *e, int i, const char **name, char *buf, size_t len) {
  const char *type, *def, *desc;
  ferry_config_key_info(i, name, &type, &def, &desc);
  buf[0] = 0;
  if (!per_rank_key(*name) && ferry_config_get(e->cfg, *name, buf, len)) buf[0] = 0;
}

/* Every rank's fingerprint (one hash per key, the registration's, the
 * number of params) gathered on the loop channel; on a difference from
 * rank 0, FERRY_ECONFIG on every rank naming the first key that differs
 * and both values (a second gather of that key's text). */
static int check_fingerprints(ferry_engine *e) {
  int nk = ferry_config_key_count(), nr = e->nranks;
  size_t per = (size_t)nk + 2;
  uint64_t *all = calloc(per * (size_t)nr, sizeof *all);
  size_t *counts = calloc((size_t)nr, sizeof *counts);
  char *texts = calloc((size_t)nr, VALUE_TEXT);
  if (!all || !counts || !texts) {
    free(all);
    free(counts);
    free(texts);
    return ferry_err(&e->err, FERRY_ENOMEM, "finalize: out of memory");
  }
  uint64_t *mine = all + per * (size_t)e->rank;
  char buf[VALUE_TEXT];
  const char *name;
  for (int i = 0; i < nk; i++) {
    key_value(e, i, &name, buf, sizeof buf);
    mine[i] = per_rank_key(name) ? 0 : fnv(fnv(FNV0, name, strlen(name) + 1), buf, strlen(buf));
  }
  mine[nk] = registration_hash(e);
  mine[nk + 1] = e->gt.nparams;
  for (int r = 0; r < nr; r++)
    counts[r] = per;
  int rc = ferry_comm_allgather(e->ch_loop, mine, all, counts, FERRY_DT_U64, NULL, NULL);
  if (rc) {
    rc = ferry_err(&e->err, rc, "finalize: dist: gathering the ranks' configurations: %s",
                   ferry_comm_last_error(e->ch_loop));
    goto out;
  }
  size_t key = per;
  int other = -1;
  for (size_t i = 0; i < per && other < 0; i++)
    for (int r = 1; r < nr && other < 0; r++)
      if (all[per * (size_t)r + i] != all[i]) key = i, other = r;
  if (other < 0) goto out;
  if (key >= (size_t)nk) {
    rc = ferry_err(&e->err, FERRY_ECONFIG,
                   "finalize: dist: ranks disagree on the registered parameters (names, shapes "
                   "and groups, in order): rank 0 registered %llu, rank %d %llu%s; every rank "
                   "must register the same model",
                   (unsigned long long)all[nk + 1], other,
                   (unsigned long long)all[per * (size_t)other + (size_t)nk + 1],
                   all[nk + 1] == all[per * (size_t)other + (size_t)nk + 1] ? " that differ" : "");
    goto out;
  }
  key_value(e, (int)key, &name, texts + (size_t)e->rank * VALUE_TEXT, VALUE_TEXT);
  for (int r = 0; r < nr; r++)
    counts[r] = VALUE_TEXT;
  rc = ferry_comm_allgather(e->ch_loop, texts + (size_t)e->rank * VALUE_TEXT, texts, counts,
                            FERRY_DT_U8, NULL, NULL);
  if (rc) {
    rc = ferry_err(&e->err, rc,
                   "finalize: dist: ranks disagree on %s (and gathering its values "
                   "failed: %s)",
                   name, ferry_comm_last_error(e->ch_loop));
    goto out;
  }
  texts[VALUE_TEXT - 1] = texts[(size_t)other * VALUE_TEXT + VALUE_TEXT - 1] = 0;
  rc = ferry_err(&e->err, FERRY_ECONFIG,
                 "finalize: dist: ranks disagree on %s: rank 0 has %s, rank %d has %s (every "
                 "rank must use the same configuration)",
                 name, texts, other, texts + (size_t)other * VALUE_TEXT);
out:
  free(all);
  free(counts);
  free(texts);
  return rc;
}

/* What ranks do not support yet (decided by the configuration, the same
 * on every rank once the fingerprints agree). */
static int refuse_unsupported(ferry_engine *e) {
  if (e->zero_stage == 3 && e->param_home == FERRY_TIER_DEVICE)
    return ferry_err(&e->err, FERRY_ECONFIG,
                     "finalize: dist.zero_stage = 3 with placement.params = \"gpu\" is not "
                     "implemented yet (the sharded params live in the host or on NVMe and are "
                     "gathered at fetch): set placement.params = \"host\" or \"nvme\", or "
                     "dist.zero_stage = 2");
  if (e->zero_stage == 3 && e->master_bf16)
    return ferry_err(&e->err, FERRY_ECONFIG,
                     "finalize: dist.zero_stage = 3 with precision.master = \"bf16\" is not "
                     "implemented yet: set precision.master = \"fp32\" or dist.zero_stage = 2");
  if (e->grads_none)
    return ferry_err(&e->err, FERRY_ECONFIG,
                     "finalize: placement.grads = \"none\" with %d ranks: the grads are averaged "
                     "over the ranks into accumulators; set placement.grads = \"host\", \"nvme\" "
                     "or \"auto\"",
                     e->nranks);
  if (engine_gpu_math(e))
    return ferry_err(&e->err, FERRY_ECONFIG,
                     "finalize: placement.optimizer = \"gpu\" on a GPU with %d ranks is not "
                     "implemented yet (the engine's collectives run on host buffers): set "
                     "placement.optimizer = \"host\" or \"nvme\"",
                     e->nranks);
  return FERRY_OK;
}

int ranks_setup(ferry_engine *e) {
  e->nranks = 1;
  e->rank = 0;
  e->zero_stage = 0;
  if (!e->comm || ferry_comm_size(e->comm) <= 1) return FERRY_OK;
  e->nranks = ferry_comm_size(e->comm);
  e->rank = ferry_comm_rank(e->comm);
  e->zero_stage = (int)e->cv->zero_stage;
  /* the same order on every rank */
  ferry_comm **ch[3] = {&e->ch_loop, &e->ch_drain, &e->ch_step};
  ferry_comm_span_fn fn[3] = {span_loop, span_drain, span_step};
  for (int i = 0; i < 3; i++) {
    int rc = ferry_comm_dup(e->comm, ch[i]);
    if (rc)
      return ferry_err(&e->err, rc, "finalize: dist: a channel of the communicator: %s",
                       ferry_comm_last_error(e->comm));
  }
  int rc = check_fingerprints(e);
  if (rc) return rc;
  /* only now: a hook runs after its collective's waiter may go on, and
   * finalize's reset of the timeline must not meet a late span */
  for (int i = 0; i < 3; i++)
    ferry_comm_set_span_hook(*ch[i], fn[i], e);
  /* "auto" grads would be "none" (no accumulator) when the step runs during
   * backward; the ranks' average needs accumulators: the optimizer's home */
  if (e->grads_none && e->cv->place_grads == FERRY_GRADS_AUTO) {
    e->grads_none = 0;
    e->grad_home = e->optim_home;
    e->grad_dtype = e->cv->prec_grads;
    ferry_logf(&e->log, FERRY_LOG_INFO,
               "engine: placement.grads = \"%s\" (auto, with %d ranks: accumulators)",
               ferry_tier_name(e->grad_home), e->nranks);
  }
  rc = refuse_unsupported(e);
  if (rc) return rc;
  ferry_logf(&e->log, FERRY_LOG_INFO, "engine: rank %d of %d, dist.zero_stage = %d", e->rank,
             e->nranks, e->zero_stage);
  return FERRY_OK;
}

void ranks_free(ferry_engine *e) {
  if (!e->ch_loop) return; /* alone */
  ferry_comm_destroy(e->ch_step);
  ferry_comm_destroy(e->ch_drain);
  ferry_comm_destroy(e->ch_loop);
  e->ch_step = e->ch_drain = e->ch_loop = NULL;
}

int ranks_global_norm(ferry_engine *e, double *sumsq, int *nonfinite) {
  if (!engine_sharded(e)) return FERRY_OK; /* every rank has the whole norm */
  double *v = calloc(2 * (size_t)e->nranks, sizeof *v);
  size_t *counts = calloc((size_t)e->nranks, sizeof *counts);
  int rc = v && counts ? FERRY_OK : FERRY_ENOMEM;
  if (!rc) {
    v[2 * e->rank] = *sumsq;
    v[2 * e->rank + 1] = *nonfinite ? 1 : 0;
    for (int r = 0; r < e->nranks; r++)
      counts[r] = 2;
    rc = ferry_comm_allgather(e->ch_loop, v + 2 * e->rank, v, counts, FERRY_DT_F64, NULL, NULL);
    if (rc)
      rc = ferry_err(&e->err, rc, "step: the grad norm over the ranks: %s",
                     ferry_comm_last_error(e->ch_loop));
  } else {
    rc = ferry_err(&e->err, rc, "step: out of memory");
  }
  if (!rc) { /* in rank order: the same sum on every rank */
    *sumsq = 0;
    *nonfinite = 0;
    for (int r = 0; r < e->nranks; r++) {
      *sumsq += v[2 * r];
      *nonfinite |= v[2 * r + 1] != 0;
    }
  }
  free(v);
  free(counts);
  return rc;
}

int ranks_read_param(ferry_engine *e, const eng_param *p, const float *piece, float *dst) {
  size_t *counts = calloc((size_t)e->nranks, sizeof *counts);
  if (!counts) return ferry_err(&e->err, FERRY_ENOMEM, "param read: out of memory");
  size_t off;
  for (int r = 0; r < e->nranks; r++)
    counts[r] = group_param_piece(e, p, r, &off);
  int rc = ferry_comm_allgather(e->ch_loop, p->pn ? piece : dst + p->plo, dst, counts, FERRY_DT_F32,
                                NULL, NULL);
  free(counts);
  if (rc)
    return ferry_err(&e->err, rc, "param read '%s': gathering its pieces: %s", p->name,
                     ferry_comm_last_error(e->ch_loop));
  return FERRY_OK;
}

void ranks_stats(const ferry_engine *e, ferry_stats *out) {
  out->comm_ops = out->comm_bytes = 0;
  out->comm_seconds = out->comm_wait_seconds = 0;
  const ferry_comm *ch[3] = {e->ch_loop, e->ch_drain, e->ch_step};
  for (int i = 0; i < 3; i++) {
    ferry_comm_stats cs;
    if (!ch[i] || ferry_comm_get_stats(ch[i], &cs)) continue;
    out->comm_ops += cs.ops;
    out->comm_bytes += cs.bytes;
    out->comm_seconds += cs.seconds;
    out->comm_wait_seconds += cs.wait_seconds;
  }
}

int ranks_agree(ferry_engine *e, int rc, const char *op) {
  if (e->nranks <= 1) return rc;
  int32_t *all = calloc((size_t)e->nranks, sizeof *all);
  size_t *counts = calloc((size_t)e->nranks, sizeof *counts);
  if (!all || !counts) {
    free(all);
    free(counts);
    return ferry_err(&e->err, FERRY_ENOMEM, "%s: out of memory", op);
  }
  all[e->rank] = rc;
  for (int r = 0; r < e->nranks; r++)
    counts[r] = 1;
  int crc = ferry_comm_allgather(e->ch_loop, all + e->rank, all, counts, FERRY_DT_I32, NULL, NULL);
  int other = -1;
  for (int r = 0; r < e->nranks && other < 0 && !crc; r++)
    if (all[r] && r != e->rank) other = r;
  int orc = other >= 0 ? all[other] : 0;
  free(all);
  free(counts);
  if (crc)
    return ferry_err(&e->err, crc, "%s: the ranks' statuses: %s", op,
                     ferry_comm_last_error(e->ch_loop));
  if (rc) return rc;
  if (other >= 0)
    return ferry_err(&e->err, orc, "%s: rank %d failed (%s); see its error", op, other,
                     ferry_strerror(orc));
  return FERRY_OK;
}

int ranks_root_status(ferry_engine *e, int rc, const char *op) {
  if (e->nranks <= 1) return rc;
  int32_t v = rc;
  int crc = ferry_comm_broadcast(e->ch_loop, &v, 1, FERRY_DT_I32, 0, NULL, NULL);
  if (crc)
    return ferry_err(&e->err, crc, "%s: rank 0's status: %s", op,
                     ferry_comm_last_error(e->ch_loop));
  if (e->rank == 0 || !v) return rc ? rc : v;
  return ferry_err(&e->err, v, "%s: rank 0 failed (%s); see its error", op, ferry_strerror(v));
}

/* ---- ZeRO stage 3: the params gathered at fetch ------------------------- */

void ranks_init(ferry_engine *e) {
  e->ranks.ahead_group = e->ranks.ahead_slot = -1;
  for (int i = 0; i < ENGINE_GATHER_SLOTS; i++)
    e->ranks.gather_owner[i] = -1;
}

int ranks_gather_init(ferry_engine *e, size_t gbytes) {
  eng_ranks *rk = &e->ranks;
  rk->ngather = 0;
  ranks_init(e);
  rk->gslot = malloc(e->gt.ngroups * sizeof *rk->gslot);
  if (!rk->gslot) return ferry_err(&e->err, FERRY_ENOMEM, "finalize: out of memory");
  for (uint32_t g = 0; g < e->gt.ngroups; g++)
    rk->gslot[g] = -1;
  if (!engine_params_sharded(e)) return FERRY_OK;
  e->ranks.ngather = e->gt.ngroups < ENGINE_GATHER_SLOTS ? (int)e->gt.ngroups : ENGINE_GATHER_SLOTS;
  e->ranks.gather_counts = calloc((size_t)e->nranks, sizeof *e->ranks.gather_counts);
  int rc = e->ranks.gather_counts ? FERRY_OK : FERRY_ENOMEM;
  for (int i = 0; i < e->ranks.ngather && !rc; i++) {
    rc = ferry_device_alloc(e->dev, gbytes, &e->ranks.gather_dev[i]);
    if (!rc) rc = ferry_event_create(e->dev, &e->ranks.gather_free[i]);
  }
  for (int i = 0; i < 2 && !rc; i++) {
    rc = ferry_host_alloc(e->dev, gbytes, &e->ranks.gather_host[i]);
    if (!rc) rc = ferry_event_create(e->dev, &e->ranks.gather_up[i]);
  }
  if (rc)
    return ferry_err(&e->err, rc, "finalize: the gather buffers of dist.zero_stage = 3: %s",
                     rc == FERRY_ENOMEM && !e->ranks.gather_counts ? "out of memory"
                                                             : ferry_device_last_error(e->dev));
  return FERRY_OK;
}

void ranks_gather_free(ferry_engine *e) {
  if (e->dev) {
    for (int i = 0; i < ENGINE_GATHER_SLOTS; i++) {
      if (e->ranks.gather_dev[i]) ferry_device_free(e->dev, e->ranks.gather_dev[i]);
      ferry_event_destroy(e->ranks.gather_free[i]);
    }
    for (int i = 0; i < 2; i++) {
      if (e->ranks.gather_host[i]) ferry_host_free(e->dev, e->ranks.gather_host[i]);
      ferry_event_destroy(e->ranks.gather_up[i]);
    }
  }
  free(e->ranks.gather_counts);
  free(e->ranks.gslot);
}

void *ranks_params_dev(const ferry_engine *e, uint32_t g) {
  return e->ranks.gather_dev[e->ranks.gslot[g]];
}

/* This rank's pieces of group g's params (the home, through the host) into
 * their range of host buffer buf. */
static int own_pieces(ferry_engine *e, uint32_t g, char *buf) {
  eng_group *gr = &e->gt.groups[g];
  int rc = group_fetch(e, g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL, FERRY_MEM_NOTRACE, NULL);
  if (rc) return engine_mem_err(e, rc, "fetch: params");
  for (uint32_t k = 0; k < gr->count && !rc; k++) {
    eng_param *p = group_param(e, g, k);
    void *h;
    if (!p->pn) continue;
    rc = ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_PARAM], FERRY_TIER_HOST, &h);
    if (!rc) memcpy(buf + (p->goff + p->plo) * e->esize, h, p->pn * e->esize);
  }
  int r2 = ferry_mem_release(e->mem, g, FERRY_FAMILY_PARAMS, FERRY_TIER_HOST, NULL);
  if (!rc) rc = r2;
  return rc ? engine_mem_err(e, rc, "fetch: params") : FERRY_OK;
}

static int free_slot(const ferry_engine *e) {
  for (int i = 0; i < e->ranks.ngather; i++)
    if (e->ranks.gather_owner[i] < 0) return i;
  return -1;
}

/* Starts the gather of group g into slot `slot` (reserved for it) through
 * the next host buffer: this rank's pieces, then the all-gather on the
 * loop channel (req NULL: waits). */
static int gather_start(ferry_engine *e, uint32_t g, int slot, int *hb, ferry_comm_req **req) {
  eng_group *gr = &e->gt.groups[g];
  int b = e->ranks.gather_turn;
  e->ranks.gather_turn ^= 1;
  int rc = ferry_event_synchronize(e->ranks.gather_up[b]); /* the buffer's last H2D is done */
  if (rc) return ferry_err(&e->err, rc, "fetch: %s", ferry_device_last_error(e->dev));
  char *buf = e->ranks.gather_host[b];
  rc = own_pieces(e, g, buf);
  if (rc) return rc;
  for (int r = 0; r < e->nranks; r++)
    e->ranks.gather_counts[r] = (gr->bounds[r + 1] - gr->bounds[r]) * e->esize;
  rc = ferry_comm_allgather(e->ch_loop, buf + gr->lo * e->esize, buf, e->ranks.gather_counts, FERRY_DT_U8,
                            NULL, req);
  if (rc)
    return ferry_err(&e->err, rc, "fetch: group %u: all-gather of its params: %s", g,
                     ferry_comm_last_error(e->ch_loop));
  e->ranks.gather_owner[slot] = (int)g;
  *hb = b;
  return FERRY_OK;
}

/* The gathered params of group g (host buffer hb) H2D into its slot on s,
 * after the slot's last readers and before the loop's kernels. */
static int gather_finish(ferry_engine *e, uint32_t g, int slot, int hb, ferry_stream *s) {
  eng_group *gr = &e->gt.groups[g];
  int rc = ferry_stream_wait_event(s, e->ranks.gather_free[slot]);
  if (!rc)
    rc = ferry_memcpy_async(s, e->ranks.gather_dev[slot], e->ranks.gather_host[hb], gr->n * e->esize,
                            FERRY_COPY_H2D);
  if (!rc) rc = ferry_event_record(e->ranks.gather_up[hb], s);
  if (rc) return ferry_err(&e->err, rc, "fetch: %s", ferry_device_last_error(e->dev));
  e->ranks.gslot[g] = slot;
  return FERRY_OK;
}

/* Waits for the read-ahead's gather; its status. */
static int ahead_wait(ferry_engine *e) {
  int rc = ferry_comm_wait(e->ch_loop, e->ranks.ahead_req);
  e->ranks.ahead_req = NULL;
  if (rc)
    return ferry_err(&e->err, rc, "fetch: group %d: all-gather of its params: %s", e->ranks.ahead_group,
                     ferry_comm_last_error(e->ch_loop));
  return FERRY_OK;
}

int ranks_fetch_params(ferry_engine *e, uint32_t g, ferry_stream *s) {
  if (e->ranks.gslot[g] >= 0) return FERRY_OK; /* fetched already: the same buffer */
  if (e->ranks.ahead_group == (int)g) { /* read ahead: its gather is on its way */
    int slot = e->ranks.ahead_slot, hb = e->ranks.ahead_host;
    int rc = ahead_wait(e);
    e->ranks.ahead_group = e->ranks.ahead_slot = -1;
    if (!rc) rc = gather_finish(e, g, slot, hb, s);
    if (rc) e->ranks.gather_owner[slot] = -1;
    return rc;
  }
  int slot = free_slot(e), hb;
  if (slot < 0)
    return ferry_err(&e->err, FERRY_ENOMEM,
                     "fetch: group %u: dist.zero_stage = 3 gathers a fetched group's params into "
                     "one of %d device buffers, and every one holds a fetched group%s; release a "
                     "group before fetching another",
                     g, e->ranks.ngather, e->ranks.ahead_group >= 0 ? " or the next one's read-ahead" : "");
  int rc = gather_start(e, g, slot, &hb, NULL);
  if (!rc) rc = gather_finish(e, g, slot, hb, s);
  if (rc) e->ranks.gather_owner[slot] = -1;
  return rc;
}

void ranks_read_ahead(ferry_engine *e) {
  if (e->tracing || e->ranks.ahead_group >= 0 || e->fetches >= e->ntrace) return;
  uint32_t g = e->trace[e->fetches]; /* the loop's next fetch, if it follows the trace */
  int slot = free_slot(e);
  if (e->ranks.gslot[g] >= 0 || slot < 0) return;
  /* its update of the last step is committed (waiting decides the same on
   * every rank; skipping a pending one would not) */
  if (stepper_wait_group(e, g)) return;
  int hb;
  ferry_comm_req *req = NULL;
  if (gather_start(e, g, slot, &hb, &req)) {
    e->ranks.gather_owner[slot] = -1;
    return; /* the fetch of g gathers it, and reports */
  }
  e->ranks.ahead_group = (int)g;
  e->ranks.ahead_slot = slot;
  e->ranks.ahead_host = hb;
  e->ranks.ahead_req = req;
}

int ranks_drop_ahead(ferry_engine *e) {
  if (e->ranks.ahead_group < 0) return FERRY_OK;
  int rc = ahead_wait(e);
  e->ranks.gather_owner[e->ranks.ahead_slot] = -1;
  e->ranks.ahead_group = e->ranks.ahead_slot = -1;
  return rc;
}

int ranks_release_params(ferry_engine *e, uint32_t g, ferry_stream *s) {
  eng_group *gr = &e->gt.groups[g];
  int rc = ferry_event_record(e->ranks.gather_free[e->ranks.gslot[g]], s);
  if (rc) return ferry_err(&e->err, rc, "release: %s", ferry_device_last_error(e->dev));
  pthread_mutex_lock(&e->mu);
  int last = gr->fetched == 1;
  pthread_mutex_unlock(&e->mu);
  if (last) {
    e->ranks.gather_owner[e->ranks.gslot[g]] = -1;
    e->ranks.gslot[g] = -1;
  }
  return FERRY_OK;
}
