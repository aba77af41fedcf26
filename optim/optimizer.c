/* optim/optimizer.c — the public CPU optimizer: hyper-parameters, the choice
 * of kernels (CPUID, FERRY_SIMD), a step split into tiles and run on the pool
 * (sync or async with completion; LAMB as two phases around its per-span trust
 * ratios), the gradient helpers (norm, inf/NaN, accumulation) and the dynamic
 * loss scaler.
 */
#include "optim/optim.h"
#include "optim/quant_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- kernel choice ------------------------------------------------------ */

int optim_simd_parse(const char *name) {
  if (!name) return -1;
  if (!strcmp(name, "scalar")) return OPTIM_SIMD_SCALAR;
  if (!strcmp(name, "avx2")) return OPTIM_SIMD_AVX2;
  if (!strcmp(name, "avx512")) return OPTIM_SIMD_AVX512;
  return -1;
}

static int level_supported(int level) {
  unsigned f = ferry_cpu_simd();
  switch (level) {
  case OPTIM_SIMD_SCALAR: return 1;
  case OPTIM_SIMD_AVX2: {
    unsigned need = FERRY_SIMD_AVX2 | FERRY_SIMD_FMA | FERRY_SIMD_F16C;
    return (f & need) == need;
  }
  case OPTIM_SIMD_AVX512: {
    unsigned need = FERRY_SIMD_AVX512F | FERRY_SIMD_AVX512BW | FERRY_SIMD_AVX512VL |
                    FERRY_SIMD_AVX2 | FERRY_SIMD_FMA | FERRY_SIMD_F16C;
    return (f & need) == need;
  }
  default: return 0;
  }
}

const optim_kernels *optim_kernels_get(int level) {
  if (!level_supported(level)) return NULL;
  switch (level) {
#ifdef FERRY_OPTIM_X86
  case OPTIM_SIMD_AVX2: return &optim_kernels_avx2;
  case OPTIM_SIMD_AVX512: return &optim_kernels_avx512;
#endif
  default: return &optim_kernels_scalar;
  }
}

int optim_simd_default(void) {
  const char *env = getenv("FERRY_SIMD");
  if (env && *env) {
    int l = optim_simd_parse(env);
    return l >= 0 && level_supported(l) ? l : -1;
  }
  for (int l = OPTIM_SIMD_COUNT - 1; l > 0; l--)
    if (level_supported(l)) return l;
  return OPTIM_SIMD_SCALAR;
}

/* ---- per-step scalars ----------------------------------------------------- */

void optim_scalars_make(optim_scalars *s, const ferry_optimizer_config *cfg, float lr, int64_t t,
                        float gscale) {
  memset(s, 0, sizeof *s);
  double b1 = cfg->beta1, b2 = cfg->beta2, dl = lr, wd = cfg->weight_decay;
  s->type = (int)cfg->type;
  s->gscale = gscale;
  s->lr = lr;
  s->beta1 = cfg->beta1;
  s->beta2 = cfg->beta2;
  s->omb1 = (float)(1.0 - b1);
  s->omb2 = (float)(1.0 - b2);
  s->eps = cfg->eps;
  s->wd = cfg->weight_decay;
  s->decay = 1.0f;
  s->inv_bc1 = 1.0f;
  s->inv_sqrt_bc2 = 1.0f;
  s->sr_key = optim_sr_key(cfg->seed, t);
  double bc1 = 1.0 - pow(b1, (double)t), bc2 = 1.0 - pow(b2, (double)t);
  switch (cfg->type) {
  case FERRY_OPTIM_ADAMW:
  case FERRY_OPTIM_ADAM:
    if (cfg->type == FERRY_OPTIM_ADAMW) {
      s->decay = (float)(1.0 - dl * wd);
      s->wd = 0.0f;
    }
    s->neg_step = (float)(-dl / bc1);
    s->inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    break;
  case FERRY_OPTIM_LAMB:
    s->neg_step = (float)-dl;
    s->inv_bc1 = (float)(1.0 / bc1);
    s->inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    break;
  case FERRY_OPTIM_ADAGRAD:
    s->neg_step = (float)(-dl / (1.0 + (double)(t - 1) * cfg->lr_decay));
    break;
  case FERRY_OPTIM_SGD:
    s->neg_step = (float)-dl;
    s->beta1 = cfg->momentum;
    s->sgd_momentum = cfg->momentum != 0.0f;
    s->nesterov = cfg->nesterov != 0;
    s->mom_c = t <= 1 ? 0.0f : cfg->momentum;
    s->damp_c = t <= 1 ? 1.0f : (float)(1.0 - (double)cfg->dampening);
    break;
  case FERRY_OPTIM_LION:
    s->neg_step = (float)-dl;
    s->decay = (float)(1.0 - dl * wd);
    s->wd = 0.0f;
    break;
  }
}

static int dt_ok(int dt) {
  return dt == FERRY_DT_F32 || dt == FERRY_DT_F16 || dt == FERRY_DT_BF16;
}

/* ---- the optimizer object ------------------------------------------------- */

