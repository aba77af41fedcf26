/* core/core.c — status strings, per-object error buffers, the logger, the
 * panic path for broken invariants, clocks and size parsing.
 */
#include "core/core.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *ferry_version(void) { return FERRY_VERSION_STRING; }

const char *ferry_strerror(int status) {
  switch (status) {
  case FERRY_OK: return "success";
  case FERRY_EINVAL: return "invalid argument";
  case FERRY_ENOMEM: return "out of memory";
  case FERRY_ENODEV: return "no device";
  case FERRY_EIO: return "I/O error";
  case FERRY_ENOSPC: return "no space left";
  case FERRY_ECORRUPT: return "data corrupt";
  case FERRY_EAGAIN: return "not ready, try again";
  case FERRY_ENOTSUP: return "not supported";
  case FERRY_ECONFIG: return "configuration error";
  case FERRY_EBUSY: return "busy";
  case FERRY_ESTATE: return "invalid state";
  case FERRY_ENOENT: return "not found";
  case FERRY_EPERM: return "permission denied";
  case FERRY_EOVERFLOW: return "value too large";
  case FERRY_ETIMEDOUT: return "timed out waiting for another rank";
  case FERRY_ECANCELED: return "cancelled by the caller";
  default: return "unknown status";
  }
}

void ferry_errbuf_init(ferry_errbuf *e) {
  pthread_mutex_init(&e->mu, NULL);
  e->msg[0] = '\0';
}

void ferry_errbuf_destroy(ferry_errbuf *e) { pthread_mutex_destroy(&e->mu); }

int ferry_verr(ferry_errbuf *e, int status, const char *fmt, va_list ap) {
  if (!e) return status;
  char tmp[FERRY_ERR_MAX];
  vsnprintf(tmp, sizeof tmp, fmt, ap);
  pthread_mutex_lock(&e->mu);
  memcpy(e->msg, tmp, sizeof tmp);
  pthread_mutex_unlock(&e->mu);
  return status;
}

int ferry_err(ferry_errbuf *e, int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ferry_verr(e, status, fmt, ap);
  va_end(ap);
  return status;
}

/* inner without the leading "a: b: " that the prefix already ends with
 * (prefix "finalize: layout: ", inner "layout: x" -> "x"): the longest
 * tail of the prefix, taken at a ": " boundary, that inner starts with. */
static const char *unrepeated(const char *prefix, const char *inner) {
  size_t pl = strlen(prefix);
  while (pl >= 2 && prefix[pl - 2] == ':' && prefix[pl - 1] == ' ') pl -= 2; /* "a: b" */
  for (size_t at = 0; at < pl; at++) {
    if (at && !(at >= 2 && prefix[at - 2] == ':' && prefix[at - 1] == ' ')) continue;
    size_t n = pl - at;
    if (!strncmp(inner, prefix + at, n) && inner[n] == ':' && inner[n + 1] == ' ')
      return inner + n + 2;
  }
  return inner;
}

int ferry_err_chain(ferry_errbuf *e, int status, const char *prefix, const char *inner) {
  prefix = prefix ? prefix : "";
  inner = inner ? inner : "";
  char tmp[FERRY_ERR_MAX]; /* inner may be e's own message */
  snprintf(tmp, sizeof tmp, "%s", inner);
  return ferry_err(e, status, "%s%s", prefix, unrepeated(prefix, tmp));
}

const char *ferry_err_msg(const ferry_errbuf *e) { return e ? e->msg : ""; }

void ferry_err_copy(const ferry_errbuf *e, char *dst, size_t n) {
  if (!n) return;
  if (!e) {
    dst[0] = '\0';
    return;
  }
  pthread_mutex_t *mu = (pthread_mutex_t *)&e->mu; /* the lock, not the message, changes */
  pthread_mutex_lock(mu);
  snprintf(dst, n, "%s", e->msg);
  pthread_mutex_unlock(mu);
}

static _Thread_local char t_last_error[FERRY_ERR_MAX];

