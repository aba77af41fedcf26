/* comm/comm.c — the public communicator API (include/ferry/dist.h): picks a
 * backend, validates every argument (null buffers, counts that overflow,
 * dtypes and reductions the backend lacks, roots out of range, overlaps),
 * owns the requests, the worker thread and its FIFO queue for blocking
 * backends, waits with a timeout (a timed-out wait breaks the
 * communicator), the stats and the span hook.
 */
#include "comm/comm_impl.h"

#include "core/dtype.h"

#include <errno.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_TIMEOUT 300.0

ferry_comm_options ferry_comm_options_default(void) {
  ferry_comm_options o;
  memset(&o, 0, sizeof o);
  o.kind = FERRY_COMM_AUTO;
  o.timeout = DEFAULT_TIMEOUT;
  return o;
}

const char *ferry_comm_kind_name(ferry_comm_kind kind) {
  switch (kind) {
  case FERRY_COMM_AUTO: return "auto";
  case FERRY_COMM_SELF: return "self";
  case FERRY_COMM_MPI: return "mpi";
  case FERRY_COMM_NCCL: return "nccl";
  }
  return "?";
}

static const ferry_comm_ops *ops_of(ferry_comm_kind kind) {
  switch (kind) {
  case FERRY_COMM_SELF: return &ferry_comm_self_ops;
#ifdef FERRY_HAVE_MPI
  case FERRY_COMM_MPI: return &ferry_comm_mpi_ops;
#endif
#ifdef FERRY_HAVE_NCCL
  case FERRY_COMM_NCCL: return &ferry_comm_nccl_ops;
#endif
  default: return NULL;
  }
}

int ferry_comm_compiled(ferry_comm_kind kind) {
  return kind == FERRY_COMM_AUTO || ops_of(kind) != NULL;
}

/* 1 when an MPI launcher started this process: mpirun (OpenMPI, MPICH's
 * hydra), srun with PMI or PMIx. */
static int launched_by_mpi(void) {
  static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK",
                               "MPI_LOCALNRANKS"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
    if (getenv(vars[i])) return 1;
  return 0;
}

/* ---- the worker (threaded backends) ------------------------------------- */

static void req_free(ferry_comm *c, ferry_comm_req *r) {
  if (!r) return;
  if (c->ops->release) c->ops->release(c, r);
  free(r->counts);
  free(r);
}

/* Under c->mu: record a completed request, call the span hook (outside the
 * lock, before any waiter sees the request done, so a span is on the
 * caller's timeline once its wait returns) and wake the waiters. Returns
 * with c->mu held. */
static void complete_locked(ferry_comm *c, ferry_comm_req *r, int status) {
  ferry_comm_span_fn fn = c->span_fn;
  if (status == 0 && fn && r->coll != FERRY_COLL_DUP) {
    void *user = c->span_user;
    pthread_mutex_unlock(&c->mu);
    fn(user, r->name, r->t0, r->t1);
    pthread_mutex_lock(&c->mu);
  }
  r->status = status;
  r->done = 1;
  if (status == 0 && r->coll != FERRY_COLL_DUP) {
    c->stats.ops++;
    c->stats.bytes += r->sent;
    c->stats.seconds += r->t1 - r->t0;
  }
  if (r->abandoned) req_free(c, r);
  pthread_cond_broadcast(&c->done_cv);
}

static void break_locked(ferry_comm *c, int status, const char *msg) {
  if (c->broken) return;
  c->broken = status;
  snprintf(c->broken_msg, sizeof c->broken_msg, "%s", msg);
}

static int run_req(ferry_comm *c, ferry_comm_req *r) {
  return r->coll == FERRY_COLL_DUP ? c->ops->dup(c, r->dup_out) : c->ops->run(c, r);
}

