/* optim/pool.c — the optimizer's thread pool: worker threads pinned to cores
 * with hwloc (where the system permits; a refusal is logged), a FIFO of jobs,
 * each a sequence of parallel loops over tiles, completion signalled by the
 * job's callback. The step runs here while the caller (and the GPU) go on.
 */
#include "optim/optim.h"

#include <errno.h>
#include <hwloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct optim_pool {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  optim_job *head, *tail; /* FIFO of jobs not yet finished */
  int stop;
  int nthreads, bound;
  pthread_t *th;
  hwloc_topology_t topo;
  int have_topo;
  ferry_logger log;
};

typedef struct {
  optim_pool *pool;
  int index;
} worker_arg;

/* The first queued job that still has tiles to hand out. */
static optim_job *pick(optim_pool *p) {
  for (optim_job *j = p->head; j; j = j->link)
    if (j->next < j->ntiles) return j;
  return NULL;
}

static void unlink_job(optim_pool *p, optim_job *j) {
  optim_job **pp = &p->head, *prev = NULL;
  while (*pp && *pp != j) {
    prev = *pp;
    pp = &(*pp)->link;
  }
  if (!*pp) return;
  *pp = j->link;
  if (p->tail == j) p->tail = prev;
}

/* Called with the lock held by whoever completed a phase's last tile (or by
 * submit, for an empty phase). Runs phase transitions until a phase has tiles
 * or the job is over; returns with the lock held. */
static void complete_phase(optim_pool *p, optim_job *j) {
  for (;;) {
    size_t next = 0;
    if (j->phase_done) {
      pthread_mutex_unlock(&p->mu);
      next = j->phase_done(j);
      pthread_mutex_lock(&p->mu);
    }
    if (next > 0) {
      j->ntiles = next;
      j->next = 0;
      j->done = 0;
      pthread_cond_broadcast(&p->cv);
      return;
    }
    unlink_job(p, j);
    pthread_mutex_unlock(&p->mu);
    j->finished(j); /* j may be gone after this */
    pthread_mutex_lock(&p->mu);
    return;
  }
}