int ferry_err_thread(int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t_last_error, sizeof t_last_error, fmt, ap);
  va_end(ap);
  return status;
}

const char *ferry_last_error(void) { return t_last_error; }

void ferry_err_clear(ferry_errbuf *e) {
  pthread_mutex_lock(&e->mu);
  e->msg[0] = '\0';
  pthread_mutex_unlock(&e->mu);
}

static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static ferry_logger g_log = {NULL, NULL, FERRY_LOG_SILENT};

void ferry_log_set(ferry_log_fn fn, void *user, int level) {
  pthread_mutex_lock(&g_log_mu);
  g_log.fn = fn;
  g_log.user = user;
  g_log.level = fn ? level : FERRY_LOG_SILENT;
  pthread_mutex_unlock(&g_log_mu);
}

static const char *level_name(int level) {
  switch (level) {
  case FERRY_LOG_ERROR: return "error";
  case FERRY_LOG_WARN: return "warning";
  case FERRY_LOG_INFO: return "info";
  default: return "debug";
  }
}

void ferry_log_stderr(void *user, int level, const char *message) {
  (void)user;
  fprintf(stderr, "ferry: %s: %s\n", level_name(level), message);
}

void ferry_logf(const ferry_logger *lg, int level, const char *fmt, ...) {
  ferry_logger use;
  if (lg && lg->fn) {
    use = *lg;
  } else {
    pthread_mutex_lock(&g_log_mu);
    use = g_log;
    pthread_mutex_unlock(&g_log_mu);
  }
  if (!use.fn || level > use.level || level <= FERRY_LOG_SILENT) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  use.fn(use.user, level, msg);
}

void ferry_panic(const char *file, int line, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "ferry: internal error at %s:%d: %s\n", file, line, msg);
  fflush(stderr);
  abort();
}

double ferry_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void ferry_deadline_after(clockid_t clock, double seconds, struct timespec *ts) {
  clock_gettime(clock, ts);
  if (!(seconds > 0)) return;
  time_t whole = (time_t)seconds;
  ts->tv_sec += whole;
  ts->tv_nsec += (long)((seconds - (double)whole) * 1e9);
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

int ferry_parse_size(const char *s, uint64_t *out) {
  if (!s || !out) return FERRY_EINVAL;
  while (isspace((unsigned char)*s)) s++;
  if (!isdigit((unsigned char)*s) && *s != '.') return FERRY_EINVAL;
  errno = 0;
  char *end = NULL;
  double v = strtod(s, &end);
  if (errno || end == s || !isfinite(v) || v < 0) return FERRY_EINVAL;
  while (isspace((unsigned char)*end)) end++;
  double mul = 1;
  switch (toupper((unsigned char)*end)) {
  case 'K': mul = 1024.0; end++; break;
  case 'M': mul = 1024.0 * 1024; end++; break;
  case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
  case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
  case 'P': mul = 1024.0 * 1024 * 1024 * 1024 * 1024; end++; break;
  default: break;
  }
  if (mul > 1) {
    if (toupper((unsigned char)*end) == 'I') end++;
    if (toupper((unsigned char)*end) == 'B') end++;
  } else if (toupper((unsigned char)*end) == 'B') {
    end++;
  }
  while (isspace((unsigned char)*end)) end++;
  if (*end != '\0') return FERRY_EINVAL;
  double bytes = v * mul;
  if (bytes >= 18446744073709551616.0) return FERRY_EOVERFLOW;
  if (bytes != floor(bytes)) return FERRY_EINVAL; /* "1.3" bytes */
  *out = (uint64_t)bytes;
  return FERRY_OK;
}

const char *ferry_format_size(uint64_t bytes, char *buf, size_t len) {
  static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    u++;
  }
  if (u == 0)
    snprintf(buf, len, "%llu B", (unsigned long long)bytes);
  else
    snprintf(buf, len, "%.2f %s", v, unit[u]);
  return buf;
}