static void *worker_main(void *arg) {
  ferry_comm *c = arg;
  pthread_mutex_lock(&c->mu);
  for (;;) {
    while (!c->head && !c->stopping)
      pthread_cond_wait(&c->work_cv, &c->mu);
    ferry_comm_req *r = c->head;
    if (!r) break; /* stopping and drained */
    c->head = r->next;
    if (!c->head) c->tail = NULL;
    if (c->broken) {
      /* The ranks no longer agree on the order: start nothing more. */
      r->t0 = r->t1 = ferry_now();
      r->skipped = 1;
      complete_locked(c, r, c->broken);
      continue;
    }
    c->running = 1;
    pthread_mutex_unlock(&c->mu);
    r->t0 = ferry_now();
    int st = run_req(c, r);
    double t1 = ferry_now();
    pthread_mutex_lock(&c->mu);
    c->running = 0;
    r->t1 = t1;
    if (st != 0) break_locked(c, st, ferry_err_msg(&c->err));
    complete_locked(c, r, st);
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

/* ---- create, dup, destroy ----------------------------------------------- */

static int comm_alloc(const ferry_comm_ops *ops, double timeout, ferry_comm **out) {
  ferry_comm *c = calloc(1, sizeof *c);
  if (!c) return FERRY_ENOMEM;
  c->ops = ops;
  c->kind = ops->kind;
  c->timeout = timeout;
  c->size = 1;
  c->local_size = 1;
  ferry_errbuf_init(&c->err);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->work_cv, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&c->done_cv, &ca);
  pthread_condattr_destroy(&ca);
  *out = c;
  return 0;
}

static void comm_free(ferry_comm *c) {
  pthread_cond_destroy(&c->done_cv);
  pthread_cond_destroy(&c->work_cv);
  pthread_mutex_destroy(&c->mu);
  ferry_errbuf_destroy(&c->err);
  free(c);
}

static int start_worker(ferry_comm *c) {
  if (!c->ops->threaded) return 0;
  int e = pthread_create(&c->worker, NULL, worker_main, c);
  if (e)
    return ferry_err(&c->err, FERRY_ENOMEM, "comm: cannot start the worker thread: %s",
                     strerror(e));
  c->has_worker = 1;
  return 0;
}

int ferry_comm_create(const ferry_comm_options *opt_in, ferry_comm **out) {
  if (!out) return ferry_err_thread(FERRY_EINVAL, "ferry_comm_create: out is NULL");
  *out = NULL;
  ferry_comm_options opt = opt_in ? *opt_in : ferry_comm_options_default();
  if (!(opt.timeout >= 0) || opt.timeout > 1e9)
    return ferry_err_thread(FERRY_EINVAL,
                            "ferry_comm_create: timeout %g s is out of range (0: %g s)",
                            opt.timeout, DEFAULT_TIMEOUT);
  if (opt.timeout == 0) opt.timeout = DEFAULT_TIMEOUT;
  ferry_comm_kind kind = opt.kind;
  if (kind == FERRY_COMM_AUTO)
    kind =
        launched_by_mpi() && ferry_comm_compiled(FERRY_COMM_MPI) ? FERRY_COMM_MPI : FERRY_COMM_SELF;
  if ((int)kind < FERRY_COMM_AUTO || (int)kind > FERRY_COMM_NCCL)
    return ferry_err_thread(FERRY_EINVAL, "ferry_comm_create: unknown kind %d", (int)kind);
  const ferry_comm_ops *ops = ops_of(kind);
  if (!ops) {
    if (kind == FERRY_COMM_MPI)
      return ferry_err_thread(FERRY_ENOTSUP,
                              "ferry_comm_create: the mpi backend was not compiled into this "
                              "build (no MPI found at configure: apt-get install "
                              "libopenmpi-dev openmpi-bin, then reconfigure)");
    return ferry_err_thread(FERRY_ENOTSUP,
                            "ferry_comm_create: the nccl backend was not compiled into this "
                            "build (it needs CUDA, NCCL (nccl.h, libnccl) and MPI at "
                            "configure)");
  }
  ferry_comm *c;
  int st = comm_alloc(ops, opt.timeout, &c);
  if (st) return ferry_err_thread(st, "ferry_comm_create: out of memory");
  c->dev = opt.dev;
  st = ops->init(c, &opt);
  if (st) {
    ferry_err_thread(st, "ferry_comm_create (%s): %s", ops->name, ferry_err_msg(&c->err));
    comm_free(c);
    return st;
  }
  st = start_worker(c);
  if (st) {
    ferry_err_thread(st, "ferry_comm_create (%s): %s", ops->name, ferry_err_msg(&c->err));
    ops->shutdown(c, 0);
    comm_free(c);
    return st;
  }
  *out = c;
  return 0;
}

static int check_alert(ferry_comm *c);

/* The status and message of a broken communicator, into its error buffer.
 * A backend without a worker (SELF, NCCL) first looks for a failure's news:
 * its calls never wait, so this is where they learn of one. */
static int fail_broken(ferry_comm *c) {
  if (!c->ops->threaded) check_alert(c);
  pthread_mutex_lock(&c->mu);
  int st = c->broken;
  char msg[FERRY_ERR_MAX];
  snprintf(msg, sizeof msg, "%s", c->broken_msg);
  pthread_mutex_unlock(&c->mu);
  if (st) ferry_err(&c->err, st, "communicator broken by an earlier failure: %s", msg);
  return st;
}

static int submit(ferry_comm *c, ferry_comm_req *r, ferry_comm_req **req);

int ferry_comm_dup(ferry_comm *c, ferry_comm **out) {
  if (!out)
    return c ? ferry_err(&c->err, FERRY_EINVAL, "ferry_comm_dup: out is NULL")
             : ferry_err_thread(FERRY_EINVAL, "ferry_comm_dup: out is NULL");
  *out = NULL;
  if (!c) return ferry_err_thread(FERRY_EINVAL, "ferry_comm_dup: communicator is NULL");
  int st = fail_broken(c);
  if (st) return st;
  ferry_comm *d;
  st = comm_alloc(c->ops, c->timeout, &d);
  if (st) return ferry_err(&c->err, st, "ferry_comm_dup: out of memory");
  d->dev = c->dev;
  ferry_comm_req *r = calloc(1, sizeof *r);
  if (!r) {
    comm_free(d);
    return ferry_err(&c->err, FERRY_ENOMEM, "ferry_comm_dup: out of memory");
  }
  r->coll = FERRY_COLL_DUP;
  r->name = "dup";
  r->dup_out = d;
  st = submit(c, r, NULL);
  if (st) {
    /* A dup that timed out (or gave up: another rank failed) may still
     * finish on the worker: leak the child
     * rather than free what the backend may be writing. */
    if (st != FERRY_ETIMEDOUT && st != FERRY_EIO) comm_free(d);
    return st;
  }
  st = start_worker(d);
  if (st) {
    ferry_err(&c->err, st, "ferry_comm_dup: %s", ferry_err_msg(&d->err));
    d->ops->shutdown(d, 0);
    comm_free(d);
    return st;
  }
  *out = d;
  return 0;
}

/* Another rank's failure (ferry_comm_fail), when the backend has news of
 * one: c broken with its message, every waiter of c woken; its status, 0
 * when there is none. Called without c->mu. */
static int check_alert(ferry_comm *c) {
  if (!c->ops->alert_poll) return 0;
  char msg[FERRY_ERR_MAX];
  int st = c->ops->alert_poll(c, msg, sizeof msg);
  if (!st) return 0;
  pthread_mutex_lock(&c->mu);
  break_locked(c, st, msg);
  pthread_cond_broadcast(&c->done_cv);
  pthread_mutex_unlock(&c->mu);
  return st;
}

/* Seconds between a waiter's looks for another rank's failure. */
#define ALERT_POLL 0.1

void ferry_comm_destroy(ferry_comm *c) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  c->stopping = 1;
  pthread_cond_broadcast(&c->work_cv);
  /* The queue drains within the timeout, or a rank died or hangs (or
   * failed: its news breaks c, looked for every ALERT_POLL seconds). */
  struct timespec ts;
  double deadline = ferry_now() + c->timeout;
  while (!c->broken && (c->head || c->running)) {
    double now = ferry_now();
    int alerts = c->ops->alert_poll != NULL && now + ALERT_POLL < deadline;
    ferry_deadline_after(CLOCK_MONOTONIC, alerts ? ALERT_POLL : deadline - now, &ts);
    if (pthread_cond_timedwait(&c->done_cv, &c->mu, &ts) == ETIMEDOUT && alerts) {
      pthread_mutex_unlock(&c->mu);
      check_alert(c);
      pthread_mutex_lock(&c->mu);
      continue;
    }
    if (ferry_now() >= deadline && (c->head || c->running)) {
      char msg[FERRY_ERR_MAX];
      snprintf(msg, sizeof msg,
               "destroy: the queued collectives did not complete within %g s on rank %d: a "
               "rank died or hangs",
               c->timeout, c->rank);
      break_locked(c, FERRY_ETIMEDOUT, msg);
      ferry_err(&c->err, FERRY_ETIMEDOUT, "%s", msg);
      ferry_err_thread(FERRY_ETIMEDOUT, "%s", msg); /* destroy returns nothing */
    }
  }
  int broken = c->broken;
  pthread_mutex_unlock(&c->mu);
  if (c->has_worker) {
    if (broken) {
      /* The worker may hang in a collective no other rank will join: leave
       * it (and the communicator it reads) to the end of the process. */
      pthread_detach(c->worker);
      c->ops->shutdown(c, 1);
      return;
    }
    pthread_join(c->worker, NULL);
  }
  pthread_mutex_lock(&c->mu);
  broken = c->broken;
  pthread_mutex_unlock(&c->mu);
  c->ops->shutdown(c, broken != 0);
  comm_free(c);
}