static void *worker_main(void *arg) {
  optim_pool *p = ((worker_arg *)arg)->pool;
  int me = ((worker_arg *)arg)->index;
  free(arg);
  pthread_mutex_lock(&p->mu);
  for (;;) {
    optim_job *j;
    while (!p->stop && !(j = pick(p)))
      pthread_cond_wait(&p->cv, &p->mu);
    if (p->stop) break;
    size_t tile = j->next++;
    pthread_mutex_unlock(&p->mu);
    j->tile(j, tile, me);
    pthread_mutex_lock(&p->mu);
    if (++j->done == j->ntiles) complete_phase(p, j);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

static int count_cores(optim_pool *p) {
  if (!p->have_topo) return 1;
  int n = hwloc_get_nbobjs_by_type(p->topo, HWLOC_OBJ_CORE);
  if (n <= 0) n = hwloc_get_nbobjs_by_type(p->topo, HWLOC_OBJ_PU);
  return n > 0 ? n : 1;
}

static int bind_thread(optim_pool *p, pthread_t th, int i, char *why, size_t len) {
  int ncores = hwloc_get_nbobjs_by_type(p->topo, HWLOC_OBJ_CORE);
  hwloc_obj_t obj = ncores > 0 ? hwloc_get_obj_by_type(p->topo, HWLOC_OBJ_CORE, i % ncores)
                               : hwloc_get_obj_by_type(p->topo, HWLOC_OBJ_PU, i);
  if (!obj || !obj->cpuset) {
    snprintf(why, len, "no core object %d in the topology", i);
    return -1;
  }
  if (hwloc_set_thread_cpubind(p->topo, th, obj->cpuset, 0) != 0) {
    snprintf(why, len, "hwloc_set_thread_cpubind: %s", strerror(errno));
    return -1;
  }
  return 0;
}

int optim_pool_create(int threads, int bind, const ferry_logger *lg, optim_pool **out,
                      ferry_errbuf *err) {
  optim_pool *p = calloc(1, sizeof *p);
  if (!p) return ferry_err(err, FERRY_ENOMEM, "optimizer pool: out of memory");
  if (lg) p->log = *lg;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  if (hwloc_topology_init(&p->topo) == 0) {
    if (hwloc_topology_load(p->topo) == 0)
      p->have_topo = 1;
    else
      hwloc_topology_destroy(p->topo);
  }
  if (threads <= 0) threads = count_cores(p);
  if (threads > 1024) threads = 1024;
  p->th = calloc((size_t)threads, sizeof *p->th);
  if (!p->th) {
    optim_pool_destroy(p);
    return ferry_err(err, FERRY_ENOMEM, "optimizer pool: out of memory");
  }
  for (int i = 0; i < threads; i++) {
    worker_arg *a = malloc(sizeof *a);
    if (!a) {
      optim_pool_destroy(p);
      return ferry_err(err, FERRY_ENOMEM, "optimizer pool: out of memory");
    }
    a->pool = p;
    a->index = i;
    int rc = pthread_create(&p->th[i], NULL, worker_main, a);
    if (rc != 0) {
      free(a);
      optim_pool_destroy(p);
      return ferry_err(err, FERRY_ENOMEM, "optimizer pool: pthread_create of worker %d: %s", i,
                       strerror(rc));
    }
    p->nthreads++;
    if (bind) {
      char why[160] = "hwloc topology unavailable";
      if (p->have_topo && bind_thread(p, p->th[i], i, why, sizeof why) == 0)
        p->bound++;
      else
        ferry_logf(&p->log, FERRY_LOG_WARN,
                   "optimizer pool: worker %d not bound to a core (%s); it runs unpinned", i, why);
    }
  }
  ferry_logf(&p->log, FERRY_LOG_DEBUG, "optimizer pool: %d workers, %d bound to cores", p->nthreads,
             p->bound);
  *out = p;
  return FERRY_OK;
}

void optim_pool_destroy(optim_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->nthreads; i++)
    pthread_join(p->th[i], NULL);
  free(p->th);
  if (p->have_topo) hwloc_topology_destroy(p->topo);
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->mu);
  free(p);
}

int optim_pool_threads(const optim_pool *p) { return p->nthreads; }
int optim_pool_bound(const optim_pool *p) { return p->bound; }

void optim_pool_submit(optim_pool *p, optim_job *j) {
  pthread_mutex_lock(&p->mu);
  j->next = 0;
  j->done = 0;
  j->link = NULL;
  if (p->tail)
    p->tail->link = j;
  else
    p->head = j;
  p->tail = j;
  if (j->ntiles == 0)
    complete_phase(p, j);
  else
    pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

typedef struct {
  optim_job job;
  optim_for_fn fn;
  void *arg;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int over;
} for_job;

static void for_tile(optim_job *j, size_t tile, int worker) {
  for_job *f = (for_job *)j;
  f->fn(f->arg, tile, worker);
}

static void for_finished(optim_job *j) {
  for_job *f = (for_job *)j;
  pthread_mutex_lock(&f->mu);
  f->over = 1;
  pthread_cond_signal(&f->cv);
  pthread_mutex_unlock(&f->mu);
}

void optim_pool_for(optim_pool *p, size_t ntiles, optim_for_fn fn, void *arg) {
  for_job f;
  memset(&f, 0, sizeof f);
  f.job.ntiles = ntiles;
  f.job.tile = for_tile;
  f.job.finished = for_finished;
  f.fn = fn;
  f.arg = arg;
  pthread_mutex_init(&f.mu, NULL);
  pthread_cond_init(&f.cv, NULL);
  optim_pool_submit(p, &f.job);
  pthread_mutex_lock(&f.mu);
  while (!f.over)
    pthread_cond_wait(&f.cv, &f.mu);
  pthread_mutex_unlock(&f.mu);
  pthread_cond_destroy(&f.cv);
  pthread_mutex_destroy(&f.mu);
}
