/* ferry.h — the public API of ferry, an offload-centric memory engine.
 *
 * Everything a training loop, a tool or a test outside the library may call.
 * Opaque handles, `ferry_<thing>_<verb>` names, every function returns 0 or a
 * negative FERRY_E... status and leaves a message on the object it was called
 * on. The library never exits and never prints: it logs through a callback.
 */
#ifndef FERRY_H
#define FERRY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(FERRY_BUILDING_LIBRARY) && defined(__GNUC__)
#define FERRY_API __attribute__((visibility("default")))
#else
#define FERRY_API
#endif

/* Names are ferry_<object>_<verb> (ferry_device_get_info, ferry_swap_open),
 * except the training-loop calls, which are verbs on the engine
 * (ferry_fetch, ferry_release, ferry_grads_ready, ferry_step, ...). An old
 * name kept for one release is marked FERRY_DEPRECATED("new name"). */
#if defined(__GNUC__)
#define FERRY_DEPRECATED(use) __attribute__((deprecated("use " use)))
#else
#define FERRY_DEPRECATED(use)
#endif

/* ------------------------------------------------------------------------ */
/* Version                                                                   */

#define FERRY_VERSION_MAJOR 0
#define FERRY_VERSION_MINOR 1
#define FERRY_VERSION_PATCH 0
#define FERRY_VERSION_STRING "0.1.0"
#define FERRY_VERSION_NUMBER \
  (FERRY_VERSION_MAJOR * 10000 + FERRY_VERSION_MINOR * 100 + FERRY_VERSION_PATCH)

/* The version of the library actually linked, "MAJOR.MINOR.PATCH". */
FERRY_API const char *ferry_version(void);

/* ------------------------------------------------------------------------ */
/* Status codes                                                              */

enum {
  FERRY_OK = 0,
  FERRY_EINVAL = -1,    /* bad argument: null, out of range, foreign pointer */
  FERRY_ENOMEM = -2,    /* a budget, an arena or the system is out of memory */
  FERRY_ENODEV = -3,    /* no such device, or the device runtime failed */
  FERRY_EIO = -4,       /* an I/O request failed */
  FERRY_ENOSPC = -5,    /* no space left on a file system */
  FERRY_ECORRUPT = -6,  /* data failed a check (CRC, header, bounds) */
  FERRY_EAGAIN = -7,    /* not done yet: try again */
  FERRY_ENOTSUP = -8,   /* not supported by this build, backend or system */
  FERRY_ECONFIG = -9,   /* configuration refused */
  FERRY_EBUSY = -10,    /* object in use */
  FERRY_ESTATE = -11,   /* call not valid in the object's current state */
  FERRY_ENOENT = -12,   /* no such file, tensor, group or key */
  FERRY_EPERM = -13,    /* permission denied */
  FERRY_EOVERFLOW = -14 /* a size or count does not fit */
};

/* A short, static description of a status code ("invalid argument"). */
FERRY_API const char *ferry_strerror(int status);

/* The message of the last failure, in this thread, of a call that had no
 * object to hold it (a failed `_create`, a probe). "" when none. */
FERRY_API const char *ferry_last_error(void);

/* Parses a size: "64M", "20G", "1.5T", "512k", "4096" (powers of 1024; an
 * optional "iB"/"B" suffix). FERRY_EINVAL for anything else, FERRY_EOVERFLOW
 * past 2^64. */
FERRY_API int ferry_parse_size(const char *s, uint64_t *out);

/* ------------------------------------------------------------------------ */
/* Element types: one list for every part (optimizer buffers, the memory     */
/* manager's tensors, safetensors files, the engine's precision.params)      */

typedef enum {
  FERRY_DT_NONE = 0, /* no buffer */
  FERRY_DT_F32 = 1,
  FERRY_DT_F16 = 2,
  FERRY_DT_BF16 = 3,
  FERRY_DT_F64 = 4,
  FERRY_DT_BOOL = 5,
  FERRY_DT_U8 = 6,
  FERRY_DT_I8 = 7,
  FERRY_DT_F8_E5M2 = 8,
  FERRY_DT_F8_E4M3 = 9,
  FERRY_DT_I16 = 10,
  FERRY_DT_U16 = 11,
  FERRY_DT_I32 = 12,
  FERRY_DT_U32 = 13,
  FERRY_DT_I64 = 14,
  FERRY_DT_U64 = 15,
  FERRY_DT_COUNT
} ferry_dtype;

/* The name as safetensors spells it ("F32", "BF16", ...) and the element
 * size in bytes; NULL / 0 for FERRY_DT_NONE and values out of range. */
