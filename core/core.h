/* core/core.h — what every folder of ferry shares: error buffers with context,
 * the logger, FERRY_ASSERT for broken invariants, and small helpers.
 * Internal: never included by code outside the library and its tests.
 */
#ifndef FERRY_CORE_H
#define FERRY_CORE_H

#include "ferry.h"

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define FERRY_ERR_MAX 512

#if defined(__GNUC__)
#define FERRY_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define FERRY_LIKELY(x) __builtin_expect(!!(x), 1)
#define FERRY_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define FERRY_PRINTF(a, b)
#define FERRY_LIKELY(x) (x)
#define FERRY_UNLIKELY(x) (x)
#endif

/* A per-object last-error message. Any thread may set it; readers get the
 * text of the most recent failure. */
typedef struct {
  pthread_mutex_t mu;
  char msg[FERRY_ERR_MAX];
} ferry_errbuf;

void ferry_errbuf_init(ferry_errbuf *e);
void ferry_errbuf_destroy(ferry_errbuf *e);
/* Formats the message, prefixed by nothing; returns `status` so a caller can
 * write `return ferry_err(&o->err, FERRY_EINVAL, "...", ...)`. */
int ferry_err(ferry_errbuf *e, int status, const char *fmt, ...) FERRY_PRINTF(3, 4);
int ferry_verr(ferry_errbuf *e, int status, const char *fmt, va_list ap);
/* Copies another buffer's message in, with a prefix ("device: ..."), and
 * says nothing twice: the parts the prefix ends with are dropped from the
 * start of inner ("finalize: layout: " + "layout: x" is "finalize: layout:
 * x", not "... layout: layout: x"). inner may be e's own message. */
int ferry_err_chain(ferry_errbuf *e, int status, const char *prefix, const char *inner);
const char *ferry_err_msg(const ferry_errbuf *e);
/* The message copied into dst (n bytes, NUL-terminated) under e's lock:
 * what a reader uses while other threads may set it. */
void ferry_err_copy(const ferry_errbuf *e, char *dst, size_t n);
/* Sets this thread's message for ferry_last_error(); returns status. */
int ferry_err_thread(int status, const char *fmt, ...) FERRY_PRINTF(2, 3);
void ferry_err_clear(ferry_errbuf *e);

/* A logger: an object's own callback or, when fn is NULL, the process-wide
 * one set with ferry_log_set. */
typedef struct {
  ferry_log_fn fn;
  void *user;
  int level;
} ferry_logger;

void ferry_logf(const ferry_logger *lg, int level, const char *fmt, ...) FERRY_PRINTF(3, 4);

/* Broken invariant: print file, line and message to stderr and abort. This is
 * the only place the library prints: it is a bug, not an error. */
_Noreturn void ferry_panic(const char *file, int line, const char *fmt, ...) FERRY_PRINTF(3, 4);
#define FERRY_ASSERT(cond, ...)                                  \
  do {                                                           \
    if (FERRY_UNLIKELY(!(cond))) ferry_panic(__FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

/* FERRY_SIMD_* bits supported by this CPU and enabled by the OS. */
unsigned ferry_cpu_simd(void);

/* The OpenBLAS kernel (an OPENBLAS_CORETYPE name) to run instead of `pick`,
 * the one OpenBLAS took (openblas_get_corename()), on a CPU with these
 * FERRY_SIMD_* bits; NULL keeps OpenBLAS's pick. Only its fallback for a CPU
 * it does not know (Prescott: SSE3) is replaced: by Cooperlake with AVX-512
 * F/BW/VL and BF16, SkylakeX with AVX-512 F/BW/VL, Haswell with AVX2 and FMA. */
const char *ferry_cpu_blas_kernel(unsigned simd, const char *pick);

/* Monotonic clock in seconds. */
double ferry_now(void);
/* `seconds` from now on `clock` (CLOCK_REALTIME for a default condition
 * variable, CLOCK_MONOTONIC for one set to it): the absolute time a timed
 * wait takes. seconds <= 0: now. */
void ferry_deadline_after(clockid_t clock, double seconds, struct timespec *ts);

/* ferry_parse_size (sizes such as "64M") is public: see ferry.h. */
/* Formats bytes as "1.50 GiB" into buf. */
const char *ferry_format_size(uint64_t bytes, char *buf, size_t len);

static inline size_t ferry_align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

#endif /* FERRY_CORE_H */
