/* device/device.c — the public device API: picks a backend, validates every
 * argument (null, sizes, pointers that are not this device's, double frees),
 * sub-allocates the device arena with a hard cap, tracks pinned blocks,
 * streams and events so destroy can drain and free them, then calls the
 * backend's slot. Also the reads other parts make through peer.h.
 */
#include "device/backend_impl.h"

#include "core/dtype.h"
#include "device/peer.h"
#include "device/probes.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEVICE_ALIGN 256

ferry_device_config ferry_device_config_default(void) {
  ferry_device_config c;
  memset(&c, 0, sizeof c);
  c.kind = FERRY_DEVICE_AUTO;
  return c;
}

static const char *kind_name(ferry_device_kind k) {
  switch (k) {
  case FERRY_DEVICE_AUTO: return "auto";
  case FERRY_DEVICE_HOST: return "host";
  case FERRY_DEVICE_CUDA: return "cuda";
  }
  return "?";
}

/* Errors before a device exists go to the process log, since there is no
 * object to hold them. */
static int create_fail(const ferry_device_config *cfg, int status, const char *msg) {
  ferry_logger lg = {cfg ? cfg->log : NULL, cfg ? cfg->log_user : NULL,
                     cfg ? cfg->log_level : 0};
  ferry_logf(&lg, FERRY_LOG_ERROR, "device: %s", msg);
  return ferry_err_thread(status, "device create: %s", msg);
}

int ferry_device_create(const ferry_device_config *cfg_in, ferry_device **out) {
  if (!out) return FERRY_EINVAL;
  *out = NULL;
  ferry_device_config cfg = cfg_in ? *cfg_in : ferry_device_config_default();
  ferry_logger lg = {cfg.log, cfg.log_user, cfg.log_level};
  const ferry_backend_ops *ops = NULL;
  char why[256] = "the CUDA backend was not compiled into this build";

  switch (cfg.kind) {
  case FERRY_DEVICE_HOST: ops = &ferry_backend_host; break;
  case FERRY_DEVICE_CUDA:
#ifdef FERRY_HAVE_CUDA
    ops = &ferry_backend_cuda;
    break;
#else
    return create_fail(&cfg, FERRY_ENOTSUP,
                       "device kind cuda requested, but the CUDA backend was not compiled "
                       "into this build (configure with -DFERRY_CUDA=ON)");
#endif
  case FERRY_DEVICE_AUTO:
#ifdef FERRY_HAVE_CUDA
    if (ferry_cuda_available(why, sizeof why)) {
      ops = &ferry_backend_cuda;
      break;
    }
#endif
    ops = &ferry_backend_host;
    ferry_logf(&lg, FERRY_LOG_INFO, "device auto: using the host backend (%s)", why);
    break;
  default: return create_fail(&cfg, FERRY_EINVAL, "unknown device kind");
  }
  if (ops == &ferry_backend_host && cfg.capacity == 0)
    return create_fail(&cfg, FERRY_EINVAL,
                       "the host backend needs a device capacity in bytes (capacity = 0)");

  ferry_device *dev = calloc(1, sizeof *dev);
  if (!dev) return FERRY_ENOMEM;
  dev->ops = ops;
  dev->cfg = cfg;
  dev->log = lg;
  ferry_errbuf_init(&dev->err);
  pthread_mutex_init(&dev->mu, NULL);
  int rc = ops->init(dev, &dev->base);
  if (rc == 0) rc = ferry_arena_init(&dev->arena, dev->cfg.capacity, DEVICE_ALIGN);
  if (rc) {
    char msg[FERRY_ERR_MAX + 64];
    snprintf(msg, sizeof msg, "%s backend: %s", ops->name, ferry_err_msg(&dev->err));
    if (dev->base || dev->impl) ops->shutdown(dev, dev->base);
    ferry_arena_destroy(&dev->arena);
    pthread_mutex_destroy(&dev->mu);
    ferry_errbuf_destroy(&dev->err);
    free(dev);
    return create_fail(&cfg, rc, msg);
  }
  dev->cfg.kind = ops == &ferry_backend_host ? FERRY_DEVICE_HOST : FERRY_DEVICE_CUDA;
  ferry_logf(&lg, FERRY_LOG_INFO, "device: %s backend, capacity %zu bytes (requested kind %s)",
             ops->name, dev->cfg.capacity, kind_name(cfg.kind));
  *out = dev;
  return FERRY_OK;
}