typedef struct {
  optim_tile t;
  size_t span;
  const optim_scalars *sc; /* the step's, or its span's (optim_step_counts) */
} step_tile;

typedef struct {
  optim_job job;
  struct ferry_optimizer *o;
  int phase;
} step_job;

struct ferry_optimizer {
  ferry_optimizer_config cfg;
  const optim_kernels *k;
  int level, native_bf16;
  optim_pool *pool;
  ferry_errbuf err;
  ferry_logger log;
  int64_t step;
  float lr;

  /* the step in flight; buffers grow to the largest step seen */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int in_flight, status;
  ferry_optim_done_fn done;
  void *done_user;
  optim_scalars sc;
  step_tile *tiles;
  size_t ntiles, cap_tiles;
  double *part; /* LAMB: 2 per tile */
  size_t cap_part;
  size_t nspans, cap_spans;
  double *span_sums; /* LAMB: 2 per span */
  optim_scalars *span_sc; /* optim_step_counts: per span */
  size_t cap_span_sc;
  step_job job;
  optim_cuda_ops cuda;    /* the CUDA step's calls (tests: optim_set_cuda_ops) */

  /* gradient helpers: serialised by hmu */
  pthread_mutex_t hmu;
  double *hpart;
  size_t cap_hpart;
  size_t *hfirst; /* first tile of each span */
  size_t cap_hfirst;
};

int ferry_optimizer_state_count(const ferry_optimizer_config *cfg) {
  if (!cfg) return -1;
  switch (cfg->type) {
  case FERRY_OPTIM_ADAMW:
  case FERRY_OPTIM_ADAM:
  case FERRY_OPTIM_LAMB: return 2;
  case FERRY_OPTIM_ADAGRAD:
  case FERRY_OPTIM_LION: return 1;
  case FERRY_OPTIM_SGD: return cfg->momentum == 0.0f ? 0 : 1;
  }
  return -1;
}

/* The elements per absmax block of an int8 state. */
static size_t qblock(const ferry_optimizer_config *c) {
  return c->state_block ? c->state_block : 256;
}

size_t ferry_optimizer_state_bytes(const ferry_optimizer_config *cfg, size_t n) {
  if (!cfg) return 0;
  switch (cfg->state_dtype) {
  case FERRY_DT_F32: return 4 * n;
  case FERRY_DT_BF16: return 2 * n;
  case FERRY_DT_I8: {
    size_t b = qblock(cfg);
    return (n + 63) / 64 * 64 + (n + b - 1) / b * sizeof(float);
  }
  default: return 0;
  }
}

double ferry_optimizer_bytes_per_param(const ferry_optimizer_config *cfg, int grad_dtype,
                                       int copy_dtype) {
  int ns = ferry_optimizer_state_count(cfg);
  if (ns < 0 || !dt_ok(grad_dtype) || (copy_dtype != FERRY_DT_NONE && !dt_ok(copy_dtype)))
    return -1;
  int mdt = cfg->master_dtype ? cfg->master_dtype : FERRY_DT_F32;
  double state = cfg->state_dtype == FERRY_DT_I8 ? 1.0 + 4.0 / (double)qblock(cfg)
                 : cfg->state_dtype == FERRY_DT_BF16 ? 2.0
                                                     : 4.0;
  double b = 2.0 * (double)ferry_dtype_size(mdt) + 2.0 * ns * state;
  b += (double)ferry_dtype_size(grad_dtype);
  if (copy_dtype != FERRY_DT_NONE) b += (double)ferry_dtype_size(copy_dtype);
  return b;
}

ferry_optimizer_config ferry_optimizer_config_default(ferry_optim_type type) {
  ferry_optimizer_config c;
  memset(&c, 0, sizeof c);
  c.type = type;
  c.lr = 1e-3f;
  c.beta1 = 0.9f;
  c.beta2 = 0.999f;
  c.eps = 1e-8f;
  c.state_dtype = FERRY_DT_F32;
  c.bind = 1;
  switch (type) {
  case FERRY_OPTIM_ADAMW: c.weight_decay = 1e-2f; break;
  case FERRY_OPTIM_ADAGRAD:
    c.lr = 1e-2f;
    c.eps = 1e-10f;
    break;
  case FERRY_OPTIM_LAMB:
    c.eps = 1e-6f;
    c.weight_decay = 1e-2f;
    break;
  case FERRY_OPTIM_SGD: c.lr = 1e-2f; break;
  case FERRY_OPTIM_LION:
    c.lr = 1e-4f;
    c.beta2 = 0.99f;
    break;
  default: break;
  }
  return c;
}