FERRY_API const char *ferry_dtype_name(ferry_dtype dtype);
FERRY_API size_t ferry_dtype_size(ferry_dtype dtype);
/* The dtype named `name` (len bytes, case-sensitive); -1 when none. */
FERRY_API int ferry_dtype_parse(const char *name, size_t len);
/* Element i of a buffer of F32, F16 or BF16, as a float; and the store of a
 * float into one (round to nearest even, NaN kept and made quiet, as the
 * x86 conversion instructions do). Other dtypes: load 0, store nothing. */
FERRY_API float ferry_dtype_load(const void *buf, ferry_dtype dtype, size_t i);
FERRY_API void ferry_dtype_store(void *buf, ferry_dtype dtype, size_t i, float x);
/* Converts n elements of src (src_dtype) into dst (dst_dtype), each as
 * float times `scale` (1: exact), both F32, F16 or BF16 (FERRY_EINVAL
 * otherwise). dst and src may not overlap unless they are the same buffer
 * of one dtype. */
FERRY_API int ferry_dtype_convert(void *dst, ferry_dtype dst_dtype, const void *src,
                                  ferry_dtype src_dtype, size_t n, float scale);

/* ------------------------------------------------------------------------ */
/* Logging                                                                   */

enum {
  FERRY_LOG_SILENT = 0,
  FERRY_LOG_ERROR = 1,
  FERRY_LOG_WARN = 2,
  FERRY_LOG_INFO = 3,
  FERRY_LOG_DEBUG = 4
};

/* Called with one complete message line (no trailing newline). It may be
 * called from any of ferry's threads, so it must be thread-safe. */
typedef void (*ferry_log_fn)(void *user, int level, const char *message);

/* The process-wide logger used by objects that were not given their own.
 * Default: none (silent). Messages above `level` are dropped. */
FERRY_API void ferry_log_set(ferry_log_fn fn, void *user, int level);

/* A ready logger that writes "ferry: <level>: <message>\n" to stderr; user
 * is ignored. Programs may install it; the library never does. */
FERRY_API void ferry_log_stderr(void *user, int level, const char *message);

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

FERRY_API int ferry_memcpy_async(ferry_stream *s, void *dst, const void *src, size_t bytes,
                                 ferry_copy_kind kind);
FERRY_API int ferry_memset_async(ferry_stream *s, void *dst, int value, size_t bytes);

/* A host function run in stream order. On the host backend it may read and
 * write device memory (it is an emulated kernel); on cuda it runs on a
 * runtime thread and must not touch device memory. A non-zero return is
 * kept and reported by the next synchronize of the stream. */
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
  size_t free_memory;
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

/* ------------------------------------------------------------------------ */
/* Engine configuration (offload/)                                           */

/* Every key of the engine's libconfig file (docs/CONFIG.md lists them with
 * their defaults) can be loaded from a file or a string, or set from C with
 * the same dotted name ("tiers.gpu.budget") and the same value syntax
 * ("20G"). Bad input is refused with FERRY_ECONFIG and a message naming the
 * file, line, key, value and what was expected; an unknown key is an error
 * with the nearest valid key suggested. */
typedef struct ferry_config ferry_config;

/* A configuration holding every default. */
FERRY_API int ferry_config_create(ferry_config **out);
FERRY_API void ferry_config_destroy(ferry_config *c);
FERRY_API const char *ferry_config_last_error(const ferry_config *c);
/* Applies a file's settings over the current values. Nothing is changed
 * when the file is refused. */
FERRY_API int ferry_config_load_file(ferry_config *c, const char *path);
/* The same from text; `name` stands for the file name in messages. */
FERRY_API int ferry_config_load_string(ferry_config *c, const char *text, const char *name);
/* Sets one key from its text form: sizes "64M", numbers, true/false, enum
 * names, arrays as "a, b". */
FERRY_API int ferry_config_set(ferry_config *c, const char *key, const char *value);
/* The current value of a key in its text form. */
FERRY_API int ferry_config_get(const ferry_config *c, const char *key, char *buf, size_t len);
/* Writes the whole configuration as a libconfig file that loads back to the
 * same values. */
FERRY_API int ferry_config_write_file(const ferry_config *c, const char *path);
/* The number of keys, and the i-th key's name, type, default and meaning
 * (for documentation and tools). */
FERRY_API int ferry_config_key_count(void);
FERRY_API int ferry_config_key_info(int i, const char **name, const char **type,
                                    const char **default_value, const char **description);

/* ------------------------------------------------------------------------ */
/* safetensors files (offload/)                                              */

