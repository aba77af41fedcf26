/* device/backend_cuda.c — the `cuda` device backend: one cudaMalloc'd arena of
 * `capacity` bytes (the device layer sub-allocates it), pinned host memory
 * from cudaHostAlloc (gigabytes: touched by all threads, then registered),
 * non-blocking CUDA streams, cudaEvents, host functions
 * through cudaLaunchHostFunc and the sleep kernel of cuda_sleep.cu. Also the
 * CUDA probes of the public API: ferry_cuda_compiled, ferry_gpu_list.
 */
#include "device/backend_impl.h"

#include "core/par.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>

/* device/cuda_sleep.cu */
cudaError_t ferry_cuda_sleep_launch(cudaStream_t stream, unsigned long long ns);
cudaError_t ferry_cuda_sleep_prepare(void);
/* device/convert.cu */
cudaError_t ferry_cuda_convert_launch(cudaStream_t stream, void *dst, int dt, const void *src,
                                      int st, size_t n, float scale, uint32_t default_nan);
cudaError_t ferry_cuda_convert_prepare(void);

typedef struct {
  int ordinal;
  char name[128];
  size_t total;
  uint32_t default_nan; /* the host's inf * 0, for the converter's NaNs */
} cuda_dev;

typedef struct {
  cudaStream_t st;
  /* Recorded and waited on by synchronize: a blocking-sync event parks the
   * caller instead of spinning a core, which the CPU optimizer needs. */
  cudaEvent_t done;
  atomic_int sticky; /* first non-zero return of a host function */
  int owned;         /* 0: the caller's stream (ferry_stream_wrap), never destroyed here */
} cuda_stream;

typedef struct {
  cudaEvent_t ev;
  atomic_int recorded;
} cuda_event;

/* One queued host function (fn != NULL) or host-to-host copy (fn == NULL);
 * freed by the trampoline once it ran. */
typedef struct {
  ferry_host_fn fn;
  void *arg;
  void *dst;
  const void *src;
  size_t bytes;
  cuda_stream *cs;
} host_call;

/* ---- errors ---------------------------------------------------------- */

/* Which ferry status a CUDA error is: no device or driver, and faults that
 * leave the context unusable, are FERRY_ENODEV; allocations FERRY_ENOMEM. */
static int status_of(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return FERRY_OK;
  case cudaErrorMemoryAllocation: return FERRY_ENOMEM;
  case cudaErrorNotReady: return FERRY_EAGAIN;
  case cudaErrorNotSupported:
  case cudaErrorNotPermitted: return FERRY_ENOTSUP;
  case cudaErrorInvalidValue: return FERRY_EINVAL;
  case cudaErrorNoDevice:
  case cudaErrorInvalidDevice:
  case cudaErrorInsufficientDriver:
  case cudaErrorInitializationError:
  case cudaErrorDevicesUnavailable:
  case cudaErrorStubLibrary:
  case cudaErrorSystemDriverMismatch:
  case cudaErrorCompatNotSupportedOnDevice:
  case cudaErrorSystemNotReady:
  case cudaErrorDeviceUninitialized:
  case cudaErrorNoKernelImageForDevice:
  case cudaErrorIllegalAddress:
  case cudaErrorLaunchFailure:
  case cudaErrorLaunchTimeout:
  case cudaErrorECCUncorrectable:
  case cudaErrorHardwareStackError:
  case cudaErrorIllegalInstruction:
  case cudaErrorMisalignedAddress:
  case cudaErrorInvalidPc:
  case cudaErrorContextIsDestroyed:
  case cudaErrorCudartUnloading: return FERRY_ENODEV;
  default: return FERRY_EIO;
  }
}

static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

/* 0 when e is cudaSuccess; otherwise the device's message gets what was
 * being done, the CUDA error, the statement, file and line, and the ferry
 * status is returned. */
static int cuda_check(ferry_device *dev, cudaError_t e, const char *stmt, const char *file,
                      int line, const char *fmt, ...) FERRY_PRINTF(6, 7);
