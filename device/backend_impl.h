/* device/backend_impl.h — the private contract between the device layer
 * (device/device.c: validation, accounting, object lists) and a backend
 * (device/backend_host.c, device/backend_cuda.c). A backend is one table of
 * function pointers; the device layer has already validated every argument
 * when a slot is called, so backends only do the work.
 */
#ifndef FERRY_BACKEND_IMPL_H
#define FERRY_BACKEND_IMPL_H

#include "core/core.h"
#include "device/arena.h"

typedef struct ferry_backend_ops ferry_backend_ops;

struct ferry_stream {
  ferry_device *dev;
  void *impl;
  struct ferry_stream *prev, *next; /* the device's list */
};

struct ferry_event {
  ferry_device *dev;
  void *impl;
  struct ferry_event *prev, *next;
};

typedef struct ferry_pinned_block {
  void *ptr;
  size_t bytes;
  struct ferry_pinned_block *next;
} ferry_pinned_block;

struct ferry_device {
  const ferry_backend_ops *ops;
  void *impl;
  ferry_device_config cfg;
  ferry_logger log;
  ferry_errbuf err;

  /* Device memory: one reservation of `capacity` bytes, sub-allocated. */
  pthread_mutex_t mu; /* guards arena, pinned list, object lists */
  char *base;
  ferry_arena arena;
  ferry_pinned_block *pinned;
  size_t pinned_bytes;
  ferry_stream *streams;
  ferry_event *events;
};

struct ferry_backend_ops {
  const char *name;
  /* Set up the backend (dev->impl) and reserve dev->cfg.capacity bytes of
   * device memory at *base. cuda resolves capacity 0 to a size and writes it
   * back into dev->cfg.capacity. */
  int (*init)(ferry_device *dev, char **base);
  /* Free the reservation and everything in dev->impl. Streams and events are
   * already destroyed. */
  void (*shutdown)(ferry_device *dev, char *base);
  void (*info)(ferry_device *dev, ferry_device_info *out);

  int (*host_alloc)(ferry_device *dev, size_t bytes, void **ptr);
  void (*host_free)(ferry_device *dev, void *ptr, size_t bytes);

  int (*stream_create)(ferry_stream *s);
  /* Adopt the caller's native stream as s (never destroyed by ferry);
   * FERRY_ENOTSUP where the backend has no native streams. */
  int (*stream_wrap)(ferry_stream *s, void *native);
  /* The backend's own stream behind s (NULL when it has none). */
  int (*stream_native)(ferry_stream *s, void **out);
  /* Drain the stream's work, then free it. */
  int (*stream_destroy)(ferry_stream *s);
  int (*stream_synchronize)(ferry_stream *s);
  int (*stream_query)(ferry_stream *s);
  int (*memcpy_async)(ferry_stream *s, void *dst, const void *src, size_t bytes,
                      ferry_copy_kind kind);
  int (*memset_async)(ferry_stream *s, void *dst, int value, size_t bytes);
  int (*host_func)(ferry_stream *s, ferry_host_fn fn, void *arg);
  /* n > 0 elements, both dtypes F32/F16/BF16, as ferry_dtype_convert. */
  int (*convert)(ferry_stream *s, void *dst, ferry_dtype dt, const void *src, ferry_dtype st,
                 size_t n, float scale);
  int (*sleep)(ferry_stream *s, double seconds);

  int (*event_create)(ferry_event *e);
  int (*event_destroy)(ferry_event *e);
  int (*event_record)(ferry_event *e, ferry_stream *s);
  int (*stream_wait_event)(ferry_stream *s, ferry_event *e);
  int (*event_synchronize)(ferry_event *e);
  int (*event_query)(ferry_event *e);
  int (*event_elapsed_ms)(ferry_event *start, ferry_event *end, float *ms);
};

extern const ferry_backend_ops ferry_backend_host;
#ifdef FERRY_HAVE_CUDA
extern const ferry_backend_ops ferry_backend_cuda;
/* 1 when the CUDA runtime reports at least one device; `why` says why not. */
int ferry_cuda_available(char *why, size_t why_len);
#endif

/* Errors a backend reports on a device (thread-safe). */
#define FERRY_DEV_ERR(dev, status, ...) ferry_err(&(dev)->err, (status), __VA_ARGS__)

#endif /* FERRY_BACKEND_IMPL_H */
