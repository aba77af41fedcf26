/* ferry.h — the public API of ferry, an offload-centric memory engine.
 *
 * Everything a training loop, a tool or a test outside the library may call.
 * Opaque handles, `ferry_<thing>_<verb>` names, every function returns 0 or a
 * negative FERRY_E... status and leaves a message on the object it was called
 * on. The library never exits and never prints: it logs through a callback.
 *
 * The one header to include. It holds what every subsystem shares (version,
 * status codes, element types, logging) and includes one header per
 * subsystem from include/ferry/: device, safetensors, optim, engine,
 * checkpoint.
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
  FERRY_EOVERFLOW = -14, /* a size or count does not fit */
  FERRY_ETIMEDOUT = -15, /* a peer (another rank) did not answer in time */
  FERRY_ECANCELED = -16  /* stopped because the caller's cancel callback said so */
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
/* One header per subsystem (include/ferry/), in dependency order           */

#include "ferry/device.h"
#include "ferry/safetensors.h"
#include "ferry/optim.h"
#include "ferry/dist.h"
#include "ferry/engine.h"
#include "ferry/checkpoint.h"

#ifdef __cplusplus
}
#endif

#endif /* FERRY_H */