static int check_config(const ferry_optimizer_config *c, char *why, size_t len) {
  if ((int)c->type < FERRY_OPTIM_ADAMW || (int)c->type > FERRY_OPTIM_LION)
    return snprintf(why, len, "unknown optimizer type %d", (int)c->type), -1;
  if (!(c->lr >= 0.0f) || !isfinite(c->lr)) return snprintf(why, len, "lr %g", c->lr), -1;
  if (!(c->beta1 >= 0.0f && c->beta1 < 1.0f) || !(c->beta2 >= 0.0f && c->beta2 < 1.0f))
    return snprintf(why, len, "betas (%g, %g) must lie in [0, 1)", c->beta1, c->beta2), -1;
  if (!(c->eps >= 0.0f) || !isfinite(c->eps)) return snprintf(why, len, "eps %g", c->eps), -1;
  if (!isfinite(c->weight_decay) || c->weight_decay < 0.0f)
    return snprintf(why, len, "weight_decay %g", c->weight_decay), -1;
  if (!(c->momentum >= 0.0f) || !isfinite(c->momentum) || !(c->dampening >= 0.0f) ||
      !(c->dampening <= 1.0f))
    return snprintf(why, len, "momentum %g / dampening %g", c->momentum, c->dampening), -1;
  if (c->nesterov && (c->momentum <= 0.0f || c->dampening != 0.0f))
    return snprintf(why, len, "nesterov needs momentum > 0 and dampening 0"), -1;
  if (!(c->lr_decay >= 0.0f)) return snprintf(why, len, "lr_decay %g", c->lr_decay), -1;
  if (c->state_dtype != FERRY_DT_F32 && c->state_dtype != FERRY_DT_BF16 &&
      c->state_dtype != FERRY_DT_I8)
    return snprintf(why, len, "state_dtype %d (fp32, bf16 or int8)", c->state_dtype), -1;
  if (c->state_dtype == FERRY_DT_I8 && c->type != FERRY_OPTIM_ADAMW &&
      c->type != FERRY_OPTIM_ADAM && c->type != FERRY_OPTIM_LION)
    return snprintf(why, len, "int8 states are for AdamW, Adam and Lion only"), -1;
  if (c->state_block && (c->state_block < 32 || c->state_block > 4096 ||
                         (c->state_block & (c->state_block - 1))))
    return snprintf(why, len, "state_block %zu (a power of two in [32, 4096])", c->state_block),
           -1;
  if (c->master_dtype != 0 && c->master_dtype != FERRY_DT_F32 && c->master_dtype != FERRY_DT_BF16)
    return snprintf(why, len, "master_dtype %d (fp32 or bf16)", c->master_dtype), -1;
  if (c->threads < 0) return snprintf(why, len, "threads %d", c->threads), -1;
  return 0;
}

int ferry_optimizer_create(const ferry_optimizer_config *cfg, ferry_optimizer **out) {
  if (!cfg || !out) return ferry_err_thread(FERRY_EINVAL, "ferry_optimizer_create: NULL argument");
  *out = NULL;
  char why[200];
  if (check_config(cfg, why, sizeof why))
    return ferry_err_thread(FERRY_EINVAL, "ferry_optimizer_create: %s", why);
  int level;
  if (cfg->simd) {
    level = optim_simd_parse(cfg->simd);
    if (level < 0)
      return ferry_err_thread(
          FERRY_EINVAL, "ferry_optimizer_create: simd '%s' (scalar, avx2, avx512)", cfg->simd);
  } else {
    level = optim_simd_default();
    if (level < 0)
      return ferry_err_thread(
          FERRY_ENOTSUP,
          "ferry_optimizer_create: FERRY_SIMD=%s is unknown or not supported by "
          "this CPU (scalar, avx2, avx512)",
          getenv("FERRY_SIMD"));
  }
  const optim_kernels *k = optim_kernels_get(level);
  if (!k)
    return ferry_err_thread(FERRY_ENOTSUP,
                            "ferry_optimizer_create: this CPU cannot run the %s kernels",
                            level == OPTIM_SIMD_AVX2 ? "avx2" : "avx512");
  ferry_optimizer *o = calloc(1, sizeof *o);
  if (!o) return ferry_err_thread(FERRY_ENOMEM, "ferry_optimizer_create: out of memory");
  o->cfg = *cfg;
  o->cfg.simd = NULL; /* not kept: the caller's string */
  if (!o->cfg.tile) o->cfg.tile = 65536;
  if (!o->cfg.master_dtype) o->cfg.master_dtype = FERRY_DT_F32;
  if (o->cfg.state_dtype == FERRY_DT_I8) { /* int8 tiles start at block boundaries */
    size_t b = qblock(&o->cfg);
    o->cfg.state_block = b;
    o->cfg.tile = (o->cfg.tile + b - 1) / b * b;
  }
  o->k = k;
  o->level = level;
  o->native_bf16 = level == OPTIM_SIMD_AVX512 && (ferry_cpu_simd() & FERRY_SIMD_AVX512BF16);
  o->lr = cfg->lr;
  optim_set_cuda_ops(o, NULL);
  o->log.fn = cfg->log;
  o->log.user = cfg->log_user;
  o->log.level = cfg->log_level;
  ferry_errbuf_init(&o->err);
  pthread_mutex_init(&o->mu, NULL);
  pthread_cond_init(&o->cv, NULL);
  pthread_mutex_init(&o->hmu, NULL);
  int rc = optim_pool_create(cfg->threads, cfg->bind, &o->log, &o->pool, &o->err);
  if (rc) {
    ferry_err_thread(rc, "ferry_optimizer_create: %s", ferry_err_msg(&o->err));
    o->pool = NULL;
    ferry_optimizer_destroy(o);
    return rc;
  }
  ferry_logf(&o->log, FERRY_LOG_INFO, "optimizer: %s kernels%s, %d threads (%d bound)", k->name,
             o->native_bf16 ? " with AVX512-BF16" : "", optim_pool_threads(o->pool),
             optim_pool_bound(o->pool));
  *out = o;
  return FERRY_OK;
}

