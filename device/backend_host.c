/* device/backend_host.c — the `host` backend: an emulated GPU.
 *
 * Device memory is one anonymous mapping of exactly `capacity` bytes (the
 * device layer caps allocations at it). Each stream is a FIFO worker thread.
 * Copies are handed to copy-engine threads (one for H2D, one for D2H, one for
 * D2D/H2H), as on a GPU with separate copy engines, so H2D, D2H and compute
 * on different streams overlap while each stream stays in order; tests can
 * slow the H2D and D2H engines to a link's speed (device/probes.h). Events are
 * generation counters: a record bumps the event's generation and completes
 * it in stream order; a wait captures the generation current at the call.
 */
#include "device/backend_impl.h"
#include "device/probes.h"

#include "core/par.h"


#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef enum { OP_COPY, OP_MEMSET, OP_FUNC, OP_SLEEP, OP_RECORD, OP_WAIT, OP_CONVERT } op_kind;

typedef struct host_event host_event;
typedef struct host_stream host_stream;

typedef struct op {
  op_kind kind;
  struct op *next;
  void *dst;
  const void *src;
  size_t bytes; /* OP_CONVERT: elements */
  int value;
  ferry_copy_kind copy;
  ferry_dtype dt, st; /* OP_CONVERT: dst and src dtypes */
  float scale;
  ferry_host_fn fn;
  void *arg;
  double seconds;
  host_event *ev;
  uint64_t gen;
  host_stream *owner; /* for copy jobs: who waits for the engine */
} op;

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  op *head, *tail;
  int stop;
  pthread_t thread;
  double rate, latency; /* (mu) the link's floor: ferry_device_host_copy_rate */
} copy_engine;

enum { ENGINE_H2D, ENGINE_D2H, ENGINE_OTHER, ENGINE_COUNT };

typedef struct {
  copy_engine engine[ENGINE_COUNT];
  size_t mapped;
} host_dev;

struct host_stream {
  ferry_stream *pub;
  pthread_mutex_t mu;
  pthread_cond_t cv;      /* work arrived, or stop */
  pthread_cond_t idle_cv; /* queue drained / copy done */
  op *head, *tail;
  size_t pending; /* ops enqueued and not finished */
  int copy_done;
  int stop;
  int sticky; /* first non-zero status of a host function */
  pthread_t thread;
};

struct host_event {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t recorded, completed;
  double t_completed;
};

#define HUGE_2M ((size_t)2 << 20)

static void op_free(op *o) { free(o); }
static void sleep_seconds(double s);

/* ---- copy engines ------------------------------------------------------- */

static void *engine_main(void *p) {
  copy_engine *ce = p;
  pthread_mutex_lock(&ce->mu);
  for (;;) {
    while (!ce->head && !ce->stop) pthread_cond_wait(&ce->cv, &ce->mu);
    if (!ce->head) break; /* stop with an empty queue */
    op *o = ce->head;
    ce->head = o->next;
    if (!ce->head) ce->tail = NULL;
    double floor_s = ce->latency + (ce->rate > 0 ? (double)o->bytes / ce->rate : 0);
    pthread_mutex_unlock(&ce->mu);
    /* a slow link: the engine is busy, no core is; the bytes move at the
     * end, so a read of the source or the destination out of stream order
     * shows */
    if (floor_s > 0) sleep_seconds(floor_s);
    memcpy(o->dst, o->src, o->bytes);
    host_stream *hs = o->owner;
    pthread_mutex_lock(&hs->mu);
    hs->copy_done = 1;
    pthread_cond_broadcast(&hs->idle_cv);
    pthread_mutex_unlock(&hs->mu);
    pthread_mutex_lock(&ce->mu);
  }
  pthread_mutex_unlock(&ce->mu);
  return NULL;
}

static void engine_submit(copy_engine *ce, op *o) {
  pthread_mutex_lock(&ce->mu);
  o->next = NULL;
  if (ce->tail) ce->tail->next = o;
  else ce->head = o;
  ce->tail = o;
  pthread_cond_signal(&ce->cv);
  pthread_mutex_unlock(&ce->mu);
}

static int engine_of(ferry_copy_kind k) {
  return k == FERRY_COPY_H2D ? ENGINE_H2D : k == FERRY_COPY_D2H ? ENGINE_D2H : ENGINE_OTHER;
}