const char *ferry_comm_last_error(const ferry_comm *c) { return c ? ferry_err_msg(&c->err) : ""; }
int ferry_comm_rank(const ferry_comm *c) { return c ? c->rank : 0; }
int ferry_comm_size(const ferry_comm *c) { return c ? c->size : 0; }
int ferry_comm_local_rank(const ferry_comm *c) { return c ? c->local_rank : 0; }
int ferry_comm_local_size(const ferry_comm *c) { return c ? c->local_size : 0; }
ferry_comm_kind ferry_comm_get_kind(const ferry_comm *c) { return c ? c->kind : FERRY_COMM_SELF; }

/* ---- requests ----------------------------------------------------------- */

/* The request timed out: break the communicator, name the collective. */
static int time_out(ferry_comm *c, ferry_comm_req *r) {
  char msg[FERRY_ERR_MAX];
  snprintf(msg, sizeof msg,
           "%s of %zu bytes on rank %d did not complete within %g s: a rank died or hangs", r->name,
           r->bytes, c->rank, c->timeout);
  pthread_mutex_lock(&c->mu);
  break_locked(c, FERRY_ETIMEDOUT, msg);
  pthread_mutex_unlock(&c->mu);
  return ferry_err(&c->err, FERRY_ETIMEDOUT, "%s", msg);
}