void ferry_optimizer_destroy(ferry_optimizer *o) {
  if (!o) return;
  if (o->pool) {
    ferry_optimizer_wait(o);
    optim_pool_destroy(o->pool);
  }
  free(o->tiles);
  free(o->part);
  free(o->span_sums);
  free(o->span_sc);
  free(o->hpart);
  free(o->hfirst);
  pthread_mutex_destroy(&o->hmu);
  pthread_cond_destroy(&o->cv);
  pthread_mutex_destroy(&o->mu);
  ferry_errbuf_destroy(&o->err);
  free(o);
}

const char *ferry_optimizer_last_error(const ferry_optimizer *o) {
  return o ? ferry_err_msg(&o->err) : "";
}

int ferry_optimizer_get_info(ferry_optimizer *o, ferry_optimizer_info *out) {
  if (!o || !out) return FERRY_EINVAL;
  memset(out, 0, sizeof *out);
  snprintf(out->simd, sizeof out->simd, "%s", o->k->name);
  out->native_bf16 = o->native_bf16;
  out->threads = optim_pool_threads(o->pool);
  out->bound = optim_pool_bound(o->pool);
  out->step = ferry_optimizer_get_step(o);
  return FERRY_OK;
}


static int check_span(ferry_optimizer *o, const ferry_optim_span *sp, size_t i) {
  int type = (int)o->cfg.type;
  int need1 = type != FERRY_OPTIM_SGD || o->cfg.momentum != 0.0f;
  int need2 = type == FERRY_OPTIM_ADAMW || type == FERRY_OPTIM_ADAM || type == FERRY_OPTIM_LAMB;
  if (!dt_ok(sp->grad_dtype))
    return ferry_err(&o->err, FERRY_EINVAL, "span %zu: grad_dtype %d (fp32, fp16, bf16)", i,
                     sp->grad_dtype);
  if (sp->copy_dtype != FERRY_DT_NONE && !dt_ok(sp->copy_dtype))
    return ferry_err(&o->err, FERRY_EINVAL, "span %zu: copy_dtype %d", i, sp->copy_dtype);
  if (o->cfg.master_dtype == FERRY_DT_BF16 && sp->copy_dtype != FERRY_DT_NONE)
    return ferry_err(&o->err, FERRY_EINVAL,
                     "span %zu: copy_dtype %d with master_dtype bf16 (the bf16 params are the "
                     "master, updated in place: copy_dtype must be FERRY_DT_NONE)",
                     i, sp->copy_dtype);
  if (sp->n == 0) return 0;
  if (!sp->param || !sp->grad)
    return ferry_err(&o->err, FERRY_EINVAL, "span %zu: param or grad is NULL", i);
  if (need1 && !sp->state1)
    return ferry_err(&o->err, FERRY_EINVAL,
                     "span %zu: state1 is NULL (this optimizer keeps a state)", i);
  if (need2 && !sp->state2)
    return ferry_err(&o->err, FERRY_EINVAL, "span %zu: state2 (exp_avg_sq) is NULL", i);
  if (sp->copy_dtype != FERRY_DT_NONE && !sp->param_copy)
    return ferry_err(&o->err, FERRY_EINVAL, "span %zu: copy_dtype set but param_copy is NULL", i);
  return 0;
}

static size_t esize(int dt) {
  return dt == FERRY_DT_F32 ? 4 : dt == FERRY_DT_I8 ? 1 : 2;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t nc = *cap ? *cap : 64;
  while (nc < need)
    nc *= 2;
  void *q = realloc(*p, nc * elem);
  if (!q) return -1;
  *p = q;
  *cap = nc;
  return 0;
}

/* Splits the spans into tiles (into o->tiles); with counts, each span's
 * scalars at its own step counts[i] + 1. */
