/* ferry/device.h — the device API (the backend that stands for a GPU) and the machine.
 * Part of the public API: include ferry.h, which includes this file. */
#ifndef FERRY_API_DEVICE_H
#define FERRY_API_DEVICE_H

#ifndef FERRY_H
#error "include ferry.h, not ferry/device.h"
#endif

/* ------------------------------------------------------------------------ */
/* Devices: the backend that stands for a GPU                                */

typedef struct ferry_device ferry_device;
typedef struct ferry_stream ferry_stream;
typedef struct ferry_event ferry_event;

typedef enum {
  FERRY_DEVICE_AUTO = 0, /* cuda when a CUDA device is present, else host */
  FERRY_DEVICE_HOST = 1, /* emulated GPU: host arena with a hard cap */
  FERRY_DEVICE_CUDA = 2
} ferry_device_kind;

typedef struct {
  ferry_device_kind kind;
  /* Bytes of device memory the device may hand out, reserved at create. The
   * host backend requires it (> 0). For cuda, 0 means "free memory less
   * 5%". */
  size_t capacity;
  int cuda_ordinal;      /* which CUDA device (default 0) */
  int host_lock_pinned;  /* host backend: mlock pinned allocations (0/1) */
  ferry_log_fn log;      /* optional; NULL = the process-wide logger */
  void *log_user;
  int log_level;         /* used only when log != NULL */
} ferry_device_config;

/* The defaults: kind AUTO, capacity 0, ordinal 0. */
FERRY_API ferry_device_config ferry_device_config_default(void);

typedef struct {
  char name[128];          /* "host (emulated)" or the CUDA device name */
  ferry_device_kind kind;  /* the backend actually used */
  int emulated;            /* 1 for host */
  size_t capacity;         /* the cap on ferry_device_alloc */
  size_t used;             /* bytes currently allocated (aligned sizes) */
  size_t peak;             /* high-water mark of used */
  size_t total_memory;     /* physical memory of the device */
  size_t free_memory;      /* as the runtime reports it now */
  int pcie_gen, pcie_width; /* 0 when unknown */
  int host_lock_pinned;    /* the config's: pinned allocations are mlock'ed (host
                              backend), so they count against RLIMIT_MEMLOCK */
} ferry_device_info;

FERRY_API int ferry_device_create(const ferry_device_config *cfg, ferry_device **out);
/* Drains every stream, frees every allocation still held, destroys events.
 * Handles of streams and events die with the device. NULL is allowed. */
FERRY_API void ferry_device_destroy(ferry_device *dev);
/* The message of the last failed call on this device or on one of its
 * streams and events: what failed and with which sizes, pointers, paths.
 * Valid until the next failing call; "" when none. */
FERRY_API const char *ferry_device_last_error(const ferry_device *dev);
FERRY_API int ferry_device_get_info(ferry_device *dev, ferry_device_info *out);

/* Device memory, 256-byte aligned. Past the capacity: FERRY_ENOMEM. Freeing
 * a pointer this device did not return, or twice: FERRY_EINVAL. */
FERRY_API int ferry_device_alloc(ferry_device *dev, size_t bytes, void **ptr);
FERRY_API int ferry_device_free(ferry_device *dev, void *ptr);
/* Pinned (page-locked) host memory for fast async copies, page aligned. */
FERRY_API int ferry_host_alloc(ferry_device *dev, size_t bytes, void **ptr);
FERRY_API int ferry_host_free(ferry_device *dev, void *ptr);

typedef enum {
  FERRY_COPY_H2D = 0,
  FERRY_COPY_D2H = 1,
  FERRY_COPY_D2D = 2,
  FERRY_COPY_H2H = 3
} ferry_copy_kind;

/* Streams run their work in order; work on different streams may overlap. */
FERRY_API int ferry_stream_create(ferry_device *dev, ferry_stream **out);
/* Waits for the stream's work, then destroys it. NULL is allowed. */
FERRY_API int ferry_stream_destroy(ferry_stream *s);
FERRY_API int ferry_stream_synchronize(ferry_stream *s);
/* 0 when all enqueued work is done, FERRY_EAGAIN when not. */
FERRY_API int ferry_stream_query(ferry_stream *s);

/* The backend's own stream behind s: a cudaStream_t on cuda, NULL on the
 * host backend (which has none). For launching the caller's kernels in the
 * same order as ferry's copies. */
FERRY_API int ferry_stream_native(ferry_stream *s, void **out);
/* Adopts a stream the caller made (a cudaStream_t on cuda, of this device)
 * as a ferry stream, so ferry's copies and events join the caller's order.
 * The caller keeps ownership: ferry_stream_destroy (and device destroy)
 * synchronizes it and forgets it, never destroys it. The host backend has
 * no native streams: FERRY_ENOTSUP. native NULL: FERRY_EINVAL. */
FERRY_API int ferry_stream_wrap(ferry_device *dev, void *native, ferry_stream **out);

FERRY_API int ferry_memcpy_async(ferry_stream *s, void *dst, const void *src, size_t bytes,
                                 ferry_copy_kind kind);
FERRY_API int ferry_memset_async(ferry_stream *s, void *dst, int value, size_t bytes);

/* n elements of src (dtype st, device memory) times `scale` into dst (dtype
 * dt, device memory), in stream order, rounded to nearest even as
 * ferry_dtype_convert does (same bits on both backends). dst and src may be
 * the same buffer only when the two dtypes have the same size. */
