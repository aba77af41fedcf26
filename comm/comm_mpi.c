/* comm/comm_mpi.c — the `mpi` backend: host buffers over MPI. Owns MPI's
 * initialization (MPI_THREAD_MULTIPLE, counted by reference, finalized at
 * the last release when ferry initialized it), one duplicate of
 * COMM_WORLD per communicator (channels dup their parent's), and the
 * blocking collectives that the communicator's worker thread (comm/comm.c)
 * runs in FIFO order. Also the helpers the NCCL bootstrap uses. MPI is
 * called through the table `api` (comm/mpi_abi.h), filled when the first
 * reference is taken: libmpi is opened then, not at program start.
 */
#include "comm/comm_impl.h"
#include "comm/mpi_abi.h"

#include "core/dtype.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* MPI itself: initialized by us or not, and how many users hold it. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_refs;        /* (g_mu) communicators and bootstraps that hold MPI */
static int g_we_init;     /* (g_mu) ferry called MPI_Init_thread */
static int g_no_finalize; /* (g_mu) a communicator broke: MPI_Finalize would hang */
/* libmpi's functions and handles: set with the first reference (under
 * g_mu), before any other call here can use it, then never changed. */
static const ferry_mpi_abi *api;

/* News of a rank's failure (ferry_comm_fail): a duplicate of COMM_WORLD
 * made with the first reference, on which a failing rank sends its message
 * to every other rank; waiters look for it (ferry_mpi_alert_poll). g_alert_mu is
 * never held across a blocking MPI call, so that a wait can always look. */
#define ALERT_TAG 0xfe11
static pthread_mutex_t g_alert_mu = PTHREAD_MUTEX_INITIALIZER;
static MPI_Comm g_alert;                /* (g_alert_mu; made and freed under g_mu too) or NULL */
static int g_alert_status;              /* (g_alert_mu) a failure known: FERRY_EIO */
static char g_alert_msg[FERRY_ERR_MAX]; /* (g_alert_mu) its message */
static char g_alert_out[FERRY_ERR_MAX]; /* this rank's message, read by its sends */
static int g_alert_from = -1;           /* (g_alert_mu) the rank whose news came, or -1 */

typedef struct {
  MPI_Comm comm;
  int *icounts, *idispls; /* (worker) size entries each: MPI's int counts */
} mpi_impl;

static int mpi_fail(ferry_errbuf *e, int rc, const char *what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (api->Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "code %d", rc);
  return ferry_err(e, FERRY_EIO, "%s failed: %s", what, msg);
}

static const char *thread_level_name(int level) {
  switch (level) {
  case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
  case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
  case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
  case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown level";
}

int ferry_mpi_acquire(ferry_errbuf *e) {
  pthread_mutex_lock(&g_mu);
  int inited = 0, finalized = 0, provided = 0, st = 0;
  if (!api && (st = ferry_mpi_abi_load(e, &api)) != 0) goto out;
  api->Finalized(&finalized);
  if (finalized) {
    st = ferry_err(e, FERRY_ESTATE,
                   "MPI was finalized already (by the program, or by ferry at the destroy of "
                   "the last communicator): MPI cannot start twice in one process; keep one "
                   "communicator alive for the whole run");
    goto out;
  }
  api->Initialized(&inited);
  if (!inited) {
    int rc = api->Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) {
      st = mpi_fail(e, rc, "MPI_Init_thread");
      goto out;
    }
    g_we_init = 1;
  } else {
    api->Query_thread(&provided);
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    st = ferry_err(e, FERRY_ENOTSUP,
                   "MPI provides %s, ferry needs MPI_THREAD_MULTIPLE (a worker thread per "
                   "communicator calls MPI)%s",
                   thread_level_name(provided),
                   inited ? ": the program initialized MPI with a lower level; use "
                            "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...)"
                          : ": this MPI library was built without thread support");
    goto out;
  }
  api->Comm_set_errhandler(api->comm_world, api->errors_return);
  if (g_refs == 0) { /* every rank takes its first reference in the same collective */
    MPI_Comm a;
    int rc = api->Comm_dup(api->comm_world, &a);
    if (rc != MPI_SUCCESS) {
      st = mpi_fail(e, rc, "MPI_Comm_dup(MPI_COMM_WORLD)");
      goto out;
    }
    api->Comm_set_errhandler(a, api->errors_return);
    pthread_mutex_lock(&g_alert_mu);
    g_alert = a;
    pthread_mutex_unlock(&g_alert_mu);
  }
  g_refs++;
out:
  pthread_mutex_unlock(&g_mu);
  return st;
}