/* Polled backends (NCCL): done when ops->poll says so; the thread that sees
 * it completes the request. */
static int poll_req(ferry_comm *c, ferry_comm_req *r) {
  pthread_mutex_lock(&c->mu);
  int done = r->done, busy = r->completing; /* busy: another thread completes it */
  pthread_mutex_unlock(&c->mu);
  if (done || busy) return done ? 0 : FERRY_EAGAIN;
  int st = c->ops->poll(c, r);
  if (st == FERRY_EAGAIN) return FERRY_EAGAIN;
  double t1 = ferry_now();
  pthread_mutex_lock(&c->mu);
  if (!r->done && !r->completing) {
    r->completing = 1;
    r->t1 = t1;
    if (st != 0) break_locked(c, st, ferry_err_msg(&c->err));
    complete_locked(c, r, st);
  }
  pthread_mutex_unlock(&c->mu);
  return 0;
}


/* Threaded backends: waits for r until the communicator's timeout (1), or
 * until another rank's failure is known (its status), or r is done (0). A
 * backend with news of failures is looked at every ALERT_POLL seconds. */
static int wait_done(ferry_comm *c, ferry_comm_req *r, double t_begin) {
  double deadline = t_begin + c->timeout, look = t_begin + ALERT_POLL;
  int gave_up = 0, alerts = c->ops->alert_poll != NULL;
  pthread_mutex_lock(&c->mu);
  while (!r->done) {
    double now = ferry_now();
    if (now >= deadline) {
      gave_up = 1;
      break;
    }
    if (alerts && now >= look) {
      pthread_mutex_unlock(&c->mu);
      int st = check_alert(c);
      pthread_mutex_lock(&c->mu);
      look = now + ALERT_POLL;
      if (st && !r->done) {
        gave_up = st;
        break;
      }
      continue;
    }
    struct timespec ts;
    ferry_deadline_after(CLOCK_MONOTONIC, (alerts && look < deadline ? look : deadline) - now,
                         &ts);
    pthread_cond_timedwait(&c->done_cv, &c->mu, &ts);
  }
  pthread_mutex_unlock(&c->mu);
  return gave_up;
}

