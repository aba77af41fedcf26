/* offload/group.c — the group table: the parameters the loop registers,
 * their groups (iteration order, element offsets), each parameter's tensors
 * in the memory manager (one per role the optimizer has), and each group's
 * update state with its checked transitions. The lowest room of the engine:
 * it calls no other engine file and uses no other room's names.
 */
#include "offload/engine_impl.h"

#include "core/part.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const role_suffix[FERRY_ROLE_COUNT] = {"", ".grad", ".master", ".exp_avg",
                                                          ".exp_avg_sq"};

int engine_mem_err(ferry_engine *e, int rc, const char *what) {
  char prefix[128];
  snprintf(prefix, sizeof prefix, "%s: ", what);
  return ferry_err_chain(&e->err, rc, prefix, ferry_mem_last_error(e->mem)); /* no "layout: layout:" */
}

int group_add_param(ferry_engine *e, const char *name, const int64_t *shape, int ndim, int group,
                    const float *values, ferry_init_fn init, void *init_user) {
  eng_groups *gt = &e->gt;
  if (!name || !*name || strlen(name) > FERRY_MEM_NAME_MAX - 12)
    return ferry_err(&e->err, FERRY_EINVAL, "param register: name is empty or longer than %d",
                     FERRY_MEM_NAME_MAX - 12);
  if (ndim < 1 || ndim > FERRY_MEM_MAX_DIMS || !shape)
    return ferry_err(&e->err, FERRY_EINVAL, "param register '%s': ndim %d (1..%d)", name, ndim,
                     FERRY_MEM_MAX_DIMS);
  if (group < 0 || (uint32_t)group >= FERRY_MEM_MAX_GROUPS)
    return ferry_err(&e->err, FERRY_EINVAL, "param register '%s': group %d out of range", name,
                     group);
  size_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] <= 0 || (uint64_t)shape[i] > (SIZE_MAX >> 4) / n)
      return ferry_err(&e->err, FERRY_EINVAL, "param register '%s': dimension %d is %lld", name,
                       i, (long long)shape[i]);
    n *= (size_t)shape[i];
  }
  for (size_t i = 0; i < gt->nparams; i++)
    if (!strcmp(gt->params[i].name, name))
      return ferry_err(&e->err, FERRY_EINVAL, "param register: '%s' is registered twice", name);
  if (gt->nparams == gt->capparams) {
    size_t nc = gt->capparams ? 2 * gt->capparams : 64;
    eng_param *np = realloc(gt->params, nc * sizeof *np);
    if (!np) return ferry_err(&e->err, FERRY_ENOMEM, "param register: out of memory");
    gt->params = np;
    gt->capparams = nc;
  }
  eng_param *p = &gt->params[gt->nparams];
  memset(p, 0, sizeof *p);
  p->name = strdup(name);
  if (!p->name) return ferry_err(&e->err, FERRY_ENOMEM, "param register: out of memory");
  memcpy(p->shape, shape, (size_t)ndim * sizeof *shape);
  p->ndim = ndim;
  p->n = n;
  p->group = (uint32_t)group;
  p->values = values;
  p->init = init;
  p->init_user = init_user;
  for (int r = 0; r < FERRY_ROLE_COUNT; r++) p->id[r] = UINT32_MAX;
  gt->nparams++;
  return FERRY_OK;
}

static int cmp_group(const void *a, const void *b, void *ctx) {
  const eng_param *p = ctx;
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  if (p[x].group != p[y].group) return p[x].group < p[y].group ? -1 : 1;
  return x < y ? -1 : x > y;
}