void ferry_mpi_release_broken(void) {
  pthread_mutex_lock(&g_mu);
  g_no_finalize = 1;
  pthread_mutex_unlock(&g_mu);
  ferry_mpi_release();
}

void ferry_mpi_release(void) {
  pthread_mutex_lock(&g_mu);
  if (g_refs > 0 && --g_refs == 0 && !g_no_finalize) {
    pthread_mutex_lock(&g_alert_mu);
    MPI_Comm a = g_alert;
    g_alert = NULL;
    pthread_mutex_unlock(&g_alert_mu);
    if (a) api->Comm_free(&a);
    if (g_we_init) api->Finalize();
    g_we_init = 0;
  }
  pthread_mutex_unlock(&g_mu);
}

_Noreturn void ferry_mpi_abort(int code) {
  const ferry_mpi_abi *a = ferry_mpi_abi_loaded();
  if (a) a->Abort(a->comm_world, code);
  exit(code);
}

/* Without opening libmpi: MPI runs only where it is in the process. */
void ferry_mpi_abort_if_running(int code) {
  const ferry_mpi_abi *a = ferry_mpi_abi_loaded();
  int inited = 0, finalized = 0;
  if (!a) return;
  a->Initialized(&inited);
  a->Finalized(&finalized);
  if (inited && !finalized) ferry_mpi_abort(code);
}

/* Rank, size and the ranks on this host, of comm. */
static int comm_info(ferry_errbuf *e, MPI_Comm comm, int *rank, int *size, int *lrank, int *lsize) {
  int rc = api->Comm_rank(comm, rank);
  if (rc == MPI_SUCCESS) rc = api->Comm_size(comm, size);
  if (rc != MPI_SUCCESS) return mpi_fail(e, rc, "MPI_Comm_rank/size");
  MPI_Comm node;
  rc = api->Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, api->info_null, &node);
  if (rc != MPI_SUCCESS) return mpi_fail(e, rc, "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
  api->Comm_rank(node, lrank);
  api->Comm_size(node, lsize);
  api->Comm_free(&node);
  return 0;
}

int ferry_mpi_world_info(ferry_errbuf *e, int *rank, int *size, int *local_rank, int *local_size) {
  MPI_Comm w;
  int rc = api->Comm_dup(api->comm_world, &w);
  if (rc != MPI_SUCCESS) return mpi_fail(e, rc, "MPI_Comm_dup(MPI_COMM_WORLD)");
  api->Comm_set_errhandler(w, api->errors_return);
  int st = comm_info(e, w, rank, size, local_rank, local_size);
  api->Comm_free(&w);
  return st;
}

int ferry_mpi_world_bcast(ferry_errbuf *e, void *buf, size_t bytes, int root) {
  if (bytes > INT_MAX) return ferry_err(e, FERRY_EOVERFLOW, "broadcast of %zu bytes", bytes);
  MPI_Comm w;
  int rc = api->Comm_dup(api->comm_world, &w);
  if (rc != MPI_SUCCESS) return mpi_fail(e, rc, "MPI_Comm_dup(MPI_COMM_WORLD)");
  api->Comm_set_errhandler(w, api->errors_return);
  rc = api->Bcast(buf, (int)bytes, api->byte, root, w);
  api->Comm_free(&w);
  return rc == MPI_SUCCESS ? 0 : mpi_fail(e, rc, "MPI_Bcast");
}

/* ---- the communicator -------------------------------------------------- */