void ferry_device_destroy(ferry_device *dev) {
  if (!dev) return;
  /* Streams first: their queued work may still wait on events. */
  while (dev->streams) ferry_stream_destroy(dev->streams);
  while (dev->events) ferry_event_destroy(dev->events);
  if (dev->arena.nused)
    ferry_logf(&dev->log, FERRY_LOG_DEBUG, "device destroy: freeing %zu allocations (%zu bytes)",
               dev->arena.nused, dev->arena.used);
  while (dev->pinned) {
    ferry_pinned_block *p = dev->pinned;
    dev->pinned = p->next;
    dev->ops->host_free(dev, p->ptr, p->bytes);
    free(p);
  }
  dev->ops->shutdown(dev, dev->base);
  ferry_arena_destroy(&dev->arena);
  pthread_mutex_destroy(&dev->mu);
  ferry_errbuf_destroy(&dev->err);
  free(dev);
}

const char *ferry_device_last_error(const ferry_device *dev) {
  return dev ? ferry_err_msg(&dev->err) : "no device";
}

int ferry_device_get_info(ferry_device *dev, ferry_device_info *out) {
  if (!dev || !out) return FERRY_EINVAL;
  memset(out, 0, sizeof *out);
  dev->ops->info(dev, out);
  pthread_mutex_lock(&dev->mu);
  out->capacity = dev->arena.capacity;
  out->used = dev->arena.used;
  out->peak = dev->arena.peak;
  pthread_mutex_unlock(&dev->mu);
  out->kind = dev->cfg.kind;
  out->host_lock_pinned = dev->cfg.host_lock_pinned;
  return FERRY_OK;
}

ferry_device *ferry_stream_device(const ferry_stream *s) { return s->dev; }
ferry_device_kind ferry_device_backend(const ferry_device *dev) { return dev->cfg.kind; }
int ferry_device_cuda_ordinal(const ferry_device *dev) { return dev->cfg.cuda_ordinal; }

int ferry_device_alloc(ferry_device *dev, size_t bytes, void **ptr) {
  if (!dev) return FERRY_EINVAL;
  if (!ptr) return FERRY_DEV_ERR(dev, FERRY_EINVAL, "device alloc: ptr is NULL");
  *ptr = NULL;
  size_t off = 0;
  pthread_mutex_lock(&dev->mu);
  int rc = ferry_arena_alloc(&dev->arena, bytes, &off);
  size_t used = dev->arena.used, cap = dev->arena.capacity;
  size_t largest = rc ? ferry_arena_largest_free(&dev->arena) : 0;
  pthread_mutex_unlock(&dev->mu);
  if (rc)
    return FERRY_DEV_ERR(dev, rc,
                         "device alloc of %zu bytes failed: %zu of %zu bytes in use, largest "
                         "free block %zu bytes (%s backend)",
                         bytes, used, cap, largest, dev->ops->name);
  *ptr = dev->base + off;
  return FERRY_OK;
}

static int in_arena(const ferry_device *dev, const void *p) {
  const char *c = p;
  return c >= dev->base && c < dev->base + dev->arena.capacity;
}

int ferry_device_free(ferry_device *dev, void *ptr) {
  if (!dev) return FERRY_EINVAL;
  if (!ptr) return FERRY_OK;
  if (!in_arena(dev, ptr))
    return FERRY_DEV_ERR(dev, FERRY_EINVAL, "device free: %p is not memory of this device", ptr);
  pthread_mutex_lock(&dev->mu);
  int rc = ferry_arena_free(&dev->arena, (size_t)((char *)ptr - dev->base), NULL);
  pthread_mutex_unlock(&dev->mu);
  if (rc)
    return FERRY_DEV_ERR(dev, FERRY_EINVAL,
                         "device free: %p is not a live allocation (double free, or not the "
                         "start of a block)",
                         ptr);
  return FERRY_OK;
}

int ferry_host_alloc(ferry_device *dev, size_t bytes, void **ptr) {
  if (!dev) return FERRY_EINVAL;
  if (!ptr) return FERRY_DEV_ERR(dev, FERRY_EINVAL, "host alloc: ptr is NULL");
  *ptr = NULL;
  if (bytes == 0) bytes = 1;
  ferry_pinned_block *blk = malloc(sizeof *blk);
  if (!blk) return FERRY_DEV_ERR(dev, FERRY_ENOMEM, "host alloc: out of memory");
  int rc = dev->ops->host_alloc(dev, bytes, &blk->ptr);
  if (rc) {
    free(blk);
    return rc; /* the backend set the message */
  }
  blk->bytes = bytes;
  pthread_mutex_lock(&dev->mu);
  blk->next = dev->pinned;
  dev->pinned = blk;
  dev->pinned_bytes += bytes;
  pthread_mutex_unlock(&dev->mu);
  *ptr = blk->ptr;
  return FERRY_OK;
}