static int wait_req(ferry_comm *c, ferry_comm_req *r) {
  double t_begin = ferry_now();
  int st = 0, timed_out = 0;
  if (c->ops->poll && !c->ops->threaded) {
    /* NCCL: the one poll left in the library. The collective completes on
     * the GPU, and CUDA has no timed wait on an event (cudaEventSynchronize
     * cannot give up at the deadline); a completion signalled by a host
     * function on the stream is the replacement, once a GPU can test it. */
    double deadline = t_begin + c->timeout, look = t_begin + ALERT_POLL;
    long sleep_ns = 1000;
    while (poll_req(c, r) == FERRY_EAGAIN) {
      double now = ferry_now();
      if (now >= deadline) {
        timed_out = 1;
        break;
      }
      if (c->ops->alert_poll && now >= look) { /* another rank failed: c is broken by it */
        look = now + ALERT_POLL;
        if ((timed_out = check_alert(c)) != 0) break;
      }
      struct timespec ts = {0, sleep_ns};
      nanosleep(&ts, NULL);
      if (sleep_ns < 1000000) sleep_ns *= 2;
    }
  } else {
    timed_out = wait_done(c, r, t_begin);
  }
  double waited = ferry_now() - t_begin;
  pthread_mutex_lock(&c->mu);
  c->stats.wait_seconds += waited;
  char why[FERRY_ERR_MAX];
  snprintf(why, sizeof why, "%s", c->broken_msg);
  pthread_mutex_unlock(&c->mu);
  if (timed_out) {
    /* 1: the timeout; a status: another rank failed (c is broken by it) */
    st = timed_out == 1 ? time_out(c, r)
                        : ferry_err(&c->err, timed_out, "%s of %zu bytes on rank %d: %s", r->name,
                                    r->bytes, c->rank, why);
    pthread_mutex_lock(&c->mu);
    int free_now = r->done || !c->ops->threaded;
    if (!free_now) r->abandoned = 1; /* the worker frees it when (if) it ends */
    pthread_mutex_unlock(&c->mu);
    if (free_now) req_free(c, r);
    return st;
  }
  st = r->status;
  int skipped = r->skipped;
  req_free(c, r);
  return skipped ? fail_broken(c) : st;
}

/* Queues r (threaded), runs it (SELF) or enqueues it (NCCL); req NULL waits. */
static int submit(ferry_comm *c, ferry_comm_req *r, ferry_comm_req **req) {
  r->c = c;
  if (req) *req = NULL;
  if (c->ops->threaded) {
    pthread_mutex_lock(&c->mu);
    if (c->broken || c->stopping) {
      int stopping = c->stopping;
      const char *name = r->name;
      pthread_mutex_unlock(&c->mu);
      req_free(c, r);
      return stopping
                 ? ferry_err(&c->err, FERRY_ESTATE, "%s: the communicator is being destroyed", name)
                 : fail_broken(c);
    }
    if (c->tail)
      c->tail->next = r;
    else
      c->head = r;
    c->tail = r;
    pthread_cond_signal(&c->work_cv);
    pthread_mutex_unlock(&c->mu);
  } else {
    r->t0 = ferry_now();
    int st = run_req(c, r);
    if (st) {
      pthread_mutex_lock(&c->mu);
      if (c->ops->poll) break_locked(c, st, ferry_err_msg(&c->err));
      pthread_mutex_unlock(&c->mu);
      req_free(c, r);
      return st;
    }
    if (!c->ops->poll || r->coll == FERRY_COLL_DUP) {
      r->t1 = ferry_now();
      pthread_mutex_lock(&c->mu);
      complete_locked(c, r, 0);
      pthread_mutex_unlock(&c->mu);
    }
  }
  if (req) {
    *req = r;
    return 0;
  }
  return wait_req(c, r);
}

int ferry_comm_wait(ferry_comm *c, ferry_comm_req *r) {
  if (!r) return 0;
  if (!c) return ferry_err_thread(FERRY_EINVAL, "ferry_comm_wait: communicator is NULL");
  if (r->c != c)
    return ferry_err(&c->err, FERRY_EINVAL,
                     "ferry_comm_wait: the request belongs to another communicator");
  pthread_mutex_lock(&c->mu);
  int broken = c->broken, done = r->done;
  if (broken && !done && c->ops->threaded) r->abandoned = 1;
  pthread_mutex_unlock(&c->mu);
  if (broken && !done) {
    if (!c->ops->threaded) req_free(c, r);
    return fail_broken(c);
  }
  return wait_req(c, r);
}

int ferry_comm_test(ferry_comm *c, ferry_comm_req *r, int *done) {
  if (!c || !r || !done)
    return c ? ferry_err(&c->err, FERRY_EINVAL, "ferry_comm_test: NULL request or done")
             : ferry_err_thread(FERRY_EINVAL, "ferry_comm_test: communicator is NULL");
  if (r->c != c)
    return ferry_err(&c->err, FERRY_EINVAL,
                     "ferry_comm_test: the request belongs to another communicator");
  if (c->ops->poll && !c->ops->threaded) poll_req(c, r);
  pthread_mutex_lock(&c->mu);
  *done = r->done;
  pthread_mutex_unlock(&c->mu);
  return 0;
}