int group_build(ferry_engine *e) {
  eng_groups *gt = &e->gt;
  gt->by_group = malloc(gt->nparams * sizeof *gt->by_group);
  if (!gt->by_group) return ferry_err(&e->err, FERRY_ENOMEM, "finalize: out of memory");
  uint32_t maxg = 0;
  for (size_t i = 0; i < gt->nparams; i++) {
    gt->by_group[i] = (uint32_t)i;
    if (gt->params[i].group > maxg) maxg = gt->params[i].group;
  }
  qsort_r(gt->by_group, gt->nparams, sizeof *gt->by_group, cmp_group, gt->params);
  gt->ngroups = maxg + 1;
  gt->groups = calloc(gt->ngroups, sizeof *gt->groups);
  if (!gt->groups) return ferry_err(&e->err, FERRY_ENOMEM, "finalize: out of memory");
  for (size_t i = 0; i < gt->nparams;) {
    uint32_t g = gt->params[gt->by_group[i]].group;
    eng_group *gr = &gt->groups[g];
    gr->first = (uint32_t)i;
    while (i < gt->nparams && gt->params[gt->by_group[i]].group == g) {
      gt->params[gt->by_group[i]].goff = gr->n;
      gr->n += gt->params[gt->by_group[i]].n;
      gr->count++;
      i++;
    }
    if (gr->count > gt->max_count) gt->max_count = gr->count;
    if (gr->n > gt->max_group_n) gt->max_group_n = gr->n;
  }
  uint64_t at = 0; /* registration order */
  for (size_t i = 0; i < gt->nparams; i++) {
    gt->params[i].gindex = at;
    at += gt->params[i].n;
  }
  for (uint32_t g = 0; g < gt->ngroups; g++)
    if (gt->groups[g].count == 0)
      return ferry_err(&e->err, FERRY_EINVAL,
                       "finalize: group %u has no parameters (groups must be numbered 0..%u "
                       "without gaps)",
                       g, maxg);
  return FERRY_OK;
}

/* The element where rank r's range of group g starts: r·n/N, snapped down
 * to a multiple of `align` elements from the start of the param it falls
 * in (so int8 blocks and SIMD tiles of a piece are those of the whole
 * param). */
static size_t bound_of(ferry_engine *e, uint32_t g, int r, size_t align) {
  eng_group *gr = &e->gt.groups[g];
  size_t nr = (size_t)e->nranks;
  if ((size_t)r >= nr) return gr->n;
  size_t t = ferry_part_even(gr->n, nr, (size_t)r);
  for (uint32_t k = 0; k < gr->count; k++) {
    eng_param *p = group_param(e, g, k);
    if (t >= p->goff && t < p->goff + p->n) return ferry_part_snap(t, p->goff, align);
  }
  return gr->n;
}

int group_partition(ferry_engine *e, size_t align) {
  int sharded = engine_sharded(e);
  for (uint32_t g = 0; g < e->gt.ngroups; g++) {
    eng_group *gr = &e->gt.groups[g];
    gr->lo = 0;
    gr->hi = gr->n;
    if (sharded) {
      gr->bounds = calloc((size_t)e->nranks + 1, sizeof *gr->bounds);
      if (!gr->bounds) return ferry_err(&e->err, FERRY_ENOMEM, "finalize: out of memory");
      for (int r = 0; r <= e->nranks; r++)
        gr->bounds[r] = bound_of(e, g, r, align);
      gr->lo = gr->bounds[e->rank];
      gr->hi = gr->bounds[e->rank + 1];
    }
    for (uint32_t k = 0; k < gr->count; k++) {
      eng_param *p = group_param(e, g, k);
      p->pn = group_param_piece(e, p, e->rank, &p->plo);
    }
  }
  return FERRY_OK;
}

size_t group_param_piece(const ferry_engine *e, const eng_param *p, int r, size_t *off) {
  const eng_group *gr = &e->gt.groups[p->group];
  *off = 0;
  if (!gr->bounds) return p->n; /* replicated */
  return ferry_part_piece(gr->bounds[r], gr->bounds[r + 1], p->goff, p->n, off);
}