/* Hugging Face's safetensors format: an 8-byte little-endian header length,
 * a JSON header naming each tensor's dtype, shape and byte range, then the
 * raw little-endian data. The reader parses and checks the whole header at
 * open (a hostile file is refused with FERRY_ECORRUPT and the reason, never
 * read out of bounds) and then streams tensor bytes with pread into the
 * caller's buffer, so a big model never has to be in RAM whole. Sharded
 * models (model.safetensors.index.json and its weight_map) open as one. */

/* A tensor's dtype is a ferry_dtype (every safetensors dtype has one, named
 * as safetensors spells it: ferry_dtype_name). */

#define FERRY_SAFETENSORS_MAX_DIMS 8

typedef struct {
  const char *name;    /* valid while the file is open */
  ferry_dtype dtype;
  int ndim;            /* 0 for a scalar */
  int64_t shape[FERRY_SAFETENSORS_MAX_DIMS];
  uint64_t numel;
  uint64_t nbytes;     /* numel * element size */
  int shard;           /* which file of a sharded model (0 when one file) */
  uint64_t offset;     /* absolute byte offset of the data in that file */
} ferry_safetensors_tensor;

/* Deprecated since 0.2, removed in 0.3: the safetensors names of before
 * ferry_dtype. */
typedef ferry_dtype ferry_st_dtype FERRY_DEPRECATED("ferry_dtype");
typedef ferry_safetensors_tensor ferry_st_tensor FERRY_DEPRECATED("ferry_safetensors_tensor");
#define FERRY_ST_MAX_DIMS FERRY_SAFETENSORS_MAX_DIMS
#define FERRY_ST_BOOL FERRY_DT_BOOL
#define FERRY_ST_U8 FERRY_DT_U8
#define FERRY_ST_I8 FERRY_DT_I8
#define FERRY_ST_F8_E5M2 FERRY_DT_F8_E5M2
#define FERRY_ST_F8_E4M3 FERRY_DT_F8_E4M3
#define FERRY_ST_I16 FERRY_DT_I16
#define FERRY_ST_U16 FERRY_DT_U16
#define FERRY_ST_F16 FERRY_DT_F16
#define FERRY_ST_BF16 FERRY_DT_BF16
#define FERRY_ST_I32 FERRY_DT_I32
#define FERRY_ST_U32 FERRY_DT_U32
#define FERRY_ST_F32 FERRY_DT_F32
#define FERRY_ST_F64 FERRY_DT_F64
#define FERRY_ST_I64 FERRY_DT_I64
#define FERRY_ST_U64 FERRY_DT_U64
FERRY_API FERRY_DEPRECATED("ferry_dtype_name") const char *ferry_st_dtype_name(ferry_dtype dtype);
FERRY_API FERRY_DEPRECATED("ferry_dtype_size") size_t ferry_st_dtype_size(ferry_dtype dtype);

typedef struct ferry_safetensors ferry_safetensors;

/* Opens a file, or a model: a directory holding model.safetensors or
 * model.safetensors.index.json, or an index .json file itself (every shard
 * it names is opened and checked; the weight_map must match the shards'
 * tensors exactly). On failure *out is NULL and ferry_last_error() says
 * why: FERRY_ENOENT, FERRY_EIO, FERRY_ECORRUPT (with the tensor or field
 * and what is wrong), FERRY_ENOMEM. */
FERRY_API int ferry_safetensors_open(const char *path, ferry_safetensors **out);
/* The same over a caller's buffer holding a whole file (kept, not copied:
 * it must outlive the handle). For tests and fuzzing. */
FERRY_API int ferry_safetensors_open_memory(const void *data, size_t len, ferry_safetensors **out);
FERRY_API void ferry_safetensors_close(ferry_safetensors *f);
FERRY_API const char *ferry_safetensors_last_error(const ferry_safetensors *f);

/* Tensors in file order (shard, then data offset). */
FERRY_API size_t ferry_safetensors_count(const ferry_safetensors *f);
FERRY_API int ferry_safetensors_get(const ferry_safetensors *f, size_t i, ferry_safetensors_tensor *out);
/* By name; FERRY_ENOENT when absent. `index` (may be NULL) gets i. */
FERRY_API int ferry_safetensors_find(const ferry_safetensors *f, const char *name,
                                     ferry_safetensors_tensor *out, size_t *index);
/* Copies `bytes` bytes of tensor i starting `offset` bytes into its data.
 * A range past the tensor is FERRY_EINVAL; a file that shrank since open is
 * FERRY_ECORRUPT; a failed read FERRY_EIO. */
FERRY_API int ferry_safetensors_read(ferry_safetensors *f, size_t i, uint64_t offset, void *buf,
                                     size_t bytes);
/* The "__metadata__" string map (of the first shard): count, i-th pair, and
 * lookup by key (NULL when absent). */