static int cuda_check(ferry_device *dev, cudaError_t e, const char *stmt, const char *file,
                      int line, const char *fmt, ...) {
  if (FERRY_LIKELY(e == cudaSuccess)) return FERRY_OK;
  (void)cudaGetLastError(); /* do not leave our failure for the caller's code */
  char what[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return FERRY_DEV_ERR(dev, status_of(e), "%s: %s: %s (%s at %s:%d)", what, cudaGetErrorName(e),
                       cudaGetErrorString(e), stmt, base_name(file), line);
}

/* Evaluates a CUDA call; 0, or a status with the message set on dev. The
 * context after the statement is a printf format saying what was done. */
#define FERRY_CUDA_CHECK(dev, stmt, ...)                                                           \
  cuda_check((dev), (stmt), #stmt, __FILE__, __LINE__, __VA_ARGS__)

static void put_why(char *why, size_t len, const char *fmt, ...) FERRY_PRINTF(3, 4);
static void put_why(char *why, size_t len, const char *fmt, ...) {
  if (!why || !len) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, len, fmt, ap);
  va_end(ap);
}

/* Why cudaGetDeviceCount failed, in the user's words: with no NVIDIA driver
 * loaded (no /proc/driver/nvidia/version) the runtime's own text is
 * "CUDA driver version is insufficient", which misleads. */
static void count_why(char *why, size_t len, cudaError_t e) {
  if ((e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice) &&
      access("/proc/driver/nvidia/version", F_OK) != 0)
    put_why(why, len, "no NVIDIA driver is loaded (no /proc/driver/nvidia/version; the CUDA "
            "runtime says %s)", cudaGetErrorName(e));
  else
    put_why(why, len, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
}

/* Copies a device name, cut to the destination (CUDA allows 256 bytes). */
static void set_name(char *dst, size_t len, const char *src) {
  size_t n = strnlen(src, len - 1);
  memcpy(dst, src, n);
  dst[n] = '\0';
}

/* ---- current device ---------------------------------------------------- */

/* The runtime's current device is per thread and belongs to the caller:
 * switch to ours for a call that needs it and switch back after. */
static cudaError_t dev_enter(const cuda_dev *cd, int *prev) {
  cudaError_t e = cudaGetDevice(prev);
  if (e != cudaSuccess) return e;
  return *prev == cd->ordinal ? cudaSuccess : cudaSetDevice(cd->ordinal);
}

static void dev_leave(const cuda_dev *cd, int prev) {
  if (prev != cd->ordinal) (void)cudaSetDevice(prev);
}

#define ENTER(dev, cd, prev)                                                                       \
  do {                                                                                             \
    int rc_ =                                                                                      \
        FERRY_CUDA_CHECK((dev), dev_enter((cd), &(prev)), "select CUDA device %d", (cd)->ordinal); \
    if (rc_) return rc_;                                                                           \
  } while (0)

/* ---- PCIe link from sysfs --------------------------------------------- */

static double read_number(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char line[64] = "";
  double v = 0;
  if (fgets(line, sizeof line, f)) v = strtod(line, NULL);
  fclose(f);
  return v;
}

/* Generation and width of the device's current PCIe link, 0 when unknown
 * (no sysfs, an SXM part, a VM that hides it). */
static void read_pcie(int ordinal, int *gen, int *width) {
  *gen = *width = 0;
  char bus[64];
  if (cudaDeviceGetPCIBusId(bus, (int)sizeof bus, ordinal) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  unsigned dom, b, d, fn;
  if (sscanf(bus, "%x:%x:%x.%x", &dom, &b, &d, &fn) != 4) return;
  char path[160];
  snprintf(path, sizeof path, "/sys/bus/pci/devices/%04x:%02x:%02x.%x/current_link_speed", dom, b,
           d, fn);
  double gts = read_number(path); /* "16.0 GT/s PCIe" */
  snprintf(path, sizeof path, "/sys/bus/pci/devices/%04x:%02x:%02x.%x/current_link_width", dom, b,
           d, fn);
  *width = (int)read_number(path);
  static const double rate[] = {2.5, 5, 8, 16, 32, 64, 128};
  for (int i = 0; i < (int)(sizeof rate / sizeof rate[0]); i++)
    if (gts >= rate[i] * 0.9) *gen = i + 1;
}

/* ---- device ------------------------------------------------------------- */

/* The NaN this CPU's float multiply makes of inf * 0 (x86: 0xffc00000), for
 * the converter to give the host's bits. volatile keeps the compiler from
 * folding it. */
static uint32_t host_default_nan(void) {
  volatile float inf = HUGE_VALF, zero = 0.0f;
  float r = inf * zero;
  uint32_t u;
  memcpy(&u, &r, sizeof u);
  return u;
}

/* Loads ferry's kernels on the current device now, so no step pays for
 * module loading (or PTX JIT on a GPU newer than the machine code); one that
 * cannot load is logged, and its calls fail with the runtime's message. */
static void prepare_kernels(ferry_device *dev, const cuda_dev *cd) {
  static const char *const what[2] = {"the sleep kernel (ferry_stream_sleep)",
                                      "the conversion kernel (ferry_convert_async)"};
  cudaError_t e[2] = {ferry_cuda_sleep_prepare(), ferry_cuda_convert_prepare()};
  for (int i = 0; i < 2; i++) {
    if (e[i] == cudaSuccess) continue;
    (void)cudaGetLastError();
    ferry_logf(&dev->log, FERRY_LOG_WARN, "cuda: %s cannot load on %s: %s (%s)", what[i],
               cd->name, cudaGetErrorString(e[i]), cudaGetErrorName(e[i]));
  }
}

static int cuda_init(ferry_device *dev, char **base) {
  int ord = dev->cfg.cuda_ordinal, n = 0;
  int rc = FERRY_CUDA_CHECK(dev, cudaGetDeviceCount(&n), "no usable CUDA driver or device");
  if (rc) return rc;
  if (ord < 0 || ord >= n)
    return FERRY_DEV_ERR(dev, FERRY_ENODEV, "CUDA device %d does not exist (%d device(s) present)",
                         ord, n);
  cuda_dev *cd = calloc(1, sizeof *cd);
  if (!cd) return FERRY_DEV_ERR(dev, FERRY_ENOMEM, "out of memory");
  cd->ordinal = ord;
  cd->default_nan = host_default_nan();
  int prev = 0;
  struct cudaDeviceProp prop;
  size_t free_b = 0, total_b = 0;
  void *arena = NULL;
  rc = FERRY_CUDA_CHECK(dev, dev_enter(cd, &prev), "select CUDA device %d", ord);
  if (rc) {
    free(cd);
    return rc;
  }
  if ((rc = FERRY_CUDA_CHECK(dev, cudaGetDeviceProperties(&prop, ord),
                             "properties of CUDA device %d", ord)))
    goto out;
  set_name(cd->name, sizeof cd->name, prop.name);
  cd->total = prop.totalGlobalMem;
  if ((rc = FERRY_CUDA_CHECK(dev, cudaMemGetInfo(&free_b, &total_b),
                             "free memory of CUDA device %d", ord)))
    goto out;
  size_t cap = dev->cfg.capacity;
  if (cap == 0) {
    /* Leave 5% for the context, cuBLAS workspaces and the caller's kernels. */
    cap = (free_b - free_b / 20) & ~(((size_t)2 << 20) - 1);
    if (cap == 0) {
      rc = FERRY_DEV_ERR(dev, FERRY_ENOMEM, "CUDA device %d (%s) has only %zu bytes free", ord,
                         cd->name, free_b);
      goto out;
    }
  }
  size_t reserve = ferry_align_up(cap, 256);
  if ((rc = FERRY_CUDA_CHECK(dev, cudaMalloc(&arena, reserve),
                             "reserve a %zu-byte device arena on CUDA device %d (%s, %zu of %zu "
                             "bytes free)",
                             reserve, ord, cd->name, free_b, total_b)))
    goto out;
  prepare_kernels(dev, cd);
  dev->cfg.capacity = cap;
  dev->impl = cd;
  *base = arena;
out:
  dev_leave(cd, prev);
  if (rc) free(cd);
  return rc;
}

static void cuda_shutdown(ferry_device *dev, char *base) {
  cuda_dev *cd = dev->impl;
  if (!cd) return;
  int prev = 0;
  if (dev_enter(cd, &prev) == cudaSuccess) {
    if (base) (void)cudaFree(base); /* waits for the device to be idle */
    dev_leave(cd, prev);
  }
  (void)cudaGetLastError();
  free(cd);
  dev->impl = NULL;
}

static void cuda_info(ferry_device *dev, ferry_device_info *out) {
  cuda_dev *cd = dev->impl;
  snprintf(out->name, sizeof out->name, "%s", cd->name);
  out->emulated = 0;
  out->total_memory = cd->total;
  int prev = 0;
  size_t fr = 0, tot = 0;
  if (dev_enter(cd, &prev) == cudaSuccess) {
    if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) {
      out->free_memory = fr;
      out->total_memory = tot;
    }
    dev_leave(cd, prev);
  }
  (void)cudaGetLastError();
  read_pcie(cd->ordinal, &out->pcie_gen, &out->pcie_width);
}

#define HOST_HUGE ((size_t)2 << 20)

/* Gigabytes: an anonymous mapping first touched by all threads
 * (ferry_par_zero), then registered: cudaHostRegister pins pages that are
 * already there, where cudaHostAlloc would fault and clear them on this
 * thread alone. NULL when that fails (the caller falls back to
 * cudaHostAlloc). Portable: pinned for every context. */
static void *host_register_large(size_t bytes) {
  size_t len = (bytes + HOST_HUGE - 1) & ~(HOST_HUGE - 1);
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  (void)madvise(p, len, MADV_HUGEPAGE); /* fewer faults, fewer pages to pin */
  ferry_par_zero(p, len, 0);
  if (cudaHostRegister(p, len, cudaHostRegisterPortable) == cudaSuccess) return p;
  (void)cudaGetLastError();
  munmap(p, len);
  return NULL;
}

static int cuda_host_alloc(ferry_device *dev, size_t bytes, void **ptr) {
  cuda_dev *cd = dev->impl;
  int prev;
  ENTER(dev, cd, prev);
  *ptr = bytes >= FERRY_PAR_MIN_BYTES ? host_register_large(bytes) : NULL;
  /* Portable: pinned for every context, so any device's copies run at DMA
   * rate from it. */
  int rc = *ptr ? FERRY_OK
                : FERRY_CUDA_CHECK(dev, cudaHostAlloc(ptr, bytes, cudaHostAllocPortable),
                                   "pinned host alloc of %zu bytes", bytes);
  dev_leave(cd, prev);
  return rc;
}

static void cuda_host_free(ferry_device *dev, void *ptr, size_t bytes) {
  cuda_dev *cd = dev->impl;
  int prev;
  if (dev_enter(cd, &prev) == cudaSuccess) {
    /* host_register_large's mapping unregisters; cudaHostAlloc's does not */
    if (bytes >= FERRY_PAR_MIN_BYTES && cudaHostUnregister(ptr) == cudaSuccess)
      munmap(ptr, (bytes + HOST_HUGE - 1) & ~(HOST_HUGE - 1));
    else
      (void)cudaGetLastError(), (void)cudaFreeHost(ptr);
    dev_leave(cd, prev);
  }
  (void)cudaGetLastError();
}

/* ---- streams ------------------------------------------------------------- */

/* Makes s's impl around a stream: ours (native NULL: created here, non-
 * blocking, so never serialised against the legacy default stream the
 * caller's kernels may use) or the caller's (adopted, never destroyed). */
static int stream_setup(ferry_stream *s, cudaStream_t native) {
  ferry_device *dev = s->dev;
  cuda_dev *cd = dev->impl;
  cuda_stream *cs = calloc(1, sizeof *cs);
  if (!cs) return FERRY_DEV_ERR(dev, FERRY_ENOMEM, "stream create: out of memory");
  atomic_init(&cs->sticky, 0);
  cs->owned = native == NULL;
  cs->st = native;
  int prev, rc;
  rc = FERRY_CUDA_CHECK(dev, dev_enter(cd, &prev), "select CUDA device %d", cd->ordinal);
  if (rc) {
    free(cs);
    return rc;
  }
  if (cs->owned)
    rc = FERRY_CUDA_CHECK(dev, cudaStreamCreateWithFlags(&cs->st, cudaStreamNonBlocking),
                          "stream create");
  if (!rc) {
    rc = FERRY_CUDA_CHECK(
        dev, cudaEventCreateWithFlags(&cs->done, cudaEventBlockingSync | cudaEventDisableTiming),
        "stream create: its sync event");
    /* An adopted stream must be one of this device: recording our event on
     * it fails otherwise, before ferry queues anything there. */
    if (!rc && !cs->owned) {
      rc = FERRY_CUDA_CHECK(dev, cudaEventRecord(cs->done, cs->st),
                            "stream wrap: %p is not a stream of CUDA device %d (%s)", native,
                            cd->ordinal, cd->name);
      if (rc) (void)cudaEventDestroy(cs->done);
    }
    if (rc && cs->owned) (void)cudaStreamDestroy(cs->st);
  }
  dev_leave(cd, prev);
  if (rc) {
    free(cs);
    return rc;
  }
  s->impl = cs;
  return FERRY_OK;
}

static int cuda_stream_create(ferry_stream *s) { return stream_setup(s, NULL); }

static int cuda_stream_wrap(ferry_stream *s, void *native) {
  return stream_setup(s, (cudaStream_t)native);
}

static int cuda_stream_native(ferry_stream *s, void **out) {
  cuda_stream *cs = s->impl;
  *out = (void *)cs->st;
  return FERRY_OK;
}

static int take_sticky(ferry_stream *s, cuda_stream *cs) {
  int rc = atomic_exchange(&cs->sticky, 0);
  if (rc)
    return FERRY_DEV_ERR(s->dev, rc, "stream: a host function returned %d (%s)", rc,
                         ferry_strerror(rc));
  return FERRY_OK;
}

/* Waits for the stream's work; a CUDA status, host-function errors aside. */
static int stream_drain(ferry_stream *s, cuda_stream *cs) {
  int rc = FERRY_CUDA_CHECK(s->dev, cudaEventRecord(cs->done, cs->st), "stream synchronize");
  if (!rc)
    rc = FERRY_CUDA_CHECK(s->dev, cudaEventSynchronize(cs->done),
                          "stream synchronize: work on the stream failed");
  return rc;
}

static int cuda_stream_synchronize(ferry_stream *s) {
  cuda_stream *cs = s->impl;
  int rc = stream_drain(s, cs);
  return rc ? rc : take_sticky(s, cs);
}

static int cuda_stream_destroy(ferry_stream *s) {
  cuda_stream *cs = s->impl;
  int rc = stream_drain(s, cs);
  if (rc) {
    /* Queued host calls point at cs: make sure none is left to run. */
    (void)cudaStreamSynchronize(cs->st);
  } else {
    rc = take_sticky(s, cs);
  }
  (void)cudaEventDestroy(cs->done);
  if (cs->owned) (void)cudaStreamDestroy(cs->st); /* an adopted one stays the caller's */
  (void)cudaGetLastError();
  free(cs);
  s->impl = NULL;
  return rc;
}

static int cuda_stream_query(ferry_stream *s) {
  cuda_stream *cs = s->impl;
  cudaError_t e = cudaStreamQuery(cs->st);
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return FERRY_EAGAIN;
  }
  return FERRY_CUDA_CHECK(s->dev, e, "stream query");
}

static void CUDART_CB host_trampoline(void *p) {
  host_call *c = p;
  int rc = 0;
  if (c->fn)
    rc = c->fn(c->arg);
  else
    memcpy(c->dst, c->src, c->bytes);
  if (rc) {
    int zero = 0;
    atomic_compare_exchange_strong(&c->cs->sticky, &zero, rc);
  }
  free(c);
}

static int enqueue_host_call(ferry_stream *s, host_call *c, const char *what) {
  ferry_device *dev = s->dev;
  cuda_dev *cd = dev->impl;
  cuda_stream *cs = s->impl;
  c->cs = cs;
  int prev, rc;
  rc = FERRY_CUDA_CHECK(dev, dev_enter(cd, &prev), "select CUDA device %d", cd->ordinal);
  if (!rc) {
    rc = FERRY_CUDA_CHECK(dev, cudaLaunchHostFunc(cs->st, host_trampoline, c), "%s", what);
    dev_leave(cd, prev);
  }
  if (rc) free(c); /* never queued, so the trampoline will not free it */
  return rc;
}

static const char *copy_name(ferry_copy_kind k) {
  switch (k) {
  case FERRY_COPY_H2D: return "H2D";
  case FERRY_COPY_D2H: return "D2H";
  case FERRY_COPY_D2D: return "D2D";
  case FERRY_COPY_H2H: return "H2H";
  }
  return "?";
}

static int cuda_memcpy_async(ferry_stream *s, void *dst, const void *src, size_t bytes,
                             ferry_copy_kind kind) {
  ferry_device *dev = s->dev;
  cuda_dev *cd = dev->impl;
  cuda_stream *cs = s->impl;
  if (kind == FERRY_COPY_H2H) {
    /* cudaMemcpyAsync host-to-host is synchronous with the caller (it would
     * wait for the stream's earlier work here); a host call keeps it in
     * stream order and asynchronous. */
    host_call *c = calloc(1, sizeof *c);
    if (!c) return FERRY_DEV_ERR(dev, FERRY_ENOMEM, "memcpy H2H: out of memory");
    c->dst = dst;
    c->src = src;
    c->bytes = bytes;
    return enqueue_host_call(s, c, "memcpy H2H (host call)");
  }
  enum cudaMemcpyKind k = kind == FERRY_COPY_H2D   ? cudaMemcpyHostToDevice
                          : kind == FERRY_COPY_D2H ? cudaMemcpyDeviceToHost
                                                   : cudaMemcpyDeviceToDevice;
  int prev;
  ENTER(dev, cd, prev);
  int rc =
      FERRY_CUDA_CHECK(dev, cudaMemcpyAsync(dst, src, bytes, k, cs->st),
                       "memcpy %s of %zu bytes, dst %p, src %p", copy_name(kind), bytes, dst, src);
  dev_leave(cd, prev);
  return rc;
}

static int cuda_memset_async(ferry_stream *s, void *dst, int value, size_t bytes) {
  ferry_device *dev = s->dev;
  cuda_dev *cd = dev->impl;
  cuda_stream *cs = s->impl;
  int prev;
  ENTER(dev, cd, prev);
  int rc = FERRY_CUDA_CHECK(dev, cudaMemsetAsync(dst, value, bytes, cs->st),
                            "memset of %zu bytes at %p", bytes, dst);
  dev_leave(cd, prev);
  return rc;
}

static int cuda_host_func(ferry_stream *s, ferry_host_fn fn, void *arg) {
  host_call *c = calloc(1, sizeof *c);
  if (!c) return FERRY_DEV_ERR(s->dev, FERRY_ENOMEM, "launch host func: out of memory");
  c->fn = fn;
  c->arg = arg;
  return enqueue_host_call(s, c, "launch host func");
}

static int cuda_convert(ferry_stream *s, void *dst, ferry_dtype dt, const void *src, ferry_dtype st,
                        size_t n, float scale) {
  ferry_device *dev = s->dev;
  cuda_dev *cd = dev->impl;
  cuda_stream *cs = s->impl;
  int prev;
  ENTER(dev, cd, prev);
  int rc = FERRY_CUDA_CHECK(
      dev, ferry_cuda_convert_launch(cs->st, dst, (int)dt, src, (int)st, n, scale, cd->default_nan),
      "convert of %zu elements %s to %s (scale %g), dst %p, src %p (kernel launch)", n,
      ferry_dtype_name(st), ferry_dtype_name(dt), (double)scale, dst, src);
  dev_leave(cd, prev);
  return rc;
}

static int cuda_sleep(ferry_stream *s, double seconds) {
  ferry_device *dev = s->dev;
  cuda_dev *cd = dev->impl;
  cuda_stream *cs = s->impl;
  int prev, rc = FERRY_OK;
  ENTER(dev, cd, prev);
  /* At most one second per kernel, so a long sleep never trips a display
   * GPU's watchdog. */
  const unsigned long long max_ns = 1000000000ull;
  unsigned long long left = (unsigned long long)(seconds * 1e9 + 0.5);
  while (left && !rc) {
    unsigned long long ns = left < max_ns ? left : max_ns;
    rc = FERRY_CUDA_CHECK(dev, ferry_cuda_sleep_launch(cs->st, ns),
                          "stream sleep of %g s (sleep kernel launch)", seconds);
    left -= ns;
  }
  dev_leave(cd, prev);
  return rc;
}

/* ---- events ------------------------------------------------------------- */

static int cuda_event_create(ferry_event *e) {
  ferry_device *dev = e->dev;
  cuda_dev *cd = dev->impl;
  cuda_event *ce = calloc(1, sizeof *ce);
  if (!ce) return FERRY_DEV_ERR(dev, FERRY_ENOMEM, "event create: out of memory");
  atomic_init(&ce->recorded, 0);
  int prev, rc;
  rc = FERRY_CUDA_CHECK(dev, dev_enter(cd, &prev), "select CUDA device %d", cd->ordinal);
  if (!rc) {
    /* Timing kept for elapsed_ms; blocking sync so waiters sleep. */
    rc = FERRY_CUDA_CHECK(dev, cudaEventCreateWithFlags(&ce->ev, cudaEventBlockingSync),
                          "event create");
    dev_leave(cd, prev);
  }
  if (rc) {
    free(ce);
    return rc;
  }
  e->impl = ce;
  return FERRY_OK;
}

static int cuda_event_destroy(ferry_event *e) {
  cuda_event *ce = e->impl;
  /* A pending record is fine: the runtime frees the event once it passed. */
  int rc = FERRY_CUDA_CHECK(e->dev, cudaEventDestroy(ce->ev), "event destroy");
  free(ce);
  e->impl = NULL;
  return rc;
}

static int cuda_event_record(ferry_event *e, ferry_stream *s) {
  ferry_device *dev = s->dev;
  cuda_dev *cd = dev->impl;
  cuda_event *ce = e->impl;
  cuda_stream *cs = s->impl;
  int prev;
  ENTER(dev, cd, prev);
  int rc = FERRY_CUDA_CHECK(dev, cudaEventRecord(ce->ev, cs->st), "event record");
  dev_leave(cd, prev);
  if (!rc) atomic_store(&ce->recorded, 1);
  return rc;
}

static int cuda_stream_wait_event(ferry_stream *s, ferry_event *e) {
  ferry_device *dev = s->dev;
  cuda_dev *cd = dev->impl;
  cuda_event *ce = e->impl;
  cuda_stream *cs = s->impl;
  int prev;
  ENTER(dev, cd, prev);
  /* A never-recorded event is a no-op for the runtime, as for ferry. */
  int rc = FERRY_CUDA_CHECK(dev, cudaStreamWaitEvent(cs->st, ce->ev, 0), "stream wait event");
  dev_leave(cd, prev);
  return rc;
}

static int cuda_event_synchronize(ferry_event *e) {
  cuda_event *ce = e->impl;
  return FERRY_CUDA_CHECK(e->dev, cudaEventSynchronize(ce->ev),
                          "event synchronize: work before the record failed");
}

static int cuda_event_query(ferry_event *e) {
  cuda_event *ce = e->impl;
  cudaError_t r = cudaEventQuery(ce->ev);
  if (r == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return FERRY_EAGAIN;
  }
  return FERRY_CUDA_CHECK(e->dev, r, "event query");
}

static int cuda_event_elapsed_ms(ferry_event *a, ferry_event *b, float *ms) {
  cuda_event *ca = a->impl, *cb = b->impl;
  if (!atomic_load(&ca->recorded) || !atomic_load(&cb->recorded))
    return FERRY_DEV_ERR(a->dev, FERRY_ESTATE,
                         "event elapsed: both events must be recorded and complete");
  cudaError_t r = cudaEventElapsedTime(ms, ca->ev, cb->ev);
  if (r == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return FERRY_DEV_ERR(a->dev, FERRY_ESTATE,
                         "event elapsed: both events must be recorded and complete");
  }
  return FERRY_CUDA_CHECK(a->dev, r, "event elapsed");
}

const ferry_backend_ops ferry_backend_cuda = {
    /* .name = */ "cuda",
    /* .init = */ cuda_init,
    /* .shutdown = */ cuda_shutdown,
    /* .info = */ cuda_info,
    /* .host_alloc = */ cuda_host_alloc,
    /* .host_free = */ cuda_host_free,
    /* .stream_create = */ cuda_stream_create,
    /* .stream_wrap = */ cuda_stream_wrap,
    /* .stream_native = */ cuda_stream_native,
    /* .stream_destroy = */ cuda_stream_destroy,
    /* .stream_synchronize = */ cuda_stream_synchronize,
    /* .stream_query = */ cuda_stream_query,
    /* .memcpy_async = */ cuda_memcpy_async,
    /* .memset_async = */ cuda_memset_async,
    /* .host_func = */ cuda_host_func,
    /* .convert = */ cuda_convert,
    /* .sleep = */ cuda_sleep,
    /* .event_create = */ cuda_event_create,
    /* .event_destroy = */ cuda_event_destroy,
    /* .event_record = */ cuda_event_record,
    /* .stream_wait_event = */ cuda_stream_wait_event,
    /* .event_synchronize = */ cuda_event_synchronize,
    /* .event_query = */ cuda_event_query,
    /* .event_elapsed_ms = */ cuda_event_elapsed_ms,
};

/* ---- probes --------------------------------------------------------------- */

int ferry_cuda_compiled(void) { return 1; }

int ferry_cuda_available(char *why, size_t why_len) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    count_why(why, why_len, e);
    return 0;
  }
  if (n <= 0) {
    put_why(why, why_len, "the CUDA runtime reports no device");
    return 0;
  }
  return 1;
}

