/* comm/comm_nccl.c — the `nccl` backend: device buffers of a cuda device.
 * Bootstrap: rank 0 makes the unique id, an MPI broadcast carries it
 * (comm/comm_mpi.c), every rank joins with ncclCommInitRank on its device.
 * Each collective is enqueued on the caller's ferry stream (its native CUDA
 * stream) and completes when the ferry event recorded after it does; the
 * communicator layer polls that event against the timeout. Counts per rank
 * that differ become a group of per-rank reduces (reduce-scatter) or
 * broadcasts (all-gather). A rank's failure (ferry_comm_fail) is told over
 * MPI as the MPI backend tells it; the polling waits look for it.
 *
 * libnccl.so.2 (some 200 MB) is opened with dlopen when the first NCCL
 * communicator is made, never at program start: a process that makes none
 * (a CPU run) maps no NCCL. nccl.h gives the types; the calls go through
 * the table `N` below, filled once.
 */
#include "comm/comm_impl.h"

#include "core/dtype.h"
#include "device/peer.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The NCCL functions this backend calls, from libnccl.so.2 (nccl_load). */
static struct {
  __typeof__(ncclGetUniqueId) *GetUniqueId;
  __typeof__(ncclCommInitRank) *CommInitRank;
  __typeof__(ncclCommDestroy) *CommDestroy;
  __typeof__(ncclCommAbort) *CommAbort;
  __typeof__(ncclGetErrorString) *GetErrorString;
  __typeof__(ncclGetLastError) *GetLastError;
  __typeof__(ncclCommGetAsyncError) *CommGetAsyncError;
  __typeof__(ncclAllReduce) *AllReduce;
  __typeof__(ncclReduceScatter) *ReduceScatter;
  __typeof__(ncclReduce) *Reduce;
  __typeof__(ncclAllGather) *AllGather;
  __typeof__(ncclBroadcast) *Broadcast;
  __typeof__(ncclGroupStart) *GroupStart;
  __typeof__(ncclGroupEnd) *GroupEnd;
} N;
static pthread_once_t g_nccl_once = PTHREAD_ONCE_INIT;
static char g_nccl_why[512]; /* empty once loaded (written once, under g_nccl_once) */

static void nccl_load_once(void) {
  void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
#ifdef FERRY_NCCL_PATH
  if (!h) h = dlopen(FERRY_NCCL_PATH, RTLD_NOW | RTLD_LOCAL); /* where the build found it */
#endif
  if (!h) {
    snprintf(g_nccl_why, sizeof g_nccl_why, "cannot load libnccl.so.2 (%s): install NCCL "
             "(libnccl2) or use the mpi communicator", dlerror());
    return;
  }
  static const char *const names[] = {
      "ncclGetUniqueId", "ncclCommInitRank", "ncclCommDestroy",   "ncclCommAbort",
      "ncclGetErrorString", "ncclGetLastError", "ncclCommGetAsyncError", "ncclAllReduce",
      "ncclReduceScatter", "ncclReduce", "ncclAllGather", "ncclBroadcast", "ncclGroupStart",
      "ncclGroupEnd"};
  _Static_assert(sizeof N == sizeof names / sizeof *names * sizeof(void (*)(void)),
                 "one name per entry of N");
  void (**slot)(void) = (void (**)(void))&N;
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    void *f = dlsym(h, names[i]);
    if (!f) {
      snprintf(g_nccl_why, sizeof g_nccl_why, "libnccl.so.2 has no %s (an NCCL older than "
               "2.13?)", names[i]);
      memset(&N, 0, sizeof N);
      dlclose(h);
      return;
    }
    memcpy(&slot[i], &f, sizeof f);
  }
}

/* 0 once libnccl.so.2 is loaded; otherwise FERRY_ENOTSUP with the reason. */
static int nccl_load(ferry_errbuf *e) {
  pthread_once(&g_nccl_once, nccl_load_once);
  return g_nccl_why[0] ? ferry_err(e, FERRY_ENOTSUP, "nccl: %s", g_nccl_why) : 0;
}

