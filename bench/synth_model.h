/* bench/synth_model.h — the synthetic model the engine is tested and
 * benchmarked with: a stack of G square linear layers (y = x W, no bias)
 * and a squared-error loss, forward and backward run as host-backend stream
 * kernels on the params the engine fetched. Params and grads on the device
 * have the engine's dtype (fp32, fp16 or bf16); activations are the test's.
 * synth_micro_batch runs the kernels on the device buffers (host backend
 * only); synth_micro_batch_staged copies through pinned host buffers, so it
 * runs on cuda too.
 */
#ifndef FERRY_BENCH_SYNTH_MODEL_H
#define FERRY_BENCH_SYNTH_MODEL_H

#include "core/dtype.h"
#include "ferry.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int groups, dim, batch;
  int dtype; /* FERRY_DT_F32 / _F16 / _BF16: the engine's precision.params */
  float *act;    /* (groups + 1) x batch x dim activations */
  float *dact;   /* batch x dim, the running d(loss)/d(activation) */
  float *dnext;  /* batch x dim scratch */
  float *input, *target;
  double loss;
  float loss_scale;
} synth_model;

typedef struct {
  synth_model *m;
  int g;
  void *w, *gw; /* device param and grad of layer g */
} synth_call;

static inline float synth_get(const void *p, int dt, size_t i) { return ferry_dt_load(p, dt, i); }
static inline void synth_put(void *p, int dt, size_t i, float x) { ferry_dt_store(p, dt, i, x); }

static inline int synth_forward_kernel(void *arg) {
  synth_call *c = arg;
  synth_model *m = c->m;
  int d = m->dim, B = m->batch;
  const float *x = m->act + (size_t)c->g * B * d;
  float *y = m->act + (size_t)(c->g + 1) * B * d;
  for (int b = 0; b < B; b++)
    for (int j = 0; j < d; j++) {
      float acc = 0;
      for (int k = 0; k < d; k++) acc += x[b * d + k] * synth_get(c->w, m->dtype, (size_t)k * d + j);
      y[b * d + j] = acc;
    }
  return 0;
}

/* Loss 0.5 * mean((y - t)^2) over batch*dim; dact = loss_scale * dL/dy. */
static inline int synth_loss_kernel(void *arg) {
  synth_model *m = arg;
  size_t n = (size_t)m->batch * m->dim;
  const float *y = m->act + (size_t)m->groups * n;
  double l = 0;
  for (size_t i = 0; i < n; i++) {
    float e = y[i] - m->target[i];
    l += 0.5 * (double)e * e;
    m->dact[i] = m->loss_scale * e / (float)n;
  }
  m->loss = l / (double)n;
  return 0;
}

static inline int synth_backward_kernel(void *arg) {
  synth_call *c = arg;
  synth_model *m = c->m;
  int d = m->dim, B = m->batch;
  const float *x = m->act + (size_t)c->g * B * d;
  /* dW = x^T dY, dX = dY W^T */
  for (int k = 0; k < d; k++)
    for (int j = 0; j < d; j++) {
      float acc = 0;
      for (int b = 0; b < B; b++) acc += x[b * d + k] * m->dact[b * d + j];
      synth_put(c->gw, m->dtype, (size_t)k * d + j, acc);
    }
  for (int b = 0; b < B; b++)
    for (int k = 0; k < d; k++) {
      float acc = 0;
      for (int j = 0; j < d; j++) acc += m->dact[b * d + j] * synth_get(c->w, m->dtype, (size_t)k * d + j);
      m->dnext[b * d + k] = acc;
    }
  memcpy(m->dact, m->dnext, sizeof(float) * (size_t)B * d);
  return 0;
}