int ferry_host_free(ferry_device *dev, void *ptr) {
  if (!dev) return FERRY_EINVAL;
  if (!ptr) return FERRY_OK;
  pthread_mutex_lock(&dev->mu);
  ferry_pinned_block **pp = &dev->pinned;
  while (*pp && (*pp)->ptr != ptr) pp = &(*pp)->next;
  ferry_pinned_block *blk = *pp;
  if (blk) {
    *pp = blk->next;
    dev->pinned_bytes -= blk->bytes;
  }
  pthread_mutex_unlock(&dev->mu);
  if (!blk)
    return FERRY_DEV_ERR(dev, FERRY_EINVAL,
                         "host free: %p is not pinned memory of this device (double free?)", ptr);
  dev->ops->host_free(dev, blk->ptr, blk->bytes);
  free(blk);
  return FERRY_OK;
}

/* ---- streams ---------------------------------------------------------- */

/* A new stream object, made by the backend's stream_create (native NULL)
 * or stream_wrap, then put on the device's list. */
static int stream_add(ferry_device *dev, void *native, ferry_stream **out, const char *op) {
  if (!out) return FERRY_DEV_ERR(dev, FERRY_EINVAL, "%s: out is NULL", op);
  *out = NULL;
  ferry_stream *s = calloc(1, sizeof *s);
  if (!s) return FERRY_DEV_ERR(dev, FERRY_ENOMEM, "%s: out of memory", op);
  s->dev = dev;
  int rc = native ? dev->ops->stream_wrap(s, native) : dev->ops->stream_create(s);
  if (rc) {
    free(s);
    return rc;
  }
  pthread_mutex_lock(&dev->mu);
  s->next = dev->streams;
  if (dev->streams) dev->streams->prev = s;
  dev->streams = s;
  pthread_mutex_unlock(&dev->mu);
  *out = s;
  return FERRY_OK;
}

int ferry_stream_create(ferry_device *dev, ferry_stream **out) {
  if (!dev) return FERRY_EINVAL;
  return stream_add(dev, NULL, out, "stream create");
}

int ferry_stream_wrap(ferry_device *dev, void *native, ferry_stream **out) {
  if (!dev) return FERRY_EINVAL;
  if (out) *out = NULL;
  if (!native) return FERRY_DEV_ERR(dev, FERRY_EINVAL, "stream wrap: the native stream is NULL");
  return stream_add(dev, native, out, "stream wrap");
}

int ferry_stream_native(ferry_stream *s, void **out) {
  if (!s) return FERRY_EINVAL;
  if (!out) return FERRY_DEV_ERR(s->dev, FERRY_EINVAL, "stream native: out is NULL");
  *out = NULL;
  return s->dev->ops->stream_native(s, out);
}

int ferry_stream_destroy(ferry_stream *s) {
  if (!s) return FERRY_OK;
  ferry_device *dev = s->dev;
  int rc = dev->ops->stream_destroy(s);
  pthread_mutex_lock(&dev->mu);
  if (s->prev) s->prev->next = s->next;
  else dev->streams = s->next;
  if (s->next) s->next->prev = s->prev;
  pthread_mutex_unlock(&dev->mu);
  free(s);
  return rc;
}

/* Per thread, so a test counts the loop's own waits while the engine's
 * threads make theirs (device/probes.h). */
static _Thread_local uint64_t t_host_waits;

uint64_t ferry_device_host_waits(void) { return t_host_waits; }

int ferry_stream_synchronize(ferry_stream *s) {
  if (!s) return FERRY_EINVAL;
  t_host_waits++;
  return s->dev->ops->stream_synchronize(s);
}

int ferry_stream_query(ferry_stream *s) { return s ? s->dev->ops->stream_query(s) : FERRY_EINVAL; }

/* [p, p+n) must lie in one live device allocation. */
static int check_device_range(ferry_device *dev, const void *p, size_t n, const char *what,
                              const char *op) {
  int ok = 0;
  if (in_arena(dev, p)) {
    pthread_mutex_lock(&dev->mu);
    ok = ferry_arena_contains(&dev->arena, (size_t)((const char *)p - dev->base), n);
    pthread_mutex_unlock(&dev->mu);
  }
  if (!ok)
    return FERRY_DEV_ERR(dev, FERRY_EINVAL,
                         "%s: %s range %p + %zu bytes is not inside a live allocation of this "
                         "device",
                         op, what, p, n);
  return FERRY_OK;
}