void ferry_comm_abort(ferry_comm *c, int code) {
  if (c) c->ops->abort(c, code);
#ifdef FERRY_HAVE_MPI
  /* No communicator (a destroy gave up on a dead rank): still end the job. */
  ferry_mpi_abort_if_running(code);
#endif
  exit(code);
}

int ferry_comm_fail(ferry_comm *c, const char *why) {
  if (!c) return ferry_err_thread(FERRY_EINVAL, "ferry_comm_fail: communicator is NULL");
  char msg[FERRY_ERR_MAX];
  snprintf(msg, sizeof msg, "rank %d failed: %s", c->rank, why && why[0] ? why : "(no reason given)");
  int st = c->ops->alert_send ? c->ops->alert_send(c, msg) : 0;
  pthread_mutex_lock(&c->mu);
  break_locked(c, FERRY_EIO, msg);
  pthread_cond_broadcast(&c->done_cv);
  pthread_mutex_unlock(&c->mu);
  return st ? ferry_err(&c->err, st, "ferry_comm_fail: %s", ferry_err_msg(&c->err)) : 0;
}

int ferry_comm_get_stats(const ferry_comm *c, ferry_comm_stats *out) {
  if (!c || !out) return ferry_err_thread(FERRY_EINVAL, "ferry_comm_get_stats: NULL argument");
  ferry_comm *m = (ferry_comm *)c; /* the lock, not the figures */
  pthread_mutex_lock(&m->mu);
  *out = m->stats;
  pthread_mutex_unlock(&m->mu);
  return 0;
}

void ferry_comm_set_span_hook(ferry_comm *c, ferry_comm_span_fn fn, void *user) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  c->span_fn = fn;
  c->span_user = user;
  pthread_mutex_unlock(&c->mu);
}

/* ---- collectives: validation -------------------------------------------- */

static int check_common(ferry_comm *c, const char *what, ferry_stream *s, int need_stream) {
  if (!c) return ferry_err_thread(FERRY_EINVAL, "%s: communicator is NULL", what);
  int st = fail_broken(c);
  if (st) return st;
  if (need_stream && c->kind == FERRY_COMM_NCCL && !s)
    return ferry_err(&c->err, FERRY_EINVAL, "%s: the nccl backend needs a stream (s is NULL)",
                     what);
  return 0;
}

static int check_dtype(ferry_comm *c, const char *what, ferry_dtype dt, int reduce,
                       ferry_reduce_op op) {
  size_t es = ferry_dtype_size(dt);
  if (es == 0)
    return ferry_err(&c->err, FERRY_EINVAL, "%s: dtype %d is not an element type", what, (int)dt);
  if (!reduce) return 0;
  if ((int)op < FERRY_REDUCE_SUM || (int)op > FERRY_REDUCE_MIN)
    return ferry_err(&c->err, FERRY_EINVAL, "%s: unknown reduction %d", what, (int)op);
  int flt = dt == FERRY_DT_F32 || dt == FERRY_DT_F64 || dt == FERRY_DT_F16 || dt == FERRY_DT_BF16;
  int known = flt || dt == FERRY_DT_I32 || dt == FERRY_DT_I64 || dt == FERRY_DT_U64;
  if (!known)
    return ferry_err(&c->err, FERRY_EINVAL,
                     "%s: cannot reduce dtype %s (reductions take F32, F64, I32, I64, U64%s; "
                     "other dtypes move only)",
                     what, ferry_dtype_name(dt), c->kind == FERRY_COMM_NCCL ? ", F16, BF16" : "");
  if (!(c->ops->reduce_dtypes & (1u << dt)))
    return ferry_err(&c->err, FERRY_ENOTSUP, "%s: the %s backend cannot reduce %s", what,
                     c->ops->name, ferry_dtype_name(dt));
  if (op == FERRY_REDUCE_AVG && !flt)
    return ferry_err(&c->err, FERRY_EINVAL,
                     "%s: avg needs a floating-point dtype, not %s (use sum)", what,
                     ferry_dtype_name(dt));
  return 0;
}

