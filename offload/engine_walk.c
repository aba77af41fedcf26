/* offload/engine_walk.c — the engine's face to its checkpoints
 * (engine_walk.h): the one place that reads the engine's fields for them.
 */
#include "offload/engine_impl.h"

#include <string.h>

void engine_walk_facts(ferry_engine *e, engine_facts *out) {
  *out = (engine_facts){
      .dtype = e->dtype,
      .esize = e->esize,
      .nstates = e->nstates,
      .master_bf16 = e->master_bf16,
      .opt_type = e->cv->opt_type,
      .ocfg = e->ocfg,
      .dynamic_scale = e->dynamic_scale,
      .param_home = e->param_home,
      .optim_home = e->optim_home,
      .nparams = e->gt.nparams,
      .nranks = e->nranks,
      .rank = e->rank,
      .zero_stage = e->zero_stage,
      .sharded = engine_sharded(e),
      .params_sharded = engine_params_sharded(e),
      .mem = e->mem,
      .dev = e->dev,
      .ch = e->ch_loop,
      .err = &e->err,
      .log = &e->log,
  };
}

void engine_param_at(ferry_engine *e, size_t i, engine_param_view *out) {
  const eng_param *p = &e->gt.params[i];
  *out = (engine_param_view){i, p->name, p->ndim, p->shape, p->n, p->plo, p->pn, p->id, p->steps};
}

void engine_param_set_steps(ferry_engine *e, size_t i, int64_t steps) {
  e->gt.params[i].steps = steps;
}

int engine_param_index(ferry_engine *e, const char *name, size_t hint, size_t *index) {
  if (hint < e->gt.nparams && !strcmp(e->gt.params[hint].name, name)) {
    *index = hint;
    return 0;
  }
  const eng_param *p = group_find(e, name);
  if (!p) return -1;
  *index = (size_t)(p - e->gt.params);
  return 0;
}

engine_param_iter engine_params(ferry_engine *e, int by_group) {
  return (engine_param_iter){.e = e, .by_group = by_group};
}

const engine_param_view *engine_params_next(engine_param_iter *it) {
  const eng_groups *gt = &it->e->gt;
  if (it->next >= gt->nparams) return NULL;
  size_t k = it->next++;
  engine_param_at(it->e, it->by_group ? gt->by_group[k] : k, &it->cur);
  return &it->cur;
}

size_t engine_param_piece(ferry_engine *e, const engine_param_view *p, int r, size_t *off) {
  return group_param_piece(e, &e->gt.params[p->index], r, off);
}

const char *engine_role_suffix(int role) { return group_role_suffix(role); }