FERRY_API size_t ferry_safetensors_metadata_count(const ferry_safetensors *f);
FERRY_API int ferry_safetensors_metadata_get(const ferry_safetensors *f, size_t i,
                                             const char **key, const char **value);
FERRY_API const char *ferry_safetensors_metadata_find(const ferry_safetensors *f,
                                                      const char *key);
/* Number of files (1 unless sharded) and the i-th file's path ("" for
 * memory). */
FERRY_API int ferry_safetensors_shard_count(const ferry_safetensors *f);
FERRY_API const char *ferry_safetensors_shard_path(const ferry_safetensors *f, int i);

/* The writer streams a model to disk: declare every tensor, then give each
 * tensor's bytes (in one or several pieces) in the writer's order, then
 * finish. The bytes are deterministic and laid out as Hugging Face's writer
 * does: data sorted by dtype (widest first, as its dtype order) then name,
 * header keys in data order after "__metadata__" (its keys sorted), header
 * padded with spaces to a multiple of 8. With max_shard_bytes > 0, `path` is
 * a directory: one model.safetensors when everything fits in one shard, else
 * model-0000i-of-0000N.safetensors shards filled in data order plus a
 * model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map"},
 * sorted keys, indent 2). Every file is fsynced at finish. */
typedef struct ferry_safetensors_writer ferry_safetensors_writer;

FERRY_API int ferry_safetensors_writer_create(const char *path, uint64_t max_shard_bytes,
                                              ferry_safetensors_writer **out);
/* Frees; a writer not finished removes the files it made. */
FERRY_API void ferry_safetensors_writer_destroy(ferry_safetensors_writer *w);
FERRY_API const char *ferry_safetensors_writer_last_error(const ferry_safetensors_writer *w);
/* Before the first write: one metadata pair (a key again replaces it). */
FERRY_API int ferry_safetensors_writer_metadata(ferry_safetensors_writer *w, const char *key,
                                                const char *value);
/* Before the first write: a tensor (duplicate names: FERRY_EINVAL). */
FERRY_API int ferry_safetensors_writer_add(ferry_safetensors_writer *w, const char *name,
                                           ferry_dtype dtype, int ndim, const int64_t *shape);
/* The name of the tensor whose bytes come next (NULL when all are written);
 * the first call fixes the layout. */
FERRY_API const char *ferry_safetensors_writer_next(ferry_safetensors_writer *w);
/* The next `bytes` bytes of tensor `name`, which must be the one `_next`
 * names (FERRY_ESTATE otherwise); a piece may not run past its end. */
FERRY_API int ferry_safetensors_writer_write(ferry_safetensors_writer *w, const char *name,
                                             const void *data, size_t bytes);
/* Checks every byte was given, writes the index, fsyncs and closes. */
FERRY_API int ferry_safetensors_writer_finish(ferry_safetensors_writer *w);

/* ------------------------------------------------------------------------ */
/* CPU optimizers (optim/)                                                   */

/* The step runs on the CPU over spans of fp32 master weights in host memory,
 * while the GPU computes. One fused pass per element: read the gradient
 * (fp32, fp16 or bf16) times one scale, update the states, write the master
 * and, when asked, a 16-bit copy of the new params (round to nearest even,
 * NaN kept; the AVX512-BF16 instruction flushes bf16 subnormals, |x| < 1.2e-38,
 * to zero) into a separate buffer ready to upload. SIMD kernels (AVX2+FMA+
 * F16C, AVX-512) are chosen by CPUID; FERRY_SIMD=scalar|avx2|avx512 forces
 * one. States must be zeroed (or loaded from a checkpoint) before step 1. */

typedef struct ferry_optimizer ferry_optimizer;

typedef enum {
  FERRY_OPTIM_ADAMW = 0,   /* Adam with decoupled weight decay (torch.optim.AdamW) */
  FERRY_OPTIM_ADAM = 1,    /* Adam, weight decay as L2 on the gradient */
  FERRY_OPTIM_ADAGRAD = 2, /* state1 = sum of squares */
  FERRY_OPTIM_LAMB = 3,    /* Adam update times a per-span (per-tensor) trust ratio */
  FERRY_OPTIM_SGD = 4,     /* with momentum (state1), dampening, Nesterov */
  FERRY_OPTIM_LION = 5     /* sign update; state1 = m; betas default (0.9, 0.99) */
} ferry_optim_type;

/* Element types of optimizer buffers: ferry_dtype's FERRY_DT_NONE (no
 * buffer: param copy off), _F32, _F16, _BF16. The FERRY_OPTIM_DT_ names are
 * deprecated aliases, kept for one release. */