typedef struct {
  ncclComm_t nc;
  ferry_device *dev;   /* (fixed) */
  int ordinal;         /* (fixed) the CUDA device */
  ferry_stream *bar_s; /* (caller) barriers run here: they have no stream */
  float *bar_buf;      /* (caller) one float of device memory for the barrier */
} nccl_impl;

#define NCCL_TRY(c, what, call)                                                                    \
  do {                                                                                             \
    ncclResult_t rc_ = (call);                                                                     \
    if (rc_ != ncclSuccess)                                                                        \
      return ferry_err(&(c)->err, FERRY_EIO, "%s: %s failed: %s (%s:%d)", (what), #call,           \
                       N.GetErrorString(rc_), __FILE__, __LINE__);                               \
  } while (0)

static int is_cuda_device(ferry_device *dev) {
  ferry_device_info info;
  return dev && ferry_device_get_info(dev, &info) == 0 && info.kind == FERRY_DEVICE_CUDA;
}

/* A communicator of every rank: a fresh unique id from rank 0. */
static int join(ferry_comm *c, ferry_errbuf *e, nccl_impl *m) {
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (c->rank == 0) {
    ncclResult_t rc = N.GetUniqueId(&id);
    if (rc != ncclSuccess)
      return ferry_err(e, FERRY_EIO, "nccl: ncclGetUniqueId failed: %s", N.GetErrorString(rc));
  }
  int st = ferry_mpi_world_bcast(e, &id, sizeof id, 0);
  if (st) return st;
  cudaError_t ce = cudaSetDevice(m->ordinal);
  if (ce != cudaSuccess)
    return ferry_err(e, FERRY_ENODEV, "nccl: cudaSetDevice(%d) failed: %s", m->ordinal,
                     cudaGetErrorString(ce));
  ncclResult_t rc = N.CommInitRank(&m->nc, c->size, id, c->rank);
  if (rc != ncclSuccess)
    return ferry_err(e, FERRY_EIO,
                     "nccl: ncclCommInitRank (rank %d of %d, cuda device %d) "
                     "failed: %s",
                     c->rank, c->size, m->ordinal, N.GetErrorString(rc));
  return 0;
}

static void impl_free(nccl_impl *m, int abort_nc) {
  if (!m) return;
  if (m->nc) {
    if (abort_nc)
      N.CommAbort(m->nc);
    else
      N.CommDestroy(m->nc);
  }
  if (m->bar_s) ferry_stream_destroy(m->bar_s);
  if (m->bar_buf) ferry_device_free(m->dev, m->bar_buf);
  free(m);
}

static int setup(ferry_comm *c, ferry_errbuf *e, ferry_device *dev) {
  nccl_impl *m = calloc(1, sizeof *m);
  if (!m) return ferry_err(e, FERRY_ENOMEM, "nccl: out of memory");
  m->dev = dev;
  m->ordinal = ferry_device_cuda_ordinal(dev);
  int st = ferry_stream_create(dev, &m->bar_s);
  if (!st) st = ferry_device_alloc(dev, sizeof(float), (void **)&m->bar_buf);
  if (st) {
    ferry_err(e, st, "nccl: the barrier's stream and buffer: %s", ferry_device_last_error(dev));
    impl_free(m, 0);
    return st;
  }
  st = join(c, e, m);
  if (st) {
    impl_free(m, 0);
    return st;
  }
  c->impl = m;
  return 0;
}

static int nccl_init(ferry_comm *c, const ferry_comm_options *opt) {
  if (!is_cuda_device(opt->dev))
    return ferry_err(&c->err, FERRY_EINVAL,
                     "nccl: ferry_comm_options.dev must be a cuda device (%s)",
                     opt->dev ? "it is not" : "it is NULL");
  int ld = nccl_load(&c->err); /* the first NCCL communicator maps libnccl.so.2 */
  if (ld) return ld;
  c->dev = opt->dev;
  int st = ferry_mpi_acquire(&c->err);
  if (st) return st;
  st = ferry_mpi_world_info(&c->err, &c->rank, &c->size, &c->local_rank, &c->local_size);
  if (!st) st = setup(c, &c->err, c->dev);
  if (st) ferry_mpi_release();
  return st;
}