int ferry_device_host_copy_rate(ferry_device *dev, double bytes_per_s, double latency_s) {
  if (!dev || bytes_per_s < 0 || latency_s < 0) return FERRY_EINVAL;
  if (dev->ops != &ferry_backend_host)
    return FERRY_DEV_ERR(dev, FERRY_ENOTSUP, "copy rate: only the host backend has one to set");
  host_dev *hd = dev->impl;
  for (int i = ENGINE_H2D; i <= ENGINE_D2H; i++) {
    copy_engine *ce = &hd->engine[i];
    pthread_mutex_lock(&ce->mu);
    ce->rate = bytes_per_s;
    ce->latency = latency_s;
    pthread_mutex_unlock(&ce->mu);
  }
  return FERRY_OK;
}

/* ---- device ------------------------------------------------------------- */

static int host_init(ferry_device *dev, char **base) {
  host_dev *hd = calloc(1, sizeof *hd);
  if (!hd) return FERRY_DEV_ERR(dev, FERRY_ENOMEM, "out of memory");
  size_t cap = ferry_align_up(dev->cfg.capacity, 256);
  /* Reserve address space only: pages are committed as they are touched, so
   * a large emulated device costs what is used. */
  void *m = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (m == MAP_FAILED) {
    int e = errno;
    free(hd);
    return FERRY_DEV_ERR(dev, FERRY_ENOMEM, "cannot reserve a %zu-byte emulated device arena: %s",
                         cap, strerror(e));
  }
  hd->mapped = cap;
  /* Huge pages cut page-fault cost on first touch ~500x; advisory only. */
  (void)madvise(m, cap, MADV_HUGEPAGE);
  int i;
  for (i = 0; i < ENGINE_COUNT; i++) {
    copy_engine *ce = &hd->engine[i];
    pthread_mutex_init(&ce->mu, NULL);
    pthread_cond_init(&ce->cv, NULL);
    if (pthread_create(&ce->thread, NULL, engine_main, ce)) break;
  }
  if (i < ENGINE_COUNT) {
    for (int j = 0; j < i; j++) {
      copy_engine *ce = &hd->engine[j];
      pthread_mutex_lock(&ce->mu);
      ce->stop = 1;
      pthread_cond_signal(&ce->cv);
      pthread_mutex_unlock(&ce->mu);
      pthread_join(ce->thread, NULL);
    }
    munmap(m, cap);
    free(hd);
    return FERRY_DEV_ERR(dev, FERRY_ENOMEM, "cannot start copy-engine threads");
  }
  dev->impl = hd;
  *base = m;
  return FERRY_OK;
}

static void host_shutdown(ferry_device *dev, char *base) {
  host_dev *hd = dev->impl;
  if (!hd) return;
  for (int i = 0; i < ENGINE_COUNT; i++) {
    copy_engine *ce = &hd->engine[i];
    pthread_mutex_lock(&ce->mu);
    ce->stop = 1;
    pthread_cond_signal(&ce->cv);
    pthread_mutex_unlock(&ce->mu);
    pthread_join(ce->thread, NULL);
    pthread_mutex_destroy(&ce->mu);
    pthread_cond_destroy(&ce->cv);
  }
  if (base) munmap(base, hd->mapped);
  free(hd);
  dev->impl = NULL;
}

static void host_info(ferry_device *dev, ferry_device_info *out) {
  snprintf(out->name, sizeof out->name, "host (emulated GPU)");
  out->emulated = 1;
  out->total_memory = dev->arena.capacity;
  pthread_mutex_lock(&dev->mu);
  out->free_memory = dev->arena.capacity - dev->arena.used;
  pthread_mutex_unlock(&dev->mu);
}

static int host_host_alloc(ferry_device *dev, size_t bytes, void **ptr) {
  size_t len = ferry_align_up(bytes, 4096);
  size_t align = len >= HUGE_2M ? HUGE_2M : 4096;
  void *p = NULL;
  int e = posix_memalign(&p, align, len);
  if (e)
    return FERRY_DEV_ERR(dev, FERRY_ENOMEM, "pinned host alloc of %zu bytes failed: %s", bytes,
                         strerror(e));
  /* Huge pages before the pages exist (mlock faults them all in): 2 MiB
   * physically contiguous runs let a 1 MiB NVMe request go out as one
   * segment instead of 256 (more than a virtio disk's 254: split in two). */
  if (align == HUGE_2M) (void)madvise(p, len, MADV_HUGEPAGE);
  /* gigabytes: first touched by all threads, so that mlock finds the pages
   * there instead of faulting them in one by one on this thread */
  if (dev->cfg.host_lock_pinned && len >= FERRY_PAR_MIN_BYTES) ferry_par_zero(p, len, 0);
  if (dev->cfg.host_lock_pinned && mlock(p, len) != 0) {
    e = errno;
    free(p);
    return FERRY_DEV_ERR(dev, FERRY_ENOMEM,
                         "pinned host alloc: mlock of %zu bytes failed: %s (RLIMIT_MEMLOCK; see "
                         "`ulimit -l`)",
                         len, strerror(e));
  }
  *ptr = p;
  return FERRY_OK;
}