#define FERRY_OPTIM_DT_NONE FERRY_DT_NONE
#define FERRY_OPTIM_DT_F32 FERRY_DT_F32
#define FERRY_OPTIM_DT_F16 FERRY_DT_F16
#define FERRY_OPTIM_DT_BF16 FERRY_DT_BF16

typedef struct {
  ferry_optim_type type;
  float lr;
  float beta1, beta2;  /* Adam, AdamW, LAMB, Lion */
  float eps;           /* Adam, AdamW, LAMB, Adagrad */
  float weight_decay;
  float momentum;      /* SGD */
  float dampening;     /* SGD */
  int nesterov;        /* SGD (needs momentum > 0 and dampening 0) */
  float lr_decay;      /* Adagrad */
  int state_dtype;     /* FERRY_DT_F32 (default) or FERRY_DT_BF16 (rounded to
                          nearest even; on AVX512-BF16 CPUs subnormals flush to 0) */
  int threads;         /* worker threads; 0 = one per core */
  int bind;            /* 1 (default): pin workers to cores with hwloc */
  const char *simd;    /* NULL: FERRY_SIMD or the best the CPU has; else
                          "scalar", "avx2", "avx512" */
  size_t tile;         /* elements per tile handed to a worker; 0 = 65536 */
  ferry_log_fn log;    /* optional; NULL = the process-wide logger */
  void *log_user;
  int log_level;
} ferry_optimizer_config;

/* torch.optim's defaults for `type` (AdamW: lr 1e-3, betas 0.9/0.999, eps
 * 1e-8, weight_decay 1e-2; Adam: weight_decay 0; Adagrad: lr 1e-2, eps 1e-10;
 * SGD: lr 1e-2; LAMB: eps 1e-6, weight_decay 1e-2; Lion: lr 1e-4, betas
 * 0.9/0.99), fp32 states, threads 0, bind 1. */
FERRY_API ferry_optimizer_config ferry_optimizer_config_default(ferry_optim_type type);

/* How many state buffers per element the optimizer `cfg` describes keeps:
 * 2 (exp_avg and exp_avg_sq: AdamW, Adam, LAMB), 1 (Adagrad's sum, Lion's
 * m, SGD's momentum buffer) or 0 (SGD without momentum); -1 for an unknown
 * type. span.state1 and state2 must be given for that many. */
FERRY_API int ferry_optimizer_state_count(const ferry_optimizer_config *cfg);

/* One tensor (or a piece of one; LAMB's trust ratio is per span). */
typedef struct {
  float *param;       /* fp32 master weights, updated in place */
  const void *grad;   /* grad_dtype */
  void *state1;       /* exp_avg / momentum buffer / Adagrad sum; state_dtype */
  void *state2;       /* exp_avg_sq (Adam, AdamW, LAMB); else unused */
  void *param_copy;   /* copy_dtype; written when copy_dtype != NONE */
  size_t n;           /* elements */
  int grad_dtype;     /* FERRY_DT_F32, _F16, _BF16 */
  int copy_dtype;     /* FERRY_DT_NONE, _F16, _BF16 */
} ferry_optim_span;

typedef struct {
  char simd[16];   /* kernels in use: "scalar", "avx2", "avx512" */
  int native_bf16; /* AVX-512 bf16 conversion instructions used */
  int threads;     /* worker threads */
  int bound;       /* of which pinned to a core */
  int64_t step;    /* steps taken */
} ferry_optimizer_info;

typedef void (*ferry_optim_done_fn)(void *user, int status);

FERRY_API int ferry_optimizer_create(const ferry_optimizer_config *cfg, ferry_optimizer **out);
/* Waits for an async step in flight, then frees. NULL is allowed. */
FERRY_API void ferry_optimizer_destroy(ferry_optimizer *o);
FERRY_API const char *ferry_optimizer_last_error(const ferry_optimizer *o);
FERRY_API int ferry_optimizer_get_info(ferry_optimizer *o, ferry_optimizer_info *out);

/* One step over `count` spans: the step count goes up by one and bias
 * corrections use it. grad_scale multiplies every gradient (1/loss_scale
 * times the clip coefficient). */
FERRY_API int ferry_optimizer_step(ferry_optimizer *o, const ferry_optim_span *spans, size_t count,
                                   float grad_scale);
/* The same, returning at once: the spans array is copied, the buffers must
 * stay untouched until completion. `done` (may be NULL) is called on a pool
 * thread when the step is over, before ferry_optimizer_wait returns; it must
 * not call this optimizer. One async step at a time (FERRY_EBUSY). */
FERRY_API int ferry_optimizer_step_async(ferry_optimizer *o, const ferry_optim_span *spans,
                                         size_t count, float grad_scale, ferry_optim_done_fn done,
                                         void *user);