static int check_host_range(ferry_device *dev, const void *p, size_t n, const char *what,
                            const char *op) {
  const char *c = p;
  if (c + n > dev->base && c < dev->base + dev->arena.capacity)
    return FERRY_DEV_ERR(dev, FERRY_EINVAL,
                         "%s: %s range %p + %zu bytes overlaps device memory; use a copy kind "
                         "with a device side",
                         op, what, p, n);
  return FERRY_OK;
}

int ferry_memcpy_async(ferry_stream *s, void *dst, const void *src, size_t bytes,
                       ferry_copy_kind kind) {
  if (!s) return FERRY_EINVAL;
  ferry_device *dev = s->dev;
  if (bytes == 0) return FERRY_OK;
  if (!dst || !src)
    return FERRY_DEV_ERR(dev, FERRY_EINVAL, "memcpy: %s pointer is NULL (%zu bytes)",
                         dst ? "src" : "dst", bytes);
  int rc = FERRY_OK;
  switch (kind) {
  case FERRY_COPY_H2D:
    if (!(rc = check_device_range(dev, dst, bytes, "dst", "memcpy H2D")))
      rc = check_host_range(dev, src, bytes, "src", "memcpy H2D");
    break;
  case FERRY_COPY_D2H:
    if (!(rc = check_device_range(dev, src, bytes, "src", "memcpy D2H")))
      rc = check_host_range(dev, dst, bytes, "dst", "memcpy D2H");
    break;
  case FERRY_COPY_D2D:
    if (!(rc = check_device_range(dev, src, bytes, "src", "memcpy D2D")))
      rc = check_device_range(dev, dst, bytes, "dst", "memcpy D2D");
    break;
  case FERRY_COPY_H2H:
    if (!(rc = check_host_range(dev, src, bytes, "src", "memcpy H2H")))
      rc = check_host_range(dev, dst, bytes, "dst", "memcpy H2H");
    break;
  default: return FERRY_DEV_ERR(dev, FERRY_EINVAL, "memcpy: unknown copy kind %d", (int)kind);
  }
  if (rc) return rc;
  return dev->ops->memcpy_async(s, dst, src, bytes, kind);
}

int ferry_memset_async(ferry_stream *s, void *dst, int value, size_t bytes) {
  if (!s) return FERRY_EINVAL;
  if (bytes == 0) return FERRY_OK;
  if (!dst) return FERRY_DEV_ERR(s->dev, FERRY_EINVAL, "memset: dst is NULL");
  int rc = check_device_range(s->dev, dst, bytes, "dst", "memset");
  if (rc) return rc;
  return s->dev->ops->memset_async(s, dst, value, bytes);
}

/* ---- conversion ------------------------------------------------------- */

/* Bytes per element of a dtype the converter takes (F32, F16, BF16); 0 for
 * any other. */
static size_t convert_size(ferry_dtype dt) {
  const ferry_dtype_traits *t = ferry_dtype_traits_of(dt);
  return t && t->convertible ? t->size : 0;
}

static const char *dt_name(ferry_dtype dt) {
  const char *n = ferry_dtype_name(dt);
  return n ? n : "an unknown dtype";
}

/* An operand of a conversion. On the host backend it lies in one live
 * allocation of the arena. On cuda it may also be device memory the caller
 * allocated (outside the arena); a range that touches the arena must still
 * lie in one live allocation of it. */
static int check_convert_range(ferry_device *dev, const void *p, size_t bytes, const char *what) {
  uintptr_t a = (uintptr_t)p, lo = (uintptr_t)dev->base, hi = lo + dev->arena.capacity;
  int touches = a < hi && a + bytes > lo;
  if (!touches && dev->ops != &ferry_backend_host) return FERRY_OK;
  return check_device_range(dev, p, bytes, what, "convert");
}

/* dst and src may be one buffer when the dtypes have one size (each element
 * is read before it is written); any other overlap would race. */
static int check_convert_overlap(ferry_device *dev, const void *dst, size_t db, const void *src,
                                 size_t sb, int same_size) {
  uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
  if (d >= s + sb || s >= d + db || (d == s && same_size)) return FERRY_OK;
  return FERRY_DEV_ERR(dev, FERRY_EINVAL,
                       "convert: dst %p + %zu bytes overlaps src %p + %zu bytes; only the same "
                       "buffer, with dtypes of one size, converts in place",
                       dst, db, src, sb);
}