static void host_host_free(ferry_device *dev, void *ptr, size_t bytes) {
  if (dev->cfg.host_lock_pinned) munlock(ptr, ferry_align_up(bytes, 4096));
  free(ptr);
}

/* ---- streams ------------------------------------------------------------- */

static void event_complete(host_event *ev, uint64_t gen) {
  pthread_mutex_lock(&ev->mu);
  if (gen > ev->completed) {
    ev->completed = gen;
    ev->t_completed = ferry_now();
  }
  pthread_cond_broadcast(&ev->cv);
  pthread_mutex_unlock(&ev->mu);
}

static void event_wait_gen(host_event *ev, uint64_t gen) {
  pthread_mutex_lock(&ev->mu);
  while (ev->completed < gen) pthread_cond_wait(&ev->cv, &ev->mu);
  pthread_mutex_unlock(&ev->mu);
}

static void sleep_seconds(double s) {
  struct timespec ts;
  ts.tv_sec = (time_t)s;
  ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static void run_op(host_stream *hs, op *o) {
  host_dev *hd = hs->pub->dev->impl;
  switch (o->kind) {
  case OP_COPY:
    o->owner = hs;
    pthread_mutex_lock(&hs->mu);
    hs->copy_done = 0;
    pthread_mutex_unlock(&hs->mu);
    engine_submit(&hd->engine[engine_of(o->copy)], o);
    pthread_mutex_lock(&hs->mu);
    while (!hs->copy_done) pthread_cond_wait(&hs->idle_cv, &hs->mu);
    pthread_mutex_unlock(&hs->mu);
    break;
  case OP_MEMSET: memset(o->dst, o->value, o->bytes); break;
  case OP_CONVERT:
    /* The emulated kernel: core's conversion itself, so the bits are its
     * bits. The arguments live in the op until it ran. */
    (void)ferry_dtype_convert(o->dst, o->dt, o->src, o->st, o->bytes, o->scale);
    break;
  case OP_FUNC: {
    int rc = o->fn(o->arg);
    if (rc) {
      pthread_mutex_lock(&hs->mu);
      if (!hs->sticky) hs->sticky = rc;
      pthread_mutex_unlock(&hs->mu);
    }
    break;
  }
  case OP_SLEEP: sleep_seconds(o->seconds); break;
  case OP_RECORD: event_complete(o->ev, o->gen); break;
  case OP_WAIT: event_wait_gen(o->ev, o->gen); break;
  }
}

static void *stream_main(void *p) {
  host_stream *hs = p;
  pthread_mutex_lock(&hs->mu);
  for (;;) {
    while (!hs->head && !hs->stop) pthread_cond_wait(&hs->cv, &hs->mu);
    if (!hs->head) break;
    op *o = hs->head;
    hs->head = o->next;
    if (!hs->head) hs->tail = NULL;
    pthread_mutex_unlock(&hs->mu);
    run_op(hs, o);
    op_free(o);
    pthread_mutex_lock(&hs->mu);
    hs->pending--;
    if (hs->pending == 0) pthread_cond_broadcast(&hs->idle_cv);
  }
  pthread_mutex_unlock(&hs->mu);
  return NULL;
}

static int enqueue(ferry_stream *s, op *o) {
  host_stream *hs = s->impl;
  o->next = NULL;
  pthread_mutex_lock(&hs->mu);
  if (hs->stop) {
    pthread_mutex_unlock(&hs->mu);
    op_free(o);
    return FERRY_DEV_ERR(s->dev, FERRY_ESTATE, "stream is being destroyed");
  }
  if (hs->tail) hs->tail->next = o;
  else hs->head = o;
  hs->tail = o;
  hs->pending++;
  pthread_cond_signal(&hs->cv);
  pthread_mutex_unlock(&hs->mu);
  return FERRY_OK;
}

static op *op_new(ferry_stream *s, op_kind k) {
  op *o = calloc(1, sizeof *o);
  if (!o) FERRY_DEV_ERR(s->dev, FERRY_ENOMEM, "stream: out of memory for a work item");
  else o->kind = k;
  return o;
}

static int host_stream_create(ferry_stream *s) {
  host_stream *hs = calloc(1, sizeof *hs);
  if (!hs) return FERRY_DEV_ERR(s->dev, FERRY_ENOMEM, "stream create: out of memory");
  hs->pub = s;
  pthread_mutex_init(&hs->mu, NULL);
  pthread_cond_init(&hs->cv, NULL);
  pthread_cond_init(&hs->idle_cv, NULL);
  if (pthread_create(&hs->thread, NULL, stream_main, hs)) {
    pthread_mutex_destroy(&hs->mu);
    pthread_cond_destroy(&hs->cv);
    pthread_cond_destroy(&hs->idle_cv);
    free(hs);
    return FERRY_DEV_ERR(s->dev, FERRY_ENOMEM, "stream create: cannot start a stream thread");
  }
  s->impl = hs;
  return FERRY_OK;
}

static int host_stream_wrap(ferry_stream *s, void *native) {
  return FERRY_DEV_ERR(s->dev, FERRY_ENOTSUP,
                       "stream wrap: the host backend has no native streams to adopt (%p)", native);
}

static int host_stream_native(ferry_stream *s, void **out) {
  (void)s;
  *out = NULL;
  return FERRY_OK;
}

static int take_sticky(host_stream *hs) {
  int rc = hs->sticky;
  hs->sticky = 0;
  return rc;
}

static int host_stream_synchronize(ferry_stream *s) {
  host_stream *hs = s->impl;
  pthread_mutex_lock(&hs->mu);
  while (hs->pending) pthread_cond_wait(&hs->idle_cv, &hs->mu);
  int rc = take_sticky(hs);
  pthread_mutex_unlock(&hs->mu);
  if (rc)
    return FERRY_DEV_ERR(s->dev, rc, "stream: a host function returned %d (%s)", rc,
                         ferry_strerror(rc));
  return FERRY_OK;
}

static int host_stream_destroy(ferry_stream *s) {
  host_stream *hs = s->impl;
  int rc = host_stream_synchronize(s);
  pthread_mutex_lock(&hs->mu);
  hs->stop = 1;
  pthread_cond_signal(&hs->cv);
  pthread_mutex_unlock(&hs->mu);
  pthread_join(hs->thread, NULL);
  pthread_mutex_destroy(&hs->mu);
  pthread_cond_destroy(&hs->cv);
  pthread_cond_destroy(&hs->idle_cv);
  free(hs);
  s->impl = NULL;
  return rc;
}

static int host_stream_query(ferry_stream *s) {
  host_stream *hs = s->impl;
  pthread_mutex_lock(&hs->mu);
  int busy = hs->pending != 0;
  pthread_mutex_unlock(&hs->mu);
  return busy ? FERRY_EAGAIN : FERRY_OK;
}

static int host_memcpy_async(ferry_stream *s, void *dst, const void *src, size_t bytes,
                             ferry_copy_kind kind) {
  op *o = op_new(s, OP_COPY);
  if (!o) return FERRY_ENOMEM;
  o->dst = dst;
  o->src = src;
  o->bytes = bytes;
  o->copy = kind;
  return enqueue(s, o);
}

static int host_memset_async(ferry_stream *s, void *dst, int value, size_t bytes) {
  op *o = op_new(s, OP_MEMSET);
  if (!o) return FERRY_ENOMEM;
  o->dst = dst;
  o->value = value;
  o->bytes = bytes;
  return enqueue(s, o);
}

static int host_host_func(ferry_stream *s, ferry_host_fn fn, void *arg) {
  op *o = op_new(s, OP_FUNC);
  if (!o) return FERRY_ENOMEM;
  o->fn = fn;
  o->arg = arg;
  return enqueue(s, o);
}

static int host_convert(ferry_stream *s, void *dst, ferry_dtype dt, const void *src,
                        ferry_dtype st, size_t n, float scale) {
  op *o = op_new(s, OP_CONVERT);
  if (!o) return FERRY_ENOMEM;
  o->dst = dst;
  o->src = src;
  o->bytes = n;
  o->dt = dt;
  o->st = st;
  o->scale = scale;
  return enqueue(s, o);
}

static int host_sleep(ferry_stream *s, double seconds) {
  op *o = op_new(s, OP_SLEEP);
  if (!o) return FERRY_ENOMEM;
  o->seconds = seconds;
  return enqueue(s, o);
}

/* ---- events ------------------------------------------------------------- */

static int host_event_create(ferry_event *e) {
  host_event *he = calloc(1, sizeof *he);
  if (!he) return FERRY_DEV_ERR(e->dev, FERRY_ENOMEM, "event create: out of memory");
  pthread_mutex_init(&he->mu, NULL);
  pthread_cond_init(&he->cv, NULL);
  e->impl = he;
  return FERRY_OK;
}

static int host_event_destroy(ferry_event *e) {
  host_event *he = e->impl;
  /* A queued record or wait may still point at the event: wait for it. */
  event_wait_gen(he, he->recorded);
  pthread_mutex_destroy(&he->mu);
  pthread_cond_destroy(&he->cv);
  free(he);
  e->impl = NULL;
  return FERRY_OK;
}

static int host_event_record(ferry_event *e, ferry_stream *s) {
  host_event *he = e->impl;
  op *o = op_new(s, OP_RECORD);
  if (!o) return FERRY_ENOMEM;
  pthread_mutex_lock(&he->mu);
  uint64_t gen = ++he->recorded;
  pthread_mutex_unlock(&he->mu);
  o->gen = gen;
  o->ev = he;
  int rc = enqueue(s, o);
  if (rc) event_complete(he, gen); /* never enqueued: do not leave waiters hanging */
  return rc;
}

static int host_stream_wait_event(ferry_stream *s, ferry_event *e) {
  host_event *he = e->impl;
  pthread_mutex_lock(&he->mu);
  uint64_t gen = he->recorded;
  int done = he->completed >= gen;
  pthread_mutex_unlock(&he->mu);
  if (done) return FERRY_OK;
  op *o = op_new(s, OP_WAIT);
  if (!o) return FERRY_ENOMEM;
  o->ev = he;
  o->gen = gen;
  return enqueue(s, o);
}

static int host_event_synchronize(ferry_event *e) {
  host_event *he = e->impl;
  pthread_mutex_lock(&he->mu);
  uint64_t gen = he->recorded;
  pthread_mutex_unlock(&he->mu);
  event_wait_gen(he, gen);
  return FERRY_OK;
}

static int host_event_query(ferry_event *e) {
  host_event *he = e->impl;
  pthread_mutex_lock(&he->mu);
  int done = he->completed >= he->recorded;
  pthread_mutex_unlock(&he->mu);
  return done ? FERRY_OK : FERRY_EAGAIN;
}

static int host_event_elapsed_ms(ferry_event *a, ferry_event *b, float *ms) {
  host_event *ha = a->impl, *hb = b->impl;
  double ta, tb;
  int ok = 1;
  pthread_mutex_lock(&ha->mu);
  ok &= ha->recorded > 0 && ha->completed >= ha->recorded;
  ta = ha->t_completed;
  pthread_mutex_unlock(&ha->mu);
  pthread_mutex_lock(&hb->mu);
  ok &= hb->recorded > 0 && hb->completed >= hb->recorded;
  tb = hb->t_completed;
  pthread_mutex_unlock(&hb->mu);
  if (!ok)
    return FERRY_DEV_ERR(a->dev, FERRY_ESTATE,
                         "event elapsed: both events must be recorded and complete");
  *ms = (float)((tb - ta) * 1e3);
  return FERRY_OK;
}

const ferry_backend_ops ferry_backend_host = {
    /* .name = */ "host",
    /* .init = */ host_init,
    /* .shutdown = */ host_shutdown,
    /* .info = */ host_info,
    /* .host_alloc = */ host_host_alloc,
    /* .host_free = */ host_host_free,
    /* .stream_create = */ host_stream_create,
    /* .stream_wrap = */ host_stream_wrap,
    /* .stream_native = */ host_stream_native,
    /* .stream_destroy = */ host_stream_destroy,
    /* .stream_synchronize = */ host_stream_synchronize,
    /* .stream_query = */ host_stream_query,
    /* .memcpy_async = */ host_memcpy_async,
    /* .memset_async = */ host_memset_async,
    /* .host_func = */ host_host_func,
    /* .convert = */ host_convert,
    /* .sleep = */ host_sleep,
    /* .event_create = */ host_event_create,
    /* .event_destroy = */ host_event_destroy,
    /* .event_record = */ host_event_record,
    /* .stream_wait_event = */ host_stream_wait_event,
    /* .event_synchronize = */ host_event_synchronize,
    /* .event_query = */ host_event_query,
    /* .event_elapsed_ms = */ host_event_elapsed_ms,
};