static int impl_new(ferry_comm *c, MPI_Comm comm) {
  mpi_impl *m = calloc(1, sizeof *m);
  int *ints = calloc(2 * (size_t)c->size, sizeof *ints);
  if (!m || !ints) {
    free(m);
    free(ints);
    return ferry_err(&c->err, FERRY_ENOMEM, "mpi: out of memory");
  }
  m->comm = comm;
  m->icounts = ints;
  m->idispls = ints + c->size;
  c->impl = m;
  return 0;
}

static int mpi_init(ferry_comm *c, const ferry_comm_options *opt) {
  (void)opt;
  c->dev = NULL;
  int st = ferry_mpi_acquire(&c->err);
  if (st) return st;
  MPI_Comm comm;
  int rc = api->Comm_dup(api->comm_world, &comm);
  if (rc != MPI_SUCCESS) {
    st = mpi_fail(&c->err, rc, "MPI_Comm_dup(MPI_COMM_WORLD)");
    ferry_mpi_release();
    return st;
  }
  api->Comm_set_errhandler(comm, api->errors_return);
  st = comm_info(&c->err, comm, &c->rank, &c->size, &c->local_rank, &c->local_size);
  if (!st) st = impl_new(c, comm);
  if (st) {
    api->Comm_free(&comm);
    ferry_mpi_release();
  }
  return st;
}

/* On the parent's worker, ordered with its collectives. */
static int mpi_dup(ferry_comm *parent, ferry_comm *child) {
  mpi_impl *p = parent->impl;
  int st = ferry_mpi_acquire(&parent->err);
  if (st) return st;
  MPI_Comm comm;
  int rc = api->Comm_dup(p->comm, &comm);
  if (rc != MPI_SUCCESS) {
    ferry_mpi_release();
    return mpi_fail(&parent->err, rc, "dup: MPI_Comm_dup");
  }
  api->Comm_set_errhandler(comm, api->errors_return);
  child->rank = parent->rank;
  child->size = parent->size;
  child->local_rank = parent->local_rank;
  child->local_size = parent->local_size;
  st = impl_new(child, comm);
  if (st) {
    ferry_err(&parent->err, st, "dup: out of memory");
    api->Comm_free(&comm);
    ferry_mpi_release();
  }
  return st;
}

static void mpi_shutdown(ferry_comm *c, int broken) {
  mpi_impl *m = c->impl;
  if (broken) {
    /* A collective may still hang on m->comm: keep it, and never finalize
     * (MPI_Finalize would wait for the other ranks); the program aborts. */
    ferry_mpi_release_broken();
    return;
  }
  if (m) {
    api->Comm_free(&m->comm);
    free(m->icounts);
    free(m);
    c->impl = NULL;
  }
  ferry_mpi_release();
}

static MPI_Datatype reduce_type(ferry_dtype dt) {
  switch (dt) {
  case FERRY_DT_F32: return api->float_;
  case FERRY_DT_F64: return api->double_;
  case FERRY_DT_I32: return api->int32;
  case FERRY_DT_I64: return api->int64;
  case FERRY_DT_U64: return api->uint64;
  default: return api->datatype_null;
  }
}

/* Moves only: any dtype, as unsigned words of its size. */
static MPI_Datatype move_type(size_t es) {
  switch (es) {
  case 1: return api->uint8;
  case 2: return api->uint16;
  case 4: return api->uint32;
  case 8: return api->uint64;
  default: return api->datatype_null;
  }
}

static MPI_Op reduce_op(ferry_reduce_op op) {
  switch (op) {
  case FERRY_REDUCE_SUM:
  case FERRY_REDUCE_AVG: return api->sum;
  case FERRY_REDUCE_MAX: return api->max;
  case FERRY_REDUCE_MIN: return api->min;
  }
  return api->op_null;
}

/* AVG: the sum times 1/size, in place. */
static void scale_avg(void *buf, size_t n, ferry_dtype dt, int size) {
  if (dt == FERRY_DT_F32) {
    float k = 1.0f / (float)size, *x = buf;
    for (size_t i = 0; i < n; i++)
      x[i] *= k;
  } else if (dt == FERRY_DT_F64) {
    double k = 1.0 / (double)size, *x = buf;
    for (size_t i = 0; i < n; i++)
      x[i] *= k;
  }
}

