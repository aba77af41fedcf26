/* examples/gpt/provider_engine.c — the parameter provider over a ferry
 * engine: registration of the schema (one group per block, embeddings and
 * head), initial values through the init callback, fetch/release/grads
 * ready per group on the provider's stream, and the two per-group fp32
 * grad slots: in sync mode host scratch that lets the fp32 CPU model run
 * over bf16 / fp16 engine params, in stream mode device accumulators the
 * model adds into in stream order (gpt.h describes both modes).
 */
#include "gpt.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

enum { SLOT_EMB = 0, SLOT_OTHER = 1, NSLOTS = 2 };

#define ALIGN256(x) (((x) + (size_t)255) & ~(size_t)255)

struct gpt_engine {
  const gpt_schema *s;
  ferry_engine *e;
  ferry_stream *st;
  ferry_dtype dtype; /* of the engine params: F32, F16 or BF16 */
  gpt_engine_mode mode;
  ferry_comm *comm; /* the ranks, or NULL (set before finalize) */
  int micro;
  gpt_weights_src *src; /* during finalize */
  int init_failed;
  void **dw, **dg;  /* per param: device pointers of the current fetch */
  size_t *goff;     /* per param: offset within its group */
  size_t *gnum;     /* per group: elements */
  int *fetched;     /* per group: fetches not yet released */
  int *grads_open;  /* per group: grads taking contributions in this micro-batch */
  /* the fp32 slots. sync mode (16-bit params only): host memory, weights
   * [0, cap) then grads [cap, 2 cap); stream mode: device memory in the
   * reserved block, grads [0, cap) */
  float *scratch[NSLOTS];
  size_t cap[NSLOTS];
  int owner[NSLOTS]; /* group in the slot, or -1 */
  int valid[NSLOTS]; /* sync: the slot's weights equal the owner's params (no step since) */
  void *model_base;  /* stream mode: the model's part of the reserved block */
  size_t model_bytes;
  char err[768];
};

__attribute__((format(printf, 2, 3))) static int fail(gpt_engine *ge, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ge->err, sizeof ge->err, fmt, ap);
  va_end(ap);
  return -1;
}

static int slot_of(int group) { return group == 0 ? SLOT_EMB : SLOT_OTHER; }

/* The name of a ferry status, for messages a user may search for. */
static const char *status_name(int rc) {
  static const char *names[] = {"FERRY_OK",     "FERRY_EINVAL",  "FERRY_ENOMEM",  "FERRY_ENODEV",
                                "FERRY_EIO",    "FERRY_ENOSPC",  "FERRY_ECORRUPT", "FERRY_EAGAIN",
                                "FERRY_ENOTSUP", "FERRY_ECONFIG", "FERRY_EBUSY",   "FERRY_ESTATE",
                                "FERRY_ENOENT", "FERRY_EPERM",   "FERRY_EOVERFLOW",
                                "FERRY_ETIMEDOUT", "FERRY_ECANCELED"};
  int i = -rc;
  return i >= 0 && i < (int)(sizeof names / sizeof names[0]) ? names[i] : "FERRY_E?";
}

static int init_cb(void *user, const char *name, float *values, size_t count) {
  gpt_engine *ge = user;
  const gpt_param *q = gpt_schema_find(ge->s, name);
  if (!q || q->numel != count) {
    fail(ge, "init: '%s' is not a tensor of the model", name);
    ge->init_failed = 1;
    return -1;
  }
  char err[512];
  if (gpt_weights_src_fill(ge->src, (int)(q - ge->s->params), values, err, sizeof err)) {
    fail(ge, "init of '%s': %s", name, err);
    ge->init_failed = 1;
    return -1;
  }
  return 0;
}

static int config_int(const ferry_config *cfg, const char *key, long *out) {
  char b[64];
  if (ferry_config_get(cfg, key, b, sizeof b)) return -1;
  char *end;
  *out = strtol(b, &end, 10);
  return *end ? -1 : 0;
}