static inline unsigned long long synth_rng(unsigned long long *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}
static inline float synth_uniform(unsigned long long *s) {
  return (float)((synth_rng(s) >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static inline int synth_init(synth_model *m, int groups, int dim, int batch, int dtype) {
  memset(m, 0, sizeof *m);
  m->groups = groups;
  m->dim = dim;
  m->batch = batch;
  m->dtype = dtype;
  size_t n = (size_t)batch * dim;
  m->act = calloc((size_t)(groups + 1) * n, sizeof(float));
  m->dact = calloc(n, sizeof(float));
  m->dnext = calloc(n, sizeof(float));
  m->target = calloc(n, sizeof(float));
  m->loss_scale = 1;
  if (!m->act || !m->dact || !m->dnext || !m->target) return -1;
  m->input = m->act;
  return 0;
}

static inline void synth_free(synth_model *m) {
  free(m->act);
  free(m->dact);
  free(m->dnext);
  free(m->target);
}

/* A batch: input ~ U(-1, 1); target = a fixed smooth function of it. */
static inline void synth_batch(synth_model *m, unsigned long long seed) {
  size_t n = (size_t)m->batch * m->dim;
  unsigned long long s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; i++) m->input[i] = synth_uniform(&s);
  for (int b = 0; b < m->batch; b++)
    for (int j = 0; j < m->dim; j++)
      m->target[b * m->dim + j] = 0.5f * sinf(2.0f * m->input[b * m->dim + (j * 7 + 3) % m->dim]);
}

/* Deterministic initial weights of layer g (ferry_init_fn). */
static inline int synth_init_weights(void *user, const char *name, float *v, size_t count) {
  (void)name;
  int g = (int)(intptr_t)user;
  unsigned long long s = 0xC0FFEEull + (unsigned long long)g * 7919;
  float scale = sqrtf(3.0f) / sqrtf(sqrtf((float)count)); /* std 1/sqrt(dim): gain ~1 */
  for (size_t i = 0; i < count; i++) v[i] = synth_uniform(&s) * scale;
  return 0;
}

#define SYNTH_TRY(call)                                                                        \
  do {                                                                                         \
    int rc_ = (call);                                                                          \
    if (rc_) {                                                                                 \
      fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call, ferry_strerror(rc_),   \
              ferry_engine_last_error(e));                                                     \
      return rc_;                                                                              \
    }                                                                                          \
  } while (0)

/* Registers layer g's weight "layer<g>.w" in group g. */
static inline int synth_register(ferry_engine *e, synth_model *m) {
  for (int g = 0; g < m->groups; g++) {
    char name[32];
    snprintf(name, sizeof name, "layer%d.w", g);
    int64_t shape[2] = {m->dim, m->dim};
    SYNTH_TRY(ferry_param_register(e, name, shape, 2, g, NULL, synth_init_weights,
                                   (void *)(intptr_t)g));
  }
  return 0;
}

/* Pinned host copies of one layer's param and grad: the staged micro-batch
 * copies each param down before its host kernel and the grad up after, so
 * the kernels never touch device memory (on cuda a host function must not). */
typedef struct {
  ferry_device *dev;
  void *w, *gw;
  size_t bytes; /* one layer's param in the engine's dtype */
} synth_stage;

static inline int synth_stage_open(synth_stage *st, ferry_device *dev, const synth_model *m) {
  memset(st, 0, sizeof *st);
  st->dev = dev;
  st->bytes = (size_t)m->dim * m->dim * ferry_dtype_size((ferry_dtype)m->dtype);
  int rc = ferry_host_alloc(dev, st->bytes, &st->w);
  if (!rc) rc = ferry_host_alloc(dev, st->bytes, &st->gw);
  return rc;
}

static inline void synth_stage_close(synth_stage *st) {
  if (st->w) ferry_host_free(st->dev, st->w);
  if (st->gw) ferry_host_free(st->dev, st->gw);
  st->w = st->gw = NULL;
}

/* Layer g's forward on the staged copy of its param (stream order: the copy
 * down, the kernel, then the next layer's copy reuses the buffer). */
static inline int synth_forward_staged(ferry_engine *e, synth_model *m, ferry_stream *s,
                                       const synth_stage *st, synth_call *c, int g) {
  char name[32];
  snprintf(name, sizeof name, "layer%d.w", g);
  void *w;
  c->m = m;
  c->g = g;
  c->w = st->w;
  c->gw = NULL;
  SYNTH_TRY(ferry_fetch(e, g, s));
  SYNTH_TRY(ferry_param_device(e, name, &w, NULL));
  SYNTH_TRY(ferry_memcpy_async(s, st->w, w, st->bytes, FERRY_COPY_D2H));
  SYNTH_TRY(ferry_launch_host_func(s, synth_forward_kernel, c));
  SYNTH_TRY(ferry_release(e, g, s));
  return 0;
}

/* Layer g's backward: param down, kernel into the staged grad, grad up. */
static inline int synth_backward_staged(ferry_engine *e, synth_model *m, ferry_stream *s,
                                        const synth_stage *st, synth_call *c, int g) {
  char name[32];
  snprintf(name, sizeof name, "layer%d.w", g);
  void *w, *gw;
  c->m = m;
  c->g = g;
  c->w = st->w;
  c->gw = st->gw;
  SYNTH_TRY(ferry_fetch(e, g, s));
  SYNTH_TRY(ferry_param_device(e, name, &w, &gw));
  SYNTH_TRY(ferry_memcpy_async(s, st->w, w, st->bytes, FERRY_COPY_D2H));
  SYNTH_TRY(ferry_launch_host_func(s, synth_backward_kernel, c));
  SYNTH_TRY(ferry_memcpy_async(s, gw, st->gw, st->bytes, FERRY_COPY_H2D));
  SYNTH_TRY(ferry_grads_ready(e, g, s));
  SYNTH_TRY(ferry_release(e, g, s));
  return 0;
}

/* synth_micro_batch through host copies (synth_stage): the same numbers on
 * either backend, with every device byte moved by ferry_memcpy_async. */
static inline int synth_micro_batch_staged(ferry_engine *e, synth_model *m, ferry_stream *s,
                                           const synth_stage *st, synth_call *calls) {
  m->loss_scale = ferry_loss_scale(e);
  for (int g = 0; g < m->groups; g++) {
    int rc = synth_forward_staged(e, m, s, st, &calls[g], g);
    if (rc) return rc;
  }
  SYNTH_TRY(ferry_launch_host_func(s, synth_loss_kernel, m));
  for (int g = m->groups - 1; g >= 0; g--) {
    int rc = synth_backward_staged(e, m, s, st, &calls[m->groups + g], g);
    if (rc) return rc;
  }
  return ferry_stream_synchronize(s);
}

/* One micro-batch: forward, loss, backward; grads handed to the engine. */
static inline int synth_micro_batch(ferry_engine *e, synth_model *m, ferry_stream *s,
                                    synth_call *calls /* 2 * groups: forward, backward */) {
  m->loss_scale = ferry_loss_scale(e);
  for (int g = 0; g < m->groups; g++) {
    char name[32];
    snprintf(name, sizeof name, "layer%d.w", g);
    SYNTH_TRY(ferry_fetch(e, g, s));
    calls[g].m = m;
    calls[g].g = g;
    SYNTH_TRY(ferry_param_device(e, name, &calls[g].w, NULL));
    SYNTH_TRY(ferry_launch_host_func(s, synth_forward_kernel, &calls[g]));
    SYNTH_TRY(ferry_release(e, g, s));
  }
  SYNTH_TRY(ferry_launch_host_func(s, synth_loss_kernel, m));
  for (int g = m->groups - 1; g >= 0; g--) {
    char name[32];
    snprintf(name, sizeof name, "layer%d.w", g);
    synth_call *c = &calls[m->groups + g]; /* the forward's may not have run yet */
    c->m = m;
    c->g = g;
    SYNTH_TRY(ferry_fetch(e, g, s));
    SYNTH_TRY(ferry_param_device(e, name, &c->w, &c->gw));
    SYNTH_TRY(ferry_launch_host_func(s, synth_backward_kernel, c));
    SYNTH_TRY(ferry_grads_ready(e, g, s));
    SYNTH_TRY(ferry_release(e, g, s));
  }
  return ferry_stream_synchronize(s);
}

#endif