/* Free memory per device from NVML, when the driver's libnvidia-ml is there
 * (loaded at run time: no build or link dependency). NVML asks the driver
 * without a CUDA context, which cudaMemGetInfo would create on every GPU. */
typedef struct {
  unsigned long long total, free, used;
} nvml_memory;

typedef struct {
  void *lib;
  int (*init)(void);
  int (*shutdown)(void);
  int (*by_bus)(const char *bus, void **device);
  int (*memory)(void *device, nvml_memory *mem);
} nvml_api;

static int nvml_open(nvml_api *n) {
  memset(n, 0, sizeof n[0]);
  n->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!n->lib) return 0;
  *(void **)&n->init = dlsym(n->lib, "nvmlInit_v2");
  *(void **)&n->shutdown = dlsym(n->lib, "nvmlShutdown");
  *(void **)&n->by_bus = dlsym(n->lib, "nvmlDeviceGetHandleByPciBusId_v2");
  *(void **)&n->memory = dlsym(n->lib, "nvmlDeviceGetMemoryInfo");
  if (n->init && n->shutdown && n->by_bus && n->memory && n->init() == 0) return 1;
  dlclose(n->lib);
  n->lib = NULL;
  return 0;
}

static void nvml_close(nvml_api *n) {
  if (!n->lib) return;
  (void)n->shutdown();
  dlclose(n->lib);
}