/* 0 when no step is in flight, FERRY_EAGAIN when one is. */
FERRY_API int ferry_optimizer_query(ferry_optimizer *o);
/* Waits for the step in flight (if any); returns its status. */
FERRY_API int ferry_optimizer_wait(ferry_optimizer *o);
/* AdamW/Adam over spans whose buffers are CUDA device memory, on a
 * cudaStream_t (NULL = default stream); same math as the CPU kernels.
 * FERRY_ENOTSUP without CUDA or for other optimizer types. */
FERRY_API int ferry_optimizer_step_cuda(ferry_optimizer *o, const ferry_optim_span *spans,
                                        size_t count, float grad_scale, void *cuda_stream);

FERRY_API int64_t ferry_optimizer_get_step(const ferry_optimizer *o);
/* Sets the step count (resuming from a checkpoint). Not while a step runs. */
FERRY_API int ferry_optimizer_set_step(ferry_optimizer *o, int64_t step);
FERRY_API int ferry_optimizer_set_lr(ferry_optimizer *o, float lr);

/* Gradient helpers, one pass, on the optimizer's threads. */
typedef struct {
  const void *data;
  size_t n;
  int dtype; /* FERRY_DT_F32, _F16, _BF16 */
} ferry_grad_span;

/* Sum of squares over all spans (double accumulation; raw values, before any
 * scale) and whether any element is inf or NaN. */
FERRY_API int ferry_optimizer_grad_stats(ferry_optimizer *o, const ferry_grad_span *spans,
                                         size_t count, double *sumsq, int *nonfinite);
/* acc[i] += scale * grad[i] (accumulating 16-bit micro-batch grads in fp32). */
FERRY_API int ferry_optimizer_grad_accumulate(ferry_optimizer *o, float *acc,
                                              const ferry_grad_span *grad, float scale);
/* torch.nn.utils.clip_grad_norm_'s coefficient: min(1, max_norm / (norm +
 * 1e-6)) with norm = sqrt(sumsq) / loss_scale. */
FERRY_API float ferry_clip_coef(double sumsq, float loss_scale, float max_norm);

/* Dynamic loss scaling (as torch.cuda.amp.GradScaler): after `interval`
 * steps without overflow the scale grows by `growth`; an overflow multiplies
 * it by `backoff` and the step is skipped. */
typedef struct {
  float scale, growth, backoff;
  int interval;
  int good_steps;     /* steps since the last overflow or growth */
  int64_t skipped;    /* steps skipped so far */
} ferry_loss_scaler;

/* Defaults as torch: init 65536, growth 2, backoff 0.5, interval 2000; pass
 * 0 for any to get its default. */
FERRY_API void ferry_loss_scaler_init(ferry_loss_scaler *s, float init_scale, float growth,
                                      float backoff, int interval);
/* Call once per step with whether the grads had an inf/NaN. Returns 1 when
 * the step must be skipped, 0 when it may run with the (old) scale. */
FERRY_API int ferry_loss_scaler_update(ferry_loss_scaler *s, int found_nonfinite);

/* ------------------------------------------------------------------------ */
/* The engine: training-loop API (offload/)                                  */

/* A training loop registers its parameters once, then per step:
 *
 *   for g in 0..G-1:   ferry_fetch(e, g, s); forward kernels; ferry_release(e, g, s)
 *   for g in G-1..0:   ferry_fetch(e, g, s); backward kernels write the grads
 *                      into ferry_param_device's grad pointers;
 *                      ferry_grads_ready(e, g, s); ferry_release(e, g, s)
 *   ferry_step(e, &info)          (after grad_accumulation micro-batches)
 *
 * Param and grad device buffers have dtype precision.params. Everything else
 * (fp32 grads, master weights, optimizer states, where each byte lives and
 * when it moves) is the engine's. */
typedef struct ferry_engine ferry_engine;

/* Called at finalize to fill a parameter's initial fp32 values. */
typedef int (*ferry_init_fn)(void *user, const char *name, float *values, size_t count);

/* Creates the engine from a configuration (copied). dev: the device to use,
 * or NULL to create one from the config (device, tiers.gpu.budget); the
 * engine never destroys a device it did not create. */
FERRY_API int ferry_engine_create(const ferry_config *cfg, ferry_device *dev,
                                  ferry_engine **out);
/* Drains all work in flight (a step included) and frees everything. */
FERRY_API void ferry_engine_destroy(ferry_engine *e);
FERRY_API const char *ferry_engine_last_error(const ferry_engine *e);
FERRY_API ferry_device *ferry_engine_device(ferry_engine *e);