/* Elements per MPI call for counts past INT_MAX. */
#define CHUNK ((size_t)1 << 30)

static int run_allreduce(ferry_comm *c, mpi_impl *m, ferry_comm_req *r) {
  size_t es = ferry_dtype_size(r->dt);
  int in_place = r->send == r->recv;
  for (size_t off = 0; off < r->count; off += CHUNK) {
    size_t n = r->count - off < CHUNK ? r->count - off : CHUNK;
    const void *sp = in_place ? MPI_IN_PLACE : (const char *)r->send + off * es;
    int rc = api->Allreduce(sp, (char *)r->recv + off * es, (int)n, reduce_type(r->dt),
                           reduce_op(r->op), m->comm);
    if (rc != MPI_SUCCESS) return mpi_fail(&c->err, rc, "allreduce: MPI_Allreduce");
  }
  if (r->op == FERRY_REDUCE_AVG) scale_avg(r->recv, r->count, r->dt, c->size);
  return 0;
}

static int run_broadcast(ferry_comm *c, mpi_impl *m, ferry_comm_req *r) {
  size_t es = ferry_dtype_size(r->dt);
  for (size_t off = 0; off < r->count; off += CHUNK) {
    size_t n = r->count - off < CHUNK ? r->count - off : CHUNK;
    int rc = api->Bcast((char *)r->recv + off * es, (int)n, move_type(es), r->root, m->comm);
    if (rc != MPI_SUCCESS) return mpi_fail(&c->err, rc, "broadcast: MPI_Bcast");
  }
  return 0;
}

/* counts (and displacements) as MPI's ints; FERRY_EOVERFLOW when one does
 * not fit (MPI 3 has no larger counts). */
static int int_counts(ferry_comm *c, mpi_impl *m, ferry_comm_req *r, int displs) {
  for (int i = 0; i < c->size; i++) {
    size_t end = displs ? r->displs[i] + r->counts[i] : r->counts[i];
    if (end > INT_MAX)
      return ferry_err(&c->err, FERRY_EOVERFLOW,
                       "%s: %zu elements (rank %d's part ends at %zu) exceed MPI's int counts "
                       "(%d); split the collective",
                       r->name, r->total, i, end, INT_MAX);
    m->icounts[i] = (int)r->counts[i];
    m->idispls[i] = (int)r->displs[i];
  }
  return 0;
}

static int run_reduce_scatter(ferry_comm *c, mpi_impl *m, ferry_comm_req *r) {
  int st = int_counts(c, m, r, 0);
  if (st) return st;
  int rc = api->Reduce_scatter(r->send, r->recv, m->icounts, reduce_type(r->dt), reduce_op(r->op),
                              m->comm);
  if (rc != MPI_SUCCESS) return mpi_fail(&c->err, rc, "reduce_scatter: MPI_Reduce_scatter");
  if (r->op == FERRY_REDUCE_AVG) scale_avg(r->recv, r->counts[c->rank], r->dt, c->size);
  return 0;
}

static int run_allgather(ferry_comm *c, mpi_impl *m, ferry_comm_req *r) {
  int st = int_counts(c, m, r, 1);
  if (st) return st;
  size_t es = ferry_dtype_size(r->dt);
  MPI_Datatype t = move_type(es);
  const char *mine = (const char *)r->recv + r->displs[c->rank] * es;
  const void *sp = r->send == (const void *)mine ? MPI_IN_PLACE : r->send;
  int rc = api->Allgatherv(sp, m->icounts[c->rank], t, r->recv, m->icounts, m->idispls, t, m->comm);
  if (rc != MPI_SUCCESS) return mpi_fail(&c->err, rc, "allgather: MPI_Allgatherv");
  return 0;
}