ferry_dtype gpt_engine_config_dtype(const ferry_config *cfg) {
  char prec[32];
  if (ferry_config_get(cfg, "precision.params", prec, sizeof prec)) return FERRY_DT_NONE;
  return !strcmp(prec, "fp32")   ? FERRY_DT_F32
         : !strcmp(prec, "fp16") ? FERRY_DT_F16
                                 : FERRY_DT_BF16;
}

/* The engine and its device; sync mode needs the emulated one. */
static int open_engine(gpt_engine *ge, const ferry_config *cfg, ferry_device *dev) {
  int rc = ferry_engine_create(cfg, dev, &ge->e);
  if (rc) return fail(ge, "%s (%s)", ferry_last_error(), status_name(rc));
  ferry_device_info di;
  rc = ferry_device_get_info(ferry_engine_device(ge->e), &di);
  if (rc) return fail(ge, "device info: %s", status_name(rc));
  if (ge->mode == GPT_ENGINE_SYNC && !di.emulated)
    return fail(ge, "the engine's device is %s, but the CPU model reads its params in host "
                "memory: use device = \"host\" for --device cpu, or --device cuda to compute "
                "with the CUDA model on this device", di.name);
  return 0;
}

/* Per-param and per-group tables, the slots' capacities and, in sync mode
 * with 16-bit params, the host scratch. */
static int alloc_tables(gpt_engine *ge) {
  const gpt_schema *s = ge->s;
  size_t np = (size_t)s->n_params, ng = (size_t)s->n_groups;
  ge->dw = calloc(np, sizeof *ge->dw);
  ge->dg = calloc(np, sizeof *ge->dg);
  ge->goff = calloc(np, sizeof *ge->goff);
  ge->gnum = calloc(ng, sizeof *ge->gnum);
  ge->fetched = calloc(ng, sizeof *ge->fetched);
  ge->grads_open = calloc(ng, sizeof *ge->grads_open);
  if (!ge->dw || !ge->dg || !ge->goff || !ge->gnum || !ge->fetched || !ge->grads_open)
    return fail(ge, "out of memory");
  for (int g = 0; g < s->n_groups; g++) {
    size_t n = 0;
    for (int i = s->group_first[g]; i < s->group_first[g + 1]; i++) {
      ge->goff[i] = n;
      n += s->params[i].numel;
    }
    ge->gnum[g] = n;
    if (n > ge->cap[slot_of(g)]) ge->cap[slot_of(g)] = n;
  }
  for (int k = 0; k < NSLOTS; k++) {
    ge->owner[k] = -1;
    if (ge->mode != GPT_ENGINE_SYNC || ge->dtype == FERRY_DT_F32 || !ge->cap[k]) continue;
    ge->scratch[k] = malloc(2 * ge->cap[k] * sizeof(float));
    if (!ge->scratch[k])
      return fail(ge, "out of memory for the fp32 scratch (%zu floats)", 2 * ge->cap[k]);
  }
  return 0;
}

/* Stream mode: bytes of [model | embedding slot | other slot]. */
static size_t reserve_bytes(const gpt_engine *ge) {
  if (ge->mode != GPT_ENGINE_STREAM) return 0;
  size_t b = ALIGN256(ge->model_bytes);
  for (int k = 0; k < NSLOTS; k++) b += ALIGN256(ge->cap[k] * sizeof(float));
  return b;
}

/* Stream mode, after finalize: the model's part and the slots out of the
 * engine's reserved block. */
static int carve_reserved(gpt_engine *ge) {
  size_t want = reserve_bytes(ge);
  if (!want) return 0;
  void *base = NULL;
  size_t got = 0;
  int rc = ferry_engine_reserved(ge->e, &base, &got);
  if (rc) return fail(ge, "reserved block: %s (%s)", ferry_engine_last_error(ge->e), status_name(rc));
  if (!base || got < want)
    return fail(ge, "reserved block: %zu bytes, %zu wanted", got, want);
  char *p = base;
  ge->model_base = ge->model_bytes ? p : NULL;
  p += ALIGN256(ge->model_bytes);
  for (int k = 0; k < NSLOTS; k++) {
    ge->scratch[k] = ge->cap[k] ? (float *)p : NULL;
    p += ALIGN256(ge->cap[k] * sizeof(float));
  }
  return 0;
}