static int build_tiles(ferry_optimizer *o, const ferry_optim_span *spans, size_t count,
                       const int64_t *counts, float grad_scale) {
  size_t T = o->cfg.tile, nt = 0;
  for (size_t i = 0; i < count; i++)
    nt += (spans[i].n + T - 1) / T;
  if (grow((void **)&o->tiles, &o->cap_tiles, nt, sizeof *o->tiles) ||
      grow((void **)&o->part, &o->cap_part, nt, 2 * sizeof *o->part) ||
      grow((void **)&o->span_sums, &o->cap_spans, count, 2 * sizeof *o->span_sums) ||
      (counts && grow((void **)&o->span_sc, &o->cap_span_sc, count, sizeof *o->span_sc)))
    return ferry_err(&o->err, FERRY_ENOMEM, "step: out of memory for %zu tiles", nt);
  for (size_t i = 0; counts && i < count; i++) {
    optim_scalars_make(&o->span_sc[i], &o->cfg, o->lr, counts[i] + 1, grad_scale);
    o->span_sc[i].native_bf16 = o->native_bf16;
  }
  int sdt = o->cfg.state_dtype;
  size_t k = 0;
  for (size_t i = 0; i < count; i++) {
    const ferry_optim_span *sp = &spans[i];
    for (size_t off = 0; off < sp->n; off += T) {
      step_tile *st = &o->tiles[k++];
      optim_tile *t = &st->t;
      size_t es = esize(sdt);
      t->n = sp->n - off < T ? sp->n - off : T;
      t->mdt = o->cfg.master_dtype;
      t->p = (char *)sp->param + off * esize(t->mdt);
      t->index = sp->index + off;
      t->g = (const char *)sp->grad + off * esize(sp->grad_dtype);
      t->s1 = sp->state1 ? (char *)sp->state1 + off * es : NULL;
      t->s2 = sp->state2 && (o->cfg.type == FERRY_OPTIM_ADAMW || o->cfg.type == FERRY_OPTIM_ADAM ||
                             o->cfg.type == FERRY_OPTIM_LAMB)
                  ? (char *)sp->state2 + off * es
                  : NULL;
      if (o->cfg.type == FERRY_OPTIM_SGD && o->cfg.momentum == 0.0f) t->s1 = NULL;
      t->cdt = sp->copy_dtype;
      t->pc = t->cdt != FERRY_DT_NONE ? (char *)sp->param_copy + off * esize(t->cdt) : NULL;
      t->gdt = sp->grad_dtype;
      t->sdt = sdt;
      t->trust = 1.0f;
      t->block = qblock(&o->cfg);
      t->a1 = t->a2 = NULL;
      if (sdt == FERRY_DT_I8) { /* off is a multiple of the block */
        if (t->s1) t->a1 = optim_q_absmax_ptr(sp->state1, sp->n) + off / t->block;
        if (t->s2) t->a2 = optim_q_absmax_ptr(sp->state2, sp->n) + off / t->block;
      }
      st->span = i;
      st->sc = counts ? &o->span_sc[i] : &o->sc;
    }
  }
  o->ntiles = nt;
  o->nspans = count;
  return 0;
}

static void step_tile_fn(optim_job *j, size_t i, int worker) {
  (void)worker;
  ferry_optimizer *o = ((step_job *)j)->o;
  step_tile *st = &o->tiles[i];
  if (o->cfg.type == FERRY_OPTIM_LAMB && ((step_job *)j)->phase == 0) {
    o->part[2 * i] = 0;
    o->part[2 * i + 1] = 0;
    o->k->lamb_phase1(st->sc, &st->t, &o->part[2 * i], &o->part[2 * i + 1]);
  } else {
    o->k->step(st->sc, &st->t);
  }
}

static size_t step_phase_done(optim_job *j) {
  step_job *sj = (step_job *)j;
  ferry_optimizer *o = sj->o;
  if (o->cfg.type != FERRY_OPTIM_LAMB || sj->phase != 0) return 0;
  /* per-span norms, summed in tile order: the same for any thread count */
  for (size_t s = 0; s < o->nspans; s++)
    o->span_sums[2 * s] = o->span_sums[2 * s + 1] = 0;
  for (size_t i = 0; i < o->ntiles; i++) {
    size_t s = o->tiles[i].span;
    o->span_sums[2 * s] += o->part[2 * i];
    o->span_sums[2 * s + 1] += o->part[2 * i + 1];
  }
  for (size_t i = 0; i < o->ntiles; i++) {
    size_t s = o->tiles[i].span;
    double pn = sqrt(o->span_sums[2 * s]), un = sqrt(o->span_sums[2 * s + 1]);
    o->tiles[i].t.trust = pn > 0 && un > 0 ? (float)(pn / un) : 1.0f;
  }
  sj->phase = 1;
  return o->ntiles;
}

static void step_finished(optim_job *j) {
  ferry_optimizer *o = ((step_job *)j)->o;
  if (o->done) o->done(o->done_user, 0);
  pthread_mutex_lock(&o->mu);
  o->in_flight = 0;
  o->status = 0;
  pthread_cond_broadcast(&o->cv);
  pthread_mutex_unlock(&o->mu);
}

/* The step count can take one more step. */
static int check_step_room(ferry_optimizer *o) {
  if (o->step < FERRY_STEP_MAX) return FERRY_OK;
  return ferry_err(&o->err, FERRY_EOVERFLOW,
                   "step: %lld steps are taken, the most a step count holds (FERRY_STEP_MAX)",
                   (long long)o->step);
}

/* counts (NULL: none): span i's step is counts[i] + 1 and the optimizer's
 * count stays; each can take one more step. */