static int mpi_run(ferry_comm *c, ferry_comm_req *r) {
  mpi_impl *m = c->impl;
  switch (r->coll) {
  case FERRY_COLL_ALLREDUCE: return run_allreduce(c, m, r);
  case FERRY_COLL_REDUCE_SCATTER: return run_reduce_scatter(c, m, r);
  case FERRY_COLL_ALLGATHER: return run_allgather(c, m, r);
  case FERRY_COLL_BROADCAST: return run_broadcast(c, m, r);
  case FERRY_COLL_BARRIER: {
    int rc = api->Barrier(m->comm);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(&c->err, rc, "barrier: MPI_Barrier");
  }
  case FERRY_COLL_DUP: break;
  }
  return ferry_err(&c->err, FERRY_EINVAL, "mpi: unknown collective %d", (int)r->coll);
}

static _Noreturn void mpi_abort(ferry_comm *c, int code) {
  (void)c;
  ferry_mpi_abort(code);
}

/* This rank's failure to every other rank (eager sends of one message:
 * they leave at once; any still pending after a second are left), and to
 * this process's own waits. */
int ferry_mpi_alert_send(ferry_comm *c, const char *msg) {
  pthread_mutex_lock(&g_alert_mu);
  if (!g_alert_status) {
    g_alert_status = FERRY_EIO;
    snprintf(g_alert_msg, sizeof g_alert_msg, "%s", msg);
  }
  MPI_Comm a = g_alert;
  int first = !g_alert_out[0], from = g_alert_from;
  if (first) snprintf(g_alert_out, sizeof g_alert_out, "%s", msg);
  pthread_mutex_unlock(&g_alert_mu);
  if (!a || !first) return 0;
  MPI_Request *rq = calloc((size_t)c->size, sizeof *rq);
  if (!rq) return ferry_err(&c->err, FERRY_ENOMEM, "out of memory");
  int n = 0, done = 0;
  /* not to the rank whose failure this one follows: it knows, and may not
   * take the message before it ends (the send would wait out its second) */
  for (int r = 0; r < c->size; r++)
    if (r != c->rank && r != from &&
        api->Isend(g_alert_out, (int)sizeof g_alert_out, api->char_, r, ALERT_TAG, a, &rq[n]) ==
            MPI_SUCCESS)
      n++;
  for (double end = ferry_now() + 1.0; !done && ferry_now() < end;) {
    if (api->Testall(n, rq, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS) break;
    if (!done) {
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
  }
  if (done) free(rq); /* else MPI may still use the requests: left */
  return 0;
}

/* Another rank's failure, once one has come (then always the same). */
int ferry_mpi_alert_poll(ferry_comm *c, char *msg, size_t cap) {
  (void)c;
  pthread_mutex_lock(&g_alert_mu);
  if (!g_alert_status && g_alert) {
    int flag = 0;
    MPI_Message m;
    MPI_Status stt;
    char buf[FERRY_ERR_MAX];
    if (api->Improbe(MPI_ANY_SOURCE, ALERT_TAG, g_alert, &flag, &m, &stt) == MPI_SUCCESS && flag &&
        api->Mrecv(buf, (int)sizeof buf, api->char_, &m, &stt) == MPI_SUCCESS) {
      buf[sizeof buf - 1] = '\0';
      g_alert_status = FERRY_EIO;
      g_alert_from = stt.MPI_SOURCE;
      snprintf(g_alert_msg, sizeof g_alert_msg, "%s", buf);
    }
  }
  int st = g_alert_status;
  if (st) snprintf(msg, cap, "%s", g_alert_msg);
  pthread_mutex_unlock(&g_alert_mu);
  return st;
}

const ferry_comm_ops ferry_comm_mpi_ops = {
    /* .name = */ "mpi",
    /* .kind = */ FERRY_COMM_MPI,
    /* .threaded = */ 1,
    /* .reduce_dtypes = */
    (1u << FERRY_DT_F32) | (1u << FERRY_DT_F64) | (1u << FERRY_DT_I32) | (1u << FERRY_DT_I64) |
        (1u << FERRY_DT_U64),
    /* .init = */ mpi_init,
    /* .dup = */ mpi_dup,
    /* .shutdown = */ mpi_shutdown,
    /* .run = */ mpi_run,
    /* .poll = */ NULL,
    /* .release = */ NULL,
    /* .abort = */ mpi_abort,
    /* .alert_send = */ ferry_mpi_alert_send,
    /* .alert_poll = */ ferry_mpi_alert_poll,
};