/* The engine's cancel (ferry_engine_set_cancel): the set-up is cancelled
 * (gpt_set_cancel). Test hook: $FERRY_GPT_TEST_SLOW_CANCEL=S makes each ask
 * take S seconds first, as a piece of a slow zeroing would. */
static double g_ask_delay;

static int engine_cancel(void *user) {
  (void)user;
  if (g_ask_delay > 0) {
    time_t whole = (time_t)g_ask_delay;
    struct timespec ts = {whole, (long)((g_ask_delay - (double)whole) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) continue; /* a signal does not shorten it */
  }
  return gpt_cancelled();
}

/* Registration, the reservation (stream mode), the cancel, finalize, the
 * stream. */
static int build_engine(gpt_engine *ge) {
  const gpt_schema *s = ge->s;
  const char *delay = getenv("FERRY_GPT_TEST_SLOW_CANCEL");
  g_ask_delay = delay ? atof(delay) : 0;
  int rc = ferry_engine_set_cancel(ge->e, engine_cancel, NULL);
  for (int i = 0; i < s->n_params && !rc; i++) {
    const gpt_param *q = &s->params[i];
    rc = ferry_param_register(ge->e, q->name, q->shape, q->ndim, q->group, NULL, init_cb, ge);
  }
  size_t want = reserve_bytes(ge);
  if (!rc && want) rc = ferry_engine_reserve(ge->e, want);
  if (!rc && ge->comm) rc = ferry_engine_set_comm(ge->e, ge->comm);
  if (!rc) rc = ferry_engine_finalize(ge->e);
  ge->src = NULL;
  if (rc)
    return ge->init_failed && rc != FERRY_ECANCELED
               ? -1
               : fail(ge, "%s (%s)", ferry_engine_last_error(ge->e), status_name(rc));
  if (carve_reserved(ge)) return -1;
  rc = ferry_stream_create(ferry_engine_device(ge->e), &ge->st);
  if (rc)
    return fail(ge, "stream: %s (%s)", ferry_device_last_error(ferry_engine_device(ge->e)),
                status_name(rc));
  return 0;
}

int gpt_engine_create(const gpt_schema *s, const ferry_config *cfg, ferry_device *dev,
                      gpt_weights_src *src, const gpt_engine_options *opt, gpt_engine **out,
                      char *err, size_t el) {
  *out = NULL;
  gpt_engine *ge = calloc(1, sizeof *ge);
  if (!ge) return snprintf(err, el, "out of memory"), -1;
  ge->s = s;
  ge->src = src;
  ge->mode = opt ? opt->mode : GPT_ENGINE_SYNC;
  ge->model_bytes = opt && opt->mode == GPT_ENGINE_STREAM ? opt->model_bytes : 0;
  ge->comm = opt ? opt->comm : NULL;
  long micro = 1;
  ge->dtype = gpt_engine_config_dtype(cfg);
  int bad = ge->dtype == FERRY_DT_NONE || config_int(cfg, "grad_accumulation", &micro);
  if (bad) fail(ge, "engine config: %s", ferry_config_last_error(cfg));
  ge->micro = (int)micro;
  if (bad || open_engine(ge, cfg, dev) || alloc_tables(ge) || build_engine(ge)) {
    snprintf(err, el, "%s", ge->err);
    gpt_engine_free(ge);
    return -1;
  }
  *out = ge;
  return 0;
}

void gpt_engine_free(gpt_engine *ge) {
  if (!ge) return;
  if (ge->st) ferry_stream_destroy(ge->st);
  ferry_engine_destroy(ge->e);
  if (ge->mode == GPT_ENGINE_SYNC)
    for (int k = 0; k < NSLOTS; k++) free(ge->scratch[k]);
  free(ge->dw), free(ge->dg), free(ge->goff), free(ge->gnum), free(ge->fetched);
  free(ge->grads_open);
  free(ge);
}

ferry_engine *gpt_engine_handle(gpt_engine *ge) { return ge->e; }
ferry_stream *gpt_engine_stream(gpt_engine *ge) { return ge->st; }
ferry_dtype gpt_engine_dtype(const gpt_engine *ge) { return ge->dtype; }
int gpt_engine_micro_batches(const gpt_engine *ge) { return ge->micro; }

void gpt_engine_model_memory(gpt_engine *ge, void **base, size_t *bytes) {
  *base = ge->model_base;
  *bytes = ge->model_base ? ge->model_bytes : 0;
}

size_t gpt_engine_scratch_bytes(const gpt_engine *ge) {
  size_t b = 0, per = ge->mode == GPT_ENGINE_SYNC ? 2 : 1;
  for (int k = 0; k < NSLOTS; k++)
    if (ge->scratch[k]) b += per * ge->cap[k] * sizeof(float);
  return b;
}

int gpt_engine_step(gpt_engine *ge, ferry_step_info *info) {
  for (int k = 0; k < NSLOTS; k++) ge->valid[k] = 0;
  return ferry_step(ge->e, info);
}

int gpt_engine_read(void *user, int i, float *dst) {
  gpt_engine *ge = user;
  const gpt_param *q = &ge->s->params[i];
  return ferry_param_read(ge->e, q->name, dst, q->numel);
}

/* The engine's message and its status (a rank that stopped answering
 * shows as FERRY_ETIMEDOUT). */
static int eng_err(gpt_engine *ge, const char *op, int group, int rc) {
  return fail(ge, "%s of group %d: %s (%s: %s)", op, group, ferry_engine_last_error(ge->e),
              status_name(rc), ferry_strerror(rc));
}

static int dev_err(gpt_engine *ge, const char *op, int group) {
  return fail(ge, "%s of group %d: stream: %s", op, group,
              ferry_device_last_error(ferry_engine_device(ge->e)));
}

/* Sync mode, once the group's params are on the device and the stream is
 * drained: the view over the engine's fp32 buffers, or over the fp32
 * scratch (16-bit params converted on this thread). */
static void view_sync(gpt_engine *ge, int group, int back, gpt_group_view *out) {
  const gpt_schema *s = ge->s;
  int k = slot_of(group), first = s->group_first[group], last = s->group_first[group + 1];
  if (ge->dtype == FERRY_DT_F32) {
    for (int i = first; i < last; i++) {
      out->w[s->params[i].slot] = ge->dw[i];
      out->g[s->params[i].slot] = back ? ge->dg[i] : NULL;
    }
    return;
  }
  float *w = ge->scratch[k], *g = w + ge->cap[k];
  if (ge->owner[k] != group || !ge->valid[k]) {
    for (int i = first; i < last; i++)
      ferry_dtype_convert(w + ge->goff[i], FERRY_DT_F32, ge->dw[i], ge->dtype,
                          s->params[i].numel, 1.0f);
    ge->owner[k] = group;
    ge->valid[k] = 1;
  }
  if (back && !ge->grads_open[group]) /* the model adds into its grads */
    memset(g, 0, ge->gnum[group] * sizeof *g);
  for (int i = first; i < last; i++) {
    out->w[s->params[i].slot] = w + ge->goff[i];
    out->g[s->params[i].slot] = back ? g + ge->goff[i] : NULL;
  }
}

static int fetch_sync(gpt_engine *ge, int group, int back, gpt_group_view *out) {
  const gpt_schema *s = ge->s;
  int direct = ge->dtype == FERRY_DT_F32, o = ge->owner[slot_of(group)];
  if (!direct && o >= 0 && o != group && (ge->fetched[o] > 0 || ge->grads_open[o]))
    return fail(ge, "fetch of group %d: group %d still holds the fp32 scratch", group, o);
  int rc = ferry_fetch(ge->e, group, ge->st);
  if (rc) return eng_err(ge, "fetch", group, rc);
  for (int i = s->group_first[group]; i < s->group_first[group + 1]; i++)
    if ((rc = ferry_param_device(ge->e, s->params[i].name, &ge->dw[i],
                                 direct && back ? &ge->dg[i] : NULL)))
      return eng_err(ge, "fetch", group, rc);
  /* the fetch (and the grad buffers' zeroing) are ordered on the stream;
   * the CPU model computes here, on this thread */
  if (ferry_stream_synchronize(ge->st)) return dev_err(ge, "fetch", group);
  out->wdt = FERRY_DT_F32;
  view_sync(ge, group, back, out);
  return 0;
}

/* Stream mode: the engine's param buffers in their dtype and the group's
 * fp32 grad slot, zeroed on the stream at the group's first backward fetch
 * of the micro-batch. Nothing here waits for the device. */
static int fetch_stream(gpt_engine *ge, int group, int back, gpt_group_view *out) {
  const gpt_schema *s = ge->s;
  int k = slot_of(group), first = s->group_first[group], last = s->group_first[group + 1];
  int o = ge->owner[k];
  if (back && o >= 0 && o != group && ge->grads_open[o])
    return fail(ge, "fetch of group %d: group %d's grads still hold the grad slot", group, o);
  int rc = ferry_fetch(ge->e, group, ge->st);
  if (rc) return eng_err(ge, "fetch", group, rc);
  for (int i = first; i < last; i++)
    if ((rc = ferry_param_device(ge->e, s->params[i].name, &ge->dw[i], NULL)))
      return eng_err(ge, "fetch", group, rc);
  float *g = ge->scratch[k];
  if (back && !ge->grads_open[group]) {
    /* in stream order after the last owner's conversion (hand_in_stream):
     * one stream, so the slot is never cleared before it was read */
    if (ferry_memset_async(ge->st, g, 0, ge->gnum[group] * sizeof *g))
      return dev_err(ge, "grad slot zeroing", group);
    ge->owner[k] = group;
  }
  out->wdt = ge->dtype;
  for (int i = first; i < last; i++) {
    out->w[s->params[i].slot] = ge->dw[i];
    out->g[s->params[i].slot] = back ? g + ge->goff[i] : NULL;
  }
  return 0;
}

static int ep_fetch(void *ctx, int group, gpt_fetch_mode mode, gpt_group_view *out) {
  gpt_engine *ge = ctx;
  if (group < 0 || group >= ge->s->n_groups) return fail(ge, "fetch: no group %d", group);
  if (mode == GPT_FETCH_WRITE)
    return fail(ge, "fetch for writing: the engine takes initial values at finalize "
                "(gpt_weights_src)");
  int back = mode == GPT_FETCH_BACKWARD;
  memset(out, 0, sizeof *out);
  if (ge->mode == GPT_ENGINE_STREAM ? fetch_stream(ge, group, back, out)
                                    : fetch_sync(ge, group, back, out))
    return -1;
  if (back) ge->grads_open[group] = 1;
  ge->fetched[group]++;
  return 0;
}

/* Sync mode, 16-bit params: the fp32 grads of the scratch, times the loss
 * scale, into the engine's grad buffers (param dtype). */
static int hand_in_scratch(gpt_engine *ge, int group) {
  const gpt_schema *s = ge->s;
  int k = slot_of(group), first = s->group_first[group], last = s->group_first[group + 1];
  int rc;
  for (int i = first; i < last; i++)
    if ((rc = ferry_param_device(ge->e, s->params[i].name, NULL, &ge->dg[i])))
      return eng_err(ge, "grads", group, rc);
  if (ferry_stream_synchronize(ge->st)) /* the buffers' zeroing is on the stream */
    return dev_err(ge, "grads", group);
  const float *g = ge->scratch[k] + ge->cap[k];
  float scale = ferry_loss_scale(ge->e);
  for (int i = first; i < last; i++)
    ferry_dtype_convert(ge->dg[i], ge->dtype, g + ge->goff[i], FERRY_DT_F32,
                        s->params[i].numel, scale);
  return 0;
}

/* Stream mode: the same conversion enqueued on the stream, after the
 * model's last contribution to the slot and before the next group's
 * zeroing of it. */
static int hand_in_stream(gpt_engine *ge, int group) {
  const gpt_schema *s = ge->s;
  int k = slot_of(group), first = s->group_first[group], last = s->group_first[group + 1];
  int rc;
  const float *g = ge->scratch[k];
  float scale = ferry_loss_scale(ge->e);
  for (int i = first; i < last; i++) {
    if ((rc = ferry_param_device(ge->e, s->params[i].name, NULL, &ge->dg[i])))
      return eng_err(ge, "grads", group, rc);
    if (ferry_convert_async(ge->st, ge->dg[i], ge->dtype, g + ge->goff[i], FERRY_DT_F32,
                            s->params[i].numel, scale))
      return dev_err(ge, "grads", group);
  }
  return 0;
}

static int ep_release(void *ctx, int group, gpt_release_mode mode) {
  gpt_engine *ge = ctx;
  if (group < 0 || group >= ge->s->n_groups || ge->fetched[group] <= 0)
    return fail(ge, "release of group %d, which is not fetched", group);
  if (mode == GPT_RELEASE_WRITTEN)
    return fail(ge, "release after writing: the engine provider is not written to");
  if (mode == GPT_RELEASE_GRADS) {
    /* the group's last contribution of this micro-batch: hand it in once */
    if (!ge->grads_open[group])
      return fail(ge, "grads of group %d released without a backward fetch", group);
    if (ge->mode == GPT_ENGINE_STREAM ? hand_in_stream(ge, group)
                                      : ge->dtype != FERRY_DT_F32 && hand_in_scratch(ge, group))
      return -1;
    int rc = ferry_grads_ready(ge->e, group, ge->st);
    if (rc) return eng_err(ge, "grads ready", group, rc);
    ge->grads_open[group] = 0;
  }
  /* GPT_RELEASE_PARTIAL: the grads stay open (the slot keeps the group's
   * fp32 grads) for the last fetch */
  int rc = ferry_release(ge->e, group, ge->st);
  if (rc) return eng_err(ge, "release", group, rc);
  ge->fetched[group]--;
  return 0;
}
static int ep_zero(void *ctx) {
  gpt_engine *ge = ctx;
  /* the engine zeroes its grads itself (per micro-batch buffers, and the
   * fp32 accumulators at each step); nothing may be open between passes */
  for (int g = 0; g < ge->s->n_groups; g++)
    if (ge->grads_open[g]) return fail(ge, "zero grads: group %d's grads were never handed in", g);
  return 0;
}

static const char *ep_err(void *ctx) { return ((gpt_engine *)ctx)->err; }

gpt_provider gpt_engine_provider(gpt_engine *ge) {
  gpt_provider p = {ge, ep_fetch, ep_release, ep_zero, ep_err};
  return p;
}

int gpt_engine_save(gpt_engine *ge, const char *dir, const void *blob, size_t len, int keep,
                    char *err, size_t el) {
  ferry_checkpoint_options o = ferry_checkpoint_options_default();
  o.keep = keep;
  char b[4096];
  if ((size_t)snprintf(b, sizeof b, "%s", dir) >= sizeof b) {
    snprintf(err, el, "%s: path too long", dir);
    return FERRY_EOVERFLOW;
  }
  /* the engine makes dir itself, not its parents */
  for (char *q = b + 1; *q; q++) {
    if (*q != '/') continue;
    *q = '\0';
    mkdir(b, 0777); /* an existing one is fine; a real failure shows in the save */
    *q = '/';
  }
  int rc = ferry_checkpoint_save(ge->e, dir, blob, len, &o);
  if (rc) snprintf(err, el, "%s", ferry_engine_last_error(ge->e));
  return rc;
}

int gpt_engine_load(gpt_engine *ge, const char *path, void *blob, size_t cap, size_t *len,
                    char *err, size_t el) {
  for (int k = 0; k < NSLOTS; k++) ge->owner[k] = -1, ge->valid[k] = 0;
  int rc = ferry_checkpoint_load(ge->e, path, blob, cap, len);
  if (rc) snprintf(err, el, "%s", ferry_engine_last_error(ge->e));
  return rc;
}