/* Registers a parameter tensor of `group` (groups are numbered 0.. in
 * forward order). Initial values: `values` (count = product of shape), or
 * init(user, name, dst, count) at finalize, or zeros when both are NULL. */
FERRY_API int ferry_param_register(ferry_engine *e, const char *name, const int64_t *shape,
                                   int ndim, int group, const float *values, ferry_init_fn init,
                                   void *init_user);
/* Ends registration: lays out chunks, reserves every tier, places each
 * family, fills the initial values. */
FERRY_API int ferry_engine_finalize(ferry_engine *e);

/* Returns once work enqueued on s after it may read the group's params. */
FERRY_API int ferry_fetch(ferry_engine *e, int group, ferry_stream *s);
/* The loop is done with the group once s reaches this point. */
FERRY_API int ferry_release(ferry_engine *e, int group, ferry_stream *s);
/* Device pointers of a parameter (param) and of its gradient buffer (grad),
 * valid while its group is fetched. Either out pointer may be NULL. */
FERRY_API int ferry_param_device(ferry_engine *e, const char *name, void **param, void **grad);
/* The group's gradient buffers are complete once s reaches this point: the
 * engine drains them (D2H), accumulates them in fp32 and adds them to the
 * global norm, while the loop goes on. */
FERRY_API int ferry_grads_ready(ferry_engine *e, int group, ferry_stream *s);

typedef struct {
  int64_t step;        /* optimizer steps taken so far */
  int skipped;         /* 1: inf/NaN in the grads, step skipped (fp16) */
  double grad_norm;    /* global L2 norm of the (unscaled) grads */
  float loss_scale;    /* the scale to use for the next backward */
  float clip_coef;     /* applied to every grad (1 = no clipping) */
  double seconds;      /* wall time of ferry_step */
} ferry_step_info;

/* The optimizer step over every parameter, pipelined over the optimizer
 * chunks; returns when the params of the next forward are being uploaded
 * (the next ferry_fetch of a group waits only for that group). */
FERRY_API int ferry_step(ferry_engine *e, ferry_step_info *info);
/* Drops accumulated gradients (ferry_step does so after each step). */
FERRY_API int ferry_zero_grads(ferry_engine *e);
/* The loss scale to multiply the loss by before backward. */
FERRY_API float ferry_loss_scale(const ferry_engine *e);
/* Copies a parameter's current fp32 master values out (count elements). */
FERRY_API int ferry_param_read(ferry_engine *e, const char *name, float *dst, size_t count);
/* Writes the timeline recorded so far as Chrome trace JSON. */
FERRY_API int ferry_engine_write_timeline(ferry_engine *e, const char *path);

/* ------------------------------------------------------------------------ */
/* Tiered memory: statistics (memory/)                                       */

/* Where the bytes are and how they moved. Tiers and families index the
 * arrays below. Budgets hold: peak[t][*] sums never exceed budget[t]. */
typedef enum { FERRY_TIER_DEVICE = 0, FERRY_TIER_HOST = 1, FERRY_TIER_NVME = 2, FERRY_TIERS = 3 } ferry_tier;
enum {
  FERRY_FAMILY_PARAMS = 0, /* 16-bit params */
  FERRY_FAMILY_GRADS = 1,  /* gradients */
  FERRY_FAMILY_OPTIM = 2,  /* fp32 optimizer state: master, exp_avg, exp_avg_sq */
  FERRY_FAMILIES = 3
};

typedef struct {
  uint64_t budget[FERRY_TIERS];
  uint64_t current[FERRY_TIERS][FERRY_FAMILIES]; /* bytes held now */
  uint64_t peak[FERRY_TIERS][FERRY_FAMILIES];    /* high-water mark per family */
  uint64_t tier_current[FERRY_TIERS];            /* sums over families */
  uint64_t tier_peak[FERRY_TIERS];               /* high-water mark of the sum */
  uint64_t bytes_h2d, bytes_d2h;                 /* host <-> device */
  uint64_t bytes_host_to_nvme, bytes_nvme_to_host;
  uint64_t evictions[FERRY_TIERS];               /* copies dropped to make room */
  uint64_t writebacks[FERRY_TIERS];              /* dirty copies written one tier down */
  uint64_t fetches, fetch_hits;                  /* fetches; of which all resident */
  uint64_t stalls;                               /* fetches that had to wait */
  double stall_seconds;                          /* time callers waited for chunks */
  uint64_t metadata_bytes, managed_bytes;        /* bookkeeping vs tensor bytes */
} ferry_stats;

/* ------------------------------------------------------------------------ */
/* Checkpoints (offload/)                                                    */