static int check_counts(ferry_optimizer *o, const int64_t *counts, size_t count) {
  if (!counts) return check_step_room(o);
  for (size_t i = 0; i < count; i++)
    if (counts[i] < 0 || counts[i] >= FERRY_STEP_MAX)
      return ferry_err(&o->err, counts[i] < 0 ? FERRY_EINVAL : FERRY_EOVERFLOW,
                       "step: span %zu: its count %lld cannot take a step (0..FERRY_STEP_MAX-1)",
                       i, (long long)counts[i]);
  return FERRY_OK;
}

/* ferry_optimizer_step_async, with a step count per span (counts) or the
 * optimizer's own (NULL). Every span is checked before the step starts. */
static int step_submit(ferry_optimizer *o, const ferry_optim_span *spans, size_t count,
                       float grad_scale, const int64_t *counts, ferry_optim_done_fn done,
                       void *user) {
  if (!o) return FERRY_EINVAL;
  if (count && !spans) return ferry_err(&o->err, FERRY_EINVAL, "step: spans is NULL");
  if (!isfinite(grad_scale))
    return ferry_err(&o->err, FERRY_EINVAL, "step: grad_scale %g is not finite", grad_scale);
  int rc = check_counts(o, counts, count);
  if (rc) return rc;
  pthread_mutex_lock(&o->mu);
  int busy = o->in_flight;
  if (!busy) o->in_flight = 1;
  pthread_mutex_unlock(&o->mu);
  if (busy) return ferry_err(&o->err, FERRY_EBUSY, "step: another step is still running");
  for (size_t i = 0; i < count && !rc; i++)
    rc = check_span(o, &spans[i], i);
  if (!rc) rc = build_tiles(o, spans, count, counts, grad_scale);
  if (rc) {
    pthread_mutex_lock(&o->mu);
    o->in_flight = 0;
    pthread_mutex_unlock(&o->mu);
    return rc;
  }
  if (!counts) o->step++;
  optim_scalars_make(&o->sc, &o->cfg, o->lr, o->step, grad_scale);
  o->sc.native_bf16 = o->native_bf16;
  o->done = done;
  o->done_user = user;
  memset(&o->job, 0, sizeof o->job);
  o->job.o = o;
  o->job.job.ntiles = o->ntiles;
  o->job.job.tile = step_tile_fn;
  o->job.job.phase_done = step_phase_done;
  o->job.job.finished = step_finished;
  optim_pool_submit(o->pool, &o->job.job);
  return FERRY_OK;
}

int ferry_optimizer_step_async(ferry_optimizer *o, const ferry_optim_span *spans, size_t count,
                               float grad_scale, ferry_optim_done_fn done, void *user) {
  return step_submit(o, spans, count, grad_scale, NULL, done, user);
}

int optim_step_counts(ferry_optimizer *o, const ferry_optim_span *spans, size_t count,
                      float grad_scale, const int64_t *counts) {
  int rc = counts ? step_submit(o, spans, count, grad_scale, counts, NULL, NULL) : FERRY_EINVAL;
  return rc ? rc : ferry_optimizer_wait(o);
}

int ferry_optimizer_query(ferry_optimizer *o) {
  if (!o) return FERRY_EINVAL;
  pthread_mutex_lock(&o->mu);
  int busy = o->in_flight;
  pthread_mutex_unlock(&o->mu);
  return busy ? FERRY_EAGAIN : FERRY_OK;
}

int ferry_optimizer_wait(ferry_optimizer *o) {
  if (!o) return FERRY_EINVAL;
  pthread_mutex_lock(&o->mu);
  while (o->in_flight)
    pthread_cond_wait(&o->cv, &o->mu);
  int st = o->status;
  pthread_mutex_unlock(&o->mu);
  return st;
}

int ferry_optimizer_step(ferry_optimizer *o, const ferry_optim_span *spans, size_t count,
                         float grad_scale) {
  int rc = ferry_optimizer_step_async(o, spans, count, grad_scale, NULL, NULL);
  if (rc) return rc;
  return ferry_optimizer_wait(o);
}

/* Span sp's tile for the CUDA step. */
static optim_tile cuda_tile(const ferry_optimizer *o, const ferry_optim_span *sp) {
  optim_tile t;
  memset(&t, 0, sizeof t);
  t.p = sp->param;
  t.g = sp->grad;
  t.s1 = sp->state1;
  t.s2 = sp->state2;
  t.pc = sp->param_copy;
  t.n = sp->n;
  t.gdt = sp->grad_dtype;
  t.sdt = o->cfg.state_dtype;
  t.cdt = sp->copy_dtype;
  t.trust = 1.0f;
  t.mdt = o->cfg.master_dtype;
  t.index = sp->index;
  t.block = qblock(&o->cfg);
  if (t.sdt == FERRY_DT_I8) {
    t.a1 = optim_q_absmax_ptr(sp->state1, sp->n);
    t.a2 = optim_q_absmax_ptr(sp->state2, sp->n);
  }
  return t;
}