static int nccl_dup(ferry_comm *parent, ferry_comm *child) {
  int st = ferry_mpi_acquire(&parent->err);
  if (st) return st;
  child->dev = parent->dev;
  child->rank = parent->rank;
  child->size = parent->size;
  child->local_rank = parent->local_rank;
  child->local_size = parent->local_size;
  st = setup(child, &parent->err, child->dev);
  if (st) ferry_mpi_release();
  return st;
}

static void nccl_shutdown(ferry_comm *c, int broken) {
  impl_free(c->impl, broken);
  c->impl = NULL;
  if (broken)
    ferry_mpi_release_broken();
  else
    ferry_mpi_release();
}

static ncclDataType_t nccl_type(ferry_dtype dt) {
  switch (dt) {
  case FERRY_DT_F32: return ncclFloat32;
  case FERRY_DT_F64: return ncclFloat64;
  case FERRY_DT_F16: return ncclFloat16;
  case FERRY_DT_BF16: return ncclBfloat16;
  case FERRY_DT_I32: return ncclInt32;
  case FERRY_DT_I64: return ncclInt64;
  case FERRY_DT_U64: return ncclUint64;
  default: return ncclUint8;
  }
}

static ncclRedOp_t nccl_op(ferry_reduce_op op) {
  switch (op) {
  case FERRY_REDUCE_SUM: return ncclSum;
  case FERRY_REDUCE_AVG: return ncclAvg;
  case FERRY_REDUCE_MAX: return ncclMax;
  case FERRY_REDUCE_MIN: return ncclMin;
  }
  return ncclSum;
}

static int all_equal(const size_t *counts, int n) {
  for (int i = 1; i < n; i++)
    if (counts[i] != counts[0]) return 0;
  return 1;
}

static int enqueue(ferry_comm *c, nccl_impl *m, ferry_comm_req *r, cudaStream_t cs) {
  size_t es = r->dt ? ferry_dtype_size(r->dt) : 1;
  ncclDataType_t t = nccl_type(r->dt);
  switch (r->coll) {
  case FERRY_COLL_ALLREDUCE:
    NCCL_TRY(c, r->name, N.AllReduce(r->send, r->recv, r->count, t, nccl_op(r->op), m->nc, cs));
    return 0;
  case FERRY_COLL_REDUCE_SCATTER:
    if (all_equal(r->counts, c->size)) {
      NCCL_TRY(c, r->name,
               N.ReduceScatter(r->send, r->recv, r->counts[0], t, nccl_op(r->op), m->nc, cs));
      return 0;
    }
    NCCL_TRY(c, r->name, N.GroupStart());
    for (int i = 0; i < c->size; i++) {
      if (!r->counts[i]) continue;
      const char *part = (const char *)r->send + r->displs[i] * es;
      ncclResult_t rc = N.Reduce(part, i == c->rank ? r->recv : NULL, r->counts[i], t,
                                   nccl_op(r->op), i, m->nc, cs);
      if (rc != ncclSuccess) {
        N.GroupEnd();
        return ferry_err(&c->err, FERRY_EIO, "%s: ncclReduce to rank %d failed: %s", r->name, i,
                         N.GetErrorString(rc));
      }
    }
    NCCL_TRY(c, r->name, N.GroupEnd());
    return 0;
  case FERRY_COLL_ALLGATHER:
    if (all_equal(r->counts, c->size)) {
      NCCL_TRY(c, r->name,
               N.AllGather(r->send, r->recv, r->counts[0] * es, ncclUint8, m->nc, cs));
      return 0;
    }
    NCCL_TRY(c, r->name, N.GroupStart());
    for (int i = 0; i < c->size; i++) {
      if (!r->counts[i]) continue;
      char *place = (char *)r->recv + r->displs[i] * es;
      const void *src = i == c->rank ? r->send : place;
      ncclResult_t rc = N.Broadcast(src, place, r->counts[i] * es, ncclUint8, i, m->nc, cs);
      if (rc != ncclSuccess) {
        N.GroupEnd();
        return ferry_err(&c->err, FERRY_EIO, "%s: ncclBroadcast from rank %d failed: %s", r->name,
                         i, N.GetErrorString(rc));
      }
    }
    NCCL_TRY(c, r->name, N.GroupEnd());
    return 0;
  case FERRY_COLL_BROADCAST:
    NCCL_TRY(c, r->name,
             N.Broadcast(r->recv, r->recv, r->count * es, ncclUint8, r->root, m->nc, cs));
    return 0;
  case FERRY_COLL_BARRIER:
    NCCL_TRY(c, r->name, N.AllReduce(m->bar_buf, m->bar_buf, 1, ncclFloat32, ncclSum, m->nc, cs));
    return 0;
  case FERRY_COLL_DUP: break;
  }
  return ferry_err(&c->err, FERRY_EINVAL, "nccl: unknown collective %d", (int)r->coll);
}