int ferry_convert_async(ferry_stream *s, void *dst, ferry_dtype dt, const void *src,
                        ferry_dtype st, size_t n, float scale) {
  if (!s) return FERRY_EINVAL;
  ferry_device *dev = s->dev;
  size_t dsz = convert_size(dt), ssz = convert_size(st);
  if (!dsz || !ssz)
    return FERRY_DEV_ERR(dev, FERRY_EINVAL,
                         "convert: %s to %s: only F32, F16 and BF16 convert (dtypes %d to %d)",
                         dt_name(st), dt_name(dt), (int)st, (int)dt);
  if (n == 0) return FERRY_OK;
  if (!dst || !src)
    return FERRY_DEV_ERR(dev, FERRY_EINVAL, "convert: %s pointer is NULL (%zu elements)",
                         dst ? "src" : "dst", n);
  if (n > SIZE_MAX / 4)
    return FERRY_DEV_ERR(dev, FERRY_EINVAL, "convert: %zu elements overflow a byte count", n);
  int rc = check_convert_range(dev, src, n * ssz, "src");
  if (!rc) rc = check_convert_range(dev, dst, n * dsz, "dst");
  if (!rc) rc = check_convert_overlap(dev, dst, n * dsz, src, n * ssz, dsz == ssz);
  if (rc) return rc;
  return dev->ops->convert(s, dst, dt, src, st, n, scale);
}

int ferry_launch_host_func(ferry_stream *s, ferry_host_fn fn, void *arg) {
  if (!s) return FERRY_EINVAL;
  if (!fn) return FERRY_DEV_ERR(s->dev, FERRY_EINVAL, "launch host func: fn is NULL");
  return s->dev->ops->host_func(s, fn, arg);
}

int ferry_stream_sleep(ferry_stream *s, double seconds) {
  if (!s) return FERRY_EINVAL;
  if (!(seconds >= 0) || seconds > 3600)
    return FERRY_DEV_ERR(s->dev, FERRY_EINVAL, "stream sleep: %g seconds is out of [0, 3600]",
                         seconds);
  if (seconds == 0) return FERRY_OK;
  return s->dev->ops->sleep(s, seconds);
}

/* ---- events ----------------------------------------------------------- */

int ferry_event_create(ferry_device *dev, ferry_event **out) {
  if (!dev) return FERRY_EINVAL;
  if (!out) return FERRY_DEV_ERR(dev, FERRY_EINVAL, "event create: out is NULL");
  *out = NULL;
  ferry_event *e = calloc(1, sizeof *e);
  if (!e) return FERRY_DEV_ERR(dev, FERRY_ENOMEM, "event create: out of memory");
  e->dev = dev;
  int rc = dev->ops->event_create(e);
  if (rc) {
    free(e);
    return rc;
  }
  pthread_mutex_lock(&dev->mu);
  e->next = dev->events;
  if (dev->events) dev->events->prev = e;
  dev->events = e;
  pthread_mutex_unlock(&dev->mu);
  *out = e;
  return FERRY_OK;
}

int ferry_event_destroy(ferry_event *e) {
  if (!e) return FERRY_OK;
  ferry_device *dev = e->dev;
  int rc = dev->ops->event_destroy(e);
  pthread_mutex_lock(&dev->mu);
  if (e->prev) e->prev->next = e->next;
  else dev->events = e->next;
  if (e->next) e->next->prev = e->prev;
  pthread_mutex_unlock(&dev->mu);
  free(e);
  return rc;
}

static int same_device(ferry_event *e, ferry_stream *s, const char *op) {
  if (e->dev != s->dev)
    return FERRY_DEV_ERR(s->dev, FERRY_EINVAL, "%s: event and stream belong to different devices",
                         op);
  return FERRY_OK;
}

int ferry_event_record(ferry_event *e, ferry_stream *s) {
  if (!e || !s) return FERRY_EINVAL;
  int rc = same_device(e, s, "event record");
  return rc ? rc : s->dev->ops->event_record(e, s);
}

int ferry_stream_wait_event(ferry_stream *s, ferry_event *e) {
  if (!e || !s) return FERRY_EINVAL;
  int rc = same_device(e, s, "stream wait event");
  return rc ? rc : s->dev->ops->stream_wait_event(s, e);
}

int ferry_event_synchronize(ferry_event *e) {
  if (!e) return FERRY_EINVAL;
  t_host_waits++;
  return e->dev->ops->event_synchronize(e);
}

int ferry_event_query(ferry_event *e) { return e ? e->dev->ops->event_query(e) : FERRY_EINVAL; }

int ferry_event_elapsed_ms(ferry_event *start, ferry_event *end, float *ms) {
  if (!start || !end || !ms) return FERRY_EINVAL;
  if (start->dev != end->dev)
    return FERRY_DEV_ERR(start->dev, FERRY_EINVAL, "event elapsed: events of different devices");
  return start->dev->ops->event_elapsed_ms(start, end, ms);
}
