/* core/par.c — ferry_par_run and ferry_par_zero (stoppable between pieces:
 * ferry_par_zero_stop): work split over transient threads (par.h).
 */
#include "core/par.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#define PAR_SLICE_MIN ((size_t)256 << 20)

int ferry_par_threads(void) {
  long c = sysconf(_SC_NPROCESSORS_ONLN);
  return c < 1 ? 1 : c > FERRY_PAR_MAX ? FERRY_PAR_MAX : (int)c;
}

typedef struct {
  void (*fn)(void *, int);
  void *arg;
  int part;
} par_part;

static void *run_part(void *a) {
  par_part *p = a;
  p->fn(p->arg, p->part);
  return NULL;
}

void ferry_par_run(int parts, void (*fn)(void *arg, int part), void *arg) {
  if (parts > FERRY_PAR_MAX) parts = FERRY_PAR_MAX;
  par_part p[FERRY_PAR_MAX];
  pthread_t tid[FERRY_PAR_MAX];
  int started[FERRY_PAR_MAX] = {0};
  for (int k = 0; k < parts; k++) {
    p[k] = (par_part){fn, arg, k};
    started[k] = k > 0 && pthread_create(&tid[k], NULL, run_part, &p[k]) == 0;
    if (k > 0 && !started[k]) fn(arg, k);
  }
  if (parts > 0) fn(arg, 0);
  for (int k = 1; k < parts; k++)
    if (started[k]) pthread_join(tid[k], NULL);
}

typedef struct {
  char *p;
  size_t n, per;
  int (*stop)(void *);
  void *user;
  atomic_int stopped;
} zero_job;

/* [a, a+len) in pieces, asking stop before each */
static void zero_range(zero_job *z, size_t a, size_t len) {
  for (size_t at = 0; at < len; at += FERRY_PAR_PIECE) {
    if (z->stop && (atomic_load(&z->stopped) || z->stop(z->user))) {
      atomic_store(&z->stopped, 1);
      return;
    }
    memset(z->p + a + at, 0, len - at > FERRY_PAR_PIECE ? FERRY_PAR_PIECE : len - at);
  }
}

static void zero_part(void *arg, int k) {
  zero_job *z = arg;
  size_t a = z->per * (size_t)k < z->n ? z->per * (size_t)k : z->n;
  zero_range(z, a, z->n - a > z->per ? z->per : z->n - a);
}

int ferry_par_zero_stop(void *p, size_t n, int threads, int (*stop)(void *user), void *user) {
  if (threads <= 0) threads = ferry_par_threads();
  if (n < FERRY_PAR_MIN_BYTES) threads = 1;
  if ((size_t)threads > n / PAR_SLICE_MIN) threads = (int)(n / PAR_SLICE_MIN);
  zero_job z = {p, n, n, stop, user, 0};
  if (threads <= 1) {
    zero_range(&z, 0, n);
  } else {
    /* whole pages each, rounded up from the exact share so that the
     * slices cover n (n / threads rounded down lost the remainder when the
     * share was whole pages) */
    z.per = ((n + (size_t)threads - 1) / (size_t)threads + 4095) & ~(size_t)4095;
    ferry_par_run(threads, zero_part, &z);
  }
  return atomic_load(&z.stopped);
}

void ferry_par_zero(void *p, size_t n, int threads) {
  (void)ferry_par_zero_stop(p, n, threads, NULL, NULL);
}