FERRY_API int ferry_convert_async(ferry_stream *s, void *dst, ferry_dtype dt, const void *src,
                                  ferry_dtype st, size_t n, float scale);

/* A host function run in stream order. On the host backend it may read and
 * write device memory (it is an emulated kernel); on cuda it runs on a
 * runtime thread and must not touch device memory. On either backend it may
 * call neither CUDA nor any ferry device function (no copy, launch, record
 * or synchronize): on cuda such a call deadlocks or fails. A non-zero return
 * is kept and reported by the next synchronize of the stream. */
typedef int (*ferry_host_fn)(void *arg);
FERRY_API int ferry_launch_host_func(ferry_stream *s, ferry_host_fn fn, void *arg);
/* Occupies the stream for `seconds` without using a CPU core: a stand-in for
 * GPU compute of known duration. */
FERRY_API int ferry_stream_sleep(ferry_stream *s, double seconds);

FERRY_API int ferry_event_create(ferry_device *dev, ferry_event **out);
FERRY_API int ferry_event_destroy(ferry_event *e);
/* Marks the point in the stream's order reached when all work enqueued so
 * far on it is done. Re-recording moves the mark. */
FERRY_API int ferry_event_record(ferry_event *e, ferry_stream *s);
/* Work enqueued on s after this call waits until e's last record is done.
 * Waiting on a never-recorded event does not wait. */
FERRY_API int ferry_stream_wait_event(ferry_stream *s, ferry_event *e);
FERRY_API int ferry_event_synchronize(ferry_event *e);
/* 0 when done (or never recorded), FERRY_EAGAIN when not yet. */
FERRY_API int ferry_event_query(ferry_event *e);
/* Milliseconds between two completed records. */
FERRY_API int ferry_event_elapsed_ms(ferry_event *start, ferry_event *end, float *ms);

/* ------------------------------------------------------------------------ */
/* The machine: what ferry info reports                                      */

#define FERRY_MAX_NUMA 16
#define FERRY_MAX_GPUS 16

enum {
  FERRY_SIMD_SSE42 = 1u << 0,
  FERRY_SIMD_AVX2 = 1u << 1,
  FERRY_SIMD_FMA = 1u << 2,
  FERRY_SIMD_F16C = 1u << 3,
  FERRY_SIMD_AVX512F = 1u << 4,
  FERRY_SIMD_AVX512BW = 1u << 5,
  FERRY_SIMD_AVX512VL = 1u << 6,
  FERRY_SIMD_AVX512BF16 = 1u << 7,
  FERRY_SIMD_AVX512FP16 = 1u << 8
};

typedef struct {
  char cpu_model[128];
  int cores;           /* physical cores */
  int threads;         /* processing units */
  unsigned simd;       /* FERRY_SIMD_* bits the CPU and OS support */
  int numa_nodes;
  uint64_t numa_memory[FERRY_MAX_NUMA]; /* bytes per node */
  uint64_t ram_bytes;
  uint64_t ram_available_bytes;
  uint64_t memlock_bytes; /* RLIMIT_MEMLOCK soft limit; UINT64_MAX = unlimited */
  uint64_t hugepage_bytes; /* default huge page size, 0 when none */
} ferry_host_info;

FERRY_API int ferry_host_get_info(ferry_host_info *out);
/* Deprecated since 0.2, removed in 0.3. */
FERRY_API FERRY_DEPRECATED("ferry_host_get_info") int ferry_host_info_get(ferry_host_info *out);

typedef struct {
  char name[128];
  int ordinal;
  size_t total_memory;
  size_t free_memory; /* from NVML (the driver's libnvidia-ml, loaded at run time);
                         0 when it is not there. Listing creates no CUDA context. */
  int cc_major, cc_minor;
  int pcie_gen, pcie_width; /* 0 when unknown */
} ferry_gpu_info;

/* 1 when this library was built with the CUDA backend. */
FERRY_API int ferry_cuda_compiled(void);
/* Lists CUDA devices. 0 devices is success (with *count 0); `why` then says
 * why (no driver, no device, not compiled) when why != NULL. */
FERRY_API int ferry_gpu_list(ferry_gpu_info *out, int max, int *count, char *why, size_t why_len);

/* io_uring: 0 when a ring can be created and used here, else a status with
 * the reason in `why`. */
FERRY_API int ferry_io_uring_probe(char *why, size_t why_len);

typedef struct {
  char fs_type[32];        /* "ext4", "xfs", "tmpfs", ... or "unknown" */
  int o_direct;            /* 1 when O_DIRECT opens and writes work there */
  size_t dio_mem_align;    /* required buffer alignment for O_DIRECT */
  size_t dio_offset_align; /* required offset/length alignment */
  uint64_t free_bytes;     /* available to this user */
  uint64_t total_bytes;
  /* 1 when the mount discards freed blocks at once (-o discard, btrfs
   * discard=async): a removed swap file is trimmed, and the next first
   * write over those blocks may be slower on thin-provisioned or virtual
   * disks; 0 when not; -1 when /proc/self/mountinfo does not say. */
  int online_discard;
} ferry_path_info;

/* Probes a directory: file system, free space, whether O_DIRECT works and
 * with which alignment (a small temporary file is created and removed). */
FERRY_API int ferry_path_probe(const char *dir, ferry_path_info *out, char *why, size_t why_len);


#endif /* FERRY_API_DEVICE_H */