/* ferry_optimizer_step_cuda, with a step count per span (counts) or the
 * optimizer's own (NULL). All or nothing, as the CPU step and the
 * stepper's retry want (a failed group update changed nothing and runs
 * again whole): every span, count and launch's grid is checked, and the
 * device asked whether it has failed, before the first launch. A launch
 * after the first then runs the same kernel with the same threads, so
 * only a device failure can stop it, and that one fails every later call
 * too: a retry cannot step a span twice. The message says how many spans
 * were launched then. */
static int step_cuda(ferry_optimizer *o, const ferry_optim_span *spans, size_t count,
                     float grad_scale, const int64_t *counts, void *cuda_stream) {
  if (!o) return FERRY_EINVAL;
  if (o->cfg.type != FERRY_OPTIM_ADAMW && o->cfg.type != FERRY_OPTIM_ADAM)
    return ferry_err(&o->err, FERRY_ENOTSUP, "step_cuda: only AdamW and Adam run on the GPU");
  if (count && !spans) return ferry_err(&o->err, FERRY_EINVAL, "step_cuda: spans is NULL");
  if (ferry_optimizer_query(o) != 0)
    return ferry_err(&o->err, FERRY_EBUSY, "step_cuda: a CPU step is still running");
  int crc = check_counts(o, counts, count);
  if (crc) return crc;
  size_t launches = 0;
  for (size_t i = 0; i < count; i++) {
    int rc = check_span(o, &spans[i], i), blocks, threads;
    if (rc) return rc;
    if (!spans[i].n) continue;
    if (!optim_cuda_grid(spans[i].n, o->cfg.state_dtype, qblock(&o->cfg), &blocks, &threads))
      return ferry_err(&o->err, FERRY_EINVAL,
                       "step_cuda: span %zu: %zu elements in int8 absmax blocks of %zu: more "
                       "than one grid holds (nothing was launched)",
                       i, spans[i].n, qblock(&o->cfg));
    launches++;
  }
  char why[256] = "";
  int rc = launches ? o->cuda.ready(cuda_stream, why, sizeof why) : FERRY_OK;
  if (rc) return ferry_err(&o->err, rc, "step_cuda: %s (nothing was launched)", why);
  optim_scalars sc;
  optim_scalars_make(&sc, &o->cfg, o->lr, o->step + 1, grad_scale);
  size_t launched = 0;
  for (size_t i = 0; i < count; i++) {
    const ferry_optim_span *sp = &spans[i];
    if (!sp->n) continue;
    if (counts) optim_scalars_make(&sc, &o->cfg, o->lr, counts[i] + 1, grad_scale);
    optim_tile t = cuda_tile(o, sp);
    rc = o->cuda.launch(&sc, &t, cuda_stream, why, sizeof why);
    if (rc)
      return ferry_err(&o->err, rc, "step_cuda: span %zu: %s (%zu of %zu spans launched before)",
                       i, why, launched, launches);
    launched++;
  }
  if (!counts) o->step++;
  return FERRY_OK;
}

void optim_set_cuda_ops(ferry_optimizer *o, const optim_cuda_ops *ops) {
  o->cuda = ops ? *ops : (optim_cuda_ops){optim_cuda_ready, optim_cuda_step};
}

int ferry_optimizer_step_cuda(ferry_optimizer *o, const ferry_optim_span *spans, size_t count,
                              float grad_scale, void *cuda_stream) {
  return step_cuda(o, spans, count, grad_scale, NULL, cuda_stream);
}

int optim_step_cuda_counts(ferry_optimizer *o, const ferry_optim_span *spans, size_t count,
                           float grad_scale, const int64_t *counts, void *cuda_stream) {
  return counts ? step_cuda(o, spans, count, grad_scale, counts, cuda_stream) : FERRY_EINVAL;
}

int64_t ferry_optimizer_get_step(const ferry_optimizer *o) { return o ? o->step : -1; }

int ferry_optimizer_set_step(ferry_optimizer *o, int64_t step) {
  if (!o) return FERRY_EINVAL;
  if (step < 0 || step > FERRY_STEP_MAX)
    return ferry_err(&o->err, FERRY_EINVAL, "set_step: %lld is outside 0..%lld (FERRY_STEP_MAX)",
                     (long long)step, (long long)FERRY_STEP_MAX);
  if (ferry_optimizer_query(o) != 0)
    return ferry_err(&o->err, FERRY_ESTATE, "set_step: a step is running");
  o->step = step;
  return FERRY_OK;
}

int ferry_optimizer_set_lr(ferry_optimizer *o, float lr) {
  if (!o) return FERRY_EINVAL;
  if (!(lr >= 0.0f) || !isfinite(lr)) return ferry_err(&o->err, FERRY_EINVAL, "set_lr: %g", lr);
  if (ferry_optimizer_query(o) != 0)
    return ferry_err(&o->err, FERRY_ESTATE, "set_lr: a step is running");
  o->lr = lr;
  return FERRY_OK;
}

/* ---- gradient helpers ------------------------------------------------------ */

typedef struct {
  ferry_optimizer *o;
  const ferry_grad_span *spans;
  size_t *first; /* first tile of each span */
  size_t count;
  float *acc;
  float scale;
} helper_arg;