/* n elements of es bytes in bytes; FERRY_EOVERFLOW when it does not fit. */
static int elems_bytes(ferry_comm *c, const char *what, size_t n, size_t es, size_t *bytes) {
  if (n > SIZE_MAX / es || n * es > (size_t)INT64_MAX)
    return ferry_err(&c->err, FERRY_EOVERFLOW, "%s: %zu elements of %zu bytes overflow", what, n,
                     es);
  *bytes = n * es;
  return 0;
}

static int overlap(const void *a, size_t an, const void *b, size_t bn) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return an && bn && x < y + bn && y < x + an;
}

static ferry_comm_req *req_new(ferry_comm *c, ferry_coll coll, const char *name) {
  ferry_comm_req *r = calloc(1, sizeof *r);
  if (!r) {
    ferry_err(&c->err, FERRY_ENOMEM, "%s: out of memory", name);
    return NULL;
  }
  r->coll = coll;
  r->name = name;
  return r;
}

/* Copies counts, computes displacements and the total (validated). */
static int req_counts(ferry_comm *c, ferry_comm_req *r, const size_t *counts) {
  size_t n = (size_t)c->size;
  r->counts = malloc(2 * n * sizeof *r->counts);
  if (!r->counts) return ferry_err(&c->err, FERRY_ENOMEM, "%s: out of memory", r->name);
  r->displs = r->counts + n;
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    r->counts[i] = counts[i];
    r->displs[i] = total;
    if (counts[i] > SIZE_MAX - total)
      return ferry_err(&c->err, FERRY_EOVERFLOW, "%s: the counts overflow at rank %zu (%zu)",
                       r->name, i, counts[i]);
    total += counts[i];
  }
  r->total = total;
  return 0;
}

static int finish(ferry_comm *c, ferry_comm_req *r, int st, ferry_comm_req **req) {
  if (req) *req = NULL;
  if (st) {
    req_free(c, r);
    return st;
  }
  return submit(c, r, req);
}

int ferry_comm_allreduce(ferry_comm *c, const void *send, void *recv, size_t count, ferry_dtype dt,
                         ferry_reduce_op op, ferry_stream *s, ferry_comm_req **req) {
  static const char *what = "allreduce";
  if (req) *req = NULL;
  int st = check_common(c, what, s, 1);
  if (st) return st;
  if ((st = check_dtype(c, what, dt, 1, op))) return st;
  size_t bytes = 0;
  if ((st = elems_bytes(c, what, count, ferry_dtype_size(dt), &bytes))) return st;
  if (bytes && (!send || !recv))
    return ferry_err(&c->err, FERRY_EINVAL, "allreduce: %s is NULL with %zu elements",
                     send ? "recv" : "send", count);
  if (send != recv && overlap(send, bytes, recv, bytes))
    return ferry_err(&c->err, FERRY_EINVAL,
                     "allreduce: send %p and recv %p overlap without being the same buffer "
                     "(%zu bytes)",
                     send, (void *)recv, bytes);
  ferry_comm_req *r = req_new(c, FERRY_COLL_ALLREDUCE, what);
  if (!r) return FERRY_ENOMEM;
  r->send = send;
  r->recv = recv;
  r->count = count;
  r->dt = dt;
  r->op = op;
  r->s = s;
  r->bytes = r->sent = bytes;
  return finish(c, r, 0, req);
}

/* The checks and the request shared by reduce-scatter and all-gather: *big
 * gets the bytes of the whole buffer (counts' sum), *mine this rank's part;
 * r->dt, op and s set. */
static int counts_req(ferry_comm *c, const char *what, ferry_coll coll, const size_t *counts,
                      ferry_dtype dt, int reduce, ferry_reduce_op op, ferry_stream *s,
                      ferry_comm_req **out, size_t *big, size_t *mine) {
  *out = NULL;
  int st = check_common(c, what, s, 1);
  if (st) return st;
  if (!counts) return ferry_err(&c->err, FERRY_EINVAL, "%s: counts is NULL", what);
  if ((st = check_dtype(c, what, dt, reduce, op))) return st;
  ferry_comm_req *r = req_new(c, coll, what);
  if (!r) return FERRY_ENOMEM;
  size_t es = ferry_dtype_size(dt);
  st = req_counts(c, r, counts);
  if (!st) st = elems_bytes(c, what, r->total, es, big);
  if (!st) st = elems_bytes(c, what, counts[c->rank], es, mine);
  r->dt = dt;
  r->op = op;
  r->s = s;
  *out = r;
  return st;
}