int group_register(ferry_engine *e) {
  eng_groups *gt = &e->gt;
  int rc = FERRY_OK;
  for (size_t i = 0; i < gt->nparams; i++)
    gt->params[i].state_bytes = ferry_optimizer_state_bytes(&e->ocfg, gt->params[i].pn);
  for (size_t i = 0; i < gt->nparams && !rc; i++) {
    eng_param *p = &gt->params[gt->by_group[i]];
    for (int r = 0; r < FERRY_ROLE_COUNT && !rc; r++) {
      if (r == FERRY_ROLE_EXP_AVG && e->nstates < 1) continue;
      if (r == FERRY_ROLE_EXP_AVG_SQ && e->nstates < 2) continue;
      if (r == FERRY_ROLE_GRAD && e->grads_none) continue; /* no accumulator */
      if (r == FERRY_ROLE_MASTER && e->master_bf16) continue; /* the params are the master */
      char nm[FERRY_MEM_NAME_MAX + 1];
      snprintf(nm, sizeof nm, "%s%s", p->name, role_suffix[r]);
      ferry_dtype dt = r == FERRY_ROLE_PARAM  ? e->dtype
                       : r == FERRY_ROLE_GRAD ? e->grad_dtype
                                              : FERRY_DT_F32;
      int ndim = p->ndim;
      const int64_t *shape = p->shape;
      int64_t packed = (int64_t)p->state_bytes, piece = (int64_t)p->pn;
      /* sharded roles are this rank's piece, one dimension (none when empty) */
      int shard = (r >= FERRY_ROLE_MASTER && engine_sharded(e)) ||
                  (r == FERRY_ROLE_GRAD && engine_grads_sharded(e)) ||
                  (r == FERRY_ROLE_PARAM && engine_params_sharded(e));
      /* no piece: no tensor, but at stage 3 a one-element param stands in
       * (never read or written), so the manager knows every group */
      if (shard && p->pn == 0 && r != FERRY_ROLE_PARAM) continue;
      if (shard && p->pn == 0) piece = 1;
      if (shard) {
        ndim = 1;
        shape = &piece;
      }
      if (r == FERRY_ROLE_EXP_AVG || r == FERRY_ROLE_EXP_AVG_SQ) {
        dt = e->ocfg.state_dtype;
        if (dt == FERRY_DT_I8) { /* codes and absmax: bytes, one dimension */
          dt = FERRY_DT_U8;
          ndim = 1;
          shape = &packed;
        }
      }
      rc = ferry_mem_register(e->mem, nm, dt, ndim, shape, p->group, (ferry_role)r, &p->id[r]);
    }
  }
  return rc;
}

/* A chunk never holds two groups (memory/layout.c), so committing one
 * group's params touches no other group's chunks: the commit after each
 * update relies on it. */
void group_check_chunks(ferry_engine *e) {
  for (uint32_t g = 0; g < e->gt.ngroups; g++) {
    uint32_t first_c = 0, count_c = 0;
    ferry_mem_group_chunks(e->mem, g, FERRY_FAMILY_PARAMS, &first_c, &count_c);
    for (uint32_t c = first_c; c < first_c + count_c; c++) {
      ferry_mem_chunk_info ci;
      FERRY_ASSERT(ferry_mem_chunk_get(e->mem, c, &ci) == 0 && ci.group_first == g &&
                       ci.group_last == g,
                   "finalize: param chunk %u of group %u holds other groups", c, g);
    }
  }
}

void group_free(eng_groups *gt) {
  for (size_t i = 0; i < gt->nparams; i++) free(gt->params[i].name);
  for (uint32_t g = 0; gt->groups && g < gt->ngroups; g++)
    free(gt->groups[g].bounds);
  free(gt->params);
  free(gt->by_group);
  free(gt->groups);
  memset(gt, 0, sizeof *gt);
}

eng_param *group_param(ferry_engine *e, uint32_t g, uint32_t k) {
  return &e->gt.params[e->gt.by_group[e->gt.groups[g].first + k]];
}

int group_fetched(ferry_engine *e, uint32_t g, int delta) {
  pthread_mutex_lock(&e->mu);
  int n = e->gt.groups[g].fetched += delta;
  pthread_mutex_unlock(&e->mu);
  return n;
}

eng_param *group_find(ferry_engine *e, const char *name) {
  uint32_t id;
  if (!e->mem || ferry_mem_lookup(e->mem, name, &id)) return NULL;
  ferry_mem_tensor_info ti;
  if (ferry_mem_tensor_get(e->mem, id, &ti) || ti.role != FERRY_ROLE_PARAM) return NULL;
  for (size_t i = 0; i < e->gt.nparams; i++)
    if (e->gt.params[i].id[FERRY_ROLE_PARAM] == id) return &e->gt.params[i];
  return NULL;
}

int group_fetch(ferry_engine *e, uint32_t g, int family, ferry_tier tier, ferry_stream *s,
                unsigned flags, int (*others_busy)(ferry_engine *)) {
  uint64_t seen = ferry_mem_changes(e->mem); /* before the try: no release goes unseen */
  int rc = ferry_mem_fetch(e->mem, g, family, tier, s, flags);
  double deadline = ferry_now() + GROUP_FETCH_WAIT;
  while (rc == FERRY_ENOMEM) {
    /* room may still come back: the other threads are at work, or one gave
     * some back since the try (an update that ended just after it, whose
     * thread is no longer busy) */
    int may = !others_busy || others_busy(e) || ferry_mem_changes(e->mem) != seen;
    if (!may || ferry_mem_wait_change(e->mem, &seen, deadline) != FERRY_OK) break;
    rc = ferry_mem_fetch(e->mem, g, family, tier, s, flags);
  }
  return rc; /* the last try's FERRY_ENOMEM, its message in the manager's */
}