static int nccl_run(ferry_comm *c, ferry_comm_req *r) {
  nccl_impl *m = c->impl;
  ferry_stream *s = r->coll == FERRY_COLL_BARRIER ? m->bar_s : r->s;
  if (ferry_stream_device(s) != c->dev)
    return ferry_err(&c->err, FERRY_EINVAL,
                     "%s: the stream belongs to another device than the communicator's", r->name);
  void *native = NULL;
  int st = ferry_stream_native(s, &native);
  if (st)
    return ferry_err(&c->err, st, "%s: no native stream: %s", r->name,
                     ferry_device_last_error(c->dev));
  cudaError_t ce = cudaSetDevice(m->ordinal);
  if (ce != cudaSuccess)
    return ferry_err(&c->err, FERRY_ENODEV, "%s: cudaSetDevice(%d) failed: %s", r->name, m->ordinal,
                     cudaGetErrorString(ce));
  st = enqueue(c, m, r, (cudaStream_t)native);
  if (st) return st;
  ferry_event *e = NULL;
  st = ferry_event_create(c->dev, &e);
  if (!st) st = ferry_event_record(e, s);
  if (st) {
    if (e) ferry_event_destroy(e);
    return ferry_err(&c->err, st, "%s: its completion event: %s", r->name,
                     ferry_device_last_error(c->dev));
  }
  r->impl = e;
  return 0;
}

static int nccl_poll(ferry_comm *c, ferry_comm_req *r) {
  nccl_impl *m = c->impl;
  int st = ferry_event_query(r->impl);
  if (st == 0) return 0;
  if (st != FERRY_EAGAIN)
    return ferry_err(&c->err, st, "%s: %s", r->name, ferry_device_last_error(c->dev));
  ncclResult_t async = ncclSuccess;
  if (N.CommGetAsyncError(m->nc, &async) == ncclSuccess && async != ncclSuccess &&
      async != ncclInProgress)
    return ferry_err(&c->err, FERRY_EIO, "%s: NCCL failed: %s (%s)", r->name,
                     N.GetErrorString(async), N.GetLastError(m->nc));
  return FERRY_EAGAIN;
}

static void nccl_release(ferry_comm *c, ferry_comm_req *r) {
  (void)c;
  if (r->impl) ferry_event_destroy(r->impl);
  r->impl = NULL;
}

static _Noreturn void nccl_abort(ferry_comm *c, int code) {
  nccl_impl *m = c->impl;
  if (m && m->nc) N.CommAbort(m->nc);
  ferry_mpi_abort(code);
}

const ferry_comm_ops ferry_comm_nccl_ops = {
    /* .name = */ "nccl",
    /* .kind = */ FERRY_COMM_NCCL,
    /* .threaded = */ 0,
    /* .reduce_dtypes = */
    (1u << FERRY_DT_F32) | (1u << FERRY_DT_F64) | (1u << FERRY_DT_I32) | (1u << FERRY_DT_I64) |
        (1u << FERRY_DT_U64) | (1u << FERRY_DT_F16) | (1u << FERRY_DT_BF16),
    /* .init = */ nccl_init,
    /* .dup = */ nccl_dup,
    /* .shutdown = */ nccl_shutdown,
    /* .run = */ nccl_run,
    /* .poll = */ nccl_poll,
    /* .release = */ nccl_release,
    /* .abort = */ nccl_abort,
    /* .alert_send = */ ferry_mpi_alert_send, /* news over MPI, as the bootstrap */
    /* .alert_poll = */ ferry_mpi_alert_poll,
};