/* A checkpoint holds every piece of training state, from whichever tier it
 * lives in: the params in their dtype, the fp32 master weights and
 * optimizer states, the step count, the loss scaler and a blob of the
 * caller's (data-loader position, RNG state). It is a folder
 * DIR/step-<12 digits>/ holding params/ (a plain Hugging Face safetensors
 * model: model.safetensors, or shards and model.safetensors.index.json),
 * optim/ ("<name>.master", ".exp_avg", ".exp_avg_sq", fp32), user.bin and
 * a manifest (format version, scalars, the size and CRC32C of every file).
 * Tensors stream one group at a time through the memory manager, so no
 * call needs the model in RAM. Save and load wait for a running step and
 * the gradient drain, and must be called between steps (FERRY_ESTATE when
 * micro-batch grads are accumulated or a group is fetched), from the
 * thread that drives the loop, one saver per DIR. After a load the next
 * steps are bit-identical to an uninterrupted run. */
typedef struct {
  int keep;                 /* checkpoints kept in DIR, newest by step; 0 = all (default 3) */
  uint64_t max_shard_bytes; /* safetensors shard size (default 4 GiB; 0 = the default) */
} ferry_checkpoint_options;

FERRY_API ferry_checkpoint_options ferry_checkpoint_options_default(void);

/* Writes DIR/step-<steps>/ atomically: into DIR/.tmp-step-..., every file
 * and folder fsynced, then renamed into place (replacing one of the same
 * step), then DIR fsynced and checkpoints past `keep` removed. A failure
 * (FERRY_ENOSPC, FERRY_EIO, ...) removes the temporary folder and leaves
 * every earlier checkpoint untouched; a process killed while saving leaves
 * only a .tmp-* folder, which loads ignore and the next save removes.
 * blob may be NULL when blob_len is 0 (at most 1 GiB); opt NULL: defaults. */
FERRY_API int ferry_checkpoint_save(ferry_engine *e, const char *dir, const void *blob,
                                    size_t blob_len, const ferry_checkpoint_options *opt);
/* Loads `path`: one checkpoint folder, or a DIR of them (its newest). The
 * manifest, the size and CRC32C of every file, the safetensors headers, and
 * every tensor's name, dtype and shape against the engine's registration
 * (and the optimizer type, precision.params) are checked before anything
 * is changed: a damaged or foreign checkpoint is FERRY_ECORRUPT with the
 * file and the reason, and the engine is as it was. The blob goes into
 * blob (NULL: not read); *blob_len (may be NULL) gets its size; a buffer
 * larger than blob_cap is FERRY_EOVERFLOW, nothing changed. */
FERRY_API int ferry_checkpoint_load(ferry_engine *e, const char *path, void *blob,
                                    size_t blob_cap, size_t *blob_len);

typedef struct {
  int64_t step;          /* optimizer steps taken */
  uint64_t blob_bytes;
  uint64_t tensors;      /* params */
  uint64_t total_bytes;  /* of every file listed */
  int files;
  char path[1024];       /* the checkpoint folder found */
} ferry_checkpoint_info;

/* Finds the checkpoint that ferry_checkpoint_load(path) would load, reading
 * no tensor: path itself when it holds a manifest, else the newest
 * "step-<N>" folder in it. folder (cap bytes) gets its path; *step (may be
 * NULL) the N of its folder name (-1 when path itself is a checkpoint
 * folder with another name). FERRY_ENOENT when there is none, with the
 * reason in ferry_last_error(). */
FERRY_API int ferry_checkpoint_find(const char *path, char *folder, size_t cap, int64_t *step);

/* Checks a checkpoint without an engine (manifest, files, CRCs, headers);
 * the reason of a failure in ferry_last_error(). info may be NULL. */
FERRY_API int ferry_checkpoint_verify(const char *path, ferry_checkpoint_info *info);

/* Exports the params as a plain safetensors model (their dtype, names as
 * registered, metadata {"format": "pt"}) that Hugging Face tools load:
 * max_shard_bytes 0 writes one file at path; otherwise path is a folder of
 * model.safetensors or shards plus model.safetensors.index.json. Written
 * beside path first and renamed into place. */
FERRY_API int ferry_export_weights(ferry_engine *e, const char *path, uint64_t max_shard_bytes);

/* The engine's tiers: current and peak bytes per tier and family, bytes
 * moved per direction, evictions, stalls (declared here, after ferry_stats). */
FERRY_API int ferry_engine_get_stats(ferry_engine *e, ferry_stats *out);
/* Deprecated since 0.2, removed in 0.3. */
FERRY_API FERRY_DEPRECATED("ferry_engine_get_stats") int ferry_engine_stats(ferry_engine *e,
                                                                           ferry_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_H */