int ferry_comm_reduce_scatter(ferry_comm *c, const void *send, void *recv, const size_t *counts,
                              ferry_dtype dt, ferry_reduce_op op, ferry_stream *s,
                              ferry_comm_req **req) {
  if (req) *req = NULL;
  ferry_comm_req *r;
  size_t sbytes = 0, rbytes = 0;
  int st = counts_req(c, "reduce_scatter", FERRY_COLL_REDUCE_SCATTER, counts, dt, 1, op, s, &r,
                      &sbytes, &rbytes);
  if (!r) return st;
  if (!st && sbytes && !send)
    st = ferry_err(&c->err, FERRY_EINVAL, "reduce_scatter: send is NULL with %zu elements",
                   r->total);
  if (!st && rbytes && !recv)
    st = ferry_err(&c->err, FERRY_EINVAL,
                   "reduce_scatter: recv is NULL with counts[%d] = %zu elements", c->rank,
                   counts[c->rank]);
  if (!st && overlap(send, sbytes, recv, rbytes))
    st = ferry_err(&c->err, FERRY_EINVAL,
                   "reduce_scatter: recv %p (%zu bytes) overlaps send %p (%zu bytes)", (void *)recv,
                   rbytes, send, sbytes);
  r->send = send;
  r->recv = recv;
  r->bytes = r->sent = sbytes;
  return finish(c, r, st, req);
}

int ferry_comm_allgather(ferry_comm *c, const void *send, void *recv, const size_t *counts,
                         ferry_dtype dt, ferry_stream *s, ferry_comm_req **req) {
  if (req) *req = NULL;
  ferry_comm_req *r;
  size_t sbytes = 0, rbytes = 0;
  int st = counts_req(c, "allgather", FERRY_COLL_ALLGATHER, counts, dt, 0, FERRY_REDUCE_SUM, s, &r,
                      &rbytes, &sbytes);
  if (!r) return st;
  if (!st && sbytes && !send)
    st = ferry_err(&c->err, FERRY_EINVAL, "allgather: send is NULL with counts[%d] = %zu", c->rank,
                   counts[c->rank]);
  if (!st && rbytes && !recv)
    st = ferry_err(&c->err, FERRY_EINVAL, "allgather: recv is NULL with %zu elements", r->total);
  if (!st && sbytes) {
    const char *mine = (const char *)recv + r->displs[c->rank] * ferry_dtype_size(dt);
    if (send != mine && overlap(send, sbytes, recv, rbytes))
      st = ferry_err(&c->err, FERRY_EINVAL,
                     "allgather: send %p overlaps recv %p but is not this rank's place in it "
                     "(%p: element %zu)",
                     send, (void *)recv, (const void *)mine, r->displs[c->rank]);
  }
  r->send = send;
  r->recv = recv;
  r->bytes = rbytes;
  r->sent = sbytes;
  return finish(c, r, st, req);
}

int ferry_comm_broadcast(ferry_comm *c, void *buf, size_t count, ferry_dtype dt, int root,
                         ferry_stream *s, ferry_comm_req **req) {
  static const char *what = "broadcast";
  if (req) *req = NULL;
  int st = check_common(c, what, s, 1);
  if (st) return st;
  if ((st = check_dtype(c, what, dt, 0, FERRY_REDUCE_SUM))) return st;
  if (root < 0 || root >= c->size)
    return ferry_err(&c->err, FERRY_EINVAL, "broadcast: root %d is out of range (%d ranks)", root,
                     c->size);
  size_t bytes = 0;
  if ((st = elems_bytes(c, what, count, ferry_dtype_size(dt), &bytes))) return st;
  if (bytes && !buf)
    return ferry_err(&c->err, FERRY_EINVAL, "broadcast: buf is NULL with %zu elements", count);
  ferry_comm_req *r = req_new(c, FERRY_COLL_BROADCAST, what);
  if (!r) return FERRY_ENOMEM;
  r->recv = buf;
  r->send = buf;
  r->count = count;
  r->dt = dt;
  r->root = root;
  r->s = s;
  r->bytes = bytes;
  r->sent = root == c->rank ? bytes : 0;
  return finish(c, r, 0, req);
}

int ferry_comm_barrier(ferry_comm *c, ferry_comm_req **req) {
  if (req) *req = NULL;
  int st = check_common(c, "barrier", NULL, 0);
  if (st) return st;
  ferry_comm_req *r = req_new(c, FERRY_COLL_BARRIER, "barrier");
  if (!r) return FERRY_ENOMEM;
  return finish(c, r, 0, req);
}