/* Device i's free memory, 0 when NVML cannot say. */
static size_t nvml_free(nvml_api *n, int ordinal) {
  char bus[64];
  void *d = NULL;
  nvml_memory mem;
  if (!n->lib || cudaDeviceGetPCIBusId(bus, (int)sizeof bus, ordinal) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  if (n->by_bus(bus, &d) != 0 || n->memory(d, &mem) != 0) return 0;
  return (size_t)mem.free;
}

/* Lists the devices with calls that create no context (properties, PCI bus
 * id); free memory comes from NVML. */
int ferry_gpu_list(ferry_gpu_info *out, int max, int *count, char *why, size_t why_len) {
  if (!count || max < 0 || (max > 0 && !out)) return FERRY_EINVAL;
  *count = 0;
  put_why(why, why_len, "%s", "");
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n <= 0) {
    (void)cudaGetLastError();
    if (e != cudaSuccess)
      count_why(why, why_len, e);
    else
      put_why(why, why_len, "the CUDA runtime reports no device");
    return FERRY_OK;
  }
  nvml_api nv;
  nvml_open(&nv);
  int k = 0;
  for (int i = 0; i < n && k < max; i++) {
    ferry_gpu_info *g = &out[k];
    memset(g, 0, sizeof *g);
    g->ordinal = i;
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
      (void)cudaGetLastError();
      continue; /* a device the runtime cannot describe is not listed */
    }
    set_name(g->name, sizeof g->name, prop.name);
    g->total_memory = prop.totalGlobalMem;
    g->cc_major = prop.major;
    g->cc_minor = prop.minor;
    g->free_memory = nvml_free(&nv, i);
    read_pcie(i, &g->pcie_gen, &g->pcie_width);
    k++;
  }
  nvml_close(&nv);
  *count = k;
  if (k == 0) put_why(why, why_len, "%d CUDA device(s) present, none could be queried", n);
  return FERRY_OK;
}