int group_grads_fresh(const ferry_engine *e, uint32_t g) { return e->gt.groups[g].grads_zero; }
void group_grads_loaded(ferry_engine *e, uint32_t g) { e->gt.groups[g].grads_zero = 0; }

const char *group_role_suffix(int role) {
  return role >= 0 && role < FERRY_ROLE_COUNT ? role_suffix[role] : "";
}

const char *group_state_name(group_state s) {
  static const char *const names[GROUP_STATE_COUNT] = {"idle", "queued", "updated", "failed"};
  return (unsigned)s < GROUP_STATE_COUNT ? names[s] : "?";
}

void group_set_failed(ferry_engine *e, uint32_t g, int status) {
  group_set_state(e, g, GROUP_FAILED);
  e->gt.groups[g].fail_status = status;
}

void group_set_state(ferry_engine *e, uint32_t g, group_state to) {
  eng_group *gr = &e->gt.groups[g];
  group_state from = gr->state;
  int ok = (from == GROUP_IDLE && to == GROUP_QUEUED) ||    /* grads final / step queues it */
           (from == GROUP_FAILED && to == GROUP_QUEUED) ||  /* ferry_step runs it again */
           (from == GROUP_QUEUED && to == GROUP_UPDATED) || /* the update is done */
           (from == GROUP_QUEUED && to == GROUP_FAILED) ||  /* ... or failed */
           (from == GROUP_UPDATED && to == GROUP_IDLE) ||   /* new params committed */
           (from == GROUP_UPDATED && to == GROUP_FAILED);   /* ... or not (tail) */
  FERRY_ASSERT(ok, "group %u: update state %s -> %s", g, group_state_name(from),
               group_state_name(to));
  if (to == GROUP_QUEUED) gr->fail_status = 0;
  gr->state = to;
}

void group_note_grads(ferry_engine *e, uint32_t g) {
  for (uint32_t k = 0; k < e->gt.groups[g].count; k++) {
    eng_param *p = group_param(e, g, k);
    if (!p->no_grad) p->got_grad = 1;
    p->no_grad = 0;
  }
}

int group_param_stepped(const ferry_engine *e, const eng_param *p) {
  return p->got_grad || e->cv->missing_grad == FERRY_MISSING_GRAD_ZERO;
}

int group_zero_grads(ferry_engine *e, uint32_t g, int held) {
  for (uint32_t k = 0; k < e->gt.groups[g].count; k++) group_param(e, g, k)->got_grad = 0;
  if (e->grads_none) return FERRY_OK; /* nothing kept */
  if (e->grad_home == FERRY_TIER_NVME) { /* a flag, not a write */
    e->gt.groups[g].grads_zero = 1;
    return FERRY_OK;
  }
  ferry_tier gt = work_tier(e->grad_home);
  int rc = held ? 0 : ferry_mem_fetch(e->mem, g, FERRY_FAMILY_GRADS, gt, NULL, FERRY_MEM_NOTRACE);
  if (rc) return engine_mem_err(e, rc, "zero grads");
  eng_group *gr = &e->gt.groups[g];
  size_t es = ferry_dtype_size(e->grad_dtype);
  int gs = engine_grads_sharded(e);
  for (uint32_t k = 0; k < gr->count; k++) {
    eng_param *p = group_param(e, g, k);
    void *acc;
    size_t n = gs ? p->pn : p->n;
    if (n == 0) continue;
    ferry_mem_tensor_ptr(e->mem, p->id[FERRY_ROLE_GRAD], gt, &acc);
    if (!engine_gpu_math(e)) {
      memset(acc, 0, n * es);
    } else if ((rc = ferry_memset_async(e->down, acc, 0, n * es))) { /* device memory */
      rc = ferry_err(&e->err, rc, "zero grads: %s", ferry_device_last_error(e->dev));
      break;
    }
  }
  int r2 = held ? FERRY_OK : ferry_mem_release(e->mem, g, FERRY_FAMILY_GRADS, gt, NULL);
  if (rc) return rc;
  return r2 ? engine_mem_err(e, r2, "zero grads") : FERRY_OK;
}