/* The span of tile i: the last span whose first tile is <= i (binary search;
 * empty spans share their successor's first tile and are skipped). */
static size_t tile_span(const helper_arg *a, size_t i) {
  size_t lo = 0, hi = a->count; /* answer in [lo, hi) */
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (a->first[mid] <= i)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

static void stats_tile(void *arg, size_t i, int worker) {
  (void)worker;
  helper_arg *a = arg;
  size_t T = a->o->cfg.tile, s = tile_span(a, i), off = (i - a->first[s]) * T;
  const ferry_grad_span *g = &a->spans[s];
  size_t n = g->n - off < T ? g->n - off : T;
  a->o->hpart[i] = a->o->k->sumsq((const char *)g->data + off * esize(g->dtype), g->dtype, n);
}

static void acc_tile(void *arg, size_t i, int worker) {
  (void)worker;
  helper_arg *a = arg;
  size_t T = a->o->cfg.tile, off = i * T;
  const ferry_grad_span *g = a->spans;
  size_t n = g->n - off < T ? g->n - off : T;
  a->o->k->accumulate(a->acc + off, (const char *)g->data + off * esize(g->dtype), g->dtype, n,
                      a->scale);
}

int ferry_optimizer_grad_stats(ferry_optimizer *o, const ferry_grad_span *spans, size_t count,
                               double *sumsq, int *nonfinite) {
  if (!o) return FERRY_EINVAL;
  if ((count && !spans) || !sumsq)
    return ferry_err(&o->err, FERRY_EINVAL, "grad_stats: NULL argument");
  size_t T = o->cfg.tile, nt = 0;
  for (size_t i = 0; i < count; i++) {
    if (!dt_ok(spans[i].dtype) || (spans[i].n && !spans[i].data))
      return ferry_err(&o->err, FERRY_EINVAL, "grad_stats: span %zu: bad dtype or NULL data", i);
    nt += (spans[i].n + T - 1) / T;
  }
  pthread_mutex_lock(&o->hmu);
  if (grow((void **)&o->hpart, &o->cap_hpart, nt, sizeof *o->hpart) ||
      grow((void **)&o->hfirst, &o->cap_hfirst, count, sizeof *o->hfirst)) {
    pthread_mutex_unlock(&o->hmu);
    return ferry_err(&o->err, FERRY_ENOMEM, "grad_stats: out of memory");
  }
  size_t k = 0;
  for (size_t i = 0; i < count; i++) {
    o->hfirst[i] = k;
    k += (spans[i].n + T - 1) / T;
  }
  helper_arg a = {o, spans, o->hfirst, count, NULL, 0};
  optim_pool_for(o->pool, nt, stats_tile, &a);
  double s = 0; /* in tile order: the same sum for any thread count */
  for (size_t i = 0; i < nt; i++)
    s += o->hpart[i];
  pthread_mutex_unlock(&o->hmu);
  *sumsq = s;
  if (nonfinite) *nonfinite = !isfinite(s);
  return FERRY_OK;
}

int ferry_optimizer_grad_accumulate(ferry_optimizer *o, float *acc, const ferry_grad_span *grad,
                                    float scale) {
  if (!o) return FERRY_EINVAL;
  if (!grad || (grad->n && (!acc || !grad->data)) || !dt_ok(grad->dtype))
    return ferry_err(&o->err, FERRY_EINVAL, "grad_accumulate: NULL pointer or bad dtype");
  size_t T = o->cfg.tile, nt = (grad->n + T - 1) / T, first = 0;
  helper_arg a = {o, grad, &first, 1, acc, scale};
  optim_pool_for(o->pool, nt, acc_tile, &a);
  return FERRY_OK;
}

float ferry_clip_coef(double sumsq, float loss_scale, float max_norm) {
  if (!(loss_scale > 0)) loss_scale = 1.0f;
  double norm = sqrt(sumsq) / loss_scale;
  double c = (double)max_norm / (norm + 1e-6);
  return c < 1.0 ? (float)c : 1.0f;
}

/* ---- dynamic loss scaling ----------------------------------------------------- */

void ferry_loss_scaler_init(ferry_loss_scaler *s, float init_scale, float growth, float backoff,
                            int interval) {
  if (!s) return;
  s->scale = init_scale > 0 ? init_scale : 65536.0f;
  s->growth = growth > 0 ? growth : 2.0f;
  s->backoff = backoff > 0 ? backoff : 0.5f;
  s->interval = interval > 0 ? interval : 2000;
  s->good_steps = 0;
  s->skipped = 0;
}

int ferry_loss_scaler_update(ferry_loss_scaler *s, int found_nonfinite) {
  if (!s) return 0;
  if (found_nonfinite) {
    s->scale *= s->backoff;
    if (s->scale < 1e-30f) s->scale = 1e-30f;
    s->good_steps = 0;
    s->skipped++;
    return 1;
  }
  if (++s->good_steps >= s->interval) {
    float next = s->scale * s->growth;
    if (isfinite(next)) s->scale = next;
    s->good_steps = 0;
  }
  return 0;
}
